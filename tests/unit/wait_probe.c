/* Test probe (tests/unit/test_wait_single.py): how the engine waits between cycles (engine.c's
 * wait_for_work), on a machine without a GPU. engine.c is compiled into this probe with the
 * three things that wait asks answered by the probe: whether a request arrived (the queue),
 * whether the GPU has written every held tensor (ready.c), and the device batches left running
 * (execute.c's settle). Each answer is logged with the time it was asked; the test reads when
 * the wait looked and when it returned. The engine's own clock, lock and condition variable are
 * used as they are, so the times are real. Holding on a real GPU is tests/test_gpu.py's
 * "once_written" test (make test-gpu). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* engine.c's calls to these go to the probe; its public functions are compiled here under other
 * names, so the engine's stay untouched (wait_for_work itself is static) */
#define hvl__queue_has_work probe_queue_has_work
#define hvl__ready_all_written probe_ready_all_written
#define hvl__execute_settle probe_execute_settle
#define hvl_init probe_hvl_init_
#define hvl_shutdown probe_hvl_shutdown_
#include "../../csrc/core/engine.c"

#define LOG_MAX 4096
typedef struct {
    char what;          /* 'w': asked whether every held tensor is written; 's': settle; 'q': the queue */
    int how;            /* settle's how */
    double at;          /* seconds since the wait began */
} log_record;

static hvl_engine engine;
static log_record records[LOG_MAX];
static int nrecords, dropped;
static double began, returned_after;
static int written_after;       /* the GPU has written every held tensor from this look on (-1: never) */
static int looks;
static int settle_fails_at;     /* settle's call number (from 1) that fails; 0: none */
static int settles;
static int work;                /* a request arrived (queue_lock) */
static int waiting;             /* a wait has begun (queue_lock) */
static double submitted_after;  /* when the request arrived, since the wait began (queue_lock) */

static void note(char what, int how)
{
    if (nrecords == LOG_MAX) {
        dropped++;
        return;
    }
    records[nrecords++] = (log_record){what, how, hvl__now() - began};
}

int probe_queue_has_work(const hvl_engine *e, double now, double *until)
{
    (void)e, (void)now, (void)until;
    note('q', 0);
    return work;
}

int probe_ready_all_written(hvl_engine *e)
{
    (void)e;
    note('w', 0);
    looks++;
    return written_after >= 0 && looks >= written_after;
}

int probe_execute_settle(hvl_engine *e, int how)
{
    (void)e;
    note('s', how);
    if (++settles == settle_fails_at) return hvl__fail(HVL_ERR_NCCL, "the probe's settle fails");
    return HVL_OK;
}

/* held: CUDA tensors are held (held_for_gpu); in_flight: device batches left running;
 * written: the look from which the GPU has written them all (-1: never); settle_fails: that
 * settle call fails (0: none). */
void probe_reset(int held, int in_flight, int written, int settle_fails)
{
    static int made;
    if (!made) {
        pthread_mutex_init(&engine.queue_lock, NULL);
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);   /* as the engine makes it */
        pthread_cond_init(&engine.wake_cond, &attr);
        pthread_condattr_destroy(&attr);
        made = 1;
    }
    engine.held_for_gpu = held;
    engine.nin_flight = in_flight;
    engine.shutdown_requested = 0;
    written_after = written;
    settle_fails_at = settle_fails;
    looks = settles = nrecords = dropped = 0;
    work = waiting = 0;
    submitted_after = -1;
}

/* wait_for_work up to `seconds` from now: its status; how long it took in probe_returned(). */
int probe_wait(double seconds)
{
    pthread_mutex_lock(&engine.queue_lock);
    began = hvl__now();
    waiting = 1;
    pthread_mutex_unlock(&engine.queue_lock);
    int rc = wait_for_work(&engine, began + seconds);
    returned_after = hvl__now() - began;
    return rc;
}

/* Whether a wait has begun since the reset. */
int probe_waiting(void)
{
    pthread_mutex_lock(&engine.queue_lock);
    int began_yet = waiting;
    pthread_mutex_unlock(&engine.queue_lock);
    return began_yet;
}

/* A request arrives, as queue.c's submit signals it; probe_submitted() says when. */
void probe_submit(void)
{
    pthread_mutex_lock(&engine.queue_lock);
    submitted_after = waiting ? hvl__now() - began : -1;
    work = 1;
    pthread_cond_signal(&engine.wake_cond);
    pthread_mutex_unlock(&engine.queue_lock);
}

double probe_returned(void) { return returned_after; }
double probe_submitted(void) { return submitted_after; }   /* -1: before the wait began */
int probe_log_count(void) { return nrecords; }
int probe_log_dropped(void) { return dropped; }
int probe_log_what(int i) { return records[i].what; }
int probe_log_how(int i) { return records[i].how; }
double probe_log_at(int i) { return records[i].at; }
