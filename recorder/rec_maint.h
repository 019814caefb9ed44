/*
 * rec_maint: the recorder's periodic database work, on its own thread and connection so that
 * none of it ever stalls intake (the percentile refresh sorts the whole latency window and
 * takes seconds on a busy history):
 *   - partitions: sluice_drop_old_partitions(history_retention_d, latency_window_h + 1) and
 *     sluice_ensure_partitions(2), at start and every minute;
 *   - retention: sluice_purge_dead_letters(dead_letter_retention_d),
 *     sluice_purge_deliveries(deliveries_retention_d, 0 = history_retention_d),
 *     sluice_purge_pending_payloads() (records of deliveries no longer open; sql/0003) and
 *     sluice_purge_replay_log(dead_letter_retention_d), batched, every minute;
 *   - endpoint_health statistics: sluice_refresh_endpoint_health(latency_window_h) every
 *     recorder_health_refresh_ms (default 30 s), or every 10 x its last duration when that is
 *     longer (it never takes more than ~10 % of a core, whatever the sample volume);
 *   - the age of the oldest undelivered delivery (sluice_oldest_undelivered_age_seconds)
 *     every 15 s;
 *   - the offset of PostgreSQL's clock from this host's, every minute (struct rec_clock): the
 *     reference the loop judges outcomes' timestamps by.
 * Failures are logged on state changes (maintenance_failed / maintenance_recovered) and retried
 * at the next tick; a database this binary cannot write (SL_EVERSION at connect, see rec_db.h)
 * is reported to the loop through rec_maint_fatal. The thread connects at once, so that check
 * runs right at start. Writes and maintenance touch the same tables; their lock interplay is
 * described in recorder/README.md.
 *
 * thread: rec_maint_start/stop/fatal on the main thread; the work runs on the thread it starts.
 */
#ifndef REC_MAINT_H
#define REC_MAINT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "recorder/rec_db.h"

/* Schedule, ms (and limits). */
/* endpoint_health statistics refresh: every recorder_health_refresh_ms (sl_cfg, default
 * 30 s) at least, and at most every REC_HEALTH_SHARE x its last duration. */
#define REC_HEALTH_SHARE         10
#define REC_PARTITIONS_EVERY_MS  60000 /* drop expired + ensure ahead */
#define REC_PURGE_EVERY_MS       60000 /* dead_letters / deliveries retention */
#define REC_OLDEST_EVERY_MS      15000 /* sluice_oldest_undelivered_age_seconds reading */
#define REC_CLOCK_EVERY_MS       60000 /* PostgreSQL's clock offset reading */
#define REC_CLOCK_WARN_MS        5000  /* an offset beyond this is logged (clock_offset) */
#define REC_PARTITION_DAYS_AHEAD 2     /* days of partitions created ahead of today */
#define REC_LATENCY_MARGIN_H     1     /* latency partitions kept past the window, hours */
#define REC_PURGE_LIMIT          10000 /* rows per retention DELETE */
#define REC_PURGE_ROUNDS         10    /* retention DELETEs per table and tick, at most */

/*
 * PostgreSQL's clock against this host's: the reference by which intake judges how far ahead
 * an outcome's ts is. The loop reads it once before intake starts (rec_clock_read on a lane's
 * connection), then the maintenance thread every minute; the loop's thread loads offset_ms.
 */
struct rec_clock {
    _Atomic int64_t offset_ms; /* PostgreSQL's clock minus this host's, ms (last reading) */
    bool off;                  /* |offset| > REC_CLOCK_WARN_MS at the last reading (logged) */
};

/* Read db's clock (the middle of the query's round trip is "now" here) into c, logging when
 * the offset goes beyond REC_CLOCK_WARN_MS (clock_offset) or back (clock_offset_ok). 0, or
 * the error of rec_db (SL_EPG, SL_EVERSION) with c unchanged. One thread at a time. */
int rec_clock_read(rec_db_t *db, struct rec_clock *c, sl_err_t *err);

typedef struct rec_maint rec_maint_t;

/* Start the maintenance thread (its connection is made lazily). cfg and clock (read once
 * already, updated by the thread from now on) are borrowed and must outlive rec_maint_stop.
 * NULL with err if the thread cannot start. */
rec_maint_t *rec_maint_start(const struct sl_config *cfg, struct rec_clock *clock, sl_err_t *err);

/* True (with err, NULL allowed) once a connection found a database this binary cannot write
 * (SL_EVERSION); the caller stops. */
bool rec_maint_fatal(rec_maint_t *m, sl_err_t *err);

/* Stop: cancel a running statement, join the thread, disconnect, free. NULL-safe. */
void rec_maint_stop(rec_maint_t *m);

#endif /* REC_MAINT_H */
