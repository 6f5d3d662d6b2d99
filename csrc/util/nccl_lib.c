/* nccl_lib.c: NCCL, opened at run time (nccl_lib.h says why and what). Owns the library handle
 * and its function table, written once under pthread_once. Nothing here knows the engine's
 * batches or sets. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_driver.h"
#include "nccl_lib.h"
#include "util.h"

hvl_nccl_api hvl__nccl;

#define SYMBOL(slot, name) HVL_SYMBOL(hvl__nccl, slot, name)
static const hvl_symbol symbols[] = {
    SYMBOL(get_version, "ncclGetVersion"), SYMBOL(get_unique_id, "ncclGetUniqueId"),
    SYMBOL(comm_init_rank_config, "ncclCommInitRankConfig"), SYMBOL(comm_abort, "ncclCommAbort"),
    SYMBOL(comm_get_async_error, "ncclCommGetAsyncError"),
    SYMBOL(get_error_string, "ncclGetErrorString"), SYMBOL(get_last_error, "ncclGetLastError"),
    SYMBOL(all_reduce, "ncclAllReduce"), SYMBOL(broadcast, "ncclBroadcast"),
    SYMBOL(reduce_scatter, "ncclReduceScatter"), SYMBOL(group_start, "ncclGroupStart"),
    SYMBOL(group_end, "ncclGroupEnd"), SYMBOL(premulsum_create, "ncclRedOpCreatePreMulSum"),
    SYMBOL(red_op_destroy, "ncclRedOpDestroy"), SYMBOL(all_gather, "ncclAllGather"),
    SYMBOL(send, "ncclSend"), SYMBOL(recv, "ncclRecv"),
};
#undef SYMBOL

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;                 /* 1 once every symbol was found (written under load_once) */
static char load_error[4096 + 600];   /* the path, and what went wrong */
static int version;                /* e.g. 22809 */
static const char *load_path;      /* the first caller's */

static void load(void)
{
    const char *path = load_path && load_path[0] ? load_path : "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof(load_error), "NCCL could not be loaded from %s (%s)", path, dlerror());
        return;
    }
    const char *missing = hvl__bind_symbols(lib, symbols, sizeof(symbols) / sizeof(symbols[0]));
    if (missing) {
        snprintf(load_error, sizeof(load_error), "%s has no %s: NCCL 2.14 or later is needed", path, missing);
        return;
    }
    if (hvl__nccl.get_version(&version) != NC_SUCCESS) {
        snprintf(load_error, sizeof(load_error), "%s: ncclGetVersion failed", path);
        return;
    }
    hvl__log(HVL_LOG_DEBUG, "NCCL %d.%d.%d loaded from %s", version / 10000, version / 100 % 100,
             version % 100, path);
    __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
}

int hvl__nccl_load(const char *path)
{
    if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) load_path = path;
    pthread_once(&load_once, load);
    return loaded ? HVL_OK : hvl__fail(HVL_ERR_NCCL, "%s", load_error);
}

int hvl__nccl_version(void) { return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE) ? version : 0; }

int hvl__nccl_check(ncclResult_t rc, ncclComm_t comm, const char *what)
{
    if (rc == NC_SUCCESS || rc == NC_IN_PROGRESS) return HVL_OK;
    const char *last = comm && hvl__nccl.get_last_error ? hvl__nccl.get_last_error(comm) : NULL;
    return hvl__fail(HVL_ERR_NCCL, "NCCL: %s failed: %s (%d)%s%s", what, hvl__nccl.get_error_string(rc), rc,
                     last && last[0] ? ": " : "", last && last[0] ? last : "");
}

/* The abort, on a helper thread: NCCL's abort joins its proxy thread, which may wait for ever on
 * a stopped peer of the same host, and the engine must not. The one of the two threads that
 * finishes last frees the call. */
typedef struct {
    ncclComm_t comm;
    int device;
    int refs;                   /* atomic: the waiter's and the helper's */
    int done;                   /* atomic: the helper finished */
    int aborted;                /* written before done: ncclCommAbort ran (its device's context
                                   could be made current) */
} abort_call;

static void abort_release(abort_call *a)
{
    if (__atomic_sub_fetch(&a->refs, 1, __ATOMIC_ACQ_REL) == 0) free(a);
}

static void *abort_helper(void *arg)
{
    abort_call *a = arg;
    pthread_setname_np(pthread_self(), "hvl-nccl-abort");    /* not the engine's (inherited) */
    if (hvl__cuda_adopt(a->device) == HVL_OK) {   /* the comm's context */
        hvl__nccl.comm_abort(a->comm);
        a->aborted = 1;
    }
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    abort_release(a);
    return NULL;
}

int hvl__nccl_abort(ncclComm_t comm, int dev, double limit_s)
{
    abort_call *a = calloc(1, sizeof(*a));
    pthread_t thread;
    if (!a) return 0;                       /* out of memory: the communicator leaks */
    *a = (abort_call){comm, dev, 2, 0, 0};
    if (pthread_create(&thread, NULL, abort_helper, a) != 0) {
        free(a);                            /* no thread to bound it: leaked, not aborted */
        return 0;
    }
    pthread_detach(thread);
    double start = hvl__now(), nap_s = 1e-4;
    while (!__atomic_load_n(&a->done, __ATOMIC_ACQUIRE) && hvl__now() - start < limit_s)
        hvl__nap(&nap_s, 1e-3);
    int returned = __atomic_load_n(&a->done, __ATOMIC_ACQUIRE), aborted = returned && a->aborted;
    if (!returned) {
        hvl__log(HVL_LOG_WARNING, "ncclCommAbort did not return in %.0f s (a peer on this host is "
                 "stopped?): its communicator is left behind", limit_s);
        hvl__cuda_stuck();                  /* its kernels may hold the device for good */
    } else if (!aborted) {                  /* NCCL may still use its buffers: the caller keeps them */
        hvl__log(HVL_LOG_WARNING, "ncclCommAbort could not run (no context for cuda:%d on its thread): "
                 "its communicator is left behind", dev);
        hvl__cuda_stuck();                  /* its kernels may never end */
    }
    abort_release(a);
    return aborted;
}

#ifdef NCCL_MAJOR
/* Compiled against nccl.h (tests/unit/test_nccl_plane.py): each slot has the type of the
 * function dlsym fills it from, and the constants and the config prefix are the header's. */
#include <stddef.h>
#define SAME(slot, fn) \
    _Static_assert(__builtin_types_compatible_p(__typeof__(hvl__nccl.slot), __typeof__(&fn)), #fn)
SAME(get_version, ncclGetVersion); SAME(get_unique_id, ncclGetUniqueId);
SAME(comm_abort, ncclCommAbort);
SAME(comm_get_async_error, ncclCommGetAsyncError); SAME(get_error_string, ncclGetErrorString);
SAME(get_last_error, ncclGetLastError); SAME(all_reduce, ncclAllReduce); SAME(broadcast, ncclBroadcast);
SAME(reduce_scatter, ncclReduceScatter); SAME(group_start, ncclGroupStart); SAME(group_end, ncclGroupEnd);
SAME(premulsum_create, ncclRedOpCreatePreMulSum); SAME(red_op_destroy, ncclRedOpDestroy);
SAME(all_gather, ncclAllGather); SAME(send, ncclSend); SAME(recv, ncclRecv);
_Static_assert(__builtin_types_compatible_p(__typeof__(hvl__nccl.comm_init_rank_config),
               ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int, nccl_config *)), "init");
#define AT(ours, theirs) _Static_assert(offsetof(nccl_config, ours) == offsetof(ncclConfig_t, theirs), #theirs)
AT(size, size); AT(magic, magic); AT(version, version); AT(blocking, blocking);
AT(cga_cluster_size, cgaClusterSize); AT(min_ctas, minCTAs); AT(max_ctas, maxCTAs); AT(net_name, netName);
_Static_assert(NC_SUCCESS == ncclSuccess && NC_IN_PROGRESS == ncclInProgress, "results");
_Static_assert(NC_INT8 == ncclInt8 && NC_UINT8 == ncclUint8 && NC_INT32 == ncclInt32 && NC_INT64 == ncclInt64 &&
               NC_FLOAT16 == ncclFloat16 && NC_FLOAT32 == ncclFloat32 && NC_FLOAT64 == ncclFloat64 &&
               NC_BFLOAT16 == ncclBfloat16, "types");
_Static_assert(NC_SUM == ncclSum && NC_PROD == ncclProd && NC_MAX == ncclMax && NC_MIN == ncclMin &&
               NC_AVG == ncclAvg && NC_SCALAR_HOST == ncclScalarHostImmediate && NC_API_MAGIC == NCCL_API_MAGIC,
               "ops");
_Static_assert(sizeof(ncclUniqueId) == 128, "unique id");
#endif
