/*
 * cons_classify: the fate of one delivery attempt, as a pure function of what libcurl
 * reported (CURLcode, final HTTP status) and of our own policy refusals. Design invariant 4:
 *
 *   DELIVERED         a 2xx status line, whatever happened to the body after it
 *   RETRY             transfer errors that may be transient (DNS, connect, timeouts, TLS,
 *                     send/recv, empty or partial replies, HTTP/2 stream errors, local
 *                     resource errors), 408, 425, 429, 5xx
 *   PERMANENT         3xx (redirects are never followed), other 4xx, 1xx as a final status,
 *                     a status outside 100..599 or none at all, a URL curl cannot use, and
 *                     an SSRF refusal
 *   PERMANENT_DISABLE 410 Gone: permanent, and the endpoint is disabled
 *
 * A policy refusal is an explicit input because libcurl cannot tell it apart: an address
 * refused in CURLOPT_OPENSOCKETFUNCTION surfaces as CURLE_COULDNT_CONNECT and a body-cap
 * abort in the write callback as CURLE_WRITE_ERROR. The SSRF refusal wins when nothing
 * answered (with a name that resolves to a refused and an allowed address, libcurl goes on to
 * the allowed one after the refusal, and that answer decides). A body cut off by the body
 * cap leaves the decision to its status line (2xx delivered, 503 retried, 410 disables...).
 *
 * Every verdict but DELIVERED comes with an error class: a stable snake_case string for the
 * outcome record, dashboards and dead-letter analysis (see CONS_CLASS_* below).
 *
 * thread: any; pure functions, static strings.
 */
#ifndef CONS_CLASSIFY_H
#define CONS_CLASSIFY_H

#include <stdbool.h>
#include <stdint.h>

enum cons_verdict {
    CONS_DELIVERED = 0,         /* 2xx: done, write the delivered marker */
    CONS_RETRY = 1,             /* transient: schedule with backoff (or dead-letter if spent) */
    CONS_PERMANENT = 2,         /* dead-letter now, no retry */
    CONS_PERMANENT_DISABLE = 3, /* dead-letter now and disable the endpoint (410) */
};

/* Why we aborted or refused a transfer ourselves (set by the callbacks that did it). */
enum cons_refusal {
    CONS_REFUSAL_NONE = 0,       /* libcurl's result stands */
    CONS_REFUSAL_SSRF = 1,       /* opensocket callback refused the resolved address */
    CONS_REFUSAL_BODY_CAP = 2,   /* write callback stopped an over-long response body */
    CONS_REFUSAL_PROXY = 3,      /* the delivery proxy refused us: credentials, rules, limits */
    CONS_REFUSAL_TUNNEL = 4,     /* the delivery proxy could not reach the endpoint */
    CONS_REFUSAL_PROXY_DOWN = 5, /* the delivery proxy itself could not be reached */
};

/* The delivery proxy's kind, from its URL's scheme. */
enum cons_proxy_kind {
    CONS_PROXY_HTTP = 0,  /* http://: CONNECT in the clear */
    CONS_PROXY_HTTPS = 1, /* https://: TLS to the proxy, then CONNECT inside it */
    CONS_PROXY_SOCKS = 2, /* socks5h:// */
};

/* What libcurl says of a failed transfer through the delivery proxy. */
struct cons_proxy_answer {
    int curl_code;             /* the transfer's CURLcode */
    long connect_code;         /* CURLINFO_HTTP_CONNECTCODE: the answer to CONNECT; 0 = none
                                  (reset per transfer; a reused tunnel has none) */
    int proxy_error;           /* CURLINFO_PROXY_ERROR after CURLE_PROXY (SOCKS); 0 = none */
    long new_connections;      /* CURLINFO_NUM_CONNECTS: connections this transfer opened */
    enum cons_proxy_kind kind; /* the proxy's */
    bool tls_timed_out;        /* a timeout in a TLS handshake (libcurl 7.88's error text
                                  "SSL connection timeout"; cons_http) */
};

/*
 * Whose failure a transfer through the delivery proxy is. 407 and 401 (credentials:
 * tinyproxy answers 401), 403 (its rules), 429 (its limits), and SOCKS authentication
 * failures and rule denials, are CONS_REFUSAL_PROXY; any other non-2xx answer to CONNECT, and
 * SOCKS "unreachable / refused / not resolved", are CONS_REFUSAL_TUNNEL (tinyproxy answers
 * 500, Squid and smokescreen 502-504 when the endpoint is down). CONS_REFUSAL_PROXY_DOWN: the
 * proxy could not be connected to or its name did not resolve; or an HTTP(S) proxy took a new
 * connection and dropped it without answering CONNECT (a send or receive error, nothing
 * received); or, for an https:// proxy, a TLS handshake or certificate failure, or a timeout
 * in that handshake, before any answer to CONNECT (that TLS is to the proxy: the endpoint's
 * own comes after a 2xx). Any other timeout with no answer stays the endpoint's: a proxy
 * answers CONNECT only once it has reached the endpoint. Anything else is CONS_REFUSAL_NONE (curl's
 * code decides).
 */
enum cons_refusal cons_proxy_refusal(const struct cons_proxy_answer *a);

/* Error classes (the strings returned through *error_class). */
#define CONS_CLASS_TIMEOUT      "timeout"          /* CURLE_OPERATION_TIMEDOUT */
#define CONS_CLASS_CONNECT      "connect"          /* refused/unreachable, local interface */
#define CONS_CLASS_DNS          "dns"              /* host (or proxy) did not resolve */
#define CONS_CLASS_TLS          "tls"              /* handshake, certificate, pinning */
#define CONS_CLASS_SEND         "send"             /* error while sending the request */
#define CONS_CLASS_RECV         "recv"             /* error while receiving the response */
#define CONS_CLASS_EMPTY_REPLY  "empty_reply"      /* connection closed without a response */
#define CONS_CLASS_PARTIAL      "partial_response" /* response body cut short */
#define CONS_CLASS_PROTOCOL     "protocol"         /* malformed HTTP, HTTP/2 or proxy errors */
#define CONS_CLASS_INTERNAL     "internal"         /* our side: memory, callbacks, bad options */
#define CONS_CLASS_TRANSFER     "transfer"         /* any other transfer error */
#define CONS_CLASS_INVALID_URL  "invalid_url"      /* curl cannot use the endpoint URL */
#define CONS_CLASS_HTTP_1XX     "http_1xx"
#define CONS_CLASS_HTTP_3XX     "http_3xx"
#define CONS_CLASS_HTTP_408     "http_408"
#define CONS_CLASS_HTTP_410     "http_410"
#define CONS_CLASS_HTTP_425     "http_425"
#define CONS_CLASS_HTTP_429     "http_429"
#define CONS_CLASS_HTTP_4XX     "http_4xx"
#define CONS_CLASS_HTTP_5XX     "http_5xx"
#define CONS_CLASS_HTTP_INVALID "http_invalid_status" /* no status, or outside 100..599 */
#define CONS_CLASS_SSRF         "ssrf_refused"
#define CONS_CLASS_PROXY        "proxy_refused"     /* delivery_proxy refused us the tunnel */
#define CONS_CLASS_PROXY_DOWN   "proxy_unreachable" /* delivery_proxy could not be reached */
#define CONS_CLASS_TOO_LARGE    "response_too_large"

/* Every class above, for the failures counter (sluice_attempt_failures_total{class}). */
#define CONS_CLASSES                                                                               \
    CONS_CLASS_TIMEOUT, CONS_CLASS_CONNECT, CONS_CLASS_DNS, CONS_CLASS_TLS, CONS_CLASS_SEND,       \
        CONS_CLASS_RECV, CONS_CLASS_EMPTY_REPLY, CONS_CLASS_PARTIAL, CONS_CLASS_PROTOCOL,          \
        CONS_CLASS_INTERNAL, CONS_CLASS_TRANSFER, CONS_CLASS_INVALID_URL, CONS_CLASS_HTTP_1XX,     \
        CONS_CLASS_HTTP_3XX, CONS_CLASS_HTTP_408, CONS_CLASS_HTTP_410, CONS_CLASS_HTTP_425,        \
        CONS_CLASS_HTTP_429, CONS_CLASS_HTTP_4XX, CONS_CLASS_HTTP_5XX, CONS_CLASS_HTTP_INVALID,    \
        CONS_CLASS_SSRF, CONS_CLASS_PROXY, CONS_CLASS_PROXY_DOWN, CONS_CLASS_TOO_LARGE

/*
 * Classify one finished attempt. curl_code is the CURLcode from CURLMSG_DONE (as int);
 * http_status is CURLINFO_RESPONSE_CODE (0 when no response); refusal is what our own
 * callbacks did. *error_class (OUT, optional: NULL allowed) receives a static string, NULL
 * for CONS_DELIVERED.
 *
 * A status line decides whatever then happened to the body (timed out, cut short, over the
 * body cap): a 2xx is DELIVERED (the endpoint accepted the event, and retrying would send it
 * twice), a 503 is retried, a 410 disables, a 400 is not sent again. CURLE_OK with a status
 * outside 100..599 is PERMANENT.
 */
enum cons_verdict
cons_classify(int curl_code, long http_status, enum cons_refusal refusal, const char **error_class);

/* "delivered", "retry", "permanent", "permanent_disable" (static; "unknown" otherwise). */
const char *cons_verdict_name(enum cons_verdict v);

/*
 * Delay a server asked for, in ms: honoured on the answers of a transient failure (408, 425,
 * 429, 5xx: Standard Webhooks says a retry-after "should be taken into consideration when
 * scheduling the next attempt"), and only when
 * retry_after_s (CURLINFO_RETRY_AFTER: seconds, 0 or -1 = none; HTTP dates are already
 * converted by libcurl) is positive. The result is clamped to [min_ms, max_ms] (a negative
 * min_ms counts as 0; max_ms wins when min_ms > max_ms) without overflow for any input.
 * Returns 0 when there is nothing to honour.
 */
int64_t cons_retry_after_ms(long http_status, long retry_after_s, int64_t min_ms, int64_t max_ms);

#endif /* CONS_CLASSIFY_H */
