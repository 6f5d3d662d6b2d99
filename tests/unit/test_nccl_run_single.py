"""How the NCCL plane runs and ends batches (csrc/backends/backend_nccl.c, with
csrc/util/nccl_lib.c), checked on a machine without a GPU through a probe
(tests/unit/nccl_run_probe.c) that compiles both files with NCCL, CUDA and MPI answered by the
test: each call is logged, events and NCCL's asynchronous state answer as the test says, and
ncclCommAbort can hang. Nothing runs on a device; the checks read the calls from the log.

What it shows:
- a fused allreduce is one ncclAllReduce over the device fusion buffer, each tensor copied into
  its 256-byte slot after its ready event and out after the collective, a joined rank's slot
  zeroed; grouped, one call per tensor, a stand-in reading zeros into scratch;
- the reduction: ncclAvg, or the scale folded into ncclRedOpCreatePreMulSum (in the tensor's
  type, destroyed once the calls settled), Min/Max/Product as NCCL's;
- a set of one rank calls no NCCL; allgather and alltoall as NCCL calls;
- never hanging: a batch whose end never comes, or NCCL's asynchronous error, fails after the
  peer timeout (or at once), naming the tensor; the communicator is aborted and the set's other
  batches fail; an abort that hangs is left behind after its bound; a batch left running is
  looked at without waiting; the shutdown flag ends a blocking wait, not an agreed stop's; a
  batch queued behind another is bounded from that one's end, not from its own queueing;
- a buffer of the set (fusion, a joined rank's zeros or scratch) grows without waiting for the
  device: the one it outgrew, which batches left running may still read, is freed after them
  on the engine's stream (memory pools) or kept until the set closes;
- the set's decision: the communicator made from rank 0's id, nonblocking, its set-up bounded,
  warmed up (an allreduce and a broadcast, where NCCL connects its transports) before the
  members agree, and every failure, the warm-up's too, agreed so the set stays staged
  everywhere.
The plane on a real GPU and NCCL is tests/gpu/test_nccl_plane.py's (make test-gpu)."""
import ctypes
import struct
import time

import numpy as np
import pytest

from c_check import bounded, load_probe  # tests/unit, beside this file

ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER = 0, 1, 2, 3, 4    # csrc/hvlite.h
SUM, AVERAGE, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4
UINT8, FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = 0, 6, 7, 8, 9
OK, INVALID_ARG, TIMEOUT, NCCL, SYSTEM, SHUT_DOWN = 0, 1, 3, 5, 6, 8
NC_FLOAT16, NC_FLOAT32, NC_FLOAT64, NC_BFLOAT16 = 6, 7, 8, 9                # nccl_lib.h
NC_SUM, NC_PROD, NC_MAX, NC_MIN, NC_AVG = 0, 1, 2, 3, 4
NC_SYSTEM_ERROR, NC_REMOTE_ERROR, NC_IN_PROGRESS = 2, 6, 7
LOOK, WAIT, STOPPING = 0, 1, 2                                              # engine.h
UNDECIDED, USE_NCCL, STAGED = 0, 1, 2                                       # backend_nccl.c
HOST = -1                                                                   # a joined rank's stand-in
NEVER = -1


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("nccl_run_probe", tmp_path_factory.mktemp("nccl_run_probe"))
    lib.probe_reset.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double]
    lib.probe_settings.argtypes = [ctypes.c_int, ctypes.c_double]
    lib.probe_batch.argtypes = [ctypes.c_int] * 3 + [ctypes.c_double] * 2 + [ctypes.c_int]
    lib.probe_tensor.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.probe_counts.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    lib.probe_fail.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.probe_async.argtypes = [ctypes.c_int] * 3
    lib.probe_ticket.restype = ctypes.c_void_p
    lib.probe_settle.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.probe_state.restype = ctypes.c_int64
    lib.probe_state.argtypes = [ctypes.c_char_p]
    lib.probe_log_name.restype = ctypes.c_char_p
    lib.probe_log_arg.restype = ctypes.c_int64
    lib.probe_phase.restype = ctypes.c_double
    yield lib
    lib.probe_abort_hangs(0)          # a hung abort's helper thread may finish


class Call(tuple):
    @property
    def name(self):
        return self[0]

    @property
    def args(self):
        return self[1]


class Plane:
    """The NCCL plane's state for one set, driven through the probe; batches as the engine hands
    them over; the calls read back from the log."""

    def __init__(self, lib, rank=0, size=2, timeout_s=30.0, grouped=False, nccl=True, pools=True):
        self.lib = lib
        lib.probe_reset(rank, size, timeout_s)
        lib.probe_settings(int(grouped), timeout_s)
        lib.probe_pools_here(int(pools))          # this rank's GPU has memory pools
        if nccl:
            lib.probe_use_nccl(0)
        self.inputs, self.outputs, self.counts, self.devices = [], [], [], []

    def batch(self, op=ALLREDUCE, reduce_op=SUM, dtype=FLOAT32, prescale=1.0, postscale=1.0, root=0):
        self.lib.probe_batch(op, reduce_op, dtype, prescale, postscale, root)
        self.inputs, self.outputs, self.counts, self.devices = [], [], [], []
        return self

    def tensor(self, count, device=0, in_place=False, event=True):
        i = len(self.inputs)
        address = 0x100000000000 + i * 0x10000000
        self.inputs.append(address)
        self.outputs.append(address if in_place else address + 0x8000000)
        self.counts.append(count)
        self.devices.append(device)
        self.lib.probe_tensor(count, device, self.inputs[-1], self.outputs[-1], int(event and device != HOST))
        return self

    def run(self, left_running=False, timed=False):
        """run_device's rc; its message, if any, in self.error."""
        rc, self.error = bounded(self.lib.probe_run, int(left_running), int(timed))
        return rc

    def settle(self, ticket, how):
        done = ctypes.c_int()
        rc, self.error = bounded(self.lib.probe_settle, ticket, how, ctypes.byref(done))
        return rc, done.value

    def prepare(self, device=0):
        rc, self.error = bounded(self.lib.probe_prepare, device)
        return rc

    def state(self, what):
        return self.lib.probe_state(what.encode())

    def log(self, *names):
        assert self.lib.probe_log_dropped() == 0, "the probe's log overflowed"
        calls = []
        for i in range(self.lib.probe_log_count()):
            name = self.lib.probe_log_name(i).decode()
            if not names or name in names:
                calls.append(Call((name, tuple(self.lib.probe_log_arg(i, j) for j in range(5)))))
        return calls

    def ended_clean(self):
        """No ticket out and every event freed."""
        return self.state("tickets") == 0 and self.state("live_events") == 0

    def aborted(self):
        """The communicator was aborted (on the helper thread) and the set fell back to staged."""
        names = [c.name for c in self.log()]
        return "abort" in names and self.state("comm") == 0 and self.state("mode") == STAGED


def two_left_running(p):
    """Two batches of p's set left running, whose ends never come until the test says: their
    tickets."""
    p.tensor(100).tensor(50)
    p.lib.probe_pace(NEVER, NEVER)
    tickets = []
    for _ in range(2):
        assert p.run(left_running=True) == OK, p.error
        tickets.append(p.lib.probe_ticket())
    return tickets


def slot(nbytes):
    return (nbytes + 255) // 256 * 256


def check_ready_events(p, calls):
    """Each device tensor's ready event (at 0xe000 + its index) is waited on once, on the set's
    GPU, before anything reads an input: a copy, an NCCL call, the batch's first point. (Zeroing
    the plane's own stand-in buffer may come before.)"""
    names = [c.name for c in calls]
    waits = [c.args[:2] for c in calls if c.name == "wait_event"]
    assert waits == [(0, 0xe000 + i) for i, d in enumerate(p.devices) if d != HOST]
    first_work = min(names.index(n) for n in ("copy", "group_start", "record") if n in names)
    assert max(i for i, n in enumerate(names) if n == "wait_event") < first_work


# ---- running ----

def test_a_fused_allreduce_is_one_nccl_call_on_the_fusion_buffer(probe):
    p = Plane(probe).batch()
    for count, device in [(100, 0), (1000, 0), (3, 0), (50, HOST)]:
        p.tensor(count, device)
    assert p.run() == OK, p.error
    calls = p.log()
    fusion = p.state("fusion")
    sizes = [4 * n for n in p.counts]
    offsets = np.cumsum([0] + [slot(s) for s in sizes])[:-1]
    alloc = [c.args for c in calls if c.name == "device_alloc"]
    assert alloc == [(0, sum(slot(s) for s in sizes), fusion, 1, 0)]      # from the pool, stream-ordered
    copies = [c.args[1:4] for c in calls if c.name == "copy"]
    device_ones = [i for i, d in enumerate(p.devices) if d != HOST]
    copies_in = [(fusion + offsets[i], p.inputs[i], sizes[i]) for i in device_ones]
    copies_out = [(p.outputs[i], fusion + offsets[i], sizes[i]) for i in device_ones]
    assert copies == copies_in + copies_out
    assert [c.args[1:3] for c in calls if c.name == "zero"] == [(fusion + offsets[3], sizes[3])]
    reduces = [c.args for c in calls if c.name == "all_reduce"]
    assert reduces == [(fusion, fusion, sum(slot(s) for s in sizes) // 4, NC_FLOAT32, NC_SUM)]
    names = [c.name for c in calls]
    order = [names.index("wait_event"), names.index("copy"), names.index("group_start"),
             names.index("all_reduce"), names.index("group_end")]
    assert order == sorted(order), names
    # each input's ready event is waited on, before anything runs on the stream
    check_ready_events(p, calls)
    # the copies out follow the collective's settling (its calls queued), the end's event last
    settled = max(i for i, c in enumerate(calls) if c.name == "async_look" and i < names.index("record"))
    first_out = [i for i, c in enumerate(calls) if c.name == "copy"][len(device_ones)]
    assert names.index("group_end") < settled < first_out < names.index("record")
    assert "event_look" in names[names.index("record"):]    # waited for: not left running
    assert p.ended_clean()


def test_grouped_calls_one_per_tensor_and_a_stand_in_reads_zeros(probe):
    p = Plane(probe, grouped=True).batch(dtype=FLOAT64)
    p.tensor(10).tensor(7, HOST).tensor(5, in_place=True)
    assert p.run() == OK, p.error
    calls = p.log()
    assert not [c for c in calls if c.name == "copy"]
    zeros, scratch = [c.args[2] for c in calls if c.name == "device_alloc"]
    assert [c.args[1:3] for c in calls if c.name == "zero"] == [(zeros, 7 * 8)]
    reduces = [c.args[:3] for c in calls if c.name == "all_reduce"]
    assert reduces == [(p.inputs[0], p.outputs[0], 10), (zeros, scratch, 7), (p.inputs[2], p.inputs[2], 5)]
    check_ready_events(p, calls)
    names = [c.name for c in calls]
    assert names.index("group_start") < names.index("all_reduce") and \
        max(i for i, n in enumerate(names) if n == "all_reduce") < names.index("group_end")
    assert p.ended_clean()


def test_a_timed_batch_gives_its_phases_in_order(probe):
    p = Plane(probe).batch()
    p.tensor(100).tensor(200)
    assert p.run(timed=True) == OK, p.error
    records = [c.args[1] for c in p.log("record")]
    assert len(records) == 4 and records == sorted(records)          # in_ready .. ended, in order
    phases = [probe.probe_phase(i) for i in range(4)]
    assert 0 < phases[0] < phases[1] < phases[2] < phases[3], phases


@pytest.mark.parametrize("reduce_op, dtype, prescale, postscale, nccl_op, scalar", [
    (SUM, FLOAT32, 1.0, 1.0, NC_SUM, None),
    (AVERAGE, FLOAT32, 1.0, 1.0, NC_AVG, None),
    (MIN, FLOAT32, 1.0, 1.0, NC_MIN, None),
    (MAX, FLOAT64, 1.0, 1.0, NC_MAX, None),
    (PRODUCT, FLOAT32, 1.0, 1.0, NC_PROD, None),
    (SUM, FLOAT32, 0.5, 3.0, 100, struct.unpack("<I", struct.pack("<f", 1.5))[0]),
    (AVERAGE, FLOAT64, 2.0, 1.0, 100, struct.unpack("<Q", struct.pack("<d", 1.0))[0]),   # 2 / 2 ranks
    (AVERAGE, FLOAT16, 1.0, 0.1, 100, int(np.float16(0.05).view(np.uint16))),   # rounded to float16
    (SUM, BFLOAT16, 3.0, 1.0, 100, 0x4040),                                      # 3.0 in bfloat16
])
def test_the_reduction_and_its_scale_fold_into_one_nccl_op(probe, reduce_op, dtype, prescale, postscale,
                                                          nccl_op, scalar):
    p = Plane(probe, grouped=True).batch(reduce_op=reduce_op, dtype=dtype, prescale=prescale,
                                         postscale=postscale)
    p.tensor(64)
    assert p.run() == OK, p.error
    calls = p.log()
    assert [c.args[4] for c in calls if c.name == "all_reduce"] == [nccl_op]
    made = [c.args[0] for c in calls if c.name == "premulsum"]
    assert made == ([] if scalar is None else [scalar])
    destroyed = [i for i, c in enumerate(calls) if c.name == "red_op_destroy"]
    if scalar is None:
        assert destroyed == []
    else:      # once the calls settled (NCCL said success), not before
        assert len(destroyed) == 1
        settled = [i for i, c in enumerate(calls) if c.name == "async_look" and c.args[0] == 0]
        assert settled and settled[0] < destroyed[0]


def test_a_set_of_one_rank_calls_no_nccl(probe):
    p = Plane(probe, size=1).batch(reduce_op=AVERAGE)
    p.tensor(10).tensor(20, in_place=True).tensor(30)
    assert p.run() == OK, p.error
    calls = p.log()
    nccl_calls = {"group_start", "all_reduce", "group_end", "premulsum", "device_alloc"}
    assert not [c for c in calls if c.name in nccl_calls]
    assert [c.args[1:4] for c in calls if c.name == "copy"] == [
        (p.outputs[0], p.inputs[0], 40), (p.outputs[2], p.inputs[2], 120)]
    assert p.ended_clean()


def test_allgather_is_one_call_when_even_else_a_broadcast_per_member(probe):
    p = Plane(probe, size=3).batch(op=ALLGATHER, dtype=FLOAT32)
    p.tensor(4)
    counts = (ctypes.c_int64 * 3)(4, 4, 4)
    probe.probe_counts(3, counts)
    assert p.run() == OK, p.error
    assert [c.args[:3] for c in p.log("all_gather", "broadcast")] == [(p.inputs[0], p.outputs[0], 16)]
    p.batch(op=ALLGATHER, dtype=FLOAT32).tensor(2)
    probe.probe_counts(3, (ctypes.c_int64 * 3)(2, 0, 5))
    before = len(p.log("all_gather", "broadcast"))
    assert p.run() == OK, p.error
    calls = p.log("all_gather", "broadcast")[before:]
    # member by member, into its place; the empty one skipped alike everywhere
    assert [c.args[:4] for c in calls] == [(p.inputs[0], p.outputs[0], 8, 0),
                                           (p.inputs[0], p.outputs[0] + 8, 20, 2)]


def test_alltoall_is_grouped_sends_and_receives_skipping_empty_pairs(probe):
    p = Plane(probe, rank=1, size=3).batch(op=ALLTOALL, dtype=UINT8)
    p.tensor(10)
    probe.probe_counts(6, (ctypes.c_int64 * 6)(3, 0, 7, 0, 5, 1))   # sent to 0,1,2; received from 0,1,2
    assert p.run() == OK, p.error
    calls = p.log("send", "recv", "group_start", "group_end")
    assert [(c.name, c.args[:3]) for c in calls] == [
        ("group_start", (0, 0, 0)),
        ("send", (p.inputs[0], 3, 0)),
        ("recv", (p.outputs[0], 5, 1)),
        ("send", (p.inputs[0] + 3, 7, 2)), ("recv", (p.outputs[0] + 5, 1, 2)),
        ("group_end", (0, 0, 0))]


def test_a_tensor_on_another_gpu_than_the_sets_is_refused_naming_both_and_the_peers_released(probe):
    p = Plane(probe).batch()
    p.tensor(10, device=1)
    assert p.run() == INVALID_ARG
    assert "cuda:1" in p.error and "cuda:0" in p.error and "'t0'" in p.error
    # the peers are in this batch's NCCL calls: the abort ends them, not their peer timeout
    assert p.aborted() and not p.log("all_reduce", "group_start")


def test_an_alltoall_batch_of_more_than_one_tensor_is_refused_before_any_call(probe):
    """Its counts describe one tensor: two would each be sent with them (an hvlite bug)."""
    p = Plane(probe, size=2).batch(op=ALLTOALL, dtype=UINT8)
    p.tensor(4).tensor(4)
    probe.probe_counts(4, (ctypes.c_int64 * 4)(2, 2, 2, 2))
    assert p.run() == SYSTEM
    assert "an alltoall batch holds one" in p.error and "hvlite bug" in p.error
    assert not p.log("send", "recv", "group_start") and p.aborted()


# ---- never hanging ----

def test_a_batch_whose_end_never_comes_fails_after_the_peer_timeout_and_aborts(probe):
    p = Plane(probe, timeout_s=0.3).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)           # a peer never joins: the stream never passes the end
    start = time.monotonic()
    assert p.run() == TIMEOUT
    took = time.monotonic() - start
    assert 0.3 <= took < 3.0, took
    message = p.error
    assert "NCCL allreduce of tensor 't0'" in message and "HVLITE_PEER_TIMEOUT_SECONDS" in message, message
    assert p.aborted() and p.ended_clean()
    assert [c.name for c in p.log("adopt", "abort")] == ["adopt", "abort"]   # in the comm's context
    assert p.state("abort_stuck") == 0


def test_ncccls_asynchronous_error_fails_the_batch_at_once_with_ncclss_words(probe):
    p = Plane(probe, timeout_s=30).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    probe.probe_async(5, 0, NC_REMOTE_ERROR)  # a peer died: NCCL says so after a few looks
    start = time.monotonic()
    assert p.run() == NCCL
    assert time.monotonic() - start < 3.0
    message = p.error
    assert "remote process exited" in message and "the probe's last error" in message, message
    assert p.aborted() and p.ended_clean()


def test_a_failed_nccl_call_aborts_the_communicator(probe):
    p = Plane(probe, grouped=True).batch()
    p.tensor(100).tensor(100)
    probe.probe_fail(b"all_reduce", 2)
    assert p.run() == NCCL
    assert "ncclAllReduce failed" in p.error
    assert "group_end" in [c.name for c in p.log()]     # the group is closed before the abort
    assert p.aborted() and p.ended_clean()


def test_a_batch_left_running_is_looked_at_without_waiting_and_ends_its_ticket(probe):
    p = Plane(probe).batch()
    p.tensor(100).tensor(50)
    probe.probe_pace(NEVER, 0)
    assert p.run(left_running=True) == OK, p.error
    ticket = probe.probe_ticket()
    assert ticket and p.state("tickets") == 1
    assert not p.log("event_look")                       # run_device did not wait
    assert p.settle(ticket, LOOK) == (OK, 0)
    assert len(p.log("event_look")) == 1                 # one look
    probe.probe_pace(0, 0)
    assert p.settle(ticket, LOOK) == (OK, 1)
    assert p.ended_clean()


def test_a_look_past_the_timeout_fails_and_the_sets_other_batches_fail_with_it(probe):
    p = Plane(probe, timeout_s=1.0).batch()       # the first look comes well inside it
    first, second = two_left_running(p)
    assert p.settle(first, LOOK) == (OK, 0)
    time.sleep(1.2)
    assert p.settle(first, LOOK)[0] == TIMEOUT
    assert "HVLITE_PEER_TIMEOUT_SECONDS" in p.error
    assert p.aborted()
    assert p.settle(second, WAIT)[0] == NCCL             # at once: its communicator is gone
    assert "failed before it ended" in p.error
    assert p.ended_clean()


@pytest.mark.parametrize("drains", [True, False])
def test_abandon_aborts_frees_every_ticket_and_says_whether_the_gpu_got_past_them(probe, drains):
    """The engine stops: the batches left running are aborted; their buffers may be let go only
    once the stream is seen past them (bounded), else the device is marked stuck."""
    p = Plane(probe, timeout_s=0.3).batch()
    p.tensor(100).tensor(50)
    probe.probe_pace(NEVER, NEVER)
    for _ in range(3):
        assert p.run(left_running=True) == OK
    assert p.state("tickets") == 3
    probe.probe_stuck_after_abort(int(not drains))
    start = time.monotonic()
    assert probe.probe_abandon() == int(drains)
    assert time.monotonic() - start < 3.0
    assert p.aborted() and p.ended_clean()
    names = [c.name for c in p.log()]
    assert names.index("abort") < names.index("mark")
    assert ("cuda_stuck" in names) == (not drains)


@pytest.mark.parametrize("drains", [True, False])
def test_after_a_timeout_the_stop_frees_only_what_a_drained_stream_let_go(probe, drains):
    """A batch that timed out may wait on a kernel that never ends; cuMemFree and cuMemFreeHost
    would then wait for ever at the engine's stop. After the abort the stream is looked at,
    bounded: drained, the buffers are freed at the close; not, the device is marked stuck and
    every buffer left to it (the staged path's pinned memory too: hvl__cuda_stuck)."""
    p = Plane(probe, timeout_s=0.3, pools=False).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    probe.probe_stuck_after_abort(int(not drains))
    start = time.monotonic()
    assert p.run() == TIMEOUT
    assert time.monotonic() - start < 3.0          # the batch's bound, then the drain's (0.3 s each)
    names = [c.name for c in p.log()]
    looked = [i for i, n in enumerate(names) if n == "mark_look"]
    assert looked and names.index("abort") < min(looked)
    assert ("cuda_stuck" in names) == (not drains) and p.state("stream_stuck") == int(not drains)
    fusion = p.state("fusion")
    probe.probe_close()
    frees = [c.args[1] for c in p.log("device_free")]
    assert frees == ([fusion] if drains else [])


def test_an_abort_that_hangs_is_left_behind_after_its_bound(probe):
    p = Plane(probe, timeout_s=0.3).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    probe.probe_abort_hangs(1)               # ncclCommAbort waits on a stopped peer's proxy
    start = time.monotonic()
    assert p.run() == TIMEOUT
    took = time.monotonic() - start
    assert 0.6 <= took < 4.0, took           # the batch's bound, then the abort's
    assert p.state("abort_stuck") == 1
    assert "cuda_stuck" in [c.name for c in p.log()]
    probe.probe_close()                      # its buffers may still be NCCL's: never freed
    assert not p.log("device_free")
    probe.probe_abort_hangs(0)
    deadline = time.monotonic() + 5
    while not probe.probe_abort_returned() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.probe_abort_returned()


def test_the_shutdown_flag_ends_a_blocking_wait_but_not_an_agreed_stops(probe):
    p = Plane(probe, timeout_s=0).batch()     # no peer timeout: only the flags bound the wait
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    probe.probe_shutdown(1)
    start = time.monotonic()
    assert p.run() == SHUT_DOWN
    assert 1.0 <= time.monotonic() - start < 4.0          # after the grace every wait has
    p = Plane(probe, timeout_s=1.5).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    assert p.run(left_running=True) == OK
    probe.probe_shutdown(1)
    assert p.settle(probe.probe_ticket(), STOPPING)[0] == TIMEOUT    # the peer bound, not the flag
    probe.probe_shutdown(0)


def outgrown(p, calls, old, pools):
    """The buffer at `old` was replaced without a wait: with memory pools freed stream-ordered
    (after the batches queued before it), without them kept; no look at the stream first."""
    frees = [c.args for c in calls if c.name == "device_free" and c.args[1] == old]
    assert frees == ([(0, old, 1, 0, 0)] if pools else [])
    assert not [c for c in calls if c.name in ("mark", "mark_look")]


@pytest.mark.parametrize("pools", [True, False])
def test_a_buffer_grows_without_waiting_for_the_batches_left_running(probe, pools):
    """cuMemFree waits for the whole device (the framework's queued work too): a buffer the
    batches left running may still read is freed after them on the engine's stream, or kept
    until the set closes; the engine never waits for the device to grow one."""
    p = Plane(probe, pools=pools).batch()
    p.tensor(100).tensor(50)
    probe.probe_pace(NEVER, NEVER)             # the batches left running never end
    assert p.run(left_running=True) == OK
    old = p.state("fusion")
    p.batch().tensor(10000).tensor(5000)       # needs a larger fusion buffer
    assert p.run(left_running=True) == OK, p.error
    calls = p.log()
    assert p.state("fusion") != old
    grown = [c.args for c in calls if c.name == "device_alloc"][-1]
    assert grown[2] == p.state("fusion") and grown[3] == int(pools)    # stream-ordered with pools
    outgrown(p, calls, old, pools)
    probe.probe_abandon()                      # the engine stops: now the stream drains
    probe.probe_close()
    frees = [c.args[1:3] for c in p.log("device_free")]
    assert (old, 0) in frees if not pools else (old, 1) in frees      # kept ones freed at the close


def test_without_pools_an_outgrown_buffer_is_kept_and_the_next_is_twice_as_large(probe):
    p = Plane(probe, pools=False).batch()
    p.tensor(1000).tensor(1000)                # 8 KiB of slots
    assert p.run() == OK
    first = p.state("fusion_cap")
    p.batch().tensor(1200).tensor(1000)        # a little more: twice the first
    assert p.run() == OK
    assert p.state("fusion_cap") == 2 * first
    # more again, within this buffer: the members still agree (one with memory pools has a
    # buffer of exactly the last size, so it asks them), as on every larger fused batch
    agreed = len(p.log("agree"))
    p.batch().tensor(1500).tensor(1000)
    assert p.run() == OK
    assert p.state("fusion_cap") == 2 * first and len(p.log("agree")) == agreed + 1
    p.batch().tensor(100000).tensor(1)         # far more: as much as it needs
    assert p.run() == OK
    assert p.state("fusion_cap") == slot(400000) + slot(4)
    assert len(p.log("agree")) == 4 and not p.log("device_free")


@pytest.mark.parametrize("grows", ["both", "scratch", "zeros"])
def test_the_stand_ins_grow_without_waiting_for_the_batches_left_running(probe, grows):
    p = Plane(probe, grouped=True).batch()
    p.tensor(100).tensor(50, HOST).tensor(50, HOST).tensor(50, HOST)   # zeros 200 B, scratch 3 x 256
    probe.probe_pace(NEVER, NEVER)
    assert p.run(left_running=True) == OK, p.error
    zeros, scratch = p.state("zeros"), p.state("scratch")
    assert zeros and scratch
    p.batch().tensor(100)
    if grows == "both":              # a joined rank's larger tensor: more zeros and scratch
        p.tensor(5000, HOST)
    elif grows == "scratch":         # four as large as before: more scratch, the same zeros
        p.tensor(50, HOST).tensor(50, HOST).tensor(50, HOST).tensor(50, HOST)
    else:                            # one of 600 B: more zeros, within the scratch
        p.tensor(150, HOST)
    assert p.run(left_running=True) == OK, p.error
    calls = p.log()
    frees = [c.args[1:3] for c in calls if c.name == "device_free"]
    assert frees == {"both": [(zeros, 1), (scratch, 1)], "scratch": [(scratch, 1)], "zeros": [(zeros, 1)]}[grows]
    assert not [c for c in calls if c.name in ("mark", "mark_look")]
    assert (p.state("scratch") != scratch) == (grows != "zeros")
    assert (p.state("zeros") != zeros) == (grows != "scratch")
    if grows == "both":
        assert [c.args[1:3] for c in p.log("zero")][-1] == (p.state("zeros"), 5000 * 4)


def test_a_batchs_bound_starts_when_the_batch_before_it_ended(probe):
    """A batch queued behind another waits for it on the stream: its peer timeout counts from
    the previous batch's end, not from its own queueing."""
    timeout = 2.5                                # each look below a second inside its bound
    p = Plane(probe, timeout_s=timeout).batch()
    first, second = two_left_running(p)
    queued = time.monotonic()
    time.sleep(0.6 * timeout)
    probe.probe_pace(0, NEVER)                   # the first ends 1.5 s in
    assert p.settle(first, LOOK) == (OK, 1), p.error
    first_ended = time.monotonic()
    probe.probe_pace(NEVER, NEVER)
    time.sleep(max(0.0, queued + 1.2 * timeout - time.monotonic()))
    assert p.settle(second, LOOK) == (OK, 0), p.error     # 3 s after queueing, 1.5 s after the first
    time.sleep(max(0.0, first_ended + timeout + 0.2 - time.monotonic()))
    assert p.settle(second, LOOK)[0] == TIMEOUT
    assert "HVLITE_PEER_TIMEOUT_SECONDS" in p.error
    assert p.aborted() and p.ended_clean()


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_no_room_for_the_fusion_buffer_on_a_member_runs_fused_batches_grouped_everywhere(probe, where):
    p = Plane(probe).batch()
    p.tensor(100).tensor(50)
    if where == "here":
        probe.probe_fail(b"device_alloc", 1)
    else:
        probe.probe_peers(0, 1)
    assert p.run() == OK, p.error
    assert p.state("fusion_off") == 1
    assert [c.args[:3] for c in p.log("all_reduce")] == [
        (p.inputs[0], p.outputs[0], 100), (p.inputs[1], p.outputs[1], 50)]
    assert not p.log("copy")


# ---- the set's decision ----

def test_a_set_of_ranks_on_their_own_gpus_makes_its_communicator_from_rank_0s_id(probe):
    for rank in (0, 1):
        p = Plane(probe, rank=rank, size=2, nccl=False).batch()
        probe.probe_async(3, 0, 0)              # the nonblocking init goes on for a few looks
        assert p.prepare() == OK, p.error
        assert p.state("mode") == USE_NCCL and probe.probe_can_run() == 1
        names = [c.name for c in p.log()]
        assert ("get_unique_id" in names) == (rank == 0)
        init = p.log("init")[0].args
        assert init[:3] == (2, rank, 0)        # 2 ranks, this one, blocking off
        assert init[3] == (7 if rank == 0 else 0x42)   # rank 0's own id; elsewhere, the one it sent
        assert names.index("bcast") < names.index("init")
        looks = [c.args[0] for c in p.log("async_look")]
        assert looks[-1] == 0 and NC_IN_PROGRESS in looks      # polled until it settled
        agree = p.log("agree")[0].args
        assert agree[0] == OK and agree[1] == 4 * 30_000        # the agreement's bound: 4x the peer timeout


def test_a_new_communicator_is_warmed_up_before_the_set_agrees(probe):
    """NCCL connects its transports inside a communicator's first collective: a one-byte
    allreduce and broadcast on the engine's stream, waited for like a batch, before the
    members agree on the communicator."""
    p = Plane(probe, nccl=False).batch()
    assert p.prepare() == OK, p.error
    calls = p.log()
    names = [c.name for c in calls]
    reduce_at, bcast_at, agree_at = names.index("all_reduce"), names.index("broadcast"), names.index("agree")
    assert names.index("init") < reduce_at < bcast_at < agree_at
    scratch = p.state("scratch")
    assert scratch and calls[reduce_at].args[:3] == (scratch, scratch, 1)
    assert calls[bcast_at].args[:4] == (scratch, scratch, 1, 0)
    # each call settled before the next; then the stream seen past both, before the agreement
    settled = [i for i, c in enumerate(calls) if c.name == "async_look" and c.args[0] == 0]
    assert any(reduce_at < i < bcast_at for i in settled)
    reached = [i for i, c in enumerate(calls) if c.name == "mark_look" and c.args[1]]
    assert reached and bcast_at < names.index("mark") < reached[0] < agree_at
    assert p.state("mode") == USE_NCCL


@pytest.mark.parametrize("how", ["error", "never ends"])
def test_a_transport_failure_in_the_warm_up_leaves_the_set_staged_everywhere(probe, how):
    """A first run's failures (a tiny /dev/shm, CUDA IPC denied) come in the first collective:
    met in the warm-up, they are agreed and the set falls back to the staged path, not fatal."""
    p = Plane(probe, timeout_s=0.3, nccl=False).batch()
    if how == "error":
        probe.probe_async(0, 1, NC_SYSTEM_ERROR)    # the init settles; the warm-up's first call fails
    else:
        probe.probe_pace(0, NEVER)                  # the warm-up's collectives never end
    start = time.monotonic()
    assert p.prepare() == OK, p.error               # not fatal
    assert time.monotonic() - start < 3.0
    assert p.state("mode") == STAGED and p.state("comm") == 0 and probe.probe_can_run() == 0
    assert p.log("agree")[0].args[0] == (NCCL if how == "error" else TIMEOUT)
    assert "abort" in [c.name for c in p.log()]


def test_ranks_sharing_a_gpu_stay_staged_without_calling_nccl(probe):
    p = Plane(probe, nccl=False).batch()
    probe.probe_peers(1, 0)
    assert p.prepare() == OK
    assert p.state("mode") == STAGED and probe.probe_can_run() == 0
    assert not p.log("init", "get_unique_id")


def test_a_set_up_that_never_finishes_is_given_up_and_the_set_stays_staged_everywhere(probe):
    p = Plane(probe, timeout_s=0.3, nccl=False).batch()
    probe.probe_async(10 ** 9, 0, 0)          # a peer never joins the bootstrap
    start = time.monotonic()
    assert p.prepare() == OK       # not fatal: agreed, staged everywhere
    assert time.monotonic() - start < 3.0
    assert p.state("mode") == STAGED and p.state("comm") == 0
    assert p.log("agree")[0].args[0] == TIMEOUT
    assert "abort" in [c.name for c in p.log()]


def test_a_set_up_that_failed_on_another_member_leaves_the_set_staged_here_too(probe):
    p = Plane(probe, nccl=False).batch()
    probe.probe_peers(0, 1)
    assert p.prepare() == OK
    assert p.state("mode") == STAGED and p.state("comm") == 0
    assert "abort" in [c.name for c in p.log()]     # its own communicator, made, is let go


def test_broadcast_and_reducescatter_as_nccl_calls(probe):
    p = Plane(probe, rank=1, size=3, grouped=True).batch(op=BROADCAST, dtype=FLOAT32, root=2)
    p.tensor(10).tensor(3, HOST)
    assert p.run() == OK, p.error
    zeros, scratch = [c.args[2] for c in p.log("device_alloc")]
    assert [c.args[:4] for c in p.log("broadcast")] == [(p.inputs[0], p.outputs[0], 40, 2), (zeros, scratch, 12, 2)]
    p.batch(op=REDUCESCATTER, reduce_op=SUM, dtype=FLOAT32).tensor(9)
    probe.probe_counts(3, (ctypes.c_int64 * 3)(4, 3, 2))    # this rank (1) gets 3 elements
    assert p.run() == OK, p.error
    assert [c.args[:3] for c in p.log("reduce_scatter")] == [(p.inputs[0], p.outputs[0], 3)]


def test_a_set_of_one_rank_copies_its_reducescatter_rows(probe):
    p = Plane(probe, size=1).batch(op=REDUCESCATTER, dtype=FLOAT64)
    p.tensor(6)
    probe.probe_counts(1, (ctypes.c_int64 * 1)(6))
    assert p.run() == OK, p.error
    assert [c.args[1:4] for c in p.log("copy")] == [(p.outputs[0], p.inputs[0], 48)]
    assert not p.log("reduce_scatter", "group_start")


def test_a_fused_allgather_of_uneven_tensors_places_each_members_rows(probe):
    p = Plane(probe, rank=0, size=2).batch(op=ALLGATHER, dtype=UINT8)
    p.tensor(3).tensor(5)
    # tensor t from member r at counts[r * 2 + t]: tensor 0 is even (3, 3), tensor 1 uneven (5, 1)
    probe.probe_counts(4, (ctypes.c_int64 * 4)(3, 5, 3, 1))
    assert p.run() == OK, p.error
    calls = p.log("all_gather", "broadcast")
    assert [(c.name, c.args[:3]) for c in calls] == [
        ("all_gather", (p.inputs[0], p.outputs[0], 3)),
        ("broadcast", (p.inputs[1], p.outputs[1], 5)), ("broadcast", (p.inputs[1], p.outputs[1] + 5, 1))]
    assert [c.args[3] for c in calls if c.name == "broadcast"] == [0, 1]   # each member its own root


def test_ncccls_error_while_waiting_for_a_batchs_end_fails_it(probe):
    p = Plane(probe).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    probe.probe_async(0, 1, NC_REMOTE_ERROR)     # the calls settle, then a peer dies mid-collective
    assert p.run() == NCCL
    assert "remote process exited" in p.error
    assert p.log("event_look")                   # it failed in the wait for the end
    assert p.aborted() and p.ended_clean()


def test_an_abort_that_could_not_run_keeps_the_sets_buffers(probe):
    p = Plane(probe, timeout_s=0.3).batch()
    p.tensor(100).tensor(100)
    probe.probe_pace(NEVER, NEVER)
    probe.probe_fail(b"adopt", 1)               # no context for the GPU on the abort's thread
    assert p.run() == TIMEOUT
    assert "abort" not in [c.name for c in p.log()]
    assert p.state("abort_stuck") == 1          # NCCL may still use them
    assert "cuda_stuck" in [c.name for c in p.log()]   # its kernels may never end
    probe.probe_close()
    assert not p.log("device_free")


def test_the_sets_decision_without_nccl_or_a_device(probe):
    p = Plane(probe, nccl=False).batch()
    probe.probe_disable_nccl(1)
    assert p.prepare() == OK
    assert p.state("mode") == STAGED and not p.log("allgather", "init")      # no exchange at all
    p = Plane(probe, nccl=False).batch()
    assert p.prepare(-1) == OK                  # a member joined before its first CUDA tensor
    assert p.state("mode") == UNDECIDED and not p.log("init")


def test_without_memory_pools_allgather_and_alltoall_stay_staged(probe):
    p = Plane(probe).batch()
    probe.probe_pools(0)
    assert probe.probe_can_run() == 1
    for op in (ALLGATHER, ALLTOALL):
        p.batch(op=op)
        assert probe.probe_can_run() == 0


def test_nccls_threads_start_on_the_cores_the_engine_thread_had_before_it_was_pinned(probe):
    """Under HVLITE_THREAD_AFFINITY the engine thread has one core; the threads NCCL starts in
    its set-up (the nonblocking init's, the proxies, those of the warm-up's connections) would
    inherit it. The set-up runs on the cores the thread had before, then it is pinned again."""
    p = Plane(probe, nccl=False).batch()
    cores = probe.probe_pin(1)
    if cores < 2:
        pytest.skip("one core here: nothing to tell apart")
    assert p.prepare() == OK, p.error
    assert p.state("mode") == USE_NCCL
    seen = [c.args[0] for c in p.log("cpus")]
    assert seen == [cores, cores]                   # at the init and at the warm-up's calls
    assert probe.probe_cpus_after() == 1            # pinned again
