/* timeline.c: the timeline's life and its recording side. hvl_timeline_start/stop (any thread)
 * open and close the trace file on rank 0 and start and join the writer thread
 * (timeline_json.c); on other ranks they do nothing: rank 0 sees every rank's arrivals, and
 * writes the one file. While a timeline is open the bg thread's hooks (hvl__tl_*) append small
 * binary records to tl.records under tl.lock; nothing is formatted or written on the bg thread.
 * The writer takes the whole buffer at once (a pointer swap), at least every HVL_TL_FLUSH_S,
 * sooner once HVL_TL_FLUSH_BYTES are waiting. Past MAX_PENDING_BYTES records are dropped and
 * counted (the file marks it), so a slow disk never grows memory without bound or stalls the
 * engine. The hooks cost a lock and a few stores each; the cycle is never made to wait.
 * Locks: life_lock (start/stop, serialised) before tl.lock; neither is taken while holding
 * queue_lock or handle_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "timeline_writer.h"

#define MAX_PENDING_BYTES ((size_t)64 << 20)

int hvl__tl_on;
static hvl_timeline tl = {.lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1};
static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t writer;
static int writer_running;      /* life_lock */

/* ---- recording (bg thread) ---- */

/* bg only: this cycle's start, end of negotiation and batches so far; the pieces of the batch
 * running now. */
static double cycle_t0, cycle_negotiated;
static int cycle_batches, cycle_tensors;
static int64_t cycle_bytes;
static hvl_tl_piece *pieces;
static int npieces, pieces_cap;
static int device_phases;          /* the pieces are one device batch's phases */

static void put_i32(int32_t v) { hvl__buf_put(&tl.records, &v, sizeof(v)); }
static void put_i64(int64_t v) { hvl__buf_put(&tl.records, &v, sizeof(v)); }
static void put_f64(double v) { hvl__buf_put(&tl.records, &v, sizeof(v)); }
static void put_str(const char *s)
{
    int32_t n = s ? (int32_t)strlen(s) : 0;
    put_i32(n);
    hvl__buf_put(&tl.records, s ? s : "", (size_t)n + 1);
}

/* Takes tl.lock if a record may be added now (open, writer keeping up); else counts the drop. */
static int record_begin(int kind)
{
    pthread_mutex_lock(&tl.lock);
    if (tl.open && !tl.stop && tl.records.len < MAX_PENDING_BYTES && !tl.records.bad) {
        put_i32(kind);
        return 1;
    }
    if (tl.open && !tl.stop) tl.dropped++;   /* once stop is asked, late hooks are not news */
    pthread_mutex_unlock(&tl.lock);
    return 0;
}

static void record_end(void)
{
    if (tl.records.len >= HVL_TL_FLUSH_BYTES) pthread_cond_signal(&tl.wake);
    pthread_mutex_unlock(&tl.lock);
}

void hvl__tl_submitted(const hvl_entry *en)
{
    if (!record_begin(HVL_TL_SUBMIT)) return;
    put_f64(en->enqueued_at);
    put_i32(en->d.op);
    put_str(en->d.name);
    record_end();
}

void hvl__tl_arrived(const char *name, int op, int rank)
{
    /* Rounds are numbered by the coordinator rounds finished before this one. */
    int64_t round = __atomic_load_n(&hvl__engine.counters.full_rounds, __ATOMIC_RELAXED);
    if (!record_begin(HVL_TL_ARRIVE)) return;
    put_f64(hvl__now());
    put_i32(op);
    put_i32(rank);
    put_i64(round);
    put_str(name);
    record_end();
}

void hvl__tl_agreed(const char *name, int status, const char *error, int cache_hit)
{
    if (!record_begin(HVL_TL_AGREED)) return;
    put_f64(hvl__now());
    put_i32(status);
    put_i32(cache_hit);
    put_str(name);
    put_str(status == HVL_OK ? "" : error ? error : hvl__status_name(status));
    record_end();
}

void hvl__tl_note(const char *name, const char *what, const char *detail)
{
    if (!record_begin(HVL_TL_NOTE)) return;
    put_f64(hvl__now());
    put_str(name);
    put_str(what);
    put_str(detail);
    record_end();
}

void hvl__tl_cycle_begin(void)
{
    cycle_t0 = cycle_negotiated = hvl__now();
    cycle_batches = cycle_tensors = 0;
    cycle_bytes = 0;
}

void hvl__tl_negotiated(void) { cycle_negotiated = hvl__now(); }

void hvl__tl_cycle_end(int agreed)
{
    if (agreed == 0 && !__atomic_load_n(&tl.mark_cycles, __ATOMIC_RELAXED)) return;
    if (!record_begin(HVL_TL_CYCLE)) return;
    put_f64(cycle_t0);
    put_f64(cycle_negotiated);
    put_f64(hvl__now());
    put_i32(agreed);
    put_i32(cycle_batches);
    put_i32(cycle_tensors);
    put_i64(cycle_bytes);
    record_end();
}

void hvl__tl_piece(double t_in, double t_reduce, double t_out, int64_t bytes)
{
    if (npieces == pieces_cap) {
        int cap = pieces_cap ? pieces_cap * 2 : 64;
        hvl_tl_piece *p = realloc(pieces, sizeof(hvl_tl_piece) * (size_t)cap);
        if (!p) return;            /* the batch is recorded with fewer pieces */
        pieces = p;
        pieces_cap = cap;
    }
    pieces[npieces++] = (hvl_tl_piece){t_in, t_reduce, t_out, hvl__now(), bytes};
}

void hvl__tl_device_phases(double t_start, const double *phases)
{
    double t = t_start, now = hvl__now(), at[4];
    for (int i = 0; i < 4; i++) {              /* in order, inside [t_start, now]; 0: no time */
        if (phases[i] > t) t = phases[i];
        at[i] = t < now ? t : now;
    }
    npieces = 0;
    hvl__tl_piece(at[0], at[1], at[2], 0);
    if (npieces == 1) pieces[0].t_done = at[3];
    device_phases = npieces == 1;
}

static int64_t entry_bytes(const hvl_batch *b, const hvl_entry *en)
{
    return hvl__shape_elems(en->d.ndim, en->d.shape) * hvl_dtype_size(b->dtype);
}

void hvl__tl_batch(const hvl_batch *b, double t_start, int rc)
{
    int first = 0;                 /* pieces stamped before t_start belong to an older batch */
    while (first < npieces && pieces[first].t_in < t_start) first++;
    int n = npieces - first;
    double t_end = hvl__now();
    if (!b->left_running) {        /* one left running ends in another cycle, or between two */
        cycle_batches++;
        cycle_tensors += b->count;
        for (int i = 0; i < b->count; i++) cycle_bytes += entry_bytes(b, b->entries[i]);
    }
    if (record_begin(HVL_TL_BATCH)) {
        put_f64(t_start);
        put_f64(t_end);
        put_i32(b->op);
        put_i32(b->dtype);
        put_i32(rc);
        put_i32(b->count);
        put_i32(b->prescale != 1.0);
        put_i32(b->reduce_op == HVL_AVERAGE || b->postscale != 1.0);
        put_i32(device_phases);
        put_i32(b->left_running);
        put_i32(n);
        put_str(b->backend);
        put_str(rc == HVL_OK ? "" : hvl_last_error());
        hvl__buf_put(&tl.records, pieces + first, sizeof(hvl_tl_piece) * (size_t)n);
        for (int i = 0; i < b->count; i++) {
            put_i64(entry_bytes(b, b->entries[i]));
            put_str(b->entries[i]->d.name);
        }
        record_end();
    }
    npieces = 0;
    device_phases = 0;
}

/* ---- life (any thread, under life_lock) ---- */

static void close_locked(void)
{
    if (!writer_running) return;
    __atomic_store_n(&hvl__tl_on, 0, __ATOMIC_RELAXED);
    pthread_mutex_lock(&tl.lock);
    tl.stop = 1;
    pthread_cond_signal(&tl.wake);
    pthread_mutex_unlock(&tl.lock);
    pthread_join(writer, NULL);
    writer_running = 0;
    pthread_mutex_lock(&tl.lock);
    tl.open = 0;
    hvl__buf_free(&tl.records);
    pthread_mutex_unlock(&tl.lock);
    close(tl.fd);
    tl.fd = -1;
    hvl__log(HVL_LOG_INFO, "timeline: closed %s (%lld events)", tl.path, (long long)tl.events);
    free(tl.path);
    tl.path = NULL;
}

static void make_cond(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&tl.wake, &a);
    pthread_condattr_destroy(&a);
}

static int open_locked(const char *path, int mark_cycles, int size)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_cond);
    close_locked();                 /* a new start replaces the open timeline */
    tl.path = strdup(path);
    if (!tl.path) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory starting the timeline");
    __atomic_store_n(&tl.mark_cycles, mark_cycles, __ATOMIC_RELAXED);   /* read by bg unlocked */
    tl.size = size;
    tl.events = 0;
    tl.epoch = hvl__now();
    int rc = hvl__tl_file_open(&tl);
    if (rc == HVL_OK) {
        pthread_mutex_lock(&tl.lock);
        tl.open = 1;
        tl.stop = 0;
        tl.dropped = 0;
        pthread_mutex_unlock(&tl.lock);
        if (pthread_create(&writer, NULL, hvl__tl_writer_main, &tl) != 0) {
            rc = hvl__fail(HVL_ERR_SYSTEM, "timeline: cannot start the writer thread");
            tl.open = 0;
        }
    }
    if (rc != HVL_OK) {
        if (tl.fd >= 0) close(tl.fd);
        tl.fd = -1;
        free(tl.path);
        tl.path = NULL;
        return rc;
    }
    writer_running = 1;
    npieces = 0;
    __atomic_store_n(&hvl__tl_on, 1, __ATOMIC_RELAXED);
    hvl__log(HVL_LOG_INFO, "timeline: recording to %s%s", path, mark_cycles ? " (cycles marked)" : "");
    return HVL_OK;
}

int hvl_timeline_start(const char *path, int mark_cycles)
{
    if (!path || !path[0]) return hvl__fail(HVL_ERR_INVALID_ARG, "timeline: a file path is required");
    if (strlen(path) >= HVL_PATH_MAX)
        return hvl__fail(HVL_ERR_INVALID_ARG, "timeline: the path is longer than %d bytes", HVL_PATH_MAX - 1);
    pthread_mutex_lock(&life_lock);
    int rc = HVL_OK;
    if (!hvl_is_initialized()) rc = hvl__not_running();
    else if (hvl__engine.rank == 0) rc = open_locked(path, mark_cycles != 0, hvl__engine.size);
    pthread_mutex_unlock(&life_lock);
    return rc;
}

int hvl_timeline_stop(void)
{
    pthread_mutex_lock(&life_lock);
    close_locked();
    pthread_mutex_unlock(&life_lock);
    return HVL_OK;
}

void hvl__timeline_close(void) { hvl_timeline_stop(); }

/* Horovod's HOROVOD_TIMELINE=DYNAMIC: no timeline at init; the program starts one later with
 * start_timeline() (which hvlite allows either way). */
#define TIMELINE_DYNAMIC "DYNAMIC"

int hvl__timeline_startup(hvl_engine *e)
{
    struct { int32_t rc; char message[1020]; } verdict = {HVL_OK, ""};
    if (e->rank == 0 && e->params.timeline_path[0] && strcmp(e->params.timeline_path, TIMELINE_DYNAMIC) != 0) {
        pthread_mutex_lock(&life_lock);
        verdict.rc = open_locked(e->params.timeline_path, e->params.timeline_mark_cycles != 0, e->size);
        pthread_mutex_unlock(&life_lock);
        if (verdict.rc != HVL_OK)
            snprintf(verdict.message, sizeof(verdict.message), "HVLITE_TIMELINE on rank 0: %s", hvl_last_error());
    }
    HVL_CHECK(hvl__bcast_bytes(e->comm, &verdict, (int)sizeof(verdict), 0, hvl__peer_bound(e),
                               "MPI_Ibcast (timeline verdict)"));
    if (verdict.rc != HVL_OK) {
        e->failed_everywhere = 1;
        return hvl__fail(verdict.rc, "%s", verdict.message);
    }
    return HVL_OK;
}
