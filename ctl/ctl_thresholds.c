/*
 * ctl_thresholds: defaults, flag parsing and help of the alert thresholds (see
 * ctl_thresholds.h). The values live only in the header's macros; the help text prints them
 * from there, so `--help` cannot drift from the code.
 */
#include "ctl/ctl_thresholds.h"

#include <stdlib.h>
#include <string.h>

#include "ctl/ctl.h"
#include "ctl/ctl_ops.h"

void ctl_thresholds_init(struct ctl_thresholds *t)
{
    memset(t, 0, sizeof(*t));
    t->dead_rise_factor = SL_THR_DEAD_RISE_FACTOR;
    t->dead_rise_min = SL_THR_DEAD_RISE_MIN;
    t->oldest_max_s = SL_THR_OLDEST_MAX_S;
    t->slow_threshold_ms = SL_THR_SLOW_THRESHOLD_MS;
    t->slow_min_samples = SL_THR_SLOW_MIN_SAMPLES;
    t->slow_window_s = SL_THR_SLOW_WINDOW_S;
    t->breaker_open_for_s = SL_THR_BREAKER_OPEN_FOR_S;
    t->consumer_lag_max = SL_THR_CONSUMER_LAG_MAX;
    t->consumer_lag_for_s = SL_THR_CONSUMER_LAG_FOR_S;
    (void)snprintf(t->deliveries_topic, sizeof(t->deliveries_topic), "%s", SL_THR_DELIVERIES_TOPIC);
}

/* Strict non-negative decimal ("2", "1.5"; no sign, exponent or spaces) in [0, max]. */
static int parse_decimal(const char *cmd, const char *flag, const char *s, double max, double *out)
{
    size_t i = 0, dig = 0, dots = 0;
    for (; s[i]; i++) {
        if (s[i] >= '0' && s[i] <= '9')
            dig++;
        else if (s[i] == '.' && dots == 0 && dig > 0)
            dots++;
        else
            break;
    }
    double v = (s[i] == '\0' && dig > 0 && s[i - 1] != '.') ? strtod(s, NULL) : -1;
    if (v < 0 || v > max)
        return ctl_usage_error(cmd, "invalid value for %s: expected a decimal number in 0..%g",
                               flag, max);
    *out = v;
    return 0;
}

/* A Kafka topic name: 1..249 of [A-Za-z0-9._-] (which also keeps it inert inside a PromQL
 * string and a YAML scalar). */
static int parse_topic(const char *cmd, const char *s, char *out, size_t outlen)
{
    size_t n = strlen(s);
    bool ok = n > 0 && n <= CTL_THR_TOPIC_MAX && n < outlen;
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
             (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-';
    if (!ok)
        return ctl_usage_error(cmd, "invalid value for --deliveries-topic: expected a topic name "
                                    "of 1..249 characters [A-Za-z0-9._-]");
    memcpy(out, s, n + 1);
    return 0;
}

int ctl_thresholds_opt(const char *cmd, struct ctl_thresholds *t, int val, const char *arg)
{
    switch (val) {
    case CTL_THR_O_DEAD_RISE_FACTOR:
        return parse_decimal(cmd, "--dead-rise-factor", arg, CTL_THR_FACTOR_MAX,
                             &t->dead_rise_factor);
    case CTL_THR_O_DEAD_RISE_MIN:
        return ctl_parse_int(cmd, "--dead-rise-min", arg, 1, SL_THR_COUNT_MAX, false,
                             &t->dead_rise_min);
    case CTL_THR_O_OLDEST_MAX:
        return ctl_ops_parse_duration(cmd, "--oldest-max", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &t->oldest_max_s);
    case CTL_THR_O_SLOW_THRESHOLD:
        return ctl_parse_int(cmd, "--slow-threshold-ms", arg, 0, SL_THR_SLOW_MS_MAX, false,
                             &t->slow_threshold_ms);
    case CTL_THR_O_SLOW_MIN_SAMPLES:
        return ctl_parse_int(cmd, "--slow-min-samples", arg, 1, SL_THR_COUNT_MAX, false,
                             &t->slow_min_samples);
    case CTL_THR_O_SLOW_WINDOW:
        return ctl_ops_parse_duration(cmd, "--slow-window", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &t->slow_window_s);
    case CTL_THR_O_BREAKER_OPEN_FOR:
        return ctl_ops_parse_duration(cmd, "--breaker-open-for", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &t->breaker_open_for_s);
    case CTL_THR_O_CONSUMER_LAG_MAX:
        return ctl_parse_int(cmd, "--consumer-lag-max", arg, 0, SL_THR_COUNT_MAX, false,
                             &t->consumer_lag_max);
    case CTL_THR_O_CONSUMER_LAG_FOR:
        return ctl_ops_parse_duration(cmd, "--consumer-lag-for", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &t->consumer_lag_for_s);
    case CTL_THR_O_DELIVERIES_TOPIC:
        return parse_topic(cmd, arg, t->deliveries_topic, sizeof(t->deliveries_topic));
    default:
        return -1;
    }
}

void ctl_thresholds_fmt_number(double v, char *out, size_t outlen)
{
    for (int prec = 0; prec <= 17; prec++) { /* fixed point: no exponent in PromQL or prose */
        (void)snprintf(out, outlen, "%.*f", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
    (void)snprintf(out, outlen, "%.17g", v); /* tinier than 1e-17: exact, exponent and all */
}

void ctl_thresholds_help(FILE *f, bool metrics)
{
    char factor[32], oldest[24], window[24];
    ctl_thresholds_fmt_number(SL_THR_DEAD_RISE_FACTOR, factor, sizeof(factor));
    ctl_ops_duration_format(SL_THR_OLDEST_MAX_S, oldest, sizeof(oldest));
    ctl_ops_duration_format(SL_THR_SLOW_WINDOW_S, window, sizeof(window));
    (void)fprintf(
        f,
        "  --dead-rise-factor X        dead letters rising: the last hour's are more than X\n"
        "                              x the hourly average of the 24 h before (default %s)\n"
        "  --dead-rise-min N           ... and at least N (default %d)\n"
        "  --oldest-max DURATION       oldest undelivered: a delivery not yet in a final\n"
        "                              state is older than this (default %s)\n"
        "  --slow-threshold-ms N       slow endpoint: P95 response time over N ms ...\n"
        "                              (default %d)\n"
        "  --slow-min-samples N        ... with at least N samples ... (default %d)\n"
        "  --slow-window DURATION      ... in this window (default %s)\n",
        factor, SL_THR_DEAD_RISE_MIN, oldest, SL_THR_SLOW_THRESHOLD_MS, SL_THR_SLOW_MIN_SAMPLES,
        window);
    if (!metrics)
        return;
    char open_for[24], lag_for[24];
    ctl_ops_duration_format(SL_THR_BREAKER_OPEN_FOR_S, open_for, sizeof(open_for));
    ctl_ops_duration_format(SL_THR_CONSUMER_LAG_FOR_S, lag_for, sizeof(lag_for));
    (void)fprintf(
        f,
        "  --breaker-open-for DURATION breaker open: some consumer has seen an open breaker\n"
        "                              for this long (default %s)\n"
        "  --consumer-lag-max N        consumer lag: the consumer group's lag on the\n"
        "                              deliveries topic, summed over its partitions, above N\n"
        "                              records ... (default %d)\n"
        "  --consumer-lag-for DURATION ... for this long (default %s)\n"
        "  --deliveries-topic NAME     the topic of that lag, as topic_deliveries\n"
        "                              (default %s)\n",
        open_for, SL_THR_CONSUMER_LAG_MAX, lag_for, SL_THR_DELIVERIES_TOPIC);
}
