"""Scenario: the last rank submits tensor 'lonely' late, twice. The first time the tensor is new
(it waits in rank 0's table); the second time it is in the response cache (it waits on the
bit-vector path, then moves to rank 0 after a second). With HVLITE_STALL_CHECK_TIME_SECONDS=1,
rank 0 must warn both times, naming the tensor and the missing rank; then it completes."""
import time

import numpy as np

import hvlite as hvd

hvd.init()
late = hvd.size() - 1
for round_ in range(2):
    if hvd.rank() == late:
        time.sleep(3.0)
    result = hvd.allreduce(np.ones(4, np.float32), name="lonely", op=hvd.Sum)
    assert (result == hvd.size()).all()
print("stall scenario done on rank", hvd.rank(), flush=True)
