/* buffers.c: memory for collective results that outlive their handle: the outputs of allreduce,
 * broadcast and reducescatter that the binding allocates for out-of-place calls, and the
 * allgather/alltoall results the engine allocates and hvl_result_take hands over.
 *
 * Why not malloc: a fresh result is fresh memory, and in this VM a 4 KiB page fault costs about
 * 2.5 us (64 MiB: 16,384 faults, 40 ms, twice the collective itself); glibc maps and unmaps
 * every block above 32 MiB, and trims its heap under blocks of 1-32 MiB often enough that a loop
 * of out-of-place calls faults on most calls (measured: 13-64 faults per call at 1 MiB). So
 * buffers of HVL_BUFFER_CACHE_MIN bytes and more are private mappings, and a freed one goes to a
 * small cache from which the next request of the same rounded size is served, already faulted
 * in; from HVL_BUFFER_HUGE_MIN they are 2 MiB-aligned and advised to use transparent huge pages
 * (512 times fewer faults). Smaller buffers come from malloc.
 *
 * Every buffer is 64-byte aligned (TensorFlow adopts a buffer through DLPack only at that
 * alignment) and carries a header in the 64 bytes before it, saying how to free it.
 * Any thread. cache_lock guards the cache and is a leaf: nothing else is locked, and nothing is
 * mapped or unmapped, while it is held. Does not touch MPI or the engine's state. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "hvlite.h"

#define ALIGN 64                        /* every buffer; also the header's size */
#define HUGE_PAGE ((int64_t)2 << 20)    /* transparent huge page size on x86-64 and arm64 */
#define SIZE_STEP ((int64_t)64 << 10)   /* mappings below HUGE_MIN: sizes rounded to 64 KiB */

typedef struct {
    int64_t mapped;     /* bytes of the data mapping (see rounded()); 0: from malloc */
    void *block;        /* what malloc returned (malloc'd buffers only) */
    char pad[ALIGN - sizeof(int64_t) - sizeof(void *)];
} header_t;

typedef struct {
    void *data;
    int64_t mapped;
} cached_t;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_t cache[HVL_BUFFER_CACHE_COUNT];   /* cache_lock; oldest first */
static int cache_count;                          /* cache_lock */
static int64_t cache_bytes;                      /* cache_lock */

static header_t *header_of(void *data) { return (header_t *)((char *)data - ALIGN); }

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* The size of the mapping (and cache class) of a buffer of nbytes >= HVL_BUFFER_CACHE_MIN. */
static int64_t rounded(int64_t nbytes)
{
    return round_up(nbytes, nbytes >= HVL_BUFFER_HUGE_MIN ? HUGE_PAGE : SIZE_STEP);
}

/* A new mapping: one page for the header, then `mapped` bytes; from HVL_BUFFER_HUGE_MIN they
 * start on a 2 MiB boundary (over-mapped by 2 MiB, the rest unmapped) and are advised to use
 * huge pages. NULL if out of memory. */
static void *map_buffer(int64_t mapped)
{
    int huge = mapped >= HVL_BUFFER_HUGE_MIN;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (size_t)mapped + page;
    if (huge) span += (size_t)HUGE_PAGE;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *data = huge ? (char *)round_up((int64_t)(uintptr_t)(raw + page), HUGE_PAGE) : raw + page;
    char *start = data - page, *end = data + mapped;
    if (start > raw) munmap(raw, (size_t)(start - raw));
    if (raw + span > end) munmap(end, (size_t)(raw + span - end));
    if (huge) madvise(data, (size_t)mapped, MADV_HUGEPAGE);   /* advice: without THP, 4 KiB pages */
    header_of(data)->mapped = mapped;
    header_of(data)->block = NULL;
    return data;
}

static void unmap_buffer(void *data, int64_t mapped)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    munmap((char *)data - page, page + (size_t)mapped);
}

/* The newest cached buffer of exactly `mapped` bytes, taken out of the cache; NULL if none. */
static void *cache_take(int64_t mapped)
{
    void *data = NULL;
    pthread_mutex_lock(&cache_lock);
    for (int i = cache_count - 1; i >= 0; i--) {
        if (cache[i].mapped != mapped) continue;
        data = cache[i].data;
        cache_bytes -= mapped;
        memmove(&cache[i], &cache[i + 1], sizeof(cached_t) * (size_t)(cache_count - i - 1));
        cache_count--;
        break;
    }
    pthread_mutex_unlock(&cache_lock);
    return data;
}

/* Puts a buffer in the cache, first evicting the oldest until both bounds hold; the evicted
 * (or the buffer itself, if it alone is over the byte bound) go to `out` to be unmapped. */
static int cache_put(void *data, int64_t mapped, cached_t out[HVL_BUFFER_CACHE_COUNT + 1])
{
    int nout = 0;
    if (mapped > HVL_BUFFER_CACHE_BYTES) {
        out[nout++] = (cached_t){data, mapped};
        return nout;
    }
    pthread_mutex_lock(&cache_lock);
    while (cache_count == HVL_BUFFER_CACHE_COUNT || cache_bytes + mapped > HVL_BUFFER_CACHE_BYTES) {
        out[nout++] = cache[0];
        cache_bytes -= cache[0].mapped;
        memmove(&cache[0], &cache[1], sizeof(cached_t) * (size_t)(--cache_count));
    }
    cache[cache_count++] = (cached_t){data, mapped};
    cache_bytes += mapped;
    pthread_mutex_unlock(&cache_lock);
    return nout;
}

void *hvl_buffer_alloc(int64_t nbytes)
{
    if (nbytes < 0 || nbytes > INT64_MAX - HUGE_PAGE - ALIGN) return NULL;
    if (nbytes >= HVL_BUFFER_CACHE_MIN) {
        int64_t mapped = rounded(nbytes);
        void *data = cache_take(mapped);
        return data ? data : map_buffer(mapped);
    }
    void *block = NULL;
    if (posix_memalign(&block, ALIGN, (size_t)(ALIGN + nbytes)) != 0) return NULL;
    void *data = (char *)block + ALIGN;
    header_of(data)->mapped = 0;
    header_of(data)->block = block;
    return data;
}

void hvl_buffer_free(void *data)
{
    if (!data) return;
    header_t *h = header_of(data);
    if (!h->mapped) {
        free(h->block);
        return;
    }
    cached_t evicted[HVL_BUFFER_CACHE_COUNT + 1];
    int n = cache_put(data, h->mapped, evicted);
    for (int i = 0; i < n; i++) unmap_buffer(evicted[i].data, evicted[i].mapped);
}

void hvl_buffer_cache_info(int64_t *buffers, int64_t *bytes)
{
    pthread_mutex_lock(&cache_lock);
    *buffers = cache_count;
    *bytes = cache_bytes;
    pthread_mutex_unlock(&cache_lock);
}

void hvl_buffer_cache_trim(void)
{
    cached_t all[HVL_BUFFER_CACHE_COUNT];
    pthread_mutex_lock(&cache_lock);
    int n = cache_count;
    memcpy(all, cache, sizeof(cached_t) * (size_t)n);
    cache_count = 0;
    cache_bytes = 0;
    pthread_mutex_unlock(&cache_lock);
    for (int i = 0; i < n; i++) unmap_buffer(all[i].data, all[i].mapped);
}
