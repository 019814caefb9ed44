/*
 * test_backoff: full-jitter backoff, Retry-After precedence, exhaustion and the RNG
 * (consumer/cons_backoff).
 *
 * The RNG is checked against published vectors: xoshiro256** from state {1,2,3,4} (the
 * reference implementation's outputs, as in the rand_xoshiro crate's test_vector) and
 * splitmix64's first outputs from 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "consumer/cons_backoff.h"

static const struct cons_retry_policy defaults = {
    .base_ms = 30000, .cap_ms = 3600000, .max_attempts = 5};

/* An rng replaying a fixed sequence (cycling). */
struct seq {
    const uint64_t *v; /* values */
    size_t n;          /* count */
    size_t i;          /* next index */
    size_t calls;      /* draws made */
};

static uint64_t seq_next(void *state)
{
    struct seq *s = state;
    s->calls++;
    uint64_t v = s->v[s->i];
    s->i = (s->i + 1) % s->n;
    return v;
}

static struct cons_rng seeded(struct cons_xoshiro *x, uint64_t seed)
{
    cons_xoshiro_seed(x, seed);
    return (struct cons_rng){.next = cons_xoshiro_next, .state = x};
}

/* ==== RNG ==== */

static void test_xoshiro_published_vector(void **state)
{
    (void)state;
    struct cons_xoshiro x = {.s = {1, 2, 3, 4}};
    static const uint64_t want[] = {11520u,
                                    0u,
                                    1509978240u,
                                    1215971899390074240u,
                                    1216172134540287360u,
                                    607988272756665600u,
                                    16172922978634559625u,
                                    8476171486693032832u,
                                    10595114339597558777u,
                                    2904607092377533576u};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        assert_true(cons_xoshiro_next(&x) == want[i]);
    /* Seeding runs splitmix64: its first outputs from 0 are the state. */
    cons_xoshiro_seed(&x, 0);
    assert_true(x.s[0] == 0xe220a8397b1dcdafULL);
    assert_true(x.s[1] == 0x6e789e6aa1b965f4ULL);
    assert_true(x.s[2] == 0x06c45d188009454fULL);
    assert_true(x.s[3] == 0xf88bb8a8724c81ecULL);
}

static void test_rng_default_per_thread_and_seeded(void **state)
{
    (void)state;
    struct cons_rng *a = cons_rng_default();
    assert_non_null(a);
    assert_non_null(a->next);
    assert_ptr_equal(a, cons_rng_default()); /* one per thread, kept */
    /* Draws differ (a stuck generator would make every delay equal). */
    uint64_t first = a->next(a->state);
    int same = 0;
    for (int i = 0; i < 64; i++)
        same += a->next(a->state) == first;
    assert_true(same < 2);
}

static void test_uniform_rejection_and_edges(void **state)
{
    (void)state;
    /* bound 0: always 0, with or without drawing */
    struct cons_xoshiro x;
    struct cons_rng r = seeded(&x, 7);
    for (int i = 0; i < 100; i++)
        assert_int_equal(cons_rng_uniform(&r, 0), 0);
    /* bound UINT64_MAX: the raw draw */
    static const uint64_t raw[] = {0xdeadbeefcafef00dULL};
    struct seq s1 = {raw, 1, 0, 0};
    struct cons_rng r1 = {seq_next, &s1};
    assert_true(cons_rng_uniform(&r1, UINT64_MAX) == 0xdeadbeefcafef00dULL);
    /* range 3: 2^64 mod 3 = 1, so a draw of 0 is rejected (it would favour 0) */
    static const uint64_t draws[] = {0, 5};
    struct seq s2 = {draws, 2, 0, 0};
    struct cons_rng r2 = {seq_next, &s2};
    assert_int_equal(cons_rng_uniform(&r2, 2), 2);
    assert_int_equal(s2.calls, 2);
    /* range 2^63+1: 2^64 mod range = 2^63-1, so a draw of 1 is rejected */
    static const uint64_t big[] = {1, UINT64_MAX};
    struct seq s3 = {big, 2, 0, 0};
    struct cons_rng r3 = {seq_next, &s3};
    uint64_t v = cons_rng_uniform(&r3, (uint64_t)INT64_MAX + 1);
    assert_true(v == (UINT64_C(1) << 63) - 2);
    assert_int_equal(s3.calls, 2);
    /* range 2^63 (the largest delay ceiling, INT64_MAX): a power of two, nothing rejected */
    struct seq s4 = {big, 2, 0, 0};
    struct cons_rng r4 = {seq_next, &s4};
    assert_int_equal(cons_rng_uniform(&r4, (uint64_t)INT64_MAX), 1);
    assert_int_equal(s4.calls, 1);
}

/* ==== Ceiling and delay ==== */

static void test_ceiling_table(void **state)
{
    (void)state;
    static const struct {
        int64_t base, cap;
        uint32_t attempt;
        int64_t want;
    } rows[] = {
        {30000, 3600000, 0, 30000},
        {30000, 3600000, 1, 60000},
        {30000, 3600000, 2, 120000},
        {30000, 3600000, 6, 1920000},
        {30000, 3600000, 7, 3600000}, /* 3840000 capped */
        {30000, 3600000, 62, 3600000},
        {30000, 3600000, 63, 3600000},
        {30000, 3600000, 64, 3600000},
        {30000, 3600000, 70, 3600000},
        {30000, 3600000, UINT32_MAX, 3600000},
        {1, INT64_MAX, 0, 1},
        {1, INT64_MAX, 62, INT64_C(1) << 62},
        {1, INT64_MAX, 63, INT64_MAX}, /* 2^63 does not fit: cap */
        {3, INT64_MAX, 62, INT64_MAX}, /* 3 * 2^62 > INT64_MAX */
        {3, INT64_MAX, 61, INT64_C(3) << 61},
        {INT64_MAX, INT64_MAX, 0, INT64_MAX},
        {INT64_MAX, INT64_MAX, 70, INT64_MAX},
        {5000, 5000, 3, 5000}, /* base == cap */
        {9000, 5000, 0, 5000}, /* base > cap */
        {0, 5000, 10, 0},      /* no base: immediate */
        {-10, 5000, 10, 0},
        {1000, 0, 10, 0}, /* no cap: immediate */
        {1000, -5, 0, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct cons_retry_policy p = {rows[i].base, rows[i].cap, 5};
        int64_t got = cons_backoff_ceiling_ms(&p, rows[i].attempt);
        if (got != rows[i].want)
            fail_msg("row %zu: got %lld want %lld", i, (long long)got, (long long)rows[i].want);
    }
}

/* Every attempt 0..70, several policies: 0 <= delay <= ceiling <= cap, no overflow. */
static void test_bounds_every_attempt(void **state)
{
    (void)state;
    static const struct cons_retry_policy policies[] = {
        {30000, 3600000, 5},         {1, INT64_MAX, 100}, {INT64_MAX / 3, INT64_MAX, 100},
        {INT64_MAX, INT64_MAX, 100}, {250, 1000, 100},
    };
    /* Adversarial draws around the rejection thresholds plus a seeded stream. */
    static const uint64_t edges[] = {
        0, 1, UINT64_MAX, UINT64_MAX - 1, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX + 1};
    struct cons_xoshiro x;
    struct cons_rng r = seeded(&x, 42);
    for (size_t pi = 0; pi < sizeof(policies) / sizeof(policies[0]); pi++) {
        const struct cons_retry_policy *p = &policies[pi];
        int64_t prev_ceiling = 0;
        for (uint32_t a = 0; a <= 70; a++) {
            int64_t ceiling = cons_backoff_ceiling_ms(p, a);
            assert_true(ceiling >= 0 && ceiling <= p->cap_ms);
            assert_true(ceiling >= prev_ceiling); /* never shrinks with attempts */
            prev_ceiling = ceiling;
            for (int k = 0; k < 200; k++) {
                int64_t d = cons_backoff_delay_ms(p, a, &r);
                if (d < 0 || d > ceiling)
                    fail_msg("policy %zu attempt %u: delay %lld outside [0, %lld]", pi, a,
                             (long long)d, (long long)ceiling);
            }
            struct seq s = {edges, sizeof(edges) / sizeof(edges[0]), 0, 0};
            struct cons_rng er = {seq_next, &s};
            for (int k = 0; k < 4; k++) {
                int64_t d = cons_backoff_delay_ms(p, a, &er);
                assert_true(d >= 0 && d <= ceiling);
            }
            /* and through cons_backoff_next from a large clock: saturates, never wraps */
            int64_t due = cons_backoff_next(p, a, INT64_MAX - 5, 0, &r);
            assert_true(due >= INT64_MAX - 5);
            due = cons_backoff_next(p, a, 1000, 0, &r);
            assert_true(due >= 1000);
            assert_true(due - 1000 <= ceiling);
        }
    }
}

static void test_deterministic_with_injected_rng(void **state)
{
    (void)state;
    struct cons_xoshiro x1, x2;
    struct cons_rng r1 = seeded(&x1, 12345), r2 = seeded(&x2, 12345);
    for (uint32_t a = 0; a < 20; a++)
        assert_int_equal(cons_backoff_delay_ms(&defaults, a, &r1),
                         cons_backoff_delay_ms(&defaults, a, &r2));
    /* Attempt 3: ceiling 240000, range 240001. A draw of range gives zero delay; a draw equal
     * to the ceiling gives the ceiling (both are above the rejection threshold, which is
     * below the range). */
    static const uint64_t zero[] = {240001};
    struct seq s = {zero, 1, 0, 0};
    struct cons_rng rz = {seq_next, &s};
    assert_int_equal(cons_backoff_delay_ms(&defaults, 3, &rz), 0);
    static const uint64_t top[] = {240000};
    struct seq t = {top, 1, 0, 0};
    struct cons_rng rt = {seq_next, &t};
    assert_int_equal(cons_backoff_delay_ms(&defaults, 3, &rt), 240000);
    /* NULL rng uses the thread default and stays in bounds */
    for (int i = 0; i < 100; i++) {
        int64_t d = cons_backoff_delay_ms(&defaults, 2, NULL);
        assert_true(d >= 0 && d <= 120000);
    }
}

/* Mean of 10,000 full-jitter samples is ceiling/2 within 10% (a statistical assertion:
 * the standard error is about 0.3% of the ceiling, so a failure means a broken generator
 * or range, not bad luck). Also both ends of the range are reached. */
static void test_distribution(void **state)
{
    (void)state;
    static const uint32_t attempts[] = {0, 3, 6, 12};
    for (size_t i = 0; i < sizeof(attempts) / sizeof(attempts[0]); i++) {
        int64_t ceiling = cons_backoff_ceiling_ms(&defaults, attempts[i]);
        double sum = 0;
        int low = 0, high = 0;
        const int n = 10000;
        for (int k = 0; k < n; k++) {
            int64_t d = cons_backoff_delay_ms(&defaults, attempts[i], NULL);
            sum += (double)d;
            low += d < ceiling / 10;
            high += d > ceiling - ceiling / 10;
        }
        double mean = sum / n;
        double expected = (double)ceiling / 2.0;
        if (mean < expected * 0.9 || mean > expected * 1.1)
            fail_msg("attempt %u: mean %.1f, expected %.1f +- 10%%", attempts[i], mean, expected);
        /* about 1,000 each expected; 500 is far outside chance */
        assert_true(low > 500);
        assert_true(high > 500);
    }
}

/* ==== Retry-After and exhaustion ==== */

static void test_retry_after_precedence(void **state)
{
    (void)state;
    /* Attempt 1: ceiling 60000, range 60001; draws of range + d give delay d. */
    static const uint64_t zero[] = {60001};
    struct seq s = {zero, 1, 0, 0};
    struct cons_rng rz = {seq_next, &s};
    const int64_t now = 1700000000000;
    /* jitter 0: a Retry-After is longer, so it wins */
    assert_int_equal(cons_backoff_next(&defaults, 1, now, 5000, &rz), now + 5000);
    /* ... but never beyond the cap */
    assert_int_equal(cons_backoff_next(&defaults, 1, now, 7200000, &rz), now + 3600000);
    assert_int_equal(cons_backoff_next(&defaults, 1, now, INT64_MAX, &rz), now + 3600000);
    /* none given */
    assert_int_equal(cons_backoff_next(&defaults, 1, now, 0, &rz), now);
    assert_int_equal(cons_backoff_next(&defaults, 1, now, -1, &rz), now);

    /* jitter larger than the Retry-After: the jittered delay stands */
    static const uint64_t draw[] = {60001 + 50000};
    struct seq t = {draw, 1, 0, 0};
    struct cons_rng rt = {seq_next, &t};
    assert_int_equal(cons_backoff_next(&defaults, 1, now, 10000, &rt), now + 50000);
    assert_int_equal(cons_backoff_next(&defaults, 1, now, 50001, &rt), now + 50001);

    /* same stream: next == now + max(delay, min(ra, cap)) */
    struct cons_xoshiro x1, x2;
    struct cons_rng a = seeded(&x1, 99), b = seeded(&x2, 99);
    for (uint32_t k = 0; k < 10; k++) {
        int64_t ra = (int64_t)k * 100000;
        int64_t d = cons_backoff_delay_ms(&defaults, k, &b);
        int64_t want = d > ra ? d : (ra < defaults.cap_ms ? ra : defaults.cap_ms);
        assert_int_equal(cons_backoff_next(&defaults, k, now, ra, &a), now + want);
    }
    /* saturation at the end of time */
    assert_true(cons_backoff_next(&defaults, 1, INT64_MAX - 10, 5000, &rz) == INT64_MAX);
}

static void test_exhausted(void **state)
{
    (void)state;
    for (uint32_t a = 0; a < 5; a++)
        assert_false(cons_backoff_exhausted(&defaults, a));
    assert_true(cons_backoff_exhausted(&defaults, 5));
    assert_true(cons_backoff_exhausted(&defaults, 6));
    assert_true(cons_backoff_exhausted(&defaults, UINT32_MAX));
    struct cons_retry_policy one = {30000, 3600000, 1};
    assert_false(cons_backoff_exhausted(&one, 0));
    assert_true(cons_backoff_exhausted(&one, 1));
    struct cons_retry_policy zero = {30000, 3600000, 0}; /* acts as 1 */
    assert_false(cons_backoff_exhausted(&zero, 0));
    assert_true(cons_backoff_exhausted(&zero, 1));
    struct cons_retry_policy many = {30000, 3600000, UINT32_MAX};
    assert_false(cons_backoff_exhausted(&many, UINT32_MAX - 1));
    assert_true(cons_backoff_exhausted(&many, UINT32_MAX));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xoshiro_published_vector),
        cmocka_unit_test(test_rng_default_per_thread_and_seeded),
        cmocka_unit_test(test_uniform_rejection_and_edges),
        cmocka_unit_test(test_ceiling_table),
        cmocka_unit_test(test_bounds_every_attempt),
        cmocka_unit_test(test_deterministic_with_injected_rng),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_retry_after_precedence),
        cmocka_unit_test(test_exhausted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
