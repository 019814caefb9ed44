/*
 * prod_lines: bounded line reader (see prod_lines.h).
 *
 * The buffer holds [start, end) unreturned bytes; returned lines are consumed by moving start.
 * Before reading more, the unreturned tail is moved to the front, so the buffer only needs
 * room for the longest acceptable line plus one read.
 */
#include "producer/prod_lines.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sl_mem.h"

#define READ_CHUNK ((size_t)64 * 1024) /* bytes per read(2) */

int prod_lines_open(struct prod_lines *lr, const char *path, size_t max_line, sl_err_t *err)
{
    memset(lr, 0, sizeof(*lr));
    lr->fd = -1;
    lr->max_line = max_line ? max_line : 1;
    if (!path || strcmp(path, "-") == 0) {
        lr->fd = STDIN_FILENO;
        lr->name = "stdin";
        return 0;
    }
    lr->name = path;
    lr->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (lr->fd < 0) {
        int e = errno;
        return sl_err_set(err, -e, "could not open %s: %s", path, strerror(e));
    }
    lr->own_fd = true;
    return 0;
}

/* Make room for one more read: drop consumed bytes, grow up to the bound. */
static void make_room(struct prod_lines *lr)
{
    if (lr->start > 0) {
        memmove(lr->buf, lr->buf + lr->start, lr->end - lr->start);
        lr->end -= lr->start;
        lr->start = 0;
    }
    size_t want = lr->end + READ_CHUNK + 1; /* +1: room for a NUL after a final line */
    if (want > lr->cap) {
        lr->buf = sl_xrealloc(lr->buf, want);
        lr->cap = want;
    }
}

/* Read once; returns bytes read (0 at EOF) or -errno. */
static long fill(struct prod_lines *lr, sl_err_t *err)
{
    make_room(lr);
    for (;;) {
        ssize_t n = read(lr->fd, lr->buf + lr->end, lr->cap - lr->end - 1);
        if (n >= 0) {
            lr->end += (size_t)n;
            if (n == 0)
                lr->eof = true;
            return (long)n;
        }
        if (errno != EINTR) {
            int e = errno;
            return sl_err_set(err, -e, "could not read %s: %s", lr->name, strerror(e));
        }
        if (lr->stop && *lr->stop) /* a read waiting for input (a pipe, a terminal) */
            return sl_err_set(err, SL_ESTATE, "reading %s stopped by a signal", lr->name);
    }
}

int prod_lines_next(struct prod_lines *lr, const char **line, size_t *len, sl_err_t *err)
{
    for (;;) {
        /* buf is NULL until the first read: no pointer arithmetic on it before then */
        char *base = lr->buf ? lr->buf + lr->start : NULL;
        size_t avail = lr->end - lr->start;
        char *nl = base && avail > lr->scanned
                       ? memchr(base + lr->scanned, '\n', avail - lr->scanned)
                       : NULL;
        if (nl) {
            size_t n = (size_t)(nl - base);
            lr->start += n + 1;
            lr->scanned = 0;
            lr->lineno++;
            if (lr->skipping || n > lr->max_line) {
                lr->skipping = false;
                return SL_ETOOBIG;
            }
            *nl = '\0';
            *line = base;
            *len = n;
            return 1;
        }
        lr->scanned = avail;
        if (lr->eof) {
            if (avail == 0 && !lr->skipping)
                return 0;
            /* final line without a newline */
            lr->start = lr->end;
            lr->scanned = 0;
            lr->lineno++;
            if (lr->skipping || avail > lr->max_line) {
                lr->skipping = false;
                return SL_ETOOBIG;
            }
            base[avail] = '\0'; /* fill() always leaves one spare byte */
            *line = base;
            *len = avail;
            return 1;
        }
        if (avail > lr->max_line) {
            /* Too long already: forget it and look only for its end. */
            lr->skipping = true;
            lr->start = lr->end;
            lr->scanned = 0;
        }
        long r = fill(lr, err);
        if (r < 0)
            return (int)r;
    }
}

void prod_lines_close(struct prod_lines *lr)
{
    if (!lr)
        return;
    if (lr->own_fd && lr->fd >= 0)
        close(lr->fd);
    lr->fd = -1;
    lr->own_fd = false;
    free(lr->buf);
    lr->buf = NULL;
    lr->cap = lr->start = lr->end = lr->scanned = 0;
}
