"""Scenario: rank 1 dies by SIGKILL while the others wait in an allreduce it will never join.
The job must end non-zero in bounded time and say which rank died."""
import os
import signal
import time

import numpy as np

import hvlite as hvd

hvd.init()
hvd.allreduce(np.ones(3), name="before")
if hvd.rank() == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
hvd.allreduce(np.ones(3), name="never.completes")
print("unreachable on rank", hvd.rank(), flush=True)
