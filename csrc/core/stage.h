/* stage.h: the staged path of device memory (stage.c): how execute.c runs a batch of CUDA
 * tensors on the host planes. Private to core/. bg thread only.
 *
 * Use, for a batch whose plane runs host memory only (hvl_plane.staged):
 *     hvl_stage st;
 *     rc = hvl__stage_in(e, b, &st);         collective over the batch's set (agreed)
 *     if (rc == HVL_OK) rc = <run the batch as on host memory>;
 *     if (rc == HVL_OK) rc = hvl__stage_out(e, b, &st);
 *     hvl__stage_end(b, &st);                always: the caller's pointers back
 */
#ifndef HVLITE_STAGE_H
#define HVLITE_STAGE_H

#include "cycle.h"

typedef struct {
    const void *input;          /* the caller's device pointers, put back by hvl__stage_end */
    void *output;
    int staged;                 /* 1: this entry's buffers were swapped for host copies */
} hvl_stage_saved;

typedef struct {
    hvl_stage_saved *saved;     /* one per entry of the batch (owned) */
    uint64_t devices;           /* bit d: device d has copies of this batch on its engine stream */
} hvl_stage;

/* Waits (bounded) until every device input of the batch is in the pinned buffer, then agrees
 * with the set's members: HVL_OK only if every member staged its inputs; otherwise the error,
 * with b->failed_everywhere = 1 (every member fails the batch alike). */
int hvl__stage_in(hvl_engine *e, hvl_batch *b, hvl_stage *st);
/* Copies the results back to the caller's device outputs and waits (bounded) for the copies.
 * An error is this rank's own (the others finished the collective). */
int hvl__stage_out(hvl_engine *e, hvl_batch *b, hvl_stage *st);
void hvl__stage_end(hvl_batch *b, hvl_stage *st);           /* cannot fail */
/* The engine's stop: frees the pinned buffer and the CUDA streams (no-op if CUDA never loaded). */
void hvl__stage_free(hvl_engine *e);

#endif /* HVLITE_STAGE_H */
