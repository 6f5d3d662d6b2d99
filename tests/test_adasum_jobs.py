"""Runs the Adasum SPMD files where tests/test_spmd.py does not: at 4 ranks (two levels of the
recursion), and with the shared-memory plane off (every collective on MPI), each job with a
hard timeout."""
import pytest

from jobs import run_job

CASES = [
    ("tests/parallel/test_adasum.py", 4, {}),
    ("tests/parallel/test_adasum.py", 2, {"HVLITE_SHM_DISABLE": "1"}),
    ("tests/parallel/test_adasum.py", 4, {"HVLITE_SHM_DISABLE": "1"}),
    ("tests/parallel/test_adasum_torch.py", 4, {}),
]


@pytest.mark.parametrize("path,np_,env", CASES,
                         ids=["%s-np%d%s" % (p.split("/")[-1][:-3], n, "-noshm" if e else "")
                              for p, n, e in CASES])
def test_adasum_job(path, np_, env):
    job = run_job(np_, ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", path],
                  timeout=300, env=dict({"HVLITE_SPMD": "1"}, **env))
    assert job.returncode == 0, "hvlrun -np %d pytest %s failed (rc %d)\n--- stdout\n%s\n" \
        "--- stderr\n%s" % (np_, path, job.returncode, job.stdout[-6000:], job.stderr[-3000:])
    assert " passed" in job.stdout
