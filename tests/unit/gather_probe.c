/* Test probe (tests/unit/test_gather_single.py): allgather and alltoall of CUDA tensors on a
 * device plane (gather.c's device half), on a machine without a GPU. gather.c is compiled into
 * this probe with its size exchanges, its device allocations and the plane's run going to the
 * probe, which logs them and answers as the test says: the other members' sizes and verdicts,
 * a GPU without room, a run that fails. Nothing runs on a device: the results are addresses
 * that are never read. The plane (NCCL) on a GPU is tested in tests/gpu/test_nccl_plane.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define hvl__allgather_i64 probe_allgather_i64
#define hvl__allreduce_ints probe_allreduce_ints
#define hvl__alltoall_i64 probe_alltoall_i64
#define hvl__cuda_result_alloc probe_result_alloc
#define hvl__cuda_result_free probe_result_free
#define hvl__cuda_stream probe_stream
#define hvl__run_allgather probe_run_allgather_host
#define hvl__run_alltoall probe_run_alltoall_host
#define hvl__run_allgather_device probe_run_allgather_device_
#define hvl__run_alltoall_device probe_run_alltoall_device_
#include "../../csrc/core/gather.c"

/* ---- the log ---- */
typedef struct {
    const char *what;           /* "alloc", "free", "run", "exchange" */
    int64_t a[4];
} log_record;
#define LOG_MAX 1024
static log_record records[LOG_MAX];
static int nrecords, dropped;
static void note(const char *what, int64_t a0, int64_t a1, int64_t a2, int64_t a3)
{
    if (nrecords < LOG_MAX) records[nrecords++] = (log_record){what, {a0, a1, a2, a3}};
    else dropped++;
}

/* ---- the test's answers (other members: sizes, splits, verdicts) ---- */
#define MEMBERS_MAX 8
#define ENTRIES_MAX 8
static int64_t peer_rows[MEMBERS_MAX][ENTRIES_MAX];   /* allgather: member r's rows of tensor t */
static int64_t peer_splits[MEMBERS_MAX];               /* alltoall: rows member r sends this rank */
static int peer_verdict;                               /* the worst verdict of the other members */
static int no_room_at, allocs, run_fails;
static int64_t next_result = 0x600000000000;
static hvl_pset probe_pset;               /* the batch's set */

int probe_allgather_i64(MPI_Comm comm, const int64_t *mine, int count, int64_t *all, hvl_bound bound,
                        const char *what)
{
    (void)comm, (void)bound, (void)what;
    note("exchange", count, 0, 0, 0);
    for (int r = 0; r < probe_pset.size; r++)
        for (int i = 0; i < count; i++)
            all[r * count + i] = r == probe_pset.rank ? mine[i] : peer_rows[r][i];
    return HVL_OK;
}
/* The members' verdicts: MPI_MAX of this rank's and the others' worst. */
int probe_allreduce_ints(MPI_Comm comm, int *values, int n, MPI_Op op, hvl_bound bound, const char *what)
{
    (void)comm, (void)bound, (void)what, (void)op;
    note("agree", values[0], n, 0, 0);
    if (peer_verdict > values[0]) values[0] = peer_verdict;
    return HVL_OK;
}
int probe_alltoall_i64(MPI_Comm comm, const int64_t *mine, int64_t *theirs, hvl_bound bound)
{
    (void)comm, (void)mine, (void)bound;
    note("exchange", probe_pset.size, 1, 0, 0);
    memcpy(theirs, peer_splits, sizeof(int64_t) * (size_t)probe_pset.size);
    return HVL_OK;
}
int probe_result_alloc(int dev, void **out, int64_t bytes)
{
    *out = NULL;
    if (++allocs == no_room_at) return hvl__fail(HVL_ERR_NO_MEMORY, "CUDA: out of memory (the probe)");
    *out = (void *)(intptr_t)next_result;
    note("alloc", dev, bytes, next_result, 0);
    next_result += 0x10000000;
    return HVL_OK;
}
void probe_result_free(int dev, void *p, void *stream) { note("free", dev, (intptr_t)p, (intptr_t)stream, 0); }
int probe_stream(int dev, void **stream)
{
    *stream = (void *)(intptr_t)(0x5000 + dev);
    return HVL_OK;
}

/* The plane: logs its batch (its tensors' outputs and counts). */
static hvl_device_batch last;
static int64_t last_counts[2 * MEMBERS_MAX * ENTRIES_MAX];
static hvl_device_tensor last_tensors[ENTRIES_MAX];
static int plane_run_device(hvl_engine *e, hvl_pset *ps, void *state, const hvl_device_batch *b)
{
    (void)e, (void)state;
    int ncounts = b->kind.op == HVL_ALLTOALL ? 2 * ps->size : ps->size * b->ntensors;
    last = (hvl_device_batch){.kind = b->kind, .ntensors = b->ntensors, .phases = b->phases, .ticket = b->ticket};
    memcpy(last_counts, b->counts, sizeof(int64_t) * (size_t)ncounts);
    memcpy(last_tensors, b->tensors, sizeof(hvl_device_tensor) * (size_t)b->ntensors);
    note("run", b->ntensors, ncounts, 0, 0);
    return run_fails ? hvl__fail(HVL_ERR_NCCL, "NCCL: the probe's run fails") : HVL_OK;
}
static const hvl_backend plane = {.name = "probe", .run_device = plane_run_device};

/* ---- the test's side ---- */
static int members[MEMBERS_MAX];
static hvl_engine engine;
static hvl_entry entries[ENTRIES_MAX];
static hvl_entry *entry_list[ENTRIES_MAX];
static char names[ENTRIES_MAX][16];
static int64_t splits[MEMBERS_MAX];
static hvl_batch batch;
static hvl_outcome outcomes[ENTRIES_MAX];

/* A fresh batch of op (allgather or alltoall) on a set of `size` where this rank is `rank`. */
void probe_reset(int op, int rank, int size)
{
    for (int i = 0; i < ENTRIES_MAX; i++) free(outcomes[i].recv_splits);
    memset(&last, 0, sizeof(last));
    memset(last_counts, 0, sizeof(last_counts));
    memset(last_tensors, 0, sizeof(last_tensors));
    memset(outcomes, 0, sizeof(outcomes));
    memset(&batch, 0, sizeof(batch));
    memset(peer_rows, 0, sizeof(peer_rows));
    memset(peer_splits, 0, sizeof(peer_splits));
    for (int i = 0; i < size; i++) members[i] = i;
    probe_pset = (hvl_pset){.size = size, .rank = rank, .ranks = members};
    engine.rank = rank;
    batch = (hvl_batch){.op = op, .dtype = HVL_FLOAT32, .memory = HVL_MEMORY_CUDA, .ps = &probe_pset,
                        .entries = entry_list};
    nrecords = dropped = allocs = no_room_at = run_fails = peer_verdict = 0;
}

/* Adds a tensor of rows x cols float32 on device `dev`; alltoall: its splits (size members). */
int probe_tensor(int64_t rows, int64_t cols, int dev, const int64_t *send_splits)
{
    if (batch.count == ENTRIES_MAX) return -1;
    int i = batch.count++;
    hvl_entry *en = &entries[i];
    memset(en, 0, sizeof(*en));
    snprintf(names[i], sizeof(names[i]), "t%d", i);
    en->d = (hvl_desc){.op = batch.op, .dtype = HVL_FLOAT32, .ndim = 2, .shape = {rows, cols},
                       .memory = HVL_MEMORY_CUDA, .name = names[i]};
    en->input = (const void *)(intptr_t)(0x100000000000 + (int64_t)i * 0x1000000);
    en->device = dev;
    en->ready_event = (void *)(intptr_t)(0xe000 + i);
    if (send_splits) {
        memcpy(splits, send_splits, sizeof(int64_t) * (size_t)probe_pset.size);
        en->splits = splits;
        en->nsplits = probe_pset.size;
    }
    entry_list[i] = en;
    batch.bytes += rows * cols * 4;
    return i;
}
void probe_peer_rows(int r, int t, int64_t rows) { peer_rows[r][t] = rows; }
void probe_peer_splits(int r, int64_t rows) { peer_splits[r] = rows; }
void probe_answers(int verdict, int no_room_at_alloc, int fails) { peer_verdict = verdict, no_room_at = no_room_at_alloc, run_fails = fails; }

/* Runs the batch; *restage as gather.c says. */
int probe_run(int *restage)
{
    hvl_plane p = {&plane, NULL, 0, 0};
    hvl_batch_kind k = {batch.op, HVL_SUM, HVL_FLOAT32, HVL_MEMORY_CUDA, batch.bytes, 1.0, 1.0, 0};
    return batch.op == HVL_ALLGATHER ? probe_run_allgather_device_(&engine, &p, &k, &batch, outcomes, restage)
                                     : probe_run_alltoall_device_(&engine, &p, &k, &batch, outcomes, restage);
}

int probe_failed_everywhere(void) { return batch.failed_everywhere; }
/* Outcome i: 0 result, 1 bytes, 2 memory, 3 device, 4 ndim, 5..7 shape, 8 nsplits, 10 + r:
 * recv_splits[r]; -1 for anything else. */
int64_t probe_outcome(int i, int field)
{
    const hvl_outcome *o = &outcomes[i];
    switch (field) {
    case 0: return (intptr_t)o->result;
    case 1: return o->result_bytes;
    case 2: return o->result_memory;
    case 3: return o->result_device;
    case 4: return o->ndim;
    case 5: case 6: case 7: return o->shape[field - 5];
    case 8: return o->nsplits;
    default: return o->recv_splits && field >= 10 && field - 10 < o->nsplits ? o->recv_splits[field - 10] : -1;
    }
}
/* The plane's last batch: tensor i's (input, output, count, device, event), counts[j]. */
int64_t probe_last_tensor(int i, int field)
{
    const hvl_device_tensor *t = &last_tensors[i];
    int64_t f[5] = {(intptr_t)t->input, (intptr_t)t->output, t->count, t->device, (intptr_t)t->ready_event};
    return i >= 0 && i < ENTRIES_MAX && field >= 0 && field < 5 ? f[field] : -1;
}
int64_t probe_last_count(int j) { return last_counts[j]; }
int probe_log_count(void) { return nrecords; }
int probe_log_dropped(void) { return dropped; }
/* The plane's last batch: 1 if it was offered a ticket (left running), 1 if timed. */
int probe_last_ticket(void) { return last.ticket != NULL; }
const char *probe_log_what(int i) { return records[i].what; }
int64_t probe_log_arg(int i, int j) { return records[i].a[j]; }
