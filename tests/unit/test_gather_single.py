"""Allgather and alltoall of CUDA tensors on a device plane (csrc/core/gather.c's device half),
checked on a machine without a GPU through a probe (tests/unit/gather_probe.c): the size
exchanges, the results' device allocations and the plane's run are logged and answered by the
test (the other members' sizes and verdicts, a GPU without room, a failed run).

What it shows:
- each result is allocated on the tensor's GPU at the gathered size and shape, and the plane is
  handed per-member element counts, the inputs, the results and their ready events;
- a GPU without room on any member makes every member run the batch staged (results freed on
  the engine's stream); any other failure, on any member, fails the batch everywhere;
- tensors of one fused allgather on two GPUs are refused; a failed run frees the results.
The plane (NCCL) on a GPU is tests/gpu/test_nccl_plane.py's (make test-gpu)."""
import ctypes

import pytest

from c_check import bounded, load_probe  # tests/unit, beside this file

ALLGATHER, ALLTOALL = 1, 3                 # csrc/hvlite.h
OK, INVALID_ARG, NCCL = 0, 1, 5
HOST_MEMORY, CUDA_MEMORY = 0, 1
VERDICT_OK, VERDICT_NO_ROOM, VERDICT_FAILED = 0, 1, 2     # gather.c
RESULT, BYTES, MEMORY, DEVICE, NDIM, SHAPE0, SHAPE1 = range(7)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("gather_probe", tmp_path_factory.mktemp("gather_probe"))
    lib.probe_tensor.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    lib.probe_peer_rows.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    lib.probe_peer_splits.argtypes = [ctypes.c_int, ctypes.c_int64]
    for name in ("probe_outcome", "probe_last_tensor", "probe_last_count", "probe_log_arg"):
        getattr(lib, name).restype = ctypes.c_int64
    lib.probe_log_what.restype = ctypes.c_char_p
    return lib


def run(lib):
    """(rc, restage, the engine's last error there)."""
    restage = ctypes.c_int(-1)
    rc, error = bounded(lib.probe_run, ctypes.byref(restage))
    return rc, restage.value, error


def log(lib, what):
    assert lib.probe_log_dropped() == 0, "the probe's log overflowed"
    return [tuple(lib.probe_log_arg(i, j) for j in range(4)) for i in range(lib.probe_log_count())
            if lib.probe_log_what(i).decode() == what]


def test_a_fused_allgather_gets_each_result_on_its_gpu_at_the_gathered_size(probe):
    probe.probe_reset(ALLGATHER, 1, 3)
    probe.probe_tensor(2, 5, 1, None)          # this rank (1): 2 rows of 5, then 4 rows of 3
    probe.probe_tensor(4, 3, 1, None)
    for r, rows in ((0, (1, 0)), (2, (3, 2))):
        for t in range(2):
            probe.probe_peer_rows(r, t, rows[t])
    rc, restage, error = run(probe)
    assert (rc, restage) == (OK, 0), error
    allocs = log(probe, "alloc")
    assert [(dev, nbytes) for dev, nbytes, *_ in allocs] == [(1, (1 + 2 + 3) * 5 * 4), (1, (0 + 4 + 2) * 3 * 4)]
    for t, (rows, cols) in enumerate([(6, 5), (6, 3)]):
        assert [probe.probe_outcome(t, f) for f in (MEMORY, DEVICE, NDIM, SHAPE0, SHAPE1)] == [CUDA_MEMORY, 1, 2, rows, cols]
        assert probe.probe_outcome(t, RESULT) == allocs[t][2]
        # the plane gets the input, the result, this rank's elements, the device and the event
        assert [probe.probe_last_tensor(t, f) for f in range(5)] == [
            0x100000000000 + t * 0x1000000, allocs[t][2], [10, 12][t], 1, 0xe000 + t]
    assert probe.probe_last_ticket() == 0          # never left running: the handle owns the result
    # elements of tensor t from member r at counts[r * 2 + t]
    assert [probe.probe_last_count(j) for j in range(6)] == [5, 0, 10, 12, 15, 6]
    assert not log(probe, "free")


def test_an_alltoall_result_has_the_rows_the_members_send(probe):
    probe.probe_reset(ALLTOALL, 0, 3)
    send = (ctypes.c_int64 * 3)(1, 2, 3)
    probe.probe_tensor(6, 4, 1, send)               # on cuda:1
    for r, rows in enumerate((1, 5, 0)):
        probe.probe_peer_splits(r, rows)
    rc, restage, error = run(probe)
    assert (rc, restage) == (OK, 0), error
    assert [probe.probe_outcome(0, f) for f in (MEMORY, SHAPE0, SHAPE1, BYTES)] == [CUDA_MEMORY, 6, 4, 6 * 4 * 4]
    assert [probe.probe_outcome(0, 10 + r) for r in range(3)] == [1, 5, 0]
    assert [probe.probe_last_count(j) for j in range(6)] == [4, 8, 12, 4, 20, 0]   # sent, then received
    alloc = log(probe, "alloc")
    assert [(dev, nbytes) for dev, nbytes, *_ in alloc] == [(1, 6 * 4 * 4)]
    assert [probe.probe_last_tensor(0, f) for f in range(5)] == [0x100000000000, alloc[0][2], 24, 1, 0xe000]
    assert probe.probe_last_ticket() == 0


@pytest.mark.parametrize("op", [ALLGATHER, ALLTOALL])
@pytest.mark.parametrize("where", ["here", "on another member"])
def test_no_room_on_any_gpu_restages_the_batch_everywhere(probe, op, where):
    probe.probe_reset(op, 0, 2)
    probe.probe_tensor(4, 2, 1, (ctypes.c_int64 * 2)(2, 2) if op == ALLTOALL else None)
    if op == ALLGATHER:
        probe.probe_tensor(3, 2, 1, None)         # fused: the second result finds no room here
    probe.probe_peer_rows(1, 0, 4)
    probe.probe_peer_splits(1, 2)
    no_room_at = (2 if op == ALLGATHER else 1) if where == "here" else 0
    probe.probe_answers(VERDICT_NO_ROOM if where != "here" else VERDICT_OK, no_room_at, 0)
    rc, restage, error = run(probe)
    assert (rc, restage) == (OK, 1), error
    assert not log(probe, "run")                                  # the plane never ran it
    assert probe.probe_failed_everywhere() == 0
    # a result allocated here is freed on the engine's stream; the outcome is clean for the staged run
    freed = log(probe, "free")
    allocated = [a[2] for a in log(probe, "alloc")]
    assert [a[1] for a in freed] == allocated
    if op == ALLGATHER or where != "here":
        assert allocated                                          # something was there to free
    assert all(a[0] == 1 and a[2] == 0x5001 for a in freed)       # on cuda:1's engine stream
    for t in range(2 if op == ALLGATHER else 1):
        assert probe.probe_outcome(t, RESULT) == 0 and probe.probe_outcome(t, MEMORY) == HOST_MEMORY
    if op == ALLTOALL:
        assert probe.probe_outcome(0, 8) == 0                     # splits dropped too


def test_a_failure_on_another_member_fails_the_batch_everywhere_and_frees_the_results(probe):
    probe.probe_reset(ALLGATHER, 0, 2)
    probe.probe_tensor(2, 2, 0, None)
    probe.probe_tensor(3, 2, 0, None)
    probe.probe_peer_rows(1, 0, 2)
    probe.probe_peer_rows(1, 1, 3)
    probe.probe_answers(VERDICT_FAILED, 0, 0)
    rc, restage, error = run(probe)
    assert (rc, restage) == (INVALID_ARG, 0)
    assert "failed on another rank" in error
    assert probe.probe_failed_everywhere() == 1
    assert len(log(probe, "free")) == 2 and not log(probe, "run")


def test_one_fused_allgather_on_two_gpus_is_refused_everywhere(probe):
    probe.probe_reset(ALLGATHER, 0, 2)
    probe.probe_tensor(2, 2, 0, None)
    probe.probe_tensor(2, 2, 1, None)
    rc, restage, error = run(probe)
    assert rc == INVALID_ARG and "cuda:1" in error and "cuda:0" in error and "'t1'" in error
    assert probe.probe_failed_everywhere() == 1
    assert [a[1] for a in log(probe, "free")] == [a[2] for a in log(probe, "alloc")]


def test_no_room_here_and_a_failure_elsewhere_fails_everywhere(probe):
    probe.probe_reset(ALLGATHER, 0, 2)
    probe.probe_tensor(2, 2, 0, None)
    probe.probe_peer_rows(1, 0, 2)
    probe.probe_answers(VERDICT_FAILED, 1, 0)
    rc, restage, error = run(probe)
    assert (rc, restage) == (INVALID_ARG, 0) and probe.probe_failed_everywhere() == 1


@pytest.mark.parametrize("op", [ALLGATHER, ALLTOALL])
def test_a_failed_run_frees_the_results_and_is_this_ranks_error(probe, op):
    probe.probe_reset(op, 0, 2)
    probe.probe_tensor(2, 2, 0, (ctypes.c_int64 * 2)(1, 1) if op == ALLTOALL else None)
    probe.probe_peer_rows(1, 0, 2)
    probe.probe_peer_splits(1, 1)
    probe.probe_answers(VERDICT_OK, 0, 1)
    rc, restage, error = run(probe)
    assert rc == NCCL and "the probe's run fails" in error
    assert probe.probe_failed_everywhere() == 0               # not agreed: fatal to the engine
    assert [a[1] for a in log(probe, "free")] == [a[2] for a in log(probe, "alloc")]
    assert probe.probe_outcome(0, RESULT) == 0
