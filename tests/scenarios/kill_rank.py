"""Scenario: rank 1 dies by SIGKILL while the others wait in an allreduce it will never join.
The job must end non-zero in bounded time and say which rank died. With --wait-for-signal every
rank waits instead (the test signals hvlrun). Each rank prints its shared-memory files."""
import os
import signal
import sys
import time

import numpy as np

import hvlite as hvd
import job_files

hvd.init()
hvd.allreduce(np.ones(3), name="before")
job_files.report(hvd.rank())
if "--wait-for-signal" in sys.argv:
    time.sleep(120)
if hvd.rank() == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
hvd.allreduce(np.ones(3), name="never.completes")
print("unreachable on rank", hvd.rank(), flush=True)
