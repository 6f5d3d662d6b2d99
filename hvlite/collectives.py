"""The one submit path of the collectives, shared by the NumPy API, hvlite.torch and
hvlite.tensorflow, which differ only in how they describe a buffer and make a result.

Contract:
- Input: ``Source(pointer, dtype, shape, keep)`` (``hvlite.buffers``; ``array_source(array)``
  for NumPy) describes a C-contiguous buffer: a pointer from ``hvlite.buffers`` (``address``,
  ``pointer``; ``NULL`` for 0 elements), the engine dtype
  code (``hvlite.dtypes.by_name``), the shape (a tuple; ``()`` for 0-d) and ``keep``, whatever
  must stay alive until the engine is done with the pointer (the array or tensor).
- Output: an output allocator, any object with ``new(shape) -> (result, pointer)`` (a fresh
  C-contiguous result of the source's dtype, and a pointer to its data, in the source's memory)
  and ``over(owner, shape) -> result`` (the result made from host engine memory that ``owner``
  frees: the results of allgather and alltoall, whose size the engine decides; an allocator of
  device tensors copies them to its device). ``hvlite.buffers.
  ArrayOutput`` is NumPy's; the adapters bring their own. ``InPlace(result, pointer)`` is the
  allocator of an in-place call: the engine writes over ``pointer`` and the result is ``result``.
- ``allreduce``, ``broadcast``, ``reducescatter``, ``allgather`` and ``alltoall`` submit one
  request and return a ``hvlite.handles.Handle`` whose ``wait()`` returns the result, passed
  through ``finish(result)`` when given (alltoall with ``splits``: ``(result,
  received_splits)``, the rows received from each rank as an int64 NumPy array). Each is a
  collective: every member of the process set calls it, in the same order, with the same name
  (or every member with none: ``name=None`` generates one, ``hvlite.handles.auto_name``).
- Errors: ``ValueError`` for a bad reduce op (``reduce_op``), a 0-d reducescatter input or a
  process set that is not registered, raised before a name is generated or anything is sent;
  ``HvliteNotSupportedError`` (a ``NotImplementedError``) at submit for Adasum where it does
  not apply (an op other than allreduce, a dtype other than float16/32/64, a set whose size is
  not a power of 2), as Horovod refuses them;
  ``HvliteError`` subclasses from the engine (at submit for local mistakes such as a name
  already in flight, at ``wait`` for what the ranks report, e.g. ``MismatchError``).
- Helpers: ``reduce_op(average, op)`` (Horovod's defaulting of the deprecated ``average`` and
  the op check), ``reducescatter_rows(dim0, process_set)`` and ``reducescatter_shape(shape,
  process_set)`` (rank r gets dim0 // size rows, plus one if r < dim0 % size).
  Grouping lives in ``hvlite.handles`` (``submit_group``, ``group_names``, ``Group``).
"""
from typing import NamedTuple

from ._lib import lib
from .buffers import NULL, Source  # noqa: F401  (Source: re-exported with the contract)
from .handles import auto_name, received_splits, result_buffer, submit
from .process_sets import rank_and_size, set_id_of

# The reduce ops (``op=``), the engine's own codes. One assignment each, so that tools reading
# the source (the API reference) see each name and its description.
Sum = lib.HVL_SUM
"""The reduce op that adds the ranks' tensors (any, for bool)."""
Average = lib.HVL_AVERAGE
"""The default reduce op, which adds, then divides by the number of ranks (integers round
toward 0)."""
Min = lib.HVL_MIN
"""The reduce op that keeps the smallest value of each element (all, for bool)."""
Max = lib.HVL_MAX
"""The reduce op that keeps the largest value of each element (any, for bool)."""
Product = lib.HVL_PRODUCT
"""The reduce op that multiplies the ranks' tensors (all, for bool)."""
Adasum = lib.HVL_ADASUM
"""The reduce op of Horovod's adaptive summation (float16/32/64, a power-of-2 number of
ranks)."""


class InPlace(NamedTuple):
    """The output allocator of an in-place call: the engine writes over ``pointer``."""
    result: object
    pointer: object

    def new(self, shape):
        return self.result, self.pointer


def reduce_op(average, op):
    """The reduce op of a call: ``op``, else Average unless the deprecated ``average`` is False.

    Raises:
        ValueError: both given, or an op the engine does not have. (Where Adasum does not
            apply, the engine refuses the request: ``HvliteNotSupportedError``.)
    """
    if op is None:
        return Average if average is None or average else Sum
    if average is not None:
        raise ValueError("pass either op= or the deprecated average=, not both")
    if op not in (Sum, Average, Min, Max, Product, Adasum):
        raise ValueError("unsupported reduce op %r (use Sum, Average, Min, Max, Product or "
                         "Adasum)" % (op,))
    return op


def reducescatter_rows(dim0, process_set=None):
    """Rows of dim 0 this rank gets from a reducescatter of ``dim0`` rows over the set."""
    return lib.hvl_reducescatter_rows(dim0, *rank_and_size(process_set))


def reducescatter_shape(shape, process_set=None):
    """The shape of this rank's reducescatter result for an input of ``shape``.

    Raises:
        ValueError: a 0-d shape.
    """
    if not shape:
        raise ValueError("reducescatter needs an input with at least one dimension")
    return (reducescatter_rows(shape[0], process_set),) + tuple(shape[1:])


def _where(source):
    """The submit arguments that say where ``source`` lives; records its ready event (called
    after the output was allocated: see ``hvlite.buffers.Source``)."""
    event = NULL if source.event is None else source.event()
    return {"memory": source.memory, "device": source.device, "event": event}


def _submit(op, kind, source, output_shape, output, name, process_set, finish, **args):
    """Allocate the output, then submit; the handle's result is ``finish(result)``."""
    set_id = set_id_of(process_set)
    result, out_pointer = output.new(output_shape)
    done = (lambda h: result) if finish is None else (lambda h: finish(result))
    return submit(op, name or auto_name(kind, process_set), source.dtype, source.shape,
                  source.pointer, out_pointer, (source.keep, result), done,
                  process_set=set_id, **_where(source), **args)


def allreduce(source, output, name=None, op=Average, prescale=1.0, postscale=1.0,
              process_set=None, finish=None):
    """Reduce ``source`` over the set into ``output.new(source.shape)``; returns the handle."""
    return _submit(lib.HVL_ALLREDUCE, "allreduce", source, source.shape, output, name,
                   process_set, finish, reduce_op=op, prescale=float(prescale),
                   postscale=float(postscale))


def broadcast(source, output, root_rank, name=None, process_set=None, finish=None):
    """Root_rank's ``source`` into ``output.new(source.shape)`` on every member."""
    return _submit(lib.HVL_BROADCAST, "broadcast", source, source.shape, output, name,
                   process_set, finish, root_rank=int(root_rank))


def reducescatter(source, output, name=None, op=Average, prescale=1.0, postscale=1.0,
                  process_set=None, finish=None):
    """Reduce ``source`` over the set; this rank's rows go into ``output.new(...)``."""
    shape = reducescatter_shape(source.shape, process_set)
    return _submit(lib.HVL_REDUCESCATTER, "reducescatter", source, shape, output, name,
                   process_set, finish, reduce_op=op, prescale=float(prescale),
                   postscale=float(postscale))


def allgather(source, output, name=None, process_set=None, finish=None):
    """Every member's rows of ``source``, concatenated; the result is ``output.over`` the
    engine's buffer (no copy)."""
    set_id = set_id_of(process_set)

    def done(h):
        shape, owner, _ = result_buffer(h)
        result = output.over(owner, shape)
        return result if finish is None else finish(result)
    return submit(lib.HVL_ALLGATHER, name or auto_name("allgather", process_set), source.dtype,
                  source.shape, source.pointer, NULL, (source.keep,), done, process_set=set_id,
                  **_where(source))


def alltoall(source, output, splits=None, name=None, process_set=None, finish=None):
    """Send ``splits[r]`` rows to member r (equal parts if None); the rows received, in rank
    order, are ``output.over`` the engine's buffer, with the received splits if ``splits``."""
    set_id = set_id_of(process_set)
    size = rank_and_size(process_set)[1]

    def done(h):
        shape, owner, _ = result_buffer(h)
        result = output.over(owner, shape)
        if splits is not None:
            result = (result, received_splits(h, size))
        return result if finish is None else finish(result)
    return submit(lib.HVL_ALLTOALL, name or auto_name("alltoall", process_set), source.dtype,
                  source.shape, source.pointer, NULL, (source.keep,), done, splits=splits,
                  process_set=set_id, **_where(source))
