"""hvlite's quickstart: fit y = 3x + 1 on 2 ranks. Run: hvlrun -np 2 python examples/pytorch_quickstart.py"""
import torch
import hvlite.torch as hvd

hvd.init()
torch.manual_seed(hvd.rank())             # each rank: its own data and start
x = torch.randn(256, 1)
y = 3 * x + 1
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # rank 0's start
for step in range(100):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()                       # averages the gradients
    optimizer.step()
w, b = model.weight.item(), model.bias.item()
print("rank %d of %d: weight %.3f, bias %.3f" % (hvd.rank(), hvd.size(), w, b))
