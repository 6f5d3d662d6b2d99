"""Which pending CUDA requests a cycle keeps out of negotiation (csrc/core/ready.c): its rules
checked on a machine without a GPU, through a probe (tests/unit/ready_probe.c) that compiles
ready.c with its event queries answered by the test. What holding does on a real GPU (a tensor
behind a long kernel is held while a host allreduce after it completes) is in
tests/gpu/test_cuda_only.py."""
import ctypes

import pytest

from c_check import load_probe  # tests/unit, beside this file

ALLREDUCE, BARRIER, JOIN = 0, 5, 6        # csrc/hvlite.h's op numbers
NOT_YET, WRITTEN, QUERY_FAILS = 0, 1, -1  # what the GPU answers for an entry's ready event
GROUPS_TRACKED = 64                       # ready.c


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("ready_probe", tmp_path_factory.mktemp("ready_probe"))
    lib.probe_reset.argtypes = [ctypes.c_double, ctypes.c_int]
    lib.probe_add.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_double, ctypes.c_int]
    lib.probe_ready_delay.restype = ctypes.c_double
    lib.probe_counter.restype = ctypes.c_int64
    return lib


class Pending:
    """A pending list built through the probe: add() entries, hold() once a cycle, held() to see
    which entries this cycle keeps out."""

    def __init__(self, lib, deadlock_s=0.0, cuda_loaded=True):
        self.lib = lib
        lib.probe_reset(deadlock_s, int(cuda_loaded))

    def add(self, gpu=NOT_YET, op=ALLREDUCE, on_gpu=True, group=0, age_s=0.0, sent=False):
        i = self.lib.probe_add(op, int(on_gpu), group, age_s, int(sent))
        assert i >= 0
        if on_gpu:
            self.lib.probe_gpu(i, gpu)
        return i

    def hold(self):
        self.lib.probe_hold()

    def held(self, *indices):
        return [bool(self.lib.probe_held(i)) for i in indices]


def test_nothing_is_held_while_cuda_was_never_loaded(probe):
    p = Pending(probe, cuda_loaded=False)
    a = p.add()
    p.hold()
    assert p.held(a) == [False]
    assert probe.probe_counter() == 0


def test_a_cuda_tensor_is_held_until_the_gpu_wrote_it(probe):
    p = Pending(probe)
    waiting, written, host = p.add(), p.add(gpu=WRITTEN), p.add(on_gpu=False)
    p.hold()
    assert p.held(waiting, written, host) == [True, False, False]
    assert probe.probe_counter() == 1               # the written one was never held
    p.hold()                                        # still not written: held, counted once
    assert p.held(waiting) == [True]
    assert probe.probe_counter() == 1
    probe.probe_gpu(waiting, WRITTEN)
    p.hold()
    assert p.held(waiting) == [False]
    assert probe.probe_gpu_pending(waiting) == 0
    # the response cache's patience starts when the hold ended, not at submit
    assert probe.probe_ready_delay(waiting) > 0
    assert probe.probe_ready_delay(written) == 0
    probe.probe_gpu(waiting, NOT_YET)               # released for good: never held again
    p.hold()
    assert p.held(waiting) == [False]


def test_a_group_is_held_while_any_member_is(probe):
    p = Pending(probe)
    first, second = p.add(gpu=WRITTEN, group=7), p.add(gpu=NOT_YET, group=7)
    other_group, no_group = p.add(gpu=WRITTEN, group=8), p.add(gpu=WRITTEN)
    host_member = p.add(on_gpu=False, group=7)
    p.hold()
    assert p.held(first, second, host_member) == [True, True, True]
    assert p.held(other_group, no_group) == [False, False]
    assert probe.probe_counter() == 1               # only the member the GPU had not written
    probe.probe_gpu(second, WRITTEN)
    p.hold()
    assert p.held(first, second, host_member) == [False, False, False]


@pytest.mark.parametrize("op", [BARRIER, JOIN])
def test_an_op_without_data_releases_what_was_submitted_before_it(probe, op):
    p = Pending(probe)
    before, member_before = p.add(), p.add(gpu=WRITTEN, group=3)
    p.add(op=op, on_gpu=False)
    after, member_after = p.add(), p.add(gpu=NOT_YET, group=3)
    p.hold()
    assert p.held(before, member_before) == [False, False]
    assert p.held(after, member_after) == [True, True]
    assert probe.probe_gpu_pending(before) == 0      # for good, even once the op has gone


@pytest.mark.parametrize("deadlock_s, held_age, released_age", [(0, 4.5, 5.5), (60, 4.5, 5.5), (4, 1.5, 2.5)])
def test_a_hold_is_bounded_by_5_s_and_half_the_deadlock_time(probe, deadlock_s, held_age, released_age):
    p = Pending(probe, deadlock_s=deadlock_s)
    young, old = p.add(age_s=held_age), p.add(age_s=released_age)
    old_member = p.add(gpu=WRITTEN, group=9, age_s=released_age)
    p.add(gpu=NOT_YET, group=9)
    p.hold()
    assert p.held(young, old, old_member) == [True, False, False]


def test_a_failed_query_releases_the_entry(probe):
    p = Pending(probe)
    a = p.add(gpu=QUERY_FAILS)
    p.hold()
    assert p.held(a) == [False]
    assert probe.probe_gpu_pending(a) == 0


def test_a_member_already_sent_is_not_held_by_its_group(probe):
    p = Pending(probe)
    sent = p.add(on_gpu=False, group=4, sent=True)
    waiting = p.add(group=4)
    p.hold()
    assert p.held(sent, waiting) == [False, True]


@pytest.mark.parametrize("groups_held, group_holds", [(GROUPS_TRACKED, True), (GROUPS_TRACKED + 1, False)])
def test_past_the_groups_tracked_each_member_goes_on_its_own(probe, groups_held, group_holds):
    p = Pending(probe)
    written_member = p.add(gpu=WRITTEN, group=1)
    waiting = [p.add(group=g) for g in range(1, groups_held + 1)]
    p.hold()
    assert all(p.held(*waiting))                    # each holds for itself either way
    assert p.held(written_member) == [group_holds]


def test_the_wait_ends_once_every_tensor_held_is_written(probe):
    """Between cycles the engine asks hvl__ready_all_written: once the GPU wrote everything held
    (the last gradients of a backward pass, a lone tensor a caller waits for), the next cycle
    starts at once instead of at the cycle time."""
    p = Pending(probe)
    p.hold()
    assert probe.probe_all_written() == 0           # nothing held: nothing to end the wait for
    older, host, newer = p.add(), p.add(on_gpu=False), p.add()
    member, waiting_member = p.add(gpu=WRITTEN, group=2), p.add(gpu=NOT_YET, group=2)
    p.hold()
    assert probe.probe_held_for_gpu() == 3          # held for its own event: not the group's member
    assert probe.probe_all_written() == 0
    probe.probe_gpu(newer, WRITTEN)
    probe.probe_gpu(waiting_member, WRITTEN)
    assert probe.probe_all_written() == 0           # the older one still not written
    probe.probe_gpu(older, QUERY_FAILS)             # a failed query counts as written
    assert probe.probe_all_written() == 1
    p.hold()                                        # every hold ended: none left to wait for
    assert probe.probe_held_for_gpu() == 0 and probe.probe_all_written() == 0
    assert p.held(older, host, newer, member, waiting_member) == [False] * 5


def test_entries_gone_since_the_hold_end_the_wait_once(probe):
    """Held entries that left the pending list since the hold (failed with their set, say) end
    the wait at once; the next cycle's hold counts none, so it happens once."""
    p = Pending(probe)
    gone = p.add()
    p.hold()
    assert probe.probe_all_written() == 0
    probe.probe_unlink(gone)
    assert probe.probe_all_written() == 1
    p.hold()
    assert probe.probe_held_for_gpu() == 0 and probe.probe_all_written() == 0


# ---- admission: the device rule ----

def test_a_ranks_cuda_tensors_of_one_set_stay_on_the_device_of_its_first(probe):
    """The set's first CUDA tensor pins its device; one on another device is marked, so the
    coordinator fails it on every rank before any NCCL call; host tensors and other sets are
    not concerned."""
    probe.probe_reset(5.0, 1)
    first = probe.probe_admit(0, 1, 1)
    assert probe.probe_pinned(0) == 1 and probe.probe_set_device(first) == -1
    assert probe.probe_set_device(probe.probe_admit(0, 1, 1)) == -1          # the same device
    wrong = probe.probe_admit(0, 0, 1)
    assert probe.probe_set_device(wrong) == 1 and probe.probe_pinned(0) == 1   # marked, pin kept
    assert probe.probe_set_device(probe.probe_admit(0, -1, 1)) == -1         # host memory
    other = probe.probe_admit(1, 0, 1)                                       # set 1: its own pin
    assert probe.probe_set_device(other) == -1 and probe.probe_pinned(1) == 0


@pytest.mark.parametrize("hold", [0, 1])
def test_admission_holds_a_cuda_tensor_only_where_holding_is_on(probe, hold):
    probe.probe_reset(5.0, 1)
    cuda, host = probe.probe_admit(0, 0, hold), probe.probe_admit(0, -1, hold)
    assert probe.probe_gpu_pending(cuda) == hold and probe.probe_gpu_pending(host) == 0
