/* backend_shm.c: the collectives of a process set whose members all run on this host, over the
 * set's shared-memory segment (layout and step protocol in shm.h). A collective is a sequence
 * of steps, each moving at most `chunk` bytes per member (HVLITE_SHM_CHUNK): a rank copies its
 * data into its own buffer, syncs, then reads the other members' buffers.
 *   allreduce: takes a whole fused batch as a stream, so a chunk goes from the tensors straight
 *     into the segment (no fusion-buffer copy): fill my buffer; sync; reduce my slice of the
 *     chunk out of every member's buffer into mine; sync; drain every member's slice to the
 *     outputs. The chunk stays in cache from fill to drain. Chunks of at most ONE_PHASE_BYTES
 *     skip the second sync: every rank reduces the whole chunk, in rank order everywhere.
 *   reducescatter: every member's output region advances chunk/n per step; each rank reduces
 *     its own piece straight into its output.
 *   allgather, broadcast, alltoall: publish my piece(s), sync, copy the others' out.
 * This plane serves the sets whose members all share this host, of two or more ranks (its
 * open hook decides, the same way on every member), and takes every collective of such a set
 * but one crossover, decided by measurement against hvlite's own MPI data plane (tables in
 * bench/README.md): at 2 ranks a broadcast of 1 MiB or more goes to MPI (its large-message
 * protocol moves the data once; here the root copies in and the peer copies out).
 * bg thread only. */
#include <stdlib.h>
#include <string.h>
#include "shm.h"

#define LINE 64                        /* slices start on cache lines: no false sharing */
#define ONE_PHASE_BYTES (16 * 1024)

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Bytes (or elements) of a `total` that fall in [off, off + max). */
static int64_t piece(int64_t total, int64_t off, int64_t max)
{
    int64_t n = total - off;
    return n <= 0 ? 0 : n < max ? n : max;
}

void hvl__shm_slice(int64_t m, int n, int esize, int r, int64_t *start, int64_t *len)
{
    int64_t per_line = LINE / esize;
    int64_t q = ((m + n - 1) / n + per_line - 1) / per_line * per_line;
    *start = min64((int64_t)r * q, m);
    *len = min64(*start + q, m) - *start;
}

void hvl__shm_reduce_slice(hvl_shm *s, int64_t m, int dtype, int reduce_op)
{
    int esize = hvl_dtype_size(dtype);
    int64_t start, len;
    hvl__shm_slice(m, s->local_size, esize, s->local_rank, &start, &len);
    char *mine = hvl__shm_buf(s, s->local_rank) + start * esize;
    for (int r = 0; r < s->local_size && len; r++)
        if (r != s->local_rank) hvl__reduce_pair(mine, mine, hvl__shm_buf(s, r) + start * esize, len, dtype, reduce_op);
}

static int allreduce_stream(hvl_engine *e, hvl_pset *ps, void *state, hvl_stream *st)
{
    hvl_shm *s = state;
    (void)ps;
    int esize = hvl_dtype_size(st->dtype), n = s->local_size;
    int64_t per_step = s->chunk / esize;
    for (int64_t off = 0; off < st->count; off += per_step, s->steps++) {
        int64_t m = min64(per_step, st->count - off);
        if (off == per_step)   /* tests: frozen between two steps of one collective */
            hvl__test_stop_point(e->params.test_stop_at, e->rank, "shm_allreduce");
        st->fill(st, off, m, hvl__shm_buf(s, s->local_rank));
        HVL_CHECK(hvl__shm_sync(e, s, "shm allreduce"));
        if (m * esize <= ONE_PHASE_BYTES) {
            hvl__reduce_pair(s->scratch, hvl__shm_buf(s, 0), hvl__shm_buf(s, 1), m, st->dtype, st->reduce_op);
            for (int r = 2; r < n; r++)
                hvl__reduce_pair(s->scratch, s->scratch, hvl__shm_buf(s, r), m, st->dtype, st->reduce_op);
            st->drain(st, off, m, s->scratch);
            continue;
        }
        hvl__shm_reduce_slice(s, m, st->dtype, st->reduce_op);
        HVL_CHECK(hvl__shm_sync(e, s, "shm allreduce (reduced)"));
        for (int r = 0; r < n; r++) {
            int64_t start, len;
            hvl__shm_slice(m, n, esize, r, &start, &len);
            if (len) st->drain(st, off + start, len, hvl__shm_buf(s, r) + start * esize);
        }
    }
    return HVL_OK;
}

/* .allreduce on plain buffers: a stream that copies from src and to dst. */
typedef struct { hvl_stream s; const char *src; char *dst; } plain_stream;

static void plain_fill(hvl_stream *st, int64_t off, int64_t n, void *to)
{
    plain_stream *p = (plain_stream *)st;
    size_t esize = (size_t)hvl_dtype_size(st->dtype);
    memcpy(to, p->src + (size_t)off * esize, (size_t)n * esize);
}

static void plain_drain(hvl_stream *st, int64_t off, int64_t n, const void *from)
{
    plain_stream *p = (plain_stream *)st;
    size_t esize = (size_t)hvl_dtype_size(st->dtype);
    memcpy(p->dst + (size_t)off * esize, from, (size_t)n * esize);
}

int hvl__shm_allreduce_plain(hvl_engine *e, hvl_pset *ps, void *state, hvl_stream_run run,
                             const void *src, void *dst, int64_t count, int dtype, int reduce_op)
{
    plain_stream p = {{count, dtype, reduce_op, plain_fill, plain_drain}, src, dst};
    return run(e, ps, state, &p.s);
}

static int allreduce(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, int64_t count, int dtype, int reduce_op)
{
    return hvl__shm_allreduce_plain(e, ps, state, allreduce_stream, src, dst, count, dtype, reduce_op);
}

static int reducescatter(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, const int64_t *counts,
                         int dtype, int reduce_op)
{
    hvl_shm *s = state;
    (void)ps;
    int n = s->local_size, me = s->local_rank, esize = hvl_dtype_size(dtype);
    int64_t per = s->chunk / n / LINE * LINE / esize, most = 0;   /* elements per region and step */
    int64_t *start = malloc(sizeof(int64_t) * (size_t)n);
    if (!start) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory in shm reducescatter");
    for (int r = 0; r < n; r++) {
        start[r] = r ? start[r - 1] + counts[r - 1] : 0;
        most = counts[r] > most ? counts[r] : most;
    }
    int rc = HVL_OK;
    for (int64_t off = 0; off < most && rc == HVL_OK; off += per, s->steps++) {
        char *mine = hvl__shm_buf(s, me);
        for (int r = 0; r < n; r++) {
            int64_t len = piece(counts[r], off, per);
            if (len) memcpy(mine + (size_t)(r * per * esize), (const char *)src + (start[r] + off) * esize, (size_t)(len * esize));
        }
        rc = hvl__shm_sync(e, s, "shm reducescatter");
        int64_t len = piece(counts[me], off, per), at = me * per * esize;
        char *out = (char *)dst + off * esize;
        if (rc == HVL_OK && len) {
            hvl__reduce_pair(out, hvl__shm_buf(s, 0) + at, hvl__shm_buf(s, 1) + at, len, dtype, reduce_op);
            for (int r = 2; r < n; r++) hvl__reduce_pair(out, out, hvl__shm_buf(s, r) + at, len, dtype, reduce_op);
        }
    }
    free(start);
    return rc;
}

static int allgatherv(hvl_engine *e, hvl_pset *ps, void *state, const void *src, void *dst, const int64_t *rank_bytes)
{
    hvl_shm *s = state;
    (void)ps;
    int n = s->local_size, me = s->local_rank;
    int64_t *displ = malloc(sizeof(int64_t) * (size_t)n), most = 0, my_displ = 0;
    if (!displ) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory in shm allgather");
    for (int r = 0; r < n; r++) {
        displ[r] = r ? displ[r - 1] + rank_bytes[r - 1] : 0;
        most = rank_bytes[r] > most ? rank_bytes[r] : most;
        if (r == me) my_displ = displ[r];
    }
    if (rank_bytes[me]) memcpy((char *)dst + my_displ, src, (size_t)rank_bytes[me]);
    int rc = HVL_OK;
    for (int64_t off = 0; off < most && rc == HVL_OK; off += s->chunk, s->steps++) {
        int64_t len = piece(rank_bytes[me], off, s->chunk);
        if (len) memcpy(hvl__shm_buf(s, me), (const char *)src + off, (size_t)len);
        rc = hvl__shm_sync(e, s, "shm allgather");
        for (int r = 0; r < n && rc == HVL_OK; r++)
            if (r != me && (len = piece(rank_bytes[r], off, s->chunk)))
                memcpy((char *)dst + displ[r] + off, hvl__shm_buf(s, r), (size_t)len);
    }
    free(displ);
    return rc;
}

static int broadcast(hvl_engine *e, hvl_pset *ps, void *state, void *buf, int64_t bytes, int root)
{
    hvl_shm *s = state;
    (void)ps;
    for (int64_t off = 0; off < bytes; off += s->chunk, s->steps++) {
        int64_t len = min64(s->chunk, bytes - off);
        if (s->local_rank == root) memcpy(hvl__shm_buf(s, root), (char *)buf + off, (size_t)len);
        HVL_CHECK(hvl__shm_sync(e, s, "shm broadcast"));
        if (s->local_rank != root) memcpy((char *)buf + off, hvl__shm_buf(s, root), (size_t)len);
    }
    return HVL_OK;
}

/* Every pair's block moves chunk/n bytes per step; the number of steps comes from the largest
 * block anywhere, which only its two ranks know: each announces its largest first. */
static int alltoallv(hvl_engine *e, hvl_pset *ps, void *state, const void *src, const int64_t *send_bytes, void *dst,
                     const int64_t *recv_bytes)
{
    hvl_shm *s = state;
    (void)ps;
    int n = s->local_size, me = s->local_rank;
    int64_t per = s->chunk / n / LINE * LINE, most = 0;
    int64_t *sd = malloc(sizeof(int64_t) * 2 * (size_t)n), *rd = sd + n;
    if (!sd) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory in shm alltoall");
    for (int r = 0; r < n; r++) {
        sd[r] = r ? sd[r - 1] + send_bytes[r - 1] : 0;
        rd[r] = r ? rd[r - 1] + recv_bytes[r - 1] : 0;
        if (r != me) most = send_bytes[r] > most ? send_bytes[r] : most;
        if (r != me) most = recv_bytes[r] > most ? recv_bytes[r] : most;
    }
    if (send_bytes[me]) memcpy((char *)dst + rd[me], (const char *)src + sd[me], (size_t)send_bytes[me]);
    hvl__shm_announce(s, most);
    int rc = hvl__shm_sync(e, s, "shm alltoall (sizes)");
    for (int r = 0; r < n && rc == HVL_OK; r++) most = hvl__shm_announced(s, r) > most ? hvl__shm_announced(s, r) : most;
    for (int64_t off = 0; off < most && rc == HVL_OK; off += per, s->steps++) {
        char *mine = hvl__shm_buf(s, me);
        for (int r = 0; r < n; r++) {
            int64_t len = r == me ? 0 : piece(send_bytes[r], off, per);
            if (len) memcpy(mine + r * per, (const char *)src + sd[r] + off, (size_t)len);
        }
        rc = hvl__shm_sync(e, s, "shm alltoall");
        for (int r = 0; r < n && rc == HVL_OK; r++) {
            int64_t len = r == me ? 0 : piece(recv_bytes[r], off, per);
            if (len) memcpy((char *)dst + rd[r] + off, hvl__shm_buf(s, r) + me * per, (size_t)len);
        }
    }
    free(sd);
    return rc;
}

#define BROADCAST_TWO_RANKS_MAX ((int64_t)1 << 20)   /* see the note at the top */

/* bytes is the agreed response's size, the same on every rank, so every rank picks alike. */
static int can_run(const hvl_engine *e, const hvl_pset *ps, const void *state, const hvl_batch_kind *k)
{
    const hvl_shm *s = state;
    (void)e; (void)ps;
    if (k->memory != HVL_MEMORY_HOST) return 0;
    if (k->op == HVL_BROADCAST && s->local_size == 2 && k->bytes >= BROADCAST_TWO_RANKS_MAX) return 0;
    return hvl__op_is(k->op, HVL_OPF_DATA);
}

/* Only sets whose members all share this host (the same answer on every member), of two or
 * more ranks, and not switched off (HVLITE_SHM_DISABLE, agreed from rank 0). */
static int open_set(hvl_engine *e, hvl_pset *ps, void **state)
{
    *state = NULL;
    if (e->params.shm_disable || ps->size < 2 || !ps->one_host) return HVL_OK;
    return hvl__shm_open(e, ps, (hvl_shm **)state);
}

static void close_set(void *state, int clean) { hvl__shm_close(state, clean); }

const hvl_backend hvl__backend_shm = {
    .name = "shm",
    .open = open_set,
    .close = close_set,
    .can_run = can_run,
    .allreduce = allreduce,
    .allgatherv = allgatherv,
    .broadcast = broadcast,
    .alltoallv = alltoallv,
    .reducescatter = reducescatter,
    .allreduce_stream = allreduce_stream,
};
