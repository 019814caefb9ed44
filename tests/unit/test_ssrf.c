/*
 * SSRF policy on the address actually connected: every non-global range refused, embedded
 * IPv4 forms unwrapped (mapped, compatible, NAT64, 6to4), the allowlist exempting only its
 * ranges, and protection off allowing everything; and the registration check on a URL's host
 * (sl_ssrf_check_host): literals and loopback names judged, other names left to delivery.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_ssrf.h"

static bool allowed(const struct sl_ssrf_policy *p, const char *ip, const char **why)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t len;
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        assert_int_equal(inet_pton(AF_INET6, ip, &s6->sin6_addr), 1);
        len = sizeof(*s6);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        assert_int_equal(inet_pton(AF_INET, ip, &s4->sin_addr), 1);
        len = sizeof(*s4);
    }
    return sl_ssrf_allowed(p, (struct sockaddr *)&ss, len, why);
}

static void test_refused_ranges(void **state)
{
    (void)state;
    struct sl_ssrf_policy p;
    sl_err_t err;
    assert_int_equal(sl_ssrf_parse(&p, true, "", &err), 0);
    static const struct {
        const char *ip;
        const char *why;
    } cases[] = {
        {"127.0.0.1", "loopback"},
        {"127.255.255.254", "loopback"},
        {"10.0.0.1", "private"},
        {"172.16.5.4", "private"},
        {"172.31.255.255", "private"},
        {"192.168.1.1", "private"},
        {"169.254.169.254", "link-local"},
        {"100.64.0.1", "shared-cgnat"},
        {"0.0.0.0", "this-network"},
        {"224.0.0.1", "multicast"},
        {"255.255.255.255", "broadcast"},
        {"240.0.0.1", "reserved"},
        {"198.18.0.1", "benchmarking"},
        {"::1", "loopback"},
        {"::", "unspecified"},
        {"fe80::1", "link-local"},
        {"fd00:ec2::254", "unique-local"},
        {"fc00::1", "unique-local"},
        {"ff02::1", "multicast"},
        {"::ffff:127.0.0.1", "loopback"},
        {"::ffff:10.1.2.3", "private"},
        {"::127.0.0.1", "loopback"},
        {"64:ff9b::a9fe:a9fe", "link-local"}, /* NAT64 of 169.254.169.254 */
        {"64:ff9b:1::1", "nat64-local"},
        {"2002:7f00:1::", "loopback"}, /* 6to4 of 127.0.0.1 */
        {"2001:db8::1", "documentation"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *why = NULL;
        bool ok = allowed(&p, cases[i].ip, &why);
        if (ok || !why || strcmp(why, cases[i].why) != 0)
            fail_msg("%s: allowed=%d why=%s (expected refused: %s)", cases[i].ip, ok,
                     why ? why : "-", cases[i].why);
    }
}

static void test_global_allowed(void **state)
{
    (void)state;
    struct sl_ssrf_policy p;
    sl_err_t err;
    assert_int_equal(sl_ssrf_parse(&p, true, NULL, &err), 0);
    const char *ok[] = {"93.184.216.34",  "8.8.8.8",    "2606:4700::1111",
                        "::ffff:1.1.1.1", "172.32.0.1", "11.0.0.1"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        assert_true(allowed(&p, ok[i], NULL));
}

static void test_allowlist_exempts_only_its_ranges(void **state)
{
    (void)state;
    struct sl_ssrf_policy p;
    sl_err_t err;
    assert_int_equal(sl_ssrf_parse(&p, true, "127.0.0.0/8, ::1/128", &err), 0);
    assert_true(allowed(&p, "127.0.0.1", NULL));
    assert_true(allowed(&p, "::ffff:127.0.0.1", NULL));
    assert_true(allowed(&p, "::1", NULL));
    assert_false(allowed(&p, "10.0.0.1", NULL));
    assert_false(allowed(&p, "169.254.169.254", NULL));
    assert_int_equal(sl_ssrf_parse(&p, true, "127.0.0.0/33", &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "entry 1"));
    assert_int_equal(sl_ssrf_parse(&p, true, "10.0.0.0/8,nonsense", &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "entry 2"));
}

static void test_disabled_allows_all(void **state)
{
    (void)state;
    struct sl_ssrf_policy p;
    sl_err_t err;
    assert_int_equal(sl_ssrf_parse(&p, false, "", &err), 0);
    assert_true(allowed(&p, "127.0.0.1", NULL));
    assert_true(allowed(&p, "169.254.169.254", NULL));
}

/* 0 when host may be registered; else the message must name the host and the range. */
static int check(const struct sl_ssrf_policy *p, const char *host, const char *why)
{
    sl_err_t err;
    int rc = sl_ssrf_check_host(p, host, &err);
    if (rc != 0) {
        assert_int_equal(rc, SL_EINVAL);
        assert_non_null(strstr(err.msg, host));
        if (!strstr(err.msg, "dotted-decimal")) /* an address's refusal names the way out */
            assert_non_null(strstr(err.msg, "ssrf_allow_cidrs"));
        if (why)
            assert_non_null(strstr(err.msg, why));
    }
    return rc;
}

static void test_registration_judges_literals_and_loopback_names(void **state)
{
    (void)state;
    struct sl_ssrf_policy p;
    sl_err_t err;
    assert_int_equal(sl_ssrf_parse(&p, true, "", &err), 0);
    assert_int_equal(check(&p, "127.0.0.1", "(loopback)"), SL_EINVAL);
    assert_int_equal(check(&p, "10.1.2.3", "(private)"), SL_EINVAL);
    assert_int_equal(check(&p, "127.0.0.1.", "(loopback)"), SL_EINVAL); /* a name's final dot */
    /* numbers curl leaves as names (a trailing dot): a resolver or proxy may read them */
    assert_int_equal(check(&p, "127.1.", "dotted-decimal"), SL_EINVAL);
    assert_int_equal(check(&p, "2130706433.", "dotted-decimal"), SL_EINVAL);
    assert_int_equal(check(&p, "0x7f.0.0.1.", "dotted-decimal"), SL_EINVAL);
    assert_int_equal(check(&p, "1e100.net", NULL), 0); /* a name with digits */
    assert_int_equal(check(&p, "169.254.169.254", "(link-local)"), SL_EINVAL);
    assert_int_equal(check(&p, "[::1]", "(loopback)"), SL_EINVAL);
    assert_int_equal(check(&p, "[fd00:ec2::254]", "(unique-local)"), SL_EINVAL);
    assert_int_equal(check(&p, "[::ffff:10.0.0.1]", "(private)"), SL_EINVAL);
    assert_int_equal(check(&p, "localhost", "(loopback)"), SL_EINVAL);
    assert_int_equal(check(&p, "LocalHost.", "(loopback)"), SL_EINVAL);
    assert_int_equal(check(&p, "api.localhost", "(loopback)"), SL_EINVAL);
    /* global literals and every other name pass (names: the consumers check each connection) */
    assert_int_equal(check(&p, "93.184.216.34", NULL), 0);
    assert_int_equal(check(&p, "[2606:4700::1111]", NULL), 0);
    assert_int_equal(check(&p, "example.com", NULL), 0);
    assert_int_equal(check(&p, "notlocalhost", NULL), 0);
    assert_int_equal(check(&p, "localhost.example.com", NULL), 0);
    assert_int_equal(check(&p, "[not-an-address]", NULL), 0);
    /* the allowlist and protection off */
    assert_int_equal(sl_ssrf_parse(&p, true, "127.0.0.0/8", &err), 0);
    assert_int_equal(check(&p, "127.0.0.1", NULL), 0);
    assert_int_equal(check(&p, "localhost", NULL), 0);
    assert_int_equal(check(&p, "[::1]", "(loopback)"), SL_EINVAL);
    assert_int_equal(check(&p, "10.0.0.1", "(private)"), SL_EINVAL);
    assert_int_equal(sl_ssrf_parse(&p, true, "::1/128", &err), 0);
    assert_int_equal(check(&p, "localhost", NULL), 0); /* reachable over ::1 */
    assert_int_equal(check(&p, "127.0.0.1", "(loopback)"), SL_EINVAL);
    assert_int_equal(sl_ssrf_parse(&p, false, "", &err), 0);
    assert_int_equal(check(&p, "10.0.0.1", NULL), 0);
    assert_int_equal(check(&p, "localhost", NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_ranges),
        cmocka_unit_test(test_global_allowed),
        cmocka_unit_test(test_allowlist_exempts_only_its_ranges),
        cmocka_unit_test(test_disabled_allows_all),
        cmocka_unit_test(test_registration_judges_literals_and_loopback_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
