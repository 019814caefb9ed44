/*
 * sl_thresholds: the alert thresholds' defaults, in one place for every process and tool:
 *   sluicectl alerts       evaluates them on the history (sql function sluice_alerts);
 *   sluicectl slow and sluice-api's GET /v1/endpoint-stats (the console's "slow" flag) use
 *                          the slow-endpoint rule's;
 *   sluicectl alert-rules  prints the Prometheus rule file on the processes' metrics
 *                          (ops/prometheus/sluice-alerts.yml is its output with these values;
 *                          a test keeps the two identical).
 * ctl/ctl_thresholds.h parses the flags that override them.
 */
#ifndef SL_THRESHOLDS_H
#define SL_THRESHOLDS_H

/* dead letters rising: the last hour's dead letters (all consumers) number at least
 * DEAD_RISE_MIN and more than DEAD_RISE_FACTOR x the hourly average of the 24 h before */
#define SL_THR_DEAD_RISE_FACTOR 2.0 /* factor, decimal 0..1000 */
#define SL_THR_DEAD_RISE_MIN    5   /* dead letters in the last hour */
/* oldest undelivered: a delivery not in a final state was created longer ago than this */
#define SL_THR_OLDEST_MAX_S 1800 /* s */
/* slow endpoint: P95 response time over SLOW_THRESHOLD_MS with at least SLOW_MIN_SAMPLES
 * answered requests in the last SLOW_WINDOW_S (also `sluicectl slow`'s defaults) */
#define SL_THR_SLOW_THRESHOLD_MS 2000  /* ms */
#define SL_THR_SLOW_MIN_SAMPLES  20    /* samples */
#define SL_THR_SLOW_WINDOW_S     86400 /* s */
/* breaker open (metrics only): some consumer has seen an open breaker for this long */
#define SL_THR_BREAKER_OPEN_FOR_S 300 /* s */
/* consumer lag (metrics only): the consumer group's lag on the deliveries topic, summed over
 * its partitions, above CONSUMER_LAG_MAX for CONSUMER_LAG_FOR_S */
#define SL_THR_CONSUMER_LAG_MAX   10000 /* records */
#define SL_THR_CONSUMER_LAG_FOR_S 600   /* s */
/* the topic whose lag is the consumers' (the default of topic_deliveries) */
#define SL_THR_DELIVERIES_TOPIC "sluice.deliveries"

#define SL_THR_COUNT_MAX   1000000000LL /* largest count accepted by a flag */
#define SL_THR_SLOW_MS_MAX 86400000LL   /* ms; largest --slow-threshold-ms */

#endif /* SL_THRESHOLDS_H */
