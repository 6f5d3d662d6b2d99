"""Elastic hvlite jobs on Ray: workers follow the cluster's nodes, through hvlrun's elastic driver.

Contract:
  * :class:`ElasticJob` (``RayExecutor(min_workers=..., max_workers=...)``) and
    :class:`ElasticRayExecutor` (Horovod's older class) keep one slot actor per worker's share
    of every live node (``CPU // cpus_per_worker``, and ``GPU // gpus_per_worker`` with GPUs;
    at most ``max_workers`` in all), pinned to its node (``NodeAffinitySchedulingStrategy``). A
    thread of the driver looks every :data:`WATCH_SECONDS`: a new node gets its actors; a node
    that Ray reports dead is dropped, and so is one whose agents missed
    :data:`DROP_MISSED_PINGS` TCP pings in a row over :data:`DROP_SECONDS` (a killed node, a
    killed actor: sooner than Ray's health check; a briefly frozen node is kept). A dropped
    node's actors are ended at once (on a thread, bounded), and the node is not looked at again
    until they are, so their resources come back for its new actors. The watcher's Ray calls
    are bounded by ``timeout_s`` (a node that does not answer in time is dropped); its last
    error is part of ``start()``'s. The host table it writes is hvlrun's
    discovery list, so hvlrun's elastic driver re-forms the job as hosts come and go (a host
    that restarts is a new host: its node id is part of its name).
  * ``run(fn, args, kwargs)`` starts hvlrun's elastic job (``--min-np``/``--max-np``/
    ``--elastic-timeout``/``--reset-limit``/``--blacklist-cooldown-range``); every rank of every
    world calls ``fn(*args, **kwargs)`` in a fresh process below its slot's actor (the function
    uses ``hvd.elastic.run`` and a ``State``: each world resumes from the last commit). It
    returns the last world's results in rank order (each run its own: setting a run's job
    clears what the agents kept of the one before), or raises
    :class:`~hvlite.cluster.JobError` (a rank's traceback, or hvlrun's words: too few workers
    for ``elastic_timeout``, the reset limit, worlds failing without progress).
  * ``start()`` waits until ``min_workers`` slots exist (``timeout_s``); ``shutdown()`` ends
    hvlrun, the thread and every actor.
"""
import math
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..cluster.frames import ChannelError, connect
from ..cluster.job import END_GRACE_SECONDS, HostTable, Hvlrun, JobError, host_names
from ..protocol.wire import new_secret
from .slot import slot_actor_class, slot_options

__all__ = ["WATCH_SECONDS", "ElasticJob", "ElasticRayExecutor", "ElasticSettings"]

WATCH_SECONDS = 1.0
_PING_SECONDS = 1.0
# A node whose agents stopped answering is dropped once they have missed this many pings in a
# row over at least this long (a busy or briefly frozen node is no lost one; Horovod's
# discovery waits about as long). A node Ray reports dead is dropped at once.
DROP_MISSED_PINGS = 3
DROP_SECONDS = 10.0


def _alive(agent: str, key: str) -> bool:
    """True if the agent at ``agent`` answers a ping within :data:`_PING_SECONDS`."""
    try:
        channel = connect(agent, key, timeout=_PING_SECONDS)
    except ChannelError:
        return False
    try:
        channel.sock.settimeout(_PING_SECONDS)
        channel.send("ping")
        return channel.recv()[0] == "pong"
    except (ChannelError, OSError):
        return False
    finally:
        channel.close()


class _Node:
    """One node's slot actors, from their creation until the node is dropped."""

    def __init__(self, node: str, actors: list) -> None:
        self.node, self.actors = node, actors
        self.infos_ref = [a.info.remote() for a in actors]
        self.infos: Optional[List[dict]] = None
        self.since = time.monotonic()
        self.name = ""
        self.missed, self.missed_since = 0, 0.0      # pings missed in a row, since when

    def answered(self, ok: bool, now: float) -> bool:
        """Count a look's ping; True when the node is to be dropped (module contract)."""
        if ok:
            self.missed = 0
            return False
        if not self.missed:
            self.missed_since = now
        self.missed += 1
        return self.missed >= DROP_MISSED_PINGS and now - self.missed_since >= DROP_SECONDS


def refuse_own_discovery(override_discovery: bool) -> None:
    """ValueError for ``override_discovery=False``: the workers always follow Ray's nodes."""
    if not override_discovery:
        raise ValueError("hvlite.ray: override_discovery=False (a host discovery of your own) "
                         "is not offered: the workers always follow the Ray cluster's nodes; "
                         "leave it True, or run hvlrun --host-discovery-script outside Ray")


def _cluster_resources() -> str:
    try:
        return str(ray.cluster_resources())
    except Exception as e:   # noqa: BLE001 - only words for an error message
        return "(unknown: %s)" % e


class ElasticJob:
    """The elastic side of ``RayExecutor`` (see the module contract)."""

    def __init__(self, settings, min_workers: int, max_workers: Optional[int], cpus: float,
                 gpus: float, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[Sequence] = None, elastic_timeout: float = 600,
                 env_vars: Optional[Dict[str, str]] = None) -> None:
        self.settings, self.min_workers = settings, min_workers
        self.max_workers = max_workers or math.inf
        self.cpus, self.gpus = cpus, gpus
        self.elastic = {"min_np": min_workers, "max_np": max_workers, "reset_limit": reset_limit,
                        "cooldown_range": cooldown_range, "elastic_timeout": elastic_timeout}
        self.env = dict(env_vars or {})
        self._key = new_secret()
        self._lock = threading.Lock()
        self._nodes: Dict[str, _Node] = {}       # live or starting, by Ray node id
        self._dropped: List[Any] = []            # actors of dropped nodes (killed at once, and
        self._killers: Dict[str, threading.Thread] = {}   # again at the end), by node id
        self._watch_error = ""                   # the watcher's last failure, for start()'s error
        self._payload: Optional[bytes] = None
        self._table: Optional[HostTable] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._job: Optional[Hvlrun] = None

    # --- the node watcher ---------------------------------------------------------------------
    def start(self, extra_env_vars: Optional[Dict[str, str]] = None) -> None:
        """Start following the cluster; wait until ``min_workers`` slots are ready."""
        self.env.update(extra_env_vars or {})
        if self._table is None:
            self._table = HostTable()
            self._thread = threading.Thread(target=self._watch, name="hvlite-ray-nodes",
                                            daemon=True)
            self._thread.start()
        deadline = time.monotonic() + self.settings.timeout_s
        while self._ready_slots() < self.min_workers:
            if time.monotonic() > deadline:
                raise JobError("hvlite.ray: only %d of min_workers %d slots ready within %g s "
                               "(timeout_s); the cluster has %s%s"
                               % (self._ready_slots(), self.min_workers, self.settings.timeout_s,
                                  _cluster_resources(),
                                  "; the node watcher's last error: " + self._watch_error
                                  if self._watch_error else ""))
            time.sleep(0.2)

    def _ready_slots(self) -> int:
        with self._lock:
            return sum(len(n.actors) for n in self._nodes.values() if n.name)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            try:
                self._look()
            except Exception as e:   # noqa: BLE001 - a cluster in trouble: look again later
                self._watch_error = "%s: %s" % (type(e).__name__, str(e).strip()[:500])

    def _look(self) -> None:
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        changed = False
        with self._lock:
            nodes = dict(self._nodes)
        for node, entry in nodes.items():
            if node not in alive or (entry.name and entry.answered(
                    all(_alive(i["agent"], self._key) for i in entry.infos), time.monotonic())):
                self._drop(node)
                changed = True
        with self._lock:
            total = sum(len(n.actors) for n in self._nodes.values())
        for node, desc in alive.items():
            if node in nodes or self._killing(node):
                continue                 # known, or its dropped actors still hold its resources
            slots = self._slots(desc.get("Resources", {}), total)
            if slots > 0:
                remote = slot_actor_class()
                strategy = NodeAffinitySchedulingStrategy(node, soft=False)
                actors = [remote.options(**slot_options(self.cpus, self.gpus, strategy))
                          .remote(self._key) for _ in range(slots)]
                with self._lock:
                    self._nodes[node] = _Node(node, actors)
                total += slots
        changed |= self._settle()
        if changed:
            self._write()

    def _slots(self, resources: Dict[str, float], taken: int) -> int:
        slots = int(resources.get("CPU", 0) // self.cpus) if self.cpus else 1
        if self.gpus:
            slots = min(slots, int(resources.get("GPU", 0) // self.gpus))
        return int(max(0, min(slots, self.max_workers - taken)))

    def _settle(self) -> bool:
        """Set up the nodes whose actors answered; drop those that never did. True if any
        node became ready."""
        with self._lock:
            starting = [n for n in self._nodes.values() if not n.name]
        changed = False
        for entry in starting:
            ready, _ = ray.wait(entry.infos_ref, num_returns=len(entry.infos_ref), timeout=0)
            if len(ready) < len(entry.infos_ref):
                if time.monotonic() - entry.since > self.settings.timeout_s:
                    self._drop(entry.node)
                continue
            timeout = self.settings.timeout_s
            try:
                infos = ray.get(entry.infos_ref, timeout=timeout)
                gpus = ",".join(g for i in infos for g in i["gpus"])
                env = dict(self.env, **({"CUDA_VISIBLE_DEVICES": gpus} if self.gpus else {}))
                ray.get([a.setup.remote(env) for a in entry.actors], timeout=timeout)
                with self._lock:
                    payload = self._payload
                if payload is not None:
                    ray.get([a.set_job.remote(payload) for a in entry.actors], timeout=timeout)
            except Exception:   # noqa: BLE001 - the node went away while starting (or hangs)
                self._drop(entry.node)
                continue
            entry.infos = infos
            entry.name = host_names("ray", [(entry.node, infos[0]["address"], entry.node[:6])])[
                entry.node]
            changed = True
        return changed

    def _drop(self, node: str) -> None:
        """Forget the node and end its actors on a thread (bounded: ``_close_actors``), so
        that their resources come back before the node gets new ones."""
        from .executor import _close_actors
        with self._lock:
            entry = self._nodes.pop(node, None)
            if entry is None:
                return
            self._dropped.extend(entry.actors)
            killer = threading.Thread(target=_close_actors, args=(entry.actors,), daemon=True,
                                      name="hvlite-ray-drop")
            self._killers[node] = killer
        killer.start()

    def _killing(self, node: str) -> bool:
        with self._lock:
            killer = self._killers.get(node)
            if killer is not None and not killer.is_alive():
                del self._killers[node]
                killer = None
        return killer is not None

    def _write(self) -> None:
        with self._lock:
            hosts = {n.name: [i["agent"] for i in n.infos] for n in self._nodes.values() if n.name}
        if self._table is not None:
            self._table.write(hosts)

    # --- the job ------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], args: Optional[Sequence] = None,
            kwargs: Optional[Dict] = None) -> List[Any]:
        """Run ``fn`` elastically (see the module contract); the last world's results."""
        from .executor import pickle_call
        if self._table is None:
            self.start()
        payload = pickle_call("run", fn, args, kwargs)
        with self._lock:
            self._payload = payload
            ready = [n for n in self._nodes.values() if n.name]
        try:
            ray.get([a.set_job.remote(payload) for n in ready for a in n.actors],
                    timeout=self.settings.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise JobError("hvlite.ray: the slot actors did not take the job within %g s "
                           "(timeout_s)" % self.settings.timeout_s) from None
        np = int(min(self._ready_slots(), self.max_workers))
        self._job = Hvlrun(self._table, self._key, np, ray.util.get_node_ip_address(),
                           elastic=self.elastic, start_timeout=self.settings.timeout_s,
                           heartbeat_timeout=self.settings.heartbeat_timeout_s,
                           nics=self.settings.nics, verbose=self.settings.verbose)
        code = self._job.wait()
        results = self._results()
        with self._lock:
            self._payload = None
        return self._outcome(code, results)

    def _results(self) -> List[Tuple[int, int, str, bytes]]:
        with self._lock:
            actors = [a for n in self._nodes.values() for a in n.actors]
        refs = [a.results.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=END_GRACE_SECONDS)
        found = []
        for ref in ready:
            try:
                found.extend(ray.get(ref))
            except Exception:   # noqa: BLE001 - an actor lost since
                pass
        return found

    def _outcome(self, code: int, results: List[Tuple[int, int, str, bytes]]) -> List[Any]:
        import pickle
        last = max((w for w, _, _, _ in results), default=0)
        final = {r: (status, data) for w, r, status, data in results if w == last}
        # the last world's failures, a rank's own before those its failure caused
        failed = sorted((-w, status == "consequence", r, data)
                        for w, r, status, data in results if status != "ok")
        if code == 0 and final and all(s == "ok" for s, _ in final.values()) and \
                sorted(final) == list(range(len(final))):
            return [pickle.loads(final[r][1]) for r in range(len(final))]
        said = self._job.describe_end(code)
        if failed:
            world, _, rank, text = failed[0]
            world = -world
            message = text.decode("utf-8", "replace")
            what = ("returned a value that cannot be pickled: " if any(
                s == "unpicklable" and d == text for _, _, s, d in results) else "raised:\n")
            raise JobError("hvlite.ray: rank %d (world %d) %s%s\n(%s)"
                           % (rank, world, what, message.rstrip(), said), rank=rank,
                           traceback=message, hvlrun=self._job.said())
        raise JobError("hvlite.ray: the elastic job failed: %s" % said, hvlrun=self._job.said())

    def shutdown(self) -> None:
        """End hvlrun, the watcher and every actor; remove the host table."""
        from .executor import _close_actors
        if self._job is not None and self._job.running():
            self._job.end()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            actors = [a for n in self._nodes.values() for a in n.actors] + self._dropped
            killers = list(self._killers.values())
            self._nodes, self._dropped, self._killers = {}, [], {}
        _close_actors(actors)
        for killer in killers:
            killer.join(END_GRACE_SECONDS)
        if self._table is not None:
            self._table.remove()
            self._table = None
        self._thread, self._job = None, None
        self._stop.clear()


class ElasticSettings:
    """Horovod's ``ElasticRayExecutor.create_settings`` result."""

    def __init__(self, min_num_proc: int = 1, max_num_proc: Optional[int] = None,
                 reset_limit: Optional[int] = None, elastic_timeout: float = 600,
                 timeout_s: float = 30, nics: Optional[Sequence[str]] = None,
                 cooldown_range: Optional[Sequence] = None,
                 heartbeat_timeout_s: Optional[float] = None, verbose: int = 1) -> None:
        self.min_num_proc, self.max_num_proc = min_num_proc, max_num_proc
        self.reset_limit, self.elastic_timeout = reset_limit, elastic_timeout
        self.timeout_s, self.nics, self.cooldown_range = timeout_s, nics, cooldown_range
        self.heartbeat_timeout_s, self.verbose = heartbeat_timeout_s, verbose


class ElasticRayExecutor:
    """Horovod's ``ElasticRayExecutor``: ``start()``, then ``run(worker_fn)``."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None,
                        reset_limit: Optional[int] = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[Sequence[str]] = None, min_np: Optional[int] = None,
                        max_np: Optional[int] = None, **kwargs) -> ElasticSettings:
        """Horovod's arguments (``min_np``/``max_np`` are its deprecated spellings); more:
        ``cooldown_range``, ``heartbeat_timeout_s``, ``verbose``."""
        return ElasticSettings(min_np if min_np is not None else min_num_proc,
                               max_np if max_np is not None else max_num_proc, reset_limit,
                               elastic_timeout, timeout_s, nics, **kwargs)

    def __init__(self, settings: ElasticSettings, use_gpu: bool = False,
                 cpus_per_slot: float = 1, gpus_per_slot: Optional[float] = None,
                 env_vars: Optional[Dict[str, str]] = None,
                 override_discovery: bool = True) -> None:
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False")
        refuse_own_discovery(override_discovery)
        self._job = ElasticJob(settings, settings.min_num_proc, settings.max_num_proc,
                               cpus_per_slot, (gpus_per_slot or 1) if use_gpu else 0,
                               settings.reset_limit, settings.cooldown_range,
                               settings.elastic_timeout, env_vars)

    def start(self) -> None:
        self._job.start()

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable]] = None
            ) -> List[Any]:
        """``worker_fn()`` on every rank of every world; the last world's results by rank."""
        try:
            return self._job.run(worker_fn)
        finally:
            self._job.shutdown()
