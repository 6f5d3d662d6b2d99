"""Scenario: conditions that repeat must be logged once per process. mpi4py initialises MPI, so
hvlite can be started and stopped three times; the environment holds an unknown HVLITE_*
setting and a bad value (warned at every init unless remembered). Then a DistributedOptimizer
calls step() after synchronize() in every one of five steps (a Python warning each time unless
remembered: the filter is "always", as under pytest or -W always, so Python's own once-per-line
registry does not hide repeats). Every result is checked; the driver counts the lines."""
import warnings

import numpy as np
from mpi4py import MPI  # noqa: F401  (MPI initialised first: hvlite may init again)

import hvlite as hvd

warnings.simplefilter("always")
for round_ in range(3):
    hvd.init()
    got = hvd.allreduce(np.full(3, hvd.rank(), np.float64), name="log.%d" % round_, op=hvd.Sum)
    assert (got == sum(range(hvd.size()))).all()
    hvd.shutdown()

import torch  # noqa: E402

import hvlite.torch as thvd  # noqa: E402

thvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters())
thvd.broadcast_parameters(model.state_dict(), root_rank=0)
for step in range(5):
    opt.zero_grad()
    model(torch.ones(3, 4) * (thvd.rank() + 1)).sum().backward()
    opt.synchronize()
    opt.step()                           # reduces again: the condition the warning is about
weights = thvd.allgather(model.weight.detach().reshape(1, -1))
assert torch.equal(weights[0], weights[-1])
thvd.shutdown()
print("log scenario done", flush=True)
