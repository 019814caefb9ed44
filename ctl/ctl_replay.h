/*
 * ctl_replay: `sluicectl replay`, re-publishing dead letters.
 *
 *   sluicectl replay [--endpoint ID] [--since T] [--until T] [--error CLASS] [--ids ID,ID...]
 *                    [--limit N] [--all] [--batch-size N] [--dry-run] [--json]
 *
 * Each selected dead letter's stored delivery record is re-published to topic_deliveries as a
 * fresh delivery (attempt 0, replay = true) and the letter is marked replayed, each once, also
 * across concurrent runs and crashes. The engine doing it is common/sl_replay.h (shared with
 * sluice-api); this command parses and validates the flags (usage errors before the
 * configuration is loaded), opens the two PostgreSQL connections the engine needs, and prints
 * its reports. The exact guarantee is documented in docs/OPERATIONS-analysis.md.
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
