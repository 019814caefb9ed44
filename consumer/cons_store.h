/*
 * cons_store: the consumer's shared, durable state in Redis: the retry schedule and its
 * leases, the dedup markers, the circuit breakers and the rate buckets, shared by all
 * consumer pods. The keys, the Lua scripts (every multi-key change is one, so it is atomic)
 * and their running are common/sl_rstate's, the one statement of the layout that sluicectl
 * and sluice-api use too; this module is the consumer's policy over it (lease tokens, caps,
 * breaker key expiry, marker values) and its API.
 *
 * Times: every time stored in Redis, and every comparison with "now", is on Redis's clock
 * (TIME read inside the script that compares; common/sl_rstate.c states the rule per
 * script). No function takes a "now": callers pass durations (a delay, a lease), and breaker
 * views come with Redis's now_ms so a caller can turn their times into distances.
 *
 * Job id = hex SHA-1 of "<endpoint id>\n<event id>": one retry chain per (event, endpoint),
 * so a Kafka redelivery of a message whose retry is already scheduled finds the job and does
 * not start a second chain. Shard = first 4 hex digits of the job id modulo the shard count.
 * A claimed job stays in its retry set with score = lease expiry, so a crashed consumer's
 * jobs come back by themselves (invariant 6). Markers: "1 <attempt> <ts_ms> <status>
 * <lat_us>" delivered (invariant 2), "d" dead-lettered (a record read again is not sent
 * again; replays bypass it), both with TTL = the dedup window.
 *
 * Lease tokens are 128 random bits (OpenSSL RAND_bytes) as 32 lowercase hex characters,
 * generated here and passed to the scripts; one claim call uses one fresh token for every job
 * it leases (the lease check is per (job id, token), so that is enough to tell claims apart).
 *
 * Connection loss: read-only and idempotent calls (job_exists, counts, intake_check,
 * done_mark, dead_mark, brk_get) reconnect and retry once. Scripts that change state
 * (schedule, claim, renew, complete, brk_record, brk_acquire, rate_take) are not retried:
 * the call fails with SL_EREDIS, its effect is unknown, and the next call reconnects. That
 * is safe by construction: a lost claim's jobs come back when their lease expires; a lost
 * renew is tried again; a lost schedule/complete/record is the same as a crash just before
 * or after it; a lost rate take only spends tokens.
 *
 * Errors: SL_EINVAL (bad argument, checked before any I/O), SL_ESTATE (lease lost),
 * SL_ECRYPTO (no random bytes for a token), SL_EREDIS (connection, error reply, or a reply
 * of an unexpected shape). Messages name the operation, never ids, tokens or bodies.
 *
 * thread: the consumer main loop only (one sl_redis_t).
 */
#ifndef CONS_STORE_H
#define CONS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_redis.h"
#include "common/sl_rstate.h"

#define CONS_JOBID_LEN        SL_RSTATE_ID_LEN     /* hex SHA-1 */
#define CONS_TOKEN_LEN        SL_RSTATE_TOKEN_LEN  /* hex lease token (128 bits) */
#define CONS_STORE_SHARDS_MAX SL_RSTATE_SHARDS_MAX /* shard count cap (4 hex digits of the id) */
#define CONS_STORE_CLAIM_MAX  SL_RSTATE_CLAIM_MAX  /* jobs per claim call */
#define CONS_STORE_BODY_MAX   ((size_t)64 << 20)   /* bytes; sanity cap on a job body */
#define CONS_STORE_PIPE_MAX   SL_RSTATE_PIPE_MAX   /* commands per pipelined round trip */
#define CONS_STORE_OWNER_MAX  128                  /* bytes; breaker probe owner id */
#define CONS_STORE_RENEW_MAX  SL_RSTATE_RENEW_MAX  /* jobs per renew call (64 script args) */
/* ms; a breaker key untouched this long after its longest cooldown expires (brk_record) */
#define CONS_STORE_BRK_IDLE_MS (INT64_C(3600) * 1000)
/* ms; cap on every time or duration argument, so sums stay exact in Lua's doubles */
#define CONS_STORE_MS_MAX SL_RSTATE_MS_MAX

/* Compute the job id (41 bytes incl. NUL, lowercase hex) of an (endpoint, event) pair.
 * Both strings are borrowed. Aborts only if OpenSSL cannot compute SHA-1 at all. */
void cons_store_job_id(const char *endpoint_id, const char *event_id, char out[41]);
/* Shard of a job id: first 4 hex digits modulo nshards (nshards 0 is treated as 1; a
 * malformed id maps to shard 0). */
uint32_t cons_store_shard(const char *job_id, uint32_t nshards);

/* ==== Retry schedule ==== */

/*
 * Schedule (or reschedule) a job: SET body, ZADD it due delay_ms after Redis's clock (TIME
 * in the script; delay_ms <= 0 = due now; |delay_ms| <= CONS_STORE_MS_MAX). A pod that wants
 * a job due at a time on its own clock passes that time minus its own now: its skew cancels
 * out. The script is common/sl_rstate's (sluicectl uses the same). When lease_token is
 * non-NULL the call is a reschedule of a claimed job and succeeds only while that lease is
 * still ours (returns SL_ESTATE otherwise: another pod owns the job now, drop it); on success
 * the lease is released (the job is no longer claimed by anyone). When NULL, it is a new job
 * (from Kafka): if a job with that id already exists (its body key is present) it is left
 * untouched and SL_ESTATE is NOT returned: *existed is set to 1 instead (existed may be
 * NULL; it is set to 0 otherwise). A new job also drops any leftover lease entry for its id,
 * so no stale token can touch it. body (body_len bytes, binary, <= CONS_STORE_BODY_MAX;
 * NULL only when body_len is 0) and the strings are borrowed.
 */
int cons_store_schedule(sl_redis_t *r,
                        uint32_t nshards,
                        const char *job_id,
                        const void *body,
                        size_t body_len,
                        int64_t delay_ms,
                        const char *lease_token,
                        int *existed,
                        sl_err_t *err);

/* One claimed job. body is owned by the batch. */
struct cons_claimed {
    char job_id[41];     /* hex SHA-1 */
    char token[33];      /* lease token of this claim (hex, NUL-terminated) */
    uint32_t shard;      /* shard it lives in */
    unsigned char *body; /* delivery record bytes (malloc'd; one extra NUL after body_len) */
    size_t body_len;     /* bytes */
};

/*
 * Claim up to max due jobs (score <= Redis's TIME, oldest due first) from one shard, leasing
 * each until TIME + lease_ms (lease_ms >= 1). The lease ends no earlier than lease_ms after
 * the call was made, so a caller that starts counting before the call never overestimates
 * it. Jobs whose body is missing are removed (and count against max, so fewer than max may
 * come back while more are due). max: 0..CONS_STORE_CLAIM_MAX. Returns the number claimed
 * (>= 0) with *out a malloc'd array the caller frees with cons_store_claimed_free (NULL when
 * 0 were claimed), or a negative SL_E* code (*out NULL).
 */
int cons_store_claim(sl_redis_t *r,
                     uint32_t shard,
                     int64_t lease_ms,
                     int max,
                     struct cons_claimed **out,
                     sl_err_t *err);
/* Free a claim batch of n jobs (NULL-safe). */
void cons_store_claimed_free(struct cons_claimed *c, int n);

/* Remove a claimed job (delivered, dead-lettered, or dropped) if the lease is still ours.
 * Returns 0, or SL_ESTATE if the lease was lost (someone else owns it now, or the job was
 * rescheduled or completed already). */
int cons_store_complete(
    sl_redis_t *r, uint32_t nshards, const char *job_id, const char *token, sl_err_t *err);

/*
 * Keep the leases of n claimed jobs of one shard alive for lease_ms (>= 1) more: a job whose
 * lease entry still holds its token gets its score (the lease expiry) moved to Redis's TIME +
 * lease_ms and kept[i] = 1; a job claimed by someone else since, rescheduled or completed
 * gets kept[i] = 0 (the job is no longer ours: do not send it). A lease that ran out but was
 * not claimed by anyone else is still ours and is renewed. n: 1..CONS_STORE_RENEW_MAX; every
 * job must live in shard (cons_store_shard of its id). Ids, tokens and kept are borrowed. Not
 * retried on a lost connection (its effect is unknown; the caller renews again later).
 * Returns 0 or SL_E*.
 */
int cons_store_renew(sl_redis_t *r,
                     uint32_t shard,
                     int64_t lease_ms,
                     size_t n,
                     const char *const *job_ids,
                     const char *const *tokens,
                     unsigned char *kept,
                     sl_err_t *err);

/* Is a job with this id scheduled or leased (its body key exists)? 1 yes, 0 no, negative on
 * error. */
int cons_store_job_exists(sl_redis_t *r, uint32_t nshards, const char *job_id, sl_err_t *err);

/* Counts for health, over all shards in pipelined round trips: *scheduled = jobs in the
 * schedule (ZCARD, leased ones included), *leased = jobs holding a lease entry (HLEN; a lease
 * that expired but was not re-claimed yet still counts). Returns 0 or negative. */
int cons_store_counts(
    sl_redis_t *r, uint32_t nshards, int64_t *scheduled, int64_t *leased, sl_err_t *err);

/* ==== Dedup markers ==== */

#define CONS_DONE_DELIVERED 1 /* intake_check: a delivered marker */
#define CONS_DONE_DEAD      2 /* intake_check: a dead-letter marker */
#define CONS_DONE_CHAIN     3 /* intake_check: no marker, but the pair's retry job exists */

/* What a delivered marker remembers of its delivery, so that a copy read again can report it
 * once more when its own outcome was lost (a pod killed between the marker and the outcome's
 * acknowledgement): the same (attempt, ts) make the same history row, which the recorder
 * deduplicates. attempt 0 = not known (a marker written without it). */
struct cons_done_info {
    uint32_t attempt; /* attempt that was delivered (1-based); 0 = unknown */
    int64_t ts_ms;    /* its outcome's ts, wall clock ms */
    uint32_t status;  /* HTTP status */
    uint64_t lat_us;  /* total request time, us */
};

/*
 * The consumer's intake check, one pipeline (CONS_STORE_PIPE_MAX commands per round trip)
 * for n (endpoint, event) pairs: each pair's marker and, when job_ids[i] is non-NULL, whether
 * that retry job exists. out[i] = CONS_DONE_DELIVERED when already delivered, CONS_DONE_DEAD
 * when dead-lettered, else CONS_DONE_CHAIN when the job exists (a retry chain owns the pair:
 * a copy read again from Kafka must not be sent), else 0. From a pair's first failure until
 * its final marker is written, its job exists, so a copy read again always finds one or the
 * other. info (optional, n entries) receives what each delivered marker remembers (zeroed
 * otherwise). Ids are borrowed C strings (endpoint <= SL_ENDPOINT_ID_MAX, event <=
 * SL_EVENT_ID_MAX bytes); job_ids may be NULL, or job_ids[i] NULL (a claimed job checking
 * itself): markers only. Idempotent (retried once on a lost connection). Returns 0 or
 * negative (out is then unspecified).
 */
int cons_store_intake_check(sl_redis_t *r,
                            uint32_t nshards,
                            size_t n,
                            const char *const *endpoint_ids,
                            const char *const *event_ids,
                            const char *const *job_ids,
                            unsigned char *out,
                            struct cons_done_info *info,
                            sl_err_t *err);
/* Set a dead-letter marker (SET key d EX ttl_s NX, ttl_s >= 1) for one pair: only where no
 * marker is, so a delivered marker is never downgraded. Ids are borrowed. Idempotent
 * (retried once on a lost connection). Returns 0 or negative. */
int cons_store_dead_mark(
    sl_redis_t *r, const char *endpoint_id, const char *event_id, int64_t ttl_s, sl_err_t *err);
/* Set delivered markers (SET key "1 <attempt> <ts_ms> <status> <lat_us>" EX ttl_s, ttl_s >=
 * 1; just "1" where info is NULL) for n pairs, pipelined like intake_check; info (optional)
 * has n entries. On error some markers may be set (setting one twice is harmless). */
int cons_store_done_mark(sl_redis_t *r,
                         size_t n,
                         const char *const *endpoint_ids,
                         const char *const *event_ids,
                         const struct cons_done_info *info,
                         int64_t ttl_s,
                         sl_err_t *err);

/* ==== Circuit breaker ==== */

enum cons_brk_state { CONS_BRK_CLOSED = 0, CONS_BRK_OPEN = 1, CONS_BRK_HALF_OPEN = 2 };

struct cons_brk_view {
    enum cons_brk_state state; /* as stored in Redis after the call */
    int64_t failures;          /* consecutive failures (late failures while open count too) */
    int64_t reopen_at_ms;      /* unix ms on Redis's clock; open: when the cooldown ends;
                                  half_open: when the current probe lease ends (earliest next
                                  probe); closed: 0 */
    int64_t cooldown_ms;       /* ms; current cooldown (0 if never opened) */
    int probe;                 /* acquire: 1 if this caller holds the half-open probe */
    int64_t now_ms;            /* unix ms; Redis's clock (TIME) when the view was taken:
                                  reopen_at_ms - now_ms is how far off reopen_at_ms was */
    int64_t open_since_ms;     /* unix ms, Redis's clock; not closed: when the breaker opened
                                  from closed (failed probes keep it); closed: 0 */
};

/*
 * Record an attempt's result atomically, at Redis's clock (TIME); owner (borrowed,
 * 1..CONS_STORE_OWNER_MAX bytes) identifies the caller as in brk_acquire. threshold >= 1,
 * cooldown_base_ms >= 1; a cooldown_max_ms below the base is raised to the base (an
 * endpoint's own cooldown may exceed the global cap: the cooldown then stays at the base
 * instead of the call failing).
 *   success, any state but "closed with 0 failures" -> closed, failures 0, cooldown_ms =
 *     base, probe released. A success while open or while someone else probes is a late
 *     answer from a request sent before the breaker opened; it is still evidence that the
 *     endpoint works, so it closes the breaker too.
 *   success, closed with 0 failures -> nothing is written (the hot path costs one HMGET).
 *   failure, closed -> failures++; at failures >= threshold: open, opened_at = TIME,
 *     cooldown = base.
 *   failure, half_open and owner holds the probe (lease live or expired but not taken over)
 *     -> open again, opened_at = TIME, cooldown doubled up to cooldown_max_ms. The consumer
 *     names each probe "<pod>/<n>" and its other requests "<pod>", so only the probe's own
 *     failure does this.
 *   failure, open, or half_open probed by someone else -> a late answer from before the
 *     breaker opened: failures++ only (no extension of the cooldown, no state change).
 * Every write extends the key's expiry to cooldown_max_ms (as raised) + CONS_STORE_BRK_IDLE_MS
 * after the call (never shortening it). That loses nothing that matters: while a breaker is
 * open its deferred deliveries come back within a minute of the cooldown's end (the deferral
 * spread) and touch the key again, and a cooldown never exceeds cooldown_max_ms; a key left
 * untouched for an hour beyond its longest cooldown belongs to an endpoint that nobody had
 * anything for in that hour, and reads as closed with no failures: failures an hour apart
 * are not consecutive, and a still-broken endpoint re-opens it after threshold failures
 * (with the cooldown back at the base). out may be NULL.
 */
int cons_store_brk_record(sl_redis_t *r,
                          const char *endpoint_id,
                          int success,
                          int64_t threshold,
                          int64_t cooldown_base_ms,
                          int64_t cooldown_max_ms,
                          const char *owner,
                          struct cons_brk_view *out,
                          sl_err_t *err);

/*
 * Ask to send while the breaker may be open; "now" is Redis's TIME. closed -> state closed
 * (send; nothing written). open before the cooldown ends -> open (defer to reopen_at_ms).
 * open after the cooldown, or half_open whose probe lease expired -> half_open with probe=1
 * for exactly one caller across all pods (the probe lease lasts probe_lease_ms >= 1 from
 * TIME; the key's expiry is extended to cover the cooldown or the lease, whichever is
 * longer, plus CONS_STORE_BRK_IDLE_MS); everyone else gets probe=0 and defers (to
 * reopen_at_ms = the probe lease end). Not re-entrant: the probe owner asking again while
 * its lease is live also gets probe=0, so one owner cannot send two probes.
 * owner: borrowed, 1..CONS_STORE_OWNER_MAX bytes (e.g. the pod's instance id).
 */
int cons_store_brk_acquire(sl_redis_t *r,
                           const char *endpoint_id,
                           int64_t probe_lease_ms,
                           const char *owner,
                           struct cons_brk_view *out,
                           sl_err_t *err);

/* Read the breaker without changing it (for refreshing local caches and for health).
 * probe is always 0. */
int cons_store_brk_get(sl_redis_t *r,
                       const char *endpoint_id,
                       struct cons_brk_view *out,
                       sl_err_t *err);

/* ==== Rate limit (token bucket shared by all pods) ==== */

/*
 * Take up to want tokens from the endpoint's bucket (sl_rstate_key_rate), refilled at rate tokens
 * per period_ms up to burst (all >= 1) by Redis's clock, atomically. *granted (OUT) receives
 * 0..want; when it is less than want, *wait_ms (OUT) is how long until the next token.
 * Pods take small leases (several tokens at once) so a high-rate endpoint does not cost a
 * Redis round trip per delivery; leased tokens count as spent, so the pods together never
 * exceed the bucket. The key expires after max(1 s, twice the time the bucket takes to
 * refill from empty to full, in whole periods) without a take: a bucket idle that long is
 * full, and a missing key reads as full, so nothing is lost. Not retried on a lost
 * connection. Returns 0 or SL_E*.
 */
int cons_store_rate_take(sl_redis_t *r,
                         const char *endpoint_id,
                         int64_t rate,
                         int64_t period_ms,
                         int64_t burst,
                         int64_t want,
                         int64_t *granted,
                         int64_t *wait_ms,
                         sl_err_t *err);

#endif /* CONS_STORE_H */
