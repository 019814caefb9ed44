/*
 * Unit tests for common/sl_fmt, the bounded writer that replaces snprintf on the delivery
 * path: integers at their edges and many in between written as printf writes them, strings
 * and bytes, the exact fit (the NUL's byte included) and one byte short, a zero-sized
 * buffer, and that nothing is written after the first thing that did not fit.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_fmt.h"

static void test_integers_as_printf(void **state)
{
    (void)state;
    static const uint64_t us[] = {
        0, 1, 9, 10, 99, 100, 4294967295u, 4294967296u, 9999999999999999999u, UINT64_MAX};
    static const int64_t is[] = {0, 1, -1, 9, -9, 10, -10, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    char got[48], want[48]; /* a u64, a colon and an i64: 42 bytes at most */
    struct sl_fmt f;
    for (size_t i = 0; i < sizeof(us) / sizeof(us[0]); i++) {
        sl_fmt_init(&f, got, sizeof(got));
        sl_fmt_u64(&f, us[i]);
        int n = sl_fmt_end(&f);
        int w = snprintf(want, sizeof(want), "%" PRIu64, us[i]);
        assert_int_equal(n, w);
        assert_string_equal(got, want);
    }
    for (size_t i = 0; i < sizeof(is) / sizeof(is[0]); i++) {
        sl_fmt_init(&f, got, sizeof(got));
        sl_fmt_i64(&f, is[i]);
        int n = sl_fmt_end(&f);
        int w = snprintf(want, sizeof(want), "%" PRId64, is[i]);
        assert_int_equal(n, w);
        assert_string_equal(got, want);
    }
    /* a spread of values of every length, mixed with text */
    uint64_t v = 1;
    for (int i = 0; i < 2000; i++) {
        v = v * 6364136223846793005u + 1442695040888963407u;
        uint64_t u = v >> (i % 64);
        int64_t s = (int64_t)(v ^ (v >> 7)) >> (i % 63);
        sl_fmt_init(&f, got, sizeof(got));
        sl_fmt_u64(&f, u);
        sl_fmt_str(&f, ":");
        sl_fmt_i64(&f, s);
        int n = sl_fmt_end(&f);
        int w = snprintf(want, sizeof(want), "%" PRIu64 ":%" PRId64, u, s);
        assert_int_equal(n, w);
        assert_string_equal(got, want);
    }
}

static void test_bounds(void **state)
{
    (void)state;
    char buf[8];
    struct sl_fmt f;

    /* "abc" + "1234" is 7 bytes: fits in 8 with its NUL */
    sl_fmt_init(&f, buf, sizeof(buf));
    sl_fmt_str(&f, "abc");
    sl_fmt_u64(&f, 1234);
    assert_int_equal(sl_fmt_end(&f), 7);
    assert_string_equal(buf, "abc1234");

    /* one byte more does not fit: -1 and "" */
    sl_fmt_init(&f, buf, sizeof(buf));
    sl_fmt_str(&f, "abc");
    sl_fmt_u64(&f, 12345);
    assert_int_equal(sl_fmt_end(&f), -1);
    assert_string_equal(buf, "");

    /* after something did not fit nothing is written, even what would fit */
    memset(buf, 'x', sizeof(buf));
    sl_fmt_init(&f, buf, sizeof(buf));
    sl_fmt_str(&f, "abcdefgh");
    sl_fmt_str(&f, "z");
    assert_true(f.over);
    assert_int_equal(f.len, 0);
    assert_memory_equal(buf, "xxxxxxxx", 8);
    assert_int_equal(sl_fmt_end(&f), -1);
    assert_int_equal(buf[0], '\0');

    /* bytes with a NUL among them are copied as they are */
    sl_fmt_init(&f, buf, sizeof(buf));
    sl_fmt_mem(&f, "a\0b", 3);
    assert_int_equal(sl_fmt_end(&f), 3);
    assert_memory_equal(buf, "a\0b\0", 4);

    /* a zero-sized buffer: nothing fits, nothing is touched */
    char one = 'x';
    sl_fmt_init(&f, &one, 0);
    sl_fmt_str(&f, "");
    assert_int_equal(sl_fmt_end(&f), -1);
    assert_int_equal(one, 'x');

    /* the empty text fits in one byte */
    sl_fmt_init(&f, &one, 1);
    sl_fmt_str(&f, "");
    assert_int_equal(sl_fmt_end(&f), 0);
    assert_int_equal(one, '\0');

    /* a negative number whose '-' fits and whose digits do not */
    char three[3];
    sl_fmt_init(&f, three, sizeof(three));
    sl_fmt_i64(&f, -12);
    assert_int_equal(sl_fmt_end(&f), -1);
    assert_string_equal(three, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integers_as_printf),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
