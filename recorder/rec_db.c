/*
 * rec_db: staging COPY + idempotent apply statements (see rec_db.h and sql/0002_history.sql).
 *
 * Why this shape: COPY is the fastest way in but cannot skip duplicates, and is not allowed in
 * pipeline mode; so rows go by binary COPY into a TEMP table (no WAL, no indexes, emptied at
 * COMMIT), and set-based statements move them on with ON CONFLICT. The attempt insert's
 * RETURNING list is the set of rows that are new to the history; every derived table is fed
 * from it, so a replayed batch costs one index probe per row and changes nothing.
 */
#include "recorder/rec_db.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_time.h"
#include "recorder/rec_agg.h"
#include "recorder/rec_db_int.h"

#define COPY_CHUNK              ((size_t)1 << 20) /* bytes per PQputCopyData call */
#define REC_DB_SAFE_WRITES      20 /* writes that use the safe apply after a duplicate */
#define REC_DB_CONFLICT_RETRIES 3  /* immediate retries after a deadlock/serialization error */

struct rec_db {
    char *dsn;                 /* libpq conninfo (owned) */
    PGconn *pg;                /* NULL = not connected */
    int64_t latency_window_h;  /* samples older than this are not inserted, hours */
    int64_t history_days;      /* attempts older than this are not inserted, days */
    int safe_writes;           /* writes left that use the safe apply variant (after a
                                  duplicate hit the fast one) */
    bool last_class40;         /* the last error was SQLSTATE class 40 (deadlock, serialization) */
    pthread_mutex_t mu;        /* guards cancel (rec_db_cancel comes from another thread) */
    PGcancel *cancel;          /* cancel handle of pg; NULL = not connected */
    bool has_pending;          /* pending_payloads exists (checked at connect) */
    struct rec_agg agg;        /* health inputs of the slice being written (fast apply) */
    enum rec_db_health health; /* where the health inputs come from (tests pin it) */
};

/* ==== SQL ==== */

static const char SQL_SESSION[] =
    "set statement_timeout = '120s'; set lock_timeout = '30s'; "
    "set idle_in_transaction_session_timeout = '300s'; "
    /* retention cuts (now() - N days) as the partition functions make them, in UTC: in a
     * zone with summer time they would be an hour apart twice a year */
    "set timezone = 'UTC'; "

    "create temp table if not exists rec_stage (" REC_STAGE_COLUMNS ") on commit delete rows; "
    "create temp table if not exists rec_hstage (" REC_HSTAGE_COLUMNS ") on commit delete rows; "
    "create temp table if not exists rec_fstage (" REC_FSTAGE_COLUMNS ") on commit delete rows";

/* BEGIN travels with the first COPY (one round trip less per write; PQexec stops at the COPY
 * and returns its result, an error of either statement otherwise). */
static const char SQL_COPY[] = "begin; copy rec_stage from stdin with (format binary)";
/* The same plus the recorder's per-endpoint health inputs (rec_agg), in one query. */
static const char SQL_COPY_AGG[] = "begin; copy rec_stage from stdin with (format binary); "
                                   "copy rec_hstage from stdin with (format binary); "
                                   "copy rec_fstage from stdin with (format binary)";

/*
 * The apply statement. $1 = latency window (hours), $2 = history retention (days). Returns one
 * row: attempts inserted, samples inserted, deliveries upserted. All CTEs see the snapshot taken
 * at statement start (so endpoint_health read in hc is the state before this batch, which the
 * consecutive-failure rule needs).
 * Two variants differ only in the attempt insert: "safe" skips rows already recorded (ON
 * CONFLICT DO NOTHING); "fast" inserts plainly and fails with unique_violation if any row is
 * already there. Normally every row is new, and the fast variant saves the separate conflict
 * pre-check and speculative insertion on every row (measured: the attempt insert took about
 * half the time); rec_db_write falls back to the safe variant when the fast one hits a
 * duplicate (re-reads after a crash or rebalance, duplicate records on the topic).
 */
/* deliveries_replaces of sql/0002_history.sql, written out (rec_db_int.h). */
#define REPLACES REC_DB_REPLACES_SQL

/* The win CTE computed in SQL from the rows the attempt insert returned: per key the batch's
 * winner (deliveries_replaces order: earliest delivered, else the greatest (ts, state)) and the
 * batch's aggregates; the window is ordered like the DISTINCT ON, so one sort serves both, and
 * the result comes out in key order. */
#define WIN_SQL                                                                                    \
    "  select distinct on (event_id, endpoint_id) *,"                                              \
    "         max(attempt) over k as attempts, min(ts) over k as first_seen,"                      \
    "         min(ts) filter (where state = 'delivered') over k as delivered_at,"                  \
    "         min(ts) filter (where state in ('retry_scheduled', 'dead_letter')"                   \
    "                           and attempt > 0) over k as first_failed_at,"                       \
    "         max(ts) filter (where state = 'dead_letter') over k as last_dead_at"                 \
    "    from known"                                                                               \
    "  window k as (partition by event_id, endpoint_id"                                            \
    "               order by (state = 'delivered') desc,"                                          \
    "                        case when state = 'delivered' then ts end asc, ts desc, state desc"   \
    "               rows between unbounded preceding and unbounded following)"                     \
    "   order by event_id, endpoint_id, (state = 'delivered') desc,"                               \
    "            case when state = 'delivered' then ts end asc, ts desc, state desc"

/* The endpoint_health inputs computed in SQL from the new rows: per endpoint the newest
 * success and failure (hb), the newest outcome (hl; ordered by (ts, state, attempt, event id),
 * a total order), and the failures to count (hc: newer than the newest success known after
 * this batch). rec_agg.c computes hb and hl and the candidate failures of hc in the recorder
 * by the same rules; tests/integration/test_rec_paths.c compares the two paths' tables. */
#define HEALTH_SQL                                                                                 \
    "), hb as ("                                                                                   \
    "  select endpoint_id,"                                                                        \
    "         max(ts) filter (where state = 'delivered') as ok_ts,"                                \
    "         max(ts) filter (where state in ('retry_scheduled', 'dead_letter')"                   \
    "                           and attempt > 0) as fail_ts"                                       \
    "    from known group by endpoint_id"                                                          \
    "), hl as ("                                                                                   \
    "  select distinct on (endpoint_id) endpoint_id, state, ts, http_status, err from known"       \
    "   order by endpoint_id, ts desc, state desc, attempt desc, event_id collate \"C\" desc"      \
    "), hc as (" /* failures to count: newer than the newest success known after this batch */     \
    "  select k.endpoint_id,"                                                                      \
    "         count(*) filter (where k.state in ('retry_scheduled', 'dead_letter')"                \
    "             and k.attempt > 0"                                                               \
    "             and k.ts > coalesce(greatest(h.last_success_at, b.ok_ts), '-infinity')) as n"    \
    "    from known k join hb b on b.endpoint_id = k.endpoint_id"                                  \
    "    left join endpoint_health h on h.endpoint_id = k.endpoint_id"                             \
    "   group by k.endpoint_id"

/* The same from the recorder's per-endpoint rows (rec_agg; fast apply only). rec_fstage holds
 * the failed attempts newer than the batch's newest success of their endpoint, so only the
 * comparison with the stored last_success_at is left. */
#define HEALTH_HSTAGE                                                                              \
    "), hb as (select endpoint_id, ok_ts, fail_ts from rec_hstage"                                 \
    "), hl as (select endpoint_id, state, ts, http_status, err from rec_hstage"                    \
    "), hc as ("                                                                                   \
    "  select b.endpoint_id,"                                                                      \
    "         count(f.ts) filter (where f.ts > coalesce(h.last_success_at, '-infinity')) as n"     \
    "    from rec_hstage b left join rec_fstage f on f.endpoint_id = b.endpoint_id"                \
    "    left join endpoint_health h on h.endpoint_id = b.endpoint_id"                             \
    "   group by b.endpoint_id"

#define APPLY_SQL(ON_CONFLICT, HEALTH)                                                             \
    "with ins as ("                                                                                \
    "  insert into delivery_attempts (event_id, endpoint_id, attempt, state, http_status, err,"    \
    "         msg, ts, created_at, latency_us, dns_us, conn_us, tls_us, ttfb_us, next_at, pod,"    \
    "         event_type)"                                                                         \
    "  select event_id, endpoint_id, attempt, state, http_status, err, msg, ts, created_at,"       \
    "         latency_us, dns_us, conn_us, tls_us, ttfb_us, next_at, pod, event_type"              \
    "    from rec_stage" /* expired on arrival: retention would drop it, and it must never come    \
                            back after that */                                                     \
    "   where ts >= now() - make_interval(days => $2::int)" ON_CONFLICT                            \
    "  returning event_id, endpoint_id, attempt, state, http_status, err, msg, ts, created_at,"    \
    "            latency_us, next_at, event_type"                                                  \
    "), known as (" /* quarantined records without an endpoint stay in delivery_attempts only */   \
    "  select * from ins where endpoint_id <> ''"                                                  \
    "), lat as ("                                                                                  \
    "  insert into endpoint_latency (endpoint_id, ts, event_id, attempt, latency_us, http_status)" \
    "  select endpoint_id, ts, event_id, attempt, latency_us, http_status from known"              \
    "   where http_status is not null and latency_us is not null"                                  \
    "     and state in ('delivered', 'retry_scheduled', 'dead_letter')"                            \
    "     and ts >= now() - make_interval(hours => $1::int)"                                       \
    "  returning 1"                                                                                \
    "), win as (" WIN_SQL "), dlv as ("                                                            \
    "  insert into deliveries as d (event_id, endpoint_id, event_type, state, attempts,"           \
    "         first_seen, last_update, created_at, delivered_at, first_failed_at,"                 \
    "         last_dead_at, next_attempt_at, last_status, last_error, last_msg)"                   \
    "  select w.event_id, w.endpoint_id, w.event_type, w.state, w.attempts, w.first_seen, w.ts,"   \
    "         w.created_at, w.delivered_at, w.first_failed_at, w.last_dead_at, w.next_at,"         \
    "         w.http_status, w.err, w.msg"                                                         \
    "    from win w" /* key order = lock order: concurrent writers cannot deadlock on each other's \
                        rows */                                                                    \
    "   order by w.event_id, w.endpoint_id"                                                        \
    "  on conflict (event_id, endpoint_id) do update set"                                          \
    "    event_type = coalesce(d.event_type, excluded.event_type),"                                \
    "    created_at = coalesce(d.created_at, excluded.created_at),"                                \
    "    attempts = greatest(d.attempts, excluded.attempts),"                                      \
    "    first_seen = least(d.first_seen, excluded.first_seen),"                                   \
    "    delivered_at = least(d.delivered_at, excluded.delivered_at),"                             \
    "    first_failed_at = least(d.first_failed_at, excluded.first_failed_at),"                    \
    "    last_dead_at = greatest(d.last_dead_at, excluded.last_dead_at),"                          \
    "    state = case when " REPLACES "                 then excluded.state else d.state end,"     \
    "    last_update = case when " REPLACES                                                        \
    "                 then excluded.last_update else d.last_update end,"                           \
    "    next_attempt_at = case when " REPLACES "                 then excluded.next_attempt_at"   \
    "                 else d.next_attempt_at end,"                                                 \
    "    last_status = case when " REPLACES                                                        \
    "                 then excluded.last_status else d.last_status end,"                           \
    "    last_error = case when " REPLACES                                                         \
    "                 then excluded.last_error else d.last_error end,"                             \
    "    last_msg = case when " REPLACES                                                           \
    "                 then excluded.last_msg else d.last_msg end,"                                 \
    "    recorded_at = now()"                                                                      \
    "  returning event_id, endpoint_id, last_dead_at"                                              \
    "), res as (" /* dead letters resolved by this batch: keys that died before and are now        \
                   * delivered later (RETURNING shows the row after the upsert, so an earlier      \
                   * death is known without a probe) */                                            \
    "  update dead_letters dl set resolved_at = w.ts"                                              \
    "    from dlv r join win w on w.event_id = r.event_id and w.endpoint_id = r.endpoint_id"       \
    "   where r.last_dead_at is not null and w.state = 'delivered' and w.ts > r.last_dead_at"      \
    "     and dl.event_id = r.event_id and dl.endpoint_id = r.endpoint_id"                         \
    "     and dl.resolved_at is null and dl.dead_at < w.ts"                                        \
    "  returning 1" HEALTH /* hb, hl, hc: HEALTH_SQL or HEALTH_HSTAGE */                           \
    "), hlth as ("                                                                                 \
    "  insert into endpoint_health as h (endpoint_id, breaker_state, consecutive_failures,"        \
    "         last_outcome_state, last_outcome_at, last_status, last_error, last_success_at,"      \
    "         last_failure_at, updated_at)"                                                        \
    "  select b.endpoint_id,"                                                                      \
    "         case when l.state = 'delivered' then 'closed'"                                       \
    "              when l.state = 'deferred' and l.err = 'breaker_open' then 'open'"               \
    "              else 'unknown' end,"                                                            \
    "         c.n, l.state, l.ts, l.http_status, l.err, b.ok_ts, b.fail_ts, now()"                 \
    "    from hb b join hl l on l.endpoint_id = b.endpoint_id"                                     \
    "    join hc c on c.endpoint_id = b.endpoint_id"                                               \
    "   order by b.endpoint_id"                                                                    \
    "  on conflict (endpoint_id) do update set"                                                    \
    "    consecutive_failures = case"                                                              \
    "        when excluded.last_success_at > coalesce(h.last_success_at, '-infinity')"             \
    "        then excluded.consecutive_failures"                                                   \
    "        else h.consecutive_failures + excluded.consecutive_failures end,"                     \
    "    breaker_state = case"                                                                     \
    "        when (excluded.last_outcome_at, excluded.last_outcome_state) >"                       \
    "             (coalesce(h.last_outcome_at, '-infinity'),"                                      \
    "              coalesce(h.last_outcome_state, 'deferred'))"                                    \
    "         and excluded.breaker_state <> 'unknown'"                                             \
    "        then excluded.breaker_state else h.breaker_state end,"                                \
    "    last_outcome_state = case"                                                                \
    "        when (excluded.last_outcome_at, excluded.last_outcome_state) >"                       \
    "             (coalesce(h.last_outcome_at, '-infinity'),"                                      \
    "              coalesce(h.last_outcome_state, 'deferred'))"                                    \
    "        then excluded.last_outcome_state else h.last_outcome_state end,"                      \
    "    last_status = case"                                                                       \
    "        when (excluded.last_outcome_at, excluded.last_outcome_state) >"                       \
    "             (coalesce(h.last_outcome_at, '-infinity'),"                                      \
    "              coalesce(h.last_outcome_state, 'deferred'))"                                    \
    "        then excluded.last_status else h.last_status end,"                                    \
    "    last_error = case"                                                                        \
    "        when (excluded.last_outcome_at, excluded.last_outcome_state) >"                       \
    "             (coalesce(h.last_outcome_at, '-infinity'),"                                      \
    "              coalesce(h.last_outcome_state, 'deferred'))"                                    \
    "        then excluded.last_error else h.last_error end,"                                      \
    "    last_outcome_at = greatest(h.last_outcome_at, excluded.last_outcome_at),"                 \
    "    last_success_at = greatest(h.last_success_at, excluded.last_success_at),"                 \
    "    last_failure_at = greatest(h.last_failure_at, excluded.last_failure_at),"                 \
    "    updated_at = now()"                                                                       \
    ")"                                                                                            \
    " select (select count(*) from ins), (select count(*) from lat), (select count(*) from dlv),"  \
    "        (select count(*) from res)"

static const char SQL_APPLY_SAFE[] = APPLY_SQL("  on conflict do nothing", HEALTH_SQL);
static const char SQL_APPLY_FAST[] = APPLY_SQL("", HEALTH_SQL);
static const char SQL_APPLY_FAST_AGG[] = APPLY_SQL("", HEALTH_HSTAGE);

/*
 * Dead letters of the staged slice (run after the apply statement in the same transaction, so
 * the deliveries row, and its first_failed_at, already includes this batch). Newest per key; an
 * older or equal dead_at changes nothing. A dead letter whose delivery is already known to have
 * been delivered later (outcomes out of order) is born resolved. A dead letter that spent no
 * attempt (attempt 0: its endpoint was disabled or removed while it waited for a retry) keeps
 * the attempts its delivery had spent.
 */
static const char SQL_DEAD[] =
    "insert into dead_letters as dl (event_id, endpoint_id, event_type, payload, error_class,"
    "       last_status, last_msg, last_response, attempts, created_at, first_failed_at, dead_at,"
    "       resolved_at)"
    " select distinct on (s.event_id, s.endpoint_id)"
    "        s.event_id, s.endpoint_id, s.event_type, s.env, s.err, s.http_status, s.msg, s.resp,"
    "        case when s.attempt = 0 then coalesce(d.attempts, 0) else s.attempt end,"
    "        s.created_at, least(d.first_failed_at, s.ts), s.ts,"
    "        case when d.delivered_at > s.ts then d.delivered_at end"
    "   from rec_stage s"
    "   left join deliveries d on d.event_id = s.event_id and d.endpoint_id = s.endpoint_id"
    "  where s.state = 'dead_letter' and s.endpoint_id <> ''"
    "  order by s.event_id, s.endpoint_id, s.ts desc"
    " on conflict (event_id, endpoint_id) do update set"
    "    event_type = coalesce(excluded.event_type, dl.event_type),"
    "    payload = coalesce(excluded.payload, dl.payload),"
    "    error_class = excluded.error_class,"
    "    last_status = excluded.last_status,"
    "    last_msg = excluded.last_msg,"
    "    last_response = excluded.last_response,"
    "    attempts = excluded.attempts,"
    "    created_at = coalesce(dl.created_at, excluded.created_at),"
    "    first_failed_at = least(dl.first_failed_at, excluded.first_failed_at),"
    "    dead_at = excluded.dead_at,"
    "    replayed_at = null,"
    "    resolved_at = excluded.resolved_at,"
    "    recorded_at = now()"
    "  where excluded.dead_at > dl.dead_at";

/*
 * Delivery records of open retries (sql/0003_analysis.sql, pending_payloads): the env the
 * consumer sends on the outcome that moves a delivery into the Redis schedule, newest per key,
 * so `sluicectl retries rebuild` can restore the schedule after a Redis loss. Idempotent (only
 * a newer ts replaces); finished deliveries are purged by the maintenance thread.
 */
static const char SQL_PENDING[] =
    "insert into pending_payloads as p (event_id, endpoint_id, payload, attempt, ts)"
    " select distinct on (event_id, endpoint_id) event_id, endpoint_id, env, attempt, ts"
    "   from rec_stage"
    "  where state in ('retry_scheduled', 'deferred') and env is not null and endpoint_id <> ''"
    "  order by event_id, endpoint_id, ts desc"
    " on conflict (event_id, endpoint_id) do update"
    "    set payload = excluded.payload, attempt = excluded.attempt, ts = excluded.ts,"
    "        recorded_at = now()"
    "  where excluded.ts > p.ts";

/* The outcome_state labels in sort order, checked against rec_agg_states at connect. */
static const char SQL_STATES[] =
    "select enumlabel::text from pg_enum where enumtypid = 'outcome_state'::regtype"
    " order by enumsortorder";

/* Does this database have pending_payloads (sql/0003_analysis.sql)? */
static const char SQL_HAS_PENDING[] =
    "select (to_regclass('pending_payloads') is not null"
    "        and to_regprocedure('sluice_purge_pending_payloads(integer)') is not null)::int";

/* ==== Connection ==== */

static void notice_cb(void *arg, const char *msg)
{
    (void)arg;
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        n--;
    sl_debug(SL_DBG_DB, "db", "pg_notice", "%.*s", (int)n, msg);
}

rec_db_t *rec_db_new(const char *dsn, int64_t latency_window_h, int64_t history_days)
{
    rec_db_t *db = sl_xcalloc(1, sizeof(*db));
    db->dsn = sl_xstrdup(dsn);
    db->latency_window_h = latency_window_h;
    db->history_days = history_days;
    pthread_mutex_init(&db->mu, NULL);
    return db;
}

void rec_db_disconnect(rec_db_t *db)
{
    if (db && db->pg) {
        pthread_mutex_lock(&db->mu);
        PQfreeCancel(db->cancel);
        db->cancel = NULL;
        pthread_mutex_unlock(&db->mu);
        PQfinish(db->pg);
        db->pg = NULL;
    }
}

void rec_db_cancel(rec_db_t *db)
{
    char errbuf[256];
    pthread_mutex_lock(&db->mu);
    if (db->cancel && !PQcancel(db->cancel, errbuf, sizeof(errbuf)))
        sl_debug(SL_DBG_DB, "db", "cancel_failed", "could not cancel a statement: %s", errbuf);
    pthread_mutex_unlock(&db->mu);
}

void rec_db_destroy(rec_db_t *db)
{
    if (!db)
        return;
    rec_db_disconnect(db);
    rec_agg_fini(&db->agg);
    pthread_mutex_destroy(&db->mu);
    free(db->dsn);
    free(db);
}

void rec_db_set_health(rec_db_t *db, enum rec_db_health h)
{
    db->health = h;
}

bool rec_db_connected(const rec_db_t *db)
{
    return db->pg && PQstatus(db->pg) == CONNECTION_OK;
}

/* A libpq connection message as one line ("could not <what>: ..."): libpq splits its
 * messages over lines with tabs; log lines are single-line. */
static int conn_error(rec_db_t *db, const char *what, sl_err_t *err)
{
    const char *m = db->pg ? PQerrorMessage(db->pg) : "out of memory";
    char line[SL_ERR_MSG_MAX];
    size_t n = 0;
    bool space = false;
    for (const char *c = m; *c && n + 1 < sizeof(line); c++) {
        bool ws = *c == '\n' || *c == '\t' || *c == '\r' || *c == ' ';
        if (ws) {
            space = n > 0;
            continue;
        }
        if (space && n + 2 < sizeof(line))
            line[n++] = ' ';
        space = false;
        line[n++] = *c;
    }
    line[n] = '\0';
    return sl_err_set(err, SL_EPG, "could not %s: %s", what, line);
}

/*
 * Turn a failed result into SL_EINVAL (data rejected: SQLSTATE class 22 or 23, connection
 * fine) or SL_EPG, with SQLSTATE + primary message only (DETAIL may quote the row).
 */
static int result_error(rec_db_t *db, PGresult *res, const char *what, sl_err_t *err)
{
    db->last_class40 = false;
    if (!db->pg || PQstatus(db->pg) != CONNECTION_OK || !res)
        return conn_error(db, what, err);
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (!state)
        state = "";
    int code = (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0) ? SL_EINVAL : SL_EPG;
    db->last_class40 = strncmp(state, "40", 2) == 0;
    char why[256];
    return sl_err_set(err, code, "could not %s: %s", what,
                      sl_pg_reason(res, db->pg, why, sizeof(why)));
}

/* Run a command; 0 or an error (see result_error). */
static int exec_cmd(rec_db_t *db, const char *what, const char *sql, sl_err_t *err)
{
    PGresult *res = PQexec(db->pg, sql);
    int rc = 0;
    if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
        rc = result_error(db, res, what, err);
    PQclear(res);
    return rc;
}

/* The database's outcome_state labels against rec_agg_states: 0, SL_EVERSION (mismatch) or
 * SL_EPG (the query failed). */
static int check_states(rec_db_t *db, sl_err_t *err)
{
    PGresult *res = PQexec(db->pg, SQL_STATES);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        int rc = result_error(db, res, "read the outcome_state labels", err);
        PQclear(res);
        return rc;
    }
    const char *labels[REC_AGG_NSTATES + 1];
    int n = PQntuples(res);
    for (int i = 0; i < n && i <= REC_AGG_NSTATES; i++)
        labels[i] = PQgetvalue(res, i, 0);
    int rc = rec_agg_check_states(labels, (size_t)n, err);
    PQclear(res);
    return rc;
}

int rec_db_connect(rec_db_t *db, sl_err_t *err)
{
    if (rec_db_connected(db))
        return 0;
    rec_db_disconnect(db);
    db->pg = sl_pg_open(db->dsn, "sluice-recorder");
    if (!db->pg || PQstatus(db->pg) != CONNECTION_OK) {
        int rc = conn_error(db, "connect to postgresql", err);
        rec_db_disconnect(db);
        return rc;
    }
    PQsetNoticeProcessor(db->pg, notice_cb, NULL);
    pthread_mutex_lock(&db->mu);
    db->cancel = PQgetCancel(db->pg);
    pthread_mutex_unlock(&db->mu);
    int rc = exec_cmd(db, "prepare the recorder session", SQL_SESSION, err);
    if (rc == 0)
        rc = check_states(db, err);
    if (rc == 0) {
        PGresult *res = PQexec(db->pg, SQL_HAS_PENDING);
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
            rc = result_error(db, res, "look for pending_payloads", err);
        else
            db->has_pending = strcmp(PQgetvalue(res, 0, 0), "1") == 0;
        PQclear(res);
        if (rc == 0 && !db->has_pending)
            sl_debug(SL_DBG_DB, "db", "no_pending_payloads",
                     "no pending_payloads table (sql/0003): retry records are not kept");
    }
    /* The statements are not prepared: planning each batch costs a few ms, while a plan
     * cached when the history was empty (hash joins over whole tables) costs seconds per batch
     * once it is not (measured: dead letters from 0.07 to 2.5 s per batch within a minute).
     * Planning sees each table's current size even before autovacuum has analyzed it. */
    if (rc != 0) {
        /* a missing schema is not a data problem: report it as retriable; an outcome_state
         * this binary would write wrongly is final (SL_EVERSION) */
        if (rc != SL_EVERSION)
            rc = SL_EPG;
        if (err)
            err->code = rc;
        rec_db_disconnect(db);
        return rc;
    }
    return 0;
}

/* ==== Batch write ==== */

/* Send one COPY's data: header, len bytes of binary tuples at p, trailer, end. 0 or SL_EPG. */
static int copy_send(rec_db_t *db, const uint8_t *p, size_t len, sl_err_t *err)
{
    int ok = PQputCopyData(db->pg, (const char *)rec_copy_header, REC_COPY_HEADER_LEN) == 1;
    for (size_t off = 0; ok && off < len; off += COPY_CHUNK) {
        size_t n = len - off < COPY_CHUNK ? len - off : COPY_CHUNK;
        ok = PQputCopyData(db->pg, (const char *)p + off, (int)n) == 1;
    }
    if (ok)
        ok = PQputCopyData(db->pg, (const char *)rec_copy_trailer, REC_COPY_TRAILER_LEN) == 1;
    if (PQputCopyEnd(db->pg, ok ? NULL : "recorder aborted the copy") != 1)
        return conn_error(db, "end copy into the staging table", err);
    return ok ? 0 : conn_error(db, "send copy data", err);
}

/*
 * Run sql, a query string of nparts COPY ... FROM STDIN statements (after an optional BEGIN),
 * feeding part i's len[i] bytes of binary tuples at p[i] to the i-th COPY: one round trip for
 * all of them (the server runs the statements of a simple query one after the other, and libpq
 * reports each COPY's start as PGRES_COPY_IN). The transaction is open afterwards.
 */
static int copy_parts(rec_db_t *db,
                      const char *sql,
                      size_t nparts,
                      const uint8_t *const *p,
                      const size_t *len,
                      sl_err_t *err)
{
    PGresult *res = PQexec(db->pg, sql);
    if (PQresultStatus(res) != PGRES_COPY_IN) {
        int rc = result_error(db, res, "start copy into the staging table", err);
        PQclear(res);
        return rc;
    }
    PQclear(res);
    int rc = copy_send(db, p[0], len[0], err);
    size_t part = 1;
    while ((res = PQgetResult(db->pg)) != NULL) {
        ExecStatusType st = PQresultStatus(res);
        if (st == PGRES_COPY_IN) { /* the next COPY of the query string */
            PQclear(res);
            if (rc == 0 && part < nparts) {
                rc = copy_send(db, p[part], len[part], err);
            } else {
                if (PQputCopyEnd(db->pg, "recorder has no data for this copy") != 1)
                    rc = conn_error(db, "end copy into the staging table", err);
                else if (rc == 0)
                    rc = sl_err_set(err, SL_EPG,
                                    "could not copy into the staging tables: "
                                    "more copy statements than parts");
            }
            part++;
            continue;
        }
        if (rc == 0 && st != PGRES_COMMAND_OK)
            rc = result_error(db, res, "copy into the staging table", err);
        PQclear(res);
    }
    if (rc == 0 && part != nparts)
        rc = sl_err_set(err, SL_EPG, "could not copy into the staging tables: %zu of %zu copies",
                        part, nparts);
    return rc;
}

static int64_t int_value(PGresult *res, int col)
{
    const char *v = PQgetvalue(res, 0, col);
    return v ? strtoll(v, NULL, 10) : 0;
}

/* One attempt at writing the slice with the given apply variant, in one transaction. */
static int write_once(rec_db_t *db,
                      bool safe,
                      bool agg,
                      const uint8_t *p,
                      size_t len,
                      size_t n_dead,
                      size_t n_pending,
                      struct rec_db_stats *s,
                      bool *duplicate,
                      sl_err_t *err)
{
    PGresult *res = NULL;
    *duplicate = false;
    int64_t t0 = sl_mono_us();
    const uint8_t *parts[3] = {p, db->agg.hout.data, db->agg.fout.data};
    const size_t lens[3] = {len, db->agg.hout.len, db->agg.fout.len};
    int rc = copy_parts(db, agg ? SQL_COPY_AGG : SQL_COPY, agg ? 3 : 1, parts, lens, err);
    int64_t t1 = sl_mono_us();
    s->copy_us = t1 - t0;
    if (rc == 0) {
        char hours[24];
        char days[24];
        (void)snprintf(hours, sizeof(hours), "%lld", (long long)db->latency_window_h);
        (void)snprintf(days, sizeof(days), "%lld", (long long)db->history_days);
        const char *params[2] = {hours, days};
        const char *sql = safe ? SQL_APPLY_SAFE : agg ? SQL_APPLY_FAST_AGG : SQL_APPLY_FAST;
        res = PQexecParams(db->pg, sql, 2, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 || PQnfields(res) != 4) {
            const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            *duplicate = !safe && state && strcmp(state, "23505") == 0;
            rc = result_error(db, res, "apply the batch", err);
        } else {
            s->attempts = int_value(res, 0);
            s->samples = int_value(res, 1);
            s->deliveries = int_value(res, 2);
            s->resolved = int_value(res, 3);
        }
        PQclear(res);
    }
    int64_t t2 = sl_mono_us();
    s->apply_us = t2 - t1;
    if (rc == 0 && n_dead > 0) {
        res = PQexecParams(db->pg, SQL_DEAD, 0, NULL, NULL, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            rc = result_error(db, res, "record dead letters", err);
        else
            s->dead = strtoll(PQcmdTuples(res), NULL, 10);
        PQclear(res);
    }
    if (rc == 0 && n_pending > 0 && db->has_pending) {
        res = PQexecParams(db->pg, SQL_PENDING, 0, NULL, NULL, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            rc = result_error(db, res, "record pending payloads", err);
        else
            s->pending = strtoll(PQcmdTuples(res), NULL, 10);
        PQclear(res);
    }
    int64_t t3 = sl_mono_us();
    s->dead_us = t3 - t2;
    if (rc == 0)
        rc = exec_cmd(db, "commit the batch", "commit", err);
    s->commit_us = sl_mono_us() - t3;
    if (rc != 0) {
        if (rec_db_connected(db)) {
            res = PQexec(db->pg, "rollback");
            PQclear(res);
        } else {
            rec_db_disconnect(db);
        }
    }
    return rc;
}

int rec_db_write(rec_db_t *db,
                 const struct rec_batch *b,
                 size_t lane,
                 size_t from,
                 size_t to,
                 struct rec_db_stats *st,
                 sl_err_t *err)
{
    int rc = rec_db_connect(db, err);
    if (rc != 0)
        return rc;
    size_t len = 0;
    size_t n_dead = 0;
    size_t n_pending = 0;
    const uint8_t *p = rec_batch_slice(b, lane, from, to, &len, &n_dead, &n_pending);
    struct rec_db_stats s = {0};
    bool duplicate = false;
    if (db->health == REC_DB_HEALTH_AGG)
        db->safe_writes = 0;
    bool safe = db->safe_writes > 0;
    bool agg = false;
    if (!safe && db->health != REC_DB_HEALTH_SQL) {
        /* Per-delivery rows computed here instead of in SQL when the retention filter cannot
         * drop any row (a day's margin for the clocks): rec_agg.h. */
        int64_t limit_ms = sl_now_ms() - (db->history_days - 1) * 86400000LL;
        if (rec_agg_build(&db->agg, b, lane, from, to, limit_ms, &agg) != 0)
            agg = false;
    }
    for (int attempt = 0;; attempt++) {
        memset(&s, 0, sizeof(s));
        rc = write_once(db, safe, agg && !safe, p, len, n_dead, n_pending, &s, &duplicate, err);
        if (rc != 0 && duplicate && !safe) {
            /* Some rows are already recorded: redo with the safe variant, and keep using it
             * for a while (a re-read after a crash or rebalance spans several batches). */
            sl_debug(SL_DBG_DB, "db", "batch_has_duplicates", "re-applying with conflict checks");
            db->safe_writes = REC_DB_SAFE_WRITES;
            safe = true;
            continue;
        }
        /* A deadlock or serialization failure with another writer (two recorders while a
         * rebalance settles): the transaction was rolled back, try again at once. */
        if (rc != 0 && db->last_class40 && attempt < REC_DB_CONFLICT_RETRIES)
            continue;
        break;
    }
    if (rc != 0)
        return rc;
    if (safe && db->safe_writes > 0)
        db->safe_writes--;
    s.agg = agg && !safe;
    if (st)
        *st = s;
    return 0;
}

/* ==== Maintenance ==== */

/* Run a one-row, one-integer-column query with integer parameters; connect first if needed. */
static int query_int(rec_db_t *db,
                     const char *what,
                     const char *sql,
                     int nparams,
                     const int64_t *params,
                     int64_t *out,
                     sl_err_t *err)
{
    int rc = rec_db_connect(db, err);
    if (rc != 0)
        return rc;
    char buf[4][24];
    const char *pv[4];
    for (int i = 0; i < nparams && i < 4; i++) {
        (void)snprintf(buf[i], sizeof(buf[i]), "%lld", (long long)params[i]);
        pv[i] = buf[i];
    }
    PGresult *res = PQexecParams(db->pg, sql, nparams, NULL, pv, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 || PQnfields(res) != 1) {
        rc = result_error(db, res, what, err);
        if (!rec_db_connected(db))
            rec_db_disconnect(db);
    } else if (out) {
        *out = int_value(res, 0);
    }
    PQclear(res);
    return rc;
}

int rec_db_partitions(rec_db_t *db,
                      int64_t days_ahead,
                      int64_t history_days,
                      int64_t latency_hours,
                      int64_t *created,
                      int64_t *dropped,
                      sl_err_t *err)
{
    const int64_t drop_p[2] = {history_days, latency_hours};
    int rc = query_int(db, "drop old partitions", "select sluice_drop_old_partitions($1, $2)", 2,
                       drop_p, dropped, err);
    if (rc == 0)
        rc = query_int(db, "create partitions", "select sluice_ensure_partitions($1)", 1,
                       &days_ahead, created, err);
    return rc;
}

int rec_db_purge(
    rec_db_t *db, enum rec_purge what, int64_t days, int64_t limit, int64_t *deleted, sl_err_t *err)
{
    const int64_t p[2] = {days, limit};
    if (what == REC_PURGE_PENDING || what == REC_PURGE_REPLAY_LOG) {
        /* both come with sql/0003 (has_pending checks for it) */
        int rc = rec_db_connect(db, err);
        if (rc != 0 || !db->has_pending) {
            if (deleted)
                *deleted = 0;
            return rc;
        }
        if (what == REC_PURGE_REPLAY_LOG)
            return query_int(db, "purge the expired replay journal",
                             "select sluice_purge_replay_log($1, $2)", 2, p, deleted, err);
        return query_int(db, "purge finished pending payloads",
                         "select sluice_purge_pending_payloads($1)", 1, &limit, deleted, err);
    }
    if (what == REC_PURGE_DEAD_LETTERS)
        return query_int(db, "purge expired dead letters",
                         "select sluice_purge_dead_letters($1, $2)", 2, p, deleted, err);
    return query_int(db, "purge expired deliveries", "select sluice_purge_deliveries($1, $2)", 2, p,
                     deleted, err);
}

int rec_db_oldest_undelivered(rec_db_t *db, int64_t *age_s, sl_err_t *err)
{
    return query_int(db, "oldest undelivered",
                     "select coalesce(floor(extract(epoch from now() - min(created_at))), 0)::int8"
                     " from deliveries where state in ('retry_scheduled', 'deferred')",
                     0, NULL, age_s, err);
}

int rec_db_clock_ms(rec_db_t *db, int64_t *ms, sl_err_t *err)
{
    return query_int(db, "read the database clock",
                     "select floor(extract(epoch from clock_timestamp()) * 1000)::int8", 0, NULL,
                     ms, err);
}

int rec_db_refresh_health(rec_db_t *db, int64_t window_h, int64_t *endpoints, sl_err_t *err)
{
    return query_int(db, "refresh endpoint health", "select sluice_refresh_endpoint_health($1)", 1,
                     &window_h, endpoints, err);
}
