/* state.c: the one engine instance and what any thread may ask of it without going through the
 * cycle: whether it runs (and why it stopped), the job's topology, the counters and build
 * facts. Everything the cycle's files share lives here, below them, so engine.c (the cycle's
 * life) sits on top and no file calls up into it. Any thread. */
#include <stdio.h>
#include <string.h>
#include "engine.h"

hvl_engine hvl__engine;

static int initialized;         /* atomic: the engine is running (set and cleared by bg) */
static int stopped;             /* atomic: it ran and has stopped; stop_message says why */
static char stop_message[1024]; /* written by bg before `stopped` is released */
static int placed;              /* atomic: the topology is known: from a successful start until
                                   this process's shutdown (kept after a failure, as Horovod
                                   does, so error handlers can still ask for the rank) */

void hvl__mark_running(void)
{
    __atomic_store_n(&stopped, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&placed, 1, __ATOMIC_RELEASE);
}

void hvl__forget_topology(void) { __atomic_store_n(&placed, 0, __ATOMIC_RELEASE); }

/* The first reason holds until the next start (bg thread only, so the check cannot race). */
void hvl__mark_stopped(const char *why)
{
    if (__atomic_load_n(&stopped, __ATOMIC_ACQUIRE)) return;
    snprintf(stop_message, sizeof(stop_message), "%s", why);
    __atomic_store_n(&stopped, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&initialized, 0, __ATOMIC_RELEASE);
}

int hvl_is_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

int hvl__not_running(void)
{
    if (__atomic_load_n(&stopped, __ATOMIC_ACQUIRE))
        return hvl__fail(HVL_ERR_SHUT_DOWN, "%s", stop_message);
    return hvl__fail(HVL_ERR_NOT_INITIALIZED, "hvlite is not initialized: call hvlite.init() (or hvd.init()) "
                     "on every rank before any collective");
}

#define TOPOLOGY(fn, field) int fn(void) { return __atomic_load_n(&placed, __ATOMIC_ACQUIRE) ? hvl__engine.field : -1; }
TOPOLOGY(hvl_rank, rank)
TOPOLOGY(hvl_size, size)
TOPOLOGY(hvl_local_rank, local_rank)
TOPOLOGY(hvl_local_size, local_size)
TOPOLOGY(hvl_cross_rank, cross_rank)
TOPOLOGY(hvl_cross_size, cross_size)
TOPOLOGY(hvl_mpi_threads_supported, thread_multiple)
TOPOLOGY(hvl_is_homogeneous, homogeneous)
#undef TOPOLOGY

static char vendor[MPI_MAX_LIBRARY_VERSION_STRING];

static void read_vendor(void)
{
    int len = 0;
    MPI_Get_library_version(vendor, &len);   /* allowed before MPI_Init */
    char *newline = strchr(vendor, '\n');
    if (newline) *newline = 0;
}

const char *hvl_mpi_vendor(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_vendor);
    return vendor;
}

int hvl_get_counters(hvl_counters *out)
{
    int64_t *src = (int64_t *)&hvl__engine.counters, *dst = (int64_t *)out;
    for (size_t i = 0; i < sizeof(hvl_counters) / sizeof(int64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    return HVL_OK;
}
