/* Test probe (tests/unit/test_coordinator_single.py): rank 0's coordinator (core/coordinator.c,
 * the engine's own, with the engine's wire format) fed every rank's request for one tensor, as
 * the negotiation feeds it, on a machine with one process: the response it decides, or its
 * error. The requests are the ranks' descriptions as queue.c and ready.c leave them; nothing
 * else of the engine runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "coordinator.h"

#define RANKS_MAX 8

/* One tensor submitted by ranks 0..n-1 of set 0 (every rank a member): an allreduce of float32
 * [4], in CUDA memory on devices[r] with set_devices[r] (-1: on its set's device), dtype
 * dtypes[r]. Returns the response's status (-1 if none came, or the coordinator failed) and
 * its error text in `error`. */
int probe_decide(int n, const int *devices, const int *set_devices, const int *dtypes, char *error, int len)
{
    static hvl_engine e;
    static hvl_pset set;
    static hvl_pset *sets[1] = {&set};
    static int members[RANKS_MAX];
    hvl_coordinator *c = NULL;
    hvl_response_list ready = {0};
    int status = -1;
    error[0] = '\0';
    if (n < 1 || n > RANKS_MAX) return -1;
    memset(&e, 0, sizeof(e));
    for (int r = 0; r < n; r++) members[r] = r;
    set = (hvl_pset){.id = 0, .size = n, .rank = 0, .ranks = members, .cuda_device = -1};
    e.size = n;
    e.psets = sets;
    e.npsets = 1;
    if (hvl__coordinator_create(&c, &e) != HVL_OK) return -1;
    for (int r = 0; r < n; r++) {
        hvl_desc d = {.op = HVL_ALLREDUCE, .dtype = dtypes[r], .ndim = 1, .shape = {4}, .prescale = 1.0,
                      .postscale = 1.0, .memory = HVL_MEMORY_CUDA, .device = devices[r],
                      .set_device = set_devices[r], .name = "w"};
        hvl_buf b = {0};
        hvl__buf_f64(&b, 0.0);          /* not waiting */
        hvl__buf_i32(&b, 0);
        hvl__wire_put_desc(&b, &d);
        int rc = hvl__coordinator_add(c, r, &b, &ready);
        hvl__buf_free(&b);
        if (rc != HVL_OK) goto out;
    }
    if (ready.count == 1) {
        status = ready.items[0].status;
        snprintf(error, (size_t)len, "%s", ready.items[0].error ? ready.items[0].error : "");
    }
out:
    hvl__responses_clear(&ready);
    free(ready.items);
    hvl__coordinator_destroy(c);
    return status;
}

/* hvl__desc_matches (request.c: the response cache's test) of two requests of the same tensor,
 * on devices 0 and 1, marked with set_device a and b. */
int probe_cache_matches(int set_device_a, int set_device_b)
{
    hvl_desc a = {.op = HVL_ALLREDUCE, .dtype = HVL_FLOAT32, .ndim = 1, .shape = {4}, .prescale = 1.0,
                  .postscale = 1.0, .memory = HVL_MEMORY_CUDA, .device = 0, .set_device = set_device_a, .name = "w"};
    hvl_desc b = a;
    b.device = 1;
    b.set_device = set_device_b;
    return hvl__desc_matches(&a, &b);
}
