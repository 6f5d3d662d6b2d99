"""hvlite jobs on 2 and 3 simulated hosts (network namespaces, real TCP between them), launched
by hvlrun through the ssh stand-in: every collective x dtype against NumPy, topology, shared
memory inside a host and MPI across, hierarchical allreduce, process sets spanning hosts, torch
DistributedOptimizer against one process on the combined batch, the timeline; each job's bytes
on the links are checked, so traffic really crossed them."""
import json
import os
import re
import sys

import pytest

from conftest import ROOT, report, run_hvlrun

sys.path.insert(0, os.path.join(ROOT, "tests"))
import timeline_trace  # noqa: E402

SPREAD = os.path.join(ROOT, "tests", "hosts", "scenarios", "spread.py")
BIG = 8 << 20    # bytes of the scenario's one large allreduce


def spmd(path, *select):
    return ["python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *select, path]


def assert_crossed(job, hosts, at_least):
    """Every named host's link carried ``at_least`` bytes each way."""
    for host in hosts:
        rx, tx = job.traffic[host]
        assert rx >= at_least and tx >= at_least, "%s's link: rx %d tx %d bytes, expected >= %d " \
            "each way (did the traffic cross the links?)" % (host, rx, tx, at_least)


@pytest.mark.parametrize("hosts", ["h1:2,h2:1", "h1:1,h2:1,h3:1"])
def test_every_collective_and_dtype_across_hosts(sim, hosts):
    """tests/parallel/test_collectives.py (every op x dtype x shape, NumPy reference on every
    rank) as one job over the hosts; its one-host topology test is replaced by spread.py's."""
    job = run_hvlrun(sim, hosts, spmd("tests/parallel/test_collectives.py", "-k", "not test_topology"),
                     timeout=300, env={"HVLITE_SPMD": "1"})
    report("collectives on " + hosts, job)
    assert job.returncode == 0, job.output[-6000:]
    assert job.stdout.count(" passed") == sum(int(h.split(":")[1]) for h in hosts.split(","))
    assert_crossed(job, ["h2"], 100_000)


@pytest.mark.parametrize("hosts, hierarchical", [
    ("h1:2,h2:1", False), ("h1:1,h2:1,h3:1", False), ("h1:2,h2:2", True)])
def test_topology_shm_process_sets_hierarchical(sim, hosts, hierarchical, tmp_path):
    layout = ",".join(h.split(":")[1] for h in hosts.split(","))
    timeline = tmp_path / "timeline.json"
    args = ["--timeline-filename", timeline]
    if hierarchical:
        args.append("--hierarchical-allreduce")
    job = run_hvlrun(sim, hosts, args + ["python", SPREAD], timeout=180,
                     env={"HVLT_LAYOUT": layout})
    report("spread on %s%s" % (hosts, " (hierarchical)" if hierarchical else ""), job)
    assert job.returncode == 0, job.output[-6000:]
    ok = re.findall(r"spread OK rank (\d+) host (h\d) (\{.*\})", job.stdout)
    assert sorted(int(r) for r, _, _ in ok) == list(range(sum(map(int, layout.split(","))))), job.output
    placed = [h.split(":")[0] for h in hosts.split(",") for _ in range(int(h.split(":")[1]))]
    assert all(host == placed[int(r)] for r, host, _ in ok), ok  # each rank on its own host
    if hierarchical:
        assert all(json.loads(c)["hierarchical_collectives"] >= 1 for _, _, c in ok), ok
    # every host with a rank exchanged at least the big allreduce's payload over its link
    assert_crossed(job, sorted(set(placed)), BIG // 2)
    trace = timeline_trace.load(str(timeline))
    for name in ("spread.big", "all.ar.Sum.float32", "all.a2a.int64"):
        assert name in trace.tracks, "timeline lacks %s: %s" % (name, sorted(trace.tracks)[:20])


def test_torch_distributed_optimizer_across_hosts(sim):
    job = run_hvlrun(sim, "h1:1,h2:1", spmd("tests/parallel/test_torch_training.py", "-k",
                                            "distributed_optimizer_matches_combined_batch"),
                     timeout=300, env={"HVLITE_SPMD": "1"})
    report("torch DistributedOptimizer on h1:1,h2:1", job)
    assert job.returncode == 0, job.output[-6000:]
    assert job.stdout.count("5 passed") == 2, job.output[-3000:]
    assert_crossed(job, ["h1", "h2"], 10_000)


def test_unknown_host_is_named_before_anything_starts(sim):
    job = run_hvlrun(sim, "h1:1,nosuchhost:1", ["python", "-c", "print('ran')"], timeout=60)
    assert job.returncode == 125, job.output
    assert "host nosuchhost is not reachable" in job.stderr, job.stderr
    assert "Could not resolve hostname nosuchhost" in job.stderr, job.stderr
    assert "ran" not in job.stdout


def test_host_that_cannot_reach_back_is_named(sim):
    """The remote shell works, but the control address (loopback here) is no way back."""
    job = run_hvlrun(sim, "h1:1,h2:1", ["--network-interface", "lo", "python", "-c", "print('ran')"],
                     timeout=60)
    assert job.returncode == 125, job.output
    assert "host h2 is not reachable" in job.stderr, job.stderr
    assert "cannot reach hvlrun's control channel at 127.0.0.1:" in job.stderr, job.stderr
