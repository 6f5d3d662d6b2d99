/* queue.c: the door into the engine. hvl_enqueue (any thread) checks a request, copies it into
 * an entry, and hands it to the bg thread through the queue; the bg thread drains the queue into
 * its pending map and finishes entries when their collective completes. The queue and the
 * in-flight name set are guarded by queue_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Checks that need the process set: it exists, this rank is a member, the root is one, and
 * alltoall splits match its size. *set_size gets its size. */
static int check_set(hvl_engine *e, const hvl_request *q, const char *name, int *set_size)
{
    int control = q->op == HVL_JOIN || q->op == HVL_PROCESS_SET_ADD || q->op == HVL_PROCESS_SET_REMOVE;
    if (control && q->process_set != 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "%s runs on every rank (process set 0), not on process set %d",
                         hvl__op_name(q->op), q->process_set);
    int my_rank = -1, root = -1;
    if (hvl__pset_lookup(e, q->process_set, set_size, &my_rank, q->root_rank, &root) != HVL_OK)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': process set %d does not exist (never added, "
                         "or removed)", name, q->process_set);
    if (my_rank < 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': this rank (%d) is not a member of process set %d; "
                         "only its members may run collectives on it", name, e->rank, q->process_set);
    if (q->op == HVL_BROADCAST && root < 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': root rank %d is not a member of process set %d",
                         name, q->root_rank, q->process_set);
    return HVL_OK;
}

/* add: ascending distinct ranks of the job; remove: an existing set other than 0. */
static int check_set_change(hvl_engine *e, const hvl_request *q)
{
    if (q->op == HVL_PROCESS_SET_REMOVE) {
        int size, rank;
        if (q->root_rank == 0) return hvl__fail(HVL_ERR_INVALID_ARG, "the global process set (0) cannot be removed");
        return hvl__pset_lookup(e, q->root_rank, &size, &rank, 0, NULL);
    }
    if (!q->splits || q->nsplits < 1)
        return hvl__fail(HVL_ERR_INVALID_ARG, "add_process_set: a process set needs at least one rank");
    for (int i = 0; i < q->nsplits; i++) {
        if (q->splits[i] < 0 || q->splits[i] >= e->size)
            return hvl__fail(HVL_ERR_INVALID_ARG, "add_process_set: rank %lld is not in [0, %d)", (long long)q->splits[i], e->size);
        if (i && q->splits[i] <= q->splits[i - 1])
            return hvl__fail(HVL_ERR_INVALID_ARG, "add_process_set: ranks must be ascending and distinct");
    }
    return HVL_OK;
}

static int check_request(hvl_engine *e, const hvl_request *q, int *set_size)
{
    const char *name = q->name ? q->name : "(null)";
    if (!q->name || !q->name[0]) return hvl__fail(HVL_ERR_INVALID_ARG, "a tensor name is required");
    if (q->op < 0 || q->op >= HVL_OP_COUNT)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown op %d", name, q->op);
    HVL_CHECK(check_set(e, q, name, set_size));
    if (q->op == HVL_PROCESS_SET_ADD || q->op == HVL_PROCESS_SET_REMOVE) return check_set_change(e, q);
    if (q->op == HVL_BARRIER || q->op == HVL_JOIN) return HVL_OK;
    if (q->dtype < 0 || q->dtype >= HVL_DTYPE_COUNT)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown dtype %d", name, q->dtype);
    if (q->ndim < 0 || q->ndim > HVL_MAX_DIMS)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': %d dimensions (at most %d)", name, q->ndim, HVL_MAX_DIMS);
    for (int i = 0; i < q->ndim; i++)
        if (q->shape[i] < 0) return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': negative dimension", name);
    int reducing = q->op == HVL_ALLREDUCE || q->op == HVL_REDUCESCATTER;
    if (reducing && (q->reduce_op < 0 || q->reduce_op >= HVL_REDUCE_COUNT))
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown reduce op %d", name, q->reduce_op);
    if (reducing && q->dtype == HVL_BOOL && (q->reduce_op == HVL_AVERAGE || q->prescale != 1.0 || q->postscale != 1.0))
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': bool tensors support Sum, Min, Max and Product without scaling", name);
    if ((q->op == HVL_ALLTOALL || q->op == HVL_REDUCESCATTER) && q->ndim == 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': %s needs at least one dimension", name, hvl__op_name(q->op));
    if (q->op == HVL_ALLTOALL) {
        if (!q->splits) {
            if (q->shape[0] % *set_size)
                return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': alltoall without splits needs dim 0 (%lld) divisible by size %d", name, (long long)q->shape[0], *set_size);
            return HVL_OK;
        }
        if (q->nsplits != *set_size)
            return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': %d splits for %d ranks", name, q->nsplits, *set_size);
        int64_t total = 0;
        for (int i = 0; i < q->nsplits; i++) {
            if (q->splits[i] < 0) return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': negative split", name);
            total += q->splits[i];
        }
        if (total != q->shape[0])
            return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': splits sum to %lld, dim 0 is %lld", name, (long long)total, (long long)q->shape[0]);
    }
    return HVL_OK;
}

/* The engine's name of a request: the caller's, qualified by its process set unless that is
 * set 0, so each set has its own namespace (as in Horovod) in every name-keyed table. */
static char *engine_name(const hvl_request *q)
{
    if (q->process_set == 0) return strdup(q->name);
    size_t n = strlen(q->name) + 40;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s [process set %d]", q->name, q->process_set);
    return s;
}

static hvl_entry *entry_new(const hvl_request *q, int set_size)
{
    hvl_entry *en = calloc(1, sizeof(*en));
    if (!en) return NULL;
    en->req = *q;
    en->name = engine_name(q);
    int control = q->op == HVL_BARRIER || q->op == HVL_JOIN || q->op == HVL_PROCESS_SET_ADD ||
                  q->op == HVL_PROCESS_SET_REMOVE;   /* no data */
    memcpy(en->shape, q->shape, sizeof(int64_t) * (size_t)(control ? 0 : q->ndim));
    if (control) {
        en->req.ndim = 0, en->req.dtype = HVL_UINT8, en->req.reduce_op = 0;
        en->req.root_rank = q->op == HVL_PROCESS_SET_REMOVE ? q->root_rank : 0;
    }
    int nsplits = q->op == HVL_ALLTOALL ? set_size : q->op == HVL_PROCESS_SET_ADD ? q->nsplits : 0;
    if (nsplits) {
        en->splits = malloc(sizeof(int64_t) * (size_t)nsplits);
        for (int i = 0; en->splits && i < nsplits; i++)
            en->splits[i] = q->splits ? q->splits[i] : q->shape[0] / set_size;
    }
    if (!en->name || (nsplits && !en->splits)) {
        free(en->name); free(en->splits); free(en);
        return NULL;
    }
    en->req.name = en->name;
    en->req.shape = en->shape;
    en->req.splits = en->splits;
    en->req.nsplits = nsplits;
    en->enqueued_at = hvl__now();
    return en;
}

static void entry_free(hvl_entry *en)
{
    free(en->name);
    free(en->splits);
    free(en);
}

int hvl_enqueue(const hvl_request *q, int64_t *handle_out)
{
    hvl_engine *e = &hvl__engine;
    if (!hvl_is_initialized()) return hvl__not_running();
    int set_size = 0;
    HVL_CHECK(check_request(e, q, &set_size));
    hvl_entry *en = entry_new(q, set_size);
    if (!en) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory enqueuing '%s'", q->name);
    int rc = HVL_OK;
    pthread_mutex_lock(&e->queue_lock);
    if (!e->running)
        rc = hvl__fail(HVL_ERR_SHUT_DOWN, "hvlite has been shut down (a rank called shutdown() or the engine failed); cannot run '%s'", q->name);
    else if (hvl__strmap_get(&e->inflight, en->name))
        rc = hvl__fail(HVL_ERR_INVALID_ARG, "tensor name '%s' is already in flight on this rank; names must be unique among pending requests", q->name);
    else if ((rc = hvl__strmap_put(&e->inflight, en->name, en)) != HVL_OK)
        hvl__fail(rc, "out of memory");
    else if ((rc = hvl__handle_new(&en->handle)) != HVL_OK) {
        hvl__strmap_del(&e->inflight, en->name);
        hvl__fail(rc, "out of memory allocating a handle");
    }
    if (rc == HVL_OK) {
        /* Only the first request of a burst wakes the bg thread: it drains the whole queue,
         * and it checks the queue under this lock before it sleeps, so no wake-up is lost. */
        if (!e->queue_head && !e->bursts) pthread_cond_signal(&e->wake_cond);
        if (e->queue_tail) e->queue_tail->next = en; else e->queue_head = en;
        e->queue_tail = en;
        *handle_out = en->handle;
        hvl__count(&e->counters.tensors_submitted, 1);
    }
    pthread_mutex_unlock(&e->queue_lock);
    if (rc != HVL_OK) entry_free(en);
    return rc;
}

int hvl__queue_drain(hvl_engine *e)
{
    pthread_mutex_lock(&e->queue_lock);
    hvl_entry *en = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    pthread_mutex_unlock(&e->queue_lock);
    int rc = HVL_OK, tl = hvl__tl_active();
    for (hvl_entry *next; en; en = next) {
        next = en->next;
        if (tl) hvl__tl_submitted(en);
        if (rc == HVL_OK) rc = hvl__strmap_put(&e->pending, en->name, en);
        if (en->req.op == HVL_JOIN) e->joined = 1;
        en->prev_pending = e->pending_tail;
        en->next_pending = NULL;
        if (e->pending_tail) e->pending_tail->next_pending = en; else e->pending_head = en;
        e->pending_tail = en;
    }
    return rc;
}

static void synthetic_free(hvl_entry *en, hvl_outcome *o)
{
    free((void *)en->req.input);
    free(en->req.output);
    free(o->message);
    hvl_buffer_free(o->result);
    free(o->recv_splits);
    entry_free(en);
}

hvl_entry *hvl__entry_synthesize(hvl_engine *e, const hvl_response *r)
{
    const hvl_pset *ps = hvl__pset(e, r->process_set);
    hvl_entry *en = calloc(1, sizeof(*en));
    if (!en || !(en->name = strdup(r->name))) { free(en); return NULL; }
    en->synthetic = 1;
    memcpy(en->shape, r->shape, sizeof(int64_t) * (size_t)r->ndim);
    int gathers = r->op == HVL_ALLGATHER || r->op == HVL_ALLTOALL;
    if (gathers && r->ndim > 0) en->shape[0] = 0;                 /* contributes no rows */
    hvl_request q = {r->op, r->dtype, r->reduce_op, r->root_rank, r->process_set, r->ndim, en->name, en->shape,
                     NULL, NULL, r->prescale, r->postscale, NULL, 0};
    int64_t bytes = hvl__request_bytes(&q);
    int64_t out_bytes = r->op == HVL_REDUCESCATTER && r->ndim
        ? bytes / (en->shape[0] ? en->shape[0] : 1) * hvl_reducescatter_rows(en->shape[0], ps->rank, ps->size)
        : bytes;
    void *in = calloc((size_t)bytes + 1, 1), *out = gathers ? NULL : calloc((size_t)out_bytes + 1, 1);
    if (r->op == HVL_ALLTOALL) en->splits = calloc((size_t)ps->size, sizeof(int64_t));
    q.input = in;
    q.output = out;
    q.splits = en->splits;
    q.nsplits = r->op == HVL_ALLTOALL ? ps->size : 0;
    en->req = q;
    if (!in || (!gathers && !out) || (r->op == HVL_ALLTOALL && !en->splits)) {
        hvl_outcome none = {0};
        synthetic_free(en, &none);
        return NULL;
    }
    return en;
}

void hvl__entry_finish(hvl_engine *e, hvl_entry *en, hvl_outcome *o)
{
    if (en->synthetic) { synthetic_free(en, o); return; }
    hvl__strmap_del(&e->pending, en->name);
    if (en->prev_pending) en->prev_pending->next_pending = en->next_pending; else e->pending_head = en->next_pending;
    if (en->next_pending) en->next_pending->prev_pending = en->prev_pending; else e->pending_tail = en->prev_pending;
    pthread_mutex_lock(&e->queue_lock);
    hvl__strmap_del(&e->inflight, en->name);
    pthread_mutex_unlock(&e->queue_lock);
    hvl__count(&e->counters.tensors_done, 1);   /* before the waiter can wake and read it */
    hvl__handle_complete(en->handle, o);
    entry_free(en);
}

void hvl__entries_fail_all(hvl_engine *e, int status, const char *message)
{
    pthread_mutex_lock(&e->queue_lock);
    e->running = 0;
    hvl_entry *queued = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    hvl__count(&e->counters.tensors_done, (int64_t)e->inflight.count);
    for (size_t i = 0; i < e->inflight.cap; i++)
        if (hvl__strmap_live(&e->inflight, i)) entry_free(e->inflight.slots[i].value);
    hvl__strmap_free(&e->inflight);
    pthread_mutex_unlock(&e->queue_lock);
    (void)queued;   /* every queued entry is also in the in-flight set, freed above */
    hvl__strmap_free(&e->pending);
    e->pending_head = e->pending_tail = NULL;
    hvl__handles_fail_all(status, message);
}

int64_t hvl_submit(int op, int dtype, int reduce_op, int root_rank, int process_set,
                   const char *name, int ndim, const int64_t *shape, const void *input,
                   void *output, double prescale, double postscale, const int64_t *splits,
                   int nsplits)
{
    hvl_request q = {op, dtype, reduce_op, root_rank, process_set, ndim, name, shape,
                     input, output, prescale, postscale, splits, nsplits};
    int64_t handle = 0;
    int rc = hvl_enqueue(&q, &handle);
    return rc == HVL_OK ? handle : -rc;
}

void hvl_burst_begin(void)
{
    hvl_engine *e = &hvl__engine;
    pthread_mutex_lock(&e->queue_lock);
    e->bursts++;
    pthread_mutex_unlock(&e->queue_lock);
}

void hvl_burst_end(void)
{
    hvl_engine *e = &hvl__engine;
    pthread_mutex_lock(&e->queue_lock);
    if (e->bursts > 0 && --e->bursts == 0 && e->queue_head) pthread_cond_signal(&e->wake_cond);
    pthread_mutex_unlock(&e->queue_lock);
}
