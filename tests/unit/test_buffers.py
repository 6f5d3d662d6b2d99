"""The result-buffer allocator (csrc/core/buffers.c through hvlite._core): alignment, the reuse
cache and its bounds, freeing from other threads, 0 bytes."""
import gc
import threading

import numpy as np
import pytest

from hvlite._lib import ffi, lib

MIB = 1 << 20
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


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 4095, 100000, MIB, HUGE_MIN - 1])
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
    lib.hvl_buffer_free(lib.hvl_buffer_alloc(HUGE_MIN - 1))
    assert cached() == (0, 0)


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
    owners = [ffi.gc(lib.hvl_buffer_alloc(n), lib.hvl_buffer_free)
              for n in (0, 100, HUGE_MIN, 2 * HUGE_MIN)]
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
