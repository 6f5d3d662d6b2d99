"""hvlite.ray on a real Ray cluster: a head and two worker nodes, each ``ray start`` in its own
network namespace on a bridge (``ray_cluster.py`` on ``simhosts.py``), started once for this
file. Each test runs a driver (``scenarios/ray_driver.py``) inside the head's namespace.

  * a 3-rank torch job, one Trainer per rank built once and called three times: every rank's
    averaged gradients equal a one-process reference, results come in rank order, every call
    runs in the same processes (one world);
  * a rank's function that raises: the driver raises naming that rank with its traceback, and
    its peers, waiting in an allreduce, are ended at once (no timeout waited out);
  * four workers asked of a three-CPU cluster: start fails after placement_group_timeout_s,
    saying what the cluster has;
  * a node killed mid-job (every process of its namespace): the job ends, naming its host;
  * an elastic job (min 2, max 3 workers) loses a node, goes on with two, gets the node back
    (restarted: a new Ray node) and finishes with three, every step applied once;
  * Ray Train (``scenarios/ray_train_driver.py``, one driver for two ``HvliteTrainer`` runs of
    3 workers): a torch run whose first attempt fails on rank 1 and whose retry
    (``FailureConfig(max_failures=1)``) forms a fresh world in fresh workers and finishes from
    the last checkpoint: every averaged gradient equals a one-process reference,
    ``ray.train.report``'s metrics and checkpoints come back in the ``Result``, hvlite's ranks
    are Ray Train's; a run without retries whose rank 1 raises ends naming that worker, its
    peers' allreduce ended at once; one whose rank 1's process dies likewise, and that worker's
    ``/dev/shm`` file goes with it.

After every test no process of the job (wrapper, guard, proxy, rank, slot actor) is left on
any host, no MPI or hvlite file in any node's own ``/dev/shm``, and no placement group; after
the file, the namespaces are gone and no ``/dev/shm`` file of ours is left on the machine
(``cluster_common.py``). Skips, saying why, without Ray or
without root (network namespaces).
"""
import json
import os
import re
import sys
import time

import pytest

from cluster_common import (Driver, assert_no_job_left, host_tables, new_unheld_shm,
                            shm_files)
from ray_cluster import RayCluster, ray_missing
from simhosts import SimHosts, missing_requirements, _netns_names

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "scenarios", "ray_driver.py")
TRAIN_DRIVER = os.path.join(HERE, "scenarios", "ray_train_driver.py")
JOB_SHM = ("mpich_shm_", "hvlite-")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = ray_missing() or missing_requirements()
    if why:
        pytest.skip(why)
    before = shm_files()
    sim = SimHosts(3, tmp_path_factory.mktemp("ray-hosts"))
    sim.start()
    ray_cluster = RayCluster(sim)
    ray_cluster.driver_tmp = str(tmp_path_factory.mktemp("ray-driver-tmp"))
    try:
        ray_cluster.start()
        sys.stdout.write("\n[ray] cluster of 3 nodes up in %.1f s\n" % ray_cluster.start_seconds)
        yield ray_cluster
    finally:
        ray_cluster.close()
        sim.close()
    assert not [n for n in _netns_names() if n.startswith(sim.tag)], "namespaces left"
    assert not any(os.path.exists(p) for p in ray_cluster.temp_dirs), "Ray's directories left"
    time.sleep(1.0)
    assert not new_unheld_shm(before), "/dev/shm files left: %s" % new_unheld_shm(before)
    assert not host_tables(ray_cluster.driver_tmp), \
        "host tables left: %s" % host_tables(ray_cluster.driver_tmp)


@pytest.fixture
def ray_cluster(cluster):
    yield cluster
    assert_no_job_left(cluster.sim)
    for host in cluster.sim.hosts:           # each node's own /dev/shm: Ray's files only
        left = [f for f in cluster.node_shm(host) if f.startswith(JOB_SHM)]
        assert not left, "/dev/shm files left on %s: %s" % (host, left)


def run_driver(cluster, scenario, timeout, *args):
    driver = Driver(cluster.driver(DRIVER, [scenario, *args]), cluster.env(), timeout)
    return driver, driver.result


def check(result):
    assert result["ok"], {k: v for k, v in result.items() if k != "_output"} \
        if "why" not in result else result["why"] + result["_output"][-6000:]
    assert result["leftover_groups"] == 0, result


def test_three_rank_torch_job_gives_horovods_gradients_in_rank_order(ray_cluster):
    driver, result = run_driver(ray_cluster, "train", 300)
    result = result()
    check(result)
    assert result["grad_error"] < 1e-6 and result["same_processes"]
    print("\n[ray] two run_remote() in flight: %s; an unpicklable value: %s"
          % (result["in_flight"], result["unpicklable"].splitlines()[0][:160]))
    print("\n[ray] 3-rank torch job: %.1f s, ranks %s on %s, largest gradient error %.2g"
          % (result["_seconds"], result["ranks"][-1], result["hosts"], result["grad_error"]))


def test_a_rank_that_raises_is_named_and_its_peers_do_not_wait(ray_cluster):
    driver, result = run_driver(ray_cluster, "raise", 200)
    result = result()
    check(result)
    assert "ValueError: rank 1 failed on purpose" in result["message"], result["message"]
    assert result["seconds"] < 20, result     # the peer timeout (60 s) is not waited out
    assert "the job ended earlier" in result["later"], result["later"]
    print("\n[ray] rank 1 raised: the driver raised %.1f s later (the whole call: %.1f s)"
          % (result["seconds"], result["call"]))


def test_too_few_slots_fail_at_start_in_time(ray_cluster):
    driver, result = run_driver(ray_cluster, "slots", 120)
    result = result()
    check(result)
    assert 4 <= result["seconds"] < 15, result
    assert "it has {CPU: 3}" in result["message"], result["message"]
    print("\n[ray] 4 workers on 3 CPUs: failed after %.1f s" % result["seconds"])


def test_a_killed_node_ends_the_plain_job_naming_it(ray_cluster):
    sim = ray_cluster.sim
    driver = Driver(ray_cluster.driver(DRIVER, ["kill"]), ray_cluster.env(), 200)
    driver.wait_for(r"<stdout>: TICK 40\b")
    killed = time.time()
    ray_cluster.kill_node("h3")
    result = driver.result()
    restart = ray_cluster.restart_node("h3")
    check(result)
    seconds = result["at"] - killed
    dead = "ray-%s-" % sim.addr("h3").replace(".", "-")
    assert dead in result["message"], result["message"]
    assert seconds < 20, result
    print("\n[ray] node h3 killed: the driver raised after %.1f s: %s (node restarted in %.1f s)"
          % (seconds, result["message"].splitlines()[0][:200], restart))


def test_an_elastic_job_loses_a_node_and_gets_it_back(ray_cluster, tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    driver = Driver(ray_cluster.driver(DRIVER, ["elastic", str(hold)]), ray_cluster.env(), 400)
    first = driver.wait_for(r"<stdout>: HOLDING w=\d+ .*size=3")
    ray_cluster.kill_node("h3")
    shrunk = driver.wait_for(r"<stdout>: HOLDING w=\d+ .*size=2", first)
    ray_cluster.restart_node("h3")
    driver.wait_for(r"<stdout>: BEGIN w=\d+ .*size=3", shrunk)
    hold.unlink()
    result = driver.result()
    check(result)
    out = result["_output"]
    sizes = [int(n) for n in re.findall(r"elastic: world 1: (\d+) ranks|-> world \d+ \((\d+) "
                                         r"ranks", out) for n in n if n]
    # three ranks, then two (the node lost), then three again (it came back)
    assert re.search("3.*2.*3$", "".join(map(str, sizes))), (sizes, out[-6000:])
    print("\n[ray] elastic: %.1f s, world sizes %s, %d of %d steps applied once on every rank"
          % (result["_seconds"], sizes, result["counts"].count(1), len(result["counts"])))
    print("[ray] elastic re-forms: %s" % re.findall(r"re-forming: .*?reason: ([^;\n]*)", out))
    print("[ray] a slot actor frozen 4 s: node kept; frozen for good: dropped after %.1f s, "
          "back with a new actor %.1f s after the freeze; a second run returned %s"
          % (result["frozen"]["dropped_s"], result["frozen"]["back_s"], result["again"]))


@pytest.fixture(scope="module")
def ray_train_runs(cluster, tmp_path_factory):
    """The Ray Train runs, by one driver (its ray.init paid once)."""
    storage = tmp_path_factory.mktemp("ray-train")
    result = Driver(cluster.driver(TRAIN_DRIVER, [storage]), cluster.env(), 400).result()
    timings = re.findall(r"TIMING (\w+(?:\.\w+)?) ([0-9.]+) s", result["_output"])
    print("\n[ray] Ray Train driver: %.1f s (%s)"
          % (result["_seconds"], ", ".join("%s at %s s" % t for t in timings)))
    assert result["leftover_groups"] == 0, result
    return result


def train_run(runs, name):
    run = runs[name]
    assert run["ok"], (run["why"] + runs["_output"][-6000:] if "why" in run
                       else json.dumps(run, indent=1, default=str)[:8000])
    return run


def test_ray_train_three_workers_give_horovods_gradients_and_report(ray_cluster, ray_train_runs):
    run = train_run(ray_train_runs, "train")
    world = run["metrics"]["world"]
    print("\n[ray] HvliteTrainer, 3 workers, one retry: fit() %.1f s, largest gradient "
          "error %.2g, metrics of step %d, ranks %s on %s"
          % (run["seconds"], run["grad_error"], run["metrics"]["step"],
             [w["rank"] for w in world], [w["host"] for w in world]))


def test_ray_train_worker_that_raises_ends_the_run_naming_it(ray_cluster, ray_train_runs):
    run = train_run(ray_train_runs, "raise")
    assert run["ranks"] and 1 in run["ranks"], run
    assert all("HvliteShutdownError" in text for text in run["others"].values()), run
    assert run["seconds"] < 20, run         # the peer timeout (60 s) is not waited out
    # hvlrun ended the world: the stand-in of rank 1 exited 1
    out = ray_train_runs["_output"].split("TIMING train")[-1].split("TIMING raise")[0]
    assert "first failure: rank 1 with exit code 1" in out, out[-6000:]
    print("\n[ray] HvliteTrainer, rank 1 raised: fit() raised %s %.1f s later (the whole "
          "fit: %.1f s); errors of ranks %s: %s" % (run["error_type"], run["seconds"],
                                                   run["call"], run["ranks"], run["others"]))


def test_ray_train_retry_forms_a_fresh_world_and_finishes(ray_cluster, ray_train_runs):
    run = train_run(ray_train_runs, "train")
    first, second = run["attempt_pids"]
    assert run["metrics"]["resumed_at"] == 1 and not set(first) & set(second), run
    print("\n[ray] HvliteTrainer, FailureConfig(max_failures=1): rank 1 raised in attempt 1 "
          "(pids %s), attempt 2 (pids %s) resumed at step %d and finished"
          % (first, second, run["metrics"]["resumed_at"]))


def test_ray_train_worker_that_dies_ends_the_run_naming_it(ray_cluster, ray_train_runs):
    run = train_run(ray_train_runs, "dies")
    out = ray_train_runs["_output"].split("TIMING raise")[-1]      # this run's lines
    died = float(re.findall(r"DYING ([0-9.]+)", out)[-1])
    # hvlrun ended the world (naming the host lost first: the worker's, or a peer's that MPI
    # ended when the worker's connections broke)
    assert re.search(r"the world of this worker group ended: hvlrun exited with code \d+", out)
    assert run["at"] - died < 20, run
    print("\n[ray] HvliteTrainer, rank 1's process killed: fit() raised %s %.1f s later (the "
          "whole fit: %.1f s); errors of ranks %s" % (run["error_type"], run["at"] - died,
                                                     run["call"], run["ranks"]))
