"""The elastic job's own timeline: its worlds and re-forms as a Chrome trace.

Contract:
  * With a timeline asked for (``--timeline-filename PATH`` or ``HVLITE_TIMELINE=PATH``), each
    world's rank 0 writes the engine's timeline to :func:`world_path` (``PATH`` with
    ``.world<N>`` before its extension), and hvlrun writes ``PATH`` itself through
    :class:`ElasticTrace`: one track ``worlds`` with a span per world (its ranks, hosts, how it
    ended, its engine timeline's file), one track ``re-forms`` with a span per re-form from the
    end of the old world to the first step of the new one (reason, old and new world, seconds),
    and instant marks for blacklisted hosts. Times are microseconds since hvlrun started.
  * The file is rewritten whole (to a temporary name, then renamed) after every change, so it is
    valid JSON at every moment. A write that fails is reported once on stderr and never ends
    the job.
"""

import json
import os
import sys
from typing import Any, Dict, List

__all__ = ["world_path", "ElasticTrace"]

_TRACKS = {"worlds": 1, "re-forms": 2, "hosts": 3}


def world_path(path: str, world: int) -> str:
    """Return ``path`` with ``.world<N>`` before its extension (``t.json`` -> ``t.world2.json``)."""
    stem, ext = os.path.splitext(path)
    return "%s.world%d%s" % (stem, world, ext)


class ElasticTrace:
    """Writes the job's worlds and re-forms to one Chrome trace file."""

    def __init__(self, path: str, t0: float) -> None:
        """Args:
            path: the file to write.
            t0: ``time.monotonic()`` of hvlrun's start (time zero of the trace).
        """
        self.path = path
        self._t0 = t0
        self._events: List[Dict[str, Any]] = [
            {"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": name}}
            for name, tid in _TRACKS.items()]
        self._failed = False
        self._write()

    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 1)

    def span(self, track: str, name: str, start: float, end: float, args: Dict[str, Any]) -> None:
        """Add a span from ``start`` to ``end`` (``time.monotonic()`` values)."""
        self._events.append({"ph": "X", "pid": 0, "tid": _TRACKS[track], "name": name,
                             "ts": self._us(start),
                             "dur": max(0.0, self._us(end) - self._us(start)),
                             "args": args})
        self._write()

    def mark(self, track: str, name: str, at: float, args: Dict[str, Any]) -> None:
        """Add an instant mark."""
        self._events.append({"ph": "i", "s": "t", "pid": 0, "tid": _TRACKS[track], "name": name,
                             "ts": self._us(at), "args": args})
        self._write()

    def _write(self) -> None:
        tmp = "%s.tmp.%d" % (self.path, os.getpid())
        try:
            with open(tmp, "w") as f:
                json.dump(self._events, f, indent=0)
            os.replace(tmp, self.path)
        except OSError as e:
            if not self._failed:
                self._failed = True
                sys.stderr.write("hvlrun: warning: cannot write the elastic timeline %s: %s\n"
                                 % (self.path, e))

