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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))


def job_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HVLITE_LOG_LEVEL", "warning")
    env.update(extra or {})
    return env


def run_job(np_, args, timeout, env=None, hvlrun_args=()):
    """Run ``hvlrun -np np_ [hvlrun_args] args...``; returns CompletedProcess (text).
    A leading "python" means this interpreter (the venv's, whatever PATH says)."""
    if args and args[0] == "python":
        args = [sys.executable, *args[1:]]
    cmd = [sys.executable, "-m", "hvlite.runner", "-np", str(np_), *hvlrun_args, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=job_env(env), capture_output=True, text=True,
                              timeout=timeout * MULTIPLIER, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail("job timed out after %.0f s (a hang): %s\n--- stdout\n%s\n--- stderr\n%s"
                    % (timeout * MULTIPLIER, " ".join(cmd), out[-4000:], err[-4000:]))


def processes_here(script):
    """Pids of the processes running ``script`` from this checkout (their working directory is
    ROOT): other checkouts' jobs, or someone's `pgrep` of the same name, do not count."""
    pids = subprocess.run(["pgrep", "-f", script], capture_output=True, text=True).stdout.split()
    here = []
    for pid in pids:
        try:
            if os.path.realpath(os.readlink("/proc/%s/cwd" % pid)) == os.path.realpath(ROOT):
                here.append(pid)
        except OSError:            # gone meanwhile
            pass
    return here


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
