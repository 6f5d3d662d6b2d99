"""Train a small network on scikit-learn's bundled digits with hvlite on Spark (Horovod's
horovod.spark.run API): one Spark task per rank, the results back in rank order.

    python examples/spark_pytorch.py [--master local[2]] [--ranks 2] [--epochs 5]

--master may name a standalone cluster (spark://host:7077); every executor needs this Python
environment, hvlite included, at the same path. Spark needs Java 17 or later.
"""
import argparse
import sys

from pyspark.sql import SparkSession

import hvlite.spark


def train(epochs, lr, batch_size=32):
    """A Horovod training function, unchanged: every rank runs it in its own process."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    import hvlite.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))[hvd.rank()::hvd.size()]
    y = torch.from_numpy(digits.target)[hvd.rank()::hvd.size()]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = int(hvd.allreduce(torch.tensor(len(x) // batch_size), op=hvd.Min))
    for epoch in range(epochs):
        order = torch.randperm(len(x))
        for s in range(steps):
            idx = order[s * batch_size:(s + 1) * batch_size]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
        average = hvd.allreduce(loss.detach(), name="loss").item()
        if hvd.rank() == 0:
            print("epoch %d: loss %.4f" % (epoch + 1, average), flush=True)
    return hvd.rank(), average


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    # the executors run this Python (hvlite's ranks run the driver's: they must be the same)
    spark = (SparkSession.builder.master(args.master).appName("hvlite-example")
             .config("spark.pyspark.python", sys.executable).getOrCreate())
    try:
        results = hvlite.spark.run(train, args=(args.epochs, args.lr), num_proc=args.ranks)
        print("results by rank: %s" % results)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
