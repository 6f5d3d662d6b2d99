/* backend_hier.c: hierarchical allreduce for a process set spread over several hosts
 * (HVLITE_HIERARCHICAL_ALLREDUCE=1, hvlrun --hierarchical-allreduce). A fused batch goes in
 * chunks of HVLITE_SHM_CHUNK bytes; per chunk:
 *   1. the members on each host reduce it through their segment, each rank its own slice
 *      (fill my buffer; sync; reduce my slice out of every member's buffer; sync);
 *   2. the host's local rank 0 gathers the slices into its buffer and allreduces the chunk
 *      over MPI with the other hosts' local rank 0 (one rank per host; the others sleep);
 *   3. sync, and every member drains the result from local rank 0's buffer (a broadcast).
 * A host with one member of the set skips the shared-memory steps. Only allreduce runs here;
 * the other collectives of such a set go to MPI. Integer results equal the flat ones bit for
 * bit; float sums differ only by the order of the additions. bg thread only. */
#include <string.h>
#include "shm.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Local rank 0: the other members' reduced slices into `mine`, then MPI among the hosts. */
static int across_hosts(hvl_engine *e, hvl_shm *s, char *mine, int64_t m, int dtype, int reduce_op)
{
    int esize = hvl_dtype_size(dtype);
    for (int r = 1; r < s->local_size; r++) {
        int64_t start, len;
        hvl__shm_slice(m, s->local_size, esize, r, &start, &len);
        if (len) memcpy(mine + start * esize, hvl__shm_buf(s, r) + start * esize, (size_t)(len * esize));
    }
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Iallreduce(MPI_IN_PLACE, mine, (int)m, hvl__mpi_dtype(dtype),
                                            hvl__mpi_op(reduce_op, dtype), s->leaders_comm, &req),
                             "MPI_Iallreduce (hierarchical, across hosts)"));
    return hvl__mpi_progress_wait(&req, hvl__peer_bound(e), "hierarchical allreduce across hosts");
}

static int allreduce_stream(hvl_engine *e, hvl_pset *ps, void *state, hvl_stream *st)
{
    hvl_shm *s = state;
    (void)ps;
    int esize = hvl_dtype_size(st->dtype), shared = s->local_size > 1;
    int64_t per_step = s->chunk / esize;   /* at most 2^30 bytes: fits MPI's int count */
    for (int64_t off = 0; off < st->count; off += per_step, s->steps++) {
        int64_t m = min64(per_step, st->count - off);
        char *mine = shared ? hvl__shm_buf(s, s->local_rank) : s->scratch;
        st->fill(st, off, m, mine);
        if (shared) {
            HVL_CHECK(hvl__shm_sync(e, s, "hierarchical allreduce (inputs)"));
            hvl__shm_reduce_slice(s, m, st->dtype, st->reduce_op);
            HVL_CHECK(hvl__shm_sync(e, s, "hierarchical allreduce (reduced on host)"));
        }
        if (s->local_rank == 0) HVL_CHECK(across_hosts(e, s, mine, m, st->dtype, st->reduce_op));
        if (shared) HVL_CHECK(hvl__shm_sync(e, s, "hierarchical allreduce (reduced across hosts)"));
        st->drain(st, off, m, shared ? hvl__shm_buf(s, 0) : s->scratch);
    }
    return HVL_OK;
}

static int allreduce(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, int64_t count,
                     int dtype, int reduce_op)
{
    return hvl__shm_allreduce_plain(e, ps, state, allreduce_stream, src, dst, count, dtype, reduce_op);
}

static int can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k)
{
    (void)e; (void)ps; (void)state;
    return k->op == HVL_ALLREDUCE && k->memory == HVL_MEMORY_HOST;
}

/* Only sets spread over several hosts, when HVLITE_HIERARCHICAL_ALLREDUCE asks for it (agreed
 * from rank 0) and shared memory is not switched off. */
static int open_set(hvl_engine *e, hvl_pset *ps, void **state)
{
    *state = NULL;
    if (!e->params.hierarchical_allreduce || e->params.shm_disable || ps->size < 2 || ps->one_host)
        return HVL_OK;
    return hvl__shm_open(e, ps, (hvl_shm **)state);
}

static void close_set(void *state, int clean) { hvl__shm_close(state, clean); }

/* Only allreduce: can_run refuses every other op, so they are never called here. */
const hvl_backend hvl__backend_hier = {
    .name = "hierarchical",
    .open = open_set,
    .close = close_set,
    .can_run = can_run,
    .allreduce = allreduce,
    .allreduce_stream = allreduce_stream,
};
