/*
 * sl_pg: libpq helpers shared by sluicectl and the recorder: connect with server notices
 * routed through sl_log (never to stderr raw), and result checks that turn a failed query
 * into an sl_err_t naming what was attempted and PostgreSQL's own message (which never
 * contains our parameters: we always pass values as parameters, not in the SQL text).
 *
 * thread: one PGconn per thread.
 */
#ifndef SL_PG_H
#define SL_PG_H

#include <libpq-fe.h>

#include "common/sl_err.h"

/* Connect; NULL with err filled on failure (the DSN's password is never in the message). */
PGconn *sl_pg_connect(const char *dsn, sl_err_t *err);

/* PQexecParams with text params; returns the result (caller PQclear) when its status is
 * COMMAND_OK or TUPLES_OK, else NULL with err filled ("could not <what>: <pg message>"). */
PGresult *sl_pg_exec(PGconn *pg,
                     const char *what,
                     const char *sql,
                     int nparams,
                     const char *const *params,
                     sl_err_t *err);

/* Run a statement with no result rows; 0 or SL_EPG. */
int sl_pg_cmd(PGconn *pg,
              const char *what,
              const char *sql,
              int nparams,
              const char *const *params,
              sl_err_t *err);

#endif /* SL_PG_H */
