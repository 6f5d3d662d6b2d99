/* json_text.c: JSON text appended to a growable buffer (hvl_buf): raw bytes, integers,
 * microseconds with 3 decimals, escaped strings, and printf for the rare rest. The timeline
 * writer formats hundreds of thousands of events a second through these; printf's
 * floating-point path was most of its time, so numbers are formatted by hand. Any thread (the
 * buffer is the caller's). Cannot fail: a failed allocation sets b->bad, and every later call on
 * that buffer does nothing. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

void hvl__json_raw(hvl_buf *b, const char *s, size_t n) { hvl__buf_put(b, s, n); }

void hvl__json_int(hvl_buf *b, int64_t v)
{
    char digits[24], *p = digits + sizeof(digits);
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do *--p = (char)('0' + u % 10); while (u /= 10);
    if (v < 0) *--p = '-';
    hvl__json_raw(b, p, (size_t)(digits + sizeof(digits) - p));
}

void hvl__json_us(hvl_buf *b, int64_t ns)
{
    if (ns < 0) ns = 0;
    char frac[4] = {'.', (char)('0' + ns / 100 % 10), (char)('0' + ns / 10 % 10), (char)('0' + ns % 10)};
    hvl__json_int(b, ns / 1000);
    hvl__json_raw(b, frac, 4);
}

void hvl__json_printf(hvl_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) { b->bad = 1; return; }
    if (!hvl__buf_reserve(b, (size_t)n + 1)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (2-4 bytes), or 0 if it is not one. Stops at a NUL. */
static int utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    int n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (!n) return 0;
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;    /* no surrogates, <= U+10FFFF */
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return n;
}

void hvl__json_str(hvl_buf *b, const char *s)
{
    HVL_JSON_LIT(b, "\"");
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned char *run = p;
        while (*p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p > run) hvl__json_raw(b, (const char *)run, (size_t)(p - run));
        if (!*p) break;
        int n = *p >= 0x80 ? utf8_len(p) : 0;
        if (n) hvl__json_raw(b, (const char *)p, (size_t)n), p += n;
        else if (*p == '"' || *p == '\\') hvl__json_printf(b, "\\%c", *p++);
        else if (*p < 0x20) hvl__json_printf(b, "\\u%04x", *p++);
        else HVL_JSON_LIT(b, "\\ufffd"), p++;
    }
    HVL_JSON_LIT(b, "\"");
}
