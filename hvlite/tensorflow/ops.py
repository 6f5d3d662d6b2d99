"""Horovod's TensorFlow collectives on tf.Tensor: eagerly, inside tf.function, in a TF1 graph.

``hvlite.tensorflow`` holds these functions (``hvd.allreduce``, ...). Each is a collective:
every rank of the process set calls it, in the same order. Inside a ``tf.function`` each call
becomes one op that runs at every execution. The ``*_op`` functions are not collectives: they
read this process's topology when they run.

Contract: every function here is a collective: every rank of the process set must call it, in
the same order, with the same name (or every rank with none), dtype and the shape rules of its
op. Inputs are anything ``tf.convert_to_tensor`` takes (tensors, variables, NumPy arrays);
results are new tensors. Inside a ``tf.function`` (or a TF1 graph run by a Session) each call
becomes one stateful op that runs at every execution, with the static shape restored where it
is known; a gradient's collectives run after its forward op's. In a TF1 graph, collectives that
do not depend on each other run in TensorFlow's order, which may differ between ranks: each
blocks one of TensorFlow's threads until every rank has made it (the deadlock check reports it
if the threads run out). ``allreduce``,
``grouped_allreduce``, ``allgather``, ``broadcast``, ``alltoall`` and ``reducescatter`` of
floating-point tensors have gradients, with Horovod's formulas (a migrated model gets the
gradients it got under Horovod): allreduce -> allreduce of the gradient with the same op and
scale factors; allgather -> this rank's rows of the Average-allreduced gradient; broadcast ->
the Average-allreduced gradient on the root, zeros elsewhere; alltoall -> alltoall back with the
received splits; reducescatter -> allgather of the gradient times the scale factors (and times
size for Sum). With L_k the loss on rank k, these are the gradients of sum_k L_k (allreduce,
alltoall), of mean_k L_k (allgather, broadcast) and of size * sum_k L_k (reducescatter).
Errors: ``TypeError`` for an unsupported dtype and ``ValueError`` for bad arguments, raised
before anything is sent; engine errors (``MismatchError`` naming the tensor and the ranks, ...)
are raised as such eagerly and as ``tf.errors.OpError`` with the same message in a graph.
The ``device_*`` arguments are accepted for compatibility; data goes through host memory.
"""
import numpy as np
import tensorflow as tf

from .. import collectives
from .. import ops as _np
from ..basics import rank as _rank
from ..buffers import array_output, array_source
from ..collectives import reduce_op
from ..errors import HvliteNotSupportedError
from ..process_sets import global_process_set, rank_and_size, rank_and_size_by_id
from ._bridge import library, needs_gradient, np_dtype, op_name, run, submit_all, wait_all
from .compression import Compression

__all__ = ["Sum", "Average", "Min", "Max", "Product", "Adasum", "allreduce", "grouped_allreduce",
           "allgather", "grouped_allgather", "broadcast", "alltoall", "reducescatter",
           "grouped_reducescatter", "barrier", "join", "process_set_included_op",
           "size_op", "rank_op", "local_size_op", "local_rank_op"]

Sum = collectives.Sum
"""The reduce op that adds the ranks' tensors (any, for bool)."""
Average = collectives.Average
"""The default reduce op, which adds, then divides by the number of ranks (integers round
toward 0)."""
Min = collectives.Min
"""The reduce op that keeps the smallest value of each element (all, for bool)."""
Max = collectives.Max
"""The reduce op that keeps the largest value of each element (any, for bool)."""
Product = collectives.Product
"""The reduce op that multiplies the ranks' tensors (all, for bool)."""
Adasum = collectives.Adasum
"""The reduce op of Horovod's adaptive summation (float16/32/64, a power-of-2 number of
ranks)."""


def _output(array):
    """Results TensorFlow can adopt through DLPack: engine memory, 64-byte aligned."""
    return array_output(array.dtype, aligned=True)


def _tensor(value):
    tensor = value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)
    np_dtype(tensor.dtype)
    return tensor


def _floating(tensors):
    """True if the op on these tensors needs a gradient: one is floating and a tape may
    record."""
    return any(t.dtype.is_floating for t in tensors) and needs_gradient()


def _floating_part(xs, ys, dys):
    """A group's floating members (the others have no gradient): their positions, inputs,
    outputs and output gradients (zeros where none came)."""
    at = [i for i, x in enumerate(xs) if x.dtype.is_floating]
    dys = [tf.zeros_like(ys[i]) if dys[i] is None else tf.convert_to_tensor(dys[i]) for i in at]
    return at, [xs[i] for i in at], [ys[i] for i in at], dys


def _placed(at, n, grads):
    """The gradients of a group of ``n``: ``grads`` at positions ``at``, None elsewhere."""
    out = [None] * n
    for i, g in zip(at, grads):
        out[i] = g
    return out


def _after(tensors):
    """Order a gradient's collectives after the forward op's: a TF1 graph (Session) runs
    independent ops in any order, and each engine call blocks its thread until every rank has
    made it, so every rank must reach them in one order (no-op eagerly)."""
    return tf.control_dependencies([t for t in tensors if t is not None])


def _group_names(kind, name, n, process_set=None):
    base = op_name(kind, name, process_set)
    return [base] if n == 1 and name else ["%s.%d" % (base, i) for i in range(n)]


def _collective(np_async, tensors, names, out_dtypes):
    """Submit ``np_async(array, name)`` for each tensor in one eager call / one graph op."""
    def np_fn(arrays):
        return wait_all(submit_all(lambda pair: np_async(*pair), list(zip(arrays, names))))
    return run(np_fn, tensors, out_dtypes)


# ---- allreduce ----

def _allreduce_raw(tensors, names, op, pre, post, process_set):
    outs = _collective(lambda a, n: collectives.allreduce(array_source(a), _output(a), n, op, pre,
                                                          post, process_set),
                       tensors, names, [t.dtype for t in tensors])
    for out, t in zip(outs, tensors):
        out.set_shape(t.shape)
    return outs


def _allreduce_group(tensors, names, op, pre, post, process_set):
    if not _floating(tensors):
        return _allreduce_raw(tensors, names, op, pre, post, process_set)

    @tf.custom_gradient
    def forward(*xs):
        ys = _allreduce_raw(list(xs), names, op, pre, post, process_set)

        def grad(*dys):
            if op not in (Sum, Average):
                raise NotImplementedError("allreduce has a gradient for op Sum and Average only")
            at, _, floating_ys, dys = _floating_part(xs, ys, dys)
            with _after(floating_ys):
                return _placed(at, len(xs), _allreduce_group(
                    dys, _group_names("allreduce.grad", None, len(dys), process_set), op, pre,
                    post, process_set))
        return ys, grad
    return list(forward(*tensors))


def _allreduce_when(pred, tensors, names, op, pre, post, process_set):
    """Allreduce ``tensors`` in one op when the boolean scalar ``pred`` is true when it runs,
    else give them back unchanged, sending nothing. ``pred`` must be the same on every rank
    (a step counter's test): the op runs at every step, in the graph's order of collectives,
    so no collective hides in a ``tf.cond`` branch that ranks could reach in other orders.
    No gradient."""
    def np_fn(arrays):
        if not arrays[0]:
            return [np.array(a) for a in arrays[1:]]
        return wait_all(submit_all(
            lambda pair: collectives.allreduce(array_source(pair[0]), _output(pair[0]), pair[1],
                                               op, pre, post, process_set),
            list(zip(arrays[1:], names))))
    outs = run(np_fn, [tf.cast(pred, tf.bool)] + list(tensors), [t.dtype for t in tensors])
    for out, t in zip(outs, tensors):
        out.set_shape(t.shape)
    return outs


def _check_sparse_op(op):
    if op not in (Sum, Average):     # NotImplementedError, as Horovod raises
        raise HvliteNotSupportedError("allreduce of tf.IndexedSlices supports op Sum and Average "
                                      "only; pass sparse_as_dense=True to reduce them as dense "
                                      "tensors")


def _sparse_allreduce(slices, op, pre, post, name, process_set):
    _check_sparse_op(op)
    values, indices = _allgather_group([_tensor(slices.values), _tensor(slices.indices)],
                                       _group_names("allreduce.sparse", name, 2, process_set),
                                       process_set)
    if op == Average:   # true division, as Horovod's: integer values become floats
        values = values / tf.cast(rank_and_size(process_set)[1], values.dtype)
    if pre * post != 1.0:
        values = values * tf.cast(pre * post, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@library
def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduce ``tensor`` element-wise over every rank (default op: Average) and return the result.

    Every rank of the process set must call it, in the same order. Works eagerly, inside a
    ``tf.function`` and in a TF1 graph; floating-point tensors have a gradient (the allreduce
    of the output's gradient with the same op and factors, for Sum and Average).

    Args:
        tensor: a ``tf.Tensor`` (or anything ``tf.convert_to_tensor`` takes), with the same
            shape and dtype on every rank; or ``tf.IndexedSlices``, whose values and indices are
            allgathered (op Sum or Average only).
        average: deprecated (Horovod's); True means Average, False Sum. Use ``op``.
        device_dense: accepted for compatibility; data goes through host memory.
        device_sparse: accepted for compatibility.
        compression: ``Compression.none`` (the default) or ``Compression.fp16``, which sends
            floating-point tensors as float16 (dense tensors only).
        op: ``hvd.Average`` (the default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor: multiply the input by this before the reduction.
        postscale_factor: multiply the result by this after it.
        name: the tensor's name, the same on every rank; generated when None (inside a
            ``tf.function`` from the function's name and the call's position, so every execution
            reuses it).
        process_set: the :class:`~hvlite.process_sets.ProcessSet` to reduce over (default:
            every rank); this rank must be a member.
        ignore_name_scope: accepted for compatibility (hvlite's names never hold TensorFlow's
            name scope).
    Returns:
        A tensor of the same shape and dtype (``tf.IndexedSlices`` for ``tf.IndexedSlices``
        input).
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        ValueError: both ``average`` and ``op`` given, or an unknown op.
        HvliteNotSupportedError: (a ``NotImplementedError``, as Horovod raises) ``tf.IndexedSlices``
            with an op other than Sum and Average; Adasum where it does not apply.
        MismatchError: the ranks disagree on the dtype, shape, op or factors (every rank
            raises, naming the tensor and the ranks); in a graph, a ``tf.errors.OpError`` with the
            same message.
    """
    op = reduce_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, prescale_factor, postscale_factor, name, process_set)
    tensor = _tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    out = _allreduce_group([compressed], [op_name("allreduce", name, process_set)], op, prescale_factor,
                           postscale_factor, process_set)[0]
    return compression.decompress(out, ctx)


@library
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce each tensor of ``tensors`` as :func:`allreduce` does, submitted together so that
    the engine fuses them into as few collectives as it can.

    Every rank must call it with the same list (length, dtypes, shapes), in the same order.
    The arguments not listed here are as for :func:`allreduce`.

    Args:
        tensors: a list of tensors (or ``tf.IndexedSlices``).
        name: a base name; the tensors are named ``<name>.0``, ``<name>.1``, ... (generated
            when None).
    Returns:
        The list of results, in the order of ``tensors``.
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        HvliteError: what the engine reports, as for :func:`allreduce`.
    """
    op = reduce_op(average, op)
    tensors = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if len(dense) < len(tensors):
        _check_sparse_op(op)     # before anything is named or sent
    results = [None] * len(tensors)
    names = _group_names("grouped_allreduce", name, len(tensors), process_set)
    if dense:
        packed = [compression.compress(_tensor(tensors[i])) for i in dense]
        outs = _allreduce_group([p[0] for p in packed], [names[i] for i in dense], op,
                                prescale_factor, postscale_factor, process_set)
        for i, out, (_, ctx) in zip(dense, outs, packed):
            results[i] = compression.decompress(out, ctx)
    for i, t in enumerate(tensors):
        if results[i] is None:
            results[i] = _sparse_allreduce(t, op, prescale_factor, postscale_factor, names[i],
                                           process_set)
    return results


# ---- allgather ----

def _allgather_raw(tensors, names, process_set):
    outs = _collective(lambda a, n: collectives.allgather(array_source(a), _output(a), n,
                                                          process_set),
                       tensors, names, [t.dtype for t in tensors])
    for out, t in zip(outs, tensors):
        if t.shape.rank == 0:
            out.set_shape([rank_and_size(process_set)[1]])
        elif t.shape.rank is not None:
            out.set_shape([None] + t.shape.as_list()[1:])
    return outs


def _dim0(x):
    """Rows of ``x`` as allgather counts them (a 0-d tensor is one row), as an int64 tensor."""
    return tf.cast(tf.size(x) if x.shape.rank == 0 else tf.shape(x)[0], tf.int64)


def _allgather_grads(xs, ys, dys, process_set):
    """Horovod's allgather gradient: the Average-allreduce of each output gradient (``dys``,
    tensors), cut to this rank's rows. One engine call for the gradients, one for every rank's
    row counts."""
    with _after(ys):
        averaged = _allreduce_raw(dys, _group_names("allgather.grad", None, len(dys),
                                                    process_set), Average, 1.0, 1.0, process_set)
    rows = tf.stack([_dim0(x) for x in xs])
    set_rank, set_size = rank_and_size(process_set)
    with _after(averaged):
        all_rows = _allgather_raw([rows], [op_name("allgather.grad.rows", None, process_set)],
                                  process_set)[0]
    before = tf.reduce_sum(tf.reshape(all_rows, [set_size, len(xs)])[:set_rank], axis=0)
    return [tf.reshape(g[before[i]:before[i] + rows[i]], tf.shape(x))
            for i, (x, g) in enumerate(zip(xs, averaged))]


def _allgather_group(tensors, names, process_set):
    if not _floating(tensors):
        return _allgather_raw(tensors, names, process_set)

    @tf.custom_gradient
    def forward(*xs):
        ys = _allgather_raw(list(xs), names, process_set)

        def grad(*dys):
            at, floating_xs, floating_ys, dys = _floating_part(xs, ys, dys)
            return _placed(at, len(xs), _allgather_grads(floating_xs, floating_ys, dys,
                                                         process_set))
        return ys, grad
    return list(forward(*tensors))


@library
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order.

    Every rank of the process set must call it, in the same order. Floating-point tensors have
    Horovod's gradient: this rank's rows of the averaged allreduce of the output's gradient.

    Args:
        tensor: its first dimension may differ between ranks, the other dimensions and the
            dtype must agree; a 0-d tensor counts as one row.
        name: as for :func:`allreduce`.
        ignore_name_scope: as for :func:`allreduce`.
        process_set: the set to gather over (default: every rank).
    Returns:
        The concatenated tensor (its first dimension is the sum of every rank's).
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        HvliteError: what the engine reports, as for :func:`allreduce`.
    """
    return _allgather_group([_tensor(tensor)], [op_name("allgather", name, process_set)], process_set)[0]


@library
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """As :func:`allgather`, for each tensor of ``tensors``, submitted together so that they fuse.

    Every rank must call it with the same number of tensors and dtypes, in the same order.

    Args:
        tensors: a list of tensors.
        name: a base name (``<name>.0``, ``<name>.1``, ...; generated when None).
        ignore_name_scope, process_set: as for :func:`allgather`.
    Returns:
        The list of concatenated tensors.
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        HvliteError: what the engine reports, as for :func:`allreduce`.
    """
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    return _allgather_group(tensors, _group_names("grouped_allgather", name, len(tensors),
                                                  process_set), process_set)


# ---- broadcast ----

def _broadcast_raw(tensors, names, root_rank, process_set):
    outs = _collective(lambda a, n: collectives.broadcast(array_source(a), _output(a), root_rank,
                                                          n, process_set),
                       tensors, names, [t.dtype for t in tensors])
    for out, t in zip(outs, tensors):
        out.set_shape(t.shape)
    return outs


@library
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Return ``root_rank``'s ``tensor`` on every rank.

    Every rank of the process set must call it, in the same order, with the same root.
    Floating-point tensors have Horovod's gradient: the averaged allreduce of the output's
    gradient on the root, zeros elsewhere.

    Args:
        tensor: the same shape and dtype on every rank (only the root's values are used).
        root_rank: the rank whose values every rank gets (a rank of the job, a member of the
            set).
        name: as for :func:`allreduce`.
        ignore_name_scope: as for :func:`allreduce`.
        process_set: the set to broadcast in (default: every rank).
    Returns:
        A tensor with the root's values.
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        HvliteError: what the engine reports, as for :func:`allreduce`.
    """
    tensor = _tensor(tensor)
    names = [op_name("broadcast", name, process_set)]
    if not _floating([tensor]):
        return _broadcast_raw([tensor], names, root_rank, process_set)[0]

    @tf.custom_gradient
    def forward(x):
        y = _broadcast_raw([x], names, root_rank, process_set)[0]

        def grad(dy):
            # Horovod's: the Average-allreduce of the gradient on the root, zeros elsewhere
            with _after([y]):
                averaged = _allreduce_raw([tf.convert_to_tensor(dy)],
                                          [op_name("broadcast.grad", None, process_set)],
                                          Average, 1.0, 1.0, process_set)[0]
            if _rank() == root_rank:
                return averaged
            # zeros that depend on the allreduce, so a TF1 Session still runs it on this rank
            with tf.control_dependencies([averaged]):
                return tf.zeros_like(averaged)
        return y, grad
    return forward(tensor)


# ---- alltoall ----

def _alltoall_raw(tensor, splits, name, process_set):
    def np_fn(arrays):
        array, sp = arrays
        out, received = _np.alltoall(array, splits=sp, name=name, process_set=process_set)
        return [out, received.astype("int32")]
    out, received = run(np_fn, [tensor, splits], [tensor.dtype, tf.int32])
    out.set_shape([None] + tensor.shape.as_list()[1:])
    received.set_shape([rank_and_size(process_set)[1]])
    return out, received


@library
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Send ``splits[r]`` rows of ``tensor`` to rank r, and return the rows every rank sent here,
    in rank order.

    Every rank of the process set must call it, in the same order. Floating-point tensors have
    a gradient: the output's gradient sent back along the received splits.

    Args:
        tensor: at least 1-d; the dimensions after the first and the dtype must agree.
        splits: rows for each rank (one integer per rank, adding up to the first dimension);
            None splits the rows into equal parts, which then must divide evenly.
        name: as for :func:`allreduce`.
        ignore_name_scope: as for :func:`allreduce`.
        process_set: the set to exchange in (default: every rank).
    Returns:
        The rows received; with ``splits`` given, the tuple ``(rows, received_splits)``, the
        second an int32 tensor of how many rows came from each rank, as Horovod returns.
    Raises:
        ValueError: a 0-d tensor, or splits that do not add up to the rows
            (``HvliteInvalidArgument``).
        tf.errors.InvalidArgumentError: no ``splits``, and rows that do not divide evenly.
        MismatchError: the ranks disagree on the dtype or the other dimensions; other errors
            as for :func:`allreduce`.
    """
    both = _alltoall(tensor, splits, name, process_set)
    return both if splits is not None else both[0]


def _alltoall(tensor, splits, name, process_set):
    tensor = _tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        n = rank_and_size(process_set)[1]
        dim0 = tf.shape(tensor, out_type=tf.int64)[0]
        tf.debugging.assert_equal(dim0 % n, tf.constant(0, tf.int64), message=(
            "alltoall without splits needs dim 0 divisible by the number of ranks (%d)" % n))
        splits = tf.fill([n], dim0 // n)
    splits = tf.cast(tf.reshape(splits, [-1]), tf.int64)
    name = op_name("alltoall", name, process_set)
    if not _floating([tensor]):
        return _alltoall_raw(tensor, splits, name, process_set)

    @tf.custom_gradient
    def forward(x):
        out, received = _alltoall_raw(x, splits, name, process_set)

        def grad(dy, _):
            with _after([out]):
                back, _ = _alltoall_raw(tf.convert_to_tensor(dy), tf.cast(received, tf.int64),
                                        op_name("alltoall.grad", None, process_set),
                                        process_set)
            return back
        return (out, received), grad
    return forward(tensor)


# ---- reducescatter ----

def _reducescatter_raw(tensors, names, op, pre, post, process_set):
    outs = _collective(lambda a, n: collectives.reducescatter(
        array_source(a), _output(a), n, op, pre, post, process_set), tensors, names,
        [t.dtype for t in tensors])
    for out, t in zip(outs, tensors):
        dims = t.shape.as_list()
        if dims[0] is not None:
            dims[0] = collectives.reducescatter_rows(dims[0], process_set)
        out.set_shape(dims)
    return outs


def _reducescatter_group(tensors, names, op, pre, post, process_set):
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("reducescatter needs a tensor with at least one dimension")
    if not _floating(tensors):
        return _reducescatter_raw(tensors, names, op, pre, post, process_set)

    @tf.custom_gradient
    def forward(*xs):
        ys = _reducescatter_raw(list(xs), names, op, pre, post, process_set)

        def grad(*dys):
            # Horovod's: the allgather of the gradient, times size for Sum and the scale factors
            if op not in (Sum, Average):
                raise NotImplementedError("reducescatter has a gradient for op Sum and Average "
                                          "only")
            scale = pre * post * (rank_and_size(process_set)[1] if op == Sum else 1)
            at, _, floating_ys, dys = _floating_part(xs, ys, dys)
            if scale != 1.0:
                dys = [dy * tf.cast(scale, dy.dtype) for dy in dys]
            with _after(floating_ys):
                return _placed(at, len(xs), _allgather_raw(
                    dys, _group_names("reducescatter.grad", None, len(dys), process_set),
                    process_set))
        return ys, grad
    return list(forward(*tensors))


@library
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over every rank and return this rank's rows of the result: rank r gets
    ``dim0 // size`` rows, plus one if ``r < dim0 % size``.

    Every rank of the process set must call it, in the same order. Floating-point tensors have
    Horovod's gradient (Sum and Average): the allgather of the output's gradient times the
    factors, and times the set's size for Sum.

    Args:
        tensor: at least 1-d, the same shape and dtype on every rank.
        device_dense: accepted for compatibility.
        compression: as for :func:`allreduce`.
        op: ``hvd.Average`` (the default), ``Sum``, ``Min``, ``Max`` or ``Product``.
        name, process_set, ignore_name_scope, prescale_factor, postscale_factor: as for
            :func:`allreduce`.
    Returns:
        This rank's rows of the reduced tensor.
    Raises:
        ValueError: a 0-d tensor. Others as :func:`allreduce`.
    """
    return grouped_reducescatter([tensor], compression=compression, op=op, name=name,
                                 process_set=process_set, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, _kind="reducescatter")[0]


@library
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None, ignore_name_scope=False,
                          _kind="grouped_reducescatter"):
    """As :func:`reducescatter`, for each tensor of ``tensors``, submitted together so that they
    fuse.

    Every rank must call it with the same list (length, dtypes, shapes), in the same order.
    The arguments not listed here are as for :func:`reducescatter`.

    Args:
        tensors: a list of tensors, each at least 1-d.
        name: a base name (``<name>.0``, ``<name>.1``, ...; generated when None).
    Returns:
        The list of this rank's rows of each reduced tensor.
    Raises:
        ValueError: a 0-d tensor.
        HvliteError: what the engine reports, as for :func:`allreduce`.
    """
    op = reduce_op(None, op)
    packed = [compression.compress(_tensor(t)) for t in tensors]
    if not packed:
        return []
    names = ([op_name(_kind, name, process_set)] if _kind == "reducescatter" else
             _group_names(_kind, name, len(packed), process_set))
    outs = _reducescatter_group([p[0] for p in packed], names, op,
                                prescale_factor, postscale_factor, process_set)
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outs, packed)]


# ---- barrier, join, topology ops ----

@library
def barrier(process_set=global_process_set):
    """Return once every rank of the process set has called ``barrier()``: eagerly, when called;
    in a ``tf.function`` or a TF1 graph, when the op runs.

    Args:
        process_set: the set to wait for (default: every rank).
    Raises:
        HvliteDeadlockError: the other ranks wait on other collectives.
    """
    def np_fn(arrays):
        _np.barrier(process_set=process_set)
        return []
    run(np_fn, [], [])


@library
def join():
    """Declare that this rank has no more data (uneven inputs; see ``hvlite.join``): until every
    rank has joined, this rank takes part in the others' allreduces with zeros (and in their
    barriers); their other collectives raise ``HvliteInvalidArgument``, as in Horovod.

    Eagerly it returns once every rank has joined; in a ``tf.function`` or a TF1 graph it is an
    op that joins when it runs (ordered with the graph's collectives, as they are).

    Returns:
        The rank that joined last, as an int32 scalar tensor.
    """
    def np_fn(arrays):
        return [np.asarray(_np.join(), np.int32)]
    out = run(np_fn, [], [tf.int32])[0]
    out.set_shape([])
    return out


def _topology_op(query, name):
    """An int32 scalar op whose value ``query()`` gives when the op runs (at each run of a graph
    or function, not when it is traced; eagerly: now). Not a collective: no other rank takes
    part, so it stays out of the collectives' order."""
    if tf.executing_eagerly():
        return tf.constant(query(), tf.int32)
    out = tf.numpy_function(lambda: np.asarray(query(), np.int32), [], tf.int32, stateful=True,
                            name=name)
    out.set_shape([])
    return out


def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank is in the process set, else 0, as an int32 scalar op evaluated when it runs
    (eagerly: now).

    Args:
        process_set_id: the set's ``process_set_id`` (0: every rank).
        name: a name for the TensorFlow op.
    Raises:
        HvliteInvalidArgument: (``InvalidArgumentError`` in a graph, when the op runs) no process
            set has this id; Horovod's op returns a negative error code instead.
    """
    return _topology_op(lambda: 1 if rank_and_size_by_id(process_set_id)[0] >= 0 else 0, name)


def size_op(process_set_id=0, name=None):
    """The number of ranks in a process set, as an int32 scalar op evaluated when it runs (eagerly:
    now); not a collective.

    Args:
        process_set_id: the set's ``process_set_id`` (0: the whole job).
        name: a name for the TensorFlow op.
    """
    return _topology_op(lambda: rank_and_size_by_id(process_set_id)[1], name)


def rank_op(name=None):
    """This process's rank in the job, as an int32 scalar op evaluated when it runs (eagerly: now).

    Args:
        name: a name for the TensorFlow op.
    """
    return _topology_op(lambda: rank_and_size_by_id(0)[0], name)


def local_size_op(name=None):
    """The number of the job's ranks on this host, as an int32 scalar op evaluated when it runs
    (eagerly: now).

    Args:
        name: a name for the TensorFlow op.
    """
    from ..basics import local_size
    return _topology_op(local_size, name)


def local_rank_op(name=None):
    """This rank's index among the job's ranks on its host, as an int32 scalar op evaluated when it
    runs (eagerly: now).

    Args:
        name: a name for the TensorFlow op.
    """
    from ..basics import local_rank
    return _topology_op(local_rank, name)
