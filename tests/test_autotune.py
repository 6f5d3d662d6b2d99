"""Autotune end to end (tests/scenarios/autotune.py under hvlrun, hard timeouts): on a synthetic
workload with tight settings it converges within warm-up + max samples, every rank reports the
same values (allgathered), results stay right while it tunes and after, the values stay fixed
once it settled, and the CSV log has its header and one row per sample. Bad settings fail init
on every rank with rank 0's reason."""
import csv
import json

import pytest

from jobs import assert_job_left_no_files, run_job

HEADER = ["sample", "phase", "fusion_threshold", "cycle_time_ms", "response_cache", "cycles",
          "bytes", "seconds", "bytes_per_second"]
THRESHOLDS = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20}
CYCLES = {0.25, 0.5, 1.0, 2.0, 5.0, 10.0}


def results(job, np_):
    """The per-rank JSON results the scenario printed (one per rank)."""
    found = [json.loads(line.split("autotune result ", 1)[1])
             for line in job.stdout.splitlines() if "autotune result " in line]
    assert sorted(r["rank"] for r in found) == list(range(np_)), job.stdout + job.stderr
    return found


def check_log(path, warmup, max_samples, chosen, cache_allowed):
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0] == HEADER
    rows = [dict(zip(HEADER, r)) for r in rows[1:]]
    assert len(rows) == warmup + max_samples == chosen["autotune_samples"], rows
    assert [int(r["sample"]) for r in rows] == list(range(1, len(rows) + 1))
    assert [r["phase"] for r in rows] == ["warmup"] * warmup + ["tune"] * max_samples
    for r in rows:
        assert int(r["fusion_threshold"]) in THRESHOLDS and float(r["cycle_time_ms"]) in CYCLES, r
        assert int(r["response_cache"]) in ((0, 1) if cache_allowed else (0,)), r
        assert int(r["cycles"]) >= 1 and int(r["bytes"]) > 0 and float(r["seconds"]) > 0, r
        assert float(r["bytes_per_second"]) == pytest.approx(int(r["bytes"]) / float(r["seconds"]), rel=1e-3)
    kept = (chosen["fusion_threshold"], chosen["cycle_time_ms"], int(chosen["response_cache"]))
    measured = {(int(r["fusion_threshold"]), float(r["cycle_time_ms"]), int(r["response_cache"]))
                for r in rows if r["phase"] == "tune"}
    assert kept in measured, "the kept values %r were never measured: %r" % (kept, measured)


@pytest.mark.parametrize("np_, how", [(2, "flags"), (3, "horovod_env")])
def test_autotune_converges_and_ranks_agree(np_, how, tmp_path):
    log = tmp_path / "autotune.csv"
    warmup, steps, max_samples = 1, 3, 8
    if how == "flags":   # hvlrun's flags, cache on: the search may switch the cache off
        args = ["--autotune", "--autotune-log-file", str(log), "--autotune-warmup-samples",
                str(warmup), "--autotune-steps-per-sample", str(steps),
                "--autotune-bayes-opt-max-samples", str(max_samples),
                "--autotune-gaussian-process-noise", "0.5"]
        env, cache_allowed = {}, True
    else:                # Horovod's variable names, no response cache to switch
        args = []
        env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
               "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": str(warmup),
               "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": str(steps),
               "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(max_samples),
               "HVLITE_CACHE_CAPACITY": "0"}
        cache_allowed = False
    job = run_job(np_, ["python", "tests/scenarios/autotune.py"], timeout=60, env=env,
                  hvlrun_args=args)
    assert job.returncode == 0, job.stdout[-6000:] + job.stderr[-3000:]
    found = results(job, np_)
    chosen = found[0]["tuning"]
    assert chosen["autotune"] == "converged"
    assert chosen["autotune_samples"] == warmup + max_samples
    for r in found:
        assert r["tuning"] == chosen, found
        assert r["every_rank"] == [r["every_rank"][0]] * np_, found
        assert r["every_rank"][0] == [float(chosen["fusion_threshold"]), chosen["cycle_time_ms"],
                                      float(chosen["response_cache"]), float(warmup + max_samples)]
    # a sample is `steps` cycles that did work; a step here is at least one such cycle
    assert found[0]["steps"] <= (warmup + max_samples) * steps + 1, found[0]
    if not cache_allowed:
        assert chosen["response_cache"] is False
    check_log(log, warmup, max_samples, chosen, cache_allowed)


@pytest.mark.parametrize("env, fragment", [
    ({"HVLITE_AUTOTUNE_LOG": "/nonexistent-dir/autotune.csv"},
     "cannot open HVLITE_AUTOTUNE_LOG '/nonexistent-dir/autotune.csv' for writing"),
    ({"HVLITE_AUTOTUNE_STEPS_PER_SAMPLE": "0"}, "HVLITE_AUTOTUNE_STEPS_PER_SAMPLE=0"),
    ({"HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "1000"}, "HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=1000"),
])
def test_bad_autotune_settings_fail_init_on_every_rank(env, fragment):
    script = ("import hvlite\ntry:\n    hvlite.init()\nexcept hvlite.HvliteError as e:\n"
              "    print('init failed:', type(e).__name__, e, flush=True)\n    raise SystemExit(3)\n")
    job = run_job(2, ["python", "-c", script], timeout=60, env=dict(env, HVLITE_AUTOTUNE="1"),
                  watch_files=True)
    out = job.stdout + job.stderr
    assert job.returncode == 3, out
    assert_job_left_no_files(job, out, saw_mpi=False)   # the failed init finalized MPI everywhere
    for rank in (0, 1):
        lines = [l for l in job.stdout.splitlines() if l.startswith("[%d]" % rank) and "init failed" in l]
        assert len(lines) == 1 and "HvliteInvalidArgument" in lines[0] and fragment in lines[0], out
