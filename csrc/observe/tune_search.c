/* tune_search.c: autotune's search, on noisy scores in a bounded number of samples (rank 0's bg
 * thread; computation only, no MPI).
 * Candidates form a grid: fusion threshold 64 KiB * 4^k (k = 0..5) and 128 MiB; cycle time 0.25,
 * 0.5, 1, 2, 5 and 10 ms; response cache on and off (off only, when there is no cache).
 * A Gaussian process models the score (bytes/s, standardised over the scores so far) over
 * x = (log2 threshold, log2 cycle time, each scaled to [0, 1] across the grid; cache 0/1), with a
 * squared-exponential kernel and HVLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE as the noise variance on
 * its diagonal (0.8: most of the spread between two samples may be noise; 0: trust each sample).
 * The first sample measures the starting values; each next one, the candidate of largest
 * expected improvement over the best posterior mean at a measured point (measuring a point
 * again is allowed: with noise it can be the better bet). After max_samples scores it keeps the
 * measured point of highest posterior mean, which weighs every sample of that point and of its
 * neighbours, so a single lucky sample does not decide. */
#include <math.h>
#include <stdlib.h>
#include "autotune.h"

#define NDIM 3
#define XI 0.01                 /* EI's margin, in standard deviations of the scores */
#define SQRT_2PI 2.5066282746310002
static const int64_t thresholds[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20};
static const double cycles_ms[] = {0.25, 0.5, 1, 2, 5, 10};
#define N_THRESHOLDS (int)(sizeof(thresholds) / sizeof(thresholds[0]))
#define N_CYCLES (int)(sizeof(cycles_ms) / sizeof(cycles_ms[0]))
/* Two grid neighbours (1/6 apart) correlate 0.86; cache on vs off 0.61. */
static const double length_scale[NDIM] = {0.3, 0.3, 1.0};

struct hvl_search {
    int max, n;                 /* capacity, scores recorded */
    int cache_allowed;
    double noise;
    hvl_tune_point *points;     /* n measured points */
    double *x;                  /* n * NDIM inputs */
    double *y;                  /* n raw scores */
    double *alpha, *work;       /* max each: (K + noise I)^-1 y; scratch */
    double *chol;               /* max * max: lower Cholesky factor of K + noise I */
};

int hvl__search_create(hvl_search **out, int max_samples, double noise, int cache_allowed)
{
    hvl_search *s = calloc(1, sizeof(*s));
    size_t m = (size_t)max_samples;
    if (s) {
        s->max = max_samples;
        s->noise = noise > 1e-6 ? noise : 1e-6;   /* keeps the factorisation well defined */
        s->cache_allowed = cache_allowed;
        s->points = calloc(m, sizeof(hvl_tune_point));
        s->x = calloc(m * NDIM, sizeof(double));
        s->y = calloc(m * 3, sizeof(double));
        s->chol = calloc(m * m, sizeof(double));
    }
    if (!s || !s->points || !s->x || !s->y || !s->chol) {
        hvl__search_destroy(s);
        return hvl__fail(HVL_ERR_NO_MEMORY, "out of memory for autotune's search (%d samples)", max_samples);
    }
    s->alpha = s->y + m;
    s->work = s->y + 2 * m;
    *out = s;
    return HVL_OK;
}

void hvl__search_destroy(hvl_search *s)
{
    if (!s) return;
    free(s->points);
    free(s->x);
    free(s->y);
    free(s->chol);
    free(s);
}

int hvl__search_done(const hvl_search *s) { return s->n >= s->max; }

static double scaled(double v, double lo, double hi) { return (log2(v) - log2(lo)) / (log2(hi) - log2(lo)); }

static void encode(const hvl_tune_point *p, double *x)
{
    double threshold = p->fusion_threshold > 0 ? (double)p->fusion_threshold : 1.0;
    x[0] = scaled(threshold, (double)thresholds[0], (double)thresholds[N_THRESHOLDS - 1]);
    x[1] = scaled(p->cycle_time_ms > 0.01 ? p->cycle_time_ms : 0.01, cycles_ms[0], cycles_ms[N_CYCLES - 1]);
    x[2] = p->response_cache ? 1.0 : 0.0;
}

static double kernel(const double *a, const double *b)
{
    double d = 0;
    for (int i = 0; i < NDIM; i++) {
        double t = (a[i] - b[i]) / length_scale[i];
        d += t * t;
    }
    return exp(-0.5 * d);
}

void hvl__search_add(hvl_search *s, const hvl_tune_point *p, double score)
{
    if (hvl__search_done(s)) return;
    s->points[s->n] = *p;
    encode(p, &s->x[s->n * NDIM]);
    s->y[s->n++] = score;
}

/* Solves L v = b in place (L: the factor, lower triangular). */
static void forward(const hvl_search *s, double *v)
{
    for (int i = 0; i < s->n; i++) {
        double sum = v[i];
        for (int k = 0; k < i; k++) sum -= s->chol[i * s->max + k] * v[k];
        v[i] = sum / s->chol[i * s->max + i];
    }
}

/* Standardises the scores, factors K + noise I = L L^T and solves alpha = (K + noise I)^-1 y. */
static void fit(hvl_search *s)
{
    int n = s->n, m = s->max;
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += s->y[i] / n;
    for (int i = 0; i < n; i++) var += (s->y[i] - mean) * (s->y[i] - mean) / n;
    double sd = var > 0 ? sqrt(var) : 1.0;
    for (int i = 0; i < n; i++) s->alpha[i] = (s->y[i] - mean) / sd;
    for (int j = 0; j < n; j++) {
        double d = 1.0 + s->noise;
        for (int k = 0; k < j; k++) d -= s->chol[j * m + k] * s->chol[j * m + k];
        s->chol[j * m + j] = sqrt(d > 1e-12 ? d : 1e-12);
        for (int i = j + 1; i < n; i++) {
            double v = kernel(&s->x[i * NDIM], &s->x[j * NDIM]);
            for (int k = 0; k < j; k++) v -= s->chol[i * m + k] * s->chol[j * m + k];
            s->chol[i * m + j] = v / s->chol[j * m + j];
        }
    }
    forward(s, s->alpha);
    for (int i = n - 1; i >= 0; i--) {           /* L^T alpha = z */
        double sum = s->alpha[i];
        for (int k = i + 1; k < n; k++) sum -= s->chol[k * m + i] * s->alpha[k];
        s->alpha[i] = sum / s->chol[i * m + i];
    }
}

/* Posterior mean and standard deviation of the (standardised, noise-free) score at x. */
static void predict(hvl_search *s, const double *x, double *mean, double *sd)
{
    double mu = 0, explained = 0;
    for (int i = 0; i < s->n; i++) {
        s->work[i] = kernel(&s->x[i * NDIM], x);
        mu += s->work[i] * s->alpha[i];
    }
    forward(s, s->work);
    for (int i = 0; i < s->n; i++) explained += s->work[i] * s->work[i];
    *mean = mu;
    *sd = explained < 1.0 ? sqrt(1.0 - explained) : 0.0;
}

static double expected_improvement(double mean, double sd, double best)
{
    double gain = mean - best - XI;
    if (sd < 1e-9) return gain > 0 ? gain : 0;
    double z = gain / sd;
    return gain * 0.5 * erfc(-z / sqrt(2.0)) + sd * exp(-0.5 * z * z) / SQRT_2PI;
}

/* The grid candidate of largest expected improvement over `best` (the first of equals). */
static hvl_tune_point most_promising(hvl_search *s, double best)
{
    hvl_tune_point pick = {0}, c;
    double top = -1, x[NDIM], mean, sd;
    for (int t = 0; t < N_THRESHOLDS; t++)
        for (int k = 0; k < N_CYCLES; k++)
            for (int cache = s->cache_allowed; cache >= 0; cache--) {
                c = (hvl_tune_point){thresholds[t], cycles_ms[k], cache};
                encode(&c, x);
                predict(s, x, &mean, &sd);
                double ei = expected_improvement(mean, sd, best);
                if (ei > top) top = ei, pick = c;
            }
    return pick;
}

void hvl__search_pick(hvl_search *s, const hvl_tune_point *first, hvl_tune_point *out)
{
    if (s->n == 0) {
        *out = *first;
        return;
    }
    fit(s);
    double best = -INFINITY, mean, sd;
    int best_i = 0;
    for (int i = 0; i < s->n; i++) {
        predict(s, &s->x[i * NDIM], &mean, &sd);
        if (mean > best) best = mean, best_i = i;
    }
    *out = hvl__search_done(s) ? s->points[best_i] : most_promising(s, best);
}
