/* Test probe (tests/unit/test_ready_single.py): ready.c's holding rules, on a machine without a
 * GPU. ready.c is compiled into this probe with its two CUDA queries answered from a table the
 * test sets (for each entry: the GPU wrote it, not yet, or the query fails); everything else it
 * calls (clock, counters, ops' flags, log) is the engine's own, loaded beside it. It checks which
 * pending requests a cycle keeps out of negotiation, not CUDA: holding on a real GPU is tested in
 * tests/gpu/test_cuda_only.py. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ready.c's own calls to these go to the probe's answers below; its functions are compiled here
 * under other names, so the engine's stay untouched */
#define hvl__cuda_loaded probe_cuda_loaded
#define hvl__cuda_event_reached probe_event_reached
#define hvl__ready_hold probe_ready_hold
#define hvl__ready_admit probe_ready_admit
#define hvl__ready_all_written probe_ready_all_written
#include "../../csrc/core/ready.c"

#define MAX_ENTRIES 200

static hvl_engine engine;
static hvl_entry entries[MAX_ENTRIES];
static char names[MAX_ENTRIES][16];
static int gpu_state[MAX_ENTRIES];     /* 1: the GPU passed the entry's ready event, 0: not yet, -1: query fails */
static int count, cuda_loaded;
static hvl_pset sets[2], *set_table[2] = {&sets[0], &sets[1]};   /* sets 0 and 1 */

int probe_cuda_loaded(void) { return cuda_loaded; }

/* The entry's ready_event points at its gpu_state slot. */
int probe_event_reached(int dev, void *event, int *done)
{
    (void)dev;
    int state = *(const int *)event;
    if (state < 0) return hvl__fail(HVL_ERR_SYSTEM, "the probe's query fails");
    *done = state;
    return HVL_OK;
}

/* An empty pending list; deadlock_s as HVLITE_DEADLOCK_SECONDS; loaded: CUDA was loaded. */
void probe_reset(double deadlock_s, int loaded)
{
    memset(&engine, 0, sizeof(engine));
    memset(entries, 0, sizeof(entries));
    engine.params.deadlock_s = deadlock_s;
    engine.params.gpu_ready_only = 1;
    for (int i = 0; i < 2; i++) sets[i] = (hvl_pset){.id = i, .cuda_device = -1};
    engine.psets = set_table;
    engine.npsets = 2;
    cuda_loaded = loaded;
    count = 0;
}

/* Appends a pending request, as queue.c enqueues it, submitted age_s ago: op HVL_ALLREDUCE,
 * HVL_BARRIER, HVL_JOIN...; on_gpu: CUDA memory with a ready event (else host memory); group:
 * its burst (0: none); sent: already sent to the coordinator. Returns its index, or -1. */
int probe_add(int op, int on_gpu, uint64_t group, double age_s, int sent)
{
    if (count == MAX_ENTRIES) return -1;
    int i = count++;
    hvl_entry *en = &entries[i];
    snprintf(names[i], sizeof(names[i]), "t%d", i);
    en->d.op = op;
    en->d.name = names[i];
    en->d.memory = on_gpu ? HVL_MEMORY_CUDA : HVL_MEMORY_HOST;
    en->device = on_gpu ? 0 : -1;
    en->ready_event = on_gpu ? &gpu_state[i] : NULL;
    gpu_state[i] = 0;
    en->group = group;
    en->sent = sent;
    en->enqueued_at = hvl__now() - age_s;
    en->gpu_pending = en->ready_event && engine.params.gpu_ready_only;
    en->ready_at = en->enqueued_at;
    en->prev_pending = engine.pending_tail;
    if (engine.pending_tail) engine.pending_tail->next_pending = en; else engine.pending_head = en;
    engine.pending_tail = en;
    return i;
}

/* An entry of set `set` going pending (queue.c's drain calls hvl__ready_admit): on CUDA device
 * `device` (-1: host memory, or a joined rank's stand-in), with a ready event if on a device;
 * holding per `hold` (HVLITE_GPU_READY_ONLY). Returns its index; its set_device and
 * gpu_pending say what admission decided. */
int probe_admit(int set, int device, int hold)
{
    if (count == MAX_ENTRIES) return -1;
    int i = count++;
    hvl_entry *en = &entries[i];
    snprintf(names[i], sizeof(names[i]), "t%d", i);
    en->d = (hvl_desc){.op = HVL_ALLREDUCE, .process_set = set, .memory = device >= 0 ? HVL_MEMORY_CUDA : HVL_MEMORY_HOST,
                       .device = device, .set_device = -1, .name = names[i]};
    en->device = device;
    en->ready_event = device >= 0 ? &gpu_state[i] : NULL;
    engine.params.gpu_ready_only = hold;
    probe_ready_admit(&engine, en);
    return i;
}
int probe_set_device(int i) { return entries[i].d.set_device; }
int probe_pinned(int set) { return sets[set].cuda_device; }

void probe_gpu(int i, int state) { gpu_state[i] = state; }
void probe_hold(void) { probe_ready_hold(&engine); }
int probe_all_written(void) { return probe_ready_all_written(&engine); }

/* Takes entry i off the pending list, as a failure or completion does. */
void probe_unlink(int i)
{
    hvl_entry *en = &entries[i];
    if (en->prev_pending) en->prev_pending->next_pending = en->next_pending; else engine.pending_head = en->next_pending;
    if (en->next_pending) en->next_pending->prev_pending = en->prev_pending; else engine.pending_tail = en->prev_pending;
    en->prev_pending = en->next_pending = NULL;
}
int probe_held_for_gpu(void) { return engine.held_for_gpu; }
int probe_held(int i) { return entries[i].held; }
int probe_gpu_pending(int i) { return entries[i].gpu_pending; }
double probe_ready_delay(int i) { return entries[i].ready_at - entries[i].enqueued_at; }
int64_t probe_counter(void) { return engine.counters.tensors_held_for_gpu; }
