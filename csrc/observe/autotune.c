/* autotune.c: HVLITE_AUTOTUNE, the engine's side. Rank 0 measures samples: the payload bytes of
 * the responses agreed in HVLITE_AUTOTUNE_STEPS_PER_SAMPLE cycles that did work, divided by the
 * wall time from the wake-up of the sample's first such cycle to the end of its last. The first
 * HVLITE_AUTOTUNE_WARMUP_SAMPLES are discarded; the search (tune_search.c) scores the rest, names
 * the values to measure next and, after HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES scores, the values
 * to keep; they then stay fixed until shutdown.
 * New values reach every rank in the same negotiation round: rank 0 clears a flag bit of the
 * ready-bit AND (negotiate.c); in that round every rank takes rank 0's values from one small
 * broadcast (hvl__autotune_sync) before it runs the round's responses, so every rank fuses alike.
 * Rank 0 writes each sample as a CSV row to HVLITE_AUTOTUNE_LOG. The values in force are
 * published under tuning_lock for hvl_get_tuning. bg thread only, except hvl_get_tuning. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "autotune.h"
#include "request.h"

#define MAX_SAMPLES_LIMIT 100   /* the search refits its model on every sample: O(samples^3) */
#define LOG_HEADER "sample,phase,fusion_threshold,cycle_time_ms,response_cache,cycles,bytes,seconds,bytes_per_second\n"

struct hvl_autotune {
    int state;                  /* HVL_AUTOTUNE_TUNING or _CONVERGED (every rank) */
    int64_t samples;            /* rank 0: measured so far; other ranks: as of the last sync */
    /* rank 0 only */
    hvl_search *search;         /* owned */
    FILE *log;                  /* owned; NULL when no log was asked for */
    hvl_tune_point current;     /* the values in force */
    hvl_tune_point next;        /* the values the next sync hands out */
    int next_state;
    int update;                 /* 1: next/next_state wait for a sync round */
    int cycles;                 /* cycles that did work in this sample */
    int64_t bytes;              /* their payload */
    double started;             /* wake-up of the sample's first cycle; < 0 before it */
};

static pthread_mutex_t tuning_lock = PTHREAD_MUTEX_INITIALIZER;   /* a leaf lock */
static hvl_tuning published;    /* tuning_lock */

static hvl_tune_point in_force(const hvl_engine *e)
{
    return (hvl_tune_point){e->params.fusion_threshold, e->params.cycle_time_ms,
                            e->params.cache_capacity > 0 && !e->cache_bypass};
}

static void publish(const hvl_engine *e)
{
    hvl_tune_point p = in_force(e);
    const hvl_autotune *t = e->autotune;
    pthread_mutex_lock(&tuning_lock);
    published = (hvl_tuning){p.fusion_threshold, p.cycle_time_ms, p.response_cache,
                             t ? t->state : HVL_AUTOTUNE_OFF, t ? t->samples : 0};
    pthread_mutex_unlock(&tuning_lock);
}

int hvl_get_tuning(hvl_tuning *out)
{
    if (!hvl_is_initialized()) return hvl__not_running();
    pthread_mutex_lock(&tuning_lock);
    *out = published;
    pthread_mutex_unlock(&tuning_lock);
    return HVL_OK;
}

/* Rank 0 (the settings are rank 0's everywhere): why they cannot run, into error ("" if they
 * can); opens the log (*log) when asked for. */
static void check_settings(const hvl_params *p, char *error, size_t n, FILE **log)
{
    if (p->autotune_steps < 1)
        snprintf(error, n, "HVLITE_AUTOTUNE_STEPS_PER_SAMPLE=%d: it must be at least 1", p->autotune_steps);
    else if (p->autotune_max_samples < 1 || p->autotune_max_samples > MAX_SAMPLES_LIMIT)
        snprintf(error, n, "HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=%d: it must be 1 to %d",
                 p->autotune_max_samples, MAX_SAMPLES_LIMIT);
    else if (!isfinite(p->autotune_noise))
        snprintf(error, n, "HVLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE: it must be a finite number >= 0");
    else if (p->autotune_log[0] && !(*log = fopen(p->autotune_log, "w")))
        snprintf(error, n, "cannot open HVLITE_AUTOTUNE_LOG '%s' for writing: %s", p->autotune_log, strerror(errno));
}

/* Every rank starts tuning; rank 0 also gets the search and the log (log: owned, may be NULL). */
static int make_tuner(hvl_engine *e, FILE *log)
{
    hvl_autotune *t = calloc(1, sizeof(*t));
    if (!t) {
        if (log) fclose(log);
        return hvl__oom("starting autotune");
    }
    t->state = HVL_AUTOTUNE_TUNING;
    t->started = -1;
    t->log = log;
    e->autotune = t;
    if (e->rank != 0) return HVL_OK;
    t->current = in_force(e);
    if (log && (fputs(LOG_HEADER, log) < 0 || fflush(log) != 0))
        return hvl__fail(HVL_ERR_SYSTEM, "cannot write HVLITE_AUTOTUNE_LOG '%s': %s",
                         e->params.autotune_log, strerror(errno));
    return hvl__search_create(&t->search, e->params.autotune_max_samples, e->params.autotune_noise,
                              e->params.cache_capacity > 0);
}

int hvl__autotune_start(hvl_engine *e)
{
    char error[HVL_PATH_MAX + 256] = "";   /* room for the log path */
    FILE *log = NULL;
    int rc;
    if (e->rank == 0 && e->params.autotune) check_settings(&e->params, error, sizeof(error), &log);
    HVL_CHECK_GOTO(hvl__bcast_bytes(e->comm, error, (int)sizeof(error), 0, hvl__peer_bound(e),
                                    "MPI_Ibcast (autotune settings verdict)"), rc, out);
    if (error[0]) {
        e->failed_everywhere = 1;
        rc = hvl__fail(HVL_ERR_INVALID_ARG, "autotune (rank 0's settings): %s", error);
        goto out;
    }
    if (e->params.autotune) {
        rc = make_tuner(e, log);   /* takes the log, also when it fails */
        log = NULL;
        if (rc != HVL_OK) goto out;
    }
    publish(e);
out:
    if (log) fclose(log);
    return rc;
}

void hvl__autotune_stop(hvl_engine *e)
{
    hvl_autotune *t = e->autotune;
    if (!t) return;
    if (t->log) fclose(t->log);
    hvl__search_destroy(t->search);
    free(t);
    e->autotune = NULL;
}

int hvl__autotune_has_update(const hvl_engine *e) { return e->autotune && e->autotune->update; }

int hvl__autotune_sync(hvl_engine *e)
{
    hvl_autotune *t = e->autotune;
    double v[5] = {0};
    if (e->rank == 0 && t) {
        v[0] = (double)t->next.fusion_threshold;
        v[1] = t->next.cycle_time_ms;
        v[2] = t->next.response_cache;
        v[3] = t->next_state;
        v[4] = (double)t->samples;
    }
    MPI_Request req;
    HVL_CHECK(hvl__mpi_check(MPI_Ibcast(v, 5, MPI_DOUBLE, 0, e->comm, &req), "MPI_Ibcast (autotune values)"));
    HVL_CHECK(hvl__mpi_wait(&req, hvl__peer_bound(e), "autotune values from rank 0"));
    if (!t) return hvl__fail(HVL_ERR_SYSTEM, "rank 0 sent autotune values but autotune is off on rank %d", e->rank);
    e->params.fusion_threshold = (int64_t)v[0];
    e->params.cycle_time_ms = v[1];
    e->cache_bypass = v[2] == 0;
    t->state = (int)v[3];
    t->samples = (int64_t)v[4];
    t->update = 0;
    t->current = in_force(e);
    t->cycles = 0;
    t->bytes = 0;
    t->started = -1;
    publish(e);
    hvl__log(t->state == HVL_AUTOTUNE_CONVERGED ? HVL_LOG_INFO : HVL_LOG_DEBUG,
             "autotune %s after %lld samples: fusion threshold %lld B, cycle time %g ms, response cache %s",
             t->state == HVL_AUTOTUNE_CONVERGED ? "settled" : "trying", (long long)t->samples,
             (long long)t->current.fusion_threshold, t->current.cycle_time_ms,
             t->current.response_cache ? "on" : "off");
    return HVL_OK;
}

static int64_t payload_bytes(const hvl_response_list *agreed)
{
    int64_t bytes = 0;
    for (int i = 0; i < agreed->count; i++) {
        const hvl_response *r = &agreed->items[i];
        if (r->status == HVL_OK && hvl__op_is(r->d.op, HVL_OPF_DATA)) bytes += hvl__desc_bytes(&r->d);
    }
    return bytes;
}

static void log_sample(hvl_engine *e, hvl_autotune *t, int warmup, double seconds, double score)
{
    if (!t->log) return;
    const hvl_tune_point *p = &t->current;
    int n = fprintf(t->log, "%lld,%s,%lld,%g,%d,%d,%lld,%.9g,%.0f\n", (long long)t->samples,
                    warmup ? "warmup" : "tune", (long long)p->fusion_threshold, p->cycle_time_ms,
                    p->response_cache, t->cycles, (long long)t->bytes, seconds, score);
    if (n < 0 || fflush(t->log) != 0) {
        hvl__log(HVL_LOG_WARNING, "cannot write HVLITE_AUTOTUNE_LOG '%s' (%s); no more samples are logged",
                 e->params.autotune_log, strerror(errno));
        fclose(t->log);
        t->log = NULL;
    }
}

static int same_point(const hvl_tune_point *a, const hvl_tune_point *b)
{
    return a->fusion_threshold == b->fusion_threshold && a->cycle_time_ms == b->cycle_time_ms &&
           a->response_cache == b->response_cache;
}

/* Rank 0: scores the finished sample and decides what runs next. */
static void end_sample(hvl_engine *e, hvl_autotune *t)
{
    double seconds = hvl__now() - t->started;
    double score = seconds > 0 ? (double)t->bytes / seconds : 0;
    int warmup = t->samples < e->params.autotune_warmup;
    t->samples++;
    log_sample(e, t, warmup, seconds, score);
    hvl__log(HVL_LOG_DEBUG, "autotune sample %lld (%s): %.3g B/s", (long long)t->samples,
             warmup ? "warm-up" : "scored", score);
    if (!warmup) hvl__search_add(t->search, &t->current, score);
    hvl__search_pick(t->search, &t->current, &t->next);
    t->next_state = hvl__search_done(t->search) ? HVL_AUTOTUNE_CONVERGED : HVL_AUTOTUNE_TUNING;
    t->update = t->next_state == HVL_AUTOTUNE_CONVERGED || !same_point(&t->next, &t->current);
    t->cycles = 0;
    t->bytes = 0;
    t->started = -1;
}

void hvl__autotune_cycle(hvl_engine *e, const hvl_response_list *agreed, double woke)
{
    hvl_autotune *t = e->autotune;
    if (!t || e->rank != 0 || t->state != HVL_AUTOTUNE_TUNING || t->update || agreed->count == 0)
        return;
    if (t->started < 0) t->started = woke;
    t->bytes += payload_bytes(agreed);
    if (++t->cycles >= e->params.autotune_steps) end_sample(e, t);
}
