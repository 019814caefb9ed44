/*
 * sl_metrics: the process's Prometheus metrics (names and meanings: docs/METRICS.md).
 *
 * One registry per process. Start-up code registers fixed series (a family name, its help, a
 * constant label set) and keeps the returned pointers; the hot path then only adds to them
 * with relaxed atomics (no lock, no allocation, no lookup). Series whose label values are only
 * known at run time (Kafka partitions, the top-N endpoints) come from collectors: callbacks
 * that write whole families at scrape time.
 *
 *   sl_counter_t *c = sl_metric_counter("sluice_attempts_total", "HTTP requests sent", NULL);
 *   sl_counter_inc(c);                              // any thread, any time
 *   sl_metrics_render(&buf);                        // the /metrics body (text format 0.0.4)
 *
 * Histograms have the fixed latency buckets of SL_HISTO_BOUNDS_US (seconds on the wire) and
 * take observations in microseconds; the exposition makes the buckets cumulative and adds
 * +Inf, _sum and _count.
 *
 * thread: registration and collectors are guarded by one mutex; updates are lock-free;
 * rendering may run on any thread while updates go on (each value is read once, so a scrape
 * sees every counter at some moment during the scrape, never a torn value).
 */
#ifndef SL_METRICS_H
#define SL_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_mem.h"

/* Bucket upper bounds of every histogram, microseconds (docs/METRICS.md). */
#define SL_HISTO_BOUNDS_US                                                                         \
    1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000,      \
        10000000, 30000000, 60000000
#define SL_HISTO_NB 15 /* bounds above; one more bucket holds what is past the last */

typedef struct sl_counter {
    _Atomic uint64_t v;
} sl_counter_t;

typedef struct sl_gauge {
    _Atomic int64_t v;
} sl_gauge_t;

typedef struct sl_histo {
    _Atomic uint64_t b[SL_HISTO_NB + 1]; /* per bucket (not cumulative) */
    _Atomic uint64_t sum_us;             /* sum of observations, microseconds */
} sl_histo_t;

/* Updates (NULL-safe: a series that was never registered is a no-op). */
static inline void sl_counter_add(sl_counter_t *c, uint64_t n)
{
    if (c)
        atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}
static inline void sl_counter_inc(sl_counter_t *c)
{
    sl_counter_add(c, 1);
}
static inline void sl_gauge_set(sl_gauge_t *g, int64_t v)
{
    if (g)
        atomic_store_explicit(&g->v, v, memory_order_relaxed);
}
static inline void sl_gauge_add(sl_gauge_t *g, int64_t d)
{
    if (g)
        atomic_fetch_add_explicit(&g->v, d, memory_order_relaxed);
}
void sl_histo_observe_us(sl_histo_t *h, int64_t us); /* negative counts as 0 */

/* Registration. name: a valid metric name; help: one line; labels: NULL, or the label set in
 * exposition syntax without braces (`outcome="delivered",status_class="2xx"`), constant. A
 * second registration of the same name and labels returns the same series; the same name with
 * another type or help aborts (a programming error). The series live until the process ends. */
sl_counter_t *sl_metric_counter(const char *name, const char *help, const char *labels);
sl_gauge_t *sl_metric_gauge(const char *name, const char *help, const char *labels);
sl_histo_t *sl_metric_histo(const char *name, const char *help, const char *labels);

/* A collector writes whole families (use the sl_metrics_write_* helpers) at each scrape. It
 * runs on the scraping thread, outside the delivery loops: it must only read what is safe to
 * read from another thread. */
typedef void (*sl_metrics_collect_fn)(struct sl_buf *out, void *arg);
void sl_metrics_collector(sl_metrics_collect_fn fn, void *arg);
void sl_metrics_collector_remove(sl_metrics_collect_fn fn, void *arg);

/* Set the labels of sluice_build_info (process name; version is SL_VERSION). */
void sl_metrics_set_process(const char *process);

/* The exposition: every registered family, then the collectors, then the process metrics
 * (process_cpu_seconds_total, ...). Appends to out. Returns 0, or SL_ETOOBIG when out's
 * maximum was reached (out then holds a truncated body: do not serve it). */
int sl_metrics_render(struct sl_buf *out);

/* Helpers for collectors. */
void sl_metrics_write_head(struct sl_buf *out,
                           const char *name,
                           const char *type,
                           const char *help);
/* One sample: name{labels} value. labels may be NULL or "". */
void sl_metrics_write_sample(struct sl_buf *out,
                             const char *name,
                             const char *labels,
                             double value);
/* A histogram's samples (buckets, _sum, _count) under name with extra labels (may be NULL). */
void sl_metrics_write_histo(struct sl_buf *out,
                            const char *name,
                            const char *labels,
                            const sl_histo_t *h);
/* Append `key="value"` with the value escaped as the text format requires (\\, \", \n). */
void sl_metrics_label(struct sl_buf *out, const char *key, const char *value);

/* Drop every registration and collector (tests only; no series may be in use). */
void sl_metrics_reset_for_tests(void);

#endif /* SL_METRICS_H */
