/* handle.c: the handle table, and who waits on it. A handle is born pending at enqueue,
 * completed once by the bg thread with an outcome (status, message, engine-owned result), and
 * freed by hvl_release (queue.c, which frees the request's name with it: hvl__handle_free).
 * Waiters sleep on one condition variable that every completion broadcasts. While a thread
 * sleeps in hvl_wait this process counts as waiting in hvlite, on that handle's tensor; the
 * negotiation reports it (deadlock detection, coordinator.c).
 * Any thread; everything here is guarded by handle_lock (taken after queue_lock and queue.c's
 * names_lock, never before). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_driver.h"
#include "cycle.h"

enum { SLOT_FREE = 0, SLOT_PENDING, SLOT_DONE };

typedef struct {
    int state;
    uint32_t generation;      /* bumps on reuse, so a stale id never finds a new handle */
    char *name;               /* the tensor's engine name (owned), for deadlock reports */
    hvl_outcome outcome;
} slot_t;

static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond;
static pthread_once_t cond_once = PTHREAD_ONCE_INIT;
static slot_t *slots;          /* handle_lock */
static int64_t nslots;         /* handle_lock */
static int64_t free_hint;      /* handle_lock */

/* Waiting in hvlite. Python waits in 1 s slices (so Ctrl-C is seen): a wait that ends with
 * "still in progress" and starts again within WAIT_GAP_S is the same wait. A submission from any
 * thread ends a waiting spell: this process was not stuck, it was working. */
#define WAIT_GAP_S 0.25
#define MAX_LISTED_WAITS 64
static int64_t waiting_on[MAX_LISTED_WAITS];   /* handle_lock: handles slept on now (0: free) */
static int waiting;            /* handle_lock: threads in hvl_wait now */
static double waiting_since;   /* handle_lock: start of this waiting spell */
static double idle_since;      /* handle_lock: when `waiting` last fell to 0 */
static double last_submit;     /* handle_lock: the last hvl__handle_new */

static void make_cond(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&done_cond, &a);
    pthread_condattr_destroy(&a);
}

static int64_t make_id(int64_t index, uint32_t gen) { return ((int64_t)gen << 32) | (index + 1); }

/* The slot of a live handle id, or NULL. handle_lock held. */
static slot_t *lookup(int64_t id)
{
    int64_t index = (id & 0xffffffff) - 1;
    if (index < 0 || index >= nslots) return NULL;
    slot_t *s = &slots[index];
    if (s->state == SLOT_FREE || s->generation != (uint32_t)(id >> 32)) return NULL;
    return s;
}

int hvl__handle_new(int64_t *id, const char *name)
{
    pthread_once(&cond_once, make_cond);
    pthread_mutex_lock(&handle_lock);
    int64_t i = free_hint;
    while (i < nslots && slots[i].state != SLOT_FREE) i++;
    if (i == nslots) {
        int64_t n = nslots ? nslots * 2 : 256;
        slot_t *grown = realloc(slots, (size_t)n * sizeof(slot_t));
        if (!grown) { pthread_mutex_unlock(&handle_lock); return hvl__oom("the handle table"); }
        memset(grown + nslots, 0, (size_t)(n - nslots) * sizeof(slot_t));
        slots = grown;
        i = nslots;
        nslots = n;
    }
    char *copy = strdup(name);
    if (!copy) { pthread_mutex_unlock(&handle_lock); return hvl__oom("a handle's name"); }
    slots[i].state = SLOT_PENDING;
    slots[i].generation = (slots[i].generation % 0x7fffffffu) + 1;   /* 1..2^31-1: ids stay > 0 */
    slots[i].name = copy;
    memset(&slots[i].outcome, 0, sizeof(hvl_outcome));
    free_hint = i + 1;
    *id = make_id(i, slots[i].generation);
    last_submit = hvl__now();
    pthread_mutex_unlock(&handle_lock);
    return HVL_OK;
}

void hvl__handle_complete(int64_t id, hvl_outcome *o)
{
    pthread_mutex_lock(&handle_lock);
    slot_t *s = lookup(id);
    if (s && s->state == SLOT_PENDING) {
        s->outcome = *o;
        s->state = SLOT_DONE;
        memset(o, 0, sizeof(*o));   /* moved */
    }
    pthread_mutex_unlock(&handle_lock);
    free(o->message);               /* only non-NULL if the handle was gone */
    hvl__result_free(o);
    free(o->recv_splits);
}

void hvl__handles_notify(void)
{
    pthread_mutex_lock(&handle_lock);
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&handle_lock);
}

void hvl__handles_fail_all(int status, const char *message)
{
    pthread_mutex_lock(&handle_lock);
    for (int64_t i = 0; i < nslots; i++) {
        if (slots[i].state != SLOT_PENDING) continue;
        slots[i].outcome.status = status;
        slots[i].outcome.message = strdup(message);
        slots[i].state = SLOT_DONE;
    }
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&handle_lock);
}

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    double t = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)t;
    ts->tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
}

/* This thread starts or stops sleeping on handle id (handle_lock held): the waiting spell. */
static int wait_begin(int64_t id)
{
    double now = hvl__now();
    if (waiting++ == 0 && now - idle_since > WAIT_GAP_S) waiting_since = now;
    for (int i = 0; i < MAX_LISTED_WAITS; i++)
        if (!waiting_on[i]) { waiting_on[i] = id; return i; }
    return -1;                     /* counted, not listed */
}

static void wait_end(int listed)
{
    if (listed >= 0) waiting_on[listed] = 0;
    if (--waiting == 0) idle_since = hvl__now();
}

int hvl_wait(int64_t id, double timeout_s)
{
    pthread_once(&cond_once, make_cond);
    struct timespec deadline;
    if (timeout_s > 1e9) timeout_s = -1;   /* ~30 years: forever, without time_t overflow */
    if (timeout_s >= 0) deadline_after(&deadline, timeout_s);
    pthread_mutex_lock(&handle_lock);
    slot_t *s = lookup(id);
    int listed = s && s->state == SLOT_PENDING ? wait_begin(id) : -2;
    while ((s = lookup(id)) && s->state == SLOT_PENDING) {
        int rc = timeout_s >= 0 ? pthread_cond_timedwait(&done_cond, &handle_lock, &deadline)
                                : pthread_cond_wait(&done_cond, &handle_lock);
        if (rc == ETIMEDOUT && (s = lookup(id)) && s->state == SLOT_PENDING) {
            wait_end(listed);
            pthread_mutex_unlock(&handle_lock);
            return hvl__fail(HVL_ERR_IN_PROGRESS, "still in progress after %.3f s", timeout_s);
        }
    }
    if (listed != -2) wait_end(listed);
    int status = HVL_ERR_INVALID_ARG;
    if (!s) hvl__fail(status, "unknown or released handle %lld", (long long)id);
    else if ((status = s->outcome.status) != HVL_OK)
        hvl__fail(status, "%s", s->outcome.message ? s->outcome.message : hvl__status_name(status));
    pthread_mutex_unlock(&handle_lock);
    return status;
}

int hvl_poll(int64_t id, int *done)
{
    pthread_mutex_lock(&handle_lock);
    slot_t *s = lookup(id);
    if (s) *done = s->state == SLOT_DONE;
    pthread_mutex_unlock(&handle_lock);
    return s ? HVL_OK : hvl__fail(HVL_ERR_INVALID_ARG, "unknown or released handle %lld", (long long)id);
}

/* Copies what the caller asked for out of a completed handle's outcome. */
static int read_done(int64_t id, hvl_outcome *copy)
{
    pthread_mutex_lock(&handle_lock);
    slot_t *s = lookup(id);
    int rc = !s ? HVL_ERR_INVALID_ARG : s->state != SLOT_DONE ? HVL_ERR_IN_PROGRESS : HVL_OK;
    if (rc == HVL_OK) *copy = s->outcome;   /* shallow: pointers stay owned by the slot */
    pthread_mutex_unlock(&handle_lock);
    if (rc != HVL_OK) return hvl__fail(rc, "handle %lld is %s", (long long)id, rc == HVL_ERR_IN_PROGRESS ? "not complete" : "unknown or released");
    return HVL_OK;
}

int hvl_result_shape(int64_t id, int *ndim, int64_t *shape)
{
    hvl_outcome o;
    HVL_CHECK(read_done(id, &o));
    *ndim = o.ndim;
    memcpy(shape, o.shape, sizeof(int64_t) * (size_t)o.ndim);
    return HVL_OK;
}

int hvl_result_take(int64_t id, void **data)
{
    pthread_mutex_lock(&handle_lock);
    slot_t *s = lookup(id);
    int rc = !s ? HVL_ERR_INVALID_ARG : s->state != SLOT_DONE ? HVL_ERR_IN_PROGRESS : HVL_OK;
    *data = rc == HVL_OK ? s->outcome.result : NULL;
    if (rc == HVL_OK) s->outcome.result = NULL;
    pthread_mutex_unlock(&handle_lock);
    if (rc != HVL_OK) return hvl__fail(rc, "handle %lld is %s", (long long)id, rc == HVL_ERR_IN_PROGRESS ? "not complete" : "unknown or released");
    if (!*data) return hvl__fail(HVL_ERR_INVALID_ARG, "handle %lld has no result to take", (long long)id);
    return HVL_OK;
}

int hvl_result_memory(int64_t id, int *memory, int *device)
{
    hvl_outcome o;
    HVL_CHECK(read_done(id, &o));
    *memory = o.result_memory;
    *device = o.result_memory == HVL_MEMORY_CUDA ? o.result_device : -1;
    return HVL_OK;
}

int hvl_buffers_busy(int64_t id, int *busy)
{
    hvl_outcome o;
    *busy = 0;
    HVL_CHECK(read_done(id, &o));
    int decided = o.status == HVL_ERR_INVALID_ARG || o.status == HVL_ERR_MISMATCH || o.status == HVL_ERR_DEADLOCK ||
                  o.status == HVL_ERR_UNSUPPORTED || o.status == HVL_ERR_NOT_INITIALIZED;
    *busy = o.status != HVL_OK && (o.buffers == HVL_BUFFERS_BUSY || (o.buffers == HVL_BUFFERS_BY_STATUS && !decided));
    return HVL_OK;
}

void hvl__result_free(hvl_outcome *o)
{
    if (o->result_memory == HVL_MEMORY_CUDA) hvl__cuda_result_free(o->result_device, o->result, NULL);
    else hvl_buffer_free(o->result);
    o->result = NULL;
}

void hvl_device_buffer_free(int device, void *data, void *stream)
{
    hvl__cuda_result_free(device, data, stream);
}

int hvl_result_value(int64_t id, int64_t *value)
{
    hvl_outcome o;
    HVL_CHECK(read_done(id, &o));
    *value = o.value;
    return HVL_OK;
}

int hvl_received_splits(int64_t id, int64_t *splits)
{
    hvl_outcome o;
    HVL_CHECK(read_done(id, &o));
    if (!o.recv_splits) return hvl__fail(HVL_ERR_INVALID_ARG, "handle %lld is not an alltoall", (long long)id);
    memcpy(splits, o.recv_splits, sizeof(int64_t) * (size_t)o.nsplits);
    return HVL_OK;
}

int hvl__handle_free(int64_t id, char **name)
{
    pthread_mutex_lock(&handle_lock);
    slot_t *s = lookup(id);
    hvl_outcome o = {0};
    int rc = !s ? HVL_ERR_INVALID_ARG : s->state != SLOT_DONE ? HVL_ERR_IN_PROGRESS : HVL_OK;
    *name = NULL;
    if (rc == HVL_OK) {
        o = s->outcome;
        *name = s->name;
        s->name = NULL;
        s->state = SLOT_FREE;
        int64_t index = (id & 0xffffffff) - 1;
        if (index < free_hint) free_hint = index;
    }
    pthread_mutex_unlock(&handle_lock);
    free(o.message);
    hvl__result_free(&o);
    free(o.recv_splits);
    if (rc != HVL_OK) return hvl__fail(rc, "cannot release handle %lld: %s", (long long)id, rc == HVL_ERR_IN_PROGRESS ? "still pending" : "unknown");
    return HVL_OK;
}

double hvl__waits_blocked_for(void)
{
    pthread_mutex_lock(&handle_lock);
    double now = hvl__now(), since = waiting_since > last_submit ? waiting_since : last_submit;
    int in_spell = waiting > 0 || now - idle_since <= WAIT_GAP_S;
    double blocked = in_spell && waiting_since > 0 ? now - since : 0;
    pthread_mutex_unlock(&handle_lock);
    return blocked > 0 ? blocked : 0;
}

/* Only handles still pending: a thread sleeping on one the bg thread has just completed (an
 * error, a result) has not woken yet, and listing it would make rank 0 see this rank wait on a
 * tensor it no longer has in flight (a false deadlock once the others resubmit that name). */
void hvl__waits_describe(hvl_buf *out)
{
    pthread_mutex_lock(&handle_lock);
    int32_t n = 0;
    slot_t *pending[MAX_LISTED_WAITS];
    for (int i = 0; i < MAX_LISTED_WAITS; i++) {
        slot_t *s = waiting_on[i] ? lookup(waiting_on[i]) : NULL;
        if (s && s->state == SLOT_PENDING) pending[n++] = s;
    }
    hvl__buf_i32(out, n);
    for (int i = 0; i < n; i++) hvl__buf_str(out, pending[i]->name ? pending[i]->name : "");
    pthread_mutex_unlock(&handle_lock);
}
