/*
 * rec_loop: consume -> batch -> one PostgreSQL transaction -> store offsets (see rec_loop.h).
 *
 * State machine of the batch:
 *   filling  records are added until recorder_batch rows, recorder_batch_max_bytes, or
 *            recorder_flush_ms after the first record;
 *   flushing the batch is handed to the write lanes (one thread and connection each, rec_db_write
 *            per lane; on a data error a lane is bisected with an explicit stack of ranges until
 *            each rejected row is isolated and skipped, its record quarantined once the rest
 *            committed) and a second batch starts filling
 *            while they run (double buffering: decoding and Kafka fetches overlap the
 *            PostgreSQL work). At most one batch is being written at a time, and batches are
 *            committed and their offsets stored in consumption order: the next batch is handed
 *            over only after the previous one committed and its offsets were stored;
 *   blocked  the write failed for another reason (PostgreSQL down, schema missing, ...): the
 *            assignment is paused, polling continues (heartbeats, rebalances), the write is
 *            retried at growing intervals; on success offsets are stored and the partitions we
 *            paused are resumed.
 * Pause bookkeeping (c-apis.md §1.4): a pause belongs to the partition object and survives an
 * unassign, and resuming a partition that is not paused is buggy in 2.0.2; so we keep the exact
 * list we paused, resume only that list, and do so before giving partitions up on revoke.
 */
#include "recorder/rec_loop.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_bounded.h"
#include "common/sl_kafka.h"
#include "common/sl_kstats.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_metrics.h"
#include "common/sl_probe.h"
#include "common/sl_record.h"
#include "common/sl_registry.h"
#include "common/sl_time.h"
#include "recorder/rec_batch.h"
#include "recorder/rec_db.h"
#include "recorder/rec_maint.h"

#define POLL_MAX_MS        100   /* longest single consumer poll, ms */
#define BAD_LOG_WINDOW_MS  10000 /* bad-record log rate limit window, ms */
#define BAD_LOG_PER_WINDOW 10    /* bad-record lines per window before suppressing */
#define BISECT_DEPTH       64    /* range stack entries (log2 of any batch size + 1 suffices) */
#define REFETCH_MS         10000 /* reading rejected rows' records again, all of a batch's, ms */
#define WRITE_CHECK_MS     5     /* longest poll while a batch is being written, ms */
#define QUARANTINE_FLUSH_MS                                                                        \
    10000 /* how long a batch's commit waits for the quarantine's                                  \
             acknowledgements before the recorder stops, ms */

#define KSTATS_INTERVAL_MS 5000 /* librdkafka statistics (lag metrics), when metrics are on */
#define CLOSE_RESERVE_MS                                                                           \
    3000 /* SIGTERM: the last writes end this long before                                          \
            shutdown_timeout_ms, for the commit and leaving the group */

/* The recorder's series (docs/METRICS.md); registered by rec_loop_new. */
static struct {
    sl_counter_t *records, *batches, *db_errors, *quarantined, *rejected, *disables_refused;
    sl_counter_t *rows_deliveries, *rows_attempts, *rows_latency, *rows_dead;
    sl_histo_t *batch_duration;
} rm;

static void collect_lag(struct sl_buf *out, void *arg)
{
    (void)arg;
    sl_metrics_write_head(out, "sluice_recorder_lag_records", "gauge",
                          "The recorder's consumer-group lag over all its partitions (NaN "
                          "while some partition's lag is not known).");
    bool known = false;
    int64_t lag = sl_kstats_total_lag(NULL, &known);
    /* a sum that leaves partitions out (Kafka unreachable, nothing committed yet) is not
     * the lag: NaN says unknown, where 0 said all caught up */
    sl_metrics_write_sample(out, "sluice_recorder_lag_records", NULL,
                            known && sl_kstats_unknown() == 0 ? (double)lag : NAN);
}

static void metrics_init(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    sl_metrics_set_process("sluice-recorder");
    rm.records =
        sl_metric_counter("sluice_recorder_records_total", "Outcome records consumed.", NULL);
    static const char RHELP[] = "Rows written, by table.";
    rm.rows_deliveries =
        sl_metric_counter("sluice_recorder_rows_total", RHELP, "table=\"deliveries\"");
    rm.rows_attempts =
        sl_metric_counter("sluice_recorder_rows_total", RHELP, "table=\"delivery_attempts\"");
    rm.rows_latency =
        sl_metric_counter("sluice_recorder_rows_total", RHELP, "table=\"endpoint_latency\"");
    rm.rows_dead = sl_metric_counter("sluice_recorder_rows_total", RHELP, "table=\"dead_letters\"");
    rm.batches = sl_metric_counter("sluice_recorder_batches_total", "Batches committed.", NULL);
    rm.batch_duration =
        sl_metric_histo("sluice_recorder_batch_duration_seconds",
                        "Time to write and commit one batch (all its lanes), seconds.", NULL);
    rm.db_errors =
        sl_metric_counter("sluice_recorder_db_errors_total",
                          "Batch writes that failed (PostgreSQL unavailable; retried).", NULL);
    rm.quarantined = sl_metric_counter(
        "sluice_recorder_quarantined_total",
        "Outcome records that could not be decoded, moved to the quarantine topic.", NULL);
    rm.disables_refused = sl_metric_counter(
        "sluice_recorder_disables_refused_total",
        "Disable requests from consumers the registry refused for good (dropped, logged).", NULL);
    rm.rejected = sl_metric_counter(
        "sluice_recorder_rejected_total",
        "Outcome rows PostgreSQL rejected (logged, their records quarantined).", NULL);
    sl_metrics_collector(collect_lag, NULL);
}

/* A consumer asked the registry to disable an endpoint (an outcome with state "disabled"). */
struct disable_req {
    char id[SL_ENDPOINT_ID_MAX + 1]; /* endpoint id */
    char reason[SL_REASON_MAX + 1];  /* why (the outcome's msg, or its error class) */
    int64_t ts_ms;                   /* when it was asked, unix ms */
    bool republish;                  /* committed in the registry, not published: publish the
                                        endpoint's state again (sl_reg_republish) */
};

/* One lane's share of a batch write; runs on its own thread when several lanes have rows. */
struct lane_job {
    const struct rec_batch *b;    /* borrowed, read-only while the job runs */
    rec_db_t *db;                 /* this lane's connection */
    size_t lane;                  /* lane index */
    atomic_int *done;             /* incremented when the job has finished (borrowed) */
    int rc;                       /* OUT: 0, SL_EPG or SL_EVERSION (see rec_db.h) */
    sl_err_t err;                 /* OUT: reason when rc != 0 */
    int64_t rows;                 /* OUT: rows written */
    int64_t attempts;             /* OUT: delivery_attempts rows new to the history */
    int64_t rejected;             /* OUT: rows skipped because PostgreSQL rejected them */
    struct rec_rejected *skipped; /* OUT: those rows (owned; freed by write_join) */
};

/* A row PostgreSQL rejected: its record is quarantined once the rest of its batch committed. */
struct rec_rejected {
    int32_t partition;        /* Kafka partition of the record */
    int64_t offset;           /* Kafka offset of the record */
    char why[SL_ERR_MSG_MAX]; /* SQLSTATE and primary message */
};

struct rec_loop {
    const struct sl_config *cfg;         /* borrowed */
    rd_kafka_t *rk;                      /* consumer */
    rec_db_t *db[REC_MAX_LANES];         /* one PostgreSQL connection per write lane */
    rec_maint_t *maint;                  /* maintenance thread (own connection) */
    size_t nlanes;                       /* lanes (= connections) in use */
    struct rec_batch bufs[2];            /* the two batches (double buffering) */
    struct rec_batch *batch;             /* the batch being filled (one of bufs) */
    struct rec_batch *wbatch;            /* the batch being written, or waiting for a retry after a
                                            failed write (the other of bufs); NULL = none */
    bool writing;                        /* lane jobs are running on wbatch */
    int64_t write_started_us;            /* when the write of wbatch started (mono us) */
    bool abandoned;                      /* leaving the group outlived shutdown_timeout_ms */
    bool joined;                         /* an assignment came: the group was joined once */
    struct lane_job jobs[REC_MAX_LANES]; /* the lane jobs of wbatch */
    pthread_t threads[REC_MAX_LANES];    /* their threads (where started[]) */
    bool started[REC_MAX_LANES];         /* a thread runs jobs[i] */
    size_t njobs;                        /* lanes of wbatch with rows (jobs to wait for) */
    atomic_int jobs_done;                /* jobs finished so far */
    size_t wdisable;                     /* disable requests noted up to wbatch's last record */
    volatile sig_atomic_t stop;          /* set by rec_loop_stop */
    bool blocked;                        /* wbatch could not be written; assignment paused */
    rd_kafka_topic_partition_list_t *paused; /* exactly what we paused; NULL = nothing */
    int64_t retry_at_ms;                     /* mono ms of the next write attempt while blocked */
    int64_t backoff_ms;                      /* current retry delay, ms */
    bool db_down;                /* last PostgreSQL operation failed (for state-change logs) */
    bool fatal;                  /* the database cannot be written by this binary (SL_EVERSION):
                                    the loop stops, rec_loop_run returns fatal_err */
    sl_err_t fatal_err;          /* why, when fatal */
    int64_t next_stats_ms;       /* mono ms of the next recorder_stats line */
    int64_t bad_window_ms;       /* start of the current bad-record log window, mono ms */
    int bad_logged;              /* bad-record lines logged in the window */
    int64_t bad_suppressed;      /* bad-record lines suppressed in the window */
    struct rec_loop_stats st;    /* totals */
    struct disable_req *disable; /* waiting to be applied, one per endpoint */
    size_t n_disable;            /* entries in disable */
    size_t cap_disable;          /* its capacity */
    bool rows_done;            /* wbatch's rows are committed, some of its disable requests are not
                                  applied yet: retries apply them (the rows are not written again) */
    rd_kafka_t *qprod;         /* quarantine producer (made on first use) */
    int64_t q_sent;            /* records handed to it */
    _Atomic int64_t q_done;    /* acknowledged or failed (its reports) */
    _Atomic int64_t q_failed;  /* failed */
    char q_err[128];           /* the first failure's reason */
    PGconn *reg_pg;            /* registry connection (opened on first use) */
    struct sl_reg_pub reg_pub; /* registry publisher (opened on first use) */
    struct rec_clock clock;    /* PostgreSQL's clock against ours (read before intake) */
    struct rec_rejected *rej;  /* rows PostgreSQL rejected in the write just joined */
    size_t n_rej;              /* entries used in rej */
    size_t cap_rej;            /* its capacity */
    rd_kafka_t *refetch;       /* consumer that reads rejected rows' records again by offset,
                                  never joining its group (made on first use) */
    int beat;                  /* the loop's liveness beat (sl_probe) */
};

static size_t apply_disables(rec_loop_t *l, size_t upto);

/* ==== PostgreSQL availability (logged on state changes only) ==== */

static void db_failed(rec_loop_t *l, const char *what, const sl_err_t *err)
{
    if (!l->db_down) {
        l->db_down = true;
        SL_LOGKV(SL_LOG_WARN, "db", "history_db_unavailable",
                 ((struct sl_log_kv[]){SL_KV_S("during", what)}),
                 "postgresql unavailable, history paused: %s", err->msg);
    } else {
        sl_debug(SL_DBG_DB, "db", "history_db_retry_failed", "%s: %s", what, err->msg);
    }
}

static void db_ok(rec_loop_t *l)
{
    if (l->db_down) {
        l->db_down = false;
        sl_info("db", "history_db_available", "postgresql available again, history resumed");
    }
}

/* ==== Offsets, pause, resume ==== */

static void store_offsets(rec_loop_t *l, const struct rec_batch *b)
{
    if (b->nparts == 0)
        return;
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new((int)b->nparts);
    for (size_t i = 0; i < b->nparts; i++)
        rd_kafka_topic_partition_list_add(list, l->cfg->topic_outcomes, b->parts[i].partition)
            ->offset = b->parts[i].next;
    rd_kafka_resp_err_t e = rd_kafka_offsets_store(l->rk, list);
    for (int i = 0; i < list->cnt; i++) {
        if (list->elems[i].err != RD_KAFKA_RESP_ERR_NO_ERROR)
            SL_LOGKV(SL_LOG_WARN, "kafka", "offset_store_failed",
                     ((struct sl_log_kv[]){SL_KV_I("partition", list->elems[i].partition),
                                           SL_KV_I("offset", list->elems[i].offset)}),
                     "could not store offset (partition no longer assigned?): %s",
                     rd_kafka_err2str(list->elems[i].err));
    }
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR && list->cnt > 0 &&
        list->elems[0].err == RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_warn("kafka", "offset_store_failed", "could not store offsets: %s", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(list);
}

static void pause_all(rec_loop_t *l)
{
    if (l->paused)
        return;
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(l->rk, &a) != RD_KAFKA_RESP_ERR_NO_ERROR || !a)
        return;
    if (a->cnt == 0) {
        rd_kafka_topic_partition_list_destroy(a);
        return;
    }
    rd_kafka_pause_partitions(l->rk, a);
    l->paused = a;
    sl_info("kafka", "intake_paused", "intake paused on %d partition%s until the batch is written",
            a->cnt, a->cnt == 1 ? "" : "s");
}

static void resume_paused(rec_loop_t *l)
{
    if (!l->paused)
        return;
    rd_kafka_resume_partitions(l->rk, l->paused);
    sl_info("kafka", "intake_resumed", "intake resumed on %d partition%s", l->paused->cnt,
            l->paused->cnt == 1 ? "" : "s");
    rd_kafka_topic_partition_list_destroy(l->paused);
    l->paused = NULL;
}

/* ==== Batch write ==== */

static void
log_skipped(rec_loop_t *l, const char *event, int32_t partition, int64_t offset, const char *why)
{
    int64_t now = sl_mono_ms();
    if (now - l->bad_window_ms >= BAD_LOG_WINDOW_MS) {
        if (l->bad_suppressed > 0)
            sl_warn("recorder", "bad_outcomes_suppressed",
                    "%lld more skipped records not logged individually",
                    (long long)l->bad_suppressed);
        l->bad_window_ms = now;
        l->bad_logged = 0;
        l->bad_suppressed = 0;
    }
    if (l->bad_logged >= BAD_LOG_PER_WINDOW) {
        l->bad_suppressed++;
        return;
    }
    l->bad_logged++;
    SL_LOGKV(SL_LOG_WARN, "recorder", event,
             ((struct sl_log_kv[]){SL_KV_S("topic", l->cfg->topic_outcomes),
                                   SL_KV_I("partition", partition), SL_KV_I("offset", offset)}),
             "skipped outcome record: %s", why);
}

/*
 * Write every row of one lane. Data errors are bisected (explicit range stack) down to single
 * rows; a single row refused is tried once more, then skipped (quarantined). Sets job->rc to
 * 0 (everything written or skipped) or SL_EPG (try again later; sub-ranges already committed
 * are harmless to write again).
 */
static void lane_run(struct lane_job *job);

/* Write rows [from, to) of job's lane in one transaction, counting them when it commits.
 * Returns rec_db_write's code. */
static int write_range(struct lane_job *job, size_t from, size_t to)
{
    struct rec_db_stats ds;
    int rc = rec_db_write(job->db, job->b, job->lane, from, to, &ds, &job->err);
    if (rc != 0)
        return rc;
    job->rows += (int64_t)(to - from);
    job->attempts += ds.attempts;
    sl_counter_add(rm.rows_attempts, (uint64_t)ds.attempts);
    sl_counter_add(rm.rows_latency, (uint64_t)ds.samples);
    sl_counter_add(rm.rows_deliveries, (uint64_t)ds.deliveries);
    sl_counter_add(rm.rows_dead, (uint64_t)ds.dead);
    sl_debug(SL_DBG_DB, "db", "batch_written",
             "rows %zu new attempts %lld samples %lld deliveries %lld dead letters %lld "
             "resolved %lld pending %lld; "
             "copy %lld us apply %lld us dead %lld us commit %lld us",
             to - from, (long long)ds.attempts, (long long)ds.samples, (long long)ds.deliveries,
             (long long)ds.dead, (long long)ds.resolved, (long long)ds.pending,
             (long long)ds.copy_us, (long long)ds.apply_us, (long long)ds.dead_us,
             (long long)ds.commit_us);
    return 0;
}

static void *lane_main(void *arg)
{
    struct lane_job *job = arg;
    lane_run(job);
    atomic_fetch_add(job->done, 1);
    return NULL;
}

static void lane_run(struct lane_job *job)
{
    const struct rec_lane *ln = &job->b->lanes[job->lane];
    struct {
        size_t from, to;
    } stack[BISECT_DEPTH];
    int top = 0;
    job->rc = 0;
    stack[top].from = 0;
    stack[top].to = ln->n;
    top++;
    while (top > 0) {
        top--;
        size_t from = stack[top].from;
        size_t to = stack[top].to;
        int rc = write_range(job, from, to);
        /* A refusal can be passing: a row bound for a DEFAULT partition while the maintenance
         * thread attaches the partition that now owns its range waits for that lock, then
         * fails the default's constraint (SQLSTATE 23514). So a single row refused is tried
         * once more before it is quarantined; a bad row is refused again. */
        if (rc == SL_EINVAL && to - from == 1)
            rc = write_range(job, from, to);
        if (rc == 0)
            continue;
        if (rc != SL_EINVAL) {
            job->rc = rc == SL_EVERSION ? SL_EVERSION : SL_EPG;
            return;
        }
        if (to - from == 1) {
            job->skipped =
                sl_xrealloc(job->skipped, (size_t)(job->rejected + 1) * sizeof(*job->skipped));
            struct rec_rejected *rj = &job->skipped[job->rejected++];
            rj->partition = ln->idx[from].partition;
            rj->offset = ln->idx[from].offset;
            (void)snprintf(rj->why, SL_ERR_MSG_MAX, "%s", job->err.msg);
            continue;
        }
        size_t mid = from + (to - from) / 2;
        if (top + 2 > BISECT_DEPTH) { /* unreachable: depth <= log2(rows) + 1 */
            job->rc = sl_err_set(&job->err, SL_EPG, "bisection too deep");
            return;
        }
        stack[top].from = mid; /* processed second */
        stack[top].to = to;
        top++;
        stack[top].from = from; /* processed first */
        stack[top].to = mid;
        top++;
    }
}

/*
 * Start writing l->wbatch: one job per lane with rows, each on its own thread (lanes touch
 * disjoint rows, see rec_batch.h); a job whose thread cannot start runs here at once. Returns
 * without waiting; write_join() collects the results.
 */
static void write_start(rec_loop_t *l)
{
    l->write_started_us = sl_mono_us();
    atomic_store(&l->jobs_done, 0);
    l->njobs = 0;
    for (size_t i = 0; i < l->nlanes; i++) {
        memset(&l->jobs[i], 0, sizeof(l->jobs[i]));
        l->started[i] = false;
        l->jobs[i].b = l->wbatch;
        l->jobs[i].db = l->db[i];
        l->jobs[i].lane = i;
        l->jobs[i].done = &l->jobs_done;
        if (l->wbatch->lanes[i].n == 0)
            continue;
        l->njobs++;
        l->started[i] = pthread_create(&l->threads[i], NULL, lane_main, &l->jobs[i]) == 0;
        if (!l->started[i]) { /* no thread: run it here */
            sl_debug(SL_DBG_DB, "db", "lane_inline", "could not start a writer thread");
            lane_main(&l->jobs[i]);
        }
    }
    l->writing = true;
}

/* True when every job of the running write has finished (write_join will not block). */
static bool write_done(rec_loop_t *l)
{
    return (size_t)atomic_load(&l->jobs_done) >= l->njobs;
}

/* Wait for the lane jobs of l->wbatch and collect their results (stats, rejected rows).
 * Returns 0, or SL_EPG / SL_EVERSION with err from a failed lane (SL_EVERSION first). */
static int write_join(rec_loop_t *l, sl_err_t *err)
{
    int rc = 0;
    for (size_t i = 0; i < l->nlanes; i++) {
        struct lane_job *job = &l->jobs[i];
        if (l->wbatch->lanes[i].n == 0)
            continue;
        if (l->started[i])
            pthread_join(l->threads[i], NULL);
        l->started[i] = false;
        l->st.rows += job->rows;
        l->st.attempts += job->attempts;
        for (int64_t k = 0; k < job->rejected; k++) {
            if (l->n_rej == l->cap_rej) {
                l->cap_rej = l->cap_rej ? l->cap_rej * 2 : 16;
                l->rej = sl_xrealloc(l->rej, l->cap_rej * sizeof(*l->rej));
            }
            l->rej[l->n_rej++] = job->skipped[k];
        }
        free(job->skipped);
        job->skipped = NULL;
        if (job->rc != 0 && (rc == 0 || job->rc == SL_EVERSION)) {
            rc = job->rc;
            if (err)
                *err = job->err;
        }
    }
    l->writing = false;
    return rc;
}

/*
 * Finish the write of l->wbatch (waits for its lanes). On success: store its offsets, apply
 * the disable requests noted up to its last record, release it, resume intake if it was
 * blocked. On failure: keep it for a retry, pause intake, schedule the retry; on SL_EVERSION
 * (outcome_state mismatch): mark the loop fatal and stop it instead. Returns 0, SL_EPG or
 * SL_EVERSION.
 */
/* ==== Quarantine (invariant 9) ==== */

static void quarantine_report(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    rec_loop_t *l = opaque;
    if (m->err && atomic_fetch_add(&l->q_failed, 1) == 0)
        (void)snprintf(l->q_err, sizeof(l->q_err), "%s", rd_kafka_err2str(m->err));
    atomic_fetch_add(&l->q_done, 1);
}

/* Stop the loop: rec_loop_run returns err. */
static void stop_fatal_err(rec_loop_t *l, int code, const char *msg)
{
    l->fatal = true;
    (void)sl_err_set(&l->fatal_err, code, "%s", msg);
    l->stop = 1;
}

/*
 * Move an undecodable outcome record to topic_quarantine, its bytes unchanged, with the reason
 * and where it came from in headers (as the consumer quarantines a bad delivery record). Its
 * offset is stored only once Kafka acknowledged it (quarantine_settle).
 */
static void quarantine(rec_loop_t *l, const rd_kafka_message_t *rkm, const char *reason)
{
    sl_err_t err;
    if (!l->qprod) {
        rd_kafka_conf_t *conf = sl_kafka_conf_new(l->cfg, "recorder", &err);
        if (conf) {
            rd_kafka_conf_set_opaque(conf, l);
            l->qprod = sl_kafka_producer_new(l->cfg, "recorder", SL_KAFKA_LATENCY, conf,
                                             quarantine_report, &err);
        }
        if (!l->qprod) {
            sl_error("recorder", "quarantine_failed", "cannot quarantine a bad outcome record: %s",
                     err.msg);
            stop_fatal_err(l, SL_EKAFKA, "cannot quarantine a bad outcome record");
            return;
        }
    }
    char part[16], off[24];
    (void)snprintf(part, sizeof(part), "%d", (int)rkm->partition);
    (void)snprintf(off, sizeof(off), "%lld", (long long)rkm->offset);
    rd_kafka_headers_t *h = rd_kafka_headers_new(4);
    rd_kafka_header_add(h, "sluice-reason", -1, reason, (ssize_t)strlen(reason));
    rd_kafka_header_add(h, "sluice-source-topic", -1, l->cfg->topic_outcomes, -1);
    rd_kafka_header_add(h, "sluice-source-partition", -1, part, -1);
    rd_kafka_header_add(h, "sluice-source-offset", -1, off, -1);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        l->qprod, RD_KAFKA_V_TOPIC(l->cfg->topic_quarantine),
        RD_KAFKA_V_KEY(rkm->key, rkm->key_len), RD_KAFKA_V_VALUE(rkm->payload, rkm->len),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_headers_destroy(h);
        sl_error("recorder", "quarantine_failed", "cannot quarantine a bad outcome record: %s",
                 rd_kafka_err2str(e));
        stop_fatal_err(l, SL_EKAFKA, "cannot quarantine a bad outcome record");
        return;
    }
    l->q_sent++;
}

/* The consumer that reads rejected rows' records again: no group joined, nothing committed,
 * small fetches (it reads a batch's span of one partition at most). NULL with err. */
static rd_kafka_t *refetch_consumer(rec_loop_t *l, sl_err_t *err)
{
    if (l->refetch)
        return l->refetch;
    static const char *const extra[] = {"queued.min.messages", "1000", "queued.max.messages.kbytes",
                                        "4096", NULL};
    size_t glen = strlen(l->cfg->recorder_group) + sizeof(".refetch");
    char *group = sl_xmalloc(glen);
    (void)snprintf(group, glen, "%s.refetch", l->cfg->recorder_group);
    l->refetch = sl_kafka_reader_new(l->cfg, "recorder", group, extra, err);
    free(group);
    return l->refetch;
}

static int rej_cmp(const void *a, const void *b)
{
    const struct rec_rejected *x = a, *y = b;
    if (x->partition != y->partition)
        return x->partition < y->partition ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Quarantine the records of rej[0..n) (one partition, ascending offsets), read forward from
 * the first by the refetch consumer until deadline (mono ms). 0, or an error with err. */
static int refetch_partition(
    rec_loop_t *l, const struct rec_rejected *rej, size_t n, int64_t deadline, sl_err_t *err)
{
    rd_kafka_t *rk = refetch_consumer(l, err);
    if (!rk)
        return SL_EKAFKA;
    int32_t partition = rej[0].partition;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, l->cfg->topic_outcomes, partition)->offset =
        rej[0].offset;
    rd_kafka_resp_err_t e = rd_kafka_assign(rk, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        return sl_err_set(err, SL_EKAFKA, "could not assign partition %d: %s", (int)partition,
                          rd_kafka_err2str(e));
    size_t next = 0;
    while (next < n && !l->fatal) {
        int64_t now = sl_mono_ms();
        if (now >= deadline)
            break;
        sl_probe_beat(l->beat, now); /* alive: this is the loop's work */
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (!m->err && m->partition == partition) {
            if (m->offset > rej[next].offset) { /* gone from the topic (retention) */
                rd_kafka_message_destroy(m);
                break;
            }
            if (m->offset == rej[next].offset) {
                char reason[SL_ERR_MSG_MAX + 32];
                (void)snprintf(reason, sizeof(reason), "rejected by postgresql: %s", rej[next].why);
                quarantine(l, m, reason);
                next++;
            }
        }
        rd_kafka_message_destroy(m);
    }
    (void)rd_kafka_assign(rk, NULL);
    if (next == n || l->fatal)
        return l->fatal ? SL_EKAFKA : 0;
    return sl_err_set(err, SL_ETIMEDOUT, "partition %d offset %lld not read again within %d ms",
                      (int)partition, (long long)rej[next].offset, REFETCH_MS);
}

/*
 * The rows PostgreSQL rejected in the write just committed: each is logged and counted, and
 * its record read again from Kafka (its offset is not stored yet) and quarantined with
 * PostgreSQL's reason, as an undecodable record is; at most REFETCH_MS for all of them.
 * Returns 0, or SL_EKAFKA after stopping the loop when a record cannot be read again or
 * quarantined: the batch's offsets stay unstored, so the next start writes the batch and
 * quarantines the record again rather than losing it.
 */
static int quarantine_rejected(rec_loop_t *l)
{
    if (l->n_rej == 0)
        return 0;
    qsort(l->rej, l->n_rej, sizeof(*l->rej), rej_cmp);
    int64_t deadline = sl_mono_ms() + REFETCH_MS;
    int rc = 0;
    for (size_t i = 0; i < l->n_rej; i++) {
        l->st.poison++;
        sl_counter_inc(rm.rejected);
        log_skipped(l, "outcome_rejected_by_db", l->rej[i].partition, l->rej[i].offset,
                    l->rej[i].why);
    }
    for (size_t i = 0; i < l->n_rej && rc == 0;) {
        size_t k = i;
        while (k < l->n_rej && l->rej[k].partition == l->rej[i].partition)
            k++;
        sl_err_t err;
        if (refetch_partition(l, &l->rej[i], k - i, deadline, &err) != 0) {
            if (!l->fatal) {
                sl_error("recorder", "quarantine_failed",
                         "cannot read again an outcome record postgresql rejected: %s", err.msg);
                stop_fatal_err(l, SL_EKAFKA,
                               "cannot quarantine an outcome record postgresql rejected");
            }
            rc = SL_EKAFKA;
        }
        i = k;
    }
    l->n_rej = 0;
    return rc;
}

/*
 * Before a batch's offsets are stored: wait (bounded) until Kafka acknowledged every record
 * quarantined so far. Returns 0, or SL_EKAFKA after stopping the loop when one failed or did
 * not come back in time: the offsets stay unstored, so the next start reads those records
 * (and quarantines them) again rather than losing them.
 */
static int quarantine_settle(rec_loop_t *l)
{
    if (!l->qprod || atomic_load(&l->q_done) == l->q_sent)
        return atomic_load(&l->q_failed) == 0 ? 0 : SL_EKAFKA;
    (void)rd_kafka_flush(l->qprod, QUARANTINE_FLUSH_MS);
    int64_t left = l->q_sent - atomic_load(&l->q_done);
    if (left == 0 && atomic_load(&l->q_failed) == 0)
        return 0;
    sl_error("recorder", "quarantine_failed",
             "%lld of %lld outcome records sent to the quarantine topic were not acknowledged "
             "by Kafka within %d ms (%s); stopping without storing their offsets, so they are "
             "read again at the next start",
             (long long)(atomic_load(&l->q_failed) + left), (long long)l->q_sent,
             QUARANTINE_FLUSH_MS, l->q_err[0] ? l->q_err : "no answer");
    stop_fatal_err(l, SL_EKAFKA, "could not quarantine bad outcome records");
    return SL_EKAFKA;
}

/* A batch could not be finished: pause intake and retry it with a growing backoff. */
static void block_for_retry(rec_loop_t *l)
{
    if (!l->blocked) {
        l->blocked = true;
        l->backoff_ms = REC_RETRY_MIN_MS;
        pause_all(l);
    } else {
        l->backoff_ms = l->backoff_ms * 2 > REC_RETRY_MAX_MS ? REC_RETRY_MAX_MS : l->backoff_ms * 2;
    }
    l->retry_at_ms = sl_mono_ms() + l->backoff_ms;
}

static int batch_settle(rec_loop_t *l);

static int write_finish(rec_loop_t *l)
{
    sl_err_t err;
    sl_err_clear(&err);
    int rc = write_join(l, &err);
    if (rc == SL_EVERSION) { /* final: stop, the batch stays unstored (re-read by the next start) */
        l->fatal = true;
        l->fatal_err = err;
        l->stop = 1;
        return rc;
    }
    if (rc != 0) {
        l->n_rej = 0; /* the retry writes the batch again and finds them again */
        l->st.db_retries++;
        sl_counter_inc(rm.db_errors);
        db_failed(l, "write", &err);
        block_for_retry(l);
        return rc;
    }
    db_ok(l);
    if (quarantine_rejected(l) != 0)
        return SL_EKAFKA; /* stopping: the batch stays unstored (re-read by the next start) */
    return batch_settle(l);
}

/*
 * wbatch's rows are committed: quarantine acknowledged, then its disable requests applied,
 * and only then are its offsets stored. A request the registry cannot take now blocks the
 * batch (intake paused, retried with backoff) rather than being dropped with its offset.
 */
static int batch_settle(rec_loop_t *l)
{
    if (quarantine_settle(l) != 0)
        return SL_EKAFKA; /* stopping: the batch stays unstored (re-read by the next start) */
    size_t left = apply_disables(l, l->wdisable);
    if (left > 0) {
        if (!l->rows_done)
            sl_warn("registry", "disables_pending",
                    "%zu disable requests could not be applied to the registry: the batch "
                    "that carried them waits for them (history paused, retried)",
                    left);
        l->rows_done = true;
        l->wdisable = left; /* the failed ones are at the front */
        block_for_retry(l);
        return SL_EPG;
    }
    l->rows_done = false;
    store_offsets(l, l->wbatch);
    l->wdisable = 0;
    l->st.batches++;
    sl_counter_inc(rm.batches);
    sl_histo_observe_us(rm.batch_duration, sl_mono_us() - l->write_started_us);
    rec_batch_reset(l->wbatch);
    l->wbatch = NULL;
    if (l->blocked) {
        l->blocked = false;
        resume_paused(l);
    }
    return 0;
}

/* Retry the write of a batch that failed before, synchronously (only its disable requests
 * when its rows are committed already). Returns 0 or SL_EPG. */
static int write_retry(rec_loop_t *l)
{
    if (l->rows_done)
        return batch_settle(l);
    write_start(l);
    return write_finish(l);
}

/*
 * Hand the filling batch to the write lanes and start a new one. A write still running is
 * waited for first (batches commit in order); a batch waiting for a retry blocks the hand-over
 * (SL_EPG). Returns 0 (the write was started, not finished) or SL_EPG.
 */
static int flush(rec_loop_t *l)
{
    if (l->writing && write_finish(l) != 0)
        return SL_EPG;
    if (l->wbatch) /* a failed write not retried successfully yet */
        return SL_EPG;
    if (rec_batch_empty(l->batch))
        return 0;
    l->wbatch = l->batch;
    l->batch = l->batch == &l->bufs[0] ? &l->bufs[1] : &l->bufs[0];
    l->wdisable = l->n_disable;
    write_start(l);
    return 0;
}

/* Write everything held (a running write, a batch waiting for a retry, the filling batch) and
 * wait for it. Returns 0 when all of it committed (offsets stored), else SL_EPG. */
static int flush_wait(rec_loop_t *l)
{
    if (l->writing && write_finish(l) != 0)
        return SL_EPG;
    if (l->wbatch && write_retry(l) != 0)
        return SL_EPG;
    if (flush(l) != 0)
        return SL_EPG;
    if (l->writing && write_finish(l) != 0)
        return SL_EPG;
    return 0;
}

/* Records held in memory and not committed (both batches). */
static size_t held_records(const rec_loop_t *l)
{
    return l->batch->n_records + (l->wbatch ? l->wbatch->n_records : 0);
}

/* Drop everything held, uncommitted and unstored (the partitions' next reader re-reads it).
 * Waits for a running write first: its threads read the batch. */
static void drop_held(rec_loop_t *l)
{
    if (l->writing)
        (void)write_join(l, NULL);
    if (l->wbatch)
        rec_batch_reset(l->wbatch);
    l->wbatch = NULL;
    l->wdisable = 0;
    l->rows_done = false;
    l->n_rej = 0;
    rec_batch_reset(l->batch);
}

/* ==== Disable requests ==== */

/* Drop the trailing bytes of s that are an incomplete UTF-8 character (s was cut to fit). */
static void utf8_cut(char *s)
{
    size_t n = strlen(s);
    size_t i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) /* continuation bytes */
        i--;
    if (i == 0)
        return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (n - (i - 1) < need)
        s[i - 1] = '\0';
}
/* Remember a disable request found in a record (applied once its batch committed). The state
 * string is searched first so ordinary outcomes are not decoded twice. */
static void note_disable(rec_loop_t *l, const void *payload, size_t len)
{
    static const char marker[] = "\xa8"
                                 "disabled"; /* msgpack fixstr "disabled" */
    if (!payload || !memmem(payload, len, marker, sizeof(marker) - 1))
        return;
    struct sl_outcome o;
    if (sl_outcome_decode(payload, len, NULL, &o, NULL) == 0 && o.state == SL_OUTCOME_DISABLED &&
        o.ep) {
        /* one request per endpoint (every pod asks once): a later one replaces it in place */
        struct disable_req *d = NULL;
        for (size_t i = 0; i < l->n_disable && !d; i++)
            if (strcmp(l->disable[i].id, o.ep) == 0)
                d = &l->disable[i];
        if (d && d->ts_ms > (int64_t)o.ts_ms) {
            sl_outcome_fini(&o);
            return;
        }
        if (!d) {
            if (l->n_disable == l->cap_disable) {
                l->cap_disable = l->cap_disable ? 2 * l->cap_disable : 16;
                l->disable = sl_xrealloc(l->disable, l->cap_disable * sizeof(*l->disable));
            }
            d = &l->disable[l->n_disable++];
            d->republish = false;
        }
        (void)snprintf(d->id, sizeof(d->id), "%s", o.ep);
        int n = snprintf(d->reason, sizeof(d->reason), "disabled by sluice: %s",
                         o.msg ? o.msg : (o.err ? o.err : "requested by a consumer"));
        if (n >= (int)sizeof(d->reason)) /* cut: never inside a character (invalid UTF-8) */
            utf8_cut(d->reason);
        d->ts_ms = (int64_t)o.ts_ms;
    }
    sl_outcome_fini(&o);
}

/* The registry's database and publisher, opened when missing. False (logged) when either
 * cannot be had now: the disables wait for the next attempt. */
static bool registry_open(rec_loop_t *l)
{
    sl_err_t err;
    if (!l->reg_pg)
        l->reg_pg = sl_reg_db_open(l->cfg, &err);
    if (l->reg_pg && !l->reg_pub.rk && sl_reg_pub_open(l->cfg, &l->reg_pub, &err) != 0) {
        sl_warn("registry", "disable_deferred", "could not open the registry publisher: %s",
                err.msg);
        return false;
    }
    if (!l->reg_pg) {
        sl_warn("registry", "disable_deferred", "could not reach the registry: %s", err.msg);
        return false;
    }
    return true;
}

/* Whether asking the registry again may succeed after rc. Validation errors (the request or
 * the endpoint's row makes a record the registry will not write) are final; anything else (the
 * database or the endpoints topic unreachable or slow) may pass on a later attempt. */
static bool disable_may_pass(int rc)
{
    return rc != SL_EINVAL && rc != SL_ETOOBIG && rc != SL_EDECODE && rc != SL_EVERSION &&
           rc != SL_EMISSING && rc != SL_EDENIED;
}

/* Disable one endpoint as a consumer asked. True when done (or the endpoint is gone); false
 * to keep the request for the next attempt (a lost connection is dropped for a new one). */
static bool disable_one(rec_loop_t *l, struct disable_req *d)
{
    sl_err_t err;
    bool changed = false;
    int rc = d->republish ? sl_reg_republish(l->reg_pg, &l->reg_pub, d->id, &err)
                          : sl_reg_disable(l->reg_pg, &l->reg_pub, d->id, d->reason, d->ts_ms,
                                           &changed, &err);
    if (rc == SL_EKAFKA) /* committed, not published: doing it again would change nothing */
        d->republish = true;
    if (rc == 0 || rc == SL_ENOTFOUND) {
        if (changed)
            SL_LOGKV(SL_LOG_WARN, "registry", "endpoint_disabled",
                     ((struct sl_log_kv[]){SL_KV_S("endpoint_id", d->id)}),
                     "endpoint disabled at a consumer's request: %s", d->reason);
        return true;
    }
    if (!disable_may_pass(rc)) {
        /* the registry refuses this change whenever it is asked (the endpoint's row or the
         * request fails validation): holding the batch for it would stop the history for good */
        sl_counter_inc(rm.disables_refused);
        SL_LOGKV(SL_LOG_ERROR, "registry", "disable_refused",
                 ((struct sl_log_kv[]){SL_KV_S("endpoint_id", d->id)}),
                 "the registry refused to disable endpoint %s (%s): %s; the request is dropped, "
                 "disable it with sluicectl if it should be",
                 d->id, sl_err_name(rc), err.msg);
        return true;
    }
    sl_warn("registry", "disable_failed", "could not disable endpoint %s: %s", d->id, err.msg);
    if (PQstatus(l->reg_pg) != CONNECTION_OK) {
        PQfinish(l->reg_pg);
        l->reg_pg = NULL;
    }
    return false;
}

/* Apply the first upto requests (those of committed batches) to the registry (PostgreSQL, then
 * the endpoints topic, so every consumer stops); those that fail move to the front, the rest
 * (of batches not committed yet) follow. Returns how many of the first upto are left. */
static size_t apply_disables(rec_loop_t *l, size_t upto)
{
    if (upto > l->n_disable)
        upto = l->n_disable;
    if (upto == 0)
        return 0;
    if (!registry_open(l))
        return upto;
    size_t kept = 0;
    for (size_t i = 0; i < upto; i++) {
        /* once a failure dropped the connection, the rest wait for the next attempt: asked
         * without one, the registry answers SL_EINVAL, which reads as a final refusal */
        if (!l->reg_pg || !disable_one(l, &l->disable[i]))
            l->disable[kept++] = l->disable[i];
    }
    size_t left = kept;
    for (size_t i = upto; i < l->n_disable; i++) /* not committed yet */
        l->disable[kept++] = l->disable[i];
    l->n_disable = kept;
    return left;
}

/* ==== Kafka ==== */

/* On revoke: write the records held while the partitions are still ours (none when the
 * assignment is lost); what cannot be written is dropped for the next owner to re-read. */
static void revoke_write_held(rec_loop_t *l, rd_kafka_t *rk)
{
    if (!rd_kafka_assignment_lost(rk) && flush_wait(l) == 0) {
        sl_info("kafka", "batch_flushed_on_revoke", "batch written before giving up partitions");
        return;
    }
    sl_info("kafka", "batch_dropped_on_revoke",
            "batch of %zu records not written: the partitions' next owner re-reads them",
            held_records(l));
    drop_held(l);
}

static void rebalance_cb(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
    rec_loop_t *l = opaque;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        l->joined = true;
        rd_kafka_assign(rk, parts);
        sl_info("kafka", "partitions_assigned", "assigned %d partition%s", parts->cnt,
                parts->cnt == 1 ? "" : "s");
        return;
    }
    /* Revoke (eager: the whole assignment). Write what we hold while we still own it. */
    if (l->writing || l->wbatch || !rec_batch_empty(l->batch))
        revoke_write_held(l, rk);
    resume_paused(l); /* our pause would otherwise stick to the partition objects */
    l->blocked = false;
    rd_kafka_assign(rk, NULL);
    sl_info("kafka", "partitions_revoked", "revoked %d partition%s", parts->cnt,
            parts->cnt == 1 ? "" : "s");
}

static void handle_message(rec_loop_t *l, rd_kafka_message_t *rkm)
{
    if (rkm->err) {
        if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            sl_warn("kafka", "consume_error", "consume error: %s", rd_kafka_message_errstr(rkm));
        return;
    }
    sl_err_t err;
    sl_err_clear(&err);
    l->batch->clock_offset_ms = atomic_load(&l->clock.offset_ms);
    int rc = rec_batch_add(l->batch, rkm->payload, rkm->len, rkm->partition, rkm->offset,
                           sl_mono_ms(), &err);
    if (rc == SL_ESTATE && !l->blocked) {
        (void)flush(l);
        rc = rec_batch_add(l->batch, rkm->payload, rkm->len, rkm->partition, rkm->offset,
                           sl_mono_ms(), &err);
    }
    if (rc == SL_ESTATE) {
        /* Full and blocked (a record fetched before the pause took effect): do not drop it,
         * rewind its partition so it is fetched again after the resume. A rewind that fails
         * would leave a gap once a later offset of the partition is stored: stop instead,
         * storing nothing more (the next start reads the record again). */
        rd_kafka_resp_err_t e = rd_kafka_seek(rkm->rkt, rkm->partition, rkm->offset, 1000);
        if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
            SL_LOGKV(SL_LOG_ERROR, "kafka", "seek_failed",
                     ((struct sl_log_kv[]){SL_KV_I("partition", rkm->partition),
                                           SL_KV_I("offset", rkm->offset)}),
                     "could not rewind a partition while paused: %s", rd_kafka_err2str(e));
            stop_fatal_err(l, SL_EKAFKA, "could not rewind a partition to a record not recorded");
        }
        return;
    }
    l->st.records++;
    sl_counter_inc(rm.records);
    if (rc == 0)
        note_disable(l, rkm->payload, rkm->len);
    if (rc != 0) {
        l->st.bad++;
        log_skipped(l, "bad_outcome", rkm->partition, rkm->offset, err.msg);
        sl_counter_inc(rm.quarantined); /* a rejected row is counted as rejected instead */
        quarantine(l, rkm, err.msg);
    }
}

static void log_stats(const rec_loop_t *l, const char *event, const char *what)
{
    SL_LOGKV(SL_LOG_INFO, "recorder", event,
             ((struct sl_log_kv[]){SL_KV_I("records", l->st.records), SL_KV_I("bad", l->st.bad),
                                   SL_KV_I("rejected", l->st.poison), SL_KV_I("rows", l->st.rows),
                                   SL_KV_I("new_attempts", l->st.attempts),
                                   SL_KV_I("batches", l->st.batches),
                                   SL_KV_I("db_retries", l->st.db_retries)}),
             "%s", what);
}

/* ==== Public ==== */

rec_loop_t *rec_loop_new(const struct sl_config *cfg, const struct sl_masterkey *mk, sl_err_t *err)
{
    rec_loop_t *l = sl_xcalloc(1, sizeof(*l));
    l->cfg = cfg;
    sl_reg_pub_init(&l->reg_pub, cfg, mk);
    /* recorder_lanes is validated to 1..REC_MAX_LANES; rec_batch_init clamps as well */
    for (int i = 0; i < 2; i++)
        rec_batch_init(&l->bufs[i], (size_t)cfg->recorder_lanes, (size_t)cfg->recorder_batch,
                       (size_t)cfg->recorder_batch_max_bytes, (size_t)cfg->max_body_bytes);
    for (int i = 0; i < 2; i++)
        l->bufs[i].future_max_ms = cfg->recorder_future_max_s * 1000;
    l->batch = &l->bufs[0];
    l->nlanes = l->batch->nlanes;
    l->beat = -1;
    atomic_init(&l->jobs_done, 0);
    for (size_t i = 0; i < l->nlanes; i++)
        l->db[i] = rec_db_new(cfg->pg_dsn, cfg->latency_window_h, cfg->history_retention_d);
    rd_kafka_conf_t *conf = sl_kafka_conf_new(cfg, "recorder", err);
    if (!conf)
        goto fail;
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_opaque(conf, l);
    metrics_init();
    if (cfg->metrics_listen[0] && sl_kstats_enable(conf, KSTATS_INTERVAL_MS, err) != 0) {
        rd_kafka_conf_destroy(conf);
        goto fail;
    }
    l->rk = sl_kafka_consumer_new(cfg, "recorder", cfg->recorder_group, conf, err);
    if (!l->rk)
        goto fail;
    return l;
fail:
    rec_loop_destroy(l);
    return NULL;
}

void rec_loop_stop(rec_loop_t *l)
{
    l->stop = 1;
}

void rec_loop_get_stats(const rec_loop_t *l, struct rec_loop_stats *out)
{
    *out = l->st;
}

/* Commit and leave the group: may block (an unreachable coordinator), so it runs under
 * sl_run_bounded. */
static void close_consumer(void *arg)
{
    rec_loop_t *l = arg;
    rd_kafka_resp_err_t e = rd_kafka_commit(l->rk, NULL, 0);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR && e != RD_KAFKA_RESP_ERR__NO_OFFSET)
        sl_warn("kafka", "commit_failed", "could not commit offsets: %s", rd_kafka_err2str(e));
    e = rd_kafka_consumer_close(l->rk);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_warn("kafka", "close_failed", "could not close the consumer cleanly: %s",
                rd_kafka_err2str(e));
}

/* Leave the group, nothing to commit (a stop before it was ever joined): under
 * sl_run_bounded like close_consumer. */
static void leave_group(void *arg)
{
    rec_loop_t *l = arg;
    rd_kafka_resp_err_t e = rd_kafka_consumer_close(l->rk);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_debug(SL_DBG_KAFKA, "kafka", "close_failed", "closing the consumer: %s",
                 rd_kafka_err2str(e));
}

/* A stop before the group was ever joined (Kafka unreachable, or a stop right at start):
 * nothing was consumed, so there is nothing to write, store or commit. Leaving is all that
 * is left, bounded by REC_START_LEAVE_MS: a coordinator that never answered will not now. */
static int start_cancelled(rec_loop_t *l, const char *phase)
{
    rec_maint_stop(l->maint);
    l->maint = NULL;
    SL_LOGKV(
        SL_LOG_INFO, "recorder", "start_cancelled",
        ((struct sl_log_kv[]){SL_KV_S("phase", phase), SL_KV_S("group", l->cfg->recorder_group)}),
        "stop requested %s: exiting before any record was taken",
        strcmp(phase, "postgresql") == 0 ? "while waiting for postgresql"
                                         : "while joining the consumer group");
    if (sl_run_bounded(leave_group, l, REC_START_LEAVE_MS) == SL_ETIMEDOUT)
        l->abandoned = true; /* nothing to lose: the group drops the member on its own */
    return 0;
}

/* A connection found a database this binary cannot write (SL_EVERSION; the maintenance
 * connection finds it right at start, a write lane at its next connect): drop what is held
 * (unstored: the next start re-reads it), commit the offsets of the batches that did commit
 * and leave the group, within shutdown_timeout_ms (REC_START_LEAVE_MS before the group was
 * joined); return the error. */
static int stop_fatal(rec_loop_t *l, sl_err_t *err)
{
    rec_maint_stop(l->maint);
    l->maint = NULL;
    drop_held(l);
    resume_paused(l);
    int64_t bound = l->joined ? l->cfg->shutdown_timeout_ms : REC_START_LEAVE_MS;
    if (sl_run_bounded(l->joined ? close_consumer : leave_group, l, bound) == SL_ETIMEDOUT)
        l->abandoned = true;
    if (err)
        *err = l->fatal_err;
    return l->fatal_err.code ? l->fatal_err.code : SL_EVERSION;
}

bool rec_loop_fatal(const rec_loop_t *l)
{
    return l->fatal;
}

bool rec_loop_abandoned(const rec_loop_t *l)
{
    return l->abandoned;
}

static int subscribe(rec_loop_t *l, sl_err_t *err)
{
    const struct sl_config *cfg = l->cfg;
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, cfg->topic_outcomes, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(l->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        return sl_err_set(err, SL_EKAFKA, "could not subscribe to %s: %s", cfg->topic_outcomes,
                          rd_kafka_err2str(e));
    SL_LOGKV(SL_LOG_INFO, "recorder", "recorder_started",
             ((struct sl_log_kv[]){SL_KV_S("topic", cfg->topic_outcomes),
                                   SL_KV_S("group", cfg->recorder_group),
                                   SL_KV_I("batch", cfg->recorder_batch),
                                   SL_KV_I("batch_max_bytes", cfg->recorder_batch_max_bytes),
                                   SL_KV_I("flush_ms", cfg->recorder_flush_ms),
                                   SL_KV_I("lanes", (int64_t)l->nlanes)}),
             "recording outcomes");
    return 0;
}

/* How long the next poll may wait: until the open batch is due, shorter while a write is in
 * flight (to notice its commit soon when idle). */
static int poll_timeout(const rec_loop_t *l, int64_t now)
{
    int timeout = POLL_MAX_MS;
    if (!l->blocked && !rec_batch_empty(l->batch)) {
        int64_t left = l->batch->first_mono_ms + l->cfg->recorder_flush_ms - now;
        timeout = left <= 0 ? 0 : left < POLL_MAX_MS ? (int)left : POLL_MAX_MS;
    }
    if (l->writing && timeout > WRITE_CHECK_MS)
        timeout = WRITE_CHECK_MS;
    return timeout;
}

/* After a poll: retry a blocked write when due, or flush the batch when full or due; the
 * periodic stats line. */
static void tick(rec_loop_t *l)
{
    int64_t now = sl_mono_ms();
    if (l->blocked) {
        if (now >= l->retry_at_ms)
            (void)write_retry(l);
    } else if (!rec_batch_empty(l->batch) &&
               (rec_batch_full(l->batch) ||
                now - l->batch->first_mono_ms >= l->cfg->recorder_flush_ms)) {
        (void)flush(l);
    }
    if (now >= l->next_stats_ms) {
        l->next_stats_ms = now + REC_STATS_EVERY_MS;
        log_stats(l, "recorder_stats", "progress");
    }
}

/* Shutdown: write the last batches (bounded retries), store, commit, leave the group, all
 * within shutdown_timeout_ms whatever is down. */
/*
 * Shutdown's bound on the write lanes: a lane statement can wait up to lock_timeout (30 s) on
 * a row another transaction holds (a replay locks dead letters while Kafka acknowledges its
 * batch). From the drain deadline on, this thread cancels every lane's running statement
 * (PQcancel), again every CANCEL_EVERY_MS for a retry started meanwhile, until shutdown has
 * stopped writing; the cancelled batch stays unstored and is read again at the next start.
 */
#define CANCEL_EVERY_MS 100
struct cancel_watch {
    rec_loop_t *l;
    int64_t deadline; /* mono ms */
    atomic_bool done; /* shutdown stopped writing */
    pthread_t thr;
    bool started;
};

static void *cancel_watch_main(void *arg)
{
    struct cancel_watch *w = arg;
    bool logged = false;
    while (!atomic_load(&w->done)) {
        if (sl_mono_ms() >= w->deadline) {
            if (!logged)
                sl_warn("recorder", "write_cancelled",
                        "shutdown bound reached while a batch was being written: its statements "
                        "are cancelled (the batch is read again at the next start)");
            logged = true;
            for (size_t i = 0; i < w->l->nlanes; i++)
                rec_db_cancel(w->l->db[i]);
        }
        sl_sleep_ms(CANCEL_EVERY_MS);
    }
    return NULL;
}

/* Write what is held, retrying until deadline; then drop what is left unstored. Returns 0,
 * or SL_EVERSION when the database turned out not to be writable by this binary. */
static int shutdown_writes(rec_loop_t *l, int64_t deadline)
{
    while (l->writing || l->wbatch || !rec_batch_empty(l->batch)) {
        if (flush_wait(l) == 0)
            break;
        if (l->fatal)
            return SL_EVERSION;
        if (sl_mono_ms() + l->backoff_ms > deadline) {
            sl_warn("recorder", "batch_not_written",
                    "shutting down with %zu records not written (not committed either: they are "
                    "re-read on the next start)",
                    held_records(l));
            drop_held(l);
            break;
        }
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(l->rk, (int)l->backoff_ms);
        if (rkm) /* paused: nothing should arrive; anything that does is re-read later */
            rd_kafka_message_destroy(rkm);
    }
    return 0;
}

static int shutdown_bounded(rec_loop_t *l, sl_err_t *err)
{
    const struct sl_config *cfg = l->cfg;
    int64_t bound = sl_mono_ms() + cfg->shutdown_timeout_ms;
    rec_maint_stop(l->maint);
    l->maint = NULL;
    int64_t deadline = sl_mono_ms() + cfg->shutdown_drain_ms;
    if (deadline > bound - CLOSE_RESERVE_MS)
        deadline = bound - CLOSE_RESERVE_MS;
    struct cancel_watch watch = {.l = l, .deadline = deadline};
    atomic_init(&watch.done, false);
    watch.started = pthread_create(&watch.thr, NULL, cancel_watch_main, &watch) == 0;
    int rc = shutdown_writes(l, deadline);
    atomic_store(&watch.done, true);
    if (watch.started)
        pthread_join(watch.thr, NULL);
    if (rc != 0)
        return stop_fatal(l, err);
    if (sl_run_bounded(close_consumer, l, bound - sl_mono_ms()) == SL_ETIMEDOUT) {
        l->abandoned = true;
        sl_error("recorder", "shutdown_timeout",
                 "leaving the group did not finish within shutdown_timeout_ms (%lld ms): exiting "
                 "without it (offsets not committed are read again by the next owner)",
                 (long long)cfg->shutdown_timeout_ms);
        return SL_ETIMEDOUT;
    }
    log_stats(l, "recorder_stopped", "stopped");
    return 0;
}

/*
 * Before intake: read PostgreSQL's clock, the reference for outcome timestamps, waiting while
 * PostgreSQL cannot be reached (as intake would wait for a write; judged by this host's clock
 * instead, a recorder whose clock is wrong would quarantine sound outcomes meanwhile). Returns
 * 0, 1 when stopped meanwhile, or SL_EVERSION (fatal, fatal_err set).
 */
static int wait_for_postgresql(rec_loop_t *l)
{
    int64_t wait = 250;
    while (!l->stop) {
        sl_err_t err;
        int rc = rec_clock_read(l->db[0], &l->clock, &err);
        if (rc == 0) {
            db_ok(l);
            return 0;
        }
        if (rc == SL_EVERSION) {
            l->fatal = true;
            l->fatal_err = err;
            return rc;
        }
        db_failed(l, "start", &err);
        for (int64_t t = 0; t < wait && !l->stop; t += 50)
            sl_sleep_ms(50);
        wait = wait * 2 > 5000 ? 5000 : wait * 2;
    }
    return 1;
}

int rec_loop_run(rec_loop_t *l, sl_err_t *err)
{
    int rc = wait_for_postgresql(l);
    if (rc == 1)
        return start_cancelled(l, "postgresql");
    if (rc != 0)
        return stop_fatal(l, err);
    rc = subscribe(l, err);
    if (rc != 0)
        return rc;
    l->maint = rec_maint_start(l->cfg, &l->clock, err);
    if (!l->maint)
        return err ? err->code : SL_ESTATE;
    l->next_stats_ms = sl_mono_ms() + REC_STATS_EVERY_MS;
    int beat = sl_probe_beat_register("recorder loop");
    l->beat = beat;
    while (!l->stop) {
        int64_t now = sl_mono_ms();
        sl_probe_beat(beat, now);
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(l->rk, poll_timeout(l, now));
        if (rkm) {
            handle_message(l, rkm);
            rd_kafka_message_destroy(rkm);
        }
        if (l->writing && write_done(l))
            (void)write_finish(l); /* committed: store its offsets now (a failure blocks) */
        if (rec_maint_fatal(l->maint, &l->fatal_err)) { /* found at the maintenance connect */
            l->fatal = true;
            break;
        }
        tick(l);
    }
    sl_probe_beat_release(beat);
    l->beat = -1; /* the shutdown is bounded on its own */
    if (l->fatal)
        return stop_fatal(l, err);
    if (!l->joined)
        return start_cancelled(l, "kafka_group");
    return shutdown_bounded(l, err);
}

void rec_loop_destroy(rec_loop_t *l)
{
    if (!l)
        return;
    rec_maint_stop(l->maint);
    if (l->batch)
        drop_held(l); /* joins a running write */
    if (l->paused)
        rd_kafka_topic_partition_list_destroy(l->paused);
    if (l->rk) {
        sl_kstats_forget(rd_kafka_name(l->rk));
        rd_kafka_destroy(l->rk);
    }
    for (size_t i = 0; i < l->nlanes; i++)
        rec_db_destroy(l->db[i]);
    rec_batch_fini(&l->bufs[0]);
    rec_batch_fini(&l->bufs[1]);
    if (l->qprod) {
        (void)rd_kafka_flush(l->qprod, 1000); /* settled already unless stopping on an error */
        rd_kafka_destroy(l->qprod);
    }
    if (l->refetch) /* nothing to commit or leave: no close */
        rd_kafka_destroy_flags(l->refetch, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    free(l->rej);
    free(l->disable);
    sl_reg_pub_close(&l->reg_pub);
    if (l->reg_pg)
        PQfinish(l->reg_pg);
    free(l);
}
