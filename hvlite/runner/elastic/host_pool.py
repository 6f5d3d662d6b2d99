"""Which hosts an elastic job may use, and how many ranks go where.

Contract:
  * :class:`HostPool` remembers failures per host and blacklists a host whose workers keep
    failing: after :data:`FAILURES_TO_BLACKLIST` worlds in a row that it was part of ended by
    its failure (a rank on it exiting with an error or being killed, or the host lost) without a
    commit stored in between (:meth:`record_progress` clears the count), or at once when it
    cannot be reached before a world starts (:meth:`blacklist`).
  * Without a cooldown range a blacklisted host stays out for the rest of the job (Horovod's
    default). With ``cooldown=(low, high)`` seconds its k-th blacklisting lasts
    ``min(high, low * 2**(k-1))`` seconds, plus up to 10% random jitter (never above ``high``);
    afterwards one more failure blacklists it again.
  * :meth:`usable` filters a discovered host list; :func:`place` fills slots in host order up
    to a rank count. Both keep the discovery order (the order ranks are placed in).
  * Pure bookkeeping: no processes, no clock of its own (callers pass ``now``, seconds on
    ``time.monotonic()``'s scale), randomness from the given ``random.Random``.
"""

import math
import random
from typing import Dict, List, Optional, Sequence, Tuple

from ..hosts.hostlist import Host

__all__ = ["FAILURES_TO_BLACKLIST", "HostPool", "place", "describe"]

FAILURES_TO_BLACKLIST = 2


def place(hosts: Sequence[Host], np: int) -> List[Host]:
    """Return the hosts that get ranks when ``np`` ranks fill ``hosts``' slots in order, each
    with its rank count as ``slots`` (fewer ranks if there are fewer slots). Cannot fail."""
    placed, left = [], np
    for host in hosts:
        if left <= 0:
            break
        count = min(host.slots, left)
        placed.append(Host(host.name, count))
        left -= count
    return placed


def describe(hosts: Sequence[Host]) -> str:
    """Return ``a:2,b:1`` (or ``no host``). Cannot fail."""
    return ",".join("%s:%d" % (h.name, h.slots) for h in hosts) or "no host"


class HostPool:
    """Failure counts and the blacklist (see the module contract)."""

    def __init__(self, cooldown: Optional[Tuple[float, float]] = None,
                 rng: Optional[random.Random] = None) -> None:
        """Args:
            cooldown: ``(low, high)`` seconds, or None to blacklist for good.
            rng: the source of the cooldown's jitter.
        """
        self._cooldown = cooldown
        self._rng = rng or random.Random()
        self._failures: Dict[str, int] = {}
        self._times: Dict[str, int] = {}          # how often each host was blacklisted
        self._until: Dict[str, float] = {}        # blacklisted until (inf: for good)

    def record_failure(self, host: str, now: float) -> Optional[str]:
        """Count a world that ``host``'s failure ended; return a message if that blacklists it."""
        self._failures[host] = self._failures.get(host, 0) + 1
        if self._failures[host] < FAILURES_TO_BLACKLIST:
            return None
        return self.blacklist(host, now, "its workers failed in %d worlds in a row without a "
                              "commit in between" % self._failures[host])

    def blacklist(self, host: str, now: float, why: str) -> str:
        """Blacklist ``host`` now; return the message saying why and for how long."""
        self._times[host] = self._times.get(host, 0) + 1
        if self._cooldown is None:
            self._until[host] = math.inf
            return "blacklisted host %s for the rest of the job: %s" % (host, why)
        low, high = self._cooldown
        base = min(high, low * 2 ** (self._times[host] - 1))
        seconds = min(high, base + self._rng.uniform(0, base * 0.1))
        self._until[host] = now + seconds
        return "blacklisted host %s for %.1f s: %s" % (host, seconds, why)

    def record_progress(self, hosts: Sequence[str]) -> None:
        """A world on ``hosts`` stored a commit: their failures no longer count in a row."""
        for host in hosts:
            self._failures.pop(host, None)

    def blacklisted(self, now: float) -> List[str]:
        """Return the hosts blacklisted at ``now``."""
        return sorted(h for h, until in self._until.items() if until > now)

    def usable(self, hosts: Sequence[Host], now: float) -> List[Host]:
        """Return ``hosts`` without the blacklisted ones. A host whose cooldown ended is back,
        one failure away from its next blacklisting."""
        out = []
        for host in hosts:
            until = self._until.get(host.name)
            if until is not None and until <= now:
                del self._until[host.name]
                self._failures[host.name] = FAILURES_TO_BLACKLIST - 1
                until = None
            if until is None:
                out.append(host)
        return out
