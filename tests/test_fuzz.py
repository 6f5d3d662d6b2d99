"""The collective fuzzer in CI: a short seeded run of tests/fuzz/fuzz.py per configuration of
tests/fuzz/run.py (2, 3 and 4 ranks; shared memory with default and tiny chunks, MPI only,
hierarchical over fake hosts), each one hvlrun job with a hard timeout. A run passes when every
outcome matched the plan and the run really exercised what it must: exact results, mismatches,
refusals and deadlocks. ``HVLITE_FUZZ_SEED`` picks another seed; ``make fuzz-long`` is the long
run. Also single-process checks that the fuzzer's own checks catch what they must."""
import importlib.util
import os

import numpy as np
import pytest

from jobs import ROOT


def load(name):
    """tests/fuzz/<name>.py under a name of its own (tests/parallel has a reference.py too)."""
    path = os.path.join(ROOT, "tests", "fuzz", name + ".py")
    spec = importlib.util.spec_from_file_location("fuzz_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plan, reference, run = load("plan"), load("reference"), load("run")
CONFIGS, run_config = run.CONFIGS, run.run_config

SEED = int(os.environ.get("HVLITE_FUZZ_SEED", "1000"))


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[c.name for c in CONFIGS])
def test_fuzz(index):
    config = CONFIGS[index]
    passed, summary, out = run_config(config, SEED + index)
    assert passed, "fuzz %s (seed %d) failed:\n%s" % (config.name, SEED + index, out[-12000:])
    seen = summary["outcomes (all ranks)"]
    print("fuzz %s: %r" % (config.name, summary))
    assert seen["results checked"] > 10 * config.sequences, summary
    for kind in ("error mismatch", "error invalid (in flight)", "error deadlock"):
        assert sum(v for k, v in seen.items() if k.startswith(kind)) > 0, (kind, summary)


# ---- the fuzzer's own checks fail when they must (no engine needed) ----

def test_plans_are_reproducible_and_differ_by_seed():
    a, b = plan.Planner(7, 3), plan.Planner(7, 3)
    assert repr(a.sequence(5)) == repr(b.sequence(5))
    assert repr(a.sequence(5)) != repr(plan.Planner(8, 3).sequence(5))


def test_check_catches_one_wrong_bit_and_wrong_rounding():
    call = plan.Call(op="allreduce", name="t", slot=0, dtype="int32", shape=(4,), reduce="Sum",
                     data=3)
    calls = {0: call, 1: call}
    want, bound, _ = reference.expected(calls, [0, 1], 0)
    reference.check(call, want.copy(), want, bound)
    bad = want.copy()
    bad[2] ^= 1
    with pytest.raises(reference.Mismatch):
        reference.check(call, bad, want, bound)
    moved = plan.Call(op="broadcast", name="t", slot=0, dtype="float32", shape=(3,), data=5)
    want, bound, _ = reference.expected({0: moved, 1: moved}, [0, 1], 1)
    assert bound is None                                       # data movement: bit for bit
    want[0], got = 0.0, want.copy()
    got[0] = -0.0                                              # == 0.0, but not the same bits
    with pytest.raises(reference.Mismatch):
        reference.check(moved, got, want, bound)
    fcall = plan.Call(op="allreduce", name="t", slot=0, dtype="float32", shape=(64,),
                      reduce="Average", data=4)
    want, bound, _ = reference.expected({0: fcall, 1: fcall, 2: fcall}, [0, 1, 2], 0)
    got = want.astype(np.float32)
    reference.check(fcall, got, want, bound)                  # rounded to float32: within bounds
    got[5] = np.nextafter(np.float32(want[5] + 32 * bound[5]), np.float32(1e9))
    with pytest.raises(reference.Mismatch):
        reference.check(fcall, got, want, bound)


def test_references_follow_the_engine_arithmetic():
    x = np.array([-7, 7, -128, 127], dtype=np.int8)
    assert reference.scale_int(x, 0.5).tolist() == [-3, 3, -64, 63]          # toward zero
    assert reference.scale_int(x, 3.0).tolist() == [-21, 21, -128, 127]      # saturated
    stack = np.array([[-7, 100], [0, 100]], dtype=np.int8)
    # wraps, then divides
    assert reference.reduce_int(stack, "Average", 2, 1.0, 1.0).tolist() == [-3, -28]


def test_mismatch_groups_are_worded_as_the_engine_words_them():
    sides = plan.deadlock_sides({0: ["a"], 1: ["b"], 2: ["a"]})
    assert sides == [((0, 2), ["a"]), ((1,), ["b"])]
    gather = plan.Call(op="allgather", name="t", slot=0, shape=(3, 4))
    assert plan.describe("shape", gather) == "[*, 4]"
    scaled = plan.Call(op="allreduce", name="t", slot=0, prescale=0.1)
    assert plan.describe("prescale factor", scaled) == "0.10000000000000001"
