/* util.h: the helpers every part of the engine shares and that know nothing of the engine:
 * the error rule and its macros, logging, the clock, a string-keyed map, a growable byte buffer
 * with its codec, JSON text, a hash, MPI error translation and the bounded waits on MPI. Any
 * thread unless noted.
 *
 * The error rule, for every fallible function in csrc/: it returns an hvl_status, and the
 * function where an error happens sets its message (hvl__fail, or hvl__oom) before returning
 * it; callers pass the status up unchanged with HVL_CHECK (nothing to clean up) or
 * HVL_CHECK_GOTO (one cleanup label per function). Nothing returns a bare HVL_ERR_* code, so
 * the message hvl_last_error() gives always belongs to the status it comes with (the fatal
 * path checks that: hvl__last_status). tools/check_engine.py enforces the bare-return rule. */
#ifndef HVLITE_UTIL_H
#define HVLITE_UTIL_H

#include <mpi.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "hvlite.h"

#define HVL_CHECK(expr) do { int hvl__rc_ = (expr); if (hvl__rc_ != HVL_OK) return hvl__rc_; } while (0)
#define HVL_CHECK_GOTO(expr, rc, label) do { (rc) = (expr); if ((rc) != HVL_OK) goto label; } while (0)

/* ---- errors and logging (log.c) ---- */
enum { HVL_LOG_TRACE = 0, HVL_LOG_DEBUG, HVL_LOG_INFO, HVL_LOG_WARNING, HVL_LOG_ERROR };
void hvl__log_set(int level, int rank, int show_time);
/* A line on stderr, "[hvlite rank R tid T] LEVEL: ...", if level is at or above the log level.
 * Cannot fail. */
void hvl__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* hvl__log for a condition that can repeat (every step, every init): only the first call with a
 * given key logs in this process (keys are compared by a 64-bit hash); returns 1 if it logged.
 * A call below the log level is not remembered. Cannot fail. */
int hvl__log_once(const char *key, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sets the calling thread's last error (status and message); returns rc, so a caller writes
 * `return hvl__fail(HVL_ERR_..., "...")`. */
int hvl__fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* hvl__fail(HVL_ERR_NO_MEMORY, "out of memory: <what>"). */
int hvl__oom(const char *what);
int hvl__last_status(void);                  /* the status of the last hvl__fail on this thread */
const char *hvl__status_name(int rc);
double hvl__now(void);                       /* monotonic seconds */
/* Sleeps *nap_s, then doubles it up to max_s: the growing naps of a polling wait. */
void hvl__nap(double *nap_s, double max_s);

/* A library opened at run time (CUDA's driver, NCCL): its function table, each slot named by the
 * symbol dlsym fills it from. hvl__bind_symbols fills every slot from `lib`: NULL once all were
 * found, else the first missing name. */
typedef struct { void **slot; const char *name; } hvl_symbol;
#define HVL_SYMBOL(table, field, name) {(void **)&(table).field, name}
const char *hvl__bind_symbols(void *lib, const hvl_symbol *symbols, size_t n);

/* ---- small helpers (util.c; hvl__grow: buf.c) ---- */
uint64_t hvl__hash(const void *data, size_t n, uint64_t h);   /* FNV-1a; start with HVL_HASH_SEED */
#define HVL_HASH_SEED 1469598103934665603ULL
void hvl__count(int64_t *counter, int64_t delta);              /* relaxed atomic add */
/* Grows *buf (realloc) to hold `need` bytes; HVL_ERR_NO_MEMORY (with a message) if it cannot. */
int hvl__grow(char **buf, int64_t *cap, int64_t need);
/* Tests only (HVLITE_TEST_STOP_AT="R:POINT" or "R:POINT:N", the setting's value in spec): global
 * rank R stops its whole process (SIGSTOP) when it reaches the stop point named POINT the first
 * (the N-th) time, and only then, so the tests can freeze a rank at an exact step of a
 * collective rather than after a sleep. Does nothing otherwise; cannot fail. */
void hvl__test_stop_point(const char *spec, int rank, const char *point);

/* ---- string-keyed hash map (strmap.c); the map does not own keys or values ---- */
typedef struct { const char *key; void *value; } hvl_strmap_slot;
typedef struct { hvl_strmap_slot *slots; size_t cap, count, tombstones; } hvl_strmap;
int hvl__strmap_put(hvl_strmap *m, const char *key, void *value);  /* replaces; HVL_ERR_NO_MEMORY */
void *hvl__strmap_get(const hvl_strmap *m, const char *key);        /* NULL if absent */
void *hvl__strmap_del(hvl_strmap *m, const char *key);              /* returns the old value */
void hvl__strmap_free(hvl_strmap *m);
/* Iterate: for (size_t i = 0; i < m->cap; i++) if (hvl__strmap_live(m, i)) ...; deleting the
 * current key while iterating is safe (deletion never rehashes). */
int hvl__strmap_live(const hvl_strmap *m, size_t i);

/* ---- growable byte buffer (buf.c): writes never fail (out of memory sets `bad`), reads never
 * trust lengths (a short buffer sets `bad`) ---- */
typedef struct { char *data; size_t len, cap; size_t pos; int bad; } hvl_buf;
int hvl__buf_reserve(hvl_buf *b, size_t n);      /* 1 if n more bytes fit now (grows) */
void hvl__buf_put(hvl_buf *b, const void *p, size_t n);
void hvl__buf_i32(hvl_buf *b, int32_t v);
void hvl__buf_i64(hvl_buf *b, int64_t v);
void hvl__buf_f64(hvl_buf *b, double v);
void hvl__buf_str(hvl_buf *b, const char *s);     /* i32 length (-1: NULL), then the bytes */
void hvl__buf_printf(hvl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));   /* text */
int32_t hvl__buf_get_i32(hvl_buf *b);
int64_t hvl__buf_get_i64(hvl_buf *b);
double hvl__buf_get_f64(hvl_buf *b);
char *hvl__buf_get_str(hvl_buf *b);              /* malloc'd copy; NULL and b->bad on error */
void hvl__buf_free(hvl_buf *b);

/* ---- JSON text into a buffer (json_text.c); cannot fail: out of memory sets b->bad ---- */
void hvl__json_raw(hvl_buf *b, const char *s, size_t n);
#define HVL_JSON_LIT(b, literal) hvl__json_raw(b, literal, sizeof(literal) - 1)
void hvl__json_int(hvl_buf *b, int64_t v);
void hvl__json_us(hvl_buf *b, int64_t ns);          /* ns as microseconds with 3 decimals */
void hvl__json_str(hvl_buf *b, const char *s);      /* quoted, escaped; non-UTF-8 bytes -> U+FFFD */

/* ---- MPI helpers (mpi_util.c, comm_split.c); bg thread ---- */
int hvl__mpi_check(int mpi_rc, const char *what);                    /* MPI code -> status */
/* What bounds a wait on other ranks (every wait on MPI takes one): the peer timeout, and the
 * engine's flags, which the wait reads (acquire loads) between looks. The flags are borrowed
 * from the engine, which outlives every wait; NULL: not looked at. */
typedef struct {
    double timeout_s;           /* HVL_ERR_TIMEOUT after this long (0: no time bound) */
    const int *shutdown;        /* nonzero: shutdown was requested; a wait older than
                                   HVL_SHUTDOWN_GRACE_S gives up with HVL_ERR_SHUT_DOWN */
    const int *fatal;           /* an hvl_status other than HVL_OK: the engine failed; the wait
                                   gives up at once with that status */
} hvl_bound;
/* A shutdown request ends only waits at least this old: a collective every rank started
 * finishes well within it, and a peer's own stop reaches every rank through the negotiation. */
#define HVL_SHUTDOWN_GRACE_S 1.0
/* The flags' verdict for a wait `waited` seconds old: HVL_OK, or the status to give up with
 * (its message names `what`). The time bound is each wait's own (its message says more). */
int hvl__bound_flags(const hvl_bound *bound, double waited, const char *what);
/* Waits for a nonblocking request without burning a core: short spin, then naps that grow with
 * the wait. HVL_ERR_TIMEOUT (naming `what`) after bound.timeout_s; the flags as above. */
int hvl__mpi_wait(MPI_Request *req, hvl_bound bound, const char *what);
/* Waits for a nonblocking data collective: tests without sleeping (MPI progresses only while
 * called), yielding the core between tests. HVL_ERR_TIMEOUT after bound.timeout_s; the flags
 * as above (checked every 64 tests, with the clock). */
int hvl__mpi_progress_wait(MPI_Request *req, hvl_bound bound, const char *what);
/* MPI_Comm_split(parent, color, key) (by_host = 0), or MPI_Comm_split_type(parent,
 * MPI_COMM_TYPE_SHARED, key) (by_host = 1; color unused), bounded like a collective. MPI has
 * no nonblocking form of either, so the call runs on a helper thread while this one waits on
 * `bound`. *out: the new communicator with MPI_ERRORS_RETURN, MPI_COMM_NULL for color
 * MPI_UNDEFINED; the caller owns it. When the wait gives up, the helper is left inside MPI (it
 * frees its own state if the call ever returns) and the caller must treat the error as fatal:
 * no more collectives on parent. HVL_ERR_SYSTEM if no thread can be started. */
int hvl__comm_split(MPI_Comm parent, int color, int key, int by_host, MPI_Comm *out, hvl_bound bound,
                    const char *what);
/* MPI_Comm_create_group(parent, group, tag): the communicator of group's members (called by
 * them only; the others need not call), bounded and given up on as hvl__comm_split. Takes
 * `group` over (freed once the call returns). */
int hvl__comm_create_group(MPI_Comm parent, MPI_Group group, int tag, MPI_Comm *out, hvl_bound bound,
                           const char *what);
int hvl__comm_split_stranded(void);   /* abandoned splits still inside MPI; any thread */
/* Small exchanges: every rank's `count` values, rank after rank, into all; alltoall of one
 * value each. Progress waits on `bound`. */
int hvl__allgather_i64(MPI_Comm comm, const int64_t *mine, int count, int64_t *all, hvl_bound bound,
                       const char *what);
int hvl__alltoall_i64(MPI_Comm comm, const int64_t *mine, int64_t *theirs, hvl_bound bound);
/* MPI_Ibcast of `bytes` bytes from root, then a progress wait on `bound`. */
int hvl__bcast_bytes(MPI_Comm comm, void *buf, int bytes, int root, hvl_bound bound, const char *what);
/* MPI_Iallreduce of n ints in place (op: MPI_MIN, MPI_MAX, ...), then a progress wait. */
int hvl__allreduce_ints(MPI_Comm comm, int *values, int n, MPI_Op op, hvl_bound bound, const char *what);
/* HVL_ERR_INVALID_ARG unless every per-rank byte count and their running sum fit an int. */
int hvl__counts_fit_int(const int64_t *bytes, int n, const char *what);
/* For a step that must fail on every rank or none (a local size check, an allocation before a
 * collective): one MAX allreduce of the verdicts over comm. HVL_OK if every rank passed;
 * otherwise HVL_ERR_INVALID_ARG on every rank, with this rank's reason or "<what> failed on
 * another rank", and *everywhere = 1: every rank of comm failed alike, so the caller may go on
 * (an MPI error returns with *everywhere = 0). */
int hvl__agree(MPI_Comm comm, int local_rc, const char *what, int *everywhere, hvl_bound bound);

#endif /* HVLITE_UTIL_H */
