"""The timeline in whole jobs at 2 and 3 ranks, each under a hard timeout: HVLITE_TIMELINE (via
hvlrun --timeline-filename) covers every tensor the workload submitted with its phases; a job
whose rank 1 is SIGKILLed mid-run leaves a file that json.load reads and that covers everything
rank 0 submitted up to the kill; an unwritable path fails init on every rank. Run-time
start/stop is in tests/parallel/test_timeline.py and tests/unit/test_timeline_single.py."""
import json
import time

import pytest

import timeline_trace as tt
from jobs import MULTIPLIER, assert_job_left_no_files, run_job as _run_job


def run_job(np_, argv, env=None, **kw):
    """These jobs check the MPI path phase by phase (copy in, MPI_ALLREDUCE, copy out); the shm
    backend streams allreduces without those pieces, so it is off here."""
    return _run_job(np_, argv, env=dict(env or {}, HVLITE_SHM_DISABLE="1"), **kw)


def printed(out, tag):
    """The JSON that rank 0 printed after ``tag`` (hvlrun prefixes lines with the rank)."""
    lines = [line.split(tag, 1)[1] for line in out.splitlines() if tag in line]
    assert len(lines) == 1, out
    return json.loads(lines[0])


@pytest.mark.parametrize("np_", [2, 3])
def test_timeline_covers_every_tensor(np_, tmp_path):
    path = tmp_path / "timeline.json"
    mark = ["--timeline-mark-cycles"] if np_ == 3 else []
    job = run_job(np_, ["python", "tests/scenarios/timeline_job.py"], timeout=120,
                  hvlrun_args=["--timeline-filename", str(path)] + mark)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    submitted = printed(job.stdout, "SUBMITTED ")
    trace = tt.load(path)
    assert set(submitted) <= set(trace.tracks), set(submitted) - set(trace.tracks)
    tt.check_workload(trace, np_, 3)
    for name in submitted:
        assert trace.open_negotiations(name) == 0, name          # every negotiation ended
    marks = [e for e in trace.cycles if e["name"] == "CYCLE_START"]
    assert bool(marks) == bool(mark), len(marks)
    text = path.read_text()
    assert text.endswith("\n]\n") and not text.endswith(" \n]\n"), text[-200:]   # finished file


@pytest.mark.parametrize("np_", [2, 3])
def test_timeline_survives_a_killed_rank(np_, tmp_path):
    """"Covers" here means: every tensor rank 0 completed before the kill has its negotiation
    (begin and end), its QUEUE span and its op span with the collective inside (the full
    workload check); every tensor rank 0 had submitted but could not complete (rank 1 never
    sent it) has its negotiation begun and not ended, with rank 0's arrival (and the other
    survivor's) and none from rank 1."""
    path = tmp_path / "timeline.json"
    start = time.monotonic()
    job = run_job(np_, ["python", "tests/scenarios/timeline_kill.py"], timeout=90,
                  hvlrun_args=["--timeline-filename", str(path)])
    out = job.stdout + job.stderr
    assert job.returncode != 0 and "unreachable" not in out, out
    assert time.monotonic() - start < 60 * MULTIPLIER
    with open(path) as f:
        json.load(f)                                   # strict JSON, no repair of the tail
    trace = tt.load(path)
    completed, pending = printed(job.stdout, "SUBMITTED "), printed(job.stdout, "PENDING ")
    assert set(completed) | set(pending) <= set(trace.tracks)
    tt.check_workload(trace, np_, 2)
    survivors = {"rank %d" % r for r in range(np_) if r != 1}
    for name in pending:
        assert trace.open_negotiations(name) == 1, trace.of(name)
        assert {e["name"] for e in trace.of(name, "i")} == survivors, trace.of(name)
        assert not trace.of(name, "X"), trace.of(name)


def test_unwritable_timeline_fails_init_on_every_rank(tmp_path):
    path = str(tmp_path / "missing-dir" / "timeline.json")
    job = run_job(3, ["python", "tests/scenarios/timeline_bad_path.py"], timeout=60,
                  env={"HVLITE_TIMELINE": path}, watch_files=True)
    out = job.stdout + job.stderr
    assert_job_left_no_files(job, out, saw_mpi=False)   # the failed init finalized MPI everywhere
    lines = [line for line in job.stdout.splitlines() if "init failed:" in line]
    assert len(lines) == 3 and "UNEXPECTED" not in out, out
    for line in lines:
        assert "HVLITE_TIMELINE on rank 0: timeline: cannot open '%s' for writing: No such file or " \
               "directory" % path in line, line


@pytest.mark.parametrize("np_", [2, 3])
def test_late_rank_is_named(np_, tmp_path):
    """tests/scenarios/stall.py: the last rank submits 'lonely' 3 s after the others, twice (new,
    then cached). Both negotiations must name it as the late rank, and the stall warning shows
    on the tensor's track."""
    path = tmp_path / "timeline.json"
    job = run_job(np_, ["python", "tests/scenarios/stall.py"], timeout=60,
                  env={"HVLITE_STALL_CHECK_TIME_SECONDS": "1"},
                  hvlrun_args=["--timeline-filename", str(path)])
    assert job.returncode == 0, job.stdout + job.stderr
    trace = tt.load(path)
    late = str(np_ - 1)
    ends = trace.of("lonely", "E")
    assert len(ends) == 2, trace.of("lonely")
    for end in ends:
        assert end["args"]["late_ranks"] == late and end["args"]["rounds"] > 1, end
    begins = trace.of("lonely", "B")
    assert all(e["ts"] - b["ts"] > 2e6 for b, e in zip(begins, ends))   # waited ~3 s
    stalls = trace.of("lonely", "i", "STALL")
    assert len(stalls) == 2 and all(s["args"]["detail"] == late for s in stalls), stalls


def test_a_plane_that_streams_its_allreduce_still_shows_it(tmp_path):
    """The shm plane moves an allreduce chunk by chunk with no fusion-buffer pieces (and a device
    plane runs its batch whole): its op span still holds one <BACKEND>_ALLREDUCE span."""
    path = tmp_path / "timeline.json"
    script = ("import numpy as np, hvlite as hvd\n"
              "hvd.init()\n"
              "for step in range(2):\n"
              "    got = hvd.allreduce(np.full(1 << 18, hvd.rank() + 1.0, np.float32), name='streamed', op=hvd.Sum)\n"
              "    assert (got == 3.0).all()\n"
              "import sys; sys.path.insert(0, 'tests/scenarios'); import job_files\n"
              "job_files.report(hvd.rank())\n"
              "hvd.shutdown()\n")
    job = _run_job(2, ["python", "-c", script], timeout=120, hvlrun_args=["--timeline-filename", str(path)],
                   watch_files=True)
    assert job.returncode == 0, job.stdout + job.stderr
    assert_job_left_no_files(job, job.stdout + job.stderr)
    trace = tt.load(path)
    ops = trace.of("streamed", "X", "ALLREDUCE")
    assert [op["args"]["backend"] for op in ops] == ["shm", "shm"], ops
    assert len(trace.of("streamed", "X", "SHM_ALLREDUCE")) == 2, trace.of("streamed")
