"""Training with hvlite.tensorflow on n ranks gives what one process gives on the combined
batch: DistributedGradientTape in a tf.function loop (dense and IndexedSlices gradients) and
Keras 3 model.fit with DistributedOptimizer (also under the mixed_float16 policy, its loss
scaling skipping the same steps on every rank); the callbacks broadcast at start, average the
logs and set the warmup/schedule learning rates; load_model re-wraps the optimizer. Every rank
checks against its own single-process NumPy/TensorFlow reference, and that all ranks agree.
SPMD: run by hvlrun (tests/test_spmd.py)."""
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import hvlite  # noqa: E402
import hvlite.tensorflow as hvd  # noqa: E402
import hvlite.tensorflow.keras as hvdk  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

RANK, SIZE = hvd.rank(), hvd.size()
LOCAL_BATCH, STEPS = 4, 4


def data(seed, rows, features):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    y = (x @ rng.normal(size=(features, 1)) + 0.1).astype(np.float32)
    return x, y


def assert_same_on_every_rank(arrays, what):
    gathered = hvd.allgather_object([np.asarray(a) for a in arrays])
    for r, theirs in enumerate(gathered):
        for mine, other in zip(arrays, theirs):
            np.testing.assert_array_equal(np.asarray(mine), other, err_msg="%s: rank %d differs" % (what, r))


# ---- DistributedGradientTape in a custom tf.function loop ----

def tape_model(seed):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(size=s).astype(np.float32) * 0.3)
            for s in [(10, 3), (8, 16), (16,), (16, 1)]]   # embedding table, W1, b1, W2


def tape_loss(variables, ids, x, y):
    emb, w1, b1, w2 = variables
    h = tf.nn.relu(tf.matmul(tf.concat([x[:, :5], tf.gather(emb, ids)], 1), w1) + b1)
    return tf.reduce_mean((tf.matmul(h, w2) - y) ** 2)


@pytest.mark.parametrize("options", [
    {}, {"sparse_as_dense": True, "num_groups": 2}, {"gradient_predivide_factor": 2.0},
    {"compression": hvd.Compression.fp16}], ids=["default", "dense-groups", "predivide", "fp16"])
def test_distributed_gradient_tape_equivalence(options):
    x, y = data(1, LOCAL_BATCH * SIZE * STEPS, 5)
    ids = (np.arange(len(x)) * 7 % 10).astype(np.int64)
    x = np.concatenate([x, np.zeros((len(x), 3), np.float32)], 1)   # columns 5..7 unused
    lr = 0.1

    def train(variables, batches, distributed):
        @tf.function
        def step(i, xb, yb):
            with tf.GradientTape() as tape:
                loss = tape_loss(variables, i, xb, yb)
            if distributed:
                tape = hvd.DistributedGradientTape(tape, **options)
            grads = tape.gradient(loss, variables)
            for v, g in zip(variables, grads):
                v.assign_sub(lr * tf.convert_to_tensor(g))
            return loss
        for i, xb, yb in batches:
            step(tf.constant(i), tf.constant(xb), tf.constant(yb))
        return [v.numpy() for v in variables]

    global_batch = LOCAL_BATCH * SIZE
    mine = [slice(s * global_batch + RANK * LOCAL_BATCH, s * global_batch + (RANK + 1) * LOCAL_BATCH)
            for s in range(STEPS)]
    whole = [slice(s * global_batch, (s + 1) * global_batch) for s in range(STEPS)]
    got = train(tape_model(0), [(ids[b], x[b], y[b]) for b in mine], True)
    expected = train(tape_model(0), [(ids[b], x[b], y[b]) for b in whole], False)
    tol = 2e-3 if options.get("compression") is hvd.Compression.fp16 else 1e-5
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
    assert_same_on_every_rank(got, "DistributedGradientTape weights")


def test_tape_is_a_gradient_tape_and_keeps_structure():
    v = {"a": tf.Variable([1.0, 2.0]), "b": tf.Variable(3.0)}
    with tf.GradientTape() as tape:
        loss = (RANK + 1) * (tf.reduce_sum(v["a"]) + v["b"] * v["b"])
    dtape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    assert isinstance(dtape, tf.GradientTape)
    grads = dtape.gradient(loss, v)
    total = sum(r + 1 for r in range(SIZE))
    np.testing.assert_allclose(grads["a"].numpy(), [total, total])
    np.testing.assert_allclose(grads["b"].numpy(), 6.0 * total)


# ---- Keras 3: model.fit with DistributedOptimizer and the callbacks ----

def keras_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


class Probe(keras.callbacks.Callback):
    """Records epoch-end logs and the learning rate at every batch."""

    def __init__(self):
        super().__init__()
        self.logs, self.lrs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def combined_order(x, batch):
    """Row order for one process so its batch k of size batch*SIZE holds every rank's batch k
    of its shard x[r::SIZE]."""
    shards = [np.arange(len(x))[r::SIZE] for r in range(SIZE)]
    return np.concatenate([np.concatenate([s[k * batch:(k + 1) * batch] for s in shards])
                           for k in range(len(shards[0]) // batch)])


def test_model_fit_equivalence_and_callbacks():
    x, y = data(2, LOCAL_BATCH * SIZE * STEPS, 6)
    model = keras_model(100 + RANK)        # different on every rank: the callback fixes that
    root_init = hvd.broadcast_object(model.get_weights(), root_rank=0)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="mse", jit_compile=False)
    before, after = Probe(), Probe()
    callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0), before,
                 hvdk.callbacks.MetricAverageCallback(), after]
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=2, shuffle=False,
              verbose=0, callbacks=callbacks)

    reference = keras_model(0)
    reference.set_weights(root_init)
    reference.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                      jit_compile=False)
    order = combined_order(x, LOCAL_BATCH)
    reference.fit(x[order], y[order], batch_size=LOCAL_BATCH * SIZE, epochs=2, shuffle=False,
                  verbose=0)
    for got, expected in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert_same_on_every_rank(model.get_weights(), "model.fit weights")
    assert int(model.optimizer.iterations.numpy()) == 2 * STEPS

    local_losses = hvd.allgather_object([log["loss"] for log in before.logs])
    for epoch, log in enumerate(after.logs):
        np.testing.assert_allclose(log["loss"], np.mean([l[epoch] for l in local_losses]), rtol=1e-6)


def test_broadcast_callback_leaves_each_ranks_dropout_state():
    """Keras 3 keeps a dropout layer's random state in a variable: the callback gives every rank
    rank 0's weights but leaves each rank its own random state (Keras 2 had no such variable)."""
    x, y = data(4, LOCAL_BATCH * SIZE * STEPS, 6)
    keras.utils.set_random_seed(400 + RANK)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dropout(0.5),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
                  jit_compile=False)
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=1, shuffle=False,
              verbose=0, callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_on_every_rank(model.get_weights(), "weights")
    states = [v.numpy() for v in model.variables if "seed_generator" in v.path]
    assert states, [v.path for v in model.variables]
    gathered = hvd.allgather_object(states)
    assert not all(np.array_equal(gathered[0][0], theirs[0]) for theirs in gathered[1:]), \
        "the dropout random state was made the same on every rank"


def test_distributed_optimizer_keeps_weight_decay_exclusions():
    """exclude_from_weight_decay() lives outside the optimizer's config: the wrapper keeps it."""
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    wrapped = hvdk.DistributedOptimizer(optimizer)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    kernel, bias = model.trainable_variables
    kernel.assign(np.ones((6, 1), np.float32))
    bias.assign(np.ones((1,), np.float32))
    wrapped.apply_gradients([(tf.zeros_like(kernel), kernel), (tf.zeros_like(bias), bias)])
    np.testing.assert_allclose(kernel.numpy(), 1 - 0.1 * 0.5, rtol=1e-6)   # decayed
    np.testing.assert_allclose(bias.numpy(), 1.0)                          # excluded


@pytest.mark.parametrize("case", ["no_input", "root_resumed", "root_resumed_others_unbuilt",
                                  "root_resumed_others_unbuilt_accumulating"])
def test_broadcast_callback_reaches_variables_built_by_the_first_step(case):
    """no_input: a Sequential without an Input has no weights when fit() begins (Keras builds
    it, and the optimizer, in the first train step). root_resumed: only the root's optimizer
    exists at train begin (it loaded a checkpoint: 5 steps done), so the ranks' variables
    differ then (this deadlocked). root_resumed_others_unbuilt: that root, and the other ranks'
    models have no Input, so they trace their first step's inner function twice (it builds
    variables) and the root once (this deadlocked until graph names ignored inner retraces).
    root_resumed_others_unbuilt_accumulating: that, with backward_passes_per_step=2: the root's
    step count must reach the others before the first batch, or the root takes an update step
    (allreduce) where they accumulate (deadlock). In each case the callback broadcasts after the
    first step, so every rank ends with the same weights and optimizer state, the root's step
    count included."""
    x, y = data(3, LOCAL_BATCH * SIZE * STEPS, 6)
    keras.utils.set_random_seed(300 + RANK)               # different weights on every rank
    resumed = case.startswith("root_resumed")
    built = case == "root_resumed" or (resumed and RANK == 0)
    first = [keras.Input((6,))] if built else []
    model = keras.Sequential(first + [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    passes = 2 if case.endswith("accumulating") else 1
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                      backward_passes_per_step=passes),
                  loss="mse", jit_compile=False)
    assert model.built == built
    if resumed and RANK == 0:
        model.optimizer.build(model.trainable_variables)
        model.optimizer._iterations.assign(5)         # every step (iterations: updates only)
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=2, shuffle=False,
              verbose=0, callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_on_every_rank(model.get_weights(), "weights")
    local = {id(v) for v in getattr(model.optimizer, "_accumulated_gradients", [])}  # between updates
    assert_same_on_every_rank([v.numpy() for v in model.optimizer.variables if id(v) not in local],
                              "optimizer state")
    done = 2 * STEPS + (5 if resumed else 0)
    assert int(model.optimizer._iterations.numpy()) == done


@pytest.mark.parametrize("average,clipnorm", [(False, None), (True, None), (True, 0.05)])
def test_backward_passes_per_step_reduces_once_per_n_steps(average, clipnorm):
    """Horovod's backward_passes_per_step=2: local gradients accumulate over two steps, then are
    allreduced once and applied (summed over the steps, or averaged with
    average_aggregated_gradients), clipped after the allreduce; equal to one process on every
    rank's batches with Keras's own accumulation, and only every other step communicates."""
    x, y = data(5, LOCAL_BATCH * SIZE * STEPS, 6)
    model = keras_model(7)
    start = model.get_weights()
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9, clipnorm=clipnorm),
                                    backward_passes_per_step=2, average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    before = hvlite.engine_counters()["tensors_submitted"]
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0)
    submitted = hvlite.engine_counters()["tensors_submitted"] - before
    assert submitted == (STEPS // 2) * len(model.trainable_variables), submitted

    reference = keras_model(7)
    reference.set_weights(start)
    # the sum over two steps is the average with twice the learning rate (SGD is linear in it)
    lr = 0.05 if average else 0.1
    reference.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9, clipnorm=clipnorm,
                                                     gradient_accumulation_steps=2),
                      loss="mse", jit_compile=False)
    order = combined_order(x, LOCAL_BATCH)
    reference.fit(x[order], y[order], batch_size=LOCAL_BATCH * SIZE, epochs=1, shuffle=False, verbose=0)
    for got, expected in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert_same_on_every_rank(model.get_weights(), "backward_passes_per_step weights")


def test_load_model_keeps_accumulation_with_the_rule_asked(tmp_path):
    model = keras_model(3)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                      backward_passes_per_step=np.int64(2)),
                  loss="mse", jit_compile=False)
    x, y = data(9, LOCAL_BATCH * 2, 6)
    model.fit(x, y, batch_size=LOCAL_BATCH, epochs=1, verbose=0)
    path = str(tmp_path / ("acc.%d.keras" % RANK))
    model.save(path)
    for average in (True, False):
        loaded = hvdk.load_model(path, average_aggregated_gradients=average)
        assert hvdk.is_distributed(loaded.optimizer)
        assert loaded.optimizer.gradient_accumulation_steps == 2
        assert loaded.optimizer._hvlite_average_aggregated is average


@pytest.mark.parametrize("wrap", ["compile", "inside", "outside", "root_loads"])
def test_mixed_float16_skips_the_same_steps_everywhere(wrap, tmp_path):
    """A LossScaleOptimizer skips a step whose gradients are not finite. An infinity in rank 0's
    rows of batch 1 must make every rank skip that step and halve its scale, as one process on
    the combined batch does, however the optimizers are nested: `compile` wraps the
    DistributedOptimizer in a LossScaleOptimizer under the mixed_float16 policy, `inside` does
    that by hand, `outside` wraps a LossScaleOptimizer in the DistributedOptimizer,
    `root_loads`: rank 0 saves its compiled model and loads it back with hvd.load_model (a
    saved LossScaleOptimizer), the others keep theirs (this deadlocked: different
    collectives)."""
    x, y = data(4, LOCAL_BATCH * SIZE * STEPS, 6)
    x, y = x * 0.1, y * 0.1      # small: no float16 overflow at scale 2^15 but batch 1's infinity
    x[LOCAL_BATCH * SIZE, 0] = np.inf              # rank 0's shard x[0::SIZE], batch 1, row 0
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, reference = keras_model(5), keras_model(5)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    sgd, scaler = keras.optimizers.SGD(0.05), keras.optimizers.LossScaleOptimizer
    optimizer = {"compile": lambda: hvdk.DistributedOptimizer(sgd),
                 "inside": lambda: scaler(hvdk.DistributedOptimizer(sgd)),
                 "outside": lambda: hvdk.DistributedOptimizer(scaler(sgd)),
                 "root_loads": lambda: hvdk.DistributedOptimizer(sgd)}[wrap]()
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    if wrap == "root_loads" and RANK == 0:
        model.save(str(tmp_path / "model.keras"))
        keras.mixed_precision.set_global_policy("mixed_float16")    # as in the saving script
        try:
            model = hvdk.load_model(str(tmp_path / "model.keras"))
        finally:
            keras.mixed_precision.set_global_policy("float32")
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0)
    reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False)
    order = combined_order(x, LOCAL_BATCH)
    reference.fit(x[order], y[order], batch_size=LOCAL_BATCH * SIZE, epochs=1, shuffle=False, verbose=0)

    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    scale = float(np.asarray(model.optimizer.dynamic_scale))
    ref_scale = float(np.asarray(reference.optimizer.dynamic_scale))
    assert scale == ref_scale == 2.0 ** 14, (scale, ref_scale)   # 2^15 halved once
    for mine, ref in zip(model.get_weights(), reference.get_weights()):
        assert np.isfinite(mine).all()
        np.testing.assert_allclose(mine, ref, rtol=2e-2, atol=2e-2)
    assert_same_on_every_rank(model.get_weights(), "weights")


def test_mixed_float16_with_a_process_set():
    """Only rank 0 is in the optimizer's set: every rank trains as one process on its own rows
    (rank 0 with a set of one), the agreed check for infinities included."""
    process_set = hvd.add_process_set([0])
    try:
        x, y = data(5, LOCAL_BATCH * STEPS, 6)
        x, y = x * 0.1 + 0.01 * RANK, y * 0.1
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model, reference = keras_model(7), keras_model(7)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        distributed = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), process_set=process_set)
        model.compile(optimizer=distributed, loss="mse", jit_compile=False)
        model.fit(x, y, batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0)
        reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False)
        reference.fit(x, y, batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0)
        for mine, ref in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(mine, ref, rtol=1e-6, atol=1e-6)
    finally:
        hvd.remove_process_set(process_set)


def test_backward_passes_per_step_refusals():
    built = keras.optimizers.SGD(0.1)
    built.build([keras.Variable(np.zeros(2, np.float32))])
    for opt, match in [(built, "not been built"),
                       (keras.optimizers.SGD(0.1, gradient_accumulation_steps=3), "already has"),
                       (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), "LossScale")]:
        with pytest.raises(ValueError, match=match):
            hvdk.DistributedOptimizer(opt, backward_passes_per_step=2)


def test_optimizer_is_the_wrapped_one():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    opt = hvdk.DistributedOptimizer(keras.optimizers.Adam(schedule, beta_1=0.8))
    assert isinstance(opt, keras.optimizers.Adam) and hvdk.is_distributed(opt)
    assert type(opt).__name__ == "Adam"
    config = opt.get_config()
    assert config["beta_1"] == pytest.approx(0.8)
    assert config["learning_rate"]["class_name"] == "ExponentialDecay"
    plain = keras.optimizers.SGD(0.3)
    wrapped = hvd.DistributedOptimizer(plain)
    assert float(np.asarray(wrapped.learning_rate)) == pytest.approx(0.3)
    wrapped.learning_rate = 0.2
    assert float(np.asarray(wrapped.learning_rate)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="Keras 3 has no global variables"):
        hvdk.broadcast_global_variables(0)


def test_learning_rate_callbacks():
    x, y = data(3, LOCAL_BATCH * SIZE * STEPS, 6)
    model = keras_model(7)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=False)
    probe = Probe()
    warmup = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    # a constant multiplier decays from start_epoch: 0.4, then 0.2 (Horovod's code)
    schedule = hvdk.callbacks.LearningRateScheduleCallback(0.4, 0.5, start_epoch=2)
    hvdk.broadcast_global_variables(0, model)
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=4, shuffle=False,
              verbose=0, callbacks=[warmup, schedule, probe])
    expected = []
    for epoch in range(4):
        for batch in range(STEPS):
            e = epoch + (batch + 1) / STEPS     # the warmup counts the batch as done
            expected.append(0.4 / SIZE * (e * (SIZE - 1) / 2 + 1) if epoch < 2
                            else 0.4 * 0.5 ** (epoch - 2))
    np.testing.assert_allclose(probe.lrs, expected, rtol=1e-6)
    assert probe.logs[-1]["lr"] == pytest.approx(0.2)
    assert_same_on_every_rank(model.get_weights(), "weights after warmup")


def test_load_model_rewraps_optimizer():
    x, y = data(4, LOCAL_BATCH * SIZE * STEPS, 6)
    model = keras_model(11)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)),
                  loss="mse", jit_compile=False)
    model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=1, shuffle=False, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)           # every rank saves its own copy (they are identical)
        loaded = hvdk.load_model(path)
    assert hvdk.is_distributed(loaded.optimizer)
    assert type(loaded.optimizer).__name__ == "SGD"
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    x2 = x[::-1].copy()
    loaded.fit(x2[RANK::SIZE], y[::-1][RANK::SIZE], batch_size=LOCAL_BATCH, epochs=1,
               shuffle=False, verbose=0)
    model.fit(x2[RANK::SIZE], y[::-1][RANK::SIZE], batch_size=LOCAL_BATCH, epochs=1,
              shuffle=False, verbose=0)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)   # same state, same step
    assert_same_on_every_rank(loaded.get_weights(), "weights after load_model + fit")


def test_elastic_keras_callbacks_track_epoch_batch_and_commit():
    """KerasState and Horovod's three elastic callbacks under a plain hvlrun (commits in
    memory): the commits fall every batches_per_commit batches and at each epoch's end, each
    holding the epoch and batch already recorded, and the model's weights of that moment."""
    x, y = data(3, LOCAL_BATCH * SIZE * STEPS, 6)
    model = keras_model(7)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                  jit_compile=False)
    commits = []

    class State(hvdk.elastic.KerasState):
        def commit(self):
            super().commit()
            commits.append((self.epoch, self.batch, model.get_weights()[0].copy()))

    state = State(model, epoch=0, batch=0)
    callbacks = [hvdk.elastic.CommitStateCallback(state, batches_per_commit=3),
                 hvdk.elastic.UpdateBatchStateCallback(state),
                 hvdk.elastic.UpdateEpochStateCallback(state)]

    @hvdk.elastic.run
    def train(state):
        model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=LOCAL_BATCH, epochs=2, shuffle=False,
                  verbose=0, callbacks=callbacks)

    train(state)
    assert [c[:2] for c in commits] == [(0, 3), (1, 0), (1, 3), (2, 0)], [c[:2] for c in commits]
    assert (state.epoch, state.batch) == (2, 0)
    np.testing.assert_array_equal(commits[-1][2], model.get_weights()[0])
    model.set_weights([w * 0 for w in model.get_weights()])
    state.restore()                        # back to the last commit: the final weights
    np.testing.assert_array_equal(model.get_weights()[0], commits[-1][2])
    assert_same_on_every_rank([c[2] for c in commits], "weights at each commit")
