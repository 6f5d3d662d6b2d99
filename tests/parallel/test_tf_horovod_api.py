"""Horovod's TensorFlow API beyond the basic collectives, on every rank against NumPy
references: ops in a TF1 graph run by a Session (names, values, objects,
broadcast_global_variables), grouped_allgather / grouped_reducescatter,
process_set_included_op, PartialDistributedGradientTape, the error classes Horovod's
tests catch, and ``hvlite.keras`` (horovod.keras's name). SPMD: run by hvlrun at 2 and 3 ranks (tests/test_spmd.py)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

import hvlite.tensorflow as hvd  # noqa: E402

RANK, SIZE = hvd.rank(), hvd.size()


def session_run(build):
    """Build ops in a fresh TF1 graph and run them twice in a Session (same results)."""
    with context.graph_mode(), tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            first = session.run(fetches)
            second = session.run(fetches)
    tf.nest.map_structure(np.testing.assert_array_equal, first, second)
    return first


def test_session_collectives():
    def build():
        x = tf.fill([2, 3], float(RANK + 1))
        return [hvd.allreduce(x, op=hvd.Sum), hvd.allgather(tf.fill([RANK + 1], RANK)),
                hvd.broadcast(x, SIZE - 1), hvd.reducescatter(tf.ones([SIZE, 2]), op=hvd.Sum)]
    total, gathered, bcast, scattered = session_run(build)
    np.testing.assert_array_equal(total, np.full((2, 3), SIZE * (SIZE + 1) / 2))
    np.testing.assert_array_equal(gathered, np.concatenate([[r] * (r + 1) for r in range(SIZE)]))
    np.testing.assert_array_equal(bcast, np.full((2, 3), float(SIZE)))
    np.testing.assert_array_equal(scattered, np.full((1, 2), float(SIZE)))


def test_session_objects_and_global_variables():
    with context.graph_mode(), tf.Graph().as_default():
        # Python objects: run at once, as eagerly
        assert hvd.broadcast_object({"r": RANK}, root_rank=SIZE - 1) == {"r": SIZE - 1}
        assert hvd.allgather_object(RANK) == list(range(SIZE))
        v = tf.compat.v1.Variable(np.full(3, RANK, np.float32))
        op = hvd.broadcast_global_variables(SIZE - 1)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(op)
            np.testing.assert_array_equal(session.run(v), np.full(3, SIZE - 1))
    with pytest.raises(RuntimeError, match="TF1 graph"):
        hvd.broadcast_global_variables(0)


@pytest.mark.parametrize("mode", ["eager", "function", "session"])
def test_grouped_allgather_and_reducescatter(mode):
    def body():
        a = tf.fill([RANK + 1, 2], float(RANK))
        b = tf.fill([RANK + 2], RANK * 10)
        gathered = hvd.grouped_allgather([a, b])
        scattered = hvd.grouped_reducescatter([tf.fill([2 * SIZE + 1, 2], float(RANK + 1)),
                                               tf.fill([SIZE], RANK + 1)], op=hvd.Sum)
        return gathered + scattered
    if mode == "eager":
        got = [t.numpy() for t in body()]
    elif mode == "function":
        got = [t.numpy() for t in tf.function(body)()]
    else:
        got = session_run(body)
    np.testing.assert_array_equal(got[0], np.concatenate([np.full((r + 1, 2), float(r))
                                                          for r in range(SIZE)]))
    np.testing.assert_array_equal(got[1], np.concatenate([np.full(r + 2, r * 10)
                                                          for r in range(SIZE)]))
    total = SIZE * (SIZE + 1) / 2
    rows = 2 + (1 if RANK < 1 else 0)           # 2 * SIZE + 1 rows: rank 0 gets one more
    np.testing.assert_array_equal(got[2], np.full((rows, 2), total))
    np.testing.assert_array_equal(got[3], np.full(1, int(total)))


def test_process_set_included_op():
    subset = hvd.add_process_set([0]) if SIZE > 1 else None
    try:
        assert int(hvd.process_set_included_op(0)) == 1
        if subset is not None:
            assert int(hvd.process_set_included_op(subset.process_set_id)) == int(RANK == 0)
    finally:
        if subset is not None:
            hvd.remove_process_set(subset)


def test_partial_distributed_gradient_tape():
    """The local layer's gradient stays on this rank (divided by size, as Horovod's default);
    the others are averaged over ranks."""
    shared = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(1.0))
    local = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(RANK + 1.0))
    x = tf.constant([[float(RANK + 1), 1.0, 2.0]])
    out = local(shared(x))      # builds both layers
    variables = shared.trainable_weights + local.trainable_weights

    def grads(tape_fn):
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(local(shared(x)) ** 2)
        plain = tape.gradient(loss, variables)
        return plain, tape_fn(tape).gradient(loss, variables)
    plain, got = grads(lambda t: hvd.PartialDistributedGradientTape(t, local_layers=[local]))
    del out
    for var, p, g in zip(variables, plain, got):
        if any(var is w for w in local.trainable_weights):
            np.testing.assert_allclose(g.numpy(), p.numpy() / SIZE, rtol=1e-6)
        else:
            everyone = hvd.allgather(tf.expand_dims(p, 0)).numpy()
            np.testing.assert_allclose(g.numpy(), everyone.mean(axis=0), rtol=1e-5)
    _, unscaled = grads(lambda t: hvd.PartialDistributedGradientTape(
        t, local_layers=local, scale_local_gradients=False))
    np.testing.assert_allclose(unscaled[-2].numpy(), plain[-2].numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="keras.layers.Layer"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=["not a layer"])


def test_error_classes():
    # ranks disagree: MismatchError, also tf.errors.FailedPreconditionError (as Horovod's ops)
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        hvd.allreduce(tf.zeros([3 + (RANK == 0)]), name="api.mismatch")
    assert isinstance(info.value, hvd.MismatchError)
    assert "api.mismatch" in str(info.value)
    # unsupported reduction of IndexedSlices: NotImplementedError (HvliteNotSupportedError)
    slices = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([RANK]))
    for op in (hvd.Min, hvd.Max, hvd.Product):
        with pytest.raises(NotImplementedError, match="Sum and Average"):
            hvd.allreduce(slices, op=op)
        with pytest.raises(NotImplementedError):
            hvd.grouped_allreduce([slices], op=op)


def test_partial_distributed_optimizer_and_local_variables_callback():
    import hvlite.tensorflow.keras as hvd_keras
    shared = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(1.0))
    local = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(RANK + 1.0))
    model = keras.Sequential([keras.Input((3,)), shared, local])
    x = tf.constant([[float(RANK + 1), 1.0, 2.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    variables = model.trainable_weights
    grads = tape.gradient(loss, variables)
    before = [v.numpy().copy() for v in variables]
    opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=local)
    opt.apply(grads, variables)
    for var, g, b in zip(variables, grads, before):
        if any(var is w for w in local.trainable_weights):
            expected = b - g.numpy() / SIZE
        else:
            expected = b - hvd.allgather(tf.expand_dims(g, 0)).numpy().mean(axis=0)
        np.testing.assert_allclose(var.numpy(), expected, rtol=1e-5, atol=1e-6)
    # the callback broadcasts every variable but the local ones
    kept = [v.numpy().copy() for v in local.weights]
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
        SIZE - 1, local_variables=local.weights)
    callback.set_model(model)
    callback.on_train_begin()
    for v, k in zip(local.weights, kept):
        np.testing.assert_array_equal(v.numpy(), k)
    for v in shared.weights:
        root = hvd.broadcast(v.value, SIZE - 1).numpy()
        np.testing.assert_array_equal(v.numpy(), root)


def test_gradient_tape_on_a_set_this_rank_is_not_in():
    """Members average over the set; a rank outside it keeps its own gradient (Horovod's)."""
    members = [0, SIZE - 1] if SIZE > 2 else [0]
    subset = hvd.add_process_set(members)
    try:
        x = tf.constant(float(RANK + 1))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x * x
        got = hvd.DistributedGradientTape(tape, process_set=subset).gradient(y, [x])[0]
        expected = (np.mean([2.0 * (r + 1) for r in members]) if RANK in members
                    else 2.0 * (RANK + 1))
        assert float(got) == pytest.approx(expected)
    finally:
        hvd.remove_process_set(subset)


def test_session_ops_fetched_together_run_in_one_order():
    """Many independent collectives fetched in one Session run, on one TensorFlow thread, give
    the right values (they run in the order they were made on every rank); an op already run
    does not chain the next one (running that one sends one request)."""
    import hvlite
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=1,
                                      use_per_session_threads=True)   # not the global pool
    config.graph_options.rewrite_options.disable_meta_optimizer = True   # keep the identities
    with context.graph_mode(), tf.Graph().as_default():
        # inputs behind chains of identities, long for the first ops on even ranks and for
        # the last ones on odd ranks, so their inputs are ready in different orders
        outs = []
        for k in range(12):
            x = tf.fill([RANK + 1, k + 1], float(k))
            for _ in range(3 * (11 - k if RANK % 2 else k)):
                x = tf.identity(x)
            outs.append(hvd.allgather(x))
        with tf.compat.v1.Session(config=config) as session:
            got = session.run(outs)
            for k, g in enumerate(got):
                np.testing.assert_array_equal(g, np.full((SIZE * (SIZE + 1) // 2, k + 1), k))
            later = hvd.allreduce(tf.ones([2]), op=hvd.Sum)
            before = hvlite.engine_counters()["tensors_submitted"]
            np.testing.assert_array_equal(session.run(later), np.full(2, float(SIZE)))
            assert hvlite.engine_counters()["tensors_submitted"] - before == 1


def test_session_ops_already_run_fetched_again_together():
    """Ops that already ran are not chained; fetched again together, each holds one TensorFlow
    thread while it waits, so a Session with at least that many inter-op threads (the advice of
    docs/guides/tensorflow.md) runs every one of them at every fetch (Horovod's allgather-fused
    test pattern)."""
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=16,
                                      use_per_session_threads=True)
    with context.graph_mode(), tf.Graph().as_default(), \
            tf.compat.v1.Session(config=config) as session:
        outs = []
        for k in range(12):
            outs.append(hvd.allgather(tf.fill([RANK + 1, 2], float(k))))
            got = session.run(outs)
            for j, g in enumerate(got):
                np.testing.assert_array_equal(g, np.full((SIZE * (SIZE + 1) // 2, 2), j))


def test_unknown_process_set_raises_when_the_graph_is_built():
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10        # never registered
    for build in (lambda: hvd.allreduce(tf.ones(2), process_set=fake),
                  lambda: tf.function(lambda: hvd.allreduce(tf.ones(2), process_set=fake))()):
        with pytest.raises(ValueError, match="process set 10"):
            with context.graph_mode(), tf.Graph().as_default():
                build()
    with pytest.raises(ValueError, match="process set 10"):
        hvd.allreduce(tf.ones(2), process_set=fake)
    hvd.barrier()   # nothing above talks to the other ranks: finish together


def test_broadcast_in_place_in_a_session():
    """broadcast_ returns tensors that assign root's values when a Session evaluates them."""
    with context.graph_mode(), tf.Graph().as_default():
        v = tf.compat.v1.Variable(np.full(4, RANK, np.int32))
        w = tf.compat.v1.Variable(np.full((2, 2), float(RANK)))
        assigned = hvd.broadcast_([v, w], SIZE - 1)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run(assigned)
            np.testing.assert_array_equal(got[0], np.full(4, SIZE - 1))
            np.testing.assert_array_equal(session.run(v), np.full(4, SIZE - 1))
            np.testing.assert_array_equal(session.run(w), np.full((2, 2), float(SIZE - 1)))
    x = tf.Variable(np.full(3, float(RANK)))
    hvd.broadcast_([x], 0)
    np.testing.assert_array_equal(x.numpy(), np.zeros(3))


def test_indexed_slices_average_of_integers():
    """Average of integer IndexedSlices divides truly (float values), as Horovod's."""
    slices = tf.IndexedSlices(tf.fill([1, 2], tf.constant(RANK + 1, tf.uint8)),
                              tf.constant([RANK]))
    got = hvd.allreduce(slices, op=hvd.Average)
    assert got.values.dtype == tf.float32
    np.testing.assert_allclose(got.values.numpy(),
                               np.repeat([[(r + 1) / SIZE] for r in range(SIZE)], 2, axis=1))
    np.testing.assert_array_equal(got.indices.numpy(), np.arange(SIZE))


def test_session_variable_broadcast_is_not_chained_to_a_training_step():
    """A variable broadcast made after a training graph fed by a placeholder runs on its own."""
    with context.graph_mode(), tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2])
        v = tf.compat.v1.Variable(np.full(2, float(RANK), np.float32))
        step = v.assign_sub(hvd.allreduce(x * v))       # not run before the broadcast
        bcast = hvd.broadcast_global_variables(SIZE - 1)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(bcast)                            # no value for x needed
            np.testing.assert_array_equal(session.run(v), np.full(2, float(SIZE - 1)))
            session.run(step, feed_dict={x: np.ones(2, np.float32)})
            np.testing.assert_allclose(session.run(v), np.zeros(2))


def test_horovod_keras_import_name():
    """``import horovod.keras as hvd`` becomes ``import hvlite.keras as hvd``: the same API as
    hvlite.tensorflow.keras (as Horovod's two Keras modules are), build facts included, but
    for the names whose signatures differ in horovod.keras."""
    import hvlite.keras as hvd_k
    import hvlite.keras.callbacks as callbacks
    import hvlite.tensorflow.keras as hvd_tfk
    assert hvd_k.callbacks is callbacks and hvd_k.elastic is hvd_tfk.elastic
    assert callbacks.BestModelCheckpoint is not hvd_tfk.callbacks.BestModelCheckpoint
    for name in hvd_tfk.callbacks.__all__:
        if name != "BestModelCheckpoint":
            assert getattr(callbacks, name) is getattr(hvd_tfk.callbacks, name), name
    own = {"DistributedOptimizer", "allreduce", "callbacks"}
    for name in hvd_tfk.__all__:
        assert (getattr(hvd_k, name) is getattr(hvd_tfk, name)) == (name not in own), name
    for name in ("gloo_enabled", "gloo_built", "cuda_built", "rocm_built", "ddl_built", "ccl_built"):
        assert getattr(hvd_k, name)() in (True, False), name
    assert hvd_k.size() == SIZE
