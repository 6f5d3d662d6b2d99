/* cycle.h: the steps of the engine's cycle, in the order engine.c runs them:
 *     queue (take new requests) -> negotiation (agree on what runs) -> claim (responses meet
 *     this rank's entries) -> fusion (batches) -> execution (data planes) -> completion (handles)
 * Each step is one file; this header is their contract with engine.c and with each other.
 * bg thread only, except where a function says otherwise. */
#ifndef HVLITE_CYCLE_H
#define HVLITE_CYCLE_H

#include "engine.h"

/* ---- handles (handle.c): what a waiting user thread sees ---- */
int hvl__handle_new(int64_t *id, const char *name);                 /* under queue_lock */
/* Frees a completed handle and what the engine owned for it; *name gets its engine name (the
 * caller's to free; NULL on failure). HVL_ERR_IN_PROGRESS while pending, HVL_ERR_INVALID_ARG
 * for an unknown handle. Any thread, under queue.c's names_lock (hvl_release). */
int hvl__handle_free(int64_t id, char **name);
typedef struct {
    int status;
    char *message;              /* moved into the handle */
    void *result;               /* moved into the handle (allgather, alltoall); hvl__result_free */
    int64_t result_bytes;
    int result_memory;          /* hvl_memory of result: HOST (zeroed), or CUDA on device
                                   result_device (a device plane's, written once the batch ended) */
    int result_device;
    int ndim;
    int64_t shape[HVL_MAX_DIMS];
    int64_t *recv_splits;       /* moved into the handle */
    int nsplits;                /* entries of recv_splits */
    int64_t value;              /* join: the last rank that joined; add_process_set: the set id */
    int buffers;                /* after an error, whether the buffers may still be touched
                                   (hvl_buffers_busy): HVL_BUFFERS_BY_STATUS, _BUSY or _FREE */
} hvl_outcome;
/* hvl_outcome.buffers: decided by the error's kind (those decided before any data moved leave
 * the buffers free; any other may have left work queued on them), or known. */
enum { HVL_BUFFERS_BY_STATUS, HVL_BUFFERS_BUSY, HVL_BUFFERS_FREE };
/* Completes a handle; waiters see it at the next hvl__handles_notify (once per batch, so a fused
 * batch of many tensors wakes a waiting thread once, not once per tensor). */
void hvl__handle_complete(int64_t id, hvl_outcome *o);
void hvl__handles_notify(void);
/* Frees an outcome's result wherever it lives (any thread; a device result only once the batch
 * that wrote it finished). */
void hvl__result_free(hvl_outcome *o);
void hvl__handles_fail_all(int status, const char *message);        /* every pending handle */
/* Waiting in hvlite (any thread): how long this process has been waiting on handles without
 * submitting anything (0: it is not waiting, or a thread submitted since), and what it waits on
 * (i32 count, then the tensors' engine names). */
double hvl__waits_blocked_for(void);
void hvl__waits_describe(hvl_buf *out);

/* ---- queue (queue.c): the door into the engine and the life of an entry ---- */
/* queue -> pending: every queued entry but those of a burst still open (held at most
 * BURST_HOLD_S), so a burst enters negotiation whole, in one cycle. */
int hvl__queue_drain(hvl_engine *e);
/* queue_lock held: 1 if a drain would take something now; else 0, and *until is lowered to when
 * the first held burst's hold runs out. */
int hvl__queue_has_work(const hvl_engine *e, double now, double *until);
/* Pairs this cycle's agreed responses with this rank's entries, in order. An error response
 * (a mismatch, ...) finishes its entry with that error at once; a response of a set this rank
 * is not in (or that was removed) is skipped; on a joined rank a tensor it never submitted
 * gets a stand-in entry (zero input, scratch output); a deadlock response for a tensor this rank
 * never submitted is skipped. The pairs of OK responses go to
 * resps[]/entries[] (room for agreed->count), *n their count. HVL_ERR_TIMEOUT for a stall
 * shutdown response (fatal: every rank stops at it); HVL_ERR_SYSTEM if an agreed tensor is not
 * pending here (a bug: the ranks are out of step). */
int hvl__queue_claim(hvl_engine *e, const hvl_response_list *agreed, const hvl_response **resps,
                     hvl_entry **entries, int *n);
/* The one completion call: completes en's handle with o (moved) and frees the entry. */
void hvl__entry_finish(hvl_engine *e, hvl_entry *en, hvl_outcome *o);
/* The entry's batch runs on past this cycle (a device batch left running): it leaves the
 * pending map and list, so negotiation no longer sees it, and waits for hvl__entry_finish. */
void hvl__entry_detach(hvl_engine *e, hvl_entry *en);
void hvl__queue_fail_set(hvl_engine *e, int set, const char *message);  /* pending entries of a set */
void hvl__queue_fail_all(hvl_engine *e, int status, const char *message);  /* stops accepting */

/* ---- admission and holding (ready.c) ---- */
/* An entry goes pending (queue.c's drain): whether it is held for the GPU (HVLITE_GPU_READY_ONLY)
 * and, for a CUDA tensor, the device rule: the set's first CUDA tensor on this rank pins the
 * set's device (ps->cuda_device); one on another device is marked (en->d.set_device), so the
 * coordinator fails it on every rank, before any NCCL call. Cannot fail. */
void hvl__ready_admit(hvl_engine *e, hvl_entry *en);
/* Marks the pending entries kept out of this cycle's negotiation (en->held): CUDA tensors the
 * GPU has not written yet, and the groups they belong to (see ready.c). Cannot fail. */
void hvl__ready_hold(hvl_engine *e);
/* 1 once the GPU has written every entry held for itself at the last hvl__ready_hold (then a
 * cycle need not wait for the cycle time); 0 while one is not written, or none was held. */
int hvl__ready_all_written(hvl_engine *e);

/* ---- negotiation (negotiate.c with cache.c and coordinator.c): agree with every rank on
 * what runs this cycle, in order ---- */
int hvl__negotiation_create(hvl_engine *e, hvl_negotiation **out);
void hvl__negotiation_destroy(hvl_negotiation *n);
int hvl__negotiate(hvl_engine *e, hvl_response_list *out);
void hvl__negotiation_sets_changed(hvl_negotiation *n);             /* a set was added */
void hvl__negotiation_drop_set(hvl_negotiation *n, int set);        /* a set was removed */

/* ---- fusion (fusion.c): agreed responses -> batches that share one collective ---- */
typedef struct {
    int op, dtype, reduce_op, root_rank;
    int target_set;             /* remove_process_set: the set it removes */
    int last_joined;            /* join: the rank that joined last */
    double prescale, postscale;
    int memory;                 /* hvl_memory of its tensors (agreed) */
    hvl_pset *ps;               /* the set it runs among */
    int count;                  /* entries in this batch */
    hvl_entry **entries;        /* borrowed from the pending map */
    int64_t bytes;              /* payload, from the agreed responses (the same on every rank) */
    const char *backend;        /* set by execute.c: the data plane that ran it (static) */
    int failed_everywhere;      /* set by the run: its error was agreed by every member, so it
                                   fails this batch only and the engine goes on */
    int timed;                  /* the timeline records it: a device plane times its phases */
    double phases[4];           /* timed device batch: its phases' ends (hvl_device_batch.phases) */
    int left_running;           /* a device plane left it running past its cycle (execute.c) */
} hvl_batch;
typedef struct { hvl_batch *items; int count; hvl_entry **entry_store; } hvl_batch_list;
/* Groups the agreed OK responses (resps[i] is entries[i]'s) in order; same result on every rank. */
int hvl__fuse(hvl_engine *e, const hvl_response **resps, hvl_entry **entries, int n, hvl_batch_list *out);
void hvl__batches_free(hvl_batch_list *l);

/* ---- execution (execute.c, gather.c) ---- */
struct hvl_plane;
struct hvl_batch_kind;
/* Runs the batches in order and finishes their entries. A failed collective is fatal (the
 * ranks may be out of step) unless the batch says it failed everywhere; the fatal status is
 * returned. */
int hvl__execute(hvl_engine *e, hvl_batch_list *batches);
/* Device batches left running on the GPU (HVLITE_NCCL_OVERLAP), oldest first: those that ended
 * finish; `how` (backend.h's HVL_SETTLE_*): look once, or wait for every one (each bounded by
 * the peer timeout; STOPPING: not cut short by the shutdown flag, as the stop was agreed). A
 * failure is fatal: it fails every batch still running, and its status is returned. */
int hvl__execute_settle(hvl_engine *e, int how);
/* The engine stops with `message`: the batches still running are stopped by their planes
 * (NCCL: the communicator aborted), then fail with it. */
void hvl__execute_abandon(hvl_engine *e, int status, const char *message);
/* gather.c: allgather (fused batches) and alltoall; results go into o[] (one per entry). */
int hvl__run_allgather(hvl_engine *e, const struct hvl_plane *p, hvl_batch *b, hvl_outcome *o);
int hvl__run_alltoall(hvl_engine *e, const struct hvl_plane *p, hvl_batch *b, hvl_outcome *o);
/* The same on a device plane (CUDA tensors): results on this rank's GPU (hvl_outcome). HVL_OK
 * with *restage = 1 (alike on every member, o[] cleared) where some member's GPU had no room
 * for its results: the caller runs the batch on the staged path instead. */
int hvl__run_allgather_device(hvl_engine *e, const struct hvl_plane *p, const struct hvl_batch_kind *k,
                              hvl_batch *b, hvl_outcome *o, int *restage);
int hvl__run_alltoall_device(hvl_engine *e, const struct hvl_plane *p, const struct hvl_batch_kind *k,
                             hvl_batch *b, hvl_outcome *o, int *restage);

#endif /* HVLITE_CYCLE_H */
