"""Train a small network on scikit-learn's bundled digits with Ray Train and hvlite
(``HvliteTrainer``, where Ray's ``HorovodTrainer`` was): each epoch reports its loss and a
checkpoint to Ray Train.

    python examples/ray_train_pytorch.py [--address auto] [--workers 2] [--epochs 5]

Without --address it starts a local Ray instance (--workers CPUs). With --address it joins a
running cluster (every node needs this Python environment, hvlite and ``ray[train]`` included,
at the same path, and ``--storage`` a directory every node reaches).
"""
import argparse
import os
import tempfile

import ray
import ray.train

from hvlite.ray import HvliteTrainer


def train_loop(config):
    """One rank: Horovod's usual loop; Ray Train gets the loss and a checkpoint per epoch."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    import hvlite.torch as hvd

    hvd.init()                                   # joins the world of every Ray Train worker
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))[hvd.rank()::hvd.size()]
    y = torch.from_numpy(digits.target)[hvd.rank()::hvd.size()]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=config["lr"] * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = int(hvd.allreduce(torch.tensor(len(x) // 32), op=hvd.Min))
    for epoch in range(config["epochs"]):
        order = torch.randperm(len(x))
        for s in range(steps):
            idx = order[s * 32:(s + 1) * 32]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
        loss = hvd.allreduce(loss.detach(), name="loss").item()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if hvd.rank() == 0:
                torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"epoch": epoch + 1, "loss": loss}, checkpoint=checkpoint)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", help="a running Ray cluster (default: a local instance)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--storage", default=os.path.join(tempfile.gettempdir(), "ray_results"))
    args = p.parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.workers, include_dashboard=False)
    trainer = HvliteTrainer(
        train_loop, train_loop_config={"lr": args.lr, "epochs": args.epochs},
        scaling_config=ray.train.ScalingConfig(num_workers=args.workers),
        run_config=ray.train.RunConfig(storage_path=args.storage))
    result = trainer.fit()
    print("epoch %d: loss %.4f; checkpoint in %s"
          % (result.metrics["epoch"], result.metrics["loss"], result.checkpoint.path), flush=True)


if __name__ == "__main__":
    main()
