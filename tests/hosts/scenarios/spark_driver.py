"""A Spark driver for ``tests/hosts/test_spark.py``; runs inside the master host's namespace.

It starts one SparkSession on the standalone master (``SPARK_MASTER``) and then serves the
test: each line on standard input names a scenario (and its arguments); it runs it and prints
one ``RESULT <json>`` line (``ok``: whether the scenario's own checks held). ``quit`` ends it.
One session for every scenario: a Spark application starts in tens of seconds.

  train      run() on 3 ranks: every rank's torch gradients vs a one-process reference
  raise      rank 1's function raises while ranks 0 and 2 wait in an allreduce
  slots      4 ranks asked of 3 task slots, start_timeout 8
  kill       3 ranks allreduce in a loop (rank 0 prints TICK n); the test kills a node
  elastic    run_elastic() min 2, max 3: the test kills a node, then brings it back
"""
import json
import os
import re
import sys
import time
import traceback

import cloudpickle
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_train  # noqa: E402

cloudpickle.register_pickle_by_value(cluster_train)

from pyspark.sql import SparkSession  # noqa: E402

import hvlite.spark  # noqa: E402
from hvlite.spark import JobError  # noqa: E402

STEPS = 3
STEPS_ELASTIC = 20


def say(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def train():
    out = hvlite.spark.run(cluster_train.train_once, kwargs=dict(steps=STEPS), num_proc=3,
                           start_timeout=120)
    grads, params = cluster_train.reference(STEPS)
    error = max(float(np.abs(g - r).max()) for o in out for step in range(STEPS)
                for g, r in zip(o["grads"][step], grads[step]))
    final = max(float(np.abs(p - r).max()) for o in out for p, r in zip(o["params"], params))
    hosts = [o["host"] for o in out]
    return dict(ok=[o["rank"] for o in out] == [0, 1, 2] and error < 1e-6 and final < 1e-6
                and len(set(hosts)) == 2, ranks=[o["rank"] for o in out], grad_error=error,
                param_error=final, hosts=hosts)


def rank_raises():
    def work():
        import time
        import numpy as np
        import hvlite
        hvlite.init()
        if hvlite.rank() == 1:
            time.sleep(1.0)          # its peers are waiting in the allreduce by now
            raise ValueError("rank 1 failed on purpose at %.6f" % time.time())
        return float(hvlite.allreduce(np.ones(4), name="waits-for-rank-1")[0])
    started = time.monotonic()
    try:
        hvlite.spark.run(work, num_proc=3, start_timeout=120)
        return dict(ok=False, why="no error")
    except JobError as e:
        raised = float(re.search(r"failed on purpose at ([0-9.]+)", e.traceback).group(1))
        return dict(ok=e.rank == 1 and "rank 1 failed on purpose" in e.traceback,
                    seconds=time.time() - raised, call=time.monotonic() - started, rank=e.rank,
                    message=str(e))


def too_few_slots():
    started = time.monotonic()
    try:
        hvlite.spark.run(lambda: 1, num_proc=4, start_timeout=8)
        return dict(ok=False, why="it started")
    except JobError as e:
        return dict(ok="of 4 tasks started within 8 s" in str(e),
                    seconds=time.monotonic() - started, message=str(e))


def killed_node():
    def loop():
        import time
        import numpy as np
        import hvlite
        hvlite.init()
        for i in range(100000):
            hvlite.allreduce(np.ones(1024), name="tick")
            if hvlite.rank() == 0 and i % 20 == 0:
                print("TICK %d" % i, flush=True)
            time.sleep(0.01)
    try:
        hvlite.spark.run(loop, num_proc=3, start_timeout=120)
        return dict(ok=False, why="no error")
    except JobError as e:
        return dict(ok=True, at=time.time(), message=str(e), rank=e.rank)


def elastic(hold_file):
    out = hvlite.spark.run_elastic(cluster_train.elastic_numpy, kwargs=dict(
        steps=STEPS_ELASTIC, commit_every=5, hold_at=10, hold_file=hold_file), num_proc=3,
        min_num_proc=2, max_num_proc=3, start_timeout=120, elastic_timeout=120)
    w = cluster_train.linear_reference(STEPS_ELASTIC)
    error = max(float(np.abs(np.array(o["w"]) - w).max()) for o in out)
    return dict(ok=(len(out) == 3 and [o["rank"] for o in out] == [0, 1, 2]
                    and all(o["counts"] == [1] * STEPS_ELASTIC for o in out) and error < 1e-9),
                worlds=[o["world"] for o in out], counts=out[0]["counts"], param_error=error)


SCENARIOS = {"train": train, "raise": rank_raises, "slots": too_few_slots,
             "kill": killed_node, "elastic": elastic}


def main():
    started = time.monotonic()
    address = os.environ["SPARK_MASTER"].split("//")[1].split(":")[0]
    spark = (SparkSession.builder.master(os.environ["SPARK_MASTER"]).appName("hvlite-test")
             .config("spark.driver.host", address).config("spark.driver.bindAddress", address)
             .config("spark.executor.memory", "512m").config("spark.ui.enabled", "false")
             .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
             .config("spark.executorEnv.UCX_TLS", "tcp,self")
             .config("spark.task.maxFailures", "8").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    say(ok=True, scenario="session", seconds=time.monotonic() - started)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        started = time.monotonic()
        try:
            result = SCENARIOS[words[0]](*words[1:])
        except Exception:   # noqa: BLE001 - reported to the test
            result = dict(ok=False, why=traceback.format_exc())
        result.update(scenario=words[0], wall=time.monotonic() - started)
        say(**result)
    spark.stop()


if __name__ == "__main__":
    main()
