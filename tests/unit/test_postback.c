/*
 * Postback templates: macro filling with RFC 3986 encoding of tricky values, missing macros as
 * named permanent errors (never a literal "{click_id}"), template validation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "consumer/cons_postback.h"

static char *expand(const char *tpl, const struct sl_kv *m, size_t n, int *rc, sl_err_t *err)
{
    char *out = NULL;
    *rc = cons_postback_expand(tpl, m, n, 8192, &out, err);
    return out;
}

static void test_fills_and_encodes(void **state)
{
    (void)state;
    const struct sl_kv m[] = {
        {"click_id", "a b&c=d"}, {"payout", "12.50"},
        {"status", "ok/yes?#"},  {"name", "Jos\xc3\xa9 \xe2\x82\xac"},
        {"empty", ""},           {"pct", "100%"},
    };
    sl_err_t err;
    int rc;
    char *u = expand("https://t.example/pb?cid={click_id}&p={payout}&s={status}&n={name}"
                     "&e={empty}&x={pct}",
                     m, 6, &rc, &err);
    assert_int_equal(rc, 0);
    assert_string_equal(u, "https://t.example/pb?cid=a%20b%26c%3Dd&p=12.50&s=ok%2Fyes%3F%23"
                           "&n=Jos%C3%A9%20%E2%82%AC&e=&x=100%25");
    free(u);
}

static void test_repeated_and_adjacent(void **state)
{
    (void)state;
    const struct sl_kv m[] = {{"a", "1"}, {"b", "~-._"}};
    sl_err_t err;
    int rc;
    char *u = expand("http://h/{a}{b}/{a}?q={b}", m, 2, &rc, &err);
    assert_int_equal(rc, 0);
    assert_string_equal(u, "http://h/1~-._/1?q=~-._");
    free(u);
}

static void test_missing_macro_is_named(void **state)
{
    (void)state;
    const struct sl_kv m[] = {{"click_id", "SECRETCLICK"}};
    sl_err_t err;
    int rc;
    char *u = expand("https://t/pb?c={click_id}&p={payout}", m, 1, &rc, &err);
    assert_int_equal(rc, SL_EMISSING);
    assert_null(u);
    assert_non_null(strstr(err.msg, "macro \"payout\" missing"));
    assert_null(strstr(err.msg, "SECRETCLICK"));
}

static void test_invalid_templates(void **state)
{
    (void)state;
    sl_err_t err;
    assert_int_equal(cons_postback_validate("https://t/pb?c={click_id}", &err), 0);
    assert_int_equal(cons_postback_validate("https://t/pb?c={click_id", &err), SL_EDECODE);
    assert_int_equal(cons_postback_validate("https://t/pb?c=click_id}", &err), SL_EDECODE);
    assert_int_equal(cons_postback_validate("https://t/pb?c={}", &err), SL_EDECODE);
    assert_int_equal(cons_postback_validate("https://t/pb?c={a b}", &err), SL_EDECODE);
    assert_int_equal(cons_postback_validate("https://t/pb?c={{a}}", &err), SL_EDECODE);
    assert_non_null(strstr(err.msg, "position"));
}

static void test_length_cap(void **state)
{
    (void)state;
    char big[3000];
    memset(big, '&', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    const struct sl_kv m[] = {{"v", big}};
    char *out = NULL;
    sl_err_t err;
    /* every '&' becomes 3 bytes: 9 KB > 8 KB cap */
    assert_int_equal(cons_postback_expand("http://h/?v={v}", m, 1, 8192, &out, &err), SL_ETOOBIG);
    assert_null(out);
}

/* A value that makes a "." or ".." path segment is refused (libcurl would remove the
 * segment and send the request elsewhere on the host); dots elsewhere are fine. */
static void test_dot_segments_refused(void **state)
{
    (void)state;
    const char *bad[][2] = {
        {"https://t/pb/{c}/conv", ".."}, {"https://t/pb/{c}/conv", "."},
        {"https://t/pb/{c}", ".."},      {"https://t/pb/.{c}/x?q=1", "."},
        {"https://t/{c}?q=1", ".."},     {"https://t/pb/{c}#f", "."},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const struct sl_kv m[] = {{"c", bad[i][1]}};
        sl_err_t err;
        int rc;
        char *u = expand(bad[i][0], m, 1, &rc, &err);
        assert_int_equal(rc, SL_EINVAL);
        assert_null(u);
        assert_non_null(strstr(err.msg, "path segment"));
    }
    const char *ok[][3] = {
        {"https://t/pb/{c}/conv", "...", "https://t/pb/.../conv"},
        {"https://t/pb/{c}/conv", "a.b", "https://t/pb/a.b/conv"},
        {"https://t/pb/{c}", "../x", "https://t/pb/..%2Fx"},
        {"https://t/pb?c={c}", "..", "https://t/pb?c=.."},
        {"https://t/pb?c=/{c}/", "..", "https://t/pb?c=/../"},
        {"https://t/pb#/{c}", "..", "https://t/pb#/.."},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        const struct sl_kv m[] = {{"c", ok[i][1]}};
        sl_err_t err;
        int rc;
        char *u = expand(ok[i][0], m, 1, &rc, &err);
        assert_int_equal(rc, 0);
        assert_string_equal(u, ok[i][2]);
        free(u);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fills_and_encodes),
        cmocka_unit_test(test_repeated_and_adjacent),
        cmocka_unit_test(test_missing_macro_is_named),
        cmocka_unit_test(test_invalid_templates),
        cmocka_unit_test(test_length_cap),
        cmocka_unit_test(test_dot_segments_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
