/*
 * ctl_top: `sluicectl top`, the live view of deliveries, and `sluicectl config-doc`.
 *
 * top follows topic_outcomes from its end (no consumer group, nothing committed) and shows,
 * per endpoint and in total, what happened in the last window: delivered per second, retries
 * scheduled, dead letters, duplicates, deferrals, P50/P95/P99 latency of answered attempts, and
 * the shared breaker state read from Redis. On a terminal it redraws in place; otherwise it
 * prints one frame per interval (for logs and the demo's non-interactive runs).
 *
 * thread: main thread only.
 */
#ifndef CTL_TOP_H
#define CTL_TOP_H

#include <stdio.h>

#include "ctl/ctl.h"

int ctl_top_main(struct ctl *c, int argc, char **argv);
void ctl_top_help(FILE *f);
int ctl_config_doc_main(struct ctl *c, int argc, char **argv);
void ctl_config_doc_help(FILE *f);

#endif /* CTL_TOP_H */
