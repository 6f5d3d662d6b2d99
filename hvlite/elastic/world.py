"""This process's world of an elastic job, and rank 0's line to the driver's commit store.

Contract:
  * :func:`current` returns the :class:`World` described by the variables an elastic hvlrun sets
    (``hvlite/protocol/elastic_env.py``): its number (1 for the job's first world, +1 per
    re-form), why it was formed, and whether a driver manages it (``managed``). Under a plain
    ``hvlrun``/``mpirun`` the world is unmanaged (number 0): commits stay in memory, hosts never
    change, and an error ends the job as usual.
  * Rank 0 talks to the commit store (``hvlite.protocol.commit_client``), over one connection
    opened on first use and kept for the world's life: :meth:`World.fetch`, :meth:`World.put`,
    :meth:`World.updates`, :meth:`World.ready`. They raise ``CommitStoreError`` naming the store
    and the cause; the callers (``state.py``) turn that into an error on every rank.
  * :func:`agree` is how every rank learns rank 0's numbers: one broadcast of int64 values.
"""
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..ops import broadcast
from ..protocol.commit_client import CommitClient
from ..protocol.elastic_env import ENV_KEY, ENV_REASON, ENV_STORE, ENV_WORLD

__all__ = ["World", "current", "agree"]


class World:
    """The elastic world this process belongs to (see the module contract)."""

    def __init__(self, environ=os.environ) -> None:
        text = environ.get(ENV_WORLD, "").strip()
        self.number = int(text) if text.isdigit() else 0
        self.reason = environ.get(ENV_REASON, "")
        self._addr = environ.get(ENV_STORE, "")
        self._key = environ.get(ENV_KEY, "")
        self.managed = self.number > 0 and bool(self._addr)
        self._client: Optional[CommitClient] = None

    def _store(self) -> CommitClient:
        if self._client is None:
            self._client = CommitClient(self._addr, self._key).connect()
        return self._client

    def fetch(self) -> Optional[Tuple[int, bytes]]:
        """Rank 0: the job's last commit as ``(seq, bytes)``, or None before the first."""
        got = self._store().fetch()
        return None if got is None else (got[0], got[2])

    def put(self, data: bytes) -> Tuple[int, int]:
        """Rank 0: store a commit; return ``(seq, updates)`` (see ``CommitClient.put``)."""
        return self._store().put(self.number, data)

    def updates(self) -> int:
        """Rank 0: how often the driver asked this world to stop (0: carry on)."""
        return self._store().updates(self.number)

    def ready(self, seq: int) -> None:
        """Rank 0: report that every rank holds commit ``seq`` (0: the initial state)."""
        self._store().ready(self.number, seq)


_current: Optional[World] = None


def current() -> World:
    """Return this process's world (read from the environment once)."""
    global _current
    if _current is None:
        _current = World()
    return _current


def agree(values: Sequence[int], name: str) -> List[int]:
    """Return rank 0's ``values`` on every rank (collective: every rank calls it, same length)."""
    out = broadcast(np.asarray(values, dtype=np.int64), 0, name="hvlite.elastic." + name)
    return [int(v) for v in out]
