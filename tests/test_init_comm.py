"""``init(comm=...)``: two groups side by side in one job, at 3 and 4 ranks, as mpi4py
communicators and as lists of ranks (tests/scenarios/init_comm.py says what each rank checks)."""
import pytest

from jobs import assert_job_left_no_files, run_job


@pytest.mark.parametrize("np_", [3, 4])
@pytest.mark.parametrize("mode", ["comm", "ranks"])
def test_two_worlds_side_by_side(mode, np_):
    job = run_job(np_, ["python", "tests/scenarios/init_comm.py", mode], timeout=120, watch_files=True)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-6000:]
    assert job.stdout.count("init_comm OK") == np_, out[-6000:]
    assert_job_left_no_files(job, out)
