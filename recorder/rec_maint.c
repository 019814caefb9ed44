/*
 * rec_maint: periodic partitions / retention / statistics work on its own thread (see
 * rec_maint.h). The thread sleeps on a condition variable until the next task is due or it is
 * told to stop; a stop during a long statement cancels the statement (PQcancel, via
 * rec_db_cancel), so shutdown never waits for a percentile sort.
 */
#include "recorder/rec_maint.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_metrics.h"
#include "common/sl_time.h"
#include "recorder/rec_db.h"

struct rec_maint {
    const struct sl_config *cfg; /* borrowed */
    rec_db_t *db;                /* the maintenance connection */
    pthread_t th;                /* the thread */
    pthread_mutex_t mu;          /* guards stop, fatal and fatal_err */
    pthread_cond_t cv;           /* signalled on stop */
    bool stop;                   /* asked to stop */
    unsigned failing;            /* tasks (1u << enum maint_task) whose last run failed */
    bool fatal;                  /* a connect returned SL_EVERSION (rec_maint_fatal) */
    sl_err_t fatal_err;          /* its reason */
    int64_t next_parts_ms;       /* mono ms: next partition maintenance */
    int64_t next_purge_ms;       /* mono ms: next retention purge */
    int64_t next_health_ms;      /* mono ms: next statistics refresh */
    int64_t next_oldest_ms;      /* mono ms: next oldest-undelivered reading */
    int64_t next_clock_ms;       /* mono ms: next clock reading */
    struct rec_clock *clock;     /* the loop's (borrowed) */
    sl_gauge_t *oldest;          /* sluice_oldest_undelivered_age_seconds */
};

static bool stopping(rec_maint_t *m)
{
    pthread_mutex_lock(&m->mu);
    bool s = m->stop;
    pthread_mutex_unlock(&m->mu);
    return s;
}

/* The periodic tasks, each with its own failing state: one task that keeps failing stays
 * reported while the others succeed. */
enum maint_task { T_PARTITIONS, T_RETENTION, T_HEALTH, T_OLDEST, T_CLOCK };
static const char *const task_names[] = {"partitions", "retention", "endpoint health",
                                         "oldest undelivered", "clock reading"};

static void failed(rec_maint_t *m, enum maint_task t, const sl_err_t *err)
{
    const char *task = task_names[t];
    if (err->code == SL_EVERSION) {
        pthread_mutex_lock(&m->mu);
        m->fatal = true;
        m->fatal_err = *err;
        pthread_mutex_unlock(&m->mu);
        return; /* the loop stops and logs it */
    }
    if (stopping(m))
        return; /* a cancelled statement at shutdown is not news */
    if (!(m->failing & (1u << t))) {
        m->failing |= 1u << t;
        SL_LOGKV(SL_LOG_WARN, "db", "maintenance_failed",
                 ((struct sl_log_kv[]){SL_KV_S("task", task)}),
                 "history maintenance failed (retried every minute): %s", err->msg);
    } else {
        sl_debug(SL_DBG_DB, "db", "maintenance_retry_failed", "%s: %s", task, err->msg);
    }
}

static void succeeded(rec_maint_t *m, enum maint_task t)
{
    if (m->failing & (1u << t)) {
        m->failing &= ~(1u << t);
        SL_LOGKV(SL_LOG_INFO, "db", "maintenance_recovered",
                 ((struct sl_log_kv[]){SL_KV_S("task", task_names[t])}),
                 "history maintenance works again: %s", task_names[t]);
    }
}

static void do_partitions(rec_maint_t *m)
{
    const struct sl_config *cfg = m->cfg;
    sl_err_t err;
    int64_t created = 0;
    int64_t dropped = 0;
    if (rec_db_partitions(m->db, REC_PARTITION_DAYS_AHEAD, cfg->history_retention_d,
                          cfg->latency_window_h + REC_LATENCY_MARGIN_H, &created, &dropped,
                          &err) != 0) {
        failed(m, T_PARTITIONS, &err);
        return;
    }
    succeeded(m, T_PARTITIONS);
    if (created || dropped)
        SL_LOGKV(SL_LOG_INFO, "db", "partitions_maintained",
                 ((struct sl_log_kv[]){SL_KV_I("created", created), SL_KV_I("dropped", dropped)}),
                 "partitions: %lld created, %lld dropped", (long long)created, (long long)dropped);
}

static void do_purge(rec_maint_t *m)
{
    const struct sl_config *cfg = m->cfg;
    const struct {
        enum rec_purge what;
        int64_t days;
        const char *table;
    } jobs[] = {
        {REC_PURGE_DEAD_LETTERS, cfg->dead_letter_retention_d, "dead_letters"},
        {REC_PURGE_DELIVERIES,
         cfg->deliveries_retention_d ? cfg->deliveries_retention_d : cfg->history_retention_d,
         "deliveries"},
        {REC_PURGE_PENDING, 0, "pending_payloads"},
        /* a journal entry outlives no dead letter it could help recover */
        {REC_PURGE_REPLAY_LOG, cfg->dead_letter_retention_d, "replay_log"}};
    sl_err_t err;
    for (size_t j = 0; j < sizeof(jobs) / sizeof(jobs[0]); j++) {
        int64_t total = 0;
        int64_t n = REC_PURGE_LIMIT;
        for (int round = 0; round < REC_PURGE_ROUNDS && n == REC_PURGE_LIMIT && !stopping(m);
             round++) {
            if (rec_db_purge(m->db, jobs[j].what, jobs[j].days, REC_PURGE_LIMIT, &n, &err) != 0) {
                failed(m, T_RETENTION, &err);
                return;
            }
            total += n;
        }
        succeeded(m, T_RETENTION);
        if (total > 0)
            SL_LOGKV(
                SL_LOG_INFO, "db", "retention_purged",
                ((struct sl_log_kv[]){SL_KV_S("table", jobs[j].table), SL_KV_I("rows", total)}),
                "deleted %lld expired rows from %s", (long long)total, jobs[j].table);
    }
}

static void do_health(rec_maint_t *m, int64_t started)
{
    sl_err_t err;
    int64_t n = 0;
    if (rec_db_refresh_health(m->db, m->cfg->latency_window_h, &n, &err) != 0) {
        failed(m, T_HEALTH, &err);
        return;
    }
    succeeded(m, T_HEALTH);
    int64_t took = sl_mono_ms() - started;
    if (took * REC_HEALTH_SHARE > m->cfg->recorder_health_refresh_ms)
        m->next_health_ms = started + took * REC_HEALTH_SHARE;
    sl_debug(SL_DBG_DB, "db", "health_refreshed", "%lld endpoints with samples in %lld ms",
             (long long)n, (long long)took);
}

static void do_oldest(rec_maint_t *m)
{
    sl_err_t err;
    int64_t age = 0;
    if (rec_db_oldest_undelivered(m->db, &age, &err) != 0) {
        /* unknown, not the last reading: a stale age would keep SluiceOldestUndelivered
         * firing (or silent) for as long as PostgreSQL cannot be read */
        sl_gauge_set(m->oldest, -1);
        failed(m, T_OLDEST, &err);
        return;
    }
    succeeded(m, T_OLDEST);
    sl_gauge_set(m->oldest, age);
}

int rec_clock_read(rec_db_t *db, struct rec_clock *c, sl_err_t *err)
{
    int rc = rec_db_connect(db, err); /* first: only the query's round trip is timed */
    if (rc != 0)
        return rc;
    int64_t pg_ms = 0, before = sl_now_ms();
    rc = rec_db_clock_ms(db, &pg_ms, err);
    if (rc != 0)
        return rc;
    int64_t after = sl_now_ms();
    int64_t offset = pg_ms - (before + (after - before) / 2);
    atomic_store(&c->offset_ms, offset);
    bool off = offset > REC_CLOCK_WARN_MS || offset < -REC_CLOCK_WARN_MS;
    if (off && !c->off)
        SL_LOGKV(SL_LOG_WARN, "db", "clock_offset",
                 ((struct sl_log_kv[]){SL_KV_I("offset_ms", offset)}),
                 "this host's clock is %lld ms %s postgresql's: outcome times are judged by "
                 "postgresql's",
                 (long long)(offset < 0 ? -offset : offset), offset < 0 ? "ahead of" : "behind");
    else if (!off && c->off)
        SL_LOGKV(SL_LOG_INFO, "db", "clock_offset_ok",
                 ((struct sl_log_kv[]){SL_KV_I("offset_ms", offset)}),
                 "this host's clock agrees with postgresql's again");
    c->off = off;
    return 0;
}

static void do_clock(rec_maint_t *m)
{
    sl_err_t err;
    if (rec_clock_read(m->db, m->clock, &err) != 0) {
        failed(m, T_CLOCK, &err);
        return;
    }
    succeeded(m, T_CLOCK);
}

static void *maint_main(void *arg)
{
    rec_maint_t *m = arg;
    while (!stopping(m)) {
        int64_t now = sl_mono_ms();
        if (now >= m->next_clock_ms) {
            m->next_clock_ms = now + REC_CLOCK_EVERY_MS;
            do_clock(m);
        } else if (now >= m->next_parts_ms) {
            m->next_parts_ms = now + REC_PARTITIONS_EVERY_MS;
            do_partitions(m);
        } else if (now >= m->next_purge_ms) {
            m->next_purge_ms = now + REC_PURGE_EVERY_MS;
            do_purge(m);
        } else if (now >= m->next_health_ms) {
            m->next_health_ms = now + m->cfg->recorder_health_refresh_ms;
            do_health(m, now);
        } else if (now >= m->next_oldest_ms) {
            m->next_oldest_ms = now + REC_OLDEST_EVERY_MS;
            do_oldest(m);
        }
        now = sl_mono_ms();
        int64_t next = m->next_parts_ms;
        if (m->next_purge_ms < next)
            next = m->next_purge_ms;
        if (m->next_health_ms < next)
            next = m->next_health_ms;
        if (m->next_oldest_ms < next)
            next = m->next_oldest_ms;
        if (m->next_clock_ms < next)
            next = m->next_clock_ms;
        if (next <= now)
            continue;
        /* sleep until then (CLOCK_REALTIME deadline for the condition variable) */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (next - now) * 1000000LL;
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_mutex_lock(&m->mu);
        while (!m->stop) {
            if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT)
                break;
        }
        pthread_mutex_unlock(&m->mu);
    }
    return NULL;
}

rec_maint_t *rec_maint_start(const struct sl_config *cfg, struct rec_clock *clock, sl_err_t *err)
{
    rec_maint_t *m = sl_xcalloc(1, sizeof(*m));
    m->cfg = cfg;
    m->db = rec_db_new(cfg->pg_dsn, cfg->latency_window_h, cfg->history_retention_d);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    int64_t now = sl_mono_ms();
    m->clock = clock;
    m->next_clock_ms = now + REC_CLOCK_EVERY_MS; /* the loop read it just now */
    m->next_parts_ms = now;                      /* partitions first: a fresh day may need them */
    m->next_purge_ms = now + 5000;               /* then retention */
    /* statistics once there is something to count: after 10 s, or one interval if shorter */
    m->next_health_ms =
        now + (cfg->recorder_health_refresh_ms < 10000 ? cfg->recorder_health_refresh_ms : 10000);
    m->next_oldest_ms = now + 1000;
    m->oldest = sl_metric_gauge("sluice_oldest_undelivered_age_seconds",
                                "Age of the oldest delivery waiting for a retry or deferred "
                                "(0 when none), from PostgreSQL every 15 s.",
                                NULL);
    if (pthread_create(&m->th, NULL, maint_main, m) != 0) {
        sl_err_set(err, SL_ESTATE, "could not start the maintenance thread");
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        rec_db_destroy(m->db);
        free(m);
        return NULL;
    }
    return m;
}

bool rec_maint_fatal(rec_maint_t *m, sl_err_t *err)
{
    if (!m)
        return false;
    pthread_mutex_lock(&m->mu);
    bool fatal = m->fatal;
    if (fatal && err)
        *err = m->fatal_err;
    pthread_mutex_unlock(&m->mu);
    return fatal;
}

void rec_maint_stop(rec_maint_t *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    /* A cancel sent just before a statement starts is lost: repeat until the thread is out. */
    for (;;) {
        rec_db_cancel(m->db);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_timedjoin_np(m->th, NULL, &ts) == 0)
            break;
    }
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    rec_db_destroy(m->db);
    free(m);
}
