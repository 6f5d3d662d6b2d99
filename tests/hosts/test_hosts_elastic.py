"""Elastic jobs across simulated hosts: a host that dies whole (every process killed, its link
cut, while discovery still names it), a host whose workers keep failing, and a host that cannot
be reached when the job starts. Each time the job goes on from the last commit on the hosts
that work and finishes there, with every step applied once and the same parameters on every
rank; hvlrun names and blacklists the bad host; no process is left on any host (the fixture
checks every namespace). A rank that freezes, in turn, charges no host: its peers leave with
the peer-lost code and mpiexec kills the rest, which is no loss of theirs."""
import os
import re
import subprocess
import threading
import time

from conftest import MULTIPLIER, PY, ROOT, job_env, report, run_hvlrun
from test_hosts_failures import RunningJob

TORCH = os.path.join(ROOT, "tests", "scenarios", "elastic_train.py")
FROZEN = os.path.join(ROOT, "tests", "hosts", "scenarios", "frozen_peer.py")


def elastic_argv(sim, discovery, args):
    """hvlrun on h1 with the hosts from ``discovery`` (no -H)."""
    return sim.enter("h1") + [PY, "-m", "hvlite.runner", "--ssh-command", sim.ssh,
                              "--network-interface", "eth0", "--host-discovery-script",
                              discovery] + [PY if a == "python" else str(a) for a in args]


def discovery_script(tmp_path, hosts):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\nprintf '%s\\n'\n" % "\\n".join(hosts.split(",")))
    script.chmod(0o755)
    return str(script)


def finals(out, size, steps):
    found = [dict(kv.split("=", 1) for kv in m.split())
             for m in re.findall(r"\[\d+\]<stdout>: FINAL (.*)", out)]
    assert len(found) == size and len({f["digest"] for f in found}) == 1, out[-4000:]
    for f in found:
        assert f["counts"] == ",".join(["1"] * steps) and float(f["refdiff"]) < 1e-5, f


class Job(RunningJob):
    """A running hvlrun (as in test_hosts_failures), started with an argv of our own."""

    def __init__(self, argv, timeout):    # noqa: super().__init__ would build its own argv
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=job_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, self.timeout = [], timeout * MULTIPLIER
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()


def test_dead_host_is_blacklisted_and_the_job_finishes_on_the_others(fresh_sim, tmp_path):
    sim = fresh_sim
    script = discovery_script(tmp_path, "h1:1,h2:1,h3:1")       # never drops h3
    job = Job(elastic_argv(sim, script, [
        "-np", "3", "--min-np", "2", "--heartbeat-timeout", 4 * MULTIPLIER, "--start-timeout",
        10 * MULTIPLIER, "python", TORCH, "--steps", "40", "--commit-every", "5", "--sleep",
        "0.1"]), timeout=400)
    job.wait_for("STEP w=1 s=12 ", 1)
    died = time.monotonic()
    sim.set_link("h3", up=False)
    sim.kill_host("h3")
    rc = job.wait()
    out = job.output
    assert rc == 0, out[-5000:]
    finals(out, 2, 40)
    # a dead host: its connections close, or (the cut link may beat the FINs) it goes silent
    assert re.search(r"world 1 ended after [0-9.]+ s: host h3 \(rank 2\)(: its connection to "
                     r"hvlrun closed| stopped answering)", out), out[-5000:]
    assert "blacklisted host h3 for the rest of the job: it cannot be reached" in out
    assert re.search(r"re-forming: world 2 \(3 ranks on h1:1,h2:1,h3:1\) -> world 3 \(2 ranks on "
                     r"h1:1,h2:1\); reason: host h3 is not reachable", out), out[-5000:]
    took = re.search(r"world 3 ready: .* the re-form took ([0-9.]+) s \(from the end of world 1 ",
                     out)
    print("\n[hosts] elastic: host h3 died; job finished on h1,h2 %.1f s later (re-form %s s)"
          % (time.monotonic() - died, took.group(1) if took else "?"))
    sim.set_link("h3", up=True)


def test_host_whose_workers_keep_failing_is_blacklisted(fresh_sim, tmp_path):
    sim = fresh_sim
    script = discovery_script(tmp_path, "h1:1,h2:1,h3:1")
    job = Job(elastic_argv(sim, script, [
        "--min-np", "2", "python", TORCH, "--steps", "10", "--commit-every", "5",
        "--fail-on-host", "h3"]), timeout=400)
    rc = job.wait()
    out = job.output
    assert rc == 0, out[-5000:]
    finals(out, 2, 10)
    assert "blacklisted host h3 for the rest of the job: its workers failed in 2 worlds in a " \
           "row without a commit in between" in out, out[-5000:]
    assert re.search(r"re-forming: world 2 \(3 ranks on h1:1,h2:1,h3:1\) -> world 3 \(2 ranks on "
                     r"h1:1,h2:1\); reason: rank 2 on h3 exited with code 1", out), out[-5000:]


def loop_finals(out, size, steps):
    found = re.findall(r"\[\d+\]<stdout>: FINAL rank=\d+ size=(\d+) counts=(\S+)", out)
    assert found == [(str(size), ",".join(["1"] * steps))] * size, out[-4000:]


def test_a_host_unreachable_at_the_start_is_left_out(sim):
    """World 1's host check fails for h9 (no such host): it is blacklisted and world 2 runs on
    the others (this ended in a TypeError: no world had run before world 2)."""
    job = run_hvlrun(sim, "h1:1,h2:1,h9:1", ["-np", "3", "--min-np", "2", "python", FROZEN,
                                             "--steps", "4"], timeout=60)
    out = job.output
    assert job.returncode == 0, out[-4000:]
    assert "blacklisted host h9 for the rest of the job: it cannot be reached" in out, out
    assert re.search(r"re-forming: world 1 \(3 ranks on h1:1,h2:1,h9:1\) -> world 2 \(2 ranks "
                     r"on h1:1,h2:1\); reason: host h9 is not reachable", out), out
    assert "Traceback" not in out, out
    loop_finals(out, 2, 4)
    report("elastic: unreachable h9 in world 1", job)


def test_a_frozen_rank_charges_no_host(sim):
    """Rank 2 (on h2) freezes in worlds 1 and 2 while rank 1 (on h1) is busy: rank 0 times out
    and leaves with the peer-lost code, and mpiexec kills the rest, rank 1 too, whose wrapper
    vanishes without an exit. Each world ends on a lost peer, charged to no host: none is
    blacklisted, and world 3 runs on every slot. (The killed wrapper counted as host h1 lost,
    and two such worlds blacklisted h1, healthy as it was.)"""
    job = run_hvlrun(sim, "h1:2,h2:1", [
        "--min-np", "2", "python", FROZEN, "--steps", "10", "--commit-every", "3",
        "--freeze", "2:5:1,2", "--slow", "1:8"], timeout=150,
        env={"HVLITE_PEER_TIMEOUT_SECONDS": "3"})
    out = job.output
    assert job.returncode == 0, out[-5000:]
    for world in (1, 2):
        assert re.search(r"world %d ended after [0-9.]+ s: rank \d on h\d lost a peer "
                         r"\(HorovodInternalError\)" % world, out), out[-5000:]
    assert "blacklisted" not in out and "connection to hvlrun closed" not in out, out[-5000:]
    assert re.search(r"re-forming: world 2 \(3 ranks on h1:2,h2:1\) -> world 3 \(3 ranks "
                     r"on h1:2,h2:1\)", out), out[-5000:]
    loop_finals(out, 3, 10)
    report("elastic: rank 1 frozen in worlds 1 and 2", job)
