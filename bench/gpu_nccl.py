"""Allreduce of CUDA tensors on hvlite's NCCL plane against torch.distributed on NCCL, the same
ranks over the same transport, side by side in one run.

    hvlrun -np 2 python bench/gpu_nccl.py                   # one GPU per rank
    hvlrun -np 2 python bench/gpu_nccl.py --hostid-per-rank # ranks sharing one GPU: each its own
                                                            # NCCL_HOSTID, NCCL over loopback sockets

float32 Sum, in place, 4 KiB to 256 MiB, and 160 x 100 KiB submitted as one group (hvlite: one
fused NCCL group; torch: 160 all_reduce calls, as DDP without buckets would). Each cell is the
median over --iters calls of the slowest rank's time (an mpi4py barrier before every call, the
GPU waited for after it: the benchmark's clock only). Columns: hvlite and torch times, their
ratio, and each one's bus bandwidth (bytes x 2(n-1)/n per second, NCCL's busbw). The plane
counters in the title say whether NCCL ran hvlite's calls (else they were staged). Times are
printed, never asserted (goals, issue 22: within 10% of torch from 1 MiB, 4 KiB at most 1.5x).
"""
import argparse
import os
import sys

import torch
from mpi4py import MPI

import hvlite
import hvlite.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import human, init_torch_distributed, ms, ratio, timed  # noqa: E402
from gpu_cases import SIZES, cases, on_gpu, rank_gpu  # noqa: E402
from tables import add_json_arg, print_table, write_json  # noqa: E402

def busbw(nbytes, seconds, n):
    return "%.2f" % (nbytes * 2 * (n - 1) / n / seconds / 1e9) if seconds and n > 1 else "-"


def row(label, tensors, dist, device, comm, iters):
    nbytes = sum(t.numel() * t.element_size() for t in tensors)

    def hvl():
        if len(tensors) == 1:
            hvd.allreduce_(tensors[0], op=hvd.Sum, name="bench.nccl")
        else:
            hvd.grouped_allreduce_(tensors, op=hvd.Sum, name="bench.nccl.group")

    def torch_nccl():
        for t in tensors:
            dist.all_reduce(t)
    t_hvl = timed(on_gpu(hvl, device), comm, iters)
    t_torch = timed(on_gpu(torch_nccl, device), comm, iters)
    return [label, human(nbytes), ms(t_hvl), ms(t_torch), ratio(t_hvl, t_torch),
            busbw(nbytes, t_hvl, comm.size), busbw(nbytes, t_torch, comm.size)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--max-bytes", type=int, default=SIZES[-1])
    p.add_argument("--hostid-per-rank", action="store_true",
                   help="give each rank its own NCCL_HOSTID (ranks sharing a GPU)")
    add_json_arg(p)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if args.hostid_per_rank:
        os.environ["NCCL_HOSTID"] = "hvlite-bench-rank-%d" % comm.rank
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    hvd.init()
    device = rank_gpu(hvd)
    dist = init_torch_distributed(comm, "nccl")
    rows = [row(label, tensors, dist, device, comm, args.iters)
            for label, tensors in cases(device, args.max_bytes)]
    planes = {k: v for k, v in hvlite.engine_counters().items() if k.endswith("_collectives") and v}
    if comm.rank == 0:
        table = print_table(
            "float32 Sum allreduce of CUDA tensors, in place, %d ranks on %d GPU(s)%s, slowest "
            "rank per call, median of %d calls (ms; busbw GB/s); hvlite's planes: %s"
            % (comm.size, torch.cuda.device_count(), ", NCCL_HOSTID per rank" if
               args.hostid_per_rank else "", args.iters, planes),
            ["case", "bytes", "hvlite", "torch", "hvl/torch", "hvl busbw", "torch busbw"], rows, 2)
        if args.json:
            write_json(args.json, [table])
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
