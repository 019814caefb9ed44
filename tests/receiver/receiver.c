/*
 * sluice-receiver: the scripted HTTP endpoint for Sluice's tests, demo and benchmarks.
 *
 * Built on libmicrohttpd (epoll, internal thread pool, keep-alive): no HTTP parsing here.
 * The URL path picks a behaviour, /<behaviour>[/<arg>][/<endpoint>...], and query
 * parameters adjust it (see usage()). Every request is read fully (capped at --max-body),
 * optionally signature-checked (Standard Webhooks), then answered by one decision function,
 * on_complete(), in a fixed order: 413/400 for bad requests, bad signature (with
 * --reject-bad-sig), rate limit, flaky failure, then the behaviour itself; any of them may
 * be delayed. Delays and endless pacing suspend the MHD connection and let recv_sched resume
 * it, so a worker thread never sleeps and a slow endpoint never slows another.
 *
 * Each request yields exactly one ledger line (recv_ledger) and one count in /_stats, written
 * by record() when the response is queued or, if none will ever be sent (reset, hang, client
 * gone, shutdown), when the receiver gives up on it; status 0 means "no response".
 * Ledger lines carry ids, sizes and timing only: never bodies or signature header values.
 *
 * Threads: MHD workers run the handler and content readers; recv_sched's timer thread
 * resumes connections; recv_ledger's flusher writes; the main thread waits for SIGTERM/SIGINT
 * (blocked everywhere else) and then shuts down in MHD's required order: stop accepting,
 * resume every suspended connection, stop the daemon, flush the ledger.
 */
#include <errno.h>
#include <getopt.h>
#include <gnutls/gnutls.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_httpd.h"
#include "common/sl_limits.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_sign.h"
#include "recv_ledger.h"
#include "recv_sched.h"
#include "recv_tables.h"

#define ENDPOINT_MAX    128                  /* bytes kept of an endpoint name, with NUL */
#define LEDGER_LINE_MAX 8192                 /* one ledger line, bytes */
#define LEDGER_ID_MAX   256                  /* chars of webhook-id copied into the ledger */
#define IDS_OUT_MAX     (512u * 1024 * 1024) /* largest /_ledger/ids answer, bytes */
#define STATS_OUT_MAX   (64u * 1024)         /* largest /_stats answer, bytes */
#define ENDLESS_BURST   (16u * 1024)         /* bytes sent at once when endless starts */
#define ENDLESS_CHUNK   (16u * 1024)         /* most bytes per endless read, and per wake */
#define BIG_MAX         (1ULL << 40)         /* largest big/<bytes>, bytes (streamed) */
#define DELAY_MAX_MS    (3600ULL * 1000)     /* largest slow/<ms> or delay_ms, ms */
#define UPLOAD_GIVE_UP  4                    /* close when a capped upload exceeds N x cap */
#define REDIRECT_TARGET "http://169.254.169.254/latest/meta-data/"

/* ==== behaviours ==== */

enum kind {
    K_OK,
    K_STATUS,
    K_SLOW,
    K_FLAKY,
    K_FLAKY_N,
    K_RATELIMIT,
    K_RETRYAFTER,
    K_UNAUTH,
    K_GONE,
    K_REDIRECT,
    K_RESET,
    K_ENDLESS,
    K_BIG,
    K_HANG,
    K_UNKNOWN, /* no such behaviour: 404 */
    K_STATS,   /* GET /_stats (control: no ledger line, no count) */
    K_IDS,     /* GET /_ledger/ids (control) */
    K__COUNT
};

static const struct {
    const char *name; /* first path segment; also path_kind in the ledger */
    bool has_arg;     /* takes /<arg> as second segment */
} kinds[K__COUNT] = {
    [K_OK] = {"ok", false},
    [K_STATUS] = {"status", true},
    [K_SLOW] = {"slow", true},
    [K_FLAKY] = {"flaky", true},
    [K_FLAKY_N] = {"flaky_n", true},
    [K_RATELIMIT] = {"ratelimit", true},
    [K_RETRYAFTER] = {"retryafter", true},
    [K_UNAUTH] = {"unauth", false},
    [K_GONE] = {"gone", false},
    [K_REDIRECT] = {"redirect", false},
    [K_RESET] = {"reset", false},
    [K_ENDLESS] = {"endless", false},
    [K_BIG] = {"big", true},
    [K_HANG] = {"hang", false},
    [K_UNKNOWN] = {"unknown", false},
    [K_STATS] = {"_stats", false},
    [K_IDS] = {"_ledger", false},
};

/* What happens once the status is settled. */
enum action {
    ACT_RESPOND, /* queue a response with plan.status */
    ACT_RESET,   /* close the connection without a response (RST) */
    ACT_HANG,    /* never answer (until the client leaves or shutdown) */
    ACT_ENDLESS, /* 200, chunked body that never ends, paced at --endless-bps */
};

/* The behaviour of one request, from its path then its query parameters. */
struct plan {
    enum kind kind;        /* behaviour named by the path */
    enum action action;    /* what to do after the checks */
    unsigned status;       /* status of the normal answer, 200..599 */
    uint64_t delay_ms;     /* wait before answering, ms; 0 = none */
    unsigned fail_pct;     /* flaky: % of attempts answered fail_status, 0..100 */
    uint64_t fail_n;       /* flaky_n: first N attempts per id answered fail_status */
    unsigned fail_status;  /* status of a flaky failure, default 500 */
    uint64_t rate;         /* token bucket, requests/s per endpoint; 0 = unlimited */
    int64_t retry_after_s; /* Retry-After value to send, s; -1 = no header */
    uint64_t body_bytes;   /* body size, bytes; UINT64_MAX = the default small body */
    bool close;            /* Connection: close with the answer (a new connection each time) */
    const char *bad_arg;   /* name of an invalid argument (-> 400); NULL = all valid */
};

enum phase {
    PH_READING,  /* headers seen, body arriving */
    PH_DELAYING, /* suspended until the delay is over */
    PH_HANGING,  /* suspended forever */
    PH_ANSWERED, /* response queued (or streaming) */
};

struct app;

/* Per-request state: MHD's con_cls, freed in on_completed(). */
struct req {
    struct app *app;             /* borrowed */
    struct MHD_Connection *conn; /* borrowed from MHD */
    const char *url;             /* path without query (MHD pool; valid for the request) */
    const char *method;          /* MHD pool */
    const char *wh_id;           /* webhook-id header value or NULL (MHD pool) */
    const char *wh_ts;           /* webhook-timestamp header value or NULL (MHD pool) */
    const char *wh_sig;          /* webhook-signature value or NULL; never logged (MHD pool) */
    const char *created;         /* x-sluice-created-ms value or NULL (MHD pool) */
    const char *content_length;  /* Content-Length value or NULL (MHD pool) */
    char endpoint[ENDPOINT_MAX]; /* from the path or ?ep=, NUL-terminated; "" = none */
    struct plan plan;            /* requested behaviour */
    enum phase phase;            /* where the request is */
    struct recv_wait wait;       /* suspension bookkeeping (recv_sched) */
    int64_t ts_ms;               /* wall clock at arrival, unix ms */
    uint64_t body_len;           /* body bytes received */
    bool body_too_big;           /* body exceeded --max-body: answer 413 */
    bool verify;                 /* secrets configured: buffer the body */
    struct sl_buf body;          /* the body, only when verify */
    int sig_ok;                  /* -1 = not checked, 0 = bad, 1 = good */
    unsigned status;             /* decided status (0 = no response) */
    bool override;               /* status came from a check (sig, rate, flaky): plain answer */
    int64_t retry_after_s;       /* Retry-After to send, s; -1 = none */
    uint32_t attempt;            /* flaky attempt number at the receiver; 0 = not counted */
    uint64_t fallback_key;       /* hash of path+query, the flaky key without webhook-id */
    unsigned query_keys;         /* number of query parameters */
    int64_t stream_t0;           /* monotonic ms when the endless body started */
    bool recorded;               /* record() ran */
};

struct stats {
    atomic_uint_fast64_t requests;          /* recorded requests */
    atomic_uint_fast64_t by_status[600];    /* index = status; 0 = no response */
    atomic_uint_fast64_t by_kind[K__COUNT]; /* by behaviour */
    atomic_uint_fast64_t sig_ok;            /* signature checked and valid */
    atomic_uint_fast64_t sig_bad;           /* signature checked and invalid/missing */
    atomic_uint_fast64_t bytes_in;          /* request body bytes */
    atomic_uint_fast64_t dups;              /* 2xx for an (endpoint, id) already accepted */
    atomic_uint_fast64_t connections;       /* connections accepted (TLS: each a handshake) */
    atomic_uint_fast64_t tls_resumed;       /* requests over a resumed TLS session */
};

struct app {
    /* options (read-only after start) */
    uint16_t port;           /* requested port; 0 = ephemeral */
    bool ipv6;               /* listen on [::1] instead of 127.0.0.1 */
    unsigned threads;        /* HTTP loop threads (common/sl_httpd) */
    unsigned max_conns;      /* MHD connection limit */
    unsigned idle_timeout_s; /* keep-alive idle timeout, s; 0 = none */
    uint64_t max_body;       /* request body cap, bytes */
    const char *ledger_path; /* --ledger (argv, borrowed); NULL = no ledger */
    bool no_ledger_ok;       /* skip ledger lines for 2xx */
    struct sl_secret secrets[SL_SIGNER_MAX_SECRETS]; /* --secret keys (wiped at exit) */
    size_t nsecrets;                                 /* secrets in use */
    bool reject_bad_sig;                             /* answer 401 to bad signatures */
    int64_t tolerance_s;  /* webhook-timestamp skew allowed, s; -1 = unchecked */
    uint64_t endless_bps; /* endless pacing, bytes/s */
    uint64_t max_ids;     /* accepted (endpoint, id) pairs remembered */
    /* run time */
    recv_sched_t *sched;             /* suspensions */
    recv_ledger_t *ledger;           /* NULL = no ledger */
    recv_tables_t *tables;           /* attempts, buckets, accepted ids */
    struct MHD_Response *r204;       /* shared empty 204 (the /ok fast path) */
    struct MHD_Response *r204_close; /* the same with Connection: close (?close=1) */
    char *tls_cert;                  /* --tls-cert file's text; NULL = plain HTTP */
    char *tls_key;                   /* --tls-key file's text (wiped at exit) */
    bool tls_resume;                 /* --tls-resume: session tickets (resumed handshakes) */
    gnutls_datum_t ticket_key;       /* the tickets' key, made at start (wiped at exit) */
    struct stats st;                 /* counters for /_stats */
    atomic_bool started;             /* daemon up: MHD messages become debug */
};

/* ==== small helpers ==== */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Strict unsigned decimal in [min, max]: digits only, no sign, no spaces. */
static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end = NULL;
    if (s == NULL || *s < '0' || *s > '9')
        return SL_EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return SL_EINVAL;
    *out = (uint64_t)v;
    return 0;
}

/* Signed decimal for header values (timestamps); 0 on success. */
static int parse_i64(const char *s, int64_t *out)
{
    char *end = NULL;
    if (s == NULL || *s == '\0')
        return SL_EINVAL;
    const char *p = *s == '-' ? s + 1 : s;
    if (*p < '0' || *p > '9')
        return SL_EINVAL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return SL_EINVAL;
    *out = (int64_t)v;
    return 0;
}

static void stat_add(atomic_uint_fast64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static uint64_t stat_get(atomic_uint_fast64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* ==== plan: path and query ==== */

/* Copy path segment i (0-based) of url into out (bounded); returns its length or -1. */
static long path_segment(const char *url, int i, char *out, size_t outlen)
{
    const char *p = url;
    for (int k = 0;; k++) {
        while (*p == '/')
            p++;
        if (*p == '\0')
            return -1;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (k == i) {
            if (n >= outlen)
                n = outlen - 1;
            memcpy(out, p, n);
            out[n] = '\0';
            return (long)n;
        }
        p += n;
    }
}

static void plan_init(struct plan *pl)
{
    memset(pl, 0, sizeof(*pl));
    pl->action = ACT_RESPOND;
    pl->status = 200;
    pl->fail_status = 500;
    pl->retry_after_s = -1;
    pl->body_bytes = UINT64_MAX;
}

/* Fill rq->plan and rq->endpoint from the path. Query parameters come after (on_query). */
static void plan_from_path(struct req *rq)
{
    struct plan *pl = &rq->plan;
    char seg[64], arg[32];
    uint64_t v = 0;
    int next = 1; /* index of the endpoint segment */

    plan_init(pl);
    pl->kind = K_UNKNOWN;
    if (path_segment(rq->url, 0, seg, sizeof(seg)) >= 0) {
        for (int k = 0; k < K__COUNT; k++) {
            if (k != K_UNKNOWN && strcmp(seg, kinds[k].name) == 0) {
                pl->kind = (enum kind)k;
                break;
            }
        }
    }
    if (pl->kind == K_IDS) {
        if (path_segment(rq->url, 1, seg, sizeof(seg)) < 0 || strcmp(seg, "ids") != 0)
            pl->kind = K_UNKNOWN;
        return;
    }
    if (kinds[pl->kind].has_arg) {
        next = 2;
        if (path_segment(rq->url, 1, arg, sizeof(arg)) < 0)
            arg[0] = '\0';
    }
    switch (pl->kind) {
    case K_OK:
        pl->status = 204;
        break;
    case K_STATUS:
        if (parse_u64(arg, 200, 599, &v) == 0)
            pl->status = (unsigned)v;
        else
            pl->bad_arg = "status code";
        break;
    case K_SLOW:
        if (parse_u64(arg, 0, DELAY_MAX_MS, &v) == 0)
            pl->delay_ms = v;
        else
            pl->bad_arg = "delay";
        break;
    case K_FLAKY:
        if (parse_u64(arg, 0, 100, &v) == 0)
            pl->fail_pct = (unsigned)v;
        else
            pl->bad_arg = "failure percentage";
        break;
    case K_FLAKY_N:
        if (parse_u64(arg, 0, UINT32_MAX, &v) == 0)
            pl->fail_n = v;
        else
            pl->bad_arg = "failure count";
        break;
    case K_RATELIMIT:
        if (parse_u64(arg, 1, 1000000000, &v) == 0)
            pl->rate = v;
        else
            pl->bad_arg = "rate";
        break;
    case K_RETRYAFTER:
        pl->status = 429;
        if (parse_u64(arg, 0, 1000000000, &v) == 0)
            pl->retry_after_s = (int64_t)v;
        else
            pl->bad_arg = "retry-after seconds";
        break;
    case K_UNAUTH:
        pl->status = 401;
        break;
    case K_GONE:
        pl->status = 410;
        break;
    case K_REDIRECT:
        pl->status = 302;
        break;
    case K_RESET:
        pl->action = ACT_RESET;
        break;
    case K_ENDLESS:
        pl->action = ACT_ENDLESS;
        break;
    case K_BIG:
        if (parse_u64(arg, 0, BIG_MAX, &v) == 0)
            pl->body_bytes = v;
        else
            pl->bad_arg = "body size";
        break;
    case K_HANG:
        pl->action = ACT_HANG;
        break;
    case K_UNKNOWN:
        pl->status = 404;
        break;
    case K_STATS:
    case K_IDS:
    case K__COUNT:
        break;
    }
    if (path_segment(rq->url, next, rq->endpoint, sizeof(rq->endpoint)) < 0)
        rq->endpoint[0] = '\0';
}

/* One query parameter; also hashes it into the flaky fallback key. */
static enum MHD_Result
on_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct req *rq = cls;
    struct plan *pl = &rq->plan;
    uint64_t v = 0;
    (void)kind;

    rq->query_keys++;
    rq->fallback_key = recv_key(key, value) ^ (rq->fallback_key * 0x9e3779b97f4a7c15ULL);
    if (strcmp(key, "ep") == 0) {
        snprintf(rq->endpoint, sizeof(rq->endpoint), "%s", value ? value : "");
    } else if (strcmp(key, "status") == 0) {
        if (parse_u64(value, 200, 599, &v) == 0)
            pl->status = (unsigned)v;
        else
            pl->bad_arg = "status";
    } else if (strcmp(key, "delay_ms") == 0) {
        if (parse_u64(value, 0, DELAY_MAX_MS, &v) == 0)
            pl->delay_ms = v;
        else
            pl->bad_arg = "delay_ms";
    } else if (strcmp(key, "fail_pct") == 0) {
        if (parse_u64(value, 0, 100, &v) == 0)
            pl->fail_pct = (unsigned)v;
        else
            pl->bad_arg = "fail_pct";
    } else if (strcmp(key, "fail_n") == 0) {
        if (parse_u64(value, 0, UINT32_MAX, &v) == 0)
            pl->fail_n = v;
        else
            pl->bad_arg = "fail_n";
    } else if (strcmp(key, "fail_status") == 0) {
        if (parse_u64(value, 200, 599, &v) == 0)
            pl->fail_status = (unsigned)v;
        else
            pl->bad_arg = "fail_status";
    } else if (strcmp(key, "rate") == 0) {
        if (parse_u64(value, 1, 1000000000, &v) == 0)
            pl->rate = v;
        else
            pl->bad_arg = "rate";
    } else if (strcmp(key, "retry_after") == 0) {
        if (parse_u64(value, 0, 1000000000, &v) == 0)
            pl->retry_after_s = (int64_t)v;
        else
            pl->bad_arg = "retry_after";
    } else if (strcmp(key, "bytes") == 0) {
        if (parse_u64(value, 0, BIG_MAX, &v) == 0)
            pl->body_bytes = v;
        else
            pl->bad_arg = "bytes";
    } else if (strcmp(key, "close") == 0) {
        if (parse_u64(value, 0, 1, &v) == 0)
            pl->close = v == 1;
        else
            pl->bad_arg = "close";
    }
    return MHD_YES;
}

/* One request header: keep the few we use (pointers into MHD's pool). */
static enum MHD_Result
on_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct req *rq = cls;
    (void)kind;

    if (strcasecmp(key, "webhook-id") == 0)
        rq->wh_id = value;
    else if (strcasecmp(key, "webhook-timestamp") == 0)
        rq->wh_ts = value;
    else if (strcasecmp(key, "webhook-signature") == 0)
        rq->wh_sig = value;
    else if (strcasecmp(key, "x-sluice-created-ms") == 0)
        rq->created = value;
    else if (strcasecmp(key, "content-length") == 0)
        rq->content_length = value;
    return MHD_YES;
}

/* ==== ledger and counters ==== */

/* Append ,"key":<int> or ,"key":null when s is not a decimal integer. */
static void put_num_or_null(struct sl_buf *b, const char *key, const char *s)
{
    int64_t v = 0;
    if (s != NULL && parse_i64(s, &v) == 0)
        (void)sl_buf_printf(b, ",\"%s\":%" PRId64, key, v);
    else
        (void)sl_buf_printf(b, ",\"%s\":null", key);
}

static void put_str_or_null(struct sl_buf *b, const char *key, const char *s, size_t maxlen)
{
    char esc[LEDGER_ID_MAX * 6 + 1];
    if (s == NULL) {
        (void)sl_buf_printf(b, ",\"%s\":null", key);
        return;
    }
    size_t n = strlen(s);
    if (n > maxlen)
        n = maxlen;
    sl_json_escape(esc, sizeof(esc), s, n);
    (void)sl_buf_printf(b, ",\"%s\":\"%s\"", key, esc);
}

static void ledger_line(struct req *rq, bool dup)
{
    struct app *app = rq->app;
    struct sl_buf b;
    char esc[ENDPOINT_MAX * 6 + 1];

    /* Every field is bounded, so a line always fits; the check below is belt and braces. */
    sl_buf_init(&b, LEDGER_LINE_MAX);
    sl_json_escape(esc, sizeof(esc), rq->endpoint, strlen(rq->endpoint));
    (void)sl_buf_printf(&b, "{\"ts_ms\":%" PRId64 ",\"path_kind\":\"%s\",\"endpoint\":\"%s\"",
                        rq->ts_ms, kinds[rq->plan.kind].name, esc);
    put_str_or_null(&b, "webhook_id", rq->wh_id, LEDGER_ID_MAX);
    put_num_or_null(&b, "webhook_timestamp", rq->wh_ts);
    (void)sl_buf_printf(&b, ",\"sig_ok\":%s,\"status\":%u,\"bytes\":%" PRIu64,
                        rq->sig_ok < 0 ? "null"
                        : rq->sig_ok   ? "true"
                                       : "false",
                        rq->status, rq->body_len);
    put_str_or_null(&b, "method", rq->method, 32);
    put_num_or_null(&b, "created_ms", rq->created);
    put_str_or_null(&b, "path", rq->url, LEDGER_ID_MAX);
    (void)sl_buf_printf(&b, ",\"query_keys\":%u", rq->query_keys);
    if (rq->attempt > 0)
        (void)sl_buf_printf(&b, ",\"attempt\":%" PRIu32, rq->attempt);
    else
        (void)sl_buf_printf(&b, ",\"attempt\":null");
    if (sl_buf_printf(&b, ",\"dup\":%s}\n", dup ? "true" : "false") == 0)
        recv_ledger_append(app->ledger, (const char *)b.data, b.len);
    else
        sl_warn("ledger", "ledger_line_too_long", "ledger line over %d bytes dropped",
                LEDGER_LINE_MAX);
    sl_buf_fini(&b);
}

/* The one place a request is accounted: counters, accepted ids, ledger line. */
static void record(struct req *rq, unsigned status)
{
    struct app *app = rq->app;
    bool ok2xx = status >= 200 && status < 300;
    bool dup = false;

    if (rq->recorded || rq->plan.kind == K_STATS || rq->plan.kind == K_IDS)
        return;
    rq->recorded = true;
    rq->status = status;
    stat_add(&app->st.requests, 1);
    stat_add(&app->st.by_status[status < 600 ? status : 0], 1);
    stat_add(&app->st.by_kind[rq->plan.kind], 1);
    stat_add(&app->st.bytes_in, rq->body_len);
    if (ok2xx && rq->wh_id != NULL && app->max_ids > 0) {
        dup = recv_accept_note(app->tables, rq->endpoint, rq->wh_id);
        if (dup)
            stat_add(&app->st.dups, 1);
    }
    if (app->ledger != NULL && !(ok2xx && app->no_ledger_ok))
        ledger_line(rq, dup);
}

/* ==== responses ==== */

/* Record and queue resp (NULL = creation failed: close). MHD_queue_response takes its own
 * reference, so ours is dropped here unless resp is a shared response (shared = true). */
static enum MHD_Result
queue(struct req *rq, unsigned status, struct MHD_Response *resp, bool shared)
{
    if (resp == NULL) {
        sl_error("http", "response_create_failed", "could not create a response");
        return MHD_NO;
    }
    record(rq, status);
    rq->phase = PH_ANSWERED;
    enum MHD_Result r = MHD_queue_response(rq->conn, status, resp);
    if (!shared)
        MHD_destroy_response(resp);
    return r;
}

/* Body generator for big/<bytes> and ?bytes=: a repeating printable pattern. */
static ssize_t big_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req *rq = cls;
    uint64_t left = rq->plan.body_bytes - pos;
    size_t n = left < max ? (size_t)left : max;
    if (n == 0)
        return MHD_CONTENT_READER_END_OF_STREAM;
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)('a' + (pos + i) % 26);
    return (ssize_t)n;
}

/*
 * Body generator for endless: ENDLESS_BURST bytes at once, then endless_bps. When ahead of
 * the pace it suspends itself until the next chunk is due (no busy loop, no sleeping
 * worker). pos is the number of body bytes already produced.
 */
static ssize_t endless_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req *rq = cls;
    uint64_t bps = rq->app->endless_bps;

    if (rq->wait.wake == RECV_WAKE_PEER_GONE || rq->wait.wake == RECV_WAKE_SHUTDOWN)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    int64_t now = recv_mono_ms();
    uint64_t allowed = ENDLESS_BURST + (uint64_t)(now - rq->stream_t0) * bps / 1000;
    if (pos >= allowed) {
        int64_t due = rq->stream_t0 + (int64_t)((pos + ENDLESS_CHUNK - ENDLESS_BURST) * 1000 / bps);
        if (due <= now)
            due = now + 1;
        if (recv_sched_suspend(rq->app->sched, &rq->wait, due) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        return 0;
    }
    uint64_t n = allowed - pos;
    if (n > max)
        n = max;
    if (n > ENDLESS_CHUNK)
        n = ENDLESS_CHUNK;
    memset(buf, 'e', (size_t)n);
    return (ssize_t)n;
}

static bool status_has_body(unsigned status)
{
    return status != 204 && status != 304 && status >= 200;
}

/* A response with the settled status, headers and body (default: {"status":N}). */
static enum MHD_Result respond(struct req *rq, unsigned status)
{
    struct app *app = rq->app;
    struct MHD_Response *resp;
    char small[64];
    bool plain = rq->override;
    uint64_t body = plain ? UINT64_MAX : rq->plan.body_bytes;

    if (status == 204 && rq->retry_after_s < 0 && body == UINT64_MAX)
        return queue(rq, status, rq->plan.close ? app->r204_close : app->r204, true);
    if (body != UINT64_MAX) {
        resp = MHD_create_response_from_callback(body, 64 * 1024, big_read, rq, NULL);
        if (resp)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    } else if (status_has_body(status)) {
        int n = snprintf(small, sizeof(small), "{\"status\":%u}\n", status);
        resp = MHD_create_response_from_buffer((size_t)n, small, MHD_RESPMEM_MUST_COPY);
        if (resp)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    } else {
        resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    }
    if (resp == NULL)
        return queue(rq, status, NULL, false);
    if (rq->retry_after_s >= 0) {
        char ra[24];
        snprintf(ra, sizeof(ra), "%" PRId64, rq->retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (status == 302 && rq->plan.kind == K_REDIRECT && !plain)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, REDIRECT_TARGET);
    if (rq->plan.close)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return queue(rq, status, resp, false);
}

/* An immediate plain answer for bad requests (no delay, no behaviour). */
static enum MHD_Result respond_plain(struct req *rq, unsigned status)
{
    rq->override = true;
    return respond(rq, status);
}

/* Close without any response; SO_LINGER 0 makes it a TCP RST where possible. */
static enum MHD_Result do_reset(struct req *rq)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    record(rq, 0);
    rq->phase = PH_ANSWERED;
    if (rq->wait.fd >= 0 && setsockopt(rq->wait.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) != 0)
        sl_debug(SL_DBG_HTTP, "http", "linger_failed", "could not set SO_LINGER: %s",
                 strerror(errno));
    return MHD_NO;
}

/* The settled status is known and any delay is over: act. */
static enum MHD_Result finish(struct req *rq)
{
    struct app *app = rq->app;

    if (rq->override)
        return respond(rq, rq->status);
    switch (rq->plan.action) {
    case ACT_RESET:
        return do_reset(rq);
    case ACT_HANG:
        record(rq, 0);
        rq->phase = PH_HANGING;
        if (recv_sched_suspend(app->sched, &rq->wait, RECV_DUE_NEVER) != 0)
            return MHD_NO;
        return MHD_YES;
    case ACT_ENDLESS: {
        rq->stream_t0 = recv_mono_ms();
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, ENDLESS_CHUNK, endless_read, rq, NULL);
        if (resp)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
        return queue(rq, 200, resp, false);
    }
    case ACT_RESPOND:
        break;
    }
    return respond(rq, rq->status);
}

/* ==== control endpoints ==== */

static enum MHD_Result serve_stats(struct req *rq)
{
    struct app *app = rq->app;
    struct stats *st = &app->st;
    struct sl_buf b;
    const char *sep = "";

    sl_buf_init(&b, STATS_OUT_MAX);
    (void)sl_buf_printf(
        &b,
        "{\"requests\":%" PRIu64 ",\"waiting\":%zu,\"bytes_in\":%" PRIu64 ",\"dups\":%" PRIu64
        ",\"connections\":%" PRIu64 ",\"tls_resumed\":%" PRIu64 ",\"by_status\":{",
        stat_get(&st->requests), recv_sched_waiting(app->sched), stat_get(&st->bytes_in),
        stat_get(&st->dups), stat_get(&st->connections), stat_get(&st->tls_resumed));
    for (unsigned s = 0; s < 600; s++) {
        uint64_t n = stat_get(&st->by_status[s]);
        if (n == 0)
            continue;
        (void)sl_buf_printf(&b, "%s\"%u\":%" PRIu64, sep, s, n);
        sep = ",";
    }
    (void)sl_buf_printf(&b, "},\"by_behaviour\":{");
    sep = "";
    for (int k = 0; k < K_STATS; k++) {
        uint64_t n = stat_get(&st->by_kind[k]);
        if (n == 0)
            continue;
        (void)sl_buf_printf(&b, "%s\"%s\":%" PRIu64, sep, kinds[k].name, n);
        sep = ",";
    }
    (void)sl_buf_printf(&b,
                        "},\"sig\":{\"ok\":%" PRIu64 ",\"bad\":%" PRIu64 "},"
                        "\"ids\":{\"remembered\":%" PRIu64 ",\"dropped\":%" PRIu64 "},"
                        "\"ledger\":{\"lines\":%" PRIu64 ",\"write_errors\":%" PRIu64 "}}\n",
                        stat_get(&st->sig_ok), stat_get(&st->sig_bad),
                        recv_accept_count(app->tables), recv_accept_dropped(app->tables),
                        app->ledger ? recv_ledger_lines(app->ledger) : 0,
                        app->ledger ? recv_ledger_write_errors(app->ledger) : 0);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
    sl_buf_fini(&b);
    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return queue(rq, 200, resp, false);
}

static enum MHD_Result serve_ids(struct req *rq)
{
    struct app *app = rq->app;
    struct sl_buf b;
    struct MHD_Response *resp;
    const char *ep = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "endpoint");

    sl_buf_init(&b, IDS_OUT_MAX);
    if (recv_accept_list(app->tables, ep ? ep : "", &b) != 0)
        sl_warn("http", "ids_truncated", "id list truncated at %u bytes", IDS_OUT_MAX);
    if (b.len > 0) {
        /* Hand the buffer to MHD, which free()s it (sl_buf memory is malloc'd). */
        resp = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_FREE);
        if (resp)
            b.data = NULL;
    } else {
        resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    }
    sl_buf_fini(&b);
    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain");
    return queue(rq, 200, resp, false);
}

/* ==== request flow ==== */

static struct req *
req_new(struct app *app, struct MHD_Connection *conn, const char *url, const char *method)
{
    struct req *rq = sl_xcalloc(1, sizeof(*rq));
    const union MHD_ConnectionInfo *ci;

    rq->app = app;
    rq->conn = conn;
    rq->url = url;
    rq->method = method;
    rq->ts_ms = wall_ms();
    rq->sig_ok = -1;
    rq->retry_after_s = -1;
    rq->wait.conn = conn;
    rq->wait.fd = -1;
    rq->wait.heap_idx = SIZE_MAX;
    ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci != NULL)
        rq->wait.fd = ci->connect_fd;
    rq->verify = app->nsecrets > 0;
    if (rq->verify)
        sl_buf_init(&rq->body, app->max_body);
    return rq;
}

/* First call: headers are in. Parse the plan; refuse an oversized declared body at once. */
static enum MHD_Result on_headers(struct req *rq)
{
    uint64_t cl = 0;

    plan_from_path(rq);
    (void)MHD_get_connection_values(rq->conn, MHD_HEADER_KIND, on_header, rq);
    (void)MHD_get_connection_values(rq->conn, MHD_GET_ARGUMENT_KIND, on_query, rq);
    if (rq->content_length != NULL && parse_u64(rq->content_length, 0, UINT64_MAX, &cl) == 0 &&
        cl > rq->app->max_body) {
        rq->body_too_big = true;
        rq->body_len = cl;
        return respond_plain(rq, 413); /* MHD discards the body and closes */
    }
    return MHD_YES;
}

static enum MHD_Result on_body(struct req *rq, const char *data, size_t n)
{
    uint64_t max = rq->app->max_body;

    rq->body_len += n;
    if (rq->body_len > max) {
        rq->body_too_big = true;
        if (rq->body_len / UPLOAD_GIVE_UP > max) /* do not swallow a huge upload forever */
            return do_reset(rq);
        return MHD_YES;
    }
    if (rq->verify && sl_buf_append(&rq->body, data, n) != 0)
        rq->body_too_big = true;
    return MHD_YES;
}

/* Is this attempt a flaky failure? Counts the attempt per (endpoint, id). */
static bool flaky_fails(struct req *rq)
{
    const struct plan *pl = &rq->plan;
    uint64_t key = rq->wh_id ? recv_key(rq->endpoint, rq->wh_id)
                             : recv_key(rq->endpoint, rq->url) ^ rq->fallback_key;

    rq->attempt = recv_attempt_next(rq->app->tables, key);
    if (rq->attempt <= pl->fail_n)
        return true;
    if (pl->fail_pct > 0) {
        /* Deterministic per (key, attempt): the same retry sequence fails the same way. */
        uint64_t x = key ^ ((uint64_t)rq->attempt * 0x9e3779b97f4a7c15ULL);
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 29;
        return x % 100 < pl->fail_pct;
    }
    return false;
}

/* Body complete: settle the status (checks in a fixed order), then answer or wait. */
static enum MHD_Result on_complete(struct req *rq)
{
    struct app *app = rq->app;
    const struct plan *pl = &rq->plan;

    if (pl->kind == K_STATS)
        return serve_stats(rq);
    if (pl->kind == K_IDS)
        return serve_ids(rq);
    if (rq->body_too_big)
        return respond_plain(rq, 413);
    if (pl->kind == K_UNKNOWN)
        return respond_plain(rq, 404);
    if (pl->bad_arg != NULL) {
        sl_debug(SL_DBG_HTTP, "http", "bad_argument", "invalid %s in request", pl->bad_arg);
        return respond_plain(rq, 400);
    }
    rq->status = pl->status;
    if (app->nsecrets > 0) {
        sl_err_t err;
        sl_err_clear(&err);
        int rc = sl_verify(app->secrets, app->nsecrets, rq->wh_id, rq->wh_ts, rq->wh_sig,
                           rq->body.data, rq->body.len, (int64_t)time(NULL),
                           app->tolerance_s < 0 ? INT64_MAX : app->tolerance_s, &err);
        rq->sig_ok = rc == 0;
        stat_add(rc == 0 ? &app->st.sig_ok : &app->st.sig_bad, 1);
        if (rc != 0) {
            sl_debug(SL_DBG_HTTP, "http", "signature_invalid", "signature rejected: %s", err.msg);
            if (app->reject_bad_sig) {
                rq->status = 401;
                rq->override = true;
            }
        }
    }
    if (!rq->override && pl->rate > 0 &&
        !recv_rate_take(app->tables, rq->endpoint, pl->rate, recv_mono_ms())) {
        rq->status = 429;
        rq->retry_after_s = 1;
        rq->override = true;
    }
    if (!rq->override && (pl->fail_pct > 0 || pl->fail_n > 0) && flaky_fails(rq)) {
        rq->status = pl->fail_status;
        rq->retry_after_s = pl->retry_after_s; /* e.g. fail_status=429&retry_after=2 */
        rq->override = true;
    }
    if (!rq->override)
        rq->retry_after_s = pl->retry_after_s;
    if (pl->delay_ms > 0) {
        rq->phase = PH_DELAYING;
        if (recv_sched_suspend(app->sched, &rq->wait, recv_mono_ms() + (int64_t)pl->delay_ms) !=
            0) {
            rq->phase = PH_READING;
            return respond_plain(rq, 503); /* shutting down */
        }
        return MHD_YES;
    }
    return finish(rq);
}

static enum MHD_Result on_request(void *cls,
                                  struct MHD_Connection *conn,
                                  const char *url,
                                  const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_data_size,
                                  void **con_cls)
{
    struct req *rq = *con_cls;
    (void)version;

    if (rq == NULL) {
        rq = req_new(cls, conn, url, method);
        *con_cls = rq;
        if (rq->app->tls_cert) {
            const union MHD_ConnectionInfo *ci =
                MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
            if (ci && ci->tls_session &&
                gnutls_session_is_resumed((gnutls_session_t)ci->tls_session))
                atomic_fetch_add_explicit(&rq->app->st.tls_resumed, 1, memory_order_relaxed);
        }
        return on_headers(rq);
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return on_body(rq, upload_data, n);
    }
    switch (rq->phase) {
    case PH_READING:
        return on_complete(rq);
    case PH_DELAYING:
        if (rq->wait.wake != RECV_WAKE_DUE)
            return MHD_NO; /* client gone or shutdown: on_completed records status 0 */
        return finish(rq);
    case PH_HANGING:
    case PH_ANSWERED:
        break;
    }
    return MHD_NO;
}

static void on_completed(void *cls,
                         struct MHD_Connection *conn,
                         void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct req *rq = *con_cls;
    (void)cls;
    (void)conn;
    (void)toe;

    if (rq == NULL)
        return;
    record(rq, 0); /* no-op when already recorded */
    sl_buf_fini(&rq->body);
    free(rq);
    *con_cls = NULL;
}

/*
 * libmicrohttpd's messages. Before the daemon is up they explain start-up failures (bind
 * errors) and are warnings; afterwards they are mostly the expected fallout of reset, hang
 * and clients cutting endless bodies, so they are debug (SLUICE_DEBUG=http).
 */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    const struct app *app = cls;
    char msg[512];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (n <= 0)
        return;
    size_t len = strlen(msg);
    while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        msg[--len] = '\0';
    if (atomic_load_explicit(&app->started, memory_order_relaxed))
        sl_debug(SL_DBG_HTTP, "mhd", "mhd_message", "%s", msg);
    else
        sl_warn("mhd", "mhd_message", "%s", msg);
}

/* ==== command line ==== */

static void usage(FILE *f)
{
    fputs("usage: sluice-receiver [options]\n"
          "\n"
          "Scripted HTTP receiver for Sluice tests, demos and benchmarks (libmicrohttpd).\n"
          "The first stdout line is `port=N` (flushed), so scripts can use --port 0.\n"
          "SIGTERM/SIGINT flush the ledger and exit 0. Logs are JSON lines on stderr.\n"
          "\n"
          "options:\n"
          "  --port N             listen port, 0 = ephemeral (default 0)\n"
          "  --ipv6               listen on [::1] instead of 127.0.0.1\n"
          "  --threads N          HTTP loop threads, each with its own epoll (default 2)\n"
          "  --max-conns N        connection limit (default 20000; RLIMIT_NOFILE is raised)\n"
          "  --idle-timeout-s N   close idle keep-alive connections after N s, 0 = never\n"
          "                       (default 60)\n"
          "  --max-body BYTES     request body cap; larger -> 413 (default 2097152)\n"
          "  --ledger FILE        append one JSON line per request to FILE (flushed every\n"
          "                       100 ms and at exit); absent = no ledger\n"
          "  --no-ledger-ok       no ledger lines for 2xx answers (benchmarks)\n"
          "  --secret whsec_...   verify Standard Webhooks signatures with this secret\n"
          "                       (whsec_: v1 HMAC; whsk_: v1a Ed25519, checked with its\n"
          "                       public half; repeatable, up to 8); sets sig_ok in the ledger\n"
          "  --reject-bad-sig     answer 401 when the signature is missing or wrong\n"
          "  --tolerance-s N      webhook-timestamp skew accepted, s (default 300)\n"
          "  --no-tolerance       do not check webhook-timestamp age (fixed test vectors)\n"
          "  --endless-bps N      pace of /endless, bytes/s (default 1048576)\n"
          "  --max-ids N          accepted (endpoint, webhook-id) pairs remembered for\n"
          "                       /_ledger/ids and the dup flag (default 1000000; 0 = none)\n"
          "  --tls-cert FILE      serve HTTPS with this PEM certificate (chain); needs\n"
          "                       --tls-key (libmicrohttpd's GnuTLS)\n"
          "  --tls-key FILE       the certificate's private key (PEM, unencrypted)\n"
          "  --tls-resume         issue TLS session tickets, so a client may resume its\n"
          "                       session on a new connection (default: every handshake\n"
          "                       is a full one)\n"
          "  --log-level L        error|warn|info|debug (default info; SLUICE_DEBUG=http\n"
          "                       with debug logs per-request decisions)\n"
          "  -h, --help           this text\n"
          "\n"
          "behaviours: /<behaviour>[/<arg>][/<endpoint>[/...]]\n"
          "  ok                   204 (?status=200: 200 with a tiny JSON body)\n"
          "  status/<code>        answer <code> (200..599)\n"
          "  slow/<ms>            wait <ms> then 200; the wait suspends the connection and\n"
          "                       never blocks a worker, so other requests are unaffected\n"
          "  flaky/<pct>          500 on pct% of attempts, decided by a hash of (endpoint,\n"
          "                       webhook-id, attempt number seen here): deterministic, and\n"
          "                       retries eventually succeed (unless pct is 100)\n"
          "  flaky_n/<N>          500 on the first N attempts of each (endpoint, webhook-id)\n"
          "  ratelimit/<per_s>    token bucket per endpoint (burst = per_s); over it:\n"
          "                       429 with Retry-After: 1\n"
          "  retryafter/<s>       429 with Retry-After: <s>\n"
          "  unauth               401\n"
          "  gone                 410\n"
          "  redirect             302 Location: " REDIRECT_TARGET "\n"
          "  reset                close the connection without a response (TCP RST)\n"
          "  endless              200 with a chunked body that never ends (~--endless-bps)\n"
          "  big/<bytes>          200 with a body of <bytes> bytes (streamed)\n"
          "  hang                 never answer (closed when the client leaves or at exit)\n"
          "  anything else        404\n"
          "  Without webhook-id, flaky keys on the path and query instead.\n"
          "\n"
          "query parameters (any behaviour; invalid values -> 400):\n"
          "  ep=NAME              endpoint name (default: the segment after the behaviour)\n"
          "  status=CODE          status of the normal answer\n"
          "  delay_ms=MS          wait before answering (also before failures)\n"
          "  fail_pct=P fail_n=N  add flaky failures; fail_status=CODE (default 500)\n"
          "  rate=PER_S           add a token bucket\n"
          "  retry_after=S        add Retry-After: S\n"
          "  bytes=N              body of N bytes instead of the default\n"
          "  close=1              answer with Connection: close (the next request needs a\n"
          "                       new connection, and a new TLS handshake over HTTPS)\n"
          "  Order of checks: 413 body too big, 400 bad argument, 401 bad signature (with\n"
          "  --reject-bad-sig), 429 rate limit, flaky failure, then the behaviour.\n"
          "\n"
          "control (never in the ledger or the counters):\n"
          "  GET /_stats                   JSON counters: requests, connections (accepted),\n"
          "                                tls_resumed (requests over a resumed session),\n"
          "                                by_status, by_behaviour,\n"
          "                                waiting (suspended), sig, ids, ledger, dups\n"
          "  GET /_ledger/ids?endpoint=X   distinct webhook ids answered 2xx for endpoint X\n"
          "                                (\"\" when omitted), one per line\n"
          "\n"
          "ledger line (one per request; status 0 = no response was sent):\n"
          "  {\"ts_ms\":<arrival unix ms>,\"path_kind\":\"ok\",\"endpoint\":\"ep1\",\n"
          "   \"webhook_id\":\"msg_..\"|null,\"webhook_timestamp\":<int>|null,\n"
          "   \"sig_ok\":true|false|null,\"status\":204,\"bytes\":<body bytes>,\n"
          "   \"method\":\"POST\",\"created_ms\":<x-sluice-created-ms>|null,\n"
          "   \"path\":\"/ok/ep1\" (never the query string),\"query_keys\":<n>,\n"
          "   \"attempt\":<flaky attempt n>|null,\"dup\":<2xx for an id already accepted>}\n"
          "  Bodies and signature header values are never written.\n"
          "\n"
          "exit status: 0 after SIGTERM/SIGINT, 78 bad options, 1 could not start\n",
          f);
}

enum {
    OPT_PORT = 256,
    OPT_IPV6,
    OPT_THREADS,
    OPT_MAX_CONNS,
    OPT_IDLE,
    OPT_MAX_BODY,
    OPT_LEDGER,
    OPT_NO_LEDGER_OK,
    OPT_SECRET,
    OPT_REJECT,
    OPT_TOLERANCE,
    OPT_NO_TOLERANCE,
    OPT_ENDLESS_BPS,
    OPT_MAX_IDS,
    OPT_LOG_LEVEL,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_RESUME,
};

/* Parse a numeric option; on failure print a message naming the option (values of numeric
 * options are not secret) and count the error. */
static uint64_t num_opt(const char *name, const char *val, uint64_t min, uint64_t max, int *errors)
{
    uint64_t v = 0;
    if (parse_u64(val, min, max, &v) != 0) {
        fprintf(stderr,
                "sluice-receiver: invalid value for --%s: \"%s\": expected an integer "
                "in %" PRIu64 "..%" PRIu64 "\n",
                name, val, min, max);
        (*errors)++;
    }
    return v;
}

/* The whole text of a PEM file named by option `name`, or NULL after printing why and
 * counting the error. */
static char *read_pem_opt(const char *name, const char *path, int *errors)
{
    FILE *f = fopen(path, "rb");
    struct sl_buf b;
    char chunk[4096];
    size_t n = 0;
    int rc = 0;
    if (f == NULL) {
        fprintf(stderr, "sluice-receiver: cannot read --%s \"%s\": %s\n", name, path,
                strerror(errno));
        (*errors)++;
        return NULL;
    }
    sl_buf_init(&b, 1024 * 1024);
    while (rc == 0 && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        rc = sl_buf_append(&b, chunk, n);
    bool bad = rc != 0 || ferror(f) || b.len == 0 || !strstr((const char *)b.data, "-----BEGIN ");
    fclose(f);
    if (bad) {
        fprintf(stderr, "sluice-receiver: --%s \"%s\" is not a PEM file of at most 1 MiB\n", name,
                path);
        (*errors)++;
        sl_buf_fini(&b);
        return NULL;
    }
    return (char *)b.data; /* NUL-terminated, as libmicrohttpd takes it */
}

/* Returns 0, or SL_CFG_EXIT after printing every problem, or -1 for --help (exit 0). */
static int parse_args(struct app *app, int argc, char **argv, enum sl_log_level *level)
{
    static const struct option longopts[] = {
        {"port", required_argument, NULL, OPT_PORT},
        {"ipv6", no_argument, NULL, OPT_IPV6},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"max-conns", required_argument, NULL, OPT_MAX_CONNS},
        {"idle-timeout-s", required_argument, NULL, OPT_IDLE},
        {"max-body", required_argument, NULL, OPT_MAX_BODY},
        {"ledger", required_argument, NULL, OPT_LEDGER},
        {"no-ledger-ok", no_argument, NULL, OPT_NO_LEDGER_OK},
        {"secret", required_argument, NULL, OPT_SECRET},
        {"reject-bad-sig", no_argument, NULL, OPT_REJECT},
        {"tolerance-s", required_argument, NULL, OPT_TOLERANCE},
        {"no-tolerance", no_argument, NULL, OPT_NO_TOLERANCE},
        {"endless-bps", required_argument, NULL, OPT_ENDLESS_BPS},
        {"max-ids", required_argument, NULL, OPT_MAX_IDS},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
        {"tls-key", required_argument, NULL, OPT_TLS_KEY},
        {"tls-resume", no_argument, NULL, OPT_TLS_RESUME},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int errors = 0, c;
    bool no_tolerance = false;

    app->threads = 2;
    app->max_conns = 20000;
    app->idle_timeout_s = 60;
    app->max_body = 2 * 1024 * 1024;
    app->tolerance_s = 300;
    app->endless_bps = 1024 * 1024;
    app->max_ids = 1000000;
    *level = SL_LOG_INFO;
    opterr = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_PORT:
            app->port = (uint16_t)num_opt("port", optarg, 0, 65535, &errors);
            break;
        case OPT_IPV6:
            app->ipv6 = true;
            break;
        case OPT_THREADS:
            app->threads = (unsigned)num_opt("threads", optarg, 1, 64, &errors);
            break;
        case OPT_MAX_CONNS:
            app->max_conns = (unsigned)num_opt("max-conns", optarg, 1, 1000000, &errors);
            break;
        case OPT_IDLE:
            app->idle_timeout_s = (unsigned)num_opt("idle-timeout-s", optarg, 0, 86400, &errors);
            break;
        case OPT_MAX_BODY:
            app->max_body = num_opt("max-body", optarg, 0, 1024ULL * 1024 * 1024, &errors);
            break;
        case OPT_LEDGER:
            app->ledger_path = optarg;
            break;
        case OPT_NO_LEDGER_OK:
            app->no_ledger_ok = true;
            break;
        case OPT_SECRET: {
            sl_err_t err;
            if (app->nsecrets == SL_SIGNER_MAX_SECRETS) {
                fprintf(stderr, "sluice-receiver: more than %d --secret options\n",
                        SL_SIGNER_MAX_SECRETS);
                errors++;
                break;
            }
            sl_log_add_secret(optarg);
            if (sl_secret_parse(&app->secrets[app->nsecrets], optarg, &err) != 0) {
                /* never echo the value */
                fprintf(stderr, "sluice-receiver: invalid value for --secret: %s\n", err.msg);
                errors++;
                break;
            }
            app->nsecrets++;
            break;
        }
        case OPT_REJECT:
            app->reject_bad_sig = true;
            break;
        case OPT_TOLERANCE:
            app->tolerance_s = (int64_t)num_opt("tolerance-s", optarg, 0, 1000000000, &errors);
            break;
        case OPT_NO_TOLERANCE:
            no_tolerance = true;
            break;
        case OPT_ENDLESS_BPS:
            app->endless_bps = num_opt("endless-bps", optarg, 1, 1000000000, &errors);
            break;
        case OPT_MAX_IDS:
            app->max_ids = num_opt("max-ids", optarg, 0, 100000000, &errors);
            break;
        case OPT_LOG_LEVEL:
            if (sl_log_level_parse(optarg, level) != 0) {
                fprintf(stderr,
                        "sluice-receiver: invalid value for --log-level: \"%s\": "
                        "expected error|warn|info|debug\n",
                        optarg);
                errors++;
            }
            break;
        case OPT_TLS_CERT:
            free(app->tls_cert);
            app->tls_cert = read_pem_opt("tls-cert", optarg, &errors);
            break;
        case OPT_TLS_RESUME:
            app->tls_resume = true;
            break;
        case OPT_TLS_KEY:
            free(app->tls_key);
            app->tls_key = read_pem_opt("tls-key", optarg, &errors);
            break;
        case 'h':
            usage(stdout);
            return -1;
        default: /* getopt printed the problem */
            errors++;
            break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sluice-receiver: unexpected argument \"%s\"\n", argv[optind]);
        errors++;
    }
    if (no_tolerance)
        app->tolerance_s = -1;
    if ((app->tls_cert == NULL) != (app->tls_key == NULL)) {
        fprintf(stderr, "sluice-receiver: --tls-cert and --tls-key go together\n");
        errors++;
    }
    if (app->tls_resume && app->tls_cert == NULL) {
        fprintf(stderr, "sluice-receiver: --tls-resume needs --tls-cert and --tls-key\n");
        errors++;
    }
    if (app->reject_bad_sig && app->nsecrets == 0) {
        fprintf(stderr, "sluice-receiver: --reject-bad-sig needs at least one --secret\n");
        errors++;
    }
    if (errors > 0) {
        fprintf(stderr, "sluice-receiver: %d invalid option(s); see --help\n", errors);
        return SL_CFG_EXIT;
    }
    return 0;
}

/* ==== start-up and shutdown ==== */

/* Counts each accepted connection for /_stats (on the loop that accepted it) and, with
 * --tls-resume, lets its TLS session issue tickets: the session exists by now, its handshake
 * has not begun. */
static void on_connection(void *cls,
                          struct MHD_Connection *conn,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct app *app = cls;
    (void)socket_context;
    if (toe != MHD_CONNECTION_NOTIFY_STARTED)
        return;
    atomic_fetch_add_explicit(&app->st.connections, 1, memory_order_relaxed);
    if (app->tls_resume) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        if (ci && ci->tls_session)
            (void)gnutls_session_ticket_enable_server((gnutls_session_t)ci->tls_session,
                                                      &app->ticket_key);
    }
}

/* Listen on loopback: app->threads HTTP loops (common/sl_httpd) on one socket. */
static sl_httpd_t *start_server(struct app *app, sl_err_t *err)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (app->ipv6) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(app->port);
        sin6->sin6_addr = in6addr_loopback;
    } else {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(app->port);
        sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    char what[64];
    (void)snprintf(what, sizeof(what), "%s port %u", app->ipv6 ? "[::1]" : "127.0.0.1",
                   (unsigned)app->port);
    struct sl_httpd_opts o = {0};
    o.addr = &ss;
    o.what = what;
    o.threads = app->threads;
    o.max_conns = app->max_conns;
    o.idle_timeout_s = app->idle_timeout_s;
    o.backlog = 4096;
    o.thread_name = "recv-http";
    o.on_request = on_request;
    o.request_cls = app;
    o.on_completed = on_completed;
    o.completed_cls = app;
    o.on_connection = on_connection;
    o.connection_cls = app;
    o.log = mhd_log;
    o.log_cls = app;
    o.tls_cert_pem = app->tls_cert;
    o.tls_key_pem = app->tls_key;
    return sl_httpd_start(&o, err);
}

int main(int argc, char **argv)
{
    static struct app app; /* large (stats); static storage, zeroed */
    enum sl_log_level level = SL_LOG_INFO;
    sl_httpd_t *srv = NULL;
    sigset_t sigs;
    sl_err_t err;
    int rc = 1, sig = 0;

    sl_log_init("sluice-receiver", SL_LOG_INFO, 0);
    int pr = parse_args(&app, argc, argv, &level);
    if (pr != 0) {
        rc = pr < 0 ? 0 : pr;
        goto out;
    }
    sl_log_init("sluice-receiver", level, level == SL_LOG_DEBUG ? SL_DBG_ALL : 0);

    /* Block the stop signals before any thread exists, so only sigwait() sees them. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    (void)signal(SIGPIPE, SIG_IGN);
    (void)sl_nofile_ensure((uint64_t)app.max_conns + SL_NOFILE_RESERVE, "main", "--max-conns",
                           app.max_conns);

    app.tables = recv_tables_new((size_t)app.max_ids);
    if (recv_sched_new(&app.sched, &err) != 0) {
        sl_error("main", "start_failed", "%s", err.msg);
        goto out;
    }
    if (app.ledger_path != NULL && recv_ledger_open(app.ledger_path, &app.ledger, &err) != 0) {
        sl_error("main", "start_failed", "%s", err.msg);
        goto out;
    }
    app.r204 = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    app.r204_close = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (app.r204_close)
        MHD_add_response_header(app.r204_close, MHD_HTTP_HEADER_CONNECTION, "close");
    if (app.r204 == NULL || app.r204_close == NULL) {
        sl_error("main", "start_failed", "could not create the empty answer");
        goto out;
    }
    if (app.tls_resume && gnutls_session_ticket_key_generate(&app.ticket_key) != 0) {
        sl_error("main", "start_failed", "could not make a TLS session ticket key");
        goto out;
    }
    srv = start_server(&app, &err);
    if (srv == NULL) {
        sl_error("main", "start_failed", "%s", err.msg);
        goto out;
    }
    unsigned port = sl_httpd_port(srv);
    atomic_store(&app.started, true);
    printf("port=%u\n", port);
    fflush(stdout);
    SL_LOGKV(SL_LOG_INFO, "main", "receiver_listening",
             ((struct sl_log_kv[]){SL_KV_I("port", port), SL_KV_I("threads", app.threads),
                                   SL_KV_I("secrets", app.nsecrets)}),
             "listening on %s", app.ipv6 ? "[::1]" : "127.0.0.1");

    while (sigwait(&sigs, &sig) != 0 || (sig != SIGTERM && sig != SIGINT))
        ;
    sl_info("main", "receiver_stopping", "stopping on signal %d", sig);
    rc = 0;

out:
    if (srv != NULL) {
        /* MHD's order: no new connections, no suspended ones, then stop. */
        sl_httpd_quiesce(srv);
        if (app.sched)
            recv_sched_stop(app.sched);
        sl_httpd_stop(srv);
    }
    recv_sched_destroy(app.sched);
    if (app.r204)
        MHD_destroy_response(app.r204);
    if (app.r204_close)
        MHD_destroy_response(app.r204_close);
    if (app.tls_key)
        sl_secret_wipe(app.tls_key, strlen(app.tls_key));
    if (app.ticket_key.data) {
        sl_secret_wipe(app.ticket_key.data, app.ticket_key.size);
        gnutls_free(app.ticket_key.data);
    }
    free(app.tls_key);
    free(app.tls_cert);
    recv_ledger_close(app.ledger);
    recv_tables_destroy(app.tables);
    for (size_t i = 0; i < app.nsecrets; i++)
        sl_secret_fini(&app.secrets[i]);
    sl_log_clear_secrets();
    return rc;
}
