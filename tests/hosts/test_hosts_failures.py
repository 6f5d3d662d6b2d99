"""Failures across simulated hosts: a link cut while ranks allreduce, and a host whose processes
are all killed. Each must end every rank on every host within a bound set by hvlrun's heartbeat
timeout, with hvlrun exiting 125 and naming the host and its ranks, and leave no process of the
job on any host (every namespace is checked). The cut host's processes can only end by their
own guard's decision: they run in their own session, which hvlrun's signals do not reach. The
killed host's job must leave no file behind either: MPICH's proxies keep a topology file in /tmp
(the hosts share /tmp) that a killed proxy never removes."""
import os
import subprocess
import threading
import time

import pytest

from conftest import MULTIPLIER, ROOT, hvlrun_argv, job_env
from hvlite.runner.procs.job_files import TMP_PREFIXES

LOOP = os.path.join(ROOT, "tests", "hosts", "scenarios", "loop.py")
HEARTBEAT = 4.0 * MULTIPLIER   # seconds: hvlrun's --heartbeat-timeout in these tests
GUARD_GRACE = 2.0         # host_guard.KILL_GRACE_SECONDS


class RunningJob:
    """hvlrun started on h1, its output collected by a thread."""

    def __init__(self, sim, hosts, args, timeout):
        self.proc = subprocess.Popen(hvlrun_argv(sim, hosts, args), cwd=ROOT, env=job_env(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines, self.timeout = [], timeout * MULTIPLIER
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self):
        return "".join(self.lines)

    def wait_for(self, text, count):
        deadline = time.monotonic() + self.timeout
        while self.output.count(text) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail("job never printed %r %d times:\n%s" % (text, count, self.output))
            time.sleep(0.05)

    def wait(self):
        try:
            rc = self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("hvlrun did not end within %.0f s:\n%s" % (self.timeout, self.output))
        self.reader.join(timeout=5)
        return rc

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def when_empty(sim, since, limit):
    """Return {host: seconds after ``since`` at which its last process ended} (None: not yet
    after ``limit`` seconds)."""
    ended = {h: None for h in sim.hosts}
    while time.monotonic() - since < limit * MULTIPLIER:
        for host in sim.hosts:
            if ended[host] is None and not sim.pids(host):
                ended[host] = time.monotonic() - since
        if all(v is not None for v in ended.values()):
            break
        time.sleep(0.05)
    return ended


def open_tmp_files(sim):
    """The MPICH temporary files (/tmp/hydra_hwloc_xmlfile_*) the job's processes on every host
    hold open: this job's, not another's."""
    held = set()
    for host in sim.hosts:
        for pid in sim.pids(host):
            try:
                fds = os.listdir("/proc/%d/fd" % pid)
            except OSError:
                continue
            for fd in fds:
                try:
                    path = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                if path.startswith(TMP_PREFIXES):
                    held.add(path)
    return held


def start_looping(sim, hosts):
    job = RunningJob(sim, hosts, ["--heartbeat-timeout", HEARTBEAT, "python", LOOP], timeout=120)
    job.wait_for("looping", len(hosts.split(",")))
    return job


def test_cut_link_ends_every_rank_on_every_host(fresh_sim):
    sim = fresh_sim
    job = start_looping(sim, "h1:1,h2:1,h3:1")
    cut = time.monotonic()
    sim.set_link("h2", up=False)
    rc = job.wait()
    hvlrun_end = time.monotonic() - cut
    ended = when_empty(sim, cut, 60)
    print("\n[hosts] link cut: hvlrun exited %.1f s after the cut; hosts empty after %s s"
          % (hvlrun_end, {h: None if t is None else round(t, 1) for h, t in ended.items()}))
    out = job.output
    assert rc == 125, out
    assert "host h2 (rank 1) stopped answering" in out, out
    for rank, host in ((0, "h1"), (2, "h3")):   # every reachable rank says why it ends
        assert "rank %d on %s: hvlrun ended the job (lost host h2 (rank 1))" % (rank, host) in out, out
    bound = HEARTBEAT + (GUARD_GRACE + 3.0) * MULTIPLIER
    assert hvlrun_end < HEARTBEAT + 3.0 * MULTIPLIER, out
    assert all(t is not None and t < bound for t in ended.values()), \
        (ended, sim.leftovers(), out)


def test_killed_host_ends_the_job(fresh_sim):
    sim = fresh_sim
    job = start_looping(sim, "h1:1,h2:1")
    held = open_tmp_files(sim)
    assert len(held) == 2, held          # one per host's MPI proxy (MPICH)
    killed = time.monotonic()
    sim.kill_host("h2")
    rc = job.wait()
    hvlrun_end = time.monotonic() - killed
    ended = when_empty(sim, killed, 60)
    print("\n[hosts] host killed: hvlrun exited %.1f s after; hosts empty after %s s"
          % (hvlrun_end, {h: None if t is None else round(t, 1) for h, t in ended.items()}))
    out = job.output
    assert rc == 125, out
    # hvlrun or mpiexec (which also sees its proxy die) may end the job first; either way hvlrun
    # names the host
    assert "host h2 (rank 1): its connection to hvlrun closed before it reported an exit" in out, out
    assert hvlrun_end < HEARTBEAT, out   # noticed at once, not by silence
    assert all(t is not None and t < 10 * MULTIPLIER for t in ended.values()), \
        (ended, sim.leftovers(), out)
    assert not [p for p in held if os.path.exists(p)], (held, out)   # nothing of the job left
