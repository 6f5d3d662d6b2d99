/* stage.c: the staged path of device memory. A batch of CUDA tensors that no plane runs on the
 * device goes through page-locked host memory: each device input is copied to the host on the
 * engine's stream of its device, after the event the framework recorded when it submitted the
 * tensor (stream order; never a device-wide synchronise), the entries' pointers are swapped for
 * their host copies so the host planes and the scale loops see only host memory, and after the
 * collective the results are copied back on the same stream. Both waits poll an event on the
 * engine's stream, bounded by the peer timeout and the shutdown and fatal flags.
 *
 * Agreement: a failed copy to the host would leave the other members waiting in the collective,
 * so the members agree on the stage-in (hvl__agree) and fail the batch alike (this rank keeps its
 * own error's status and message). The copy back runs after the collective; a failure there is
 * this rank's alone (fatal to its engine).
 * Owns the pinned staging buffer (e->stage_buf), and those it outgrew (e->stage_retired, freed
 * at the end). It is only freed or reused when no copy can still touch it: every batch waits
 * for its copies, and after an error with copies queued the
 * copies are waited for (bounded); when that wait gives up too (a kernel before them hangs), the
 * buffer is abandoned to them (never freed: a leak rather than memory written after its free).
 * Entries whose buffers are host memory (a joined rank's stand-ins) are left as they are.
 * Nothing here reads or writes device memory itself. bg thread only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_driver.h"
#include "stage.h"

#define STAGE_ALIGN 64
#define STAGE_MIN (1 << 20)          /* pinned allocations are slow: grow in large steps */

static int64_t aligned(int64_t n) { return (n + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* Bytes of an entry's output kept apart from its input in the pinned buffer: this rank's rows
 * for reducescatter; 0 for allreduce and broadcast (staged in place) and where the engine owns
 * the result (allgather, alltoall). */
static int64_t separate_output_bytes(const hvl_batch *b, const hvl_entry *en)
{
    if (b->op != HVL_REDUCESCATTER) return 0;
    return hvl_reducescatter_rows(en->d.shape[0], b->ps->rank, b->ps->size) * hvl__row_bytes(en);
}

/* Bytes copied back to the caller's device output: the whole tensor for allreduce and
 * broadcast (but an in-place broadcast's root, whose tensor is unchanged), this rank's rows for
 * reducescatter, nothing where the engine owns the result. */
static int64_t result_bytes(const hvl_engine *e, const hvl_batch *b, const hvl_entry *en,
                            const hvl_stage_saved *saved)
{
    switch (b->op) {
    case HVL_ALLREDUCE: return hvl__desc_bytes(&en->d);
    case HVL_BROADCAST:
        return e->rank == b->root_rank && saved->output == saved->input ? 0 : hvl__desc_bytes(&en->d);
    case HVL_REDUCESCATTER: return separate_output_bytes(b, en);
    default: return 0;
    }
}

/* Gives the pinned buffer up to copies that may still be queued on it: never freed or reused.
 * The stream is stuck behind them, so later batches are refused at once (not each after its own
 * timeout, leaking a buffer each). */
static void abandon(hvl_engine *e)
{
    e->stage_stuck = 1;
    hvl__cuda_stuck();
    if (e->stage_buf)
        hvl__log_once("stage abandoned", HVL_LOG_WARNING, "a GPU copy of the staged path did not "
                      "finish; its page-locked buffer (%lld bytes) is left to it, not freed",
                      (long long)e->stage_cap);
    e->stage_buf = NULL;
    e->stage_cap = 0;
}

/* Room in the pinned buffer: grown (never shrunk) to the next power of 2 from STAGE_MIN. The old
 * buffer is idle (see the file note) but not freed until hvl__stage_free: freeing page-locked
 * memory waits for the whole device, the framework's streams included, with no bound (and a
 * kernel there may wait on a peer that waits on this rank). Retired buffers add up to less than
 * the current one. `dev`: a device whose context makes the allocation. */
static int reserve(hvl_engine *e, int dev, int64_t need)
{
    if (need <= e->stage_cap) return HVL_OK;
    int64_t cap = e->stage_cap > STAGE_MIN ? e->stage_cap : STAGE_MIN;
    while (cap < need) cap *= 2;
    void *buf;
    HVL_CHECK(hvl__cuda_host_alloc(dev, &buf, cap));   /* failed: the current one serves on */
    if (e->stage_buf) {
        *(void **)e->stage_buf = e->stage_retired;
        e->stage_retired = e->stage_buf;
    }
    e->stage_buf = buf;
    e->stage_cap = cap;
    return HVL_OK;
}

/* Whether the GPU got where a wait waits for: *done = 1 once it did (never waits). */
typedef int (*reached_fn)(const void *what, int *done);

static int marks_reached(const void *what, int *done)     /* what: the uint64_t devices */
{
    uint64_t devices = *(const uint64_t *)what;
    *done = 1;
    for (int d = 0; d < 64 && *done; d++)
        if (devices >> d & 1) HVL_CHECK(hvl__cuda_mark_reached(d, done));
    return HVL_OK;
}

/* Polls `reached` until the GPU got there, bounded like every wait on peers (the peer timeout,
 * the shutdown and fatal flags). */
static int wait_gpu(hvl_engine *e, const hvl_batch *b, const char *what, reached_fn reached, const void *arg)
{
    hvl_bound bound = hvl__peer_bound(e);
    double start = hvl__now(), nap_s = 2e-6;
    for (;;) {
        int done = 0;
        HVL_CHECK(reached(arg, &done));
        if (done) return HVL_OK;
        double waited = hvl__now() - start;
        if (bound.timeout_s > 0 && waited > bound.timeout_s)
            return hvl__fail(HVL_ERR_TIMEOUT, "%s of tensor '%s': the GPU did not get there in %.0f s "
                             "(HVLITE_PEER_TIMEOUT_SECONDS): a kernel before it on the framework's "
                             "stream still runs or hangs", what, b->entries[0]->d.name, waited);
        HVL_CHECK(hvl__bound_flags(&bound, waited, what));
        hvl__nap(&nap_s, 100e-6);    /* copies take microseconds to milliseconds: short naps */
    }
}

/* Marks the engine stream's end on every device in `devices` and waits until each reached it. */
static int wait_devices(hvl_engine *e, uint64_t devices, const hvl_batch *b, const char *what)
{
    for (int d = 0; d < 64; d++)
        if (devices >> d & 1) HVL_CHECK(hvl__cuda_mark(d));
    return wait_gpu(e, b, what, marks_reached, &devices);
}

/* Waits for the batch's copies; if the wait gives up, they may still run: abandon the buffer. */
static int finish_copies(hvl_engine *e, uint64_t devices, const hvl_batch *b, const char *what)
{
    int rc = devices ? wait_devices(e, devices, b, what) : HVL_OK;
    if (rc != HVL_OK) abandon(e);
    return rc;
}

/* After error rc with copies already queued: wait for them (bounded) before the caller lets go
 * of the memory they touch, then return rc with its own message. */
static int settle(hvl_engine *e, uint64_t devices, const hvl_batch *b, int rc)
{
    char why[1024];
    snprintf(why, sizeof(why), "%s", hvl_last_error());
    finish_copies(e, devices, b, "finishing the copies queued before an error");
    return hvl__fail(rc, "%s", why);
}

/* The rank's stream is stuck behind copies that never finished (abandon): nothing more is staged. */
static int refuse_stuck(const hvl_batch *b)
{
    return hvl__fail(HVL_ERR_CUDA, "tensor '%s': CUDA tensors cannot be staged through host memory on "
                     "this rank any more: an earlier copy on hvlite's GPU stream never finished (a kernel "
                     "before it on the framework's stream hangs?)", b->entries[0]->d.name);
}

/* Every member agrees on the stage-in before anyone enters the collective; a failure fails the
 * batch on every member, this rank keeping its own error (mine, with its message) where it had one. */
static int agree(hvl_engine *e, hvl_batch *b, int mine)
{
    char why[1024] = "";
    if (mine != HVL_OK) snprintf(why, sizeof(why), "%s", hvl_last_error());
    int rc = hvl__agree(b->ps->comm, mine, "staging CUDA tensors through host memory",
                        &b->failed_everywhere, hvl__peer_bound(e));
    if (rc != HVL_OK && mine != HVL_OK && b->failed_everywhere)
        return hvl__fail(mine, "%s", why);             /* this rank's own error, as it was */
    return rc;
}

/* Copies this rank's device inputs into the pinned buffer and points the entries at the copies
 * (the caller's pointers are kept in st). */
static int copy_in(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    int64_t need = 0;
    int first = -1, rc = HVL_OK;
    for (int i = 0; i < b->count; i++) {
        const hvl_entry *en = b->entries[i];
        if (en->device < 0) continue;
        need += aligned(hvl__desc_bytes(&en->d)) + aligned(separate_output_bytes(b, en));
        if (first < 0) first = en->device;
    }
    if (need == 0) return HVL_OK;
    if (e->stage_stuck) return refuse_stuck(b);
    HVL_CHECK(reserve(e, first, need));
    char *at = e->stage_buf;
    for (int i = 0; i < b->count; i++) {
        hvl_entry *en = b->entries[i];
        if (en->device < 0) continue;
        int64_t in_bytes = hvl__desc_bytes(&en->d), out_bytes = separate_output_bytes(b, en);
        int sends = b->op != HVL_BROADCAST || e->rank == b->root_rank;   /* others only receive */
        st->saved[i] = (hvl_stage_saved){en->input, en->output, 1};
        HVL_CHECK_GOTO(en->ready_event ? hvl__cuda_wait_event(en->device, en->ready_event)
                                       : hvl__cuda_use(en->device), rc, failed);
        st->devices |= 1ull << en->device;      /* its stream is usable: wait for it from here on */
        if (sends && in_bytes > 0)
            HVL_CHECK_GOTO(hvl__cuda_copy_to_host(en->device, at, en->input, in_bytes), rc, failed);
        en->input = at;
        en->output = b->op == HVL_REDUCESCATTER ? at + aligned(in_bytes)
                     : b->op == HVL_ALLREDUCE || b->op == HVL_BROADCAST ? at : NULL;
        at += aligned(in_bytes) + aligned(out_bytes);
    }
    return finish_copies(e, st->devices, b, "copying to host memory");
failed:
    return settle(e, st->devices, b, rc);
}

int hvl__stage_in(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    memset(st, 0, sizeof(*st));
    st->saved = calloc((size_t)b->count, sizeof(*st->saved));
    return agree(e, b, st->saved ? copy_in(e, b, st) : hvl__oom("staging pointers"));
}

/* ---- pieces ---- */

static int piece_reached(const void *what, int *done)    /* what: the hvl_stage, its next piece */
{
    const hvl_stage *st = what;
    return hvl__cuda_event_reached(st->device, st->events[st->reached], done);
}

/* Records the events of the pieces that lie wholly below flat byte `upto`. */
static int record_pieces(const hvl_batch *b, hvl_stage *st, int64_t upto, int *recorded)
{
    while (st->events && *recorded < st->npieces) {
        int64_t end = (int64_t)(*recorded + 1) * st->piece_bytes;
        if ((end < b->bytes ? end : b->bytes) > upto) break;
        HVL_CHECK(hvl__cuda_event_record(st->device, st->events[(*recorded)++]));
    }
    return HVL_OK;
}

/* Packs the batch into st->flat (device inputs by copies queued on the engine's streams, a
 * joined rank's stand-ins by memcpy), split at piece boundaries, an event after each piece
 * where every device input is on one device (else the first wait waits for every copy). */
static int copy_in_pieces(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    int first = -1, one_device = 1, recorded = 0, rc = HVL_OK;
    int64_t at = 0, piece = st->piece_bytes;
    for (int i = 0; i < b->count; i++) {
        const hvl_entry *en = b->entries[i];
        at += hvl__desc_bytes(&en->d);
        if (en->device < 0) continue;
        if (first < 0) first = en->device;
        one_device &= en->device == first;
    }
    if (at != b->bytes)
        return hvl__fail(HVL_ERR_SYSTEM, "tensor '%s': the batch holds %lld bytes here, %lld agreed (an "
                         "hvlite bug: please report it)", b->entries[0]->d.name, (long long)at, (long long)b->bytes);
    if (first < 0) {                /* only a joined rank's stand-ins: host memory */
        HVL_CHECK(hvl__grow(&e->fusion_buf, &e->fusion_cap, b->bytes));
        st->flat = e->fusion_buf;
    } else {
        if (e->stage_stuck) return refuse_stuck(b);
        HVL_CHECK(reserve(e, first, b->bytes));
        st->flat = e->stage_buf;
    }
    if (first >= 0 && one_device) {
        if (!(st->events = calloc((size_t)st->npieces, sizeof(void *)))) return hvl__oom("staged pieces' events");
        st->device = first;
        for (int k = 0; k < st->npieces; k++) HVL_CHECK(hvl__cuda_event_new(first, 0, &st->events[k]));
    }
    at = 0;
    for (int i = 0; i < b->count; i++) {
        hvl_entry *en = b->entries[i];
        int64_t bytes = hvl__desc_bytes(&en->d);
        if (en->device < 0) {
            if (bytes > 0) memcpy(st->flat + at, en->input, (size_t)bytes);
            at += bytes;
            continue;
        }
        HVL_CHECK_GOTO(en->ready_event ? hvl__cuda_wait_event(en->device, en->ready_event)
                                       : hvl__cuda_use(en->device), rc, failed);
        st->devices |= 1ull << en->device;      /* its stream is usable: wait for it from here on */
        st->queued = 1;
        for (int64_t done = 0; done < bytes;) {
            int64_t n = (at / piece + 1) * piece - at;     /* to the end of this piece */
            if (n > bytes - done) n = bytes - done;
            HVL_CHECK_GOTO(hvl__cuda_copy_to_host(en->device, st->flat + at, (const char *)en->input + done, n),
                           rc, failed);
            done += n;
            at += n;
            HVL_CHECK_GOTO(record_pieces(b, st, at, &recorded), rc, failed);
        }
    }
    HVL_CHECK_GOTO(record_pieces(b, st, at, &recorded), rc, failed);   /* those of stand-ins at the end */
    return HVL_OK;
failed:
    rc = settle(e, st->devices, b, rc);
    st->queued = 0;
    return rc;
}

int hvl__stage_in_pieces(hvl_engine *e, hvl_batch *b, hvl_stage *st, int64_t piece_bytes)
{
    memset(st, 0, sizeof(*st));
    st->piece_bytes = piece_bytes;
    st->npieces = (int)((b->bytes + piece_bytes - 1) / piece_bytes);
    return agree(e, b, copy_in_pieces(e, b, st));     /* on copies queued, not done */
}

int hvl__stage_piece_wait(hvl_engine *e, const hvl_batch *b, hvl_stage *st, int k)
{
    if (k < st->reached) return HVL_OK;
    int rc = HVL_OK;
    if (!st->events) {              /* several devices, or none: every copy at the first piece */
        rc = st->devices ? wait_devices(e, st->devices, b, "copying to host memory") : HVL_OK;
        if (rc == HVL_OK) st->reached = st->npieces;
    }
    while (rc == HVL_OK && st->reached <= k) {
        rc = wait_gpu(e, b, "copying to host memory", piece_reached, st);
        if (rc == HVL_OK) st->reached++;
    }
    if (rc != HVL_OK) {             /* copies may still write the buffer: give it up to them */
        abandon(e);
        st->queued = 0;
    }
    return rc;
}

/* Queues the copies back of flat bytes [from, to), entry by entry (the cursor goes forward). */
static int copy_back(const hvl_batch *b, hvl_stage *st, int64_t from, int64_t to)
{
    for (; st->back_entry < b->count; st->back_entry++) {
        const hvl_entry *en = b->entries[st->back_entry];
        int64_t bytes = hvl__desc_bytes(&en->d), lo = st->back_at > from ? st->back_at : from;
        int64_t hi = st->back_at + bytes < to ? st->back_at + bytes : to;
        if (en->device >= 0 && hi > lo) {   /* a stand-in's result is dropped: nothing to copy */
            st->queued = 1;
            HVL_CHECK(hvl__cuda_copy_to_device(en->device, (char *)en->output + (lo - st->back_at),
                                               st->flat + lo, hi - lo));
        }
        if (st->back_at + bytes > to) break;     /* the entry goes on in the next piece */
        st->back_at += bytes;
    }
    return HVL_OK;
}

/* Copies back are queued only once every copy to the host is known done: were a later piece's
 * wait to give up, copies back already queued would write the caller's tensors after its handle
 * failed. (On one stream they could not run before those copies anyway.) A failure to queue one
 * is kept for hvl__stage_out, and the pieces go on, so every member still makes every call. */
void hvl__stage_piece_back(const hvl_batch *b, hvl_stage *st, int k)
{
    st->reduced = k + 1;
    if (st->reached < st->npieces && st->events) {   /* every copy to the host done? look, never wait */
        int done = 0;
        if (hvl__cuda_event_reached(st->device, st->events[st->npieces - 1], &done) != HVL_OK || !done) return;
        st->reached = st->npieces;
    }
    if (st->back_rc != HVL_OK) return;
    int64_t from = st->backed * st->piece_bytes, to = (int64_t)st->reduced * st->piece_bytes;
    if (to > b->bytes) to = b->bytes;
    st->back_rc = copy_back(b, st, from, to);
    if (st->back_rc != HVL_OK) snprintf(st->back_why, sizeof(st->back_why), "%s", hvl_last_error());
    st->backed = st->reduced;
}

int hvl__stage_out(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    int rc = HVL_OK;
    if (st->flat) {                 /* pieces: they queued the copies back */
        rc = finish_copies(e, st->devices, b, "copying back to the GPU");
        st->queued = 0;             /* done, or given up (the buffer abandoned) */
        if (st->back_rc != HVL_OK) return hvl__fail(st->back_rc, "%s", st->back_why);
        return rc;
    }
    for (int i = 0; st->saved && i < b->count; i++) {
        hvl_entry *en = b->entries[i];
        int64_t bytes = st->saved[i].staged ? result_bytes(e, b, en, &st->saved[i]) : 0;
        if (bytes > 0)
            HVL_CHECK_GOTO(hvl__cuda_copy_to_device(en->device, st->saved[i].output, en->output, bytes),
                           rc, failed);
    }
    return finish_copies(e, st->devices, b, "copying back to the GPU");
failed:
    return settle(e, st->devices, b, rc);
}

void hvl__stage_end(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    if (st->queued)                 /* pieces stopped by an error: copies may still run */
        settle(e, st->devices, b, hvl__last_status());   /* the caller's error keeps its message */
    for (int i = 0; st->saved && i < b->count; i++) {
        if (!st->saved[i].staged) continue;
        b->entries[i]->input = st->saved[i].input;
        b->entries[i]->output = st->saved[i].output;
    }
    for (int k = 0; st->events && k < st->npieces; k++) hvl__cuda_event_free(st->device, st->events[k], 0);
    free(st->events);
    free(st->saved);
    memset(st, 0, sizeof(*st));
}

void hvl__stage_free(hvl_engine *e)
{
    hvl__cuda_host_free(e->stage_buf);     /* idle, or already abandoned (NULL) */
    e->stage_buf = NULL;
    e->stage_cap = 0;
    while (e->stage_retired && !e->stage_stuck) {   /* stuck: a free would wait on the hung GPU */
        void *next = *(void **)e->stage_retired;
        hvl__cuda_host_free(e->stage_retired);
        e->stage_retired = next;
    }
    hvl__cuda_release();
}

int hvl_cuda_built(void) { return 1; }   /* the staged path serves CUDA buffers on every plane */
int hvl_cuda_loaded(void) { return hvl__cuda_loaded(); }
