/* Test probe (tests/unit/test_cuda_driver_single.py): the engine's CUDA driver binding
 * (util/cuda_driver.c) on a machine without a GPU. The file is compiled into this probe with
 * dlopen and dlsym going to the probe, which hands it a driver of its own: each cu* call is
 * logged with its arguments and answered as the test says (the primary context alive or not,
 * the default pool's high-water mark and release threshold). Nothing runs on a device; the
 * test reads from the log what the binding asked of the driver. Clock, errors and logging are
 * the engine's own, loaded beside it. The binding on a real driver is tested in tests/gpu. */
#include <dlfcn.h>              /* the real declarations first: the names below are the probe's */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
void *probe_dlopen(const char *file, int mode);
void *probe_dlsym(void *lib, const char *name);
const char *probe_bind_symbols(void *lib, const hvl_symbol *symbols, size_t n);
#define dlopen probe_dlopen
#define dlsym probe_dlsym
#define hvl__bind_symbols probe_bind_symbols
#define hvl__cuda_load probe_cuda_load
#define hvl__cuda_loaded probe_cuda_loaded
#define hvl__cuda_driver_version probe_cuda_driver_version
#define hvl__cuda_use probe_cuda_use
#define hvl__cuda_adopt probe_cuda_adopt
#define hvl__cuda_wait_event probe_cuda_wait_event
#define hvl__cuda_copy_to_host probe_cuda_copy_to_host
#define hvl__cuda_copy_to_device probe_cuda_copy_to_device
#define hvl__cuda_copy_on_device probe_cuda_copy_on_device
#define hvl__cuda_mark probe_cuda_mark
#define hvl__cuda_mark_reached probe_cuda_mark_reached
#define hvl__cuda_host_alloc probe_cuda_host_alloc
#define hvl__cuda_host_free probe_cuda_host_free
#define hvl__cuda_stuck probe_cuda_stuck
#define hvl__cuda_stream probe_cuda_stream
#define hvl__cuda_bus_id probe_cuda_bus_id
#define hvl__cuda_device_alloc probe_cuda_device_alloc
#define hvl__cuda_device_free probe_cuda_device_free
#define hvl__cuda_zero probe_cuda_zero
#define hvl__cuda_event_new probe_cuda_event_new
#define hvl__cuda_event_record probe_cuda_event_record
#define hvl__cuda_event_reached probe_cuda_event_reached
#define hvl__cuda_event_seconds probe_cuda_event_seconds
#define hvl__cuda_event_free probe_cuda_event_free
#define hvl__cuda_pools probe_cuda_pools
#define hvl__cuda_result_alloc probe_cuda_result_alloc
#define hvl__cuda_stream_free probe_cuda_stream_free
#define hvl__cuda_result_free probe_cuda_result_free
#define hvl__cuda_release probe_cuda_release
#include "../../csrc/util/cuda_driver.c"

/* ---- the log: one record per driver call, a name and its numbers ---- */
typedef struct {
    const char *name;
    int64_t a[4];
} log_record;
#define LOG_MAX 100000
static log_record records[LOG_MAX];
static int nrecords, dropped;

static CUresult note(const char *name, int64_t a0, int64_t a1, int64_t a2, int64_t a3)
{
    if (nrecords < LOG_MAX) records[nrecords++] = (log_record){name, {a0, a1, a2, a3}};
    else dropped++;
    return CU_SUCCESS;
}

/* ---- the driver ---- */
#define CTX ((CUcontext)(intptr_t)0xc7c7)
#define OTHER_CTX ((CUcontext)(intptr_t)0xa1a1)     /* the caller's own current context */
#define POOL ((CUmemoryPool)(intptr_t)0x9001)
static int ctx_alive = 1;                /* cuDevicePrimaryCtxGetState's answer */
static CUcontext current;                /* the calling thread's, as the driver keeps it */
static unsigned long long pool_used_high, pool_threshold;
static int64_t next_handle = 0x10000;

static CUresult d_init(unsigned int flags) { return note("cuInit", flags, 0, 0, 0); }
static CUresult d_version(int *v) { *v = 13000; return CU_SUCCESS; }
static CUresult d_device_get(CUdevice *dev, int ordinal) { *dev = ordinal; return CU_SUCCESS; }
static CUresult d_retain(CUcontext *ctx, CUdevice dev) { *ctx = CTX; return note("retain", dev, 0, 0, 0); }
static CUresult d_release(CUdevice dev) { return note("release", dev, 0, 0, 0); }
static CUresult d_set_current(CUcontext ctx) { current = ctx; return note("set_current", (intptr_t)ctx, 0, 0, 0); }
static CUresult d_get_current(CUcontext *ctx) { *ctx = current; return CU_SUCCESS; }
static CUresult d_ctx_state(CUdevice dev, unsigned int *flags, int *active)
{
    *flags = 0;
    *active = ctx_alive;
    return note("ctx_state", dev, ctx_alive, 0, 0);
}
static CUresult d_stream_create(CUstream *s, unsigned int flags, int priority)
{
    *s = (CUstream)(intptr_t)next_handle++;
    return note("stream_create", (intptr_t)*s, flags, priority, 0);
}
static CUresult d_priority_range(int *least, int *greatest)
{
    *least = 0;
    *greatest = -5;
    return note("priority_range", 0, 0, 0, 0);
}
static CUresult d_stream_destroy(CUstream s) { return note("stream_destroy", (intptr_t)s, 0, 0, 0); }
static CUresult d_wait_event(CUstream s, CUevent e, unsigned int f) { return note("wait_event", (intptr_t)s, (intptr_t)e, f, 0); }
static CUresult d_event_create(CUevent *e, unsigned int flags)
{
    *e = (CUevent)(intptr_t)next_handle++;
    return note("event_create", (intptr_t)*e, flags, 0, 0);
}
static CUresult d_event_destroy(CUevent e) { return note("event_destroy", (intptr_t)e, 0, 0, 0); }
static CUresult d_event_record(CUevent e, CUstream s) { return note("event_record", (intptr_t)e, (intptr_t)s, 0, 0); }
static CUresult d_event_query(CUevent e) { note("event_query", (intptr_t)e, 0, 0, 0); return CU_SUCCESS; }
static CUresult d_event_elapsed(float *ms, CUevent a, CUevent b) { *ms = 1; return note("elapsed", (intptr_t)a, (intptr_t)b, 0, 0); }
static CUresult d_copy_dh(void *d, CUdeviceptr s, size_t n, CUstream st) { return note("copy", (intptr_t)d, (int64_t)s, (int64_t)n, (intptr_t)st); }
static CUresult d_copy_hd(CUdeviceptr d, const void *s, size_t n, CUstream st) { return note("copy", (int64_t)d, (intptr_t)s, (int64_t)n, (intptr_t)st); }
static CUresult d_copy_dd(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return note("copy", (int64_t)d, (int64_t)s, (int64_t)n, (intptr_t)st); }
static CUresult d_host_alloc(void **p, size_t n, unsigned int f) { *p = malloc(n); return note("host_alloc", (intptr_t)*p, (int64_t)n, f, 0); }
static CUresult d_host_free(void *p) { note("host_free", (intptr_t)p, 0, 0, 0); free(p); return CU_SUCCESS; }
static CUresult d_bus_id(char *id, int len, CUdevice dev) { snprintf(id, (size_t)len, "0000:%02x:00.0", dev); return CU_SUCCESS; }
static CUresult d_mem_alloc(CUdeviceptr *p, size_t n) { *p = (CUdeviceptr)next_handle++ << 16; return note("mem_alloc", (int64_t)*p, (int64_t)n, 0, 0); }
static CUresult d_mem_free(CUdeviceptr p) { return note("mem_free", (int64_t)p, 0, 0, 0); }
static CUresult d_memset(CUdeviceptr p, unsigned char v, size_t n, CUstream s) { return note("memset", (int64_t)p, v, (int64_t)n, (intptr_t)s); }
static CUresult d_attribute(int *v, CUdevice_attribute a, CUdevice dev) { *v = 1; return note("attribute", a, dev, 0, 0); }
static CUresult d_alloc_async(CUdeviceptr *p, size_t n, CUstream s)
{
    *p = (CUdeviceptr)next_handle++ << 16;
    return note("alloc_async", (int64_t)*p, (int64_t)n, (intptr_t)s, 0);
}
static CUresult d_free_async(CUdeviceptr p, CUstream s) { return note("free_async", (int64_t)p, (intptr_t)s, (intptr_t)current, 0); }
static CUresult d_default_pool(CUmemoryPool *pool, CUdevice dev) { *pool = POOL; return note("default_pool", dev, 0, 0, 0); }
static CUresult d_pool_get(CUmemoryPool pool, CUmemPool_attribute a, void *value)
{
    *(unsigned long long *)value = a == POOL_USED_MEM_HIGH ? pool_used_high : a == POOL_RELEASE_THRESHOLD ? pool_threshold : 0;
    return note("pool_get", (intptr_t)pool, a, 0, 0);
}
static CUresult d_pool_set(CUmemoryPool pool, CUmemPool_attribute a, void *value)
{
    if (a == POOL_RELEASE_THRESHOLD) pool_threshold = *(unsigned long long *)value;
    return note("pool_set", (intptr_t)pool, a, (int64_t)*(unsigned long long *)value, 0);
}
static CUresult d_error_name(CUresult rc, const char **s) { (void)rc; *s = "CUDA_ERROR_PROBE"; return CU_SUCCESS; }
static CUresult d_error_string(CUresult rc, const char **s) { (void)rc; *s = "the probe's error"; return CU_SUCCESS; }

static const struct { const char *name; void *fn; } driver[] = {
    {"cuInit", d_init}, {"cuDriverGetVersion", d_version}, {"cuDeviceGet", d_device_get},
    {"cuDevicePrimaryCtxRetain", d_retain}, {"cuDevicePrimaryCtxRelease_v2", d_release},
    {"cuCtxSetCurrent", d_set_current}, {"cuCtxGetCurrent", d_get_current},
    {"cuDevicePrimaryCtxGetState", d_ctx_state}, {"cuStreamCreateWithPriority", d_stream_create},
    {"cuCtxGetStreamPriorityRange", d_priority_range}, {"cuStreamDestroy_v2", d_stream_destroy},
    {"cuStreamWaitEvent", d_wait_event}, {"cuEventCreate", d_event_create}, {"cuEventDestroy_v2", d_event_destroy},
    {"cuEventRecord", d_event_record}, {"cuEventQuery", d_event_query}, {"cuMemcpyDtoHAsync_v2", d_copy_dh},
    {"cuMemcpyHtoDAsync_v2", d_copy_hd}, {"cuMemcpyDtoDAsync_v2", d_copy_dd}, {"cuMemHostAlloc", d_host_alloc},
    {"cuMemFreeHost", d_host_free}, {"cuDeviceGetPCIBusId", d_bus_id}, {"cuMemAlloc_v2", d_mem_alloc},
    {"cuMemFree_v2", d_mem_free}, {"cuMemsetD8Async", d_memset}, {"cuGetErrorName", d_error_name},
    {"cuGetErrorString", d_error_string}, {"cuDeviceGetAttribute", d_attribute}, {"cuMemAllocAsync", d_alloc_async},
    {"cuMemFreeAsync", d_free_async}, {"cuEventElapsedTime_v2", d_event_elapsed},
    {"cuDeviceGetDefaultMemPool", d_default_pool}, {"cuMemPoolGetAttribute", d_pool_get},
    {"cuMemPoolSetAttribute", d_pool_set},
};
#define LIBRARY ((void *)(intptr_t)0x11b)

void *probe_dlopen(const char *file, int mode)
{
    (void)mode;
    return strcmp(file, "libcuda.so.1") == 0 ? LIBRARY : NULL;
}
void *probe_dlsym(void *lib, const char *name)
{
    for (size_t i = 0; lib == LIBRARY && i < sizeof(driver) / sizeof(driver[0]); i++)
        if (strcmp(driver[i].name, name) == 0) return driver[i].fn;
    return NULL;
}
const char *probe_bind_symbols(void *lib, const hvl_symbol *symbols, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(*symbols[i].slot = probe_dlsym(lib, symbols[i].name))) return symbols[i].name;
    return NULL;
}

/* ---- the test's side ---- */
/* A fresh start: the devices released (their kept events destroyed), the log emptied, the
 * driver's answers back to their defaults. 0 once the binding loaded its driver. */
int probe_reset(void)
{
    probe_cuda_release();
    memset(devices, 0, sizeof(devices));
    device_stuck = 0;
    nrecords = dropped = 0;
    ctx_alive = 1;
    pool_used_high = pool_threshold = 0;
    current = NULL;
    return probe_cuda_load();
}
void probe_context(int alive) { ctx_alive = alive; }
void probe_pool(unsigned long long used_high, unsigned long long threshold)
{
    pool_used_high = used_high;
    pool_threshold = threshold;
}
void probe_make_current(int other) { current = other ? OTHER_CTX : NULL; }
int64_t probe_current(void) { return (intptr_t)current; }
int64_t probe_engine_stream(int dev) { return (intptr_t)devices[dev].stream; }

int probe_log_count(void) { return nrecords; }
int probe_log_dropped(void) { return dropped; }
const char *probe_log_name(int i) { return records[i].name; }
int64_t probe_log_arg(int i, int j) { return records[i].a[j]; }
