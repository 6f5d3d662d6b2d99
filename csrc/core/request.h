/* request.h: what the engine knows of one tensor, from a rank's request to the response every
 * rank runs: the per-op property table, descriptions and responses (request.c), the entry that
 * carries one of this process's requests through the cycle (queue.c), and their byte format
 * between ranks (wire.c). */
#ifndef HVLITE_REQUEST_H
#define HVLITE_REQUEST_H

#include "util.h"

/* ---- what each op is (request.c): one table instead of op tests spread over the files ---- */
enum {
    HVL_OPF_DATA = 1 << 0,        /* moves tensor data: dtype and shape apply, a data plane runs it */
    HVL_OPF_REDUCES = 1 << 1,     /* reduce op and scale factors apply */
    HVL_OPF_FREE_DIM0 = 1 << 2,   /* dim 0 may differ per rank; the engine owns the result */
    HVL_OPF_FUSES = 1 << 3,       /* tensors of one cycle may share one collective */
    HVL_OPF_ROOTED = 1 << 4,      /* has a root rank (broadcast) */
    HVL_OPF_WHOLE_JOB = 1 << 5,   /* every rank itself, on set 0; never cached (join, set add/remove) */
    HVL_OPF_JOINED_OK = 1 << 6,   /* runs while ranks have joined: they stand in (other ops fail) */
};
const char *hvl__op_name(int op);
int hvl__op_is(int op, unsigned flags);      /* 1 if op has every flag of `flags` */

/* What every rank must agree on for one tensor: the key of the coordinator's table, of the
 * response cache and of fusion. */
typedef struct {
    int op, dtype, reduce_op;
    int root_rank;              /* broadcast: the root, a global rank; otherwise 0 */
    int process_set;            /* the set that runs it */
    int target_set;             /* remove_process_set: the set it removes; otherwise 0 */
    int ndim;
    int64_t shape[HVL_MAX_DIMS];
    double prescale, postscale;
    int memory;                 /* hvl_memory of the buffers (data ops; HOST otherwise) */
    int device;                 /* CUDA memory: the submitting rank's device (for messages only) */
    int set_device;             /* -1, or the device of this rank's earlier CUDA tensors of the set
                                   when this one is on another (ready.c): refused on every rank */
    char *name;                 /* the engine's name (see queue.c); owned by the holder */
} hvl_desc;

/* What every rank runs for one tensor (or the error every rank reports for it). */
typedef struct {
    hvl_desc d;                 /* d.name owned */
    int status;                 /* HVL_OK, or `error` applies */
    char *error;                /* owned; NULL when status is HVL_OK */
    int last_joined;            /* join: the rank that joined last (rank 0 decides) */
} hvl_response;

typedef struct { hvl_response *items; int count, cap; } hvl_response_list;
int hvl__responses_push(hvl_response_list *l, const hvl_response *r);  /* takes ownership */
void hvl__responses_clear(hvl_response_list *l);                       /* frees the items' strings */
/* 1 if two descriptions agree on everything but the name (dim 0 of FREE_DIM0 ops may differ). */
int hvl__desc_matches(const hvl_desc *a, const hvl_desc *b);
int64_t hvl__shape_elems(int ndim, const int64_t *shape);
int64_t hvl__desc_bytes(const hvl_desc *d);      /* payload bytes: elements x dtype size */

/* ---- one request of this process (queue.c); owned by the engine ---- */
typedef struct hvl_entry {
    hvl_desc d;                 /* d.name owned */
    const void *input;          /* the caller's; NULL for ops without data */
    void *output;               /* the caller's, or NULL where the engine owns the result */
    int device;                 /* CUDA device of input/output, or -1: host memory (also a
                                   joined rank's stand-ins, whatever d.memory says) */
    void *ready_event;          /* the caller's CUevent (CUDA only), or NULL */
    int64_t *splits;            /* alltoall: rows to each member; add_process_set: members (owned) */
    int nsplits;
    int64_t handle;
    int sent;                   /* bg only: sent in full to the coordinator */
    int cache_slot;             /* bg only: this cycle's cache slot, or -1 */
    int synthetic;              /* bg only: made for a joined rank; owns zero input/output */
    int detached;               /* bg only: left the pending map, its batch running on the GPU */
    int gpu_pending;            /* bg only: 1 or 2 (held before) while the GPU may not have written
                                   the CUDA input yet (ready.c) */
    int held;                   /* bg only: kept out of this cycle's negotiation (ready.c) */
    double enqueued_at;
    double ready_at;            /* bg only: when it could first enter negotiation (its hold ended) */
    uint64_t group;             /* the burst it was submitted in, for good (0: none) */
    uint64_t burst;             /* queue_lock: its thread's open burst, 0 once that ended (queue.c) */
    double burst_began;         /* when that burst began: the queue holds it at most BURST_HOLD_S */
    struct hvl_entry *next;     /* queue link (queue_lock) */
    struct hvl_entry *prev_pending, *next_pending;   /* bg only: pending list, enqueue order */
} hvl_entry;
int64_t hvl__row_bytes(const hvl_entry *en);         /* bytes of one row of dim 0 */

/* ---- byte format between ranks (wire.c): requests go to rank 0 as descriptions, responses
 * come back; readers never trust lengths ---- */
void hvl__wire_put_desc(hvl_buf *b, const hvl_desc *d);
void hvl__wire_put_response(hvl_buf *b, const hvl_response *r);
/* HVL_ERR_SYSTEM (with a message) on a short or corrupt buffer; *d / *r are zeroed first and
 * own their strings either way (the caller frees them). */
int hvl__wire_get_desc(hvl_buf *b, hvl_desc *d);
int hvl__wire_get_response(hvl_buf *b, hvl_response *r);

#endif /* HVLITE_REQUEST_H */
