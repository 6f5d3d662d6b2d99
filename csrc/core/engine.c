/* engine.c: the engine's life and its cycle, on top of every other file (nothing calls up into
 * it). hvl_init starts the bg thread, which owns MPI: it initialises MPI (or reuses an existing
 * init, e.g. mpi4py's), builds the communicators (world.c) and then runs the cycle until every
 * rank agrees to stop or a fatal error occurs:
 *     wait for work (or the tick: every cycle while requests are pending, else every 20 ms)
 *     -> drain queue -> negotiate -> claim entries -> fuse -> execute -> repeat
 * Requests still pending when it stops fail with the reason. MPI is finalized by the bg thread
 * only if it initialised it, and only after a stop every rank agreed to (all are at the same
 * point, so MPI_Finalize waits on nobody but, in a world init made of part of MPI_COMM_WORLD,
 * the processes outside it, as MPI_Finalize does). Startup's exchanges are bounded by the peer
 * timeout (this rank's own until hvl__params_agree brings rank 0's): communicators come from
 * MPI_Comm_idup, hvl__comm_split and hvl__comm_create_group, settings, pids and verdicts from
 * nonblocking collectives under the progress wait. Only MPI_Init_thread is unbounded: it is MPI's own start-up through
 * the launcher, before there is anything to bound it with (a rank that dies there ends the job
 * through hvlrun). hvl_init/hvl_shutdown are serialised by life_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sched.h>
#include <sys/prctl.h>
#include "cycle.h"
#include "kernels.h"
#include "stage.h"
#include "timeline.h"
#include "autotune.h"

static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t life_cond = PTHREAD_COND_INITIALIZER;  /* bg -> hvl_init: startup done */
static pthread_t bg_thread;
static int thread_started;      /* life_lock */
static int startup_done;        /* life_lock */
static int startup_status;      /* life_lock */
static char startup_message[1024];
static int mpi_finalized_here;  /* atomic */
static int granted_multiple;    /* MPI granted MPI_THREAD_MULTIPLE: set by the bg thread, read after its join */

/* HVLITE_THREAD_AFFINITY "c0,c1,...": local rank i pins this (the bg) thread to core c_i, which
 * keeps the engine off the cores the framework computes on; threads it starts later (timeline
 * writer, NCCL's) inherit the core. A list that is not numbers or names fewer cores than the host
 * has ranks pins no rank (as Horovod), and a core the kernel refuses is said once. */
static long nth_number(const char *list, int n)    /* -1: the list is shorter; -2: not numbers */
{
    for (const char *p = list;; n--) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || (*end && *end != ',')) return -2;
        if (n == 0) return v;
        if (!*end) return -1;
        p = end + 1;
    }
}

static void pin_thread(hvl_engine *e)
{
    const char *list = e->params.thread_affinity;
    if (!list[0]) return;
    long core = -1;
    for (int i = 0; i < e->local_size; i++) {
        long c = nth_number(list, i);
        if (c < 0) {
            hvl__log_once("thread affinity list", HVL_LOG_WARNING, "HVLITE_THREAD_AFFINITY=%s %s; the engine "
                          "threads are not pinned", list, c == -2 ? "is not a list of core numbers"
                          : e->local_size == 1 ? "names no core" : "names fewer cores than this host has ranks");
            return;
        }
        if (i == e->local_rank) core = c;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    int err = core < CPU_SETSIZE ? pthread_getaffinity_np(pthread_self(), sizeof(e->cpus_before), &e->cpus_before)
                                 : EINVAL;
    if (!err) {
        CPU_SET((int)core, &set);
        err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    e->pinned = !err;
    e->cpus_pinned = set;
    if (err)
        hvl__log_once("thread affinity core", HVL_LOG_WARNING, "HVLITE_THREAD_AFFINITY: cannot pin the engine "
                      "thread of local rank %d to core %ld: %s", e->local_rank, core, strerror(err));
    else
        hvl__log(HVL_LOG_INFO, "engine thread of local rank %d pinned to core %ld", e->local_rank, core);
}

static int startup(hvl_engine *e)
{
    int rc = hvl__world_make(e);
    granted_multiple = e->thread_multiple;
    HVL_CHECK(rc);
    hvl__log_set(e->params.log_level, e->rank, !e->params.log_hide_time);
    hvl__params_warn();
    HVL_CHECK(hvl__params_agree(&e->params, e->comm, hvl__peer_bound(e)));
    HVL_CHECK(hvl__world_split_fake_hosts(e));
    HVL_CHECK(hvl__peers_learn(e));
    pin_thread(e);
    if (e->rank == 0) hvl__params_log(&e->params);
    if (e->rank == 0)
        hvl__log(HVL_LOG_INFO, "hvlite starting: %d ranks on %d hosts, %s, MPI_THREAD_MULTIPLE %s", e->size,
                 e->cross_size, hvl_mpi_vendor(), e->thread_multiple ? "granted" : "not granted");
    HVL_CHECK(hvl__reduce_setup());
    HVL_CHECK(hvl__psets_create(e));
    HVL_CHECK(hvl__negotiation_create(e, &e->negotiation));
    HVL_CHECK(hvl__autotune_start(e));
    return hvl__timeline_startup(e);
}

/* Frees what startup made. Collective parts (communicators, finalize) only after a clean,
 * agreed stop: after a fatal error the other ranks may never arrive. MPI_Finalize also waits
 * for every process of MPI_COMM_WORLD, so `finalize` is 0 after an init of a part of it failed:
 * the other parts may run on for long, and the caller may try init again. */
static void teardown(hvl_engine *e, int clean, int finalize)
{
    hvl__timeline_close();          /* writes what is left; the file ends valid either way */
    hvl__negotiation_destroy(e->negotiation);
    hvl__peers_forget();
    hvl__autotune_stop(e);
    hvl__psets_destroy(e, clean);
    free(e->fusion_buf);
    free(e->scratch_buf);
    free(e->in_flight);             /* empty: bg_main finished or failed every batch in it */
    e->in_flight = NULL;
    e->nin_flight = e->in_flight_cap = 0;
    hvl__stage_free(e);             /* pinned memory and CUDA streams, if CUDA was ever used */
    hvl_buffer_cache_trim();        /* idle result buffers; those still held are freed later */
    e->negotiation = NULL;
    e->fusion_buf = e->scratch_buf = NULL;
    e->fusion_cap = e->scratch_cap = 0;
    if (!clean) return;
    hvl__reduce_teardown();
    if (e->cross_comm != MPI_COMM_NULL) MPI_Comm_free(&e->cross_comm);
    if (e->local_comm != MPI_COMM_NULL) MPI_Comm_free(&e->local_comm);
    if (e->comm != MPI_COMM_NULL) MPI_Comm_free(&e->comm);
    if (e->mpi_initialized_here && finalize) {
        MPI_Finalize();
        __atomic_store_n(&mpi_finalized_here, 1, __ATOMIC_RELEASE);  /* life_lock is held by the joiner */
    }
}

/* Sleeps until a request a drain would take arrives (a burst's, at its end) or shutdown is asked
 * (1), or until `deadline` (0). */
static int sleep_until(hvl_engine *e, double deadline)
{
    int woken = 0;
    pthread_mutex_lock(&e->queue_lock);
    while (!(woken = __atomic_load_n(&e->shutdown_requested, __ATOMIC_ACQUIRE))) {
        double now = hvl__now(), until = deadline;
        if ((woken = hvl__queue_has_work(e, now, &until))) break;
        double left = until - now;
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_nsec * 1e-9 + left;
        ts.tv_sec += (time_t)t;
        ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
        pthread_cond_timedwait(&e->wake_cond, &e->queue_lock, &ts);
    }
    pthread_mutex_unlock(&e->queue_lock);
    return woken;
}

/* While device batches run on the GPU (HVLITE_NCCL_OVERLAP), the wait looks at them this often:
 * their handles complete when they are seen to end. */
#define IN_FLIGHT_LOOK_S 50e-6

/* While CUDA tensors are held for the GPU (ready.c), the wait looks whether the GPU has written
 * all of them, first after this long, then twice as long each time up to a quarter of the wait:
 * once it has, the cycle starts without waiting out the cycle time. (Something is held during
 * most of a backward pass: the looks back off so as not to vie with the framework's launches.) */
#define HELD_LOOK_S 100e-6

/* Waits for work (sleep_until) up to `deadline`, finishing the device batches that end
 * meanwhile; non-OK if one failed (fatal). Returns early once every held tensor is written,
 * unless device batches run (HVLITE_NCCL_OVERLAP): a cycle started early waits in negotiation
 * for the peers' cycles, and this rank's batches would be finished only after it. */
static int wait_for_work(hvl_engine *e, double deadline)
{
    double held_look = HELD_LOOK_S, held_look_max = (deadline - hvl__now()) / 4;
    if (held_look_max < HELD_LOOK_S) held_look_max = HELD_LOOK_S;
    for (;;) {
        HVL_CHECK(hvl__execute_settle(e, HVL_SETTLE_LOOK));
        double until = deadline, now = hvl__now();
        int look_held = e->held_for_gpu && !e->nin_flight;
        if (e->nin_flight && now + IN_FLIGHT_LOOK_S < until) until = now + IN_FLIGHT_LOOK_S;
        if (look_held && now + held_look < until) until = now + held_look;
        if (sleep_until(e, until) || hvl__now() >= deadline) return HVL_OK;
        if (look_held && hvl__now() >= until) {
            if (hvl__ready_all_written(e)) return HVL_OK;
            held_look = held_look * 2 < held_look_max ? held_look * 2 : held_look_max;
        }
    }
}

/* A rank with nothing pending has nothing to agree on: it sleeps until a request arrives (a
 * wake-up is immediate), ticking only this often so that a peer's shutdown and rank 0's stall
 * inspector still get their rounds. Ticking every cycle while idle cost a training step
 * measurably (bench/README.md, "Measurements behind the engine's constants"). */
#define IDLE_TICK_S 0.02

/* The agreed responses meet this rank's entries, are fused into batches, and run. */
static int run_agreed(hvl_engine *e, const hvl_response_list *agreed)
{
    int n = 0, rc = HVL_OK;
    size_t room = (size_t)(agreed->count ? agreed->count : 1);
    const hvl_response **resps = malloc(sizeof(*resps) * room);
    hvl_entry **entries = malloc(sizeof(*entries) * room);
    hvl_batch_list batches = {0};
    if (!resps || !entries) { rc = hvl__oom("this cycle's responses"); goto out; }
    HVL_CHECK_GOTO(hvl__queue_claim(e, agreed, resps, entries, &n), rc, out);
    HVL_CHECK_GOTO(hvl__fuse(e, resps, entries, n, &batches), rc, out);
    rc = hvl__execute(e, &batches);
out:
    if (agreed->count) hvl__handles_notify();
    hvl__batches_free(&batches);
    free(resps);
    free(entries);
    return rc;
}

/* One cycle: take new requests, hold those the GPU has not written yet, agree on what runs,
 * run it; then autotune's sample. */
static int run_cycle(hvl_engine *e, hvl_response_list *agreed)
{
    double woke = hvl__now();
    int tl = hvl__tl_active();     /* timeline (rank 0): cycle spans */
    if (tl) hvl__tl_cycle_begin();
    HVL_CHECK(hvl__queue_drain(e));
    hvl__ready_hold(e);
    HVL_CHECK(hvl__negotiate(e, agreed));
    if (tl) hvl__tl_negotiated();
    HVL_CHECK(run_agreed(e, agreed));
    hvl__autotune_cycle(e, agreed, woke);
    if (tl) hvl__tl_cycle_end(agreed->count);
    return HVL_OK;
}

static int run_cycles(hvl_engine *e)
{
    hvl_response_list agreed = {0};
    int rc = HVL_OK;
    while (rc == HVL_OK) {
        double cycle_s = e->params.cycle_time_ms * 1e-3;   /* autotune may change it */
        rc = wait_for_work(e, hvl__now() + (e->pending_head ? cycle_s : IDLE_TICK_S));
        if (rc == HVL_OK) rc = run_cycle(e, &agreed);
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

/* The message of the error that ended the cycle. Every error sets its message where it
 * happens (util.h), so the last error of this thread belongs to rc; if it does not, say so
 * rather than report an older, unrelated message. */
static void stop_reason(int rc, char *out, size_t n)
{
    if (hvl__last_status() == rc && hvl_last_error()[0])
        snprintf(out, n, "%s", hvl_last_error());
    else
        snprintf(out, n, "the engine stopped with status '%s' and no message (an hvlite bug: please "
                 "report it)", hvl__status_name(rc));
}

static void *bg_main(void *arg)
{
    hvl_engine *e = arg;
    /* Short sleeps in hvl__mpi_wait must be short: the default 50 us timer slack would make
     * every 5 us nap a 55 us one, on the latency path of every small collective. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    pthread_setname_np(pthread_self(), "hvlite-engine");   /* in top -H, gdb, /proc/PID/task */
    int rc = hvl__peers_explain(e, startup(e));   /* a timeout names the silent ranks it can see */
    if (rc == HVL_OK) {
        pthread_mutex_lock(&e->queue_lock);
        e->running = 1;
        pthread_mutex_unlock(&e->queue_lock);
        hvl__mark_running();       /* before init returns */
    }
    report_startup(rc);
    /* An init that failed alike on every rank ends as cleanly as a shutdown: MPI_Finalize
     * removes MPI's /dev/shm files, which a process exiting without it leaves behind. */
    if (rc != HVL_OK) { teardown(e, e->failed_everywhere, e->whole_world); return NULL; }
    rc = hvl__peers_explain(e, run_cycles(e));   /* a timeout names the silent ranks it can see */
    char message[1024];
    stop_reason(rc, message, sizeof(message));
    if (rc != HVL_ERR_SHUT_DOWN) {
        __atomic_store_n(&e->fatal, rc, __ATOMIC_RELEASE);
        hvl__log(HVL_LOG_ERROR, "engine stopped: %s", message);
    }
    hvl__mark_stopped(message);    /* before the callers hear why (a peer's shutdown stops us too) */
    /* Device batches still on the GPU: an agreed stop lets them end (every rank queued them);
     * any other stop aborts and fails them at once, as the peers may never run their part. */
    int clean = rc == HVL_ERR_SHUT_DOWN && e->stop_agreed;   /* not after a wait gave up on shutdown */
    if (clean && hvl__execute_settle(e, HVL_SETTLE_STOPPING) != HVL_OK) {
        clean = 0;                  /* a peer may be gone: MPI_Finalize could wait on it */
        rc = hvl__last_status();
        stop_reason(rc, message, sizeof(message));
    }
    hvl__execute_abandon(e, rc, message);
    hvl__queue_fail_all(e, rc, message);
    teardown(e, clean, 1);
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
    hvl__log_set(e->params.log_level, -1, !e->params.log_hide_time);
}

int hvl_init(void) { return hvl_init_on(NULL, 0, NULL, 0); }

int hvl_init_on(const void *mpi_comm, size_t comm_bytes, const int *ranks, int nranks)
{
    pthread_mutex_lock(&life_lock);
    int rc = HVL_OK;
    if (hvl_is_initialized()) goto out;
    if (thread_started) {           /* stopped by a peer or a failure; collect the old thread */
        pthread_join(bg_thread, NULL);
        thread_started = 0;
    }
    if (hvl__comm_split_stranded() && !granted_multiple) {
        rc = hvl__fail(HVL_ERR_SHUT_DOWN, "a communicator split of the engine that stopped is still inside MPI, "
                       "and MPI granted less than MPI_THREAD_MULTIPLE (HVLITE_MPI_THREADS_DISABLE): a new engine "
                       "thread may not enter MPI beside it; restart the process");
        goto out;
    }
    if (__atomic_load_n(&mpi_finalized_here, __ATOMIC_ACQUIRE)) {
        rc = hvl__fail(HVL_ERR_SHUT_DOWN, "MPI was finalized by hvlite (by shutdown(), or by an init that failed on every rank); "
                       "it cannot be initialized again in this process");
        goto out;
    }
    if ((rc = hvl__world_ask(mpi_comm, comm_bytes, ranks, nranks)) != HVL_OK) goto out;
    hvl__forget_topology();         /* before the fields it guards are reset */
    reset_engine(&hvl__engine);
    startup_done = 0;
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
    hvl__forget_topology();
    pthread_mutex_unlock(&life_lock);
    return HVL_OK;
}
