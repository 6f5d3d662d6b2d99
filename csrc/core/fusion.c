/* fusion.c: groups the cycle's agreed responses into batches that share one collective.
 * Allreduces with the same dtype, reduce op, scale factors, memory kind and process set are packed, in agreement order,
 * until the next would pass the fusion threshold (a tensor larger than it runs alone).
 * Allgathers of one dtype fuse the same way (sized by the agreed response, i.e. the first
 * rank's shape, so every rank decides alike). Other ops run one per batch. Every rank sees
 * the same responses in the same order and the same
 * threshold (rank 0's, broadcast at start; autotune changes it on every rank in the same
 * negotiation round), so every rank builds the same batches.
 * bg thread only. */
#include <stdlib.h>
#include "cycle.h"

static int same_key(const hvl_desc *a, const hvl_desc *b)
{
    return a->op == b->op && a->dtype == b->dtype && a->reduce_op == b->reduce_op &&
           a->prescale == b->prescale && a->postscale == b->postscale && a->process_set == b->process_set &&
           a->memory == b->memory;
}

int hvl__fuse(hvl_engine *e, const hvl_response **resps, hvl_entry **entries, int n, hvl_batch_list *out)
{
    out->count = 0;
    out->items = calloc((size_t)(n ? n : 1), sizeof(hvl_batch));
    out->entry_store = calloc((size_t)(n ? n : 1), sizeof(hvl_entry *));
    char *taken = calloc((size_t)(n ? n : 1), 1);
    if (!out->items || !out->entry_store || !taken) { free(taken); hvl__batches_free(out); return hvl__oom("fusing"); }
    int64_t threshold = e->params.fusion_threshold;
    hvl_entry **store = out->entry_store;
    for (int i = 0; i < n; i++) {
        if (taken[i]) continue;
        const hvl_desc *d = &resps[i]->d;
        hvl_batch *b = &out->items[out->count++];
        *b = (hvl_batch){.op = d->op, .dtype = d->dtype, .reduce_op = d->reduce_op, .root_rank = d->root_rank,
                         .target_set = d->target_set, .last_joined = resps[i]->last_joined,
                         .prescale = d->prescale, .postscale = d->postscale, .memory = d->memory,
                         .ps = hvl__pset(e, d->process_set), .entries = store};
        b->entries[b->count++] = entries[i];
        b->bytes = hvl__desc_bytes(d);
        for (int j = i + 1; hvl__op_is(d->op, HVL_OPF_FUSES) && j < n; j++) {
            int64_t bytes = hvl__desc_bytes(&resps[j]->d);
            if (taken[j] || !same_key(d, &resps[j]->d) || b->bytes + bytes > threshold) continue;
            b->entries[b->count++] = entries[j];
            b->bytes += bytes;
            taken[j] = 1;
        }
        store += b->count;
        if (b->count > 1) {
            hvl__count(&e->counters.tensors_fused, b->count);
            hvl__count(&e->counters.bytes_fused, b->bytes);
        }
    }
    free(taken);
    return HVL_OK;
}

void hvl__batches_free(hvl_batch_list *l)
{
    free(l->items);
    free(l->entry_store);
    l->items = NULL;
    l->entry_store = NULL;
    l->count = 0;
}
