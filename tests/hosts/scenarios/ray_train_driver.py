"""Ray Train driver for ``tests/hosts/test_ray.py``: ``HvliteTrainer`` runs, inside the head
host's namespace.

``python ray_train_driver.py STORAGE`` connects to the cluster (``RAY_ADDRESS``), runs three
``HvliteTrainer.fit()`` calls with 3 workers, and prints one ``RESULT <json>`` line with a part
per run (each with its own ``ok``):

  train   torch, 3 steps of :func:`cluster_train.ray_train_loop`, FailureConfig(max_failures=1);
          rank 1 raises at step 1 of the first attempt; the second attempt (a fresh world in
          fresh workers) resumes from the step-0 checkpoint. Every rank's averaged gradients,
          of both attempts, equal a one-process reference; the Result's metrics are the last
          report's; hvlite's rank, size and local rank are Ray Train's, on 3 hosts
  raise   NumPy (:func:`cluster_train.ray_train_numpy`), rank 1 raises at step 1 while ranks 0
          and 2 wait in an allreduce, no retry: fit() raises Ray Train's error naming rank 1
          with its ValueError, the others' errors are hvlite's shutdown; how long after the
          raise
  dies    as raise, but rank 1's process kills itself (SIGKILL): fit() raises naming rank 1's
          worker; how long after the death

The controller polls its workers every 0.5 s (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``; Ray's
default is 2 s). After the runs the driver counts the placement groups that are not removed
(``leftover_groups``).
"""
import json
import os
import re
import sys
import time
import traceback

import numpy as np
import ray
import ray.cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_train  # noqa: E402

ray.cloudpickle.register_pickle_by_value(cluster_train)

import ray.train  # noqa: E402

from hvlite.ray import HvliteConfig, HvliteTrainer  # noqa: E402

STEPS = 3


def fit(storage, name, loop, raise_at=None, max_failures=0, die_at=None):
    trainer = HvliteTrainer(
        loop,
        train_loop_config={"steps": STEPS, "raise_at": raise_at, "die_at": die_at},
        hvlite_config=HvliteConfig(timeout_s=60),
        scaling_config=ray.train.ScalingConfig(num_workers=3),
        run_config=ray.train.RunConfig(
            storage_path=storage, name=name,
            failure_config=ray.train.FailureConfig(max_failures=max_failures)))
    return trainer.fit()


def saved_state(result):
    import torch
    with result.checkpoint.as_directory() as d:
        return torch.load(os.path.join(d, "state.pt"), weights_only=False)


def gradients_error(saved):
    """The largest difference between any rank's averaged gradients and the reference."""
    reference, _ = cluster_train.reference(STEPS)
    assert len(saved["grads"]) == STEPS and all(len(g) == 3 for g in saved["grads"])
    return max(float(np.abs(g - r).max()) for step, ranks in enumerate(saved["grads"])
               for grads in ranks for g, r in zip(grads, reference[step]))


def lined_up(world):
    return ([w["rank"] for w in world] == [0, 1, 2]
            and all(w["rank"] == w["ray_rank"] and w["local_rank"] == w["ray_local_rank"]
                    and w["size"] == 3 for w in world)
            and len({w["host"] for w in world}) == 3)


def train(storage):
    started = time.monotonic()
    result = fit(storage, "train", cluster_train.ray_train_loop, raise_at=(1, 1),
                 max_failures=1)
    metrics, saved = result.metrics, saved_state(result)
    error = gradients_error(saved)
    first, last = set(saved["pids"][0]), set(saved["pids"][-1])
    return dict(ok=(metrics["step"] == STEPS - 1 and error < 1e-6 and lined_up(metrics["world"])
                    and metrics["resumed_at"] == 1 and not first & last),
                seconds=time.monotonic() - started, grad_error=error, metrics=metrics,
                attempt_pids=[sorted(first), sorted(last)])


def raises(storage):
    started = time.monotonic()
    try:
        fit(storage, "raise", cluster_train.ray_train_numpy, raise_at=(1, 1))
        return dict(ok=False, why="fit() returned")
    except ray.train.TrainingFailedError as e:
        now = time.time()
        failures = getattr(e, "worker_failures", {})
        own = "%s: %s" % (type(failures.get(1)).__name__, failures.get(1))
        at = re.findall(r"^ValueError: rank 1 failed on purpose at ([0-9.]+)", own)
        others = {r: "%s: %s" % (type(f).__name__, f) for r, f in failures.items() if r != 1}
        return dict(ok=bool(at), seconds=now - float(at[-1]) if at else None,
                    call=time.monotonic() - started, error_type=type(e).__name__,
                    ranks=sorted(failures), others=others, own=own[-2000:],
                    message=str(e)[:3000])



def dies(storage):
    started = time.monotonic()
    try:
        fit(storage, "dies", cluster_train.ray_train_numpy, die_at=(1, 1))
        return dict(ok=False, why="fit() returned")
    except ray.train.TrainingFailedError as e:
        now = time.time()
        failures = getattr(e, "worker_failures", {})
        text = {r: "%s: %s" % (type(f).__name__, f) for r, f in failures.items()}
        return dict(ok=1 in failures, at=now, call=time.monotonic() - started,
                    error_type=type(e).__name__, ranks=sorted(failures),
                    own=text.get(1, "")[-1500:], others={r: t[-300:] for r, t in text.items()
                                                         if r != 1})


def main():
    storage = sys.argv[1]
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    started = time.monotonic()
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
    sys.stderr.write("TIMING ray.init %.1f s\n" % (time.monotonic() - started))
    result = {}
    for name, run in (("train", train), ("raise", raises), ("dies", dies)):
        try:
            result[name] = run(storage)
        except Exception:   # noqa: BLE001 - reported to the test
            result[name] = dict(ok=False, why=traceback.format_exc())
        sys.stderr.write("TIMING %s %.1f s\n" % (name, time.monotonic() - started))
    groups = [g for g in ray.util.placement_group_table().values()
              if g.get("state") not in ("REMOVED",)]
    result["leftover_groups"] = len(groups)
    result["ok"] = all(result[n]["ok"] for n in ("train", "raise", "dies"))
    print("RESULT " + json.dumps(result, default=str), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
