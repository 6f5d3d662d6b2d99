/* autotune.h: HVLITE_AUTOTUNE's hooks in the engine (autotune.c), and its search (tune_search.c,
 * private to autotune.c). bg thread only, except hvl_get_tuning (hvlite.h). */
#ifndef HVLITE_AUTOTUNE_H
#define HVLITE_AUTOTUNE_H

#include "engine.h"

/* Collective, at startup on every rank (after hvl__params_agree): rank 0 checks the autotune
 * settings and opens its log; a bad setting or log path fails init on every rank with rank 0's
 * message. Publishes the live values for hvl_get_tuning. */
int hvl__autotune_start(hvl_engine *e);
void hvl__autotune_stop(hvl_engine *e);                              /* cannot fail */
/* 1 on rank 0 when it has new values to hand out (negotiation then runs a sync round). */
int hvl__autotune_has_update(const hvl_engine *e);
/* Collective, in one negotiation round on every rank: applies rank 0's new values before that
 * round's responses run, so every rank fuses alike. */
int hvl__autotune_sync(hvl_engine *e);
/* After a cycle that woke at `woke` ran `agreed`: rank 0 adds it to the current sample; a full
 * sample is scored, logged, and the search picks the values to measure next (or to keep).
 * Cannot fail (a log that cannot be written is warned about and closed). */
void hvl__autotune_cycle(hvl_engine *e, const hvl_response_list *agreed, double woke);

typedef struct { int64_t fusion_threshold; double cycle_time_ms; int response_cache; } hvl_tune_point;
typedef struct hvl_search hvl_search;
/* A search that scores at most max_samples points; noise: variance on standardised scores. */
int hvl__search_create(hvl_search **out, int max_samples, double noise, int cache_allowed);
void hvl__search_destroy(hvl_search *s);
/* Records one score (bytes/s) of point p; ignored once the search is done. Cannot fail. */
void hvl__search_add(hvl_search *s, const hvl_tune_point *p, double score);
int hvl__search_done(const hvl_search *s);                          /* max_samples recorded */
/* The point to measure next; once done, the point to keep. `first` is returned before any score. */
void hvl__search_pick(hvl_search *s, const hvl_tune_point *first, hvl_tune_point *out);

#endif /* HVLITE_AUTOTUNE_H */
