"""``hvlite.ray.RayExecutor``: Horovod's ``horovod.ray.RayExecutor`` on hvlite.

Contract (what differs from Horovod is in ``docs/guides/ray.md``):
  * ``RayExecutor(settings, num_workers=... | num_hosts=..., num_workers_per_host=...,
    cpus_per_worker=1, use_gpu=False, gpus_per_worker=None, use_current_placement_group=True)``
    places one slot actor per worker with a Ray placement group (``PACK`` bundles of one
    worker each, or with ``num_hosts`` one ``STRICT_SPREAD`` bundle per host holding its
    workers; inside a placement group, that one). ``min_workers``/``max_workers`` make it an
    elastic executor (``elastic.py``): then only ``start`` and ``run`` are offered
    (``execute``/``execute_single``/``run_remote`` raise NotImplementedError), and
    ``executable_cls``/``executable_args``/``executable_kwargs`` and
    ``override_discovery=False`` raise ValueError.
  * ``start(executable_cls=None, executable_args=None, executable_kwargs=None,
    extra_env_vars=None)`` waits for the placement group (``placement_group_timeout_s``), starts
    hvlrun over the actors' nodes (each node a host, its workers its slots, ranks in node order)
    and waits for every rank's process (``timeout_s``), then builds ``executable_cls(*args,
    **kwargs)`` in each. Every later call runs in those same processes, in the same hvlite
    world: ``hvd.init()`` in one call is still in effect in the next.
  * ``execute(fn)`` returns ``[fn(obj) for each rank]`` in rank order, ``run(fn, args, kwargs)``
    ``[fn(*args, **kwargs) ...]``, ``run_remote`` the ``ObjectRef`` of each, ``execute_single``
    rank 0's ``fn(obj)``. ``shutdown()`` ends the ranks, hvlrun, the actors and the placement
    group; nothing stays on any node.
  * GPUs (``use_gpu``): Ray assigns each actor its GPUs; each rank sees every GPU of the
    workers on its node, in local-rank order (``CUDA_VISIBLE_DEVICES``), so
    ``torch.cuda.set_device(hvd.local_rank())`` picks its own, as with Horovod.
  * Failures raise :class:`~hvlite.cluster.JobError`: a rank's function that raised (its rank,
    host and traceback; hvlrun ends the world on every rank at once, so nobody waits out a
    timeout), a node or actor lost (hvlrun's words naming the host), too few resources for the
    placement group in time (what the cluster has), ranks that did not start in time. After a
    failure the world is gone: later calls raise until ``shutdown()`` and ``start()`` again.
    Except: a value a rank's function returned that cannot be pickled raises a JobError naming
    the rank and the value's type for that call only; the world goes on.
"""
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.util.placement_group import (get_current_placement_group, placement_group,
                                      remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..cluster.job import END_GRACE_SECONDS, HostTable, Hvlrun, JobError, host_names
from ..protocol.wire import new_secret
from .slot import RankFailed, ResultUnpicklable, slot_actor_class, slot_options, unwrap

__all__ = ["Settings", "RayExecutor", "pickle_call"]


@dataclass
class Settings:
    """What ``RayExecutor.create_settings`` returns (Horovod's ``MiniSettings`` fields, plus
    hvlrun's heartbeat timeout)."""
    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    nics: Optional[Sequence[str]] = None
    ssh_identity_file: Optional[str] = None
    verbose: int = 1
    heartbeat_timeout_s: Optional[float] = None
    elastic: bool = False


def pickle_call(mode: str, function: Callable, args: Sequence = (), kwargs: Optional[dict] = None
                ) -> bytes:
    """The bytes of one call for the rank processes (``cloudpickle``: lambdas, closures and
    the driver script's own functions and classes travel by value)."""
    import cloudpickle
    return cloudpickle.dumps((mode, function, tuple(args or ()), dict(kwargs or {})))


def _ray_error(error: BaseException) -> str:
    cause = unwrap(error)
    return "%s: %s" % (type(cause).__name__, str(cause).strip().splitlines()[0] if str(cause)
                       else "")


class _Placement:
    """The placement group and slot actors of one start (see the module contract)."""

    def __init__(self, key: str, settings: Settings, count: int, per_host: Optional[int],
                 cpus: float, gpus: float, use_current: bool) -> None:
        bundle = {"CPU": cpus * (per_host or 1)}
        if gpus:
            bundle["GPU"] = gpus * (per_host or 1)
        current = get_current_placement_group() if use_current else None
        self.own = current is None
        hosts = count // per_host if per_host else count
        self.group = current or placement_group([dict(bundle) for _ in range(hosts)],
                                                strategy="STRICT_SPREAD" if per_host else "PACK")
        ready, _ = ray.wait([self.group.ready()], timeout=settings.placement_group_timeout_s)
        if not ready:
            self.remove()
            raise JobError("hvlite.ray: the cluster cannot place %d worker%s of %s within %g s "
                           "(placement_group_timeout_s): it has %s, of which %s are free"
                           % (count, "" if count == 1 else "s", _resources(cpus, gpus),
                              settings.placement_group_timeout_s,
                              _short(ray.cluster_resources()), _short(ray.available_resources())))
        remote = slot_actor_class()
        self.actors = []
        for i in range(count):
            index = (i // per_host if per_host else i) if self.own else -1
            strategy = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=index,
                placement_group_capture_child_tasks=False)
            self.actors.append(remote.options(**slot_options(cpus, gpus, strategy)).remote(key))

    def remove(self) -> None:
        if self.own and self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:   # noqa: BLE001 - the cluster may be going away
                pass
            self.group = None


def _resources(cpus: float, gpus: float) -> str:
    return "{CPU: %g%s}" % (cpus, ", GPU: %g" % gpus if gpus else "")


def _short(resources: Dict[str, float]) -> str:
    return "{%s}" % ", ".join("%s: %g" % (k, v) for k, v in sorted(resources.items())
                              if k in ("CPU", "GPU"))


class RayExecutor:
    """Horovod's RayExecutor on hvlite (see the module contract)."""

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: float = 100,
                        nics: Optional[Sequence[str]] = None,
                        heartbeat_timeout_s: Optional[float] = None, verbose: int = 1) -> Settings:
        """Horovod's settings: ``timeout_s`` bounds the start of the ranks, and
        ``placement_group_timeout_s`` the wait for the cluster's resources; ``nics`` pins
        hvlite's traffic to interfaces; ``heartbeat_timeout_s`` is hvlrun's bound on a silent
        host. The ssh arguments are accepted and unused (no ssh: the actors run the commands)."""
        return Settings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                        nics=list(nics) if nics else None, ssh_identity_file=ssh_identity_file,
                        verbose=verbose, heartbeat_timeout_s=heartbeat_timeout_s)

    def __init__(self, settings: Settings, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, cooldown_range: Optional[Sequence] = None,
                 elastic_timeout: float = 600, override_discovery: bool = True) -> None:
        if max_workers and not (min_workers and min_workers > 0):
            raise ValueError("max_workers needs a positive min_workers (an elastic job)")
        if min_workers and num_workers:
            raise ValueError("give num_workers (a fixed job) or min_workers (an elastic job), "
                             "not both")
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set, but use_gpu is False")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker <= 0:
            raise ValueError("gpus_per_worker must be positive, got %r" % gpus_per_worker)
        self.settings = settings
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_gpu = use_gpu
        self._elastic = None
        if min_workers is not None:
            from .elastic import ElasticJob, refuse_own_discovery
            refuse_own_discovery(override_discovery)
            settings.elastic = True
            self._elastic = ElasticJob(settings, min_workers, max_workers, cpus_per_worker,
                                       self.gpus_per_worker, reset_limit, cooldown_range,
                                       elastic_timeout)
            return
        if num_workers is None and num_hosts is None and not get_current_placement_group():
            raise ValueError("give num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give num_workers or num_hosts, not both")
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers or (num_hosts or 0) * num_workers_per_host
        self.use_current_placement_group = use_current_placement_group
        self.workers: List[Any] = []
        self._placement: Optional[_Placement] = None
        self._table: Optional[HostTable] = None
        self._job: Optional[Hvlrun] = None
        self._ended: Optional[str] = None
        # each actor's next call number: every rank runs the calls in the order issued, also
        # when two threads call, or run_remote() is called again before ray.get
        self._seq: List[int] = []
        self._issuing = threading.Lock()

    # --- start ------------------------------------------------------------------------------
    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None,
              extra_env_vars: Optional[Dict[str, str]] = None) -> None:
        """Place the workers, start the world, build ``executable_cls`` in every rank."""
        if self._elastic is not None:
            if executable_cls is not None or executable_args or executable_kwargs:
                raise ValueError("hvlite.ray: an elastic executor (min_workers) builds no "
                                 "executable_cls: each world's ranks are fresh processes; "
                                 "build what you need inside the function given to run()")
            return self._elastic.start(extra_env_vars)
        if self._job is not None:
            raise RuntimeError("hvlite.ray: this executor is started; shutdown() first")
        try:
            self._start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, executable_cls, executable_args, executable_kwargs, extra_env_vars) -> None:
        settings, key = self.settings, new_secret()
        count = self.num_workers
        if not count:                       # inside a placement group: one worker per bundle
            count = len(get_current_placement_group().bundle_specs)
        per_host = self.num_workers_per_host if self.num_hosts else None
        self._placement = _Placement(key, settings, count, per_host, self.cpus_per_worker,
                                     self.gpus_per_worker, self.use_current_placement_group)
        actors = self._placement.actors
        infos = self._get([a.info.remote() for a in actors], settings.timeout_s, "the actors")
        order = _node_order(infos)
        actors, infos = [actors[i] for i in order], [infos[i] for i in order]
        names = host_names("ray", [(i["node"], i["address"], i["node"][:6]) for i in infos])
        hosts: Dict[str, List[str]] = {}
        for info in infos:
            hosts.setdefault(names[info["node"]], []).append(info["agent"])
        env = dict(extra_env_vars or {})
        self._get([a.setup.remote(dict(env, **_gpu_env(infos, i, self.use_gpu)))
                   for i, a in enumerate(actors)], settings.timeout_s, "the actors' setup")
        self._table = HostTable()
        self._table.write(hosts)
        self._job = Hvlrun(self._table, key, count, ray.util.get_node_ip_address(),
                           hosts={h: len(a) for h, a in hosts.items()},
                           start_timeout=settings.timeout_s,
                           heartbeat_timeout=settings.heartbeat_timeout_s, nics=settings.nics,
                           verbose=settings.verbose)
        hellos = self._gather([a.wait_worker.remote(settings.timeout_s) for a in actors])
        ranks = [h["rank"] for h in hellos]
        if ranks != list(range(count)):
            raise JobError("hvlite.ray: the ranks did not start in node order: %s" % ranks)
        self.workers = actors
        self._seq = [0] * len(actors)
        if executable_cls is not None:
            self._gather(self._issue(pickle_call("build", executable_cls, executable_args,
                                                 executable_kwargs), actors))

    def _get(self, refs: list, timeout: float, what: str) -> list:
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise JobError("hvlite.ray: %s did not answer within %g s (timeout_s)"
                           % (what, timeout)) from None

    # --- calls ------------------------------------------------------------------------------
    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None
                ) -> List[Any]:
        """``fn(obj)`` on every rank, where ``obj`` is the rank's ``executable_cls`` object;
        the results in rank order."""
        if self._elastic is not None:
            raise NotImplementedError("an elastic executor offers run() only")
        return self._gather(self._calls(pickle_call("execute", fn)))

    def run(self, fn: Callable[..., Any], args: Optional[List] = None,
            kwargs: Optional[Dict] = None, callbacks: Optional[List[Callable]] = None
            ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order."""
        if self._elastic is not None:
            return self._elastic.run(fn, args, kwargs)
        return self._gather(self._calls(pickle_call("run", fn, args, kwargs)))

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """As :meth:`run`, but return each rank's ``ObjectRef`` at once."""
        if self._elastic is not None:
            raise NotImplementedError("an elastic executor's workers come and go: no ObjectRefs")
        return self._calls(pickle_call("run", fn, args, kwargs))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(obj)`` on rank 0 only."""
        if self._elastic is not None:
            raise NotImplementedError("an elastic executor offers run() only")
        return self._gather(self._calls(pickle_call("execute", fn), first_only=True))[0]

    def _calls(self, payload: bytes, first_only: bool = False) -> list:
        if self._ended:
            raise JobError("hvlite.ray: the job ended earlier (%s); shutdown() and start() again"
                           % self._ended)
        if self._job is None:
            raise RuntimeError("hvlite.ray: start() the executor first")
        return self._issue(payload, self.workers[:1] if first_only else self.workers)

    def _issue(self, payload: bytes, actors: list) -> list:
        """One call on each of ``actors`` (the first ones of :attr:`workers`), numbered."""
        with self._issuing:
            refs = []
            for i, actor in enumerate(actors):
                refs.append(actor.call.remote(self._seq[i], payload))
                self._seq[i] += 1
            return refs

    def _gather(self, refs: list) -> list:
        """Every result in order; on the first failure, wait (bounded) for hvlrun to end the
        world and the other calls to end with it, then raise the cause (module contract)."""
        index = {ref: i for i, ref in enumerate(refs)}
        results: List[Any] = [None] * len(refs)
        pending, failed, other, unsent = list(refs), [], [], []
        trouble_since = None
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.1)
            for ref in ready:
                try:
                    results[index[ref]] = ray.get(ref)
                except Exception as e:   # noqa: BLE001 - sorted below
                    cause = unwrap(e)
                    if isinstance(cause, ResultUnpicklable):
                        unsent.append(cause)
                        continue
                    (failed if isinstance(cause, RankFailed) else other).append((index[ref], e))
            ended = self._job is not None and not self._job.running()
            if (failed or other or ended) and trouble_since is None:
                trouble_since = time.monotonic()
            if trouble_since is not None and (
                    (ended and not pending)
                    or time.monotonic() - trouble_since > END_GRACE_SECONDS):
                break
        if not (failed or other or pending):
            if unsent:                  # the world goes on: only this call's results are lost
                first = min(unsent, key=lambda c: c.args[0])
                raise JobError("hvlite.ray: %s (the world goes on: return a picklable value)"
                               % first, rank=first.args[0], host=first.args[1],
                               traceback=first.args[2])
            return results
        raise self._failure(failed, other, pending)

    def _failure(self, failed: list, other: list, pending: list) -> JobError:
        code = self._job.wait(END_GRACE_SECONDS) if self._job is not None else None
        said = self._job.describe_end(code) if self._job is not None else ""
        words = self._job.said() if self._job is not None else []
        if failed:
            # the rank whose own error it was (its peers' errors say it left), lowest first
            cause = unwrap(min(failed, key=lambda f: (unwrap(f[1]).args[3],
                                                      unwrap(f[1]).args[0]))[1])
            rank, host, text, _ = cause.args
            self._ended = "rank %d raised" % rank
            return JobError("hvlite.ray: %s\n(%s)" % (cause, said), rank=rank, host=host,
                            traceback=text, hvlrun=words)
        detail = "; ".join("rank %d: %s" % (i, _ray_error(e)) for i, e in sorted(other)[:3])
        if pending:
            detail += ("; " if detail else "") + "%d call%s got no answer" % (
                len(pending), "" if len(pending) == 1 else "s")
        self._ended = said or detail
        return JobError("hvlite.ray: the job ended: %s (%s)" % (said or "hvlrun is running",
                                                                detail), hvlrun=words)

    # --- end --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """End the ranks (exit 0), hvlrun, the actors and the placement group."""
        if self._elastic is not None:
            return self._elastic.shutdown()
        actors = self._placement.actors if self._placement is not None else []
        if self._job is not None:
            if self._job.running():
                for actor in actors:
                    actor.stop.remote()
                if self._job.wait(END_GRACE_SECONDS) is None:
                    self._job.end()
            self._job.wait(5.0)
        _close_actors(actors)
        if self._placement is not None:
            self._placement.remove()
        if self._table is not None:
            self._table.remove()
        self.workers, self._placement, self._table, self._job = [], None, None, None
        self._ended = None


def _close_actors(actors: list) -> None:
    """Close each actor's agent (its commands end), then kill the actors. Bounded."""
    refs = [a.close.remote() for a in actors]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=END_GRACE_SECONDS)
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:   # noqa: BLE001 - already gone
            pass


def _node_order(infos: List[dict]) -> List[int]:
    """Actor indices grouped by node, nodes in the order their first actor came."""
    nodes: Dict[str, List[int]] = {}
    for i, info in enumerate(infos):
        nodes.setdefault(info["node"], []).append(i)
    return [i for group in nodes.values() for i in group]


def _gpu_env(infos: List[dict], me: int, use_gpu: bool) -> Dict[str, str]:
    """Every GPU of the workers on my node, in local-rank order (Horovod's choice)."""
    if not use_gpu:
        return {}
    node = infos[me]["node"]
    ids = [g for info in infos if info["node"] == node for g in info["gpus"]]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}
