"""What runs inside Ray Train's worker actors for :class:`~hvlite.ray.HvliteTrainer`: the node
agent of the worker's slot, joining the world hvlrun formed as its rank, and leaving it.

Contract (the backend, ``train.py``, runs these in every worker through Ray Train's worker
group; one slot per worker process, kept in this module):
  * :func:`open_slot` (the job's key) starts this worker's agent (``hvlite/cluster/agent.py``)
    on its node's address and returns what the backend places it by: the node's id and
    address, the agent's address, the pid, Ray Train's world and local rank.
  * :func:`join` (timeout) waits for the stand-in hvlrun started for this worker's rank
    (``hvlite/cluster/standin.py``) and takes its variables: MPI's process-manager port and id
    as they are (with them ``hvd.init()`` here initialises MPI as that rank of hvlrun's world),
    hvlrun's settings where this process has none. Returns the stand-in's hello; raises
    :class:`~hvlite.cluster.agent.WorkerGone` when none came in time.
  * :func:`train_context` is the backend's ``train_func_context``, around the user's
    ``train_loop_per_worker``: when it raises, the traceback goes to the stand-in, which exits
    1, and hvlrun ends the world on every rank.
  * When hvlrun ends the world (the stand-in's ``end`` notice), hvlite's engine here is shut
    down at once: collectives still waiting on a peer fail with ``HvliteShutdownError``.
  * :func:`leave` (timeout) shuts hvlite down (MPI is finalized when every rank leaves with
    it), unlinks the job's ``/dev/shm`` files this process still maps (a world that ended on a
    failure does not finalize MPI), and lets the stand-in exit 0. :func:`close` closes the
    agent (what still runs below it is ended). Neither raises.
"""
import contextlib
import os
import sys
import threading
import traceback
from typing import Dict, Iterator, Optional

import ray

from ..cluster.agent import Agent
from ..runner.procs.job_files import mapped_shm

__all__ = ["open_slot", "join", "train_context", "leave", "close"]

_slot: Optional["_Slot"] = None
_lock = threading.Lock()


def _stop_engine(timeout: float) -> None:
    """Shut hvlite down if it runs in this process, waiting at most ``timeout`` seconds (a
    shutdown waits for an init still inside MPI's start-up). Cannot fail."""
    basics = sys.modules.get("hvlite.basics")
    if basics is None or not basics.is_initialized():
        return

    def stop() -> None:
        try:
            basics.shutdown()
        except Exception:   # noqa: BLE001 - the world is ending either way
            pass
    thread = threading.Thread(target=stop, name="hvlite-ray-train-stop", daemon=True)
    thread.start()
    thread.join(timeout)


class _Slot:
    """This worker's agent and what it heard from its stand-in."""

    def __init__(self, key: str) -> None:
        self.address = ray.util.get_node_ip_address()
        self.agent = Agent(key, self.address, on_notice=self._notice)

    def _notice(self, data: bytes) -> None:
        if data == b"end":          # hvlrun ends the world: nobody may wait on a peer that left
            threading.Thread(target=_stop_engine, args=(30.0,), daemon=True).start()


def open_slot(key: str) -> Dict[str, object]:
    """Start this worker's agent; return its placement facts (see the module contract)."""
    global _slot
    with _lock:
        if _slot is not None:
            _slot.agent.close()
        _slot = _Slot(key)
    context = ray.train.get_context()
    return {"node": ray.get_runtime_context().get_node_id(), "address": _slot.address,
            "agent": _slot.agent.address, "pid": os.getpid(),
            "rank": context.get_world_rank(), "local_rank": context.get_local_rank()}


def join(timeout: float) -> dict:
    """Wait for this rank's stand-in and take its variables; return its hello."""
    hello = _slot.agent.wait_worker(timeout)
    given = hello.get("handover", {})
    for name in ("PMI_FD", "PMI_RANK", "PMI_SIZE"):   # another launcher's, if any: not ours
        os.environ.pop(name, None)
    os.environ.update(given.get("mpi", {}))
    for name, value in given.get("settings", {}).items():
        os.environ.setdefault(name, value)
    return hello


@contextlib.contextmanager
def train_context() -> Iterator[None]:
    """Around the user's training function: a failure goes to the stand-in (module contract)."""
    try:
        yield
    except BaseException:
        slot = _slot
        if slot is not None:
            slot.agent.tell_worker("fail", traceback.format_exc().encode("utf-8", "replace"))
        raise


def leave(timeout: float) -> None:
    """Shut hvlite down, unlink what MPI left mapped, let the stand-in exit 0. Cannot fail."""
    _stop_engine(timeout)
    for path in mapped_shm(os.getpid()):
        try:
            os.unlink(path)         # the mapping stays valid; only the name goes
        except OSError:
            pass
    if _slot is not None:
        _slot.agent.stop_worker()


def close() -> None:
    """Close this worker's agent. Cannot fail."""
    global _slot
    with _lock:
        slot, _slot = _slot, None
    if slot is not None:
        slot.agent.close()
