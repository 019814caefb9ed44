/*
 * The recorder's rules from their two sources, on the real PostgreSQL (recorder/rec_agg.h,
 * recorder/rec_db_int.h):
 *
 *   paths_agree      seeded, randomized outcome batches (every state, attempts out of order,
 *                    ties in time, dead letters replayed and resolved, deferrals, duplicates
 *                    after a delivery, quarantined rows without an endpoint, rows near and past
 *                    the retention limit, records read again, several lanes, sub-slices as the
 *                    bisection writes them, slices written twice) go through rec_db into two
 *                    private databases: one takes the endpoint_health inputs from rec_agg
 *                    wherever it can, the other from HEALTH_SQL only. The write statistics must
 *                    match write by write, and every history table row by row (columns set by
 *                    now() left out); a failure prints the seed and the differing rows.
 *                    SL_TEST_SEED=N replays a run, SL_TEST_ROUNDS=N runs more seeds.
 *   replaces         REC_DB_REPLACES_SQL (the deliveries upsert's rule) equals the schema's
 *                    deliveries_replaces() for every pair of states and order of times
 *   states_mismatch  databases whose outcome_state differs from the recorder's (order, an extra
 *                    label): rec_db_connect refuses them with SL_EVERSION naming the
 *                    difference, also on a reconnect, and sluice-recorder exits 1 with
 *                    schema_mismatch at start (its maintenance connection checks at once)
 *
 * Env: SLUICE_PG_DSN (each test makes private databases on that server, dropped at the end);
 * eval "$(scripts/stack.sh env)" or tests/integration/run_private.sh test_rec_paths.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "recorder/rec_agg.h"
#include "recorder/rec_batch.h"
#include "recorder/rec_db.h"
#include "recorder/rec_db_int.h"
#include "sl_test_pg.h"
#include "sl_testenv.h"

#define RECORDER        SL_BINARY_DIR "/recorder/sluice-recorder"
#define TEST_MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

#define HISTORY_DAYS 30   /* history_retention_d of both handles */
#define WINDOW_H     48   /* latency_window_h of both handles */
#define DELIVERIES   1500 /* deliveries generated per round */
#define DIFF_SHOWN   12   /* differing rows printed per table */
#define DAY_MS       86400000LL

static const char *g_base; /* SLUICE_PG_DSN */

/* ==== Seeded generator (splitmix64) ==== */

static uint64_t g_rng;  /* generator state */
static uint64_t g_seed; /* seed of the running round */

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

static bool chance(unsigned pct)
{
    return below(100) < pct;
}

/* ==== Outcome records ==== */

struct rec {
    struct sl_buf b; /* one encoded outcome record */
    uint64_t ts;     /* its time, unix ms */
};

struct recs {
    struct rec *v; /* the records, in the order they are read */
    size_t n;      /* records */
    size_t cap;    /* entries allocated */
};

static void emit(struct recs *rs, const struct sl_outcome *o)
{
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? rs->cap * 2 : 1024;
        rs->v = sl_xrealloc(rs->v, rs->cap * sizeof(*rs->v));
    }
    rs->v[rs->n].ts = o->ts_ms;
    struct sl_buf *b = &rs->v[rs->n].b;
    sl_buf_init(b, 1 << 20);
    sl_err_t err;
    int rc = sl_outcome_encode(o, b, &err);
    if (rc != 0)
        print_error("cannot encode a generated outcome: %s\n", err.msg);
    assert_int_equal(rc, 0);
    rs->n++;
}

static void recs_fini(struct recs *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        sl_buf_fini(&rs->v[i].b);
    free(rs->v);
    memset(rs, 0, sizeof(*rs));
}

/* Busy endpoints (ids of different lengths and cases: byte order differs from dictionary
 * order; the first takes half the deliveries), where ties in time are common; the other
 * deliveries spread over COLD_EPS more. */
static const char *const EPS[] = {"ep-a", "ep-b", "ep-B", "ep-aa", "ep-c", "e"};
#define NEPS     (sizeof(EPS) / sizeof(EPS[0]))
#define COLD_EPS 60

static const uint8_t ENV[] = "stands for a delivery record"; /* env bytes (not decoded) */
static const uint8_t RESP[] = "{\"error\":\"nope\"}";

/* Fill what each state carries (status, error class, timings, next, env, response). */
static void dress(struct sl_outcome *o)
{
    static const struct {
        uint32_t http;
        const char *err;
    } retry[] = {{503, "http_5xx"},
                 {500, "http_5xx"},
                 {429, "http_429"},
                 {0, "timeout"},
                 {0, "connect_failed"}},
      dead[] = {{404, "http_4xx"}, {410, "http_4xx"}, {503, "max_attempts"}, {0, "timeout"}};
    o->http = 0;
    o->err = NULL;
    o->msg = NULL;
    o->lat_us = o->dns_us = o->conn_us = o->tls_us = o->ttfb_us = 0;
    o->next_ms = 0;
    o->env = NULL;
    o->env_len = 0;
    o->resp = NULL;
    o->resp_len = 0;
    switch (o->state) {
    case SL_OUTCOME_DELIVERED:
        o->http = chance(60) ? 200 : 204;
        break;
    case SL_OUTCOME_RETRY_SCHEDULED: {
        size_t k = below(sizeof(retry) / sizeof(retry[0]));
        o->http = retry[k].http;
        o->err = retry[k].err;
        o->next_ms = o->ts_ms + 30000;
        break;
    }
    case SL_OUTCOME_DEAD_LETTER: {
        size_t k = below(sizeof(dead) / sizeof(dead[0]));
        o->http = o->attempt == 0 ? 0 : dead[k].http;
        o->err = o->attempt == 0 ? "endpoint_disabled" : dead[k].err;
        o->msg = chance(50) ? "gave up" : NULL;
        if (o->http && chance(50)) {
            o->resp = RESP;
            o->resp_len = sizeof(RESP) - 1;
        }
        break;
    }
    case SL_OUTCOME_DEFERRED:
        o->err = chance(60) ? "breaker_open" : "rate_limited";
        o->next_ms = o->ts_ms + 1000 + below(5000);
        break;
    case SL_OUTCOME_DISABLED:
        o->err = "endpoint_disabled";
        o->msg = "410 gone";
        break;
    case SL_OUTCOME_QUARANTINED:
        o->err = "bad_record";
        break;
    case SL_OUTCOME_DUPLICATE:
        break;
    }
    if (o->http && chance(90)) {
        o->lat_us = 1000 + below(3000000);
        o->ttfb_us = o->lat_us / 2;
    }
    bool keeps_env = o->state == SL_OUTCOME_DEAD_LETTER || o->state == SL_OUTCOME_RETRY_SCHEDULED ||
                     o->state == SL_OUTCOME_DEFERRED;
    if (keeps_env && chance(70)) {
        o->env = ENV;
        o->env_len = sizeof(ENV) - 1;
    }
}

/*
 * The records of one delivery (event ev to endpoint ep), in the order a consumer produces
 * them. Times: mostly on a one-second grid, so deliveries of an endpoint tie often; within a
 * delivery (ts, state) never repeats (a retry and a dead letter, or a delivery and its duplicate,
 * may share a millisecond).
 */
static void gen_delivery(struct recs *rs, const char *ev, int64_t base_ms)
{
    char cold[32];
    snprintf(cold, sizeof(cold), "ep-cold-%d", (int)below(COLD_EPS));
    struct sl_outcome o = {
        .id = ev,
        .ep = chance(50)   ? EPS[0]
              : chance(60) ? EPS[below(NEPS)]
                           : cold,
        .type = chance(50) ? "order.paid" : "user.created",
        .created_ms = (uint64_t)base_ms - 5000,
        .pod = chance(50) ? "pod-1" : "pod-2",
    };
    uint64_t sec = (uint64_t)base_ms + below(3) * 1000; /* the outcome's second, unix ms */
    uint64_t ts = sec;
#define STEP(same_ms_ok)                                                                           \
    do {                                                                                           \
        if (!(same_ms_ok) || !chance(30)) {                                                        \
            sec += 1000 * (1 + below(2));                                                          \
            ts = sec + (chance(10) ? below(5) : 0);                                                \
        }                                                                                          \
    } while (0)
#define OUT(st, att)                                                                               \
    do {                                                                                           \
        o.state = (st);                                                                            \
        o.attempt = (att);                                                                         \
        o.ts_ms = ts;                                                                              \
        dress(&o);                                                                                 \
        emit(rs, &o);                                                                              \
    } while (0)
    uint64_t kind = below(100);
    if (kind < 4) { /* the delivery record itself was broken */
        if (chance(50)) {
            o.id = NULL;
            o.ep = NULL;
            o.type = NULL;
            o.created_ms = 0;
        }
        OUT(SL_OUTCOME_QUARANTINED, 0);
        return;
    }
    if (kind < 8) { /* endpoint disabled or unknown */
        OUT(SL_OUTCOME_DISABLED, 0);
        return;
    }
    uint32_t attempt = 1;
    for (int steps = 0; steps < 12; steps++) {
        if (chance(15)) { /* rescheduled without spending an attempt */
            STEP(false);
            OUT(SL_OUTCOME_DEFERRED, 0);
        }
        STEP(false);
        uint64_t r = below(100);
        if (r < 40) {
            OUT(SL_OUTCOME_DELIVERED, attempt);
            if (chance(25)) { /* delivered again by a replay or a re-produced copy */
                STEP(true);
                OUT(SL_OUTCOME_DUPLICATE, chance(50) ? attempt : 0);
            }
            return;
        }
        if (r < 85 && attempt < 5) {
            OUT(SL_OUTCOME_RETRY_SCHEDULED, attempt);
            if (chance(5)) { /* the endpoint was disabled while the retry waited */
                STEP(true);
                OUT(SL_OUTCOME_DEAD_LETTER, 0);
                if (!chance(40))
                    return;
            }
            attempt++;
            continue;
        }
        OUT(SL_OUTCOME_DEAD_LETTER, attempt);
        if (!chance(35))
            return;
        attempt++; /* replayed: the delivery starts again */
    }
#undef OUT
#undef STEP
}

static int by_ts(const void *x, const void *y)
{
    const struct rec *a = x;
    const struct rec *b = y;
    return a->ts < b->ts ? -1 : a->ts > b->ts;
}

/* One round's records: twelve deliveries starting each second a few hours ago (a few near and
 * past the retention limit), in time order as consumers produce them, then shuffled within a
 * window and now and then far (out of order). */
static void gen_round(struct recs *rs, int round)
{
    int64_t now = (int64_t)time(NULL) * 1000;
    int64_t base = (now - 3 * 3600 * 1000) / 1000 * 1000;
    for (int i = 0; i < DELIVERIES; i++) {
        char ev[48];
        /* ids in no relation to the order of the records (ties are broken by event id) */
        snprintf(ev, sizeof(ev), "ev-%d-%04x-%d%s", round, (unsigned)below(0x10000), i,
                 chance(10) ? "-long-event-id" : "");
        int64_t b = base + i / 12 * 1000; /* twelve deliveries start each second */
        uint64_t age = below(1000);
        if (age < 2) /* older than any write's eligibility for rec_agg, still recorded */
            b = now - (HISTORY_DAYS - 1) * DAY_MS - 3600 * 1000;
        else if (age < 4) /* past the retention: never recorded */
            b = now - (HISTORY_DAYS + 1) * DAY_MS;
        gen_delivery(rs, ev, b);
    }
    qsort(rs->v, rs->n, sizeof(rs->v[0]), by_ts);
    for (size_t i = 0; i + 1 < rs->n; i++) {
        size_t w = below(1000) < 3 ? rs->n - i : (rs->n - i < 40 ? rs->n - i : 40);
        size_t j = i + below(w);
        struct rec t = rs->v[i];
        rs->v[i] = rs->v[j];
        rs->v[j] = t;
    }
}

/* ==== Writing through both paths ==== */

struct side {
    char name[64];  /* private database */
    char dsn[1024]; /* its conninfo */
    PGconn *pg;     /* for the comparison */
    rec_db_t *db;   /* the recorder's handle */
    int64_t writes; /* slices written */
    int64_t agg;    /* of which with the health inputs from rec_agg */
};

static struct side g_c;   /* rec_agg wherever it can */
static struct side g_sql; /* HEALTH_SQL only */

static void side_open(struct side *s, const char *tag, enum rec_db_health h)
{
    snprintf(s->name, sizeof(s->name), "sluice_rp_%s_%d_%ld", tag, (int)getpid(), (long)time(NULL));
    s->pg = sl_test_pg_create(g_base, s->name, NULL);
    sl_test_pg_dsn(g_base, s->name, s->dsn, sizeof(s->dsn));
    s->db = rec_db_new(s->dsn, WINDOW_H, HISTORY_DAYS);
    rec_db_set_health(s->db, h);
}

static void side_close(struct side *s)
{
    rec_db_destroy(s->db);
    if (s->pg)
        PQfinish(s->pg);
    if (s->name[0])
        sl_test_pg_drop(g_base, s->name);
    memset(s, 0, sizeof(*s));
}

/* ==== Comparing the tables ==== */

/* Rows of table as text in C order, columns set by now() left out (caller PQclear). */
static PGresult *table_rows(PGconn *pg, const char *table)
{
    const char *p[1] = {table};
    PGresult *r = PQexecParams(pg,
                               "select string_agg(quote_ident(column_name), ', '"
                               "                  order by ordinal_position)"
                               "  from information_schema.columns"
                               " where table_schema = 'public' and table_name = $1"
                               "   and column_name not in ('recorded_at', 'updated_at')",
                               1, NULL, p, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    char sql[2048];
    snprintf(sql, sizeof(sql), "select row(%s)::text collate \"C\" as r from %s order by r",
             PQgetvalue(r, 0, 0), table);
    PQclear(r);
    r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        print_error("%s: %s\n", sql, PQresultErrorMessage(r));
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    return r;
}

/* Differing rows of table between the sides (printed, at most DIFF_SHOWN; with the row
 * count when verbose). */
static size_t compare_table(const char *table, bool verbose)
{
    PGresult *a = table_rows(g_c.pg, table);
    PGresult *b = table_rows(g_sql.pg, table);
    int na = PQntuples(a);
    int nb = PQntuples(b);
    size_t diffs = 0;
    for (int i = 0, j = 0; i < na || j < nb;) {
        int c = i >= na ? 1 : j >= nb ? -1 : strcmp(PQgetvalue(a, i, 0), PQgetvalue(b, j, 0));
        if (c == 0) {
            i++, j++;
            continue;
        }
        if (diffs++ < DIFF_SHOWN)
            fprintf(stderr, "  %s, only with %s: %s\n", table, c < 0 ? "rec_agg" : "HEALTH_SQL",
                    c < 0 ? PQgetvalue(a, i, 0) : PQgetvalue(b, j, 0));
        if (c < 0)
            i++;
        else
            j++;
    }
    if (verbose || diffs)
        fprintf(stderr, "  %-18s %6d rows, %zu differing\n", table, na, diffs);
    PQclear(a);
    PQclear(b);
    return diffs;
}

static void write_slice(struct rec_batch *b, size_t lane, size_t from, size_t to)
{
    struct rec_db_stats sc, ss;
    sl_err_t err;
    int rc = rec_db_write(g_c.db, b, lane, from, to, &sc, &err);
    if (rc != 0)
        print_error("seed %llu: rec_agg side: %s\n", (unsigned long long)g_seed, err.msg);
    assert_int_equal(rc, 0);
    rc = rec_db_write(g_sql.db, b, lane, from, to, &ss, &err);
    if (rc != 0)
        print_error("seed %llu: SQL side: %s\n", (unsigned long long)g_seed, err.msg);
    assert_int_equal(rc, 0);
    assert_false(ss.agg);
    g_c.writes++;
    g_c.agg += sc.agg;
    g_sql.writes++;
    if (sc.attempts != ss.attempts || sc.samples != ss.samples || sc.deliveries != ss.deliveries ||
        sc.dead != ss.dead || sc.resolved != ss.resolved || sc.pending != ss.pending) {
        print_error(
            "seed %llu: write %lld differs (rec_agg side / SQL side): attempts %lld/%lld samples "
            "%lld/%lld deliveries %lld/%lld dead %lld/%lld resolved %lld/%lld pending "
            "%lld/%lld\n",
            (unsigned long long)g_seed, (long long)g_c.writes, (long long)sc.attempts,
            (long long)ss.attempts, (long long)sc.samples, (long long)ss.samples,
            (long long)sc.deliveries, (long long)ss.deliveries, (long long)sc.dead,
            (long long)ss.dead, (long long)sc.resolved, (long long)ss.resolved,
            (long long)sc.pending, (long long)ss.pending);
        fail();
    }
}

/* Write every lane of b to both sides: whole, or in two or three sub-slices (as the
 * bisection writes them), now and then a slice twice (a COMMIT whose reply was lost). */
static void write_batch(struct rec_batch *b)
{
    for (size_t lane = 0; lane < b->nlanes; lane++) {
        size_t n = b->lanes[lane].n;
        if (n == 0)
            continue;
        size_t cuts[4] = {0, n, n, n};
        size_t parts = 1;
        if (n > 2 && chance(20)) {
            parts = 2 + below(2);
            cuts[1] = 1 + below(n - 1);
            cuts[2] = parts == 3 ? cuts[1] + below(n - cuts[1]) : n;
            if (cuts[2] == cuts[1]) {
                parts = 2;
                cuts[2] = n;
            }
        }
        for (size_t p = 0; p < parts; p++) {
            write_slice(b, lane, cuts[p], cuts[p + 1]);
            if (chance(4))
                write_slice(b, lane, cuts[p], cuts[p + 1]);
        }
    }
}

/* Feed the round's records in batches of random size and lane count; some batches also
 * carry records read before (a re-read after a crash or rebalance) or a record twice. */
static void feed(const struct recs *rs)
{
    int64_t offset = 0;
    for (size_t i = 0; i < rs->n;) {
        struct rec_batch b;
        rec_batch_init(&b, 1 + below(3), 100000, (size_t)1 << 26, 0);
        size_t k = 1 + below(chance(10) ? 600 : 150);
        if (k > rs->n - i)
            k = rs->n - i;
        sl_err_t err;
        for (size_t j = i; j < i + k; j++)
            assert_int_equal(
                rec_batch_add(&b, rs->v[j].b.data, rs->v[j].b.len, 0, offset++, 1, &err), 0);
        if (chance(5)) { /* the same record twice on the topic */
            size_t j = i + below(k);
            assert_int_equal(
                rec_batch_add(&b, rs->v[j].b.data, rs->v[j].b.len, 0, offset++, 1, &err), 0);
        }
        if (i > 0 && chance(12)) {
            size_t again = 1 + below(30);
            for (size_t a = 0; a < again; a++) {
                size_t j = below(i);
                assert_int_equal(
                    rec_batch_add(&b, rs->v[j].b.data, rs->v[j].b.len, 0, offset++, 1, &err), 0);
            }
        }
        write_batch(&b);
        rec_batch_fini(&b);
        i += k;
        if (compare_table("endpoint_health", false) != 0) {
            print_error("paths_agree: endpoint_health differs after the batch ending with record "
                        "%zu (seed %llu: SL_TEST_SEED=%llu SL_TEST_ROUNDS=1 replays it)\n",
                        i, (unsigned long long)g_seed, (unsigned long long)g_seed);
            fail();
        }
    }
}

static const char *const TABLES[] = {"delivery_attempts", "deliveries",   "endpoint_latency",
                                     "endpoint_health",   "dead_letters", "pending_payloads"};

static void empty_tables(PGconn *pg)
{
    sl_test_pg_exec(pg, "truncate delivery_attempts, deliveries, endpoint_latency,"
                        " endpoint_health, dead_letters, pending_payloads");
}

static void test_paths_agree(void **state)
{
    (void)state;
    const char *seed_env = getenv("SL_TEST_SEED");
    const char *rounds_env = getenv("SL_TEST_ROUNDS");
    uint64_t seed = seed_env && *seed_env ? strtoull(seed_env, NULL, 10)
                                          : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    long rounds = rounds_env && *rounds_env ? strtol(rounds_env, NULL, 10) : 3;
    for (long round = 0; round < rounds; round++) {
        uint64_t s = seed + (uint64_t)round;
        g_rng = s;
        g_seed = s;
        fprintf(stderr, "paths_agree: seed %llu (SL_TEST_SEED=%llu SL_TEST_ROUNDS=1 replays it)\n",
                (unsigned long long)s, (unsigned long long)s);
        empty_tables(g_c.pg);
        empty_tables(g_sql.pg);
        struct recs rs = {0};
        gen_round(&rs, (int)round);
        int64_t writes0 = g_c.writes;
        int64_t agg0 = g_c.agg;
        feed(&rs);
        size_t diffs = 0;
        for (size_t t = 0; t < sizeof(TABLES) / sizeof(TABLES[0]); t++)
            diffs += compare_table(TABLES[t], true);
        fprintf(stderr, "  %zu records, %lld writes, %lld of them with rec_agg\n", rs.n,
                (long long)(g_c.writes - writes0), (long long)(g_c.agg - agg0));
        recs_fini(&rs);
        if (diffs)
            print_error("paths_agree: the rec_agg and HEALTH_SQL paths differ in %zu rows "
                        "(seed %llu: SL_TEST_SEED=%llu SL_TEST_ROUNDS=1 replays it)\n",
                        diffs, (unsigned long long)s, (unsigned long long)s);
        assert_int_equal(diffs, 0);
        /* both paths must have had real work: most writes new rows only, some re-reads */
        assert_true(g_c.agg - agg0 > (g_c.writes - writes0) / 2);
        assert_true(g_c.agg - agg0 < g_c.writes - writes0);
    }
}

/* ==== deliveries_replaces and its copy in the upsert ==== */

static void test_replaces(void **state)
{
    (void)state;
    static const char sql[] =
        "with t(last_update) as (values (timestamptz '2030-01-01 00:00:00+00'),"
        "                               (timestamptz '2030-01-01 00:00:00.001+00'),"
        "                               (timestamptz '2030-01-01 00:00:01+00')),"
        "     s(state, last_update) as (select x, t.last_update"
        "                                 from unnest(enum_range(null::outcome_state)) x, t)"
        " select count(*), count(*) filter (where deliveries_replaces(d.state, d.last_update,"
        "            excluded.state, excluded.last_update) is distinct from " REC_DB_REPLACES_SQL
        "        ), string_agg(d.state || '@' || d.last_update || ' <- ' || excluded.state || '@'"
        "                      || excluded.last_update, '; ') filter (where deliveries_replaces("
        "            d.state, d.last_update, excluded.state, excluded.last_update)"
        "            is distinct from " REC_DB_REPLACES_SQL ")"
        "   from s d, s excluded";
    PGresult *r = PQexec(g_c.pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        print_error("%s\n", PQresultErrorMessage(r));
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_string_equal(PQgetvalue(r, 0, 0), "441"); /* (7 states x 3 times)^2 */
    if (strcmp(PQgetvalue(r, 0, 1), "0") != 0)
        print_error("REC_DB_REPLACES_SQL differs from deliveries_replaces() for: %s\n",
                    PQgetvalue(r, 0, 2));
    assert_string_equal(PQgetvalue(r, 0, 1), "0");
    PQclear(r);
}

/* ==== outcome_state checked at connect ==== */

/* Start sluice-recorder against dsn (a topic of its own, which need not exist); its output
 * goes to log. */
static pid_t rec_spawn(const char *dsn, const char *log)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        char topic[64];
        snprintf(topic, sizeof(topic), "sluice.test.rp.%d", (int)getpid());
        setenv("SLUICE_PG_DSN", dsn, 1);
        setenv("SLUICE_TOPIC_OUTCOMES", topic, 1);
        setenv("SLUICE_RECORDER_GROUP", topic, 1);
        setenv("SLUICE_MASTER_KEY", TEST_MASTER_KEY, 1);
        execl(RECORDER, RECORDER, (char *)NULL);
        fprintf(stderr, "cannot exec %s: %s\n", RECORDER, strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Wait up to 60 s for pid to exit on its own; its exit status (fails the test, after a
 * SIGKILL, if it does not exit). */
static int rec_wait(pid_t pid)
{
    int st = 0;
    for (int i = 0; i < 600; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    print_error("sluice-recorder did not exit on a mismatching outcome_state\n");
    fail();
    return -1;
}

/* First column of the first row of sql on pg (static buffer). */
static const char *q1(PGconn *pg, const char *sql)
{
    static char out[256];
    PGresult *r = PQexec(pg, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    snprintf(out, sizeof(out), "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return out;
}

static bool file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void test_states_mismatch(void **state)
{
    (void)state;
    /* labels in another order: the migrations keep an existing type */
    struct side x = {0};
    snprintf(x.name, sizeof(x.name), "sluice_rp_x_%d_%ld", (int)getpid(), (long)time(NULL));
    x.pg = sl_test_pg_create(g_base, x.name,
                             "create type outcome_state as enum ('deferred', 'retry_scheduled',"
                             " 'quarantined', 'disabled', 'dead_letter', 'duplicate',"
                             " 'delivered')");
    sl_test_pg_dsn(g_base, x.name, x.dsn, sizeof(x.dsn));
    x.db = rec_db_new(x.dsn, WINDOW_H, HISTORY_DAYS);
    sl_err_t err;
    assert_int_equal(rec_db_connect(x.db, &err), SL_EVERSION);
    fprintf(stderr, "rec_db_connect: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "label 3 in sort order is \"quarantined\", expected "
                                    "\"disabled\""));
    assert_false(rec_db_connected(x.db));
    char log[128];
    snprintf(log, sizeof(log), "/tmp/sl_rec_paths_%d.log", (int)getpid());
    assert_int_equal(rec_wait(rec_spawn(x.dsn, log)), 1);
    if (!file_has(log, "\"schema_mismatch\"") || !file_has(log, "expected \\\"disabled\\\""))
        print_error("sluice-recorder's output (%s) lacks schema_mismatch naming the label\n", log);
    assert_true(file_has(log, "\"schema_mismatch\""));
    assert_true(file_has(log, "expected \\\"disabled\\\""));
    side_close(&x);

    /* a label added while connected: found at the next connect, by rec_db_connect and by a
     * running sluice-recorder whose connections are cut */
    rec_db_t *db = rec_db_new(g_sql.dsn, WINDOW_H, HISTORY_DAYS);
    assert_int_equal(rec_db_connect(db, &err), 0);
    pid_t pid = rec_spawn(g_sql.dsn, log);
    const char *ran = "select count(*) from pg_stat_activity" /* its maintenance ran */
                      " where application_name = 'sluice-recorder'"
                      "   and datname = current_database() and query like 'select sluice\\_%'";
    for (int i = 0; i < 300 && strcmp(q1(g_sql.pg, ran), "0") == 0; i++)
        usleep(100000);
    assert_string_not_equal(q1(g_sql.pg, ran), "0");
    sl_test_pg_exec(g_sql.pg, "alter type outcome_state add value 'bounced'");
    rec_db_disconnect(db);
    assert_int_equal(rec_db_connect(db, &err), SL_EVERSION);
    assert_non_null(strstr(err.msg, "8 labels, expected 7 (\"bounced\" is unknown)"));
    rec_db_destroy(db);
    sl_test_pg_exec(g_sql.pg, "select pg_terminate_backend(pid) from pg_stat_activity"
                              " where application_name = 'sluice-recorder'"
                              "   and datname = current_database()");
    assert_int_equal(rec_wait(pid), 1);
    assert_true(file_has(log, "\"recorder_started\""));
    assert_true(file_has(log, "\"schema_mismatch\""));
    assert_true(file_has(log, "(\\\"bounced\\\" is unknown)"));
    unlink(log);
}

/* ==== main ==== */

static int setup(void **state)
{
    (void)state;
    g_base = sl_test_env("SLUICE_PG_DSN");
    side_open(&g_c, "c", REC_DB_HEALTH_AGG);
    side_open(&g_sql, "s", REC_DB_HEALTH_SQL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    side_close(&g_c);
    side_close(&g_sql);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replaces), cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_states_mismatch), /* last: alters the SQL side's type */
    };
    const char *filter = getenv("SL_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
