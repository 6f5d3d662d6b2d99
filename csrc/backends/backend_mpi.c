/* backend_mpi.c: the MPI data plane, which runs everything on host memory and takes every
 * collective the planes before it refuse. It keeps no per-set state (the set's communicator is
 * enough). Data collectives are nonblocking MPI calls completed by the progress wait
 * (util/mpi_util.c): as fast as the blocking calls, but a peer that dies or freezes mid-collective
 * ends the wait after HVLITE_PEER_TIMEOUT_SECONDS instead of hanging. Counts above MAX_CALL_COUNT
 * elements are split over several calls where the collective allows it (allreduce, broadcast);
 * the v-collectives take byte counts that must fit an int per rank. bg thread only. */
#include <limits.h>
#include <stdlib.h>
#include "backend.h"
#include "kernels.h"

#define MAX_CALL_COUNT ((int64_t)1 << 30)

/* Completes the nonblocking collective that `mpi_rc` started in *req. */
static int finish(hvl_engine *e, int mpi_rc, MPI_Request *req, const char *what)
{
    HVL_CHECK(hvl__mpi_check(mpi_rc, what));
    return hvl__mpi_progress_wait(req, hvl__peer_bound(e), what);
}

static int can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k)
{
    (void)e; (void)ps; (void)state;
    return k->memory == HVL_MEMORY_HOST;
}

static int allreduce(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, int64_t count, int dtype, int reduce_op)
{
    (void)state;
    MPI_Request req;
    MPI_Datatype t = hvl__mpi_dtype(dtype);
    MPI_Op op = hvl__mpi_op(reduce_op, dtype);
    int64_t esize = hvl_dtype_size(dtype);
    for (int64_t off = 0; off < count; off += MAX_CALL_COUNT) {
        int n = (int)(count - off < MAX_CALL_COUNT ? count - off : MAX_CALL_COUNT);
        const void *s = src == dst ? MPI_IN_PLACE : (const char *)src + off * esize;
        int rc = MPI_Iallreduce(s, (char *)dst + off * esize, n, t, op, ps->comm, &req);
        if (off == 0)          /* tests: frozen with the collective started */
            hvl__test_stop_point(e->params.test_stop_at, e->rank, "mpi_allreduce");
        HVL_CHECK(finish(e, rc, &req, "MPI_Iallreduce"));
    }
    return HVL_OK;
}

static int broadcast(hvl_engine *e, hvl_pset *ps, void *state, void *buf, int64_t bytes, int root)
{
    (void)state;
    MPI_Request req;
    for (int64_t off = 0; off < bytes; off += MAX_CALL_COUNT) {
        int n = (int)(bytes - off < MAX_CALL_COUNT ? bytes - off : MAX_CALL_COUNT);
        HVL_CHECK(finish(e, MPI_Ibcast((char *)buf + off, n, MPI_BYTE, root, ps->comm, &req), &req, "MPI_Ibcast"));
    }
    return HVL_OK;
}

/* int counts and displacements from 64-bit byte counts; fails past INT_MAX. */
static int int_counts(const int64_t *bytes, int n, int *counts, int *displs, const char *what)
{
    int64_t off = 0;
    for (int r = 0; r < n; r++) {
        if (bytes[r] > INT_MAX || off > INT_MAX)
            return hvl__fail(HVL_ERR_INVALID_ARG, "%s: more than 2 GiB per rank is not supported by the MPI backend", what);
        counts[r] = (int)bytes[r];
        displs[r] = (int)off;
        off += bytes[r];
    }
    return HVL_OK;
}

static int allgatherv(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, const int64_t *rank_bytes)
{
    (void)state;
    MPI_Request req;
    int *counts = malloc(sizeof(int) * 2 * (size_t)ps->size), rc;
    if (!counts) return hvl__oom("MPI allgather counts");
    int *displs = counts + ps->size;
    HVL_CHECK_GOTO(int_counts(rank_bytes, ps->size, counts, displs, "allgather"), rc, out);
    rc = finish(e, MPI_Iallgatherv(src, counts[ps->rank], MPI_BYTE, dst, counts, displs, MPI_BYTE, ps->comm, &req),
                &req, "MPI_Iallgatherv");
out:
    free(counts);
    return rc;
}

static int alltoallv(hvl_engine *e, hvl_pset *ps, void *state, const void *src, const int64_t *send_bytes, void *dst,
                     const int64_t *recv_bytes)
{
    (void)state;
    MPI_Request req;
    int *v = malloc(sizeof(int) * 4 * (size_t)ps->size), rc;
    if (!v) return hvl__oom("MPI alltoall counts");
    int *scounts = v, *sdispls = v + ps->size, *rcounts = v + 2 * ps->size, *rdispls = v + 3 * ps->size;
    HVL_CHECK_GOTO(int_counts(send_bytes, ps->size, scounts, sdispls, "alltoall"), rc, out);
    HVL_CHECK_GOTO(int_counts(recv_bytes, ps->size, rcounts, rdispls, "alltoall"), rc, out);
    rc = finish(e, MPI_Ialltoallv(src, scounts, sdispls, MPI_BYTE, dst, rcounts, rdispls, MPI_BYTE, ps->comm, &req),
                &req, "MPI_Ialltoallv");
out:
    free(v);
    return rc;
}

static int reducescatter(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, const int64_t *counts,
                         int dtype, int reduce_op)
{
    (void)state;
    MPI_Request req;
    int *c = malloc(sizeof(int) * (size_t)ps->size), rc;
    if (!c) return hvl__oom("MPI reducescatter counts");
    for (int r = 0; r < ps->size; r++) {
        if (counts[r] > INT_MAX) {
            rc = hvl__fail(HVL_ERR_INVALID_ARG, "reducescatter: more than 2^31 elements per rank");
            goto out;
        }
        c[r] = (int)counts[r];
    }
    rc = finish(e, MPI_Ireduce_scatter(src, dst, c, hvl__mpi_dtype(dtype), hvl__mpi_op(reduce_op, dtype), ps->comm,
                                       &req), &req, "MPI_Ireduce_scatter");
out:
    free(c);
    return rc;
}

const hvl_backend hvl__backend_mpi = {
    .name = "mpi",
    .can_run = can_run,
    .allreduce = allreduce,
    .allgatherv = allgatherv,
    .broadcast = broadcast,
    .alltoallv = alltoallv,
    .reducescatter = reducescatter,
    .adasum = hvl__adasum_mpi,
};
