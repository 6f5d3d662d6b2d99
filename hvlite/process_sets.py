"""Process sets: groups of ranks that run collectives among themselves (Horovod's API).

Every collective takes ``process_set=``: by default it runs on every rank
(:data:`global_process_set`); given a :class:`ProcessSet`, only that set's members call it and
take part, while other ranks go on with their own work. Every rank registers a set before
it is used, at ``init(process_sets=[...])`` or later with :func:`add_process_set`: for example
every rank calls ``evens = hvd.add_process_set([0, 2])``, then ranks 0 and 2 (where
``evens.included()`` is true) call ``hvd.allreduce(tensor, process_set=evens)``.

Contract:
- ``ProcessSet(ranks)`` names a group by its global ranks (any order; kept sorted, distinct), or
  by an mpi4py communicator (``ProcessSet(comm)``: its members, as ranks of the job, which may
  be part of MPI_COMM_WORLD: see ``init(comm=...)``). ``ProcessSet([])`` is every rank, as in
  Horovod (whose global set is one): registering it adds a duplicate of the global set, which
  raises ``HvliteInvalidArgument``. It gets an
  id when registered: by ``init(process_sets=[...])`` or ``add_process_set``. ``size()``,
  ``rank()`` (this process's rank within the set, -1 if not a member) and ``included()`` return
  None until then.
- ``global_process_set`` is every rank (id 0), always registered after ``init()``.
- ``add_process_set(set_or_ranks)`` and ``remove_process_set(set)`` are collective over every
  rank of the job: every rank calls them with the same sets in the same order (a rank whose
  list differs gets ``HvliteInvalidArgument`` on every rank). Adding a set whose ranks equal a
  registered one's raises the same; removing the global set raises ``ValueError``; removing a
  set that is not registered returns False. Collectives of a removed set still pending fail.
- A collective's ``process_set=`` argument (None = global) must be registered, and the calling
  rank must be a member (``HvliteInvalidArgument`` otherwise, naming the tensor and the set);
  ``root_rank`` of a broadcast stays a global rank, which must be a member.
- For the layers above (not exported by ``hvlite``): ``set_id_of(process_set)`` is the engine id
  (``ValueError`` for a set that is not registered); ``rank_and_size(process_set)`` this rank's
  (rank, size) within it, for adapters that split or average by the set's size;
  ``rank_and_size_by_id(set_id)`` the same from an engine id.
"""
from ._lib import lib
from .errors import _check
from .handles import NULL, auto_name, submit

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]

_registered = {}     # id -> ProcessSet, this process's view of the engine's table


class ProcessSet:
    """A group of ranks that runs collectives among themselves (Horovod's ``hvd.ProcessSet``).

    A new set is only a description: it can be used once registered (``init(process_sets=...)``
    or :func:`add_process_set`), which gives it its ``process_set_id``. Until then ``size()``,
    ``rank()`` and ``included()`` return None.

    Args:
        ranks_or_comm: the members' ranks in the job (any order; duplicates are dropped; ``[]``
            means every rank), or an mpi4py communicator whose members form the set.

    Attributes:
        ranks: the members' ranks, sorted; for a communicator's set, filled in at registration.
    """

    def __init__(self, ranks_or_comm=None):
        self.mpi_comm = None
        """The mpi4py communicator the set was made from, or None."""
        self.process_set_id = None
        """The id the set got when registered (0 is the global set), or None."""
        if ranks_or_comm is None:
            self.ranks = None
        elif hasattr(ranks_or_comm, "Get_group"):      # an mpi4py communicator
            self.mpi_comm = ranks_or_comm
            self.ranks = None                            # resolved against the job at registration
        else:
            self.ranks = sorted({int(r) for r in ranks_or_comm})   # []: every rank

    def _info(self):
        if self.process_set_id is None:
            return None
        size, rank = _ffi_ints()
        _check(lib.hvl_process_set_info(self.process_set_id, size, rank))
        return size[0], rank[0]

    def size(self):
        """Number of ranks in the set, or None if it is not registered."""
        info = self._info()
        return None if info is None else info[0]

    def rank(self):
        """This process's rank within the set (-1 if not a member), or None if not registered."""
        info = self._info()
        return None if info is None else info[1]

    def included(self):
        """Whether this process is a member, or None if the set is not registered."""
        info = self._info()
        return None if info is None else info[1] >= 0

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)


def _ffi_ints():
    from ._lib import ffi
    return ffi.new("int *"), ffi.new("int *")


global_process_set = ProcessSet()
"""The set of every rank of the job (id 0), the default ``process_set`` of every collective.
Registered by ``init()``; it cannot be removed."""


def _setup_global(size, mpi_comm=None):
    """Called by init(): the global set is every rank, id 0 (with init's communicator, if any,
    as Horovod keeps it)."""
    global_process_set.ranks = list(range(size))
    global_process_set.mpi_comm = mpi_comm
    global_process_set.process_set_id = 0
    _registered.clear()
    _registered[0] = global_process_set


def _resolve_comm(process_set):
    """Ranks (in the job) of the members of an mpi4py communicator: their ranks in
    MPI_COMM_WORLD, mapped to the job's (which init(comm=...) may have made of part of it)."""
    from mpi4py import MPI
    from .basics import world_ranks
    group = process_set.mpi_comm.Get_group()
    world = MPI.COMM_WORLD.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    job = world_ranks()
    if job is None:
        return sorted(int(r) for r in ranks)
    outside = sorted(int(r) for r in ranks if r not in job)
    if outside:
        raise ValueError("process set %r: ranks %s of MPI_COMM_WORLD are not in the job's world "
                         "(init(comm=...) made it of ranks %s)" % (process_set, outside, job))
    return sorted(job.index(r) for r in ranks)


def add_process_set(process_set):
    """Register a process set on every rank (collective: every rank of the job calls it, with
    the same sets in the same order, members or not).

    Args:
        process_set: a ``ProcessSet``, or a list of ranks to make one of.
    Returns:
        The registered ``ProcessSet`` (with its ``process_set_id``).
    Raises:
        ValueError: the set is already registered; it has neither ranks nor a communicator;
            its communicator holds ranks outside the job (see ``init(comm=...)``).
        HvliteInvalidArgument: bad ranks, a set that differs between ranks, or a duplicate of
            a registered set (on every rank).
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%r is already registered" % (process_set,))
    if process_set.mpi_comm is not None:
        process_set.ranks = _resolve_comm(process_set)
    if process_set.ranks is None:
        raise ValueError("a process set needs ranks or an MPI communicator")
    members = process_set.ranks or list(range(global_process_set.size() or 0))   # []: every rank

    def finish(h):
        from ._lib import ffi
        value = ffi.new("int64_t *")
        _check(lib.hvl_result_value(h._id, value))
        return int(value[0])
    set_id = submit(lib.HVL_PROCESS_SET_ADD, auto_name("add_process_set"), lib.HVL_UINT8, (),
                    NULL, NULL, None, finish, splits=members).wait()
    process_set.ranks = members
    process_set.process_set_id = set_id
    _registered[set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregister a process set on every rank (collective: every rank calls it for the same
    sets, in the same order). Its collectives still pending then fail.

    Args:
        process_set: a registered ``ProcessSet``.
    Returns:
        True if the set was removed; False if it was not registered (nothing is sent).
    Raises:
        ValueError: the global process set, which cannot be removed.
    """
    set_id = getattr(process_set, "process_set_id", None)
    if set_id == 0:
        raise ValueError("the global process set cannot be removed")
    if set_id is None or _registered.get(set_id) is not process_set:
        return False
    submit(lib.HVL_PROCESS_SET_REMOVE, auto_name("remove_process_set"), lib.HVL_UINT8, (),
           NULL, NULL, None, None, root_rank=set_id).wait()
    del _registered[set_id]
    process_set.process_set_id = None
    return True


def set_id_of(process_set):
    """The engine id of a registered process set (None: the global set, 0)."""
    if process_set is None or process_set is global_process_set:
        return 0
    set_id = getattr(process_set, "process_set_id", None)
    if not isinstance(process_set, ProcessSet) or set_id is None:
        raise ValueError("process set %r is not registered with hvlite: pass it to "
                         "hvlite.init(process_sets=[...]) or hvlite.add_process_set()" % (process_set,))
    return set_id


def rank_and_size(process_set):
    """(this rank's rank in the set, the set's size); for the global set, (rank(), size())."""
    return rank_and_size_by_id(set_id_of(process_set))


def rank_and_size_by_id(set_id):
    """(this rank's rank in set ``set_id``, the set's size)."""
    size, rank = _ffi_ints()
    _check(lib.hvl_process_set_info(set_id, size, rank))
    return rank[0], size[0]
