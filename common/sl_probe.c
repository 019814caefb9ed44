/*
 * sl_probe: /metrics, /healthz and /readyz on the metrics listener (see sl_probe.h).
 *
 * libmicrohttpd with its own polling thread (MHD_USE_INTERNAL_POLLING_THREAD, poll), one
 * request at a time: scrapes and probes are rare and small. Heartbeat slots are a fixed
 * array of atomics, so stamping one costs a store on the loop's turn.
 */
#include "common/sl_probe.h"

#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "common/sl_log.h"
#include "common/sl_metrics.h"
#include "common/sl_time.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_RESULT;
#else
typedef enum MHD_Result MHD_RESULT;
#endif

#define METRICS_MAX_BYTES (64u << 20) /* a body past this is an error, not a scrape */

struct sl_probe {
    struct MHD_Daemon *d;
    int64_t stall_ms;
    sl_probe_ready_fn ready;
    void *arg;
    sl_counter_t *scrapes;
};

/* ==== Heartbeats ==== */

struct beat {
    _Atomic int64_t at; /* last stamp (mono ms); 0 = slot free */
    char name[32];
};
static struct beat g_beats[SL_PROBE_MAX_BEATS];
static pthread_mutex_t g_beats_mu = PTHREAD_MUTEX_INITIALIZER;

int sl_probe_beat_register(const char *name)
{
    pthread_mutex_lock(&g_beats_mu);
    int slot = -1;
    for (int i = 0; i < SL_PROBE_MAX_BEATS; i++) {
        if (atomic_load(&g_beats[i].at) == 0) {
            (void)snprintf(g_beats[i].name, sizeof(g_beats[i].name), "%s", name);
            atomic_store(&g_beats[i].at, sl_mono_ms());
            slot = i;
            break;
        }
    }
    pthread_mutex_unlock(&g_beats_mu);
    return slot;
}

void sl_probe_beat(int slot, int64_t now_mono_ms)
{
    if (slot >= 0 && slot < SL_PROBE_MAX_BEATS)
        atomic_store_explicit(&g_beats[slot].at, now_mono_ms > 0 ? now_mono_ms : 1,
                              memory_order_relaxed);
}

void sl_probe_beat_release(int slot)
{
    if (slot >= 0 && slot < SL_PROBE_MAX_BEATS)
        atomic_store(&g_beats[slot].at, 0);
}

bool sl_probe_live(int64_t now_mono_ms, int64_t stall_ms, char *name, size_t name_size)
{
    pthread_mutex_lock(&g_beats_mu);
    bool live = true;
    for (int i = 0; i < SL_PROBE_MAX_BEATS && live; i++) {
        int64_t at = atomic_load_explicit(&g_beats[i].at, memory_order_relaxed);
        if (at != 0 && now_mono_ms - at > stall_ms) {
            live = false;
            if (name && name_size)
                (void)snprintf(name, name_size, "%s", g_beats[i].name);
        }
    }
    pthread_mutex_unlock(&g_beats_mu);
    return live;
}

/* ==== Listener ==== */

void sl_probe_check(struct sl_buf *checks, const char *name, const char *state)
{
    sl_buf_printf(checks, "%s\"%s\":\"%s\"", checks->len ? "," : "", name, state);
}

int sl_listen_addr(const char *s, const char *what, struct sockaddr_storage *ss, sl_err_t *err)
{
    char host[256];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return sl_err_set(err, SL_ECONFIG, "%s must be host:port", what);
    size_t hl = (size_t)(colon - s);
    if (s[0] == '[' && hl >= 2 && s[hl - 1] == ']') {
        s++;
        hl -= 2;
    }
    if (hl >= sizeof(host))
        return sl_err_set(err, SL_ECONFIG, "%s host is too long", what);
    memcpy(host, s, hl);
    host[hl] = '\0';
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai != 0)
        return sl_err_set(err, SL_ECONFIG, "cannot resolve %s: %s", what, gai_strerror(gai));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

static MHD_RESULT
answer(struct MHD_Connection *c, unsigned status, const char *type, struct sl_buf *body)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        body->len, body->len ? body->data : (void *)"", MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_RESULT rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static MHD_RESULT on_request(void *cls,
                             struct MHD_Connection *c,
                             const char *url,
                             const char *method,
                             const char *version,
                             const char *upload_data,
                             size_t *upload_size,
                             void **req)
{
    (void)version;
    (void)upload_data;
    struct sl_probe *p = cls;
    if (!*req) { /* first call: headers only */
        *req = (void *)1;
        return MHD_YES;
    }
    if (*upload_size) { /* a body is ignored */
        *upload_size = 0;
        return MHD_YES;
    }
    struct sl_buf body;
    sl_buf_init(&body, METRICS_MAX_BYTES);
    MHD_RESULT rc;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (get && strcmp(url, "/metrics") == 0) {
        sl_counter_inc(p->scrapes);
        if (sl_metrics_render(&body) == 0) {
            rc = answer(c, 200, "text/plain; version=0.0.4; charset=utf-8", &body);
        } else {
            sl_buf_reset(&body);
            sl_buf_append_str(&body, "metrics exposition too large\n");
            rc = answer(c, 500, "text/plain; charset=utf-8", &body);
        }
    } else if (get && strcmp(url, "/healthz") == 0) {
        char stalled[32] = "";
        bool live = sl_probe_live(sl_mono_ms(), p->stall_ms, stalled, sizeof(stalled));
        if (live)
            sl_buf_append_str(&body, "{\"live\":true}\n");
        else
            sl_buf_printf(&body, "{\"live\":false,\"stalled\":\"%s\"}\n", stalled);
        rc = answer(c, live ? 200 : 503, "application/json", &body);
    } else if (get && strcmp(url, "/readyz") == 0) {
        struct sl_buf checks;
        sl_buf_init(&checks, 4096);
        bool ready = p->ready ? p->ready(p->arg, &checks) : true;
        sl_buf_printf(&body, "{\"ready\":%s,\"checks\":{%s}}\n", ready ? "true" : "false",
                      checks.len ? (const char *)checks.data : "");
        sl_buf_fini(&checks);
        rc = answer(c, ready ? 200 : 503, "application/json", &body);
    } else if (!get) {
        sl_buf_append_str(&body, "method not allowed\n");
        rc = answer(c, 405, "text/plain; charset=utf-8", &body);
    } else {
        sl_buf_append_str(&body, "not found: /metrics, /healthz, /readyz\n");
        rc = answer(c, 404, "text/plain; charset=utf-8", &body);
    }
    sl_buf_fini(&body);
    return rc;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[256];
    (void)vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    sl_debug(SL_DBG_HTTP, "metrics", "mhd", "%s", msg);
}

sl_probe_t *sl_probe_start(const char *listen,
                           const char *what,
                           int64_t stall_ms,
                           sl_probe_ready_fn ready,
                           void *arg,
                           sl_err_t *err)
{
    struct sockaddr_storage ss;
    if (sl_listen_addr(listen, what, &ss, err) != 0)
        return NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct sl_probe *p = sl_xcalloc(1, sizeof(*p));
    p->stall_ms = stall_ms;
    p->ready = ready;
    p->arg = arg;
    p->scrapes = sl_metric_counter("sluice_metrics_scrapes_total",
                                   "Scrapes of /metrics answered by this process.", NULL);
    /* the logger goes first: libmicrohttpd logs what the options before it say on stderr,
     * outside the JSON log (and notes that the logger was not first) */
    p->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, p, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!p->d) {
        free(p);
        sl_err_set(err, SL_EIO, "could not listen on %s for %s (address in use or not available)",
                   listen, what);
        return NULL;
    }
    return p;
}

void sl_probe_stop(sl_probe_t *p)
{
    if (!p)
        return;
    MHD_stop_daemon(p->d);
    free(p);
}
