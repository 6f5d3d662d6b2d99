"""Collectives inside nested tf.functions run one at a time, in one order on every rank, with
TensorFlow free to run independent ops at once (several inter-op threads, unlike the other TF
files here): inner functions that read variables (which TensorFlow does not order by
themselves), one called twice, two whose names differ only in digits, and the gradient
functions an eager tape builds (which have no automatic ordering). Each result is checked on
every rank against a NumPy reference. Before the order variable, these ran concurrently:
"already in flight" errors, or ranks waiting on different collectives.
SPMD: run by hvlrun (tests/test_spmd.py)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvlite.tensorflow as hvd  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(8)

RANK, SIZE = hvd.rank(), hvd.size()
STEPS = 10
RANKS_SUM = SIZE * (SIZE + 1) / 2          # sum over ranks of (rank + 1)

W = tf.Variable(np.full((16, 16), 0.5, np.float32))


@tf.function
def encode(x):                              # reads W: TensorFlow does not order its calls
    return hvd.allreduce(tf.matmul(x, W), op=hvd.Sum)


@tf.function
def encode_twice(x):
    return tf.reduce_sum(encode(x)) + tf.reduce_sum(encode(x * 2.0))


@tf.function
def layer_1(x):
    return hvd.allreduce(tf.matmul(x, W), op=hvd.Sum)


@tf.function
def layer_2(x):
    return hvd.allreduce(tf.matmul(x, W) * 3.0, op=hvd.Sum)


@tf.function
def two_layers(x):
    return tf.reduce_sum(layer_1(x)) + tf.reduce_sum(layer_2(x))


def mine():
    return tf.fill((4, 16), float(RANK + 1))


def test_an_inner_function_called_twice():
    # each call: sum over ranks of (r+1) * 0.5 * 16 per element, 4x16 elements
    one = RANKS_SUM * 0.5 * 16 * 64
    for _ in range(STEPS):
        np.testing.assert_allclose(encode_twice(mine()).numpy(), one * 3.0, rtol=1e-6)


def test_functions_whose_names_differ_in_digits_under_an_eager_tape():
    one = RANKS_SUM * 0.5 * 16 * 64
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            loss = two_layers(mine())
        grad = tape.gradient(loss, W)
        np.testing.assert_allclose(loss.numpy(), one * 4.0, rtol=1e-6)
        # d loss / dW: each layer's gradient is the Sum allreduce of the ones it got, times
        # its scale, through x^T: every element is 4 rows * (rank+1) * SIZE * (1 + 3)
        np.testing.assert_allclose(grad.numpy(), np.full((16, 16), 4.0 * (RANK + 1) * SIZE * 4.0),
                                   rtol=1e-6)


@tf.custom_gradient
def scaled_sum(x):
    y = hvd.allreduce(x, op=hvd.Sum)

    def grad(dy):
        return hvd.allreduce(dy * 2.0, op=hvd.Sum)
    return y, grad


@tf.function
def three(x):
    return scaled_sum(x) + scaled_sum(x + 1.0) * 2.0 + scaled_sum(x + 2.0) * 3.0


def test_gradient_function_built_for_an_eager_tape():
    x = tf.fill((8,), float(RANK + 1))
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = three(x)
        dx = tape.gradient(y, x)
        np.testing.assert_allclose(y.numpy(), np.full(8, RANKS_SUM + (RANKS_SUM + SIZE) * 2.0
                                                      + (RANKS_SUM + 2 * SIZE) * 3.0), rtol=1e-6)
        # each term's gradient: allreduce(dy * 2) with dy = its scale on every rank
        np.testing.assert_allclose(dx.numpy(), np.full(8, 2.0 * SIZE * (1 + 2 + 3)), rtol=1e-6)


def test_a_tape_on_a_set_leaves_the_names_of_global_collectives_alone():
    """Only the set's members reduce a tape on a set: its names must not count in the global
    set's (a member's global tape was named .1, a non-member's .0: a deadlock)."""
    ps = hvd.add_process_set([SIZE - 1])
    v = tf.Variable(tf.ones(3))

    @tf.function
    def step():
        with tf.GradientTape() as on_set:
            a = tf.reduce_sum(v * float(RANK + 1))
        with tf.GradientTape() as everywhere:
            b = tf.reduce_sum(v * float(RANK + 1))
        mine, = hvd.DistributedGradientTape(on_set, process_set=ps).gradient(a, [v])
        average, = hvd.DistributedGradientTape(everywhere).gradient(b, [v])
        return mine, average
    try:
        for _ in range(3):
            mine, average = step()
            np.testing.assert_allclose(mine.numpy(), np.full(3, RANK + 1.0))   # a set of one
            np.testing.assert_allclose(average.numpy(), np.full(3, (SIZE + 1) / 2.0))
    finally:
        hvd.remove_process_set(ps)


def test_a_function_traced_in_a_tf1_graph_after_eager_ones():
    """The order variable is eager: a tf.function traced inside a TF1 graph (run by a Session),
    after eager functions made it, must not capture it."""
    @tf.function
    def eager_one(x):
        return hvd.allreduce(x, op=hvd.Sum, name="order.eager")
    np.testing.assert_allclose(eager_one(tf.constant([1.0])).numpy(), [hvd.size()])
    graph = tf.Graph()
    with graph.as_default():
        traced = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="order.graph"))
        out = traced(tf.constant([2.0]))
        with tf.compat.v1.Session(graph=graph) as session:
            np.testing.assert_allclose(session.run(out), [2.0 * hvd.size()])
