"""Runs each SPMD test file of tests/parallel under hvlrun at 2 and 3 ranks (odd sizes catch
ring and split bugs; TWO_RANKS_ONLY at 2), each job with a hard timeout."""
import glob
import os

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


CASES = [(path, np_) for path in FILES for np_ in (2, 3)
         if np_ == 2 or path not in TWO_RANKS_ONLY]


@pytest.mark.parametrize("path,np_", CASES, ids=["%s-%d" % case for case in CASES])
def test_spmd_file(path, np_):
    run_spmd(np_, path, timeout=240, env=EXTRA_ENV.get(path))
