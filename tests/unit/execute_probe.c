/* Test probe (tests/unit/test_execute_single.py): how the engine runs CUDA batches on a device
 * plane and keeps those the plane left running (execute.c: HVLITE_NCCL_OVERLAP), on a machine
 * without a GPU. execute.c is compiled into this probe with the registry's plane choice, the
 * entries' ends and the engine's stop going to the probe, and a device plane of the probe's
 * that logs each call: run_device leaves a batch running when the engine lets it (a ticket) or
 * ends it at once; settle answers from a table the test sets (ended, still running, failed).
 * The plane moves no data; the test checks from the log when each batch's entries finished,
 * with what, and what was settled or abandoned first. Counters, ops' flags, clock and log are
 * the engine's own, loaded beside it. The real device plane (NCCL) on a GPU is tested in
 * tests/gpu/test_nccl_plane.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* execute.c's calls out go to the probe; its own functions are compiled here under other names,
 * so the engine's stay untouched. */
#define hvl__planes_prepare probe_planes_prepare
#define hvl__plane_for probe_plane_for
#define hvl__plane_count probe_plane_count
#define hvl__entry_finish probe_entry_finish
#define hvl__entry_detach probe_entry_detach
#define hvl__mark_stopped probe_mark_stopped
#define hvl__handles_notify probe_handles_notify
#define hvl__peers_explain probe_peers_explain
#define hvl__execute probe_execute_
#define hvl__execute_settle probe_execute_settle_
#define hvl__execute_abandon probe_execute_abandon_
#include "../../csrc/core/execute.c"

/* ---- the log ---- */
typedef struct {
    const char *what;           /* "run", "settle", "abandon", "finish", "detach", "stopped", "prepare" */
    int a, b, c, d;             /* run/settle: batch; how; set. finish/detach: entry; status; set;
                                   finish: its buffers (hvl_outcome.buffers) */
    char message[160];
} log_record;

#define LOG_MAX 4096
#define ENTRIES_MAX 256
#define BATCHES_MAX 128
static log_record records[LOG_MAX];
static int nrecords, dropped;

static void note4(const char *what, int a, int b, int c, int d, const char *message)
{
    if (nrecords == LOG_MAX) {
        dropped++;
        return;
    }
    log_record *r = &records[nrecords++];
    *r = (log_record){what, a, b, c, d, ""};
    if (message) snprintf(r->message, sizeof(r->message), "%s", message);
}
static void note(const char *what, int a, int b, int c, const char *message) { note4(what, a, b, c, 0, message); }

/* ---- the probe's device plane: a batch is known by its first entry's index ---- */
enum { RUNNING, ENDED, FAILS };
static hvl_engine engine;
static hvl_entry entries[ENTRIES_MAX];
static char names[ENTRIES_MAX][16];
static float host_data[ENTRIES_MAX][4];
static int nentries;
static int batch_state[ENTRIES_MAX];      /* per batch (first entry): RUNNING, ENDED or FAILS */
static int run_fails[ENTRIES_MAX];        /* run_device of that batch fails with this status (0: not) */
static int abandon_drains = 1;            /* the plane's abandon saw the GPU get past its batches */
static int set_states[4];                 /* the plane's state per set: &set_states[id] */
static hvl_pset psets[4];
static int members[2] = {0, 1};

static int entry_index(const hvl_entry *en) { return (int)(en - entries); }
static int batch_of(const char *name) { return atoi(name + 1); }   /* "t<first entry>" */

static int plane_run_device(hvl_engine *e, hvl_pset *ps, void *state, const hvl_device_batch *b)
{
    (void)e, (void)state;
    int id = batch_of(b->name);
    note("run", id, b->ticket != NULL, ps->id, NULL);
    if (run_fails[id]) return hvl__fail(run_fails[id], "the probe's run of batch %d fails", id);
    if (b->ticket) *b->ticket = &batch_state[id];      /* left running */
    return HVL_OK;
}
static int plane_settle(hvl_engine *e, hvl_pset *ps, void *state, void *ticket, int how, int *done, double *phases)
{
    (void)e, (void)state, (void)phases;
    int id = (int)((int *)ticket - batch_state);
    note("settle", id, how, ps->id, NULL);
    *done = batch_state[id] == ENDED;
    if (batch_state[id] == FAILS) return hvl__fail(HVL_ERR_TIMEOUT, "batch %d did not end (the probe)", id);
    if (how != HVL_SETTLE_LOOK && !*done)     /* a wait ends it: the test said it would run on */
        return hvl__fail(HVL_ERR_TIMEOUT, "batch %d: waited for, never ended (the probe)", id);
    return HVL_OK;
}
static int plane_abandon(hvl_engine *e, hvl_pset *ps, void *state)
{
    (void)e;
    note("abandon", (int)((int *)state - set_states), 0, ps->id, NULL);
    return abandon_drains;
}
static int plane_can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k)
{
    (void)e, (void)ps, (void)state, (void)k;
    return 1;
}
static int plane_allreduce(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, int64_t count,
                           int dtype, int reduce_op)
{
    (void)e, (void)state, (void)dtype, (void)reduce_op;
    if (src != dst) memcpy(dst, src, (size_t)count * sizeof(float));
    note("host_allreduce", (int)count, 0, ps->id, NULL);
    return HVL_OK;
}
static const hvl_backend probe_device_plane = {
    .name = "probe", .can_run = plane_can_run, .run_device = plane_run_device, .settle = plane_settle,
    .abandon = plane_abandon, .allreduce = plane_allreduce,
};

int probe_planes_prepare(hvl_engine *e, hvl_pset *ps, const hvl_batch_kind *k, int device)
{
    (void)e, (void)k;
    note("prepare", device, 0, ps->id, NULL);
    return HVL_OK;
}
hvl_plane probe_plane_for(const hvl_engine *e, const hvl_pset *ps, const hvl_batch_kind *k)
{
    (void)e, (void)k;
    return (hvl_plane){&probe_device_plane, &set_states[ps->id], 0, 0};
}
void probe_plane_count(hvl_engine *e, const hvl_plane *p, int64_t bytes) { (void)e, (void)p, (void)bytes; }
void probe_entry_finish(hvl_engine *e, hvl_entry *en, hvl_outcome *o)
{
    (void)e;
    note4("finish", entry_index(en), o->status, en->d.process_set, o->buffers, o->message);
    free(o->message);
    o->message = NULL;
}
void probe_entry_detach(hvl_engine *e, hvl_entry *en)
{
    (void)e;
    note("detach", entry_index(en), 0, en->d.process_set, NULL);
}
void probe_mark_stopped(const char *why) { note("stopped", 0, 0, 0, why); }
void probe_handles_notify(void) {}
int probe_peers_explain(hvl_engine *e, int rc) { (void)e; return rc; }

/* ---- the test's side ---- */
static hvl_batch batches[BATCHES_MAX];
static hvl_entry *entry_lists[BATCHES_MAX][8];
static int nbatches;

/* A fresh engine (overlap on or off) and log; no batches. */
void probe_reset(int overlap)
{
    probe_execute_abandon_(&engine, HVL_ERR_SHUT_DOWN, "reset");   /* anything still kept */
    free(engine.in_flight);
    free(engine.fusion_buf);
    memset(&engine, 0, sizeof(engine));
    engine.params.nccl_overlap = overlap;
    engine.rank = 0;
    engine.size = 2;
    for (int i = 0; i < 4; i++) psets[i] = (hvl_pset){.id = i, .size = 2, .rank = 0, .ranks = members};
    memset(batch_state, 0, sizeof(batch_state));
    memset(run_fails, 0, sizeof(run_fails));
    abandon_drains = 1;
    nrecords = dropped = nentries = nbatches = 0;
}

/* Adds a batch of `count` tensors to this cycle's list: op (HVL_ALLREDUCE, HVL_BARRIER...),
 * on CUDA (else host memory), of process set `set`. Returns its id (its first entry's index). */
int probe_batch(int op, int cuda, int set, int count)
{
    if (nbatches == BATCHES_MAX || count > 8 || nentries + count > ENTRIES_MAX || set < 0 || set > 3) return -1;
    int id = nentries;
    hvl_batch *b = &batches[nbatches];
    memset(b, 0, sizeof(*b));
    b->op = op;
    b->dtype = HVL_FLOAT32;
    b->reduce_op = HVL_SUM;
    b->memory = cuda ? HVL_MEMORY_CUDA : HVL_MEMORY_HOST;
    b->prescale = b->postscale = 1.0;
    b->ps = &psets[set];
    b->count = count;
    b->entries = entry_lists[nbatches++];
    int data = hvl__op_is(op, HVL_OPF_DATA);
    for (int i = 0; i < count; i++) {
        hvl_entry *en = &entries[nentries];
        memset(en, 0, sizeof(*en));
        snprintf(names[nentries], sizeof(names[nentries]), "t%d", id);
        en->d = (hvl_desc){.op = op, .dtype = HVL_FLOAT32, .ndim = data ? 1 : 0, .shape = {data ? 4 : 0},
                           .process_set = set, .memory = b->memory, .name = names[nentries]};
        if (data) {
            en->input = host_data[nentries];       /* read only by the host plane; never on CUDA */
            en->output = host_data[nentries];
            en->device = cuda ? 0 : -1;
            b->bytes += 16;
        } else {
            en->device = -1;
        }
        b->entries[i] = en;
        nentries++;
    }
    return id;
}

void probe_batch_state(int id, int state) { batch_state[id] = state; }
void probe_run_fails(int id, int status) { run_fails[id] = status; }
void probe_abandon_drains(int drains) { abandon_drains = drains; }

/* The engine's calls: this cycle's batches (then none are listed), a settle, an abandon. */
int probe_execute(void)
{
    hvl_batch_list list = {batches, nbatches, NULL};
    int rc = probe_execute_(&engine, &list);
    nbatches = 0;
    return rc;
}
int probe_settle(int how) { return probe_execute_settle_(&engine, how); }
void probe_abandon(int status, const char *message) { probe_execute_abandon_(&engine, status, message); }
int probe_in_flight(void) { return engine.nin_flight; }

int probe_log_count(void) { return nrecords; }
int probe_log_dropped(void) { return dropped; }
const char *probe_log_what(int i) { return records[i].what; }
int probe_log_arg(int i, int j) { return j == 0 ? records[i].a : j == 1 ? records[i].b : j == 2 ? records[i].c : records[i].d; }
const char *probe_log_message(int i) { return records[i].message; }
