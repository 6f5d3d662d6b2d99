/* timeline_json.c: the timeline writer thread (rank 0). It takes the records the bg thread left
 * in tl->records (timeline.c), turns them into Chrome trace events and appends them to the file
 * through timeline_file.c, which keeps it valid JSON at every moment. Shutdown and
 * hvl_timeline_stop write what is left and end the file before it closes.
 *
 * Layout (pid 0 = rank 0's view of the job): tid 0 is the cycle track: one CYCLE span per
 * cycle that agreed something, holding its NEGOTIATION span and one span per batch (op, tensors
 * fused, bytes); with mark_cycles, a CYCLE_START mark for every cycle. Each tensor name gets its
 * own tid (in order of first appearance), with, per instance:
 *   NEGOTIATE_<OP> (B..E): from the earliest of rank 0's submission and the first rank's
 *     request reaching the coordinator, to agreement. One "rank r" mark per arrival; E's args
 *     name the late ranks (those whose request came in the last coordinator round, when some
 *     came earlier), or say cache_hit: then ranks agreed by the bit-vector AND, and rank 0
 *     knows only its own submission time. An error response ends it with args.error.
 *   QUEUE (X): agreement to the start of its batch.
 *   <OP> (X): the batch's whole run (the handle completes at its end), args: bytes, batch size,
 *     backend. Allreduces run in pieces (execute.c), copy-in, reduce and copy-out interleaved
 *     per piece, so each piece that holds part of this tensor is drawn where it ran:
 *     MEMCPY_IN_FUSION_BUFFER, <BACKEND>_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER (a tensor alone is
 *     reduced in its own buffer: SCALE_INPUT / SCALE_OUTPUT when there is scaling to do).
 *     A batch a device plane (NCCL) ran, timed on the GPU where the driver can: WAIT_FOR_INPUTS
 *     (the GPU waiting on the events the framework recorded at submit, and on the batches queued
 *     before it; from the batch's start, as the host cannot see earlier),
 *     MEMCPY_IN_FUSION_BUFFER (fused batches), <BACKEND>_<OP> (the collective),
 *     MEMCPY_OUT_FUSION_BUFFER; each drawn where it took time. Other ops: one <BACKEND>_<OP> span (their copies included), as for
 *     an allreduce that records no pieces (the shm plane streams it chunk by chunk). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include "kernels.h"
#include "timeline_writer.h"

typedef struct {
    int tid;
    int negotiating;            /* a NEGOTIATE begin is written, its end is not */
    double agreed_at;           /* last agreement not yet followed by its batch; 0 = none */
    int64_t first_round, last_round;
    int arrivals;
    char *late;                 /* "1,2": the ranks that arrived in last_round (owned) */
    size_t late_len, late_cap;
    char name[];
} track_t;

typedef struct {
    hvl_timeline *tl;
    hvl_strmap tracks;          /* name -> track_t (the key is track->name) */
    int ntracks;
    int gpu_tid;                /* the track of batches left running on the GPU; 0 until one */
    double gpu_end;             /* where the last of them ended */
    hvl_buf out;                /* JSON of one write */
    int failed;
} writer_t;

/* Nanoseconds since the timeline started (0 for a request submitted before it started). */
static int64_t ns(const writer_t *w, double t)
{
    double v = (t - w->tl->epoch) * 1e9;
    return v > 0 ? (int64_t)(v + 0.5) : 0;
}

/* Opens one event; the caller adds fields (",\"dur\":...", ",\"args\":{...}") and the "}". */
static void ev(writer_t *w, char ph, int tid, double t, const char *name)
{
    char head[] = ",\n{\"ph\":\"?\",\"pid\":0,\"tid\":";
    head[9] = ph;
    hvl__json_raw(&w->out, head, sizeof(head) - 1);
    hvl__json_int(&w->out, tid);
    HVL_JSON_LIT(&w->out, ",\"ts\":");
    hvl__json_us(&w->out, ns(w, t));
    HVL_JSON_LIT(&w->out, ",\"name\":");
    hvl__json_str(&w->out, name);
    w->tl->events++;
}

static void ev_span(writer_t *w, int tid, double t0, double t1, const char *name)
{
    ev(w, 'X', tid, t0, name);
    HVL_JSON_LIT(&w->out, ",\"dur\":");
    hvl__json_us(&w->out, t1 > t0 ? ns(w, t1) - ns(w, t0) : 0);
}

static void upper(char *dst, size_t n, const char *a, const char *b)
{
    snprintf(dst, n, "%s%s%s", a, b[0] && a[0] ? "_" : "", b);
    for (char *p = dst; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
}

/* ---- tracks ---- */

static void name_track(writer_t *w, int tid, const char *name)
{
    hvl__buf_printf(&w->out, ",\n{\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"name\":\"thread_name\","
                     "\"args\":{\"name\":", tid);
    hvl__json_str(&w->out, name);
    hvl__buf_printf(&w->out, "}},\n{\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"name\":\"thread_sort_index\","
                     "\"args\":{\"sort_index\":%d}}", tid, tid);
    w->tl->events += 2;
}

static track_t *track(writer_t *w, const char *name)
{
    track_t *t = hvl__strmap_get(&w->tracks, name);
    if (t) return t;
    size_t len = strlen(name);
    t = calloc(1, sizeof(track_t) + len + 1);
    if (!t) { w->failed = HVL_ERR_NO_MEMORY; return NULL; }
    memcpy(t->name, name, len + 1);
    t->tid = ++w->ntracks;
    if (hvl__strmap_put(&w->tracks, t->name, t) != HVL_OK) {
        free(t);
        w->failed = HVL_ERR_NO_MEMORY;
        return NULL;
    }
    name_track(w, t->tid, name);
    return t;
}

static void negotiation_begin(writer_t *w, track_t *t, double at, int op)
{
    if (t->negotiating) return;
    char name[64];
    upper(name, sizeof(name), "negotiate", hvl__op_name(op));
    ev(w, 'B', t->tid, at, name);
    HVL_JSON_LIT(&w->out, "}");
    t->negotiating = 1;
    t->arrivals = 0;
}

/* ---- records ---- */

typedef struct { const char *p, *end; int bad; } cursor_t;

static void get(cursor_t *c, void *dst, size_t n)
{
    if (c->bad || (size_t)(c->end - c->p) < n) { c->bad = 1; memset(dst, 0, n); return; }
    memcpy(dst, c->p, n);
    c->p += n;
}
static int32_t get_i32(cursor_t *c) { int32_t v; get(c, &v, sizeof(v)); return v; }
static int64_t get_i64(cursor_t *c) { int64_t v; get(c, &v, sizeof(v)); return v; }
static double get_f64(cursor_t *c) { double v; get(c, &v, sizeof(v)); return v; }
static const char *get_str(cursor_t *c)
{
    int32_t n = get_i32(c);
    if (c->bad || n < 0 || c->end - c->p < (ptrdiff_t)n + 1) { c->bad = 1; return ""; }
    const char *s = c->p;
    c->p += n + 1;
    return s;
}

/* Adds ",rank" (or "rank") to the track's list of ranks seen in its last round. */
static void late_add(writer_t *w, track_t *t, int rank)
{
    if (t->late_cap - t->late_len < 16) {
        size_t cap = t->late_cap ? t->late_cap * 2 : 64;
        char *p = realloc(t->late, cap);
        if (!p) { w->failed = HVL_ERR_NO_MEMORY; return; }
        t->late = p;
        t->late_cap = cap;
    }
    t->late_len += (size_t)snprintf(t->late + t->late_len, 16, "%s%d", t->late_len ? "," : "", rank);
}

static void on_submit(writer_t *w, cursor_t *c)
{
    double t = get_f64(c);
    int op = get_i32(c);
    track_t *tr = track(w, get_str(c));
    if (tr && !c->bad) negotiation_begin(w, tr, t, op);
}

static void on_arrive(writer_t *w, cursor_t *c)
{
    double t = get_f64(c);
    int op = get_i32(c), rank = get_i32(c);
    int64_t round = get_i64(c);
    track_t *tr = track(w, get_str(c));
    if (!tr || c->bad) return;
    negotiation_begin(w, tr, t, op);
    if (tr->arrivals++ == 0) tr->first_round = tr->last_round = round, tr->late_len = 0;
    if (round != tr->last_round) tr->last_round = round, tr->late_len = 0;
    late_add(w, tr, rank);
    char mark[32];
    snprintf(mark, sizeof(mark), "rank %d", rank);
    ev(w, 'i', tr->tid, t, mark);
    HVL_JSON_LIT(&w->out, ",\"s\":\"t\"}");
}

static void on_agreed(writer_t *w, cursor_t *c)
{
    double t = get_f64(c);
    int status = get_i32(c), cache_hit = get_i32(c);
    track_t *tr = track(w, get_str(c));
    const char *error = get_str(c);
    if (!tr || c->bad) return;
    tr->agreed_at = status == HVL_OK ? t : 0;
    if (!tr->negotiating && status == HVL_OK) return;   /* began before the timeline did */
    ev(w, tr->negotiating ? 'E' : 'i', tr->tid, t, tr->negotiating ? "" : "ERROR");
    if (!tr->negotiating) HVL_JSON_LIT(&w->out, ",\"s\":\"t\"");
    if (cache_hit) HVL_JSON_LIT(&w->out, ",\"args\":{\"cache_hit\":true");
    else HVL_JSON_LIT(&w->out, ",\"args\":{\"cache_hit\":false");
    if (!cache_hit && tr->arrivals) {
        int late = tr->first_round != tr->last_round;
        hvl__buf_printf(&w->out, ",\"late_ranks\":\"%.*s\",\"rounds\":%lld", late ? (int)tr->late_len : 0,
                         late ? tr->late : "", (long long)(tr->last_round - tr->first_round + 1));
    }
    if (status != HVL_OK) {
        hvl__buf_printf(&w->out, ",\"error\":");
        hvl__json_str(&w->out, error);
    }
    HVL_JSON_LIT(&w->out, "}}");
    tr->negotiating = 0;
    tr->arrivals = 0;
}

static void on_note(writer_t *w, cursor_t *c)
{
    double t = get_f64(c);
    track_t *tr = track(w, get_str(c));
    const char *what = get_str(c), *detail = get_str(c);
    if (!tr || c->bad) return;
    ev(w, 'i', tr->tid, t, what);
    hvl__buf_printf(&w->out, ",\"s\":\"t\",\"args\":{\"detail\":");
    hvl__json_str(&w->out, detail);
    HVL_JSON_LIT(&w->out, "}}");
}

typedef struct {
    double t0, t1;
    int op, dtype, status, count, scale_in, scale_out, npieces;
    int device;                 /* one piece: a device plane's phases (wait for inputs, collective) */
    int left_running;           /* it ran on the GPU past its cycle (HVLITE_NCCL_OVERLAP) */
    const char *backend, *error;
    const char *pieces;         /* npieces x hvl_tl_piece, unaligned */
    int64_t bytes;              /* sum of the entries' */
} batch_t;

static hvl_tl_piece piece_at(const batch_t *b, int j)
{
    hvl_tl_piece p;
    memcpy(&p, b->pieces + (size_t)j * sizeof(p), sizeof(p));
    return p;
}

/* The spans of one piece (this tensor's data was in it), inside the tensor's op span. */
static void piece_spans(writer_t *w, const batch_t *b, int tid, int j, const char *collective)
{
    hvl_tl_piece p = piece_at(b, j);
    int fused = b->count > 1;
    if (fused || b->scale_in) {
        ev_span(w, tid, p.t_in, p.t_reduce, fused ? "MEMCPY_IN_FUSION_BUFFER" : "SCALE_INPUT");
        HVL_JSON_LIT(&w->out, "}");
    }
    ev_span(w, tid, p.t_reduce, p.t_out, collective);
    HVL_JSON_LIT(&w->out, ",\"args\":{\"piece\":");
    hvl__json_int(&w->out, j);
    HVL_JSON_LIT(&w->out, ",\"pieces\":");
    hvl__json_int(&w->out, b->npieces);
    HVL_JSON_LIT(&w->out, ",\"bytes\":");
    hvl__json_int(&w->out, p.bytes);
    HVL_JSON_LIT(&w->out, "}}");
    if (fused || b->scale_out) {
        ev_span(w, tid, p.t_out, p.t_done, fused ? "MEMCPY_OUT_FUSION_BUFFER" : "SCALE_OUTPUT");
        HVL_JSON_LIT(&w->out, "}");
    }
}

/* One tensor of a batch; its bytes are [offset, offset + bytes) of the fused layout, and *piece,
 * *piece_start the first piece that may hold them (advanced as entries go by). */
static void batch_entry(writer_t *w, const batch_t *b, const char *name, int64_t offset, int64_t bytes,
                        int *piece, int64_t *piece_start)
{
    track_t *tr = track(w, name);
    if (!tr) return;
    if (tr->agreed_at > 0 && tr->agreed_at <= b->t0) {
        ev_span(w, tr->tid, tr->agreed_at, b->t0, "QUEUE");
        HVL_JSON_LIT(&w->out, "}");
    }
    tr->agreed_at = 0;
    char op_name[32], collective[96];
    upper(op_name, sizeof(op_name), "", hvl__op_name(b->op));
    upper(collective, sizeof(collective), b->backend, hvl__op_name(b->op));
    ev_span(w, tr->tid, b->t0, b->t1, op_name);
    HVL_JSON_LIT(&w->out, ",\"args\":{\"bytes\":");
    hvl__json_int(&w->out, bytes);
    HVL_JSON_LIT(&w->out, ",\"dtype\":");
    hvl__json_str(&w->out, hvl__dtype_name(b->dtype));
    HVL_JSON_LIT(&w->out, ",\"backend\":");
    hvl__json_str(&w->out, b->backend);
    HVL_JSON_LIT(&w->out, ",\"batch_tensors\":");
    hvl__json_int(&w->out, b->count);
    HVL_JSON_LIT(&w->out, ",\"batch_bytes\":");
    hvl__json_int(&w->out, b->bytes);
    if (b->status != HVL_OK) {
        hvl__buf_printf(&w->out, ",\"error\":");
        hvl__json_str(&w->out, b->error);
    }
    HVL_JSON_LIT(&w->out, "}}");
    if (!hvl__op_is(b->op, HVL_OPF_DATA)) return;    /* negotiation was the whole op */
    if (b->device && b->npieces == 1) {              /* the GPU's phases, those that took time */
        hvl_tl_piece p = piece_at(b, 0);
        const double at[5] = {b->t0, p.t_in, p.t_reduce, p.t_out, p.t_done};
        const char *phase[4] = {"WAIT_FOR_INPUTS", "MEMCPY_IN_FUSION_BUFFER", collective, "MEMCPY_OUT_FUSION_BUFFER"};
        for (int i = 0; i < 4; i++)
            if (i == 0 || i == 2 || at[i + 1] > at[i]) {    /* copies: fused batches (equal times else) */
                ev_span(w, tr->tid, at[i], at[i + 1], phase[i]);
                HVL_JSON_LIT(&w->out, "}");
            }
        return;
    }
    if (b->op != HVL_ALLREDUCE || b->npieces == 0) {   /* a device plane's batch runs whole */
        ev_span(w, tr->tid, b->t0, b->t1, collective);
        HVL_JSON_LIT(&w->out, "}");
        return;
    }
    while (*piece < b->npieces && *piece_start + piece_at(b, *piece).bytes <= offset)
        *piece_start += piece_at(b, (*piece)++).bytes;
    int64_t start = *piece_start;
    for (int j = *piece; bytes > 0 && j < b->npieces && start < offset + bytes; start += piece_at(b, j++).bytes)
        piece_spans(w, b, tr->tid, j, collective);
}

static void on_batch(writer_t *w, cursor_t *c)
{
    batch_t b = {.t0 = get_f64(c), .t1 = get_f64(c)};
    b.op = get_i32(c), b.dtype = get_i32(c), b.status = get_i32(c), b.count = get_i32(c);
    b.scale_in = get_i32(c), b.scale_out = get_i32(c), b.device = get_i32(c), b.left_running = get_i32(c);
    b.npieces = get_i32(c);
    b.backend = get_str(c), b.error = get_str(c);
    b.pieces = c->p;
    if (b.npieces < 0 || b.count < 0 || c->bad) { c->bad = 1; return; }
    if ((size_t)(c->end - c->p) < (size_t)b.npieces * sizeof(hvl_tl_piece)) { c->bad = 1; return; }
    c->p += (size_t)b.npieces * sizeof(hvl_tl_piece);
    cursor_t entries = *c;               /* a first pass sums the batch's bytes */
    for (int i = 0; i < b.count; i++) b.bytes += get_i64(c), get_str(c);
    if (c->bad) return;
    int piece = 0;
    int64_t piece_start = 0, offset = 0;
    for (int i = 0; i < b.count; i++) {
        int64_t bytes = get_i64(&entries);
        batch_entry(w, &b, get_str(&entries), offset, bytes, &piece, &piece_start);
        offset += bytes;
    }
    char op_name[32];
    upper(op_name, sizeof(op_name), "", hvl__op_name(b.op));
    if (b.left_running) {           /* its own track: it outlived its cycle, and overlaps others */
        if (!w->gpu_tid) name_track(w, w->gpu_tid = ++w->ntracks, "GPU batches left running");
        double t0 = b.t0 > w->gpu_end ? b.t0 : w->gpu_end;   /* the stream ran them in order */
        ev_span(w, w->gpu_tid, t0, b.t1 > t0 ? b.t1 : t0, op_name);
        w->gpu_end = b.t1;
    } else {
        ev_span(w, 0, b.t0, b.t1, op_name);
    }
    hvl__buf_printf(&w->out, ",\"args\":{\"tensors\":%d,\"bytes\":%lld,\"dtype\":\"%s\",\"backend\":", b.count,
        (long long)b.bytes, hvl__dtype_name(b.dtype));
    hvl__json_str(&w->out, b.backend);
    hvl__buf_printf(&w->out, "%s}}", b.status == HVL_OK ? "" : ",\"failed\":true");
}

static void on_cycle(writer_t *w, cursor_t *c)
{
    double t0 = get_f64(c), t_negotiated = get_f64(c), t1 = get_f64(c);
    int agreed = get_i32(c), batches = get_i32(c), tensors = get_i32(c);
    int64_t bytes = get_i64(c);
    if (c->bad) return;
    if (w->tl->mark_cycles) {
        ev(w, 'i', 0, t0, "CYCLE_START");
        hvl__buf_printf(&w->out, ",\"s\":\"t\"}");
    }
    if (agreed == 0) return;
    ev_span(w, 0, t0, t1, "CYCLE");
    hvl__buf_printf(&w->out, ",\"args\":{\"agreed\":%d,\"batches\":%d,\"tensors\":%d,\"bytes\":%lld}}", agreed,
        batches, tensors, (long long)bytes);
    ev_span(w, 0, t0, t_negotiated, "NEGOTIATION");
    HVL_JSON_LIT(&w->out, "}");
}

static void format(writer_t *w, const hvl_buf *records)
{
    cursor_t c = {records->data, records->data + records->len, 0};
    while (c.p < c.end && !c.bad && !w->failed) {
        switch (get_i32(&c)) {
        case HVL_TL_SUBMIT: on_submit(w, &c); break;
        case HVL_TL_ARRIVE: on_arrive(w, &c); break;
        case HVL_TL_AGREED: on_agreed(w, &c); break;
        case HVL_TL_NOTE: on_note(w, &c); break;
        case HVL_TL_BATCH: on_batch(w, &c); break;
        case HVL_TL_CYCLE: on_cycle(w, &c); break;
        default: c.bad = 1;
        }
    }
    if (c.bad)
        hvl__log_once("timeline corrupt", HVL_LOG_ERROR, "timeline: corrupt record; the rest of this write is skipped");
}

/* Appends w->out to the file (timeline_file.c keeps it valid JSON). A failure stops the
 * timeline, with one error line; the file keeps what was written before. */
static void flush(writer_t *w)
{
    hvl_timeline *tl = w->tl;
    int rc = w->out.bad ? hvl__fail(HVL_ERR_NO_MEMORY, "out of memory formatting events")
                        : hvl__tl_file_append(tl, w->out.data, w->out.len);
    if (rc != HVL_OK) {
        hvl__log_once("timeline write", HVL_LOG_ERROR, "timeline: %s; the timeline stops here and %s "
                      "keeps what was written before", hvl_last_error(), tl->path);
        w->failed = rc;
    }
    w->out.len = 0;
    w->out.bad = 0;
}

/* Waits until records are due (HVL_TL_FLUSH_S passed, HVL_TL_FLUSH_BYTES waiting) or stop.
 * tl->lock held. */
static void wait_due(hvl_timeline *tl)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(HVL_TL_FLUSH_S * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (!tl->stop && tl->records.len < HVL_TL_FLUSH_BYTES)
        if (pthread_cond_timedwait(&tl->wake, &tl->lock, &ts) == ETIMEDOUT) break;
}

static void writer_free(writer_t *w)
{
    for (size_t i = 0; i < w->tracks.cap; i++) {
        if (!hvl__strmap_live(&w->tracks, i)) continue;
        track_t *t = w->tracks.slots[i].value;
        free(t->late);
        free(t);
    }
    hvl__strmap_free(&w->tracks);
    hvl__buf_free(&w->out);
}

void *hvl__tl_writer_main(void *arg)
{
    hvl_timeline *tl = arg;
    writer_t w = {.tl = tl};
    hvl_buf taken = {0};
    prctl(PR_SET_NAME, "hvl-timeline", 0, 0, 0);
    pthread_mutex_lock(&tl->lock);
    for (int last = 0; !last;) {
        wait_due(tl);
        hvl_buf swap = tl->records;        /* take everything; the bg thread starts a new buffer */
        tl->records = taken;
        taken = swap;
        int64_t dropped = tl->dropped;
        tl->dropped = 0;
        last = tl->stop;
        pthread_mutex_unlock(&tl->lock);
        format(&w, &taken);
        if (dropped) {
            hvl__log_once("timeline dropped", HVL_LOG_WARNING, "timeline: the writer fell behind; records "
                          "were dropped (marked TIMELINE_DROPPED in %s)", tl->path);
            ev(&w, 'i', 0, hvl__now(), "TIMELINE_DROPPED");
            hvl__buf_printf(&w.out, ",\"s\":\"g\",\"args\":{\"records\":%lld}}", (long long)dropped);
        }
        if (w.out.len && !w.failed) flush(&w);
        taken.len = 0;
        taken.bad = 0;
        pthread_mutex_lock(&tl->lock);
        if (w.failed) {                    /* stop recording; stop() still joins this thread */
            tl->open = 0;
            __atomic_store_n(&hvl__tl_on, 0, __ATOMIC_RELAXED);
            last = 1;
        }
    }
    pthread_mutex_unlock(&tl->lock);
    hvl__tl_file_finish(tl);
    hvl__buf_free(&taken);
    writer_free(&w);
    return NULL;
}
