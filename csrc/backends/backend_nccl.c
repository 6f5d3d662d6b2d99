/* backend_nccl.c: the NCCL data plane. It runs batches of CUDA tensors on the GPU for a process
 * set whose members each have a GPU of their own; every other CUDA batch keeps the staged path
 * (core/stage.c).
 *
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
 *   staged. A member with no device
 *   yet (it joined before its first CUDA tensor) leaves the set undecided until the next batch.
 * - Communicator: a unique id from the set's first member, broadcast over MPI (bounded), then a
 *   nonblocking ncclCommInitRankConfig polled under the peer bound; the members agree on the
 *   outcome (bounded by three times the peer timeout, as a member that failed at once waits for
 *   the others' bootstrap to give up and then their abort), and a failure anywhere leaves the
 *   set staged everywhere. Aborted, on a helper thread waited for with a bound (drop_comm), when
 *   the set is removed, the engine stops or a collective fails.
 * - Running (run_device): on the engine's stream of the device, after each input's ready event;
 *   a fused allreduce is one NCCL call on a device fusion buffer, the tensors copied in and out
 *   on that stream (HVLITE_NCCL_GROUPED=1: one group of per-tensor calls, no buffer; see
 *   fused_copies for why the buffer won), other batches one group of per-tensor calls. In a set
 *   of one rank, allreduce, broadcast and reducescatter call no NCCL (one_rank_copies). Scale factors fold into ncclAvg or
 *   ncclRedOpCreatePreMulSum where the op is linear (Sum, Average on floating types) and the type
 *   holds the folded factor (factor_fits); Min, Max, Product, scaled integer reductions and
 *   out-of-range factors stay staged (no kernel of ours scales on the GPU). Allgather and
 *   alltoall fill results the engine allocated on the GPU (stream-ordered, so only where every
 *   member's GPU has memory pools): allgather is ncclAllGather where every member gives as many
 *   rows, else one ncclBroadcast per member into its place (NCCL has no allgatherv); alltoall is
 *   grouped ncclSend/ncclRecv. Both move bytes, so every dtype works.
 * - Ending: each batch has a ticket, events at its phases' ends on the stream (the timeline's,
 *   when it records; else the end alone). run_device waits for the end, or, where the engine
 *   asks (HVLITE_NCCL_OVERLAP), leaves the batch running and hands the ticket over; settle then
 *   looks at it until it ends. A buffer of the set grows only once the stream passed them all.
 * - Never hanging: every wait polls the ticket's end (or the stream's mark) and
 *   ncclCommGetAsyncError, bounded by the peer timeout (from the batch's queueing or the set's
 *   previous batch's end) and the engine's flags; on an NCCL error, a timeout or a tensor on
 *   another GPU the communicator is aborted, fatal to this engine (its other tickets fail too).
 * bg thread only. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend.h"
#include "cuda_driver.h"
#include "half.h"
#include "kernels.h"
#include "nccl_lib.h"

/* ---- which batches NCCL runs ---- */
static int nccl_dtype(int dtype)
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
    if (nccl_dtype(k->dtype) < 0) return 0;
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

/* ---- per set ---- */
/* A batch on the GPU (run_device, settle): its points on the engine's stream, each the end of
 * a phase (only ENDED where the timeline does not time it), and what its messages name. */
enum { IN_READY, COPIED_IN, REDUCED, ENDED, NPOINTS };
typedef struct nccl_ticket {
    void *points[NPOINTS];
    double since;               /* when it was queued */
    int fused;                  /* its copies in and out of the fusion buffer are phases */
    char what[64];              /* "NCCL allreduce" */
    char *name;                 /* its first tensor's (owned) */
    struct nccl_ticket *next;   /* the set's other tickets out */
} nccl_ticket;

enum { UNDECIDED, USE_NCCL, STAGED };
typedef struct {
    int mode;
    int pools;                  /* every member's GPU has memory pools (allgather, alltoall) */
    int device;                 /* this rank's GPU for the set (USE_NCCL) */
    ncclComm_t comm;
    void *zeros, *scratch;      /* a joined rank's stand-ins on the device (grown, never shrunk) */
    void *fusion;               /* the device fusion buffer (grown, never shrunk) */
    int fusion_off;             /* 1 once no member had room for it: fused batches run grouped */
    int abort_stuck;            /* an ncclCommAbort of this set did not return: never free them */
    int64_t zeros_cap, scratch_cap, fusion_cap;
    nccl_ticket *tickets;       /* batches run_device left running (settle ends them) */
    double ended_at;            /* when the last of them was seen to end */
} nccl_set;

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

/* One look at the communicator: *done = 1 once the engine's stream of device `dev` passed
 * `event` (NULL: the device's mark), or, with dev < 0, once the communicator's last call
 * settled. NCCL's asynchronous error is looked at after the event too: an error there fails. */
static int look(ncclComm_t comm, int dev, void *event, const char *what, int *done)
{
    *done = 0;
    if (dev >= 0) HVL_CHECK(event ? hvl__cuda_event_reached(dev, event, done) : hvl__cuda_mark_reached(dev, done));
    ncclResult_t state = NC_IN_PROGRESS;
    HVL_CHECK(hvl__nccl_check(hvl__nccl.comm_get_async_error(comm, &state), comm, "ncclCommGetAsyncError"));
    if (state != NC_SUCCESS && state != NC_IN_PROGRESS) return hvl__nccl_check(state, comm, what);
    if (dev < 0) *done = state == NC_SUCCESS;
    return HVL_OK;
}

/* HVL_ERR_TIMEOUT once nothing moved since `since` for the peer timeout; the engine's shutdown
 * and fatal flags as every bounded wait sees them. `what` and `name` (the tensor, or NULL) go
 * into the message. */
static int overdue(const hvl_bound *bound, double since, const char *what, const char *name)
{
    double waited = hvl__now() - since;
    if (bound->timeout_s > 0 && waited > bound->timeout_s)
        return hvl__fail(HVL_ERR_TIMEOUT, "%s%s%s%s: no progress in %.0f s (HVLITE_PEER_TIMEOUT_SECONDS): "
                         "a peer is stopped, has died or cannot be reached", what, name ? " of tensor '" : "",
                         name ? name : "", name ? "'" : "", waited);
    return hvl__bound_flags(bound, waited, what);
}

/* look() until done, under `bound` from `since`. */
static int poll_comm(hvl_bound bound, ncclComm_t comm, int dev, void *event, double since, const char *what,
                     const char *name)
{
    double nap_s = 2e-6;
    for (;;) {
        int done = 0;
        HVL_CHECK(look(comm, dev, event, what, &done));
        if (done) return HVL_OK;
        HVL_CHECK(overdue(&bound, since, what, name));
        hvl__nap(&nap_s, 50e-6);            /* NCCL calls take microseconds and up: short naps */
    }
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
        rc = poll_comm(hvl__peer_bound(e), s->comm, -1, NULL, hvl__now(), "ncclCommInitRankConfig", NULL);
    return rc;
}

/* Aborted, never destroyed, clean stop or not: ncclCommDestroy finalizes with the peers, and
 * nothing is left to flush (every batch ended, or the engine gave up on it). Waited for up to the peer timeout (30 s when that
 * is off); an abort still stuck then marks the set (s->abort_stuck): NCCL may still use its
 * device memory, which then leaks. */
static void drop_comm(nccl_set *s)
{
    if (!s->comm) return;
    double limit = hvl__engine.params.peer_timeout_s > 0 ? hvl__engine.params.peer_timeout_s : 30.0;
    s->abort_stuck = !hvl__nccl_abort(s->comm, s->device, limit);
    s->comm = NULL;
}

static void ticket_free(nccl_set *s, nccl_ticket *t)
{
    nccl_ticket **at = &s->tickets;
    while (*at && *at != t) at = &(*at)->next;
    if (*at) *at = t->next;
    for (int i = 0; i < NPOINTS; i++) hvl__cuda_event_free(s->device, t->points[i]);
    free(t->name);
    free(t);
}

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
        for (int i = 0; i < NPOINTS; i++) hvl__cuda_event_free(s->device, t->points[i]);
        memset(t->points, 0, sizeof(t->points));
        int rc = hvl__cuda_event_new(s->device, 0, &t->points[ENDED]);
        if (rc != HVL_OK) {
            ticket_free(s, t);
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

static int open_set(hvl_engine *e, hvl_pset *ps, void **state)
{
    (void)e; (void)ps;
    nccl_set *s = calloc(1, sizeof(*s));
    if (!s) return hvl__oom("NCCL plane state");
    s->device = -1;
    *state = s;
    return HVL_OK;
}

static void close_set(void *state, int clean)
{
    nccl_set *s = state;
    (void)clean;
    drop_comm(s);
    while (s->tickets) ticket_free(s, s->tickets);   /* none: abandon freed them */
    if (!s->abort_stuck) {                  /* else a stuck abort may still use them: they leak */
        hvl__cuda_device_free(s->device, s->zeros);
        hvl__cuda_device_free(s->device, s->scratch);
        hvl__cuda_device_free(s->device, s->fusion);
    }
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
static int prepare(hvl_engine *e, hvl_pset *ps, void *state, const hvl_batch_kind *k, int device)
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
    char why[400];
    int rc = exchange(e, ps, &me, all);
    int v = rc == HVL_OK ? verdict(ps, all, why, sizeof(why)) : -1;
    s->pools = 1;
    for (int i = 0; i < ps->size && v == 1; i++) s->pools &= all[i].pools != 0;
    free(all);
    if (v == 0) stay_staged(ps, s, why);
    if (v <= 0) return rc;                  /* v < 0: a member has no device yet; next batch */
    s->device = device;
    int everywhere = 0, local = create_comm(e, ps, s);
    if (local != HVL_OK) drop_comm(s);
    /* A member whose set-up failed at once gets here while the others still wait in NCCL's
     * bootstrap for it, up to the peer timeout, and then up to that again for their abort
     * (drop_comm): three times it lets every member agree. */
    hvl_bound agreement = hvl__peer_bound(e);
    agreement.timeout_s *= 3;
    rc = hvl__agree(ps->comm, local, "the NCCL communicator", &everywhere, agreement);
    if (rc == HVL_OK) {
        int version = hvl__nccl_version();
        s->mode = USE_NCCL;
        if (ps->rank == 0)
            hvl__log(HVL_LOG_INFO, "process set %d: CUDA tensors run on NCCL %d.%d.%d (%d ranks, one GPU each)",
                     ps->id, version / 10000, version / 100 % 100, version % 100, ps->size);
    } else if (everywhere) {                /* failed on some member, agreed: staged everywhere */
        drop_comm(s);
        stay_staged(ps, s, hvl_last_error());
        rc = HVL_OK;
    }
    return rc;
}

static int can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k)
{
    const nccl_set *s = state;
    (void)e;
    return s->mode == USE_NCCL && s->comm && runs(k, ps->size) && (s->pools || !sized_by_engine(k->op));
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
    HVL_CHECK(hvl__nccl_check(hvl__nccl.premulsum_create(op, &scalar, nccl_dtype(k->dtype), NC_SCALAR_HOST, s->comm), s->comm,
                    "ncclRedOpCreatePreMulSum"));
    *custom = 1;
    return HVL_OK;
}

/* Before a buffer of the set is replaced: the stream passed every batch left running, which may
 * still use it (a bounded wait; cuMemFree would wait for the whole device anyway). */
static int quiesce(hvl_engine *e, nccl_set *s)
{
    if (!s->tickets) return HVL_OK;
    HVL_CHECK(hvl__cuda_mark(s->device));
    return poll_comm(hvl__peer_bound(e), s->comm, s->device, NULL, hvl__now(),
                     "NCCL batches before a buffer grows", NULL);
}

/* A device buffer of the set, grown to `need` bytes (zeroed if `zero`); quiesce() first. */
static int grow(nccl_set *s, void **buf, int64_t *cap, int64_t need, int zero)
{
    int dev = s->device;
    if (need <= *cap) return HVL_OK;
    hvl__cuda_device_free(dev, *buf);
    *buf = NULL;
    *cap = 0;
    HVL_CHECK(hvl__cuda_device_alloc(dev, buf, need));
    *cap = need;
    return zero ? hvl__cuda_zero(dev, *buf, need) : HVL_OK;
}

/* Device room for a joined rank's stand-ins: zeros as input, scratch for the outputs. */
static int stand_ins(hvl_engine *e, nccl_set *s, const hvl_device_batch *b)
{
    int64_t esize = hvl_dtype_size(b->kind.dtype), most = 0, total = 0;
    for (int i = 0; i < b->ntensors; i++)
        if (b->tensors[i].device < 0) {
            if (b->tensors[i].count > most) most = b->tensors[i].count;
            total += (b->tensors[i].count * esize + 255) / 256 * 256;   /* each its own output */
        }
    if (!total) return HVL_OK;
    if (most * esize > s->zeros_cap || total > s->scratch_cap) HVL_CHECK(quiesce(e, s));
    HVL_CHECK(grow(s, &s->zeros, &s->zeros_cap, most * esize, 1));
    return grow(s, &s->scratch, &s->scratch_cap, total, 0);
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
    int type = nccl_dtype(k->dtype), rc;
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

/* Room for `need` bytes of fusion buffer on every member, or on none: each member grows at the
 * same batch (the batch is agreed), and they agree on the outcome, since a member that ran the
 * batch grouped while the others ran one call would mismatch NCCL's calls. 0: run it grouped. */
static int fusion_room(hvl_engine *e, const hvl_pset *ps, nccl_set *s, int64_t need, int *room)
{
    *room = 1;
    if (need <= s->fusion_cap) return HVL_OK;
    int everywhere = 0;
    HVL_CHECK(quiesce(e, s));               /* a failure here is not "no room" */
    int rc = hvl__agree(ps->comm, grow(s, &s->fusion, &s->fusion_cap, need, 0),
                        "the NCCL fusion buffer", &everywhere, hvl__peer_bound(e));
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
    int rc = hvl__nccl_check(hvl__nccl.all_reduce(s->fusion, s->fusion, count, nccl_dtype(b->kind.dtype), op,
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
 * tickets fail too, and the peers, which may be mid-collective, never hang on this one. */
static int fail_set(nccl_set *s, int rc)
{
    char message[1024];
    snprintf(message, sizeof(message), "%s", hvl_last_error());
    drop_comm(s);
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
        rc = poll_comm(bound, s->comm, s->device, t->points[ENDED], since, t->what, t->name);
        *done = rc == HVL_OK;
    } else {
        rc = look(s->comm, s->device, t->points[ENDED], t->what, done);
        if (rc == HVL_OK && !*done) rc = overdue(&bound, since, t->what, t->name);
    }
    if (rc == HVL_OK && *done) {
        s->ended_at = hvl__now();
        if (phases) ticket_phases(s, t, phases);
    }
    if (rc != HVL_OK && s->comm) rc = fail_set(s, rc);
    if (rc != HVL_OK || *done) ticket_free(s, t);
    return rc;
}

/* See backend.h: the communicator aborted first, so NCCL stops before the handles fail. */
static void abandon(hvl_engine *e, hvl_pset *ps, void *state)
{
    nccl_set *s = state;
    (void)e; (void)ps;
    drop_comm(s);
    s->mode = STAGED;
    while (s->tickets) ticket_free(s, s->tickets);
}

/* The batch on the engine's stream: after its inputs' events, its copies and NCCL calls, each
 * phase's end marked on its ticket; then left running (b->ticket) or waited for here. */
static int run_device(hvl_engine *e, hvl_pset *ps, void *state, const hvl_device_batch *b)
{
    nccl_set *s = state;
    int reduces = b->kind.op == HVL_ALLREDUCE || b->kind.op == HVL_REDUCESCATTER;
    for (int i = 0; i < b->ntensors; i++)     /* aborted now: the peers are entering its calls */
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
    if (rc == HVL_OK && !fused && !one) rc = stand_ins(e, s, b);
    ncclRedOp_t op = NC_SUM;
    int custom = 0;
    if (rc == HVL_OK && reduces && !one) rc = reduction_op(s, b, ps->size, &op, &custom);
    for (int i = 0; i < b->ntensors && rc == HVL_OK; i++)     /* after any quiesce: not waited for */
        if (b->tensors[i].ready_event) rc = hvl__cuda_wait_event(s->device, b->tensors[i].ready_event);
    if (rc == HVL_OK) rc = ticket_new(s, b, &t);
    if (rc == HVL_OK) t->fused = fused;
    if (rc == HVL_OK) rc = ticket_point(s, t, IN_READY);
    if (rc == HVL_OK && fused) rc = fused_copies(s, b, 1);
    if (rc == HVL_OK) rc = ticket_point(s, t, COPIED_IN);
    if (rc == HVL_OK && one) rc = one_rank_copies(s, b);    /* its "collective" */
    if (rc == HVL_OK && !one) rc = fused ? enqueue_fused(s, b, op, stream) : enqueue(s, ps, b, op, stream);
    if (rc == HVL_OK && !one) rc = poll_comm(hvl__peer_bound(e), s->comm, -1, NULL, hvl__now(), t->what, b->name);
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
    if (t) ticket_free(s, t);
    return fail_set(s, rc);
}

const hvl_backend hvl__backend_nccl = {
    .name = "nccl",
    .open = open_set,
    .close = close_set,
    .can_run = can_run,
    .prepare = prepare,
    .run_device = run_device,
    .settle = settle,
    .abandon = abandon,
};
