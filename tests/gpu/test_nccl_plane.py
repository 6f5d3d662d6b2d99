"""Which plane runs CUDA tensors, on every rank of a job on a GPU machine (tests/test_gpu.py):
NCCL where every rank has a GPU of its own or its own NCCL_HOSTID (HVLITE_TEST_NCCL_HOSTID=per-rank:
NCCL runs allreduce, broadcast and even reducescatter, with the scale factors folded in), else
the staged path (ranks sharing a GPU as they are: NCCL refuses them, so everything goes through
host memory). Results against
NumPy references on every rank either way; the plane counters say which plane ran.
SPMD: run by hvlrun, on a machine with a GPU."""
import os

import numpy as np
import pytest
import torch

import hvlite
import hvlite.torch as hvd

RANK, SIZE = hvd.rank(), hvd.size()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
CUDA = torch.device("cuda", torch.cuda.current_device())
# NCCL runs a set whose ranks each have a GPU of their own: their own device, or their own
# NCCL_HOSTID (tests/spmd_plugin.py), unless switched off
OWN_GPU = os.environ.get("HVLITE_TEST_NCCL_HOSTID") == "per-rank" or SIZE <= torch.cuda.device_count()
EXPECT = "nccl" if OWN_GPU and os.environ.get("HVLITE_NCCL_DISABLE", "0") == "0" else "staged"
DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]


def nccl_ran():
    return hvlite.engine_counters()["nccl_collectives"]


def value(rank, n, dtype):
    """Rank r's tensor: small values every dtype holds exactly, sums and products included."""
    return (torch.arange(n) % 3 + rank % 2 + 1).to(dtype)


def check_plane(before, batches):
    ran = nccl_ran() - before
    assert ran == (batches if EXPECT == "nccl" else 0), (EXPECT, ran, batches)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_ops_on_the_expected_plane(dtype):
    n = 1000
    xs = [value(r, n, dtype).double().numpy() for r in range(SIZE)]
    mine = value(RANK, n, dtype).to(CUDA)
    before = nccl_ran()
    references = {hvd.Sum: np.sum(xs, 0), hvd.Min: np.min(xs, 0), hvd.Max: np.max(xs, 0),
                  hvd.Product: np.prod(xs, 0)}
    for op, expected in references.items():
        got = hvd.allreduce(mine, op=op, name="ops.%s.%s" % (dtype, op))
        assert got.device == CUDA and got.dtype == dtype
        np.testing.assert_allclose(got.double().cpu().numpy(), expected, rtol=1e-2, err_msg=str(op))
    check_plane(before, len(references))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_scaled_average_folds_into_nccl(dtype):
    xs = [value(r, 512, dtype).double().numpy() for r in range(SIZE)]
    before = nccl_ran()
    got = hvd.allreduce(value(RANK, 512, dtype).to(CUDA), op=hvd.Average, prescale_factor=0.5,
                        postscale_factor=4.0, name="scaled.%s" % dtype)
    np.testing.assert_allclose(got.double().cpu().numpy(), np.mean(xs, 0) * 2.0, rtol=1e-2)
    check_plane(before, 1)


def test_fused_grouped_allreduce_in_place():
    tensors = [value(RANK, 100 + i, torch.float32).to(CUDA) for i in range(8)]
    expected = [sum(value(r, 100 + i, torch.float32).numpy() for r in range(SIZE)) for i in range(8)]
    before = nccl_ran()
    hvd.grouped_allreduce_(tensors, op=hvd.Sum, name="grouped")
    for got, want in zip(tensors, expected):
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    ran = nccl_ran() - before                   # one NCCL group per fused batch
    assert (1 <= ran <= 8) if EXPECT == "nccl" else ran == 0, ran


def test_broadcast_and_even_reducescatter():
    x = torch.full((SIZE * 4, 3), float(RANK), device=CUDA)
    before = nccl_ran()
    got = hvd.broadcast(x, SIZE - 1, name="bcast")
    assert torch.equal(got, torch.full_like(x, float(SIZE - 1)))
    rows = hvd.reducescatter(torch.ones(SIZE * 4, 3, device=CUDA), op=hvd.Sum, name="rs")
    assert torch.equal(rows, torch.full((4, 3), float(SIZE), device=CUDA))
    check_plane(before, 2)


def test_allgather_and_alltoall_stay_staged_but_right():
    x = torch.full((2, 3), float(RANK), device=CUDA)
    before = nccl_ran()
    gathered = hvd.allgather(x, name="ag")
    assert torch.equal(gathered.cpu(), torch.cat([torch.full((2, 3), float(r)) for r in range(SIZE)]))
    assert nccl_ran() == before


def test_a_desync_on_cuda_tensors_is_a_deadlock_on_every_rank_and_the_engine_goes_on():
    """Deadlock detection runs in negotiation, before any plane: NCCL underneath changes
    nothing (allreduce on rank 0, allgather on the others)."""
    if SIZE < 2:
        pytest.skip("needs two ranks to disagree")
    x = torch.ones(4, device=CUDA)
    with pytest.raises(hvd.HvliteDeadlockError) as raised:
        if RANK == 0:
            hvd.allreduce(x, name="desync.a")
        else:
            hvd.allgather(x, name="desync.b")
    assert "collective deadlock" in str(raised.value), str(raised.value)
    before = nccl_ran()
    got = hvd.allreduce(torch.ones(4, device=CUDA), op=hvd.Sum, name="after.desync")
    assert torch.equal(got, torch.full((4,), float(SIZE), device=CUDA))
    check_plane(before, 1)
