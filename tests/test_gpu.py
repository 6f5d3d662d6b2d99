"""The GPU suite (``make test-gpu``): on a machine with a CUDA GPU, hvlite.torch on CUDA tensors
under hvlrun at 1, 2 and 4 ranks, all ranks sharing the machine's GPUs (local rank modulo the
devices), three ways: as they are (NCCL refuses ranks sharing a GPU: the staged path serves
them), with an NCCL_HOSTID per rank (NCCL then runs them over sockets: the NCCL plane), and so
with NCCL batches left running (HVLITE_NCCL_OVERLAP=1); at 2 ranks also with CUDA tensors held
until the GPU wrote them (HVLITE_GPU_READY_ONLY=1), staged and on NCCL (both switches are
experimental, off by default):
- every collective x dtype x in-place and out-of-place form, DistributedOptimizer,
  broadcast_parameters/_optimizer_state, SyncBatchNorm and join on CUDA models, against the same
  references as on the CPU (tests/parallel/test_torch_ops.py, test_torch_training.py with
  HVLITE_TEST_DEVICE=cuda);
- what only CUDA tensors have (tests/gpu/test_cuda_only.py): the host/CUDA mismatch error on
  every rank, stream order, results on the input's device, join(device), Adasum, elastic state,
  float16/bfloat16 on the device;
- a rank killed in the middle of a staged CUDA allreduce, and one killed or frozen (SIGSTOP)
  in the middle of an NCCL allreduce, ends the job within the usual bounds, naming the rank.
Without a GPU every test here skips and says why (CI has none)."""
import subprocess
import sys
import time

import pytest

from jobs import (MULTIPLIER, ROOT, assert_job_left_no_files, job_env, processes_here, run_job,
                  run_spmd)


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
              "tests/gpu/test_nccl_plane.py": {},
              "tests/parallel/test_torch_ops.py": {"HVLITE_TEST_DEVICE": "cuda"},
              "tests/parallel/test_torch_training.py": {"HVLITE_TEST_DEVICE": "cuda"}}
# How the ranks meet NCCL: as they are (sharing the GPU: staged, which NCCL refuses), or each
# with its own NCCL_HOSTID (NCCL over its socket transport on loopback), waiting for each NCCL
# batch or leaving it running while the engine goes on (HVLITE_NCCL_OVERLAP)
PLANES = {"shared-gpu": {}, "nccl-hostid": {"HVLITE_TEST_NCCL_HOSTID": "per-rank"},
          "nccl-overlap": {"HVLITE_TEST_NCCL_HOSTID": "per-rank", "HVLITE_NCCL_OVERLAP": "1"}}


@pytest.mark.parametrize("np_", [1, 2, 4])
@pytest.mark.parametrize("plane", sorted(PLANES))
@pytest.mark.parametrize("path", sorted(SPMD_FILES))
def test_gpu_spmd_file(path, plane, np_):
    run_spmd(np_, path, timeout=600, env=dict(SPMD_FILES[path], **PLANES[plane]))


@pytest.mark.parametrize("plane", ["shared-gpu", "nccl-hostid"])
@pytest.mark.parametrize("path", sorted(SPMD_FILES))
def test_gpu_spmd_file_holding_cuda_tensors(path, plane):
    """The experimental switch HVLITE_GPU_READY_ONLY=1 (CUDA tensors held out of negotiation
    until the GPU wrote them) under the same files, at 2 ranks, staged and on NCCL."""
    run_spmd(2, path, timeout=600, env=dict(SPMD_FILES[path], HVLITE_GPU_READY_ONLY="1", **PLANES[plane]))


@pytest.mark.parametrize("plane", sorted(PLANES))
def test_a_held_tensor_is_negotiated_once_written_not_a_cycle_time_later(plane):
    """Long cycles (500 ms) make a cycle's wait visible: the tensor held for the GPU
    (HVLITE_GPU_READY_ONLY=1) must not wait for it once written (tests/gpu/test_cuda_only.py,
    the test of the same name)."""
    run_spmd(2, "tests/gpu/test_cuda_only.py", timeout=300, select="once_written",
             env=dict(PLANES[plane], HVLITE_CYCLE_TIME="500", HVLITE_GPU_READY_ONLY="1"))


def _unshare_works():
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# Ways to make NCCL's transports fail where they are set up: in a communicator's first collective
# (NCCL_RUNTIME_CONNECT, the default since 2.22), not in its init. (env, whether NCCL must fail,
# why the variant cannot run here)
ONE_HOST = "needs 2 GPUs (ranks on one host with their own GPUs) and `unshare -m` (root) for a private /dev/shm"
FIRST_COLLECTIVE_FAILS = {
    # each rank its own NCCL_HOSTID (the network transport, over loopback), whose buffers cannot
    # be allocated: 1 TiB each
    "buffers": ({"HVLITE_TEST_NCCL_HOSTID": "per-rank", "NCCL_BUFFSIZE": str(1 << 40)}, True, None),
    # ranks with their own GPUs on one host in a /dev/shm of 1 MiB: P2P off, NCCL's shared-memory
    # transport needs more there; SHM and P2P off, the network transport serves them (it may run)
    "tiny-shm": ({"NCCL_P2P_DISABLE": "1"}, True, ONE_HOST if GPUS < 2 or not _unshare_works() else None),
    "tiny-shm-no-shm-p2p": ({"NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}, False,
                            ONE_HOST if GPUS < 2 or not _unshare_works() else None),
}


@pytest.mark.parametrize("how", sorted(FIRST_COLLECTIVE_FAILS))
def test_a_transport_that_fails_in_the_first_collective_leaves_the_set_staged(how):
    """The warm-up of a new communicator meets the failure, every rank agrees, the set runs
    staged with one notice saying why, and the job passes: never fatal."""
    env, must_fail, why_not = FIRST_COLLECTIVE_FAILS[how]
    if why_not:
        pytest.skip(why_not)
    env = dict(env, HVLITE_TEST_NCCL_FAILS="1" if must_fail else "maybe", HVLITE_SPMD="1")
    test = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "first_nccl_collective_fails",
            "tests/gpu/test_nccl_plane.py"]
    if how.startswith("tiny-shm"):   # the whole job in a mount namespace with a /dev/shm of its own
        job = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$@\"",
                              "--", sys.executable, "-m", "hvlite.runner", "-np", "2", sys.executable] + test,
                             cwd=ROOT, env=job_env(env), capture_output=True, text=True, timeout=300 * MULTIPLIER)
        assert job.returncode == 0 and " passed" in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
    else:
        job = run_spmd(2, "tests/gpu/test_nccl_plane.py", timeout=300, select="first_nccl_collective_fails",
                       env=env)
    notices = [line for line in (job.stdout + job.stderr).splitlines()
               if "CUDA tensors take the staged path, not NCCL" in line]
    print("%s: %s" % (how, "\n".join(notices) or "NCCL ran"))     # which step failed, for the GPU run's log
    assert len(notices) == (1 if must_fail else len(notices[:1])), job.stdout[-3000:] + job.stderr[-3000:]


@pytest.mark.skipif(GPUS > 1, reason="needs ranks that share a GPU")
def test_ranks_sharing_the_gpu_are_staged_with_a_one_line_notice():
    job = run_spmd(2, "tests/gpu/test_nccl_plane.py", timeout=600)
    notices = [line for line in (job.stdout + job.stderr).splitlines()
               if "CUDA tensors take the staged path, not NCCL" in line]
    assert len(notices) == 1, notices
    assert "ranks 0 and 1 share the GPU" in notices[0] and "NCCL_HOSTID" in notices[0]


@pytest.mark.parametrize("overlap", ["0", "1"])
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_rank_lost_inside_a_nccl_allreduce_ends_the_job_naming_it(signal_name, overlap):
    """Rank 1 is killed or frozen while every rank is inside one NCCL allreduce (waited for by
    the engine, or left running on the GPU: HVLITE_NCCL_OVERLAP); the others end within the
    peer timeout (10 s here) and the communicator's abort, naming it, and nothing is left
    behind."""
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/lose_rank_in_nccl.py", signal_name], timeout=180,
                  env={"HVLITE_PEER_TIMEOUT_SECONDS": "10", "HVLITE_NCCL_OVERLAP": overlap},
                  watch_files=True)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    # left running, the batch may be outlived by the engine's next negotiation, which then
    # names the silent rank first
    assert "NCCL allreduce" in out or signal_name == "SIGKILL" or overlap == "1", out
    assert "rank 1" in out, out
    assert elapsed < 60 * MULTIPLIER, "job took %.1f s to end after rank 1 was lost" % elapsed
    assert "unreachable" not in out
    assert not processes_here("lose_rank_in_nccl.py"), "processes left behind"
    assert_job_left_no_files(job, out)


def test_killed_rank_during_a_cuda_allreduce_ends_the_job_naming_it():
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/kill_rank_cuda.py"], timeout=120)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    assert elapsed < 60 * MULTIPLIER, "job took %.1f s to end after a rank died" % elapsed
    assert "rank 1" in out and "SIGKILL" in out, out
    assert "unreachable" not in out
