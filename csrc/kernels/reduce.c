/* reduce.c: reductions. Maps hvlite dtypes and reduce ops to MPI; defines the float16/bfloat16
 * reductions MPI lacks (computed in float32, rounded to nearest even) as MPI user ops; scales
 * buffers for averaging and pre/post factors. bg thread (setup/teardown); the kernels are
 * pure. Integer scaling is computed in double and rounds toward zero. */
#include <math.h>
#include <string.h>
#include "kernels.h"
#include "util.h"
#include "half.h"

static MPI_Datatype half_type = MPI_DATATYPE_NULL, bhalf_type = MPI_DATATYPE_NULL;
static MPI_Op half_ops[HVL_REDUCE_COUNT];

static inline float combine(int op, float a, float b)
{
    switch (op) {
    case HVL_MIN: return b < a ? b : a;
    case HVL_MAX: return b > a ? b : a;
    case HVL_PRODUCT: return a * b;
    default: return a + b;
    }
}

/* One MPI user function per reduce op; the datatype says half or bfloat16. */
static void half_reduce(int op, void *in, void *inout, int *len, MPI_Datatype *type)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    if (*type == bhalf_type)
        for (int i = 0; i < *len; i++) b[i] = float_to_bf16(combine(op, bf16_to_float(a[i]), bf16_to_float(b[i])));
    else
        for (int i = 0; i < *len; i++) b[i] = float_to_half(combine(op, half_to_float(a[i]), half_to_float(b[i])));
}
static void half_sum(void *i, void *o, int *n, MPI_Datatype *t) { half_reduce(HVL_SUM, i, o, n, t); }
static void half_min(void *i, void *o, int *n, MPI_Datatype *t) { half_reduce(HVL_MIN, i, o, n, t); }
static void half_max(void *i, void *o, int *n, MPI_Datatype *t) { half_reduce(HVL_MAX, i, o, n, t); }
static void half_prod(void *i, void *o, int *n, MPI_Datatype *t) { half_reduce(HVL_PRODUCT, i, o, n, t); }

int hvl__reduce_setup(void)
{
    HVL_CHECK(hvl__mpi_check(MPI_Type_contiguous(2, MPI_BYTE, &half_type), "MPI_Type_contiguous"));
    HVL_CHECK(hvl__mpi_check(MPI_Type_commit(&half_type), "MPI_Type_commit"));
    HVL_CHECK(hvl__mpi_check(MPI_Type_contiguous(2, MPI_BYTE, &bhalf_type), "MPI_Type_contiguous"));
    HVL_CHECK(hvl__mpi_check(MPI_Type_commit(&bhalf_type), "MPI_Type_commit"));
    /* Adasum is no elementwise op (adasum.c); it has no MPI op. */
    MPI_User_function *fns[HVL_REDUCE_COUNT] = {half_sum, half_sum, half_min, half_max, half_prod,
                                                NULL};
    for (int i = 0; i < HVL_REDUCE_COUNT; i++)
        if (fns[i])
            HVL_CHECK(hvl__mpi_check(MPI_Op_create(fns[i], 1, &half_ops[i]), "MPI_Op_create"));
    return HVL_OK;
}

void hvl__reduce_teardown(void)
{
    for (int i = 0; i < HVL_REDUCE_COUNT; i++)
        if (half_ops[i] != MPI_OP_NULL && half_ops[i]) MPI_Op_free(&half_ops[i]);
    if (half_type != MPI_DATATYPE_NULL) MPI_Type_free(&half_type);
    if (bhalf_type != MPI_DATATYPE_NULL) MPI_Type_free(&bhalf_type);
}

MPI_Datatype hvl__mpi_dtype(int dtype)
{
    switch (dtype) {
    case HVL_UINT8: return MPI_UINT8_T;
    case HVL_INT8: return MPI_INT8_T;
    case HVL_UINT16: return MPI_UINT16_T;
    case HVL_INT16: return MPI_INT16_T;
    case HVL_INT32: return MPI_INT32_T;
    case HVL_INT64: return MPI_INT64_T;
    case HVL_FLOAT16: return half_type;
    case HVL_BFLOAT16: return bhalf_type;
    case HVL_FLOAT32: return MPI_FLOAT;
    case HVL_FLOAT64: return MPI_DOUBLE;
    case HVL_BOOL: return MPI_C_BOOL;
    default: return MPI_DATATYPE_NULL;
    }
}

MPI_Op hvl__mpi_op(int reduce_op, int dtype)
{
    if (dtype == HVL_FLOAT16 || dtype == HVL_BFLOAT16) return half_ops[reduce_op];
    if (dtype == HVL_BOOL)  /* logical: Sum/Max are "any", Min/Product are "all" */
        return reduce_op == HVL_MIN || reduce_op == HVL_PRODUCT ? MPI_LAND : MPI_LOR;
    switch (reduce_op) {
    case HVL_MIN: return MPI_MIN;
    case HVL_MAX: return MPI_MAX;
    case HVL_PRODUCT: return MPI_PROD;
    default: return MPI_SUM;   /* Average is a sum, scaled afterwards */
    }
}

/* Integers: scaled in double, rounded toward zero, saturated to the type's range (a cast of an
 * out-of-range double is undefined in C). */
#define SCALE_INT(T, LO, HI) { const T *s = src; T *d = dst; \
    for (int64_t i = 0; i < count; i++) { double v = (double)s[i] * factor; \
        d[i] = v <= (double)(LO) ? (T)(LO) : v >= (double)(HI) ? (T)(HI) : (T)v; } } break
#define SCALE_FLOAT(T) { const T *s = src; T *d = dst; T f = (T)factor; for (int64_t i = 0; i < count; i++) d[i] = s[i] * f; } break

void hvl__scale(void *dst, const void *src, int64_t count, int dtype, double factor)
{
    if (factor == 1.0) {   /* a plain copy: exact for every dtype, and memcpy is fastest */
        if (dst != src && count) memcpy(dst, src, (size_t)count * (size_t)hvl_dtype_size(dtype));
        return;
    }
    switch (dtype) {
    case HVL_UINT8: SCALE_INT(uint8_t, 0, UINT8_MAX);
    case HVL_INT8: SCALE_INT(int8_t, INT8_MIN, INT8_MAX);
    case HVL_UINT16: SCALE_INT(uint16_t, 0, UINT16_MAX);
    case HVL_INT16: SCALE_INT(int16_t, INT16_MIN, INT16_MAX);
    case HVL_INT32: SCALE_INT(int32_t, INT32_MIN, INT32_MAX);
    case HVL_INT64: SCALE_INT(int64_t, INT64_MIN, INT64_MAX);
    case HVL_FLOAT32: SCALE_FLOAT(float);
    case HVL_FLOAT64: { const double *s = src; double *d = dst; for (int64_t i = 0; i < count; i++) d[i] = s[i] * factor; } break;
    case HVL_FLOAT16: { const uint16_t *s = src; uint16_t *d = dst; float f = (float)factor;
        for (int64_t i = 0; i < count; i++) d[i] = float_to_half(half_to_float(s[i]) * f); } break;
    case HVL_BFLOAT16: { const uint16_t *s = src; uint16_t *d = dst; float f = (float)factor;
        for (int64_t i = 0; i < count; i++) d[i] = float_to_bf16(bf16_to_float(s[i]) * f); } break;
    default: if (dst != src) memcpy(dst, src, (size_t)count * (size_t)hvl_dtype_size(dtype)); break;
    }
}

const char *hvl__reduce_name(int reduce_op)
{
    static const char *names[HVL_REDUCE_COUNT] = {"Sum", "Average", "Min", "Max", "Product",
                                                  "Adasum"};
    return reduce_op >= 0 && reduce_op < HVL_REDUCE_COUNT ? names[reduce_op] : "unknown reduce op";
}
