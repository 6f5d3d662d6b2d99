"""Allreduce benchmark: hvlite vs the MPI underneath (mpi4py on the same MPI), torch.distributed
gloo, and the memory floor (one memcpy of the same bytes), measured in one run.

    hvlrun -np 2 python bench/allreduce.py                   # full table
    hvlrun -np 2 python bench/allreduce.py --smoke           # tiny sizes, a few iterations

Every case is float32, op Sum, in place, median of --iters calls after warm-up (slowest rank per
call). hvlite, mpi4py and the memcpy floor are measured first; gloo is started afterwards and
measured in a second phase of the same run, because a live gloo process group was seen to slow
the MPI-based columns on this 2-core machine (4 KiB mpi4py from 6 to 32 us). "160 x 100 KiB" submits 160 named tensors asynchronously and then waits for all of them
(hvlite fuses them); the references make 160 separate calls. #wrong counts result elements that
differ from the expected value in a separate checked call.
"""
import argparse

import numpy as np
from mpi4py import MPI

import hvlite as hvd
from harness import human, init_gloo, memcpy_floor, ms, print_table, ratio, timed

KIB = 1024


def check_wrong(run_once, n, size):
    buf = np.ones(n, np.float32)
    run_once(buf)
    return int(np.count_nonzero(buf != size))


def one_tensor_case(nbytes, comm, iters):
    n = nbytes // 4
    buf = np.ones(n, np.float32)
    name = "bench.%d" % nbytes
    t_hvl = timed(lambda: hvd.allreduce_(buf, op=hvd.Sum, name=name), comm, iters)
    wrong = check_wrong(lambda b: hvd.allreduce_(b, op=hvd.Sum, name=name), n, comm.size)
    t_mpi = timed(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), comm, iters)
    return t_hvl, t_mpi, wrong


def one_tensor_gloo(nbytes, comm, dist, iters):
    import torch
    tbuf = torch.ones(nbytes // 4, dtype=torch.float32)
    return timed(lambda: dist.all_reduce(tbuf), comm, iters)


def many_tensors_case(count, nbytes, comm, iters):
    bufs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]

    def hvl():
        hs = [hvd.allreduce_async_(b, op=hvd.Sum, name="many.%d" % i) for i, b in enumerate(bufs)]
        for h in hs:
            hvd.synchronize(h)

    def mpi():
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
    t_hvl = timed(hvl, comm, iters)
    for b in bufs:
        b[...] = 1
    hvl()
    wrong = sum(int(np.count_nonzero(b != comm.size)) for b in bufs)
    t_mpi = timed(mpi, comm, iters)
    return t_hvl, t_mpi, wrong


def many_tensors_gloo(count, nbytes, comm, dist, iters):
    import torch
    tbufs = [torch.ones(nbytes // 4, dtype=torch.float32) for _ in range(count)]

    def gloo():
        for w in [dist.all_reduce(t, async_op=True) for t in tbufs]:
            w.wait()
    return timed(gloo, comm, iters)


def row(label, nbytes, t_hvl, t_mpi, t_gloo, t_mem, wrong, size):
    algbw = nbytes / t_hvl / 1e9
    busbw = algbw * 2 * (size - 1) / size
    return [label, ms(t_hvl), ms(t_mpi), ms(t_gloo), ms(t_mem), ratio(t_hvl, t_mpi),
            ratio(t_hvl, t_gloo), ratio(t_hvl, t_mem), "%.2f" % algbw, "%.2f" % busbw, wrong]


def main():
    p = argparse.ArgumentParser(description="hvlite allreduce benchmark")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--smoke", action="store_true", help="tiny sizes and few iterations (CI)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch gloo column")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    hvd.init()
    sizes = [4 * KIB, 256 * KIB] if args.smoke else [4 * KIB, 256 * KIB, 4 * KIB * KIB, 64 * KIB * KIB]
    iters = 5 if args.smoke else args.iters
    many = (16, 4 * KIB) if args.smoke else (160, 100 * KIB)
    measured = []        # phase 1: hvlite, mpi4py, memcpy
    for nbytes in sizes:
        measured.append((human(nbytes), nbytes) + one_tensor_case(nbytes, comm, iters)
                        + (memcpy_floor(nbytes, comm, iters),))
    total = many[0] * many[1]
    measured.append(("%d x %s" % (many[0], human(many[1])), total)
                    + many_tensors_case(many[0], many[1], comm, iters) + (memcpy_floor(total, comm, iters),))
    dist = None if args.no_torch else init_gloo(comm)    # phase 2: torch.distributed gloo
    gloo = [None] * len(measured)
    if dist:
        gloo = [one_tensor_gloo(nbytes, comm, dist, iters) for nbytes in sizes]
        gloo.append(many_tensors_gloo(many[0], many[1], comm, dist, iters))
    rows = [row(label, nbytes, t_hvl, t_mpi, t_gloo, t_mem, wrong, comm.size)
            for (label, nbytes, t_hvl, t_mpi, wrong, t_mem), t_gloo in zip(measured, gloo)]
    if comm.rank == 0:
        print_table("allreduce float32 Sum, %d ranks, %s, median of %d (times in ms)"
                    % (comm.size, hvd.mpi_vendor(), iters),
                    ["case", "hvlite", "mpi4py", "gloo", "memcpy", "hvl/mpi", "hvl/gloo",
                     "hvl/memcpy", "algbw GB/s", "busbw GB/s", "#wrong"], rows)
        print("engine counters:", hvd.engine_counters())
    if dist:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
