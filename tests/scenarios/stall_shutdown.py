"""Scenario: rank 1 never submits 'lonely' (it waits in another tensor instead). With
HVLITE_STALL_SHUTDOWN_TIME_SECONDS=2 the stall becomes HvliteTimeoutError on every rank, naming
the tensor and the missing rank; the script exits 3 so the job ends non-zero."""
import sys
import time

import numpy as np

import hvlite as hvd

hvd.init()
rank = hvd.rank()          # the engine (and its topology) is gone after the stall error
start = time.monotonic()
try:
    if rank == 1:
        time.sleep(0.5)
        hvd.allreduce(np.ones(2), name="other")
    else:
        hvd.allreduce(np.ones(2), name="lonely")
    print("rank", rank, "UNEXPECTED: completed", flush=True)
except hvd.HvliteTimeoutError as e:
    print("rank %d stall error after %.1f s: %s" % (rank, time.monotonic() - start, e), flush=True)
    sys.exit(3)
