"""Fixtures for the multi-host tests: simulated hosts (``simhosts.py``) and hvlrun jobs on them.

Every test here skips, with the reason, where simulated hosts cannot be made (not root, tools
missing). A job is ``hvlrun`` started on the head host h1 with ``--ssh-command`` set to the
ssh stand-in and ``--network-interface eth0``; it runs with a hard timeout (scaled by
``HVLITE_TEST_TIMEOUT_MULTIPLIER``) and ``UCX_TLS=tcp,self``: namespaces of one machine would
otherwise talk through shared memory, which separate machines cannot, so no byte would cross
the links. After every test, no process may be left on any simulated host.
"""
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import pytest

from simhosts import SimHosts, missing_requirements

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))
PY = sys.executable


def skip_unless_possible():
    why = missing_requirements()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def _three_hosts(tmp_path_factory):
    skip_unless_possible()
    with SimHosts(3, tmp_path_factory.mktemp("simhosts")) as hosts:
        yield hosts


@pytest.fixture
def sim(_three_hosts):
    """Three simulated hosts h1..h3, shared by the session; empty again after each test."""
    yield _three_hosts
    assert_nothing_left(_three_hosts)


@pytest.fixture
def fresh_sim(tmp_path):
    """Three simulated hosts of this test's own (for tests that cut links or kill hosts)."""
    skip_unless_possible()
    with SimHosts(3, tmp_path) as hosts:
        yield hosts
        assert_nothing_left(hosts)


def job_env(extra=None) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HVLITE_LOG_LEVEL", "warning")
    env["UCX_TLS"] = "tcp,self"
    env.pop("HVLITE_TEST_FAKE_HOSTS", None)
    env.update(extra or {})
    return env


@dataclass
class Job:
    """A finished hvlrun job: its output, how long it took, and the bytes each host's link
    received and sent meanwhile."""
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    traffic: Dict[str, Tuple[int, int]] = field(default_factory=dict)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def hvlrun_argv(sim: SimHosts, hosts: str, args, head: str = "h1"):
    """The argv that runs hvlrun on ``head`` over ``hosts`` (an -H value)."""
    args = [PY if a == "python" else str(a) for a in args]
    # hvlrun keeps every --network-interface given: the test's own replaces the default eth0
    nics = [] if "--network-interface" in args else ["--network-interface", "eth0"]
    return sim.enter(head) + [PY, "-m", "hvlite.runner", "-H", hosts, "--ssh-command", sim.ssh,
                              *nics, *args]


def run_hvlrun(sim: SimHosts, hosts: str, args, timeout: float, env: Optional[dict] = None) -> Job:
    """Run hvlrun on h1 over ``hosts``; fail the test (with the output) after ``timeout`` s."""
    before = sim.all_counters()
    argv = hvlrun_argv(sim, hosts, args)
    start = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, env=job_env(env), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout * MULTIPLIER)
    except subprocess.TimeoutExpired as e:
        pytest.fail("hvlrun timed out after %.0f s: %s\n--- stdout\n%s\n--- stderr\n%s"
                    % (timeout * MULTIPLIER, " ".join(argv), e.stdout, e.stderr))
    seconds = time.monotonic() - start
    after = sim.all_counters()
    traffic = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in sim.hosts}
    return Job(done.returncode, done.stdout, done.stderr, seconds, traffic)


def wait_for_no_leftovers(sim: SimHosts, seconds: float) -> Dict[str, list]:
    """Wait until no process runs on any simulated host; return what is left after ``seconds``."""
    deadline = time.monotonic() + seconds * MULTIPLIER
    while True:
        left = sim.leftovers()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def assert_nothing_left(sim: SimHosts) -> None:
    """Fail unless every simulated host is empty (within 10 s: the job's last processes end)."""
    left = wait_for_no_leftovers(sim, 10)
    assert not left, "processes left on simulated hosts: %s" % left


def report(name: str, job: Job) -> None:
    """Print a job's duration and link traffic (shown with ``pytest -s``; kept in the log)."""
    sys.stdout.write("\n[hosts] %s: %.1f s, link bytes (rx, tx) %s\n" % (name, job.seconds, job.traffic))
