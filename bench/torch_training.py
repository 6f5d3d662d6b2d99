"""Data-parallel training throughput: hvlite DistributedOptimizer vs torch DistributedDataParallel
(gloo) vs one process, for the same models and step (examples/pytorch_synthetic_benchmark.py).

    python bench/torch_training.py [--ranks 2] [--iters 30] [--models resnet mlp] [--json PATH]

Run it without hvlrun: it launches `hvlrun -np N` (hvlite), `torchrun --nproc_per_node N` (DDP)
and one process in turn, each timing the median step over --iters steps after warm-up, and prints
one table (samples/s, ratios, scaling efficiency = N-rank rate / (N x one-process rate));
``--json PATH`` also writes it as JSON (harness.write_json; bench/ab.py reads it).
One thread per process. Nothing is asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")


def worker(kind, model_name, batch, iters, warmup):
    """Runs inside torchrun (ddp) or alone (single); prints one JSON line from rank 0."""
    import torch

    sys.path.insert(0, os.path.dirname(EXAMPLE))
    from pytorch_synthetic_benchmark import build, step_times
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, make_batch = build(model_name)
    ranks, rank = 1, 0
    if kind == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        ranks, rank = dist.get_world_size(), dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rate = batch / statistics.median(step_times(model, optimizer, make_batch(batch), iters, warmup))
    if kind == "ddp":
        total = torch.tensor(rate, dtype=torch.float64)
        torch.distributed.all_reduce(total)
        rate = total.item()
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps({"runner": kind, "model": model_name, "ranks": ranks, "samples_per_s": rate}))


def run(cmd):
    # In the caller's directory, not this checkout's: ranks start with `python -m`, which puts
    # the working directory ahead of PYTHONPATH (bench/ab.py runs each side in its own).
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    for line in out.stdout.splitlines():
        line = line.split(": ", 1)[-1] if line.startswith("[") else line
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result from %s:\n%s\n%s" % (" ".join(cmd), out.stdout[-2000:], out.stderr[-2000:]))


def main():
    p = argparse.ArgumentParser(description="hvlite vs DDP training throughput")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--models", nargs="+", default=["resnet", "mlp"])
    p.add_argument("--json", metavar="PATH", help="also write the table to PATH as JSON")
    p.add_argument("--worker", choices=["ddp", "single"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.model, args.batch_size, args.iters, args.warmup)
    py, bindir = sys.executable, os.path.dirname(sys.executable)
    common = ["--batch-size", str(args.batch_size), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    # The example takes Horovod's flags: one step per iteration gives the median step.
    example = ["--batch-size", str(args.batch_size), "--num-iters", str(args.iters),
               "--num-warmup-batches", str(args.warmup), "--num-batches-per-iter", "1"]
    rows = []
    for model in args.models:
        hvl = run([os.path.join(bindir, "hvlrun"), "-np", str(args.ranks), py, EXAMPLE, "--model", model,
                   "--json"] + example)
        ddp = run([os.path.join(bindir, "torchrun"), "--standalone", "--nproc_per_node", str(args.ranks),
                   __file__, "--worker", "ddp", "--model", model] + common)
        one = run([py, __file__, "--worker", "single", "--model", model] + common)
        rows.append([model, "%.1f" % hvl["samples_per_s"], "%.1f" % ddp["samples_per_s"],
                     "%.1f" % one["samples_per_s"], "%.2fx" % (hvl["samples_per_s"] / ddp["samples_per_s"]),
                     "%.0f%%" % (100 * hvl["samples_per_s"] / (args.ranks * one["samples_per_s"])),
                     "%.0f%%" % (100 * ddp["samples_per_s"] / (args.ranks * one["samples_per_s"]))])
    sys.path.insert(0, HERE)
    from tables import print_table, write_json
    table = print_table(
        "training throughput, %d ranks, batch %d per rank, median of %d steps (samples/s)"
        % (args.ranks, args.batch_size, args.iters),
        ["model", "hvlite", "DDP gloo", "1 process", "hvlite/DDP", "hvlite eff.", "DDP eff."], rows)
    if args.json:
        write_json(args.json, [table])


if __name__ == "__main__":
    main()
