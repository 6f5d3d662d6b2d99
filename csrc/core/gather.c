/* gather.c: the collectives whose output size is known only when they run: allgather (dim 0
 * may differ per rank) and alltoall (splits). Sizes are exchanged first, then the data goes
 * into result buffers (hvl_buffer_alloc) that the handle owns. Allgathers of one cycle are fused:
 * every rank packs its tensors into one block, one allgatherv moves all blocks, and each
 * tensor's result is cut out of the blocks by a displacement table. Size limits and
 * allocations are agreed by every rank before the data moves (hvl__agree), so a tensor too big
 * for one rank fails on all of them instead of leaving the others in the collective.
 * On a device plane (CUDA tensors, NCCL) the sizes go the same way, but each result is allocated
 * on the rank's GPU, on the engine's stream, and the plane moves the data into it with no
 * packing (hvl_device_batch: counts per member); the handle then owns device memory.
 * bg thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "cuda_driver.h"
#include "cycle.h"

static int64_t rows_of(const hvl_entry *en)
{
    return en->d.ndim ? en->d.shape[0] : 1;     /* a 0-d input is one row */
}

/* Shape of an allgather result with `rows` rows (a 0-d input counts as one row). */
static void gathered_shape(const hvl_entry *en, int64_t rows, hvl_outcome *o)
{
    o->ndim = en->d.ndim ? en->d.ndim : 1;
    o->shape[0] = rows;
    for (int i = 1; i < en->d.ndim; i++) o->shape[i] = en->d.shape[i];
}

static int gather_one(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_outcome *o)
{
    hvl_pset *ps = b->ps;
    hvl_entry *en = b->entries[0];
    int64_t rb = hvl__row_bytes(en), total = 0, rows = 0, mine = rows_of(en);
    int64_t *bytes = malloc(sizeof(int64_t) * (size_t)ps->size);
    if (!bytes) return hvl__oom("allgather sizes");
    int rc;
    HVL_CHECK_GOTO(hvl__allgather_i64(ps->comm, &mine, 1, bytes, hvl__peer_bound(e), "exchanging sizes"), rc, out);
    for (int r = 0; r < ps->size; r++) {
        rows += bytes[r];
        bytes[r] *= rb;
        total += bytes[r];
    }
    int local = hvl__counts_fit_int(bytes, ps->size, en->d.name);
    if (local == HVL_OK && !(o->result = hvl_buffer_alloc(total)))
        local = hvl__fail(HVL_ERR_NO_MEMORY, "allgather '%s': out of memory", en->d.name);
    HVL_CHECK_GOTO(hvl__agree(ps->comm, local, "allgather", &b->failed_everywhere, hvl__peer_bound(e)), rc, out);
    rc = p->be->allgatherv(e, ps, p->state, en->input, o->result, bytes);
    o->result_bytes = total;
    gathered_shape(en, rows, o);
out:
    free(bytes);
    return rc;
}

/* Cuts tensor t's rows out of every rank's block of the gathered buffer. */
static int unpack(hvl_batch *b, const int64_t *rows, const int64_t *rb,
                  const int64_t *block, const char *gathered, hvl_outcome *o)
{
    hvl_pset *ps = b->ps;
    int k = b->count;
    for (int t = 0; t < k; t++) {
        int64_t total_rows = 0;
        for (int r = 0; r < ps->size; r++) total_rows += rows[r * k + t];
        o[t].result_bytes = total_rows * rb[t];
        if (!(o[t].result = hvl_buffer_alloc(o[t].result_bytes))) return hvl__oom("an allgather result");
        gathered_shape(b->entries[t], total_rows, &o[t]);
    }
    int64_t block_start = 0;
    for (int r = 0; r < ps->size; r++) {
        const char *src = gathered + block_start;
        for (int t = 0; t < k; t++) {
            int64_t n = rows[r * k + t] * rb[t], before = 0;
            for (int p = 0; p < r; p++) before += rows[p * k + t] * rb[t];
            memcpy((char *)o[t].result + before, src, (size_t)n);
            src += n;
        }
        block_start += block[r];
    }
    return HVL_OK;
}

int hvl__run_allgather(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_outcome *o)
{
    if (b->count == 1) return gather_one(e, p, b, o);
    hvl_pset *ps = b->ps;
    int k = b->count, n = ps->size, rc;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(2 * k + n * k + n)), mine_bytes = 0, total = 0;
    if (!v) return hvl__oom("fused allgather sizes");
    int64_t *mine = v, *rb = v + k, *rows = v + 2 * k, *block = v + 2 * k + n * k;
    for (int t = 0; t < k; t++) {
        mine[t] = rows_of(b->entries[t]);
        rb[t] = hvl__row_bytes(b->entries[t]);
    }
    HVL_CHECK_GOTO(hvl__allgather_i64(ps->comm, mine, k, rows, hvl__peer_bound(e), "exchanging sizes"), rc, out);
    for (int r = 0; r < n; r++) {
        block[r] = 0;
        for (int t = 0; t < k; t++) block[r] += rows[r * k + t] * rb[t];
        total += block[r];
    }
    mine_bytes = block[ps->rank];
    int local = hvl__counts_fit_int(block, n, "fused allgather");
    if (local == HVL_OK) local = hvl__grow(&e->fusion_buf, &e->fusion_cap, mine_bytes + 1);
    if (local == HVL_OK) local = hvl__grow(&e->scratch_buf, &e->scratch_cap, total + 1);
    HVL_CHECK_GOTO(hvl__agree(ps->comm, local, "fused allgather", &b->failed_everywhere, hvl__peer_bound(e)), rc, out);
    char *pack = e->fusion_buf;
    for (int t = 0; t < k; pack += mine[t] * rb[t], t++)
        memcpy(pack, b->entries[t]->input, (size_t)(mine[t] * rb[t]));
    HVL_CHECK_GOTO(p->be->allgatherv(e, ps, p->state, e->fusion_buf, e->scratch_buf, block), rc, out);
    rc = unpack(b, rows, rb, block, e->scratch_buf, o);
out:
    free(v);
    return rc;
}

/* Alltoall (one tensor): exchange the splits, then send each rank its rows. */
int hvl__run_alltoall(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_outcome *o)
{
    hvl_pset *ps = b->ps;
    hvl_entry *en = b->entries[0];
    int64_t rb = hvl__row_bytes(en), total = 0;
    int64_t *v = malloc(sizeof(int64_t) * 2 * (size_t)ps->size);
    o->recv_splits = malloc(sizeof(int64_t) * (size_t)ps->size);
    o->nsplits = ps->size;
    if (!v || !o->recv_splits) { free(v); return hvl__oom("alltoall splits"); }
    int64_t *send_bytes = v, *recv_bytes = v + ps->size;
    int rc;
    HVL_CHECK_GOTO(hvl__alltoall_i64(ps->comm, en->splits, o->recv_splits, hvl__peer_bound(e)), rc, out);
    for (int r = 0; r < ps->size; r++) {
        send_bytes[r] = en->splits[r] * rb;
        recv_bytes[r] = o->recv_splits[r] * rb;
        o->shape[0] += o->recv_splits[r];
        total += recv_bytes[r];
    }
    int local = hvl__counts_fit_int(send_bytes, ps->size, en->d.name);
    if (local == HVL_OK) local = hvl__counts_fit_int(recv_bytes, ps->size, en->d.name);
    if (local == HVL_OK && !(o->result = hvl_buffer_alloc(total)))
        local = hvl__fail(HVL_ERR_NO_MEMORY, "alltoall '%s': out of memory", en->d.name);
    /* only this rank knows its sizes: every member agrees before the data moves */
    HVL_CHECK_GOTO(hvl__agree(ps->comm, local, "alltoall", &b->failed_everywhere, hvl__peer_bound(e)), rc, out);
    rc = p->be->alltoallv(e, ps, p->state, en->input, send_bytes, o->result, recv_bytes);
    o->result_bytes = total;
    o->ndim = en->d.ndim;
    for (int i = 1; i < en->d.ndim; i++) o->shape[i] = en->d.shape[i];
out:
    free(v);
    return rc;
}

/* ---- on a device plane ---- */

/* Frees a batch's device results (stream-ordered on the engine's stream, after whatever the
 * plane queued there) and forgets them: a failed batch hands none out. */
static void drop_device_results(int dev, hvl_outcome *o, int n)
{
    void *stream = NULL;
    if (hvl__cuda_stream(dev, &stream) != HVL_OK) return;   /* cannot be: the batch used it */
    for (int t = 0; t < n; t++) {
        if (o[t].result_memory == HVL_MEMORY_CUDA) hvl__cuda_result_free(dev, o[t].result, stream);
        o[t].result = NULL;
        o[t].result_memory = HVL_MEMORY_HOST;
    }
}

/* Allocates o's result on device dev; a failure is this rank's, to agree on (HVL_ERR_NO_MEMORY:
 * the GPU had no room). */
static int device_result(int dev, hvl_outcome *o, const char *what, const char *name)
{
    int rc = hvl__cuda_result_alloc(dev, &o->result, o->result_bytes);
    if (rc != HVL_OK) return hvl__fail(rc, "%s '%s': %s", what, name, hvl_last_error());
    o->result_memory = HVL_MEMORY_CUDA;
    o->result_device = dev;
    return HVL_OK;
}

/* The members' agreement before a device batch moves data: the worst verdict wins everywhere.
 * Any error but a lack of GPU room fails the batch on every member (failed_everywhere); a lack
 * of room alone (PyTorch's caching allocator keeps what it reserved from the pool the results
 * come from) sets *restage: every member runs the batch again on the staged path instead. */
enum { VERDICT_OK, VERDICT_NO_ROOM, VERDICT_FAILED };
static int agree_device(hvl_engine *e, hvl_batch *b, int local, const char *what, int *restage)
{
    int mine = local == HVL_OK ? VERDICT_OK : local == HVL_ERR_NO_MEMORY ? VERDICT_NO_ROOM : VERDICT_FAILED;
    int worst = mine;
    char why[1024];
    snprintf(why, sizeof(why), "%s", local == HVL_OK ? "" : hvl_last_error());
    *restage = 0;
    HVL_CHECK(hvl__allreduce_ints(b->ps->comm, &worst, 1, MPI_MAX, hvl__peer_bound(e), what));
    if (worst == VERDICT_FAILED) {
        b->failed_everywhere = 1;
        return mine == VERDICT_FAILED ? hvl__fail(HVL_ERR_INVALID_ARG, "%s", why)
             : hvl__fail(HVL_ERR_INVALID_ARG, "%s failed on another rank (its error says why)", what);
    }
    if (worst == VERDICT_NO_ROOM) {
        *restage = 1;
        if (mine == VERDICT_NO_ROOM)
            hvl__log_once("device results restaged", HVL_LOG_WARNING, "%s; it runs through host memory "
                          "instead (the staged path). With PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:"
                          "cudaMallocAsync lets hvlite's results share its memory pool", why);
    }
    return HVL_OK;
}

/* The batch whole on the device plane, then its results kept or dropped. */
static int run_on_device(hvl_engine *e, const hvl_plane *p, hvl_batch *b, hvl_device_batch *db, hvl_outcome *o)
{
    int rc = p->be->run_device(e, b->ps, p->state, db);
    if (rc != HVL_OK) drop_device_results(b->entries[0]->device, o, b->count);
    return rc;
}

int hvl__run_allgather_device(hvl_engine *e, const hvl_plane *p, const hvl_batch_kind *kind, hvl_batch *b,
                              hvl_outcome *o, int *restage)
{
    hvl_pset *ps = b->ps;
    int k = b->count, n = ps->size, dev = b->entries[0]->device, rc;
    *restage = 0;
    int64_t *v = calloc((size_t)(k + 2 * n * k), sizeof(int64_t));
    hvl_device_tensor *t = calloc((size_t)k, sizeof(*t));
    if (!v || !t) {
        free(v);
        free(t);
        return hvl__oom("a device allgather");
    }
    int64_t *mine = v, *rows = v + k, *counts = v + k + n * k;
    for (int i = 0; i < k; i++) mine[i] = rows_of(b->entries[i]);
    HVL_CHECK_GOTO(hvl__allgather_i64(ps->comm, mine, k, rows, hvl__peer_bound(e), "exchanging sizes"), rc, out);
    int local = HVL_OK;
    for (int i = 0; i < k; i++) {
        hvl_entry *en = b->entries[i];
        int64_t row_elems = hvl__row_bytes(en) / hvl_dtype_size(b->dtype), total_rows = 0;
        for (int r = 0; r < n; r++) {
            counts[r * k + i] = rows[r * k + i] * row_elems;
            total_rows += rows[r * k + i];
        }
        o[i].result_bytes = total_rows * hvl__row_bytes(en);
        gathered_shape(en, total_rows, &o[i]);
        if (local == HVL_OK && en->device != dev)    /* fused by memory kind, not by device */
            local = hvl__fail(HVL_ERR_INVALID_ARG, "allgather '%s' is on cuda:%d, but '%s' of the same "
                              "fused batch on cuda:%d: one GPU per rank", en->d.name, en->device,
                              b->entries[0]->d.name, dev);
        if (local == HVL_OK) local = device_result(dev, &o[i], "allgather", en->d.name);
        t[i] = (hvl_device_tensor){en->input, o[i].result, mine[i] * row_elems, en->device, en->ready_event};
    }
    rc = agree_device(e, b, local, "allgather", restage);
    if (rc != HVL_OK || *restage) {
        drop_device_results(dev, o, k);
        if (*restage) memset(o, 0, sizeof(*o) * (size_t)k);
        goto out;
    }
    hvl_device_batch db = {*kind, 0, k, t, counts, b->entries[0]->d.name, b->timed ? b->phases : NULL, NULL};
    rc = run_on_device(e, p, b, &db, o);
out:
    free(v);
    free(t);
    return rc;
}

int hvl__run_alltoall_device(hvl_engine *e, const hvl_plane *p, const hvl_batch_kind *kind, hvl_batch *b,
                             hvl_outcome *o, int *restage)
{
    hvl_pset *ps = b->ps;
    hvl_entry *en = b->entries[0];
    int n = ps->size, rc;
    *restage = 0;
    int64_t row_elems = hvl__row_bytes(en) / hvl_dtype_size(b->dtype), *counts = malloc(sizeof(int64_t) * 2 * (size_t)n);
    o->recv_splits = malloc(sizeof(int64_t) * (size_t)n);
    o->nsplits = n;
    if (!counts || !o->recv_splits) {
        free(counts);
        return hvl__oom("alltoall splits");
    }
    HVL_CHECK_GOTO(hvl__alltoall_i64(ps->comm, en->splits, o->recv_splits, hvl__peer_bound(e)), rc, out);
    for (int r = 0; r < n; r++) {
        counts[r] = en->splits[r] * row_elems;              /* sent to member r */
        counts[n + r] = o->recv_splits[r] * row_elems;      /* received from it */
        o->shape[0] += o->recv_splits[r];
    }
    o->result_bytes = o->shape[0] * hvl__row_bytes(en);
    o->ndim = en->d.ndim;
    for (int i = 1; i < en->d.ndim; i++) o->shape[i] = en->d.shape[i];
    int local = device_result(en->device, o, "alltoall", en->d.name);
    /* only this rank knows its sizes: every member agrees before the data moves */
    rc = agree_device(e, b, local, "alltoall", restage);
    if (rc != HVL_OK || *restage) {
        drop_device_results(en->device, o, 1);
        if (*restage) {
            free(o->recv_splits);
            memset(o, 0, sizeof(*o));
        }
        goto out;
    }
    hvl_device_tensor t = {en->input, o->result, hvl__shape_elems(en->d.ndim, en->d.shape), en->device,
                           en->ready_event};
    hvl_device_batch db = {*kind, 0, 1, &t, counts, en->d.name, b->timed ? b->phases : NULL, NULL};
    rc = run_on_device(e, p, b, &db, o);
out:
    free(counts);
    return rc;
}
