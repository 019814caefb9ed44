/*
 * ctl_kafka: sluicectl's Kafka subcommands.
 *
 *   sluicectl topics ensure [--partitions N]   create the four Sluice topics if missing
 *   sluicectl dump outcomes|deliveries|quarantine|endpoints [--max N] [--idle-ms N] [--follow]
 *                                             decode a topic to JSON lines on stdout
 *
 * thread: main thread only.
 */
#ifndef CTL_KAFKA_H
#define CTL_KAFKA_H

#include <stdio.h>

#include "common/sl_cfg.h"
#include "ctl/ctl.h"

/* Command-group entry points for ctl/main.c (argv[0] = "topics" / "dump"). */
int ctl_topics_main(struct ctl *c, int argc, char **argv);
void ctl_topics_help(FILE *f);
int ctl_dump_main(struct ctl *c, int argc, char **argv);
void ctl_dump_help(FILE *f);

#endif /* CTL_KAFKA_H */
