"""A real Slurm cluster (Debian's slurm-wlm) on simulated hosts, for the Slurm tests.

Contract:
  * ``SlurmCluster(sim, nodes, workdir)`` writes a slurm.conf and starts, in the foreground as
    children of this process: one munged on a private socket (a unix socket: every namespace
    sees it), slurmctld on the first node and one slurmd per node, each daemon in its node's
    network namespace with the node's hostname (a private /dev/shm for slurmd, as on a real
    node). ``start()`` returns once ``sinfo`` shows every node idle (RuntimeError with the
    daemons' logs otherwise). Nothing it starts listens outside the simulated hosts' networks;
    its files are under ``workdir``, but munged's (a fresh directory under the system's temp
    directory, removed by ``stop()``: the munge user cannot enter pytest's).
  * ``client(argv)`` returns the argv that runs a Slurm client (sbatch, srun, sinfo) on the first
    node with ``SLURM_CONF`` set; ``env()`` the environment for it.
  * ``stop()`` (also on leaving the ``with`` block) ends every daemon; what jobs left in the
    namespaces is the SimHosts' to clean.
  * :func:`missing_requirements` says why no cluster can be made here (None when it can).
"""

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

_DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "sinfo")

_CONF = """ClusterName=hvlt
SlurmctldHost=%(head)s(%(head_addr)s)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%(munge_socket)s
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
StateSaveLocation=%(dir)s/state
SlurmdSpoolDir=%(dir)s/spool-%%n
SlurmctldPidFile=%(dir)s/slurmctld.pid
SlurmdPidFile=%(dir)s/slurmd-%%n.pid
SlurmctldLogFile=%(dir)s/slurmctld.log
SlurmdLogFile=%(dir)s/slurmd-%%n.log
%(nodes)s
PartitionName=debug Nodes=%(names)s Default=YES MaxTime=INFINITE State=UP
"""


def missing_requirements() -> Optional[str]:
    """Return why a local Slurm cannot run here, or None."""
    absent = [d for d in _DAEMONS if shutil.which(d) is None]
    if absent:
        return ("Slurm is not installed (%s missing; `apt-get install slurmctld slurmd "
                "slurm-client munge` as root)" % ", ".join(absent))
    if not os.path.exists("/etc/munge/munge.key"):
        return "no /etc/munge/munge.key"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no munge user"
    return None


class SlurmCluster:
    """slurmctld + one slurmd per node on simulated hosts (see the module contract)."""

    def __init__(self, sim, nodes: List[str], workdir: Path) -> None:
        self.sim, self.nodes = sim, list(nodes)
        self.dir = Path(workdir) / "slurm"
        self.conf = self.dir / "slurm.conf"
        # munged runs as the munge user, which cannot enter pytest's private temporary
        # directories: its own directory is a fresh one under the system's temp dir
        self.munge_dir = Path(tempfile.mkdtemp(prefix="hvlt-munge-"))
        self.munge_socket = self.munge_dir / "munge.socket"
        self._procs: List[subprocess.Popen] = []

    def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        env.update(extra or {})
        return env

    def client(self, argv: List[str]) -> List[str]:
        return self.sim.enter(self.nodes[0]) + list(argv)

    def _write_conf(self) -> None:
        cpus = os.cpu_count() or 1
        nodes = "\n".join("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN"
                          % (n, self.sim.addr(n), cpus) for n in self.nodes)
        for sub in ["state"] + ["spool-%s" % n for n in self.nodes]:
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(_CONF % {
            "head": self.nodes[0], "head_addr": self.sim.addr(self.nodes[0]), "dir": self.dir,
            "munge_socket": self.munge_socket, "nodes": nodes, "names": ",".join(self.nodes)})

    def _spawn(self, argv: List[str], log: str) -> None:
        with open(self.dir / log, "ab") as out:
            self._procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT))

    def _on_node(self, node: str, command: str, private_shm: bool) -> List[str]:
        """argv running ``command`` (a shell line) on ``node`` under its hostname."""
        mount = " && mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm" if private_shm else ""
        return self.sim.enter(node) + ["unshare", "--uts", "--mount", "/bin/sh", "-c",
                                       "hostname %s%s && exec %s" % (node, mount, command)]

    def start(self) -> "SlurmCluster":
        self._write_conf()
        munge_dir = self.munge_dir
        os.chmod(munge_dir, 0o755)
        shutil.chown(munge_dir, "munge", "munge")
        self._spawn(["runuser", "-u", "munge", "--", "munged", "-F", "--socket=%s" % self.munge_socket,
                     "--pid-file=%s/munged.pid" % munge_dir, "--log-file=%s/munged.log" % munge_dir,
                     "--seed-file=%s/munged.seed" % munge_dir], "munged.out")
        self._wait(lambda: self.munge_socket.exists(), 10, "munged did not start")
        self._spawn(self._on_node(self.nodes[0], "slurmctld -D -i -f %s" % self.conf, False),
                    "slurmctld.out")
        for node in self.nodes:
            self._spawn(self._on_node(node, "slurmd -D -f %s -N %s" % (self.conf, node), True),
                        "slurmd-%s.out" % node)
        self._wait(self._all_idle, 30, "the Slurm nodes did not become idle")
        return self

    def _all_idle(self) -> bool:
        done = subprocess.run(self.client(["sinfo", "-h", "-N", "-o", "%N %T"]), env=self.env(),
                              capture_output=True, text=True, timeout=30)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    def _wait(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                self.stop()
                raise RuntimeError("%s:\n%s" % (what, self.logs()))
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")) + \
                sorted(self.munge_dir.glob("*.log")):
            parts.append("--- %s\n%s" % (path.name, path.read_text(errors="replace")[-3000:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []
        shutil.rmtree(self.munge_dir, ignore_errors=True)

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
