/* kernels.h: element math, shared by the cycle (scaling, averaging) and the data planes
 * (reductions): the dtype table (sizes and names, dtype.c), the MPI datatypes and ops of each
 * hvlite dtype and reduce op (reduce.c, with float16/bfloat16 as MPI user ops), scaling, and
 * the elementwise reduce kernels of the shared-memory plane (reduce_kernels.c). Pure
 * functions, any thread, except setup/teardown (bg thread, once MPI is up). */
#ifndef HVLITE_KERNELS_H
#define HVLITE_KERNELS_H

#include <mpi.h>
#include <stdint.h>
#include "hvlite.h"

int hvl__reduce_setup(void);                 /* creates the float16/bfloat16 MPI types and ops */
void hvl__reduce_teardown(void);
MPI_Datatype hvl__mpi_dtype(int dtype);
MPI_Op hvl__mpi_op(int reduce_op, int dtype);
/* dst[i] = src[i] * factor (dst may equal src). Integers round toward zero and saturate.
 * Cannot fail. */
void hvl__scale(void *dst, const void *src, int64_t count, int dtype, double factor);
/* out[i] = a[i] op b[i] for n elements; out may be a or b, else no overlap. Average sums.
 * Integers wrap; bool Sum/Max = any, Min/Product = all. Cannot fail. */
void hvl__reduce_pair(void *out, const void *a, const void *b, int64_t n, int dtype, int reduce_op);
/* Adasum (adasum_kernels.c), float16/32/64 only. dots: out[0..2] += a.b, a.a, b.b over n
 * elements (in double). coefficients: from whole-tensor dots, ca = 1 - a.b / (2 a.a) and
 * cb = 1 - a.b / (2 b.b), 1 for a zero vector. combine: out[i] = ca a[i] + cb b[i] (out may
 * be a or b). dtype_ok: 1 for the dtypes Adasum takes. Cannot fail. */
void hvl__adasum_dots(const void *a, const void *b, int64_t n, int dtype, double out[3]);
void hvl__adasum_coefficients(const double dots[3], double *ca, double *cb);
void hvl__adasum_combine(void *out, const void *a, const void *b, int64_t n, int dtype,
                         double ca, double cb);
int hvl__adasum_dtype_ok(int dtype);
/* The dtype table (dtype.c): the name of a dtype ("unknown dtype" outside the enum; its size is
 * hvlite.h's hvl_dtype_size). Cannot fail. */
const char *hvl__dtype_name(int dtype);
const char *hvl__reduce_name(int reduce_op);    /* "Sum", ... (reduce.c); cannot fail */

#endif /* HVLITE_KERNELS_H */
