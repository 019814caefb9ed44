/*
 * sl_pg: libpq helpers shared by sluicectl, the recorder, the replay engine and sluice-api:
 * connect with server notices routed through sl_log (never to stderr raw), result checks
 * that turn a failed query into an sl_err_t naming what was attempted and PostgreSQL's own
 * message (which never contains our parameters: we always pass values as parameters, not in
 * the SQL text), field accessors by column name, and text-array parameters.
 *
 * thread: one PGconn per thread.
 */
#ifndef SL_PG_H
#define SL_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/sl_err.h"

/*
 * Start a connection to dsn with Sluice's defaults, which the DSN may override: connect
 * timeout 5 s, TCP keepalives, tcp_user_timeout 30 s (a server that stops answering fails a
 * connect within 5 s and a query within 30 s, not after TCP's minutes), application_name app
 * (NULL: libpq's); PGCONNECT_TIMEOUT and PGAPPNAME, when set, replace the timeout and the
 * name as well. Returns libpq's connection whatever its status (NULL only out of memory); the
 * caller checks PQstatus.
 */
PGconn *sl_pg_open(const char *dsn, const char *app);

/* sl_pg_open, checked: NULL with err filled on failure (the DSN's password is never in the
 * message). */
PGconn *sl_pg_connect(const char *dsn, sl_err_t *err);

/*
 * A failed statement's reason for an error message or a log line: its SQLSTATE and primary
 * message only ("23514 new row for relation ... violates check constraint ..."), never the
 * DETAIL, which may quote the row (an endpoint's URL, a sealed secret). Without a result
 * (connection lost), the connection's own message, whose text names no row. Into buf.
 */
const char *sl_pg_reason(const PGresult *res, PGconn *pg, char *buf, size_t cap);

/* PQexecParams with text params; returns the result (caller PQclear) when its status is
 * COMMAND_OK or TUPLES_OK, else NULL with err filled ("could not <what>: <sl_pg_reason>"). */
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

/* Fields of text-format results by row and column name (res borrowed; a missing column
 * counts as NULL): */
bool sl_pg_null(const PGresult *res, int row, const char *col);
int64_t sl_pg_i64(const PGresult *res, int row, const char *col);     /* NULL -> 0 */
double sl_pg_f64(const PGresult *res, int row, const char *col);      /* NULL -> 0 */
const char *sl_pg_str(const PGresult *res, int row, const char *col); /* NULL -> NULL;
                                                                             borrowed from res */

/* The same fields as JSON values (new references): NULL (or a missing column) -> null. */
json_t *sl_pg_json_int(const PGresult *res, int row, const char *col);
json_t *sl_pg_json_real(const PGresult *res, int row, const char *col);
json_t *sl_pg_json_str(const PGresult *res, int row, const char *col);

/* A PostgreSQL array literal of n strings ({"a","b"}: every element quoted, '"' and '\'
 * escaped). items borrowed; returns a malloc'd string the caller frees. */
char *sl_pg_text_array(const char *const *items, size_t n);

#endif /* SL_PG_H */
