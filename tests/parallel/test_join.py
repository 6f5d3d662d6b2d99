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
