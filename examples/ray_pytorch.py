"""Train a small network on scikit-learn's bundled digits with hvlite on Ray (Horovod's
RayExecutor API): one stateful Trainer per worker, built once, called once per epoch.

    python examples/ray_pytorch.py [--address auto] [--workers 2] [--epochs 5]

Without --address it starts a local Ray instance (--workers CPUs). With --address it joins a
running cluster (every node needs this Python environment, hvlite included, at the same path).
"""
import argparse

import ray

from hvlite.ray import RayExecutor


class Trainer:
    """One rank: joins the world once, keeps its model and data shard between calls."""

    def __init__(self, lr):
        import numpy as np
        import torch
        from sklearn.datasets import load_digits
        import hvlite.torch as hvd
        hvd.init()
        torch.manual_seed(0)
        torch.set_num_threads(1)
        digits = load_digits()
        x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
        y = torch.from_numpy(digits.target)
        self.x, self.y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 10))
        self.optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=lr * hvd.size(), momentum=0.9),
            named_parameters=self.model.named_parameters())
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.hvd, self.torch = hvd, torch

    def epoch(self, batch_size=32):
        """One pass over this rank's shard; the loss averaged over every rank."""
        torch, hvd = self.torch, self.hvd
        order = torch.randperm(len(self.x))
        steps = int(hvd.allreduce(torch.tensor(len(self.x) // batch_size), op=hvd.Min))
        for s in range(steps):
            idx = order[s * batch_size:(s + 1) * batch_size]
            self.optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
            loss.backward()
            self.optimizer.step()
        return hvd.rank(), hvd.allreduce(loss.detach(), name="loss").item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", help="a running Ray cluster (default: a local instance)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.workers, include_dashboard=False)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=args.workers)
    executor.start(executable_cls=Trainer, executable_kwargs={"lr": args.lr})
    try:
        for epoch in range(args.epochs):
            results = executor.execute(lambda trainer: trainer.epoch())
            print("epoch %d: loss %.4f (ranks %s)"
                  % (epoch + 1, results[0][1], [rank for rank, _ in results]), flush=True)
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
