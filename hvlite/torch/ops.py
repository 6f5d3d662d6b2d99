"""Horovod's torch collectives on the hvlite engine (CPU tensors).

Contract: every function is a collective: every rank calls it, in the same order, with the same
name (or every rank with none), dtype, and the shape rules of its op (see ``hvlite.ops``).
Tensors are passed to the engine by address (``data_ptr``); a non-contiguous input is sent as a
contiguous copy. Results are new tensors, except the in-place ``*_`` forms, which write into
and return their argument. ``*_async`` forms return a handle for ``poll``/``synchronize``.

Autograd: ``allreduce``, ``allgather``, ``broadcast``, ``alltoall`` and ``reducescatter`` are
differentiable. Gradients are those of the sum over ranks of each rank's loss: allreduce's
backward is an allreduce of the gradient with the same op and factors; allgather's is this
rank's rows of a Sum-allreduce of the gradient; broadcast's is a Sum-allreduce of the gradient
on the root and zero elsewhere; alltoall's sends the gradient back along the received splits;
reducescatter's is an allgather of the gradient (divided by size for Average).

Errors: ``TypeError`` for a non-tensor, an unsupported dtype or a CUDA tensor (the NCCL backend
is not built yet: move tensors to the CPU); ``ValueError`` for bad arguments; ``HvliteError``
subclasses for what the engine and the other ranks report.
"""
import torch

from .. import ops as _np_ops
from .._lib import ffi, lib
from ..basics import rank, size
from ..handles import NULL, Handle, auto_name, pointer, result_buffer, submit
from ..process_sets import _set_id, _set_rank_size
from .compression import Compression

Sum, Average, Min, Max, Product = (_np_ops.Sum, _np_ops.Average, _np_ops.Min, _np_ops.Max,
                                   _np_ops.Product)
Adasum = _np_ops.Adasum   # named for compatibility; using it raises ValueError

_DTYPES = {
    torch.uint8: lib.HVL_UINT8, torch.int8: lib.HVL_INT8, torch.int16: lib.HVL_INT16,
    torch.int32: lib.HVL_INT32, torch.int64: lib.HVL_INT64, torch.float16: lib.HVL_FLOAT16,
    torch.bfloat16: lib.HVL_BFLOAT16, torch.float32: lib.HVL_FLOAT32,
    torch.float64: lib.HVL_FLOAT64, torch.bool: lib.HVL_BOOL,
}


def _engine_dtype(tensor):
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        raise TypeError("hvlite does not support dtype %s" % tensor.dtype) from None


def _check_tensor(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("hvlite.torch expects a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.device.type != "cpu":
        raise TypeError("hvlite.torch: %s tensors are not supported yet (the NCCL backend is not "
                        "built); move the tensor to the CPU" % tensor.device.type)
    if tensor.is_sparse:
        raise TypeError("hvlite.torch: sparse tensors are not supported by this op")
    return tensor


def _contiguous(tensor):
    return _check_tensor(tensor).contiguous()


def _ptr(tensor):
    return pointer(tensor.data_ptr()) if tensor.numel() else NULL


def _reduce_op(average, op):
    return _np_ops._reduce_op(average, op)


def _result_tensor(handle, dtype):
    """The engine-owned result of a finished allgather/alltoall as a tensor over that memory
    (no copy; freed with the tensor)."""
    shape, owner, count = result_buffer(handle)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(ffi.buffer(owner, nbytes), dtype=dtype).reshape(shape)


# ---- allreduce ----

def _allreduce_submit(src, out, name, op, prescale, postscale, process_set, finish):
    return submit(lib.HVL_ALLREDUCE, name or auto_name("allreduce", process_set), _engine_dtype(src),
                  tuple(src.shape), _ptr(src), _ptr(out), (src, out), finish, reduce_op=op,
                  prescale=float(prescale), postscale=float(postscale),
                  process_set=_set_id(process_set))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Start an allreduce; the handle's result is a new tensor."""
    src = _contiguous(tensor).detach()
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    return _allreduce_submit(src, out, name, _reduce_op(average, op), prescale_factor,
                             postscale_factor, process_set, lambda h: out)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Start an in-place allreduce of ``tensor`` (its values are replaced on completion)."""
    target = _check_tensor(tensor)
    buf = target.detach() if target.is_contiguous() else target.detach().contiguous()
    return _allreduce_submit(buf, buf, name, _reduce_op(average, op), prescale_factor,
                             postscale_factor, process_set, _inplace_finish(target, buf))


def _inplace_finish(target, buf):
    """The result step of an in-place op: copy back if a contiguous copy was sent, and bump
    the tensor's version so autograd refuses to reuse its old value in a backward pass."""
    def finish(h):
        if buf.data_ptr() != target.data_ptr():
            with torch.no_grad():
                target.copy_(buf)
        else:
            torch.autograd.graph.increment_version(target)
        return target
    return finish


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place allreduce; returns ``tensor``."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return allreduce_async(tensor, None, name, op, prescale, postscale, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (allreduce_async(grad, None, None, op, prescale, postscale, process_set).wait(),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Reduce ``tensor`` over every rank (default op: Average); differentiable.

    Args:
        tensor: CPU tensor, same shape and dtype on every rank.
        average: deprecated; False means Sum.
        name: unique among this rank's pending collectives; generated if None.
        compression: Compression.none or Compression.fp16 (compresses on the wire).
        op: Sum, Average, Min, Max or Product.
        prescale_factor, postscale_factor: multiply the input before / the result after.
        process_set: None (all ranks).
    Returns:
        A new tensor with the reduced values.
    Raises:
        MismatchError: ranks disagree on shape, dtype, op or factors (every rank raises).
    """
    op = _reduce_op(average, op)
    compressed, ctx = compression.compress(_check_tensor(tensor))
    out = _AllreduceFn.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    return _np_ops._submit_group(lambda t, n: allreduce_async(t, average, n, op, prescale_factor,
                                                              postscale_factor, process_set),
                                 tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Allreduce a list of tensors submitted together, so they fuse; differentiable (tensors
    that need gradients go one by one through ``allreduce``)."""
    names = _np_ops._group_names(name, "grouped_allreduce", len(tensors), process_set)
    if any(t.requires_grad for t in tensors):
        return [allreduce(t, average, n, compression, op, prescale_factor, postscale_factor,
                          process_set) for t, n in zip(tensors, names)]
    pairs = [compression.compress(_check_tensor(t)) for t in tensors]
    outs = grouped_allreduce_async([c for c, _ in pairs], average, name, op, prescale_factor,
                                   postscale_factor, process_set).wait()
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    return _np_ops._submit_group(lambda t, n: allreduce_async_(t, average, n, op, prescale_factor,
                                                               postscale_factor, process_set),
                                 tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


# ---- allgather ----

def allgather_async(tensor, name=None, process_set=None):
    """Start an allgather; the result concatenates every rank's tensor along dim 0."""
    src = _contiguous(tensor).detach()
    return submit(lib.HVL_ALLGATHER, name or auto_name("allgather", process_set), _engine_dtype(src),
                  tuple(src.shape), _ptr(src), NULL, (src,),
                  lambda h: _result_tensor(h, src.dtype),
                  process_set=_set_id(process_set))


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.scalar = tensor.dim() == 0
        ctx.process_set = process_set
        return allgather_async(tensor, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce_async(grad, op=Sum, process_set=ctx.process_set).wait()
        rows = allgather_async(torch.tensor([ctx.rows], dtype=torch.int64),
                               process_set=ctx.process_set).wait()
        start = int(rows[:_set_rank_size(ctx.process_set)[0]].sum())
        mine = summed.narrow(0, start, ctx.rows)
        return (mine.reshape(()) if ctx.scalar else mine), None, None


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (which may differ per rank); a 0-d
    tensor counts as one row. Differentiable."""
    return _AllgatherFn.apply(_check_tensor(tensor), name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=None):
    return _np_ops._submit_group(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                                 "grouped_allgather", process_set)


def grouped_allgather(tensors, name=None, process_set=None):
    return grouped_allgather_async(tensors, name, process_set).wait()


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    src = _contiguous(tensor).detach()
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    return submit(lib.HVL_BROADCAST, name or auto_name("broadcast", process_set), _engine_dtype(src),
                  tuple(src.shape), _ptr(src), _ptr(out), (src, out), lambda h: out,
                  root_rank=int(root_rank), process_set=_set_id(process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    target = _check_tensor(tensor)
    buf = target.detach() if target.is_contiguous() else target.detach().contiguous()
    finish = _inplace_finish(target, buf)
    return submit(lib.HVL_BROADCAST, name or auto_name("broadcast", process_set), _engine_dtype(buf),
                  tuple(buf.shape), _ptr(buf), _ptr(buf), (buf, target), finish,
                  root_rank=int(root_rank), process_set=_set_id(process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """In-place broadcast: ``tensor`` takes root_rank's values; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce_async(grad, op=Sum, process_set=ctx.process_set).wait()
        return (summed if rank() == ctx.root else torch.zeros_like(summed)), None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return root_rank's ``tensor`` on every rank; differentiable."""
    return _BroadcastFn.apply(_check_tensor(tensor), root_rank, name, process_set)


# ---- alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=None):
    src = _contiguous(tensor).detach()
    split_list = None if splits is None else [int(s) for s in torch.as_tensor(splits).reshape(-1)]
    n = _set_rank_size(process_set)[1]

    def finish(h):
        out = _result_tensor(h, src.dtype)
        if split_list is None:
            return out
        from ..handles import received_splits
        return out, torch.from_numpy(received_splits(h, n))
    return submit(lib.HVL_ALLTOALL, name or auto_name("alltoall", process_set), _engine_dtype(src),
                  tuple(src.shape), _ptr(src), NULL, (src,), finish, splits=split_list,
                  process_set=_set_id(process_set))


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        n = _set_rank_size(process_set)[1]
        if splits is None:
            splits = [tensor.shape[0] // n] * n
        out, received = alltoall_async(tensor, splits, name, process_set).wait()
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _unused):
        back, _ = alltoall_async(grad, ctx.received, None, ctx.process_set).wait()
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send ``splits[r]`` rows of dim 0 to rank r (equal parts if None); returns the tensor
    received, in rank order, and, when ``splits`` was given, the rows received from each rank.
    Differentiable."""
    out, received = _AlltoallFn.apply(_check_tensor(tensor), splits, name, process_set)
    return out if splits is None else (out, received)


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    src = _contiguous(tensor).detach()
    if src.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    rows = lib.hvl_reducescatter_rows(src.shape[0], *_set_rank_size(process_set))
    out = torch.empty((rows,) + tuple(src.shape[1:]), dtype=src.dtype)
    return submit(lib.HVL_REDUCESCATTER, name or auto_name("reducescatter", process_set), _engine_dtype(src),
                  tuple(src.shape), _ptr(src), _ptr(out), (src, out), lambda h: out,
                  reduce_op=_reduce_op(None, op), prescale=float(prescale_factor),
                  postscale=float(postscale_factor), process_set=_set_id(process_set))


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.args = (op, process_set, prescale * postscale)
        return reducescatter_async(tensor, name, op, process_set, prescale, postscale).wait()

    @staticmethod
    def backward(ctx, grad):
        op, process_set, scale = ctx.args
        full = allgather_async(grad, process_set=process_set).wait()
        if op == Average:
            scale /= _set_rank_size(process_set)[1]
        return (full * scale if scale != 1.0 else full), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=None, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over every rank (default Average) and return this rank's rows of dim 0
    (dim0 // size, plus one if rank < dim0 % size). Differentiable."""
    compressed, ctx = compression.compress(_check_tensor(tensor))
    out = _ReducescatterFn.apply(compressed, name, _reduce_op(None, op), process_set,
                                 prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=None,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    names = _np_ops._group_names(name, "grouped_reducescatter", len(tensors), process_set)
    return [reducescatter(t, n, compression, op, process_set, prescale_factor, postscale_factor)
            for t, n in zip(tensors, names)]


# ---- barrier, handles ----

barrier = _np_ops.barrier


def join(device=-1, process_set=None):
    """Declare that this rank has no more batches; see ``hvlite.join``. ``device`` is accepted
    for Horovod compatibility (CPU only). Returns the rank that joined last."""
    return _np_ops.join(process_set)


def poll(handle):
    """True if the async collective behind ``handle`` has finished."""
    return handle.poll()


def synchronize(handle):
    """Wait for an async collective and return its result (raises its error)."""
    if not isinstance(handle, (Handle, _np_ops._Group)):
        raise TypeError("synchronize() expects a handle from an *_async call")
    return handle.wait()
