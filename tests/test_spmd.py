"""Runs each SPMD test file of tests/parallel under hvlrun at 2 and 3 ranks (odd sizes catch
ring and split bugs), each job with a hard timeout."""
import glob
import os

import pytest

from jobs import ROOT, run_job

FILES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests/parallel/test_*.py")))


# The timeline tests check the MPI path's phases piece by piece (copy in, MPI_ALLREDUCE, copy
# out); the shm backend streams allreduces without those pieces, so they run with it off.
EXTRA_ENV = {"tests/parallel/test_timeline.py": {"HVLITE_SHM_DISABLE": "1"}}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("path", FILES)
def test_spmd_file(path, np_):
    job = run_job(np_, ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", path],
                  timeout=240, env=dict({"HVLITE_SPMD": "1"}, **EXTRA_ENV.get(path, {})))
    assert job.returncode == 0, "hvlrun -np %d pytest %s failed (rc %d)\n--- stdout\n%s\n--- stderr\n%s" % (
        np_, path, job.returncode, job.stdout[-6000:], job.stderr[-3000:])
    assert " passed" in job.stdout
