/* nccl_set.c: the NCCL plane's life for one process set (backend_nccl.c runs its batches).
 *
 * - Which batches NCCL runs: CUDA tensors of a type NCCL has, with a reduction NCCL computes
 *   (scale factors folded into one pre-multiplier that the type holds: factor_fits).
 * - Loading: util/nccl_lib.c, the first time a set decides (HVLITE_NCCL_LIB, which
 *   hvlite.init() fills in with torch's nvidia-nccl wheel when it is unset), so a process that
 *   never submits a CUDA tensor loads neither NCCL nor CUDA.
 * - Deciding, once per set, at its first CUDA batch that NCCL would run (prepare, on every
 *   member at the same point of the agreed list; a set whose CUDA batches NCCL never runs, such
 *   as Adasum's, never opens NCCL): the members exchange, over MPI and bounded, whether they
 *   loaded NCCL, their (host, GPU) pair as NCCL tells GPUs apart (host: NCCL_HOSTID, else
 *   hostname and boot id; GPU: its PCI bus id), their device and whether it has memory pools
 *   (without them on every member, allgather and alltoall stay staged). Every member alike
 *   then takes NCCL only if every member loaded it and no two share a pair (NCCL refuses them:
 *   "Duplicate GPU detected"); otherwise the set's first member says once why the set stays
 *   staged. A member with no device yet (it joined before its first CUDA tensor) leaves the set
 *   undecided until the next batch.
 * - Communicator: a unique id from the set's first member, broadcast over MPI (bounded), then a
 *   nonblocking ncclCommInitRankConfig polled under the peer bound, then a warm-up (warm_up: its
 *   transports connect there, not in the first batch); the members agree on the outcome
 *   (bounded by four times the peer timeout, as a member that failed at once waits for the
 *   others' bootstrap or warm-up to give up and then their abort), and a failure anywhere leaves
 *   the set staged everywhere. Aborted, on a helper thread waited for with a bound (drop), when
 *   the set is removed, the engine stops or a collective fails.
 * - Waiting: every wait polls an event (or the stream's mark) and ncclCommGetAsyncError,
 *   bounded by the peer timeout and the engine's flags.
 * bg thread only. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_driver.h"
#include "nccl_set.h"

#define DRAIN_MAX_S 10.0          /* after an abort, the longest look for the stream to drain */

/* ---- which batches NCCL runs ---- */
int hvl__nccl_type(int dtype)
{
    switch (dtype) {
    case HVL_UINT8: return NC_UINT8;
    case HVL_INT8: return NC_INT8;
    case HVL_INT32: return NC_INT32;
    case HVL_INT64: return NC_INT64;
    case HVL_FLOAT16: return NC_FLOAT16;
    case HVL_BFLOAT16: return NC_BFLOAT16;
    case HVL_FLOAT32: return NC_FLOAT32;
    case HVL_FLOAT64: return NC_FLOAT64;
    default: return -1;                     /* 16-bit integers and bool: NCCL has none */
    }
}

static int is_float(int dtype) { return dtype >= HVL_FLOAT16 && dtype <= HVL_FLOAT64; }

/* 1 if the pre-multiplier `f` keeps its digits in the tensors' own type, which NCCL multiplies
 * in: float16 only in its normal range (below 2^-14 it is subnormal: 3.3e-7 is held as 3.6e-7),
 * bfloat16 and float32 in float's. The staged path scales in float or double instead. */
static int factor_fits(int dtype, double f)
{
    double a = fabs(f);
    if (a == 0.0 || dtype == HVL_FLOAT64) return 1;
    if (dtype == HVL_FLOAT16) return a >= 0x1p-14 && a <= 65504.0;
    return a >= FLT_MIN && a <= 0x1.fep127;     /* bfloat16's largest, below float's */
}

/* 1 if NCCL computes this reduction with its scale factors over `nranks`: unscaled, or linear
 * (Sum, Average) on a floating type, where the factors fold into one pre-multiplier that the
 * type holds. */
static int reduction_ok(const hvl_batch_kind *k, int nranks)
{
    if (hvl__nccl_type(k->dtype) < 0) return 0;
    int scaled = k->prescale != 1.0 || k->postscale != 1.0;
    double factor = k->prescale * k->postscale;
    if (scaled && nranks == 1) return 0;   /* no NCCL reduction over one rank (one_rank_copies) */
    switch (k->reduce_op) {
    case HVL_SUM: case HVL_AVERAGE:
        if (!scaled) return 1;
        if (k->reduce_op == HVL_AVERAGE && factor != 1.0) factor /= nranks;   /* as reduction_op */
        return is_float(k->dtype) && factor_fits(k->dtype, factor);
    case HVL_MIN: case HVL_MAX: case HVL_PRODUCT: return !scaled;
    default: return 0;                      /* Adasum: the MPI plane's, staged */
    }
}

/* 1 if NCCL runs a batch of this kind over `nranks` (whether this set uses NCCL aside). */
static int runs(const hvl_batch_kind *k, int nranks)
{
    if (k->memory != HVL_MEMORY_CUDA) return 0;
    switch (k->op) {
    case HVL_ALLREDUCE: return reduction_ok(k, nranks);
    case HVL_REDUCESCATTER: return k->even_rows && reduction_ok(k, nranks);
    case HVL_BROADCAST: case HVL_ALLGATHER: case HVL_ALLTOALL: return 1;
    default: return 0;
    }
}

/* Ops whose results the engine allocates on the GPU (stream-ordered: memory pools needed). */
static int sized_by_engine(int op) { return op == HVL_ALLGATHER || op == HVL_ALLTOALL; }

/* ---- the set's decision ---- */
/* What each member tells the others when a set decides (int64 words for the exchange). */
typedef struct {
    int32_t ok, device;         /* ok: NCCL and the GPU are usable here; device: -1 if none yet */
    int32_t pools;              /* the GPU has stream-ordered memory pools (cuMemAllocAsync) */
    char host[128];             /* NCCL_HOSTID, else hostname:boot id */
    char bus[32];               /* the GPU's PCI bus id */
    char why[192];              /* !ok: why not */
} member_info;
#define INFO_WORDS ((int)((sizeof(member_info) + 7) / 8))

/* The host as NCCL tells hosts apart: NCCL_HOSTID when set, else hostname and boot id. */
static void host_key(char *out, size_t len)
{
    const char *id = getenv("NCCL_HOSTID");
    if (id && id[0]) {
        snprintf(out, len, "id:%s", id);
        return;
    }
    char name[64] = "", boot[40] = "";
    gethostname(name, sizeof(name) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f)) boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    snprintf(out, len, "%s:%s", name, boot);
}

static void describe_self(int device, member_info *me)
{
    memset(me, 0, sizeof(*me));
    me->device = device;
    host_key(me->host, sizeof(me->host));
    if (device < 0) return;
    int rc = hvl__nccl_load(hvl__engine.params.nccl_lib);
    if (rc == HVL_OK) rc = hvl__cuda_bus_id(device, me->bus, sizeof(me->bus));
    me->ok = rc == HVL_OK;
    if (me->ok && hvl__cuda_pools(device, &me->pools) != HVL_OK) me->pools = 0;   /* no GPU results */
    if (!me->ok) snprintf(me->why, sizeof(me->why), "%s", hvl_last_error());
}

/* The set's verdict from every member's info (the same on every member): 1 for NCCL; 0 with
 * `why`; -1 while a member has no device. */
static int verdict(const hvl_pset *ps, const member_info *all, char *why, size_t len)
{
    for (int i = 0; i < ps->size; i++)
        if (all[i].device < 0) return -1;
    for (int i = 0; i < ps->size; i++)
        if (!all[i].ok) {
            snprintf(why, len, "rank %d: %s", ps->ranks[i], all[i].why);
            return 0;
        }
    for (int i = 0; i < ps->size; i++)
        for (int j = i + 1; j < ps->size; j++)
            if (strcmp(all[i].host, all[j].host) == 0 && strcmp(all[i].bus, all[j].bus) == 0) {
                snprintf(why, len, "ranks %d and %d share the GPU %s on one host (NCCL refuses two ranks "
                         "on one GPU; give each rank its own GPU, or its own NCCL_HOSTID)",
                         ps->ranks[i], ps->ranks[j], all[i].bus);
                return 0;
            }
    return 1;
}

/* ---- the communicator: waits on it, its making and its abort ---- */
/* See nccl_set.h. */
int hvl__nccl_set_look(ncclComm_t comm, int dev, void *event, const char *what, int *done)
{
    *done = 0;
    if (dev >= 0) HVL_CHECK(event ? hvl__cuda_event_reached(dev, event, done) : hvl__cuda_mark_reached(dev, done));
    ncclResult_t state = NC_IN_PROGRESS;
    HVL_CHECK(hvl__nccl_check(hvl__nccl.comm_get_async_error(comm, &state), comm, "ncclCommGetAsyncError"));
    if (state != NC_SUCCESS && state != NC_IN_PROGRESS) return hvl__nccl_check(state, comm, what);
    if (dev < 0) *done = state == NC_SUCCESS;
    return HVL_OK;
}

int hvl__nccl_set_overdue(const hvl_bound *bound, double since, const char *what, const char *name)
{
    double waited = hvl__now() - since;
    if (bound->timeout_s > 0 && waited > bound->timeout_s)
        return hvl__fail(HVL_ERR_TIMEOUT, "%s%s%s%s: no progress in %.0f s (HVLITE_PEER_TIMEOUT_SECONDS): "
                         "a peer is stopped, has died or cannot be reached", what, name ? " of tensor '" : "",
                         name ? name : "", name ? "'" : "", waited);
    return hvl__bound_flags(bound, waited, what);
}

int hvl__nccl_set_poll(hvl_bound bound, ncclComm_t comm, int dev, void *event, double since, const char *what,
                       const char *name)
{
    double nap_s = 2e-6;
    for (;;) {
        int done = 0;
        HVL_CHECK(hvl__nccl_set_look(comm, dev, event, what, &done));
        if (done) return HVL_OK;
        HVL_CHECK(hvl__nccl_set_overdue(&bound, since, what, name));
        hvl__nap(&nap_s, 50e-6);            /* NCCL calls take microseconds and up: short naps */
    }
}

/* NCCL's threads (its nonblocking init's, its proxies, those that connect its transports in the
 * first collectives) take the CPU affinity of the thread that starts them: under
 * HVLITE_THREAD_AFFINITY the engine thread's one core, where they would vie with it. The set-up
 * runs on the cores the engine thread had before it was pinned (engine.c), then it is pinned
 * again. Send/recv pairs, which connect at their first use, start theirs from the pinned thread. */
static void unpin(const hvl_engine *e, int unpinned)
{
    if (e->pinned)
        pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), unpinned ? &e->cpus_before : &e->cpus_pinned);
}

/* This member's communicator for the set (collective over the set's members). */
static int create_comm(hvl_engine *e, hvl_pset *ps, nccl_set *s)
{
    struct { int32_t rc; char id[sizeof(ncclUniqueId)]; } root = {HVL_OK, {0}};
    if (ps->rank == 0) {
        ncclUniqueId id;
        root.rc = hvl__nccl_check(hvl__nccl.get_unique_id(&id), NULL, "ncclGetUniqueId");
        memcpy(root.id, &id, sizeof(id));
    }
    HVL_CHECK(hvl__bcast_bytes(ps->comm, &root, (int)sizeof(root), 0, hvl__peer_bound(e), "NCCL unique id"));
    if (root.rc != HVL_OK)
        return ps->rank == 0 ? root.rc : hvl__fail(HVL_ERR_NCCL, "NCCL: ncclGetUniqueId failed on rank %d",
                                                   ps->ranks[0]);
    ncclUniqueId id;
    memcpy(&id, root.id, sizeof(id));
    nccl_config config = {sizeof(nccl_config), NC_API_MAGIC, NC_CONFIG_VERSION, 0 /* nonblocking */,
                          INT_MIN, INT_MIN, INT_MIN, NULL};
    HVL_CHECK(hvl__cuda_use(s->device));          /* NCCL takes the thread's current device */
    int rc = hvl__nccl_check(hvl__nccl.comm_init_rank_config(&s->comm, ps->size, id, ps->rank, &config), NULL,
                             "ncclCommInitRankConfig");
    if (rc == HVL_OK)
        rc = hvl__nccl_set_poll(hvl__peer_bound(e), s->comm, -1, NULL, hvl__now(), "ncclCommInitRankConfig", NULL);
    return rc;
}

/* NCCL sets its transports up lazily (NCCL_RUNTIME_CONNECT, the default since NCCL 2.22): inside
 * a communicator's first collective, not in ncclCommInitRankConfig. The failures of a first run
 * (a /dev/shm too small for NCCL's shared-memory segments, CUDA IPC denied between the GPUs, no
 * route between the hosts) would then come with the first batch, fatal to the engine. A
 * one-byte allreduce and broadcast on the engine's stream, waited for like any batch, meet them
 * here instead, where the members agree on the outcome and a failure leaves the set staged
 * everywhere. Send/recv pairs (alltoall) connect at their own first use, which this does not
 * cover. The byte is the stand-ins' scratch. */
static int warm_up(hvl_engine *e, nccl_set *s)
{
    void *stream;
    hvl_bound bound = hvl__peer_bound(e);
    const char *what = "NCCL's first collectives on a new communicator (where NCCL connects its transports)";
    HVL_CHECK(hvl__cuda_stream(s->device, &stream));
    HVL_CHECK(hvl__nccl_set_grow(s, &s->scratch, &s->scratch_cap, 256, 0));
    HVL_CHECK(hvl__nccl_check(hvl__nccl.all_reduce(s->scratch, s->scratch, 1, NC_UINT8, NC_SUM, s->comm, stream),
                              s->comm, "ncclAllReduce (warm-up)"));
    HVL_CHECK(hvl__nccl_set_poll(bound, s->comm, -1, NULL, hvl__now(), what, NULL));
    HVL_CHECK(hvl__nccl_check(hvl__nccl.broadcast(s->scratch, s->scratch, 1, NC_UINT8, 0, s->comm, stream),
                              s->comm, "ncclBroadcast (warm-up)"));
    HVL_CHECK(hvl__nccl_set_poll(bound, s->comm, -1, NULL, hvl__now(), what, NULL));
    HVL_CHECK(hvl__cuda_mark(s->device));
    return hvl__nccl_set_poll(bound, s->comm, s->device, NULL, hvl__now(), what, NULL);
}

/* Aborted, never destroyed, clean stop or not: ncclCommDestroy finalizes with the peers, and
 * nothing is left to flush (every batch ended, or the engine gave up on it). Waited for up to the peer timeout (30 s when that
 * is off); an abort still stuck then marks the set (s->abort_stuck): NCCL may still use its
 * device memory, which then leaks. */
void hvl__nccl_set_drop(nccl_set *s)
{
    if (!s->comm) return;
    double limit = hvl__engine.params.peer_timeout_s > 0 ? hvl__engine.params.peer_timeout_s : 30.0;
    s->abort_stuck = !hvl__nccl_abort(s->comm, s->device, limit);
    s->comm = NULL;
}

void hvl__nccl_ticket_free(nccl_set *s, nccl_ticket *t)
{
    nccl_ticket **at = &s->tickets;
    while (*at && *at != t) at = &(*at)->next;
    if (*at) *at = t->next;
    for (int i = 0; i < NPOINTS; i++) hvl__cuda_event_free(s->device, t->points[i], t->points[IN_READY] != NULL);
    free(t->name);
    free(t);
}

/* ---- the set's device buffers ---- */
/* A buffer of the set (the fusion buffer, a joined rank's zeros and scratch) grows mid-training.
 * cuMemFree would wait for the whole device, the framework's queued backward pass included (a
 * stall on the hot path, and a deadlock where a framework stream waits on a collective of
 * another library that waits on this rank): so where this rank's GPU has memory pools, buffers
 * come from the default pool on the engine's stream and the outgrown one goes back there after
 * the batches queued before it (cuMemFreeAsync); without pools, the outgrown one is kept until
 * the set closes, each new one at least twice the last, so those kept add up to less than the
 * current one. */
int hvl__nccl_set_grow(nccl_set *s, void **buf, int64_t *cap, int64_t need, int zero)
{
    int dev = s->device;
    void *grown = NULL;
    if (need <= *cap) return HVL_OK;
    int64_t size = s->pools_here || need >= 2 * *cap ? need : 2 * *cap;
    if (!s->pools_here && *buf && s->nretired == s->retired_cap) {     /* room to keep the old one */
        int n = s->retired_cap ? s->retired_cap * 2 : 8;
        void **more = realloc(s->retired, sizeof(void *) * (size_t)n);
        if (!more) return hvl__oom("the NCCL plane's outgrown buffers");
        s->retired = more;
        s->retired_cap = n;
    }
    HVL_CHECK(s->pools_here ? hvl__cuda_result_alloc(dev, &grown, size) : hvl__cuda_device_alloc(dev, &grown, size));
    if (zero) {
        int rc = hvl__cuda_zero(dev, grown, size);
        if (rc != HVL_OK) {
            if (s->pools_here) hvl__cuda_stream_free(dev, grown);
            else hvl__cuda_device_free(dev, grown);      /* new, never used: nothing to wait for */
            return rc;
        }
    }
    if (s->pools_here) hvl__cuda_stream_free(dev, *buf);
    else if (*buf) s->retired[s->nretired++] = *buf;
    *buf = grown;
    *cap = size;
    return HVL_OK;
}

int hvl__nccl_set_drained(nccl_set *s)
{
    if (s->device < 0 || s->abort_stuck || s->stream_stuck) return !s->abort_stuck && !s->stream_stuck;
    double limit = hvl__engine.params.peer_timeout_s > 0 && hvl__engine.params.peer_timeout_s < DRAIN_MAX_S
                 ? hvl__engine.params.peer_timeout_s : DRAIN_MAX_S, start = hvl__now(), nap_s = 2e-6;
    int done = 0;
    if (hvl__cuda_mark(s->device) != HVL_OK) done = -1;
    while (!done && hvl__now() - start < limit)
        if (hvl__cuda_mark_reached(s->device, &done) != HVL_OK) done = -1;
        else if (!done) hvl__nap(&nap_s, 1e-3);
    if (done == 1) return 1;
    s->stream_stuck = 1;
    hvl__cuda_stuck();
    hvl__log(HVL_LOG_WARNING, "cuda:%d: hvlite's GPU stream did not get past its work within %.0f s of the NCCL "
             "abort (a kernel it waits for never ends?): its NCCL buffers are left allocated", s->device, limit);
    return 0;
}

/* ---- the set's state ---- */
int hvl__nccl_set_open(hvl_engine *e, hvl_pset *ps, void **state)
{
    (void)e; (void)ps;
    nccl_set *s = calloc(1, sizeof(*s));
    if (!s) return hvl__oom("NCCL plane state");
    s->device = -1;
    *state = s;
    return HVL_OK;
}

/* The set's buffers are freed only once the engine's stream is seen past everything queued
 * (drained): else a stuck abort or a stuck stream may still use them, and a free could wait on
 * the device for ever (they leak). */
void hvl__nccl_set_close(void *state, int clean)
{
    nccl_set *s = state;
    (void)clean;
    hvl__nccl_set_drop(s);
    while (s->tickets) hvl__nccl_ticket_free(s, s->tickets);   /* none: abandon freed them */
    void *buffers[] = {s->zeros, s->scratch, s->fusion};
    if ((s->zeros || s->scratch || s->fusion) && hvl__nccl_set_drained(s)) {
        for (int i = 0; i < 3; i++)
            if (s->pools_here) hvl__cuda_stream_free(s->device, buffers[i]);
            else hvl__cuda_device_free(s->device, buffers[i]);
        for (int i = 0; i < s->nretired; i++) hvl__cuda_device_free(s->device, s->retired[i]);
    }
    free(s->retired);
    free(s);
}

static void stay_staged(const hvl_pset *ps, nccl_set *s, const char *why)
{
    char key[64];
    s->mode = STAGED;
    snprintf(key, sizeof(key), "nccl staged, set %d", ps->id);
    if (ps->rank == 0)
        hvl__log_once(key, HVL_LOG_WARNING, "process set %d: CUDA tensors take the staged path, not NCCL: %s",
                      ps->id, why);
}

/* Every member's info, in set order (collective). */
static int exchange(hvl_engine *e, hvl_pset *ps, const member_info *me, member_info *all)
{
    int64_t mine[INFO_WORDS], *words = malloc(sizeof(int64_t) * INFO_WORDS * (size_t)ps->size);
    if (!words) return hvl__oom("NCCL set-up");
    memset(mine, 0, sizeof(mine));
    memcpy(mine, me, sizeof(*me));
    int rc = hvl__allgather_i64(ps->comm, mine, INFO_WORDS, words, hvl__peer_bound(e), "NCCL set-up");
    for (int i = 0; i < ps->size && rc == HVL_OK; i++)
        memcpy(&all[i], words + (size_t)i * INFO_WORDS, sizeof(member_info));
    free(words);
    return rc;
}

/* The set's decision (see the top); non-OK only when the exchange itself failed (fatal). */
int hvl__nccl_set_prepare(hvl_engine *e, hvl_pset *ps, void *state, const hvl_batch_kind *k, int device)
{
    nccl_set *s = state;
    if (s->mode != UNDECIDED || !runs(k, ps->size)) return HVL_OK;   /* not a batch NCCL runs: no NCCL yet */
    if (e->params.nccl_disable) {           /* agreed from rank 0: alike on every member */
        stay_staged(ps, s, "HVLITE_NCCL_DISABLE=1");
        return HVL_OK;
    }
    member_info me, *all = malloc(sizeof(member_info) * (size_t)ps->size);
    if (!all) return hvl__oom("NCCL set-up");
    describe_self(device, &me);
    s->pools_here = me.pools;
    char why[400];
    int rc = exchange(e, ps, &me, all);
    int v = rc == HVL_OK ? verdict(ps, all, why, sizeof(why)) : -1;
    s->pools = 1;
    for (int i = 0; i < ps->size && v == 1; i++) s->pools &= all[i].pools != 0;
    free(all);
    if (v == 0) stay_staged(ps, s, why);
    if (v <= 0) return rc;                  /* v < 0: a member has no device yet; next batch */
    s->device = device;
    unpin(e, 1);
    int everywhere = 0, local = create_comm(e, ps, s);
    if (local == HVL_OK) local = warm_up(e, s);
    unpin(e, 0);
    if (local != HVL_OK) hvl__nccl_set_drop(s);
    /* A member whose set-up failed at once gets here while the others still wait for it in
     * NCCL's bootstrap or in the warm-up, up to the peer timeout each, and then up to that again
     * for their abort (drop): four times it lets every member agree. */
    hvl_bound agreement = hvl__peer_bound(e);
    agreement.timeout_s *= 4;
    rc = hvl__agree(ps->comm, local, "the NCCL communicator", &everywhere, agreement);
    if (rc == HVL_OK) {
        int version = hvl__nccl_version();
        s->mode = USE_NCCL;
        if (ps->rank == 0)
            hvl__log(HVL_LOG_INFO, "process set %d: CUDA tensors run on NCCL %d.%d.%d (%d ranks, one GPU each)",
                     ps->id, version / 10000, version / 100 % 100, version % 100, ps->size);
    } else if (everywhere) {                /* failed on some member, agreed: staged everywhere */
        hvl__nccl_set_drop(s);
        stay_staged(ps, s, hvl_last_error());
        rc = HVL_OK;
    }
    return rc;
}

int hvl__nccl_set_can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k)
{
    const nccl_set *s = state;
    (void)e;
    return s->mode == USE_NCCL && s->comm && runs(k, ps->size) && (s->pools || !sized_by_engine(k->op));
}
