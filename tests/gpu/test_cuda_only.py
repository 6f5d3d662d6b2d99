"""What only CUDA tensors have, on every rank of a job whose ranks may share one GPU: the memory
kind agreed across ranks, stream order, results on the input's device, join(device), Adasum on
the staged path, elastic state of a CUDA model. (Every collective x dtype x form on CUDA
tensors: tests/parallel/test_torch_ops.py and test_torch_training.py with
HVLITE_TEST_DEVICE=cuda, which tests/test_gpu.py also runs.)
SPMD: run by hvlrun, on a machine with a GPU."""
import os
import threading
import time

import pytest
import torch

import hvlite
import hvlite.torch as hvd
from adasum_reference import adasum, assert_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU here (torch.cuda.is_available() is False)")
RANK, SIZE = hvd.rank(), hvd.size()
CYCLE_S = float(os.environ.get("HVLITE_CYCLE_TIME", os.environ.get("HOROVOD_CYCLE_TIME", "1"))) / 1000
HOLDING = os.environ.get("HVLITE_GPU_READY_ONLY", "0") not in ("", "0")      # experimental, off by default
CUDA = torch.device("cuda", hvd.local_rank() % max(1, torch.cuda.device_count()))
if torch.cuda.is_available():
    torch.cuda.set_device(CUDA)


def test_host_and_cuda_tensors_of_one_name_fail_on_every_rank_naming_the_ranks():
    if SIZE < 2:
        pytest.skip("needs two ranks to disagree")
    x = torch.ones(8) if RANK == 0 else torch.ones(8, device=CUDA)
    with pytest.raises(hvd.MismatchError) as raised:
        hvd.allreduce(x, name="mixed.memory")
    others = ",".join(str(r) for r in range(1, SIZE))
    assert ("tensor 'mixed.memory': ranks disagree on the memory: host (CPU) memory on rank 0; "
            "CUDA (GPU) memory on rank%s %s" % ("s" if SIZE > 2 else "", others)) in str(raised.value)
    y = torch.full((8,), float(RANK), device=CUDA)          # the engine goes on
    assert torch.equal(hvd.allreduce(y, op=hvd.Sum, name="after.mismatch"),
                       torch.full((8,), float(sum(range(SIZE))), device=CUDA))


def test_a_tensor_still_being_written_on_a_side_stream_is_reduced_after_the_write():
    """The adapter records an event on the current stream at submit; the engine's copy waits for
    it on its own stream. Without that, the copy would read the tensor before the long kernel on
    the side stream wrote it."""
    side = torch.cuda.Stream()
    for trial in range(3):
        x = torch.zeros(1 << 20, device=CUDA)
        torch.cuda.synchronize()                      # test set-up only, not the engine's path
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)            # ~0.1 s of GPU time before the write
            x.fill_(RANK + 1)
            out = hvd.allreduce(x, op=hvd.Sum, name="stream.order.%d" % trial)
        side.synchronize()
        assert out.device == CUDA
        assert torch.all(out == SIZE * (SIZE + 1) / 2), (trial, out[:4])


@pytest.mark.skipif(not HOLDING, reason="holding is off (experimental: HVLITE_GPU_READY_ONLY=1 turns it on, "
                    "as tests/test_gpu.py's held runs do)")
def test_a_cuda_tensor_the_gpu_has_not_written_waits_out_of_negotiation_holding_nothing_up():
    """A CUDA tensor enters negotiation once the GPU has written it (csrc/core/ready.c). One
    submitted behind about a second of GPU work is held there (the counter says so), while a host
    allreduce submitted after it completes at once; then it is reduced after the write. Were it
    negotiated at once, its batch would wait on the GPU and the host allreduce behind it (the
    staged path and NCCL without HVLITE_NCCL_OVERLAP)."""
    held = hvlite.engine_counters()["tensors_held_for_gpu"]
    x = torch.zeros(1 << 16, device=CUDA)
    torch.cuda.synchronize()                          # test set-up only
    torch.cuda._sleep(2_000_000_000)                  # ~1 s of GPU time on the current stream
    x.fill_(RANK + 1)
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="held.for.gpu")
    start = time.monotonic()
    host = hvd.allreduce(torch.full((4,), float(RANK + 1)), op=hvd.Sum, name="held.host")
    host_s = time.monotonic() - start
    waiting = not hvd.poll(handle)
    out = hvd.synchronize(handle)
    total = SIZE * (SIZE + 1) / 2
    assert torch.all(host == total) and torch.all(out == total), (host, out[:4])
    assert hvlite.engine_counters()["tensors_held_for_gpu"] > held
    assert waiting and host_s < 0.5, ("the host allreduce waited for the GPU", host_s)


@pytest.mark.skipif(not HOLDING, reason="holding is off (experimental: HVLITE_GPU_READY_ONLY=1 turns it on, "
                    "as tests/test_gpu.py's held runs do)")
@pytest.mark.skipif(CYCLE_S < 0.3, reason="a cycle time of 300 ms or more tells a cycle's wait apart "
                    "(tests/test_gpu.py runs this with HVLITE_CYCLE_TIME=500)")
def test_a_held_tensor_is_negotiated_once_written_not_a_cycle_time_later():
    """Once the GPU has written every tensor held, the engine starts its next cycle at once
    (ready.c, hvl__ready_all_written): the time from the write to the result is far below the
    cycle time. Without that the held tensor would wait for the end of the cycle's wait."""
    hvd.allreduce(torch.ones(4, device=CUDA), name="held.warm-up")   # NCCL's communicator, buffers
    held = hvlite.engine_counters()["tensors_held_for_gpu"]
    delays = []
    for trial in range(3):
        x = torch.zeros(1 << 10, device=CUDA)
        hvd.barrier()
        torch.cuda.synchronize()                      # test set-up only
        torch.cuda._sleep(40_000_000)                 # ~20 ms of GPU time before the write
        x.fill_(RANK + 1)
        written, seen = torch.cuda.Event(), []
        written.record()
        watcher = threading.Thread(target=lambda: (written.synchronize(), seen.append(time.monotonic())))
        watcher.start()
        out = hvd.allreduce(x, op=hvd.Sum, name="held.once.written.%d" % trial)
        done = time.monotonic()
        watcher.join(timeout=60)
        assert torch.all(out == SIZE * (SIZE + 1) / 2), (trial, out[:4])
        delays.append(done - seen[0])
    assert hvlite.engine_counters()["tensors_held_for_gpu"] > held, "never held: nothing tested"
    assert max(delays) < CYCLE_S / 3, ("seconds from the write to the result", delays, CYCLE_S)


def test_an_op_without_data_never_overtakes_a_cuda_tensor_still_being_written():
    """A CUDA tensor submitted before a barrier is done once the barrier returns (held for the
    GPU, HVLITE_GPU_READY_ONLY=1, it is released when the barrier is submitted)."""
    x = torch.zeros(1 << 16, device=CUDA)
    torch.cuda.synchronize()                          # test set-up only
    torch.cuda._sleep(1_000_000_000)                  # ~0.5 s of GPU time on the current stream
    x.fill_(RANK + 1)
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="before.barrier")
    hvd.barrier()
    assert hvd.poll(handle), "the barrier overtook a tensor submitted before it"
    assert torch.all(hvd.synchronize(handle) == SIZE * (SIZE + 1) / 2)


def test_results_come_back_on_the_input_device_for_every_op():
    x = torch.arange(SIZE * 2, dtype=torch.float32, device=CUDA).reshape(SIZE, 2)
    results = [hvd.allreduce(x), hvd.allgather(x), hvd.broadcast(x, 0), hvd.alltoall(x),
               hvd.reducescatter(x), hvd.grouped_allreduce([x, x])[1],
               hvd.alltoall(x, splits=[1] * SIZE)[0]]
    assert all(r.device == CUDA for r in results), [r.device for r in results]
    assert torch.equal(results[1], torch.cat([x] * SIZE))


def test_join_with_a_device_and_uneven_cuda_work():
    for step in range(1 + RANK):
        hvd.allreduce(torch.ones(4, device=CUDA), name="uneven.%d" % step)
    assert hvd.join(hvd.local_rank() % torch.cuda.device_count()) == SIZE - 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
def test_adasum_on_cuda_tensors(dtype):
    if SIZE & (SIZE - 1):
        pytest.skip("Adasum needs a power-of-2 number of ranks")
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(33, generator=g).to(dtype) for _ in range(SIZE)]
    got = hvd.allreduce(xs[RANK].to(CUDA), op=hvd.Adasum, name="adasum.%s" % dtype)
    assert got.device == CUDA
    expected = adasum([x.double().numpy().astype(str(dtype).replace("torch.", "")) for x in xs],
                      str(dtype).replace("torch.", ""))
    assert_close(got.cpu().numpy(), expected, "Adasum %s" % dtype)


def test_elastic_state_of_a_cuda_model_syncs_from_rank_0():
    torch.manual_seed(RANK)                               # every rank starts different
    model = torch.nn.Linear(5, 3).to(CUDA)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 5, device=CUDA)).sum().backward()
    opt.step()
    state = hvd.elastic.TorchState(model, opt, step=RANK,
                                   best=torch.tensor(float(RANK), device=CUDA),
                                   history={"loss": [torch.full((2,), float(RANK), device=CUDA)]})
    state.sync()
    assert state.step == 0
    # plain tensor attributes come back where they were, with rank 0's values
    assert state.best.device == CUDA and state.best.item() == 0.0
    assert state.history["loss"][0].device == CUDA
    assert torch.equal(state.history["loss"][0].cpu(), torch.zeros(2))
    for p in model.parameters():
        assert p.device == CUDA
        rows = hvd.allgather(p.detach().reshape(1, -1), name="elastic.same")
        assert all(torch.equal(rows[0], row) for row in rows)
    state.commit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state.restore()
    same = [torch.equal(hvd.broadcast(p.detach(), 0, name="restored"), p.detach())
            for p in model.parameters()]        # every broadcast on every rank, then the check
    assert all(same)


def test_bfloat16_and_float16_on_the_device():
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.full((1000,), 0.5 * (RANK + 1), dtype=dtype, device=CUDA)
        got = hvd.allreduce(x, op=hvd.Sum, name="half.%s" % dtype)
        assert got.dtype == dtype and got.device == CUDA
        assert torch.allclose(got.float(), torch.full((1000,), 0.5 * SIZE * (SIZE + 1) / 2,
                                                      device=CUDA), rtol=1e-2)


@pytest.mark.parametrize("where", ["prescale", "postscale"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_scale_factors_on_16_bit_cuda_tensors_are_rounded_to_the_type_first(dtype, where):
    """As GPU kernels scale (Horovod's, NCCL's pre-multiplied sum): by the factor held in the
    tensors' own type, whichever path ran; Horovod's GPU tests expect that exactly."""
    x = torch.empty(17, 17).random_(-30, 30, generator=torch.Generator().manual_seed(7)).to(CUDA, dtype)
    factor = 0.3758                                 # not exact in 16 bits
    held = torch.tensor(factor, dtype=dtype).float().item()
    got = hvd.allreduce(x, op=hvd.Sum, name="scaled.%s.%s" % (dtype, where),
                        **{where + "_factor": factor})
    if where == "prescale":                         # every rank's x alike: SIZE times one product
        want = (x.float() * held).to(dtype).float() * SIZE
    else:
        want = x.float() * SIZE * held
    exact = SIZE & (SIZE - 1) == 0                  # sums of 2^k equal values round no further
    assert torch.allclose(got.float(), want.to(dtype).float(), rtol=0 if exact else 1e-2, atol=0), \
        (got[:4], want[:4])


def test_a_group_of_host_and_cuda_tensors_is_refused_before_anything_runs():
    tensors = [torch.ones(10) if i % 2 else torch.ones(10, device=CUDA) for i in range(5)]
    for group in (hvd.grouped_allreduce, hvd.grouped_allgather, hvd.grouped_reducescatter):
        with pytest.raises(hvd.HvliteInvalidArgument, match="one device"):
            group(tensors)
    assert hvd.allreduce(torch.ones(3, device=CUDA), op=hvd.Sum, name="after.group").sum().item() == 3 * SIZE


def test_alltoall_returns_the_received_splits_where_the_splits_were():
    x = torch.arange(SIZE * 2, dtype=torch.float32, device=CUDA)
    for splits in (torch.full((SIZE,), 2, dtype=torch.int32, device=CUDA), [2] * SIZE):
        got, received = hvd.alltoall(x, splits)
        assert received.device == (CUDA if isinstance(splits, torch.Tensor) else torch.device("cpu"))
        assert received.tolist() == [2] * SIZE and got.device == CUDA


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
def test_a_set_of_one_rank_gives_every_element_back(dtype):
    """Sets of one rank each (Horovod's broadcast-gradient test with even and odd sets), with
    odd sizes, averaged and broadcast, out of place, as autograd drives them."""
    sets = [hvd.add_process_set([r]) for r in range(SIZE)] if SIZE > 1 else [hvd.global_process_set]
    own = sets[RANK]
    try:
        for n in (17, 17 * 17, 17 ** 3):
            x = torch.full((n,), float(RANK + 1), dtype=dtype, device=CUDA, requires_grad=True)
            y = hvd.broadcast(x, RANK, process_set=own)
            y.backward(torch.ones(n, dtype=dtype, device=CUDA))
            grad = x.grad.cpu()
            assert torch.equal(y.detach().cpu(), torch.full((n,), float(RANK + 1), dtype=dtype)), n
            bad = (grad != 1).nonzero().flatten().tolist()
            assert not bad, "n=%d: elements %s of the gradient are %s" % (n, bad[:8], grad[bad[:8]].tolist())
            avg = hvd.allreduce(torch.ones(n, dtype=dtype, device=CUDA), op=hvd.Average, process_set=own)
            assert torch.equal(avg.cpu(), torch.ones(n, dtype=dtype)), n
    finally:
        for one in sets if SIZE > 1 else []:
            hvd.remove_process_set(one)


def test_a_collective_inside_a_cuda_graph_capture_is_refused_and_the_capture_survives():
    """Its ready event would be recorded into the capture and the engine's stream would join it:
    refused at submit, before anything is recorded, so the capture goes on and replays."""
    x = torch.ones(16, device=CUDA)
    static = torch.ones(16, device=CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.mul_(2)
        with pytest.raises(hvd.HvliteNotSupportedError, match="cannot be captured in a CUDA graph"):
            hvd.allreduce(x, name="captured")
    graph.replay()
    graph.replay()
    assert torch.all(static == 4), static[:4]
    assert hvd.allreduce(x, op=hvd.Sum, name="after.capture").sum().item() == 16 * SIZE


def test_a_thread_local_capture_beside_the_engine_survives_its_allocations():
    """A capture in the default (global) mode prohibits unsafe CUDA calls on every thread, the
    engine's allocations among them, which then invalidate it; one in thread_local mode is not
    disturbed: this thread captures while the main thread's collectives make the engine allocate
    (a larger batch than any before: new staging or fusion memory)."""
    static = torch.ones(1 << 10, device=CUDA)
    graph, errors, started, done = torch.cuda.CUDAGraph(), [], threading.Event(), threading.Event()

    def capture():
        try:
            torch.cuda.set_device(CUDA)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for _ in range(200):
                    static.add_(1)
                started.set()
                done.wait(120)                        # open while the engine works
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            started.set()
    thread = threading.Thread(target=capture)
    thread.start()
    try:
        assert started.wait(60)
        big = torch.full((64 << 20,), float(RANK + 1), device=CUDA)
        got = hvd.allreduce(big, op=hvd.Sum, name="beside.capture")
    finally:
        done.set()
        thread.join(60)
    assert not errors, errors
    assert torch.all(got == SIZE * (SIZE + 1) / 2)
    graph.replay()
    torch.cuda.current_stream().synchronize()        # test check only
    assert torch.all(static == 201), static[:4]
