"""The cluster recipes in launch/ produce the right hvlrun command (checked with --dry-run,
with a stand-in `scontrol` on PATH, since no Slurm is installed here)."""
import os
import stat
import subprocess
import sys

from jobs import MULTIPLIER, ROOT, job_env


def test_slurm_recipe_builds_hosts_and_rank_count(tmp_path):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nprintf 'node01\\nnode02\\n'\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = job_env({"PATH": "%s:%s:%s" % (tmp_path, os.path.dirname(sys.executable), os.environ["PATH"]),
                   "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NTASKS_PER_NODE": "4(x2)",
                   "SLURM_NTASKS": "8", "HVLRUN_FLAGS": "--dry-run --mpi-flavour mpich",
                   "HVLRUN_VENV": str(tmp_path / "none")})
    out = subprocess.run(["bash", "launch/slurm.sbatch", "python", "train.py", "--lr", "0.1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60 * MULTIPLIER)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "-n 8" in out.stdout and "-hosts node01:4,node02:4" in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith("python train.py --lr 0.1"), out.stdout


def test_slurm_recipe_uneven_tasks_per_node(tmp_path):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nprintf 'a1\\na2\\nb7\\n'\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = job_env({"PATH": "%s:%s:%s" % (tmp_path, os.path.dirname(sys.executable), os.environ["PATH"]),
                   "SLURM_JOB_NODELIST": "a[1-2],b7", "SLURM_TASKS_PER_NODE": "2(x2),1",
                   "SLURM_NTASKS": "5", "HVLRUN_FLAGS": "--dry-run --mpi-flavour mpich",
                   "HVLRUN_VENV": str(tmp_path / "none")})
    env.pop("SLURM_NTASKS_PER_NODE", None)
    out = subprocess.run(["bash", "launch/slurm.sbatch", "python", "train.py"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60 * MULTIPLIER)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "-n 5" in out.stdout and "-hosts a1:2,a2:2,b7:1" in out.stdout, out.stdout


def test_hostfile_example_parses():
    out = subprocess.run([sys.executable, "-m", "hvlite.runner", "--dry-run", "--mpi-flavour", "mpich",
                          "--hostfile", "launch/hostfile.example", "-np", "8", "python", "x.py"],
                         cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=60 * MULTIPLIER)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "-hosts node01:4,node02:4" in out.stdout, out.stdout
