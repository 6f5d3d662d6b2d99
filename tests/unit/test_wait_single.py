"""How the engine waits between cycles while CUDA tensors are held for the GPU
(csrc/core/engine.c's wait_for_work), checked on a machine without a GPU through a probe
(tests/unit/wait_probe.c): engine.c compiled with the queue, ready.c's "has the GPU written every
held tensor?" and execute.c's settle answered and logged by the probe, in real time.

What it shows:
- with nothing held the wait asks the GPU nothing and lasts the cycle time;
- with tensors held it asks whether the GPU wrote them all, first after 100 us, then twice as
  long each time, and starts the cycle as soon as they are: a written tensor does not wait out
  the cycle time (1 ms by default, longer under autotune);
- the looks back off to at most a quarter of the wait, and the wait still ends on time;
- while device batches are left running (HVLITE_NCCL_OVERLAP) it settles them every 50 us and
  does not start a cycle early; a batch that fails there ends the wait with its error;
- a request that arrives ends the wait at once.
The times are the wait's own; lower bounds are exact, upper bounds leave room for a busy machine.
On a real GPU, tests/test_gpu.py's "once_written" test (make test-gpu) times the wake-up."""
import ctypes
import os
import threading
import time

import pytest

from c_check import bounded, load_probe  # tests/unit, beside this file

OK, NCCL = 0, 5                 # csrc/hvlite.h
LOOK = 0                        # engine.h: HVL_SETTLE_LOOK
FIRST_LOOK_S = 100e-6           # engine.c: HELD_LOOK_S
IN_FLIGHT_LOOK_S = 50e-6        # engine.c
NEVER = -1
# what a loaded 2-core machine may add to one sleep (more under a sanitizer: tools/sanitizers)
SLACK_S = 0.25 * float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("wait_probe", tmp_path_factory.mktemp("wait_probe"))
    lib.probe_wait.argtypes = [ctypes.c_double]
    lib.probe_returned.restype = ctypes.c_double
    lib.probe_log_at.restype = ctypes.c_double
    lib.probe_submitted.restype = ctypes.c_double
    return lib


class Wait:
    """One wait between cycles through the probe, and what it asked, when."""

    def __init__(self, lib, held=True, in_flight=False, written_from_look=NEVER, settle_fails_at=0):
        self.lib = lib
        lib.probe_reset(int(held), int(in_flight), written_from_look, settle_fails_at)

    def run(self, seconds):
        rc, self.error = bounded(self.lib.probe_wait, seconds)
        self.took = self.lib.probe_returned()
        return rc

    def asked(self, what):
        """The times (s since the wait began) of each 'w' (the GPU: all written?), 's' (settle)
        or 'q' (the queue) asked."""
        assert self.lib.probe_log_dropped() == 0, "the probe's log overflowed"
        return [self.lib.probe_log_at(i) for i in range(self.lib.probe_log_count())
                if self.lib.probe_log_what(i) == ord(what)]


def gaps(times):
    return [b - a for a, b in zip(times, times[1:])]


def test_nothing_held_waits_out_the_cycle_asking_the_gpu_nothing(probe):
    w = Wait(probe, held=False)
    assert w.run(0.05) == OK
    assert 0.05 <= w.took < 0.05 + SLACK_S
    assert w.asked("w") == []
    assert len(w.asked("s")) == 1                 # once, with nothing left running


def test_the_cycle_starts_as_soon_as_the_gpu_wrote_every_held_tensor(probe):
    w = Wait(probe, written_from_look=4)
    assert w.run(1.0) == OK, w.error
    looks = w.asked("w")
    assert len(looks) == 4
    assert w.took < 0.5                           # not the 1 s wait: about 1.5 ms
    assert looks[0] >= FIRST_LOOK_S               # not at once: the framework is launching
    for i, gap in enumerate(gaps(looks)):         # each look twice as long after the one before
        assert gap >= FIRST_LOOK_S * 2 ** (i + 1), (i, gaps(looks))


def test_the_looks_back_off_to_a_quarter_of_the_wait_and_it_ends_on_time(probe):
    w = Wait(probe, written_from_look=NEVER)
    assert w.run(2.0) == OK
    assert 2.0 <= w.took < 2.0 + SLACK_S
    looks = w.asked("w")
    assert 10 <= len(looks) <= 20, looks          # 100 us doubling: 15 looks in 2 s
    assert max(gaps(looks)) <= 2.0 / 4 + SLACK_S, gaps(looks)   # doubling on would reach 0.82 s
    assert w.took - looks[-1] <= 2.0 / 4 + SLACK_S


def test_while_device_batches_run_they_are_settled_and_no_cycle_starts_early(probe):
    w = Wait(probe, in_flight=True, written_from_look=1)
    assert w.run(0.05) == OK, w.error
    assert w.asked("w") == []                     # a cycle started early would wait for peers
    assert w.took >= 0.05
    settles = w.asked("s")
    assert len(settles) >= 2
    assert all(gap >= IN_FLIGHT_LOOK_S for gap in gaps(settles)), min(gaps(settles))
    hows = {probe.probe_log_how(i) for i in range(probe.probe_log_count()) if probe.probe_log_what(i) == ord("s")}
    assert hows == {LOOK}                         # looks: the wait never blocks on the GPU


def test_a_batch_that_fails_on_the_gpu_ends_the_wait_with_its_error(probe):
    w = Wait(probe, in_flight=True, settle_fails_at=3)
    assert w.run(5.0) == NCCL
    assert "the probe's settle fails" in w.error
    assert len(w.asked("s")) == 3 and w.took < SLACK_S


def test_a_request_ends_the_wait_at_once_whatever_is_held(probe):
    w = Wait(probe, written_from_look=NEVER)

    def submit_during_the_wait():      # 0.1 s after the wait began, however late it began
        while not probe.probe_waiting():
            time.sleep(0.001)
        time.sleep(0.1)
        probe.probe_submit()
    threading.Thread(target=submit_during_the_wait, daemon=True).start()
    assert w.run(5.0) == OK
    submitted = probe.probe_submitted()
    assert submitted >= 0.1, submitted
    assert submitted <= w.took < submitted + SLACK_S, (submitted, w.took)
