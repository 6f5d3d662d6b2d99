"""Real ``hvlrun`` jobs (``python -m hvlite.runner``, as the console script runs it), each with a
hard timeout: output prefixes, exit codes, a killed rank, OMP_NUM_THREADS, per-rank output
files, start timeout, signals. None of them needs the engine to be built."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from .conftest import MULTIPLIER, REPO, hvlrun_env

pytestmark = pytest.mark.usefixtures("need_mpiexec")
PY = sys.executable
# The launcher's rank variable depends on the MPI (MPICH: PMI_RANK, Open MPI:
# OMPI_COMM_WORLD_RANK), as a Python expression for the scripts the ranks run.
RANK_EXPR = "os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK'))"


def test_each_line_is_prefixed_with_rank_and_stream(hvlrun):
    code = ("import os, sys\n"
            "r = " + RANK_EXPR + "\n"
            "print('hello from', r)\n"
            "print('oops from', r, file=sys.stderr)\n"
            "sys.stdout.buffer.write(b'bad \\xff byte, no newline')\n")
    job = hvlrun(["-np", "2", PY, "-c", code])
    assert job.returncode == 0, job.stderr
    for rank in (0, 1):
        assert "[%d]<stdout>: hello from %d\n" % (rank, rank) in job.stdout
        assert "[%d]<stderr>: oops from %d\n" % (rank, rank) in job.stderr
        assert "[%d]<stdout>: bad \ufffd byte, no newline\n" % rank in job.stdout


def test_first_failing_rank_sets_exit_code(hvlrun):
    code = "import os, sys; sys.exit(3 if " + RANK_EXPR + " == '1' else 0)"
    job = hvlrun(["-np", "2", PY, "-c", code])
    assert job.returncode == 3, job.stdout + job.stderr
    assert "hvlrun: rank 1 (pid " in job.stderr and "exited with code 3" in job.stderr


def test_killed_rank_ends_job_and_is_named(hvlrun):
    code = ("import os, signal, time\n"
            "if " + RANK_EXPR + " == '1':\n"
            "    time.sleep(0.3)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(600)\n")
    start = time.monotonic()
    job = hvlrun(["-np", "2", PY, "-c", code], timeout=30)
    out = job.stdout + job.stderr
    assert job.returncode == 128 + signal.SIGKILL, out
    assert time.monotonic() - start < 30 * MULTIPLIER
    assert "rank 1 (pid" in out and "was killed by signal 9 (SIGKILL)" in out, out
    assert "first failure: rank 1" in out, out


def test_omp_num_threads_default_and_user_value(hvlrun):
    code = "import os; print('omp', os.environ['OMP_NUM_THREADS'])"
    job = hvlrun(["-np", "2", PY, "-c", code], drop=["OMP_NUM_THREADS"])
    assert job.returncode == 0, job.stderr
    expected = max(1, (os.cpu_count() or 1) // 2)
    assert job.stdout.count("omp %d\n" % expected) == 2, job.stdout
    job = hvlrun(["-np", "2", PY, "-c", code], env={"OMP_NUM_THREADS": "7"})
    assert job.stdout.count("omp 7\n") == 2, job.stdout
    code = "import os; print('auto', os.environ.get('HVLRUN_OMP_AUTO'))"
    job = hvlrun(["-np", "2", PY, "-c", code], drop=["OMP_NUM_THREADS"])
    assert job.stdout.count("auto None\n") == 2, job.stdout      # the wrapper's, not the rank's


def test_omp_num_threads_is_each_hosts_own():
    """hvlrun's value is its own host's (8 cores, 2 ranks: 4); a rank's wrapper on a 96-core
    host with 8 ranks sets 12 (it got the launch host's value); the user's value stays."""
    from hvlite.runner.world.rank_exec import child_environment
    hvlrun_set = {"OMP_NUM_THREADS": "4", "HVLRUN_OMP_AUTO": "1", "HVLRUN_SECRET": "s"}
    assert child_environment(dict(hvlrun_set, MPI_LOCALNRANKS="8"), 96) == {
        "OMP_NUM_THREADS": "12", "MPI_LOCALNRANKS": "8"}
    assert child_environment(dict(hvlrun_set, OMPI_COMM_WORLD_LOCAL_SIZE="200"), 96)[
        "OMP_NUM_THREADS"] == "1"
    assert child_environment(hvlrun_set, 96) == {"OMP_NUM_THREADS": "4"}   # no local size
    assert child_environment({"OMP_NUM_THREADS": "7", "MPI_LOCALNRANKS": "8"}, 96) == {
        "OMP_NUM_THREADS": "7", "MPI_LOCALNRANKS": "8"}


def test_knob_flags_reach_every_rank(hvlrun):
    code = "import os; print('knob', os.environ['HVLITE_FUSION_THRESHOLD'])"
    job = hvlrun(["-np", "2", "--fusion-threshold-mb", "2", "--verbose", PY, "-c", code])
    assert job.returncode == 0, job.stderr
    assert "export HVLITE_FUSION_THRESHOLD=2097152\n" in job.stderr  # --verbose
    assert job.stdout.count("knob 2097152\n") == 2, job.stdout


def test_output_filename_writes_per_rank_files(hvlrun, tmp_path):
    code = ("import os, sys; r = " + RANK_EXPR + "\n"
            "print('out', r); print('err', r, file=sys.stderr)\n")
    out_dir = tmp_path / "logs"
    job = hvlrun(["-np", "2", "--output-filename", out_dir, PY, "-c", code])
    assert job.returncode == 0, job.stderr
    for rank in (0, 1):
        assert (out_dir / ("rank.%d" % rank) / "stdout").read_text() == "out %d\n" % rank
        assert (out_dir / ("rank.%d" % rank) / "stderr").read_text() == "err %d\n" % rank
    assert "[1]<stdout>: out 1" in job.stdout


# The start timeouts below leave the ranks that are not delayed seconds to start (a Python
# wrapper each, which on a loaded machine can take over a second), so only the delayed rank is
# named.
def test_start_timeout_names_missing_ranks(hvlrun):
    # Test-only hook of rank_exec: rank 1 waits 60 s before starting its command.
    start = time.monotonic()
    job = hvlrun(["-np", "3", "--start-timeout", "6", PY, "-c", "import time; time.sleep(600)"],
                 env={"HVLRUN_TEST_DELAY_START_RANK": "1:60"})
    assert job.returncode == 124, job.stdout + job.stderr
    assert "hvlrun: rank 1 did not start within 6 s" in job.stderr
    assert time.monotonic() - start < 20 * MULTIPLIER


def test_start_timeout_from_environment(hvlrun):
    job = hvlrun(["-np", "2", PY, "-c", "pass"],
                 env={"HVLRUN_TEST_DELAY_START_RANK": "0:60", "HVLRUN_START_TIMEOUT": "4"})
    assert job.returncode == 124
    assert "rank 0 did not start within 4 s" in job.stderr


def test_missing_command_is_reported(hvlrun):
    job = hvlrun(["-np", "2", "/nonexistent/program"])
    assert job.returncode == 127, job.stdout + job.stderr
    assert "cannot run '/nonexistent/program'" in job.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_to_hvlrun_stops_the_job(signum):
    """SIGTERM, and SIGHUP (the terminal closed; it killed hvlrun outright, leaving its job's
    files), end the job in order with exit 128+signum."""
    cmd = [PY, "-m", "hvlite.runner", "-np", "2", PY, "-c",
           "import time; print('up', flush=True); time.sleep(600)"]
    proc = subprocess.Popen(cmd, cwd=str(REPO), env=hvlrun_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = [proc.stdout.readline(), proc.stdout.readline()]
        assert all("<stdout>: up" in line for line in seen), seen
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20 * MULTIPLIER)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert "got %s, stopping the job" % signal.Signals(signum).name in err


def test_check_build_prints_mpiexec(hvlrun):
    job = hvlrun(["--check-build"])
    assert job.returncode == 0, job.stderr
    assert "mpiexec: " in job.stdout and "flavour" in job.stdout
    assert "NCCL" in job.stdout and "shared memory" in job.stdout


def test_ranks_can_initialise_mpi(hvlrun):
    # The wrapper must hand the launcher's descriptors (hydra's PMI_FD) to the command.
    pytest.importorskip("mpi4py")
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD\n"
            "print('mpi rank %d of %d sum %d' % (c.rank, c.size, c.allreduce(1)))\n")
    job = hvlrun(["-np", "2", PY, "-c", code], timeout=60)
    assert job.returncode == 0, job.stdout + job.stderr
    for rank in (0, 1):
        assert "[%d]<stdout>: mpi rank %d of 2 sum 2\n" % (rank, rank) in job.stdout


def test_check_build_without_engine_or_build_info(tmp_path):
    # A copy of the runner alone (and the protocol it shares with training code): no engine,
    # no _build_info.json.
    for part in ("runner", "protocol"):
        shutil.copytree(REPO / "hvlite" / part, tmp_path / "hvlite" / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "hvlite" / "__init__.py").write_text("")  # found before any installed hvlite
    env = hvlrun_env(drop=["PYTHONPATH", "HVLITE_MPIEXEC"])
    job = subprocess.run([PY, "-m", "hvlite.runner", "--check-build"], cwd=str(tmp_path), env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=30 * MULTIPLIER)
    assert job.returncode == 0, job.stderr
    assert "NOT BUILT" in job.stdout and "\nmpiexec: " in job.stdout, job.stdout
    assert "[ ] NCCL" in job.stdout
