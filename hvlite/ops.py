"""Collectives on NumPy arrays: Horovod's torch API, applied to ``numpy.ndarray``.

Contract: every function here is a collective: every rank must call it, in the same order,
with the same name (or every rank with no name), dtype, and the shape rules of its op. Inputs
may be non-contiguous (a contiguous copy is sent); outputs are new C-contiguous arrays, except
the in-place ``*_`` forms, which write into (and return) their argument. ``*_async`` forms
return a handle for ``poll``/``synchronize``. Errors: ``TypeError`` for a non-array or an
unsupported dtype, ``ValueError`` for bad arguments, ``HvliteError`` subclasses for what the
engine or the other ranks report (``MismatchError`` names the tensor and the ranks).
"""
import numpy as np

from ._lib import ffi, lib
from .basics import rank, size
from .dtypes import to_engine
from .errors import _check
from .handles import (NULL, Handle, address, auto_name, burst, received_splits, reset_auto_names,
                      result_array, submit)
from .process_sets import _set_id, _set_rank_size

__all__ = ["Sum", "Average", "Min", "Max", "Product", "Adasum", "allreduce", "allreduce_async",
           "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
           "grouped_allreduce_", "grouped_allreduce_async_", "allgather", "allgather_async",
           "grouped_allgather", "broadcast", "broadcast_async", "broadcast_",
           "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "grouped_reducescatter", "barrier", "join", "poll", "synchronize"]

Sum, Average, Min, Max, Product = (lib.HVL_SUM, lib.HVL_AVERAGE, lib.HVL_MIN, lib.HVL_MAX,
                                   lib.HVL_PRODUCT)
Adasum = -1     # Horovod's name; hvlite has no Adasum reduction, so using it is a ValueError


def _array(tensor):
    if not isinstance(tensor, np.ndarray):
        raise TypeError("hvlite expects a numpy.ndarray, got %s" % type(tensor).__name__)
    return tensor if tensor.flags.c_contiguous else np.array(tensor, order="C")


def _writable(tensor):
    _array(tensor)
    if not tensor.flags.writeable:
        raise ValueError("in-place collective on a read-only array")
    return tensor


def _reduce_op(average, op):
    if op is None:
        return Sum if average is False else Average
    if average is not None:
        raise ValueError("pass either op= or the deprecated average=, not both")
    if op == Adasum:
        raise ValueError("hvlite does not implement Adasum; use hvlite.Average or hvlite.Sum")
    if op not in (Sum, Average, Min, Max, Product):
        raise ValueError("unsupported reduce op %r (use hvlite.Sum, Average, Min, Max, Product)" % (op,))
    return op


class _Group:
    """Handle of a grouped collective: ``wait`` returns the list of results."""

    def __init__(self, handles):
        self.handles = handles

    def poll(self):
        return all(h.poll() for h in self.handles)

    def wait(self):
        return [h.wait() for h in self.handles]


def _group_names(name, kind, n, process_set=None):
    return ["%s.%d" % (name, i) for i in range(n)] if name else [auto_name(kind, process_set) for _ in range(n)]


def _submit_group(submit_one, tensors, name, kind, process_set=None):
    """Submit ``submit_one(tensor, name)`` for every tensor in one burst (the engine negotiates
    and fuses them together); returns the group handle. Shared by the framework adapters."""
    names = _group_names(name, kind, len(tensors), process_set)
    with burst():
        return _Group([submit_one(t, n) for t, n in zip(tensors, names)])


# ---- allreduce ----

def _allreduce(src, out, name, op, prescale, postscale, process_set, finish):
    return submit(lib.HVL_ALLREDUCE, name or auto_name("allreduce", process_set), to_engine(src.dtype),
                  src.shape, address(src), address(out), (src, out), finish, reduce_op=op,
                  prescale=float(prescale), postscale=float(postscale),
                  process_set=_set_id(process_set))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Start an allreduce of ``tensor``; returns a handle whose result is a new array."""
    src = _array(tensor)
    out = np.empty_like(src, order="C")
    return _allreduce(src, out, name, _reduce_op(average, op), prescale_factor,
                      postscale_factor, process_set, lambda h: out)


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Reduce ``tensor`` over every rank (default op: Average) and return the result.

    Args:
        tensor: numpy.ndarray, same shape and dtype on every rank.
        average: deprecated; False means Sum. Use op=.
        name: unique among this rank's pending collectives; generated if None.
        op: hvlite.Sum, Average, Min, Max or Product.
        prescale_factor, postscale_factor: multiply the input before / the result after.
        process_set: None (all ranks).
    Returns:
        A new array with the reduced values.
    Raises:
        MismatchError: ranks disagree on dtype, shape, op or factors (every rank raises).
    """
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                           process_set).wait()


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """In-place ``allreduce_async``: the result is written into ``tensor``."""
    target = _writable(tensor)
    buf = _array(target)
    finish = (lambda h: target) if buf is target else (lambda h: _copy_back(target, buf))
    return _allreduce(buf, buf, name, _reduce_op(average, op), prescale_factor,
                      postscale_factor, process_set, finish)


def _copy_back(target, buf):
    target[...] = buf
    return target


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place ``allreduce``; returns ``tensor``."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Start allreduces of a list of arrays, submitted together so they fuse."""
    return _submit_group(lambda t, n: allreduce_async(t, average, n, op, prescale_factor,
                                                      postscale_factor, process_set),
                         tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    """Allreduce a list of arrays; returns the list of results."""
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                   postscale_factor, process_set).wait()


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    return _submit_group(lambda t, n: allreduce_async_(t, average, n, op, prescale_factor,
                                                       postscale_factor, process_set),
                         tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


# ---- allgather ----

def allgather_async(tensor, name=None, process_set=None):
    """Start an allgather; the result concatenates every rank's array along dim 0."""
    src = _array(tensor)
    return submit(lib.HVL_ALLGATHER, name or auto_name("allgather", process_set), to_engine(src.dtype),
                  src.shape, address(src), NULL, (src,), lambda h: result_array(h, src.dtype),
                  process_set=_set_id(process_set))


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (which may differ per rank; the other
    dims must agree). A 0-d array counts as one row. Returns the new array."""
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather(tensors, name=None, process_set=None):
    return _submit_group(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                         "grouped_allgather", process_set).wait()


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Start a broadcast of root_rank's ``tensor``; the result is a new array."""
    src = _array(tensor)
    out = np.empty_like(src, order="C")
    return submit(lib.HVL_BROADCAST, name or auto_name("broadcast", process_set), to_engine(src.dtype),
                  src.shape, address(src), address(out), (src, out), lambda h: out,
                  root_rank=int(root_rank), process_set=_set_id(process_set))


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return root_rank's ``tensor`` on every rank (same shape and dtype everywhere)."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    target = _writable(tensor)
    buf = _array(target)
    finish = (lambda h: target) if buf is target else (lambda h: _copy_back(target, buf))
    return submit(lib.HVL_BROADCAST, name or auto_name("broadcast", process_set), to_engine(buf.dtype),
                  buf.shape, address(buf), address(buf), (buf, target), finish,
                  root_rank=int(root_rank), process_set=_set_id(process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """In-place broadcast: ``tensor`` takes root_rank's values; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


# ---- alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=None):
    src = _array(tensor)
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    n = _set_rank_size(process_set)[1]

    def finish(h):
        out = result_array(h, src.dtype)
        return out if splits is None else (out, received_splits(h, n))
    return submit(lib.HVL_ALLTOALL, name or auto_name("alltoall", process_set), to_engine(src.dtype),
                  src.shape, address(src), NULL, (src,), finish, splits=splits,
                  process_set=_set_id(process_set))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send ``splits[r]`` rows of dim 0 to rank r (equal parts if None) and concatenate what
    every rank sent here, in rank order. Returns the array, or (array, received_splits) when
    ``splits`` was given, as Horovod does."""
    return alltoall_async(tensor, splits, name, process_set).wait()


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    src = _array(tensor)
    if src.ndim == 0:
        raise ValueError("reducescatter needs an array with at least one dimension")
    rows = lib.hvl_reducescatter_rows(src.shape[0], *_set_rank_size(process_set))
    out = np.empty((rows,) + src.shape[1:], dtype=src.dtype)
    return submit(lib.HVL_REDUCESCATTER, name or auto_name("reducescatter", process_set),
                  to_engine(src.dtype), src.shape, address(src), address(out), (src, out),
                  lambda h: out, reduce_op=_reduce_op(None, op), prescale=float(prescale_factor),
                  postscale=float(postscale_factor), process_set=_set_id(process_set))


def reducescatter(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over every rank (default Average) and return this rank's slice of
    dim 0: rank r gets dim0 // size rows, plus one if r < dim0 % size."""
    return reducescatter_async(tensor, name, op, process_set, prescale_factor,
                               postscale_factor).wait()


def grouped_reducescatter(tensors, name=None, op=None, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    return _submit_group(lambda t, n: reducescatter_async(t, n, op, process_set, prescale_factor,
                                                          postscale_factor),
                         tensors, name, "grouped_reducescatter", process_set).wait()


# ---- barrier, handles ----

def barrier(process_set=None):
    """Return once every rank has called barrier()."""
    submit(lib.HVL_BARRIER, auto_name("barrier", process_set), lib.HVL_UINT8, (), NULL, NULL, None, None,
           process_set=_set_id(process_set)).wait()


def join(process_set=None):
    """Declare that this rank has no more data (uneven inputs). Until every rank has joined,
    this rank takes part in the other ranks' collectives with zeros (no rows for allgather and
    alltoall) and discards the results; Average still divides by the full size. Returns the
    rank that joined last. A broadcast from a rank that has joined fails on every rank.
    Every rank must call join() exactly once per round of uneven work."""
    def finish(h):
        value = ffi.new("int64_t *")
        _check(lib.hvl_result_value(h._id, value))
        return int(value[0])
    last = submit(lib.HVL_JOIN, "join", lib.HVL_UINT8, (), NULL, NULL, None, finish,
                  process_set=_set_id(process_set)).wait()
    reset_auto_names()   # a joined rank made none of the others' unnamed calls: realign
    return last


def poll(handle):
    """True if the async collective behind ``handle`` has finished."""
    return handle.poll()


def synchronize(handle):
    """Wait for an async collective and return its result (raises its error)."""
    if not isinstance(handle, (Handle, _Group)):
        raise TypeError("synchronize() expects a handle from an *_async call")
    return handle.wait()
