/* engine.h: the engine's state, which every part of the cycle reads: settings (param.c), the one
 * engine instance and its life status (state.c), and the process sets (pset.c).
 *
 * Threads: "user" threads call hvl_enqueue/hvl_wait/...; the one background ("bg") thread runs
 * the cycle (engine.c). Each shared field below names the lock that guards it. Lock order,
 * written once: queue_lock, then queue.c's names_lock (the taken names), then handle_lock;
 * never take one of them while holding a later one.
 * Leaf locks (nothing else is taken while held): autotune's tuning_lock, the buffer pool's lock,
 * the timeline's locks. Atomic flags (shutdown_requested, fatal) use acquire/release: a reader
 * that sees the flag set also sees what was written before it. */
#ifndef HVLITE_ENGINE_H
#define HVLITE_ENGINE_H

#include <sched.h>
#include "request.h"

typedef struct hvl_engine hvl_engine;
typedef struct hvl_negotiation hvl_negotiation;   /* negotiate.c: cache, coordinator, ready bits */
typedef struct hvl_autotune hvl_autotune;         /* observe/autotune.c */

/* ---- settings (param.c) ---- */
#define HVL_PATH_MAX 4096            /* longest file path setting, with its NUL */
typedef struct {
    int64_t fusion_threshold;   /* bytes; one fused collective carries at most this much */
    int64_t allreduce_piece;    /* bytes an allreduce moves per collective call (0 = all) */
    int64_t staged_piece;       /* bytes per piece of a staged allreduce's copies (0 = whole) */
    double cycle_time_ms;       /* bg thread tick while requests are pending */
    int cache_capacity;         /* response cache entries; 0 disables the cache */
    double stall_check_s;       /* warn about tensors some ranks have not submitted; 0 = off */
    double stall_shutdown_s;    /* stop the engine on every rank over such a tensor; 0 = off */
    int stall_check_disable;    /* 1: both stall times read as 0 (Horovod's switch for them) */
    double peer_timeout_s;      /* a wait on peers that takes longer fails the engine */
    double deadlock_s;          /* fail tensors every waiting rank waits on in vain after this; 0 = off */
    int log_level;
    int log_hide_time;          /* 0: log lines start with the wall-clock time */
    int mpi_threads_disable;    /* 1: ask MPI for MPI_THREAD_SERIALIZED, not MULTIPLE */
    char thread_affinity[HVL_PATH_MAX];   /* "c0,c1,...": local rank i's bg thread on core c_i */
    int autotune;               /* 1: autotune tunes fusion threshold, cycle time, cache use */
    int autotune_warmup;        /* samples measured and discarded before the search */
    int autotune_steps;         /* engine cycles that did work per sample */
    int autotune_max_samples;   /* samples the search scores before it settles */
    double autotune_noise;      /* the search's noise variance on standardised scores */
    char autotune_log[HVL_PATH_MAX];   /* CSV of every sample (rank 0); "" = none */
    char timeline_path[HVL_PATH_MAX];  /* "" = no timeline at start (rank 0's value is used) */
    int timeline_mark_cycles;
    int shm_disable;            /* 1: never use the shared-memory data plane */
    int hierarchical_allreduce; /* 1: multi-host allreduces go shm -> MPI among hosts -> shm */
    int64_t shm_chunk;          /* bytes per shared-memory pipeline step (per rank and buffer) */
    int nccl_disable;           /* 1: CUDA tensors never use NCCL (the staged path) */
    int nccl_grouped;           /* 1: fused NCCL batches as groups of per-tensor calls, no buffer */
    int nccl_overlap;           /* 1: NCCL batches run on while the engine negotiates the next */
    int gpu_ready_only;         /* 1: CUDA tensors are negotiated once the GPU wrote them (ready.c;
                                   experimental, off by default) */
    char nccl_lib[HVL_PATH_MAX];   /* the NCCL library to load; "" = the loader's libnccl.so.2 */
    int test_fake_hosts;        /* tests only: split each host's ranks as if on this many hosts */
    char test_stop_at[HVL_PATH_MAX];   /* tests only: "R:POINT", see hvl__test_stop_point */
} hvl_params;

/* Reads HVLITE_* (and HOROVOD_*) silently; cannot fail. Bad values keep their defaults. */
void hvl__params_load(hvl_params *p);
/* Warns (once per process each) about unknown HVLITE_* names and bad values. bg thread, after
 * the rank is known, so the lines carry it. */
void hvl__params_warn(void);
void hvl__params_log(const hvl_params *p);
/* Collective over comm: every setting the table marks "agreed" (those every rank must share to
 * build the same batches, run the same data planes and give up on peers alike) takes rank 0's
 * value. The exchange itself is bounded by `bound` (at init: this rank's own peer timeout, as
 * the agreed one is what it brings). */
int hvl__params_agree(hvl_params *p, MPI_Comm comm, hvl_bound bound);

/* ---- process sets (pset.c); the table is identical on every rank ---- */
#define HVL_MAX_BACKENDS 8
typedef struct hvl_pset {
    int id;                     /* 0 = every rank */
    int size;                   /* members */
    int rank;                   /* this process's rank among the members; -1 if not one */
    int *ranks;                 /* members' global ranks, ascending (owned) */
    MPI_Comm comm;              /* the members' communicator; MPI_COMM_NULL on non-members */
    int one_host;               /* every member runs on this process's host */
    int cuda_device;            /* this rank's device for the set's CUDA tensors: its first one's
                                   (-1: none yet; ready.c) */
    /* Each data plane's own state for this set (backends/backend.c opens and closes them; the
     * index is the plane's place in the registry). NULL: that plane does not serve the set. */
    void *plane_state[HVL_MAX_BACKENDS];
} hvl_pset;
int hvl__psets_create(hvl_engine *e);                /* the global set 0, from e->comm */
void hvl__psets_destroy(hvl_engine *e, int clean);   /* clean: communicators may be freed */
hvl_pset *hvl__pset(hvl_engine *e, int id);          /* NULL if there is no such set */
int hvl__pset_rank_of(const hvl_pset *ps, int global_rank);   /* -1 if not a member */
/* Collective over every rank (all run it at the same point): checks every rank passed the same
 * ascending members, then builds the set, its communicator and its data planes' state; *id_out
 * is its id. HVL_ERR_INVALID_ARG with *everywhere = 1 for different lists or a duplicate of an
 * existing set (every rank fails alike: not fatal). */
int hvl__pset_add(hvl_engine *e, const int64_t *members, int n, int *id_out, int *everywhere);
void hvl__pset_remove(hvl_engine *e, int id);        /* frees the set; cannot fail */
/* Any thread, under queue_lock: set id's size, this rank's rank in it (-1: not a member) and,
 * if other_rank is not NULL, global rank `other`'s. HVL_ERR_INVALID_ARG if there is no such set. */
int hvl__pset_lookup(hvl_engine *e, int id, int *size, int *rank, int other, int *other_rank);

/* ---- the engine (one instance, state.c) ---- */
struct hvl_engine {
    /* set once by the bg thread before init completes, read-only afterwards */
    MPI_Comm comm;              /* the job's world (dup of COMM_WORLD, of init's communicator, or
                                   made of init's ranks), MPI_ERRORS_RETURN */
    MPI_Comm local_comm, cross_comm;
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    int thread_multiple;
    int homogeneous;            /* 1: every host runs the same number of ranks (peers.c) */
    int mpi_initialized_here;
    int whole_world;            /* e->comm is all of MPI_COMM_WORLD (init was given no comm) */
    int failed_everywhere;      /* init failed on rank 0's verdict, so on every rank alike */
    hvl_params params;          /* agreed settings come from rank 0 (hvl__params_agree) */
    int pinned;                 /* HVLITE_THREAD_AFFINITY pinned the bg thread (engine.c) */
    cpu_set_t cpus_pinned;      /* its core then */
    cpu_set_t cpus_before;      /* the cores it had before: what a library's threads it starts
                                   get (NCCL's, nccl_set.c), not its one core */

    /* queue_lock */
    pthread_mutex_t queue_lock;
    pthread_cond_t wake_cond;   /* signalled on enqueue and shutdown */
    hvl_entry *queue_head, *queue_tail;
    int running;                /* accepting requests */
    int wake_sent;              /* bg was signalled since its last drain: no need to again */
    hvl_pset **psets;           /* indexed by set id; NULL where a set was removed. Changed by bg
                                   under queue_lock; bg reads it without the lock */
    int npsets;

    /* atomics */
    int shutdown_requested;
    int fatal;                  /* sticky hvl_status of a fatal engine error */

    /* bg thread only */
    int stop_agreed;            /* the negotiation agreed to stop: every rank stops at one point */
    hvl_strmap pending;         /* engine name -> entry taken from the queue, not yet done */
    hvl_entry *pending_head, *pending_tail;   /* the same entries, in enqueue order */
    int joined;                 /* this rank's join is pending: stand in for its tensors */
    hvl_negotiation *negotiation;
    int cache_bypass;           /* autotune: every request goes through rank 0, not the cache */
    hvl_autotune *autotune;     /* NULL unless HVLITE_AUTOTUNE */
    char *fusion_buf;           /* fused allreduce pieces, packed allgather blocks */
    int64_t fusion_cap;
    char *scratch_buf;          /* prescaled reducescatter input, gathered allgather blocks */
    int64_t scratch_cap;
    char *stage_buf;            /* page-locked host copies of staged CUDA tensors (stage.c) */
    int64_t stage_cap;
    void *stage_retired;        /* outgrown staging buffers, a list through their first bytes */
    int stage_stuck;            /* a staged copy never finished: stage nothing more (stage.c) */
    struct hvl_in_flight *in_flight;   /* device batches left running on the GPU, oldest first */
    int nin_flight, in_flight_cap;     /* (execute.c; HVLITE_NCCL_OVERLAP) */
    int held_for_gpu;           /* bg only: pending entries held for their own ready event (ready.c) */

    hvl_counters counters;      /* written by bg with relaxed atomics, read by anyone */
    struct { int64_t collectives, bytes; } plane_counts[HVL_MAX_BACKENDS];   /* the same; by registry slot */
};

extern hvl_engine hvl__engine;

/* How the engine settles device batches left running on the GPU (backend.h's settle,
 * hvl__execute_settle): look once, wait for them, or wait while stopping by agreement. */
enum { HVL_SETTLE_LOOK, HVL_SETTLE_WAIT, HVL_SETTLE_STOPPING };

/* The bound of every wait on peers (util.h): the agreed peer timeout and this engine's
 * shutdown and fatal flags. Cannot fail. */
static inline hvl_bound hvl__peer_bound(hvl_engine *e)
{
    return (hvl_bound){e->params.peer_timeout_s, &e->shutdown_requested, &e->fatal};
}
/* The other ranks (peers.c). learn: collective, at startup (pids and hosts of every rank).
 * explain: for rc == HVL_ERR_TIMEOUT, adds to the last error's message the ranks on this host
 * that are stopped or dead, as /proc shows them; returns rc. */
int hvl__peers_learn(hvl_engine *e);
void hvl__peers_forget(void);
int hvl__peers_explain(hvl_engine *e, int rc);

/* The job's world (world.c). ask: the thread calling hvl_init_on, under the life lock: which
 * world the next startup makes (a copy of the communicator handle or of the ranks is kept);
 * HVL_ERR_INVALID_ARG for a communicator of another MPI. make: bg thread at startup, collective
 * over the world: MPI's init, e->comm, rank and size, local and cross communicators and
 * thread_multiple. split_fake_hosts: HVLITE_TEST_FAKE_HOSTS, once the settings are agreed. */
int hvl__world_ask(const void *mpi_comm, size_t comm_bytes, const int *ranks, int nranks);
int hvl__world_make(hvl_engine *e);
int hvl__world_split_fake_hosts(hvl_engine *e);

/* Life status (state.c). The bg thread marks the engine running once startup succeeded, and
 * stopped (with the reason) when its cycle ends. Any thread may ask. */
void hvl__mark_running(void);
void hvl__mark_stopped(const char *why);
void hvl__forget_topology(void);   /* hvl_init (before its start) and hvl_shutdown */
/* HVL_ERR_NOT_INITIALIZED (never started) or HVL_ERR_SHUT_DOWN (with why it stopped), with
 * the message set. */
int hvl__not_running(void);

#endif /* HVLITE_ENGINE_H */
