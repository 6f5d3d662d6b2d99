"""The timeline on a one-rank job (rank 0 is the writer): the run-time API, its errors, a file
that stays valid JSON when the process is killed with SIGKILL while it records, and how a GPU
batch's phases are drawn (recorded through the engine's own hooks by a probe: no GPU here).
Multi-rank coverage is in tests/test_timeline.py and tests/parallel/test_timeline.py; the GPU's
own in tests/gpu/test_nccl_plane.py."""
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hvlite as hvd
from hvlite.runner.procs.job_files import mapped_shm, remove_unused

ROOT = __file__.rsplit("/tests/", 1)[0]
sys.path.insert(0, os.path.join(ROOT, "tests"))
import timeline_trace as tt  # noqa: E402
from c_check import load_probe  # noqa: E402  (tests/unit, beside this file)

MULTIPLIER = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))


@pytest.fixture(scope="module", autouse=True)
def engine():
    hvd.init()
    yield
    hvd.stop_timeline()


def run_py(code, env=None, timeout=60):
    full_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout * MULTIPLIER, env=full_env, cwd=ROOT)


def test_start_stop_at_run_time_covers_the_tensors(tmp_path):
    path = tmp_path / "t.json"
    hvd.start_timeline(str(path))
    names = tt.run_workload(hvd, 3, tag="unit.")
    hvd.stop_timeline()
    trace = tt.load(path)
    tt.check_workload(trace, 1, 3, tag="unit.")
    assert set(names) <= set(trace.tracks)
    assert not [e for e in trace.cycles if e["name"] == "CYCLE_START"]   # not asked for


def test_mark_cycles_and_path_objects(tmp_path):
    path = tmp_path / "cycles.json"
    hvd.start_timeline(path, mark_cycles=True)            # an os.PathLike works too
    hvd.allreduce(np.ones(4), name="unit.marked")
    time.sleep(0.1)                                        # idle cycles are marked as well
    hvd.stop_timeline()
    trace = tt.load(path)
    marks = [e for e in trace.cycles if e["name"] == "CYCLE_START"]
    assert len(marks) >= 2 and all(e["ph"] == "i" for e in marks)
    assert trace.of("unit.marked", "X", "ALLREDUCE")


def test_start_again_finishes_the_first_file(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    hvd.start_timeline(str(first))
    hvd.allreduce(np.ones(4), name="unit.first")
    hvd.start_timeline(str(second))
    hvd.allreduce(np.ones(4), name="unit.second")
    hvd.stop_timeline()
    hvd.stop_timeline()                                    # nothing open: no-op
    a, b = tt.load(first), tt.load(second)
    assert "unit.first" in a.tracks and "unit.second" not in a.tracks
    assert "unit.second" in b.tracks and "unit.first" not in b.tracks


def test_unwritable_path_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "no" / "such" / "dir" / "t.json")
    with pytest.raises(hvd.HvliteInvalidArgument, match="cannot open '%s' for writing: No such file or directory"
                       % missing.replace(".", r"\.")):
        hvd.start_timeline(missing)
    with pytest.raises(ValueError, match="needs a file path"):
        hvd.start_timeline("")
    with pytest.raises(ValueError, match="needs a file path"):
        hvd.start_timeline(None)
    assert (hvd.allreduce(np.ones(3), op=hvd.Sum) == 1).all()      # the engine is unaffected


def test_before_init_raises_value_error():
    r = run_py("import hvlite\nfor f in (lambda: hvlite.start_timeline('x.json'), hvlite.stop_timeline):\n"
               "    try:\n        f()\n    except ValueError as e:\n        print('VE', e)")
    assert r.stdout.count("VE hvlite has not been initialized") == 2, r.stdout + r.stderr


def test_env_names_and_horovod_alias(tmp_path):
    path = tmp_path / "env.json"
    r = run_py("import numpy as np, hvlite; hvlite.init(); hvlite.allreduce(np.ones(2), name='env.t')",
               env={"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert r.returncode == 0, r.stderr
    trace = tt.load(path)                                   # closed at exit (atexit shutdown)
    assert trace.of("env.t", "E") and any(e["name"] == "CYCLE_START" for e in trace.cycles)


BUSY = """
import os, sys, numpy as np, hvlite as hvd
hvd.init()
arrays = [np.ones(2000 + i, np.float32) for i in range(40)]
step = 0
while True:
    hvd.grouped_allreduce(arrays, name="busy", op=hvd.Sum)
    if step == 20:
        print("recording", flush=True)
    step += 1
"""


def test_sigkill_while_recording_leaves_valid_json(tmp_path):
    """A one-rank job records ~40 tensors a step, continuously; it is killed with SIGKILL at a
    random moment, several times. Each file must json.load, and hold the steps written so far."""
    rng = random.Random(5)
    for attempt in range(4):
        path = tmp_path / ("busy%d.json" % attempt)
        env = dict(os.environ, PYTHONPATH=ROOT, HVLITE_TIMELINE=str(path))
        proc = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)
        try:
            assert proc.stdout.readline().strip() == "recording"
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            # killed outside hvlrun, the process leaves MPI's /dev/shm file: remove it as hvlrun would
            mapped = mapped_shm(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30 * MULTIPLIER)
            remove_unused(mapped, wait=5.0)
        with open(path) as f:
            events = json.load(f)                          # strict: no repair of a missing tail
        trace = tt.load(path)
        assert len(events) > 100 and len(trace.of("busy.0", "X", "ALLREDUCE")) >= 10


@pytest.fixture(scope="module")
def phases_probe(tmp_path_factory):
    return load_probe("timeline_probe", tmp_path_factory.mktemp("probe"))


PHASES = ["WAIT_FOR_INPUTS", "MEMCPY_IN_FUSION_BUFFER", "NCCL_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]


def test_a_gpu_batch_is_drawn_phase_by_phase(tmp_path, phases_probe):
    """An NCCL batch's four phase ends (GPU events, on the host clock) become its tensors' spans:
    every phase that took time, in order, inside the op; a batch without fusion copies (its
    copy points at the phases beside, as the NCCL plane reports a lone tensor or a group of
    per-tensor calls) has no copy spans; a time out of order is clamped to the phase before.
    Batches left running past their cycle (HVLITE_NCCL_OVERLAP), which overlap on the host
    clock, go on a track of their own, one after the other, so every track still nests."""
    path = tmp_path / "phases.json"
    hvd.start_timeline(str(path))
    time.sleep(0.05)                  # the batches began after the timeline did (times before it clamp)
    batches = {         # name: (tensors, began ms ago, phase ends in ms from start, left running)
        "fused": (2, 10.0, [2.0, 4.0, 8.0, 9.0], 1),
        "alone": (1, 10.0, [3.0, 3.0, 7.0, 7.0], 0),
        "shuffled": (2, 10.0, [5.0, 3.0, 8.0, 9.0], 1),
        "grouped": (3, 10.0, [3.0, 3.0, 7.0, 7.0], 1),
    }
    for name, (count, began, ends, left_running) in batches.items():
        assert phases_probe.probe_device_batch(name.encode(), count, ctypes.c_double(began),
                                               (ctypes.c_double * 4)(*ends), left_running) == 0
    hvd.stop_timeline()
    trace = tt.load(str(path))                      # checks that every track nests
    expected = {                      # name: [(span, duration ms)]
        "fused": [(PHASES[0], 2), (PHASES[1], 2), (PHASES[2], 4), (PHASES[3], 1)],
        "alone": [(PHASES[0], 3), (PHASES[2], 4)],
        "shuffled": [(PHASES[0], 5), (PHASES[2], 3), (PHASES[3], 1)],
        "grouped": [(PHASES[0], 3), (PHASES[2], 4)],
    }
    for name, spans in expected.items():
        for t in range(batches[name][0]):
            track = "%s.%d" % (name, t)
            op = trace.of(track, "X", "ALLREDUCE")
            assert len(op) == 1 and op[0]["args"]["backend"] == "nccl", op
            got = [e for e in trace.of(track, "X") if e["name"] in PHASES]
            assert [e["name"] for e in got] == [s for s, _ in spans], (track, got)
            for e, (_, ms) in zip(got, spans):
                assert abs(e["dur"] - ms * 1e3) < 50, (track, e)     # microseconds
            for before, after in zip(got, got[1:]):                  # one after the other
                assert abs(before["ts"] + before["dur"] - after["ts"]) < 2, (before, after)
            assert got[0]["ts"] >= op[0]["ts"] - 1
            assert got[-1]["ts"] + got[-1]["dur"] <= op[0]["ts"] + op[0]["dur"] + 1
    running = trace.of("GPU batches left running", "X")
    assert [(e["name"], e["args"]["tensors"]) for e in running] == [("ALLREDUCE", 2), ("ALLREDUCE", 2),
                                                                    ("ALLREDUCE", 3)], running
    for before, after in zip(running, running[1:]):
        assert before["ts"] + before["dur"] <= after["ts"] + 1, (before, after)
    on_cycle_track = [e for e in trace.events[0] if e["ph"] == "X" and e["name"] == "ALLREDUCE"]
    assert [e["args"]["tensors"] for e in on_cycle_track] == [1], on_cycle_track
