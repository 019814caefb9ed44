/*
 * Unit tests for common/sl_rstate's layout, the Redis state the consumer writes and sluicectl
 * and sluice-api count, rebuild and read: job ids (known SHA-1 values; the separator keeps
 * pairs that concatenate alike apart), shards (hex prefix modulo the count; malformed ids and
 * a count of 0), every key format to the byte (a changed key would strand the state already
 * in Redis), keys that do not fit, id and token checks, and that the consumer's store API
 * agrees for many inputs: otherwise `retries rebuild` would create jobs no consumer chain
 * recognises. The scripts run against a real Redis in tests/integration/test_rstate_redis.c and
 * test_cons_store.c.
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
#include "common/sl_rstate.h"
#include "consumer/cons_store.h"

static void test_job_id_known_values(void **state)
{
    (void)state;
    char id[SL_RSTATE_ID_LEN + 1];
    sl_rstate_job_id("ep_1", "evt_1", id); /* printf 'ep_1\nevt_1' | sha1sum */
    assert_string_equal(id, "14e97ebdf8687a6793fef86b53ed197837910141");
    sl_rstate_job_id("", "", id); /* printf '\n' | sha1sum */
    assert_string_equal(id, "adc83b19e793491b1c6ea0fd8b46cd9f32e592fc");
    char other[SL_RSTATE_ID_LEN + 1];
    sl_rstate_job_id("ep_1\nevt", "_1", other);
    sl_rstate_job_id("ep_1", "evt_1", id);
    assert_string_not_equal(id, other); /* "ep_1\nevt\n_1" is not "ep_1\nevt_1" */
}

static void test_shard(void **state)
{
    (void)state;
    assert_int_equal(sl_rstate_shard("14e97ebd", 16), 0x14e9 % 16);
    assert_int_equal(sl_rstate_shard("14e97ebd", 1000), 0x14e9 % 1000);
    assert_int_equal(sl_rstate_shard("ffff", 65535), 0xffffu % 65535u);
    assert_int_equal(sl_rstate_shard("ffff", 0), 0); /* 0 shards taken as 1 */
    assert_int_equal(sl_rstate_shard("ffff", 1), 0);
    assert_int_equal(sl_rstate_shard("zzzz", 16), 0);
    assert_int_equal(sl_rstate_shard("ABCD", 16), 0); /* ids are lowercase */
    assert_int_equal(sl_rstate_shard("ab", 16), 0);   /* shorter than the prefix */
    assert_int_equal(sl_rstate_shard("", 16), 0);
    assert_int_equal(sl_rstate_shard(NULL, 16), 0);
}

static void test_key_formats(void **state)
{
    (void)state;
    char k[SL_RSTATE_KEY_MAX];
    assert_int_equal(sl_rstate_key_retry(k, sizeof(k), 7), 16);
    assert_string_equal(k, "sluice:retry:{7}");
    assert_int_equal(sl_rstate_key_lease(k, sizeof(k), 7), 16);
    assert_string_equal(k, "sluice:lease:{7}");
    assert_int_equal(sl_rstate_key_job(k, sizeof(k), 7, "abc"), 18);
    assert_string_equal(k, "sluice:job:{7}:abc");
    assert_int_equal(sl_rstate_key_job(k, sizeof(k), 4294967295u, ""), 24);
    assert_string_equal(k, "sluice:job:{4294967295}:"); /* the claim script's prefix */
    assert_int_equal(sl_rstate_key_breaker(k, sizeof(k), "shop_eu"), 24);
    assert_string_equal(k, "sluice:breaker:{shop_eu}");
    assert_int_equal(sl_rstate_key_rate(k, sizeof(k), "shop_eu"), 21);
    assert_string_equal(k, "sluice:rate:{shop_eu}");
    assert_int_equal(sl_rstate_key_done(k, sizeof(k), "shop_eu", "evt_1"), 27);
    assert_string_equal(k, "sluice:done:{shop_eu}:evt_1");
    assert_int_equal(sl_rstate_key_apirate(k, sizeof(k), "k1"), 19);
    assert_string_equal(k, "sluice:apirate:{k1}");
    assert_int_equal(sl_rstate_key_idem(k, sizeof(k), "k1", "ff00"), 21);
    assert_string_equal(k, "sluice:idem:{k1}:ff00");
}

static void test_key_limits(void **state)
{
    (void)state;
    /* the longest marker key fits SL_RSTATE_KEY_MAX */
    char ep[SL_ENDPOINT_ID_MAX + 1], ev[SL_EVENT_ID_MAX + 1], k[SL_RSTATE_KEY_MAX];
    memset(ep, 'e', SL_ENDPOINT_ID_MAX);
    ep[SL_ENDPOINT_ID_MAX] = '\0';
    memset(ev, 'v', SL_EVENT_ID_MAX);
    ev[SL_EVENT_ID_MAX] = '\0';
    assert_true(sl_rstate_key_done(k, sizeof(k), ep, ev) > 0);
    assert_true(sl_rstate_key_breaker(k, SL_RSTATE_EPKEY_MAX, ep) > 0);
    assert_true(sl_rstate_key_rate(k, SL_RSTATE_EPKEY_MAX, ep) > 0);
    /* a key that does not fit is -1 and "", never cut short */
    char small[16];
    assert_int_equal(sl_rstate_key_retry(small, sizeof(small), 7), -1); /* 16 + NUL */
    assert_string_equal(small, "");
    assert_int_equal(sl_rstate_key_done(small, sizeof(small), "ep", "evt"), -1);
    assert_string_equal(small, "");
    assert_int_equal(sl_rstate_key_breaker(small, 0, "ep"), -1);
}

static void test_valid_id_and_token(void **state)
{
    (void)state;
    char id[SL_RSTATE_ID_LEN + 1];
    sl_rstate_job_id("ep_1", "evt_1", id);
    assert_true(sl_rstate_valid_id(id));
    id[3] = 'A'; /* ids are lowercase */
    assert_false(sl_rstate_valid_id(id));
    assert_false(sl_rstate_valid_id("14e97ebd"));
    assert_false(sl_rstate_valid_id(NULL));
    assert_true(sl_rstate_valid_token("0123456789abcdef0123456789abcdef"));
    assert_false(sl_rstate_valid_token("0123456789abcdef0123456789abcde"));
    assert_false(sl_rstate_valid_token("0123456789abcdef0123456789abcdeg"));
    assert_false(sl_rstate_valid_token(NULL));
}

static void test_agrees_with_consumer_store(void **state)
{
    (void)state;
    char ep[80], ev[160];
    for (int i = 0; i < 2000; i++) {
        (void)snprintf(ep, sizeof(ep), "ep-%d_%c", i * 7919, 'A' + i % 26);
        (void)snprintf(ev, sizeof(ev), "evt_%d!#$%%&'()*+,-/:;<=>?@[]^_`{|}~%d", i, i * 31);
        char a[SL_RSTATE_ID_LEN + 1], b[41];
        sl_rstate_job_id(ep, ev, a);
        cons_store_job_id(ep, ev, b);
        assert_string_equal(a, b);
        for (uint32_t n = 0; n <= 33; n += 11) {
            assert_int_equal(sl_rstate_shard(a, n), cons_store_shard(b, n));
            assert_int_equal(sl_rstate_shard(a, 16 + n * 100), cons_store_shard(b, 16 + n * 100));
        }
    }
    assert_int_equal(sl_rstate_shard("zzzz", 16), cons_store_shard("zzzz", 16));
    assert_int_equal(sl_rstate_shard("ab", 16), cons_store_shard("ab", 16));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_id_known_values),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_key_formats),
        cmocka_unit_test(test_key_limits),
        cmocka_unit_test(test_valid_id_and_token),
        cmocka_unit_test(test_agrees_with_consumer_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
