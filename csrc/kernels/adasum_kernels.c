/* adasum_kernels.c: the element math of Adasum (adaptive summation) for the dtypes it takes,
 * float16, float32 and float64: the dot product and squared norms of two slices, and the
 * scaled sum a*ca + b*cb that combines them. Sums and products run in double whatever the
 * dtype (float16 is widened first), so a slice's partial sums lose nothing before the ranks add
 * them up. The recursion over ranks lives in the data plane (backends/adasum_mpi.c). Pure
 * functions, any thread; the engine calls them on the bg thread. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "kernels.h"
#include "half.h"

#define DOTS(T, GET) { const T *x = a, *y = b; \
    for (int64_t i = 0; i < n; i++) { double p = GET(x[i]), q = GET(y[i]); \
        ab += p * q; aa += p * p; bb += q * q; } } break
#define AS_DOUBLE(v) ((double)(v))
#define HALF(v) ((double)half_to_float(v))

void hvl__adasum_dots(const void *a, const void *b, int64_t n, int dtype, double out[3])
{
    double ab = 0, aa = 0, bb = 0;
    switch (dtype) {
    case HVL_FLOAT16: DOTS(uint16_t, HALF);
    case HVL_FLOAT32: DOTS(float, AS_DOUBLE);
    case HVL_FLOAT64: DOTS(double, AS_DOUBLE);
    default: break;
    }
    out[0] += ab;
    out[1] += aa;
    out[2] += bb;
}

#define COMBINE(T, GET, PUT) { const T *x = a, *y = b; T *o = out; \
    for (int64_t i = 0; i < n; i++) o[i] = PUT(ca * GET(x[i]) + cb * GET(y[i])); } break
#define TO_FLOAT(v) ((float)(v))
#define TO_DOUBLE(v) (v)
#define TO_HALF(v) float_to_half((float)(v))

void hvl__adasum_combine(void *out, const void *a, const void *b, int64_t n, int dtype,
                         double ca, double cb)
{
    switch (dtype) {
    case HVL_FLOAT16: COMBINE(uint16_t, HALF, TO_HALF);
    case HVL_FLOAT32: COMBINE(float, AS_DOUBLE, TO_FLOAT);
    case HVL_FLOAT64: COMBINE(double, AS_DOUBLE, TO_DOUBLE);
    default: break;
    }
}

/* A squared norm below sqrt(DBL_MIN) counts as a zero vector: its coefficient stays 1, so
 * adasum(a, 0) = a (a rank that joined contributes zeros). */
#define ZERO_NORM_SQ 1.4916681462400413e-154

void hvl__adasum_coefficients(const double dots[3], double *ca, double *cb)
{
    *ca = dots[1] >= ZERO_NORM_SQ ? 1.0 - dots[0] / (2.0 * dots[1]) : 1.0;
    *cb = dots[2] >= ZERO_NORM_SQ ? 1.0 - dots[0] / (2.0 * dots[2]) : 1.0;
}

int hvl__adasum_dtype_ok(int dtype)
{
    return dtype == HVL_FLOAT16 || dtype == HVL_FLOAT32 || dtype == HVL_FLOAT64;
}
