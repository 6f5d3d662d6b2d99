"""A rank's stand-in: ``python -m hvlite.cluster.standin`` (the command hvlrun runs for every rank
of a job whose MPI processes are the engine's own workers, Ray Train's worker actors; not for
direct use).

hvlrun starts it as it starts any rank (MPI's proxy below the host guard, its rank wrapper above
it), with hydra's ``-pmi-port``: MPI's connection to its process manager is then a TCP port and
an id (``PMI_PORT``, ``PMI_ID``) that any process on this node may use, not a descriptor that
only a child inherits. The stand-in hands them to its slot's worker, which initialises MPI with
them and so becomes the rank, while the stand-in stays as the rank's representative for hvlrun:

  1. It finds its slot's agent (as ``worker.py`` does) and says ``hello`` with its rank, pid,
     host and :func:`handover`: the variables the worker's process takes.
  2. It waits, and ends as the rank must:
     * ``stop`` from the agent (the job is over): exit 0;
     * ``fail`` with a traceback (the worker's training function raised): the traceback on
       stderr, exit 1; hvlrun then ends the world on every rank;
     * the agent's connection closes (the worker's process is gone): it says so, exit 1;
     * SIGTERM or SIGINT (hvlrun ends the world, through the rank wrapper): it sends the
       ``notice`` ``end`` (the worker stops its engine at once, so that nobody waits on a peer
       that left) and exits 128 + the signal's number.

Contract: without ``PMI_PORT`` (mpiexec ran without ``-pmi-port``, or the MPI is not MPICH's
hydra) the stand-in says so and exits 1 before saying hello. What the stand-in cannot do: outlive
its node's MPI proxy. When the node's proxy runs below a worker that dies (it runs below the
agent of the node's first slot), the proxy's output pipe breaks and hydra ends that node's ranks
with SIGKILL; hvlrun then names the host as lost.
"""
import json
import os
import signal
import sys
from typing import Dict, Mapping

from .frames import Channel, ChannelError, connect
from .names import ENV_KEY, ENV_SLOTS
from .worker import local_rank

__all__ = ["MPI_VARIABLES", "SETTING_PREFIXES", "handover", "main"]

# MPI's own: the worker takes them as they are (they make it the rank)
MPI_VARIABLES = ("PMI_PORT", "PMI_ID", "PMI_HOSTNAME", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
# hvlrun's and the transports' settings: the worker takes those it does not set itself
SETTING_PREFIXES = ("HVLITE_", "HOROVOD_", "NCCL_", "FI_", "UCX_", "MPIR_CVAR_")


def handover(environ: Mapping[str, str]) -> Dict[str, Dict[str, str]]:
    """The variables a worker takes to become this rank: ``{"mpi": {...}, "settings": {...}}``
    (see :data:`MPI_VARIABLES`, :data:`SETTING_PREFIXES`; ``HVLRUN_HOST`` is a setting too).
    Cannot fail."""
    mpi = {k: environ[k] for k in MPI_VARIABLES if k in environ}
    settings = {k: v for k, v in environ.items()
                if k.startswith(SETTING_PREFIXES) or k == "HVLRUN_HOST"}
    return {"mpi": mpi, "settings": settings}


def _say(rank: int, message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write("hvlite stand-in: rank %d: %s\n" % (rank, message))
    sys.stderr.flush()


class _Ending(Exception):
    """A signal asked this process to end: ``args[0]`` is the exit code."""


def _ignore_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


def _on_signals(channel: Channel) -> None:
    """SIGTERM/SIGINT: tell the worker the world ends, then end (see the module)."""
    def ending(signum, _frame):
        _ignore_signals()               # the guard's own SIGTERM may follow the wrapper's
        try:
            channel.send("notice", b"end")
        except ChannelError:
            pass
        raise _Ending(128 + signum)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, ending)


def _serve(channel: Channel, rank: int) -> int:
    """Wait for the agent's frames; return the exit code (see the module)."""
    try:
        while True:
            kind, data = channel.recv()
            if kind == "stop":
                return 0
            if kind == "fail":
                sys.stdout.flush()
                sys.stderr.write(data.decode("utf-8", "replace"))
                sys.stderr.flush()
                return 1
            if kind == "refused":
                _say(rank, "the agent refused it: %s" % data.decode("utf-8", "replace"))
                return 1
    except ChannelError as e:
        _say(rank, "its worker is gone (%s)" % e)
        return 1


def main(environ: Mapping[str, str] = os.environ) -> int:
    """Stand in for this rank; return the exit code (see the module contract)."""
    from ..runner.world.rank_exec import rank_from_env
    rank = rank_from_env(environ)
    if not environ.get("PMI_PORT"):
        _say(rank, "no PMI_PORT: hvlrun must run mpiexec with -pmi-port (MPICH's hydra), so "
                   "that the worker can join the world in its stead")
        return 1
    slots = [a for a in environ.get(ENV_SLOTS, "").split(",") if a]
    index = local_rank(environ)
    if index >= len(slots):
        _say(rank, "no agent for local rank %d (%s=%r)" % (index, ENV_SLOTS,
                                                          environ.get(ENV_SLOTS, "")))
        return 1
    hello = {"rank": rank, "pid": os.getpid(), "local": index,
             "host": environ.get("HVLRUN_HOST", ""), "handover": handover(environ)}
    try:
        channel = connect(slots[index], environ.get(ENV_KEY, ""))
    except ChannelError as e:
        _say(rank, "cannot reach the agent of its slot at %s: %s" % (slots[index], e))
        return 1
    try:
        _on_signals(channel)
        channel.send("hello", json.dumps(hello).encode("utf-8"))
        return _serve(channel, rank)
    except _Ending as e:
        return int(e.args[0])
    except ChannelError as e:
        _say(rank, "lost the agent of its slot at %s: %s" % (slots[index], e))
        return 1
    finally:
        _ignore_signals()
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
