/* cuda_driver.h: the slice of the CUDA driver API the engine uses, loaded at run time.
 *
 * The engine builds with no CUDA toolkit and no build flag: libcuda.so.1 (whose ABI NVIDIA keeps
 * stable across driver versions) is opened with dlopen the first time a device buffer arrives
 * (hvl__cuda_load), so a process that never submits one never loads CUDA. The functions below
 * wrap the driver calls in the engine's error rule: each returns an hvl_status and sets the
 * message (the driver's own error name and text) where the call failed.
 *
 * Threads: hvl__cuda_load, _loaded, _adopt and _result_free from any thread; everything else on the
 * background thread only (the per-device streams and events below are its own). Pointers to
 * device memory are passed through as opaque values, never dereferenced. */
#ifndef HVLITE_CUDA_DRIVER_H
#define HVLITE_CUDA_DRIVER_H

#include <stdint.h>

#define HVL_CUDA_MAX_DEVICES 64

/* Loads libcuda.so.1 and every symbol below, and initialises the driver, once per process.
 * HVL_OK once loaded; otherwise HVL_ERR_CUDA with why (the library is missing, a symbol is
 * missing, or cuInit failed: no GPU, no driver), the same answer on every call. */
int hvl__cuda_load(void);
int hvl__cuda_loaded(void);            /* 1 once hvl__cuda_load succeeded; cannot fail */
int hvl__cuda_driver_version(void);    /* e.g. 13000 for CUDA 13.0; 0 if not loaded */

/* Each call below names a device (its ordinal) and first makes that device's primary context
 * (the one the frameworks use) current on this thread. The engine's stream on the device is
 * made on first use, non-blocking with respect to the legacy default stream, at the device's
 * greatest priority, and is the engine's until hvl__cuda_release. HVL_ERR_CUDA for a device the
 * driver does not have. */
int hvl__cuda_use(int dev);
/* Any thread: makes device `dev`'s context, which the background thread already took
 * (hvl__cuda_use), current on the calling thread; for a helper thread the bg thread started
 * after that. HVL_ERR_CUDA if the engine never used the device. */
int hvl__cuda_adopt(int dev);
/* Work queued on the engine's stream after this waits for `event` (recorded by the framework on
 * its own stream); the calling thread does not wait. */
int hvl__cuda_wait_event(int dev, void *event);
/* Asynchronous copies on the engine's stream; `host` must stay valid until the stream has
 * done them (see the mark). */
int hvl__cuda_copy_to_host(int dev, void *host, const void *device, int64_t bytes);
int hvl__cuda_copy_to_device(int dev, void *device, const void *host, int64_t bytes);
int hvl__cuda_copy_on_device(int dev, void *dst, const void *src, int64_t bytes);   /* same device */
/* Marks the current end of the engine's stream (an event of its own, reused); *done = 1 once
 * the stream has reached the mark. Neither call waits: the caller polls, bounded. */
int hvl__cuda_mark(int dev);
int hvl__cuda_mark_reached(int dev, int *done);
/* Page-locked host memory that every context can copy from asynchronously, allocated with
 * device `dev`'s context current; NULL-safe free (with one of the engine's contexts current).
 * The caller frees it only when no copy can still touch it. */
int hvl__cuda_host_alloc(int dev, void **out, int64_t bytes);
void hvl__cuda_host_free(void *p);
/* The engine's stream on the device (a CUstream / cudaStream_t), for libraries that queue work
 * on it (NCCL). */
int hvl__cuda_stream(int dev, void **stream);
/* The device's PCI bus id, "0000:3b:00.0": what tells two ranks' GPUs apart on one host. */
int hvl__cuda_bus_id(int dev, char *out, int len);
/* Device memory (cuMemAlloc), freed with the device's context current; NULL-safe free. The free
 * waits for the whole device (cuMemFree): only where nothing may still run there. */
int hvl__cuda_device_alloc(int dev, void **out, int64_t bytes);
void hvl__cuda_device_free(int dev, void *p);
/* Events of the caller's own, for points of the engine's stream that outlive one call (a
 * device batch left running on the GPU): made on device `dev`, timed (cuEventElapsedTime can
 * measure between two; HVL_ERR_CUDA where the driver cannot) or not; recorded at the stream's
 * current end; *done = 1 once the stream passed it (never waits); the GPU's seconds from `from`
 * to `to`, once the stream passed both (timed ones); freed NULL-safe, saying whether it was
 * made timed: kept for the next event_new of its kind (so a batch does not cost an event
 * creation per point), recorded anew there; destroyed with the stream (hvl__cuda_release). */
int hvl__cuda_event_new(int dev, int timed, void **event);
int hvl__cuda_event_record(int dev, void *event);
int hvl__cuda_event_reached(int dev, void *event, int *done);
int hvl__cuda_event_seconds(int dev, void *from, void *to, double *seconds);
void hvl__cuda_event_free(int dev, void *event, int timed);
/* Whether the device has stream-ordered memory pools (cuMemAllocAsync): *supported 1 or 0 (0
 * also where the driver predates them, CUDA 11.2). */
int hvl__cuda_pools(int dev, int *supported);
/* Device memory from the device's default pool, stream-ordered on the engine's stream
 * (cuMemAllocAsync), so work queued there after this call may use it; the host never waits:
 * a result that outlives the batch (allgather, alltoall on a device plane), or a buffer of the
 * engine's own. HVL_ERR_NO_MEMORY where the GPU has no room (the default pool, which PyTorch's
 * caching allocator does not lend to). The pool's release threshold is raised to the most it
 * has had in use at once, so memory freed to it stays mapped across synchronisations. Freed
 * with hvl__cuda_result_free (any thread) or hvl__cuda_stream_free. */
int hvl__cuda_result_alloc(int dev, void **out, int64_t bytes);
/* Frees such memory on the engine's stream (cuMemFreeAsync), after the work queued there before:
 * the host never waits, however busy the device. NULL-safe; cannot fail. */
void hvl__cuda_stream_free(int dev, void *p);
/* Any thread: frees such a result, stream-ordered on `stream` (a stream of the device's primary
 * context; NULL: the legacy default stream), after the work queued there before; the calling
 * thread's current context is kept. NULL-safe; cannot fail (a free that fails leaks). Where the
 * device's primary context is no longer alive (every user released it: a process at exit), its
 * memory went with it and nothing is done. */
void hvl__cuda_result_free(int dev, void *p, void *stream);
/* Zeroes device memory, asynchronously on the engine's stream. */
int hvl__cuda_zero(int dev, void *device, int64_t bytes);
/* The GPU may never finish work queued before: an NCCL abort that did not return, or a staged
 * copy that never finished. From then on, for the life of the process, the two frees above
 * leak instead of freeing (cuMemFree and cuMemFreeHost wait for the whole device, which would
 * hang the engine's stop). */
void hvl__cuda_stuck(void);
/* Destroys the streams and events and releases the contexts this thread took (the engine's
 * stop). The library stays loaded. Cannot fail. */
void hvl__cuda_release(void);

#endif /* HVLITE_CUDA_DRIVER_H */
