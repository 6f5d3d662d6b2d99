"""CI smoke runs of the benchmarks at tiny sizes: each must run end to end and every result must
be right (#wrong column 0). Times are printed, never asserted."""
import json
import os
import subprocess
import sys

import pytest

from jobs import MULTIPLIER, ROOT, job_env, run_job


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


def test_adasum_bench_smoke():
    """bench/adasum.py: Adasum and Sum, one tensor and fused, right results (#wrong 0)."""
    job = run_job(2, ["python", "bench/adasum.py", "--smoke"], timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    rows = [line for line in job.stdout.splitlines() if "KiB" in line and "x " in line]
    assert len(rows) == 2, out
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


def test_step_overhead_bench_smoke(tmp_path):
    """bench/step_overhead.py: paired steps for both models on both data planes, the tables and
    the raw per-round times in --json (4 items per round; backward ends within its step)."""
    out_json = tmp_path / "step_overhead.json"
    job = run_job(2, ["python", "bench/step_overhead.py", "--smoke", "--json", str(out_json)],
                  timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert "training-step overhead of gradient communication, 2 ranks" in job.stdout, out
    assert "(unused" not in job.stdout, out      # the shm plane really ran on one host
    result = json.loads(out_json.read_text())
    overhead, parts, engine, planes = result["tables"]
    assert [tuple(r[:2]) for r in overhead["rows"]] == [
        ("mlp", "shm"), ("mlp", "mpi"), ("resnet", "shm"), ("resnet", "mpi")], out
    assert all(isinstance(r[overhead["columns"].index("overhead med")], float)
               for r in overhead["rows"]), overhead
    assert [tuple(r[:2]) for r in parts["rows"]] == [tuple(r[:2]) for r in overhead["rows"]], out
    assert [r[0] for r in planes["rows"]] == ["mlp", "resnet"], out
    # each round: at least the step's batch and the hvl allreduce; no CUDA here, nothing held
    assert [r[0] for r in engine["rows"]] == ["shm", "mpi"], engine
    assert all(r[1] >= 4 and float(r[2]) >= 2 and float(r[3]) == 0 and float(r[4]) == 0
               for r in engine["rows"]), engine
    assert result["columns"] == ["dist", "plain", "hvl", "mpi4py", "dist backward",
                                 "plain backward"]
    for cell, rounds in result["seconds"].items():
        assert len(rounds) == 4 and all(len(r) == 6 and min(r) > 0 for r in rounds), cell
        assert all(r[4] < r[0] and r[5] < r[1] for r in rounds), cell


def test_step_overhead_against_ddp_smoke(tmp_path):
    """--ddp: a third copy of the model steps under torch DDP (gloo here) in the same rounds, and
    a table pairs hvlite's overhead with DDP's."""
    out_json = tmp_path / "step_overhead_ddp.json"
    job = run_job(2, ["python", "bench/step_overhead.py", "--smoke", "--ddp", "--models", "mlp",
                      "--planes", "shm", "--json", str(out_json)], timeout=180)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    result = json.loads(out_json.read_text())
    ddp = result["tables"][-1]
    assert "hvlite DistributedOptimizer vs torch DDP (gloo)" in ddp["title"], ddp
    assert [tuple(r[:2]) for r in ddp["rows"]] == [("mlp", "shm")], ddp
    assert all(isinstance(r[ddp["columns"].index("DDP ovh")], float) for r in ddp["rows"]), ddp
    assert result["columns"] == ["dist", "plain", "hvl", "mpi4py", "ddp", "dist backward",
                                 "plain backward", "ddp backward"]
    for cell, rounds in result["seconds"].items():
        assert all(min(r) > 0 and r[7] < r[4] for r in rounds), cell     # ddp backward < step


def test_ab_runner_smoke(tmp_path):
    """bench/ab.py, one round of this checkout against itself on the allreduce smoke run: both
    sides resolve hvlite here, both tables and the B/A comparison print, results right."""
    cmd = [sys.executable, "bench/ab.py", "--a", ROOT, "--b", ROOT, "--rounds", "1",
           "--out", str(tmp_path), "--", "hvlrun", "-np", "2", "python", "bench/allreduce.py",
           "--smoke", "--no-torch"]
    try:
        job = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True,
                             timeout=180 * MULTIPLIER, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail("bench/ab.py timed out (a hang): %s" % e)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert "A: %s (hvlite: %s" % (ROOT, os.path.join(ROOT, "hvlite", "__init__.py")) in out, out
    assert "1 rounds, order AB" in out, out
    assert "A: median of 1 runs" in out and "B: median of 1 runs" in out, out
    compared = [line.split() for line in job.stdout.splitlines() if " hvlite " in line
                and "KiB" in line and line.rstrip()[-1].isdigit()]
    assert len(compared) == 3, out             # 4 KiB, 256 KiB, 16 x 4 KiB: A, B, B/A, range
    for name in ("a1", "b1"):
        tables = json.loads((tmp_path / (name + ".json")).read_text())["tables"]
        assert all(r[-1] == 0 for r in tables[0]["rows"]), tables   # #wrong


def test_elastic_reform_bench_smoke():
    """bench/elastic_reform.py (it runs hvlrun itself): one NumPy 2 -> 1 re-form, every column."""
    job = subprocess.run([sys.executable, "bench/elastic_reform.py", "--smoke"], cwd=ROOT,
                         env=job_env(), capture_output=True, text=True, timeout=180 * MULTIPLIER)
    assert job.returncode == 0, job.stdout + job.stderr
    row = [line for line in job.stdout.splitlines() if line.startswith("numpy ")]
    assert len(row) == 1 and len(row[0].split()) == 8, job.stdout
    assert all(float(v) > 0 for v in row[0].split()[2:]), job.stdout


def _synthetic(extra):
    job = run_job(2, ["python", "examples/pytorch_synthetic_benchmark.py", "--model", "mlp",
                      "--batch-size", "4", "--num-warmup-batches", "1",
                      "--num-batches-per-iter", "2", "--num-iters", "3"] + extra, timeout=180)
    assert job.returncode == 0, job.stdout + job.stderr
    return [line.split(": ", 1)[-1] for line in job.stdout.splitlines()
            if line.startswith("[0]")]


def test_synthetic_benchmark_prints_horovods_lines():
    """examples/pytorch_synthetic_benchmark.py takes Horovod's flags and prints its lines: one
    per iteration, the mean +- 1.96 std per device, the total on all devices (on CPUs here)."""
    lines = _synthetic([])
    assert lines[:3] == ["Model: mlp", "Batch size: 4", "Number of CPUs: 2"], lines
    iters = [float(l.split()[2]) for l in lines if l.startswith("Iter #")]
    assert len(iters) == 3 and min(iters) > 0, lines
    per = [l for l in lines if l.startswith("Img/sec per CPU: ")]
    total = [l for l in lines if l.startswith("Total img/sec on 2 CPU(s): ")]
    assert len(per) == 1 and len(total) == 1, lines
    mean, conf = (float(v) for v in per[0].split(": ")[1].split(" +-"))
    assert abs(mean - sum(iters) / 3) < 0.1 and conf >= 0, lines
    assert abs(float(total[0].split(": ")[1].split(" +-")[0]) - 2 * mean) < 0.2, lines


def test_synthetic_benchmark_adasum_fp16_json():
    """--use-adasum, --fp16-allreduce and --json (bench/torch_training.py's form) together."""
    lines = _synthetic(["--use-adasum", "--fp16-allreduce", "--json"])
    result = json.loads([l for l in lines if l.startswith("{")][0])
    assert result["model"] == "mlp" and result["ranks"] == 2, lines
    assert result["samples_per_s"] > 0 and result["parameter_tensors"] == 10, lines


def test_synthetic_benchmark_unknown_model():
    job = run_job(2, ["python", "examples/pytorch_synthetic_benchmark.py", "--model", "nosuch"],
                  timeout=120)
    assert job.returncode != 0
    assert "unknown model 'nosuch'" in job.stdout + job.stderr, job.stdout + job.stderr


@pytest.mark.parametrize("command", [["bench/gpu_allreduce.py"], ["bench/gpu_nccl.py"],
                                     ["bench/step_overhead.py", "--device", "cuda"]],
                         ids=["gpu_allreduce", "gpu_nccl", "step_overhead_cuda"])
def test_gpu_benchmarks_without_a_gpu_say_so(command):
    """On a machine where torch sees no GPU, a GPU benchmark ends on every rank saying why (it
    used to end in a ZeroDivisionError from the local rank modulo 0 GPUs)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU (tools/gpu_check.sh runs these benchmarks there)")
    job = run_job(2, ["python"] + command, timeout=120)
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    for rank in (0, 1):
        assert ("[%d]<stderr>: %s needs a CUDA GPU, and torch sees none" % (rank, command[0])) in out, out
    assert "ZeroDivisionError" not in out, out
