/*
 * sl_redis in Redis Cluster mode (common/sl_rcluster.c) against a private six-node cluster:
 * key slots as Redis computes them; commands and pipelines routed to each key's master with
 * replies in the caller's order; MOVED and ASK followed (single commands and pipelines) while
 * a slot is migrated by hand; the Redis state contract (common/sl_rstate: schedule, two-step
 * claim, complete, breakers, rate buckets, counts) spread over the masters; a node that is
 * not a cluster refused at connect; and a master killed: commands fail until its replica is
 * promoted, then succeed on the new master without reconnecting by hand.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/sl_redis_int.h"
#include "common/sl_rstate.h"
#include "sl_test_rcluster.h"

#define TOKEN "0123456789abcdef0123456789abcdef"

static struct sl_test_rcluster g_rc;
static sl_redis_t *g_r;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The port of the master serving slot, as node port_any sees it (-1 when none). */
static int slot_owner(int port_any, int slot)
{
    redisContext *c = sl_test_rc_conn(port_any);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "CLUSTER SLOTS");
    int port = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->element[0]->integer <= slot && slot <= e->element[1]->integer)
            port = (int)e->element[2]->element[1]->integer;
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return port;
}

static redisReply *adm(int port, const char *fmt, ...)
{
    redisContext *c = sl_test_rc_conn(port);
    assert_non_null(c);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    assert_non_null(r);
    return r;
}

static void node_id(int port, char out[64])
{
    redisReply *r = adm(port, "CLUSTER MYID");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, 64, "%s", r->str);
    freeReplyObject(r);
}

static redisReply *cmd(const char *a0, const char *a1, const char *a2)
{
    const char *argv[] = {a0, a1, a2};
    sl_err_t err = {0};
    redisReply *r = sl_redis_cmd(g_r, 1, a2 ? 3 : 2, argv, NULL, &err);
    if (!r)
        fail_msg("%s %s: %s", a0, a1, err.msg);
    return r;
}

static void expect_str(redisReply *r, const char *want)
{
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_string_equal(r->str, want);
    freeReplyObject(r);
}

static void test_key_slots_match_redis(void **state)
{
    (void)state;
    /* values from the Redis Cluster specification and CLUSTER KEYSLOT */
    assert_int_equal(sl_rcluster_key_slot("123456789", 9), 12739);
    assert_int_equal(sl_rcluster_key_slot("foo", 3), 12182);
    assert_int_equal(sl_rcluster_key_slot("{user1000}.following", 20),
                     sl_rcluster_key_slot("{user1000}.followers", 20));
    assert_int_equal(sl_rcluster_key_slot("foo{}{bar}", 10),
                     sl_rcluster_key_slot("foo{}{bar}", 10));
    static const char *const keys[] = {
        "foo{}{bar}", "foo{{bar}}zap", "sluice:retry:{17}", "sluice:breaker:{ep_1}", "a{b", "}{x}"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        redisReply *r = adm(g_rc.port[0], "CLUSTER KEYSLOT %s", keys[i]);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_int_equal(sl_rcluster_key_slot(keys[i], strlen(keys[i])), (int)r->integer);
        freeReplyObject(r);
    }
    /* the command's key: first argument, EVAL's first key, none for PING or numkeys 0 */
    char *c = NULL;
    const char *ev[] = {"EVALSHA", "abc", "2", "{k}1", "{k}2"};
    int n = redisFormatCommandArgv(&c, 5, ev, NULL);
    assert_int_equal(sl_rcluster_cmd_slot(c, (size_t)n), sl_rcluster_key_slot("k", 1));
    redisFreeCommand(c);
    const char *ev0[] = {"EVAL", "return 1", "0"};
    n = redisFormatCommandArgv(&c, 3, ev0, NULL);
    assert_int_equal(sl_rcluster_cmd_slot(c, (size_t)n), -1);
    redisFreeCommand(c);
    const char *ping[] = {"PING"};
    n = redisFormatCommandArgv(&c, 1, ping, NULL);
    assert_int_equal(sl_rcluster_cmd_slot(c, (size_t)n), -1);
    redisFreeCommand(c);
}

static void test_url_forms(void **state)
{
    (void)state;
    struct sl_redis_url u;
    sl_err_t err = {0};
    assert_int_equal(sl_redis_url_parse("redis-cluster://:pw@a:7000,b,c:7002/0", &u, &err), 0);
    assert_true(u.cluster);
    assert_int_equal(u.nseeds, 3);
    assert_string_equal(u.seeds[1].host, "b");
    assert_int_equal(u.seeds[1].port, 6379);
    assert_int_equal(u.seeds[2].port, 7002);
    assert_string_equal(u.password, "pw");
    sl_redis_url_fini(&u);
    assert_int_equal(sl_redis_url_parse("redis-cluster://a:1/3", &u, &err), SL_ECONFIG);
    assert_non_null(strstr(err.msg, "database 0"));
    sl_redis_url_fini(&u);
    assert_int_equal(sl_redis_url_parse("redis://a:1,b:2", &u, &err), SL_ECONFIG);
    assert_non_null(strstr(err.msg, "redis-cluster://"));
    sl_redis_url_fini(&u);
    assert_int_equal(sl_redis_url_parse("redis-cluster://a:1,,b:2", &u, &err), SL_ECONFIG);
    sl_redis_url_fini(&u);
    /* a single Redis behind a cluster URL is refused at connect, naming why */
    struct sl_test_redis one;
    sl_test_redis_start(&one);
    char url[200];
    snprintf(url, sizeof(url), "redis-cluster://127.0.0.1:%d", one.port);
    sl_redis_t *r = sl_redis_connect(url, 1000, &err);
    assert_null(r);
    assert_non_null(strstr(err.msg, "not a cluster node"));
    sl_test_redis_stop(&one);
}

static void test_commands_and_pipelines_route(void **state)
{
    (void)state;
    char k[32], v[32];
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        snprintf(v, sizeof(v), "v%d", i);
        redisReply *r = cmd("SET", k, v);
        assert_int_equal(r->type, REDIS_REPLY_STATUS);
        freeReplyObject(r);
    }
    /* every key landed on its slot's master, and all three masters hold some */
    long long total = 0;
    int masters_with_keys = 0;
    for (int i = 0; i < SL_TEST_RC_NODES; i++) {
        redisReply *role = adm(g_rc.port[i], "ROLE");
        int master = strcmp(role->element[0]->str, "master") == 0;
        freeReplyObject(role);
        if (!master)
            continue;
        redisReply *r = adm(g_rc.port[i], "DBSIZE");
        total += r->integer;
        masters_with_keys += r->integer > 0;
        freeReplyObject(r);
    }
    assert_int_equal(total, 300);
    assert_int_equal(masters_with_keys, 3);
    /* a pipeline of 600 commands over the three masters: replies in append order */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 300; i++) {
            snprintf(k, sizeof(k), "k%d", i);
            const char *argv[] = {"GET", k};
            assert_int_equal(sl_redis_append(g_r, 2, argv, NULL), 0);
            const char *argv2[] = {"STRLEN", k};
            assert_int_equal(sl_redis_append(g_r, 2, argv2, NULL), 0);
        }
        for (int i = 0; i < 300; i++) {
            sl_err_t err = {0};
            redisReply *r = sl_redis_get_reply(g_r, &err);
            assert_non_null(r);
            snprintf(v, sizeof(v), "v%d", i);
            expect_str(r, v);
            r = sl_redis_get_reply(g_r, &err);
            assert_non_null(r);
            assert_int_equal(r->integer, (long long)strlen(v));
            freeReplyObject(r);
        }
    }
    /* keyless commands go to some node */
    sl_err_t err = {0};
    redisReply *r = sl_redis_cmdf(g_r, &err, "PING");
    assert_non_null(r);
    assert_string_equal(r->str, "PONG");
    freeReplyObject(r);
}

/* Move slot from its master (src) to another master (dst) by hand, keys included, the way
 * redis-cli --cluster reshard does; returns dst's port. With half = 1, stops halfway: src
 * MIGRATING, dst IMPORTING, the key named moved already on dst. */
static int migrate_slot(int slot, const char *moved, int half, int *srcp)
{
    int src = slot_owner(g_rc.port[0], slot);
    int dst = -1;
    for (int i = 0; i < 3 && dst < 0; i++) {
        int p = slot_owner(g_rc.port[0], sl_rcluster_key_slot(i == 0   ? "a"
                                                              : i == 1 ? "b"
                                                                       : "c",
                                                              1));
        if (p != src)
            dst = p;
    }
    assert_true(src > 0 && dst > 0);
    char sid[64], did[64];
    node_id(src, sid);
    node_id(dst, did);
    freeReplyObject(adm(dst, "CLUSTER SETSLOT %d IMPORTING %s", slot, sid));
    freeReplyObject(adm(src, "CLUSTER SETSLOT %d MIGRATING %s", slot, did));
    redisReply *r = adm(src, "MIGRATE 127.0.0.1 %d %s 0 5000", dst, moved);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    *srcp = src;
    if (half)
        return dst;
    for (int i = 0; i < SL_TEST_RC_NODES; i++)
        freeReplyObject(adm(g_rc.port[i], "CLUSTER SETSLOT %d NODE %s", slot, did));
    return dst;
}

static void expect_ok(redisReply *r)
{
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
}

static void test_moved_and_ask_are_followed(void **state)
{
    (void)state;
    int slot = sl_rcluster_key_slot("mv", 2);
    expect_ok(cmd("SET", "{mv}a", "1"));
    expect_ok(cmd("SET", "{mv}b", "2"));
    /* halfway: {mv}a is on the new master, {mv}b still on the old one; the client's map
     * still names the old one, which answers ASK for {mv}a */
    int src;
    int dst = migrate_slot(slot, "{mv}a", 1, &src);
    expect_str(cmd("GET", "{mv}a", NULL), "1");
    expect_str(cmd("GET", "{mv}b", NULL), "2");
    const char *ga[] = {"GET", "{mv}a"}, *gb[] = {"GET", "{mv}b"}, *gf[] = {"GET", "k1"};
    sl_err_t err = {0};
    assert_int_equal(sl_redis_append(g_r, 2, ga, NULL), 0);
    assert_int_equal(sl_redis_append(g_r, 2, gf, NULL), 0);
    assert_int_equal(sl_redis_append(g_r, 2, gb, NULL), 0);
    expect_str(sl_redis_get_reply(g_r, &err), "1");
    expect_str(sl_redis_get_reply(g_r, &err), "v1");
    expect_str(sl_redis_get_reply(g_r, &err), "2");
    /* finish: the slot belongs to dst; the old master answers MOVED (pipeline first, then a
     * single command: the pipeline's MOVED already taught the map, so move it back first) */
    redisReply *r = adm(src, "MIGRATE 127.0.0.1 %d {mv}b 0 5000", dst);
    freeReplyObject(r);
    char did[64];
    node_id(dst, did);
    for (int i = 0; i < SL_TEST_RC_NODES; i++)
        freeReplyObject(adm(g_rc.port[i], "CLUSTER SETSLOT %d NODE %s", slot, did));
    assert_int_equal(sl_redis_append(g_r, 2, gf, NULL), 0);
    assert_int_equal(sl_redis_append(g_r, 2, gb, NULL), 0);
    assert_int_equal(sl_redis_append(g_r, 2, ga, NULL), 0);
    expect_str(sl_redis_get_reply(g_r, &err), "v1");
    expect_str(sl_redis_get_reply(g_r, &err), "2");
    expect_str(sl_redis_get_reply(g_r, &err), "1");
    /* and back to src in one step: a single command meets MOVED */
    int src2;
    int back = migrate_slot(slot, "{mv}a", 0, &src2);
    assert_int_equal(src2, dst);
    (void)back;
    expect_str(cmd("GET", "{mv}a", NULL), "1");
    expect_ok(cmd("SET", "{mv}c", "3"));
    assert_int_equal(slot_owner(g_rc.port[0], slot), back);
    r = adm(back, "EXISTS {mv}c");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
}

static void test_rstate_over_the_cluster(void **state)
{
    (void)state;
    enum { SHARDS = 16, JOBS = 120 };
    sl_err_t err = {0};
    char ids[JOBS][SL_RSTATE_ID_LEN + 1];
    for (int i = 0; i < JOBS; i++) {
        char ev[32];
        snprintf(ev, sizeof(ev), "evt_%d", i);
        sl_rstate_job_id("ep_c", ev, ids[i]);
        assert_int_equal(sl_rstate_put(g_r, SHARDS, ids[i], "body", 4, 0, NULL, &err),
                         SL_RSTATE_PUT_OK);
    }
    /* an orphan: its body deleted behind the schedule's back; claim drops it */
    char key[SL_RSTATE_KEY_MAX];
    uint32_t oshard = sl_rstate_shard(ids[0], SHARDS);
    (void)sl_rstate_key_job(key, sizeof(key), oshard, ids[0]);
    freeReplyObject(cmd("DEL", key, NULL));
    struct sl_rstate_counts c;
    assert_int_equal(sl_rstate_counts(g_r, SHARDS, 1, &c, &err), 0);
    assert_int_equal(c.scheduled, JOBS);
    assert_int_equal(c.due, JOBS);
    const char *ptr[JOBS];
    unsigned char present[JOBS];
    for (int i = 0; i < JOBS; i++)
        ptr[i] = ids[i];
    assert_int_equal(sl_rstate_jobs_exist(g_r, SHARDS, JOBS, ptr, present, &err), 0);
    for (int i = 0; i < JOBS; i++)
        assert_int_equal(present[i], i != 0);
    int claimed = 0;
    for (uint32_t s = 0; s < SHARDS; s++) {
        redisReply *rep = NULL;
        assert_int_equal(sl_rstate_claim(g_r, s, 30000, 1000, TOKEN, &rep, &err), 0);
        for (size_t k = 0; rep && k < rep->elements; k += 3) {
            assert_string_equal(rep->element[k + 2]->str, "body");
            assert_int_equal(sl_rstate_shard(rep->element[k]->str, SHARDS), s);
            assert_int_equal(sl_rstate_complete(g_r, SHARDS, rep->element[k]->str, TOKEN, &err), 0);
            claimed++;
        }
        if (rep)
            freeReplyObject(rep);
    }
    assert_int_equal(claimed, JOBS - 1);
    assert_int_equal(sl_rstate_counts(g_r, SHARDS, 1, &c, &err), 0);
    assert_int_equal(c.scheduled, 0);
    assert_int_equal(c.leased, 0);
    /* breakers and buckets of endpoints on every master */
    for (int i = 0; i < 30; i++) {
        char ep[32];
        snprintf(ep, sizeof(ep), "ep_%d", i);
        struct sl_rstate_brk b;
        for (int f = 0; f < 3; f++)
            assert_int_equal(sl_rstate_brk_record(g_r, ep, 0, 3, 1000, 60000, "o", 60000, &b, &err),
                             0);
        assert_int_equal(b.state, 1);
        assert_int_equal(sl_rstate_brk_get(g_r, ep, &b, &err), 0);
        assert_int_equal(b.failures, 3);
        int64_t granted = 0, wait = 0;
        assert_int_equal(sl_rstate_rate_take(g_r, ep, 10, 1000, 10, 4, &granted, &wait, &err), 0);
        assert_int_equal(granted, 4);
    }
}

static void test_master_failover(void **state)
{
    (void)state;
    expect_ok(cmd("SET", "{fo}x", "1"));
    int slot = sl_rcluster_key_slot("fo", 2);
    int victim = slot_owner(g_rc.port[0], slot);
    int vi = -1;
    for (int i = 0; i < SL_TEST_RC_NODES; i++)
        if (g_rc.port[i] == victim)
            vi = i;
    assert_true(vi >= 0);
    /* the replica has the key before its master dies: an online replica whose acknowledged
     * offset has reached the master's (WAIT would need the writer's own connection) */
    int synced = 0;
    for (int k = 0; k < 100 && !synced; k++) {
        redisReply *w = adm(victim, "INFO replication");
        const char *mo = strstr(w->str, "master_repl_offset:");
        const char *so = strstr(w->str, "slave0:");
        if (mo && so && strstr(so, "state=online")) {
            const char *off = strstr(so, "offset=");
            synced = off && atoll(off + 7) >= atoll(mo + 19);
        }
        freeReplyObject(w);
        if (!synced)
            usleep(100000);
    }
    assert_true(synced);
    kill(g_rc.pid[vi], SIGKILL);
    waitpid(g_rc.pid[vi], NULL, 0);
    g_rc.pid[vi] = 0;
    int64_t t0 = now_ms();
    int failures = 0, ok = 0;
    while (!ok && now_ms() - t0 < 30000) {
        const char *argv[] = {"INCR", "{fo}n"};
        sl_err_t err = {0};
        redisReply *r = sl_redis_cmd(g_r, 1, 2, argv, NULL, &err);
        ok = r && r->type == REDIS_REPLY_INTEGER;
        failures += !ok;
        if (r)
            freeReplyObject(r);
        if (!ok)
            usleep(100000);
    }
    print_message("failover: first write after %lld ms, %d failed tries\n",
                  (long long)(now_ms() - t0), failures);
    assert_true(ok);
    assert_true(failures > 0); /* the dead master was really in the way */
    int owner = -1;
    for (int i = 0; i < SL_TEST_RC_NODES && owner < 0; i++)
        if (g_rc.pid[i] > 0)
            owner = slot_owner(g_rc.port[i], slot);
    assert_true(owner > 0 && owner != victim);
    expect_str(cmd("GET", "{fo}x", NULL), "1");
    /* pipelines too */
    const char *ga[] = {"GET", "{fo}x"}, *gf[] = {"GET", "k2"};
    sl_err_t err = {0};
    assert_int_equal(sl_redis_append(g_r, 2, ga, NULL), 0);
    assert_int_equal(sl_redis_append(g_r, 2, gf, NULL), 0);
    expect_str(sl_redis_get_reply(g_r, &err), "1");
    expect_str(sl_redis_get_reply(g_r, &err), "v2");
}

static int group_setup(void **state)
{
    (void)state;
    sl_test_rcluster_start(&g_rc);
    sl_err_t err = {0};
    g_r = sl_redis_connect(g_rc.url, 2000, &err);
    if (!g_r) {
        fprintf(stderr, "cannot connect to the test cluster: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sl_redis_close(g_r);
    sl_test_rcluster_stop(&g_rc);
    return 0;
}

int main(void)
{
    (void)signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_slots_match_redis),
        cmocka_unit_test(test_url_forms),
        cmocka_unit_test(test_commands_and_pipelines_route),
        cmocka_unit_test(test_moved_and_ask_are_followed),
        cmocka_unit_test(test_rstate_over_the_cluster),
        cmocka_unit_test(test_master_failover),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
