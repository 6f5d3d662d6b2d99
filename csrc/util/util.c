/* util.c: the few helpers too small for a file of their own: a hash (strmap keys, log-once
 * keys, process-set member lists) and relaxed counters. Any thread; they call nothing. */
#include "util.h"

uint64_t hvl__hash(const void *data, size_t n, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

void hvl__count(int64_t *counter, int64_t delta) { __atomic_fetch_add(counter, delta, __ATOMIC_RELAXED); }
