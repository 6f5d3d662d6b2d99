/* peers.c: who the other ranks are (their pids, hosts and hosts' rank counts, learned once at
 * startup; from the counts, whether the job is homogeneous), and what this
 * host can see of a rank that stopped answering: when a wait on peers times out, the error names
 * the ranks on this host that are stopped (SIGSTOP, a debugger) or dead, read from /proc. Ranks
 * on other hosts cannot be seen from here; the launcher ends the job when one of them dies.
 * bg thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine.h"

typedef struct { int64_t pid, host, local_size; } peer_t;
_Static_assert(sizeof(peer_t) == 3 * sizeof(int64_t), "peer_t is sent as 3 int64 values");
static peer_t *peers;          /* per global rank; NULL before startup */

static int64_t host_id(void)
{
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    return (int64_t)(hvl__hash(name, strlen(name), HVL_HASH_SEED) >> 1);
}

int hvl__peers_learn(hvl_engine *e)
{
    peer_t mine = {getpid(), host_id(), e->local_size};
    free(peers);
    if (!(peers = calloc((size_t)e->size, sizeof(peer_t)))) return hvl__oom("the peer table");
    HVL_CHECK(hvl__allgather_i64(e->comm, &mine.pid, 3, &peers[0].pid, hvl__peer_bound(e),
                                 "MPI_Iallgather (peer pids, hosts and host sizes)"));
    e->homogeneous = 1;
    for (int r = 0; r < e->size; r++)
        if (peers[r].local_size != e->local_size) e->homogeneous = 0;
    return HVL_OK;
}

void hvl__peers_forget(void)
{
    free(peers);
    peers = NULL;
}

/* The state letter of a process in /proc (R, S, D, T, t, Z, ...), or 0 if it is gone. */
static char proc_state(int64_t pid)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[n] = 0;
    char *close = strrchr(line, ')');      /* the command name may hold spaces and parentheses */
    return close && close[1] == ' ' ? close[2] : '?';
}

int hvl__peers_explain(hvl_engine *e, int rc)
{
    if (rc != HVL_ERR_TIMEOUT || !peers) return rc;
    char *message = strdup(hvl_last_error()), seen[1024] = "";
    size_t len = 0;
    int64_t here = host_id();
    for (int r = 0; r < e->size && len < sizeof(seen) - 100; r++) {
        if (r == e->rank || peers[r].host != here) continue;
        char state = proc_state(peers[r].pid);
        const char *what = state == 0 || state == 'Z' || state == 'X' ? "has died"
                         : state == 'T' || state == 't' ? "is stopped (SIGSTOP or a debugger)" : NULL;
        if (what) len += (size_t)snprintf(seen + len, sizeof(seen) - len, "; rank %d (pid %lld) on this host %s",
                                          r, (long long)peers[r].pid, what);
    }
    /* explained once: the cycle explains again what a batch already did */
    if (message && seen[0] && !strstr(message, seen + 2)) rc = hvl__fail(rc, "%s%s", message, seen);
    free(message);
    return rc;
}
