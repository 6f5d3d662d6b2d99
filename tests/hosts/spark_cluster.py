"""A real Spark standalone cluster on simulated hosts (``simhosts.py``), for ``test_spark.py``.

Contract:
  * ``SparkCluster(sim, cores)`` starts, with ``start()``, a standalone master on the first
    host and a worker on each other host (``cores[host]`` cores, 1 GiB): each JVM runs in its
    host's network namespace, on its own address (real TCP over the bridge), in a mount
    namespace with a private ``/dev/shm`` (as a machine has), through ``spark-class`` (the
    pip package has no ``sbin`` start scripts to rely on), its files in a temporary directory
    of its own. It returns once every worker registered with the master.
  * ``env()`` is what a driver needs (``SPARK_MASTER``, ``PYTHONPATH``, the Python the
    executors run); ``driver(script, args)`` the argv that runs a driver on the first host.
  * ``kill_node(host)`` SIGKILLs every process of that host (the worker, its executor, the
    Python workers, the job's processes); ``restart_node(host)`` starts its worker again and
    waits until it registered. ``node_shm(host)`` lists that node's ``/dev/shm``.
  * ``close()`` kills every process of every host and removes the temporary directories.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from cluster_common import NodesOnSimHosts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))


def spark_missing() -> Optional[str]:
    """Why Spark cannot be used here, or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        return "pyspark is not installed (pip install 'hvlite[spark]'): %s" % e
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark needs Java (no java on PATH, no JAVA_HOME)"
    return None


def _spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


class SparkCluster(NodesOnSimHosts):
    """A Spark standalone cluster on simulated hosts (see the module contract)."""

    def __init__(self, sim, cores: Dict[str, int]) -> None:
        self.sim, self.cores = sim, cores
        self.master_host = self.head = sim.hosts[0]
        self.engine = "Spark"
        self.master = "spark://%s:7077" % sim.addr(self.master_host)
        self.workdir = tempfile.mkdtemp(prefix="hvlite-spark-")
        self.procs: Dict[str, subprocess.Popen] = {}
        self.logs: Dict[str, str] = {}

    def env(self, host: Optional[str] = None) -> Dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.update({"SPARK_HOME": _spark_home(), "PYSPARK_PYTHON": sys.executable,
                    "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_MASTER": self.master,
                    "UCX_TLS": "tcp,self", "HVLITE_LOG_LEVEL": "warning",
                    "SPARK_NO_DAEMONIZE": "1"})
        if host is not None:
            node = os.path.join(self.workdir, host)
            os.makedirs(node, exist_ok=True)
            env.update({"SPARK_LOCAL_IP": self.sim.addr(host), "SPARK_LOG_DIR": node,
                        "SPARK_WORKER_DIR": os.path.join(node, "work"),
                        "SPARK_LOCAL_DIRS": os.path.join(node, "local")})
        env.pop("HVLITE_TEST_FAKE_HOSTS", None)
        return env

    def _launch(self, host: str, words: List[str]) -> None:
        private_shm = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                       'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]
        argv = (self.sim.enter(host) + private_shm
                + [os.path.join(_spark_home(), "bin", "spark-class")] + words)
        log = os.path.join(self.workdir, "%s.log" % host)
        self.logs[host] = log
        with open(log, "w") as out:
            self.procs[host] = subprocess.Popen(argv, env=self.env(host), stdin=subprocess.DEVNULL,
                                                stdout=out, stderr=subprocess.STDOUT)

    def _wait_log(self, host: str, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout * MULTIPLIER
        while True:
            with open(self.logs[host], errors="replace") as f:
                log = f.read()
            if text in log:
                return
            if self.procs[host].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Spark on %s did not log %r:\n%s" % (host, text, log[-3000:]))
            time.sleep(0.2)

    def _start_worker(self, host: str) -> None:
        self._launch(host, ["org.apache.spark.deploy.worker.Worker", self.master,
                            "--host", self.sim.addr(host), "--cores", str(self.cores[host]),
                            "--memory", "1g", "--webui-port", "8081"])

    def start(self) -> "SparkCluster":
        started = time.monotonic()
        self._launch(self.master_host, ["org.apache.spark.deploy.master.Master", "--host",
                                        self.sim.addr(self.master_host), "--port", "7077",
                                        "--webui-port", "8080"])
        self._wait_log(self.master_host, "I have been elected leader")
        for host in self.cores:
            self._start_worker(host)
        for host in self.cores:
            self._wait_log(host, "Successfully registered with master")
        self.start_seconds = time.monotonic() - started
        return self

    def kill_node(self, host: str) -> None:
        for _ in range(40):
            if not self.sim.pids(host):
                break
            self.sim.kill_host(host)
            time.sleep(0.05)
        if host in self.procs:
            self.procs[host].wait()

    def restart_node(self, host: str) -> float:
        started = time.monotonic()
        self._start_worker(host)
        self._wait_log(host, "Successfully registered with master")
        return time.monotonic() - started

    def close(self) -> None:
        for host in self.sim.hosts:
            self.kill_node(host)
        shutil.rmtree(self.workdir, ignore_errors=True)
