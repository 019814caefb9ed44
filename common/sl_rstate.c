/*
 * sl_rstate: the Redis state's keys, scripts and the thin functions that run them (contract
 * in sl_rstate.h).
 *
 * Every state change that touches more than one key, or that reads before it writes, is one
 * Lua script, so it is atomic across pods. Every key a script touches is in its KEYS[] (Redis
 * Cluster routes a script by them), and all of one script's keys share a hash tag, so each
 * script runs in one slot. Claiming is therefore two scripts: claim leases the due job ids
 * (it cannot know them in advance), claim_bodies reads the bodies of those ids, declared as
 * keys. Bodies are binary: every argument goes through argv/argvlen, never a %s format.
 *
 * One clock: Redis's. Every script that compares or computes a time reads "now" from TIME
 * inside the script (SL_RCLOCK_LUA_NOW, common/sl_rclock.h):
 *   schedule  due = TIME + delay; callers pass only the delay, never a due time.
 *   claim     due means score <= TIME; the lease (a claimed job's score) ends at TIME + lease.
 *   renew     the lease ends at TIME + lease_ms.
 *   breaker   record opens at TIME (opened_at_ms); acquire compares TIME with opened_at_ms +
 *             cooldown_ms and with probe_until_ms, and sets probe_until_ms = TIME + lease.
 *             Every view returns TIME with it, so a pod turns reopen_at_ms into a distance.
 *   rate      a bucket refills by TIME - ts (ts is the TIME of the last refill).
 *   complete  compares tokens only.
 * Scripts return only integers and strings (RESP2; all values are integral ms counts < 2^53).
 * Numbers written back to Redis go through string.format('%d') so large values never become
 * "1e+17".
 *
 * thread: the caller's (one sl_redis_t per thread); the script structs cache their SHA-1 on
 * first use, which is idempotent.
 */
#include "common/sl_rstate.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/sha.h>

#include "common/sl_digest.h"
#include "common/sl_fmt.h"
#include "common/sl_hex.h"
#include "common/sl_mem.h"
#include "common/sl_rclock.h"
#include "common/sl_record.h"

_Static_assert(SL_RSTATE_KEY_MAX >= 64 + SL_ENDPOINT_ID_MAX + SL_EVENT_ID_MAX,
               "a marker key of the longest endpoint and event ids must fit");
_Static_assert(SL_RSTATE_EPKEY_MAX >= sizeof("sluice:breaker:{}") + SL_ENDPOINT_ID_MAX,
               "a breaker or rate key of the longest endpoint id must fit");

/* ==== Lua scripts ==== */

/*
 * schedule. KEYS: retry zset, job body, lease hash. ARGV: job id, body, delay ms (>= 0),
 * token ("" = new job). A new job whose body key exists is left alone ("existed"); a
 * reschedule needs the caller's lease ("lost" otherwise). Then: body, due = TIME + delay, no
 * lease entry.
 */
static struct sl_redis_script lua_put = {
    .name = "schedule",
    .lua = "local id, tok = ARGV[1], ARGV[4]\n"
           "if tok == '' then\n"
           "  if redis.call('EXISTS', KEYS[2]) == 1 then return 'existed' end\n"
           "elseif redis.call('HGET', KEYS[3], id) ~= tok then\n"
           "  return 'lost'\n"
           "end\n" SL_RCLOCK_LUA_NOW "redis.call('SET', KEYS[2], ARGV[2])\n"
           "redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[3])), id)\n"
           "redis.call('HDEL', KEYS[3], id)\n"
           "return 'ok'\n",
};

/*
 * claim. KEYS: retry zset, lease hash. ARGV: lease ms, max, token. Due jobs (score <= TIME;
 * an expired lease too: its score is the lease expiry), oldest first, each leased to token
 * until TIME + lease ms. Returns their ids; claim_bodies reads the bodies.
 */
static struct sl_redis_script lua_claim = {
    .name = "claim",
    .lua = SL_RCLOCK_LUA_NOW
    "local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), "
    "'LIMIT', 0, ARGV[2])\n"
    "local until_ms = string.format('%d', now + tonumber(ARGV[1]))\n"
    "for i = 1, #ids do\n"
    "  redis.call('ZADD', KEYS[1], until_ms, ids[i])\n"
    "  redis.call('HSET', KEYS[2], ids[i], ARGV[3])\n"
    "end\n"
    "return ids\n",
};

/*
 * claim_bodies. KEYS: retry zset, lease hash, then the body key of each job. ARGV: token,
 * then the job ids (in KEYS order). A job whose lease still holds token gives [id, token,
 * body]; one whose body is gone (an orphan) is removed from the schedule; a job leased to
 * someone else since (its lease ran out) is skipped. Returns the flat array of triples.
 */
static struct sl_redis_script lua_claim_bodies = {
    .name = "claim_bodies",
    .lua = "local out = {}\n"
           "for i = 2, #ARGV do\n"
           "  local id = ARGV[i]\n"
           "  if redis.call('HGET', KEYS[2], id) == ARGV[1] then\n"
           "    local body = redis.call('GET', KEYS[i + 1])\n"
           "    if body then\n"
           "      out[#out + 1] = id\n"
           "      out[#out + 1] = ARGV[1]\n"
           "      out[#out + 1] = body\n"
           "    else\n"
           "      redis.call('ZREM', KEYS[1], id)\n"
           "      redis.call('HDEL', KEYS[2], id)\n"
           "    end\n"
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
    "'probe_owner', 'probe_until_ms', 'open_since_ms')\n"                                          \
    "local st = f[1] or 'closed'\n"                                                                \
    "local failures = tonumber(f[2]) or 0\n"                                                       \
    "local opened = tonumber(f[3]) or 0\n"                                                         \
    "local cooldown = tonumber(f[4]) or 0\n"                                                       \
    "local powner = f[5] or ''\n"                                                                  \
    "local puntil = tonumber(f[6]) or 0\n"                                                         \
    "local since = tonumber(f[7]) or opened\n"                                                     \
    "if st ~= 'closed' and st ~= 'open' and st ~= 'half_open' then\n"                              \
    "  return redis.error_reply('ERR unknown breaker state')\n"                                    \
    "end\n"                                                                                        \
    "local function I(x) return string.format('%d', x) end\n"                                      \
    "local function view(probe)\n"                                                                 \
    "  if st == 'open' then return {1, failures, opened + cooldown, cooldown, probe, now, since} " \
    "end\n"                                                                                        \
    "  if st == 'half_open' then return {2, failures, puntil, cooldown, probe, now, since} end\n"  \
    "  return {0, failures, 0, cooldown, probe, now, 0}\n"                                         \
    "end\n"                                                                                        \
    "local function touch(ttl)\n"                                                                  \
    "  local p = redis.call('PTTL', K)\n"                                                          \
    "  if p ~= -2 and p < ttl then redis.call('PEXPIRE', K, I(ttl)) end\n"                         \
    "end\n"

/*
 * record. KEYS: breaker hash. ARGV: success (1/0), threshold, base, max, owner, idle ttl ms.
 * A breaker opens at TIME. The probe owner's failure is told apart from a late failure of a
 * request sent before the breaker opened by comparing owners: only the probe re-opens and
 * doubles the cooldown; late answers only count. Every write extends the key's idle expiry.
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
    "  redis.call('HDEL', K, 'opened_at_ms', 'probe_owner', 'probe_until_ms', 'open_since_ms')\n"
    "  touch(idle)\n"
    "  return view(0)\n"
    "end\n"
    "failures = failures + 1\n"
    "if st == 'closed' then\n"
    "  if failures >= threshold then\n"
    "    st, opened, cooldown, since = 'open', now, base, now\n"
    "    redis.call('HSET', K, 'state', st, 'failures', I(failures), 'opened_at_ms', "
    "I(now), 'cooldown_ms', I(base), 'open_since_ms', I(now))\n"
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

/*
 * rate_take. KEYS[1] bucket; ARGV: rate, period_ms, burst, want. Tokens are kept in
 * milli-tokens (integers) so refills of a fraction of a token are not lost; the refill is
 * TIME - ts, ts being the TIME of the last refill (a ts ahead of TIME refills nothing until
 * TIME passes it). Returns {granted, wait_ms}. The key expires after twice the time a refill
 * from empty to full takes, in whole periods (at least 1 s): by then the bucket would be
 * full, which is what a missing key reads as.
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

/*
 * api_rate. KEYS[1] the bucket hash. ARGV: rate per second, burst. Returns {1, 0} when a
 * token was taken, {0, ms until one is there} otherwise. The key expires once a full bucket
 * would have refilled, so idle keys cost nothing.
 */
static struct sl_redis_script lua_apirate = {
    .name = "api_rate",
    .lua = SL_RCLOCK_LUA_NOW "local rate = tonumber(ARGV[1])\n"
                             "local burst = tonumber(ARGV[2])\n"
                             "local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')\n"
                             "local tokens = tonumber(b[1]) or burst\n"
                             "local ts = tonumber(b[2]) or now\n"
                             "if now > ts then\n"
                             "  tokens = math.min(burst, tokens + (now - ts) * rate / 1000)\n"
                             "  ts = now\n"
                             "end\n"
                             "local ok, wait = 0, 0\n"
                             "if tokens >= 1 then\n"
                             "  tokens = tokens - 1\n"
                             "  ok = 1\n"
                             "else\n"
                             "  wait = math.ceil((1 - tokens) * 1000 / rate)\n"
                             "end\n"
                             "redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', "
                             "tostring(ts))\n"
                             "redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + "
                             "1000)\n"
                             "return {ok, wait}\n",
};

/*
 * idem_settle. KEYS[1] an Idempotency-Key's state. ARGV: the settling request's lock value,
 * its answer ("" = forget the key), the answer's TTL in seconds. Acts only while the key holds
 * that lock, or nothing (the lock expired and nobody took it): returns 1 then, and when the
 * key already holds this answer (a run again after a lost reply); 0 when another request
 * holds the key, which is left alone.
 */
static struct sl_redis_script lua_idem_settle = {
    .name = "idem_settle",
    .lua = "local v = redis.call('GET', KEYS[1])\n"
           "if v and v ~= ARGV[1] and v ~= ARGV[2] then return 0 end\n"
           "if ARGV[2] == '' then\n"
           "  if v == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
           "  return 1\n"
           "end\n"
           "redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])\n"
           "return 1\n",
};

/*
 * claim_owner. KEYS[1] sluice:owner. ARGV[1] the caller's deployment. Sets the key when it is
 * absent; returns {1, value} when this call set it, {0, value} with the value found.
 */
static struct sl_redis_script lua_claim_owner = {
    .name = "claim_owner",
    .lua = "local v = redis.call('GET', KEYS[1])\n"
           "if v then return {0, v} end\n"
           "redis.call('SET', KEYS[1], ARGV[1])\n"
           "return {1, ARGV[1]}\n",
};

/* ==== Keys ==== */

/* "<prefix>{<tag>}" or, with rest, "<prefix>{<tag>}:<rest>"; the tag is the shard number
 * when tag is NULL. Returns the key's length, or -1 (buf "") when it did not fit. */
static int
key_of(char *buf, size_t cap, const char *prefix, const char *tag, uint32_t shard, const char *rest)
{
    struct sl_fmt f;
    sl_fmt_init(&f, buf, cap);
    sl_fmt_str(&f, prefix);
    sl_fmt_mem(&f, "{", 1);
    if (tag)
        sl_fmt_str(&f, tag);
    else
        sl_fmt_u64(&f, shard);
    if (rest) {
        sl_fmt_mem(&f, "}:", 2);
        sl_fmt_str(&f, rest);
    } else {
        sl_fmt_mem(&f, "}", 1);
    }
    return sl_fmt_end(&f);
}

int sl_rstate_key_retry(char *buf, size_t cap, uint32_t shard)
{
    return key_of(buf, cap, "sluice:retry:", NULL, shard, NULL);
}

int sl_rstate_key_lease(char *buf, size_t cap, uint32_t shard)
{
    return key_of(buf, cap, "sluice:lease:", NULL, shard, NULL);
}

int sl_rstate_key_job(char *buf, size_t cap, uint32_t shard, const char *job_id)
{
    return key_of(buf, cap, "sluice:job:", NULL, shard, job_id);
}

int sl_rstate_key_breaker(char *buf, size_t cap, const char *endpoint_id)
{
    return key_of(buf, cap, "sluice:breaker:", endpoint_id, 0, NULL);
}

int sl_rstate_key_rate(char *buf, size_t cap, const char *endpoint_id)
{
    return key_of(buf, cap, "sluice:rate:", endpoint_id, 0, NULL);
}

int sl_rstate_key_done(char *buf, size_t cap, const char *endpoint_id, const char *event_id)
{
    return key_of(buf, cap, "sluice:done:", endpoint_id, 0, event_id);
}

int sl_rstate_key_apirate(char *buf, size_t cap, const char *api_key_id)
{
    return key_of(buf, cap, "sluice:apirate:", api_key_id, 0, NULL);
}

int sl_rstate_key_idem(char *buf, size_t cap, const char *api_key_id, const char *hash_hex)
{
    return key_of(buf, cap, "sluice:idem:", api_key_id, 0, hash_hex);
}

int sl_rstate_key_owner(char *buf, size_t cap)
{
    struct sl_fmt f;
    sl_fmt_init(&f, buf, cap);
    sl_fmt_str(&f, "sluice:owner");
    return sl_fmt_end(&f);
}

/* The witnesses' tags: the i-th is the first of "w0", "w1", ... whose hash slot is in the
 * i-th 1/SL_RSTATE_WITNESSES of the slots (found within the first few hundred). */
#define WITNESS_SLOTS (16384 / SL_RSTATE_WITNESSES)
static char witness_tags[SL_RSTATE_WITNESSES][8];
static pthread_once_t witness_once = PTHREAD_ONCE_INIT;

static void witness_init(void)
{
    int found = 0;
    for (unsigned n = 0; found < SL_RSTATE_WITNESSES && n < 100000; n++) {
        char t[8];
        struct sl_fmt f;
        sl_fmt_init(&f, t, sizeof(t));
        sl_fmt_mem(&f, "w", 1);
        sl_fmt_u64(&f, n);
        int len = sl_fmt_end(&f);
        int i = sl_redis_key_slot(t, (size_t)len) / WITNESS_SLOTS;
        if (!witness_tags[i][0]) {
            memcpy(witness_tags[i], t, (size_t)len + 1);
            found++;
        }
    }
}

int sl_rstate_key_witness(char *buf, size_t cap, int i)
{
    if (i < 0 || i >= SL_RSTATE_WITNESSES) {
        if (cap)
            buf[0] = '\0';
        return -1;
    }
    pthread_once(&witness_once, witness_init);
    return key_of(buf, cap, "sluice:owner:", witness_tags[i], 0, NULL);
}

/* The three shard keys of a job (job_id "" gives the job key prefix). */
struct job_keys {
    char retry[48]; /* sluice:retry:{s} */
    char job[96];   /* sluice:job:{s}:<id> */
    char lease[48]; /* sluice:lease:{s} */
};

static void job_keys(struct job_keys *k, uint32_t shard, const char *job_id)
{
    (void)sl_rstate_key_retry(k->retry, sizeof(k->retry), shard);
    (void)sl_rstate_key_job(k->job, sizeof(k->job), shard, job_id);
    (void)sl_rstate_key_lease(k->lease, sizeof(k->lease), shard);
}

/* ==== Job ids ==== */

void sl_rstate_job_id(const char *endpoint_id, const char *event_id, char out[SL_RSTATE_ID_LEN + 1])
{
    uint8_t md[SHA_DIGEST_LENGTH];
    const void *parts[] = {endpoint_id, "\n", event_id};
    const size_t lens[] = {strlen(endpoint_id), 1, strlen(event_id)};
    if (sl_digest_parts(SL_SHA1, parts, lens, 3, md) != 0) {
        /* without SHA-1 no job id is possible; a constant id would merge every retry chain */
        (void)fputs("sl_rstate: cannot compute sha-1\n", stderr);
        abort();
    }
    sl_hex_encode(md, SHA_DIGEST_LENGTH, out);
}

uint32_t sl_rstate_shard(const char *job_id, uint32_t nshards)
{
    if (nshards == 0)
        nshards = 1;
    if (!job_id)
        return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = job_id[i];
        if (ch >= '0' && ch <= '9')
            v = v * 16 + (uint32_t)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v = v * 16 + (uint32_t)(ch - 'a' + 10);
        else
            return 0; /* also the NUL of a shorter id: nothing past it is read */
    }
    return v % nshards;
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return 0;
    }
    return 1;
}

int sl_rstate_valid_id(const char *s)
{
    return s && strlen(s) == SL_RSTATE_ID_LEN && is_hex(s, SL_RSTATE_ID_LEN);
}

int sl_rstate_valid_token(const char *s)
{
    return s && strlen(s) == SL_RSTATE_TOKEN_LEN && is_hex(s, SL_RSTATE_TOKEN_LEN);
}

/* ==== Running scripts and commands ==== */

static int valid_ms(int64_t v)
{
    return v >= 0 && v <= SL_RSTATE_MS_MAX;
}

static int valid_shards(uint32_t nshards)
{
    return nshards >= 1 && nshards <= SL_RSTATE_SHARDS_MAX;
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

/* ==== Retry schedule ==== */

int sl_rstate_put(sl_redis_t *r,
                  uint32_t nshards,
                  const char *job_id,
                  const void *body,
                  size_t body_len,
                  int64_t delay_ms,
                  const char *token,
                  sl_err_t *err)
{
    static const char op[] = "schedule job";
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          SL_RSTATE_SHARDS_MAX);
    if (!sl_rstate_valid_id(job_id))
        return sl_err_set(err, SL_EINVAL, "cannot %s: job id is not 40 lowercase hex digits", op);
    if (!body && body_len > 0)
        return sl_err_set(err, SL_EINVAL, "cannot %s: body is missing", op);
    if (delay_ms > SL_RSTATE_MS_MAX || delay_ms < -SL_RSTATE_MS_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: delay out of range", op);
    if (token && !sl_rstate_valid_token(token))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease token is not 32 hex digits", op);
    struct job_keys k;
    job_keys(&k, sl_rstate_shard(job_id, nshards), job_id);
    char delay[24];
    (void)snprintf(delay, sizeof(delay), "%" PRId64, delay_ms > 0 ? delay_ms : 0);
    const char *tok = token ? token : "";
    const char *argv[] = {k.retry, k.job, k.lease, job_id, body ? (const char *)body : "",
                          delay,   tok};
    const size_t argvlen[] = {strlen(k.retry), strlen(k.job), strlen(k.lease), SL_RSTATE_ID_LEN,
                              body_len,        strlen(delay), strlen(tok)};
    redisReply *rep;
    int rc = run_script(r, &lua_put, 3, 7, argv, argvlen, 0, op, &rep, err);
    if (rc != 0)
        return rc;
    if (reply_is(rep, "ok"))
        rc = SL_RSTATE_PUT_OK;
    else if (reply_is(rep, "existed"))
        rc = SL_RSTATE_PUT_EXISTED;
    else if (reply_is(rep, "lost"))
        rc = SL_RSTATE_PUT_LOST;
    else
        rc = fail_reply(err, op, rep);
    freeReplyObject(rep);
    return rc;
}

/* Is one [id, token, body] triple of the claim reply well formed? */
static int claimed_ok(redisReply *const *e)
{
    for (int i = 0; i < 3; i++)
        if (e[i]->type != REDIS_REPLY_STRING)
            return 0;
    return e[0]->len == SL_RSTATE_ID_LEN && is_hex(e[0]->str, SL_RSTATE_ID_LEN) &&
           e[1]->len == SL_RSTATE_TOKEN_LEN && is_hex(e[1]->str, SL_RSTATE_TOKEN_LEN);
}

/* Run claim_bodies for the ids just leased (ids: the claim script's reply), keys k of their
 * shard (k->job is its job key prefix). */
static int claim_bodies(sl_redis_t *r,
                        const struct job_keys *k,
                        const char *token,
                        const redisReply *ids,
                        const char *op,
                        redisReply **repp,
                        sl_err_t *err)
{
    size_t n = ids->elements, plen = strlen(k->job);
    size_t argc = 2 + n + 1 + n;
    const char **argv = sl_xmalloc(argc * sizeof(*argv));
    size_t *argvlen = sl_xmalloc(argc * sizeof(*argvlen));
    char *keys = sl_xmalloc(n * (plen + SL_RSTATE_ID_LEN));
    argv[0] = k->retry;
    argvlen[0] = strlen(k->retry);
    argv[1] = k->lease;
    argvlen[1] = strlen(k->lease);
    argv[2 + n] = token;
    argvlen[2 + n] = SL_RSTATE_TOKEN_LEN;
    for (size_t i = 0; i < n; i++) {
        char *key = keys + i * (plen + SL_RSTATE_ID_LEN);
        memcpy(key, k->job, plen);
        memcpy(key + plen, ids->element[i]->str, SL_RSTATE_ID_LEN);
        argv[2 + i] = key;
        argvlen[2 + i] = plen + SL_RSTATE_ID_LEN;
        argv[3 + n + i] = ids->element[i]->str;
        argvlen[3 + n + i] = SL_RSTATE_ID_LEN;
    }
    int rc =
        run_script(r, &lua_claim_bodies, (int)(2 + n), (int)argc, argv, argvlen, 0, op, repp, err);
    free(keys);
    free(argvlen);
    free(argv);
    return rc;
}

int sl_rstate_claim(sl_redis_t *r,
                    uint32_t shard,
                    int64_t lease_ms,
                    int max,
                    const char *token,
                    redisReply **out,
                    sl_err_t *err)
{
    static const char op[] = "claim jobs";
    if (!out)
        return sl_err_set(err, SL_EINVAL, "cannot %s: no output array", op);
    *out = NULL;
    if (shard >= SL_RSTATE_SHARDS_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard out of range", op);
    if (lease_ms < 1 || !valid_ms(lease_ms))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease out of range", op);
    if (max < 0 || max > SL_RSTATE_CLAIM_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: max out of range 0..%d", op,
                          SL_RSTATE_CLAIM_MAX);
    if (!sl_rstate_valid_token(token))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease token is not 32 hex digits", op);
    if (max == 0)
        return 0;
    struct job_keys k;
    job_keys(&k, shard, "");
    char lease[24], smax[16];
    (void)snprintf(lease, sizeof(lease), "%" PRId64, lease_ms);
    (void)snprintf(smax, sizeof(smax), "%d", max);
    const char *argv[] = {k.retry, k.lease, lease, smax, token};
    redisReply *ids;
    int rc = run_script(r, &lua_claim, 2, 5, argv, NULL, 0, op, &ids, err);
    if (rc != 0)
        return rc;
    /* From here on the jobs are leased in Redis; if a reply is unusable, or the bodies
     * cannot be read, they come back when the lease expires. */
    int ok = ids->type == REDIS_REPLY_ARRAY && ids->elements <= (size_t)max;
    for (size_t i = 0; ok && i < ids->elements; i++)
        ok = ids->element[i]->type == REDIS_REPLY_STRING &&
             ids->element[i]->len == SL_RSTATE_ID_LEN && sl_rstate_valid_id(ids->element[i]->str);
    if (!ok) {
        rc = fail_reply(err, op, ids);
        freeReplyObject(ids);
        return rc;
    }
    redisReply *rep = NULL;
    rc = ids->elements ? claim_bodies(r, &k, token, ids, op, &rep, err) : 0;
    freeReplyObject(ids);
    if (rc != 0 || !rep)
        return rc;
    ok = rep->type == REDIS_REPLY_ARRAY && rep->elements % 3 == 0 &&
         rep->elements / 3 <= (size_t)max;
    for (size_t i = 0; ok && i < rep->elements; i += 3)
        ok = claimed_ok(rep->element + i);
    if (!ok) {
        rc = fail_reply(err, op, rep);
        freeReplyObject(rep);
        return rc;
    }
    *out = rep;
    return 0;
}

int sl_rstate_complete(
    sl_redis_t *r, uint32_t nshards, const char *job_id, const char *token, sl_err_t *err)
{
    static const char op[] = "complete job";
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          SL_RSTATE_SHARDS_MAX);
    if (!sl_rstate_valid_id(job_id))
        return sl_err_set(err, SL_EINVAL, "cannot %s: job id is not 40 lowercase hex digits", op);
    if (!sl_rstate_valid_token(token))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease token is not 32 hex digits", op);
    struct job_keys k;
    job_keys(&k, sl_rstate_shard(job_id, nshards), job_id);
    const char *argv[] = {k.retry, k.job, k.lease, job_id, token};
    redisReply *rep;
    int rc = run_script(r, &lua_complete, 3, 5, argv, NULL, 0, op, &rep, err);
    if (rc != 0)
        return rc;
    if (reply_is(rep, "lost"))
        rc = 1;
    else if (!reply_is(rep, "ok"))
        rc = fail_reply(err, op, rep);
    freeReplyObject(rep);
    return rc;
}

int sl_rstate_renew(sl_redis_t *r,
                    uint32_t shard,
                    int64_t lease_ms,
                    size_t n,
                    const char *const *job_ids,
                    const char *const *tokens,
                    unsigned char *kept,
                    sl_err_t *err)
{
    static const char op[] = "renew leases";
    if (shard >= SL_RSTATE_SHARDS_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard out of range", op);
    if (lease_ms < 1 || !valid_ms(lease_ms))
        return sl_err_set(err, SL_EINVAL, "cannot %s: lease out of range", op);
    if (n < 1 || n > SL_RSTATE_RENEW_MAX || !job_ids || !tokens || !kept)
        return sl_err_set(err, SL_EINVAL, "cannot %s: need 1..%d jobs", op, SL_RSTATE_RENEW_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!sl_rstate_valid_id(job_ids[i]) || !sl_rstate_valid_token(tokens[i]))
            return sl_err_set(err, SL_EINVAL, "cannot %s: job %zu has a malformed id or token", op,
                              i);
    }
    struct job_keys k;
    job_keys(&k, shard, "");
    char lease[24];
    (void)snprintf(lease, sizeof(lease), "%" PRId64, lease_ms);
    const char *argv[3 + 2 * SL_RSTATE_RENEW_MAX];
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

/* ==== Pipelines ==== */

/* Append "<prefix><n>\r\n" (a RESP array or bulk length) to b. */
static int resp_len(struct sl_buf *b, char prefix, size_t n)
{
    char tmp[24]; /* prefix, 20 digits, CR LF */
    struct sl_fmt f;
    sl_fmt_init(&f, tmp, sizeof(tmp));
    sl_fmt_mem(&f, &prefix, 1);
    sl_fmt_u64(&f, n);
    sl_fmt_mem(&f, "\r\n", 2);
    int len = sl_fmt_end(&f); /* 23 bytes at most: always fits */
    return len < 0 ? SL_ETOOBIG : sl_buf_append(b, tmp, (size_t)len);
}

/*
 * Encode commands [from, to) as RESP into b, for one redisAppendFormattedCommand: hiredis's
 * redisAppendCommandArgv formats every argument with sdscatfmt and grows the output
 * buffer per command, about 3,000 instructions per command (3 commands per delivery:
 * bench/README.md, "Consumer CPU"). Returns 0, or SL_ETOOBIG past b's maximum.
 */
static int pipe_encode(const struct sl_rstate_pipe *p, size_t from, size_t to, struct sl_buf *b)
{
    char keybuf[SL_RSTATE_KEY_MAX];
    const char *argv[8];
    size_t argvlen[8];
    for (size_t i = from; i < to; i++) {
        int argc = p->build(p->ctx, i, keybuf, argv, argvlen);
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
                      const struct sl_rstate_pipe *p,
                      size_t from,
                      size_t to,
                      const char *op,
                      int *lost,
                      sl_err_t *err)
{
    char keybuf[SL_RSTATE_KEY_MAX];
    const char *argv[8];
    size_t argvlen[8];
    size_t sent = 0;
    int rc = 0;
    *lost = 0;
    redisContext *c = sl_redis_ctx(r);
    struct sl_buf b;
    /* every argument is a key (< SL_RSTATE_KEY_MAX) or a short constant; 8 arguments at most */
    sl_buf_init(&b, (to - from) * (8 * (SL_RSTATE_KEY_MAX + 16) + 16) + 1);
    if (c && pipe_encode(p, from, to, &b) == 0) {
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
            int argc = p->build(p->ctx, i, keybuf, argv, argvlen);
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
        if (rc == 0 && p->check(p->ctx, from + i, rep) != 0)
            rc = fail_reply(err, op, rep);
        freeReplyObject(rep);
    }
    return rc;
}

int sl_rstate_pipe_run(
    sl_redis_t *r, const struct sl_rstate_pipe *p, size_t ncmds, const char *op, sl_err_t *err)
{
    for (size_t from = 0; from < ncmds; from += SL_RSTATE_PIPE_MAX) {
        size_t to = ncmds - from > SL_RSTATE_PIPE_MAX ? from + SL_RSTATE_PIPE_MAX : ncmds;
        int lost;
        int rc = pipe_chunk(r, p, from, to, op, &lost, err);
        if (rc != 0 && lost) /* every command here is idempotent: reconnect, send again */
            rc = pipe_chunk(r, p, from, to, op, &lost, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ==== Job lookups ==== */

struct exist_ctx {
    uint32_t nshards;           /* retry shard count */
    const char *const *job_ids; /* borrowed */
    unsigned char *present;     /* OUT, per job */
};

static int exist_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    const struct exist_ctx *x = ctx;
    const char *job_id = x->job_ids[i];
    argv[0] = "EXISTS";
    argvlen[0] = 6;
    argv[1] = keybuf;
    argvlen[1] = (size_t)sl_rstate_key_job(keybuf, SL_RSTATE_KEY_MAX,
                                           sl_rstate_shard(job_id, x->nshards), job_id);
    return 2;
}

static int exist_check(void *ctx, size_t i, const redisReply *rep)
{
    struct exist_ctx *x = ctx;
    if (rep->type != REDIS_REPLY_INTEGER || (rep->integer != 0 && rep->integer != 1))
        return -1;
    x->present[i] = rep->integer == 1;
    return 0;
}

int sl_rstate_jobs_exist(sl_redis_t *r,
                         uint32_t nshards,
                         size_t n,
                         const char *const *job_ids,
                         unsigned char *present,
                         sl_err_t *err)
{
    static const char op[] = "look up job";
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          SL_RSTATE_SHARDS_MAX);
    if (n > 0 && (!job_ids || !present))
        return sl_err_set(err, SL_EINVAL, "cannot %s: id arrays missing", op);
    for (size_t i = 0; i < n; i++) {
        if (!sl_rstate_valid_id(job_ids[i]))
            return sl_err_set(err, SL_EINVAL, "cannot %s: job id is not 40 lowercase hex digits",
                              op);
    }
    struct exist_ctx x = {.nshards = nshards, .job_ids = job_ids, .present = present};
    struct sl_rstate_pipe p = {.build = exist_build, .check = exist_check, .ctx = &x};
    return sl_rstate_pipe_run(r, &p, n, op, err);
}

/* ==== Counts ==== */

struct counts_ctx {
    size_t per;      /* commands per shard: 2 (ZCARD, HLEN) or 3 (+ ZCOUNT due) */
    const char *now; /* Redis's clock, ms as text (per 3) */
    int64_t *vals;   /* per commands per shard */
};

static int counts_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    const struct counts_ctx *c = ctx;
    uint32_t shard = (uint32_t)(i / c->per);
    size_t kind = i % c->per; /* 0 ZCARD retry, 1 HLEN lease, 2 ZCOUNT retry -inf now */
    int n = kind == 1 ? sl_rstate_key_lease(keybuf, SL_RSTATE_KEY_MAX, shard)
                      : sl_rstate_key_retry(keybuf, SL_RSTATE_KEY_MAX, shard);
    argv[0] = kind == 0 ? "ZCARD" : kind == 1 ? "HLEN" : "ZCOUNT";
    argvlen[0] = strlen(argv[0]);
    argv[1] = keybuf;
    argvlen[1] = (size_t)n;
    if (kind != 2)
        return 2;
    argv[2] = "-inf";
    argvlen[2] = 4;
    argv[3] = c->now;
    argvlen[3] = strlen(c->now);
    return 4;
}

static int counts_check(void *ctx, size_t i, const redisReply *rep)
{
    struct counts_ctx *c = ctx;
    if (rep->type != REDIS_REPLY_INTEGER || rep->integer < 0)
        return -1;
    c->vals[i] = rep->integer;
    return 0;
}

int sl_rstate_counts(
    sl_redis_t *r, uint32_t nshards, int with_due, struct sl_rstate_counts *out, sl_err_t *err)
{
    static const char op[] = "count jobs";
    memset(out, 0, sizeof(*out));
    if (!valid_shards(nshards))
        return sl_err_set(err, SL_EINVAL, "cannot %s: shard count out of range 1..%d", op,
                          SL_RSTATE_SHARDS_MAX);
    char now[24] = "";
    if (with_due) {
        /* "due" is judged on the clock the claims use, Redis's, not this host's */
        int64_t now_ms = 0;
        int rc = sl_rclock_now_ms(r, &now_ms, err);
        if (rc != 0)
            return rc;
        (void)snprintf(now, sizeof(now), "%" PRId64, now_ms);
    }
    struct counts_ctx c = {.per = with_due ? 3 : 2, .now = now};
    c.vals = sl_xcalloc((size_t)nshards * c.per, sizeof(int64_t));
    struct sl_rstate_pipe p = {.build = counts_build, .check = counts_check, .ctx = &c};
    int rc = sl_rstate_pipe_run(r, &p, (size_t)nshards * c.per, op, err);
    for (size_t i = 0; rc == 0 && i < (size_t)nshards * c.per; i++) {
        int64_t *sum = i % c.per == 0 ? &out->scheduled : i % c.per == 1 ? &out->leased : &out->due;
        *sum += c.vals[i];
    }
    free(c.vals);
    return rc;
}

/* ==== Circuit breakers ==== */

/* Parse the breakers' {state, failures, reopen_at, cooldown, probe, now} reply. */
static int parse_brk(const redisReply *rep, struct sl_rstate_brk *v)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 7)
        return -1;
    for (size_t i = 0; i < 7; i++)
        if (rep->element[i]->type != REDIS_REPLY_INTEGER)
            return -1;
    long long st = rep->element[0]->integer, probe = rep->element[4]->integer;
    if (st < 0 || st > 2 || (probe != 0 && probe != 1))
        return -1;
    v->state = (int)st;
    v->failures = rep->element[1]->integer;
    v->reopen_at_ms = rep->element[2]->integer;
    v->cooldown_ms = rep->element[3]->integer;
    v->probe = (int)probe;
    v->now_ms = rep->element[5]->integer;
    v->open_since_ms = rep->element[6]->integer;
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
                   struct sl_rstate_brk *out,
                   sl_err_t *err)
{
    char key[SL_RSTATE_EPKEY_MAX];
    if (!endpoint_id || sl_rstate_key_breaker(key, sizeof(key), endpoint_id) < 0)
        return sl_err_set(err, SL_EINVAL, "endpoint id too long for a breaker key");
    const char *argv[8];
    argv[0] = key;
    for (int i = 0; i < argc; i++)
        argv[1 + i] = args[i];
    redisReply *rep;
    int rc = run_script(r, s, 1, argc + 1, argv, NULL, idempotent, op, &rep, err);
    if (rc != 0)
        return rc;
    struct sl_rstate_brk v;
    if (parse_brk(rep, &v) != 0)
        rc = fail_reply(err, op, rep);
    else if (out)
        *out = v;
    freeReplyObject(rep);
    return rc;
}

int sl_rstate_brk_record(sl_redis_t *r,
                         const char *endpoint_id,
                         int success,
                         int64_t threshold,
                         int64_t cooldown_base_ms,
                         int64_t cooldown_max_ms,
                         const char *owner,
                         int64_t idle_ms,
                         struct sl_rstate_brk *out,
                         sl_err_t *err)
{
    char thr[24], base[24], cmax[24], idle[24];
    (void)snprintf(thr, sizeof(thr), "%" PRId64, threshold);
    (void)snprintf(base, sizeof(base), "%" PRId64, cooldown_base_ms);
    (void)snprintf(cmax, sizeof(cmax), "%" PRId64, cooldown_max_ms);
    (void)snprintf(idle, sizeof(idle), "%" PRId64, idle_ms);
    const char *args[] = {success ? "1" : "0", thr, base, cmax, owner, idle};
    return brk_run(r, &lua_brk_record, endpoint_id, 6, args, 0, "record breaker result", out, err);
}

int sl_rstate_brk_acquire(sl_redis_t *r,
                          const char *endpoint_id,
                          int64_t probe_lease_ms,
                          const char *owner,
                          int64_t margin_ms,
                          struct sl_rstate_brk *out,
                          sl_err_t *err)
{
    char lease[24], margin[24];
    (void)snprintf(lease, sizeof(lease), "%" PRId64, probe_lease_ms);
    (void)snprintf(margin, sizeof(margin), "%" PRId64, margin_ms);
    const char *args[] = {lease, owner, margin};
    return brk_run(r, &lua_brk_acquire, endpoint_id, 3, args, 0, "acquire breaker probe", out, err);
}

int sl_rstate_brk_get(sl_redis_t *r,
                      const char *endpoint_id,
                      struct sl_rstate_brk *out,
                      sl_err_t *err)
{
    return brk_run(r, &lua_brk_get, endpoint_id, 0, NULL, 1, "read breaker", out, err);
}

/* ==== Rate buckets ==== */

int sl_rstate_rate_take(sl_redis_t *r,
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
    char key[SL_RSTATE_EPKEY_MAX];
    if (!endpoint_id || sl_rstate_key_rate(key, sizeof(key), endpoint_id) < 0)
        return sl_err_set(err, SL_EINVAL, "cannot %s: invalid arguments", op);
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

int64_t sl_rstate_apirate_take(
    sl_redis_t *r, const char *api_key_id, int64_t rate_per_s, int64_t burst, sl_err_t *err)
{
    char k[64], rate[24], sburst[24];
    if (sl_rstate_key_apirate(k, sizeof(k), api_key_id) < 0)
        return sl_err_set(err, SL_EINVAL, "cannot check the rate limit: key id too long");
    (void)snprintf(rate, sizeof(rate), "%lld", (long long)rate_per_s);
    (void)snprintf(sburst, sizeof(sburst), "%lld", (long long)burst);
    const char *argv[] = {k, rate, sburst};
    redisReply *rep = sl_redis_eval(r, &lua_apirate, 1, 3, argv, NULL, err);
    if (!rep)
        return err && err->code < 0 ? err->code : SL_EREDIS;
    int64_t wait = 0;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER && rep->element[0]->integer == 0)
        wait = rep->element[1]->integer > 0 ? rep->element[1]->integer : 1;
    else if (rep->type == REDIS_REPLY_ERROR)
        wait = sl_err_set(err, SL_EREDIS, "rate limit script failed: %s", rep->str);
    freeReplyObject(rep);
    return wait;
}

int sl_rstate_idem_settle(sl_redis_t *r,
                          const char *key,
                          const char *lock,
                          const void *answer,
                          size_t answer_len,
                          int64_t ttl_s,
                          sl_err_t *err)
{
    char ttl[24];
    (void)snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_s);
    const char *argv[] = {key, lock, answer ? (const char *)answer : "", ttl};
    size_t lens[] = {strlen(key), strlen(lock), answer ? answer_len : 0, strlen(ttl)};
    redisReply *rep;
    int rc = run_script(r, &lua_idem_settle, 1, 4, argv, lens, 1, "settle an idempotency key", &rep,
                        err);
    if (rc != 0)
        return rc;
    if (rep->type == REDIS_REPLY_INTEGER && (rep->integer == 0 || rep->integer == 1))
        rc = (int)rep->integer;
    else
        rc = fail_reply(err, "settle an idempotency key", rep);
    freeReplyObject(rep);
    return rc;
}

int sl_rstate_claim_owner(
    sl_redis_t *r, const char *owner, char *found, size_t found_cap, sl_err_t *err)
{
    static const char op[] = "bind the redis database to this deployment";
    size_t olen = owner ? strlen(owner) : 0;
    if (olen == 0 || olen > SL_RSTATE_OWNER_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: owner empty or over %d bytes", op,
                          SL_RSTATE_OWNER_MAX);
    if (!found || found_cap == 0)
        return sl_err_set(err, SL_EINVAL, "cannot %s: no output buffer", op);
    found[0] = '\0';
    char key[32];
    (void)sl_rstate_key_owner(key, sizeof(key));
    const char *argv[] = {key, owner};
    redisReply *rep;
    int rc = run_script(r, &lua_claim_owner, 1, 2, argv, NULL, 1, op, &rep, err);
    if (rc != 0)
        return rc;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER &&
        rep->element[1]->type == REDIS_REPLY_STRING) {
        size_t n = rep->element[1]->len < found_cap - 1 ? rep->element[1]->len : found_cap - 1;
        memcpy(found, rep->element[1]->str, n);
        found[n] = '\0';
        rc = rep->element[0]->integer == 1;
    } else {
        rc = fail_reply(err, op, rep);
    }
    freeReplyObject(rep);
    return rc;
}

struct witness_ctx {
    const char *owner;
    size_t owner_len;
    int overwrite;
    int restored; /* OUT: SET NX that set */
    int failed;   /* OUT: error replies */
};

static int witness_build(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen)
{
    const struct witness_ctx *x = ctx;
    argv[0] = "SET";
    argvlen[0] = 3;
    argv[1] = keybuf;
    argvlen[1] = (size_t)sl_rstate_key_witness(keybuf, SL_RSTATE_KEY_MAX, (int)i);
    argv[2] = x->owner;
    argvlen[2] = x->owner_len;
    if (x->overwrite)
        return 3;
    argv[3] = "NX";
    argvlen[3] = 2;
    return 4;
}

static int witness_check(void *ctx, size_t i, const redisReply *rep)
{
    (void)i;
    struct witness_ctx *x = ctx;
    if (rep->type == REDIS_REPLY_ERROR) { /* that master down: the others still count */
        x->failed++;
        return 0;
    }
    if (rep->type == REDIS_REPLY_NIL) /* NX: in place */
        return 0;
    if (!reply_is(rep, "OK"))
        return -1;
    x->restored += !x->overwrite;
    return 0;
}

int sl_rstate_witnesses(
    sl_redis_t *r, const char *owner, int overwrite, int *restored, int *failed, sl_err_t *err)
{
    static const char op[] = "write the redis database's binding witnesses";
    size_t olen = owner ? strlen(owner) : 0;
    if (olen == 0 || olen > SL_RSTATE_OWNER_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot %s: owner empty or over %d bytes", op,
                          SL_RSTATE_OWNER_MAX);
    struct witness_ctx x = {.owner = owner, .owner_len = olen, .overwrite = overwrite != 0};
    struct sl_rstate_pipe p = {.build = witness_build, .check = witness_check, .ctx = &x};
    int rc = sl_rstate_pipe_run(r, &p, SL_RSTATE_WITNESSES, op, err);
    if (restored)
        *restored = x.restored;
    if (failed)
        *failed = x.failed;
    return rc;
}
