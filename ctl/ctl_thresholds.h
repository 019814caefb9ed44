/*
 * ctl_thresholds: the alert thresholds of one sluicectl run, with the flags that override
 * their defaults (common/sl_thresholds.h, shared with sluice-api):
 *   sluicectl alerts       evaluates the history's three (sql function sluice_alerts);
 *   sluicectl slow         its defaults are the slow-endpoint rule's;
 *   sluicectl alert-rules  prints the Prometheus rule file, all of them, on the processes'
 *                          metrics (docs/METRICS.md); ops/prometheus/sluice-alerts.yml is its
 *                          output with the defaults, and a test keeps the two identical.
 * so the history and the metrics alert on the same numbers. The SQL functions in
 * sql/0003_analysis.sql carry the same values as parameter defaults for psql users; sluicectl
 * always passes its own.
 *
 * Flags are parsed strictly (ctl_parse_int, ctl_ops_parse_duration, a plain decimal for the
 * factor) and a bad value is a usage error naming the flag.
 *
 * thread: single-threaded tool.
 */
#ifndef SL_CTL_THRESHOLDS_H
#define SL_CTL_THRESHOLDS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sl_thresholds.h"

/* The defaults and bounds: common/sl_thresholds.h (SL_THR_*). */

#define CTL_THR_FACTOR_MAX 1000.0 /* largest --dead-rise-factor */
#define CTL_THR_TOPIC_MAX  249    /* longest Kafka topic name */

/* The effective thresholds of one command run. */
struct ctl_thresholds {
    double dead_rise_factor;    /* factor over the hourly average of the 24 h before */
    int64_t dead_rise_min;      /* fewest dead letters in the last hour */
    int64_t oldest_max_s;       /* s; oldest undelivered limit */
    int64_t slow_threshold_ms;  /* ms; P95 limit */
    int64_t slow_min_samples;   /* fewest samples for a verdict */
    int64_t slow_window_s;      /* s; window of the P95 */
    int64_t breaker_open_for_s; /* s; how long a breaker is open before the alert */
    int64_t consumer_lag_max;   /* records; summed over the partitions */
    int64_t consumer_lag_for_s; /* s; how long the lag stays above the limit */
    char deliveries_topic[CTL_THR_TOPIC_MAX + 1]; /* topic of the consumers' lag */
};

/* Fill t with the defaults above. */
void ctl_thresholds_init(struct ctl_thresholds *t);

/* ==== Flags ==== */

/* getopt_long values of the threshold flags (above the commands' own, which start at 256). */
enum {
    CTL_THR_O_DEAD_RISE_FACTOR = 0x400,
    CTL_THR_O_DEAD_RISE_MIN,
    CTL_THR_O_OLDEST_MAX,
    CTL_THR_O_SLOW_THRESHOLD,
    CTL_THR_O_SLOW_MIN_SAMPLES,
    CTL_THR_O_SLOW_WINDOW,
    CTL_THR_O_BREAKER_OPEN_FOR,
    CTL_THR_O_CONSUMER_LAG_MAX,
    CTL_THR_O_CONSUMER_LAG_FOR,
    CTL_THR_O_DELIVERIES_TOPIC
};

/* struct option rows for a command's longopts[]: the flags of the thresholds evaluated on the
 * history (`alerts`), and the ones only the metrics know (`alert-rules`, with the former). */
/* clang-format off */
#define CTL_THR_LONGOPTS_HISTORY                                                   \
    {"dead-rise-factor", required_argument, NULL, CTL_THR_O_DEAD_RISE_FACTOR},     \
    {"dead-rise-min", required_argument, NULL, CTL_THR_O_DEAD_RISE_MIN},           \
    {"oldest-max", required_argument, NULL, CTL_THR_O_OLDEST_MAX},                 \
    {"slow-threshold-ms", required_argument, NULL, CTL_THR_O_SLOW_THRESHOLD},      \
    {"slow-min-samples", required_argument, NULL, CTL_THR_O_SLOW_MIN_SAMPLES},     \
    {"slow-window", required_argument, NULL, CTL_THR_O_SLOW_WINDOW}
#define CTL_THR_LONGOPTS_METRICS                                                   \
    {"breaker-open-for", required_argument, NULL, CTL_THR_O_BREAKER_OPEN_FOR},     \
    {"consumer-lag-max", required_argument, NULL, CTL_THR_O_CONSUMER_LAG_MAX},     \
    {"consumer-lag-for", required_argument, NULL, CTL_THR_O_CONSUMER_LAG_FOR},     \
    {"deliveries-topic", required_argument, NULL, CTL_THR_O_DELIVERIES_TOPIC}
/* clang-format on */

/*
 * Apply threshold flag val (a CTL_THR_O_* value) with its argument arg (borrowed) to t.
 * Returns 0; CTL_EXIT_USAGE after printing a usage error for cmd that names the flag (never
 * the value); or -1 when val is not a threshold flag (t untouched).
 */
int ctl_thresholds_opt(const char *cmd, struct ctl_thresholds *t, int val, const char *arg);

/*
 * Print the help lines of the threshold flags with their defaults, two-space indented: the
 * history's six, and with metrics also the four of the rule file.
 */
void ctl_thresholds_help(FILE *f, bool metrics);

/*
 * Format a non-negative number as the shortest fixed-point decimal that reads back as the
 * same double ("2", "1.5", "0.001", "1000"; an exponent only below 1e-17) into out (>= 32 bytes for
 * values below 10^12, which the flags' bounds keep them).
 */
void ctl_thresholds_fmt_number(double v, char *out, size_t outlen);

#endif /* SL_CTL_THRESHOLDS_H */
