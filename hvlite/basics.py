"""Starting and stopping the engine, the job's topology, and what was built.

Contract: ``init()`` must be called by every rank before any collective (it is collective: it
creates MPI communicators); it reuses MPI if mpi4py or the application initialised it, and is
a no-op when already running. ``shutdown()`` stops the engine on every rank (collectives pending
anywhere fail with ``HvliteShutdownError``) and is registered to run at exit. Topology queries
raise ``ValueError`` before ``init()``, as Horovod's do.
"""
import atexit

from ._lib import ffi, lib
from .errors import _check

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "mpi_threads_supported", "mpi_built", "mpi_enabled",
           "nccl_built", "gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
           "ccl_built", "shm_built", "engine_counters"]

_atexit_registered = False


def init(comm=None, process_sets=None):
    """Start hvlite on this rank (collective: every rank calls it).

    Args:
        comm: must be None; hvlite always runs on MPI_COMM_WORLD so far.
        process_sets: must be None (process sets arrive with a later release).
    Raises:
        HvliteError: MPI could not be initialised or the engine could not start.
        ValueError: an unsupported argument.
    """
    global _atexit_registered
    if comm is not None:
        raise ValueError("hvlite.init(comm=...) is not supported: hvlite runs on MPI_COMM_WORLD")
    if process_sets not in (None, [], ()):
        raise ValueError("hvlite.init(process_sets=...) is not supported yet")
    _check(lib.hvl_init())
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True


def shutdown():
    """Stop the engine on every rank; collectives still pending anywhere then fail."""
    _check(lib.hvl_shutdown())


def is_initialized():
    """True between ``init()`` and ``shutdown()``."""
    return bool(lib.hvl_is_initialized())


def _topology(fn, what):
    value = fn()
    if value < 0:
        raise ValueError("hvlite has not been initialized; call hvlite.init() before %s()" % what)
    return value


def rank():
    """This process's rank in the job (0 .. size()-1)."""
    return _topology(lib.hvl_rank, "rank")


def size():
    """Number of processes in the job."""
    return _topology(lib.hvl_size, "size")


def local_rank():
    """Rank among the processes on this host."""
    return _topology(lib.hvl_local_rank, "local_rank")


def local_size():
    """Number of processes on this host."""
    return _topology(lib.hvl_local_size, "local_size")


def cross_rank():
    """Index of this host among the hosts (ranks with the same local rank)."""
    return _topology(lib.hvl_cross_rank, "cross_rank")


def cross_size():
    """Number of hosts (ranks with this local rank)."""
    return _topology(lib.hvl_cross_size, "cross_size")


def mpi_threads_supported():
    """True if MPI granted MPI_THREAD_MULTIPLE (mpi4py may then be used beside hvlite)."""
    return bool(_topology(lib.hvl_mpi_threads_supported, "mpi_threads_supported"))


def mpi_built():
    return bool(lib.hvl_mpi_built())


def mpi_enabled():
    return bool(lib.hvl_mpi_built())


def nccl_built():
    return bool(lib.hvl_nccl_built())


def shm_built():
    return bool(lib.hvl_shm_built())


def gloo_built():
    return False


def gloo_enabled():
    return False


def cuda_built():
    return bool(lib.hvl_nccl_built())


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def mpi_vendor():
    """The MPI library's version line (e.g. 'MPICH Version: 5.0.2')."""
    return ffi.string(lib.hvl_mpi_vendor()).decode()


def engine_counters():
    """The engine's counters since init, as a dict (cycles, collectives, tensors_fused, ...)."""
    c = ffi.new("hvl_counters *")
    _check(lib.hvl_get_counters(c))
    return {f: getattr(c, f) for f, _ in ffi.typeof("hvl_counters").fields}
