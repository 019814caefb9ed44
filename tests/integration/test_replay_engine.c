/*
 * Integration test of the replay engine (common/sl_replay.h) called directly, the way a
 * multi-threaded server calls it: two threads replaying the same selection at once, each with
 * its own pair of connections (one pair in a foreign DateStyle and TimeZone), send every
 * letter exactly once; the journal names each letter's exact death; a dry run lists without
 * changing anything; a letter an interrupted run got acknowledged is recovered, not re-sent;
 * malformed selections are refused before anything is touched.
 *
 * Isolation: a private database on the shared PostgreSQL server (SLUICE_PG_DSN) with every
 * migration of sql/ applied, dropped at the end, and a deliveries topic of its own on the
 * shared broker (SLUICE_KAFKA_BROKERS), deleted at the end. A missing service fails the test.
 */
#include <inttypes.h>
#include <pthread.h>
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
#include <librdkafka/rdkafka.h>

#include "common/sl_cfg.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_replay.h"
#include "sl_test_kafka.h"
#include "sl_test_pg.h"
#include "sl_testenv.h"

#define N_LETTERS 40 /* dead letters of the concurrency test */
#define N_THREADS 2

static struct {
    char dsn[1024];       /* SLUICE_PG_DSN */
    char db[64];          /* the private database */
    char topic[96];       /* the private deliveries topic */
    const char *brokers;  /* SLUICE_KAFKA_BROKERS */
    PGconn *pg;           /* test's own connection to the private database */
    struct sl_config cfg; /* topic_deliveries = topic */
} T;

/* ==== helpers ==== */

static PGconn *connect_db(const char *dbname)
{
    return sl_test_pg_connect(T.dsn, dbname);
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

/* First column of the first row as text (static buffer; "" for NULL). */
__attribute__((format(printf, 1, 2))) static const char *q1(const char *fmt, ...)
{
    static char out[4096];
    char sql[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(T.pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        fprintf(stderr, "query failed: %s\n%s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
        return "";
    }
    snprintf(out, sizeof(out), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return out;
}

/* Records in the private topic (sum of the partitions' high watermarks: nothing is deleted). */
static int64_t topic_records(void)
{
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(
        rd_kafka_conf_set(conf, "bootstrap.servers", T.brokers, errstr, sizeof(errstr)),
        RD_KAFKA_CONF_OK);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    assert_non_null(rk);
    int64_t total = 0;
    for (int32_t p = 0; p < 2; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
        /* a topic created moments ago may not be in the metadata yet, or its leader not
         * known (unknown partition, NOT_LEADER, LEADER_NOT_AVAILABLE): ask again for up to
         * 10 s */
        for (int tries = 0; tries < 100; tries++) {
            e = rd_kafka_query_watermark_offsets(rk, T.topic, p, &lo, &hi, 10000);
            if (e != RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION &&
                e != RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE &&
                e != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART &&
                e != RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION && e != RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC)
                break;
            usleep(100 * 1000);
        }
        assert_int_equal(e, RD_KAFKA_RESP_ERR_NO_ERROR);
        total += hi;
    }
    rd_kafka_destroy(rk);
    return total;
}

/* Insert dead letter ev of ep (registered, unless it is already), died `ago_ms` ms ago
 * (microsecond precision), with its stored delivery record. */
static void dead_letter(const char *ev, const char *ep, int64_t ago_us)
{
    const char *pe[1] = {ep};
    PGresult *re = PQexecParams(T.pg,
                                "insert into endpoints (id, url) values ($1, 'https://x.test/')"
                                " on conflict do nothing",
                                1, NULL, pe, NULL, NULL, 0);
    if (PQresultStatus(re) != PGRES_COMMAND_OK)
        fail_msg("register endpoint: %s", PQresultErrorMessage(re));
    PQclear(re);
    struct sl_delivery d = {.id = ev,
                            .ep = ep,
                            .type = "order.created",
                            .ts_ms = 1700000000000ULL,
                            .body = (const uint8_t *)"{\"n\":1}",
                            .body_len = 7,
                            .attempt = 3};
    struct sl_buf b;
    sl_buf_init(&b, 1 << 20);
    sl_err_t err;
    assert_int_equal(sl_delivery_encode(&d, &b, &err), 0);
    size_t esc_len = 0;
    unsigned char *esc = PQescapeByteaConn(T.pg, b.data, b.len, &esc_len);
    assert_non_null(esc);
    char ago[32];
    snprintf(ago, sizeof(ago), "%" PRId64, ago_us);
    const char *p[4] = {ev, ep, (const char *)esc, ago};
    PGresult *r = PQexecParams(
        T.pg,
        "insert into dead_letters (event_id, endpoint_id, payload, error_class, last_status,"
        " attempts, first_failed_at, dead_at)"
        " values ($1, $2, $3::bytea, 'http_5xx', 503, 3, now(),"
        "         now() - $4::bigint * interval '1 microsecond')",
        4, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        fail_msg("insert dead letter: %s", PQresultErrorMessage(r));
    PQclear(r);
    PQfreemem(esc);
    sl_buf_fini(&b);
}

/* A connection to the private database, optionally with foreign session settings. */
static PGconn *engine_conn(bool foreign)
{
    PGconn *pg = connect_db(T.db);
    exec_on(pg, foreign ? "set datestyle = 'SQL, DMY'; set timezone = 'America/New_York'"
                        : "set datestyle = 'ISO, MDY'; set timezone = 'UTC'");
    exec_on(pg, "set lock_timeout = '30s'; set statement_timeout = '60s'");
    return pg;
}

/* ==== setup ==== */

static int group_setup(void **state)
{
    (void)state;
    snprintf(T.dsn, sizeof(T.dsn), "%s", sl_test_env("SLUICE_PG_DSN"));
    T.brokers = sl_test_env("SLUICE_KAFKA_BROKERS");
    snprintf(T.db, sizeof(T.db), "sluice_tr_%d_%ld", (int)getpid(), (long)time(NULL));
    T.pg = sl_test_pg_create(T.dsn, T.db, NULL);
    sl_test_topic_name(T.topic, sizeof(T.topic), "test.replay");
    char errstr[512];
    if (sl_test_topic_create(T.brokers, T.topic, 2, errstr, sizeof(errstr)) != 0) {
        fprintf(stderr, "cannot create topic %s: %s\n", T.topic, errstr);
        return -1;
    }
    setenv("SLUICE_TOPIC_DELIVERIES", T.topic, 1);
    if (sl_cfg_load(&T.cfg, NULL, NULL, stderr) != 0) {
        fprintf(stderr, "configuration from the environment is invalid\n");
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    char errstr[512];
    (void)sl_test_topic_delete(T.brokers, T.topic, errstr, sizeof(errstr));
    sl_cfg_fini(&T.cfg);
    PQfinish(T.pg);
    sl_test_pg_drop(T.dsn, T.db);
    return 0;
}

/* Every test starts from no dead letters and an empty journal. */
static int empty(void **state)
{
    (void)state;
    exec_on(T.pg, "truncate dead_letters, replay_log");
    return 0;
}

/* ==== tests ==== */

struct worker {
    const char *ep;               /* endpoint selected */
    bool foreign;                 /* foreign DateStyle/TimeZone sessions */
    int rc;                       /* sl_replay_run's */
    struct sl_replay_result res;  /* its summary */
    sl_err_t err;                 /* its error */
    int64_t letters, replayed_cb; /* on_letter calls, of which SL_REPLAY_REPLAYED */
};

static void count_letter(void *opaque, const struct sl_replay_letter *l)
{
    struct worker *w = opaque;
    w->letters++;
    w->replayed_cb += l->outcome == SL_REPLAY_REPLAYED;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    PGconn *a = engine_conn(w->foreign), *b = engine_conn(w->foreign);
    struct sl_replay_sel sel = {.endpoint = w->ep};
    struct sl_replay_opts o = {
        .batch_size = 3, .kafka_role = "test-replay", .opaque = w, .on_letter = count_letter};
    sl_err_clear(&w->err);
    w->rc = sl_replay_run(a, b, &T.cfg, &sel, &o, &w->res, &w->err);
    PQfinish(a);
    PQfinish(b);
    return NULL;
}

static void test_concurrent_runs_send_each_letter_once(void **state)
{
    (void)state;
    int64_t before = topic_records();
    for (int i = 0; i < N_LETTERS; i++) {
        char ev[32];
        snprintf(ev, sizeof(ev), "evt_%02d", i);
        dead_letter(ev, "ep_a", (int64_t)(N_LETTERS - i) * 1000003); /* distinct µs */
    }
    dead_letter("evt_other", "ep_b", 5);
    struct worker w[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].ep = "ep_a";
        w[i].foreign = i == 1;
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    int64_t replayed = 0;
    for (int i = 0; i < N_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        if (w[i].rc != 0)
            fail_msg("run %d: %s", i, w[i].err.msg);
        assert_true(w[i].res.started);
        assert_int_equal(strlen(w[i].res.run_id), SL_REPLAY_RUN_ID_LEN);
        assert_int_equal(w[i].res.failed + w[i].res.invalid, 0);
        assert_int_equal(w[i].letters, w[i].res.replayed);
        assert_int_equal(w[i].replayed_cb, w[i].res.replayed);
        replayed += w[i].res.replayed;
    }
    assert_string_not_equal(w[0].res.run_id, w[1].res.run_id);
    assert_int_equal(replayed, N_LETTERS);
    assert_int_equal(topic_records() - before, N_LETTERS);
    assert_string_equal(q1("select count(*) from dead_letters where endpoint_id = 'ep_a'"
                           " and replayed_at is not null and replay_count = 1"),
                        "40");
    assert_string_equal(q1("select count(*) from dead_letters where replayed_at is null"), "1");
    /* the journal names each letter's exact death, also from the foreign sessions */
    assert_string_equal(q1("select count(*) from replay_log l join dead_letters d"
                           " using (event_id, endpoint_id)"
                           " where l.state = 'acked' and l.dead_at = d.dead_at"),
                        "40");
    assert_string_equal(q1("select count(*) from replay_log"), "40");
    /* a third run finds nothing */
    struct worker again = {.ep = "ep_a"};
    worker_main(&again);
    assert_int_equal(again.rc, 0);
    assert_int_equal(again.res.replayed, 0);
    assert_int_equal(topic_records() - before, N_LETTERS);
}

struct seen {
    int n;             /* candidates */
    char first[32];    /* first event id */
    int64_t last_dead; /* dead_ms of the previous candidate, for the order */
    bool ordered;      /* oldest death first so far */
};

static void count_candidate(void *opaque, const struct sl_replay_candidate *c)
{
    struct seen *s = opaque;
    if (s->n == 0)
        snprintf(s->first, sizeof(s->first), "%s", c->event_id);
    else if (c->dead_ms < s->last_dead)
        s->ordered = false;
    s->last_dead = c->dead_ms;
    s->n++;
    assert_string_equal(c->error_class, "http_5xx");
    assert_true(c->has_last_status);
    assert_int_equal(c->last_status, 503);
    assert_int_equal(c->attempts, 3);
    assert_true(c->bytes > 0);
}

static void test_dry_run_changes_nothing(void **state)
{
    (void)state;
    dead_letter("d1", "ep_a", 3000000);
    dead_letter("d2", "ep_a", 2000000);
    dead_letter("d3", "ep_a", 1000000);
    exec_on(T.pg, "insert into dead_letters (event_id, endpoint_id, attempts, first_failed_at,"
                  " dead_at) values ('d4', 'ep_a', 1, now(), now())");
    PGconn *a = engine_conn(true);
    struct sl_replay_sel sel = {.all = true, .limit = 2};
    struct sl_replay_dry_result d;
    struct seen s = {.ordered = true};
    sl_err_t err;
    assert_int_equal(sl_replay_dry_run(a, &sel, 0, count_candidate, &s, &d, &err), 0);
    assert_int_equal(d.would_replay, 2);
    assert_int_equal(d.without_payload, 1);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.first, "d1");
    assert_true(s.ordered);
    /* only the first shown_max are fetched; the rest are counted (the API shows 100 of what
     * may be millions: fetching them all held its HTTP loop) */
    struct sl_replay_sel every = {.all = true};
    struct seen s2 = {.ordered = true};
    assert_int_equal(sl_replay_dry_run(a, &every, 1, count_candidate, &s2, &d, &err), 0);
    assert_int_equal(d.would_replay, 3);
    assert_int_equal(s2.n, 1);
    assert_string_equal(s2.first, "d1");
    struct seen s3 = {.ordered = true};
    assert_int_equal(sl_replay_dry_run(a, &sel, 5, count_candidate, &s3, &d, &err), 0);
    assert_int_equal(d.would_replay, 2);
    assert_int_equal(s3.n, 2);
    PQfinish(a);
    assert_string_equal(q1("select count(*) from replay_log"), "0");
    assert_string_equal(q1("select count(*) from dead_letters where replayed_at is not null"), "0");
}

static void test_acknowledged_letter_is_recovered_not_resent(void **state)
{
    (void)state;
    dead_letter("r1", "ep_r", 2000000);
    dead_letter("r2", "ep_r", 1000000);
    exec_on(T.pg, "insert into replay_log (run_id, event_id, endpoint_id, dead_at, state,"
                  " acked_at) select 'crashed', event_id, endpoint_id, dead_at, 'acked', now()"
                  " from dead_letters where event_id = 'r1'");
    int64_t before = topic_records();
    struct worker w = {.ep = "ep_r"};
    worker_main(&w);
    assert_int_equal(w.rc, 0);
    assert_int_equal(w.res.recovered, 1);
    assert_int_equal(w.res.replayed, 1);
    assert_int_equal(topic_records() - before, 1);
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count, ','"
                           " order by event_id) from dead_letters"),
                        "r1:1,r2:1");
}

/* on_letter of the first batch: another run, started before this one's start-up recovery,
 * had Kafka acknowledge letter c2 and journalled it, then stopped before marking it. */
static void other_run_acked_c2(void *opaque, const struct sl_replay_letter *l)
{
    struct worker *w = opaque;
    w->letters++;
    if (w->letters == 1)
        exec_on(T.pg, "insert into replay_log (run_id, event_id, endpoint_id, dead_at, state,"
                      " acked_at) select 'other', event_id, endpoint_id, dead_at, 'acked', now()"
                      " from dead_letters where event_id = 'c2'");
    (void)l;
}

static void test_letter_acknowledged_by_a_run_interrupted_meanwhile_is_not_resent(void **state)
{
    (void)state;
    dead_letter("c1", "ep_c", 2000000);
    dead_letter("c2", "ep_c", 1000000);
    int64_t before = topic_records();
    PGconn *a = engine_conn(false), *b = engine_conn(false);
    struct worker w = {.ep = "ep_c"};
    struct sl_replay_sel sel = {.endpoint = "ep_c"};
    struct sl_replay_opts o = {.batch_size = 1,
                               .kafka_role = "test-replay",
                               .opaque = &w,
                               .on_letter = other_run_acked_c2};
    sl_err_t err;
    sl_err_clear(&err);
    struct sl_replay_result res;
    assert_int_equal(sl_replay_run(a, b, &T.cfg, &sel, &o, &res, &err), 0);
    PQfinish(a);
    PQfinish(b);
    assert_int_equal(res.replayed, 1);  /* c1 */
    assert_int_equal(res.recovered, 1); /* c2: marked, not sent */
    assert_int_equal(topic_records() - before, 1);
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count, ','"
                           " order by event_id) from dead_letters"),
                        "c1:1,c2:1");
    assert_string_equal(q1("select count(*) from replay_log where event_id = 'c2'"), "1");
}

/* A letter of an endpoint deleted since is not sent (the consumers would set it aside as for
 * an unknown endpoint, and the letter, marked replayed, would drop out of the unreplayed):
 * counted, left as it is, and replayed once the endpoint is registered again. */
static void test_a_deleted_endpoints_letters_wait_until_it_is_registered_again(void **state)
{
    (void)state;
    dead_letter("u1", "ep_gone", 2000000);
    dead_letter("u2", "ep_kept", 1000000);
    exec_on(T.pg, "delete from endpoints where id = 'ep_gone'");
    int64_t before = topic_records();
    PGconn *a = engine_conn(false), *b = engine_conn(false);
    struct sl_replay_sel sel = {.all = true};
    struct sl_replay_dry_result d;
    struct seen s = {.ordered = true};
    sl_err_t err;
    sl_err_clear(&err);
    assert_int_equal(sl_replay_dry_run(a, &sel, 0, count_candidate, &s, &d, &err), 0);
    assert_int_equal(d.would_replay, 1);
    assert_int_equal(d.unregistered, 1);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.first, "u2");
    struct sl_replay_opts o = {
        .batch_size = 10, .kafka_role = "test-replay", .actor = "sluicectl ops@host1"};
    struct sl_replay_result res;
    assert_int_equal(sl_replay_run(a, b, &T.cfg, &sel, &o, &res, &err), 0);
    assert_int_equal(res.replayed, 1);
    assert_int_equal(res.unregistered, 1);
    /* the journal says who */
    assert_string_equal(q1("select string_agg(event_id || ' ' || actor, ',') from replay_log"),
                        "u2 sluicectl ops@host1");
    assert_int_equal(topic_records() - before, 1);
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count, ','"
                           " order by event_id) from dead_letters"),
                        "u1:0,u2:1");
    assert_string_equal(q1("select count(*) from replay_log where event_id = 'u1'"), "0");
    exec_on(T.pg, "insert into endpoints (id, url) values ('ep_gone', 'https://x.test/')");
    assert_int_equal(sl_replay_run(a, b, &T.cfg, &sel, &o, &res, &err), 0);
    assert_int_equal(res.replayed, 1);
    assert_int_equal(res.unregistered, 0);
    assert_int_equal(topic_records() - before, 2);
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count, ','"
                           " order by event_id) from dead_letters"),
                        "u1:1,u2:1");
    PQfinish(a);
    PQfinish(b);
}

static atomic_bool stop_after_first;

/* on_letter of the first batch: a stop is asked for (Ctrl-C, SIGTERM) while it is sent. */
static void ask_stop(void *opaque, const struct sl_replay_letter *l)
{
    (void)opaque;
    (void)l;
    atomic_store(&stop_after_first, true);
}

static void test_a_stop_ends_the_run_after_the_batch_being_sent(void **state)
{
    (void)state;
    dead_letter("s1", "ep_s", 2000000);
    dead_letter("s2", "ep_s", 1000000);
    atomic_store(&stop_after_first, false);
    PGconn *a = engine_conn(false), *b = engine_conn(false);
    struct sl_replay_sel sel = {.endpoint = "ep_s"};
    struct sl_replay_opts o = {.batch_size = 1,
                               .kafka_role = "test-replay",
                               .on_letter = ask_stop,
                               .stop = &stop_after_first};
    sl_err_t err;
    sl_err_clear(&err);
    struct sl_replay_result res;
    assert_int_equal(sl_replay_run(a, b, &T.cfg, &sel, &o, &res, &err), SL_ESTATE);
    assert_non_null(strstr(err.msg, "stopped before its next batch"));
    assert_true(res.started);
    assert_int_equal(res.replayed, 1); /* the batch being sent was finished and marked */
    assert_string_equal(q1("select string_agg(event_id || ':' || replay_count, ','"
                           " order by event_id) from dead_letters"),
                        "s1:1,s2:0");
    /* idle, outside any transaction: the next run takes the rest */
    assert_int_equal(PQtransactionStatus(a), PQTRANS_IDLE);
    PQfinish(a);
    PQfinish(b);
}

static void test_malformed_selection_touches_nothing(void **state)
{
    (void)state;
    dead_letter("m1", "ep_m", 1000);
    const char *bad_ids[] = {"ok", "has.dot"};
    const struct sl_replay_sel bad[] = {
        {0},                                                   /* no selection */
        {.error_class = "HTTP"},                               /* bad class */
        {.endpoint = "bad id"},                                /* bad endpoint */
        {.event_ids = bad_ids, .n_event_ids = 2},              /* bad event id */
        {.all = true, .limit = -1},                            /* bad limit */
        {.has_since = true, .since_ms = 5, .has_until = true}, /* empty window */
    };
    PGconn *a = engine_conn(false), *b = engine_conn(false);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_err_t err;
        sl_err_clear(&err);
        assert_int_equal(sl_replay_sel_check(&bad[i], &err), SL_EINVAL);
        assert_true(err.msg[0] != '\0');
        struct sl_replay_opts o = {0};
        struct sl_replay_result res;
        assert_int_equal(sl_replay_run(a, b, &T.cfg, &bad[i], &o, &res, &err), SL_EINVAL);
        assert_false(res.started);
        struct sl_replay_dry_result d;
        assert_int_equal(sl_replay_dry_run(a, &bad[i], 0, NULL, NULL, &d, &err), SL_EINVAL);
    }
    /* one connection for both roles, or a batch size out of range */
    struct sl_replay_sel all = {.all = true};
    struct sl_replay_opts o = {0};
    struct sl_replay_result res;
    sl_err_t err;
    assert_int_equal(sl_replay_run(a, a, &T.cfg, &all, &o, &res, &err), SL_EINVAL);
    o.batch_size = SL_REPLAY_BATCH_MAX + 1;
    assert_int_equal(sl_replay_run(a, b, &T.cfg, &all, &o, &res, &err), SL_EINVAL);
    assert_false(res.started);
    PQfinish(a);
    PQfinish(b);
    assert_string_equal(q1("select count(*) from replay_log"), "0");
    assert_string_equal(q1("select count(*) from dead_letters where replayed_at is not null"), "0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_concurrent_runs_send_each_letter_once, empty),
        cmocka_unit_test_setup(test_dry_run_changes_nothing, empty),
        cmocka_unit_test_setup(test_a_deleted_endpoints_letters_wait_until_it_is_registered_again,
                               empty),
        cmocka_unit_test_setup(test_acknowledged_letter_is_recovered_not_resent, empty),
        cmocka_unit_test_setup(
            test_letter_acknowledged_by_a_run_interrupted_meanwhile_is_not_resent, empty),
        cmocka_unit_test_setup(test_a_stop_ends_the_run_after_the_batch_being_sent, empty),
        cmocka_unit_test_setup(test_malformed_selection_touches_nothing, empty),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
