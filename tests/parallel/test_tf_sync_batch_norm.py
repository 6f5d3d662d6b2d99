"""hvlite.tensorflow.SyncBatchNormalization gives, on every rank, what Keras's BatchNormalization
gives on the whole batch (every rank's rows together, ranks holding different numbers of rows):
the outputs of this rank's rows, the moving statistics, and the gradients (the input's rows,
and gamma/beta summed over the ranks); eagerly and in a tf.function, with a mask, channels
first and last, and float16 inputs. Inference runs no collective. Also Horovod's
broadcast_object_fn. SPMD: run by hvlrun (tests/test_spmd.py)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import hvlite  # noqa: E402
import hvlite.tensorflow as hvd  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

RANK, SIZE = hvd.rank(), hvd.size()


def every_ranks_rows(shape_tail, seed, dtype=np.float32):
    """Rank r holds 2 + r rows; returns (all rows in rank order, the slice that is this rank's)."""
    rng = np.random.default_rng(seed)
    parts = [(3.0 + 2.0 * rng.normal(size=(2 + r,) + shape_tail)).astype(dtype) for r in range(SIZE)]
    start = sum(len(p) for p in parts[:RANK])
    return np.concatenate(parts), slice(start, start + len(parts[RANK]))


def close(got, want, what, tol=1e-4):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=tol, atol=tol, err_msg="%s on rank %d" % (what, RANK))


def pair(axis, **kwargs):
    """A SyncBatchNormalization and Keras's layer, with the same non-trivial gamma and beta."""
    sync, ref = hvd.SyncBatchNormalization(axis=axis, **kwargs), keras.layers.BatchNormalization(axis=axis, **kwargs)
    return sync, ref


def set_affine(layers, channels):
    gamma = np.linspace(0.5, 1.5, channels).astype(np.float32)
    beta = np.linspace(-1.0, 1.0, channels).astype(np.float32)
    for layer in layers:
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)


@pytest.mark.parametrize("shape_tail,axis", [((5,), -1), ((3, 4, 2), 1), ((4, 2, 3), -1)])
def test_training_matches_the_whole_batch(shape_tail, axis):
    everything, mine = every_ranks_rows(shape_tail, seed=len(shape_tail) + axis)
    sync, ref = pair(axis, momentum=0.5)
    for step_ in range(2):     # twice: the moving statistics move on from the first step
        x_all = everything + step_
        with tf.GradientTape(persistent=True) as tape:
            xs, xr = tf.constant(x_all[mine]), tf.constant(x_all)
            tape.watch([xs, xr])
            if step_ == 0:
                sync.build(xs.shape)
                ref.build(xr.shape)
                set_affine([sync, ref], sync.gamma.shape[0])
            out_sync, out_ref = sync(xs, training=True), ref(xr, training=True)
            weights = tf.constant(np.cos(np.arange(x_all.size)).reshape(x_all.shape).astype(np.float32))
            loss_sync = tf.reduce_sum(out_sync * weights[mine])
            loss_ref = tf.reduce_sum(out_ref * weights)
        close(out_sync, out_ref.numpy()[mine], "output")
        close(sync.moving_mean, ref.moving_mean, "moving mean")
        close(sync.moving_variance, ref.moving_variance, "moving variance")
        gx_sync, gg_sync, gb_sync = tape.gradient(loss_sync, [xs, sync.gamma, sync.beta])
        gx_ref, gg_ref, gb_ref = tape.gradient(loss_ref, [xr, ref.gamma, ref.beta])
        close(gx_sync, gx_ref.numpy()[mine], "input gradient", tol=1e-3)
        # gamma/beta gradients are this rank's share: summed over the ranks they are the whole's
        close(hvd.allreduce(gg_sync, op=hvd.Sum), gg_ref, "gamma gradient", tol=1e-3)
        close(hvd.allreduce(gb_sync, op=hvd.Sum), gb_ref, "beta gradient", tol=1e-3)


def test_numpy_reference_in_a_tf_function_with_float16_inputs():
    everything, mine = every_ranks_rows((6,), seed=7, dtype=np.float16)
    sync = hvd.SyncBatchNormalization(center=False, scale=False, epsilon=1e-3, momentum=0.0)

    @tf.function
    def forward(x):
        return sync(x, training=True)

    for _ in range(2):         # the traced function runs its collectives at every call
        out = forward(tf.constant(everything[mine]))
    x64 = everything.astype(np.float64)
    mean, var = x64.mean(0), x64.var(0)
    close(out, (x64[mine] - mean) / np.sqrt(var + 1e-3), "output", tol=2e-3)
    close(sync.moving_mean, mean, "moving mean", tol=2e-3)
    close(sync.moving_variance, var, "moving variance", tol=2e-3)


def test_a_mask_weighs_the_samples_as_keras_does():
    everything, mine = every_ranks_rows((3, 4), seed=11)
    rng = np.random.default_rng(12)
    mask = rng.random(everything.shape[:2]) < 0.6
    everything[~mask] = np.nan          # padding may hold anything: it must not count
    sync, ref = pair(-1, momentum=0.0)
    out_sync = sync(tf.constant(everything[mine]), training=True, mask=tf.constant(mask[mine]))
    out_ref = ref(tf.constant(everything), training=True, mask=tf.constant(mask))
    close(out_sync, out_ref.numpy()[mine], "masked output")
    close(sync.moving_mean, ref.moving_mean, "masked moving mean")
    close(sync.moving_variance, ref.moving_variance, "masked moving variance")


def test_inference_uses_the_moving_statistics_without_collectives():
    everything, mine = every_ranks_rows((4,), seed=3)
    sync, ref = pair(-1, momentum=0.0)
    sync(tf.constant(everything[mine]), training=True)
    ref(tf.constant(everything), training=True)
    hvd.barrier()
    before = hvlite.engine_counters()["tensors_submitted"]
    out = sync(tf.constant(everything[mine]), training=False)
    assert hvlite.engine_counters()["tensors_submitted"] == before, "inference ran a collective"
    close(out, ref(tf.constant(everything), training=False).numpy()[mine], "inference output")


def test_fused_and_config():
    with pytest.raises(ValueError, match="fused"):
        hvd.SyncBatchNormalization(fused=True)
    with pytest.raises(ValueError, match="fused"):
        hvd.SyncBatchNormalization(fused=None)
    layer = hvd.SyncBatchNormalization(axis=1, momentum=0.9, fused=False)
    again = hvd.SyncBatchNormalization.from_config(layer.get_config())
    assert isinstance(again, hvd.SyncBatchNormalization)
    assert again.axis == layer.axis and again.momentum == 0.9


def test_in_a_keras_model_fit_every_rank_keeps_the_same_statistics():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6)(inputs)
    outputs = keras.layers.Dense(1)(hvd.SyncBatchNormalization()(hidden))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    hvd.broadcast_variables(model.variables, root_rank=0)
    rng = np.random.default_rng(100 + RANK)       # every rank its own data
    x = rng.normal(size=(12, 4)).astype(np.float32)
    y = x.sum(1, keepdims=True)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    bn = [layer for layer in model.layers if isinstance(layer, hvd.SyncBatchNormalization)][0]
    stats = [bn.moving_mean.numpy(), bn.moving_variance.numpy()] + [v.numpy() for v in model.trainable_variables]
    for r, theirs in enumerate(hvd.allgather_object(stats)):
        for a, b in zip(stats, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg="rank %d differs" % r)


def test_a_saved_model_loads_with_hvlites_load_model(tmp_path):
    import hvlite.tensorflow.keras as hvdk
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(hvd.SyncBatchNormalization(momentum=0.7)(inputs)))
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    path = str(tmp_path / ("sbn.%d.keras" % RANK))
    model.save(path)
    loaded = hvdk.load_model(path)
    layer = [l for l in loaded.layers if isinstance(l, hvd.SyncBatchNormalization)][0]
    assert layer.momentum == pytest.approx(0.7) and layer.supports_jit is False


def test_broadcast_object_fn():
    bcast = hvd.broadcast_object_fn(root_rank=0)
    obj = {"hello": 123, 0: [1, 2]} if RANK == 0 else {}
    assert bcast(obj) == {"hello": 123, 0: [1, 2]}
    assert bcast(RANK) == 0                      # reusable, as Horovod's
