"""Engine submissions whose results TensorFlow can adopt without a copy.

Contract: ``allreduce_async``, ``broadcast_async`` and ``reducescatter_async`` take a
C-contiguous NumPy array (read-only views of tensors are fine) and return an
``hvlite.handles.Handle`` whose result is a new array aligned to 64 bytes, which TensorFlow
takes over through DLPack (TensorFlow requires that alignment of every buffer it adopts; plain
``np.empty`` gives 16). They have the semantics and errors of the same-named ``hvlite.ops``
functions; allgather and alltoall, whose result size the engine decides, go through
``hvlite.ops`` (their result is copied once more when it is not aligned).
"""
import math

import numpy as np

from .._lib import lib
from ..dtypes import to_engine
from ..handles import address, submit
from ..process_sets import _set_id, _set_rank_size

ALIGNMENT = 64


def aligned_empty(shape, dtype):
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    offset = (-raw.__array_interface__["data"][0]) % ALIGNMENT
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def is_aligned(array):
    """True if ``array``'s data can be handed to TensorFlow as is."""
    return array.__array_interface__["data"][0] % ALIGNMENT == 0


def _contiguous(array):
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def allreduce_async(array, name, op, prescale, postscale, process_set):
    """Start an allreduce of ``array`` into a new aligned array (see ``hvlite.allreduce``)."""
    src = _contiguous(array)
    out = aligned_empty(src.shape, src.dtype)
    return submit(lib.HVL_ALLREDUCE, name, to_engine(src.dtype), src.shape, address(src),
                  address(out), (src, out), lambda h: out, reduce_op=op,
                  prescale=float(prescale), postscale=float(postscale),
                  process_set=_set_id(process_set))


def broadcast_async(array, root_rank, name, process_set):
    """Start a broadcast of root_rank's ``array`` into a new aligned array."""
    src = _contiguous(array)
    out = aligned_empty(src.shape, src.dtype)
    return submit(lib.HVL_BROADCAST, name, to_engine(src.dtype), src.shape, address(src),
                  address(out), (src, out), lambda h: out, root_rank=int(root_rank),
                  process_set=_set_id(process_set))


def reducescatter_async(array, name, op, prescale, postscale, process_set):
    """Start a reducescatter; the result is this rank's rows (see ``hvlite.reducescatter``).

    Raises:
        ValueError: a 0-d array.
    """
    src = _contiguous(array)
    if src.ndim == 0:
        raise ValueError("reducescatter needs an array with at least one dimension")
    rows = lib.hvl_reducescatter_rows(src.shape[0], *_set_rank_size(process_set))
    out = aligned_empty((rows,) + src.shape[1:], src.dtype)
    return submit(lib.HVL_REDUCESCATTER, name, to_engine(src.dtype), src.shape, address(src),
                  address(out), (src, out), lambda h: out, reduce_op=op,
                  prescale=float(prescale), postscale=float(postscale),
                  process_set=_set_id(process_set))
