"""HVLITE_LOG_LEVEL and rank-tagged lines, and conditions that repeat (every init, every step)
logged once per process, in whole jobs with hard timeouts."""
import re

from jobs import run_job

BAD_ENV = {"HVLITE_BOGUS_KNOB": "1", "HVLITE_CYCLE_TIME": "fast"}
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} "    # Horovod's default: lines start with it


def test_repeated_conditions_are_logged_once_per_rank():
    job = run_job(2, ["python", "tests/scenarios/log_once.py"], timeout=180, env=BAD_ENV)
    out = job.stdout + job.stderr
    assert job.returncode == 0 and out.count("log scenario done") == 2, out
    for text in ("unknown setting HVLITE_BOGUS_KNOB ignored", "ignoring HVLITE_CYCLE_TIME=fast: not a valid value",
                 "optimizer.step() called without optimizer.skip_synchronize() context"):
        lines = [line for line in out.splitlines() if text in line]
        assert len(lines) == 2, "%r: %d lines (3 inits / 5 steps on 2 ranks)\n%s" % (text, len(lines), out)
    for rank in (0, 1):                  # engine lines carry the rank
        assert re.search(r"\[%shvlite rank %d tid \d+\] WARNING: unknown setting HVLITE_BOGUS_KNOB"
                         % (STAMP, rank), out), out


def test_log_levels():
    quiet = run_job(2, ["python", "examples/data_stats.py"], timeout=60,
                    env=dict(BAD_ENV, HVLITE_LOG_LEVEL="error"))
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "WARNING" not in quiet.stderr and "hvlite rank" not in quiet.stderr, quiet.stderr
    loud = run_job(2, ["python", "examples/data_stats.py"], timeout=60,
                   env={"HVLITE_LOG_LEVEL": "debug"})
    err = loud.stderr
    assert loud.returncode == 0, loud.stdout + err
    assert re.search(r"\[%shvlite rank 0 tid \d+\] INFO: hvlite starting: 2 ranks" % STAMP, err), err
    assert re.search(r"\[%shvlite rank 0 tid \d+\] DEBUG: settings: fusion_threshold=" % STAMP, err), err
    assert "TRACE" not in err, err
    hidden = run_job(2, ["python", "examples/data_stats.py"], timeout=60,
                     env={"HVLITE_LOG_LEVEL": "info", "HOROVOD_LOG_HIDE_TIME": "1"})
    assert re.search(r"<stderr>: \[hvlite rank 0 tid \d+\] INFO: hvlite starting", hidden.stderr), hidden.stderr
