/*
 * test_url: URL redaction, host extraction and registration checks (common/sl_url).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_url.h"

/* ==== sl_url_redact ==== */

static void test_redact_table(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        const char *want;
    } cases[] = {
        {"https://user:pass@example.com:8443/hooks/in?token=abc#frag",
         "https://example.com:8443/hooks/in"},
        {"https://example.com", "https://example.com/"},
        {"https://example.com?x=1", "https://example.com/"}, /* '?' with no path */
        {"https://example.com/p", "https://example.com/p"},  /* no '?' at all */
        {"https://[2001:db8::1]:8443/p?q=1", "https://[2001:db8::1]:8443/p"},
        {"https://[fe80::1%25eth0]/x?y", "https://[fe80::1]/x"},
        {"http://[::ffff:192.0.2.1]/", "http://[::ffff:192.0.2.1]/"},
        {"http://h.example/a@b/c?x=@y", "http://h.example/a@b/c"}, /* '@' in path */
        {"http://h.example/p%20q%3Fr?click=123", "http://h.example/p%20q%3Fr"},
        {"https://track.example/postback?clickid=abc123&payout=1.50&txid=9",
         "https://track.example/postback"},
        {"http://h.example/#?notquery", "http://h.example/"},
        {"http://h.example/p#frag?x", "http://h.example/p"},
        {"HTTPS://Example.COM/A/../b?x=1", "https://Example.COM/b"},
        {"https://h.example:443/x", "https://h.example:443/x"},
        {"http://h%41.example/", "http://hA.example/"},
        {"ftp://user:pw@h.example/x?q", "ftp://h.example/x"}, /* any scheme is redacted */
        {"http://user@h.example:8080", "http://h.example:8080/"},
        {"http://a:b:c@h.example/", "http://h.example/"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[256];
        int rc = sl_url_redact(cases[i].in, out, sizeof(out));
        if (rc != 0 || strcmp(out, cases[i].want) != 0)
            fail_msg("case %zu: rc %d, got \"%s\", want \"%s\"", i, rc, out, cases[i].want);
    }
}

static void test_redact_invalid_never_echoes(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "not a url?secret=1",      "http://h.example/p q?secret=1",
        "https://a@b@c/?secret=1", "http://h.example:99999/?secret=1",
        "h.example/x?secret=1",    "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char out[256];
        memset(out, 'x', sizeof(out));
        assert_int_equal(sl_url_redact(bad[i], out, sizeof(out)), SL_EDECODE);
        assert_string_equal(out, SL_URL_INVALID_STR);
    }
    char out[8];
    assert_int_equal(sl_url_redact(NULL, out, sizeof(out)), SL_EDECODE);
    /* placeholder truncated to fit, still terminated */
    assert_int_equal(strlen(out), sizeof(out) - 1);
    assert_memory_equal(out, SL_URL_INVALID_STR, sizeof(out) - 1);
}

static void test_redact_truncation(void **state)
{
    (void)state;
    const char *url = "https://user:secret@example.com:8443/a/long/path?token=secret";
    const char *full = "https://example.com:8443/a/long/path";
    char out[64];
    assert_int_equal(sl_url_redact(url, out, sizeof(out)), 0);
    assert_string_equal(out, full);
    /* Every shorter buffer gets a terminated prefix of the redacted form, never more. */
    for (size_t n = 1; n <= strlen(full); n++) {
        memset(out, 'x', sizeof(out));
        assert_int_equal(sl_url_redact(url, out, n), SL_ETOOBIG);
        assert_int_equal(strlen(out), n - 1);
        assert_memory_equal(out, full, n - 1);
        assert_null(strstr(out, "secret"));
    }
    assert_int_equal(sl_url_redact(url, out, strlen(full) + 1), 0);
    assert_string_equal(out, full);
    assert_int_equal(sl_url_redact(url, out, 0), SL_ETOOBIG);
}

/* ==== sl_url_host ==== */

static void test_host(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        const char *want;
    } cases[] = {
        {"https://user:pw@Example.com:8443/x?q", "Example.com"},
        {"https://[::1]:8443/", "[::1]"},
        {"https://[2001:db8::1]/", "[2001:db8::1]"},
        {"https://[fe80::1%25eth0]/", "[fe80::1]"},
        {"http://192.0.2.1/", "192.0.2.1"},
        {"http://h.example?x=a.b", "h.example"},
        {"http://h.example/a@b.example/c", "h.example"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[128];
        int rc = sl_url_host(cases[i].in, out, sizeof(out));
        if (rc != 0 || strcmp(out, cases[i].want) != 0)
            fail_msg("case %zu: rc %d, got \"%s\", want \"%s\"", i, rc, out, cases[i].want);
    }
    char out[16];
    assert_int_equal(sl_url_host("garbage", out, sizeof(out)), SL_EDECODE);
    assert_string_equal(out, "");
    assert_int_equal(sl_url_host(NULL, out, sizeof(out)), SL_EDECODE);
    assert_int_equal(sl_url_host("file:///etc/passwd", out, sizeof(out)), SL_EDECODE);
    assert_string_equal(out, "");
    /* exactly fits / one too small */
    assert_int_equal(sl_url_host("https://abcdefghijklmno/", out, sizeof(out)), 0);
    assert_string_equal(out, "abcdefghijklmno");
    assert_int_equal(sl_url_host("https://abcdefghijklmnop/", out, sizeof(out)), SL_ETOOBIG);
    assert_string_equal(out, "");
    assert_int_equal(sl_url_host("https://h/", out, 0), SL_ETOOBIG);
}

/* ==== sl_url_validate ==== */

static void test_validate_accepts(void **state)
{
    (void)state;
    static const char *const good[] = {
        "https://example.com/hook",
        "http://example.com",
        "https://example.com?x=1",
        "HTTPS://Example.COM/x",
        "https://[2001:db8::1]:8443/p?q=1",
        "https://192.0.2.1/",
        "https://h.example/a@b",
        "https://h.example/p%20q?x=%2F&y=%C3%A9",
        "https://h.example/?",
        "https://h.example:1/",
        "https://h.example:65535/",
        "https://h.example/#frag",
        "https://xn--caf-dma.example/",
        "https://track.example/postback?clickid={clickid}&payout={payout}",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        sl_err_t err = {0};
        int rc = sl_url_validate(good[i], &err);
        if (rc != 0)
            fail_msg("case %zu (%s): rc %s: %s", i, good[i], sl_err_name(rc), err.msg);
    }
}

static void test_validate_rejects(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int rc;
        const char *msg_part; /* expected in the message */
    } bad[] = {
        {NULL, SL_EMISSING, "empty"},
        {"", SL_EMISSING, "empty"},
        /* userinfo, in every shape */
        {"https://user:pw@h.example/", SL_EINVAL, "user information"},
        {"https://user@h.example/", SL_EINVAL, "user information"},
        {"https://@h.example/", SL_EINVAL, "user information"},
        {"https://:pw@h.example/", SL_EINVAL, "user information"},
        {"https://h;o@x.example/", SL_EINVAL, "user information"},
        /* scheme */
        {"ftp://h.example/", SL_EINVAL, "http:// or https://"},
        {"file:///etc/passwd", SL_EINVAL, "http:// or https://"},
        {"javascript:alert(1)", SL_EINVAL, "http:// or https://"},
        {"h.example/x", SL_EINVAL, "http:// or https://"},
        {"//h.example/x", SL_EINVAL, "http:// or https://"},
        {"http:/h.example/x", SL_EINVAL, "http:// or https://"},
        {"httpx://h.example/", SL_EINVAL, "http:// or https://"},
        /* host */
        {"http:///x", SL_EINVAL, "no host"},
        {"https://", SL_EINVAL, "no host"},
        {"https:///", SL_EINVAL, "no host"},
        {"https://:443/", SL_EINVAL, "malformed"},
        /* whitespace, control and non-ascii bytes */
        {"https://h.example/a b", SL_EINVAL, "offset 19"},
        {" https://h.example/", SL_EINVAL, "offset 0"},
        {"https://h.example/\t", SL_EINVAL, "whitespace"},
        {"https://h.example/x\n", SL_EINVAL, "whitespace"},
        {"https://h.example/x\r\nHost: evil", SL_EINVAL, "whitespace"},
        {"https://h.example/\x7f", SL_EINVAL, "control"},
        {"https://h.example/caf\xc3\xa9", SL_EINVAL, "non-ascii"},
        {"https://caf\xc3\xa9.example/", SL_EINVAL, "punycode"},
        /* ports */
        {"http://h.example:0/", SL_EINVAL, "port"},
        {"http://h.example:00/", SL_EINVAL, "port"},
        {"http://h.example:65536/", SL_EINVAL, "malformed"},
        {"http://h.example:99999/", SL_EINVAL, "malformed"},
        {"http://h.example:-1/", SL_EINVAL, "malformed"},
        {"http://h.example:8o/", SL_EINVAL, "malformed"},
        /* ipv6 */
        {"https://[fe80::1%25eth0]/", SL_EINVAL, "zone id"},
        {"https://[::1/", SL_EINVAL, "malformed"},
        {"https://[zz::1]/", SL_EINVAL, "malformed"},
        /* other malformed */
        {"https://a@b@c.example/", SL_EINVAL, NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_err_t err = {0};
        int rc = sl_url_validate(bad[i].in, &err);
        if (rc != bad[i].rc)
            fail_msg("case %zu: rc %s (%s), want %s", i, sl_err_name(rc), err.msg,
                     sl_err_name(bad[i].rc));
        assert_int_equal(err.code, rc);
        if (bad[i].msg_part && !strstr(err.msg, bad[i].msg_part))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.msg, bad[i].msg_part);
    }
}

static void test_validate_length_and_secrecy(void **state)
{
    (void)state;
    /* Exactly SL_URL_MAX bytes passes, one more fails. */
    char *u = malloc(SL_URL_MAX + 2);
    assert_non_null(u);
    snprintf(u, SL_URL_MAX + 2, "https://h.example/");
    size_t n = strlen(u);
    memset(u + n, 'a', SL_URL_MAX - n);
    u[SL_URL_MAX] = '\0';
    sl_err_t err = {0};
    assert_int_equal(sl_url_validate(u, &err), 0);
    u[SL_URL_MAX] = 'a';
    u[SL_URL_MAX + 1] = '\0';
    assert_int_equal(sl_url_validate(u, &err), SL_ETOOBIG);
    assert_non_null(strstr(err.msg, "2048"));
    free(u);

    /* Messages never quote credentials or the query. */
    static const char *const leaky[] = {
        "https://alice:hunter2@h.example/?token=s3cr3t",
        "https://h.example:0/?token=s3cr3t",
        "https://h.example/ ?token=s3cr3t",
        "ftp://alice:hunter2@h.example/?token=s3cr3t",
        "https://[fe80::1%25eth0]/?token=s3cr3t",
    };
    for (size_t i = 0; i < sizeof(leaky) / sizeof(leaky[0]); i++) {
        sl_err_clear(&err);
        assert_int_equal(sl_url_validate(leaky[i], &err), SL_EINVAL);
        assert_null(strstr(err.msg, "hunter2"));
        assert_null(strstr(err.msg, "s3cr3t"));
        assert_null(strstr(err.msg, "alice"));
    }
    /* NULL err is allowed. */
    assert_int_equal(sl_url_validate("ftp://h/", NULL), SL_EINVAL);
}

/* delivery_proxy: the schemes curl tunnels through, host[:port] only, never echoed. */
static void test_proxy_check(void **state)
{
    (void)state;
    static const char *const good[] = {
        "http://127.0.0.1:3128",   "http://egress.internal:3128/", "https://user:p%40ss@px.example",
        "socks5h://10.0.0.1:1080", "socks5h://[2001:db8::1]:1080", "HTTP://PX.EXAMPLE:8080",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        sl_err_t err = {0};
        if (sl_url_proxy_check(good[i], &err) != 0)
            fail_msg("case %zu: %s", i, err.msg);
    }
    static const struct {
        const char *in;
        const char *msg_part;
    } bad[] = {
        {"", "empty"},
        {"127.0.0.1:3128", "scheme"},
        {"ftp://u:s3cr3t@px.example:21", "scheme"},
        {"socks4://px.example:1080", "scheme"},
        {"socks5://u:s3cr3t@px.example:1080", "use socks5h://"},
        {"http://u:s3cr3t@px.example:3128/path", "nothing may follow"},
        {"http://px.example:3128/?q=s3cr3t", "nothing may follow"},
        {"http://px.example:0", "port"},
        {"http://[fe80::1%25eth0]:3128", "nothing may follow"},
        {"http://", "expected scheme://host:port"},
        /* a bad escape in the credentials, as redis_url refuses it */
        {"http://u:s3cr3t%zz@px.example:3128", "bad percent-encoding in the password"},
        {"http://u:s3cr3t%4@px.example:3128", "bad percent-encoding in the password"},
        {"http://u%g1:s3cr3t@px.example:3128", "bad percent-encoding in the user name"},
        {"http://u:s3cr3t%00@px.example:3128", "bad percent-encoding in the password"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_err_t err = {0};
        if (sl_url_proxy_check(bad[i].in, &err) != SL_EINVAL)
            fail_msg("case %zu (%s) accepted", i, bad[i].in);
        if (!strstr(err.msg, bad[i].msg_part))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.msg, bad[i].msg_part);
        assert_null(strstr(err.msg, "s3cr3t"));
        assert_null(strstr(err.msg, "px.example"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redact_table),
        cmocka_unit_test(test_redact_invalid_never_echoes),
        cmocka_unit_test(test_redact_truncation),
        cmocka_unit_test(test_host),
        cmocka_unit_test(test_validate_accepts),
        cmocka_unit_test(test_validate_rejects),
        cmocka_unit_test(test_validate_length_and_secrecy),
        cmocka_unit_test(test_proxy_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
