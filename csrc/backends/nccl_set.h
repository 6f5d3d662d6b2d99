/* nccl_set.h: the NCCL plane's state for one process set, shared by its two files: nccl_set.c
 * (which batches NCCL runs, the set's decision, its communicator's life and the waits on it)
 * and backend_nccl.c (running and ending batches). Private to them (tools/check_engine.py).
 * bg thread only. */
#ifndef HVLITE_NCCL_SET_H
#define HVLITE_NCCL_SET_H

#include "backend.h"
#include "nccl_lib.h"

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
    int pools_here;             /* this rank's GPU has them: its buffers are stream-ordered */
    int device;                 /* this rank's GPU for the set (USE_NCCL) */
    ncclComm_t comm;
    void *zeros, *scratch;      /* a joined rank's stand-ins on the device (grown, never shrunk;
                                   the scratch is the warm-up's too) */
    void *fusion;               /* the device fusion buffer (grown, never shrunk) */
    int64_t fusion_agreed;      /* the largest fused batch every member had room for (agreed) */
    int fusion_off;             /* 1 once no member had room for it: fused batches run grouped */
    int64_t zeros_cap, scratch_cap, fusion_cap;
    void **retired;             /* buffers outgrown without memory pools, freed at close (owned) */
    int nretired, retired_cap;
    int abort_stuck;            /* an ncclCommAbort of this set did not return: never free them */
    int stream_stuck;           /* the engine's stream did not drain after an abort (drained) */
    nccl_ticket *tickets;       /* batches run_device left running (settle ends them) */
    double ended_at;            /* when the last of them was seen to end */
} nccl_set;

/* ---- nccl_set.c ---- */
/* NCCL's type for an engine dtype; -1 where NCCL has none (16-bit integers, bool). */
int hvl__nccl_type(int dtype);
/* The plane's per-set entry points (backend.h): open, close, prepare (the set's decision),
 * can_run. */
int hvl__nccl_set_open(hvl_engine *e, hvl_pset *ps, void **state);
void hvl__nccl_set_close(void *state, int clean);
int hvl__nccl_set_prepare(hvl_engine *e, hvl_pset *ps, void *state, const hvl_batch_kind *k, int device);
int hvl__nccl_set_can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k);
/* One look at the communicator: *done = 1 once the engine's stream of device `dev` passed
 * `event` (NULL: the device's mark), or, with dev < 0, once the communicator's last call
 * settled. NCCL's asynchronous error is looked at after the event too: an error there fails. */
int hvl__nccl_set_look(ncclComm_t comm, int dev, void *event, const char *what, int *done);
/* HVL_ERR_TIMEOUT once nothing moved since `since` for the peer timeout; the engine's shutdown
 * and fatal flags as every bounded wait sees them. `what` and `name` (the tensor, or NULL) go
 * into the message. */
int hvl__nccl_set_overdue(const hvl_bound *bound, double since, const char *what, const char *name);
/* hvl__nccl_set_look until done, under `bound` from `since`. */
int hvl__nccl_set_poll(hvl_bound bound, ncclComm_t comm, int dev, void *event, double since, const char *what,
                       const char *name);
/* Aborts the set's communicator (never destroys it), bounded; cannot fail. */
void hvl__nccl_set_drop(nccl_set *s);
/* Frees a ticket and its events, and takes it off the set's list. */
void hvl__nccl_ticket_free(nccl_set *s, nccl_ticket *t);
/* A device buffer of the set, grown to at least `need` bytes (zeroed if `zero`), without waiting
 * for the device: the buffer it outgrew may still be read by batches queued before, so it is
 * freed stream-ordered after them (memory pools), or kept until the set closes. On failure the
 * old buffer stays as it was. */
int hvl__nccl_set_grow(nccl_set *s, void **buf, int64_t *cap, int64_t need, int zero);
/* After the communicator was aborted (its kernels then end): 1 once the engine's stream is seen
 * past everything queued on it, looked at for at most the peer timeout (10 s at most); else 0,
 * the device marked stuck (hvl__cuda_stuck: nothing waits for it any more, the engine's GPU
 * memory is left to it, with a log line) and the set's buffers kept. */
int hvl__nccl_set_drained(nccl_set *s);

#endif /* HVLITE_NCCL_SET_H */
