"""hvlrun's default remote shell for real: OpenSSH's sshd on each simulated host (port 2222, a
key made for the test), reached with ``--ssh-port`` and ``--ssh-identity-file``. The ssh client's
``~/.ssh`` is the test's own directory (a private mount namespace), so nothing of the machine's
ssh setup is read or changed. Skips where sshd or ssh-keygen is missing (CI installs
openssh-server with apt when root)."""
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import MULTIPLIER, ROOT, job_env, skip_unless_possible
from simhosts import SimHosts

JOB = os.path.join(ROOT, "tests", "hosts", "scenarios", "slurm_job.py")
PORT = 2222
SSHD_CONFIG = """Port %(port)d
ListenAddress %(addr)s
HostKey %(dir)s/host_key
AuthorizedKeysFile %(dir)s/authorized_keys
PidFile %(dir)s/sshd-%(host)s.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
"""


def keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   timeout=30)


@pytest.fixture(scope="module")
def ssh_hosts(tmp_path_factory):
    """Two simulated hosts, each running sshd; yields (sim, workdir)."""
    skip_unless_possible()
    if not (os.path.exists("/usr/sbin/sshd") and shutil.which("ssh") and shutil.which("ssh-keygen")):
        pytest.skip("OpenSSH server/client not installed (apt-get install openssh-server)")
    workdir = tmp_path_factory.mktemp("ssh")
    keygen(workdir / "host_key")
    keygen(workdir / "id_test")
    shutil.copy(workdir / "id_test.pub", workdir / "authorized_keys")
    dotssh = workdir / "dotssh"
    dotssh.mkdir(mode=0o700)
    os.makedirs("/run/sshd", exist_ok=True)          # sshd's privilege separation directory
    with SimHosts(2, workdir) as sim:
        host_key = (workdir / "host_key.pub").read_text().split()
        (dotssh / "known_hosts").write_text("".join(
            "[%s]:%d %s %s\n" % (sim.addr(h), PORT, host_key[0], host_key[1]) for h in sim.hosts))
        daemons = []
        for host in sim.hosts:
            conf = workdir / ("sshd-%s.conf" % host)
            conf.write_text(SSHD_CONFIG % {"port": PORT, "addr": sim.addr(host), "dir": workdir,
                                           "host": host})
            daemons.append(subprocess.Popen(
                sim.enter(host) + ["unshare", "--uts", "--mount", "/bin/sh", "-c",
                                   "hostname %s && mount -t tmpfs tmpfs /dev/shm && exec "
                                   "/usr/sbin/sshd -D -e -f %s" % (host, conf)],
                stdout=subprocess.DEVNULL, stderr=open(workdir / ("sshd-%s.log" % host), "wb")))
        wait_for_ports(sim)
        try:
            yield sim, workdir
        finally:
            for daemon in daemons:
                daemon.terminate()
                daemon.wait(timeout=10)


def wait_for_ports(sim):
    deadline = time.monotonic() + 10
    for host in sim.hosts:
        while subprocess.run(sim.enter("h1") + ["bash", "-c", "echo > /dev/tcp/%s/%d" % (sim.addr(host), PORT)],
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "sshd on %s did not start" % host
            time.sleep(0.1)


def run_over_ssh(sim, workdir, identity, args, timeout=120):
    """hvlrun on h1 with -H over the hosts' addresses, through ssh; ~/.ssh is the test's."""
    hosts = ",".join("%s:1" % sim.addr(h) for h in sim.hosts)
    hvlrun = [sys.executable, "-m", "hvlite.runner", "-H", hosts, "--ssh-port", str(PORT),
              "--ssh-identity-file", str(identity), "--network-interface", "eth0"] + args
    os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)   # the mount point
    argv = sim.enter("h1") + ["unshare", "--mount", "/bin/sh", "-c",
                              'mount --bind "$0" /root/.ssh && exec "$@"', str(workdir / "dotssh")] + hvlrun
    try:
        return subprocess.run(argv, cwd=ROOT, env=job_env(), capture_output=True, text=True,
                              timeout=timeout * MULTIPLIER, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail("hvlrun over ssh timed out:\n%s\n%s" % (e.stdout, e.stderr))


def job_processes(sim):
    """Processes on the hosts besides sshd itself."""
    return {h: [p for p in procs if "sshd -D" not in p] for h, procs in sim.leftovers().items()
            if any("sshd -D" not in p for p in procs)}


def test_job_over_real_ssh(ssh_hosts):
    sim, workdir = ssh_hosts
    before = sim.counters("h2")
    done = run_over_ssh(sim, workdir, workdir / "id_test", [sys.executable, JOB])
    assert done.returncode == 0, done.stdout + done.stderr
    found = sorted(re.findall(r"slurm OK rank (\d) of 2 host (\S+) cross_size 2", done.stdout))
    # h1's address is this network namespace's own: mpiexec starts rank 0 without ssh, beside
    # hvlrun (hostname not h1); rank 1 came through sshd on h2
    assert found == [("0", socket.gethostname()), ("1", "h2")], done.stdout + done.stderr
    assert sim.counters("h2")[0] - before[0] > 2_000_000
    deadline = time.monotonic() + 10 * MULTIPLIER
    while job_processes(sim) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not job_processes(sim), job_processes(sim)


def test_wrong_key_is_named_with_the_host(ssh_hosts):
    sim, workdir = ssh_hosts
    if not (workdir / "id_other").exists():
        keygen(workdir / "id_other")
    done = run_over_ssh(sim, workdir, workdir / "id_other", [sys.executable, JOB], timeout=60)
    assert done.returncode == 125, done.stdout + done.stderr
    # h1's address is hvlrun's own: only h2 is reached through ssh
    assert "host %s is not reachable" % sim.addr("h2") in done.stderr, done.stderr
    assert "host %s is not reachable" % sim.addr("h1") not in done.stderr, done.stderr
    assert "Permission denied (publickey)" in done.stderr, done.stderr
    assert "slurm OK" not in done.stdout
