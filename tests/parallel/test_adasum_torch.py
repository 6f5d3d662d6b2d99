"""Adasum in hvlite.torch, checked on every rank: allreduce (alone, grouped, in place, async)
against the NumPy reference, the refusals Horovod makes, and DistributedOptimizer(op=Adasum),
Horovod's delta optimizer: one SGD step against a NumPy computation, three Adam steps against
every rank's optimizer simulated here, and convergence on a small regression. SPMD: run by
hvlrun at 2 and 3 ranks (tests/test_spmd.py) and at 4 (tests/test_adasum_jobs.py)."""
import numpy as np
import pytest
import torch

import hvlite.torch as hvd
from hvlite.errors import HvliteNotSupportedError
from adasum_reference import adasum, assert_close

RANK, SIZE = hvd.rank(), hvd.size()
POWER_OF_2 = SIZE & (SIZE - 1) == 0
needs_power_of_2 = pytest.mark.skipif(not POWER_OF_2, reason="Adasum needs 2^k ranks")
DTYPES = [torch.float16, torch.float32, torch.float64]


def value(seed, rank, shape, dtype):
    shared = np.random.default_rng([seed]).standard_normal(shape)
    own = np.random.default_rng([seed, rank + 1]).standard_normal(shape)
    return torch.from_numpy(np.asarray(shared + own)).to(dtype)


def reference(seed, shape, dtype):
    return adasum([value(seed, r, shape, dtype).numpy() for r in range(SIZE)],
                  value(seed, 0, shape, dtype).numpy().dtype)


@needs_power_of_2
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_forms(dtype):
    shapes = [(17,), (3, 5), (), (0,), (2049,)]
    for i, shape in enumerate(shapes):
        got = hvd.allreduce(value(i, RANK, shape, dtype), op=hvd.Adasum)
        assert_close(got.numpy(), reference(i, shape, dtype), "allreduce %s %s" % (dtype, shape))
    outs = hvd.grouped_allreduce([value(i, RANK, s, dtype) for i, s in enumerate(shapes)],
                                 op=hvd.Adasum)
    for i, (out, shape) in enumerate(zip(outs, shapes)):
        assert_close(out.numpy(), reference(i, shape, dtype), "grouped %s %s" % (dtype, shape))
    mine = value(7, RANK, (4, 4), dtype)
    assert hvd.allreduce_(mine, op=hvd.Adasum) is mine
    assert_close(mine.numpy(), reference(7, (4, 4), dtype), "allreduce_ %s" % dtype)
    h = hvd.allreduce_async(value(8, RANK, (9,), dtype), op=hvd.Adasum)
    assert_close(hvd.synchronize(h).numpy(), reference(8, (9,), dtype), "async %s" % dtype)


def test_refusals_on_every_rank():
    """As Horovod: reducescatter refuses Adasum (a RuntimeError), so do integer and bfloat16
    tensors; sizes that are not 2^k refuse allreduce too (NotImplementedError)."""
    for dtype in (torch.int32, torch.int64, torch.float32, torch.float64):
        with pytest.raises(RuntimeError, match="reducescatter does not support Adasum"):
            hvd.reducescatter(torch.ones(SIZE * 4, 3, dtype=dtype), op=hvd.Adasum)
    for dtype in (torch.int32, torch.uint8, torch.bfloat16):
        with pytest.raises(HvliteNotSupportedError, match="not %s" % str(dtype)[6:]):
            hvd.allreduce(torch.ones(3, dtype=dtype), op=hvd.Adasum, name="bad")
    if not POWER_OF_2:
        with pytest.raises(NotImplementedError, match="power-of-2 number of ranks"):
            hvd.allreduce(torch.ones(3), op=hvd.Adasum, name="np")
        model = torch.nn.Linear(2, 1)
        with pytest.raises(NotImplementedError, match="power-of-2 number of ranks"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(), op=hvd.Adasum)
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum)[0] == SIZE     # the engine still works


# ---- the delta optimizer ----

def data(rank, n=16):
    """Rank ``rank``'s regression batch: y = x W* + b* + noise."""
    rng = np.random.default_rng([99, rank])
    x = rng.standard_normal((n, 5))
    w_true = np.arange(15, dtype=np.float64).reshape(3, 5) / 10
    y = x @ w_true.T + np.array([1.0, -2.0, 0.5]) + 0.01 * rng.standard_normal((n, 3))
    return x, y


def model():
    torch.manual_seed(3)
    return torch.nn.Linear(5, 3).double()


def loss_of(net, x, y):
    return ((net(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).sum() / len(x)


@needs_power_of_2
def test_one_sgd_step_matches_numpy():
    net = model()
    w0, b0 = net.weight.detach().numpy().copy(), net.bias.detach().numpy().copy()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05),
                                   named_parameters=net.named_parameters(), op=hvd.Adasum)
    x, y = data(RANK)
    opt.zero_grad()
    loss_of(net, x, y).backward()
    opt.step()
    deltas_w, deltas_b = [], []
    for r in range(SIZE):       # each rank's local SGD step, in NumPy
        xr, yr = data(r)
        residual = xr @ w0.T + b0 - yr
        deltas_w.append(-0.05 * 2 / len(xr) * residual.T @ xr)
        deltas_b.append(-0.05 * 2 / len(xr) * residual.sum(axis=0))
    assert_close(net.weight.detach().numpy(), w0 + adasum(deltas_w, np.float64), "weight")
    assert_close(net.bias.detach().numpy(), b0 + adasum(deltas_b, np.float64), "bias")


@needs_power_of_2
def test_adam_steps_match_every_rank_simulated():
    """Each rank's optimizer keeps its own state (Adam's moments of its own gradients); the
    reduced deltas move every rank's parameters alike."""
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=0.01),
                                   named_parameters=net.named_parameters(), op=hvd.Adasum)
    sims = [model() for _ in range(SIZE)]
    sim_opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in sims]
    common = [p.detach().clone() for p in net.parameters()]
    for step in range(3):
        x, y = data(RANK, 8 + step)
        opt.zero_grad()
        loss_of(net, x, y).backward()
        opt.step()
        deltas = []
        for r, (m, o) in enumerate(zip(sims, sim_opts)):
            with torch.no_grad():
                for p, c in zip(m.parameters(), common):
                    p.copy_(c)
            o.zero_grad()
            loss_of(m, *data(r, 8 + step)).backward()
            o.step()
            deltas.append([(p.detach() - c).numpy() for p, c in zip(m.parameters(), common)])
        common = [c + torch.from_numpy(adasum([d[i] for d in deltas], np.float64))
                  for i, c in enumerate(common)]
        for p, c in zip(net.parameters(), common):
            assert_close(p.detach().numpy(), c.numpy(), "Adam step %d" % step)


@needs_power_of_2
def test_converges_and_ranks_agree():
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.5),
                                   named_parameters=net.named_parameters(), op=hvd.Adasum,
                                   backward_passes_per_step=2)
    x, y = data(RANK, 64)
    first = loss_of(net, x, y).item()
    for _ in range(150):
        opt.zero_grad()
        for half in (slice(0, 32), slice(32, 64)):      # two backward passes per step
            (loss_of(net, x[half], y[half]) / 2).backward()
        opt.step()
    last = loss_of(net, x, y).item()
    assert last < 1e-2 * first and last < 0.01, "loss %g -> %g" % (first, last)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    rows = hvd.allgather(flat.reshape(1, -1), name="params")
    assert all(torch.equal(rows[0], row) for row in rows), "ranks ended with different models"


@needs_power_of_2
def test_optimizer_rules():
    net = model()
    base = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(base, op=hvd.Adasum, gradient_predivide_factor=2.0)
    opt = hvd.DistributedOptimizer(base, named_parameters=net.named_parameters, op=hvd.Adasum)
    assert isinstance(opt, torch.optim.SGD)
    with pytest.raises(AssertionError, match="not supported when using Adasum"):
        with opt.skip_synchronize():
            pass
    x, y = data(RANK)
    loss_of(net, x, y).backward()
    with pytest.raises(RuntimeError, match="more than backward_passes_per_step=1"):
        loss_of(net, x, y).backward()
    opt.step()   # every rank still takes part in the reduction
