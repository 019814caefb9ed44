/*
 * Integration test of the endpoint registry end to end, on the real stack (scripts/stack.sh):
 * the sluicectl binary writes PostgreSQL and the endpoints topic; this process follows the
 * topic with sl_endpoints_open (a second "process" view) and checks every change arrives,
 * decrypted, within 2 s (x SL_TEST_TIMEOUT_MULT); a fresh sl_endpoints_open reads the whole
 * state back from the beginning; bad input is refused with clear messages and writes nothing;
 * `endpoints sync` repairs the topic; bad records on the topic never replace a good version.
 * The registry's change operations (sl_reg_create / _update / _rotate / _remove / _disable,
 * sl_reg_db_page), which sluice-api calls, are also driven directly, including a change
 * committed but not published (a publisher on an unreachable broker).
 *
 * Isolation: a private compacted topic test.ep.<random> (3 partitions, created here with the
 * admin API and deleted at the end), endpoint ids prefixed t<random>-, a random master key.
 * Needs SLUICE_KAFKA_BROKERS and SLUICE_PG_DSN (eval "$(scripts/stack.sh env)"): a missing
 * one fails the test with the reason, it never skips.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_cfg.h"
#include "common/sl_endpoints.h"
#include "common/sl_kafka.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_registry.h"
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"
#include "common/sl_time.h"
#include "sl_testenv.h"

#define SLUICECTL SL_BINARY_DIR "/ctl/sluicectl"
/* Captured output per stream. `endpoints list` prints the whole registry, which on a long-used
 * stack (the bench's 10,000-endpoint phase) is megabytes; the struct is calloc'ed, so pages
 * that are never written cost nothing. */
#define OUT_MAX    (32 * 1024 * 1024)
#define PARTITIONS 3

struct env {
    char topic[64];         /* private endpoints topic */
    char prefix[32];        /* endpoint id prefix "t<hex>-" */
    char mkhex[65];         /* master key as hex */
    struct sl_masterkey mk; /* parsed */
    struct sl_config cfg;   /* loaded from the environment (incl. our overrides) */
    sl_endpoints_t *t;      /* live table following the topic */
    rd_kafka_t *rk;         /* admin + producer for planted records */
    PGconn *pg;             /* checks */
    atomic_int changes;     /* change callbacks seen */
    int64_t wait_ms;        /* visibility bound: 2000 x SL_TEST_TIMEOUT_MULT */
};

static struct env E;

/* ==== helpers ==== */

static void rand_hex(char *out, size_t nbytes)
{
    unsigned char b[64];
    FILE *f = fopen("/dev/urandom", "rb");
    assert_non_null(f);
    assert_int_equal(fread(b, 1, nbytes, f), nbytes);
    fclose(f);
    for (size_t i = 0; i < nbytes; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void id_of(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s%s", E.prefix, name);
}

struct run {
    int code;          /* exit code (or 128 + signal) */
    char out[OUT_MAX]; /* stdout */
    char err[OUT_MAX]; /* stderr */
};

/* Read both pipes to EOF. */
static void drain(int fo, int fe, struct run *r)
{
    size_t no = 0, ne = 0;
    struct pollfd p[2] = {{fo, POLLIN, 0}, {fe, POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(p, 2, 60000) <= 0)
            break;
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char *buf = i == 0 ? r->out : r->err;
            size_t *n = i == 0 ? &no : &ne;
            char tmp[4096];
            ssize_t k = read(p[i].fd, tmp, sizeof(tmp));
            if (k <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t room = OUT_MAX - 1 - *n;
            if ((size_t)k > room)
                fail_msg("sluicectl wrote more than %d bytes to std%s", OUT_MAX,
                         i == 0 ? "out" : "err");
            size_t take = (size_t)k;
            memcpy(buf + *n, tmp, take);
            *n += take;
        }
    }
    r->out[no] = '\0';
    r->err[ne] = '\0';
}

/* Run sluicectl with the given arguments (NULL-terminated). envmod changes the child's
 * environment: "NAME=value" sets, "-NAME" removes, NULL leaves it. Returns a heap struct run
 * (free()). */
static struct run *ctl_env(const char *envmod, const char *arg, ...)
{
    const char *argv[64];
    int argc = 0;
    va_list ap;
    argv[argc++] = SLUICECTL;
    va_start(ap, arg);
    for (const char *a = arg; a && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    struct run *r = sl_xcalloc(1, sizeof(*r));
    int po[2], pe[2];
    assert_int_equal(pipe(po), 0);
    assert_int_equal(pipe(pe), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        close(po[1]);
        close(pe[1]);
        if (envmod && envmod[0] == '-') {
            unsetenv(envmod + 1);
        } else if (envmod) {
            char name[64];
            size_t n = strcspn(envmod, "=");
            snprintf(name, sizeof(name), "%.*s", (int)n, envmod);
            setenv(name, envmod + n + 1, 1);
        }
        execv(SLUICECTL, (char *const *)(uintptr_t)argv);
        fprintf(stderr, "cannot exec %s: %s\n", SLUICECTL, strerror(errno));
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    drain(po[0], pe[0], r);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r->code != 0)
        fprintf(stderr, "[sluicectl exit %d] %s", r->code, r->err);
    return r;
}

#define CTL(...) ctl_env(NULL, __VA_ARGS__, (const char *)NULL)

static json_t *parse_json(const char *s)
{
    json_error_t jerr;
    json_t *j = json_loads(s, 0, &jerr);
    if (!j)
        fail_msg("sluicectl printed invalid JSON (%s): %s", jerr.text, s);
    return j;
}

static const char *jstr(json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    if (!s)
        fail_msg("JSON has no string \"%s\"", key);
    return s ? s : "";
}

/* The whsec_ form of secret i of e. */
static void secret_str(const struct sl_endpoint *e, size_t i, char *out, size_t len)
{
    assert_true(i < e->n_secrets);
    assert_int_equal(sl_secret_format(&e->secrets[i], out, len, NULL), 0);
}

typedef bool (*ep_pred)(const struct sl_endpoint *e, const void *arg);

/*
 * Wait (up to E.wait_ms) until the live table's entry for id satisfies pred (NULL pred:
 * until it is gone). Returns a reference (release it) or NULL when gone; fails the test on
 * timeout.
 */
static const struct sl_endpoint *wait_for(const char *id, ep_pred pred, const void *arg)
{
    int64_t t0 = sl_mono_ms();
    for (;;) {
        const struct sl_endpoint *e = sl_endpoints_get(E.t, id);
        if (!pred && !e)
            return NULL;
        if (pred && e && pred(e, arg))
            return e;
        sl_endpoint_release(e);
        if (sl_mono_ms() - t0 > E.wait_ms)
            fail_msg("endpoint %s did not reach the expected state within %lld ms", id,
                     (long long)E.wait_ms);
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static bool version_above(const struct sl_endpoint *e, const void *arg)
{
    return e->version > *(const uint64_t *)arg;
}

static bool exists(const struct sl_endpoint *e, const void *arg)
{
    (void)e;
    (void)arg;
    return true;
}

/* One-row, one-column query with text params; returns a heap copy ("" for no row). */
static char *pg_value(const char *sql, const char *p1)
{
    const char *params[1] = {p1};
    PGresult *res = PQexecParams(E.pg, sql, p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        fail_msg("query failed: %s", PQresultErrorMessage(res));
    char *v = sl_xstrdup(PQntuples(res) > 0 ? PQgetvalue(res, 0, 0) : "");
    PQclear(res);
    return v;
}

static int64_t pg_int(const char *sql, const char *p1)
{
    char *v = pg_value(sql, p1);
    int64_t n = strtoll(v, NULL, 10);
    free(v);
    return n;
}

/* Sum of the topic's high watermarks (how many records were ever written). */
static int64_t topic_records(void)
{
    int64_t sum = 0;
    for (int p = 0; p < PARTITIONS; p++) {
        int64_t lo = 0, hi = 0;
        assert_int_equal(rd_kafka_query_watermark_offsets(E.rk, E.topic, p, &lo, &hi, 10000),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        sum += hi;
    }
    return sum;
}

/* Produce one raw record to the test topic and wait for its acknowledgement. */
static void produce_raw(const char *key, const void *val, size_t len)
{
    assert_int_equal(rd_kafka_producev(E.rk, RD_KAFKA_V_TOPIC(E.topic),
                                       RD_KAFKA_V_KEY((void *)(uintptr_t)key, strlen(key)),
                                       RD_KAFKA_V_VALUE((void *)(uintptr_t)val, len),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_int_equal(rd_kafka_flush(E.rk, 15000), RD_KAFKA_RESP_ERR_NO_ERROR);
}

/*
 * Encode and produce an endpoint record for key whose secret is sealed with mk for rec_id,
 * signed with sign_mk (NULL: unsigned). forged_url: after signing, the URL is replaced by it
 * and the record re-encoded with the original kid and MAC (an altered record). updated_ms:
 * the record's time, 0 for now.
 */
static void produce_endpoint_at(const char *key,
                                const char *rec_id,
                                const struct sl_masterkey *mk,
                                const struct sl_masterkey *sign_mk,
                                const char *url,
                                const char *forged_url,
                                uint64_t updated_ms)
{
    struct sl_secret s;
    char whsec[SL_SECRET_STR_MAX];
    uint8_t box[SL_SECRET_ENC_MAX];
    size_t blen = 0;
    assert_int_equal(sl_secret_generate(&s, NULL), 0);
    assert_int_equal(sl_secret_format(&s, whsec, sizeof(whsec), NULL), 0);
    assert_int_equal(sl_secretbox_seal(mk, rec_id, (const uint8_t *)whsec, strlen(whsec), box,
                                       sizeof(box), &blen, NULL),
                     0);
    struct sl_endpoint_secret sec = {box, blen, 0};
    struct sl_endpoint_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.id = rec_id;
    rec.url = url;
    rec.secrets = &sec;
    rec.n_secrets = 1;
    rec.enabled = true;
    rec.updated_ms = updated_ms ? updated_ms : (uint64_t)sl_now_ms();
    struct sl_buf b;
    sl_buf_init(&b, SL_ENDPOINT_RECORD_MAX);
    sl_err_t err;
    int rc = sign_mk ? sl_endpoint_rec_sign(sign_mk, &rec, &b, &err)
                     : sl_endpoint_rec_encode(&rec, &b, &err);
    if (rc != 0)
        fail_msg("encode: %s", err.msg);
    if (forged_url) {
        struct sl_endpoint_rec signed_rec;
        assert_int_equal(sl_endpoint_rec_decode(b.data, b.len, NULL, &signed_rec, &err), 0);
        assert_non_null(signed_rec.mac);
        signed_rec.url = forged_url;
        sl_buf_reset(&b);
        assert_int_equal(sl_endpoint_rec_encode(&signed_rec, &b, &err), 0);
        sl_endpoint_rec_fini(&signed_rec);
    }
    produce_raw(key, b.data, b.len);
    sl_buf_fini(&b);
}

static void produce_endpoint_ex(const char *key,
                                const char *rec_id,
                                const struct sl_masterkey *mk,
                                const struct sl_masterkey *sign_mk,
                                const char *url,
                                const char *forged_url)
{
    produce_endpoint_at(key, rec_id, mk, sign_mk, url, forged_url, 0);
}

/* A record signed with the key it is sealed with (what sluicectl writes). */
static void produce_endpoint(const char *key,
                             const char *rec_id,
                             const struct sl_masterkey *mk,
                             const char *url)
{
    produce_endpoint_ex(key, rec_id, mk, mk, url, NULL);
}

static void on_change(void *opaque, const char *id, const struct sl_endpoint *e)
{
    (void)id;
    (void)e;
    atomic_fetch_add((atomic_int *)opaque, 1);
}

/* Create or delete the private topic through the admin API. */
static void admin_topic(bool create)
{
    char errstr[512];
    rd_kafka_queue_t *q = rd_kafka_queue_new(E.rk);
    rd_kafka_AdminOptions_t *opt = rd_kafka_AdminOptions_new(
        E.rk, create ? RD_KAFKA_ADMIN_OP_CREATETOPICS : RD_KAFKA_ADMIN_OP_DELETETOPICS);
    rd_kafka_AdminOptions_set_operation_timeout(opt, 15000, errstr, sizeof(errstr));
    rd_kafka_event_t *ev = NULL;
    const rd_kafka_topic_result_t **tr = NULL;
    size_t n = 0;
    if (create) {
        rd_kafka_NewTopic_t *nt =
            rd_kafka_NewTopic_new(E.topic, PARTITIONS, 1, errstr, sizeof(errstr));
        assert_non_null(nt);
        assert_int_equal(rd_kafka_NewTopic_set_config(nt, "cleanup.policy", "compact"),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        rd_kafka_CreateTopics(E.rk, &nt, 1, opt, q);
        ev = rd_kafka_queue_poll(q, 30000);
        assert_non_null(ev);
        tr = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
        rd_kafka_NewTopic_destroy(nt);
    } else {
        rd_kafka_DeleteTopic_t *dt = rd_kafka_DeleteTopic_new(E.topic);
        rd_kafka_DeleteTopics(E.rk, &dt, 1, opt, q);
        ev = rd_kafka_queue_poll(q, 30000);
        if (ev)
            tr = rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev), &n);
        rd_kafka_DeleteTopic_destroy(dt);
    }
    if (create) {
        if (rd_kafka_event_error(ev) || n != 1 || rd_kafka_topic_result_error(tr[0]))
            fail_msg("cannot create topic %s: %s", E.topic,
                     n == 1 ? rd_kafka_topic_result_error_string(tr[0])
                            : rd_kafka_event_error_string(ev));
    } else if (!ev || n != 1 || rd_kafka_topic_result_error(tr[0])) {
        fprintf(stderr, "could not delete topic %s\n", E.topic);
    }
    if (ev)
        rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(opt);
    rd_kafka_queue_destroy(q);
}

/* ==== setup ==== */

static int group_setup(void **state)
{
    (void)state;
    char errstr[512], rnd[17];
    const char *brokers = sl_test_env("SLUICE_KAFKA_BROKERS");
    const char *dsn = sl_test_env("SLUICE_PG_DSN");
    const char *mult = getenv("SL_TEST_TIMEOUT_MULT");
    long mv = mult ? strtol(mult, NULL, 10) : 0;
    E.wait_ms = 2000 * (mv > 0 ? (int)mv : 1);
    rand_hex(rnd, 8);
    snprintf(E.topic, sizeof(E.topic), "test.ep.%s", rnd);
    snprintf(E.prefix, sizeof(E.prefix), "t%.8s-", rnd);
    rand_hex(E.mkhex, 32);
    setenv("SLUICE_TOPIC_ENDPOINTS", E.topic, 1);
    setenv("SLUICE_MASTER_KEY", E.mkhex, 1);
    if (sl_cfg_load(&E.cfg, NULL, NULL, stderr) != 0)
        fail_msg("configuration from the environment is invalid");
    assert_int_equal(sl_masterkey_parse(&E.mk, E.mkhex, NULL), 0);

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(conf, "acks", "all", errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
    E.rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    assert_non_null(E.rk);
    admin_topic(true);

    E.pg = PQconnectdb(dsn);
    if (PQstatus(E.pg) != CONNECTION_OK)
        fail_msg("cannot connect to PostgreSQL (%s): %s", dsn, PQerrorMessage(E.pg));

    sl_err_t err;
    if (sl_endpoints_open(&E.cfg, &E.mk, 30000, &E.t, &err) != 0)
        fail_msg("sl_endpoints_open on the empty topic: %s", err.msg);
    assert_int_equal(sl_endpoints_count(E.t), 0);
    sl_endpoints_on_change(E.t, on_change, &E.changes);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sl_endpoints_close(E.t);
    if (E.pg) {
        char like[40];
        snprintf(like, sizeof(like), "%s%%", E.prefix);
        const char *p[1] = {like};
        PQclear(PQexecParams(E.pg, "delete from endpoints where id like $1", 1, NULL, p, NULL, NULL,
                             0));
        PQfinish(E.pg);
    }
    if (E.rk) {
        admin_topic(false);
        rd_kafka_destroy(E.rk);
    }
    sl_masterkey_fini(&E.mk);
    sl_cfg_fini(&E.cfg);
    return 0;
}

/* ==== tests ==== */

struct url_is {
    const char *url;
    uint64_t above;
};

static bool url_matches(const struct sl_endpoint *e, const void *arg)
{
    const struct url_is *u = arg;
    return e->version > u->above && strcmp(e->url, u->url) == 0;
}

static bool has_n_secrets(const struct sl_endpoint *e, const void *arg)
{
    return e->n_secrets == *(const size_t *)arg && e->version > 0;
}

static bool is_disabled(const struct sl_endpoint *e, const void *arg)
{
    (void)arg;
    return !e->enabled;
}

static bool is_enabled(const struct sl_endpoint *e, const void *arg)
{
    (void)arg;
    return e->enabled;
}

/* add -> update -> rotate (twice) -> disable -> enable -> delete, each visible in PG and,
 * decrypted, in the live table within the bound. */
static void test_lifecycle(void **state)
{
    (void)state;
    char id[80], s1[SL_SECRET_STR_MAX], s2[SL_SECRET_STR_MAX], s3[SL_SECRET_STR_MAX];
    char got[SL_SECRET_STR_MAX];
    id_of(id, sizeof(id), "life");
    uint64_t gen0 = sl_endpoints_generation(E.t);
    int changes0 = atomic_load(&E.changes);

    /* add */
    struct run *r =
        CTL("endpoints", "add", "--id", id, "--url", "https://example.com/hook?token=T0K3N",
            "--name", "Shop A", "--header", "X-Source: sluice", "--timeout-ms", "5000",
            "--max-attempts", "7", "--json");
    assert_int_equal(r->code, 0);
    json_t *j = parse_json(r->out);
    snprintf(s1, sizeof(s1), "%s", jstr(j, "secret"));
    assert_true(json_is_true(json_object_get(j, "published")));
    assert_int_equal(strncmp(s1, "whsec_", 6), 0);
    assert_null(strstr(r->err, s1)); /* the secret never reaches stderr / logs */
    json_decref(j);
    free(r);
    char *v = pg_value("select url from endpoints where id = $1", id);
    assert_string_equal(v, "https://example.com/hook?token=T0K3N");
    free(v);
    assert_int_equal(pg_int("select count(*) from endpoint_secrets where endpoint_id = $1", id), 1);

    const struct sl_endpoint *e = wait_for(id, exists, NULL);
    assert_string_equal(e->url, "https://example.com/hook?token=T0K3N");
    assert_string_equal(e->name, "Shop A");
    assert_false(e->tpl);
    assert_int_equal(e->method, SL_METHOD_POST);
    assert_null(e->ct);
    assert_int_equal(e->n_hdr, 1);
    assert_string_equal(e->hdr[0].name, "X-Source");
    assert_string_equal(e->hdr[0].value, "sluice");
    assert_int_equal(e->timeout_ms, 5000);
    assert_int_equal(e->max_attempts, 7);
    /* zeros resolved to the global defaults */
    assert_int_equal(e->retry_base_ms, E.cfg.retry_base_ms);
    assert_int_equal(e->retry_cap_ms, E.cfg.retry_cap_ms);
    assert_int_equal(e->brk_threshold, E.cfg.breaker_threshold);
    assert_int_equal(e->max_inflight, E.cfg.max_inflight_per_endpoint);
    assert_int_equal(e->conn_timeout_ms,
                     E.cfg.http_connect_timeout_ms < 5000 ? E.cfg.http_connect_timeout_ms : 5000);
    assert_int_equal(e->rate, 0);
    assert_int_equal(e->n_secrets, 1);
    secret_str(e, 0, got, sizeof(got));
    assert_string_equal(got, s1);
    assert_int_equal(e->secret_exp_ms[0], 0);
    assert_true(e->enabled);
    assert_true(e->version >= 1);
    assert_int_equal(e->updated_ms,
                     pg_int("select floor(extract(epoch from updated_at) * 1000)::bigint from "
                            "endpoints where id = $1",
                            id));
    uint64_t ver = e->version;
    sl_endpoint_release(e);

    /* update */
    r = CTL("endpoints", "update", id, "--url", "https://example.com/v2", "--retry-base-ms", "2000",
            "--method", "put");
    assert_int_equal(r->code, 0);
    free(r);
    struct url_is u = {"https://example.com/v2", ver};
    e = wait_for(id, url_matches, &u);
    assert_int_equal(e->method, SL_METHOD_PUT);
    assert_int_equal(e->retry_base_ms, 2000);
    assert_int_equal(e->timeout_ms, 5000); /* untouched settings stay */
    assert_string_equal(e->name, "Shop A");
    ver = e->version;
    sl_endpoint_release(e);
    v = pg_value("select method || ' ' || retry_base_ms from endpoints where id = $1", id);
    assert_string_equal(v, "PUT 2000");
    free(v);

    /* switch to a postback template */
    r = CTL("endpoints", "update", id, "--url", "https://t.example/pb?c={click_id}&p={payout}",
            "--template");
    assert_int_equal(r->code, 0);
    free(r);
    u = (struct url_is){"https://t.example/pb?c={click_id}&p={payout}", ver};
    e = wait_for(id, url_matches, &u);
    assert_true(e->tpl);
    ver = e->version;
    sl_endpoint_release(e);

    /* rotate with an overlap: 2 secrets, the new one current, the old one expiring */
    int64_t before = sl_now_ms();
    r = CTL("endpoints", "rotate-secret", id, "--overlap-s", "3600", "--json");
    assert_int_equal(r->code, 0);
    j = parse_json(r->out);
    snprintf(s2, sizeof(s2), "%s", jstr(j, "secret"));
    json_decref(j);
    assert_null(strstr(r->err, s2));
    free(r);
    size_t two = 2;
    e = wait_for(id, has_n_secrets, &two);
    assert_true(e->version > ver);
    secret_str(e, 0, got, sizeof(got));
    assert_string_equal(got, s2);
    assert_int_equal(e->secret_exp_ms[0], 0);
    secret_str(e, 1, got, sizeof(got));
    assert_string_equal(got, s1);
    assert_true(e->secret_exp_ms[1] >= (uint64_t)before + 3600 * 1000 - 60000);
    assert_true(e->secret_exp_ms[1] <= (uint64_t)sl_now_ms() + 3600 * 1000 + 60000);
    ver = e->version;
    sl_endpoint_release(e);
    assert_int_equal(pg_int("select count(*) from endpoint_secrets where endpoint_id = $1 and "
                            "expires_at > now() + interval '3500 seconds'",
                            id),
                     1);

    /* rotate with no overlap: s2 stops at once and leaves the record; s1 still overlaps */
    r = CTL("endpoints", "rotate-secret", id, "--overlap-s", "0", "--json");
    assert_int_equal(r->code, 0);
    j = parse_json(r->out);
    snprintf(s3, sizeof(s3), "%s", jstr(j, "secret"));
    json_decref(j);
    free(r);
    e = wait_for(id, version_above, &ver);
    assert_int_equal(e->n_secrets, 2);
    secret_str(e, 0, got, sizeof(got));
    assert_string_equal(got, s3);
    secret_str(e, 1, got, sizeof(got));
    assert_string_equal(got, s1);
    ver = e->version;
    sl_endpoint_release(e);

    /* disable / enable */
    r = CTL("endpoints", "disable", id, "--reason", "maintenance window");
    assert_int_equal(r->code, 0);
    free(r);
    e = wait_for(id, is_disabled, NULL);
    assert_string_equal(e->reason, "maintenance window");
    sl_endpoint_release(e);
    assert_int_equal(pg_int("select count(*) from endpoints where id = $1 and not enabled", id), 1);
    r = CTL("endpoints", "enable", id);
    assert_int_equal(r->code, 0);
    free(r);
    e = wait_for(id, is_enabled, NULL);
    assert_string_equal(e->reason, "");
    sl_endpoint_release(e);

    /* delete */
    r = CTL("endpoints", "delete", id);
    assert_int_equal(r->code, 0);
    free(r);
    assert_null(wait_for(id, NULL, NULL));
    assert_int_equal(pg_int("select count(*) from endpoints where id = $1", id), 0);
    assert_int_equal(pg_int("select count(*) from endpoint_secrets where endpoint_id = $1", id), 0);

    /* 8 changes: generation and callbacks followed every one of them */
    assert_true(sl_endpoints_generation(E.t) >= gen0 + 8);
    assert_true(atomic_load(&E.changes) >= changes0 + 8);
}

/* Rejected input: clear message, the right exit code, nothing in PG or on the topic. */
static void test_bad_input(void **state)
{
    (void)state;
    char id[80], bad[80];
    id_of(id, sizeof(id), "victim");
    id_of(bad, sizeof(bad), "bad");
    struct run *r = CTL("endpoints", "add", "--id", id, "--url", "https://example.com/ok");
    assert_int_equal(r->code, 0);
    free(r);
    const struct sl_endpoint *e = wait_for(id, exists, NULL);
    uint64_t ver = e->version;
    sl_endpoint_release(e);
    int64_t recs = topic_records();
    uint64_t gen = sl_endpoints_generation(E.t);
    char *updated = pg_value("select updated_at::text from endpoints where id = $1", id);

    static const struct {
        const char *args[12];
        int code;
        const char *msg; /* must appear in stderr */
    } cases[] = {
        {{"add", "--id", "@BAD", "--url", "https://x.example/", "--header", "X-A: b\r\nEvil: 1"},
         2,
         "CR or LF"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/", "--header", "X-A: b\nc"},
         2,
         "CR or LF"},
        {{"add", "--id", "@BAD", "--url", "ftp://x.example/"}, 2, "--url"},
        {{"add", "--id", "@BAD", "--url", "not a url"}, 2, "--url"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/pb?c={click", "--template"},
         2,
         "unclosed '{'"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/pb?c={cl-ick}", "--template"},
         2,
         "[A-Za-z0-9_]"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/pb?c=click}", "--template"},
         2,
         "unmatched '}'"},
        {{"add", "--id", "@BAD", "--url", "https://{host}.example/pb", "--template"},
         2,
         "macro in the host"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/pb?c={click_id}"}, 2, "template"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/", "--bogus"}, 2, "'--bogus'"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/", "--timeout-ms", "abc"},
         2,
         "--timeout-ms"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/", "--header", "Host: evil"},
         2,
         "reserved"},
        {{"add", "--id", "@BAD", "--url", "https://x.example/", "--secret", "whsec_short"},
         2,
         "--secret"},
        {{"add", "--id", "@BAD"}, 2, "--url is required"},
        {{"update", "@ID", "--header", "X-A: b\r\nEvil: 1"}, 2, "CR or LF"},
        {{"update", "@ID", "--url", "https://x.example/{a}"}, 2, "template"},
        {{"update", "@ID", "--retry-base-ms", "5000", "--retry-cap-ms", "10"}, 2, "--retry-cap-ms"},
        {{"update", "@ID"}, 2, "nothing to update"},
        {{"update", "@BAD", "--name", "x"}, 1, "not found"},
        {{"disable", "@ID"}, 2, "--reason is required"},
        {{"rotate-secret", "@ID", "--overlap-s", "-5"}, 2, "--overlap-s"},
        {{"frobnicate"}, 2, "unknown subcommand"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *argv[16];
        int n = 0;
        argv[n++] = "endpoints";
        for (int k = 0; cases[c].args[k]; k++) {
            const char *a = cases[c].args[k];
            argv[n++] = strcmp(a, "@BAD") == 0 ? bad : strcmp(a, "@ID") == 0 ? id : a;
        }
        while (n < 16)
            argv[n++] = NULL;
        r = ctl_env(NULL, argv[0], argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[7],
                    argv[8], argv[9], argv[10], argv[11], argv[12], NULL);
        if (r->code != cases[c].code || !strstr(r->err, cases[c].msg))
            fail_msg("case %zu (%s %s): exit %d, stderr: %s", c, cases[c].args[0],
                     cases[c].args[1] ? cases[c].args[1] : "", r->code, r->err);
        /* usage errors name the problem, never echo a header value */
        assert_null(strstr(r->err, "Evil"));
        free(r);
    }
    /* missing master key: bad configuration, 78 */
    r = ctl_env("-SLUICE_MASTER_KEY", "endpoints", "add", "--id", bad, "--url",
                "https://x.example/", (const char *)NULL);
    assert_int_equal(r->code, 78);
    assert_non_null(strstr(r->err, "SLUICE_MASTER_KEY"));
    free(r);
    /* a configuration error is 78 too, before anything else */
    setenv("SLUICE_HTTP_TIMEOUT_MS", "15s", 1);
    r = CTL("endpoints", "list");
    unsetenv("SLUICE_HTTP_TIMEOUT_MS");
    assert_int_equal(r->code, 78);
    assert_non_null(strstr(r->err, "SLUICE_HTTP_TIMEOUT_MS"));
    free(r);

    /* nothing written anywhere */
    assert_int_equal(pg_int("select count(*) from endpoints where id = $1", bad), 0);
    char *updated2 = pg_value("select updated_at::text from endpoints where id = $1", id);
    assert_string_equal(updated, updated2);
    free(updated);
    free(updated2);
    assert_int_equal(topic_records(), recs);
    assert_int_equal(sl_endpoints_generation(E.t), gen);
    e = sl_endpoints_get(E.t, id);
    assert_non_null(e);
    assert_int_equal(e->version, ver);
    sl_endpoint_release(e);
    assert_null(sl_endpoints_get(E.t, bad));
}

static bool same_endpoint(const struct sl_endpoint *a, const struct sl_endpoint *b)
{
    if (strcmp(a->url, b->url) || strcmp(a->name, b->name) || a->tpl != b->tpl ||
        a->method != b->method || a->enabled != b->enabled || strcmp(a->reason, b->reason) ||
        a->n_hdr != b->n_hdr || a->n_secrets != b->n_secrets || a->updated_ms != b->updated_ms ||
        a->timeout_ms != b->timeout_ms || a->retry_base_ms != b->retry_base_ms)
        return false;
    for (size_t i = 0; i < a->n_secrets; i++) {
        if (a->secrets[i].len != b->secrets[i].len ||
            memcmp(a->secrets[i].key, b->secrets[i].key, a->secrets[i].len) != 0 ||
            a->secret_exp_ms[i] != b->secret_exp_ms[i])
            return false;
    }
    for (size_t i = 0; i < a->n_hdr; i++) {
        if (strcmp(a->hdr[i].name, b->hdr[i].name) || strcmp(a->hdr[i].value, b->hdr[i].value))
            return false;
    }
    return true;
}

static bool is_renamed(const struct sl_endpoint *e, const void *arg)
{
    (void)arg;
    return strcmp(e->name, "renamed") == 0;
}

/* A fresh open reads the whole current state from the beginning of the topic. */
static void test_reload_from_beginning(void **state)
{
    (void)state;
    char ids[6][80];
    static const char *names[6] = {"r0", "r1", "r2", "r3", "r4", "gone"};
    for (int i = 0; i < 6; i++) {
        id_of(ids[i], sizeof(ids[i]), names[i]);
        char url[128];
        snprintf(url, sizeof(url), "https://example.com/%s?k=%d", names[i], i);
        struct run *r = CTL("endpoints", "add", "--id", ids[i], "--url", url, "--header", "X-N: 1");
        assert_int_equal(r->code, 0);
        free(r);
    }
    struct run *r = CTL("endpoints", "update", ids[1], "--name", "renamed", "--timeout-ms", "900");
    assert_int_equal(r->code, 0);
    free(r);
    r = CTL("endpoints", "rotate-secret", ids[2]);
    assert_int_equal(r->code, 0);
    free(r);
    r = CTL("endpoints", "disable", ids[3], "--reason", "gone fishing");
    assert_int_equal(r->code, 0);
    free(r);
    r = CTL("endpoints", "delete", ids[5]);
    assert_int_equal(r->code, 0);
    free(r);
    assert_null(wait_for(ids[5], NULL, NULL));
    /* the live table has every change (each predicate names the last change of its id) */
    size_t two = 2;
    sl_endpoint_release(wait_for(ids[1], is_renamed, NULL));
    sl_endpoint_release(wait_for(ids[2], has_n_secrets, &two));
    sl_endpoint_release(wait_for(ids[3], is_disabled, NULL));

    sl_endpoints_t *t2 = NULL;
    sl_err_t err;
    if (sl_endpoints_open(&E.cfg, &E.mk, 30000, &t2, &err) != 0)
        fail_msg("second open: %s", err.msg);
    for (int i = 0; i < 5; i++) {
        const struct sl_endpoint *a = wait_for(ids[i], exists, NULL);
        const struct sl_endpoint *b = sl_endpoints_get(t2, ids[i]);
        assert_non_null(b);
        assert_true(same_endpoint(a, b));
        sl_endpoint_release(a);
        sl_endpoint_release(b);
    }
    assert_null(sl_endpoints_get(t2, ids[5]));
    const struct sl_endpoint *b = sl_endpoints_get(t2, ids[1]);
    assert_string_equal(b->name, "renamed");
    assert_int_equal(b->timeout_ms, 900);
    assert_int_equal(b->conn_timeout_ms, 900); /* default 5000 clamped to the total timeout */
    sl_endpoint_release(b);
    /* the same set of endpoints as the live table */
    assert_int_equal(sl_endpoints_count(t2), sl_endpoints_count(E.t));
    const struct sl_endpoint **all = NULL;
    size_t n = 0;
    sl_endpoints_snapshot(t2, &all, &n);
    assert_int_equal(n, sl_endpoints_count(t2));
    for (size_t i = 0; i < n; i++)
        sl_endpoint_release(all[i]);
    free(all);
    sl_endpoints_close(t2);

    /* with the wrong master key nothing decrypts: open refuses instead of serving an empty
     * table */
    struct sl_masterkey wrong;
    char hex[65];
    rand_hex(hex, 32);
    assert_int_equal(sl_masterkey_parse(&wrong, hex, NULL), 0);
    t2 = NULL;
    assert_int_equal(sl_endpoints_open(&E.cfg, &wrong, 30000, &t2, &err), SL_ECRYPTO);
    assert_null(t2);
    assert_non_null(strstr(err.msg, "master_key"));
    sl_masterkey_fini(&wrong);
}

static bool stats_invalid_above(uint64_t n)
{
    int64_t t0 = sl_mono_ms();
    struct sl_endpoints_stats st;
    for (;;) {
        sl_endpoints_stats(E.t, &st);
        if (st.invalid > n)
            return true;
        if (sl_mono_ms() - t0 > E.wait_ms)
            return false;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static bool stats_refused_above(uint64_t n)
{
    int64_t t0 = sl_mono_ms();
    struct sl_endpoints_stats st;
    for (;;) {
        sl_endpoints_stats(E.t, &st);
        if (st.refused > n)
            return true;
        if (sl_mono_ms() - t0 > E.wait_ms)
            return false;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

struct refused_list {
    char id[80];
    char why[256];
};

static void collect_refused(void *opaque, const char *id, const char *why)
{
    struct refused_list *l = opaque;
    snprintf(l->id, sizeof(l->id), "%s", id);
    snprintf(l->why, sizeof(l->why), "%s", why);
}

/* Bad records never replace a good version; sync republishes identically (no new version)
 * and deletes topic keys the registry does not have. */
static void test_bad_records_and_sync(void **state)
{
    (void)state;
    char id[80], other[80], stray[80];
    id_of(id, sizeof(id), "keep");
    id_of(other, sizeof(other), "other");
    id_of(stray, sizeof(stray), "stray");
    struct run *r = CTL("endpoints", "add", "--id", id, "--url", "https://example.com/keep");
    assert_int_equal(r->code, 0);
    free(r);
    const struct sl_endpoint *e = wait_for(id, exists, NULL);
    uint64_t ver = e->version;
    sl_endpoint_release(e);

    struct sl_endpoints_stats st;
    sl_endpoints_stats(E.t, &st);
    /* 1. not msgpack */
    produce_raw(id, "this is not msgpack", 19);
    assert_true(stats_invalid_above(st.invalid));
    sl_endpoints_stats(E.t, &st);
    /* 2. sealed and signed with another master key (of the same id): refused */
    struct sl_masterkey wrong;
    char hex[65];
    rand_hex(hex, 32);
    assert_int_equal(sl_masterkey_parse(&wrong, hex, NULL), 0);
    produce_endpoint(id, id, &wrong, "https://evil.example/");
    assert_true(stats_refused_above(st.refused));
    sl_endpoints_stats(E.t, &st);
    /* 3. a valid record whose id is not its key */
    produce_endpoint(id, other, &E.mk, "https://evil.example/");
    assert_true(stats_invalid_above(st.invalid));
    sl_endpoints_stats(E.t, &st);
    /* 4. unsigned, with a secret sealed with the right key (a topic writer without the key) */
    produce_endpoint_ex(id, id, &E.mk, NULL, "https://evil.example/", NULL);
    assert_true(stats_refused_above(st.refused));
    sl_endpoints_stats(E.t, &st);
    struct refused_list rl = {0};
    assert_int_equal(sl_endpoints_refused(E.t, collect_refused, &rl), 1);
    assert_string_equal(rl.id, id);
    assert_non_null(strstr(rl.why, "not signed"));
    /* 5. a genuine record whose URL was changed afterwards, MAC kept: refused */
    produce_endpoint_ex(id, id, &E.mk, &E.mk, "https://example.com/keep", "https://evil.example/");
    assert_true(stats_refused_above(st.refused));
    assert_int_equal(sl_endpoints_refused(E.t, collect_refused, &rl), 1);
    assert_non_null(strstr(rl.why, "MAC does not match"));
    /* 6. signed with a key id that is not configured */
    struct sl_masterkey other_id;
    char spec[80];
    snprintf(spec, sizeof(spec), "k9:%s", hex);
    assert_int_equal(sl_masterkey_parse(&other_id, spec, NULL), 0);
    sl_endpoints_stats(E.t, &st);
    produce_endpoint_ex(id, id, &E.mk, &other_id, "https://evil.example/", NULL);
    assert_true(stats_refused_above(st.refused));
    assert_int_equal(sl_endpoints_refused(E.t, collect_refused, &rl), 1);
    assert_non_null(strstr(rl.why, "master key 'k9', which is not configured"));
    sl_masterkey_fini(&other_id);
    sl_masterkey_fini(&wrong);
    /* none of them replaced the good version */
    e = sl_endpoints_get(E.t, id);
    assert_non_null(e);
    assert_int_equal(e->version, ver);
    assert_string_equal(e->url, "https://example.com/keep");
    sl_endpoint_release(e);
    /* a genuine record again (a change through sluicectl) takes it off the refused list */
    r = CTL("endpoints", "update", id, "--name", "kept");
    assert_int_equal(r->code, 0);
    free(r);
    e = wait_for(id, version_above, &ver);
    ver = e->version;
    uint64_t in_force_ms = e->updated_ms;
    sl_endpoint_release(e);
    assert_int_equal(sl_endpoints_refused(E.t, NULL, NULL), 0);
    /* 7. a genuine record older than the one in force (an old record replayed onto the topic
     * to bring back an old URL or secret): refused, the current version kept */
    sl_endpoints_stats(E.t, &st);
    produce_endpoint_at(id, id, &E.mk, &E.mk, "https://evil.example/old", NULL, in_force_ms - 1);
    assert_true(stats_refused_above(st.refused));
    assert_int_equal(sl_endpoints_refused(E.t, collect_refused, &rl), 1);
    assert_non_null(strstr(rl.why, "older than the one in force"));
    e = sl_endpoints_get(E.t, id);
    assert_non_null(e);
    assert_int_equal(e->version, ver);
    assert_string_equal(e->url, "https://example.com/keep");
    sl_endpoint_release(e);

    /* a record the registry does not know (e.g. a delete whose publish failed) */
    produce_endpoint(stray, stray, &E.mk, "https://stray.example/");
    sl_endpoint_release(wait_for(stray, exists, NULL));

    sl_endpoints_stats(E.t, &st);
    r = CTL("endpoints", "sync", "--json");
    assert_int_equal(r->code, 0);
    json_t *j = parse_json(r->out);
    assert_true(json_integer_value(json_object_get(j, "tombstones")) >= 1);
    assert_true(json_integer_value(json_object_get(j, "published")) >= 1);
    json_decref(j);
    free(r);
    assert_null(wait_for(stray, NULL, NULL));
    /* the republished record for id is byte-identical to its last good one: a no-op */
    struct sl_endpoints_stats st2;
    int64_t t0 = sl_mono_ms();
    do {
        sl_endpoints_stats(E.t, &st2);
    } while (st2.unchanged == st.unchanged && sl_mono_ms() - t0 < E.wait_ms);
    assert_true(st2.unchanged > st.unchanged);
    e = sl_endpoints_get(E.t, id);
    assert_non_null(e);
    assert_int_equal(e->version, ver);
    sl_endpoint_release(e);
    /* ...which is the latest record of id again: id leaves the refused list (step 7 put it
     * there; a no-op record used to leave it listed) */
    t0 = sl_mono_ms();
    while (sl_endpoints_refused(E.t, NULL, NULL) != 0 && sl_mono_ms() - t0 < E.wait_ms) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(sl_endpoints_refused(E.t, NULL, NULL), 0);
}

/* list redacts URLs and never prints secrets; show prints the URL; --show-secrets the rest. */
static void test_output(void **state)
{
    (void)state;
    char id[80];
    id_of(id, sizeof(id), "out");
    struct run *r =
        CTL("endpoints", "add", "--id", id, "--url", "https://example.com/h?token=QSEKRET123",
            "--header", "Authorization: Bearer HDRSEKRET", "--json");
    assert_int_equal(r->code, 0);
    json_t *j = parse_json(r->out);
    char secret[SL_SECRET_STR_MAX];
    snprintf(secret, sizeof(secret), "%s", jstr(j, "secret"));
    json_decref(j);
    free(r);

    r = CTL("endpoints", "list");
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, id));
    assert_non_null(strstr(r->out, "https://example.com/h"));
    assert_null(strstr(r->out, "QSEKRET123"));
    assert_null(strstr(r->out, "HDRSEKRET"));
    assert_null(strstr(r->out, "whsec_"));
    free(r);

    r = CTL("endpoints", "list", "--json");
    assert_int_equal(r->code, 0);
    j = parse_json(r->out);
    assert_true(json_is_array(j));
    bool found = false;
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *o = json_array_get(j, i);
        if (strcmp(jstr(o, "id"), id) == 0) {
            assert_string_equal(jstr(o, "url"), "https://example.com/h");
            found = true;
        }
    }
    assert_true(found);
    json_decref(j);
    free(r);

    r = CTL("endpoints", "show", id);
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "https://example.com/h?token=QSEKRET123"));
    assert_non_null(strstr(r->out, "Authorization"));
    assert_null(strstr(r->out, "HDRSEKRET"));
    assert_null(strstr(r->out, "whsec_"));
    free(r);

    r = CTL("endpoints", "show", id, "--show-secrets", "--json");
    assert_int_equal(r->code, 0);
    j = parse_json(r->out);
    json_t *secs = json_object_get(j, "secrets");
    assert_int_equal(json_array_size(secs), 1);
    assert_string_equal(jstr(json_array_get(secs, 0), "secret"), secret);
    assert_string_equal(jstr(json_array_get(json_object_get(j, "headers"), 0), "value"),
                        "Bearer HDRSEKRET");
    json_decref(j);
    free(r);

    /* help lists everything; config flags work through sluicectl */
    r = CTL("--help");
    assert_int_equal(r->code, 0);
    static const char *words[] = {"endpoints add",    "endpoints show",    "endpoints list",
                                  "endpoints update", "endpoints disable", "endpoints enable",
                                  "rotate-secret",    "endpoints delete",  "endpoints sync",
                                  "--overlap-s",      "--show-secrets",    "--print-config"};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (!strstr(r->out, words[i]))
            fail_msg("sluicectl --help does not mention %s", words[i]);
    }
    free(r);
    r = CTL("endpoints", "--help");
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "--breaker-cooldown-ms"));
    free(r);
    r = CTL("endpoints", "add", "--help");
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "--content-type"));
    free(r);
    r = CTL("endpoints", "list", "--print-config");
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, E.topic));
    assert_null(strstr(r->out, E.mkhex));
    free(r);
}

/*
 * Kafka unreachable: the registry change is committed, the command fails with exit 1 and
 * says it was not published (the new secret is still shown, once); consumers do not see
 * it; `endpoints sync` then publishes it.
 */
static void test_publish_failure_then_sync(void **state)
{
    (void)state;
    char id[80];
    id_of(id, sizeof(id), "unpublished");
    struct run *r = ctl_env("SLUICE_KAFKA_BROKERS=127.0.0.1:1", "endpoints", "add", "--id", id,
                            "--url", "https://example.com/late", "--json", (const char *)NULL);
    assert_int_equal(r->code, 1);
    assert_non_null(strstr(r->err, "NOT published"));
    assert_non_null(strstr(r->err, "endpoints sync"));
    json_t *j = parse_json(r->out);
    char secret[SL_SECRET_STR_MAX];
    snprintf(secret, sizeof(secret), "%s", jstr(j, "secret"));
    assert_true(json_is_false(json_object_get(j, "published")));
    json_decref(j);
    free(r);
    assert_int_equal(pg_int("select count(*) from endpoints where id = $1", id), 1);
    assert_null(sl_endpoints_get(E.t, id));

    r = CTL("endpoints", "sync");
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "published"));
    free(r);
    const struct sl_endpoint *e = wait_for(id, exists, NULL);
    char got[SL_SECRET_STR_MAX];
    secret_str(e, 0, got, sizeof(got));
    assert_string_equal(got, secret);
    sl_endpoint_release(e);
}

/* ==== The registry's change operations, called directly (as sluice-api does) ==== */

static bool has_types(const struct sl_endpoint *e, const void *arg)
{
    return e->n_types == *(const size_t *)arg;
}

static bool name_is(const struct sl_endpoint *e, const void *arg)
{
    return strcmp(e->name, (const char *)arg) == 0;
}

/* Advisory locks the registry connection still holds (the operations release theirs). */
static int64_t advisory_locks_held(PGconn *pg)
{
    PGresult *res = PQexec(pg, "select count(*) from pg_locks where locktype = 'advisory' and "
                               "pid = pg_backend_pid()");
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    int64_t n = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return n;
}

struct set_name {
    const char *name; /* new display name; NULL = leave the row alone */
    int refuse;       /* non-zero: refuse with this code */
    bool change_id;   /* try to change the id */
};

static int set_name_fn(void *opaque, struct sl_reg_ep *ep, sl_err_t *err)
{
    const struct set_name *s = opaque;
    if (s->refuse)
        return sl_err_set(err, s->refuse, "refused by the test");
    if (s->change_id) {
        free(ep->id);
        ep->id = sl_xstrdup("other-id");
    }
    if (s->name) {
        free(ep->name);
        ep->name = sl_xstrdup(s->name);
    }
    return 0;
}

/* A new row for sl_reg_create: id and URL, the rest defaults (NULL strings allowed). */
static void new_row(struct sl_reg_ep *ep, const char *id)
{
    memset(ep, 0, sizeof(*ep));
    ep->id = sl_xstrdup(id);
    ep->url = sl_xstrdup("https://example.com/api-made");
    ep->enabled = true;
}

static void test_registry_ops(void **state)
{
    (void)state;
    char id[80], id2[80], whsec[SL_SECRET_STR_MAX];
    struct sl_reg_pub pub;
    struct sl_reg_result res;
    struct sl_reg_ep ep, out;
    sl_err_t err;
    id_of(id, sizeof(id), "api1");
    PGconn *pg = sl_reg_db_open(&E.cfg, &err);
    if (!pg)
        fail_msg("sl_reg_db_open: %s", err.msg);
    sl_reg_pub_init(&pub, &E.cfg, &E.mk); /* opened lazily by the first publish */

    /* create: committed, published, read back, visible to consumers with types/channels */
    const char *types[] = {"order.*", "invoice.paid"};
    const char *chans[] = {"tenant:1"};
    new_row(&ep, id);
    sl_reg_ep_set_types(&ep, types, 2);
    sl_reg_ep_set_channels(&ep, chans, 1);
    int rc = sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err);
    if (rc != 0)
        fail_msg("sl_reg_create: %s", err.msg);
    assert_true(res.changed && res.committed && res.published);
    assert_non_null(pub.rk);
    assert_int_equal(strncmp(whsec, "whsec_", 6), 0);
    assert_int_equal(ep.n_secrets, 1);
    assert_true(ep.created_ms > 0 && ep.updated_ms > 0);
    assert_int_equal(ep.n_types, 2);
    assert_string_equal(ep.types[0], "order.*");
    assert_string_equal(ep.channels[0], "tenant:1");
    assert_string_equal(ep.name, "");
    size_t two = 2;
    const struct sl_endpoint *e = wait_for(id, has_types, &two);
    char got[SL_SECRET_STR_MAX];
    secret_str(e, 0, got, sizeof(got));
    assert_string_equal(got, whsec);
    const char *ev_ch[] = {"tenant:1"};
    assert_true(sl_endpoint_subscribed(e, "order.created", 13, ev_ch, 1));
    assert_false(sl_endpoint_subscribed(e, "order", 5, ev_ch, 1));
    assert_false(sl_endpoint_subscribed(e, "order.created", 13, NULL, 0));
    uint64_t ver = e->version;
    sl_endpoint_release(e);
    assert_int_equal(advisory_locks_held(pg), 0);
    assert_int_equal(pg_int("select cardinality(event_types) from endpoints where id = $1", id), 2);
    sl_reg_ep_fini(&ep);

    /* create refusals: nothing written, res all false, no secret handed out */
    new_row(&ep, id);
    assert_int_equal(sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err), SL_ESTATE);
    assert_false(res.changed || res.committed || res.published);
    assert_string_equal(whsec, "");
    sl_reg_ep_fini(&ep);
    id_of(id2, sizeof(id2), "api2");
    new_row(&ep, id2);
    ep.num[SL_REG_N_TIMEOUT] = 1000;
    ep.num[SL_REG_N_CONN_TIMEOUT] = 2000;
    assert_int_equal(sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "conn_timeout_ms"));
    ep.num[SL_REG_N_CONN_TIMEOUT] = 0;
    ep.num[SL_REG_N_MAX_ATTEMPTS] = 1000;
    assert_int_equal(sl_reg_ep_check(&ep, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "\"max_attempts\""));
    ep.num[SL_REG_N_MAX_ATTEMPTS] = 0;
    const char *dup[] = {"tenant:1", "tenant:1"};
    sl_reg_ep_set_channels(&ep, dup, 2);
    assert_int_equal(sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "field \"channels\": entry 1 repeats entry 0"));
    sl_reg_ep_set_channels(&ep, NULL, 0);
    free(ep.ct);
    ep.ct = sl_xstrdup("text/\x01");
    assert_int_equal(sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "field \"content_type\""));
    free(ep.url);
    ep.url = sl_xstrdup("ftp://example.com/x");
    assert_int_equal(sl_reg_ep_check(&ep, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "field \"url\""));
    sl_reg_ep_fini(&ep);
    assert_int_equal(pg_int("select count(*) from endpoints where id = $1", id2), 0);
    assert_int_equal(advisory_locks_held(pg), 0);

    /* update: a change, a no-op, refusals, an unknown id */
    struct set_name sn = {"renamed by api", 0, false};
    rc = sl_reg_update(pg, &pub, id, set_name_fn, &sn, &out, &res, &err);
    if (rc != 0)
        fail_msg("sl_reg_update: %s", err.msg);
    assert_true(res.changed && res.committed && res.published);
    assert_string_equal(out.name, "renamed by api");
    assert_int_equal(out.n_types, 2); /* untouched fields kept */
    sl_reg_ep_fini(&out);
    e = wait_for(id, name_is, "renamed by api");
    assert_true(e->version > ver);
    ver = e->version;
    sl_endpoint_release(e);
    int64_t recs = topic_records();
    rc = sl_reg_update(pg, &pub, id, set_name_fn, &sn, &out, &res, &err); /* same name again */
    assert_int_equal(rc, 0);
    assert_false(res.changed || res.committed || res.published);
    assert_string_equal(out.name, "renamed by api");
    sl_reg_ep_fini(&out);
    struct set_name refuse = {"never", SL_EINVAL, false};
    assert_int_equal(sl_reg_update(pg, &pub, id, set_name_fn, &refuse, &out, &res, &err),
                     SL_EINVAL);
    assert_non_null(strstr(err.msg, "refused by the test"));
    assert_false(res.committed);
    sl_reg_ep_fini(&out);
    struct set_name reid = {NULL, 0, true};
    assert_int_equal(sl_reg_update(pg, &pub, id, set_name_fn, &reid, &out, &res, &err), SL_EINVAL);
    sl_reg_ep_fini(&out);
    assert_int_equal(sl_reg_update(pg, &pub, id2, set_name_fn, &sn, &out, &res, &err),
                     SL_ENOTFOUND);
    sl_reg_ep_fini(&out);
    assert_int_equal(topic_records(), recs); /* nothing published by the four above */
    char *name = pg_value("select name from endpoints where id = $1", id);
    assert_string_equal(name, "renamed by api");
    free(name);
    assert_int_equal(advisory_locks_held(pg), 0);

    /* disable on a consumer's behalf (the recorder's path), idempotent */
    bool changed = false;
    assert_int_equal(sl_reg_disable(pg, &pub, id, "410 Gone", sl_now_ms(), &changed, &err), 0);
    assert_true(changed);
    sl_endpoint_release(wait_for(id, is_disabled, NULL));
    assert_int_equal(sl_reg_disable(pg, &pub, id, "410 Gone", sl_now_ms(), &changed, &err), 0);
    assert_false(changed);

    /* rotate: a given secret becomes current, the previous one keeps signing */
    struct sl_secret mine;
    char mine_s[SL_SECRET_STR_MAX];
    assert_int_equal(sl_secret_generate(&mine, NULL), 0);
    assert_int_equal(sl_secret_format(&mine, mine_s, sizeof(mine_s), NULL), 0);
    assert_int_equal(sl_reg_rotate(pg, &pub, &E.mk, id, -1, &mine, whsec, &out, &res, &err),
                     SL_EINVAL);
    sl_reg_ep_fini(&out);
    rc = sl_reg_rotate(pg, &pub, &E.mk, id, 3600, &mine, whsec, &out, &res, &err);
    if (rc != 0)
        fail_msg("sl_reg_rotate: %s", err.msg);
    assert_true(res.changed && res.committed && res.published);
    assert_string_equal(whsec, mine_s);
    assert_int_equal(out.n_secrets, 2);
    assert_int_equal(out.secrets[0].exp_ms, 0);
    sl_reg_ep_fini(&out);
    sl_secret_fini(&mine);
    size_t n2 = 2;
    sl_endpoint_release(wait_for(id, has_n_secrets, &n2));
    assert_int_equal(sl_reg_rotate(pg, &pub, &E.mk, id2, 0, NULL, whsec, &out, &res, &err),
                     SL_ENOTFOUND);
    assert_string_equal(whsec, "");
    sl_reg_ep_fini(&out);

    /* paging: our ids in order, limit respected, the page after the last id continues */
    char id3[80], id4[80];
    id_of(id3, sizeof(id3), "api3");
    id_of(id4, sizeof(id4), "api4");
    const char *more[] = {id2, id3, id4};
    for (size_t i = 0; i < 3; i++) {
        new_row(&ep, more[i]);
        if (sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err) != 0)
            fail_msg("sl_reg_create %s: %s", more[i], err.msg);
        sl_reg_ep_fini(&ep);
    }
    struct sl_reg_ep *page = NULL;
    size_t n = 0;
    assert_int_equal(sl_reg_db_page(pg, NULL, 0, &page, &n, &err), SL_EINVAL);
    char after[80];
    snprintf(after, sizeof(after), "%sapi", E.prefix); /* sorts before "...api1" */
    const char *want[] = {id, id2, id3, id4};
    size_t seen = 0;
    while (seen < 4) {
        assert_int_equal(sl_reg_db_page(pg, after, 3, &page, &n, &err), 0);
        assert_true(n >= 1 && n <= 3);
        for (size_t i = 0; i < n && seen < 4; i++) {
            assert_string_equal(page[i].id, want[seen++]);
            assert_true(page[i].n_secrets >= 1);
        }
        assert_true(strcmp(page[0].id, after) > 0);
        snprintf(after, sizeof(after), "%s", page[n - 1].id);
        for (size_t i = 0; i < n; i++)
            sl_reg_ep_fini(&page[i]);
        free(page);
    }
    assert_int_equal(sl_reg_db_page(pg, id4, 1, &page, &n, &err), 0);
    assert_true(n == 0 || strcmp(page[0].id, id4) > 0);
    for (size_t i = 0; i < n; i++)
        sl_reg_ep_fini(&page[i]);
    free(page);

    /* committed but not published: a publisher on an unreachable broker, short flush */
    const char *brokers = getenv("SLUICE_KAFKA_BROKERS");
    char *saved = sl_xstrdup(brokers);
    struct sl_config bad_cfg;
    setenv("SLUICE_KAFKA_BROKERS", "127.0.0.1:1", 1);
    assert_int_equal(sl_cfg_load(&bad_cfg, NULL, NULL, stderr), 0);
    setenv("SLUICE_KAFKA_BROKERS", saved, 1);
    free(saved);
    struct sl_reg_pub bad;
    sl_reg_pub_init(&bad, &bad_cfg, &E.mk);
    bad.flush_timeout_ms = 1000;
    struct set_name sn2 = {"committed, not published", 0, false};
    rc = sl_reg_update(pg, &bad, id, set_name_fn, &sn2, &out, &res, &err);
    assert_int_equal(rc, SL_EKAFKA);
    assert_true(res.changed && res.committed);
    assert_false(res.published);
    assert_non_null(strstr(err.msg, "committed"));
    assert_non_null(strstr(err.msg, "NOT published"));
    assert_string_equal(out.name, "committed, not published"); /* OUT set as on success */
    sl_reg_ep_fini(&out);
    name = pg_value("select name from endpoints where id = $1", id);
    assert_string_equal(name, "committed, not published");
    free(name);
    assert_int_equal(advisory_locks_held(pg), 0);
    assert_int_equal(sl_reg_remove(pg, &bad, id4, &res, &err), SL_EKAFKA);
    assert_true(res.committed && !res.published);
    sl_reg_pub_close(&bad);
    sl_cfg_fini(&bad_cfg);
    e = sl_endpoints_get(E.t, id);
    assert_non_null(e);
    assert_string_equal(e->name, "renamed by api"); /* consumers still see the old state */
    sl_endpoint_release(e);
    /* doing the change again finds nothing to change and publishes nothing; republishing the
     * committed state (and the removal's tombstone) is the repair */
    struct set_name sn3 = {"committed, not published", 0, false};
    assert_int_equal(sl_reg_update(pg, &pub, id, set_name_fn, &sn3, &out, &res, &err), 0);
    assert_false(res.changed || res.published);
    sl_reg_ep_fini(&out);
    assert_int_equal(sl_reg_republish(pg, &pub, id, &err), 0);
    e = wait_for(id, name_is, "committed, not published");
    sl_endpoint_release(e);
    assert_int_equal(sl_reg_republish(pg, &pub, id4, &err), 0);
    assert_null(wait_for(id4, NULL, NULL));
    assert_int_equal(advisory_locks_held(pg), 0);

    /* the database's clock stepped back since the last change (its updated_at is an hour
     * ahead): the next change's record is still newer than the one in force, so consumers
     * take it instead of refusing it as stale */
    assert_int_equal(pg_int("with u as (update endpoints set updated_at = now() + interval "
                            "'1 hour' where id = $1 returning 1) select count(*) from u",
                            id),
                     1);
    int64_t ahead_ms = pg_int("select floor(extract(epoch from updated_at) * 1000)::bigint "
                              "from endpoints where id = $1",
                              id);
    struct set_name later = {"after the clock stepped back", 0, false};
    assert_int_equal(sl_reg_update(pg, &pub, id, set_name_fn, &later, &out, &res, &err), 0);
    assert_true(res.published);
    assert_true(out.updated_ms > ahead_ms);
    sl_reg_ep_fini(&out);
    sl_endpoint_release(wait_for(id, name_is, "after the clock stepped back"));

    /* remove: tombstone visible; a second remove finds nothing */
    for (size_t i = 0; i < 3; i++) {
        const char *x = i == 0 ? id : i == 1 ? id2 : id3;
        rc = sl_reg_remove(pg, &pub, x, &res, &err);
        if (rc != 0)
            fail_msg("sl_reg_remove %s: %s", x, err.msg);
        assert_true(res.changed && res.committed && res.published);
        assert_null(wait_for(x, NULL, NULL));
    }
    assert_int_equal(sl_reg_remove(pg, &pub, id, &res, &err), SL_ENOTFOUND);
    assert_false(res.committed);
    assert_int_equal(advisory_locks_held(pg), 0);
    sl_reg_pub_close(&pub);
    PQfinish(pg);
}

/* A topic that does not exist is a clear start-up error, not a hang or an empty table. */
/* sl_reg_db_page on a thread of its own (its connection is its own). */
struct page_call {
    PGconn *pg;
    const char *after;
    struct sl_reg_ep *page;
    size_t n;
    int rc;
    sl_err_t err;
};

static void *page_main(void *arg)
{
    struct page_call *c = arg;
    c->rc = sl_reg_db_page(c->pg, c->after, 2, &c->page, &c->n, &c->err);
    return NULL;
}

static void exec_ok(PGconn *pg, const char *sql, const char *p1)
{
    const char *params[1] = {p1};
    PGresult *res = PQexecParams(pg, sql, p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(res));
    PQclear(res);
}

/*
 * A page's secrets are those of the rows it returned. The page [zzB, zzD] is read; while its
 * secrets query waits for a lock another session holds on endpoint_secrets, that session adds
 * zzC between them and commits. The secrets query then runs on a snapshot that has zzC: read by
 * the page's own query again (as it was) it covered zzB and zzC, and zzD came back without
 * secrets.
 */
static void test_page_reads_the_secrets_of_its_own_rows(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_reg_pub pub;
    struct sl_reg_result res;
    struct sl_reg_ep ep;
    char b[80], c[80], d[80], after[80], whsec[SL_SECRET_STR_MAX];
    id_of(b, sizeof(b), "zzB");
    id_of(c, sizeof(c), "zzC");
    id_of(d, sizeof(d), "zzD");
    id_of(after, sizeof(after), "zz");
    PGconn *pg = sl_reg_db_open(&E.cfg, &err);
    if (!pg)
        fail_msg("sl_reg_db_open: %s", err.msg);
    sl_reg_pub_init(&pub, &E.cfg, &E.mk);
    const char *two[] = {b, d};
    for (size_t i = 0; i < 2; i++) {
        new_row(&ep, two[i]);
        if (sl_reg_create(pg, &pub, &E.mk, &ep, NULL, whsec, &res, &err) != 0)
            fail_msg("sl_reg_create %s: %s", two[i], err.msg);
        sl_reg_ep_fini(&ep);
    }
    exec_ok(E.pg, "begin", NULL);
    exec_ok(E.pg, "lock table endpoint_secrets in access exclusive mode", NULL);
    struct page_call call = {.pg = pg, .after = after};
    pthread_t thr;
    assert_int_equal(pthread_create(&thr, NULL, page_main, &call), 0);
    char pid[16];
    (void)snprintf(pid, sizeof(pid), "%d", PQbackendPID(pg));
    int waited = 0;
    for (;; waited += 10) { /* until the page's secrets query waits for the lock */
        exec_ok(E.pg, "select pg_stat_clear_snapshot()", NULL);
        if (pg_int("select count(*) from pg_stat_activity where pid = $1::int and "
                   "wait_event_type = 'Lock'",
                   pid) == 1)
            break;
        if (waited > 10000 * (E.wait_ms / 2000))
            fail_msg("the page's secrets query never waited for the lock");
        struct timespec ts = {0, 10 * 1000000L};
        (void)nanosleep(&ts, NULL);
    }
    exec_ok(E.pg, "insert into endpoints (id, url) values ($1, 'https://example.com/zz')", c);
    exec_ok(E.pg, "commit", NULL);
    assert_int_equal(pthread_join(thr, NULL), 0);
    if (call.rc != 0)
        fail_msg("sl_reg_db_page: %s", call.err.msg);
    assert_int_equal(call.n, 2);
    assert_string_equal(call.page[0].id, b);
    assert_string_equal(call.page[1].id, d);
    assert_int_equal(call.page[0].n_secrets, 1);
    assert_int_equal(call.page[1].n_secrets, 1);
    for (size_t i = 0; i < call.n; i++)
        sl_reg_ep_fini(&call.page[i]);
    free(call.page);
    sl_reg_pub_close(&pub);
    PQfinish(pg);
}

static void test_open_missing_topic(void **state)
{
    (void)state;
    struct sl_config cfg;
    sl_endpoints_t *t = NULL;
    sl_err_t err;
    char topic[80];
    snprintf(topic, sizeof(topic), "%s.missing", E.topic);
    setenv("SLUICE_TOPIC_ENDPOINTS", topic, 1);
    int nerr = sl_cfg_load(&cfg, NULL, NULL, stderr);
    setenv("SLUICE_TOPIC_ENDPOINTS", E.topic, 1);
    assert_int_equal(nerr, 0);
    int64_t t0 = sl_mono_ms();
    assert_int_equal(sl_endpoints_open(&cfg, &E.mk, 30000, &t, &err), SL_ENOTFOUND);
    assert_true(sl_mono_ms() - t0 < 20000);
    assert_null(t);
    assert_non_null(strstr(err.msg, topic));
    sl_cfg_fini(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_reload_from_beginning),
        cmocka_unit_test(test_bad_records_and_sync),
        cmocka_unit_test(test_output),
        cmocka_unit_test(test_publish_failure_then_sync),
        cmocka_unit_test(test_registry_ops),
        cmocka_unit_test(test_page_reads_the_secrets_of_its_own_rows),
        cmocka_unit_test(test_open_missing_topic),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
