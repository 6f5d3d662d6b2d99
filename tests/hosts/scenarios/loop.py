"""Allreduces until the job is ended from outside (tests/hosts failure tests): 8 MiB each, with a
short sleep between, so a cut link or a killed host finds the ranks inside or between MPI calls.
Prints ``looping R`` once the first few went through; gives up after 10 minutes."""
import time

import numpy as np

import hvlite as hvd

hvd.init()
x = np.ones(2 << 20, np.float32)
deadline = time.monotonic() + 600
i = 0
while time.monotonic() < deadline:
    y = hvd.allreduce(x, op=hvd.Sum, name="loop")
    assert y[0] == hvd.size(), y[0]
    i += 1
    if i == 3:
        print("looping %d" % hvd.rank(), flush=True)
    time.sleep(0.05)
