/* engine.c: the engine's life and its cycle. hvl_init starts the bg thread, which owns MPI:
 * it initialises MPI (or reuses an existing init, e.g. mpi4py's), builds the communicators and
 * then runs the cycle until every rank agrees to stop or a fatal error occurs:
 *     wait for work (or the tick: every cycle while requests are pending, else every 20 ms)
 *     -> drain queue -> negotiate -> execute -> repeat
 * Requests still pending when it stops fail with the reason. MPI is finalized by the bg thread
 * only if it initialised it. hvl_init/hvl_shutdown are serialised by life_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include "internal.h"

hvl_engine hvl__engine;

static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t life_cond = PTHREAD_COND_INITIALIZER;  /* bg -> hvl_init: startup done */
static pthread_t bg_thread;
static int thread_started;      /* life_lock */
static int startup_done;        /* life_lock */
static int startup_status;      /* life_lock */
static char startup_message[1024];
static int initialized;         /* atomic: the engine is running (set and cleared by bg) */
static int stopped;             /* atomic: it ran and has stopped; stop_message says why */
static char stop_message[1024]; /* written by bg before `stopped` is released */
static int mpi_finalized_here;  /* atomic */

void hvl__count(int64_t *counter, int64_t delta) { __atomic_fetch_add(counter, delta, __ATOMIC_RELAXED); }

int hvl__grow(char **buf, int64_t *cap, int64_t need)
{
    if (need <= *cap) return HVL_OK;
    char *b = realloc(*buf, (size_t)need);
    if (!b) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory growing a buffer to %lld bytes", (long long)need);
    *buf = b;
    *cap = need;
    return HVL_OK;
}

static int make_comms(hvl_engine *e)
{
    int provided = 0, flag = 0;
    MPI_Initialized(&flag);
    if (!flag) {
        HVL_CHECK(hvl__mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread"));
        e->mpi_initialized_here = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    e->thread_multiple = provided == MPI_THREAD_MULTIPLE;
    HVL_CHECK(hvl__mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &e->comm), "MPI_Comm_dup"));
    MPI_Comm_set_errhandler(e->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(e->comm, &e->rank);
    MPI_Comm_size(e->comm, &e->size);
    HVL_CHECK(hvl__mpi_check(MPI_Comm_split_type(e->comm, MPI_COMM_TYPE_SHARED, e->rank, MPI_INFO_NULL, &e->local_comm), "MPI_Comm_split_type"));
    MPI_Comm_rank(e->local_comm, &e->local_rank);
    MPI_Comm_size(e->local_comm, &e->local_size);
    HVL_CHECK(hvl__mpi_check(MPI_Comm_split(e->comm, e->local_rank, e->rank, &e->cross_comm), "MPI_Comm_split"));
    MPI_Comm_rank(e->cross_comm, &e->cross_rank);
    MPI_Comm_size(e->cross_comm, &e->cross_size);
    return HVL_OK;
}

/* Settings that must agree for every rank to build the same batches come from rank 0. */
static int agree_settings(hvl_engine *e)
{
    hvl_params *p = &e->params;
    int64_t v[7] = {p->fusion_threshold, p->cache_capacity, p->allreduce_piece, p->shm_disable,
                    p->hierarchical_allreduce, p->shm_chunk, p->test_fake_hosts};
    HVL_CHECK(hvl__mpi_check(MPI_Bcast(v, 7, MPI_INT64_T, 0, e->comm), "MPI_Bcast (settings)"));
    p->fusion_threshold = v[0];
    p->cache_capacity = (int)v[1];
    p->allreduce_piece = v[2];
    p->shm_disable = (int)v[3];
    p->hierarchical_allreduce = (int)v[4];
    p->shm_chunk = v[5];
    p->test_fake_hosts = (int)v[6];
    return HVL_OK;
}

/* HVLITE_TEST_FAKE_HOSTS=H (tests only): each host's ranks are split into H consecutive groups
 * that the engine treats as hosts of their own (local and cross communicators, topology
 * queries, process sets' one_host), so multi-host paths run on one machine. */
static int split_fake_hosts(hvl_engine *e)
{
    int hosts = e->params.test_fake_hosts;
    MPI_Comm local;
    if (hosts < 2) return HVL_OK;
    HVL_CHECK(hvl__mpi_check(MPI_Comm_split(e->local_comm, (int)((int64_t)e->local_rank * hosts / e->local_size),
                                            e->rank, &local), "MPI_Comm_split (fake hosts)"));
    MPI_Comm_free(&e->local_comm);
    MPI_Comm_free(&e->cross_comm);
    e->local_comm = local;
    MPI_Comm_rank(e->local_comm, &e->local_rank);
    MPI_Comm_size(e->local_comm, &e->local_size);
    HVL_CHECK(hvl__mpi_check(MPI_Comm_split(e->comm, e->local_rank, e->rank, &e->cross_comm), "MPI_Comm_split"));
    MPI_Comm_rank(e->cross_comm, &e->cross_rank);
    MPI_Comm_size(e->cross_comm, &e->cross_size);
    return HVL_OK;
}

static int startup(hvl_engine *e)
{
    HVL_CHECK(make_comms(e));
    hvl__log_set(e->params.log_level, e->rank);
    hvl__params_warn();
    HVL_CHECK(agree_settings(e));
    HVL_CHECK(split_fake_hosts(e));
    if (e->rank == 0) hvl__params_log(&e->params);
    if (e->rank == 0)
        hvl_log(HVL_LOG_INFO, "hvlite starting: %d ranks on %d hosts, %s, MPI_THREAD_MULTIPLE %s", e->size,
                e->cross_size, hvl_mpi_vendor(), e->thread_multiple ? "granted" : "not granted");
    HVL_CHECK(hvl__reduce_setup());
    HVL_CHECK(hvl__psets_create(e));
    if (e->params.cache_capacity > 0) HVL_CHECK(hvl__cache_create(&e->cache, e->params.cache_capacity));
    if (e->rank == 0) HVL_CHECK(hvl__coordinator_create(&e->coordinator, e));
    HVL_CHECK(hvl__autotune_start(e));
    HVL_CHECK(hvl__timeline_startup(e));
    e->bit_words = 1 + (e->params.cache_capacity + 63) / 64;
    e->bits_mine = calloc((size_t)e->bit_words * 3, sizeof(uint64_t));
    if (!e->bits_mine) return HVL_ERR_NO_MEMORY;
    e->bits_all = e->bits_mine + e->bit_words;
    e->bits_absent = e->bits_all + e->bit_words;
    return HVL_OK;
}

/* Frees what startup made. Collective parts (communicators, finalize) only after a clean,
 * agreed stop: after a fatal error the other ranks may never arrive. */
static void teardown(hvl_engine *e, int clean)
{
    hvl__timeline_close();          /* writes what is left; the file ends valid either way */
    hvl__cache_destroy(e->cache);
    hvl__coordinator_destroy(e->coordinator);
    hvl__autotune_stop(e);
    hvl__psets_destroy(e, clean);
    free(e->bits_mine);
    free(e->fusion_buf);
    free(e->scratch_buf);
    e->cache = NULL; e->coordinator = NULL; e->bits_mine = NULL;
    e->fusion_buf = e->scratch_buf = NULL;
    e->fusion_cap = e->scratch_cap = 0;
    if (!clean) return;
    hvl__reduce_teardown();
    if (e->cross_comm != MPI_COMM_NULL) MPI_Comm_free(&e->cross_comm);
    if (e->local_comm != MPI_COMM_NULL) MPI_Comm_free(&e->local_comm);
    if (e->comm != MPI_COMM_NULL) MPI_Comm_free(&e->comm);
    if (e->mpi_initialized_here) {
        MPI_Finalize();
        __atomic_store_n(&mpi_finalized_here, 1, __ATOMIC_RELEASE);  /* life_lock is held by the joiner */
    }
}

/* Sleeps until a request arrives, shutdown is asked, or the tick at `deadline`. */
static void wait_for_work(hvl_engine *e, double deadline)
{
    pthread_mutex_lock(&e->queue_lock);
    while (!e->queue_head && !__atomic_load_n(&e->shutdown_requested, __ATOMIC_ACQUIRE)) {
        double left = deadline - hvl__now();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_nsec * 1e-9 + left;
        ts.tv_sec += (time_t)t;
        ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
        pthread_cond_timedwait(&e->wake_cond, &e->queue_lock, &ts);
    }
    pthread_mutex_unlock(&e->queue_lock);
}

/* A rank with nothing pending has nothing to agree on: it sleeps until a request arrives (a
 * wake-up is immediate), ticking only this often so that a peer's shutdown and rank 0's stall
 * inspector still get their rounds. Ticking every cycle while idle cost a 2-rank ResNet step
 * on 2 cores ~15% (226 rounds a step, each a wake-up and an MPI poll on a busy core). */
#define IDLE_TICK_S 0.02

static int run_cycles(hvl_engine *e)
{
    hvl_response_list agreed = {0};
    int rc = HVL_OK;
    while (rc == HVL_OK) {
        double cycle_s = e->params.cycle_time_ms * 1e-3;   /* autotune may change it */
        wait_for_work(e, hvl__now() + (e->pending_head ? cycle_s : IDLE_TICK_S));
        double woke = hvl__now();
        int tl = hvl__tl_active();     /* timeline (rank 0): cycle spans */
        if (tl) hvl__tl_cycle_begin();
        rc = hvl__queue_drain(e);
        if (rc == HVL_OK) rc = hvl__negotiate(e, &agreed);
        if (tl) hvl__tl_negotiated();
        if (rc == HVL_OK) rc = hvl__execute(e, &agreed);
        if (rc == HVL_OK) hvl__autotune_cycle(e, &agreed, woke);
        if (tl) hvl__tl_cycle_end(agreed.count);
        hvl__responses_clear(&agreed);
    }
    free(agreed.items);
    return rc;
}

static void report_startup(int rc)
{
    pthread_mutex_lock(&life_lock);
    startup_done = 1;
    startup_status = rc;
    if (rc != HVL_OK) strncpy(startup_message, hvl_last_error(), sizeof(startup_message) - 1);
    pthread_cond_broadcast(&life_cond);
    pthread_mutex_unlock(&life_lock);
}

static void *bg_main(void *arg)
{
    hvl_engine *e = arg;
    /* Short sleeps in hvl__mpi_wait must be short: the default 50 us timer slack would make
     * every 5 us nap a 55 us one, on the latency path of every small collective. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    int rc = startup(e);
    if (rc == HVL_OK) {
        pthread_mutex_lock(&e->queue_lock);
        e->running = 1;
        pthread_mutex_unlock(&e->queue_lock);
        __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);   /* before init returns */
    }
    report_startup(rc);
    if (rc != HVL_OK) { teardown(e, 0); return NULL; }
    rc = run_cycles(e);
    char message[1024];
    strncpy(message, hvl_last_error(), sizeof(message) - 1);
    message[sizeof(message) - 1] = 0;
    if (rc != HVL_ERR_SHUT_DOWN) {
        __atomic_store_n(&e->fatal, rc, __ATOMIC_RELEASE);
        hvl_log(HVL_LOG_ERROR, "engine stopped: %s", message);
    }
    hvl__entries_fail_all(e, rc, message);
    snprintf(stop_message, sizeof(stop_message), "%s", message);
    __atomic_store_n(&stopped, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&initialized, 0, __ATOMIC_RELEASE);   /* a peer's shutdown stops us too */
    teardown(e, rc == HVL_ERR_SHUT_DOWN);
    return NULL;
}

static void reset_engine(hvl_engine *e)
{
    memset(e, 0, sizeof(*e));
    e->comm = e->local_comm = e->cross_comm = MPI_COMM_NULL;
    e->rank = e->size = e->local_rank = e->local_size = e->cross_rank = e->cross_size = -1;
    pthread_mutex_init(&e->queue_lock, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&e->wake_cond, &a);
    pthread_condattr_destroy(&a);
    hvl__params_load(&e->params);
    hvl__log_set(e->params.log_level, -1);
}

int hvl_init(void)
{
    pthread_mutex_lock(&life_lock);
    int rc = HVL_OK;
    if (__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) goto out;
    if (thread_started) {           /* stopped by a peer or a failure; collect the old thread */
        pthread_join(bg_thread, NULL);
        thread_started = 0;
    }
    if (__atomic_load_n(&mpi_finalized_here, __ATOMIC_ACQUIRE)) {
        rc = hvl__fail(HVL_ERR_SHUT_DOWN, "MPI was finalized by hvlite's shutdown(); it cannot be initialized again in this process");
        goto out;
    }
    reset_engine(&hvl__engine);
    startup_done = 0;
    __atomic_store_n(&stopped, 0, __ATOMIC_RELEASE);
    if (pthread_create(&bg_thread, NULL, bg_main, &hvl__engine) != 0) {
        rc = hvl__fail(HVL_ERR_SYSTEM, "cannot start the hvlite background thread");
        goto out;
    }
    thread_started = 1;
    while (!startup_done) pthread_cond_wait(&life_cond, &life_lock);
    rc = startup_status;
    if (rc != HVL_OK) {
        hvl__fail(rc, "hvlite init failed: %s", startup_message);
        pthread_join(bg_thread, NULL);
        thread_started = 0;
        goto out;
    }
out:
    pthread_mutex_unlock(&life_lock);
    return rc;
}

int hvl_shutdown(void)
{
    hvl_engine *e = &hvl__engine;
    pthread_mutex_lock(&life_lock);
    if (thread_started) {
        pthread_mutex_lock(&e->queue_lock);
        __atomic_store_n(&e->shutdown_requested, 1, __ATOMIC_RELEASE);
        pthread_cond_signal(&e->wake_cond);
        pthread_mutex_unlock(&e->queue_lock);
        pthread_join(bg_thread, NULL);
        thread_started = 0;
    }
    __atomic_store_n(&initialized, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&life_lock);
    return HVL_OK;
}

int hvl_is_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

int hvl__not_running(void)
{
    if (__atomic_load_n(&stopped, __ATOMIC_ACQUIRE))
        return hvl__fail(HVL_ERR_SHUT_DOWN, "%s", stop_message);
    return hvl__fail(HVL_ERR_NOT_INITIALIZED, "hvlite is not initialized: call hvlite.init() (or hvd.init()) "
                     "on every rank before any collective");
}

#define TOPOLOGY(fn, field) int fn(void) { return hvl_is_initialized() ? hvl__engine.field : -1; }
TOPOLOGY(hvl_rank, rank)
TOPOLOGY(hvl_size, size)
TOPOLOGY(hvl_local_rank, local_rank)
TOPOLOGY(hvl_local_size, local_size)
TOPOLOGY(hvl_cross_rank, cross_rank)
TOPOLOGY(hvl_cross_size, cross_size)
TOPOLOGY(hvl_mpi_threads_supported, thread_multiple)
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
