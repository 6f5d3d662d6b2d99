"""Runs each SPMD test file of tests/parallel under hvlrun at 2 and 3 ranks (odd sizes catch
ring and split bugs), each job with a hard timeout."""
import glob
import os

import pytest

from jobs import ROOT, run_spmd

FILES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests/parallel/test_*.py")))


# The timeline tests check the MPI path's phases piece by piece (copy in, MPI_ALLREDUCE, copy
# out); the shm backend streams allreduces without those pieces, so they run with it off.
EXTRA_ENV = {"tests/parallel/test_timeline.py": {"HVLITE_SHM_DISABLE": "1"}}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("path", FILES)
def test_spmd_file(path, np_):
    run_spmd(np_, path, timeout=240, env=EXTRA_ENV.get(path))
