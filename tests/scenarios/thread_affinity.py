"""Scenario: under HVLITE_THREAD_AFFINITY (hvlrun --thread-affinity), each rank prints the cores
of its engine thread (the one named hvlite-engine) and of its main thread, after a collective
whose result it checks."""
import os

import numpy as np

import hvlite as hvd

hvd.init()
result = hvd.allreduce(np.arange(4, dtype=np.float32), op=hvd.Sum)
assert (result == np.arange(4) * hvd.size()).all(), result


def name_of(thread):
    """The thread's name, or None once it has ended (a helper may end while it is listed)."""
    try:
        with open("/proc/self/task/%s/comm" % thread) as f:
            return f.read().strip()
    except OSError:
        return None


engine = [int(t) for t in os.listdir("/proc/self/task") if name_of(t) == "hvlite-engine"]
assert len(engine) == 1, engine
print("local rank %d: engine thread on cores %s, main thread on cores %s"
      % (hvd.local_rank(), sorted(os.sched_getaffinity(engine[0])),
         sorted(os.sched_getaffinity(0))), flush=True)
