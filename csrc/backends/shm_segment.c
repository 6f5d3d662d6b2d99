/* shm_segment.c: the shared-memory segment of a process set on this host, and the arrivals that
 * order its members' steps (layout and protocol in shm.h). bg thread only.
 *
 * Setting up is collective over the set's members and bounded like every wait on peers: the
 * communicators come from hvl__comm_split, the exchanges (the segment's name, that everyone
 * mapped it, that every pid is written) are nonblocking MPI under the progress wait.
 *
 * Naming and leaks: local rank 0 creates "/hvlite-<uid>-<pid>-<random>" (O_EXCL), the others
 * open it, every member maps it, they agree (one allreduce) that all have, and rank 0 unlinks
 * the name at once. From then on the segment has no name: the mappings keep it alive and it
 * vanishes with the last process, so a SIGKILL leaks nothing in /dev/shm (only a kill inside
 * the few milliseconds of setup could). Shutdown unmaps.
 *
 * Waiting: an arrival bumps the member's futex word and wakes sleepers only if some peer
 * registered as one. A waiter spins for a few microseconds (only when every local member can
 * have a core of its own: oversubscribed, a spinner steals the core its peer needs), then
 * sleeps on the futex in short naps, checking between naps that the peer's process is alive,
 * the peer timeout and shutdown. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include "shm.h"

#define SPIN_S 20e-6            /* busy-wait first, when every member has a core */
#define YIELD_S 2e-3            /* then poll with sched_yield, before sleeping on the futex */
#define NAP_S 0.05              /* futex sleep between liveness checks */
#define DATA_ALIGN 4096
/* HVLITE_SHM_CHUNK=0 (the default): 1 MiB steps, measured best with a core per rank (every
 * member's two buffers stay in cache); when a host runs more ranks than cores every step waits
 * for each rank to be scheduled, so fewer, larger steps win (figures: bench/README.md,
 * "Measurements behind the engine's constants"). */
#define CHUNK_DEFAULT ((int64_t)1 << 20)
#define CHUNK_OVERSUBSCRIBED ((int64_t)4 << 20)

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(uint32_t *word, uint32_t seen, double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);   /* shared: no PRIVATE flag */
}

static void futex_wake(uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static int reached(const hvl_shm_ctl *c, uint32_t target)
{
    return (int32_t)(__atomic_load_n(&c->seq, __ATOMIC_ACQUIRE) - target) >= 0;
}

/* Between naps: is there a reason to stop waiting for member `peer`? */
static int check_peer(hvl_engine *e, const hvl_shm_ctl *c, double waited, const char *what)
{
    if (kill(c->pid, 0) != 0 && errno == ESRCH)
        return hvl__fail(HVL_ERR_SYSTEM, "%s: rank %d (pid %d) on this host has died",
                         what, c->rank, c->pid);
    if (e->params.peer_timeout_s > 0 && waited > e->params.peer_timeout_s)
        return hvl__fail(HVL_ERR_TIMEOUT, "%s: rank %d (pid %d) on this host did not arrive for "
                         "%.0f s (HVLITE_PEER_TIMEOUT_SECONDS); it is stopped or hangs outside hvlite",
                         what, c->rank, c->pid, waited);
    if (waited > HVL_SHUTDOWN_GRACE_S && __atomic_load_n(&e->shutdown_requested, __ATOMIC_ACQUIRE))
        return hvl__fail(HVL_ERR_SHUT_DOWN, "%s: shut down while waiting for rank %d", what, c->rank);
    int fatal = __atomic_load_n(&e->fatal, __ATOMIC_ACQUIRE);
    return fatal != HVL_OK ? hvl__fail(fatal, "%s: the engine failed", what) : HVL_OK;
}

static int wait_for(hvl_engine *e, hvl_shm *s, hvl_shm_ctl *c, uint32_t target, const char *what)
{
    if (reached(c, target)) return HVL_OK;
    double start = hvl__now();
    while (hvl__now() - start < s->spin_s)
        for (int i = 0; i < 32; i++) {
            if (reached(c, target)) return HVL_OK;
            cpu_relax();
        }
    /* A step's copies take about as long as a futex wake-up on a VM (bench/README.md), so keep
     * polling a while, but give the core to any other runnable thread (this rank's training
     * thread, or an oversubscribed peer) at every look. */
    while (hvl__now() - start < YIELD_S) {
        if (reached(c, target)) return HVL_OK;
        sched_yield();
    }
    for (;;) {
        /* Register, then look again: the arriving member stores seq, then reads sleepers (both
         * sequentially consistent), so either it sees us or we see its arrival. */
        __atomic_add_fetch(&c->sleepers, 1, __ATOMIC_SEQ_CST);
        uint32_t seen = __atomic_load_n(&c->seq, __ATOMIC_SEQ_CST);
        if ((int32_t)(seen - target) < 0) futex_wait(&c->seq, seen, NAP_S);
        __atomic_sub_fetch(&c->sleepers, 1, __ATOMIC_SEQ_CST);
        if (reached(c, target)) return HVL_OK;
        HVL_CHECK(check_peer(e, c, hvl__now() - start, what));
    }
}

int hvl__shm_sync(hvl_engine *e, hvl_shm *s, const char *what)
{
    hvl_shm_ctl *mine = &s->ctl[s->local_rank];
    uint32_t target = ++s->arrivals;
    __atomic_store_n(&mine->seq, target, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&mine->sleepers, __ATOMIC_SEQ_CST)) futex_wake(&mine->seq);
    for (int r = 0; r < s->local_size; r++)
        if (r != s->local_rank) HVL_CHECK(wait_for(e, s, &s->ctl[r], target, what));
    return HVL_OK;
}

void hvl__shm_announce(hvl_shm *s, int64_t v) { s->ctl[s->local_rank].value[(s->arrivals + 1) & 1] = v; }

int64_t hvl__shm_announced(const hvl_shm *s, int r) { return s->ctl[r].value[s->arrivals & 1]; }

/* Local rank 0: a new, exclusive segment; its name goes to `name` ("" on failure). */
static int create_segment(char *name, size_t len, size_t bytes)
{
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        unsigned token = (unsigned)ts.tv_nsec ^ ((unsigned)getpid() << 16) ^ (unsigned)attempt * 2654435761u;
        snprintf(name, len, "/hvlite-%u-%d-%08x", (unsigned)getuid(), (int)getpid(), token);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        int err = errno;
        if (fd >= 0) { close(fd); shm_unlink(name); }
        name[0] = 0;
        return hvl__fail(HVL_ERR_SYSTEM, "cannot create a %zu-byte shared-memory segment in /dev/shm: %s",
                         bytes, strerror(err));
    }
    return fd;
}

/* Collective over s->local_comm: create (rank 0) or open the segment, map it, agree that every
 * member has, unlink the name. *everywhere = 1 if every member mapped it; a member that could
 * not warns why. Fails on MPI errors and waits that give up (hvl_bound), leaving no name. */
static int map_segment(hvl_engine *e, hvl_pset *ps, hvl_shm *s, int *everywhere)
{
    char name[96] = {0};
    size_t ctl_bytes = sizeof(hvl_shm_ctl) * (size_t)s->local_size;
    size_t data_off = (ctl_bytes + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
    size_t bytes = data_off + (size_t)s->local_size * 2 * (size_t)s->chunk;
    int fd = s->local_rank == 0 ? create_segment(name, sizeof(name), bytes) : -1;
    hvl__test_stop_point(e->params.test_stop_at, e->rank, ps->id ? "pset_shm_map" : "init_shm_map");
    int rc = hvl__bcast_bytes(s->local_comm, name, sizeof(name), 0, hvl__peer_bound(e), "MPI_Ibcast (shm name)");
    if (rc != HVL_OK) { if (fd >= 0) { close(fd); shm_unlink(name); } return rc; }
    if (s->local_rank != 0 && name[0]) fd = shm_open(name, O_RDWR, 0);
    void *p = fd >= 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    int err = errno, mapped = p != MAP_FAILED;
    if (fd >= 0) close(fd);
    if (!mapped && name[0])
        hvl__log(HVL_LOG_WARNING, "cannot map shared-memory segment %s: %s; process set %d uses MPI "
                 "instead of shared memory", name, strerror(err), ps->id);
    else if (!mapped && s->local_rank == 0)
        hvl__log(HVL_LOG_WARNING, "%s; process set %d uses MPI instead of shared memory", hvl_last_error(), ps->id);
    *everywhere = mapped;
    rc = hvl__allreduce_ints(s->local_comm, everywhere, 1, MPI_MIN, hvl__peer_bound(e), "MPI_Iallreduce (shm mapped)");
    if (s->local_rank == 0 && name[0]) shm_unlink(name);   /* every member has mapped it, or gave up */
    if (rc != HVL_OK || !*everywhere) { if (mapped) munmap(p, bytes); *everywhere = 0; return rc; }
    s->base = p;
    s->map_bytes = bytes;
    s->ctl = p;
    s->data = (char *)p + data_off;
    s->ctl[s->local_rank].pid = (int32_t)getpid();
    s->ctl[s->local_rank].rank = e->rank;
    memset(s->data + (size_t)s->local_rank * 2 * (size_t)s->chunk, 0, 2 * (size_t)s->chunk);  /* fault in */
    hvl__test_stop_point(e->params.test_stop_at, e->rank, ps->id ? "pset_shm_ready" : "init_shm_ready");
    MPI_Request req;     /* every member's pid is written before any member waits on one */
    HVL_CHECK(hvl__mpi_check(MPI_Ibarrier(s->local_comm, &req), "MPI_Ibarrier (shm ready)"));
    return hvl__mpi_progress_wait(&req, hvl__peer_bound(e), "MPI_Ibarrier (shm ready)");
}

/* The global rank of this host's first member: the same on every rank of the host (and of a
 * fake host: e->local_comm is already split), different across hosts. */
static int host_key(hvl_engine *e)
{
    MPI_Group local, world;
    int zero = 0, key = 0;
    MPI_Comm_group(e->local_comm, &local);
    MPI_Comm_group(e->comm, &world);
    MPI_Group_translate_ranks(local, 1, &zero, world, &key);
    MPI_Group_free(&local);
    MPI_Group_free(&world);
    return key;
}

/* The set's communicators on this host and, across hosts, among local rank 0s; the segment. */
static int build(hvl_engine *e, hvl_pset *ps, hvl_shm *s, int *usable)
{
    hvl_bound bound = hvl__peer_bound(e);
    HVL_CHECK(hvl__comm_split(ps->comm, host_key(e), ps->rank, 0, &s->local_comm, bound, "MPI_Comm_split (host)"));
    MPI_Comm_rank(s->local_comm, &s->local_rank);
    MPI_Comm_size(s->local_comm, &s->local_size);
    if (!ps->one_host)
        HVL_CHECK(hvl__comm_split(ps->comm, s->local_rank == 0 ? 0 : MPI_UNDEFINED, ps->rank, 0, &s->leaders_comm,
                                  bound, "MPI_Comm_split (leaders)"));
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int oversubscribed = cpus > 0 && s->local_size > cpus;
    if (s->chunk == 0) s->chunk = oversubscribed ? CHUNK_OVERSUBSCRIBED : CHUNK_DEFAULT;
    int64_t least = ((int64_t)s->local_size * 64 + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
    if (s->chunk < least) s->chunk = least;   /* a cache line per member and step, at least */
    if (!ps->one_host) {   /* hierarchical steps meet across hosts: every host must step alike */
        MPI_Request req;
        HVL_CHECK(hvl__mpi_check(MPI_Iallreduce(MPI_IN_PLACE, &s->chunk, 1, MPI_INT64_T, MPI_MAX, ps->comm, &req),
                                 "MPI_Iallreduce (shm step)"));
        HVL_CHECK(hvl__mpi_progress_wait(&req, bound, "MPI_Iallreduce (shm step)"));
    }
    s->spin_s = oversubscribed ? 0 : SPIN_S;
    s->scratch = malloc((size_t)s->chunk);   /* without it this member cannot take part: agreed below */
    if (!s->scratch) hvl__log(HVL_LOG_WARNING, "out of memory for the shm plane's scratch buffer");
    int mapped = 1;
    if (s->local_size > 1) HVL_CHECK(map_segment(e, ps, s, &mapped));
    *usable = mapped && s->scratch != NULL;
    return HVL_OK;
}

int hvl__shm_open(hvl_engine *e, hvl_pset *ps, hvl_shm **out)
{
    *out = NULL;
    hvl_shm *s = calloc(1, sizeof(*s));
    if (!s) return hvl__oom("opening shared memory");
    s->local_comm = s->leaders_comm = MPI_COMM_NULL;
    int64_t chunk = (e->params.shm_chunk + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
    s->chunk = chunk <= 0 ? 0 : chunk > ((int64_t)1 << 30) ? (int64_t)1 << 30 : chunk;   /* 0: build() picks */
    int usable = 0, all_usable = 0, rc;
    HVL_CHECK_GOTO(build(e, ps, s, &usable), rc, out);
    /* every host must have its segment, or no rank of the set uses any */
    all_usable = usable;
    HVL_CHECK_GOTO(hvl__allreduce_ints(ps->comm, &all_usable, 1, MPI_MIN, hvl__peer_bound(e),
                                       "MPI_Iallreduce (shm usable)"), rc, out);
    if (all_usable) *out = s;
out:
    if (!*out) hvl__shm_close(s, rc == HVL_OK);
    return rc;
}

void hvl__shm_close(hvl_shm *s, int clean)
{
    if (!s) return;
    if (s->base) munmap(s->base, s->map_bytes);
    if (clean && s->local_comm != MPI_COMM_NULL) MPI_Comm_free(&s->local_comm);
    if (clean && s->leaders_comm != MPI_COMM_NULL) MPI_Comm_free(&s->leaders_comm);
    free(s->scratch);
    free(s);
}
