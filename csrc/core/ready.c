/* ready.c: which pending requests enter this cycle's negotiation. A CUDA tensor is submitted
 * once the framework has queued the kernels that write it, usually long before the GPU runs
 * them: the host runs ahead. Negotiated at once, the gradients of a backward pass fall into one
 * or two batches, and the last of them waits for the end of the backward pass, then runs whole
 * while nothing else does. Held back instead until the GPU has reached the event the framework
 * recorded at submit (a query, never a wait), tensors are negotiated as the GPU writes them: the
 * batches follow the GPU's progress, as DDP's buckets do, and only the last layers' gradients
 * are left to exchange when the backward pass ends. (Horovod negotiates them at once and waits
 * for the events when it runs the batch, its thread blocked, as hvlite did before.)
 *
 * Rules (hvl__ready_hold, once a cycle, before negotiation):
 * - only entries with a ready event (CUDA memory) are held, never after they were sent to the
 *   coordinator, and nothing else waits for them (host tensors and ops without data go on);
 * - a group (one burst: a grouped call, a gradient bucket) is held while any member is, so it
 *   still enters negotiation, and fuses, as one;
 * - at most HOLD_MAX_S after submit: a GPU that does not get there (a kernel that hangs) is then
 *   found by the batch's own bounded waits, with their error, as without the hold;
 * - a query that fails releases the entry (the batch's own CUDA calls report the error).
 * The coordinator's deadlock check takes a tensor it has not received from a rank as in flight,
 * so a held tensor never counts as a deadlock. The timeline marks where a held tensor's hold
 * ended (GPU_READY, with why). HVLITE_GPU_READY_ONLY=0 turns holding off.
 * bg thread only. */
#include "cuda_driver.h"
#include "cycle.h"
#include "timeline.h"

#define HOLD_MAX_S 5.0
#define GROUPS_TRACKED 16     /* groups still held, remembered per cycle; more: hold every group */

/* NULL while the entry stays held; else why it no longer is: the GPU is past its ready event,
 * or holding it any longer would serve nothing (sent, held too long, a failed query). */
static const char *released(hvl_entry *en, double now)
{
    int done = 0;
    if (en->sent) return "sent to the coordinator";
    if (now - en->enqueued_at > HOLD_MAX_S) return "held for the longest time allowed: its batch waits for the GPU";
    if (hvl__cuda_event_reached(en->device, en->ready_event, &done) != HVL_OK) {
        hvl__log_once("gpu ready query", HVL_LOG_DEBUG, "tensor '%s': querying its ready event "
                      "failed (%s); it is negotiated without waiting for it", en->d.name, hvl_last_error());
        return "its ready event could not be queried";
    }
    return done ? "the GPU wrote it" : NULL;
}

void hvl__ready_hold(hvl_engine *e)
{
    uint64_t groups[GROUPS_TRACKED];
    int ngroups = 0, overflow = 0;
    double now = hvl__now();
    if (!hvl__cuda_loaded()) return;      /* no CUDA request yet: nothing is ever held */
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        const char *why = en->gpu_pending ? released(en, now) : NULL;
        if (why) {
            if (en->gpu_pending == 2 && hvl__tl_active()) hvl__tl_note(en->d.name, "GPU_READY", why);
            en->gpu_pending = 0;
        }
        en->held = en->gpu_pending != 0;
        if (en->gpu_pending == 1) {           /* held the first time */
            en->gpu_pending = 2;
            hvl__count(&e->counters.tensors_held_for_gpu, 1);
        }
        if (!en->held || !en->group) continue;
        int known = 0;
        for (int i = 0; i < ngroups && !known; i++) known = groups[i] == en->group;
        if (known) continue;
        if (ngroups < GROUPS_TRACKED) groups[ngroups++] = en->group; else overflow = 1;
    }
    if (!ngroups) return;
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        if (en->held || !en->group || en->sent) continue;
        for (int i = 0; i < ngroups && !en->held; i++) en->held = groups[i] == en->group;
        en->held |= overflow;
    }
}
