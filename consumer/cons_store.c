/*
 * cons_store: the consumer's side of the Redis state: its policy over common/sl_rstate, which
 * owns the keys, the scripts and running them (see cons_store.h for the contract).
 *
 * What lives here and not in sl_rstate:
 *   - lease tokens: 128 random bits per claim call (OpenSSL RAND_bytes), one token for every
 *     job a call leases (the lease check is per (job id, token), so that is enough);
 *   - the consumer's caps (body size, owner length) and what a result means to it (an
 *     existing job is not an error; a lost lease is SL_ESTATE);
 *   - breaker key expiry: the idle margin CONS_STORE_BRK_IDLE_MS beyond the longest cooldown,
 *     and a per-endpoint base above the global cap raising the cap;
 *   - the dedup markers' values ("1 <attempt> <ts_ms> <status> <lat_us>" delivered, "d"
 *     dead-lettered) and the intake check that reads markers and retry jobs in one pipeline.
 *
 * Times: every time stored in Redis, and every comparison with "now", is on Redis's clock
 * (sl_rstate.c states the rule per script). A pod's own clock still times what is its own:
 * its copy of a lease (it renews early and sends only with room to spare, starting the count
 * before the call, so it errs early), outcome timestamps, and signature timestamps. Markers
 * expire on Redis's clock (SET ... EX); the ts_ms a marker remembers is an outcome timestamp
 * for the history, never compared.
 *
 * thread: the caller's (one sl_redis_t per thread).
 */
#include "consumer/cons_store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "common/sl_fmt.h"
#include "common/sl_hex.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_rstate.h"

/* ==== Helpers ==== */

static int valid_str(const char *s, size_t max)
{
    if (!s)
        return 0;
    size_t n = strnlen(s, max + 1);
    return n >= 1 && n <= max;
}

static int valid_ms(int64_t v)
{
    return v >= 0 && v <= CONS_STORE_MS_MAX;
}

static int valid_shards(uint32_t nshards)
{
    return nshards >= 1 && nshards <= CONS_STORE_SHARDS_MAX;
}

/* 128 random bits as 32 lowercase hex characters + NUL. */
static int new_token(char out[CONS_TOKEN_LEN + 1])
{
    unsigned char raw[CONS_TOKEN_LEN / 2];
    if (RAND_bytes(raw, (int)sizeof(raw)) != 1)
        return SL_ECRYPTO;
    sl_hex_encode(raw, sizeof(raw), out);
    return 0;
}

/* Is rep the string (bulk or status) lit? */
static int reply_is(const redisReply *rep, const char *lit)
{
    size_t n = strlen(lit);
    return (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS) && rep->len == n &&
           memcmp(rep->str, lit, n) == 0;
}

/* ==== Job ids ==== */

void cons_store_job_id(const char *endpoint_id, const char *event_id, char out[41])
{
    sl_rstate_job_id(endpoint_id, event_id, out);
}

uint32_t cons_store_shard(const char *job_id, uint32_t nshards)
{
    return sl_rstate_shard(job_id, nshards);
}

/* ==== Retry schedule ==== */

int cons_store_schedule(sl_redis_t *r,
                        uint32_t nshards,
                        const char *job_id,
                        const void *body,
                        size_t body_len,
                        int64_t delay_ms,
                        const char *lease_token,
                        int *existed,
                        sl_err_t *err)
{
    if (existed)
        *existed = 0;
    if (body_len > CONS_STORE_BODY_MAX)
        return sl_err_set(err, SL_ETOOBIG, "cannot schedule job: body exceeds %zu bytes",
                          CONS_STORE_BODY_MAX);
    int rc = sl_rstate_put(r, nshards, job_id, body, body_len, delay_ms, lease_token, err);
    if (rc == SL_RSTATE_PUT_EXISTED) {
        if (existed)
            *existed = 1;
        return 0;
    }
    if (rc == SL_RSTATE_PUT_LOST)
        return sl_err_set(err, SL_ESTATE, "cannot reschedule job: lease lost to another claim");
    return rc; /* SL_RSTATE_PUT_OK (0) or an error */
}

void cons_store_claimed_free(struct cons_claimed *c, int n)
{
    if (!c)
        return;
    for (int i = 0; i < n; i++)
        free(c[i].body);
    free(c);
}

int cons_store_claim(sl_redis_t *r,
                     uint32_t shard,
                     int64_t lease_ms,
                     int max,
                     struct cons_claimed **out,
                     sl_err_t *err)
{
    if (!out)
        return sl_err_set(err, SL_EINVAL, "cannot claim jobs: no output array");
    *out = NULL;
    char token[CONS_TOKEN_LEN + 1];
    if (new_token(token) != 0)
        return sl_err_set(err, SL_ECRYPTO,
                          "could not claim jobs: no random bytes for a lease token");
    redisReply *rep = NULL;
    int rc = sl_rstate_claim(r, shard, lease_ms, max, token, &rep, err);
    if (rc != 0 || !rep)
        return rc;
    /* the reply's shape is checked: [id, token, body] triples of well-formed ids and tokens */
    int n = (int)(rep->elements / 3);
    struct cons_claimed *c = n > 0 ? sl_xcalloc((size_t)n, sizeof(*c)) : NULL;
    for (int i = 0; i < n; i++) {
        redisReply *const *e = rep->element + (size_t)3 * (size_t)i;
        memcpy(c[i].job_id, e[0]->str, CONS_JOBID_LEN);
        c[i].job_id[CONS_JOBID_LEN] = '\0';
        memcpy(c[i].token, e[1]->str, CONS_TOKEN_LEN);
        c[i].token[CONS_TOKEN_LEN] = '\0';
        c[i].shard = shard;
        c[i].body_len = e[2]->len;
        c[i].body = sl_xmalloc(e[2]->len + 1);
        if (e[2]->len)
            memcpy(c[i].body, e[2]->str, e[2]->len);
        c[i].body[e[2]->len] = '\0';
    }
    freeReplyObject(rep);
    *out = c;
    return n;
}

int cons_store_complete(
    sl_redis_t *r, uint32_t nshards, const char *job_id, const char *token, sl_err_t *err)
{
    int rc = sl_rstate_complete(r, nshards, job_id, token, err);
    if (rc == 1)
        return sl_err_set(err, SL_ESTATE, "cannot complete job: lease lost to another claim");
    return rc;
}

int cons_store_renew(sl_redis_t *r,
                     uint32_t shard,
                     int64_t lease_ms,
                     size_t n,
                     const char *const *job_ids,
                     const char *const *tokens,
                     unsigned char *kept,
                     sl_err_t *err)
{
    return sl_rstate_renew(r, shard, lease_ms, n, job_ids, tokens, kept, err);
}

int cons_store_job_exists(sl_redis_t *r, uint32_t nshards, const char *job_id, sl_err_t *err)
{
    unsigned char present = 0;
    int rc = sl_rstate_jobs_exist(r, nshards, 1, &job_id, &present, err);
    return rc != 0 ? rc : present;
}

int cons_store_counts(
    sl_redis_t *r, uint32_t nshards, int64_t *scheduled, int64_t *leased, sl_err_t *err)
{
    struct sl_rstate_counts c;
    int rc = sl_rstate_counts(r, nshards, 0, &c, err);
    if (rc == 0 && scheduled)
        *scheduled = c.scheduled;
    if (rc == 0 && leased)
        *leased = c.leased;
    return rc;
}

/* ==== Dedup markers ==== */

struct done_ctx {
    const char *const *endpoint_ids;      /* borrowed */
    const char *const *event_ids;         /* borrowed */
    unsigned char *out;                   /* check: results; mark: NULL */
    char ttl[24];                         /* mark: EX seconds as text */
    const char *const *job_ids;           /* intake check: job id per pair or NULL (borrowed) */
    unsigned char *exists;                /* intake check: job key exists, per pair */
    uint32_t nshards;                     /* intake check: retry shard count */
    size_t n;                             /* intake check: pairs (the first n commands) */
    const size_t *jpair;                  /* intake check: pair of each EXISTS command */
    const struct cons_done_info *info_in; /* mark: per pair or NULL (borrowed) */
    struct cons_done_info *info_out;      /* check: per pair or NULL (borrowed) */
    char val[96];                         /* mark: the value of the command being built */
    int dead;                             /* mark: a dead-letter marker (SET ... NX) */
};

/* Parse a delivered marker's value "1 <attempt> <ts_ms> <status> <lat_us>" into *out; a bare
 * "1" (or anything unexpected) leaves it zeroed (attempt 0 = unknown). */
static void parse_done_value(const char *s, size_t len, struct cons_done_info *out)
{
    memset(out, 0, sizeof(*out));
    char tmp[96];
    if (len < 3 || len >= sizeof(tmp) || s[0] != '1' || s[1] != ' ')
        return;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    unsigned long long a, st, lat;
    long long ts;
    char extra;
    if (sscanf(tmp + 2, "%llu %lld %llu %llu%c", &a, &ts, &st, &lat, &extra) != 4)
        return;
    if (a < 1 || a > UINT32_MAX || ts < 0 || st > 999)
        return;
    out->attempt = (uint32_t)a;
    out->ts_ms = ts;
    out->status = (uint32_t)st;
    out->lat_us = (uint64_t)lat;
}

/* Pair i's marker key into keybuf (SL_RSTATE_KEY_MAX bytes); returns its length. */
static size_t done_key(const struct done_ctx *d, size_t i, char *keybuf)
{
    int n = sl_rstate_key_done(keybuf, SL_RSTATE_KEY_MAX, d->endpoint_ids[i], d->event_ids[i]);
    return (size_t)n; /* id lengths were checked before any I/O, so it fits */
}

static int check_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    argv[0] = "GET";
    argvlen[0] = 3;
    argv[1] = keybuf;
    argvlen[1] = done_key(ctx, i, keybuf);
    return 2;
}

static int check_check(void *ctx, size_t i, const redisReply *rep)
{
    struct done_ctx *d = ctx;
    if (rep->type == REDIS_REPLY_NIL)
        d->out[i] = 0;
    else if (rep->type != REDIS_REPLY_STRING)
        return -1;
    else if (rep->len == 1 && rep->str[0] == 'd')
        d->out[i] = CONS_DONE_DEAD;
    else
        d->out[i] = CONS_DONE_DELIVERED; /* "1 ..." (or any other value: treat as delivered) */
    if (d->info_out) {
        if (d->out[i] == CONS_DONE_DELIVERED)
            parse_done_value(rep->str, rep->len, &d->info_out[i]);
        else
            memset(&d->info_out[i], 0, sizeof(d->info_out[i]));
    }
    return 0;
}

/* A marker write: delivered, SET key "1[ ...]" EX ttl; dead-lettered (d->dead), SET key d EX
 * ttl NX, so a delivered marker is never downgraded. */
static int mark_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    struct done_ctx *d = ctx;
    argv[0] = "SET";
    argvlen[0] = 3;
    argv[1] = keybuf;
    argvlen[1] = done_key(d, i, keybuf);
    argv[2] = d->dead ? "d" : "1";
    argvlen[2] = 1;
    const struct cons_done_info *in = d->info_in ? &d->info_in[i] : NULL;
    if (!d->dead && in && in->attempt > 0) {
        struct sl_fmt f; /* "1 <attempt> <ts_ms> <status> <lat_us>" */
        sl_fmt_init(&f, d->val, sizeof(d->val));
        sl_fmt_mem(&f, "1 ", 2);
        sl_fmt_u64(&f, in->attempt);
        sl_fmt_mem(&f, " ", 1);
        sl_fmt_i64(&f, in->ts_ms);
        sl_fmt_mem(&f, " ", 1);
        sl_fmt_u64(&f, in->status);
        sl_fmt_mem(&f, " ", 1);
        sl_fmt_u64(&f, in->lat_us);
        int n = sl_fmt_end(&f);
        if (n > 0 && (size_t)n < sizeof(d->val)) {
            argv[2] = d->val;
            argvlen[2] = (size_t)n;
        }
    }
    argv[3] = "EX";
    argvlen[3] = 2;
    argv[4] = d->ttl;
    argvlen[4] = strlen(d->ttl);
    if (!d->dead)
        return 5;
    argv[5] = "NX";
    argvlen[5] = 2;
    return 6;
}

/* OK when set; for NX, nil when a marker was there already: both fine. */
static int mark_check(void *ctx, size_t i, const redisReply *rep)
{
    const struct done_ctx *d = ctx;
    (void)i;
    return reply_is(rep, "OK") || (d->dead && rep->type == REDIS_REPLY_NIL) ? 0 : -1;
}

static int done_validate(size_t n,
                         const char *const *endpoint_ids,
                         const char *const *event_ids,
                         const char *op,
                         sl_err_t *err)
{
    if (n > 0 && (!endpoint_ids || !event_ids))
        return sl_err_set(err, SL_EINVAL, "cannot %s: id arrays missing", op);
    for (size_t i = 0; i < n; i++) {
        if (!valid_str(endpoint_ids[i], SL_ENDPOINT_ID_MAX))
            return sl_err_set(err, SL_EINVAL, "cannot %s: endpoint id %zu empty or over %d bytes",
                              op, i, SL_ENDPOINT_ID_MAX);
        if (!valid_str(event_ids[i], SL_EVENT_ID_MAX))
            return sl_err_set(err, SL_EINVAL, "cannot %s: event id %zu empty or over %d bytes", op,
                              i, SL_EVENT_ID_MAX);
    }
    return 0;
}

/* Intake check: commands [0, n) read the pairs' markers; command n + k asks whether the
 * retry job of pair jpair[k] (the pairs that have a job id, in order) exists. */
static int intake_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    struct done_ctx *d = ctx;
    if (i < d->n)
        return check_build(ctx, i, keybuf, argv, argvlen);
    const char *job_id = d->job_ids[d->jpair[i - d->n]];
    argv[0] = "EXISTS";
    argvlen[0] = 6;
    argv[1] = keybuf;
    argvlen[1] = (size_t)sl_rstate_key_job(keybuf, SL_RSTATE_KEY_MAX,
                                           sl_rstate_shard(job_id, d->nshards), job_id);
    return 2;
}

static int intake_check_reply(void *ctx, size_t i, const redisReply *rep)
{
    struct done_ctx *d = ctx;
    if (i < d->n)
        return check_check(ctx, i, rep);
    if (rep->type != REDIS_REPLY_INTEGER)
        return -1;
    d->exists[d->jpair[i - d->n]] = rep->integer == 1;
    return 0;
}

int cons_store_intake_check(sl_redis_t *r,
                            uint32_t nshards,
                            size_t n,
                            const char *const *endpoint_ids,
                            const char *const *event_ids,
                            const char *const *job_ids,
                            unsigned char *out,
                            struct cons_done_info *info,
                            sl_err_t *err)
{
    static const char op[] = "check delivered markers and retry jobs";
    int rc = done_validate(n, endpoint_ids, event_ids, op, err);
    if (rc != 0)
        return rc;
    if (n > 0 && !out)
        return sl_err_set(err, SL_EINVAL, "cannot %s: no output array", op);
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          CONS_STORE_SHARDS_MAX);
    size_t m = 0; /* pairs with a job id */
    for (size_t i = 0; job_ids && i < n; i++) {
        if (job_ids[i] && !sl_rstate_valid_id(job_ids[i]))
            return sl_err_set(err, SL_EINVAL, "cannot %s: job id %zu is not 40 hex digits", op, i);
        m += job_ids[i] != NULL;
    }
    unsigned char *exists = sl_xcalloc(n ? n : 1, 1);
    size_t *jpair = sl_xcalloc(m ? m : 1, sizeof(*jpair));
    for (size_t i = 0, k = 0; job_ids && i < n; i++) {
        if (job_ids[i])
            jpair[k++] = i;
    }
    struct done_ctx d = {.endpoint_ids = endpoint_ids,
                         .event_ids = event_ids,
                         .out = out,
                         .job_ids = job_ids,
                         .exists = exists,
                         .nshards = nshards,
                         .info_out = info,
                         .n = n,
                         .jpair = jpair};
    struct sl_rstate_pipe p = {.build = intake_build, .check = intake_check_reply, .ctx = &d};
    rc = sl_rstate_pipe_run(r, &p, n + m, op, err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (out[i] == 0 && exists[i])
            out[i] = CONS_DONE_CHAIN;
    }
    free(exists);
    free(jpair);
    return rc;
}

int cons_store_dead_mark(
    sl_redis_t *r, const char *endpoint_id, const char *event_id, int64_t ttl_s, sl_err_t *err)
{
    static const char op[] = "set dead-letter marker";
    const char *eps[1] = {endpoint_id}, *ids[1] = {event_id};
    int rc = done_validate(1, eps, ids, op, err);
    if (rc != 0)
        return rc;
    if (ttl_s < 1 || ttl_s > CONS_STORE_MS_MAX / 1000)
        return sl_err_set(err, SL_EINVAL, "cannot %s: ttl out of range", op);
    struct done_ctx d = {.endpoint_ids = eps, .event_ids = ids, .dead = 1};
    (void)snprintf(d.ttl, sizeof(d.ttl), "%" PRId64, ttl_s);
    struct sl_rstate_pipe p = {.build = mark_build, .check = mark_check, .ctx = &d};
    return sl_rstate_pipe_run(r, &p, 1, op, err);
}

int cons_store_done_mark(sl_redis_t *r,
                         size_t n,
                         const char *const *endpoint_ids,
                         const char *const *event_ids,
                         const struct cons_done_info *info,
                         int64_t ttl_s,
                         sl_err_t *err)
{
    static const char op[] = "set delivered markers";
    int rc = done_validate(n, endpoint_ids, event_ids, op, err);
    if (rc != 0)
        return rc;
    if (ttl_s < 1 || ttl_s > CONS_STORE_MS_MAX / 1000)
        return sl_err_set(err, SL_EINVAL, "cannot %s: ttl out of range", op);
    struct done_ctx d = {.endpoint_ids = endpoint_ids, .event_ids = event_ids, .info_in = info};
    (void)snprintf(d.ttl, sizeof(d.ttl), "%" PRId64, ttl_s);
    struct sl_rstate_pipe p = {.build = mark_build, .check = mark_check, .ctx = &d};
    return sl_rstate_pipe_run(r, &p, n, op, err);
}

/* ==== Circuit breaker ==== */

/* Copy a script's view into the consumer's. */
static void brk_view(const struct sl_rstate_brk *b, struct cons_brk_view *out)
{
    if (!out)
        return;
    out->state = (enum cons_brk_state)b->state;
    out->failures = b->failures;
    out->reopen_at_ms = b->reopen_at_ms;
    out->cooldown_ms = b->cooldown_ms;
    out->probe = b->probe;
    out->now_ms = b->now_ms;
    out->open_since_ms = b->open_since_ms;
}

int cons_store_brk_record(sl_redis_t *r,
                          const char *endpoint_id,
                          int success,
                          int64_t threshold,
                          int64_t cooldown_base_ms,
                          int64_t cooldown_max_ms,
                          const char *owner,
                          struct cons_brk_view *out,
                          sl_err_t *err)
{
    static const char op[] = "record breaker result";
    if (!valid_str(endpoint_id, SL_ENDPOINT_ID_MAX))
        return sl_err_set(err, SL_EINVAL, "cannot %s: endpoint id empty or over %d bytes", op,
                          SL_ENDPOINT_ID_MAX);
    if (!valid_str(owner, CONS_STORE_OWNER_MAX))
        return sl_err_set(err, SL_EINVAL, "cannot %s: owner empty or over %d bytes", op,
                          CONS_STORE_OWNER_MAX);
    if (threshold < 1 || threshold > CONS_STORE_MS_MAX || cooldown_base_ms < 1 ||
        !valid_ms(cooldown_base_ms) || !valid_ms(cooldown_max_ms))
        return sl_err_set(err, SL_EINVAL,
                          "cannot %s: threshold or cooldown out of range "
                          "(need threshold >= 1, base >= 1)",
                          op);
    /* A per-endpoint base above the global cap: the cap gives way, so the breaker still
     * works (with a constant cooldown) instead of every record failing. */
    if (cooldown_max_ms < cooldown_base_ms)
        cooldown_max_ms = cooldown_base_ms;
    struct sl_rstate_brk b;
    /* the key lives the longest cooldown this breaker can reach, plus the margin */
    int rc =
        sl_rstate_brk_record(r, endpoint_id, success, threshold, cooldown_base_ms, cooldown_max_ms,
                             owner, cooldown_max_ms + CONS_STORE_BRK_IDLE_MS, &b, err);
    if (rc == 0)
        brk_view(&b, out);
    return rc;
}

int cons_store_brk_acquire(sl_redis_t *r,
                           const char *endpoint_id,
                           int64_t probe_lease_ms,
                           const char *owner,
                           struct cons_brk_view *out,
                           sl_err_t *err)
{
    static const char op[] = "acquire breaker probe";
    if (!valid_str(endpoint_id, SL_ENDPOINT_ID_MAX))
        return sl_err_set(err, SL_EINVAL, "cannot %s: endpoint id empty or over %d bytes", op,
                          SL_ENDPOINT_ID_MAX);
    if (!valid_str(owner, CONS_STORE_OWNER_MAX))
        return sl_err_set(err, SL_EINVAL, "cannot %s: owner empty or over %d bytes", op,
                          CONS_STORE_OWNER_MAX);
    if (probe_lease_ms < 1 || !valid_ms(probe_lease_ms))
        return sl_err_set(err, SL_EINVAL, "cannot %s: probe lease out of range", op);
    if (!out)
        return sl_err_set(err, SL_EINVAL, "cannot %s: no output view", op);
    struct sl_rstate_brk b;
    int rc = sl_rstate_brk_acquire(r, endpoint_id, probe_lease_ms, owner, CONS_STORE_BRK_IDLE_MS,
                                   &b, err);
    if (rc == 0)
        brk_view(&b, out);
    return rc;
}

int cons_store_brk_get(sl_redis_t *r,
                       const char *endpoint_id,
                       struct cons_brk_view *out,
                       sl_err_t *err)
{
    static const char op[] = "read breaker";
    if (!valid_str(endpoint_id, SL_ENDPOINT_ID_MAX))
        return sl_err_set(err, SL_EINVAL, "cannot %s: endpoint id empty or over %d bytes", op,
                          SL_ENDPOINT_ID_MAX);
    if (!out)
        return sl_err_set(err, SL_EINVAL, "cannot %s: no output view", op);
    struct sl_rstate_brk b;
    int rc = sl_rstate_brk_get(r, endpoint_id, &b, err);
    if (rc == 0)
        brk_view(&b, out);
    return rc;
}

/* ==== Rate limit ==== */

int cons_store_rate_take(sl_redis_t *r,
                         const char *endpoint_id,
                         int64_t rate,
                         int64_t period_ms,
                         int64_t burst,
                         int64_t want,
                         int64_t *granted,
                         int64_t *wait_ms,
                         sl_err_t *err)
{
    if (!valid_str(endpoint_id, SL_ENDPOINT_ID_MAX) || rate <= 0 || rate > CONS_STORE_MS_MAX ||
        period_ms <= 0 || !valid_ms(period_ms) || burst <= 0 || burst > CONS_STORE_MS_MAX / 1000 ||
        want <= 0 || !granted || !wait_ms)
        return sl_err_set(err, SL_EINVAL, "cannot take rate tokens: invalid arguments");
    return sl_rstate_rate_take(r, endpoint_id, rate, period_ms, burst, want, granted, wait_ms, err);
}
