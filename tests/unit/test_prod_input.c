/*
 * Unit tests for sluice-produce's input side: the bounded line reader (prod_lines) and the
 * synthetic generator (prod_gen). No network.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/sl_record.h"
#include "producer/prod_gen.h"
#include "producer/prod_lines.h"

/* Write data to a temp file; returns its path in path (cap bytes). */
static void temp_file(char *path, size_t cap, const void *data, size_t n)
{
    snprintf(path, cap, "/tmp/sl_test_prod_input_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, n), (ssize_t)n);
    assert_int_equal(close(fd), 0);
}

static void test_lines_basic(void **state)
{
    (void)state;
    static const char in[] = "a\n\nbc\r\nlast-no-newline";
    char path[64];
    temp_file(path, sizeof(path), in, sizeof(in) - 1);
    struct prod_lines lr;
    assert_int_equal(prod_lines_open(&lr, path, 100, NULL), 0);
    const char *l;
    size_t n;
    assert_int_equal(prod_lines_next(&lr, &l, &n, NULL), 1);
    assert_int_equal(n, 1);
    assert_string_equal(l, "a");
    assert_int_equal(lr.lineno, 1);
    assert_int_equal(prod_lines_next(&lr, &l, &n, NULL), 1);
    assert_int_equal(n, 0);
    assert_int_equal(prod_lines_next(&lr, &l, &n, NULL), 1);
    assert_string_equal(l, "bc\r"); /* CR is left to the JSON parser (whitespace) */
    assert_int_equal(prod_lines_next(&lr, &l, &n, NULL), 1);
    assert_string_equal(l, "last-no-newline");
    assert_int_equal(lr.lineno, 4);
    assert_int_equal(prod_lines_next(&lr, &l, &n, NULL), 0);
    assert_int_equal(prod_lines_next(&lr, &l, &n, NULL), 0);
    prod_lines_close(&lr);
    prod_lines_close(&lr); /* idempotent */
    unlink(path);
}

/* Lines over the cap are reported with their number and skipped; memory stays bounded. */
static void test_lines_too_long(void **state)
{
    (void)state;
    size_t big = 300 * 1024; /* several read chunks */
    char *in = malloc(big + 64);
    size_t n = 0;
    memcpy(in + n, "ok1\n", 4);
    n += 4;
    memset(in + n, 'x', big);
    n += big;
    in[n++] = '\n';
    memcpy(in + n, "ok3\n", 4);
    n += 4;
    memset(in + n, 'y', 20); /* too long and unterminated at EOF */
    n += 20;
    char path[64];
    temp_file(path, sizeof(path), in, n);
    free(in);

    struct prod_lines lr;
    assert_int_equal(prod_lines_open(&lr, path, 10, NULL), 0);
    const char *l;
    size_t len;
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), 1);
    assert_string_equal(l, "ok1");
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), SL_ETOOBIG);
    assert_int_equal(lr.lineno, 2);
    assert_true(lr.cap <= 10 + 64 * 1024 + 1);
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), 1);
    assert_string_equal(l, "ok3");
    assert_int_equal(lr.lineno, 3);
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), SL_ETOOBIG);
    assert_int_equal(lr.lineno, 4);
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), 0);
    prod_lines_close(&lr);
    unlink(path);
}

/* A line exactly at the cap is accepted; one byte more is not. */
static void test_lines_cap_edge(void **state)
{
    (void)state;
    static const char in[] = "12345\n123456\n";
    char path[64];
    temp_file(path, sizeof(path), in, sizeof(in) - 1);
    struct prod_lines lr;
    assert_int_equal(prod_lines_open(&lr, path, 5, NULL), 0);
    const char *l;
    size_t len;
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), 1);
    assert_int_equal(len, 5);
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), SL_ETOOBIG);
    assert_int_equal(prod_lines_next(&lr, &l, &len, NULL), 0);
    prod_lines_close(&lr);
    unlink(path);
}

static void test_lines_missing_file(void **state)
{
    (void)state;
    struct prod_lines lr;
    sl_err_t err = {0};
    assert_true(prod_lines_open(&lr, "/nonexistent/input.jsonl", 10, &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent/input.jsonl"));
    prod_lines_close(&lr);
}

static void test_gen_records(void **state)
{
    (void)state;
    struct prod_gen g;
    assert_int_equal(
        prod_gen_init(&g, 7, 3, 512, SL_MAX_BODY_DEFAULT, "ep_", "t.gen", "run1", NULL), 0);
    const struct sl_delivery *d;
    int k = 0;
    char prev_body[512];
    while ((d = prod_gen_next(&g)) != NULL) {
        char want[64];
        snprintf(want, sizeof(want), "evt_run1_%d", k);
        assert_string_equal(d->id, want);
        snprintf(want, sizeof(want), "ep_%d", k % 3);
        assert_string_equal(d->ep, want);
        assert_string_equal(d->type, "t.gen");
        assert_int_equal(d->body_len, 512);
        assert_int_equal(sl_delivery_validate(d, NULL, NULL), 0);
        json_error_t je;
        json_t *b = json_loadb((const char *)d->body, d->body_len, 0, &je);
        assert_non_null(b);
        assert_int_equal(json_integer_value(json_object_get(b, "seq")), k);
        json_decref(b);
        if (k > 0)
            assert_memory_not_equal(prev_body, d->body, 512); /* filler varies per record */
        memcpy(prev_body, d->body, 512);
        k++;
    }
    assert_int_equal(k, 7);
    prod_gen_fini(&g);
    prod_gen_fini(&g);
}

static void test_gen_small_and_empty_bodies(void **state)
{
    (void)state;
    size_t sizes[] = {0, 1, 10, 39, 40};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        struct prod_gen g;
        assert_int_equal(prod_gen_init(&g, 2, 1, sizes[i], 1024, "e", "t", NULL, NULL), 0);
        const struct sl_delivery *d = prod_gen_next(&g);
        assert_non_null(d);
        assert_int_equal(d->body_len, sizes[i]);
        assert_int_equal(sl_delivery_validate(d, NULL, NULL), 0);
        assert_memory_equal(d->id, "evt_", 4);
        prod_gen_fini(&g);
    }
}

static void test_gen_rejects_bad_options(void **state)
{
    (void)state;
    struct prod_gen g;
    sl_err_t err = {0};
    assert_int_equal(prod_gen_init(&g, 1, 0, 10, 100, "ep_", "t", NULL, &err), SL_EINVAL);
    assert_int_equal(prod_gen_init(&g, 1, 1, 101, 100, "ep_", "t", NULL, &err), SL_ETOOBIG);
    assert_int_equal(prod_gen_init(&g, 1, 1, 10, 100, "bad prefix", "t", NULL, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "--endpoint-prefix"));
    char longp[70];
    memset(longp, 'p', 62);
    longp[62] = '\0';
    /* 62 + "999" > 64 bytes */
    assert_int_equal(prod_gen_init(&g, 1, 1000, 10, 100, longp, "t", NULL, &err), SL_EINVAL);
    assert_int_equal(prod_gen_init(&g, 1, 10, 10, 100, longp, "t", NULL, &err), 0);
    prod_gen_fini(&g);
    assert_int_equal(prod_gen_init(&g, 1, 1, 10, 100, "ep", "bad type", NULL, &err), SL_EINVAL);
    assert_int_equal(prod_gen_init(&g, 1, 1, 10, 100, "ep", "t", "has.dot", &err), SL_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_basic),
        cmocka_unit_test(test_lines_too_long),
        cmocka_unit_test(test_lines_cap_edge),
        cmocka_unit_test(test_lines_missing_file),
        cmocka_unit_test(test_gen_records),
        cmocka_unit_test(test_gen_small_and_empty_bodies),
        cmocka_unit_test(test_gen_rejects_bad_options),
    };
    return cmocka_run_group_tests_name("prod_input", tests, NULL, NULL);
}
