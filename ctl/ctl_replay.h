/*
 * ctl_replay: `sluicectl replay`, re-publishing dead letters.
 *
 *   sluicectl replay [--endpoint ID] [--since T] [--until T] [--error CLASS] [--ids ID,ID...]
 *                    [--limit N] [--all] [--batch-size N] [--dry-run] [--json]
 *
 * Each selected dead letter's stored delivery record (dead_letters.payload) is re-published to
 * topic_deliveries with attempt = 0 and replay = true (the consumer treats it as a fresh
 * delivery with a new attempt budget), and the letter is marked replayed (replayed_at,
 * replay_count + 1). Running it twice does not send twice: only letters not replayed since
 * their latest death are selected, FOR UPDATE SKIP LOCKED so concurrent runs split the work,
 * and a journal (replay_log, sql/0003_analysis.sql) written before publishing and updated as
 * soon as Kafka acknowledges makes the marking survive a crash between the acknowledgement and
 * the commit. The exact guarantee is documented in docs/OPERATIONS-analysis.md.
 *
 * thread: main thread only.
 */
#ifndef SL_CTL_REPLAY_H
#define SL_CTL_REPLAY_H

#include <stdio.h>

#include "ctl/ctl.h"

int ctl_replay_main(struct ctl *c, int argc, char **argv);
void ctl_replay_help(FILE *f);

#endif /* SL_CTL_REPLAY_H */
