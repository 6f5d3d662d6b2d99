/* backend.h: the plug-in contract of a data plane ("backend"), and the registry that holds them
 * (backend.c). A data plane is one file defining one `const hvl_backend` plus one line in the
 * registry; nothing outside it names it or knows its state.
 *
 * The contract:
 * - Per-set life. When a process set is made (set 0 at init, others when added), the registry
 *   calls every plane's `open` on every member, in registry order, at the same point of the
 *   agreed response list, so collective set-up inside `open` lines up across the members. A
 *   plane leaves in *state what it keeps for that set (a segment, communicators), or NULL when
 *   it will not serve the set; it may decide that alike on every member only (e.g. from the
 *   agreed settings and the set's topology). `close` frees the state (clean: an agreed stop, so
 *   communicators may be freed; otherwise peers may be gone). A plane without state leaves
 *   both NULL. A non-OK status from `open` is fatal to the engine.
 * - Choice. For each batch the registry asks, in priority order, every plane that has state for
 *   the set (or needs none) whether it `can_run` the batch (hvl_batch_kind: what the agreed
 *   responses say, the same on every member, so every member picks alike); the first that
 *   accepts runs it. MPI accepts everything in host memory and comes last.
 * - Memory kinds. A batch of CUDA tensors that no plane accepts is staged: the registry offers
 *   it again as host memory, and the engine runs it on host copies (core/stage.c), so a host
 *   plane only ever sees host memory. A plane that accepts HVL_MEMORY_CUDA (a device plane)
 *   has `run_device`, which gets the batch's device pointers (hvl_device_batch) and never
 *   touches them from the CPU; the engine calls nothing else of it for such a batch. Before a
 *   CUDA batch is offered, every member calls each plane's `prepare` at the same point of the
 *   agreed list: there a device plane decides, with collectives among the set if it must,
 *   whether it serves the set's CUDA batches (the same answer on every member).
 * - Collectives run among the members of `ps` (this rank is one); ranks and counts are indexed
 *   by the rank within the set. Errors follow the engine's rule (util.h): set the message where
 *   it happens. A failed collective is fatal unless the plane agreed the failure with every
 *   member first (hvl__agree).
 * - Counting is the registry's: collectives and bytes per plane, whatever the plane does.
 * bg thread only. */
#ifndef HVLITE_BACKEND_H
#define HVLITE_BACKEND_H

#include "engine.h"

/* A fused allreduce seen as one stream of `count` elements, for a plane that does its own
 * chunking (the shm plane moves each chunk straight between the tensors and its segment, with
 * no fusion-buffer copy). fill writes elements [off, off + n) of the batch, prescale applied, to
 * `to`; drain takes them reduced from `from` into the outputs, average and postscale applied.
 * Each is called over consecutive ranges, in order, covering [0, count). Owned by execute.c. */
typedef struct hvl_stream {
    int64_t count;
    int dtype, reduce_op;
    void (*fill)(struct hvl_stream *s, int64_t off, int64_t n, void *to);
    void (*drain)(struct hvl_stream *s, int64_t off, int64_t n, const void *from);
} hvl_stream;

/* What the planes are asked to run: the agreed facts of one batch. */
typedef struct hvl_batch_kind {
    int op, reduce_op, dtype;
    int memory;                 /* hvl_memory of its tensors */
    int64_t bytes;              /* payload */
    double prescale, postscale;
    int even_rows;              /* reducescatter: dim 0 splits evenly over the set's members */
} hvl_batch_kind;

/* A batch of CUDA tensors for a device plane (run_device). Inputs were written on the caller's
 * stream up to ready_event (NULL: already written); the plane's work waits for it on the GPU.
 * When run_device returns, the outputs are written, unless the plane left the batch running
 * (`ticket`). */
typedef struct {
    const void *input;          /* device pointers; input == output: in place */
    void *output;
    int64_t count;              /* elements */
    int device;                 /* CUDA ordinal; -1: a joined rank's stand-in, host zeros that
                                   take part as zeros (its output is scratch) */
    void *ready_event;
} hvl_device_tensor;
typedef struct {
    hvl_batch_kind kind;
    int root;                   /* broadcast: the root's rank within the set */
    int ntensors;
    const hvl_device_tensor *tensors;
    /* Elements per member (indexed by the rank within the set): reducescatter: each member's
     * of the result; allgather: tensor t's from member r at counts[r * ntensors + t];
     * alltoall (one tensor): sent to member r at counts[r], received from it at
     * counts[size + r]. Allgather and alltoall outputs are results the engine allocated on the
     * device (on the engine's stream) to the agreed sizes; the plane fills them in member
     * order, with no gaps. */
    const int64_t *counts;
    const char *name;           /* the first tensor's name, for messages */
    /* NULL, or (the timeline) where the plane puts, once the batch ended, when on the host
     * clock the GPU passed each phase's end: [0] every input ready, [1] the inputs copied into
     * the fusion buffer, [2] the collective, [3] the outputs copied out (0: unknown; equal
     * times: no such phase). */
    double *phases;
    /* NULL: the batch ends before run_device returns. Else the plane may leave it running on
     * the GPU and put its token here (NULL: it ended), which the engine then hands to settle
     * until the batch ends (with `phases` there, not above). Buffers and events stay valid
     * until then. */
    void **ticket;
} hvl_device_batch;

typedef struct {
    const char *name;
    int (*open)(hvl_engine *e, hvl_pset *ps, void **state);    /* optional */
    void (*close)(void *state, int clean);                      /* optional */
    /* 1 if this plane runs a batch of kind `k` among `ps`. */
    int (*can_run)(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k);
    /* Optional: before a CUDA batch of kind `k` is offered (see Memory kinds); `device` is this
     * rank's CUDA device for the batch, -1 if it has none (a joined rank). Non-OK is fatal. */
    int (*prepare)(hvl_engine *e, hvl_pset *ps, void *state, const hvl_batch_kind *k, int device);
    /* A device plane's whole batch (see Memory kinds). */
    int (*run_device)(hvl_engine *e, hvl_pset *ps, void *state, const hvl_device_batch *b);
    /* Optional, with run_device: a batch it left running (its ticket). Looks once (how:
     * HVL_SETTLE_LOOK), or waits until the batch ends, bounded by the peer timeout and the
     * engine's flags (HVL_SETTLE_WAIT; HVL_SETTLE_STOPPING: the engine stops by agreement, so
     * the shutdown flag does not cut the wait short); *done = 1 once its outputs are written,
     * and then `phases` (NULL, or as in hvl_device_batch) are filled. The ticket is freed when
     * this returns *done = 1 or an error (fatal: the batch failed). */
    int (*settle)(hvl_engine *e, hvl_pset *ps, void *state, void *ticket, int how, int *done, double *phases);
    /* With settle: the engine gives up on every batch it left running on this set (it stops on
     * an error): the plane stops them (NCCL: aborts the communicator) before their handles
     * fail, and frees their tickets. Returns 1 once it saw the GPU get past them (their buffers
     * may be let go), 0 if it could not (bounded; the device is then marked stuck). */
    int (*abandon)(hvl_engine *e, hvl_pset *ps, void *state);
    /* In place when src == dst. count elements. */
    int (*allreduce)(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst,
                     int64_t count, int dtype, int reduce_op);
    /* dst receives rank r's rank_bytes[r] bytes at the sum of the earlier ranks' bytes. */
    int (*allgatherv)(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst,
                      const int64_t *rank_bytes);
    int (*broadcast)(hvl_engine *e, hvl_pset *ps, void *state, void *buf, int64_t bytes, int root);
    /* send_bytes[r] bytes go to rank r; recv_bytes[r] come from rank r; blocks back to back. */
    int (*alltoallv)(hvl_engine *e, hvl_pset *ps, void *state, const void *src,
                     const int64_t *send_bytes, void *dst, const int64_t *recv_bytes);
    /* dst receives this rank's counts[rank] elements of the reduction of src. */
    int (*reducescatter)(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst,
                         const int64_t *counts, int dtype, int reduce_op);
    /* Optional (NULL: the engine calls .allreduce on HVLITE_ALLREDUCE_PIECE pieces). */
    int (*allreduce_stream)(hvl_engine *e, hvl_pset *ps, void *state, hvl_stream *s);
    /* Optional: Adasum in place over buf, ntensors tensors of counts[i] elements back to back
     * (each tensor gets its own dot products); every member ends with the same values. The set
     * has a power-of-2 size and dtype is float16/32/64 (queue.c checks). A plane without it is
     * never offered an Adasum batch. */
    int (*adasum)(hvl_engine *e, hvl_pset *ps, void *state, void *buf, int dtype,
                  const int64_t *counts, int ntensors);
} hvl_backend;

/* The plane chosen for one batch: its backend, its state for the batch's set, its registry slot,
 * and whether the batch's device buffers go through host memory to get there. */
typedef struct hvl_plane {
    const hvl_backend *be;
    void *state;
    int index;
    int staged;
} hvl_plane;

/* Registry (backend.c). open: every plane's open for a new set, on its members (collective);
 * on failure the planes opened so far are closed again. close: every plane's close. */
int hvl__planes_open(hvl_engine *e, hvl_pset *ps);
void hvl__planes_close(hvl_pset *ps, int clean);
/* Every plane's prepare for a CUDA batch of ps (every member, at the same point). */
int hvl__planes_prepare(hvl_engine *e, hvl_pset *ps, const hvl_batch_kind *k, int device);
/* The first plane, in priority order, that runs this batch in its memory; failing that (CUDA
 * memory and no device plane takes it), the first that runs it in host memory, staged (MPI takes
 * every host batch). An Adasum allreduce goes to the first plane that has .adasum. */
hvl_plane hvl__plane_for(const hvl_engine *e, const hvl_pset *ps, const hvl_batch_kind *k);
/* The plane a CUDA batch of kind k is staged on (the first host plane that runs it). */
hvl_plane hvl__plane_staged(const hvl_engine *e, const hvl_pset *ps, const hvl_batch_kind *k);
/* Counts one collective of `bytes` run by p (any thread reads them: hvl_get_backend_counters). */
void hvl__plane_count(hvl_engine *e, const hvl_plane *p, int64_t bytes);

extern const hvl_backend hvl__backend_nccl;   /* CUDA memory, one GPU per member (NCCL) */
extern const hvl_backend hvl__backend_mpi;
extern const hvl_backend hvl__backend_shm;    /* every member on this host */
extern const hvl_backend hvl__backend_hier;   /* allreduce across hosts: shm, MPI, shm */
/* The MPI plane's Adasum (adasum_mpi.c): recursive halving then doubling, point to point. */
int hvl__adasum_mpi(hvl_engine *e, hvl_pset *ps, void *state, void *buf, int dtype,
                    const int64_t *counts, int ntensors);

#endif /* HVLITE_BACKEND_H */
