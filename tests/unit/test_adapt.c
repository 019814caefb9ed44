/*
 * test_adapt: the delivery loop's adaptive in-flight cap (consumer/cons_adapt): it falls by a
 * quarter per saturated window down to its floor (from what runs, when that is less; only
 * with answers piling up between turns and at least the floor out), grows by half per window
 * in which the loop waited and the cap held an endpoint back, stays put otherwise, and never
 * moves when it is off or its share is at or below the floor.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "consumer/cons_adapt.h"

#define W ((int64_t)CONS_ADAPT_WINDOW_US)

/* One whole window at t (µs), one turn, idle_us of it idle, bound or not, answers piling up
 * (CONS_ADAPT_PILE in the turn), the cap full at its end; returns the change. */
static int64_t window(struct cons_adapt *a, int64_t *t, int64_t idle_us, bool bound)
{
    if (bound)
        cons_adapt_bound(a);
    *t += W;
    return cons_adapt_tick(a, *t, idle_us, CONS_ADAPT_PILE, cons_adapt_limit(a));
}

static struct cons_adapt started(int64_t max, bool enabled, int64_t *t)
{
    struct cons_adapt a;
    cons_adapt_init(&a, max, enabled);
    *t = 1000;
    assert_int_equal(cons_adapt_tick(&a, *t, 0, 0, 0), 0); /* the first tick opens the window */
    return a;
}

static void test_starts_at_max(void **state)
{
    (void)state;
    struct cons_adapt a;
    cons_adapt_init(&a, 5000, true);
    assert_int_equal(cons_adapt_limit(&a), 5000);
    assert_int_equal(a.floor, CONS_ADAPT_FLOOR);
    cons_adapt_init(&a, 0, true); /* a share is at least one request */
    assert_int_equal(cons_adapt_limit(&a), 1);
}

static void test_saturated_falls_by_a_quarter_to_the_floor(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt a = started(5000, true, &t);
    assert_int_equal(window(&a, &t, 0, true), -1250);
    assert_int_equal(cons_adapt_limit(&a), 3750);
    assert_int_equal(window(&a, &t, W / 20, false), -937); /* 5% idle: still saturated */
    assert_int_equal(cons_adapt_limit(&a), 2813);
    for (int i = 0; i < 40; i++)
        (void)window(&a, &t, 0, true);
    assert_int_equal(cons_adapt_limit(&a), CONS_ADAPT_FLOOR);
    assert_int_equal(window(&a, &t, 0, true), 0); /* at the floor: no further */
}

static void test_grows_by_half_only_when_waiting_and_bound(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt a = started(5000, true, &t);
    for (int i = 0; i < 40; i++)
        (void)window(&a, &t, 0, true);
    assert_int_equal(cons_adapt_limit(&a), CONS_ADAPT_FLOOR);
    /* idle but nothing held back: the cap is not what limits the loop */
    assert_int_equal(window(&a, &t, W / 2, false), 0);
    /* held back but only 20% idle: between the thresholds, unchanged */
    assert_int_equal(window(&a, &t, W / 5, true), 0);
    /* 30% idle and held back: + half + 1 */
    assert_int_equal(window(&a, &t, W * 3 / 10, true), CONS_ADAPT_FLOOR / 2 + 1);
    /* back to max within a second of such windows, and not beyond it */
    for (int i = 0; i < 10; i++)
        (void)window(&a, &t, W / 2, true);
    assert_int_equal(cons_adapt_limit(&a), 5000);
    assert_int_equal(window(&a, &t, W / 2, true), 0);
}

static void test_a_window_closes_only_when_it_has_lasted(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt a = started(1000, true, &t);
    assert_int_equal(window(&a, &t, 0, false), -250); /* saturated: 750 */
    cons_adapt_bound(&a);
    assert_int_equal(cons_adapt_tick(&a, t + W / 2, 0, 100, 750),
                     0); /* half a window: no decision */
    assert_int_equal(cons_adapt_limit(&a), 750);
    /* the idle time of the whole window counts: 40 ms idle in the first half, then busy */
    assert_int_equal(cons_adapt_tick(&a, t + W / 2 + 1, W * 4 / 10, 0, 750), 0);
    assert_int_equal(cons_adapt_tick(&a, t + W, 0, 0, 750), 250); /* 40% idle, bound: 1126 -> max */
    assert_int_equal(cons_adapt_limit(&a), 1000);
    t += W;
    /* a long wait is one long window: its idle share decides */
    assert_int_equal(cons_adapt_tick(&a, t + 10 * W, 0, 100, 1000), -250);
}

/* Busy with something other than its requests (a rebalance, a slow Redis call) while fewer
 * than the floor are out: the cap is not what keeps the loop busy, so it stays. With more out
 * but under the cap (the per-endpoint caps hold them), it falls from what runs. */
static void test_saturated_falls_from_what_runs(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt a = started(2000, true, &t);
    t += W;
    assert_int_equal(cons_adapt_tick(&a, t, 0, 100, 0), 0);
    t += W;
    assert_int_equal(cons_adapt_tick(&a, t, 0, 100, CONS_ADAPT_FLOOR - 1), 0);
    assert_int_equal(cons_adapt_limit(&a), 2000);
    t += W;
    assert_int_equal(cons_adapt_tick(&a, t, 0, 100, 1000), -1250); /* 3/4 of 1000 */
    assert_int_equal(cons_adapt_limit(&a), 750);
    t += W;
    assert_int_equal(cons_adapt_tick(&a, t, 0, 100, 150), -750 + CONS_ADAPT_FLOOR); /* floor */
}

/* A loop busy without answers piling up between its turns (reading and spilling a Kafka
 * backlog while slow endpoints answer a few per turn) is not held up by its requests: it
 * keeps its cap. The average over the window's turns decides. */
static void test_busy_without_answers_piling_up_keeps_the_cap(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt a = started(2000, true, &t);
    for (int i = 0; i < 99; i++) /* 99 turns, 3 answers each: 297 < 16 x 100 */
        assert_int_equal(cons_adapt_tick(&a, t + i + 1, 0, 3, 2000), 0);
    assert_int_equal(cons_adapt_tick(&a, t + W, 0, 3, 2000), 0);
    assert_int_equal(cons_adapt_limit(&a), 2000);
    t += W;
    for (int i = 0; i < 99; i++) /* the same turns with 16 answers each: piling up */
        assert_int_equal(cons_adapt_tick(&a, t + i + 1, 0, 16, 2000), 0);
    assert_int_equal(cons_adapt_tick(&a, t + W, 0, 16, 2000), -500);
}

static void test_off_or_small_share_never_moves(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt off = started(5000, false, &t);
    for (int i = 0; i < 10; i++)
        assert_int_equal(window(&off, &t, 0, true), 0);
    assert_int_equal(cons_adapt_limit(&off), 5000);
    struct cons_adapt small = started(CONS_ADAPT_FLOOR, true, &t);
    for (int i = 0; i < 10; i++)
        assert_int_equal(window(&small, &t, 0, true), 0);
    assert_int_equal(cons_adapt_limit(&small), CONS_ADAPT_FLOOR);
    struct cons_adapt tiny = started(4, true, &t);
    assert_int_equal(tiny.floor, 4);
    assert_int_equal(window(&tiny, &t, 0, true), 0);
    assert_int_equal(cons_adapt_limit(&tiny), 4);
}

/* A loop saturated by a backlog to endpoints that answer at once, modelled: its idle share is
 * 0 above the in-flight count that keeps it busy (here 300) and grows below it. The cap must
 * settle within a window's step of that count, not at max or at the floor. */
static void test_settles_near_the_count_that_keeps_the_loop_busy(void **state)
{
    (void)state;
    int64_t t;
    struct cons_adapt a = started(5000, true, &t);
    const int64_t need = 300;
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < 200; i++) {
        int64_t cap = cons_adapt_limit(&a);
        int64_t idle = cap >= need ? 0 : W * (need - cap) / need;
        (void)window(&a, &t, idle, true);
        if (i >= 100) {
            lo = cons_adapt_limit(&a) < lo ? cons_adapt_limit(&a) : lo;
            hi = cons_adapt_limit(&a) > hi ? cons_adapt_limit(&a) : hi;
        }
    }
    assert_true(lo >= need * 3 / 4 - 1);
    assert_true(hi <= need * 3 / 2 + 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_starts_at_max),
        cmocka_unit_test(test_saturated_falls_by_a_quarter_to_the_floor),
        cmocka_unit_test(test_grows_by_half_only_when_waiting_and_bound),
        cmocka_unit_test(test_a_window_closes_only_when_it_has_lasted),
        cmocka_unit_test(test_saturated_falls_from_what_runs),
        cmocka_unit_test(test_busy_without_answers_piling_up_keeps_the_cap),
        cmocka_unit_test(test_off_or_small_share_never_moves),
        cmocka_unit_test(test_settles_near_the_count_that_keeps_the_loop_busy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
