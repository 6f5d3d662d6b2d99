"""``hvlite.spark.run`` and ``run_elastic``: Horovod's ``horovod.spark`` functions on hvlite.

Contract (what differs from Horovod is in ``docs/guides/spark.md``):
  * ``run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, ...)`` runs ``num_proc``
    Spark tasks (default ``spark.default.parallelism``) in barrier execution mode, one per
    rank (``tasks.py``). Once all registered (within ``start_timeout``: the argument, else
    ``HOROVOD_SPARK_START_TIMEOUT``, else 600 s), hvlrun runs the world over them (each
    executor one host, its tasks its slots); every rank calls ``fn(*args, **kwargs)`` in its
    own process below its task, and ``run`` returns the results in rank order.
  * ``run_elastic(fn, ..., num_proc, min_num_proc, max_num_proc, elastic_timeout, reset_limit)``
    runs ``max_num_proc`` plain tasks (Spark retries a lost one on its own), waits for
    ``num_proc`` of them (``start_timeout``) and starts with those; the hosts follow the live
    tasks, and hvlrun's elastic driver re-forms the job as they come and go; ``fn``
    uses ``hvd.elastic.run``. It returns the last world's results in rank order.
  * Failures raise :class:`~hvlite.cluster.JobError`: a rank's function that raised (rank,
    host, traceback: hvlrun ends every rank at once), a lost executor or node (hvlrun's words),
    too few tasks started within ``start_timeout`` (saying how many the cluster runs at once),
    the Spark job failing. The Spark job is cancelled on every failure; nothing is left on any
    executor. ``use_gloo=True`` is refused (hvlite runs on MPI); ``use_mpi`` is accepted.
  * ``env`` adds variables for every rank; ``stdout``/``stderr`` receive the ranks' output
    (the driver's own streams by default); ``nics`` pins the traffic to interfaces; ``verbose``
    2 shows hvlrun's command; ``extra_mpi_args`` go to ``mpiexec``.
"""
import os
import pickle
import threading
import time
from typing import Any, Callable, Dict, IO, List, Optional, Sequence

import pyspark

from ..cluster.frames import ChannelError, connect
from ..cluster.job import END_GRACE_SECONDS, HostTable, Hvlrun, JobError, host_names
from ..protocol.wire import new_secret
from .tasks import Register, task_main, wait_for

__all__ = ["run", "run_elastic"]

_job_ids = iter(range(1, 1 << 62))


def _context() -> "pyspark.SparkContext":
    context = pyspark.SparkContext._active_spark_context
    if context is None:
        raise RuntimeError("hvlite.spark: no active SparkContext (start a SparkSession first)")
    return context


def _driver_address(context) -> str:
    import socket
    host = context.getConf().get("spark.driver.host") or socket.gethostname()
    return socket.gethostbyname(host)


def _pickle_call(fn: Callable, args: Sequence, kwargs: Optional[dict]) -> bytes:
    import cloudpickle
    return cloudpickle.dumps(("run", fn, tuple(args or ()), dict(kwargs or {})))


class _SparkJob:
    """One run: the Spark job of its tasks, the register, the host table and hvlrun."""

    def __init__(self, fn, args, kwargs, tasks: int, barrier: bool, env, stdout, stderr,
                 verbose, nics, prefix_timestamp, mpi_args, executable) -> None:
        self.context = _context()
        self.key = new_secret()
        self.address = _driver_address(self.context)
        self.table = HostTable()
        self.lock = threading.Lock()
        self.hosts: Dict[str, List[str]] = {}
        self.env = dict(env or {})
        self.options = dict(env=self.env, stdout=stdout, stderr=stderr, verbose=verbose,
                            nics=nics, prefix_timestamp=prefix_timestamp, mpi_args=mpi_args,
                            executable=executable)
        self.register = Register(self.key, self.address, self._changed)
        self.job: Optional[Hvlrun] = None
        self.group = "hvlite.spark.run.%d" % next(_job_ids)
        self.spark_error: Optional[str] = None
        self.publishing = threading.Lock()
        payload = _pickle_call(fn, args, kwargs)
        key, register = self.key, self.register.address
        rdd = self.context.range(0, tasks, numSlices=tasks)
        if barrier:
            rdd = rdd.barrier()
        mapper = lambda index, _: task_main(index, key, register, payload)  # noqa: E731
        self.thread = threading.Thread(target=self._spark, args=(rdd, mapper), daemon=True)
        self.thread.start()

    def _spark(self, rdd, mapper) -> None:
        try:
            self.context.setJobGroup(self.group, "hvlite job", interruptOnCancel=True)
            rdd.mapPartitionsWithIndex(mapper).collect()
        except Exception as e:   # noqa: BLE001 - told to the caller
            self.spark_error = str(e).strip().splitlines()[0][:500] if str(e) else repr(e)

    # --- hosts ----------------------------------------------------------------------------------
    def _changed(self) -> None:
        """A task registered or went away: publish the hosts (on a thread: the register's
        thread must not wait for the setups it would itself receive)."""
        threading.Thread(target=self.publish, daemon=True).start()

    def publish(self) -> None:
        """Group the live tasks by executor into hosts, give each task its setup (every GPU of
        its host's tasks, in slot order), then write the host table."""
        with self.publishing:
            tasks = self.register.tasks()
            groups: Dict[tuple, list] = {}
            for task in tasks:
                groups.setdefault((task.address, task.executor), []).append(task)
            names = host_names("spark", [(k, k[0], "e" + k[1]) for k in groups])
            hosts = {}
            for key, members in groups.items():
                gpus = ",".join(g for t in members for g in t.gpus)
                env = dict(self.env, **({"CUDA_VISIBLE_DEVICES": gpus} if gpus else {}))
                ready = [t for t in members if self.register.setup(t, env)]
                if ready:
                    hosts[names[key]] = [t.agent for t in ready]
            with self.lock:
                self.hosts = hosts
            self.table.write(hosts)

    def slots(self) -> int:
        with self.lock:
            return sum(len(a) for a in self.hosts.values())

    # --- the job ----------------------------------------------------------------------------------
    def wait_tasks(self, count: int, timeout: float) -> None:
        """Wait until ``count`` tasks are set up (JobError after ``timeout`` seconds)."""
        why = wait_for(lambda: self.slots() >= count, timeout, lambda: self.spark_error)
        if why == "timeout":
            raise JobError("hvlite.spark: only %d of %d tasks started within %g s "
                           "(start_timeout); the cluster runs %d tasks at once "
                           "(spark.default.parallelism)"
                           % (self.slots(), count, timeout, self.context.defaultParallelism))
        if why:
            raise JobError("hvlite.spark: the Spark job failed before the ranks started: %s"
                           % why)

    def start(self, np: int, start_timeout: float, elastic: Optional[dict] = None) -> None:
        with self.lock:
            hosts = {h: len(a) for h, a in self.hosts.items()}
        self.job = Hvlrun(self.table, self.key, np, self.address,
                          hosts=None if elastic else hosts, elastic=elastic,
                          start_timeout=start_timeout, **self.options)

    def finish(self) -> List[Any]:
        """Wait for hvlrun; return the last world's results by rank, or raise."""
        code = self.job.wait()
        results = self._results()
        last = max((w for w, _, _, _ in results), default=0)
        final = {r: (s, d) for w, r, s, d in results if w == last}
        if code == 0 and final and sorted(final) == list(range(len(final))) and \
                all(s == "ok" for s, _ in final.values()):
            return [pickle.loads(final[r][1]) for r in range(len(final))]
        said = self.job.describe_end(code)
        failed = sorted((-w, s == "consequence", r, d) for w, r, s, d in results if s != "ok")
        unsent = {d.decode("utf-8", "replace") for _, _, s, d in results if s == "unpicklable"}
        if failed:
            _, _, rank, text = failed[0]
            text = text.decode("utf-8", "replace")
            what = ("returned a value that cannot be pickled: " if text in unsent
                    else "raised:\n")
            raise JobError("hvlite.spark: rank %d %s%s\n(%s)" % (rank, what, text.rstrip(), said),
                           rank=rank, traceback=text, hvlrun=self.job.said())
        raise JobError("hvlite.spark: the job ended: %s" % said, hvlrun=self.job.said())

    def _results(self) -> list:
        return collect_results([t.agent for t in self.register.tasks()], self.key)

    def close(self, failed: bool) -> None:
        """End hvlrun, the tasks and the Spark job (cancelled after a failure), the table."""
        if self.job is not None and self.job.running():
            self.job.end()
        if failed:
            self.context.cancelJobGroup(self.group)
        self.register.close()
        self.thread.join(END_GRACE_SECONDS)
        if self.thread.is_alive():
            self.context.cancelJobGroup(self.group)
            self.thread.join(END_GRACE_SECONDS)
        self.table.remove()


def collect_results(agents: Sequence[str], key: str,
                    timeout: float = END_GRACE_SECONDS) -> list:
    """Every agent's kept results (``Agent.results``), asked of all at once; an agent that
    does not answer within ``timeout`` seconds (connect, handshake and reply) adds nothing.
    Returns within about ``timeout``. Cannot fail."""
    found: List[list] = [[] for _ in agents]

    def ask(i: int, agent: str) -> None:
        try:
            channel = connect(agent, key, timeout=timeout)
        except ChannelError:
            return
        try:
            channel.sock.settimeout(timeout)
            channel.send("results")
            kind, data = channel.recv()
            if kind == "results":
                found[i] = pickle.loads(data)
        except (ChannelError, OSError, ValueError, EOFError, pickle.UnpicklingError):
            pass
        finally:
            channel.close()
    askers = [threading.Thread(target=ask, args=(i, a), daemon=True)
              for i, a in enumerate(agents)]
    for t in askers:
        t.start()
    deadline = time.monotonic() + timeout + 1.0
    for t in askers:
        t.join(max(0.0, deadline - time.monotonic()))
    return [r for i, t in enumerate(askers) if not t.is_alive() for r in found[i]]


def _start_timeout(value: Optional[float]) -> float:
    return float(value if value is not None else os.getenv("HOROVOD_SPARK_START_TIMEOUT", "600"))


def run(fn: Callable[..., Any], args: Sequence = (), kwargs: Optional[Dict] = None,
        num_proc: Optional[int] = None, start_timeout: Optional[float] = None,
        use_mpi: Optional[bool] = None, use_gloo: Optional[bool] = None,
        extra_mpi_args: Optional[str] = None, env: Optional[Dict[str, str]] = None,
        stdout: Optional[IO] = None, stderr: Optional[IO] = None, verbose: int = 1,
        nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
        executable: Optional[str] = None) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks, one Spark barrier task each.

    Call it from the driver of an active Spark session. Every rank runs ``fn`` in a process of
    its own below its task, in one hvlite world, so ``fn`` calls ``hvd.init()`` as under hvlrun.

    Args:
        fn: the function each rank runs; it and its arguments are pickled with cloudpickle.
        args, kwargs: its arguments, the same on every rank.
        num_proc: the number of ranks (default: ``spark.default.parallelism``).
        start_timeout: seconds for every task to start and register (default
            ``HOROVOD_SPARK_START_TIMEOUT``, else 600).
        use_mpi: accepted (hvlite always runs on MPI); use_gloo: refused.
        extra_mpi_args: added to ``mpiexec``'s command line.
        env: variables added to every rank's environment.
        stdout, stderr: where the ranks' output goes (the driver's own streams by default).
        verbose: 2 also prints hvlrun's command.
        nics: network interfaces the job's traffic is pinned to.
        prefix_output_with_timestamp: start each output line with the local time.
        executable: the Python the ranks run (default: the driver's).

    Returns:
        The values ``fn`` returned, in rank order.

    Raises:
        hvlite.cluster.JobError: a rank's ``fn`` raised (naming the rank and host, with its
            traceback), an executor or node was lost, fewer than ``num_proc`` tasks started
            within ``start_timeout``, or the Spark job failed. Nothing is left running.
        ValueError: ``use_gloo=True``.
    """
    if use_gloo:
        raise ValueError("hvlite.spark: hvlite runs on MPI only (no Gloo); leave use_gloo unset")
    num_proc = num_proc or _context().defaultParallelism
    timeout = _start_timeout(start_timeout)
    job = _SparkJob(fn, args, kwargs, num_proc, True, env, stdout, stderr, verbose, nics,
                    prefix_output_with_timestamp, extra_mpi_args, executable)
    failed = True
    try:
        job.wait_tasks(num_proc, timeout)
        job.start(num_proc, timeout)
        results = job.finish()
        failed = False
        return results
    finally:
        job.close(failed)


def run_elastic(fn: Callable[..., Any], args: Sequence = (), kwargs: Optional[Dict] = None,
                num_proc: Optional[int] = None, min_num_proc: Optional[int] = None,
                max_num_proc: Optional[int] = None, start_timeout: Optional[float] = None,
                elastic_timeout: Optional[float] = None, reset_limit: Optional[int] = None,
                env: Optional[Dict[str, str]] = None, stdout: Optional[IO] = None,
                stderr: Optional[IO] = None, verbose: int = 1,
                nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
                min_np: Optional[int] = None, max_np: Optional[int] = None,
                cooldown_range: Optional[Sequence[float]] = None) -> List[Any]:
    """Run ``fn`` as an elastic job on Spark tasks that may come and go.

    ``max_num_proc`` plain tasks are started (Spark retries a lost one); the job begins once
    ``num_proc`` have registered, and hvlrun's elastic driver re-forms the world as tasks are
    lost and come back. ``fn`` uses ``hvd.elastic.run`` and a state object, as under
    ``hvlrun --min-np``.

    Args:
        fn: the function each rank runs, as for :func:`run`; so are ``args``, ``kwargs``,
            ``start_timeout``, ``env``, ``stdout``, ``stderr``, ``verbose``, ``nics`` and
            ``prefix_output_with_timestamp``.
        num_proc: ranks to begin with (default: ``spark.default.parallelism``).
        min_num_proc, max_num_proc: the fewest ranks the job goes on with, and the most it
            grows to (default: ``num_proc``).
        elastic_timeout: seconds the job may stay below ``min_num_proc`` (default
            ``HOROVOD_ELASTIC_TIMEOUT``, else 600).
        reset_limit: the most re-forms allowed (default: no limit).
        min_np, max_np: Horovod's older spellings of ``min_num_proc``/``max_num_proc``.
        cooldown_range: ``(low, high)``: seconds a failing host stays excluded, doubling from
            ``low`` up to ``high`` at each exclusion (default: for the rest of the job).

    Returns:
        The values ``fn`` returned in the last world, in rank order.

    Raises:
        hvlite.cluster.JobError: as for :func:`run`, and when the job ends below its minimum.
        ValueError: unless ``1 <= min_num_proc <= num_proc <= max_num_proc``.
    """
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    num_proc = num_proc or _context().defaultParallelism
    min_num_proc = min_num_proc or num_proc
    max_num_proc = max_num_proc or num_proc
    if not 1 <= min_num_proc <= num_proc <= max_num_proc:
        raise ValueError("hvlite.spark: want 1 <= min_num_proc (%s) <= num_proc (%s) <= "
                         "max_num_proc (%s)" % (min_num_proc, num_proc, max_num_proc))
    timeout = _start_timeout(start_timeout)
    if elastic_timeout is None:
        elastic_timeout = float(os.getenv("HOROVOD_ELASTIC_TIMEOUT", "600"))
    job = _SparkJob(fn, args, kwargs, max_num_proc, False, env, stdout, stderr, verbose, nics,
                    prefix_output_with_timestamp, None, None)
    failed = True
    try:
        job.wait_tasks(num_proc, timeout)         # as Horovod: num_proc tasks to begin with
        job.start(num_proc, timeout, elastic=dict(
            min_np=min_num_proc, max_np=max_num_proc, elastic_timeout=elastic_timeout,
            reset_limit=reset_limit, cooldown_range=cooldown_range))
        results = job.finish()
        failed = False
        return results
    finally:
        job.close(failed)
