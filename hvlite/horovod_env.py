"""Every ``HOROVOD_*`` variable Horovod 0.28 reads, and what hvlite does with each: one table.

A Horovod job's environment often carries these (a Dockerfile's build settings, a site's
tuning). None is ignored without a word: either hvlite honours it, or rank 0 names it once at
``init()`` in one line, "HOROVOD_X is not used by hvlite: <why, what instead>" (a name
Horovod never reads, a typo, gets a line too). The migration page's table is generated from
this one (``tools/migrating_tables.py``).

Contract:
  * :data:`VARIABLES`: name -> :class:`Variable` (``status``, ``text``, ``honoured_values``):
      - ``HONOURED``: hvlite reads it; ``text`` says as what. Where ``alias`` is set it is the
        engine's ``HVLITE_*`` setting of the same meaning (``csrc/core/param.c`` reads
        ``HOROVOD_<suffix>`` as its alias; ``tests/unit/test_horovod_env.py`` checks that each
        is in that table).
      - ``UNUSED``: hvlite does not read it; ``text`` says why and what to use instead. If
        ``honoured_values`` is set, those values ask for what hvlite does anyway (e.g.
        ``HOROVOD_CONTROLLER=mpi``) and are not named.
      - ``BUILD``: how Horovod's ``pip install`` builds; hvlite's build reads none of them.
        Those set are named together in one line.
  * :func:`notes(environ)` returns the lines to print, in a fixed order: one per ``UNUSED``
    variable set (to a value not in ``honoured_values``), one for the ``BUILD`` ones set, one
    per ``HOROVOD_*`` name Horovod never reads. Pure: reads only ``environ``.
  * :func:`say_once(environ, write)`: called by ``init()`` on rank 0; writes the notes the
    first time it is called in a process, unless the log level is ``error`` (or higher).
Stdlib only; imports nothing of the engine.
"""
import os
import sys
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

HONOURED, UNUSED, BUILD = "honoured", "no effect", "build"

__all__ = ["HONOURED", "UNUSED", "BUILD", "Variable", "VARIABLES", "notes", "say_once"]


class Variable(NamedTuple):
    status: str
    text: str
    alias: Optional[str] = None                   # the engine's HVLITE_* setting it stands for
    honoured_values: Tuple[str, ...] = ()         # UNUSED: values that ask for what hvlite does


def _alias(setting: str, text: str = "") -> Variable:
    return Variable(HONOURED, text or "as %s" % setting, alias=setting)


_NO_GLOO = "hvlite has no Gloo: it always runs on MPI, which hvlrun (or mpirun/srun) starts"
_FROM_MPI = ("hvlite takes ranks and sizes from MPI (the process manager that started the job: "
             "hvlrun, mpirun, srun), not from variables")
_BUILD_WHY = ("hvlite compiles no framework extension (one engine serves torch and TensorFlow as "
              "installed), builds against the MPI it finds (HVLITE_MPICC, mpicc, else the MPICH "
              "wheel) and loads CUDA and NCCL at run time")
_BUILD_TEXT = "read by Horovod's pip install, to choose what it compiles; " + _BUILD_WHY
_SPARK = "set by Horovod's Spark task service for the ranks it starts; hvlite does not read it: "

VARIABLES: Dict[str, Variable] = {
    # --- the engine's settings (Horovod's common/common.h, env_parser.cc, logging.cc) ---------
    "HOROVOD_FUSION_THRESHOLD": _alias("HVLITE_FUSION_THRESHOLD"),
    "HOROVOD_CYCLE_TIME": _alias("HVLITE_CYCLE_TIME"),
    "HOROVOD_CACHE_CAPACITY": _alias("HVLITE_CACHE_CAPACITY"),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": _alias("HVLITE_HIERARCHICAL_ALLREDUCE"),
    "HOROVOD_STALL_CHECK_DISABLE": _alias("HVLITE_STALL_CHECK_DISABLE"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": _alias("HVLITE_STALL_CHECK_TIME_SECONDS"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": _alias("HVLITE_STALL_SHUTDOWN_TIME_SECONDS"),
    "HOROVOD_THREAD_AFFINITY": _alias("HVLITE_THREAD_AFFINITY"),
    "HOROVOD_MPI_THREADS_DISABLE": _alias("HVLITE_MPI_THREADS_DISABLE"),
    "HOROVOD_AUTOTUNE": _alias("HVLITE_AUTOTUNE"),
    "HOROVOD_AUTOTUNE_LOG": _alias("HVLITE_AUTOTUNE_LOG"),
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": _alias("HVLITE_AUTOTUNE_WARMUP_SAMPLES"),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": _alias("HVLITE_AUTOTUNE_STEPS_PER_SAMPLE"),
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": _alias("HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"),
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": _alias("HVLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"),
    "HOROVOD_TIMELINE": _alias("HVLITE_TIMELINE", "as HVLITE_TIMELINE; DYNAMIC, as in Horovod, "
                               "starts none at init (the program calls start_timeline() later)"),
    "HOROVOD_TIMELINE_MARK_CYCLES": _alias("HVLITE_TIMELINE_MARK_CYCLES"),
    "HOROVOD_LOG_LEVEL": _alias("HVLITE_LOG_LEVEL"),
    "HOROVOD_LOG_HIDE_TIME": _alias("HVLITE_LOG_HIDE_TIME", "as HVLITE_LOG_HIDE_TIME; unset, log "
                                    "lines start with the time, as Horovod's"),
    "HOROVOD_DYNAMIC_PROCESS_SETS": _alias("HVLITE_DYNAMIC_PROCESS_SETS", "accepted: hvlite always "
                                           "lets a job add and remove process sets"),
    "HOROVOD_CONTROLLER": Variable(UNUSED, _NO_GLOO, honoured_values=("mpi",)),
    "HOROVOD_CPU_OPERATIONS": Variable(UNUSED, "hvlite has no Gloo or oneCCL data plane: host "
                                       "memory goes through shared memory on a host and MPI "
                                       "between hosts", honoured_values=("mpi",)),
    "HOROVOD_HIERARCHICAL_ALLGATHER": Variable(UNUSED, "hvlite has no hierarchical allgather (on "
                                               "one host allgather already runs in shared memory)"),
    "HOROVOD_TORUS_ALLREDUCE": Variable(UNUSED, "hvlite has no torus allreduce; "
                                        "HVLITE_HIERARCHICAL_ALLREDUCE is its two-level one"),
    "HOROVOD_NUM_NCCL_STREAMS": Variable(UNUSED, "hvlite's NCCL plane runs one stream per GPU "
                                         "(HVLITE_NCCL_OVERLAP lets batches run while the next "
                                         "are negotiated)"),
    "HOROVOD_BATCH_D2D_MEMCOPIES": Variable(UNUSED, "hvlite copies a fused batch's tensors into "
                                            "the device fusion buffer on one stream, with no "
                                            "batching kernel to switch"),
    "HOROVOD_ENABLE_ASYNC_COMPLETION": Variable(UNUSED, "hvlite's CUDA completions are always "
                                                "asynchronous: the framework's stream waits on "
                                                "an event"),
    "HOROVOD_DISABLE_GROUP_FUSION": Variable(UNUSED, "hvlite fuses a group's tensors with "
                                             "whatever else matches them (groups are submitted "
                                             "together, not kept apart)"),
    "HOROVOD_DISABLE_NVTX_RANGES": Variable(UNUSED, "hvlite marks no NVTX ranges (its timeline, "
                                            "HVLITE_TIMELINE, shows the GPU phases)"),
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": Variable(UNUSED, "hvlite's Adasum exchanges each tensor "
                                              "whole at every level"),
    "HOROVOD_ENABLE_XLA_OPS": Variable(UNUSED, "hvlite's TensorFlow ops are not XLA ops; inside "
                                       "jit_compile=True functions they run outside XLA"),
    "HOROVOD_CCL_CACHE": Variable(UNUSED, "hvlite has no oneCCL"),
    "HOROVOD_GLOO_IFACE": Variable(UNUSED, _NO_GLOO + "; choose interfaces with hvlrun "
                                   "--network-interface"),
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": Variable(UNUSED, _NO_GLOO),
    "HOROVOD_GLOO_RENDEZVOUS_PORT": Variable(UNUSED, _NO_GLOO),
    "HOROVOD_GLOO_TIMEOUT_SECONDS": Variable(UNUSED, _NO_GLOO + "; the bound on waits for other "
                                             "ranks is HVLITE_PEER_TIMEOUT_SECONDS"),
    "HOROVOD_RANK": Variable(UNUSED, _FROM_MPI),
    "HOROVOD_SIZE": Variable(UNUSED, _FROM_MPI),
    "HOROVOD_LOCAL_RANK": Variable(UNUSED, _FROM_MPI),
    "HOROVOD_LOCAL_SIZE": Variable(UNUSED, _FROM_MPI),
    "HOROVOD_CROSS_RANK": Variable(UNUSED, _FROM_MPI),
    "HOROVOD_CROSS_SIZE": Variable(UNUSED, _FROM_MPI),
    "HOROVOD_HOSTNAME": Variable(UNUSED, "hvlite learns each rank's host from the rank itself "
                                 "(hvlrun's -H names the hosts to start on)"),
    # --- the launcher's (Horovod's runner) ------------------------------------------------------
    "HOROVOD_START_TIMEOUT": Variable(HONOURED, "by hvlrun, as --start-timeout's default "
                                      "(HVLRUN_START_TIMEOUT first)"),
    "HOROVOD_ELASTIC_TIMEOUT": Variable(HONOURED, "by hvlrun and hvlite.spark.run_elastic, as "
                                                "--elastic-timeout's (elastic_timeout's) default"),
    "HOROVOD_ELASTIC": Variable(UNUSED, "horovodrun sets it in elastic workers; an hvlite job is "
                                "elastic when hvlrun gets --min-np/--max-np/"
                                "--host-discovery-script"),
    "HOROVOD_SECRET_KEY": Variable(UNUSED, "horovodrun's key for its services; hvlrun makes its "
                                   "own per-job secret"),
    "HOROVOD_SPARK_PYTHONPATH": Variable(UNUSED, _SPARK + "each rank of hvlite.spark.run imports "
                                         "from its own sys.path, then its Spark task's (what "
                                         "Spark shipped there included)"),
    "HOROVOD_SPARK_START_TIMEOUT": Variable(HONOURED, "by hvlite.spark.run and run_elastic, as "
                                                      "start_timeout's default (else 600 s)"),
    "HOROVOD_SPARK_USE_LOCAL_RANK_GPU_INDEX": Variable(
        UNUSED, "read by Horovod's Spark estimators, to pick the GPU by local rank instead of "
        "Spark's GPU addresses; hvlite has no Spark estimators, and each rank of hvlite.spark.run "
        "sees the GPUs Spark gave its executor's tasks in local-rank order "
        "(CUDA_VISIBLE_DEVICES), so torch.cuda.set_device(hvd.local_rank()) picks its own"),
    "HOROVOD_SPARK_WORK_DIR": Variable(UNUSED, _SPARK + "each rank of hvlite.spark.run runs in "
                                       "its Spark task's working directory"),
    # --- NCCL's location: Horovod's build settings, which hvlite reads at run time --------------
    "HOROVOD_NCCL_LIB": Variable(HONOURED, "the folder holding libnccl.so.2 (Horovod's meaning) or "
                                 "the library itself: the GPU plane loads it (HVLITE_NCCL_LIB "
                                 "first)"),
    "HOROVOD_NCCL_HOME": Variable(HONOURED, "NCCL's prefix: the GPU plane loads its "
                                  "lib/libnccl.so.2 (HVLITE_NCCL_LIB and HOROVOD_NCCL_LIB first)"),
}
for _name in ("WITH_PYTORCH", "WITHOUT_PYTORCH", "WITH_TENSORFLOW", "WITHOUT_TENSORFLOW",
              "WITH_MXNET", "WITHOUT_MXNET", "WITH_MPI", "WITHOUT_MPI", "WITH_GLOO",
              "WITHOUT_GLOO", "WITH_NVTX", "WITHOUT_NVTX", "GPU", "GPU_OPERATIONS",
              "GPU_ALLREDUCE", "GPU_ALLGATHER", "GPU_BROADCAST", "GPU_ALLTOALL",
              "GPU_REDUCESCATTER", "ALLOW_MIXED_GPU_IMPL", "CUDA_HOME", "ROCM_HOME",
              "NCCL_INCLUDE", "NCCL_LINK", "NVTX_INCLUDE", "BUILD_ARCH_FLAGS",
              "BUILD_CUDA_CC_LIST", "CMAKE", "DEBUG", "LOCAL_VERSION", "SKIP_COMPILE"):
    VARIABLES["HOROVOD_" + _name] = Variable(BUILD, _BUILD_TEXT)
del _name


def notes(environ: Mapping[str, str]) -> List[str]:
    """The lines naming what hvlite does not use in ``environ`` (see the module contract)."""
    lines, build, unknown = [], [], []
    for name in sorted(n for n in environ if n.startswith("HOROVOD_")):
        variable = VARIABLES.get(name)
        if variable is None:
            unknown.append(name)
        elif variable.status == BUILD:
            build.append(name)
        elif variable.status == UNUSED and environ[name].strip().lower() not in variable.honoured_values:
            shown = "%s=%s" % (name, environ[name]) if variable.honoured_values else name
            lines.append("%s is not used by hvlite: %s" % (shown, variable.text))
    if build:
        lines.append("%s %s not used by hvlite: Horovod's pip install reads %s to choose what it "
                     "compiles; %s" % (", ".join(build), "is" if len(build) == 1 else "are",
                                       "it" if len(build) == 1 else "them", _BUILD_WHY))
    for name in unknown:
        lines.append("%s is not used by hvlite: Horovod 0.28 reads no such variable either "
                     "(a typo? hvlite's settings are HVLITE_*, see its settings reference)" % name)
    return lines


_said = False
_QUIET = ("error", "fatal")


def say_once(environ: Mapping[str, str] = os.environ,
             write: Callable[[str], None] = lambda line: sys.stderr.write(line)) -> None:
    """Write the notes, each as ``hvlite: <note>``, the first time this is called (rank 0's
    ``init()``), unless HVLITE_LOG_LEVEL (or HOROVOD_LOG_LEVEL) is error or fatal."""
    global _said
    if _said:
        return
    _said = True
    level = environ.get("HVLITE_LOG_LEVEL", environ.get("HOROVOD_LOG_LEVEL", "warning"))
    if level.strip().lower() in _QUIET:
        return
    for line in notes(environ):
        write("hvlite: %s\n" % line)
