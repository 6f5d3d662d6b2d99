"""Scenario: mpi4py initialises MPI first; hvlite reuses it, both work side by side, and MPI
stays usable after hvlite.shutdown() (hvlite finalizes only an MPI it initialised)."""
from mpi4py import MPI

import numpy as np

import hvlite as hvd

comm = MPI.COMM_WORLD
hvd.init()
assert hvd.rank() == comm.rank and hvd.size() == comm.size
ours = hvd.allreduce(np.arange(4.0) * (hvd.rank() + 1), op=hvd.Sum)
theirs = np.empty(4)
comm.Allreduce(np.arange(4.0) * (comm.rank + 1), theirs)
assert np.array_equal(ours, theirs), (ours, theirs)
hvd.shutdown()
assert comm.allreduce(1) == comm.size   # MPI still alive: mpi4py owns it
print("mpi4py scenario OK on rank", comm.rank, flush=True)
