"""Runs the Adasum SPMD files where tests/test_spmd.py does not: at 4 ranks (two levels of the
recursion), and with the shared-memory plane off (every collective on MPI), each job with a
hard timeout."""
import pytest

from jobs import run_spmd

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
    run_spmd(np_, path, timeout=300, env=env)
