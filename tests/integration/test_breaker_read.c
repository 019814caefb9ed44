/*
 * common/sl_breaker (the read side of the breakers, used by sluice-api's endpoint statistics)
 * against the consumer's own writer (cons_store over common/sl_rstate's scripts) on a private
 * redis-server: every state the writer produces reads back as the writer's own view (state,
 * failures, reopen time), many endpoints come back in order from one pipelined round trip,
 * a state this reader does not know is "unknown", and a bad reply fails the read without
 * leaving the connection's reply stream out of step. The writer keeps time on Redis's clock,
 * so a cooldown "passes" by moving the stored times back (age_brk).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_breaker.h"
#include "common/sl_record.h"
#include "common/sl_rstate.h"
#include "consumer/cons_store.h"
#include "sl_testenv.h"

#define BASE  INT64_C(1000) /* first cooldown, ms */
#define CMAX  INT64_C(5000) /* cooldown cap, ms */
#define LEASE INT64_C(200)  /* probe lease, ms */
#define MANY  300           /* endpoints read at once */

static struct sl_test_redis g_redis;

struct fx {
    sl_redis_t *r;     /* the connection both sides use */
    redisContext *adm; /* admin connection for raw writes */
};

static void adm(struct fx *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->adm, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    assert_int_not_equal(rep->type, REDIS_REPLY_ERROR);
    freeReplyObject(rep);
}

static struct cons_brk_view record(struct fx *f, const char *ep, int ok, int64_t thr)
{
    sl_err_t err = {0};
    struct cons_brk_view v;
    if (cons_store_brk_record(f->r, ep, ok, thr, BASE, CMAX, "pod0", &v, &err) != 0)
        fail_msg("record: %s", err.msg);
    return v;
}

/* Let ms pass for ep's breaker: its stored times move back by ms. */
static void age_brk(struct fx *f, const char *ep, long long ms)
{
    adm(f, "EVAL %s 1 sluice:breaker:{%s} %lld",
        "for _, k in ipairs({'opened_at_ms', 'probe_until_ms'}) do "
        "if redis.call('HEXISTS', KEYS[1], k) == 1 then "
        "redis.call('HINCRBY', KEYS[1], k, string.format('%d', -tonumber(ARGV[1]))) end end",
        ep, ms);
}

static struct sl_breaker_view read1(struct fx *f, const char *ep)
{
    sl_err_t err = {0};
    struct sl_breaker_view v;
    memset(&v, 0x5a, sizeof(v));
    const char *ids[] = {ep};
    if (sl_breaker_read(f->r, ids, 1, &v, &err) != 0)
        fail_msg("read: %s", err.msg);
    return v;
}

/* The reader sees exactly what the writer reported. */
static void assert_same(const struct sl_breaker_view *got, const struct cons_brk_view *want)
{
    assert_int_equal((int)got->state, (int)want->state);
    assert_int_equal(got->failures, want->failures);
    assert_int_equal(got->reopen_at_ms, want->reopen_at_ms);
    assert_int_equal(got->cooldown_ms, want->cooldown_ms);
}

static void test_key_and_names(void **state)
{
    (void)state;
    char k[SL_RSTATE_EPKEY_MAX];
    assert_int_equal(sl_rstate_key_breaker(k, sizeof(k), "shop_eu"), 24);
    assert_string_equal(k, "sluice:breaker:{shop_eu}");
    char small[8];
    assert_int_equal(sl_rstate_key_breaker(small, sizeof(small), "shop_eu"), -1);
    assert_string_equal(small, "");
    /* the longest endpoint id fits */
    char id[SL_ENDPOINT_ID_MAX + 1];
    memset(id, 'a', SL_ENDPOINT_ID_MAX);
    id[SL_ENDPOINT_ID_MAX] = '\0';
    assert_true(sl_rstate_key_breaker(k, sizeof(k), id) > 0);
    assert_string_equal(sl_breaker_state_name(SL_BREAKER_CLOSED), "closed");
    assert_string_equal(sl_breaker_state_name(SL_BREAKER_OPEN), "open");
    assert_string_equal(sl_breaker_state_name(SL_BREAKER_HALF_OPEN), "half_open");
    assert_string_equal(sl_breaker_state_name(SL_BREAKER_UNKNOWN), "unknown");
}

static void test_every_state_reads_as_the_writer_sees_it(void **state)
{
    struct fx *f = *state;
    /* never failed: no hash at all */
    struct sl_breaker_view v = read1(f, "ep_new");
    assert_int_equal(v.state, SL_BREAKER_CLOSED);
    assert_int_equal(v.failures, 0);
    assert_int_equal(v.reopen_at_ms, 0);
    /* failures below the threshold */
    struct cons_brk_view w = record(f, "ep_a", 0, 3);
    w = record(f, "ep_a", 0, 3);
    v = read1(f, "ep_a");
    assert_same(&v, &w);
    assert_int_equal(v.failures, 2);
    /* the threshold: open until a cooldown after Redis's now */
    w = record(f, "ep_a", 0, 3);
    assert_int_equal(w.state, CONS_BRK_OPEN);
    v = read1(f, "ep_a");
    assert_same(&v, &w);
    assert_int_equal(v.reopen_at_ms, w.now_ms + BASE);
    /* after the cooldown one pod takes the probe: half-open until its lease ends */
    age_brk(f, "ep_a", BASE);
    sl_err_t err = {0};
    if (cons_store_brk_acquire(f->r, "ep_a", LEASE, "pod0/1", &w, &err) != 0)
        fail_msg("acquire: %s", err.msg);
    assert_int_equal(w.state, CONS_BRK_HALF_OPEN);
    v = read1(f, "ep_a");
    assert_same(&v, &w);
    assert_int_equal(v.reopen_at_ms, w.now_ms + LEASE);
    /* the probe fails: open again with a doubled cooldown */
    if (cons_store_brk_record(f->r, "ep_a", 0, 3, BASE, CMAX, "pod0/1", &w, &err) != 0)
        fail_msg("record: %s", err.msg);
    v = read1(f, "ep_a");
    assert_same(&v, &w);
    assert_int_equal(v.cooldown_ms, 2 * BASE);
    assert_int_equal(v.reopen_at_ms, w.now_ms + 2 * BASE);
    /* a success closes it */
    w = record(f, "ep_a", 1, 3);
    v = read1(f, "ep_a");
    assert_same(&v, &w);
    assert_int_equal(v.state, SL_BREAKER_CLOSED);
}

static void test_many_endpoints_in_one_round_trip_in_order(void **state)
{
    struct fx *f = *state;
    static char names[MANY][32];
    static int64_t reopen[MANY];
    const char *ids[MANY];
    for (int i = 0; i < MANY; i++) {
        (void)snprintf(names[i], sizeof(names[i]), "ep_%03d", i);
        ids[i] = names[i];
        reopen[i] = 0;
        if (i % 3 == 1)
            reopen[i] = record(f, ids[i], 0, 1).reopen_at_ms; /* open */
        else if (i % 3 == 2)
            (void)record(f, ids[i], 0, 100); /* closed, 1 failure */
    }
    struct sl_breaker_view *out = calloc(MANY, sizeof(*out));
    sl_err_t err = {0};
    assert_int_equal(sl_breaker_read(f->r, ids, MANY, out, &err), 0);
    for (int i = 0; i < MANY; i++) {
        enum sl_breaker_state want = i % 3 == 1 ? SL_BREAKER_OPEN : SL_BREAKER_CLOSED;
        assert_int_equal((int)out[i].state, (int)want);
        assert_int_equal(out[i].failures, i % 3 == 0 ? 0 : 1);
        assert_int_equal(out[i].reopen_at_ms, reopen[i]);
        assert_true(i % 3 != 1 || reopen[i] > 0);
    }
    free(out);
    /* none at all is fine */
    assert_int_equal(sl_breaker_read(f->r, ids, 0, NULL, &err), 0);
}

static void test_unknown_state_and_bad_replies(void **state)
{
    struct fx *f = *state;
    adm(f, "HSET sluice:breaker:{ep_w} state weird failures 4");
    struct sl_breaker_view v = read1(f, "ep_w");
    assert_int_equal(v.state, SL_BREAKER_UNKNOWN);
    assert_int_equal(v.failures, 4);
    assert_int_equal(v.reopen_at_ms, 0);
    /* a key of the wrong type fails the whole read... */
    adm(f, "SET sluice:breaker:{ep_s} x");
    struct cons_brk_view w = record(f, "ep_o", 0, 1);
    const char *ids[] = {"ep_o", "ep_s", "ep_o"};
    struct sl_breaker_view out[3];
    sl_err_t err = {0};
    assert_int_equal(sl_breaker_read(f->r, ids, 3, out, &err), SL_EREDIS);
    assert_non_null(strstr(err.msg, "unexpected reply"));
    /* ...and leaves no reply unread: the next read on the connection is right */
    v = read1(f, "ep_o");
    assert_int_equal(v.state, SL_BREAKER_OPEN);
    assert_int_equal(v.reopen_at_ms, w.now_ms + BASE);
    /* an id too long for a key is refused before anything is sent */
    char id[200];
    memset(id, 'a', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    const char *bad[] = {"ep_o", id};
    assert_int_equal(sl_breaker_read(f->r, bad, 2, out, &err), SL_EINVAL);
    v = read1(f, "ep_o");
    assert_int_equal(v.state, SL_BREAKER_OPEN);
}

static void test_redis_gone_is_an_error_then_recovers(void **state)
{
    struct fx *f = *state;
    (void)record(f, "ep_r", 0, 1);
    adm(f, "CLIENT KILL TYPE normal SKIPME yes");
    /* the connection was dropped under us: the read fails (it is never answered from
     * nothing), and the next one reconnects */
    const char *ids[] = {"ep_r"};
    struct sl_breaker_view out[1];
    sl_err_t err = {0};
    assert_int_equal(sl_breaker_read(f->r, ids, 1, out, &err), SL_EREDIS);
    struct sl_breaker_view v = read1(f, "ep_r");
    assert_int_equal(v.state, SL_BREAKER_OPEN);
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct timeval tv = {2, 0};
    f->adm = redisConnectWithTimeout("127.0.0.1", g_redis.port, tv);
    if (!f->adm || f->adm->err)
        fail_msg("admin connect failed");
    adm(f, "FLUSHALL");
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
    (void)signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_and_names),
        cmocka_unit_test_setup_teardown(test_every_state_reads_as_the_writer_sees_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_many_endpoints_in_one_round_trip_in_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unknown_state_and_bad_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_gone_is_an_error_then_recovers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
