/*
 * rec_db: the recorder's PostgreSQL side. One connection; per connection three TEMP staging
 * tables (ON COMMIT DELETE ROWS).
 *
 * rec_db_write() applies a slice of a batch in ONE transaction:
 *   BEGIN; COPY rec_stage FROM STDIN (binary); in the fast apply also COPY rec_hstage and
 *          rec_fstage (the endpoint_health inputs, computed by rec_agg; one query for all);
 *   apply: INSERT delivery_attempts ... RETURNING (the rows really new)
 *          -> endpoint_latency samples, deliveries upsert (batch aggregated per key first),
 *             dead letters resolved by a later delivery (keys whose deliveries row shows an
 *             earlier death), endpoint_health (last outcome, consecutive failures), all from
 *             the new rows only;
 *   dead:  dead_letters upsert (only when the slice holds dead letters);
 *   pending: pending_payloads upsert (sql/0003; only when the slice holds retry/deferred
 *          outcomes carrying the delivery record, and the table exists);
 *   COMMIT.
 * Everything is idempotent (see sql/0002_history.sql), so a slice may be written any number of
 * times: after a crash between COMMIT and the Kafka offset commit, after a lost COMMIT reply,
 * or after a rebalance.
 *
 * Errors are classified for the caller: SL_EINVAL = PostgreSQL rejected the data (SQLSTATE
 * class 22 or 23; the connection is fine and the transaction rolled back), so some row of the
 * slice is poison; SL_EPG = anything else (connection lost, server down, schema missing, ...),
 * worth retrying later; SL_EVERSION = the database's outcome_state labels differ from the ones
 * this binary writes and ranks (checked at every connect): final, retrying cannot help.
 * Messages carry the SQLSTATE and PostgreSQL's primary message only, never DETAIL (which can
 * quote a failing row).
 *
 * thread: one thread per handle (the recorder uses one handle per write lane and one for
 * maintenance); rec_db_cancel is the exception.
 */
#ifndef REC_DB_H
#define REC_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "recorder/rec_batch.h"

typedef struct rec_db rec_db_t;

/* What one rec_db_write changed. */
struct rec_db_stats {
    int64_t attempts;   /* delivery_attempts rows inserted (the rest were already there) */
    int64_t samples;    /* endpoint_latency rows inserted */
    int64_t deliveries; /* deliveries rows inserted or updated */
    int64_t dead;       /* dead_letters rows inserted or updated */
    int64_t resolved;   /* dead_letters rows resolved by a later delivery */
    int64_t pending;    /* pending_payloads rows inserted or updated */
    int64_t copy_us;    /* time in BEGIN + COPY, µs */
    int64_t apply_us;   /* time in the apply statement, µs */
    int64_t dead_us;    /* time in the dead-letter and pending-payload statements, µs */
    int64_t commit_us;  /* time in COMMIT, µs */
    bool agg;           /* the endpoint_health inputs came from rec_agg (else from SQL) */
};

/*
 * New handle, not connected. dsn: libpq conninfo (copied). latency_window_h / history_days:
 * samples / attempts older than this are not inserted (retention would drop them at once, and
 * an attempt dropped by retention must never be inserted again). Caller frees with
 * rec_db_destroy().
 */
rec_db_t *rec_db_new(const char *dsn, int64_t latency_window_h, int64_t history_days);
/* Disconnect and free. NULL-safe. */
void rec_db_destroy(rec_db_t *db);

/*
 * Connect (if not connected) and prepare the session: timeouts, staging tables, and the
 * check of the outcome_state labels (same names in the same sort order as rec_agg_states).
 * Connection attempts are bounded (connect_timeout 5 s unless the DSN sets one; TCP
 * keepalives and tcp_user_timeout bound a dead peer later). Returns 0, SL_EPG (retry later)
 * or SL_EVERSION (the labels differ: final), with err.
 */
int rec_db_connect(rec_db_t *db, sl_err_t *err);
/* True when a connection is open and was last seen healthy. */
bool rec_db_connected(const rec_db_t *db);
/* Drop the connection (the next rec_db_connect makes a new one). */
void rec_db_disconnect(rec_db_t *db);
/* Ask the server to cancel the statement running on db's connection, if any.
 * thread: any (the only function that may be called while another thread uses db). */
void rec_db_cancel(rec_db_t *db);

/*
 * Write rows [from, to) of lane of b (from < to <= b->lanes[lane].n) in one transaction;
 * connects first if needed. Deadlocks and serialization failures (SQLSTATE class 40) are
 * retried at once a few times. st: OUT (NULL allowed), filled on success. Returns 0, SL_EINVAL
 * (data rejected, see above), SL_EPG (retry later; the connection is dropped if it broke) or
 * SL_EVERSION (outcome_state mismatch at connect, see rec_db_connect).
 * thread: any, one thread per handle at a time (b is only read).
 */
int rec_db_write(rec_db_t *db,
                 const struct rec_batch *b,
                 size_t lane,
                 size_t from,
                 size_t to,
                 struct rec_db_stats *st,
                 sl_err_t *err);

/* ==== Maintenance (each its own statement, autocommit) ==== */

/* sluice_drop_old_partitions(history_days, latency_hours) then sluice_ensure_partitions(
 * days_ahead). *dropped / *created: OUT. Returns 0 or SL_EPG/SL_EINVAL. */
int rec_db_partitions(rec_db_t *db,
                      int64_t days_ahead,
                      int64_t history_days,
                      int64_t latency_hours,
                      int64_t *created,
                      int64_t *dropped,
                      sl_err_t *err);

enum rec_purge {
    REC_PURGE_DEAD_LETTERS, /* sluice_purge_dead_letters(days, limit) */
    REC_PURGE_DELIVERIES,   /* sluice_purge_deliveries(days, limit) */
    REC_PURGE_PENDING,      /* sluice_purge_pending_payloads(limit): finished deliveries; days
                               unused; a no-op without sql/0003 */
    REC_PURGE_REPLAY_LOG,   /* sluice_purge_replay_log(days, limit): the replay journal; a no-op
                               without sql/0003 */
};
/* One batched retention delete (sluice_purge_*): at most limit rows older than days.
 * *deleted: OUT. Returns 0 or an error code. */
int rec_db_purge(rec_db_t *db,
                 enum rec_purge what,
                 int64_t days,
                 int64_t limit,
                 int64_t *deleted,
                 sl_err_t *err);

/* sluice_refresh_endpoint_health(window_h). *endpoints: OUT, endpoints with samples. */
int rec_db_refresh_health(rec_db_t *db, int64_t window_h, int64_t *endpoints, sl_err_t *err);
/* The server's clock (clock_timestamp()), Unix ms: the recorder's reference for how far
 * ahead an outcome's ts may be (rec_maint). Returns 0 or SL_EPG. */
int rec_db_clock_ms(rec_db_t *db, int64_t *ms, sl_err_t *err);

/* Age of the oldest delivery waiting for a retry or deferred, whole seconds (0 when none):
 * sluice_oldest_undelivered_age_seconds, the metric twin of sluice_alerts' oldest_undelivered
 * (deliveries_open_idx answers it). Returns 0 or SL_EPG. */
int rec_db_oldest_undelivered(rec_db_t *db, int64_t *age_s, sl_err_t *err);

#endif /* REC_DB_H */
