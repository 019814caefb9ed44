/*
 * cons_intake: jobs into the loop: records taken from Kafka (within the in-memory bound,
 * pausing the partitions when intake is stuck), retry jobs claimed from the Redis schedule
 * (leased), decoding and endpoint resolution, the pipelined delivered-marker (dedup) check,
 * and the endpoint queues' backlog bound (spill to the schedule).
 *
 * State transitions: JOB_LOOSE -> JOB_QUEUED (enqueue), JOB_LOOSE -> JOB_DEDUP_WAIT
 * (ihold_push: the duplicate check failed and dedup_fail_open is false) and back
 * (cons_ihold_take, from cons_retry_ihold: the wait list's one exit), JOB_LOOSE ->
 * JOB_EP_WAIT (epwait_push: a Kafka record or a claimed retry names an endpoint the table
 * does not have) and back (cons_epwait_take, from cons_retry_epwait once the table caught up
 * with the endpoints topic, or after EPWAIT_MAX_MS: the endpoint is then looked up once more;
 * a record whose endpoint is still unknown is quarantined, a retry dead-lettered, or put back
 * in the schedule when the table could not catch up).
 *
 * thread: the engine's loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_time.h"
#include "consumer/cons_backoff.h"
#include "consumer/cons_engine_int.h"

static void epwait_push(cons_engine_t *e, struct job *j);

/* Resolve a decoded job's endpoint. Returns true when it should go on to the marker check. */
static bool intake_endpoint(cons_engine_t *e, struct job *j)
{
    if (!j->ep_waited && sl_map_get(e->epwait_ids, j->d.ep)) {
        epwait_push(e, j); /* behind its endpoint's earlier records, which wait */
        return false;
    }
    bool fresh = sl_map_get(e->eps, j->d.ep) == NULL;
    struct cons_ep *ce = cons_ep_get(e, j->d.ep);
    j->ce = ce;
    const struct sl_endpoint *ep = cons_ep_refresh(e, ce);
    if (!ep) {
        if (fresh) {
            /* no state for an id the registry does not know: records naming many unknown
             * endpoints would otherwise grow the table for ever (nothing else points at a
             * state made just now; the job leaves with its quarantine or dead letter) */
            sl_map_del(e->eps, ce->id, NULL);
            free(ce);
            j->ce = NULL;
        }
        if (!j->ep_waited) {
            /* created just before the record was published, maybe, and not yet in this
             * pod's table (a claimed retry of it too: another pod, whose table had it, made
             * the attempt): look again once the table has read the endpoints topic to its
             * end as it is now */
            epwait_push(e, j);
        } else if (j->src == SRC_REDIS && !j->ep_synced) {
            /* this pod's table is behind: the job waits in the schedule, not dead-lettered
             * for an endpoint that may well exist (quietly: nothing happened to it) */
            SL_LOG_EVERY(10000, SL_LOG_WARN, "endpoints", "retry_waits_for_table",
                         "a claimed retry names an endpoint this pod's table does not have and "
                         "the table could not catch up with the endpoints topic within %d s: "
                         "the retry goes back to the schedule for %d s",
                         EPWAIT_MAX_MS / 1000, EPWAIT_RESCHEDULE_MS / 1000);
            cons_schedule_job(e, j, sl_now_ms() + EPWAIT_RESCHEDULE_MS, j->d.attempt, NULL);
        } else if (j->src == SRC_KAFKA) {
            char reason[192];
            if (j->ep_synced)
                (void)snprintf(reason, sizeof(reason), "unknown endpoint %s", j->d.ep);
            else
                (void)snprintf(reason, sizeof(reason),
                               "unknown endpoint %s (the endpoint table could not catch up with "
                               "the endpoints topic within %d s)",
                               j->d.ep, EPWAIT_MAX_MS / 1000);
            cons_quarantine(e, j, reason);
        } else {
            /* attempt 0: no attempt is spent (the contract's rule; the recorder would
             * otherwise count the last failed attempt, already reported, a second time) */
            cons_dead_letter(e, j, 0, 0, "unknown_endpoint", "endpoint no longer exists", NULL);
        }
        return false;
    }
    if (ce->disabled_local && ep->enabled && ep->version != ce->disabled_version)
        ce->disabled_local = false; /* the registry changed it since: its word stands */
    if (!ep->enabled || ce->disabled_local) {
        cons_dead_letter(e, j, 0, 0, "endpoint_disabled", /* attempt 0: as above */
                         ep->reason && ep->reason[0] ? ep->reason : "endpoint disabled", NULL);
        return false;
    }
    cons_drop_canonical_raw(e, j);
    return true;
}

/* Decode and resolve one job. Returns true when it should go on to the marker check. */
static bool intake_resolve(cons_engine_t *e, struct job *j)
{
    sl_err_t err;
    if (sl_delivery_decode(j->raw, j->raw_len, &e->lim, &j->d, &err) != 0) {
        if (j->src == SRC_KAFKA) {
            cons_quarantine(e, j, err.msg);
        } else {
            sl_error("redis", "bad_retry_job", "undecodable retry job removed: %s", err.msg);
            j->after = AFTER_COMPLETE;
            cons_job_done_quiet(e, j);
        }
        return false;
    }
    if (j->src == SRC_KAFKA) {
        /* The contract keys records by endpoint id so one endpoint's records share a
         * partition (ordering, one pod's backlog); a record keyed otherwise is invalid. */
        if (j->key_bad || strcmp(j->key, j->d.ep) != 0) {
            cons_quarantine(e, j, "record key does not match the endpoint id (field \"ep\")");
            return false;
        }
        cons_store_job_id(j->d.ep, j->d.id, j->job_id);
        /* the wait before intake (sluice_delivery_wait_seconds): not for a replay, whose
         * creation time is the original event's */
        if (!j->d.replay && j->d.attempt == 0) {
            int64_t now = sl_now_ms();
            if (j->d.ts_ms > 0 && (uint64_t)now >= j->d.ts_ms)
                sl_histo_observe_us(cons_m.stage_kafka, (now - (int64_t)j->d.ts_ms) * 1000);
            j->taken_us = sl_mono_us();
        }
    }
    return intake_endpoint(e, j);
}

/* How long ce cannot send anyway (a Retry-After pause, the rate limit's wait, the breaker's
 * cooldown), ms from now_mono; 0 when it could. */
static int64_t held_back_ms(const struct cons_ep *ce, int64_t now_mono)
{
    int64_t until = ce->blocked_until_mono;
    if (ce->brk == CONS_BRK_OPEN && ce->brk_reopen_mono > until)
        until = ce->brk_reopen_mono;
    return until > now_mono ? until - now_mono : 0;
}

/* Move the loose job j, whose endpoint's queue cannot take it, to the Redis schedule: due
 * now, or when its endpoint may send again. */
static void spill(cons_engine_t *e, struct job *j)
{
    e->st.spilled++;
    sl_counter_inc(cons_m.spills);
    if (!j->is_spill)
        e->spills_live++;
    j->is_spill = true;
    int64_t held = held_back_ms(j->ce, sl_mono_ms());
    if (j->src == SRC_REDIS) {
        /* Claimed from the schedule while the queue is still full: back in, a little
         * later and quietly (it is in the schedule already, its first spill reported
         * it). Due at once it came back every claim turn, each time with an outcome. */
        int64_t later =
            RESPILL_MIN_MS + (int64_t)cons_rng_uniform(cons_rng_default(), RESPILL_SPREAD_MS);
        cons_schedule_job(e, j, sl_now_ms() + (held > later ? held : later), j->d.attempt, NULL);
        return;
    }
    /* Beyond the bound the partition keeps flowing: park the job in Redis. */
    cons_defer_job(e, j, sl_now_ms() + held, "backlog_spill");
}

/* Whether ce's queue is not keeping up: its head has waited HOL_AGE_MS and the endpoint is
 * held back (paused by Retry-After, out of rate-limit tokens, its breaker not closed) or has
 * requests out and answered none of them for HOL_AGE_MS (slow). A loop merely busy with a
 * backlog has every endpoint that sends answering all the time, however long its queues
 * wait (one waiting for a free request slot has none out). */
static bool queue_stuck(const struct cons_ep *ce, int64_t now)
{
    if (ce->queue.n == 0 || now - cons_q_head(ce)->queued_mono < HOL_AGE_MS)
        return false;
    return ce->blocked_until_mono > now || ce->brk != CONS_BRK_CLOSED ||
           (ce->inflight > 0 && now - ce->last_answer_mono >= HOL_AGE_MS);
}

static void enqueue(cons_engine_t *e, struct job *j)
{
    struct cons_ep *ce = j->ce;
    int64_t now = sl_mono_ms();
    /* past its backlog, or memory is short and this endpoint's queue is not keeping up (it
     * would fill the loop's memory and stop intake for every endpoint) */
    if (!e->stopping && ((int64_t)ce->queue.n >= e->cfg->endpoint_backlog ||
                         (e->live >= e->live_resume && queue_stuck(ce, now)))) {
        spill(e, j);
        return;
    }
    j->queued_mono = now;
    cons_job_set_state(e, j, JOB_QUEUED);
    cons_ready_push(e, ce);
}

/*
 * Intake is full, or paused and not yet below live_resume: move the newest queued jobs of
 * endpoints that are not keeping up (queue_stuck) to the Redis schedule, each queue's head
 * kept, until as many left as bring the loop back below live_resume. Without this a few endpoints
 * that cannot send (paused by Retry-After, rate-limited, slow) hold the loop's memory and stop
 * intake for every endpoint on its partitions until they drain (invariant 3). At most every
 * EVICT_EVERY_MS.
 */
static void spill_stuck_queues(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (e->stopping || now < e->evict_next_mono)
        return;
    e->evict_next_mono = now + EVICT_EVERY_MS;
    /* jobs spilled by an earlier pass stay in memory until their schedule write and its
     * outcome are acknowledged (longer while Redis or Kafka is slow or down): they are on
     * their way out, not more to move */
    uint64_t staying = e->live - e->spills_live;
    if (staying < e->live_resume)
        return;
    uint64_t want = staying - e->live_resume + 1, moved = 0;
    size_t pos = 0;
    const char *id;
    void *v;
    while (moved < want && sl_map_next(e->eps, &pos, &id, &v)) {
        struct cons_ep *ce = v;
        if (!queue_stuck(ce, now))
            continue;
        /* the newest k off the tail, then into the schedule oldest first: jobs due at the
         * same moment are claimed in the order they were scheduled */
        size_t k = ce->queue.n - 1;
        if (k > want - moved)
            k = (size_t)(want - moved);
        struct job **tail = sl_xcalloc(k ? k : 1, sizeof(struct job *));
        for (size_t i = 0; i < k; i++) {
            tail[i] = cons_job_of(cons_list_last(&ce->queue));
            cons_q_take(e, tail[i]);
        }
        for (size_t i = k; i > 0; i--)
            spill(e, tail[i - 1]);
        free(tail);
        moved += k;
    }
    if (moved > 0)
        SL_LOGKV(SL_LOG_INFO, "deliver", "stuck_queues_spilled",
                 ((struct sl_log_kv[]){SL_KV_I("jobs", (int64_t)moved)}),
                 "intake full: %llu queued jobs of endpoints not keeping up moved to the retry "
                 "schedule",
                 (unsigned long long)moved);
}

/* Hold n records for their duplicate check, in order (cons_retry_ihold takes them oldest first). */
static void ihold_push(cons_engine_t *e, struct job **jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cons_job_set_state(e, jobs[i], JOB_DEDUP_WAIT);
}

/* Wait for the endpoint table to catch up (a Kafka record naming an unknown endpoint, or
 * one behind such a record of its endpoint). */
static void epwait_push(cons_engine_t *e, struct job *j)
{
    j->ep_ticket = sl_endpoints_sync_request(e->endpoints);
    j->ep_wait_until = sl_mono_ms() + EPWAIT_MAX_MS;
    cons_job_set_state(e, j, JOB_EP_WAIT);
    intptr_t n = (intptr_t)sl_map_get(e->epwait_ids, j->d.ep);
    sl_map_put(e->epwait_ids, j->d.ep, (void *)(n + 1), NULL);
    if (!cons_timer_armed(&e->timers, T_EPWAIT))
        cons_timer_arm(&e->timers, T_EPWAIT, sl_mono_ms() + EPWAIT_CHECK_MS);
}

/* The one exit of JOB_EP_WAIT. */
void cons_epwait_take(cons_engine_t *e, struct job *j)
{
    intptr_t n = (intptr_t)sl_map_get(e->epwait_ids, j->d.ep);
    if (n > 1)
        sl_map_put(e->epwait_ids, j->d.ep, (void *)(n - 1), NULL);
    else
        sl_map_del(e->epwait_ids, j->d.ep, NULL);
    cons_job_set_state(e, j, JOB_LOOSE);
}

/* The one exit of JOB_DEDUP_WAIT. */
void cons_ihold_take(cons_engine_t *e, struct job *j)
{
    cons_job_set_state(e, j, JOB_LOOSE);
}

/* A copy of a delivery its marker says was delivered: counted, and reported as a duplicate
 * (after the delivery's own outcome again, as the marker remembers it). */
static void delivered_copy(cons_engine_t *e, struct job *j, const struct cons_done_info *info)
{
    e->st.duplicates++;
    sl_counter_inc(cons_m.duplicates);
    j->after = AFTER_COMPLETE;
    struct sl_outcome o;
    if (info->attempt > 0) {
        /* The delivery's own outcome again, as the marker remembers it: the same
         * (attempt, state, ts) is the same history row, so the recorder keeps one;
         * when the first one was lost (the pod that delivered was killed before its
         * acknowledgement), this one fills the gap. */
        cons_outcome_init(e, j, &o, SL_OUTCOME_DELIVERED, info->attempt);
        o.ts_ms = (uint64_t)info->ts_ms;
        o.http = info->status;
        o.lat_us = info->lat_us;
        o.msg = "reported again from the delivered marker";
        if (cons_produce_outcome(e, j, &o) != 0) {
            cons_job_free(e, j);
            return;
        }
    }
    cons_outcome_init(e, j, &o, SL_OUTCOME_DUPLICATE, 0);
    if (cons_produce_outcome(e, j, &o) != 0 && j->acks_pending == 0)
        cons_job_free(e, j);
}

/*
 * Whether the Kafka job j is a copy of a delivery another job of this loop holds (queued,
 * sending or settling; its marker or retry job not written yet, so the Redis check passed
 * it): that one owns the delivery, as a retry chain would, and j is not to be sent (a copy
 * re-published at once, as by a client retrying its publish, was sent twice). Otherwise j
 * becomes the holder of its job id until it is freed, also in place of a holder from an
 * assignment revoked since (a copy completed behind that one could be lost with it). Replays
 * are always sent.
 */
static bool live_copy(cons_engine_t *e, struct job *j)
{
    if (j->src != SRC_KAFKA)
        return false;
    struct job *holder = sl_map_get(e->live_ids, j->job_id);
    if (holder && cons_offsets_current(e->offsets, &holder->off))
        return !j->d.replay;
    if (holder) /* of an assignment revoked since (still sending or settling): its offset no
                 * longer counts, so j is the copy whose outcome completes the record now */
        holder->live_id = false;
    sl_map_put(e->live_ids, j->job_id, j, NULL);
    j->live_id = true;
    return false;
}

/* Marker check for a batch, then duplicates out, the rest queued. */
static void intake_batch(cons_engine_t *e, struct job **jobs, size_t n)
{
    if (n == 0)
        return;
    const char **eps = sl_xcalloc(n, sizeof(*eps));
    const char **ids = sl_xcalloc(n, sizeof(*ids));
    const char **jids = sl_xcalloc(n, sizeof(*jids));
    unsigned char *dup = sl_xcalloc(n, 1);
    struct cons_done_info *info = sl_xcalloc(n, sizeof(*info));
    for (size_t i = 0; i < n; i++) {
        eps[i] = jobs[i]->d.ep;
        ids[i] = jobs[i]->d.id;
        /* a record from Kafka may be a copy read again while its retry chain runs */
        jids[i] = jobs[i]->src == SRC_KAFKA ? jobs[i]->job_id : NULL;
    }
    sl_err_t err;
    if (cons_store_intake_check(e->redis, (uint32_t)e->cfg->retry_shards, n, eps, ids, jids, dup,
                                info, &err) != 0) {
        cons_warn_redis(e, &err);
        if (!e->cfg->dedup_fail_open) {
            /* hold them (intake pauses meanwhile) and check again when Redis answers */
            ihold_push(e, jobs, n);
            cons_timer_arm(&e->timers, T_IHOLD, sl_mono_ms() + REDIS_HOLD_RETRY_MS);
            n = 0;
        } else {
            memset(dup, 0, n); /* fail open: at-least-once */
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct job *j = jobs[i];
        if (dup[i] == CONS_DONE_CHAIN && !j->d.replay) {
            /* Its retry job exists (leased, scheduled or deferred): that chain owns the
             * delivery and reports it; this copy, read again after a rebalance or a lost
             * commit, must not send it in parallel (or after the chain's dead letter). */
            e->st.duplicates++;
            sl_counter_inc(cons_m.duplicates);
            cons_job_done_quiet(e, j);
            continue;
        }
        if (dup[i] == CONS_DONE_DEAD && !j->d.replay) {
            /* Dead-lettered already (the record was read again): nothing to send and nothing
             * new to report; a replay is the way to send it again. */
            e->st.duplicates++;
            sl_counter_inc(cons_m.duplicates);
            j->after = AFTER_COMPLETE;
            cons_job_done_quiet(e, j);
            continue;
        }
        if (dup[i] == CONS_DONE_DELIVERED) {
            delivered_copy(e, j, &info[i]);
            continue;
        }
        if (live_copy(e, j)) {
            e->st.duplicates++;
            sl_counter_inc(cons_m.duplicates);
            cons_job_done_quiet(e, j);
            continue;
        }
        enqueue(e, j);
    }
    free(eps);
    free(ids);
    free(jids);
    free(dup);
    free(info);
}

/* dedup_fail_open=false: check the held records again, about once a second. */
void cons_retry_ihold(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (cons_list_empty(&e->ihold)) {
        cons_timer_disarm(&e->timers, T_IHOLD);
        return;
    }
    if (!cons_timer_expired(&e->timers, T_IHOLD, now))
        return;
    cons_timer_disarm(&e->timers, T_IHOLD);
    size_t n = e->ihold.n;
    struct job **jobs = sl_xcalloc(n, sizeof(struct job *));
    for (size_t i = 0; i < n; i++) {
        jobs[i] = cons_job_of(cons_list_first(&e->ihold)); /* oldest first */
        cons_ihold_take(e, jobs[i]);
    }
    intake_batch(e, jobs, n); /* holds them again if Redis still does not answer */
    if (cons_list_empty(&e->ihold)) {
        sl_info("redis", "intake_resumed", "%zu held records checked after redis came back", n);
        cons_timer_arm(&e->timers, T_CLAIM, now); /* claims were held back meanwhile */
    }
    free(jobs);
}

/* Whether the waiting job j may be looked up again: its endpoint is in the table now, or the
 * table has caught up with the endpoints topic since j came (*synced), or j waited long
 * enough. */
static bool epwait_ready(cons_engine_t *e, const struct job *j, int64_t now, bool *synced)
{
    *synced = sl_endpoints_synced(e->endpoints, j->ep_ticket);
    if (*synced)
        return true;
    const struct sl_endpoint *ep = sl_endpoints_get(e->endpoints, j->d.ep);
    sl_endpoint_release(ep);
    *synced = ep != NULL;
    return *synced || now >= j->ep_wait_until;
}

/* Look up again, oldest first, the endpoints of the waiting records that are ready
 * (epwait_ready); the ones found go on to the duplicate check, the others are quarantined as
 * unknown. An endpoint's records leave in their order: once one of them stays, its later ones
 * stay too. */
void cons_retry_epwait(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (cons_list_empty(&e->epwait)) {
        cons_timer_disarm(&e->timers, T_EPWAIT);
        return;
    }
    if (!cons_timer_expired(&e->timers, T_EPWAIT, now))
        return;
    size_t n = 0, cap = e->epwait.n;
    struct job **ready = sl_xcalloc(cap, sizeof(struct job *));
    sl_map_t *stays = NULL; /* endpoints with a record left waiting in this pass */
    struct cons_link *k, *nx;
    CONS_LIST_FOREACH_SAFE(&e->epwait, k, nx)
    {
        struct job *j = cons_job_of(k);
        bool synced = false;
        if ((stays && sl_map_get(stays, j->d.ep)) || !epwait_ready(e, j, now, &synced)) {
            if (!stays)
                stays = sl_map_new(8);
            sl_map_put(stays, j->d.ep, (void *)1, NULL);
            continue;
        }
        cons_epwait_take(e, j);
        j->ep_waited = true;
        j->ep_synced = synced;
        if (intake_endpoint(e, j))
            ready[n++] = j;
    }
    sl_map_destroy(stays, NULL);
    if (cons_list_empty(&e->epwait))
        cons_timer_disarm(&e->timers, T_EPWAIT);
    else
        cons_timer_arm(&e->timers, T_EPWAIT, now + EPWAIT_CHECK_MS);
    if (!cons_list_empty(&e->ihold))
        ihold_push(e, ready, n); /* behind the records that wait for their duplicate check */
    else
        intake_batch(e, ready, n);
    free(ready);
}

/* Pause or resume every assigned partition (the caller logs why). */
static void set_intake_paused(cons_engine_t *e, bool pause)
{
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(e->consumer, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a) {
        if (pause)
            rd_kafka_pause_partitions(e->consumer, a);
        else
            rd_kafka_resume_partitions(e->consumer, a);
        rd_kafka_topic_partition_list_destroy(a);
    }
    e->paused = pause;
    e->full_since_mono = 0;
    cons_timer_disarm(&e->timers, T_INTAKE_STUCK);
}

/*
 * Intake is full (live_cap jobs in memory). The records librdkafka fetched stay in its queue,
 * untouched, and the loop takes them as answers make room: a pause would purge them
 * (librdkafka 2.0.2 drops a paused partition's fetched records and fetches them again on
 * resume), and a loop that paused at every burst fetched and decompressed everything twice;
 * at 11,000/s that held two loops at 6,000-7,500/s together until the publisher stopped
 * (bench/README.md, "Intake at its cap"). A rebalance does not wait behind those records
 * (librdkafka pauses the partitions itself before it hands one over), but it is only served by a
 * poll: a loop that could take no record for INTAKE_STUCK_MS (every request waits on slow
 * endpoints) pauses, and polls for events alone until it has room again. Returns whether the
 * partitions are paused now.
 */
static bool intake_full(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (e->full_since_mono == 0) {
        e->full_since_mono = now;
        cons_timer_arm(&e->timers, T_INTAKE_STUCK, now + INTAKE_STUCK_MS);
        return false;
    }
    if (now - e->full_since_mono < INTAKE_STUCK_MS)
        return false;
    /* counted before the pause, which adds an op per partition to the queue */
    int64_t fetched = (int64_t)rd_kafka_queue_length(e->cq);
    set_intake_paused(e, true);
    SL_LOGKV(
        SL_LOG_INFO, "kafka", "intake_paused",
        ((struct sl_log_kv[]){SL_KV_I("in_memory", (int64_t)e->live), SL_KV_I("fetched", fetched)}),
        "intake paused: %llu jobs in memory, and none could be taken for %d ms; the %lld "
        "records fetched are dropped and fetched again on resume",
        (unsigned long long)e->live, INTAKE_STUCK_MS, (long long)fetched);
    return true;
}

/*
 * Whether intake may poll now, pausing or resuming the partitions first. Records wait for
 * their duplicate check (Redis down, dedup_fail_open false), or intake is full and stuck
 * (intake_full): pause the partitions but keep polling, so rebalances are still served (a pod
 * that stopped polling would hold up the whole group until max.poll.interval.ms). Full but
 * not yet stuck: take nothing now (false); an answer makes room.
 */
static bool intake_gate(cons_engine_t *e)
{
    if (!cons_list_empty(&e->ihold)) {
        if (!e->paused) {
            set_intake_paused(e, true);
            sl_info("kafka", "intake_paused",
                    "intake paused: %zu records wait for their duplicate check", e->ihold.n);
        }
        return true;
    }
    if (e->live >= e->live_cap) {
        spill_stuck_queues(e);
        return e->paused || intake_full(e);
    }
    e->full_since_mono = 0; /* it has room: not stuck */
    cons_timer_disarm(&e->timers, T_INTAKE_STUCK);
    if (e->paused && e->live >= e->live_resume)
        spill_stuck_queues(e); /* queues that stopped keeping up since the pause */
    if (e->paused && e->live < e->live_resume) {
        set_intake_paused(e, false);
        SL_LOGKV(SL_LOG_INFO, "kafka", "intake_resumed",
                 ((struct sl_log_kv[]){SL_KV_S("reason", "room")}), "intake resumed");
    }
    return true;
}

/* A job for a record polled from Kafka, its offset tracked; NULL when the record is not this
 * pod's (any more). The record is the caller's to destroy. */
static struct job *intake_take(cons_engine_t *e, const rd_kafka_message_t *m)
{
    struct job *j = cons_job_new(e, SRC_KAFKA, m->payload ? m->payload : "", m->len);
    j->partition = m->partition;
    j->offset = m->offset;
    if (!m->key || m->key_len == 0 || m->key_len > SL_ENDPOINT_ID_MAX ||
        memchr(m->key, '\0', m->key_len)) {
        j->key_bad = true;
    } else {
        memcpy(j->key, m->key, m->key_len);
        j->key[m->key_len] = '\0';
    }
    if (!cons_offsets_track(e->offsets, m->partition, m->offset, &j->off)) {
        cons_job_free(e, j); /* not ours (any more): the owner gets it */
        return NULL;
    }
    e->st.received++;
    sl_counter_inc(cons_m.received);
    return j;
}

/* Take what fits from Kafka (paused, the poll only serves events: rebalances), decode and
 * resolve it, then check it for duplicates and queue it. */
void cons_intake_kafka(cons_engine_t *e)
{
    e->kafka_more = false;
    if (e->stopping || !intake_gate(e))
        return;
    int room = INTAKE_BATCH;
    if (!e->paused && e->live_cap - e->live < (uint64_t)room)
        room = (int)(e->live_cap - e->live);
    struct job *batch[INTAKE_BATCH];
    size_t n = 0;
    for (int i = 0; i < room; i++) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(e->consumer, 0);
        if (!m)
            break;
        struct job *j = NULL;
        if (!m->err)
            j = intake_take(e, m);
        else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            sl_warn("kafka", "consume_error", "%s", rd_kafka_message_errstr(m));
        rd_kafka_message_destroy(m);
        if (!j)
            continue;
        if (i == INTAKE_BATCH - 1)
            e->kafka_more = true;
        if (intake_resolve(e, j))
            batch[n++] = j;
    }
    /* A revoke served inside a poll above (the rebalance callback) dropped the queued jobs of
     * the partitions it took away, but not these, which are on no queue yet: drop them here,
     * or this pod would send records the new owner sends too. */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (cons_offsets_current(e->offsets, &batch[i]->off))
            batch[kept++] = batch[i];
        else
            cons_job_free(e, batch[i]);
    }
    if (!cons_list_empty(&e->ihold)) { /* fetched before the pause: behind the held ones */
        ihold_push(e, batch, kept);
        return;
    }
    intake_batch(e, batch, kept);
}

void cons_intake_redis(cons_engine_t *e)
{
    int64_t now_mono = sl_mono_ms();
    if (!cons_timer_expired(&e->timers, T_CLAIM, now_mono))
        return;
    cons_timer_arm(&e->timers, T_CLAIM, now_mono + CLAIM_INTERVAL_MS);
    if (e->stopping || !cons_list_empty(&e->ihold))
        return;
    uint32_t nshards = (uint32_t)e->cfg->retry_shards;
    for (uint32_t k = 0; k < nshards; k++) {
        if (e->live >= e->live_cap)
            return;
        int64_t room = (int64_t)(e->live_cap - e->live);
        int max = room < CLAIM_BATCH ? (int)room : CLAIM_BATCH;
        uint32_t shard = e->next_shard++ % nshards;
        struct cons_claimed *c = NULL;
        sl_err_t err;
        int64_t claim_mono = sl_mono_ms(); /* before asking: the lease starts no earlier */
        int got = cons_store_claim(e->redis, shard, e->cfg->lease_ms, max, &c, &err);
        if (got < 0) {
            cons_warn_redis(e, &err);
            return;
        }
        if (got > 0)
            sl_debug(SL_DBG_REDIS, "redis", "retries_claimed", "claimed %d due jobs from shard %u",
                     got, shard);
        struct job **batch = sl_xcalloc((size_t)(got ? got : 1), sizeof(struct job *));
        size_t n = 0;
        for (int i = 0; i < got; i++) {
            struct job *j = cons_job_new(e, SRC_REDIS, c[i].body, c[i].body_len);
            memcpy(j->job_id, c[i].job_id, sizeof(j->job_id));
            memcpy(j->token, c[i].token, sizeof(j->token));
            j->lease_until_mono = claim_mono + e->cfg->lease_ms;
            cons_leased_link(e, j);
            e->st.claimed++;
            sl_counter_inc(cons_m.claimed);
            if (intake_resolve(e, j))
                batch[n++] = j;
        }
        cons_store_claimed_free(c, got);
        intake_batch(e, batch, n);
        free(batch);
    }
}
