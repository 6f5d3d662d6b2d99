"""What a plain job and an elastic job's world do differently: everything else is one loop.

A plain job is an elastic job of one world: both run through ``supervise.py``'s supervision
loop and ``run.py``'s start and tidy-up. A :class:`Rules` object is the loop's parameter.

Contract:
  * ``agreed``: the exit codes that are no failure. An elastic world also agrees to
    ``HOSTS_UPDATED_CODE`` (every rank stops at a commit: the hosts changed) and
    ``PEER_LOST_CODE`` (a consequence: the cause gets time to show); in a plain job they are
    failures like any other code.
  * ``linger``: seconds an elastic world's clients get to finish after the loop ended the world,
    so that none is left when the next world starts (0 for a plain job: hvlrun exits).
  * :meth:`Rules.check_timeout`: the limit of the remote hosts' check (``--start-timeout``; with
    0, none for a plain job, 30 s for an elastic world, which must go on without the host).
  * Who tells the user: in a plain job hvlrun says what ends the job as it happens and how it
    ended (:class:`PlainRules` ``announce``); in an elastic job the driver says how each world
    ended, so :class:`Rules` ``announce`` is silent. Likewise the words sent with ``stop`` to
    every wrapper and guard, of a start timeout and of a launcher that exited, and what
    ``--verbose`` shows.
  * :data:`PLAIN` and :data:`ELASTIC` are the two instances; they hold no state.
"""
import os
import signal
import sys
from typing import Optional, Sequence

from ...protocol.elastic_env import HOSTS_UPDATED_CODE, PEER_LOST_CODE
from .mpi_command import format_command
from .say import say
from .spec import Launch, WorldEnd, WorldSpec

__all__ = ["Rules", "PlainRules", "PLAIN", "ELASTIC"]


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 1`` or ``ranks 0,2``. Cannot fail."""
    return "rank%s %s" % ("s" if len(ranks) > 1 else "", ",".join(map(str, ranks)))


class Rules:
    """An elastic world's rules: the driver tells what happened (see the module contract)."""

    agreed = (0, HOSTS_UPDATED_CODE, PEER_LOST_CODE)
    linger = 2.0

    def check_timeout(self, start_timeout: float) -> Optional[float]:
        """Seconds allowed to the remote hosts' check (None: no limit)."""
        return start_timeout or 30.0

    def show_command(self, launch: Launch, spec: WorldSpec, argv: Sequence[str],
                     added: dict) -> None:
        """With ``--verbose``, show the command before it runs."""
        if launch.args.verbose:
            say("world %d: %s" % (spec.number, " ".join(argv)))

    def stop_reason(self, end: WorldEnd) -> str:
        """The words sent with ``stop`` to every wrapper and guard."""
        return end.reason

    def start_timeout_reason(self, missing: Sequence[int], seconds: float) -> str:
        """Why ranks that did not start ended the world."""
        return "%s did not start in time" % _ranks(missing)

    def launcher_reason(self, argv0: str, code: int, reported: int, np: int) -> str:
        """The launcher exited with ``code`` on its own, ``reported`` of ``np`` exits came."""
        return ("%s exited with code %d (%d of %d ranks reported an exit)"
                % (os.path.basename(argv0), code, reported, np))

    def announce(self, end: WorldEnd, stopping: bool) -> None:
        """Tell the user about ``end``: ``stopping`` while the world is being ended, else once
        it is over (an end found while stopping is told only then)."""


class PlainRules(Rules):
    """A plain job's rules: hvlrun itself says what ends the job and with which code."""

    agreed = (0,)
    linger = 0.0

    def check_timeout(self, start_timeout: float) -> Optional[float]:
        return start_timeout or None

    def show_command(self, launch: Launch, spec: WorldSpec, argv: Sequence[str],
                     added: dict) -> None:
        if launch.args.verbose:
            sys.stderr.write(format_command(argv, added))
            sys.stderr.flush()

    def stop_reason(self, end: WorldEnd) -> str:
        if end.kind == "lost":
            return "lost " + end.who
        if end.kind in ("failed", "finished-failed"):
            return "rank %d failed" % end.rank
        if end.kind == "start-timeout":
            return "start timeout"
        return end.reason

    def start_timeout_reason(self, missing: Sequence[int], seconds: float) -> str:
        return "%s did not start within %g s" % (_ranks(missing), seconds)

    def launcher_reason(self, argv0: str, code: int, reported: int, np: int) -> str:
        return "%s exited with code %d" % (argv0, code)

    def announce(self, end: WorldEnd, stopping: bool) -> None:
        kind = end.kind
        if kind == "signal" and stopping:
            say("got %s, stopping the job" % signal.Signals(end.code - 128).name)
        elif kind == "lost":
            say("%s; %s" % (end.reason, "ending the job on every host" if stopping
                            else "the job ended"))
        elif kind == "start-timeout":
            say(end.reason)
        elif kind in ("failed", "finished-failed") and not stopping:
            say("first failure: rank %d with exit code %d" % (end.rank, end.code))
        elif kind == "unreachable":
            for line in end.details:
                say(line)
        elif kind == "launcher" and end.code:
            say(end.reason)


PLAIN = PlainRules()
ELASTIC = Rules()
