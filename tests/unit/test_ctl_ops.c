/*
 * Unit tests for ctl/ctl_ops: strict duration and time parsing (every rejected form named in
 * the header), formatting, PostgreSQL array literals and text tables. (The retry-schedule
 * layout sluicectl shares with the consumer is common/sl_rstate: tests/unit/test_rstate.c.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_pg.h"
#include "ctl/ctl_ops.h"

static void test_duration_accepts(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int64_t secs;
    } ok[] = {{"1s", 1},
              {"90m", 5400},
              {"24h", 86400},
              {"7d", 604800},
              {"1h", 3600},
              {"59s", 59},
              {"366d", 366 * 86400LL},
              {"8784h", 8784 * 3600LL},
              {"10m", 600},
              {"31622400s", 31622400}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int64_t v = -1;
        assert_int_equal(ctl_ops_duration_parse(ok[i].s, &v), 0);
        assert_int_equal(v, ok[i].secs);
    }
}

static void test_duration_rejects(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "h",
        "0s",
        "0",
        "05m",
        "1",
        "1.5h",
        "-1h",
        "+1h",
        " 1h",
        "1h ",
        "1 h",
        "1H",
        "1w",
        "1ms",
        "1h30m",
        "367d",
        "8785h",
        "1e3s",
        "0x10s",
        "1hh",
        "1d\n",
        "99999999999999999999s",
        "31622401s",
        "527041m",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t v = 42;
        if (ctl_ops_duration_parse(bad[i], &v) != SL_EINVAL)
            fail_msg("accepted \"%s\"", bad[i]);
        assert_int_equal(v, 42);
    }
    int64_t v;
    assert_int_equal(ctl_ops_duration_parse(NULL, &v), SL_EINVAL);
}

static void test_duration_format(void **state)
{
    (void)state;
    char b[24];
    static const struct {
        int64_t s;
        const char *want;
    } v[] = {{86400, "1d"}, {7200, "2h"}, {5400, "90m"}, {61, "61s"}, {90000, "25h"}, {0, "0s"}};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ctl_ops_duration_format(v[i].s, b, sizeof(b));
        assert_string_equal(b, v[i].want);
        int64_t back = 0;
        if (v[i].s > 0) {
            assert_int_equal(ctl_ops_duration_parse(b, &back), 0);
            assert_int_equal(back, v[i].s);
        }
    }
}

static void test_time_parse(void **state)
{
    (void)state;
    const int64_t now = 1764510301250; /* 2025-11-30T13:45:01.250Z */
    static const struct {
        const char *s;
        int64_t ms;
    } ok[] = {
        {"2025-11-30T13:45:01Z", 1764510301000},
        {"2025-11-30T13:45:01.250Z", 1764510301250},
        {"2025-11-30t13:45:01.25z", 1764510301250},
        {"2025-11-30 13:45:01.123456789Z", 1764510301123},
        {"2025-11-30T15:45:01+02:00", 1764510301000},
        {"2025-11-30T08:15:01-05:30", 1764510301000},
        {"1970-01-01T00:00:00Z", 0},
        {"2024-02-29T00:00:00Z", 1709164800000},
        {"90m", now - 5400000},
        {"1s", now - 1000},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int64_t v = -1;
        if (ctl_ops_time_parse(ok[i].s, now, &v) != 0)
            fail_msg("rejected \"%s\"", ok[i].s);
        assert_int_equal(v, ok[i].ms);
    }
    static const char *const bad[] = {
        "2025-11-30",
        "2025-11-30T13:45Z",
        "2025-11-30T13:45:01",
        "2025-11-30T24:00:00Z",
        "2025-11-30T13:60:01Z",
        "2025-11-30T13:45:60Z",
        "2025-02-29T00:00:00Z",
        "2025-13-01T00:00:00Z",
        "2025-00-10T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "2025-11-30T13:45:01.Z",
        "2025-11-30T13:45:01.1234567890Z",
        "2025-11-30T13:45:01+0200",
        "2025-11-30T13:45:01+24:00",
        "2025-11-30T13:45:01Zx",
        "2025-11-30X13:45:01Z",
        "yesterday",
        "",
        "-1h",
        "2025-1-30T13:45:01Z",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t v = 7;
        if (ctl_ops_time_parse(bad[i], now, &v) != SL_EINVAL)
            fail_msg("accepted \"%s\"", bad[i]);
        assert_int_equal(v, 7);
    }
}

static void test_fmt_ms(void **state)
{
    (void)state;
    char b[40];
    ctl_ops_fmt_ms(1764510301250, b, sizeof(b));
    assert_string_equal(b, "2025-11-30T13:45:01.250Z");
    ctl_ops_fmt_ms(5, b, sizeof(b));
    assert_string_equal(b, "1970-01-01T00:00:00.005Z");
    int64_t back = 0;
    ctl_ops_fmt_ms(1764510301250, b, sizeof(b));
    assert_int_equal(ctl_ops_time_parse(b, 0, &back), 0);
    assert_int_equal(back, 1764510301250);
}

static void test_pg_text_array(void **state)
{
    (void)state;
    const char *items[] = {"a", "b,c", "q\"x", "back\\slash", "{}", ""};
    char *s = sl_pg_text_array(items, 6);
    assert_string_equal(s, "{\"a\",\"b,c\",\"q\\\"x\",\"back\\\\slash\",\"{}\",\"\"}");
    free(s);
    s = sl_pg_text_array(NULL, 0);
    assert_string_equal(s, "{}");
    free(s);
}

/* The consumer's layout, for ids of every shape the contract allows. */
static void test_table(void **state)
{
    (void)state;
    static const char *const head[] = {"name", "n", "note"};
    struct ctl_table t;
    ctl_table_init(&t, 3, head, "lrl");
    ctl_table_add(&t, "%s", "alpha");
    ctl_table_add(&t, "%d", 7);
    ctl_table_add(&t, "x");
    ctl_table_add(&t, "b");
    ctl_table_add(&t, "%d", 1234);
    ctl_table_add(&t, "longer note");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ctl_table_print(&t, f, 2);
    fclose(f);
    assert_string_equal(buf, "  name      n  note\n"
                             "  alpha     7  x\n"
                             "  b      1234  longer note\n");
    free(buf);
    ctl_table_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_accepts),
        cmocka_unit_test(test_duration_rejects),
        cmocka_unit_test(test_duration_format),
        cmocka_unit_test(test_time_parse),
        cmocka_unit_test(test_fmt_ms),
        cmocka_unit_test(test_pg_text_array),
        cmocka_unit_test(test_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
