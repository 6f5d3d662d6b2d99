"""join() for uneven work: rank r has r + 1 steps; ranks that joined take part in allreduce
with zeros and in barriers; join returns the last rank to join on every rank; the engine and its
response cache keep working afterwards; allgather, broadcast, alltoall and reducescatter while a
rank has joined fail on every rank that called them, naming the joined ranks (as Horovod).
SPMD: run by hvlrun."""
import numpy as np
import pytest

import hvlite as hvd

RANK, SIZE = hvd.rank(), hvd.size()


def test_uneven_steps_then_join():
    for step in range(RANK + 1):
        active = [k for k in range(SIZE) if k >= step]
        total = hvd.allreduce(np.full(3, RANK + 1.0), op=hvd.Sum, name="join.grad")
        assert (total == sum(k + 1.0 for k in active)).all(), (step, total)
        hvd.barrier()
    assert hvd.join() == SIZE - 1
    for _ in range(2):
        assert (hvd.allreduce(np.ones(2), op=hvd.Sum, name="join.grad") == SIZE).all()
        rows = hvd.allgather(np.full((2, 2), RANK, np.int32), name="join.rows")
        assert (rows == np.repeat(np.arange(SIZE, dtype=np.int32), 2)[:, None]).all(), rows


OTHER_OPS = {
    "allgather": lambda n: hvd.allgather(np.ones((2, 2)), name=n),
    "broadcast": lambda n: hvd.broadcast(np.ones(2), root_rank=SIZE - 1, name=n),
    "alltoall": lambda n: hvd.alltoall(np.ones((SIZE, 2)), name=n),
    "reducescatter": lambda n: hvd.reducescatter(np.ones((SIZE, 2)), name=n),
}


@pytest.mark.parametrize("op", sorted(OTHER_OPS))
def test_other_ops_fail_while_a_rank_has_joined(op):
    """Rank 0 joins first; every other rank's call fails, naming rank 0, also for a name the
    response cache holds, and the job goes on."""
    OTHER_OPS[op]("join." + op)                   # every rank: now in the response cache
    if RANK == 0:
        last = hvd.join()
    else:
        with pytest.raises(hvd.HvliteInvalidArgument,
                           match="'join.%s': %s while rank 0 has called join" % (op, op)):
            OTHER_OPS[op]("join." + op)
        with pytest.raises(RuntimeError):         # what Horovod's scripts catch
            OTHER_OPS[op]("join.%s.new" % op)
        last = hvd.join()
    assert last == hvd.allgather_object(last)[0] and 0 < last < SIZE
    OTHER_OPS[op]("join.%s.after" % op)           # every rank again: runs


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
    """The engine still reads the buffers of a handle nobody holds any more: rank 0 (and, at 3
    ranks, rank 2) drops its handle and fills memory before rank 1 submits (a barrier orders
    it), and keeps that memory until the allreduce has completed (a second barrier)."""
    import gc
    n = 1 << 18
    if RANK != 1:
        hvd.allreduce_async(np.ones(n), op=hvd.Sum, name="join.dropped")   # handle dropped
        gc.collect()
        junk = [np.full(n, 7.0) for _ in range(8)]   # would reuse freed memory
        hvd.barrier()                                # now rank 1 submits
        hvd.barrier()                                # rank 1 has its result
        del junk
    else:
        hvd.barrier()                                # the others' handles are gone
        got = hvd.allreduce(np.ones(n), op=hvd.Sum, name="join.dropped")
        assert (got == SIZE).all(), np.unique(got)
        hvd.barrier()
