/* negotiate.c: each cycle, agree with every rank on which tensors run, in which order.
 *
 * Step 1, every cycle (the fast path): one bitwise-AND allreduce of a bit vector. Word 0 holds
 * flags that are 1 when a rank has nothing to report (AND = nobody does); word 1.. has one bit
 * per response-cache slot, set when this rank has a pending request that matches that cached
 * response. A bit that survives the AND is a tensor every rank is ready to run again.
 * Step 2, only when some rank asked (a request missing from the cache, or requests waiting at
 * rank 0): every rank sends its requests not yet sent to rank 0, which updates its readiness
 * table and broadcasts the responses of tensors now ready everywhere (or their errors).
 * A request sent to rank 0 stays there until it completes and never sets its cache bit again;
 * its rank keeps asking for step 2, so the others send theirs too. A cached request that waited
 * longer than PATIENCE_S goes to rank 0 as well, so the stall inspector sees it.
 * Every rank updates its cache from the broadcast list alone, so caches stay identical.
 * Process sets: negotiation always runs among every rank; a rank that is not a member of a
 * cached response's set sets that bit anyway (it has nothing to wait for), so the AND is decided
 * by the members alone, and the coordinator waits for members only.
 * Autotune: rank 0 clears FLAG_NO_TUNE_UPDATE when it has new values; every rank then takes them
 * in this round (hvl__autotune_sync), before any of its responses run. While autotune bypasses
 * the cache (e->cache_bypass), no request sets a cache bit: all go through rank 0.
 * bg thread only. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

#define FLAG_NO_FULL_ROUND ((uint64_t)1 << 0)
#define FLAG_NO_SHUTDOWN ((uint64_t)1 << 1)
#define FLAG_NO_TUNE_UPDATE ((uint64_t)1 << 2)
#define PATIENCE_S 1.0

static int bit_set(const uint64_t *words, int slot) { return (words[1 + slot / 64] >> (slot % 64)) & 1; }

/* e->bits_absent: the cache slots holding responses of sets this rank is not a member of.
 * Recomputed only after the cache changed, and only while sets other than 0 exist. */
static void mark_absent(hvl_engine *e)
{
    if (!e->absent_dirty) return;
    e->absent_dirty = 0;
    memset(e->bits_absent, 0, sizeof(uint64_t) * (size_t)e->bit_words);
    int slots = e->cache && e->npsets > 1 ? hvl__cache_capacity(e->cache) : 0;
    for (int slot = 0; slot < slots; slot++) {
        const hvl_response *r = hvl__cache_slot(e->cache, slot);
        const hvl_pset *ps = r ? hvl__pset(e, r->process_set) : NULL;
        if (r && (!ps || ps->rank < 0)) e->bits_absent[1 + slot / 64] |= (uint64_t)1 << (slot % 64);
    }
}

/* Fills e->bits_mine; returns 1 if this rank needs a coordinator round. */
static int mark_ready(hvl_engine *e)
{
    int need_full = 0;
    double now = hvl__now();
    mark_absent(e);
    memcpy(e->bits_mine, e->bits_absent, sizeof(uint64_t) * (size_t)e->bit_words);
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        en->cache_slot = -1;
        if (en->sent) { need_full = 1; continue; }
        int slot = e->cache && !e->cache_bypass ? hvl__cache_find(e->cache, &en->req) : -1;
        if (slot < 0 || now - en->enqueued_at > PATIENCE_S) { need_full = 1; continue; }
        en->cache_slot = slot;
        e->bits_mine[1 + slot / 64] |= (uint64_t)1 << (slot % 64);
    }
    e->bits_mine[0] = (need_full ? 0 : FLAG_NO_FULL_ROUND) |
                      (__atomic_load_n(&e->shutdown_requested, __ATOMIC_ACQUIRE) ? 0 : FLAG_NO_SHUTDOWN) |
                      (hvl__autotune_has_update(e) ? 0 : FLAG_NO_TUNE_UPDATE);
    return need_full;
}

static int take_cached(hvl_engine *e, hvl_response_list *out)
{
    int slots = e->cache ? hvl__cache_capacity(e->cache) : 0, tl = hvl__tl_active();
    for (int slot = 0; slot < slots; slot++) {
        if (!bit_set(e->bits_all, slot)) continue;
        hvl_response r = *hvl__cache_slot(e->cache, slot);
        r.name = strdup(r.name);
        if (!r.name) return HVL_ERR_NO_MEMORY;
        hvl__cache_touch(e->cache, slot);
        if (tl) hvl__tl_agreed(r.name, HVL_OK, NULL, 1);
        if (hvl__responses_push(out, &r) != HVL_OK) { free(r.name); return HVL_ERR_NO_MEMORY; }
        hvl__count(&e->counters.cache_hits, 1);
    }
    return HVL_OK;
}

/* Rank 0: feed every rank's requests to the coordinator, serialise the ready responses. */
static int coordinate(hvl_engine *e, const char *all, const int *counts, const int *displs, hvl_buf *reply)
{
    hvl_response_list ready = {0};
    int rc = HVL_OK;
    for (int r = 0; r < e->size && rc == HVL_OK; r++) {
        hvl_buf view = {(char *)all + displs[r], (size_t)counts[r], (size_t)counts[r], 0, 0};
        rc = hvl__coordinator_add(e->coordinator, r, &view, &ready);
    }
    if (rc == HVL_OK)
        rc = hvl__coordinator_stall_check(e->coordinator, e->params.stall_check_s,
                                          e->params.stall_shutdown_s, &ready);
    for (int i = 0; i < ready.count; i++) hvl__wire_put_response(reply, &ready.items[i]);
    hvl__responses_clear(&ready);
    free(ready.items);
    if (rc == HVL_OK && reply->bad) rc = HVL_ERR_NO_MEMORY;
    return rc;
}

static int gather_requests(hvl_engine *e, hvl_buf *mine, char **all, int *counts, int *displs)
{
    int64_t len = (int64_t)mine->len, *lens = NULL;
    MPI_Request req;
    if (e->rank == 0 && !(lens = malloc(sizeof(int64_t) * (size_t)e->size))) return HVL_ERR_NO_MEMORY;
    int rc = hvl__mpi_check(MPI_Igather(&len, 1, MPI_INT64_T, lens, 1, MPI_INT64_T, 0, e->comm, &req), "MPI_Igather");
    if (rc == HVL_OK) rc = hvl__mpi_wait(e, &req, "negotiation (gather sizes)");
    int64_t total = 0;
    for (int r = 0; e->rank == 0 && rc == HVL_OK && r < e->size; r++) {
        counts[r] = (int)lens[r];
        displs[r] = (int)total;
        total += lens[r];
    }
    free(lens);
    if (rc == HVL_OK && e->rank == 0 && !(*all = malloc((size_t)total + 1))) rc = HVL_ERR_NO_MEMORY;
    if (rc == HVL_OK)
        rc = hvl__mpi_check(MPI_Igatherv(mine->data, (int)len, MPI_BYTE, *all, counts, displs, MPI_BYTE, 0, e->comm, &req), "MPI_Igatherv");
    if (rc == HVL_OK) rc = hvl__mpi_wait(e, &req, "negotiation (gather requests)");
    return rc;
}

static int broadcast_responses(hvl_engine *e, hvl_buf *reply)
{
    int64_t len = (int64_t)reply->len;
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Ibcast(&len, 1, MPI_INT64_T, 0, e->comm, &req), "MPI_Ibcast"));
    HVL_CHECK(hvl__mpi_wait(e, &req, "negotiation (response size)"));
    if (e->rank != 0) {
        reply->data = malloc((size_t)len + 1);
        if (!reply->data) return HVL_ERR_NO_MEMORY;
        reply->len = reply->cap = (size_t)len;
    }
    HVL_CHECK(hvl__mpi_check(MPI_Ibcast(reply->data, (int)len, MPI_BYTE, 0, e->comm, &req), "MPI_Ibcast"));
    return hvl__mpi_wait(e, &req, "negotiation (responses)");
}

static int apply_responses(hvl_engine *e, hvl_buf *reply, hvl_response_list *out)
{
    reply->pos = 0;
    while (reply->pos < reply->len) {
        hvl_response r;
        if (hvl__wire_get_response(reply, &r) != HVL_OK) {
            free(r.name); free(r.error);
            return hvl__fail(HVL_ERR_SYSTEM, "negotiation: corrupt response list from rank 0");
        }
        if (e->cache && r.status == HVL_OK) HVL_CHECK(hvl__cache_put(e->cache, &r));
        else if (e->cache) hvl__cache_erase(e->cache, r.name);
        e->absent_dirty = 1;
        if (hvl__responses_push(out, &r) != HVL_OK) {
            free(r.name); free(r.error);
            return HVL_ERR_NO_MEMORY;
        }
        hvl__count(&e->counters.cache_misses, 1);
    }
    return HVL_OK;
}

static int full_round(hvl_engine *e, hvl_response_list *out)
{
    hvl_buf mine = {0}, reply = {0};
    char *all = NULL;
    int *counts = calloc((size_t)e->size * 2, sizeof(int)), rc = HVL_OK;
    if (!counts) return HVL_ERR_NO_MEMORY;
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        if (en->sent || (en->cache_slot >= 0 && bit_set(e->bits_all, en->cache_slot))) continue;
        hvl__wire_put_request(&mine, &en->req);
        en->sent = 1;
    }
    if (mine.bad) rc = HVL_ERR_NO_MEMORY;
    if (rc == HVL_OK) rc = gather_requests(e, &mine, &all, counts, counts + e->size);
    if (rc == HVL_OK && e->rank == 0) rc = coordinate(e, all, counts, counts + e->size, &reply);
    if (rc == HVL_OK) rc = broadcast_responses(e, &reply);
    if (rc == HVL_OK) rc = apply_responses(e, &reply, out);
    hvl__count(&e->counters.full_rounds, 1);
    hvl__buf_free(&mine);
    hvl__buf_free(&reply);
    free(all);
    free(counts);
    return rc;
}

int hvl__negotiate(hvl_engine *e, hvl_response_list *out)
{
    double t0 = hvl__now();
    mark_ready(e);
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Iallreduce(e->bits_mine, e->bits_all, e->bit_words, MPI_UINT64_T,
                                            MPI_BAND, e->comm, &req), "MPI_Iallreduce"));
    HVL_CHECK(hvl__mpi_wait(e, &req, "negotiation (ready bits)"));
    hvl__count(&e->counters.cycles, 1);
    if (!(e->bits_all[0] & FLAG_NO_SHUTDOWN))
        return hvl__fail(HVL_ERR_SHUT_DOWN, "hvlite has been shut down: a rank called shutdown() or "
                         "exited; collectives still pending then cannot complete");
    if (!(e->bits_all[0] & FLAG_NO_TUNE_UPDATE)) HVL_CHECK(hvl__autotune_sync(e));
    HVL_CHECK(take_cached(e, out));
    if (!(e->bits_all[0] & FLAG_NO_FULL_ROUND)) HVL_CHECK(full_round(e, out));
    if (out->count) hvl_log(HVL_LOG_TRACE, "round: %d agreed, %.1f us", out->count, (hvl__now() - t0) * 1e6);
    return HVL_OK;
}
