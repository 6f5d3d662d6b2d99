/* stage.c: the staged path of device memory. A batch of CUDA tensors that no plane runs on the
 * device goes through page-locked host memory: each device input is copied to the host on the
 * engine's stream of its device, after the event the framework recorded when it submitted the
 * tensor (stream order; never a device-wide synchronise), the entries' pointers are swapped for
 * their host copies so the host planes and the scale loops see only host memory, and after the
 * collective the results are copied back on the same stream. Both waits poll an event on the
 * engine's stream, bounded by the peer timeout and the shutdown and fatal flags.
 *
 * Agreement: a failed copy to the host would leave the other members waiting in the collective,
 * so the members agree on the stage-in (hvl__agree) and fail the batch alike. The copy back
 * runs after the collective; a failure there is this rank's alone (fatal to its engine).
 * Owns the pinned staging buffer (e->stage_buf). Entries whose buffers are host memory (a joined
 * rank's stand-ins) are left as they are. Nothing here reads or writes device memory itself.
 * bg thread only. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_driver.h"
#include "stage.h"

#define STAGE_ALIGN 64
#define STAGE_MIN (1 << 20)          /* pinned allocations are slow: grow in large steps */

static int64_t aligned(int64_t n) { return (n + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* Bytes of an entry's output: the input's for allreduce and broadcast (staged in place), this
 * rank's rows for reducescatter; 0 where the engine owns the result (allgather, alltoall). */
static int64_t output_bytes(const hvl_batch *b, const hvl_entry *en)
{
    switch (b->op) {
    case HVL_ALLREDUCE: case HVL_BROADCAST: return hvl__desc_bytes(&en->d);
    case HVL_REDUCESCATTER:
        return hvl_reducescatter_rows(en->d.shape[0], b->ps->rank, b->ps->size) * hvl__row_bytes(en);
    default: return 0;
    }
}

/* Room in the pinned buffer: grown (never shrunk) to the next power of 2 from STAGE_MIN. */
static int reserve(hvl_engine *e, int64_t need)
{
    if (need <= e->stage_cap) return HVL_OK;
    int64_t cap = e->stage_cap > STAGE_MIN ? e->stage_cap : STAGE_MIN;
    while (cap < need) cap *= 2;
    hvl__cuda_host_free(e->stage_buf);
    e->stage_buf = NULL;
    e->stage_cap = 0;
    void *buf;
    HVL_CHECK(hvl__cuda_host_alloc(&buf, cap));
    e->stage_buf = buf;
    e->stage_cap = cap;
    return HVL_OK;
}

/* Polls the engine stream's mark on every device in `devices` until each stream reached it,
 * bounded like every wait on peers (the peer timeout, the shutdown and fatal flags). */
static int wait_devices(hvl_engine *e, uint64_t devices, const hvl_batch *b, const char *what)
{
    for (int d = 0; d < 64; d++)
        if (devices >> d & 1) HVL_CHECK(hvl__cuda_mark(d));
    hvl_bound bound = hvl__peer_bound(e);
    double start = hvl__now(), nap_s = 2e-6;
    for (;;) {
        int all = 1;
        for (int d = 0; d < 64 && all; d++) {
            if (!(devices >> d & 1)) continue;
            HVL_CHECK(hvl__cuda_mark_reached(d, &all));
        }
        if (all) return HVL_OK;
        double waited = hvl__now() - start;
        if (bound.timeout_s > 0 && waited > bound.timeout_s)
            return hvl__fail(HVL_ERR_TIMEOUT, "%s of tensor '%s': the GPU did not get there in %.0f s "
                             "(HVLITE_PEER_TIMEOUT_SECONDS): a kernel before it on the framework's "
                             "stream still runs or hangs", what, b->entries[0]->d.name, waited);
        HVL_CHECK(hvl__bound_flags(&bound, waited, what));
        struct timespec ts = {0, (long)(nap_s * 1e9)};
        nanosleep(&ts, NULL);        /* copies take microseconds to milliseconds: short naps */
        nap_s = nap_s * 2 < 100e-6 ? nap_s * 2 : 100e-6;
    }
}

/* Copies this rank's device inputs into the pinned buffer and points the entries at the copies
 * (the caller's pointers are kept in st). */
static int copy_in(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    int64_t need = 0;
    for (int i = 0; i < b->count; i++)
        if (b->entries[i]->device >= 0)
            need += aligned(hvl__desc_bytes(&b->entries[i]->d)) + aligned(output_bytes(b, b->entries[i]));
    if (need == 0) return HVL_OK;
    HVL_CHECK(reserve(e, need));
    char *at = e->stage_buf;
    for (int i = 0; i < b->count; i++) {
        hvl_entry *en = b->entries[i];
        if (en->device < 0) continue;
        int64_t in_bytes = hvl__desc_bytes(&en->d), out_bytes = output_bytes(b, en);
        int in_place = b->op == HVL_ALLREDUCE || b->op == HVL_BROADCAST;
        int sends = b->op != HVL_BROADCAST || e->rank == b->root_rank;   /* others only receive */
        st->saved[i] = (hvl_stage_saved){en->input, en->output, 1};
        st->devices |= 1ull << en->device;
        if (en->ready_event) HVL_CHECK(hvl__cuda_wait_event(en->device, en->ready_event));
        if (sends && in_bytes > 0) HVL_CHECK(hvl__cuda_copy_to_host(en->device, at, en->input, in_bytes));
        en->input = at;
        en->output = in_place ? at : out_bytes > 0 ? at + aligned(in_bytes) : NULL;
        at += aligned(in_bytes) + aligned(out_bytes);
    }
    return wait_devices(e, st->devices, b, "copying to host memory");
}

int hvl__stage_in(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    memset(st, 0, sizeof(*st));
    st->saved = calloc((size_t)b->count, sizeof(*st->saved));
    int rc = st->saved ? copy_in(e, b, st) : hvl__oom("staging pointers");
    /* every member agrees before anyone enters the collective */
    return hvl__agree(b->ps->comm, rc, "staging CUDA tensors through host memory",
                      &b->failed_everywhere, hvl__peer_bound(e));
}

int hvl__stage_out(hvl_engine *e, hvl_batch *b, hvl_stage *st)
{
    for (int i = 0; i < b->count; i++) {
        hvl_entry *en = b->entries[i];
        int64_t bytes = output_bytes(b, en);
        if (!st->saved || !st->saved[i].staged || bytes == 0) continue;
        HVL_CHECK(hvl__cuda_copy_to_device(en->device, st->saved[i].output, en->output, bytes));
    }
    return st->devices ? wait_devices(e, st->devices, b, "copying back to the GPU") : HVL_OK;
}

void hvl__stage_end(hvl_batch *b, hvl_stage *st)
{
    for (int i = 0; st->saved && i < b->count; i++) {
        if (!st->saved[i].staged) continue;
        b->entries[i]->input = st->saved[i].input;
        b->entries[i]->output = st->saved[i].output;
    }
    free(st->saved);
    memset(st, 0, sizeof(*st));
}

void hvl__stage_free(hvl_engine *e)
{
    hvl__cuda_host_free(e->stage_buf);
    e->stage_buf = NULL;
    e->stage_cap = 0;
    hvl__cuda_release();
}

int hvl_cuda_built(void) { return 1; }   /* the staged path serves CUDA buffers on every plane */
int hvl_cuda_loaded(void) { return hvl__cuda_loaded(); }
