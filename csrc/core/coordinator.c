/* coordinator.c: rank 0's readiness table, private to the negotiation. Each full round, rank 0 feeds every rank's newly
 * submitted requests in; a tensor that every rank has submitted leaves the table as one
 * response: the agreed parameters, or an error naming the field and the ranks that disagree
 * (built once here, delivered to every rank). It also finds tensors that some ranks never
 * submitted (stalls): a warning after HVLITE_STALL_CHECK_TIME_SECONDS, and after
 * HVLITE_STALL_SHUTDOWN_TIME_SECONDS an error response that stops every rank's engine.
 * A tensor of a process set waits for that set's members only; ranks are global ranks here.
 * Deadlocks: each rank's message says how long it has waited in hvlite without submitting, and
 * on what; when waiting ranks wait only on tensors that waiting ranks will never submit, those
 * tensors fail on every rank with a message naming each side (deadlock_check).
 * bg thread of rank 0 only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "coordinator.h"
#include "kernels.h"
#include "timeline.h"

typedef struct {
    hvl_desc *by_rank;         /* by_rank[r].name != NULL once rank r submitted (requests) */
    int count;
    int set;                   /* process set id (every request of a name has the same) */
    double first_seen;
    int warned;
} record_t;

typedef struct {
    double blocked_for;        /* seconds waiting in hvlite without submitting, at its last message */
    int count;                 /* tensors it waits on (engine names, owned) */
    char **names;
} rank_waits_t;

struct hvl_coordinator {
    hvl_engine *engine;        /* its process-set table says who must submit */
    int size;
    rank_waits_t *waits;       /* per rank */
    hvl_strmap table;          /* name -> record_t (key: by_rank[first submitter].name) */
    char *joined;              /* joined[r]: rank r called join and it has not completed */
    int last_joined;           /* the rank that joined last (join's result) */
};

enum { F_OP, F_DTYPE, F_MEMORY, F_SHAPE, F_REDUCE, F_ROOT, F_TARGET, F_PRESCALE, F_POSTSCALE, F_COUNT };
static const char *field_names[F_COUNT] = {"op", "dtype", "memory", "shape", "reduce op", "root rank",
                                           "process set", "prescale factor", "postscale factor"};
static const char *memory_names[HVL_MEMORY_COUNT] = {"host (CPU) memory", "CUDA (GPU) memory"};

/* The request of the first rank that submitted the tensor (the others may have joined). */
static const hvl_desc *first_of(const record_t *rec)
{
    const hvl_desc *first = rec->by_rank;
    while (!first->name) first++;
    return first;
}

int hvl__coordinator_create(hvl_coordinator **out, hvl_engine *e)
{
    hvl_coordinator *c = calloc(1, sizeof(*c));
    if (c) c->joined = calloc((size_t)e->size, 1);
    if (c) c->waits = calloc((size_t)e->size, sizeof(rank_waits_t));
    if (!c || !c->joined || !c->waits) {
        if (c) free(c->joined);
        free(c);
        return hvl__oom("the coordinator's table");
    }
    c->engine = e;
    c->size = e->size;
    *out = c;
    return HVL_OK;
}

static void forget_waits(rank_waits_t *w)
{
    for (int i = 0; i < w->count; i++) free(w->names[i]);
    free(w->names);
    memset(w, 0, sizeof(*w));
}

static void record_free(hvl_coordinator *c, record_t *rec)
{
    for (int r = 0; r < c->size; r++) free(rec->by_rank[r].name);
    free(rec->by_rank);
    free(rec);
}

void hvl__coordinator_destroy(hvl_coordinator *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->table.cap; i++)
        if (hvl__strmap_live(&c->table, i)) record_free(c, c->table.slots[i].value);
    hvl__strmap_free(&c->table);
    for (int r = 0; r < c->size; r++) forget_waits(&c->waits[r]);
    free(c->waits);
    free(c->joined);
    free(c);
}

/* Does field f apply to this op? */
static int field_applies(int f, int op)
{
    switch (f) {
    case F_OP: return 1;
    case F_DTYPE: case F_MEMORY: case F_SHAPE: return hvl__op_is(op, HVL_OPF_DATA);
    case F_REDUCE: case F_PRESCALE: case F_POSTSCALE: return hvl__op_is(op, HVL_OPF_REDUCES);
    case F_ROOT: return hvl__op_is(op, HVL_OPF_ROOTED);
    case F_TARGET: return op == HVL_PROCESS_SET_REMOVE;
    default: return 0;
    }
}

/* Do two ranks' requests agree on field f? Compared on the values, never on their text. */
static int same_value(int f, const hvl_desc *a, const hvl_desc *b)
{
    switch (f) {
    case F_OP: return a->op == b->op;
    case F_DTYPE: return a->dtype == b->dtype;
    case F_MEMORY: return a->memory == b->memory;
    case F_REDUCE: return a->reduce_op == b->reduce_op;
    case F_ROOT: return a->root_rank == b->root_rank;
    case F_TARGET: return a->target_set == b->target_set;
    case F_PRESCALE: return a->prescale == b->prescale;
    case F_POSTSCALE: return a->postscale == b->postscale;
    case F_SHAPE: {
        if (a->ndim != b->ndim) return 0;
        int first = hvl__op_is(a->op, HVL_OPF_FREE_DIM0);   /* dim 0 may differ */
        for (int i = first; i < a->ndim; i++)
            if (a->shape[i] != b->shape[i]) return 0;
        return 1;
    }
    default: return 1;
    }
}

#define VALUE_TEXT 400   /* enough for 16 dimensions of 20 digits */

static void describe(int f, const hvl_desc *q, char *out)
{
    size_t n = VALUE_TEXT;
    switch (f) {
    case F_OP: snprintf(out, n, "%s", hvl__op_name(q->op)); break;
    case F_DTYPE: snprintf(out, n, "%s", hvl__dtype_name(q->dtype)); break;
    case F_MEMORY: snprintf(out, n, "%s", memory_names[q->memory]); break;   /* wire.c checked it */
    case F_REDUCE: snprintf(out, n, "%s", hvl__reduce_name(q->reduce_op)); break;
    case F_ROOT: snprintf(out, n, "root %d", q->root_rank); break;
    case F_TARGET: snprintf(out, n, "process set %d", q->target_set); break;
    case F_PRESCALE: snprintf(out, n, "%.17g", q->prescale); break;
    case F_POSTSCALE: snprintf(out, n, "%.17g", q->postscale); break;
    case F_SHAPE: {
        int free_dim0 = hvl__op_is(q->op, HVL_OPF_FREE_DIM0);
        size_t len = (size_t)snprintf(out, n, "[");
        for (int i = 0; i < q->ndim; i++) {
            if (i == 0 && free_dim0) len += (size_t)snprintf(out + len, n - len, "*");
            else len += (size_t)snprintf(out + len, n - len, "%lld", (long long)q->shape[i]);
            if (i + 1 < q->ndim) len += (size_t)snprintf(out + len, n - len, ", ");
        }
        snprintf(out + len, n - len, "]");
        break;
    }
    }
}

/* "tensor 'x': ranks disagree on the F: V1 on ranks a,b; V2 on rank c" (malloc'd; NULL if OOM).
 * Ranks are grouped by equal values (same_value), in order of first appearance. */
static char *mismatch_message(const record_t *rec, const hvl_desc *first, int size, int f)
{
    const hvl_desc *q = rec->by_rank;
    size_t cap = strlen(first->name) + 100 + (size_t)size * (VALUE_TEXT + 24), len;
    char *msg = malloc(cap), value[VALUE_TEXT];
    if (!msg) return NULL;
    len = (size_t)snprintf(msg, cap, "tensor '%s': ranks disagree on the %s: ", first->name, field_names[f]);
    for (int r = 0, groups = 0; r < size; r++) {
        if (!q[r].name) continue;       /* a joined rank: it takes what the others agree */
        int seen = 0, many = 0;
        for (int p = 0; p < r && !seen; p++) seen = q[p].name && same_value(f, &q[p], &q[r]);
        if (seen) continue;
        for (int p = r + 1; p < size; p++) many |= q[p].name && same_value(f, &q[p], &q[r]);
        describe(f, &q[r], value);
        len += (size_t)snprintf(msg + len, cap - len, "%s%s on rank%s %d", groups++ ? "; " : "", value, many ? "s" : "", r);
        for (int p = r + 1; p < size; p++)
            if (q[p].name && same_value(f, &q[p], &q[r])) len += (size_t)snprintf(msg + len, cap - len, ",%d", p);
    }
    return msg;
}

static void rank_list(const hvl_coordinator *c, const record_t *rec, int want, char *out, size_t n);

/* "tensor 'x' is on another GPU than its process set's earlier CUDA tensors on rank 1 (cuda:1,
 * not cuda:0); ..." (malloc'd; NULL if none is, or if out of memory): ready.c marked them. */
static char *device_message(const record_t *rec, const hvl_desc *first, int size)
{
    size_t cap = strlen(first->name) + 300 + (size_t)size * 64, len = 0;
    char *msg = NULL;
    int listed = 0;
    for (int r = 0; r < size; r++) {
        const hvl_desc *q = &rec->by_rank[r];
        if (!q->name || q->set_device < 0) continue;
        if (!msg) {
            if (!(msg = malloc(cap))) return NULL;
            len = (size_t)snprintf(msg, cap, "tensor '%s' is on another GPU than the earlier CUDA tensors of "
                                   "process set %d on rank", first->name, first->process_set);
        }
        len += (size_t)snprintf(msg + len, cap - len, "%s %d (cuda:%d, not cuda:%d)", listed++ ? ", rank" : "", r,
                                q->device, q->set_device);
    }
    if (msg)
        snprintf(msg + len, cap - len, ": a rank's CUDA tensors of one process set stay on one GPU, its first "
                 "one's (NCCL's communicator is per device; torch.cuda.set_device(hvd.local_rank()) pins it)");
    return msg;
}

static int member_count(const hvl_coordinator *c, const record_t *rec)
{
    const hvl_pset *ps = hvl__pset(c->engine, rec->set);
    return ps ? ps->size : rec->count;    /* a removed set: nobody left to wait for */
}

/* The response for a tensor every member submitted (out->d.name is a copy). */
static int decide(hvl_coordinator *c, record_t *rec, hvl_response *out)
{
    const hvl_desc *first = first_of(rec);
    memset(out, 0, sizeof(*out));
    out->d = *first;
    out->d.name = strdup(first->name);
    if (!out->d.name) return hvl__oom("a response");
    for (int f = 0; f < F_COUNT; f++) {
        if (!field_applies(f, first->op)) continue;
        int agree = 1;
        for (int r = 0; r < c->size && agree; r++)
            agree = !rec->by_rank[r].name || same_value(f, first, &rec->by_rank[r]);
        if (agree) continue;
        out->status = HVL_ERR_MISMATCH;   /* an error even if the message cannot be built */
        out->error = mismatch_message(rec, first, c->size, f);
        return HVL_OK;   /* later fields may not even compare once the op differs */
    }
    for (int r = 0; r < c->size && first->memory == HVL_MEMORY_CUDA; r++)
        if (rec->by_rank[r].name && rec->by_rank[r].set_device >= 0) {
            out->status = HVL_ERR_INVALID_ARG;
            out->error = device_message(rec, first, c->size);
            return HVL_OK;
        }
    if (rec->count < member_count(c, rec) && !hvl__op_is(first->op, HVL_OPF_JOINED_OK) &&
        !hvl__op_is(first->op, HVL_OPF_WHOLE_JOB)) {
        /* As Horovod: once a rank has joined, only allreduce and barrier go on without it; any
         * other op fails on every rank that submitted it, not filled in (a script may rely on
         * the error to learn that another rank ran out of data). */
        char joined[256];
        rank_list(c, rec, 0, joined, sizeof(joined));
        size_t n = strlen(first->name) + sizeof(joined) + 160;
        out->status = HVL_ERR_INVALID_ARG;
        if ((out->error = malloc(n)))
            snprintf(out->error, n, "tensor '%s': %s while rank%s %s %s called join() (as in Horovod, "
                     "only allreduce and barrier run while ranks have joined)", first->name,
                     hvl__op_name(first->op), strchr(joined, ',') ? "s" : "", joined,
                     strchr(joined, ',') ? "have" : "has");
    }
    if (first->op == HVL_JOIN) {
        out->last_joined = c->last_joined;
        memset(c->joined, 0, (size_t)c->size);
    }
    return HVL_OK;
}

/* Every member of its set submitted it, or joined (join itself needs every rank). A set
 * removed meanwhile has no members left to wait for. */
static int is_ready(const hvl_coordinator *c, const record_t *rec)
{
    const hvl_pset *ps = hvl__pset(c->engine, rec->set);
    if (!ps) return 1;
    if (rec->count == ps->size) return 1;
    if (hvl__op_is(first_of(rec)->op, HVL_OPF_WHOLE_JOB)) return 0;   /* every rank itself, joined or not */
    for (int i = 0; i < ps->size; i++)
        if (!rec->by_rank[ps->ranks[i]].name && !c->joined[ps->ranks[i]]) return 0;
    return 1;
}

static int complete(hvl_coordinator *c, record_t *rec, hvl_response_list *ready)
{
    hvl_response resp;
    int rc = decide(c, rec, &resp);
    hvl__strmap_del(&c->table, first_of(rec)->name);
    record_free(c, rec);
    HVL_CHECK(rc);
    if (hvl__tl_active()) hvl__tl_agreed(resp.d.name, resp.status, resp.error, 0);
    rc = hvl__responses_push(ready, &resp);
    if (rc != HVL_OK) { free(resp.d.name); free(resp.error); }
    return rc;
}

static int add_one(hvl_coordinator *c, int rank, hvl_desc *q, hvl_response_list *ready)
{
    record_t *rec = hvl__strmap_get(&c->table, q->name);
    if (!rec) {
        rec = calloc(1, sizeof(*rec));
        if (rec) rec->by_rank = calloc((size_t)c->size, sizeof(hvl_desc));
        if (!rec || !rec->by_rank || hvl__strmap_put(&c->table, q->name, rec) != HVL_OK) {
            if (rec) free(rec->by_rank);
            free(rec);
            free(q->name);
            return hvl__oom("the coordinator's table");
        }
        rec->first_seen = hvl__now();
        rec->set = q->process_set;
    }
    if (rec->by_rank[rank].name) {   /* enqueue rejects duplicates, so this is a bug */
        int rc = hvl__fail(HVL_ERR_SYSTEM, "coordinator: rank %d sent tensor '%s' twice", rank, q->name);
        free(q->name);
        return rc;
    }
    rec->by_rank[rank] = *q;
    rec->count++;
    if (hvl__tl_active()) hvl__tl_arrived(q->name, q->op, rank);
    if (q->op != HVL_JOIN) return is_ready(c, rec) ? complete(c, rec, ready) : HVL_OK;
    c->joined[rank] = 1;            /* it now stands in for every tensor it never submits */
    c->last_joined = rank;
    for (size_t i = 0; i < c->table.cap; i++) {   /* deleting while scanning is safe: no rehash */
        if (!hvl__strmap_live(&c->table, i)) continue;
        record_t *other = c->table.slots[i].value;
        if (other != rec && is_ready(c, other)) HVL_CHECK(complete(c, other, ready));
    }
    /* join itself last: completing it clears the joined flags the others needed */
    return is_ready(c, rec) ? complete(c, rec, ready) : HVL_OK;
}

/* A rank's message starts with its waiting state: f64 seconds, i32 count, that many names. */
static int read_waits(hvl_coordinator *c, int rank, hvl_buf *b)
{
    rank_waits_t *w = &c->waits[rank];
    forget_waits(w);
    w->blocked_for = hvl__buf_get_f64(b);
    int32_t n = hvl__buf_get_i32(b);
    if (b->bad || n < 0 || (size_t)n > b->len) return hvl__fail(HVL_ERR_SYSTEM, "coordinator: corrupt waits from rank %d", rank);
    if (n && !(w->names = calloc((size_t)n, sizeof(char *)))) return hvl__oom("a rank's waits");
    for (w->count = 0; w->count < n; w->count++)
        if (!(w->names[w->count] = hvl__buf_get_str(b)))
            return hvl__fail(HVL_ERR_SYSTEM, "coordinator: corrupt waits from rank %d", rank);
    return HVL_OK;
}

int hvl__coordinator_add(hvl_coordinator *c, int rank, hvl_buf *requests, hvl_response_list *ready)
{
    HVL_CHECK(read_waits(c, rank, requests));
    while (requests->pos < requests->len) {
        hvl_desc q;
        if (hvl__wire_get_desc(requests, &q) != HVL_OK) {
            free(q.name);
            return hvl__fail(HVL_ERR_SYSTEM, "coordinator: corrupt request list from rank %d", rank);
        }
        HVL_CHECK(add_one(c, rank, &q, ready));
    }
    return HVL_OK;
}

/* "0,2" for the members of its set that have (want == 1) or have not (want == 0) submitted. */
static void rank_list(const hvl_coordinator *c, const record_t *rec, int want, char *out, size_t n)
{
    const hvl_pset *ps = hvl__pset(c->engine, rec->set);
    size_t len = 0;
    out[0] = 0;
    for (int r = 0; r < c->size && len < n; r++)
        if ((rec->by_rank[r].name != NULL) == want && (!ps || hvl__pset_rank_of(ps, r) >= 0))
            len += (size_t)snprintf(out + len, n - len, "%s%d", len ? "," : "", r);
}

/* The error response that ends a stalled tensor (and the engine) on every rank. */
static int stall_response(hvl_coordinator *c, record_t *rec, double age, double shutdown_s,
                          const char *have, const char *missing, hvl_response_list *ready)
{
    const hvl_desc *first = first_of(rec);
    hvl_response r = {.d = *first, .status = HVL_ERR_TIMEOUT};
    r.d.name = strdup(first->name);
    size_t cap = strlen(first->name) + strlen(have) + strlen(missing) + 200;
    r.error = malloc(cap);
    if (!r.d.name || !r.error) { free(r.d.name); free(r.error); return hvl__oom("a stall response"); }
    snprintf(r.error, cap, "stall shutdown: tensor '%s' waited %.0f s (submitted by ranks %s; missing "
             "ranks: %s); HVLITE_STALL_SHUTDOWN_TIME_SECONDS=%g", first->name, age, have, missing,
             shutdown_s);
    hvl__log(HVL_LOG_ERROR, "%s", r.error);
    if (hvl__tl_active()) hvl__tl_agreed(r.d.name, r.status, r.error, 0);
    int rc = hvl__responses_push(ready, &r);
    if (rc != HVL_OK) { free(r.d.name); free(r.error); return rc; }
    hvl__strmap_del(&c->table, first->name);   /* safe while scanning: no rehash */
    record_free(c, rec);
    return HVL_OK;
}

void hvl__coordinator_drop_set(hvl_coordinator *c, int set)
{
    for (size_t i = 0; i < c->table.cap; i++) {   /* deleting while scanning is safe: no rehash */
        if (!hvl__strmap_live(&c->table, i)) continue;
        record_t *rec = c->table.slots[i].value;
        if (rec->set != set) continue;
        hvl__strmap_del(&c->table, c->table.slots[i].key);
        record_free(c, rec);
    }
}

int hvl__coordinator_stall_check(hvl_coordinator *c, double warn_s, double shutdown_s,
                                 hvl_response_list *ready)
{
    if (warn_s <= 0 && shutdown_s <= 0) return HVL_OK;
    double now = hvl__now();
    for (size_t i = 0; i < c->table.cap; i++) {
        if (!hvl__strmap_live(&c->table, i)) continue;
        record_t *rec = c->table.slots[i].value;
        if (first_of(rec)->op == HVL_JOIN) continue;   /* waiting for uneven work to finish is normal */
        double age = now - rec->first_seen;
        int warn = warn_s > 0 && !rec->warned && age >= warn_s;
        int stop = shutdown_s > 0 && age >= shutdown_s;
        if (!warn && !stop) continue;
        char have[256], missing[256];
        rank_list(c, rec, 1, have, sizeof(have));
        rank_list(c, rec, 0, missing, sizeof(missing));
        if (warn) {
            hvl__log(HVL_LOG_WARNING, "stall: tensor '%s' was submitted by ranks %s %.0f s ago but not "
                     "yet by ranks %s; those ranks may have skipped it or be stuck (missing ranks: %s)",
                     c->table.slots[i].key, have, age, missing, missing);
            rec->warned = 1;
            hvl__count(&c->engine->counters.stall_warnings, 1);
            if (hvl__tl_active()) hvl__tl_note(c->table.slots[i].key, "STALL", missing);
        }
        if (stop) HVL_CHECK(stall_response(c, rec, age, shutdown_s, have, missing, ready));
    }
    return HVL_OK;
}

/* ---- deadlocks ---- */

/* Could `rec` still complete, when the ranks marked in `stuck` will never submit anything? Yes
 * if a member that has not submitted it is not stuck (a joined member stands in, except for
 * whole-job ops, which need every rank itself). */
static int can_complete(const hvl_coordinator *c, const record_t *rec, const char *stuck)
{
    const hvl_pset *ps = hvl__pset(c->engine, rec->set);
    int whole = hvl__op_is(first_of(rec)->op, HVL_OPF_WHOLE_JOB);
    if (!ps) return 1;             /* its set is being removed: that resolves it */
    for (int i = 0; i < ps->size; i++) {
        int m = ps->ranks[i];
        if (!rec->by_rank[m].name && !(c->joined[m] && !whole) && !stuck[m]) return 1;
    }
    return 0;
}

/* stuck[r] = 1 for the ranks that wait in vain: start from every rank that has waited
 * deadlock_s, then free any rank that waits on a tensor that could still complete, until
 * nothing changes. A rank waits only on what it submitted: a tensor the table does not have
 * from that rank (not sent yet, a cache bit) is in flight, so that rank is not stuck. Returns
 * how many are stuck. */
static int find_stuck(const hvl_coordinator *c, double deadlock_s, char *stuck)
{
    int changed = 1, count = 0;
    for (int r = 0; r < c->size; r++)
        stuck[r] = c->waits[r].count > 0 && c->waits[r].blocked_for >= deadlock_s;
    while (changed) {
        changed = 0;
        for (int r = 0; r < c->size; r++) {
            for (int i = 0; stuck[r] && i < c->waits[r].count; i++) {
                const record_t *rec = hvl__strmap_get(&c->table, c->waits[r].names[i]);
                if (!rec || !rec->by_rank[r].name || can_complete(c, rec, stuck))
                    stuck[r] = 0, changed = 1;
            }
        }
    }
    for (int r = 0; r < c->size; r++) count += stuck[r];
    return count;
}

/* "allreduce 'a' (submitted only by rank 0) and join (submitted only by ranks 1,2)" */
static void describe_waits(const hvl_coordinator *c, int rank, hvl_buf *out)
{
    for (int i = 0; i < c->waits[rank].count; i++) {
        const record_t *rec = hvl__strmap_get(&c->table, c->waits[rank].names[i]);
        const hvl_desc *d = first_of(rec);
        char have[256];
        rank_list(c, rec, 1, have, sizeof(have));
        if (i) hvl__buf_printf(out, " and ");
        if (d->op == HVL_JOIN) hvl__buf_printf(out, "join");
        else hvl__buf_printf(out, "%s '%s'", hvl__op_name(d->op), d->name);
        hvl__buf_printf(out, " (submitted only by rank%s %s)", strchr(have, ',') ? "s" : "", have);
    }
}

/* "collective deadlock: rank 0 waits on ...; ranks 1,2 wait on ..." (ranks with the same waits
 * grouped), NUL-terminated in out. */
static void deadlock_message(const hvl_coordinator *c, const char *stuck, double deadlock_s, hvl_buf *out)
{
    hvl_buf mine = {0}, other = {0};
    char *said = calloc((size_t)c->size, 1);
    hvl__buf_printf(out, "collective deadlock: ");
    for (int r = 0, groups = 0; said && r < c->size; r++) {
        if (!stuck[r] || said[r]) continue;
        mine.len = 0;
        describe_waits(c, r, &mine);
        hvl__buf_put(&mine, "", 1);
        hvl_buf ranks = {0};
        for (int q = r; q < c->size; q++) {
            if (!stuck[q] || said[q]) continue;
            other.len = 0;
            describe_waits(c, q, &other);
            hvl__buf_put(&other, "", 1);
            if (mine.bad || other.bad || strcmp(mine.data, other.data) != 0) continue;
            said[q] = 1;
            hvl__buf_printf(&ranks, "%s%d", ranks.len ? "," : "", q);
        }
        hvl__buf_put(&ranks, "", 1);
        int many = !ranks.bad && strchr(ranks.data, ',') != NULL;
        hvl__buf_printf(out, "%srank%s %s wait%s on %s", groups++ ? "; " : "", many ? "s" : "",
                        ranks.bad ? "?" : ranks.data, many ? "" : "s", mine.bad ? "?" : mine.data);
        hvl__buf_free(&ranks);
    }
    hvl__buf_printf(out, "; none of them can go on (found after %g s of waiting: HVLITE_DEADLOCK_SECONDS)", deadlock_s);
    hvl__buf_put(out, "", 1);
    hvl__buf_free(&mine);
    hvl__buf_free(&other);
    free(said);
}

/* The deadlock response that ends one tensor on every rank (its record leaves the table). */
static int deadlock_response(hvl_coordinator *c, record_t *rec, const char *message, hvl_response_list *ready)
{
    const hvl_desc *first = first_of(rec);
    hvl_response r = {.d = *first, .status = HVL_ERR_DEADLOCK};
    r.d.name = strdup(first->name);
    r.error = strdup(message);
    if (!r.d.name || !r.error) { free(r.d.name); free(r.error); return hvl__oom("a deadlock response"); }
    if (hvl__tl_active()) hvl__tl_agreed(r.d.name, r.status, r.error, 0);
    int rc = hvl__responses_push(ready, &r);
    if (rc != HVL_OK) { free(r.d.name); free(r.error); return rc; }
    if (first->op == HVL_JOIN)     /* a failed join: its ranks take part in collectives again */
        for (int m = 0; m < c->size; m++)
            if (rec->by_rank[m].name) c->joined[m] = 0;
    hvl__strmap_del(&c->table, first->name);
    record_free(c, rec);
    return HVL_OK;
}

int hvl__coordinator_deadlock_check(hvl_coordinator *c, double deadlock_s, hvl_response_list *ready)
{
    if (deadlock_s <= 0) return HVL_OK;
    char *stuck = calloc((size_t)c->size, 1);
    hvl_buf message = {0};
    int rc = HVL_OK;
    if (!stuck) return hvl__oom("the deadlock check");
    if (find_stuck(c, deadlock_s, stuck) == 0) goto out;
    deadlock_message(c, stuck, deadlock_s, &message);
    if (message.bad) { rc = hvl__oom("a deadlock message"); goto out; }
    hvl__log(HVL_LOG_WARNING, "%s", message.data);
    for (int r = 0; r < c->size; r++) {
        for (int i = 0; stuck[r] && i < c->waits[r].count; i++) {
            record_t *rec = hvl__strmap_get(&c->table, c->waits[r].names[i]);
            if (rec) HVL_CHECK_GOTO(deadlock_response(c, rec, message.data, ready), rc, out);
        }
        if (stuck[r]) forget_waits(&c->waits[r]);   /* reported once; its next message says more */
    }
out:
    hvl__buf_free(&message);
    free(stuck);
    return rc;
}
