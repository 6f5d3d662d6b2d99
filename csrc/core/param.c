/* param.c: the one table of HVLITE_* settings (name, type, where its value comes from, default,
 * doc). Read once at init on the caller's thread. Settings marked RANK0 must be the same on every
 * rank (they decide how batches are built and which data planes run): hvl__params_agree hands
 * rank 0's values to every rank, whatever each rank's environment said. HOROVOD_<same suffix> is accepted as an alias so migrating users keep
 * their settings; an unknown HVLITE_* variable or a bad value gets a warning (a typo must not
 * pass silently), given by the bg thread once the rank is known (hvl__params_warn), and once per
 * process: a job that calls init() again does not repeat it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "engine.h"

extern char **environ;

typedef enum { P_INT64, P_INT, P_DOUBLE, P_LEVEL, P_PATH, P_OTHER } ptype;
typedef enum { LOCAL, RANK0 } pscope;   /* each rank's own value, or rank 0's everywhere */
typedef struct {
    const char *suffix;     /* after HVLITE_ / HOROVOD_ */
    ptype type;
    pscope scope;
    size_t offset;          /* into hvl_params; unused for P_OTHER */
    const char *deflt;
    const char *doc;
} param_def;

#define F(field) offsetof(hvl_params, field)
static const param_def table[] = {
    {"FUSION_THRESHOLD", P_INT64, RANK0, F(fusion_threshold), "134217728",
     "bytes one fused collective may carry (0 disables fusion)"},
    {"ALLREDUCE_PIECE", P_INT64, RANK0, F(allreduce_piece), "1048576",
     "bytes per allreduce call; pieces stay in cache through copy-in, reduce and copy-out (0 = whole)"},
    {"STAGED_PIECE", P_INT64, RANK0, F(staged_piece), "0",
     "experimental (not yet run on a GPU): bytes per piece of a staged CUDA allreduce, whose copies "
     "to and from the GPU then overlap the reduction piece by piece (0 = the batch whole: copied "
     "in, reduced, copied back)"},
    {"CYCLE_TIME", P_DOUBLE, RANK0, F(cycle_time_ms), "1", "ms between engine cycles when idle"},
    {"CACHE_CAPACITY", P_INT, RANK0, F(cache_capacity), "1024", "response cache entries (0 = off)"},
    {"STALL_CHECK_TIME_SECONDS", P_DOUBLE, LOCAL, F(stall_check_s), "60",
     "warn about tensors not submitted by every rank after this long (0 = off)"},
    {"STALL_SHUTDOWN_TIME_SECONDS", P_DOUBLE, LOCAL, F(stall_shutdown_s), "0",
     "stop the engine on every rank when a tensor stalls this long (0 = off)"},
    {"STALL_CHECK_DISABLE", P_INT, LOCAL, F(stall_check_disable), "0",
     "1: no stall warning and no stall shutdown, whatever the two stall times say"},
    {"DEADLOCK_SECONDS", P_DOUBLE, LOCAL, F(deadlock_s), "5",
     "rank 0: when every rank that a set of tensors needs has waited in hvlite this long and none of "
     "them can ever complete, fail them on every rank with a deadlock error (0 = off)"},
    {"PEER_TIMEOUT_SECONDS", P_DOUBLE, RANK0, F(peer_timeout_s), "60",
     "fail the engine when other ranks' engines do not answer (negotiation) or make no progress "
     "(a collective) for this long: a stopped, dead or unreachable rank (0 = never); rank 0's "
     "value holds on every rank, so every rank gives up alike"},
    {"LOG_LEVEL", P_LEVEL, LOCAL, F(log_level), "warning", "trace, debug, info, warning or error"},
    {"LOG_HIDE_TIME", P_INT, LOCAL, F(log_hide_time), "0",
     "1: engine log lines without the date and time they otherwise start with (to the microsecond, "
     "as Horovod's)"},
    {"THREAD_AFFINITY", P_PATH, LOCAL, F(thread_affinity), "",
     "core numbers, one per rank on the host (c0,c1,...): local rank i pins its engine thread to core c_i"},
    {"MPI_THREADS_DISABLE", P_INT, LOCAL, F(mpi_threads_disable), "0",
     "1: when hvlite initialises MPI, ask for MPI_THREAD_SERIALIZED (all the engine needs) instead "
     "of MPI_THREAD_MULTIPLE; hvlite.mpi_threads_supported() is then False"},
    {"AUTOTUNE", P_INT, RANK0, F(autotune), "0",
     "1: search fusion threshold, cycle time and response-cache use on measured bytes/s"},
    {"AUTOTUNE_LOG", P_PATH, LOCAL, F(autotune_log), "", "rank 0 writes every autotune sample to this CSV file"},
    {"AUTOTUNE_WARMUP_SAMPLES", P_INT, RANK0, F(autotune_warmup), "3", "autotune samples discarded at start"},
    {"AUTOTUNE_STEPS_PER_SAMPLE", P_INT, RANK0, F(autotune_steps), "10",
     "engine cycles that did work per autotune sample (>= 1)"},
    {"AUTOTUNE_BAYES_OPT_MAX_SAMPLES", P_INT, RANK0, F(autotune_max_samples), "20",
     "autotune samples scored by the search before it settles (1-100)"},
    {"AUTOTUNE_GAUSSIAN_PROCESS_NOISE", P_DOUBLE, RANK0, F(autotune_noise), "0.8",
     "autotune's Gaussian-process noise variance, relative to the scores' variance"},
    {"TIMELINE", P_PATH, LOCAL, F(timeline_path), "",
     "Chrome trace (JSON) file that rank 0 writes from init; open it in Perfetto or chrome://tracing. "
     "DYNAMIC (Horovod's word): none at init, the program calls start_timeline() later"},
    {"TIMELINE_MARK_CYCLES", P_INT, LOCAL, F(timeline_mark_cycles), "0",
     "1: also mark every engine cycle on the timeline (CYCLE_START)"},
    {"SHM_DISABLE", P_INT, RANK0, F(shm_disable), "0",
     "1: never use the shared-memory data plane (collectives of one-host sets go to MPI)"},
    {"HIERARCHICAL_ALLREDUCE", P_INT, RANK0, F(hierarchical_allreduce), "0",
     "1: allreduce across hosts as shm reduce on each host, MPI among hosts, shm broadcast"},
    {"SHM_CHUNK", P_INT64, RANK0, F(shm_chunk), "0",
     "bytes per shared-memory pipeline step and rank (segment: 2 per rank on the host); "
     "0 = 1 MiB, or 4 MiB when the host runs more ranks than cores"},
    {"NCCL_DISABLE", P_INT, RANK0, F(nccl_disable), "0",
     "1: CUDA tensors never run on NCCL; they take the staged path (host copies, CPU planes)"},
    {"NCCL_GROUPED", P_INT, RANK0, F(nccl_grouped), "0",
     "1: a fused batch of CUDA tensors on NCCL is one group of per-tensor calls, not one call on a "
     "device fusion buffer"},
    {"NCCL_OVERLAP", P_INT, RANK0, F(nccl_overlap), "0",
     "experimental (not yet run on a GPU): 1: the engine negotiates and queues the next batches while "
     "NCCL batches run on the GPU (their handles complete when the GPU is seen to finish them), "
     "instead of waiting for each"},
    {"GPU_READY_ONLY", P_INT, LOCAL, F(gpu_ready_only), "0",
     "experimental (not yet run on a GPU): 1: a CUDA tensor enters negotiation once the GPU has "
     "written it (the event recorded at submit), so batches follow the GPU's progress as DDP's "
     "buckets do; 0: as soon as it is submitted, its batch waiting on the GPU for the event"},
    {"NCCL_LIB", P_PATH, LOCAL, F(nccl_lib), "",
     "the NCCL library (libnccl.so.2, or the folder holding it) the GPU plane loads; when unset, "
     "hvlite.init() sets it from Horovod's HOROVOD_NCCL_LIB (a folder) or HOROVOD_NCCL_HOME, else "
     "to torch's nvidia-nccl wheel; else the loader's libnccl.so.2"},
    {"TEST_FAKE_HOSTS", P_INT, RANK0, F(test_fake_hosts), "0",
     "tests only: split each host's ranks into this many consecutive fake hosts"},
    {"TEST_STOP_AT", P_PATH, LOCAL, F(test_stop_at), "",
     "tests only: R:POINT (R:POINT:N) stops rank R (SIGSTOP) the first (N-th) time it reaches a "
     "named step: pset_split, pset_shm_map, pset_shm_ready (inside add_process_set), "
     "init_shm_map, init_shm_ready (inside init), shm_allreduce (between two steps of a "
     "multi-step shm allreduce), mpi_allreduce (an MPI allreduce started)"},
    /* read elsewhere, listed so they are documented and not warned about */
    {"DYNAMIC_PROCESS_SETS", P_OTHER, LOCAL, 0, "1", "accepted for Horovod scripts: sets may always be added at run time"},
    {"MPICC", P_OTHER, LOCAL, 0, "", "build time: the MPI compiler wrapper to build against"},
    {"MPIEXEC", P_OTHER, LOCAL, 0, "", "hvlrun: the mpiexec to launch with"},
    {"SANITIZE", P_OTHER, LOCAL, 0, "", "build time: address or thread builds an ASan+UBSan or TSan engine"},
    {"RUN_RANK", P_OTHER, LOCAL, 0, "", "set by hvlite.run in its ranks (a nested hvlite.run is refused)"},
    {"TEST_TIMEOUT_MULTIPLIER", P_OTHER, LOCAL, 0, "1", "tests: stretch every job timeout"},
    {"SPMD", P_OTHER, LOCAL, 0, "0", "tests: set inside SPMD test jobs"},
    {"TEST_DEVICE", P_OTHER, LOCAL, 0, "cpu", "tests: cpu or cuda, where the torch SPMD tests put tensors"},
    {"TEST_NCCL_HOSTID", P_OTHER, LOCAL, 0, "", "tests: per-rank gives each SPMD rank its own NCCL_HOSTID"},
};
#undef F
#define NPARAMS (sizeof(table) / sizeof(table[0]))

static int parse_level(const char *s)
{
    static const char *names[] = {"trace", "debug", "info", "warning", "error"};
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, names[i]) == 0) return i;
    if (strcasecmp(s, "warn") == 0) return HVL_LOG_WARNING;
    if (strcasecmp(s, "fatal") == 0) return HVL_LOG_ERROR;     /* Horovod's highest level */
    return -1;
}

/* Sets the field from `value`; a bad value keeps the field and is reported if `warn`. */
static void set_value(hvl_params *p, const param_def *d, const char *value, const char *from, int warn)
{
    char *end = NULL;
    void *field = (char *)p + d->offset;
    switch (d->type) {
    case P_INT64: { long long v = strtoll(value, &end, 10); if (*end == 0 && v >= 0) { *(int64_t *)field = v; return; } break; }
    case P_INT: { long v = strtol(value, &end, 10); if (*end == 0 && v >= 0) { *(int *)field = (int)v; return; } break; }
    case P_DOUBLE: { double v = strtod(value, &end); if (*end == 0 && v >= 0) { *(double *)field = v; return; } break; }
    case P_LEVEL: { int v = parse_level(value); if (v >= 0) { *(int *)field = v; return; } break; }
    case P_PATH: if (strlen(value) < HVL_PATH_MAX) { strcpy((char *)field, value); return; } break;
    case P_OTHER: return;
    }
    if (!warn) return;
    char key[300];
    snprintf(key, sizeof(key), "param %s=%.250s", from, value);
    hvl__log_once(key, HVL_LOG_WARNING, "ignoring %s=%s: not a valid value (%s)", from, value, d->doc);
}

static const param_def *find(const char *suffix, size_t len)
{
    for (size_t i = 0; i < NPARAMS; i++)
        if (strlen(table[i].suffix) == len && strncmp(table[i].suffix, suffix, len) == 0) return &table[i];
    return NULL;
}

static void load(hvl_params *p, int warn)
{
    memset(p, 0, sizeof(*p));
    for (size_t i = 0; i < NPARAMS; i++) set_value(p, &table[i], table[i].deflt, "default", warn);
    char name[128];
    for (size_t i = 0; i < NPARAMS; i++) {      /* HOROVOD_* first, so HVLITE_* wins */
        snprintf(name, sizeof(name), "HOROVOD_%s", table[i].suffix);
        if (getenv(name)) set_value(p, &table[i], getenv(name), name, warn);
        snprintf(name, sizeof(name), "HVLITE_%s", table[i].suffix);
        if (getenv(name)) set_value(p, &table[i], getenv(name), name, warn);
    }
    for (char **env = environ; warn && *env; env++) {
        if (strncmp(*env, "HVLITE_", 7) != 0) continue;
        const char *eq = strchr(*env, '=');
        if (!eq || find(*env + 7, (size_t)(eq - *env - 7))) continue;
        char key[200];
        snprintf(key, sizeof(key), "unknown setting %.*s", (int)(eq - *env < 150 ? eq - *env : 150), *env);
        hvl__log_once(key, HVL_LOG_WARNING, "unknown setting %.*s ignored", (int)(eq - *env), *env);
    }
    if (p->stall_check_disable) p->stall_check_s = p->stall_shutdown_s = 0;
}

void hvl__params_load(hvl_params *p) { load(p, 0); }

void hvl__params_warn(void)
{
    hvl_params scratch;
    load(&scratch, 1);
}

int hvl__params_agree(hvl_params *p, MPI_Comm comm, hvl_bound bound)
{
    double values[NPARAMS];      /* every RANK0 type fits a double exactly (int64: below 2^53) */
    int n = 0;
    for (size_t i = 0; i < NPARAMS; i++) {
        const param_def *d = &table[i];
        void *field = (char *)p + d->offset;
        if (d->scope != RANK0) continue;
        values[n++] = d->type == P_INT64 ? (double)*(int64_t *)field : d->type == P_DOUBLE ? *(double *)field
                                                                                        : *(int *)field;
    }
    HVL_CHECK(hvl__bcast_bytes(comm, values, n * (int)sizeof(double), 0, bound, "MPI_Ibcast (settings from rank 0)"));
    n = 0;
    for (size_t i = 0; i < NPARAMS; i++) {
        const param_def *d = &table[i];
        void *field = (char *)p + d->offset;
        if (d->scope != RANK0) continue;
        if (d->type == P_INT64) *(int64_t *)field = (int64_t)values[n++];
        else if (d->type == P_DOUBLE) *(double *)field = values[n++];
        else *(int *)field = (int)values[n++];
    }
    return HVL_OK;
}

void hvl__params_log(const hvl_params *p)
{
    hvl__log(HVL_LOG_DEBUG, "settings: fusion_threshold=%lld B cycle_time=%.3f ms cache_capacity=%d "
             "stall_check=%.1f s stall_shutdown=%.1f s deadlock=%.1f s peer_timeout=%.1f s timeline='%s'%s",
             (long long)p->fusion_threshold, p->cycle_time_ms, p->cache_capacity, p->stall_check_s,
             p->stall_shutdown_s, p->deadlock_s, p->peer_timeout_s, p->timeline_path,
             p->timeline_mark_cycles ? " (cycles marked)" : "");
    hvl__log(HVL_LOG_DEBUG, "settings: shm_disable=%d hierarchical_allreduce=%d shm_chunk=%lld B fake_hosts=%d",
             p->shm_disable, p->hierarchical_allreduce, (long long)p->shm_chunk, p->test_fake_hosts);
    for (size_t i = 0; i < NPARAMS; i++)
        hvl__log(HVL_LOG_TRACE, "HVLITE_%s (default %s): %s", table[i].suffix, table[i].deflt, table[i].doc);
}
