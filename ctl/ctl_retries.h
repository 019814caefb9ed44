/*
 * ctl_retries: `sluicectl retries rebuild`, the Redis retry schedule reconstructed from the
 * history after Redis lost its data.
 *
 *   sluicectl retries rebuild [--dry-run] [--lookback DURATION] [--no-kafka]
 *                             [--scan-timeout DURATION] [--json]
 *
 * Every delivery whose latest state in the history is retry_scheduled or deferred becomes a
 * retry job again (job id, shard and keys as the consumer's, body = the delivery record with
 * "attempt" = attempts already spent, due at next_attempt_at or now if that is past), unless
 * its job is already in the schedule. The record itself comes from pending_payloads when the
 * recorder keeps it there (sql/0003_analysis.sql), else from topic_deliveries, read from
 * shortly before the oldest open delivery to the end. What neither holds is reported as not
 * recoverable. Scheduling is "only if absent" and atomic, so running it again, or while
 * consumers run, never duplicates or overwrites a job.
 *
 * thread: main thread only.
 */
#ifndef SL_CTL_RETRIES_H
#define SL_CTL_RETRIES_H

#include <stdio.h>

#include "ctl/ctl.h"

int ctl_retries_main(struct ctl *c, int argc, char **argv);
void ctl_retries_help(FILE *f);

#endif /* SL_CTL_RETRIES_H */
