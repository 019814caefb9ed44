/*
 * common/sl_rstate against a private redis-server: the scripts write the keys that the key
 * functions name (a script and a key format that drifted apart would strand state); the
 * schedule script's three answers (written, existed, lease lost) for sluicectl's rebuild and
 * the consumer alike; the counts sluicectl's health reads (scheduled, leased, due on Redis's
 * clock), agreeing with the consumer's; pipelined job lookups across round trips; and
 * sluice-api's key bucket and Idempotency-Key settle; a server that stops answering fails
 * the calls after the first timeout at once; a demoted one (READONLY) is connected to again. The
 * consumer's full use of the scripts is test_cons_store.c.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sl_rstate.h"
#include "consumer/cons_store.h"
#include "sl_testenv.h"

#define TOKEN  "0123456789abcdef0123456789abcdef"
#define TOKEN2 "fedcba9876543210fedcba9876543210"

struct fx {
    sl_redis_t *r;     /* the connection under test */
    redisContext *adm; /* admin connection for raw reads */
};

static struct sl_test_redis g_redis;
static struct fx g_fx;

/* An integer reply of an admin command (key text passed as %s, never formatted into it). */
static long long adm_int(struct fx *f, const char *cmd, const char *key)
{
    redisReply *rep = redisCommand(f->adm, cmd, key);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

static void job_id(int i, char out[SL_RSTATE_ID_LEN + 1])
{
    char ev[32];
    (void)snprintf(ev, sizeof(ev), "evt_%d", i);
    sl_rstate_job_id("ep_r", ev, out);
}

static void put_ok(struct fx *f, uint32_t nshards, const char *id, int64_t delay_ms)
{
    sl_err_t err = {0};
    int rc = sl_rstate_put(f->r, nshards, id, "body", 4, delay_ms, NULL, &err);
    if (rc != SL_RSTATE_PUT_OK)
        fail_msg("put: %d %s", rc, err.msg);
}

static void test_schedule_writes_the_named_keys(void **state)
{
    struct fx *f = *state;
    char id[SL_RSTATE_ID_LEN + 1], k[SL_RSTATE_KEY_MAX];
    job_id(1, id);
    uint32_t shard = sl_rstate_shard(id, 16);
    put_ok(f, 16, id, 0);
    (void)sl_rstate_key_job(k, sizeof(k), shard, id);
    assert_int_equal(adm_int(f, "EXISTS %s", k), 1);
    (void)sl_rstate_key_retry(k, sizeof(k), shard);
    assert_int_equal(adm_int(f, "ZCARD %s", k), 1);
    (void)sl_rstate_key_lease(k, sizeof(k), shard);
    assert_int_equal(adm_int(f, "HLEN %s", k), 0);

    /* a second new job of that id changes nothing; a reschedule needs the lease */
    sl_err_t err = {0};
    assert_int_equal(sl_rstate_put(f->r, 16, id, "other", 5, 0, NULL, &err), SL_RSTATE_PUT_EXISTED);
    assert_int_equal(sl_rstate_put(f->r, 16, id, "other", 5, 0, TOKEN, &err), SL_RSTATE_PUT_LOST);

    /* claimed: the lease hash holds the token; the lease's reschedule releases it */
    redisReply *rep = NULL;
    assert_int_equal(sl_rstate_claim(f->r, shard, 60000, 10, TOKEN, &rep, &err), 0);
    assert_non_null(rep);
    assert_int_equal(rep->elements, 3);
    assert_string_equal(rep->element[0]->str, id);
    assert_string_equal(rep->element[1]->str, TOKEN);
    assert_string_equal(rep->element[2]->str, "body");
    freeReplyObject(rep);
    assert_int_equal(adm_int(f, "HLEN %s", k), 1);
    assert_int_equal(sl_rstate_complete(f->r, 16, id, TOKEN2, &err), 1); /* not the lease's */
    assert_int_equal(sl_rstate_put(f->r, 16, id, "b2", 2, 0, TOKEN, &err), SL_RSTATE_PUT_OK);
    assert_int_equal(adm_int(f, "HLEN %s", k), 0);

    /* claimed again and completed: every key of the job is gone */
    assert_int_equal(sl_rstate_claim(f->r, shard, 60000, 10, TOKEN2, &rep, &err), 0);
    freeReplyObject(rep);
    assert_int_equal(sl_rstate_complete(f->r, 16, id, TOKEN2, &err), 0);
    assert_int_equal(adm_int(f, "HLEN %s", k), 0);
    (void)sl_rstate_key_retry(k, sizeof(k), shard);
    assert_int_equal(adm_int(f, "ZCARD %s", k), 0);
    (void)sl_rstate_key_job(k, sizeof(k), shard, id);
    assert_int_equal(adm_int(f, "EXISTS %s", k), 0);
}

static void test_counts_on_redis_clock(void **state)
{
    struct fx *f = *state;
    const uint32_t nsh = 4;
    char ids[5][SL_RSTATE_ID_LEN + 1];
    for (int i = 0; i < 5; i++) {
        job_id(100 + i, ids[i]);
        put_ok(f, nsh, ids[i], i < 3 ? 0 : 3600000); /* three due now, two in an hour */
    }
    sl_err_t err = {0};
    redisReply *rep = NULL;
    assert_int_equal(
        sl_rstate_claim(f->r, sl_rstate_shard(ids[0], nsh), 60000, 1, TOKEN, &rep, &err), 0);
    assert_non_null(rep);
    freeReplyObject(rep);

    struct sl_rstate_counts c;
    assert_int_equal(sl_rstate_counts(f->r, nsh, 1, &c, &err), 0);
    assert_int_equal(c.scheduled, 5);
    assert_int_equal(c.leased, 1);
    assert_int_equal(c.due, 2); /* the claimed one is due when its lease ends */
    assert_int_equal(sl_rstate_counts(f->r, nsh, 0, &c, &err), 0);
    assert_int_equal(c.scheduled, 5);
    assert_int_equal(c.leased, 1);
    assert_int_equal(c.due, 0);
    int64_t sched = 0, leased = 0;
    assert_int_equal(cons_store_counts(f->r, nsh, &sched, &leased, &err), 0);
    assert_int_equal(sched, c.scheduled);
    assert_int_equal(leased, c.leased);
    assert_int_equal(sl_rstate_counts(f->r, 0, 1, &c, &err), SL_EINVAL);
}

static void test_jobs_exist_across_round_trips(void **state)
{
    struct fx *f = *state;
    enum { N = SL_RSTATE_PIPE_MAX + 200 };
    static char ids[N][SL_RSTATE_ID_LEN + 1];
    const char *p[N];
    unsigned char present[N];
    for (int i = 0; i < N; i++) {
        job_id(1000 + i, ids[i]);
        p[i] = ids[i];
        if (i % 7 == 0)
            put_ok(f, 8, ids[i], 0);
    }
    sl_err_t err = {0};
    memset(present, 2, sizeof(present));
    assert_int_equal(sl_rstate_jobs_exist(f->r, 8, N, p, present, &err), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(present[i], i % 7 == 0);
    /* the consumer's single lookup agrees */
    assert_int_equal(cons_store_job_exists(f->r, 8, ids[7], &err), 1);
    assert_int_equal(cons_store_job_exists(f->r, 8, ids[8], &err), 0);
    p[3] = "not-an-id";
    assert_int_equal(sl_rstate_jobs_exist(f->r, 8, N, p, present, &err), SL_EINVAL);
}

static void test_endpoint_scripts_write_the_named_keys(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char k[SL_RSTATE_EPKEY_MAX];
    struct sl_rstate_brk b;
    assert_int_equal(sl_rstate_brk_record(f->r, "ep_k", 0, 1, 1000, 5000, "pod0", 60000, &b, &err),
                     0);
    assert_int_equal(b.state, 1);
    (void)sl_rstate_key_breaker(k, sizeof(k), "ep_k");
    assert_int_equal(adm_int(f, "EXISTS %s", k), 1);
    assert_true(adm_int(f, "PTTL %s", k) > 0);
    int64_t granted = 0, wait = 0;
    assert_int_equal(sl_rstate_rate_take(f->r, "ep_k", 1, 1000, 2, 3, &granted, &wait, &err), 0);
    assert_int_equal(granted, 2);
    assert_true(wait > 0 && wait <= 1000);
    (void)sl_rstate_key_rate(k, sizeof(k), "ep_k");
    assert_int_equal(adm_int(f, "EXISTS %s", k), 1);
}

static void test_api_key_bucket(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    assert_int_equal(sl_rstate_apirate_take(f->r, "k1", 1, 2, &err), 0);
    assert_int_equal(sl_rstate_apirate_take(f->r, "k1", 1, 2, &err), 0);
    int64_t wait = sl_rstate_apirate_take(f->r, "k1", 1, 2, &err);
    assert_true(wait >= 1 && wait <= 1000);
    char k[64];
    (void)sl_rstate_key_apirate(k, sizeof(k), "k1");
    assert_true(adm_int(f, "PTTL %s", k) > 0);
    /* another key has a bucket of its own */
    assert_int_equal(sl_rstate_apirate_take(f->r, "k2", 1, 2, &err), 0);
}

/* A string value of an admin GET, or "" when the key does not exist. */
static void adm_get(struct fx *f, const char *key, char *out, size_t cap)
{
    redisReply *rep = redisCommand(f->adm, "GET %s", key);
    assert_non_null(rep);
    out[0] = '\0';
    if (rep->type == REDIS_REPLY_STRING)
        (void)snprintf(out, cap, "%s", rep->str);
    else
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);
}

/*
 * sluice-api's Idempotency-Key settle: a request stores its answer or forgets the key only
 * while the key holds its own lock (or nothing); a request whose lock expired and was claimed
 * by another leaves the other's lock, and then its answer, alone.
 */
static void test_idempotency_settle_only_under_its_own_lock(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char k[160], v[128];
    (void)sl_rstate_key_idem(k, sizeof(k), "k1", "aa");
    freeReplyObject(redisCommand(f->adm, "SET %s %s PX 60000", k, "p:fp:A"));
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp:A", "d:fp:202:{}", 11, 600, &err), 1);
    adm_get(f, k, v, sizeof(v));
    assert_string_equal(v, "d:fp:202:{}");
    long long ttl = adm_int(f, "TTL %s", k);
    assert_true(ttl > 590 && ttl <= 600);
    /* run again (its reply was lost): the same answer stays, still 1 */
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp:A", "d:fp:202:{}", 11, 600, &err), 1);

    /* A's lock expired and B claimed the key: A's answer and A's forget both leave B's lock */
    freeReplyObject(redisCommand(f->adm, "SET %s %s PX 60000", k, "p:fp2:B"));
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp:A", "d:fp:202:{}", 11, 600, &err), 0);
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp:A", NULL, 0, 0, &err), 0);
    adm_get(f, k, v, sizeof(v));
    assert_string_equal(v, "p:fp2:B");
    assert_true(adm_int(f, "PTTL %s", k) > 50000); /* B's lock TTL untouched */
    /* B settles with a 5xx: the key is forgotten */
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp2:B", NULL, 0, 0, &err), 1);
    assert_int_equal(adm_int(f, "EXISTS %s", k), 0);

    /* a lock that expired with nobody after it: the answer is stored, a forget is a no-op */
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp:C", NULL, 0, 0, &err), 1);
    assert_int_equal(adm_int(f, "EXISTS %s", k), 0);
    assert_int_equal(sl_rstate_idem_settle(f->r, k, "p:fp:C", "d:fp:400:{}", 11, 60, &err), 1);
    adm_get(f, k, v, sizeof(v));
    assert_string_equal(v, "d:fp:400:{}");
}

/* The database's owner: set by the first claim, kept against any other, never overwritten. */
static void test_the_first_owner_keeps_the_database(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char found[SL_RSTATE_OWNER_MAX + 1], k[32], v[SL_RSTATE_OWNER_MAX + 1];
    assert_int_equal(sl_rstate_key_owner(k, sizeof(k)), (int)strlen("sluice:owner"));
    assert_string_equal(k, "sluice:owner");

    assert_int_equal(
        sl_rstate_claim_owner(f->r, "clusterA/sluice.endpoints", found, sizeof(found), &err), 1);
    assert_string_equal(found, "clusterA/sluice.endpoints");
    adm_get(f, k, v, sizeof(v));
    assert_string_equal(v, "clusterA/sluice.endpoints");
    /* the same deployment again (another pod, a restart): bound already, to it; another
     * Kafka cluster or another endpoints topic: told whose it is, nothing changed */
    static const char *const later[] = {"clusterA/sluice.endpoints", "clusterB/sluice.endpoints",
                                        "clusterA/staging.endpoints"};
    for (size_t i = 0; i < sizeof(later) / sizeof(later[0]); i++) {
        assert_int_equal(sl_rstate_claim_owner(f->r, later[i], found, sizeof(found), &err), 0);
        assert_string_equal(found, "clusterA/sluice.endpoints");
    }
    adm_get(f, k, v, sizeof(v));
    assert_string_equal(v, "clusterA/sluice.endpoints");
    assert_int_equal(adm_int(f, "TTL %s", k), -1); /* kept until an operator deletes it */
    /* a value found that does not fit is cut, still terminated */
    char small[9];
    assert_int_equal(sl_rstate_claim_owner(f->r, "x/y", small, sizeof(small), &err), 0);
    assert_string_equal(small, "clusterA");
    /* bad arguments: refused before any I/O */
    char big[SL_RSTATE_OWNER_MAX + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(sl_rstate_claim_owner(f->r, big, found, sizeof(found), &err), SL_EINVAL);
    assert_int_equal(sl_rstate_claim_owner(f->r, "", found, sizeof(found), &err), SL_EINVAL);
    assert_int_equal(sl_rstate_claim_owner(f->r, "a/b", NULL, 0, &err), SL_EINVAL);
}

/* The binding's witnesses: one key in each 256 hash slots, written whole at a bind, the
 * missing ones (and only those, counted) otherwise. */
static void test_the_binding_has_a_witness_in_every_slot_range(void **state)
{
    struct fx *f = *state;
    sl_err_t err = {0};
    char k[SL_RSTATE_WITNESSES][48], v[SL_RSTATE_OWNER_MAX + 1];
    for (int i = 0; i < SL_RSTATE_WITNESSES; i++) {
        int n = sl_rstate_key_witness(k[i], sizeof(k[i]), i);
        assert_true(n > (int)strlen("sluice:owner:{}"));
        assert_int_equal(strncmp(k[i], "sluice:owner:{w", 15), 0);
        assert_int_equal(sl_redis_key_slot(k[i], (size_t)n) / (16384 / SL_RSTATE_WITNESSES), i);
    }
    char small[8];
    assert_int_equal(sl_rstate_key_witness(small, sizeof(small), 0), -1);
    assert_string_equal(small, "");
    assert_int_equal(sl_rstate_key_witness(k[0], sizeof(k[0]), SL_RSTATE_WITNESSES), -1);
    assert_int_equal(sl_rstate_key_witness(k[0], sizeof(k[0]), -1), -1);
    (void)sl_rstate_key_witness(k[0], sizeof(k[0]), 0);

    int restored = -1, failed = -1;
    assert_int_equal(sl_rstate_witnesses(f->r, "cA/t.endpoints", 1, &restored, &failed, &err), 0);
    assert_int_equal(restored, 0); /* a bind writes them all and counts nothing */
    assert_int_equal(failed, 0);
    assert_int_equal(adm_int(f, "DBSIZE", NULL), SL_RSTATE_WITNESSES);
    for (int i = 0; i < SL_RSTATE_WITNESSES; i++) {
        adm_get(f, k[i], v, sizeof(v));
        assert_string_equal(v, "cA/t.endpoints");
        assert_int_equal(adm_int(f, "TTL %s", k[i]), -1);
    }
    /* all in place: nothing written */
    assert_int_equal(sl_rstate_witnesses(f->r, "cA/t.endpoints", 0, &restored, &failed, &err), 0);
    assert_int_equal(restored, 0);
    /* three gone (what a master that lost its data leaves): those three written again */
    for (int i = 5; i < 8; i++)
        assert_int_equal(adm_int(f, "DEL %s", k[i]), 1);
    assert_int_equal(sl_rstate_witnesses(f->r, "cA/t.endpoints", 0, &restored, &failed, &err), 0);
    assert_int_equal(restored, 3);
    assert_int_equal(adm_int(f, "DBSIZE", NULL), SL_RSTATE_WITNESSES);
    assert_int_equal(sl_rstate_witnesses(f->r, "cA/t.endpoints", 0, &restored, &failed, &err), 0);
    assert_int_equal(restored, 0); /* counted once */
    /* a bind overwrites: the database taken over by another deployment */
    assert_int_equal(sl_rstate_witnesses(f->r, "cB/t.endpoints", 1, &restored, &failed, &err), 0);
    adm_get(f, k[63], v, sizeof(v));
    assert_string_equal(v, "cB/t.endpoints");
    char big[SL_RSTATE_OWNER_MAX + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(sl_rstate_witnesses(f->r, big, 0, &restored, &failed, &err), SL_EINVAL);
    assert_int_equal(sl_rstate_witnesses(f->r, "", 0, &restored, &failed, &err), SL_EINVAL);
}

/* Each test starts from an empty Redis, on the group's two connections. */
static int flush(void **state)
{
    *state = &g_fx;
    freeReplyObject(redisCommand(g_fx.adm, "FLUSHALL"));
    return 0;
}

static long long client_id(void)
{
    sl_err_t err = {0};
    redisReply *rep = sl_redis_cmdf(g_fx.r, &err, "CLIENT ID");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long id = rep->integer;
    freeReplyObject(rep);
    return id;
}

/* A primary demoted to a replica behind the same address (a managed service's failover)
 * answers writes READONLY: the connection is dropped so the next call connects again (to the
 * new primary), rather than every write failing on it until the process restarts. */
static void test_a_demoted_server_is_left_for_a_new_connection(void **state)
{
    (void)state;
    long long before = client_id();
    redisReply *a = redisCommand(g_fx.adm, "REPLICAOF 127.0.0.1 1");
    assert_non_null(a);
    freeReplyObject(a);
    sl_err_t err = {0};
    const char *args[] = {"SET", "demoted", "1"};
    redisReply *w = sl_redis_cmd(g_fx.r, 0, 3, args, NULL, &err);
    a = redisCommand(g_fx.adm, "REPLICAOF NO ONE");
    assert_non_null(a);
    freeReplyObject(a);
    assert_non_null(w);
    assert_int_equal(w->type, REDIS_REPLY_ERROR);
    assert_int_equal(strncmp(w->str, "READONLY", 8), 0);
    freeReplyObject(w);
    assert_true(client_id() != before);
}

/* A server that accepts but stops answering (SIGSTOP): the first call waits its timeout, the
 * calls in the next moments fail at once instead of each waiting it too (a consumer loop
 * making one call per held job stalled for jobs x 2 s), and once it answers again so do the
 * calls. */
static void test_a_server_that_stops_answering_fails_calls_at_once(void **state)
{
    (void)state;
    sl_err_t err = {0};
    sl_redis_t *r = sl_redis_connect(g_redis.url, 800, &err); /* an 800 ms timeout */
    assert_non_null(r);
    redisReply *rep = sl_redis_cmdf(r, &err, "PING");
    assert_non_null(rep);
    freeReplyObject(rep);
    assert_int_equal(kill(g_redis.pid, SIGSTOP), 0);
    assert_null(sl_redis_cmdf(r, &err, "PING")); /* waits the timeout */
    assert_non_null(strstr(err.msg, "could not run redis"));
    /* the next calls are not tried on the wire: the back-off answers them */
    assert_null(sl_redis_cmdf(r, &err, "PING"));
    assert_non_null(strstr(err.msg, "next try in"));
    const char *args[] = {"PING"};
    assert_null(sl_redis_cmd(r, 1, 1, args, NULL, &err));
    assert_non_null(strstr(err.msg, "next try in"));
    /* After the wait a connection is made (the stopped server's kernel accepts it) but the
     * call times out again: the wait doubles. Only a reply ends the back-off: were a
     * connection enough, a stopped server would cost a whole timeout every 250 ms. */
    const char *at = strstr(err.msg, "next try in ");
    long first = strtol(at + strlen("next try in "), NULL, 10);
    assert_true(first > 0 && first <= 250);
    usleep((useconds_t)(first + 50) * 1000);
    assert_null(sl_redis_cmdf(r, &err, "PING")); /* connects, waits the timeout */
    assert_non_null(strstr(err.msg, "could not run redis"));
    assert_null(sl_redis_cmdf(r, &err, "PING"));
    at = strstr(err.msg, "next try in ");
    long second = at ? strtol(at + strlen("next try in "), NULL, 10) : -1;
    assert_int_equal(kill(g_redis.pid, SIGCONT), 0); /* before any failure: teardown needs it */
    if (second <= 250)
        fail_msg("the wait after a second timeout is %ld ms: not doubled from 250", second);
    rep = NULL;
    for (int i = 0; i < 100 && !rep; i++) { /* back after the back-off (250 ms) */
        rep = sl_redis_cmdf(r, &err, "PING");
        if (!rep)
            usleep(50 * 1000);
    }
    assert_non_null(rep);
    freeReplyObject(rep);
    sl_redis_close(r);
}

static int group_setup(void **state)
{
    (void)state;
    sl_test_redis_start(&g_redis);
    struct timeval tv = {2, 0};
    g_fx.adm = redisConnectWithTimeout("127.0.0.1", g_redis.port, tv);
    sl_err_t err = {0};
    g_fx.r = sl_redis_connect(g_redis.url, 2000, &err);
    if (!g_fx.adm || g_fx.adm->err || !g_fx.r) {
        fprintf(stderr, "cannot connect to the test redis-server: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sl_redis_close(g_fx.r);
    if (g_fx.adm)
        redisFree(g_fx.adm);
    sl_test_redis_stop(&g_redis);
    return 0;
}

int main(void)
{
    (void)signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_schedule_writes_the_named_keys, flush),
        cmocka_unit_test_setup(test_counts_on_redis_clock, flush),
        cmocka_unit_test_setup(test_jobs_exist_across_round_trips, flush),
        cmocka_unit_test_setup(test_endpoint_scripts_write_the_named_keys, flush),
        cmocka_unit_test_setup(test_api_key_bucket, flush),
        cmocka_unit_test_setup(test_idempotency_settle_only_under_its_own_lock, flush),
        cmocka_unit_test_setup(test_the_first_owner_keeps_the_database, flush),
        cmocka_unit_test_setup(test_the_binding_has_a_witness_in_every_slot_range, flush),
        cmocka_unit_test(test_a_demoted_server_is_left_for_a_new_connection),
        cmocka_unit_test(test_a_server_that_stops_answering_fails_calls_at_once), /* last */
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
