/* pset.c: the table of process sets. Set 0 is every rank (e->comm). Each set records its
 * members (global ranks, ascending), this process's rank among them, and a communicator of
 * the members, so data-plane collectives of different sets never share a communicator and
 * sets with disjoint members run at the same time, and its data planes' own state (opened and
 * closed through the registry, backends/backend.c). Every rank keeps the same table: sets are
 * added and removed by collective steps that every rank runs at the same point of the agreed
 * response list, and ids are never reused. The bg thread changes the table under queue_lock
 * (user threads read sizes and membership there when they enqueue); the bg thread reads it
 * without the lock. Communicators and plane state are bg-only. Adding a set is collective, and
 * each of its steps is a bounded wait (peer timeout, shutdown and fatal flags: util.h): the
 * member-list check, the communicator split (hvl__comm_split, as MPI has no nonblocking split)
 * and the planes' setup. */
#include <stdlib.h>
#include <string.h>
#include "backend.h"

/* Whether every member shares this process's host: the members that are also in this
 * process's shared-memory communicator (e->local_comm) are all of them. */
static int members_on_one_host(hvl_engine *e, const hvl_pset *ps)
{
    if (ps->rank < 0) return 0;
    MPI_Group world, local, members, both;
    int in_both = 0;
    MPI_Comm_group(e->comm, &world);
    MPI_Comm_group(e->local_comm, &local);
    MPI_Group_incl(world, ps->size, ps->ranks, &members);
    MPI_Group_intersection(members, local, &both);
    MPI_Group_size(both, &in_both);
    MPI_Group_free(&both);
    MPI_Group_free(&members);
    MPI_Group_free(&local);
    MPI_Group_free(&world);
    return in_both == ps->size;
}

int hvl__psets_create(hvl_engine *e)
{
    e->psets = calloc(1, sizeof(hvl_pset *));
    hvl_pset *ps = calloc(1, sizeof(hvl_pset));
    if (ps) ps->ranks = malloc(sizeof(int) * (size_t)e->size);
    if (!e->psets || !ps || !ps->ranks) {
        if (ps) free(ps->ranks);
        free(ps);
        return hvl__oom("the global process set");
    }
    for (int r = 0; r < e->size; r++) ps->ranks[r] = r;
    ps->id = 0;
    ps->size = e->size;
    ps->rank = e->rank;
    ps->comm = e->comm;              /* borrowed: the engine frees it */
    ps->one_host = members_on_one_host(e, ps);
    ps->cuda_device = -1;
    e->psets[0] = ps;
    e->npsets = 1;
    return hvl__planes_open(e, ps);  /* collective: the data planes' state for the set */
}

void hvl__psets_destroy(hvl_engine *e, int clean)
{
    pthread_mutex_lock(&e->queue_lock);    /* user threads may be looking a set up */
    hvl_pset **sets = e->psets;
    int n = e->npsets;
    e->psets = NULL;
    e->npsets = 0;
    pthread_mutex_unlock(&e->queue_lock);
    for (int i = 0; i < n; i++) {
        hvl_pset *ps = sets[i];
        if (!ps) continue;
        hvl__planes_close(ps, clean);
        if (clean && i != 0 && ps->comm != MPI_COMM_NULL) MPI_Comm_free(&ps->comm);
        free(ps->ranks);
        free(ps);
    }
    free(sets);
}

hvl_pset *hvl__pset(hvl_engine *e, int id)
{
    return id >= 0 && id < e->npsets ? e->psets[id] : NULL;
}

int hvl__pset_rank_of(const hvl_pset *ps, int global_rank)
{
    for (int i = 0; i < ps->size; i++)
        if (ps->ranks[i] == global_rank) return i;
    return -1;
}

/* The error for member lists that differ: the groups of ranks that passed the same list (by
 * hash, in order of their first rank) and this rank's list (its first 16 members). */
static int members_differ(const hvl_engine *e, const int64_t *hashes, const int64_t *members, int n)
{
    hvl_buf msg = {0};
    hvl__buf_printf(&msg, "add_process_set: the ranks passed different member lists: ");
    for (int r = 0, groups = 0; r < e->size; r++) {
        int seen = 0, many = 0;
        for (int p = 0; p < r && !seen; p++) seen = hashes[p] == hashes[r];
        for (int p = r + 1; p < e->size && !seen; p++) many |= hashes[p] == hashes[r];
        if (seen) continue;
        hvl__buf_printf(&msg, "%srank%s %d", groups ? "; " : "", many ? "s" : "", r);
        for (int p = r + 1; p < e->size; p++)
            if (hashes[p] == hashes[r]) hvl__buf_printf(&msg, ",%d", p);
        hvl__buf_printf(&msg, groups++ ? " another" : " one list");
    }
    hvl__buf_printf(&msg, " (this rank, %d, passed %d member%s: ", e->rank, n, n == 1 ? "" : "s");
    for (int i = 0; i < n && i < 16; i++) hvl__buf_printf(&msg, "%s%lld", i ? "," : "", (long long)members[i]);
    hvl__buf_printf(&msg, "%s); every rank must add the same sets in the same order", n > 16 ? ",..." : "");
    hvl__buf_put(&msg, "", 1);
    int rc = hvl__fail(HVL_ERR_INVALID_ARG, "%s", msg.bad ? "add_process_set: the ranks passed different member lists" : msg.data);
    hvl__buf_free(&msg);
    return rc;
}

/* Every rank passed the same member list: an allgather of a hash of each rank's list (bounded
 * by the peer timeout). A disagreement fails on every rank (*everywhere: not fatal, nothing
 * was built), naming which ranks passed which list. */
static int agree_members(hvl_engine *e, const int64_t *members, int n, int *everywhere)
{
    uint64_t h = hvl__hash(members, sizeof(int64_t) * (size_t)n, HVL_HASH_SEED);
    int64_t mine = (int64_t)hvl__hash(&n, sizeof(n), h);
    int64_t *hashes = malloc(sizeof(int64_t) * (size_t)e->size);
    if (!hashes) return hvl__oom("add_process_set: member list hashes");
    int rc = hvl__allgather_i64(e->comm, &mine, 1, hashes, hvl__peer_bound(e),
                                "add_process_set: exchanging member lists");
    *everywhere = 0;
    for (int r = 0; rc == HVL_OK && r < e->size; r++) *everywhere |= hashes[r] != mine;
    if (rc == HVL_OK && *everywhere) rc = members_differ(e, hashes, members, n);
    free(hashes);
    return rc;
}

/* An existing set with exactly these members, or NULL. */
static hvl_pset *find_same(hvl_engine *e, const int64_t *members, int n)
{
    for (int i = 0; i < e->npsets; i++) {
        hvl_pset *ps = e->psets[i];
        if (!ps || ps->size != n) continue;
        int same = 1;
        for (int k = 0; k < n && same; k++) same = ps->ranks[k] == members[k];
        if (same) return ps;
    }
    return NULL;
}

static int insert(hvl_engine *e, hvl_pset *ps)
{
    hvl_pset **grown = realloc(e->psets, sizeof(hvl_pset *) * (size_t)(e->npsets + 1));
    if (!grown) return hvl__oom("the process set table");
    pthread_mutex_lock(&e->queue_lock);
    e->psets = grown;
    ps->id = e->npsets;
    e->psets[e->npsets++] = ps;
    pthread_mutex_unlock(&e->queue_lock);
    return HVL_OK;
}

int hvl__pset_add(hvl_engine *e, const int64_t *members, int n, int *id_out, int *everywhere)
{
    HVL_CHECK(agree_members(e, members, n, everywhere));
    hvl_pset *same = find_same(e, members, n);      /* the same on every rank: tables agree */
    *everywhere = same != NULL;
    if (same)
        return hvl__fail(HVL_ERR_INVALID_ARG, "add_process_set: process set %d already has these %d ranks",
                         same->id, n);
    hvl_pset *ps = calloc(1, sizeof(hvl_pset));
    if (ps) ps->ranks = malloc(sizeof(int) * (size_t)n);
    if (!ps || !ps->ranks) { if (ps) free(ps->ranks); free(ps); return hvl__oom("a process set"); }
    for (int i = 0; i < n; i++) ps->ranks[i] = (int)members[i];
    ps->size = n;
    ps->rank = hvl__pset_rank_of(ps, e->rank);
    ps->comm = MPI_COMM_NULL;
    int rc;
    hvl__test_stop_point(e->params.test_stop_at, e->rank, "pset_split");
    HVL_CHECK_GOTO(hvl__comm_split(e->comm, ps->rank >= 0 ? 0 : MPI_UNDEFINED, e->rank, 0, &ps->comm,
                                   hvl__peer_bound(e), "add_process_set: MPI_Comm_split"), rc, fail);
    ps->one_host = members_on_one_host(e, ps);
    ps->cuda_device = -1;
    HVL_CHECK_GOTO(insert(e, ps), rc, fail);
    *id_out = ps->id;
    hvl__log(HVL_LOG_DEBUG, "process set %d added: %d ranks, this rank %d", ps->id, n, ps->rank);
    return hvl__planes_open(e, ps);     /* collective among the members (others return at once) */
fail:
    if (ps->comm != MPI_COMM_NULL) MPI_Comm_free(&ps->comm);
    free(ps->ranks);
    free(ps);
    return rc;
}

void hvl__pset_remove(hvl_engine *e, int id)
{
    hvl_pset *ps = hvl__pset(e, id);
    if (!ps || id == 0) return;
    pthread_mutex_lock(&e->queue_lock);
    e->psets[id] = NULL;
    pthread_mutex_unlock(&e->queue_lock);
    hvl__planes_close(ps, 1);
    if (ps->comm != MPI_COMM_NULL) MPI_Comm_free(&ps->comm);
    free(ps->ranks);
    free(ps);
    hvl__log(HVL_LOG_DEBUG, "process set %d removed", id);
}

int hvl__pset_lookup(hvl_engine *e, int id, int *size, int *rank, int other, int *other_rank)
{
    int rc = HVL_OK;
    pthread_mutex_lock(&e->queue_lock);
    hvl_pset *ps = id >= 0 && id < e->npsets ? e->psets[id] : NULL;
    if (ps) {
        *size = ps->size;
        *rank = ps->rank;
        if (other_rank) *other_rank = hvl__pset_rank_of(ps, other);
    } else {
        rc = hvl__fail(HVL_ERR_INVALID_ARG, "process set %d does not exist (never added, or removed)", id);
    }
    pthread_mutex_unlock(&e->queue_lock);
    return rc;
}

int hvl_process_set_info(int id, int *size, int *rank)
{
    if (!hvl_is_initialized()) return hvl__not_running();
    return hvl__pset_lookup(&hvl__engine, id, size, rank, 0, NULL);
}
