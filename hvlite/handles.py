"""Handles: what the ``*_async`` collectives return, and how requests reach the engine.

A user meets this module through its :class:`Handle`: ``hvd.allreduce_async(...)`` returns
one at once, ``hvd.poll(handle)`` says whether it has finished and ``hvd.synchronize(handle)``
waits for its result (or raises its error). A grouped call's handle is a :class:`Group`. A
collective's name stays taken until its handle is synchronized; a handle that is dropped
without a wait still runs, and is released at a later wait.

The rest is the machinery every adapter (NumPy, torch, TensorFlow) shares.

Contract:
- ``submit(op, name, dtype, shape, in_ptr, out_ptr, keep, finish, ...) -> Handle`` enqueues one
  request (``memory``, ``device``, ``event``: where the buffers live; host memory by default). Pointers come from ``hvlite.buffers`` (``address(numpy_array)``,
  ``pointer(int_address)``, engine buffers, ``NULL``). ``keep`` holds whatever must stay alive
  until completion (the arrays); ``finish(handle)`` builds the caller's result once the engine
  is done. Raises ``HvliteError`` subclasses (e.g. ``HvliteInvalidArgument`` for a name whose
  earlier request has not been waited on yet). ``hvlite.collectives`` builds the collectives on
  it.
- A request's name stays taken until its handle is waited on (``synchronize``), even after the
  request completed: submitting the name again before that raises, whatever the timing (Horovod
  frees it when the request starts running, which depends on the other ranks). ``wait`` (also
  when it raises) releases the handle and frees the name. A handle dropped without a wait
  (Horovod's fire-and-forget ``*_async`` calls) still runs; once its request is done, the next
  wait on any handle (a ``synchronize``, a blocking collective, ``barrier``) releases it, which
  frees its name and buffers. Not a submission: a name submitted twice in a row still fails the
  second time, whatever the timing, as Horovod's duplicate-name tests expect. After an
  error the engine met once data could move (a timeout, a lost peer, a GPU or MPI failure), a
  copy or collective it gave up on may still touch the buffers, so ``keep`` is never let go (a
  leak rather than memory reused while a GPU or MPI writes into it); the engine says which
  (``hvl_buffers_busy``: also a batch stopped on the GPU behind another's error, until the GPU
  was seen past it).
- ``Handle.wait()`` blocks (with the GIL released, and Ctrl-C still works) and returns
  ``finish``'s result, or raises the engine's error for that tensor on every rank it affects.
- ``wait_all(handles)`` waits for every handle even when one raises (so every name is freed),
  then returns the results or raises the first error.
- ``Group`` is the handle of a grouped call (its ``wait`` returns the list of results, through
  ``wait_all``); ``submit_group(submit_one, items, name, kind, process_set)`` submits
  ``submit_one(item, name)`` for every item inside one ``burst``, so the engine negotiates and
  fuses them together, with names from ``group_names`` (``<name>.<i>``, or generated ones); if
  one submission raises, it waits for those already made before raising.
- ``result_buffer(handle)`` takes an engine-owned result (allgather, alltoall) over without a
  copy; ``received_splits(handle, size)`` reads an alltoall's received rows per rank.
- ``auto_name(kind, process_set)`` generates ``"<kind>.noname.<n>"`` with one counter per kind
  and process set; the members of a set call its collectives in the same order, so the counters
  agree (a rank's calls on sets others are not in do not shift the others' names).
"""
import collections
import itertools

import numpy as np

from ._lib import ffi, lib
from .buffers import NULL, DeviceBuffer, address, adopt, pointer  # noqa: F401  (address, pointer: re-exported)
from .errors import _check

_counters = {}
# handle id -> what must stay alive until the engine is done with it. Held here, not only by the
# Handle, so that a dropped handle (or an exception between submit and wait) cannot free a
# buffer the engine still reads or writes; wait() releases the entry.
_keep_alive = {}
# What failed requests may still be touched through (see the contract)
_stranded = []
# Ids of handles dropped before their wait (appended by any thread's garbage collection: a
# deque's append and popleft are atomic, so no lock that a collection could re-enter); released
# after waits, once done (see the contract)
_orphans = collections.deque()


def _buffers_busy(hid, rc):
    """Whether work the engine gave up on may still touch finished handle ``hid``'s buffers (it
    ended with status ``rc``); asked before its release. A failed question counts as busy."""
    if rc == lib.HVL_OK:
        return False
    busy = ffi.new("int *")
    return lib.hvl_buffers_busy(hid, busy) != lib.HVL_OK or bool(busy[0])


def _let_go(hid, busy):
    """After handle ``hid`` was released: its buffers, kept for good if ``busy``."""
    keep = _keep_alive.pop(hid, None)
    if busy:
        _stranded.append(keep)


def _release_finished_orphans():
    """Release the dropped handles whose requests are done (their names become free)."""
    done = ffi.new("int *")
    for _ in range(len(_orphans)):
        try:
            hid = _orphans.popleft()
        except IndexError:          # another thread took the rest
            return
        if lib.hvl_poll(hid, done) != lib.HVL_OK:   # a stopped engine's: nothing runs it now
            _keep_alive.pop(hid, None)
            continue
        if not done[0]:
            _orphans.append(hid)
            continue
        rc = lib.hvl_wait(hid, 0.0)                 # done: its final status, at once
        busy = _buffers_busy(hid, rc)
        lib.hvl_release(hid)
        _let_go(hid, busy)


def reset_auto_names():
    """Restart every generated-name counter (every rank at the same point, e.g. after join)."""
    _counters.clear()


def auto_name(kind, process_set=None):
    """A name for an unnamed collective, the same on every member of its process set."""
    key = (kind, getattr(process_set, "process_set_id", None) or 0)
    counter = _counters.setdefault(key, itertools.count())
    return "%s.noname.%d" % (kind, next(counter))


def group_names(name, kind, n, process_set=None):
    """Names of the ``n`` requests of a grouped call: ``<name>.<i>``, or generated ones."""
    if name:
        return ["%s.%d" % (name, i) for i in range(n)]
    return [auto_name(kind, process_set) for _ in range(n)]


class Handle:
    """An in-flight collective, returned by the ``*_async`` functions; pass it to ``poll`` and
    ``synchronize`` (or call its own methods).

    Attributes:
        name: the collective's name (the one given, or the generated one).
    """

    __slots__ = ("_id", "_finish", "_done", "_result", "name")

    def __init__(self, hid, keep, finish, name):
        self._id = hid
        _keep_alive[hid] = keep
        self._finish = finish
        self._done = False
        self._result = None
        self.name = name

    def poll(self):
        """True once the collective finished (``wait`` will not block)."""
        if self._done:
            return True
        done = ffi.new("int *")
        _check(lib.hvl_poll(self._id, done))
        return bool(done[0])

    def wait(self):
        """Block until the collective finished and return its result (what ``synchronize``
        does); once it returned, a second call returns the same result. Ctrl-C interrupts
        the wait.

        Raises:
            HvliteError: the engine's error for this tensor (``MismatchError``,
                ``HvliteTimeoutError``, ...), raised on every rank it affects.
        """
        if self._done:
            return self._result
        while True:
            rc = lib.hvl_wait(self._id, 1.0)   # wakes each second so Ctrl-C is seen
            if rc != lib.HVL_ERR_IN_PROGRESS:
                break
        try:
            _check(rc)
            self._result = self._finish(self) if self._finish else None
        finally:
            busy = _buffers_busy(self._id, rc)
            lib.hvl_release(self._id)
            self._done = True
            _let_go(self._id, busy)
            if _orphans:
                _release_finished_orphans()
        return self._result

    def __del__(self):
        if not self._done:
            try:
                _orphans.append(self._id)
            except Exception:    # noqa: BLE001 - interpreter shutdown: nothing to release into
                pass

    def __repr__(self):
        return "<hvlite.Handle %s%s>" % (self.name, " done" if self._done else "")


def wait_all(handles):
    """Wait for every handle (each one frees its name), even after one raised; return their
    results, or raise the first error once all are done."""
    results, error = [], None
    for handle in handles:
        try:
            results.append(handle.wait())
        except Exception as e:   # noqa: BLE001 - re-raised below once all are done
            results.append(None)
            error = error or e
    if error is not None:
        raise error
    return results


class Group:
    """The handle of a grouped collective (``grouped_allreduce_async``, ...): one
    :class:`Handle` per tensor, polled and waited for together.

    Args:
        handles: the group's handles, in the order of its tensors.
    """

    def __init__(self, handles):
        self.handles = handles

    def poll(self):
        """True once every collective of the group finished."""
        return all(h.poll() for h in self.handles)

    def wait(self):
        """Wait for every collective of the group and return the list of results.

        Raises:
            HvliteError: the first error, once every handle was waited for (so every name
                is free again).
        """
        return wait_all(self.handles)


def submit(op, name, dtype, shape, in_ptr, out_ptr, keep, finish, reduce_op=0, root_rank=0,
           prescale=1.0, postscale=1.0, splits=None, process_set=0, memory=lib.HVL_MEMORY_HOST,
           device=-1, event=NULL):
    """Enqueue one request; see the module docstring."""
    hid = lib.hvl_submit(op, dtype, reduce_op, root_rank, process_set, name.encode(),
                         len(shape), list(shape) or _NO_SHAPE, in_ptr, out_ptr, prescale,
                         postscale, NULL if splits is None else (splits or _NO_SHAPE),
                         0 if splits is None else len(splits), memory, device, event)
    if hid < 0:
        _check(-hid)
    return Handle(hid, keep, finish, name)


_NO_SHAPE = [0]


class burst:
    """``with burst(): submit(...); submit(...)``: the engine takes this thread's requests of the
    block only at its end, and negotiates them at once, so the group fuses. Do not wait on them
    inside the block: they would start only when the engine's bounded hold (0.25 s) runs out."""

    def __enter__(self):
        lib.hvl_burst_begin()
        return self

    def __exit__(self, *exc):
        lib.hvl_burst_end()
        return False


def submit_group(submit_one, items, name, kind, process_set=None):
    """Submit ``submit_one(item, name)`` for every item in one burst; returns the ``Group``. If
    one submission raises, the ones already made are waited for (so their names are free
    again) before the error is raised."""
    names = group_names(name, kind, len(items), process_set)
    handles, error = [], None
    with burst():
        try:
            for item, n in zip(items, names):
                handles.append(submit_one(item, n))
        except Exception as e:   # noqa: BLE001 - raised below, after the waits
            error = e
    if error is not None:
        try:
            wait_all(handles)
        finally:
            raise error
    return Group(handles)


def result_buffer(handle):
    """Take the engine-owned result of a finished allgather/alltoall without copying it.

    Returns:
        ``(shape, owner, count)``: the result's shape, an owner of its memory that frees it
        when garbage-collected (``hvlite.buffers.memory(owner, n)`` keeps it alive, and so does
        every array made from that buffer), and its element count. A copy would cost a fresh
        allocation (page faults) plus the copy: at 16 MiB per rank that was most of the call.
        Where a GPU plane ran it the owner is a ``DeviceBuffer`` in the tensors' CUDA memory.
    """
    ndim = ffi.new("int *")
    shape = ffi.new("int64_t[%d]" % lib.HVL_MAX_DIMS)
    _check(lib.hvl_result_shape(handle._id, ndim, shape))
    shape = tuple(shape[i] for i in range(ndim[0]))
    where, device = ffi.new("int *"), ffi.new("int *")
    _check(lib.hvl_result_memory(handle._id, where, device))
    data = ffi.new("void **")
    _check(lib.hvl_result_take(handle._id, data))
    count = int(np.prod(shape, dtype=np.int64))
    if where[0] == lib.HVL_MEMORY_CUDA:
        return shape, DeviceBuffer(data[0], device[0]), count
    return shape, adopt(data[0]), count


def received_splits(handle, size):
    """Rows received from each rank by a finished alltoall."""
    splits = ffi.new("int64_t[]", size)
    _check(lib.hvl_received_splits(handle._id, splits))
    return np.array([splits[i] for i in range(size)], dtype=np.int64)
