/* coordinator.h: rank 0's table of tensors and who submitted them (coordinator.c), private to
 * the negotiation (negotiate.c). bg thread of rank 0 only. */
#ifndef HVLITE_COORDINATOR_H
#define HVLITE_COORDINATOR_H

#include "engine.h"

typedef struct hvl_coordinator hvl_coordinator;
int hvl__coordinator_create(hvl_coordinator **out, hvl_engine *e);
void hvl__coordinator_destroy(hvl_coordinator *c);                  /* NULL is fine */
/* Parses one rank's requests; tensors now submitted by every member go to `ready`, in order. */
int hvl__coordinator_add(hvl_coordinator *c, int rank, hvl_buf *requests, hvl_response_list *ready);
/* Warns (once per tensor) about tensors some members submitted warn_s seconds ago; past
 * shutdown_s (if > 0) the tensor leaves the table as an HVL_ERR_TIMEOUT response in `ready`,
 * which stops the engine on every rank with that message. */
int hvl__coordinator_stall_check(hvl_coordinator *c, double warn_s, double shutdown_s,
                                 hvl_response_list *ready);
/* Forgets the tensors of a removed process set (their ranks fail them themselves). */
void hvl__coordinator_drop_set(hvl_coordinator *c, int set);

#endif /* HVLITE_COORDINATOR_H */
