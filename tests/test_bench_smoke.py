"""CI smoke run of the benchmark at tiny sizes: it must run end to end and every result must be
right (#wrong column 0). Times are printed, never asserted."""
from jobs import run_job


def test_allreduce_bench_smoke():
    job = run_job(2, ["python", "bench/allreduce.py", "--smoke"], timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    rows = [line for line in job.stdout.splitlines() if "KiB" in line and "x" in line]
    assert len(rows) >= 3, out
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


def test_elastic_reform_bench_smoke():
    """bench/elastic_reform.py (it runs hvlrun itself): one NumPy 2 -> 1 re-form, every column."""
    import subprocess
    import sys
    from jobs import MULTIPLIER, ROOT, job_env
    job = subprocess.run([sys.executable, "bench/elastic_reform.py", "--smoke"], cwd=ROOT,
                         env=job_env(), capture_output=True, text=True, timeout=180 * MULTIPLIER)
    assert job.returncode == 0, job.stdout + job.stderr
    row = [line for line in job.stdout.splitlines() if line.startswith("numpy ")]
    assert len(row) == 1 and len(row[0].split()) == 7, job.stdout
    assert all(float(v) > 0 for v in row[0].split()[2:]), job.stdout
