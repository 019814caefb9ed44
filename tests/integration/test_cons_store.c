/*
 * cons_store against a real redis-server (private, started here): retry schedule with binary
 * bodies, due order, leases that hide a job until they expire, stale tokens, new-job
 * idempotence, orphan cleanup, counts, delivered markers, the breaker state machine, the rate
 * bucket, idle expiry of breaker and rate keys, script cache loss (SCRIPT FLUSH, restart) and
 * connection loss. The store keeps time on Redis's clock (TIME inside its scripts), which a
 * test cannot set: stored times are checked against TIME read around the call (rnow), and
 * time "passes" by moving the stored times back (age_*), so no test sleeps. A separate
 * admin connection inspects the raw keys.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_record.h"
#include "consumer/cons_store.h"
#include "sl_testenv.h"

#define LONG INT64_C(60000) /* ms; a lease or delay no test outlives in real time */

static struct sl_test_redis g_redis;

struct fx {
    sl_redis_t *r;     /* the store's connection */
    redisContext *adm; /* admin connection for inspection */
};

/* ==== Helpers ==== */

static redisContext *admin_connect(void)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", g_redis.port, tv);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

static redisReply *admv(struct fx *f, const char *fmt, va_list ap)
{
    redisReply *rep = redisvCommand(f->adm, fmt, ap);
    assert_non_null(rep);
    assert_int_not_equal(rep->type, REDIS_REPLY_ERROR);
    return rep;
}

/* Admin command (printf-like as redisCommand); the reply must not be an error. */
static redisReply *adm(struct fx *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = admv(f, fmt, ap);
    va_end(ap);
    return rep;
}

/* Admin command with an integer reply. */
static long long adm_int(struct fx *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = admv(f, fmt, ap);
    va_end(ap);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

/* A numeric field of INFO. */
static long long info_field(struct fx *f, const char *section, const char *field)
{
    redisReply *rep = adm(f, "INFO %s", section);
    const char *p = strstr(rep->str, field);
    assert_non_null(p);
    long long v = strtoll(p + strlen(field) + 1, NULL, 10);
    freeReplyObject(rep);
    return v;
}

/* ZSCORE as an integer, -1 when the member is absent. */
static int64_t zscore(struct fx *f, uint32_t shard, const char *id)
{
    redisReply *rep = adm(f, "ZSCORE sluice:retry:{%u} %s", shard, id);
    int64_t v = -1;
    if (rep->type == REDIS_REPLY_STRING)
        v = strtoll(rep->str, NULL, 10);
    else
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);
    return v;
}

/* Redis's clock (TIME), unix ms. */
static int64_t rnow(struct fx *f)
{
    redisReply *rep = adm(f, "TIME");
    assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
    assert_int_equal(rep->elements, 2);
    int64_t v = strtoll(rep->element[0]->str, NULL, 10) * 1000 +
                strtoll(rep->element[1]->str, NULL, 10) / 1000;
    freeReplyObject(rep);
    return v;
}

/* Run an admin Lua script with one key and one integer argument. */
static void adm_eval(struct fx *f, const char *lua, const char *key, long long arg)
{
    freeReplyObject(adm(f, "EVAL %s 1 %s %lld", lua, key, arg));
}

/* Let ms pass for the schedule of shard: every score (due time, lease expiry) moves back. */
static void age_sched(struct fx *f, uint32_t shard, int64_t ms)
{
    char key[48];
    (void)snprintf(key, sizeof(key), "sluice:retry:{%u}", shard);
    adm_eval(f,
             "local m = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES') "
             "for i = 1, #m, 2 do redis.call('ZADD', KEYS[1], "
             "string.format('%d', tonumber(m[i + 1]) - tonumber(ARGV[1])), m[i]) end",
             key, (long long)ms);
}

/* Let ms pass for ep's breaker: its stored times move back. */
static void age_brk(struct fx *f, const char *ep, int64_t ms)
{
    char key[160];
    (void)snprintf(key, sizeof(key), "sluice:breaker:{%s}", ep);
    adm_eval(f,
             "for _, k in ipairs({'opened_at_ms', 'probe_until_ms', 'open_since_ms'}) do "
             "if redis.call('HEXISTS', KEYS[1], k) == 1 then redis.call('HINCRBY', KEYS[1], k, "
             "string.format('%d', -tonumber(ARGV[1]))) end end",
             key, (long long)ms);
}

/* PTTL of a key, ms (-1 no expiry, -2 no key). */
static long long pttl(struct fx *f, const char *key)
{
    return adm_int(f, "PTTL %s", key);
}

/* The lease token stored for id in shard, or "" when none. */
static void lease_of(struct fx *f, uint32_t shard, const char *id, char out[64])
{
    redisReply *rep = adm(f, "HGET sluice:lease:{%u} %s", shard, id);
    out[0] = '\0';
    if (rep->type == REDIS_REPLY_STRING)
        (void)snprintf(out, 64, "%s", rep->str);
    else
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);
}

static void assert_body(struct fx *f, uint32_t shard, const char *id, const void *body, size_t len)
{
    redisReply *rep = adm(f, "GET sluice:job:{%u}:%s", shard, id);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_int_equal(rep->len, len);
    assert_memory_equal(rep->str, body, len);
    freeReplyObject(rep);
}

static void job_id(int ep, int ev, char out[41])
{
    char e[32], v[32];
    (void)snprintf(e, sizeof(e), "ep_%d", ep);
    (void)snprintf(v, sizeof(v), "evt_%d", ev);
    cons_store_job_id(e, v, out);
}

/* rdb_changes_since_last_save counts every write, so "no write happened" is checkable. */
static long long dirty(struct fx *f)
{
    return info_field(f, "persistence", "rdb_changes_since_last_save");
}

static void kill_clients(struct fx *f)
{
    /* SKIPME yes (the default) keeps the admin connection. */
    redisReply *rep = adm(f, "CLIENT KILL TYPE normal");
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    assert_true(rep->integer >= 1);
    freeReplyObject(rep);
}

/* Stop redis-server and start it again on the same port and dir (AOF keeps the data,
 * the script cache is gone, every client connection is dropped). */
static void restart_same_port(void)
{
    kill(g_redis.pid, SIGTERM);
    waitpid(g_redis.pid, NULL, 0);
    char port[16];
    (void)snprintf(port, sizeof(port), "%d", g_redis.port);
    g_redis.pid = fork();
    if (g_redis.pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir",
               g_redis.dir, "--appendonly", "yes", "--save", "", (char *)NULL);
        _exit(127);
    }
    assert_true(g_redis.pid > 0);
    for (int i = 0; i < 200; i++) {
        struct timeval tv = {1, 0};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", g_redis.port, tv);
        if (c && !c->err) {
            redisReply *rep = redisCommand(c, "PING");
            int ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            if (ok)
                return;
        } else if (c) {
            redisFree(c);
        }
        usleep(25000);
    }
    fail_msg("redis-server did not come back on port %d", g_redis.port);
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    f->adm = admin_connect();
    redisReply *rep = adm(f, "FLUSHALL");
    freeReplyObject(rep);
    sl_err_t err = {0};
    f->r = sl_redis_connect(g_redis.url, 2000, &err);
    if (!f->r)
        fail_msg("connect: %s", err.msg);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    sl_redis_close(f->r);
    redisFree(f->adm);
    free(f);
    return 0;
}

/* ==== Job ids ==== */

static void test_job_id_and_shard(void **state)
{
    (void)state;
    char id[41];
    cons_store_job_id("ep_1", "evt_1", id);
    /* printf 'ep_1\nevt_1' | sha1sum */
    assert_string_equal(id, "14e97ebdf8687a6793fef86b53ed197837910141");
    assert_int_equal(cons_store_shard(id, 1), 0);
    assert_int_equal(cons_store_shard(id, 16), 0x14e9 % 16);
    assert_int_equal(cons_store_shard(id, 1000), 0x14e9 % 1000);
    assert_int_equal(cons_store_shard(id, 0), 0);
    char other[41];
    cons_store_job_id("ep_1\nevt", "1", other); /* same bytes split differently */
    assert_string_not_equal(id, other);
}

/* ==== Retry schedule ==== */

static void test_round_trip_binary(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(1, 1, id);
    const unsigned char body[] = {0x82, 0x00, 'a', 0x00, 0x00, 0xff, 'b', 0x00, 0x0a, 0x00};
    int existed = -1;
    /* due a minute after Redis's now: the score is TIME + delay */
    int64_t t0 = rnow(f);
    assert_int_equal(
        cons_store_schedule(f->r, 1, id, body, sizeof(body), LONG, NULL, &existed, &err), 0);
    int64_t t1 = rnow(f);
    assert_int_equal(existed, 0);
    assert_body(f, 0, id, body, sizeof(body));
    assert_in_range(zscore(f, 0, id), t0 + LONG, t1 + LONG);
    assert_int_equal(cons_store_job_exists(f->r, 1, id, &err), 1);

    struct cons_claimed *c = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, 30000, 10, &c, &err), 0); /* not due */
    assert_null(c);
    age_sched(f, 0, LONG);
    t0 = rnow(f);
    int n = cons_store_claim(f->r, 0, 30000, 10, &c, &err);
    t1 = rnow(f);
    assert_int_equal(n, 1);
    assert_string_equal(c[0].job_id, id);
    assert_int_equal(strlen(c[0].token), CONS_TOKEN_LEN);
    assert_int_equal(strspn(c[0].token, "0123456789abcdef"), CONS_TOKEN_LEN);
    assert_int_equal(c[0].shard, 0);
    assert_int_equal(c[0].body_len, sizeof(body));
    assert_memory_equal(c[0].body, body, sizeof(body));
    /* Leased, not removed: score = lease expiry on Redis's clock, token in the lease hash. */
    assert_in_range(zscore(f, 0, id), t0 + 30000, t1 + 30000);
    char tok[64];
    lease_of(f, 0, id, tok);
    assert_string_equal(tok, c[0].token);
    assert_int_equal(cons_store_job_exists(f->r, 1, id, &err), 1);

    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), 0);
    assert_int_equal(adm_int(f, "EXISTS sluice:job:{0}:%s", id), 0);
    assert_int_equal(adm_int(f, "ZCARD sluice:retry:{0}"), 0);
    assert_int_equal(adm_int(f, "HLEN sluice:lease:{0}"), 0);
    assert_int_equal(cons_store_job_exists(f->r, 1, id, &err), 0);
    cons_store_claimed_free(c, n);

    /* An empty body is a body too; a delay of 0 or less is due at once, at TIME. */
    job_id(1, 2, id);
    t0 = rnow(f);
    assert_int_equal(cons_store_schedule(f->r, 1, id, NULL, 0, -LONG, NULL, NULL, &err), 0);
    t1 = rnow(f);
    assert_in_range(zscore(f, 0, id), t0, t1);
    n = cons_store_claim(f->r, 0, 1000, 10, &c, &err);
    assert_int_equal(n, 1);
    assert_int_equal(c[0].body_len, 0);
    cons_store_claimed_free(c, n);
}

static void test_due_order_and_max(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    const int64_t due[5] = {50, 10, 40, 20, 100}; /* s after Redis's now */
    char ids[5][41];
    for (int i = 0; i < 5; i++) {
        job_id(2, i, ids[i]);
        char body[8];
        (void)snprintf(body, sizeof(body), "b%d", i);
        assert_int_equal(cons_store_schedule(f->r, 1, ids[i], body, strlen(body), due[i] * 1000,
                                             NULL, NULL, &err),
                         0);
    }
    struct cons_claimed *c = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, 10000, 3, &c, &err), 0);
    age_sched(f, 0, 60000); /* a minute later: all but +100 s are due */
    int n = cons_store_claim(f->r, 0, 10000, 3, &c, &err);
    assert_int_equal(n, 3);
    assert_string_equal(c[0].job_id, ids[1]); /* due +10 */
    assert_string_equal(c[1].job_id, ids[3]); /* due +20 */
    assert_string_equal(c[2].job_id, ids[2]); /* due +40 */
    assert_memory_equal(c[0].body, "b1", 2);
    /* One token per claim call. */
    assert_string_equal(c[0].token, c[2].token);
    cons_store_claimed_free(c, n);

    n = cons_store_claim(f->r, 0, 10000, 3, &c, &err);
    assert_int_equal(n, 1);
    assert_string_equal(c[0].job_id, ids[0]); /* due +50; +100 is not due yet */
    cons_store_claimed_free(c, n);
    assert_int_equal(cons_store_claim(f->r, 0, 10000, 3, &c, &err), 0);
    assert_null(c);

    assert_int_equal(cons_store_claim(f->r, 0, 10000, 0, &c, &err), 0);
    assert_int_equal(cons_store_claim(f->r, 0, 10000, -1, &c, &err), SL_EINVAL);
    assert_int_equal(cons_store_claim(f->r, 0, 10000, CONS_STORE_CLAIM_MAX + 1, &c, &err),
                     SL_EINVAL);
    assert_int_equal(cons_store_claim(f->r, 0, 0, 1, &c, &err), SL_EINVAL);
    assert_null(c);
}

static void test_lease_hides_then_expires(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(3, 1, id);
    assert_int_equal(cons_store_schedule(f->r, 1, id, "body", 4, 0, NULL, NULL, &err), 0);
    struct cons_claimed *a = NULL, *b = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &a, &err), 1);
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &b, &err), 0);
    assert_null(b);
    age_sched(f, 0, LONG - 5000); /* 5 s of the lease left */
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &b, &err), 0);
    /* Lease expired (score <= TIME): the job comes back under a new token. */
    age_sched(f, 0, 5000);
    int64_t t0 = rnow(f);
    assert_int_equal(cons_store_claim(f->r, 0, 500, 10, &b, &err), 1);
    int64_t t1 = rnow(f);
    assert_string_equal(b[0].job_id, id);
    assert_string_not_equal(b[0].token, a[0].token);
    assert_memory_equal(b[0].body, "body", 4);
    assert_in_range(zscore(f, 0, id), t0 + 500, t1 + 500);
    cons_store_claimed_free(a, 1);
    cons_store_claimed_free(b, 1);
}

static void test_stale_token(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(4, 1, id);
    assert_int_equal(cons_store_schedule(f->r, 1, id, "v1\0x", 4, 0, NULL, NULL, &err), 0);
    struct cons_claimed *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &a, &err), 1);
    age_sched(f, 0, LONG);
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &b, &err), 1);
    int64_t b_score = zscore(f, 0, id);

    /* A (lease expired, job re-claimed by B) can neither complete nor reschedule. */
    sl_err_clear(&err);
    assert_int_equal(cons_store_complete(f->r, 1, id, a[0].token, &err), SL_ESTATE);
    assert_int_equal(err.code, SL_ESTATE);
    assert_non_null(strstr(err.msg, "complete job"));
    assert_null(strstr(err.msg, a[0].token));
    assert_null(strstr(err.msg, id));
    assert_int_equal(cons_store_schedule(f->r, 1, id, "v2", 2, 9000, a[0].token, NULL, &err),
                     SL_ESTATE);
    assert_non_null(strstr(err.msg, "reschedule"));
    assert_body(f, 0, id, "v1\0x", 4);
    assert_int_equal(zscore(f, 0, id), b_score);
    char tok[64];
    lease_of(f, 0, id, tok);
    assert_string_equal(tok, b[0].token);

    /* B reschedules: new body and due time, lease released. */
    int existed = -1;
    int64_t t0 = rnow(f);
    assert_int_equal(cons_store_schedule(f->r, 1, id, "v2", 2, 5000, b[0].token, &existed, &err),
                     0);
    int64_t t1 = rnow(f);
    assert_int_equal(existed, 0);
    assert_body(f, 0, id, "v2", 2);
    assert_in_range(zscore(f, 0, id), t0 + 5000, t1 + 5000);
    lease_of(f, 0, id, tok);
    assert_string_equal(tok, "");
    /* The released lease is gone for B too. */
    assert_int_equal(cons_store_complete(f->r, 1, id, b[0].token, &err), SL_ESTATE);
    assert_int_equal(cons_store_claim(f->r, 0, 500, 10, &c, &err), 0);
    age_sched(f, 0, 5000);
    assert_int_equal(cons_store_claim(f->r, 0, 500, 10, &c, &err), 1);
    assert_memory_equal(c[0].body, "v2", 2);
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), 0);
    assert_int_equal(cons_store_job_exists(f->r, 1, id, &err), 0);
    /* Completing twice is a lost lease, not a crash. */
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), SL_ESTATE);
    cons_store_claimed_free(a, 1);
    cons_store_claimed_free(b, 1);
    cons_store_claimed_free(c, 1);
}

static void test_schedule_existing(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(5, 1, id);
    int existed = -1;
    assert_int_equal(cons_store_schedule(f->r, 1, id, "old", 3, 0, NULL, &existed, &err), 0);
    assert_int_equal(existed, 0);
    int64_t score = zscore(f, 0, id);
    existed = -1;
    assert_int_equal(cons_store_schedule(f->r, 1, id, "new", 3, 999, NULL, &existed, &err), 0);
    assert_int_equal(existed, 1);
    assert_body(f, 0, id, "old", 3);
    assert_int_equal(zscore(f, 0, id), score);
    assert_int_equal(cons_store_schedule(f->r, 1, id, "new", 3, 999, NULL, NULL, &err), 0);
    assert_body(f, 0, id, "old", 3);

    /* While claimed, a Kafka redelivery leaves the lease and the body alone. */
    struct cons_claimed *c = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &c, &err), 1);
    score = zscore(f, 0, id);
    existed = -1;
    assert_int_equal(cons_store_schedule(f->r, 1, id, "new", 3, 0, NULL, &existed, &err), 0);
    assert_int_equal(existed, 1);
    char tok[64];
    lease_of(f, 0, id, tok);
    assert_string_equal(tok, c[0].token);
    assert_int_equal(zscore(f, 0, id), score);
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), 0);
    cons_store_claimed_free(c, 1);

    /* A new job drops a leftover lease entry, so an old token cannot complete it. */
    char stale[] = "0123456789abcdef0123456789abcdef";
    freeReplyObject(adm(f, "HSET sluice:lease:{0} %s %s", id, stale));
    existed = -1;
    assert_int_equal(cons_store_schedule(f->r, 1, id, "fresh", 5, 0, NULL, &existed, &err), 0);
    assert_int_equal(existed, 0);
    lease_of(f, 0, id, tok);
    assert_string_equal(tok, "");
    assert_int_equal(cons_store_complete(f->r, 1, id, stale, &err), SL_ESTATE);
    assert_body(f, 0, id, "fresh", 5);
}

static void test_missing_body_cleanup(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id1[41], id2[41];
    job_id(6, 1, id1);
    job_id(6, 2, id2);
    assert_int_equal(cons_store_schedule(f->r, 1, id1, "a", 1, 0, NULL, NULL, &err), 0);
    assert_int_equal(cons_store_schedule(f->r, 1, id2, "b", 1, 0, NULL, NULL, &err), 0);
    freeReplyObject(adm(f, "DEL sluice:job:{0}:%s", id1));
    freeReplyObject(adm(f, "HSET sluice:lease:{0} %s %s", id1, "0123456789abcdef0123456789abcdef"));
    assert_int_equal(cons_store_job_exists(f->r, 1, id1, &err), 0);
    struct cons_claimed *c = NULL;
    int n = cons_store_claim(f->r, 0, 500, 10, &c, &err);
    assert_int_equal(n, 1);
    assert_string_equal(c[0].job_id, id2);
    cons_store_claimed_free(c, n);
    assert_int_equal(zscore(f, 0, id1), -1);
    char tok[64];
    lease_of(f, 0, id1, tok);
    assert_string_equal(tok, "");
    assert_int_equal(adm_int(f, "ZCARD sluice:retry:{0}"), 1);
}

static void test_counts(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    /* 1500 shards = 3000 pipelined commands = 3 round trips of at most 1000. */
    const uint32_t nsh = 1500;
    int64_t sched = -1, leased = -1;
    assert_int_equal(cons_store_counts(f->r, nsh, &sched, &leased, &err), 0);
    assert_int_equal(sched, 0);
    assert_int_equal(leased, 0);
    char ids[20][41];
    for (int i = 0; i < 20; i++) {
        job_id(7, i, ids[i]);
        assert_int_equal(cons_store_schedule(f->r, nsh, ids[i], "x", 1, 0, NULL, NULL, &err), 0);
    }
    /* Claim the shards of the first three jobs (others may share a shard). */
    int claimed = 0;
    for (int i = 0; i < 3; i++) {
        struct cons_claimed *c = NULL;
        int n = cons_store_claim(f->r, cons_store_shard(ids[i], nsh), 500, 100, &c, &err);
        assert_true(n >= 0);
        for (int j = 0; j < n; j++)
            assert_int_equal(c[j].shard, cons_store_shard(ids[i], nsh));
        claimed += n;
        cons_store_claimed_free(c, n);
    }
    assert_true(claimed >= 3);
    assert_int_equal(cons_store_counts(f->r, nsh, &sched, &leased, &err), 0);
    assert_int_equal(sched, 20);
    assert_int_equal(leased, claimed);
    /* Every job lives in the shard cons_store_shard names. */
    for (int i = 0; i < 20; i++)
        assert_true(zscore(f, cons_store_shard(ids[i], nsh), ids[i]) > 0);

    assert_int_equal(cons_store_counts(f->r, 0, &sched, &leased, &err), SL_EINVAL);
    assert_int_equal(cons_store_counts(f->r, CONS_STORE_SHARDS_MAX + 1, &sched, &leased, &err),
                     SL_EINVAL);
}

/* ==== Dedup markers ==== */

#define NPAIRS 2500 /* > 2 pipeline chunks */

struct pairs {
    char ep[NPAIRS][16];
    char ev[NPAIRS][24];
    const char *eps[NPAIRS];
    const char *evs[NPAIRS];
};

static void test_done_markers(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    struct pairs *p = calloc(1, sizeof(*p));
    struct pairs *odd = calloc(1, sizeof(*odd));
    unsigned char *out = calloc(NPAIRS, 1);
    size_t nodd = 0;
    for (int i = 0; i < NPAIRS; i++) {
        (void)snprintf(p->ep[i], sizeof(p->ep[i]), "ep_%d", i % 7);
        (void)snprintf(p->ev[i], sizeof(p->ev[i]), "evt_%d", i);
        p->eps[i] = p->ep[i];
        p->evs[i] = p->ev[i];
        if (i % 2) {
            odd->eps[nodd] = p->ep[i];
            odd->evs[nodd] = p->ev[i];
            nodd++;
        }
    }
    memset(out, 7, NPAIRS);
    assert_int_equal(
        cons_store_intake_check(f->r, 1, NPAIRS, p->eps, p->evs, NULL, out, NULL, &err), 0);
    for (int i = 0; i < NPAIRS; i++)
        assert_int_equal(out[i], 0);
    assert_int_equal(cons_store_done_mark(f->r, nodd, odd->eps, odd->evs, NULL, 3600, &err), 0);
    assert_int_equal(
        cons_store_intake_check(f->r, 1, NPAIRS, p->eps, p->evs, NULL, out, NULL, &err), 0);
    for (int i = 0; i < NPAIRS; i++)
        assert_int_equal(out[i], (unsigned char)(i % 2));

    /* Key layout and TTL. */
    long long ttl = adm_int(f, "TTL sluice:done:{%s}:%s", "ep_1", "evt_1");
    assert_true(ttl >= 3590 && ttl <= 3600);
    assert_int_equal(adm_int(f, "EXISTS sluice:done:{%s}:%s", "ep_2", "evt_2"), 0);
    redisReply *rep = adm(f, "GET sluice:done:{ep_5}:evt_2497"); /* 2497 % 7 = 5 */
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "1");
    freeReplyObject(rep);
    /* Marking again refreshes the TTL. */
    assert_int_equal(cons_store_done_mark(f->r, 1, odd->eps, odd->evs, NULL, 100, &err), 0);
    ttl = adm_int(f, "TTL sluice:done:{%s}:%s", "ep_1", "evt_1");
    assert_true(ttl >= 90 && ttl <= 100);

    /* Nothing to do, and bad input refused before any I/O. */
    assert_int_equal(cons_store_intake_check(f->r, 1, 0, NULL, NULL, NULL, NULL, NULL, &err), 0);
    assert_int_equal(cons_store_done_mark(f->r, 1, odd->eps, odd->evs, NULL, 0, &err), SL_EINVAL);
    char longev[SL_EVENT_ID_MAX + 2];
    memset(longev, 'e', sizeof(longev) - 1);
    longev[sizeof(longev) - 1] = '\0';
    const char *bad_ev[] = {"evt_0", longev};
    const char *two_ep[] = {"ep_0", "ep_0"};
    assert_int_equal(cons_store_intake_check(f->r, 1, 2, two_ep, bad_ev, NULL, out, NULL, &err),
                     SL_EINVAL);
    assert_non_null(strstr(err.msg, "event id 1"));
    assert_null(strstr(err.msg, "eeee"));
    const char *empty_ep[] = {""};
    assert_int_equal(cons_store_done_mark(f->r, 1, empty_ep, bad_ev, NULL, 10, &err), SL_EINVAL);
    free(p);
    free(odd);
    free(out);
}

/* A delivered marker remembers its delivery (attempt, ts, status, latency) for a copy read
 * again; a bare "1" (markers of older versions) and malformed values are delivered with
 * nothing remembered. */
static void test_marker_info(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    const char *eps[] = {"ep_i", "ep_i", "ep_i", "ep_i"};
    const char *evs[] = {"evt_1", "evt_2", "evt_3", "evt_4"};
    struct cons_done_info in[2] = {
        {.attempt = 3, .ts_ms = INT64_C(1764000000123), .status = 204, .lat_us = 1500},
        {.attempt = 0}};
    assert_int_equal(cons_store_done_mark(f->r, 2, eps, evs, in, 600, &err), 0);
    redisReply *rep = adm(f, "GET sluice:done:{ep_i}:evt_1");
    assert_string_equal(rep->str, "1 3 1764000000123 204 1500");
    freeReplyObject(rep);
    rep = adm(f, "GET sluice:done:{ep_i}:evt_2"); /* attempt 0: nothing to remember */
    assert_string_equal(rep->str, "1");
    freeReplyObject(rep);
    freeReplyObject(adm(f, "SET sluice:done:{ep_i}:evt_3 %s", "1 x 2 3 4"));
    unsigned char out[4];
    struct cons_done_info info[4];
    memset(info, 0x5a, sizeof(info));
    assert_int_equal(cons_store_intake_check(f->r, 1, 4, eps, evs, NULL, out, info, &err), 0);
    assert_int_equal(out[0], CONS_DONE_DELIVERED);
    assert_int_equal(info[0].attempt, 3);
    assert_int_equal(info[0].ts_ms, INT64_C(1764000000123));
    assert_int_equal(info[0].status, 204);
    assert_int_equal(info[0].lat_us, 1500);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(out[i], i == 3 ? 0 : CONS_DONE_DELIVERED);
        assert_int_equal(info[i].attempt, 0);
        assert_int_equal(info[i].ts_ms, 0);
    }
    /* the intake check reports the same */
    const char *jids[4] = {NULL, NULL, NULL, NULL};
    memset(info, 0x5a, sizeof(info));
    assert_int_equal(cons_store_intake_check(f->r, 4, 4, eps, evs, jids, out, info, &err), 0);
    assert_int_equal(info[0].attempt, 3);
    assert_int_equal(info[0].lat_us, 1500);
    assert_int_equal(info[3].attempt, 0);
}

/* The consumer's intake check: markers first, then "a retry chain owns this pair" when the
 * pair's job exists; a NULL job id (a claimed job checking itself) never reports a chain. */
static void test_intake_check(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    const char *eps[] = {"ep_a", "ep_a", "ep_a", "ep_a", "ep_b"};
    const char *evs[] = {"evt_1", "evt_2", "evt_3", "evt_4", "evt_5"};
    char ids[5][41];
    const char *jids[5];
    for (int i = 0; i < 5; i++) {
        cons_store_job_id(eps[i], evs[i], ids[i]);
        jids[i] = ids[i];
    }
    unsigned char out[5];
    memset(out, 7, sizeof(out));
    assert_int_equal(cons_store_intake_check(f->r, 4, 5, eps, evs, jids, out, NULL, &err), 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(out[i], 0);
    /* evt_1 delivered, evt_2 dead, evt_3 and evt_5 have retry jobs (evt_5 also delivered:
     * the marker wins), evt_4 nothing */
    assert_int_equal(cons_store_done_mark(f->r, 1, &eps[0], &evs[0], NULL, 3600, &err), 0);
    assert_int_equal(cons_store_dead_mark(f->r, eps[1], evs[1], 3600, &err), 0);
    assert_int_equal(cons_store_schedule(f->r, 4, ids[2], "x", 1, 0, NULL, NULL, &err), 0);
    assert_int_equal(cons_store_schedule(f->r, 4, ids[4], "y", 1, 0, NULL, NULL, &err), 0);
    assert_int_equal(cons_store_done_mark(f->r, 1, &eps[4], &evs[4], NULL, 3600, &err), 0);
    assert_int_equal(cons_store_intake_check(f->r, 4, 5, eps, evs, jids, out, NULL, &err), 0);
    assert_int_equal(out[0], CONS_DONE_DELIVERED);
    assert_int_equal(out[1], CONS_DONE_DEAD);
    assert_int_equal(out[2], CONS_DONE_CHAIN);
    assert_int_equal(out[3], 0);
    assert_int_equal(out[4], CONS_DONE_DELIVERED);
    /* without its job id, the same pair is not reported as a chain */
    jids[2] = NULL;
    assert_int_equal(cons_store_intake_check(f->r, 4, 5, eps, evs, jids, out, NULL, &err), 0);
    assert_int_equal(out[2], 0);
    /* a leased (claimed) job still owns the pair */
    jids[2] = ids[2];
    struct cons_claimed *c = NULL;
    uint32_t shard = cons_store_shard(ids[2], 4);
    int n = cons_store_claim(f->r, shard, 30000, 10, &c, &err);
    assert_true(n >= 1);
    assert_int_equal(cons_store_intake_check(f->r, 4, 5, eps, evs, jids, out, NULL, &err), 0);
    assert_int_equal(out[2], CONS_DONE_CHAIN);
    cons_store_claimed_free(c, n);
    /* bad input refused before any I/O */
    const char *bad_jids[] = {ids[0], "not-hex", ids[2], ids[3], ids[4]};
    assert_int_equal(cons_store_intake_check(f->r, 4, 5, eps, evs, bad_jids, out, NULL, &err),
                     SL_EINVAL);
    assert_non_null(strstr(err.msg, "job id 1"));
    assert_int_equal(cons_store_intake_check(f->r, 0, 5, eps, evs, jids, out, NULL, &err),
                     SL_EINVAL);
}

/* ==== Circuit breaker ==== */

#define BASE  INT64_C(10000) /* ms; first cooldown */
#define CMAX  INT64_C(50000) /* ms; cooldown cap */
#define LEASE INT64_C(5000)  /* ms; probe lease */
#define SLACK INT64_C(2000)  /* ms; "just before" a time, more than a test step ever takes */

static struct cons_brk_view
rec(struct fx *f, const char *ep, int ok, int64_t thr, const char *owner)
{
    sl_err_t err = {0};
    struct cons_brk_view v;
    memset(&v, 0x5a, sizeof(v));
    int rc = cons_store_brk_record(f->r, ep, ok, thr, BASE, CMAX, owner, &v, &err);
    if (rc != 0)
        fail_msg("record: %s", err.msg);
    return v;
}

static struct cons_brk_view acq(struct fx *f, const char *ep, const char *owner)
{
    sl_err_t err = {0};
    struct cons_brk_view v;
    memset(&v, 0x5a, sizeof(v));
    int rc = cons_store_brk_acquire(f->r, ep, LEASE, owner, &v, &err);
    if (rc != 0)
        fail_msg("acquire: %s", err.msg);
    return v;
}

static struct cons_brk_view get(struct fx *f, const char *ep)
{
    sl_err_t err = {0};
    struct cons_brk_view v;
    memset(&v, 0x5a, sizeof(v));
    int rc = cons_store_brk_get(f->r, ep, &v, &err);
    if (rc != 0)
        fail_msg("get: %s", err.msg);
    return v;
}

static void test_breaker_threshold(void **state)
{
    struct fx *f = *state;
    int64_t t0 = rnow(f);
    struct cons_brk_view v = get(f, "ep_a");
    int64_t t1 = rnow(f);
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 0);
    assert_int_equal(v.reopen_at_ms, 0);
    assert_in_range(v.now_ms, t0, t1); /* every view carries Redis's clock */
    v = acq(f, "ep_a", "pod1");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.probe, 0);

    v = rec(f, "ep_a", 0, 3, "pod1");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 1);
    v = rec(f, "ep_a", 0, 3, "pod2");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 2);
    t0 = rnow(f);
    v = rec(f, "ep_a", 0, 3, "pod1");
    t1 = rnow(f);
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.failures, 3);
    assert_int_equal(v.cooldown_ms, BASE);
    /* opened at Redis's now */
    assert_in_range(v.now_ms, t0, t1);
    assert_int_equal(v.reopen_at_ms, v.now_ms + BASE);
    int64_t reopen = v.reopen_at_ms;

    age_brk(f, "ep_a", BASE - SLACK); /* the cooldown has not quite ended */
    v = acq(f, "ep_a", "pod2");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.probe, 0);
    assert_int_equal(v.reopen_at_ms, reopen - (BASE - SLACK));
    assert_true(v.reopen_at_ms > v.now_ms);
    v = get(f, "ep_a");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.reopen_at_ms, reopen - (BASE - SLACK));
    assert_int_equal(v.probe, 0);
    redisReply *rep = adm(f, "HGET sluice:breaker:{ep_a} state");
    assert_string_equal(rep->str, "open");
    freeReplyObject(rep);
    /* Another endpoint is independent. */
    assert_int_equal(get(f, "ep_b").state, CONS_BRK_CLOSED);
}

static void open_it(struct fx *f, const char *ep)
{
    struct cons_brk_view v = rec(f, ep, 0, 1, "pod0");
    assert_int_equal(v.state, CONS_BRK_OPEN);
}

static void test_breaker_single_probe(void **state)
{
    struct fx *f = *state;
    open_it(f, "ep_p");
    age_brk(f, "ep_p", BASE); /* cooldown just ended */
    struct cons_brk_view a = acq(f, "ep_p", "pod_a");
    assert_int_equal(a.state, CONS_BRK_HALF_OPEN);
    assert_int_equal(a.probe, 1);
    assert_int_equal(a.reopen_at_ms, a.now_ms + LEASE); /* the probe lease, from TIME */
    struct cons_brk_view b = acq(f, "ep_p", "pod_b");
    assert_int_equal(b.state, CONS_BRK_HALF_OPEN);
    assert_int_equal(b.probe, 0);
    assert_int_equal(b.reopen_at_ms, a.reopen_at_ms);
    struct cons_brk_view c = acq(f, "ep_p", "pod_c");
    assert_int_equal(c.probe, 0);
    /* Not re-entrant: the holder asking again does not get a second probe. */
    struct cons_brk_view a2 = acq(f, "ep_p", "pod_a");
    assert_int_equal(a2.probe, 0);
    assert_int_equal(a2.state, CONS_BRK_HALF_OPEN);
    redisReply *rep = adm(f, "HGET sluice:breaker:{ep_p} probe_owner");
    assert_string_equal(rep->str, "pod_a");
    freeReplyObject(rep);
}

static void test_breaker_probe_success(void **state)
{
    struct fx *f = *state;
    rec(f, "ep_s", 0, 2, "pod0");
    rec(f, "ep_s", 0, 2, "pod0");
    /* Double the cooldown once, so the reset is visible. */
    age_brk(f, "ep_s", BASE);
    assert_int_equal(acq(f, "ep_s", "pod_a").probe, 1);
    struct cons_brk_view v = rec(f, "ep_s", 0, 2, "pod_a");
    assert_int_equal(v.cooldown_ms, 2 * BASE);
    age_brk(f, "ep_s", 2 * BASE);
    assert_int_equal(acq(f, "ep_s", "pod_b").probe, 1);
    v = rec(f, "ep_s", 1, 2, "pod_b");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 0);
    assert_int_equal(v.cooldown_ms, BASE);
    assert_int_equal(v.reopen_at_ms, 0);
    assert_int_equal(adm_int(f, "HEXISTS sluice:breaker:{ep_s} probe_owner"), 0);
    v = acq(f, "ep_s", "pod_c");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.probe, 0);
    /* Failures count from zero again, and the next opening uses the base cooldown. */
    v = rec(f, "ep_s", 0, 2, "pod_c");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 1);
    /* A success in closed with failures > 0 resets them. */
    v = rec(f, "ep_s", 1, 2, "pod_c");
    assert_int_equal(v.failures, 0);
    rec(f, "ep_s", 0, 2, "pod_c");
    v = rec(f, "ep_s", 0, 2, "pod_c");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.cooldown_ms, BASE);
    assert_int_equal(v.reopen_at_ms, v.now_ms + BASE);

    /* Cheap path: success while closed with no failures writes nothing. */
    long long d0 = dirty(f);
    v = rec(f, "ep_fresh", 1, 2, "pod_c");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(adm_int(f, "EXISTS sluice:breaker:{ep_fresh}"), 0);
    v = rec(f, "ep_s", 1, 2, "pod_c"); /* closes: a write */
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    long long d1 = dirty(f);
    assert_true(d1 > d0);
    v = rec(f, "ep_s", 1, 2, "pod_c"); /* closed, 0 failures: no write */
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(dirty(f), d1);
}

static void test_breaker_probe_failure_doubling(void **state)
{
    struct fx *f = *state;
    open_it(f, "ep_d");
    struct cons_brk_view v = get(f, "ep_d");
    assert_int_equal(v.cooldown_ms, BASE);
    const int64_t expect[] = {20000, 40000, 50000, 50000}; /* doubled, capped at CMAX */
    int64_t failures = v.failures;
    for (size_t i = 0; i < sizeof(expect) / sizeof(expect[0]); i++) {
        age_brk(f, "ep_d", v.cooldown_ms - SLACK);
        assert_int_equal(acq(f, "ep_d", "pod_a").probe, 0); /* still cooling down */
        age_brk(f, "ep_d", SLACK);
        v = acq(f, "ep_d", "pod_a");
        assert_int_equal(v.probe, 1);
        v = rec(f, "ep_d", 0, 1, "pod_a");
        assert_int_equal(v.state, CONS_BRK_OPEN);
        assert_int_equal(v.cooldown_ms, expect[i]);
        assert_int_equal(v.reopen_at_ms, v.now_ms + expect[i]);
        assert_int_equal(v.failures, ++failures);
    }
}

/* open_since_ms: set when the breaker opens from closed, kept when a failed probe re-opens
 * it (how long the endpoint has been down, across pods: disable_after_ms is judged on it),
 * 0 and gone once a success closes it. */
static void test_breaker_open_since(void **state)
{
    struct fx *f = *state;
    assert_int_equal(get(f, "ep_o").open_since_ms, 0);
    struct cons_brk_view v = rec(f, "ep_o", 0, 2, "pod0");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.open_since_ms, 0);
    v = rec(f, "ep_o", 0, 2, "pod1");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.open_since_ms, v.now_ms);
    int64_t since = v.open_since_ms;
    age_brk(f, "ep_o", BASE); /* the cooldown passed */
    v = acq(f, "ep_o", "pod_a");
    assert_int_equal(v.probe, 1);
    assert_int_equal(v.state, CONS_BRK_HALF_OPEN);
    assert_int_equal(v.open_since_ms, since - BASE);
    v = rec(f, "ep_o", 0, 2, "pod_a"); /* the probe failed: open again, since kept */
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.open_since_ms, since - BASE);
    assert_true(v.now_ms - v.open_since_ms >= BASE);
    assert_true(v.reopen_at_ms > v.now_ms); /* while the cooldown itself starts anew */
    age_brk(f, "ep_o", 2 * BASE);
    assert_int_equal(acq(f, "ep_o", "pod_b").probe, 1);
    v = rec(f, "ep_o", 1, 2, "pod_b"); /* the probe succeeded */
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.open_since_ms, 0);
    assert_int_equal(adm_int(f, "HEXISTS sluice:breaker:{ep_o} open_since_ms"), 0);
    rec(f, "ep_o", 0, 2, "pod0");
    v = rec(f, "ep_o", 0, 2, "pod0"); /* a new outage counts from its own start */
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.open_since_ms, v.now_ms);
}

static void test_breaker_probe_lease_expiry(void **state)
{
    struct fx *f = *state;
    open_it(f, "ep_l");
    age_brk(f, "ep_l", BASE);
    struct cons_brk_view a = acq(f, "ep_l", "pod_a");
    assert_int_equal(a.probe, 1);
    age_brk(f, "ep_l", LEASE - SLACK);
    struct cons_brk_view v = acq(f, "ep_l", "pod_b");
    assert_int_equal(v.probe, 0);
    assert_int_equal(v.reopen_at_ms, a.reopen_at_ms - (LEASE - SLACK));
    /* pod_a's probe lease ran out (it crashed or hung): pod_b may probe now. */
    age_brk(f, "ep_l", SLACK);
    v = acq(f, "ep_l", "pod_b");
    assert_int_equal(v.probe, 1);
    assert_int_equal(v.state, CONS_BRK_HALF_OPEN);
    assert_int_equal(v.reopen_at_ms, v.now_ms + LEASE);
    assert_int_equal(acq(f, "ep_l", "pod_a").probe, 0);
    /* pod_a's late failure no longer decides anything: it only counts. */
    int64_t failures = v.failures;
    v = rec(f, "ep_l", 0, 1, "pod_a");
    assert_int_equal(v.state, CONS_BRK_HALF_OPEN);
    assert_int_equal(v.failures, failures + 1);
    assert_int_equal(v.cooldown_ms, BASE);
    /* pod_b's probe fails: open again, doubled. */
    v = rec(f, "ep_l", 0, 1, "pod_b");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.cooldown_ms, 2 * BASE);
    assert_int_equal(v.reopen_at_ms, v.now_ms + 2 * BASE);
}

static void test_breaker_late_results(void **state)
{
    struct fx *f = *state;
    rec(f, "ep_x", 0, 2, "pod0");
    struct cons_brk_view v0 = rec(f, "ep_x", 0, 2, "pod0");
    assert_int_equal(v0.state, CONS_BRK_OPEN);
    /* A late failure while open counts but does not extend the cooldown. */
    struct cons_brk_view v = rec(f, "ep_x", 0, 2, "pod1");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.failures, 3);
    assert_int_equal(v.reopen_at_ms, v0.reopen_at_ms);
    assert_int_equal(v.cooldown_ms, BASE);
    /* A late success while open closes it. */
    v = rec(f, "ep_x", 1, 2, "pod1");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 0);
    assert_int_equal(acq(f, "ep_x", "pod2").state, CONS_BRK_CLOSED);
    /* A success from someone else while a probe is out closes it too. */
    open_it(f, "ep_y");
    age_brk(f, "ep_y", BASE);
    assert_int_equal(acq(f, "ep_y", "pod_a").probe, 1);
    v = rec(f, "ep_y", 1, 1, "pod_z");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(adm_int(f, "HEXISTS sluice:breaker:{ep_y} probe_until_ms"), 0);
}

/* The consumer names each probe "<pod>/<n>" and records its other requests as "<pod>": a
 * late failure of a request the probing pod sent before the breaker opened only counts,
 * while the probe's own failure re-opens and doubles. */
static void test_breaker_probe_owner_is_the_probe(void **state)
{
    struct fx *f = *state;
    open_it(f, "ep_p");
    age_brk(f, "ep_p", BASE);
    assert_int_equal(acq(f, "ep_p", "pod_a/1").probe, 1);
    struct cons_brk_view v = get(f, "ep_p");
    int64_t failures = v.failures;
    v = rec(f, "ep_p", 0, 1, "pod_a"); /* an older request of the same pod */
    assert_int_equal(v.state, CONS_BRK_HALF_OPEN);
    assert_int_equal(v.failures, failures + 1);
    assert_int_equal(v.cooldown_ms, BASE);
    v = rec(f, "ep_p", 0, 1, "pod_a/1"); /* the probe */
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.cooldown_ms, 2 * BASE);
}

/* An endpoint's own cooldown above the global cap: the cap gives way, no error. */
static void test_breaker_base_above_max(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    struct cons_brk_view v;
    assert_int_equal(cons_store_brk_record(f->r, "ep_m", 0, 1, 5000, 1000, "p", &v, &err), 0);
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.cooldown_ms, 5000);
    age_brk(f, "ep_m", 5000);
    assert_int_equal(acq(f, "ep_m", "p").probe, 1);
    assert_int_equal(cons_store_brk_record(f->r, "ep_m", 0, 1, 5000, 1000, "p", &v, &err), 0);
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_int_equal(v.cooldown_ms, 5000);
    assert_int_equal(v.reopen_at_ms, v.now_ms + 5000);
}

/* Idle expiry (Redis memory bounded): every write of a breaker extends the key's expiry to
 * its longest cooldown plus CONS_STORE_BRK_IDLE_MS, never shortening it; reads leave it. */
static void test_breaker_ttl(void **state)
{
    struct fx *f = *state;
    const char *k = "sluice:breaker:{ep_t}";
    const long long full = CMAX + CONS_STORE_BRK_IDLE_MS;
    /* a failure below the threshold: the key exists, with the idle expiry */
    rec(f, "ep_t", 0, 3, "p");
    long long t = pttl(f, k);
    assert_in_range(t, full - SLACK, full);
    /* a key written without one (an older version) gets it at its next write */
    freeReplyObject(adm(f, "PERSIST %s", k));
    assert_int_equal(pttl(f, k), -1);
    rec(f, "ep_t", 0, 3, "p");
    assert_in_range(pttl(f, k), full - SLACK, full);
    /* opening: the same */
    freeReplyObject(adm(f, "PEXPIRE %s 1000", k));
    struct cons_brk_view v = rec(f, "ep_t", 0, 3, "p");
    assert_int_equal(v.state, CONS_BRK_OPEN);
    assert_in_range(pttl(f, k), full - SLACK, full);
    /* reads and refusals write nothing, so they do not extend it */
    freeReplyObject(adm(f, "PEXPIRE %s 100000", k));
    (void)get(f, "ep_t");
    assert_int_equal(acq(f, "ep_t", "p").probe, 0);
    assert_in_range(pttl(f, k), 100000 - SLACK, 100000);
    /* taking the probe extends it to cover the cooldown (or the lease) plus the margin... */
    age_brk(f, "ep_t", BASE);
    freeReplyObject(adm(f, "PEXPIRE %s 1000", k));
    assert_int_equal(acq(f, "ep_t", "p/1").probe, 1);
    const long long probe_ttl = BASE + CONS_STORE_BRK_IDLE_MS; /* BASE > LEASE */
    assert_in_range(pttl(f, k), probe_ttl - SLACK, probe_ttl);
    /* ...but never shortens a longer one */
    rec(f, "ep_t", 0, 3, "p"); /* a late failure: counts, extends to the full idle time */
    assert_in_range(pttl(f, k), full - SLACK, full);
    age_brk(f, "ep_t", LEASE);
    assert_int_equal(acq(f, "ep_t", "p/2").probe, 1);
    assert_in_range(pttl(f, k), full - SLACK, full);
    /* a success closes and extends too; the cap below the base gives way to the base */
    sl_err_t err = {0};
    assert_int_equal(cons_store_brk_record(f->r, "ep_t", 1, 3, 90000000, 1000, "p", &v, &err), 0);
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    const long long big = 90000000 + CONS_STORE_BRK_IDLE_MS;
    assert_in_range(pttl(f, k), big - SLACK, big);
    /* a key that expired is a closed breaker with no failures */
    freeReplyObject(adm(f, "PEXPIRE %s 1", k));
    usleep(20000);
    v = get(f, "ep_t");
    assert_int_equal(v.state, CONS_BRK_CLOSED);
    assert_int_equal(v.failures, 0);
}

static void test_breaker_invalid(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    struct cons_brk_view v;
    assert_int_equal(cons_store_brk_record(f->r, "ep", 0, 0, BASE, CMAX, "p", &v, &err), SL_EINVAL);
    assert_int_equal(cons_store_brk_record(f->r, "ep", 0, 1, 0, CMAX, "p", &v, &err), SL_EINVAL);
    assert_int_equal(cons_store_brk_record(f->r, "ep", 0, 1, BASE, CMAX, "", &v, &err), SL_EINVAL);
    assert_int_equal(cons_store_brk_record(f->r, NULL, 0, 1, BASE, CMAX, "p", &v, &err), SL_EINVAL);
    assert_int_equal(cons_store_brk_acquire(f->r, "ep", 0, "p", &v, &err), SL_EINVAL);
    assert_int_equal(cons_store_brk_acquire(f->r, "ep", -1, "p", &v, &err), SL_EINVAL);
    assert_int_equal(cons_store_brk_get(f->r, "ep", NULL, &err), SL_EINVAL);
    assert_int_equal(adm_int(f, "DBSIZE"), 0);
    /* A corrupt hash is reported, not guessed at. */
    freeReplyObject(adm(f, "HSET sluice:breaker:{ep_bad} state weird"));
    assert_int_equal(cons_store_brk_get(f->r, "ep_bad", &v, &err), SL_EREDIS);
    assert_non_null(strstr(err.msg, "read breaker"));
}

/* ==== Rate limit ==== */

static int64_t
take(struct fx *f, const char *ep, int64_t rate, int64_t burst, int64_t want, int64_t *wait)
{
    sl_err_t err = {0};
    int64_t granted = -1, w = -1;
    if (cons_store_rate_take(f->r, ep, rate, 1000, burst, want, &granted, &w, &err) != 0)
        fail_msg("rate take: %s", err.msg);
    if (wait)
        *wait = w;
    return granted;
}

/* The bucket refills on Redis's clock: ts is TIME at the take, and only the time that
 * passed by Redis's clock since refills it. */
static void test_rate_bucket(void **state)
{
    struct fx *f = *state;
    const char *k = "sluice:rate:{ep_r}";
    int64_t t0 = rnow(f);
    assert_int_equal(take(f, "ep_r", 10, 5, 3, NULL), 3); /* a new bucket is full */
    int64_t t1 = rnow(f);
    redisReply *rep = adm(f, "HGET %s ts", k);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_in_range(strtoll(rep->str, NULL, 10), t0, t1);
    freeReplyObject(rep);
    int64_t wait = -1;
    assert_int_equal(take(f, "ep_r", 10, 5, 5, &wait), 2); /* the rest of the burst */
    assert_int_equal(take(f, "ep_r", 10, 5, 1, &wait), 0);
    assert_in_range(wait, 1, 100); /* 10/s: a token every 100 ms */
    /* 300 ms later by Redis's clock: 3 tokens */
    adm_eval(f,
             "redis.call('HSET', KEYS[1], 'ts', string.format('%d', "
             "tonumber(redis.call('HGET', KEYS[1], 'ts')) - tonumber(ARGV[1])))",
             k, 300);
    assert_int_equal(take(f, "ep_r", 10, 5, 5, NULL), 3);
    /* a ts ahead of Redis's clock (written by a pod that ran ahead) refills nothing */
    adm_eval(f, "redis.call('HSET', KEYS[1], 'mt', '0', 'ts', ARGV[1])", k, rnow(f) + 60000);
    assert_int_equal(take(f, "ep_r", 10, 5, 5, NULL), 0);
    /* idle expiry: twice the refill from empty to full, in whole periods (5 at 10/s: 2 s) */
    assert_in_range(pttl(f, k), 1, 2000);
    (void)take(f, "ep_slow", 1, 3, 1, NULL); /* 1/s, burst 3: 2 * 3 s */
    assert_in_range(pttl(f, "sluice:rate:{ep_slow}"), 6000 - SLACK, 6000);
    /* a missing key is a full bucket */
    freeReplyObject(adm(f, "DEL sluice:rate:{ep_slow}"));
    assert_int_equal(take(f, "ep_slow", 1, 3, 5, NULL), 3);
    sl_err_t err = {0};
    int64_t g, w;
    assert_int_equal(cons_store_rate_take(f->r, "ep", 0, 1000, 1, 1, &g, &w, &err), SL_EINVAL);
    assert_int_equal(cons_store_rate_take(f->r, "ep", 1, 1000, 1, 0, &g, &w, &err), SL_EINVAL);
}

static void test_invalid_args(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(9, 9, id);
    const char *bad_ids[] = {"", "abc", "14E97EBDF8687A6793FEF86B53ED197837910141",
                             "14e97ebdf8687a6793fef86b53ed19783791014", "zz"};
    for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
        assert_int_equal(cons_store_schedule(f->r, 1, bad_ids[i], "x", 1, 0, NULL, NULL, &err),
                         SL_EINVAL);
        assert_int_equal(cons_store_job_exists(f->r, 1, bad_ids[i], &err), SL_EINVAL);
    }
    assert_int_equal(cons_store_schedule(f->r, 0, id, "x", 1, 0, NULL, NULL, &err), SL_EINVAL);
    assert_int_equal(cons_store_schedule(f->r, 1, id, NULL, 1, 0, NULL, NULL, &err), SL_EINVAL);
    assert_int_equal(
        cons_store_schedule(f->r, 1, id, "x", 1, CONS_STORE_MS_MAX + 1, NULL, NULL, &err),
        SL_EINVAL);
    assert_int_equal(
        cons_store_schedule(f->r, 1, id, "x", 1, -CONS_STORE_MS_MAX - 1, NULL, NULL, &err),
        SL_EINVAL);
    assert_int_equal(cons_store_schedule(f->r, 1, id, "x", 1, 0, "short", NULL, &err), SL_EINVAL);
    assert_int_equal(
        cons_store_schedule(f->r, 1, id, "x", (size_t)CONS_STORE_BODY_MAX + 1, 0, NULL, NULL, &err),
        SL_ETOOBIG);
    assert_int_equal(cons_store_complete(f->r, 1, id, "nothex-nothex-nothex-nothex-nothe", &err),
                     SL_EINVAL);
    assert_non_null(strstr(err.msg, "complete job"));
    struct cons_claimed *c = (struct cons_claimed *)1;
    assert_int_equal(cons_store_claim(f->r, CONS_STORE_SHARDS_MAX, 10, 1, &c, &err), SL_EINVAL);
    assert_null(c);
    const char *ids[] = {id}, *toks[] = {"0123456789abcdef0123456789abcdef"};
    unsigned char kept[1];
    assert_int_equal(cons_store_renew(f->r, 0, 0, 1, ids, toks, kept, &err), SL_EINVAL);
    assert_int_equal(adm_int(f, "DBSIZE"), 0); /* nothing reached redis */
    cons_store_claimed_free(NULL, 0);
}

/* ==== Script cache and connection loss ==== */

static void test_noscript_recovery(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(10, 1, id);
    struct cons_claimed *c = NULL;
    assert_int_equal(cons_store_schedule(f->r, 1, id, "a", 1, 0, NULL, NULL, &err), 0);
    freeReplyObject(adm(f, "SCRIPT FLUSH"));
    assert_int_equal(cons_store_claim(f->r, 0, 500, 10, &c, &err), 1);
    freeReplyObject(adm(f, "SCRIPT FLUSH"));
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), 0);
    cons_store_claimed_free(c, 1);
    freeReplyObject(adm(f, "SCRIPT FLUSH"));
    assert_int_equal(cons_store_schedule(f->r, 1, id, "b", 1, 0, NULL, NULL, &err), 0);
    freeReplyObject(adm(f, "SCRIPT FLUSH"));
    rec(f, "ep_n", 0, 1, "pod");
    freeReplyObject(adm(f, "SCRIPT FLUSH"));
    age_brk(f, "ep_n", BASE);
    assert_int_equal(acq(f, "ep_n", "pod").probe, 1);
    freeReplyObject(adm(f, "SCRIPT FLUSH"));
    assert_int_equal(get(f, "ep_n").state, CONS_BRK_HALF_OPEN);
    /* The EVAL fallback put the script back in the cache. */
    assert_int_equal(info_field(f, "memory", "number_of_cached_scripts"), 1);
}

static void test_connection_loss(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(11, 1, id);
    assert_int_equal(cons_store_schedule(f->r, 1, id, "a", 1, 0, NULL, NULL, &err), 0);
    struct cons_claimed *c = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, LONG, 10, &c, &err), 1);

    /* Idempotent calls reconnect and succeed on the first try. */
    int64_t sched = -1, leased = -1;
    kill_clients(f);
    assert_int_equal(cons_store_counts(f->r, 4, &sched, &leased, &err), 0);
    const char *eps[] = {"ep_1"}, *evs[] = {"evt_1"};
    unsigned char out[1] = {9};
    kill_clients(f);
    assert_int_equal(cons_store_done_mark(f->r, 1, eps, evs, NULL, 60, &err), 0);
    kill_clients(f);
    assert_int_equal(cons_store_intake_check(f->r, 1, 1, eps, evs, NULL, out, NULL, &err), 0);
    assert_int_equal(out[0], 1);
    kill_clients(f);
    assert_int_equal(cons_store_job_exists(f->r, 1, id, &err), 1);
    kill_clients(f);
    assert_int_equal(get(f, "ep_k").state, CONS_BRK_CLOSED);

    /* A state-changing script is not retried: it fails, and the next call reconnects. */
    kill_clients(f);
    sl_err_clear(&err);
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), SL_EREDIS);
    assert_int_equal(err.code, SL_EREDIS);
    assert_non_null(strstr(err.msg, "could not complete job"));
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), 0);
    cons_store_claimed_free(c, 1);
}

static void test_restart(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char id[41];
    job_id(12, 1, id);
    const unsigned char body[] = {0, 1, 2, 0};
    assert_int_equal(cons_store_schedule(f->r, 1, id, body, sizeof(body), 0, NULL, NULL, &err), 0);
    rec(f, "ep_r", 0, 1, "pod");
    redisFree(f->adm);
    f->adm = NULL;
    restart_same_port();
    f->adm = admin_connect();
    /* AOF kept the data; the script cache is empty; the old connection is dead. */
    int64_t sched = -1, leased = -1;
    assert_int_equal(cons_store_counts(f->r, 1, &sched, &leased, &err), 0);
    assert_int_equal(sched, 1);
    assert_int_equal(get(f, "ep_r").state, CONS_BRK_OPEN);
    struct cons_claimed *c = NULL;
    assert_int_equal(cons_store_claim(f->r, 0, 500, 10, &c, &err), 1);
    assert_memory_equal(c[0].body, body, sizeof(body));
    assert_int_equal(cons_store_complete(f->r, 1, id, c[0].token, &err), 0);
    cons_store_claimed_free(c, 1);
}

static int group_setup(void **state)
{
    (void)state;
    sl_test_redis_start(&g_redis);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sl_test_redis_stop(&g_redis);
    return 0;
}

int main(void)
{
    /* A write to a connection the server closed must fail with EPIPE, not kill us. */
    (void)signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_id_and_shard),
        cmocka_unit_test_setup_teardown(test_round_trip_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_due_order_and_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_hides_then_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schedule_existing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_body_cleanup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_done_markers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intake_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marker_info, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_threshold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_single_probe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_probe_success, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_probe_failure_doubling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_open_since, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_probe_lease_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_late_results, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_probe_owner_is_the_probe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_base_above_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_ttl, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_invalid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rate_bucket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_noscript_recovery, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connection_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
