/* negotiate.c: each cycle, agree with every rank on which tensors run, in which order. It owns
 * the negotiation's state (hvl_negotiation): the response cache (cache.c), rank 0's coordinator
 * (coordinator.c) and the ready-bit vectors; nothing outside this file touches them.
 *
 * Step 1, every cycle (the fast path): one bitwise-AND allreduce of a bit vector. Word 0 holds
 * flags that are 1 when a rank has nothing to report (AND = nobody does); word 1.. has one bit
 * per response-cache slot, set when this rank has a pending request that matches that cached
 * response. A bit that survives the AND is a tensor every rank is ready to run again.
 * Step 2, only when some rank asked (a request missing from the cache, or requests waiting at
 * rank 0): every rank sends its requests not yet sent to rank 0, which updates its readiness
 * table and broadcasts the responses of tensors now ready everywhere (or their errors). Each
 * rank's message starts with how long it has been waiting in hvlite and, past a second, on
 * which tensors, so rank 0 can tell a deadlock from a slow rank (coordinator.c).
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
#include "autotune.h"
#include "cache.h"
#include "coordinator.h"
#include "cycle.h"
#include "timeline.h"

#define FLAG_NO_FULL_ROUND ((uint64_t)1 << 0)
#define FLAG_NO_SHUTDOWN ((uint64_t)1 << 1)
#define FLAG_NO_TUNE_UPDATE ((uint64_t)1 << 2)
#define PATIENCE_S 1.0
#define REPORT_WAITS_AFTER_S 1.0   /* below this, a rank's waits are not worth listing */

struct hvl_negotiation {
    hvl_cache *cache;           /* NULL when HVLITE_CACHE_CAPACITY=0 */
    hvl_coordinator *coordinator;   /* rank 0 only */
    int bit_words;              /* word 0: flags; then one bit per cache slot */
    uint64_t *bits_mine, *bits_all;
    uint64_t *bits_absent;      /* cache slots of sets this rank is not in */
    int absent_dirty;           /* the cache or the sets changed: recompute bits_absent */
};

int hvl__negotiation_create(hvl_engine *e, hvl_negotiation **out)
{
    hvl_negotiation *n = calloc(1, sizeof(*n));
    if (!n) return hvl__oom("the negotiation state");
    *out = n;
    n->bit_words = 1 + (e->params.cache_capacity + 63) / 64;
    n->bits_mine = calloc((size_t)n->bit_words * 3, sizeof(uint64_t));
    if (!n->bits_mine) return hvl__oom("the negotiation's bit vectors");
    n->bits_all = n->bits_mine + n->bit_words;
    n->bits_absent = n->bits_all + n->bit_words;
    if (e->params.cache_capacity > 0) HVL_CHECK(hvl__cache_create(&n->cache, e->params.cache_capacity));
    if (e->rank == 0) HVL_CHECK(hvl__coordinator_create(&n->coordinator, e));
    return HVL_OK;
}

void hvl__negotiation_destroy(hvl_negotiation *n)
{
    if (!n) return;
    hvl__cache_destroy(n->cache);
    hvl__coordinator_destroy(n->coordinator);
    free(n->bits_mine);
    free(n);
}

void hvl__negotiation_sets_changed(hvl_negotiation *n) { n->absent_dirty = 1; }

void hvl__negotiation_drop_set(hvl_negotiation *n, int set)
{
    if (n->coordinator) hvl__coordinator_drop_set(n->coordinator, set);
    if (n->cache) hvl__cache_erase_set(n->cache, set);
    n->absent_dirty = 1;
}

/* The polite wait on the other ranks (bounded by the peer timeout and the fatal flag). Not by
 * a shutdown request: the negotiation is how a rank's stop reaches the others, so it must run
 * to its end for every rank to stop at the same point. */
static int wait_peers(hvl_engine *e, MPI_Request *req, const char *what)
{
    hvl_bound bound = hvl__peer_bound(e);
    bound.shutdown = NULL;
    return hvl__mpi_wait(req, bound, what);
}

static int bit_set(const uint64_t *words, int slot) { return (words[1 + slot / 64] >> (slot % 64)) & 1; }

/* n->bits_absent: the cache slots holding responses of sets this rank is not a member of.
 * Recomputed only after the cache changed, and only while sets other than 0 exist. */
static void mark_absent(hvl_engine *e, hvl_negotiation *n)
{
    if (!n->absent_dirty) return;
    n->absent_dirty = 0;
    memset(n->bits_absent, 0, sizeof(uint64_t) * (size_t)n->bit_words);
    int slots = n->cache && e->npsets > 1 ? hvl__cache_capacity(n->cache) : 0;
    for (int slot = 0; slot < slots; slot++) {
        const hvl_response *r = hvl__cache_slot(n->cache, slot);
        const hvl_pset *ps = r ? hvl__pset(e, r->d.process_set) : NULL;
        if (r && (!ps || ps->rank < 0)) n->bits_absent[1 + slot / 64] |= (uint64_t)1 << (slot % 64);
    }
}

/* Fills n->bits_mine; returns 1 if this rank needs a coordinator round. */
static int mark_ready(hvl_engine *e, hvl_negotiation *n)
{
    int need_full = 0;
    double now = hvl__now();
    mark_absent(e, n);
    memcpy(n->bits_mine, n->bits_absent, sizeof(uint64_t) * (size_t)n->bit_words);
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        en->cache_slot = -1;
        if (en->sent) { need_full = 1; continue; }
        if (en->held) continue;         /* its GPU has not written it yet (ready.c) */
        int slot = n->cache && !e->cache_bypass ? hvl__cache_find(n->cache, &en->d) : -1;
        if (slot < 0 || now - en->ready_at > PATIENCE_S) { need_full = 1; continue; }
        en->cache_slot = slot;
        n->bits_mine[1 + slot / 64] |= (uint64_t)1 << (slot % 64);
    }
    n->bits_mine[0] = (need_full ? 0 : FLAG_NO_FULL_ROUND) |
                      (__atomic_load_n(&e->shutdown_requested, __ATOMIC_ACQUIRE) ? 0 : FLAG_NO_SHUTDOWN) |
                      (hvl__autotune_has_update(e) ? 0 : FLAG_NO_TUNE_UPDATE);
    return need_full;
}

static int take_cached(hvl_engine *e, hvl_negotiation *n, hvl_response_list *out)
{
    int slots = n->cache ? hvl__cache_capacity(n->cache) : 0, tl = hvl__tl_active();
    for (int slot = 0; slot < slots; slot++) {
        if (!bit_set(n->bits_all, slot)) continue;
        hvl_response r = *hvl__cache_slot(n->cache, slot);
        if (!(r.d.name = strdup(r.d.name))) return hvl__oom("a cached response");
        hvl__cache_touch(n->cache, slot);
        if (tl) hvl__tl_agreed(r.d.name, HVL_OK, NULL, 1);
        int rc = hvl__responses_push(out, &r);
        if (rc != HVL_OK) { free(r.d.name); return rc; }
        hvl__count(&e->counters.cache_hits, 1);
    }
    return HVL_OK;
}

/* Rank 0: feed every rank's requests to the coordinator, serialise the ready responses. */
static int coordinate(hvl_engine *e, const char *all, const int *counts, const int *displs, hvl_buf *reply)
{
    hvl_coordinator *c = e->negotiation->coordinator;
    hvl_response_list ready = {0};
    int rc = HVL_OK;
    for (int r = 0; r < e->size; r++) {
        hvl_buf view = {(char *)all + displs[r], (size_t)counts[r], (size_t)counts[r], 0, 0};
        HVL_CHECK_GOTO(hvl__coordinator_add(c, r, &view, &ready), rc, out);
    }
    HVL_CHECK_GOTO(hvl__coordinator_stall_check(c, e->params.stall_check_s, e->params.stall_shutdown_s, &ready),
                   rc, out);
    HVL_CHECK_GOTO(hvl__coordinator_deadlock_check(c, e->params.deadlock_s, &ready), rc, out);
    for (int i = 0; i < ready.count; i++) hvl__wire_put_response(reply, &ready.items[i]);
    if (reply->bad) rc = hvl__oom("the response list");
out:
    hvl__responses_clear(&ready);
    free(ready.items);
    return rc;
}

/* Every rank's request bytes to rank 0 (*all, counts, displs there). */
static int gather_requests(hvl_engine *e, hvl_buf *mine, char **all, int *counts, int *displs)
{
    int64_t len = (int64_t)mine->len, *lens = NULL, total = 0;
    MPI_Request req;
    int rc;
    if (e->rank == 0 && !(lens = malloc(sizeof(int64_t) * (size_t)e->size))) return hvl__oom("request sizes");
    HVL_CHECK_GOTO(hvl__mpi_check(MPI_Igather(&len, 1, MPI_INT64_T, lens, 1, MPI_INT64_T, 0, e->comm, &req),
                                  "MPI_Igather"), rc, out);
    HVL_CHECK_GOTO(wait_peers(e, &req, "negotiation (gather sizes)"), rc, out);
    for (int r = 0; e->rank == 0 && r < e->size; r++) {
        counts[r] = (int)lens[r];
        displs[r] = (int)total;
        total += lens[r];
    }
    if (e->rank == 0 && !(*all = malloc((size_t)total + 1))) { rc = hvl__oom("the requests of every rank"); goto out; }
    HVL_CHECK_GOTO(hvl__mpi_check(MPI_Igatherv(mine->data, (int)len, MPI_BYTE, *all, counts, displs, MPI_BYTE, 0,
                                               e->comm, &req), "MPI_Igatherv"), rc, out);
    rc = wait_peers(e, &req, "negotiation (gather requests)");
out:
    free(lens);
    return rc;
}

static int broadcast_responses(hvl_engine *e, hvl_buf *reply)
{
    int64_t len = (int64_t)reply->len;
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Ibcast(&len, 1, MPI_INT64_T, 0, e->comm, &req), "MPI_Ibcast"));
    HVL_CHECK(wait_peers(e, &req, "negotiation (response size)"));
    if (e->rank != 0) {
        if (!(reply->data = malloc((size_t)len + 1))) return hvl__oom("the response list");
        reply->len = reply->cap = (size_t)len;
    }
    HVL_CHECK(hvl__mpi_check(MPI_Ibcast(reply->data, (int)len, MPI_BYTE, 0, e->comm, &req), "MPI_Ibcast"));
    return wait_peers(e, &req, "negotiation (responses)");
}

/* One response from rank 0: into the cache (or out of it, for an error), then the list. */
static int apply_one(hvl_negotiation *n, hvl_response *r, hvl_response_list *out)
{
    if (n->cache && r->status == HVL_OK) HVL_CHECK(hvl__cache_put(n->cache, r));
    else if (n->cache) hvl__cache_erase(n->cache, r->d.name);
    n->absent_dirty = 1;
    return hvl__responses_push(out, r);
}

static int apply_responses(hvl_engine *e, hvl_negotiation *n, hvl_buf *reply, hvl_response_list *out)
{
    hvl_response r;
    int rc;
    reply->pos = 0;
    while (reply->pos < reply->len) {
        HVL_CHECK_GOTO(hvl__wire_get_response(reply, &r), rc, fail);
        HVL_CHECK_GOTO(apply_one(n, &r, out), rc, fail);
        hvl__count(&e->counters.cache_misses, 1);
    }
    return HVL_OK;
fail:
    free(r.d.name);
    free(r.error);
    return rc;
}

static int full_round(hvl_engine *e, hvl_negotiation *n, hvl_response_list *out)
{
    hvl_buf mine = {0}, reply = {0};
    char *all = NULL;
    int *counts = calloc((size_t)e->size * 2, sizeof(int)), rc;
    if (!counts) return hvl__oom("request counts");
    double blocked_for = hvl__waits_blocked_for();
    hvl__buf_f64(&mine, blocked_for);
    if (blocked_for >= REPORT_WAITS_AFTER_S) hvl__waits_describe(&mine);
    else hvl__buf_i32(&mine, 0);
    for (hvl_entry *en = e->pending_head; en; en = en->next_pending) {
        if (en->sent || en->held || (en->cache_slot >= 0 && bit_set(n->bits_all, en->cache_slot))) continue;
        hvl__wire_put_desc(&mine, &en->d);
        en->sent = 1;
    }
    if (mine.bad) { rc = hvl__oom("this rank's requests"); goto out; }
    HVL_CHECK_GOTO(gather_requests(e, &mine, &all, counts, counts + e->size), rc, out);
    if (e->rank == 0) HVL_CHECK_GOTO(coordinate(e, all, counts, counts + e->size, &reply), rc, out);
    HVL_CHECK_GOTO(broadcast_responses(e, &reply), rc, out);
    rc = apply_responses(e, n, &reply, out);
out:
    hvl__count(&e->counters.full_rounds, 1);
    hvl__buf_free(&mine);
    hvl__buf_free(&reply);
    free(all);
    free(counts);
    return rc;
}

int hvl__negotiate(hvl_engine *e, hvl_response_list *out)
{
    hvl_negotiation *n = e->negotiation;
    double t0 = hvl__now();
    mark_ready(e, n);
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Iallreduce(n->bits_mine, n->bits_all, n->bit_words, MPI_UINT64_T,
                                            MPI_BAND, e->comm, &req), "MPI_Iallreduce"));
    HVL_CHECK(wait_peers(e, &req, "negotiation (ready bits)"));
    hvl__count(&e->counters.cycles, 1);
    if (!(n->bits_all[0] & FLAG_NO_SHUTDOWN)) {
        e->stop_agreed = 1;
        return hvl__fail(HVL_ERR_SHUT_DOWN, "hvlite has been shut down: a rank called shutdown() or "
                         "exited; collectives still pending then cannot complete");
    }
    if (!(n->bits_all[0] & FLAG_NO_TUNE_UPDATE)) HVL_CHECK(hvl__autotune_sync(e));
    HVL_CHECK(take_cached(e, n, out));
    if (!(n->bits_all[0] & FLAG_NO_FULL_ROUND)) HVL_CHECK(full_round(e, n, out));
    if (out->count) hvl__log(HVL_LOG_TRACE, "round: %d agreed, %.1f us", out->count, (hvl__now() - t0) * 1e6);
    return HVL_OK;
}
