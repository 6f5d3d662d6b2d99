"""start_timeline/stop_timeline at run time, called on every rank (only rank 0 writes): the file
covers every tensor of the known workload with its phases; a second start finishes the first
file; an unwritable path is an error on rank 0 (the only rank that opens it) and leaves the
engine working. Rank 0 checks the files and tells every rank the verdict. SPMD: run by hvlrun
at 2 and 3 ranks."""
import os
import sys
import tempfile

import numpy as np
import pytest

import hvlite as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import timeline_trace as tt  # noqa: E402

RANK, SIZE = hvd.rank(), hvd.size()


@pytest.fixture
def shared_dir():
    """A directory made by rank 0, its path known to every rank."""
    made = tempfile.TemporaryDirectory() if RANK == 0 else None
    yield hvd.broadcast_object(made.name if made else None, root_rank=0)
    hvd.barrier()                                   # every rank is done with it
    if made:
        made.cleanup()


def agree_on(check):
    """Run ``check()`` on rank 0; every rank fails with its message if it failed there."""
    problem = None
    if RANK == 0:
        try:
            check()
        except AssertionError as e:
            problem = "rank 0: %s" % (e,)
    problem = hvd.broadcast_object(problem, root_rank=0)
    assert problem is None, problem


def test_start_stop_on_every_rank_covers_the_workload(shared_dir):
    path = os.path.join(shared_dir, "run.json")
    hvd.start_timeline(path, mark_cycles=True)
    names = tt.run_workload(hvd, 3, tag="rt.")
    hvd.stop_timeline()

    def check():
        trace = tt.load(path)
        assert set(names) <= set(trace.tracks), set(names) - set(trace.tracks)
        tt.check_workload(trace, SIZE, 3, tag="rt.")
        assert any(e["name"] == "CYCLE_START" for e in trace.cycles)
    agree_on(check)


def test_second_start_finishes_the_first_file(shared_dir):
    first, second = os.path.join(shared_dir, "a.json"), os.path.join(shared_dir, "b.json")
    hvd.start_timeline(first)
    assert (hvd.allreduce(np.full(3, RANK, np.int32), name="sw.a", op=hvd.Sum) == sum(range(SIZE))).all()
    hvd.start_timeline(second)
    assert (hvd.allreduce(np.full(3, RANK, np.int32), name="sw.b", op=hvd.Sum) == sum(range(SIZE))).all()
    hvd.stop_timeline()
    hvd.stop_timeline()                             # nothing open any more: a no-op

    def check():
        a, b = tt.load(first), tt.load(second)
        assert "sw.a" in a.tracks and "sw.b" not in a.tracks, sorted(a.tracks)
        assert "sw.b" in b.tracks and "sw.a" not in b.tracks, sorted(b.tracks)
        for trace, name in ((a, "sw.a"), (b, "sw.b")):
            assert len(trace.of(name, "X", "MPI_ALLREDUCE")) == 1, trace.of(name)
    agree_on(check)


def test_unwritable_path_fails_on_rank_zero_only(shared_dir):
    missing = os.path.join(shared_dir, "no", "such", "dir", "t.json")
    if RANK == 0:
        with pytest.raises(hvd.HvliteInvalidArgument) as info:
            hvd.start_timeline(missing)
        assert "cannot open '%s' for writing: No such file or directory" % missing in str(info.value)
    else:
        hvd.start_timeline(missing)                 # other ranks never open the file
    hvd.stop_timeline()
    got = hvd.allreduce(np.full(4, RANK + 1.0), name="after.bad.path", op=hvd.Sum)
    assert (got == SIZE * (SIZE + 1) / 2).all()     # the engine goes on


def test_arguments_are_checked_on_every_rank():
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="needs a file path"):
            hvd.start_timeline(bad)
