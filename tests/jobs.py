"""Helpers for the single-process test drivers (imported as `jobs`; not a conftest, so the SPMD
conftest in tests/parallel cannot shadow it).

Multi-process jobs always run through ``run_job`` with a hard timeout (scaled by
``HVLITE_TEST_TIMEOUT_MULTIPLIER`` for slow machines), so a hang fails instead of blocking CI.
"""
import os
import re
import subprocess
import sys
import time

import pytest

from hvlite.runner.procs.job_files import PREFIXES, SHM_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))
STOP_GRACE = 20.0   # seconds hvlrun has after SIGTERM to end a timed-out job and clean up


def job_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HVLITE_LOG_LEVEL", "warning")
    env.update(extra or {})
    return env


def run_job(np_, args, timeout, env=None, hvlrun_args=()):
    """Run ``hvlrun -np np_ [hvlrun_args] args...``; returns CompletedProcess (text).
    A leading "python" means this interpreter (the venv's, whatever PATH says).
    A job past its timeout fails the test; hvlrun gets SIGTERM first (it ends its ranks and
    removes the job's /dev/shm files, which a SIGKILL would leave behind), SIGKILL after
    ``STOP_GRACE`` seconds."""
    if args and args[0] == "python":
        args = [sys.executable, *args[1:]]
    cmd = [sys.executable, "-m", "hvlite.runner", "-np", str(np_), *hvlrun_args, *args]
    with subprocess.Popen(cmd, cwd=ROOT, env=job_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) as proc:
        try:
            out, err = proc.communicate(timeout=timeout * MULTIPLIER)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail("job timed out after %.0f s (a hang): %s\n--- stdout\n%s\n--- stderr\n%s"
                        % (timeout * MULTIPLIER, " ".join(cmd), out[-4000:], err[-4000:]))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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


def shm_files():
    """The MPI and hvlite files in /dev/shm now (the names hvlrun's cleanup looks after)."""
    return {SHM_DIR + f for f in os.listdir(SHM_DIR) if f.startswith(PREFIXES)}


def assert_no_new_shm_files(before, out):
    """No MPI or hvlite file in /dev/shm beyond ``before`` (the tests run one job at a time)."""
    new = sorted(shm_files() - before)
    assert not new, "left behind in /dev/shm: %s\n%s" % (new, out[-3000:])


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
