/* comm_split.c: communicator creation bounded like a collective. MPI_Comm_split,
 * MPI_Comm_split_type and MPI_Comm_create_group have no nonblocking form, and a rank that stops (SIGSTOP, a debugger) or
 * hangs before it reaches the call would hold every other rank inside it for ever. So the call
 * runs on a short-lived helper thread, and the calling (bg) thread waits for it on a condition
 * variable, looking at the bound (peer timeout, shutdown and fatal flags) every 10 ms. On a
 * give-up the helper is abandoned inside MPI: it owns the call's state from then on and frees
 * it if MPI ever returns; the engine stops (the error is fatal) and makes no more collective
 * calls on the parent. MPI may be entered from the helper because the bg thread makes no MPI
 * call while it waits (MPI_THREAD_SERIALIZED suffices). An abandoned helper may still be inside
 * MPI when a later init() starts a new engine thread: that is only legal under
 * MPI_THREAD_MULTIPLE, so hvl__comm_split_stranded() counts such helpers for init to check.
 * bg thread (the helper: only its call). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "util.h"

#define LOOK_S 0.01             /* the waiter looks at the bound this often */

/* One call, shared by the waiter and the helper; `done` and `abandoned` (lock) say who frees
 * it: the waiter once it saw done, the helper if it finishes after the waiter gave up. */
enum { SPLIT, SPLIT_BY_HOST, CREATE_GROUP };

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    MPI_Comm parent;
    int kind;
    int color, key;             /* SPLIT, SPLIT_BY_HOST */
    MPI_Group group;            /* CREATE_GROUP: the members; the helper frees it after the call */
    int tag;
    MPI_Comm out;               /* the helper's result; the waiter's once done */
    int mpi_rc;
    int done, abandoned;        /* lock */
} split_call;

static void call_free(split_call *c)
{
    if (c->group != MPI_GROUP_NULL) MPI_Group_free(&c->group);   /* a call that never started */
    pthread_cond_destroy(&c->done_cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static int stranded;            /* abandoned helpers still inside MPI (atomic) */

int hvl__comm_split_stranded(void) { return __atomic_load_n(&stranded, __ATOMIC_ACQUIRE); }

static void *helper(void *arg)
{
    split_call *c = arg;
    /* not the creator's name (threads inherit it): "hvlite-engine" names one thread only, which
     * tools and tests look up; a helper may outlive its call for a moment */
    pthread_setname_np(pthread_self(), "hvl-comm-split");
    MPI_Comm out = MPI_COMM_NULL;
    int mpi_rc;
    if (c->kind == CREATE_GROUP) {
        mpi_rc = MPI_Comm_create_group(c->parent, c->group, c->tag, &out);
        MPI_Group_free(&c->group);
    } else {
        mpi_rc = c->kind == SPLIT_BY_HOST ? MPI_Comm_split_type(c->parent, MPI_COMM_TYPE_SHARED, c->key, MPI_INFO_NULL, &out)
                                          : MPI_Comm_split(c->parent, c->color, c->key, &out);
    }
    pthread_mutex_lock(&c->lock);
    c->out = out;
    c->mpi_rc = mpi_rc;
    c->done = 1;
    int abandoned = c->abandoned;
    pthread_cond_signal(&c->done_cond);
    pthread_mutex_unlock(&c->lock);
    if (abandoned) {               /* `out` is left alone: nobody may use the parent any more */
        call_free(c);
        __atomic_sub_fetch(&stranded, 1, __ATOMIC_ACQ_REL);
    }
    return NULL;
}

static split_call *call_new(MPI_Comm parent, int kind)
{
    split_call *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&c->done_cond, &a);
    pthread_condattr_destroy(&a);
    c->parent = parent;
    c->kind = kind;
    c->group = MPI_GROUP_NULL;
    c->out = MPI_COMM_NULL;
    return c;
}

static int start_helper(split_call *c, const char *what)
{
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&thread, &attr, helper, c);
    pthread_attr_destroy(&attr);
    return err ? hvl__fail(HVL_ERR_SYSTEM, "%s: cannot start a thread: %s", what, strerror(err)) : HVL_OK;
}

/* Waits (c->lock held) until the helper is done or the bound gives up; marks the call
 * abandoned in that case, which hands it over to the helper. */
static int wait_done(split_call *c, const hvl_bound *bound, const char *what)
{
    double start = hvl__now();
    int rc = HVL_OK;
    while (!c->done && rc == HVL_OK) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)(LOOK_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->done_cond, &c->lock, &ts);
        if (c->done) break;
        double waited = hvl__now() - start;
        if (bound->timeout_s > 0 && waited > bound->timeout_s)
            rc = hvl__fail(HVL_ERR_TIMEOUT, "%s: not every rank took part for %.0f s "
                           "(HVLITE_PEER_TIMEOUT_SECONDS); a rank has died, is stopped, or cannot be reached",
                           what, waited);
        else
            rc = hvl__bound_flags(bound, waited, what);
    }
    if (!c->done) {
        c->abandoned = 1;
        __atomic_add_fetch(&stranded, 1, __ATOMIC_ACQ_REL);
    }
    return c->done ? HVL_OK : rc;
}

/* Runs the call `c` describes on a helper thread and waits for it on `bound`. */
static int run_call(split_call *c, MPI_Comm *out, hvl_bound bound, const char *what)
{
    int rc = start_helper(c, what);
    if (rc != HVL_OK) { call_free(c); return rc; }
    pthread_mutex_lock(&c->lock);
    rc = wait_done(c, &bound, what);
    pthread_mutex_unlock(&c->lock);
    if (rc != HVL_OK) return rc;               /* abandoned: the helper frees c */
    int mpi_rc = c->mpi_rc;
    *out = c->out;
    call_free(c);
    HVL_CHECK(hvl__mpi_check(mpi_rc, what));
    if (*out != MPI_COMM_NULL) MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return HVL_OK;
}

int hvl__comm_split(MPI_Comm parent, int color, int key, int by_host, MPI_Comm *out, hvl_bound bound,
                    const char *what)
{
    *out = MPI_COMM_NULL;
    split_call *c = call_new(parent, by_host ? SPLIT_BY_HOST : SPLIT);
    if (!c) return hvl__oom(what);
    c->color = color;
    c->key = key;
    return run_call(c, out, bound, what);
}

int hvl__comm_create_group(MPI_Comm parent, MPI_Group group, int tag, MPI_Comm *out, hvl_bound bound,
                           const char *what)
{
    *out = MPI_COMM_NULL;
    split_call *c = call_new(parent, CREATE_GROUP);
    if (!c) {
        MPI_Group_free(&group);
        return hvl__oom(what);
    }
    c->group = group;
    c->tag = tag;
    return run_call(c, out, bound, what);
}
