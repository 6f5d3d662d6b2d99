"""DistributedOptimizer where Horovod's scripts depend on the details, each checked on every rank
against one process computing on the combined batch: named_parameters given as the bound method
or omitted (and the names it keeps, ``_parameter_names``); process_set= on a set this rank is
not in (the rank takes no part and steps on its own gradients); SparseAdam on a sparse
embedding, with and without sparse_as_dense (the gradients stay sparse); the warning for
step() after synchronize() (Horovod's words, then hvlite's advice); the gradients averaged
when backward returns, also after a backward pass that failed half way, and the warning when a
parameter without a gradient moves that wait to step().
SPMD: run by hvlrun at 2 and 3 ranks."""
import copy
import warnings

import pytest
import torch

import hvlite
import hvlite.torch as hvd

RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def model_and_batches(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                                torch.nn.Linear(4, 2)).double()
    g = torch.Generator().manual_seed(77)
    x = torch.randn(3, SIZE * 2, 5, generator=g, dtype=torch.float64)   # 3 steps, 2 rows/rank
    y = torch.randn(3, SIZE * 2, 2, generator=g, dtype=torch.float64)
    return model, x, y


def steps(model, opt, x, y, ranks):
    """One step per batch on the rows of ``ranks`` (mean loss over them)."""
    rows = torch.cat([torch.arange(2 * r, 2 * r + 2) for r in ranks])
    for b in range(x.shape[0]):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[b][rows]), y[b][rows]).backward()
        opt.step()


def assert_close(model, reference, what):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), (what, name, (p - q).abs().max())


@pytest.mark.parametrize("naming", ["method", "omitted", "called"])
def test_named_parameters_forms(naming):
    model, x, y = model_and_batches()
    reference = copy.deepcopy(model)
    names = {"method": model.named_parameters, "omitted": None,
             "called": model.named_parameters()}[naming]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5),
                                   named_parameters=names)
    assert sorted(opt._parameter_names.values()) == (
        sorted(n for n, _ in model.named_parameters()) if naming != "omitted"
        else sorted("param.%d" % i for i in range(4)))
    steps(model, opt, x, y, [RANK])
    steps(reference, torch.optim.SGD(reference.parameters(), lr=0.3, momentum=0.5), x, y,
          range(SIZE))
    assert_close(model, reference, naming)


def test_process_set_without_this_rank():
    """Set = the ranks 1..: they average among themselves; rank 0 is not in the set, sends
    nothing and steps on its own gradients (as Horovod's optimizer does)."""
    upper = hvd.add_process_set(list(range(1, SIZE)))
    model, x, y = model_and_batches()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                   named_parameters=model.named_parameters(), process_set=upper)
    before = hvlite.engine_counters()["tensors_submitted"]
    steps(model, opt, x, y, [RANK])
    if RANK == 0:
        assert hvlite.engine_counters()["tensors_submitted"] == before   # took no part
    steps(reference, torch.optim.SGD(reference.parameters(), lr=0.3), x, y,
          [0] if RANK == 0 else upper.ranks)
    assert_close(model, reference, "process set %s" % upper.ranks)
    hvd.remove_process_set(upper)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_adam_on_sparse_embedding(sparse_as_dense):
    torch.manual_seed(1)
    emb = torch.nn.Embedding(10, 3, sparse=True).double()
    reference = copy.deepcopy(emb)
    ids = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9], [0, 0, 8, 1]])[:SIZE]   # a row per rank
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                   sparse_as_dense=sparse_as_dense)
    ref_opt = torch.optim.SparseAdam(list(reference.parameters()), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (emb(ids[RANK]) ** 2).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse        # what SparseAdam insists on
        with opt.skip_synchronize():
            opt.step()
        ref_opt.zero_grad()
        ((reference(ids) ** 2).sum() / SIZE).backward()
        ref_opt.step()
    assert torch.allclose(emb.weight, reference.weight, rtol=1e-10, atol=1e-12)


def test_step_after_synchronize_warns_in_horovods_words():
    model, x, y = model_and_batches()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    torch.nn.functional.mse_loss(model(x[0]), y[0]).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert len(caught) == 1, [str(w.message) for w in caught]
    text = str(caught[0].message)
    assert text.startswith("optimizer.step() called without optimizer.skip_synchronize()")
    assert "with optimizer.skip_synchronize():" in text


def step_warnings(opt):
    """opt.step()'s warnings, the once-per-process one about gradients at step() included."""
    hvlite.once._seen.discard("gradients at step")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    return [str(w.message) for w in caught]


class FailingBackward(torch.autograd.Function):
    """Identity whose backward raises while `fail` is set."""
    fail = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if FailingBackward.fail:
            raise RuntimeError("backward failed on purpose")
        return grad


@pytest.mark.parametrize("failing", ["middle", "input"])
def test_gradients_averaged_when_backward_returns(failing):
    """After a backward pass that failed (`middle`: after the last layer's hooks ran; `input`:
    after every parameter's), step() works and later steps average when backward returns."""
    model, x, y = model_and_batches()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())

    def loss(m, xb, yb):
        if failing == "input":
            return torch.nn.functional.mse_loss(m(FailingBackward.apply(xb.clone().requires_grad_())), yb)
        return torch.nn.functional.mse_loss(m[2](FailingBackward.apply(m[1](m[0](xb)))), yb)

    FailingBackward.fail = True
    with pytest.raises(RuntimeError, match="on purpose"):
        loss(model, x[0][RANK * 2:RANK * 2 + 2], y[0][RANK * 2:RANK * 2 + 2]).backward()
    FailingBackward.fail = False
    texts = step_warnings(opt)             # every rank failed alike: step on what there is
    if failing == "middle":                # the first layer's hooks never ran
        assert len(texts) == 1 and "(first: '0.weight')" in texts[0], texts
    else:
        assert texts == []
    for b in (1, 2):
        with torch.no_grad():
            for p, q in zip(model.parameters(), reference.parameters()):
                q.copy_(p)                 # the same start for each batch
        opt.zero_grad()
        loss(model, x[b][RANK * 2:RANK * 2 + 2], y[b][RANK * 2:RANK * 2 + 2]).backward()
        reference.zero_grad()
        loss(reference, x[b], y[b]).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-12), (b, name)   # before step()
        opt.step()


def test_parameter_without_gradient_moves_the_wait_to_step():
    model, x, y = model_and_batches()
    unused = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(model.parameters()) + [unused], lr=0.1),
                                   named_parameters=list(model.named_parameters()) + [("unused", unused)])
    torch.nn.functional.mse_loss(model(x[0]), y[0]).backward()
    assert not opt._reduced                 # waits at step()
    texts = step_warnings(opt)
    assert len(texts) == 1 and "(first: 'unused')" in texts[0], texts


def reference_gradients(model, x, y, rows_per_pass):
    """Every rank's passes on one process: the sum over passes of each rank's gradients,
    averaged over the ranks (what a step with backward_passes_per_step = len(passes) sends)."""
    reference = copy.deepcopy(model)
    reference.zero_grad()
    for r in range(SIZE):
        for rows in rows_per_pass:
            picked = [2 * r + i for i in rows]
            torch.nn.functional.mse_loss(reference(x[0][picked]), y[0][picked]).backward()
    return [p.grad / SIZE for p in reference.parameters()]


def backward_pass(model, x, y, rows):
    picked = [2 * RANK + i for i in rows]
    torch.nn.functional.mse_loss(model(x[0][picked]), y[0][picked]).backward()


def test_set_backward_passes_per_step_accumulates_over_the_new_count():
    model, x, y = model_and_batches()
    expected = reference_gradients(model, x, y, [[0], [1]])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                   named_parameters=model.named_parameters())
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    opt.zero_grad()
    backward_pass(model, x, y, [0])
    backward_pass(model, x, y, [1])
    for p, q in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, q, rtol=1e-10, atol=1e-12), (p.grad - q).abs().max()
    opt.step()
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        opt.set_backward_passes_per_step(0)


def test_load_state_dict_starts_the_step_over():
    """Horovod's override: a state loaded after one of two passes resets the counters, so the
    next two passes make the step (without it, the second would be one pass too many)."""
    model, x, y = model_and_batches()
    expected = reference_gradients(model, x, y, [[0], [1]])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    opt.zero_grad()
    backward_pass(model, x, y, [1])
    opt.load_state_dict(opt.state_dict())
    opt.zero_grad()
    backward_pass(model, x, y, [0])
    backward_pass(model, x, y, [1])
    for p, q in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, q, rtol=1e-10, atol=1e-12), (p.grad - q).abs().max()
    opt.step()


def test_duplicate_parameter_names_are_named():
    model, _, _ = model_and_batches()
    named = [("w", p) for p in model.parameters()]
    with pytest.raises(ValueError, match="named_parameters has duplicate names: w"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named)
    assert hvd.DistributedOptimizer.__module__ and \
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1)).find_duplicates(
            ["a", "b", "a", "c", "b"]) == {"a", "b"}


def test_mpi_ops_is_horovods_module_path():
    from hvlite.torch import mpi_ops
    from hvlite.torch.mpi_ops import Average, allreduce_async_, synchronize
    assert mpi_ops.allreduce is hvd.allreduce and Average == hvd.Average
    t = torch.full((3,), float(RANK + 1))
    synchronize(allreduce_async_(t, name="mpi_ops.path", op=hvd.Sum))
    assert t.tolist() == [SIZE * (SIZE + 1) / 2] * 3
