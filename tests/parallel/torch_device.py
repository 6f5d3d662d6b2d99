"""The device the torch SPMD tests put their tensors on: the CPU, or, with
HVLITE_TEST_DEVICE=cuda (``make test-gpu``), this rank's CUDA device (local rank modulo the
devices there are; ranks share a GPU on a machine with fewer GPUs than ranks). The same test
bodies then check every collective, optimizer and layer on CUDA tensors against the same
references, with results expected on the input's device."""
import os

import torch

import hvlite.torch as hvd


def _device():
    name = os.environ.get("HVLITE_TEST_DEVICE", "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda":
        raise ValueError("HVLITE_TEST_DEVICE=%r: use cpu or cuda" % name)
    if not torch.cuda.is_available():
        raise RuntimeError("HVLITE_TEST_DEVICE=cuda, but torch sees no CUDA device")
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


DEVICE = _device()
