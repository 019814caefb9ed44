/*
 * sl_rstate: the Redis state contract that the consumers (which write it) and sluicectl and
 * sluice-api (which count, rebuild and read it) must agree on, in one place. It owns:
 *   - the key formats, one function per key kind (below); no other file spells a key;
 *   - every Lua script that changes this state (schedule, claim, renew, complete, the three
 *     breaker scripts, the rate bucket, sluice-api's key bucket and its idempotency
 *     settle);
 *   - thin functions that build a script's KEYS/ARGV, run it and parse its reply; the
 *     pipelined counts and job lookups; the pipeline runner (with its reconnect rule) that
 *     the consumer's marker reads and writes use too.
 * Policy stays with the callers: consumer/cons_store.c (lease tokens, caps, breaker idle
 * margins, marker values), ctl/ctl_analysis.c and ctl/ctl_retries.c (health counts, rebuild),
 * common/sl_breaker.c and api/ (readers, the API's buckets and idempotency state).
 *
 * Layout (hash tag per shard {s} or per endpoint {ep}; every key a script touches shares the
 * tag of its KEYS[], so each script stays in one Redis Cluster slot):
 *   sluice:retry:{s}        ZSET  member = job id, score = due time (unix ms on Redis's clock,
 *                                 common/sl_rclock.h). A claimed job stays in the set with
 *                                 score = lease expiry, so a crashed consumer's jobs come back.
 *   sluice:job:{s}:<jobid>  STRING the job body: a delivery record (schemas/delivery.v1) whose
 *                                 "attempt" field counts attempts already spent.
 *   sluice:lease:{s}        HASH  job id -> lease token of the current claim.
 *   sluice:breaker:{ep}     HASH  state (closed|open|half_open), failures, opened_at_ms,
 *                                 cooldown_ms, probe_owner, probe_until_ms, open_since_ms
 *                                 (opened from closed; kept by failed probes); no key = closed
 *                                 with no failures (common/sl_breaker.h reads it).
 *   sluice:rate:{ep}        HASH  token bucket: mt (milli-tokens), ts (last refill).
 *   sluice:done:{ep}:<id>   STRING final-state marker, TTL = dedup window: "1[ <attempt> <ts_ms>
 *                                 <status> <lat_us>]" delivered, "d" dead-lettered.
 *   sluice:apirate:{key}    HASH  sluice-api key bucket: tokens, ts.
 *   sluice:idem:{key}:<h>   STRING sluice-api Idempotency-Key state (api/api_events.c).
 *   sluice:owner            STRING the deployment this database's state belongs to:
 *                                 "<Kafka cluster id>/<endpoints topic>", set by the first
 *                                 consumer to start (sl_rstate_claim_owner).
 *   sluice:owner:{<tag>}    STRING the binding's witnesses, SL_RSTATE_WITNESSES of them, the
 *                                 i-th tag hashing into the i-th 1/SL_RSTATE_WITNESSES of
 *                                 the cluster's hash slots: every master of a Redis Cluster
 *                                 holds some, so a master that lost its data is seen
 *                                 (sl_rstate_witnesses), not only the one holding
 *                                 sluice:owner. Value: the deployment, as sluice:owner.
 * Job id = hex SHA-1 of "<endpoint id>\n<event id>"; shard = its first four hex digits modulo
 * the shard count. Lease tokens are 32 lowercase hex digits, chosen by the caller.
 *
 * Connection loss: read-only and idempotent calls (counts, jobs_exist, pipelines, breaker get)
 * reconnect and retry once; the other scripts are not retried (their effect is unknown) and
 * fail with SL_EREDIS. Errors: SL_EINVAL (checked before any I/O), SL_EREDIS (connection,
 * error reply, or a reply of an unexpected shape), with messages "cannot|could not
 * <operation>: ..." that never hold ids, tokens or bodies.
 *
 * thread: any; one sl_redis_t per thread; the scripts' cached SHA-1s are shared (sl_redis).
 */
#ifndef SL_RSTATE_H
#define SL_RSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_redis.h"

#define SL_RSTATE_ID_LEN     40    /* hex SHA-1 job id */
#define SL_RSTATE_TOKEN_LEN  32    /* hex lease token (128 bits) */
#define SL_RSTATE_SHARDS_MAX 65536 /* shard count cap (4 hex digits of the id) */
#define SL_RSTATE_CLAIM_MAX  1000  /* jobs per claim call */
#define SL_RSTATE_RENEW_MAX  29    /* jobs per renew call (64 script args) */
#define SL_RSTATE_PIPE_MAX   1000  /* commands per pipelined round trip */
#define SL_RSTATE_KEY_MAX    256   /* bytes of the longest key with its NUL (a marker key) */
#define SL_RSTATE_EPKEY_MAX  96    /* bytes of an endpoint's breaker or rate key with its NUL */
/* ms; cap on every time or duration argument, so sums stay exact in Lua's doubles */
#define SL_RSTATE_MS_MAX (INT64_C(1) << 50)

/* ==== Keys ==== */

/*
 * Each writes its key into buf (cap bytes) and returns its length, or -1 when it does not
 * fit (buf is then ""). Strings are borrowed; none is checked here beyond its length.
 * key_job with job_id "" gives the shard's job key prefix (the claim script appends ids).
 */
int sl_rstate_key_retry(char *buf, size_t cap, uint32_t shard);
int sl_rstate_key_lease(char *buf, size_t cap, uint32_t shard);
int sl_rstate_key_job(char *buf, size_t cap, uint32_t shard, const char *job_id);
int sl_rstate_key_breaker(char *buf, size_t cap, const char *endpoint_id);
int sl_rstate_key_rate(char *buf, size_t cap, const char *endpoint_id);
int sl_rstate_key_done(char *buf, size_t cap, const char *endpoint_id, const char *event_id);
int sl_rstate_key_apirate(char *buf, size_t cap, const char *api_key_id);
int sl_rstate_key_idem(char *buf, size_t cap, const char *api_key_id, const char *hash_hex);
int sl_rstate_key_owner(char *buf, size_t cap);

/* ==== Job ids ==== */

/* The job id of (endpoint id, event id), both borrowed, into out (41 bytes with the NUL).
 * Aborts when libcrypto cannot compute SHA-1 (a made-up id would merge or split chains). */
void sl_rstate_job_id(const char *endpoint_id,
                      const char *event_id,
                      char out[SL_RSTATE_ID_LEN + 1]);

/* The shard of a job id (borrowed): its first four lowercase hex digits modulo nshards
 * (0 taken as 1). An id that does not start with four lowercase hex digits is shard 0. */
uint32_t sl_rstate_shard(const char *job_id, uint32_t nshards);

/* Is s a job id (SL_RSTATE_ID_LEN lowercase hex) / a lease token (SL_RSTATE_TOKEN_LEN)? */
int sl_rstate_valid_id(const char *s);
int sl_rstate_valid_token(const char *s);

/* ==== Retry schedule ==== */

/* sl_rstate_put results (>= 0; errors are negative SL_E* codes). */
#define SL_RSTATE_PUT_OK      0 /* written */
#define SL_RSTATE_PUT_EXISTED 1 /* new job: a job with that id exists; nothing changed */
#define SL_RSTATE_PUT_LOST    2 /* reschedule: the lease is not the caller's; nothing changed */

/*
 * Put a job into the schedule, atomically (one script): SET its body, ZADD it due at Redis's
 * clock + delay_ms (<= 0: due now; |delay_ms| <= SL_RSTATE_MS_MAX), and drop its lease entry.
 * token NULL: a new job, written only if no job with that id exists (its body key); any stale
 * lease entry for the id goes, so no old token can touch it. token non-NULL: a reschedule of
 * a claimed job, written only while the lease hash still holds token for it (the lease is
 * then released). Only the delay comes from the caller: a due time computed on a pod's clock
 * would be early or late by that pod's skew. nshards 1..SL_RSTATE_SHARDS_MAX; body (body_len
 * bytes, binary; NULL only when body_len is 0), job_id and token are borrowed. Not retried.
 * Returns an SL_RSTATE_PUT_* result, or SL_EINVAL / SL_EREDIS ("... schedule job: ...").
 */
int sl_rstate_put(sl_redis_t *r,
                  uint32_t nshards,
                  const char *job_id,
                  const void *body,
                  size_t body_len,
                  int64_t delay_ms,
                  const char *token,
                  sl_err_t *err);

/*
 * Claim up to max (0..SL_RSTATE_CLAIM_MAX) due jobs (score <= Redis's TIME, oldest first) of
 * one shard, leasing each to token (borrowed, SL_RSTATE_TOKEN_LEN hex) until TIME + lease_ms
 * (1..SL_RSTATE_MS_MAX); jobs whose body is missing are removed (and count against max). Not
 * retried. Returns 0 with *out the reply (caller frees with freeReplyObject; NULL when max is
 * 0): an array of 3n strings [id, token, body, ...], every id SL_RSTATE_ID_LEN and every
 * token SL_RSTATE_TOKEN_LEN lowercase hex, n <= max; or a negative code (*out NULL; any jobs
 * leased then come back when the lease ends).
 */
int sl_rstate_claim(sl_redis_t *r,
                    uint32_t shard,
                    int64_t lease_ms,
                    int max,
                    const char *token,
                    redisReply **out,
                    sl_err_t *err);

/* Remove a claimed job (its body, schedule entry and lease) if the lease still holds token.
 * Not retried. Returns 0, 1 when the lease was lost (nothing changed), or SL_E*. */
int sl_rstate_complete(
    sl_redis_t *r, uint32_t nshards, const char *job_id, const char *token, sl_err_t *err);

/*
 * Extend the leases of n (1..SL_RSTATE_RENEW_MAX) jobs of one shard to TIME + lease_ms: a job
 * whose lease entry still holds its token, and which is still in the schedule, is renewed
 * (kept[i] = 1), any other gets kept[i] = 0. Every job must live in shard. Arrays borrowed.
 * Not retried. Returns 0 or SL_E*.
 */
int sl_rstate_renew(sl_redis_t *r,
                    uint32_t shard,
                    int64_t lease_ms,
                    size_t n,
                    const char *const *job_ids,
                    const char *const *tokens,
                    unsigned char *kept,
                    sl_err_t *err);

/* Do the jobs exist (their body keys)? present[i] (caller's n bytes) = 1 or 0, pipelined.
 * Read-only: retried once after a lost connection. Returns 0 or SL_E*. */
int sl_rstate_jobs_exist(sl_redis_t *r,
                         uint32_t nshards,
                         size_t n,
                         const char *const *job_ids,
                         unsigned char *present,
                         sl_err_t *err);

struct sl_rstate_counts {
    int64_t scheduled; /* jobs in the retry zsets (ZCARD; leased ones included) */
    int64_t leased;    /* jobs holding a lease entry (HLEN; an expired, unclaimed one too) */
    int64_t due;       /* with_due: jobs whose score is <= Redis's clock (TIME, read first):
                          due and not claimed (an expired lease counts); else 0 */
};

/* Count the schedule over nshards shards, pipelined. with_due adds a ZCOUNT per shard.
 * Read-only: retried once after a lost connection. Returns 0 or SL_E* (out zeroed). */
int sl_rstate_counts(
    sl_redis_t *r, uint32_t nshards, int with_due, struct sl_rstate_counts *out, sl_err_t *err);

/* ==== Pipelines ==== */

/*
 * A pipelined batch of ncmds independent, idempotent commands. build() writes command i's
 * argv (at most 8 arguments; key text into keybuf, SL_RSTATE_KEY_MAX bytes, which is reused
 * once the command is sent) and returns argc; check() validates reply i and stores its
 * result (0, or -1 for a reply of the wrong shape; it may be called again for the same i
 * after a retry, so it overwrites).
 */
struct sl_rstate_pipe {
    int (*build)(void *ctx, size_t i, char *keybuf, const char **argv, size_t *argvlen);
    int (*check)(void *ctx, size_t i, const redisReply *rep);
    void *ctx;
};

/* Run ncmds commands in round trips of SL_RSTATE_PIPE_MAX; a chunk whose connection was lost
 * is sent once more. op names the operation in messages. Returns 0 or SL_E*. */
int sl_rstate_pipe_run(
    sl_redis_t *r, const struct sl_rstate_pipe *p, size_t ncmds, const char *op, sl_err_t *err);

/* ==== Circuit breakers (the scripts; common/sl_breaker.h is the plain reader) ==== */

/* A breaker script's reply. */
struct sl_rstate_brk {
    int state;             /* 0 closed, 1 open, 2 half_open (as stored after the call) */
    int64_t failures;      /* consecutive failures */
    int64_t reopen_at_ms;  /* Redis's clock; open: cooldown end; half_open: probe lease end */
    int64_t cooldown_ms;   /* current cooldown; 0 when never opened */
    int probe;             /* acquire: 1 when this caller holds the half-open probe */
    int64_t now_ms;        /* Redis's TIME when the view was taken */
    int64_t open_since_ms; /* Redis's clock; open or half_open: when it last opened from
                              closed (failed probes keep it); closed: 0 */
};

/*
 * record: an attempt's result at Redis's clock. success closes (nothing written when closed
 * with no failures); a failure counts, opens at failures >= threshold, re-opens a half-open
 * breaker whose probe owner is owner with the cooldown doubled up to cooldown_max_ms; any
 * other failure only counts. Every write extends the key's expiry to idle_ms (never
 * shortening it). Arguments are not checked beyond the key's length; cons_store.h states
 * their ranges. Not retried. out may be NULL.
 */
int sl_rstate_brk_record(sl_redis_t *r,
                         const char *endpoint_id,
                         int success,
                         int64_t threshold,
                         int64_t cooldown_base_ms,
                         int64_t cooldown_max_ms,
                         const char *owner,
                         int64_t idle_ms,
                         struct sl_rstate_brk *out,
                         sl_err_t *err);

/* acquire: the half-open probe for exactly one caller after the cooldown (or after the last
 * probe's lease ran out), leased probe_lease_ms; taking it extends the key's expiry to the
 * longer of cooldown and lease plus margin_ms. Not retried. */
int sl_rstate_brk_acquire(sl_redis_t *r,
                          const char *endpoint_id,
                          int64_t probe_lease_ms,
                          const char *owner,
                          int64_t margin_ms,
                          struct sl_rstate_brk *out,
                          sl_err_t *err);

/* get: the breaker as stored, probe 0. Read-only: retried once after a lost connection. */
int sl_rstate_brk_get(sl_redis_t *r,
                      const char *endpoint_id,
                      struct sl_rstate_brk *out,
                      sl_err_t *err);

/* ==== Rate buckets ==== */

/*
 * Take up to want tokens from the endpoint's bucket, refilled at rate tokens per period_ms up
 * to burst by Redis's clock; *granted = 0..want, *wait_ms = time to the next token when
 * fewer than want. The key expires after max(1 s, twice a refill from empty, in whole
 * periods). Arguments as cons_store_rate_take checks them. Not retried. Returns 0 or SL_E*.
 */
int sl_rstate_rate_take(sl_redis_t *r,
                        const char *endpoint_id,
                        int64_t rate,
                        int64_t period_ms,
                        int64_t burst,
                        int64_t want,
                        int64_t *granted,
                        int64_t *wait_ms,
                        sl_err_t *err);

/*
 * sluice-api's per-key bucket: take one token (rate per second, burst; both >= 1) on Redis's
 * clock. Returns 0 when taken, the ms until one is there (>= 1), or a negative code with err
 * filled (no reply, or an error reply). Not retried.
 */
int64_t sl_rstate_apirate_take(
    sl_redis_t *r, const char *api_key_id, int64_t rate_per_s, int64_t burst, sl_err_t *err);

/*
 * Settle sluice-api's Idempotency-Key state at key (sl_rstate_key_idem) for the request that
 * claimed it with the value lock: store answer (answer_len bytes) for ttl_s seconds, or
 * forget the key when answer is NULL. Done only while the key still holds lock, or has
 * expired: returns 1 then, 0 when another request has claimed the key since (nothing is
 * changed), or a negative code with err filled. Retried once after a lost connection (the
 * script is safe to run twice).
 */
int sl_rstate_idem_settle(sl_redis_t *r,
                          const char *key,
                          const char *lock,
                          const void *answer,
                          size_t answer_len,
                          int64_t ttl_s,
                          sl_err_t *err);

/* Longest owner value: a Kafka cluster id (22 characters; 64 allowed), '/', a topic name. */
#define SL_RSTATE_OWNER_MAX 320

/*
 * Bind the database to owner ("<Kafka cluster id>/<endpoints topic>", 1..SL_RSTATE_OWNER_MAX
 * bytes) unless it is bound already; the value it is bound to (owner, or the one found) is
 * copied into found (found_cap bytes, SL_RSTATE_OWNER_MAX + 1 hold any). Returns 1 when this
 * call bound it, 0 when it was bound already (to owner or another: compare found), or a
 * negative code with err filled. Retried once after a lost connection (safe to run twice).
 */
int sl_rstate_claim_owner(
    sl_redis_t *r, const char *owner, char *found, size_t found_cap, sl_err_t *err);

/* Witnesses of the binding: one key in each 1/64 of the hash slots (256 slots). */
#define SL_RSTATE_WITNESSES 64

/* The i-th witness key (0 <= i < SL_RSTATE_WITNESSES): "sluice:owner:{<tag>}", its tag the
 * first of "w0", "w1", ... whose slot is in [i * 256, (i + 1) * 256). Returns its length, or
 * -1 (buf "") when it did not fit or i is out of range. */
int sl_rstate_key_witness(char *buf, size_t cap, int i);

/*
 * Write the binding's witnesses (one round trip, pipelined over a cluster's masters).
 * overwrite 1: every one is set to owner (the database was bound just now). overwrite 0:
 * each one missing is set to owner (SET NX), and *restored counts those this call set: a
 * witness goes only with the data around it (the database or a cluster master emptied,
 * restarted without its data, failed over to a replica without it), so restored > 0 while
 * sluice:owner is in place means part of the state was lost, and one caller of several
 * counts each witness. *failed counts witnesses whose command got an error reply (a cluster
 * master down: CLUSTERDOWN), which are looked at again next time. Returns 0 (even with
 * failed > 0), or a negative code with err filled when Redis did not answer.
 */
int sl_rstate_witnesses(
    sl_redis_t *r, const char *owner, int overwrite, int *restored, int *failed, sl_err_t *err);

#endif /* SL_RSTATE_H */
