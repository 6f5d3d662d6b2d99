"""Communication overhead of a training step on GPUs: hvlite's DistributedOptimizer against
torch's DistributedDataParallel, paired against the same ranks training without communication,
in one job.

    hvlrun -np 2 python bench/gpu_training.py                      # ResNet-50, batch 64 per rank
    hvlrun -np 2 python bench/gpu_training.py --hostid-per-rank    # ranks sharing one GPU on NCCL
    hvlrun -np 1 python bench/gpu_training.py                      # one process: the baseline

Every rank trains the same model (seed 0) on its own synthetic batch, on the GPU of its local
rank modulo the GPUs there are (or the CPU with --no-cuda, for trying the script out). Three
ways of stepping, timed in turn in every round so that drift hits each alike:
  local   the model alone, no communication: what these ranks, sharing what they share (one GPU,
          the PCIe link, the cores), take without any gradient exchange;
  hvlite  ``hvlite.torch.DistributedOptimizer`` (gradients averaged as backward produces them);
  DDP     ``torch.nn.parallel.DistributedDataParallel`` on torch.distributed's --ddp-backend
          (default nccl when every rank has a GPU or an NCCL_HOSTID of its own, else gloo, since
          NCCL refuses ranks that share a GPU).
A cell is the median over rounds of the slowest rank's mean step (the GPU waited for at the end of
each round's steps). Overhead = a way's step minus the local step, on the same ranks: the time
the gradient exchange adds, which is what the issue compares (the local step of N ranks sharing a
GPU already includes their contention, so it is the fair baseline, not one process alone).
hvlite's plane counters in the title say which plane ran (nccl, staged through shm or MPI).
Times are printed, never asserted.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from mpi4py import MPI

import hvlite
import hvlite.torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from harness import init_torch_distributed  # noqa: E402
from pytorch_synthetic_benchmark import build  # noqa: E402
from tables import add_json_arg, print_table, write_json  # noqa: E402


def stepper(model, optimizer, batch):
    x, y = batch

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return step


def mean_step(step, steps, device, comm):
    """The slowest rank's mean seconds per step over `steps` steps (ranks start together)."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return comm.allreduce((time.perf_counter() - t) / steps, op=MPI.MAX)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50", help="a model of examples/pytorch_synthetic_benchmark.py")
    p.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the three ways (default 5)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per way and round (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per way first (default 3)")
    p.add_argument("--hostid-per-rank", action="store_true",
                   help="give each rank its own NCCL_HOSTID (ranks sharing a GPU, on NCCL)")
    p.add_argument("--ddp-backend", choices=["nccl", "gloo"], help="torch.distributed's backend")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU")
    add_json_arg(p)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if args.hostid_per_rank:
        os.environ["NCCL_HOSTID"] = "hvlite-bench-rank-%d" % comm.rank
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    hvd.init()
    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        own_gpu = args.hostid_per_rank or hvd.local_size() <= torch.cuda.device_count()
        backend = args.ddp_backend or ("nccl" if own_gpu else "gloo")
    else:
        torch.set_num_threads(1)
        device, backend = torch.device("cpu"), args.ddp_backend or "gloo"
    dist = init_torch_distributed(comm, backend) if comm.size > 1 else None

    def replica():
        torch.manual_seed(0)
        model, make_batch = build(args.model)
        return model.to(device), make_batch

    local, make_batch = replica()
    torch.manual_seed(1 + comm.rank)
    batch = tuple(t.to(device) for t in make_batch(args.batch_size))
    ways = {"local": stepper(local, torch.optim.SGD(local.parameters(), lr=0.01, momentum=0.9), batch)}
    if comm.size > 1:
        model_h, _ = replica()
        opt_h = hvd.DistributedOptimizer(torch.optim.SGD(model_h.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model_h.named_parameters())
        ways["hvlite"] = stepper(model_h, opt_h, batch)
        model_d, _ = replica()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model_d, device_ids=[device.index] if cuda else None)
        ways["DDP"] = stepper(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9), batch)
    for step in ways.values():
        mean_step(step, args.warmup, device, comm)
    samples = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, step in ways.items():
            samples[name].append(mean_step(step, args.steps, device, comm))
    step_s = {name: statistics.median(s) for name, s in samples.items()}
    planes = {k: v for k, v in hvlite.engine_counters().items() if k.endswith("_collectives") and v}
    if comm.rank == 0:
        rows = []
        for name, s in step_s.items():
            extra = s - step_s["local"]
            rows.append([name, "%.1f" % (1e3 * s), "%.0f" % (comm.size * args.batch_size / s),
                         "-" if name == "local" else "%.1f" % (1e3 * extra),
                         "-" if name == "local" else "%.0f%%" % (100 * extra / step_s["local"])])
        if "DDP" in step_s:
            hvl, ddp_ = step_s["hvlite"] - step_s["local"], step_s["DDP"] - step_s["local"]
            rows.append(["hvlite/DDP", "%.2fx" % (step_s["hvlite"] / step_s["DDP"]), "-",
                         "%.2fx" % (hvl / ddp_) if ddp_ > 0 else "-", "-"])
        where = ("%d GPU(s)" % torch.cuda.device_count()) if cuda else "the CPU"
        table = print_table(
            "%s training step, batch %d per rank, %d rank(s) on %s%s, DDP on %s; median of %d "
            "rounds x %d steps, slowest rank; hvlite's planes: %s"
            % (args.model, args.batch_size, comm.size, where,
               ", NCCL_HOSTID per rank" if args.hostid_per_rank else "", backend if dist else "-",
               args.rounds, args.steps, planes),
            ["way", "step ms", "img/s (all ranks)", "overhead ms", "overhead"], rows)
        if args.json:
            write_json(args.json, [table])
    if dist:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
