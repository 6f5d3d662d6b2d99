"""hvlrun's check, before a job starts, that every remote host can be reached and can reach back.

Contract:
  * :func:`check_hosts` runs, at the same time on every given host, the host guard in check
    mode through the remote shell (``remote_shell.py``), with the job secret on its standard
    input. A host passes when that command exits 0 within ``timeout`` seconds and its ``check``
    message arrived on hvlrun's control server: so the remote shell, the far side's Python and
    hvlite, the secret and the connection back to hvlrun all work.
  * It returns one message per failing host, naming the host and saying what failed (the
    remote shell's exit code and last lines of output, or the timeout); an empty list means
    every host passed. It starts no job. ``cancel`` (asked every 0.1 s) ends every check at
    once, killing the remote shells' sessions.
"""

import os
import signal
import subprocess
import threading
import time
from typing import Callable, List, Optional, Sequence, Set

from .remote_shell import guard_command, transport_argv

__all__ = ["check_hosts", "CANCELLED"]

_TAIL_LINES = 3
_POLL_SECONDS = 0.1     # how often cancel() is asked
CANCELLED = "cancelled"


def _check_one(host: str, argv: List[str], secret: str, timeout: Optional[float],
               arrived: Callable[[], Set[str]], cancel: Callable[[], bool]) -> Optional[str]:
    """Check one host; return None on success, else the message (``CANCELLED`` when
    ``cancel()`` became true: the remote shell and its children are killed)."""
    shown = " ".join(argv[:-1])
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        return "host %s: cannot run the remote shell `%s`: %s" % (host, shown, e)
    deadline = None if timeout is None else time.monotonic() + timeout
    message: Optional[str] = None
    data: Optional[bytes] = (secret + "\n").encode("ascii")
    while True:
        try:
            out, _ = proc.communicate(data, timeout=_POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            data = None       # sent (or being sent): communicate() goes on with it
        if cancel():
            message = CANCELLED
        elif deadline is not None and time.monotonic() > deadline:
            message = "host %s did not answer within %g s (through `%s`)" % (host, timeout, shown)
        if message is not None:
            _kill_group(proc)
            return message
    if proc.returncode == 0 and host in arrived():
        return None
    tail = out.decode("utf-8", "replace").strip().splitlines()[-_TAIL_LINES:]
    return ("host %s is not reachable (through `%s`, exit code %d)%s"
            % (host, shown, proc.returncode, "".join("\n    " + line for line in tail)))


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the remote shell's session (its children too) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def check_hosts(hosts: Sequence[str], template: str, control_addr: str, secret: str,
                heartbeat_timeout: float, python: str, pythonpath: Optional[str],
                arrived: Callable[[], Set[str]], timeout: Optional[float],
                cancel: Callable[[], bool] = lambda: False) -> List[str]:
    """Check every host at once; return the failures' messages in host order, or
    ``[CANCELLED]`` when ``cancel()`` became true (every check's remote shell is killed).

    Args:
        hosts: the remote hosts' names as hvlrun's host list gives them.
        template: the remote shell (``remote_shell.transport_argv``).
        control_addr: ``host:port`` of hvlrun's control server, as the hosts must use it.
        secret: the job secret.
        heartbeat_timeout: passed on to the guard.
        python: the interpreter to run on the far side.
        pythonpath: ``PYTHONPATH`` for the far side, or None.
        arrived: returns the hosts whose check message the control server received.
        timeout: seconds allowed per host (None: no limit).
        cancel: asked every 0.1 s while a check runs (hvlrun got a signal).

    Raises:
        ValueError: if the template cannot be split.
    """
    argvs = [transport_argv(template, host, guard_command(host, control_addr, heartbeat_timeout,
                                                          python, pythonpath, check=True))
             for host in hosts]
    results: List[Optional[str]] = [None] * len(hosts)

    def run(i: int) -> None:
        results[i] = _check_one(hosts[i], argvs[i], secret, timeout, arrived, cancel)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(hosts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if CANCELLED in results:
        return [CANCELLED]
    return [r for r in results if r is not None]
