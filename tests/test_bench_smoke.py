"""CI smoke run of the benchmark at tiny sizes: it must run end to end and every result must be
right (#wrong column 0). Times are printed, never asserted."""
from jobs import run_job


def test_allreduce_bench_smoke():
    job = run_job(2, ["python", "bench/allreduce.py", "--smoke"], timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    rows = [line for line in job.stdout.splitlines() if "KiB" in line and "x" in line]
    assert len(rows) >= 3, out
    assert "hvlite.torch allreduce float32 Sum, 2 ranks: in place" in job.stdout, out
    for line in rows:
        assert line.rstrip().endswith(" 0"), "wrong results in: " + line


def test_allreduce_bench_autotune_smoke():
    """--autotune: autotune settles (tight settings under --smoke) and its rows are right."""
    job = run_job(2, ["python", "bench/allreduce.py", "--smoke", "--no-torch", "--autotune"],
                  timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert "autotune, 2 ranks: settled after 5 samples" in job.stdout, out
    rows = [line for line in job.stdout.splitlines() if "16 x 4 KiB, " in line]
    assert len(rows) == 3, out
    for line in rows:
        assert line.rstrip().endswith(" 0"), "wrong results in: " + line


def test_collectives_bench_smoke():
    """bench/collectives.py: every op on shm and on MPI, right results (#wrong 0)."""
    job = run_job(2, ["python", "bench/collectives.py", "--smoke"], timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    rows = [line for line in job.stdout.splitlines() if "KiB" in line and "x" in line]
    assert len(rows) == 8, out
    assert "shm data plane where it takes the size: yes" in job.stdout, out
    for line in rows:
        assert line.rstrip().endswith(" 0"), "wrong results in: " + line
