"""Scenario: the last rank submits tensor 'lonely' late. With HVLITE_STALL_CHECK_TIME_SECONDS=1,
rank 0 must warn naming the tensor and the missing rank; then the tensor completes."""
import time

import numpy as np

import hvlite as hvd

hvd.init()
late = hvd.size() - 1
if hvd.rank() == late:
    time.sleep(3.0)
result = hvd.allreduce(np.ones(4, np.float32), name="lonely", op=hvd.Sum)
assert (result == hvd.size()).all()
print("stall scenario done on rank", hvd.rank(), flush=True)
