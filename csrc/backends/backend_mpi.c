/* backend_mpi.c: the MPI data plane, which runs everything on host memory. Data collectives
 * are blocking calls: by the time they run, negotiation has brought every rank to the same
 * response, so nobody waits long in them. Counts above INT_MAX elements are split into chunks
 * where the collective allows it (allreduce, broadcast); the v-collectives take byte counts
 * that must fit an int per rank. bg thread only. */
#include <limits.h>
#include <stdlib.h>
#include "internal.h"

#define CHUNK_ELEMS ((int64_t)1 << 30)

static int can_run(const hvl_engine *e, const hvl_pset *ps, int op, int dtype, int64_t bytes)
{
    (void)e; (void)ps; (void)op; (void)dtype; (void)bytes;
    return 1;
}

static int allreduce(hvl_engine *e, hvl_pset *ps, const void *src, void *dst, int64_t count, int dtype, int reduce_op)
{
    (void)e;
    MPI_Datatype t = hvl__mpi_dtype(dtype);
    MPI_Op op = hvl__mpi_op(reduce_op, dtype);
    int64_t esize = hvl_dtype_size(dtype);
    for (int64_t off = 0; off < count; off += CHUNK_ELEMS) {
        int n = (int)(count - off < CHUNK_ELEMS ? count - off : CHUNK_ELEMS);
        const void *s = src == dst ? MPI_IN_PLACE : (const char *)src + off * esize;
        HVL_CHECK(hvl__mpi_check(MPI_Allreduce(s, (char *)dst + off * esize, n, t, op, ps->comm), "MPI_Allreduce"));
    }
    return HVL_OK;
}

static int broadcast(hvl_engine *e, hvl_pset *ps, void *buf, int64_t bytes, int root)
{
    (void)e;
    for (int64_t off = 0; off < bytes; off += CHUNK_ELEMS) {
        int n = (int)(bytes - off < CHUNK_ELEMS ? bytes - off : CHUNK_ELEMS);
        HVL_CHECK(hvl__mpi_check(MPI_Bcast((char *)buf + off, n, MPI_BYTE, root, ps->comm), "MPI_Bcast"));
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

static int allgatherv(hvl_engine *e, hvl_pset *ps, const void *src, void *dst, const int64_t *rank_bytes)
{
    (void)e;
    int *counts = malloc(sizeof(int) * 2 * (size_t)ps->size), rc;
    if (!counts) return HVL_ERR_NO_MEMORY;
    int *displs = counts + ps->size;
    HVL_CHECK_GOTO(int_counts(rank_bytes, ps->size, counts, displs, "allgather"), rc, out);
    rc = hvl__mpi_check(MPI_Allgatherv(src, counts[ps->rank], MPI_BYTE, dst, counts, displs,
                                       MPI_BYTE, ps->comm), "MPI_Allgatherv");
out:
    free(counts);
    return rc;
}

static int alltoallv(hvl_engine *e, hvl_pset *ps, const void *src, const int64_t *send_bytes, void *dst,
                     const int64_t *recv_bytes)
{
    (void)e;
    int *v = malloc(sizeof(int) * 4 * (size_t)ps->size), rc;
    if (!v) return HVL_ERR_NO_MEMORY;
    int *scounts = v, *sdispls = v + ps->size, *rcounts = v + 2 * ps->size, *rdispls = v + 3 * ps->size;
    HVL_CHECK_GOTO(int_counts(send_bytes, ps->size, scounts, sdispls, "alltoall"), rc, out);
    HVL_CHECK_GOTO(int_counts(recv_bytes, ps->size, rcounts, rdispls, "alltoall"), rc, out);
    rc = hvl__mpi_check(MPI_Alltoallv(src, scounts, sdispls, MPI_BYTE, dst, rcounts, rdispls,
                                      MPI_BYTE, ps->comm), "MPI_Alltoallv");
out:
    free(v);
    return rc;
}

static int reducescatter(hvl_engine *e, hvl_pset *ps, const void *src, void *dst, const int64_t *counts,
                         int dtype, int reduce_op)
{
    (void)e;
    int *c = malloc(sizeof(int) * (size_t)ps->size), rc = HVL_OK;
    if (!c) return HVL_ERR_NO_MEMORY;
    for (int r = 0; r < ps->size && rc == HVL_OK; r++) {
        if (counts[r] > INT_MAX) rc = hvl__fail(HVL_ERR_INVALID_ARG, "reducescatter: more than 2^31 elements per rank");
        c[r] = (int)counts[r];
    }
    if (rc == HVL_OK)
        rc = hvl__mpi_check(MPI_Reduce_scatter(src, dst, c, hvl__mpi_dtype(dtype),
                                               hvl__mpi_op(reduce_op, dtype), ps->comm), "MPI_Reduce_scatter");
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
};
