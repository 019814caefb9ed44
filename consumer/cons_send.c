/*
 * cons_send: sending and results: the dispatch of ready endpoints (round-robin, in-flight
 * caps, breaker, rate tokens, leases), signing and building a request, the breaker deferral of
 * a queue, and the conclusion of a finished request.
 *
 * State transitions: JOB_LOOSE -> JOB_SENDING (start_send) and JOB_SENDING -> JOB_LOOSE
 * (cons_send_end: the in-flight list's one exit, for an answer or a cancel). A finished
 * request is handled in two halves: cons_ep_observe (cons_endpoint.c) learns what the answer says
 * about the endpoint, job_conclude decides the job's fate (marker, retry, dead letter).
 *
 * thread: the engine's loop thread only; on_http_done runs inside cons_http_run on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_fmt.h"
#include "common/sl_time.h"
#include "common/sl_url.h"
#include "consumer/cons_backoff.h"
#include "consumer/cons_engine_int.h"
#include "consumer/cons_postback.h"

static void on_http_done(void *opaque, const struct cons_http_result *r);

/* The one exit of JOB_SENDING: the request of j is over (answered, failed or cancelled);
 * its slot, its probe mark and its headers are released. */
void cons_send_end(cons_engine_t *e, struct job *j)
{
    cons_job_set_state(e, j, JOB_LOOSE);
    j->http = NULL;
    j->ce->inflight--;
    j->ce->last_answer_mono = sl_mono_ms();
    if (j->probe)
        j->ce->probe_inflight = false;
    free(j->hdrs);
    j->hdrs = NULL;
}

/* One request header line: "name: value", or name alone when value is NULL. */
struct hdr_line {
    const char *name;  /* header name, or the whole line */
    const char *value; /* value, or NULL */
};

/* Sluice's own lines (Content-Type, 3 signature lines, 2 X-Sluice-*, Expect) plus the
 * endpoint's and the record's extra headers. */
#define HDR_LINES_MAX (7 + 2 * SL_HDR_MAX)

/*
 * The request's header list in ONE allocation: n curl_slist nodes followed by their text.
 * CURLOPT_HTTPHEADER only reads the list, so the owner releases it with free(), never
 * curl_slist_free_all. curl_slist_append costs two allocations per line; at 7 lines per
 * delivery that was about 5% of the consumer's CPU (bench/README.md, "Consumer CPU").
 */
static struct curl_slist *hdr_block(const struct hdr_line *l, size_t n)
{
    size_t text = 0;
    for (size_t i = 0; i < n; i++)
        text += strlen(l[i].name) + (l[i].value ? 2 + strlen(l[i].value) : 0) + 1;
    struct curl_slist *nodes = sl_xmalloc(n * sizeof(*nodes) + text);
    char *p = (char *)(nodes + n);
    for (size_t i = 0; i < n; i++) {
        nodes[i].data = p;
        nodes[i].next = i + 1 < n ? &nodes[i + 1] : NULL;
        size_t len = strlen(l[i].name);
        memcpy(p, l[i].name, len);
        p += len;
        if (l[i].value) {
            *p++ = ':';
            *p++ = ' ';
            len = strlen(l[i].value);
            memcpy(p, l[i].value, len);
            p += len;
        }
        *p++ = '\0';
    }
    return nodes;
}

/* Whether the endpoint sets header name itself (any case): an event's header of that name is
 * left out, so a publisher cannot add a second value of an endpoint's credential. */
static bool ep_sets_header(const struct sl_endpoint *ep, const char *name)
{
    for (size_t i = 0; i < ep->n_hdr && i < SL_HDR_MAX; i++) {
        if (strcasecmp(ep->hdr[i].name, name) == 0)
            return true;
    }
    return false;
}

/*
 * j's endpoint as the registry has it now (ce is read again when anything changed since, or
 * when a secret of its signer has expired meanwhile: a job held for a Retry-After pause must
 * not go out signed with it), or NULL when it was deleted or disabled since j was queued: j
 * then ends as intake would have ended it, with no attempt spent.
 */
static const struct sl_endpoint *current_endpoint(cons_engine_t *e, struct job *j)
{
    struct cons_ep *ce = j->ce;
    if (ce->ep_gen != sl_endpoints_generation(e->endpoints) ||
        (ce->signer_until_ms && sl_now_ms() >= ce->signer_until_ms))
        (void)cons_ep_refresh(e, ce);
    const struct sl_endpoint *ep = ce->ep;
    if (!ep) {
        cons_dead_letter(e, j, 0, 0, "unknown_endpoint", "endpoint no longer exists", NULL);
        return NULL;
    }
    if (!ep->enabled) {
        cons_dead_letter(e, j, 0, 0, "endpoint_disabled",
                         ep->reason && ep->reason[0] ? ep->reason : "endpoint disabled", NULL);
        return NULL;
    }
    return ep;
}

/* j's request has started: its state, the counts and the loop's in-flight peak. */
static void note_started(cons_engine_t *e, struct job *j)
{
    struct cons_ep *ce = j->ce;
    if (ce->inflight++ == 0) /* silent from its first request on, not since its last answer */
        ce->last_answer_mono = sl_mono_ms();
    cons_job_set_state(e, j, JOB_SENDING);
    if (j->taken_us) { /* the first request of a record from Kafka */
        sl_histo_observe_us(cons_m.stage_queue, sl_mono_us() - j->taken_us);
        j->taken_us = 0;
    }
    e->st.sent++;
    sl_counter_inc(cons_m.attempts);
    if (ce->m)
        atomic_fetch_add_explicit(&ce->m->attempts, 1, memory_order_relaxed);
    int running = cons_http_running(e->http);
    if (running > e->inflight_max)
        e->inflight_max = running;
    if (j->probe) {
        ce->probe_inflight = true;
        e->st.probes++;
    }
}

/* Build and start the request for j. Returns 0; 1 when j failed on its own (dead-lettered:
 * its template, the endpoint's secret, the endpoint deleted or disabled since it was queued);
 * -1 on a local failure (j deferred a second). */
static int start_send(cons_engine_t *e, struct job *j)
{
    struct cons_ep *ce = j->ce;
    const struct sl_endpoint *ep = current_endpoint(e, j);
    if (!ep)
        return 1;
    sl_err_t err;
    const char *url = ep->url;
    if (ep->tpl) {
        if (cons_postback_expand(ep->url, j->d.macros, j->d.n_macros, URL_MAX, &j->url, &err) !=
            0) {
            cons_dead_letter(e, j, j->d.attempt + 1, 0,
                             err.code == SL_EMISSING ? "macro_missing" : "template_error", err.msg,
                             NULL);
            return 1;
        }
        url = j->url;
    }
    struct sl_sign_headers sh;
    if (!ce->signer) {
        cons_dead_letter(e, j, j->d.attempt + 1, 0, "no_signing_secret",
                         "endpoint has no active signing secret", NULL);
        return 1;
    }
    /* the signature covers the bytes actually sent: a GET postback sends no body */
    bool get = ep->method == SL_METHOD_GET;
    if (sl_sign_headers(ce->signer, j->d.id, sl_now_ms() / 1000, get ? NULL : j->d.body,
                        get ? 0 : j->d.body_len, &sh, &err) != 0) {
        cons_dead_letter(e, j, j->d.attempt + 1, 0, "sign_failed", err.msg, NULL);
        return 1;
    }
    struct hdr_line lines[HDR_LINES_MAX];
    size_t nl = 0;
    if (!get)
        lines[nl++] = (struct hdr_line){"Content-Type", ep->ct ? ep->ct : j->d.ct};
    lines[nl++] = (struct hdr_line){sh.id, NULL};
    lines[nl++] = (struct hdr_line){sh.timestamp, NULL};
    lines[nl++] = (struct hdr_line){sh.signature, NULL};
    char attempt_num[16], created_num[24];
    struct sl_fmt f;
    sl_fmt_init(&f, attempt_num, sizeof(attempt_num));
    sl_fmt_u64(&f, (uint64_t)j->d.attempt + 1);
    (void)sl_fmt_end(&f);
    lines[nl++] = (struct hdr_line){"X-Sluice-Attempt", attempt_num};
    sl_fmt_init(&f, created_num, sizeof(created_num));
    sl_fmt_u64(&f, (uint64_t)j->d.ts_ms);
    (void)sl_fmt_end(&f);
    lines[nl++] = (struct hdr_line){"X-Sluice-Created-Ms", created_num};
    for (size_t i = 0; i < ep->n_hdr && i < SL_HDR_MAX; i++)
        lines[nl++] = (struct hdr_line){ep->hdr[i].name, ep->hdr[i].value};
    for (size_t i = 0; i < j->d.n_hdr && i < SL_HDR_MAX; i++) {
        if (!ep_sets_header(ep, j->d.hdr[i].name))
            lines[nl++] = (struct hdr_line){j->d.hdr[i].name, j->d.hdr[i].value};
    }
    lines[nl++] = (struct hdr_line){"Expect:", NULL};
    struct curl_slist *h = hdr_block(lines, nl);
    sl_secret_wipe(&sh, sizeof(sh));
    j->hdrs = h;
    struct cons_http_req req = {
        .method = sl_http_method_name(ep->method),
        .url = url,
        .headers = h,
        .body = get ? NULL : j->d.body,
        .body_len = get ? 0 : j->d.body_len,
        .timeout_ms = (long)ep->timeout_ms,
        .connect_timeout_ms = (long)ep->conn_timeout_ms,
        .done = on_http_done,
        .opaque = j,
    };
    if (cons_http_start(e->http, &req, &j->http, &err) != 0) {
        /* Local failure (out of handles): retry later without spending an attempt. */
        sl_warn("http", "send_failed", "%s", err.msg);
        cons_defer_job(e, j, sl_now_ms() + 1000, "local_error");
        return -1;
    }
    note_started(e, j);
    return 0;
}

/* Defer everything queued on ce until t (breaker open). */
static void defer_queue(cons_engine_t *e, struct cons_ep *ce, int64_t until_ms)
{
    /* Spread over a whole cooldown (1 s .. 60 s): when the endpoint comes back, its backlog
     * arrives over that time instead of all at the moment the probe succeeds. */
    int64_t spread = ce->ep && ce->ep->brk_cooldown_ms > 0 ? ce->ep->brk_cooldown_ms : 1000;
    if (spread < 1000)
        spread = 1000;
    if (spread > 60000)
        spread = 60000;
    /* the jobs queued now: none is queued again meanwhile (a deferral goes to Redis) */
    for (size_t n = ce->queue.n; n > 0 && !cons_list_empty(&ce->queue); n--) {
        struct job *j = cons_q_pop(e, ce, false);
        e->st.deferred++;
        sl_counter_inc(cons_m.brk_deferrals);
        /* jitter so the endpoint is not hit by one burst when it comes back */
        int64_t due = until_ms + (int64_t)cons_rng_uniform(cons_rng_default(), (uint64_t)spread);
        cons_defer_job(e, j, due, "breaker_open");
    }
}

/* Claimed jobs at the head of ce's queue whose lease another claim took (or that we cannot
 * keep) are not ours to send: drop them (the lease's expiry or the new owner brings them
 * back). True when a job is left to send. */
static bool q_drop_unleased(cons_engine_t *e, struct cons_ep *ce)
{
    while (!cons_list_empty(&ce->queue) && !cons_lease_allows_send(e, cons_q_head(ce)))
        cons_job_free(e, cons_q_pop(e, ce, false));
    return !cons_list_empty(&ce->queue);
}

/* Serve one endpoint popped from the ready list: send the head of its queue (a probe when the
 * breaker asks for one), or leave it off the list until an event brings it back (a request
 * finishing frees a slot or ends a probe; a pause ending; a breaker deferral empties its
 * queue). */
static void dispatch_one(cons_engine_t *e, struct cons_ep *ce)
{
    if (cons_list_empty(&ce->queue))
        return;
    if (ce->blocked_until_mono && sl_mono_ms() < ce->blocked_until_mono) {
        cons_block_until(e, ce, ce->blocked_until_mono); /* back when the pause ends */
        return;
    }
    if (ce->inflight >= cons_inflight_cap(e, ce))
        return;
    if (!q_drop_unleased(e, ce))
        return;
    bool probe = false;
    if (!cons_breaker_allows(e, ce, &probe)) {
        if (ce->probe_inflight)
            return;
        /* due on the wall clock (the schedule's time): the cooldown left, else a second */
        int64_t left = ce->brk == CONS_BRK_OPEN ? ce->brk_reopen_mono - sl_mono_ms() : 0;
        int64_t until = sl_now_ms() + (left > 0 ? left : 1000);
        sl_debug(SL_DBG_HTTP, "deliver", "breaker_defer",
                 "breaker %d for endpoint %s: deferring %zu queued until %lld", (int)ce->brk,
                 ce->id, ce->queue.n, (long long)until);
        defer_queue(e, ce, until);
        return;
    }
    if (!probe && !cons_rate_allows(e, ce))
        return; /* paused until the bucket refills */
    int rc = start_send(e, cons_q_pop(e, ce, probe));
    /* A probe job that failed on its own before it was sent (its template, say): this pod
     * holds the shared probe lease, so the next job is the probe. */
    while (rc == 1 && probe && q_drop_unleased(e, ce))
        rc = start_send(e, cons_q_pop(e, ce, true));
    /* after a sent probe the endpoint waits for its answer (on_http_done brings it back);
     * otherwise, or when no probe went out, the rest of its queue goes on */
    if (!cons_list_empty(&ce->queue) && (!probe || rc != 0))
        cons_ready_push(e, ce);
}

/* Serve ready endpoints round-robin while request slots are free, so one busy endpoint
 * cannot hold back the others (no head-of-line blocking). */
void cons_dispatch(cons_engine_t *e)
{
    if (cons_stall_hold(e))
        return;
    int64_t cap = cons_adapt_limit(&e->adapt);
    while (cons_http_running(e->http) < cap) {
        struct cons_ep *ce = cons_ready_pop(e);
        if (!ce)
            return;
        dispatch_one(e, ce);
    }
    if (!cons_list_empty(&e->ready)) /* the cap, not the endpoints, stopped it */
        cons_adapt_bound(&e->adapt);
}

/* Delivered: the marker is batched (cons_mark_push), the outcome follows it. */
static void
conclude_delivered(cons_engine_t *e, struct job *j, const struct cons_http_result *r, int64_t now)
{
    struct sl_outcome o;
    cons_fault_stall();
    e->st.delivered++;
    cons_metrics_outcome(j->ce->m, CONS_M_DELIVERED, r->status);
    if (j->d.ts_ms > 0 && (uint64_t)now >= j->d.ts_ms)
        sl_histo_observe_us(cons_m.publish_to_delivered, (now - (int64_t)j->d.ts_ms) * 1000);
    cons_outcome_init(e, j, &o, SL_OUTCOME_DELIVERED, j->d.attempt + 1);
    o.http = (uint32_t)r->status;
    o.lat_us = (uint64_t)r->total_us;
    o.dns_us = (uint64_t)r->dns_us;
    o.conn_us = (uint64_t)r->connect_us;
    o.tls_us = (uint64_t)r->tls_us;
    o.ttfb_us = (uint64_t)r->ttfb_us;
    j->pending_out = o;
    j->after = AFTER_COMPLETE;
    cons_mark_push(e, j);
}

/* A transient failure: a retry scheduled in Redis, or a dead letter once the attempts are
 * spent. ra_ms: the Retry-After the answer asked for (0 = none). */
static void conclude_retry(cons_engine_t *e,
                           struct job *j,
                           const struct cons_http_result *r,
                           const char *cls,
                           int64_t ra_ms,
                           int64_t now)
{
    struct cons_ep *ce = j->ce;
    uint32_t attempt = j->d.attempt + 1;
    struct cons_retry_policy p = cons_policy_of(e, ce->ep);
    char msg[SL_OUTCOME_MSG_MAX];
    if (r->refusal == CONS_REFUSAL_SSRF)
        (void)snprintf(msg, sizeof(msg), "refused address (%s)", r->refusal_why);
    else
        (void)snprintf(msg, sizeof(msg), "%s", r->errbuf && r->errbuf[0] ? r->errbuf : cls);
    if (cons_backoff_exhausted(&p, attempt)) {
        cons_metrics_outcome(ce->m, CONS_M_DEAD, r->status);
        cons_dead_letter(e, j, attempt, (uint32_t)r->status, cls, msg, r);
        return;
    }
    /* Retry-After is bounded by retry_after_max_ms, not by the backoff cap: an endpoint that
     * asks for 10 minutes gets 10 minutes even when the cap is shorter. */
    /* attempt - 1 retries so far: the first retry's ceiling is the base */
    int64_t due = cons_backoff_next(&p, attempt - 1, now, 0, NULL);
    if (ra_ms > 0 && now + ra_ms > due)
        due = now + ra_ms;
    e->st.retried++;
    sl_counter_inc(cons_m.retries);
    cons_metrics_outcome(ce->m, CONS_M_RETRY, r->status);
    struct sl_outcome o;
    cons_outcome_init(e, j, &o, SL_OUTCOME_RETRY_SCHEDULED, attempt);
    o.ts_ms = (uint64_t)now; /* the clock reading "next" was computed from */
    if (j->src == SRC_KAFKA)
        o.env = cons_job_env(e, j, &o.env_len); /* moving into Redis: see cons_defer_job */
    o.http = (uint32_t)r->status;
    o.err = cls;
    o.msg = msg;
    o.next_ms = (uint64_t)due;
    o.lat_us = (uint64_t)r->total_us;
    o.resp = r->resp_len ? r->resp : NULL;
    o.resp_len = r->resp_len;
    sl_debug(SL_DBG_HTTP, "deliver", "retry_scheduled", "retry in %lld ms (%s)",
             (long long)(due - now), cls);
    cons_schedule_job(e, j, due, attempt, &o);
}

/* A permanent failure (any other 4xx, 3xx, a refused address; 410 also disables): a dead
 * letter. */
static void conclude_permanent(cons_engine_t *e,
                               struct job *j,
                               const struct cons_http_result *r,
                               enum cons_verdict v,
                               const char *cls)
{
    char msg[SL_OUTCOME_MSG_MAX];
    if (r->refusal == CONS_REFUSAL_SSRF)
        (void)snprintf(msg, sizeof(msg), "refused to connect: %s address", r->refusal_why);
    else if (v == CONS_PERMANENT_DISABLE)
        (void)snprintf(msg, sizeof(msg), "endpoint answered 410 gone");
    else
        (void)snprintf(msg, sizeof(msg), "%s", r->errbuf && r->errbuf[0] ? r->errbuf : cls);
    cons_metrics_outcome(j->ce->m, CONS_M_DEAD, r->status);
    cons_dead_letter(e, j, j->d.attempt + 1, (uint32_t)r->status, cls, msg, r);
}

/*
 * The delivery proxy did not answer (proxy_unreachable: down, its name unresolved, its TLS
 * failing): nothing reached the endpoint, so no attempt is spent, or an outage of the proxy
 * longer than the retry schedule (about 7.5 minutes for 5 attempts from a 30 s base) would
 * dead-letter everything sent meanwhile. j is deferred (an outcome "deferred"), full jitter
 * under a ceiling that doubles with the loop's run of such answers, 1 s to 60 s, so a proxy
 * that is back gets the backlog within a minute and one that stays down is asked about once
 * per job per half minute on average. Any other answer through it ends the run.
 */
#define PROXY_DEFER_BASE_MS 1000
#define PROXY_DEFER_CAP_MS  60000

static void defer_for_proxy(cons_engine_t *e, struct job *j, int64_t now)
{
    unsigned s = e->proxy_down_run < 6 ? e->proxy_down_run : 6;
    e->proxy_down_run++;
    int64_t ceiling = (int64_t)PROXY_DEFER_BASE_MS << s;
    if (ceiling > PROXY_DEFER_CAP_MS)
        ceiling = PROXY_DEFER_CAP_MS;
    int64_t due = now + 1 + (int64_t)cons_rng_uniform(cons_rng_default(), (uint64_t)ceiling);
    e->st.deferred++;
    cons_defer_job(e, j, due, CONS_CLASS_PROXY_DOWN);
}

/*
 * What becomes of j after its answer: delivered (its marker is batched, the outcome follows
 * it), a retry scheduled in Redis, deferred (the proxy did not answer: defer_for_proxy), or a
 * dead letter (attempts exhausted, or a permanent failure). cls: the classifier's error
 * class; ra_ms: the Retry-After the answer asked for.
 */
static void job_conclude(cons_engine_t *e,
                         struct job *j,
                         const struct cons_http_result *r,
                         enum cons_verdict v,
                         const char *cls,
                         int64_t ra_ms,
                         int64_t now)
{
    switch (v) {
    case CONS_DELIVERED:
        conclude_delivered(e, j, r, now);
        break;
    case CONS_RETRY:
        if (r->refusal == CONS_REFUSAL_PROXY_DOWN)
            defer_for_proxy(e, j, now);
        else
            conclude_retry(e, j, r, cls, ra_ms, now);
        break;
    case CONS_PERMANENT:
    case CONS_PERMANENT_DISABLE:
        conclude_permanent(e, j, r, v, cls);
        break;
    }
}

/* A request finished (cons_http's done callback): end the send, let the endpoint learn from
 * the answer, then decide the job's fate. */
static void on_http_done(void *opaque, const struct cons_http_result *r)
{
    struct job *j = opaque;
    struct cons_ep *ce = j->ce;
    cons_engine_t *e = ce->eng;
    bool was_probe = j->probe;
    cons_send_end(e, j);
    const char *cls = NULL;
    /* a 2xx whose body we cut off or that failed later is delivered: cons_classify.h */
    enum cons_verdict v = cons_classify(r->curl_code, r->status, r->refusal, &cls);
    if (v != CONS_DELIVERED)
        cons_metrics_failure(cls);
    struct sl_log_ctx ctx;
    cons_set_ctx(&ctx, j);
    int64_t now = sl_now_ms();
    int64_t ra_ms = cons_ep_observe(e, ce, j, was_probe, r, v);
    if (r->refusal != CONS_REFUSAL_PROXY_DOWN)
        e->proxy_down_run = 0; /* the proxy answered (or there is none) */
    job_conclude(e, j, r, v, cls, ra_ms, now);
    sl_log_ctx_clear();
    if (!cons_list_empty(&ce->queue))
        cons_ready_push(e, ce);
}
