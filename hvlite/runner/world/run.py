"""Running a world to its end, and a plain job as the elastic job of one world.

Contract:
  * :func:`run_world` starts one world (``start.py``: a control server and secret of its own, so
    that a late report from an ended world can never count in the next; the remote hosts'
    check; the launch command, run in its own session), watches it with the one supervision
    loop (``supervise.py``) under the given rules (``rules.py``) and returns its
    :class:`~.spec.WorldEnd` once nothing of it is left: the shared-memory and temporary files
    its processes on this host held are removed once nobody holds them (``procs/job_files.py``;
    each host guard does the same on its host), and control lines that failed authentication
    are reported in one warning. It never raises for anything a world does.
  * :func:`run_job` runs a plain job: one world (number 0, on the hosts and rank count given),
    judged by :data:`~.rules.PLAIN`, and returns hvlrun's exit code: 0, the first failing
    rank's code, 128+signum after SIGINT/SIGTERM/SIGHUP, :data:`HOST_LOST_CODE` when a host or
    rank was lost before any rank failed or a remote host cannot be reached,
    :data:`START_TIMEOUT_CODE` after a start timeout, 127 when the launcher cannot be run, 1
    when the control channel cannot be opened, else the launcher's own code (never 0 when it
    failed). The elastic driver (``elastic/driver.py``) runs worlds with
    :data:`~.rules.ELASTIC`.
  * :func:`catching_signals` is where hvlrun takes SIGINT/SIGTERM/SIGHUP over (only on the main
    thread) while a job runs: they are noted, the job ends, the handlers are restored after.
"""
import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Iterator, List, Sequence

from ...protocol.wire import new_secret
from ..control.server import ControlServer
from ..hosts.hostlist import Host
from ..procs.job_files import FileWatcher, remove_unused
from .rules import PLAIN, Rules
from .say import say
from .spec import Launch, WorldEnd, WorldSpec
from .start import command, open_control
from .supervise import Supervisor

__all__ = ["START_TIMEOUT_CODE", "HOST_LOST_CODE", "catching_signals", "run_world", "run_job"]

START_TIMEOUT_CODE = 124
HOST_LOST_CODE = 125
_PLAIN_CODES = {"done": 0, "lost": HOST_LOST_CODE, "unreachable": HOST_LOST_CODE,
                "start-timeout": START_TIMEOUT_CODE}


@contextlib.contextmanager
def catching_signals() -> Iterator[List[int]]:
    """Note SIGINT/SIGTERM/SIGHUP in the list yielded instead of dying (main thread only);
    restore the handlers on leaving."""
    caught: List[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handlers[signum] = signal.signal(signum, lambda s, _f: caught.append(s))
    try:
        yield caught
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _report_rejected(server: ControlServer) -> None:
    """Warn once about control lines that failed authentication (they were not acted on)."""
    count, sources = server.rejected()
    if count:
        say("warning: dropped %d control message%s that failed authentication, from: %s"
            % (count, "" if count == 1 else "s", "; ".join(sources[:5])))


def _ended(rules: Rules, end: WorldEnd) -> WorldEnd:
    """A world that never ran: tell it."""
    rules.announce(end, stopping=False)
    return end


def run_world(launch: Launch, spec: WorldSpec, caught: List[int], rules: Rules) -> WorldEnd:
    """Run one world to its end (see the module contract).

    Args:
        launch: how every world of the job is started.
        spec: this world.
        caught: signal numbers hvlrun received (see :func:`catching_signals`).
        rules: a plain job's or an elastic world's.

    Returns:
        How the world ended.
    """
    secret = new_secret()
    server, addr, early = open_control(launch, spec, secret, rules, caught)
    if server is None:
        return _ended(rules, early)
    try:
        argv, env, added = command(launch, spec, addr, secret)
        rules.show_command(launch, spec, argv, added)
        try:
            proc = subprocess.Popen(argv, env=env, start_new_session=True)
        except OSError as e:
            return _ended(rules, WorldEnd("launcher", "cannot run %s: %s" % (argv[0], e),
                                          code=127, at=time.monotonic()))
        files = FileWatcher(os.getpid())
        try:
            return Supervisor(proc, server, spec, rules, launch.args.start_timeout, caught,
                              files).run()
        finally:
            remove_unused(files.stop())
    finally:
        server.close()
        _report_rejected(server)


def run_job(launch: Launch, hosts: Sequence[Host]) -> int:
    """Run a plain job on ``hosts`` (``launch.args.np`` ranks); return hvlrun's exit code."""
    with catching_signals() as caught:
        end = run_world(launch, WorldSpec(0, hosts, {}, launch.args.np), caught, PLAIN)
    return _PLAIN_CODES.get(end.kind, end.code)
