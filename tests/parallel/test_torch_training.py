"""hvlite.torch training semantics, each checked on every rank against one process computing on
the combined batch: DistributedOptimizer (SGD with momentum, Adam; 1 and 2 backward passes per
step; fp16 compression; sparse embedding gradients; mixed precision with torch's GradScaler,
in torch's plain loop and Horovod's synchronize-then-clip one), broadcast_parameters and
broadcast_optimizer_state (state created or not: created by a zero-gradient step, as in
Horovod, which leaves the parameters as they were; a root resumed from a checkpoint, under
each optimizer wrapper; L-BFGS), SyncBatchNorm forward/backward/running stats (and in
evaluation without running stats, with layers only one rank creates, and float32/bfloat16
activations against float64), join with uneven batches, and clear errors for a model that
differs across ranks. On the CPU, or on CUDA models and tensors with HVLITE_TEST_DEVICE=cuda
(torch_device.py).
SPMD: run by hvlrun."""
import contextlib
import copy

import pytest
import torch

import hvlite.torch as hvd
from torch_device import DEVICE

RANK, SIZE = hvd.rank(), hvd.size()
PER_RANK = 4
torch.set_num_threads(1)


def model_and_data(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(8, SIZE * PER_RANK, 6, generator=g, dtype=dtype)   # 8 batches, all ranks'
    y = torch.randn(8, SIZE * PER_RANK, 3, generator=g, dtype=dtype)
    return model.to(dtype).to(DEVICE), x.to(DEVICE), y.to(DEVICE)


def shard(batch):
    return batch[RANK * PER_RANK:(RANK + 1) * PER_RANK]


def train(model, opt, x, y, steps, passes, distributed):
    """`passes` micro-batches per step; each loss is the mean over its (combined or local) batch."""
    loss_fn = torch.nn.MSELoss()
    for step in range(steps):
        opt.zero_grad()
        for p in range(passes):
            b = step * passes + p
            xb, yb = (shard(x[b]), shard(y[b])) if distributed else (x[b], y[b])
            loss_fn(model(xb), yb).backward()
        opt.step()


def assert_same_on_every_rank(model):
    for name, p in model.named_parameters():
        everyone = hvd.allgather(p.detach().reshape(1, -1), name="same." + name)
        assert all(torch.equal(everyone[0], row) for row in everyone), "ranks differ on " + name


@pytest.mark.parametrize("optim,passes,compression,bucket", [
    ("sgd", 1, "none", 4 << 20), ("sgd", 2, "none", 0), ("adam", 1, "none", 0),
    ("adam", 2, "none", 64), ("sgd", 1, "fp16", 4 << 20)])
def test_distributed_optimizer_matches_combined_batch(optim, passes, compression, bucket):
    dtype = torch.float32 if compression == "fp16" else torch.float64
    model, x, y = model_and_data(dtype)
    reference = copy.deepcopy(model)
    make = (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)) if optim == "sgd" else \
        (lambda ps: torch.optim.Adam(ps, lr=0.01))
    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, bucket_bytes=bucket,
                                   compression=getattr(hvd.Compression, compression))
    steps = 8 // passes
    train(model, opt, x, y, steps, passes, distributed=True)
    train(reference, make(reference.parameters()), x, y, steps, passes, distributed=False)
    tol = 2e-3 if compression == "fp16" else 1e-10
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=tol, atol=tol), (name, (p - q).abs().max())
    assert_same_on_every_rank(model)


def test_synchronize_then_clip_with_skip_synchronize():
    model, x, y = model_and_data()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    loss = torch.nn.MSELoss()
    for b in range(3):
        opt.zero_grad()
        loss(model(shard(x[b])), shard(y[b])).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
        ref_opt.zero_grad()
        loss(reference(x[b]), y[b]).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-10)


AUTOCAST = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16


def amp_step(model, opt, scaler, xb, yb, loop, distributed):
    """One mixed-precision step with torch's GradScaler: `plain` is torch's loop (scaler.step
    unscales and checks the gradients it finds after backward); `clip` unscales and clips first,
    after Horovod's synchronize() where distributed."""
    opt.zero_grad()
    with torch.autocast(DEVICE.type, dtype=AUTOCAST):
        loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
    scaler.scale(loss).backward()
    if loop == "clip":
        if distributed:
            opt.synchronize()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        with opt.skip_synchronize() if distributed else contextlib.nullcontext():
            scaler.step(opt)
    else:
        scaler.step(opt)
    scaler.update()
    return scaler.get_scale()


@pytest.mark.parametrize("loop,bucket", [("plain", 4 << 20), ("plain", 0), ("clip", 4 << 20), ("clip", 0)])
def test_grad_scaler_matches_combined_batch_and_skips_together(loop, bucket):
    """GradScaler finds the averaged gradients when it looks (as after DDP's backward), so every
    rank skips the same steps: batch 3 has an infinity in rank 0's rows alone, and every rank
    must skip that step and halve its scale, as one process on the combined batch does."""
    model, x, y = model_and_data(torch.float32)
    x[3, 0, 0] = float("inf")                      # row 0 is rank 0's
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), bucket_bytes=bucket)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    # a small first scale: float16 overflows nowhere but at batch 3
    scaler, ref_scaler = (torch.amp.GradScaler(DEVICE.type, init_scale=1024.0) for _ in range(2))
    for b in range(8):
        scale = amp_step(model, opt, scaler, shard(x[b]), shard(y[b]), loop, True)
        ref_scale = amp_step(reference, ref_opt, ref_scaler, x[b], y[b], loop, False)
        assert scale == ref_scale, (b, scale, ref_scale)
        if b == 3:
            assert scale == 512.0, scale            # halved: the step was skipped
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.isfinite(p).all(), name
        assert torch.allclose(p, q, rtol=2e-2, atol=2e-2), (name, (p - q).abs().max())
    assert_same_on_every_rank(model)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(sparse_as_dense):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True).double().to(DEVICE)
    reference = copy.deepcopy(emb)
    ids = torch.tensor([[1, 2, 2, 7], [3, 1, 9, 0], [5, 5, 6, 1], [2, 8, 4, 4]],
                       device=DEVICE)[:SIZE]   # one row per rank (up to 4 ranks)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(), sparse_as_dense=sparse_as_dense)
    opt.zero_grad()
    emb(ids[RANK]).sum().backward()
    opt.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=1.0)
    (reference(ids).sum() / SIZE).backward()
    ref_opt.step()
    assert torch.allclose(emb.weight, reference.weight, atol=1e-12)


def test_broadcast_parameters_and_optimizer_state():
    model, x, y = model_and_data(seed=100 + RANK)          # every rank starts different
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if RANK == 0:                                          # only the root has optimizer state
        train(model, opt, x, y, steps=2, passes=1, distributed=False)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert_same_on_every_rank(model)
    state = opt.state_dict()
    assert len(state["state"]) == 4
    for i, s in state["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            t = s[key].reshape(1, -1).double()
            everyone = hvd.allgather(t, name="optstate.%d.%s" % (i, key))
            assert all(torch.equal(everyone[0], row) for row in everyone), (i, key)
    # the other way round: the root has no state yet, the others do -> the root creates its
    # state with a step on zero gradients (as Horovod does) and every rank takes it
    model2, _, _ = model_and_data(seed=7)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    if RANK != 0:
        train(model2, opt2, x, y, steps=1, passes=1, distributed=False)
    hvd.broadcast_optimizer_state(opt2, root_rank=0)
    state = opt2.state_dict()["state"]
    assert len(state) == 4 and all(not s["momentum_buffer"].any() for s in state.values())
    assert all(p.grad is not None for p in model2.parameters())
    hvd.broadcast_parameters(list(model2.named_parameters()), root_rank=0)
    assert_same_on_every_rank(model2)


@pytest.mark.parametrize("wrapper", ["plain", "distributed", "adasum"])
def test_resumed_root_state_reaches_fresh_ranks_and_parameters_stay(wrapper):
    """Resuming from a checkpoint that only the root loaded: the other ranks create their
    optimizer state with the plain optimizer's step on zero gradients (a distributed step there,
    such as the Adasum optimizer's, would wait for a root that takes none), then take the root's;
    and that step leaves the parameters broadcast_parameters gave them, weight decay included."""
    if wrapper == "adasum" and SIZE & (SIZE - 1):
        pytest.skip("the Adasum optimizer needs a power-of-2 number of ranks (%d here)" % SIZE)
    model, x, y = model_and_data(seed=200 + RANK)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.5)
    if RANK == 0:                                          # the root loaded its checkpoint
        train(model, opt, x, y, steps=2, passes=1, distributed=False)
    if wrapper != "plain":
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       op=hvd.Adasum if wrapper == "adasum" else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    received = copy.deepcopy(model.state_dict())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for key, value in model.state_dict().items():
        assert torch.equal(value, received[key]), "the state's creation moved " + key
    for i, s in opt.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            everyone = hvd.allgather(s[key].reshape(1, -1).double(), name="resumed.%d.%s" % (i, key))
            assert all(torch.equal(everyone[0], row) for row in everyone), (i, key)
    assert opt.state_dict()["state"][0]["step"].item() == 2      # the root's, not a fresh 1


def test_lbfgs_state_reaches_a_fresh_rank():
    """L-BFGS's step needs a closure: the zero-gradient step gets one (Horovod refuses L-BFGS)."""
    model, x, y = model_and_data(seed=300 + RANK)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(shard(x[0])), shard(y[0]))
        loss.backward()
        return loss
    if RANK == 0:
        opt.step(closure)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()["state"][0]
    n_iter = hvd.allgather_object(state["n_iter"], name="lbfgs.n_iter")
    assert n_iter == [n_iter[0]] * SIZE and n_iter[0] > 1, n_iter
    for key in ("d", "prev_flat_grad"):
        everyone = hvd.allgather(state[key].reshape(1, -1).double(), name="lbfgs." + key)
        assert all(torch.equal(everyone[0], row) for row in everyone), key
    opt.step(closure)                                        # the state it took is usable


def test_sync_batch_norm_matches_combined_batch():
    torch.manual_seed(3)
    data = torch.randn(SIZE * 4, 3, 2, 2, dtype=torch.float64).to(DEVICE)
    weights = torch.randn_like(data)
    sync = hvd.SyncBatchNorm(3, momentum=0.3).double().to(DEVICE)
    plain = torch.nn.BatchNorm2d(3, momentum=0.3).double().to(DEVICE)
    with torch.no_grad():
        for bn in (sync, plain):
            bn.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
            bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    mine = data[RANK * 4:(RANK + 1) * 4].clone().requires_grad_()
    combined = data.clone().requires_grad_()
    out = sync(mine)
    ref = plain(combined)
    (out * weights[RANK * 4:(RANK + 1) * 4]).sum().backward()
    (ref * weights).sum().backward()
    assert torch.allclose(out, ref[RANK * 4:(RANK + 1) * 4], atol=1e-10)
    assert torch.allclose(mine.grad, combined.grad[RANK * 4:(RANK + 1) * 4], atol=1e-10)
    for p, q in ((sync.weight, plain.weight), (sync.bias, plain.bias)):
        assert torch.allclose(hvd.allreduce(p.grad, op=hvd.Sum), q.grad, atol=1e-10)
    assert torch.allclose(sync.running_mean, plain.running_mean, atol=1e-12)
    assert torch.allclose(sync.running_var, plain.running_var, atol=1e-12)
    sync.eval()
    plain.eval()
    assert torch.allclose(sync(mine), plain(mine), atol=1e-12)


def test_sync_batch_norm_in_evaluation_without_running_stats_uses_every_rank():
    """BatchNorm without running statistics normalizes by the batch in evaluation too: the
    combined batch here, as Horovod's SyncBatchNorm does."""
    torch.manual_seed(4)
    data = torch.randn(SIZE * 3, 2, 5, dtype=torch.float64).to(DEVICE)
    weights = torch.randn_like(data)
    sync = hvd.SyncBatchNorm(2, track_running_stats=False).double().to(DEVICE).eval()
    plain = torch.nn.BatchNorm1d(2, track_running_stats=False).double().to(DEVICE).eval()
    mine = data[RANK * 3:(RANK + 1) * 3].clone().requires_grad_()
    combined = data.clone().requires_grad_()
    out, ref = sync(mine), plain(combined)
    (out * weights[RANK * 3:(RANK + 1) * 3]).sum().backward()
    (ref * weights).sum().backward()
    assert torch.allclose(out, ref[RANK * 3:(RANK + 1) * 3], atol=1e-10)
    assert torch.allclose(mine.grad, combined.grad[RANK * 3:(RANK + 1) * 3], atol=1e-10)


def test_sync_batch_norm_layers_only_one_rank_creates_do_not_shift_the_names():
    """Rank 0 alone builds a model with SyncBatchNorm layers first (an EMA copy it evaluates):
    the layers every rank trains still pair up (they were named by creation order, so rank 0's
    names were shifted and the first forward failed with a deadlock)."""
    if RANK == 0:
        ema = torch.nn.Sequential(hvd.SyncBatchNorm(3), hvd.SyncBatchNorm(3)).double().eval()
        ema(torch.randn(2, 3, dtype=torch.float64))
    torch.manual_seed(6)
    data = torch.randn(SIZE * 3, 3, dtype=torch.float64).to(DEVICE)
    sync = hvd.SyncBatchNorm(3).double().to(DEVICE)
    plain = torch.nn.BatchNorm1d(3).double().to(DEVICE)
    for _ in range(2):
        out, ref = sync(data[RANK * 3:(RANK + 1) * 3]), plain(data)
        assert torch.allclose(out, ref[RANK * 3:(RANK + 1) * 3], atol=1e-10)


@pytest.mark.parametrize("dtype,rows,tolerance", [(torch.float32, 4, 1e-5), (torch.float64, 1, 1e-10)])
def test_sync_batch_norm_single_precision_and_one_row_per_rank(dtype, rows, tolerance):
    """float32 layers (the input saved in its own dtype for backward); one row per rank, which
    is one value per channel locally but SIZE over all ranks: allowed, as the combined batch."""
    if rows * SIZE < 2:
        pytest.skip("one value per channel in all: BatchNorm refuses it")
    torch.manual_seed(5)
    data = torch.randn(SIZE * rows, 3, dtype=dtype).to(DEVICE)
    weights = torch.randn_like(data)
    sync = hvd.SyncBatchNorm(3).to(DEVICE, dtype)
    plain = torch.nn.BatchNorm1d(3).to(DEVICE, dtype)
    mine = data[RANK * rows:(RANK + 1) * rows].clone().requires_grad_()
    combined = data.clone().requires_grad_()
    out, ref = sync(mine), plain(combined)
    (out * weights[RANK * rows:(RANK + 1) * rows]).sum().backward()
    (ref * weights).sum().backward()
    assert out.dtype == dtype and mine.grad.dtype == dtype
    assert torch.allclose(out, ref[RANK * rows:(RANK + 1) * rows], atol=tolerance)
    assert torch.allclose(mine.grad, combined.grad[RANK * rows:(RANK + 1) * rows], atol=tolerance)
    assert torch.allclose(sync.running_var, plain.running_var, atol=tolerance)


@pytest.mark.parametrize("dtype,offset,tolerance", [(torch.float32, 0.0, 2e-6),
                                                     (torch.float32, 100.0, 2e-5),
                                                     (torch.bfloat16, 3.0, 2e-2)])
def test_sync_batch_norm_low_precision_against_float64(dtype, offset, tolerance):
    """float32 and bfloat16 activations are worked on in float32 (only per-channel statistics in
    float64): outputs, input gradients and running statistics within ``tolerance`` of float64
    BatchNorm on the combined batch, also for a mean far from zero (where summing squares
    cancels), and ranks holding different numbers of rows."""
    torch.manual_seed(8)
    counts = [3 + r for r in range(SIZE)]
    starts = [sum(counts[:r]) for r in range(SIZE)]
    data = (torch.randn(sum(counts), 4, 5, dtype=torch.float64) * 2 + offset).to(dtype)
    weights = torch.randn(data.shape, dtype=torch.float64)
    sync = hvd.SyncBatchNorm(4).to(DEVICE)
    plain = torch.nn.BatchNorm1d(4).double().to(DEVICE)
    lo, hi = starts[RANK], starts[RANK] + counts[RANK]
    mine = data[lo:hi].clone().to(DEVICE).requires_grad_()
    combined = data.double().to(DEVICE).requires_grad_()
    out, ref = sync(mine), plain(combined)
    (out.double() * weights[lo:hi].to(DEVICE)).sum().backward()
    (ref * weights.to(DEVICE)).sum().backward()
    assert out.dtype == dtype and mine.grad.dtype == dtype
    assert (out.double() - ref[lo:hi]).abs().max() < tolerance
    assert (mine.grad.double() - combined.grad[lo:hi]).abs().max() < tolerance
    for a, b in ((sync.running_mean, plain.running_mean), (sync.running_var, plain.running_var)):
        assert torch.allclose(a.double(), b, rtol=1e-5, atol=1e-5)


def test_join_with_uneven_batches():
    model, x, y = model_and_data()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss = torch.nn.MSELoss()
    for b in range(2 + RANK):                 # rank r has 2 + r batches
        opt.zero_grad()
        loss(model(shard(x[b])), shard(y[b])).backward()
        opt.step()
    last = hvd.join()
    assert last == SIZE - 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    assert_same_on_every_rank(model)


@pytest.mark.skipif(SIZE < 2, reason="needs ranks that differ")
def test_model_that_differs_across_ranks_fails_everywhere():
    hidden = 8 if RANK == 0 else 9
    model = torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.Linear(hidden, 3)).to(DEVICE)
    with pytest.raises(ValueError, match="parameters differ across ranks"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())
