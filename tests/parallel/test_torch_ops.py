"""hvlite.torch collectives x torch dtypes x shapes against a torch reference on every rank;
async and in-place forms; gradients of the differentiable ops checked numerically (finite
differences of a global objective, the sum over ranks of each rank's loss). SPMD: run by hvlrun."""
import numpy as np
import pytest
import torch

import hvlite.torch as hvd
from reference import inputs

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
    return torch.from_numpy(np.ascontiguousarray(values)).to(dtype)


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


# ---- gradients ----

def global_objective(y, w):
    """J = sum over ranks of each rank's loss (y * w).sum(), on every rank."""
    local = torch.tensor([(y.detach().double() * w).sum().item()], dtype=torch.float64)
    return hvd.allreduce(local, op=hvd.Sum).item()


def check_gradient(op, shape, seed):
    torch.manual_seed(seed + RANK)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y = op(x)
    w = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(99 + RANK))
    (y * w).sum().backward()
    eps = 1e-6
    for r in range(SIZE):
        for i in range(x.numel()):
            values = []
            for sign in (1, -1):
                xp = x.detach().clone()
                if RANK == r:
                    xp.view(-1)[i] += sign * eps
                values.append(global_objective(op(xp), w))
            numeric = (values[0] - values[1]) / (2 * eps)
            if RANK == r:
                assert abs(numeric - x.grad.view(-1)[i].item()) < 1e-5, (op, r, i, numeric, x.grad)


@pytest.mark.parametrize("name,op,shape", [
    ("allreduce-sum", lambda t: hvd.allreduce(t, op=hvd.Sum), (2, 2)),
    ("allreduce-average-scaled", lambda t: hvd.allreduce(t, op=hvd.Average, prescale_factor=0.5,
                                                          postscale_factor=3.0), (3,)),
    ("allgather", lambda t: hvd.allgather(t), (2, 2)),
    ("broadcast", lambda t: hvd.broadcast(t, root_rank=SIZE - 1), (3,)),
    ("alltoall", lambda t: hvd.alltoall(t), (SIZE, 2)),
    ("reducescatter", lambda t: hvd.reducescatter(t, op=hvd.Average), (SIZE + 1, 2)),
])
def test_gradients_numerically(name, op, shape):
    check_gradient(op, shape, seed=len(name))


def test_bad_input():
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="unsupported reduce op"):
        hvd.allreduce(torch.ones(2), op=99)
    with pytest.raises(TypeError, match="complex"):
        hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
    shape = (3,) if RANK == 0 else (4,)
    with pytest.raises(hvd.MismatchError, match="'torch.bad'.*shape"):
        hvd.allreduce(torch.zeros(shape), name="torch.bad")


def test_in_place_ops_bump_the_autograd_version():
    """autograd must refuse a backward that would use a value an in-place collective replaced."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    x = w * (RANK + 1)
    y = (x * x).sum()
    version = x._version
    hvd.allreduce_(x, op=hvd.Sum, name="inplace.version")
    assert x._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
