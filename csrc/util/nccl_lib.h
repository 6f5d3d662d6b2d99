/* nccl_lib.h: the slice of NCCL's API the NCCL plane (backends/backend_nccl.c) uses, loaded at
 * run time; the plane is its only user.
 *
 * libnccl.so.2 is opened with dlopen the first time a set decides whether it takes NCCL
 * (hvl__nccl_load): from HVLITE_NCCL_LIB, which hvlite.init() fills in with torch's nvidia-nccl
 * wheel when it is unset, else from the loader's libnccl.so.2. So a process that never submits
 * a CUDA tensor loads neither NCCL nor CUDA, and the engine builds with no NCCL. The types and
 * constants below follow nccl.h's documented ones; tests/unit/test_nccl_plane.py compiles
 * nccl_lib.c against NVIDIA's nccl.h, whose static assertions check every one of them.
 *
 * Threads: hvl__nccl_load from any thread (once); the calls through hvl__nccl on the engine's
 * background thread, except ncclCommAbort on hvl__nccl_abort's helper. */
#ifndef HVLITE_NCCL_LIB_H
#define HVLITE_NCCL_LIB_H

#include <stddef.h>

#ifndef NCCL_MAJOR      /* the build: no nccl.h (the test supplies it, and with it these types) */
typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef int ncclScalarResidence_t;
typedef struct CUstream_st *cudaStream_t;
#endif

/* Values from nccl.h. */
#define NC_SUCCESS 0
#define NC_IN_PROGRESS 7
#define NC_INT8 0                     /* ncclDataType_t */
#define NC_UINT8 1
#define NC_INT32 2
#define NC_INT64 4
#define NC_FLOAT16 6
#define NC_FLOAT32 7
#define NC_FLOAT64 8
#define NC_BFLOAT16 9
#define NC_SUM 0                      /* ncclRedOp_t */
#define NC_PROD 1
#define NC_MAX 2
#define NC_MIN 3
#define NC_AVG 4
#define NC_SCALAR_HOST 1              /* ncclScalarHostImmediate */
#define NC_API_MAGIC 0xcafebeefu      /* NCCL_API_MAGIC */
#define NC_CONFIG_VERSION 21700       /* the config layout of NCCL 2.17, which later NCCLs still
                                         read: our struct is a prefix of theirs */

/* ncclConfig_t as NCCL 2.17 laid it out (NCCL copies `size` bytes over its defaults, and fields
 * newer than `version` keep their defaults). */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cga_cluster_size, min_ctas, max_ctas;
    const char *net_name;
} nccl_config;

/* NCCL's functions, filled by hvl__nccl_load (read-only after). */
typedef struct {
    ncclResult_t (*get_version)(int *version);
    ncclResult_t (*get_unique_id)(ncclUniqueId *id);
    ncclResult_t (*comm_init_rank_config)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                          nccl_config *config);
    ncclResult_t (*comm_abort)(ncclComm_t comm);
    ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t *async_error);
    const char *(*get_error_string)(ncclResult_t result);
    const char *(*get_last_error)(ncclComm_t comm);
    ncclResult_t (*all_reduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*broadcast)(const void *send, void *recv, size_t count, ncclDataType_t type,
                              int root, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*reduce_scatter)(const void *send, void *recv, size_t recv_count,
                                   ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream);
    ncclResult_t (*all_gather)(const void *send, void *recv, size_t send_count, ncclDataType_t type,
                               ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*send)(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*recv)(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*premulsum_create)(ncclRedOp_t *op, void *scalar, ncclDataType_t type,
                                     ncclScalarResidence_t residence, ncclComm_t comm);
    ncclResult_t (*red_op_destroy)(ncclRedOp_t op, ncclComm_t comm);
} hvl_nccl_api;
extern hvl_nccl_api hvl__nccl;

/* Loads NCCL from `path` (NULL or "": the loader's libnccl.so.2) and every function above, once
 * per process: later calls answer as the first did, whatever their path. HVL_OK once loaded;
 * otherwise HVL_ERR_NCCL with the path and why (not found, a function missing: NCCL before
 * 2.14, ncclGetVersion failed). */
int hvl__nccl_load(const char *path);
int hvl__nccl_version(void);          /* e.g. 22809 for 2.28.9; 0 until loaded */
/* NCCL's status as the engine's (util.h's rule): HVL_OK for success and for "in progress" (a
 * nonblocking communicator's call that goes on); else HVL_ERR_NCCL naming `what`, with NCCL's
 * words and `comm`'s last error (comm may be NULL). */
int hvl__nccl_check(ncclResult_t rc, ncclComm_t comm, const char *what);
/* ncclCommAbort of `comm`, a communicator on device `dev`, on a helper thread that the caller
 * waits for up to limit_s: 1 if the abort ran and returned; 0 if it is still stuck then (left to
 * its thread) or could not run (no context for `dev` on the helper: the device is then marked
 * stuck too, hvl__cuda_stuck) or could not be started (no memory, no thread), and the
 * communicator leaks (its device buffers must not be freed). */
int hvl__nccl_abort(ncclComm_t comm, int dev, double limit_s);

#endif /* HVLITE_NCCL_LIB_H */
