"""Whole-job scenarios (tests/scenarios/*.py) under hvlrun or plain mpiexec, each with a hard
timeout: stall warning, a rank killed by SIGKILL (also mid shared-memory allreduce: no segment
may be left in /dev/shm), mpi4py initialising MPI first, and running without hvlrun."""
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from jobs import MULTIPLIER, ROOT, assert_job_left_no_files, assert_nothing_left, job_env, run_job


def test_stall_warning_names_tensor_and_missing_rank():
    for np_ in (2, 3):
        job = run_job(np_, ["python", "tests/scenarios/stall.py"], timeout=60,
                      env={"HVLITE_STALL_CHECK_TIME_SECONDS": "1"})
        out = job.stdout + job.stderr
        assert job.returncode == 0, out
        assert out.count("stall: tensor 'lonely'") == 2, out    # new, then cached
        assert out.count("missing ranks: %d" % (np_ - 1)) == 2, out
        assert out.count("stall scenario done") == np_, out


def test_leftover_checks_count_only_their_own_jobs_files(tmp_path):
    """Another MPI job started beside a job (a benchmark beside the suite) makes its own files
    in /dev/shm while the job runs: the job's leftover check counts only the files the job's
    own processes held, so it passes, with none of the other job's files among them."""
    go = tmp_path / "go"
    script = ("import os, time, hvlite\nhvlite.init()\ndeadline = time.monotonic() + 60\n"
              "while not os.path.exists(%r) and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
              "hvlite.barrier()\nhvlite.shutdown()\n" % str(go))
    done = {}
    ours = threading.Thread(target=lambda: done.update(job=run_job(2, ["python", "-c", script], timeout=120,
                                                                   watch_files=True)))
    ours.start()
    beside = subprocess.Popen(
        [sys.executable, "-m", "hvlite.runner", "-np", "2", sys.executable, "-c",
         "import sys, time, hvlite\nhvlite.init()\nsys.path.insert(0, 'tests/scenarios')\n"
         "import job_files\njob_files.report(hvlite.rank())\ntime.sleep(60)\n"],
        cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL)
    try:
        lines = []
        while sum("shm files of rank" in line for line in lines) < 2 and beside.poll() is None:
            lines.append(beside.stdout.readline())
        theirs = {p for line in lines if "shm files of rank" in line
                  for p in line.split(": ", 2)[-1].split() if "mpich_shm_" in p}
        assert theirs and all(os.path.exists(p) for p in theirs), lines
        go.touch()                   # their files were made while ours ran: now let ours end
        ours.join(timeout=180 * MULTIPLIER)
        job = done["job"]
        assert job.returncode == 0, job.stdout + job.stderr
        assert_job_left_no_files(job, job.stdout + job.stderr)
        assert not theirs & job.job_files and all(os.path.exists(p) for p in theirs)
    finally:
        go.touch()
        beside.terminate()           # hvlrun ends its ranks and removes their files
        beside.communicate(timeout=30)
        ours.join(timeout=180 * MULTIPLIER)


def test_stall_shutdown_fails_every_rank_in_bounded_time():
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/stall_shutdown.py"], timeout=60,
                  env={"HVLITE_STALL_SHUTDOWN_TIME_SECONDS": "2", "HVLITE_STALL_CHECK_TIME_SECONDS": "1"})
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode == 3, out
    assert elapsed < 20 * MULTIPLIER, "stall shutdown took %.1f s" % elapsed
    for r in (0, 1):
        assert "rank %d stall error" % r in out, out
    assert out.count("stall shutdown: tensor 'lonely'") >= 2 and "missing ranks: 1" in out, out
    assert "UNEXPECTED" not in out


def test_killed_rank_ends_job_with_its_name():
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/kill_rank.py"], timeout=60)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    assert elapsed < 30 * MULTIPLIER, "job took %.1f s to end after a rank died" % elapsed
    assert "rank 1" in out and "SIGKILL" in out, out
    assert "unreachable" not in out
    assert "mpich_shm_" in " ".join(assert_nothing_left(out, "tests/scenarios/kill_rank.py"))


def test_mpi4py_initialises_first():
    job = run_job(2, ["python", "tests/scenarios/mpi4py_first.py"], timeout=60)
    assert job.returncode == 0, job.stdout + job.stderr
    assert job.stdout.count("mpi4py scenario OK") == 2


def test_peer_shutdown_stops_every_rank():
    job = run_job(3, ["python", "tests/scenarios/peer_shutdown.py"], timeout=60)
    assert job.returncode == 0, job.stdout + job.stderr
    assert job.stdout.count("peer shutdown scenario OK") == 3, job.stdout + job.stderr


def test_plain_mpiexec_without_hvlrun():
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    job = subprocess.run([mpiexec, "-n", "2", sys.executable, "examples/data_stats.py"], cwd=ROOT,
                         env=job_env(), capture_output=True, text=True, timeout=60 * MULTIPLIER,
                         stdin=subprocess.DEVNULL)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "matches the single-process answer" in job.stdout


def test_killed_rank_during_shm_allreduce_leaks_no_segment():
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/shm_kill.py"], timeout=60)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    assert elapsed < 30 * MULTIPLIER, "job took %.1f s to end after a rank died" % elapsed
    pids = re.findall(r"pid of rank \d: (\d+)", out)
    assert len(pids) == 2 and "rank 1" in out and "SIGKILL" in out, out
    left = [n for n in os.listdir("/dev/shm") if n.startswith("hvlite-") and any("-%s-" % p in n for p in pids)]
    assert left == [], "segments left in /dev/shm: %s" % left
    assert "unreachable" not in out
    assert_nothing_left(out, "tests/scenarios/shm_kill.py")


def test_stopped_rank_during_shm_allreduce_times_out():
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/stopped_peer.py", "shm"], timeout=60,
                  env={"HVLITE_PEER_TIMEOUT_SECONDS": "2"})
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode == 3, out
    assert elapsed < 20 * MULTIPLIER, "the job took %.1f s" % elapsed
    assert "rank 0 timeout" in out and "shm allreduce" in out, out
    assert "(SIGSTOP) at shm_allreduce" in out, out          # frozen inside the data plane
    assert re.search(r"rank 1 \(pid \d+\) on this host did not arrive for 2 s", out), out
    assert "rank 0 keeps the buffers of 1 failed request(s)" in out, out   # given up mid-way
    assert "rank 0 after the error: rank() = 0 of size() = 2" in out, out   # as in Horovod
    assert "UNEXPECTED" not in out
    assert_nothing_left(out, "tests/scenarios/stopped_peer.py")


@pytest.mark.parametrize("where, env", [("mpi", {"HVLITE_SHM_DISABLE": "1"}), ("shm", {})])
def test_shutdown_ends_a_wait_on_a_stopped_rank(where, env):
    """shutdown() while the engine waits on a stopped rank inside a collective (the MPI progress
    wait, or the shm futex wait): the wait gives up after its grace second, not after the peer
    timeout (60 s), so the pending allreduce fails with a shutdown error and shutdown() returns."""
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/stopped_peer.py", where, "shutdown"], timeout=60,
                  env=dict(env, HVLITE_PEER_TIMEOUT_SECONDS="60"))
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode == 3, out
    assert elapsed < 30 * MULTIPLIER, "the job took %.1f s" % elapsed
    assert "(SIGSTOP) at %s_allreduce" % where in out, out   # frozen inside the data plane
    assert re.search(r"rank 0 shut down after [\d.]+ s: .*shut down", out), out
    returned = re.search(r"rank 0 shutdown\(\) returned after ([\d.]+) s", out)
    assert returned and float(returned.group(1)) < 10 * MULTIPLIER, out
    assert "rank 0 after the error: rank() raises: hvlite has not been initialized" in out, out
    assert "UNEXPECTED" not in out
    assert_nothing_left(out, "tests/scenarios/stopped_peer.py")


@pytest.mark.parametrize("point", ["pset_split", "pset_shm_map", "pset_shm_ready", "init_shm_map",
                                   "pset_split-serialized"])
def test_stopped_rank_inside_add_process_set_ends_every_rank(point, tmp_path):
    """A rank stopped at a collective step of add_process_set (its communicator split, the shm
    segment's setup), or of init: every other rank ends in bounded time with an error naming
    it, and nothing is left (processes, MPI's files, the set's segment); a split given up on
    stays inside MPI on a thread named hvl-comm-split, not hvlite-engine. Rank 2's own peer
    timeout is 600 s (the scenario sets it): it ends as soon as rank 0 because rank 0's holds.
    Under MPI_THREAD_SERIALIZED a survivor's second init() is refused: its split is still in MPI."""
    script = "tests/scenarios/stopped_in_add_process_set.py"
    point, _, serialized = point.partition("-")
    env = {"HVLITE_PEER_TIMEOUT_SECONDS": "2", "HVLITE_TEST_STOP_AT": "1:" + point}
    if serialized:
        env["HVLITE_MPI_THREADS_DISABLE"] = "1"
    start = time.monotonic()
    job = run_job(3, ["python", script, str(tmp_path)], timeout=60, env=env)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode == 3, out
    assert elapsed < 30 * MULTIPLIER, "the job took %.1f s" % elapsed
    assert "stopping this process (SIGSTOP) at %s" % point in out, out
    for r in (0, 2):
        line = re.search(r"rank %d timeout after [\d.]+ s: ([^\n]*)" % r, out)
        assert line, out
        assert re.search(r"rank 1 \(pid \d+\) on this host (is stopped|did not arrive)", line.group(1)), out
        if point == "pset_split":   # the split left inside MPI, on a helper not named as the engine
            assert re.search(r"rank %d threads: .*\bhvl-comm-split\b" % r, out), out
        if serialized:
            assert re.search(r"rank %d init again: a communicator split of the engine that stopped "
                             r"is still inside MPI, and MPI granted less than MPI_THREAD_MULTIPLE" % r,
                             out), out
    assert "UNEXPECTED" not in out
    pids = re.findall(r"pid of rank \d: (\d+)", out)
    assert len(pids) == 3, out
    left = [n for n in os.listdir("/dev/shm") if n.startswith("hvlite-") and any("-%s-" % p in n for p in pids)]
    assert left == [], "segments left in /dev/shm: %s" % left
    assert_nothing_left(out, script)


def start_job_waiting_for_a_signal():
    """hvlrun -np 2 on kill_rank.py --wait-for-signal, once both ranks have reported their shm
    files: the process and its output so far."""
    cmd = [sys.executable, "-m", "hvlite.runner", "-np", "2", sys.executable,
           "tests/scenarios/kill_rank.py", "--wait-for-signal"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    out = ""
    deadline = time.monotonic() + 60 * MULTIPLIER
    while out.count("shm files of rank") < 2 and time.monotonic() < deadline:
        out += proc.stdout.readline()
    return proc, out


def test_signal_to_hvlrun_leaves_nothing_behind():
    """SIGTERM or SIGINT to hvlrun mid-job: every rank ends, and neither MPI's files nor hvlite's
    nor any process of the job is left. SIGKILL (hvlrun cannot clean up): each rank's wrapper
    loses hvlrun, stops its rank and removes the files, so nothing is left either."""
    import signal
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        proc, out = start_job_waiting_for_a_signal()
        proc.send_signal(signum)
        try:
            out += proc.communicate(timeout=30 * MULTIPLIER)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("hvlrun did not end after %s:\n%s" % (signal.Signals(signum).name, out))
        assert proc.returncode == (-signum if signum == signal.SIGKILL else 128 + signum), out
        assert "mpich_shm_" in " ".join(assert_nothing_left(out, "tests/scenarios/kill_rank.py",
                                                            wait=15.0)), out


def test_hvlrun_ends_the_job_when_its_output_is_gone():
    """The reader of hvlrun's output goes away (pipes closed), then hvlrun gets SIGTERM: it must
    still end every rank and leave nothing behind (its messages fail to print)."""
    import signal
    proc, out = start_job_waiting_for_a_signal()
    proc.stdout.close()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30 * MULTIPLIER)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("hvlrun did not end after SIGTERM with its output closed")
    assert_nothing_left(out, "tests/scenarios/kill_rank.py")
