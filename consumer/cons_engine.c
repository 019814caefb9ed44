/*
 * cons_engine: the delivery loop (see cons_engine.h for the life of a message): its turn and
 * its sleep until the nearest deadline (cons_timer), the engine's life cycle, rebalances
 * (drain, store, commit, drop revoked work), offset storing, the stats line, and shutdown
 * (drain, reschedule, flush, commit, leave the group within shutdown_timeout_ms). The other
 * parts work over the structures of cons_engine_int.h: cons_job.c, cons_intake.c,
 * cons_endpoint.c, cons_send.c, cons_settle.c, cons_lease.c.
 *
 * Durability (invariant 1): a Kafka job's offset is finished only after its outcome record
 * was acknowledged by Kafka and whatever it left in Redis (delivered marker, retry job) was
 * written; a claimed retry job is removed or rescheduled under its lease token only after
 * its outcome is acknowledged (a crash first: the lease expires, the job comes back, and the
 * delivered marker turns a repeat into a duplicate outcome instead of a send).
 *
 * State transitions: jobs of revoked partitions leave JOB_QUEUED, JOB_DEDUP_WAIT and
 * JOB_EP_WAIT through their lists' exits (drop_partition_jobs); shutdown takes every queued and
 * in-flight job out through cons_q_pop / cons_send_end to be deferred.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_bounded.h"
#include "common/sl_kafka.h"
#include "common/sl_kstats.h"
#include "common/sl_probe.h"
#include "common/sl_time.h"
#include "consumer/cons_engine_int.h"

static void store_offsets(cons_engine_t *e, bool force);

void cons_warn_redis(cons_engine_t *e, const sl_err_t *err)
{
    sl_counter_inc(cons_m.redis_errors);
    if (e->stopping)
        e->redis_failed_stopping = true; /* see cons_redis_given_up */
    int64_t now = sl_mono_ms();
    if (now - e->redis_warned_mono < 5000)
        return;
    e->redis_warned_mono = now;
    sl_warn("redis", "redis_unavailable", "%s", err->msg);
}

/* During a shutdown, once a Redis call failed, the rest of the shutdown makes none: each
 * could wait redis_timeout_ms and the exit is bounded (shutdown_timeout_ms). What would have
 * been written stays undone the safe way: a marker is not written (the outcome is), a Kafka
 * record's offset is not stored, a claimed job's lease runs out. */
bool cons_redis_given_up(const cons_engine_t *e)
{
    return e->stopping && e->redis_failed_stopping;
}

/* This loop's share of a per-process limit v: v / threads rounded up, at least 1. */
static int64_t share(const cons_engine_t *e, int64_t v)
{
    int64_t s = (v + e->threads - 1) / e->threads;
    return s < 1 ? 1 : s;
}

static void drop_partition_jobs(cons_engine_t *e)
{
    /* Queued Kafka jobs of partitions we no longer own: drop (the new owner gets them; no
     * state was written for them). */
    size_t it = 0;
    const char *key;
    void *val;
    while (sl_map_next(e->eps, &it, &key, &val)) {
        struct cons_ep *ce = val;
        struct cons_link *k, *nx;
        CONS_LIST_FOREACH_SAFE(&ce->queue, k, nx)
        {
            struct job *j = cons_job_of(k);
            if (j->src == SRC_KAFKA && !cons_offsets_current(e->offsets, &j->off)) {
                cons_q_take(e, j);
                cons_job_free(e, j);
            }
        }
    }
    struct cons_link *k, *nx;
    CONS_LIST_FOREACH_SAFE(&e->ihold, k, nx)
    {
        struct job *j = cons_job_of(k);
        if (j->src == SRC_KAFKA && !cons_offsets_current(e->offsets, &j->off)) {
            cons_ihold_take(e, j);
            cons_job_free(e, j);
        }
    }
    CONS_LIST_FOREACH_SAFE(&e->epwait, k, nx)
    {
        struct job *j = cons_job_of(k);
        if (j->src == SRC_KAFKA && !cons_offsets_current(e->offsets, &j->off)) {
            cons_epwait_take(e, j);
            cons_job_free(e, j);
        }
    }
}

/*
 * Commit the stored offsets now and wait up to bound_ms for the answer. librdkafka commits
 * them by itself when partitions are unassigned, but that commit can lose a race with the
 * group leave or a rebalance in progress ("Unknown member") and is then dropped: the next
 * owner re-reads work whose fate is durable (dead letters sent again, retry chains doubled).
 * Without a group coordinator librdkafka defers a commit until one answers or
 * session.timeout.ms passes, so a plain synchronous commit could hold the loop that long: the
 * answer comes on commit_q instead, and one still unanswered at the bound is served later
 * (commit_serve); the auto-commit path stays as the fallback.
 */
static void commit_answer(rd_kafka_t *rk,
                          rd_kafka_resp_err_t ke,
                          rd_kafka_topic_partition_list_t *offsets,
                          void *opaque)
{
    (void)rk;
    (void)offsets;
    cons_engine_t *e = opaque;
    e->commits_pending--;
    const char *why = e->commit_why ? e->commit_why : "a rebalance";
    if (ke == RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_info("kafka", "offsets_committed", "offsets committed before %s", why);
    else if (ke != RD_KAFKA_RESP_ERR__NO_OFFSET)
        sl_warn("kafka", "commit_failed", "could not commit offsets before %s: %s", why,
                rd_kafka_err2str(ke));
}

static void commit_serve(cons_engine_t *e, int timeout_ms)
{
    if (e->commits_pending > 0)
        rd_kafka_queue_poll_callback(e->commit_q, timeout_ms);
}

static void commit_stored(cons_engine_t *e, const char *why, int64_t bound_ms)
{
    commit_serve(e, 0); /* an older answer first: its line names its own reason */
    e->commit_why = why;
    rd_kafka_resp_err_t ke =
        rd_kafka_commit_queue(e->consumer, NULL, e->commit_q, commit_answer, e);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (ke != RD_KAFKA_RESP_ERR__NO_OFFSET)
            sl_warn("kafka", "commit_failed", "could not commit offsets before %s: %s", why,
                    rd_kafka_err2str(ke));
        return;
    }
    e->commits_pending++;
    if (bound_ms < 0)
        bound_ms = 0;
    int64_t deadline = sl_mono_ms() + bound_ms;
    for (int64_t left = bound_ms; e->commits_pending > 0 && left > 0;
         left = deadline - sl_mono_ms())
        commit_serve(e, left < 100 ? (int)left : 100);
    if (e->commits_pending > 0)
        sl_warn("kafka", "commit_unanswered",
                "the offset commit before %s had no answer within %lld ms (no group "
                "coordinator?): going on without it",
                why, (long long)bound_ms);
}

/* Empty the wake-up pipe librdkafka writes to (its level-triggered EPOLLIN would otherwise
 * end every later wait at once). */
static void drain_wake(cons_engine_t *e)
{
    char buf[256];
    while (read(e->wake[0], buf, sizeof(buf)) > 0) {
    }
}

/* Serve curl's sockets for up to max_wait_ms, emptying the wake-up pipe when it woke us. */
static void http_run(cons_engine_t *e, int max_wait_ms)
{
    int extra = 0;
    cons_http_run(e->http, max_wait_ms, &extra);
    if (extra)
        drain_wake(e);
}

/* One loop turn for the in-flight cap (cons_adapt.h): its idle time and answers; closes the
 * measuring window when it is over. */
static void adapt_tick(cons_engine_t *e)
{
    int64_t d = cons_adapt_tick(&e->adapt, sl_mono_us(), cons_http_take_idle_us(e->http),
                                cons_http_take_answered(e->http), cons_http_running(e->http));
    if (d == 0)
        return;
    sl_gauge_add(cons_m.inflight_limit, d);
    sl_debug(SL_DBG_HTTP, "deliver", "inflight_cap", "loop in-flight cap %lld -> %lld (%s)",
             (long long)(cons_adapt_limit(&e->adapt) - d), (long long)cons_adapt_limit(&e->adapt),
             d < 0 ? "saturated" : "waiting, cap binding");
}

/* Run the loop without intake until nothing of the given partitions is in flight. */
static void drain_for(cons_engine_t *e, int64_t bound_ms)
{
    int64_t deadline = sl_mono_ms() + bound_ms;
    while (sl_mono_ms() < deadline &&
           (cons_http_running(e->http) > 0 || !cons_list_empty(&e->marks) ||
            rd_kafka_outq_len(e->producer) > 0 || !cons_list_empty(&e->hrecs))) {
        http_run(e, 10);
        cons_flush_marks(e);
        rd_kafka_poll(e->producer, 0);
        if (!cons_list_empty(&e->hrecs))
            cons_retry_records(e);
    }
}

static void rebalance_cb(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
    cons_engine_t *e = opaque;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        for (int i = 0; i < parts->cnt; i++) {
            if (!cons_offsets_assign(e->offsets, parts->elems[i].partition))
                sl_error("kafka", "partition_not_tracked",
                         "partition %d is beyond the %d partitions a consumer tracks: its "
                         "records are not consumed by this pod",
                         (int)parts->elems[i].partition, CONS_OFFSETS_MAX_PARTITIONS);
        }
        rd_kafka_assign(rk, parts);
        /* An application pause belongs to the partition object: re-apply ours, and only ever
         * resume partitions we paused (resuming a non-paused one is buggy before 2.4). */
        if (e->paused)
            rd_kafka_pause_partitions(rk, parts);
        sl_info("kafka", "partitions_assigned", "assigned %d partition%s", parts->cnt,
                parts->cnt == 1 ? "" : "s");
        atomic_store(&e->joined, true); /* ready: a member of the group, even with none */
        return;
    }
    /* Revoke: let in-flight work finish (bounded) so its offsets can still be stored. */
    if (!rd_kafka_assignment_lost(rk)) {
        int64_t bound = e->cfg->shutdown_drain_ms < 5000 ? e->cfg->shutdown_drain_ms : 5000;
        int64_t wait = COMMIT_WAIT_MS;
        if (e->shutdown_deadline) {
            /* leaving the group at SIGTERM: what is left of the exit bound */
            int64_t left = e->shutdown_deadline - SHUTDOWN_DESTROY_MS - sl_mono_ms();
            if (bound > left / 2)
                bound = left / 2;
            if (wait > left - bound)
                wait = left - bound;
        }
        drain_for(e, bound);
        store_offsets(e, true);
        commit_stored(e, "giving up partitions", wait);
    }
    for (int i = 0; i < parts->cnt; i++)
        cons_offsets_revoke(e->offsets, parts->elems[i].partition);
    drop_partition_jobs(e);
    e->last_revoke_mono = sl_mono_ms();
    if (e->await_revoke) {
        /* the stale Kafka work is gone: after the usual short hold, claimed jobs (their
         * leases re-validated first) may go */
        e->await_revoke = false;
        int64_t until = sl_mono_ms() + STALL_HOLD_MS;
        if (until < e->hold_until_mono) {
            e->hold_until_mono = until;
            cons_timer_arm(&e->timers, T_STALL_HOLD, until);
        }
    }
    /* A pause survives unassign/assign in 2.0.2: resume what we paused before giving the
     * partitions up, or a later assignment of them would stay paused forever. */
    if (e->paused) {
        rd_kafka_resume_partitions(rk, parts);
        SL_LOGKV(SL_LOG_INFO, "kafka", "intake_resumed",
                 ((struct sl_log_kv[]){SL_KV_S("reason", "revoked")}),
                 "intake pause ended: its partitions were revoked");
    }
    rd_kafka_assign(rk, NULL);
    e->paused = false;
    sl_info("kafka", "partitions_revoked", "revoked %d partition%s", parts->cnt,
            parts->cnt == 1 ? "" : "s");
}

static void store_offsets(cons_engine_t *e, bool force)
{
    int64_t now = sl_mono_ms();
    if (!force && !cons_timer_expired(&e->timers, T_STORE, now))
        return;
    cons_timer_arm(&e->timers, T_STORE, now + STORE_INTERVAL_MS);
    int span = cons_offsets_span(e->offsets);
    int32_t *parts = sl_xmalloc((size_t)(span > 0 ? span : 1) * sizeof(*parts));
    int n = cons_offsets_partitions(e->offsets, parts, span);
    rd_kafka_topic_partition_list_t *l = NULL;
    for (int i = 0; i < n; i++) {
        int64_t off = cons_offsets_committable(e->offsets, parts[i], NULL);
        if (off < 0)
            continue;
        if (!l)
            l = rd_kafka_topic_partition_list_new(n);
        rd_kafka_topic_partition_list_add(l, e->cfg->topic_deliveries, parts[i])->offset = off;
    }
    free(parts);
    if (!l)
        return;
    rd_kafka_resp_err_t ke = rd_kafka_offsets_store(e->consumer, l);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_debug(SL_DBG_KAFKA, "kafka", "offsets_store_failed", "%s", rd_kafka_err2str(ke));
    rd_kafka_topic_partition_list_destroy(l);
}

/*
 * The database's binding, looked at again while the loop runs (cons_engine_watch_owner).
 * The key is set once and never expires, so it can only go with everything else (FLUSHALL,
 * a Redis restarted without its data, a failover to a replica that never had it, or deleted
 * by hand): the retry schedule, breakers and markers written before may be gone, which no
 * other check would notice. Bound again at once, so that another deployment cannot take the
 * database meanwhile. On a Redis Cluster the key lives on one master; the binding's
 * witnesses, one in each 1/64 of the hash slots, show a loss on any master: one gone while
 * the key is in place is written again and the loss reported the same way. Bound to another
 * deployment (one took it over while this one ran): the same refusal as at start-up. A
 * Redis that does not answer is left to the other paths' warnings and looked at again next
 * time. Returns true when the loop must stop.
 */
static void state_lost(cons_engine_t *e, const char *what)
{
    sl_counter_inc(cons_m.redis_state_lost);
    sl_error("consumer", "redis_state_lost",
             "%s (emptied, restarted without its data, failed over to a replica without it, "
             "or deleted): retry schedules, breakers and delivered markers written before may "
             "be lost (sluicectl retries rebuild restores the schedule); bound it again to this "
             "deployment (%s)",
             what, e->db_owner);
}

static bool owner_check(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (!e->db_owner[0] || !cons_timer_expired(&e->timers, T_OWNER, now))
        return false;
    cons_timer_arm(&e->timers, T_OWNER, now + OWNER_CHECK_MS);
    sl_err_t err;
    char found[SL_RSTATE_OWNER_MAX + 1];
    int rc = sl_rstate_claim_owner(e->redis, e->db_owner, found, sizeof(found), &err);
    if (rc < 0) {
        cons_warn_redis(e, &err);
        return false;
    }
    if (rc == 0 && strcmp(found, e->db_owner) != 0) {
        sl_error("consumer", "redis_owner_mismatch",
                 "the database of redis_url is now bound to another deployment, whose endpoint "
                 "table is %s (Kafka cluster id/endpoints topic), not this consumer's %s: "
                 "stopping (exit 78), as a consumer starting now would (docs/OPERATIONS.md, "
                 "\"One Redis database per deployment\")",
                 found, e->db_owner);
        e->fatal = SL_CFG_EXIT;
        return true;
    }
    if (rc == 1)
        state_lost(e, "the key sluice:owner was gone from the redis database");
    int restored = 0, failed = 0;
    if (sl_rstate_witnesses(e->redis, e->db_owner, rc == 1, &restored, &failed, &err) != 0) {
        cons_warn_redis(e, &err);
        return false;
    }
    if (restored > 0) {
        char what[256];
        (void)snprintf(what, sizeof(what),
                       "%d of the %d witnesses of the binding (sluice:owner:{...}) were gone "
                       "while sluice:owner was in place: part of the redis database was lost "
                       "(on a Redis Cluster, the master or masters that held them)",
                       restored, SL_RSTATE_WITNESSES);
        state_lost(e, what);
    }
    return false;
}

/* Whether the loop must end now (e->fatal set, logged): the outcome producer failed for
 * good, or the database was bound to another deployment. */
static bool must_end(cons_engine_t *e)
{
    if (rd_kafka_fatal_error(e->producer, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        sl_error("kafka", "producer_fatal", "outcome producer hit a fatal error; exiting");
        e->fatal = SL_EKAFKA;
        return true;
    }
    return owner_check(e);
}

void cons_engine_watch_owner(cons_engine_t *e, const char *owner)
{
    (void)snprintf(e->db_owner, sizeof(e->db_owner), "%s", owner);
    cons_timer_arm(&e->timers, T_OWNER, sl_mono_ms() + OWNER_CHECK_MS);
}

static void stats_line(cons_engine_t *e, bool force)
{
    int64_t now = sl_mono_ms();
    if (!force && !cons_timer_expired(&e->timers, T_STATS, now))
        return;
    double secs = (double)(STATS_INTERVAL_MS) / 1000.0;
    cons_timer_arm(&e->timers, T_STATS, now + STATS_INTERVAL_MS);
    cons_brk_sweep(e, now);
    struct cons_stats *s = &e->st, *l = &e->st_last;
    SL_LOGKV(
        SL_LOG_INFO, "stats", "stats",
        ((struct sl_log_kv[]){
            SL_KV_I("received", s->received), SL_KV_I("claimed", s->claimed),
            SL_KV_I("sent", s->sent), SL_KV_I("delivered", s->delivered),
            SL_KV_I("retried", s->retried), SL_KV_I("dead", s->dead),
            SL_KV_I("duplicates", s->duplicates), SL_KV_I("deferred", s->deferred),
            SL_KV_I("spilled", s->spilled), SL_KV_I("quarantined", s->quarantined),
            SL_KV_I("probes", s->probes), SL_KV_I("raw_kept", s->raw_kept),
            SL_KV_I("inflight", cons_http_running(e->http)),
            SL_KV_I("inflight_max", e->inflight_max),
            SL_KV_I("inflight_cap", cons_adapt_limit(&e->adapt)), SL_KV_I("in_memory", e->live),
            SL_KV_I("in_memory_max", e->live_max),
            SL_KV_I("endpoint_states", (int64_t)sl_map_count(e->eps)),
            SL_KV_I("delivered_per_s", (int64_t)((double)(s->delivered - l->delivered) / secs))}),
        "consumer stats");
    *l = *s;
    e->inflight_max = cons_http_running(e->http);
    e->live_max = e->live;
}

cons_engine_t *cons_engine_new(
    const struct sl_config *cfg, sl_endpoints_t *endpoints, int thread, int threads, sl_err_t *err)
{
    if (threads < 1 || thread < 0 || thread >= threads) {
        sl_err_set(err, SL_EINVAL, "loop %d of %d: no such loop", thread, threads);
        return NULL;
    }
    cons_engine_t *e = sl_xcalloc(1, sizeof(*e));
    e->cfg = cfg;
    e->endpoints = endpoints;
    e->thread = thread;
    e->threads = threads;
    e->max_inflight = share(e, cfg->max_inflight);
    cons_adapt_init(&e->adapt, e->max_inflight, cfg->adaptive_inflight);
    sl_gauge_add(cons_m.inflight_limit, cons_adapt_limit(&e->adapt));
    e->wake[0] = e->wake[1] = -1;
    e->beat = -1;
    e->eps = sl_map_new(64);
    e->offsets = cons_offsets_new();
    cons_list_init(&e->ready);
    cons_list_init(&e->blocked);
    cons_list_init(&e->held);
    cons_list_init(&e->inflight);
    cons_list_init(&e->marks);
    cons_list_init(&e->ihold);
    cons_list_init(&e->epwait);
    e->epwait_ids = sl_map_new(8);
    e->live_ids = sl_map_new(1024);
    cons_list_init(&e->leased);
    cons_list_init(&e->hrecs);
    cons_timers_init(&e->timers, T_COUNT);
    cons_timer_arm(&e->timers, T_CLAIM, 0); /* claim and store at the first turn */
    cons_timer_arm(&e->timers, T_STORE, 0);
    int64_t queued = share(e, cfg->max_queued);
    e->live_cap = (uint64_t)e->max_inflight + (uint64_t)queued;
    /* resume above max_inflight, so the requests in flight never run dry meanwhile */
    e->live_resume = (uint64_t)e->max_inflight + (uint64_t)queued / 2;
    sl_buf_init(&e->enc, (size_t)cfg->max_body_bytes * 2 + SL_RECORD_OVERHEAD * 2);
    sl_buf_init(&e->canon, (size_t)cfg->max_body_bytes + SL_RECORD_OVERHEAD);
    e->lim = (struct sl_decode_limits){.max_body = (size_t)cfg->max_body_bytes, .max_record = 0};
    if (cfg->instance_id[0]) {
        (void)snprintf(e->pod, sizeof(e->pod), "%s", cfg->instance_id);
    } else {
        char host[40] = "host";
        (void)gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        for (char *p = host; *p; p++) {
            if (*p < 0x21 || *p > 0x7e)
                *p = '_';
        }
        (void)snprintf(e->pod, sizeof(e->pod), "%s-%d", host, (int)getpid());
    }
    /* Each loop of a process is its own breaker owner: one loop's late failure must not
     * count as another loop's probe. */
    if (threads > 1)
        (void)snprintf(e->owner, sizeof(e->owner), "%s#%d", e->pod, thread);
    else
        (void)snprintf(e->owner, sizeof(e->owner), "%s", e->pod);
    sl_err_t perr;
    if (sl_ssrf_parse(&e->ssrf, cfg->ssrf_protection, cfg->ssrf_allow_cidrs, &perr) != 0) {
        sl_err_set(err, SL_EINVAL, "ssrf_allow_cidrs: %s", perr.msg);
        goto fail;
    }
    struct cons_http_opts ho = {.ssrf = &e->ssrf,
                                .keep_bytes = (size_t)cfg->response_keep_bytes,
                                .max_bytes = (uint64_t)cfg->response_max_bytes,
                                .user_agent = "Sluice/" SL_VERSION,
                                .proxy = cfg->delivery_proxy,
                                .ca_file = cfg->endpoint_ca_file,
                                .proxy_ca_file = cfg->delivery_proxy_ca_file};
    e->http = cons_http_new(&ho, err);
    if (!e->http)
        goto fail;
    e->redis = sl_redis_connect(cfg->redis_url, (int)cfg->redis_timeout_ms, err);
    if (!e->redis)
        goto fail;
    if (pipe2(e->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        sl_err_set(err, -errno, "could not create wake-up pipe: %s", strerror(errno));
        goto fail;
    }
    rd_kafka_conf_t *pconf = sl_kafka_conf_new(cfg, "sluice-consumer-out", err);
    if (!pconf)
        goto fail;
    rd_kafka_conf_set_opaque(pconf, e);
    /* Outcomes are batched for throughput (linger.ms=50): the delivery has happened already
     * (its outcome carries ts_ms from the HTTP answer), only the offset commit waits. With
     * the latency profile's 2 ms linger, batches of a few records each cost the broker half
     * as much CPU again per delivery (24 against 16 us), and librdkafka builds an lz4 context
     * per batch (bench/README.md, "Consumer CPU"). */
    e->producer = sl_kafka_producer_new(cfg, "sluice-consumer-out", SL_KAFKA_THROUGHPUT, pconf,
                                        cons_dr_cb, err);
    if (!e->producer)
        goto fail;
    cons_metrics_producer_add(e->producer);
    rd_kafka_conf_t *cconf = sl_kafka_conf_new(cfg, "sluice-consumer", err);
    if (!cconf)
        goto fail;
    /* librdkafka pre-fetches up to 64 MB by default, on top of the live_cap jobs held here
     * (bench/README.md, "Consumer memory"). Once the queue is full, librdkafka 2.0.2 backs
     * the partition's fetching off (fetch.queue.backoff.ms only came in 2.2.0;
     * fetch.error.backoff.ms does not change it), so the queue size also bounds the loop's
     * intake: 2048 KiB halved a loop's rate, 4096 did not (bench/README.md, "Kafka
     * settings"). consumer_prefetch_kb, per loop. */
    char qkb[24];
    (void)snprintf(qkb, sizeof(qkb), "%lld", (long long)cfg->consumer_prefetch_kb);
    if (sl_kafka_conf_set(cconf, "queued.max.messages.kbytes", qkb, err) != 0) {
        rd_kafka_conf_destroy(cconf);
        goto fail;
    }
    rd_kafka_conf_set_opaque(cconf, e);
    rd_kafka_conf_set_rebalance_cb(cconf, rebalance_cb);
    if (cfg->metrics_listen[0] && sl_kstats_enable(cconf, KSTATS_INTERVAL_MS, err) != 0) {
        rd_kafka_conf_destroy(cconf);
        goto fail;
    }
    e->consumer = sl_kafka_consumer_new(cfg, "sluice-consumer", cfg->consumer_group, cconf, err);
    if (!e->consumer)
        goto fail;
    e->cq = rd_kafka_queue_get_consumer(e->consumer);
    e->pq = rd_kafka_queue_get_main(e->producer);
    e->commit_q = rd_kafka_queue_new(e->consumer);
    rd_kafka_queue_io_event_enable(e->cq, e->wake[1], "c", 1);
    rd_kafka_queue_io_event_enable(e->pq, e->wake[1], "p", 1);
    cons_http_watch_fd(e->http, e->wake[0]);
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, cfg->topic_deliveries, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t ke = rd_kafka_subscribe(e->consumer, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
        sl_err_set(err, SL_EKAFKA, "could not subscribe to %s: %s", cfg->topic_deliveries,
                   rd_kafka_err2str(ke));
        goto fail;
    }
    return e;
fail:
    cons_engine_destroy(e);
    return NULL;
}

void cons_engine_stop(cons_engine_t *e)
{
    int64_t none = 0; /* the first request starts the exit bound (async-signal-safe) */
    atomic_compare_exchange_strong(&e->stop_mono, &none, sl_mono_ms());
    atomic_store(&e->stop, 1);
    if (e->wake[1] >= 0) {
        ssize_t w = write(e->wake[1], "s", 1); /* wake the loop now; a full pipe wakes it too */
        (void)w;
    }
}

bool cons_engine_abandoned(const cons_engine_t *e)
{
    return e->abandoned;
}

bool cons_engine_joined(const cons_engine_t *e)
{
    return atomic_load(&e->joined);
}

void cons_engine_stats(const cons_engine_t *e, struct cons_stats *out)
{
    *out = e->st;
}

/* Shutdown (invariant 10): stop intake, let in-flight requests finish within the bound,
 * reschedule what is left without spending attempts, flush outcomes, store offsets. */
static void shutdown_drain(cons_engine_t *e)
{
    e->stopping = true;
    sl_info("consumer", "shutdown_started", "draining %d in-flight requests (up to %lld ms)",
            cons_http_running(e->http), (long long)e->cfg->shutdown_drain_ms);
    /* the drain's share of shutdown_timeout_ms leaves SHUTDOWN_RESERVE_MS for the rest */
    int64_t deadline = sl_mono_ms() + e->cfg->shutdown_drain_ms;
    if (deadline > e->shutdown_deadline - SHUTDOWN_RESERVE_MS)
        deadline = e->shutdown_deadline - SHUTDOWN_RESERVE_MS;
    while (cons_http_running(e->http) > 0 && sl_mono_ms() < deadline) {
        http_run(e, 20);
        cons_flush_marks(e);
        rd_kafka_poll(e->producer, 0);
    }
    /* Queued jobs: to the schedule, due now, no attempt spent. In-flight ones that did not
     * finish are cancelled and rescheduled the same way. */
    size_t it = 0;
    const char *key;
    void *val;
    while (sl_map_next(e->eps, &it, &key, &val)) {
        struct cons_ep *ce = val;
        while (!cons_list_empty(&ce->queue))
            cons_defer_job(e, cons_q_pop(e, ce, false), sl_now_ms(), "shutdown");
    }
    /* Claimed retries waiting for the endpoint table: back to the schedule due now, quietly
     * (nothing happened to them), rather than at their lease's end. Records from Kafka that
     * wait are read again by the partitions' next owner. */
    struct cons_link *k, *nx;
    CONS_LIST_FOREACH_SAFE(&e->epwait, k, nx)
    {
        struct job *j = cons_job_of(k);
        if (j->src == SRC_REDIS) {
            cons_epwait_take(e, j);
            cons_schedule_job(e, j, sl_now_ms(), j->d.attempt, NULL);
        }
    }
    /* Requests still running after the bound are cancelled and rescheduled, due now,
     * without spending an attempt (they may have reached the endpoint: at-least-once). */
    while (!cons_list_empty(&e->inflight)) {
        struct job *j = cons_job_of(cons_list_first(&e->inflight));
        cons_http_cancel(e->http, j->http);
        cons_send_end(e, j);
        cons_defer_job(e, j, sl_now_ms(), "shutdown");
    }
    cons_flush_marks(e);
    /* Flush what is owed to Kafka and Redis, leaving SHUTDOWN_CLOSE_MS for the commit and
     * leaving the group. Once Redis failed during the shutdown its writes are not retried
     * (held jobs are then freed: a Kafka record's offset is not stored, a claimed job's
     * lease runs out; both come back to the next owner). */
    int64_t flush_deadline = sl_mono_ms() + 10000;
    if (flush_deadline > e->shutdown_deadline - SHUTDOWN_CLOSE_MS)
        flush_deadline = e->shutdown_deadline - SHUTDOWN_CLOSE_MS;
    while ((rd_kafka_outq_len(e->producer) > 0 || !cons_list_empty(&e->hrecs) ||
            ((!cons_list_empty(&e->held) || e->npmarks) && !e->redis_failed_stopping)) &&
           sl_mono_ms() < flush_deadline) {
        rd_kafka_poll(e->producer, 50);
        cons_retry_records(e);
        cons_retry_held(e);
        cons_retry_pmarks(e);
    }
    if (!cons_list_empty(&e->hrecs))
        sl_error("kafka", "records_not_produced",
                 "%zu records still not taken by Kafka at shutdown: their deliveries' offsets "
                 "are not committed, the next owner reads them again",
                 e->hrecs.n);
    store_offsets(e, true);
}

/* Commit and leave the group: may block (an unreachable coordinator), so it runs under
 * sl_run_bounded; the rebalance callback's revocation runs in it too. */
static void close_consumer(void *arg)
{
    cons_engine_t *e = arg;
    int64_t wait = (e->shutdown_deadline - SHUTDOWN_DESTROY_MS - sl_mono_ms()) / 2;
    commit_stored(e, "shutdown", wait < COMMIT_WAIT_MS ? wait : COMMIT_WAIT_MS);
    rd_kafka_resp_err_t ke = rd_kafka_consumer_close(e->consumer);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_warn("kafka", "close_failed", "consumer close: %s", rd_kafka_err2str(ke));
}

int cons_engine_run(cons_engine_t *e)
{
    sl_log_thread_tag("loop", e->thread); /* this thread's lines name their loop */
    sl_info("consumer", "started", "consuming %s as %s (group %s)", e->cfg->topic_deliveries,
            e->owner, e->cfg->consumer_group);
    cons_timer_arm(&e->timers, T_STATS, sl_mono_ms() + STATS_INTERVAL_MS);
    char beat_name[32];
    (void)snprintf(beat_name, sizeof(beat_name), "delivery loop %d", e->thread);
    e->beat = sl_probe_beat_register(beat_name);
    while (!e->stop) {
        sl_probe_beat(e->beat, sl_mono_ms());
        cons_unblock(e);
        cons_intake_kafka(e);
        cons_retry_pmarks(e); /* markers owed first: a job claimed back below is checked by them */
        cons_intake_redis(e);
        cons_renew_leases(e);
        cons_dispatch(e);
        /* sleep until the nearest deadline (curl's own timer is cons_http_run's), or not at
         * all while records wait in the consumer queue */
        int wait =
            e->kafka_more ? 0 : cons_timers_wait_ms(&e->timers, sl_mono_ms(), LOOP_WAIT_MAX_MS);
        http_run(e, wait);
        if (cons_marks_due_in(e) == 0)
            cons_flush_marks(e);
        rd_kafka_poll(e->producer, 0);
        commit_serve(e, 0);
        if (!cons_list_empty(&e->hrecs))
            cons_retry_records(e);
        cons_retry_held(e);
        cons_retry_pmarks(e);
        cons_retry_ihold(e);
        cons_retry_epwait(e);
        cons_dispatch(e);
        adapt_tick(e); /* after the refill: what runs, not what is left after the answers */
        store_offsets(e, false);
        stats_line(e, false);
        if (must_end(e))
            break;
    }
    sl_probe_beat_release(e->beat); /* shutting down: the drain is bounded on its own */
    e->beat = -1;
    /* the bound counts from the request, not from the moment this loop saw it */
    int64_t asked = atomic_load(&e->stop_mono), now = sl_mono_ms();
    /* a time read in a signal handler can come from another clock than the loop's (an
     * LD_PRELOAD clock shim, libfaketime in the tests, serves a handler that interrupted it
     * unfaked): one that does not fit is replaced by now */
    if (asked <= 0 || asked > now || now - asked > e->cfg->shutdown_timeout_ms)
        asked = now;
    e->shutdown_deadline = asked + e->cfg->shutdown_timeout_ms;
    shutdown_drain(e);
    stats_line(e, true);
    /* what is left of the bound, less a moment for destroying the producer */
    int64_t left = e->shutdown_deadline - sl_mono_ms() - SHUTDOWN_DESTROY_MS;
    if (sl_run_bounded(close_consumer, e, left) == SL_ETIMEDOUT) {
        e->abandoned = true;
        sl_error("consumer", "shutdown_timeout",
                 "leaving the group did not finish within shutdown_timeout_ms (%lld ms): exiting "
                 "without it (offsets not committed are read again by the next owner)",
                 (long long)e->cfg->shutdown_timeout_ms);
        return e->fatal ? e->fatal : SL_ETIMEDOUT;
    }
    sl_info("consumer", "stopped", "consumer stopped cleanly");
    return e->fatal;
}

void cons_engine_destroy(cons_engine_t *e)
{
    if (!e)
        return;
    sl_gauge_add(cons_m.inflight_limit, -cons_adapt_limit(&e->adapt));
    if (e->cq)
        rd_kafka_queue_destroy(e->cq);
    if (e->pq)
        rd_kafka_queue_destroy(e->pq);
    if (e->commit_q)
        rd_kafka_queue_destroy(e->commit_q);
    if (e->consumer) {
        sl_kstats_forget(rd_kafka_name(e->consumer));
        rd_kafka_destroy(e->consumer);
    }
    if (e->producer) {
        cons_metrics_producer_remove(e->producer);
        int64_t left = e->shutdown_deadline ? e->shutdown_deadline - sl_mono_ms() : 5000;
        rd_kafka_flush(e->producer, (int)(left < 0 ? 0 : left > 5000 ? 5000 : left));
        rd_kafka_destroy(e->producer);
    }
    cons_http_destroy(e->http);
    sl_redis_close(e->redis);
    if (e->eps) {
        size_t it = 0;
        const char *key;
        void *val;
        while (sl_map_next(e->eps, &it, &key, &val)) {
            struct cons_ep *ce = val;
            while (!cons_list_empty(&ce->queue))
                cons_job_free(e, cons_q_pop(e, ce, false));
            sl_signer_destroy(ce->signer);
            sl_endpoint_release(ce->ep);
            free(ce);
        }
        sl_map_destroy(e->eps, NULL);
    }
    while (!cons_list_empty(&e->held)) {
        /* Redis never answered within the shutdown flush: a Kafka record's offset was not
         * stored (read again), a claimed job's lease runs out (claimed again) */
        struct job *j = cons_job_of(cons_list_first(&e->held));
        cons_held_take(e, j);
        cons_job_free(e, j);
    }
    while (!cons_list_empty(&e->ihold)) {
        /* never checked, never sent: a Kafka record's offset was not stored (read again) */
        struct job *j = cons_job_of(cons_list_first(&e->ihold));
        cons_ihold_take(e, j);
        cons_job_free(e, j);
    }
    while (!cons_list_empty(&e->epwait)) { /* the same: read again by the next owner, or
                                            * (a claimed retry) claimed again */
        struct job *j = cons_job_of(cons_list_first(&e->epwait));
        cons_epwait_take(e, j);
        cons_job_free(e, j);
    }
    sl_map_destroy(e->epwait_ids, NULL);
    sl_map_destroy(e->live_ids, NULL);
    for (size_t i = 0; i < e->npmarks; i++) {
        free(e->pmarks[i].ep);
        free(e->pmarks[i].id);
    }
    free(e->pmarks);
    struct held_rec *h;
    while ((h = cons_hrec_first(e)) != NULL) { /* their jobs are freed above: nothing to settle */
        cons_held_free(e, h);
    }
    cons_offsets_destroy(e->offsets);
    sl_buf_fini(&e->enc);
    sl_buf_fini(&e->canon);
    if (e->wake[0] >= 0)
        close(e->wake[0]);
    if (e->wake[1] >= 0)
        close(e->wake[1]);
    free(e);
}
