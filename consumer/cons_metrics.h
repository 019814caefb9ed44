/*
 * cons_metrics: sluice-consumer's metrics (docs/METRICS.md), shared by its delivery loops.
 *
 * cons_metrics_init registers every series once per process; the loops then add to the
 * pointers in cons_m (all NULL, so every update a no-op, before init). What a loop cannot
 * count alone lives here too: the breaker-open endpoint set (several loops may see the same
 * endpoint open), the outcome producers' queues (read at scrape time) and the opt-in
 * per-endpoint series (metrics_endpoint_top).
 *
 * thread: any; updates are relaxed atomics, the rare state changes (breaker, endpoint
 * objects) take a mutex.
 */
#ifndef CONS_METRICS_H
#define CONS_METRICS_H

#include <stdbool.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_metrics.h"

enum cons_m_outcome { CONS_M_DELIVERED, CONS_M_RETRY, CONS_M_DEAD, CONS_M_NOUTCOME };

/* status classes: 0 = none (no HTTP status), 1..5 = 1xx..5xx */
#define CONS_M_NCLASS 6

/* error classes of failed attempts (consumer/cons_classify.h's CONS_CLASSES) */
#define CONS_M_NERROR 25

struct cons_metrics {
    sl_counter_t *received, *claimed, *attempts, *retries, *dead, *duplicates, *quarantined;
    sl_counter_t *brk_deferrals, *spills, *rate_limited, *throttled, *redis_errors;
    sl_counter_t *redis_state_lost;
    sl_counter_t *deliveries[CONS_M_NOUTCOME][CONS_M_NCLASS];
    sl_counter_t *failures[CONS_M_NERROR]; /* by error class, in CONS_CLASSES' order */
    sl_counter_t *brk_to_open, *brk_to_half_open, *brk_to_closed;
    sl_gauge_t *brk_open, *inflight, *inflight_limit, *queued, *records_held;
    sl_histo_t *publish_to_delivered;
    sl_histo_t *stage_kafka, *stage_queue; /* a first attempt's wait before its request */
    sl_histo_t *phase_connect, *phase_tls, *phase_first_byte, *phase_total;
};

extern struct cons_metrics cons_m;

/* Per-endpoint series of one endpoint (metrics_endpoint_top > 0). */
struct cons_ep_metrics {
    _Atomic uint64_t attempts;
    _Atomic uint64_t outcomes[CONS_M_NOUTCOME];
    _Atomic int open_loops; /* loops that see its breaker open */
    sl_histo_t duration;
    char id[]; /* endpoint id */
};

/* Register the series (idempotent). endpoint_top: cfg->metrics_endpoint_top. */
void cons_metrics_init(int64_t endpoint_top);

/* The endpoint's per-endpoint object (created on first use, kept for the process's life), or
 * NULL when per-endpoint series are off. */
struct cons_ep_metrics *cons_metrics_endpoint(const char *id);

/* A finished HTTP attempt that led to outcome (status 0 = none). */
void cons_metrics_outcome(struct cons_ep_metrics *em, enum cons_m_outcome outcome, long status);

/* A finished HTTP attempt that failed with error class cls (cons_classify's; NULL: none). */
void cons_metrics_failure(const char *cls);

/* A loop's view of endpoint id's breaker went from open to not open or back (open: now
 * open). Keeps sluice_breaker_open_endpoints a count of endpoints, whatever the loops. */
void cons_metrics_breaker_open(const char *id, struct cons_ep_metrics *em, bool open);

/* Outcome producers whose queue length is sluice_outcome_queue_messages (added when a loop
 * starts, removed before the producer is destroyed). */
void cons_metrics_producer_add(rd_kafka_t *rk);
void cons_metrics_producer_remove(rd_kafka_t *rk);

#endif /* CONS_METRICS_H */
