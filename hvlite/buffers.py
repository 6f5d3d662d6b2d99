"""Result memory: engine buffers handed to the caller without a copy, and NumPy output allocators.

Why: a fresh output array is fresh memory, and its page faults cost as much as the collective
(64 MiB: 16,384 faults of ~2.5 us in this VM, on every call, because malloc maps and unmaps
blocks that large; 13-64 faults a call at 1 MiB, where malloc trims its heap). The engine's
result buffers (``hvl_buffer_alloc``, csrc/core/buffers.c) come back from a small bounded cache
already faulted in from ``lib.HVL_BUFFER_CACHE_MIN`` (1 MiB) and are huge-page backed from
``HUGE_MIN`` (``lib.HVL_BUFFER_HUGE_MIN``, 4 MiB), so a steady loop of out-of-place calls
reuses its memory.

Contract:
- ``allocate(nbytes) -> owner``: a cffi pointer to ``nbytes`` of engine memory (64-byte
  aligned, uninitialised), freed by ``hvl_buffer_free`` when ``owner`` is garbage-collected,
  from whichever thread that happens. Raises ``MemoryError``.
- ``adopt(pointer) -> owner``: the same for a buffer the engine handed over (``hvl_result_take``).
- ``DeviceBuffer(data, device)``: a result the engine left in CUDA device memory (a GPU
  plane's allgather or alltoall; ``hvl_result_memory`` says so), owned by the object: ``free``
  gives it back stream-ordered on the stream it was last used on (``stream``, a CUstream as an
  int; 0 until a framework wraps it), and so does garbage collection (but at interpreter exit,
  when the memory goes with the device's context). It never reads the memory.
- ``memory(owner, nbytes)``: a writable buffer-protocol object over the memory that keeps
  ``owner`` alive; ``np.frombuffer``/``torch.frombuffer`` views of it keep it alive in turn, so
  a result outlives its handle and everything else.
- ``ArrayOutput(dtype, aligned=False)`` (get one with ``array_output(dtype, aligned)``): the
  output allocator of NumPy results (see ``hvlite.collectives``). ``new(shape)`` returns
  ``(array, pointer)``: a view of engine memory from ``ENGINE_MEMORY_MIN`` bytes (or at every
  size when ``aligned``, which TensorFlow needs to adopt the array through DLPack), else a plain
  ``np.empty``. ``over(owner, shape)`` views engine memory (allgather, alltoall results).
  Arrays are C-contiguous and writable.
- ``is_aligned(array)``: its data starts on a 64-byte boundary.
- Pointers for the engine: ``address(array)`` (a C-contiguous NumPy array's data; keeps the
  array alive while held), ``pointer(int_address)`` (e.g. torch's ``data_ptr()``), ``NULL``.
- ``Source(pointer, dtype, shape, keep, memory, device, event)``: an input buffer as
  ``hvlite.collectives`` takes it (host memory unless ``memory`` says otherwise);
  ``array_source(array)`` makes one from a NumPy array (a contiguous copy if it is not).

Crossover (measured on this VM): ``np.empty`` takes 0.3 us and an engine buffer viewed as an
array 1.6 us (torch: 2.2 us against 4.4 us). Below 1 MiB out-of-place loops measured no page
faults with ``np.empty``/``torch.empty`` (0-10 a call, and engine buffers there come from malloc
as well), so the plain allocation is kept; from 1 MiB they measured 13-64 faults a call (30-160
us, against 1-2 us for engine memory) and 0 with engine buffers. ``ENGINE_MEMORY_MIN`` is
therefore the engine's cache threshold (read at every call: the tests lower it to send every
size through engine memory).
"""
import math
import sys
from typing import NamedTuple

import numpy as np

from ._lib import ffi, lib
from .dtypes import to_engine

ALIGNMENT = 64
ENGINE_MEMORY_MIN = lib.HVL_BUFFER_CACHE_MIN
HUGE_MIN = lib.HVL_BUFFER_HUGE_MIN     # engine buffers from here are 2 MiB-aligned huge pages
NULL = ffi.NULL
HOST_MEMORY = lib.HVL_MEMORY_HOST     # where a Source lives: host memory,
CUDA_MEMORY = lib.HVL_MEMORY_CUDA     # or a CUDA device's


def address(array):
    """A pointer to a C-contiguous NumPy array's data (keeps the array alive while held)."""
    try:
        return ffi.from_buffer(array)
    except (TypeError, ValueError, BufferError):   # dtypes without a buffer format
        return ffi.cast("void *", array.__array_interface__["data"][0])


def pointer(address_int):
    """A pointer from an integer address (e.g. torch's ``data_ptr()``)."""
    return ffi.cast("void *", address_int)


def allocate(nbytes):
    """``nbytes`` of engine memory, freed with the returned owner (see the module docstring)."""
    data = lib.hvl_buffer_alloc(nbytes)
    if data == ffi.NULL:
        raise MemoryError("hvlite could not allocate a result buffer of %d bytes" % nbytes)
    return ffi.gc(data, lib.hvl_buffer_free)


def adopt(data):
    """Take over an engine buffer (from ``hvl_result_take``): freed with the returned owner."""
    return ffi.gc(data, lib.hvl_buffer_free)


class DeviceBuffer:
    """An engine result in CUDA memory (see the module docstring)."""

    __slots__ = ("data", "device", "stream")

    def __init__(self, data, device):
        self.data, self.device, self.stream = data, device, 0

    @property
    def address(self):
        return int(ffi.cast("uintptr_t", self.data))

    def free(self):
        data, self.data = self.data, ffi.NULL
        if data != ffi.NULL and not sys.is_finalizing():    # at exit it goes with its context
            lib.hvl_device_buffer_free(self.device, data, ffi.cast("void *", self.stream))

    __del__ = free


def memory(owner, nbytes):
    """A writable buffer over ``nbytes`` of ``owner``'s memory; it keeps ``owner`` alive."""
    return ffi.buffer(owner, nbytes)


def is_aligned(array):
    """True if ``array``'s data starts on a 64-byte boundary."""
    return array.__array_interface__["data"][0] % ALIGNMENT == 0


class Source(NamedTuple):
    """A C-contiguous input buffer: pointer, engine dtype code, shape, and what must stay
    alive until the engine is done with the pointer; where it lives (``memory``:
    ``HOST_MEMORY`` or ``CUDA_MEMORY``, ``device``: the CUDA device's ordinal) and, for device
    memory, ``event``: None, or a callable that the submit calls once, after the output is
    allocated, to record an event on the framework's stream and return it (a ``CUevent``
    pointer; the engine's copies wait for it). The output lives where the input does."""
    pointer: object
    dtype: int
    shape: tuple
    keep: object
    memory: int = HOST_MEMORY
    device: int = -1
    event: object = None


def array_source(array):
    """The ``Source`` of a NumPy array (of a contiguous copy, if it is not C-contiguous).

    Raises:
        TypeError: a dtype the engine does not support.
    """
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return Source(address(array), to_engine(array.dtype), array.shape, array)


class ArrayOutput:
    """Output allocator of NumPy results of one dtype (see the module docstring)."""

    __slots__ = ("dtype", "aligned")

    def __init__(self, dtype, aligned=False):
        self.dtype = np.dtype(dtype)
        self.aligned = aligned

    def new(self, shape):
        """A fresh C-contiguous array of ``shape`` and a pointer to its data."""
        nbytes = math.prod(shape) * self.dtype.itemsize
        if nbytes < ENGINE_MEMORY_MIN and not self.aligned:
            out = np.empty(shape, self.dtype)
            return out, address(out)
        owner = allocate(nbytes)
        return self.over(owner, shape), owner

    def over(self, owner, shape):
        """An array of ``shape`` viewing the engine memory ``owner`` (kept alive by the array)."""
        nbytes = math.prod(shape) * self.dtype.itemsize
        return np.frombuffer(memory(owner, nbytes), self.dtype).reshape(shape)


_outputs = {}   # (np.dtype, aligned) -> ArrayOutput; one per dtype, built on first use


def array_output(dtype, aligned=False):
    """The ``ArrayOutput`` for ``dtype`` (shared: it holds no state but its dtype)."""
    key = (dtype, aligned)
    output = _outputs.get(key)
    if output is None:
        output = _outputs[key] = ArrayOutput(dtype, aligned)
    return output
