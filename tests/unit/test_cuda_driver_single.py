"""The engine's CUDA driver binding (csrc/util/cuda_driver.c), checked on a machine without a GPU
through a probe (tests/unit/cuda_driver_probe.c): the file compiled with dlopen and dlsym
answered by a driver of the probe's, which logs every call.

What it shows:
- the engine's stream is made non-blocking at the device's greatest priority, so its copies
  and collectives are not queued behind the framework's kernels (Horovod does the same);
- events the engine lets go are kept for its next ones, by kind (timed or not): a staged batch
  in 4096 pieces creates its events once, not at every batch, and the stop destroys them all;
- memory from the default pool keeps the pool's memory mapped across synchronisations: its
  release threshold is raised to the most the pool has had in use, never lowered, and asked
  no more than needed;
- a stream-ordered free goes on the engine's stream, and none once the device is stuck;
- a result freed once the device's primary context is gone (a process at exit) retains no
  context to free it: its memory went with the context; while it lives, the free is
  stream-ordered on the caller's stream and the caller's current context is put back.
The binding against NVIDIA's cuda.h is tests/unit/test_cuda_driver.py's; on a real driver,
tests/gpu's."""
import ctypes

import pytest

from c_check import load_probe  # tests/unit, beside this file

STREAM_NON_BLOCKING = 1          # cuda_driver.c
EVENT_DISABLE_TIMING = 2
RELEASE_THRESHOLD, USED_MEM_HIGH = 4, 8
MiB = 1 << 20


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = load_probe("cuda_driver_probe", tmp_path_factory.mktemp("cuda_driver_probe"))
    lib.probe_pool.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong]
    lib.probe_log_name.restype = ctypes.c_char_p
    lib.probe_log_arg.restype = ctypes.c_int64
    lib.probe_current.restype = ctypes.c_int64
    lib.probe_engine_stream.restype = ctypes.c_int64
    lib.probe_cuda_event_new.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.probe_cuda_event_free.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.probe_cuda_result_alloc.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64]
    lib.probe_cuda_result_free.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.probe_cuda_stream_free.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return lib


class Driver:
    """The binding on the probe's driver; the calls read back from the log."""

    def __init__(self, lib):
        self.lib = lib
        assert lib.probe_reset() == 0

    def log(self, *names):
        assert self.lib.probe_log_dropped() == 0, "the probe's log overflowed"
        calls = []
        for i in range(self.lib.probe_log_count()):
            name = self.lib.probe_log_name(i).decode()
            if not names or name in names:
                calls.append((name, tuple(self.lib.probe_log_arg(i, j) for j in range(4))))
        return calls

    def event(self, timed=False):
        out = ctypes.c_void_p()
        assert self.lib.probe_cuda_event_new(0, int(timed), ctypes.byref(out)) == 0
        return out.value

    def result(self, nbytes):
        out = ctypes.c_void_p()
        assert self.lib.probe_cuda_result_alloc(0, ctypes.byref(out), nbytes) == 0
        return out.value


def test_the_engine_stream_has_the_devices_greatest_priority(probe):
    d = Driver(probe)
    assert probe.probe_cuda_use(0) == 0
    names = [name for name, _ in d.log()]
    assert names.index("priority_range") < names.index("stream_create")
    (_, (stream, flags, priority, _)), = d.log("stream_create")
    assert flags == STREAM_NON_BLOCKING and priority == -5        # the probe's greatest
    assert stream == probe.probe_engine_stream(0)


def test_events_are_kept_for_the_next_batch_by_kind(probe):
    """A staged batch in 4096 pieces takes 4096 events: created once, then reused."""
    d = Driver(probe)
    for batch in range(10):
        events = [d.event() for _ in range(4096)]
        for e in events:
            probe.probe_cuda_event_free(0, e, 0)
    created = d.log("event_create")
    assert len(created) == 4096 + 1                 # the pieces' once, and the device's mark
    assert all(flags == EVENT_DISABLE_TIMING for _, (_, flags, _, _) in created)
    assert not d.log("event_destroy")
    # kinds apart: a timed event is made timed, and kept for timed ones only
    timed = d.event(timed=True)
    assert d.log("event_create")[-1][1][1] == 0     # timed: no DISABLE_TIMING
    probe.probe_cuda_event_free(0, timed, 1)
    untimed = d.event()
    assert untimed != timed and d.event(timed=True) == timed
    probe.probe_cuda_event_free(0, untimed, 0)
    probe.probe_cuda_event_free(0, timed, 1)
    # the stop destroys every event it kept, the mark with them
    probe.probe_cuda_release()
    made = {handle for _, (handle, _, _, _) in d.log("event_create")}
    assert {handle for _, (handle, _, _, _) in d.log("event_destroy")} == made


def test_the_default_pool_keeps_its_memory_mapped_across_synchronisations(probe):
    d = Driver(probe)
    probe.probe_pool(64 * MiB, 0)                   # the pool had 64 MiB in use at most
    d.result(8 * MiB)
    sets = d.log("pool_set")
    assert [args[1:3] for _, args in sets] == [(RELEASE_THRESHOLD, 64 * MiB)]
    d.result(8 * MiB)                               # nothing new: not asked again
    assert len(d.log("pool_set")) == 1 and len(d.log("pool_get")) == 3
    probe.probe_pool(96 * MiB, 64 * MiB)            # more in use since: raised to it
    d.result(1 * MiB)
    assert [args[1:3] for _, args in d.log("pool_set")][-1] == (RELEASE_THRESHOLD, 96 * MiB)
    d = Driver(probe)                               # another user set a higher threshold: kept
    probe.probe_pool(64 * MiB, 2 ** 64 - 1)
    d.result(1 * MiB)
    assert not d.log("pool_set")


def test_a_stream_ordered_free_goes_on_the_engine_stream_and_none_once_stuck(probe):
    d = Driver(probe)
    p = d.result(4 * MiB)
    probe.probe_cuda_stream_free(0, p)
    (_, (freed, stream, _, _)), = d.log("free_async")
    assert freed == p and stream == probe.probe_engine_stream(0)
    assert not d.log("mem_free")                    # never cuMemFree, which waits for the device
    probe.probe_cuda_stuck()                        # the stream may never get there: leave it
    probe.probe_cuda_stream_free(0, d.result(MiB))
    assert len(d.log("free_async")) == 1


def test_a_result_freed_once_its_context_is_gone_retains_none(probe):
    d = Driver(probe)
    p = d.result(MiB)
    probe.probe_context(0)                          # every user released it: a process at exit
    probe.probe_make_current(1)
    retained = len(d.log("retain"))
    probe.probe_cuda_result_free(0, p, None)
    assert len(d.log("retain")) == retained and not d.log("free_async")
    probe.probe_context(1)                          # alive: freed on the caller's stream
    probe.probe_cuda_result_free(0, p, 0x5157)
    (_, (freed, stream, context, _)), = d.log("free_async")
    assert (freed, stream, context) == (p, 0x5157, 0xc7c7)
    assert len(d.log("retain")) == retained + 1 and d.log()[-1][0] == "release"
    assert probe.probe_current() == 0xa1a1          # the caller's context put back
