"""What runs inside Ray Train's worker actors for :class:`~hvlite.ray.HvliteTrainer`: the node
agent of the worker's slot, joining the world hvlrun formed as its rank, and leaving it.

Contract (the backend, ``train.py``, runs these in every worker through Ray Train's worker
group; one slot per worker process, kept in this module):
  * :func:`open_slot` (the job's key) starts this worker's agent (``hvlite/cluster/agent.py``)
    on its node's address and returns what the backend places it by: the node's id and
    address, the agent's address, the pid, Ray Train's world and local rank.
  * :func:`join` (timeout) waits for the stand-in hvlrun started for this worker's rank
    (``hvlite/cluster/standin.py``), takes its variables (MPI's process-manager port and id as
    they are, hvlrun's settings where this process has none) and initialises MPI with them:
    this process is now that rank of hvlrun's world, and ``hvd.init()`` starts hvlite's engine
    on it. Every worker joins at once (MPI's start-up waits for all). MPI is never finalized:
    hvlite finalizes only an MPI it initialised itself, and ``MPI_Finalize`` talks to MPI's
    proxy, which is gone once hvlrun ended the world (measured: the process crashes). Returns
    the stand-in's hello; raises :class:`~hvlite.cluster.agent.WorkerGone` when none came in
    time, ``RuntimeError`` when MPI's start-up failed or did not end in time.
  * :func:`settle`, once every worker has joined (so every process of each node has attached
    it), unlinks MPI's ``/dev/shm`` segment, as hvlite does its own: only ``MPI_Finalize``
    would remove it, and a worker that dies never gets there, nor does any process of its node
    survive it to clean up (measured: hydra ends the node's stand-ins with SIGKILL).
  * :func:`train_context` is the backend's ``train_func_context``, around the user's
    ``train_loop_per_worker``: when it raises, the traceback goes to the stand-in, which exits
    1, and hvlrun ends the world on every rank.
  * When hvlrun ends the world (the stand-in's ``end`` notice), hvlite's engine here is shut
    down at once: collectives still waiting on a peer fail with ``HvliteShutdownError``.
  * :func:`leave` (timeout) shuts hvlite down, unlinks any ``/dev/shm`` file of the job this
    process still maps, and lets the stand-in exit 0. :func:`close` closes the agent (what
    still runs below it is ended). Neither raises.
"""
import contextlib
import ctypes
import os
import sys
import threading
import traceback
from typing import Dict, Iterator, Optional

import ray
import ray.train

from ..cluster.agent import Agent
from ..runner.procs.job_files import mapped_shm

__all__ = ["open_slot", "join", "settle", "train_context", "leave", "close"]

_slot: Optional["_Slot"] = None
_lock = threading.Lock()
_MPI_THREAD_MULTIPLE = 3            # MPICH's value (mpi.h); the stand-in requires hydra


def _stop_engine(timeout: float) -> None:
    """Shut hvlite down if it runs in this process, waiting at most ``timeout`` seconds (on a
    thread: a shutdown waits for an init in progress). Cannot fail."""
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
    """This worker's agent; its stand-in's ``end`` notice stops the engine."""

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


def _mpi_library() -> ctypes.CDLL:
    """The MPI library hvlite's engine is linked with (loaded with it), opened again."""
    from .. import _lib  # noqa: F401 - loads the engine, and with it its MPI
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libmpi.so"):
                return ctypes.CDLL(path)
    raise RuntimeError("hvlite.ray: the MPI library of hvlite's engine is not loaded")


def _init_mpi(timeout: float) -> None:
    """``MPI_Init_thread`` (MPI_THREAD_MULTIPLE) here, bounded: on a thread of its own, as MPI's
    start-up waits for every rank."""
    mpi = _mpi_library()
    flag = ctypes.c_int(0)
    mpi.MPI_Initialized(ctypes.byref(flag))
    if flag.value:
        return
    outcome: Dict[str, int] = {}

    def start() -> None:
        provided = ctypes.c_int(-1)
        outcome["rc"] = mpi.MPI_Init_thread(None, None, _MPI_THREAD_MULTIPLE,
                                            ctypes.byref(provided))
    thread = threading.Thread(target=start, name="hvlite-ray-train-mpi-init", daemon=True)
    thread.start()
    thread.join(timeout)
    if "rc" not in outcome:
        raise RuntimeError("hvlite.ray: MPI's start-up did not end within %g s" % timeout)
    if outcome["rc"] != 0:
        raise RuntimeError("hvlite.ray: MPI_Init_thread failed with code %d" % outcome["rc"])


def join(timeout: float) -> dict:
    """Wait for this rank's stand-in, take its variables, initialise MPI; return its hello."""
    hello = _slot.agent.wait_worker(timeout)
    given = hello.get("handover", {})
    for name in ("PMI_FD", "PMI_RANK", "PMI_SIZE"):   # another launcher's, if any: not ours
        os.environ.pop(name, None)
    os.environ.update(given.get("mpi", {}))
    for name, value in given.get("settings", {}).items():
        os.environ.setdefault(name, value)
    _init_mpi(timeout)
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


def settle() -> None:
    """Unlink the job's ``/dev/shm`` files this process maps (MPI's segment for its node).
    Cannot fail."""
    for path in mapped_shm(os.getpid()):
        try:
            os.unlink(path)         # the mappings stay valid; only the name goes
        except OSError:
            pass


def leave(timeout: float) -> None:
    """Shut hvlite down, unlink what MPI still has mapped, let the stand-in exit 0. Cannot
    fail."""
    _stop_engine(timeout)
    settle()
    if _slot is not None:
        _slot.agent.stop_worker()


def close() -> None:
    """Close this worker's agent. Cannot fail."""
    global _slot
    with _lock:
        slot, _slot = _slot, None
    if slot is not None:
        slot.agent.close()
