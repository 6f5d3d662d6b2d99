/* timeline_writer.h: the timeline's private types, shared by timeline.c (records, life),
 * timeline_json.c (the writer thread) and timeline_file.c (the file kept valid JSON).
 *
 * Records, as the writer reads them: u32 kind, then by kind (str = i32 length, bytes, NUL):
 *   SUBMIT  f64 t, i32 op, str name          ARRIVE  f64 t, i32 op, i32 rank, i64 round, str name
 *   AGREED  f64 t, i32 status, i32 cache_hit, str name, str error
 *   NOTE    f64 t, str name, str what, str detail
 *   BATCH   f64 t0, f64 t1, i32 op, i32 dtype, i32 status, i32 count, i32 scale_in,
 *           i32 scale_out, i32 device, i32 left_running, i32 npieces, str backend, str error,
 *           npieces x hvl_tl_piece, count x (i64 bytes, str name)
 *   CYCLE   f64 t0, f64 t_negotiated, f64 t1, i32 agreed, i32 batches, i32 tensors, i64 bytes
 * The writer wakes every HVL_TL_FLUSH_S, or sooner once HVL_TL_FLUSH_BYTES of records wait. */
#ifndef HVLITE_TIMELINE_WRITER_H
#define HVLITE_TIMELINE_WRITER_H

#include "timeline.h"

enum { HVL_TL_SUBMIT = 1, HVL_TL_ARRIVE, HVL_TL_AGREED, HVL_TL_NOTE, HVL_TL_BATCH, HVL_TL_CYCLE };
typedef struct { double t_in, t_reduce, t_out, t_done; int64_t bytes; } hvl_tl_piece;
#define HVL_TL_FLUSH_S 0.05
#define HVL_TL_FLUSH_BYTES (1 << 20)
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* the writer sleeps on it (monotonic clock) */
    int open;                   /* lock: records are accepted */
    int stop;                   /* lock: the writer writes what is left and exits */
    hvl_buf records;            /* lock: not yet taken by the writer */
    int64_t dropped;            /* lock: records refused because the writer fell behind */
    /* set before the writer starts, then the writer's alone until it is joined */
    int fd;
    char *path;                 /* owned */
    double epoch;               /* hvl__now() at start: ts 0 */
    int mark_cycles, size;
    int64_t end;                /* file offset after the last event written */
    int64_t close_at;           /* file offset of the closing ']'; spaces from end up to it */
    int64_t events;             /* events written */
} hvl_timeline;
/* timeline_file.c: creates the file with its head (HVL_ERR_INVALID_ARG with the path and the
 * reason if it cannot); appends events (each ",\n{...}", no raw newline inside) keeping the
 * file valid JSON; ends it after the last event. timeline_json.c: the writer thread's body. */
int hvl__tl_file_open(hvl_timeline *tl);
int hvl__tl_file_append(hvl_timeline *tl, const char *events, size_t len);
void hvl__tl_file_finish(hvl_timeline *tl);
void *hvl__tl_writer_main(void *tl);

#endif /* HVLITE_TIMELINE_WRITER_H */
