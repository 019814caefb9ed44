/*
 * api_metrics: sluice-api's metrics (docs/METRICS.md) and its readiness, shared by GET /readyz
 * on the API's listener and /readyz on the metrics listener.
 *
 * Requests are counted by route name and status code. The series of a (route, code) pair is
 * registered the first time it is answered and then found without a lock: routes are the
 * static names of the routing table (compared by pointer), codes index an array of atomic
 * pointers.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "common/sl_httpd.h"
#include "common/sl_metrics.h"
#include "common/sl_probe.h"

#define MAX_ROUTES 64 /* routes of the table, plus "other" */

struct route_m {
    _Atomic(const char *) name;        /* the route's name (static string); NULL = free */
    _Atomic(sl_counter_t *) code[500]; /* by status 100..599 */
    _Atomic(sl_histo_t *) duration;    /* request duration */
};

static struct route_m g_routes[MAX_ROUTES];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static sl_counter_t *g_published;
static struct api *g_api;

static const char REQ_HELP[] = "Answered requests by route and status code.";
static const char DUR_HELP[] =
    "From a request's first byte to its answer, seconds (a publish includes Kafka's "
    "acknowledgement).";

static void collect(struct sl_buf *out, void *arg)
{
    (void)arg;
    sl_metrics_write_head(out, "sluice_api_producer_queue_messages", "gauge",
                          "Published records not yet acknowledged by Kafka.");
    sl_metrics_write_sample(out, "sluice_api_producer_queue_messages", NULL,
                            g_api && g_api->prod ? (double)sluice_producer_outstanding(g_api->prod)
                                                 : 0.0);
    struct sl_httpd *h = g_api ? atomic_load(&g_api->httpd) : NULL;
    sl_metrics_write_head(out, "sluice_api_request_timeouts_total", "counter",
                          "Connections closed for not sending a whole request within "
                          "api_request_timeout_s (slow or stalled clients).");
    sl_metrics_write_sample(out, "sluice_api_request_timeouts_total", NULL,
                            h ? (double)sl_httpd_timed_out(h) : 0.0);
}

void api_metrics_init(struct api *a)
{
    g_api = a;
    sl_metrics_set_process("sluice-api");
    g_published = sl_metric_counter(
        "sluice_api_events_published_total",
        "Events acknowledged by Kafka (one per event, whatever its fan-out).", NULL);
    sl_metrics_collector(collect, NULL);
}

static struct route_m *route_slot(const char *name)
{
    for (int i = 0; i < MAX_ROUTES; i++) {
        const char *n = atomic_load_explicit(&g_routes[i].name, memory_order_acquire);
        if (n == name)
            return &g_routes[i];
        if (!n)
            break;
    }
    pthread_mutex_lock(&g_mu);
    struct route_m *slot = NULL;
    for (int i = 0; i < MAX_ROUTES && !slot; i++) {
        const char *n = atomic_load(&g_routes[i].name);
        if (n == name) {
            slot = &g_routes[i];
        } else if (!n) {
            char labels[128];
            (void)snprintf(labels, sizeof(labels), "route=\"%s\"", name);
            atomic_store(&g_routes[i].duration,
                         sl_metric_histo("sluice_api_request_duration_seconds", DUR_HELP, labels));
            atomic_store_explicit(&g_routes[i].name, name, memory_order_release);
            slot = &g_routes[i];
        }
    }
    pthread_mutex_unlock(&g_mu);
    return slot; /* NULL only past MAX_ROUTES names: not counted */
}

void api_metrics_answer(const char *route, int status, int64_t us)
{
    struct route_m *s = route_slot(route ? route : "other");
    if (!s)
        return;
    sl_histo_observe_us(atomic_load_explicit(&s->duration, memory_order_relaxed), us);
    if (status < 100 || status > 599)
        return;
    sl_counter_t *c = atomic_load_explicit(&s->code[status - 100], memory_order_acquire);
    if (!c) {
        char labels[160];
        (void)snprintf(labels, sizeof(labels), "route=\"%s\",code=\"%d\"", route ? route : "other",
                       status);
        c = sl_metric_counter("sluice_api_requests_total", REQ_HELP, labels);
        atomic_store_explicit(&s->code[status - 100], c, memory_order_release);
    }
    sl_counter_inc(c);
}

void api_metrics_published(size_t n)
{
    sl_counter_add(g_published, n);
}

bool api_ready(struct api *a, struct sl_buf *checks)
{
    bool stopping = atomic_load(&a->stopping);
    bool keys = api_keys_loaded(a->keys);
    bool fatal = a->prod && sluice_producer_fatal(a->prod, NULL) != 0;
    bool producer = a->prod && !fatal;
    if (checks) {
        sl_probe_check(checks, "stopping", stopping ? "yes" : "no");
        sl_probe_check(checks, "api_keys", keys ? "loaded" : "loading");
        sl_probe_check(checks, "producer", producer ? "ok" : "failed");
    }
    return !stopping && keys && producer;
}
