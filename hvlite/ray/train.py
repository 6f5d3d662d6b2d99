"""Ray Train on hvlite: :class:`HvliteTrainer` and :class:`HvliteConfig`, in place of Ray's
removed ``HorovodTrainer`` and ``HorovodConfig``. ``hvd.init()`` in ``train_loop_per_worker``
joins one hvlite world across Ray Train's workers; see ``docs/guides/ray.md``.

Contract:
  * Ray Train runs ``train_loop_per_worker`` in worker actors of its own, so those actors'
    processes must be the ranks. The backend (:class:`HvliteConfig`'s, run by Ray Train's
    controller when a worker group starts and before it shuts down) makes them so, on hvlrun:
    it starts a node agent in every worker (``train_worker.open_slot``), groups the workers by
    node in Ray Train's rank order (each node one hvlrun host, its workers its slots), and
    starts hvlrun over them with hydra's ``-pmi-port`` and ``python -m hvlite.cluster.standin``
    as every rank's command. Each stand-in hands its rank's MPI connection to its worker
    (``train_worker.join``: MPI starts there), so ``hvd.init()`` in the loop joins hvlrun's
    world with ``hvd.rank()`` equal to Ray Train's world rank and ``hvd.local_rank()`` to its
    local rank. Once all have joined, MPI's ``/dev/shm`` segments lose their names
    (``train_worker.settle``), so a worker that dies leaves none behind.
  * hvlrun supervises the world as any other: a loop that raises sends its traceback to its
    stand-in, which exits 1, and hvlrun ends the world on every rank (their pending
    collectives fail at once); a worker whose process dies closes its stand-in's connection.
  * Before the worker group shuts down (the run finished, failed, or Ray Train's
    ``FailureConfig`` retries it with a fresh worker group, hence a fresh world) the backend
    shuts hvlite down in every worker, ends hvlrun, closes the agents and removes the host
    table: nothing of a world outlives its worker group (no hvlrun, agent, stand-in, MPI proxy,
    host table or ``/dev/shm`` file of MPI's).
  * ``HvliteTrainer(train_loop_per_worker, *, train_loop_config=None, hvlite_config=None,
    scaling_config=None, run_config=None, datasets=None, dataset_config=None, ...)`` is a Ray
    Train ``DataParallelTrainer`` (Ray Train V2, Ray's default): ``fit()`` returns its
    ``Result`` or raises its ``TrainingFailedError``. ``horovod_config=`` is accepted for
    ``hvlite_config=``.
  * A world that cannot start (hvlrun failed, a stand-in or MPI's start-up did not come within
    ``timeout_s``, ranks not grouped by node) raises :class:`~hvlite.cluster.JobError` from the
    worker group's start, after cleaning up what it started; Ray Train reports it as a
    controller error.
"""
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from ..cluster.job import END_GRACE_SECONDS, HostTable, Hvlrun, JobError, host_names
from ..protocol.wire import new_secret
from . import train_worker
from .slot import unwrap

__all__ = ["HvliteConfig", "HvliteTrainer"]

_LEAVE_SECONDS = 10.0


def _say(message: str) -> None:
    """One line on the controller's stderr (Ray shows it on the driver's), as hvlrun's are."""
    sys.stderr.write("hvlite.ray: %s\n" % message)
    sys.stderr.flush()


@dataclass
class HvliteConfig(BackendConfig):
    """How :class:`HvliteTrainer` starts hvlite's world (Ray's ``HorovodConfig``'s place).

    Args:
        timeout_s: seconds for the world to start (hvlrun's ``--start-timeout``, and the wait
            for every rank's stand-in).
        nics: network interfaces for hvlite's traffic (hvlrun's ``--network-interface``);
            None: the interface of the controller's node address.
        heartbeat_timeout_s: hvlrun's ``--heartbeat-timeout`` (None: its default).
        verbose: 2 shows hvlrun's command.
        key, ssh_port, ssh_identity_file, ssh_str, placement_group_timeout_s: accepted as
            ``HorovodConfig`` has them, and unused: Ray Train places the workers, and hvlrun
            reaches them through their agents, with a key of its own per world.
    """
    timeout_s: float = 60
    nics: Optional[Sequence[str]] = None
    heartbeat_timeout_s: Optional[float] = None
    verbose: int = 1
    key: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    placement_group_timeout_s: Optional[float] = None

    @property
    def backend_cls(self):
        return _HvliteBackend

    @property
    def train_func_context(self):
        return train_worker.train_context

    def to_dict(self) -> Dict[str, Any]:
        """The settings that matter, for Ray's state export.

        Returns:
            ``timeout_s``, ``nics``, ``heartbeat_timeout_s`` and ``verbose``.
        """
        return {"timeout_s": self.timeout_s, "nics": list(self.nics or []),
                "heartbeat_timeout_s": self.heartbeat_timeout_s, "verbose": self.verbose}


class _World:
    """One worker group's hvlite world: its hvlrun, host table and agents."""

    def __init__(self, config: HvliteConfig) -> None:
        self.config = config
        self.key = new_secret()
        self.table: Optional[HostTable] = None
        self.job: Optional[Hvlrun] = None

    def start(self, group) -> None:
        """Start hvlrun over the group's workers and hand each its rank (see the module)."""
        config, count, started = self.config, len(group), time.monotonic()
        infos = self._wait(group.execute_async(train_worker.open_slot, self.key),
                           "the workers' agents")
        hosts = _hosts(infos)
        self.table = HostTable()
        self.table.write(hosts)
        self.job = Hvlrun(self.table, self.key, count, ray.util.get_node_ip_address(),
                          hosts={h: len(a) for h, a in hosts.items()},
                          start_timeout=config.timeout_s,
                          heartbeat_timeout=config.heartbeat_timeout_s, nics=config.nics,
                          verbose=config.verbose, mpi_args="-pmi-port",
                          rank_module="hvlite.cluster.standin")
        hellos = self._wait(group.execute_async(train_worker.join, config.timeout_s),
                            "every rank's stand-in")
        ranks = [h.get("rank") for h in hellos]
        if ranks != list(range(count)):
            raise JobError("hvlite.ray: the stand-ins' ranks %s are not Ray Train's %s"
                           % (ranks, list(range(count))), hvlrun=self.job.said())
        self._wait(group.execute_async(train_worker.settle), "the workers' MPI files")
        _say("a world of %d ranks on %d hosts formed in %.1f s"
             % (count, len(hosts), time.monotonic() - started))

    def _wait(self, refs: List[Any], what: str) -> List[Any]:
        """Every result, within ``timeout_s``; stop waiting as soon as hvlrun has ended."""
        deadline = time.monotonic() + self.config.timeout_s
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
            if self.job is not None and not self.job.running() and pending:
                code = self.job.wait(5.0)
                raise JobError("hvlite.ray: the world did not start: %s"
                               % self.job.describe_end(code), hvlrun=self.job.said())
            if pending and time.monotonic() > deadline:
                raise JobError("hvlite.ray: %s did not answer within %g s (timeout_s)"
                               % (what, self.config.timeout_s),
                               hvlrun=self.job.said() if self.job else ())
        try:
            return ray.get(refs)
        except ray.exceptions.RayError as e:
            raise JobError("hvlite.ray: %s: %s: %s" % (what, type(unwrap(e)).__name__,
                                                       unwrap(e))) from None

    def end(self, group) -> None:
        """Leave hvlite in every worker, end hvlrun, close the agents. Bounded; never raises."""
        refs = _quietly(lambda: group.execute_async(train_worker.leave, _LEAVE_SECONDS), [])
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=_LEAVE_SECONDS + 5)
        if self.job is not None:
            code = self.job.wait(END_GRACE_SECONDS)
            if code is None:
                code = self.job.end()
            if code:
                _say("the world of this worker group ended: %s" % self.job.describe_end(code))
        refs = _quietly(lambda: group.execute_async(train_worker.close), [])
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=END_GRACE_SECONDS)
        if self.table is not None:
            self.table.remove()
        self.job = self.table = None


def _quietly(call: Callable[[], Any], default: Any) -> Any:
    try:
        return call()
    except Exception:   # noqa: BLE001 - a worker group that is going away
        return default


def _hosts(infos: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """``{host name: [agent address per local rank]}`` in rank order.

    Raises:
        JobError: the workers are not in Ray Train's rank order, or a node's ranks are not
            consecutive (hvlrun numbers ranks host after host).
    """
    names = host_names("ray", [(i["node"], i["address"], i["node"][:6]) for i in infos])
    hosts: Dict[str, List[str]] = {}
    for index, info in enumerate(infos):
        name = names[info["node"]]
        if info["rank"] != index or (name in hosts and list(hosts)[-1] != name):
            raise JobError("hvlite.ray: Ray Train's ranks are not grouped by node (%s); hvlrun "
                           "numbers ranks host after host"
                           % ", ".join("rank %d on %s" % (i["rank"], i["address"])
                                       for i in infos))
        hosts.setdefault(name, []).append(info["agent"])
    return hosts


class _HvliteBackend(Backend):
    """Ray Train's hooks for hvlite (see the module). One per process (Ray's ``Singleton``),
    so the worlds are kept by worker group."""

    share_cuda_visible_devices: bool = True   # Horovod's choice: local rank N takes GPU N

    def __init__(self) -> None:
        self._worlds: Dict[int, _World] = {}

    def on_start(self, worker_group, backend_config: HvliteConfig) -> None:
        world = _World(backend_config)
        try:
            world.start(worker_group)
        except BaseException:
            world.end(worker_group)
            raise
        self._worlds[id(worker_group)] = world

    def on_shutdown(self, worker_group, backend_config: HvliteConfig) -> None:
        world = self._worlds.pop(id(worker_group), None)
        if world is not None:
            world.end(worker_group)


class HvliteTrainer(DataParallelTrainer):
    """A Ray Train trainer whose workers form one hvlite world (Ray's ``HorovodTrainer``'s
    place): ``hvd.init()`` in ``train_loop_per_worker`` joins it.

    Args:
        train_loop_per_worker: the training function, taking no argument or the
            ``train_loop_config`` dict.
        train_loop_config: passed to ``train_loop_per_worker``.
        hvlite_config: how the world starts (:class:`HvliteConfig`; defaults when None).
        horovod_config: ``HorovodTrainer``'s name for ``hvlite_config``.
        scaling_config: Ray Train's ``ScalingConfig`` (``num_workers``, ``use_gpu``,
            ``resources_per_worker``).
        run_config: Ray Train's ``RunConfig`` (``FailureConfig``, storage, name).
        datasets: Ray Datasets, sharded by ``ray.train.get_dataset_shard``.
        dataset_config: Ray Train's ``DataConfig``.
        validation_config, metadata, resume_from_checkpoint: as Ray's ``DataParallelTrainer``
            takes them.

    Raises:
        ValueError: both ``hvlite_config`` and ``horovod_config`` are given, or Ray Train
            rejects a setting (Ray Train V2 off, a V1 ``ScalingConfig``).
    """

    def __init__(self, train_loop_per_worker: Callable, *,
                 train_loop_config: Optional[Dict] = None,
                 hvlite_config: Optional[HvliteConfig] = None,
                 horovod_config: Optional[HvliteConfig] = None,
                 scaling_config=None, run_config=None, datasets: Optional[Dict] = None,
                 dataset_config=None, validation_config=None,
                 metadata: Optional[Dict[str, Any]] = None,
                 resume_from_checkpoint=None) -> None:
        if hvlite_config is not None and horovod_config is not None:
            raise ValueError("give hvlite_config or horovod_config, not both")
        config = hvlite_config or horovod_config or HvliteConfig()
        if not isinstance(config, HvliteConfig):
            raise ValueError("hvlite_config must be an hvlite.ray.HvliteConfig, got %s"
                             % type(config).__name__)
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=config, scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, dataset_config=dataset_config,
                         validation_config=validation_config, metadata=metadata,
                         resume_from_checkpoint=resume_from_checkpoint)
