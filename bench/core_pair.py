"""How far apart two CPUs are right now: ``bench/core_pair.c``, compiled and run.

    python bench/core_pair.py [CPU_A CPU_B]      # one JSON line (see core_pair.c)

Contract: :func:`measure` compiles ``core_pair.c`` with ``$CC`` (default ``cc``) into a
temporary folder, runs it on the two CPUs (default: the first two this process may use) and
returns its numbers as a dict with ``handoff_per_local`` added (how much slower a MiB handed
from one CPU to the other is than one written and read on one CPU: near 1 for hyperthreads of
one core, 10 and more for CPUs whose caches are far apart). It returns None, saying why on
stderr, where there is no compiler, fewer than two CPUs, or the program fails; it never raises.
The benchmarks print it before and after their tables, so a table says which state the VM was in.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core_pair.c")


def measure(cpus=None):
    cpus = list(cpus) if cpus else sorted(os.sched_getaffinity(0))[:2]
    compiler = os.environ.get("CC", "cc")
    if len(cpus) < 2 or shutil.which(compiler) is None:
        sys.stderr.write("core_pair: needs two CPUs and a C compiler (%s)\n" % compiler)
        return None
    with tempfile.TemporaryDirectory(prefix="core-pair-") as folder:
        binary = os.path.join(folder, "core_pair")
        try:
            subprocess.run([compiler, "-O2", "-pthread", SOURCE, "-o", binary], check=True,
                           capture_output=True, timeout=60)
            done = subprocess.run([binary] + [str(c) for c in cpus], check=True,
                                  capture_output=True, text=True, timeout=60)
            found = json.loads(done.stdout)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            sys.stderr.write("core_pair: %s\n" % e)
            return None
    found["handoff_per_local"] = round(found["handoff_ms"] / max(found["local_ms"], 1e-3), 1)
    return found


def describe(found):
    """One line for a benchmark's output."""
    if found is None:
        return "CPU pair: not measured"
    return ("CPUs %d-%d: a cache line's round trip %d ns; a MiB handed from one to the other "
            "%.1fx as slow as on one CPU" % (found["cpus"][0], found["cpus"][1], found["rtt_ns"],
                                               found["handoff_per_local"]))


if __name__ == "__main__":
    result = measure([int(c) for c in sys.argv[1:3]] if len(sys.argv) == 3 else None)
    print(json.dumps(result))
    sys.exit(0 if result else 1)
