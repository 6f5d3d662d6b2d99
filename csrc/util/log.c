/* log.c: rank-tagged log lines on stderr, the thread-local last-error message, and the clock.
 * Any thread. Logging never fails and never allocates; lines longer than 1 KiB are cut.
 * hvl__log_once logs a condition that may repeat (every step, every init) the first time only:
 * conditions are keyed by a string, remembered for the life of the process. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "util.h"

static int log_level = HVL_LOG_WARNING;
static int log_rank = -1;
static int log_time;                   /* 1: lines start with the wall-clock time */
static __thread char *last_error;      /* grows to fit; freed when the thread exits (error_key) */
static __thread int last_status;       /* the status hvl__fail last returned on this thread */
static __thread size_t last_error_cap;

static const char *level_names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR"};

void hvl__log_set(int level, int rank, int show_time)
{
    log_level = level;
    log_rank = rank;
    log_time = show_time;
}

/* "2026-11-27 21:15:03.123456 " (local time) into `out` (at least 32 bytes); "" when off. */
static void wall_clock(char *out, size_t cap)
{
    out[0] = 0;
    if (!log_time) return;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (!localtime_r(&ts.tv_sec, &tm)) return;
    size_t n = strftime(out, cap, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%06ld ", ts.tv_nsec / 1000);
}

static void log_line(int level, const char *fmt, va_list ap)
{
    char line[1200], when[40];
    wall_clock(when, sizeof(when));
    int n = snprintf(line, 200, "[%shvlite rank %d tid %ld] %s: ", when, log_rank,
                     (long)syscall(SYS_gettid), level_names[level]);
    vsnprintf(line + n, sizeof(line) - (size_t)n - 2, fmt, ap);
    strcat(line, "\n");
    fputs(line, stderr);  /* one call per line so ranks' lines do not interleave mid-line */
    fflush(stderr);
}

void hvl__log(int level, const char *fmt, ...)
{
    if (level < log_level) return;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap);
    va_end(ap);
}

/* Keys already logged, as 64-bit FNV-1a hashes (open addressing; a full table logs again
 * rather than forget a condition). once_lock guards both. */
#define ONCE_SLOTS 512
static uint64_t once_seen[ONCE_SLOTS];
static pthread_mutex_t once_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t key_hash(const char *key)
{
    uint64_t h = hvl__hash(key, strlen(key), HVL_HASH_SEED);
    return h ? h : 1;   /* 0 marks a free slot */
}

/* 1 if `key` was not seen before (and is now remembered). */
static int first_time(const char *key)
{
    uint64_t h = key_hash(key);
    int first = 1;
    pthread_mutex_lock(&once_lock);
    for (unsigned i = 0, at = (unsigned)(h % ONCE_SLOTS); i < ONCE_SLOTS; i++, at = (at + 1) % ONCE_SLOTS) {
        if (once_seen[at] == h) { first = 0; break; }
        if (once_seen[at] == 0) { once_seen[at] = h; break; }
    }
    pthread_mutex_unlock(&once_lock);
    return first;
}

int hvl__log_once(const char *key, int level, const char *fmt, ...)
{
    if (level < log_level || !first_time(key)) return 0;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap);
    va_end(ap);
    return 1;
}

/* The thread's last_error buffer is also its value under error_key, whose destructor frees it
 * when the thread exits (the engine's thread exits at every shutdown; framework threads come
 * and go), so no thread leaves its buffer behind. */
static pthread_key_t error_key;
static pthread_once_t error_key_once = PTHREAD_ONCE_INIT;
static int error_key_ok;

static void free_error(void *buffer)
{
    free(buffer);
    last_error = NULL;
    last_error_cap = 0;
}

static void make_error_key(void) { error_key_ok = pthread_key_create(&error_key, free_error) == 0; }

int hvl__fail(int rc, const char *fmt, ...)
{
    va_list ap;
    last_status = rc;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap) + 1;   /* messages carry whole tensor names */
    va_end(ap);
    /* Formatted into a fresh buffer: an argument may be the old message (hvl_last_error()). */
    char *text = need > 0 ? malloc((size_t)need) : NULL;
    if (!text) return rc;                         /* out of memory: the old message stays */
    va_start(ap, fmt);
    vsnprintf(text, (size_t)need, fmt, ap);
    va_end(ap);
    free(last_error);
    last_error = text, last_error_cap = (size_t)need;
    pthread_once(&error_key_once, make_error_key);
    if (error_key_ok) pthread_setspecific(error_key, text);
    return rc;
}

int hvl__oom(const char *what) { return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory: %s", what); }

int hvl__last_status(void) { return last_status; }

const char *hvl_last_error(void) { return last_error ? last_error : ""; }

const char *hvl__status_name(int rc)
{
    static const char *names[] = {"ok", "invalid argument", "mismatch", "timeout", "MPI error",
                                  "NCCL error", "system error", "out of memory", "shut down",
                                  "in progress", "not initialized", "deadlock", "unsupported"};
    return rc >= 0 && rc <= HVL_ERR_UNSUPPORTED ? names[rc] : "unknown status";
}

double hvl__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
