/* mpi_util.c: MPI error translation and the polite wait. Negotiation waits on ranks that may
 * still be busy in Python; a blocking MPI call would spin a core the training thread needs, so
 * rounds use nonblocking calls completed here: a short spin, then sleeps that grow with the wait
 * (a tenth of it, up to 200 us), bounded by the peer timeout. bg thread only. */
#include <limits.h>
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

int hvl__mpi_wait(MPI_Request *req, double timeout_s, const char *what)
{
    const double spin_s = 20e-6, max_sleep_s = 200e-6;
    double start = hvl__now(), sleep_s = 5e-6;
    for (;;) {
        int done = 0;
        HVL_CHECK(hvl__mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what));
        if (done) return HVL_OK;
        double now = hvl__now();
        if (now - start < spin_s) continue;
        if (timeout_s > 0 && now - start > timeout_s)
            return hvl__fail(HVL_ERR_TIMEOUT, "%s: no answer from the other ranks for %.0f s "
                             "(HVLITE_PEER_TIMEOUT_SECONDS); a rank has died or hangs outside hvlite",
                             what, timeout_s);
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

int hvl__allgather_i64(MPI_Comm comm, const int64_t *mine, int count, int64_t *all)
{
    return hvl__mpi_check(MPI_Allgather(mine, count, MPI_INT64_T, all, count, MPI_INT64_T, comm),
                          "MPI_Allgather (sizes)");
}

int hvl__alltoall_i64(MPI_Comm comm, const int64_t *mine, int64_t *theirs)
{
    return hvl__mpi_check(MPI_Alltoall(mine, 1, MPI_INT64_T, theirs, 1, MPI_INT64_T, comm),
                          "MPI_Alltoall (splits)");
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

int hvl__agree(MPI_Comm comm, int local_rc, const char *what, int *everywhere)
{
    int mine = local_rc != HVL_OK, any = 0;
    char *mine_text = mine ? strdup(hvl_last_error()) : NULL;
    *everywhere = 0;
    int rc = hvl__mpi_check(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce (agree)");
    if (rc == HVL_OK && any) {
        *everywhere = 1;
        rc = mine ? hvl__fail(HVL_ERR_INVALID_ARG, "%s", mine_text ? mine_text : what)
                  : hvl__fail(HVL_ERR_INVALID_ARG, "%s failed on another rank (its error says why)", what);
    }
    free(mine_text);
    return rc;
}
