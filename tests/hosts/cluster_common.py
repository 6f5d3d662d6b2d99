"""What the Ray and Spark cluster tests share: a running driver, and the checks that nothing
of a job is left behind.

Contract:
  * :class:`Driver` runs a driver script (an argv, an environment) with its output collected by
    a thread: :meth:`Driver.wait_for` waits for a line matching a pattern (failing the test,
    with the output, when the driver ends first or the time runs out), :meth:`Driver.result`
    waits for the end and returns the ``RESULT <json>`` the script printed; an interactive
    driver takes commands (:meth:`Driver.ask`) and answers each (:meth:`Driver.answer`).
  * :func:`job_processes` lists the processes of hvlite jobs still running on any simulated
    host (hvlrun's wrappers and guards, MPI's proxies, rank processes and stand-ins, slot
    actors, Ray Train's workers and controller): after a
    test, there must be none (:func:`assert_no_job_left`, within a few seconds).
  * :func:`host_tables`: the host-table directories a driver left in its own TMPDIR.
  * :func:`shm_files` and :func:`new_unheld_shm`: the ``/dev/shm`` files that appeared since a
    snapshot and that no live process maps or holds open; other runs on this machine
    (parallel test suites) create and remove their own meanwhile, and theirs are held while
    they run.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Set

import pytest

MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))
_JOB_WORDS = ("hvlite.runner", "hvlite.cluster", "hydra_pmi_proxy", "ray::Slot", "mpiexec",
              "ray::RayTrainWorker", "ray::TrainController")


class NodesOnSimHosts:
    """What the Ray and Spark clusters on simulated hosts share: each node's daemons run in a
    mount namespace of their own (the node's private /dev/shm), reached through any of its
    processes. Subclasses set ``sim``, ``head`` (the host the drivers run on) and ``engine``."""
    sim = None
    head = ""
    engine = "cluster"

    def node_pid(self, host: str) -> int:
        """A process of the node on ``host``, in the node's mount namespace."""
        mine = os.readlink("/proc/self/ns/mnt")
        for pid in self.sim.pids(host):
            try:
                if os.readlink("/proc/%d/ns/mnt" % pid) != mine:
                    return pid
            except OSError:
                continue
        raise RuntimeError("no %s process on %s" % (self.engine, host))

    def driver(self, script: str, args=()) -> List[str]:
        """The argv that runs ``script`` as a driver on the head node, in its namespaces."""
        mount = "--mount=/proc/%d/ns/mnt" % self.node_pid(self.head)
        return (self.sim.enter(self.head) + [mount, sys.executable, script]
                + [str(a) for a in args])

    def node_shm(self, host: str) -> List[str]:
        """The files in the ``/dev/shm`` of the node on ``host``."""
        return sorted(os.listdir("/proc/%d/root/dev/shm" % self.node_pid(host)))


class Driver:
    """A running driver script (see the module contract)."""

    def __init__(self, argv: List[str], env: Dict[str, str], timeout: float,
                 interactive: bool = False) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stdin=subprocess.PIPE if interactive else subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: List[str] = []
        self.timeout = timeout * MULTIPLIER
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, after: int = 0, timeout: Optional[float] = None) -> int:
        """Wait for a line (from line ``after`` on) matching ``pattern``; return its index.
        ``timeout`` (scaled) defaults to what is left of the driver's own."""
        deadline = (time.monotonic() + timeout * MULTIPLIER if timeout is not None
                    else self.started + self.timeout)
        seen = after
        while True:
            for i in range(seen, len(self.lines)):
                if re.search(pattern, self.lines[i]):
                    return i
            seen = max(seen, len(self.lines))
            if self.proc.poll() is not None and not self.reader.is_alive() \
                    and seen == len(self.lines):
                pytest.fail("the driver ended without printing %r:\n%s"
                            % (pattern, self.output[-8000:]))
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail("no line matching %r in time:\n%s" % (pattern, self.output[-8000:]))
            time.sleep(0.05)

    def ask(self, command: str) -> int:
        """Send an interactive driver a command; return the line index its output starts at."""
        at = len(self.lines)
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return at

    def answer(self, after: int, timeout: float) -> dict:
        """The ``RESULT`` an interactive driver printed after line ``after``."""
        found = self.wait_for(r"^RESULT ", after, timeout)
        return self._parse(found, after)

    def result(self) -> dict:
        """Wait for the end; return the driver's ``RESULT`` (the test fails without one)."""
        try:
            self.proc.wait(timeout=max(1.0, self.started + self.timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("the driver did not end within %.0f s:\n%s"
                        % (self.timeout, self.output[-8000:]))
        self.reader.join(10)
        found = [i for i, l in enumerate(self.lines) if l.startswith("RESULT ")]
        assert found, "the driver printed no RESULT (exit code %s):\n%s" % (
            self.proc.returncode, self.output[-8000:])
        return self._parse(found[-1], 0)

    def _parse(self, index: int, after: int) -> dict:
        result = json.loads(self.lines[index][len("RESULT "):])
        result["_output"] = "".join(self.lines[after:index + 1])
        result["_seconds"] = time.monotonic() - self.started
        return result

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def job_processes(sim) -> Dict[str, List[str]]:
    """The processes of hvlite jobs on any simulated host (see the module contract)."""
    found = {}
    for host, described in sim.leftovers().items():
        mine = [d for d in described if any(w in d for w in _JOB_WORDS)]
        if mine:
            found[host] = mine
    return found


def assert_no_job_left(sim, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds * MULTIPLIER
    while True:
        left = job_processes(sim)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, "processes of a job left on the simulated hosts: %s" % left


def host_tables(root: str) -> Set[str]:
    """The host-table directories (``hvlite-cluster-*``) a driver whose ``TMPDIR`` is ``root``
    left there (each test file gives its driver a ``TMPDIR`` of its own, so another run's
    tables, in the shared temporary directory, are never counted)."""
    return {n for n in os.listdir(root) if n.startswith("hvlite-cluster-")}


def shm_files() -> Set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _held() -> Set[str]:
    """Names of /dev/shm files some live process maps or holds open."""
    held = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/maps" % pid, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        held.add(line.rsplit("/dev/shm/", 1)[1].split()[0])
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):].split()[0])
        except OSError:
            continue
    return held


def new_unheld_shm(before: Set[str]) -> List[str]:
    """Files that appeared in /dev/shm since ``before`` and that no live process holds."""
    fresh = shm_files() - before
    return sorted(fresh - _held()) if fresh else []
