/* Test probe (tests/unit/test_stage_single.py): stage.c's bookkeeping, on a machine without a
 * GPU. stage.c is compiled into this probe with its CUDA driver calls and its one MPI agreement
 * going to the probe, which logs each call and answers it: queued, or refused (an error the test
 * injects); an event or a stream mark is reached after as many looks as the test says. Nothing
 * is copied: the device pointers are addresses that are never read, and the test checks from
 * the log which bytes stage.c asked to copy where, and when. Host memory (the page-locked
 * buffer, a joined rank's stand-ins) is real memory, which stage.c itself writes. Clock, naps,
 * errors and the log are the engine's own, loaded beside it. Staging on a real GPU is tested in
 * tests/gpu/test_cuda_only.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* stage.c's calls to these go to the probe below; its own functions are compiled here under
 * other names, so the engine's stay untouched */
#define hvl__cuda_use probe_use
#define hvl__cuda_wait_event probe_wait_event
#define hvl__cuda_copy_to_host probe_copy_to_host
#define hvl__cuda_copy_to_device probe_copy_to_device
#define hvl__cuda_mark probe_mark
#define hvl__cuda_mark_reached probe_mark_reached
#define hvl__cuda_host_alloc probe_host_alloc
#define hvl__cuda_host_free probe_host_free
#define hvl__cuda_event_new probe_event_new
#define hvl__cuda_event_record probe_event_record
#define hvl__cuda_event_reached probe_event_reached
#define hvl__cuda_event_free probe_event_free
#define hvl__cuda_stuck probe_stuck
#define hvl__cuda_release probe_release
#define hvl__cuda_loaded probe_cuda_loaded
#define hvl__agree probe_agree
#define hvl__stage_in probe_stage_in_whole
#define hvl__stage_out probe_stage_out_
#define hvl__stage_end probe_stage_end_
#define hvl__stage_in_pieces probe_stage_in_pieces_
#define hvl__stage_piece_wait probe_stage_piece_wait_
#define hvl__stage_piece_back probe_stage_piece_back_
#define hvl__stage_free probe_stage_free_
#define hvl_cuda_built probe_cuda_built
#define hvl_cuda_loaded probe_cuda_loaded_public
#include "../../csrc/core/stage.c"

/* ---- the log: one record per call stage.c made ---- */
enum {
    LOG_USE, LOG_WAIT_EVENT, LOG_COPY_TO_HOST, LOG_COPY_TO_DEVICE, LOG_MARK, LOG_MARK_LOOK,
    LOG_HOST_ALLOC, LOG_HOST_FREE, LOG_EVENT_NEW, LOG_EVENT_RECORD, LOG_EVENT_LOOK, LOG_EVENT_FREE,
    LOG_STUCK, LOG_AGREE, LOG_NOTE, LOG_KINDS
};
typedef struct {
    int kind, dev;
    uint64_t dst, src;          /* copies: addresses; looks: what was looked at; agree: its rc */
    int64_t n;                  /* copies: bytes; looks: 1 if reached; events: the event's number */
} log_record;

#define LOG_MAX 100000
#define EVENTS_MAX 8192
#define ENTRIES_MAX 64

static log_record log_records[LOG_MAX];
static int log_count, log_dropped;
static int calls[LOG_KINDS], fail_kind = -1, fail_at;     /* the fail_at-th call of fail_kind fails */
static int event_looks, mark_looks;                      /* looks until reached (-1: never) */
static int event_seen[EVENTS_MAX], event_number[EVENTS_MAX], events_made;
static int mark_seen[64];
static hvl_engine engine;
static hvl_pset pset;
static int members[2];
static hvl_entry entries[ENTRIES_MAX], *entry_list[ENTRIES_MAX];
static char names[ENTRIES_MAX][16];
static char *stand_ins[ENTRIES_MAX];
static int entry_events[ENTRIES_MAX];     /* the entries' ready events: their addresses */
static hvl_batch batch;
static hvl_stage stage;

static int note(int kind, int dev, uint64_t dst, uint64_t src, int64_t n)
{
    if (log_count < LOG_MAX) log_records[log_count++] = (log_record){kind, dev, dst, src, n};
    else log_dropped++;
    if (kind == fail_kind && ++calls[kind] == fail_at)
        return hvl__fail(HVL_ERR_CUDA, "the probe refuses call %d of kind %d", fail_at, kind);
    return HVL_OK;
}

int probe_use(int dev) { return note(LOG_USE, dev, 0, 0, 0); }
int probe_wait_event(int dev, void *event) { return note(LOG_WAIT_EVENT, dev, (uintptr_t)event, 0, 0); }
int probe_copy_to_host(int dev, void *host, const void *device, int64_t bytes)
{
    return note(LOG_COPY_TO_HOST, dev, (uintptr_t)host, (uintptr_t)device, bytes);
}
int probe_copy_to_device(int dev, void *device, const void *host, int64_t bytes)
{
    return note(LOG_COPY_TO_DEVICE, dev, (uintptr_t)device, (uintptr_t)host, bytes);
}
int probe_mark(int dev)
{
    mark_seen[dev] = 0;
    return note(LOG_MARK, dev, 0, 0, 0);
}
int probe_mark_reached(int dev, int *done)
{
    *done = mark_looks >= 0 && ++mark_seen[dev] > mark_looks;
    return note(LOG_MARK_LOOK, dev, 0, 0, *done);
}
/* Host allocations still held: freed by probe_reset whatever stage.c did (it abandons a buffer
 * to copies that never finished, on purpose), so a sanitizer run sees no leak. */
#define HOST_ALLOCS_MAX 64
static void *host_allocs[HOST_ALLOCS_MAX];

int probe_host_alloc(int dev, void **out, int64_t bytes)
{
    int slot = 0;
    while (slot < HOST_ALLOCS_MAX && host_allocs[slot]) slot++;
    if (slot == HOST_ALLOCS_MAX) return hvl__fail(HVL_ERR_SYSTEM, "the probe's host allocations ran out");
    void *p = NULL;
    *out = NULL;
    if (posix_memalign(&p, 4096, (size_t)bytes)) return hvl__oom("probe host memory");   /* page-aligned, as CUDA's */
    if (note(LOG_HOST_ALLOC, dev, (uintptr_t)p, 0, bytes) != HVL_OK) {
        free(p);
        return hvl__last_status();
    }
    host_allocs[slot] = *out = p;
    return HVL_OK;
}
void probe_host_free(void *p)
{
    note(LOG_HOST_FREE, -1, (uintptr_t)p, 0, 0);
    for (int i = 0; i < HOST_ALLOCS_MAX; i++)
        if (host_allocs[i] == p) host_allocs[i] = NULL;
    free(p);
}
/* An event is an index into event_seen; its number is the order it was made in this batch.
 * NULL where making it failed, as the driver's; freeing NULL does nothing. */
int probe_event_new(int dev, int timed, void **event)
{
    (void)timed;
    *event = NULL;
    if (events_made == EVENTS_MAX) return hvl__fail(HVL_ERR_SYSTEM, "the probe's events ran out");
    HVL_CHECK(note(LOG_EVENT_NEW, dev, 0, 0, events_made));
    int i = events_made++;
    event_number[i] = i;
    *event = &event_number[i];
    return HVL_OK;
}
int probe_event_record(int dev, void *event)
{
    int i = *(int *)event;
    event_seen[i] = 0;
    return note(LOG_EVENT_RECORD, dev, 0, 0, i);
}
int probe_event_reached(int dev, void *event, int *done)
{
    int i = *(int *)event;
    *done = event_looks >= 0 && ++event_seen[i] > event_looks;
    return note(LOG_EVENT_LOOK, dev, (uint64_t)*done, 0, i);
}
void probe_event_free(int dev, void *event, int timed) { if (event) note(LOG_EVENT_FREE, dev, timed, 0, *(int *)event); }
void probe_stuck(void) { note(LOG_STUCK, -1, 0, 0, 0); }
void probe_release(void) {}
int probe_cuda_loaded(void) { return 1; }

/* One member's view of the agreement: it fails alike everywhere when this rank failed, or
 * when the test says another member did (as hvl__agree does when any member did). */
static int peer_fails;

int probe_agree(MPI_Comm comm, int local_rc, const char *what, int *everywhere, hvl_bound bound)
{
    (void)comm, (void)bound;
    note(LOG_AGREE, -1, (uint64_t)local_rc, 0, 0);
    *everywhere = local_rc != HVL_OK || peer_fails;
    if (local_rc != HVL_OK) return hvl__fail(HVL_ERR_INVALID_ARG, "%s: %s", what, hvl_last_error());
    return peer_fails ? hvl__fail(HVL_ERR_INVALID_ARG, "%s failed on another rank", what) : HVL_OK;
}

/* ---- the test's side ---- */

/* A fresh engine (no staging buffer) and log; timeout_s: the peer timeout. */
void probe_reset(double timeout_s)
{
    for (int i = 0; i < ENTRIES_MAX; i++) free(stand_ins[i]), stand_ins[i] = NULL;
    for (int i = 0; i < HOST_ALLOCS_MAX; i++) free(host_allocs[i]), host_allocs[i] = NULL;
    free(engine.fusion_buf);
    memset(&engine, 0, sizeof(engine));
    engine.params.peer_timeout_s = timeout_s;
    log_count = log_dropped = events_made = peer_fails = 0;
    memset(calls, 0, sizeof(calls));
    fail_kind = -1;
    event_looks = mark_looks = 0;
}

/* The GPU's pace: an event (a mark) is reached at the look after `events` (`marks`) looks
 * since it was recorded; -1: never. */
void probe_pace(int events, int marks) { event_looks = events, mark_looks = marks; }
void probe_fail(int kind, int nth) { fail_kind = kind, fail_at = nth, calls[kind] = 0; }
void probe_peer_fails(int fails) { peer_fails = fails; }

/* A new batch of op `op` on a set of `size` members where this process is member `rank`
 * (global ranks 0..size-1), broadcast root `root`. */
void probe_batch(int op, int rank, int size, int root)
{
    memset(&batch, 0, sizeof(batch));
    memset(&pset, 0, sizeof(pset));
    members[0] = 0, members[1] = 1;
    pset = (hvl_pset){.size = size, .rank = rank, .ranks = members};
    engine.rank = rank;
    batch.op = op;
    batch.root_rank = root;
    batch.dtype = HVL_UINT8;
    batch.ps = &pset;
    batch.entries = entry_list;
}

/* Adds a tensor of `bytes` (uint8, one dimension) on CUDA device `device` (input at 0x10000000000
 * << i's slot, output 0x20000000000 apart; with a ready event if `event`), or, for device -1, a
 * joined rank's stand-in in host memory whose bytes are i + 1. Returns its index. */
int probe_entry(int64_t bytes, int device, int event, int in_place)
{
    int i = batch.count++;
    hvl_entry *en = &entries[i];
    memset(en, 0, sizeof(*en));
    snprintf(names[i], sizeof(names[i]), "t%d", i);
    en->d = (hvl_desc){.op = batch.op, .dtype = HVL_UINT8, .ndim = 1, .shape = {bytes}, .name = names[i]};
    en->device = device;
    if (device >= 0) {
        en->input = (const void *)(uintptr_t)(0x10000000000ull * (uint64_t)(i + 1));
        en->output = batch.op == HVL_ALLGATHER || batch.op == HVL_ALLTOALL ? NULL   /* the engine's */
                     : in_place ? (void *)en->input
                     : (void *)(uintptr_t)(0x10000000000ull * (uint64_t)(i + 1) + 0x8000000000ull);
        en->ready_event = event ? &entry_events[i] : NULL;   /* only logged: its address */
    } else {
        stand_ins[i] = malloc(bytes > 0 ? (size_t)bytes : 1);
        memset(stand_ins[i], i + 1, (size_t)bytes);
        en->input = stand_ins[i];
        en->output = stand_ins[i];
    }
    entry_list[i] = en;
    batch.bytes += bytes;
    return i;
}

uint64_t probe_entry_input(int i) { return (uintptr_t)entries[i].input; }
uint64_t probe_entry_event(int i) { return (uintptr_t)entries[i].ready_event; }
uint64_t probe_entry_output(int i) { return (uintptr_t)entries[i].output; }
uint64_t probe_saved_output(int i) { return stage.saved ? (uintptr_t)stage.saved[i].output : 0; }

/* stage.h's calls on the probe's batch. */
int probe_stage_in(void) { return probe_stage_in_whole(&engine, &batch, &stage); }
int probe_stage_in_pieces(int64_t piece) { return probe_stage_in_pieces_(&engine, &batch, &stage, piece); }
int probe_piece_wait(int k) { return probe_stage_piece_wait_(&engine, &batch, &stage, k); }
void probe_piece_back(int k)
{
    note(LOG_NOTE, -1, 0, 0, k);    /* marks where the call began in the log */
    probe_stage_piece_back_(&batch, &stage, k);
}
int probe_stage_out(void) { return probe_stage_out_(&engine, &batch, &stage); }
void probe_stage_end(void) { probe_stage_end_(&engine, &batch, &stage); }
void probe_stage_free(void) { probe_stage_free_(&engine); }

/* What stage.c holds now: by name. */
int64_t probe_state(const char *what)
{
    if (!strcmp(what, "flat")) return (int64_t)(uintptr_t)stage.flat;
    if (!strcmp(what, "npieces")) return stage.npieces;
    if (!strcmp(what, "reached")) return stage.reached;
    if (!strcmp(what, "backed")) return stage.backed;
    if (!strcmp(what, "queued")) return stage.queued;
    if (!strcmp(what, "devices")) return (int64_t)stage.devices;
    if (!strcmp(what, "events")) return stage.events != NULL;
    if (!strcmp(what, "stage_buf")) return (int64_t)(uintptr_t)engine.stage_buf;
    if (!strcmp(what, "stage_cap")) return engine.stage_cap;
    if (!strcmp(what, "stuck")) return engine.stage_stuck;
    if (!strcmp(what, "fusion_buf")) return (int64_t)(uintptr_t)engine.fusion_buf;
    if (!strcmp(what, "failed_everywhere")) return batch.failed_everywhere;
    if (!strcmp(what, "retired")) {
        int64_t n = 0;
        for (void *p = engine.stage_retired; p; p = *(void **)p) n++;
        return n;
    }
    return -1;
}

int probe_log_count(void) { return log_count; }
int probe_log_dropped(void) { return log_dropped; }
void probe_log_get(int i, int *kind, int *dev, uint64_t *dst, uint64_t *src, int64_t *n)
{
    *kind = log_records[i].kind, *dev = log_records[i].dev;
    *dst = log_records[i].dst, *src = log_records[i].src, *n = log_records[i].n;
}
