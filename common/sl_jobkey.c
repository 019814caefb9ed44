/*
 * sl_jobkey: retry job ids, shards and the one script that puts a job into the schedule (see
 * sl_jobkey.h). The script reads its "now" from Redis's TIME (common/sl_rclock.h) and takes
 * only a delay from the caller, so a due time is on the same clock as the claims that compare
 * it; numbers go back to Redis through string.format('%d') so they never become "1e+12".
 */
#include "common/sl_jobkey.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/sha.h>

#include "common/sl_rclock.h"

/* ms; largest delay accepted (sums with Redis's clock stay exact in Lua's doubles) */
#define DELAY_MAX (INT64_C(1) << 50)
#define KEY_MAX   96 /* bytes of the longest key, "sluice:job:{4294967295}:" + 40 + NUL */

/*
 * KEYS: retry zset, job body, lease hash. ARGV: job id, body, delay ms (>= 0), token ("" =
 * new job). A new job whose body key exists is left alone ("existed"); a reschedule needs the
 * caller's lease ("lost" otherwise). Then: body, due = TIME + delay, no lease entry.
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

void sl_jobkey_id(const char *endpoint_id, const char *event_id, char out[SL_JOBKEY_ID_LEN + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) == 1 &&
             EVP_DigestUpdate(ctx, endpoint_id, strlen(endpoint_id)) == 1 &&
             EVP_DigestUpdate(ctx, "\n", 1) == 1 &&
             EVP_DigestUpdate(ctx, event_id, strlen(event_id)) == 1 &&
             EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == SHA_DIGEST_LENGTH;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        /* without SHA-1 no job id is possible; a constant id would merge every retry chain */
        (void)fputs("sl_jobkey: cannot compute sha-1\n", stderr);
        abort();
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < SHA_DIGEST_LENGTH; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 0x0f];
    }
    out[SL_JOBKEY_ID_LEN] = '\0';
}

uint32_t sl_jobkey_shard(const char *job_id, uint32_t nshards)
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

static int valid_id(const char *id)
{
    if (!id || strlen(id) != SL_JOBKEY_ID_LEN)
        return 0;
    for (size_t i = 0; i < SL_JOBKEY_ID_LEN; i++) {
        char ch = id[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return 0;
    }
    return 1;
}

/* Is rep the string (bulk or status) lit? */
static int reply_is(const redisReply *rep, const char *lit)
{
    size_t n = strlen(lit);
    return (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS) && rep->len == n &&
           memcmp(rep->str, lit, n) == 0;
}

int sl_jobkey_put(sl_redis_t *r,
                  uint32_t nshards,
                  const char *job_id,
                  const void *body,
                  size_t body_len,
                  int64_t delay_ms,
                  const char *token,
                  sl_err_t *err)
{
    if (!valid_id(job_id))
        return sl_err_set(err, SL_EINVAL, "cannot schedule job: job id is not 40 lowercase hex");
    if (!body && body_len > 0)
        return sl_err_set(err, SL_EINVAL, "cannot schedule job: body is missing");
    if (delay_ms > DELAY_MAX || delay_ms < -DELAY_MAX)
        return sl_err_set(err, SL_EINVAL, "cannot schedule job: delay out of range");
    if (token && !token[0])
        return sl_err_set(err, SL_EINVAL, "cannot schedule job: empty lease token");
    uint32_t shard = sl_jobkey_shard(job_id, nshards);
    char kz[KEY_MAX], kj[KEY_MAX], kl[KEY_MAX], delay[24];
    (void)snprintf(kz, sizeof(kz), SL_JOBKEY_RETRY, shard);
    (void)snprintf(kj, sizeof(kj), SL_JOBKEY_JOB, shard, job_id);
    (void)snprintf(kl, sizeof(kl), SL_JOBKEY_LEASE, shard);
    (void)snprintf(delay, sizeof(delay), "%" PRId64, delay_ms > 0 ? delay_ms : 0);
    const char *tok = token ? token : "";
    const char *argv[] = {kz, kj, kl, job_id, body ? (const char *)body : "", delay, tok};
    const size_t argvlen[] = {strlen(kz), strlen(kj),    strlen(kl), SL_JOBKEY_ID_LEN,
                              body_len,   strlen(delay), strlen(tok)};
    sl_err_t inner = {0};
    redisReply *rep = sl_redis_eval(r, &lua_put, 3, 7, argv, argvlen, &inner);
    if (!rep)
        return sl_err_set(err, inner.code < 0 ? inner.code : SL_EREDIS,
                          "could not schedule job: %s", inner.msg);
    int rc;
    if (reply_is(rep, "ok"))
        rc = SL_JOBKEY_PUT_OK;
    else if (reply_is(rep, "existed"))
        rc = SL_JOBKEY_PUT_EXISTED;
    else if (reply_is(rep, "lost"))
        rc = SL_JOBKEY_PUT_LOST;
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = sl_err_set(err, SL_EREDIS, "could not schedule job: redis error: %.120s", rep->str);
    else
        rc = sl_err_set(err, SL_EREDIS, "could not schedule job: unexpected reply from redis");
    freeReplyObject(rep);
    return rc;
}
