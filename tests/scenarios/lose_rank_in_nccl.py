"""Scenario (GPU, tests/test_gpu.py): two ranks on the one GPU, each with its own NCCL_HOSTID so
NCCL runs them; rank 1 is lost (argv[1]: SIGKILL or SIGSTOP, sent to itself from a timer thread)
while both are inside one NCCL allreduce of 256 MiB (about 150 ms over NCCL's sockets on
loopback). The other rank must end within the peer timeout, naming rank 1."""
import os
import signal
import sys
import threading

import torch

import hvlite
import hvlite.torch as hvd

hvd.init()
os.environ["NCCL_HOSTID"] = "hvlite-scenario-rank-%d" % hvd.rank()
os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
x = torch.ones(64 << 20, device="cuda")
hvd.allreduce(x, name="before")                      # the communicator exists after this
assert hvlite.engine_counters()["nccl_collectives"] == 1, "NCCL did not run the first allreduce"
if hvd.rank() == 1:
    lost = getattr(signal, sys.argv[1])
    threading.Timer(0.03, os.kill, (os.getpid(), lost)).start()
for step in range(20):
    hvd.allreduce(x, name="during.%d" % step)
print("unreachable on rank", hvd.rank(), flush=True)
