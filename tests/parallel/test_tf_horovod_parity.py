"""The last pieces of Horovod's TensorFlow/Keras API, on every rank against NumPy references:
topology ops with Horovod's ``name`` that run when the graph runs, ``join`` in a tf.function and
a TF1 session, ``groups`` in DistributedGradientTape and the Keras optimizer, the TF1
DistributedOptimizer with backward_passes_per_step > 1, groups, local variables and Adasum,
BroadcastGlobalVariablesHook in a MonitoredTrainingSession, ``hvlite.tensorflow.mpi_ops``,
BestModelCheckpoint, Horovod's positional orders and ``load_model(legacy_opts=...)``.
SPMD: run by hvlrun at 2 and 3 ranks (tests/test_spmd.py)."""
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

import hvlite.keras as hvd_legacy_keras  # noqa: E402
import hvlite.tensorflow as hvd  # noqa: E402
import hvlite.tensorflow.keras as hvdk  # noqa: E402
from adasum_reference import adasum  # noqa: E402

RANK, SIZE = hvd.rank(), hvd.size()
FLOATS = ["float16", "float32", "float64"]
POWER_OF_2 = SIZE & (SIZE - 1) == 0


def tolerance(dtype):
    return dict(rtol=1e-2, atol=1e-2) if dtype == "float16" else dict(rtol=1e-6, atol=1e-6)


def in_a_session(build, steps=1):
    """Build ops in a fresh TF1 graph; run the fetches ``steps`` times; the last results."""
    with context.graph_mode(), tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(steps):
                out = session.run(fetches)
    return out


# ---- topology ops ----

def test_topology_ops_take_a_name_and_run_when_the_graph_runs():
    want = [RANK, hvd.local_rank(), SIZE, hvd.local_size(), 1]

    def build():
        ops = [hvd.rank_op("my_rank"), hvd.local_rank_op(name="my_local_rank"),
               hvd.size_op(0, "my_size"), hvd.local_size_op("my_local_size"),
               hvd.process_set_included_op(0, name="my_included")]
        for t, name in zip(ops, ["my_rank", "my_local_rank", "my_size", "my_local_size",
                                 "my_included"]):
            assert t.op.name == name and t.op.type != "Const", (t.op.name, t.op.type)
            assert t.dtype == tf.int32 and t.shape == []
        return ops
    assert in_a_session(build) == want
    assert [int(t) for t in tf.function(lambda: [hvd.rank_op(), hvd.local_rank_op(),
                                                 hvd.size_op(), hvd.local_size_op(),
                                                 hvd.process_set_included_op()])()] == want
    assert [int(hvd.mpi_ops.rank_op()), int(hvd.mpi_ops.size_op())] == [RANK, SIZE]


def test_topology_ops_of_a_process_set():
    subset = hvd.add_process_set([0, SIZE - 1]) if SIZE > 2 else hvd.add_process_set([0])
    try:
        members = subset.ranks
        fn = tf.function(lambda: [hvd.size_op(subset.process_set_id),
                                  hvd.process_set_included_op(subset.process_set_id)])
        assert [int(t) for t in fn()] == [len(members), int(RANK in members)]
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.function(lambda: hvd.size_op(subset.process_set_id + 100))()
    finally:
        hvd.remove_process_set(subset)


# ---- join in graphs ----

@pytest.mark.parametrize("mode", ["function", "session"])
def test_join_in_a_graph(mode):
    """Rank r runs r + 1 Sum allreduces of ones, then joins: step k sums the ranks >= k (the
    joined ones stand in with zeros); the last to join is the last rank, on every rank."""
    if mode == "function":
        step = tf.function(lambda: hvd.allreduce(tf.ones([3]), op=hvd.Sum, name="join.step"))
        sums = [step().numpy() for _ in range(RANK + 1)]
        last = int(tf.function(hvd.join)())
    else:
        with context.graph_mode(), tf.Graph().as_default():
            x = hvd.allreduce(tf.ones([3]), op=hvd.Sum, name="join.step")
            with tf.compat.v1.Session() as session:
                sums = [session.run(x) for _ in range(RANK + 1)]
                # made once x has run: a fetch of an op made before x runs x first (ops not
                # run yet are chained in creation order)
                last = int(session.run(hvd.join()))
    for k, got in enumerate(sums):
        np.testing.assert_array_equal(got, np.full(3, SIZE - k, np.float32))
    assert last == SIZE - 1


# ---- groups ----

def group_case(dtype):
    """Four variables; rank r's loss gives variable i the gradient (r + 1) * (i + 1)."""
    variables = [tf.Variable(np.zeros(s, dtype)) for s in [(3,), (2, 2), (5,), ()]]

    def loss():
        return sum(tf.cast(RANK + 1, dtype) * (i + 1) * tf.reduce_sum(v)
                   for i, v in enumerate(variables))
    want = [np.full(v.shape, np.mean([r + 1 for r in range(SIZE)]) * (i + 1), dtype)
            for i, v in enumerate(variables)]
    return variables, loss, want


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("how", ["lists", "integer", "num_groups"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_gradient_tape_groups(how, mode, dtype):
    variables, loss, want = group_case(dtype)
    grouping = {"lists": dict(groups=[[variables[3], variables[0]], [variables[2]]]),
                "integer": dict(groups=3), "num_groups": dict(num_groups=2)}[how]

    def gradients():
        with tf.GradientTape() as tape:
            value = loss()
        return hvd.DistributedGradientTape(tape, **grouping).gradient(value, variables)
    grads = tf.function(gradients)() if mode == "function" else gradients()
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g.numpy(), w, **tolerance(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_keras_optimizer_groups(dtype):
    variables, loss, want = group_case(dtype)
    keras_vars = [keras.Variable(v.numpy()) for v in variables]
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                    groups=[[keras_vars[1], keras_vars[2]]])
    with tf.GradientTape() as tape:
        value = sum(tf.cast(RANK + 1, dtype) * (i + 1) * tf.reduce_sum(v)
                    for i, v in enumerate(keras_vars))
    opt.apply(tape.gradient(value, keras_vars), keras_vars)
    # the groups' variables are the model's, not the optimizer's own (saved with its state)
    assert not any(o is v for o in opt.variables for v in keras_vars)
    for v, w in zip(keras_vars, want):
        np.testing.assert_allclose(v.numpy(), -w, **tolerance(dtype))


@pytest.mark.parametrize("groups", [0, -1, [1, 2], 2.5])
def test_bad_groups_are_refused(groups):
    v = tf.Variable(1.0)
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedGradientTape(tf.GradientTape(), groups=groups)
    with pytest.raises(ValueError, match="groups"):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0), groups=groups)
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), groups=groups)
    del v


# ---- the TF1 DistributedOptimizer ----

class ConstantGradients(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer whose gradients are given tensors and whose update adds them."""

    def __init__(self, grads_of, **kwargs):
        super().__init__(use_locking=False, name="constant", **kwargs)
        self.grads_of = grads_of

    def compute_gradients(self, *args, **kwargs):
        return self.grads_of()

    def _resource_apply_dense(self, grad, handle):
        return handle.assign_add(grad)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_tf1_backward_passes_per_step(average, sparse, dtype):
    """Rank r's gradient at every step is r (as Horovod's own test): the variable moves every
    4th step only, by the steps' sum (or mean) averaged over the ranks; the global step
    advances at every step."""
    passes, steps = 4, 10

    def build():
        var = tf.compat.v1.Variable(np.zeros(2, dtype))
        value = tf.constant(np.full(1, RANK, dtype))
        grad = (tf.IndexedSlices(value, tf.constant([1]), tf.constant([2])) if sparse else
                tf.concat([tf.zeros([1], dtype), value], 0))
        opt = hvd.DistributedOptimizer(ConstantGradients(lambda: [(grad, var)]),
                                       backward_passes_per_step=passes, sparse_as_dense=sparse,
                                       average_aggregated_gradients=average)
        global_step = tf.compat.v1.Variable(np.int64(0), trainable=False)
        train = opt.apply_gradients(opt.compute_gradients(), global_step=global_step)
        with tf.control_dependencies([train]):
            return tf.identity(var.read_value()), global_step.read_value()
    per_update = np.mean(range(SIZE)) * (1 if average else passes)
    with context.graph_mode(), tf.Graph().as_default():
        var_value, step = build()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for i in range(steps):
                got, got_step = session.run([var_value, step])
                want = per_update * ((i + 1) // passes)
                np.testing.assert_allclose(got, [0, want], **tolerance(dtype), err_msg="step %d" % i)
                assert got_step == i + 1


def test_tf1_backward_passes_per_step_eagerly():
    var = tf.Variable(np.zeros(2, np.float32))
    grad = tf.constant([0.0, float(RANK)])
    opt = hvd.DistributedOptimizer(ConstantGradients(lambda: [(grad, var)]),
                                   backward_passes_per_step=3)
    global_step = tf.Variable(np.int64(0))
    for i in range(7):
        opt.apply_gradients(opt.compute_gradients(), global_step=global_step)
        assert int(global_step.numpy()) == i + 1
        np.testing.assert_allclose(var.numpy(), [0, 3 * np.mean(range(SIZE)) * ((i + 1) // 3)])


def test_tf1_indexed_slices_with_backward_passes_need_sparse_as_dense():
    with context.graph_mode(), tf.Graph().as_default():
        var = tf.compat.v1.Variable(np.zeros(2, np.float32))
        grad = tf.IndexedSlices(tf.ones([1]), tf.constant([0]), tf.constant([2]))
        opt = hvd.DistributedOptimizer(ConstantGradients(lambda: [(grad, var)]),
                                       backward_passes_per_step=2)
        with pytest.raises(ValueError, match="sparse_as_dense"):
            opt.compute_gradients()


@pytest.mark.parametrize("how", ["lists", "integer"])
def test_tf1_groups_and_local_variables(how):
    """Variable i gets gradient (r + 1) * (i + 1) on rank r: averaged over the ranks, except
    the local one's, which stays this rank's divided by the size."""
    def build():
        variables = [tf.compat.v1.Variable(np.zeros(3, np.float32)) for _ in range(4)]
        grads = [tf.fill([3], float((RANK + 1) * (i + 1))) for i in range(4)]
        groups = [[variables[2], variables[0]]] if how == "lists" else 2
        opt = hvd.DistributedOptimizer(ConstantGradients(lambda: list(zip(grads, variables))),
                                       groups=groups)
        opt.register_local_var(variables[3])
        return [g for g, _ in opt.compute_gradients()]
    got = in_a_session(build, steps=2)
    mean = np.mean([r + 1 for r in range(SIZE)])
    want = [mean, 2 * mean, 3 * mean, 4 * (RANK + 1) / SIZE]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.full(3, w), rtol=1e-6)


@pytest.mark.parametrize("passes", [1, 2])
def test_tf1_adasum_optimizer(passes):
    """Plain SGD (lr 0.1) on loss sum(c_r * w): each rank steps locally; every ``passes``-th
    step the ranks' changes since the last such step are Adasum-combined (NumPy reference)."""
    start = np.array([1.0, 2.0, -1.0])
    coeffs = [np.array([r + 1.0, 1.0, 0.5 * r]) for r in range(SIZE)]

    def build():
        w = tf.compat.v1.Variable(start)
        loss = tf.reduce_sum(w * tf.constant(coeffs[RANK]))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                       op=hvd.Adasum, backward_passes_per_step=passes)
        train = opt.minimize(loss)
        assert opt.get_slot(w, "delta_start") is not None
        with tf.control_dependencies([train]):
            return tf.identity(w.read_value())
    if not POWER_OF_2:
        with pytest.raises(tf.errors.OpError, match="power-of-2"):
            in_a_session(build, steps=passes)
        return
    got = in_a_session(build, steps=2 * passes)
    want = start.copy()
    for _ in range(2):
        want = want + adasum([-0.1 * passes * c for c in coeffs], np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-7)


def test_tf1_refusals():
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(ValueError, match="average_aggregated_gradients"):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum, average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    if SIZE > 1:
        subset = hvd.add_process_set([0])
        try:
            with pytest.raises(NotImplementedError, match="global process set"):
                hvd.DistributedOptimizer(sgd, op=hvd.Adasum, process_set=subset)
        finally:
            hvd.remove_process_set(subset)


# ---- BroadcastGlobalVariablesHook ----

@pytest.mark.parametrize("root", [0, SIZE - 1])
def test_broadcast_global_variables_hook(root):
    dtypes = ["float32", "float64", "int32", "int64", "float16"]
    with context.graph_mode(), tf.Graph().as_default():
        variables = [tf.compat.v1.get_variable("v%d" % i, initializer=np.full((2, i + 1), RANK + i, d))
                     for i, d in enumerate(dtypes)]
        tf.compat.v1.train.get_or_create_global_step()
        hook = hvd.BroadcastGlobalVariablesHook(root)
        assert isinstance(hook, tf.compat.v1.train.SessionRunHook)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as session:
            got = session.run(variables)
    for i, (g, d) in enumerate(zip(got, dtypes)):
        assert g.dtype == np.dtype(d)
        np.testing.assert_array_equal(g, np.full((2, i + 1), root + i, d))


# ---- mpi_ops ----

@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "float32", "float64"])
def test_mpi_ops_module(dtype):
    from hvlite.tensorflow.mpi_ops import (_allreduce, _grouped_allreduce, _reducescatter,
                                           allgather, check_num_rank_power_of_2,
                                           handle_average_backwards_compatibility, rank, size)
    assert (rank(), size()) == (RANK, SIZE)
    x = tf.constant(np.arange(SIZE * 2, dtype=dtype) + RANK)
    total = sum(np.arange(SIZE * 2, dtype=np.float64) + r for r in range(SIZE))
    np.testing.assert_allclose(_allreduce(x).numpy(), total)          # Sum by default
    np.testing.assert_allclose(_grouped_allreduce([x, x])[1].numpy(), total)
    np.testing.assert_allclose(_reducescatter(x).numpy(), total[RANK * 2:RANK * 2 + 2])
    np.testing.assert_array_equal(allgather(tf.fill([1], tf.cast(RANK, dtype))).numpy(),
                                  np.arange(SIZE, dtype=dtype))
    assert handle_average_backwards_compatibility(None, False) == hvd.Sum
    assert check_num_rank_power_of_2(4) and not check_num_rank_power_of_2(3)


# ---- Keras: BestModelCheckpoint, positional orders, load_model ----

@pytest.mark.parametrize("module", [hvdk, hvd_legacy_keras])
def test_best_model_checkpoint(module, tmp_path):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=module.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x = np.random.default_rng(RANK).normal(size=(8, 2)).astype(np.float32)
    y = x.sum(1, keepdims=True)
    checkpoint = module.callbacks.BestModelCheckpoint(monitor="loss")
    assert checkpoint.save_best_only and checkpoint.filepath is None
    with pytest.raises(ValueError, match="filepath"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[checkpoint])
    checkpoint.filepath = str(tmp_path / "best.keras")
    model.fit(x, y, epochs=2, verbose=0, callbacks=[checkpoint])
    loaded = module.load_model(checkpoint.filepath)
    assert hvdk.is_distributed(loaded.optimizer)
    assert [w.shape for w in loaded.get_weights()] == [w.shape for w in model.get_weights()]
    if module is hvdk:
        weights = hvdk.callbacks.BestModelCheckpoint(monitor="loss", save_weights_only=True)
        weights.filepath = str(tmp_path / "best.weights.h5")
        model.fit(x, y, epochs=1, verbose=0, callbacks=[weights])
        assert os.path.exists(weights.filepath)
    else:
        with pytest.raises(TypeError):
            module.callbacks.BestModelCheckpoint(save_weights_only=True)


def test_horovod_positional_orders():
    c = hvd.Compression.none
    # horovod.tensorflow.keras: (..., op, backward_passes_per_step, average_aggregated, num_groups)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), None, "", "", c, False, 1.0,
                                    hvd.Average, 1, False, 2)
    assert opt._hvlite_options["num_groups"] == 2
    # horovod.keras: (..., gradient_predivide_factor, op, num_groups)
    opt = hvd_legacy_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), None, "", "", c,
                                                False, 1.0, hvd.Sum, 3)
    assert opt._hvlite_options["num_groups"] == 3 and opt._hvlite_options["op"] == hvd.Sum
    # horovod.tensorflow: (optimizer, name, use_locking, device_dense, device_sparse,
    # compression, sparse_as_dense, backward_passes_per_step, op, ...)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), "named", True, "", "", c, True,
                                   1, hvd.Sum)
    assert opt.name == "named" and opt._hvlite_options["sparse_as_dense"]
    assert opt._hvlite_options["op"] == hvd.Sum
    v1 = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), "v1", True)
    assert v1.get_name() == "v1" and v1._use_locking
    total = hvd_legacy_keras.allreduce(np.ones(2, np.float32), op=hvd.Sum).numpy()
    np.testing.assert_array_equal(total, np.full(2, SIZE, np.float32))
    np.testing.assert_array_equal(hvd_legacy_keras.allreduce(np.ones(2, np.float32)).numpy(),
                                  np.ones(2, np.float32))
    # DistributedGradientTape.gradient: (target, sources, output_gradients, use_generic_names)
    x = tf.Variable([1.0, 2.0])
    with hvd.DistributedGradientTape(tf.GradientTape()) as tape:
        loss = tf.reduce_sum(x * x)
    np.testing.assert_array_equal(tape.gradient(loss, [x], None, True)[0].numpy(), [2.0, 4.0])


@pytest.mark.parametrize("legacy_opts", [False, True])
def test_load_model_legacy_opts(legacy_opts):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), epochs=1, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.keras")
        model.save(path)
        loaded = hvdk.load_model(path, None, None, hvd.Compression.none, legacy_opts)
    assert hvdk.is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "Adam"


# ---- the last names: register_local_var, CommitStateCallback.commit, check_num_rank_power_of_2 ----

@pytest.mark.parametrize("module", [hvdk, hvd_legacy_keras])
def test_register_local_var_keeps_a_variable_out_of_the_broadcast(module):
    mine = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(RANK + 1.0))
    model = keras.Sequential([keras.Input((3,)), mine])
    callback = module.callbacks.BroadcastGlobalVariablesCallback(0)
    callback.register_local_var(mine.kernel)
    callback.set_model(model)
    callback.on_train_begin()
    np.testing.assert_array_equal(mine.kernel.numpy(), np.full((3, 2), RANK + 1.0, np.float32))
    np.testing.assert_array_equal(mine.bias.numpy(),
                                  hvd.broadcast(mine.bias.value, 0).numpy())


def test_commit_state_callback_commit_commits_now():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    state = hvdk.elastic.KerasState(model, batch=0, epoch=0)
    callback = hvdk.elastic.CommitStateCallback(state, batches_per_commit=100)
    committed = [w + 1 for w in model.get_weights()]     # not what the state saved at start
    model.set_weights(committed)
    callback.commit()
    model.set_weights([w + 2 for w in committed])
    state.restore()                       # back to what commit() saved
    for got, want in zip(model.get_weights(), committed):
        np.testing.assert_array_equal(got, want)


def test_check_num_rank_power_of_2():
    assert [hvd.check_num_rank_power_of_2(n) for n in (1, 2, 3, 4, 6, 8)] == \
        [True, True, False, True, False, True]
    assert hvd.check_num_rank_power_of_2 is hvd.mpi_ops.check_num_rank_power_of_2
