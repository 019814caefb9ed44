/*
 * test_classify: attempt outcome classification and Retry-After (consumer/cons_classify).
 * Table-driven: every HTTP class boundary, every CURLcode libcurl 7.88 can return for an
 * HTTP(S) transfer, and the policy refusals.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "consumer/cons_classify.h"

struct row {
    int curl;                  /* CURLcode */
    long status;               /* CURLINFO_RESPONSE_CODE */
    enum cons_refusal refusal; /* our own abort */
    enum cons_verdict want;    /* verdict */
    const char *cls;           /* error class, NULL for delivered */
};

static void run_table(const struct row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *cls = "unset";
        enum cons_verdict v = cons_classify(rows[i].curl, rows[i].status, rows[i].refusal, &cls);
        int cls_ok = rows[i].cls ? (cls && strcmp(cls, rows[i].cls) == 0) : cls == NULL;
        if (v != rows[i].want || !cls_ok)
            fail_msg("row %zu (curl %d, status %ld, refusal %d): got %s/%s, want %s/%s", i,
                     rows[i].curl, rows[i].status, (int)rows[i].refusal, cons_verdict_name(v),
                     cls ? cls : "NULL", cons_verdict_name(rows[i].want),
                     rows[i].cls ? rows[i].cls : "NULL");
        /* error_class is optional */
        assert_int_equal(cons_classify(rows[i].curl, rows[i].status, rows[i].refusal, NULL), v);
    }
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void test_http_status_boundaries(void **state)
{
    (void)state;
    static const struct row rows[] = {
        {CURLE_OK, -1, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        {CURLE_OK, 0, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        {CURLE_OK, 99, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        {CURLE_OK, 100, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_1XX},
        {CURLE_OK, 101, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_1XX},
        {CURLE_OK, 199, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_1XX},
        {CURLE_OK, 200, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_OK, 201, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_OK, 204, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_OK, 299, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_OK, 300, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_3XX},
        {CURLE_OK, 301, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_3XX},
        {CURLE_OK, 307, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_3XX},
        {CURLE_OK, 399, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_3XX},
        {CURLE_OK, 400, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 401, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 403, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 404, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 407, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 408, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_408},
        {CURLE_OK, 409, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 410, CONS_REFUSAL_NONE, CONS_PERMANENT_DISABLE, CONS_CLASS_HTTP_410},
        {CURLE_OK, 411, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 424, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 425, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_425},
        {CURLE_OK, 426, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 428, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 429, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_429},
        {CURLE_OK, 430, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 451, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 499, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OK, 500, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_OK, 502, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_OK, 503, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_OK, 504, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_OK, 599, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_OK, 600, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        {CURLE_OK, 999, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        {CURLE_OK, LONG_MAX, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        {CURLE_OK, LONG_MIN, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_INVALID},
        /* CURLOPT_FAILONERROR: the status decides */
        {CURLE_HTTP_RETURNED_ERROR, 404, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_HTTP_RETURNED_ERROR, 410, CONS_REFUSAL_NONE, CONS_PERMANENT_DISABLE,
         CONS_CLASS_HTTP_410},
        {CURLE_HTTP_RETURNED_ERROR, 429, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_429},
        {CURLE_HTTP_RETURNED_ERROR, 503, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_HTTP_RETURNED_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
    };
    run_table(rows, N(rows));
}

static void test_curl_codes(void **state)
{
    (void)state;
    static const struct row rows[] = {
        {CURLE_COULDNT_RESOLVE_HOST, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_DNS},
        {CURLE_COULDNT_RESOLVE_PROXY, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_DNS},
        {CURLE_COULDNT_CONNECT, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_CONNECT},
        {CURLE_INTERFACE_FAILED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_CONNECT},
        {CURLE_NO_CONNECTION_AVAILABLE, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_CONNECT},
        {CURLE_OPERATION_TIMEDOUT, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TIMEOUT},
        {CURLE_SSL_CONNECT_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_PEER_FAILED_VERIFICATION, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_CERTPROBLEM, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_CIPHER, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_ENGINE_NOTFOUND, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_ENGINE_SETFAILED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_ENGINE_INITFAILED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_USE_SSL_FAILED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_CACERT_BADFILE, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_SHUTDOWN_FAILED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_CRL_BADFILE, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_ISSUER_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_PINNEDPUBKEYNOTMATCH, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_INVALIDCERTSTATUS, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SSL_CLIENTCERT, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TLS},
        {CURLE_SEND_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_SEND},
        {CURLE_SEND_FAIL_REWIND, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_SEND},
        {CURLE_UPLOAD_FAILED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_SEND},
        {CURLE_RECV_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_RECV},
        {CURLE_AGAIN, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_RECV},
        {CURLE_GOT_NOTHING, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_EMPTY_REPLY},
        {CURLE_PARTIAL_FILE, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PARTIAL},
        {CURLE_WEIRD_SERVER_REPLY, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_HTTP2, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_HTTP2_STREAM, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_HTTP3, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_QUIC_CONNECT_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_PROXY, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_BAD_CONTENT_ENCODING, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_PROTOCOL},
        {CURLE_FAILED_INIT, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_OUT_OF_MEMORY, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_WRITE_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_READ_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_ABORTED_BY_CALLBACK, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_BAD_FUNCTION_ARGUMENT, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_UNKNOWN_OPTION, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_SETOPT_OPTION_SYNTAX, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_HTTP_POST_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_RECURSIVE_API_CALL, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_UNRECOVERABLE_POLL, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_INTERNAL},
        {CURLE_UNSUPPORTED_PROTOCOL, 0, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_INVALID_URL},
        {CURLE_URL_MALFORMAT, 0, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_INVALID_URL},
        {CURLE_NOT_BUILT_IN, 0, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_INVALID_URL},
        {CURLE_TOO_MANY_REDIRECTS, 302, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_3XX},
        {CURLE_FILESIZE_EXCEEDED, 0, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_TOO_LARGE},
        /* codes of other protocols, unknown and negative values: transient by default */
        {CURLE_REMOTE_ACCESS_DENIED, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
        {CURLE_AUTH_ERROR, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
        {CURLE_SSH, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
        {CURL_LAST, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
        {12345, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
        {-1, 0, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TRANSFER},
    };
    run_table(rows, N(rows));
}

/* After a status line, the status decides whatever happens to the body (stalled, reset, cut
 * off): a 2xx is delivered, a 410 disables, another 4xx is not sent again, a 5xx is retried
 * as a 5xx. Only a status below 300 that is not 2xx (none was whole) leaves it to the
 * transfer error. */
static void test_transfer_error_after_status(void **state)
{
    (void)state;
    static const struct row rows[] = {
        {CURLE_OPERATION_TIMEDOUT, 200, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_RECV_ERROR, 204, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_PARTIAL_FILE, 200, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_BAD_CONTENT_ENCODING, 299, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_WRITE_ERROR, 201, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_FILESIZE_EXCEEDED, 200, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
        {CURLE_OPERATION_TIMEDOUT, 199, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_TIMEOUT},
        {CURLE_OPERATION_TIMEDOUT, 300, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_3XX},
        {CURLE_OPERATION_TIMEDOUT, 404, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OPERATION_TIMEDOUT, 410, CONS_REFUSAL_NONE, CONS_PERMANENT_DISABLE,
         CONS_CLASS_HTTP_410},
        {CURLE_RECV_ERROR, 400, CONS_REFUSAL_NONE, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OPERATION_TIMEDOUT, 429, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_429},
        {CURLE_RECV_ERROR, 503, CONS_REFUSAL_NONE, CONS_RETRY, CONS_CLASS_HTTP_5XX},
    };
    run_table(rows, N(rows));
}

/* Policy refusals win over whatever curl and the server said (the body cap: but a 2xx). */
static void test_refusals(void **state)
{
    (void)state;
    static const struct row rows[] = {
        {CURLE_COULDNT_CONNECT, 0, CONS_REFUSAL_SSRF, CONS_PERMANENT, CONS_CLASS_SSRF},
        {CURLE_ABORTED_BY_CALLBACK, 0, CONS_REFUSAL_SSRF, CONS_PERMANENT, CONS_CLASS_SSRF},
        /* a refused address, then an allowed one that answered: the answer decides */
        {CURLE_OK, 200, CONS_REFUSAL_SSRF, CONS_DELIVERED, NULL},
        {CURLE_OK, 503, CONS_REFUSAL_SSRF, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_OK, 404, CONS_REFUSAL_SSRF, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_OPERATION_TIMEDOUT, 0, CONS_REFUSAL_SSRF, CONS_PERMANENT, CONS_CLASS_SSRF},
        {CURLE_WRITE_ERROR, 200, CONS_REFUSAL_BODY_CAP, CONS_DELIVERED, NULL}, /* accepted */
        /* a body cut off by the cap: the status line decides */
        {CURLE_WRITE_ERROR, 503, CONS_REFUSAL_BODY_CAP, CONS_RETRY, CONS_CLASS_HTTP_5XX},
        {CURLE_WRITE_ERROR, 410, CONS_REFUSAL_BODY_CAP, CONS_PERMANENT_DISABLE,
         CONS_CLASS_HTTP_410},
        {CURLE_WRITE_ERROR, 404, CONS_REFUSAL_BODY_CAP, CONS_PERMANENT, CONS_CLASS_HTTP_4XX},
        {CURLE_WRITE_ERROR, 0, CONS_REFUSAL_BODY_CAP, CONS_PERMANENT, CONS_CLASS_TOO_LARGE},
        /* the delivery proxy refused the tunnel (407, 403, 502...): retried, never the
         * endpoint's verdict */
        {CURLE_RECV_ERROR, 0, CONS_REFUSAL_PROXY, CONS_RETRY, CONS_CLASS_PROXY},
        {CURLE_COULDNT_CONNECT, 0, CONS_REFUSAL_PROXY, CONS_RETRY, CONS_CLASS_PROXY},
        {CURLE_RECV_ERROR, 403, CONS_REFUSAL_PROXY, CONS_RETRY, CONS_CLASS_PROXY},
        /* the proxy could not reach the endpoint: a failed connection, retried */
        {CURLE_RECV_ERROR, 0, CONS_REFUSAL_TUNNEL, CONS_RETRY, CONS_CLASS_CONNECT},
        {CURLE_PROXY, 0, CONS_REFUSAL_TUNNEL, CONS_RETRY, CONS_CLASS_CONNECT},
        {CURLE_COULDNT_CONNECT, 0, CONS_REFUSAL_PROXY_DOWN, CONS_RETRY, CONS_CLASS_PROXY_DOWN},
        {CURLE_OK, 200, CONS_REFUSAL_NONE, CONS_DELIVERED, NULL},
    };
    run_table(rows, N(rows));
}

static void test_verdict_names(void **state)
{
    (void)state;
    assert_string_equal(cons_verdict_name(CONS_DELIVERED), "delivered");
    assert_string_equal(cons_verdict_name(CONS_RETRY), "retry");
    assert_string_equal(cons_verdict_name(CONS_PERMANENT), "permanent");
    assert_string_equal(cons_verdict_name(CONS_PERMANENT_DISABLE), "permanent_disable");
    assert_string_equal(cons_verdict_name((enum cons_verdict)42), "unknown");
}

static void test_retry_after(void **state)
{
    (void)state;
    const int64_t lo = 1000, hi = 3600000;
    static const struct {
        long status, ra_s;
        int64_t min_ms, max_ms, want;
    } rows[] = {
        /* honoured on a transient failure's answer: 408, 425, 429, 5xx */
        {429, 120, 1000, 3600000, 120000},
        {503, 120, 1000, 3600000, 120000},
        {500, 120, 1000, 3600000, 120000},
        {502, 120, 1000, 3600000, 120000},
        {504, 120, 1000, 3600000, 120000},
        {599, 120, 1000, 3600000, 120000},
        {408, 120, 1000, 3600000, 120000},
        {425, 120, 1000, 3600000, 120000},
        /* not on a success or a permanent failure: there is no next attempt */
        {200, 120, 1000, 3600000, 0},
        {204, 120, 1000, 3600000, 0},
        {301, 120, 1000, 3600000, 0},
        {400, 120, 1000, 3600000, 0},
        {410, 120, 1000, 3600000, 0},
        {0, 120, 1000, 3600000, 0},
        {600, 120, 1000, 3600000, 0},
        /* none given */
        {429, 0, 1000, 3600000, 0},
        {429, -1, 1000, 3600000, 0},
        {503, LONG_MIN, 1000, 3600000, 0},
        /* clamped */
        {429, 1, 5000, 3600000, 5000},
        {429, 3600, 1000, 3600000, 3600000},
        {429, 3601, 1000, 3600000, 3600000},
        {429, 1000000, 1000, 3600000, 3600000},
        {429, LONG_MAX, 1000, 3600000, 3600000}, /* no overflow in s -> ms */
        {429, LONG_MAX, 0, INT64_MAX, INT64_MAX},
        {429, 10, 60000, 30000, 30000}, /* min > max: max wins */
        {429, 1, -5, 3600000, 1000},    /* negative min acts as 0 */
        {429, 10, 0, -1, 0},            /* negative max acts as 0 */
    };
    for (size_t i = 0; i < N(rows); i++) {
        int64_t got =
            cons_retry_after_ms(rows[i].status, rows[i].ra_s, rows[i].min_ms, rows[i].max_ms);
        if (got != rows[i].want)
            fail_msg("row %zu: got %lld, want %lld", i, (long long)got, (long long)rows[i].want);
    }
    /* Every positive value lands inside the bounds. */
    for (long s = 1; s < 5000; s += 7) {
        int64_t got = cons_retry_after_ms(429, s, lo, hi);
        assert_true(got >= lo && got <= hi);
        assert_int_equal(got, s * 1000 < lo ? lo : s * 1000 > hi ? hi : s * 1000);
    }
}

/* cons_proxy_refusal of a transfer through a proxy of that kind: curl's code, the answer to
 * CONNECT, the SOCKS error, the connections the transfer opened. */
static enum cons_refusal
refusal(enum cons_proxy_kind kind, int curl_code, long connect_code, int proxy_error, long conns)
{
    struct cons_proxy_answer a = {.curl_code = curl_code,
                                  .connect_code = connect_code,
                                  .proxy_error = proxy_error,
                                  .new_connections = conns,
                                  .kind = kind};
    return cons_proxy_refusal(&a);
}

/* The delivery proxy's answers: its own refusals against the endpoint being out of reach. */
static void test_proxy_refusal(void **state)
{
    (void)state;
    const enum cons_proxy_kind H = CONS_PROXY_HTTP, S = CONS_PROXY_HTTPS, K = CONS_PROXY_SOCKS;
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 407, 0, 1), CONS_REFUSAL_PROXY);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 401, 0, 1), CONS_REFUSAL_PROXY); /* tinyproxy */
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 403, 0, 1), CONS_REFUSAL_PROXY);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 429, 0, 1), CONS_REFUSAL_PROXY);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 500, 0, 1), CONS_REFUSAL_TUNNEL); /* tinyproxy */
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 502, 0, 1), CONS_REFUSAL_TUNNEL);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 503, 0, 1), CONS_REFUSAL_TUNNEL);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 504, 0, 1), CONS_REFUSAL_TUNNEL);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 404, 0, 1), CONS_REFUSAL_TUNNEL);
    /* the tunnel was made: what follows is the endpoint's */
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 200, 0, 1), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(H, CURLE_GOT_NOTHING, 200, 0, 1), CONS_REFUSAL_NONE);
    /* no answer at all: the proxy is down or its name does not resolve */
    assert_int_equal(refusal(H, CURLE_COULDNT_CONNECT, 0, 0, 0), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(H, CURLE_COULDNT_RESOLVE_PROXY, 0, 0, 0), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(K, CURLE_COULDNT_CONNECT, 0, 0, 0), CONS_REFUSAL_PROXY_DOWN);
    /* a new connection dropped before any answer to CONNECT: the proxy's (a TLS terminator
     * whose proxy is down); on a reused tunnel (no new connection) the endpoint's */
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 0, 0, 1), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(S, CURLE_GOT_NOTHING, 0, 0, 1), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(S, CURLE_SEND_ERROR, 0, 0, 1), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(H, CURLE_RECV_ERROR, 0, 0, 0), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(S, CURLE_GOT_NOTHING, 0, 0, 0), CONS_REFUSAL_NONE);
    /* SOCKS has no CONNECT code: after its tunnel, the endpoint's */
    assert_int_equal(refusal(K, CURLE_GOT_NOTHING, 0, 0, 1), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(K, CURLE_PEER_FAILED_VERIFICATION, 0, 0, 1), CONS_REFUSAL_NONE);
    /* a timeout stays the endpoint's: a proxy answers CONNECT once it reached the endpoint */
    assert_int_equal(refusal(H, CURLE_OPERATION_TIMEDOUT, 0, 0, 1), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(S, CURLE_OPERATION_TIMEDOUT, 0, 0, 1), CONS_REFUSAL_NONE);
    /* SOCKS answers */
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_REPLY_NOT_ALLOWED, 1), CONS_REFUSAL_PROXY);
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_USER_REJECTED, 1), CONS_REFUSAL_PROXY);
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_RECV_AUTH, 1), CONS_REFUSAL_PROXY);
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_REPLY_CONNECTION_REFUSED, 1),
                     CONS_REFUSAL_TUNNEL);
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_REPLY_HOST_UNREACHABLE, 1),
                     CONS_REFUSAL_TUNNEL);
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_RESOLVE_HOST, 1), CONS_REFUSAL_TUNNEL);
    assert_int_equal(refusal(K, CURLE_PROXY, 0, CURLPX_BAD_VERSION, 1), CONS_REFUSAL_NONE);
    /* an https:// proxy: TLS before any answer to CONNECT is to the proxy; after a 2xx (or
     * through a plain HTTP proxy) it is the endpoint's */
    assert_int_equal(refusal(S, CURLE_PEER_FAILED_VERIFICATION, 0, 0, 1), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(S, CURLE_SSL_CONNECT_ERROR, 0, 0, 1), CONS_REFUSAL_PROXY_DOWN);
    assert_int_equal(refusal(S, CURLE_PEER_FAILED_VERIFICATION, 200, 0, 1), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(S, CURLE_SSL_CONNECT_ERROR, 200, 0, 1), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(H, CURLE_PEER_FAILED_VERIFICATION, 0, 0, 1), CONS_REFUSAL_NONE);
    assert_int_equal(refusal(S, CURLE_RECV_ERROR, 407, 0, 1), CONS_REFUSAL_PROXY);
    /* a timeout in a TLS handshake before any answer to CONNECT: the https:// proxy's
     * handshake (the endpoint's comes only after a 2xx) */
    struct cons_proxy_answer t = {.curl_code = CURLE_OPERATION_TIMEDOUT,
                                  .new_connections = 1,
                                  .kind = S,
                                  .tls_timed_out = true};
    assert_int_equal(cons_proxy_refusal(&t), CONS_REFUSAL_PROXY_DOWN);
    t.connect_code = 200; /* the endpoint's handshake, through the tunnel */
    assert_int_equal(cons_proxy_refusal(&t), CONS_REFUSAL_NONE);
    t.connect_code = 0;
    t.kind = H; /* no TLS to a plain proxy: it was the endpoint's */
    assert_int_equal(cons_proxy_refusal(&t), CONS_REFUSAL_NONE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_status_boundaries),
        cmocka_unit_test(test_curl_codes),
        cmocka_unit_test(test_transfer_error_after_status),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_proxy_refusal),
        cmocka_unit_test(test_verdict_names),
        cmocka_unit_test(test_retry_after),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
