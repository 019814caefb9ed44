/*
 * cons_job: a delivery job's life in memory: its states, the one function that changes them,
 * its allocation and release, and its record bytes.
 *
 * cons_job_set_state is the only writer of j->state (the state table heads enum job_state in
 * cons_engine_int.h): it checks each change against job_next_ok, logs and asserts an illegal
 * one, keeps the job on the list its state names (so list membership and state never
 * disagree), and keeps the in-flight gauge. cons_job_free is the move to JOB_FREED. The lease
 * list of claimed retry jobs (cons_leased_link/unlink) is owned here too, as part of a job's
 * memory; renewing the leases is cons_lease.c's.
 *
 * thread: the engine's loop thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "common/sl_assert.h"
#include "common/sl_time.h"
#include "consumer/cons_engine_int.h"

static const char *const job_state_names[JOB_STATE_COUNT] = {
    [JOB_LOOSE] = "loose",           [JOB_EP_WAIT] = "ep_wait", [JOB_DEDUP_WAIT] = "dedup_wait",
    [JOB_QUEUED] = "queued",         [JOB_SENDING] = "sending", [JOB_MARKING] = "marking",
    [JOB_REDIS_HELD] = "redis_held", [JOB_ACKING] = "acking",   [JOB_FREED] = "freed",
};

#define JOB_TO(s) (1u << (s))

/* The legal transitions: job_next_ok[from] has bit `to` set. Every state with a list is left
 * for JOB_LOOSE by its one exit function, so a job is never on two lists at once; ACKING ->
 * ACKING is a job that produces another record while earlier ones wait. */
static const unsigned job_next_ok[JOB_STATE_COUNT] = {
    [JOB_LOOSE] = JOB_TO(JOB_EP_WAIT) | JOB_TO(JOB_DEDUP_WAIT) | JOB_TO(JOB_QUEUED) |
                  JOB_TO(JOB_SENDING) | JOB_TO(JOB_MARKING) | JOB_TO(JOB_REDIS_HELD) |
                  JOB_TO(JOB_ACKING) | JOB_TO(JOB_FREED),
    [JOB_EP_WAIT] = JOB_TO(JOB_LOOSE),
    [JOB_DEDUP_WAIT] = JOB_TO(JOB_LOOSE),
    [JOB_QUEUED] = JOB_TO(JOB_LOOSE),
    [JOB_SENDING] = JOB_TO(JOB_LOOSE),
    [JOB_MARKING] = JOB_TO(JOB_LOOSE),
    [JOB_REDIS_HELD] = JOB_TO(JOB_LOOSE),
    [JOB_ACKING] = JOB_TO(JOB_ACKING) | JOB_TO(JOB_FREED),
    [JOB_FREED] = 0,
};

bool cons_job_transition_ok(enum job_state from, enum job_state to)
{
    return from >= 0 && from < JOB_STATE_COUNT && to >= 0 && to < JOB_STATE_COUNT &&
           (job_next_ok[from] & JOB_TO(to)) != 0;
}

const char *cons_job_state_name(enum job_state s)
{
    return s >= 0 && s < JOB_STATE_COUNT ? job_state_names[s] : "?";
}

/* The list a job in state s is on, or NULL for the states without one. */
static struct cons_list *job_state_list(cons_engine_t *e, const struct job *j, enum job_state s)
{
    switch (s) {
    case JOB_EP_WAIT:
        return &e->epwait;
    case JOB_DEDUP_WAIT:
        return &e->ihold;
    case JOB_QUEUED:
        return &j->ce->queue;
    case JOB_SENDING:
        return &e->inflight;
    case JOB_MARKING:
        return &e->marks;
    case JOB_REDIS_HELD:
        return &e->held;
    default:
        return NULL;
    }
}

/*
 * The only place a job changes state: checks the transition, moves the job from the list of
 * its old state to the tail of its new state's list, and keeps the in-flight gauge. An
 * illegal transition is a bug: it is logged (job_state_illegal, with the caller) and, in
 * debug builds, asserted; a release build goes on with the change.
 */
void cons_job_set_state_(cons_engine_t *e, struct job *j, enum job_state to, const char *by)
{
    enum job_state from = j->state;
    if (!cons_job_transition_ok(from, to)) {
        sl_error("consumer", "job_state_illegal", "illegal job state change %s -> %s in %s",
                 cons_job_state_name(from), cons_job_state_name(to), by);
        SL_ASSERT(false, "job state %s -> %s in %s", cons_job_state_name(from),
                  cons_job_state_name(to), by);
    }
    struct cons_list *l = job_state_list(e, j, from);
    if (l)
        cons_list_unlink(l, &j->link);
    j->state = to;
    l = job_state_list(e, j, to);
    if (l)
        cons_list_push_tail(l, &j->link);
    if (to == JOB_SENDING || from == JOB_SENDING) {
        int64_t d = to == JOB_SENDING ? 1 : -1;
        sl_gauge_add(cons_m.inflight, d);
        sl_gauge_add(cons_m.queued, -d);
    }
}

struct job *cons_job_of(struct cons_link *k)
{
    return k ? CONS_CONTAINER(k, struct job, link) : NULL;
}

void cons_set_ctx(struct sl_log_ctx *ctx, const struct job *j)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->event_id = j->d.id;
    ctx->endpoint_id = j->d.ep;
    ctx->attempt = (int)j->d.attempt + 1;
    ctx->partition = j->src == SRC_KAFKA ? j->partition : -1;
    ctx->offset = j->src == SRC_KAFKA ? j->offset : -1;
    sl_log_ctx_set(ctx);
}

struct job *cons_job_new(cons_engine_t *e, enum job_src src, const void *raw, size_t len)
{
    struct job *j = sl_xcalloc(1, sizeof(*j));
    j->src = src;
    j->state = JOB_LOOSE;
    j->raw = sl_xmalloc(len ? len : 1);
    memcpy(j->raw, raw, len);
    j->raw_len = len;
    e->live++;
    sl_gauge_add(cons_m.queued, 1);
    if (e->live > e->live_max)
        e->live_max = e->live;
    return j;
}

/* The leased list: claimed retry jobs in memory, whose leases cons_renew_leases keeps alive until
 * their lease is released (reschedule) or the job is freed (invariant 6). */
void cons_leased_link(cons_engine_t *e, struct job *j)
{
    cons_list_push_tail(&e->leased, &j->lease_link);
    if (!cons_timer_armed(&e->timers, T_RENEW))
        cons_timer_arm(&e->timers, T_RENEW, sl_mono_ms());
}

void cons_leased_unlink(cons_engine_t *e, struct job *j)
{
    if (cons_link_linked(&j->lease_link))
        cons_list_unlink(&e->leased, &j->lease_link);
}

void cons_job_free(cons_engine_t *e, struct job *j)
{
    if (!j)
        return;
    cons_job_set_state(e, j, JOB_FREED);
    cons_leased_unlink(e, j);
    free(j->hdrs); /* one block: see hdr_block */
    free(j->url);
    free(j->held_msg);
    free(j->held_resp);
    sl_delivery_fini(&j->d);
    free(j->raw);
    if (j->is_spill)
        e->spills_live--;
    if (j->live_id)
        sl_map_del(e->live_ids, j->job_id, NULL);
    free(j);
    e->live--;
    sl_gauge_add(cons_m.queued, -1);
}

/*
 * The record bytes of a job are needed after intake only when its outcome carries them
 * (retry scheduled, deferred, dead letter: `retries rebuild` and replay read them there).
 * Most jobs are delivered, so keeping about 0.6 KiB of bytes beside the decoded copy of every
 * job in memory is wasted (12 MB of the consumer's RSS at 10,000 in flight: bench/README.md,
 * "Consumer memory").
 * When the decoded copy encodes back to exactly the bytes received (sluice-produce and the
 * producer library write the canonical encoding), the bytes are dropped; cons_job_env makes them
 * again, byte for byte, if an outcome needs them. A record that encodes back differently (an
 * unknown key kept for a newer reader, another encoder's key order) keeps its bytes.
 */
static int encode_canon(cons_engine_t *e, const struct job *j, sl_err_t *err)
{
    sl_buf_reset(&e->canon);
    return sl_delivery_encode_lim(&j->d, &e->lim, &e->canon, err);
}

void cons_drop_canonical_raw(cons_engine_t *e, struct job *j)
{
    if (!j->raw || !j->raw_len)
        return;
    if (encode_canon(e, j, NULL) != 0)
        return;
    if (e->canon.len != j->raw_len || memcmp(e->canon.data, j->raw, j->raw_len) != 0) {
        e->st.raw_kept++;
        return;
    }
    free(j->raw);
    j->raw = NULL;
}

/* The record bytes of j, made again from the decoded copy when cons_drop_canonical_raw dropped
 * them; owned by the job from then on (a held outcome may point at them). NULL on the
 * (unexpected) failure to encode, with an error line: the outcome goes without them. */
const uint8_t *cons_job_env(cons_engine_t *e, struct job *j, size_t *len)
{
    if (!j->raw && j->raw_len) {
        sl_err_t err;
        if (encode_canon(e, j, &err) != 0 || e->canon.len != j->raw_len) {
            sl_error("consumer", "record_reencode_failed",
                     "could not make a record's bytes again for its outcome: %s",
                     e->canon.len != j->raw_len ? "length differs" : err.msg);
            *len = 0;
            return NULL;
        }
        j->raw = sl_xmalloc(j->raw_len);
        memcpy(j->raw, e->canon.data, j->raw_len);
    }
    *len = j->raw ? j->raw_len : 0;
    return j->raw;
}
