/*
 * rec_agg: the endpoint_health inputs of a batch slice, computed in the recorder instead of SQL.
 *
 * The apply statement (rec_db) updates one endpoint_health row per endpoint of a write from the
 * attempts the write inserted: the newest success and failure (CTE hb), the newest outcome (hl)
 * and the failures to add to consecutive_failures (hc: failed attempts newer than the newest
 * success, the stored one included). In SQL that is two aggregations, a sort and a join over
 * every row of the write. When every row of a slice is new (the fast apply, which fails on any
 * duplicate), the rows the insert returns are exactly the slice's rows, so the same inputs can
 * be computed here from the encoded COPY tuples and sent with the stage rows as two small COPYs
 * (REC_HSTAGE_COLUMNS: one tuple per endpoint; REC_FSTAGE_COLUMNS: one per candidate failure).
 *
 * The same rules as the SQL (HEALTH_SQL in rec_db.c); tests/integration/test_rec_paths.c
 * writes randomized batches through both and compares the resulting tables row by row:
 *   - rows with endpoint id '' (quarantined without one) are left out;
 *   - ok_ts = max(ts) of delivered; fail_ts = max(ts) of retry_scheduled/dead_letter with
 *     attempt > 0 (a failed attempt);
 *   - the newest outcome by (ts, state, attempt, event id), state in the outcome_state enum's
 *     sort order (rec_agg_states, checked against PostgreSQL's at connect), event ids as
 *     bytes (collation "C"): a total order over an endpoint's rows, as hl's ORDER BY;
 *   - the failed attempts newer than ok_ts (all of them when the slice has no success): the
 *     statement counts those newer than the stored last_success_at, which is what hc counts.
 * The SQL drops rows older than the history retention before aggregating; rec_agg cannot see
 * PostgreSQL's clock, so it reports a slice with any row within a day of the retention limit
 * as not eligible, and the caller keeps the SQL path for it.
 *
 * Measured on 2,500-row lane writes (PostgreSQL backend CPU): the per-endpoint SQL cost about
 * 5 µs per outcome; the two extra COPYs and the remaining statement about 1 µs. The same was
 * tried for the deliveries winner and aggregates (the win CTE): the wider COPY it needs cost as
 * much as the sort and window it saved, so that stays in SQL.
 *
 * thread: any; a struct rec_agg is used by one thread at a time (one per write lane).
 */
#ifndef REC_AGG_H
#define REC_AGG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"
#include "recorder/rec_batch.h"

/* Per endpoint of the slice: newest success and failure, and the newest outcome by (ts, state)
 * (names as the hb / hl CTEs'). */
#define REC_HSTAGE_COLUMNS                                                                         \
    "endpoint_id text collate \"C\", ok_ts timestamptz, fail_ts timestamptz, "                     \
    "state outcome_state, ts timestamptz, http_status int2, err text"
#define REC_HSTAGE_NCOLS 7

/* The failed attempts (retry_scheduled / dead_letter, attempt > 0) newer than their endpoint's
 * newest success in the slice: the only ones consecutive_failures may count (the hc CTE). */
#define REC_FSTAGE_COLUMNS "endpoint_id text collate \"C\", ts timestamptz"
#define REC_FSTAGE_NCOLS   2

/* The outcome_state labels in PostgreSQL's sort order (sql/0002_history.sql): rec_agg ranks
 * states by their index here, and the recorder writes states by these names. */
#define REC_AGG_NSTATES 7
extern const char *const rec_agg_states[REC_AGG_NSTATES];

/*
 * Check the outcome_state labels of a database, pg (n labels in enumsortorder; borrowed),
 * against rec_agg_states: same labels in the same order. Returns 0, or SL_EVERSION with err
 * naming the first difference (a schema this binary cannot write correctly).
 */
int rec_agg_check_states(const char *const *pg, size_t n, sl_err_t *err);

/* Scratch space reused across slices (caller-allocated; zero-initialise, then rec_agg_fini). */
struct rec_agg {
    struct rec_agg_row *rows; /* one per row of the slice (opaque, rec_agg.c) */
    size_t cap;               /* entries allocated in rows */
    struct sl_buf hout;       /* REC_HSTAGE tuples of the last rec_agg_build (one per endpoint) */
    size_t endpoints;         /* tuples in hout */
    struct sl_buf fout;       /* REC_FSTAGE tuples */
    size_t failures;          /* tuples in fout */
};

/* Free the scratch space. NULL-safe; the struct may be reused after it. */
void rec_agg_fini(struct rec_agg *a);

/*
 * Build the health inputs of rows [from, to) of lane of b (from < to <= lanes[lane].n) into
 * a->hout and a->fout (binary COPY tuples, no header/trailer; in endpoint order).
 * min_ts_unix_ms: rows with an endpoint id whose ts is older than this make the slice not
 * eligible (pass the history retention limit plus a day's margin). Returns 0 with *eligible
 * set, or SL_EDECODE if a tuple does not have the stage layout (a bug; the caller falls back to
 * SQL).
 */
int rec_agg_build(struct rec_agg *a,
                  const struct rec_batch *b,
                  size_t lane,
                  size_t from,
                  size_t to,
                  int64_t min_ts_unix_ms,
                  bool *eligible);

#endif /* REC_AGG_H */
