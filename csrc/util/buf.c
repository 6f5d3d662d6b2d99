/* buf.c: the growable byte buffer every serialiser writes into (the wire codec, JSON text),
 * and hvl__grow for the engine's own scratch buffers.
 * Writes never fail: out of memory sets b->bad and every later write does nothing, so a writer
 * checks once at the end. Reads never trust lengths: a short or corrupt buffer sets b->bad.
 * Native byte order (every rank of a job runs on the same architecture). Any thread; the
 * buffer is the caller's. */
#include <stdlib.h>
#include <string.h>
#include "util.h"

int hvl__buf_reserve(hvl_buf *b, size_t n)
{
    if (b->bad) return 0;
    if (b->len + n <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) { b->bad = 1; return 0; }
    b->data = d;
    b->cap = cap;
    return 1;
}

void hvl__buf_put(hvl_buf *b, const void *p, size_t n)
{
    if (!hvl__buf_reserve(b, n)) return;
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

void hvl__buf_i32(hvl_buf *b, int32_t v) { hvl__buf_put(b, &v, sizeof(v)); }
void hvl__buf_i64(hvl_buf *b, int64_t v) { hvl__buf_put(b, &v, sizeof(v)); }
void hvl__buf_f64(hvl_buf *b, double v) { hvl__buf_put(b, &v, sizeof(v)); }

void hvl__buf_str(hvl_buf *b, const char *s)
{
    int32_t n = s ? (int32_t)strlen(s) : -1;
    hvl__buf_i32(b, n);
    if (n > 0) hvl__buf_put(b, s, (size_t)n);
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

int hvl__grow(char **buf, int64_t *cap, int64_t need)
{
    if (need <= *cap) return HVL_OK;
    char *b = realloc(*buf, (size_t)need);
    if (!b) return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory growing a buffer to %lld bytes", (long long)need);
    *buf = b;
    *cap = need;
    return HVL_OK;
}
