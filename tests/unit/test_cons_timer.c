/*
 * Unit tests for consumer/cons_timer: arming, arming to the earlier deadline, disarming,
 * expiry, the nearest deadline and the loop's wait (clamped to 0..max).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "consumer/cons_timer.h"

static void test_empty_set_waits_max(void **state)
{
    (void)state;
    struct cons_timers t;
    cons_timers_init(&t, 4);
    assert_int_equal(cons_timers_next(&t), CONS_TIMER_NONE);
    assert_int_equal(cons_timers_wait_ms(&t, 1000, 250), 250);
    for (int i = 0; i < 4; i++) {
        assert_false(cons_timer_armed(&t, i));
        assert_false(cons_timer_expired(&t, i, INT64_MAX - 1));
    }
}

static void test_nearest_and_wait(void **state)
{
    (void)state;
    struct cons_timers t;
    cons_timers_init(&t, 4);
    cons_timer_arm(&t, 0, 1100);
    cons_timer_arm(&t, 2, 1040);
    assert_int_equal(cons_timers_next(&t), 1040);
    assert_int_equal(cons_timers_wait_ms(&t, 1000, 250), 40);
    assert_int_equal(cons_timers_wait_ms(&t, 1000, 10), 10); /* clamped to the bound */
    assert_int_equal(cons_timers_wait_ms(&t, 1040, 250), 0); /* due now */
    assert_int_equal(cons_timers_wait_ms(&t, 5000, 250), 0); /* overdue */
    assert_false(cons_timer_expired(&t, 2, 1039));
    assert_true(cons_timer_expired(&t, 2, 1040));
    cons_timer_disarm(&t, 2);
    assert_int_equal(cons_timers_next(&t), 1100);
    /* re-arming replaces, later or earlier */
    cons_timer_arm(&t, 0, 2000);
    assert_int_equal(cons_timers_next(&t), 2000);
    cons_timer_arm(&t, 0, 0);
    assert_true(cons_timer_expired(&t, 0, 0));
}

static void test_arm_min_keeps_earlier(void **state)
{
    (void)state;
    struct cons_timers t;
    cons_timers_init(&t, 2);
    cons_timer_arm_min(&t, 1, 500); /* disarmed: arms */
    assert_int_equal(cons_timers_next(&t), 500);
    cons_timer_arm_min(&t, 1, 900); /* later: kept at 500 */
    assert_int_equal(cons_timers_next(&t), 500);
    cons_timer_arm_min(&t, 1, 300); /* earlier: moves */
    assert_int_equal(cons_timers_next(&t), 300);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_set_waits_max),
        cmocka_unit_test(test_nearest_and_wait),
        cmocka_unit_test(test_arm_min_keeps_earlier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
