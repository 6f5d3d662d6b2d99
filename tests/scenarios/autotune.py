"""Scenario: autotune on a synthetic workload. Each step submits many small named allreduces
(every dtype, fixed shapes, new seeded values each step) and checks every result against the
NumPy reference on this rank, while autotune tunes and after it settled. Steps repeat until every
rank sees autotune converged (decided together, by a Min allreduce); then more steps run and the
values must not change. Prints one line per rank: 'autotune result <json>', with this rank's
values and every rank's values (allgathered), for tests/test_autotune.py to compare.
Run under hvlrun with HVLITE_AUTOTUNE=1 (or --autotune)."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parallel"))
from reference import DTYPES, assert_equal, inputs, reduce  # noqa: E402

import hvlite as hvd  # noqa: E402

TENSORS = 30
MAX_STEPS = 2000          # far beyond what the tight settings of the test need
AFTER_STEPS = 10
FIELDS = ("fusion_threshold", "cycle_time_ms", "response_cache", "autotune_samples")


def step(k, rank, size):
    """One training-like step: TENSORS allreduces submitted together, each checked."""
    cases = []
    for i in range(TENSORS):
        dtype = DTYPES[i % len(DTYPES)]
        shape = (1 + (i * 997) % 8000,)      # 1 B to 64 KiB: batches depend on the threshold
        mine = inputs(k * TENSORS + i, rank, dtype, shape)
        handle = hvd.allreduce_async(mine, name="tune.%d" % i, op=hvd.Sum)
        cases.append((i, dtype, shape, handle))
    for i, dtype, shape, handle in cases:
        stack = np.stack([inputs(k * TENSORS + i, r, dtype, shape) for r in range(size)])
        assert_equal(hvd.synchronize(handle), reduce(stack, "Sum", dtype, size),
                     "step %d tensor %d (%s)" % (k, i, dtype.name))


def everyone_converged():
    mine = np.array([hvd.engine_tuning()["autotune"] == "converged"], np.int32)
    return bool(hvd.allreduce(mine, op=hvd.Min, name="tune.converged")[0])


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert hvd.engine_tuning()["autotune"] == "tuning", hvd.engine_tuning()
    steps = 0
    while not everyone_converged():
        assert steps < MAX_STEPS, "autotune did not converge in %d steps: %r" % (steps, hvd.engine_tuning())
        step(steps, rank, size)
        steps += 1
    chosen = hvd.engine_tuning()
    for k in range(AFTER_STEPS):
        step(steps + k, rank, size)
    assert hvd.engine_tuning() == chosen, "values changed after convergence: %r, then %r" % (chosen, hvd.engine_tuning())
    row = np.array([[float(chosen[f]) for f in FIELDS]])
    every = hvd.allgather(row, name="tune.values")
    print("autotune result " + json.dumps({"rank": rank, "steps": steps, "tuning": chosen,
                                           "every_rank": every.tolist()}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
