/*
 * prod_lines: bounded line reader for sluice-produce input (stdin or a file).
 *
 * Lines are returned in place from one buffer that never grows past max_line + one read
 * chunk, whatever the input holds: a line longer than max_line is skipped to its newline and
 * reported as SL_ETOOBIG with its number, so one huge line cannot exhaust memory nor stop the
 * lines after it. Line numbers are 1-based and count every line, reported or not.
 *
 * thread: one reader per thread; a reader is a plain value owned by the caller.
 */
#ifndef PROD_LINES_H
#define PROD_LINES_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"

struct prod_lines {
    int fd;                            /* input; -1 when closed */
    bool own_fd;                       /* fd was opened here (closed by prod_lines_close) */
    bool eof;                          /* read() returned 0 */
    bool skipping;                     /* inside a line longer than max_line */
    char *buf;                         /* read buffer, max_line + chunk + 1 bytes at most */
    size_t cap;                        /* bytes allocated in buf */
    size_t start;                      /* offset of the first unreturned byte */
    size_t end;                        /* offset one past the last byte read */
    size_t scanned;                    /* bytes after start already searched for '\n' */
    size_t max_line;                   /* bytes; longest line accepted, excluding the newline */
    uint64_t lineno;                   /* number of the line returned last (1-based) */
    const char *name;                  /* input name for messages (borrowed): the path or "stdin" */
    const volatile sig_atomic_t *stop; /* set (by a signal handler) = a read interrupted by a
                                          signal returns SL_ESTATE; NULL = reads resume */
};

/*
 * Open path for reading ("-" or NULL = stdin; path borrowed for the reader's lifetime).
 * max_line: bytes, >= 1. Returns 0, or -errno with err naming the path.
 */
int prod_lines_open(struct prod_lines *lr, const char *path, size_t max_line, sl_err_t *err);

/*
 * Next line: returns 1 with *line / *len (OUT; borrowed until the next call, NUL-terminated
 * in place, newline excluded; a final line without a newline counts), 0 at end of input,
 * SL_ETOOBIG for a line over max_line (skipped; lr->lineno is its number), or -errno on a
 * read error (err filled).
 */
int prod_lines_next(struct prod_lines *lr, const char **line, size_t *len, sl_err_t *err);

/* Close the input if opened here and free the buffer. NULL-safe, idempotent. */
void prod_lines_close(struct prod_lines *lr);

#endif /* PROD_LINES_H */
