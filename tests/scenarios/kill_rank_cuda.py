"""Scenario (GPU): rank 1 dies by SIGKILL while the others are inside a staged allreduce of a
64 MiB CUDA tensor that it will never join. The job must end non-zero in bounded time and say
which rank died (tests/test_gpu.py)."""
import os
import signal
import time

import torch

import hvlite.torch as hvd

hvd.init()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
x = torch.ones(16 << 20, device="cuda")
hvd.allreduce(x, name="before")
if hvd.rank() == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
hvd.allreduce(x, name="never.completes")
print("unreachable on rank", hvd.rank(), flush=True)
