/*
 * Integration test of the API key table (sql/0007_api_keys.sql) and its C access
 * (common/sl_apikey.h sl_apikey_db_*): insert/list round trip (hash, scopes, channels, rate
 * limit), duplicate ids, validation before writing, ordering, revoke (idempotent, not found),
 * the table's CHECKs for rows written by hand, and the role grants (sluice_analyst never
 * sees hashes, sluice_api reads them, public nothing).
 *
 * Isolation: a private database created on the shared PostgreSQL server (SLUICE_PG_DSN, from
 * scripts/stack.sh env) with every migration of sql/ applied, dropped at the end; each test
 * starts from an empty api_keys table. A missing SLUICE_PG_DSN fails the test, it never skips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/sl_apikey.h"
#include "common/sl_mem.h"
#include "sl_test_pg.h"

static PGconn *g_pg;     /* the private database */
static char g_db[64];    /* its name */
static char g_dsn[1024]; /* SLUICE_PG_DSN */

/* ==== helpers ==== */

static void exec_on(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "statement failed: %s\n%s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
    }
    PQclear(r);
}

/* First column of the first row as text (static buffer; "<none>" for no row). */
static const char *q1(const char *sql)
{
    static char out[4096];
    PGresult *r = PQexec(g_pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "query failed: %s\n%s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
        return "";
    }
    snprintf(out, sizeof(out), "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "<none>");
    PQclear(r);
    return out;
}

/* SQLSTATE of a statement expected to fail ("" if it succeeded). */
static const char *sqlstate(const char *sql)
{
    static char st[8];
    PGresult *r = PQexec(g_pg, sql);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(st, sizeof(st), "%s", s ? s : "");
    PQclear(r);
    return st;
}

static int group_setup(void **state)
{
    (void)state;
    const char *dsn = getenv("SLUICE_PG_DSN");
    if (!dsn || !*dsn) {
        fprintf(stderr, "SLUICE_PG_DSN is not set: eval \"$(scripts/stack.sh env)\" first\n");
        return -1;
    }
    snprintf(g_dsn, sizeof(g_dsn), "%s", dsn);
    snprintf(g_db, sizeof(g_db), "sluice_tk_%d_%ld", (int)getpid(), (long)time(NULL));
    g_pg = sl_test_pg_create(g_dsn, g_db, NULL);
    assert_int_equal(q1("select count(*) from pg_class where relname = 'api_keys'")[0], '1');
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    PQfinish(g_pg);
    sl_test_pg_drop(g_dsn, g_db);
    return 0;
}

static int empty(void **state)
{
    (void)state;
    exec_on(g_pg, "truncate api_keys");
    return 0;
}

/* A new key (generated) with the given scopes and channel list ("" = none). */
static void make_key(struct sl_apikey *k, const char *name, unsigned scopes, const char *chans)
{
    char tok[SL_APIKEY_TOKEN_MAX];
    sl_err_t err;
    memset(k, 0, sizeof(*k));
    assert_int_equal(sl_apikey_generate(tok, k->id, k->hash, &err), 0);
    k->name = sl_xstrdup(name);
    k->scopes = scopes;
    assert_int_equal(sl_apikey_channels_parse(chans, &k->channels, &k->n_channels, &err), 0);
}

static void insert_ok(const struct sl_apikey *k)
{
    sl_err_t err;
    int rc = sl_apikey_db_insert(g_pg, k, &err);
    if (rc != 0)
        fail_msg("sl_apikey_db_insert: %s", err.msg);
}

static void free_list(struct sl_apikey *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sl_apikey_fini(&v[i]);
    free(v);
}

/* ==== tests ==== */

static void test_insert_list_roundtrip(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_apikey a, b, *v = NULL;
    size_t n = 0, skipped = 0;
    make_key(&a, "billing service", SL_SCOPE_PUBLISH | SL_SCOPE_READ, "orders,billing.eu:v2");
    a.rate_per_s = 50;
    a.burst = 200;
    make_key(&b, "", SL_SCOPE_ADMIN, "");
    insert_ok(&a);
    insert_ok(&b);
    assert_int_equal(sl_apikey_db_list(g_pg, false, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 2);
    const struct sl_apikey *ga = strcmp(v[0].id, a.id) == 0 ? &v[0] : &v[1];
    const struct sl_apikey *gb = ga == &v[0] ? &v[1] : &v[0];
    assert_string_equal(ga->id, a.id);
    assert_string_equal(ga->name, "billing service");
    assert_true(sl_apikey_hash_equal(ga->hash, a.hash));
    assert_int_equal(ga->scopes, SL_SCOPE_PUBLISH | SL_SCOPE_READ);
    assert_int_equal(ga->n_channels, 2);
    assert_string_equal(ga->channels[0], "orders");
    assert_string_equal(ga->channels[1], "billing.eu:v2");
    assert_int_equal(ga->rate_per_s, 50);
    assert_int_equal(ga->burst, 200);
    assert_int_equal(ga->revoked_ms, 0);
    int64_t now_ms = (int64_t)time(NULL) * 1000;
    assert_true(ga->created_ms > now_ms - 600000 && ga->created_ms < now_ms + 600000);
    assert_string_equal(gb->id, b.id);
    assert_string_equal(gb->name, "");
    assert_int_equal(gb->scopes, SL_SCOPE_ADMIN);
    assert_int_equal(gb->n_channels, 0);
    assert_null(gb->channels);
    assert_true(sl_apikey_channel_allowed(gb, "anything"));
    assert_false(sl_apikey_channel_allowed(ga, "anything"));
    assert_true(sl_apikey_allows(gb, SL_SCOPE_READ));
    /* stored as SQL sees it */
    char sql[256];
    snprintf(sql, sizeof(sql),
             "select octet_length(hash)::text || ' ' || array_to_string(scopes, ',') || ' ' "
             "|| cardinality(channels) from api_keys where id = '%s'",
             a.id);
    assert_string_equal(q1(sql), "32 publish,read 2");

    /* same id again: SL_ESTATE, nothing changed */
    assert_int_equal(sl_apikey_db_insert(g_pg, &a, &err), SL_ESTATE);
    assert_non_null(strstr(err.msg, "already exists"));
    assert_string_equal(q1("select count(*) from api_keys"), "2");
    free_list(v, n);
    sl_apikey_fini(&a);
    sl_apikey_fini(&b);
}

static void test_insert_validates_first(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_apikey k;
    make_key(&k, "x", SL_SCOPE_READ, "");
    k.scopes = 0;
    assert_int_equal(sl_apikey_db_insert(g_pg, &k, &err), SL_EINVAL);
    k.scopes = SL_SCOPE_READ;
    k.burst = -1;
    assert_int_equal(sl_apikey_db_insert(g_pg, &k, &err), SL_EINVAL);
    k.burst = 0;
    k.id[0] = '!';
    assert_int_equal(sl_apikey_db_insert(g_pg, &k, &err), SL_EINVAL);
    k.id[0] = 'a';
    free(k.name);
    k.name = sl_xstrdup("tab\there");
    assert_int_equal(sl_apikey_db_insert(g_pg, &k, &err), SL_EINVAL);
    /* a channel named NULL is a channel, not the null element */
    free(k.name);
    k.name = NULL;
    sl_apikey_fini(&k);
    make_key(&k, "n", SL_SCOPE_READ, "NULL,null");
    insert_ok(&k);
    struct sl_apikey *v = NULL;
    size_t n = 0, skipped = 0;
    assert_int_equal(sl_apikey_db_list(g_pg, false, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].n_channels, 2);
    assert_string_equal(v[0].channels[0], "NULL");
    assert_true(sl_apikey_channel_allowed(&v[0], "null"));
    free_list(v, n);
    sl_apikey_fini(&k);
    assert_string_equal(q1("select count(*) from api_keys"), "1");
}

static void test_list_order(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_apikey k[4], *v = NULL;
    size_t n = 0, skipped = 0;
    /* the first one older; the other three in one transaction (same now()): by id */
    make_key(&k[0], "first", SL_SCOPE_READ, "");
    insert_ok(&k[0]);
    exec_on(g_pg, "update api_keys set created_at = now() - interval '1 hour'");
    exec_on(g_pg, "begin");
    for (int i = 1; i < 4; i++) {
        make_key(&k[i], "same", SL_SCOPE_READ, "");
        insert_ok(&k[i]);
    }
    exec_on(g_pg, "commit");
    assert_int_equal(sl_apikey_db_list(g_pg, true, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 4);
    assert_string_equal(v[0].id, k[0].id);
    for (size_t i = 2; i < 4; i++)
        assert_true(strcmp(v[i - 1].id, v[i].id) < 0);
    assert_true(v[0].created_ms < v[1].created_ms);
    assert_int_equal(v[1].created_ms, v[3].created_ms);
    free_list(v, n);
    for (int i = 0; i < 4; i++)
        sl_apikey_fini(&k[i]);
}

/* A row the table accepts but the rules refuse (a channel listed twice, written by hand) is
 * left out and counted: that key does not authenticate, every other key still loads, and a
 * revocation still takes effect (one bad row froze the whole key set before). */
static void test_bad_row_is_left_out(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_apikey a, b, *v = NULL;
    size_t n = 0, skipped = 0;
    bool changed = false;
    make_key(&a, "good", SL_SCOPE_READ, "");
    make_key(&b, "hand-edited", SL_SCOPE_READ, "tenant_a");
    insert_ok(&a);
    insert_ok(&b);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "update api_keys set channels = '{tenant_a,tenant_a}' where id = '%s'", b.id);
    exec_on(g_pg, sql);
    assert_int_equal(sl_apikey_db_list(g_pg, false, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(skipped, 1);
    assert_string_equal(v[0].id, a.id);
    assert_non_null(strstr(err.msg, b.id));
    assert_non_null(strstr(err.msg, "twice"));
    free_list(v, n);
    assert_int_equal(sl_apikey_db_revoke(g_pg, a.id, &changed, &err), 0);
    assert_int_equal(sl_apikey_db_list(g_pg, false, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 0);
    assert_null(v);
    assert_int_equal(skipped, 1);
    assert_int_equal(sl_apikey_db_list(g_pg, true, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].id, a.id);
    free_list(v, n);
    sl_apikey_fini(&a);
    sl_apikey_fini(&b);
}

static void test_revoke(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_apikey a, b, *v = NULL;
    size_t n = 0, skipped = 0;
    bool changed = false;
    make_key(&a, "to revoke", SL_SCOPE_PUBLISH, "");
    make_key(&b, "stays", SL_SCOPE_PUBLISH, "");
    insert_ok(&a);
    insert_ok(&b);
    exec_on(g_pg, "update api_keys set updated_at = now() - interval '1 minute'");
    assert_int_equal(sl_apikey_db_revoke(g_pg, a.id, &changed, &err), 0);
    assert_true(changed);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "select (revoked_at is not null and updated_at >= revoked_at)::text from api_keys "
             "where id = '%s'",
             a.id);
    assert_string_equal(q1(sql), "true");
    /* idempotent: no change the second time, revoked_at kept */
    snprintf(sql, sizeof(sql), "select revoked_at::text from api_keys where id = '%s'", a.id);
    char first[64];
    snprintf(first, sizeof(first), "%s", q1(sql));
    assert_int_equal(sl_apikey_db_revoke(g_pg, a.id, &changed, &err), 0);
    assert_false(changed);
    assert_string_equal(q1(sql), first);
    /* active list leaves it out; --all has it, revoked */
    assert_int_equal(sl_apikey_db_list(g_pg, false, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].id, b.id);
    free_list(v, n);
    assert_int_equal(sl_apikey_db_list(g_pg, true, &v, &n, &skipped, &err), 0);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v[i].id, a.id) == 0) {
            assert_true(v[i].revoked_ms >= v[i].created_ms);
            assert_false(sl_apikey_allows(&v[i], 0));
        } else {
            assert_int_equal(v[i].revoked_ms, 0);
        }
    }
    free_list(v, n);
    /* unknown and malformed ids */
    assert_int_equal(sl_apikey_db_revoke(g_pg, "zzzzzzzzzzzzzzzz", &changed, &err), SL_ENOTFOUND);
    assert_non_null(strstr(err.msg, "does not exist"));
    assert_int_equal(sl_apikey_db_revoke(g_pg, "short", &changed, &err), SL_EINVAL);
    assert_int_equal(sl_apikey_db_revoke(g_pg, "x'; drop table api_keys; --", &changed, &err),
                     SL_EINVAL);
    sl_apikey_fini(&a);
    sl_apikey_fini(&b);
}

static void test_table_checks(void **state)
{
    (void)state;
    static const char *const ok_row =
        "insert into api_keys (id, hash, scopes, channels) values ('aaaaaaaaaaaaaaaa', "
        "sha256('x'), '{read}', '{a,b}')";
    assert_string_equal(sqlstate(ok_row), "");
    static const char *const bad[] = {
        /* id */
        "insert into api_keys (id, hash, scopes) values ('AAAAAAAAAAAAAAAA', sha256('x'), "
        "'{read}')",
        "insert into api_keys (id, hash, scopes) values ('aaaaaaaaaaaaaaa', sha256('x'), "
        "'{read}')",
        /* hash length */
        "insert into api_keys (id, hash, scopes) values ('bbbbbbbbbbbbbbbb', '\\x00', '{read}')",
        /* scopes */
        "insert into api_keys (id, hash, scopes) values ('bbbbbbbbbbbbbbbb', sha256('x'), '{}')",
        "insert into api_keys (id, hash, scopes) values ('bbbbbbbbbbbbbbbb', sha256('x'), "
        "'{write}')",
        "insert into api_keys (id, hash, scopes) values ('bbbbbbbbbbbbbbbb', sha256('x'), "
        "'{read,NULL}')",
        /* channels */
        "insert into api_keys (id, hash, scopes, channels) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', '{\"a b\"}')",
        "insert into api_keys (id, hash, scopes, channels) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', '{\"\"}')",
        "insert into api_keys (id, hash, scopes, channels) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', '{a,NULL}')",
        "insert into api_keys (id, hash, scopes, channels) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', '{\"a,b\"}')",
        "insert into api_keys (id, hash, scopes, channels) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', array(select 'c' || i from generate_series(1, 17) i))",
        "insert into api_keys (id, hash, scopes, channels) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', array[repeat('c', 65)])",
        /* rate, burst */
        "insert into api_keys (id, hash, scopes, rate_per_s) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', -1)",
        "insert into api_keys (id, hash, scopes, burst) values ('bbbbbbbbbbbbbbbb', "
        "sha256('x'), '{read}', -1)",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *st = sqlstate(bad[i]);
        if (strcmp(st, "23514") != 0)
            fail_msg("statement #%zu: sqlstate '%s', want 23514 (check_violation)", i, st);
    }
    /* 16 channels of 64 bytes are fine */
    assert_string_equal(sqlstate("insert into api_keys (id, hash, scopes, channels) values "
                                 "('cccccccccccccccc', sha256('x'), '{admin}', "
                                 "array(select repeat('c', 62) || lpad(i::text, 2, '0') "
                                 "from generate_series(1, 16) i))"),
                        "");
    assert_string_equal(q1("select count(*) from api_keys"), "2");
}

static void test_privileges(void **state)
{
    (void)state;
    struct sl_apikey k;
    make_key(&k, "p", SL_SCOPE_READ, "");
    insert_ok(&k);
    exec_on(g_pg, "set role sluice_analyst");
    assert_string_equal(
        sqlstate("select id, name, scopes, channels, rate_per_s, burst, created_at, revoked_at, "
                 "updated_at from api_keys"),
        "");
    assert_string_equal(sqlstate("select hash from api_keys"), "42501");
    assert_string_equal(sqlstate("select * from api_keys"), "42501");
    assert_string_equal(sqlstate("update api_keys set revoked_at = now()"), "42501");
    exec_on(g_pg, "reset role");
    exec_on(g_pg, "set role sluice_api");
    assert_string_equal(sqlstate("select id, hash, scopes, revoked_at from api_keys"), "");
    assert_string_equal(sqlstate("update api_keys set revoked_at = now()"), "42501");
    assert_string_equal(sqlstate("delete from api_keys"), "42501");
    exec_on(g_pg, "reset role");
    assert_string_equal(q1("select has_table_privilege('public', 'api_keys', 'select')::text"),
                        "false");
    sl_apikey_fini(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_insert_list_roundtrip, empty),
        cmocka_unit_test_setup(test_insert_validates_first, empty),
        cmocka_unit_test_setup(test_list_order, empty),
        cmocka_unit_test_setup(test_revoke, empty),
        cmocka_unit_test_setup(test_bad_row_is_left_out, empty),
        cmocka_unit_test_setup(test_table_checks, empty),
        cmocka_unit_test_setup(test_privileges, empty),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
