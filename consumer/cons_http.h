/*
 * cons_http: many concurrent HTTP requests on one thread with libcurl's multi_socket API and
 * epoll (curl_multi_poll scans every fd per call and degrades past a few hundred transfers).
 *
 * The engine owns the epoll set; other event sources (librdkafka's queue wake-up pipe) are
 * added with cons_http_watch_fd and reported by cons_http_run. Easy handles are pooled and
 * reused with their options (set once per handle, never curl_easy_reset), so connections
 * (keep-alive, in the connection caches of cons_http.c's share objects) and DNS cache
 * entries are reused across deliveries.
 *
 * Every request is built safely by construction: redirects never followed, protocols limited
 * to http and https, proxy environment variables ignored, no signals, "Expect:" suppressed,
 * the response body kept up to a prefix and the transfer aborted past a hard cap (in the
 * write callback: CURLOPT_MAXFILESIZE does not stop chunked bodies in 7.88), and every
 * address checked by the SSRF policy in the open-socket callback before connect.
 *
 * thread: one engine per thread; callbacks run inside cons_http_run.
 */
#ifndef CONS_HTTP_H
#define CONS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "common/sl_err.h"
#include "common/sl_ssrf.h"
#include "consumer/cons_classify.h"

typedef struct cons_http cons_http_t;

/* What came back from one request. */
struct cons_http_result {
    int curl_code;             /* CURLcode as int */
    long status;               /* HTTP status; 0 = none */
    long retry_after_s;        /* CURLINFO_RETRY_AFTER; 0 = none */
    enum cons_refusal refusal; /* set when our callbacks refused or aborted */
    const char *refusal_why;   /* static detail for SSRF refusals (e.g. "loopback") */
    int64_t total_us;          /* CURLINFO_TOTAL_TIME_T */
    int64_t dns_us;            /* name lookup */
    int64_t connect_us;        /* TCP connect (after DNS); 0 on a reused connection */
    int64_t tls_us;            /* TLS handshake; 0 for http or reuse */
    int64_t ttfb_us;           /* time to first response byte */
    const uint8_t *resp;       /* kept prefix of the response body (borrowed until the
                                  callback returns) */
    size_t resp_len;           /* bytes in resp */
    uint64_t resp_total;       /* response bytes received */
    const char *errbuf;        /* libcurl's error text ("" if none) */
};

/* Called once per request, from cons_http_run. */
typedef void (*cons_http_done_cb)(void *opaque, const struct cons_http_result *res);

/* One request. Every pointer is borrowed until the done callback has run. */
struct cons_http_req {
    const char *method;         /* "POST", "GET", ... */
    const char *url;            /* full URL (may carry secrets in its query: never logged) */
    struct curl_slist *headers; /* complete header list */
    const uint8_t *body;        /* request body (NULL with len 0 for GET) */
    size_t body_len;            /* bytes */
    long timeout_ms;            /* total */
    long connect_timeout_ms;    /* connect incl. TLS */
    cons_http_done_cb done;     /* completion callback */
    void *opaque;               /* passed to done */
};

struct cons_http_opts {
    const struct sl_ssrf_policy *ssrf; /* borrowed for the engine's life */
    size_t keep_bytes;                 /* response prefix kept */
    uint64_t max_bytes;                /* abort past this */
    const char *user_agent;            /* "Sluice/0.1.0" */
    const char *ca_file;               /* PEM CAs for HTTPS, in place of the system's; ""/NULL:
                                          libcurl's default bundle */
    const char *proxy;                 /* delivery_proxy: every request tunnelled (CONNECT)
                                          through it; ""/NULL: direct */
    const char *proxy_ca_file;         /* PEM CAs for an https:// proxy's certificate, in place
                                          of the system's; ""/NULL: libcurl's default bundle */
};

cons_http_t *cons_http_new(const struct cons_http_opts *opts, sl_err_t *err);
void cons_http_destroy(cons_http_t *h);

/* Start a request. Returns 0 (done will be called exactly once) or SL_E* (never called).
 * *handle_out (optional) identifies it for cons_http_cancel. */
int cons_http_start(cons_http_t *h,
                    const struct cons_http_req *req,
                    void **handle_out,
                    sl_err_t *err);
/* Abort a running request without calling its done callback. */
void cons_http_cancel(cons_http_t *h, void *handle);

/* Watch an extra fd for readability; cons_http_run reports it through *ready_fds. */
int cons_http_watch_fd(cons_http_t *h, int fd);

/*
 * Wait up to max_wait_ms for socket activity or curl timers, drive transfers, and run done
 * callbacks for finished ones. Watched fds that became readable are reported by setting
 * *extra_ready to 1 (they are not read). Returns the number of transfers still running.
 */
int cons_http_run(cons_http_t *h, int max_wait_ms, int *extra_ready);

/* Transfers running now. */
int cons_http_running(const cons_http_t *h);

/* Time cons_http_run spent waiting in epoll since the last call (µs): the loop's idle time. */
int64_t cons_http_take_idle_us(cons_http_t *h);

/* Transfers finished (their done callback run) since the last call. */
int64_t cons_http_take_answered(cons_http_t *h);

#endif /* CONS_HTTP_H */
