/*
 * sl_pg: libpq helpers (see sl_pg.h).
 */
#include "common/sl_pg.h"

#include <string.h>

#include "common/sl_log.h"

static void notice_cb(void *arg, const char *msg)
{
    (void)arg;
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        n--;
    sl_debug(SL_DBG_DB, "db", "pg_notice", "%.*s", (int)n, msg);
}

PGconn *sl_pg_connect(const char *dsn, sl_err_t *err)
{
    PGconn *pg = PQconnectdb(dsn);
    if (!pg || PQstatus(pg) != CONNECTION_OK) {
        const char *m = pg ? PQerrorMessage(pg) : "out of memory";
        size_t n = strlen(m);
        while (n > 0 && m[n - 1] == '\n')
            n--;
        sl_err_set(err, SL_EPG, "could not connect to postgresql: %.*s", (int)n, m);
        if (pg)
            PQfinish(pg);
        return NULL;
    }
    PQsetNoticeProcessor(pg, notice_cb, NULL);
    return pg;
}

PGresult *sl_pg_exec(PGconn *pg,
                     const char *what,
                     const char *sql,
                     int nparams,
                     const char *const *params,
                     sl_err_t *err)
{
    PGresult *res = PQexecParams(pg, sql, nparams, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        return res;
    const char *m = PQresultErrorMessage(res);
    if (!m || !*m)
        m = PQerrorMessage(pg);
    size_t n = strlen(m);
    while (n > 0 && m[n - 1] == '\n')
        n--;
    sl_err_set(err, SL_EPG, "could not %s: %.*s", what, (int)n, m);
    PQclear(res);
    return NULL;
}

int sl_pg_cmd(PGconn *pg,
              const char *what,
              const char *sql,
              int nparams,
              const char *const *params,
              sl_err_t *err)
{
    PGresult *res = sl_pg_exec(pg, what, sql, nparams, params, err);
    if (!res)
        return SL_EPG;
    PQclear(res);
    return 0;
}
