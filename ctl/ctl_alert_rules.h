/*
 * ctl_alert_rules: `sluicectl alert-rules`, the Prometheus alert rule file of Sluice, printed
 * from the thresholds of common/sl_thresholds.h (the ones `sluicectl alerts` uses), overridable
 * with the same flags. ops/prometheus/sluice-alerts.yml is its output with the defaults
 * (tests/ops checks they are identical; promtool checks and unit-tests the file).
 *
 * The rules read the metrics of docs/METRICS.md only: the three alerts of `sluicectl alerts`
 * (dead letters rising, oldest undelivered, slow endpoint on the opt-in per-endpoint
 * histogram) plus breaker open and consumer lag, which only the metrics can see.
 *
 * thread: single-threaded tool.
 */
#ifndef SL_CTL_ALERT_RULES_H
#define SL_CTL_ALERT_RULES_H

#include <stdio.h>

#include "ctl/ctl.h"
#include "ctl/ctl_thresholds.h"

/* Command entry point for ctl/main.c (argv[0] = "alert-rules"); needs no configuration. */
int ctl_alert_rules_main(struct ctl *c, int argc, char **argv);
void ctl_alert_rules_help(FILE *f);

/* Write the rule file (YAML) for thresholds t to f. */
void ctl_alert_rules_print(FILE *f, const struct ctl_thresholds *t);

#endif /* SL_CTL_ALERT_RULES_H */
