/*
 * sluice-recorder on the real stack: real Kafka, real PostgreSQL (sql/ applied), the real
 * binary. Every test uses its own outcomes topic, recorder group and id prefix, so tests can
 * share a stack (and a database) with others.
 *
 *   lifecycles       delivered / retried / dead letters with env / duplicates / deferred /
 *                    quarantined / undecodable / out of order / expired: exact rows and contents;
 *                    the undecodable record moved to the quarantine topic with its reason, and
 *                    one PostgreSQL refuses (a check constraint) read again and moved there
 *   quarantine_refused  Kafka refuses the quarantine: exit 1, the record's offset uncommitted
 *   sigterm_while_a_lane_waits_for_a_lock  the shutdown bound cancels a blocked lane: exit 0
 *                    in time, the batch uncommitted
 *   duplicates       the same records produced again (plus one new): nothing changes but the new
 *   kill9            kill -9 mid-run and restart: exact counts, consecutive failures counted once
 *   rebalance        a second recorder joins the group mid-run, then the first leaves: exact
 *   pg_outage        PostgreSQL cut (a TCP proxy in this process) mid-run, more records, back:
 *                    everything exactly once; SIGTERM while cut exits 0 and loses nothing
 *   partitions       sluice_ensure_partitions / sluice_drop_old_partitions
 *   cli              --help, bad config exit 78
 *
 * Env: SLUICE_KAFKA_BROKERS, SLUICE_PG_DSN (tests/integration/run_private.sh test_recorder or
 * eval "$(scripts/stack.sh env)"); SL_TEST_TIMEOUT_MULT scales the waits.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "sl_test_kafka.h"
#include "sl_testenv.h"

#define RECORDER        SL_BINARY_DIR "/recorder/sluice-recorder"
#define PARTITIONS      4
#define TEST_MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

static const char *g_brokers;
static const char *g_dsn;
static PGconn *g_pg;
static rd_kafka_t *g_prod;
static int g_mult = 1;
static char g_tmpdir[128];

/* ==== small helpers ==== */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Unique, valid id prefix: letters, digits and '-' only (event-id and endpoint-id classes). */
static void make_prefix(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "rt%s%llx%x", tag, (unsigned long long)now_ms(), (unsigned)getpid());
}

/* One integer from a query (printf-formatted; only test-made ids go into it). */
static long long q1(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static long long q1(const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(g_pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        fprintf(stderr, "query failed: %s\n  %s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
    }
    long long v = PQgetisnull(r, 0, 0) ? -1 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* One text value (NULL -> ""), copied into out. */
static void qtext(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void qtext(char *out, size_t cap, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(g_pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        fprintf(stderr, "query failed: %s\n  %s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
    }
    snprintf(out, cap, "%s", PQgetisnull(r, 0, 0) ? "" : PQgetvalue(r, 0, 0));
    PQclear(r);
}

static void exec_sql(const char *sql)
{
    PGresult *r = PQexec(g_pg, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "statement failed: %s\n  %s\n", PQresultErrorMessage(r), sql);
        PQclear(r);
        fail();
    }
    PQclear(r);
}

/* ==== Kafka ==== */

static void topic_new(char *topic, size_t cap, const char *tag)
{
    char errstr[256];
    sl_test_topic_name(topic, cap, tag);
    if (sl_test_topic_create(g_brokers, topic, PARTITIONS, errstr, sizeof(errstr)) != 0) {
        fprintf(stderr, "cannot create topic %s: %s\n", topic, errstr);
        fail();
    }
}

static void topic_delete(const char *topic)
{
    char errstr[256];
    if (sl_test_topic_delete(g_brokers, topic, errstr, sizeof(errstr)) != 0)
        fprintf(stderr, "could not delete topic %s: %s\n", topic, errstr);
}

static void produce_raw(const char *topic, const char *key, const void *val, size_t len)
{
    void *k = (void *)(uintptr_t)key; /* RD_KAFKA_V_* take non-const pointers; F_COPY */
    void *v = (void *)(uintptr_t)val;
    rd_kafka_resp_err_t e = rd_kafka_producev(
        g_prod, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(k, key ? strlen(key) : 0),
        RD_KAFKA_V_VALUE(v, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    assert_int_equal(e, RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_poll(g_prod, 0);
}

static void produce_outcome(const char *topic, const struct sl_outcome *o)
{
    struct sl_buf b;
    sl_err_t err;
    sl_buf_init(&b, 4 << 20);
    if (sl_outcome_encode(o, &b, &err) != 0) {
        fprintf(stderr, "encode: %s\n", err.msg);
        fail();
    }
    produce_raw(topic, o->ep, b.data, b.len);
    sl_buf_fini(&b);
}

static void produce_flush(void)
{
    assert_int_equal(rd_kafka_flush(g_prod, 60000), RD_KAFKA_RESP_ERR_NO_ERROR);
}

/* Sum over partitions of (high watermark - committed offset of group): 0 = all consumed and
 * committed. */
static long long group_lag(const char *topic, const char *group)
{
    char errstr[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", g_brokers, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr))) {
        fprintf(stderr, "conf: %s\n", errstr);
        fail();
    }
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    assert_non_null(c);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int p = 0; p < PARTITIONS; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    long long lag = -1;
    if (rd_kafka_committed(c, l, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        lag = 0;
        for (int p = 0; p < PARTITIONS; p++) {
            int64_t lo = 0;
            int64_t hi = 0;
            if (rd_kafka_query_watermark_offsets(c, topic, p, &lo, &hi, 10000) !=
                RD_KAFKA_RESP_ERR_NO_ERROR) {
                lag = -1;
                break;
            }
            int64_t committed = l->elems[p].offset < 0 ? lo : l->elems[p].offset;
            lag += hi - committed;
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(c);
    return lag;
}

/* A header's value as text ("" when absent). */
static void header_text(rd_kafka_headers_t *h, const char *name, char *out, size_t cap)
{
    const void *v = NULL;
    size_t n = 0;
    out[0] = '\0';
    if (h && rd_kafka_header_get_last(h, name, &v, &n) == RD_KAFKA_RESP_ERR_NO_ERROR && v)
        (void)snprintf(out, cap, "%.*s", (int)n, (const char *)v);
}

/* A record read back from a topic: its value and its quarantine headers. */
struct qrec {
    char value[64];
    size_t len;
    char reason[256], src_topic[160], src_partition[16], src_offset[24];
};

/* Every record of topic (all PARTITIONS, from the start; at most max) into out. Returns the
 * count once every partition reached its end. */
static int read_topic(const char *topic, struct qrec *out, int max)
{
    char errstr[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", g_brokers, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "group.id", topic, errstr, sizeof(errstr)) || /* assign's */
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr))) {
        fprintf(stderr, "conf: %s\n", errstr);
        fail();
    }
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    assert_non_null(c);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int p = 0; p < PARTITIONS; p++)
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(c, l), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0, eof = 0;
    int64_t deadline = now_ms() + 30000 * g_mult;
    while (eof < PARTITIONS && now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eof++;
        } else if (!m->err && n < max) {
            struct qrec *q = &out[n++];
            q->len = m->len;
            (void)snprintf(q->value, sizeof(q->value), "%.*s", (int)m->len,
                           m->payload ? (const char *)m->payload : "");
            rd_kafka_headers_t *h = NULL;
            (void)rd_kafka_message_headers(m, &h);
            header_text(h, "sluice-reason", q->reason, sizeof(q->reason));
            header_text(h, "sluice-source-topic", q->src_topic, sizeof(q->src_topic));
            header_text(h, "sluice-source-partition", q->src_partition, sizeof(q->src_partition));
            header_text(h, "sluice-source-offset", q->src_offset, sizeof(q->src_offset));
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_destroy(c);
    assert_int_equal(eof, PARTITIONS);
    return n;
}

static void wait_consumed(const char *topic, const char *group, int timeout_s)
{
    int64_t deadline = now_ms() + (int64_t)timeout_s * 1000 * g_mult;
    long long lag = -1;
    while (now_ms() < deadline) {
        lag = group_lag(topic, group);
        if (lag == 0)
            return;
        sleep_ms(200);
    }
    fprintf(stderr, "group %s still has lag %lld on %s\n", group, lag, topic);
    fail();
}

/* ==== the recorder process ==== */

struct rec_proc {
    pid_t pid;     /* running recorder, 0 = none */
    char log[256]; /* its stderr (appended across restarts) */
};

/* Every recorder started and not yet reaped, so a failed test does not leave them running. */
#define MAX_LIVE 16
static pid_t g_live[MAX_LIVE];

static void live_add(pid_t pid)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live[i] == 0) {
            g_live[i] = pid;
            return;
        }
}

static void live_del(pid_t pid)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live[i] == pid)
            g_live[i] = 0;
}

#define PROXY_MAX 64

struct proxy {
    int lfd;           /* listening socket */
    int port;          /* its port */
    int up_port;       /* PostgreSQL's port */
    volatile int cut;  /* 1 = close every connection and refuse new ones */
    volatile int stop; /* 1 = thread exits */
    int a[PROXY_MAX];  /* client side fds, -1 = free */
    int b[PROXY_MAX];  /* upstream fds */
    pthread_t th;      /* the pump thread */
};

static struct proxy g_px;
static void proxy_stop(struct proxy *px);

/* Per-test teardown: kill what a failed test left behind. */
static int kill_leftovers(void **state)
{
    (void)state;
    for (int i = 0; i < MAX_LIVE; i++) {
        if (g_live[i] > 0) {
            fprintf(stderr, "killing leftover recorder %d\n", (int)g_live[i]);
            kill(g_live[i], SIGKILL);
            waitpid(g_live[i], NULL, 0);
            g_live[i] = 0;
        }
    }
    proxy_stop(&g_px);
    return 0;
}

static void rec_start(struct rec_proc *r,
                      const char *topic,
                      const char *group,
                      const char *dsn,
                      const char *const *extra_env)
{
    if (!r->log[0])
        snprintf(r->log, sizeof(r->log), "%s/%s.log", g_tmpdir, group);
    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        int fd = open(r->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
        }
        setenv("SLUICE_TOPIC_OUTCOMES", topic, 1);
        setenv("SLUICE_RECORDER_GROUP", group, 1);
        setenv("SLUICE_PG_DSN", dsn, 1);
        setenv("SLUICE_MASTER_KEY", TEST_MASTER_KEY, 1); /* signs the records of disables */
        setenv("SLUICE_RECORDER_FLUSH_MS", "100", 1);
        setenv("SLUICE_LOG_LEVEL", "debug", 1);
        setenv("SLUICE_DEBUG", "db", 1);
        for (size_t i = 0; extra_env && extra_env[i]; i += 2)
            setenv(extra_env[i], extra_env[i + 1], 1);
        execl(RECORDER, RECORDER, (char *)NULL);
        fprintf(stderr, "cannot exec %s: %s\n", RECORDER, strerror(errno));
        _exit(127);
    }
    live_add(r->pid);
}

/* Send sig and wait (bounded); returns the exit status (128+sig when killed by a signal). */
static int rec_stop(struct rec_proc *r, int sig)
{
    if (r->pid <= 0)
        return -1;
    kill(r->pid, sig);
    int st = 0;
    int64_t deadline = now_ms() + 60000 * g_mult;
    for (;;) {
        pid_t w = waitpid(r->pid, &st, WNOHANG);
        if (w == r->pid) {
            live_del(r->pid);
            break;
        }
        if (now_ms() > deadline) {
            fprintf(stderr, "recorder %d did not exit after signal %d\n", (int)r->pid, sig);
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &st, 0);
            live_del(r->pid);
            r->pid = 0;
            fail();
        }
        sleep_ms(50);
    }
    r->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool rec_alive(struct rec_proc *r)
{
    int st;
    return r->pid > 0 && waitpid(r->pid, &st, WNOHANG) == 0;
}

/* Occurrences of needle in the recorder's log. */
static int log_count(const struct rec_proc *r, const char *needle)
{
    FILE *f = fopen(r->log, "r");
    if (!f)
        return 0;
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, needle))
            n++;
    fclose(f);
    return n;
}

/* ==== 1. lifecycles ==== */

struct rec_expect {
    long long records; /* good outcome records produced (rows expected) */
    long long samples; /* endpoint_latency rows expected */
};

static void produce_counted(const char *topic, const struct sl_outcome *o, struct rec_expect *x)
{
    produce_outcome(topic, o);
    x->records++;
    if (o->http != 0 && o->lat_us != 0 &&
        (o->state == SL_OUTCOME_DELIVERED || o->state == SL_OUTCOME_RETRY_SCHEDULED ||
         o->state == SL_OUTCOME_DEAD_LETTER))
        x->samples++;
}

/* A real delivery record as a dead letter's env, with a marker that must never be logged. */
static void make_env(struct sl_buf *out, const char *id, const char *ep)
{
    static const char body[] = "{\"card\":\"SECRET-PAYLOAD-MARKER\"}";
    struct sl_delivery d = {.id = id,
                            .ep = ep,
                            .type = "order.paid",
                            .ts_ms = 1700000000000ULL,
                            .body = (const uint8_t *)body,
                            .body_len = sizeof(body) - 1};
    sl_err_t err;
    sl_buf_init(out, 1 << 16);
    assert_int_equal(sl_delivery_encode(&d, out, &err), 0);
}

static long long ms_of(const char *col, const char *table, const char *id, const char *ep)
{
    return q1("select (extract(epoch from %s) * 1000)::bigint from %s where event_id = '%s' "
              "and endpoint_id = '%s'",
              col, table, id, ep);
}

static void test_lifecycles(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], a[96], b[96], c[96], id[16][96];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "l");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(a, sizeof(a), "%s-a", p);
    snprintf(b, sizeof(b), "%s-b", p);
    snprintf(c, sizeof(c), "%s-c", p);
    for (int i = 0; i < 16; i++)
        snprintf(id[i], sizeof(id[i]), "%s-e%d", p, i);
    uint64_t T = (uint64_t)now_ms() - 60000;
    struct rec_expect x = {0, 0};
    struct sl_buf env3, env5;
    make_env(&env3, id[3], b);
    make_env(&env5, id[5], b);
#define OUT(...) ((struct sl_outcome){.type = "order.paid", .created_ms = T - 1000, __VA_ARGS__})
    /* e1: delivered at once */
    produce_counted(topic,
                    &OUT(.id = id[1], .ep = a, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 1, .lat_us = 1000, .pod = "pod-1"),
                    &x);
    /* e2: 503, timeout, delivered on attempt 3 */
    produce_counted(topic,
                    &OUT(.id = id[2], .ep = a, .attempt = 1, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .http = 503, .err = "http_5xx", .ts_ms = T + 2, .lat_us = 2000,
                         .next_ms = T + 100),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[2], .ep = a, .attempt = 2, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .err = "timeout", .ts_ms = T + 3, .lat_us = 15000000, .next_ms = T + 200),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[2], .ep = a, .attempt = 3, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 4, .lat_us = 3000),
                    &x);
    /* e3: 500, then dead (410) with env and a response body */
    produce_counted(topic,
                    &OUT(.id = id[3], .ep = b, .attempt = 1, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .http = 500, .err = "http_5xx", .ts_ms = T + 10, .lat_us = 4000,
                         .next_ms = T + 50),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[3], .ep = b, .attempt = 2, .state = SL_OUTCOME_DEAD_LETTER,
                         .http = 410, .err = "http_4xx", .msg = "gone-MSG-MARKER", .ts_ms = T + 11,
                         .lat_us = 5000, .env = env3.data, .env_len = env3.len,
                         .resp = (const uint8_t *)"nope", .resp_len = 4),
                    &x);
    /* e4: delivered, then a duplicate (must not change the state) */
    produce_counted(topic,
                    &OUT(.id = id[4], .ep = a, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 20, .lat_us = 6000),
                    &x);
    produce_counted(
        topic,
        &OUT(.id = id[4], .ep = a, .attempt = 0, .state = SL_OUTCOME_DUPLICATE, .ts_ms = T + 21),
        &x);
    /* e5: dead at once (400) */
    produce_counted(topic,
                    &OUT(.id = id[5], .ep = b, .attempt = 1, .state = SL_OUTCOME_DEAD_LETTER,
                         .http = 400, .err = "http_4xx", .ts_ms = T + 30, .lat_us = 7000,
                         .env = env5.data, .env_len = env5.len),
                    &x);
    /* e6: out of order: delivered (attempt 2) arrives before the older failure */
    produce_counted(topic,
                    &OUT(.id = id[6], .ep = a, .attempt = 2, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 41, .lat_us = 8000),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[6], .ep = a, .attempt = 1, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .http = 503, .err = "http_5xx", .ts_ms = T + 40, .lat_us = 9000,
                         .next_ms = T + 41),
                    &x);
    /* e7: out of order retries: the newer one must win */
    produce_counted(topic,
                    &OUT(.id = id[7], .ep = b, .attempt = 2, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .err = "connect", .ts_ms = T + 52, .next_ms = T + 500),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[7], .ep = b, .attempt = 1, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .err = "connect", .ts_ms = T + 51, .next_ms = T + 300),
                    &x);
    /* e8: delivered, then a later retry (a redelivery): delivered is final */
    produce_counted(topic,
                    &OUT(.id = id[8], .ep = a, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 60, .lat_us = 10000),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[8], .ep = a, .attempt = 2, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .http = 502, .err = "http_5xx", .ts_ms = T + 61, .lat_us = 11000,
                         .next_ms = T + 900),
                    &x);
    /* e9: deferred by the breaker (endpoint b's newest outcome) */
    produce_counted(topic,
                    &OUT(.id = id[9], .ep = b, .attempt = 0, .state = SL_OUTCOME_DEFERRED,
                         .err = "breaker_open", .ts_ms = T + 80, .next_ms = T + 1000),
                    &x);
    /* e11 (endpoint c): dead, then delivered after a replay: the dead letter is resolved */
    produce_counted(topic,
                    &OUT(.id = id[11], .ep = c, .attempt = 1, .state = SL_OUTCOME_DEAD_LETTER,
                         .http = 400, .err = "http_4xx", .ts_ms = T + 90, .lat_us = 100,
                         .env = env5.data, .env_len = env5.len),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[11], .ep = c, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 95, .lat_us = 100),
                    &x);
    /* e12 (endpoint c): the later delivery arrives before the death: born resolved */
    produce_counted(topic,
                    &OUT(.id = id[12], .ep = c, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 120, .lat_us = 100),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[12], .ep = c, .attempt = 1, .state = SL_OUTCOME_DEAD_LETTER,
                         .http = 400, .err = "http_4xx", .ts_ms = T + 110, .lat_us = 100,
                         .env = env5.data, .env_len = env5.len),
                    &x);
    /* e13 (endpoint c): a retry carrying the delivery record (kept in pending_payloads for a
     * schedule rebuild); an older deferral with another record does not replace it */
    produce_counted(topic,
                    &OUT(.id = id[13], .ep = c, .attempt = 1, .state = SL_OUTCOME_RETRY_SCHEDULED,
                         .http = 503, .err = "http_5xx", .ts_ms = T + 130, .lat_us = 100,
                         .next_ms = T + 5000, .env = env3.data, .env_len = env3.len),
                    &x);
    produce_counted(topic,
                    &OUT(.id = id[13], .ep = c, .attempt = 0, .state = SL_OUTCOME_DEFERRED,
                         .err = "rate_limited", .ts_ms = T + 125, .next_ms = T + 4000,
                         .env = env5.data, .env_len = env5.len),
                    &x);
    /* quarantined without id / endpoint / type / created */
    struct sl_outcome q = {
        .attempt = 0, .state = SL_OUTCOME_QUARANTINED, .err = "decode", .ts_ms = T + 70};
    produce_counted(topic, &q, &x);
    /* undecodable: skipped and counted, its offset still committed */
    produce_raw(topic, a, "\x01\x02not msgpack", 14);
    /* sound, but refused by PostgreSQL (a check constraint made for this record): its row is
     * left out, the rest of its batch is written, and the record goes to the quarantine topic
     * with PostgreSQL's reason */
    char rejected[112], sql[512];
    snprintf(rejected, sizeof(rejected), "%s-refused", p);
    snprintf(sql, sizeof(sql),
             "alter table deliveries add constraint \"%s_refused\" check (event_id <> '%s') "
             "not valid",
             p, rejected);
    exec_sql(sql);
    produce_outcome(topic,
                    &OUT(.id = rejected, .ep = a, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                         .http = 200, .ts_ms = T + 71, .lat_us = 1000));
    /* expired on arrival: older than history_retention_d (14 days): not recorded */
    produce_outcome(topic, &OUT(.id = id[10], .ep = a, .attempt = 1, .state = SL_OUTCOME_DELIVERED,
                                .http = 200, .ts_ms = T - 20ULL * 86400000ULL, .lat_us = 1000));
#undef OUT
    produce_flush();

    struct rec_proc r = {0};
    char qtopic[160];
    topic_new(qtopic, sizeof(qtopic), "rt.quarantine");
    const char *qenv[] = {"SLUICE_TOPIC_QUARANTINE", qtopic, NULL};
    rec_start(&r, topic, group, g_dsn, qenv);
    wait_consumed(topic, group, 60);
    /* the undecodable record went to the quarantine topic, bytes unchanged, with its reason
     * and origin, before its offset was committed */
    snprintf(sql, sizeof(sql), "alter table deliveries drop constraint \"%s_refused\"", p);
    exec_sql(sql);
    struct qrec qr[4];
    assert_int_equal(read_topic(qtopic, qr, 4), 2);
    int bad = qr[0].len == 14 ? 0 : 1; /* partitions may interleave them */
    assert_int_equal(qr[bad].len, 14);
    assert_string_equal(qr[bad].value, "\x01\x02not msgpack");
    assert_true(qr[bad].reason[0] != '\0');
    assert_string_equal(qr[bad].src_topic, topic);
    assert_true(qr[bad].src_partition[0] != '\0' && qr[bad].src_offset[0] != '\0');
    const struct qrec *rq = &qr[1 - bad];
    assert_true(strncmp(rq->reason, "rejected by postgresql: ", 24) == 0);
    assert_non_null(strstr(rq->reason, " 23514 ")); /* check_violation */
    assert_string_equal(rq->src_topic, topic);
    assert_true(rq->src_partition[0] != '\0' && rq->src_offset[0] != '\0');
    assert_true(rq->len > 20); /* the record's bytes, not an empty copy */
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id = '%s'", rejected),
                     0);
    assert_true(log_count(&r, "\"event\":\"outcome_rejected_by_db\"") == 1);
    /* every row is committed before the offsets are: no waiting needed beyond this point */
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p),
                     x.records - 1 /* quarantined row has a synthetic id */);
    assert_int_equal(q1("select count(*) from delivery_attempts where endpoint_id = '' and "
                        "ts = to_timestamp(%llu / 1000.0) and state = 'quarantined' and "
                        "event_id like 'q\\_%%'",
                        (unsigned long long)(T + 70)),
                     1);
    assert_int_equal(q1("select count(*) from deliveries where endpoint_id in ('%s', '%s')", a, b),
                     9);
    assert_int_equal(q1("select count(*) from endpoint_latency where endpoint_id in ('%s', '%s', "
                        "'%s')",
                        a, b, c),
                     x.samples);
    assert_int_equal(q1("select count(*) from deliveries where event_id = '%s'", id[10]), 0);

    char s[512];
    /* e1 */
    qtext(s, sizeof(s),
          "select state || ' ' || attempts || ' ' || last_status from deliveries "
          "where event_id = '%s'",
          id[1]);
    assert_string_equal(s, "delivered 1 200");
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id = '%s' and "
                        "pod = 'pod-1' and latency_us = 1000 and http_status = 200 and "
                        "created_at = to_timestamp(%llu / 1000.0)",
                        id[1], (unsigned long long)(T - 1000)),
                     1);
    /* e2 */
    qtext(s, sizeof(s),
          "select state || ' ' || attempts || ' ' || coalesce(last_error, '-') || ' '"
          " || (next_attempt_at is null) from deliveries where event_id = '%s'",
          id[2]);
    assert_string_equal(s, "delivered 3 - true");
    assert_int_equal(ms_of("delivered_at", "deliveries", id[2], a), (long long)(T + 4));
    assert_int_equal(ms_of("first_failed_at", "deliveries", id[2], a), (long long)(T + 2));
    assert_int_equal(ms_of("first_seen", "deliveries", id[2], a), (long long)(T + 2));
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id = '%s' and "
                        "http_status is null and err = 'timeout'",
                        id[2]),
                     1);
    /* e3: dead letter with its payload, response, first failure */
    qtext(s, sizeof(s),
          "select state || ' ' || attempts || ' ' || last_status || ' ' || "
          "last_error from deliveries where event_id = '%s'",
          id[3]);
    assert_string_equal(s, "dead_letter 2 410 http_4xx");
    qtext(s, sizeof(s),
          "select error_class || ' ' || last_status || ' ' || attempts || ' ' || "
          "last_msg || ' ' || encode(last_response, 'escape') || ' ' || "
          "(replayed_at is null) || ' ' || replay_count from dead_letters "
          "where event_id = '%s' and endpoint_id = '%s'",
          id[3], b);
    assert_string_equal(s, "http_4xx 410 2 gone-MSG-MARKER nope true 0");
    assert_int_equal(ms_of("first_failed_at", "dead_letters", id[3], b), (long long)(T + 10));
    assert_int_equal(ms_of("dead_at", "dead_letters", id[3], b), (long long)(T + 11));
    char hex[8192];
    qtext(hex, sizeof(hex), "select encode(payload, 'hex') from dead_letters where event_id = '%s'",
          id[3]);
    assert_int_equal(strlen(hex), env3.len * 2);
    for (size_t i = 0; i < env3.len; i++) {
        char two[3];
        snprintf(two, sizeof(two), "%02x", env3.data[i]);
        assert_memory_equal(hex + 2 * i, two, 2);
    }
    /* e4: the duplicate did not undo the delivery */
    qtext(s, sizeof(s), "select state || ' ' || attempts from deliveries where event_id = '%s'",
          id[4]);
    assert_string_equal(s, "delivered 1");
    /* e5 */
    qtext(s, sizeof(s),
          "select last_status || ' ' || attempts || ' ' || octet_length(payload) "
          "from dead_letters where event_id = '%s'",
          id[5]);
    char want[64];
    snprintf(want, sizeof(want), "400 1 %zu", env5.len);
    assert_string_equal(s, want);
    assert_int_equal(ms_of("first_failed_at", "dead_letters", id[5], b), (long long)(T + 30));
    assert_int_equal(
        q1("select count(*) from dead_letters where endpoint_id in ('%s', '%s')", a, b), 2);
    /* e6: a late older failure does not move the delivery back */
    qtext(s, sizeof(s), "select state || ' ' || attempts from deliveries where event_id = '%s'",
          id[6]);
    assert_string_equal(s, "delivered 2");
    assert_int_equal(ms_of("last_update", "deliveries", id[6], a), (long long)(T + 41));
    assert_int_equal(ms_of("first_failed_at", "deliveries", id[6], a), (long long)(T + 40));
    /* e7: the newer retry wins, whatever the arrival order */
    qtext(s, sizeof(s), "select state || ' ' || attempts from deliveries where event_id = '%s'",
          id[7]);
    assert_string_equal(s, "retry_scheduled 2");
    assert_int_equal(ms_of("last_update", "deliveries", id[7], b), (long long)(T + 52));
    assert_int_equal(ms_of("next_attempt_at", "deliveries", id[7], b), (long long)(T + 500));
    /* e8: delivered is final */
    qtext(s, sizeof(s),
          "select state || ' ' || attempts || ' ' || last_status from deliveries "
          "where event_id = '%s'",
          id[8]);
    assert_string_equal(s, "delivered 2 200");
    assert_int_equal(ms_of("last_update", "deliveries", id[8], a), (long long)(T + 60));
    /* e9 */
    qtext(s, sizeof(s), "select state || ' ' || last_error from deliveries where event_id = '%s'",
          id[9]);
    assert_string_equal(s, "deferred breaker_open");
    assert_int_equal(ms_of("next_attempt_at", "deliveries", id[9], b), (long long)(T + 1000));
    /* endpoint health: a's last success T+60 then one failure; b never succeeded: 5 failures,
     * newest outcome is the breaker deferral */
    qtext(s, sizeof(s),
          "select consecutive_failures || ' ' || last_outcome_state || ' ' || "
          "(extract(epoch from last_success_at) * 1000)::bigint from "
          "endpoint_health where endpoint_id = '%s'",
          a);
    snprintf(want, sizeof(want), "1 retry_scheduled %llu", (unsigned long long)(T + 60));
    assert_string_equal(s, want);
    qtext(s, sizeof(s),
          "select consecutive_failures || ' ' || breaker_state || ' ' || "
          "last_outcome_state || ' ' || (last_success_at is null) from "
          "endpoint_health where endpoint_id = '%s'",
          b);
    assert_string_equal(s, "5 open deferred true");
    /* the open retry's delivery record */
    qtext(s, sizeof(s),
          "select attempt || ' ' || octet_length(payload) || ' ' || "
          "(extract(epoch from ts) * 1000)::bigint from pending_payloads "
          "where event_id = '%s' and endpoint_id = '%s'",
          id[13], c);
    snprintf(want, sizeof(want), "1 %zu %llu", env3.len, (unsigned long long)(T + 130));
    assert_string_equal(s, want);
    /* resolution of dead letters by a later delivery, in and out of order */
    assert_int_equal(ms_of("resolved_at", "dead_letters", id[11], c), (long long)(T + 95));
    assert_int_equal(ms_of("resolved_at", "dead_letters", id[12], c), (long long)(T + 120));
    assert_int_equal(ms_of("resolved_at", "dead_letters", id[3], b), -1);
    qtext(s, sizeof(s), "select state from deliveries where event_id = '%s'", id[11]);
    assert_string_equal(s, "delivered");

    /* An operator replays e5, which dies again: the newer death clears replayed_at (replay_count
     * stays); an older copy of e3's death changes nothing. */
    snprintf(sql, sizeof(sql),
             "update dead_letters set replayed_at = now(), replay_count = 1 "
             "where event_id = '%s'",
             id[5]);
    exec_sql(sql);
#define OUT2(...) ((struct sl_outcome){.type = "order.paid", .created_ms = T - 1000, __VA_ARGS__})
    produce_counted(topic,
                    &OUT2(.id = id[5], .ep = b, .attempt = 1, .state = SL_OUTCOME_DEAD_LETTER,
                          .http = 429, .err = "http_4xx", .ts_ms = T + 200, .lat_us = 100),
                    &x);
    produce_counted(topic,
                    &OUT2(.id = id[3], .ep = b, .attempt = 1, .state = SL_OUTCOME_DEAD_LETTER,
                          .http = 404, .err = "http_4xx", .ts_ms = T + 5, .lat_us = 100),
                    &x);
#undef OUT2
    produce_flush();
    wait_consumed(topic, group, 60);
    qtext(s, sizeof(s),
          "select last_status || ' ' || (replayed_at is null) || ' ' || replay_count"
          " || ' ' || octet_length(payload) from dead_letters where event_id = '%s'",
          id[5]);
    snprintf(want, sizeof(want), "429 true 1 %zu", env5.len); /* payload kept: no env this time */
    assert_string_equal(s, want);
    assert_int_equal(ms_of("dead_at", "dead_letters", id[5], b), (long long)(T + 200));
    assert_int_equal(ms_of("first_failed_at", "dead_letters", id[5], b), (long long)(T + 30));
    qtext(s, sizeof(s),
          "select last_status || ' ' || attempts from dead_letters where "
          "event_id = '%s'",
          id[3]);
    assert_string_equal(s, "410 2");
    assert_int_equal(ms_of("dead_at", "dead_letters", id[3], b), (long long)(T + 11));

    assert_int_equal(rec_stop(&r, SIGTERM), 0);
    /* logged: the skipped record with its coordinates; never: payloads, messages */
    assert_true(log_count(&r, "\"event\":\"bad_outcome\"") == 1);
    assert_true(log_count(&r, "\"partition\":") >= 1);
    assert_int_equal(log_count(&r, "SECRET-PAYLOAD-MARKER"), 0);
    assert_int_equal(log_count(&r, "MSG-MARKER"), 0);
    char totals[96]; /* final totals: good + undecodable + expired + refused records consumed */
    snprintf(totals, sizeof(totals), "\"records\":%lld,\"bad\":1,\"rejected\":1", x.records + 3);
    assert_int_equal(log_count(&r, totals), 1);
    assert_int_equal(log_count(&r, "\"event\":\"quarantine_failed\""), 0);
    sl_buf_fini(&env3);
    sl_buf_fini(&env5);
    topic_delete(topic);
    topic_delete(qtopic);
}

/* Kafka refuses the quarantine (its topic does not exist): the recorder stops on its own,
 * exit 1, naming why, and leaves the bad record's offset uncommitted for the next start. */
static void test_quarantine_refused(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], missing[200];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "qr");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(missing, sizeof(missing), "%s.no-such-quarantine", topic);
    produce_raw(topic, "ep", "\x01\x02not msgpack", 14);
    produce_flush();
    struct rec_proc r = {0};
    const char *qenv[] = {"SLUICE_TOPIC_QUARANTINE", missing, NULL};
    rec_start(&r, topic, group, g_dsn, qenv);
    int st = 0;
    int64_t deadline = now_ms() + 90000 * g_mult;
    pid_t w = 0;
    while (w != r.pid && now_ms() < deadline) {
        w = waitpid(r.pid, &st, WNOHANG);
        if (w != r.pid)
            sleep_ms(100);
    }
    assert_int_equal(w, r.pid);
    live_del(r.pid);
    r.pid = 0;
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_true(log_count(&r, "\"event\":\"quarantine_failed\"") >= 1);
    assert_int_equal(log_count(&r, "\"event\":\"stopped_on_error\""), 1);
    assert_int_equal(group_lag(topic, group), 1); /* not committed: read again next time */
    topic_delete(topic);
}

/* SIGTERM while a write lane waits for a row lock (a replay holds the dead letter): the
 * shutdown bound cancels the lane's statement, the recorder exits 0 within
 * shutdown_timeout_ms, and the batch stays uncommitted for the next start. Before, the lane
 * waited out lock_timeout (30 s) past the bound. */
static void test_sigterm_while_a_lane_waits_for_a_lock(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], ep[96], id[96], sql[512];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "lk");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(ep, sizeof(ep), "%s-ep", p);
    snprintf(id, sizeof(id), "%s-e1", p);
    snprintf(sql, sizeof(sql),
             "insert into dead_letters (event_id, endpoint_id, error_class, attempts,"
             " first_failed_at, dead_at) values ('%s', '%s', 'http_5xx', 1, now(), now())",
             id, ep);
    exec_sql(sql);
    PGconn *holder = PQconnectdb(g_dsn);
    assert_int_equal(PQstatus(holder), CONNECTION_OK);
    PQclear(PQexec(holder, "begin"));
    snprintf(sql, sizeof(sql),
             "select 1 from dead_letters where event_id = '%s' and endpoint_id = '%s' for update",
             id, ep);
    PGresult *res = PQexec(holder, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    PQclear(res);
    uint64_t T = (uint64_t)now_ms() - 60000;
    produce_outcome(topic, &(struct sl_outcome){.id = id,
                                                .ep = ep,
                                                .type = "order.paid",
                                                .created_ms = T,
                                                .attempt = 2,
                                                .state = SL_OUTCOME_DEAD_LETTER,
                                                .http = 500,
                                                .err = "http_5xx",
                                                .ts_ms = T + 10,
                                                .lat_us = 100});
    produce_flush();
    struct rec_proc r = {0};
    const char *env[] = {"SLUICE_SHUTDOWN_DRAIN_MS", "1000", "SLUICE_SHUTDOWN_TIMEOUT_MS", "6000",
                         NULL};
    rec_start(&r, topic, group, g_dsn, env);
    /* the lane's upsert of that dead letter waits for the holder's lock */
    int64_t deadline = now_ms() + 60000 * g_mult;
    while (q1("select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
              " and query like '%%dead_letters%%'") < 1) {
        assert_true(now_ms() < deadline);
        sleep_ms(100);
    }
    int64_t t0 = now_ms();
    assert_int_equal(rec_stop(&r, SIGTERM), 0);
    int64_t took = now_ms() - t0;
    assert_true(took < 6000 + 2000);
    assert_int_equal(log_count(&r, "\"event\":\"write_cancelled\""), 1);
    assert_int_equal(log_count(&r, "\"event\":\"batch_not_written\""), 1);
    PQclear(PQexec(holder, "rollback"));
    PQfinish(holder);
    assert_int_equal(group_lag(topic, group), 1); /* not committed: read again next time */
    topic_delete(topic);
}

/* A row bound for the DEFAULT partition while maintenance attaches the partition that owns
 * its day waits for the lock, then fails the default's constraint (SQLSTATE 23514) though
 * nothing is wrong with it: it is written (tried again), not quarantined. */
static void test_row_racing_a_partition_attach(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], ep[96], id[96], sql[512];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "pa");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(ep, sizeof(ep), "%s-ep", p);
    snprintf(id, sizeof(id), "%s-e1", p);
    /* a day without a partition of its own: 9 days ago (inside the 30-day retention) */
    uint64_t day = ((uint64_t)now_ms() / 86400000 - 9) * 86400000;
    /* made by an earlier run of this test on the same database: gone again */
    snprintf(sql, sizeof(sql),
             "do $$ begin execute format('drop table if exists %%I', 'delivery_attempts_p' || "
             "to_char(to_timestamp(%llu) at time zone 'UTC', 'YYYYMMDD')); end $$",
             (unsigned long long)(day / 1000));
    exec_sql(sql);
    PGconn *holder = PQconnectdb(g_dsn);
    assert_int_equal(PQstatus(holder), CONNECTION_OK);
    PQclear(PQexec(holder, "begin"));
    snprintf(sql, sizeof(sql),
             "select sluice_partition_add('delivery_attempts', to_timestamp(%llu), "
             "to_timestamp(%llu), to_char(to_timestamp(%llu) at time zone 'UTC', 'YYYYMMDD'))",
             (unsigned long long)(day / 1000), (unsigned long long)(day / 1000 + 86400),
             (unsigned long long)(day / 1000));
    PGresult *res = PQexec(holder, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    PQclear(res);
    uint64_t T = day + 3600000;
    produce_outcome(topic, &(struct sl_outcome){.id = id,
                                                .ep = ep,
                                                .type = "order.paid",
                                                .created_ms = T,
                                                .attempt = 1,
                                                .state = SL_OUTCOME_DELIVERED,
                                                .http = 200,
                                                .ts_ms = T + 10,
                                                .lat_us = 100});
    produce_flush();
    struct rec_proc r = {0};
    rec_start(&r, topic, group, g_dsn, NULL);
    /* the lane's insert waits for the holder's lock on the default partition */
    int64_t deadline = now_ms() + 60000 * g_mult;
    while (q1("select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
              " and query like '%%delivery_attempts%%'") < 1) {
        assert_true(now_ms() < deadline);
        sleep_ms(100);
    }
    PQclear(PQexec(holder, "commit"));
    PQfinish(holder);
    snprintf(sql, sizeof(sql), "select count(*) from delivery_attempts where event_id = '%s'", id);
    while (q1("%s", sql) < 1) {
        assert_true(now_ms() < deadline);
        sleep_ms(100);
    }
    assert_int_equal(rec_stop(&r, SIGTERM), 0);
    assert_int_equal(log_count(&r, "\"event\":\"outcome_rejected_by_db\""), 0);
    snprintf(sql, sizeof(sql),
             "select count(*) from delivery_attempts_default where event_id = '%s'", id);
    assert_int_equal(q1("%s", sql), 0);
    topic_delete(topic);
}

/* ==== 2. duplicates on the topic ==== */

static void test_duplicates(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], ep[96], id[96];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "d");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(ep, sizeof(ep), "%s-ep", p);
    uint64_t T = (uint64_t)now_ms() - 30000;
    const int n = 300;
    struct rec_expect x = {0, 0};
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++) {
            snprintf(id, sizeof(id), "%s-%d", p, i);
            struct sl_outcome f = {.id = id,
                                   .ep = ep,
                                   .type = "t",
                                   .created_ms = T,
                                   .attempt = 1,
                                   .state = SL_OUTCOME_RETRY_SCHEDULED,
                                   .http = 500,
                                   .err = "http_5xx",
                                   .ts_ms = T + (uint64_t)i,
                                   .lat_us = 100,
                                   .next_ms = T + 100000};
            struct sl_outcome d = f;
            d.attempt = 2, d.state = SL_OUTCOME_DELIVERED, d.http = 200, d.err = NULL;
            d.next_ms = 0, d.ts_ms = T + 10000 + (uint64_t)i;
            if (round == 0) {
                produce_counted(topic, &f, &x);
                produce_counted(topic, &d, &x);
            } else {
                produce_outcome(topic, &f); /* byte-identical copies */
                produce_outcome(topic, &d);
            }
        }
        produce_flush();
        struct rec_proc r = {0};
        if (round == 1) {
            /* one new record among the copies: recorded, once */
            snprintf(id, sizeof(id), "%s-new", p);
            produce_counted(topic,
                            &(struct sl_outcome){.id = id,
                                                 .ep = ep,
                                                 .type = "t",
                                                 .created_ms = T,
                                                 .attempt = 1,
                                                 .state = SL_OUTCOME_DELIVERED,
                                                 .http = 200,
                                                 .ts_ms = T + 50000,
                                                 .lat_us = 100},
                            &x);
            produce_flush();
        }
        rec_start(&r, topic, group, g_dsn, NULL);
        wait_consumed(topic, group, 60);
        assert_int_equal(rec_stop(&r, SIGTERM), 0);
        assert_int_equal(q1("select count(*) from delivery_attempts where endpoint_id = '%s'", ep),
                         x.records);
        assert_int_equal(q1("select count(*) from endpoint_latency where endpoint_id = '%s'", ep),
                         x.samples);
        assert_int_equal(q1("select count(*) from deliveries where endpoint_id = '%s' and "
                            "state = 'delivered'",
                            ep),
                         round == 0 ? n : n + 1);
        assert_int_equal(q1("select consecutive_failures from endpoint_health where "
                            "endpoint_id = '%s'",
                            ep),
                         0);
        if (round == 1)
            assert_true(log_count(&r, "batch_has_duplicates") >= 1);
    }
    topic_delete(topic);
}

/* ==== 3. kill -9 mid-run ==== */

static void test_kill9(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], ep[96], bad_ep[96], id[96];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "k");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(bad_ep, sizeof(bad_ep), "%s-failing", p);
    uint64_t T = (uint64_t)now_ms() - 600000;
    const int events = 30000;
    const int failures = 6000;
    struct rec_expect x = {0, 0};
    long long dead = 0;
    for (int i = 0; i < events; i++) {
        snprintf(id, sizeof(id), "%s-%d", p, i);
        snprintf(ep, sizeof(ep), "%s-ep%d", p, i % 50);
        struct sl_outcome o = {.id = id,
                               .ep = ep,
                               .type = "t",
                               .created_ms = T,
                               .attempt = 1,
                               .state = SL_OUTCOME_DELIVERED,
                               .http = 200,
                               .ts_ms = T + (uint64_t)i,
                               .lat_us = 1000 + (uint64_t)i};
        if (i % 10 == 0) {
            o.state = SL_OUTCOME_DEAD_LETTER, o.http = 404, o.err = "http_4xx";
            o.env = (const uint8_t *)"env", o.env_len = 3;
            dead++;
        }
        produce_counted(topic, &o, &x);
    }
    /* one endpoint that only fails: its consecutive_failures must come out exactly */
    for (int i = 0; i < failures; i++) {
        snprintf(id, sizeof(id), "%s-f%d", p, i);
        produce_counted(topic,
                        &(struct sl_outcome){.id = id,
                                             .ep = bad_ep,
                                             .type = "t",
                                             .created_ms = T,
                                             .attempt = 1,
                                             .state = SL_OUTCOME_RETRY_SCHEDULED,
                                             .http = 503,
                                             .err = "http_5xx",
                                             .ts_ms = T + (uint64_t)i,
                                             .lat_us = 500,
                                             .next_ms = T + 1000000},
                        &x);
    }
    produce_flush();
    const char *small[] = {"SLUICE_RECORDER_BATCH", "300", NULL};
    struct rec_proc r = {0};
    rec_start(&r, topic, group, g_dsn, small);
    /* kill in the middle: some rows written, not all */
    int64_t deadline = now_ms() + 60000 * g_mult;
    long long seen = 0;
    while (now_ms() < deadline) {
        seen = q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p);
        if (seen >= x.records / 5)
            break;
        sleep_ms(20);
    }
    assert_int_equal(rec_stop(&r, SIGKILL), 128 + SIGKILL);
    seen = q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p);
    fprintf(stderr, "killed with %lld of %lld rows written\n", seen, x.records);
    assert_true(seen > 0 && seen < x.records);
    rec_start(&r, topic, group, g_dsn, small);
    wait_consumed(topic, group, 240);
    assert_int_equal(rec_stop(&r, SIGTERM), 0);
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p),
                     x.records);
    assert_int_equal(q1("select count(*) from endpoint_latency where event_id like '%s-%%'", p),
                     x.samples);
    assert_int_equal(q1("select count(*) from deliveries where event_id like '%s-%%'", p),
                     events + failures);
    assert_int_equal(q1("select count(*) from dead_letters where event_id like '%s-%%'", p), dead);
    assert_int_equal(
        q1("select consecutive_failures from endpoint_health where endpoint_id = '%s'", bad_ep),
        failures);
    /* endpoints 0, 10, 20, 30, 40 only ever had dead letters: 600 failures each, once */
    assert_int_equal(q1("select sum(consecutive_failures) from endpoint_health where endpoint_id "
                        "like '%s-ep%%'",
                        p),
                     dead);
    topic_delete(topic);
}

/* ==== 3b. rebalance: a second recorder joins, then the first leaves ==== */

static void produce_rebalance_part(
    const char *topic, const char *p, int from, int to, uint64_t T, struct rec_expect *x)
{
    char id[96], ep[96];
    for (int i = from; i < to; i++) {
        snprintf(id, sizeof(id), "%s-%d", p, i);
        snprintf(ep, sizeof(ep), "%s-ep%d", p, i % 40);
        /* endpoints 0..9 only fail: each failure must be counted exactly once, whoever
         * records it */
        bool failing = i % 40 < 10;
        produce_counted(topic,
                        &(struct sl_outcome){.id = id,
                                             .ep = ep,
                                             .type = "t",
                                             .created_ms = T,
                                             .attempt = 1,
                                             .state = failing ? SL_OUTCOME_RETRY_SCHEDULED
                                                              : SL_OUTCOME_DELIVERED,
                                             .http = failing ? 503 : 200,
                                             .err = failing ? "http_5xx" : NULL,
                                             .next_ms = failing ? T + 9000000 : 0,
                                             .ts_ms = T + (uint64_t)i,
                                             .lat_us = 900},
                        x);
    }
    produce_flush();
}

static void test_rebalance(void **state)
{
    (void)state;
    char topic[160], group[96], p[64];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "r");
    snprintf(group, sizeof(group), "%s-grp", p);
    uint64_t T = (uint64_t)now_ms() - 600000;
    const int first = 4000;
    const int events = 40000;
    struct rec_expect x = {0, 0};
    produce_rebalance_part(topic, p, 0, first, T, &x);
    /* The first recorder would hold its batch for 60 s: only the revoke can write it sooner. */
    const char *holding[] = {"SLUICE_RECORDER_BATCH", "1000000", "SLUICE_RECORDER_FLUSH_MS",
                             "60000", NULL};
    const char *small[] = {"SLUICE_RECORDER_BATCH", "500", NULL};
    struct rec_proc r1 = {0};
    struct rec_proc r2 = {0};
    rec_start(&r1, topic, group, g_dsn, holding);
    int64_t deadline = now_ms() + 30000 * g_mult;
    while (now_ms() < deadline && log_count(&r1, "\"event\":\"partitions_assigned\"") == 0)
        sleep_ms(50);
    sleep_ms(2000); /* let it read the records into its batch */
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p),
                     0);
    snprintf(r2.log, sizeof(r2.log), "%s/%s-second.log", g_tmpdir, group);
    rec_start(&r2, topic, group, g_dsn, small);
    int64_t t0 = now_ms();
    deadline = t0 + 40000 * g_mult;
    while (now_ms() < deadline &&
           q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p) < first)
        sleep_ms(50);
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p),
                     first);
    assert_int_equal(log_count(&r1, "\"event\":\"batch_flushed_on_revoke\""), 1);

    /* Both share the rest; the first leaves mid-way (its shutdown writes what it holds). */
    produce_rebalance_part(topic, p, first, events, T, &x);
    deadline = now_ms() + 60000 * g_mult;
    while (now_ms() < deadline &&
           q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p) <
               x.records / 2)
        sleep_ms(20);
    assert_int_equal(rec_stop(&r1, SIGTERM), 0);
    wait_consumed(topic, group, 240);
    assert_int_equal(rec_stop(&r2, SIGTERM), 0);
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p),
                     x.records);
    assert_int_equal(q1("select count(*) from endpoint_latency where event_id like '%s-%%'", p),
                     x.samples);
    assert_int_equal(q1("select count(*) from deliveries where event_id like '%s-%%'", p), events);
    assert_int_equal(q1("select sum(consecutive_failures) from endpoint_health where endpoint_id "
                        "like '%s-ep%%'",
                        p),
                     events / 4);
    topic_delete(topic);
}

/* ==== 4. PostgreSQL outage through a cuttable TCP proxy ==== */

static void proxy_close_pair(struct proxy *px, int i)
{
    close(px->a[i]);
    close(px->b[i]);
    px->a[i] = px->b[i] = -1;
}

static int pump(int from, int to)
{
    char buf[65536];
    ssize_t n = read(from, buf, sizeof(buf));
    if (n <= 0)
        return -1;
    for (ssize_t off = 0; off < n;) {
        ssize_t w = write(to, buf + off, (size_t)(n - off));
        if (w <= 0)
            return -1;
        off += w;
    }
    return 0;
}

static void *proxy_main(void *arg)
{
    struct proxy *px = arg;
    while (!px->stop) {
        if (px->cut) {
            for (int i = 0; i < PROXY_MAX; i++)
                if (px->a[i] >= 0)
                    proxy_close_pair(px, i);
        }
        struct pollfd fds[1 + 2 * PROXY_MAX];
        int map[1 + 2 * PROXY_MAX];
        int n = 0;
        fds[n].fd = px->lfd, fds[n].events = POLLIN, map[n++] = -1;
        for (int i = 0; i < PROXY_MAX; i++) {
            if (px->a[i] < 0)
                continue;
            fds[n].fd = px->a[i], fds[n].events = POLLIN, map[n++] = i;
            fds[n].fd = px->b[i], fds[n].events = POLLIN, map[n++] = PROXY_MAX + i;
        }
        if (poll(fds, (nfds_t)n, 50) <= 0)
            continue;
        if (fds[0].revents & POLLIN) {
            int c = accept(px->lfd, NULL, NULL);
            if (c >= 0) {
                int u = -1;
                if (!px->cut) {
                    u = socket(AF_INET, SOCK_STREAM, 0);
                    struct sockaddr_in sa = {.sin_family = AF_INET,
                                             .sin_port = htons((uint16_t)px->up_port),
                                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                    if (u >= 0 && connect(u, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
                        close(u);
                        u = -1;
                    }
                }
                int slot = -1;
                for (int i = 0; i < PROXY_MAX && u >= 0; i++)
                    if (px->a[i] < 0) {
                        slot = i;
                        break;
                    }
                if (slot < 0) {
                    close(c);
                    if (u >= 0)
                        close(u);
                } else {
                    px->a[slot] = c;
                    px->b[slot] = u;
                }
            }
        }
        for (int k = 1; k < n; k++) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int i = map[k] % PROXY_MAX;
            if (px->a[i] < 0)
                continue;
            int rc = map[k] < PROXY_MAX ? pump(px->a[i], px->b[i]) : pump(px->b[i], px->a[i]);
            if (rc != 0)
                proxy_close_pair(px, i);
        }
    }
    for (int i = 0; i < PROXY_MAX; i++)
        if (px->a[i] >= 0)
            proxy_close_pair(px, i);
    return NULL;
}

static void proxy_start(struct proxy *px, int up_port)
{
    memset(px, 0, sizeof(*px));
    for (int i = 0; i < PROXY_MAX; i++)
        px->a[i] = px->b[i] = -1;
    px->up_port = up_port;
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(px->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(sa);
    assert_int_equal(bind(px->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(px->lfd, 64), 0);
    assert_int_equal(getsockname(px->lfd, (struct sockaddr *)&sa, &l), 0);
    px->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&px->th, NULL, proxy_main, px), 0);
}

static void proxy_stop(struct proxy *px)
{
    if (px->lfd <= 0)
        return;
    px->stop = 1;
    pthread_join(px->th, NULL);
    close(px->lfd);
    px->lfd = 0;
}

/* g_px is static, not on the test's stack: a failed assertion leaves the test function early
 * while the pump thread still uses it; the per-test teardown stops it. */

/* The port of the stack's PostgreSQL, from SLUICE_PG_DSN ("... port=N ..."). */
static int dsn_port(const char *dsn)
{
    const char *p = strstr(dsn, "port=");
    assert_non_null(p);
    return (int)strtol(p + 5, NULL, 10);
}

static void produce_wave(const char *topic,
                         const char *p,
                         const char *ep,
                         int from,
                         int to,
                         uint64_t T,
                         struct rec_expect *x)
{
    char id[96];
    for (int i = from; i < to; i++) {
        snprintf(id, sizeof(id), "%s-%d", p, i);
        produce_counted(topic,
                        &(struct sl_outcome){.id = id,
                                             .ep = ep,
                                             .type = "t",
                                             .created_ms = T,
                                             .attempt = 1,
                                             .state = SL_OUTCOME_DELIVERED,
                                             .http = 200,
                                             .ts_ms = T + (uint64_t)i,
                                             .lat_us = 700},
                        x);
    }
    produce_flush();
}

static void test_pg_outage(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], ep[96], dsn[600];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "o");
    snprintf(group, sizeof(group), "%s-grp", p);
    snprintf(ep, sizeof(ep), "%s-ep", p);
    struct proxy *px = &g_px;
    proxy_start(px, dsn_port(g_dsn));
    /* later keywords win in a conninfo string: same database, through the proxy */
    snprintf(dsn, sizeof(dsn), "%s host=127.0.0.1 port=%d connect_timeout=2", g_dsn, px->port);
    uint64_t T = (uint64_t)now_ms() - 60000;
    struct rec_expect x = {0, 0};
    const char *env[] = {"SLUICE_SHUTDOWN_DRAIN_MS", "2000", NULL};

    produce_wave(topic, p, ep, 0, 500, T, &x);
    struct rec_proc r = {0};
    rec_start(&r, topic, group, dsn, env);
    wait_consumed(topic, group, 60);
    assert_int_equal(q1("select count(*) from delivery_attempts where endpoint_id = '%s'", ep),
                     500);

    /* cut: more records arrive; nothing can be written, nothing is committed, nothing lost */
    px->cut = 1;
    produce_wave(topic, p, ep, 500, 1500, T, &x);
    sleep_ms(4000);
    assert_true(rec_alive(&r));
    assert_int_equal(q1("select count(*) from delivery_attempts where endpoint_id = '%s'", ep),
                     500);
    assert_true(group_lag(topic, group) >= 1000);
    assert_int_equal(log_count(&r, "\"event\":\"history_db_unavailable\""), 1);
    assert_true(log_count(&r, "\"event\":\"intake_paused\"") >= 1);

    /* back: everything arrives exactly once */
    px->cut = 0;
    wait_consumed(topic, group, 90);
    assert_int_equal(q1("select count(*) from delivery_attempts where endpoint_id = '%s'", ep),
                     1500);
    assert_int_equal(q1("select count(*) from deliveries where endpoint_id = '%s'", ep), 1500);
    assert_int_equal(q1("select count(*) from endpoint_latency where endpoint_id = '%s'", ep),
                     x.samples);
    assert_int_equal(log_count(&r, "\"event\":\"history_db_available\""), 1);
    assert_true(log_count(&r, "\"event\":\"intake_resumed\"") >= 1);

    /* cut again, records arrive, SIGTERM: exits 0 within the drain bound without committing */
    px->cut = 1;
    produce_wave(topic, p, ep, 1500, 2000, T, &x);
    sleep_ms(2000);
    assert_int_equal(rec_stop(&r, SIGTERM), 0);
    assert_true(log_count(&r, "\"event\":\"batch_not_written\"") == 1);
    assert_true(group_lag(topic, group) >= 500);
    px->cut = 0;
    rec_start(&r, topic, group, dsn, env);
    wait_consumed(topic, group, 90);
    assert_int_equal(rec_stop(&r, SIGTERM), 0);
    assert_int_equal(q1("select count(*) from delivery_attempts where endpoint_id = '%s'", ep),
                     2000);
    assert_int_equal(q1("select count(*) from endpoint_latency where endpoint_id = '%s'", ep),
                     x.samples);
    assert_int_equal(q1("select count(*) from deliveries where endpoint_id = '%s'", ep), 2000);
    proxy_stop(px);
    topic_delete(topic);
}

/* ==== 5. partition functions ==== */

static void test_partitions(void **state)
{
    (void)state;
    char p[64];
    make_prefix(p, sizeof(p), "p");
    assert_true(q1("select sluice_ensure_partitions()") >= 0);
    /* today .. today + 2 days; latency: this hour .. the end of today + 2 days */
    for (int d = 0; d <= 2; d++)
        assert_int_equal(q1("select count(*) from pg_class where relname = 'delivery_attempts_p' "
                            "|| to_char((now() at time zone 'UTC') + interval '%d day', "
                            "'YYYYMMDD')",
                            d),
                         1);
    assert_int_equal(q1("select count(*) from pg_class where relname = 'endpoint_latency_p' || "
                        "to_char((now() at time zone 'UTC'), 'YYYYMMDDHH24')"),
                     1);
    assert_int_equal(q1("select count(*) from pg_class where relname = 'endpoint_latency_p' || "
                        "to_char(date_trunc('day', now() at time zone 'UTC') + interval '71 "
                        "hours', 'YYYYMMDDHH24')"),
                     1);
    /* rows outside any partition are parked in the default partitions... */
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "insert into delivery_attempts (event_id, endpoint_id, attempt, state, ts) values "
             "('%s-old', '%s-ep', 1, 'delivered', now() - interval '20 days'), "
             "('%s-new', '%s-ep', 1, 'delivered', now() + interval '10 days')",
             p, p, p, p);
    exec_sql(sql);
    snprintf(sql, sizeof(sql),
             "insert into endpoint_latency values ('%s-ep', now() - interval '30 hours', "
             "'%s-old', 1, 1000, 200)",
             p, p);
    exec_sql(sql);
    assert_int_equal(q1("select count(*) from delivery_attempts_default where event_id like "
                        "'%s-%%'",
                        p),
                     2);
    assert_int_equal(q1("select count(*) from endpoint_latency_default where event_id like "
                        "'%s-%%'",
                        p),
                     1);
    /* ...and moved into their own partitions by the next ensure */
    assert_true(q1("select sluice_ensure_partitions()") >= 3);
    assert_int_equal(q1("select count(*) from delivery_attempts_default where event_id like "
                        "'%s-%%'",
                        p),
                     0);
    char rel[128];
    qtext(rel, sizeof(rel),
          "select tableoid::regclass::text from delivery_attempts where "
          "event_id = '%s-old'",
          p);
    char want[128];
    qtext(want, sizeof(want),
          "select 'delivery_attempts_p' || to_char((now() at time zone "
          "'UTC') - interval '20 days', 'YYYYMMDD')");
    assert_string_equal(rel, want);
    qtext(rel, sizeof(rel),
          "select tableoid::regclass::text from endpoint_latency where "
          "event_id = '%s-old'",
          p);
    assert_true(strncmp(rel, "endpoint_latency_p", 18) == 0);
    /* drop by retention: the 20-day-old day and the 30-hour-old hour go, the future stays */
    assert_true(q1("select sluice_drop_old_partitions(14, 25)") >= 2);
    assert_int_equal(q1("select count(*) from pg_class where relname = '%s'", want), 0);
    assert_int_equal(q1("select count(*) from delivery_attempts where event_id like '%s-%%'", p),
                     1);
    assert_int_equal(q1("select count(*) from endpoint_latency where event_id like '%s-%%'", p), 0);
    /* the future partition is ours to clean up */
    qtext(rel, sizeof(rel),
          "select tableoid::regclass::text from delivery_attempts where "
          "event_id = '%s-new'",
          p);
    snprintf(sql, sizeof(sql), "drop table %s", rel);
    exec_sql(sql);
    /* idempotent: a second call right after the first has nothing to do */
    assert_true(q1("select sluice_ensure_partitions()") >= 0);
    assert_int_equal(q1("select sluice_ensure_partitions()"), 0);
    assert_true(q1("select sluice_drop_old_partitions(14, 25)") >= 0);
    assert_int_equal(q1("select sluice_drop_old_partitions(14, 25)"), 0);
}

/* ==== 5b. maintenance by the recorder itself: retention and latency statistics ==== */

/* Wait (bounded) until the one-integer query gives want; returns the last value. */
static long long wait_q1(long long want, int timeout_s, const char *sql)
{
    int64_t deadline = now_ms() + (int64_t)timeout_s * 1000 * g_mult;
    long long v;
    while ((v = q1("%s", sql)) != want && now_ms() < deadline)
        sleep_ms(200);
    return v;
}

static void test_maintenance(void **state)
{
    (void)state;
    char topic[160], group[96], p[64], sql[2048];
    topic_new(topic, sizeof(topic), "rt.outcomes");
    make_prefix(p, sizeof(p), "m");
    snprintf(group, sizeof(group), "%s-grp", p);
    /* retention (dead letters 2 days here, deliveries 5): a dead letter of 3 days and its
     * replay journal entry expire, those of 1 day stay; deliveries last updated 20 and 8 days
     * ago expire, one of 2 days stays */
    snprintf(sql, sizeof(sql),
             "insert into dead_letters (event_id, endpoint_id, error_class, attempts,"
             " first_failed_at, dead_at) values"
             " ('%s-old', '%s-ep', 'http_5xx', 5, now() - interval '3 days',"
             "  now() - interval '3 days'),"
             " ('%s-new', '%s-ep', 'http_5xx', 5, now() - interval '1 day',"
             "  now() - interval '1 day')",
             p, p, p, p);
    exec_sql(sql);
    snprintf(sql, sizeof(sql),
             "insert into replay_log (run_id, event_id, endpoint_id, dead_at, state, started_at,"
             " acked_at) values"
             " ('%s-run', '%s-old', '%s-ep', now() - interval '3 days', 'acked',"
             "  now() - interval '3 days', now() - interval '3 days'),"
             " ('%s-run', '%s-new', '%s-ep', now() - interval '1 day', 'acked',"
             "  now() - interval '1 day', now() - interval '1 day')",
             p, p, p, p, p, p);
    exec_sql(sql);
    snprintf(sql, sizeof(sql),
             "insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
             " last_update) values ('%s-done', '%s-ep', 'delivered', 1,"
             " now() - interval '20 days', now() - interval '20 days'),"
             " ('%s-week', '%s-ep', 'delivered', 1, now() - interval '8 days',"
             "  now() - interval '8 days'),"
             " ('%s-recent', '%s-ep', 'delivered', 1, now() - interval '2 days',"
             "  now() - interval '2 days')",
             p, p, p, p, p, p);
    exec_sql(sql);
    /* latency statistics over the 24-h window: ten samples of 10..100 ms, one outside it */
    snprintf(sql, sizeof(sql),
             "insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us,"
             " http_status)"
             " select '%s-lat', now() - interval '1 min', '%s-l' || i, 1, i * 10000, 200"
             "   from generate_series(1, 10) i"
             " union all select '%s-lat', now() - interval '30 hours', '%s-l-old', 1, 99000000,"
             " 200",
             p, p, p, p);
    exec_sql(sql);
    const char *env[] = {"SLUICE_DEAD_LETTER_RETENTION_D",
                         "2",
                         "SLUICE_DELIVERIES_RETENTION_D",
                         "5",
                         "SLUICE_RECORDER_HEALTH_REFRESH_MS",
                         "1000",
                         NULL};
    struct rec_proc r = {0};
    rec_start(&r, topic, group, g_dsn, env);

    char q[512];
    snprintf(q, sizeof(q),
             "select (select count(*) from dead_letters where event_id = '%s-old')"
             "     + (select count(*) from replay_log where event_id = '%s-old')"
             "     + (select count(*) from deliveries where event_id in ('%s-done', '%s-week'))",
             p, p, p, p);
    assert_int_equal(wait_q1(0, 60, q), 0);
    snprintf(q, sizeof(q),
             "select coalesce((select samples from endpoint_health where endpoint_id = '%s-lat'),"
             " -1)",
             p);
    assert_int_equal(wait_q1(10, 60, q), 10);
    assert_int_equal(rec_stop(&r, SIGTERM), 0);

    /* what is within its retention stays */
    assert_int_equal(q1("select count(*) from dead_letters where event_id = '%s-new'", p), 1);
    assert_int_equal(q1("select count(*) from replay_log where event_id = '%s-new'", p), 1);
    assert_int_equal(q1("select count(*) from deliveries where event_id = '%s-recent'", p), 1);
    /* percentile_cont over 10, 20, ..., 100 ms; the 30-hour-old sample is outside the window */
    char got[256];
    qtext(got, sizeof(got),
          "select concat_ws('|', window_hours, samples, p50_us, p95_us, p99_us, avg_us,"
          " stats_at > now() - interval '1 min')"
          "  from endpoint_health where endpoint_id = '%s-lat'",
          p);
    assert_string_equal(got, "24|10|55000|95500|99100|55000|t");
    /* a sample near 2^63 µs (stored before the recorder refused such timings) is kept inside
     * bigint instead of failing every endpoint's refresh */
    snprintf(sql, sizeof(sql),
             "insert into endpoint_latency values ('%s-big', now(), '%s-big', 1, "
             "9223372036854775807, 200)",
             p, p);
    exec_sql(sql);
    assert_true(q1("select sluice_refresh_endpoint_health(24)") >= 2);
    assert_int_equal(q1("select p99_us from endpoint_health where endpoint_id = '%s-big'", p),
                     9200000000000000000LL);
    qtext(got, sizeof(got), "select p50_us from endpoint_health where endpoint_id = '%s-lat'", p);
    assert_string_equal(got, "55000");

    snprintf(sql, sizeof(sql),
             "delete from dead_letters where event_id like '%s-%%';"
             "delete from deliveries where event_id like '%s-%%';"
             "delete from replay_log where event_id like '%s-%%';"
             "delete from endpoint_latency where endpoint_id like '%s-%%';"
             "delete from endpoint_health where endpoint_id like '%s-%%'",
             p, p, p, p, p);
    exec_sql(sql);
}

/* ==== 6. command line ==== */

static int run_cmd(const char *const *env, const char *arg)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        for (size_t i = 0; env && env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        setenv("SLUICE_MASTER_KEY", TEST_MASTER_KEY, 0);
        execl(RECORDER, RECORDER, arg, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state)
{
    (void)state;
    assert_int_equal(run_cmd(NULL, "--help"), 0);
    const char *bad[] = {"SLUICE_RECORDER_BATCH", "0", NULL};
    assert_int_equal(run_cmd(bad, NULL), 78);
    const char *bad2[] = {"SLUICE_LATENCY_WINDOW_H", "soon", NULL};
    assert_int_equal(run_cmd(bad2, NULL), 78);
    assert_int_equal(run_cmd(NULL, "--no-such-flag"), 2);
}

/* ==== main ==== */

static int setup(void **state)
{
    (void)state;
    g_brokers = sl_test_env("SLUICE_KAFKA_BROKERS");
    g_dsn = sl_test_env("SLUICE_PG_DSN");
    const char *m = getenv("SL_TEST_TIMEOUT_MULT");
    long mv = m ? strtol(m, NULL, 10) : 0;
    if (mv > 1)
        g_mult = (int)mv;
    g_pg = PQconnectdb(g_dsn);
    if (PQstatus(g_pg) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to %s: %s", g_dsn, PQerrorMessage(g_pg));
        return -1;
    }
    char errstr[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", g_brokers, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "enable.idempotence", "true", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "partitioner", "murmur2_random", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "linger.ms", "5", errstr, sizeof(errstr))) {
        fprintf(stderr, "producer conf: %s\n", errstr);
        return -1;
    }
    g_prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!g_prod) {
        fprintf(stderr, "producer: %s\n", errstr);
        return -1;
    }
    snprintf(g_tmpdir, sizeof(g_tmpdir), "/tmp/sl_rec_test_XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    fprintf(stderr, "recorder logs in %s\n", g_tmpdir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g_prod) {
        rd_kafka_flush(g_prod, 10000);
        rd_kafka_destroy(g_prod);
    }
    if (g_pg)
        PQfinish(g_pg);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_cli, kill_leftovers),
        cmocka_unit_test_teardown(test_partitions, kill_leftovers),
        cmocka_unit_test_teardown(test_maintenance, kill_leftovers),
        cmocka_unit_test_teardown(test_lifecycles, kill_leftovers),
        cmocka_unit_test_teardown(test_quarantine_refused, kill_leftovers),
        cmocka_unit_test_teardown(test_sigterm_while_a_lane_waits_for_a_lock, kill_leftovers),
        cmocka_unit_test_teardown(test_row_racing_a_partition_attach, kill_leftovers),
        cmocka_unit_test_teardown(test_duplicates, kill_leftovers),
        cmocka_unit_test_teardown(test_kill9, kill_leftovers),
        cmocka_unit_test_teardown(test_rebalance, kill_leftovers),
        cmocka_unit_test_teardown(test_pg_outage, kill_leftovers),
    };
    const char *filter = getenv("SL_TEST_FILTER"); /* e.g. SL_TEST_FILTER=test_kill9 */
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
