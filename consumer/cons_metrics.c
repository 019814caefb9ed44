/*
 * cons_metrics: registration of sluice-consumer's series and its collectors (see
 * cons_metrics.h; names and meanings in docs/METRICS.md).
 */
#include "consumer/cons_metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "consumer/cons_classify.h"

struct cons_metrics cons_m;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_inited;
static int64_t g_top;       /* metrics_endpoint_top */
static sl_map_t *g_eps;     /* endpoint id -> struct cons_ep_metrics (g_top > 0) */
static sl_map_t *g_open;    /* endpoint id -> loops that see its breaker open (intptr_t) */
static rd_kafka_t **g_prod; /* outcome producers */
static size_t g_nprod, g_cap_prod;

static const char *const OUTCOME[CONS_M_NOUTCOME] = {"delivered", "retry", "dead_letter"};
static const char *const CLASS[CONS_M_NCLASS] = {"none", "1xx", "2xx", "3xx", "4xx", "5xx"};
static const char *const ERROR[] = {CONS_CLASSES};
_Static_assert(sizeof(ERROR) / sizeof(ERROR[0]) == CONS_M_NERROR, "CONS_M_NERROR");

static void collect_outq(struct sl_buf *out, void *arg);
static void collect_endpoints(struct sl_buf *out, void *arg);

void cons_metrics_init(int64_t endpoint_top)
{
    pthread_mutex_lock(&g_mu);
    bool first = !g_inited;
    g_inited = true;
    g_top = endpoint_top;
    if (first) {
        g_open = sl_map_new(16);
        if (endpoint_top > 0)
            g_eps = sl_map_new(256);
    }
    pthread_mutex_unlock(&g_mu);
    if (!first)
        return;
    sl_metrics_set_process("sluice-consumer");
    struct cons_metrics *m = &cons_m;
    m->received = sl_metric_counter("sluice_records_received_total",
                                    "Delivery records taken from Kafka.", NULL);
    m->claimed = sl_metric_counter("sluice_retry_jobs_claimed_total",
                                   "Jobs claimed from the Redis retry schedule.", NULL);
    m->attempts =
        sl_metric_counter("sluice_attempts_total", "HTTP requests sent (probes included).", NULL);
    static const char DHELP[] = "Finished HTTP attempts by what they led to.";
    for (int o = 0; o < CONS_M_NOUTCOME; o++) {
        for (int c = 0; c < CONS_M_NCLASS; c++) {
            char labels[64];
            (void)snprintf(labels, sizeof(labels), "outcome=\"%s\",status_class=\"%s\"", OUTCOME[o],
                           CLASS[c]);
            m->deliveries[o][c] = sl_metric_counter("sluice_deliveries_total", DHELP, labels);
        }
    }
    static const char FHELP[] =
        "Failed HTTP attempts by error class (the outcome's err): timeouts, connection and "
        "TLS failures, refusals by the SSRF rules or the delivery proxy, HTTP status classes.";
    for (int c = 0; c < CONS_M_NERROR; c++) {
        char labels[64];
        (void)snprintf(labels, sizeof(labels), "class=\"%s\"", ERROR[c]);
        m->failures[c] = sl_metric_counter("sluice_attempt_failures_total", FHELP, labels);
    }
    m->retries = sl_metric_counter("sluice_retries_scheduled_total",
                                   "Retries written to the Redis schedule.", NULL);
    m->dead =
        sl_metric_counter("sluice_dead_letters_total", "Deliveries given up (every cause).", NULL);
    m->duplicates =
        sl_metric_counter("sluice_duplicates_suppressed_total",
                          "Records skipped: the delivered marker was already there.", NULL);
    m->quarantined =
        sl_metric_counter("sluice_quarantined_total",
                          "Records that could not be used (bad bytes, unknown endpoint).", NULL);
    m->brk_deferrals = sl_metric_counter(
        "sluice_breaker_deferrals_total",
        "Deliveries moved to the schedule because the breaker is open (no attempt spent).", NULL);
    m->spills = sl_metric_counter("sluice_backlog_spills_total",
                                  "Deliveries moved to the schedule by the backlog bound.", NULL);
    static const char RHELP[] = "Pauses of an endpoint's sending.";
    m->rate_limited =
        sl_metric_counter("sluice_rate_limited_total", RHELP, "reason=\"rate_limit\"");
    m->throttled = sl_metric_counter("sluice_rate_limited_total", RHELP, "reason=\"throttled\"");
    static const char BHELP[] = "Breaker state changes this process saw.";
    m->brk_to_open = sl_metric_counter("sluice_breaker_transitions_total", BHELP, "to=\"open\"");
    m->brk_to_half_open =
        sl_metric_counter("sluice_breaker_transitions_total", BHELP, "to=\"half_open\"");
    m->brk_to_closed =
        sl_metric_counter("sluice_breaker_transitions_total", BHELP, "to=\"closed\"");
    m->brk_open = sl_metric_gauge("sluice_breaker_open_endpoints",
                                  "Endpoints whose breaker this process sees open.", NULL);
    m->inflight = sl_metric_gauge("sluice_inflight_requests", "HTTP requests running.", NULL);
    m->inflight_limit = sl_metric_gauge(
        "sluice_inflight_limit",
        "Cap on HTTP requests running, summed over the delivery loops: their shares of "
        "max_inflight, lowered while a loop is saturated (adaptive_inflight).",
        NULL);
    m->queued = sl_metric_gauge(
        "sluice_queued_jobs",
        "Deliveries in memory without a request running (waiting for a slot, a Redis write or "
        "Kafka's acknowledgement).",
        NULL);
    m->records_held = sl_metric_gauge(
        "sluice_records_held",
        "Records for Kafka (outcomes, quarantined records) it has not taken yet, held and "
        "produced again; their deliveries' offsets stay open meanwhile.",
        NULL);
    m->redis_errors =
        sl_metric_counter("sluice_redis_errors_total", "Redis calls that failed.", NULL);
    m->redis_state_lost = sl_metric_counter(
        "sluice_redis_state_lost_total",
        "Times the Redis database was found without its binding (sluice:owner) or some of "
        "its witnesses (sluice:owner:{...}) while running: emptied or replaced, in whole or "
        "on a cluster master, its retry schedule, breakers and markers possibly lost.",
        NULL);
    m->publish_to_delivered =
        sl_metric_histo("sluice_publish_to_delivered_seconds",
                        "From the event's creation to its 2xx answer, seconds.", NULL);
    static const char SHELP[] =
        "Where a first attempt from Kafka waited before its request started, seconds: kafka "
        "from the event's creation until a delivery loop took its record (the publisher's "
        "batching, the broker, the fetch and the loop's pre-fetch queue), queue from then "
        "until its request started (the duplicate check, the endpoint's queue, its rate and "
        "in-flight limits). For a first attempt answered 2xx, the two and "
        "sluice_http_phase_seconds{phase=\"total\"} add up to its "
        "sluice_publish_to_delivered_seconds.";
    m->stage_kafka = sl_metric_histo("sluice_delivery_wait_seconds", SHELP, "stage=\"kafka\"");
    m->stage_queue = sl_metric_histo("sluice_delivery_wait_seconds", SHELP, "stage=\"queue\"");
    static const char PHELP[] =
        "HTTP request phases: connect and tls are the durations of a new connection's TCP and "
        "TLS set-up, first_byte and total count from the request's start.";
    m->phase_connect = sl_metric_histo("sluice_http_phase_seconds", PHELP, "phase=\"connect\"");
    m->phase_tls = sl_metric_histo("sluice_http_phase_seconds", PHELP, "phase=\"tls\"");
    m->phase_first_byte =
        sl_metric_histo("sluice_http_phase_seconds", PHELP, "phase=\"first_byte\"");
    m->phase_total = sl_metric_histo("sluice_http_phase_seconds", PHELP, "phase=\"total\"");
    sl_metrics_collector(collect_outq, NULL);
    if (endpoint_top > 0)
        sl_metrics_collector(collect_endpoints, NULL);
}

struct cons_ep_metrics *cons_metrics_endpoint(const char *id)
{
    if (!g_eps)
        return NULL;
    pthread_mutex_lock(&g_mu);
    struct cons_ep_metrics *em = sl_map_get(g_eps, id);
    if (!em) {
        size_t n = strlen(id);
        em = sl_xcalloc(1, sizeof(*em) + n + 1);
        memcpy(em->id, id, n + 1);
        sl_map_put(g_eps, id, em, NULL);
    }
    pthread_mutex_unlock(&g_mu);
    return em;
}

void cons_metrics_outcome(struct cons_ep_metrics *em, enum cons_m_outcome outcome, long status)
{
    int cls = status >= 100 && status < 600 ? (int)(status / 100) : 0;
    sl_counter_inc(cons_m.deliveries[outcome][cls]);
    if (em)
        atomic_fetch_add_explicit(&em->outcomes[outcome], 1, memory_order_relaxed);
}

void cons_metrics_failure(const char *cls)
{
    for (int c = 0; cls && c < CONS_M_NERROR; c++) {
        if (strcmp(cls, ERROR[c]) == 0) {
            sl_counter_inc(cons_m.failures[c]);
            return;
        }
    }
}

void cons_metrics_breaker_open(const char *id, struct cons_ep_metrics *em, bool open)
{
    if (!g_open)
        return;
    pthread_mutex_lock(&g_mu);
    void *v = NULL;
    intptr_t loops = sl_map_find(g_open, id, &v) ? (intptr_t)v : 0;
    intptr_t now = open ? loops + 1 : loops > 0 ? loops - 1 : 0;
    if (now > 0)
        sl_map_put(g_open, id, (void *)now, NULL);
    else
        sl_map_del(g_open, id, NULL);
    if (loops == 0 && now > 0)
        sl_gauge_add(cons_m.brk_open, 1);
    else if (loops > 0 && now == 0)
        sl_gauge_add(cons_m.brk_open, -1);
    if (em)
        atomic_store(&em->open_loops, (int)now);
    pthread_mutex_unlock(&g_mu);
}

void cons_metrics_producer_add(rd_kafka_t *rk)
{
    pthread_mutex_lock(&g_mu);
    if (g_nprod == g_cap_prod) {
        g_cap_prod = g_cap_prod ? g_cap_prod * 2 : 8;
        g_prod = sl_xrealloc(g_prod, g_cap_prod * sizeof(rd_kafka_t *));
    }
    g_prod[g_nprod++] = rk;
    pthread_mutex_unlock(&g_mu);
}

void cons_metrics_producer_remove(rd_kafka_t *rk)
{
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nprod; i++) {
        if (g_prod[i] == rk) {
            g_prod[i] = g_prod[--g_nprod];
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
}

/* ==== Collectors (scrape time) ==== */

static void collect_outq(struct sl_buf *out, void *arg)
{
    (void)arg;
    int64_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nprod; i++)
        n += rd_kafka_outq_len(g_prod[i]);
    pthread_mutex_unlock(&g_mu);
    sl_metrics_write_head(out, "sluice_outcome_queue_messages", "gauge",
                          "Outcome records not yet acknowledged by Kafka.");
    sl_metrics_write_sample(out, "sluice_outcome_queue_messages", NULL, (double)n);
}

/* Endpoints with an open breaker first (few, and the ones an operator looks for: by attempts
 * alone a broken endpoint, held back, falls out of the top), then by attempts. */
static int cmp_attempts(const void *a, const void *b)
{
    const struct cons_ep_metrics *x = *(const struct cons_ep_metrics *const *)a;
    const struct cons_ep_metrics *y = *(const struct cons_ep_metrics *const *)b;
    bool ox = atomic_load(&x->open_loops) > 0, oy = atomic_load(&y->open_loops) > 0;
    if (ox != oy)
        return ox ? -1 : 1;
    uint64_t ax = atomic_load_explicit(&x->attempts, memory_order_relaxed);
    uint64_t ay = atomic_load_explicit(&y->attempts, memory_order_relaxed);
    if (ax != ay)
        return ax > ay ? -1 : 1;
    return strcmp(x->id, y->id);
}

/* The top metrics_endpoint_top endpoints (open breakers first, then by attempts), in three
 * families. */
static void collect_endpoints(struct sl_buf *out, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_mu);
    size_t n = sl_map_count(g_eps), k = 0, it = 0;
    struct cons_ep_metrics **v = sl_xcalloc(n ? n : 1, sizeof(struct cons_ep_metrics *));
    const char *key;
    void *val;
    while (sl_map_next(g_eps, &it, &key, &val))
        v[k++] = val;
    pthread_mutex_unlock(&g_mu); /* the objects themselves are never freed */
    qsort(v, k, sizeof(struct cons_ep_metrics *), cmp_attempts);
    if (k > (size_t)g_top)
        k = (size_t)g_top;
    struct sl_buf lb;
    sl_buf_init(&lb, 4096);
    sl_metrics_write_head(out, "sluice_endpoint_deliveries_total", "counter",
                          "Finished HTTP attempts of one endpoint by what they led to "
                          "(metrics_endpoint_top endpoints: open breakers, then most attempts).");
    for (size_t i = 0; i < k; i++) {
        for (int o = 0; o < CONS_M_NOUTCOME; o++) {
            sl_buf_reset(&lb);
            sl_metrics_label(&lb, "endpoint", v[i]->id);
            sl_metrics_label(&lb, "outcome", OUTCOME[o]);
            sl_metrics_write_sample(
                out, "sluice_endpoint_deliveries_total", (const char *)lb.data,
                (double)atomic_load_explicit(&v[i]->outcomes[o], memory_order_relaxed));
        }
    }
    sl_metrics_write_head(out, "sluice_endpoint_request_duration_seconds", "histogram",
                          "Total time of one endpoint's answered requests, seconds "
                          "(metrics_endpoint_top endpoints).");
    for (size_t i = 0; i < k; i++) {
        sl_buf_reset(&lb);
        sl_metrics_label(&lb, "endpoint", v[i]->id);
        sl_metrics_write_histo(out, "sluice_endpoint_request_duration_seconds",
                               (const char *)lb.data, &v[i]->duration);
    }
    sl_metrics_write_head(out, "sluice_endpoint_breaker_open", "gauge",
                          "1 while this process counts the endpoint's breaker open, as "
                          "sluice_breaker_open_endpoints (metrics_endpoint_top endpoints).");
    for (size_t i = 0; i < k; i++) {
        sl_buf_reset(&lb);
        sl_metrics_label(&lb, "endpoint", v[i]->id);
        sl_metrics_write_sample(out, "sluice_endpoint_breaker_open", (const char *)lb.data,
                                atomic_load(&v[i]->open_loops) > 0 ? 1 : 0);
    }
    sl_buf_fini(&lb);
    free(v);
}
