"""hvlite.torch collectives x torch dtypes x shapes against a torch reference on every rank;
async and in-place forms; sparse_allreduce_async; object collectives (cloudpickled objects, and
an object that cannot be pickled raising on every rank). (Gradients: test_torch_grads.py.) On the CPU,
or on CUDA tensors with HVLITE_TEST_DEVICE=cuda (torch_device.py): results must come back on the
input's device.
SPMD: run by hvlrun."""
import pickle
import threading
import time

import numpy as np
import pytest
import torch

import hvlite.torch as hvd
from reference import inputs
from torch_device import DEVICE

RANK, SIZE = hvd.rank(), hvd.size()
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (17, 3)]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
torch.set_num_threads(1)


def make(seed, rank, dtype, shape):
    """Rank ``rank``'s input: the seeded small integers of tests/parallel/reference.py."""
    kind = "bool" if dtype == torch.bool else ("uint8" if dtype == torch.uint8 else "int64")
    values = inputs(seed, rank, np.dtype(kind), shape)
    return torch.from_numpy(np.ascontiguousarray(values)).to(dtype).to(DEVICE)


def everyone(seed, dtype, shape):
    return [make(seed, r, dtype, shape) for r in range(SIZE)]


def reference(xs, opname, dtype):
    if dtype == torch.bool:
        stack = torch.stack(xs)
        return stack.all(0) if opname in ("Min", "Product") else stack.any(0)
    wide = torch.stack([x.to(torch.float64 if dtype.is_floating_point else torch.int64) for x in xs])
    if opname == "Sum":
        out = wide.sum(0)
    elif opname == "Average":
        out = wide.sum(0) / SIZE if dtype.is_floating_point else torch.div(wide.sum(0), SIZE, rounding_mode="trunc")
    elif opname == "Min":
        out = wide.min(0).values if wide.dim() > 1 or wide.numel() else wide.sum(0)
    elif opname == "Max":
        out = wide.max(0).values if wide.dim() > 1 or wide.numel() else wide.sum(0)
    else:
        out = wide.prod(0)
    return out.to(dtype)


def same(got, expected, what, tol=0.0):
    assert got.shape == expected.shape and got.dtype == expected.dtype, (what, got.shape, got.dtype)
    assert got.device == expected.device, (what, got.device, expected.device)
    if tol:
        ok = torch.allclose(got.double(), expected.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, expected)
    assert ok, "%s: got %s expected %s" % (what, got, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_forms(dtype):
    for shape in SHAPES:
        xs = everyone(1, dtype, shape)
        for opname, op in OPS.items():
            if dtype == torch.bool and opname == "Average":
                continue
            tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6}.get(dtype, 1e-12) if opname == "Average" else 0.0
            expected = reference(xs, opname, dtype)
            what = "%s %s %s" % (opname, dtype, shape)
            same(hvd.allreduce(xs[RANK], op=op), expected, "allreduce " + what, tol)
            mine = xs[RANK].clone()
            assert hvd.allreduce_(mine, op=op) is mine
            same(mine, expected, "allreduce_ " + what, tol)
            same(hvd.synchronize(hvd.allreduce_async(xs[RANK], op=op)), expected, "async " + what, tol)
        if shape and shape[-1] > 1:    # non-contiguous input and in-place target
            base = torch.stack([xs[RANK], xs[RANK]], dim=-1)
            view = base[..., 0]
            same(hvd.allreduce(view, op=hvd.Max), reference(xs, "Max", dtype), "non-contiguous")
            hvd.allreduce_(view, op=hvd.Max)
            same(base[..., 0], reference(xs, "Max", dtype), "non-contiguous allreduce_")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gather_broadcast_alltoall_reducescatter(dtype):
    rows = [make(2, r, dtype, (r + 1, 3)) for r in range(SIZE)]
    same(hvd.allgather(rows[RANK]), torch.cat(rows), "allgather %s" % dtype)
    same(hvd.synchronize(hvd.allgather_async(rows[RANK])), torch.cat(rows), "allgather_async")
    for root in range(SIZE):
        xs = everyone(3 + root, dtype, (4, 2))
        same(hvd.broadcast(xs[RANK], root), xs[root], "broadcast root %d" % root)
        mine = xs[RANK].clone()
        hvd.broadcast_(mine, root)
        same(mine, xs[root], "broadcast_ root %d" % root)
    splits = [[(s + d) % 3 for d in range(SIZE)] for s in range(SIZE)]
    data = [make(5, s, dtype, (sum(splits[s]), 2)) for s in range(SIZE)]
    expected = torch.cat([data[s][sum(splits[s][:RANK]):sum(splits[s][:RANK + 1])] for s in range(SIZE)])
    out, received = hvd.alltoall(data[RANK], splits=splits[RANK])
    same(out, expected, "alltoall %s" % dtype)
    assert received.tolist() == [splits[s][RANK] for s in range(SIZE)]
    if dtype != torch.bool:
        xs = everyone(6, dtype, (2 * SIZE + 1, 2))
        full = reference(xs, "Sum", dtype)
        counts = [(2 * SIZE + 1) // SIZE + (1 if r < (2 * SIZE + 1) % SIZE else 0) for r in range(SIZE)]
        start = sum(counts[:RANK])
        same(hvd.reducescatter(xs[RANK], op=hvd.Sum), full[start:start + counts[RANK]], "reducescatter")


def test_grouped_and_objects_and_compression():
    xs = [everyone(7 + i, torch.float32, (3,)) for i in range(4)]
    got = hvd.grouped_allreduce([x[RANK] for x in xs], op=hvd.Sum)
    for i in range(4):
        same(got[i], reference(xs[i], "Sum", torch.float32), "grouped %d" % i)
    got = hvd.allreduce(xs[0][RANK] / 3, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert got.dtype == torch.float32
    same(got, reference(xs[0], "Sum", torch.float32) / 3, "fp16 compression", tol=2e-3)
    assert hvd.broadcast_object({"r": RANK}, root_rank=SIZE - 1) == {"r": SIZE - 1}
    assert hvd.allgather_object(RANK) == list(range(SIZE))
    hvd.barrier()


def test_objects_made_in_a_function_travel():
    """Lambdas, closures and classes defined in a function travel (cloudpickle, as Horovod)."""
    pytest.importorskip("cloudpickle")
    offset = 10 * RANK

    class Local:
        def __init__(self, value):
            self.value = value

    fn = hvd.broadcast_object(lambda v: v + offset, root_rank=SIZE - 1)
    assert fn(1) == 10 * (SIZE - 1) + 1
    got = hvd.allgather_object(Local(RANK))
    assert [type(o).__name__ for o in got] == ["Local"] * SIZE
    assert [o.value for o in got] == list(range(SIZE))


def test_an_object_that_cannot_be_pickled_raises_on_every_rank():
    """The root's (or any rank's) pickling error reaches every rank, and nothing is left
    waiting: the next collective runs."""
    lock = threading.Lock()
    root = SIZE - 1
    with pytest.raises(pickle.PicklingError, match="rank %d cannot pickle.*_thread.lock" % root):
        hvd.broadcast_object(lock if RANK == root else None, root_rank=root)
    with pytest.raises(pickle.PicklingError, match=r"rank\(s\) \[1\] of the set.*_thread.lock"):
        hvd.allgather_object(lock if RANK == 1 else RANK)
    assert hvd.allgather_object(RANK) == list(range(SIZE))


def sparse_input(seed, rank, shape, sparse_dim):
    """A seeded sparse COO tensor; rank 1 has no non-zeros (an empty contribution)."""
    dense = torch.from_numpy(inputs(seed, rank, np.dtype("int64"), shape)).double().to(DEVICE)
    dense[dense.abs() < 2] = 0
    if rank == 1:
        dense.zero_()
    return dense.to_sparse(sparse_dim)


@pytest.mark.parametrize("sparse_dim", [1, 2])
def test_sparse_allreduce_async(sparse_dim):
    shape = (9, 3)
    xs = [sparse_input(8 + sparse_dim, r, shape, sparse_dim) for r in range(SIZE)]
    total = sum(x.to_dense() for x in xs)
    for op, expected in ((hvd.Sum, total), (hvd.Average, total / SIZE)):
        handle = hvd.sparse_allreduce_async(xs[RANK], name="sparse.%d.%d" % (sparse_dim, op), op=op)
        got = handle()                                   # Horovod's way: call the handle
        assert got.is_sparse and got.is_coalesced() and got.sparse_dim() == sparse_dim
        assert hvd.poll(handle) and hvd.synchronize(handle) is got
        same(got.to_dense(), expected, "sparse allreduce op %d" % op, tol=1e-12)
    with pytest.raises(TypeError, match="sparse COO"):
        hvd.sparse_allreduce_async(total, name="sparse.dense", op=hvd.Sum)
    with pytest.raises(ValueError, match="Sum or op=Average"):
        hvd.sparse_allreduce_async(xs[RANK], name="sparse.min", op=hvd.Min)


def test_sparse_allreduce_async_on_a_process_set():
    if SIZE < 2:
        pytest.skip("a set other than the global one needs 2 ranks")
    ps = hvd.add_process_set(list(range(1, SIZE)))
    if RANK in ps.ranks:
        xs = {r: sparse_input(12, r, (5, 2), 2) for r in ps.ranks}
        expected = sum(x.to_dense() for x in xs.values()) / len(ps.ranks)
        got = hvd.sparse_allreduce_async(xs[RANK], name="sparse.set", op=hvd.Average,
                                         process_set=ps)()
        same(got.to_dense(), expected, "sparse allreduce on ranks %s" % ps.ranks, tol=1e-12)
    hvd.remove_process_set(ps)


ASYNC_OPS = {
    "allreduce": lambda t, n: hvd.allreduce_async(t, name=n),
    "allreduce_": lambda t, n: hvd.allreduce_async_(t.clone(), name=n),
    "allgather": lambda t, n: hvd.allgather_async(t, name=n),
    "broadcast": lambda t, n: hvd.broadcast_async(t, 0, name=n),
    "alltoall": lambda t, n: hvd.alltoall_async(t, name=n),
    "reducescatter": lambda t, n: hvd.reducescatter_async(t, name=n),
    "sparse_allreduce": lambda t, n: hvd.sparse_allreduce_async(t.to_sparse(), name=n),
}


@pytest.mark.parametrize("op", sorted(ASYNC_OPS))
def test_duplicate_in_flight_name_raises(op):
    """A name whose request has not been synchronized raises at submit, as a ValueError and a
    RuntimeError (Horovod's tests catch either); the first request still completes. Ranks
    submit in turn (as Horovod's *_duplicate_name_error tests do), so on the last rank the
    first request has completed (polled until done) before the repeat: it raises there too."""
    t = torch.ones(SIZE * 2, 3, device=DEVICE)
    for turn in range(SIZE):
        if RANK == turn:
            first = ASYNC_OPS[op](t, "dup." + op)
            while RANK == SIZE - 1 and not hvd.poll(first):
                time.sleep(0.01)
            with pytest.raises(hvd.HvliteInvalidArgument, match="dup." + op) as raised:
                ASYNC_OPS[op](t, "dup." + op)
            assert isinstance(raised.value, ValueError)
            assert isinstance(raised.value, RuntimeError)
        hvd.barrier()
    hvd.synchronize(first)


def test_bad_input():
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="unsupported reduce op"):
        hvd.allreduce(torch.ones(2), op=99)
    with pytest.raises(TypeError, match="complex"):
        hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
    # float splits (even huge garbage values) are refused before conversion, as Horovod does
    for splits in (torch.full((SIZE,), 1e30), torch.ones(SIZE, dtype=torch.bool)):
        with pytest.raises(hvd.HvliteInvalidArgument, match="'torch.splits': splits must be int"):
            hvd.alltoall(torch.zeros(SIZE), splits, name="torch.splits")
    if SIZE > 1:                                      # ranks that disagree
        shape = (3,) if RANK == 0 else (4,)
        with pytest.raises(hvd.MismatchError, match="'torch.bad'.*shape"):
            hvd.allreduce(torch.zeros(shape), name="torch.bad")


def test_in_place_ops_bump_the_autograd_version():
    """autograd must refuse a backward that would use a value an in-place collective replaced."""
    w = torch.tensor([1.0, 2.0], requires_grad=True, device=DEVICE)
    x = w * (RANK + 1)
    y = (x * x).sum()
    version = x._version
    hvd.allreduce_(x, op=hvd.Sum, name="inplace.version")
    assert x._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
