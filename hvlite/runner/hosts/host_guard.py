"""Host guard: ``python -m hvlite.runner.hosts.host_guard --control ADDR --host NAME
[--heartbeat-timeout T] [--check] [-- PROXY-COMMAND...]``, run on each remote host.

The remote shell (``remote_shell.py``) starts it in place of MPI's proxy. It owns everything the
job runs on its host, so that the host's part of the job ends even when hvlrun cannot reach it.

Contract:
  * The first line of standard input is the job secret (read byte by byte, so the rest of the
    input stays for the proxy). The secret is never taken from the command line.
  * It connects to hvlrun's control channel (``control/client.py``); when that fails it prints
    ``hvlrun: host NAME cannot reach hvlrun's control channel at ADDR: <cause>`` and exits 255.
  * ``--check``: sends ``check NAME``, waits for ``checked`` and exits 0 (1 if no answer comes
    within 10 s): hvlrun's reachability check, which proves the remote shell, this Python, the
    secret and the connection back to hvlrun all work.
  * Otherwise it becomes a child subreaper, runs the proxy in a new session with ``HVLRUN_HOST``
    (the host's name in hvlrun's host list) in its environment, and reports ``guard NAME pid``
    then ``done <code>``. It ends every process below it (SIGTERM, SIGKILL after
    :data:`KILL_GRACE_SECONDS`) when hvlrun is lost (connection closed, or silent for the
    heartbeat timeout: a cut link), on SIGTERM/SIGINT/SIGHUP, :data:`STOP_DELAY_SECONDS` after
    hvlrun sends ``stop`` (the rank wrappers, told too, stop their ranks first and say why), and
    after the proxy exits (whatever it left behind). It says why on stderr once the ending has
    begun; write errors are ignored (its stderr may be gone with hvlrun, exactly when it must
    end the job). Then the files the job's processes held on this host (``procs/job_files.py``:
    MPI's ``/dev/shm`` files, MPICH's topology files in ``/tmp``) are removed once nobody holds
    them.
  * Exit code: the proxy's (128+signum for a signal), 255 if hvlrun cannot be reached.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
from typing import List, Optional, Sequence

from ..control.client import ControlClient, ControlError
from ..control.names import ENV_HOST
from ..procs.proctree import become_subreaper, kill_tree, reap_zombies
from ..procs.job_files import FileWatcher, remove_unused

__all__ = ["KILL_GRACE_SECONDS", "STOP_DELAY_SECONDS", "read_secret", "main"]

KILL_GRACE_SECONDS = 2.0
STOP_DELAY_SECONDS = 1.0   # after hvlrun's stop: time for the ranks' wrappers to stop their ranks
_CHECK_SECONDS = 10.0


def _tell(line: str) -> None:
    """Write ``line`` and a newline on stderr. Cannot fail: a closed stderr (hvlrun, or the
    remote shell reading it, is gone) is exactly when the guard must still end the job."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def read_secret(fd: int = 0) -> str:
    """Read one line from ``fd`` without reading past it; return it stripped ("" at EOF)."""
    line = b""
    while not line.endswith(b"\n") and len(line) < 256:
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode("ascii", "replace").strip()


class _Guard:
    """Ends this host's part of the job once, for the first reason that comes."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._lock = threading.Lock()
        self.reason: Optional[str] = None
        self.proxy: Optional[subprocess.Popen] = None
        self.files: Optional[FileWatcher] = None   # the job's files on this host

    def end(self, reason: str, delay: float = 0.0) -> None:
        """End every process below this one after ``delay`` seconds (on a thread: callers
        return at once), then say why. Cannot fail."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        if self.files is not None:
            self.files.look()                    # while the processes still hold them
        threading.Thread(target=self._kill, args=(delay,), daemon=True).start()
        _tell("hvlrun: host %s: %s; ending the job's processes here" % (self._host, reason))

    def _kill(self, delay: float) -> None:
        if delay > 0 and self.proxy is not None:
            try:
                self.proxy.wait(timeout=delay)   # the ranks' wrappers got hvlrun's stop too
            except subprocess.TimeoutExpired:
                pass
        keep = [self.proxy.pid] if self.proxy is not None else []
        kill_tree(os.getpid(), KILL_GRACE_SECONDS, keep=keep)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hvlite.runner.hosts.host_guard")
    parser.add_argument("--control", required=True, help="hvlrun's control address host:port")
    parser.add_argument("--host", required=True, help="this host's name in hvlrun's host list")
    parser.add_argument("--heartbeat-timeout", type=float, default=0.0)
    parser.add_argument("--check", action="store_true", help="only check the way back to hvlrun")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.check and not args.command:
        parser.error("no proxy command given")
    return args


def _check(client: ControlClient, host: str, answered: threading.Event) -> int:
    client.send("check %s" % host)
    if answered.wait(_CHECK_SECONDS):
        sys.stdout.write("hvlrun: host %s reached hvlrun at %s\n" % (host, client.addr))
        return 0
    _tell("hvlrun: host %s: no answer from hvlrun at %s within %g s"
         % (host, client.addr, _CHECK_SECONDS))
    return 1


def _run_proxy(command: List[str], host: str, client: ControlClient, guard: _Guard) -> int:
    """Run the proxy, wait for it, end what it left, report. Returns the exit code."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: guard.end("got %s" % signal.Signals(s).name))
    try:
        guard.proxy = subprocess.Popen(command, env=dict(os.environ, **{ENV_HOST: host}),
                                       start_new_session=True, close_fds=False)
    except OSError as e:
        _tell("hvlrun: host %s cannot run %r: %s" % (host, command[0], e))
        client.send("done 127")
        return 127
    client.send("guard %s %d" % (host, guard.proxy.pid))
    files = guard.files = FileWatcher(os.getpid())
    if guard.reason is not None:  # a stop arrived before the proxy existed
        kill_tree(os.getpid(), KILL_GRACE_SECONDS, keep=[guard.proxy.pid])
    returncode = guard.proxy.wait()
    kill_tree(os.getpid(), KILL_GRACE_SECONDS)   # what the proxy left behind on this host
    reap_zombies()
    remove_unused(files.stop())         # MPI's files a killed rank or proxy left behind
    code = 128 - returncode if returncode < 0 else returncode
    client.send("done %d" % code)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code (see the module contract)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    secret = read_secret()
    guard = _Guard(args.host)
    answered = threading.Event()
    try:
        client = ControlClient(
            args.control, secret, args.heartbeat_timeout,
            on_lost=lambda why: guard.end("lost contact with hvlrun at %s: %s" % (args.control, why)),
            on_stop=lambda why: guard.end("hvlrun ended the job (%s)" % why, STOP_DELAY_SECONDS),
            on_message=lambda body: answered.set() if body == "checked" else None).connect()
    except (ControlError, ValueError) as e:
        _tell("hvlrun: host %s: %s" % (args.host, e))
        return 255
    try:
        if args.check:
            return _check(client, args.host, answered)
        become_subreaper()
        return _run_proxy(args.command, args.host, client, guard)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
