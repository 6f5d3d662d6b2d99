"""A small hvlite job for the Slurm tests: every rank allreduces and allgathers, checks the
results against NumPy, and prints ``slurm OK rank R of N host H cross_size C``."""
import socket

import numpy as np

import hvlite as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(np.arange(1 << 18, dtype=np.float64) + rank, op=hvd.Sum, name="slurm.sum")
expected = (np.arange(1 << 18, dtype=np.float64) * size + size * (size - 1) / 2)
assert np.array_equal(total, expected), "allreduce differs on rank %d" % rank
ranks = hvd.allgather(np.array([rank], np.int32), name="slurm.ranks")
assert ranks.tolist() == list(range(size)), ranks
print("slurm OK rank %d of %d host %s cross_size %d" % (rank, size, socket.gethostname(),
                                                        hvd.cross_size()), flush=True)
hvd.shutdown()
