/*
 * rec_loop: sluice-recorder's main loop. Consumes sluice.outcomes in its own consumer group,
 * batches records (rec_batch), writes each batch to PostgreSQL in one transaction per lane
 * (rec_db) while the next batch fills (at most one batch in flight, batches committed in
 * order), and only then stores the batch's offsets (offset + 1 per partition; librdkafka
 * auto-commits stored offsets every second). Periodic maintenance (partitions, retention,
 * endpoint_health statistics) runs on its own thread and connection (rec_maint), so it never
 * stalls intake.
 *
 * Failure model (details in recorder/README.md):
 *   - a bad record (undecodable, or a value PostgreSQL would refuse) is logged with its
 *     partition/offset, counted and skipped; its offset still advances;
 *   - a batch PostgreSQL rejects as data (SQLSTATE 22/23) is bisected down to the offending
 *     row(s), which are skipped like bad records;
 *   - PostgreSQL unavailable: the batch stays in memory, the whole assignment is paused (the
 *     loop keeps polling for group liveness), the write is retried with backoff and
 *     reconnects, and consumption resumes after the commit; memory stays bounded by two
 *     batches (the one waiting to be written and the one that was filling);
 *   - rebalance (revoke): the batch is written and its offsets stored before the unassign; if
 *     that fails the batch is dropped unstored and the partitions' next owner re-reads it;
 *   - outcome_state labels in PostgreSQL that differ from the recorder's (rec_db_connect):
 *     final; the loop stops at once, storing nothing for the batch it holds;
 *   - SIGTERM/SIGINT: stop polling, write and store the last batch (bounded retries), commit
 *     synchronously, close the consumer, return 0; before the group was ever joined
 *     (start_cancelled) there is nothing to write or commit: leave it and return 0 at once.
 * Idempotent writes make every re-read harmless: nothing is lost, nothing double counted.
 *
 * thread: everything on the caller's thread; rec_loop_stop may be called from a signal handler.
 */
#ifndef REC_LOOP_H
#define REC_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_secretbox.h"

/* Write lanes (recorder_lanes, 1..REC_MAX_LANES = PostgreSQL connections used in parallel;
 * rec_batch.h explains why lanes never touch the same rows) and the soft cap on one batch's
 * encoded bytes (recorder_batch_max_bytes; dead letters carry whole delivery records) are
 * options in common/sl_cfg.c. */
#define REC_STATS_EVERY_MS 60000 /* recorder_stats log line, ms */
/* Retry of a batch PostgreSQL could not take: first delay and cap, ms (doubling). */
#define REC_RETRY_MIN_MS 200
#define REC_RETRY_MAX_MS 10000
/* A stop before the group was ever joined: the bound on leaving it, ms. */
#define REC_START_LEAVE_MS 2000

typedef struct rec_loop rec_loop_t;

/* Totals since start (for the final log line and tests). */
struct rec_loop_stats {
    int64_t records;    /* Kafka records consumed (good + bad) */
    int64_t bad;        /* records skipped as undecodable / unstorable */
    int64_t poison;     /* rows skipped because PostgreSQL rejected them */
    int64_t rows;       /* rows written (delivery_attempts candidates) */
    int64_t attempts;   /* delivery_attempts rows new to the history */
    int64_t batches;    /* batches committed */
    int64_t db_retries; /* failed batch writes that were retried */
};

/*
 * Create the consumer (group cfg->recorder_group, subscribed to cfg->topic_outcomes) and the
 * PostgreSQL handle (not connected yet: the loop connects and reconnects itself). cfg and mk
 * (the master keys: the records of endpoints it disables are signed with them) are borrowed
 * and must outlive the loop. NULL with err on failure. Free with rec_loop_destroy().
 */
rec_loop_t *rec_loop_new(const struct sl_config *cfg, const struct sl_masterkey *mk, sl_err_t *err);

/* Run until rec_loop_stop(); then flush, store, commit and close, all within
 * shutdown_timeout_ms. Returns 0 on a clean stop, SL_ETIMEDOUT when leaving the group was
 * abandoned at the bound (rec_loop_abandoned: then do not destroy the loop, exit),
 * SL_EVERSION with err when the database's outcome_state labels differ from the recorder's
 * (checked at every connect, the maintenance thread's right at start: the batch held is
 * dropped unstored and the group left), SL_EKAFKA with err when Kafka did not take a bad
 * outcome record to the quarantine topic (likewise: nothing held is stored, so the next start
 * reads it again; rec_loop_fatal tells it from a start failure), or a negative SL_E* code if
 * the consumer could not start.
 * A stop before the group was ever joined (no assignment yet: Kafka unreachable, or a stop
 * right at start) took nothing: it logs start_cancelled, only leaves the group, within
 * REC_START_LEAVE_MS, and returns 0 (also when that leave was abandoned). */
int rec_loop_run(rec_loop_t *l, sl_err_t *err);

/* Whether leaving the group was abandoned at its bound (its consumer is still in use by the
 * abandoned close: the loop must not be destroyed; exit instead). */
bool rec_loop_abandoned(const rec_loop_t *l);

/* Whether the loop stopped on an error found while running (schema mismatch, quarantine). */
bool rec_loop_fatal(const rec_loop_t *l);

/* Ask the loop to stop (async-signal-safe). */
void rec_loop_stop(rec_loop_t *l);

/* Totals so far (OUT). */
void rec_loop_get_stats(const rec_loop_t *l, struct rec_loop_stats *out);

/* Free everything. NULL-safe. Call after rec_loop_run returned. */
void rec_loop_destroy(rec_loop_t *l);

#endif /* REC_LOOP_H */
