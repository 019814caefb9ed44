/*
 * cons_settle: how a job's fate becomes durable (invariant 1): outcome records and the held
 * records Kafka has not taken, the retry schedule write with hold-and-retry, dead letters,
 * deferrals and quarantine, delivered markers (batched) and the markers whose write failed,
 * the delivery-report callback, and the settling of a job once its last outcome is
 * acknowledged (finish the offset, or complete the claimed retry job under its lease).
 *
 * State transitions: JOB_LOOSE -> JOB_ACKING (send_record: a record of the job is in
 * Kafka's hands), JOB_ACKING -> JOB_FREED (job_settle at the last acknowledgement),
 * JOB_LOOSE -> JOB_REDIS_HELD (hold) and back (cons_held_take, from cons_retry_held),
 * JOB_LOOSE -> JOB_MARKING (cons_mark_push) and back (cons_flush_marks).
 * Test-only fault points (SL_FAULT) live here as well.
 *
 * thread: the engine's loop thread only; dr_cb runs inside rd_kafka_poll on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_fault.h"
#include "common/sl_time.h"
#include "consumer/cons_backoff.h"
#include "consumer/cons_engine_int.h"

static void pmarks_add(cons_engine_t *e,
                       size_t n,
                       const char **eps,
                       const char **ids,
                       const struct cons_done_info *info);

void cons_outcome_init(cons_engine_t *e,
                       struct job *j,
                       struct sl_outcome *o,
                       enum sl_outcome_state state,
                       uint32_t attempt)
{
    memset(o, 0, sizeof(*o));
    o->id = j->d.id;
    o->ep = j->d.ep;
    o->type = j->d.type;
    o->attempt = attempt;
    o->state = state;
    o->ts_ms = (uint64_t)sl_now_ms();
    o->created_ms = j->d.ts_ms;
    o->pod = e->pod;
}

/* ==== Test-only fault points (-DSL_FAULT_INJECTION=ON; SL_FAULT=name) ====
 *   loop_stall       the loop blocks 4 s at its first delivered answer: the stall /healthz
 *                    must report (tests/e2e/test_metrics.py);
 *   records_refused  the producer "refuses" the first 20 records handed to it: they are held
 *                    and produced again (tests/e2e/test_delivery.py);
 *   records_unacked  the first 20 acknowledgements count as failures: the records are held and
 *                    produced again, so Kafka has those twice (at-least-once outcomes).
 * Without the build option each is a constant false. */
static bool fault_active(const char *name, int times)
{
#ifdef SL_FAULT_INJECTION
    static atomic_int used[3];
    static const char *const names[3] = {"loop_stall", "records_refused", "records_unacked"};
    if (!sl_fault_is(name))
        return false;
    for (int i = 0; i < 3; i++) {
        if (strcmp(names[i], name) == 0)
            return atomic_fetch_add(&used[i], 1) < times;
    }
#else
    (void)name;
    (void)times;
#endif
    return false;
}

void cons_fault_stall(void)
{
    if (fault_active("loop_stall", 1))
        (void)usleep(4000 * 1000);
}

static bool fault_produce_refused(void)
{
    return fault_active("records_refused", 20);
}

/* One attempt to hand a record to the producer (copied; headers copied). Never waits. */
static rd_kafka_resp_err_t produce_once(cons_engine_t *e,
                                        const char *topic,
                                        const void *key,
                                        size_t key_len,
                                        const void *val,
                                        size_t val_len,
                                        const rd_kafka_headers_t *hdrs,
                                        struct job *j)
{
    /* producev takes the headers only when it succeeds */
    rd_kafka_headers_t *h = hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
    rd_kafka_resp_err_t ke = rd_kafka_producev(
        e->producer, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY((void *)(uintptr_t)key, key_len),
        RD_KAFKA_V_VALUE((void *)(uintptr_t)val, val_len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_OPAQUE(j), RD_KAFKA_V_END);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR && h)
        rd_kafka_headers_destroy(h);
    return ke;
}

/* Keep a record Kafka has not taken (copies; hdrs is taken over) at the end of the list. */
static void hold_record(cons_engine_t *e,
                        struct job *j,
                        const char *topic,
                        const void *key,
                        size_t key_len,
                        const void *val,
                        size_t val_len,
                        rd_kafka_headers_t *hdrs,
                        const char *why)
{
    struct held_rec *h = sl_xcalloc(1, sizeof(*h));
    h->j = j;
    h->topic = sl_xstrdup(topic);
    if (key && key_len) {
        h->key = sl_xmalloc(key_len);
        memcpy(h->key, key, key_len);
        h->key_len = key_len;
    }
    h->val = sl_xmalloc(val_len ? val_len : 1);
    if (val_len)
        memcpy(h->val, val, val_len);
    h->val_len = val_len;
    h->hdrs = hdrs;
    h->since_mono = sl_mono_ms();
    cons_list_push_tail(&e->hrecs, &h->link);
    cons_timer_arm_min(&e->timers, T_RECORDS, h->since_mono + RECORDS_RETRY_MS);
    sl_gauge_add(cons_m.records_held, 1);
    int64_t now = h->since_mono;
    if (now - e->hrec_logged_mono >= 5000) {
        e->hrec_logged_mono = now;
        SL_LOGKV(
            SL_LOG_WARN, "kafka", "records_held",
            ((struct sl_log_kv[]){SL_KV_S("topic", topic), SL_KV_I("held", (int64_t)e->hrecs.n)}),
            "Kafka did not take a record (%s): held and produced again; its delivery's "
            "offset stays open meanwhile",
            why);
    }
}

/* Take h off the held records and free it. */
void cons_held_free(cons_engine_t *e, struct held_rec *h)
{
    cons_list_unlink(&e->hrecs, &h->link);
    free(h->topic);
    free(h->key);
    free(h->val);
    if (h->hdrs)
        rd_kafka_headers_destroy(h->hdrs);
    free(h);
    sl_gauge_add(cons_m.records_held, -1);
}

struct held_rec *cons_hrec_first(const cons_engine_t *e)
{
    struct cons_link *k = cons_list_first(&e->hrecs);
    return k ? CONS_CONTAINER(k, struct held_rec, link) : NULL;
}

/* Produce what is held, oldest first, until the producer refuses one (it keeps its place,
 * and T_RECORDS offers it again). */
void cons_retry_records(cons_engine_t *e)
{
    cons_timer_disarm(&e->timers, T_RECORDS);
    struct held_rec *h;
    while ((h = cons_hrec_first(e)) != NULL) {
        rd_kafka_resp_err_t ke =
            produce_once(e, h->topic, h->key, h->key_len, h->val, h->val_len, h->hdrs, h->j);
        if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
            int64_t now = sl_mono_ms();
            cons_timer_arm(&e->timers, T_RECORDS, now + RECORDS_RETRY_MS);
            if (now - e->hrec_logged_mono >= 10000) {
                e->hrec_logged_mono = now;
                SL_LOGKV(SL_LOG_WARN, "kafka", "records_held",
                         ((struct sl_log_kv[]){SL_KV_I("held", (int64_t)e->hrecs.n),
                                               SL_KV_I("oldest_ms", now - h->since_mono)}),
                         "records still held for Kafka: %s", rd_kafka_err2str(ke));
            }
            return;
        }
        cons_held_free(e, h);
    }
}

/* Hand a record of job j to Kafka: now when nothing is held before it and the producer takes
 * it, else held (in order). j waits for its acknowledgement either way (acks_pending). */
static void send_record(cons_engine_t *e,
                        struct job *j,
                        const char *topic,
                        const void *key,
                        size_t key_len,
                        const void *val,
                        size_t val_len,
                        rd_kafka_headers_t *hdrs)
{
    cons_job_set_state(e, j, JOB_ACKING);
    j->acks_pending++;
    rd_kafka_resp_err_t ke = RD_KAFKA_RESP_ERR__STATE;
    bool behind = !cons_list_empty(&e->hrecs);
    if (!behind && !fault_produce_refused()) {
        ke = produce_once(e, topic, key, key_len, val, val_len, hdrs, j);
        if (ke == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (hdrs)
                rd_kafka_headers_destroy(hdrs);
            return;
        }
    }
    hold_record(e, j, topic, key, key_len, val, val_len, hdrs,
                behind && ke == RD_KAFKA_RESP_ERR__STATE ? "behind earlier held records"
                                                         : rd_kafka_err2str(ke));
}

/* Encode and send an outcome of j (see send_record). Returns 0, or the encoder's error when o
 * cannot be encoded even without its optional parts (nothing sent then). */
int cons_produce_outcome(cons_engine_t *e, struct job *j, const struct sl_outcome *o)
{
    sl_err_t err;
    sl_buf_reset(&e->enc);
    if (sl_outcome_encode_lim(o, &e->lim, &e->enc, &err) != 0) {
        /* the response excerpt and the record copy are optional: without them it fits */
        struct sl_outcome lean = *o;
        lean.resp = NULL;
        lean.resp_len = 0;
        lean.env = NULL;
        lean.env_len = 0;
        sl_error("kafka", "outcome_encode_failed",
                 "cannot encode outcome: %s; sending it without its response and record", err.msg);
        sl_buf_reset(&e->enc);
        if (sl_outcome_encode_lim(&lean, &e->lim, &e->enc, &err) != 0) {
            sl_error("kafka", "outcome_encode_failed", "cannot encode outcome: %s", err.msg);
            return err.code;
        }
    }
    send_record(e, j, e->cfg->topic_outcomes, j->d.ep, strlen(j->d.ep), e->enc.data, e->enc.len,
                NULL);
    return 0;
}

/* The job is done with its in-memory life once acks arrive; called when acks_pending hits 0. */
static void job_settle(cons_engine_t *e, struct job *j)
{
    if (j->dead) {
        /* Only now that the dead letter is recorded: a record read again (a commit lost to a
         * rebalance or an outage) is then not sent again. Without the marker it would be,
         * and a transient failure could even end up delivered after its dead letter. */
        sl_err_t err;
        bool written = false;
        if (!cons_redis_given_up(e)) {
            written =
                cons_store_dead_mark(e->redis, j->d.ep, j->d.id, e->cfg->dedup_window_s, &err) == 0;
            if (!written)
                cons_warn_redis(e, &err); /* written again once Redis answers (cons_retry_pmarks) */
        }
        if (!written) {
            const char *ep = j->d.ep, *id = j->d.id;
            pmarks_add(e, 1, &ep, &id, NULL);
        }
    }
    if (j->src == SRC_KAFKA) {
        cons_offsets_finish(e->offsets, &j->off);
    } else if (j->after == AFTER_COMPLETE && !cons_redis_given_up(e)) {
        sl_err_t err;
        uint32_t nshards = (uint32_t)e->cfg->retry_shards;
        int rc = cons_store_complete(e->redis, nshards, j->job_id, j->token, &err);
        if (rc == SL_ESTATE)
            sl_warn("redis", "lease_lost", "retry job lease was lost before completion");
        else if (rc != 0)
            cons_warn_redis(e,
                            &err); /* the lease expires; the marker (now or from cons_retry_pmarks)
                                 prevents a resend when the job is claimed again */
    }
    cons_job_free(e, j);
}

/* Finish a job that needs no outcome record (e.g. a Redis job re-deferred). */
void cons_job_done_quiet(cons_engine_t *e, struct job *j)
{
    if (j->acks_pending == 0)
        job_settle(e, j);
}

static void
hold(cons_engine_t *e, struct job *j, int64_t due_ms, uint32_t attempt, const struct sl_outcome *o)
{
    j->sched_due_ms = due_ms;
    j->sched_attempt = attempt;
    /* o's msg and resp borrow the caller's stack and the transfer's buffer, both gone by the
     * time the write is retried: the held outcome owns copies (o may be the previous hold's
     * own outcome, so copy before freeing) */
    char *msg = o && o->msg ? sl_xstrdup(o->msg) : NULL;
    uint8_t *resp = NULL;
    if (o && o->resp && o->resp_len) {
        resp = sl_xmalloc(o->resp_len);
        memcpy(resp, o->resp, o->resp_len);
    }
    free(j->held_msg);
    free(j->held_resp);
    j->held_msg = msg;
    j->held_resp = resp;
    if (o)
        j->pending_out = *o;
    else
        memset(&j->pending_out, 0, sizeof(j->pending_out));
    j->pending_out.msg = msg;
    j->pending_out.resp = resp;
    j->pending_out.resp_len = resp ? o->resp_len : 0;
    j->redis_hold_due = sl_mono_ms() + REDIS_HOLD_RETRY_MS;
    cons_job_set_state(e, j, JOB_REDIS_HELD);
    cons_timer_arm_min(&e->timers, T_HELD, j->redis_hold_due);
}

/*
 * Put j in the retry schedule at due_ms with attempt attempts spent. On success, produce the
 * outcome o (may be NULL) and settle. On Redis failure the job is held and retried; for a
 * Kafka job its offset stays unfinished meanwhile.
 */
void cons_schedule_job(
    cons_engine_t *e, struct job *j, int64_t due_ms, uint32_t attempt, const struct sl_outcome *o)
{
    sl_err_t err;
    uint32_t nshards = (uint32_t)e->cfg->retry_shards;
    struct sl_delivery copy = j->d;
    copy.own = NULL;
    copy.attempt = attempt;
    sl_buf_reset(&e->enc);
    if (sl_delivery_encode_lim(&copy, &e->lim, &e->enc, &err) != 0) {
        /* it cannot wait in the schedule: give it up, with the reason, rather than lose it */
        sl_error("redis", "job_encode_failed", "cannot encode retry job: %s", err.msg);
        cons_dead_letter(e, j, 0, 0, "job_encode_failed", err.msg, NULL);
        return;
    }
    int existed = 0;
    int rc;
    if (cons_redis_given_up(e)) /* no Redis wait within the exit's bound */
        rc = sl_err_set(&err, SL_EREDIS, "redis failed during shutdown: not retried");
    else
        rc = cons_store_schedule(e->redis, nshards, j->job_id, e->enc.data, e->enc.len,
                                 due_ms - sl_now_ms(), /* a delay: Redis adds its own now */
                                 j->src == SRC_REDIS ? j->token : NULL, &existed, &err);
    if (rc == SL_ESTATE) {
        /* Our lease expired and another pod owns the job now: it is not ours to move. */
        sl_warn("redis", "lease_lost", "retry job lease was lost; leaving it to its new owner");
        cons_job_free(e, j);
        return;
    }
    if (rc != 0) {
        cons_warn_redis(e, &err);
        if (j->src == SRC_KAFKA) {
            hold(e, j, due_ms, attempt, o);
        } else {
            cons_job_free(e, j); /* the lease expires and the job comes back */
        }
        return;
    }
    cons_leased_unlink(e, j); /* a reschedule released our lease: nothing left to renew */
    j->after = AFTER_FINISH;
    if (o && o->state != SL_OUTCOME_DELIVERED) {
        struct sl_outcome oo = *o;
        if (cons_produce_outcome(e, j, &oo) == 0)
            return; /* settles on the acknowledgement */
    }
    cons_job_done_quiet(e, j);
}

/* The one exit of JOB_REDIS_HELD. */
void cons_held_take(cons_engine_t *e, struct job *j)
{
    cons_job_set_state(e, j, JOB_LOOSE);
}

/* Write again the held jobs that are due; T_HELD is left at the earliest one still held. */
void cons_retry_held(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (!cons_timer_expired(&e->timers, T_HELD, now))
        return;
    cons_timer_disarm(&e->timers, T_HELD);
    /* the jobs held now, oldest first: one whose write fails again is held anew behind them */
    size_t n = e->held.n;
    struct cons_link *k = e->held.head.next;
    for (size_t i = 0; i < n; i++) {
        struct cons_link *nx = k->next;
        struct job *j = cons_job_of(k);
        if (now < j->redis_hold_due) {
            cons_timer_arm_min(&e->timers, T_HELD, j->redis_hold_due);
        } else {
            cons_held_take(e, j);
            struct sl_outcome o = j->pending_out;
            cons_schedule_job(e, j, j->sched_due_ms, j->sched_attempt, o.id ? &o : NULL);
        }
        k = nx;
    }
}

/* Quarantine an undecodable record with the reason (Kafka jobs only). */
void cons_quarantine(cons_engine_t *e, struct job *j, const char *reason)
{
    char part[16], off[24];
    (void)snprintf(part, sizeof(part), "%d", (int)j->partition);
    (void)snprintf(off, sizeof(off), "%lld", (long long)j->offset);
    e->st.quarantined++;
    sl_counter_inc(cons_m.quarantined);
    sl_warn("kafka", "record_quarantined", "record quarantined: %s", reason);
    rd_kafka_headers_t *h = rd_kafka_headers_new(4);
    rd_kafka_header_add(h, "sluice-reason", -1, reason, (ssize_t)strlen(reason));
    rd_kafka_header_add(h, "sluice-source-topic", -1, e->cfg->topic_deliveries, -1);
    rd_kafka_header_add(h, "sluice-source-partition", -1, part, -1);
    rd_kafka_header_add(h, "sluice-source-offset", -1, off, -1);
    send_record(e, j, e->cfg->topic_quarantine, NULL, 0, j->raw, j->raw_len, h);
}

/* Dead-letter j with error class and message. attempt: the attempt that failed, or 0 when j
 * dies without one (endpoint gone or disabled; j->d.attempt were spent before). */
void cons_dead_letter(cons_engine_t *e,
                      struct job *j,
                      uint32_t attempt,
                      uint32_t http,
                      const char *err_class,
                      const char *msg,
                      const struct cons_http_result *r)
{
    struct sl_outcome o;
    cons_outcome_init(e, j, &o, SL_OUTCOME_DEAD_LETTER, attempt);
    o.http = http;
    o.err = err_class;
    o.msg = msg;
    o.env = cons_job_env(e, j, &o.env_len);
    if (r) {
        o.lat_us = (uint64_t)r->total_us;
        o.dns_us = (uint64_t)r->dns_us;
        o.conn_us = (uint64_t)r->connect_us;
        o.tls_us = (uint64_t)r->tls_us;
        o.ttfb_us = (uint64_t)r->ttfb_us;
        o.resp = r->resp_len ? r->resp : NULL;
        o.resp_len = r->resp_len;
    }
    e->st.dead++;
    sl_counter_inc(cons_m.dead);
    uint32_t spent = attempt ? attempt : j->d.attempt;
    struct sl_log_ctx ctx;
    cons_set_ctx(&ctx, j);
    SL_LOGKV(SL_LOG_WARN, "deliver", "dead_letter",
             ((struct sl_log_kv[]){SL_KV_S("err", err_class), SL_KV_I("status", http)}),
             "delivery dead-lettered after %u attempt%s", spent, spent == 1 ? "" : "s");
    sl_log_ctx_clear();
    j->after = AFTER_COMPLETE;
    j->dead = true;
    if (cons_produce_outcome(e, j, &o) != 0)
        cons_job_free(e, j); /* offset stays unfinished (Kafka) or lease expires (Redis) */
}

/* Defer j without spending an attempt (breaker open, backlog spill, shutdown). */
void cons_defer_job(cons_engine_t *e, struct job *j, int64_t due_ms, const char *why)
{
    struct sl_outcome o;
    cons_outcome_init(e, j, &o, SL_OUTCOME_DEFERRED, 0);
    o.next_ms = (uint64_t)due_ms;
    o.err = why;
    if (j->src == SRC_KAFKA) {
        /* the delivery moves from Kafka into Redis: its record travels with the outcome so
         * `sluicectl retries rebuild` can restore the schedule after a Redis loss */
        o.env = cons_job_env(e, j, &o.env_len);
    }
    cons_schedule_job(e, j, due_ms, j->d.attempt, &o);
}

/* Batch the delivered j for its marker write (cons_flush_marks writes the batch, then produces
 * the outcomes: marker first, outcome after it). */
void cons_mark_push(cons_engine_t *e, struct job *j)
{
    if (cons_list_empty(&e->marks)) {
        e->marks_since_mono = sl_mono_ms();
        cons_timer_arm(&e->timers, T_MARKS, e->marks_since_mono + MARKS_DELAY_MS);
    }
    cons_job_set_state(e, j, JOB_MARKING);
    if (e->marks.n >= MARKS_BATCH)
        cons_timer_arm(&e->timers, T_MARKS, sl_mono_ms());
}

/* Keep n markers whose write failed for cons_retry_pmarks (strings are copied). info: n entries,
 * or NULL for dead-letter markers. */
static void pmarks_add(cons_engine_t *e,
                       size_t n,
                       const char **eps,
                       const char **ids,
                       const struct cons_done_info *info)
{
    size_t room = PMARKS_MAX - e->npmarks;
    if (n > room) {
        sl_warn("redis", "markers_dropped", "%zu markers dropped: %d are already waiting for redis",
                n - room, PMARKS_MAX);
        n = room;
    }
    if (e->npmarks + n > e->cap_pmarks) {
        e->cap_pmarks = (e->npmarks + n) * 2;
        e->pmarks = sl_xrealloc(e->pmarks, e->cap_pmarks * sizeof(*e->pmarks));
    }
    for (size_t i = 0; i < n; i++) {
        e->pmarks[e->npmarks].ep = sl_xstrdup(eps[i]);
        e->pmarks[e->npmarks].id = sl_xstrdup(ids[i]);
        e->pmarks[e->npmarks].info = info ? info[i] : (struct cons_done_info){0};
        e->pmarks[e->npmarks].dead = info == NULL;
        e->npmarks++;
    }
    cons_timer_arm(&e->timers, T_PMARKS, sl_mono_ms() + REDIS_HOLD_RETRY_MS);
}

/*
 * Write the delivered markers that failed while Redis was unavailable, about once a second
 * until it answers. Without them, a record read again after the outage (a rebalance), or a
 * claimed retry job that comes back when its lease runs out, would be sent again.
 */
void cons_retry_pmarks(cons_engine_t *e)
{
    if (!e->npmarks) {
        cons_timer_disarm(&e->timers, T_PMARKS);
        return;
    }
    if (!cons_timer_expired(&e->timers, T_PMARKS, sl_mono_ms()) || cons_redis_given_up(e))
        return;
    size_t n = e->npmarks;
    const char **eps = sl_xcalloc(n, sizeof(*eps));
    const char **ids = sl_xcalloc(n, sizeof(*ids));
    struct cons_done_info *info = sl_xcalloc(n, sizeof(*info));
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        if (e->pmarks[i].dead)
            continue;
        eps[nd] = e->pmarks[i].ep;
        ids[nd] = e->pmarks[i].id;
        info[nd] = e->pmarks[i].info;
        nd++;
    }
    sl_err_t err;
    int rc =
        nd ? cons_store_done_mark(e->redis, nd, eps, ids, info, e->cfg->dedup_window_s, &err) : 0;
    free(eps);
    free(ids);
    free(info);
    if (rc != 0) {
        cons_warn_redis(e, &err);
        cons_timer_arm(&e->timers, T_PMARKS, sl_mono_ms() + REDIS_HOLD_RETRY_MS);
        return;
    }
    /* delivered markers are written; dead-letter markers one by one (SET NX each) */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        struct pmark *m = &e->pmarks[i];
        if (m->dead && rc == 0)
            rc = cons_store_dead_mark(e->redis, m->ep, m->id, e->cfg->dedup_window_s, &err);
        if (m->dead && rc != 0) {
            e->pmarks[kept++] = *m;
            continue;
        }
        free(m->ep);
        free(m->id);
    }
    e->npmarks = kept;
    if (rc != 0) {
        cons_warn_redis(e, &err);
        cons_timer_arm(&e->timers, T_PMARKS, sl_mono_ms() + REDIS_HOLD_RETRY_MS);
        return;
    }
    cons_timer_disarm(&e->timers, T_PMARKS);
    sl_info("redis", "markers_written", "%zu markers written after redis came back", n);
}

/* Write delivered markers for the batch, then produce their outcomes. */
void cons_flush_marks(cons_engine_t *e)
{
    cons_timer_disarm(&e->timers, T_MARKS);
    if (cons_list_empty(&e->marks))
        return;
    size_t n = e->marks.n;
    const char **eps = sl_xcalloc(n, sizeof(*eps));
    const char **ids = sl_xcalloc(n, sizeof(*ids));
    struct cons_done_info *info = sl_xcalloc(n, sizeof(*info));
    size_t i = 0;
    struct cons_link *k, *nx;
    CONS_LIST_FOREACH_SAFE(&e->marks, k, nx)
    {
        const struct job *j = cons_job_of(k);
        eps[i] = j->d.ep;
        ids[i] = j->d.id;
        /* the marker remembers the delivery, so a copy read again can report it once more
         * if this outcome is lost (killed before its acknowledgement) */
        info[i].attempt = j->pending_out.attempt;
        info[i].ts_ms = (int64_t)j->pending_out.ts_ms;
        info[i].status = j->pending_out.http;
        info[i].lat_us = j->pending_out.lat_us;
        i++;
    }
    sl_err_t err;
    bool written = false;
    if (!cons_redis_given_up(e)) {
        written =
            cons_store_done_mark(e->redis, n, eps, ids, info, e->cfg->dedup_window_s, &err) == 0;
        if (!written)
            cons_warn_redis(e, &err); /* delivered all the same; the markers are written later */
    }
    if (!written)
        pmarks_add(e, n, eps, ids, info);
    free(eps);
    free(ids);
    free(info);
    /* the one exit of JOB_MARKING: every job of the batch, oldest first */
    for (; n > 0; n--) {
        struct job *j = cons_job_of(cons_list_first(&e->marks));
        cons_job_set_state(e, j, JOB_LOOSE);
        struct sl_outcome o = j->pending_out;
        if (cons_produce_outcome(e, j, &o) != 0)
            cons_job_free(e, j);
    }
}

/* Milliseconds until the delivered markers are due to be written (0: now; -1: none held). */
int cons_marks_due_in(const cons_engine_t *e)
{
    if (cons_list_empty(&e->marks))
        return -1;
    if (e->marks.n >= MARKS_BATCH || e->stop)
        return 0;
    int64_t left = e->marks_since_mono + MARKS_DELAY_MS - sl_mono_ms();
    return left > 0 ? (int)left : 0;
}

void cons_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    cons_engine_t *e = opaque;
    struct job *j = m->_private;
    if (!j)
        return;
    if (m->err || fault_active("records_unacked", 20)) {
        /* Not acknowledged: held, headers too (a quarantined record's reason and source
         * travel in them), and produced again by the loop (never from this callback); the
         * job (and its offset) waits, still counting this record in acks_pending. */
        rd_kafka_headers_t *hdrs = NULL;
        if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
            hdrs = NULL;
        hold_record(e, j, rd_kafka_topic_name(m->rkt), m->key, m->key_len, m->payload, m->len,
                    hdrs ? rd_kafka_headers_copy(hdrs) : NULL,
                    m->err ? rd_kafka_err2str(m->err) : "acknowledgement refused (test fault)");
        return;
    }
    if (--j->acks_pending == 0)
        job_settle(e, j);
}
