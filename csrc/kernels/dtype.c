/* dtype.c: the dtype table, a leaf fact every layer reads: each hvlite dtype's element size and
 * name. (Its MPI datatype is reduce.c's, which makes the float16/bfloat16 types.) Pure
 * functions over constants, any thread; nothing here fails. */
#include "kernels.h"

static const struct { int size; const char *name; } dtypes[HVL_DTYPE_COUNT] = {
    [HVL_UINT8] = {1, "uint8"},     [HVL_INT8] = {1, "int8"},       [HVL_UINT16] = {2, "uint16"},
    [HVL_INT16] = {2, "int16"},     [HVL_INT32] = {4, "int32"},     [HVL_INT64] = {8, "int64"},
    [HVL_FLOAT16] = {2, "float16"}, [HVL_BFLOAT16] = {2, "bfloat16"}, [HVL_FLOAT32] = {4, "float32"},
    [HVL_FLOAT64] = {8, "float64"}, [HVL_BOOL] = {1, "bool"},
};

int hvl_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < HVL_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *hvl__dtype_name(int dtype)
{
    return dtype >= 0 && dtype < HVL_DTYPE_COUNT ? dtypes[dtype].name : "unknown dtype";
}
