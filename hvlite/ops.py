"""Collectives on NumPy arrays: Horovod's torch API, applied to ``numpy.ndarray``.

Every function here is a collective: every rank of the process set calls it, in the same order,
with the same name (or none). ``import hvlite`` exposes them all (``hvlite.allreduce``). The
blocking forms return the result; the ``_async`` forms return a handle for :func:`poll` and
:func:`synchronize`; the in-place ``_`` forms write into their argument. The reduce ops are
``Sum``, ``Average`` (the default), ``Min``, ``Max``, ``Product`` and ``Adasum``.

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
    """As :func:`allreduce`, but returns at once with a handle; :func:`synchronize` gives the
    new array."""
    src = _array(tensor)
    return collectives.allreduce(array_source(src), array_output(src.dtype), name,
                                 reduce_op(average, op), prescale_factor, postscale_factor,
                                 process_set)


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Reduce ``tensor`` element-wise over every rank and return the result.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a numpy.ndarray of a supported dtype, the same shape and dtype on every rank.
        average: deprecated (Horovod's); False means ``op=Sum``. Use ``op``.
        name: the tensor's name, unique among this rank's collectives not yet synchronized;
            generated when None (then every rank must leave it None).
        op: ``hvlite.Average`` (the default), ``Sum``, ``Min``, ``Max``, ``Product`` or
            ``Adasum``.
        prescale_factor: multiply the input by this before the reduction.
        postscale_factor: multiply the result by this after it.
        process_set: the :class:`~hvlite.process_sets.ProcessSet` to reduce over (None: every
            rank).
    Returns:
        A new array with the reduced values, of ``tensor``'s shape and dtype.
    Raises:
        TypeError: ``tensor`` is not an array, or its dtype is not supported.
        ValueError: both ``average`` and ``op`` given, or an unknown op.
        MismatchError: the ranks disagree on the dtype, shape, op or factors (every rank
            raises, naming the tensor and the ranks).
        HvliteInvalidArgument: the name is in flight on this rank, or this rank is not in
            ``process_set``.
        HvliteNotSupportedError: Adasum on a dtype or set it does not run on.
    """
    return allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                           process_set).wait()


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """As :func:`allreduce_async`, but the result is written into ``tensor`` (which must be
    writable); :func:`synchronize` returns ``tensor``."""
    op = reduce_op(average, op)
    source, output, finish = _in_place(tensor)
    return collectives.allreduce(source, output, name, op, prescale_factor, postscale_factor,
                                 process_set, finish)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """As :func:`allreduce`, but the result is written into ``tensor``, which is returned.

    Raises:
        ValueError: ``tensor`` is read-only; otherwise as :func:`allreduce`.
    """
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """As :func:`grouped_allreduce`, but returns at once with one handle for the whole
    group; :func:`synchronize` gives the list of results."""
    return submit_group(lambda t, n: allreduce_async(t, average, n, op, prescale_factor,
                                                     postscale_factor, process_set),
                        tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    """Allreduce each array of ``tensors`` as :func:`allreduce` does, submitted together so
    that the engine fuses them into as few collectives as it can.

    Args:
        tensors: a list of numpy.ndarray (each may have its own shape and dtype).
        name: a base name; the arrays are named ``<name>.0``, ``<name>.1``, ... (generated when
            None).
        average, op, prescale_factor, postscale_factor, process_set: as for :func:`allreduce`.
    Returns:
        The list of results, in the order of ``tensors``.
    Raises:
        HvliteError: as for :func:`allreduce`.
    """
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                   postscale_factor, process_set).wait()


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """As :func:`grouped_allreduce_async`, but each result is written into its array."""
    return submit_group(lambda t, n: allreduce_async_(t, average, n, op, prescale_factor,
                                                      postscale_factor, process_set),
                        tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """As :func:`grouped_allreduce`, but each result is written into its array; returns
    ``tensors``."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


# ---- allgather ----

def allgather_async(tensor, name=None, process_set=None):
    """As :func:`allgather`, but returns at once with a handle for :func:`synchronize`."""
    src = _array(tensor)
    return collectives.allgather(array_source(src), array_output(src.dtype), name, process_set)


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a numpy.ndarray; its first dimension may differ between ranks, the others and
            the dtype must agree. A 0-d array counts as one row.
        name: as for :func:`allreduce`.
        process_set: the set to gather over (None: every rank).
    Returns:
        A new array holding every rank's rows.
    Raises:
        TypeError: not an array, or an unsupported dtype.
        MismatchError: the ranks disagree on the dtype or the other dimensions.
        HvliteInvalidArgument: as for :func:`allreduce`, or a rank has joined.
    """
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather(tensors, name=None, process_set=None):
    """As :func:`allgather`, for each array of ``tensors``, submitted together so that they
    fuse; returns the list of results."""
    return submit_group(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                        "grouped_allgather", process_set).wait()


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """As :func:`broadcast`, but returns at once with a handle for :func:`synchronize`."""
    src = _array(tensor)
    return collectives.broadcast(array_source(src), array_output(src.dtype), root_rank, name,
                                 process_set)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return ``root_rank``'s ``tensor`` on every rank.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a numpy.ndarray of the same shape and dtype on every rank (the values of ranks
            other than the root are not used).
        root_rank: the rank whose values every rank gets (a global rank, a member of the set).
        name: as for :func:`allreduce`.
        process_set: the set to broadcast in (None: every rank).
    Returns:
        A new array with the root's values.
    Raises:
        MismatchError: the ranks disagree on the dtype, shape or root.
        HvliteInvalidArgument: as for :func:`allreduce`, or a rank has joined.
    """
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """As :func:`broadcast_`, but returns at once with a handle for :func:`synchronize`."""
    source, output, finish = _in_place(tensor)
    return collectives.broadcast(source, output, root_rank, name, process_set, finish)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """As :func:`broadcast`, but ``tensor`` takes the root's values and is returned."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


# ---- alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """As :func:`alltoall`, but returns at once with a handle for :func:`synchronize`."""
    src = _array(tensor)
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    return collectives.alltoall(array_source(src), array_output(src.dtype), splits, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send rows of ``tensor`` to every rank and return the rows every rank sent here.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a numpy.ndarray; its rows (first dimension) are sent in rank order.
        splits: how many rows go to each rank (a sequence of one int per rank); None splits
            the rows into equal parts, which then must divide evenly.
        name: as for :func:`allreduce`.
        process_set: the set to exchange in (None: every rank).
    Returns:
        The rows received, concatenated in rank order; with ``splits``, the tuple
        ``(array, received_splits)``, as Horovod returns.
    Raises:
        ValueError: splits that do not add up to the rows, or rows that do not divide evenly.
        MismatchError: the ranks disagree on the dtype or the other dimensions.
        HvliteInvalidArgument: as for :func:`allreduce`, or a rank has joined.
    """
    return alltoall_async(tensor, splits, name, process_set).wait()


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """As :func:`reducescatter`, but returns at once with a handle for :func:`synchronize`."""
    src = _array(tensor)
    return collectives.reducescatter(array_source(src), array_output(src.dtype), name,
                                     reduce_op(None, op), prescale_factor, postscale_factor,
                                     process_set)


def reducescatter(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over every rank and return this rank's share of the rows.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a numpy.ndarray of the same shape and dtype on every rank.
        name: as for :func:`allreduce`.
        op: ``hvlite.Average`` (the default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        process_set: the set to reduce over (None: every rank).
        prescale_factor, postscale_factor: as for :func:`allreduce`.
    Returns:
        A new array holding rank r's rows of the result (``dim0 // size`` rows, plus one if
        ``r < dim0 % size``).
    Raises:
        HvliteNotSupportedError: the op is Adasum. Otherwise as for :func:`allreduce`.
    """
    return reducescatter_async(tensor, name, op, process_set, prescale_factor,
                               postscale_factor).wait()


def grouped_reducescatter(tensors, name=None, op=None, process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    """As :func:`reducescatter`, for each array of ``tensors``, submitted together so that
    they fuse; returns the list of results."""
    return submit_group(lambda t, n: reducescatter_async(t, n, op, process_set, prescale_factor,
                                                         postscale_factor),
                        tensors, name, "grouped_reducescatter", process_set).wait()


# ---- barrier, handles ----

def barrier(process_set=None):
    """Return once every rank of the process set has called ``barrier()``.

    Args:
        process_set: the set to wait for (None: every rank).
    Raises:
        HvliteDeadlockError: the other ranks wait on other collectives.
    """
    set_id = set_id_of(process_set)
    submit(lib.HVL_BARRIER, auto_name("barrier", process_set), lib.HVL_UINT8, (), NULL, NULL,
           None, None, process_set=set_id).wait()


def join(process_set=None):
    """Declare that this rank has no more data (uneven inputs). Until every rank has joined,
    this rank takes part in the other ranks' allreduces with zeros (Average still divides by the
    full size) and in their barriers; any other collective (allgather, broadcast, alltoall,
    reducescatter) raises ``HvliteInvalidArgument`` on the ranks that called it, naming the
    joined ranks, as Horovod refuses them. Every rank must call join() exactly once per round
    of uneven work.

    Args:
        process_set: the set whose ranks join (None: every rank).
    Returns:
        The rank that joined last.
    """
    def finish(h):
        value = ffi.new("int64_t *")
        _check(lib.hvl_result_value(h._id, value))
        return int(value[0])
    last = submit(lib.HVL_JOIN, "join", lib.HVL_UINT8, (), NULL, NULL, None, finish,
                  process_set=set_id_of(process_set)).wait()
    reset_auto_names()   # a joined rank made none of the others' unnamed calls: realign
    return last


def poll(handle):
    """Say whether the collective behind ``handle`` has finished, without waiting.

    Args:
        handle: what an ``_async`` function returned.
    Returns:
        True once :func:`synchronize` would return at once.
    """
    return handle.poll()


def synchronize(handle):
    """Wait for the collective behind ``handle`` and return its result.

    Args:
        handle: what an ``_async`` function returned.
    Returns:
        The result the blocking form would have returned.
    Raises:
        TypeError: ``handle`` is not a handle; otherwise the collective's own error.
    """
    if not isinstance(handle, (Handle, Group)):
        raise TypeError("synchronize() expects a handle from an *_async call")
    return handle.wait()
