/* wire.c: the byte format of requests (rank -> rank 0) and responses (rank 0 -> all), and the
 * growable buffer it is written into. Native byte order: every rank of a job runs on the same
 * architecture. Readers never trust lengths: a short or corrupt buffer sets b->bad. bg thread. */
#include <stdlib.h>
#include <string.h>
#include "internal.h"

static void put(hvl_buf *b, const void *p, size_t n)
{
    if (b->bad) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) { b->bad = 1; return; }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static int get(hvl_buf *b, void *p, size_t n)
{
    if (b->bad || b->pos + n > b->len) { b->bad = 1; memset(p, 0, n); return 0; }
    memcpy(p, b->data + b->pos, n);
    b->pos += n;
    return 1;
}

void hvl__buf_i32(hvl_buf *b, int32_t v) { put(b, &v, sizeof(v)); }
void hvl__buf_i64(hvl_buf *b, int64_t v) { put(b, &v, sizeof(v)); }
void hvl__buf_f64(hvl_buf *b, double v) { put(b, &v, sizeof(v)); }
void hvl__buf_str(hvl_buf *b, const char *s)
{
    int32_t n = s ? (int32_t)strlen(s) : -1;
    hvl__buf_i32(b, n);
    if (n > 0) put(b, s, (size_t)n);
}
int32_t hvl__buf_get_i32(hvl_buf *b) { int32_t v; get(b, &v, sizeof(v)); return v; }
int64_t hvl__buf_get_i64(hvl_buf *b) { int64_t v; get(b, &v, sizeof(v)); return v; }
double hvl__buf_get_f64(hvl_buf *b) { double v; get(b, &v, sizeof(v)); return v; }

char *hvl__buf_get_str(hvl_buf *b)
{
    int32_t n = hvl__buf_get_i32(b);
    if (n < 0 || b->bad || b->pos + (size_t)n > b->len) { if (n != -1) b->bad = 1; return NULL; }
    char *s = malloc((size_t)n + 1);
    if (!s) { b->bad = 1; return NULL; }
    memcpy(s, b->data + b->pos, (size_t)n);
    s[n] = 0;
    b->pos += (size_t)n;
    return s;
}

void hvl__buf_free(hvl_buf *b) { free(b->data); memset(b, 0, sizeof(*b)); }

/* Fields common to a request and a response, in one order. */
static void put_common(hvl_buf *b, int op, int dtype, int reduce_op, int root, int set, int ndim,
                       const int64_t *shape, double pre, double post, const char *name)
{
    hvl__buf_i32(b, op);
    hvl__buf_i32(b, dtype);
    hvl__buf_i32(b, reduce_op);
    hvl__buf_i32(b, root);
    hvl__buf_i32(b, set);
    hvl__buf_i32(b, ndim);
    for (int i = 0; i < ndim; i++) hvl__buf_i64(b, shape[i]);
    hvl__buf_f64(b, pre);
    hvl__buf_f64(b, post);
    hvl__buf_str(b, name);
}

void hvl__wire_put_request(hvl_buf *b, const hvl_request *q)
{
    put_common(b, q->op, q->dtype, q->reduce_op, q->root_rank, q->process_set, q->ndim, q->shape, q->prescale,
               q->postscale, q->name);
}

void hvl__wire_put_response(hvl_buf *b, const hvl_response *r)
{
    put_common(b, r->op, r->dtype, r->reduce_op, r->root_rank, r->process_set, r->ndim, r->shape, r->prescale,
               r->postscale, r->name);
    hvl__buf_i32(b, r->status);
    hvl__buf_str(b, r->error);
}

/* Reads the common fields (a request, or the start of a response) into r. */
int hvl__wire_get_common(hvl_buf *b, hvl_response *r)
{
    memset(r, 0, sizeof(*r));
    r->op = hvl__buf_get_i32(b);
    r->dtype = hvl__buf_get_i32(b);
    r->reduce_op = hvl__buf_get_i32(b);
    r->root_rank = hvl__buf_get_i32(b);
    r->process_set = hvl__buf_get_i32(b);
    r->ndim = hvl__buf_get_i32(b);
    if (r->ndim < 0 || r->ndim > HVL_MAX_DIMS) b->bad = 1;
    for (int i = 0; i < r->ndim && !b->bad; i++) r->shape[i] = hvl__buf_get_i64(b);
    r->prescale = hvl__buf_get_f64(b);
    r->postscale = hvl__buf_get_f64(b);
    r->name = hvl__buf_get_str(b);
    if (!r->name) b->bad = 1;
    return b->bad ? HVL_ERR_SYSTEM : HVL_OK;
}

int hvl__wire_get_response(hvl_buf *b, hvl_response *r)
{
    HVL_CHECK(hvl__wire_get_common(b, r));
    r->status = hvl__buf_get_i32(b);
    r->error = hvl__buf_get_str(b);
    return b->bad ? HVL_ERR_SYSTEM : HVL_OK;
}
