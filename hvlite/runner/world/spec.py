"""What a world is started with and how it ended: the types the command line, the supervision
loop and the elastic driver share.

Contract:
  * :class:`Launch`: what every world of a job is started with (the parsed flags, the MPI
    flavour, the ``mpiexec`` to run, the user's command, the knob flags' ``HVLITE_*``
    variables, and variables for the launcher's environment only).
  * :class:`WorldSpec`: one world: its number (0 for a plain job, 1, 2, ... for the worlds of an
    elastic job), its hosts with their slots, more variables for its ranks, and its size.
  * :class:`WorldEnd`: how a world ended (its kind, in words, the hosts it is charged to, an
    exit code, when it was noticed, and what only some readers need).
  * :func:`rank_hosts`: each rank's host.
Pure data: nothing here starts a process or reads the environment.
"""
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..hosts.hostlist import Host

__all__ = ["Launch", "WorldSpec", "WorldEnd", "KINDS", "rank_hosts"]

# How a world can end. done: every rank exited 0; signal: hvlrun got SIGINT/SIGTERM (code
# 128+signum); lost: a host or rank vanished; failed: a rank exited with a code that is no
# agreed end (code: the rank's); finished-failed: the same after another rank had exited 0;
# start-timeout: ranks did not start in time; unreachable: remote hosts failed their check
# before the world started; launcher: mpiexec ended on its own, cannot be run (127), or the
# control channel cannot be opened (1); reform and peer-lost: an elastic world's agreed ends
# (the hosts changed; a peer was lost).
KINDS = ("done", "signal", "lost", "failed", "finished-failed", "start-timeout", "unreachable",
         "launcher", "reform", "peer-lost")


class Launch(NamedTuple):
    """What every world of the job is started with: the parsed flags, the MPI flavour, the
    ``mpiexec`` to run, the user's command, the ``HVLITE_*`` variables of the knob flags, and
    variables for the launcher's environment only (never a command line: the commit key)."""
    args: object
    flavour: str
    mpiexec: str
    command: Sequence[str]
    knobs: Dict[str, str]
    hidden_env: Dict[str, str]


class WorldSpec(NamedTuple):
    """One world: its number (0: a plain job), its hosts (each with its slots; an elastic
    world's placement gives each host its rank count), more variables for its ranks, and its
    size (0: every slot of ``hosts``)."""
    number: int
    hosts: Sequence[Host]
    rank_env: Dict[str, str]
    size: int = 0

    @property
    def np(self) -> int:
        """The number of ranks."""
        return self.size or sum(h.slots for h in self.hosts)


class WorldEnd(NamedTuple):
    """How a world ended: its kind (:data:`KINDS`), in words, the hosts it is charged to, an
    exit code where the job may end with one, and when it was noticed (``time.monotonic()``).
    ``rank`` is the failing rank, ``who`` the lost host or rank in words (``host h2 (rank
    1)``), ``details`` one line per unreachable host and a summary."""
    kind: str
    reason: str
    hosts: Tuple[str, ...] = ()
    code: int = 0
    at: float = 0.0
    rank: Optional[int] = None
    who: str = ""
    details: Tuple[str, ...] = ()


def rank_hosts(hosts: Sequence[Host]) -> List[str]:
    """Return each rank's host name, rank by rank, as ranks fill the slots. Cannot fail."""
    return [h.name for h in hosts for _ in range(h.slots)]
