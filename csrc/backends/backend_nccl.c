/* backend_nccl.c: the NCCL data plane's batches. It runs batches of CUDA tensors on the GPU for
 * a process set whose members each have a GPU of their own (nccl_set.c decides which sets, makes
 * their communicators and waits on them); every other CUDA batch keeps the staged path
 * (core/stage.c).
 *
 * - Running (run_device): on the engine's stream of the device, after each input's ready event;
 *   a fused allreduce is one NCCL call on a device fusion buffer, the tensors copied in and out
 *   on that stream (HVLITE_NCCL_GROUPED=1: one group of per-tensor calls, no buffer; see
 *   fused_copies for why the buffer won), other batches one group of per-tensor calls. In a set
 *   of one rank, allreduce, broadcast and reducescatter call no NCCL (one_rank_copies). Scale
 *   factors fold into ncclAvg or ncclRedOpCreatePreMulSum (nccl_set.c says which reductions NCCL
 *   runs); allgather and alltoall fill results the engine allocated on the GPU (stream-ordered,
 *   so only where every member's GPU has memory pools): allgather is ncclAllGather where every
 *   member gives as many rows, else one ncclBroadcast per member into its place (NCCL has no
 *   allgatherv); alltoall is grouped ncclSend/ncclRecv. Both move bytes, so every dtype works.
 * - Ending: each batch has a ticket, events at its phases' ends on the stream (the timeline's,
 *   when it records; else the end alone). run_device waits for the end, or, where the engine
 *   asks (HVLITE_NCCL_OVERLAP), leaves the batch running and hands the ticket over; settle then
 *   looks at it until it ends. A buffer of the set grows without waiting for them: the one it
 *   outgrew is freed after them on the stream, or kept (nccl_set.c).
 * - Never hanging: every wait is bounded by the peer timeout (from the batch's queueing or the
 *   set's previous batch's end) and the engine's flags; on an NCCL error, a timeout or a tensor
 *   on another GPU the communicator is aborted, fatal to this engine (its other tickets fail
 *   too).
 * bg thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_driver.h"
#include "half.h"
#include "kernels.h"
#include "nccl_set.h"

/* ---- tickets ---- */
/* A ticket for batch b, on the set's list; its points timed where the timeline asks (b->phases)
 * and the driver can, else only ENDED. */
static int ticket_new(nccl_set *s, const hvl_device_batch *b, nccl_ticket **out)
{
    nccl_ticket *t = calloc(1, sizeof(*t));
    *out = NULL;
    if (!t || !(t->name = strdup(b->name ? b->name : ""))) {
        free(t);
        return hvl__oom("an NCCL batch's ticket");
    }
    t->since = hvl__now();
    snprintf(t->what, sizeof(t->what), "NCCL %s", hvl__op_name(b->kind.op));
    t->next = s->tickets;
    s->tickets = t;
    int timed = b->phases != NULL;
    for (int i = 0; i < NPOINTS && timed; i++)
        timed = hvl__cuda_event_new(s->device, 1, &t->points[i]) == HVL_OK;
    if (!timed) {                           /* untimed: the end alone */
        for (int i = 0; i < NPOINTS; i++) hvl__cuda_event_free(s->device, t->points[i], 1);
        memset(t->points, 0, sizeof(t->points));
        int rc = hvl__cuda_event_new(s->device, 0, &t->points[ENDED]);
        if (rc != HVL_OK) {
            hvl__nccl_ticket_free(s, t);
            return rc;
        }
    }
    *out = t;
    return HVL_OK;
}

/* The ticket's point `i` at the stream's current end (untimed tickets have only ENDED). */
static int ticket_point(nccl_set *s, nccl_ticket *t, int i)
{
    return t->points[i] ? hvl__cuda_event_record(s->device, t->points[i]) : HVL_OK;
}

/* The ended ticket's phases on the host clock (hvl_device_batch.phases), if it was timed: each
 * point's GPU time before the end, back from now, when the end was seen (late by the polling
 * interval when waited for; left running, by up to the engine's next look, which may follow a
 * negotiation). */
static void ticket_phases(nccl_set *s, const nccl_ticket *t, double *phases)
{
    double now = hvl__now();
    if (!t->points[IN_READY]) return;       /* untimed: unknown (0), drawn as one span */
    for (int i = 0; i < NPOINTS; i++) {
        double before = 0;
        int known = t->points[i] && (i == ENDED || hvl__cuda_event_seconds(s->device, t->points[i],
                                                                            t->points[ENDED], &before) == HVL_OK);
        phases[i] = known ? now - before : 0;
    }
    if (!t->fused) {                        /* no copies: their points are the phases beside */
        phases[COPIED_IN] = phases[IN_READY];
        phases[REDUCED] = phases[ENDED];
    }
}

/* ---- running ---- */
/* The NCCL op for the batch's reduction, its factors folded in; *custom: destroy it after. */
static int reduction_op(nccl_set *s, const hvl_device_batch *b, int nranks, ncclRedOp_t *op, int *custom)
{
    const hvl_batch_kind *k = &b->kind;
    double factor = k->prescale * k->postscale;
    *custom = 0;
    switch (k->reduce_op) {
    case HVL_MIN: *op = NC_MIN; return HVL_OK;
    case HVL_MAX: *op = NC_MAX; return HVL_OK;
    case HVL_PRODUCT: *op = NC_PROD; return HVL_OK;
    case HVL_SUM: if (factor == 1.0) { *op = NC_SUM; return HVL_OK; } break;
    case HVL_AVERAGE: if (factor == 1.0) { *op = NC_AVG; return HVL_OK; } factor /= nranks; break;
    }
    union { double f64; float f32; uint16_t u16; } scalar;
    switch (k->dtype) {
    case HVL_FLOAT16: scalar.u16 = float_to_half((float)factor); break;
    case HVL_BFLOAT16: scalar.u16 = float_to_bf16((float)factor); break;
    case HVL_FLOAT32: scalar.f32 = (float)factor; break;
    default: scalar.f64 = factor; break;
    }
    HVL_CHECK(hvl__nccl_check(hvl__nccl.premulsum_create(op, &scalar, hvl__nccl_type(k->dtype), NC_SCALAR_HOST, s->comm), s->comm,
                    "ncclRedOpCreatePreMulSum"));
    *custom = 1;
    return HVL_OK;
}

/* Device room for a joined rank's stand-ins: zeros as input, scratch for the outputs. */
static int stand_ins(nccl_set *s, const hvl_device_batch *b)
{
    int64_t esize = hvl_dtype_size(b->kind.dtype), most = 0, total = 0;
    for (int i = 0; i < b->ntensors; i++)
        if (b->tensors[i].device < 0) {
            if (b->tensors[i].count > most) most = b->tensors[i].count;
            total += (b->tensors[i].count * esize + 255) / 256 * 256;   /* each its own output */
        }
    if (!total) return HVL_OK;
    HVL_CHECK(hvl__nccl_set_grow(s, &s->zeros, &s->zeros_cap, most * esize, 1));
    return hvl__nccl_set_grow(s, &s->scratch, &s->scratch_cap, total, 0);
}

/* Tensor t of an allgather: one ncclAllGather where every member gives as many elements, else
 * one ncclBroadcast per member into its place. */
static int enqueue_allgather(nccl_set *s, const hvl_pset *ps, const hvl_device_batch *b, int t, cudaStream_t stream)
{
    const hvl_device_tensor *x = &b->tensors[t];
    int64_t esize = hvl_dtype_size(b->kind.dtype), k = b->ntensors, at = 0;
    int equal = 1;
    for (int r = 1; r < ps->size; r++) equal &= b->counts[r * k + t] == b->counts[t];
    if (equal)
        return b->counts[t] == 0 ? HVL_OK
             : hvl__nccl_check(hvl__nccl.all_gather(x->input, x->output, (size_t)(b->counts[t] * esize), NC_UINT8, s->comm, stream),
                     s->comm, "ncclAllGather");
    for (int r = 0; r < ps->size; r++) {     /* every member skips the same empty ones */
        int64_t bytes = b->counts[r * k + t] * esize;
        if (bytes)
            HVL_CHECK(hvl__nccl_check(hvl__nccl.broadcast(x->input, (char *)x->output + at, (size_t)bytes, NC_UINT8, r, s->comm,
                                         stream), s->comm, "ncclBroadcast (allgather)"));
        at += bytes;
    }
    return HVL_OK;
}

/* An alltoall: to and from every member its rows, as bytes; a pair with nothing to move is
 * skipped on both sides (the receiver knows the sender's count). */
static int enqueue_alltoall(nccl_set *s, const hvl_pset *ps, const hvl_device_batch *b, cudaStream_t stream)
{
    const hvl_device_tensor *x = &b->tensors[0];
    int64_t esize = hvl_dtype_size(b->kind.dtype), sent = 0, received = 0;
    for (int r = 0; r < ps->size; r++) {
        int64_t out = b->counts[r] * esize, in = b->counts[ps->size + r] * esize;
        if (out)
            HVL_CHECK(hvl__nccl_check(hvl__nccl.send((const char *)x->input + sent, (size_t)out, NC_UINT8, r, s->comm, stream),
                            s->comm, "ncclSend (alltoall)"));
        if (in)
            HVL_CHECK(hvl__nccl_check(hvl__nccl.recv((char *)x->output + received, (size_t)in, NC_UINT8, r, s->comm, stream),
                            s->comm, "ncclRecv (alltoall)"));
        sent += out;
        received += in;
    }
    return HVL_OK;
}

/* Queues the batch's NCCL calls, one group, on `stream`, with reduction `op`. */
static int enqueue(nccl_set *s, const hvl_pset *ps, const hvl_device_batch *b, ncclRedOp_t op,
                   cudaStream_t stream)
{
    const hvl_batch_kind *k = &b->kind;
    int type = hvl__nccl_type(k->dtype), rc;
    int64_t esize = hvl_dtype_size(k->dtype), scratch_off = 0;
    HVL_CHECK(hvl__nccl_check(hvl__nccl.group_start(), s->comm, "ncclGroupStart"));
    rc = HVL_OK;
    for (int i = 0; i < b->ntensors && rc == HVL_OK; i++) {
        const hvl_device_tensor *t = &b->tensors[i];
        const void *in = t->input;
        void *out = t->output;
        if (t->device < 0) {                /* a joined rank: zeros in, scratch out */
            in = s->zeros;
            out = (char *)s->scratch + scratch_off;
            scratch_off += (t->count * esize + 255) / 256 * 256;
        }
        if (k->op == HVL_ALLGATHER)
            rc = enqueue_allgather(s, ps, b, i, stream);
        else if (k->op == HVL_ALLTOALL)
            rc = enqueue_alltoall(s, ps, b, stream);
        else if (k->op == HVL_ALLREDUCE)
            rc = hvl__nccl_check(hvl__nccl.all_reduce(in, out, (size_t)t->count, type, op, s->comm, stream), s->comm, "ncclAllReduce");
        else if (k->op == HVL_REDUCESCATTER)
            rc = hvl__nccl_check(hvl__nccl.reduce_scatter(in, out, (size_t)b->counts[ps->rank], type, op, s->comm, stream),
                       s->comm, "ncclReduceScatter");
        else                                 /* broadcast, as bytes; the root copies in to out */
            rc = hvl__nccl_check(hvl__nccl.broadcast(in, out, (size_t)(t->count * esize), NC_UINT8, b->root, s->comm, stream),
                       s->comm, "ncclBroadcast");
    }
    int end = hvl__nccl_check(hvl__nccl.group_end(), s->comm, "ncclGroupEnd");
    return rc != HVL_OK ? rc : end;
}

/* ---- the device fusion buffer ---- */
/* Each tensor's slot in the fusion buffer starts on a 256-byte boundary (a multiple of every
 * element size, so the buffer is one array of the batch's dtype; the gaps are reduced and never
 * read). */
static int64_t slot_bytes(int64_t bytes) { return (bytes + 255) / 256 * 256; }

static int64_t fused_bytes(const hvl_device_batch *b)
{
    int64_t esize = hvl_dtype_size(b->kind.dtype), total = 0;
    for (int i = 0; i < b->ntensors; i++) total += slot_bytes(b->tensors[i].count * esize);
    return total;
}

static int fuses(const hvl_engine *e, const nccl_set *s, const hvl_device_batch *b)
{
    return !e->params.nccl_grouped && !s->fusion_off && b->ntensors > 1 && b->kind.op == HVL_ALLREDUCE;
}

/* Room for `need` bytes of fusion buffer on every member, or on none: each member asks at the
 * same batch (the batch and fusion_agreed are agreed; the buffers may differ in size), and they
 * agree on the outcome, since a member that ran the batch grouped while the others ran one call
 * would mismatch NCCL's calls. 0: run it grouped. */
static int fusion_room(hvl_engine *e, const hvl_pset *ps, nccl_set *s, int64_t need, int *room)
{
    *room = 1;
    if (need <= s->fusion_agreed) return HVL_OK;
    int everywhere = 0;
    int rc = hvl__agree(ps->comm, hvl__nccl_set_grow(s, &s->fusion, &s->fusion_cap, need, 0),
                        "the NCCL fusion buffer", &everywhere, hvl__peer_bound(e));
    if (rc == HVL_OK) s->fusion_agreed = need;
    if (rc == HVL_OK || !everywhere) return rc;
    *room = 0;
    s->fusion_off = 1;
    char key[64];
    snprintf(key, sizeof(key), "nccl fusion off, set %d", ps->id);
    hvl__log_once(key, HVL_LOG_WARNING, "process set %d: no room on the GPU for a %lld-byte NCCL fusion buffer "
                  "(%s): fused CUDA batches run as groups of per-tensor NCCL calls", ps->id, (long long)need,
                  hvl_last_error());
    return HVL_OK;
}

/* A fused allreduce runs as one NCCL call on the fusion buffer: the inputs copied in on the
 * engine's stream (a joined rank's slots zeroed), one call over the whole buffer, the results
 * copied out. One call, not a group of one call per tensor: each call costs NCCL a round of
 * messages between the ranks, which a group does not save (over sockets on one host, 160 tensors
 * of 100 KiB took 385 ms as one group of calls and 16 ms as one call on the buffer), while the
 * copies run at device memory speed. `in`: the copies in, else out. */
static int fused_copies(nccl_set *s, const hvl_device_batch *b, int in)
{
    int64_t esize = hvl_dtype_size(b->kind.dtype);
    char *slot = s->fusion;
    for (int i = 0; i < b->ntensors; i++) {
        const hvl_device_tensor *t = &b->tensors[i];
        int64_t bytes = t->count * esize;
        if (bytes && in)
            HVL_CHECK(t->device < 0 ? hvl__cuda_zero(s->device, slot, bytes)
                                    : hvl__cuda_copy_on_device(s->device, slot, t->input, bytes));
        if (bytes && !in && t->device >= 0)
            HVL_CHECK(hvl__cuda_copy_on_device(s->device, t->output, slot, bytes));
        slot += slot_bytes(bytes);
    }
    return HVL_OK;
}

static int enqueue_fused(nccl_set *s, const hvl_device_batch *b, ncclRedOp_t op, cudaStream_t stream)
{
    size_t count = (size_t)(fused_bytes(b) / hvl_dtype_size(b->kind.dtype));
    HVL_CHECK(hvl__nccl_check(hvl__nccl.group_start(), s->comm, "ncclGroupStart"));
    int rc = hvl__nccl_check(hvl__nccl.all_reduce(s->fusion, s->fusion, count, hvl__nccl_type(b->kind.dtype), op,
                                 s->comm, stream), s->comm, "ncclAllReduce (fused)");
    int end = hvl__nccl_check(hvl__nccl.group_end(), s->comm, "ncclGroupEnd");
    return rc != HVL_OK ? rc : end;
}

/* A set of one rank: an allreduce, broadcast or reducescatter over it is its input, copied to
 * its output on the engine's stream; NCCL is not called (scaled ones are staged: runs). NCCL's
 * own one-rank path was seen to leave the last element of an averaged 4913-element float32
 * tensor unwritten (NCCL 2.28.9 on an H200, now and then: tests/gpu/test_cuda_only.py's
 * set-of-one test), and a copy is all it needs to do anyway. */
static int one_rank_copies(nccl_set *s, const hvl_device_batch *b)
{
    int64_t esize = hvl_dtype_size(b->kind.dtype);
    for (int i = 0; i < b->ntensors; i++) {
        const hvl_device_tensor *t = &b->tensors[i];
        int64_t bytes = (b->kind.op == HVL_REDUCESCATTER ? b->counts[0] : t->count) * esize;
        if (t->device >= 0 && bytes && t->output != t->input)
            HVL_CHECK(hvl__cuda_copy_on_device(s->device, t->output, t->input, bytes));
    }
    return HVL_OK;
}

/* A failure of the set's NCCL (fatal to the engine): the communicator is aborted, so its other
 * tickets fail too, and the peers, which may be mid-collective, never hang on this one; then a
 * bounded look that the stream drained, else the device is marked stuck (a timeout's kernel may
 * never end), so that the engine's stop frees nothing that would wait for it. */
static int fail_set(nccl_set *s, int rc)
{
    char message[1024];
    snprintf(message, sizeof(message), "%s", hvl_last_error());
    hvl__nccl_set_drop(s);
    hvl__nccl_set_drained(s);
    s->mode = STAGED;
    return hvl__fail(rc, "%s", message);
}

/* See backend.h. A batch's end is bounded from when the set's previous batch ended, or from its
 * own queueing if later: a batch behind another waits for it on the stream. */
static int settle(hvl_engine *e, hvl_pset *ps, void *state, void *ticket, int how, int *done, double *phases)
{
    nccl_set *s = state;
    nccl_ticket *t = ticket;
    double since = t->since > s->ended_at ? t->since : s->ended_at;
    hvl_bound bound = hvl__peer_bound(e);
    int rc;
    (void)ps;
    *done = 0;
    /* Only a wait that blocks the engine gives up on the shutdown flag: a look never blocks, and
     * an agreed stop lets the batch end (every member queued it), within 30 s if no peer
     * timeout bounds it. */
    if (how != HVL_SETTLE_WAIT) bound.shutdown = NULL;
    if (how == HVL_SETTLE_STOPPING && bound.timeout_s <= 0) bound.timeout_s = 30.0;
    if (!s->comm) {
        rc = hvl__fail(HVL_ERR_NCCL, "%s of tensor '%s': an NCCL batch of its process set failed before it "
                       "ended", t->what, t->name);
    } else if (how != HVL_SETTLE_LOOK) {
        rc = hvl__nccl_set_poll(bound, s->comm, s->device, t->points[ENDED], since, t->what, t->name);
        *done = rc == HVL_OK;
    } else {
        rc = hvl__nccl_set_look(s->comm, s->device, t->points[ENDED], t->what, done);
        if (rc == HVL_OK && !*done) rc = hvl__nccl_set_overdue(&bound, since, t->what, t->name);
    }
    if (rc == HVL_OK && *done) {
        s->ended_at = hvl__now();
        if (phases) ticket_phases(s, t, phases);
    }
    if (rc != HVL_OK && s->comm) rc = fail_set(s, rc);
    if (rc != HVL_OK || *done) hvl__nccl_ticket_free(s, t);
    return rc;
}

/* See backend.h: the communicator aborted first, so NCCL stops before the handles fail; then
 * the stream is looked at until it drained past the batches (bounded). */
static int abandon(hvl_engine *e, hvl_pset *ps, void *state)
{
    nccl_set *s = state;
    (void)e; (void)ps;
    hvl__nccl_set_drop(s);
    s->mode = STAGED;
    while (s->tickets) hvl__nccl_ticket_free(s, s->tickets);
    return hvl__nccl_set_drained(s);
}

/* The batch on the engine's stream: after its inputs' events, its copies and NCCL calls, each
 * phase's end marked on its ticket; then left running (b->ticket) or waited for here. */
static int run_device(hvl_engine *e, hvl_pset *ps, void *state, const hvl_device_batch *b)
{
    nccl_set *s = state;
    int reduces = b->kind.op == HVL_ALLREDUCE || b->kind.op == HVL_REDUCESCATTER;
    if (b->kind.op == HVL_ALLTOALL && b->ntensors != 1)   /* its counts are one tensor's */
        return fail_set(s, hvl__fail(HVL_ERR_SYSTEM, "NCCL alltoall of tensor '%s': a batch of %d tensors, where "
                                     "an alltoall batch holds one (an hvlite bug: please report it)", b->name,
                                     b->ntensors));
    /* The coordinator refuses a tensor on another GPU than its set's (ready.c); were one to get
     * here all the same, the communicator is aborted now: the peers are entering its calls. */
    for (int i = 0; i < b->ntensors; i++)
        if (b->tensors[i].device >= 0 && b->tensors[i].device != s->device)
            return fail_set(s, hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s' is on cuda:%d, but this rank's NCCL "
                                         "communicator for process set %d is on cuda:%d (its first CUDA tensor's): "
                                         "one GPU per rank", b->name, b->tensors[i].device, ps->id, s->device));
    void *stream;
    nccl_ticket *t = NULL;
    int rc = hvl__cuda_stream(s->device, &stream);
    int one = ps->size == 1 && b->kind.op != HVL_ALLGATHER && b->kind.op != HVL_ALLTOALL;
    int fused = !one && fuses(e, s, b);
    if (rc == HVL_OK && fused) rc = fusion_room(e, ps, s, fused_bytes(b), &fused);
    if (rc == HVL_OK && !fused && !one) rc = stand_ins(s, b);
    ncclRedOp_t op = NC_SUM;
    int custom = 0;
    if (rc == HVL_OK && reduces && !one) rc = reduction_op(s, b, ps->size, &op, &custom);
    for (int i = 0; i < b->ntensors && rc == HVL_OK; i++)
        if (b->tensors[i].ready_event) rc = hvl__cuda_wait_event(s->device, b->tensors[i].ready_event);
    if (rc == HVL_OK) rc = ticket_new(s, b, &t);
    if (rc == HVL_OK) t->fused = fused;
    if (rc == HVL_OK) rc = ticket_point(s, t, IN_READY);
    if (rc == HVL_OK && fused) rc = fused_copies(s, b, 1);
    if (rc == HVL_OK) rc = ticket_point(s, t, COPIED_IN);
    if (rc == HVL_OK && one) rc = one_rank_copies(s, b);    /* its "collective" */
    if (rc == HVL_OK && !one) rc = fused ? enqueue_fused(s, b, op, stream) : enqueue(s, ps, b, op, stream);
    if (rc == HVL_OK && !one) rc = hvl__nccl_set_poll(hvl__peer_bound(e), s->comm, -1, NULL, hvl__now(), t->what, b->name);
    if (custom && rc == HVL_OK) hvl__nccl.red_op_destroy(op, s->comm);   /* once the calls settled */
    if (rc == HVL_OK) rc = ticket_point(s, t, REDUCED);
    if (rc == HVL_OK && fused) rc = fused_copies(s, b, 0);      /* after it on the stream */
    if (rc == HVL_OK) rc = ticket_point(s, t, ENDED);
    if (rc == HVL_OK) t->since = hvl__now();                 /* all of it queued: its bound starts */
    if (rc == HVL_OK && b->ticket) {
        *b->ticket = t;
        return HVL_OK;
    }
    if (rc == HVL_OK) {
        int done = 0;
        return settle(e, ps, s, t, HVL_SETTLE_WAIT, &done, b->phases);   /* frees the ticket */
    }
    if (t) hvl__nccl_ticket_free(s, t);
    return fail_set(s, rc);
}

const hvl_backend hvl__backend_nccl = {
    .name = "nccl",
    .open = hvl__nccl_set_open,
    .close = hvl__nccl_set_close,
    .can_run = hvl__nccl_set_can_run,
    .prepare = hvl__nccl_set_prepare,
    .run_device = run_device,
    .settle = settle,
    .abandon = abandon,
};
