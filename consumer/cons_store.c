/*
 * cons_store: retry schedule, leases, delivered markers, circuit breakers and rate buckets in
 * Redis (see cons_store.h for the key layout and the contract).
 *
 * Design: every state change that touches more than one key, or that reads before it
 * writes, is one Lua script, so it is atomic across pods. Each script gets its keys in
 * KEYS[]; the claim script also derives job body keys from KEYS[3], the job key prefix of
 * the same shard ("sluice:job:{s}:"), because it cannot know the due job ids in advance;
 * those keys share the {s} hash tag, so the script stays in one Cluster slot. Bodies are
 * binary: every argument goes through argv/argvlen, never a %s format.
 *
 * One clock: Redis's. Pods' clocks differ, so no time that Redis compares comes from a pod.
 * Every script that compares or computes a time reads "now" from TIME inside the script
 * (SL_RCLOCK_LUA_NOW, common/sl_rclock.h), and every time stored in Redis is on that clock:
 *   schedule  due = TIME + delay; the pod passes only the delay (its backoff, or how far off
 *             its breaker view says the cooldown ends), never a due time (common/sl_jobkey).
 *   claim     due means score <= TIME; the lease (the score of a claimed job) ends at
 *             TIME + lease_ms.
 *   renew     the lease ends at TIME + lease_ms.
 *   breaker   record opens at TIME (opened_at_ms); acquire compares TIME with opened_at_ms +
 *             cooldown_ms and with probe_until_ms, and sets probe_until_ms = TIME + lease.
 *             Every view returns TIME with it, so a pod turns reopen_at_ms into a distance
 *             (reopen_at_ms - now_ms) and never compares Redis's times with its own clock.
 *   rate      the bucket refills by TIME - ts (ts is the TIME of the last refill).
 *   markers   SET ... EX: Redis expires them on its own clock; the ts_ms a marker remembers
 *             is an outcome timestamp for the history, never compared.
 *   complete  compares tokens only.
 * A pod's own clock still times what is its own: its copy of a lease (it renews early and
 * sends only with room to spare, starting the count before the call, so it errs early),
 * outcome timestamps, and signature timestamps.
 *
 * Memory: breaker and rate keys expire when idle (PEXPIRE, extended by the scripts that
 * write them; cons_store.h says why each TTL loses nothing that matters); markers carry the
 * dedup window; job bodies and schedule entries never expire (they are the retries).
 *
 * Scripts return only integers and strings (RESP2; Lua numbers would be truncated, and all
 * values here are integral ms counts < 2^53). Numbers written back to Redis go through
 * string.format('%d') so large values never become "1e+17".
 *
 * thread: the caller's (one sl_redis_t per thread); the script structs below cache their
 * SHA1 on first use, which is idempotent.
 */
#include "consumer/cons_store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "common/sl_breaker.h"
#include "common/sl_jobkey.h"
#include "common/sl_mem.h"
#include "common/sl_rclock.h"
#include "common/sl_record.h"

/* Longest key we build: "sluice:done:{" + endpoint + "}:" + event id. */
#define KEY_MAX (64 + SL_ENDPOINT_ID_MAX + SL_EVENT_ID_MAX)

/* ==== Lua scripts ==== */

/*
 * claim. KEYS: retry zset, lease hash, job key prefix. ARGV: lease ms, max, token. Due jobs
 * (score <= TIME; an expired lease too: its score is the lease expiry) in score order, each
 * leased until TIME + lease ms; orphans without a body are removed. Returns a flat array
 * [id, token, body, ...].
 */
static struct sl_redis_script lua_claim = {
    .name = "claim",
    .lua = SL_RCLOCK_LUA_NOW
    "local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), "
    "'LIMIT', 0, ARGV[2])\n"
    "local until_ms = string.format('%d', now + tonumber(ARGV[1]))\n"
    "local out = {}\n"
    "for i = 1, #ids do\n"
    "  local id = ids[i]\n"
    "  local body = redis.call('GET', KEYS[3] .. id)\n"
    "  if body then\n"
    "    redis.call('ZADD', KEYS[1], until_ms, id)\n"
    "    redis.call('HSET', KEYS[2], id, ARGV[3])\n"
    "    out[#out + 1] = id\n"
    "    out[#out + 1] = ARGV[3]\n"
    "    out[#out + 1] = body\n"
    "  else\n"
    "    redis.call('ZREM', KEYS[1], id)\n"
    "    redis.call('HDEL', KEYS[2], id)\n"
    "  end\n"
    "end\n"
    "return out\n",
};

/* complete. KEYS: retry zset, job body, lease hash. ARGV: job id, token. */
static struct sl_redis_script lua_complete = {
    .name = "complete",
    .lua = "if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 'lost' end\n"
           "redis.call('ZREM', KEYS[1], ARGV[1])\n"
           "redis.call('DEL', KEYS[2])\n"
           "redis.call('HDEL', KEYS[3], ARGV[1])\n"
           "return 'ok'\n",
};

/*
 * renew. KEYS: retry zset, lease hash. ARGV: lease ms, then (job id, token) pairs. Only a
 * lease that still holds the caller's token, on a job still in the schedule, is extended, to
 * TIME + lease ms; one 1 (renewed) or 0 (lost) per pair.
 */
static struct sl_redis_script lua_renew = {
    .name = "renew",
    .lua = SL_RCLOCK_LUA_NOW "local until_ms = string.format('%d', now + tonumber(ARGV[1]))\n"
                             "local out = {}\n"
                             "for i = 2, #ARGV - 1, 2 do\n"
                             "  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] and\n"
                             "     redis.call('ZSCORE', KEYS[1], ARGV[i]) then\n"
                             "    redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i])\n"
                             "    out[#out + 1] = 1\n"
                             "  else\n"
                             "    out[#out + 1] = 0\n"
                             "  end\n"
                             "end\n"
                             "return out\n",
};

/*
 * Breaker prelude shared by the three breaker scripts: Redis's clock (now), the hash read
 * once (absent = closed, no failures), the reply {state code, failures, reopen_at, cooldown,
 * probe, now} (reopen_at is the cooldown end when open and the probe lease end when
 * half_open, both on Redis's clock), and touch(ttl): extend the key's idle expiry to ttl ms
 * (never shorten it; a key without one gets one).
 */
#define BRK_PRELUDE                                                                                \
    SL_RCLOCK_LUA_NOW                                                                              \
    "local K = KEYS[1]\n"                                                                          \
    "local f = redis.call('HMGET', K, 'state', 'failures', 'opened_at_ms', 'cooldown_ms', "        \
    "'probe_owner', 'probe_until_ms')\n"                                                           \
    "local st = f[1] or 'closed'\n"                                                                \
    "local failures = tonumber(f[2]) or 0\n"                                                       \
    "local opened = tonumber(f[3]) or 0\n"                                                         \
    "local cooldown = tonumber(f[4]) or 0\n"                                                       \
    "local powner = f[5] or ''\n"                                                                  \
    "local puntil = tonumber(f[6]) or 0\n"                                                         \
    "if st ~= 'closed' and st ~= 'open' and st ~= 'half_open' then\n"                              \
    "  return redis.error_reply('ERR unknown breaker state')\n"                                    \
    "end\n"                                                                                        \
    "local function I(x) return string.format('%d', x) end\n"                                      \
    "local function view(probe)\n"                                                                 \
    "  if st == 'open' then return {1, failures, opened + cooldown, cooldown, probe, now} end\n"   \
    "  if st == 'half_open' then return {2, failures, puntil, cooldown, probe, now} end\n"         \
    "  return {0, failures, 0, cooldown, probe, now}\n"                                            \
    "end\n"                                                                                        \
    "local function touch(ttl)\n"                                                                  \
    "  local p = redis.call('PTTL', K)\n"                                                          \
    "  if p ~= -2 and p < ttl then redis.call('PEXPIRE', K, I(ttl)) end\n"                         \
    "end\n"

/*
 * record. KEYS: breaker hash. ARGV: success (1/0), threshold, base, max, owner, idle ttl ms.
 * Semantics in cons_store.h; a breaker opens at TIME. The probe owner's failure is told
 * apart from a late failure of a request sent before the breaker opened by comparing owners:
 * only the probe re-opens and doubles the cooldown; late answers only count. Every write
 * extends the key's idle expiry.
 */
static struct sl_redis_script lua_brk_record = {
    .name = "breaker_record",
    .lua = BRK_PRELUDE
    "local threshold = tonumber(ARGV[2])\n"
    "local base, cmax, owner = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]\n"
    "local idle = tonumber(ARGV[6])\n"
    "if ARGV[1] == '1' then\n"
    "  if st == 'closed' and failures == 0 then return view(0) end\n"
    "  st, failures, cooldown = 'closed', 0, base\n"
    "  redis.call('HSET', K, 'state', st, 'failures', '0', 'cooldown_ms', I(base))\n"
    "  redis.call('HDEL', K, 'opened_at_ms', 'probe_owner', 'probe_until_ms')\n"
    "  touch(idle)\n"
    "  return view(0)\n"
    "end\n"
    "failures = failures + 1\n"
    "if st == 'closed' then\n"
    "  if failures >= threshold then\n"
    "    st, opened, cooldown = 'open', now, base\n"
    "    redis.call('HSET', K, 'state', st, 'failures', I(failures), 'opened_at_ms', "
    "I(now), 'cooldown_ms', I(base))\n"
    "  else\n"
    "    redis.call('HSET', K, 'state', st, 'failures', I(failures))\n"
    "  end\n"
    "elseif st == 'half_open' and powner == owner then\n"
    "  if cooldown < base then cooldown = base end\n"
    "  cooldown = math.min(cooldown * 2, cmax)\n"
    "  st, opened = 'open', now\n"
    "  redis.call('HSET', K, 'state', st, 'failures', I(failures), 'opened_at_ms', "
    "I(now), 'cooldown_ms', I(cooldown))\n"
    "  redis.call('HDEL', K, 'probe_owner', 'probe_until_ms')\n"
    "else\n"
    "  redis.call('HSET', K, 'failures', I(failures))\n"
    "end\n"
    "touch(idle)\n"
    "return view(0)\n",
};

/*
 * acquire. KEYS: breaker hash. ARGV: probe lease ms, owner, idle margin ms. The probe goes
 * to the first caller after the cooldown (or after the previous probe's lease ran out), both
 * judged by TIME; a live lease, even the caller's own, answers probe=0. Taking the probe
 * extends the key's idle expiry to the longer of the cooldown and the probe lease, plus the
 * margin.
 */
static struct sl_redis_script lua_brk_acquire = {
    .name = "breaker_acquire",
    .lua = BRK_PRELUDE "if st == 'closed' then return view(0) end\n"
                       "if st == 'open' and now < opened + cooldown then return view(0) end\n"
                       "if st == 'half_open' and now < puntil then return view(0) end\n"
                       "local plen = tonumber(ARGV[1])\n"
                       "st, powner, puntil = 'half_open', ARGV[2], now + plen\n"
                       "redis.call('HSET', K, 'state', st, 'probe_owner', powner, "
                       "'probe_until_ms', I(puntil))\n"
                       "touch(math.max(cooldown, plen) + tonumber(ARGV[3]))\n"
                       "return view(1)\n",
};

/* get. KEYS: breaker hash. Read-only, so safe to retry after a lost connection. */
static struct sl_redis_script lua_brk_get = {
    .name = "breaker_get",
    .lua = BRK_PRELUDE "return view(0)\n",
};

/* ==== Helpers ==== */

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return 0;
    }
    return 1;
}

static int valid_job_id(const char *id)
{
    return id && strlen(id) == CONS_JOBID_LEN && is_hex(id, CONS_JOBID_LEN);
}

static int valid_token(const char *tok)
{
    return tok && strlen(tok) == CONS_TOKEN_LEN && is_hex(tok, CONS_TOKEN_LEN);
}

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
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 0x0f];
    }
    out[CONS_TOKEN_LEN] = '\0';
    return 0;
}

/* Is rep the string (bulk or status) lit? */
static int reply_is(const redisReply *rep, const char *lit)
{
    size_t n = strlen(lit);
    return (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS) && rep->len == n &&
           memcmp(rep->str, lit, n) == 0;
}

/* Report a failed call of operation op; inner carries the sl_redis detail. Returns the
 * (always negative) code. */
static int fail_inner(sl_err_t *err, const char *op, const sl_err_t *inner)
{
    int code = inner->code < 0 ? inner->code : SL_EREDIS;
    (void)sl_err_set(err, code, "could not %s: %s", op, inner->msg);
    return code;
}

/* Report an error reply or a reply of the wrong shape. Returns SL_EREDIS. */
static int fail_reply(sl_err_t *err, const char *op, const redisReply *rep)
{
    if (rep && rep->type == REDIS_REPLY_ERROR)
        (void)sl_err_set(err, SL_EREDIS, "could not %s: redis error: %.120s", op, rep->str);
    else
        (void)sl_err_set(err, SL_EREDIS, "could not %s: unexpected reply from redis", op);
    return SL_EREDIS;
}

/*
 * Run a script: 0 with *repp set (never an error reply), or a negative code with err
 * filled. idempotent scripts are run again once when the connection was lost
 * (sl_redis_eval itself never retries a script).
 */
static int run_script(sl_redis_t *r,
                      struct sl_redis_script *s,
                      int nkeys,
                      int argc,
                      const char **argv,
                      const size_t *argvlen,
                      int idempotent,
                      const char *op,
                      redisReply **repp,
                      sl_err_t *err)
{
    sl_err_t inner = {0};
    *repp = NULL;
    redisReply *rep = sl_redis_eval(r, s, nkeys, argc, argv, argvlen, &inner);
    if (!rep && idempotent && inner.code == SL_EREDIS) {
        sl_err_clear(&inner);
        rep = sl_redis_eval(r, s, nkeys, argc, argv, argvlen, &inner);
    }
    if (!rep)
        return fail_inner(err, op, &inner);
    if (rep->type == REDIS_REPLY_ERROR) {
        int rc = fail_reply(err, op, rep);
        freeReplyObject(rep);
        return rc;
    }
    *repp = rep;
    return 0;
}

/* Run one idempotent command (sl_redis_cmd reconnects and retries it once on a lost
 * connection). Same result rules as run_script. */
static int run_cmd(
    sl_redis_t *r, int argc, const char **argv, const char *op, redisReply **repp, sl_err_t *err)
{
    sl_err_t inner = {0};
    *repp = NULL;
    redisReply *rep = sl_redis_cmd(r, 1, argc, argv, NULL, &inner);
    if (!rep)
        return fail_inner(err, op, &inner);
    if (rep->type == REDIS_REPLY_ERROR) {
        int rc = fail_reply(err, op, rep);
        freeReplyObject(rep);
        return rc;
    }
    *repp = rep;
    return 0;
}

/* The three shard keys of a job. */
struct job_keys {
    char retry[48]; /* sluice:retry:{s} */
    char job[96];   /* sluice:job:{s}:<id> */
    char lease[48]; /* sluice:lease:{s} */
};

static void job_keys(struct job_keys *k, uint32_t shard, const char *job_id)
{
    (void)snprintf(k->retry, sizeof(k->retry), SL_JOBKEY_RETRY, shard);
    (void)snprintf(k->job, sizeof(k->job), SL_JOBKEY_JOB, shard, job_id);
    (void)snprintf(k->lease, sizeof(k->lease), SL_JOBKEY_LEASE, shard);
}

/* ==== Job ids ==== */

/* The layout is common/sl_jobkey's, shared with `sluicectl retries rebuild`. */
void cons_store_job_id(const char *endpoint_id, const char *event_id, char out[41])
{
    sl_jobkey_id(endpoint_id, event_id, out);
}

uint32_t cons_store_shard(const char *job_id, uint32_t nshards)
{
    return sl_jobkey_shard(job_id, nshards);
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
    static const char op[] = "schedule job";
    if (existed)
        *existed = 0;
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          CONS_STORE_SHARDS_MAX);
    if (!valid_job_id(job_id))
        return sl_err_set(err, SL_EINVAL, "cannot %s: job id is not 40 lowercase hex digits", op);
    if (!body && body_len > 0)
        return sl_err_set(err, SL_EINVAL, "cannot %s: body is missing", op);
    if (body_len > CONS_STORE_BODY_MAX)
        return sl_err_set(err, SL_ETOOBIG, "cannot %s: body exceeds %zu bytes", op,
                          CONS_STORE_BODY_MAX);
    if (delay_ms > CONS_STORE_MS_MAX || delay_ms < -CONS_STORE_MS_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: delay out of range", op);
    if (lease_token && !valid_token(lease_token))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease token is not 32 hex digits", op);
    /* the script is common/sl_jobkey's, shared with `sluicectl retries rebuild` */
    int rc = sl_jobkey_put(r, nshards, job_id, body, body_len, delay_ms, lease_token, err);
    if (rc == SL_JOBKEY_PUT_EXISTED) {
        if (existed)
            *existed = 1;
        return 0;
    }
    if (rc == SL_JOBKEY_PUT_LOST)
        return sl_err_set(err, SL_ESTATE, "cannot reschedule job: lease lost to another claim");
    return rc; /* SL_JOBKEY_PUT_OK (0) or an error */
}

void cons_store_claimed_free(struct cons_claimed *c, int n)
{
    if (!c)
        return;
    for (int i = 0; i < n; i++)
        free(c[i].body);
    free(c);
}

/* Copy one [id, token, body] triple of the claim reply into c. */
static int parse_claimed(struct cons_claimed *c, uint32_t shard, redisReply *const *e)
{
    for (int i = 0; i < 3; i++)
        if (e[i]->type != REDIS_REPLY_STRING)
            return -1;
    if (e[0]->len != CONS_JOBID_LEN || !is_hex(e[0]->str, CONS_JOBID_LEN) ||
        e[1]->len != CONS_TOKEN_LEN || !is_hex(e[1]->str, CONS_TOKEN_LEN))
        return -1;
    memcpy(c->job_id, e[0]->str, CONS_JOBID_LEN);
    c->job_id[CONS_JOBID_LEN] = '\0';
    memcpy(c->token, e[1]->str, CONS_TOKEN_LEN);
    c->token[CONS_TOKEN_LEN] = '\0';
    c->shard = shard;
    c->body_len = e[2]->len;
    c->body = sl_xmalloc(e[2]->len + 1);
    if (e[2]->len)
        memcpy(c->body, e[2]->str, e[2]->len);
    c->body[e[2]->len] = '\0';
    return 0;
}

int cons_store_claim(sl_redis_t *r,
                     uint32_t shard,
                     int64_t lease_ms,
                     int max,
                     struct cons_claimed **out,
                     sl_err_t *err)
{
    static const char op[] = "claim jobs";
    struct cons_claimed *c = NULL;
    redisReply *rep = NULL;
    int n = 0, rc;
    if (!out)
        return sl_err_set(err, SL_EINVAL, "cannot %s: no output array", op);
    *out = NULL;
    if (shard >= CONS_STORE_SHARDS_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard out of range", op);
    if (lease_ms < 1 || !valid_ms(lease_ms))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease out of range", op);
    if (max < 0 || max > CONS_STORE_CLAIM_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: max out of range 0..%d", op,
                          CONS_STORE_CLAIM_MAX);
    if (max == 0)
        return 0;

    char token[CONS_TOKEN_LEN + 1];
    if (new_token(token) != 0)
        return sl_err_set(err, SL_ECRYPTO, "could not %s: no random bytes for a lease token", op);
    struct job_keys k;
    job_keys(&k, shard, "");
    char lease[24], smax[16];
    (void)snprintf(lease, sizeof(lease), "%" PRId64, lease_ms);
    (void)snprintf(smax, sizeof(smax), "%d", max);
    /* k.job is the prefix "sluice:job:{s}:" here (empty id). */
    const char *argv[] = {k.retry, k.lease, k.job, lease, smax, token};
    rc = run_script(r, &lua_claim, 3, 6, argv, NULL, 0, op, &rep, err);
    if (rc != 0)
        return rc;
    /* From here on the jobs are leased in Redis; if the reply is unusable they come back
     * when the lease expires. */
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements % 3 != 0 ||
        rep->elements / 3 > (size_t)max) {
        rc = fail_reply(err, op, rep);
        goto out;
    }
    n = (int)(rep->elements / 3);
    if (n > 0)
        c = sl_xcalloc((size_t)n, sizeof(*c));
    for (int i = 0; i < n; i++) {
        if (parse_claimed(&c[i], shard, rep->element + (size_t)3 * (size_t)i) != 0) {
            cons_store_claimed_free(c, i);
            c = NULL;
            rc = fail_reply(err, op, rep);
            goto out;
        }
    }
    *out = c;
    c = NULL;
    rc = n;
out:
    freeReplyObject(rep);
    return rc;
}

int cons_store_complete(
    sl_redis_t *r, uint32_t nshards, const char *job_id, const char *token, sl_err_t *err)
{
    static const char op[] = "complete job";
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          CONS_STORE_SHARDS_MAX);
    if (!valid_job_id(job_id))
        return sl_err_set(err, SL_EINVAL, "cannot %s: job id is not 40 lowercase hex digits", op);
    if (!valid_token(token))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease token is not 32 hex digits", op);
    struct job_keys k;
    job_keys(&k, cons_store_shard(job_id, nshards), job_id);
    const char *argv[] = {k.retry, k.job, k.lease, job_id, token};
    redisReply *rep;
    int rc = run_script(r, &lua_complete, 3, 5, argv, NULL, 0, op, &rep, err);
    if (rc != 0)
        return rc;
    if (reply_is(rep, "lost"))
        rc = sl_err_set(err, SL_ESTATE, "cannot %s: lease lost to another claim", op);
    else if (!reply_is(rep, "ok"))
        rc = fail_reply(err, op, rep);
    freeReplyObject(rep);
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
    static const char op[] = "renew leases";
    if (shard >= CONS_STORE_SHARDS_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard out of range", op);
    if (lease_ms < 1 || !valid_ms(lease_ms))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease out of range", op);
    if (n < 1 || n > CONS_STORE_RENEW_MAX || !job_ids || !tokens || !kept)
        return sl_err_set(err, SL_EINVAL, "cannot %s: need 1..%d jobs", op, CONS_STORE_RENEW_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!valid_job_id(job_ids[i]) || !valid_token(tokens[i]))
            return sl_err_set(err, SL_EINVAL, "cannot %s: job %zu has a malformed id or token", op,
                              i);
    }
    struct job_keys k;
    job_keys(&k, shard, "");
    char lease[24];
    (void)snprintf(lease, sizeof(lease), "%" PRId64, lease_ms);
    const char *argv[3 + 2 * CONS_STORE_RENEW_MAX];
    argv[0] = k.retry;
    argv[1] = k.lease;
    argv[2] = lease;
    for (size_t i = 0; i < n; i++) {
        argv[3 + 2 * i] = job_ids[i];
        argv[4 + 2 * i] = tokens[i];
    }
    redisReply *rep = NULL;
    int rc = run_script(r, &lua_renew, 2, (int)(3 + 2 * n), argv, NULL, 0, op, &rep, err);
    if (rc != 0)
        return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n) {
        rc = fail_reply(err, op, rep);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_INTEGER || (e->integer != 0 && e->integer != 1)) {
            rc = fail_reply(err, op, rep);
            goto out;
        }
        kept[i] = (unsigned char)e->integer;
    }
out:
    freeReplyObject(rep);
    return rc;
}

int cons_store_job_exists(sl_redis_t *r, uint32_t nshards, const char *job_id, sl_err_t *err)
{
    static const char op[] = "look up job";
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          CONS_STORE_SHARDS_MAX);
    if (!valid_job_id(job_id))
        return sl_err_set(err, SL_EINVAL, "cannot %s: job id is not 40 lowercase hex digits", op);
    struct job_keys k;
    job_keys(&k, cons_store_shard(job_id, nshards), job_id);
    const char *argv[] = {"EXISTS", k.job};
    redisReply *rep;
    int rc = run_cmd(r, 2, argv, op, &rep, err);
    if (rc != 0)
        return rc;
    if (rep->type == REDIS_REPLY_INTEGER && (rep->integer == 0 || rep->integer == 1))
        rc = (int)rep->integer;
    else
        rc = fail_reply(err, op, rep);
    freeReplyObject(rep);
    return rc;
}

/* ==== Pipelining ==== */

/*
 * A pipelined batch of ncmds independent, idempotent commands. build() writes command i's
 * argv (key text into keybuf, KEY_MAX bytes; redisAppendCommandArgv copies it at once, so
 * the buffer is reused); check() validates reply i and stores its result (it may be called
 * again for the same i after a retry, so it must overwrite, not accumulate).
 */
struct pipe_ops {
    int (*build)(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen);
    int (*check)(void *ctx, size_t i, const redisReply *rep);
    void *ctx;
};

/* Append "<prefix><n>\r\n" (a RESP array or bulk length) to b. */
static int resp_len(struct sl_buf *b, char prefix, size_t n)
{
    char tmp[24];
    char *p = tmp + sizeof(tmp);
    *--p = '\n';
    *--p = '\r';
    do {
        *--p = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    *--p = prefix;
    return sl_buf_append(b, p, (size_t)(tmp + sizeof(tmp) - p));
}

/*
 * Encode commands [from, to) as RESP into b, for one redisAppendFormattedCommand: hiredis's
 * redisAppendCommandArgv formats every argument with sdscatfmt and grows the output
 * buffer per command, about 3,000 instructions per command (3 commands per delivery:
 * bench/README.md, "Consumer CPU"). Returns 0, or SL_ETOOBIG past b's maximum.
 */
static int pipe_encode(const struct pipe_ops *ops, size_t from, size_t to, struct sl_buf *b)
{
    char keybuf[KEY_MAX];
    const char *argv[8];
    size_t argvlen[8];
    for (size_t i = from; i < to; i++) {
        int argc = ops->build(ops->ctx, i, keybuf, argv, argvlen);
        if (resp_len(b, '*', (size_t)argc) != 0)
            return SL_ETOOBIG;
        for (int k = 0; k < argc; k++) {
            if (resp_len(b, '$', argvlen[k]) != 0 || sl_buf_append(b, argv[k], argvlen[k]) != 0 ||
                sl_buf_append(b, "\r\n", 2) != 0)
                return SL_ETOOBIG;
        }
    }
    return 0;
}

/* Send commands [from, to) and read their replies. Returns 0 or a negative code with err
 * filled; *lost = 1 when the failure was a lost connection (the chunk may be sent again). */
static int pipe_chunk(sl_redis_t *r,
                      const struct pipe_ops *ops,
                      size_t from,
                      size_t to,
                      const char *op,
                      int *lost,
                      sl_err_t *err)
{
    char keybuf[KEY_MAX];
    const char *argv[8];
    size_t argvlen[8];
    size_t sent = 0;
    int rc = 0;
    *lost = 0;
    redisContext *c = sl_redis_ctx(r);
    struct sl_buf b;
    /* every argument is a key (< KEY_MAX) or a short constant; 8 arguments at most */
    sl_buf_init(&b, (to - from) * (8 * (KEY_MAX + 16) + 16) + 1);
    if (c && pipe_encode(ops, from, to, &b) == 0) {
        /* one append for the chunk; hiredis writes it on the first read */
        if (redisAppendFormattedCommand(c, (const char *)b.data, b.len) != REDIS_OK) {
            rc = sl_err_set(err, SL_EREDIS, "could not %s: could not send to redis", op);
            *lost = 1;
        } else {
            sent = to - from;
        }
    } else {
        /* not connected (sl_redis_append reconnects) or an argument too long to pre-format */
        for (size_t i = from; i < to; i++) {
            int argc = ops->build(ops->ctx, i, keybuf, argv, argvlen);
            if (sl_redis_append(r, argc, argv, argvlen) != 0) {
                rc = sl_err_set(err, SL_EREDIS, "could not %s: could not send to redis", op);
                *lost = 1;
                break;
            }
            sent++;
        }
    }
    sl_buf_fini(&b);
    /* Read every reply that was sent, even after a bad one, so the connection stays in step
     * with its commands. A lost connection drops the context and with it the rest. */
    for (size_t i = 0; i < sent; i++) {
        sl_err_t inner = {0};
        redisReply *rep = sl_redis_get_reply(r, &inner);
        if (!rep) {
            *lost = 1;
            return fail_inner(err, op, &inner);
        }
        if (rc == 0 && ops->check(ops->ctx, from + i, rep) != 0)
            rc = fail_reply(err, op, rep);
        freeReplyObject(rep);
    }
    return rc;
}

static int
pipe_run(sl_redis_t *r, const struct pipe_ops *ops, size_t ncmds, const char *op, sl_err_t *err)
{
    for (size_t from = 0; from < ncmds; from += CONS_STORE_PIPE_MAX) {
        size_t to = ncmds - from > CONS_STORE_PIPE_MAX ? from + CONS_STORE_PIPE_MAX : ncmds;
        int lost;
        int rc = pipe_chunk(r, ops, from, to, op, &lost, err);
        if (rc != 0 && lost) /* every command here is idempotent: reconnect, send again */
            rc = pipe_chunk(r, ops, from, to, op, &lost, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ==== Counts ==== */

struct counts_ctx {
    int64_t *vals; /* 2 per shard: ZCARD, HLEN */
};

static int counts_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    (void)ctx;
    uint32_t shard = (uint32_t)(i / 2);
    int zset = (i % 2) == 0;
    (void)snprintf(keybuf, KEY_MAX, zset ? SL_JOBKEY_RETRY : SL_JOBKEY_LEASE, shard);
    argv[0] = zset ? "ZCARD" : "HLEN";
    argvlen[0] = strlen(argv[0]);
    argv[1] = keybuf;
    argvlen[1] = strlen(keybuf);
    return 2;
}

static int counts_check(void *ctx, size_t i, const redisReply *rep)
{
    struct counts_ctx *c = ctx;
    if (rep->type != REDIS_REPLY_INTEGER || rep->integer < 0)
        return -1;
    c->vals[i] = rep->integer;
    return 0;
}

int cons_store_counts(
    sl_redis_t *r, uint32_t nshards, int64_t *scheduled, int64_t *leased, sl_err_t *err)
{
    static const char op[] = "count jobs";
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          CONS_STORE_SHARDS_MAX);
    struct counts_ctx c = {.vals = sl_xcalloc((size_t)nshards * 2, sizeof(int64_t))};
    struct pipe_ops ops = {.build = counts_build, .check = counts_check, .ctx = &c};
    int rc = pipe_run(r, &ops, (size_t)nshards * 2, op, err);
    if (rc == 0) {
        int64_t s = 0, l = 0;
        for (size_t i = 0; i < (size_t)nshards; i++) {
            s += c.vals[2 * i];
            l += c.vals[2 * i + 1];
        }
        if (scheduled)
            *scheduled = s;
        if (leased)
            *leased = l;
    }
    free(c.vals);
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

/* "sluice:done:{ep}:<event id>" into keybuf; returns its length. */
static size_t done_key(const struct done_ctx *d, size_t i, char *keybuf)
{
    int n = snprintf(keybuf, KEY_MAX, "sluice:done:{%s}:%s", d->endpoint_ids[i], d->event_ids[i]);
    return (size_t)n; /* lengths were checked against KEY_MAX before any I/O */
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

static int mark_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    struct done_ctx *d = ctx;
    argv[0] = "SET";
    argvlen[0] = 3;
    argv[1] = keybuf;
    argvlen[1] = done_key(d, i, keybuf);
    argv[2] = "1";
    argvlen[2] = 1;
    const struct cons_done_info *in = d->info_in ? &d->info_in[i] : NULL;
    if (in && in->attempt > 0) {
        int n = snprintf(d->val, sizeof(d->val), "1 %" PRIu32 " %" PRId64 " %" PRIu32 " %" PRIu64,
                         in->attempt, in->ts_ms, in->status, in->lat_us);
        if (n > 0 && (size_t)n < sizeof(d->val)) {
            argv[2] = d->val;
            argvlen[2] = (size_t)n;
        }
    }
    argv[3] = "EX";
    argvlen[3] = 2;
    argv[4] = d->ttl;
    argvlen[4] = strlen(d->ttl);
    return 5;
}

static int mark_check(void *ctx, size_t i, const redisReply *rep)
{
    (void)ctx;
    (void)i;
    return reply_is(rep, "OK") ? 0 : -1;
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
    struct job_keys jk;
    job_keys(&jk, cons_store_shard(job_id, d->nshards), job_id);
    argv[0] = "EXISTS";
    argvlen[0] = 6;
    argv[1] = keybuf;
    argvlen[1] = (size_t)snprintf(keybuf, KEY_MAX, "%s", jk.job);
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
        if (job_ids[i] && !valid_job_id(job_ids[i]))
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
    struct pipe_ops ops = {.build = intake_build, .check = intake_check_reply, .ctx = &d};
    rc = pipe_run(r, &ops, n + m, op, err);
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
    struct done_ctx d = {.endpoint_ids = eps, .event_ids = ids};
    char key[KEY_MAX];
    (void)done_key(&d, 0, key);
    char ttl[24];
    (void)snprintf(ttl, sizeof(ttl), "%" PRId64, ttl_s);
    const char *argv[] = {"SET", key, "d", "EX", ttl, "NX"};
    redisReply *rep;
    rc = run_cmd(r, 6, argv, op, &rep, err);
    if (rc != 0)
        return rc;
    /* OK when set, nil when a marker was there already: both fine */
    if (rep->type != REDIS_REPLY_NIL && !reply_is(rep, "OK"))
        rc = fail_reply(err, op, rep);
    freeReplyObject(rep);
    return rc;
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
    struct pipe_ops ops = {.build = mark_build, .check = mark_check, .ctx = &d};
    return pipe_run(r, &ops, n, op, err);
}

/* ==== Circuit breaker ==== */

/* Parse the breakers' {state, failures, reopen_at, cooldown, probe, now} reply. */
static int parse_view(const redisReply *rep, struct cons_brk_view *v)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 6)
        return -1;
    for (size_t i = 0; i < 6; i++)
        if (rep->element[i]->type != REDIS_REPLY_INTEGER)
            return -1;
    long long st = rep->element[0]->integer, probe = rep->element[4]->integer;
    if (st < CONS_BRK_CLOSED || st > CONS_BRK_HALF_OPEN || (probe != 0 && probe != 1))
        return -1;
    v->state = (enum cons_brk_state)st;
    v->failures = rep->element[1]->integer;
    v->reopen_at_ms = rep->element[2]->integer;
    v->cooldown_ms = rep->element[3]->integer;
    v->probe = (int)probe;
    v->now_ms = rep->element[5]->integer;
    return 0;
}

/* Run a breaker script with its one key and fill out (may be NULL). */
static int brk_run(sl_redis_t *r,
                   struct sl_redis_script *s,
                   const char *endpoint_id,
                   int argc,
                   const char **args,
                   int idempotent,
                   const char *op,
                   struct cons_brk_view *out,
                   sl_err_t *err)
{
    char key[SL_BREAKER_KEY_MAX];
    if (sl_breaker_key(key, sizeof(key), endpoint_id) != 0)
        return sl_err_set(err, SL_EINVAL, "endpoint id too long for a breaker key");
    const char *argv[8];
    argv[0] = key;
    for (int i = 0; i < argc; i++)
        argv[1 + i] = args[i];
    redisReply *rep;
    int rc = run_script(r, s, 1, argc + 1, argv, NULL, idempotent, op, &rep, err);
    if (rc != 0)
        return rc;
    struct cons_brk_view v;
    if (parse_view(rep, &v) != 0)
        rc = fail_reply(err, op, rep);
    else if (out)
        *out = v;
    freeReplyObject(rep);
    return rc;
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
    char thr[24], base[24], cmax[24], idle[24];
    (void)snprintf(thr, sizeof(thr), "%" PRId64, threshold);
    (void)snprintf(base, sizeof(base), "%" PRId64, cooldown_base_ms);
    (void)snprintf(cmax, sizeof(cmax), "%" PRId64, cooldown_max_ms);
    /* the longest cooldown this breaker can reach, plus the margin (cons_store.h) */
    (void)snprintf(idle, sizeof(idle), "%" PRId64, cooldown_max_ms + CONS_STORE_BRK_IDLE_MS);
    const char *args[] = {success ? "1" : "0", thr, base, cmax, owner, idle};
    return brk_run(r, &lua_brk_record, endpoint_id, 6, args, 0, op, out, err);
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
    char lease[24], margin[24];
    (void)snprintf(lease, sizeof(lease), "%" PRId64, probe_lease_ms);
    (void)snprintf(margin, sizeof(margin), "%" PRId64, CONS_STORE_BRK_IDLE_MS);
    const char *args[] = {lease, owner, margin};
    return brk_run(r, &lua_brk_acquire, endpoint_id, 3, args, 0, op, out, err);
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
    return brk_run(r, &lua_brk_get, endpoint_id, 0, NULL, 1, op, out, err);
}

/* ==== Rate limit ==== */

/*
 * KEYS[1] bucket; ARGV: rate, period_ms, burst, want. Tokens are kept in milli-tokens
 * (integers) so refills of a fraction of a token are not lost; the refill is TIME - ts, ts
 * being the TIME of the last refill (a ts ahead of TIME, written before this rule, refills
 * nothing until TIME passes it). Returns {granted, wait_ms}. The key expires after twice the
 * time a refill from empty to full takes, in whole periods (at least 1 s): by then the bucket
 * would be full, which is what a missing key reads as.
 */
static struct sl_redis_script lua_rate_take = {
    .name = "rate_take",
    .lua = SL_RCLOCK_LUA_NOW
    "local rate = tonumber(ARGV[1]); local period = tonumber(ARGV[2])\n"
    "local burst = tonumber(ARGV[3]) * 1000; local want = tonumber(ARGV[4])\n"
    "local h = redis.call('HMGET', KEYS[1], 'mt', 'ts')\n"
    "local mt = tonumber(h[1]); local ts = tonumber(h[2])\n"
    "if mt == nil or ts == nil then mt = burst; ts = now end\n"
    "if now > ts then\n"
    "  mt = math.min(burst, mt + math.floor((now - ts) * rate * 1000 / period)); ts = now\n"
    "end\n"
    "local g = math.min(want, math.floor(mt / 1000))\n"
    "mt = mt - g * 1000\n"
    "redis.call('HSET', KEYS[1], 'mt', string.format('%d', mt), 'ts', string.format('%d', ts))\n"
    "redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(1000, "
    "2 * period * math.ceil(burst / 1000 / rate))))\n"
    "local wait = 0\n"
    "if g < want then wait = math.ceil((1000 - (mt % 1000)) * period / (rate * 1000)) end\n"
    "return {g, wait}\n",
};

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
    static const char op[] = "take rate tokens";
    if (!valid_str(endpoint_id, SL_ENDPOINT_ID_MAX) || rate <= 0 || rate > CONS_STORE_MS_MAX ||
        period_ms <= 0 || !valid_ms(period_ms) || burst <= 0 || burst > CONS_STORE_MS_MAX / 1000 ||
        want <= 0 || !granted || !wait_ms)
        return sl_err_set(err, SL_EINVAL, "cannot %s: invalid arguments", op);
    char key[SL_ENDPOINT_ID_MAX + 32];
    (void)snprintf(key, sizeof(key), "sluice:rate:{%s}", endpoint_id); /* length checked above */
    char a[4][24];
    (void)snprintf(a[0], sizeof(a[0]), "%" PRId64, rate);
    (void)snprintf(a[1], sizeof(a[1]), "%" PRId64, period_ms);
    (void)snprintf(a[2], sizeof(a[2]), "%" PRId64, burst);
    (void)snprintf(a[3], sizeof(a[3]), "%" PRId64, want);
    const char *argv[] = {key, a[0], a[1], a[2], a[3]};
    redisReply *rep;
    int rc = run_script(r, &lua_rate_take, 1, 5, argv, NULL, 0, op, &rep, err);
    if (rc != 0)
        return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER ||
        rep->element[1]->type != REDIS_REPLY_INTEGER) {
        rc = fail_reply(err, op, rep);
    } else {
        *granted = rep->element[0]->integer;
        *wait_ms = rep->element[1]->integer;
    }
    freeReplyObject(rep);
    return rc;
}
