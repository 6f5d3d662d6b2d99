"""Adasum in hvlite.tensorflow, checked on every rank against the NumPy reference: allreduce
and grouped_allreduce (eagerly and in a tf.function), DistributedGradientTape(op=Adasum) and
the Keras DistributedOptimizer(op=Adasum), which Adasum-reduce the gradients as Horovod's do;
and Horovod's refusals: reducescatter, tf.IndexedSlices (with any op but Sum and Average),
integer dtypes, hvd.DistributedOptimizer of a Keras optimizer, sets that are not 2^k ranks. SPMD: run by hvlrun at 2 and 3 ranks."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvlite.tensorflow as hvd  # noqa: E402
import hvlite.tensorflow.keras as hvdk  # noqa: E402
from hvlite.errors import HvliteNotSupportedError  # noqa: E402
from adasum_reference import adasum, assert_close  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

RANK, SIZE = hvd.rank(), hvd.size()
POWER_OF_2 = SIZE & (SIZE - 1) == 0
needs_power_of_2 = pytest.mark.skipif(not POWER_OF_2, reason="Adasum needs 2^k ranks")


def value(seed, rank, shape, dtype):
    shared = np.random.default_rng([seed]).standard_normal(shape)
    own = np.random.default_rng([seed, rank + 1]).standard_normal(shape)
    return np.asarray(shared + own).astype(dtype)


def everyone(seed, shape, dtype):
    return [value(seed, r, shape, dtype) for r in range(SIZE)]


@needs_power_of_2
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_allreduce_and_grouped(dtype, mode):
    shapes = [(11,), (4, 3), ()]

    def run(tensors):
        alone = hvd.allreduce(tensors[0], op=hvd.Adasum, name="alone")
        return [alone] + hvd.grouped_allreduce(tensors[1:], op=hvd.Adasum, name="group")
    fn = run if mode == "eager" else tf.function(run)
    outs = fn([tf.constant(value(i, RANK, s, dtype)) for i, s in enumerate(shapes)])
    for i, (out, shape) in enumerate(zip(outs, shapes)):
        assert_close(out.numpy(), adasum(everyone(i, shape, dtype), dtype),
                     "%s %s %s" % (mode, dtype, shape))


def _grads_of_every_rank(weights):
    """Each rank's gradient of its loss sum((x w)^2) at ``weights`` (computed here for all)."""
    grads = []
    for r in range(SIZE):
        x = value(20, r, (6, 4), "float32")
        grads.append(2 * x.T @ (x @ weights))
    return grads


@needs_power_of_2
def test_gradient_tape_and_keras_optimizer_reduce_gradients_with_adasum():
    w0 = value(21, 0, (4, 2), "float32")
    x = tf.constant(value(20, RANK, (6, 4), "float32"))
    w = tf.Variable(w0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
    grad = hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w])[0]
    expected = adasum(_grads_of_every_rank(w0.astype(np.float64)), np.float32)
    assert_close(grad.numpy(), expected, "DistributedGradientTape(op=Adasum)")
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01), op=hvd.Adasum)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
    assert_close(w.numpy(), (w0 - 0.01 * expected).astype(np.float32), "Keras SGD step")


def test_refusals_on_every_rank():
    with pytest.raises(RuntimeError, match="reducescatter does not support Adasum"):
        hvd.reducescatter(tf.ones([SIZE * 2, 3]), op=hvd.Adasum)
    with pytest.raises(HvliteNotSupportedError, match="not int32"):
        hvd.allreduce(tf.ones([3], tf.int32), op=hvd.Adasum)
    slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 2]), tf.constant([4, 3]))
    for op in (hvd.Adasum, hvd.Min, hvd.Max, hvd.Product):    # Horovod: NotImplementedError
        with pytest.raises(NotImplementedError, match="sparse_as_dense=True"):
            hvd.allreduce(slices, op=op)
        with pytest.raises(NotImplementedError, match="Sum and Average only"):
            hvd.grouped_allreduce([tf.ones([2]), slices], op=op)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    if not POWER_OF_2:
        with pytest.raises(NotImplementedError, match="power-of-2 number of ranks"):
            hvd.allreduce(tf.ones([3]), op=hvd.Adasum)
    assert hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy()[0] == SIZE
