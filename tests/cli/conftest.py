"""Helpers for the ``hvlrun`` tests: run the launcher as a subprocess with a hard timeout.

Every multi-process run goes through the ``hvlrun`` fixture, which runs
``python -m hvlite.runner`` (what the console script runs) from the repository root with the
repository on ``PYTHONPATH`` and fails the test, instead of hanging, after ``timeout`` seconds
times ``HVLITE_TEST_TIMEOUT_MULTIPLIER`` (default 1).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the unit tests import hvlite.runner from this checkout
    sys.path.insert(0, str(REPO))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))


def _text(data) -> str:
    """Return captured output as text, whatever type TimeoutExpired left it in."""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


def hvlrun_env(extra=None, drop=()):
    """Return the environment for an hvlrun subprocess.

    Args:
        extra: variables to add or override.
        drop: variable names to remove.

    Returns:
        A copy of ``os.environ`` with the repository first on ``PYTHONPATH``.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    for name in drop:
        env.pop(name, None)
    env.update(extra or {})
    return env


@pytest.fixture
def hvlrun():
    """Return ``run(args, timeout=30, env=None, drop=())`` -> ``CompletedProcess`` (text).

    ``args`` are hvlrun's arguments; ``env``/``drop`` adjust its environment (see
    :func:`hvlrun_env`). A run that outlives its timeout fails the test with its output.
    """
    def run(args, timeout=30.0, env=None, drop=()):
        cmd = [sys.executable, "-m", "hvlite.runner"] + [str(a) for a in args]
        limit = timeout * MULTIPLIER
        try:
            return subprocess.run(cmd, cwd=str(REPO), env=hvlrun_env(env, drop),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=limit)
        except subprocess.TimeoutExpired as e:
            pytest.fail("hvlrun timed out after %.0f s: %s\n--- stdout\n%s\n--- stderr\n%s"
                        % (limit, " ".join(cmd), _text(e.stdout)[-4000:],
                           _text(e.stderr)[-4000:]))
    return run


@pytest.fixture
def need_mpiexec():
    """Skip the test when hvlrun would find no mpiexec (real runs need one)."""
    from hvlite.runner.cli.build_info import find_mpiexec, load_build_info
    if find_mpiexec(load_build_info())[0] is None:
        pytest.skip("no mpiexec available")
