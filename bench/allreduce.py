"""Allreduce benchmark: hvlite on its shared-memory data plane and on its MPI data plane, against
the MPI underneath (mpi4py on the same MPI), torch.distributed gloo, and the memory floor (one
memcpy of the same bytes), measured in one run.

    hvlrun -np 2 python bench/allreduce.py                   # full table, 4 KiB .. 256 MiB
    hvlrun -np 2 python bench/allreduce.py --smoke           # tiny sizes, a few iterations
    hvlrun -np 2 python bench/allreduce.py --autotune        # + the 160-tensor case tuned
    hvlrun -np 2 python bench/allreduce.py --json out.json   # + the tables as JSON (bench/ab.py)

Every case is float32, op Sum, in place, median of --iters calls after warm-up (slowest rank per
call; cases of more than 64 MiB take half as many). "hvl out" is the out-of-place form
(``y = hvlite.allreduce(x)``: a new result each call, which from 1 MiB is an engine buffer
reused from call to call), timed call by call in alternation with the in-place "hvlite" (so a
burst of load hits both), and "out/in" its ratio; a second table does the same through
``hvlite.torch`` (``allreduce`` vs ``allreduce_``; not with --no-torch). Phases, in order:
hvlite as configured
(on one host: the shm data plane), mpi4py, the memcpy floor, hvlite restarted with
HVLITE_SHM_DISABLE=1 (its MPI data plane); these phases run --repeat times in turn (this VM's host
moves its CPUs between near and far placements within minutes, which changes the shm and MPI
columns up to 4x, so interleaving keeps the ratios honest; the CPU pair's state, from
bench/core_pair.c, is printed before and after the table) and
each cell is the median of the repeats' medians. gloo runs last, once, because a live gloo
process group was seen to slow the MPI-based columns on this 2-core machine (4 KiB mpi4py from
6 to 32 us).
"160 x 100 KiB" submits 160 named tensors asynchronously and then waits for all of them (hvlite
fuses them); the references make 160 separate calls. #wrong counts result elements that differ
from the expected value in a separate checked call, in both hvlite phases.
"""
import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvlite as hvd
from core_pair import describe, measure
from harness import (add_repeat_args, human, init_gloo, median_over_repeats, memcpy_floor, ms,
                     ratio, restart_engine, timed)
from tables import add_json_arg, print_table, write_json

KIB = 1024
MIB = 1024 * KIB


def check_wrong(run_once, n, size):
    buf = np.ones(n, np.float32)
    run_once(buf)
    return int(np.count_nonzero(buf != size))


def one_tensor_hvlite(nbytes, comm, iters):
    """hvlite's time for one in-place allreduce of nbytes, and the wrong elements of a check."""
    n = nbytes // 4
    buf = np.ones(n, np.float32)
    name = "bench.%d" % nbytes
    t_hvl = timed(lambda: hvd.allreduce_(buf, op=hvd.Sum, name=name), comm, iters)
    return t_hvl, check_wrong(lambda b: hvd.allreduce_(b, op=hvd.Sum, name=name), n, comm.size)


def numpy_ones(n):
    return np.ones(n, np.float32)


def timed_pair(in_place, out_of_place, comm, iters, warmup=3):
    """Median times of the two forms of one case timed alternately, call by call (slowest rank
    per call): a burst of load on this shared machine then hits both forms alike."""
    for _ in range(warmup):
        in_place()
        out_of_place()
    samples = ([], [])
    for _ in range(iters):
        for fn, times in zip((in_place, out_of_place), samples):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(samples[0]), statistics.median(samples[1])


def wrong(array, size):
    return int(np.count_nonzero(np.asarray(array) != size))


def one_tensor_forms(nbytes, comm, iters, api=hvd, ones=numpy_ones):
    """In-place and out-of-place allreduce of nbytes through ``api`` (hvlite, or hvlite.torch
    with torch's ``ones``): ((t_in, wrong), (t_out, wrong)). Out of place is ``y =
    allreduce(x)``: a new result every call, the previous one alive until it is replaced."""
    buf, held = ones(nbytes // 4), [None]
    name_in, name_out = ("bench.%s.%d.%s" % (form, nbytes, api.__name__) for form in ("in", "out"))

    def out_of_place():
        held[0] = api.allreduce(buf, op=api.Sum, name=name_out)
    t_in, t_out = timed_pair(lambda: api.allreduce_(buf, op=api.Sum, name=name_in),
                             out_of_place, comm, iters)
    buf[...] = 1
    out = api.allreduce(buf, op=api.Sum, name=name_out)
    api.allreduce_(buf, op=api.Sum, name=name_in)
    return (t_in, wrong(buf, comm.size)), (t_out, wrong(out, comm.size))


def one_tensor_mpi(nbytes, comm, iters):
    buf = np.ones(nbytes // 4, np.float32)
    return timed(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), comm, iters)


def one_tensor_gloo(nbytes, comm, dist, iters):
    import torch
    tbuf = torch.ones(nbytes // 4, dtype=torch.float32)
    return timed(lambda: dist.all_reduce(tbuf), comm, iters)


def many_tensors_hvlite(count, nbytes, comm, iters):
    bufs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]

    def hvl():
        hs = [hvd.allreduce_async_(b, op=hvd.Sum, name="many.%d" % i) for i, b in enumerate(bufs)]
        for h in hs:
            hvd.synchronize(h)
    t_hvl = timed(hvl, comm, iters)
    for b in bufs:
        b[...] = 1
    hvl()
    return t_hvl, sum(int(np.count_nonzero(b != comm.size)) for b in bufs)


def many_tensors_forms(count, nbytes, comm, iters):
    """The many-tensor step in place and out of place, timed alternately (as one_tensor_forms)."""
    bufs, held = [np.ones(nbytes // 4, np.float32) for _ in range(count)], [None]

    def in_place():
        hs = [hvd.allreduce_async_(b, op=hvd.Sum, name="many.%d" % i) for i, b in enumerate(bufs)]
        for h in hs:
            hvd.synchronize(h)

    def out_of_place():
        hs = [hvd.allreduce_async(b, op=hvd.Sum, name="many.out.%d" % i) for i, b in enumerate(bufs)]
        held[0] = [hvd.synchronize(h) for h in hs]
    t_in, t_out = timed_pair(in_place, out_of_place, comm, iters)
    for b in bufs:
        b[...] = 1
    out_of_place()
    in_place()
    return ((t_in, sum(wrong(b, comm.size) for b in bufs)),
            (t_out, sum(wrong(o, comm.size) for o in held[0])))


def many_tensors_mpi(count, nbytes, comm, iters):
    bufs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]

    def mpi():
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
    return timed(mpi, comm, iters)


def many_tensors_case(count, nbytes, comm, iters):
    """hvlite and mpi4py on the many-tensor step: (t_hvl, t_mpi, wrong) (autotune table)."""
    t_hvl, wrong = many_tensors_hvlite(count, nbytes, comm, iters)
    return t_hvl, many_tensors_mpi(count, nbytes, comm, iters), wrong


def many_tensors_gloo(count, nbytes, comm, dist, iters):
    import torch
    tbufs = [torch.ones(nbytes // 4, dtype=torch.float32) for _ in range(count)]

    def gloo():
        for w in [dist.all_reduce(t, async_op=True) for t in tbufs]:
            w.wait()
    return timed(gloo, comm, iters)


def tune_to_convergence(bufs, comm):
    """Run the many-tensor step until autotune settled on every rank; returns the steps run."""
    steps = 0
    while not comm.allreduce(hvd.engine_tuning()["autotune"] == "converged", op=MPI.LAND):
        hs = [hvd.allreduce_async_(b, op=hvd.Sum, name="many.%d" % i) for i, b in enumerate(bufs)]
        for h in hs:
            hvd.synchronize(h)
        steps += 1
    return steps


def autotune_case(count, nbytes, comm, iters, rounds, tune_env):
    """The many-tensor case: autotune (HVLITE_AUTOTUNE=1 + tune_env) run to convergence and timed
    live; then the start settings vs autotune's choice given as plain settings, the engine
    restarted for each in turn, `rounds` interleaved rounds. Returns (chosen, steps, rows)."""
    start = {n: v for n, v in os.environ.items() if n.startswith(("HVLITE_", "HOROVOD_"))}
    base = {n: v for n, v in start.items() if "AUTOTUNE" not in n}
    restart_engine(hvd, base, dict(tune_env, HVLITE_AUTOTUNE="1"))
    steps = tune_to_convergence([np.ones(nbytes // 4, np.float32) for _ in range(count)], comm)
    chosen = hvd.engine_tuning()
    runs = {"live": [many_tensors_case(count, nbytes, comm, iters)], "start": [], "tuned": []}
    tuned_env = {"HVLITE_FUSION_THRESHOLD": str(chosen["fusion_threshold"]),
                 "HVLITE_CYCLE_TIME": repr(chosen["cycle_time_ms"])}
    if not chosen["response_cache"]:
        tuned_env["HVLITE_CACHE_CAPACITY"] = "0"
    values = {"live": chosen}
    for _ in range(rounds):
        for key, extra in (("start", {}), ("tuned", tuned_env)):
            restart_engine(hvd, base, extra)
            values[key] = hvd.engine_tuning()
            runs[key].append(many_tensors_case(count, nbytes, comm, iters))
    restart_engine(hvd, start, {})
    t_start = statistics.median(r[0] for r in runs["start"])
    rows = []
    for key, label in (("start", "start settings"), ("tuned", "autotune's choice"),
                       ("live", "autotune, live")):
        t_hvl = statistics.median(r[0] for r in runs[key])
        t_mpi = statistics.median(r[1] for r in runs[key])
        v = values[key]
        rows.append(["%d x %s, %s" % (count, human(nbytes), label), human(v["fusion_threshold"]),
                     "%g" % v["cycle_time_ms"], "on" if v["response_cache"] else "off",
                     ms(t_hvl), ms(t_mpi), ratio(t_hvl, t_mpi), ratio(t_hvl, t_start),
                     sum(r[2] for r in runs[key])])
    return chosen, steps, rows


def autotune_table(args, comm, many, iters):
    """--autotune: print the many-tensor case with start settings vs autotune's choice. Autotune
    runs with the AUTOTUNE settings of the environment (tight ones under --smoke). Returns the
    printed table (rank 0), else None."""
    tune_env = {"HVLITE_AUTOTUNE_WARMUP_SAMPLES": "1", "HVLITE_AUTOTUNE_STEPS_PER_SAMPLE": "2",
                "HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "4"} if args.smoke else {}
    tune_env.update((n, v) for n, v in os.environ.items() if "AUTOTUNE" in n)
    rounds = 2 if args.smoke else args.rounds
    chosen, steps, rows = autotune_case(many[0], many[1], comm, iters, rounds, tune_env)
    if comm.rank == 0:
        return print_table(
            "autotune, %d ranks: settled after %d samples (%d steps); start settings vs "
            "autotune's choice as settings, engine restarted for each in turn, median of "
            "%d rounds x %d (times in ms)"
            % (comm.size, chosen["autotune_samples"], steps, rounds, iters),
            ["case", "fusion", "cycle ms", "cache", "hvlite", "mpi4py", "hvl/mpi",
             "vs start", "#wrong"], rows)


def iters_for(nbytes, iters):
    """Calls to time for a case: half as many above 64 MiB (each takes 0.1-1 s here)."""
    return iters if nbytes <= 64 * MIB else max(3, iters // 2)


def hvlite_column(cases, comm, iters):
    """Time hvlite on every case with the engine as it is now: [(t, wrong)] per case."""
    out = []
    for label, nbytes, many in cases:
        n = iters_for(nbytes, iters)
        out.append(many_tensors_hvlite(many[0], many[1], comm, n) if many
                   else one_tensor_hvlite(nbytes, comm, n))
    return out


def forms_column(cases, comm, iters):
    """Every case in place and out of place, the engine as it is now: [((t, wrong), (t, wrong))]."""
    return [many_tensors_forms(many[0], many[1], comm, iters_for(nbytes, iters)) if many
            else one_tensor_forms(nbytes, comm, iters_for(nbytes, iters))
            for label, nbytes, many in cases]


def torch_columns(sizes, comm, iters, torch_api):
    """hvlite.torch in place and out of place per size: {"in": [(t, wrong)], "out": [...]}."""
    api, ones = torch_api
    forms = [one_tensor_forms(n, comm, iters_for(n, iters), api, ones) for n in sizes]
    return {"in": [f[0] for f in forms], "out": [f[1] for f in forms]}


def load_torch():
    """(hvlite.torch, a float32 ``ones``), or None if torch is not installed."""
    try:
        import torch
        import hvlite.torch as api
    except ImportError:
        return None
    return api, lambda n: torch.ones(n, dtype=torch.float32)


def row(label, nbytes, shm, out, hmpi, t_mpi, t_gloo, t_mem, size):
    (t_shm, wrong_shm), (t_out, wrong_out), (t_hmpi, wrong_hmpi) = shm, out, hmpi
    algbw = nbytes / t_shm / 1e9
    busbw = algbw * 2 * (size - 1) / size
    return [label, ms(t_shm), ms(t_out), ms(t_hmpi), ms(t_mpi), ms(t_gloo), ms(t_mem),
            ratio(t_out, t_shm), ratio(t_shm, t_hmpi), ratio(t_shm, t_mpi), ratio(t_shm, t_gloo),
            ratio(t_shm, t_mem), "%.2f" % algbw, "%.2f" % busbw, wrong_shm + wrong_out + wrong_hmpi]


def torch_table(sizes, cells, comm):
    rows = [[human(n), ms(i[0]), ms(o[0]), ratio(o[0], i[0]), i[1] + o[1]]
            for n, i, o in zip(sizes, cells["in"], cells["out"])]
    return print_table("hvlite.torch allreduce float32 Sum, %d ranks: in place (allreduce_) vs out "
                       "of place (allreduce, a new tensor per call); same engine phase as "
                       "\"hvlite\" (times in ms)" % comm.size,
                       ["case", "in place", "out of place", "out/in", "#wrong"], rows)


def torch_cells(runs):
    """Median over repeats of the torch columns (each a list of (t, wrong) per size)."""
    return {form: median_over_repeats([r[form] for r in runs]) for form in ("in", "out")}


def cpu_pair(comm):
    """On a VM, how far apart the first two CPUs are now (bench/core_pair.c; on rank 0, the
    others waiting in hvlite's barrier, which sleeps, where MPI's would spin on a CPU being
    measured): the shm and MPI planes' times at 2 ranks follow it (docs/benchmarks.md)."""
    hvd.barrier()
    found = measure() if comm.rank == 0 else None
    hvd.barrier()
    return found


def main():
    p = argparse.ArgumentParser(description="hvlite allreduce benchmark")
    add_repeat_args(p)
    p.add_argument("--smoke", action="store_true", help="tiny sizes and few iterations (CI)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch gloo column")
    p.add_argument("--max-mib", type=float, default=256, help="largest single-tensor size")
    p.add_argument("--autotune", action="store_true",
                   help="also: the many-tensor case with start settings vs autotune's choice")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds for --autotune")
    add_json_arg(p)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    hvd.init()
    sizes = [4 * KIB, 256 * KIB] if args.smoke else \
        [s for s in (4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
         if s <= args.max_mib * MIB]
    iters, repeat = (5, 1) if args.smoke else (args.iters, args.repeat)
    many = (16, 4 * KIB) if args.smoke else (160, 100 * KIB)
    cases = [(human(n), n, None) for n in sizes]
    cases.append(("%d x %s" % (many[0], human(many[1])), many[0] * many[1], many))
    start = {n: v for n, v in os.environ.items() if n.startswith(("HVLITE_", "HOROVOD_"))}
    runs = {"hvl": [], "out": [], "torch": [], "hmpi": [], "mpi": [], "mem": []}
    th = None if args.no_torch else load_torch()
    pair_before = cpu_pair(comm)
    for _ in range(repeat):
        # hvlite as configured (shm on one host), in place and out of place (NumPy, torch),
        # mpi4py, memcpy; hvlite on its MPI data plane
        forms = forms_column(cases, comm, iters)
        runs["hvl"].append([f[0] for f in forms])
        runs["out"].append([f[1] for f in forms])
        if th:
            runs["torch"].append(torch_columns(sizes, comm, iters, th))
        counters = hvd.engine_counters()
        runs["mpi"].append([many_tensors_mpi(c[2][0], c[2][1], comm, iters) if c[2]
                            else one_tensor_mpi(c[1], comm, iters_for(c[1], iters)) for c in cases])
        runs["mem"].append([memcpy_floor(c[1], comm, iters_for(c[1], iters)) for c in cases])
        restart_engine(hvd, start, {"HVLITE_SHM_DISABLE": "1"})
        runs["hmpi"].append(hvlite_column(cases, comm, iters))
        restart_engine(hvd, start, {})
    backend = "shm" if counters.get("shm_collectives") else "MPI"
    pair_after = cpu_pair(comm)
    dist = None if args.no_torch else init_gloo(comm)    # last: torch.distributed gloo
    gloo = [None] * len(cases)
    if dist:
        gloo = [many_tensors_gloo(c[2][0], c[2][1], comm, dist, iters) if c[2]
                else one_tensor_gloo(c[1], comm, dist, iters_for(c[1], iters)) for c in cases]
    shm, out, hmpi, t_mpi, t_mem = (median_over_repeats(runs[k])
                                    for k in ("hvl", "out", "hmpi", "mpi", "mem"))
    rows = [row(c[0], c[1], a, o, b, m, g, f, comm.size)
            for c, a, o, b, m, g, f in zip(cases, shm, out, hmpi, t_mpi, gloo, t_mem)]
    tables = []
    if comm.rank == 0:
        tables.append(print_table(
            "allreduce float32 Sum, %d ranks, %s; hvlite on its %s data plane, hvl-mpi: "
            "restarted with HVLITE_SHM_DISABLE=1; median of %d repeats x %d calls "
            "(times in ms)" % (comm.size, hvd.mpi_vendor().strip(), backend, repeat, iters),
            ["case", "hvlite", "hvl out", "hvl-mpi", "mpi4py", "gloo", "memcpy", "out/in",
             "hvl/hvl-mpi", "hvl/mpi4py", "hvl/gloo", "hvl/memcpy", "algbw GB/s",
             "busbw GB/s", "#wrong"],
            rows))
        if th:
            tables.append(torch_table(sizes, torch_cells(runs["torch"]), comm))
        print("engine counters of the last hvlite phase:", counters)
        print("before the table: %s\nafter it:         %s" % (describe(pair_before),
                                                            describe(pair_after)))
    if dist:
        dist.destroy_process_group()
    if args.autotune:
        tables.append(autotune_table(args, comm, many, iters))
    if args.json and comm.rank == 0:
        write_json(args.json, tables)
    hvd.shutdown()


if __name__ == "__main__":
    main()
