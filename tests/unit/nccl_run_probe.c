/* Test probe (tests/unit/test_nccl_run_single.py): how the NCCL plane decides, runs and ends
 * batches (backend_nccl.c and nccl_set.c with their binding nccl_lib.c), on a machine without a
 * GPU. The files are compiled into this probe with their NCCL table, CUDA driver calls and MPI
 * exchanges going to the probe, which logs each call and answers it as the test says: an event or a stream mark is
 * reached after so many looks, or never; ncclCommGetAsyncError says "in progress" so many
 * times, then success or an error; an abort returns, or hangs until the test lets it go.
 * Nothing runs on a device: the pointers are addresses that are never read. The test checks from
 * the log which calls the plane made, in which order, and that every wait ends within its bound.
 * Clock, naps, errors and logging are the engine's own, loaded beside it. The plane on a real
 * GPU and NCCL is tested in tests/gpu/test_nccl_plane.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The plane's calls go to the probe; its own symbols are compiled here under other names, so
 * the engine's stay untouched. */
#define hvl__nccl probe_nccl
#define hvl__nccl_load probe_nccl_load
#define hvl__nccl_version probe_nccl_version
#define hvl__nccl_check probe_nccl_check
#define hvl__nccl_abort probe_nccl_abort
#define hvl__backend_nccl probe_backend_nccl
#define hvl__engine probe_engine
#define hvl__cuda_loaded probe_cuda_loaded
#define hvl__cuda_use probe_cuda_use
#define hvl__cuda_adopt probe_cuda_adopt
#define hvl__cuda_wait_event probe_cuda_wait_event
#define hvl__cuda_copy_on_device probe_cuda_copy_on_device
#define hvl__cuda_mark probe_cuda_mark
#define hvl__cuda_mark_reached probe_cuda_mark_reached
#define hvl__cuda_stream probe_cuda_stream
#define hvl__cuda_bus_id probe_cuda_bus_id
#define hvl__cuda_device_alloc probe_cuda_device_alloc
#define hvl__cuda_device_free probe_cuda_device_free
#define hvl__cuda_result_alloc probe_cuda_result_alloc
#define hvl__cuda_stream_free probe_cuda_stream_free
#define hvl__cuda_event_new probe_cuda_event_new
#define hvl__cuda_event_record probe_cuda_event_record
#define hvl__cuda_event_reached probe_cuda_event_reached
#define hvl__cuda_event_seconds probe_cuda_event_seconds
#define hvl__cuda_event_free probe_cuda_event_free
#define hvl__cuda_pools probe_cuda_pools
#define hvl__cuda_zero probe_cuda_zero
#define hvl__cuda_stuck probe_cuda_stuck
#define hvl__bcast_bytes probe_bcast_bytes
#define hvl__allgather_i64 probe_allgather_i64
#define hvl__agree probe_agree
#define hvl__nccl_type probe_nccl_type
#define hvl__nccl_set_open probe_nccl_set_open
#define hvl__nccl_set_close probe_nccl_set_close
#define hvl__nccl_set_prepare probe_nccl_set_prepare
#define hvl__nccl_set_can_run probe_nccl_set_can_run
#define hvl__nccl_set_look probe_nccl_set_look
#define hvl__nccl_set_overdue probe_nccl_set_overdue
#define hvl__nccl_set_poll probe_nccl_set_poll
#define hvl__nccl_set_drop probe_nccl_set_drop
#define hvl__nccl_ticket_free probe_nccl_ticket_free
#define hvl__nccl_set_grow probe_nccl_set_grow
#define hvl__nccl_set_drained probe_nccl_set_drained
#include "../../csrc/util/nccl_lib.c"
#include "../../csrc/backends/nccl_set.c"
#include "../../csrc/backends/backend_nccl.c"

hvl_engine probe_engine;

/* ---- the log: one record per call, a name and its numbers ---- */
typedef struct {
    const char *name;
    int64_t a[5];
} log_record;

#define LOG_MAX 300000             /* a wait of a second or two looks tens of thousands of times */
#define EVENTS_MAX 1024
static log_record records[LOG_MAX];
static int nrecords, dropped;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;   /* the abort's helper thread logs too */

static void note(const char *name, int64_t a0, int64_t a1, int64_t a2, int64_t a3, int64_t a4)
{
    pthread_mutex_lock(&log_lock);
    if (nrecords < LOG_MAX) records[nrecords++] = (log_record){name, {a0, a1, a2, a3, a4}};
    else dropped++;
    pthread_mutex_unlock(&log_lock);
}

/* ---- the answers the test sets ---- */
static int event_looks, mark_looks;    /* looks until reached; -1: never */
static int aborted, stuck_after_abort; /* atomic: an abort ran; then the stream drains (its NCCL
                                          kernels end), unless the test says it stays stuck */
static int event_seen[EVENTS_MAX], event_ids[EVENTS_MAX], nevents;
static int mark_seen;
static int async_pending, async_ok, async_result;   /* "in progress" this many looks more, then
                                                      success this many, then this for good */
static int abort_hangs, abort_returned;   /* atomic: ncclCommAbort waits until abort_hangs is 0 */
static int aborts_running;                /* atomic: helper threads inside ncclCommAbort */
static int fail_name_nth;                 /* the nth call of fail_name fails */
static char fail_name[32];
static int agree_fails_elsewhere;         /* another member failed the agreement */
static int peers_share_gpu;               /* the other members report this rank's host and GPU */
static int64_t next_address = 0x700000000000;
static int live_events;

static int refused(const char *name)
{
    return fail_name[0] && !strcmp(fail_name, name) && --fail_name_nth == 0;
}
static int cuda_call(const char *name, int64_t a0, int64_t a1, int64_t a2, int64_t a3)
{
    note(name, a0, a1, a2, a3, 0);
    return refused(name) ? hvl__fail(HVL_ERR_CUDA, "CUDA: the probe refuses %s", name) : HVL_OK;
}

int probe_cuda_loaded(void) { return 1; }
int probe_cuda_use(int dev) { return cuda_call("use", dev, 0, 0, 0); }
int probe_cuda_adopt(int dev) { return cuda_call("adopt", dev, 0, 0, 0); }
int probe_cuda_wait_event(int dev, void *event) { return cuda_call("wait_event", dev, (intptr_t)event, 0, 0); }
int probe_cuda_copy_on_device(int dev, void *dst, const void *src, int64_t bytes)
{
    return cuda_call("copy", dev, (intptr_t)dst, (intptr_t)src, bytes);
}
int probe_cuda_zero(int dev, void *p, int64_t bytes) { return cuda_call("zero", dev, (intptr_t)p, bytes, 0); }
int probe_cuda_mark(int dev)
{
    mark_seen = 0;
    return cuda_call("mark", dev, 0, 0, 0);
}
static int drains(void)
{
    return __atomic_load_n(&aborted, __ATOMIC_ACQUIRE) && !stuck_after_abort;
}
int probe_cuda_mark_reached(int dev, int *done)
{
    *done = drains() || (mark_looks >= 0 && ++mark_seen > mark_looks);
    return cuda_call("mark_look", dev, *done, 0, 0);
}
int probe_cuda_stream(int dev, void **stream)
{
    *stream = (void *)(intptr_t)(0x5000 + dev);
    return cuda_call("stream", dev, 0, 0, 0);
}
int probe_cuda_bus_id(int dev, char *out, int len)
{
    snprintf(out, (size_t)len, "0000:%02x:00.0", dev + 0x10);
    return cuda_call("bus_id", dev, 0, 0, 0);
}
static int pools_here = 1;                /* this rank's GPU has memory pools */
int probe_cuda_pools(int dev, int *supported)
{
    *supported = pools_here;
    return cuda_call("pools", dev, 0, 0, 0);
}
/* Device memory: logged as "device_alloc" (dev, bytes, address, 1 if stream-ordered from the
 * pool) and "device_free" (dev, address, 1 if stream-ordered). */
static int device_alloc(int dev, void **out, int64_t bytes, int pool)
{
    int64_t at = next_address;      /* logged as a[2] */
    *out = NULL;
    HVL_CHECK(cuda_call("device_alloc", dev, bytes, at, pool));
    next_address += (bytes + 0xffff) / 0x10000 * 0x10000 + 0x10000;
    *out = (void *)(intptr_t)at;
    return HVL_OK;
}
int probe_cuda_device_alloc(int dev, void **out, int64_t bytes) { return device_alloc(dev, out, bytes, 0); }
int probe_cuda_result_alloc(int dev, void **out, int64_t bytes) { return device_alloc(dev, out, bytes, 1); }
void probe_cuda_device_free(int dev, void *p) { if (p) note("device_free", dev, (intptr_t)p, 0, 0, 0); }
void probe_cuda_stream_free(int dev, void *p) { if (p) note("device_free", dev, (intptr_t)p, 1, 0, 0); }
/* An event is a slot of event_ids; the log shows its index. */
int probe_cuda_event_new(int dev, int timed, void **event)
{
    *event = NULL;                  /* as the driver's, where making it fails */
    if (nevents == EVENTS_MAX) return hvl__fail(HVL_ERR_SYSTEM, "the probe's events ran out");
    HVL_CHECK(cuda_call("event_new", dev, nevents, timed, 0));
    event_ids[nevents] = nevents;
    *event = &event_ids[nevents++];
    live_events++;
    return HVL_OK;
}
int probe_cuda_event_record(int dev, void *event)
{
    event_seen[*(int *)event] = 0;
    return cuda_call("record", dev, *(int *)event, 0, 0);
}
int probe_cuda_event_reached(int dev, void *event, int *done)
{
    int i = *(int *)event;
    *done = drains() || (event_looks >= 0 && ++event_seen[i] > event_looks);
    return cuda_call("event_look", dev, i, *done, 0);
}
int probe_cuda_event_seconds(int dev, void *from, void *to, double *seconds)
{
    *seconds = 0.001 * (*(int *)to - *(int *)from);     /* 1 ms per point */
    return cuda_call("event_seconds", dev, *(int *)from, *(int *)to, 0);
}
void probe_cuda_event_free(int dev, void *event, int timed)
{
    if (!event) return;
    note("event_free", dev, *(int *)event, timed, 0, 0);
    live_events--;
}
void probe_cuda_stuck(void) { note("cuda_stuck", 0, 0, 0, 0, 0); }

/* ---- NCCL, as the table's slots ---- */
#define COMM ((ncclComm_t)(intptr_t)0xc0c0)
static ncclResult_t nccl_call(const char *name, int64_t a0, int64_t a1, int64_t a2, int64_t a3, int64_t a4)
{
    note(name, a0, a1, a2, a3, a4);
    return refused(name) ? 3 /* ncclInternalError */ : NC_SUCCESS;
}
static ncclResult_t p_version(int *v) { *v = 22809; return NC_SUCCESS; }
static ncclResult_t p_unique_id(ncclUniqueId *id) { memset(id, 7, sizeof(*id)); return nccl_call("get_unique_id", 0, 0, 0, 0, 0); }
/* The calling thread's cores: where a thread NCCL starts now would run. */
static int cpus_here(void)
{
    cpu_set_t set;
    return pthread_getaffinity_np(pthread_self(), sizeof(set), &set) == 0 ? CPU_COUNT(&set) : -1;
}
static ncclResult_t p_init(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, nccl_config *config)
{
    *comm = COMM;
    note("cpus", cpus_here(), 0, 0, 0, 0);
    return nccl_call("init", nranks, rank, config->blocking, (unsigned char)id.internal[0], 0);
}
static ncclResult_t p_abort(ncclComm_t comm)
{
    __atomic_add_fetch(&aborts_running, 1, __ATOMIC_ACQ_REL);
    note("abort_begins", (intptr_t)comm, 0, 0, 0, 0);
    while (__atomic_load_n(&abort_hangs, __ATOMIC_ACQUIRE)) usleep(1000);
    note("abort", (intptr_t)comm, 0, 0, 0, 0);
    __atomic_store_n(&aborted, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&abort_returned, 1, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&aborts_running, 1, __ATOMIC_ACQ_REL);
    return NC_SUCCESS;
}
static ncclResult_t p_async(ncclComm_t comm, ncclResult_t *state)
{
    (void)comm;
    *state = async_pending > 0 ? (async_pending--, NC_IN_PROGRESS)
           : async_ok > 0 ? (async_ok--, NC_SUCCESS) : async_result;
    note("async_look", *state, 0, 0, 0, 0);
    return NC_SUCCESS;
}
static const char *p_error_string(ncclResult_t rc) { return rc == 6 ? "remote process exited or there was a network error" : "probe error"; }
static const char *p_last_error(ncclComm_t comm) { (void)comm; return "the probe's last error"; }
static ncclResult_t p_all_reduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                 ncclComm_t comm, cudaStream_t stream)
{
    (void)comm, (void)stream;
    return nccl_call("all_reduce", (intptr_t)send, (intptr_t)recv, (int64_t)count, type, op);
}
static ncclResult_t p_broadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                                ncclComm_t comm, cudaStream_t stream)
{
    (void)comm, (void)stream, (void)type;
    note("cpus", cpus_here(), 0, 0, 0, 0);
    return nccl_call("broadcast", (intptr_t)send, (intptr_t)recv, (int64_t)count, root, 0);
}
static ncclResult_t p_reduce_scatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)comm, (void)stream;
    return nccl_call("reduce_scatter", (intptr_t)send, (intptr_t)recv, (int64_t)count, type, op);
}
static ncclResult_t p_all_gather(const void *send, void *recv, size_t count, ncclDataType_t type,
                                 ncclComm_t comm, cudaStream_t stream)
{
    (void)comm, (void)stream;
    return nccl_call("all_gather", (intptr_t)send, (intptr_t)recv, (int64_t)count, type, 0);
}
static ncclResult_t p_send(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                           cudaStream_t stream)
{
    (void)comm, (void)stream, (void)type;
    return nccl_call("send", (intptr_t)buf, (int64_t)count, peer, 0, 0);
}
static ncclResult_t p_recv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                           cudaStream_t stream)
{
    (void)comm, (void)stream, (void)type;
    return nccl_call("recv", (intptr_t)buf, (int64_t)count, peer, 0, 0);
}
static ncclResult_t p_group_start(void) { return nccl_call("group_start", 0, 0, 0, 0, 0); }
static ncclResult_t p_group_end(void) { return nccl_call("group_end", 0, 0, 0, 0, 0); }
static ncclResult_t p_premulsum(ncclRedOp_t *op, void *scalar, ncclDataType_t type, ncclScalarResidence_t residence,
                                ncclComm_t comm)
{
    (void)comm;
    *op = 100;
    int64_t bits = 0;
    memcpy(&bits, scalar, type == NC_FLOAT16 || type == NC_BFLOAT16 ? 2 : type == NC_FLOAT32 ? 4 : 8);
    return nccl_call("premulsum", bits, type, residence, 0, 0);
}
static ncclResult_t p_red_op_destroy(ncclRedOp_t op, ncclComm_t comm) { (void)comm; return nccl_call("red_op_destroy", op, 0, 0, 0, 0); }

/* ---- MPI, as one member sees it ---- */
/* The root's bytes: on the root, its own; elsewhere, the root's status (OK) and then 0x42s (the
 * unique id the root made: create_comm's layout). */
int probe_bcast_bytes(MPI_Comm comm, void *buf, int bytes, int root, hvl_bound bound, const char *what)
{
    (void)comm, (void)bound, (void)what;
    note("bcast", bytes, root, 0, 0, 0);
    if (probe_engine.rank != root) {
        memset(buf, 0, sizeof(int32_t));
        memset((char *)buf + sizeof(int32_t), 0x42, (size_t)bytes - sizeof(int32_t));
    }
    return HVL_OK;
}
/* Every member's words: this rank's; the others' the same, but for their host (unless they
 * share this rank's GPU). */
int probe_allgather_i64(MPI_Comm comm, const int64_t *mine, int count, int64_t *all, hvl_bound bound,
                        const char *what)
{
    (void)comm, (void)bound, (void)what;
    note("allgather", count, 0, 0, 0, 0);
    for (int r = 0; r < probe_engine.size; r++) {
        memcpy(all + (size_t)r * count, mine, sizeof(int64_t) * (size_t)count);
        member_info *m = (member_info *)(all + (size_t)r * count);
        if (r != probe_engine.rank && !peers_share_gpu) snprintf(m->host, sizeof(m->host), "peer%d", r);
    }
    return HVL_OK;
}
int probe_agree(MPI_Comm comm, int local_rc, const char *what, int *everywhere, hvl_bound bound)
{
    (void)comm;
    note("agree", local_rc, (int64_t)(bound.timeout_s * 1000), 0, 0, 0);
    *everywhere = local_rc != HVL_OK || agree_fails_elsewhere;
    if (local_rc != HVL_OK) return hvl__fail(HVL_ERR_INVALID_ARG, "%s", hvl_last_error());
    if (agree_fails_elsewhere) return hvl__fail(HVL_ERR_INVALID_ARG, "%s failed on another rank", what);
    return HVL_OK;
}

/* ---- the test's side ---- */
/* NCCL "loaded" (nccl_lib.c's statics, in this file): its table is the probe's. */
static void loaded_here(void)
{
    loaded = 1;
    version = 22809;
}

static hvl_pset pset;
static int members[8];
static void *state;
#define TENSORS_MAX 16
static hvl_device_tensor tensors[TENSORS_MAX];
static int ntensors;
static int64_t counts[64];
static double phases[4];
static void *ticket_slot;
static hvl_device_batch batch;

/* A fresh engine and log; this process is member `rank` of a set of `size` (global ranks 0..),
 * peer timeout timeout_s. The set's plane state is opened. */
void probe_reset(int rank, int size, double timeout_s)
{
    __atomic_store_n(&abort_hangs, 0, __ATOMIC_RELEASE);      /* a hung abort left by a test ends */
    for (int i = 0; i < 5000 && __atomic_load_n(&aborts_running, __ATOMIC_ACQUIRE); i++) usleep(1000);
    event_looks = mark_looks = 0;             /* the last test's set closes on a stream that drains */
    stuck_after_abort = 0;
    async_pending = async_ok = 0;
    async_result = NC_SUCCESS;
    fail_name[0] = '\0';
    if (state) probe_backend_nccl.close(state, 1);
    state = NULL;
    memset(&probe_engine, 0, sizeof(probe_engine));
    probe_engine.rank = rank;
    probe_engine.size = size;
    probe_engine.params.peer_timeout_s = timeout_s;
    for (int i = 0; i < size && i < 8; i++) members[i] = i;
    pset = (hvl_pset){.id = 0, .size = size, .rank = rank, .ranks = members};
    pthread_mutex_lock(&log_lock);
    nrecords = dropped = 0;
    pthread_mutex_unlock(&log_lock);
    nevents = live_events = 0;
    event_looks = mark_looks = 0;
    async_pending = async_ok = 0;
    async_result = NC_SUCCESS;
    fail_name[0] = '\0';
    agree_fails_elsewhere = peers_share_gpu = 0;
    pools_here = 1;
    __atomic_store_n(&abort_returned, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&aborted, 0, __ATOMIC_RELEASE);
    probe_nccl = (hvl_nccl_api){p_version, p_unique_id, p_init, p_abort, p_async, p_error_string, p_last_error,
                                p_all_reduce, p_broadcast, p_reduce_scatter, p_all_gather, p_send, p_recv,
                                p_group_start, p_group_end, p_premulsum, p_red_op_destroy};
    pthread_once(&load_once, loaded_here);
    probe_backend_nccl.open(&probe_engine, &pset, &state);
}

/* The set as prepare leaves it once NCCL was chosen on device `dev`, without the exchange. */
void probe_use_nccl(int dev)
{
    nccl_set *s = state;
    s->mode = USE_NCCL;
    s->device = dev;
    s->comm = COMM;
    s->pools = s->pools_here = pools_here;
}

void probe_settings(int grouped, double timeout_s) { probe_engine.params.nccl_grouped = grouped, probe_engine.params.peer_timeout_s = timeout_s; }
void probe_pace(int events, int marks) { event_looks = events, mark_looks = marks; }
void probe_async(int pending, int ok, int result) { async_pending = pending, async_ok = ok, async_result = result; }
void probe_fail(const char *name, int nth) { snprintf(fail_name, sizeof(fail_name), "%s", name), fail_name_nth = nth; }
void probe_disable_nccl(int disable) { probe_engine.params.nccl_disable = disable; }
void probe_pools(int pools) { ((nccl_set *)state)->pools = pools; }
void probe_pools_here(int pools) { pools_here = pools; }   /* for the next probe_use_nccl or prepare */
void probe_abort_hangs(int hangs) { __atomic_store_n(&abort_hangs, hangs, __ATOMIC_RELEASE); }
void probe_stuck_after_abort(int stuck) { stuck_after_abort = stuck; }
int probe_abort_returned(void) { return __atomic_load_n(&abort_returned, __ATOMIC_ACQUIRE); }
void probe_shutdown(int requested) { probe_engine.shutdown_requested = requested; }
void probe_peers(int share_gpu, int agree_fails) { peers_share_gpu = share_gpu, agree_fails_elsewhere = agree_fails; }

/* A new batch: op, reduce_op, dtype, prescale, postscale; broadcast root `root`. */
void probe_batch(int op, int reduce_op, int dtype, double prescale, double postscale, int root)
{
    memset(&batch, 0, sizeof(batch));
    ntensors = 0;
    batch.kind = (hvl_batch_kind){op, reduce_op, dtype, HVL_MEMORY_CUDA, 0, prescale, postscale, 1};
    batch.root = root;
    batch.tensors = tensors;
    batch.counts = counts;
    batch.name = "t0";
}
/* A tensor of `count` elements on device `dev` (-1: a joined rank's stand-in), input and
 * output at the given addresses, with a ready event if `event`. */
void probe_tensor(int64_t count, int dev, int64_t input, int64_t output, int event)
{
    int i = ntensors++;
    tensors[i] = (hvl_device_tensor){(const void *)(intptr_t)input, (void *)(intptr_t)output, count, dev,
                                     event ? (void *)(intptr_t)(0xe000 + i) : NULL};   /* its address: 0xe000 + i */
    batch.ntensors = ntensors;
    batch.kind.bytes += count * hvl_dtype_size(batch.kind.dtype);
}
void probe_counts(int n, const int64_t *values) { memcpy(counts, values, sizeof(int64_t) * (size_t)n); }

/* The plane's entry points on the probe's set. left_running: hand a ticket over (overlap);
 * timed: ask for the phases. Returns the rc; the ticket, if any, is probe_ticket(). */
int probe_run(int left_running, int timed)
{
    ticket_slot = NULL;
    batch.ticket = left_running ? &ticket_slot : NULL;
    batch.phases = timed ? phases : NULL;
    memset(phases, 0, sizeof(phases));
    return probe_backend_nccl.run_device(&probe_engine, &pset, state, &batch);
}
void *probe_ticket(void) { return ticket_slot; }
int probe_settle(void *ticket, int how, int *done)
{
    return probe_backend_nccl.settle(&probe_engine, &pset, state, ticket, how, done, phases);
}
int probe_abandon(void) { return probe_backend_nccl.abandon(&probe_engine, &pset, state); }
static int cpus_after;
/* The set's decision, on a thread pinned as the engine's is under HVLITE_THREAD_AFFINITY when
 * probe_pin said so; probe_cpus_after() is its cores when prepare returned. */
int probe_prepare(int dev)
{
    hvl_batch_kind k = batch.kind;
    if (probe_engine.pinned) pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &probe_engine.cpus_pinned);
    int rc = probe_backend_nccl.prepare(&probe_engine, &pset, state, &k, dev);
    cpus_after = cpus_here();
    return rc;
}
int probe_cpus_after(void) { return cpus_after; }
/* The engine thread pinned to the first of this process's cores (1), or not (0); the cores it
 * had before are the process's. Returns how many the process has. */
int probe_pin(int pinned)
{
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof(all), &all) != 0) return -1;
    probe_engine.pinned = pinned;
    probe_engine.cpus_before = all;
    CPU_ZERO(&probe_engine.cpus_pinned);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &probe_engine.cpus_pinned);
            break;
        }
    return CPU_COUNT(&all);
}
int probe_can_run(void) { return probe_backend_nccl.can_run(&probe_engine, &pset, state, &batch.kind); }
void probe_close(void)
{
    probe_backend_nccl.close(state, 1);
    state = NULL;
}
double probe_phase(int i) { return phases[i]; }

int64_t probe_state(const char *what)
{
    const nccl_set *s = state;
    if (!strcmp(what, "mode")) return s ? s->mode : -1;      /* 0 undecided, 1 NCCL, 2 staged */
    if (!strcmp(what, "comm")) return s && s->comm;
    if (!strcmp(what, "fusion")) return s ? (intptr_t)s->fusion : 0;
    if (!strcmp(what, "fusion_off")) return s ? s->fusion_off : 0;
    if (!strcmp(what, "zeros")) return s ? (intptr_t)s->zeros : 0;
    if (!strcmp(what, "scratch")) return s ? (intptr_t)s->scratch : 0;
    if (!strcmp(what, "tickets")) {
        int64_t n = 0;
        for (nccl_ticket *t = s ? s->tickets : NULL; t; t = t->next) n++;
        return n;
    }
    if (!strcmp(what, "abort_stuck")) return s ? s->abort_stuck : 0;
    if (!strcmp(what, "stream_stuck")) return s ? s->stream_stuck : 0;
    if (!strcmp(what, "fusion_cap")) return s ? s->fusion_cap : 0;
    if (!strcmp(what, "live_events")) return live_events;
    return -1;
}

int probe_log_count(void) { return nrecords; }
int probe_log_dropped(void) { return dropped; }
const char *probe_log_name(int i) { return records[i].name; }
int64_t probe_log_arg(int i, int j) { return records[i].a[j]; }
