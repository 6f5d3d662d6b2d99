"""The result-buffer allocator (csrc/core/buffers.c through hvlite._core) and the results made
over it: alignment, the reuse cache and its bounds, freeing from other threads, 0 bytes; and
out-of-place results that outlive their handles and are writable (one-rank engine)."""
import gc
import threading

import numpy as np
import pytest

import hvlite as hvd
from hvlite import buffers
from hvlite._lib import ffi, lib

MIB = 1 << 20
CACHE_MIN = lib.HVL_BUFFER_CACHE_MIN
HUGE_MIN = lib.HVL_BUFFER_HUGE_MIN
HUGE_PAGE = 2 * MIB


def addr(p):
    return int(ffi.cast("uintptr_t", p))


def cached():
    n, b = ffi.new("int64_t *"), ffi.new("int64_t *")
    lib.hvl_buffer_cache_info(n, b)
    return n[0], b[0]


@pytest.fixture
def empty_cache():
    lib.hvl_buffer_cache_trim()
    yield
    lib.hvl_buffer_cache_trim()


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 4095, 100000, CACHE_MIN - 1, CACHE_MIN,
                                    HUGE_MIN - 65536, HUGE_MIN - 1])
def test_small_buffers_are_64_byte_aligned_and_writable(nbytes):
    p = lib.hvl_buffer_alloc(nbytes)
    assert p != ffi.NULL and addr(p) % 64 == 0
    if nbytes:
        pattern = bytes(range(256)) * (nbytes // 256) + bytes(range(nbytes % 256))
        ffi.buffer(p, nbytes)[:] = pattern
        assert ffi.buffer(p, nbytes)[:] == pattern
    lib.hvl_buffer_free(p)


@pytest.mark.parametrize("nbytes", [HUGE_MIN, HUGE_MIN + 1, 64 * MIB + 3])
def test_large_buffers_are_huge_page_aligned_and_writable(nbytes, empty_cache):
    p = lib.hvl_buffer_alloc(nbytes)
    assert p != ffi.NULL and addr(p) % HUGE_PAGE == 0
    view = np.frombuffer(ffi.buffer(p, nbytes), np.uint8)
    view[:] = 7
    view[-1] = 9
    assert view[0] == 7 and view[-1] == 9 and int(view.sum(dtype=np.int64)) == 7 * nbytes + 2
    del view
    lib.hvl_buffer_free(p)


def test_bad_sizes_and_null():
    assert lib.hvl_buffer_alloc(-1) == ffi.NULL
    lib.hvl_buffer_free(ffi.NULL)      # a no-op, as free(NULL)
    with pytest.raises(MemoryError):
        buffers.allocate(-1)


def test_a_freed_large_buffer_is_reused_for_the_same_rounded_size(empty_cache):
    p = lib.hvl_buffer_alloc(HUGE_MIN + 1)          # rounded up to 6 MiB
    ffi.buffer(p, 1)[0] = b"x"
    lib.hvl_buffer_free(p)
    assert cached() == (1, HUGE_MIN + HUGE_PAGE)
    other = lib.hvl_buffer_alloc(HUGE_MIN)           # 4 MiB: another size, a new mapping
    assert addr(other) != addr(p) and cached() == (1, HUGE_MIN + HUGE_PAGE)
    again = lib.hvl_buffer_alloc(HUGE_MIN + HUGE_PAGE)
    assert addr(again) == addr(p) and cached() == (0, 0)
    assert ffi.buffer(again, 1)[0] == b"x"           # the same memory, not a fresh mapping
    lib.hvl_buffer_free(other)
    lib.hvl_buffer_free(again)
    assert cached() == (2, 2 * HUGE_MIN + HUGE_PAGE)


def test_small_buffers_are_not_cached(empty_cache):
    lib.hvl_buffer_free(lib.hvl_buffer_alloc(CACHE_MIN - 1))
    assert cached() == (0, 0)


def test_middle_buffers_are_cached_by_size_rounded_to_64_kib(empty_cache):
    """From HVL_BUFFER_CACHE_MIN to HVL_BUFFER_HUGE_MIN: mappings of sizes rounded to 64 KiB,
    cached, without the huge-page alignment."""
    p = lib.hvl_buffer_alloc(CACHE_MIN + 1)
    assert addr(p) % 4096 == 0
    lib.hvl_buffer_free(p)
    assert cached() == (1, CACHE_MIN + 65536)
    same_class = lib.hvl_buffer_alloc(CACHE_MIN + 65536)
    assert addr(same_class) == addr(p) and cached() == (0, 0)
    lib.hvl_buffer_free(same_class)
    just_under_huge = lib.hvl_buffer_alloc(HUGE_MIN - 1)   # rounds up to 4 MiB: a huge one
    assert addr(just_under_huge) % HUGE_PAGE == 0
    lib.hvl_buffer_free(just_under_huge)
    assert cached() == (2, CACHE_MIN + 65536 + HUGE_MIN)


def test_the_cache_keeps_the_newest_buffers_up_to_its_count(empty_cache):
    count = lib.HVL_BUFFER_CACHE_COUNT
    ps = [lib.hvl_buffer_alloc(HUGE_MIN) for _ in range(count + 3)]
    for p in ps:
        lib.hvl_buffer_free(p)
    assert cached() == (count, count * HUGE_MIN)
    reused = [lib.hvl_buffer_alloc(HUGE_MIN) for _ in range(count)]
    assert [addr(p) for p in reused] == [addr(p) for p in reversed(ps[3:])]   # newest first
    for p in reused:
        lib.hvl_buffer_free(p)


def test_the_cache_keeps_its_byte_bound(empty_cache):
    bound = lib.HVL_BUFFER_CACHE_BYTES
    big = bound // 2 - HUGE_PAGE        # mappings that are never touched cost no memory
    ps = [lib.hvl_buffer_alloc(big) for _ in range(3)]
    for p in ps:
        lib.hvl_buffer_free(p)
    assert cached() == (2, 2 * big)      # the third evicted the first
    taken = lib.hvl_buffer_alloc(big)
    assert addr(taken) == addr(ps[2])
    lib.hvl_buffer_free(lib.hvl_buffer_alloc(bound + 1))    # alone over the bound: unmapped
    assert cached() == (1, big)
    lib.hvl_buffer_free(taken)


def test_buffers_free_from_other_threads(empty_cache):
    """Allocated on one thread and freed on another (as when a result dies on a data-loader
    thread), and many threads allocating and freeing at once."""
    owners = [buffers.allocate(n) for n in (0, 100, HUGE_MIN, 2 * HUGE_MIN)]
    raw = [lib.hvl_buffer_alloc(n) for n in (10, HUGE_MIN)]

    def release():
        owners.clear()
        gc.collect()
        for p in raw:
            lib.hvl_buffer_free(p)
    t = threading.Thread(target=release)
    t.start()
    t.join()
    assert cached() == (3, 4 * HUGE_MIN)
    errors = []

    def churn(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                n = int(rng.choice([0, 64, 5000, HUGE_MIN, HUGE_MIN + HUGE_PAGE, 3 * HUGE_MIN]))
                p = lib.hvl_buffer_alloc(n)
                assert p != ffi.NULL and addr(p) % 64 == 0
                if n:
                    ffi.buffer(p, n)[n - 1] = b"z"
                lib.hvl_buffer_free(p)
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    count, nbytes = cached()
    assert count <= lib.HVL_BUFFER_CACHE_COUNT and nbytes <= lib.HVL_BUFFER_CACHE_BYTES


def test_array_output_views_engine_memory_from_the_crossover():
    small, _ = buffers.array_output(np.float32).new((buffers.ENGINE_MEMORY_MIN // 4 - 1,))
    assert small.base is None                                   # a plain np.empty
    big, owner = buffers.array_output(np.float32).new((buffers.ENGINE_MEMORY_MIN // 4,))
    assert big.ctypes.data == addr(owner)
    aligned, owner = buffers.array_output(np.int8, aligned=True).new((5,))
    assert aligned.ctypes.data == addr(owner) and buffers.is_aligned(aligned)
    zero, _ = buffers.array_output(np.float64, aligned=True).new((0, 3))
    assert zero.shape == (0, 3) and zero.dtype == np.float64
    for a in (small, big, aligned, zero):
        assert a.flags.writeable and a.flags.c_contiguous


@pytest.fixture(scope="module")
def engine():
    hvd.init()
    yield
    c = hvd.engine_counters()
    assert c["tensors_submitted"] == c["tensors_done"]


def test_out_of_place_results_outlive_their_handles(engine, empty_cache):
    """A large out-of-place result is engine memory: it stays valid and writable after its
    handle, the input and every other reference are gone, and returns to the cache when the
    array dies; the next call of that size reuses it."""
    n = HUGE_MIN // 8 + 5
    x = np.arange(n, dtype=np.float64)
    handles = [hvd.allreduce_async(x, op=hvd.Sum, name="outlive.ar"),
               hvd.broadcast_async(x, 0, name="outlive.bc"),
               hvd.reducescatter_async(x, op=hvd.Max, name="outlive.rs")]
    outs = [hvd.synchronize(h) for h in handles]
    del handles, x
    gc.collect()
    expected = np.arange(n, dtype=np.float64)
    for out in outs:
        assert out.ctypes.data % HUGE_PAGE == 0 and out.flags.writeable and out.flags.c_contiguous
        np.testing.assert_array_equal(out, expected)
        out *= 2
        np.testing.assert_array_equal(out, 2 * expected)
    freed = {out.ctypes.data for out in outs}
    before = cached()[0]
    del outs, out
    gc.collect()
    assert cached()[0] == before + 3
    again = hvd.allreduce(expected, op=hvd.Sum, name="outlive.ar")
    assert again.ctypes.data in freed and cached()[0] == before + 2
    np.testing.assert_array_equal(again, expected)


def test_torch_results_over_engine_memory(engine):
    torch = pytest.importorskip("torch")
    import hvlite.torch as th
    n = HUGE_MIN // 4 + 3
    t = torch.arange(n, dtype=torch.float32)
    outs = [th.allreduce(t, op=th.Sum, name="torch.outlive.ar"),
            th.broadcast(t, 0, name="torch.outlive.bc"),
            th.reducescatter(t, op=th.Sum, name="torch.outlive.rs"),
            th.allgather(t, name="torch.outlive.ag")]
    del t
    gc.collect()
    expected = torch.arange(n, dtype=torch.float32)
    for out in outs:
        assert out.data_ptr() % HUGE_PAGE == 0 and out.is_contiguous()
        assert torch.equal(out, expected)
        out.mul_(3)
        assert torch.equal(out, expected * 3)
    small = th.allreduce(torch.ones(3), op=th.Sum, name="torch.small")
    assert torch.equal(small, torch.ones(3))
    empty = th.allreduce(torch.zeros(0, 2, dtype=torch.bfloat16), name="torch.empty")
    assert empty.shape == (0, 2) and empty.dtype == torch.bfloat16
