/*
 * Unit tests for common/sl_map: SipHash reference vectors, insert/replace/get, growth across
 * many doublings, deletion (incl. backward shift inside long collision clusters, checked
 * against a shadow array), iteration, clear/destroy callbacks and seeding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_map.h"

static const uint8_t ref_key[SL_MAP_SEED_LEN] = {0, 1, 2,  3,  4,  5,  6,  7,
                                                 8, 9, 10, 11, 12, 13, 14, 15};

/* SipHash-2-4 reference vectors (Aumasson & Bernstein, vectors_sip64), message 00 01 .. n-1. */
static void test_siphash24_reference(void **state)
{
    (void)state;
    static const struct {
        size_t n;
        uint64_t want;
    } v[] = {
        {0, 0x726fdb47dd0e0e31ULL},  {1, 0x74f839c593dc67fdULL},  {2, 0x0d6c8009d9a94f5aULL},
        {7, 0xab0200f58b01d137ULL},  {8, 0x93f5f5799a932462ULL},  {15, 0xa129ca6149be45e5ULL},
        {16, 0x3f2acc7f57c29bdbULL}, {32, 0x7127512f72f27cceULL}, {63, 0x958a324ceb064572ULL},
    };
    uint8_t msg[64];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        assert_int_equal(sl_siphash(ref_key, msg, v[i].n, 2, 4), v[i].want);
}

/* SipHash-1-3 (what the map uses) with an all-zero key: published values of an independent
 * implementation (digest-sip_hash, Rust), read as integers. */
static void test_siphash13_known(void **state)
{
    (void)state;
    static const uint8_t zero[SL_MAP_SEED_LEN] = {0};
    assert_int_equal(sl_siphash(zero, "", 0, 1, 3), 0xd1fba762150c532cULL);
    assert_int_equal(sl_siphash(zero, "siphash", 7, 1, 3), 0x8264ceeccb16bcbeULL);
    /* A different key gives a different hash: the seed is really mixed in. */
    assert_int_not_equal(sl_siphash(ref_key, "siphash", 7, 1, 3),
                         sl_siphash(zero, "siphash", 7, 1, 3));
}

static void test_put_get_replace(void **state)
{
    (void)state;
    sl_map_t *m = sl_map_new(0);
    int a = 1, b = 2, c = 3;
    void *old = &c;
    assert_int_equal(sl_map_count(m), 0);
    assert_null(sl_map_get(m, "ep_1"));
    assert_false(sl_map_put(m, "ep_1", &a, &old));
    assert_null(old);
    assert_false(sl_map_put(m, "ep_2", &b, NULL));
    assert_int_equal(sl_map_count(m), 2);
    assert_ptr_equal(sl_map_get(m, "ep_1"), &a);
    assert_ptr_equal(sl_map_get(m, "ep_2"), &b);
    /* replace returns the previous value and does not change the count */
    assert_true(sl_map_put(m, "ep_1", &c, &old));
    assert_ptr_equal(old, &a);
    assert_ptr_equal(sl_map_get(m, "ep_1"), &c);
    assert_int_equal(sl_map_count(m), 2);
    /* keys are copied: mutating the caller's buffer does not affect the map */
    char key[8] = "ep_3";
    assert_false(sl_map_put(m, key, &a, NULL));
    key[3] = '9';
    assert_ptr_equal(sl_map_get(m, "ep_3"), &a);
    assert_null(sl_map_get(m, "ep_9"));
    /* NULL values are distinguishable from absence through sl_map_find */
    void *v = &a;
    assert_false(sl_map_put(m, "nullval", NULL, NULL));
    assert_true(sl_map_find(m, "nullval", &v));
    assert_null(v);
    assert_false(sl_map_find(m, "absent", &v));
    /* the empty string is a valid key */
    assert_false(sl_map_put(m, "", &b, NULL));
    assert_ptr_equal(sl_map_get(m, ""), &b);
    sl_map_destroy(m, NULL);
}

#define N_GROW 20000

static void test_growth(void **state)
{
    (void)state;
    sl_map_t *m = sl_map_new(0); /* starts at the minimum size: many doublings */
    char key[32];
    for (uintptr_t i = 0; i < N_GROW; i++) {
        snprintf(key, sizeof(key), "endpoint-%lu", (unsigned long)i);
        assert_false(sl_map_put(m, key, (void *)(i + 1), NULL));
        assert_int_equal(sl_map_count(m), i + 1);
    }
    for (uintptr_t i = 0; i < N_GROW; i++) {
        snprintf(key, sizeof(key), "endpoint-%lu", (unsigned long)i);
        assert_ptr_equal(sl_map_get(m, key), (void *)(i + 1));
    }
    assert_null(sl_map_get(m, "endpoint-20000"));
    sl_map_destroy(m, NULL);
}

/*
 * Deletion against a shadow array, with a tiny key space so that the map keeps long
 * clusters that wrap around the end of the table (a fixed seed makes the run reproducible;
 * the property holds for any seed). Every step checks every key.
 */
#define N_KEYS 200

static void check_against_shadow(const sl_map_t *m, void *const shadow[N_KEYS])
{
    char key[16];
    size_t n = 0;
    for (int k = 0; k < N_KEYS; k++) {
        snprintf(key, sizeof(key), "k%d", k);
        void *v = NULL;
        bool found = sl_map_find(m, key, &v);
        assert_int_equal(found, shadow[k] != NULL);
        if (found) {
            assert_ptr_equal(v, shadow[k]);
            n++;
        }
    }
    assert_int_equal(sl_map_count(m), n);
}

static void test_delete_backward_shift(void **state)
{
    (void)state;
    static const uint8_t seed[SL_MAP_SEED_LEN] = {42, 1, 2,  3,  4,  5,  6,  7,
                                                  8,  9, 10, 11, 12, 13, 14, 15};
    sl_map_t *m = sl_map_new_seeded(N_KEYS, seed);
    void *shadow[N_KEYS] = {0};
    char key[16];
    uint32_t rnd = 12345;
    for (int step = 0; step < 4000; step++) {
        rnd = rnd * 1103515245u + 12345u;
        int k = (int)((rnd >> 8) % N_KEYS);
        snprintf(key, sizeof(key), "k%d", k);
        if ((rnd >> 20) & 1) {
            void *old = (void *)1;
            bool had = sl_map_del(m, key, &old);
            assert_int_equal(had, shadow[k] != NULL);
            if (had)
                assert_ptr_equal(old, shadow[k]);
            shadow[k] = NULL;
        } else {
            void *val = (void *)(uintptr_t)(step + 1);
            bool replaced = sl_map_put(m, key, val, NULL);
            assert_int_equal(replaced, shadow[k] != NULL);
            shadow[k] = val;
        }
        if (step % 50 == 0)
            check_against_shadow(m, shadow);
    }
    check_against_shadow(m, shadow);
    /* delete everything; the map is empty and still usable */
    for (int k = 0; k < N_KEYS; k++) {
        snprintf(key, sizeof(key), "k%d", k);
        assert_int_equal(sl_map_del(m, key, NULL), shadow[k] != NULL);
        shadow[k] = NULL;
    }
    assert_int_equal(sl_map_count(m), 0);
    assert_false(sl_map_del(m, "k1", NULL));
    assert_false(sl_map_put(m, "k1", (void *)7, NULL));
    assert_ptr_equal(sl_map_get(m, "k1"), (void *)7);
    sl_map_destroy(m, NULL);
}

static void test_iteration(void **state)
{
    (void)state;
    sl_map_t *m = sl_map_new(4);
    enum { N = 300 };
    int seen[N] = {0};
    char key[16];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "ep%d", i);
        sl_map_put(m, key, (void *)(uintptr_t)i, NULL);
    }
    /* remove the odd ones: iteration must see exactly the even ones, each once */
    for (int i = 1; i < N; i += 2) {
        snprintf(key, sizeof(key), "ep%d", i);
        assert_true(sl_map_del(m, key, NULL));
    }
    size_t pos = 0, n = 0;
    const char *k;
    void *v;
    while (sl_map_next(m, &pos, &k, &v)) {
        int i = (int)(uintptr_t)v;
        assert_true(i >= 0 && i < N);
        snprintf(key, sizeof(key), "ep%d", i);
        assert_string_equal(k, key);
        seen[i]++;
        n++;
    }
    assert_int_equal(n, N / 2);
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], i % 2 == 0 ? 1 : 0);
    /* an exhausted iterator stays exhausted; an empty map yields nothing */
    assert_false(sl_map_next(m, &pos, &k, &v));
    sl_map_t *e = sl_map_new(0);
    pos = 0;
    assert_false(sl_map_next(e, &pos, NULL, NULL));
    sl_map_destroy(e, NULL);
    sl_map_destroy(m, NULL);
}

static int freed;

static void count_free(void *v)
{
    freed++;
    free(v);
}

static void test_clear_and_destroy_free_values(void **state)
{
    (void)state;
    sl_map_t *m = sl_map_new(0);
    char key[16];
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "x%d", i);
        sl_map_put(m, key, malloc(8), NULL);
    }
    freed = 0;
    sl_map_clear(m, count_free);
    assert_int_equal(freed, 50);
    assert_int_equal(sl_map_count(m), 0);
    assert_null(sl_map_get(m, "x1"));
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "y%d", i);
        sl_map_put(m, key, malloc(8), NULL);
    }
    freed = 0;
    sl_map_destroy(m, count_free);
    assert_int_equal(freed, 10);
    sl_map_destroy(NULL, count_free); /* NULL-safe */
}

/*
 * Seeding: two maps with random seeds lay the same keys out differently (the probability
 * that 64 keys iterate in the same order under two independent seeds is negligible), while
 * two maps with the same explicit seed are identical.
 */
static void iteration_order(const sl_map_t *m, uintptr_t out[64])
{
    size_t pos = 0, i = 0;
    void *v;
    while (sl_map_next(m, &pos, NULL, &v))
        out[i++] = (uintptr_t)v;
}

static void test_seeding(void **state)
{
    (void)state;
    static const uint8_t seed[SL_MAP_SEED_LEN] = {9, 9, 9};
    sl_map_t *r1 = sl_map_new(64), *r2 = sl_map_new(64);
    sl_map_t *s1 = sl_map_new_seeded(64, seed), *s2 = sl_map_new_seeded(64, seed);
    char key[16];
    for (uintptr_t i = 0; i < 64; i++) {
        snprintf(key, sizeof(key), "id-%lu", (unsigned long)i);
        sl_map_put(r1, key, (void *)i, NULL);
        sl_map_put(r2, key, (void *)i, NULL);
        sl_map_put(s1, key, (void *)i, NULL);
        sl_map_put(s2, key, (void *)i, NULL);
    }
    uintptr_t o1[64], o2[64], o3[64], o4[64];
    iteration_order(r1, o1);
    iteration_order(r2, o2);
    iteration_order(s1, o3);
    iteration_order(s2, o4);
    assert_memory_not_equal(o1, o2, sizeof(o1));
    assert_memory_equal(o3, o4, sizeof(o3));
    sl_map_destroy(r1, NULL);
    sl_map_destroy(r2, NULL);
    sl_map_destroy(s1, NULL);
    sl_map_destroy(s2, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash24_reference),
        cmocka_unit_test(test_siphash13_known),
        cmocka_unit_test(test_put_get_replace),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_delete_backward_shift),
        cmocka_unit_test(test_iteration),
        cmocka_unit_test(test_clear_and_destroy_free_values),
        cmocka_unit_test(test_seeding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
