"""Seconds from a worker's death to the first step of the re-formed elastic job.

``python bench/elastic_reform.py [--ranks 3 2] [--frameworks numpy torch] [--params N]
[--repeat R] [--smoke]`` runs, for each framework and rank count n, ``hvlrun -np n --min-np
n-1 --host-discovery-script ...`` on this machine over a worker (this file with ``--worker``)
that trains, commits every 5 steps, and at step 12 has its last rank drop its slot from the
discovered hosts and SIGKILL itself. Per run it times, from that death (the worker's own clock
just before the kill): when hvlrun logged the world's end, when it started the new world, and
the new world's first step (its rank 0's clock after the commit is restored and checked on every
rank); and, for comparison, the first world's cold start (hvlrun's start to its first step),
and the milliseconds one ``state.commit()`` takes on rank 0 in the first world (median).
Each cell is the median over ``--repeat`` runs. A table, never an assertion; ``--smoke`` runs
one tiny case (CI).
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILL_STEP = 12


def worker(opts):
    """One rank of the benchmarked job."""
    import numpy as np
    world = int(os.environ.get("HVLRUN_ELASTIC_WORLD", "0"))
    if opts.framework == "torch":
        import torch
        import hvlite.torch as hvd
        hvd.init()
        width = max(1, int((opts.params / 2) ** 0.5))
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 1))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                                       named_parameters=model.named_parameters())
        state = hvd.elastic.TorchState(model, opt, step=0)

        def step():
            opt.zero_grad()
            model(torch.randn(8, width)).pow(2).mean().backward()
            opt.step()
    else:
        import hvlite as hvd
        from hvlite.elastic import ObjectState
        hvd.init()
        state = ObjectState(weights=np.zeros(opts.params, np.float32), step=0)

        def step():
            state.weights -= 1e-3 * hvd.allreduce(np.ones(opts.params, np.float32), name="grad")

    from hvlite.elastic import run

    @run
    def train(state):
        if hvd.rank() == 0:
            print("FIRST-STEP w=%d t=%.6f" % (world, time.time()), flush=True)
        while state.step < opts.steps:
            if world == 1 and state.step == KILL_STEP and hvd.rank() == hvd.size() - 1:
                with open(opts.hosts_file + ".tmp", "w") as f:
                    f.write("localhost:%d\n" % (hvd.size() - 1))
                os.replace(opts.hosts_file + ".tmp", opts.hosts_file)
                print("KILL t=%.6f" % time.time(), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            step()
            state.step += 1
            time.sleep(0.02)
            if state.step % 5 == 0:
                began = time.perf_counter()
                state.commit()
                if hvd.rank() == 0:
                    print("COMMIT w=%d ms=%.3f" % (world, (time.perf_counter() - began) * 1e3),
                          flush=True)
    train(state)


class Run:
    """One hvlrun of the benchmark; lines of its output with their arrival times."""

    def __init__(self, framework, ranks, params, steps):
        self.tmp = tempfile.mkdtemp(prefix="hvl-elastic-bench-")
        self.hosts = os.path.join(self.tmp, "hosts")
        with open(self.hosts, "w") as f:
            f.write("localhost:%d\n" % ranks)
        script = os.path.join(self.tmp, "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % self.hosts)
        os.chmod(script, 0o755)
        cmd = [sys.executable, "-m", "hvlite.runner", "-np", str(ranks), "--min-np",
               str(ranks - 1), "--host-discovery-script", script, sys.executable,
               os.path.abspath(__file__), "--worker", "--framework", framework, "--params",
               str(params), "--steps", str(steps), "--hosts-file", self.hosts]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.lines = []
        self.start = time.time()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))
        self.rc = self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def at(self, pattern):
        """(arrival time, match) of the first line matching ``pattern``."""
        for t, line in self.lines:
            m = re.search(pattern, line)
            if m:
                return t, m
        raise RuntimeError("no line matches %r (rc %d):\n%s" % (
            pattern, self.rc, "".join(l for _, l in self.lines[-40:])))

    def times(self):
        died = float(self.at(r"KILL t=([0-9.]+)")[1].group(1))
        first1 = float(self.at(r"FIRST-STEP w=1 t=([0-9.]+)")[1].group(1))
        first2 = float(self.at(r"FIRST-STEP w=2 t=([0-9.]+)")[1].group(1))
        ended = self.at(r"hvlrun: elastic: world 1 ended")[0]
        started = self.at(r"hvlrun: elastic: re-forming: world 1")[0]
        took = float(self.at(r"the re-form took ([0-9.]+) s")[1].group(1))
        commits = [float(m.group(1)) for _, line in self.lines
                   for m in [re.search(r"COMMIT w=1 ms=([0-9.]+)", line)] if m]
        return {"cold start": first1 - self.start, "noticed": ended - died,
                "relaunched": started - died, "first step": first2 - died, "hvlrun says": took,
                "commit (ms)": statistics.median(commits)}


COLUMNS = ("cold start", "noticed", "relaunched", "first step", "hvlrun says", "commit (ms)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--framework", default="numpy", help=argparse.SUPPRESS)
    parser.add_argument("--hosts-file", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 2])
    parser.add_argument("--frameworks", nargs="+", default=["numpy", "torch"])
    parser.add_argument("--params", type=int, default=1 << 20, help="model size (float32 values)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    opts = parser.parse_args()
    if opts.worker:
        return worker(opts)
    if opts.smoke:
        opts.ranks, opts.frameworks, opts.params, opts.repeat = [2], ["numpy"], 1000, 1
        opts.steps = 20
    print("elastic re-form, this machine (%d cores); seconds after the worker's death, median of "
          "%d runs; model %d float32 values (%.1f MiB commits)" % (
              os.cpu_count(), opts.repeat, opts.params, opts.params * 4 / 2 ** 20))
    print("%-8s %-7s" % ("worker", "ranks") + "".join("%13s" % c for c in COLUMNS))
    for framework in opts.frameworks:
        for ranks in opts.ranks:
            results = [Run(framework, ranks, opts.params, opts.steps).times()
                       for _ in range(opts.repeat)]
            cells = [statistics.median(r[c] for r in results) for c in COLUMNS]
            print("%-8s %-7s" % (framework, "%d->%d" % (ranks, ranks - 1))
                  + "".join("%13.2f" % c for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
