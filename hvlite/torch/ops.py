"""Horovod's torch collectives on the hvlite engine (CPU tensors).

Contract: every function is a collective: every rank calls it, in the same order, with the same
name (or every rank with none), dtype, and the shape rules of its op (see ``hvlite.ops``).
Tensors are passed to the engine by address (``data_ptr``); a non-contiguous input is sent as a
contiguous copy. Results are new tensors (from 1 MiB, tensors over engine memory that the
engine reuses from call to call, already faulted in: see ``hvlite.buffers``), except the
in-place ``*_`` forms, which write into and return their argument. ``*_async`` forms return a
handle for ``poll``/``synchronize``. The submitting is ``hvlite.collectives``; this module
adds what is torch's: tensors as sources, the output allocator, autograd and compression.

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
import math

import torch

from .. import buffers, collectives
from .. import ops as _np_ops
from ..basics import rank, size
from ..buffers import NULL, allocate, memory, pointer
from ..collectives import Adasum, Average, InPlace, Max, Min, Product, Source, Sum, reduce_op
from ..dtypes import by_name
from ..handles import Group, Handle, group_names, submit_group
from ..process_sets import rank_and_size
from .compression import Compression

_CODES = {}                 # torch.dtype -> engine code, filled on first use


def _engine_dtype(tensor):
    try:
        return _CODES[tensor.dtype]
    except KeyError:
        code = _CODES[tensor.dtype] = by_name(str(tensor.dtype).replace("torch.", ""))
        return code


def _check_tensor(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("hvlite.torch expects a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.device.type != "cpu":
        raise TypeError("hvlite.torch: %s tensors are not supported yet (the NCCL backend is not "
                        "built); move the tensor to the CPU" % tensor.device.type)
    if tensor.is_sparse:
        raise TypeError("hvlite.torch: sparse tensors are not supported by this op")
    return tensor


def _ptr(tensor):
    return pointer(tensor.data_ptr()) if tensor.numel() else NULL


def _source(tensor):
    """The engine's view of a contiguous, detached CPU tensor."""
    return Source(_ptr(tensor), _engine_dtype(tensor), tuple(tensor.shape), tensor)


class _TensorOutput:
    """Output allocator of torch results of one dtype (see hvlite.collectives): from
    ``buffers.ENGINE_MEMORY_MIN`` bytes a fresh result is a tensor over engine memory, which
    the engine reuses from call to call already faulted in; below, ``torch.empty`` is cheaper
    (2 us against 4 us) and measured no page faults (see hvlite.buffers)."""

    __slots__ = ("dtype", "itemsize")

    def __init__(self, dtype):
        self.dtype = dtype
        self.itemsize = dtype.itemsize

    def new(self, shape):
        nbytes = math.prod(shape) * self.itemsize
        if nbytes < buffers.ENGINE_MEMORY_MIN:
            out = torch.empty(shape, dtype=self.dtype)
            return out, _ptr(out)
        owner = allocate(nbytes)
        return self.over(owner, shape), owner

    def over(self, owner, shape):
        nbytes = math.prod(shape) * self.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=self.dtype)
        return torch.frombuffer(memory(owner, nbytes), dtype=self.dtype).reshape(shape)


_outputs = {}


def _output(dtype):
    output = _outputs.get(dtype)
    if output is None:
        output = _outputs[dtype] = _TensorOutput(dtype)
    return output


def _in_place(tensor):
    """(source, output, finish) of an in-place call: a non-contiguous tensor is sent as a
    contiguous copy and the result copied back; the tensor's version is bumped so autograd
    refuses to reuse its old value in a backward pass."""
    target = _check_tensor(tensor)
    buf = target.detach() if target.is_contiguous() else target.detach().contiguous()
    source = _source(buf)

    def finish(result):
        if buf.data_ptr() != target.data_ptr():
            with torch.no_grad():
                target.copy_(buf)
        else:
            torch.autograd.graph.increment_version(target)
        return target
    return source, InPlace(target, source.pointer), finish


# ---- allreduce ----

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Start an allreduce; the handle's result is a new tensor."""
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.allreduce(_source(src), _output(src.dtype), name, reduce_op(average, op),
                                 prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Start an in-place allreduce of ``tensor`` (its values are replaced on completion)."""
    op = reduce_op(average, op)
    source, output, finish = _in_place(tensor)
    return collectives.allreduce(source, output, name, op, prescale_factor, postscale_factor,
                                 process_set, finish)


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
    op = reduce_op(average, op)
    compressed, ctx = compression.compress(_check_tensor(tensor))
    out = _AllreduceFn.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    return submit_group(lambda t, n: allreduce_async(t, average, n, op, prescale_factor,
                                                     postscale_factor, process_set),
                        tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Allreduce a list of tensors submitted together, so they fuse; differentiable (tensors
    that need gradients go one by one through ``allreduce``)."""
    names = group_names(name, "grouped_allreduce", len(tensors), process_set)
    if any(t.requires_grad for t in tensors):
        return [allreduce(t, average, n, compression, op, prescale_factor, postscale_factor,
                          process_set) for t, n in zip(tensors, names)]
    pairs = [compression.compress(_check_tensor(t)) for t in tensors]
    outs = grouped_allreduce_async([c for c, _ in pairs], average, name, op, prescale_factor,
                                   postscale_factor, process_set).wait()
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


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
    """Start an allgather; the result concatenates every rank's tensor along dim 0."""
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.allgather(_source(src), _output(src.dtype), name, process_set)


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
        start = int(rows[:rank_and_size(ctx.process_set)[0]].sum())
        mine = summed.narrow(0, start, ctx.rows)
        return (mine.reshape(()) if ctx.scalar else mine), None, None


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along dim 0 (which may differ per rank); a 0-d
    tensor counts as one row. Differentiable."""
    return _AllgatherFn.apply(_check_tensor(tensor), name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=None):
    return submit_group(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                        "grouped_allgather", process_set)


def grouped_allgather(tensors, name=None, process_set=None):
    return grouped_allgather_async(tensors, name, process_set).wait()


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.broadcast(_source(src), _output(src.dtype), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    source, output, finish = _in_place(tensor)
    return collectives.broadcast(source, output, root_rank, name, process_set, finish)


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
    src = _check_tensor(tensor).contiguous().detach()
    split_list = None if splits is None else [int(s) for s in torch.as_tensor(splits).reshape(-1)]
    finish = None if splits is None else (lambda r: (r[0], torch.from_numpy(r[1])))
    return collectives.alltoall(_source(src), _output(src.dtype), split_list, name, process_set,
                                finish)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        n = rank_and_size(process_set)[1]
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
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.reducescatter(_source(src), _output(src.dtype), name, reduce_op(None, op),
                                     prescale_factor, postscale_factor, process_set)


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
            scale /= rank_and_size(process_set)[1]
        return (full * scale if scale != 1.0 else full), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=None, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over every rank (default Average) and return this rank's rows of dim 0
    (dim0 // size, plus one if rank < dim0 % size). Differentiable."""
    compressed, ctx = compression.compress(_check_tensor(tensor))
    out = _ReducescatterFn.apply(compressed, name, reduce_op(None, op), process_set,
                                 prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=None,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    names = group_names(name, "grouped_reducescatter", len(tensors), process_set)
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
    if not isinstance(handle, (Handle, Group)):
        raise TypeError("synchronize() expects a handle from an *_async call")
    return handle.wait()
