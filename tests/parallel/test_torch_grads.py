"""Gradients of hvlite.torch's differentiable collectives, checked on every rank two ways:
- against Horovod's documented formula, a NumPy reference built from every rank's seeded
  inputs and output gradients (allgather: this rank's rows of the average of the output
  gradients; broadcast: their average on the root, zero elsewhere; reducescatter: the
  allgather of the output gradients times the factors, and times the set's size for Sum;
  allreduce: the allreduce of the output gradients with the op and factors; alltoall: the
  output gradients sent back);
- against central finite differences of the global objective J = sum over ranks of each
  rank's loss sum(w_r * sin(y_r)), times the factor that relates Horovod's convention to
  dJ/dx (1 for allreduce and alltoall, 1/n for allgather and broadcast, n for reducescatter).
Single and grouped forms, the global set and a set that excludes rank 0 (so a set rank differs
from the global one). Second order (create_graph=True): a gradient penalty through allreduce and
alltoall against one process's autograd on every rank's inputs. SPMD: run by hvlrun at 2 and 3 ranks."""
import numpy as np
import pytest
import torch

import hvlite.torch as hvd

RANK, SIZE = hvd.rank(), hvd.size()
EPS = 1e-6
torch.set_num_threads(1)


def seeded(seed, rank, shape):
    return np.random.RandomState(1000 * seed + rank).uniform(-1.0, 1.0, shape)


def rows(dim0, k, n):
    """Reducescatter rows of set rank k: dim0 // n, plus one if k < dim0 % n."""
    return dim0 // n + (1 if k < dim0 % n else 0)


def starts(counts):
    return [int(sum(counts[:k])) for k in range(len(counts))]


class Case:
    """One differentiable call on a list of tensors. ``shapes(k, n)``: the input shapes of set
    rank k of n; ``run(xs, ps)``: the hvlite call; ``forward(X)`` and ``horovod(X, G)``: the NumPy
    reference outputs of every set rank from every set rank's inputs X, and Horovod's input
    gradients from the output gradients G; ``factor(n)``: Horovod's gradient / dJ/dx."""

    def __init__(self, shapes, run, forward, horovod, factor):
        self.shapes, self.run, self.forward = shapes, run, forward
        self.horovod, self.factor = horovod, factor


def allreduce_case(op, pre=1.0, post=1.0, grouped=False):
    def reduce(values, n):
        total = sum(values) * pre * post
        return total / n if op == hvd.Average else total

    def run(xs, ps):
        kw = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
        return hvd.grouped_allreduce(xs, **kw) if grouped else [hvd.allreduce(xs[0], **kw)]
    shapes = (lambda k, n: [(2, 2), (3,)]) if grouped else (lambda k, n: [(3, 2)])
    def everywhere(T):          # the reduction of each tensor of the group, on every rank
        return [[reduce([t[i] for t in T], len(T)) for i in range(len(T[0]))]] * len(T)
    return Case(shapes, run, everywhere, lambda X, G: everywhere(G), lambda n: 1.0)


def allgather_case(grouped=False):
    def shapes(k, n):
        return [(k + 1, 2), (2 - k % 2, 1)] if grouped else [(k + 1, 2)]

    def run(xs, ps):
        return hvd.grouped_allgather(xs, process_set=ps) if grouped else \
            [hvd.allgather(xs[0], process_set=ps)]

    def horovod(X, G):
        n = len(X)
        out = [[] for _ in range(n)]
        for i in range(len(X[0])):
            counts = [x[i].shape[0] for x in X]
            average = sum(g[i] for g in G) / n
            for k, s in enumerate(starts(counts)):
                out[k].append(average[s:s + counts[k]])
        return out
    return Case(shapes, run,
                lambda X: [[np.concatenate([x[i] for x in X]) for i in range(len(X[0]))]] * len(X),
                horovod, lambda n: 1.0 / n)


def broadcast_case(root_of):
    def horovod(X, G):
        average = sum(g[0] for g in G) / len(G)
        root = root_of(len(X))
        return [[average if k == root else np.zeros_like(average)] for k in range(len(X))]

    def run(xs, ps):
        members = ps.ranks if ps is not None else list(range(SIZE))
        return [hvd.broadcast(xs[0], members[root_of(len(members))], process_set=ps)]
    return Case(lambda k, n: [(2, 2)], run, lambda X: [[X[root_of(len(X))][0]]] * len(X), horovod,
                lambda n: 1.0 / n)


def reducescatter_case(op, pre=1.0, post=1.0, grouped=False):
    def shapes(k, n):
        return [(2 * n + 1,), (n, 2)] if grouped else [(2 * n + 1, 2)]

    def run(xs, ps):
        kw = dict(op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)
        return hvd.grouped_reducescatter(xs, **kw) if grouped else [hvd.reducescatter(xs[0], **kw)]

    def forward(X):
        n = len(X)
        out = [[] for _ in range(n)]
        for i in range(len(X[0])):
            total = sum(x[i] for x in X) * pre * post / (n if op == hvd.Average else 1)
            counts = [rows(total.shape[0], k, n) for k in range(n)]
            for k, s in enumerate(starts(counts)):
                out[k].append(total[s:s + counts[k]])
        return out

    def horovod(X, G):
        n = len(G)
        scale = pre * post * (n if op == hvd.Sum else 1)
        return [[np.concatenate([g[i] for g in G]) * scale for i in range(len(G[0]))]] * n
    return Case(shapes, run, forward, horovod, lambda n: float(n))


def alltoall_case():
    def split(k, n):
        return [(k + d) % 3 for d in range(n)]       # rows set rank k sends to each rank

    def run(xs, ps):
        n = len(ps.ranks) if ps is not None else SIZE
        out, _ = hvd.alltoall(xs[0], splits=split(set_rank(ps), n), process_set=ps)
        return [out]

    def blocks(X):
        n = len(X)
        return [[X[k][0][s:s + c] for s, c in zip(starts(split(k, n)), split(k, n))]
                for k in range(n)]

    def horovod(X, G):
        n = len(X)
        recv = [[split(k, n)[q] for k in range(n)] for q in range(n)]   # recv[q][k]
        back = [[g[0][s:s + c] for s, c in zip(starts(recv[q]), recv[q])]
                for q, g in enumerate(G)]
        return [[np.concatenate([back[q][k] for q in range(n)])] for k in range(n)]
    return Case(lambda k, n: [(sum(split(k, n)), 2)], run,
                lambda X: [[np.concatenate([blocks(X)[k][q] for k in range(len(X))])]
                           for q in range(len(X))],
                horovod, lambda n: 1.0)


def set_rank(ps):
    return RANK if ps is None else ps.ranks.index(RANK)


CASES = {
    "allreduce-sum": lambda: allreduce_case(hvd.Sum),
    "allreduce-average-scaled": lambda: allreduce_case(hvd.Average, pre=0.5, post=3.0),
    "grouped-allreduce": lambda: allreduce_case(hvd.Average, grouped=True),
    "allgather": lambda: allgather_case(),
    "grouped-allgather": lambda: allgather_case(grouped=True),
    "broadcast-last": lambda: broadcast_case(lambda n: n - 1),
    "broadcast-first": lambda: broadcast_case(lambda n: 0),
    "reducescatter-sum": lambda: reducescatter_case(hvd.Sum),
    "reducescatter-average-scaled": lambda: reducescatter_case(hvd.Average, pre=0.5, post=2.0),
    "grouped-reducescatter": lambda: reducescatter_case(hvd.Sum, grouped=True),
    "alltoall": lambda: alltoall_case(),
}


@pytest.fixture(scope="module")
def upper():
    """The set of ranks 1.. (one rank at -np 2): its set ranks differ from the global ones."""
    ps = hvd.add_process_set(list(range(1, SIZE)))
    yield ps
    hvd.remove_process_set(ps)


def check(case, ps):
    members = list(range(SIZE)) if ps is None else ps.ranks
    n, me = len(members), set_rank(ps)
    X = [[seeded(i + 1, members[k], s) for i, s in enumerate(case.shapes(k, n))]
         for k in range(n)]
    Y = case.forward(X)
    W = [[seeded(50 + i, members[k], y.shape) for i, y in enumerate(Y[k])] for k in range(n)]
    G = [[w * np.cos(y) for w, y in zip(W[k], Y[k])] for k in range(n)]
    expected = case.horovod(X, G)[me]

    xs = [torch.tensor(x, requires_grad=True) for x in X[me]]
    ys = case.run(xs, ps)
    for y, ref in zip(ys, Y[me]):
        np.testing.assert_allclose(y.detach().numpy(), ref, rtol=1e-12, atol=1e-12)
    sum((torch.tensor(w) * torch.sin(y)).sum() for w, y in zip(W[me], ys)).backward()
    for x, ref in zip(xs, expected):            # Horovod's formula
        np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-12, atol=1e-12)

    def objective(values):                      # J, the same on every member
        outs = case.run([torch.tensor(v) for v in values], ps)
        mine = sum(float((w * np.sin(y.numpy())).sum()) for w, y in zip(W[me], outs))
        total = hvd.allreduce(torch.tensor([mine], dtype=torch.float64), op=hvd.Sum,
                              process_set=ps)
        return total.item()
    for k in range(n):                           # finite differences, member k's inputs
        for i, shape in enumerate(case.shapes(k, n)):
            for j in range(int(np.prod(shape))):
                values = []
                for sign in (1.0, -1.0):
                    moved = [x.copy() for x in X[me]]
                    if k == me:
                        moved[i].reshape(-1)[j] += sign * EPS
                    values.append(objective(moved))
                if k == me:
                    numeric = case.factor(n) * (values[0] - values[1]) / (2 * EPS)
                    got = xs[i].grad.reshape(-1)[j].item()
                    assert abs(numeric - got) < 1e-6, (k, i, j, numeric, got)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_global_set(name):
    check(CASES[name](), None)


@pytest.mark.parametrize("name", ["allgather", "broadcast-first", "broadcast-last",
                                  "grouped-reducescatter", "reducescatter-average-scaled"])
def test_gradient_on_a_set_without_rank_0(name, upper):
    if RANK in upper.ranks:
        check(CASES[name](), upper)
    hvd.barrier()


def test_backward_passes_are_collectives_in_order():
    """Two allgathers whose backward passes run in the same order on every rank (unnamed
    requests line up by order) give each input its own gradient."""
    a = torch.full((RANK + 1, 2), 1.0, dtype=torch.float64, requires_grad=True)
    b = torch.full((2, 1), 2.0, dtype=torch.float64, requires_grad=True)
    (hvd.allgather(a).sum() * 3 + hvd.allgather(b).sum() * 5).backward()
    assert torch.equal(a.grad, torch.full_like(a, 3.0))
    assert torch.equal(b.grad, torch.full_like(b, 5.0))


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast"])
def test_results_join_the_graph_only_where_autograd_records(op):
    """A result is in the graph where autograd records the call (input requires grad, grad
    mode on) and is a plain tensor elsewhere; the values are the same either way."""
    call = {"allreduce": lambda t: hvd.allreduce(t, op=hvd.Sum),
            "allgather": hvd.allgather,
            "broadcast": lambda t: hvd.broadcast(t, 0)}[op]
    expected = {"allreduce": torch.full((2,), float(sum(range(1, SIZE + 1)))),
                "allgather": torch.cat([torch.full((2,), float(r + 1)) for r in range(SIZE)]),
                "broadcast": torch.full((2,), 1.0)}[op]
    plain = torch.full((2,), float(RANK + 1))
    tracked = plain.clone().requires_grad_()
    with torch.no_grad():
        untracked = call(tracked)
    for result, in_graph in ((call(plain), False), (untracked, False), (call(tracked), True)):
        assert (result.grad_fn is not None) == in_graph
        assert result.requires_grad == in_graph
        assert torch.equal(result.detach(), expected)


@pytest.mark.parametrize("call", ["allreduce_sum", "allreduce_average", "grouped_allreduce",
                                  "alltoall"])
def test_gradient_penalty_through_a_collective(call):
    """create_graph=True through a collective whose gradient is dJ/dx (allreduce, alltoall):
    each rank's loss z_r plus the penalty |dz/dx_r|^2 gives every rank the gradient of
    J + sum_r |dJ/dx_r|^2, J = sum over ranks of z_r, computed here in one process from every
    rank's inputs (without second-order terms through the collective, it differs)."""
    n, op = SIZE, (hvd.Average if call == "allreduce_average" else hvd.Sum)
    xs = [torch.tensor(seeded(40, r, (2 * n,)), requires_grad=True) for r in range(n)]
    ws = [torch.tensor(seeded(41, r, (2 * n,))) for r in range(n)]

    def collective_everywhere(X):       # every rank's output from every rank's input
        if call == "alltoall":
            return [torch.cat([X[k][2 * r:2 * r + 2] for k in range(n)]) for r in range(n)]
        total = sum(X) / (n if op == hvd.Average else 1)
        return [total] * n

    def collective(x):
        if call == "alltoall":
            return hvd.alltoall(x)
        if call == "grouped_allreduce":
            return hvd.grouped_allreduce([x], op=op)[0]
        return hvd.allreduce(x, op=op)

    def loss(y, w):
        return (w * torch.sin(y)).sum()  # nonlinear: the penalty has second-order terms
    x = xs[RANK].detach().clone().requires_grad_()
    z = loss(collective(x), ws[RANK])
    g, = torch.autograd.grad(z, x, create_graph=True)
    (z + (g ** 2).sum()).backward()
    J = sum(loss(y, w) for y, w in zip(collective_everywhere(xs), ws))
    G = torch.autograd.grad(J, xs, create_graph=True)
    assert torch.allclose(g, G[RANK], rtol=1e-12, atol=1e-12)
    expected, = torch.autograd.grad(J + sum((Gr ** 2).sum() for Gr in G), xs[RANK])
    assert torch.allclose(x.grad, expected, rtol=1e-12, atol=1e-12), (x.grad, expected)
