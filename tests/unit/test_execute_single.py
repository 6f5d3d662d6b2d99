"""How the engine runs CUDA batches on a device plane and keeps those the plane leaves running
(csrc/core/execute.c, HVLITE_NCCL_OVERLAP), checked on a machine without a GPU through a probe
(tests/unit/execute_probe.c): execute.c compiled with a device plane of the probe's, which logs
each call and settles each batch as the test says, and with the entries' ends logged.

What it shows:
- without overlap, a CUDA batch's entries finish when its run returns; with it, the plane is
  handed a ticket, the entries leave the pending list and finish only once the plane says the
  batch ended, oldest first, and a look at a batch still running finishes nothing after it;
- what must not pass a batch left running waits for it first: an op without data (barrier) and
  a CUDA batch of another process set; a host batch and a CUDA batch of the same set do not;
- a batch that fails on the GPU fails its entries and every batch kept after it, with its
  message, the set's plane abandons them once, and the engine is marked stopped; abandoning
  (the engine stops) fails what is kept with the stop's status;
- however many batches are left running, each finishes once.
The real device plane (NCCL) on a GPU is tests/gpu/test_nccl_plane.py's (make test-gpu)."""
import ctypes

import pytest

from c_check import bounded, load_probe  # tests/unit, beside this file

ALLREDUCE, BARRIER = 0, 5                  # csrc/hvlite.h
OK, INVALID_ARG, TIMEOUT, NCCL, SHUT_DOWN = 0, 1, 3, 5, 8
BY_STATUS, BUSY, FREE = 0, 1, 2           # cycle.h: hvl_outcome.buffers
LOOK, WAIT = 0, 1                          # engine.h
RUNNING, ENDED, FAILS = 0, 1, 2            # execute_probe.c


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("execute_probe", tmp_path_factory.mktemp("execute_probe"))
    lib.probe_log_what.restype = ctypes.c_char_p
    lib.probe_log_message.restype = ctypes.c_char_p
    lib.probe_abandon.argtypes = [ctypes.c_int, ctypes.c_char_p]
    return lib


class Engine:
    """One engine's batches through the probe; the log read back."""

    def __init__(self, lib, overlap=True):
        self.lib = lib
        lib.probe_reset(int(overlap))
        self.seen = 0

    def batch(self, count=2, op=ALLREDUCE, cuda=True, set=0):
        id = self.lib.probe_batch(op, int(cuda), set, count)
        assert id >= 0, "the probe's batches ran out"
        return id

    def execute(self):
        rc, self.error = bounded(self.lib.probe_execute)
        return rc

    def settle(self, how=LOOK):
        rc, self.error = bounded(self.lib.probe_settle, how)
        return rc

    def log(self):
        lib = self.lib
        assert lib.probe_log_dropped() == 0, "the probe's log overflowed"
        return [(lib.probe_log_what(i).decode(), lib.probe_log_arg(i, 0), lib.probe_log_arg(i, 1),
                 lib.probe_log_arg(i, 2), lib.probe_log_message(i).decode(), lib.probe_log_arg(i, 3))
                for i in range(lib.probe_log_count())]

    def new(self):
        """The log since the last call of new()."""
        calls = self.log()
        fresh, self.seen = calls[self.seen:], len(calls)
        return fresh

    def finished(self, calls=None):
        """{entry: (status, message)} of the entries finished in `calls` (default: all)."""
        out = {}
        for what, entry, status, _, message, _ in calls if calls is not None else self.log():
            if what == "finish":
                assert entry not in out, f"entry {entry} finished twice"
                out[entry] = (status, message)
        return out


def entries_of(batch, count=2):
    return set(range(batch, batch + count))


def one_left_running(probe):
    """An engine with overlap on and one CUDA batch left running; the log read so far."""
    e = Engine(probe)
    a = e.batch()
    assert e.execute() == OK, e.error
    e.new()
    return e, a


def test_without_overlap_a_cuda_batch_finishes_when_its_run_returns(probe):
    e = Engine(probe, overlap=False)
    a = e.batch()
    assert e.execute() == OK, e.error
    calls = e.new()
    assert [c[:3] for c in calls if c[0] == "run"] == [("run", a, 0)]        # no ticket offered
    assert set(e.finished(calls)) == entries_of(a)
    assert probe.probe_in_flight() == 0


def test_with_overlap_entries_finish_once_the_plane_says_their_batch_ended_oldest_first(probe):
    e = Engine(probe)
    a, b = e.batch(), e.batch(count=3)
    assert e.execute() == OK, e.error
    calls = e.new()
    assert [c[:3] for c in calls if c[0] == "run"] == [("run", a, 1), ("run", b, 1)]   # tickets offered
    assert e.finished(calls) == {}
    detached = {c[1] for c in calls if c[0] == "detach"}
    assert detached == entries_of(a) | entries_of(b, 3)      # out of the pending list
    assert probe.probe_in_flight() == 2
    # the younger ended first: nothing finishes while the oldest runs
    probe.probe_batch_state(b, ENDED)
    assert e.settle() == OK
    calls = e.new()
    assert [c[1] for c in calls if c[0] == "settle"] == [a]
    assert e.finished(calls) == {}
    probe.probe_batch_state(a, ENDED)
    assert e.settle() == OK
    calls = e.new()
    assert [c[1] for c in calls if c[0] == "settle"] == [a, b]
    finished = [c[1] for c in calls if c[0] == "finish"]
    assert finished == sorted(finished) and set(finished) == entries_of(a) | entries_of(b, 3)
    assert all(status == OK for status, _ in e.finished(calls).values())
    assert probe.probe_in_flight() == 0


def test_a_host_batch_and_a_cuda_batch_of_the_same_set_do_not_wait_for_one_left_running(probe):
    e, a = one_left_running(probe)
    host, other_host, same = e.batch(cuda=False), e.batch(cuda=False, set=1), e.batch()
    assert e.execute() == OK, e.error
    calls = e.new()
    assert not [c for c in calls if c[0] == "settle"]
    assert set(e.finished(calls)) == entries_of(host) | entries_of(other_host)   # ran and finished
    assert [c[1] for c in calls if c[0] == "run"] == [same]
    assert probe.probe_in_flight() == 2
    probe.probe_batch_state(a, ENDED)
    probe.probe_batch_state(same, ENDED)
    assert e.settle() == OK and probe.probe_in_flight() == 0


@pytest.mark.parametrize("then", ["barrier", "cuda batch of another set"])
def test_what_must_not_pass_a_batch_left_running_waits_for_it_first(probe, then):
    e, a = one_left_running(probe)
    probe.probe_batch_state(a, ENDED)
    after = e.batch(count=1, op=BARRIER, cuda=False) if then == "barrier" else e.batch(set=1)
    assert e.execute() == OK, e.error
    calls = e.new()
    kinds = [(c[0], c[1]) for c in calls if c[0] in ("settle", "finish", "run")]
    settled = kinds.index(("settle", a))
    assert all(kinds.index(("finish", i)) > settled for i in entries_of(a))
    if then == "barrier":
        assert kinds.index(("finish", after)) > max(kinds.index(("finish", i)) for i in entries_of(a))
    else:
        assert kinds.index(("run", after)) > max(kinds.index(("finish", i)) for i in entries_of(a))
    assert [c[2] for c in calls if c[0] == "settle"] == [WAIT]          # waited for, not looked at


def test_a_batch_that_fails_on_the_gpu_fails_every_batch_kept_after_it(probe):
    e = Engine(probe)
    a, b = e.batch(), e.batch()
    assert e.execute() == OK
    e.new()
    probe.probe_batch_state(a, FAILS)
    assert e.settle() == TIMEOUT
    assert "did not end" in e.error
    calls = e.new()
    finished = e.finished(calls)
    assert set(finished) == entries_of(a) | entries_of(b)
    assert {status for status, _ in finished.values()} == {TIMEOUT}
    assert all("batch %d did not end" % a in message for _, message in finished.values())
    assert [c_[0] for c_ in calls].count("abandon") == 1               # the set's plane, once
    abandon_at = [c_[0] for c_ in calls].index("abandon")
    later = [i for i, c_ in enumerate(calls) if c_[0] == "finish" and c_[1] not in entries_of(a)]
    assert all(i > abandon_at for i in later)                          # stopped before handles fail
    assert any(c_[0] == "stopped" for c_ in calls)                     # the engine is marked stopped
    assert probe.probe_in_flight() == 0


def test_a_failed_run_with_overlap_finishes_its_entries_with_the_error_at_once(probe):
    e = Engine(probe)
    a = e.batch()
    probe.probe_run_fails(a, NCCL)
    assert e.execute() == NCCL
    assert "fails" in e.error
    calls = e.new()
    assert {s for s, _ in e.finished(calls).values()} == {NCCL}
    assert set(e.finished(calls)) == entries_of(a) and probe.probe_in_flight() == 0
    assert any(c[0] == "stopped" for c in calls)


def test_a_failed_run_behind_batches_left_running_fails_them_first(probe):
    """Its plane failed the set: the older batches cannot end well either, and they fail before
    it, with its error, so handles fail oldest first."""
    e, old = one_left_running(probe)
    new = e.batch()
    probe.probe_run_fails(new, NCCL)
    assert e.execute() == NCCL
    calls = e.new()
    order = [c[1] for c in calls if c[0] == "finish"]
    assert order == sorted(entries_of(old)) + sorted(entries_of(new))
    assert {s for s, _ in e.finished(calls).values()} == {NCCL}
    assert all("batch %d fails" % new in m for _, m in e.finished(calls).values())
    assert [c[0] for c in calls].count("abandon") == 1
    assert probe.probe_in_flight() == 0


def buffers(calls):
    """{entry: hvl_outcome.buffers} of the entries finished in `calls`."""
    return {c[1]: c[5] for c in calls if c[0] == "finish"}


@pytest.mark.parametrize("drains", [True, False])
def test_a_bad_tensor_never_lets_go_of_the_buffers_of_batches_still_running(probe, drains):
    """A tensor on another GPU than its set's fails its batch before anything is queued
    (HVL_ERR_INVALID_ARG: its buffers are free). The batches still running behind it are stopped
    on the GPU: they fail with a status that does not say "nothing moved", and their buffers are
    free only once the plane saw the GPU get past them; else they stay busy (kept for good)."""
    e, old = one_left_running(probe)
    new = e.batch()
    probe.probe_run_fails(new, INVALID_ARG)
    probe.probe_abandon_drains(int(drains))
    assert e.execute() == INVALID_ARG
    calls = e.new()
    finished = e.finished(calls)
    assert {finished[i][0] for i in entries_of(old)} == {SHUT_DOWN}
    assert all("'t%d' was still running on the GPU" % old in finished[i][1] and "batch %d fails" % new in finished[i][1]
               for i in entries_of(old))
    assert {finished[i][0] for i in entries_of(new)} == {INVALID_ARG}
    kept = buffers(calls)
    assert {kept[i] for i in entries_of(old)} == {FREE if drains else BUSY}
    assert {kept[i] for i in entries_of(new)} == {BY_STATUS}      # decided before its data moved


def test_a_batch_left_running_that_fails_while_waited_for_stops_the_barrier_behind_it(probe):
    e, a = one_left_running(probe)
    probe.probe_batch_state(a, FAILS)
    barrier = e.batch(count=1, op=BARRIER, cuda=False)
    assert e.execute() == TIMEOUT
    calls = e.new()
    finished = e.finished(calls)
    assert set(finished) == entries_of(a)          # the barrier did not run: the engine stops
    assert barrier not in finished
    assert probe.probe_in_flight() == 0 and any(c[0] == "stopped" for c in calls)


def test_abandoning_fails_what_is_kept_with_the_stops_status(probe):
    e = Engine(probe)
    a, b = e.batch(), e.batch()
    assert e.execute() == OK
    e.new()
    probe.probe_abandon(SHUT_DOWN, b"the engine stops")
    calls = e.new()
    assert [c[0] for c in calls].count("abandon") == 1
    finished = e.finished(calls)
    assert set(finished) == entries_of(a) | entries_of(b)
    assert set(finished.values()) == {(SHUT_DOWN, "the engine stops")}
    assert probe.probe_in_flight() == 0


def test_many_batches_left_running_each_finish_once(probe):
    e = Engine(probe)
    ids = []
    for cycle in range(5):
        ids += [e.batch(count=1) for _ in range(7)]
        assert e.execute() == OK, e.error
    assert probe.probe_in_flight() == 35
    for i in ids:
        probe.probe_batch_state(i, ENDED)
    assert e.settle() == OK
    assert sorted(e.finished()) == ids
    assert probe.probe_in_flight() == 0
