/*
 * Private databases for integration tests: a fresh database on the shared PostgreSQL server
 * (SLUICE_PG_DSN, from scripts/stack.sh env) with every migration of sql/ applied in order,
 * each in one transaction (as scripts/stack.sh does), dropped by the test at the end. For
 * tests whose queries are global over a table, or that need a schema of their own.
 * Failures exit the test with a reason; a missing SLUICE_PG_DSN is a failure, never a skip.
 * Needs SL_SOURCE_DIR (the integration CMakeLists defines it).
 */
#ifndef SL_TEST_PG_H
#define SL_TEST_PG_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#define SL_TEST_PG_SQL_MAX (1 << 20) /* bytes; largest migration file read */

/* Connect to database dbname of the server base_dsn names (any DSN form); exits on failure. */
static inline PGconn *sl_test_pg_connect(const char *base_dsn, const char *dbname)
{
    const char *const keys[] = {"dbname", "dbname", "connect_timeout", NULL};
    const char *const vals[] = {base_dsn, dbname, "10", NULL};
    PGconn *pg = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to database %s: %s", dbname, PQerrorMessage(pg));
        exit(1);
    }
    return pg;
}

/* Run sql (one or more statements) on pg; exits on failure. */
static inline void sl_test_pg_exec(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "statement failed: %s\n%.300s\n", PQresultErrorMessage(r), sql);
        exit(1);
    }
    PQclear(r);
}

/* Append the NUL-terminated s to out (cap bytes, *n used); exits when it does not fit. */
static inline void sl_test_pg_put(char *out, size_t cap, size_t *n, const char *s)
{
    size_t l = strlen(s);
    if (*n + l >= cap) {
        fprintf(stderr, "conninfo longer than %zu bytes\n", cap);
        exit(1);
    }
    memcpy(out + *n, s, l + 1);
    *n += l;
}

/* A key=value conninfo for database dbname of the server base_dsn names, into out. */
static inline void sl_test_pg_dsn(const char *base_dsn, const char *dbname, char *out, size_t cap)
{
    char *errmsg = NULL;
    PQconninfoOption *opts = PQconninfoParse(base_dsn, &errmsg);
    if (!opts) {
        fprintf(stderr, "cannot parse SLUICE_PG_DSN: %s\n", errmsg ? errmsg : "out of memory");
        exit(1);
    }
    size_t n = 0;
    out[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        const char *v = strcmp(o->keyword, "dbname") == 0 ? dbname : o->val;
        if (!v)
            continue;
        sl_test_pg_put(out, cap, &n, n ? " " : "");
        sl_test_pg_put(out, cap, &n, o->keyword);
        sl_test_pg_put(out, cap, &n, "='");
        for (const char *c = v; *c; c++) {
            char ch[3] = {'\\', *c, '\0'};
            sl_test_pg_put(out, cap, &n, *c == '\'' || *c == '\\' ? ch : ch + 1);
        }
        sl_test_pg_put(out, cap, &n, "'");
    }
    PQconninfoFree(opts);
}

static inline int sl_test_pg_cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Apply every sql/NNNN_*.sql in order to pg, each in one transaction; exits on failure. */
static inline void sl_test_pg_migrate(PGconn *pg)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/sql", SL_SOURCE_DIR);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "cannot open %s\n", dir);
        exit(1);
    }
    char *names[64];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 64) {
        size_t l = strlen(e->d_name);
        if (l > 9 && e->d_name[0] >= '0' && e->d_name[0] <= '9' &&
            strcmp(e->d_name + l - 4, ".sql") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), sl_test_pg_cmp_name);
    sl_test_pg_exec(pg, "set client_min_messages = warning");
    for (size_t i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        char *sql = calloc(1, SL_TEST_PG_SQL_MAX + 1);
        size_t len = f && sql ? fread(sql, 1, SL_TEST_PG_SQL_MAX, f) : 0;
        if (f)
            fclose(f);
        if (len == 0 || len >= SL_TEST_PG_SQL_MAX) {
            fprintf(stderr, "cannot read %s (or larger than %d bytes)\n", path, SL_TEST_PG_SQL_MAX);
            exit(1);
        }
        sl_test_pg_exec(pg, "begin");
        sl_test_pg_exec(pg, sql);
        sl_test_pg_exec(pg, "commit");
        free(sql);
        free(names[i]);
    }
}

/* Create database name (letters, digits, '_') on the server of base_dsn, run pre_sql in it
 * (NULL = nothing; e.g. a type the migrations then keep) and migrate it; returns a connection
 * to it (caller PQfinish). Exits on failure. */
static inline PGconn *sl_test_pg_create(const char *base_dsn, const char *name, const char *pre_sql)
{
    PGconn *admin = sl_test_pg_connect(base_dsn, "postgres");
    char sql[256];
    snprintf(sql, sizeof(sql), "create database %s", name);
    sl_test_pg_exec(admin, sql);
    PQfinish(admin);
    PGconn *pg = sl_test_pg_connect(base_dsn, name);
    sl_test_pg_exec(pg, "set timezone = 'UTC'");
    if (pre_sql)
        sl_test_pg_exec(pg, pre_sql);
    sl_test_pg_migrate(pg);
    return pg;
}

/* Drop database name (closing its other sessions). */
static inline void sl_test_pg_drop(const char *base_dsn, const char *name)
{
    PGconn *admin = sl_test_pg_connect(base_dsn, "postgres");
    char sql[256];
    snprintf(sql, sizeof(sql), "drop database if exists %s with (force)", name);
    PGresult *r = PQexec(admin, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        fprintf(stderr, "could not drop database %s: %s", name, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(admin);
}

#endif /* SL_TEST_PG_H */
