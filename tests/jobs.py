"""Helpers for the single-process test drivers (imported as `jobs`; not a conftest, so the SPMD
conftest in tests/parallel cannot shadow it).

Multi-process jobs always run through ``run_job`` with a hard timeout (scaled by
``HVLITE_TEST_TIMEOUT_MULTIPLIER`` for slow machines), so a hang fails instead of blocking CI.
"""
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from hvlite.runner.procs.job_files import held_files
from hvlite.runner.procs.proctree import descendants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))
STOP_GRACE = 20.0   # seconds hvlrun has after SIGTERM to end a timed-out job and clean up


def job_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HVLITE_LOG_LEVEL", "warning")
    env.update(extra or {})
    return env


class JobFiles:
    """The files of MPI's and hvlite's in /dev/shm (and MPICH's in /tmp) that the processes
    below ``root`` hold, looked at every 20 ms until ``stop()`` (hvlrun's own watcher looks
    rarely after the first seconds; a test's short job may map MPI's files for less)."""

    def __init__(self, root):
        self.paths = set()
        self._root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.is_set():
            for pid in descendants(self._root):
                self.paths |= held_files(pid)
            self._stop.wait(0.02)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        return set(self.paths)


def run_job(np_, args, timeout, env=None, hvlrun_args=(), watch_files=False):
    """Run ``hvlrun -np np_ [hvlrun_args] args...``; return CompletedProcess (text).
    A leading "python" means this interpreter (the venv's, whatever PATH says).
    A job past its timeout fails the test; hvlrun gets SIGTERM first (it ends its ranks and
    removes the job's /dev/shm files, which a SIGKILL would leave behind), SIGKILL after
    ``STOP_GRACE`` seconds. ``watch_files``: the result's ``job_files`` are the files of
    MPI's and hvlite's in /dev/shm (and MPICH's in /tmp) that the job's own processes were
    seen holding while it ran (:class:`JobFiles` on hvlrun's process tree), for
    :func:`assert_job_left_no_files`."""
    if args and args[0] == "python":
        args = [sys.executable, *args[1:]]
    cmd = [sys.executable, "-m", "hvlite.runner", "-np", str(np_), *hvlrun_args, *args]
    watcher = None
    with subprocess.Popen(cmd, cwd=ROOT, env=job_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) as proc:
        watcher = JobFiles(proc.pid) if watch_files else None
        try:
            out, err = proc.communicate(timeout=timeout * MULTIPLIER)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail("job timed out (a hang): %s\n--- stdout\n%s\n--- stderr\n%s"
                        % (" ".join(cmd), out[-4000:], err[-4000:]))
        finally:
            files = watcher.stop() if watcher else None
    job = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    job.job_files = files
    return job


def run_spmd(np_, path, timeout, env=None, select=None):
    """Run the SPMD test file (or folder) ``path``, or a list of them in one job, on every rank
    of an ``hvlrun -np np_`` job (the SPMD plugin, tests/spmd_plugin.py, is on with
    HVLITE_SPMD=1) and fail the calling test with both outputs' tails unless every rank passed.
    ``select``: a pytest ``-k`` expression."""
    paths = [path] if isinstance(path, str) else list(path)
    keep = ["-k", select] if select else []
    job = run_job(np_, ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *keep, *paths],
                  timeout=timeout, env=dict({"HVLITE_SPMD": "1"}, **(env or {})))
    assert job.returncode == 0, "hvlrun -np %d pytest %s failed (rc %d)\n--- stdout\n%s\n" \
        "--- stderr\n%s" % (np_, " ".join(paths), job.returncode, job.stdout[-6000:], job.stderr[-3000:])
    assert " passed" in job.stdout
    return job

def processes_here(script):
    """Pids of the processes running ``script`` from this checkout (their working directory is
    ROOT): other checkouts' jobs, or someone's `pgrep` of the same name, do not count."""
    # pgrep without the sanitizer runs' LD_PRELOAD (under libasan/libtsan it was seen to hang
    # in a futex wait forever), and bounded like every other wait here
    pids = subprocess.run(["pgrep", "-f", script], capture_output=True, text=True,
                          env=dict(os.environ, LD_PRELOAD=""), timeout=60).stdout.split()
    here = []
    for pid in pids:
        try:
            if os.path.realpath(os.readlink("/proc/%s/cwd" % pid)) == os.path.realpath(ROOT):
                here.append(pid)
        except OSError:            # gone meanwhile
            pass
    return here


def assert_job_left_no_files(job, out, saw_mpi=True):
    """None of the job's files exists once it is over: those its processes were seen holding
    (``run_job(..., watch_files=True)``) and those its ranks listed (``shm files of rank R:``,
    tests/scenarios/job_files.py). Only this job's files count: another MPI job may run beside
    the suite, its files coming and going in /dev/shm meanwhile. ``saw_mpi``: the job ran long
    enough for MPI's files (MPICH maps ``mpich_shm_*`` from init to finalize) to be seen, which
    must then be so, else a leak could not have been seen either (not so for a job whose init
    fails, which holds them for a moment)."""
    assert job.job_files is not None, "run the job with watch_files=True"
    paths = set(job.job_files)
    for listed in re.findall(r"shm files of rank \d+: ([^\n]*)", out):
        paths.update(listed.split())
    if saw_mpi:
        assert any("mpich_shm_" in p for p in paths), \
            "none of the job's MPI files was seen: %s\n%s" % (sorted(paths), out[-3000:])
    left = sorted(p for p in paths if os.path.exists(p))
    assert not left, "left behind: %s\n%s" % (left, out[-3000:])


def assert_nothing_left(out, script, wait=5.0):
    """After a job whose ranks ran ``script`` and printed their shared-memory files
    (tests/scenarios/job_files.py): none of those files exists, and no process of the job is
    left (given ``wait`` seconds to go)."""
    paths = set()
    for listed in re.findall(r"shm files of rank \d+: ([^\n]*)", out):
        paths.update(p for p in listed.split() if not p.endswith("(deleted)"))
    assert any("mpich_shm_" in p for p in paths) or not paths, out
    deadline = time.monotonic() + wait * MULTIPLIER
    while True:
        left = sorted(p for p in paths if os.path.exists(p))
        running = processes_here(script)
        if not left and not running:
            return sorted(paths)
        if time.monotonic() > deadline:
            raise AssertionError("left behind: files %s, processes %s\n%s" % (left, running, out[-3000:]))
        time.sleep(0.2)
