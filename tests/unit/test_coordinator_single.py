"""A rank's CUDA tensor on another GPU than its set's earlier ones is refused on every rank in
negotiation, before any NCCL call (csrc/core/ready.c marks it, csrc/core/coordinator.c decides),
checked through a probe (tests/unit/coordinator_probe.c) that feeds the engine's own coordinator
every rank's request, in the engine's wire format.

What it shows:
- a request marked by its rank fails the tensor on every rank with HVL_ERR_INVALID_ARG (decided
  before any data moved: the callers let go of its buffers), naming each such rank with the
  device it is on and the one its set's tensors are on, and how to pin the device;
- requests on their set's device (each rank its own GPU) agree as before;
- a disagreement on a field is reported first (it decides what the tensor even is).
(ready.c's marking is tests/unit/test_ready_single.py's; the NCCL plane keeps its own check,
fatal, as a last resort: tests/unit/test_nccl_run_single.py.)"""
import ctypes

import pytest

from c_check import load_probe  # tests/unit, beside this file

OK, INVALID_ARG, MISMATCH = 0, 1, 2        # csrc/hvlite.h
FLOAT32, FLOAT64 = 8, 9


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return load_probe("coordinator_probe", tmp_path_factory.mktemp("coordinator_probe"))


def decide(probe, devices, set_devices, dtypes=None):
    n = len(devices)
    ints = lambda values: (ctypes.c_int * n)(*values)   # noqa: E731
    error = ctypes.create_string_buffer(2048)
    status = probe.probe_decide(n, ints(devices), ints(set_devices), ints(dtypes or [FLOAT32] * n), error, 2048)
    return status, error.value.decode()


def test_each_rank_on_its_sets_device_agrees(probe):
    assert decide(probe, [0, 1, 2], [-1, -1, -1]) == (OK, "")


def test_a_tensor_on_another_gpu_fails_on_every_rank_naming_ranks_and_devices(probe):
    status, error = decide(probe, [0, 0, 1, 0], [-1, 1, -1, 2])
    assert status == INVALID_ARG
    assert error.startswith("tensor 'w' is on another GPU than the earlier CUDA tensors of process set 0 "
                            "on rank 1 (cuda:0, not cuda:1), rank 3 (cuda:0, not cuda:2): "), error
    assert "stay on one GPU" in error and "torch.cuda.set_device(hvd.local_rank())" in error


def test_a_field_mismatch_is_reported_first(probe):
    status, error = decide(probe, [0, 0], [-1, 1], [FLOAT32, FLOAT64])
    assert status == MISMATCH and "ranks disagree on the dtype" in error, error


def test_a_marked_request_never_matches_the_response_cache(probe):
    """A cached response was agreed unmarked: a marked request must go to rank 0 (which fails
    it), never run from the cache; the ranks' own devices differ and do not count."""
    assert probe.probe_cache_matches(-1, -1) == 1
    assert probe.probe_cache_matches(-1, 0) == 0
