/*
 * Integration test of the analysis SQL (sql/0003_analysis.sql) with synthetic history rows:
 * every documented rule at and around its boundary (health summary figures, slow endpoints,
 * the four dead-letter patterns, the three alerts, latency histogram buckets), the replay
 * journal recovery, and the retention of pending payloads.
 *
 * Isolation: a private database created on the shared PostgreSQL server (SLUICE_PG_DSN, from
 * scripts/stack.sh env) with every migration of sql/ applied, dropped at the end; each test
 * starts from empty history tables. A missing SLUICE_PG_DSN fails the test, it never skips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "sl_test_pg.h"

static PGconn *g_pg;     /* the private database */
static char g_db[64];    /* its name */
static char g_dsn[1024]; /* SLUICE_PG_DSN */

/* ==== helpers ==== */

static PGconn *connect_db(const char *dbname)
{
    return sl_test_pg_connect(g_dsn, dbname);
}

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

__attribute__((format(printf, 1, 2))) static void exec_f(const char *fmt, ...)
{
    char sql[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    exec_on(g_pg, sql);
}

/* First column of the first row as text (static buffer; "" for NULL, "<none>" for no row). */
__attribute__((format(printf, 1, 2))) static const char *q1(const char *fmt, ...)
{
    static char out[4096];
    char sql[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(g_pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "query failed: %s\n%s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
        return "";
    }
    if (PQntuples(r) == 0)
        snprintf(out, sizeof(out), "<none>");
    else
        snprintf(out, sizeof(out), "%s", PQgetvalue(r, 0, 0));
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
    snprintf(g_db, sizeof(g_db), "sluice_ta_%d_%ld", (int)getpid(), (long)time(NULL));
    g_pg = sl_test_pg_create(g_dsn, g_db, NULL);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    PQfinish(g_pg);
    sl_test_pg_drop(g_dsn, g_db);
    return 0;
}

/* Every test starts from an empty history. */
static int empty(void **state)
{
    (void)state;
    exec_on(g_pg, "truncate delivery_attempts, deliveries, endpoint_latency, endpoint_health,"
                  " dead_letters, replay_log, pending_payloads");
    return 0;
}

/* n dead letters of ep: dead_at = now() - (start_s + i * step_s) seconds, with last_status
 * status (SQL text: "401", "null") and error class cls (NULL = none); 3 attempts each. */
static void
dead(const char *ep, int n, int start_s, int step_s, const char *status, const char *cls)
{
    char clsq[64];
    if (cls)
        snprintf(clsq, sizeof(clsq), "'%s'", cls);
    else
        snprintf(clsq, sizeof(clsq), "null");
    exec_f("insert into dead_letters (event_id, endpoint_id, error_class, last_status, attempts,"
           " first_failed_at, dead_at, payload)"
           " select '%s_' || %d || '_' || i, '%s', %s, %s, 3,"
           "        now() - make_interval(secs => %d + i * %d),"
           "        now() - make_interval(secs => %d + i * %d), '\\x80'"
           "   from generate_series(0, %d) i",
           ep, start_s, ep, clsq, status, start_s, step_s, start_s, step_s, n - 1);
}

static const char *patterns(const char *ep, const char *window)
{
    return q1("select array_to_string(patterns, ',') from sluice_dead_letter_analysis('%s', '%s')",
              window, ep);
}

/* ==== tests ==== */

static void test_argument_checks(void **state)
{
    (void)state;
    assert_string_equal(sqlstate("select * from sluice_health_summary('0 s')"), "22023");
    assert_string_equal(sqlstate("select * from sluice_health_summary('-1 h')"), "22023");
    assert_string_equal(sqlstate("select * from sluice_health_summary('400 days')"), "22023");
    assert_string_equal(sqlstate("select * from sluice_slow_endpoints(2000, 0)"), "22023");
    assert_string_equal(sqlstate("select * from sluice_slow_endpoints(-1)"), "22023");
    assert_string_equal(sqlstate("select * from sluice_dead_letter_analysis(p_cluster_share => 0)"),
                        "22023");
    assert_string_equal(sqlstate("select * from sluice_dead_letter_analysis(p_spike_share => 1)"),
                        "22023");
    assert_string_equal(sqlstate("select * from sluice_dead_letter_analysis(p_gradual_hours => 0)"),
                        "22023");
    assert_string_equal(sqlstate("select * from sluice_alerts(p_dead_rise_min => 0)"), "22023");
    assert_string_equal(sqlstate("select * from sluice_latency(null)"), "22023");
    assert_string_equal(sqlstate("select * from sluice_health_summary('1 h')"), "");
}

static void test_health_summary(void **state)
{
    (void)state;
    /* open work: 3 awaiting retry, 2 deferred; the oldest created 40 minutes ago */
    exec_f("insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           " last_update, created_at, next_attempt_at)"
           " values ('r1', 'h', 'retry_scheduled', 1, now(), now(), now() - interval '10 min',"
           "         now() + interval '1 min'),"
           "        ('r2', 'h', 'retry_scheduled', 2, now(), now(), now() - interval '20 min',"
           "         now()),"
           "        ('r3', 'h', 'retry_scheduled', 1, now(), now(), now() - interval '5 min',"
           "         now()),"
           "        ('f1', 'h', 'deferred', 0, now(), now(), now() - interval '40 min', now()),"
           "        ('f2', 'h', 'deferred', 3, now(), now(), now() - interval '1 min', now()),"
           "        ('d1', 'h', 'delivered', 1, now(), now(), now() - interval '3 h', null),"
           "        ('x1', 'h', 'dead_letter', 5, now(), now(), now() - interval '9 h', null)");
    /* outcomes: counted ones in the window, others not */
    exec_f("insert into delivery_attempts (event_id, endpoint_id, attempt, state, ts, created_at)"
           " select 'a' || i, 'h', 1, 'delivered', now() - interval '5 min', now()"
           "   from generate_series(1, 4) i");
    exec_f("insert into delivery_attempts (event_id, endpoint_id, attempt, state, ts, created_at)"
           " select 'a' || i, 'h', 1, 'delivered', now() - interval '2 h', now()"
           "   from generate_series(5, 6) i");
    exec_f("insert into delivery_attempts (event_id, endpoint_id, attempt, state, ts, created_at)"
           " values ('b1', 'h', 1, 'retry_scheduled', now() - interval '1 min', now()),"
           "        ('b2', 'h', 2, 'retry_scheduled', now() - interval '1 min', now()),"
           "        ('b3', 'h', 1, 'retry_scheduled', now() - interval '1 min', now()),"
           "        ('b4', 'h', 5, 'dead_letter', now() - interval '1 min', now()),"
           "        ('b5', 'h', 0, 'deferred', now() - interval '1 min', now()),"
           "        ('b6', 'h', 0, 'deferred', now() - interval '1 min', now()),"
           "        ('b7', 'h', 0, 'duplicate', now() - interval '1 min', now()),"
           "        ('b8', 'h', 0, 'dead_letter', now() - interval '1 min', now())");
    /* dead letters: 2 unreplayed + 1 replayed in the window; 1 resolved and 1 unreplayed
     * before it */
    exec_f("insert into dead_letters (event_id, endpoint_id, attempts, first_failed_at, dead_at,"
           " replayed_at, resolved_at)"
           " values ('k1', 'h', 1, now(), now() - interval '10 min', null, null),"
           "        ('k2', 'h', 1, now(), now() - interval '20 min', null, null),"
           "        ('k3', 'h', 1, now(), now() - interval '30 min', now(), null),"
           "        ('k4', 'h', 1, now(), now() - interval '150 min', now(), now()),"
           "        ('k5', 'h', 1, now(), now() - interval '5 h', null, null)");
    /* latency: 1..100 ms in the window, one 10 s sample two hours ago */
    exec_f("insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
           " http_status)"
           " select 'h', now() - interval '1 min', 'l' || i, 1, i * 1000, 200"
           "   from generate_series(1, 100) i");
    exec_f("insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
           " http_status) values ('h', now() - interval '2 h', 'old', 1, 10000000, 200)");

    const char *row = q1("select concat_ws('|', awaiting_retry, deferred, dead_letters_unreplayed,"
                         " dead_letters_window, delivered_window, failed_attempts_window,"
                         " latency_samples, avg_latency_ms, round(p95_latency_ms::numeric, 2),"
                         " round(oldest_undelivered_age_s), window_s)"
                         " from sluice_health_summary()");
    /* failed attempts: 3 retries + the dead letter that spent attempt 5 (attempt 0 not) */
    assert_string_equal(row, "3|2|3|3|4|4|100|50.5|95.05|2400|3600");
    row = q1("select concat_ws('|', delivered_window, dead_letters_window, latency_samples)"
             " from sluice_health_summary('3 hours')");
    assert_string_equal(row, "6|4|101");
    exec_on(g_pg, "truncate deliveries, endpoint_latency");
    row = q1("select concat_ws('|', awaiting_retry, deferred, coalesce(oldest_undelivered_at::text,"
             " 'none'), latency_samples, coalesce(p95_latency_ms::text, 'none'))"
             " from sluice_health_summary()");
    assert_string_equal(row, "0|0|none|0|none");
}

static void test_slow_endpoints(void **state)
{
    (void)state;
    /* a: 20 samples at 2001 ms (slow); b: 19 at 5000 ms (too few); c: 20 at 2000 ms (not
     * above); d: 20 at 3000 ms but 2 hours old (outside a 1 h window) */
    exec_f("insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
           " http_status)"
           " select 'sa', now() - interval '1 min', 'e' || i, 1, 2001000, 200"
           "   from generate_series(1, 20) i"
           " union all select 'sb', now() - interval '1 min', 'e' || i, 1, 5000000, 200"
           "   from generate_series(1, 19) i"
           " union all select 'sc', now() - interval '1 min', 'e' || i, 1, 2000000, 200"
           "   from generate_series(1, 20) i"
           " union all select 'sd', now() - interval '2 h', 'e' || i, 1, 3000000, 200"
           "   from generate_series(1, 20) i");
    exec_f("insert into endpoint_health (endpoint_id, last_status, last_error)"
           " values ('sa', 503, 'http_5xx')");
    assert_string_equal(q1("select string_agg(endpoint_id, ',' order by endpoint_id)"
                           " from sluice_slow_endpoints(2000, 20, '1 hour')"),
                        "sa");
    assert_string_equal(q1("select string_agg(endpoint_id, ',' order by endpoint_id)"
                           " from sluice_slow_endpoints()"),
                        "sa,sd");
    assert_string_equal(q1("select string_agg(endpoint_id, ',' order by endpoint_id)"
                           " from sluice_slow_endpoints(1999, 19, '1 hour')"),
                        "sa,sb,sc");
    assert_string_equal(q1("select concat_ws('|', samples, p50_ms, p95_ms, p99_ms, last_status,"
                           " last_error) from sluice_slow_endpoints(2000, 20, '1 hour')"),
                        "20|2001|2001|2001|503|http_5xx");
    /* slowest first */
    assert_string_equal(q1("select string_agg(endpoint_id, ',') from sluice_slow_endpoints(0, 1)"),
                        "sb,sd,sa,sc");
}

static void test_pattern_clustered_outage(void **state)
{
    (void)state;
    dead("c10", 10, 600, 60, "500", "http_5xx");       /* 10 within 9 minutes */
    dead("c9", 9, 600, 60, "500", "http_5xx");         /* 9 of 9: fewer than 10 */
    dead("c10of12", 10, 600, 60, "500", "http_5xx");   /* 10 of 12 clustered: 83% */
    dead("c10of12", 2, 7200, 3600, "500", "http_5xx"); /* + 2 spread over hours */
    dead("c10of13", 10, 600, 60, "500", "http_5xx");   /* 10 of 13: 77%, below 80% */
    dead("c10of13", 3, 7200, 3600, "500", "http_5xx");
    dead("edge", 10, 600, 100, "500", "http_5xx"); /* first and last exactly 15 min apart */
    dead("wide", 10, 600, 101, "500", "http_5xx"); /* 15 min + 9 s apart */
    assert_string_equal(patterns("c10", "24 hours"), "clustered outage");
    assert_string_equal(patterns("c9", "24 hours"), "");
    assert_string_equal(patterns("c10of12", "24 hours"), "clustered outage");
    assert_string_equal(patterns("c10of13", "24 hours"), "");
    assert_string_equal(patterns("edge", "24 hours"), "clustered outage");
    assert_string_equal(patterns("wide", "24 hours"), "");
    assert_string_equal(q1("select concat_ws('|', dead_letters, cluster_count,"
                           " cluster_start = first_dead_at)"
                           " from sluice_dead_letter_analysis('24 hours', 'wide')"),
                        "10|9|t");
    /* the window decides what counts: the spread three are outside 1 hour, 10 of 10 then */
    assert_string_equal(q1("select concat_ws('|', dead_letters, cluster_count) from"
                           " sluice_dead_letter_analysis('1 hour', 'c10of13')"),
                        "10|10");
    assert_string_equal(patterns("c10of13", "1 hour"), "clustered outage");
    /* the rule's numbers are parameters */
    assert_string_equal(q1("select array_to_string(patterns, ',') from"
                           " sluice_dead_letter_analysis('1 day', 'c9', p_cluster_min => 9)"),
                        "clustered outage");
    assert_string_equal(q1("select array_to_string(patterns, ',') from"
                           " sluice_dead_letter_analysis('1 day', 'wide', p_cluster_span =>"
                           " '909 s')"),
                        "clustered outage");
}

static void test_pattern_spikes(void **state)
{
    (void)state;
    /* spread 30 minutes apart over 5 hours: neither clustered nor gradual */
    dead("auth6", 3, 0, 1800, "401", "http_4xx");
    dead("auth6", 3, 60, 1800, "403", "http_4xx");
    dead("auth6", 4, 120, 1800, "500", "http_5xx");
    dead("auth5", 5, 0, 1800, "401", "http_4xx"); /* exactly half: not dominant */
    dead("auth5", 5, 60, 1800, "500", "http_5xx");
    dead("auth4", 4, 0, 1800, "401", "http_4xx"); /* all, but fewer than 5 */
    dead("rl5", 5, 0, 1800, "429", "http_429");
    dead("rl5", 4, 60, 1800, "503", "http_5xx");
    assert_string_equal(patterns("auth6", "24 hours"), "auth/permission spike");
    assert_string_equal(patterns("auth5", "24 hours"), "");
    assert_string_equal(patterns("auth4", "24 hours"), "");
    assert_string_equal(patterns("rl5", "24 hours"), "rate-limit spike");
    assert_string_equal(q1("select concat_ws('|', dead_letters, auth_count, rate_limit_count,"
                           " top_status, top_status_count, top_error, top_error_count)"
                           " from sluice_dead_letter_analysis('24 hours', 'auth6')"),
                        "10|6|0|500|4|http_4xx|6");
    /* a tie in the commonest status goes to the smaller one; "no response" is a value */
    dead("tie", 2, 0, 1800, "null", NULL);
    dead("tie", 2, 60, 1800, "502", "http_5xx");
    dead("tie", 2, 120, 1800, "500", "http_5xx");
    assert_string_equal(q1("select concat_ws('|', top_status, top_status_count, top_error,"
                           " top_error_count) from sluice_dead_letter_analysis('1 day', 'tie')"),
                        "500|2|http_5xx|4");
    exec_on(g_pg, "delete from dead_letters where endpoint_id = 'tie' and last_status is not null");
    assert_string_equal(q1("select concat_ws('|', coalesce(top_status::text, 'none'),"
                           " top_status_count, coalesce(top_error, 'none'))"
                           " from sluice_dead_letter_analysis('1 day', 'tie')"),
                        "none|2|none");
}

static void test_pattern_gradual(void **state)
{
    (void)state;
    dead("g6", 6, 1800, 3600, "500", "http_5xx");   /* one in each of the last 6 hours */
    dead("g5", 5, 1800, 3600, "500", "http_5xx");   /* 5 hours */
    dead("g2x3", 6, 1800, 7200, "500", "http_5xx"); /* 6 letters over 11 hours: 6 hours */
    assert_string_equal(patterns("g6", "24 hours"), "gradual accumulation");
    assert_string_equal(patterns("g5", "24 hours"), "");
    assert_string_equal(patterns("g2x3", "24 hours"), "gradual accumulation");
    assert_string_equal(q1("select hours_present from sluice_dead_letter_analysis('1 day', 'g6')"),
                        "6");
    /* a window shorter than 6 hours can never show it */
    assert_string_equal(patterns("g6", "5 hours"), "");
    /* unreplayed and without-payload counts, average attempts */
    exec_on(g_pg, "update dead_letters set replayed_at = now(), attempts = 5"
                  " where event_id in ('g6_1800_0', 'g6_1800_1')");
    exec_on(g_pg, "update dead_letters set payload = null where event_id = 'g6_1800_2'");
    assert_string_equal(q1("select concat_ws('|', dead_letters, unreplayed, without_payload,"
                           " avg_attempts) from sluice_dead_letter_analysis('1 day', 'g6')"),
                        "6|4|1|3.6666666666666665");
}

static void test_alerts(void **state)
{
    (void)state;
    /* 4 in the last hour, none before: fewer than the minimum 5 */
    dead("al", 4, 60, 60, "500", "http_5xx");
    assert_string_equal(q1("select count(*) from sluice_alerts()"), "0");
    /* 5: fires (above 2 x 0, and at the minimum) */
    exec_on(g_pg, "truncate dead_letters");
    dead("al", 5, 60, 60, "500", "http_5xx");
    assert_string_equal(q1("select concat_ws('|', alert, value, threshold) from sluice_alerts()"),
                        "dead_letters_rising|5|0");
    /* 72 in the 24 hours before (3 per hour, threshold 6): 6 does not fire, 7 does */
    exec_on(g_pg, "truncate dead_letters");
    dead("prev", 72, 3700, 1150, "500", "http_5xx");
    assert_string_equal(q1("select count(*) from dead_letters where dead_at < now() - interval"
                           " '1 hour' and dead_at >= now() - interval '25 hours'"),
                        "72");
    dead("al", 6, 60, 60, "500", "http_5xx");
    assert_string_equal(q1("select count(*) from sluice_alerts()"), "0");
    dead("al2", 1, 30, 1, "500", "http_5xx");
    assert_string_equal(q1("select concat_ws('|', alert, value, threshold) from sluice_alerts()"),
                        "dead_letters_rising|7|6");
    /* factor and minimum are parameters */
    assert_string_equal(q1("select count(*) from sluice_alerts(p_dead_rise_factor => 2.5)"), "0");
    assert_string_equal(q1("select count(*) from sluice_alerts(p_dead_rise_min => 8)"), "0");
    exec_on(g_pg, "truncate dead_letters");
    /* oldest undelivered: 29 minutes does not fire, 31 does; final states never count */
    exec_f("insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           " last_update, created_at)"
           " values ('o1', 'o', 'retry_scheduled', 1, now(), now(), now() - interval '29 min'),"
           "        ('o2', 'o', 'dead_letter', 1, now(), now(), now() - interval '2 h'),"
           "        ('o3', 'o', 'delivered', 1, now(), now(), now() - interval '3 h')");
    assert_string_equal(q1("select count(*) from sluice_alerts()"), "0");
    exec_f("insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           " last_update, created_at)"
           " values ('o4', 'o', 'deferred', 0, now(), now(), now() - interval '31 min')");
    assert_string_equal(q1("select concat_ws('|', alert, round(value), threshold)"
                           " from sluice_alerts()"),
                        "oldest_undelivered|1860|1800");
    assert_string_equal(q1("select count(*) from sluice_alerts(p_oldest_max => '1 hour')"), "0");
    /* slow endpoints, one row each */
    exec_f("insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
           " http_status)"
           " select 'slow' || (i %% 2), now() - interval '1 min', 'e' || i, 1, 3000000, 200"
           "   from generate_series(1, 40) i");
    assert_string_equal(q1("select string_agg(coalesce(endpoint_id, '-') || ':' || alert, ','"
                           " order by alert, endpoint_id) from sluice_alerts()"),
                        "-:oldest_undelivered,slow0:slow_endpoint,slow1:slow_endpoint");
    assert_string_equal(q1("select count(*) from sluice_alerts(p_oldest_max => '1 hour',"
                           " p_slow_min_samples => 21)"),
                        "0");
}

static void test_latency_histogram(void **state)
{
    (void)state;
    /* two samples on either side of every bucket boundary, plus one far beyond */
    exec_f("insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
           " http_status)"
           " select 'lh', now() - interval '1 min', 'e' || v, 1, v, 200"
           "   from unnest(array[9999, 10000, 49999, 50000, 99999, 100000, 249999, 250000,"
           "                     499999, 500000, 999999, 1000000, 1999999, 2000000, 4999999,"
           "                     5000000, 9999999, 10000000, 60000000]) v");
    assert_string_equal(q1("select bucket_counts::text from sluice_latency('lh')"),
                        "{1,2,2,2,2,2,2,2,2,2}");
    assert_string_equal(q1("select concat_ws('|', samples, min_ms, max_ms) from"
                           " sluice_latency('lh')"),
                        "19|9.999|60000");
    assert_string_equal(q1("select string_agg(concat_ws(':', label, lo_ms, coalesce(hi_ms::text,"
                           " '-'), samples), ',' order by bucket)"
                           " from sluice_latency_histogram('lh')"),
                        "<10ms:0:10:1,<50ms:10:50:2,<100ms:50:100:2,<250ms:100:250:2,"
                        "<500ms:250:500:2,<1s:500:1000:2,<2s:1000:2000:2,<5s:2000:5000:2,"
                        "<10s:5000:10000:2,>=10s:10000:-:2");
    exec_on(g_pg, "truncate endpoint_latency");
    exec_f("insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
           " http_status)"
           " select 'lp', now() - interval '1 min', 'e' || i, 1, i * 10000, 200"
           "   from generate_series(1, 10) i"
           " union all select 'lp', now() - interval '3 h', 'old', 1, 99000000, 200");
    assert_string_equal(q1("select concat_ws('|', samples, p50_ms, round(p95_ms::numeric, 3),"
                           " avg_ms) from sluice_latency('lp', '1 hour')"),
                        "10|55|95.500|55");
    assert_string_equal(q1("select samples from sluice_latency('lp')"), "11");
    assert_string_equal(q1("select concat_ws('|', samples, coalesce(p50_ms::text, 'none'),"
                           " bucket_counts) from sluice_latency('nobody')"),
                        "0|none|{0,0,0,0,0,0,0,0,0,0}");
}

static void test_replay_recover(void **state)
{
    (void)state;
    exec_f("insert into dead_letters (event_id, endpoint_id, attempts, first_failed_at, dead_at,"
           " payload) values ('r1', 'rp', 1, now(), '2026-01-01 10:00:00.123456+00', '\\x80'),"
           " ('r2', 'rp', 1, now(), '2026-01-01 10:00:00+00', '\\x80'),"
           " ('r3', 'rp', 1, now(), '2026-01-01 10:00:00+00', '\\x80'),"
           " ('r4', 'rp', 1, now(), '2026-01-01 10:00:00+00', '\\x80')");
    /* r1 acked for its current death; r2 acked for an earlier death; r3 only 'sending';
     * r4 acked but locked by a running replay */
    exec_f("insert into replay_log (run_id, event_id, endpoint_id, dead_at, state, acked_at)"
           " values ('x', 'r1', 'rp', '2026-01-01 10:00:00.123456+00', 'acked',"
           "         '2026-01-01 11:00:00+00'),"
           "        ('x', 'r2', 'rp', '2025-12-31 10:00:00+00', 'acked', now()),"
           "        ('x', 'r3', 'rp', '2026-01-01 10:00:00+00', 'sending', null),"
           "        ('x', 'r4', 'rp', '2026-01-01 10:00:00+00', 'acked', now())");
    PGconn *other = connect_db(g_db);
    exec_on(other, "begin");
    exec_on(other, "select 1 from dead_letters where event_id = 'r4' for update");
    assert_string_equal(q1("select sluice_replay_recover()"), "1");
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count || ':' ||"
                           " coalesce(replayed_at::text, '-'), ',' order by event_id)"
                           " from dead_letters"),
                        "r1:1:2026-01-01 11:00:00+00,r2:0:-,r3:0:-,r4:0:-");
    exec_on(other, "commit");
    PQfinish(other);
    assert_string_equal(q1("select sluice_replay_recover()"), "1");
    assert_string_equal(q1("select sluice_replay_recover()"), "0");
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count, ','"
                           " order by event_id) from dead_letters"),
                        "r1:1,r2:0,r3:0,r4:1");
    /* retention */
    exec_on(g_pg, "update replay_log set started_at = now() - interval '40 days'"
                  " where event_id in ('r1', 'r2')");
    assert_string_equal(q1("select sluice_purge_replay_log(30)"), "2");
    assert_string_equal(q1("select count(*) from replay_log"), "2");
}

static void test_pending_payloads_purge(void **state)
{
    (void)state;
    exec_f("insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           " last_update) values ('p1', 'pp', 'retry_scheduled', 1, now(), now()),"
           " ('p2', 'pp', 'deferred', 0, now(), now()), ('p3', 'pp', 'delivered', 2, now(), now()),"
           " ('p4', 'pp', 'dead_letter', 5, now(), now())");
    exec_f("insert into pending_payloads (event_id, endpoint_id, payload, attempt, ts)"
           " select 'p' || i, 'pp', '\\x80', 1, now() from generate_series(1, 5) i");
    assert_string_equal(q1("select sluice_purge_pending_payloads(2)"), "2");
    assert_string_equal(q1("select sluice_purge_pending_payloads()"), "1");
    assert_string_equal(q1("select string_agg(event_id, ',' order by event_id)"
                           " from pending_payloads"),
                        "p1,p2");
}

/* Retention of deliveries keeps the rows unresolved dead letters refer to (sql/0005), so a
 * dead letter replayed after the deliveries retention is still resolved when it is delivered
 * (the recorder learns the death from deliveries.last_dead_at). */
static void test_deliveries_purge_keeps_dead_letter_rows(void **state)
{
    (void)state;
    exec_f("insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           " last_update, last_dead_at) values"
           " ('old_done', 'pd', 'delivered', 1, now() - interval '20 days',"
           "  now() - interval '20 days', null),"
           " ('old_dead', 'pd', 'dead_letter', 5, now() - interval '20 days',"
           "  now() - interval '20 days', now() - interval '20 days'),"
           " ('old_resolved', 'pd', 'delivered', 6, now() - interval '20 days',"
           "  now() - interval '20 days', now() - interval '21 days'),"
           " ('new_dead', 'pd', 'dead_letter', 5, now(), now(), now())");
    exec_f("insert into dead_letters (event_id, endpoint_id, error_class, attempts, dead_at,"
           " first_failed_at, resolved_at) values"
           " ('old_dead', 'pd', 'http_5xx', 5, now() - interval '20 days',"
           "  now() - interval '20 days', null),"
           " ('old_resolved', 'pd', 'http_5xx', 5, now() - interval '21 days',"
           "  now() - interval '21 days', now() - interval '20 days'),"
           " ('new_dead', 'pd', 'http_5xx', 5, now(), now(), null)");
    assert_string_equal(q1("select sluice_purge_deliveries(14)"), "2");
    assert_string_equal(q1("select string_agg(event_id, ',' order by event_id) from deliveries"),
                        "new_dead,old_dead");
    /* once its dead letter is gone (its own retention), the row goes too */
    exec_f("delete from dead_letters where event_id = 'old_dead'");
    assert_string_equal(q1("select sluice_purge_deliveries(14)"), "1");
    assert_string_equal(q1("select string_agg(event_id, ',' order by event_id) from deliveries"),
                        "new_dead");
}

/* dead_letters hold payloads (personal data): only sluice_replay reads them; sluice_analyst
 * reads the failure details but not the payload; neither may rewrite or delete letters.
 * Retention (sluice_purge_dead_letters) deletes only letters older than its days. */
static void test_dead_letter_privileges_and_retention(void **state)
{
    (void)state;
    dead("pv", 2, 60, 60, "500", "http_5xx");
    exec_f("insert into dead_letters (event_id, endpoint_id, error_class, attempts,"
           " first_failed_at, dead_at, payload) values"
           " ('pv_old', 'pv', 'http_5xx', 3, now() - interval '40 days',"
           "  now() - interval '40 days', '\\x80')");
    exec_on(g_pg, "set role sluice_analyst");
    assert_string_equal(sqlstate("select event_id, error_class, last_status, attempts, dead_at"
                                 " from dead_letters"),
                        "");
    assert_string_equal(sqlstate("select payload from dead_letters"), "42501");
    assert_string_equal(sqlstate("select * from dead_letters"), "42501");
    assert_string_equal(sqlstate("select payload from pending_payloads"), "42501");
    exec_on(g_pg, "reset role");
    exec_on(g_pg, "set role sluice_replay");
    assert_string_equal(sqlstate("select payload from dead_letters"), "");
    assert_string_equal(sqlstate("update dead_letters set replayed_at = now(), replay_count ="
                                 " replay_count + 1 where endpoint_id = 'pv'"),
                        "");
    assert_string_equal(sqlstate("update dead_letters set error_class = 'x'"), "42501");
    assert_string_equal(sqlstate("delete from dead_letters"), "42501");
    /* the registry: the endpoints' ids (a replay leaves a deleted endpoint's letters), not
     * their URLs or headers, which may hold credentials */
    assert_string_equal(sqlstate("select id from endpoints"), "");
    assert_string_equal(sqlstate("select url from endpoints"), "42501");
    assert_string_equal(sqlstate("select headers from endpoints"), "42501");
    exec_on(g_pg, "reset role");
    assert_string_equal(q1("select has_table_privilege('public', 'dead_letters', 'select')::text"),
                        "false");
    /* retention: 30 days keeps the two recent letters */
    assert_string_equal(q1("select sluice_purge_dead_letters(30)"), "1");
    assert_string_equal(q1("select string_agg(event_id, ',' order by event_id) from"
                           " dead_letters where endpoint_id = 'pv'"),
                        "pv_60_0,pv_60_1");
    assert_string_equal(q1("select sluice_purge_dead_letters(30)"), "0");
}

/* Send sql on pg without waiting, and return once its backend waits for a lock (another
 * transaction holds the row it wants). */
static void send_until_blocked(PGconn *pg, const char *sql)
{
    assert_int_equal(PQsendQuery(pg, sql), 1);
    PGconn *watch = connect_db(g_db);
    char q[256];
    snprintf(q, sizeof(q),
             "select count(*) from pg_stat_activity where pid = %d and wait_event_type = 'Lock'",
             PQbackendPID(pg));
    bool blocked = false;
    for (int i = 0; i < 600 && !blocked; i++) {
        PGresult *r = PQexec(watch, q);
        blocked = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
        PQclear(r);
        if (!blocked)
            (void)usleep(50 * 1000);
    }
    PQfinish(watch);
    assert_true(blocked);
}

/* The first column of the answer to what was sent on pg, then pg is ready again. */
static void result_is(PGconn *pg, const char *want)
{
    PGresult *r = PQgetResult(pg);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_string_equal(PQgetvalue(r, 0, 0), want);
    PQclear(r);
    while ((r = PQgetResult(pg)) != NULL)
        PQclear(r);
}

/* A purge deletes only the row version it picked (sql/0008): a dead letter that died again,
 * or a pending payload a new retry replaced, while the purge waited for the row, stays. */
static void test_purges_leave_a_row_changed_while_they_run(void **state)
{
    (void)state;
    exec_f("insert into dead_letters (event_id, endpoint_id, error_class, attempts,"
           " first_failed_at, dead_at) values ('race', 'pr', 'http_5xx', 3,"
           " now() - interval '40 days', now() - interval '40 days')");
    exec_f("insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           " last_update) values ('race', 'pr', 'delivered', 1, now(), now())");
    exec_f("insert into pending_payloads (event_id, endpoint_id, payload, attempt, ts)"
           " values ('race', 'pr', '\\x80', 1, now() - interval '1 hour')");
    PGconn *other = connect_db(g_db);
    exec_on(other, "begin");
    exec_on(other, "update dead_letters set dead_at = now(), attempts = 4"
                   " where event_id = 'race'");
    exec_on(other, "update pending_payloads set ts = now(), attempt = 2 where event_id = 'race'");
    exec_on(other, "update deliveries set state = 'retry_scheduled' where event_id = 'race'");
    send_until_blocked(g_pg, "select sluice_purge_dead_letters(30)");
    exec_on(other, "commit");
    result_is(g_pg, "0");
    assert_string_equal(q1("select attempts from dead_letters where event_id = 'race'"), "4");

    exec_on(other, "begin");
    exec_on(other, "update pending_payloads set ts = now(), attempt = 3 where event_id = 'race'");
    exec_on(other, "update deliveries set state = 'delivered' where event_id = 'race'");
    exec_on(other, "commit");
    exec_on(other, "begin");
    exec_on(other, "update pending_payloads set ts = now() + interval '1 second', attempt = 4"
                   " where event_id = 'race'");
    exec_on(other, "update deliveries set state = 'retry_scheduled' where event_id = 'race'");
    send_until_blocked(g_pg, "select sluice_purge_pending_payloads()");
    exec_on(other, "commit");
    result_is(g_pg, "0");
    assert_string_equal(q1("select attempt from pending_payloads where event_id = 'race'"), "4");
    PQfinish(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_argument_checks, empty),
        cmocka_unit_test_setup(test_health_summary, empty),
        cmocka_unit_test_setup(test_slow_endpoints, empty),
        cmocka_unit_test_setup(test_pattern_clustered_outage, empty),
        cmocka_unit_test_setup(test_pattern_spikes, empty),
        cmocka_unit_test_setup(test_pattern_gradual, empty),
        cmocka_unit_test_setup(test_alerts, empty),
        cmocka_unit_test_setup(test_latency_histogram, empty),
        cmocka_unit_test_setup(test_replay_recover, empty),
        cmocka_unit_test_setup(test_pending_payloads_purge, empty),
        cmocka_unit_test_setup(test_deliveries_purge_keeps_dead_letter_rows, empty),
        cmocka_unit_test_setup(test_dead_letter_privileges_and_retention, empty),
        cmocka_unit_test_setup(test_purges_leave_a_row_changed_while_they_run, empty),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
