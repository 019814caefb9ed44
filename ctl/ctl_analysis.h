/*
 * ctl_analysis: the read-only operations commands over the delivery history
 * (sql/0003_analysis.sql), Kafka and the Redis schedule:
 *
 *   sluicectl health [--window 1h]             pending work from Kafka lag + the Redis schedule
 *                                              + the PostgreSQL summary, each figure labelled
 *                                              with its source
 *   sluicectl slow [--threshold-ms N] [--min-samples N] [--window 24h]
 *   sluicectl dead-letters [--window 24h] [--endpoint ID]
 *   sluicectl alerts [thresholds]              exit 3 when an alert fires (cron, monitoring)
 *   sluicectl latency ENDPOINT [--window 24h]  percentiles and a text histogram
 *   sluicectl event EVENT_ID                   one event's deliveries and their attempts
 *
 * Every command validates its flags before loading the configuration or touching a service,
 * prints a table (or --json), and exits 0 / 1 (a service failed) / 2 (usage) / 78 (config);
 * alerts adds 3.
 *
 * thread: main thread only.
 */
#ifndef SL_CTL_ANALYSIS_H
#define SL_CTL_ANALYSIS_H

#include <stdio.h>

#include "ctl/ctl.h"

/* Command-group entry points for ctl/main.c (argv[0] = the command name). */
int ctl_health_main(struct ctl *c, int argc, char **argv);
void ctl_health_help(FILE *f);
int ctl_slow_main(struct ctl *c, int argc, char **argv);
void ctl_slow_help(FILE *f);
int ctl_dead_letters_main(struct ctl *c, int argc, char **argv);
void ctl_dead_letters_help(FILE *f);
int ctl_alerts_main(struct ctl *c, int argc, char **argv);
void ctl_alerts_help(FILE *f);
int ctl_latency_main(struct ctl *c, int argc, char **argv);
void ctl_latency_help(FILE *f);
int ctl_event_main(struct ctl *c, int argc, char **argv);
void ctl_event_help(FILE *f);

#endif /* SL_CTL_ANALYSIS_H */
