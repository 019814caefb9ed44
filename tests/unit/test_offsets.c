/*
 * Contiguous offsets (invariant 1): out-of-order completion never skips a message, stale
 * references from a revoked generation never move the new owner's offsets, growth of the ring
 * keeps positions, and gaps in offsets (compaction) are handled. In builds with assertions
 * (no NDEBUG: debug and sanitizer builds), breaking the tracker's invariants aborts.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "consumer/cons_offsets.h"

static void test_out_of_order_completion(void **state)
{
    (void)state;
    cons_offsets_t *o = cons_offsets_new();
    cons_offsets_assign(o, 3);
    struct cons_offset_ref r[5];
    for (int i = 0; i < 5; i++)
        assert_true(cons_offsets_track(o, 3, 100 + i, &r[i]));
    uint64_t pending = 0;
    /* nothing finished: "resume at 100" */
    assert_int_equal(cons_offsets_committable(o, 3, &pending), 100);
    assert_int_equal(pending, 5);
    cons_offsets_finish(o, &r[2]);
    cons_offsets_finish(o, &r[4]);
    assert_int_equal(cons_offsets_committable(o, 3, NULL), -1); /* unchanged: still 100 */
    cons_offsets_finish(o, &r[0]);
    assert_int_equal(cons_offsets_committable(o, 3, &pending), 101);
    assert_int_equal(pending, 4);
    cons_offsets_finish(o, &r[1]);
    assert_int_equal(cons_offsets_committable(o, 3, NULL), 103);
    cons_offsets_finish(o, &r[3]);
    assert_int_equal(cons_offsets_committable(o, 3, &pending), 105);
    assert_int_equal(pending, 0);
    assert_int_equal(cons_offsets_committable(o, 3, NULL), -1);
    cons_offsets_destroy(o);
}

static void test_revoke_invalidates_refs(void **state)
{
    (void)state;
    cons_offsets_t *o = cons_offsets_new();
    cons_offsets_assign(o, 0);
    struct cons_offset_ref old;
    assert_true(cons_offsets_track(o, 0, 7, &old));
    cons_offsets_revoke(o, 0);
    assert_false(cons_offsets_current(o, &old));
    struct cons_offset_ref tmp;
    assert_false(cons_offsets_track(o, 0, 8, &tmp)); /* not ours any more */
    cons_offsets_assign(o, 0);                       /* assigned again (a later rebalance) */
    struct cons_offset_ref fresh;
    assert_true(cons_offsets_track(o, 0, 7, &fresh));
    cons_offsets_finish(o, &old); /* stale: must not count */
    assert_int_equal(cons_offsets_committable(o, 0, NULL), 7);
    cons_offsets_finish(o, &fresh);
    assert_int_equal(cons_offsets_committable(o, 0, NULL), 8);
    cons_offsets_destroy(o);
}

static void test_unassigned_partition(void **state)
{
    (void)state;
    cons_offsets_t *o = cons_offsets_new();
    struct cons_offset_ref r;
    assert_false(cons_offsets_track(o, 5, 1, &r));
    assert_int_equal(cons_offsets_committable(o, 5, NULL), -1);
    assert_false(cons_offsets_track(o, -1, 1, &r));
    cons_offsets_destroy(o);
}

static void test_growth_and_gaps(void **state)
{
    (void)state;
    cons_offsets_t *o = cons_offsets_new();
    cons_offsets_assign(o, 1);
    enum { N = 5000 };
    static struct cons_offset_ref r[N];
    for (int i = 0; i < N; i++)
        assert_true(cons_offsets_track(o, 1, (int64_t)i * 3, &r[i])); /* gaps of 3 */
    /* finish all but the first, in reverse order */
    for (int i = N - 1; i >= 1; i--)
        cons_offsets_finish(o, &r[i]);
    assert_int_equal(cons_offsets_committable(o, 1, NULL), 0);
    assert_int_equal(cons_offsets_pending(o), N);
    cons_offsets_finish(o, &r[0]);
    assert_int_equal(cons_offsets_committable(o, 1, NULL), (int64_t)(N - 1) * 3 + 1);
    assert_int_equal(cons_offsets_pending(o), 0);
    int32_t parts[4];
    assert_int_equal(cons_offsets_partitions(o, parts, 4), 1);
    assert_int_equal(parts[0], 1);
    cons_offsets_destroy(o);
}

/* Partition ids past the first thousands are tracked and listed (a store once listed at most
 * 1,024 and the tracker stopped at 4,096); an id outside the range is refused, not ignored. */
static void test_many_partitions(void **state)
{
    (void)state;
    cons_offsets_t *o = cons_offsets_new();
    const int32_t ids[] = {0, 1500, 5000, CONS_OFFSETS_MAX_PARTITIONS - 1};
    const int n = (int)(sizeof(ids) / sizeof(ids[0]));
    struct cons_offset_ref r[4];
    for (int i = 0; i < n; i++) {
        assert_true(cons_offsets_assign(o, ids[i]));
        assert_true(cons_offsets_track(o, ids[i], 7, &r[i]));
        cons_offsets_finish(o, &r[i]);
    }
    assert_false(cons_offsets_assign(o, CONS_OFFSETS_MAX_PARTITIONS));
    assert_false(cons_offsets_assign(o, -1));
    int span = cons_offsets_span(o);
    assert_true(span >= n);
    int32_t *parts = calloc((size_t)span, sizeof(*parts));
    assert_int_equal(cons_offsets_partitions(o, parts, span), n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(parts[i], ids[i]);
        assert_int_equal(cons_offsets_committable(o, ids[i], NULL), 8);
    }
    free(parts);
    cons_offsets_destroy(o);
}

#ifndef NDEBUG
/* Run fn in a child; true when it died of SIGABRT (a failed SL_ASSERT). */
static bool aborts(void (*fn)(void))
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        (void)freopen("/dev/null", "w", stderr); /* the expected assertion message */
        fn();
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void finish_twice(void)
{
    cons_offsets_t *o = cons_offsets_new();
    cons_offsets_assign(o, 0);
    struct cons_offset_ref a, b;
    cons_offsets_track(o, 0, 10, &a);
    cons_offsets_track(o, 0, 11, &b);
    cons_offsets_finish(o, &b);
    cons_offsets_finish(o, &b); /* b is still in the ring (a holds the head) */
}

static void offsets_backwards(void)
{
    cons_offsets_t *o = cons_offsets_new();
    cons_offsets_assign(o, 0);
    struct cons_offset_ref a, b;
    cons_offsets_track(o, 0, 10, &a);
    cons_offsets_track(o, 0, 10, &b);
}

static void well_behaved(void)
{
    cons_offsets_t *o = cons_offsets_new();
    cons_offsets_assign(o, 0);
    struct cons_offset_ref a, b;
    cons_offsets_track(o, 0, 10, &a);
    cons_offsets_track(o, 0, 12, &b);
    cons_offsets_finish(o, &b);
    cons_offsets_finish(o, &a);
    cons_offsets_finish(o, &a); /* stale (below the head): ignored, not a breach */
    (void)cons_offsets_committable(o, 0, NULL);
    cons_offsets_revoke(o, 0);
    cons_offsets_assign(o, 0);
    cons_offsets_track(o, 0, 5, &a); /* a new generation may start lower */
    cons_offsets_destroy(o);
}

static void test_invariant_breaches_abort(void **state)
{
    (void)state;
    assert_true(aborts(finish_twice));
    assert_true(aborts(offsets_backwards));
    assert_false(aborts(well_behaved));
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_order_completion),
        cmocka_unit_test(test_revoke_invalidates_refs),
        cmocka_unit_test(test_unassigned_partition),
        cmocka_unit_test(test_growth_and_gaps),
        cmocka_unit_test(test_many_partitions),
#ifndef NDEBUG
        cmocka_unit_test(test_invariant_breaches_abort),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
