"""hvlite.tensorflow.DistributedOptimizer on TF1 optimizers (tf.compat.v1.train): n ranks each
training on their own rows give what one process gives on all the rows together, in a TF1
graph run by a Session (dense and tf.IndexedSlices gradients, momentum slots) and eagerly;
the refused options raise ValueError (backward_passes_per_step, groups and Adasum:
test_tf_horovod_parity.py). SPMD: run by hvlrun (tests/test_spmd.py)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvlite.tensorflow as hvd  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

RANK, SIZE = hvd.rank(), hvd.size()
ROWS, STEPS = 4, 3


def rows_of(rank, step_):
    """Rank ``rank``'s batch at ``step_``: ids into a 5-row embedding, features, targets."""
    rng = np.random.default_rng(1000 * step_ + rank)
    ids = rng.integers(0, 5, size=ROWS).astype(np.int32)
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    y = (x.sum(1, keepdims=True) + ids[:, None] * 0.5).astype(np.float32)
    return ids, x, y


def all_rows(step_):
    parts = [rows_of(r, step_) for r in range(SIZE)]
    return tuple(np.concatenate(p) for p in zip(*parts))


START = dict(w=np.linspace(-0.5, 0.5, 3).reshape(3, 1).astype(np.float32),
             emb=np.linspace(0.0, 1.0, 5).reshape(5, 1).astype(np.float32))


def loss_of(w, emb, ids, x, y):
    pred = tf.matmul(x, w) + tf.gather(emb, ids)
    return tf.reduce_mean(tf.square(pred - y))


def reference(make_optimizer):
    """One process, all the rows, eagerly: the values after STEPS steps and the momentum slot."""
    w, emb = tf.Variable(START["w"]), tf.Variable(START["emb"])
    opt = make_optimizer()
    for s in range(STEPS):
        ids, x, y = all_rows(s)
        opt.minimize(lambda: loss_of(w, emb, ids, x, y), var_list=[w, emb])
    slot = opt.get_slot(w, "momentum")
    return w.numpy(), emb.numpy(), None if slot is None else slot.numpy()


def momentum():
    return tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)


def sgd():
    return tf.compat.v1.train.GradientDescentOptimizer(0.1)


def check(got, want, what):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg="%s on rank %d" % (what, RANK))


def test_tf1_graph_with_a_session():
    want_w, want_emb, want_slot = reference(momentum)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=START["w"])
        emb = tf.compat.v1.get_variable("emb", initializer=START["emb"])
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        opt = hvd.DistributedOptimizer(momentum())
        assert isinstance(opt, tf.compat.v1.train.Optimizer)
        train = opt.minimize(loss_of(w, emb, ids, x, y), var_list=[w, emb])
        slot = opt.get_slot(w, "momentum")
        assert slot is not None and "momentum" in opt.get_slot_names()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                mine = rows_of(RANK, s)
                sess.run(train, feed_dict={ids: mine[0], x: mine[1], y: mine[2]})
            got_w, got_emb, got_slot = sess.run([w, emb, slot])
    check(got_w, want_w, "w")
    check(got_emb, want_emb, "embedding (IndexedSlices gradients)")
    check(got_slot, want_slot, "momentum slot")


def test_a_metric_allreduce_does_not_run_the_training_step():
    """A metric's allreduce made before or after the training step is its own op in a TF1
    graph: fetching it needs none of the step's inputs and runs none of its collectives, and
    the step runs none of the metric's."""
    with tf.Graph().as_default():
        value = tf.compat.v1.placeholder(tf.float32, [], name="metric_value")
        before = hvd.allreduce(value, op=hvd.Sum, name="metric_before")
        w = tf.compat.v1.get_variable("w", initializer=START["w"])
        emb = tf.compat.v1.get_variable("emb", initializer=START["emb"])
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        train = hvd.DistributedOptimizer(sgd()).minimize(loss_of(w, emb, ids, x, y),
                                                        var_list=[w, emb])
        after = hvd.allreduce(value, op=hvd.Sum, name="metric_after")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            want = sum(r + 1.0 for r in range(SIZE))
            assert sess.run(after, {value: RANK + 1.0}) == want      # no step input fed
            mine = rows_of(RANK, 0)
            sess.run(train, {ids: mine[0], x: mine[1], y: mine[2]})  # no metric value fed
            assert sess.run(after, {value: RANK + 1.0}) == want
            assert sess.run(before, {value: RANK + 1.0}) == want


def test_eagerly_with_a_callable_loss():
    # plain SGD: with momentum, a densified gradient moves rows a sparse one leaves alone
    want_w, want_emb, _ = reference(sgd)
    w, emb = tf.Variable(START["w"]), tf.Variable(START["emb"])
    opt = hvd.DistributedOptimizer(sgd(), sparse_as_dense=True)
    for s in range(STEPS):
        ids, x, y = rows_of(RANK, s)
        opt.minimize(lambda: loss_of(w, emb, ids, x, y), var_list=[w, emb])
    check(w.numpy(), want_w, "w")
    check(emb.numpy(), want_emb, "embedding (densified)")


@pytest.mark.parametrize("kwargs", [dict(backward_passes_per_step=0), dict(groups=0),
                                    dict(op=hvd.Adasum, average_aggregated_gradients=True),
                                    dict(op=hvd.Sum, gradient_predivide_factor=2.0)])
def test_refused_options(kwargs):
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(momentum(), **kwargs)
