"""Never hang: collective deadlocks end on every rank with HvliteDeadlockError naming each side
(tests/scenarios/deadlock.py), waits that are not deadlocks do not error, and a stopped peer
ends the others within the peer timeout, named (tests/scenarios/stopped_peer.py). Every job runs
under hvlrun with a hard timeout; no shared-memory file of hvlite's is left behind."""
import re
import time

import pytest

from jobs import MULTIPLIER, assert_job_left_no_files, run_job


def run_case(np_, case, framework="numpy", timeout=90, env=None):
    start = time.monotonic()
    job = run_job(np_, ["python", "tests/scenarios/deadlock.py", case, framework], timeout=timeout, env=env,
                  watch_files=True)
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    for r in range(np_):
        assert "rank %d usable" % r in out, out      # the engine goes on after the error
    assert_job_left_no_files(job, out)        # only this job's files: others may run beside it
    return out, elapsed


def deadlocked(out, ranks):
    """The deadlock lines of `ranks` (each rank must have exactly one)."""
    lines = [re.search(r"rank %d deadlock after ([\d.]+) s \(\w+\): (.*)" % r, out) for r in ranks]
    assert all(lines), out
    return [(float(m.group(1)), m.group(2)) for m in lines]


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("case, sides", [
    ("ops", ["rank 0 waits on allreduce 'a' (submitted only by rank 0)",
             "wait{s} on allgather 'b' (submitted only by {others})"]),
    ("order", ["rank 0 waits on allreduce 'x' (submitted only by rank 0)",
               "wait{s} on allreduce 'y' (submitted only by {others})"]),
    ("barrier", ["rank 0 waits on barrier 'barrier.noname.0' (submitted only by rank 0)",
                 "wait{s} on allreduce 'z' (submitted only by {others})"]),
])
def test_desync_ends_every_rank_naming_each_side(np_, case, sides):
    others = "rank 1" if np_ == 2 else "ranks 1,2"
    expected = [side.format(s="s" if np_ == 2 else "", others=others) for side in sides]
    out, elapsed = run_case(np_, case)
    for seconds, message in deadlocked(out, range(np_)):
        assert seconds < 15 * MULTIPLIER, out
        assert message.startswith("collective deadlock: "), message
        assert all(side in message for side in expected), (expected, message)
        assert ("ranks 1,2 wait" if np_ == 3 else "rank 1 waits") in message, message


def test_join_against_a_whole_job_op_is_a_deadlock():
    out, _ = run_case(2, "join")
    for _, message in deadlocked(out, range(2)):
        assert "rank 0 waits on join (submitted only by rank 0)" in message, message
        assert "rank 1 waits on add_process_set" in message, message


def test_deadlock_inside_a_process_set_names_its_members_only():
    out, _ = run_case(3, "sets")
    for _, message in deadlocked(out, [0, 1]):
        assert "rank 0 waits on allreduce 'a [process set 1]' (submitted only by rank 0)" in message
        assert "rank 1 waits on allgather 'b [process set 1]' (submitted only by rank 1)" in message
        assert "rank 2" not in message, message
    assert "rank 2 completed" in out, out


@pytest.mark.parametrize("case", ["joined", "busy", "thread", "slow"])
def test_waits_that_are_not_deadlocks_complete(case):
    out, _ = run_case(2, case)
    assert "deadlock" not in out, out
    assert "rank 0 completed" in out and "rank 1 completed" in out, out


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "tf.function"])
def test_deadlock_through_the_frameworks(framework):
    out, _ = run_case(2, "ops", framework, timeout=150)
    for _, message in deadlocked(out, range(2)):
        assert "rank 0 waits on allreduce 'a'" in message and "rank 1 waits on allgather 'b'" in message


def test_deadlock_detection_can_be_switched_off():
    """HVLITE_DEADLOCK_SECONDS=0: the desync is left to the stall shutdown, as before."""
    job = run_job(2, ["python", "tests/scenarios/deadlock.py", "ops"], timeout=60,
                  env={"HVLITE_DEADLOCK_SECONDS": "0", "HVLITE_STALL_SHUTDOWN_TIME_SECONDS": "8",
                       "HVLITE_STALL_CHECK_TIME_SECONDS": "1"})
    out = job.stdout + job.stderr
    assert job.returncode != 0 and "stall shutdown" in out and "collective deadlock" not in out, out


@pytest.mark.parametrize("where, env", [
    ("negotiation", {}),
    ("mpi", {"HVLITE_SHM_DISABLE": "1"}),
])
def test_stopped_peer_ends_the_others_naming_it(where, env):
    start = time.monotonic()
    job = run_job(2, ["python", "tests/scenarios/stopped_peer.py", where], timeout=60,
                  env=dict(env, HVLITE_PEER_TIMEOUT_SECONDS="3"))
    elapsed = time.monotonic() - start
    out = job.stdout + job.stderr
    assert job.returncode == 3, out
    assert elapsed < 30 * MULTIPLIER, "the job took %.1f s" % elapsed
    assert re.search(r"rank 0 timeout after [\d.]+ s: .*rank 1 \(pid \d+\) on this host is stopped", out), out
    if where == "mpi":
        assert "(SIGSTOP) at mpi_allreduce" in out, out      # frozen inside the data plane
    assert "UNEXPECTED" not in out
