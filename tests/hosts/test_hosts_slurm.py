"""Slurm for real: a local slurmctld and one slurmd per simulated host (slurm_cluster.py).
launch/slurm.sbatch under `sbatch --wait` on one node and on two, `srun --mpi=pmi2` without
hvlrun, and `srun --mpi=none`, which hvlite must refuse loudly with the fix. Skips, with the
reason, where Slurm is not installed (CI installs it with apt when root) or not root."""
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import MULTIPLIER, ROOT, job_env, skip_unless_possible
from simhosts import SimHosts
import slurm_cluster

JOB = os.path.join(ROOT, "tests", "hosts", "scenarios", "slurm_job.py")
DAEMONS = re.compile(r"^(: )?(slurmd|slurmctld|slurmscriptd)\b")   # the cluster itself


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    skip_unless_possible()
    why = slurm_cluster.missing_requirements()
    if why:
        pytest.skip(why)
    workdir = tmp_path_factory.mktemp("slurm")
    with SimHosts(2, workdir) as sim:
        with slurm_cluster.SlurmCluster(sim, sim.hosts, workdir) as slurm:
            yield slurm


def run(cluster, command, timeout=120):
    """Run a Slurm client command on the first node; fail the test after ``timeout`` s."""
    env = cluster.env(job_env({"HVLRUN_VENV": os.path.dirname(os.path.dirname(sys.executable)),
                               "HVLRUN_FLAGS": "--network-interface eth0"}))
    before = cluster.sim.all_counters()
    try:
        done = subprocess.run(cluster.client(command), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout * MULTIPLIER, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail("%s timed out:\n%s\n%s\n%s" % (command, e.stdout, e.stderr, cluster.logs()))
    after = cluster.sim.all_counters()
    done.traffic = {h: after[h][0] - before[h][0] for h in after}
    left = job_leftovers(cluster.sim)
    assert not left, "left on the nodes after %s: %s" % (command, left)
    return done


def job_leftovers(sim, seconds=10.0):
    """The processes on the nodes besides the Slurm daemons, after up to ``seconds``."""
    deadline = time.monotonic() + seconds * MULTIPLIER
    while True:
        left = {h: [p for p in procs if not DAEMONS.match(p.split(" ", 1)[1])]
                for h, procs in sim.leftovers().items()}
        left = {h: procs for h, procs in left.items() if procs}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def sbatch(cluster, tmp_path, *options):
    out = tmp_path / "job.out"
    done = run(cluster, ["sbatch", "--wait", "-o", str(out), *options,
                         os.path.join(ROOT, "launch", "slurm.sbatch"), sys.executable, JOB])
    text = out.read_text() if out.exists() else ""
    return done, text


def ok_lines(text):
    return re.findall(r"slurm OK rank (\d+) of (\d+) host (\S+) cross_size (\d+)", text)


def test_sbatch_recipe_on_one_node(cluster, tmp_path):
    done, text = sbatch(cluster, tmp_path, "--nodes=1", "--ntasks-per-node=2")
    assert done.returncode == 0, done.stdout + done.stderr + text
    assert sorted(ok_lines(text)) == [("0", "2", "h1", "1"), ("1", "2", "h1", "1")], text


def test_sbatch_recipe_on_two_nodes(cluster, tmp_path):
    done, text = sbatch(cluster, tmp_path, "--nodes=2", "--ntasks-per-node=1")
    assert done.returncode == 0, done.stdout + done.stderr + text
    assert sorted(ok_lines(text)) == [("0", "2", "h1", "2"), ("1", "2", "h2", "2")], text
    assert done.traffic["h2"] > 2_000_000, done.traffic   # the 2 MB allreduce crossed the link


def test_srun_pmi2_without_hvlrun(cluster):
    done = run(cluster, ["srun", "--mpi=pmi2", "--nodes=2", "--ntasks=2", sys.executable, JOB])
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(ok_lines(done.stdout)) == [("0", "2", "h1", "2"), ("1", "2", "h2", "2")], done.stdout


def test_srun_mpi_none_is_refused_with_the_fix(cluster):
    done = run(cluster, ["srun", "--mpi=none", "--nodes=2", "--ntasks=2", sys.executable, JOB])
    assert done.returncode != 0, done.stdout + done.stderr
    assert not ok_lines(done.stdout), done.stdout          # no task ran as a one-rank job
    message = "Slurm started 2 tasks in this step (SLURM_STEP_NUM_TASKS=2) but MPI sees only this process"
    assert done.stderr.count(message) == 2, done.stderr
    assert "srun --mpi=pmi2" in done.stderr, done.stderr
