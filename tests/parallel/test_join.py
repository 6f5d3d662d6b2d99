"""join() for uneven work: rank r has r + 1 steps; ranks that joined take part with zeros
(allreduce) and no rows (allgather); join returns the last rank to join on every rank; the
engine and its response cache keep working afterwards; a broadcast from a joined root fails on
every rank. SPMD: run by hvlrun."""
import numpy as np
import pytest

import hvlite as hvd

RANK, SIZE = hvd.rank(), hvd.size()


def test_uneven_steps_then_join():
    for step in range(RANK + 1):
        active = [k for k in range(SIZE) if k >= step]
        total = hvd.allreduce(np.full(3, RANK + 1.0), op=hvd.Sum, name="join.grad")
        assert (total == sum(k + 1.0 for k in active)).all(), (step, total)
        rows = hvd.allgather(np.full((2, 2), RANK, np.int32), name="join.rows")
        assert (rows == np.repeat(np.array(active, np.int32), 2)[:, None]).all(), (step, rows)
    assert hvd.join() == SIZE - 1
    for _ in range(2):
        assert (hvd.allreduce(np.ones(2), op=hvd.Sum, name="join.grad") == SIZE).all()


def test_broadcast_from_joined_root_fails_everywhere():
    if RANK == 0:
        last = hvd.join()                 # rank 0 has nothing more to send
    else:
        with pytest.raises(hvd.HvliteInvalidArgument, match="rank 0, which has already called join"):
            hvd.broadcast(np.ones(2), root_rank=0, name="join.bcast")
        last = hvd.join()
    assert 0 <= last < SIZE


def test_tensor_in_flight_on_the_joining_rank_still_completes():
    """Completing join must not clear the stand-in flags a pending tensor still needs."""
    if RANK == 0:
        h = hvd.allreduce_async(np.ones(3), op=hvd.Sum, name="join.inflight")
        assert hvd.join() >= 0
        assert (hvd.synchronize(h) == 1).all()       # the others stood in with zeros
    else:
        assert hvd.join() >= 0


def test_unnamed_collectives_line_up_again_after_join():
    if RANK == 0:
        hvd.allreduce(np.ones(2), op=hvd.Sum)           # unnamed; the others have joined
    hvd.join()
    assert (hvd.allreduce(np.ones(2), op=hvd.Sum) == SIZE).all()


def test_dropped_async_handle_keeps_its_buffers_alive():
    """The engine still reads the buffers of a handle nobody holds any more (rank 0 drops it;
    for 3 ranks, rank 2 submits at once like rank 0)."""
    import gc
    import time
    n = 1 << 18
    if RANK != 1:
        hvd.allreduce_async(np.ones(n), op=hvd.Sum, name="join.dropped")   # handle dropped
        gc.collect()
        junk = [np.full(n, 7.0) for _ in range(8)]   # would reuse freed memory
        hvd.barrier()
        del junk
    else:
        time.sleep(0.2)
        got = hvd.allreduce(np.ones(n), op=hvd.Sum, name="join.dropped")
        assert (got == SIZE).all(), np.unique(got)
        hvd.barrier()
