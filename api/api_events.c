/*
 * api_events: POST /v1/events, POST /v1/events/batch and POST /v1/endpoints/{id}/test (see
 * api.h for a request's life).
 *
 * An event object is sluice-produce's JSON line (common/sl_jsonl: the same fields, rules and
 * messages) with "endpoint" optional and one more field, "channels". With an endpoint it is
 * one delivery record for that endpoint (which must be in the endpoint table: 404
 * otherwise); without one it fans out (api_fanout) to every enabled endpoint subscribed to
 * its type and channels: one record per endpoint, all with the same event id, keyed by
 * endpoint as always. A 2xx answer means Kafka acknowledged every record of the event.
 *
 * Idempotency-Key (optional header, 1..255 visible ASCII characters) makes a publish safe to
 * retry. Its state lives in Redis under sl_rstate_key_idem(<api key id>, <SHA-256 of the key>):
 *   absent            -> SET "p:<fingerprint>:<random token>" NX with a lock TTL; this
 *                        request publishes, then settles the key only while it still holds
 *                        that lock (sl_rstate_idem_settle)
 *   "p:<same fp>:..." -> 409, a request with this key is still in flight
 *   "d:<same fp>:..." -> the stored answer again (Idempotent-Replayed: true), nothing published
 *   other fingerprint -> 422, the key was used for a different request
 * The fingerprint is SHA-256 of method, path and body. The stored answer is kept
 * api_idempotency_ttl_s; a 503 answer deletes the state so the retry publishes again.
 * Events without an "id" get one derived from the API key, the Idempotency-Key, the request's
 * fingerprint and the event's index, so a retry after a crash between Kafka's acknowledgement
 * and the answer republishes the SAME event ids, and the consumers' delivered markers suppress what
 * was already delivered: nothing lost, nothing doubled for any endpoint. The lock TTL (2 x
 * api_publish_timeout_ms + 5 s) bounds how long such a retry sees 409.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>
#include <openssl/rand.h>

#include "api/api.h"
#include "common/sl_digest.h"
#include "common/sl_fault.h"
#include "common/sl_hex.h"
#include "common/sl_jsonl.h"
#include "common/sl_log.h"
#include "common/sl_rstate.h"
#include "common/sl_time.h"

#define IDEM_KEY_MAX 255

/* One event of the request. */
struct pub_item {
    json_t *problem;      /* refused before publishing (owned), or NULL */
    struct sl_delivery d; /* the parsed event (owned; ep NULL for a fan-out) */
    const char **eps;     /* target endpoint ids (borrowed from the index / table) */
    size_t n_eps;         /* records published for this event */
    atomic_uint failed;   /* records Kafka did not acknowledge */
    atomic_int first_err; /* SL_E* of the first failure */
};

struct rec_ctx {
    struct api_pub *pub;
    size_t item;
};

struct api_pub {
    struct api_req *r;      /* the suspended request */
    atomic_size_t pending;  /* records not yet reported, + 1 while the handler runs */
    struct pub_item *items; /* n_items */
    size_t n_items;
    bool batch;          /* answer shape */
    struct rec_ctx *ctx; /* one per record */
    size_t n_ctx;
    api_fanout_idx_t *idx;           /* fan-out index the endpoint names point into */
    const struct sl_endpoint **held; /* explicit endpoints held while publishing */
    size_t n_held;
    /* idempotency */
    bool idem;           /* an Idempotency-Key is in force */
    char idem_rkey[160]; /* the Redis key */
    char idem_lock[100]; /* "p:<fp>:<token>", the value this request claimed it with */
    char fp[65];         /* request fingerprint, hex */
    bool may_change;     /* a refusal that a moment may change (endpoints or key changed) */
};

/* Whether a refusal rests on state that may change before a retry, not on the request alone:
 * the endpoint unknown to this instance yet (404), the key's channels (403), the fan-out's
 * size (422). Such an answer is not kept for the Idempotency-Key. */
static bool refusal_may_change(const json_t *problem)
{
    json_int_t st = json_integer_value(json_object_get(problem, "status"));
    return st == 403 || st == 404 || st == 422;
}

static void pub_free(struct api_pub *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_items; i++) {
        json_decref(p->items[i].problem);
        sl_delivery_fini(&p->items[i].d);
        free(p->items[i].eps);
    }
    free(p->items);
    free(p->ctx);
    for (size_t i = 0; i < p->n_held; i++)
        sl_endpoint_release(p->held[i]);
    free(p->held);
    api_fanout_idx_release(p->idx);
    free(p);
}

static void sha256_parts(const void *const *parts, const size_t *lens, size_t n, uint8_t out[32])
{
    (void)sl_digest_parts(SL_SHA256, parts, lens, n, out); /* zeroed if OpenSSL fails */
}

/* ==== idempotency ==== */

enum idem_state { IDEM_OWNER, IDEM_REPLAYED, IDEM_ANSWERED };

static bool idem_key_valid(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > IDEM_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)k[i] < 0x20 || (unsigned char)k[i] > 0x7e)
            return false;
    }
    return true;
}

/* Replay a stored "d:<fp>:<status>:<json>" answer. */
static enum idem_state idem_replay(struct api_req *r, const char *v, size_t len)
{
    const char *p = v + 2 + 64 + 1;
    if (len < 2 + 64 + 1 + 4 || p[3] != ':') {
        api_problem(r, 500, "internal", NULL, "a stored idempotent answer is unreadable");
        return IDEM_ANSWERED;
    }
    int status = (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');
    json_error_t jerr;
    json_t *j = json_loadb(p + 4, len - (size_t)(p + 4 - v), 0, &jerr);
    api_reply(r, status, j);
    r->problem = status >= 400;
    r->idem_replayed = true;
    return IDEM_REPLAYED;
}

/*
 * Claim the key or answer from its state. On IDEM_OWNER this request publishes and must
 * call idem_finish; otherwise the answer is set.
 */
static enum idem_state idem_begin(struct api_req *r, struct api_pub *p, const char *key)
{
    struct api *a = r->api;
    sl_err_t err;
    uint8_t h[32];
    char hk[65];
    const void *parts[] = {key};
    size_t lens[] = {strlen(key)};
    sha256_parts(parts, lens, 1, h);
    sl_hex_encode(h, 32, hk);
    (void)sl_rstate_key_idem(p->idem_rkey, sizeof(p->idem_rkey), r->auth.key->id, hk);
    const void *fparts[] = {r->method, "\n", r->url, "\n",
                            r->body.data ? (void *)r->body.data : ""};
    size_t flens[] = {strlen(r->method), 1, strlen(r->url), 1, r->body.len};
    sha256_parts(fparts, flens, 5, h);
    sl_hex_encode(h, 32, p->fp);
    sl_redis_t *rd = api_redis(a, &err);
    if (!rd) {
        r->retry_after_s = 1;
        api_problem(r, 503, "unavailable", NULL,
                    "the idempotency store (Redis) is unreachable; retry with the same "
                    "Idempotency-Key");
        return IDEM_ANSWERED;
    }
    uint8_t tok[8];
    char htok[17], ttl[24];
    if (RAND_bytes(tok, sizeof(tok)) != 1)
        (void)memcpy(tok, h, sizeof(tok)); /* never seen; the token only tells owners apart */
    sl_hex_encode(tok, sizeof(tok), htok);
    (void)snprintf(p->idem_lock, sizeof(p->idem_lock), "p:%s:%s", p->fp, htok);
    (void)snprintf(ttl, sizeof(ttl), "%lld", 2LL * a->cfg->api_publish_timeout_ms + 5000);
    for (int tries = 0; tries < 3; tries++) {
        const char *set[] = {"SET", p->idem_rkey, p->idem_lock, "NX", "PX", ttl};
        redisReply *rep = sl_redis_cmd(rd, 0, 6, set, NULL, &err);
        if (!rep)
            break;
        bool claimed = rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (claimed) {
            p->idem = true;
            return IDEM_OWNER;
        }
        const char *get[] = {"GET", p->idem_rkey};
        rep = sl_redis_cmd(rd, 1, 2, get, NULL, &err);
        if (!rep)
            break;
        if (rep->type != REDIS_REPLY_STRING) { /* expired in between: claim again */
            freeReplyObject(rep);
            continue;
        }
        enum idem_state st = IDEM_ANSWERED;
        bool same = rep->len >= 2 + 64 && memcmp(rep->str + 2, p->fp, 64) == 0;
        if (!same)
            api_problem(r, 422, "idempotency-key-reused", "Idempotency-Key",
                        "this Idempotency-Key was used for a different request");
        else if (rep->str[0] == 'p') {
            r->retry_after_s = 1;
            api_problem(r, 409, "request-in-progress", "Idempotency-Key",
                        "a request with this Idempotency-Key is still in progress");
        } else
            st = idem_replay(r, rep->str, rep->len);
        freeReplyObject(rep);
        return st;
    }
    r->retry_after_s = 1;
    api_problem(r, 503, "unavailable", NULL,
                "the idempotency store (Redis) did not answer; retry with the same "
                "Idempotency-Key");
    return IDEM_ANSWERED;
}

/*
 * Store the final answer, or forget the key after a 5xx or a refusal that may change
 * (refusal_may_change) so the retry publishes: only while
 * the key still holds this request's lock (sl_rstate_idem_settle). A request whose lock
 * expired and was taken by another request leaves that one's state alone.
 */
static void idem_finish(struct api_req *r, struct api_pub *p)
{
    if (!p->idem)
        return;
    sl_err_t err;
    sl_redis_t *rd = api_redis(r->api, &err);
    if (!rd)
        goto fail;
    int rc;
    if (r->status >= 500 || p->may_change) {
        rc = sl_rstate_idem_settle(rd, p->idem_rkey, p->idem_lock, NULL, 0, 0, &err);
    } else {
        struct sl_buf v;
        sl_buf_init(&v, (size_t)64 << 20);
        char *text = r->text   ? sl_xstrdup(r->text)
                     : r->json ? json_dumps(r->json, JSON_COMPACT | JSON_REAL_PRECISION(15))
                               : NULL;
        (void)sl_buf_printf(&v, "d:%s:%03d:%s", p->fp, r->status, text ? text : "null");
        free(text);
        rc = sl_rstate_idem_settle(rd, p->idem_rkey, p->idem_lock, v.data, v.len,
                                   r->api->cfg->api_idempotency_ttl_s, &err);
        sl_buf_fini(&v);
    }
    if (rc == 1)
        return;
    if (rc == 0) {
        sl_warn("events", "idempotency_lock_lost",
                "an idempotent request was answered after its lock expired and another "
                "request had claimed the key: that request's state was kept, this answer "
                "was not stored");
        return;
    }
fail:
    SL_LOG_EVERY(1000, SL_LOG_WARN, "events", "idempotency_store_failed",
                 "could not store the answer of an idempotent request (a retry within the lock TTL "
                 "gets 409, later ones publish the same event ids again): %s",
                 err.msg);
}

/* ==== events ==== */

/* The event's "channels" (optional array of labels) into out (borrowed from obj). */
static json_t *get_channels(json_t *obj, const char *ptr, const char **out, size_t *n)
{
    json_t *c = json_object_get(obj, "channels");
    char field[96];
    *n = 0;
    (void)snprintf(field, sizeof(field), "%s/channels", ptr);
    if (!c)
        return NULL;
    if (!json_is_array(c))
        return api_problem_json(400, "invalid-field", field,
                                "field \"channels\" must be an array of strings");
    if (json_array_size(c) > SL_EP_CHANNELS_MAX)
        return api_problem_json(400, "invalid-field", field,
                                "field \"channels\" has %zu entries, limit %d", json_array_size(c),
                                SL_EP_CHANNELS_MAX);
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *v = json_array_get(c, i);
        if (!json_is_string(v) || !sl_valid_channel(json_string_value(v), json_string_length(v)))
            return api_problem_json(400, "invalid-field", field,
                                    "channel %zu must be 1..64 characters of A-Z a-z 0-9 _ . : -",
                                    i);
        out[(*n)++] = json_string_value(v);
    }
    return NULL;
}

/* A key limited to channels may publish only events that carry channels it holds. */
static bool key_channels_ok(const struct sl_apikey *k, const char **ch, size_t n)
{
    if (k->n_channels == 0)
        return true;
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!sl_apikey_channel_allowed(k, ch[i]))
            return false;
    }
    return true;
}

static bool endpoint_channels_ok(const struct sl_apikey *k, const struct sl_endpoint *e)
{
    return sl_apikey_sees_channels(k, e->channels, e->n_channels);
}

/*
 * Whether the event's delivery record fits the record cap (max_body_bytes + 64 KiB,
 * schemas/README.md) for every target: each field can be within its own limit while all of
 * them together are not (64 macros of 2 KiB), and such an event must be refused as too large
 * before anything is published, not fail in the producer as if Kafka were down. Sizes are
 * added up first (an upper bound of msgpack's framing); only an event near the cap is
 * encoded, for its longest endpoint id.
 */
static bool record_fits(const struct api *a, const struct pub_item *it)
{
    size_t cap = (size_t)a->cfg->max_body_bytes + SL_RECORD_OVERHEAD;
    const struct sl_delivery *d = &it->d;
    size_t bound =
        d->body_len + 1024 + SL_EVENT_ID_MAX + SL_ENDPOINT_ID_MAX + SL_EVENT_TYPE_MAX + SL_CT_MAX;
    for (size_t i = 0; i < d->n_hdr; i++)
        bound += strlen(d->hdr[i].name) + strlen(d->hdr[i].value) + 10;
    for (size_t i = 0; i < d->n_macros; i++)
        bound += strlen(d->macros[i].name) + strlen(d->macros[i].value) + 10;
    if (bound <= cap)
        return true;
    struct sl_delivery x = *d;
    x.own = NULL;
    for (size_t k = 0; k < it->n_eps; k++) {
        if (!x.ep || strlen(it->eps[k]) > strlen(x.ep))
            x.ep = it->eps[k];
    }
    if (!x.ep)
        return true; /* no record to publish */
    struct sl_decode_limits lim = {(size_t)a->cfg->max_body_bytes, 0};
    struct sl_buf b;
    sl_buf_init(&b, cap);
    sl_err_t err;
    int rc = sl_delivery_encode_lim(&x, &lim, &b, &err);
    sl_buf_fini(&b);
    return rc != SL_ETOOBIG;
}

/* Refuse it (413) when its record would not fit (record_fits). */
static void refuse_if_too_large(const struct api *a, struct pub_item *it, const char *ptr)
{
    if (it->n_eps == 0 || record_fits(a, it))
        return;
    it->problem = api_problem_json(
        413, "too-large", ptr[0] ? ptr : "/",
        "the event's delivery record would exceed its cap of max_body_bytes + 64 KiB (%lld "
        "bytes): its fields together (body, macros, headers) are too large",
        (long long)a->cfg->max_body_bytes + (long long)SL_RECORD_OVERHEAD);
}

/*
 * Parse and resolve event obj (index i; ptr is its JSON pointer, "" for a single event)
 * into it: on refusal it->problem is set and nothing is published for it.
 */
static void prepare(struct api_req *r,
                    struct api_pub *p,
                    json_t *obj,
                    const char *raw,
                    size_t raw_len,
                    size_t i,
                    const char *ptr,
                    struct pub_item *it)
{
    struct api *a = r->api;
    static const char *const extra[] = {"channels"};
    char gen_id[40];
    struct sl_decode_limits lim = {(size_t)a->cfg->max_body_bytes, 0};
    struct sl_jsonl_opts o = {0};
    sl_err_t err;
    o.lim = &lim;
    o.endpoint_optional = true;
    o.extra_fields = extra;
    o.n_extra = 1;
    o.raw = raw; /* the body goes out byte for byte as the client sent it */
    o.raw_len = raw_len;
    if (p->idem) {
        /* the same request again (after a crash) must carry the same ids; another request
         * under a key used before (its answer expired, or was a 503) must not: its events
         * would share the first one's ids, and delivered markers would suppress them */
        uint8_t h[32];
        char hx[65], idx[24];
        (void)snprintf(idx, sizeof(idx), "%zu", i);
        const void *parts[] = {p->idem_rkey, "\n", p->fp, "\n", idx};
        size_t lens[] = {strlen(p->idem_rkey), 1, strlen(p->fp), 1, strlen(idx)};
        sha256_parts(parts, lens, 5, h);
        sl_hex_encode(h, 16, hx);
        (void)snprintf(gen_id, sizeof(gen_id), "evt_%.26s", hx);
        o.id_if_absent = gen_id;
    }
    if (!json_is_object(obj)) {
        it->problem = api_problem_json(400, "invalid-field", ptr[0] ? ptr : "/",
                                       "an event must be a JSON object");
        return;
    }
    if (sl_jsonl_event(obj, &o, &it->d, &err) != 0) {
        it->problem = api_problem_from_err(&err, ptr);
        return;
    }
    const char *ch[SL_EP_CHANNELS_MAX];
    size_t nch = 0;
    it->problem = get_channels(obj, ptr, ch, &nch);
    if (it->problem)
        return;
    char field[96];
    const struct sl_apikey *key = r->auth.key;
    if (it->d.ep) {
        if (nch > 0) {
            (void)snprintf(field, sizeof(field), "%s/channels", ptr);
            it->problem = api_problem_json(400, "invalid-field", field,
                                           "field \"channels\" selects endpoints: it cannot be "
                                           "combined with \"endpoint\"");
            return;
        }
        const struct sl_endpoint *e = sl_endpoints_get(a->eps, it->d.ep);
        if (!e || !endpoint_channels_ok(key, e))
            (void)snprintf(field, sizeof(field), "%s/endpoint", ptr);
        if (!e) {
            it->problem = api_problem_json(404, "unknown-endpoint", field,
                                           "endpoint %s does not exist", it->d.ep);
            return;
        }
        if (!endpoint_channels_ok(key, e)) {
            /* as for reads: an endpoint the key cannot see does not exist for it (a 403 would
             * tell a tenant which ids exist) */
            sl_endpoint_release(e);
            it->problem = api_problem_json(404, "unknown-endpoint", field,
                                           "endpoint %s does not exist", it->d.ep);
            return;
        }
        p->held = sl_xrealloc(p->held, (p->n_held + 1) * sizeof(const struct sl_endpoint *));
        p->held[p->n_held++] = e;
        it->eps = sl_xmalloc(sizeof(*it->eps));
        it->eps[0] = e->id;
        it->n_eps = 1;
        refuse_if_too_large(a, it, ptr);
        return;
    }
    if (!key_channels_ok(key, ch, nch)) {
        (void)snprintf(field, sizeof(field), "%s/channels", ptr);
        it->problem = api_problem_json(403, "forbidden", field,
                                       "the API key is limited to channels: the event must carry "
                                       "channels, all of them allowed to the key");
        return;
    }
    if (!p->idx)
        p->idx = api_fanout_current(a->fanout);
    const struct sl_endpoint **m = NULL;
    size_t n = api_fanout_match(p->idx, it->d.type, ch, nch, &m, NULL);
    if (key->n_channels > 0) {
        /* a key limited to channels reaches only the endpoints it can see: not those without
         * channels, which every channel matches (published to explicitly: 404) */
        size_t kept = 0;
        for (size_t k = 0; k < n; k++) {
            if (endpoint_channels_ok(key, m[k]))
                m[kept++] = m[k];
        }
        n = kept;
    }
    if ((int64_t)n > a->cfg->api_fanout_max) {
        free(m);
        (void)snprintf(field, sizeof(field), "%s/type", ptr);
        it->problem = api_problem_json(422, "fanout-too-large", field,
                                       "the event would go to %zu endpoints, more than "
                                       "api_fanout_max (%lld)",
                                       n, (long long)a->cfg->api_fanout_max);
        return;
    }
    if (n > 0) {
        it->eps = sl_xmalloc(n * sizeof(*it->eps));
        for (size_t k = 0; k < n; k++)
            it->eps[k] = m[k]->id;
    }
    it->n_eps = n;
    free(m);
    refuse_if_too_large(a, it, ptr);
}

/*
 * Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=api_ack_slow holds each record's
 * acknowledgement for SL_FAULT_DELAY_MS (default 150 ms) before it is counted, as a slow
 * broker would, so that publishes are surely still waiting when a test stops the process
 * (tests/e2e/test_api.py). Reports are served one at a time: the delays add up.
 */
static void fault_ack_slow(void)
{
    if (sl_fault_is("api_ack_slow"))
        sl_sleep_ms(sl_fault_delay_ms(150));
}

static void on_done(void *opaque, int status, const char *reason)
{
    fault_ack_slow();
    struct rec_ctx *c = opaque;
    struct api_pub *p = c->pub;
    struct pub_item *it = &p->items[c->item];
    if (status != 0 && atomic_fetch_add(&it->failed, 1) == 0) {
        atomic_store(&it->first_err, status);
        sl_warn("events", "publish_failed", "Kafka did not acknowledge a record of event %s: %s",
                it->d.id, reason ? reason : "unknown");
    }
    if (atomic_fetch_sub(&p->pending, 1) == 1)
        api_req_resume(p->r);
}

/* Copy s as a JSON string to o (o == NULL: count only); returns the bytes. Event ids and
 * types are visible ASCII (0x21..0x7e), endpoint ids [A-Za-z0-9_-], so only '"' and '\\'
 * need escaping. */
static size_t put_str(char *o, const char *s)
{
    size_t n = 0;
    if (o)
        o[n] = '"';
    n++;
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            if (o)
                o[n] = '\\';
            n++;
        }
        if (o)
            o[n] = *p;
        n++;
    }
    if (o)
        o[n] = '"';
    return n + 1;
}

/* Copy s (without its NUL) to o (o == NULL: count only); returns the bytes. */
static size_t put_raw(char *o, const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        if (o)
            o[n] = s[n];
    }
    return n;
}

/* The publish answer into o (o == NULL: its length only). */
static size_t item_write(char *o, const struct pub_item *it)
{
    char num[24];
    size_t n = 0;
    (void)snprintf(num, sizeof(num), "%zu", it->n_eps);
    n += put_raw(o ? o + n : NULL, "{\"id\":");
    n += put_str(o ? o + n : NULL, it->d.id);
    n += put_raw(o ? o + n : NULL, ",\"type\":");
    n += put_str(o ? o + n : NULL, it->d.type);
    n += put_raw(o ? o + n : NULL, ",\"deliveries\":");
    n += put_raw(o ? o + n : NULL, num);
    n += put_raw(o ? o + n : NULL, ",\"endpoints\":[");
    for (size_t k = 0; k < it->n_eps && k < 100; k++) {
        if (k)
            n += put_raw(o ? o + n : NULL, ",");
        n += put_str(o ? o + n : NULL, it->eps[k]);
    }
    n += put_raw(o ? o + n : NULL, it->n_eps > 100 ? "],\"endpoints_truncated\":true}"
                                                   : "],\"endpoints_truncated\":false}");
    return n;
}

/* The publish answer as text (the common case, written without building a JSON tree): its
 * length first, then the bytes into one allocation. */
static char *item_text(const struct pub_item *it)
{
    size_t n = item_write(NULL, it);
    char *out = sl_xmalloc(n + 1);
    (void)item_write(out, it);
    out[n] = '\0';
    return out;
}

/* The JSON answer for one published item. */
static json_t *item_answer(const struct pub_item *it)
{
    json_t *eps = json_array();
    for (size_t k = 0; k < it->n_eps && k < 100; k++)
        json_array_append_new(eps, json_string(it->eps[k]));
    return json_pack("{s:s, s:s, s:I, s:o, s:b}", "id", it->d.id, "type", it->d.type, "deliveries",
                     (json_int_t)it->n_eps, "endpoints", eps, "endpoints_truncated",
                     it->n_eps > 100);
}

static json_t *unacked_problem(const struct pub_item *it)
{
    json_t *j = api_problem_json(503, "kafka-unavailable", NULL,
                                 "Kafka did not acknowledge %u of %zu records of event %s; "
                                 "retry the same request (same Idempotency-Key, or the same "
                                 "\"id\"): endpoints that already received it are not sent it "
                                 "again",
                                 atomic_load(&it->failed), it->n_eps, it->d.id);
    json_object_set_new(j, "id", json_string(it->d.id));
    return j;
}

/*
 * Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=api_after_publish kills the process
 * after Kafka acknowledged a publish and before it is answered, the crash the idempotency
 * design must survive (tests/e2e/test_api.py).
 */
static void fault_point(const char *name)
{
    if (sl_fault_is(name))
        (void)raise(SIGKILL);
}

static enum api_hret finish(struct api_req *r)
{
    struct api_pub *p = r->pub;
    if (p->n_ctx > 0)
        fault_point("api_after_publish");
    if (!p->batch) {
        struct pub_item *it = &p->items[0];
        if (it->problem) {
            int st = (int)json_integer_value(json_object_get(it->problem, "status"));
            api_reply(r, st, json_incref(it->problem));
            r->problem = true;
            p->may_change = refusal_may_change(it->problem);
        } else if (atomic_load(&it->failed) > 0) {
            api_reply(r, 503, unacked_problem(it));
            r->problem = true;
            r->retry_after_s = 1;
        } else {
            api_reply_text(r, 202, item_text(it));
            api_metrics_published(1);
        }
    } else {
        json_t *res = json_array();
        size_t ok = 0, bad = 0, unacked = 0;
        for (size_t i = 0; i < p->n_items; i++) {
            struct pub_item *it = &p->items[i];
            json_t *e;
            if (it->problem) {
                e = json_pack("{s:I, s:i, s:O}", "index", (json_int_t)i, "status",
                              (int)json_integer_value(json_object_get(it->problem, "status")),
                              "problem", it->problem);
                bad++;
                p->may_change = p->may_change || refusal_may_change(it->problem);
            } else if (atomic_load(&it->failed) > 0) {
                e = json_pack("{s:I, s:i, s:o}", "index", (json_int_t)i, "status", 503, "problem",
                              unacked_problem(it));
                unacked++;
            } else {
                e = item_answer(it);
                json_object_set_new(e, "index", json_integer((json_int_t)i));
                json_object_set_new(e, "status", json_integer(202));
                ok++;
            }
            json_array_append_new(res, e);
        }
        if (ok > 0) /* kept: a retry would publish the accepted ones again (copies queued or
                     * in flight are not suppressed); the refused ones go in a new request */
            p->may_change = false;
        api_reply(r, unacked ? 503 : 200,
                  json_pack("{s:I, s:I, s:I, s:o}", "accepted", (json_int_t)ok, "refused",
                            (json_int_t)bad, "unacknowledged", (json_int_t)unacked, "results",
                            res));
        if (unacked)
            r->retry_after_s = 1;
        api_metrics_published(ok);
    }
    idem_finish(r, p);
    r->pub = NULL;
    r->finish = NULL; /* done: on_completed frees r (a finish run inline never suspended) */
    pub_free(p);
    return API_DONE;
}

/*
 * Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=api_queue_full makes every record
 * publish fail as when Kafka's local queue stayed full for the enqueue wait
 * (tests/e2e/test_api.py).
 */
static int
publish_record(struct api *a, const struct sl_delivery *d, struct rec_ctx *c, sl_err_t *err)
{
    if (sl_fault_is("api_queue_full"))
        return sl_err_set(err, SL_ETIMEDOUT, "local queue full for %d ms (SL_FAULT)",
                          API_ENQUEUE_WAIT_MS);
    return prod_lib_publish(a->prod, d, on_done, c, err);
}

/*
 * Publish every record of every accepted item; the connection is suspended first.
 *
 * Kafka's local queue full: a publish waits up to API_ENQUEUE_WAIT_MS for room on this
 * request's HTTP loop. Once such a wait ran out, the request's remaining records are not
 * tried (their events answer 503 like the first), and neither are any request's for
 * API_ENQUEUE_WAIT_MS after it: a batch of many records, or many requests, would otherwise
 * hold their loops for a wait each while Kafka is not keeping up.
 */
static enum api_hret publish_all(struct api_req *r, struct api_pub *p)
{
    struct api *a = r->api;
    size_t n = 0;
    for (size_t i = 0; i < p->n_items; i++)
        n += p->items[i].problem ? 0 : p->items[i].n_eps;
    r->pub = p;
    r->finish = finish;
    p->r = r;
    if (n == 0)
        return finish(r);
    p->ctx = sl_xcalloc(n, sizeof(*p->ctx));
    p->n_ctx = n;
    atomic_store(&p->pending, n + 1);
    MHD_suspend_connection(r->conn);
    bool shed = sl_mono_ms() < atomic_load(&a->qfull_until_ms);
    size_t c = 0;
    for (size_t i = 0; i < p->n_items; i++) {
        struct pub_item *it = &p->items[i];
        if (it->problem)
            continue;
        for (size_t k = 0; k < it->n_eps; k++, c++) {
            struct sl_delivery d = it->d;
            sl_err_t err;
            d.ep = it->eps[k];
            d.own = NULL;
            p->ctx[c].pub = p;
            p->ctx[c].item = i;
            if (shed) {
                on_done(&p->ctx[c], SL_ETIMEDOUT,
                        "not tried: Kafka's local queue was full moments ago");
                continue;
            }
            if (publish_record(a, &d, &p->ctx[c], &err) == 0)
                continue;
            if (err.code == SL_ETIMEDOUT) { /* the queue stayed full for the whole wait */
                shed = true;
                atomic_store(&a->qfull_until_ms, sl_mono_ms() + API_ENQUEUE_WAIT_MS);
            }
            on_done(&p->ctx[c], err.code, err.msg);
        }
    }
    if (atomic_fetch_sub(&p->pending, 1) == 1)
        api_req_resume(r);
    return API_SUSPENDED;
}

static struct api_pub *pub_new(size_t n_items, bool batch)
{
    struct api_pub *p = sl_xcalloc(1, sizeof(*p));
    p->items = sl_xcalloc(n_items, sizeof(*p->items));
    p->n_items = n_items;
    p->batch = batch;
    return p;
}

/* The Idempotency-Key part shared by both routes; IDEM_OWNER also when there is no key. */
static enum idem_state begin(struct api_req *r, struct api_pub *p)
{
    const char *key = api_header(r, "Idempotency-Key");
    if (!key)
        return IDEM_OWNER;
    if (!idem_key_valid(key)) {
        api_problem(r, 400, "invalid-header", "Idempotency-Key",
                    "Idempotency-Key must be 1..%d visible ASCII characters", IDEM_KEY_MAX);
        return IDEM_ANSWERED;
    }
    return idem_begin(r, p, key);
}

enum api_hret api_events_publish(struct api_req *r)
{
    /* a single event's body is always taken from the text, elided or not */
    json_t *j = api_body_json_events(r, SL_JSON_EVENT, NULL);
    if (!j)
        return API_DONE;
    struct api_pub *p = pub_new(1, false);
    if (begin(r, p) != IDEM_OWNER) {
        json_decref(j);
        pub_free(p);
        return API_DONE;
    }
    prepare(r, p, j, (const char *)r->body.data, r->body.len, 0, "", &p->items[0]);
    json_decref(j);
    return publish_all(r, p);
}

enum api_hret api_events_publish_batch(struct api_req *r)
{
    struct api *a = r->api;
    bool elided;
    json_t *j = api_body_json_events(r, SL_JSON_BATCH, &elided);
    if (!j)
        return API_DONE;
    json_t *evs = json_object_get(j, "events");
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        if (strcmp(k, "events") != 0) {
            json_decref(j);
            return api_problem(r, 400, "invalid-field", "/",
                               "unknown field: a batch has only \"events\"");
        }
    }
    if (!json_is_array(evs) || json_array_size(evs) == 0) {
        json_decref(j);
        return api_problem(r, 400, "invalid-field", "/events",
                           "field \"events\" must be a non-empty array of events");
    }
    if ((int64_t)json_array_size(evs) > a->cfg->api_batch_max) {
        size_t n = json_array_size(evs);
        json_decref(j);
        return api_problem(r, 413, "too-large", "/events",
                           "a batch holds at most %lld events (api_batch_max), this one %zu",
                           (long long)a->cfg->api_batch_max, n);
    }
    /* each event's own text, so its body goes out byte for byte (else: re-serialised) */
    const char *text = (const char *)r->body.data;
    size_t n_items = json_array_size(evs);
    size_t aoff = 0, alen = 0, n = 0;
    size_t *offs = sl_xcalloc(n_items, sizeof(*offs));
    size_t *lens = sl_xcalloc(n_items, sizeof(*lens));
    bool spans = sl_json_member_span(text, r->body.len, "events", &aoff, &alen) == 0 &&
                 sl_json_array_spans(text + aoff, alen, n_items, offs, lens, &n) == 0 &&
                 n == n_items;
    if (!spans && elided) {
        /* the bodies must come from the text, which did not split: take the whole tree
         * (the same document, so the checks above hold for it) */
        json_decref(j);
        j = api_body_json(r);
        if (!j) {
            free(offs);
            free(lens);
            return API_DONE;
        }
        evs = json_object_get(j, "events");
    }
    struct api_pub *p = pub_new(n_items, true);
    if (begin(r, p) != IDEM_OWNER) {
        free(offs);
        free(lens);
        json_decref(j);
        pub_free(p);
        return API_DONE;
    }
    char ptr[48];
    for (size_t i = 0; i < p->n_items; i++) {
        (void)snprintf(ptr, sizeof(ptr), "/events/%zu", i);
        prepare(r, p, json_array_get(evs, i), spans ? text + aoff + offs[i] : NULL,
                spans ? lens[i] : 0, i, ptr, &p->items[i]);
    }
    free(offs);
    free(lens);
    json_decref(j);
    return publish_all(r, p);
}

/*
 * POST /v1/endpoints/{id}/test: one test event to endpoint id by the path of any explicit
 * publish (signed, retried, recorded): type "sluice.test", a small JSON body naming the
 * endpoint and the time, a new id; the answer is POST /v1/events's, and GET
 * /v1/events/{id}/deliveries then tells what the endpoint answered. The request has no body
 * (or {}); Idempotency-Key works as for an event. A disabled endpoint is 409 (its test would
 * only be a dead letter).
 */
enum api_hret api_endpoints_test(struct api_req *r)
{
    const char *id = r->params[0];
    if (r->body.len > 0) {
        json_t *b = api_body_json(r);
        if (!b)
            return API_DONE;
        bool empty = json_is_object(b) && json_object_size(b) == 0;
        json_decref(b);
        if (!empty)
            return api_problem(r, 400, "invalid-field", "/",
                               "a test takes no fields: send no body, or {}");
    }
    /* as for an explicit publish, an endpoint the key cannot see does not exist for it */
    const struct sl_endpoint *e =
        sl_valid_endpoint_id(id, strlen(id)) ? sl_endpoints_get(r->api->eps, id) : NULL;
    if (!e || !endpoint_channels_ok(r->auth.key, e)) {
        sl_endpoint_release(e);
        return api_problem(r, 404, "unknown-endpoint", NULL, "no endpoint has that id");
    }
    bool enabled = e->enabled;
    sl_endpoint_release(e);
    if (!enabled) /* it would end as a dead letter that a later replay would send */
        return api_problem(r, 409, "endpoint-disabled", NULL,
                           "endpoint %s is disabled: enable it first, then test it", id);
    json_t *ev = json_pack("{s:s, s:s, s:{s:s, s:s, s:I, s:s}}", "endpoint", id, "type",
                           "sluice.test", "body", "type", "sluice.test", "endpoint", id,
                           "sent_at_ms", (json_int_t)sl_now_ms(), "message",
                           "A test event from Sluice (POST /v1/endpoints/{id}/test).");
    char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    if (!text) {
        json_decref(ev);
        return api_problem(r, 500, "internal", NULL, "could not build the test event");
    }
    struct api_pub *p = pub_new(1, false);
    if (begin(r, p) != IDEM_OWNER) {
        free(text);
        json_decref(ev);
        pub_free(p);
        return API_DONE;
    }
    prepare(r, p, ev, text, strlen(text), 0, "", &p->items[0]);
    free(text);
    json_decref(ev);
    return publish_all(r, p);
}
