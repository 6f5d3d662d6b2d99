"""Running the launch command: supervision, termination and hvlrun's exit code.

Contract:
  * The launcher (``mpiexec``) runs in its own session. Its process group is terminated
    (SIGTERM, then SIGKILL after 5 s) when hvlrun gets SIGINT/SIGTERM, as soon as a rank reports
    a non-zero exit (MPICH hydra would otherwise wait for the other ranks), and when not every
    rank reported ``start`` within the start timeout.
  * The exit code is the first failing rank's (earliest non-zero ``exit`` report), else
    128+signum after SIGINT/SIGTERM, :data:`START_TIMEOUT_CODE` after a start timeout, else the
    launcher's own code (128+signum if a signal ended it); never 0 when the launcher failed.
  * Signal handlers are installed only when called on the main thread, and restored after.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from .control import ControlServer

__all__ = ["START_TIMEOUT_CODE", "run_job"]

START_TIMEOUT_CODE = 124
_KILL_GRACE_SECONDS = 5.0


def _terminate_group(proc: subprocess.Popen) -> int:
    """SIGTERM ``proc``'s process group, SIGKILL it after the grace period; return its code."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + _KILL_GRACE_SECONDS
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return proc.wait()
            time.sleep(0.05)
    return proc.wait()


def _wait_job(proc: subprocess.Popen, server: ControlServer, np: int, start_timeout: float,
              caught: List[int]) -> Optional[int]:
    """Wait for ``mpiexec``, terminating it on a signal, a failed rank or a start timeout.

    Args:
        proc: the running ``mpiexec``.
        server: the control server the ranks report to.
        np: the number of ranks.
        start_timeout: seconds for all ranks to report ``start``; 0 waits forever.
        caught: signal numbers hvlrun received (appended by its signal handlers).

    Returns:
        ``mpiexec``'s exit code, or None after a start timeout.
    """
    deadline = time.monotonic() + start_timeout if start_timeout > 0 else None
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        if caught:
            sys.stderr.write("hvlrun: got %s, stopping the job\n" % signal.Signals(caught[0]).name)
            sys.stderr.flush()
            return _terminate_group(proc)
        if server.first_failure() is not None:  # one rank failed: the job cannot go on
            return _terminate_group(proc)
        if deadline is None:
            continue
        missing = sorted(set(range(np)) - set(server.started_ranks()))
        if not missing:
            deadline = None
        elif time.monotonic() > deadline:
            sys.stderr.write("hvlrun: rank%s %s did not start within %g s\n" % (
                "s" if len(missing) > 1 else "", ",".join(map(str, missing)), start_timeout))
            sys.stderr.flush()
            _terminate_group(proc)
            return None


def run_job(argv: Sequence[str], env: Dict[str, str], server: ControlServer, np: int,
            start_timeout: float) -> int:
    """Run the launch command under the control server and pick hvlrun's exit code.

    Args:
        argv: the launch command (from ``mpi_command.build_command``).
        env: the complete environment for the launcher process.
        server: the started control server whose address is in ``env``.
        np: the number of ranks.
        start_timeout: seconds for every rank to report ``start``; 0 waits forever.

    Returns:
        The first failing rank's exit code; else 128+signum if hvlrun was interrupted,
        :data:`START_TIMEOUT_CODE` after a start timeout, 127 if the launcher cannot be run,
        or the launcher's own exit code.
    """
    caught: List[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, lambda s, _f: caught.append(s))
    try:
        try:
            proc = subprocess.Popen(list(argv), env=env, start_new_session=True)
        except OSError as e:
            sys.stderr.write("hvlrun: cannot run %s: %s\n" % (argv[0], e))
            return 127
        rc = _wait_job(proc, server, np, start_timeout, caught)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if rc is None:
        return START_TIMEOUT_CODE
    if caught:
        return 128 + caught[0]
    server.wait_quiet(timeout=2.0)
    failure = server.first_failure()
    if failure is not None:
        sys.stderr.write("hvlrun: first failure: rank %d with exit code %d\n" % failure)
        return failure[1]
    if rc != 0:
        rc = 128 - rc if rc < 0 else rc
        sys.stderr.write("hvlrun: %s exited with code %d\n" % (argv[0], rc))
    return rc
