"""Host discovery for elastic jobs: run the user's script, read the hosts it prints.

Contract:
  * :func:`discover` runs ``--host-discovery-script`` with ``/bin/sh -c`` (so it may carry
    arguments) and parses its standard output: one host per line, ``host:N``, ``host slots=N``
    or ``host`` (``default_slots`` slots: ``--slots-per-host``); ``#`` starts a comment; blank
    lines are skipped; a host named again with the same slots is counted once. No line means
    no host (a valid answer: every host is gone).
  * It raises :class:`DiscoveryError` naming the script and the cause when the script cannot be
    run, exits non-zero (with the last lines of its stderr), runs longer than ``timeout``
    seconds, is cancelled (``cancel()`` came true: hvlrun is ending), prints a line it cannot
    parse, or names a host twice with different slot counts.
  * The script runs in a session of its own (hvlrun's terminal signals do not reach it; the
    driver cancels it instead); a script that runs too long or is cancelled is killed with
    every process of its group (SIGKILL), so a hung script leaves nothing behind.
  * :class:`StaticHosts` answers the same question for an elastic job without a script (the
    hosts of ``-H``/``--hostfile``, or localhost): always the same list.
"""

import os
import signal
import subprocess
import time
from typing import Callable, List, Optional, Sequence, Tuple

from ..hosts.hostlist import Host, parse_hostfile_text

__all__ = ["DiscoveryError", "discover", "parse_discovery", "StaticHosts"]

_TAIL_LINES = 3
_POLL_SECONDS = 0.1     # how often a running script's cancel() is asked


class DiscoveryError(RuntimeError):
    """The host discovery script failed or printed something that is not a host list."""


def parse_discovery(text: str, default_slots: int, source: str = "discovery script") -> List[Host]:
    """Parse the script's output (see the module contract).

    Raises:
        DiscoveryError: on a malformed line or a host named twice with different slots.
    """
    hosts: List[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s line %d" % (source, number)
        try:
            (host,) = parse_hostfile_text(line, where)
        except ValueError as e:
            raise DiscoveryError(str(e)) from None
        if ":" not in line and "slots=" not in line:
            host = Host(host.name, default_slots)
        seen = next((h for h in hosts if h.name == host.name), None)
        if seen == host:
            continue                 # the same line again: as Horovod, one host
        if seen is not None:
            raise DiscoveryError("%s names host %r a second time with %d slots (first %d)"
                                 % (where, host.name, host.slots, seen.slots))
        hosts.append(host)
    return hosts


def discover(script: str, default_slots: int, timeout: float = 30.0,
             cancel: Optional[Callable[[], bool]] = None) -> List[Host]:
    """Run the discovery script once; return the hosts it names, in its order.

    Args:
        script: the ``/bin/sh -c`` command.
        default_slots: slots of a host named without a count.
        timeout: seconds the script may run.
        cancel: asked every :data:`_POLL_SECONDS` while the script runs; True ends it.

    Raises:
        DiscoveryError: see the module contract.
    """
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as e:
        raise DiscoveryError("cannot run host discovery script %r: %s" % (script, e)) from None
    with proc:
        try:
            stdout, stderr = _collect(proc, script, timeout, cancel)
        except BaseException:       # KeyboardInterrupt too: its own session did not get it
            _kill_group(proc)
            raise
    if proc.returncode != 0:
        tail = stderr.decode("utf-8", "replace").strip().splitlines()[-_TAIL_LINES:]
        raise DiscoveryError("host discovery script %r exited with code %d%s"
                             % (script, proc.returncode, "".join("\n    " + t for t in tail)))
    return parse_discovery(stdout.decode("utf-8", "replace"), default_slots,
                           "host discovery script %r" % script)


def _collect(proc: subprocess.Popen, script: str, timeout: float,
             cancel: Optional[Callable[[], bool]]) -> Tuple[bytes, bytes]:
    """Wait for the script's output and exit; raise :class:`DiscoveryError` when it runs longer
    than ``timeout`` or ``cancel()`` comes true (the caller kills it)."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(0.0, deadline - time.monotonic())
        try:
            return proc.communicate(timeout=min(left, _POLL_SECONDS) if cancel else left)
        except subprocess.TimeoutExpired:
            pass
        cancelled = cancel is not None and cancel()
        if cancelled or time.monotonic() >= deadline:
            raise DiscoveryError("host discovery script %r %s" % (
                script, "was stopped: hvlrun is ending" if cancelled
                else "ran longer than %g s" % timeout))


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the script's process group (its children too; the script leads it) and reap the
    script. Does not read its pipes: a process that left the group may hold them. Cannot fail
    (the group may be gone already)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.kill()                     # the script, should it have left its group
    proc.wait()


class StaticHosts:
    """The discovery of a job without a script: always ``hosts``."""

    def __init__(self, hosts: Sequence[Host]) -> None:
        self._hosts = list(hosts)

    def __call__(self) -> List[Host]:
        return list(self._hosts)
