"""hvlite.torch refuses a collective of CUDA tensors inside a CUDA graph capture, before anything
is recorded or submitted (hvlite/torch/ops.py, _refuse_capture): the ready event would be
recorded into the capture and the engine's stream, waiting on it from outside the graph, would
join the capture, which then fails, and the engine's work with it. Without a GPU the CUDA calls
the check makes are answered here; on a GPU, tests/gpu/test_cuda_only.py captures for real."""
import contextlib
import types

import pytest
import torch

from hvlite.errors import HvliteNotSupportedError
from hvlite.torch import ops


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
        ops._source(cuda_tensor(index))          # before anything is recorded: nothing else is asked
    assert "cuda:%d" % index in str(raised.value) and "outside torch.cuda.graph" in str(raised.value)
    assert cuda["entered"] == ([] if index == 0 else [1])     # the tensor's device, not the current one


def test_a_capture_on_another_device_does_not_refuse(cuda):
    cuda["capturing"].add(1)
    assert ops._refuse_capture(torch.device("cuda", 0)) is None
    assert cuda["entered"] == []


def test_cpu_tensors_ask_nothing_of_cuda(cuda):
    cuda["capturing"].add(0)
    source = ops._source(torch.ones(3))
    assert source.memory == ops.buffers.HOST_MEMORY and cuda["entered"] == []
