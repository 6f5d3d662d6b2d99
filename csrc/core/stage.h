/* stage.h: the staged path of device memory (stage.c): how execute.c runs a batch of CUDA
 * tensors on the host planes. Private to core/. bg thread only.
 *
 * Use, for a batch whose plane runs host memory only (hvl_plane.staged):
 *     hvl_stage st;
 *     rc = hvl__stage_in(e, b, &st);         collective over the batch's set (agreed)
 *     if (rc == HVL_OK) rc = <run the batch as on host memory>;
 *     if (rc == HVL_OK) rc = hvl__stage_out(e, b, &st);
 *     hvl__stage_end(e, b, &st);             always: the caller's pointers back
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
    hvl_stage_saved *saved;     /* one per entry of the batch (owned); whole batches only */
    uint64_t devices;           /* bit d: device d has copies of this batch on its engine stream */
    int queued;                 /* copies may still run (pieces): hvl__stage_end waits for them */
    /* pieces (hvl__stage_in_pieces): */
    char *flat;                 /* the batch packed in the pinned buffer (or host memory) */
    int64_t piece_bytes;
    int npieces, reached;       /* pieces; pieces known to be in host memory */
    void **events;              /* per piece: its copies to the host done; NULL: several devices */
    int device;                 /* of the events */
    int reduced, backed;        /* pieces reduced; pieces whose copies back are queued */
    int back_entry;             /* the copies back: the entry they reached, and its flat offset */
    int64_t back_at;
    int back_rc;                /* a copy back that could not be queued (hvl__stage_out reports it) */
    char back_why[512];
} hvl_stage;

/* Waits (bounded) until every device input of the batch is in the pinned buffer, then agrees
 * with the set's members: HVL_OK only if every member staged its inputs; otherwise the error,
 * with b->failed_everywhere = 1 (every member fails the batch alike). */
int hvl__stage_in(hvl_engine *e, hvl_batch *b, hvl_stage *st);
/* Copies the results back to the caller's device outputs and waits (bounded) for the copies.
 * An error is this rank's own (the others finished the collective, or its pieces). */
int hvl__stage_out(hvl_engine *e, hvl_batch *b, hvl_stage *st);
/* Always, after either way of staging: the caller's pointers back; after an error with copies
 * still queued, a bounded wait for them (the error's status and message are kept). Cannot fail. */
void hvl__stage_end(hvl_engine *e, hvl_batch *b, hvl_stage *st);

/* Pieces: an allreduce batch staged as one flat array (st->flat, packed in entry order) and
 * copied in pieces of piece_bytes, so the copies overlap the reduction. The members use it
 * alike (decided from agreed facts: op, bytes, HVLITE_STAGED_PIECE). Use:
 *     rc = hvl__stage_in_pieces(e, b, &st, piece);    copies queued, members agreed (collective)
 *     for each piece k, in order, while rc == HVL_OK:
 *         rc = hvl__stage_piece_wait(e, b, &st, k);   bounded: piece k is in host memory
 *         reduce st.flat's piece k in place (every member: one collective per piece)
 *         hvl__stage_piece_back(b, &st, k);           its copies back queued, once every copy
 *                                                     to the host is seen done (else later)
 *     if (rc == HVL_OK) rc = hvl__stage_out(e, b, &st);   bounded wait for the copies back; a
 *                                                     copy back that failed is this rank's error
 *     hvl__stage_end(e, b, &st);
 * The entries' pointers are not swapped. A joined rank's stand-ins are copied in by memcpy and
 * their results dropped. A piece's wait that fails stops this rank's pieces: the other members
 * then fail in their next piece by the peer timeout (a buffer the GPU may still write must not
 * be reduced). */
int hvl__stage_in_pieces(hvl_engine *e, hvl_batch *b, hvl_stage *st, int64_t piece_bytes);
int hvl__stage_piece_wait(hvl_engine *e, const hvl_batch *b, hvl_stage *st, int k);
void hvl__stage_piece_back(const hvl_batch *b, hvl_stage *st, int k);
/* The engine's stop: frees the pinned buffer and the CUDA streams (no-op if CUDA never loaded). */
void hvl__stage_free(hvl_engine *e);

#endif /* HVLITE_STAGE_H */
