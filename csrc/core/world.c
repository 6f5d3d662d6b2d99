/* world.c: the job's world, made at startup by the bg thread: MPI's init (or its reuse), the
 * world communicator (e->comm: a duplicate of MPI_COMM_WORLD, of the communicator init was
 * given, or the communicator of the ranks it was given) and, within it, the communicators of
 * this host's ranks and of the ranks with this local rank (one per host). Everything the engine
 * derives from the job (ranks, process sets, host locality, the planes' communicators) comes
 * from e->comm; nothing else names MPI_COMM_WORLD. hvl__world_ask runs on the thread calling
 * hvl_init_on, under engine.c's life lock, before the bg thread starts. */
#include <stdlib.h>
#include <string.h>
#include "engine.h"

/* The ranks with this rank's local rank, one per host. */
static int make_cross_comm(hvl_engine *e)
{
    HVL_CHECK(hvl__comm_split(e->comm, e->local_rank, e->rank, 0, &e->cross_comm, hvl__peer_bound(e),
                              "MPI_Comm_split (ranks of this local rank)"));
    MPI_Comm_rank(e->cross_comm, &e->cross_rank);
    MPI_Comm_size(e->cross_comm, &e->cross_size);
    return HVL_OK;
}

/* The world hvl_init_on asked for (life_lock; the bg thread it starts reads it, ordered by
 * pthread_create): a communicator to duplicate, or ranks of MPI_COMM_WORLD; neither: all of it. */
static struct {
    int has_comm;
    MPI_Comm comm;
    int *ranks;                 /* owned; freed by the next hvl_init_on */
    int nranks;
} asked;

/* The tag of init's MPI_Comm_create_group: groups created side by side are disjoint, so one
 * tag serves them all. */
#define WORLD_TAG 0x68766c

static void say_list(hvl_buf *b)
{
    hvl__buf_printf(b, "[");
    for (int i = 0; i < asked.nranks && i < 16; i++) hvl__buf_printf(b, "%s%d", i ? ", " : "", asked.ranks[i]);
    hvl__buf_printf(b, "%s]", asked.nranks > 16 ? ", ..." : "");
}

/* init(comm=[ranks]): every rank a rank of MPI_COMM_WORLD, once, this process's among them. */
static int check_ranks(int world_rank, int world_size)
{
    int member = 0, rc = HVL_OK;
    hvl_buf list = {0};
    say_list(&list);
    hvl__buf_put(&list, "", 1);
    const char *shown = list.bad ? "[...]" : list.data;
    for (int i = 0; i < asked.nranks && rc == HVL_OK; i++) {
        int r = asked.ranks[i];
        if (r < 0 || r >= world_size)
            rc = hvl__fail(HVL_ERR_INVALID_ARG, "init(comm=%s): %d is not a rank of MPI_COMM_WORLD (it has %d rank%s)",
                           shown, r, world_size, world_size == 1 ? "" : "s");
        for (int j = 0; j < i && rc == HVL_OK; j++)
            if (asked.ranks[j] == r) rc = hvl__fail(HVL_ERR_INVALID_ARG, "init(comm=%s): rank %d is listed twice", shown, r);
        member |= r == world_rank;
    }
    if (rc == HVL_OK && !member)
        rc = hvl__fail(HVL_ERR_INVALID_ARG, "init(comm=%s): this process, rank %d of MPI_COMM_WORLD, is not in "
                       "the list; only the listed ranks call init with it (a rank outside it runs its own "
                       "init(comm=[...]) naming itself, or none; Horovod would fall back to MPI_COMM_WORLD "
                       "here and wait for ranks that never join)", shown, world_rank);
    hvl__buf_free(&list);
    return rc;
}

/* The members passed the same list: an allgather of its hash over `comm`, their communicator
 * in ascending rank order (which they agree on whatever order each list has). */
static int agree_on_ranks(hvl_engine *e, MPI_Comm comm, int size)
{
    int64_t mine = (int64_t)hvl__hash(asked.ranks, sizeof(int) * (size_t)asked.nranks, HVL_HASH_SEED);
    int64_t *all = malloc(sizeof(int64_t) * (size_t)size);
    if (!all) return hvl__oom("init's rank lists");
    int rc = hvl__allgather_i64(comm, &mine, 1, all, hvl__peer_bound(e), "MPI_Iallgather (init's rank lists)");
    for (int r = 0; r < size && rc == HVL_OK; r++) {
        if (all[r] == mine) continue;
        hvl_buf list = {0};
        say_list(&list);
        hvl__buf_put(&list, "", 1);
        rc = hvl__fail(HVL_ERR_INVALID_ARG, "init(comm=%s): the listed ranks did not all pass this list; every "
                       "member must pass the same ranks in the same order", list.bad ? "[...]" : list.data);
        hvl__buf_free(&list);
        e->failed_everywhere = 1;       /* every member saw the same hashes */
    }
    free(all);
    return rc;
}

static int compare_ints(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* init(comm=[ranks]): the listed ranks' communicator, made in ascending order (members whose
 * lists differ in order only still agree on it, and then learn that they differ), then put in
 * the list's order. Members whose lists name other ranks wait in MPI_Comm_create_group for
 * ranks that never come: that ends at the peer timeout. */
static int world_of_ranks(hvl_engine *e)
{
    int world_rank, world_size, position = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    HVL_CHECK(check_ranks(world_rank, world_size));
    int *sorted = malloc(sizeof(int) * (size_t)asked.nranks);
    if (!sorted) return hvl__oom("init's ranks");
    memcpy(sorted, asked.ranks, sizeof(int) * (size_t)asked.nranks);
    qsort(sorted, (size_t)asked.nranks, sizeof(int), compare_ints);
    MPI_Group world, members;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    int mpi_rc = MPI_Group_incl(world, asked.nranks, sorted, &members);
    MPI_Group_free(&world);
    free(sorted);
    HVL_CHECK(hvl__mpi_check(mpi_rc, "MPI_Group_incl (the ranks init was given)"));
    MPI_Comm ascending;
    HVL_CHECK(hvl__comm_create_group(MPI_COMM_WORLD, members, WORLD_TAG, &ascending, hvl__peer_bound(e),
                                     "MPI_Comm_create_group (the ranks init was given)"));
    MPI_Comm_size(ascending, &size);
    int rc = agree_on_ranks(e, ascending, size);
    while (asked.ranks[position] != world_rank) position++;
    if (rc == HVL_OK)
        rc = hvl__comm_split(ascending, 0, position, 0, &e->comm, hvl__peer_bound(e),
                             "MPI_Comm_split (the ranks init was given, in its order)");
    if (rc == HVL_OK || e->failed_everywhere) MPI_Comm_free(&ascending);
    HVL_CHECK(rc);
    MPI_Comm_rank(e->comm, &e->rank);
    MPI_Comm_size(e->comm, &e->size);
    return HVL_OK;
}

/* e->comm: a duplicate of MPI_COMM_WORLD or of the communicator init was given, or the
 * communicator of the ranks it was given; MPI_ERRORS_RETURN. */
static int make_world(hvl_engine *e)
{
    MPI_Request req;
    if (asked.nranks > 0) return world_of_ranks(e);
    MPI_Comm parent = asked.has_comm ? asked.comm : MPI_COMM_WORLD;
    int inter = 0;
    if (parent == MPI_COMM_NULL || MPI_Comm_test_inter(parent, &inter) != MPI_SUCCESS || inter)
        return hvl__fail(HVL_ERR_INVALID_ARG, "init(comm=...): %s", parent == MPI_COMM_NULL ? "the communicator is "
                         "MPI_COMM_NULL" : "not an intracommunicator (hvlite runs on an intracommunicator's ranks)");
    HVL_CHECK(hvl__mpi_check(MPI_Comm_idup(parent, &e->comm, &req), "MPI_Comm_idup"));
    HVL_CHECK(hvl__mpi_progress_wait(&req, hvl__peer_bound(e), "MPI_Comm_idup (hvlite's communicator)"));
    MPI_Comm_set_errhandler(e->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(e->comm, &e->rank);
    MPI_Comm_size(e->comm, &e->size);
    return HVL_OK;
}

/* hvlite initialised MPI in this process (bg threads only, one at a time): an engine whose
 * init failed without finalizing leaves MPI to the next one, which finalizes it at the end. */
static int mpi_ours;

int hvl__world_make(hvl_engine *e)
{
    int provided = 0, flag = 0;
    MPI_Initialized(&flag);
    if (!flag) {
        int wanted = e->params.mpi_threads_disable ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
        HVL_CHECK(hvl__mpi_check(MPI_Init_thread(NULL, NULL, wanted, &provided), "MPI_Init_thread"));
        mpi_ours = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    e->mpi_initialized_here = mpi_ours;
    e->thread_multiple = provided == MPI_THREAD_MULTIPLE;
    e->whole_world = !asked.has_comm && asked.nranks == 0;
    HVL_CHECK(make_world(e));
    HVL_CHECK(hvl__comm_split(e->comm, 0, e->rank, 1, &e->local_comm, hvl__peer_bound(e),
                              "MPI_Comm_split_type (ranks on this host)"));
    MPI_Comm_rank(e->local_comm, &e->local_rank);
    MPI_Comm_size(e->local_comm, &e->local_size);
    return make_cross_comm(e);
}

/* HVLITE_TEST_FAKE_HOSTS=H (tests only): each host's ranks are split into H consecutive groups
 * that the engine treats as hosts of their own (local and cross communicators, topology
 * queries, process sets' one_host), so multi-host paths run on one machine. */
int hvl__world_split_fake_hosts(hvl_engine *e)
{
    int hosts = e->params.test_fake_hosts;
    MPI_Comm local;
    if (hosts < 2) return HVL_OK;
    HVL_CHECK(hvl__comm_split(e->local_comm, (int)((int64_t)e->local_rank * hosts / e->local_size), e->rank, 0,
                              &local, hvl__peer_bound(e), "MPI_Comm_split (fake hosts)"));
    MPI_Comm_free(&e->local_comm);
    MPI_Comm_free(&e->cross_comm);
    e->local_comm = local;
    MPI_Comm_rank(e->local_comm, &e->local_rank);
    MPI_Comm_size(e->local_comm, &e->local_size);
    return make_cross_comm(e);
}

int hvl__world_ask(const void *mpi_comm, size_t comm_bytes, const int *ranks, int nranks)
{
    free(asked.ranks);
    memset(&asked, 0, sizeof(asked));
    if (mpi_comm) {
        if (comm_bytes != sizeof(MPI_Comm))
            return hvl__fail(HVL_ERR_INVALID_ARG, "init(comm=...): the communicator is %zu bytes, an MPI_Comm of "
                             "the MPI hvlite was built with (%s) is %zu: it comes from another MPI library",
                             comm_bytes, hvl_mpi_vendor(), sizeof(MPI_Comm));
        memcpy(&asked.comm, mpi_comm, sizeof(MPI_Comm));
        asked.has_comm = 1;
    } else if (ranks && nranks > 0) {
        if (!(asked.ranks = malloc(sizeof(int) * (size_t)nranks))) return hvl__oom("init's ranks");
        memcpy(asked.ranks, ranks, sizeof(int) * (size_t)nranks);
        asked.nranks = nranks;
    }
    return HVL_OK;
}

