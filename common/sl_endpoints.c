/*
 * sl_endpoints: endpoint table materialised from the compacted endpoints topic (see
 * sl_endpoints.h).
 *
 * Concurrency: one writer, the updater thread (or open(), before the thread exists), and
 * any number of readers. The map (id -> struct slot) and the change callback are guarded by
 * a rwlock; readers hold it only to look up and take a reference. The writer may read the
 * map without the lock (nobody else writes it) and takes the write lock only to swap an
 * entry in or out. Snapshots are immutable, so a reference is all a reader needs; the last
 * sl_endpoint_release frees (from whichever thread drops it).
 */
#include "common/sl_endpoints.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>
#include <openssl/crypto.h>

#include "common/sl_digest.h"
#include "common/sl_fault.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_time.h"
#include "common/sl_url.h"

#define READER_GROUP_ID  "sluice-endpoints-reader" /* required by assign() in 2.0.2; unused */
#define POLL_MS          100  /* updater poll timeout; with SYNC_QUERY_MS, bounds close() latency */
#define SYNC_POLL_MS     5    /* updater poll timeout while a catch-up request waits */
#define SYNC_QUERY_MS    500  /* one watermark query of a catch-up */
#define SYNC_BACKOFF_MS  2000 /* longest pause after failed queries (250 ms, doubling) */
#define SYNC_ABANDON_MS  10000 /* requests this old are given up (their askers stopped waiting) */
#define METADATA_STEP_MS 2000  /* one metadata request's timeout */
#define CANCEL_STEP_MS   200   /* first timeout of a blocking call while a cancel flag is watched */
#define UNKNOWN_TOPIC_MS 5000  /* how long a missing topic may take to appear before failing */
#define INITIAL_LOG_MAX  50    /* invalid records logged one by one during the initial load */
#define DIGEST_LEN       32    /* SHA-256 */
#define STALE_TEXT       "the record is older than the one in force" /* starts a stale refusal */

/* Map value: the current snapshot of one endpoint and the digest of the record it came from. */
struct slot {
    struct sl_endpoint *e;      /* the table's reference */
    uint8_t digest[DIGEST_LEN]; /* SHA-256 of the record value (no-op detection) */
};

struct sl_endpoints {
    rd_kafka_t *rk;                   /* plain consumer, all partitions assigned */
    char *topic;                      /* cfg->topic_endpoints (copy) */
    struct sl_masterkey mk;           /* copy; wiped on close */
    struct sl_endpoint_defaults defs; /* effective-value defaults */
    pthread_rwlock_t lock;            /* guards map (writes), fn, opaque */
    sl_map_t *map;                    /* id -> struct slot * */
    sl_endpoints_change_fn fn;        /* change callback or NULL */
    void *opaque;                     /* passed to fn */
    atomic_uint_fast64_t generation;  /* bumps on every change */
    uint64_t next_version;            /* last version handed out (writer only) */
    atomic_bool stop;                 /* tells the updater thread to exit */
    pthread_t thr;                    /* updater thread */
    bool thr_started;                 /* thr must be joined */
    bool initial;                     /* true while open() does the initial load */
    sl_map_t *failed;                 /* initial load: ids whose latest record did not decrypt */
    uint64_t initial_logged;          /* invalid records logged during the initial load */
    int last_err;                     /* last consumer error logged (rd_kafka_resp_err_t) */
    atomic_uint_fast64_t st_records, st_applied, st_unchanged, st_invalid; /* stats */
    atomic_uint_fast64_t st_refused; /* records that failed authentication */
    sl_map_t *refused;               /* id -> reason (char *) of its refused latest record;
                                        guarded by lock */
    /* catch-up requests (sl_endpoints_sync_request / _synced) */
    int32_t n_parts;                   /* partitions of the topic at open */
    atomic_uint_fast64_t sync_req;     /* last ticket handed out */
    atomic_uint_fast64_t sync_done;    /* every ticket up to this one is served */
    atomic_int_fast64_t sync_req_mono; /* when the last ticket was handed out (monotonic ms) */
    uint64_t sync_ticket;              /* updater: the ticket being served, 0 when none */
    int64_t *sync_end;                 /* updater: per partition, the end to read up to for it */
    int64_t *eof_off;                  /* updater: per partition, the offset its last EOF named */
    int64_t sync_retry_mono;           /* updater: no query before this (after a failed one) */
    int sync_backoff_ms;               /* updater: the pause after the next failed query */
};

/* ==== Snapshots ==== */

static void endpoint_free(struct sl_endpoint *e)
{
    if (!e)
        return;
    sl_secret_wipe(e->secrets, sizeof(e->secrets));
    free(e->id);
    free(e->name);
    free(e->url);
    free(e->ct);
    free(e->hdr);      /* one block: array + strings */
    free(e->types);    /* likewise */
    free(e->channels); /* likewise */
    free(e->reason);
    free(e);
}

void sl_endpoint_release(const struct sl_endpoint *ce)
{
    if (!ce)
        return;
    struct sl_endpoint *e = (struct sl_endpoint *)(uintptr_t)ce;
    if (atomic_fetch_sub_explicit(&e->sl__refs, 1, memory_order_acq_rel) == 1)
        endpoint_free(e);
}

const struct sl_endpoint *sl_endpoint_ref(const struct sl_endpoint *ce)
{
    struct sl_endpoint *e = (struct sl_endpoint *)(uintptr_t)ce;
    atomic_fetch_add_explicit(&e->sl__refs, 1, memory_order_relaxed);
    return ce;
}

void sl_endpoint_defaults_from_cfg(const struct sl_config *cfg, struct sl_endpoint_defaults *d)
{
    d->timeout_ms = cfg->http_timeout_ms;
    d->conn_timeout_ms = cfg->http_connect_timeout_ms;
    d->retry_base_ms = cfg->retry_base_ms;
    d->retry_cap_ms = cfg->retry_cap_ms;
    d->max_attempts = cfg->max_attempts;
    d->brk_threshold = cfg->breaker_threshold;
    d->brk_cooldown_ms = cfg->breaker_cooldown_ms;
    d->rate_period_ms = SL_EP_RATE_PERIOD_DEFAULT_MS;
    d->max_inflight = cfg->max_inflight_per_endpoint;
}

static int64_t or_default(uint32_t v, int64_t def)
{
    return v ? (int64_t)v : def;
}

/* Copy the headers into one allocation: the sl_kv array followed by the strings. */
static struct sl_kv *copy_headers(const struct sl_kv *hdr, size_t n)
{
    if (n == 0)
        return NULL;
    size_t total = n * sizeof(struct sl_kv);
    for (size_t i = 0; i < n; i++)
        total += strlen(hdr[i].name) + 1 + strlen(hdr[i].value) + 1;
    struct sl_kv *out = sl_xmalloc(total);
    char *p = (char *)(out + n);
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(hdr[i].name) + 1, vl = strlen(hdr[i].value) + 1;
        memcpy(p, hdr[i].name, nl);
        out[i].name = p;
        p += nl;
        memcpy(p, hdr[i].value, vl);
        out[i].value = p;
        p += vl;
    }
    return out;
}

bool sl_endpoint_subscribed(const struct sl_endpoint *e,
                            const char *type,
                            size_t type_len,
                            const char *const *channels,
                            size_t n_channels)
{
    bool type_ok = e->n_types == 0;
    for (size_t i = 0; i < e->n_types && !type_ok; i++) {
        const char *f = e->types[i];
        size_t fl = strlen(f);
        if (fl >= 2 && f[fl - 2] == '.' && f[fl - 1] == '*') {
            /* "p.*": type must be "p." followed by at least one byte */
            type_ok = type_len > fl - 1 && memcmp(type, f, fl - 1) == 0;
        } else {
            type_ok = type_len == fl && memcmp(type, f, fl) == 0;
        }
    }
    if (!type_ok)
        return false;
    if (e->n_channels == 0)
        return true;
    for (size_t i = 0; i < n_channels; i++) {
        for (size_t j = 0; j < e->n_channels; j++) {
            if (strcmp(channels[i], e->channels[j]) == 0)
                return true;
        }
    }
    return false;
}

/* Decrypt secret i of rec into s. The box holds the "whsec_..." (HMAC) or "whsk_..." (Ed25519)
 * text; sl_secret_parse tells them apart and checks a whsk_ key's public half. */
static int open_secret(const struct sl_endpoint_rec *rec,
                       size_t i,
                       const struct sl_masterkey *mk,
                       struct sl_secret *s,
                       sl_err_t *err)
{
    uint8_t plain[SL_SECRET_ENC_MAX + 1];
    size_t plen = 0;
    sl_err_t e2;
    int rc = sl_secretbox_open(mk, rec->id, rec->secrets[i].enc, rec->secrets[i].enc_len, plain,
                               sizeof(plain) - 1, &plen, &e2);
    if (rc != 0) {
        sl_err_set(err, rc, "secret %zu: %s", i, e2.msg);
        goto out;
    }
    plain[plen] = '\0';
    if (strlen((const char *)plain) != plen) {
        rc = sl_err_set(err, SL_EDECODE, "secret %zu of endpoint %s is not a signing secret", i,
                        rec->id);
        goto out;
    }
    rc = sl_secret_parse(s, (const char *)plain, &e2);
    if (rc != 0)
        sl_err_set(err, rc, "secret %zu of endpoint %s: %s", i, rec->id, e2.msg);
out:
    sl_secret_wipe(plain, sizeof(plain));
    return rc;
}

void sl_endpoint_resolve_policy(struct sl_endpoint *e,
                                const struct sl_endpoint_rec *rec,
                                const struct sl_endpoint_defaults *d)
{
    e->timeout_ms = or_default(rec->timeout_ms, d->timeout_ms);
    e->conn_timeout_ms = or_default(rec->conn_timeout_ms, d->conn_timeout_ms);
    if (e->conn_timeout_ms > e->timeout_ms)
        e->conn_timeout_ms = e->timeout_ms; /* a default larger than an endpoint's total */
    e->retry_base_ms = or_default(rec->retry_base_ms, d->retry_base_ms);
    e->retry_cap_ms = or_default(rec->retry_cap_ms, d->retry_cap_ms);
    if (e->retry_cap_ms < e->retry_base_ms)
        e->retry_cap_ms = e->retry_base_ms; /* an endpoint base above the global cap */
    e->max_attempts = or_default(rec->max_attempts, d->max_attempts);
    e->brk_threshold = or_default(rec->brk_threshold, d->brk_threshold);
    e->brk_cooldown_ms = or_default(rec->brk_cooldown_ms, d->brk_cooldown_ms);
    e->rate = rec->rate; /* 0 = unlimited, no default */
    e->rate_period_ms = or_default(rec->rate_period_ms, d->rate_period_ms);
    e->burst = or_default(rec->burst, e->rate);
    e->max_inflight = or_default(rec->max_inflight, d->max_inflight);
}

int sl_endpoint_build(const struct sl_endpoint_rec *rec,
                      const struct sl_masterkey *mk,
                      const struct sl_endpoint_defaults *d,
                      uint64_t now_ms,
                      struct sl_endpoint **out,
                      sl_err_t *err)
{
    int rc = 0;
    struct sl_endpoint *e = NULL;
    *out = NULL;
    if (!rec || !rec->id || !rec->url || !mk || !d)
        return sl_err_set(err, SL_EINVAL, "no endpoint record, master key or defaults");
    if (rec->tpl) {
        rc = sl_endpoint_template_syntax(rec->url, err);
        if (rc != 0)
            goto out;
    }
    e = sl_xcalloc(1, sizeof(*e));
    atomic_init(&e->sl__refs, 1);
    e->id = sl_xstrdup(rec->id);
    e->name = sl_xstrdup(rec->name ? rec->name : "");
    e->url = sl_xstrdup(rec->url);
    e->tpl = rec->tpl;
    e->method = rec->method;
    e->ct = rec->ct ? sl_xstrdup(rec->ct) : NULL;
    e->hdr = copy_headers(rec->hdr, rec->n_hdr);
    e->n_hdr = rec->n_hdr;
    e->types = sl_strv_dup(rec->types, rec->n_types);
    e->n_types = rec->n_types;
    e->channels = sl_strv_dup(rec->channels, rec->n_channels);
    e->n_channels = rec->n_channels;
    for (size_t i = 0; i < rec->n_secrets && i < SL_SECRETS_MAX; i++) {
        uint64_t exp = rec->secrets[i].exp_ms;
        if (exp != 0 && exp <= now_ms)
            continue; /* expired: must not sign any more */
        rc = open_secret(rec, i, mk, &e->secrets[e->n_secrets], err);
        if (rc != 0)
            goto out;
        e->secret_exp_ms[e->n_secrets] = exp;
        e->n_secrets++;
    }
    if (e->n_secrets == 0) {
        rc = sl_err_set(err, SL_EINVAL, "endpoint %s has no unexpired secret", rec->id);
        goto out;
    }
    sl_endpoint_resolve_policy(e, rec, d);
    e->enabled = rec->enabled;
    e->reason = sl_xstrdup(rec->reason ? rec->reason : "");
    e->updated_ms = rec->updated_ms;
    e->version = 0;
out:
    if (rc != 0) {
        endpoint_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* ==== URL and template checks ==== */

static bool macro_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

int sl_endpoint_template_syntax(const char *tpl, sl_err_t *err)
{
    if (!tpl)
        return sl_err_set(err, SL_EINVAL, "no template");
    for (size_t i = 0; tpl[i]; i++) {
        if (tpl[i] == '}')
            return sl_err_set(err, SL_EINVAL, "template has an unmatched '}' at offset %zu", i);
        if (tpl[i] != '{')
            continue;
        size_t start = i++;
        while (tpl[i] && tpl[i] != '}') {
            if (tpl[i] == '{')
                return sl_err_set(err, SL_EINVAL,
                                  "template has a '{' inside the macro opened at offset %zu",
                                  start);
            if (!macro_char((unsigned char)tpl[i]))
                return sl_err_set(err, SL_EINVAL,
                                  "template macro at offset %zu has a character other than "
                                  "[A-Za-z0-9_] at offset %zu",
                                  start, i);
            i++;
        }
        if (!tpl[i])
            return sl_err_set(err, SL_EINVAL, "template has an unclosed '{' at offset %zu", start);
        size_t n = i - start - 1;
        if (n == 0)
            return sl_err_set(err, SL_EINVAL, "template has an empty macro name at offset %zu",
                              start);
        if (n > SL_MACRO_NAME_MAX)
            return sl_err_set(err, SL_EINVAL,
                              "template macro at offset %zu is longer than %d characters", start,
                              SL_MACRO_NAME_MAX);
    }
    return 0;
}

/* Copy tpl (syntax already checked) into out with every {macro} replaced by the one byte c. */
static void substitute(const char *tpl, char c, char *out)
{
    size_t o = 0;
    for (size_t i = 0; tpl[i]; i++) {
        if (tpl[i] == '{') {
            while (tpl[i] != '}')
                i++;
            out[o++] = c;
        } else {
            out[o++] = tpl[i];
        }
    }
    out[o] = '\0';
}

int sl_endpoint_url_check(const char *url, bool tpl, sl_err_t *err)
{
    int rc;
    if (!url || !*url)
        return sl_err_set(err, SL_EMISSING, "url is empty");
    size_t len = strnlen(url, SL_URL_MAX + 1);
    if (len > SL_URL_MAX)
        return sl_err_set(err, SL_ETOOBIG, "url is longer than %d bytes", SL_URL_MAX);
    if (!tpl) {
        if (strpbrk(url, "{}"))
            return sl_err_set(err, SL_EINVAL,
                              "url contains '{' or '}': a postback URL with {macro} "
                              "placeholders must be registered as a template");
        return sl_url_validate(url, err);
    }
    rc = sl_endpoint_template_syntax(url, err);
    if (rc != 0)
        return rc;
    char *x = sl_xmalloc(len + 1), *y = sl_xmalloc(len + 1);
    char hx[SL_URL_MAX + 1], hy[SL_URL_MAX + 1];
    sl_err_t e2;
    substitute(url, 'x', x);
    substitute(url, 'y', y);
    rc = sl_url_validate(x, &e2);
    if (rc != 0) {
        sl_err_set(err, rc, "template with its macros filled in is not a valid URL: %s", e2.msg);
        goto out;
    }
    /* The host must not depend on delivery data: filling the macros with different values
     * must give the same host (scheme and port already have to validate). */
    if (sl_url_host(x, hx, sizeof(hx)) != 0 || sl_url_host(y, hy, sizeof(hy)) != 0 ||
        strcmp(hx, hy) != 0) {
        rc = sl_err_set(err, SL_EINVAL,
                        "template has a macro in the host; macros are allowed only in the path "
                        "and query");
        goto out;
    }
out:
    free(x);
    free(y);
    return rc;
}

int sl_endpoint_url_host(const char *url, bool tpl, char *out, size_t outlen)
{
    if (outlen)
        out[0] = '\0';
    if (!url)
        return SL_EDECODE;
    if (!tpl)
        return sl_url_host(url, out, outlen);
    size_t len = strnlen(url, SL_URL_MAX + 1);
    if (len > SL_URL_MAX)
        return SL_ETOOBIG;
    char *x = sl_xmalloc(len + 1);
    substitute(url, 'x', x);
    int rc = sl_url_host(x, out, outlen);
    free(x);
    return rc;
}

/* ==== Reading the topic ==== */

struct reader {
    rd_kafka_t *rk;            /* consumer, all partitions assigned from the beginning */
    const atomic_bool *cancel; /* stop waiting once true; NULL = never */
    int32_t n_parts;           /* partitions of the topic at open */
    int64_t *hwm;              /* high watermark per partition at open */
    bool *done;                /* partition read up to its hwm (or reported its end) */
    int32_t n_done;            /* count of true entries in done */
};

static int64_t remaining_ms(int64_t deadline)
{
    int64_t r = deadline - sl_mono_ms();
    return r > 0 ? r : 0;
}

static bool cancelled(const atomic_bool *cancel)
{
    return cancel && atomic_load(cancel);
}

/*
 * Timeout of the next blocking librdkafka call, ms: what is left of the deadline, cut to
 * step. While a cancel flag is watched, step starts at CANCEL_STEP_MS: with no broker
 * reachable each call gives up after it (__TRANSPORT: no broker up in time), so the flag is
 * looked at every few hundred ms. A call that timed out waiting for an answer (__TIMED_OUT: a
 * broker is up, but slow) doubles step up to METADATA_STEP_MS (step_grow), so a slow broker
 * still gets to answer.
 */
static int step_timeout(int64_t deadline, int step)
{
    int64_t left = remaining_ms(deadline);
    return (int)(left < step ? left : step);
}

static void step_grow(int *step, rd_kafka_resp_err_t e)
{
    if (e == RD_KAFKA_RESP_ERR__TIMED_OUT && *step < METADATA_STEP_MS)
        *step = *step * 2 < METADATA_STEP_MS ? *step * 2 : METADATA_STEP_MS;
}

static void reader_close(struct reader *r)
{
    if (r->rk) {
        rd_kafka_resp_err_t e = rd_kafka_consumer_close(r->rk);
        if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
            sl_warn("endpoints", "consumer_close_failed", "closing the endpoints reader: %s",
                    rd_kafka_err2str(e));
        rd_kafka_destroy(r->rk);
        r->rk = NULL;
    }
    free(r->hwm);
    free(r->done);
    r->hwm = NULL;
    r->done = NULL;
}

/* Partition count of topic, retrying transient errors until deadline (or *cancel). */
/* One metadata request for rkt: RD_KAFKA_RESP_ERR_NO_ERROR with *out = its partitions once
 * the topic exists and every partition has a leader (LEADER_NOT_AVAILABLE while one has
 * none), else the error. */
static rd_kafka_resp_err_t
topic_metadata(rd_kafka_t *rk, rd_kafka_topic_t *rkt, int timeout_ms, int32_t *out)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1) {
        const struct rd_kafka_metadata_topic *mt = &md->topics[0];
        e = mt->err;
        bool leaders = mt->partition_cnt > 0;
        for (int i = 0; i < mt->partition_cnt; i++)
            leaders = leaders && mt->partitions[i].leader >= 0;
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR && leaders)
            *out = mt->partition_cnt;
        else if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
            e = RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
    }
    if (md)
        rd_kafka_metadata_destroy(md);
    return e;
}

static int topic_partitions(rd_kafka_t *rk,
                            const char *topic,
                            int64_t deadline,
                            const atomic_bool *cancel,
                            int32_t *out,
                            sl_err_t *err)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const char *last = "no answer";
    int64_t unknown_since = -1;
    int step = cancel ? CANCEL_STEP_MS : METADATA_STEP_MS;
    if (!rkt)
        return sl_err_set(err, SL_EKAFKA, "cannot create a handle for topic %s: %s", topic,
                          rd_kafka_err2str(rd_kafka_last_error()));
    int rc = 0;
    for (;;) {
        if (cancelled(cancel)) {
            rc = sl_err_set(err, -ECANCELED, "cancelled while getting metadata of topic %s: %s",
                            topic, last);
            break;
        }
        if (remaining_ms(deadline) == 0) {
            rc = sl_err_set(err, SL_ETIMEDOUT, "could not get metadata of topic %s: %s", topic,
                            last);
            break;
        }
        rd_kafka_resp_err_t e = topic_metadata(rk, rkt, step_timeout(deadline, step), out);
        step_grow(&step, e);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
            break;
        last = rd_kafka_err2str(e);
        if (e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
            /* a just-created topic may take a moment to reach every broker */
            if (unknown_since < 0)
                unknown_since = sl_mono_ms();
            if (sl_mono_ms() - unknown_since >= UNKNOWN_TOPIC_MS) {
                rc = sl_err_set(err, SL_ENOTFOUND, "topic %s does not exist", topic);
                break;
            }
        }
        sl_sleep_ms(100);
    }
    rd_kafka_topic_destroy(rkt);
    return rc;
}

static int reader_open(const struct sl_config *cfg,
                       const char *topic,
                       int64_t deadline,
                       const atomic_bool *cancel,
                       struct reader *r,
                       sl_err_t *err)
{
    static const char *const extra[] = {"enable.partition.eof",
                                        "true",
                                        "auto.offset.reset",
                                        "earliest",
                                        "fetch.wait.max.ms",
                                        "100",
                                        "fetch.error.backoff.ms",
                                        "100",
                                        NULL};
    int rc = 0;
    rd_kafka_topic_partition_list_t *parts = NULL;
    memset(r, 0, sizeof(*r));
    r->cancel = cancel;
    r->rk = sl_kafka_reader_new(cfg, "sluice-endpoints", READER_GROUP_ID, extra, err);
    if (!r->rk)
        return SL_EKAFKA;
    rc = topic_partitions(r->rk, topic, deadline, cancel, &r->n_parts, err);
    if (rc != 0)
        goto out;
    r->hwm = sl_xcalloc((size_t)r->n_parts, sizeof(*r->hwm));
    r->done = sl_xcalloc((size_t)r->n_parts, sizeof(*r->done));
    parts = rd_kafka_topic_partition_list_new(r->n_parts);
    for (int32_t p = 0; p < r->n_parts; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t e;
        int step = CANCEL_STEP_MS; /* only while a cancel flag is watched */
        for (;;) {
            if (cancelled(cancel)) {
                rc = sl_err_set(err, -ECANCELED,
                                "cancelled while getting the offsets of topic %s partition %d",
                                topic, (int)p);
                goto out;
            }
            int64_t left = remaining_ms(deadline);
            /* without a cancel flag, one call may take whatever is left */
            int t = cancel ? step_timeout(deadline, step) : (int)left;
            e = rd_kafka_query_watermark_offsets(r->rk, topic, p, &lo, &hi, t > 0 ? t : 1);
            if (e == RD_KAFKA_RESP_ERR_NO_ERROR || left == 0)
                break;
            step_grow(&step, e);
            sl_sleep_ms(100);
        }
        if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
            rc = sl_err_set(err, SL_ETIMEDOUT,
                            "could not get the offsets of topic %s partition %d: %s", topic, (int)p,
                            rd_kafka_err2str(e));
            goto out;
        }
        r->hwm[p] = hi;
        if (hi <= lo) { /* nothing to read */
            r->done[p] = true;
            r->n_done++;
        }
        rd_kafka_topic_partition_list_add(parts, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    }
    rd_kafka_resp_err_t e = rd_kafka_assign(r->rk, parts);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        rc =
            sl_err_set(err, SL_EKAFKA, "could not assign topic %s: %s", topic, rd_kafka_err2str(e));
out:
    if (parts)
        rd_kafka_topic_partition_list_destroy(parts);
    if (rc != 0)
        reader_close(r);
    return rc;
}

static void mark_done(struct reader *r, int32_t p)
{
    if (p >= 0 && p < r->n_parts && !r->done[p]) {
        r->done[p] = true;
        r->n_done++;
    }
}

/*
 * Consume until every partition reached its watermark (or r->cancel). fn handles each record
 * (non-zero stops and is returned). Consumer errors are logged once per distinct code.
 */
static int reader_load(struct reader *r,
                       const char *topic,
                       int64_t deadline,
                       int (*fn)(void *opaque, const rd_kafka_message_t *m),
                       void *opaque,
                       sl_err_t *err)
{
    rd_kafka_resp_err_t last = RD_KAFKA_RESP_ERR_NO_ERROR;
    while (r->n_done < r->n_parts) {
        if (cancelled(r->cancel))
            return sl_err_set(err, -ECANCELED,
                              "cancelled while reading topic %s: %d of %d partitions complete",
                              topic, (int)r->n_done, (int)r->n_parts);
        int64_t left = remaining_ms(deadline);
        if (left == 0)
            return sl_err_set(err, SL_ETIMEDOUT,
                              "could not read topic %s up to its end in time: %d of %d "
                              "partitions complete",
                              topic, (int)r->n_done, (int)r->n_parts);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(r->rk, (int)(left < 100 ? left : 100));
        if (!m)
            continue;
        int rc = 0;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            mark_done(r, m->partition);
        } else if (m->err) {
            if (m->err != last)
                sl_warn("endpoints", "endpoints_read_error", "reading topic %s: %s", topic,
                        rd_kafka_message_errstr(m));
            last = m->err;
        } else {
            rc = fn(opaque, m);
            if (m->partition >= 0 && m->partition < r->n_parts &&
                m->offset + 1 >= r->hwm[m->partition])
                mark_done(r, m->partition);
        }
        rd_kafka_message_destroy(m);
        if (rc != 0)
            return rc;
    }
    return 0;
}

struct scan_ctx {
    sl_endpoints_scan_fn fn; /* caller's callback */
    void *opaque;            /* caller's opaque */
};

static int scan_one(void *opaque, const rd_kafka_message_t *m)
{
    struct scan_ctx *c = opaque;
    return c->fn(c->opaque, m->key ? m->key : "", m->key ? m->key_len : 0, m->payload,
                 m->payload ? m->len : 0);
}

int sl_endpoints_scan(const struct sl_config *cfg,
                      int timeout_ms,
                      sl_endpoints_scan_fn fn,
                      void *opaque,
                      sl_err_t *err)
{
    struct reader r;
    struct scan_ctx c = {fn, opaque};
    int64_t deadline = sl_mono_ms() + timeout_ms;
    int rc = reader_open(cfg, cfg->topic_endpoints, deadline, NULL, &r, err);
    if (rc != 0)
        return rc;
    rc = reader_load(&r, cfg->topic_endpoints, deadline, scan_one, &c, err);
    reader_close(&r);
    return rc;
}

/* ==== Applying records ==== */

static void slot_free(void *v)
{
    struct slot *s = v;
    if (!s)
        return;
    sl_endpoint_release(s->e);
    free(s);
}

static void notify(sl_endpoints_t *t, const char *id, const struct sl_endpoint *e)
{
    pthread_rwlock_rdlock(&t->lock);
    sl_endpoints_change_fn fn = t->fn;
    void *opaque = t->opaque;
    pthread_rwlock_unlock(&t->lock);
    if (fn)
        fn(opaque, id, e);
}

static void
log_invalid(sl_endpoints_t *t, const char *id, const rd_kafka_message_t *m, const char *why)
{
    atomic_fetch_add(&t->st_invalid, 1);
    if (t->initial && ++t->initial_logged > INITIAL_LOG_MAX)
        return; /* summarised at the end of the initial load */
    struct sl_log_kv kv[] = {SL_KV_S("endpoint_id", id), SL_KV_I("partition", m->partition),
                             SL_KV_I("offset", m->offset)};
    SL_LOGKV(SL_LOG_WARN, "endpoints", "endpoint_record_invalid", kv,
             "ignoring endpoint record (previous version kept): %s", why);
}

/* The latest record of id failed authentication (why) or, why NULL, no longer does. */
static void set_refused(sl_endpoints_t *t, const char *id, const char *why)
{
    void *old = NULL;
    if (!why && !sl_map_get(t->refused, id))
        return;
    pthread_rwlock_wrlock(&t->lock);
    if (why)
        sl_map_put(t->refused, id, sl_xstrdup(why), &old);
    else
        sl_map_del(t->refused, id, &old);
    pthread_rwlock_unlock(&t->lock);
    free(old);
}

/* The log event of a refusal, from its reason (sl_endpoint_rec_verify's text, or
 * rec_endpoint's, which starts with STALE_TEXT). */
static const char *refusal_event(const char *why)
{
    if (strstr(why, "not signed"))
        return "endpoint_record_unsigned";
    if (strstr(why, STALE_TEXT))
        return "endpoint_record_stale";
    return "endpoint_record_forged";
}

static void
log_refused(sl_endpoints_t *t, const char *id, const rd_kafka_message_t *m, const char *why)
{
    atomic_fetch_add(&t->st_refused, 1);
    set_refused(t, id, why);
    if (t->initial)
        return; /* a later record may replace it: logged at the end of the load if not */
    struct sl_log_kv kv[] = {SL_KV_S("endpoint_id", id), SL_KV_I("partition", m->partition),
                             SL_KV_I("offset", m->offset)};
    SL_LOGKV(SL_LOG_ERROR, "endpoints", refusal_event(why), kv,
             "refusing endpoint record (never delivered to; previous version kept): %s", why);
}

/* End of the initial load: each endpoint whose latest record is refused (earlier records
 * of an endpoint, e.g. signed with a retired key before a reseal, are not reported). */
static void log_refused_at_load(void *opaque, const char *id, const char *why)
{
    (void)opaque;
    struct sl_log_kv kv[] = {SL_KV_S("endpoint_id", id)};
    SL_LOGKV(SL_LOG_ERROR, "endpoints", refusal_event(why), kv,
             "refusing endpoint record (never delivered to): %s", why);
}

static void apply_delete(sl_endpoints_t *t, const char *id)
{
    void *old = NULL;
    if (t->initial && t->failed)
        sl_map_del(t->failed, id, NULL);
    set_refused(t, id, NULL);
    if (!sl_map_get(t->map, id))
        return; /* deleting what we do not have (or never could decrypt): no change */
    pthread_rwlock_wrlock(&t->lock);
    sl_map_del(t->map, id, &old);
    pthread_rwlock_unlock(&t->lock);
    slot_free(old);
    atomic_fetch_add(&t->generation, 1);
    atomic_fetch_add(&t->st_applied, 1);
    if (!t->initial) {
        sl_info("endpoints", "endpoint_deleted", "endpoint %s deleted", id);
        notify(t, id, NULL);
    }
}

static void register_secrets(const struct sl_endpoint *e)
{
    char s[SL_SECRET_STR_MAX];
    for (size_t i = 0; i < e->n_secrets; i++) {
        if (sl_secret_format(&e->secrets[i], s, sizeof(s), NULL) == 0)
            sl_log_add_secret(s);
        sl_secret_wipe(s, sizeof(s));
    }
}

/* A record's endpoint: decoded, its id the key's, its MAC verified, built. NULL when refused
 * or invalid (logged; during the initial load the id is kept in t->failed for its end). */
static struct sl_endpoint *rec_endpoint(sl_endpoints_t *t,
                                        const char *id,
                                        const rd_kafka_message_t *m,
                                        struct sl_endpoint_rec *rec)
{
    sl_err_t err;
    struct sl_endpoint *e = NULL;
    if (sl_endpoint_rec_decode(m->payload, m->len, NULL, rec, &err) != 0) {
        log_invalid(t, id, m, err.msg);
        return NULL;
    }
    if (strcmp(rec->id, id) != 0) {
        log_invalid(t, id, m, "the record's id differs from its key");
        return NULL;
    }
    bool loading = t->initial && t->failed;
    int rc = sl_endpoint_rec_verify(&t->mk, rec, &err);
    if (rc != 0) {
        if (loading)
            sl_map_put(t->failed, id, NULL, NULL);
        log_refused(t, id, m, err.msg);
        return NULL;
    }
    /* Authentic but older than what is in force: a replayed record (an old URL, secret or
     * enabled flag) must not win. The registry's updated_at only moves forward per endpoint
     * (sl_reg_db_update), so a genuine change is never older; equal is a republish. */
    const struct slot *cur = sl_map_get(t->map, id);
    if (cur && rec->updated_ms < cur->e->updated_ms) {
        char why[200];
        (void)snprintf(why, sizeof(why),
                       STALE_TEXT " (updated %" PRIu64 " ms, the endpoint's current record %" PRIu64
                                  " ms): replayed onto the topic?",
                       rec->updated_ms, cur->e->updated_ms);
        log_refused(t, id, m, why);
        return NULL;
    }
    set_refused(t, id, NULL);
    rc = sl_endpoint_build(rec, &t->mk, &t->defs, (uint64_t)sl_now_ms(), &e, &err);
    if (rc != 0) {
        if (rc == SL_ECRYPTO && loading)
            sl_map_put(t->failed, id, NULL, NULL);
        log_invalid(t, id, m, err.msg);
        return NULL;
    }
    if (loading)
        sl_map_del(t->failed, id, NULL);
    return e;
}

/* Make e the endpoint of id (its record hashing to digest); after the initial load, log it
 * and tell the listeners. */
static void install(sl_endpoints_t *t, const char *id, struct sl_endpoint *e, const uint8_t *digest)
{
    e->version = ++t->next_version;
    register_secrets(e);
    struct slot *s = sl_xmalloc(sizeof(*s));
    s->e = e;
    memcpy(s->digest, digest, DIGEST_LEN);
    void *old = NULL;
    pthread_rwlock_wrlock(&t->lock);
    sl_map_put(t->map, id, s, &old);
    pthread_rwlock_unlock(&t->lock);
    slot_free(old);
    atomic_fetch_add(&t->generation, 1);
    atomic_fetch_add(&t->st_applied, 1);
    if (!t->initial) {
        struct sl_log_kv kv[] = {SL_KV_S("endpoint_id", id), SL_KV_I("version", e->version)};
        SL_LOGKV(SL_LOG_INFO, "endpoints", old ? "endpoint_changed" : "endpoint_added", kv,
                 "endpoint %s %s", id, old ? "changed" : "added");
        notify(t, id, e);
    }
}

static void apply(sl_endpoints_t *t, const rd_kafka_message_t *m)
{
    char id[SL_ENDPOINT_ID_MAX + 1];
    uint8_t digest[DIGEST_LEN];
    atomic_fetch_add(&t->st_records, 1);
    if (!m->key || !sl_valid_endpoint_id(m->key, m->key_len)) {
        log_invalid(t, "", m, "record key is not a valid endpoint id");
        return;
    }
    memcpy(id, m->key, m->key_len);
    id[m->key_len] = '\0';
    if (!m->payload) {
        apply_delete(t, id);
        return;
    }
    const void *parts[] = {m->payload};
    if (sl_digest_parts(SL_SHA256, parts, &m->len, 1, digest) != 0) {
        log_invalid(t, id, m, "could not hash the record");
        return;
    }
    struct slot *cur = sl_map_get(t->map, id);
    if (cur && memcmp(cur->digest, digest, DIGEST_LEN) == 0) {
        /* the latest record is the one in force, verified when it was installed */
        atomic_fetch_add(&t->st_unchanged, 1);
        set_refused(t, id, NULL);
        return;
    }
    struct sl_endpoint_rec rec;
    memset(&rec, 0, sizeof(rec));
    struct sl_endpoint *e = rec_endpoint(t, id, m, &rec);
    if (e)
        install(t, id, e, digest);
    sl_endpoint_rec_fini(&rec);
}

static int apply_initial(void *opaque, const rd_kafka_message_t *m)
{
    apply(opaque, m);
    return 0;
}

/* Read the partitions' ends for ticket want (a failed query backs off). */
static void sync_begin(sl_endpoints_t *t, uint64_t want)
{
    int64_t now = sl_mono_ms();
    if (now - atomic_load(&t->sync_req_mono) > SYNC_ABANDON_MS) {
        atomic_store(&t->sync_done, want); /* nobody waits for these any more */
        return;
    }
    if (now < t->sync_retry_mono)
        return;
    for (int32_t p = 0; p < t->n_parts; p++) {
        int64_t lo = 0, hi = 0;
        if (atomic_load(&t->stop) ||
            rd_kafka_query_watermark_offsets(t->rk, t->topic, p, &lo, &hi, SYNC_QUERY_MS) !=
                RD_KAFKA_RESP_ERR_NO_ERROR) {
            t->sync_backoff_ms = t->sync_backoff_ms ? t->sync_backoff_ms * 2 : 250;
            if (t->sync_backoff_ms > SYNC_BACKOFF_MS)
                t->sync_backoff_ms = SYNC_BACKOFF_MS;
            t->sync_retry_mono = sl_mono_ms() + t->sync_backoff_ms;
            return;
        }
        t->sync_end[p] = hi > lo ? hi : 0; /* 0: nothing to read (empty or compacted away) */
    }
    t->sync_backoff_ms = 0;
    t->sync_ticket = want;
}

/*
 * Serve catch-up requests on the updater thread: for the newest ticket waiting, read the
 * partitions' ends (high watermarks, asked of the broker now, so later than the request),
 * then mark the ticket served once this table's position has reached them (every record
 * below them applied).
 */
static void sync_step(sl_endpoints_t *t)
{
    uint64_t want = atomic_load(&t->sync_req);
    if (t->sync_ticket == 0 && want > atomic_load(&t->sync_done))
        sync_begin(t, want);
    if (t->sync_ticket == 0)
        return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(t->n_parts);
    for (int32_t p = 0; p < t->n_parts; p++)
        rd_kafka_topic_partition_list_add(l, t->topic, p);
    bool caught_up = rd_kafka_position(t->rk, l) == RD_KAFKA_RESP_ERR_NO_ERROR;
    for (int i = 0; caught_up && i < l->cnt; i++) {
        int32_t p = l->elems[i].partition;
        /* the position moves with the records handed over; an EOF also covers offsets that
         * carry none (a writer's control records at the end) */
        int64_t at = l->elems[i].offset > t->eof_off[p] ? l->elems[i].offset : t->eof_off[p];
        caught_up = t->sync_end[p] == 0 || at >= t->sync_end[p];
    }
    rd_kafka_topic_partition_list_destroy(l);
    if (caught_up) {
        atomic_store(&t->sync_done, t->sync_ticket);
        t->sync_ticket = 0;
    }
}

uint64_t sl_endpoints_sync_request(sl_endpoints_t *t)
{
    atomic_store(&t->sync_req_mono, sl_mono_ms());
    return atomic_fetch_add(&t->sync_req, 1) + 1;
}

bool sl_endpoints_synced(sl_endpoints_t *t, uint64_t ticket)
{
    return atomic_load(&t->sync_done) >= ticket;
}

/* Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=endpoints_slow_apply delays every
 * live change by SL_FAULT_DELAY_MS (1,500 ms when unset), so that a record naming a
 * just-created endpoint reaches a consumer before its table has the endpoint
 * (tests/e2e/test_delivery.py). */
static void fault_slow_apply(void)
{
    if (sl_fault_is("endpoints_slow_apply"))
        sl_sleep_ms(sl_fault_delay_ms(1500));
}

static void *updater_main(void *arg)
{
    sl_endpoints_t *t = arg;
    while (!atomic_load(&t->stop)) {
        bool waiting = atomic_load(&t->sync_req) > atomic_load(&t->sync_done) &&
                       sl_mono_ms() >= t->sync_retry_mono;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(t->rk, waiting ? SYNC_POLL_MS : POLL_MS);
        if (!m) {
            sync_step(t);
            continue;
        }
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (m->partition >= 0 && m->partition < t->n_parts)
                t->eof_off[m->partition] = m->offset; /* caught up to there */
        } else if (m->err) {
            if ((int)m->err != t->last_err)
                sl_warn("endpoints", "endpoints_read_error", "reading topic %s: %s", t->topic,
                        rd_kafka_message_errstr(m));
            t->last_err = (int)m->err;
        } else {
            if (t->last_err != 0)
                sl_info("endpoints", "endpoints_read_ok", "reading topic %s again", t->topic);
            t->last_err = 0;
            fault_slow_apply();
            apply(t, m);
        }
        rd_kafka_message_destroy(m);
        sync_step(t);
    }
    return NULL;
}

/* ==== Table ==== */

int sl_endpoints_open(const struct sl_config *cfg,
                      const struct sl_masterkey *mk,
                      int initial_timeout_ms,
                      sl_endpoints_t **out,
                      sl_err_t *err)
{
    return sl_endpoints_open_cancellable(cfg, mk, initial_timeout_ms, NULL, out, err);
}

int sl_endpoints_open_cancellable(const struct sl_config *cfg,
                                  const struct sl_masterkey *mk,
                                  int initial_timeout_ms,
                                  const atomic_bool *cancel,
                                  sl_endpoints_t **out,
                                  sl_err_t *err)
{
    int rc = 0;
    struct reader r;
    sl_endpoints_t *t = NULL;
    memset(&r, 0, sizeof(r));
    if (out)
        *out = NULL;
    if (!cfg || !mk || !out || initial_timeout_ms <= 0)
        return sl_err_set(err, SL_EINVAL,
                          "sl_endpoints_open needs cfg, a master key and a "
                          "positive timeout");
    int64_t t0 = sl_mono_ms();
    int64_t deadline = t0 + initial_timeout_ms;
    t = sl_xcalloc(1, sizeof(*t));
    t->topic = sl_xstrdup(cfg->topic_endpoints);
    t->mk = *mk;
    sl_endpoint_defaults_from_cfg(cfg, &t->defs);
    /* glibc prefers readers by default: delivery threads calling sl_endpoints_get all the
     * time could starve the updater; no reader ever nests read locks, so writer preference
     * is safe */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&t->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    t->map = sl_map_new(64);
    t->failed = sl_map_new(0);
    atomic_init(&t->generation, 0);
    atomic_init(&t->stop, false);
    atomic_init(&t->st_records, 0);
    atomic_init(&t->st_applied, 0);
    atomic_init(&t->st_unchanged, 0);
    atomic_init(&t->st_invalid, 0);
    atomic_init(&t->st_refused, 0);
    atomic_init(&t->sync_req, 0);
    atomic_init(&t->sync_done, 0);
    atomic_init(&t->sync_req_mono, 0);
    t->refused = sl_map_new(8);
    t->initial = true;
    rc = reader_open(cfg, t->topic, deadline, cancel, &r, err);
    if (rc != 0)
        goto out;
    t->rk = r.rk;
    t->n_parts = r.n_parts;
    t->sync_end = sl_xcalloc((size_t)(r.n_parts > 0 ? r.n_parts : 1), sizeof(*t->sync_end));
    t->eof_off = sl_xcalloc((size_t)(r.n_parts > 0 ? r.n_parts : 1), sizeof(*t->eof_off));
    rc = reader_load(&r, t->topic, deadline, apply_initial, t, err);
    if (rc != 0)
        goto out;
    if (t->initial_logged > INITIAL_LOG_MAX)
        sl_warn("endpoints", "endpoint_records_invalid",
                "%" PRIu64 " more invalid endpoint records were not logged one by one",
                t->initial_logged - INITIAL_LOG_MAX);
    if (sl_map_count(t->map) == 0 && sl_map_count(t->failed) > 0) {
        rc = sl_err_set(err, SL_ECRYPTO,
                        "could not authenticate or decrypt any of the %zu endpoints in topic "
                        "%s: is master_key (SLUICE_MASTER_KEY) the key sluicectl used?",
                        sl_map_count(t->failed), t->topic);
        goto out;
    }
    t->initial = false;
    sl_endpoints_refused(t, log_refused_at_load, NULL);
    sl_map_destroy(t->failed, NULL);
    t->failed = NULL;
    {
        struct sl_log_kv kv[] = {SL_KV_I("endpoints", sl_map_count(t->map)),
                                 SL_KV_I("partitions", r.n_parts),
                                 SL_KV_I("ms", sl_mono_ms() - t0)};
        SL_LOGKV(SL_LOG_INFO, "endpoints", "endpoints_loaded", kv, "loaded %zu endpoints from %s",
                 sl_map_count(t->map), t->topic);
    }
    /* the reader's bookkeeping is no longer needed; the client itself lives on in t->rk */
    free(r.hwm);
    free(r.done);
    r.hwm = NULL;
    r.done = NULL;
    r.rk = NULL;
    int prc = pthread_create(&t->thr, NULL, updater_main, t);
    if (prc != 0) {
        rc = sl_err_set(err, -prc, "could not start the endpoints updater thread: %s",
                        strerror(prc));
        goto out;
    }
    t->thr_started = true;
out:
    if (rc != 0) {
        if (t->rk == r.rk)
            t->rk = NULL; /* reader_close below owns it */
        reader_close(&r);
        sl_endpoints_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

const struct sl_endpoint *sl_endpoints_get(sl_endpoints_t *t, const char *id)
{
    const struct sl_endpoint *e = NULL;
    if (!t || !id)
        return NULL;
    pthread_rwlock_rdlock(&t->lock);
    struct slot *s = sl_map_get(t->map, id);
    if (s)
        e = sl_endpoint_ref(s->e);
    pthread_rwlock_unlock(&t->lock);
    return e;
}

uint64_t sl_endpoints_generation(sl_endpoints_t *t)
{
    return atomic_load_explicit(&t->generation, memory_order_acquire);
}

size_t sl_endpoints_count(sl_endpoints_t *t)
{
    pthread_rwlock_rdlock(&t->lock);
    size_t n = sl_map_count(t->map);
    pthread_rwlock_unlock(&t->lock);
    return n;
}

void sl_endpoints_on_change(sl_endpoints_t *t, sl_endpoints_change_fn fn, void *opaque)
{
    pthread_rwlock_wrlock(&t->lock);
    t->fn = fn;
    t->opaque = opaque;
    pthread_rwlock_unlock(&t->lock);
}

void sl_endpoints_stats(sl_endpoints_t *t, struct sl_endpoints_stats *out)
{
    out->records = atomic_load(&t->st_records);
    out->applied = atomic_load(&t->st_applied);
    out->unchanged = atomic_load(&t->st_unchanged);
    out->invalid = atomic_load(&t->st_invalid);
    out->refused = atomic_load(&t->st_refused);
}

size_t sl_endpoints_refused(sl_endpoints_t *t,
                            void (*fn)(void *opaque, const char *id, const char *why),
                            void *opaque)
{
    pthread_rwlock_rdlock(&t->lock);
    size_t it = 0, n = 0;
    const char *key;
    void *val;
    while (sl_map_next(t->refused, &it, &key, &val)) {
        if (fn)
            fn(opaque, key, val);
        n++;
    }
    pthread_rwlock_unlock(&t->lock);
    return n;
}

/* ==== Record authentication ==== */

/* MAC of rec (kid set; its mac ignored) with the record MAC key of rec->kid. */
static int rec_mac(const struct sl_masterkey *mk,
                   const struct sl_endpoint_rec *rec,
                   uint8_t mac[SL_ENDPOINT_MAC_LEN],
                   sl_err_t *err)
{
    static const char domain[] = "sluice endpoint record v1"; /* its NUL is part of it */
    struct sl_endpoint_rec c = *rec;
    c.mac = NULL;
    c.mac_len = 0;
    struct sl_buf b;
    sl_buf_init(&b, SL_ENDPOINT_RECORD_MAX);
    int rc = sl_endpoint_rec_encode(&c, &b, err);
    if (rc == 0) {
        const void *parts[] = {domain, b.data};
        size_t lens[] = {sizeof(domain), b.len};
        rc = sl_masterkey_mac(mk, c.kid, parts, lens, 2, mac, err);
    }
    sl_buf_fini(&b);
    return rc;
}

int sl_endpoint_rec_sign(const struct sl_masterkey *mk,
                         const struct sl_endpoint_rec *rec,
                         struct sl_buf *out,
                         sl_err_t *err)
{
    const struct sl_masterkey_entry *cur = sl_masterkey_find(mk, NULL);
    if (!cur || !rec)
        return sl_err_set(err, SL_EINVAL, "no master key to sign endpoint records with");
    struct sl_endpoint_rec c = *rec;
    uint8_t mac[SL_ENDPOINT_MAC_LEN];
    c.kid = cur->id;
    int rc = rec_mac(mk, &c, mac, err);
    if (rc != 0)
        return rc;
    c.mac = mac;
    c.mac_len = sizeof(mac);
    return sl_endpoint_rec_encode(&c, out, err);
}

int sl_endpoint_rec_verify(const struct sl_masterkey *mk,
                           const struct sl_endpoint_rec *rec,
                           sl_err_t *err)
{
    if (!rec->kid || !rec->mac)
        return sl_err_set(err, SL_EMISSING,
                          "endpoint %s: the record is not signed (run `sluicectl endpoints "
                          "reseal` with the master key)",
                          rec->id);
    if (!sl_masterkey_find(mk, rec->kid))
        return sl_err_set(err, SL_ECRYPTO,
                          "endpoint %s: the record is signed with master key '%s', which is not "
                          "configured",
                          rec->id, rec->kid);
    uint8_t mac[SL_ENDPOINT_MAC_LEN];
    int rc = rec_mac(mk, rec, mac, err);
    if (rc != 0)
        return rc;
    if (rec->mac_len != sizeof(mac) || CRYPTO_memcmp(mac, rec->mac, sizeof(mac)) != 0)
        return sl_err_set(err, SL_ECRYPTO,
                          "endpoint %s: the record's MAC does not match (altered, or not written "
                          "by sluicectl or sluice-api with this master key)",
                          rec->id);
    return 0;
}

void sl_endpoints_snapshot(sl_endpoints_t *t, const struct sl_endpoint ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    pthread_rwlock_rdlock(&t->lock);
    size_t cnt = sl_map_count(t->map);
    if (cnt > 0) {
        const struct sl_endpoint **arr = sl_xcalloc(cnt, sizeof(const struct sl_endpoint *));
        size_t pos = 0, i = 0;
        void *v;
        while (i < cnt && sl_map_next(t->map, &pos, NULL, &v))
            arr[i++] = sl_endpoint_ref(((struct slot *)v)->e);
        *out = arr;
        *n = i;
    }
    pthread_rwlock_unlock(&t->lock);
}

int sl_endpoints_cluster_id(sl_endpoints_t *t, int timeout_ms, char *buf, size_t cap, sl_err_t *err)
{
    if (cap > 0)
        buf[0] = '\0';
    char *id = rd_kafka_clusterid(t->rk, timeout_ms); /* thread-safe: the metadata cache */
    if (!id)
        return sl_err_set(err, SL_EKAFKA, "kafka did not tell its cluster id within %d ms",
                          timeout_ms);
    size_t n = strlen(id);
    int rc = 0;
    if (n >= cap)
        rc = sl_err_set(err, SL_ETOOBIG, "kafka cluster id of %zu bytes is too long", n);
    else
        memcpy(buf, id, n + 1);
    rd_kafka_mem_free(t->rk, id);
    return rc;
}

void sl_endpoints_close(sl_endpoints_t *t)
{
    if (!t)
        return;
    atomic_store(&t->stop, true);
    if (t->thr_started)
        pthread_join(t->thr, NULL);
    if (t->rk) {
        rd_kafka_resp_err_t e = rd_kafka_consumer_close(t->rk);
        if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
            sl_warn("endpoints", "consumer_close_failed", "closing the endpoints reader: %s",
                    rd_kafka_err2str(e));
        rd_kafka_destroy(t->rk);
    }
    sl_map_destroy(t->map, slot_free);
    sl_map_destroy(t->failed, NULL);
    sl_map_destroy(t->refused, free);
    free(t->sync_end);
    free(t->eof_off);
    pthread_rwlock_destroy(&t->lock);
    sl_masterkey_fini(&t->mk);
    free(t->topic);
    free(t);
}
