"""Collectives on NumPy arrays: Horovod's torch API, applied to ``numpy.ndarray``.

Contract: every function here is a collective: every rank must call it, in the same order,
with the same name (or every rank with no name), dtype, and the shape rules of its op. Inputs
may be non-contiguous (a contiguous copy is sent); outputs are new C-contiguous, writable arrays
(from 1 MiB they view engine memory that is reused from call to call: see ``hvlite.buffers``),
except the in-place ``*_`` forms, which write into (and return) their argument. ``*_async``
forms return a handle for ``poll``/``synchronize``. Errors: ``TypeError`` for a non-array or an
unsupported dtype, ``ValueError`` for bad arguments, ``HvliteError`` subclasses for what the
engine or the other ranks report (``MismatchError`` names the tensor and the ranks). Everything
but the NumPy specifics (``_array``, the copy back of in-place calls on non-contiguous arrays)
is ``hvlite.collectives``.
"""
import numpy as np

from . import collectives
from ._lib import ffi, lib
from .buffers import NULL, array_output, array_source
from .collectives import Adasum, Average, InPlace, Max, Min, Product, Sum, reduce_op
from .errors import _check
from .handles import Group, Handle, auto_name, reset_auto_names, submit, submit_group
from .process_sets import set_id_of

__all__ = ["Sum", "Average", "Min", "Max", "Product", "Adasum", "allreduce", "allreduce_async",
           "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
           "grouped_allreduce_", "grouped_allreduce_async_", "allgather", "allgather_async",
           "grouped_allgather", "broadcast", "broadcast_async", "broadcast_",
           "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "grouped_reducescatter", "barrier", "join", "poll", "synchronize"]


def _array(tensor):
    if not isinstance(tensor, np.ndarray):
        raise TypeError("hvlite expects a numpy.ndarray, got %s" % type(tensor).__name__)
    return tensor if tensor.flags.c_contiguous else np.array(tensor, order="C")


def _in_place(tensor):
    """(source, output, finish) of an in-place call on ``tensor``: a non-contiguous array is
    sent as a contiguous copy and the result copied back."""
    buf = _array(tensor)
    if not tensor.flags.writeable:
        raise ValueError("in-place collective on a read-only array")
    source = array_source(buf)
    finish = None if buf is tensor else (lambda target: _copy_back(target, buf))
    return source, InPlace(tensor, source.pointer), finish


def _copy_back(target, buf):
    target[...] = buf
    return target


# ---- allreduce ----

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Start an allreduce of ``tensor``; returns a handle whose result is a new array."""
    src = _array(tensor)
    return collectives.allreduce(array_source(src), array_output(src.dtype), name,
                                 reduce_op(average, op), prescale_factor, postscale_factor,
                                 process_set)


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
    op = reduce_op(average, op)
    source, output, finish = _in_place(tensor)
    return collectives.allreduce(source, output, name, op, prescale_factor, postscale_factor,
                                 process_set, finish)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place ``allreduce``; returns ``tensor``."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Start allreduces of a list of arrays, submitted together so they fuse."""
    return submit_group(lambda t, n: allreduce_async(t, average, n, op, prescale_factor,
                                                     postscale_factor, process_set),
                        tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    """Allreduce a list of arrays; returns the list of results."""
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                   postscale_factor, process_set).wait()


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    return submit_group(lambda t, n: allreduce_async_(t, average, n, op, prescale_factor,
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
    return collectives.allgather(array_source(src), array_output(src.dtype), name, process_set)


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (which may differ per rank; the other
    dims must agree). A 0-d array counts as one row. Returns the new array."""
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather(tensors, name=None, process_set=None):
    return submit_group(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                        "grouped_allgather", process_set).wait()


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Start a broadcast of root_rank's ``tensor``; the result is a new array."""
    src = _array(tensor)
    return collectives.broadcast(array_source(src), array_output(src.dtype), root_rank, name,
                                 process_set)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return root_rank's ``tensor`` on every rank (same shape and dtype everywhere)."""
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    source, output, finish = _in_place(tensor)
    return collectives.broadcast(source, output, root_rank, name, process_set, finish)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """In-place broadcast: ``tensor`` takes root_rank's values; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


# ---- alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=None):
    src = _array(tensor)
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    return collectives.alltoall(array_source(src), array_output(src.dtype), splits, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send ``splits[r]`` rows of dim 0 to rank r (equal parts if None) and concatenate what
    every rank sent here, in rank order. Returns the array, or (array, received_splits) when
    ``splits`` was given, as Horovod does."""
    return alltoall_async(tensor, splits, name, process_set).wait()


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    src = _array(tensor)
    return collectives.reducescatter(array_source(src), array_output(src.dtype), name,
                                     reduce_op(None, op), prescale_factor, postscale_factor,
                                     process_set)


def reducescatter(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over every rank (default Average) and return this rank's slice of
    dim 0: rank r gets dim0 // size rows, plus one if r < dim0 % size."""
    return reducescatter_async(tensor, name, op, process_set, prescale_factor,
                               postscale_factor).wait()


def grouped_reducescatter(tensors, name=None, op=None, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    return submit_group(lambda t, n: reducescatter_async(t, n, op, process_set, prescale_factor,
                                                         postscale_factor),
                        tensors, name, "grouped_reducescatter", process_set).wait()


# ---- barrier, handles ----

def barrier(process_set=None):
    """Return once every rank has called barrier()."""
    set_id = set_id_of(process_set)
    submit(lib.HVL_BARRIER, auto_name("barrier", process_set), lib.HVL_UINT8, (), NULL, NULL,
           None, None, process_set=set_id).wait()


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
                  process_set=set_id_of(process_set)).wait()
    reset_auto_names()   # a joined rank made none of the others' unnamed calls: realign
    return last


def poll(handle):
    """True if the async collective behind ``handle`` has finished."""
    return handle.poll()


def synchronize(handle):
    """Wait for an async collective and return its result (raises its error)."""
    if not isinstance(handle, (Handle, Group)):
        raise TypeError("synchronize() expects a handle from an *_async call")
    return handle.wait()
