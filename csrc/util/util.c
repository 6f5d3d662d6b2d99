/* util.c: the few helpers too small for a file of their own: a hash (strmap keys, log-once
 * keys, process-set member lists), relaxed counters, and the tests' stop points. Any thread;
 * they call no other file. */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "util.h"

uint64_t hvl__hash(const void *data, size_t n, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

void hvl__count(int64_t *counter, int64_t delta) { __atomic_fetch_add(counter, delta, __ATOMIC_RELAXED); }

void hvl__test_stop_point(const char *spec, int rank, const char *point)
{
    static int hits;                       /* atomic: times this process reached the point */
    if (!spec[0]) return;
    char *end = NULL;
    long stop_rank = strtol(spec, &end, 10);
    size_t len = strlen(point);
    if (end == spec || *end != ':' || stop_rank != rank || strncmp(end + 1, point, len) != 0) return;
    const char *nth = end + 1 + len;       /* "" (the first time) or ":N" (the N-th time) */
    long want = 1;
    if (*nth == ':') want = strtol(nth + 1, NULL, 10);
    else if (*nth) return;                 /* another point whose name starts with this one */
    if (__atomic_add_fetch(&hits, 1, __ATOMIC_RELAXED) != want) return;
    fprintf(stderr, "[hvlite rank %d] HVLITE_TEST_STOP_AT=%s: stopping this process (SIGSTOP) at %s\n", rank, spec,
            point);   /* not hvl__log: log.c calls this file's hash */
    fflush(stderr);
    raise(SIGSTOP);
}

void hvl__nap(double *nap_s, double max_s)
{
    struct timespec ts = {(time_t)*nap_s, (long)((*nap_s - (double)(time_t)*nap_s) * 1e9)};
    nanosleep(&ts, NULL);
    *nap_s = *nap_s * 2 < max_s ? *nap_s * 2 : max_s;
}

const char *hvl__bind_symbols(void *lib, const hvl_symbol *symbols, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(*symbols[i].slot = dlsym(lib, symbols[i].name))) return symbols[i].name;
    return NULL;
}
