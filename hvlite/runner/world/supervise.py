"""Running the launch command: supervision, termination and hvlrun's exit code.

Contract:
  * The launcher (``mpiexec``) runs in its own session. The job is ended when hvlrun gets
    SIGINT/SIGTERM, as soon as a rank reports a non-zero exit (MPICH hydra would otherwise wait
    for the other ranks), when not every rank reported ``start`` within the start timeout, and
    when the control server finds a host or rank lost (``ControlServer.lost``: its connection
    closed before it reported an exit, or it was silent for the heartbeat timeout). Ending the
    job means: ``stop`` to every wrapper and host guard (they end their processes, also on hosts
    hvlrun cannot signal, and say why), then, 1 s later, SIGTERM to what is left of the
    launcher's process group and SIGKILL after 5 s (1 s when a host is lost: mpiexec cannot
    reach it and would wait).
  * The exit code is :data:`HOST_LOST_CODE` when a host or rank was lost before any rank reported
    a failure (the message names it and its ranks), else the first failing rank's (earliest
    non-zero ``exit`` report), else 128+signum after SIGINT/SIGTERM, :data:`START_TIMEOUT_CODE` after a start timeout, else the
    launcher's own code (128+signum if a signal ended it); never 0 when the launcher failed.
  * Once the job is over, the shared-memory files its processes on this host mapped (MPI's
    per-job files, which a killed rank never unlinks) are removed when nothing maps them any
    more (``shm_files.py``; each host guard does the same on its host).
  * When the launcher exits with a non-zero code on its own, every client still connected is
    sent ``stop`` too, and what is left of its process group is ended. Control lines that failed authentication are reported in one warning at
    the end.
  * Signal handlers are installed only when called on the main thread, and restored after.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ..procs.shm_files import ShmWatcher, remove_unused
from ..control.server import ControlServer

__all__ = ["START_TIMEOUT_CODE", "HOST_LOST_CODE", "run_job"]

START_TIMEOUT_CODE = 124
HOST_LOST_CODE = 125
_KILL_GRACE_SECONDS = 5.0
_LOST_GRACE_SECONDS = 1.0
_STOP_WAIT_SECONDS = 1.0


def _terminate_group(proc: subprocess.Popen, server: ControlServer, reason: str,
                     grace: float = _KILL_GRACE_SECONDS, shm: Optional[ShmWatcher] = None) -> int:
    """Ask every wrapper and guard to stop; :data:`_STOP_WAIT_SECONDS` later, end what is left
    of ``proc``'s process group; return the launcher's code. Asking first lets every rank's
    wrapper say why its rank ends. ``shm`` takes a last look at the job's shared-memory files
    while its processes still hold them."""
    if shm is not None:
        shm.look()
    server.stop_all(reason)
    try:
        proc.wait(timeout=_STOP_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    _end_group(proc, grace)
    return proc.wait()


def _end_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM what is left of ``proc``'s process group (the launcher, remote shells it
    started), SIGKILL it ``grace`` seconds later. Returns at once when the group is empty."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _say(message: str) -> None:
    """One line on stderr; a closed stderr (the reader of hvlrun's output is gone) must not stop
    hvlrun from ending the job, so write errors are ignored."""
    try:
        sys.stderr.write("hvlrun: %s\n" % message)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _wait_job(proc: subprocess.Popen, server: ControlServer, np: int, start_timeout: float,
              caught: List[int], lost: List[str], shm: Optional[ShmWatcher] = None) -> Optional[int]:
    """Wait for ``mpiexec``, ending the job on a signal, a failed rank, a lost host or rank
    (described into ``lost``) or a start timeout.

    Args:
        proc: the running ``mpiexec``.
        server: the control server the ranks report to.
        np: the number of ranks.
        start_timeout: seconds for all ranks to report ``start``; 0 waits forever.
        caught: signal numbers hvlrun received (appended by its signal handlers).
        lost: receives the description of a lost host or rank.

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
            _say("got %s, stopping the job" % signal.Signals(caught[0]).name)
            return _terminate_group(proc, server, "hvlrun got " + signal.Signals(caught[0]).name, shm=shm)
        failure = server.first_failure()
        if failure is not None:  # one rank failed: the job cannot go on
            return _terminate_group(proc, server, "rank %d failed" % failure[0], shm=shm)
        gone = server.lost()
        if gone is not None:
            lost.append(gone.message)
            _say("%s; ending the job on every host" % gone.message)
            return _terminate_group(proc, server, "lost " + gone.who, _LOST_GRACE_SECONDS, shm)
        if deadline is None:
            continue
        missing = sorted(set(range(np)) - set(server.started_ranks()))
        if not missing:
            deadline = None
        elif time.monotonic() > deadline:
            _say("rank%s %s did not start within %g s" % (
                "s" if len(missing) > 1 else "", ",".join(map(str, missing)), start_timeout))
            _terminate_group(proc, server, "start timeout", shm=shm)
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
            _say("cannot run %s: %s" % (argv[0], e))
            return 127
        lost: List[str] = []
        shm = ShmWatcher(os.getpid())
        try:
            rc = _wait_job(proc, server, np, start_timeout, caught, lost, shm)
        finally:
            remove_unused(shm.stop())
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    try:
        return _exit_code(argv, proc, server, rc, caught, lost)
    finally:
        _report_rejected(server)


def _exit_code(argv: Sequence[str], proc: subprocess.Popen, server: ControlServer,
               rc: Optional[int], caught: List[int], lost: List[str]) -> int:
    """Pick hvlrun's exit code once the launcher ended (see the module contract)."""
    if lost:
        return HOST_LOST_CODE
    if rc is None:
        return START_TIMEOUT_CODE
    if caught:
        return 128 + caught[0]
    if rc != 0:  # hosts the launcher could not reach may still run: they must stop too
        server.stop_all("the launcher %s exited with code %d" % (os.path.basename(argv[0]), rc))
    server.wait_quiet(timeout=2.0)
    if rc != 0:  # remote shells the launcher left behind
        _end_group(proc, _LOST_GRACE_SECONDS)
    gone = server.lost(settle=0) if rc != 0 else None
    failure = server.first_failure()
    if gone is not None and _lost_first(gone.since, server.first_failure_round(), failure):
        # the launcher ended the job itself because a host or rank vanished first
        _say("%s; the job ended" % gone.message)
        return HOST_LOST_CODE
    if failure is not None:
        _say("first failure: rank %d with exit code %d" % failure)
        return failure[1]
    if rc != 0:
        rc = 128 - rc if rc < 0 else rc
        _say("%s exited with code %d" % (argv[0], rc))
    return rc


def _lost_first(lost_round: int, failed_round: Optional[int],
                failure: Optional[Tuple[int, int]]) -> bool:
    """Did a client vanish before the first rank reported a failure? Within one server round
    the order is unknown: a rank ended by a signal (code > 128) is then taken as a consequence
    (the launcher killing the rest), an exit with its own code as the cause."""
    if failed_round is None or failure is None:
        return True
    return lost_round < failed_round or (lost_round == failed_round and failure[1] > 128)


def _report_rejected(server: ControlServer) -> None:
    """Warn once about control lines that failed authentication (they were not acted on)."""
    count, sources = server.rejected()
    if count:
        _say("warning: dropped %d control message%s that failed authentication, from: %s"
             % (count, "" if count == 1 else "s", "; ".join(sources[:5])))
