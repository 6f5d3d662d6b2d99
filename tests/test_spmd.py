"""Runs the SPMD test files of tests/parallel under hvlrun at 2 and 3 ranks (odd sizes catch
ring and split bugs; TWO_RANKS_ONLY at 2), each job with a hard timeout: the files of one
framework together in one job, the others one job each."""
import glob
import os
import re

import pytest

from jobs import ROOT, run_spmd

FILES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests/parallel/test_*.py")))


# The timeline tests check the MPI path's phases piece by piece (copy in, MPI_ALLREDUCE, copy
# out); the shm backend streams allreduces without those pieces, so they run with it off.
EXTRA_ENV = {"tests/parallel/test_timeline.py": {"HVLITE_SHM_DISABLE": "1"}}

# Keras training and TF1 optimizers test adapter logic over collectives that the other files
# already run at 3 ranks; at 3 ranks on a 2-core machine they cost over a minute of the suite's
# 20 for no path of their own (their process-set cases need only 2 ranks).
# The TF order checks are about one rank's threads: 2 ranks show them.
TWO_RANKS_ONLY = {"tests/parallel/test_tf_training.py", "tests/parallel/test_tf_optimizer_v1.py",
                  "tests/parallel/test_tf_order.py"}


# Files that import a framework share one job per size: importing TensorFlow costs each rank
# 7 s of CPU (torch 3.5 s), paid once per job; on a 2-core machine separate jobs spent 3 minutes
# of the suite on imports. test_tf_order sizes TensorFlow's thread pools its own way (fixed at
# a process's first op), files with an environment of their own keep their own job too, and
# so does test_out_of_place (the sanitizer smoke runs, tools/sanitizers/run.py, pick its job).
ALONE = {"tests/parallel/test_tf_order.py", "tests/parallel/test_out_of_place.py"} | set(EXTRA_ENV)


def _job_of(path):
    """The job a file runs in: "tensorflow" or "torch" where it imports one (TensorFlow first;
    an import inside a test counts), else the file itself."""
    if path in ALONE:
        return path
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    for framework in ("tensorflow", "torch"):
        if re.search(r"^\s*(import|from) (hvlite\.)?%s\b" % framework, text, re.M):
            return framework
    return path


def _cases():
    cases = []
    for np_ in (2, 3):
        jobs = {}
        for path in FILES:
            if np_ == 2 or path not in TWO_RANKS_ONLY:
                jobs.setdefault(_job_of(path), []).append(path)
        cases += [(job, paths, np_) for job, paths in jobs.items()]
    return cases


CASES = _cases()


@pytest.mark.parametrize("job,paths,np_", CASES, ids=["%s-%d" % (job, np_) for job, _, np_ in CASES])
def test_spmd_file(job, paths, np_):
    run_spmd(np_, paths, timeout=max(240, 120 * len(paths)), env=EXTRA_ENV.get(job))
