"""Adasum allreduce against Sum allreduce, per size, in one run: what choosing op=hvd.Adasum
costs. Adasum runs on hvlite's MPI data plane (recursive halving and doubling, point to point,
plus a small exchange of dot products per level; csrc/backends/adasum_mpi.c); Sum runs on the
plane the engine picks (shared memory on one host) and, for the like-for-like ratio, on the MPI
plane (the engine restarted with HVLITE_SHM_DISABLE=1); mpi4py's Allreduce on the same MPI is
the reference.

    hvlrun -np 2 python bench/adasum.py [--iters N] [--repeat R] [--smoke] [--json PATH]
    hvlrun -np 4 python bench/adasum.py          # two levels of the recursion

Every case is float32, in place, median of --iters calls after warm-up (slowest rank per call);
the phases (engine as configured, mpi4py, engine on MPI) run --repeat times in turn and a cell
is the median of the repeats. "64 x 256 KiB" submits 64 tensors at once (one fused Adasum, each
tensor with its own dot products). #wrong counts elements of one checked Adasum call that differ
from the NumPy reference (tests/parallel/adasum_reference.py's math) by more than 1e-5 of its
largest value, in both phases. The rank count must be a power of 2.
"""
import argparse
import os

import numpy as np
from mpi4py import MPI

import hvlite as hvd
from harness import add_repeat_args, human, median_over_repeats, ms, ratio, restart_engine, timed
from tables import add_json_arg, print_table, write_json

MIB = 1024 * 1024
MANY = (64, 256 * 1024)


def value(rank, n, seed=0):
    """Rank ``rank``'s input: a shared part plus its own, so vectors are neither orthogonal
    nor parallel."""
    shared = np.random.default_rng([seed, n]).standard_normal(n)
    own = np.random.default_rng([seed, n, rank + 1]).standard_normal(n)
    return (shared + own).astype(np.float32)


def reference(vectors):
    """Adasum of the ranks' vectors (rank order, pairwise tree), in float64."""
    level = [v.astype(np.float64) for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            ab, aa, bb = a @ b, a @ a, b @ b
            nxt.append(((1 - ab / (2 * aa)) * a + (1 - ab / (2 * bb)) * b).astype(np.float32)
                       .astype(np.float64))
        level = nxt
    return level[0]


def wrong(got, expected):
    return int(np.count_nonzero(np.abs(got - expected) > 1e-5 * np.abs(expected).max()))


def one_tensor(nbytes, comm, iters):
    """(Sum time, Adasum time, #wrong) for one tensor of nbytes with the engine as it is now."""
    n = nbytes // 4
    x = value(comm.rank, n)
    summed, reduced = x.copy(), x.copy()
    t_sum = timed(lambda: hvd.allreduce_(summed, op=hvd.Sum, name="sum.%d" % n), comm, iters)
    t_ada = timed(lambda: hvd.allreduce_(reduced, op=hvd.Adasum, name="ada.%d" % n), comm, iters)
    got = hvd.allreduce(x, op=hvd.Adasum, name="check.%d" % n)
    return t_sum, t_ada, wrong(got, reference([value(r, n) for r in range(comm.size)]))


def many_tensors(comm, iters):
    """The same for MANY tensors submitted together (fused)."""
    count, nbytes = MANY
    xs = [value(comm.rank, nbytes // 4, seed=i) for i in range(count)]
    bufs = {op: [x.copy() for x in xs] for op in (hvd.Sum, hvd.Adasum)}

    def run(op, tag):
        return lambda: hvd.grouped_allreduce_(bufs[op], op=op, name="%s.many" % tag)
    t_sum = timed(run(hvd.Sum, "sum"), comm, iters)
    t_ada = timed(run(hvd.Adasum, "ada"), comm, iters)
    got = hvd.grouped_allreduce(xs, op=hvd.Adasum, name="check.many")
    bad = sum(wrong(g, reference([value(r, nbytes // 4, seed=i) for r in range(comm.size)]))
              for i, g in enumerate(got))
    return t_sum, t_ada, bad


def engine_phase(sizes, comm, iters):
    """{("sum", key): time, ("ada", key): (time, #wrong)} for each size and "many"."""
    cells = {}
    for key in sizes + ["many"]:
        if key == "many":
            t_sum, t_ada, bad = many_tensors(comm, iters)
        else:
            t_sum, t_ada, bad = one_tensor(key, comm, iters if key <= 16 * MIB else
                                           max(iters // 2, 3))
        cells["sum", key], cells["ada", key] = t_sum, (t_ada, bad)
    return cells


def mpi_phase(sizes, comm, iters):
    cells = {}
    for n in sizes:
        buf = value(comm.rank, n // 4)
        cells[n] = timed(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), comm, iters)
    count, nbytes = MANY
    bufs = [value(comm.rank, nbytes // 4) for _ in range(count)]
    cells["many"] = timed(lambda: [comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM) for b in bufs],
                          comm, iters)
    return cells


def main():
    p = argparse.ArgumentParser(description="Adasum vs Sum allreduce")
    add_repeat_args(p)
    p.add_argument("--smoke", action="store_true", help="tiny sizes and few iterations (CI)")
    p.add_argument("--sizes-mib", default="1,4,16,64", help="tensor sizes, MiB, comma-separated")
    add_json_arg(p)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size & (comm.size - 1):
        raise SystemExit("bench/adasum.py: Adasum needs a power-of-2 number of ranks")
    hvd.init()
    sizes = ([64 * 1024] if args.smoke
             else [int(float(m) * MIB) for m in args.sizes_mib.split(",")])
    iters, repeat = (3, 1) if args.smoke else (args.iters, args.repeat)
    start = {n: v for n, v in os.environ.items() if n.startswith(("HVLITE_", "HOROVOD_"))}
    runs = {"hvl": [], "hmpi": [], "mpi": []}
    for _ in range(repeat):
        runs["hvl"].append(engine_phase(sizes, comm, iters))
        runs["mpi"].append(mpi_phase(sizes, comm, iters))
        restart_engine(hvd, start, {"HVLITE_SHM_DISABLE": "1"})
        runs["hmpi"].append(engine_phase(sizes, comm, iters))
        restart_engine(hvd, start, {})
    hvl, hmpi, ref = (median_over_repeats(runs[k]) for k in ("hvl", "hmpi", "mpi"))
    rows = []
    for key in sizes + ["many"]:
        label = human(key) if key != "many" else "%d x %s" % (MANY[0], human(MANY[1]))
        (s_shm, (a_shm, w_shm)), (s_mpi, (a_mpi, w_mpi)) = ((c["sum", key], c["ada", key])
                                                            for c in (hvl, hmpi))
        rows.append([label, ms(s_shm), ms(s_mpi), ms(ref[key]), ms(a_mpi), ms(a_shm),
                     ratio(a_mpi, s_mpi), ratio(a_mpi, ref[key]), ratio(a_shm, s_shm),
                     w_shm + w_mpi])
    if comm.rank == 0:
        table = print_table(
            "Adasum vs Sum allreduce, float32 in place, %d ranks, %s; Sum as configured (shm) "
            "and on the MPI plane (HVLITE_SHM_DISABLE=1); Adasum always on MPI; median of %d "
            "repeats x %d calls (times in ms)" % (comm.size, hvd.mpi_vendor().strip(), repeat,
                                                 iters),
            ["size", "Sum", "Sum mpi", "mpi4py", "Adasum", "Adasum*", "Ada/Sum mpi",
             "Ada/mpi4py", "Ada*/Sum", "#wrong"], rows)
        print("Adasum: measured in the MPI-plane phase; Adasum*: in the as-configured phase "
              "(also on MPI).")
        if args.json:
            write_json(args.json, [table])
    hvd.shutdown()


if __name__ == "__main__":
    main()
