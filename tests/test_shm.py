"""Runs the shared-memory data-plane tests (tests/shm) under hvlrun at 2, 3 and 4 ranks (4 is
oversubscribed on small machines: the futex waits must cope), each job with a hard timeout."""
import pytest

from jobs import run_job


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_shm_backend(np_):
    job = run_job(np_, ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/shm"],
                  timeout=240, env={"HVLITE_SPMD": "1"})
    assert job.returncode == 0, "hvlrun -np %d pytest tests/shm failed (rc %d)\n--- stdout\n%s\n--- stderr\n%s" % (
        np_, job.returncode, job.stdout[-6000:], job.stderr[-3000:])
    assert " passed" in job.stdout
