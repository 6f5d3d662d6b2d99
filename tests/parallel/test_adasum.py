"""Adasum allreduce through the NumPy API, checked on every rank against the NumPy reference
(adasum_reference.py): every dtype Adasum takes, alone and fused, scaled, in place, within
process sets; and Horovod's refusals (other ops, other dtypes, set sizes that are not a power
of 2) as errors on every rank that leave the engine working. SPMD: run by hvlrun at 2 and 3
ranks (tests/test_spmd.py) and at 4, with and without the shared-memory plane
(tests/test_adasum_jobs.py)."""
import numpy as np
import pytest

import hvlite as hvd
from hvlite.errors import HvliteNotSupportedError
from adasum_reference import adasum, assert_close
from reference import BFLOAT16

RANK, SIZE = hvd.rank(), hvd.size()
POWER_OF_2 = SIZE & (SIZE - 1) == 0
DTYPES = [np.dtype(t) for t in ("float16", "float32", "float64")]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (33, 5), (1000,), (2 ** 17 + 3,)]
needs_power_of_2 = pytest.mark.skipif(not POWER_OF_2, reason="Adasum needs 2^k ranks")


def value(seed, rank, dtype, shape):
    """Rank ``rank``'s input: normal values, with a part shared by all ranks so the vectors are
    neither orthogonal nor parallel."""
    shared = np.random.default_rng([seed]).standard_normal(shape)
    own = np.random.default_rng([seed, rank + 1]).standard_normal(shape)
    return np.array(shared + own, dtype=dtype)


def everyone(seed, dtype, shape):
    return [value(seed, r, dtype, shape) for r in range(SIZE)]


def assert_same_everywhere(result, what):
    rows = hvd.allgather(np.ascontiguousarray(result).reshape(1, -1), name="same." + what)
    assert all(np.array_equal(rows[0], row) for row in rows), "%s: ranks differ" % what


@needs_power_of_2
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unfused_every_shape(dtype):
    for shape in SHAPES:
        xs = everyone(1, dtype, shape)
        what = "adasum %s %s" % (dtype, shape)
        got = hvd.allreduce(xs[RANK], op=hvd.Adasum, name=what)
        assert_close(got, adasum(xs, dtype), what)
        assert np.array_equal(xs[RANK], value(1, RANK, dtype, shape)), what + ": input changed"
        assert_same_everywhere(got, what)


@needs_power_of_2
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_each_tensor_its_own(dtype):
    """Tensors submitted together fuse into one buffer; each still gets its own dot products
    (a reference over the concatenation would differ)."""
    shapes = [(5,), (0,), (1,), (300, 2), (7, 3), (4097,)]
    xs = [everyone(10 + i, dtype, s) for i, s in enumerate(shapes)]
    # one tensor scaled far above the others: a shared coefficient would be visibly wrong
    xs[3] = [x * 100 for x in xs[3]]
    before = hvd.engine_counters()["tensors_fused"]
    got = hvd.grouped_allreduce([x[RANK] for x in xs], op=hvd.Adasum, name="fused.%s" % dtype)
    assert hvd.engine_counters()["tensors_fused"] > before, "the tensors did not fuse"
    for i, (g, x) in enumerate(zip(got, xs)):
        assert_close(g, adasum(x, dtype), "fused %s tensor %d %s" % (dtype, i, shapes[i]))
    whole = adasum([np.concatenate([x[r].ravel() for x in xs]) for r in range(SIZE)], np.float64)
    assert not np.allclose(np.concatenate([g.ravel() for g in got]).astype(np.float64), whole,
                           rtol=1e-2), "per-tensor and whole-buffer Adasum agree: weak test"


@needs_power_of_2
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scale_factors_in_place_and_async(dtype):
    xs = everyone(3, dtype, (6, 5))
    pre = [(x.astype(np.float64) * 0.5).astype(dtype) for x in xs]
    expected = (adasum(pre, dtype).astype(np.float64) * 0.25).astype(dtype)
    got = hvd.allreduce(xs[RANK], op=hvd.Adasum, prescale_factor=0.5, postscale_factor=0.25)
    assert_close(got, expected, "scaled adasum %s" % dtype)
    mine = xs[RANK].copy()
    assert hvd.allreduce_(mine, op=hvd.Adasum) is mine
    assert_close(mine, adasum(xs, dtype), "allreduce_ adasum %s" % dtype)
    h = hvd.allreduce_async(xs[RANK], op=hvd.Adasum)
    assert_close(hvd.synchronize(h), adasum(xs, dtype), "allreduce_async adasum %s" % dtype)


@needs_power_of_2
def test_documented_limits_orthogonal_sum_parallel_average():
    """Horovod's guide: orthogonal vectors add up, parallel ones average; a zero vector
    leaves the other as it is."""
    n = 4 * SIZE
    orthogonal = np.zeros(n)
    orthogonal[RANK::SIZE] = np.arange(1, 5) * (RANK + 1)
    total = hvd.allreduce(orthogonal, op=hvd.Sum)
    np.testing.assert_allclose(hvd.allreduce(orthogonal, op=hvd.Adasum), total, rtol=1e-15)
    same = np.linspace(-1, 2, n)
    np.testing.assert_allclose(hvd.allreduce(same, op=hvd.Adasum), same, rtol=1e-15)
    lone = np.zeros(n) if RANK else same
    np.testing.assert_array_equal(hvd.allreduce(lone, op=hvd.Adasum), same)


@needs_power_of_2
def test_runs_on_the_mpi_plane():
    """The MPI plane is the one with Adasum; the others (shared memory) let it pass."""
    x = value(4, RANK, np.float32, (1024,))
    before = hvd.engine_counters()
    hvd.allreduce(x, op=hvd.Adasum, name="plane")
    after = hvd.engine_counters()
    assert after["mpi_collectives"] == before["mpi_collectives"] + 1
    assert after["shm_collectives"] == before["shm_collectives"]


@pytest.mark.skipif(SIZE < 3, reason="needs a set smaller than the job")
def test_process_sets():
    """A 2-rank set runs Adasum whatever the job's size; a 3-rank set refuses it."""
    pair = hvd.add_process_set([0, 1])
    three = hvd.add_process_set([0, 1, 2]) if SIZE > 3 else None
    try:
        if RANK < 2:
            xs = [value(5, r, np.float32, (40,)) for r in range(2)]
            got = hvd.allreduce(xs[RANK], op=hvd.Adasum, process_set=pair)
            assert_close(got, adasum(xs, np.float32), "adasum in set [0, 1]")
        if three is not None and RANK < 3:
            pattern = r"'t3'.*power-of-2.*process set %d has 3" % three.process_set_id
            with pytest.raises(HvliteNotSupportedError, match=pattern):
                hvd.allreduce(np.ones(3, np.float32), op=hvd.Adasum, name="t3",
                              process_set=three)
            assert hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=three)[0] == 3
    finally:
        if three is not None:
            hvd.remove_process_set(three)
        hvd.remove_process_set(pair)


def _refused(call, pattern):
    """``call`` raises on this rank, before any communication; then the engine still works."""
    with pytest.raises(HvliteNotSupportedError, match=pattern) as info:
        call()
    assert isinstance(info.value, NotImplementedError) and isinstance(info.value, RuntimeError)
    assert hvd.allreduce(np.ones(3), op=hvd.Sum)[0] == SIZE


def test_refused_ops_and_dtypes():
    x = np.ones((SIZE * 2, 3), np.float32)
    _refused(lambda: hvd.reducescatter(x, op=hvd.Adasum, name="rs"),
             r"'rs'.*reducescatter does not support Adasum")
    _refused(lambda: hvd.grouped_reducescatter([x], op=hvd.Adasum, name="grs"),
             r"reducescatter does not support Adasum")
    dtypes = [np.int32, np.int64, np.uint8, np.bool_] + ([BFLOAT16] if BFLOAT16 else [])
    for dtype in dtypes:
        name = "int.%s" % np.dtype(dtype).name
        _refused(lambda: hvd.allreduce(np.ones(4, dtype), op=hvd.Adasum, name=name),
                 r"'%s'.*float16, float32 and float64 tensors, not %s"
                 % (name, np.dtype(dtype).name))


@pytest.mark.skipif(POWER_OF_2, reason="the error of a set that is not 2^k ranks")
def test_refused_when_size_is_not_a_power_of_2():
    for dtype in DTYPES:
        _refused(lambda: hvd.allreduce(np.ones(5, dtype), op=hvd.Adasum, name="np3"),
                 r"'np3'.*power-of-2 number of ranks; process set 0 has %d" % SIZE)
    _refused(lambda: hvd.grouped_allreduce([np.ones(2)], op=hvd.Adasum), r"power-of-2")
