"""The other collectives on one host: hvlite's shared-memory data plane against its MPI data
plane (the same engine restarted with HVLITE_SHM_DISABLE=1), raw mpi4py on the same MPI, and
the memory floor, per size. The "hvl/hvl-mpi" column is what decides, per op, which sizes the
shm backend takes (csrc/backends/backend_shm.c); bench/README.md records the crossovers.

    hvlrun -np 2 python bench/collectives.py [--iters N] [--repeat R] [--smoke]
                                             [--ops allgather,broadcast] [--sizes-kib 4,64]
                                             [--json PATH]

Sizes are the bytes each rank sends (allgather: its rows; broadcast: the buffer; reducescatter:
the whole input, float32 Sum; alltoall: its whole input, split evenly). Each time is the median
of --iters calls of the slowest rank; the phases (hvlite, mpi4py, memcpy, hvlite restarted on
MPI) run --repeat times in turn and a cell is the median of the repeats. #wrong counts wrong
elements of one checked call of each hvlite phase against NumPy.
"""
import argparse
import os

import numpy as np
from mpi4py import MPI

import hvlite as hvd
from harness import (add_repeat_args, human, median_over_repeats, memcpy_floor, ms, ratio,
                     restart_engine, timed)
from tables import add_json_arg, print_table, write_json

KIB = 1024
MIB = 1024 * KIB


def inputs(op, nbytes, comm):
    """This rank's float32 input for `op` of about `nbytes` (a multiple of the rank count)."""
    n = max(nbytes // 4 // comm.size * comm.size, comm.size)
    return (np.arange(n, dtype=np.float32) % 251) + comm.rank


def hvlite_call(op, x, comm):
    """A function running `op` once on x through hvlite, and one checking its result -> #wrong."""
    size, rank = comm.size, comm.rank
    name = "bench.%s.%d" % (op, x.nbytes)
    base = x - rank
    if op == "allgather":
        return (lambda: hvd.allgather(x, name=name),
                lambda: int(np.count_nonzero(hvd.allgather(x, name=name)
                                             != np.concatenate([base + r for r in range(size)]))))
    if op == "broadcast":
        buf = x.copy()
        return (lambda: hvd.broadcast_(buf, root_rank=0, name=name),
                lambda: int(np.count_nonzero(hvd.broadcast(x, root_rank=0, name=name) != base)))
    if op == "reducescatter":
        part = len(x) // size
        want = (base * size + sum(range(size)))[rank * part:(rank + 1) * part]
        return (lambda: hvd.reducescatter(x, op=hvd.Sum, name=name),
                lambda: int(np.count_nonzero(hvd.reducescatter(x, op=hvd.Sum, name=name) != want)))
    if op == "alltoall":
        part = len(x) // size
        want = np.concatenate([(base + r)[rank * part:(rank + 1) * part] for r in range(size)])
        return (lambda: hvd.alltoall(x, name=name),
                lambda: int(np.count_nonzero(hvd.alltoall(x, name=name) != want)))
    raise ValueError(op)


def mpi_call(op, x, comm):
    """The same collective with raw mpi4py (preallocated outputs)."""
    size = comm.size
    if op == "allgather":
        out = np.empty(len(x) * size, np.float32)
        return lambda: comm.Allgather(x, out)
    if op == "broadcast":
        buf = x.copy()
        return lambda: comm.Bcast(buf, root=0)
    if op == "reducescatter":
        out = np.empty(len(x) // size, np.float32)
        return lambda: comm.Reduce_scatter_block(x, out, op=MPI.SUM)
    if op == "alltoall":
        out = np.empty_like(x)
        return lambda: comm.Alltoall(x, out)
    raise ValueError(op)


def hvlite_phase(ops, sizes, comm, iters):
    """{(op, nbytes): (time, wrong)} with the engine as it is now."""
    out = {}
    for op in ops:
        for nbytes in sizes:
            run, check = hvlite_call(op, inputs(op, nbytes, comm), comm)
            out[op, nbytes] = (timed(run, comm, iters), check())
    return out


def main():
    p = argparse.ArgumentParser(description="hvlite collectives benchmark (shm vs MPI data plane)")
    add_repeat_args(p)
    p.add_argument("--smoke", action="store_true", help="tiny sizes and few iterations (CI)")
    p.add_argument("--ops", default="allgather,broadcast,reducescatter,alltoall")
    p.add_argument("--sizes-kib", default="4,64,256,1024,4096,16384,65536",
                   help="bytes per rank, in KiB, comma-separated")
    add_json_arg(p)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    hvd.init()
    ops = args.ops.split(",")
    sizes = [4 * KIB, 64 * KIB] if args.smoke else [int(float(k) * KIB) for k in args.sizes_kib.split(",")]
    iters, repeat = (3, 1) if args.smoke else (args.iters, args.repeat)
    start = {n: v for n, v in os.environ.items() if n.startswith(("HVLITE_", "HOROVOD_"))}
    runs = {"hvl": [], "hmpi": [], "mpi": [], "mem": []}
    for _ in range(repeat):
        runs["hvl"].append(hvlite_phase(ops, sizes, comm, iters))
        shm_ran = hvd.engine_counters().get("shm_collectives", 0) > 0
        runs["mpi"].append({(op, n): timed(mpi_call(op, inputs(op, n, comm), comm), comm, iters)
                            for op in ops for n in sizes})
        runs["mem"].append({n: memcpy_floor(n, comm, iters) for n in sizes})
        restart_engine(hvd, start, {"HVLITE_SHM_DISABLE": "1"})
        runs["hmpi"].append(hvlite_phase(ops, sizes, comm, iters))
        restart_engine(hvd, start, {})
    shm, hmpi, ref, floor = (median_over_repeats(runs[k]) for k in ("hvl", "hmpi", "mpi", "mem"))
    rows = []
    for op in ops:
        for n in sizes:
            (t_shm, w_shm), (t_hmpi, w_hmpi) = shm[op, n], hmpi[op, n]
            rows.append([op, human(n), ms(t_shm), ms(t_hmpi), ms(ref[op, n]), ms(floor[n]),
                         ratio(t_shm, t_hmpi), ratio(t_shm, ref[op, n]), ratio(t_shm, floor[n]),
                         w_shm + w_hmpi])
    if comm.rank == 0:
        table = print_table(
            "collectives float32, %d ranks, %s; hvlite as configured (shm data plane where it "
            "takes the size: %s), hvl-mpi: restarted with HVLITE_SHM_DISABLE=1; median of %d "
            "repeats x %d calls (times in ms)"
            % (comm.size, hvd.mpi_vendor().strip(), "yes" if shm_ran else "no", repeat, iters),
            ["op", "bytes/rank", "hvlite", "hvl-mpi", "mpi4py", "memcpy", "hvl/hvl-mpi",
             "hvl/mpi4py", "hvl/memcpy", "#wrong"], rows, key_columns=2)
        if args.json:
            write_json(args.json, [table])
    hvd.shutdown()


if __name__ == "__main__":
    main()
