"""DistributedOptimizer over a training script's life, each checked on every rank against one
process computing on the combined batch: a learning rate scheduler made before wrapping (its
learning rates reach the wrapper, whose step runs; also after broadcast_optimizer_state, which
loads a state dict on the other ranks), for op=Average and op=Adasum; a second backward pass
before step() (Average starts over from the averaged gradients, Sum raises); a second
optimizer wrapped over the same model (it alone reduces the gradients); a parameter group
added after wrapping (reduced too; refused during a step).
SPMD: run by hvlrun at 2 and 3 ranks (Adasum at a power-of-2 size only)."""
import copy
import warnings

import pytest
import torch

import hvlite.torch as hvd

RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def model_and_batches(seed=0, steps=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                                torch.nn.Linear(4, 2)).double()
    g = torch.Generator().manual_seed(77)
    x = torch.randn(steps, SIZE * 2, 5, generator=g, dtype=torch.float64)   # 2 rows/rank
    y = torch.randn(steps, SIZE * 2, 2, generator=g, dtype=torch.float64)
    return model, x, y


def rows_of(ranks):
    return torch.cat([torch.arange(2 * r, 2 * r + 2) for r in ranks])


def assert_close(model, reference, what):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), (what, name, (p - q).abs().max())


def assert_same_on_every_rank(model, what):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.reshape(1, -1), name="same." + what)
    for r in range(SIZE):
        assert torch.equal(everyone[r], flat), (what, "rank %d differs" % r)


def train_with_scheduler(model, opt, sched, x, y, ranks):
    rows = rows_of(ranks)
    lrs = []
    for b in range(x.shape[0]):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[b][rows]), y[b][rows]).backward()
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


@pytest.mark.parametrize("broadcast_state", [False, True])
def test_scheduler_made_before_wrapping_drives_the_wrapper(broadcast_state):
    model, x, y = model_and_batches()
    reference = copy.deepcopy(model)
    base = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.5)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    if broadcast_state:      # the other ranks load the root's state dict
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lr_scheduler.step.*")
        lrs = train_with_scheduler(model, opt, sched, x, y, [RANK])
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.4, momentum=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    if broadcast_state:      # the state broadcast made momentum buffers of zeros: the same
        for p in reference.parameters():
            p.grad = torch.zeros_like(p)
        ref_opt.step()
    ref_lrs = train_with_scheduler(reference, ref_opt, ref_sched, x, y, range(SIZE))
    assert lrs == ref_lrs == [0.2, 0.1, 0.05], (lrs, ref_lrs)
    assert sched.get_last_lr() == [0.05]
    assert opt.param_groups is base.param_groups and opt.state is base.state
    assert_close(model, reference, "scheduler before wrapping")


def test_scheduler_made_before_wrapping_drives_the_adasum_optimizer():
    if SIZE & (SIZE - 1):
        pytest.skip("Adasum needs a power-of-2 number of ranks")
    model, x, y = model_and_batches(seed=1)
    base = torch.optim.SGD(model.parameters(), lr=0.4)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   op=hvd.Adasum)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    lrs = train_with_scheduler(model, opt, sched, x, y, [RANK])
    assert lrs == [0.2, 0.1, 0.05]
    # each rank stepped on its own rows: only the Adasum reduction of the deltas makes them equal
    assert_same_on_every_rank(model, "adasum")


@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum])
def test_second_backward_before_step(op):
    """Average: a backward pass after the gradients were averaged (a skipped step) starts the
    step over from them, which averages right. Sum: it would sum the summed gradient again (the
    first pass counted n*n times), so it raises on every rank, as Horovod does; zero_grad()
    starts a clean step."""
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   op=op)
    g = [torch.tensor([1.0 + r, 2.0 * r], dtype=torch.float64) for r in range(SIZE)]
    (w * g[RANK]).sum().backward()
    first = sum(g) / SIZE if op == hvd.Average else sum(g)
    assert torch.allclose(w.grad, first)
    if op == hvd.Sum:
        with pytest.raises(RuntimeError, match="more than backward_passes_per_step=1 times.*"
                                               "op=Sum.*zero_grad"):
            (w * g[RANK]).sum().backward()
        opt.zero_grad()
        (w * g[RANK]).sum().backward()
        assert torch.allclose(w.grad, sum(g))
    else:
        (w * g[RANK]).sum().backward()
        assert torch.allclose(w.grad, first + sum(g) / SIZE)
    opt.step()


@pytest.mark.parametrize("second_op", [hvd.Average, hvd.Sum])
def test_a_second_optimizer_on_the_same_model_reduces_alone(second_op):
    """A new training phase wraps the same parameters again: the first wrapper's hooks are
    gone (they reduced every gradient a second time, and with bucket_bytes=0 raised 'already
    in flight')."""
    model, x, y = model_and_batches(seed=2, steps=4)
    reference = copy.deepcopy(model)
    names = list(model.named_parameters())
    first = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                     named_parameters=names)
    second = None
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.3)
    for b in range(x.shape[0]):
        if b == 2:         # the second phase
            second = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              named_parameters=names, op=second_op,
                                              bucket_bytes=0)
            ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        opt = second or first
        opt.zero_grad()
        rows = rows_of([RANK])
        torch.nn.functional.mse_loss(model(x[b][rows]), y[b][rows]).backward()
        opt.step()
        ref_opt.zero_grad()
        # Sum over ranks of each rank's mean loss = SIZE times the combined batch's mean loss
        scale = SIZE if (second is not None and second_op == hvd.Sum) else 1
        rows = rows_of(range(SIZE))
        (scale * torch.nn.functional.mse_loss(reference(x[b][rows]), y[b][rows])).backward()
        ref_opt.step()
    assert_close(model, reference, "second optimizer")


@pytest.mark.parametrize("naming", ["named", "positions", "adasum"])
def test_a_param_group_added_after_wrapping_is_reduced(naming):
    """Fine-tuning that unfreezes a layer: its parameters, added with add_param_group after
    wrapping, are reduced too (they stayed local, and the ranks diverged)."""
    if naming == "adasum" and SIZE & (SIZE - 1):
        pytest.skip("Adasum needs a power-of-2 number of ranks")
    model, x, y = model_and_batches(seed=3, steps=4)
    reference = copy.deepcopy(model)
    head, tail = model[2], model[0]
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(head.parameters(), lr=0.3),
        named_parameters=model.named_parameters() if naming != "positions" else None,
        op=hvd.Adasum if naming == "adasum" else hvd.Average)
    ref_opt = torch.optim.SGD(reference[2].parameters(), lr=0.3)
    for b in range(x.shape[0]):
        if b == 1:
            opt.add_param_group({"params": tail.parameters(), "lr": 0.1})
            ref_opt.add_param_group({"params": reference[0].parameters(), "lr": 0.1})
        for o, m, ranks in ((opt, model, [RANK]), (ref_opt, reference, range(SIZE))):
            rows = rows_of(ranks)
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x[b][rows]), y[b][rows]).backward()
            o.step()
    if naming == "adasum":     # every rank stepped on its own rows: the reduction makes them equal
        assert_same_on_every_rank(model, "adasum add_param_group")
        return
    assert sorted(opt._parameter_names.values()) == (
        ["0.bias", "0.weight", "2.bias", "2.weight"] if naming == "named"
        else ["param.0", "param.1", "param.2", "param.3"])
    assert_close(model, reference, "add_param_group")


def test_add_param_group_during_a_step_raises():
    model, x, y = model_and_batches(seed=4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model[2].parameters(), lr=0.3),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    torch.nn.functional.mse_loss(model(x[0]), y[0]).backward()     # 1 of 2 passes
    with pytest.raises(RuntimeError, match="between backward.. and step"):
        opt.add_param_group({"params": model[0].parameters()})
    torch.nn.functional.mse_loss(model(x[0]), y[0]).backward()
    opt.step()
