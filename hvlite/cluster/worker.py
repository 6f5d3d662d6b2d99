"""A rank's process on a cluster engine: ``python -m hvlite.cluster.worker`` (the command hvlrun
runs for every rank; not for direct use).

It is an ordinary hvlrun rank (started by MPI's proxy below the host guard, supervised by its
rank wrapper), that serves the functions of one slot's actor or task:

  1. It finds the agent of its slot (``agent.py``): ``HVLRUN_CLUSTER_SLOTS`` lists its host's
     agents in slot order, MPI's local rank (``MPI_LOCALRANKID``, Open MPI's
     ``OMPI_COMM_WORLD_LOCAL_RANK``) picks one; it authenticates with ``HVLRUN_CLUSTER_KEY``.
  2. It says ``hello`` (rank, world, pid, host) and applies the slot's setup before any user
     code: variables (``CUDA_VISIBLE_DEVICES``, the user's), the working directory and the
     ``sys.path`` entries of the actor or task (after its own), so that the engine's shipped
     code imports here.
  3. It serves frames: ``call`` (a pickled ``(mode, function, args, kwargs)``: ``build`` keeps
     ``function(*args, **kwargs)`` as the slot's object, ``execute`` calls ``function(object)``,
     ``run`` calls ``function(*args, **kwargs)``) answered with ``result``; ``job`` (the same,
     once, then exit); ``stop`` (exit 0). ``hvd.init()`` inside a function joins the world
     hvlrun formed, and the next call finds it as it was left: one process, one world.

Contract:
  * A result is ``b"1"`` + the value pickled with ``cloudpickle``; a function that raises
    sends ``b"0"`` + its traceback (``b"2"`` when the error is hvlite's word that a peer is
    gone or stopped: a consequence of another rank's failure), prints it on stderr, and the
    process exits 1: hvlrun then ends the world on every rank (their calls may be waiting on
    this one), and the driver raises naming the rank whose failure was no consequence.
  * A value that cannot be pickled sends ``b"3"`` + its type and pickle's error (printed on
    stderr too); the process goes on (a job's process exits 0): only that result is lost, and
    the driver raises for it naming the rank.
  * ``SystemExit``: code 0 or None is a result of None; any other code ends the process with
    it (the elastic exits 75/76 reach hvlrun's elastic driver as agreed).
  * A lost agent (its actor or task ended) ends the process with code 1, saying so.
"""
import json
import os
import sys
import traceback
from typing import Any, Optional

from .frames import ChannelError, connect
from .names import ENV_KEY, ENV_SLOTS

__all__ = ["LOCAL_RANK_VARIABLES", "local_rank", "main"]

LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")


def local_rank(environ=os.environ) -> int:
    """This process's index among its host's ranks, from the launcher's variables (0 if none)."""
    for name in LOCAL_RANK_VARIABLES:
        if environ.get(name, "").strip().isdigit():
            return int(environ[name])
    return 0


def _say(rank: int, message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write("hvlite worker: rank %d: %s\n" % (rank, message))
    sys.stderr.flush()


def _apply(setup: dict) -> None:
    """Take the slot's variables, working directory and import path (see the module)."""
    os.environ.update({k: str(v) for k, v in setup.get("env", {}).items()})
    cwd = setup.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError:
            pass                      # the engine's directory is not here: keep hvlrun's
    # after this process's own entries: the engine's (shipped code, a working_dir) are found,
    # and nothing of the engine's worker shadows what this interpreter has itself
    sys.path.extend(p for p in setup.get("path", []) if p not in sys.path)


class _Slot:
    """What the calls of one slot share: the object ``build`` made."""

    def __init__(self) -> None:
        self.obj: Any = None

    def run(self, payload: bytes) -> Any:
        import pickle
        mode, function, args, kwargs = pickle.loads(payload)
        if mode == "build":
            self.obj = function(*args, **kwargs)
            return None
        if mode == "execute":
            return function(self.obj)
        return function(*args, **kwargs)


def _call(slot: _Slot, payload: bytes) -> bytes:
    """Run one call; return the result frame's bytes. Exits the process on a non-zero
    ``SystemExit``; re-raises nothing else (a failure is returned as its traceback)."""
    try:
        try:
            value = slot.run(payload)
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            value = None
    except SystemExit:
        raise
    except BaseException as error:   # noqa: BLE001 - every failure goes back to the driver
        text = traceback.format_exc()
        _err(text)
        return (b"2" if _consequence(error) else b"0") + text.encode("utf-8", "replace")
    # apart from the call: a value that cannot travel is no failure of the rank or its world
    try:
        import cloudpickle
        return b"1" + cloudpickle.dumps(value)
    except Exception as error:   # noqa: BLE001 - any pickling error, told to the driver
        why = "a value of type %s.%s: %s: %s" % (type(value).__module__,
                                                 type(value).__qualname__,
                                                 type(error).__name__, error)
        _err("hvlite worker: the function's value cannot be pickled: %s\n" % why)
        return b"3" + why.encode("utf-8", "replace")


def _err(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()


def _consequence(error: BaseException) -> bool:
    """True for hvlite's errors that say a peer is gone or stopped (another rank's failure
    ends the world: its peers' collectives fail with these), as ``hvlite.elastic`` sorts them;
    a mismatch, a deadlock or a bad argument is this rank's own."""
    errors = sys.modules.get("hvlite.errors")
    if errors is None:
        return False
    own = (errors.MismatchError, errors.HvliteInvalidArgument, errors.HvliteDeadlockError)
    return isinstance(error, errors.HvliteError) and not isinstance(error, own)


def main(environ=os.environ) -> int:
    """Serve this rank's slot; return the exit code (see the module contract)."""
    from ..runner.world.rank_exec import rank_from_env
    rank = rank_from_env(environ)
    slots = [a for a in environ.get(ENV_SLOTS, "").split(",") if a]
    index = local_rank(environ)
    if index >= len(slots):
        _say(rank, "no agent for local rank %d (%s=%r)" % (index, ENV_SLOTS,
                                                          environ.get(ENV_SLOTS, "")))
        return 1
    hello = {"rank": rank, "world": int(environ.get("HVLRUN_ELASTIC_WORLD", "0") or 0),
             "pid": os.getpid(), "local": index, "host": environ.get("HVLRUN_HOST", "")}
    channel = None
    try:
        channel = connect(slots[index], environ.get(ENV_KEY, ""))
        channel.send("hello", json.dumps(hello).encode("utf-8"))
        slot = _Slot()
        while True:
            kind, data = channel.recv()
            if kind == "setup":
                _apply(json.loads(data.decode("utf-8")))
            elif kind in ("call", "job"):
                answer = _call(slot, data)
                channel.send("result", answer)
                if answer[:1] not in (b"1", b"3"):
                    return 1
                if kind == "job":
                    return 0
            elif kind == "stop":
                return 0
            elif kind == "refused":
                _say(rank, "the agent at %s refused it: %s" % (slots[index], data.decode()))
                return 1
    except ChannelError as e:
        _say(rank, "lost the agent of its slot at %s (its actor or task ended?): %s"
             % (slots[index], e))
        return 1
    finally:
        if channel is not None:
            channel.close()


def _entry() -> Optional[int]:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
