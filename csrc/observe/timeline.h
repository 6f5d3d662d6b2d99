/* timeline.h: the timeline's hooks in the cycle (timeline.c records, timeline_json.c writes).
 * Rank 0 only. While a timeline is open, the bg thread's hooks append binary records to one
 * lock-protected buffer; the writer thread swaps it out, turns it into Chrome trace JSON and
 * appends that to the file. Each hook is guarded by `if (hvl__tl_active())` at its call site, so
 * a job without a timeline pays one relaxed load per hook and nothing else. The writer's own
 * types are private to observe/ (timeline_writer.h). */
#ifndef HVLITE_TIMELINE_H
#define HVLITE_TIMELINE_H

#include "cycle.h"

extern int hvl__tl_on;          /* atomic, relaxed: 1 while rank 0 records (a hint; hooks recheck) */
static inline int hvl__tl_active(void) { return __atomic_load_n(&hvl__tl_on, __ATOMIC_RELAXED); }

/* bg thread hooks (each records now, unless it takes a time). Names are copied. */
void hvl__tl_submitted(const hvl_entry *en);                 /* rank 0 took its own request */
void hvl__tl_arrived(const char *name, int op, int rank);    /* coordinator: rank's request came */
void hvl__tl_agreed(const char *name, int status, const char *error, int cache_hit);
void hvl__tl_note(const char *name, const char *what, const char *detail);   /* e.g. a stall */
void hvl__tl_cycle_begin(void);
void hvl__tl_negotiated(void);                               /* this cycle's negotiation ended */
/* An allreduce piece of `bytes`: copy-in from t_in, reduce from t_reduce, copy-out from t_out
 * until now. */
void hvl__tl_piece(double t_in, double t_reduce, double t_out, int64_t bytes);
/* The next batch ran on a device plane from t_start: on the host clock its GPU waited for the
 * inputs' ready events until phases[0], copied them into the fusion buffer until phases[1], ran
 * the collective until phases[2] and copied the results out until phases[3]
 * (hvl_device_batch.phases; 0: unknown, taken as the phase before's end). */
void hvl__tl_device_phases(double t_start, const double *phases);
void hvl__tl_batch(const hvl_batch *b, double t_start, int rc);   /* b ran from t_start */
void hvl__tl_cycle_end(int agreed);                          /* agreed: responses this cycle */

/* Engine life: startup opens HVLITE_TIMELINE on rank 0 and agrees with every rank on the
 * outcome (collective; an unwritable path fails init on every rank); close stops any open
 * timeline (flushing it). */
int hvl__timeline_startup(hvl_engine *e);
void hvl__timeline_close(void);

#endif /* HVLITE_TIMELINE_H */
