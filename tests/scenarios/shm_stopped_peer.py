"""Scenario: rank 1 is stopped (SIGSTOP) in the middle of a large allreduce on the shared-memory
backend, so rank 0 waits on its futex word for an arrival that never comes. With
HVLITE_PEER_TIMEOUT_SECONDS=2 rank 0 gets HvliteTimeoutError naming rank 1 within seconds; it
wakes rank 1 (SIGCONT, so hvlrun's SIGTERM can end it at once) and exits 3."""
import os
import signal
import sys
import threading
import time

import numpy as np

import hvlite as hvd

hvd.init()
rank = hvd.rank()
pids = hvd.allgather_object(os.getpid())
big = np.ones(32 << 20, np.float32)            # 128 MiB: ~100 ms per allreduce on 2 cores
if rank == 1:
    def stop_in_third_allreduce():
        while hvd.engine_counters()["shm_collectives"] < 3:
            time.sleep(0.001)
        time.sleep(0.01)                       # well inside its data plane
        os.kill(os.getpid(), signal.SIGSTOP)
    threading.Thread(target=stop_in_third_allreduce, daemon=True).start()
start = time.monotonic()
try:
    for _ in range(100):
        hvd.allreduce_(big, op=hvd.Sum, name="big")
    print("rank", rank, "UNEXPECTED: completed", flush=True)
except hvd.HvliteTimeoutError as e:
    print("rank %d timeout after %.1f s: %s" % (rank, time.monotonic() - start, e), flush=True)
    os.kill(pids[1], signal.SIGCONT)
    sys.exit(3)
