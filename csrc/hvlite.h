/* hvlite.h: the engine's public C API, and exactly the surface the cffi binding sees.
 *
 * hvlite runs one background thread per process. Framework threads only enqueue requests and
 * wait on handles; the background thread negotiates with the other ranks, fuses, and runs the
 * collectives. This header is read by hvlite/_build.py: keep it to plain declarations (enums,
 * structs, prototypes, integer #defines); no other preprocessor logic between the markers.
 *
 * Thread safety: every function here may be called from any thread once hvl_init() returned OK
 * (hvl_init and hvl_shutdown themselves are serialised internally). Nothing here calls back into
 * the caller.
 *
 * Errors: every fallible function returns an hvl_status. On failure, hvl_last_error() returns a
 * message for the calling thread that stays valid until that thread's next hvlite call.
 */
#ifndef HVLITE_H
#define HVLITE_H

#include <stdint.h>
#include <stddef.h>

/* --- cffi cdef begins --- */
#define HVL_MAX_DIMS 16

typedef enum {
    HVL_OK = 0,
    HVL_ERR_INVALID_ARG = 1,   /* caller's mistake, caught locally (bad dtype, duplicate name) */
    HVL_ERR_MISMATCH = 2,      /* ranks disagree on a tensor's op, dtype, shape, root, ... */
    HVL_ERR_TIMEOUT = 3,       /* a peer or a stalled tensor did not answer in time */
    HVL_ERR_MPI = 4,           /* the MPI library returned an error */
    HVL_ERR_NCCL = 5,
    HVL_ERR_SYSTEM = 6,        /* errno-style failure (threads, memory mapping) */
    HVL_ERR_NO_MEMORY = 7,
    HVL_ERR_SHUT_DOWN = 8,     /* engine not running, or shut down while the request was pending */
    HVL_ERR_IN_PROGRESS = 9,   /* hvl_wait timed out; the request is still pending */
    HVL_ERR_NOT_INITIALIZED = 10,  /* called before hvl_init (never started in this process) */
    HVL_ERR_DEADLOCK = 11,     /* every rank waits on collectives that can never complete */
    HVL_ERR_UNSUPPORTED = 12,  /* valid, but hvlite (like Horovod) does not run it (Adasum) */
    HVL_ERR_CUDA = 13          /* the CUDA driver failed, or could not be loaded */
} hvl_status;

typedef enum {
    HVL_UINT8 = 0, HVL_INT8 = 1, HVL_UINT16 = 2, HVL_INT16 = 3, HVL_INT32 = 4, HVL_INT64 = 5,
    HVL_FLOAT16 = 6, HVL_BFLOAT16 = 7, HVL_FLOAT32 = 8, HVL_FLOAT64 = 9, HVL_BOOL = 10,
    HVL_DTYPE_COUNT = 11
} hvl_dtype;

/* Where a request's buffers live. Every rank of a set must agree on it for each tensor (a
 * mismatch fails the tensor on every rank, naming the ranks); the device ordinal is each rank's
 * own. Host planes run CUDA tensors through page-locked host memory (the staged path). */
typedef enum {
    HVL_MEMORY_HOST = 0,    /* ordinary host memory */
    HVL_MEMORY_CUDA = 1,    /* memory of CUDA device `device` (the driver is loaded at first use) */
    HVL_MEMORY_COUNT = 2
} hvl_memory;

typedef enum {
    HVL_ALLREDUCE = 0, HVL_ALLGATHER = 1, HVL_BROADCAST = 2, HVL_ALLTOALL = 3,
    HVL_REDUCESCATTER = 4, HVL_BARRIER = 5, HVL_JOIN = 6, HVL_PROCESS_SET_ADD = 7,
    HVL_PROCESS_SET_REMOVE = 8, HVL_OP_COUNT = 9
} hvl_op;

typedef enum {
    HVL_SUM = 0, HVL_AVERAGE = 1, HVL_MIN = 2, HVL_MAX = 3, HVL_PRODUCT = 4,
    HVL_ADASUM = 5,         /* allreduce of float16/32/64 over a power-of-2 set (adaptive sum) */
    HVL_REDUCE_COUNT = 6
} hvl_reduce_op;

/* One collective request. hvl_enqueue copies the struct, the name, shape and splits; the
 * caller keeps `input` and `output` alive and untouched until the handle completes.
 *   allreduce, broadcast: output has the input's shape (may equal input: in place).
 *   reducescatter: output holds this rank's slice of dim 0 (hvl_reducescatter_rows()).
 *   allgather, alltoall: output must be NULL; the engine owns the result (hvl_result_*).
 *   barrier, join: input, output NULL, ndim 0. A rank that submitted join takes part in the
 *   other ranks' allreduces (with zeros) and barriers until every rank has joined; any other
 *   collective fails meanwhile (HVL_ERR_INVALID_ARG on the ranks that submitted it, as Horovod
 *   refuses it). Then join completes everywhere, its value (hvl_result_value) the last rank to
 *   join.
 *   process set add / remove: run by every rank (process_set 0), in the same order. Add: splits
 *   holds the members' global ranks, ascending; its value is the new set's id. Remove: root_rank
 *   is the id of the set to remove; requests of that set still pending fail.
 * process_set: the id of the set of ranks that run it (0 = every rank); the calling rank must be
 *   a member; sizes, ranks and splits below are the set's, except root_rank, a global rank.
 *   Names are unique per process set. A name is taken from hvl_enqueue until hvl_release of its
 *   handle, not only until the request completes (as a Horovod name until its handle is
 *   synchronized), so reusing it is an error whatever the timing.
 * splits (alltoall only, may be NULL = equal split): nsplits == size entries, rows of dim 0
 * sent to each rank.
 * memory, device: where input and output live (hvl_memory; device: the CUDA device's ordinal,
 *   ignored for host memory). Engine-owned results (allgather, alltoall) are host memory, or
 *   GPU memory where NCCL ran them (hvl_result_memory).
 * ready_event: CUDA memory only, may be NULL: a CUDA event (CUevent / cudaEvent_t) the caller
 *   recorded on its stream after the work that writes `input`; the engine's copies wait for it
 *   on the engine's own stream. It must stay valid until the handle completes. When the handle
 *   completes, the engine's writes to `output` have finished (any stream may read it). */
typedef struct {
    int op;                 /* hvl_op */
    int dtype;              /* hvl_dtype */
    int reduce_op;          /* hvl_reduce_op (allreduce, reducescatter) */
    int root_rank;          /* broadcast */
    int process_set;        /* id of the set of ranks that run it; 0 = every rank */
    int ndim;
    const char *name;       /* unique among this process's requests not yet released */
    const int64_t *shape;   /* ndim entries */
    const void *input;
    void *output;
    double prescale;        /* applied to the input before the reduction */
    double postscale;       /* applied to the result (after averaging) */
    const int64_t *splits;
    int nsplits;
    int memory;             /* hvl_memory */
    int device;             /* CUDA device ordinal (HVL_MEMORY_CUDA) */
    void *ready_event;      /* CUevent, or NULL (HVL_MEMORY_CUDA) */
} hvl_request;

/* Engine counters, monotonic since hvl_init. */
typedef struct {
    int64_t cycles;             /* negotiation rounds run (each is one collective bit AND) */
    int64_t full_rounds;        /* rounds that also went through the rank-0 coordinator */
    int64_t tensors_submitted;  /* requests accepted by hvl_enqueue */
    int64_t tensors_done;       /* requests completed (ok or error); in flight = the difference */
    int64_t collectives;        /* data-plane collectives issued (one per fused batch) */
    int64_t tensors_fused;      /* tensors that shared a collective with at least one other */
    int64_t bytes_fused;        /* payload bytes of those tensors */
    int64_t cache_hits;         /* responses agreed by the bit-vector fast path */
    int64_t cache_misses;       /* responses agreed through the coordinator */
    int64_t stall_warnings;     /* stall warnings issued (rank 0 only) */
    int64_t tensors_held_for_gpu;   /* CUDA requests kept out of negotiation until the GPU wrote them */
} hvl_counters;

/* What one data plane ran since hvl_init: collectives (fused batches) and their payload bytes.
 * Planes are numbered 0 .. hvl_backend_count() - 1 in the order the engine offers them each
 * collective (e.g. "shm", "hierarchical", "mpi"). */
typedef struct {
    const char *name;           /* static, owned by the engine */
    int64_t collectives;
    int64_t bytes;
} hvl_backend_counters;

/* Start the engine: initialise MPI if nobody has (else reuse it), start the background thread.
 * Idempotent while running. Fails with HVL_ERR_SHUT_DOWN after hvlite finalized MPI: at
 * hvl_shutdown, or when an init failed alike on every rank (rank 0's bad timeline or autotune
 * settings), which finalizes MPI if hvlite initialised it, so its /dev/shm files go too.
 * Every exchange with the other ranks after MPI's own init is bounded by
 * HVLITE_PEER_TIMEOUT_SECONDS (this rank's value until rank 0's arrives): a rank that stops
 * or dies there fails init on the others with HVL_ERR_TIMEOUT, naming it where /proc shows it. */
int hvl_init(void);
/* hvl_init on a world other than MPI_COMM_WORLD (Horovod's init(comm=...)); every topology
 * query, process set and data plane is then that world's. Either
 *   mpi_comm (not NULL): points to an MPI_Comm of the MPI hvlite was built with (comm_bytes must
 *     be its size) that every member passes; the engine runs on a duplicate of it. The caller
 *     keeps it valid until this returns; or
 *   ranks[0..nranks) (nranks > 0): ranks of MPI_COMM_WORLD, each once, this process's among
 *     them; only they call this, all with the same list; the engine's rank i is world rank
 *     ranks[i]. A process that is not in the list gets HVL_ERR_INVALID_ARG (Horovod would
 *     fall back to MPI_COMM_WORLD there, which waits for ranks that never join).
 * Both NULL/0: hvl_init. A bad argument fails with HVL_ERR_INVALID_ARG on the rank that passed
 * it, before any exchange; members that passed different lists fail on each of them. */
int hvl_init_on(const void *mpi_comm, size_t comm_bytes, const int *ranks, int nranks);
/* Stop the engine on every rank: the first rank to call it ends the job's engine; requests still
 * pending anywhere fail with HVL_ERR_SHUT_DOWN. Finalizes MPI only if hvl_init initialised it.
 * Blocks until the background thread has exited. Safe to call when not running. A collective
 * that waits on a rank that never comes gives up a second after the call (not after the peer
 * timeout); the engine then stops as after a failure, without finalizing MPI. */
int hvl_shutdown(void);
int hvl_is_initialized(void);          /* cannot fail */

/* Topology; valid from a successful hvl_init until this process's hvl_shutdown, also after the
 * engine stopped on a failure or a peer's shutdown (as in Horovod: an error handler can still
 * name its rank); -1 otherwise. Cannot fail. */
int hvl_rank(void);
int hvl_size(void);
int hvl_local_rank(void);
int hvl_local_size(void);
int hvl_cross_rank(void);
int hvl_cross_size(void);
int hvl_mpi_threads_supported(void);   /* 1 if MPI granted MPI_THREAD_MULTIPLE */
int hvl_is_homogeneous(void);          /* 1 if every host runs the same number of ranks */

/* Build facts (constant). Cannot fail. */
int hvl_mpi_built(void);
int hvl_nccl_built(void);
int hvl_shm_built(void);
/* 1: the engine takes CUDA buffers (HVL_MEMORY_CUDA): always, since the driver is loaded at run
 * time (no build flag). hvl_cuda_loaded: 1 once this process loaded the driver (its first CUDA
 * request), 0 before and on machines without one. Cannot fail. */
int hvl_cuda_built(void);
int hvl_cuda_loaded(void);
const char *hvl_mpi_vendor(void);      /* static string owned by the engine */

/* Enqueue a request; *handle_out identifies it until hvl_release. Checks arguments locally:
 * HVL_ERR_INVALID_ARG for a bad op/dtype/shape or a name whose earlier request (in this process
 * set) has not been released yet, complete or not. */
int hvl_enqueue(const hvl_request *req, int64_t *handle_out);
/* The same as hvl_enqueue with flat arguments (what the Python binding calls: no struct to
 * build per call). Returns the handle (> 0), or minus an hvl_status on failure. */
int64_t hvl_submit(int op, int dtype, int reduce_op, int root_rank, int process_set,
                   const char *name, int ndim, const int64_t *shape, const void *input,
                   void *output, double prescale, double postscale, const int64_t *splits,
                   int nsplits, int memory, int device, void *ready_event);
/* Bursts: requests a thread enqueues between its hvl_burst_begin() and hvl_burst_end() stay
 * queued until the end, which wakes the background thread once, so the group is negotiated (and
 * fused) together, however slowly it is submitted. A burst is the calling thread's: other
 * threads' requests are not held. The hold lasts at most 0.25 s, so a thread that waits on its
 * own request inside a burst is delayed, not hung (the engine says so once, at info level).
 * Calls nest (the outermost pair is the burst). Cannot fail. */
void hvl_burst_begin(void);
void hvl_burst_end(void);
/* Wait for completion. timeout_s < 0 waits for ever (but returns if the engine fails).
 * Returns the request's final status (its message via hvl_last_error), or HVL_ERR_IN_PROGRESS. */
int hvl_wait(int64_t handle, double timeout_s);
/* *done = 1 if the request finished (wait will not block). */
int hvl_poll(int64_t handle, int *done);
/* Engine-owned result (allgather, alltoall) of a completed handle: its shape, valid until
 * hvl_release. */
int hvl_result_shape(int64_t handle, int *ndim, int64_t *shape);
/* Hand the engine-owned result over (the engine never copies it): *data is the buffer (never
 * NULL, also for 0 bytes), now the caller's, freed with hvl_buffer_free if it is host memory and
 * hvl_device_buffer_free if it is GPU memory (hvl_result_memory says which; ask before the
 * take). The shape stays readable; a second take fails (HVL_ERR_INVALID_ARG). */
int hvl_result_take(int64_t handle, void **data);
/* Where a completed handle's engine-owned result lives: host memory (*device -1; freed with
 * hvl_buffer_free), or CUDA device *device's memory where a GPU plane (NCCL) ran it (freed with
 * hvl_device_buffer_free); the staged path's results are host memory. */
int hvl_result_memory(int64_t handle, int *memory, int *device);
/* After a completed handle's error: *busy = 1 if work the engine queued for the request and gave
 * up on (a copy, a collective on the GPU or in MPI) may still read or write its buffers, which
 * the caller must then keep for the life of the process (a leak rather than memory reused while
 * it is written); 0 if none can: the error was decided before any data moved (a bad argument, a
 * mismatch, a deadlock, ...), or the engine saw the GPU get past that work after stopping it.
 * 0 for a handle that succeeded. Before hvl_release. */
int hvl_buffers_busy(int64_t handle, int *busy);
/* Frees a CUDA result taken with hvl_result_take, stream-ordered after the work queued on
 * `stream` so far (a CUstream / cudaStream_t of the device's primary context, the one the caller
 * used the result on; NULL: the legacy default stream). Any thread, also after hvl_shutdown;
 * the calling thread's current CUDA context is kept. Cannot fail. */
void hvl_device_buffer_free(int device, void *data, void *stream);

/* Result buffers (buffers.c): memory for results that outlive their handle, as the binding
 * allocates for out-of-place allreduce, broadcast and reducescatter outputs and the engine for
 * allgather/alltoall results. Any thread, also before hvl_init and after hvl_shutdown.
 * hvl_buffer_alloc: nbytes of uninitialised memory (a reused buffer holds old data), the
 *   caller's until hvl_buffer_free; never NULL for 0 bytes, NULL if nbytes < 0 or memory is
 *   short. Always 64-byte aligned; from HVL_BUFFER_CACHE_MIN bytes a mapping of its own, its
 *   size rounded up to 64 KiB; from HVL_BUFFER_HUGE_MIN bytes 2 MiB-aligned, rounded up to
 *   2 MiB and advised to use transparent huge pages.
 * hvl_buffer_free: takes a buffer from hvl_buffer_alloc or a host result of hvl_result_take (or
 * NULL; never a GPU result: hvl_device_buffer_free), from any
 *   thread. A buffer of HVL_BUFFER_CACHE_MIN bytes or more goes to a cache, which serves the
 *   next request of the same rounded size without new page faults. The cache holds at most
 *   HVL_BUFFER_CACHE_COUNT buffers and HVL_BUFFER_CACHE_BYTES bytes (256 MiB): the oldest are
 *   unmapped to make room. Smaller buffers go back to malloc. Cannot fail.
 * hvl_buffer_cache_info: the buffers and bytes cached now. Cannot fail.
 * hvl_buffer_cache_trim: unmaps every cached buffer. Cannot fail. */
#define HVL_BUFFER_CACHE_MIN 1048576
#define HVL_BUFFER_HUGE_MIN 4194304
#define HVL_BUFFER_CACHE_COUNT 32
#define HVL_BUFFER_CACHE_BYTES 268435456
void *hvl_buffer_alloc(int64_t nbytes);
void hvl_buffer_free(void *data);
void hvl_buffer_cache_info(int64_t *buffers, int64_t *bytes);
void hvl_buffer_cache_trim(void);
/* Join: the last rank that joined; process set add: the new set's id. */
int hvl_result_value(int64_t handle, int64_t *value);
/* Size of process set id and this rank's rank in it (-1: not a member).
 * HVL_ERR_INVALID_ARG if there is no such set (never added, or removed). */
int hvl_process_set_info(int id, int *size, int *rank);
/* Alltoall of a completed handle: rows of dim 0 received from each rank (size entries, the
 * job's size when it ran). */
int hvl_received_splits(int64_t handle, int64_t *splits);
/* Forget a completed handle, free what the engine owned for it, and free its name for a new
 * request. HVL_ERR_IN_PROGRESS while it is pending, HVL_ERR_INVALID_ARG if unknown. */
int hvl_release(int64_t handle);

/* Rows of dim 0 that `rank` receives from a reducescatter of `dim0` rows (the first
 * dim0 % size ranks get one extra). Cannot fail. */
int64_t hvl_reducescatter_rows(int64_t dim0, int rank, int size);
int hvl_dtype_size(int dtype);         /* bytes per element, 0 for an unknown dtype */

int hvl_get_counters(hvl_counters *out);
int hvl_backend_count(void);           /* data planes compiled in; cannot fail */
/* HVL_ERR_INVALID_ARG for an index outside [0, hvl_backend_count()). */
int hvl_get_backend_counters(int index, hvl_backend_counters *out);

typedef enum {
    HVL_AUTOTUNE_OFF = 0,       /* HVLITE_AUTOTUNE not set: the values are the settings */
    HVL_AUTOTUNE_TUNING = 1,    /* measuring samples; the values change between them */
    HVL_AUTOTUNE_CONVERGED = 2  /* settled: the values stay as they are until shutdown */
} hvl_autotune_state;

/* The engine's live tunable values: the settings (rank 0's) at start, then autotune's. Every
 * rank takes a change in the same negotiation round, so all ranks report the same values once
 * they have run the same cycles (e.g. after any collective that followed the change). */
typedef struct {
    int64_t fusion_threshold;   /* bytes one fused collective may carry */
    double cycle_time_ms;       /* the engine's tick while requests are pending */
    int response_cache;         /* 1: repeated requests are agreed through the response cache;
                                   0: every request goes through rank 0 (or no cache) */
    int autotune;               /* hvl_autotune_state */
    int64_t autotune_samples;   /* samples measured, warm-up included, as of the last change */
} hvl_tuning;
/* HVL_ERR_NOT_INITIALIZED before hvl_init, HVL_ERR_SHUT_DOWN once the engine stopped. */
int hvl_get_tuning(hvl_tuning *out);

/* Timeline: a Chrome trace (JSON array; Perfetto, chrome://tracing) of the engine's work as rank
 * 0 sees it: per tensor its negotiation (and which ranks were late), queueing, fusion copies and
 * collective; per cycle the fused batches. Only rank 0 writes; on other ranks both calls do
 * nothing and return HVL_OK, so every rank may call them. start replaces a timeline already
 * open (which is finished first); HVL_ERR_INVALID_ARG with the path and the reason if rank 0
 * cannot create the file, HVL_ERR_SHUT_DOWN before init. mark_cycles != 0 also marks every
 * engine cycle. stop writes what is left and closes the file (the file is valid JSON at every
 * moment, also if the job is killed). stop never fails and may be called at any time.
 * HVLITE_TIMELINE / HVLITE_TIMELINE_MARK_CYCLES start one at init. */
int hvl_timeline_start(const char *path, int mark_cycles);
int hvl_timeline_stop(void);
const char *hvl_last_error(void);      /* thread-local; never NULL */
/* --- cffi cdef ends --- */

#endif /* HVLITE_H */
