"""The one table of hvlrun's knob flags and the ``HVLITE_*`` variables they set.

Contract: :data:`KNOBS` rows are ``(option, variable, argparse type, help)``; a type of None makes
an on/off switch that sets the variable to "1" (its attribute is None unless given; False,
from horovodrun's ``--no-*`` form or ``--config-file``, sets "0"). ``dest(option)`` is the
argparse attribute of an option; ``knob_env(args)`` returns the variables for the knob flags
given in parsed ``args``.
The argparse types raise ``argparse.ArgumentTypeError`` on bad values. Imports no engine code.
"""
import argparse
from typing import Dict

__all__ = ["KNOBS", "dest", "knob_env"]


def _number(text: str) -> str:
    """Argparse type: a number >= 0, returned as a string (``"5"``, ``"0.5"``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("%r must be a finite number >= 0" % text)
    return str(int(value)) if value.is_integer() else repr(value)


def _count(text: str) -> str:
    """Argparse type: an integer >= 0, returned as a string."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError("%r is not an integer >= 0" % text)
    return str(int(text))


def _positive(text: str) -> str:
    """Argparse type: an integer >= 1, returned as a string."""
    value = _count(text)
    if value == "0":
        raise argparse.ArgumentTypeError("%r must be at least 1" % text)
    return value


def _cores(text: str) -> str:
    """Argparse type: core numbers separated by commas (``"3"``, ``"0,8,16,24"``)."""
    cores = text.split(",")
    for core in cores:
        _count(core.strip())
    return ",".join(core.strip() for core in cores)


def _mebibytes(text: str) -> str:
    """Argparse type: a size in MiB (fractions allowed), returned as whole bytes."""
    return str(int(float(_number(text)) * 1024 * 1024))


# The only flag -> variable table: (option, HVLITE_* variable, argparse type, help).
# A type of None makes an on/off switch that sets the variable to "1", e.g.
#   ("--autotune", "HVLITE_AUTOTUNE", None, "tune fusion and cycle time at run time"),
KNOBS = (
    ("--fusion-threshold-mb", "HVLITE_FUSION_THRESHOLD", _mebibytes,
     "tensor fusion buffer size in MiB (sets bytes)"),
    ("--cycle-time-ms", "HVLITE_CYCLE_TIME", _number, "background cycle time in ms"),
    ("--cache-capacity", "HVLITE_CACHE_CAPACITY", _count, "response cache entries (0: off)"),
    ("--timeline-filename", "HVLITE_TIMELINE", str,
     "rank 0 writes a Chrome trace (Perfetto, chrome://tracing) to this file"),
    ("--timeline-mark-cycles", "HVLITE_TIMELINE_MARK_CYCLES", None,
     "mark every engine cycle on the timeline"),
    ("--stall-check-seconds", "HVLITE_STALL_CHECK_TIME_SECONDS", _count,
     "warn about tensors some ranks did not submit after this many seconds"),
    ("--stall-shutdown-seconds", "HVLITE_STALL_SHUTDOWN_TIME_SECONDS", _count,
     "shut down after a stall of this many seconds (0: never)"),
    ("--no-stall-check", "HVLITE_STALL_CHECK_DISABLE", None,
     "no stall warning and no stall shutdown"),
    ("--log-level", "HVLITE_LOG_LEVEL", str, "engine log level, e.g. warning, info, debug"),
    ("--log-without-timestamp", "HVLITE_LOG_HIDE_TIME", None,
     "engine log lines without the date and time they otherwise start with, as Horovod's"),
    ("--thread-affinity", "HVLITE_THREAD_AFFINITY", _cores,
     "pin each rank's engine thread: one core per rank on a host, c0,c1,... (local rank i: c_i)"),
    ("--mpi-threads-disable", "HVLITE_MPI_THREADS_DISABLE", None,
     "initialise MPI with MPI_THREAD_SERIALIZED, not MPI_THREAD_MULTIPLE"),
    ("--autotune", "HVLITE_AUTOTUNE", None,
     "tune fusion threshold, cycle time and response-cache use on measured throughput"),
    ("--autotune-log-file", "HVLITE_AUTOTUNE_LOG", str, "rank 0 writes every autotune sample here (CSV)"),
    ("--autotune-warmup-samples", "HVLITE_AUTOTUNE_WARMUP_SAMPLES", _count,
     "autotune samples discarded at the start"),
    ("--autotune-steps-per-sample", "HVLITE_AUTOTUNE_STEPS_PER_SAMPLE", _positive,
     "engine cycles that did work per autotune sample"),
    ("--autotune-bayes-opt-max-samples", "HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", _positive,
     "autotune samples the search scores before it settles (at most 100)"),
    ("--autotune-gaussian-process-noise", "HVLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", _number,
     "noise variance of autotune's model, relative to the spread of its scores"),
    ("--hierarchical-allreduce", "HVLITE_HIERARCHICAL_ALLREDUCE", None,
     "multi-host allreduce: shared-memory reduce on each host, MPI among hosts, shm broadcast"),
    ("--shm-disable", "HVLITE_SHM_DISABLE", None,
     "never use the shared-memory data plane (one-host sets then use MPI)"),
    ("--shm-chunk-mb", "HVLITE_SHM_CHUNK", _mebibytes,
     "shared-memory pipeline step per rank in MiB (sets bytes)"),
)


def dest(option: str) -> str:
    """Return the argparse attribute name of ``option``."""
    return option.lstrip("-").replace("-", "_")


def knob_env(args: argparse.Namespace) -> Dict[str, str]:
    """Return the ``HVLITE_*`` variables for the knob flags that were given."""
    env = {}
    for option, variable, kind, _ in KNOBS:
        value = getattr(args, dest(option))
        if kind is None and value is not None:
            env[variable] = "1" if value else "0"
        elif kind is not None and value is not None:
            env[variable] = str(value)
    return env
