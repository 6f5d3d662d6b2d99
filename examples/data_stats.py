"""Distributed statistics of a data set with hvlite, checked against one process.

Each rank reads its shard of the rows (rows rank, rank+size, ...) of a table, and the ranks
combine per-column count, mean, variance (two passes: global mean first, then the sum of squared
deviations), min, max and a 10-bin histogram with allreduce. Rank 0 then recomputes everything
from the whole table with NumPy and reports whether the answers agree.

    hvlrun -np 2 python examples/data_stats.py                 # seeded synthetic table
    hvlrun -np 2 python examples/data_stats.py --csv data.csv  # numeric CSV with a header row
"""
import argparse

import numpy as np

import hvlite as hvd


def load_table(args):
    if args.csv:
        return np.genfromtxt(args.csv, delimiter=",", skip_header=1, dtype=np.float64)
    rng = np.random.default_rng(args.seed)
    scales = np.array([1.0, 10.0, 0.1, 1000.0])
    return rng.normal(loc=[0, 5, -2, 100], scale=scales, size=(args.rows, 4))


def distributed_stats(shard, lo, hi, bins=10):
    count = hvd.allreduce(np.array([shard.shape[0]], np.int64), op=hvd.Sum, name="count")[0]
    mean = hvd.allreduce(shard.sum(axis=0), op=hvd.Sum, name="sum") / count
    var = hvd.allreduce(((shard - mean) ** 2).sum(axis=0), op=hvd.Sum, name="sqdev") / count
    cmin = hvd.allreduce(shard.min(axis=0, initial=np.inf), op=hvd.Min, name="min")
    cmax = hvd.allreduce(shard.max(axis=0, initial=-np.inf), op=hvd.Max, name="max")
    hist = np.stack([np.histogram(shard[:, c], bins=bins, range=(lo[c], hi[c]))[0]
                     for c in range(shard.shape[1])]).astype(np.int64)
    hist = hvd.allreduce(hist, op=hvd.Sum, name="histogram")
    return count, mean, var, cmin, cmax, hist


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", help="numeric CSV file with one header row")
    p.add_argument("--rows", type=int, default=100_000, help="rows of the synthetic table")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    hvd.init()
    table = load_table(args)            # every rank can read the file; each keeps its shard
    shard = table[hvd.rank()::hvd.size()]
    lo, hi = table.min(axis=0), table.max(axis=0)   # histogram range known to all (e.g. metadata)
    count, mean, var, cmin, cmax, hist = distributed_stats(shard, lo, hi)

    if hvd.rank() == 0:
        print("%d ranks, %d rows, %d columns" % (hvd.size(), count, table.shape[1]))
        for c in range(table.shape[1]):
            print("column %d: mean %12.6f  std %12.6f  min %12.6f  max %12.6f"
                  % (c, mean[c], np.sqrt(var[c]), cmin[c], cmax[c]))
        ref_hist = np.stack([np.histogram(table[:, c], bins=10, range=(lo[c], hi[c]))[0]
                             for c in range(table.shape[1])])
        same = (count == table.shape[0] and np.allclose(mean, table.mean(axis=0), rtol=1e-12)
                and np.allclose(var, table.var(axis=0), rtol=1e-10)
                and np.array_equal(cmin, table.min(axis=0)) and np.array_equal(cmax, table.max(axis=0))
                and np.array_equal(hist, ref_hist))
        print("distributed result %s the single-process answer"
              % ("matches" if same else "DOES NOT MATCH"))
        if not same:
            raise SystemExit(1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
