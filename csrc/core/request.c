/* request.c: the per-op property table, and pure functions over tensor descriptions and
 * responses: the response list, the rule for when two descriptions agree (the cache's and the
 * coordinator's), and the size arithmetic shared by the engine (element sizes come from the dtype
 * table, kernels/dtype.c). Any thread (pure functions over caller-owned data). */
#include <stdlib.h>
#include <string.h>
#include "request.h"

static const struct { const char *name; unsigned flags; } op_table[HVL_OP_COUNT] = {
    [HVL_ALLREDUCE] = {"allreduce", HVL_OPF_DATA | HVL_OPF_REDUCES | HVL_OPF_FUSES | HVL_OPF_JOINED_OK},
    [HVL_ALLGATHER] = {"allgather", HVL_OPF_DATA | HVL_OPF_FREE_DIM0 | HVL_OPF_FUSES},
    [HVL_BROADCAST] = {"broadcast", HVL_OPF_DATA | HVL_OPF_ROOTED},
    [HVL_ALLTOALL] = {"alltoall", HVL_OPF_DATA | HVL_OPF_FREE_DIM0},
    [HVL_REDUCESCATTER] = {"reducescatter", HVL_OPF_DATA | HVL_OPF_REDUCES},
    [HVL_BARRIER] = {"barrier", HVL_OPF_JOINED_OK},
    [HVL_JOIN] = {"join", HVL_OPF_WHOLE_JOB},
    [HVL_PROCESS_SET_ADD] = {"add_process_set", HVL_OPF_WHOLE_JOB},
    [HVL_PROCESS_SET_REMOVE] = {"remove_process_set", HVL_OPF_WHOLE_JOB},
};

const char *hvl__op_name(int op) { return op >= 0 && op < HVL_OP_COUNT ? op_table[op].name : "unknown op"; }

int hvl__op_is(int op, unsigned flags)
{
    return op >= 0 && op < HVL_OP_COUNT && (op_table[op].flags & flags) == flags;
}

int64_t hvl__shape_elems(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int64_t hvl__desc_bytes(const hvl_desc *d) { return hvl__shape_elems(d->ndim, d->shape) * hvl_dtype_size(d->dtype); }

int64_t hvl_reducescatter_rows(int64_t dim0, int rank, int size)
{
    if (size <= 0) return 0;
    return dim0 / size + (rank < dim0 % size ? 1 : 0);
}

int hvl__responses_push(hvl_response_list *l, const hvl_response *r)
{
    if (l->count == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        hvl_response *items = realloc(l->items, (size_t)cap * sizeof(*items));
        if (!items) return hvl__oom("the response list");
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = *r;
    return HVL_OK;
}

void hvl__responses_clear(hvl_response_list *l)
{
    for (int i = 0; i < l->count; i++) {
        free(l->items[i].d.name);
        free(l->items[i].error);
    }
    l->count = 0;
}

int hvl__desc_matches(const hvl_desc *a, const hvl_desc *b)
{
    if (a->op != b->op || a->dtype != b->dtype || a->ndim != b->ndim || a->reduce_op != b->reduce_op ||
        a->root_rank != b->root_rank || a->process_set != b->process_set || a->target_set != b->target_set ||
        a->prescale != b->prescale || a->postscale != b->postscale || a->memory != b->memory ||
        a->set_device != b->set_device)
        return 0;
    for (int i = hvl__op_is(a->op, HVL_OPF_FREE_DIM0) ? 1 : 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

int64_t hvl__row_bytes(const hvl_entry *en)
{
    int ndim = en->d.ndim;
    return (ndim ? hvl__shape_elems(ndim - 1, en->d.shape + 1) : 1) * hvl_dtype_size(en->d.dtype);
}
