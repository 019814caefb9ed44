/*
 * Unit tests for ctl/ctl_thresholds and the rule file of ctl/ctl_alert_rules: the defaults
 * reach every field, each flag parses strictly into its own field (and refuses what it
 * must), numbers print as the shortest decimal, and the rule file carries the thresholds it
 * was given. The rule file's semantics are promtool's (tests/ops).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl/ctl.h"
#include "ctl/ctl_alert_rules.h"
#include "ctl/ctl_thresholds.h"

static void test_defaults(void **state)
{
    (void)state;
    struct ctl_thresholds t;
    memset(&t, 0x5a, sizeof(t));
    ctl_thresholds_init(&t);
    assert_true(t.dead_rise_factor == SL_THR_DEAD_RISE_FACTOR);
    assert_int_equal(t.dead_rise_min, SL_THR_DEAD_RISE_MIN);
    assert_int_equal(t.oldest_max_s, SL_THR_OLDEST_MAX_S);
    assert_int_equal(t.slow_threshold_ms, SL_THR_SLOW_THRESHOLD_MS);
    assert_int_equal(t.slow_min_samples, SL_THR_SLOW_MIN_SAMPLES);
    assert_int_equal(t.slow_window_s, SL_THR_SLOW_WINDOW_S);
    assert_int_equal(t.breaker_open_for_s, SL_THR_BREAKER_OPEN_FOR_S);
    assert_int_equal(t.consumer_lag_max, SL_THR_CONSUMER_LAG_MAX);
    assert_int_equal(t.consumer_lag_for_s, SL_THR_CONSUMER_LAG_FOR_S);
    assert_string_equal(t.deliveries_topic, SL_THR_DELIVERIES_TOPIC);
    /* the values `sluicectl alerts` has always used, and sql/0003_analysis.sql's defaults */
    assert_true(SL_THR_DEAD_RISE_FACTOR == 2.0);
    assert_int_equal(SL_THR_DEAD_RISE_MIN, 5);
    assert_int_equal(SL_THR_OLDEST_MAX_S, 1800);
    assert_int_equal(SL_THR_SLOW_THRESHOLD_MS, 2000);
    assert_int_equal(SL_THR_SLOW_MIN_SAMPLES, 20);
    assert_int_equal(SL_THR_SLOW_WINDOW_S, 86400);
}

static void test_flags_set_their_field(void **state)
{
    (void)state;
    struct ctl_thresholds t;
    ctl_thresholds_init(&t);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_DEAD_RISE_FACTOR, "1.25"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_DEAD_RISE_MIN, "7"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_OLDEST_MAX, "2h"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_SLOW_THRESHOLD, "0"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_SLOW_MIN_SAMPLES, "3"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_SLOW_WINDOW, "90m"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_BREAKER_OPEN_FOR, "45s"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_CONSUMER_LAG_MAX, "0"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_CONSUMER_LAG_FOR, "1d"), 0);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_DELIVERIES_TOPIC, "a.B_c-9"), 0);
    assert_true(t.dead_rise_factor == 1.25);
    assert_int_equal(t.dead_rise_min, 7);
    assert_int_equal(t.oldest_max_s, 7200);
    assert_int_equal(t.slow_threshold_ms, 0);
    assert_int_equal(t.slow_min_samples, 3);
    assert_int_equal(t.slow_window_s, 5400);
    assert_int_equal(t.breaker_open_for_s, 45);
    assert_int_equal(t.consumer_lag_max, 0);
    assert_int_equal(t.consumer_lag_for_s, 86400);
    assert_string_equal(t.deliveries_topic, "a.B_c-9");
    /* not a threshold flag: -1 and nothing changed */
    struct ctl_thresholds before = t;
    assert_int_equal(ctl_thresholds_opt("t", &t, 256, "1"), -1);
    assert_memory_equal(&before, &t, sizeof(t));
}

static void test_flags_refuse(void **state)
{
    (void)state;
    static const struct {
        int val;
        const char *arg;
    } bad[] = {{CTL_THR_O_DEAD_RISE_FACTOR, "1e3"},   {CTL_THR_O_DEAD_RISE_FACTOR, "-1"},
               {CTL_THR_O_DEAD_RISE_FACTOR, "2."},    {CTL_THR_O_DEAD_RISE_FACTOR, ".5"},
               {CTL_THR_O_DEAD_RISE_FACTOR, "1001"},  {CTL_THR_O_DEAD_RISE_FACTOR, ""},
               {CTL_THR_O_DEAD_RISE_MIN, "0"},        {CTL_THR_O_DEAD_RISE_MIN, "5x"},
               {CTL_THR_O_OLDEST_MAX, "1800"},        {CTL_THR_O_OLDEST_MAX, "0s"},
               {CTL_THR_O_SLOW_THRESHOLD, "-1"},      {CTL_THR_O_SLOW_THRESHOLD, "86400001"},
               {CTL_THR_O_SLOW_MIN_SAMPLES, "0"},     {CTL_THR_O_SLOW_WINDOW, "367d"},
               {CTL_THR_O_BREAKER_OPEN_FOR, "5"},     {CTL_THR_O_CONSUMER_LAG_MAX, "-1"},
               {CTL_THR_O_CONSUMER_LAG_FOR, "1h30m"}, {CTL_THR_O_DELIVERIES_TOPIC, ""},
               {CTL_THR_O_DELIVERIES_TOPIC, "a\"b"},  {CTL_THR_O_DELIVERIES_TOPIC, "a b"},
               {CTL_THR_O_DELIVERIES_TOPIC, "a'b"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ctl_thresholds t, before;
        ctl_thresholds_init(&t);
        before = t;
        assert_int_equal(ctl_thresholds_opt("t", &t, bad[i].val, bad[i].arg), CTL_EXIT_USAGE);
        assert_memory_equal(&before, &t, sizeof(t));
    }
    char topic[CTL_THR_TOPIC_MAX + 2];
    memset(topic, 'x', sizeof(topic) - 1);
    topic[sizeof(topic) - 1] = '\0'; /* 250 characters: one too many */
    struct ctl_thresholds t;
    ctl_thresholds_init(&t);
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_DELIVERIES_TOPIC, topic),
                     CTL_EXIT_USAGE);
    topic[CTL_THR_TOPIC_MAX] = '\0';
    assert_int_equal(ctl_thresholds_opt("t", &t, CTL_THR_O_DELIVERIES_TOPIC, topic), 0);
    assert_int_equal(strlen(t.deliveries_topic), CTL_THR_TOPIC_MAX);
}

static void test_fmt_number(void **state)
{
    (void)state;
    static const struct {
        double v;
        const char *s;
    } cases[] = {{2.0, "2"},     {1.5, "1.5"},     {0.001, "0.001"}, {0.1, "0.1"}, {0, "0"},
                 {1000, "1000"}, {86400, "86400"}, {2.75, "2.75"},   {1.1, "1.1"}, {0.75, "0.75"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[32];
        ctl_thresholds_fmt_number(cases[i].v, out, sizeof(out));
        assert_string_equal(out, cases[i].s);
    }
}

/* The rule file with some thresholds, as a string (caller frees). */
static char *rules_text(const struct ctl_thresholds *t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ctl_alert_rules_print(f, t);
    assert_int_equal(fclose(f), 0);
    return buf;
}

static void test_rules_carry_the_thresholds(void **state)
{
    (void)state;
    struct ctl_thresholds t;
    ctl_thresholds_init(&t);
    char *def = rules_text(&t);
    assert_non_null(strstr(def, "sum(increase(sluice_dead_letters_total[1h])) >= 5\n"));
    assert_non_null(strstr(def, "> 2 * (sum(increase(sluice_dead_letters_total[24h] offset 1h))"));
    assert_non_null(strstr(def, "expr: max(sluice_oldest_undelivered_age_seconds) > 1800\n"));
    assert_non_null(strstr(def, "_bucket[1d])))\n            > 2\n"));
    assert_non_null(strstr(def, "_count[1d]))\n            >= 20\n"));
    assert_non_null(strstr(def, "expr: max(sluice_breaker_open_endpoints) > 0\n        for: 5m\n"));
    assert_non_null(strstr(def, "{topic=\"sluice.deliveries\"}))\n            > 10000\n"
                                "        for: 10m\n"));
    free(def);

    t.dead_rise_factor = 0.5;
    t.dead_rise_min = 9;
    t.oldest_max_s = 90;
    t.slow_threshold_ms = 1;
    t.slow_min_samples = 3;
    t.slow_window_s = 7200;
    t.breaker_open_for_s = 30;
    t.consumer_lag_max = 7;
    t.consumer_lag_for_s = 120;
    memcpy(t.deliveries_topic, "x.y", 4);
    char *alt = rules_text(&t);
    assert_non_null(strstr(alt, "sum(increase(sluice_dead_letters_total[1h])) >= 9\n"));
    assert_non_null(strstr(alt, "> 0.5 * (sum("));
    assert_non_null(strstr(alt, "_age_seconds) > 90\n"));
    assert_non_null(strstr(alt, "limit 90s"));
    assert_non_null(strstr(alt, "_bucket[2h])))\n            > 0.001\n"));
    assert_non_null(strstr(alt, "_count[2h]))\n            >= 3\n"));
    assert_non_null(strstr(alt, "        for: 30s\n"));
    assert_non_null(strstr(alt, "{topic=\"x.y\"}))\n            > 7\n        for: 2m\n"));
    assert_null(strstr(alt, "sluice.deliveries"));
    assert_null(strstr(alt, "[1d]"));
    free(alt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_flags_set_their_field),
        cmocka_unit_test(test_flags_refuse),
        cmocka_unit_test(test_fmt_number),
        cmocka_unit_test(test_rules_carry_the_thresholds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
