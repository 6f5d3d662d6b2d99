/* shm.h: the shared-memory data plane's private types, shared by shm_segment.c (the segment and
 * the arrivals that order the ranks' steps), backend_shm.c (collectives among ranks on one host)
 * and backend_hier.c (hierarchical allreduce). bg thread only.
 *
 * The segment, one per process set and host: a control block per local member, then two
 * buffers of `chunk` bytes per member. A collective runs in steps; step k writes only the
 * writer's own buffer k % 2, then every member "syncs" (arrives, and waits until every member
 * has arrived as often), then reads any member's buffer k % 2. A rank reads buffer k % 2 of
 * step k only before its next arrival, so when anyone writes that buffer again (step k + 2),
 * every reader has finished: it waited for their arrival of step k + 1. */
#ifndef HVLITE_SHM_H
#define HVLITE_SHM_H

#include "backend.h"
#include "kernels.h"

/* One local member's control words, in the segment, on cache lines of their own. */
typedef struct {
    uint32_t seq;               /* arrivals so far: written by its member, a futex word */
    int32_t pid;                /* the member's process (checked when it is slow) */
    int32_t rank;               /* its global rank (messages) */
    int32_t pad0;
    int64_t value[2];           /* a number announced with an arrival, by arrival parity */
    char pad1[32];
    uint32_t sleepers;          /* peers asleep on seq: an arrival wakes them only when > 0 */
    char pad2[60];
} hvl_shm_ctl;

typedef struct hvl_shm {
    MPI_Comm local_comm;        /* the set's members on this host (as split by fake hosts) */
    MPI_Comm leaders_comm;      /* local rank 0 of each host; MPI_COMM_NULL elsewhere / one host */
    int local_rank, local_size;
    char *base;                 /* the mapping; NULL when local_size == 1 */
    size_t map_bytes;
    hvl_shm_ctl *ctl;           /* local_size entries */
    char *data;                 /* local_size x 2 buffers of chunk bytes */
    int64_t chunk;              /* bytes per buffer: a multiple of 4096 */
    char *scratch;              /* private, chunk bytes */
    uint32_t arrivals;          /* this member's arrivals (its ctl seq) */
    uint64_t steps;             /* steps run: step k uses buffer k % 2 */
    double spin_s;              /* busy-wait this long before sleeping on the futex */
} hvl_shm;

/* Collective over ps->comm (every member): splits the members by host, makes the host's segment
 * and, for a set spread over hosts, the communicator of each host's local rank 0. *out is NULL
 * when some member could not make or map its segment (a warning; every member agrees, and MPI
 * serves the set). Fails on MPI errors, no memory, or a wait on the members that gives up (the
 * peer timeout, shutdown, fatal: hvl_bound); nothing is left mapped or named then. */
int hvl__shm_open(hvl_engine *e, hvl_pset *ps, hvl_shm **out);
void hvl__shm_close(hvl_shm *s, int clean);    /* clean: communicators may be freed; NULL is fine */

/* Member r's buffer of the current step. */
static inline char *hvl__shm_buf(const hvl_shm *s, int r)
{
    return s->data + ((size_t)r * 2 + (size_t)(s->steps & 1)) * (size_t)s->chunk;
}

/* Arrive, then wait until every local member has arrived as often. Waits spin briefly, then
 * sleep on the member's futex word; a member that is dead, silent past
 * HVLITE_PEER_TIMEOUT_SECONDS, or (after a second) a shutdown request ends the wait with an
 * error naming the rank and `what`. */
int hvl__shm_sync(hvl_engine *e, hvl_shm *s, const char *what);
/* Announce v with the next arrival; after hvl__shm_sync, hvl__shm_announced(s, r) is member
 * r's value. */
void hvl__shm_announce(hvl_shm *s, int64_t v);
int64_t hvl__shm_announced(const hvl_shm *s, int r);

/* backend_shm.c, shared with backend_hier.c. Member r's slice of a chunk of m elements among
 * n: [start, start + len), starting on a cache line. Cannot fail. */
void hvl__shm_slice(int64_t m, int n, int esize, int r, int64_t *start, int64_t *len);
/* After a sync: this member's slice of the current m-element chunk, reduced over every
 * member's buffer into its own. Cannot fail. */
void hvl__shm_reduce_slice(hvl_shm *s, int64_t m, int dtype, int reduce_op);
/* A plane's .allreduce on plain buffers, through its stream allreduce `run`. */
typedef int (*hvl_stream_run)(hvl_engine *e, hvl_pset *ps, void *state, hvl_stream *s);
int hvl__shm_allreduce_plain(hvl_engine *e, hvl_pset *ps, void *state, hvl_stream_run run,
                             const void *src, void *dst, int64_t count, int dtype, int reduce_op);

#endif /* HVLITE_SHM_H */
