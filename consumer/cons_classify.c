/*
 * cons_classify: attempt outcome -> verdict + error class (see cons_classify.h).
 *
 * The CURLcode table errs on the side of RETRY: a retry is bounded by max_attempts and ends
 * as a dead letter anyway, while a wrong PERMANENT dead-letters a delivery that one more
 * attempt would have made. Only errors that no later attempt can fix (a URL curl refuses)
 * and our own policy refusals are permanent.
 */
#include "consumer/cons_classify.h"

#include <stddef.h>

#include <curl/curl.h>

/* Transfer error -> verdict/class. Returns RETRY with CONS_CLASS_TRANSFER for unknown codes. */
static enum cons_verdict classify_curl(int code, const char **cls)
{
    switch ((CURLcode)code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        *cls = CONS_CLASS_DNS;
        return CONS_RETRY;
    case CURLE_COULDNT_CONNECT:
    case CURLE_INTERFACE_FAILED:
    case CURLE_NO_CONNECTION_AVAILABLE:
        *cls = CONS_CLASS_CONNECT;
        return CONS_RETRY;
    case CURLE_OPERATION_TIMEDOUT:
        *cls = CONS_CLASS_TIMEOUT;
        return CONS_RETRY;
    /* TLS: an expired or wrong certificate is an operator mistake that gets fixed, like an
     * endpoint that is down; bounded retries give them the retry window to do it. */
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_USE_SSL_FAILED:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
        *cls = CONS_CLASS_TLS;
        return CONS_RETRY;
    case CURLE_SEND_ERROR:
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_UPLOAD_FAILED:
        *cls = CONS_CLASS_SEND;
        return CONS_RETRY;
    case CURLE_RECV_ERROR:
    case CURLE_AGAIN:
        *cls = CONS_CLASS_RECV;
        return CONS_RETRY;
    case CURLE_GOT_NOTHING:
        *cls = CONS_CLASS_EMPTY_REPLY;
        return CONS_RETRY;
    case CURLE_PARTIAL_FILE:
        *cls = CONS_CLASS_PARTIAL;
        return CONS_RETRY;
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_PROXY:
    case CURLE_BAD_CONTENT_ENCODING:
        *cls = CONS_CLASS_PROTOCOL;
        return CONS_RETRY;
    /* Our side: memory, our callbacks (without a refusal flag), options. Retried so a
     * local hiccup or a fix rolled out in time does not dead-letter the delivery. */
    case CURLE_FAILED_INIT:
    case CURLE_OUT_OF_MEMORY:
    case CURLE_WRITE_ERROR:
    case CURLE_READ_ERROR:
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_UNKNOWN_OPTION:
    case CURLE_SETOPT_OPTION_SYNTAX:
    case CURLE_HTTP_POST_ERROR:
    case CURLE_RECURSIVE_API_CALL:
    case CURLE_UNRECOVERABLE_POLL:
        *cls = CONS_CLASS_INTERNAL;
        return CONS_RETRY;
    /* No later attempt can succeed. */
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
        *cls = CONS_CLASS_INVALID_URL;
        return CONS_PERMANENT;
    case CURLE_TOO_MANY_REDIRECTS: /* only reachable if redirects were followed */
        *cls = CONS_CLASS_HTTP_3XX;
        return CONS_PERMANENT;
    case CURLE_FILESIZE_EXCEEDED: /* CURLOPT_MAXFILESIZE: a cap we set */
        *cls = CONS_CLASS_TOO_LARGE;
        return CONS_PERMANENT;
    default:
        *cls = CONS_CLASS_TRANSFER;
        return CONS_RETRY;
    }
}

/* Final HTTP status -> verdict/class. */
static enum cons_verdict classify_status(long status, const char **cls)
{
    if (status < 100 || status > 599) {
        *cls = CONS_CLASS_HTTP_INVALID;
        return CONS_PERMANENT;
    }
    if (status < 200) {
        *cls = CONS_CLASS_HTTP_1XX;
        return CONS_PERMANENT;
    }
    if (status < 300) {
        *cls = NULL;
        return CONS_DELIVERED;
    }
    if (status < 400) {
        *cls = CONS_CLASS_HTTP_3XX;
        return CONS_PERMANENT;
    }
    if (status >= 500) {
        *cls = CONS_CLASS_HTTP_5XX;
        return CONS_RETRY;
    }
    switch (status) {
    case 408: /* Request Timeout */
        *cls = CONS_CLASS_HTTP_408;
        return CONS_RETRY;
    case 425: /* Too Early */
        *cls = CONS_CLASS_HTTP_425;
        return CONS_RETRY;
    case 429: /* Too Many Requests */
        *cls = CONS_CLASS_HTTP_429;
        return CONS_RETRY;
    case 410: /* Gone: the receiver says this endpoint will never take deliveries again */
        *cls = CONS_CLASS_HTTP_410;
        return CONS_PERMANENT_DISABLE;
    default:
        *cls = CONS_CLASS_HTTP_4XX;
        return CONS_PERMANENT;
    }
}

/* the CURLcodes of a TLS handshake that failed or a certificate that did not verify */
static bool tls_setup_failure(int curl_code)
{
    switch ((CURLcode)curl_code) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
        return true;
    default:
        return false;
    }
}

enum cons_refusal cons_proxy_refusal(const struct cons_proxy_answer *a)
{
    long cc = a->connect_code;
    if (cc == 407 || cc == 401 || cc == 403 || cc == 429)
        return CONS_REFUSAL_PROXY;
    if (cc != 0 && (cc < 200 || cc > 299))
        return CONS_REFUSAL_TUNNEL;
    switch ((CURLproxycode)a->proxy_error) {
    case CURLPX_REPLY_NOT_ALLOWED:
    case CURLPX_USER_REJECTED:
    case CURLPX_NO_AUTH:
    case CURLPX_SEND_AUTH:
    case CURLPX_RECV_AUTH:
    case CURLPX_REQUEST_FAILED: /* SOCKS4: request rejected */
        return CONS_REFUSAL_PROXY;
    case CURLPX_REPLY_CONNECTION_REFUSED:
    case CURLPX_REPLY_HOST_UNREACHABLE:
    case CURLPX_REPLY_NETWORK_UNREACHABLE:
    case CURLPX_REPLY_TTL_EXPIRED:
    case CURLPX_REPLY_GENERAL_SERVER_FAILURE:
    case CURLPX_RESOLVE_HOST:
        return CONS_REFUSAL_TUNNEL;
    default:
        break;
    }
    if (cc != 0 || a->proxy_error != 0)
        return CONS_REFUSAL_NONE; /* the tunnel was made: the endpoint's failure */
    if (a->curl_code == CURLE_COULDNT_CONNECT || a->curl_code == CURLE_COULDNT_RESOLVE_PROXY)
        return CONS_REFUSAL_PROXY_DOWN;
    if (a->kind == CONS_PROXY_SOCKS || a->new_connections <= 0)
        return CONS_REFUSAL_NONE; /* SOCKS has no CONNECT code; a reused tunnel had one before */
    /* a new connection to an HTTP(S) proxy that never answered CONNECT */
    if (a->curl_code == CURLE_RECV_ERROR || a->curl_code == CURLE_SEND_ERROR ||
        a->curl_code == CURLE_GOT_NOTHING)
        return CONS_REFUSAL_PROXY_DOWN;
    if (a->kind == CONS_PROXY_HTTPS &&
        (tls_setup_failure(a->curl_code) ||
         (a->curl_code == CURLE_OPERATION_TIMEDOUT && a->tls_timed_out)))
        return CONS_REFUSAL_PROXY_DOWN; /* TLS to the proxy: no tunnel was asked for yet */
    return CONS_REFUSAL_NONE;
}

enum cons_verdict
cons_classify(int curl_code, long http_status, enum cons_refusal refusal, const char **error_class)
{
    const char *cls = NULL;
    enum cons_verdict v;
    if (refusal == CONS_REFUSAL_SSRF && http_status == 0) {
        /* every address the name resolved to was refused (cons_http reports the refusal only
         * then: with an allowed address beside, that address's outcome decides) */
        cls = CONS_CLASS_SSRF;
        v = CONS_PERMANENT;
    } else if (refusal == CONS_REFUSAL_PROXY) {
        /* the proxy, not the endpoint, said no (credentials, its rules): nothing reached the
         * endpoint, and a fixed proxy or its rules deliver it on a retry */
        cls = CONS_CLASS_PROXY;
        v = CONS_RETRY;
    } else if (refusal == CONS_REFUSAL_PROXY_DOWN) {
        /* nothing left this host: the proxy is down or its name does not resolve */
        cls = CONS_CLASS_PROXY_DOWN;
        v = CONS_RETRY;
    } else if (refusal == CONS_REFUSAL_TUNNEL) {
        /* the proxy could not reach the endpoint: as a failed connection of our own */
        cls = CONS_CLASS_CONNECT;
        v = CONS_RETRY;
    } else if (http_status >= 200 && http_status < 300) {
        /* the endpoint accepted it: what happens to the body after the status line (cut
         * off by our cap, timed out, reset) does not undo that, and a retry would send it
         * a second time */
        v = CONS_DELIVERED;
    } else if (refusal == CONS_REFUSAL_BODY_CAP && http_status == 0) {
        cls = CONS_CLASS_TOO_LARGE;
        v = CONS_PERMANENT;
    } else if (curl_code == CURLE_OK || refusal == CONS_REFUSAL_BODY_CAP || http_status >= 300) {
        /* an answer's status line decides, also when its body was then cut off by our cap,
         * timed out or reset: a 503 with a huge error page is retried, a 410 disables, a 400
         * is not sent again */
        v = classify_status(http_status, &cls);
    } else {
        v = classify_curl(curl_code, &cls);
    }
    if (error_class)
        *error_class = cls;
    return v;
}

const char *cons_verdict_name(enum cons_verdict v)
{
    switch (v) {
    case CONS_DELIVERED:
        return "delivered";
    case CONS_RETRY:
        return "retry";
    case CONS_PERMANENT:
        return "permanent";
    case CONS_PERMANENT_DISABLE:
        return "permanent_disable";
    }
    return "unknown";
}

int64_t cons_retry_after_ms(long http_status, long retry_after_s, int64_t min_ms, int64_t max_ms)
{
    /* a transient failure's answer (classify_status: 408, 425, 429, 5xx); a Retry-After on a
     * success or a permanent failure has no next attempt to delay */
    if (http_status != 408 && http_status != 425 && http_status != 429 &&
        (http_status < 500 || http_status > 599))
        return 0;
    if (retry_after_s <= 0)
        return 0;
    if (min_ms < 0)
        min_ms = 0;
    if (max_ms < 0)
        max_ms = 0;
    int64_t ms =
        (int64_t)retry_after_s > INT64_MAX / 1000 ? INT64_MAX : (int64_t)retry_after_s * 1000;
    if (ms < min_ms)
        ms = min_ms;
    if (ms > max_ms)
        ms = max_ms;
    return ms;
}
