/* mpi_util.c: MPI error translation and the bounded waits on nonblocking MPI calls.
 * - The polite wait (negotiation): it waits on ranks that may still be busy in Python, and a
 *   blocking MPI call would spin a core the training thread needs, so a short spin, then sleeps
 *   that grow with the wait (a tenth of it, up to 200 us).
 * - The progress wait (data collectives and the small exchanges around them, which every rank
 *   starts at the same point): MPI moves the data only while it is called, so it tests without
 *   sleeping, yielding the core between tests; as fast as the blocking call, but it can give up.
 * Both end with HVL_ERR_TIMEOUT after the peer timeout and look at the engine's shutdown and
 * fatal flags (hvl_bound), so no wait on MPI is unbounded or deaf to a stop. Communicator
 * creation, which MPI offers only blocking, is bounded in comm_split.c. bg thread only. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "util.h"

int hvl__mpi_check(int mpi_rc, const char *what)
{
    if (mpi_rc == MPI_SUCCESS) return HVL_OK;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof(text), "code %d", mpi_rc);
    return hvl__fail(HVL_ERR_MPI, "%s failed: %s", what, text);
}

int hvl__bound_flags(const hvl_bound *bound, double waited, const char *what)
{
    int fatal = bound->fatal ? __atomic_load_n(bound->fatal, __ATOMIC_ACQUIRE) : HVL_OK;
    if (fatal != HVL_OK) return hvl__fail(fatal, "%s: the engine failed meanwhile", what);
    if (bound->shutdown && waited > HVL_SHUTDOWN_GRACE_S && __atomic_load_n(bound->shutdown, __ATOMIC_ACQUIRE))
        return hvl__fail(HVL_ERR_SHUT_DOWN, "%s: shut down after waiting %.1f s for the other ranks", what, waited);
    return HVL_OK;
}

int hvl__mpi_wait(MPI_Request *req, hvl_bound bound, const char *what)
{
    const double spin_s = 20e-6, max_sleep_s = 200e-6;
    double start = hvl__now(), sleep_s = 5e-6;
    for (;;) {
        int done = 0;
        HVL_CHECK(hvl__mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what));
        if (done) return HVL_OK;
        double now = hvl__now();
        if (now - start < spin_s) continue;
        if (bound.timeout_s > 0 && now - start > bound.timeout_s)
            return hvl__fail(HVL_ERR_TIMEOUT, "%s: no answer from the other ranks for %.0f s "
                             "(HVLITE_PEER_TIMEOUT_SECONDS); a rank has died or hangs outside hvlite",
                             what, bound.timeout_s);
        HVL_CHECK(hvl__bound_flags(&bound, now - start, what));
        struct timespec ts = {0, (long)(sleep_s * 1e9)};
        nanosleep(&ts, NULL);
        /* Naps grow with the wait so far (a tenth of it, 10..200 us): a peer that arrives soon
         * is seen within microseconds, and a long wait still polls only a few thousand times
         * a second. */
        double cap = (now - start) / 10;
        cap = cap < 10e-6 ? 10e-6 : cap > max_sleep_s ? max_sleep_s : cap;
        sleep_s = sleep_s * 2 < cap ? sleep_s * 2 : cap;
    }
}

int hvl__mpi_progress_wait(MPI_Request *req, hvl_bound bound, const char *what)
{
    double start = hvl__now();
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        HVL_CHECK(hvl__mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what));
        if (done) return HVL_OK;
        if (spins % 64) continue;                   /* look at the clock and flags now and then */
        double waited = hvl__now() - start;
        if (bound.timeout_s > 0 && waited > bound.timeout_s)
            return hvl__fail(HVL_ERR_TIMEOUT, "%s: no progress for %.0f s (HVLITE_PEER_TIMEOUT_SECONDS); a "
                             "rank has died, is stopped, or cannot be reached", what, waited);
        HVL_CHECK(hvl__bound_flags(&bound, waited, what));
        /* Yield every 64 tests: when ranks outnumber free cores, a spinning rank otherwise keeps
         * its core for a whole time slice (~3 ms) while the peer it waits for cannot run. */
        sched_yield();
    }
}

int hvl__allgather_i64(MPI_Comm comm, const int64_t *mine, int count, int64_t *all, hvl_bound bound,
                       const char *what)
{
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Iallgather(mine, count, MPI_INT64_T, all, count, MPI_INT64_T, comm, &req), what));
    return hvl__mpi_progress_wait(&req, bound, what);
}

int hvl__alltoall_i64(MPI_Comm comm, const int64_t *mine, int64_t *theirs, hvl_bound bound)
{
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Ialltoall(mine, 1, MPI_INT64_T, theirs, 1, MPI_INT64_T, comm, &req),
                             "MPI_Ialltoall (splits)"));
    return hvl__mpi_progress_wait(&req, bound, "exchanging alltoall splits");
}

int hvl__bcast_bytes(MPI_Comm comm, void *buf, int bytes, int root, hvl_bound bound, const char *what)
{
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Ibcast(buf, bytes, MPI_BYTE, root, comm, &req), what));
    return hvl__mpi_progress_wait(&req, bound, what);
}

int hvl__allreduce_ints(MPI_Comm comm, int *values, int n, MPI_Op op, hvl_bound bound, const char *what)
{
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_INT, op, comm, &req), what));
    return hvl__mpi_progress_wait(&req, bound, what);
}

int hvl__counts_fit_int(const int64_t *bytes, int n, const char *what)
{
    int64_t offset = 0;
    for (int r = 0; r < n; r++) {
        if (bytes[r] > INT_MAX || offset > INT_MAX)
            return hvl__fail(HVL_ERR_INVALID_ARG, "%s: more than 2 GiB per rank or in total is not "
                             "supported by the MPI backend", what);
        offset += bytes[r];
    }
    return HVL_OK;
}

int hvl__agree(MPI_Comm comm, int local_rc, const char *what, int *everywhere, hvl_bound bound)
{
    int mine = local_rc != HVL_OK, any = 0;
    char *mine_text = mine ? strdup(hvl_last_error()) : NULL;
    MPI_Request req;
    *everywhere = 0;
    int rc = hvl__mpi_check(MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm, &req), "MPI_Iallreduce (agree)");
    if (rc == HVL_OK) rc = hvl__mpi_progress_wait(&req, bound, what);
    if (rc == HVL_OK && any) {
        *everywhere = 1;
        rc = mine ? hvl__fail(HVL_ERR_INVALID_ARG, "%s", mine_text ? mine_text : what)
                  : hvl__fail(HVL_ERR_INVALID_ARG, "%s failed on another rank (its error says why)", what);
    }
    free(mine_text);
    return rc;
}
