/*
 * Unit tests for common/sl_jobkey, the retry-schedule layout the consumer writes and
 * sluicectl counts and rebuilds: job ids (known SHA-1 values; the separator keeps pairs that
 * concatenate alike apart), shards (hex prefix modulo the count; malformed ids and a count
 * of 0), the key formats, and that the consumer's store API (which now delegates to it)
 * still agrees for many inputs: otherwise `retries rebuild` would create jobs no consumer
 * chain recognises.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_jobkey.h"
#include "consumer/cons_store.h"

static void test_job_id_known_values(void **state)
{
    (void)state;
    char id[SL_JOBKEY_ID_LEN + 1];
    sl_jobkey_id("ep_1", "evt_1", id); /* printf 'ep_1\nevt_1' | sha1sum */
    assert_string_equal(id, "14e97ebdf8687a6793fef86b53ed197837910141");
    sl_jobkey_id("", "", id); /* printf '\n' | sha1sum */
    assert_string_equal(id, "adc83b19e793491b1c6ea0fd8b46cd9f32e592fc");
    char other[SL_JOBKEY_ID_LEN + 1];
    sl_jobkey_id("ep_1\nevt", "_1", other);
    sl_jobkey_id("ep_1", "evt_1", id);
    assert_string_not_equal(id, other); /* "ep_1\nevt\n_1" is not "ep_1\nevt_1" */
}

static void test_shard(void **state)
{
    (void)state;
    assert_int_equal(sl_jobkey_shard("14e97ebd", 16), 0x14e9 % 16);
    assert_int_equal(sl_jobkey_shard("14e97ebd", 1000), 0x14e9 % 1000);
    assert_int_equal(sl_jobkey_shard("ffff", 65535), 0xffffu % 65535u);
    assert_int_equal(sl_jobkey_shard("ffff", 0), 0); /* 0 shards taken as 1 */
    assert_int_equal(sl_jobkey_shard("ffff", 1), 0);
    assert_int_equal(sl_jobkey_shard("zzzz", 16), 0);
    assert_int_equal(sl_jobkey_shard("ABCD", 16), 0); /* ids are lowercase */
    assert_int_equal(sl_jobkey_shard("ab", 16), 0);   /* shorter than the prefix */
    assert_int_equal(sl_jobkey_shard("", 16), 0);
    assert_int_equal(sl_jobkey_shard(NULL, 16), 0);
}

static void test_key_formats(void **state)
{
    (void)state;
    char k[128];
    (void)snprintf(k, sizeof(k), SL_JOBKEY_RETRY, (uint32_t)7);
    assert_string_equal(k, "sluice:retry:{7}");
    (void)snprintf(k, sizeof(k), SL_JOBKEY_LEASE, (uint32_t)7);
    assert_string_equal(k, "sluice:lease:{7}");
    (void)snprintf(k, sizeof(k), SL_JOBKEY_JOB, (uint32_t)7, "abc");
    assert_string_equal(k, "sluice:job:{7}:abc");
}

static void test_agrees_with_consumer_store(void **state)
{
    (void)state;
    char ep[80], ev[160];
    for (int i = 0; i < 2000; i++) {
        (void)snprintf(ep, sizeof(ep), "ep-%d_%c", i * 7919, 'A' + i % 26);
        (void)snprintf(ev, sizeof(ev), "evt_%d!#$%%&'()*+,-/:;<=>?@[]^_`{|}~%d", i, i * 31);
        char a[SL_JOBKEY_ID_LEN + 1], b[41];
        sl_jobkey_id(ep, ev, a);
        cons_store_job_id(ep, ev, b);
        assert_string_equal(a, b);
        for (uint32_t n = 0; n <= 33; n += 11) {
            assert_int_equal(sl_jobkey_shard(a, n), cons_store_shard(b, n));
            assert_int_equal(sl_jobkey_shard(a, 16 + n * 100), cons_store_shard(b, 16 + n * 100));
        }
    }
    assert_int_equal(sl_jobkey_shard("zzzz", 16), cons_store_shard("zzzz", 16));
    assert_int_equal(sl_jobkey_shard("ab", 16), cons_store_shard("ab", 16));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_job_id_known_values),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_key_formats),
        cmocka_unit_test(test_agrees_with_consumer_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
