"""Scenario: rank 1 dies by SIGKILL in the middle of large allreduces on the shared-memory
backend. The job must end non-zero in bounded time and leave no segment in /dev/shm. Each rank
prints its pid first: segment names carry the creating rank's pid."""
import os
import signal
import threading
import time

import numpy as np

import hvlite as hvd
import job_files

hvd.init()
print("pid of rank %d: %d" % (hvd.rank(), os.getpid()), flush=True)
big = np.ones(32 << 20, np.float32)            # 128 MiB: ~100 ms per allreduce on 2 cores
hvd.allreduce_(big, op=hvd.Sum, name="first")
job_files.report(hvd.rank())
assert hvd.engine_counters()["shm_collectives"] == 1, hvd.engine_counters()
if hvd.rank() == 1:
    def die():
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=die, daemon=True).start()
for _ in range(200):
    hvd.allreduce_(big, op=hvd.Sum, name="big")
print("unreachable on rank", hvd.rank(), flush=True)
