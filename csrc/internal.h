/* internal.h: the engine's private types and the functions its files share (hvl__ prefix).
 *
 * Threads: "user" threads call hvl_enqueue/hvl_wait/...; the one background ("bg") thread runs
 * the cycle. Each shared field below names the lock that guards it. Lock order, written once:
 * queue_lock before handle_lock; never take queue_lock while holding handle_lock. autotune.c's
 * tuning_lock is a leaf: nothing else is taken while it is held.
 * Atomic flags (shutdown_requested, fatal) use acquire/release: a reader that sees the flag set
 * also sees what was written before it.
 */
#ifndef HVLITE_INTERNAL_H
#define HVLITE_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include "hvlite.h"

/* One error path: return an hvl_status, jump to one cleanup label. */
#define HVL_CHECK(expr) do { int hvl__rc_ = (expr); if (hvl__rc_ != HVL_OK) return hvl__rc_; } while (0)
#define HVL_CHECK_GOTO(expr, rc, label) do { (rc) = (expr); if ((rc) != HVL_OK) goto label; } while (0)

enum { HVL_LOG_TRACE = 0, HVL_LOG_DEBUG, HVL_LOG_INFO, HVL_LOG_WARNING, HVL_LOG_ERROR };

typedef struct hvl_engine hvl_engine;

/* ---- settings (param.c) ---- */
#define HVL_PATH_MAX 4096            /* longest file path setting, with its NUL */
typedef struct {
    int64_t fusion_threshold;   /* bytes; one fused collective carries at most this much */
    int64_t allreduce_piece;    /* bytes an allreduce moves per collective call (0 = all) */
    double cycle_time_ms;       /* bg thread tick when no work arrives */
    int cache_capacity;         /* response cache entries; 0 disables the cache */
    double stall_check_s;       /* warn about tensors some ranks have not submitted; 0 = off */
    double stall_shutdown_s;    /* stop the engine on every rank over such a tensor; 0 = off */
    double peer_timeout_s;      /* a negotiation round that takes longer fails the engine */
    int log_level;
    int autotune;               /* 1: autotune.c tunes fusion threshold, cycle time, cache use */
    int autotune_warmup;        /* samples measured and discarded before the search */
    int autotune_steps;         /* engine cycles that did work per sample */
    int autotune_max_samples;   /* samples the search scores before it settles */
    double autotune_noise;      /* the search's noise variance on standardised scores */
    char autotune_log[HVL_PATH_MAX];   /* CSV of every sample (rank 0); "" = none */
    char timeline_path[HVL_PATH_MAX];   /* "" = no timeline at start (rank 0's value is used) */
    int timeline_mark_cycles;
    int shm_disable;            /* 1: never use the shared-memory data plane */
    int hierarchical_allreduce; /* 1: multi-host allreduces go shm -> MPI among hosts -> shm */
    int64_t shm_chunk;          /* bytes per shared-memory pipeline step (per rank and buffer) */
    int test_fake_hosts;        /* tests only: split each host's ranks as if on this many hosts */
} hvl_params;

/* Reads HVLITE_* (and HOROVOD_*) silently; cannot fail. Bad values keep their defaults. */
void hvl__params_load(hvl_params *p);
/* Warns (once per process each) about unknown HVLITE_* names and bad values. bg thread, after
 * the rank is known, so the lines carry it. */
void hvl__params_warn(void);
void hvl__params_log(const hvl_params *p);

/* ---- logging and errors (log.c) ---- */
void hvl__log_set(int level, int rank);
void hvl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* hvl_log for a condition that can repeat (every step, every init): only the first call with a
 * given key logs in this process (keys are compared by a 64-bit hash); returns 1 if it logged.
 * A call below the log level is not remembered. Any thread; cannot fail. */
int hvl__log_once(const char *key, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sets the calling thread's last-error message; returns rc so callers can `return hvl__fail(...)`. */
int hvl__fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *hvl__status_name(int rc);
double hvl__now(void);                           /* monotonic seconds */

/* ---- string-keyed hash map (strmap.c); the map does not own keys or values ---- */
typedef struct { const char *key; void *value; } hvl_strmap_slot;
typedef struct { hvl_strmap_slot *slots; size_t cap, count, tombstones; } hvl_strmap;
int hvl__strmap_put(hvl_strmap *m, const char *key, void *value);  /* replaces; HVL_ERR_NO_MEMORY */
void *hvl__strmap_get(const hvl_strmap *m, const char *key);        /* NULL if absent */
void *hvl__strmap_del(hvl_strmap *m, const char *key);              /* returns the old value */
void hvl__strmap_free(hvl_strmap *m);
/* Iterate: for (size_t i = 0; i < m->cap; i++) if (hvl__strmap_live(m, i)) ... */
int hvl__strmap_live(const hvl_strmap *m, size_t i);

/* ---- growable byte buffer and wire codec (wire.c) ---- */
typedef struct { char *data; size_t len, cap; size_t pos; int bad; } hvl_buf;
void hvl__buf_i32(hvl_buf *b, int32_t v);
void hvl__buf_i64(hvl_buf *b, int64_t v);
void hvl__buf_f64(hvl_buf *b, double v);
void hvl__buf_str(hvl_buf *b, const char *s);
int32_t hvl__buf_get_i32(hvl_buf *b);
int64_t hvl__buf_get_i64(hvl_buf *b);
double hvl__buf_get_f64(hvl_buf *b);
char *hvl__buf_get_str(hvl_buf *b);              /* malloc'd copy; NULL and b->bad on error */
void hvl__buf_free(hvl_buf *b);

/* ---- one in-flight request of this process (queue.c); owned by the engine ---- */
typedef struct hvl_entry {
    hvl_request req;            /* req.name/shape/splits point at the fields below */
    char *name;
    int64_t shape[HVL_MAX_DIMS];
    int64_t *splits;            /* NULL or nsplits entries */
    int64_t handle;
    int sent;                   /* bg only: sent in full to the coordinator */
    int cache_slot;             /* bg only: this cycle's cache slot, or -1 */
    int synthetic;              /* bg only: made for a joined rank; owns zero input/output */
    double enqueued_at;
    struct hvl_entry *next;     /* queue link (queue_lock) */
    struct hvl_entry *prev_pending, *next_pending;   /* bg only: pending list, enqueue order */
} hvl_entry;

/* What every rank agreed to run for one tensor (or the error every rank reports for it). */
typedef struct {
    int op, dtype, reduce_op, root_rank, process_set, ndim;
    int64_t shape[HVL_MAX_DIMS];
    double prescale, postscale;
    char *name;                 /* owned */
    int status;                 /* HVL_OK, or the error below applies */
    char *error;                /* owned; NULL when status is HVL_OK */
} hvl_response;

typedef struct { hvl_response *items; int count, cap; } hvl_response_list;
int hvl__responses_push(hvl_response_list *l, const hvl_response *r);  /* takes ownership */
void hvl__responses_clear(hvl_response_list *l);
void hvl__response_from_request(hvl_response *r, const hvl_request *q);  /* copies the name */
int hvl__request_matches(const hvl_response *r, const hvl_request *q);  /* cache rule */

void hvl__wire_put_request(hvl_buf *b, const hvl_request *q);
void hvl__wire_put_response(hvl_buf *b, const hvl_response *r);
int hvl__wire_get_response(hvl_buf *b, hvl_response *r);            /* r is zeroed first */
int hvl__wire_get_common(hvl_buf *b, hvl_response *r);              /* a request, as a response */

/* ---- response cache (cache.c); bg thread only, identical on every rank ---- */
typedef struct hvl_cache hvl_cache;
int hvl__cache_create(hvl_cache **out, int capacity);
void hvl__cache_destroy(hvl_cache *c);
int hvl__cache_capacity(const hvl_cache *c);
int hvl__cache_find(const hvl_cache *c, const hvl_request *q);       /* slot or -1 */
const hvl_response *hvl__cache_slot(const hvl_cache *c, int slot);  /* NULL if empty */
void hvl__cache_touch(hvl_cache *c, int slot);
int hvl__cache_put(hvl_cache *c, const hvl_response *r);            /* copies r */
void hvl__cache_erase(hvl_cache *c, const char *name);
void hvl__cache_erase_set(hvl_cache *c, int set);                   /* every response of a set */

/* ---- handles (handle.c) ---- */
int hvl__handle_new(int64_t *id);                                   /* under queue_lock */
typedef struct {
    int status;
    char *message;              /* moved into the handle */
    void *result;               /* moved into the handle (allgather, alltoall) */
    int64_t result_bytes;
    int ndim;
    int64_t shape[HVL_MAX_DIMS];
    int64_t *recv_splits;       /* moved into the handle */
    int nsplits;                /* entries of recv_splits */
    int64_t value;              /* join: the last rank that joined */
} hvl_outcome;
/* bg: completes a handle; waiters see it at the next hvl__handles_notify (once per batch, so a
 * fused batch of many tensors wakes a waiting thread once, not once per tensor). */
void hvl__handle_complete(int64_t id, hvl_outcome *o);
void hvl__handles_notify(void);
void hvl__handles_fail_all(int status, const char *message);        /* every pending handle */

/* ---- coordinator (coordinator.c); rank 0's table of tensors and who submitted them ---- */
typedef struct hvl_coordinator hvl_coordinator;
int hvl__coordinator_create(hvl_coordinator **out, hvl_engine *e);
void hvl__coordinator_destroy(hvl_coordinator *c);
/* Parses one rank's requests; tensors now submitted by every rank go to `ready`, in order. */
int hvl__coordinator_add(hvl_coordinator *c, int rank, hvl_buf *requests, hvl_response_list *ready);
/* Warns (once per tensor) about tensors some ranks submitted warn_s seconds ago; past
 * shutdown_s (if > 0) the tensor leaves the table as an HVL_ERR_TIMEOUT response in `ready`,
 * which stops the engine on every rank with that message. */
int hvl__coordinator_stall_check(hvl_coordinator *c, double warn_s, double shutdown_s,
                                 hvl_response_list *ready);
/* Forgets the tensors of a removed process set (their ranks fail them themselves). */
void hvl__coordinator_drop_set(hvl_coordinator *c, int set);

/* ---- reductions and scaling (reduce.c) ---- */
int hvl__reduce_setup(void);                                         /* creates MPI ops/types */
void hvl__reduce_teardown(void);
MPI_Datatype hvl__mpi_dtype(int dtype);
MPI_Op hvl__mpi_op(int reduce_op, int dtype);
/* dst[i] = src[i] * factor (dst may equal src). Integers round toward zero. Cannot fail. */
void hvl__scale(void *dst, const void *src, int64_t count, int dtype, double factor);
const char *hvl__dtype_name(int dtype);
const char *hvl__op_name(int op);
const char *hvl__reduce_name(int reduce_op);

/* ---- process sets (pset.c); the table is identical on every rank ---- */
typedef struct hvl_pset {
    int id;                     /* 0 = every rank */
    int size;                   /* members */
    int rank;                   /* this process's rank among the members; -1 if not one */
    int *ranks;                 /* members' global ranks, ascending (owned) */
    MPI_Comm comm;              /* the members' communicator; MPI_COMM_NULL on non-members */
    int one_host;               /* every member runs on this process's host */
    void *backend_state;        /* per-set state of a data plane (e.g. a shm segment), or NULL */
} hvl_pset;
int hvl__psets_create(hvl_engine *e);                /* the global set 0, from e->comm */
void hvl__psets_destroy(hvl_engine *e, int clean);   /* clean: communicators may be freed */
hvl_pset *hvl__pset(hvl_engine *e, int id);           /* NULL if there is no such set */
int hvl__pset_rank_of(const hvl_pset *ps, int global_rank);   /* -1 if not a member */
/* Collective over every rank (all run it at the same point): checks every rank passed the same
 * ascending members, then builds the set and its communicator; *id_out is its id.
 * HVL_ERR_INVALID_ARG on every rank for different lists or a duplicate of an existing set. */
int hvl__pset_add(hvl_engine *e, const int64_t *members, int n, int *id_out);
void hvl__pset_remove(hvl_engine *e, int id);        /* frees the set; cannot fail */
/* Any thread, under queue_lock: set id's size, this rank's rank in it (-1: not a member) and,
 * if other_rank is not NULL, global rank `other`'s. HVL_ERR_INVALID_ARG if there is no such set. */
int hvl__pset_lookup(hvl_engine *e, int id, int *size, int *rank, int other, int *other_rank);

/* ---- data planes (backend.c registry, backend_mpi.c, backend_shm.c, backend_hier.c) ----
 * Every collective runs among the members of one process set `ps` (this rank is one of them);
 * ranks and counts below are indexed by the rank within the set. */

/* A fused allreduce seen as one stream of `count` elements, for a backend that does its own
 * chunking (the shm backend moves each chunk straight between the tensors and its segment, with
 * no fusion-buffer copy). fill writes elements [off, off + n) of the batch, prescale applied, to
 * `to`; drain takes them reduced from `from` into the outputs, average and postscale applied.
 * Each is called over consecutive ranges, in order, covering [0, count). Owned by execute.c. */
typedef struct hvl_stream {
    int64_t count;
    int dtype, reduce_op;
    void (*fill)(struct hvl_stream *s, int64_t off, int64_t n, void *to);
    void (*drain)(struct hvl_stream *s, int64_t off, int64_t n, const void *from);
} hvl_stream;

typedef struct {
    const char *name;
    /* 1 if this backend runs `op` on `dtype` for `bytes` of payload among `ps`. */
    int (*can_run)(const hvl_engine *e, const hvl_pset *ps, int op, int dtype, int64_t bytes);
    /* In place when src == dst. count elements. */
    int (*allreduce)(hvl_engine *e, hvl_pset *ps, const void *src, void *dst, int64_t count,
                     int dtype, int reduce_op);
    /* dst receives rank r's rank_bytes[r] bytes at the sum of the earlier ranks' bytes. */
    int (*allgatherv)(hvl_engine *e, hvl_pset *ps, const void *src, void *dst, const int64_t *rank_bytes);
    int (*broadcast)(hvl_engine *e, hvl_pset *ps, void *buf, int64_t bytes, int root);
    /* send_bytes[r] bytes go to rank r; recv_bytes[r] come from rank r; blocks back to back. */
    int (*alltoallv)(hvl_engine *e, hvl_pset *ps, const void *src, const int64_t *send_bytes,
                     void *dst, const int64_t *recv_bytes);
    /* dst receives this rank's counts[rank] elements of the reduction of src. */
    int (*reducescatter)(hvl_engine *e, hvl_pset *ps, const void *src, void *dst,
                         const int64_t *counts, int dtype, int reduce_op);
    /* Optional (NULL: the engine calls .allreduce on HVLITE_ALLREDUCE_PIECE pieces). */
    int (*allreduce_stream)(hvl_engine *e, hvl_pset *ps, hvl_stream *s);
} hvl_backend;
const hvl_backend *hvl__backend_for(const hvl_engine *e, const hvl_pset *ps, int op, int dtype, int64_t bytes);
extern const hvl_backend hvl__backend_mpi;
extern const hvl_backend hvl__backend_shm;    /* every member on this host */
extern const hvl_backend hvl__backend_hier;   /* allreduce across hosts: shm, MPI, shm */

/* ---- shared memory (shm_segment.c; types in shm.h) ----
 * Per set, ps->backend_state: the members on this host, their segment, leaders' communicator.
 * open is collective over ps->comm; a segment that cannot be made on some rank leaves the set
 * without one on every rank (a warning; MPI serves it). Fails only on MPI errors or no memory. */
int hvl__shm_open(hvl_engine *e, hvl_pset *ps);
void hvl__shm_close(hvl_pset *ps, int clean);   /* clean: communicators may be freed */

/* out[i] = a[i] op b[i] for n elements (reduce_kernels.c); out may be a or b, else no overlap.
 * Average sums. Integers wrap; bool Sum/Max = any, Min/Product = all. Cannot fail. */
void hvl__reduce_pair(void *out, const void *a, const void *b, int64_t n, int dtype, int reduce_op);

/* ---- MPI helpers (mpi_util.c) ---- */
int hvl__mpi_check(int mpi_rc, const char *what);                    /* MPI code -> status */
/* Waits for a nonblocking request without burning a core: short spin, then sleeps. */
int hvl__mpi_wait(hvl_engine *e, MPI_Request *req, const char *what);
/* Blocking, small: every rank's `count` values, rank after rank, into all. */
int hvl__allgather_i64(hvl_pset *ps, const int64_t *mine, int count, int64_t *all);
int hvl__alltoall_i64(hvl_pset *ps, const int64_t *mine, int64_t *theirs);
/* HVL_ERR_INVALID_ARG unless every per-rank byte count and their running sum fit an int. */
int hvl__counts_fit_int(const int64_t *bytes, int n, const char *what);
/* For a step that must fail on every rank or none (a local size check, an allocation before a
 * collective): one MAX allreduce of the verdicts. HVL_OK if every rank passed; otherwise
 * HVL_ERR_INVALID_ARG on every rank, with this rank's reason or "failed on another rank".
 * Errors agreed this way are not fatal: the engine fails the batch and goes on. */
int hvl__agree(hvl_pset *ps, int local_rc, const char *what);

/* ---- autotune (autotune.c: samples, agreement, log; tune_search.c: the search) ---- */
typedef struct hvl_autotune hvl_autotune;
/* Collective, at startup on every rank: takes rank 0's autotune settings and cycle time, checks
 * them, opens rank 0's log (a bad setting or log path fails init on every rank with rank 0's
 * message) and publishes the live values for hvl_get_tuning. */
int hvl__autotune_start(hvl_engine *e);
void hvl__autotune_stop(hvl_engine *e);                              /* cannot fail */
/* 1 on rank 0 when it has new values to hand out (negotiation then runs a sync round). */
int hvl__autotune_has_update(const hvl_engine *e);
/* Collective, in one negotiation round on every rank: applies rank 0's new values before that
 * round's responses run, so every rank fuses alike. */
int hvl__autotune_sync(hvl_engine *e);
/* After a cycle that woke at `woke` ran `agreed`: rank 0 adds it to the current sample; a full
 * sample is scored, logged, and the search picks the values to measure next (or to keep).
 * Cannot fail (a log that cannot be written is warned about and closed). */
void hvl__autotune_cycle(hvl_engine *e, const hvl_response_list *agreed, double woke);

typedef struct { int64_t fusion_threshold; double cycle_time_ms; int response_cache; } hvl_tune_point;
typedef struct hvl_search hvl_search;
/* A search that scores at most max_samples points; noise: variance on standardised scores. */
int hvl__search_create(hvl_search **out, int max_samples, double noise, int cache_allowed);
void hvl__search_destroy(hvl_search *s);
/* Records one score (bytes/s) of point p; ignored once the search is done. Cannot fail. */
void hvl__search_add(hvl_search *s, const hvl_tune_point *p, double score);
int hvl__search_done(const hvl_search *s);                          /* max_samples recorded */
/* The point to measure next; once done, the point to keep. `first` is returned before any score. */
void hvl__search_pick(hvl_search *s, const hvl_tune_point *first, hvl_tune_point *out);

/* ---- the engine (engine.c) ---- */
struct hvl_engine {
    /* set once by the bg thread before init completes, read-only afterwards */
    MPI_Comm comm;              /* dup of COMM_WORLD, MPI_ERRORS_RETURN */
    MPI_Comm local_comm, cross_comm;
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    int thread_multiple;
    int mpi_initialized_here;
    hvl_params params;          /* rank 0's fusion/cache values are broadcast at start */

    /* queue_lock */
    pthread_mutex_t queue_lock;
    pthread_cond_t wake_cond;   /* signalled on enqueue and shutdown */
    hvl_entry *queue_head, *queue_tail;
    hvl_strmap inflight;        /* name -> entry, for the duplicate-name check */
    int running;                /* accepting requests */
    int bursts;                 /* open hvl_burst_begin calls: enqueue does not wake bg */

    /* atomics */
    int shutdown_requested;
    int fatal;                  /* sticky hvl_status of a fatal engine error */

    /* bg thread only */
    hvl_strmap pending;         /* name -> entry taken from the queue, not yet done */
    hvl_entry *pending_head, *pending_tail;   /* the same entries, in enqueue order */
    int joined;                 /* this rank's join is pending: stand in for its tensors */
    hvl_pset **psets;           /* indexed by set id; NULL where a set was removed */
    int npsets;
    hvl_cache *cache;
    int cache_bypass;           /* autotune: every request goes through rank 0, not the cache */
    hvl_autotune *autotune;     /* NULL unless HVLITE_AUTOTUNE */
    hvl_coordinator *coordinator;   /* rank 0 only */
    uint64_t *bits_mine, *bits_all;
    uint64_t *bits_absent;      /* cache slots of sets this rank is not in (negotiate.c) */
    int absent_dirty;           /* the cache or the sets changed: recompute bits_absent */
    int bit_words;
    char *fusion_buf;
    int64_t fusion_cap;
    char *scratch_buf;
    int64_t scratch_cap;

    hvl_counters counters;      /* written by bg with relaxed atomics, read by anyone */
};

extern hvl_engine hvl__engine;
void hvl__count(int64_t *counter, int64_t delta);                   /* relaxed atomic add */
int hvl__grow(char **buf, int64_t *cap, int64_t need);             /* HVL_ERR_NO_MEMORY */
int hvl__not_running(void);   /* HVL_ERR_NOT_INITIALIZED (never started) or HVL_ERR_SHUT_DOWN (why it stopped) */

/* queue.c */
int hvl__queue_drain(hvl_engine *e);                                 /* queue -> pending */
void hvl__entry_finish(hvl_engine *e, hvl_entry *en, hvl_outcome *o);  /* completes + frees */
/* A stand-in entry for a tensor a joined rank never submitted: zero input (no rows for
 * allgather/alltoall), scratch output, no handle. NULL when out of memory. */
hvl_entry *hvl__entry_synthesize(hvl_engine *e, const hvl_response *r);
void hvl__entries_fail_all(hvl_engine *e, int status, const char *message);

/* negotiate.c: agree with every rank on what runs this cycle, in order. */
int hvl__negotiate(hvl_engine *e, hvl_response_list *out);

/* fusion.c: groups agreed responses into batches that share one collective. */
typedef struct {
    int op, dtype, reduce_op, root_rank;
    double prescale, postscale;
    hvl_pset *ps;               /* the set it runs among */
    int count;                  /* entries in this batch */
    hvl_entry **entries;        /* borrowed from the pending map */
    int64_t bytes;
    const char *backend;        /* set by execute.c: name of the data plane that ran it (static) */
} hvl_batch;
typedef struct { hvl_batch *items; int count; hvl_entry **entry_store; } hvl_batch_list;
/* Groups the agreed OK responses (resps[i] is entries[i]'s) in order; same result on every rank. */
int hvl__fuse(hvl_engine *e, hvl_response **resps, hvl_entry **entries, int n, hvl_batch_list *out);
void hvl__batches_free(hvl_batch_list *l);

/* gather.c: allgather (fused batches) and alltoall; results go into o[] (one per entry). */
int64_t hvl__row_bytes(const hvl_entry *en);
int hvl__run_allgather(hvl_engine *e, const hvl_backend *be, hvl_batch *b, hvl_outcome *o);
int hvl__run_alltoall(hvl_engine *e, const hvl_backend *be, hvl_batch *b, hvl_outcome *o);

/* execute.c: runs this cycle's agreed responses and finishes their entries. A failed collective
 * is fatal (ranks may be out of step); its status is returned. */
int hvl__execute(hvl_engine *e, hvl_response_list *agreed);

int64_t hvl__shape_elems(int ndim, const int64_t *shape);
int64_t hvl__request_bytes(const hvl_request *q);

/* ---- JSON text into a growable buffer (json_text.c); cannot fail: out of memory sets b->bad ---- */
void hvl__json_raw(hvl_buf *b, const char *s, size_t n);
#define HVL_JSON_LIT(b, literal) hvl__json_raw(b, literal, sizeof(literal) - 1)
void hvl__json_int(hvl_buf *b, int64_t v);
void hvl__json_us(hvl_buf *b, int64_t ns);          /* ns as microseconds with 3 decimals */
void hvl__json_str(hvl_buf *b, const char *s);      /* quoted, escaped; non-UTF-8 bytes -> U+FFFD */
void hvl__json_printf(hvl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- timeline (timeline.c records, timeline_json.c writes) ----
 * Rank 0 only. While a timeline is open, the bg thread's hooks append binary records to one
 * lock-protected buffer; the writer thread swaps it out, turns it into Chrome trace JSON and
 * appends that to the file. Each hook is guarded by `if (hvl__tl_active())` at its call site, so
 * a job without a timeline pays one relaxed load per hook and nothing else. */
extern int hvl__tl_on;          /* atomic, relaxed: 1 while rank 0 records (a hint; hooks recheck) */
static inline int hvl__tl_active(void) { return __atomic_load_n(&hvl__tl_on, __ATOMIC_RELAXED); }

/* bg thread hooks (each records now, unless it takes a time). Names are copied. */
void hvl__tl_submitted(const hvl_entry *en);                 /* rank 0 took its own request */
void hvl__tl_arrived(const char *name, int op, int rank);    /* coordinator: rank's request came */
void hvl__tl_agreed(const char *name, int status, const char *error, int cache_hit);
void hvl__tl_note(const char *name, const char *what, const char *detail);   /* e.g. a stall */
void hvl__tl_cycle_begin(void);
void hvl__tl_negotiated(void);                               /* this cycle's negotiation ended */
/* An allreduce piece of `bytes`: copy-in from t_in, reduce from t_reduce, copy-out from t_out
 * until now. */
void hvl__tl_piece(double t_in, double t_reduce, double t_out, int64_t bytes);
void hvl__tl_batch(const hvl_batch *b, double t_start, int rc);   /* b ran from t_start */
void hvl__tl_cycle_end(int agreed);                          /* agreed: responses this cycle */

/* Engine life: startup opens HVLITE_TIMELINE on rank 0 and agrees with every rank on the
 * outcome (collective; an unwritable path fails init on every rank); close stops any open
 * timeline (flushing it). */
int hvl__timeline_startup(hvl_engine *e);
void hvl__timeline_close(void);

/* Records, as the writer reads them: u32 kind, then by kind (str = i32 length, bytes, NUL):
 *   SUBMIT  f64 t, i32 op, str name          ARRIVE  f64 t, i32 op, i32 rank, i64 round, str name
 *   AGREED  f64 t, i32 status, i32 cache_hit, str name, str error
 *   NOTE    f64 t, str name, str what, str detail
 *   BATCH   f64 t0, f64 t1, i32 op, i32 dtype, i32 status, i32 count, i32 scale_in,
 *           i32 scale_out, i32 npieces, str backend, str error, npieces x hvl_tl_piece,
 *           count x (i64 bytes, str name)
 *   CYCLE   f64 t0, f64 t_negotiated, f64 t1, i32 agreed, i32 batches, i32 tensors, i64 bytes
 * The writer's state is hvl_timeline (timeline.c owns the one instance). The writer wakes every
 * HVL_TL_FLUSH_S, or sooner once HVL_TL_FLUSH_BYTES of records wait. */
enum { HVL_TL_SUBMIT = 1, HVL_TL_ARRIVE, HVL_TL_AGREED, HVL_TL_NOTE, HVL_TL_BATCH, HVL_TL_CYCLE };
typedef struct { double t_in, t_reduce, t_out, t_done; int64_t bytes; } hvl_tl_piece;
#define HVL_TL_FLUSH_S 0.05
#define HVL_TL_FLUSH_BYTES (1 << 20)
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* the writer sleeps on it (monotonic clock) */
    int open;                   /* lock: records are accepted */
    int stop;                   /* lock: the writer writes what is left and exits */
    hvl_buf records;            /* lock: not yet taken by the writer */
    int64_t dropped;            /* lock: records refused because the writer fell behind */
    /* set before the writer starts, then the writer's alone until it is joined */
    int fd;
    char *path;                 /* owned */
    double epoch;               /* hvl__now() at start: ts 0 */
    int mark_cycles, size;
    int64_t end;                /* file offset after the last event written */
    int64_t close_at;           /* file offset of the closing ']'; spaces from end up to it */
    int64_t events;             /* events written */
} hvl_timeline;
/* timeline_file.c: creates the file with its head (HVL_ERR_INVALID_ARG with the path and the
 * reason if it cannot); appends events (each ",\n{...}", no raw newline inside) keeping the
 * file valid JSON; ends it after the last event. timeline_json.c: the writer thread's body. */
int hvl__tl_file_open(hvl_timeline *tl);
int hvl__tl_file_append(hvl_timeline *tl, const char *events, size_t len);
void hvl__tl_file_finish(hvl_timeline *tl);
void *hvl__tl_writer_main(void *tl);

#endif /* HVLITE_INTERNAL_H */
