"""Communication overhead per training step, measured in pairs so that it resolves a few percent
on a machine whose speed drifts.

    hvlrun -np 2 python bench/step_overhead.py                    # MLP and ResNet, shm and MPI
    hvlrun -np 2 python bench/step_overhead.py --models mlp --pairs 400 --blocks 16
    hvlrun -np 2 python bench/step_overhead.py --smoke            # CI: a few seconds
    hvlrun -np 2 python bench/step_overhead.py --json out.json    # + the tables as JSON
    hvlrun -np 2 python bench/step_overhead.py --device cuda --models resnet50 --batch-size 64 \
        --planes shm                                              # on a GPU (the staged path)

One job, every rank doing the same thing at the same time. Each round, on a fresh random batch
(seeded per rank, made before the clock starts), runs four timed items in a random order (seeded
with --seed, the same order on every rank, so drift falls on every item alike):
  dist    one training step of the model under hvlite's DistributedOptimizer (gradients averaged
          over the ranks, 25 MiB buckets as configured by default);
  plain   the same step on an identical copy of the model with the plain optimizer, same batch;
  hvl     hvlite ``allreduce_`` (Average, in place) of one flat float32 tensor as large as all
          the model's gradients together: what one plain allreduce of those bytes costs;
  mpi4py  mpi4py ``Allreduce`` (Sum, in place) of the same bytes: the MPI data plane's floor;
  ddp     (with --ddp) the same step on a third copy under torch DistributedDataParallel: gloo
          on the CPU, NCCL on CUDA (--hostid-per-rank: each rank its own NCCL_HOSTID, for ranks
          sharing a GPU; hvlite's NCCL plane then runs too; or --ddp-backend gloo, against
          hvlite's staged path), so the two overheads are paired.
Models and step are examples/pytorch_synthetic_benchmark.py's (``build``: the MLP, 4.2 M
parameters in 10 tensors, and the ResNet-34 layout, 1.3 M in 110), as in bench/torch_training.py:
SGD (lr 0.01, momentum 0.9), --batch-size per rank, one thread per process. Every item starts
after an mpi4py barrier and its time is the slowest rank's.

Per round, overhead = dist - plain. Reported per model and data plane (times in ms):
1. the plain step; the median and the mean overhead, each with its 95% confidence interval; the
   median's CI half-width relative to the overhead ("+-% ovh": differences in overhead well
   below it are noise) and to the plain step ("+-% step"); overhead / plain step; both reference
   allreduces (medians); median overhead / median hvl allreduce ("ovh/hvl") with its CI;
2. the overhead split where the slowest rank's backward ended: before (hooks, communication
   overlapping backward) and after (optimizer.step(): waiting for the allreduces, SGD), each
   median with its CI; the "after" part is short, so its CI is far tighter than the whole
   step's when the step is long;
3. with two planes: median overhead on one / on the other, with its CI;
4. with --ddp: hvlite's and DDP's median overheads and their ratio, with its CI (the same
   resampled rounds for both: paired in time).
``--json PATH`` writes the tables and every round's raw times (seconds, the slowest rank's, per
COLUMNS: each item's duration, and for the two steps when backward ended), block after block.

Blocks: the rounds run in --blocks blocks of equal size (--pairs is rounded up to a multiple);
each block runs every data plane once, in a random order: engine restart, --warmup rounds per
model thrown away, then the block's rounds of every model. ``shm`` is the engine with
HVLITE_SHM_DISABLE=0 (on one host: the shared-memory data plane), ``mpi`` with
HVLITE_SHM_DISABLE=1; hvlite restarts in one process (``hvd.shutdown(); hvd.init()``: mpi4py owns
MPI) and the models and optimizers live across restarts.

Confidence intervals: 95%, percentile bootstrap in two stages, --bootstrap resamples (seeded):
each resample draws --blocks blocks with replacement, then each drawn block's rounds with
replacement. On a shared machine the other work changes the overhead itself from one stretch of
time to the next (MLP: 5 to 20 ms between blocks of one run), which resampling rounds alone would
hide behind a too-narrow interval; with --blocks 1 only round-to-round noise is seen. Every
model and plane uses the same drawn blocks, so the plane ratio's interval is paired in time.

``--null`` gives the 'dist' copy the plain optimizer too: a null run, whose overhead intervals
should hold 0 (a check that the two copies and the pairing are unbiased). The title gives the
machine's load average before and after. Times are printed, never asserted.
"""
import argparse
import copy
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import hvlite
import hvlite.torch as hvd
from gpu_cases import rank_gpu
from harness import human, init_torch_distributed, restart_engine
from tables import add_json_arg, print_table, write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from pytorch_synthetic_benchmark import build  # noqa: E402  (the models of torch_training.py)

ITEMS = ("dist", "plain", "hvl", "mpi4py")


def columns_of(items):
    """The times kept per round, seconds from each item's start: every item's duration, then
    when each training step's backward ended."""
    return tuple(items) + tuple(i + " backward" for i in items if i in ("dist", "plain", "ddp"))
PLANES = {"shm": {"HVLITE_SHM_DISABLE": "0"}, "mpi": {"HVLITE_SHM_DISABLE": "1"}}


def settle(device):
    """On a GPU, wait for the work queued so far, so a time covers the work, not its queueing
    (the benchmark's clock only; hvlite itself never synchronises the device)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, optimizer, x, y):
    """One training step; returns the perf_counter time at which its backward ended."""
    device = x.device
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    settle(device)
    backward_end = time.perf_counter()
    optimizer.step()
    settle(device)
    return backward_end


class Subject:
    """One model twice (under DistributedOptimizer, and plain), its batches, and flat buffers of
    its gradient bytes for the reference allreduces."""

    def __init__(self, name, batch_size, seed, comm, null=False, device=torch.device("cpu"),
                 ddp=False):
        torch.manual_seed(seed)                   # identical weights on every rank and copy
        self.name, self.batch_size, self.comm, self.device = name, batch_size, comm, device
        self.items = ITEMS + (("ddp",) if ddp else ())
        self.columns = columns_of(self.items)
        model, make_batch = build(name)
        self.dist_model = model.to(device)
        self.make_batch = lambda b: tuple(t.to(device) for t in make_batch(b))
        self.plain_model = copy.deepcopy(self.dist_model)
        self.plain_opt = torch.optim.SGD(self.plain_model.parameters(), lr=0.01, momentum=0.9)
        if ddp:                                   # torch.distributed is initialised by main()
            self.ddp_model = torch.nn.parallel.DistributedDataParallel(
                copy.deepcopy(self.plain_model), device_ids=[device] if device.type == "cuda" else None)
            self.ddp_opt = torch.optim.SGD(self.ddp_model.parameters(), lr=0.01, momentum=0.9)
        self.dist_opt = torch.optim.SGD(self.dist_model.parameters(), lr=0.01, momentum=0.9)
        if not null:
            self.dist_opt = hvd.DistributedOptimizer(
                self.dist_opt, named_parameters=self.dist_model.named_parameters())
        count = sum(p.numel() for p in self.dist_model.parameters() if p.requires_grad)
        self.grad_bytes = 4 * count
        self.flat = torch.zeros(count, device=device)   # zeros: sums stay finite, never denormal
        self.flat_np = np.zeros(count, np.float32)

    def run(self, item, x, y):
        """Run one item; a training step returns when its backward ended, the others None."""
        if item == "dist":
            return train_step(self.dist_model, self.dist_opt, x, y)
        if item == "plain":
            return train_step(self.plain_model, self.plain_opt, x, y)
        if item == "ddp":
            return train_step(self.ddp_model, self.ddp_opt, x, y)
        if item == "hvl":
            hvd.allreduce_(self.flat, op=hvd.Average, name="step_overhead." + self.name)
            settle(self.device)
        else:
            self.comm.Allreduce(MPI.IN_PLACE, self.flat_np, op=MPI.SUM)
        return None

    def rounds(self, count, order_rng):
        """Time `count` rounds: (count, len(self.columns)) seconds from each item's start (after
        a barrier), each the slowest rank's, on every rank."""
        times = np.zeros((count, len(self.columns)))
        for r in range(count):
            x, y = self.make_batch(self.batch_size)
            settle(self.device)
            for i in order_rng.permutation(len(self.items)):
                self.comm.Barrier()
                t0 = time.perf_counter()
                backward_end = self.run(self.items[i], x, y)
                times[r, i] = time.perf_counter() - t0
                if backward_end is not None:
                    times[r, self.columns.index(self.items[i] + " backward")] = backward_end - t0
        self.comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        return times


ENGINE_COUNTS = ("collectives", "nccl_collectives", "tensors_held_for_gpu")


def measure(subjects, planes, args, comm):
    """Run the blocks; returns ({(model, plane): times}, {plane: shm data plane used},
    {plane: {counter: total over the blocks, "rounds": rounds run}}), the counters being this
    rank's ENGINE_COUNTS (each restart zeroes them, so they are read at each block's end)."""
    order_rng = np.random.default_rng(args.seed)  # same seed on every rank: same order
    start = {n: v for n, v in os.environ.items() if n.startswith(("HVLITE_", "HOROVOD_"))}
    runs = {(s.name, p): [] for s in subjects for p in planes}
    shm_used = {}
    counts = {p: dict.fromkeys(ENGINE_COUNTS + ("rounds",), 0) for p in planes}
    for _ in range(args.blocks):
        for plane in [planes[i] for i in order_rng.permutation(len(planes))]:
            restart_engine(hvd, start, PLANES[plane])
            for s in subjects:
                s.rounds(args.warmup, order_rng)
                runs[s.name, plane].append(s.rounds(args.per_block, order_rng))
            counters = hvlite.engine_counters()
            shm_used[plane] = counters["shm_collectives"] > 0
            for name in ENGINE_COUNTS:
                counts[plane][name] += counters.get(name, 0)
            counts[plane]["rounds"] += (args.warmup + args.per_block) * len(subjects)
    restart_engine(hvd, start, {})
    return {k: np.concatenate(v) for k, v in runs.items()}, shm_used, counts


def interval(values):
    return np.percentile(values, [2.5, 97.5])


def resample(chosen, per_block, rng):
    """Two-stage bootstrap indices into rounds stored block after block: for each resample (row
    of `chosen`: blocks drawn with replacement) every chosen block's rounds drawn again with
    replacement. Shape (resamples, blocks * per_block)."""
    within = rng.integers(0, per_block, size=chosen.shape + (per_block,))
    return (chosen[..., None] * per_block + within).reshape(len(chosen), -1)


def paired(over, ref, idx):
    """Median and mean of the per-round differences `over`, median over / median `ref`, each
    with its 95% percentile-bootstrap interval over the resampled rounds `idx`."""
    boot = np.median(over[idx], axis=1)
    return {"median": np.median(over), "median_ci": interval(boot), "boot": boot,
            "mean": over.mean(), "mean_ci": interval(over[idx].mean(axis=1)),
            "per_ref": np.median(over) / np.median(ref),
            "per_ref_ci": interval(boot / np.median(ref[idx], axis=1))}


def summarize(times, idx, columns):
    """Statistics of one (model, plane): the whole step's overhead, its parts before and after
    backward ended, the plain step and reference medians, and DDP's overhead where it ran; CIs
    from the resamples `idx`."""
    t = dict(zip(columns, times.T))
    after = {k: t[k] - t[k + " backward"] for k in ("dist", "plain")}
    ddp = {"ddp": paired(t["ddp"] - t["plain"], t["hvl"], idx)} if "ddp" in t else {}
    return {**ddp, "rounds": len(times), "plain": np.median(t["plain"]),
            "plain backward": np.median(t["plain backward"]),
            "plain after": np.median(after["plain"]),
            "hvl": np.median(t["hvl"]), "mpi4py": np.median(t["mpi4py"]),
            "total": paired(t["dist"] - t["plain"], t["hvl"], idx),
            "backward": paired(t["dist backward"] - t["plain backward"], t["hvl"], idx),
            "after": paired(after["dist"] - after["plain"], t["hvl"], idx)}


def fmt_ms(t):
    return "%.2f" % (t * 1e3)


def fmt_ci(ci, scale=1e3):
    return "[%.2f, %.2f]" % (ci[0] * scale, ci[1] * scale)


def half_width(p, of):
    """The median's CI half-width as a percentage of `of`."""
    return "%.1f%%" % (50 * (p["median_ci"][1] - p["median_ci"][0]) / abs(of)) if of else "-"


def overhead_row(s, plane, st):
    o = st["total"]
    return [s.name, plane, human(s.grad_bytes), st["rounds"], fmt_ms(st["plain"]),
            fmt_ms(o["median"]), fmt_ci(o["median_ci"]), half_width(o, o["median"]),
            half_width(o, st["plain"]), fmt_ms(o["mean"]), fmt_ci(o["mean_ci"]),
            "%.1f%%" % (100 * o["median"] / st["plain"]), fmt_ms(st["hvl"]), fmt_ms(st["mpi4py"]),
            "%.2fx" % o["per_ref"], fmt_ci(o["per_ref_ci"], 1)]


def parts_row(s, plane, st):
    b, a = st["backward"], st["after"]
    return [s.name, plane, fmt_ms(st["plain backward"]), fmt_ms(b["median"]),
            fmt_ci(b["median_ci"]), fmt_ms(st["plain after"]), fmt_ms(a["median"]),
            fmt_ci(a["median_ci"]), half_width(a, a["median"]), "%.2fx" % a["per_ref"],
            fmt_ci(a["per_ref_ci"], 1)]


def plane_row(name, a, b):
    """Median overhead of plane a / plane b; the CI from resamples that drew the same blocks for
    both planes (they ran in the same stretches of time)."""
    ma, mb = a["total"]["median"], b["total"]["median"]
    return [name, fmt_ms(ma), fmt_ms(mb), "%.2fx" % (ma / mb),
            fmt_ci(interval(a["total"]["boot"] / b["total"]["boot"]), 1),
            "%.2fx" % (a["plain"] / b["plain"])]


def ddp_row(name, plane, st):
    h, d = st["total"], st["ddp"]
    return [name, plane, fmt_ms(st["plain"]), fmt_ms(h["median"]), fmt_ci(h["median_ci"]),
            fmt_ms(d["median"]), fmt_ci(d["median_ci"]), "%.2fx" % (h["median"] / d["median"]),
            fmt_ci(interval(h["boot"] / d["boot"]), 1)]


def report(subjects, planes, runs, shm_used, counts, args, comm, load):
    """Print the tables (rank 0) and return them for --json. `load`: the 1-minute load
    averages before and after the measurement (the machine's other work)."""
    rng = np.random.default_rng(args.seed + 1)
    chosen = rng.integers(0, args.blocks, size=(args.bootstrap, args.blocks))  # same for all
    stats = {k: summarize(v, resample(chosen, args.per_block, rng), subjects[0].columns)
             for k, v in runs.items()}
    label = {p: p if p != "shm" or shm_used[p] else "shm (unused: MPI)" for p in planes}
    cells = [(s, p, stats[s.name, p]) for s in subjects for p in planes]
    tables = [print_table(
        "%straining-step overhead of gradient communication, %d ranks, batch %d per rank: "
        "overhead = DistributedOptimizer step - plain step, paired per round (random order), "
        "%d rounds per cell in %d blocks; 95%% CIs: two-stage percentile bootstrap (blocks, "
        "then rounds within them; %d resamples); hvl / mpi4py: one allreduce of the gradient "
        "bytes; load average %.1f before, %.1f after (times in ms)"
        % ("NULL RUN (both copies plain; overhead should be 0): " if args.null else "",
           comm.size, args.batch_size, args.pairs, args.blocks, args.bootstrap, *load),
        ["model", "plane", "grads", "rounds", "plain step", "overhead med", "95% CI", "+-% ovh",
         "+-% step", "overhead mean", "95% CI", "ovh/step", "hvl allreduce", "mpi4py", "ovh/hvl",
         "95% CI"], [overhead_row(s, label[p], st) for s, p, st in cells], key_columns=2)]
    tables.append(print_table(
        "where the overhead is: up to the end of backward (zero_grad, forward, backward: "
        "gradient hooks, communication overlapping backward) and after it (optimizer.step: "
        "waiting for the allreduces, then SGD), medians with 95% CIs (times in ms)",
        ["model", "plane", "plain bwd", "ovh in bwd", "95% CI", "plain step()", "ovh in step()",
         "95% CI", "+-% ovh", "step()/hvl", "95% CI"],
        [parts_row(s, label[p], st) for s, p, st in cells], key_columns=2))
    tables.append(print_table(
        "what rank 0's engine ran per round (warm-up rounds included; a round is one step of "
        "each item: the DistributedOptimizer step's batches, plus 1 for the hvl allreduce; "
        "every model of the run together)",
        ["plane", "rounds", "collectives", "on NCCL", "CUDA tensors held for the GPU"],
        [[label[p], c["rounds"]] + ["%.1f" % (c[n] / max(1, c["rounds"])) for n in ENGINE_COUNTS]
         for p, c in counts.items()]))
    if len(planes) == 2:
        a, b = planes
        tables.append(print_table(
            "data planes: median overhead %s / %s (95%% CI: the same blocks drawn for both "
            "planes, rounds within them on their own; times in ms)" % (a, b),
            ["model", "overhead " + a, "overhead " + b, "%s/%s" % (a, b), "95% CI",
             "plain step %s/%s" % (a, b)],
            [plane_row(s.name, stats[s.name, a], stats[s.name, b]) for s in subjects]))
    if args.ddp:
        tables.append(print_table(
            "hvlite DistributedOptimizer vs torch DDP (%s), the same step and batches: median "
            "overhead over the plain step, and their ratio (95%% CI: the same resampled rounds for "
            "both; times in ms)" % ("NCCL" if args.ddp_backend == "nccl" else "gloo"),
            ["model", "plane", "plain step", "hvlite ovh", "95% CI", "DDP ovh", "95% CI",
             "hvlite/DDP", "95% CI"],
            [ddp_row(s.name, label[p], st) for s, p, st in cells], key_columns=2))
    return tables


def main():
    p = argparse.ArgumentParser(description="paired training-step communication overhead")
    p.add_argument("--models", nargs="+", default=["mlp", "resnet"],
                   choices=["mlp", "resnet", "resnet50"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: models and gradients on this rank's GPU (local rank modulo the "
                        "GPUs there are; ranks may share one)")
    p.add_argument("--planes", nargs="+", default=["shm", "mpi"], choices=sorted(PLANES))
    p.add_argument("--pairs", type=int, default=120,
                   help="timed rounds per model and plane (rounded up to a multiple of --blocks)")
    p.add_argument("--blocks", type=int, default=8,
                   help="engine restarts per plane; the rounds are split evenly over them")
    p.add_argument("--warmup", type=int, default=2, help="rounds thrown away after each restart")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--seed", type=int, default=0, help="seeds weights, batches, orders, bootstrap")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--smoke", action="store_true", help="tiny run for CI: a few seconds")
    p.add_argument("--null", action="store_true",
                   help="null run: the 'dist' copy steps with the plain optimizer too, so every "
                        "overhead CI should hold 0 (checks the pairing)")
    p.add_argument("--ddp", action="store_true",
                   help="also time the step under torch DDP (see --ddp-backend), paired")
    p.add_argument("--ddp-backend", choices=["gloo", "nccl"],
                   help="DDP's backend (default: gloo on the CPU, NCCL on CUDA); gloo on CUDA for "
                        "ranks that share a GPU without --hostid-per-rank (NCCL refuses them), "
                        "against hvlite's staged path")
    p.add_argument("--hostid-per-rank", action="store_true",
                   help="give each rank its own NCCL_HOSTID (ranks sharing one GPU), for NCCL")
    add_json_arg(p)
    args = p.parse_args()
    if args.smoke:
        args.pairs, args.blocks, args.warmup, args.batch_size, args.bootstrap = 4, 1, 1, 4, 200
    args.blocks = max(1, min(args.blocks, args.pairs))
    args.per_block = -(-args.pairs // args.blocks)
    args.pairs = args.per_block * args.blocks
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    if args.hostid_per_rank:
        os.environ["NCCL_HOSTID"] = "hvlite-bench-rank-%d" % comm.rank
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    hvd.init()
    device = rank_gpu(hvd) if args.device == "cuda" else torch.device("cpu")
    args.ddp_backend = args.ddp_backend or ("nccl" if device.type == "cuda" else "gloo")
    dist = init_torch_distributed(comm, args.ddp_backend) if args.ddp else None
    subjects = [Subject(m, args.batch_size, args.seed, comm, args.null, device, args.ddp)
                for m in args.models]
    torch.manual_seed(args.seed + 1 + comm.rank)  # batches: each rank its own data
    load = [os.getloadavg()[0]]
    runs, shm_used, counts = measure(subjects, args.planes, args, comm)
    load.append(os.getloadavg()[0])
    if comm.rank == 0:
        tables = report(subjects, args.planes, runs, shm_used, counts, args, comm, load)
        if args.json:
            write_json(args.json, tables, columns=subjects[0].columns, seconds={
                "%s/%s" % k: v.tolist() for k, v in runs.items()})
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
