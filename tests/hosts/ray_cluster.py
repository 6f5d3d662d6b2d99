"""A real Ray cluster on simulated hosts (``simhosts.py``), for ``test_ray.py``.

Contract:
  * ``RayCluster(sim)`` starts, with ``start()``, a head node on h1 and a worker node on every
    other host: each ``ray start`` runs in its host's network namespace, on its own address
    (real TCP over the bridge), and in a mount namespace of its own with a private
    ``/dev/shm`` (as a machine has: what a killed node leaves there goes with it), with one
    CPU, a small object store, a temporary directory of its own (``/tmp/hvr<pid>x<n>``:
    short, as Ray's socket paths must be) and token authentication with a token made for this
    cluster (Ray 2.60's default mode; the token is in ``env()``, never in ``~/.ray``).
  * ``env()`` is what a driver needs (``RAY_ADDRESS``, the token, ``PYTHONPATH``);
    ``driver(script, args)`` returns the argv that runs a driver script on h1 (its network and
    mount namespaces). ``node_shm(host)`` lists the files in that node's ``/dev/shm``.
  * ``kill_node(host)`` SIGKILLs every process of that host (a machine that died);
    ``restart_node(host)`` starts a worker node there again.
  * ``close()`` kills every process of every host (the namespaces go with ``SimHosts``) and
    removes the temporary directories. ``ray stop`` is never used: it finds Ray's processes by
    name, machine-wide, and would end another run's cluster.
"""
import os
import secrets
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

from cluster_common import NodesOnSimHosts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))
_OBJECT_STORE = str(80 * 1024 * 1024)


def ray_missing():
    """Why Ray cannot be used here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        return "Ray is not installed (pip install 'hvlite[ray]'): %s" % e
    return None


def _ray_cli() -> List[str]:
    script = os.path.join(os.path.dirname(sys.executable), "ray")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "ray.scripts.scripts"]


class RayCluster(NodesOnSimHosts):
    """A Ray cluster on simulated hosts (see the module contract)."""

    def __init__(self, sim, cpus: int = 1) -> None:
        self.sim, self.cpus = sim, cpus
        self.token = secrets.token_hex(32)
        self.port = 6379
        self.temp_dirs: List[str] = []
        self.driver_tmp: Optional[str] = None
        self.head = sim.hosts[0]
        self.engine = "Ray"
        self.address = "%s:%d" % (sim.addr(self.head), self.port)

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                    "RAY_ADDRESS": self.address, "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_DEDUP_LOGS": "0", "UCX_TLS": "tcp,self", "HVLITE_LOG_LEVEL": "warning"})
        env.pop("HVLITE_TEST_FAKE_HOSTS", None)
        if self.driver_tmp:          # the drivers' host tables, apart from any other run's
            env["TMPDIR"] = self.driver_tmp
        return env

    def _temp_dir(self) -> str:
        path = "/tmp/hvr%dx%d" % (os.getpid(), len(self.temp_dirs))
        self.temp_dirs.append(path)
        return path

    def _start_argv(self, host: str) -> List[str]:
        private_shm = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                       'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]
        argv = self.sim.enter(host) + private_shm + _ray_cli() + [
            "start", "--node-ip-address", self.sim.addr(host), "--num-cpus", str(self.cpus),
            "--object-store-memory", _OBJECT_STORE, "--disable-usage-stats",
            "--temp-dir", self._temp_dir()]
        if host == self.head:
            return argv + ["--head", "--port", str(self.port), "--include-dashboard=false"]
        return argv + ["--address", self.address]

    def _run(self, argvs: List[List[str]]) -> None:
        env = self.env()
        env.pop("RAY_ADDRESS")
        procs = [subprocess.Popen(a, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for a in argvs]
        failures = []
        for argv, proc in zip(argvs, procs):
            try:
                out = proc.communicate(timeout=180 * MULTIPLIER)[0]
            except subprocess.TimeoutExpired:
                proc.kill()
                out = proc.communicate()[0]
            if proc.returncode != 0:
                failures.append("%s: exit %s\n%s" % (" ".join(argv[-12:]), proc.returncode,
                                                     out[-3000:]))
        if failures:
            raise RuntimeError("ray start failed:\n" + "\n".join(failures))

    def start(self) -> "RayCluster":
        started = time.monotonic()
        self._run([self._start_argv(self.head)])
        self._run([self._start_argv(h) for h in self.sim.hosts[1:]])
        self.start_seconds = time.monotonic() - started
        return self

    def kill_node(self, host: str) -> None:
        for _ in range(20):
            if not self.sim.pids(host):
                return
            self.sim.kill_host(host)
            time.sleep(0.05)

    def restart_node(self, host: str) -> float:
        started = time.monotonic()
        self._run([self._start_argv(host)])
        return time.monotonic() - started

    def close(self) -> None:
        for host in self.sim.hosts:
            self.kill_node(host)
        for path in self.temp_dirs:
            shutil.rmtree(path, ignore_errors=True)
