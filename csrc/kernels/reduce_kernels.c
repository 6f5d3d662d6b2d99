/* reduce_kernels.c: the elementwise reductions of the shared-memory data plane,
 * out[i] = a[i] op b[i], for every dtype and reduce op. They are plain loops that the compiler
 * vectorises (this file asks GCC for -O3; clang vectorises at -O2). float16 and bfloat16 are
 * widened to float32 a block at a time (with the CPU's F16C conversions when it has them),
 * combined, and rounded back to nearest even, as reduce.c's MPI user ops do. Integer sums and
 * products wrap (computed unsigned), as MPI's do; bool Sum/Max mean "any", Min/Product "all";
 * Average is a Sum here (the caller divides). Pure functions: any thread; the shm backend
 * calls them on the bg thread. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <stdint.h>
#include "kernels.h"
#include "half.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_F16C_PATH 1
#endif

/* out may be a itself (in place); otherwise the three do not overlap. */
#define LOOP(T, EXPR) do { T *o = out; const T *x = a, *y = b; \
    for (int64_t i = 0; i < n; i++) { T p = x[i], q = y[i]; o[i] = (EXPR); } } while (0)

#define MINMAX_CASES(T) \
    case HVL_MIN: LOOP(T, q < p ? q : p); break; \
    case HVL_MAX: LOOP(T, q > p ? q : p); break;

#define INT_KERNEL(NAME, T, U) \
static void NAME(void *out, const void *a, const void *b, int64_t n, int op) \
{ \
    switch (op) { \
    MINMAX_CASES(T) \
    case HVL_PRODUCT: LOOP(T, (T)((U)p * (U)q)); break; \
    default: LOOP(T, (T)((U)p + (U)q)); break; \
    } \
}

#define FLOAT_KERNEL(NAME, T) \
static void NAME(void *out, const void *a, const void *b, int64_t n, int op) \
{ \
    switch (op) { \
    MINMAX_CASES(T) \
    case HVL_PRODUCT: LOOP(T, p * q); break; \
    default: LOOP(T, p + q); break; \
    } \
}

/* 8- and 16-bit values are multiplied as unsigned int: uint16 * uint16 overflows an int. */
INT_KERNEL(k_u8, uint8_t, unsigned)
INT_KERNEL(k_i8, int8_t, unsigned)
INT_KERNEL(k_u16, uint16_t, unsigned)
INT_KERNEL(k_i16, int16_t, unsigned)
INT_KERNEL(k_i32, int32_t, uint32_t)
INT_KERNEL(k_i64, int64_t, uint64_t)
FLOAT_KERNEL(k_f32, float)
FLOAT_KERNEL(k_f64, double)

static void k_bool(void *out, const void *a, const void *b, int64_t n, int op)
{
    if (op == HVL_MIN || op == HVL_PRODUCT) LOOP(uint8_t, (uint8_t)((p != 0) & (q != 0)));
    else LOOP(uint8_t, (uint8_t)((p | q) != 0));
}

/* ---- float16 / bfloat16: widen a block, combine in float32, round back ---- */
#define BLOCK 256

static void widen(float *dst, const uint16_t *src, int64_t n, int bf16)
{
    if (bf16) for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
    else for (int64_t i = 0; i < n; i++) dst[i] = half_to_float(src[i]);
}

static void narrow(uint16_t *dst, const float *src, int64_t n, int bf16)
{
    if (bf16) for (int64_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
    else for (int64_t i = 0; i < n; i++) dst[i] = float_to_half(src[i]);
}

#ifdef HAVE_F16C_PATH
/* The same conversions as half.h (round to nearest even; NaNs stay NaNs), 8 at a time. */
__attribute__((target("avx,f16c")))
static void widen_f16c(float *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = half_to_float(src[i]);
}

__attribute__((target("avx,f16c")))
static void narrow_f16c(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = float_to_half(src[i]);
}

static int has_f16c(void)
{
    static int known = -1;   /* benign race: every thread computes the same answer */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    }
    return known;
}
#endif

static void k_half(void *out, const void *a, const void *b, int64_t n, int op, int bf16)
{
    float fa[BLOCK], fb[BLOCK];
    const uint16_t *x = a, *y = b;
    uint16_t *o = out;
#ifdef HAVE_F16C_PATH
    int fast = !bf16 && has_f16c();
#endif
    for (int64_t start = 0; start < n; start += BLOCK) {
        int64_t m = n - start < BLOCK ? n - start : BLOCK;
#ifdef HAVE_F16C_PATH
        if (fast) {
            widen_f16c(fa, x + start, m);
            widen_f16c(fb, y + start, m);
        } else
#endif
        {
            widen(fa, x + start, m, bf16);
            widen(fb, y + start, m, bf16);
        }
        k_f32(fa, fa, fb, m, op);
#ifdef HAVE_F16C_PATH
        if (fast) narrow_f16c(o + start, fa, m);
        else
#endif
        narrow(o + start, fa, m, bf16);
    }
}

void hvl__reduce_pair(void *out, const void *a, const void *b, int64_t n, int dtype, int reduce_op)
{
    switch (dtype) {
    case HVL_UINT8: k_u8(out, a, b, n, reduce_op); break;
    case HVL_INT8: k_i8(out, a, b, n, reduce_op); break;
    case HVL_UINT16: k_u16(out, a, b, n, reduce_op); break;
    case HVL_INT16: k_i16(out, a, b, n, reduce_op); break;
    case HVL_INT32: k_i32(out, a, b, n, reduce_op); break;
    case HVL_INT64: k_i64(out, a, b, n, reduce_op); break;
    case HVL_FLOAT16: k_half(out, a, b, n, reduce_op, 0); break;
    case HVL_BFLOAT16: k_half(out, a, b, n, reduce_op, 1); break;
    case HVL_FLOAT32: k_f32(out, a, b, n, reduce_op); break;
    case HVL_FLOAT64: k_f64(out, a, b, n, reduce_op); break;
    case HVL_BOOL: k_bool(out, a, b, n, reduce_op); break;
    default: break;
    }
}
