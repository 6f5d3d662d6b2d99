"""What hvlite.torch does around CUDA streams and graphs (hvlite/torch/tensors.py), checked without a
GPU: torch's CUDA answers are given here. On a GPU, tests/gpu/test_cuda_only.py and
test_nccl_plane.py do the same for real.

What it shows:
- a collective of CUDA tensors inside a CUDA graph capture is refused before anything is
  recorded or submitted (_refuse_capture): its ready event would be recorded into the capture,
  and the engine's stream, waiting on it from outside the graph, would join and invalidate it;
  the capture checked is the tensor's device's;
- a GPU result adopted on an external stream (torch.cuda.ExternalStream, whose maker may destroy
  it) is copied into torch's memory on that stream, and the engine's memory freed behind the
  copy while the stream surely lives; on torch's own streams it is adopted as it is and freed
  later on that stream (_adopt_device, _is_external);
- a GPU result still held at interpreter exit is not freed then (it goes with its context)."""
import contextlib
import sys
import types

import pytest
import torch

from hvlite import buffers
from hvlite.errors import HvliteNotSupportedError
from hvlite.torch import tensors


@pytest.fixture
def cuda(monkeypatch):
    """torch.cuda's answers: the current device 0, capturing or not per device."""
    state = {"capturing": set(), "device": 0, "entered": []}

    @contextlib.contextmanager
    def device(d):
        state["entered"].append(d.index)
        before, state["device"] = state["device"], d.index
        try:
            yield
        finally:
            state["device"] = before
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["device"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["device"] in state["capturing"])
    monkeypatch.setattr(torch.cuda, "device", device)
    return state


def cuda_tensor(index):
    return types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", index))


@pytest.mark.parametrize("index", [0, 1])
def test_a_cuda_collective_inside_a_graph_capture_is_refused_saying_why(cuda, index):
    cuda["capturing"].add(index)
    with pytest.raises(HvliteNotSupportedError, match="cannot be captured in a CUDA graph") as raised:
        tensors._source(cuda_tensor(index))          # before anything is recorded: nothing else is asked
    assert "cuda:%d" % index in str(raised.value) and "outside torch.cuda.graph" in str(raised.value)
    assert cuda["entered"] == ([] if index == 0 else [1])     # the tensor's device, not the current one


def test_a_capture_on_another_device_does_not_refuse(cuda):
    cuda["capturing"].add(1)
    assert tensors._refuse_capture(torch.device("cuda", 0)) is None
    assert cuda["entered"] == []


def test_cpu_tensors_ask_nothing_of_cuda(cuda):
    cuda["capturing"].add(0)
    source = tensors._source(torch.ones(3))
    assert source.memory == tensors.buffers.HOST_MEMORY and cuda["entered"] == []


@pytest.mark.parametrize("stream_id, external", [(0, False), (0x21, False), (0x7F3A_1C00_0E00, True), (None, True)])
def test_external_streams_are_told_from_torchs_own(stream_id, external):
    assert tensors._is_external(types.SimpleNamespace(stream_id=stream_id)) == external


class Buffer:
    """A DeviceBuffer's stand-in (its free is the test's)."""
    address = 0x7000
    stream = None

    def free(self):
        raise AssertionError("replaced by the test")


@pytest.mark.parametrize("external", [False, True])
def test_a_gpu_result_on_an_external_stream_is_copied_and_its_memory_freed_behind_the_copy(monkeypatch, external):
    stream = types.SimpleNamespace(stream_id=0x7F00_0000_1000 if external else 0x13, cuda_stream=0x5151)
    order = []

    class Adopted:
        def clone(self):
            order.append("clone")
            return "copy"
    buffer = Buffer()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: stream)
    monkeypatch.setattr(torch, "as_tensor", lambda result, device: order.append("adopt") or Adopted())
    monkeypatch.setattr(Buffer, "free", lambda self: order.append("free on %#x" % self.stream))
    got = tensors._adopt_device(buffer, 64, torch.device("cuda", 0))
    assert buffer.stream == 0x5151                   # freed on the caller's stream
    if external:
        assert got == "copy" and order == ["adopt", "clone", "free on 0x5151"]
    else:
        assert isinstance(got, Adopted) and order == ["adopt"]     # freed when torch frees it


def test_a_gpu_result_held_at_exit_is_not_freed_then(monkeypatch):
    calls = []
    monkeypatch.setattr(buffers, "lib", types.SimpleNamespace(hvl_device_buffer_free=lambda *a: calls.append(a)))
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    held = buffers.DeviceBuffer(buffers.ffi.cast("void *", 0x7000), 0)
    held.free()
    assert calls == [] and held.data == buffers.ffi.NULL
    monkeypatch.setattr(sys, "is_finalizing", lambda: False)
    live = buffers.DeviceBuffer(buffers.ffi.cast("void *", 0x8000), 0)
    live.free()
    assert len(calls) == 1
