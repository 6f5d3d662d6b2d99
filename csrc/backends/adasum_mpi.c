/* adasum_mpi.c: Adasum (adaptive summation) on the MPI plane, for a power-of-2 set. Two ranks'
 * vectors a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, per tensor; the
 * ranks combine as a tree: pairs (r, r^1) first, then those pairs' results (r, r^2), ... so
 * the result is that of rank order ((v0 + v1) + (v2 + v3)) + ..., the first group's vector
 * always "a".
 *
 * The data moves by recursive halving, then doubling (Horovod's shape, written anew here): at
 * level d each rank keeps half of the slice it holds, sends the other half to rank ^ d and
 * gets that rank's copy of the half it keeps. The 2d ranks of a block then hold disjoint slices
 * of the same pair of vectors, so the sums of their slices' dot products and norms (a
 * butterfly among them, added in rank order so every rank gets the same bits) are the whole
 * tensors'; each rank combines its slice. After the last level every rank holds 1/size of the
 * result, and the halving is undone by exchanging slices back (level size/2 first). Every rank
 * ends with the same values: each slice is computed once and copied.
 *
 * Point-to-point messages use their own tag on the set's communicator, where nothing else
 * sends point to point; waits are the progress wait (bounded). The receive half lives in the
 * engine's scratch buffer. bg thread only. */
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "kernels.h"

#define TAG 0x4144                         /* "AD" */
#define MAX_MESSAGE ((int64_t)1 << 30)     /* bytes per MPI call (counts are int) */

typedef struct {
    hvl_engine *e;
    hvl_pset *ps;
    int dtype, esize, ntensors;
    const int64_t *starts;      /* tensor i is elements [starts[i], starts[i + 1]) */
    double *dots, *theirs;      /* per tensor: a.b, a.a, b.b (3 * ntensors each) */
} adasum_run;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Sends `sbytes` to peer while receiving `rbytes` from it, in matching chunks. */
static int exchange(adasum_run *r, int peer, const void *send, int64_t sbytes, void *recv,
                    int64_t rbytes)
{
    hvl_bound bound = hvl__peer_bound(r->e);
    MPI_Comm comm = r->ps->comm;
    for (int64_t off = 0; off < max64(sbytes, rbytes); off += MAX_MESSAGE) {
        int sn = (int)max64(0, min64(sbytes - off, MAX_MESSAGE));
        int rn = (int)max64(0, min64(rbytes - off, MAX_MESSAGE));
        const char *from = (const char *)send + (sn ? off : 0);
        char *to = (char *)recv + (rn ? off : 0);
        MPI_Request req[2];
        HVL_CHECK(hvl__mpi_check(MPI_Irecv(to, rn, MPI_BYTE, peer, TAG, comm, &req[0]),
                                 "MPI_Irecv (Adasum)"));
        HVL_CHECK(hvl__mpi_check(MPI_Isend(from, sn, MPI_BYTE, peer, TAG, comm, &req[1]),
                                 "MPI_Isend (Adasum)"));
        HVL_CHECK(hvl__mpi_progress_wait(&req[0], bound, "Adasum: receiving a slice"));
        HVL_CHECK(hvl__mpi_progress_wait(&req[1], bound, "Adasum: sending a slice"));
    }
    return HVL_OK;
}

/* Sums the dot products over the block of 2 * level ranks around this one (a butterfly); the
 * lower rank's terms always come first, so both sides of each step get the same sum. */
static int block_sum(adasum_run *r, int level)
{
    int n = 3 * r->ntensors, rank = r->ps->rank;
    int64_t bytes = n * (int64_t)sizeof(double);
    for (int j = 1; j <= level; j <<= 1) {
        HVL_CHECK(exchange(r, rank ^ j, r->dots, bytes, r->theirs, bytes));
        int lower = (rank & j) == 0;
        for (int i = 0; i < n; i++)
            r->dots[i] = lower ? r->dots[i] + r->theirs[i] : r->theirs[i] + r->dots[i];
    }
    return HVL_OK;
}

/* One level: `mine` holds this rank's values of elements [lo, hi) and `other` the partner's;
 * the combination goes into `mine`. */
static int combine_level(adasum_run *r, char *mine, const char *other, int64_t lo, int64_t hi,
                         int level)
{
    int lower = (r->ps->rank & level) == 0;
    memset(r->dots, 0, sizeof(double) * 3 * (size_t)r->ntensors);
    for (int i = 0; i < r->ntensors; i++) {
        int64_t from = max64(lo, r->starts[i]), to = min64(hi, r->starts[i + 1]);
        if (from >= to) continue;
        const char *x = mine + (from - lo) * r->esize, *y = other + (from - lo) * r->esize;
        hvl__adasum_dots(lower ? x : y, lower ? y : x, to - from, r->dtype, r->dots + 3 * i);
    }
    HVL_CHECK(block_sum(r, level));
    for (int i = 0; i < r->ntensors; i++) {
        int64_t from = max64(lo, r->starts[i]), to = min64(hi, r->starts[i + 1]);
        if (from >= to) continue;
        double ca, cb;
        hvl__adasum_coefficients(r->dots + 3 * i, &ca, &cb);
        char *x = mine + (from - lo) * r->esize;
        const char *y = other + (from - lo) * r->esize;
        hvl__adasum_combine(x, lower ? x : y, lower ? y : x, to - from, r->dtype, ca, cb);
    }
    return HVL_OK;
}

/* The halving, then the doubling, over buf's `total` elements. */
static int vhdd(adasum_run *r, char *buf, int64_t total)
{
    int rank = r->ps->rank, size = r->ps->size, es = r->esize, depth = 0;
    int64_t lo = 0, hi = total, parent_lo[32], parent_hi[32];
    HVL_CHECK(hvl__grow(&r->e->scratch_buf, &r->e->scratch_cap, ((total + 1) / 2) * es));
    char *recv = r->e->scratch_buf;
    for (int level = 1; level < size; level <<= 1, depth++) {
        int64_t mid = lo + (hi - lo) / 2;
        int lower = (rank & level) == 0;
        int64_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
        int64_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
        parent_lo[depth] = lo, parent_hi[depth] = hi;
        HVL_CHECK(exchange(r, rank ^ level, buf + give_lo * es, (give_hi - give_lo) * es, recv,
                           (keep_hi - keep_lo) * es));
        HVL_CHECK(combine_level(r, buf + keep_lo * es, recv, keep_lo, keep_hi, level));
        lo = keep_lo, hi = keep_hi;
    }
    for (int level = size >> 1; level >= 1; level >>= 1) {
        depth--;
        int64_t plo = parent_lo[depth], phi = parent_hi[depth], mid = plo + (phi - plo) / 2;
        int lower = (rank & level) == 0;
        int64_t other_lo = lower ? mid : plo, other_hi = lower ? phi : mid;
        HVL_CHECK(exchange(r, rank ^ level, buf + lo * es, (hi - lo) * es, buf + other_lo * es,
                           (other_hi - other_lo) * es));
        lo = plo, hi = phi;
    }
    return HVL_OK;
}

int hvl__adasum_mpi(hvl_engine *e, hvl_pset *ps, void *state, void *buf, int dtype,
                    const int64_t *counts, int ntensors)
{
    (void)state;
    if (ps->size & (ps->size - 1))
        return hvl__fail(HVL_ERR_UNSUPPORTED, "Adasum needs a power-of-2 number of ranks; "
                         "process set %d has %d", ps->id, ps->size);
    if (!hvl__adasum_dtype_ok(dtype))
        return hvl__fail(HVL_ERR_UNSUPPORTED, "Adasum reduces float16, float32 and float64, not %s",
                         hvl__dtype_name(dtype));
    if (ps->size == 1) return HVL_OK;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(ntensors + 1));
    double *dots = malloc(sizeof(double) * 6 * (size_t)ntensors);
    int rc = HVL_OK;
    if (!starts || !dots) {
        rc = hvl__oom("Adasum dot products");
        goto out;
    }
    starts[0] = 0;
    for (int i = 0; i < ntensors; i++) starts[i + 1] = starts[i] + counts[i];
    adasum_run r = {e, ps, dtype, hvl_dtype_size(dtype), ntensors, starts, dots,
                    dots + 3 * ntensors};
    rc = vhdd(&r, buf, starts[ntensors]);
out:
    free(starts);
    free(dots);
    return rc;
}
