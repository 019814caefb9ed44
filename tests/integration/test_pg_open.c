/*
 * Integration tests for sl_pg_open (common/sl_pg.c) against the stack's PostgreSQL
 * (SLUICE_PG_DSN): the defaults every Sluice process connects with (connect timeout, TCP
 * keepalives, tcp_user_timeout, application_name), read back from the live connection
 * (PQconninfo) and from the server (application_name); that the DSN overrides them; and that
 * libpq's own variables PGCONNECT_TIMEOUT and PGAPPNAME, when set, apply instead of Sluice's
 * defaults (a parameter passed to libpq outranks them, so they used to be ignored).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/sl_pg.h"

static const char *dsn(void)
{
    const char *d = getenv("SLUICE_PG_DSN");
    if (!d || !*d) {
        fprintf(stderr, "SLUICE_PG_DSN is not set: run through scripts/test.sh\n");
        exit(1);
    }
    return d;
}

/* The value of option key of the live connection pg ("" when unset). */
static void option(PGconn *pg, const char *key, char *out, size_t cap)
{
    PQconninfoOption *o = PQconninfo(pg);
    assert_non_null(o);
    out[0] = '\0';
    for (PQconninfoOption *p = o; p->keyword; p++)
        if (strcmp(p->keyword, key) == 0 && p->val)
            (void)snprintf(out, cap, "%s", p->val);
    PQconninfoFree(o);
}

static void server_app_name(PGconn *pg, char *out, size_t cap)
{
    PGresult *r = PQexec(pg, "show application_name");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    (void)snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

static PGconn *open_ok(const char *d, const char *app)
{
    PGconn *pg = sl_pg_open(d, app);
    assert_non_null(pg);
    if (PQstatus(pg) != CONNECTION_OK)
        fail_msg("could not connect: %s", PQerrorMessage(pg));
    return pg;
}

static void test_defaults(void **state)
{
    (void)state;
    unsetenv("PGCONNECT_TIMEOUT");
    unsetenv("PGAPPNAME");
    PGconn *pg = open_ok(dsn(), "sluice-test-app");
    char v[256];
    option(pg, "connect_timeout", v, sizeof(v));
    assert_string_equal(v, "5");
    option(pg, "keepalives", v, sizeof(v));
    assert_string_equal(v, "1");
    option(pg, "keepalives_idle", v, sizeof(v));
    assert_string_equal(v, "10");
    option(pg, "tcp_user_timeout", v, sizeof(v));
    assert_string_equal(v, "30000");
    server_app_name(pg, v, sizeof(v));
    assert_string_equal(v, "sluice-test-app");
    PQfinish(pg);
}

static void test_the_dsn_overrides_the_defaults(void **state)
{
    (void)state;
    unsetenv("PGCONNECT_TIMEOUT");
    unsetenv("PGAPPNAME");
    char d[1024];
    (void)snprintf(d, sizeof(d), "%s connect_timeout=9 application_name=from-dsn", dsn());
    if (strstr(dsn(), "://")) /* a URI DSN: add them as query parameters */
        (void)snprintf(d, sizeof(d), "%s%sconnect_timeout=9&application_name=from-dsn", dsn(),
                       strchr(dsn(), '?') ? "&" : "?");
    PGconn *pg = open_ok(d, "sluice-test-app");
    char v[256];
    option(pg, "connect_timeout", v, sizeof(v));
    assert_string_equal(v, "9");
    server_app_name(pg, v, sizeof(v));
    assert_string_equal(v, "from-dsn");
    PQfinish(pg);
}

static void test_libpq_variables_replace_the_defaults(void **state)
{
    (void)state;
    setenv("PGCONNECT_TIMEOUT", "7", 1);
    setenv("PGAPPNAME", "from-environment", 1);
    PGconn *pg = open_ok(dsn(), "sluice-test-app");
    char v[256];
    option(pg, "connect_timeout", v, sizeof(v));
    assert_string_equal(v, "7");
    server_app_name(pg, v, sizeof(v));
    assert_string_equal(v, "from-environment");
    option(pg, "keepalives", v, sizeof(v)); /* the rest of the defaults still apply */
    assert_string_equal(v, "1");
    PQfinish(pg);
    unsetenv("PGCONNECT_TIMEOUT");
    unsetenv("PGAPPNAME");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_the_dsn_overrides_the_defaults),
        cmocka_unit_test(test_libpq_variables_replace_the_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
