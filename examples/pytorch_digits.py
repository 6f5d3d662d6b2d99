"""Train a small CNN on scikit-learn's bundled digits (8x8 images, no download) with hvlite.

    hvlrun -np 2 python examples/pytorch_digits.py [--epochs 15] [--batch-size 32] [--lr 0.05]

A Horovod script with only the import changed: each rank trains on its shard of the training
set, gradients are averaged by DistributedOptimizer, rank 0's initial weights and optimizer
state are broadcast at the start, and test metrics are averaged over the ranks.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvlite.torch as hvd


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 2 * 2, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())   # different on purpose: broadcast fixes it
    torch.set_num_threads(1)
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=args.seed)
    # each rank keeps its shard of the training and test sets
    shard = slice(hvd.rank(), None, hvd.size())
    x_train, y_train = torch.from_numpy(x_train[shard]), torch.from_numpy(y_train[shard])
    x_test, y_test = torch.from_numpy(x_test[shard]), torch.from_numpy(y_test[shard])

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    steps = len(x_train) // args.batch_size     # the same on every rank: the fewest
    steps = int(hvd.allreduce(torch.tensor(steps), op=hvd.Min, name="steps"))
    for epoch in range(args.epochs):
        model.train()
        generator = torch.Generator().manual_seed(epoch + hvd.rank())
        order = torch.randperm(len(x_train), generator=generator)
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            test_loss = metric_average(F.cross_entropy(logits, y_test).item(), "test_loss")
            correct = (logits.argmax(1) == y_test).float().mean().item()
            accuracy = metric_average(correct, "test_accuracy")
        if hvd.rank() == 0:
            print("epoch %2d  train loss %.4f  test loss %.4f  test accuracy %.2f%%"
                  % (epoch + 1, loss.item(), test_loss, 100 * accuracy), flush=True)
    if hvd.rank() == 0:
        print("final test accuracy %.2f%% on %d ranks" % (100 * accuracy, hvd.size()))


if __name__ == "__main__":
    main()
