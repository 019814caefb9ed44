/*
 * recv_ledger: the receiver's JSON-lines request ledger, written off the request path.
 *
 * Handlers append finished lines to an in-memory buffer under a mutex; a flusher thread
 * swaps buffers and write(2)s the full one at least every RECV_LEDGER_FLUSH_MS (sooner when
 * RECV_LEDGER_SOFT_BYTES are pending), so a request never waits for the disk unless the
 * buffer reaches RECV_LEDGER_HARD_BYTES (then appenders wait for the flusher instead of
 * dropping lines: the ledger is a test oracle). Only the flusher writes, so lines never
 * interleave. The file is opened O_APPEND: several runs may share one ledger.
 *
 * thread: recv_ledger_append from any thread; open/close from the main thread.
 */
#ifndef SL_RECV_LEDGER_H
#define SL_RECV_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"

#define RECV_LEDGER_FLUSH_MS   100                /* longest a line stays unwritten, ms */
#define RECV_LEDGER_SOFT_BYTES (256u * 1024)      /* pending bytes that wake the flusher early */
#define RECV_LEDGER_HARD_BYTES (8u * 1024 * 1024) /* pending bytes at which appenders wait */

typedef struct recv_ledger recv_ledger_t;

/* Open (create, append) path (borrowed) and start the flusher. *out (OUT) is closed with
 * recv_ledger_close. Returns 0 or -errno. */
int recv_ledger_open(const char *path, recv_ledger_t **out, sl_err_t *err);

/* Queue one line (len bytes, borrowed, must end in '\n'). */
void recv_ledger_append(recv_ledger_t *lg, const char *line, size_t len);

/* Counters for /_stats (approximate under concurrency). */
uint64_t recv_ledger_lines(recv_ledger_t *lg);        /* lines appended */
uint64_t recv_ledger_write_errors(recv_ledger_t *lg); /* failed write(2) calls */

/* Flush everything, stop the flusher, close the file, free (NULL-safe). */
void recv_ledger_close(recv_ledger_t *lg);

#endif /* SL_RECV_LEDGER_H */
