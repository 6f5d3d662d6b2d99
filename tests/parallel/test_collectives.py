"""Every collective x every dtype x shapes (0-d, 0-element, non-contiguous), checked on every
rank against a NumPy reference built from all ranks' seeded inputs. SPMD: run by hvlrun."""
import numpy as np
import pytest

import hvlite as hvd
from reference import DTYPES, FLOATS, SHAPES, assert_equal, inputs, reduce

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
RANK, SIZE = hvd.rank(), hvd.size()


def all_inputs(seed, dtype, shape, noncontiguous=False):
    return [inputs(seed, r, dtype, shape, noncontiguous) for r in range(SIZE)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce(dtype):
    for shape in SHAPES:
        for noncontig in (False, True):
            for opname, op in OPS.items():
                if dtype == np.bool_ and opname == "Average":
                    continue
                xs = all_inputs(1, dtype, shape, noncontig)
                expected = reduce(np.stack(xs), opname, dtype, SIZE)
                what = "allreduce %s %s %s noncontig=%s" % (opname, dtype, shape, noncontig)
                got = hvd.allreduce(xs[RANK], op=op)
                assert_equal(got, expected, what, dtype, exact=opname != "Average")
                assert_equal(xs[RANK], all_inputs(1, dtype, shape, noncontig)[RANK], what + " (input untouched)")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_allreduce_scale_factors(dtype):
    xs = all_inputs(2, dtype, (5, 3))
    expected = (np.stack(xs).astype(np.float64).sum(axis=0) * 0.5 * 2.0 / SIZE * 0.25).astype(dtype)
    got = hvd.allreduce(xs[RANK], op=hvd.Average, prescale_factor=0.5, postscale_factor=0.5)
    assert_equal(got, expected, "scaled allreduce %s" % dtype, dtype, exact=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_in_place_and_async(dtype):
    op, opname = (hvd.Max, "Max")
    for shape in SHAPES:
        xs = all_inputs(3, dtype, shape)
        expected = reduce(np.stack(xs), opname, dtype, SIZE)
        mine = xs[RANK].copy()
        assert hvd.allreduce_(mine, op=op) is mine
        assert_equal(mine, expected, "allreduce_ %s %s" % (dtype, shape))
        base = np.zeros((2,) + shape, dtype=dtype)
        view = base[0, ...]          # a view (0-d for scalars), written in place
        view[...] = xs[RANK]
        h = hvd.allreduce_async_(view, op=op, name="inplace.%s" % (shape,))
        hvd.synchronize(h)
        assert_equal(base[0, ...], expected, "allreduce_async_ %s %s" % (dtype, shape))
        h = hvd.allreduce_async(xs[RANK], op=op)
        while not hvd.poll(h):
            pass
        assert_equal(hvd.synchronize(h), expected, "allreduce_async %s %s" % (dtype, shape))


def test_allreduce_noncontiguous_in_place():
    base = np.arange(20, dtype=np.float32).reshape(4, 5) + RANK
    view = base[:, ::2]
    expected = sum(np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2] + r for r in range(SIZE))
    hvd.allreduce_(view, op=hvd.Sum)
    assert_equal(base[:, ::2], expected, "non-contiguous allreduce_")
    assert_equal(base[:, 1::2], np.arange(20, dtype=np.float32).reshape(4, 5)[:, 1::2] + RANK, "untouched columns")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_allreduce(dtype):
    shapes = [(3,), (2, 2), (0,), ()]
    xs = [all_inputs(4 + i, dtype, s) for i, s in enumerate(shapes)]
    got = hvd.grouped_allreduce([x[RANK] for x in xs], op=hvd.Sum)
    for i, s in enumerate(shapes):
        assert_equal(got[i], reduce(np.stack(xs[i]), "Sum", dtype, SIZE), "grouped %s %s" % (dtype, s))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather(dtype):
    for trailing in [(), (3,), (2, 0), (4, 2)]:
        for noncontig in (False, True):
            # rank r contributes r + 1 rows (rank-dependent first dimension)
            xs = [inputs(5, r, dtype, (r + 1,) + trailing, noncontig) for r in range(SIZE)]
            got = hvd.allgather(xs[RANK])
            assert_equal(got, np.concatenate(xs), "allgather %s %s" % (dtype, trailing))
    scalars = [inputs(6, r, dtype, ()) for r in range(SIZE)]
    assert_equal(hvd.allgather(scalars[RANK]), np.stack(scalars), "allgather of 0-d %s" % dtype)
    empty = [np.zeros((0, 2), dtype=dtype) for _ in range(SIZE)]
    assert_equal(hvd.allgather(empty[RANK]), np.zeros((0, 2), dtype=dtype), "allgather of empty")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast(dtype):
    for root in range(SIZE):
        for shape in SHAPES:
            xs = all_inputs(7 + root, dtype, shape)
            assert_equal(hvd.broadcast(xs[RANK], root), xs[root], "broadcast root %d %s %s" % (root, dtype, shape))
            mine = xs[RANK].copy()
            assert hvd.broadcast_(mine, root_rank=root) is mine
            assert_equal(mine, xs[root], "broadcast_ root %d %s %s" % (root, dtype, shape))
        nc = all_inputs(8, dtype, (6, 2), noncontiguous=True)
        assert_equal(hvd.broadcast(nc[RANK], root), nc[root], "broadcast non-contiguous")


def splits_of(rank):
    """Rows rank ``rank`` sends to each destination: uneven, some zero."""
    return [(rank + dest) % 3 for dest in range(SIZE)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alltoall(dtype):
    for trailing in [(), (3,), (2, 2)]:
        xs = [inputs(9, r, dtype, (sum(splits_of(r)),) + trailing) for r in range(SIZE)]
        pieces = []
        for src in range(SIZE):
            offsets = np.concatenate([[0], np.cumsum(splits_of(src))])
            pieces.append(xs[src][offsets[RANK]:offsets[RANK + 1]])
        out, recv = hvd.alltoall(xs[RANK], splits=splits_of(RANK))
        assert_equal(out, np.concatenate(pieces), "alltoall %s %s" % (dtype, trailing))
        assert list(recv) == [splits_of(src)[RANK] for src in range(SIZE)]
        even = [inputs(10, r, dtype, (2 * SIZE,) + trailing) for r in range(SIZE)]
        expected = np.concatenate([even[src][2 * RANK:2 * RANK + 2] for src in range(SIZE)])
        assert_equal(hvd.alltoall(even[RANK]), expected, "alltoall equal splits %s" % dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reducescatter(dtype):
    for rows in (2 * SIZE + 1, SIZE, 1, 0):
        for trailing in [(), (3,)]:
            for opname, op in OPS.items():
                if dtype == np.bool_ and opname == "Average":
                    continue
                xs = all_inputs(11, dtype, (rows,) + trailing)
                full = reduce(np.stack(xs), opname, dtype, SIZE)
                counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
                start = sum(counts[:RANK])
                got = hvd.reducescatter(xs[RANK], op=op)
                assert_equal(got, full[start:start + counts[RANK]],
                             "reducescatter %s %s rows=%d" % (opname, dtype, rows), dtype,
                             exact=opname != "Average")


def test_barrier_and_objects():
    hvd.barrier()
    obj = {"rank": RANK, "payload": list(range(RANK + 2))}
    for root in range(SIZE):
        assert hvd.broadcast_object(obj, root_rank=root) == {"rank": root, "payload": list(range(root + 2))}
    assert hvd.allgather_object(obj) == [{"rank": r, "payload": list(range(r + 2))} for r in range(SIZE)]


def test_topology():
    assert hvd.size() == SIZE and 0 <= RANK < SIZE
    assert hvd.local_size() * hvd.cross_size() == SIZE   # one host here: local = all
    assert hvd.local_rank() == RANK and hvd.cross_rank() == 0 and hvd.is_homogeneous()
    assert hvd.mpi_built() and hvd.is_initialized()
