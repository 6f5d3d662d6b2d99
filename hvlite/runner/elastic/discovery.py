"""Host discovery for elastic jobs: run the user's script, read the hosts it prints.

Contract:
  * :func:`discover` runs ``--host-discovery-script`` with ``/bin/sh -c`` (so it may carry
    arguments) and parses its standard output: one host per line, ``host:N``, ``host slots=N``
    or ``host`` (``default_slots`` slots: ``--slots-per-host``); ``#`` starts a comment; blank
    lines are skipped. No line means no host (a valid answer: every host is gone).
  * It raises :class:`DiscoveryError` naming the script and the cause when the script cannot be
    run, exits non-zero (with the last lines of its stderr), runs longer than ``timeout``
    seconds, prints a line it cannot parse, or names a host twice.
  * :class:`StaticHosts` answers the same question for an elastic job without a script (the
    hosts of ``-H``/``--hostfile``, or localhost): always the same list.
"""

import subprocess
from typing import List, Sequence

from ..hosts.hostlist import Host, parse_hostfile_text

__all__ = ["DiscoveryError", "discover", "parse_discovery", "StaticHosts"]

_TAIL_LINES = 3


class DiscoveryError(RuntimeError):
    """The host discovery script failed or printed something that is not a host list."""


def parse_discovery(text: str, default_slots: int, source: str = "discovery script") -> List[Host]:
    """Parse the script's output (see the module contract).

    Raises:
        DiscoveryError: on a malformed line or a host named twice.
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
        if any(h.name == host.name for h in hosts):
            raise DiscoveryError("%s names host %r a second time" % (where, host.name))
        hosts.append(host)
    return hosts


def discover(script: str, default_slots: int, timeout: float = 30.0) -> List[Host]:
    """Run the discovery script once; return the hosts it names, in its order.

    Raises:
        DiscoveryError: see the module contract.
    """
    try:
        done = subprocess.run(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise DiscoveryError("host discovery script %r ran longer than %g s"
                             % (script, timeout)) from None
    except OSError as e:
        raise DiscoveryError("cannot run host discovery script %r: %s" % (script, e)) from None
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-_TAIL_LINES:]
        raise DiscoveryError("host discovery script %r exited with code %d%s"
                             % (script, done.returncode, "".join("\n    " + t for t in tail)))
    return parse_discovery(done.stdout.decode("utf-8", "replace"), default_slots,
                           "host discovery script %r" % script)


class StaticHosts:
    """The discovery of a job without a script: always ``hosts``."""

    def __init__(self, hosts: Sequence[Host]) -> None:
        self._hosts = list(hosts)

    def __call__(self) -> List[Host]:
        return list(self._hosts)
