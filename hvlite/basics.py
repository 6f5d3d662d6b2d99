"""Starting and stopping hvlite, the job's topology, and what this build can do.

Call :func:`init` on every rank before anything else, and read the job's shape with
:func:`rank`, :func:`size`, :func:`local_rank` and the others. :func:`shutdown` runs by itself
at exit. ``hvlite``, ``hvlite.torch``, ``hvlite.tensorflow`` and ``hvlite.tensorflow.keras``
all hold these names, so ``hvd.init()`` and ``hvd.rank()`` work as in Horovod whichever one
is imported as ``hvd``. The ``*_built`` and ``*_enabled`` queries answer Horovod's questions
about the build for hvlite (which runs on MPI only, and loads NCCL at run time); they need no
``init()``.

Contract: ``init()`` must be called by every rank before any collective (it is collective: it
creates MPI communicators); it reuses MPI if mpi4py or the application initialised it, and is
a no-op when already running with the same settings (ValueError if a second call asks for
other ``HVLITE_*`` values, process sets or another ``comm``). ``init(comm=...)`` runs the job
on part of MPI_COMM_WORLD, as Horovod's: an mpi4py communicator (the engine runs on a duplicate
of it; every member calls init with it), or a list of ranks of MPI_COMM_WORLD (only those ranks
call init with it, all with the same list; hvlite's rank i is the list's i-th). Every topology
query, process set and data plane is then that world's. Bad input raises ``ValueError`` (or
its subclass ``HvliteInvalidArgument`` from the engine) on the rank that passed it, before any
exchange with other ranks: not a list or a communicator, a list naming a rank twice or a rank
MPI_COMM_WORLD does not have, a list without this rank (Horovod would fall back to
MPI_COMM_WORLD there, which waits for ranks that never join), MPI_COMM_NULL, an
intercommunicator, or mpi4py built on another MPI than hvlite. Rank 0's first ``init()`` names
each ``HOROVOD_*`` variable hvlite does not use, on stderr (``horovod_env.py``). In an srun step of several tasks where MPI sees one
process per task (``srun --mpi=none``), ``init()`` raises ``HvliteError`` with the fix.
``shutdown()`` stops the engine on every rank (collectives pending anywhere fail with
``HvliteShutdownError``) and is registered to run at exit. Topology queries raise ``ValueError``
before ``init()``, as Horovod's do.
"""
import atexit
import os

from . import _nccl_find, horovod_env
from ._lib import ffi, lib
from .errors import HvliteError, _check

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "is_homogeneous",
           "mpi_threads_supported", "mpi_built", "mpi_enabled",
           "nccl_built", "gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
           "ccl_built", "shm_built", "engine_counters", "engine_tuning"]

_atexit_registered = False


_started_with = None   # the settings the running engine was started with (see init)


_world_ranks = None    # the running world's members as ranks of MPI_COMM_WORLD; None: all of it


def _settings(process_sets, world_ranks):
    """What init() must see unchanged on a second call: HVLITE_*/HOROVOD_* variables (read
    once, at the first init), the process sets asked for (None: not asked) and the world."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("HVLITE_", "HOROVOD_"))}
    sets = None
    if process_sets is not None and process_sets != "dynamic":
        sets = [list(p.ranks) if p.ranks is not None else repr(p.mpi_comm) for p in process_sets]
    return env, sets, world_ranks


def _check_same_settings(process_sets, world_ranks):
    env, sets, _ = _settings(process_sets, world_ranks)
    old_env, old_sets, old_world = _started_with
    if world_ranks != old_world:
        raise ValueError("hvlite.init() was called again with comm=%s, but the engine runs on %s; "
                         "call shutdown() first to start on another world"
                         % (_say_world(world_ranks), _say_world(old_world)))
    changed = sorted(k for k in set(env) | set(old_env) if env.get(k) != old_env.get(k))
    if changed:
        raise ValueError("hvlite.init() was called again with different settings: %s changed "
                         "since the first init() (settings are read once; call shutdown() first "
                         "to restart with new ones)" % ", ".join(changed))
    if sets is not None and sets != (old_sets or []):
        raise ValueError("hvlite.init() was called again with process_sets=%s, but the engine "
                         "runs with %s; use add_process_set()/remove_process_set() to change "
                         "sets at run time" % (sets, old_sets or "no extra process sets"))


def _tell_engine_where_nccl_is():
    """The engine's GPU plane loads HVLITE_NCCL_LIB, else the loader's libnccl.so.2; torch's
    NCCL lives in its nvidia-nccl wheel, off the loader's path, so point the engine at it
    (read from the wheel's metadata; nothing is loaded here)."""
    path = _nccl_find.engine_library()
    if path:
        os.environ["HVLITE_NCCL_LIB"] = path


def _say_world(world_ranks):
    return "all of MPI_COMM_WORLD" if world_ranks is None else "ranks %s of MPI_COMM_WORLD" % world_ranks


def _mpi4py_comm(comm):
    """``comm`` if it is an mpi4py communicator hvlite can run on (mpi4py built on hvlite's
    MPI, not MPI_COMM_NULL, not an intercommunicator), else ValueError. Imports nothing: an
    mpi4py object exists only where mpi4py was imported."""
    import sys
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not isinstance(comm, MPI.Comm):
        raise ValueError("init(comm=...) takes a list of ranks of MPI_COMM_WORLD or an mpi4py "
                         "communicator (mpi4py.MPI.Comm), not %s" % type(comm).__name__)
    theirs = " ".join(MPI.Get_library_version().splitlines()[0].split())
    ours = " ".join(mpi_vendor().split())
    if theirs != ours:
        raise ValueError("init(comm=...): mpi4py runs on another MPI (%s) than hvlite (%s), so its "
                         "communicator means nothing to hvlite; build mpi4py against hvlite's MPI"
                         % (theirs, ours))
    if comm == MPI.COMM_NULL:
        raise ValueError("init(comm=...): the communicator is MPI.COMM_NULL (this process is not "
                         "in it): pass a communicator this process belongs to")
    if comm.Is_inter():
        raise ValueError("init(comm=...): an intercommunicator; hvlite runs on the ranks of an "
                         "intracommunicator (merge it with comm.Merge() first)")
    return comm


def _parse_world(comm):
    """init's ``comm`` as ("world", None), ("ranks", [ints, in the caller's order]) or ("comm",
    an mpi4py communicator); ValueError for anything else. The engine checks the ranks."""
    import operator
    if comm is None:
        return "world", None
    if hasattr(comm, "Get_group"):
        return "comm", _mpi4py_comm(comm)
    try:
        if isinstance(comm, (str, bytes)) or any(isinstance(r, bool) for r in comm):
            raise TypeError("not ranks")
        ranks = [operator.index(r) for r in comm]
    except TypeError:
        raise ValueError("init(comm=...) takes a list of ranks of MPI_COMM_WORLD (ints) or an "
                         "mpi4py communicator, not %r" % (comm,)) from None
    return ("ranks", ranks) if ranks else ("world", None)   # Horovod: [] is all of it


def _world_ranks_of(kind, value):
    """The members of a parsed world as ranks of MPI_COMM_WORLD (None: all of it)."""
    if kind == "world":
        return None
    if kind == "ranks":
        return list(value)
    from mpi4py import MPI
    group, world = value.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        ranks = [int(r) for r in MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)]
    finally:
        group.Free()
        world.Free()
    return None if ranks == list(range(MPI.COMM_WORLD.Get_size())) else ranks


def _start_engine(kind, value):
    if kind == "world":
        _check(lib.hvl_init())
    elif kind == "ranks":
        _check(lib.hvl_init_on(ffi.NULL, 0, value, len(value)))
    else:
        from mpi4py import MPI
        _check(lib.hvl_init_on(ffi.cast("void *", MPI._addressof(value)), MPI._sizeof(MPI.Comm),
                               ffi.NULL, 0))


def init(comm=None, process_sets=None):
    """Start hvlite on this rank (collective: every rank of the world calls it).

    Args:
        comm: None (or an empty list): the job is MPI_COMM_WORLD. An mpi4py communicator: the
            job is its ranks (the engine runs on a duplicate; every member passes it). A list
            of ranks of MPI_COMM_WORLD: the job is those ranks, in the list's order (only they
            call init with it, each with the same list). ``rank()``, ``size()``, ``local_*``,
            ``cross_*`` and process sets are then the given world's. Where hvlite initialised
            MPI itself, ``shutdown()`` finalizes it, which MPI completes once every process of
            MPI_COMM_WORLD finalizes (all groups of a job end together).
        process_sets: None, "dynamic" (sets are added later with add_process_set; hvlite always
            allows that), or a list of ProcessSet to register now, in order, on every rank.

    A second call while running is a no-op if it asks for the same settings, else ValueError.
    ``HVLITE_*`` (and ``HOROVOD_*``) variables are read here, once: set them before the first
    call.

    Raises:
        HvliteError: MPI could not be initialised or the engine could not start.
        ValueError: a bad ``comm`` or ``process_sets`` (see the module docstring), or settings
            that differ from the running engine's.
    """
    global _atexit_registered, _started_with, _world_ranks
    from .process_sets import ProcessSet, _setup_global, add_process_set
    if process_sets is not None and process_sets != "dynamic":
        process_sets = list(process_sets)
        if not all(isinstance(p, ProcessSet) for p in process_sets):
            raise ValueError("init(process_sets=...) takes a list of hvlite.ProcessSet, or 'dynamic'")
    kind, value = _parse_world(comm)
    if is_initialized() and _started_with is not None:
        _check_same_settings(process_sets, _world_ranks_of(kind, value))
        return
    _tell_engine_where_nccl_is()
    _start_engine(kind, value)
    _world_ranks = _world_ranks_of(kind, value)
    if kind == "world":
        _refuse_split_slurm_step()
    _setup_global(size(), value if kind == "comm" else None)
    _started_with = _settings(process_sets, _world_ranks)
    if rank() == 0:
        horovod_env.say_once()     # HOROVOD_* variables hvlite does not use, once per process
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    for process_set in process_sets if isinstance(process_sets, list) else ():
        add_process_set(process_set)


# Variables a process manager sets when it wired this process into a job of several ranks.
_LAUNCHED_BY = ("PMI_RANK", "PMI_FD", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")


def _refuse_split_slurm_step():
    """Fail loudly in a Slurm step of several tasks that MPI saw as one process each: what
    ``srun --mpi=none`` (Slurm's default MpiDefault) does with an MPI program, silently turning
    N tasks into N one-rank jobs. SLURM_STEP_NUM_TASKS is set only inside an srun step."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    if (lib.hvl_size() != 1 or not tasks.isdigit() or int(tasks) <= 1
            or any(name in os.environ for name in _LAUNCHED_BY)):
        return
    lib.hvl_shutdown()
    raise HvliteError(
        "hvlite: Slurm started %s tasks in this step (SLURM_STEP_NUM_TASKS=%s) but MPI sees only "
        "this process (size 1): srun started each task as its own one-rank job, which is what "
        "`srun --mpi=none` (Slurm's default MpiDefault=none) does. Run `srun --mpi=pmi2 ...` (or "
        "set MpiDefault=pmi2 in slurm.conf), or start the job with hvlrun or mpiexec inside "
        "the allocation." % (tasks, tasks))


def world_ranks():
    """For the layers above (not exported): the running world's members as ranks of
    MPI_COMM_WORLD, in hvlite's rank order; None when the world is all of MPI_COMM_WORLD."""
    return _world_ranks


def shutdown():
    """Stop hvlite; registered to run at exit, so a script need not call it.

    The engine then stops on every rank of the job: collectives still pending anywhere fail
    with ``HvliteShutdownError``. Calling it again, or before ``init()``, does nothing. The
    topology queries raise ``ValueError`` afterwards.
    """
    global _started_with
    _started_with = None
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
    """This process's rank in the job, from 0 to ``size() - 1``.

    Raises:
        ValueError: before ``init()``.
    """
    return _topology(lib.hvl_rank, "rank")


def size():
    """The number of processes in the job.

    Raises:
        ValueError: before ``init()``.
    """
    return _topology(lib.hvl_size, "size")


def local_rank():
    """This process's rank among the job's processes on this host (0 on each host's first);
    the usual choice of GPU, as in ``torch.cuda.set_device(hvd.local_rank())``.

    Raises:
        ValueError: before ``init()``.
    """
    return _topology(lib.hvl_local_rank, "local_rank")


def local_size():
    """The number of the job's processes on this host.

    Raises:
        ValueError: before ``init()``.
    """
    return _topology(lib.hvl_local_size, "local_size")


def cross_rank():
    """This host's index among the job's hosts: this process's rank among the processes with
    the same ``local_rank()``.

    Raises:
        ValueError: before ``init()``.
    """
    return _topology(lib.hvl_cross_rank, "cross_rank")


def cross_size():
    """The number of hosts that run a process with this ``local_rank()`` (on a homogeneous
    job, the number of hosts).

    Raises:
        ValueError: before ``init()``.
    """
    return _topology(lib.hvl_cross_size, "cross_size")


def is_homogeneous():
    """True if every host runs the same number of the job's processes.

    Raises:
        ValueError: before ``init()``.
    """
    return bool(_topology(lib.hvl_is_homogeneous, "is_homogeneous"))


def mpi_threads_supported():
    """True if MPI granted ``MPI_THREAD_MULTIPLE``, so the application may also call MPI
    (through mpi4py, say) beside hvlite.

    Raises:
        ValueError: before ``init()``.
    """
    return bool(_topology(lib.hvl_mpi_threads_supported, "mpi_threads_supported"))


def mpi_built():
    """True: hvlite always runs on MPI (Horovod's "built with MPI"). Needs no ``init()``."""
    return bool(lib.hvl_mpi_built())


def mpi_enabled():
    """True: MPI is what hvlite runs on, always (Horovod's "MPI chosen at run time")."""
    return bool(lib.hvl_mpi_built())


def nccl_built():
    """The version code of the NCCL library hvlite's GPU plane would load (``23007`` for
    2.30.7), or 0 where none is found; true exactly when NCCL can be used, as Horovod's.

    The GPU plane is always built and loads NCCL at run time, from ``HVLITE_NCCL_LIB``, the
    ``nvidia-nccl`` wheel torch brought, or the system's (the order is in the
    :doc:`GPU guide </guides/gpus>`). Looked up once per process; needs no ``init()``.
    """
    global _nccl_code
    if _nccl_code is None:
        _nccl_code = _nccl_find.version_code() if lib.hvl_nccl_built() else 0
    return _nccl_code


_nccl_code = None


def shm_built():
    """True if this build has the shared-memory data plane, which runs host-memory
    collectives among the ranks of one host. Needs no ``init()``."""
    return bool(lib.hvl_shm_built())


def gloo_built():
    """False: hvlite has no Gloo controller (Horovod's query, kept for scripts that ask)."""
    return False


def gloo_enabled():
    """False: hvlite has no Gloo controller; jobs run on MPI."""
    return False


def cuda_built():
    """True: collectives take CUDA tensors (through NCCL, or staged through host memory where
    NCCL cannot run them). The CUDA driver is loaded at run time, so no build flag decides
    it, and the answer says nothing about whether this machine has a GPU."""
    return bool(lib.hvl_cuda_built())


def rocm_built():
    """False: hvlite does not run collectives on ROCm (AMD GPU) memory."""
    return False


def ddl_built():
    """False: hvlite has no IBM DDL support (Horovod's query, kept for scripts that ask)."""
    return False


def ccl_built():
    """False: hvlite has no oneCCL support (Horovod's query, kept for scripts that ask)."""
    return False


def mpi_vendor():
    """The first line of the MPI library's version string (e.g. ``'MPICH Version: 5.0.2'``);
    needs no ``init()``."""
    return ffi.string(lib.hvl_mpi_vendor()).decode()


def engine_counters():
    """The engine's counters since init, as a dict: cycles, collectives, tensors_fused, ..., and
    per data plane ``<plane>_collectives`` and ``<plane>_bytes`` (planes ``nccl``, ``shm``,
    ``hierarchical``, ``mpi``: what each ran; a staged CUDA batch counts for the host plane
    that ran it)."""
    c = ffi.new("hvl_counters *")
    _check(lib.hvl_get_counters(c))
    counters = {f: getattr(c, f) for f, _ in ffi.typeof("hvl_counters").fields}
    plane = ffi.new("hvl_backend_counters *")
    for index in range(lib.hvl_backend_count()):
        _check(lib.hvl_get_backend_counters(index, plane))
        name = ffi.string(plane.name).decode()
        counters[name + "_collectives"] = plane.collectives
        counters[name + "_bytes"] = plane.bytes
    return counters


_AUTOTUNE_STATES = {lib.HVL_AUTOTUNE_OFF: "off", lib.HVL_AUTOTUNE_TUNING: "tuning",
                    lib.HVL_AUTOTUNE_CONVERGED: "converged"}


def engine_tuning():
    """The engine's live tunable values: the settings, or what autotune is trying or chose.

    Every rank takes a change of values in the same engine cycle, so once ranks have run the
    same collectives they report the same values. With ``HVLITE_AUTOTUNE=1`` the state goes from
    ``"tuning"`` to ``"converged"`` after the warm-up and search samples; the values then stay.

    Returns:
        A dict of ``fusion_threshold`` (bytes), ``cycle_time_ms`` (float), ``response_cache``
        (bool: repeated requests are agreed through the response cache), ``autotune``
        (``"off"``, ``"tuning"`` or ``"converged"``) and ``autotune_samples`` (samples measured,
        warm-up included, as of the last change of values).
    Raises:
        HvliteShutdownError: the engine is not running (HvliteNotInitializedError before init).
    """
    t = ffi.new("hvl_tuning *")
    _check(lib.hvl_get_tuning(t))
    return {"fusion_threshold": t.fusion_threshold, "cycle_time_ms": t.cycle_time_ms,
            "response_cache": bool(t.response_cache), "autotune": _AUTOTUNE_STATES[t.autotune],
            "autotune_samples": t.autotune_samples}
