/* execute.c: runs this cycle's batches on this rank, in order, each on the data plane the
 * registry picks, and finishes their entries (hvl__entry_finish). A fused allreduce goes piece
 * by piece (HVLITE_ALLREDUCE_PIECE): copy the piece in (applying the prescale), reduce it in
 * place, copy it out (average, postscale) while it is still in cache; a lone tensor is reduced
 * in its own output, also in pieces (measurements: bench/README.md); an Adasum batch goes
 * whole to a plane that has Adasum (run_adasum). Allgather and alltoall live
 * in gather.c. Ops without data (barrier, join, process-set changes) run here too, at their
 * place in the agreed order. bg thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "cycle.h"
#include "half.h"
#include "kernels.h"
#include "stage.h"
#include "timeline.h"

static int is_integer(int dtype) { return dtype <= HVL_INT64; }

/* A scale factor as the host loops apply it. CUDA tensors of 16-bit floats (staged here) are
 * scaled as the GPU kernels of Horovod and NCCL's pre-multiplied sum scale them: by the factor
 * rounded to the tensors' type first (Horovod's GPU tests expect exactly that). Host tensors keep
 * the factor in float, as Horovod does on the CPU. */
static double factor_for(const hvl_batch *b, double f)
{
    if (b->memory == HVL_MEMORY_HOST || f == 1.0) return f;
    if (b->dtype == HVL_FLOAT16) return half_to_float(float_to_half((float)f));
    if (b->dtype == HVL_BFLOAT16) return bf16_to_float(float_to_bf16((float)f));
    return f;
}

/* Average and postscale on a reduced buffer, src -> dst (may be equal). Integer averages use
 * exact integer division (toward zero). */
static void finish_values(const hvl_batch *b, void *dst, const void *src, int64_t count)
{
    double post = b->postscale;
    if (b->reduce_op == HVL_AVERAGE && is_integer(b->dtype)) {
        hvl__scale(dst, src, count, b->dtype, 1.0);   /* copy */
        switch (b->dtype) {
#define DIV(T) { T *d = dst; for (int64_t i = 0; i < count; i++) d[i] = (T)(d[i] / b->ps->size); } break
        case HVL_UINT8: DIV(uint8_t);
        case HVL_INT8: DIV(int8_t);
        case HVL_UINT16: DIV(uint16_t);
        case HVL_INT16: DIV(int16_t);
        case HVL_INT32: DIV(int32_t);
        case HVL_INT64: DIV(int64_t);
#undef DIV
        }
        src = dst;
    } else if (b->reduce_op == HVL_AVERAGE) {
        post /= b->ps->size;
    }
    if (post != 1.0 || dst != src) hvl__scale(dst, src, count, b->dtype, factor_for(b, post));
}

static int64_t entry_elems(const hvl_entry *en) { return hvl__shape_elems(en->d.ndim, en->d.shape); }

/* Position in a batch's fused layout: entry i, element off within it. */
typedef struct { int i; int64_t off; } cursor_t;

/* Moves `count` elements between the fused layout at `cur` and `piece`: into the piece
 * (applying the prescale) or out of it (applying average and postscale). */
static void move_piece(const hvl_batch *b, cursor_t *cur, char *piece,
                       int64_t count, int into_piece)
{
    int esize = hvl_dtype_size(b->dtype);
    while (count > 0) {
        hvl_entry *en = b->entries[cur->i];
        int64_t n = entry_elems(en) - cur->off;
        if (n > count) n = count;
        if (into_piece)
            hvl__scale(piece, (const char *)en->input + cur->off * esize, n, b->dtype, factor_for(b, b->prescale));
        else
            finish_values(b, (char *)en->output + cur->off * esize, piece, n);
        piece += n * esize;
        count -= n;
        cur->off += n;
        while (cur->i < b->count && cur->off == entry_elems(b->entries[cur->i])) cur->i++, cur->off = 0;
    }
}

/* The batch as a stream (backend.h) for planes that chunk it themselves: fill and drain
 * walk the fused layout with one cursor each. */
typedef struct { hvl_stream s; hvl_batch *b; cursor_t in, out; } batch_stream;

static void stream_fill(hvl_stream *s, int64_t off, int64_t n, void *to)
{
    (void)off;   /* consecutive ranges: the cursor is already there */
    move_piece(((batch_stream *)s)->b, &((batch_stream *)s)->in, to, n, 1);
}

static void stream_drain(hvl_stream *s, int64_t off, int64_t n, const void *from)
{
    (void)off;
    move_piece(((batch_stream *)s)->b, &((batch_stream *)s)->out, (char *)from, n, 0);
}

static int run_allreduce_stream(hvl_engine *e, const hvl_plane *p, hvl_batch *b)
{
    batch_stream bs = {{b->bytes / hvl_dtype_size(b->dtype), b->dtype, b->reduce_op, stream_fill, stream_drain},
                       b, {0, 0}, {0, 0}};
    while (bs.in.i < b->count && entry_elems(b->entries[bs.in.i]) == 0) bs.in.i++;
    bs.out = bs.in;
    return p->be->allreduce_stream(e, b->ps, p->state, &bs.s);
}

/* Adasum needs whole tensors (each has its own dot products), so it goes in one piece: the
 * batch is copied into the fusion buffer (a lone tensor into its output) with the prescale,
 * reduced there by the plane, and copied out with the postscale. */
static int run_adasum(hvl_engine *e, const hvl_plane *p, hvl_batch *b)
{
    int64_t total = b->bytes / hvl_dtype_size(b->dtype);
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)b->count);
    if (!counts) return hvl__oom("Adasum tensor counts");
    for (int i = 0; i < b->count; i++) counts[i] = entry_elems(b->entries[i]);
    hvl_entry *en = b->entries[0];
    char *buf = en->output;
    cursor_t in = {0, 0}, out;
    int rc = HVL_OK;
    if (b->count == 1) {
        hvl__scale(buf, en->input, total, b->dtype, factor_for(b, b->prescale));
    } else {
        HVL_CHECK_GOTO(hvl__grow(&e->fusion_buf, &e->fusion_cap, b->bytes), rc, done);
        buf = e->fusion_buf;
        while (in.i < b->count && entry_elems(b->entries[in.i]) == 0) in.i++;
        out = in;
        move_piece(b, &in, buf, total, 1);
    }
    HVL_CHECK_GOTO(p->be->adasum(e, b->ps, p->state, buf, b->dtype, counts, b->count), rc, done);
    if (b->count == 1) finish_values(b, buf, buf, total);
    else move_piece(b, &out, buf, total, 0);
done:
    free(counts);
    return rc;
}

/* Allreduce a batch piece by piece (HVLITE_ALLREDUCE_PIECE): each piece is copied in, reduced
 * and copied out while it is still in cache. A lone tensor is reduced in its own output. */
static int run_allreduce(hvl_engine *e, const hvl_plane *p, hvl_batch *b)
{
    if (b->reduce_op == HVL_ADASUM) return run_adasum(e, p, b);
    if (p->be->allreduce_stream) return run_allreduce_stream(e, p, b);
    int esize = hvl_dtype_size(b->dtype), tl = hvl__tl_active();   /* timeline: piece spans */
    double t_in = 0, t_reduce = 0, t_out = 0;
    int64_t total = b->bytes / esize;
    int64_t piece = e->params.allreduce_piece > 0 ? e->params.allreduce_piece / esize : total;
    if (piece < 1) piece = 1;
    if (b->count == 1) {
        hvl_entry *en = b->entries[0];
        for (int64_t off = 0; off < total; off += piece) {
            int64_t n = total - off < piece ? total - off : piece;
            const char *src = (const char *)en->input + off * esize;
            char *dst = (char *)en->output + off * esize;
            if (tl) t_in = hvl__now();
            if (b->prescale != 1.0) { hvl__scale(dst, src, n, b->dtype, factor_for(b, b->prescale)); src = dst; }
            if (tl) t_reduce = hvl__now();
            HVL_CHECK(p->be->allreduce(e, b->ps, p->state, src, dst, n, b->dtype, b->reduce_op));
            if (tl) t_out = hvl__now();
            finish_values(b, dst, dst, n);
            if (tl) hvl__tl_piece(t_in, t_reduce, t_out, n * esize);
        }
        return HVL_OK;
    }
    HVL_CHECK(hvl__grow(&e->fusion_buf, &e->fusion_cap, (total < piece ? total : piece) * esize));
    cursor_t in = {0, 0}, out = {0, 0};
    while (in.i < b->count && entry_elems(b->entries[in.i]) == 0) in.i++;
    out = in;
    for (int64_t off = 0; off < total; off += piece) {
        int64_t n = total - off < piece ? total - off : piece;
        if (tl) t_in = hvl__now();
        move_piece(b, &in, e->fusion_buf, n, 1);
        if (tl) t_reduce = hvl__now();
        HVL_CHECK(p->be->allreduce(e, b->ps, p->state, e->fusion_buf, e->fusion_buf, n, b->dtype, b->reduce_op));
        if (tl) t_out = hvl__now();
        move_piece(b, &out, e->fusion_buf, n, 0);
        if (tl) hvl__tl_piece(t_in, t_reduce, t_out, n * esize);
    }
    return HVL_OK;
}

static int run_reducescatter(hvl_engine *e, const hvl_plane *p, hvl_batch *b)
{
    hvl_entry *en = b->entries[0];
    hvl_pset *ps = b->ps;
    int64_t row_elems = hvl__row_bytes(en) / hvl_dtype_size(b->dtype), total = entry_elems(en);
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)ps->size);
    if (!counts) return hvl__oom("reducescatter counts");
    for (int r = 0; r < ps->size; r++) counts[r] = hvl_reducescatter_rows(en->d.shape[0], r, ps->size) * row_elems;
    const void *src = en->input;
    int rc;
    if (b->prescale != 1.0) {
        HVL_CHECK_GOTO(hvl__grow(&e->scratch_buf, &e->scratch_cap, total * hvl_dtype_size(b->dtype)), rc, out);
        hvl__scale(e->scratch_buf, src, total, b->dtype, factor_for(b, b->prescale));
        src = e->scratch_buf;
    }
    HVL_CHECK_GOTO(p->be->reducescatter(e, ps, p->state, src, en->output, counts, b->dtype, b->reduce_op), rc, out);
    finish_values(b, en->output, en->output, counts[ps->rank]);
out:
    free(counts);
    return rc;
}

/* Removing a set: its tensors still pending here can never run (they fail), the negotiation
 * forgets it, its planes close. Every rank runs this at the same point of the agreed list. */
static void remove_set(hvl_engine *e, int id)
{
    char message[200];
    snprintf(message, sizeof(message), "process set %d was removed while this tensor was pending", id);
    hvl__queue_fail_set(e, id, message);
    hvl__negotiation_drop_set(e->negotiation, id);
    hvl__pset_remove(e, id);
}

static int run_batch(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_outcome *o)
{
    hvl_entry *en = b->entries[0];
    int id = 0;
    switch (b->op) {
    case HVL_ALLREDUCE: return run_allreduce(e, p, b);
    case HVL_ALLGATHER: return hvl__run_allgather(e, p, b, o);
    case HVL_ALLTOALL: return hvl__run_alltoall(e, p, b, o);
    case HVL_REDUCESCATTER: return run_reducescatter(e, p, b);
    case HVL_BROADCAST:   /* root_rank is global; the plane takes the rank within the set */
        if (e->rank == b->root_rank && en->output != en->input && b->bytes > 0) memcpy(en->output, en->input, (size_t)b->bytes);
        return p->be->broadcast(e, b->ps, p->state, en->output, b->bytes, hvl__pset_rank_of(b->ps, b->root_rank));
    case HVL_BARRIER: return HVL_OK;   /* negotiation already brought every rank here */
    case HVL_JOIN:
        e->joined = 0;
        o->value = b->last_joined;
        return HVL_OK;
    case HVL_PROCESS_SET_ADD:
        HVL_CHECK(hvl__pset_add(e, en->splits, en->nsplits, &id, &b->failed_everywhere));
        hvl__negotiation_sets_changed(e->negotiation);
        o->value = id;
        return HVL_OK;
    case HVL_PROCESS_SET_REMOVE:
        remove_set(e, b->target_set);
        return HVL_OK;
    default: return hvl__fail(HVL_ERR_SYSTEM, "unknown op %d", b->op);
    }
}

/* o[i] is entry i's outcome (results of allgather/alltoall); o may hold just one. */
static void finish_batch(hvl_engine *e, hvl_batch *b, int rc, hvl_outcome *o)
{
    for (int i = 0; i < b->count; i++) {
        hvl_outcome done = b->op == HVL_ALLGATHER || i == 0 ? o[i] : (hvl_outcome){0};
        done.status = rc;
        if (rc != HVL_OK) done.message = strdup(hvl_last_error());
        hvl__entry_finish(e, b->entries[i], &done);
    }
}

/* Bytes per piece of a staged allreduce (HVLITE_STAGED_PIECE, raised to a whole number of
 * elements and to at most STAGED_PIECES_MAX pieces), or 0 where the batch is staged whole: other
 * ops, Adasum (whole tensors), one piece or less. Every member decides alike: agreed facts
 * only. */
#define STAGED_PIECES_MAX 4096    /* larger pieces past this: an event and a plane call each */

static int64_t staged_piece_bytes(const hvl_engine *e, const hvl_batch *b)
{
    int esize = hvl_dtype_size(b->dtype);
    int64_t piece = e->params.staged_piece;
    if (b->op != HVL_ALLREDUCE || b->reduce_op == HVL_ADASUM || piece <= 0) return 0;
    if (piece < (b->bytes + STAGED_PIECES_MAX - 1) / STAGED_PIECES_MAX)
        piece = (b->bytes + STAGED_PIECES_MAX - 1) / STAGED_PIECES_MAX;
    piece = (piece + esize - 1) / esize * esize;
    return b->bytes > piece ? piece : 0;
}

/* A staged allreduce in pieces (stage.h): each piece reduced in place in host memory once its
 * copies arrived, then copied back while the next is reduced. One plane call per piece. */
static int run_staged_pieces(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_stage *st)
{
    int esize = hvl_dtype_size(b->dtype), tl = hvl__tl_active();   /* timeline: piece spans */
    double t_in = 0, t_reduce = 0, t_out = 0;
    for (int k = 0; k < st->npieces; k++) {
        int64_t off = k * st->piece_bytes, bytes = b->bytes - off < st->piece_bytes ? b->bytes - off : st->piece_bytes;
        int64_t n = bytes / esize;
        char *at = st->flat + off;
        if (tl) t_in = hvl__now();
        HVL_CHECK(hvl__stage_piece_wait(e, b, st, k));
        if (tl) t_reduce = hvl__now();
        if (b->prescale != 1.0) hvl__scale(at, at, n, b->dtype, factor_for(b, b->prescale));
        HVL_CHECK(p->be->allreduce(e, b->ps, p->state, at, at, n, b->dtype, b->reduce_op));
        finish_values(b, at, at, n);
        if (tl) t_out = hvl__now();
        hvl__stage_piece_back(b, st, k);
        if (tl) hvl__tl_piece(t_in, t_reduce, t_out, bytes);
    }
    return HVL_OK;
}

/* A batch of CUDA tensors on a host plane: on host copies of its buffers (stage.h). The set's
 * first member says once per set and op that this op's CUDA tensors take this path, and `why`
 * (NULL: no GPU plane runs it). */
static int run_staged(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_outcome *o, const char *why)
{
    char key[80];
    snprintf(key, sizeof(key), "staged path, set %d, op %d%s", b->ps->id, b->op, why ? ", restaged" : "");
    if (e->rank == b->ps->ranks[0])
        hvl__log_once(key, HVL_LOG_WARNING, "process set %d: CUDA %s goes through host memory (copied "
                      "to page-locked memory on hvlite's stream, run on the %s plane, copied back): %s",
                      b->ps->id, hvl__op_name(b->op), p->be->name, why ? why : "no GPU plane runs it here");
    hvl_stage st;
    int64_t piece = staged_piece_bytes(e, b);
    int rc = piece ? hvl__stage_in_pieces(e, b, &st, piece) : hvl__stage_in(e, b, &st);
    if (rc == HVL_OK) rc = piece ? run_staged_pieces(e, p, b, &st) : run_batch(e, p, b, o);
    if (rc == HVL_OK) rc = hvl__stage_out(e, b, &st);
    hvl__stage_end(e, b, &st);
    return rc;
}

/* A batch of CUDA tensors on a device plane: the plane gets the device pointers and runs it
 * whole (fusion included). A joined rank's stand-ins are host memory with device -1. Allgather
 * and alltoall, whose results the engine sizes, go through gather.c; where a member's GPU had no
 * room for its results, every member runs the batch staged instead (*p says where it ran).
 * ticket: NULL, or where the plane may leave its token for a batch it left running. */
static int run_device(hvl_engine *e, hvl_plane *p, const hvl_batch_kind *k, hvl_batch *b, hvl_outcome *o,
                      void **ticket)
{
    if (b->op == HVL_ALLGATHER || b->op == HVL_ALLTOALL) {
        int restage = 0;
        int rc = b->op == HVL_ALLGATHER ? hvl__run_allgather_device(e, p, k, b, o, &restage)
                                        : hvl__run_alltoall_device(e, p, k, b, o, &restage);
        if (rc != HVL_OK || !restage) return rc;
        *p = hvl__plane_staged(e, b->ps, k);
        b->backend = p->be->name;
        memset(b->phases, 0, sizeof(b->phases));
        return run_staged(e, p, b, o, "a GPU had no room for its results (at least once)");
    }
    hvl_device_tensor *t = calloc((size_t)b->count, sizeof(*t));
    int64_t *counts = malloc(sizeof(int64_t) * (size_t)b->ps->size);
    int rc = HVL_OK;
    if (!t || !counts) {
        rc = hvl__oom("a device batch");
        goto out;
    }
    for (int i = 0; i < b->count; i++) {
        hvl_entry *en = b->entries[i];
        t[i] = (hvl_device_tensor){en->input, en->output, entry_elems(en), en->device, en->ready_event};
    }
    if (b->op == HVL_REDUCESCATTER) {
        hvl_entry *en = b->entries[0];
        int64_t row_elems = hvl__row_bytes(en) / hvl_dtype_size(b->dtype);
        for (int r = 0; r < b->ps->size; r++)
            counts[r] = hvl_reducescatter_rows(en->d.shape[0], r, b->ps->size) * row_elems;
    }
    int root = b->op == HVL_BROADCAST ? hvl__pset_rank_of(b->ps, b->root_rank) : 0;
    hvl_device_batch db = {*k, root, b->count, t, counts, b->entries[0]->d.name,
                           b->timed ? b->phases : NULL, ticket};
    rc = p->be->run_device(e, b->ps, p->state, &db);
out:
    free(t);
    free(counts);
    return rc;
}

/* The agreed facts of a batch the planes choose by (the same on every member). */
static hvl_batch_kind kind_of(const hvl_batch *b)
{
    hvl_batch_kind k = {b->op, b->reduce_op, b->dtype, b->memory, b->bytes, b->prescale, b->postscale, 0};
    const hvl_entry *en = b->entries[0];
    if (b->op == HVL_REDUCESCATTER && en->d.ndim > 0) k.even_rows = en->d.shape[0] % b->ps->size == 0;
    return k;
}

/* This rank's CUDA device for a batch: its first tensor's; -1 if it has only stand-ins. */
static int batch_device(const hvl_batch *b)
{
    for (int i = 0; i < b->count; i++)
        if (b->entries[i]->device >= 0) return b->entries[i]->device;
    return -1;
}

/* The end of a batch's run: the trace, the timeline, its entries finished with rc (o: their
 * outcomes), and one wake-up for the waiters. */
static void conclude(hvl_engine *e, hvl_batch *b, double t0, int rc, hvl_outcome *o)
{
    hvl__log(HVL_LOG_TRACE, "batch: %s of %d tensors, %lld bytes, %.1f us, backend %s", hvl__op_name(b->op),
             b->count, (long long)b->bytes, (hvl__now() - t0) * 1e6, b->backend);
    if (hvl__tl_active()) {
        if (b->phases[3] > 0) hvl__tl_device_phases(t0, b->phases);
        hvl__tl_batch(b, t0, rc);
    }
    /* An error not every member agreed on stops the engine: say so before the callers hear of
     * it, so that is_initialized() is already False then and an init() after it starts anew. */
    if (rc != HVL_OK && !b->failed_everywhere) hvl__mark_stopped(hvl_last_error());
    finish_batch(e, b, rc, o);
    hvl__handles_notify();   /* one wake-up per batch, not per tensor */
}

/* ---- device batches left running (HVLITE_NCCL_OVERLAP) ----
 * A device plane with settle may leave an allreduce, broadcast or reducescatter running on the
 * GPU: the engine goes back to negotiating, and queues the next batches behind it on the
 * plane's stream, while the handles wait for the GPU. Their entries leave the pending map
 * (negotiation no longer sees them) and are finished here once the plane says the batch ended
 * (hvl__execute_settle, from the engine's wait). They all belong to one set; ops without data
 * (barrier, join, set changes) and a CUDA batch of another set first wait for them (host
 * batches need not: they never touch the GPU). */
typedef struct hvl_in_flight {
    hvl_batch b;                /* b.entries owned here */
    hvl_plane p;
    void *ticket;
    double t0;                  /* when its run began */
} hvl_in_flight;

static void in_flight_pop(hvl_engine *e, hvl_in_flight *out)
{
    *out = e->in_flight[0];
    memmove(e->in_flight, e->in_flight + 1, sizeof(hvl_in_flight) * (size_t)--e->nin_flight);
}

/* A batch left running that fails behind another's error keeps that error, but never as one
 * decided before any data moved (its handles would let go of buffers the GPU may still write):
 * a tensor on another GPU than its set's fails its own batch with HVL_ERR_INVALID_ARG, and the
 * batches still running with HVL_ERR_SHUT_DOWN. Their buffers are free only once the plane saw
 * the GPU get past them (hvl_buffers_busy). */
void hvl__execute_abandon(hvl_engine *e, int status, const char *message)
{
    int passed = 1;
    for (int i = 0; i < e->nin_flight; i++) {      /* each set's plane once, before any handle fails */
        const hvl_in_flight *r = &e->in_flight[i];
        if (i == 0 || r->p.state != r[-1].p.state) passed &= r->p.be->abandon(e, r->b.ps, r->p.state);
    }
    int decided = status == HVL_ERR_INVALID_ARG || status == HVL_ERR_MISMATCH || status == HVL_ERR_DEADLOCK ||
                  status == HVL_ERR_UNSUPPORTED || status == HVL_ERR_NOT_INITIALIZED;
    while (e->nin_flight) {
        hvl_in_flight r;
        in_flight_pop(e, &r);
        for (int i = 0; i < r.b.count; i++) {
            hvl_outcome o = {.status = decided ? HVL_ERR_SHUT_DOWN : status,
                             .buffers = passed ? HVL_BUFFERS_FREE : HVL_BUFFERS_BUSY};
            char text[1200];
            snprintf(text, sizeof(text), "%s%s%s%s", decided ? "tensor '" : "", decided ? r.b.entries[i]->d.name : "",
                     decided ? "' was still running on the GPU when another tensor's error stopped the engine: " : "",
                     message);
            o.message = strdup(text);
            hvl__entry_finish(e, r.b.entries[i], &o);
        }
        free(r.b.entries);
    }
    hvl__handles_notify();
}

int hvl__execute_settle(hvl_engine *e, int how)
{
    while (e->nin_flight) {
        hvl_in_flight *r = &e->in_flight[0];
        int done = 0;
        int rc = r->p.be->settle(e, r->b.ps, r->p.state, r->ticket, how, &done, r->b.timed ? r->b.phases : NULL);
        if (rc == HVL_OK && !done) return HVL_OK;            /* the oldest runs on: so do the others */
        char message[1024];
        rc = hvl__peers_explain(e, rc);
        snprintf(message, sizeof(message), "%s", rc == HVL_OK ? "" : hvl_last_error());
        hvl_in_flight ended;
        hvl_outcome o = {0};
        in_flight_pop(e, &ended);
        conclude(e, &ended.b, ended.t0, rc, &o);
        free(ended.b.entries);
        if (rc != HVL_OK) {                 /* its plane failed its set: the rest fail with it */
            hvl__execute_abandon(e, rc, message);
            return hvl__fail(rc, "%s", message);
        }
    }
    return HVL_OK;
}

/* Keeps a batch the plane left running (its ticket) until it ends. */
static int keep_running(hvl_engine *e, hvl_batch *b, const hvl_plane *p, void *ticket, double t0)
{
    hvl_entry **entries = malloc(sizeof(*entries) * (size_t)b->count);
    if (entries && e->nin_flight == e->in_flight_cap) {
        int cap = e->in_flight_cap ? e->in_flight_cap * 2 : 8;
        hvl_in_flight *grown = realloc(e->in_flight, sizeof(*grown) * (size_t)cap);
        if (grown) e->in_flight = grown, e->in_flight_cap = cap;
    }
    if (!entries || e->nin_flight == e->in_flight_cap) {   /* no room to keep it: wait for it here */
        int done = 0, rc = p->be->settle(e, b->ps, p->state, ticket, HVL_SETTLE_WAIT, &done,
                                         b->timed ? b->phases : NULL);
        hvl_outcome o = {0};
        free(entries);
        rc = hvl__peers_explain(e, rc);
        conclude(e, b, t0, rc, &o);
        return rc;
    }
    memcpy(entries, b->entries, sizeof(*entries) * (size_t)b->count);
    for (int i = 0; i < b->count; i++) hvl__entry_detach(e, entries[i]);
    hvl_in_flight *r = &e->in_flight[e->nin_flight++];
    *r = (hvl_in_flight){*b, *p, ticket, t0};
    r->b.entries = entries;
    r->b.left_running = 1;
    return HVL_OK;
}

/* 1 if the batch may be left running on plane p. */
static int may_run_on(const hvl_engine *e, const hvl_batch *b, const hvl_plane *p)
{
    return e->params.nccl_overlap && b->memory != HVL_MEMORY_HOST && !p->staged && p->be->settle &&
           p->be->abandon && b->op != HVL_ALLGATHER && b->op != HVL_ALLTOALL;
}

/* One batch on its plane; its entries finish with the outcome, or once the GPU ends it. */
static int execute_one(hvl_engine *e, hvl_batch *b)
{
    int data = hvl__op_is(b->op, HVL_OPF_DATA), cuda = data && b->memory != HVL_MEMORY_HOST;
    hvl_batch_kind k = kind_of(b);
    if (e->nin_flight && (!data || (cuda && e->in_flight[0].b.ps != b->ps)))
        HVL_CHECK(hvl__execute_settle(e, HVL_SETTLE_WAIT));   /* see "left running" above */
    if (cuda) HVL_CHECK(hvl__planes_prepare(e, b->ps, &k, batch_device(b)));
    hvl_plane p = data ? hvl__plane_for(e, b->ps, &k) : (hvl_plane){0};
    int overlap = data && may_run_on(e, b, &p);
    hvl_outcome *o = calloc((size_t)b->count, sizeof(hvl_outcome));
    if (!o) return hvl__oom("a batch's outcomes");
    b->backend = data ? p.be->name : "none";
    b->timed = hvl__tl_active();
    void *ticket = NULL;
    double t0 = hvl__now();
    int rc = p.staged ? run_staged(e, &p, b, o, NULL)
           : cuda ? run_device(e, &p, &k, b, o, overlap ? &ticket : NULL)
           : run_batch(e, &p, b, o);
    rc = hvl__peers_explain(e, rc);          /* a timeout names the silent ranks */
    if (data) {
        hvl__count(&e->counters.collectives, 1);
        hvl__plane_count(e, &p, b->bytes);
    }
    if (rc == HVL_OK && ticket) {
        free(o);
        return keep_running(e, b, &p, ticket, t0);
    }
    if (rc != HVL_OK && !b->failed_everywhere && e->nin_flight) {
        /* fatal, with older batches of the set left running (their plane failed the set too):
         * they fail first, with this error, so handles still fail oldest first */
        char message[1024];
        snprintf(message, sizeof(message), "%s", hvl_last_error());
        hvl__execute_abandon(e, rc, message);
        hvl__fail(rc, "%s", message);
    }
    conclude(e, b, t0, rc, o);
    free(o);
    return b->failed_everywhere ? HVL_OK : rc;   /* an error every member agreed on is not fatal */
}

int hvl__execute(hvl_engine *e, hvl_batch_list *batches)
{
    for (int i = 0; i < batches->count; i++) HVL_CHECK(execute_one(e, &batches->items[i]));
    return HVL_OK;
}
