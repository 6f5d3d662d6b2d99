"""Gradients of hvlite.tensorflow's collectives follow Horovod's formulas, on every rank.

Each rank's loss is L_k = sum(y_k * w_k + y_k**2 / 2) of the op's output y_k, so the output
gradient is dy_k = w_k + y_k. Horovod's gradients, checked two ways:
- against the formula computed in NumPy from every rank's inputs (allgather: the average over
  ranks of dy, this rank's rows; broadcast: that average on the root, zeros elsewhere;
  reducescatter: the allgather of dy, times size for Sum, times the scale factors), eagerly,
  inside tf.function and in a TF1 graph run by a Session;
- against central finite differences of the scalar each formula is the gradient of:
  mean_k L_k for allgather and broadcast, size * sum_k L_k for reducescatter (both ops).
SPMD: run by hvlrun at 2 and 3 ranks (tests/test_spmd.py).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

import hvlite.tensorflow as hvd  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

RANK, SIZE = hvd.rank(), hvd.size()
MODES = ["eager", "function", "session"]


def uniform(seed, shape_of_rank):
    """Every rank's float64 values (each rank can compute all of them)."""
    return [np.random.default_rng([seed, r]).uniform(-1, 1, shape_of_rank(r))
            for r in range(SIZE)]


def loss(y, w):
    return tf.reduce_sum(y * w + y * y / 2)


def gradient(mode, op, x, w):
    """d loss(op(x), w) / dx on this rank, computed in ``mode``."""
    def body(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = loss(op(x), w)
        return tape.gradient(out, x)
    if mode == "eager":
        return body(tf.constant(x), tf.constant(w)).numpy()
    if mode == "function":
        fn = tf.function(body)
        first = fn(tf.constant(x), tf.constant(w)).numpy()
        np.testing.assert_array_equal(fn(tf.constant(x), tf.constant(w)).numpy(), first)
        return first
    with context.graph_mode(), tf.Graph().as_default():
        xt, wt = tf.constant(x), tf.constant(w)
        g = tf.gradients(loss(op(xt), wt), xt)[0]
        with tf.compat.v1.Session() as session:
            first = session.run(g)
            np.testing.assert_array_equal(session.run(g), first)   # the op runs again
        return first


def finite_differences(op, xs, ws, scale, h=1e-6):
    """Central differences of scale * sum_k L_k w.r.t. every element of every rank's input:
    each evaluation runs the op on every rank (only rank p perturbed) and sums the losses."""
    grads = []
    for p in range(SIZE):
        g = np.zeros_like(xs[p])
        for j in np.ndindex(xs[p].shape):
            values = []
            for sign in (1, -1):
                x = xs[RANK].copy()
                if RANK == p:
                    x[j] += sign * h
                mine = loss(op(tf.constant(x)), tf.constant(ws[RANK]))
                values.append(hvd.allreduce(mine, op=hvd.Sum).numpy())
            g[j] = scale * (values[0] - values[1]) / (2 * h)
        grads.append(g)
    return grads


def rows_of(r, dim0):
    """reducescatter's split: rank r's first row and row count of a dim0-row tensor."""
    first = r * (dim0 // SIZE) + min(r, dim0 % SIZE)
    return first, dim0 // SIZE + (1 if r < dim0 % SIZE else 0)


def check(op, xs, ws, expected, scale, fd_mode):
    """The op's gradient on this rank in every mode equals ``expected`` (Horovod's formula);
    in ``fd_mode`` it also equals finite differences of scale * sum_k L_k."""
    for mode in MODES:
        got = gradient(mode, op, xs[RANK], ws[RANK])
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12,
                                   err_msg="%s: Horovod's formula" % mode)
    if fd_mode:
        numeric = finite_differences(op, xs, ws, scale)[RANK]
        np.testing.assert_allclose(expected, numeric, rtol=1e-5, atol=1e-6,
                                   err_msg="finite differences")


@pytest.mark.parametrize("fd", [True, False], ids=["fd", "formula"])
def test_allgather(fd):
    xs = uniform(1, lambda r: (r + 1, 2))           # dim 0 differs per rank
    y = np.concatenate(xs)
    ws = uniform(2, lambda r: y.shape)
    mean_dy = np.mean([w + y for w in ws], axis=0)
    start = sum(len(x) for x in xs[:RANK])
    check(hvd.allgather, xs, ws, mean_dy[start:start + len(xs[RANK])], 1.0 / SIZE, fd)


def test_grouped_allgather():
    xs = uniform(3, lambda r: (r + 2, 3))
    zs = [x[:, :1] * 2 for x in xs]                 # a second tensor of another shape
    y, yz = np.concatenate(xs), np.concatenate(zs)
    ws = uniform(4, lambda r: y.shape)
    wz = uniform(5, lambda r: yz.shape)

    def op(x):
        a, b = hvd.grouped_allgather([x, x[:, :1] * 2])
        return tf.concat([a, b], axis=1)
    w_both = [np.concatenate([w, v], axis=1) for w, v in zip(ws, wz)]
    mean_dy = np.mean([w + np.concatenate([y, yz], axis=1) for w in w_both], axis=0)
    start, n = sum(len(x) for x in xs[:RANK]), len(xs[RANK])
    expected = mean_dy[start:start + n, :3].copy()
    expected[:, 0] += 2 * mean_dy[start:start + n, 3]      # x[:, :1] * 2 is gathered too
    check(op, xs, w_both, expected, 1.0 / SIZE, True)


@pytest.mark.parametrize("root", range(SIZE))
def test_broadcast(root):
    xs = uniform(6, lambda r: (3, 2))
    ws = uniform(7, lambda r: (3, 2))
    mean_dy = np.mean([w + xs[root] for w in ws], axis=0)
    expected = mean_dy if RANK == root else np.zeros_like(mean_dy)
    check(lambda x: hvd.broadcast(x, root), xs, ws, expected, 1.0 / SIZE, root == SIZE - 1)


@pytest.mark.parametrize("opname,pre,post", [("Sum", 1.0, 1.0), ("Average", 1.0, 1.0),
                                             ("Sum", 0.5, 3.0), ("Average", 2.0, 0.25)])
def test_reducescatter(opname, pre, post):
    dim0 = 2 * SIZE + 1                             # uneven split: the first ranks get more
    xs = uniform(8, lambda r: (dim0, 2))
    full = pre * post * np.sum(xs, axis=0) / (SIZE if opname == "Average" else 1)
    ys = [full[f:f + n] for f, n in (rows_of(r, dim0) for r in range(SIZE))]
    ws = uniform(9, lambda r: ys[r].shape)
    dy = np.concatenate([w + y for w, y in zip(ws, ys)])
    expected = dy * pre * post * (SIZE if opname == "Sum" else 1)
    op = getattr(hvd, opname)
    check(lambda x: hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post),
          xs, ws, expected, float(SIZE), pre == 1.0)


def test_grouped_reducescatter():
    dim0 = SIZE + 1
    xs = uniform(10, lambda r: (dim0, 2))
    ys = [np.sum(xs, axis=0)[f:f + n] for f, n in (rows_of(r, dim0) for r in range(SIZE))]
    ws = uniform(11, lambda r: ys[r].shape)

    def op(x):
        a, b = hvd.grouped_reducescatter([x, x * 3], op=hvd.Sum)
        return a + b
    # y = rs(x) + rs(3x) = 4 rs(x): dy/dx = SIZE * allgather(dy) * (1 + 3)
    dy = np.concatenate([w + 4 * y for w, y in zip(ws, ys)])
    check(op, xs, ws, 4 * SIZE * dy, float(SIZE), True)


def test_reducescatter_min_has_no_gradient():
    x = tf.constant(np.ones((SIZE, 2)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.reducescatter(x, op=hvd.Min)
    with pytest.raises(NotImplementedError, match="Sum and Average"):
        tape.gradient(y, x)


def test_process_set_gradients():
    """Gradients over a process set average and gather over its members only."""
    members = [0, SIZE - 1]     # at 2 ranks, the global set itself
    subset = hvd.add_process_set(members) if SIZE > 2 else hvd.global_process_set
    try:
        if RANK in members:
            me = members.index(RANK)
            xs = [np.full((i + 1, 2), float(i + 1)) for i in range(2)]
            y = np.concatenate(xs)
            ws = [np.arange(y.size, dtype=np.float64).reshape(y.shape) * (i + 1) for i in range(2)]
            mean_dy = np.mean([w + y for w in ws], axis=0)
            got = gradient("eager", lambda x: hvd.allgather(x, process_set=subset), xs[me], ws[me])
            np.testing.assert_allclose(got, mean_dy[:1] if me == 0 else mean_dy[1:], rtol=1e-12)
            got = gradient("eager", lambda x: hvd.broadcast(x, SIZE - 1, process_set=subset),
                           xs[0], ws[me][:1])
            mean_b = np.mean([w[:1] + xs[0] for w in ws], axis=0)
            np.testing.assert_allclose(got, mean_b if RANK == SIZE - 1 else 0 * mean_b)
    finally:
        if SIZE > 2:
            hvd.remove_process_set(subset)


@pytest.mark.parametrize("mode", MODES)
def test_groups_with_integer_members_and_indexed_slices(mode):
    """A group's floating members have their gradient though another member is an integer
    tensor, and an allreduce of tf.IndexedSlices has one (Horovod's sparse path: the
    allgather's, then the division by the set's size)."""
    xs = uniform(12, lambda r: (3,))
    ws = uniform(13, lambda r: (3,))
    def ints():     # made in the graph of the mode
        return tf.constant([1, 2, 3], tf.int32)

    def allreduced(x):
        return hvd.grouped_allreduce([x, ints()], op=hvd.Sum)[0]
    total = np.sum(xs, axis=0)
    dy = np.sum([w + total for w in ws], axis=0)             # Sum: every rank's dy, summed
    np.testing.assert_allclose(gradient(mode, allreduced, xs[RANK], ws[RANK]), dy, rtol=1e-6)

    def gathered(x):
        return hvd.grouped_allgather([x, ints()])[0]
    wg = uniform(14, lambda r: (3 * SIZE,))
    y = np.concatenate(xs)
    mean_dy = np.mean([w + y for w in wg], axis=0)
    np.testing.assert_allclose(gradient(mode, gathered, xs[RANK], wg[RANK]),
                               mean_dy[3 * RANK:3 * RANK + 3], rtol=1e-6)

    def sparse(x):
        slices = tf.IndexedSlices(x[:2], tf.constant([0, 1]), tf.constant([3]))
        return tf.convert_to_tensor(hvd.allreduce(slices, op=hvd.Average))
    dense = np.zeros(3)
    dense[:2] = np.mean([x[:2] for x in xs], axis=0)
    mean_dy = np.mean([w + dense for w in ws], axis=0)        # every rank's rows 0 and 1
    expected = np.zeros(3)
    expected[:2] = mean_dy[:2] / SIZE      # the allgather's average, then the division
    np.testing.assert_allclose(gradient(mode, sparse, xs[RANK], ws[RANK]), expected, rtol=1e-6)
