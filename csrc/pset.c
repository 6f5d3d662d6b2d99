/* pset.c: the table of process sets. Set 0 is every rank (e->comm). Each set records its
 * members (global ranks, ascending), this process's rank among them, and a communicator of
 * the members, so data-plane collectives of different sets never share a communicator and
 * sets with disjoint members run at the same time. Every rank keeps the same table (sets are
 * added and removed by collective engine steps). bg thread only. */
#include <stdlib.h>
#include "internal.h"

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
        return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory creating the global process set");
    }
    for (int r = 0; r < e->size; r++) ps->ranks[r] = r;
    ps->id = 0;
    ps->size = e->size;
    ps->rank = e->rank;
    ps->comm = e->comm;              /* borrowed: the engine frees it */
    ps->one_host = members_on_one_host(e, ps);
    e->psets[0] = ps;
    e->npsets = 1;
    return hvl__shm_open(e, ps);     /* collective: the set's shared-memory segment */
}

void hvl__psets_destroy(hvl_engine *e, int clean)
{
    for (int i = 0; i < e->npsets; i++) {
        hvl_pset *ps = e->psets[i];
        if (!ps) continue;
        hvl__shm_close(ps, clean);
        if (clean && i != 0 && ps->comm != MPI_COMM_NULL) MPI_Comm_free(&ps->comm);
        free(ps->ranks);
        free(ps);
    }
    free(e->psets);
    e->psets = NULL;
    e->npsets = 0;
}

hvl_pset *hvl__pset(hvl_engine *e, int id)
{
    return id >= 0 && id < e->npsets ? e->psets[id] : NULL;
}
