"""Horovod's torch collectives on the hvlite engine (CPU and CUDA tensors).

``hvlite.torch`` holds these functions (``hvd.allreduce``, ...). Each is a collective: every
rank of the process set calls it, in the same order. The blocking forms return a new tensor on
the input's device, and most are differentiable; the ``_async`` forms return a handle for
``hvd.synchronize``; the in-place ``_`` forms write into their argument.

Contract: every function is a collective: every rank calls it, in the same order, with the same
name (or every rank with none), dtype, and the shape rules of its op (see ``hvlite.ops``).
Tensors are passed to the engine by address (``data_ptr``); a non-contiguous input is sent as a
contiguous copy. Results are new tensors (from 1 MiB, tensors over engine memory that the
engine reuses from call to call, already faulted in: see ``hvlite.buffers``), except the
in-place ``*_`` forms, which write into and return their argument. ``*_async`` forms return a
handle for ``poll``/``synchronize``. The submitting is ``hvlite.collectives``; this module
adds what is torch's: tensors as sources, the output allocator, autograd and compression.

Autograd: ``allreduce``, ``allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and their
grouped forms are differentiable, with Horovod's documented gradients (what a migrated script
trains with). With ``n`` the process set's size and ``g`` each rank's output gradient:
allreduce: an allreduce of ``g`` with the same op and factors; allgather: this rank's rows of
the *averaged* allreduce of ``g``; broadcast: the averaged allreduce of ``g`` on the root, zero
elsewhere; alltoall: ``g`` sent back along the received splits; reducescatter: the allgather of
``g`` times the factors, and times ``n`` for Sum. Relative to the gradient of the sum over ranks
of each rank's loss, these are equal for allreduce and alltoall, ``1/n`` of it for allgather
and broadcast, and ``n`` times it for reducescatter (so reducescatter then allgather has
allreduce's gradient). Backward passes are collectives too: every rank runs them, same order.
Under ``create_graph=True`` (grad mode on in backward) they call these differentiable functions,
so second-order gradients (a gradient penalty) go through the collectives too; otherwise the
non-differentiable ``_async`` forms, which skip autograd's bookkeeping.

CUDA tensors: results come back on the input's device. At submit an event is recorded on the
current stream of the tensor's device (after the output is allocated), which the engine's copies
wait for on the engine's own stream; when the handle completes the result is written, for any
stream. Every rank of the set must use the same kind of memory for a tensor (else MismatchError
on every rank). A collective of CUDA tensors inside a CUDA graph capture is refused at submit
(``HvliteNotSupportedError``): the engine runs it on its own stream, outside any graph.

Errors: ``TypeError`` for a non-tensor, an unsupported dtype or a tensor on another device kind
(neither CPU nor CUDA); ``ValueError`` for bad arguments; ``HvliteError`` subclasses for what the
engine and the other ranks report (a CUDA tensor on a machine without the CUDA driver fails at
submit).
"""
import torch

from .. import collectives
from .. import ops as _np_ops
from ..basics import rank
from ..collectives import Adasum, Average, Max, Min, Product, Sum, reduce_op  # noqa: F401 - torch's names
from ..errors import HvliteInvalidArgument
from ..handles import Group, Handle, auto_name, burst, wait_all
from ..process_sets import rank_and_size
from .compression import Compression
from .tensors import _check_tensor, _in_place, _needs_graph, _output, _source, _submit_group

# ---- allreduce ----

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """As :func:`allreduce`, but returns at once with a handle; :func:`synchronize` gives the new
    tensor. Not differentiable, and takes no ``compression``.
    """
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.allreduce(_source(src), _output(src), name, reduce_op(average, op),
                                 prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """As :func:`allreduce_async`, but the result is written into ``tensor``; :func:`synchronize`
    returns ``tensor``.
    """
    op = reduce_op(average, op)
    source, output, finish = _in_place(tensor)
    return collectives.allreduce(source, output, name, op, prescale_factor, postscale_factor,
                                 process_set, finish)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """As :func:`allreduce`, but the result is written into ``tensor``, which is returned. Not
    differentiable: autograd does not record it (and refuses a backward pass that needs the
    overwritten values).
    """
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
        if torch.is_grad_enabled():     # create_graph: the gradient's graph goes through it too
            return (allreduce(grad, op=op, prescale_factor=prescale, postscale_factor=postscale,
                              process_set=process_set), None, None, None, None, None)
        return (allreduce_async(grad, None, None, op, prescale, postscale, process_set).wait(),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Reduce ``tensor`` element-wise over every rank and return the result; differentiable.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a CPU or CUDA tensor of a supported dtype, with the same shape, dtype and kind
            of memory on every rank. A non-contiguous tensor is sent as a contiguous copy.
        average: deprecated (Horovod's); False means ``op=Sum``. Use ``op``.
        name: the tensor's name, unique among this rank's collectives not yet synchronized;
            generated when None (then every rank must leave it None).
        compression: ``Compression.none`` (the default) or ``Compression.fp16``, which sends
            floating-point tensors as float16 and returns the result in ``tensor``'s dtype.
        op: ``hvd.Average`` (the default), ``Sum``, ``Min``, ``Max``, ``Product`` or
            ``Adasum``.
        prescale_factor: multiply the input by this before the reduction.
        postscale_factor: multiply the result by this after it.
        process_set: the :class:`~hvlite.process_sets.ProcessSet` to reduce over (None: every
            rank); this rank must be a member.
    Returns:
        A new tensor with the reduced values, of ``tensor``'s shape and dtype, on its device.
        Its gradient is the allreduce of the output's gradient with the same op and factors.
    Raises:
        TypeError: not a tensor, an unsupported dtype, or a device that is neither CPU nor CUDA.
        ValueError: both ``average`` and ``op`` given, or an unknown op.
        MismatchError: the ranks disagree on the dtype, shape, op, factors or kind of memory
            (every rank raises, naming the tensor and the ranks).
        HvliteInvalidArgument: the name is in flight on this rank, or this rank is not in
            ``process_set``.
        HvliteNotSupportedError: Adasum on a dtype or set it does not run on; a CUDA tensor
            inside a CUDA graph capture.
    """
    op = reduce_op(average, op)
    compressed, ctx = compression.compress(_check_tensor(tensor))
    if _needs_graph(compressed):
        out = _AllreduceFn.apply(compressed, name, op, prescale_factor, postscale_factor,
                                 process_set)
    else:
        out = allreduce_async(compressed, None, name, op, prescale_factor, postscale_factor,
                              process_set).wait()
    return compression.decompress(out, ctx)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """As :func:`grouped_allreduce`, but returns at once with one handle for the whole group;
    :func:`synchronize` gives the list of results. Not differentiable, no ``compression``.
    """
    return _submit_group(lambda t, n: allreduce_async(t, average, n, op, prescale_factor,
                                                      postscale_factor, process_set),
                         tensors, name, "grouped_allreduce", process_set)


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, args, *tensors):
        name, op, prescale, postscale, process_set = args
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(grouped_allreduce_async(list(tensors), None, name, op, prescale, postscale,
                                             process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        if torch.is_grad_enabled():
            return (None, *grouped_allreduce(list(grads), op=op, prescale_factor=prescale,
                                             postscale_factor=postscale, process_set=process_set))
        return (None, *grouped_allreduce_async(list(grads), None, None, op, prescale, postscale,
                                               process_set).wait())


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Allreduce each tensor of ``tensors`` as :func:`allreduce` does, submitted together so that
    the engine fuses them into as few collectives as it can; differentiable.

    Args:
        tensors: a list of tensors, all on one device (each may have its own shape and dtype).
        name: a base name; the tensors are named ``<name>.0``, ``<name>.1``, ... (generated
            when None).
        average, compression, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce`.
    Returns:
        The list of results, in the order of ``tensors``.
    Raises:
        HvliteInvalidArgument: tensors on more than one device (nothing is sent). Otherwise as
            :func:`allreduce`.
    """
    op = reduce_op(average, op)
    pairs = [compression.compress(_check_tensor(t)) for t in tensors]
    outs = _GroupedAllreduceFn.apply((name, op, prescale_factor, postscale_factor, process_set),
                                     *[c for c, _ in pairs])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """As :func:`grouped_allreduce_async`, but each result is written into its tensor;
    :func:`synchronize` returns the list of ``tensors``.
    """
    return _submit_group(lambda t, n: allreduce_async_(t, average, n, op, prescale_factor,
                                                       postscale_factor, process_set),
                         tensors, name, "grouped_allreduce", process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """As :func:`grouped_allreduce`, but each result is written into its tensor; returns the list
    of ``tensors``. Not differentiable.
    """
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


# ---- sparse allreduce ----

class _SparseHandle:
    """Handle of ``sparse_allreduce_async``: call it (as Horovod's is called) or pass it to
    ``synchronize``/``poll``; the result is a coalesced sparse tensor."""

    __slots__ = ("_indices", "_values", "_shape", "_divisor", "_result")

    def __init__(self, indices, values, shape, divisor):
        self._indices, self._values, self._shape = indices, values, shape
        self._divisor, self._result = divisor, None

    def poll(self):
        return self._indices.poll() and self._values.poll()

    def wait(self):
        if self._result is None:
            indices, values = wait_all([self._indices, self._values])
            if self._divisor != 1:
                values = values / self._divisor
            # the indices came from other ranks: check them before torch trusts them
            self._result = torch.sparse_coo_tensor(indices.t(), values, self._shape,
                                                   check_invariants=True).coalesce()
        return self._result

    __call__ = wait


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=None):
    """Start the allreduce of a sparse COO tensor: every rank's indices and values are
    allgathered (named ``<name>.indices`` and ``<name>.values``), then summed, or averaged over
    the set's size for Average, when the handle is called (or synchronized).

    Args:
        tensor: a sparse COO tensor (CPU or CUDA), same dense shape on every rank (any number of
            non-zeros).
        name: unique among this rank's pending collectives; generated if None.
        op: Average or Sum.
        process_set: None (all ranks) or a ProcessSet this rank is in.
    Returns:
        A handle; ``handle()`` returns the reduced sparse tensor.
    Raises:
        TypeError: not a sparse tensor.
        ValueError: an op other than Sum and Average.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse COO tensor, got %s"
                        % (tensor.layout if isinstance(tensor, torch.Tensor)
                           else type(tensor).__name__))
    op = reduce_op(None, op)
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async supports op=Sum or op=Average")
    name = name or auto_name("sparse_allreduce", process_set)
    tensor = tensor.coalesce()
    with burst():
        indices = allgather_async(tensor.indices().t().contiguous(), name + ".indices",
                                  process_set)
        values = allgather_async(tensor.values(), name + ".values", process_set)
    divisor = rank_and_size(process_set)[1] if op == Average else 1
    return _SparseHandle(indices, values, tensor.shape, divisor)


# ---- allgather ----

def allgather_async(tensor, name=None, process_set=None):
    """As :func:`allgather`, but returns at once with a handle for :func:`synchronize`. Not
    differentiable.
    """
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.allgather(_source(src), _output(src), name, process_set)


def _rows(tensor):
    return tensor.shape[0] if tensor.dim() else 1      # a 0-d tensor counts as one row


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.scalar, ctx.process_set = [_rows(tensor)], tensor.dim() == 0, process_set
        return allgather_async(tensor, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        mine, = _gathered_gradients(ctx, [grad])
        return (mine.reshape(()) if ctx.scalar else mine), None, None


class _GroupedAllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows, ctx.process_set = [_rows(t) for t in tensors], process_set
        ctx.scalars = [t.dim() == 0 for t in tensors]
        return tuple(grouped_allgather_async(list(tensors), name, process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        mine = _gathered_gradients(ctx, grads)
        return (None, None, *[m.reshape(()) if s else m for m, s in zip(mine, ctx.scalars)])


def _gathered_gradients(ctx, grads):
    """Horovod's allgather gradient: this rank's rows of the averaged allreduce of each output
    gradient. The other ranks' row counts are gathered here, as backward needs them."""
    process_set = ctx.process_set
    rows = torch.tensor(ctx.rows, dtype=torch.int64)
    if torch.is_grad_enabled():     # create_graph: through the differentiable allreduce
        averaged = grouped_allreduce(list(grads), op=Average, process_set=process_set)
        counts = allgather_async(rows, process_set=process_set).wait()
    else:
        with burst():
            averaged = [allreduce_async(g, op=Average, process_set=process_set) for g in grads]
            counts = allgather_async(rows, process_set=process_set)
        *averaged, counts = wait_all(averaged + [counts])
    me, n = rank_and_size(process_set)
    starts = counts.reshape(n, len(grads))[:me].sum(0).tolist()
    return [a.narrow(0, start, rows) for a, start, rows in zip(averaged, starts, ctx.rows)]


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order;
    differentiable.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a CPU or CUDA tensor; its first dimension may differ between ranks, the others
            and the dtype must agree. A 0-d tensor counts as one row.
        name: as for :func:`allreduce`.
        process_set: the set to gather over (None: every rank).
    Returns:
        A new tensor holding every rank's rows. Its gradient is this rank's rows of the
        averaged allreduce of the output's gradient, as in Horovod.
    Raises:
        TypeError: not a tensor, or an unsupported dtype or device.
        MismatchError: the ranks disagree on the dtype or the other dimensions.
        HvliteInvalidArgument: as for :func:`allreduce`, or a rank has joined.
    """
    if _needs_graph(_check_tensor(tensor)):
        return _AllgatherFn.apply(tensor, name, process_set)
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather_async(tensors, name=None, process_set=None):
    """As :func:`grouped_allgather`, but returns at once with one handle for the whole group;
    :func:`synchronize` gives the list of results. Not differentiable.
    """
    return _submit_group(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                         "grouped_allgather", process_set)


def grouped_allgather(tensors, name=None, process_set=None):
    """As :func:`allgather`, for each tensor of ``tensors`` (all on one device), submitted
    together so that they fuse; returns the list of results. Differentiable like
    :func:`allgather`.
    """
    return list(_GroupedAllgatherFn.apply(name, process_set,
                                          *[_check_tensor(t) for t in tensors]))


# ---- broadcast ----

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """As :func:`broadcast`, but returns at once with a handle for :func:`synchronize`. Not
    differentiable.
    """
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.broadcast(_source(src), _output(src), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """As :func:`broadcast_`, but returns at once with a handle for :func:`synchronize`."""
    source, output, finish = _in_place(tensor)
    return collectives.broadcast(source, output, root_rank, name, process_set, finish)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """As :func:`broadcast`, but ``tensor`` takes the root's values and is returned. Not
    differentiable.
    """
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        """Horovod's: the averaged allreduce of the gradient on the root, zero elsewhere."""
        if torch.is_grad_enabled():
            averaged = allreduce(grad, op=Average, process_set=ctx.process_set)
        else:
            averaged = allreduce_async(grad, op=Average, process_set=ctx.process_set).wait()
        return (averaged if rank() == ctx.root else torch.zeros_like(averaged)), None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return ``root_rank``'s ``tensor`` on every rank; differentiable.

    Every rank of the process set must call it, in the same order, with the same root.

    Args:
        tensor: a CPU or CUDA tensor of the same shape and dtype on every rank (the values of
            ranks other than the root are not used).
        root_rank: the rank whose values every rank gets (a rank of the job, a member of the
            set).
        name: as for :func:`allreduce`.
        process_set: the set to broadcast in (None: every rank).
    Returns:
        A new tensor with the root's values. Its gradient is the averaged allreduce of the
        output's gradient on the root, and zero elsewhere, as in Horovod.
    Raises:
        MismatchError: the ranks disagree on the dtype, shape or root.
        HvliteInvalidArgument: as for :func:`allreduce`, or a rank has joined.
    """
    if _needs_graph(_check_tensor(tensor)):
        return _BroadcastFn.apply(tensor, root_rank, name, process_set)
    return broadcast_async(tensor, root_rank, name, process_set).wait()


# ---- alltoall ----

def _split_list(splits, name):
    """Row counts as Python ints; splits given as floating-point or bool values are refused (as
    Horovod does) before any value is converted."""
    splits = torch.as_tensor(splits)
    if splits.is_floating_point() or splits.is_complex() or splits.dtype == torch.bool:
        raise HvliteInvalidArgument("alltoall%s: splits must be integers, got %s"
                                    % (" '%s'" % name if name else "", splits.dtype))
    return splits.reshape(-1).tolist()         # one read of splits on a GPU, not one per row


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """As :func:`alltoall`, but returns at once with a handle for :func:`synchronize`, which
    gives the received tensor, or ``(tensor, received_splits)`` when ``splits`` was given. Not
    differentiable.
    """
    src = _check_tensor(tensor).contiguous().detach()
    split_list = None if splits is None else _split_list(splits, name)
    # the received splits come back where the splits were (Horovod's GPU tests expect that)
    where = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")
    finish = None if splits is None else (lambda r: (r[0], torch.from_numpy(r[1]).to(where)))
    return collectives.alltoall(_source(src), _output(src), split_list, name, process_set,
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
        if torch.is_grad_enabled():
            back, _ = alltoall(grad, ctx.received, process_set=ctx.process_set)
        else:
            back, _ = alltoall_async(grad, ctx.received, None, ctx.process_set).wait()
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send rows of ``tensor`` to every rank and return the rows every rank sent here;
    differentiable.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a CPU or CUDA tensor; its rows (first dimension) are sent in rank order.
        splits: how many rows go to each rank (integers, one per rank, as a list or a tensor);
            None splits the rows into equal parts, which then must divide evenly.
        name: as for :func:`allreduce`.
        process_set: the set to exchange in (None: every rank).
    Returns:
        The rows received, concatenated in rank order; with ``splits``, the tuple
        ``(tensor, received_splits)``, the rows that came from each rank (on ``splits``'s
        device), as Horovod returns. The gradient goes back along the received splits.
    Raises:
        HvliteInvalidArgument: floating-point or bool ``splits``.
        ValueError: splits that do not add up to the rows, or rows that do not divide evenly.
        MismatchError: the ranks disagree on the dtype or the other dimensions.
    """
    out, received = _AlltoallFn.apply(_check_tensor(tensor), splits, name, process_set)
    return out if splits is None else (out, received)


# ---- reducescatter ----

def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """As :func:`reducescatter`, but returns at once with a handle for :func:`synchronize`. Not
    differentiable, no ``compression``.
    """
    src = _check_tensor(tensor).contiguous().detach()
    return collectives.reducescatter(_source(src), _output(src), name, reduce_op(None, op),
                                     prescale_factor, postscale_factor, process_set)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    """As :func:`grouped_reducescatter`, but returns at once with one handle for the whole group;
    :func:`synchronize` gives the list of results. Not differentiable, no ``compression``.
    """
    return _submit_group(lambda t, n: reducescatter_async(t, n, op, process_set, prescale_factor,
                                                          postscale_factor),
                         tensors, name, "grouped_reducescatter", process_set)


class _ReducescatterFn(torch.autograd.Function):
    """One tensor (``grouped`` False: named as given) or a group (``<name>.<i>``)."""

    @staticmethod
    def forward(ctx, args, *tensors):
        grouped, name, op, process_set, prescale, postscale = args
        scale = prescale * postscale
        ctx.scale = scale * rank_and_size(process_set)[1] if op == Sum else scale
        ctx.grouped, ctx.process_set = grouped, process_set
        if not grouped:
            return reducescatter_async(tensors[0], name, op, process_set, prescale,
                                       postscale).wait(),
        return tuple(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale,
                                                 postscale).wait())

    @staticmethod
    def backward(ctx, *grads):
        """Horovod's: the allgather of each gradient, times the factors (and the size for Sum)."""
        if ctx.scale != 1.0:
            grads = [g * ctx.scale for g in grads]
        if torch.is_grad_enabled():
            if not ctx.grouped:
                return None, allgather(grads[0], process_set=ctx.process_set)
            return (None, *grouped_allgather(list(grads), process_set=ctx.process_set))
        if not ctx.grouped:
            return None, allgather_async(grads[0], process_set=ctx.process_set).wait()
        return (None, *grouped_allgather_async(list(grads), process_set=ctx.process_set).wait())


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over every rank and return this rank's share of the rows;
    differentiable.

    Every rank of the process set must call it, in the same order.

    Args:
        tensor: a CPU or CUDA tensor of the same shape and dtype on every rank.
        name: as for :func:`allreduce`.
        compression: as for :func:`allreduce`.
        op: ``hvd.Average`` (the default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        process_set: the set to reduce over (None: every rank).
        prescale_factor, postscale_factor: as for :func:`allreduce`.
    Returns:
        A new tensor holding rank r's rows of the result (``dim0 // size`` rows, plus one if
        ``r < dim0 % size``). Its gradient is the allgather of the output's gradient times the
        factors (and times the set's size for Sum), as in Horovod.
    Raises:
        HvliteNotSupportedError: the op is Adasum. Otherwise as for :func:`allreduce`.
    """
    compressed, ctx = compression.compress(_check_tensor(tensor))
    out, = _ReducescatterFn.apply((False, name, reduce_op(None, op), process_set, prescale_factor,
                                   postscale_factor), compressed)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """As :func:`reducescatter`, for each tensor of ``tensors`` (all on one device), submitted
    together so that they fuse; returns the list of results. Differentiable like
    :func:`reducescatter`.
    """
    pairs = [compression.compress(_check_tensor(t)) for t in tensors]
    outs = _ReducescatterFn.apply((True, name, reduce_op(None, op), process_set, prescale_factor,
                                   postscale_factor), *[c for c, _ in pairs])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


# ---- barrier, handles ----

barrier = _np_ops.barrier
"""Return once every rank of the process set has called ``barrier(process_set=None)``; as
:func:`hvlite.barrier`."""


def join(device=-1, process_set=None):
    """Declare that this rank has no more batches (uneven inputs), as :func:`hvlite.join` does:
    until every rank has joined, this rank takes part in the others' allreduces with zeros.

    Args:
        device: accepted for Horovod compatibility; the engine needs no device for it.
        process_set: the set whose ranks join (None: every rank).
    Returns:
        The rank that joined last.
    """
    return _np_ops.join(process_set)


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
        handle: what an ``_async`` function (or :func:`sparse_allreduce_async`) returned.
    Returns:
        The result the blocking form would have returned.
    Raises:
        TypeError: ``handle`` is not a handle; otherwise the collective's own error.
    """
    if not isinstance(handle, (Handle, Group, _SparseHandle)):
        raise TypeError("synchronize() expects a handle from an *_async call")
    return handle.wait()
