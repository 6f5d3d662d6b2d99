/* queue.c: the door into the engine, and the life of an entry. hvl_enqueue (any thread) checks a
 * request, copies it into an entry, and hands it to the bg thread through the queue; the bg
 * thread drains the queue into its pending map, pairs agreed responses with entries (claim) and
 * finishes entries when their collective completes (hvl__entry_finish, the one completion call).
 * A request's name stays taken (the taken-name set) from hvl_enqueue until the caller releases
 * its handle (hvl_release, any thread), not only until it completes, as Horovod keeps a name
 * until its handle is synchronized: a second request of the same name fails on every rank that
 * submits it before releasing the first, however fast the first one completed. The queue is
 * guarded by queue_lock; the taken-name set, which lives as long as the process (like the
 * handle table) and is emptied when an engine stops, by names_lock (lock order: queue_lock,
 * names_lock, handle_lock). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_driver.h"
#include "cycle.h"
#include "kernels.h"
#include "timeline.h"

/* Bursts (hvl_burst_begin/end) belong to the calling thread. The queue holds a burst's requests
 * until it ends, so the bg thread takes the group in one drain and negotiates (and fuses) it
 * together, however slowly the group is submitted or however the cycles fall. The hold is
 * bounded, so a thread that waits on its own request inside a burst is delayed, not hung. */
#define BURST_HOLD_S 0.25
static _Thread_local int burst_depth;         /* nesting: the outermost begin/end count */
static _Thread_local uint64_t burst_id;       /* this thread's open burst */
static _Thread_local double burst_began;
static uint64_t burst_count;                  /* atomic: burst ids, unique in the process */

/* queue_lock held: signals the bg thread once between two drains. */
static void wake(hvl_engine *e)
{
    if (e->wake_sent) return;
    e->wake_sent = 1;
    pthread_cond_signal(&e->wake_cond);
}

/* Checks that need the process set: it exists, this rank is a member, the root is one, and
 * alltoall splits match its size. *set_size gets its size. */
static int check_set(hvl_engine *e, const hvl_request *q, const char *name, int *set_size)
{
    if (hvl__op_is(q->op, HVL_OPF_WHOLE_JOB) && q->process_set != 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "%s runs on every rank (process set 0), not on process set %d",
                         hvl__op_name(q->op), q->process_set);
    int my_rank = -1, root = -1;
    if (hvl__pset_lookup(e, q->process_set, set_size, &my_rank, q->root_rank, &root) != HVL_OK)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': process set %d does not exist (never added, "
                         "or removed)", name, q->process_set);
    if (my_rank < 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': this rank (%d) is not a member of process set %d; "
                         "only its members may run collectives on it", name, e->rank, q->process_set);
    if (hvl__op_is(q->op, HVL_OPF_ROOTED) && root < 0)
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

/* Adasum runs where Horovod runs it: allreduce of float16/32/64 over a power-of-2 set. */
static int check_adasum(const hvl_request *q, const char *name, int set_size)
{
    if (q->op != HVL_ALLREDUCE)
        return hvl__fail(HVL_ERR_UNSUPPORTED, "tensor '%s': %s does not support Adasum (only "
                         "allreduce does)", name, hvl__op_name(q->op));
    if (!hvl__adasum_dtype_ok(q->dtype))
        return hvl__fail(HVL_ERR_UNSUPPORTED, "tensor '%s': Adasum reduces float16, float32 and "
                         "float64 tensors, not %s", name, hvl__dtype_name(q->dtype));
    if (set_size & (set_size - 1))
        return hvl__fail(HVL_ERR_UNSUPPORTED, "tensor '%s': Adasum needs a power-of-2 number of "
                         "ranks; process set %d has %d", name, q->process_set, set_size);
    return HVL_OK;
}

/* Host memory, or a CUDA device this process can use: the first CUDA request loads the driver
 * (here, on the caller's thread, so that a machine without one fails at submit). */
static int check_memory(const hvl_request *q, const char *name)
{
    if (q->memory == HVL_MEMORY_HOST) return HVL_OK;
    if (q->memory != HVL_MEMORY_CUDA)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown memory kind %d", name, q->memory);
    if (q->device < 0 || q->device >= HVL_CUDA_MAX_DEVICES)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': CUDA device %d (hvlite handles 0 to %d)",
                         name, q->device, HVL_CUDA_MAX_DEVICES - 1);
    if (hvl__cuda_load() == HVL_OK) return HVL_OK;
    char why[512];              /* the message is rewritten below: copy it first */
    snprintf(why, sizeof(why), "%s", hvl_last_error());
    return hvl__fail(HVL_ERR_CUDA, "tensor '%s' is in CUDA memory, but %s", name, why);
}

static int check_request(hvl_engine *e, const hvl_request *q, int *set_size)
{
    const char *name = q->name ? q->name : "(null)";
    if (!q->name || !q->name[0]) return hvl__fail(HVL_ERR_INVALID_ARG, "a tensor name is required");
    if (q->op < 0 || q->op >= HVL_OP_COUNT)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown op %d", name, q->op);
    HVL_CHECK(check_set(e, q, name, set_size));
    if (q->op == HVL_PROCESS_SET_ADD || q->op == HVL_PROCESS_SET_REMOVE) return check_set_change(e, q);
    if (!hvl__op_is(q->op, HVL_OPF_DATA)) return HVL_OK;
    if (q->dtype < 0 || q->dtype >= HVL_DTYPE_COUNT)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown dtype %d", name, q->dtype);
    if (q->ndim < 0 || q->ndim > HVL_MAX_DIMS)
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': %d dimensions (at most %d)", name, q->ndim, HVL_MAX_DIMS);
    for (int i = 0; i < q->ndim; i++)
        if (q->shape[i] < 0) return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': negative dimension", name);
    HVL_CHECK(check_memory(q, name));
    int reducing = hvl__op_is(q->op, HVL_OPF_REDUCES);
    if (reducing && (q->reduce_op < 0 || q->reduce_op >= HVL_REDUCE_COUNT))
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor '%s': unknown reduce op %d", name, q->reduce_op);
    if (reducing && q->reduce_op == HVL_ADASUM) HVL_CHECK(check_adasum(q, name, *set_size));
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

/* The request as an entry: its description (what the ranks agree on) and buffers. Ops without
 * data describe no dtype or shape, so every rank's requests for them compare equal. */
static hvl_entry *entry_new(const hvl_request *q, int set_size)
{
    hvl_entry *en = calloc(1, sizeof(*en));
    if (!en) return NULL;
    int data = hvl__op_is(q->op, HVL_OPF_DATA), reduces = hvl__op_is(q->op, HVL_OPF_REDUCES);
    en->d = (hvl_desc){.op = q->op, .dtype = data ? q->dtype : HVL_UINT8,
                       .reduce_op = reduces ? q->reduce_op : 0,
                       .root_rank = hvl__op_is(q->op, HVL_OPF_ROOTED) ? q->root_rank : 0,
                       .process_set = q->process_set,
                       .target_set = q->op == HVL_PROCESS_SET_REMOVE ? q->root_rank : 0,
                       .ndim = data ? q->ndim : 0, .prescale = reduces ? q->prescale : 1.0,
                       .postscale = reduces ? q->postscale : 1.0,
                       .memory = data ? q->memory : HVL_MEMORY_HOST, .device = -1, .set_device = -1,
                       .name = engine_name(q)};
    memcpy(en->d.shape, q->shape, sizeof(int64_t) * (size_t)en->d.ndim);
    en->input = q->input;
    en->output = q->output;
    int cuda = en->d.memory == HVL_MEMORY_CUDA;
    en->device = en->d.device = cuda ? q->device : -1;
    en->ready_event = cuda ? q->ready_event : NULL;
    en->nsplits = q->op == HVL_ALLTOALL ? set_size : q->op == HVL_PROCESS_SET_ADD ? q->nsplits : 0;
    if (en->nsplits) {
        en->splits = malloc(sizeof(int64_t) * (size_t)en->nsplits);
        for (int i = 0; en->splits && i < en->nsplits; i++)
            en->splits[i] = q->splits ? q->splits[i] : q->shape[0] / set_size;
    }
    if (!en->d.name || (en->nsplits && !en->splits)) {
        free(en->d.name); free(en->splits); free(en);
        return NULL;
    }
    en->enqueued_at = hvl__now();
    return en;
}

static void entry_free(hvl_entry *en)
{
    free(en->d.name);
    free(en->splits);
    free(en);
}

/* A taken name: the key of `names` is `name`, the value this record (owned by the set). */
typedef struct {
    int64_t handle;             /* the request that holds the name */
    char name[];                /* its engine name */
} name_hold;

static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static hvl_strmap names;        /* names_lock: engine name -> name_hold */

/* Takes `name` for a new request (names_lock held): HVL_ERR_INVALID_ARG if it is taken,
 * HVL_ERR_NO_MEMORY if it cannot; *hold: the record, whose handle the caller sets. */
static int take_name(const char *name, const char *callers_name, int rank, name_hold **hold)
{
    *hold = NULL;
    if (hvl__strmap_get(&names, name))
        return hvl__fail(HVL_ERR_INVALID_ARG, "tensor name '%s' is already in flight on this rank (%d): a request "
                         "of that name has not been synchronized yet (its handle waited on or released); "
                         "names must be unique among requests not yet synchronized", callers_name, rank);
    size_t n = strlen(name) + 1;
    name_hold *h = malloc(sizeof(*h) + n);
    if (!h) return hvl__oom("the taken-name set");
    h->handle = 0;
    memcpy(h->name, name, n);
    int rc = hvl__strmap_put(&names, h->name, h);
    if (rc != HVL_OK) free(h);
    *hold = rc == HVL_OK ? h : NULL;
    return rc;
}

/* Frees `name` for new requests if `handle` still holds it (names_lock held): a handle of an
 * engine that has stopped since holds nothing in the set. */
static void drop_name(const char *name, int64_t handle)
{
    name_hold *h = hvl__strmap_get(&names, name);
    if (h && h->handle == handle) free(hvl__strmap_del(&names, name));
}

static void names_clear(void)
{
    pthread_mutex_lock(&names_lock);
    for (size_t i = 0; i < names.cap; i++)
        if (hvl__strmap_live(&names, i)) free(names.slots[i].value);
    hvl__strmap_free(&names);
    pthread_mutex_unlock(&names_lock);
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
    name_hold *hold = NULL;
    pthread_mutex_lock(&e->queue_lock);
    if (!e->running) {
        rc = hvl__fail(HVL_ERR_SHUT_DOWN, "hvlite has been shut down (a rank called shutdown() or the engine failed); cannot run '%s'", q->name);
    } else {
        pthread_mutex_lock(&names_lock);
        if ((rc = take_name(en->d.name, q->name, e->rank, &hold)) != HVL_OK)
            ;   /* its message is set */
        else if ((rc = hvl__handle_new(&en->handle, en->d.name)) != HVL_OK)
            free(hvl__strmap_del(&names, en->d.name));
        else
            hold->handle = en->handle;
        pthread_mutex_unlock(&names_lock);
    }
    if (rc == HVL_OK) {
        en->burst = en->group = burst_depth ? burst_id : 0;
        en->burst_began = burst_began;
        /* A burst's requests wait for its end, which wakes the bg thread; another request wakes
         * it unless that was done since its last drain. It checks the queue under this lock
         * before it sleeps, so no wake-up is lost. */
        if (!en->burst || en->burst_began + BURST_HOLD_S <= hvl__now()) wake(e);   /* not held */
        if (e->queue_tail) e->queue_tail->next = en; else e->queue_head = en;
        e->queue_tail = en;
        *handle_out = en->handle;
        hvl__count(&e->counters.tensors_submitted, 1);
    }
    pthread_mutex_unlock(&e->queue_lock);
    if (rc != HVL_OK) entry_free(en);
    return rc;
}

/* queue_lock held */
static int held(const hvl_entry *en, double now)
{
    return en->burst && now - en->burst_began < BURST_HOLD_S;
}

int hvl__queue_has_work(const hvl_engine *e, double now, double *until)
{
    for (const hvl_entry *en = e->queue_head; en; en = en->next) {
        if (!held(en, now)) return 1;
        if (en->burst_began + BURST_HOLD_S < *until) *until = en->burst_began + BURST_HOLD_S;
    }
    return 0;
}

/* Unlinks the entries a drain takes now, in queue order, and leaves the held ones queued. */
static hvl_entry *take_ready(hvl_engine *e)
{
    double now = hvl__now();
    hvl_entry *taken = NULL, **taken_end = &taken, *kept = NULL, **kept_end = &kept, *last_kept = NULL;
    int overdue = 0;
    pthread_mutex_lock(&e->queue_lock);
    for (hvl_entry *en = e->queue_head, *next; en; en = next) {
        next = en->next;
        en->next = NULL;
        if (held(en, now)) {
            *kept_end = last_kept = en;
            kept_end = &en->next;
        } else {
            overdue |= en->burst != 0;
            *taken_end = en;
            taken_end = &en->next;
        }
    }
    e->queue_head = kept;
    e->queue_tail = last_kept;
    e->wake_sent = 0;
    pthread_mutex_unlock(&e->queue_lock);
    static int told;
    if (overdue && !told++)
        hvl__log(HVL_LOG_INFO, "a burst stayed open over %.2f s (did its thread wait inside it?): its "
                 "requests started before its end, so it may not fuse as one (said once)", BURST_HOLD_S);
    return taken;
}

int hvl__queue_drain(hvl_engine *e)
{
    hvl_entry *en = take_ready(e);
    int rc = HVL_OK, tl = hvl__tl_active();
    for (hvl_entry *next; en; en = next) {
        next = en->next;
        if (tl) hvl__tl_submitted(en);
        /* after a failure (fatal) the rest are still linked, so the stop frees them */
        if (rc == HVL_OK) rc = hvl__strmap_put(&e->pending, en->d.name, en);
        if (en->d.op == HVL_JOIN) e->joined = 1;
        hvl__ready_admit(e, en);
        en->ready_at = en->enqueued_at;
        en->prev_pending = e->pending_tail;
        en->next_pending = NULL;
        if (e->pending_tail) e->pending_tail->next_pending = en; else e->pending_head = en;
        e->pending_tail = en;
    }
    return rc;
}

static void synthetic_free(hvl_entry *en, hvl_outcome *o)
{
    free((void *)en->input);
    free(en->output);
    free(o->message);
    hvl__result_free(o);
    free(o->recv_splits);
    entry_free(en);
}

/* A stand-in entry for a tensor a joined rank never submitted: zero input, scratch output, no
 * handle. Only ops flagged HVL_OPF_JOINED_OK (allreduce, barrier) get here: the coordinator fails
 * the others. NULL when out of memory. */
static hvl_entry *synthesize(const hvl_response *r)
{
    hvl_entry *en = calloc(1, sizeof(*en));
    if (!en || !(en->d.name = strdup(r->d.name))) { free(en); return NULL; }
    en->synthetic = 1;
    en->device = -1;            /* host zeros, whatever memory the other ranks' tensors are in */
    char *name = en->d.name;
    en->d = r->d;
    en->d.name = name;
    int64_t bytes = hvl__desc_bytes(&en->d);
    en->input = calloc((size_t)bytes + 1, 1);
    en->output = calloc((size_t)bytes + 1, 1);
    if (!en->input || !en->output) {
        hvl_outcome none = {0};
        synthetic_free(en, &none);
        return NULL;
    }
    return en;
}

int hvl__queue_claim(hvl_engine *e, const hvl_response_list *agreed, const hvl_response **resps,
                     hvl_entry **entries, int *n)
{
    *n = 0;
    for (int i = 0; i < agreed->count; i++) {
        const hvl_response *r = &agreed->items[i];
        hvl_entry *en = hvl__strmap_get(&e->pending, r->d.name);
        if (r->status == HVL_ERR_TIMEOUT) {   /* stall shutdown: every rank stops here */
            int rc = hvl__fail(HVL_ERR_TIMEOUT, "%s", r->error ? r->error : "stall shutdown");
            if (en) {
                hvl_outcome o = {.status = r->status, .message = strdup(hvl_last_error())};
                hvl__entry_finish(e, en, &o);
            }
            return rc;
        }
        hvl_pset *ps = hvl__pset(e, r->d.process_set);
        if (!ps || ps->rank < 0) {     /* not a member: nothing to run here (or the set is gone) */
            if (en) {
                hvl_outcome o = {.status = HVL_ERR_INVALID_ARG,
                                 .message = strdup("its process set was removed before it ran")};
                hvl__entry_finish(e, en, &o);
            }
            continue;
        }
        /* not ours to report: a joined rank's, or a deadlock among tensors this rank never submitted */
        if (!en && r->status != HVL_OK && (e->joined || r->status == HVL_ERR_DEADLOCK)) continue;
        if (!en && e->joined && !(en = synthesize(r))) return hvl__oom("a joined rank's stand-in");
        if (!en)
            return hvl__fail(HVL_ERR_SYSTEM, "agreed tensor '%s' is not pending on rank %d (the ranks are "
                             "out of step: an hvlite bug)", r->d.name, e->rank);
        if (r->status == HVL_ERR_DEADLOCK && r->d.op == HVL_JOIN) e->joined = 0;   /* its join failed */
        if (r->status != HVL_OK) {
            hvl_outcome o = {.status = r->status, .message = strdup(r->error ? r->error : "")};
            hvl__entry_finish(e, en, &o);
            continue;
        }
        resps[*n] = r;
        entries[(*n)++] = en;
    }
    return HVL_OK;
}

void hvl__entry_detach(hvl_engine *e, hvl_entry *en)
{
    if (en->synthetic || en->detached) return;
    hvl__strmap_del(&e->pending, en->d.name);
    if (en->prev_pending) en->prev_pending->next_pending = en->next_pending; else e->pending_head = en->next_pending;
    if (en->next_pending) en->next_pending->prev_pending = en->prev_pending; else e->pending_tail = en->prev_pending;
    en->prev_pending = en->next_pending = NULL;
    en->detached = 1;
}

void hvl__entry_finish(hvl_engine *e, hvl_entry *en, hvl_outcome *o)
{
    if (en->synthetic) { synthetic_free(en, o); return; }
    hvl__entry_detach(e, en);
    hvl__count(&e->counters.tensors_done, 1);   /* before the waiter can wake and read it */
    hvl__handle_complete(en->handle, o);
    entry_free(en);
}

void hvl__queue_fail_set(hvl_engine *e, int set, const char *message)
{
    for (hvl_entry *en = e->pending_head, *next; en; en = next) {
        next = en->next_pending;
        if (en->d.process_set != set) continue;
        hvl_outcome o = {.status = HVL_ERR_INVALID_ARG, .message = strdup(message)};
        hvl__entry_finish(e, en, &o);
    }
}

void hvl__queue_fail_all(hvl_engine *e, int status, const char *message)
{
    pthread_mutex_lock(&e->queue_lock);
    e->running = 0;
    hvl_entry *queued = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    names_clear();                  /* the handles hold no name once their engine stopped */
    pthread_mutex_unlock(&e->queue_lock);
    int64_t unfinished = 0;
    for (hvl_entry *en = queued, *next; en; en = next, unfinished++) {
        next = en->next;
        entry_free(en);
    }
    for (hvl_entry *en = e->pending_head, *next; en; en = next, unfinished++) {
        next = en->next_pending;
        entry_free(en);
    }
    hvl__count(&e->counters.tensors_done, unfinished);
    hvl__strmap_free(&e->pending);
    e->pending_head = e->pending_tail = NULL;
    hvl__handles_fail_all(status, message);
}

int hvl_release(int64_t handle)
{
    char *name = NULL;
    pthread_mutex_lock(&names_lock);        /* before handle_lock: the name goes with the handle */
    int rc = hvl__handle_free(handle, &name);
    if (rc == HVL_OK && name) drop_name(name, handle);
    pthread_mutex_unlock(&names_lock);
    free(name);
    return rc;
}

int64_t hvl_submit(int op, int dtype, int reduce_op, int root_rank, int process_set,
                   const char *name, int ndim, const int64_t *shape, const void *input,
                   void *output, double prescale, double postscale, const int64_t *splits,
                   int nsplits, int memory, int device, void *ready_event)
{
    hvl_request q = {op, dtype, reduce_op, root_rank, process_set, ndim, name, shape,
                     input, output, prescale, postscale, splits, nsplits, memory, device,
                     ready_event};
    int64_t handle = 0;
    int rc = hvl_enqueue(&q, &handle);
    return rc == HVL_OK ? handle : -rc;
}

void hvl_burst_begin(void)
{
    if (burst_depth++) return;      /* nested: the outermost burst is the group */
    burst_id = __atomic_add_fetch(&burst_count, 1, __ATOMIC_RELAXED);
    burst_began = hvl__now();
}

void hvl_burst_end(void)
{
    if (burst_depth == 0 || --burst_depth) return;
    hvl_engine *e = &hvl__engine;
    int released = 0;
    pthread_mutex_lock(&e->queue_lock);
    for (hvl_entry *en = e->queue_head; en; en = en->next)
        if (en->burst == burst_id) {
            en->burst = 0;
            released = 1;
        }
    if (released) wake(e);
    pthread_mutex_unlock(&e->queue_lock);
}
