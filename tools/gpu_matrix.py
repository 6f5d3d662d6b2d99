"""Each test function of the GPU suite's SPMD files as its own hvlrun job, several jobs at a time,
so that on a GPU machine lent for minutes one failure does not hide the tests after it (a job
stops at its first failure on any rank: tests/spmd_plugin.py).

Contract:
    python tools/gpu_matrix.py [--np 1 2] [--planes shared-gpu nccl-hostid] [--jobs 6]
                               [--timeout 60] [--files FILE ...] [--exclude TEST ...] [--out DIR]
    Runs, for every rank count, every plane and every ``def test_*`` of each file (all its
    parameters in one job), ``hvlrun -np N python3 -m pytest -q -x FILE::TEST`` under a hard
    timeout, with the file's environment from tests/test_gpu.py (SPMD_FILES) and the plane's
    (PLANES: ``shared-gpu``, the ranks as they are, sharing the GPU: staged; ``nccl-hostid``, an
    NCCL_HOSTID per rank: NCCL over loopback sockets). At one rank only ``shared-gpu`` runs.
    Writes each job's output to DIR/jobs/, and DIR/matrix.txt: one line per job (passed, failed,
    timeout or skipped; seconds; the job's last summary line or failure), then the counts.
    Tests that fill the GPU on purpose (SOLO) run after the others, one at a time: beside other
    jobs they starve them of memory, and their own room is not what they planned.
    Exit status 0 whatever the results (it reports, the jobs' own logs say why).
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_gpu import PLANES, SPMD_FILES  # noqa: E402

SUMMARY = re.compile(r"\d+ (passed|failed|skipped|error)[^\n]*")
SOLO = ("test_no_gpu_room_for_results_runs_the_batch_staged",)
FAILED = re.compile(r"\[rank (\d+)\] (FAILED|ERROR collecting) (\S+)")


def hvlrun():
    """The hvlrun beside this Python (a venv's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "hvlrun")
    return here if os.path.exists(here) else "hvlrun"


def test_names(path):
    return re.findall(r"^def (test_\w+)\(", open(os.path.join(ROOT, path)).read(), flags=re.M)


def run(job, out, timeout):
    np_, plane, path, name = job
    log = os.path.join(out, "jobs", "%s-np%d-%s-%s.log" % (plane, np_, os.path.basename(path)[:-3], name))
    env = dict(os.environ, HVLITE_SPMD="1", NCCL_SOCKET_IFNAME="lo",
               NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"), **SPMD_FILES[path], **PLANES[plane])
    cmd = ["timeout", "-k", "10", str(timeout), hvlrun(), "-np", str(np_), sys.executable, "-m",
           "pytest", "-q", "-x", "-p", "no:cacheprovider", "%s::%s" % (path, name)]
    start = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    text = open(log, errors="replace").read()
    failed = FAILED.search(text)
    if rc in (124, 137):
        word, why = "timeout", "no result in %d s" % timeout
    elif rc == 0:
        summaries = [m.group(0) for m in SUMMARY.finditer(text)]
        why = summaries[-1] if summaries else ""
        word = "passed" if " passed" in why else "skipped"
    else:
        word = "failed"
        why = ("rank %s: %s" % (failed.group(1), failed.group(3))) if failed else "rc %d" % rc
        error = re.findall(r"^(?:\[\d+\]<std\w+>: )?E +(.*)$", text, flags=re.M)
        if error:
            why += " | " + error[0][:300]
    return "%-8s %-11s np=%d %-44s %5.0fs  %s" % (word, plane, np_, "%s::%s" % (
        os.path.basename(path), name), seconds, why)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--planes", nargs="+", default=sorted(PLANES), choices=sorted(PLANES))
    ap.add_argument("--jobs", type=int, default=6, help="jobs at a time")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per job")
    ap.add_argument("--files", nargs="+", default=list(SPMD_FILES), choices=list(SPMD_FILES))
    ap.add_argument("--out", default="gpu-matrix")
    ap.add_argument("--exclude", nargs="+", default=[], metavar="TEST", help="tests not to run")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "jobs"), exist_ok=True)
    jobs = [(np_, plane, path, name) for np_ in args.np for plane in args.planes
            if np_ > 1 or plane == "shared-gpu" for path in args.files for name in test_names(path)
            if name not in args.exclude]
    lines = []
    shared = [job for job in jobs if job[3] not in SOLO]
    with open(os.path.join(args.out, "matrix.txt"), "w") as f:
        def report(line):
            lines.append(line)
            print(line, flush=True)
            f.write(line + "\n")
            f.flush()
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for line in pool.map(lambda job: run(job, args.out, args.timeout), shared):
                report(line)
        for job in [job for job in jobs if job[3] in SOLO]:
            report(run(job, args.out, args.timeout))
        words = [line.split()[0] for line in lines]
        counts = ", ".join("%s %d" % (w, words.count(w)) for w in sorted(set(words)))
        f.write("%d jobs: %s\n" % (len(jobs), counts))
    print("%d jobs: %s" % (len(jobs), counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
