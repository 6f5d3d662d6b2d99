/* timeline_file.c: the timeline file, kept valid JSON at every moment, also when the process is
 * killed in the middle of a write (SIGKILL, or the launcher's SIGTERM).
 *
 * A plain "overwrite the closing ']' with the new events plus ']'" is not enough: Linux copies a
 * write into the page cache page by page and stops between pages when a fatal signal is
 * pending, so a killed multi-page write leaves a cut file (seen: 1 file in 30 killed while
 * recording 20 MB/s). A write that stays inside one page is copied whole or not at all. So:
 *   - the file is "[" events, then a gap of spaces, then "]" at close_at;
 *   - events are written into the gap, whole events per write, each write inside one page (an
 *     event that would cross a page boundary starts on the next page; the spaces it skips are
 *     JSON whitespace). Every write leaves "[" events spaces "]": valid.
 *   - when the gap runs out it grows by a quarter of the file (at least GAP_MIN): spaces are
 *     appended after the "]" (still valid), then the "]" moves: "]" written at the new end,
 *     then " " over the old one. Only between those two one-byte writes is the file not valid
 *     JSON: a few microseconds, a few dozen times in a long run.
 *   - a clean finish ends the file right after the last event and cuts the gap off (again two
 *     calls apart).
 * An event longer than a page (a tensor name of several KiB) cannot be written in one page;
 * it is written in one call, and a kill during that call can cut it.
 * Writer thread (and the thread that opens or finishes the timeline); no locks needed: only
 * the one thread that owns the timeline at that moment touches the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "timeline_writer.h"

#define GAP_MIN ((int64_t)256 << 10)

static int64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? p : 4096;
}

static int write_at(int fd, const char *p, size_t n, int64_t offset)
{
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)offset);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : EIO;
        p += k, n -= (size_t)k, offset += k;
    }
    return 0;
}

/* n spaces at offset (any prefix of them written keeps the file valid where they go). */
static int spaces_at(int fd, int64_t offset, int64_t n)
{
    static char spaces[64 * 1024];
    if (!spaces[0]) memset(spaces, ' ', sizeof(spaces));
    while (n > 0) {
        size_t k = n < (int64_t)sizeof(spaces) ? (size_t)n : sizeof(spaces);
        int err = write_at(fd, spaces, k, offset);
        if (err) return err;
        offset += (int64_t)k, n -= (int64_t)k;
    }
    return 0;
}

/* Makes the gap reach past `need` (the "]" stays after everything written). */
static int ensure_gap(hvl_timeline *tl, int64_t need)
{
    if (need < tl->close_at) return 0;
    int64_t grow = tl->close_at / 4 > GAP_MIN ? tl->close_at / 4 : GAP_MIN;
    while (tl->close_at + grow <= need) grow *= 2;
    int64_t to = tl->close_at + grow;
    int err = spaces_at(tl->fd, tl->close_at + 1, grow);                 /* after "]": valid */
    if (!err) err = write_at(tl->fd, "]", 1, to);
    if (!err) err = write_at(tl->fd, " ", 1, tl->close_at);              /* valid again */
    if (!err) tl->close_at = to;
    return err;
}

/* End of the event that starts at p (each is ",\n{...}"; JSON strings never hold a raw
 * newline, so the next "\n" after the first belongs to the next event). */
static const char *event_end(const char *p, const char *stop)
{
    const char *nl = p + 2 < stop ? memchr(p + 2, '\n', (size_t)(stop - p - 2)) : NULL;
    return nl ? nl - 1 : stop;
}

int hvl__tl_file_append(hvl_timeline *tl, const char *events, size_t len)
{
    const int64_t page = page_size();
    const char *p = events, *stop = events + len;
    while (p < stop) {
        int64_t room = page - tl->end % page;
        const char *q = p;
        for (const char *next; q < stop && (next = event_end(q, stop)) - p <= room;) q = next;
        if (q == p) {                      /* the next event does not fit in this page's rest */
            q = event_end(p, stop);
            if (q - p <= page && room < page) { tl->end += room; continue; }
        }
        int err = ensure_gap(tl, tl->end + (q - p));
        if (!err) err = write_at(tl->fd, p, (size_t)(q - p), tl->end);
        if (err) {
            (void)spaces_at(tl->fd, tl->end, q - p);   /* blank a part-written event if we can */
            return hvl__fail(HVL_ERR_SYSTEM, "writing %s: %s", tl->path, strerror(err));
        }
        tl->end += q - p;
        p = q;
    }
    return HVL_OK;
}

int hvl__tl_file_open(hvl_timeline *tl)
{
    tl->fd = open(tl->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (tl->fd < 0)
        return hvl__fail(HVL_ERR_INVALID_ARG, "timeline: cannot open '%s' for writing: %s", tl->path,
                         strerror(errno));
    char head[512];
    int n = snprintf(head, sizeof(head),
        "[\n{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\","
        "\"args\":{\"name\":\"hvlite: rank 0's view of %d ranks\"}},"
        "\n{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":\"cycles\"}},"
        "\n{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":0}}",
        tl->size);
    tl->end = n;
    tl->close_at = n + GAP_MIN;
    tl->events = 3;
    int err = write_at(tl->fd, head, (size_t)n, 0);
    if (!err) err = spaces_at(tl->fd, n, GAP_MIN);
    if (!err) err = write_at(tl->fd, "]\n", 2, tl->close_at);
    if (err) {
        close(tl->fd);
        tl->fd = -1;
        return hvl__fail(HVL_ERR_INVALID_ARG, "timeline: cannot write '%s': %s", tl->path, strerror(err));
    }
    return HVL_OK;
}

void hvl__tl_file_finish(hvl_timeline *tl)
{
    /* "\n]\n" right after the events, then the gap is cut off (a kill between the two calls
     * would leave a second "]" behind the spaces; nothing else can). */
    if (write_at(tl->fd, "\n]\n", 3, tl->end) == 0 && ftruncate(tl->fd, (off_t)(tl->end + 3)) == 0) {
        tl->close_at = tl->end + 1;
        return;
    }
    hvl__log_once("timeline finish", HVL_LOG_WARNING, "timeline: could not trim %s; it stays valid, "
                  "with trailing spaces", tl->path);
    (void)spaces_at(tl->fd, tl->end, 3);
}
