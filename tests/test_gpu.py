"""The GPU suite (``make test-gpu``): on a machine with a CUDA GPU, hvlite.torch on CUDA tensors
under hvlrun at 1, 2 and 4 ranks, all ranks sharing the machine's GPUs (local rank modulo the
devices: on one GPU every rank shares it, which the staged path serves and NCCL refuses):
- every collective x dtype x in-place and out-of-place form, DistributedOptimizer,
  broadcast_parameters/_optimizer_state, SyncBatchNorm and join on CUDA models, against the same
  references as on the CPU (tests/parallel/test_torch_ops.py, test_torch_training.py with
  HVLITE_TEST_DEVICE=cuda);
- what only CUDA tensors have (tests/gpu/test_cuda_only.py): the host/CUDA mismatch error on
  every rank, stream order, results on the input's device, join(device), Adasum, elastic state,
  float16/bfloat16 on the device;
- a rank killed in the middle of a CUDA allreduce ends the job within the usual bounds.
Without a GPU every test here skips and says why (CI has none)."""
import time

import pytest

from jobs import MULTIPLIER, run_job, run_spmd


def _gpu_count():
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _gpu_count()
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU here (torch.cuda.is_available() "
                                "is False): the GPU suite runs with `make test-gpu` on a GPU machine")

SPMD_FILES = {"tests/gpu/test_cuda_only.py": {},
              "tests/parallel/test_torch_ops.py": {"HVLITE_TEST_DEVICE": "cuda"},
              "tests/parallel/test_torch_training.py": {"HVLITE_TEST_DEVICE": "cuda"}}


@pytest.mark.parametrize("np_", [1, 2, 4])
@pytest.mark.parametrize("path", sorted(SPMD_FILES))
def test_gpu_spmd_file(path, np_):
    run_spmd(np_, path, timeout=600, env=SPMD_FILES[path])


def test_killed_rank_during_a_cuda_allreduce_ends_the_job_naming_it():
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/kill_rank_cuda.py"], timeout=120)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    assert elapsed < 60 * MULTIPLIER, "job took %.1f s to end after a rank died" % elapsed
    assert "rank 1" in out and "SIGKILL" in out, out
    assert "unreachable" not in out
