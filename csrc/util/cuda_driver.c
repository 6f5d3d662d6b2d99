/* cuda_driver.c: the CUDA driver API, opened at run time (cuda_driver.h says why and what).
 * Owns the library handle and its function table (written once under pthread_once, read-only
 * after), and per device the engine's stream (the device's greatest priority, as Horovod's, so
 * its copies and collectives are not queued behind the framework's kernels), its mark event,
 * the retained primary context, the events the engine let go (kept for reuse: a staged batch
 * in pieces takes up to 4096 a batch) and the default memory pool's release threshold it raised
 * (bg thread only). The declarations follow the driver API's documented signatures; the
 * versioned names (_v2) are the ones cuda.h maps its calls to. Nothing here knows the engine. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "cuda_driver.h"
#include "util.h"

#ifndef CUDA_VERSION    /* the build: no toolkit. tests/unit/test_cuda_driver.py compiles this
                           file against NVIDIA's cuda.h too, which then supplies these types */
typedef int CUresult;                          /* 0: success */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice_attribute;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef int CUmemPool_attribute;
#endif

#define CU_SUCCESS 0                  /* CUDA_SUCCESS */
#define CU_NOT_READY 600              /* CUDA_ERROR_NOT_READY */
#define CU_OUT_OF_MEMORY 2            /* CUDA_ERROR_OUT_OF_MEMORY */
#define STREAM_NON_BLOCKING 1u        /* CU_STREAM_NON_BLOCKING */
#define EVENT_DISABLE_TIMING 2u       /* CU_EVENT_DISABLE_TIMING */
#define HOST_ALLOC_PORTABLE 1u        /* CU_MEMHOSTALLOC_PORTABLE */
#define ATTRIBUTE_MEMORY_POOLS 115    /* CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED */
#define POOL_RELEASE_THRESHOLD 4      /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
#define POOL_USED_MEM_HIGH 8          /* CU_MEMPOOL_ATTR_USED_MEM_HIGH */
#define EVENTS_KEPT 8192              /* per device and kind: a staged batch's pieces, and tickets */

static struct {
    CUresult (*init)(unsigned int flags);
    CUresult (*driver_version)(int *version);
    CUresult (*device_get)(CUdevice *dev, int ordinal);
    CUresult (*ctx_retain)(CUcontext *ctx, CUdevice dev);
    CUresult (*ctx_release)(CUdevice dev);
    CUresult (*ctx_set_current)(CUcontext ctx);
    CUresult (*ctx_get_current)(CUcontext *ctx);
    CUresult (*ctx_state)(CUdevice dev, unsigned int *flags, int *active);
    CUresult (*stream_create)(CUstream *stream, unsigned int flags, int priority);
    CUresult (*priority_range)(int *least, int *greatest);
    CUresult (*stream_destroy)(CUstream stream);
    CUresult (*stream_wait_event)(CUstream stream, CUevent event, unsigned int flags);
    CUresult (*event_create)(CUevent *event, unsigned int flags);
    CUresult (*event_destroy)(CUevent event);
    CUresult (*event_record)(CUevent event, CUstream stream);
    CUresult (*event_query)(CUevent event);
    CUresult (*copy_to_host)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*copy_to_device)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
    CUresult (*copy_on_device)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*host_alloc)(void **p, size_t bytes, unsigned int flags);
    CUresult (*host_free)(void *p);
    CUresult (*bus_id)(char *id, int len, CUdevice dev);
    CUresult (*mem_alloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*mem_free)(CUdeviceptr p);
    CUresult (*memset_async)(CUdeviceptr p, unsigned char value, size_t n, CUstream stream);
    /* Optional: results on the GPU (CUDA 11.2 drivers), the timeline's GPU timing. */
    CUresult (*device_attribute)(int *value, CUdevice_attribute attribute, CUdevice dev);
    CUresult (*mem_alloc_async)(CUdeviceptr *p, size_t bytes, CUstream stream);
    CUresult (*mem_free_async)(CUdeviceptr p, CUstream stream);
    CUresult (*default_pool)(CUmemoryPool *pool, CUdevice dev);
    CUresult (*pool_get)(CUmemoryPool pool, CUmemPool_attribute attribute, void *value);
    CUresult (*pool_set)(CUmemoryPool pool, CUmemPool_attribute attribute, void *value);
    CUresult (*event_elapsed)(float *ms, CUevent start, CUevent end);
    CUresult (*error_name)(CUresult rc, const char **name);
    CUresult (*error_string)(CUresult rc, const char **text);
} cu;

/* The table above, by exported name: dlsym fills each slot. */
#define SYMBOL(slot, name) HVL_SYMBOL(cu, slot, name)
static const hvl_symbol symbols[] = {
    SYMBOL(init, "cuInit"), SYMBOL(driver_version, "cuDriverGetVersion"),
    SYMBOL(device_get, "cuDeviceGet"), SYMBOL(ctx_retain, "cuDevicePrimaryCtxRetain"),
    SYMBOL(ctx_release, "cuDevicePrimaryCtxRelease_v2"), SYMBOL(ctx_set_current, "cuCtxSetCurrent"),
    SYMBOL(stream_create, "cuStreamCreateWithPriority"), SYMBOL(priority_range, "cuCtxGetStreamPriorityRange"),
    SYMBOL(stream_destroy, "cuStreamDestroy_v2"),
    SYMBOL(stream_wait_event, "cuStreamWaitEvent"), SYMBOL(event_create, "cuEventCreate"),
    SYMBOL(event_destroy, "cuEventDestroy_v2"), SYMBOL(event_record, "cuEventRecord"),
    SYMBOL(event_query, "cuEventQuery"), SYMBOL(copy_to_host, "cuMemcpyDtoHAsync_v2"),
    SYMBOL(copy_to_device, "cuMemcpyHtoDAsync_v2"), SYMBOL(copy_on_device, "cuMemcpyDtoDAsync_v2"),
    SYMBOL(host_alloc, "cuMemHostAlloc"),
    SYMBOL(host_free, "cuMemFreeHost"), SYMBOL(bus_id, "cuDeviceGetPCIBusId"),
    SYMBOL(mem_alloc, "cuMemAlloc_v2"), SYMBOL(mem_free, "cuMemFree_v2"),
    SYMBOL(memset_async, "cuMemsetD8Async"), SYMBOL(error_name, "cuGetErrorName"),
    SYMBOL(ctx_get_current, "cuCtxGetCurrent"), SYMBOL(ctx_state, "cuDevicePrimaryCtxGetState"),
    SYMBOL(error_string, "cuGetErrorString"),
};
#undef SYMBOL

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_status = HVL_ERR_CUDA;
static char load_error[512];
static int driver_version;

/* bg thread only: what the engine made on each device it used. */
typedef struct {
    CUevent *kept;              /* events let go, for reuse */
    int count, cap;
} event_list;
static struct {
    CUcontext ctx;              /* retained primary context; NULL: device not used yet */
    CUstream stream;
    CUevent mark;
    event_list events[2];       /* [0] untimed, [1] timed */
    CUmemoryPool pool;          /* the default pool, once looked up */
    unsigned long long threshold;   /* its release threshold, as last read or raised */
} devices[HVL_CUDA_MAX_DEVICES];

/* The driver's status as the engine's: HVL_ERR_CUDA with the call, the error's name and text. */
static int check(CUresult rc, const char *what)
{
    if (rc == CU_SUCCESS) return HVL_OK;
    const char *name = NULL, *text = NULL;
    if (cu.error_name) cu.error_name(rc, &name);
    if (cu.error_string) cu.error_string(rc, &text);
    return hvl__fail(HVL_ERR_CUDA, "CUDA: %s failed: %s (%d): %s", what, name ? name : "CUDA error",
                     rc, text ? text : "no description");
}

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof(load_error), "the CUDA driver could not be loaded (%s): no "
                 "NVIDIA driver on this machine", dlerror());
        return;
    }
    const char *missing = hvl__bind_symbols(lib, symbols, sizeof(symbols) / sizeof(symbols[0]));
    if (missing) {
        snprintf(load_error, sizeof(load_error), "the CUDA driver libcuda.so.1 has no %s: the driver is "
                 "too old", missing);
        return;
    }
    if (check(cu.init(0), "cuInit") != HVL_OK || check(cu.driver_version(&driver_version),
                                                       "cuDriverGetVersion") != HVL_OK) {
        snprintf(load_error, sizeof(load_error), "%s", hvl_last_error());
        return;
    }
    /* Optional (NULL where the driver lacks them); cuda.h maps cuEventElapsedTime to _v2 from
     * CUDA 12.8. */
    *(void **)&cu.device_attribute = dlsym(lib, "cuDeviceGetAttribute");
    *(void **)&cu.mem_alloc_async = dlsym(lib, "cuMemAllocAsync");
    *(void **)&cu.mem_free_async = dlsym(lib, "cuMemFreeAsync");
    *(void **)&cu.default_pool = dlsym(lib, "cuDeviceGetDefaultMemPool");
    *(void **)&cu.pool_get = dlsym(lib, "cuMemPoolGetAttribute");
    *(void **)&cu.pool_set = dlsym(lib, "cuMemPoolSetAttribute");
    *(void **)&cu.event_elapsed = dlsym(lib, "cuEventElapsedTime_v2");
    if (!cu.event_elapsed) *(void **)&cu.event_elapsed = dlsym(lib, "cuEventElapsedTime");
    __atomic_store_n(&load_status, HVL_OK, __ATOMIC_RELEASE);
}

int hvl__cuda_load(void)
{
    pthread_once(&load_once, load);
    return load_status == HVL_OK ? HVL_OK : hvl__fail(load_status, "%s", load_error);
}

int hvl__cuda_loaded(void)
{
    return __atomic_load_n(&load_status, __ATOMIC_ACQUIRE) == HVL_OK && driver_version > 0;
}

int hvl__cuda_driver_version(void) { return hvl__cuda_loaded() ? driver_version : 0; }

/* First use of a device: retain its primary context, make the stream and the mark event (in
 * that order; hvl__cuda_release frees whatever a failed set-up made). */
static int open_device(int dev)
{
    CUdevice handle;
    HVL_CHECK(check(cu.device_get(&handle, dev), "cuDeviceGet"));
    HVL_CHECK(check(cu.ctx_retain(&devices[dev].ctx, handle), "cuDevicePrimaryCtxRetain"));
    if (!devices[dev].ctx) return hvl__fail(HVL_ERR_CUDA, "CUDA: device %d has no context", dev);
    HVL_CHECK(check(cu.ctx_set_current(devices[dev].ctx), "cuCtxSetCurrent"));
    int least = 0, greatest = 0;
    HVL_CHECK(check(cu.priority_range(&least, &greatest), "cuCtxGetStreamPriorityRange"));
    HVL_CHECK(check(cu.stream_create(&devices[dev].stream, STREAM_NON_BLOCKING, greatest), "cuStreamCreateWithPriority"));
    return check(cu.event_create(&devices[dev].mark, EVENT_DISABLE_TIMING), "cuEventCreate");
}

int hvl__cuda_use(int dev)
{
    HVL_CHECK(hvl__cuda_load());
    if (dev < 0 || dev >= HVL_CUDA_MAX_DEVICES)
        return hvl__fail(HVL_ERR_CUDA, "CUDA device %d: hvlite handles devices 0 to %d", dev,
                         HVL_CUDA_MAX_DEVICES - 1);
    if (!devices[dev].ctx) return open_device(dev);
    if (!devices[dev].mark)     /* made last: a device whose set-up failed is not retried */
        return hvl__fail(HVL_ERR_CUDA, "CUDA device %d could not be set up for hvlite earlier", dev);
    return check(cu.ctx_set_current(devices[dev].ctx), "cuCtxSetCurrent");
}

int hvl__cuda_adopt(int dev)
{
    if (!hvl__cuda_loaded() || dev < 0 || dev >= HVL_CUDA_MAX_DEVICES || !devices[dev].ctx)
        return hvl__fail(HVL_ERR_CUDA, "CUDA device %d: not in use by hvlite", dev);
    return check(cu.ctx_set_current(devices[dev].ctx), "cuCtxSetCurrent");
}

int hvl__cuda_wait_event(int dev, void *event)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.stream_wait_event(devices[dev].stream, (CUevent)event, 0), "cuStreamWaitEvent");
}

int hvl__cuda_copy_to_host(int dev, void *host, const void *device, int64_t bytes)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.copy_to_host(host, (CUdeviceptr)(uintptr_t)device, (size_t)bytes, devices[dev].stream),
                 "cuMemcpyDtoHAsync (device to host)");
}

int hvl__cuda_copy_to_device(int dev, void *device, const void *host, int64_t bytes)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.copy_to_device((CUdeviceptr)(uintptr_t)device, host, (size_t)bytes, devices[dev].stream),
                 "cuMemcpyHtoDAsync (host to device)");
}

int hvl__cuda_copy_on_device(int dev, void *dst, const void *src, int64_t bytes)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.copy_on_device((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, (size_t)bytes,
                                   devices[dev].stream), "cuMemcpyDtoDAsync (device to device)");
}

int hvl__cuda_mark(int dev)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.event_record(devices[dev].mark, devices[dev].stream), "cuEventRecord");
}

int hvl__cuda_mark_reached(int dev, int *done)
{
    HVL_CHECK(hvl__cuda_use(dev));
    CUresult rc = cu.event_query(devices[dev].mark);
    *done = rc == CU_SUCCESS;
    return rc == CU_NOT_READY ? HVL_OK : check(rc, "cuEventQuery");
}

int hvl__cuda_host_alloc(int dev, void **out, int64_t bytes)
{
    *out = NULL;
    HVL_CHECK(hvl__cuda_use(dev));      /* cuMemHostAlloc needs a current context */
    return check(cu.host_alloc(out, (size_t)(bytes > 0 ? bytes : 1), HOST_ALLOC_PORTABLE),
                 "cuMemHostAlloc (page-locked staging memory)");
}

static int device_stuck;           /* hvl__cuda_stuck: device frees leak from then on */

void hvl__cuda_stuck(void)
{
    if (!__atomic_exchange_n(&device_stuck, 1, __ATOMIC_RELAXED))
        hvl__log(HVL_LOG_WARNING, "the GPU may never finish hvlite's work queued on it: hvlite's "
                 "GPU memory is left allocated from now on (freeing it would wait for the device)");
}

static int may_free(void) { return !__atomic_load_n(&device_stuck, __ATOMIC_RELAXED); }

void hvl__cuda_host_free(void *p)
{
    if (!p || !hvl__cuda_loaded() || !may_free()) return;
    for (int dev = 0; dev < HVL_CUDA_MAX_DEVICES; dev++)     /* any context of ours will do */
        if (devices[dev].ctx && cu.ctx_set_current(devices[dev].ctx) == CU_SUCCESS) break;
    cu.host_free(p);
}

int hvl__cuda_stream(int dev, void **stream)
{
    *stream = NULL;
    HVL_CHECK(hvl__cuda_use(dev));
    *stream = devices[dev].stream;
    return HVL_OK;
}

int hvl__cuda_bus_id(int dev, char *out, int len)
{
    CUdevice handle;
    out[0] = '\0';
    HVL_CHECK(hvl__cuda_use(dev));
    HVL_CHECK(check(cu.device_get(&handle, dev), "cuDeviceGet"));
    return check(cu.bus_id(out, len, handle), "cuDeviceGetPCIBusId");
}

int hvl__cuda_device_alloc(int dev, void **out, int64_t bytes)
{
    CUdeviceptr p = 0;
    *out = NULL;
    HVL_CHECK(hvl__cuda_use(dev));
    HVL_CHECK(check(cu.mem_alloc(&p, (size_t)(bytes > 0 ? bytes : 1)), "cuMemAlloc"));
    *out = (void *)(uintptr_t)p;
    return HVL_OK;
}

void hvl__cuda_device_free(int dev, void *p)
{
    if (p && may_free() && hvl__cuda_use(dev) == HVL_OK) cu.mem_free((CUdeviceptr)(uintptr_t)p);
}

int hvl__cuda_zero(int dev, void *device, int64_t bytes)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.memset_async((CUdeviceptr)(uintptr_t)device, 0, (size_t)bytes, devices[dev].stream),
                 "cuMemsetD8Async");
}

/* A kept event of the kind, or a new one. */
int hvl__cuda_event_new(int dev, int timed, void **event)
{
    CUevent ev = NULL;
    *event = NULL;
    HVL_CHECK(hvl__cuda_use(dev));
    if (timed && !cu.event_elapsed) return hvl__fail(HVL_ERR_CUDA, "CUDA: the driver has no cuEventElapsedTime");
    event_list *kept = &devices[dev].events[timed != 0];
    if (kept->count) {
        *event = kept->kept[--kept->count];
        return HVL_OK;
    }
    HVL_CHECK(check(cu.event_create(&ev, timed ? 0 : EVENT_DISABLE_TIMING), "cuEventCreate"));
    *event = ev;
    return HVL_OK;
}

int hvl__cuda_event_record(int dev, void *event)
{
    HVL_CHECK(hvl__cuda_use(dev));
    return check(cu.event_record((CUevent)event, devices[dev].stream), "cuEventRecord");
}

int hvl__cuda_event_reached(int dev, void *event, int *done)
{
    HVL_CHECK(hvl__cuda_use(dev));
    CUresult rc = cu.event_query((CUevent)event);
    *done = rc == CU_SUCCESS;
    return rc == CU_NOT_READY ? HVL_OK : check(rc, "cuEventQuery");
}

int hvl__cuda_event_seconds(int dev, void *from, void *to, double *seconds)
{
    float ms = 0;
    *seconds = 0;
    HVL_CHECK(hvl__cuda_use(dev));
    HVL_CHECK(check(cu.event_elapsed(&ms, (CUevent)from, (CUevent)to), "cuEventElapsedTime"));
    *seconds = ms / 1e3;
    return HVL_OK;
}

/* Kept for reuse (a later record overwrites its state; nothing waits on it any more), up to
 * EVENTS_KEPT of a kind; destroyed past that. */
void hvl__cuda_event_free(int dev, void *event, int timed)
{
    if (!event || hvl__cuda_use(dev) != HVL_OK) return;
    event_list *kept = &devices[dev].events[timed != 0];
    if (kept->count == kept->cap && kept->cap < EVENTS_KEPT) {
        int cap = kept->cap ? kept->cap * 2 : 64;
        CUevent *grown = realloc(kept->kept, sizeof(CUevent) * (size_t)cap);
        if (grown) kept->kept = grown, kept->cap = cap;
    }
    if (kept->count < kept->cap) kept->kept[kept->count++] = (CUevent)event;
    else cu.event_destroy((CUevent)event);
}


int hvl__cuda_pools(int dev, int *supported)
{
    CUdevice handle;
    *supported = 0;
    HVL_CHECK(hvl__cuda_use(dev));
    if (!cu.device_attribute || !cu.mem_alloc_async || !cu.mem_free_async) return HVL_OK;   /* before 11.2 */
    HVL_CHECK(check(cu.device_get(&handle, dev), "cuDeviceGet"));
    return check(cu.device_attribute(supported, ATTRIBUTE_MEMORY_POOLS, handle),
                 "cuDeviceGetAttribute (memory pools)");
}

/* The default pool gives memory back to the system at every synchronisation (the stream's, an
 * event's, the device's: torch.cuda.synchronize()) past its release threshold, 0 by default: the
 * next allocation then maps it again. Its threshold is raised (never lowered: PyTorch's
 * cudaMallocAsync backend sets its own) to the most the pool has had in use at once, so the
 * engine's allocations of a step find their memory still mapped the next step. Best effort:
 * where the driver cannot, the pool behaves as before. */
static void keep_pool_memory(int dev)
{
    CUdevice handle;
    unsigned long long high = 0, now = 0;
    if (!cu.default_pool || !cu.pool_get || !cu.pool_set) return;
    if (!devices[dev].pool && (cu.device_get(&handle, dev) != CU_SUCCESS ||
                               cu.default_pool(&devices[dev].pool, handle) != CU_SUCCESS))
        return;
    if (cu.pool_get(devices[dev].pool, POOL_USED_MEM_HIGH, &high) != CU_SUCCESS || high <= devices[dev].threshold)
        return;
    if (cu.pool_get(devices[dev].pool, POOL_RELEASE_THRESHOLD, &now) != CU_SUCCESS) return;
    if (now < high && cu.pool_set(devices[dev].pool, POOL_RELEASE_THRESHOLD, &high) == CU_SUCCESS) now = high;
    devices[dev].threshold = now;
}

int hvl__cuda_result_alloc(int dev, void **out, int64_t bytes)
{
    CUdeviceptr p = 0;
    *out = NULL;
    HVL_CHECK(hvl__cuda_use(dev));
    if (!cu.mem_alloc_async) return hvl__fail(HVL_ERR_CUDA, "CUDA: the driver has no cuMemAllocAsync");
    CUresult rc = cu.mem_alloc_async(&p, (size_t)(bytes > 0 ? bytes : 1), devices[dev].stream);
    if (rc == CU_OUT_OF_MEMORY) {
        check(rc, "cuMemAllocAsync (GPU memory from the default pool)");
        return hvl__fail(HVL_ERR_NO_MEMORY, "%s", hvl_last_error());
    }
    HVL_CHECK(check(rc, "cuMemAllocAsync (GPU memory from the default pool)"));
    *out = (void *)(uintptr_t)p;
    keep_pool_memory(dev);
    return HVL_OK;
}

void hvl__cuda_stream_free(int dev, void *p)
{
    if (p && cu.mem_free_async && may_free() && hvl__cuda_use(dev) == HVL_OK)
        cu.mem_free_async((CUdeviceptr)(uintptr_t)p, devices[dev].stream);
}

/* Any thread, so the caller's current context is put back: the frameworks keep their device in
 * it. The primary context is retained for the call (the engine may have released its own), but
 * only while it is alive: once every user released it (a process at exit), its memory went with
 * it, and retaining it would make a whole new context to free one pointer. */
void hvl__cuda_result_free(int dev, void *p, void *stream)
{
    CUdevice handle;
    CUcontext mine = NULL, theirs = NULL;
    unsigned int flags = 0;
    int alive = 0;
    if (!p || !hvl__cuda_loaded() || !cu.mem_free_async || dev < 0 || dev >= HVL_CUDA_MAX_DEVICES) return;
    if (cu.device_get(&handle, dev) != CU_SUCCESS || cu.ctx_state(handle, &flags, &alive) != CU_SUCCESS || !alive)
        return;
    if (cu.ctx_retain(&mine, handle) != CU_SUCCESS) return;
    cu.ctx_get_current(&theirs);
    if (cu.ctx_set_current(mine) == CU_SUCCESS) cu.mem_free_async((CUdeviceptr)(uintptr_t)p, (CUstream)stream);
    cu.ctx_set_current(theirs);
    cu.ctx_release(handle);
}

void hvl__cuda_release(void)
{
    if (!hvl__cuda_loaded()) return;
    for (int dev = 0; dev < HVL_CUDA_MAX_DEVICES; dev++) {
        if (!devices[dev].ctx) continue;
        CUdevice handle;
        cu.ctx_set_current(devices[dev].ctx);
        if (devices[dev].mark) cu.event_destroy(devices[dev].mark);
        for (int kind = 0; kind < 2; kind++) {
            event_list *kept = &devices[dev].events[kind];
            for (int i = 0; i < kept->count; i++) cu.event_destroy(kept->kept[i]);
            free(kept->kept);
        }
        if (devices[dev].stream) cu.stream_destroy(devices[dev].stream);
        if (cu.device_get(&handle, dev) == CU_SUCCESS) cu.ctx_release(handle);
        memset(&devices[dev], 0, sizeof(devices[dev]));
    }
}

#ifdef CUDA_VERSION
/* Compiled against cuda.h (the test above): every slot has the type of the function dlsym fills
 * it from, and the constants are the header's. */
#define SAME(slot, fn) _Static_assert(__builtin_types_compatible_p(__typeof__(cu.slot), __typeof__(&fn)), #fn)
SAME(init, cuInit); SAME(driver_version, cuDriverGetVersion); SAME(device_get, cuDeviceGet);
SAME(ctx_retain, cuDevicePrimaryCtxRetain); SAME(ctx_release, cuDevicePrimaryCtxRelease_v2);
SAME(ctx_set_current, cuCtxSetCurrent); SAME(stream_create, cuStreamCreateWithPriority);
SAME(stream_destroy, cuStreamDestroy_v2); SAME(priority_range, cuCtxGetStreamPriorityRange); SAME(stream_wait_event, cuStreamWaitEvent);
SAME(event_create, cuEventCreate); SAME(event_destroy, cuEventDestroy_v2);
SAME(event_record, cuEventRecord); SAME(event_query, cuEventQuery);
SAME(copy_to_host, cuMemcpyDtoHAsync_v2); SAME(copy_to_device, cuMemcpyHtoDAsync_v2);
SAME(copy_on_device, cuMemcpyDtoDAsync_v2);
SAME(host_alloc, cuMemHostAlloc); SAME(host_free, cuMemFreeHost); SAME(bus_id, cuDeviceGetPCIBusId);
SAME(mem_alloc, cuMemAlloc_v2); SAME(mem_free, cuMemFree_v2); SAME(memset_async, cuMemsetD8Async);
SAME(error_name, cuGetErrorName); SAME(event_elapsed, cuEventElapsedTime); SAME(error_string, cuGetErrorString);
SAME(ctx_get_current, cuCtxGetCurrent); SAME(device_attribute, cuDeviceGetAttribute);
SAME(mem_alloc_async, cuMemAllocAsync); SAME(mem_free_async, cuMemFreeAsync);
SAME(ctx_state, cuDevicePrimaryCtxGetState); SAME(default_pool, cuDeviceGetDefaultMemPool);
SAME(pool_get, cuMemPoolGetAttribute); SAME(pool_set, cuMemPoolSetAttribute);
_Static_assert(ATTRIBUTE_MEMORY_POOLS == (int)CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, "attribute");
_Static_assert(POOL_RELEASE_THRESHOLD == (int)CU_MEMPOOL_ATTR_RELEASE_THRESHOLD &&
               POOL_USED_MEM_HIGH == (int)CU_MEMPOOL_ATTR_USED_MEM_HIGH, "pool attributes");
_Static_assert(CU_SUCCESS == (int)CUDA_SUCCESS && CU_NOT_READY == (int)CUDA_ERROR_NOT_READY &&
               CU_OUT_OF_MEMORY == (int)CUDA_ERROR_OUT_OF_MEMORY, "codes");
_Static_assert(STREAM_NON_BLOCKING == (unsigned)CU_STREAM_NON_BLOCKING && EVENT_DISABLE_TIMING ==
               (unsigned)CU_EVENT_DISABLE_TIMING && HOST_ALLOC_PORTABLE == CU_MEMHOSTALLOC_PORTABLE, "flags");
#endif
