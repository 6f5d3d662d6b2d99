"""hvlite.spark on a real Spark standalone cluster: a master and two workers (2 cores and 1
core), each JVM in its own network namespace on a bridge (``spark_cluster.py`` on
``simhosts.py``), started once for this file, with one driver session serving every test
(``scenarios/spark_driver.py``, inside the master's namespace).

  * ``run`` on 3 ranks (2 on one executor, 1 on the other): every rank's torch gradients equal
    a one-process reference, results come in rank order;
  * a rank's function that raises: the driver raises naming that rank with its traceback, and
    its peers, waiting in an allreduce, are ended at once (no timeout waited out);
  * four ranks asked of three task slots: the run fails after ``start_timeout``, saying how
    many tasks the cluster runs at once;
  * a node killed mid-job (its worker, executor and every other process): the job ends,
    naming its host;
  * ``run_elastic`` (min 2, max 3) loses the 1-core node, goes on with two ranks, gets the node
    back (its worker restarted: Spark retries the lost task there) and finishes with three,
    every step applied once.

After every test no process of the job is left on any host and no MPI or hvlite file in any
node's own ``/dev/shm``; after the file, the namespaces are gone and no ``/dev/shm`` file of
ours is left on the machine. Skips, saying why, without pyspark or Java, or without root.
"""
import os
import re
import sys
import time

import pytest

from cluster_common import (Driver, assert_no_job_left, host_tables, new_unheld_shm,
                            shm_files)
from simhosts import SimHosts, missing_requirements, _netns_names
from spark_cluster import SparkCluster, spark_missing

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "scenarios", "spark_driver.py")
JOB_SHM = ("mpich_shm_", "hvlite-")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = spark_missing() or missing_requirements()
    if why:
        pytest.skip(why)
    before = shm_files()
    driver_tmp = str(tmp_path_factory.mktemp("spark-driver-tmp"))
    sim = SimHosts(3, tmp_path_factory.mktemp("spark-hosts"))
    sim.start()
    spark = SparkCluster(sim, {"h2": 2, "h3": 1})
    driver = None
    try:
        spark.start()
        driver = Driver(spark.driver(DRIVER), dict(spark.env(), TMPDIR=driver_tmp), 1500,
                        interactive=True)
        session = driver.answer(0, 180)
        sys.stdout.write("\n[spark] master and 2 workers up in %.1f s, driver session in %.1f s\n"
                         % (spark.start_seconds, session["seconds"]))
        spark.session = driver
        yield spark
    finally:
        if driver is not None and driver.proc.poll() is None:
            driver.ask("quit")
            try:
                driver.proc.wait(60)
            except Exception:   # noqa: BLE001 - killed with the hosts below
                pass
        spark.close()
        sim.close()
    assert not [n for n in _netns_names() if n.startswith(sim.tag)], "namespaces left"
    assert not os.path.exists(spark.workdir), "Spark's directory left"
    time.sleep(1.0)
    assert not new_unheld_shm(before), "/dev/shm files left: %s" % new_unheld_shm(before)
    assert not host_tables(driver_tmp), "host tables left: %s" % host_tables(driver_tmp)


@pytest.fixture
def spark(cluster):
    yield cluster
    assert_no_job_left(cluster.sim)
    for host in cluster.sim.hosts:
        left = [f for f in cluster.node_shm(host) if f.startswith(JOB_SHM)]
        assert not left, "/dev/shm files left on %s: %s" % (host, left)


def scenario(spark, command, timeout):
    result = spark.session.answer(spark.session.ask(command), timeout)
    assert result["ok"], result.get("why", "") + result["_output"][-6000:]
    return result


def test_three_rank_torch_job_gives_horovods_gradients_in_rank_order(spark):
    result = scenario(spark, "train", 300)
    assert result["grad_error"] < 1e-6
    print("\n[spark] 3-rank torch job: %.1f s, ranks %s on %s, largest gradient error %.2g"
          % (result["wall"], result["ranks"], result["hosts"], result["grad_error"]))


def test_a_rank_that_raises_is_named_and_its_peers_do_not_wait(spark):
    result = scenario(spark, "raise", 200)
    assert "ValueError: rank 1 failed on purpose" in result["message"], result["message"]
    assert result["seconds"] < 20, result     # the peer timeout (60 s) is not waited out
    print("\n[spark] rank 1 raised: the driver raised %.1f s later (the whole run: %.1f s)"
          % (result["seconds"], result["call"]))


def test_too_few_slots_fail_at_start_in_time(spark):
    result = scenario(spark, "slots", 120)
    assert 8 <= result["seconds"] < 25, result
    assert "the cluster runs 3 tasks at once" in result["message"], result["message"]
    print("\n[spark] 4 ranks on 3 slots: failed after %.1f s" % result["seconds"])


def test_a_killed_node_ends_the_plain_job_naming_it(spark):
    sim, session = spark.sim, spark.session
    at = session.ask("kill")
    session.wait_for(r"<stdout>: TICK 40\b", at, 200)
    killed = time.time()
    spark.kill_node("h3")
    result = session.answer(at, 120)
    restart = spark.restart_node("h3")
    assert result["ok"], result
    seconds = result["at"] - killed
    dead = "spark-%s-" % sim.addr("h3").replace(".", "-")
    assert dead in result["message"], result["message"]
    assert seconds < 20, result
    print("\n[spark] node h3 killed: the driver raised after %.1f s: %s (worker restarted in "
          "%.1f s)" % (seconds, result["message"].splitlines()[0][:200], restart))


def test_an_elastic_job_loses_a_node_and_gets_it_back(spark, tmp_path):
    session = spark.session
    hold = tmp_path / "hold"
    hold.write_text("")
    at = session.ask("elastic %s" % hold)
    first = session.wait_for(r"<stdout>: HOLDING w=\d+ .*size=3", at, 300)
    spark.kill_node("h3")
    shrunk = session.wait_for(r"<stdout>: HOLDING w=\d+ .*size=2", first, 200)
    spark.restart_node("h3")
    session.wait_for(r"<stdout>: BEGIN w=\d+ .*size=3", shrunk, 200)
    hold.unlink()
    result = session.answer(at, 200)
    assert result["ok"], result.get("why", "") + result["_output"][-6000:]
    out = result["_output"]
    sizes = [int(n) for n in re.findall(r"elastic: world 1: (\d+) ranks|-> world \d+ \((\d+) "
                                         r"ranks", out) for n in n if n]
    # three ranks, then two (the node lost), then three again (it came back)
    assert re.search("3.*2.*3$", "".join(map(str, sizes))), (sizes, out[-6000:])
    print("\n[spark] elastic: %.1f s, world sizes %s, %d of %d steps applied once on every rank"
          % (result["wall"], sizes, result["counts"].count(1), len(result["counts"])))
    print("[spark] elastic re-forms: %s" % re.findall(r"re-forming: .*?reason: ([^;\n]*)", out))
