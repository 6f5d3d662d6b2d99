"""Allreduce of CUDA tensors on hvlite's staged path, against torch.distributed gloo on the same
CUDA tensors and the copy floor, in one run.

    hvlrun -np 2 python bench/gpu_allreduce.py            # on a machine with a GPU
    hvlrun -np 4 python bench/gpu_allreduce.py --iters 20 --json out.json

Every rank uses the GPU of its local rank modulo the GPUs there are (on a one-GPU machine every
rank shares it: NCCL refuses that, the staged path serves it). float32 Sum, in place, 4 KiB to
256 MiB, and 160 x 100 KiB submitted as one group; each cell is the median over --iters calls of
the slowest rank's time (an mpi4py barrier before every call, and the GPU waited for at the end
of every call: the benchmark's clock only). Columns:
  hvlite   ``hvlite.torch.allreduce_`` of the CUDA tensor: copied to page-locked host memory on
           hvlite's stream, reduced on the shared-memory (one host) or MPI plane, copied back;
  gloo     ``torch.distributed.all_reduce`` on the same CUDA tensor with the gloo backend;
  floor    one page-locked copy of the bytes to the host and back (what any host-staged
           allreduce must at least move on this rank);
  ratios   hvlite / gloo and hvlite / floor.
A second table, "results", weighs what the staged path's allgather results cost on their way to
the GPU: the whole staged allgather (``hvlite.torch.allgather``, per-rank tensor of that size),
then the copy of its result alone to the GPU as the torch adapter makes it (from the engine's
pageable result memory) and as it could be made (from page-locked memory), and the share of the
allgather that page-locked results would save (``--no-results`` leaves the table out).
Times are printed, never asserted.
"""
import argparse
import os
import sys

import torch
from mpi4py import MPI

import hvlite
import hvlite.torch as hvd
from hvlite import buffers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import human, init_gloo, ms, ratio, timed  # noqa: E402
from gpu_cases import SIZES, cases, on_gpu, rank_gpu  # noqa: E402
from tables import add_json_arg, print_table, write_json  # noqa: E402

def row(label, tensors, dist, device, comm, iters):
    """One table row: hvlite, gloo, floor (seconds) for these tensors (one call allreduces all)."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)

    def hvl():
        if len(tensors) == 1:
            hvd.allreduce_(tensors[0], op=hvd.Sum, name="bench.gpu")
        else:
            hvd.grouped_allreduce_(tensors, op=hvd.Sum, name="bench.gpu.group")

    def gloo():
        for t in tensors:
            dist.all_reduce(t)
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    flat = torch.zeros(nbytes // 4, device=device)

    def floor():
        host.copy_(flat, non_blocking=True)
        flat.copy_(host, non_blocking=True)
    cells = [timed(on_gpu(f, device), comm, iters) if f else None
             for f in (hvl, gloo if dist else None, floor)]
    return [label, human(nbytes)] + [ms(c) for c in cells] + [ratio(cells[0], cells[1]),
                                                               ratio(cells[0], cells[2])]


def result_rows(device, comm, iters, max_bytes):
    """The results table's rows: per size, the staged allgather, its result's copy to the GPU
    from pageable engine memory and from page-locked memory (seconds), and the saving's share."""
    rows = []
    for n in [s for s in SIZES if s <= min(max_bytes, 64 << 20)]:
        x = torch.zeros(n // 4, device=device)
        total = n * comm.size
        pageable = torch.frombuffer(buffers.memory(buffers.allocate(total), total), dtype=torch.uint8)
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        cells = [timed(on_gpu(f, device), comm, iters) for f in (
            lambda: hvd.allgather(x, name="bench.gpu.gather"),
            lambda: pageable.to(device, non_blocking=True),
            lambda: pinned.to(device, non_blocking=True))]
        saved = (cells[1] - cells[2]) / cells[0] if cells[0] else 0.0
        rows.append([human(n), human(total)] + [ms(c) for c in cells] + ["%.0f%%" % (100 * saved)])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--max-bytes", type=int, default=SIZES[-1])
    p.add_argument("--no-results", action="store_true", help="leave out the results table")
    add_json_arg(p)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    hvd.init()
    device = rank_gpu(hvd)
    dist = init_gloo(comm)
    rows = [row(label, tensors, dist, device, comm, args.iters)
            for label, tensors in cases(device, args.max_bytes)]
    results = [] if args.no_results else result_rows(device, comm, args.iters, args.max_bytes)
    planes = {k: v for k, v in hvlite.engine_counters().items() if k.endswith("_collectives")}
    if comm.rank == 0:
        if results:
            print_table("staged allgather results on their way to the GPU, %d ranks, slowest rank per call, "
                        "median of %d calls (ms): the allgather, its result's copy from pageable and from "
                        "page-locked memory, and the share of the allgather page-locked results would save"
                        % (comm.size, args.iters),
                        ["bytes", "result", "allgather", "pageable", "pinned", "saved"], results, 2)
        table = print_table(
            "float32 Sum allreduce of CUDA tensors, in place, %d ranks on %d GPU(s), slowest rank "
            "per call, median of %d calls (ms); hvlite's planes: %s"
            % (comm.size, torch.cuda.device_count(), args.iters, planes),
            ["case", "bytes", "hvlite", "gloo", "floor", "hvl/gloo", "hvl/floor"], rows, 2)
        if args.json:
            write_json(args.json, [table])
    hvd.shutdown()


if __name__ == "__main__":
    main()
