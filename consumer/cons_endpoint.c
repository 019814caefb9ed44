/*
 * cons_endpoint: this loop's runtime view of each endpoint (struct cons_ep): the snapshot
 * and its signer, the queue of jobs waiting for a slot, the ready and paused (blocked) lists,
 * latency samples and the P95 that lowers the breaker threshold, the AIMD concurrency window
 * after throttling, leased rate tokens, and the local view of the shared breaker (probe
 * ownership included).
 *
 * State transitions: JOB_QUEUED -> JOB_LOOSE in cons_q_take (the queue's one exit; cons_q_pop
 * takes the head). cons_ep_observe is the endpoint half of a finished request (what the answer
 * says about the endpoint); request_disable asks the registry to disable it.
 *
 * thread: the engine's loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_time.h"
#include "consumer/cons_backoff.h"
#include "consumer/cons_engine_int.h"

struct cons_ep *cons_ep_get(cons_engine_t *e, const char *id)
{
    struct cons_ep *ce = sl_map_get(e->eps, id);
    if (ce)
        return ce;
    ce = sl_xcalloc(1, sizeof(*ce));
    ce->eng = e;
    (void)snprintf(ce->id, sizeof(ce->id), "%s", id);
    ce->brk = CONS_BRK_CLOSED;
    ce->last_answer_mono = sl_mono_ms(); /* silent only from now on (cons_intake.c) */
    cons_list_init(&ce->queue);
    sl_map_put(e->eps, id, ce, NULL); /* ce->m once the endpoint is known (cons_ep_refresh) */
    return ce;
}

/* Refresh the endpoint snapshot and signer of ce; returns the snapshot or NULL (unknown). */
const struct sl_endpoint *cons_ep_refresh(cons_engine_t *e, struct cons_ep *ce)
{
    ce->ep_gen = sl_endpoints_generation(e->endpoints); /* before the read: a change after
                                                           it is seen next time */
    const struct sl_endpoint *cur = sl_endpoints_get(e->endpoints, ce->id);
    if (!cur) {
        sl_endpoint_release(ce->ep);
        ce->ep = NULL;
        return NULL;
    }
    if (!ce->m) /* not before: ids nobody registered would each keep a metrics entry */
        ce->m = cons_metrics_endpoint(ce->id);
    int64_t now = sl_now_ms();
    bool rebuild = !ce->ep || cur->version != ce->ep_version || !ce->signer ||
                   (ce->signer_until_ms && now >= ce->signer_until_ms);
    sl_endpoint_release(ce->ep);
    ce->ep = cur;
    if (!rebuild)
        return cur;
    struct sl_secret active[SL_SECRETS_MAX];
    size_t n = 0;
    int64_t until = 0;
    for (size_t i = 0; i < cur->n_secrets; i++) {
        int64_t exp = (int64_t)cur->secret_exp_ms[i];
        if (exp != 0 && exp <= now)
            continue;
        active[n++] = cur->secrets[i];
        if (exp != 0 && (until == 0 || exp < until))
            until = exp;
    }
    sl_signer_destroy(ce->signer);
    ce->signer = NULL;
    if (n > 0) {
        sl_err_t err;
        if (sl_signer_new(active, n, &ce->signer, &err) != 0)
            sl_error("sign", "signer_failed", "cannot build signer for endpoint %s: %s", ce->id,
                     err.msg);
    }
    sl_secret_wipe(active, sizeof(active));
    ce->signer_until_ms = until;
    ce->ep_version = cur->version;
    return cur;
}

void cons_ready_push(cons_engine_t *e, struct cons_ep *ce)
{
    if (!cons_link_linked(&ce->ready_link))
        cons_list_push_tail(&e->ready, &ce->ready_link);
}

struct cons_ep *cons_ready_pop(cons_engine_t *e)
{
    struct cons_link *k = cons_list_pop_head(&e->ready);
    return k ? CONS_CONTAINER(k, struct cons_ep, ready_link) : NULL;
}

struct cons_retry_policy cons_policy_of(const cons_engine_t *e, const struct sl_endpoint *ep)
{
    struct cons_retry_policy p;
    p.base_ms = ep ? ep->retry_base_ms : e->cfg->retry_base_ms;
    p.cap_ms = ep ? ep->retry_cap_ms : e->cfg->retry_cap_ms;
    p.max_attempts = (uint32_t)(ep ? ep->max_attempts : e->cfg->max_attempts);
    return p;
}

static void lat_record(struct cons_ep *ce, int64_t total_us)
{
    uint32_t ms = total_us / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(total_us / 1000);
    ce->lat_ms[ce->lat_pos] = ms;
    ce->lat_at_s[ce->lat_pos] = (uint32_t)(sl_mono_ms() / 1000);
    ce->lat_pos = (ce->lat_pos + 1) % LAT_RING;
    if (ce->nlat < LAT_RING)
        ce->nlat++;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* P95 latency (ms) of this pod's recent attempts to ce; -1 with too few samples. */
static int64_t lat_p95(const struct cons_ep *ce)
{
    uint32_t tmp[LAT_RING];
    uint32_t now_s = (uint32_t)(sl_mono_ms() / 1000);
    size_t n = 0;
    for (uint32_t i = 0; i < ce->nlat; i++) {
        if (now_s - ce->lat_at_s[i] <= LAT_WINDOW_S)
            tmp[n++] = ce->lat_ms[i];
    }
    if (n < LAT_MIN_SAMPLES)
        return -1;
    qsort(tmp, n, sizeof(tmp[0]), cmp_u32);
    return tmp[(n - 1) * 95 / 100];
}

/* Breaker threshold for ce: lowered while its P95 is slow, because slow failures tie up
 * capacity for the whole timeout. */
static int64_t brk_threshold(const cons_engine_t *e, const struct cons_ep *ce)
{
    int64_t th = ce->ep ? ce->ep->brk_threshold : e->cfg->breaker_threshold;
    int64_t p95 = lat_p95(ce);
    if (p95 > e->cfg->breaker_slow_p95_ms && e->cfg->breaker_slow_threshold < th)
        th = e->cfg->breaker_slow_threshold;
    return th;
}

void cons_block_until(cons_engine_t *e, struct cons_ep *ce, int64_t until_mono)
{
    if (until_mono > ce->blocked_until_mono)
        ce->blocked_until_mono = until_mono;
    cons_timer_arm_min(&e->timers, T_UNBLOCK, ce->blocked_until_mono);
    if (!cons_link_linked(&ce->blocked_link))
        cons_list_push_tail(&e->blocked, &ce->blocked_link);
}

/* Return endpoints whose pause is over to the ready list; T_UNBLOCK is left at the earliest
 * pause still running. */
void cons_unblock(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (!cons_timer_expired(&e->timers, T_UNBLOCK, now))
        return;
    cons_timer_disarm(&e->timers, T_UNBLOCK);
    struct cons_link *k, *nx;
    CONS_LIST_FOREACH_SAFE(&e->blocked, k, nx)
    {
        struct cons_ep *ce = CONS_CONTAINER(k, struct cons_ep, blocked_link);
        if (now >= ce->blocked_until_mono) {
            cons_list_unlink(&e->blocked, k);
            ce->blocked_until_mono = 0;
            if (!cons_list_empty(&ce->queue))
                cons_ready_push(e, ce);
        } else {
            cons_timer_arm_min(&e->timers, T_UNBLOCK, ce->blocked_until_mono);
        }
    }
}

/* The endpoint's configured cap on requests in flight. Like endpoint_backlog it holds per
 * loop, as it holds per pod: an endpoint's records share a key, so its partition and the
 * loop reading it (claimed retries come to any loop of any pod). */
static int64_t ep_cap(const cons_engine_t *e, const struct cons_ep *ce)
{
    return ce->ep ? ce->ep->max_inflight : e->cfg->max_inflight_per_endpoint;
}

/* Effective in-flight cap: the endpoint's cap, shrunk by the AIMD window after 429s. */
int64_t cons_inflight_cap(const cons_engine_t *e, const struct cons_ep *ce)
{
    int64_t cap = ep_cap(e, ce);
    if (ce->cwnd > 0 && (int64_t)ce->cwnd < cap)
        cap = (int64_t)ce->cwnd < 1 ? 1 : (int64_t)ce->cwnd;
    return cap;
}

/* One token from the endpoint's shared bucket (leased in small batches). Returns true when
 * ce may send now; otherwise ce is paused until the bucket refills. */
bool cons_rate_allows(cons_engine_t *e, struct cons_ep *ce)
{
    const struct sl_endpoint *ep = ce->ep;
    if (!ep || ep->rate <= 0)
        return true;
    int64_t now = sl_mono_ms();
    if (ce->tokens > 0 && now < ce->tokens_until_mono) {
        ce->tokens--;
        return true;
    }
    /* A lease of at most ~1/10 s of the rate (at most the burst), sized to what this pod will
     * use: the jobs it has queued, or twice what it used of its last lease. Tokens a lease
     * holds unused expire with it and are lost to the other pods sharing the bucket: ten
     * pods each sending a trickle to one endpoint would each hold a tenth of a second of its
     * rate and together reach only a fraction of it. A pod with a steady flow doubles its
     * lease each time it uses a whole one, so busy endpoints still cost one Redis call per
     * tenth of a second. */
    int64_t cap = ep->rate * 100 / (ep->rate_period_ms > 0 ? ep->rate_period_ms : 1000);
    int64_t size = ep->burst > 0 ? ep->burst : ep->rate; /* the bucket's */
    if (cap > size)
        cap = size;
    int64_t used = ce->lease_granted - (ce->tokens > 0 ? ce->tokens : 0);
    int64_t want = (int64_t)ce->queue.n > 2 * used ? (int64_t)ce->queue.n : 2 * used;
    if (want > cap)
        want = cap;
    if (want < 1)
        want = 1;
    int64_t granted = 0, wait = 0;
    sl_err_t err;
    if (cons_store_rate_take(e->redis, ce->id, ep->rate, ep->rate_period_ms, size, want, &granted,
                             &wait, &err) != 0) {
        cons_warn_redis(e, &err);
        cons_block_until(e, ce, now + 1000); /* without the bucket, do not risk exceeding it */
        return false;
    }
    ce->lease_granted = granted > 0 ? granted : 0;
    ce->tokens = 0;
    if (granted <= 0) {
        sl_counter_inc(cons_m.rate_limited);
        cons_block_until(e, ce, now + (wait > 0 ? wait : 10));
        return false;
    }
    ce->tokens = granted - 1;
    ce->tokens_until_mono = now + RATE_LEASE_MS;
    return true;
}

/* Ask the registry to disable ce (410, or nothing but failures for disable_after_ms): an
 * outcome with state "disabled" that the recorder applies to the registry, which republishes
 * the endpoint so every pod stops. This pod stops at once. */
static void request_disable(cons_engine_t *e, struct job *j, const char *why, const char *msg)
{
    struct cons_ep *ce = j->ce;
    if (ce->disabled_local)
        return;
    ce->disabled_local = true;
    ce->disabled_version = ce->ep ? ce->ep->version : 0;
    SL_LOGKV(SL_LOG_WARN, "deliver", "endpoint_disable_requested",
             ((struct sl_log_kv[]){SL_KV_S("reason", why)}),
             "asking the registry to disable endpoint %s: %s", ce->id, msg);
    struct job *n = cons_job_new(e, SRC_REDIS, "", 0); /* carries only the outcome */
    sl_delivery_copy(&n->d, &j->d);
    n->after = AFTER_FINISH;
    n->token[0] = '\0';
    struct sl_outcome o;
    cons_outcome_init(e, n, &o, SL_OUTCOME_DISABLED, 0);
    o.err = why;
    o.msg = msg;
    if (cons_produce_outcome(e, n, &o) != 0)
        cons_job_free(e, n);
}

/* May the claimed job j be sent now? Only while the lease is ours with room for the whole
 * request; a lease short of that is renewed first. */
/* How long a lease (a retry job's, or the breaker probe's) must last to cover one request to
 * ce: its timeout, which may exceed lease_ms (it is per endpoint; lease_ms is only checked
 * against the global one), plus the margin. */
int64_t cons_request_lease_ms(const cons_engine_t *e, const struct cons_ep *ce)
{
    return (ce && ce->ep ? ce->ep->timeout_ms : e->cfg->http_timeout_ms) + LEASE_MARGIN_MS;
}

/*
 * sluice_breaker_open_endpoints counts the endpoints whose breaker holds deliveries back: open,
 * as this pod last saw it, until its cooldown has ended and a probe had the time to be sent
 * and answered (the endpoint's request timeout and two sweeps: a failed probe reopens it
 * before that, so a broken endpoint with traffic stays counted without a gap). An open breaker
 * past that waits for a probe that only traffic brings: an endpoint nobody sends to, deleted
 * since, or whose Redis state was lost would otherwise stay counted (and alerting) for ever.
 */
static void brk_count(struct cons_ep *ce, int64_t now_mono)
{
    int64_t grace = cons_request_lease_ms(ce->eng, ce) + 2 * (int64_t)STATS_INTERVAL_MS;
    bool want = ce->brk == CONS_BRK_OPEN && now_mono < ce->brk_reopen_mono + grace;
    if (want != ce->brk_counted) {
        cons_metrics_breaker_open(ce->id, ce->m, want);
        ce->brk_counted = want;
    }
}

void cons_brk_sweep(cons_engine_t *e, int64_t now_mono)
{
    size_t it = 0;
    const char *key;
    void *val;
    while (sl_map_next(e->eps, &it, &key, &val)) {
        struct cons_ep *ce = val;
        if (ce->brk_counted)
            brk_count(ce, now_mono);
    }
}

static void brk_apply(struct cons_ep *ce, const struct cons_brk_view *v)
{
    if (v->state != ce->brk)
        sl_counter_inc(v->state == CONS_BRK_OPEN        ? cons_m.brk_to_open
                       : v->state == CONS_BRK_HALF_OPEN ? cons_m.brk_to_half_open
                                                        : cons_m.brk_to_closed);
    ce->brk = v->state;
    ce->brk_failures = v->failures;
    /* Redis's times as a distance from Redis's now, onto this pod's monotonic clock */
    ce->brk_reopen_mono = v->reopen_at_ms ? sl_mono_ms() + (v->reopen_at_ms - v->now_ms) : 0;
    ce->brk_open_for_ms =
        v->state != CONS_BRK_CLOSED && v->open_since_ms > 0 ? v->now_ms - v->open_since_ms : 0;
    ce->brk_refreshed_mono = sl_mono_ms();
    brk_count(ce, ce->brk_refreshed_mono);
}

/* The one exit of JOB_QUEUED: take j off its endpoint's queue. */
void cons_q_take(cons_engine_t *e, struct job *j)
{
    cons_job_set_state(e, j, JOB_LOOSE);
}

struct job *cons_q_head(const struct cons_ep *ce)
{
    return cons_job_of(cons_list_first(&ce->queue));
}

/* Take the head of ce's queue (non-empty) to send, as a probe or not. */
struct job *cons_q_pop(cons_engine_t *e, struct cons_ep *ce, bool probe)
{
    struct job *j = cons_q_head(ce);
    cons_q_take(e, j);
    j->probe = probe;
    return j;
}

/* The breaker owner id of this pod's probe number seq ("<pod>/<seq>"), or of its other
 * requests (seq 0: "<pod>"). Naming the probe, not just the pod, keeps a late failure of one
 * of the pod's earlier requests from counting as the probe's (it would re-open the breaker
 * and double the cooldown while the probe still runs). */
static void probe_owner(const cons_engine_t *e, uint64_t seq, char out[CONS_STORE_OWNER_MAX + 1])
{
    if (seq)
        (void)snprintf(out, CONS_STORE_OWNER_MAX + 1, "%s/%llu", e->owner, (unsigned long long)seq);
    else
        (void)snprintf(out, CONS_STORE_OWNER_MAX + 1, "%s", e->owner);
}

/* May ce send now? Consults the shared breaker only when the local view is not closed. */
bool cons_breaker_allows(cons_engine_t *e, struct cons_ep *ce, bool *probe)
{
    *probe = false;
    int64_t now_mono = sl_mono_ms();
    if (ce->brk == CONS_BRK_CLOSED) {
        /* A closed view may be stale: another pod may have opened the breaker. Read the
         * shared state before this pod's first request to the endpoint (it may claim
         * deferred jobs of a breaker that another pod opened), about once a second while
         * failures were seen here recently, and every BRK_STALE_MS anyway. */
        int64_t age = now_mono - ce->brk_refreshed_mono;
        bool recent = ce->last_failure_mono && now_mono - ce->last_failure_mono < 60000;
        if (ce->brk_refreshed_mono == 0 || (recent && age > BRK_REFRESH_MS) || age > BRK_STALE_MS) {
            struct cons_brk_view v;
            sl_err_t err;
            if (cons_store_brk_get(e->redis, ce->id, &v, &err) == 0)
                brk_apply(ce, &v);
        }
        if (ce->brk == CONS_BRK_CLOSED)
            return true;
    }
    if (ce->probe_inflight)
        return false;
    if (ce->brk == CONS_BRK_OPEN && sl_mono_ms() < ce->brk_reopen_mono)
        return false;
    struct cons_brk_view v;
    sl_err_t err;
    /* the probe's lease outlasts its request: while it runs, no other pod probes */
    int64_t probe_lease = cons_request_lease_ms(e, ce);
    if (probe_lease < e->cfg->lease_ms)
        probe_lease = e->cfg->lease_ms;
    char owner[CONS_STORE_OWNER_MAX + 1];
    probe_owner(e, ce->probe_seq + 1, owner);
    if (cons_store_brk_acquire(e->redis, ce->id, probe_lease, owner, &v, &err) != 0) {
        cons_warn_redis(e, &err);
        return false;
    }
    brk_apply(ce, &v);
    if (v.state == CONS_BRK_CLOSED)
        return true;
    if (v.probe) {
        ce->probe_seq++;
        *probe = true;
        return true;
    }
    return false;
}

/* Latency samples of an answered attempt (or a timeout): the P95 ring and the histograms. */
static void observe_latency(struct cons_ep *ce, const struct cons_http_result *r)
{
    if (r->status > 0 || r->curl_code == CURLE_OPERATION_TIMEDOUT) {
        lat_record(ce, r->total_us);
        if (ce->m)
            sl_histo_observe_us(&ce->m->duration, r->total_us);
    }
    if (r->status > 0) {
        if (r->connect_us > 0)
            sl_histo_observe_us(cons_m.phase_connect, r->connect_us);
        if (r->tls_us > 0)
            sl_histo_observe_us(cons_m.phase_tls, r->tls_us);
        sl_histo_observe_us(cons_m.phase_first_byte, r->ttfb_us);
        sl_histo_observe_us(cons_m.phase_total, r->total_us);
    }
}

/* An answer that asks the sender to slow down: 429, 502 and 504 (Standard Webhooks: a rate
 * limit, a server under load), or any transient failure with a Retry-After. */
static bool is_throttle(const struct cons_http_result *r, enum cons_verdict v, int64_t ra_ms)
{
    if (r->refusal == CONS_REFUSAL_PROXY || r->refusal == CONS_REFUSAL_TUNNEL ||
        r->refusal == CONS_REFUSAL_PROXY_DOWN)
        return false; /* the delivery proxy's answer, not the endpoint's */
    return r->status == 429 || r->status == 502 || r->status == 504 ||
           (v == CONS_RETRY && ra_ms > 0);
}

/*
 * The AIMD window: a throttle halves the endpoint's concurrency window, once per round trip
 * (answers to requests sent before the last cut do not cut it again, or a burst of 100
 * answers in flight would take it to 1), and pauses the endpoint (all its queued deliveries,
 * not just this one) for the Retry-After it asked for, or 1 s after a 429 without one;
 * successes grow the window back by about one request per round trip.
 */
static void observe_throttle(cons_engine_t *e,
                             struct cons_ep *ce,
                             const struct cons_http_result *r,
                             enum cons_verdict v,
                             int64_t ra_ms)
{
    int64_t now = sl_mono_ms();
    if (is_throttle(r, v, ra_ms)) {
        sl_counter_inc(cons_m.throttled);
        int64_t pause_ms = ra_ms > 0 ? ra_ms : r->status == 429 ? 1000 : 0;
        if (pause_ms > 0)
            cons_block_until(e, ce, now + pause_ms);
        int64_t sent = now - (r->total_us > 0 ? r->total_us / 1000 : 0);
        if (ce->cwnd_cut_mono != 0 && sent < ce->cwnd_cut_mono)
            return; /* this round trip already cut the window */
        double cap = (double)ep_cap(e, ce);
        double w = ce->cwnd > 0 ? ce->cwnd : cap;
        ce->cwnd = w / 2 < 1 ? 1 : w / 2;
        ce->cwnd_cut_mono = now;
        SL_LOGKV(SL_LOG_INFO, "deliver", "endpoint_throttled",
                 ((struct sl_log_kv[]){SL_KV_I("status", r->status), SL_KV_I("pause_ms", pause_ms),
                                       SL_KV_I("window", (int64_t)ce->cwnd)}),
                 "endpoint %s asked to slow down", ce->id);
    } else if (v == CONS_DELIVERED && ce->cwnd > 0) {
        double cap = (double)ep_cap(e, ce);
        ce->cwnd += 1.0 / ce->cwnd;
        if (ce->cwnd >= cap)
            ce->cwnd = 0; /* fully recovered: no window */
    }
}

/* The shared breaker's count. Only transient failures count against an endpoint (429 is a
 * throttle signal, not ill health); a probe that got any answer other than a transient
 * failure proves the endpoint is back. A healthy endpoint with a closed view costs no call. */
static void observe_breaker(cons_engine_t *e, struct cons_ep *ce, bool was_probe, bool failure)
{
    if (!(failure || ce->brk_failures > 0 || was_probe || ce->brk != CONS_BRK_CLOSED) ||
        cons_redis_given_up(e))
        return;
    struct cons_brk_view bv;
    sl_err_t err;
    const struct sl_endpoint *ep = ce->ep;
    int64_t threshold = brk_threshold(e, ce);
    int64_t cooldown = ep ? ep->brk_cooldown_ms : e->cfg->breaker_cooldown_ms;
    char owner[CONS_STORE_OWNER_MAX + 1];
    probe_owner(e, was_probe ? ce->probe_seq : 0, owner);
    if (cons_store_brk_record(e->redis, ce->id, failure ? 0 : 1, threshold, cooldown,
                              e->cfg->breaker_cooldown_max_ms, owner, &bv, &err) != 0) {
        cons_warn_redis(e, &err);
        return;
    }
    enum cons_brk_state before = ce->brk;
    brk_apply(ce, &bv);
    if (before != CONS_BRK_OPEN && bv.state == CONS_BRK_OPEN)
        SL_LOGKV(SL_LOG_WARN, "breaker", "breaker_opened",
                 ((struct sl_log_kv[]){SL_KV_I("cooldown_ms", bv.cooldown_ms),
                                       SL_KV_I("failures", bv.failures)}),
                 "breaker opened for endpoint %s", ce->id);
    else if (before != CONS_BRK_CLOSED && bv.state == CONS_BRK_CLOSED)
        sl_info("breaker", "breaker_closed", "breaker closed for endpoint %s", ce->id);
}

/*
 * Asking the registry to disable the endpoint (j's delivery names it in the request): at a
 * 410, or when a failure finds the shared breaker open for disable_after_ms already, every
 * probe since it opened having failed. The breaker is the endpoint's record across all pods:
 * one loop's own view would count only the deliveries it happened to send (a loop that sees
 * an endpoint only through retries sees only failures), so a healthy endpoint could be
 * disabled for a few poison events.
 */
static void observe_failing(cons_engine_t *e,
                            struct cons_ep *ce,
                            struct job *j,
                            const struct cons_http_result *r,
                            enum cons_verdict v)
{
    if (v == CONS_DELIVERED || r->status == 429)
        return;
    if (v == CONS_PERMANENT_DISABLE)
        request_disable(e, j, "endpoint_gone", "endpoint answered 410 Gone");
    else if (e->cfg->disable_after_ms > 0 && ce->brk != CONS_BRK_CLOSED &&
             ce->brk_open_for_ms >= e->cfg->disable_after_ms)
        request_disable(e, j, "failing_too_long",
                        "nothing but failures for too long (breaker open, every probe failed)");
}

/*
 * What an answer (or its absence) says about the endpoint, whatever becomes of the job:
 * latency samples, a throttle (pause and AIMD window), the shared breaker's count, and the
 * failing streak that may ask the registry to disable the endpoint. j is the job answered;
 * was_probe: its request was the breaker's probe. Returns the Retry-After the answer asked
 * for (ms; 0 = none), for the job's own retry.
 */
int64_t cons_ep_observe(cons_engine_t *e,
                        struct cons_ep *ce,
                        struct job *j,
                        bool was_probe,
                        const struct cons_http_result *r,
                        enum cons_verdict v)
{
    observe_latency(ce, r);
    int64_t ra_ms = cons_retry_after_ms(r->status, r->retry_after_s, 0, e->cfg->retry_after_max_ms);
    observe_throttle(e, ce, r, v, ra_ms);
    /* the delivery proxy refused us or could not be reached: that says nothing about the
     * endpoint, so it neither counts on its breaker (a probe's lease runs out by itself, and
     * the next one probes again without a longer cooldown) nor toward disabling it */
    if (r->refusal == CONS_REFUSAL_PROXY || r->refusal == CONS_REFUSAL_PROXY_DOWN)
        return ra_ms;
    bool failure = v == CONS_RETRY && r->status != 429;
    if (failure)
        ce->last_failure_mono = sl_mono_ms();
    observe_breaker(e, ce, was_probe, failure);
    observe_failing(e, ce, j, r, v);
    return ra_ms;
}
