"""One slot of an hvlite job on Ray: the actor that holds a worker's resources on its node.

Contract:
  * :class:`Slot` (made a Ray actor by the executors, with the slot's CPUs and GPUs, placed by a
    placement group or pinned to a node) runs a node agent (``hvlite/cluster/agent.py``) on
    its node's address: hvlrun's remote shell runs the host guard, MPI's proxy and the ranks of
    this node below it, and the rank process of this slot connects to it. Its methods:
    ``info`` (node, address, agent, GPU ids, the actor's directory and import path),
    ``setup`` (the variables the rank process takes), ``set_job``, ``wait_worker``, ``call``,
    ``results``, ``stop`` and ``close``.
  * ``call(seq, payload)`` returns the value the rank process's function returned, or raises
    :class:`RankFailed` (rank, host, traceback) when the function raised,
    :class:`ResultUnpicklable` (rank, host, why) when its value cannot be pickled (the rank
    goes on), or :class:`~hvlite.cluster.agent.WorkerGone` when the rank process is gone.
    Calls run one at a time in ``seq`` order (0, 1, ... per actor, as the driver issued them),
    whatever order Ray delivers them in, so every rank runs a driver's calls in one order.
  * :func:`unwrap` turns what ``ray.get`` raised into the original exception, when Ray wrapped
    one of ours.
"""
import os
import pickle
import socket
import sys
from typing import Dict, List, Optional

import ray

from ..cluster.agent import Agent, WorkerGone

__all__ = ["RankFailed", "ResultUnpicklable", "Slot", "unwrap", "RAY_OPTIONS"]

# Calls block in the actor while a rank works (and wait there for their turn): they get
# threads of their own ("calls"), so that ``stop``/``close``/``results`` are still served.
# (Ray takes concurrency groups in ``ray.remote`` only, not in ``.options()``.)
RAY_OPTIONS = {"max_concurrency": 8}
CONCURRENCY_GROUPS = {"calls": 8}


class RankFailed(RuntimeError):
    """A rank's function raised: ``args`` are (rank, host, traceback text, consequence: True
    when the error says a peer is gone, i.e. another rank's failure caused it)."""

    def __str__(self) -> str:
        rank, host, text, _ = self.args
        return "rank %d (host %s) raised:\n%s" % (rank, host, text.rstrip())


class ResultUnpicklable(RuntimeError):
    """A rank's function returned a value that cannot be pickled: ``args`` are (rank, host,
    why: the value's type and pickle's error). The rank and its world go on."""

    def __str__(self) -> str:
        rank, host, why = self.args
        return "rank %d (host %s) returned a value that cannot be sent back: %s" % (
            rank, host, why.strip())


def unwrap(error: BaseException) -> BaseException:
    """The exception Ray wrapped (``RayTaskError.cause``), else ``error`` itself."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


class Slot:
    """The actor class (see the module contract)."""

    def __init__(self, key: str) -> None:
        self.address = ray.util.get_node_ip_address()
        self.node = ray.get_runtime_context().get_node_id()
        self.agent = Agent(key, self.address)

    def info(self) -> Dict[str, object]:
        return {"node": self.node, "address": self.address, "agent": self.agent.address,
                "gpus": [str(g) for g in ray.get_gpu_ids()], "hostname": socket.gethostname(),
                "pid": os.getpid()}

    def setup(self, env: Dict[str, str]) -> None:
        """The variables this slot's rank process takes, with the actor's directory and path."""
        self.agent.set_setup(env, os.getcwd(), [p for p in sys.path if p])

    def set_job(self, payload: bytes) -> None:
        self.agent.set_job(payload)

    def wait_worker(self, timeout: float) -> dict:
        return self.agent.wait_worker(timeout)

    @ray.method(concurrency_group="calls")
    def call(self, seq: int, payload: bytes):
        status, data = self.agent.call(payload, seq)
        if status == "ok":
            return pickle.loads(data)
        info = self.agent.worker_info or {}
        if status == "unpicklable":
            raise ResultUnpicklable(int(info.get("rank", -1)), str(info.get("host", "?")),
                                    data.decode("utf-8", "replace"))
        raise RankFailed(int(info.get("rank", -1)), str(info.get("host", "?")),
                         data.decode("utf-8", "replace"), status == "consequence")

    def results(self) -> List[tuple]:
        return self.agent.results()

    def stop(self) -> None:
        self.agent.stop_worker()

    def close(self) -> None:
        self.agent.close()


def slot_actor_class():
    """``Slot`` as a Ray actor class (its concurrency groups set)."""
    return ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(Slot)


def slot_options(cpus: float, gpus: float, strategy: Optional[object] = None) -> dict:
    """``ray.remote`` options of a slot with these resources and scheduling strategy."""
    options = dict(RAY_OPTIONS, num_cpus=cpus, num_gpus=gpus)
    if strategy is not None:
        options["scheduling_strategy"] = strategy
    return options


__all__ += ["slot_actor_class", "slot_options", "WorkerGone"]
