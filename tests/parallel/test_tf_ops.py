"""hvlite.tensorflow collectives x dtypes x shapes, eagerly and inside tf.function, checked on
every rank against a NumPy reference built from all ranks' seeded inputs; gradients of
allreduce, allgather, broadcast, alltoall and reducescatter; variables and objects.
SPMD: run by hvlrun (tests/test_spmd.py)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvlite  # noqa: E402
import hvlite.buffers  # noqa: E402
import hvlite.tensorflow as hvd  # noqa: E402
from reference import BFLOAT16, DTYPES, FLOATS, SHAPES, assert_equal, inputs, reduce  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
RANK, SIZE = hvd.rank(), hvd.size()
MODES = ["eager", "graph"]


def all_inputs(seed, dtype, shape):
    return [inputs(seed, r, dtype, shape) for r in range(SIZE)]


def in_mode(mode, fn):
    """``fn`` itself (eager) or as a tf.function; graph results are run twice (names reused)."""
    if mode == "eager":
        return fn
    traced = tf.function(fn)

    def twice(*args):
        first = traced(*args)
        second = traced(*args)
        tf.nest.map_structure(lambda a, b: np.testing.assert_array_equal(a.numpy(), b.numpy()),
                              first, second)
        return second
    return twice


def numpy_of(tensor, dtype):
    out = tensor.numpy()
    return np.asarray(out, dtype=dtype) if np.ndim(out) == 0 else out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce(dtype, mode):
    ops = [o for o in OPS if not (dtype == np.bool_ and o == "Average")]
    xs = {s: all_inputs(1, dtype, s) for s in SHAPES}
    fn = in_mode(mode, lambda mine: [[hvd.allreduce(t, op=OPS[o]) for o in ops] for t in mine])
    got = fn([tf.constant(xs[s][RANK]) for s in SHAPES])
    for shape, row in zip(SHAPES, got):
        for opname, result in zip(ops, row):
            expected = reduce(np.stack(xs[shape]), opname, dtype, SIZE)
            assert result.shape == shape
            assert_equal(numpy_of(result, dtype), expected,
                         "%s allreduce %s %s %s" % (mode, opname, dtype, shape), dtype,
                         exact=opname != "Average")


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_scale_compression_grouped(mode):
    xs = {d: all_inputs(2, d, (5, 3)) for d in FLOATS}
    stacked = {d: np.stack(xs[d]).astype(np.float64) for d in FLOATS}

    def body(mine):
        scaled = [hvd.allreduce(mine[d.name], op=hvd.Average, prescale_factor=0.5,
                                postscale_factor=0.5) for d in FLOATS]
        fp16 = hvd.allreduce(mine["float32"], op=hvd.Sum, compression=hvd.Compression.fp16)
        grouped = hvd.grouped_allreduce([mine[d.name] for d in FLOATS], op=hvd.Sum)
        return scaled, fp16, grouped
    scaled, fp16, grouped = in_mode(mode, body)({d.name: tf.constant(xs[d][RANK]) for d in FLOATS})
    for d, s, g in zip(FLOATS, scaled, grouped):
        assert_equal(numpy_of(s, d), (stacked[d].sum(0) * 0.25 / SIZE).astype(d), "scaled %s" % d,
                     d, exact=False)
        assert_equal(numpy_of(g, d), stacked[d].sum(0).astype(d), "grouped %s" % d)
    assert fp16.dtype == tf.float32
    assert_equal(fp16.numpy(), stacked[np.dtype("float32")].sum(0).astype(np.float32), "fp16")


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_indexed_slices(mode):
    values = [np.full((r + 1, 3), r + 1, np.float32) for r in range(SIZE)]
    indices = [np.arange(r + 1, dtype=np.int64) for r in range(SIZE)]

    def body(v, i):
        slices = tf.IndexedSlices(v, i, dense_shape=tf.constant([SIZE + 1, 3], tf.int64))
        avg = hvd.allreduce(slices)
        total = hvd.allreduce(slices, op=hvd.Sum)
        return avg.values, avg.indices, total.values, tf.convert_to_tensor(total)
    avg_v, avg_i, sum_v, dense = in_mode(mode, body)(tf.constant(values[RANK]), tf.constant(indices[RANK]))
    assert_equal(avg_v.numpy(), np.concatenate(values) / SIZE, "sparse Average values")
    assert_equal(avg_i.numpy(), np.concatenate(indices), "sparse indices")
    assert_equal(sum_v.numpy(), np.concatenate(values), "sparse Sum values")
    expected = np.zeros((SIZE + 1, 3), np.float32)
    np.add.at(expected, np.concatenate(indices), np.concatenate(values))
    assert_equal(dense.numpy(), expected, "sparse Sum densified")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_broadcast(dtype, mode):
    shapes = [(), (0,), (7,), (3, 4), (2, 0, 3)]
    ragged = [[inputs(3, r, dtype, (r + 1,) + s[1:]) if s else inputs(3, r, dtype, s)
               for r in range(SIZE)] for s in shapes]
    same = [all_inputs(8, dtype, s) for s in shapes]
    roots = list(range(SIZE))

    def body(mine, mine_same):
        gathered = [hvd.allgather(t) for t in mine]
        bcast = [[hvd.broadcast(t, root) for root in roots] for t in mine_same]
        return gathered, bcast
    gathered, bcast = in_mode(mode, body)([tf.constant(x[RANK]) for x in ragged],
                                          [tf.constant(x[RANK]) for x in same])
    for shape, xs, g, b, bxs in zip(shapes, ragged, gathered, bcast, same):
        expected = np.concatenate([x if x.ndim else x.reshape(1) for x in xs])
        assert_equal(g.numpy(), expected, "%s allgather %s %s" % (mode, dtype, shape))
        for root, got in zip(roots, b):
            assert_equal(numpy_of(got, dtype), bxs[root], "%s broadcast %s %s root %d"
                         % (mode, dtype, shape, root))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.dtype(t) for t in ("int32", "float32", "float16", "bool")], ids=str)
def test_alltoall_reducescatter(dtype, mode):
    splits = [[(r + d) % 3 for d in range(SIZE)] for r in range(SIZE)]   # rank r sends splits[r][d] rows to d
    xs = [inputs(4, r, dtype, (sum(splits[r]), 2)) for r in range(SIZE)]
    even = [inputs(5, r, dtype, (2 * SIZE, 3)) for r in range(SIZE)]
    rs = all_inputs(6, dtype, (2 * SIZE + 1, 2))
    ops = ["Sum", "Min", "Max"]

    def body(x, e, r):
        out, received = hvd.alltoall(x, splits=tf.constant(splits[RANK], tf.int32))
        out_even = hvd.alltoall(e)      # no splits: the tensor alone, as Horovod's
        received_even = hvd.alltoall(e, splits=tf.fill([SIZE], 2))[1]
        scattered = [hvd.reducescatter(r, op=OPS[o]) for o in ops]
        return out, received, out_even, received_even, scattered
    out, received, out_even, received_even, scattered = in_mode(mode, body)(
        tf.constant(xs[RANK]), tf.constant(even[RANK]), tf.constant(rs[RANK]))
    offsets = [np.concatenate([[0], np.cumsum(splits[r])]) for r in range(SIZE)]
    expected = np.concatenate([xs[r][offsets[r][RANK]:offsets[r][RANK + 1]] for r in range(SIZE)])
    assert_equal(out.numpy(), expected, "%s alltoall splits %s" % (mode, dtype))
    assert_equal(received.numpy(), np.array([splits[r][RANK] for r in range(SIZE)], np.int32), "received splits")
    expected_even = np.concatenate([e[2 * RANK:2 * RANK + 2] for e in even])
    assert_equal(out_even.numpy(), expected_even, "%s alltoall equal %s" % (mode, dtype))
    assert_equal(received_even.numpy(), np.full(SIZE, 2, np.int32), "received splits (equal)")
    dim0 = 2 * SIZE + 1
    start = RANK * (dim0 // SIZE) + min(RANK, dim0 % SIZE)
    rows = dim0 // SIZE + (1 if RANK < dim0 % SIZE else 0)
    for opname, got in zip(ops, scattered):
        full = reduce(np.stack(rs), opname, dtype, SIZE)
        assert_equal(got.numpy(), full[start:start + rows], "%s reducescatter %s %s" % (mode, opname, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_results_are_adopted_engine_buffers(dtype):
    """Eager out-of-place allreduce, broadcast and reducescatter of results over 4 MiB: right
    values, and (but for bfloat16, which DLPack cannot carry and TensorFlow copies) the tensor
    is the engine's huge-page buffer itself, adopted through DLPack without a copy."""
    rows = SIZE * (hvlite.buffers.HUGE_MIN // dtype.itemsize // 4) + 1
    xs = all_inputs(12, dtype, (rows, 4))
    mine = tf.constant(xs[RANK])
    counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    first = sum(counts[:RANK])
    results = {"allreduce": (hvd.allreduce(mine, op=hvd.Sum), 0),
               "reducescatter": (hvd.reducescatter(mine, op=hvd.Sum), first)}
    for what, (got, offset) in results.items():
        values = np.asarray(got)
        if dtype != BFLOAT16:
            assert values.ctypes.data % (2 << 20) == 0, "%s %s was copied" % (what, dtype)
        for start in range(0, len(values), 1 << 16):     # the reference a block at a time
            block = slice(offset + start, offset + min(start + (1 << 16), len(values)))
            expected = reduce(np.stack([x[block] for x in xs]), "Sum", dtype, SIZE)
            assert_equal(values[start:start + (1 << 16)], expected, "%s %s" % (what, dtype))
    got = np.asarray(hvd.broadcast(mine, SIZE - 1))
    assert_equal(got, xs[SIZE - 1], "broadcast %s" % dtype)


@pytest.mark.parametrize("mode", MODES)
def test_gradients(mode):
    x_all = [np.arange(6, dtype=np.float32).reshape(3, 2) * (r + 1) for r in range(SIZE)]
    w_all = [np.linspace(-1, 1, 6).reshape(3, 2).astype(np.float32) + r for r in range(SIZE)]
    root = SIZE - 1

    def grads(x, w):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            losses = {
                "allreduce_avg": tf.reduce_sum(hvd.allreduce(x) * w),
                "allreduce_sum_scaled": tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0) * w),
                "allgather": tf.reduce_sum(hvd.allgather(x) * tf.tile(w, [SIZE, 1])),
                "broadcast": tf.reduce_sum(hvd.broadcast(x, root) * w),
                "alltoall": tf.reduce_sum(hvd.alltoall(tf.tile(x, [SIZE, 1])) * tf.tile(w, [SIZE, 1])),
                "reducescatter": tf.reduce_sum(hvd.reducescatter(tf.tile(x, [SIZE, 1]), op=hvd.Sum) * w),
            }
        return {k: tape.gradient(v, x) for k, v in losses.items()}
    got = in_mode(mode, grads)(tf.constant(x_all[RANK]), tf.constant(w_all[RANK]))
    w_sum = np.sum(w_all, axis=0)
    expected = {
        "allreduce_avg": w_sum / SIZE,
        "allreduce_sum_scaled": 2 * w_sum,
        # Horovod's formulas (tests/parallel/test_tf_gradients.py checks them in detail)
        "allgather": w_sum / SIZE,
        "broadcast": w_sum / SIZE if RANK == root else np.zeros_like(w_sum),
        # rank d receives every rank's x (alltoall) / the sum of the x's (reducescatter) and
        # weighs it with w_d; reducescatter's gradient is scaled by size for Sum, as Horovod's
        "alltoall": w_sum,
        "reducescatter": SIZE * w_sum,
    }
    for key, value in expected.items():
        np.testing.assert_allclose(got[key].numpy(), value, rtol=1e-6, err_msg="%s grad %s" % (mode, key))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_variables(mode):
    values = [inputs(7, r, np.dtype("float32"), (4, 3)) for r in range(SIZE)]
    counts = [np.array(r * 10, np.int64) for r in range(SIZE)]
    w = tf.Variable(values[RANK])
    c = tf.Variable(counts[RANK])
    root = SIZE - 1
    def fn():
        hvd.broadcast_variables([w, c], root_rank=root)
    (fn if mode == "eager" else tf.function(fn))()
    assert_equal(w.numpy(), values[root], "broadcast_variables w")
    assert_equal(c.numpy(), counts[root], "broadcast_variables c")


def test_objects_and_basics():
    obj = hvd.broadcast_object({"rank": RANK, "data": [1, 2]}, root_rank=SIZE - 1)
    assert obj == {"rank": SIZE - 1, "data": [1, 2]}
    assert hvd.allgather_object(("r", RANK)) == [("r", r) for r in range(SIZE)]
    assert int(hvd.size_op()) == SIZE and int(hvd.rank_op()) == RANK
    hvd.barrier()
    tf.function(lambda: hvd.barrier())()
    with pytest.raises(RuntimeError, match="eagerly"):
        tf.function(lambda: hvd.broadcast_object(1))()


def test_static_shapes_and_stable_names():
    @tf.function
    def step(x):
        return hvd.allreduce(x), hvd.allgather(x), hvd.reducescatter(x), hvd.alltoall(x)
    x = tf.ones([2 * SIZE, 3])
    shapes = [o.shape.as_list() for o in tf.nest.flatten(step.get_concrete_function(x).structured_outputs)]
    rows = 2 * SIZE // SIZE
    assert shapes == [[2 * SIZE, 3], [None, 3], [rows, 3], [None, 3]], shapes
    step(x)
    before = hvlite.engine_counters()
    for _ in range(3):
        step(x)
    after = hvlite.engine_counters()
    assert after["cache_hits"] - before["cache_hits"] >= 3 * 4, (before, after)


# ---- bad input: a clear error on every rank, no hang; the engine keeps working ----

ODD = 1   # the rank that disagrees


def expect_mismatch(exc_type, fn, name, field, mine, odd):
    with pytest.raises(exc_type) as info:
        fn()
    msg = str(info.value)
    others = ",".join(str(r) for r in range(SIZE) if r != ODD)
    assert "'%s'" % name in msg and "ranks disagree on the %s" % field in msg, msg
    assert "%s on %s %s" % (mine, "ranks" if SIZE > 2 else "rank", others) in msg, msg
    assert "%s on rank %d" % (odd, ODD) in msg, msg
    return info.value


@pytest.mark.parametrize("mode", MODES)
def test_mismatched_shapes(mode):
    exc = hvd.MismatchError if mode == "eager" else tf.errors.OpError
    shape = (4,) if RANK == ODD else (3,)
    name = "tf.%s.shape" % mode
    fn = lambda: hvd.allreduce(tf.zeros(shape), name=name)  # noqa: E731
    error = expect_mismatch(exc, fn if mode == "eager" else tf.function(fn), name, "shape", "[3]",
                            "[4]")
    if mode == "eager":     # also the class Horovod's TF ops raise
        assert isinstance(error, tf.errors.FailedPreconditionError), type(error).__mro__
    gname = "tf.%s.gather" % mode
    gather = lambda: hvd.allgather(tf.zeros((RANK + 1, 3 if RANK == ODD else 2)), name=gname)  # noqa: E731
    expect_mismatch(exc, gather if mode == "eager" else tf.function(gather), gname, "shape",
                    "[*, 2]", "[*, 3]")
    dname = "tf.%s.dtype" % mode
    dtype = tf.float16 if RANK == ODD else tf.float32
    cast = lambda: hvd.broadcast(tf.zeros([2], dtype), 0, name=dname)  # noqa: E731
    expect_mismatch(exc, cast if mode == "eager" else tf.function(cast), dname, "dtype",
                    "float32", "float16")
    got = in_mode(mode, lambda: hvd.allreduce(tf.fill([3], RANK), op=hvd.Sum))()
    assert_equal(got.numpy(), np.full(3, sum(range(SIZE)), np.int32), "allreduce after errors")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.string, tf.complex64, tf.uint32, tf.uint64], ids=str)
def test_unsupported_dtype(dtype, mode):
    value = tf.constant(["a", "b"]) if dtype == tf.string else tf.zeros([2], dtype)
    for op in (hvd.allreduce, hvd.allgather, lambda t: hvd.broadcast(t, 0)):
        fn = (lambda: op(value)) if mode == "eager" else tf.function(lambda: op(value))
        with pytest.raises(TypeError, match="hvlite does not support dtype %s" % dtype.name):
            fn()
    v = tf.Variable(value)
    with pytest.raises(TypeError, match="does not support dtype"):
        hvd.broadcast_variables([v], 0)


def test_join_with_uneven_steps():
    """Rank r runs r + 1 allreduces, then joins; joined ranks stand in with zeros."""
    for step in range(RANK + 1):
        active = [k for k in range(SIZE) if k >= step]
        got = hvd.allreduce(tf.fill([3], float(RANK + 1)), op=hvd.Sum, name="tf.join.grad")
        np.testing.assert_array_equal(got.numpy(), np.full(3, float(sum(k + 1 for k in active))))
    assert int(hvd.join()) == SIZE - 1
