"""Runs the collective fuzzer (fuzz.py) over its job configurations: ``make fuzz`` (the size CI
runs, through tests/test_fuzz.py) and ``make fuzz-long``.

Usage: python tests/fuzz/run.py [--seed S] [--scale X] [--only NAME]

Contract: each configuration is one hvlrun job of fuzz.py (its ranks and HVLITE_* settings pick
the data planes and paths it reaches) run with a hard timeout; configuration i uses seed S + i
and ``round(sequences * X)`` sequences. Prints each job's FUZZ SUMMARY line, or its failure
output, and a total of the counts; exits 0 only if every job passed. ``run_config`` is what
tests/test_fuzz.py calls. Timeouts stretch with HVLITE_TEST_TIMEOUT_MULTIPLIER.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))

Config = namedtuple("Config", "name ranks sequences env")
CONFIGS = [
    # the defaults: the shared-memory plane, 1 MiB chunks, the response cache. (Sizes keep
    # `make test` within about 2 minutes for all four: most of a run is the desyncs' deadlock
    # waits, HVLITE_DEADLOCK_SECONDS each, not CPU.)
    Config("shm-2", 2, 100, {}),
    # tiny shm chunks, allreduce pieces and fusion buffer (many steps per collective, many
    # batches per cycle), and an 8-entry response cache that evicts all the time
    Config("small-3", 3, 100, {"HVLITE_SHM_CHUNK": "4096", "HVLITE_ALLREDUCE_PIECE": "4096",
                               "HVLITE_FUSION_THRESHOLD": "8192", "HVLITE_CACHE_CAPACITY": "8"}),
    # the MPI data plane only, 4 ranks (oversubscribed on small machines)
    Config("mpi-4", 4, 50, {"HVLITE_SHM_DISABLE": "1"}),
    # two fake hosts: hierarchical allreduce, MPI for sets that span hosts, shm inside one
    Config("hier-4", 4, 50, {"HVLITE_HIERARCHICAL_ALLREDUCE": "1", "HVLITE_TEST_FAKE_HOSTS": "2"}),
]


def timeout_for(sequences):
    return (90 + 2.0 * sequences) * MULTIPLIER


def run_config(config, seed, sequences=None):
    """Runs one configuration; returns (passed, summary dict or None, output text)."""
    sequences = config.sequences if sequences is None else sequences
    env = dict(os.environ, **config.env)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HVLITE_LOG_LEVEL", "error")     # the engine logs each deadlock it finds
    cmd = [sys.executable, "-m", "hvlite.runner", "-np", str(config.ranks), sys.executable,
           "tests/fuzz/fuzz.py", "--seed", str(seed), "--sequences", str(sequences)]
    try:
        job = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=timeout_for(sequences), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return False, None, "TIMEOUT after %.0f s (a hang): %s\n%s" % (
            timeout_for(sequences), " ".join(cmd), out[-8000:])
    out = job.stdout + job.stderr
    summary = None
    for line in job.stdout.splitlines():
        if "FUZZ SUMMARY " in line:
            summary = json.loads(line.split("FUZZ SUMMARY ", 1)[1])
    passed = (job.returncode == 0 and summary is not None
              and summary["plan"].get("sequences") == sequences)
    return passed, summary, out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="run the hvlite collective fuzzer over its configurations")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every configuration's sequences")
    ap.add_argument("--only", help="run only the configuration with this name")
    args = ap.parse_args(argv)
    total, failed, start = Counter(), [], time.monotonic()
    for i, config in enumerate(CONFIGS):
        if args.only and config.name != args.only:
            continue
        sequences = max(1, round(config.sequences * args.scale))
        t0 = time.monotonic()
        passed, summary, out = run_config(config, args.seed + i, sequences)
        print("== %s: %d ranks, seed %d, %d sequences, %s, %.0f s" % (
            config.name, config.ranks, args.seed + i, sequences, "passed" if passed else "FAILED",
            time.monotonic() - t0), flush=True)
        if summary:
            print("FUZZ SUMMARY " + json.dumps(summary, sort_keys=True), flush=True)
            total.update(summary["plan"])
            total.update(summary["outcomes (all ranks)"])
        if not passed:
            failed.append(config.name)
            print(out[-12000:], flush=True)
    print("== total: %s" % json.dumps(dict(sorted(total.items()))))
    print("== %s in %.0f s" % ("FAILED: " + ", ".join(failed) if failed else "all passed",
                               time.monotonic() - start))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
