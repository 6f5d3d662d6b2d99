/* wire.c: the byte format of tensor descriptions (rank -> rank 0, as requests) and responses
 * (rank 0 -> every rank), written into an hvl_buf (util/buf.c). Native byte order: every rank of
 * a job runs on the same architecture. Readers never trust lengths: a short or corrupt buffer
 * fails with a message. bg thread. */
#include <string.h>
#include "request.h"

void hvl__wire_put_desc(hvl_buf *b, const hvl_desc *d)
{
    hvl__buf_i32(b, d->op);
    hvl__buf_i32(b, d->dtype);
    hvl__buf_i32(b, d->reduce_op);
    hvl__buf_i32(b, d->root_rank);
    hvl__buf_i32(b, d->process_set);
    hvl__buf_i32(b, d->target_set);
    hvl__buf_i32(b, d->ndim);
    for (int i = 0; i < d->ndim; i++) hvl__buf_i64(b, d->shape[i]);
    hvl__buf_f64(b, d->prescale);
    hvl__buf_f64(b, d->postscale);
    hvl__buf_i32(b, d->memory);
    hvl__buf_i32(b, d->device);
    hvl__buf_i32(b, d->set_device);
    hvl__buf_str(b, d->name);
}

void hvl__wire_put_response(hvl_buf *b, const hvl_response *r)
{
    hvl__wire_put_desc(b, &r->d);
    hvl__buf_i32(b, r->status);
    hvl__buf_str(b, r->error);
    hvl__buf_i32(b, r->last_joined);
}

static int corrupt(hvl_buf *b, const char *what)
{
    return hvl__fail(HVL_ERR_SYSTEM, "negotiation: corrupt %s at byte %zu of %zu", what, b->pos, b->len);
}

int hvl__wire_get_desc(hvl_buf *b, hvl_desc *d)
{
    memset(d, 0, sizeof(*d));
    d->op = hvl__buf_get_i32(b);
    d->dtype = hvl__buf_get_i32(b);
    d->reduce_op = hvl__buf_get_i32(b);
    d->root_rank = hvl__buf_get_i32(b);
    d->process_set = hvl__buf_get_i32(b);
    d->target_set = hvl__buf_get_i32(b);
    d->ndim = hvl__buf_get_i32(b);
    if (d->ndim < 0 || d->ndim > HVL_MAX_DIMS) b->bad = 1;
    for (int i = 0; i < d->ndim && !b->bad; i++) d->shape[i] = hvl__buf_get_i64(b);
    d->prescale = hvl__buf_get_f64(b);
    d->postscale = hvl__buf_get_f64(b);
    d->memory = hvl__buf_get_i32(b);
    if (d->memory < 0 || d->memory >= HVL_MEMORY_COUNT) b->bad = 1;
    d->device = hvl__buf_get_i32(b);
    d->set_device = hvl__buf_get_i32(b);
    d->name = hvl__buf_get_str(b);
    if (!d->name) b->bad = 1;
    return b->bad ? corrupt(b, "tensor description") : HVL_OK;
}

int hvl__wire_get_response(hvl_buf *b, hvl_response *r)
{
    memset(r, 0, sizeof(*r));
    HVL_CHECK(hvl__wire_get_desc(b, &r->d));
    r->status = hvl__buf_get_i32(b);
    r->error = hvl__buf_get_str(b);
    r->last_joined = hvl__buf_get_i32(b);
    return b->bad ? corrupt(b, "response") : HVL_OK;
}
