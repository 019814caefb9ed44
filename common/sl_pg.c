/*
 * sl_pg: libpq helpers (see sl_pg.h).
 */
#include "common/sl_pg.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"

static void notice_cb(void *arg, const char *msg)
{
    (void)arg;
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        n--;
    sl_debug(SL_DBG_DB, "db", "pg_notice", "%.*s", (int)n, msg);
}

/* Whether libpq's environment variable name is set (then it, not our default, applies). */
static bool env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

PGconn *sl_pg_open(const char *dsn, const char *app)
{
    /* our defaults first; the DSN (expanded from "dbname", last) overrides any it sets. A
     * parameter passed here outranks libpq's environment variables, so the ones a user may
     * have set (PGCONNECT_TIMEOUT, PGAPPNAME) are left to libpq instead. */
    const char *keys[9] = {"keepalives", "keepalives_idle", "keepalives_interval",
                           "keepalives_count", "tcp_user_timeout"};
    const char *vals[9] = {"1", "10", "5", "3", "30000"};
    int n = 5;
    if (!env_set("PGCONNECT_TIMEOUT")) {
        keys[n] = "connect_timeout";
        vals[n++] = "5";
    }
    if (app && !env_set("PGAPPNAME")) {
        keys[n] = "application_name";
        vals[n++] = app;
    }
    keys[n] = "dbname";
    vals[n++] = dsn;
    keys[n] = NULL;
    vals[n] = NULL;
    return PQconnectdbParams(keys, vals, 1);
}

PGconn *sl_pg_connect(const char *dsn, sl_err_t *err)
{
    PGconn *pg = sl_pg_open(dsn, NULL);
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

const char *sl_pg_reason(const PGresult *res, PGconn *pg, char *buf, size_t cap)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *prim = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (state && prim) {
        (void)snprintf(buf, cap, "%s %s", state, prim);
        return buf;
    }
    const char *m = pg && PQstatus(pg) != CONNECTION_OK ? PQerrorMessage(pg) : NULL;
    if (!m || !*m)
        m = res ? PQresStatus(PQresultStatus(res)) : "no result (out of memory)";
    size_t n = strlen(m);
    while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == ' '))
        n--;
    (void)snprintf(buf, cap, "%.*s", (int)n, m);
    return buf;
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
    char why[512];
    sl_err_set(err, SL_EPG, "could not %s: %s", what, sl_pg_reason(res, pg, why, sizeof(why)));
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

/* ==== result fields and parameters ==== */

static int col(const PGresult *res, const char *name)
{
    return PQfnumber(res, name);
}

bool sl_pg_null(const PGresult *res, int row, const char *name)
{
    int c = col(res, name);
    return c < 0 || PQgetisnull(res, row, c);
}

int64_t sl_pg_i64(const PGresult *res, int row, const char *name)
{
    if (sl_pg_null(res, row, name))
        return 0;
    return strtoll(PQgetvalue(res, row, col(res, name)), NULL, 10);
}

double sl_pg_f64(const PGresult *res, int row, const char *name)
{
    if (sl_pg_null(res, row, name))
        return 0;
    return strtod(PQgetvalue(res, row, col(res, name)), NULL);
}

const char *sl_pg_str(const PGresult *res, int row, const char *name)
{
    if (sl_pg_null(res, row, name))
        return NULL;
    return PQgetvalue(res, row, col(res, name));
}

char *sl_pg_text_array(const char *const *items, size_t n)
{
    size_t len = 3;
    for (size_t i = 0; i < n; i++)
        len += 2 * strlen(items[i]) + 3;
    char *out = sl_xmalloc(len);
    size_t o = 0;
    out[o++] = '{';
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            out[o++] = ',';
        out[o++] = '"';
        for (const char *p = items[i]; *p; p++) {
            if (*p == '"' || *p == '\\')
                out[o++] = '\\';
            out[o++] = *p;
        }
        out[o++] = '"';
    }
    out[o++] = '}';
    out[o] = '\0';
    return out;
}

json_t *sl_pg_json_int(const PGresult *res, int row, const char *col)
{
    return sl_pg_null(res, row, col) ? json_null() : json_integer(sl_pg_i64(res, row, col));
}

json_t *sl_pg_json_real(const PGresult *res, int row, const char *col)
{
    return sl_pg_null(res, row, col) ? json_null() : json_real(sl_pg_f64(res, row, col));
}

json_t *sl_pg_json_str(const PGresult *res, int row, const char *col)
{
    const char *s = sl_pg_str(res, row, col);
    return s ? json_string(s) : json_null();
}
