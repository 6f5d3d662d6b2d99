"""The staged path's bookkeeping (csrc/core/stage.c) checked on a machine without a GPU, through a
probe (tests/unit/stage_probe.c) that compiles stage.c with its CUDA calls logged and answered by
the test. Nothing is copied on a device: the checks read from the log which bytes stage.c asked
the GPU to copy where, and in what order against the events that say copies are done.

What it shows:
- in pieces: every device byte is copied to the host once, at its packed offset, no copy crosses
  a piece, each piece's event is recorded after its last copy, and the copies back cover each
  result once, and are queued only after the last copy to the host is seen done;
- whole batches: what each op copies in and back (a broadcast's non-roots send nothing, an
  in-place root gets nothing back, reducescatter gets its own rows, allgather nothing);
- the bounds: a GPU that never gets there fails the batch after the peer timeout, naming the
  tensor, and the page-locked buffer is given up to the copies (never freed), and nothing more
  is staged on that rank; a copy that cannot be queued fails the batch after the copies already
  queued are waited for, with its own message;
- the page-locked buffer grows by powers of two and the outgrown ones are freed at the end.
Staging on a real GPU, against NumPy, is tests/gpu/test_cuda_only.py's (make test-gpu)."""
import ctypes
import time
from collections import namedtuple

import pytest

from c_check import bounded, load_probe  # tests/unit, beside this file

(USE, WAIT_EVENT, COPY_TO_HOST, COPY_TO_DEVICE, MARK, MARK_LOOK, HOST_ALLOC, HOST_FREE,
 EVENT_NEW, EVENT_RECORD, EVENT_LOOK, EVENT_FREE, STUCK, AGREE, NOTE) = range(15)   # stage_probe.c
ALLREDUCE, ALLGATHER, BROADCAST, REDUCESCATTER = 0, 1, 2, 4     # csrc/hvlite.h
OK, INVALID_ARG, TIMEOUT, CUDA = 0, 1, 3, 13
HOST = -1                                                       # a joined rank's stand-in
MiB = 1 << 20

Call = namedtuple("Call", "at kind dev dst src n")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("stage_probe", tmp_path_factory.mktemp("stage_probe"))
    lib.probe_reset.argtypes = [ctypes.c_double]
    lib.probe_entry.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.probe_stage_in_pieces.argtypes = [ctypes.c_int64]
    for name in ("probe_entry_input", "probe_entry_output", "probe_saved_output", "probe_entry_event"):
        getattr(lib, name).restype = ctypes.c_uint64
    lib.probe_state.restype = ctypes.c_int64
    lib.probe_state.argtypes = [ctypes.c_char_p]
    lib.probe_log_get.argtypes = [ctypes.c_int] + [ctypes.POINTER(ctypes.c_int)] * 2 + \
        [ctypes.POINTER(ctypes.c_uint64)] * 2 + [ctypes.POINTER(ctypes.c_int64)]
    return lib


class Batch:
    """A batch built through the probe; its calls as execute.c makes them; the log read back."""

    def __init__(self, lib, op=ALLREDUCE, rank=0, size=2, root=0, timeout_s=30.0, reset=True):
        self.lib = lib
        if reset:
            lib.probe_reset(timeout_s)
        lib.probe_batch(op, rank, size, root)
        self.sizes, self.devices, self.inputs, self.outputs, self.events = [], [], [], [], []

    def add(self, nbytes, device=0, event=True, in_place=False):
        i = self.lib.probe_entry(nbytes, device, int(event), int(in_place))
        self.sizes.append(nbytes)
        self.devices.append(device)
        self.inputs.append(self.lib.probe_entry_input(i))
        self.outputs.append(self.lib.probe_entry_output(i))
        self.events.append(self.lib.probe_entry_event(i))
        return i

    def state(self, what):
        return self.lib.probe_state(what.encode())

    def log(self):
        kind, dev, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int64()
        dst, src = ctypes.c_uint64(), ctypes.c_uint64()
        assert self.lib.probe_log_dropped() == 0, "the probe's log overflowed"
        calls = []
        for i in range(self.lib.probe_log_count()):
            self.lib.probe_log_get(i, kind, dev, dst, src, n)
            calls.append(Call(i, kind.value, dev.value, dst.value, src.value, n.value))
        return calls

    def offsets(self):
        """Each entry's packed offset in the flat buffer (pieces)."""
        out, at = [], 0
        for size in self.sizes:
            out.append(at)
            at += size
        return out

    def run_pieces(self, piece, reduce_fails_at=None):
        """execute.c's run_staged_pieces, the reduction left out: (rc of the stage-in, of the
        first failed piece wait or None, of stage_out or None). reduce_fails_at: the piece whose
        reduction fails (the loop stops there, as execute.c's does). stage_end always. Bounded;
        the last error's message in self.error."""
        result, self.error = bounded(self._pieces, piece, reduce_fails_at)
        return result

    def _pieces(self, piece, reduce_fails_at):
        lib, rc_wait, rc_out = self.lib, None, None
        rc_in = lib.probe_stage_in_pieces(piece)
        self.flat = self.state("flat")
        self.end_at = None
        if rc_in == OK:
            for k in range(self.state("npieces")):
                rc = lib.probe_piece_wait(k)
                if rc != OK:
                    rc_wait = rc
                    break
                if k == reduce_fails_at:
                    break
                lib.probe_piece_back(k)
            if rc_wait is None and reduce_fails_at is None:
                rc_out = lib.probe_stage_out()
        self.end_at = lib.probe_log_count()          # stage_end's calls come after this
        lib.probe_stage_end()
        return rc_in, rc_wait, rc_out


def copies_in(calls, flat):
    """(flat offset, device address, bytes) of each copy to the host, in order."""
    return [(c.dst - flat, c.src, c.n) for c in calls if c.kind == COPY_TO_HOST]


def copies_back(calls, flat):
    """(device address, flat offset, bytes) of each copy back, in order."""
    return [(c.dst, c.src - flat, c.n) for c in calls if c.kind == COPY_TO_DEVICE]


def covered(spans):
    """Sorted (start, end) spans; asserts they do not overlap."""
    spans = sorted(spans)
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):
        assert a1 <= b0, f"copies overlap: [{a0}, {a1}) and [{b0}, ...)"
    return spans


def merged(spans):
    out = []
    for a, b in covered(spans):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def check_pieces(b, calls, piece):
    """Every rule of the pieces' copies, from the log of one whole run."""
    flat, offsets, total = b.flat, b.offsets(), sum(b.sizes)
    npieces = -(-total // piece)
    ins, backs = copies_in(calls, flat), copies_back(calls, flat)
    # each device entry's bytes: copied in once, to its packed offset; stand-ins never
    for i, (size, dev) in enumerate(zip(b.sizes, b.devices)):
        mine = [(off, src, n) for off, src, n in ins if b.inputs[i] <= src < b.inputs[i] + max(size, 1)]
        if dev == HOST or size == 0:
            assert mine == [], f"entry {i} copied in"
            continue
        for off, src, n in mine:
            assert off - offsets[i] == src - b.inputs[i], f"entry {i}: a copy lands at the wrong offset"
        assert merged([(src - b.inputs[i], src - b.inputs[i] + n) for _, src, n in mine]) == [(0, size)]
        back = [(dst, off, n) for dst, off, n in backs if b.outputs[i] <= dst < b.outputs[i] + size]
        for dst, off, n in back:
            assert off - offsets[i] == dst - b.outputs[i], f"entry {i}: a copy back from the wrong offset"
        assert merged([(dst - b.outputs[i], dst - b.outputs[i] + n) for dst, _, n in back]) == [(0, size)]
    assert sum(n for *_, n in ins) == sum(s for s, d in zip(b.sizes, b.devices) if d != HOST)
    assert sum(n for *_, n in backs) == sum(s for s, d in zip(b.sizes, b.devices) if d != HOST)
    # no copy in crosses a piece boundary (copies back may: those deferred go as one)
    for off, _, n in ins:
        assert off // piece == (off + n - 1) // piece, f"a copy in crosses a piece: [{off}, {off + n})"
    # each device entry's ready event is waited on (stream order) before its first copy in
    for i, dev in enumerate(b.devices):
        if dev == HOST or b.sizes[i] == 0:
            continue
        first_copy = min(c.at for c in calls if c.kind == COPY_TO_HOST and b.inputs[i] <= c.src < b.inputs[i] + b.sizes[i])
        waits = [c.at for c in calls if c.kind == WAIT_EVENT and c.dst == b.events[i] and c.dev == dev]
        assert waits and waits[0] < first_copy, f"entry {i} copied before its ready event was waited on"
    one_device = len({d for d in b.devices if d != HOST}) == 1
    if one_device:
        # piece k's event is recorded once, after every copy into pieces 0..k
        records = [c for c in calls if c.kind == EVENT_RECORD]
        assert [c.n for c in records] == list(range(npieces))
        for c in calls:
            if c.kind == COPY_TO_HOST:
                k = (c.dst - flat) // piece
                assert c.at < records[k].at, f"piece {k}'s event recorded before its copy"
        # copies back only once the last piece's event was seen reached
        last_done = min(c.at for c in calls if c.kind == EVENT_LOOK and c.n == npieces - 1 and c.dst)
    else:
        assert not any(c.kind == EVENT_RECORD for c in calls)
        last_done = max(min(c.at for c in calls if c.kind == MARK_LOOK and c.n and c.dev == dev)
                        for dev in {d for d in b.devices if d != HOST})
    assert all(c.at > last_done for c in calls if c.kind == COPY_TO_DEVICE)
    # a copy back is queued only after the piece_back call of the last piece it reads
    notes = {c.n: c.at for c in calls if c.kind == NOTE}
    for c in calls:
        if c.kind == COPY_TO_DEVICE:
            assert c.at > notes[(c.src - flat + c.n - 1) // piece], "copied back before it was reduced"
    # at the end, the engine's streams are marked and waited for
    devices = {d for d in b.devices if d != HOST}
    last_back = max((c.at for c in calls if c.kind == COPY_TO_DEVICE), default=-1)
    assert devices <= {c.dev for c in calls if c.kind == MARK and c.at > last_back}


LAYOUTS = {
    "one tensor": [(10 * MiB + 3, 0)],
    "many small": [(1000 + i, 0) for i in range(40)],
    "sizes at the boundaries": [(MiB, 0), (MiB - 1, 0), (1, 0), (2 * MiB, 0), (0, 0), (MiB + 1, 0)],
    "stand-ins among them": [(300_000, 0), (MiB, HOST), (700_000, 0), (3 * MiB, HOST), (5, 0)],
    "stand-ins at the end": [(1_500_000, 0), (2 * MiB, HOST)],
    "two devices": [(MiB + 7, 0), (2 * MiB, 1), (999, 0)],
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("lag", [0, 3])
def test_pieces_copy_every_byte_once_and_back_only_after_every_copy_in(probe, layout, lag):
    b = Batch(probe)
    for size, dev in LAYOUTS[layout]:
        b.add(size, dev)
    probe.probe_pace(lag, lag)        # lag: events and marks seen reached only after `lag` looks
    piece = MiB
    assert b.run_pieces(piece) == (OK, None, OK), b.error
    check_pieces(b, b.log(), piece)
    assert b.state("queued") == 0
    assert b.state("stuck") == 0
    calls = b.log()
    made = [c.n for c in calls if c.kind == EVENT_NEW]
    assert sorted(c.n for c in calls if c.kind == EVENT_FREE) == made      # every event freed


def test_pieces_copy_the_stand_ins_into_the_flat_buffer(probe):
    b = Batch(probe)
    b.add(1000, 0)
    stand_in = b.add(5000, HOST)
    b.add(3000, 0)
    assert b.run_pieces(2048) == (OK, None, OK), b.error
    flat = (ctypes.c_ubyte * 9000).from_address(b.flat)
    assert bytes(flat[1000:6000]) == bytes([stand_in + 1]) * 5000


def test_pieces_of_stand_ins_only_use_host_memory(probe):
    b = Batch(probe)
    b.add(3 * MiB, HOST)
    assert b.run_pieces(MiB) == (OK, None, OK), b.error
    calls = b.log()
    assert b.flat == b.state("fusion_buf")
    assert not [c for c in calls if c.kind in (COPY_TO_HOST, COPY_TO_DEVICE, HOST_ALLOC, EVENT_NEW, MARK)]


def test_copies_back_wait_for_the_last_copy_in_even_when_reduced_pieces_are_ready(probe):
    """With the GPU slow, piece 0 is reduced before the later copies in are done: its copies
    back must wait (a later piece's wait could still give up, and the caller's tensor must not
    be written after its handle failed)."""
    b = Batch(probe)
    b.add(4 * MiB, 0)
    probe.probe_pace(5, 0)
    assert b.run_pieces(MiB) == (OK, None, OK), b.error
    calls = b.log()
    notes = {c.n: c.at for c in calls if c.kind == NOTE}
    first_back = min(c.at for c in calls if c.kind == COPY_TO_DEVICE)
    assert first_back > notes[3], "copies back were queued before every copy in was seen done"
    check_pieces(b, calls, MiB)


def test_a_piece_the_gpu_never_copies_fails_after_the_peer_timeout_and_stops_staging(probe):
    b = Batch(probe, timeout_s=0.2)
    b.add(3 * MiB, 0)
    probe.probe_pace(-1, -1)          # the GPU never gets there (a kernel before the copies hangs)
    start = time.monotonic()
    rc_in, rc_wait, rc_out = b.run_pieces(MiB)
    assert 0.2 <= time.monotonic() - start < 5.0      # the peer timeout, not at once, not never
    assert (rc_in, rc_wait, rc_out) == (OK, TIMEOUT, None)
    message = b.error
    assert "'t0'" in message and "HVLITE_PEER_TIMEOUT_SECONDS" in message, message
    calls = b.log()
    buffer = next(c.dst for c in calls if c.kind == HOST_ALLOC)
    assert b.state("stuck") == 1 and b.state("stage_buf") == 0      # given up to the copies
    assert not [c for c in calls if c.kind == COPY_TO_DEVICE]      # the caller's tensor untouched
    assert any(c.kind == STUCK for c in calls)
    # stage_end waits no more: the copies were given up on already
    stuck_at = next(c.at for c in calls if c.kind == STUCK)
    assert not [c for c in calls if c.kind == MARK_LOOK and c.at > stuck_at]
    # this rank stages nothing more, at once, saying why
    again = Batch(probe, reset=False)
    again.add(1000, 0)
    assert again.run_pieces(256)[0] == CUDA
    assert "cannot be staged" in again.error
    assert again.state("failed_everywhere") == 1
    probe.probe_stage_free()
    assert not [c for c in b.log() if c.kind == HOST_FREE and c.dst == buffer]   # never freed


@pytest.mark.parametrize("nth", [1, 3])
def test_a_copy_in_that_cannot_be_queued_fails_everywhere_after_the_queued_copies(probe, nth):
    b = Batch(probe)
    b.add(5 * MiB, 0)
    probe.probe_fail(COPY_TO_HOST, nth)
    rc_in, _, _ = b.run_pieces(MiB)
    assert rc_in == CUDA, "this rank keeps its own error"
    assert "the probe refuses" in b.error
    assert b.state("failed_everywhere") == 1
    calls = b.log()
    failed_at = [c.at for c in calls if c.kind == COPY_TO_HOST][nth - 1]
    agreed_at = next(c.at for c in calls if c.kind == AGREE)
    assert [c.dst for c in calls if c.kind == AGREE] == [CUDA]      # this rank's failure, agreed
    # the copies queued before it were waited for before the members agreed to fail
    assert any(c.kind == MARK_LOOK and c.n and failed_at < c.at < agreed_at for c in calls)
    assert b.state("queued") == 0 and b.state("stuck") == 0
    assert not [c for c in calls if c.kind == COPY_TO_DEVICE]


def test_a_copy_back_that_cannot_be_queued_is_this_ranks_error_and_the_pieces_go_on(probe):
    b = Batch(probe)
    b.add(4 * MiB, 0)
    probe.probe_fail(COPY_TO_DEVICE, 2)
    rc_in, rc_wait, rc_out = b.run_pieces(MiB)
    assert (rc_in, rc_wait) == (OK, None)
    assert rc_out == CUDA and "the probe refuses" in b.error
    calls = b.log()
    assert [c.n for c in calls if c.kind == NOTE] == [0, 1, 2, 3]    # every piece still reduced
    assert len([c for c in calls if c.kind == COPY_TO_DEVICE]) == 2   # none after the failure
    last_back = max(c.at for c in calls if c.kind == COPY_TO_DEVICE)
    assert any(c.kind == MARK_LOOK and c.n and c.at > last_back for c in calls)   # waited for


# ---- whole batches (hvl__stage_in / _out) ----

def run_whole(b):
    """hvl__stage_in, _out and _end: (rc, the staged input and output pointers). Bounded; the
    last error's message in b.error."""
    result, b.error = bounded(_whole, b)
    return result


def _whole(b):
    lib = b.lib
    rc = lib.probe_stage_in()
    staged = [lib.probe_entry_input(i) for i in range(len(b.sizes))]
    staged_out = [lib.probe_entry_output(i) for i in range(len(b.sizes))]
    if rc == OK:
        rc = lib.probe_stage_out()
    lib.probe_stage_end()
    return rc, staged, staged_out


@pytest.mark.parametrize("op, rank, in_place, copied_in, copied_back", [
    (ALLREDUCE, 0, False, True, "all"),
    (BROADCAST, 0, True, True, "none"),        # the root's tensor is unchanged
    (BROADCAST, 0, False, True, "all"),        # the root's own output still gets the data
    (BROADCAST, 1, False, False, "all"),       # others only receive
    (ALLGATHER, 0, False, True, "none"),       # the engine owns the result
    (REDUCESCATTER, 1, False, True, "rows"),   # this rank's rows only
])
def test_whole_batches_copy_what_each_op_needs(probe, op, rank, in_place, copied_in, copied_back):
    b = Batch(probe, op=op, rank=rank, size=2, root=0)
    b.add(3001, 0, in_place=in_place)
    b.add(64, 0, event=False, in_place=in_place)
    rc, staged, staged_out = run_whole(b)
    assert rc == OK, b.error
    calls = b.log()
    ins = [(c.src, c.n, c.dst) for c in calls if c.kind == COPY_TO_HOST]
    backs = [(c.dst, c.n, c.src) for c in calls if c.kind == COPY_TO_DEVICE]
    if copied_in:
        assert ins == [(b.inputs[i], b.sizes[i], staged[i]) for i in range(2)]
    else:
        assert ins == []
    if copied_back == "all":
        assert backs == [(b.outputs[i], b.sizes[i], staged_out[i]) for i in range(2)]
    elif copied_back == "rows":          # rank 1 of 2: dim0 // 2 rows (hvl_reducescatter_rows)
        assert backs == [(b.outputs[i], b.sizes[i] // 2, staged_out[i]) for i in range(2)]
        assert staged_out[0] != staged[0]                            # apart from the input
    else:
        assert backs == []
    # the ready event is waited on before the copies (stream order); without one, the stream is used
    assert [(c.kind, c.dst) for c in calls if c.kind in (WAIT_EVENT, USE)] == [(WAIT_EVENT, b.events[0]), (USE, 0)]
    ins_at = [c.at for c in calls if c.kind == COPY_TO_HOST]
    if ins_at:
        assert next(c.at for c in calls if c.kind == WAIT_EVENT) < ins_at[0]
    # the copies in are seen done before the members agree (the collective reads them)...
    agreed = next(c.at for c in calls if c.kind == AGREE)
    assert any(c.kind == MARK_LOOK and c.n and c.at < agreed and c.at > max(ins_at, default=-1) for c in calls)
    # ...and the copies back before the caller hears of its result
    backs_at = [c.at for c in calls if c.kind == COPY_TO_DEVICE]
    assert any(c.kind == MARK_LOOK and c.n and c.at > max(backs_at, default=agreed) for c in calls)
    # each entry has its own room in the pinned buffer (input, and reducescatter's output)
    buf, cap = b.state("stage_buf"), b.state("stage_cap")
    rooms = [(staged[i], staged[i] + b.sizes[i]) for i in range(2)]
    if op == REDUCESCATTER:
        rooms += [(staged_out[i], staged_out[i] + b.sizes[i] // 2) for i in range(2)]
    covered(rooms)
    assert all(buf <= lo and hi <= buf + cap for lo, hi in rooms)
    # the caller's pointers are back
    assert [probe.probe_entry_input(i) for i in range(2)] == b.inputs
    assert [probe.probe_entry_output(i) for i in range(2)] == b.outputs
    # whole copies land in one pinned buffer, 64-byte aligned, apart
    assert all(s % 64 == 0 for s in staged)


def test_the_pinned_buffer_grows_by_powers_of_two_and_old_ones_are_freed_at_the_end(probe):
    caps = []
    for n, size in enumerate([1000, 3 * MiB // 2, MiB, 5 * MiB]):
        b = Batch(probe, reset=n == 0)
        b.add(size, 0)
        assert run_whole(b)[0] == OK, b.error
        caps.append(b.state("stage_cap"))
    assert caps == [MiB, 2 * MiB, 2 * MiB, 8 * MiB]
    assert b.state("retired") == 2
    calls = b.log()
    allocated = [c.dst for c in calls if c.kind == HOST_ALLOC]
    assert not [c for c in calls if c.kind == HOST_FREE]           # never while the engine runs
    probe.probe_stage_free()
    assert sorted(c.dst for c in b.log() if c.kind == HOST_FREE) == sorted(allocated)


@pytest.mark.parametrize("gpu", ["finishes", "never finishes"])
def test_an_error_after_the_copies_were_queued_waits_for_them_before_letting_go(probe, gpu):
    """A reduction that fails at piece 1 leaves copies queued: stage_end waits for them (the
    buffer is reused next batch), bounded; if they never finish, the buffer is given up."""
    b = Batch(probe, timeout_s=0.2)
    b.add(4 * MiB, 0)
    probe.probe_pace(0, 0 if gpu == "finishes" else -1)
    assert b.run_pieces(MiB, reduce_fails_at=1)[:2] == (OK, None)
    ended = [c for c in b.log() if c.at >= b.end_at]
    assert any(c.kind == MARK for c in ended)
    assert any(c.kind == MARK_LOOK and c.n for c in ended) == (gpu == "finishes")
    assert b.state("queued") == 0
    assert b.state("stuck") == (gpu == "never finishes")
    assert not [c for c in b.log() if c.kind == COPY_TO_DEVICE and c.at > b.end_at]


def test_another_member_failing_the_stage_in_fails_this_one_too_after_its_copies(probe):
    for pieces in (True, False):
        b = Batch(probe)
        b.add(3 * MiB, 0)
        probe.probe_peer_fails(1)
        rc = b.run_pieces(MiB)[0] if pieces else run_whole(b)[0]
        assert rc == INVALID_ARG and "failed on another rank" in b.error
        assert b.state("failed_everywhere") == 1
        calls = b.log()
        agreed = next(c.at for c in calls if c.kind == AGREE)
        # every copy queued here is seen done before the buffer is let go
        last_in = max(c.at for c in calls if c.kind == COPY_TO_HOST)
        assert any(c.kind == MARK_LOOK and c.n and c.at > last_in for c in calls)
        assert not [c for c in calls if c.kind == COPY_TO_DEVICE]
        assert b.state("queued") == 0
        assert probe.probe_entry_input(0) == b.inputs[0]            # the caller's pointer back
        assert agreed < len(calls)


@pytest.mark.parametrize("failing", [COPY_TO_HOST, COPY_TO_DEVICE, HOST_ALLOC])
def test_a_whole_batch_whose_copy_fails_waits_for_the_queued_copies_and_keeps_its_message(probe, failing):
    b = Batch(probe)
    b.add(1000, 0)
    b.add(2000, 0)
    probe.probe_fail(failing, 2 if failing != HOST_ALLOC else 1)
    rc = run_whole(b)[0]
    assert rc != OK
    calls = b.log()
    assert rc == CUDA and "the probe refuses" in b.error              # this rank's own error
    # before the collective, agreed by every member; a copy back is this rank's alone
    assert b.state("failed_everywhere") == (failing != COPY_TO_DEVICE)
    queued = [c.at for c in calls if c.kind in (COPY_TO_HOST, COPY_TO_DEVICE)]
    if queued:
        assert any(c.kind == MARK_LOOK and c.n and c.at > queued[-1] for c in calls)
    assert [probe.probe_entry_input(i) for i in range(2)] == b.inputs   # the caller's pointers back
    assert [probe.probe_entry_output(i) for i in range(2)] == b.outputs


def test_a_stuck_rank_refuses_whole_batches_too(probe):
    b = Batch(probe, timeout_s=0.2)
    b.add(1000, 0)
    probe.probe_pace(0, -1)                  # the copies in never finish
    assert run_whole(b)[0] == TIMEOUT
    assert b.state("stuck") == 1
    again = Batch(probe, reset=False)
    again.add(1000, 0)
    assert run_whole(again)[0] == CUDA and "cannot be staged" in again.error
