/*
 * Unit tests for consumer/cons_list: push at either end, O(1) unlink from the middle and the
 * ends, pop order, membership, counts, safe iteration while unlinking, and one object on two
 * lists through two links.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "consumer/cons_list.h"

struct item {
    int v;                 /* value */
    struct cons_link a, b; /* links for two lists */
};

static int val_a(struct cons_link *k)
{
    return CONS_CONTAINER(k, struct item, a)->v;
}

static void test_push_pop_order(void **state)
{
    (void)state;
    struct cons_list l;
    cons_list_init(&l);
    assert_true(cons_list_empty(&l));
    assert_null(cons_list_first(&l));
    assert_null(cons_list_pop_head(&l));
    struct item it[4] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}};
    cons_list_push_tail(&l, &it[1].a);
    cons_list_push_tail(&l, &it[2].a);
    cons_list_push_head(&l, &it[0].a);
    cons_list_push_tail(&l, &it[3].a);
    assert_int_equal(l.n, 4);
    assert_int_equal(val_a(cons_list_first(&l)), 0);
    assert_int_equal(val_a(cons_list_last(&l)), 3);
    for (int i = 0; i < 4; i++) {
        struct cons_link *k = cons_list_pop_head(&l);
        assert_int_equal(val_a(k), i);
        assert_false(cons_link_linked(k));
    }
    assert_true(cons_list_empty(&l));
    assert_int_equal(l.n, 0);
}

static void test_unlink_anywhere(void **state)
{
    (void)state;
    struct cons_list l;
    cons_list_init(&l);
    struct item it[5];
    for (int i = 0; i < 5; i++) {
        it[i] = (struct item){.v = i};
        cons_list_push_tail(&l, &it[i].a);
    }
    cons_list_unlink(&l, &it[2].a); /* middle */
    cons_list_unlink(&l, &it[0].a); /* head */
    cons_list_unlink(&l, &it[4].a); /* tail */
    assert_false(cons_link_linked(&it[2].a));
    assert_true(cons_link_linked(&it[1].a));
    assert_int_equal(l.n, 2);
    assert_int_equal(val_a(cons_list_first(&l)), 1);
    assert_int_equal(val_a(cons_list_last(&l)), 3);
    /* an unlinked link goes back on, at either end */
    cons_list_push_head(&l, &it[4].a);
    assert_int_equal(val_a(cons_list_first(&l)), 4);
    assert_int_equal(l.n, 3);
}

static void test_foreach_safe_unlinks(void **state)
{
    (void)state;
    struct cons_list l;
    cons_list_init(&l);
    struct item it[6];
    for (int i = 0; i < 6; i++) {
        it[i] = (struct item){.v = i};
        cons_list_push_tail(&l, &it[i].a);
    }
    struct cons_link *k, *nx;
    int seen = 0;
    CONS_LIST_FOREACH_SAFE(&l, k, nx)
    {
        seen++;
        if (val_a(k) % 2 == 0)
            cons_list_unlink(&l, k);
    }
    assert_int_equal(seen, 6);
    assert_int_equal(l.n, 3);
    int want = 1;
    CONS_LIST_FOREACH_SAFE(&l, k, nx)
    {
        assert_int_equal(val_a(k), want);
        want += 2;
    }
}

static void test_two_lists_two_links(void **state)
{
    (void)state;
    struct cons_list la, lb;
    cons_list_init(&la);
    cons_list_init(&lb);
    struct item x = {.v = 7}, y = {.v = 8};
    cons_list_push_tail(&la, &x.a);
    cons_list_push_tail(&lb, &x.b);
    cons_list_push_tail(&lb, &y.b);
    cons_list_unlink(&la, &x.a);
    assert_true(cons_list_empty(&la));
    assert_int_equal(lb.n, 2);
    assert_int_equal(CONS_CONTAINER(cons_list_first(&lb), struct item, b)->v, 7);
    assert_true(cons_link_linked(&x.b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_pop_order),
        cmocka_unit_test(test_unlink_anywhere),
        cmocka_unit_test(test_foreach_safe_unlinks),
        cmocka_unit_test(test_two_lists_two_links),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
