/* ready.c: which pending requests enter this cycle's negotiation, and how. A CUDA tensor is submitted
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
 *   coordinator;
 * - a group (one burst: a grouped call, a gradient bucket) is held while any member is, so it
 *   still enters negotiation, and fuses, as one (while at most GROUPS_TRACKED groups are held:
 *   past that, each member goes on its own); nothing outside the group waits for it;
 * - nothing submitted before an op without data (barrier, join, process-set changes) is held:
 *   that op must not overtake it (a join that completed first would leave it without the
 *   joined ranks' stand-ins; a set removed first would fail it);
 * - at most hold_max(): a GPU that does not get there (a kernel that hangs) is then found by the
 *   batch's own bounded waits, with their error, as without the hold. It is half the deadlock
 *   check's time at most: a rank that holds X and then waits on Y, while a peer waits on X
 *   before it submits Y, is no deadlock, but looks like one while X is held;
 * - a query that fails releases the entry (the batch's own CUDA calls report the error).
 * The coordinator's deadlock check takes a tensor it has not received from a rank as in flight,
 * so the holder's own waits never count as a deadlock. The timeline marks where a held tensor's
 * own hold ended (GPU_READY, with why; its group may hold it a little longer). A held tensor's
 * patience for the response cache (negotiate.c) starts when its hold ends (en->ready_at).
 * Between cycles the engine asks hvl__ready_all_written (engine.c's wait, from HELD_LOOK_S on,
 * backing off; not while NCCL batches are left running):
 * once the GPU has written everything held, the next cycle starts at once instead of at the
 * cycle time. Those are the last gradients of a backward pass, whose exchange is what the step
 * waits for, or a lone tensor whose caller waits for it: without this, holding would add up to
 * a cycle time to them (negotiated at submit, the batch would wait on the GPU with no delay).
 * While other held tensors are still being written, the cycle time stands: what the GPU writes
 * meanwhile fuses into one batch.
 * Holding is off unless HVLITE_GPU_READY_ONLY=1 (experimental: not yet run on a GPU); without it
 * a CUDA tensor is negotiated at once and its batch waits for its ready event on the GPU.
 * Admission (hvl__ready_admit, as an entry goes pending): a rank's CUDA tensors of one process
 * set stay on one device, its first one's (NCCL's communicator is per device). One on another
 * device says so in its request (d.set_device), and the coordinator fails it on every rank with
 * a message naming the ranks and devices: agreed before any NCCL call, so no peer waits for it
 * inside NCCL until the peer timeout.
 * bg thread only. */
#include "cuda_driver.h"
#include "cycle.h"
#include "timeline.h"

#define HOLD_MAX_S 5.0
#define GROUPS_TRACKED 64     /* groups still held, remembered per cycle; more: not held as groups */

static double hold_max(const hvl_engine *e)
{
    double deadlock_s = e->params.deadlock_s;
    return deadlock_s > 0 && deadlock_s / 2 < HOLD_MAX_S ? deadlock_s / 2 : HOLD_MAX_S;
}

/* NULL while the entry stays held; else why it no longer is: the GPU is past its ready event,
 * or holding it any longer would serve nothing or harm (see the rules). A held entry is never
 * sent to the coordinator, so `sent` needs no look here. */
static const char *released(const hvl_engine *e, hvl_entry *en, double now, int before_op)
{
    int done = 0;
    if (before_op) return "an op without data submitted after it must not overtake it";
    if (now - en->enqueued_at > hold_max(e)) return "held for the longest time allowed: its batch waits for the GPU";
    if (hvl__cuda_event_reached(en->device, en->ready_event, &done) != HVL_OK) {
        hvl__log_once("gpu ready query", HVL_LOG_DEBUG, "tensor '%s': querying its ready event "
                      "failed (%s); it is negotiated without waiting for it", en->d.name, hvl_last_error());
        return "its ready event could not be queried";
    }
    return done ? "the GPU wrote it" : NULL;
}

void hvl__ready_admit(hvl_engine *e, hvl_entry *en)
{
    en->gpu_pending = en->ready_event && e->params.gpu_ready_only;
    hvl_pset *ps = en->device >= 0 ? hvl__pset(e, en->d.process_set) : NULL;
    if (!ps) return;
    if (ps->cuda_device < 0) ps->cuda_device = en->device;
    else if (en->device != ps->cuda_device) en->d.set_device = ps->cuda_device;
}

void hvl__ready_hold(hvl_engine *e)
{
    uint64_t groups[GROUPS_TRACKED];
    int ngroups = 0, overflow = 0;
    double now = hvl__now();
    e->held_for_gpu = 0;
    if (!hvl__cuda_loaded()) return;      /* no CUDA request yet: nothing is ever held */
    hvl_entry *last_op = NULL;            /* the last pending op without data */
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending)
        if (!hvl__op_is(en->d.op, HVL_OPF_DATA)) last_op = en;
    int before_op = last_op != NULL;
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        if (en == last_op) before_op = 0;
        const char *why = en->gpu_pending ? released(e, en, now, before_op) : NULL;
        if (why) {
            if (en->gpu_pending == 2) {
                if (hvl__tl_active()) hvl__tl_note(en->d.name, "GPU_READY", why);
                en->ready_at = now;         /* the response cache's patience starts now */
            }
            en->gpu_pending = 0;
        }
        en->held = en->gpu_pending != 0;
        if (en->gpu_pending == 1) {           /* held the first time */
            en->gpu_pending = 2;
            hvl__count(&e->counters.tensors_held_for_gpu, 1);
        }
        e->held_for_gpu += en->gpu_pending != 0;
        if (!en->held || !en->group) continue;
        int known = 0;
        for (int i = 0; i < ngroups && !known; i++) known = groups[i] == en->group;
        if (known) continue;
        if (ngroups < GROUPS_TRACKED) groups[ngroups++] = en->group; else overflow = 1;
    }
    if (!ngroups || overflow) return;     /* too many groups held at once: each goes on its own */
    before_op = last_op != NULL;
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        if (en == last_op) before_op = 0;
        if (en->held || !en->group || en->sent || before_op || now - en->enqueued_at > hold_max(e)) continue;
        for (int i = 0; i < ngroups && !en->held; i++) en->held = groups[i] == en->group;
    }
}

/* Newest first, stopping at the first not written: while the GPU is still writing a backward
 * pass's gradients that is one query. A query that fails counts as written (the next cycle's
 * hvl__ready_hold releases the entry). */
int hvl__ready_all_written(hvl_engine *e)
{
    if (!e->held_for_gpu) return 0;
    for (hvl_entry *en = e->pending_tail; en; en = en->prev_pending) {
        int done = 0;
        if (en->gpu_pending && hvl__cuda_event_reached(en->device, en->ready_event, &done) == HVL_OK && !done)
            return 0;
    }
    return 1;
}
