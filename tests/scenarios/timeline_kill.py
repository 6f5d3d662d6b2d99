"""Scenario: rank 1 dies by SIGKILL while recording a timeline. Every rank first runs two steps
of the known workload (tests/timeline_trace.py); then the others submit three more allreduces
("tl.last.*") that can never complete, and rank 1 kills itself a second later (long enough for
rank 0's writer, which writes every 50 ms, to have the submissions on disk). The launcher then
ends the job (the survivors are terminated mid-run). Rank 0 prints what it submitted."""
import json
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import timeline_trace  # noqa: E402

import hvlite as hvd  # noqa: E402

hvd.init()
names = timeline_trace.run_workload(hvd, 2)
if hvd.rank() == 0:
    print("SUBMITTED " + json.dumps(names), flush=True)
if hvd.rank() == 1:
    time.sleep(1.0 * float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1")))
    os.kill(os.getpid(), signal.SIGKILL)
handles = [hvd.allreduce_async(np.ones(10), name="tl.last.%d" % i) for i in range(3)]
if hvd.rank() == 0:
    print("PENDING " + json.dumps(["tl.last.%d" % i for i in range(3)]), flush=True)
for h in handles:
    hvd.synchronize(h)
print("unreachable on rank", hvd.rank(), flush=True)
