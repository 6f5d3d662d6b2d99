"""Ray driver scenarios for ``tests/hosts/test_ray.py``; run inside the head host's namespace.

``python ray_driver.py SCENARIO [ARGS...]`` connects to the cluster (``RAY_ADDRESS``), runs the
scenario, and prints one ``RESULT <json>`` line (``ok``: whether the scenario's own checks
held; what the test asserts on). After every scenario the executor is shut down and the driver
checks that no placement group of the job is left (printed as ``leftover_groups``).

  train      3 ranks, Trainer built once; 3 execute() calls: gradients vs a one-process reference;
             two run_remote() in flight (each rank runs them in order); an unpicklable value
  raise      rank 1's function raises while ranks 0 and 2 wait in an allreduce
  slots      4 workers asked of a 3-CPU cluster, placement_group_timeout_s 4
  kill       3 ranks allreduce in a loop (rank 0 prints TICK n); the test kills a node
  elastic    min_workers 2, max_workers 3: a slot actor frozen 4 s (its node kept), then for
             good (its node dropped, its actor killed, the node back); the test kills a node,
             then brings it back; a second run() returns its own results
"""
import json
import os
import re
import sys
import time
import traceback

import cloudpickle
import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_train  # noqa: E402

cloudpickle.register_pickle_by_value(cluster_train)

from hvlite.ray import JobError, RayExecutor  # noqa: E402

STEPS = 3
STEPS_ELASTIC = 20


def say(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def timing(what, since):
    sys.stderr.write("TIMING %s %.1f s\n" % (what, time.monotonic() - since))
    return time.monotonic()


def train(executor):
    t = time.monotonic()
    executor.start(executable_cls=cluster_train.Trainer)
    t = timing("start+Trainer", t)
    grads, params = cluster_train.reference(STEPS)
    errors, ranks, pids = [], [], set()
    for step in range(STEPS):
        out = executor.execute(lambda w, s=step: w.step(s))
        t = timing("execute", t)
        ranks.append([o["rank"] for o in out])
        pids.add(tuple(o["pid"] for o in out))
        for o in out:
            errors.append(max(float(np.abs(g - r).max()) for g, r in zip(o["grads"], grads[step])))
    final = [max(float(np.abs(p - r).max()) for p, r in zip(o["params"], params)) for o in out]
    hosts = executor.run(lambda: __import__("os").environ.get("HVLRUN_HOST"))
    single = executor.execute_single(lambda w: w.hvd.rank())
    refs = executor.run_remote(lambda: __import__("hvlite").size())
    # two calls in flight at once: every rank runs them in the order issued, each call gets
    # its own answers (the ranks' allreduces would mismatch if one ran them the other way)
    first = executor.run_remote(_tagged, args=["first", 0.5])
    second = executor.run_remote(_tagged, args=["second", 0.0])
    in_flight = [ray.get(second), ray.get(first)]
    unpicklable = _unpicklable(executor)
    after = executor.run(lambda: __import__("hvlite").rank())
    ok = (all(r == [0, 1, 2] for r in ranks) and len(pids) == 1 and max(errors) < 1e-6
          and max(final) < 1e-6 and len(set(hosts)) == 3 and single == 0
          and ray.get(refs) == [3, 3, 3]
          and in_flight == [[["second", 2.0, i] for i in range(3)],
                            [["first", 1.0, i] for i in range(3)]]
          and "rank 0 (host" in unpicklable and "_thread.lock" in unpicklable
          and after == [0, 1, 2])
    return dict(ok=ok, ranks=ranks, grad_error=max(errors), param_error=max(final),
                hosts=hosts, same_processes=len(pids) == 1, in_flight=in_flight,
                unpicklable=unpicklable)


def _tagged(tag, wait):
    """An allreduce named by ``tag`` (each rank's order of calls shows in its value)."""
    import time
    import numpy as np
    import hvlite
    time.sleep(wait)
    value = 1.0 if tag == "first" else 2.0
    total = hvlite.allreduce(np.full(4, value), name="in-flight", op=hvlite.Average)
    return [tag, float(total[0]), hvlite.rank()]


def _unpicklable(executor):
    """A value that cannot be pickled: a JobError naming the rank and the type."""
    try:
        executor.run(lambda: __import__("threading").Lock())
        return "no error"
    except JobError as e:
        return str(e)


def rank_raises(executor):
    executor.start()
    executor.run(lambda: __import__("hvlite").init())

    def work():
        import time
        import numpy as np
        import hvlite
        if hvlite.rank() == 1:
            time.sleep(1.0)          # its peers are waiting in the allreduce by now
            raise ValueError("rank 1 failed on purpose at %.6f" % time.time())
        return float(hvlite.allreduce(np.ones(4), name="waits-for-rank-1")[0])
    started = time.monotonic()
    try:
        executor.run(work)
        return dict(ok=False, why="no error")
    except JobError as e:
        raised = float(re.search(r"failed on purpose at ([0-9.]+)", e.traceback).group(1))
        seconds, call = time.time() - raised, time.monotonic() - started
        later = _later_call(executor)
        return dict(ok=e.rank == 1 and "rank 1 failed on purpose" in e.traceback,
                    seconds=seconds, call=call, rank=e.rank, host=e.host, message=str(e),
                    later=later)


def _later_call(executor):
    try:
        executor.run(lambda: 1)
        return "no error"
    except JobError as e:
        return str(e)


def too_few_slots():
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=4)
    executor = RayExecutor(settings, num_workers=4)
    started = time.monotonic()
    try:
        executor.start()
        return dict(ok=False, why="it started")
    except JobError as e:
        return dict(ok="cannot place 4 workers" in str(e), seconds=time.monotonic() - started,
                    message=str(e))
    finally:
        executor.shutdown()


def killed_node(executor):
    executor.start()

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
        executor.run(loop)
        return dict(ok=False, why="no error")
    except JobError as e:
        return dict(ok=True, at=time.time(), message=str(e), rank=e.rank)


def elastic(hold_file):
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, min_workers=2, max_workers=3, elastic_timeout=120)
    try:
        executor.start()
        frozen = _frozen_actor(executor._elastic)
        out = executor.run(cluster_train.elastic_numpy, kwargs=dict(
            steps=STEPS_ELASTIC, commit_every=5, hold_at=10, hold_file=hold_file))
        again = executor.run(lambda: "second run")     # its own results, not the first run's
    finally:
        executor.shutdown()
    w = cluster_train.linear_reference(STEPS_ELASTIC)
    error = max(float(np.abs(np.array(o["w"]) - w).max()) for o in out)
    return dict(ok=(len(out) == 3 and [o["rank"] for o in out] == [0, 1, 2]
                    and all(o["counts"] == [1] * STEPS_ELASTIC for o in out) and error < 1e-9
                    and frozen["kept"] and frozen["back"] and again == ["second run"] * 3),
                worlds=[o["world"] for o in out], counts=out[0]["counts"], param_error=error,
                frozen=frozen, again=again)


def _frozen_actor(job):
    """Freeze one slot actor (SIGSTOP) for 4 s: its node is kept (a few missed pings); then
    until its node is dropped: its actors are killed, so the node's new actor can be placed
    and it comes back (its resources freed)."""
    import signal
    deadline = time.monotonic() + 60
    while len([n for n in job._nodes.values() if n.name]) < 3:
        if time.monotonic() > deadline:
            return dict(kept=False, back=False, why="3 nodes never ready")
        time.sleep(0.2)
    node, entry = sorted(job._nodes.items())[0]
    pid = entry.infos[0]["pid"]
    try:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(4.0)
        os.kill(pid, signal.SIGCONT)
        time.sleep(2.0)
        kept = job._nodes.get(node) is entry
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while job._nodes.get(node) is entry and time.monotonic() - stopped < 60:
            time.sleep(0.2)
        dropped = time.monotonic() - stopped
        while time.monotonic() - stopped < 120:
            now = job._nodes.get(node)
            if now is not None and now is not entry and now.name:
                return dict(kept=kept, back=True, dropped_s=dropped,
                            back_s=time.monotonic() - stopped)
            time.sleep(0.2)
        return dict(kept=kept, back=False, dropped_s=dropped)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def main():
    scenario = sys.argv[1]
    t = time.monotonic()
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
    timing("ray.init", t)
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60)
    executor = RayExecutor(settings, num_workers=3)
    try:
        if scenario == "train":
            result = train(executor)
        elif scenario == "raise":
            result = rank_raises(executor)
        elif scenario == "slots":
            result = too_few_slots()
        elif scenario == "kill":
            result = killed_node(executor)
        elif scenario == "elastic":
            result = elastic(sys.argv[2])
        else:
            raise SystemExit("unknown scenario %r" % scenario)
    except Exception:   # noqa: BLE001 - reported to the test
        result = dict(ok=False, why=traceback.format_exc())
    finally:
        executor.shutdown()
    groups = [g for g in ray.util.placement_group_table().values()
              if g.get("state") not in ("REMOVED",)]
    result["leftover_groups"] = len(groups)
    say(**result)
    ray.shutdown()


if __name__ == "__main__":
    main()
