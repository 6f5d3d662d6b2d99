"""The cluster recipes in launch/ produce the right hvlrun command, checked with --dry-run: the
Slurm batch script with a stand-in `scontrol` on PATH (tests/hosts/test_hosts_slurm.py runs it
under a real Slurm), the hostfile example, and the Kubernetes MPIJob against the hostfile the
MPI Operator writes for it."""
import os
import stat
import subprocess
import sys

import pytest

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


def dry_run(args):
    out = subprocess.run([sys.executable, "-m", "hvlite.runner", "--dry-run", "--mpi-flavour", "mpich",
                          *args], cwd=ROOT, env=job_env({"OMP_NUM_THREADS": "1"}), capture_output=True,
                         text=True, timeout=60 * MULTIPLIER)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_kubernetes_mpijob_runs_what_hvlrun_dry_run_gives_for_its_hosts(tmp_path):
    """The MPIJob parses; its launcher command, given the hostfile the MPI Operator writes for it,
    is hvlrun's dry run for the same hosts given with -H; the workers run the sshd it expects."""
    yaml = pytest.importorskip("yaml")
    kube = os.path.join(ROOT, "launch", "kubernetes")
    with open(os.path.join(kube, "mpijob.yaml")) as f:
        doc = yaml.safe_load(f)
    assert doc["apiVersion"] == "kubeflow.org/v2beta1" and doc["kind"] == "MPIJob"
    spec = doc["spec"]
    assert spec["mpiImplementation"] == "MPICH" and spec["sshAuthMountPath"] == "/root/.ssh"
    replicas = spec["mpiReplicaSpecs"]
    assert replicas["Launcher"]["replicas"] == 1
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]["command"]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]["command"]
    workers, slots = replicas["Worker"]["replicas"], spec["slotsPerWorker"]
    name, namespace = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
    # what the operator (v2, MPICH) writes to /etc/mpi/hostfile
    hosts = ["%s-worker-%d.%s.%s.svc" % (name, i, name, namespace) for i in range(workers)]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join("%s:%d\n" % (h, slots) for h in hosts))
    assert launcher[0] == "hvlrun" and "/etc/mpi/hostfile" in launcher
    args = [str(hostfile) if a == "/etc/mpi/hostfile" else a for a in launcher[1:]]
    at = args.index("--hostfile")
    by_hand = args[:at] + ["-H", ",".join("%s:%d" % (h, slots) for h in hosts)] + args[at + 2:]
    command = dry_run(args)
    assert command == dry_run(by_hand)
    assert args[args.index("-np") + 1] == str(workers * slots)
    assert " -n %d -hosts %s " % (workers * slots, ",".join("%s:%d" % (h, slots) for h in hosts)) in command
    assert "-launcher rsh" in command and "-iface eth0" in command, command
    assert "export HVLRUN_RSH='ssh -o BatchMode=yes -o ConnectTimeout=10 -p 2222'" in command, command
    port = args[args.index("--ssh-port") + 1]
    assert worker[0] == "/usr/sbin/sshd" and "-D" in "".join(worker[1:])
    with open(os.path.join(kube, "Dockerfile")) as f:
        assert "Port %s" % port in f.read()
