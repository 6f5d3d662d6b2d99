/* response.c: agreed responses: the list type, building one from a request, the rule for when
 * a request may reuse a cached response, and the size arithmetic shared by the engine.
 * Any thread (pure functions over caller-owned data). */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static const int dtype_sizes[HVL_DTYPE_COUNT] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};

int hvl_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < HVL_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

int64_t hvl__shape_elems(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int64_t hvl__request_bytes(const hvl_request *q)
{
    return hvl__shape_elems(q->ndim, q->shape) * hvl_dtype_size(q->dtype);
}

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
        if (!items) return HVL_ERR_NO_MEMORY;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = *r;
    return HVL_OK;
}

void hvl__responses_clear(hvl_response_list *l)
{
    for (int i = 0; i < l->count; i++) {
        free(l->items[i].name);
        free(l->items[i].error);
    }
    l->count = 0;
}

void hvl__response_from_request(hvl_response *r, const hvl_request *q)
{
    memset(r, 0, sizeof(*r));
    r->op = q->op;
    r->dtype = q->dtype;
    r->reduce_op = q->reduce_op;
    r->root_rank = q->root_rank;
    r->process_set = q->process_set;
    r->ndim = q->ndim;
    memcpy(r->shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    r->prescale = q->prescale;
    r->postscale = q->postscale;
    r->name = strdup(q->name);
}

/* A request reuses a cached response when every field the ranks must agree on is unchanged.
 * Allgather and alltoall let dim 0 differ per rank (sizes are exchanged when they run). */
int hvl__request_matches(const hvl_response *r, const hvl_request *q)
{
    if (r->op != q->op || r->dtype != q->dtype || r->ndim != q->ndim ||
        r->reduce_op != q->reduce_op || r->root_rank != q->root_rank || r->process_set != q->process_set ||
        r->prescale != q->prescale || r->postscale != q->postscale || strcmp(r->name, q->name) != 0)
        return 0;
    int first = (q->op == HVL_ALLGATHER || q->op == HVL_ALLTOALL) ? 1 : 0;
    for (int i = first; i < q->ndim; i++)
        if (r->shape[i] != q->shape[i]) return 0;
    return 1;
}
