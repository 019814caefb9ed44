/*
 * sl_jobkey: the Redis retry-schedule layout that the consumer (which writes it) and sluicectl
 * (which counts it and rebuilds it after a Redis loss) must agree on, in one place.
 *
 * - A retry job's id is the hex SHA-1 of "<endpoint id>\n<event id>": one job per delivery,
 *   so a record read twice cannot start two chains.
 * - Its shard is the id's first four hex digits modulo the shard count (a Redis Cluster hash
 *   tag, so a shard's keys live on one node).
 * - The keys, by shard s: the due-time sorted set SL_JOBKEY_RETRY (score = due time, unix ms
 *   on Redis's clock: common/sl_rclock.h), the lease hash SL_JOBKEY_LEASE, and one string per
 *   job body, SL_JOBKEY_JOB.
 * - One script puts a job into the schedule, sl_jobkey_put, for the consumer (new jobs and
 *   reschedules under a lease) and for `sluicectl retries rebuild` alike, so the two cannot
 *   drift apart.
 *
 * thread: any; the script's cached SHA-1 is shared (sl_redis guards it).
 */
#ifndef SL_JOBKEY_H
#define SL_JOBKEY_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_redis.h"

#define SL_JOBKEY_ID_LEN 40 /* hex SHA-1 */

/* printf formats of the keys: shard (uint32_t), then the job id for SL_JOBKEY_JOB */
#define SL_JOBKEY_RETRY "sluice:retry:{%" PRIu32 "}"
#define SL_JOBKEY_LEASE "sluice:lease:{%" PRIu32 "}"
#define SL_JOBKEY_JOB   "sluice:job:{%" PRIu32 "}:%s"

/* The job id of (endpoint id, event id), both borrowed, into out (41 bytes with the NUL).
 * Aborts when libcrypto cannot compute SHA-1 (a made-up id would merge or split chains). */
void sl_jobkey_id(const char *endpoint_id, const char *event_id, char out[SL_JOBKEY_ID_LEN + 1]);

/* The shard of a job id (borrowed): its first four lowercase hex digits modulo nshards
 * (0 taken as 1). An id that does not start with four lowercase hex digits is shard 0. */
uint32_t sl_jobkey_shard(const char *job_id, uint32_t nshards);

/* sl_jobkey_put results (>= 0; errors are negative SL_E* codes). */
#define SL_JOBKEY_PUT_OK      0 /* written */
#define SL_JOBKEY_PUT_EXISTED 1 /* new job: a job with that id exists; nothing changed */
#define SL_JOBKEY_PUT_LOST    2 /* reschedule: the lease is not the caller's; nothing changed */

/*
 * Put a job into the schedule, atomically (one Lua script): SET its body, ZADD it due at
 * Redis's clock (TIME, read in the script) + delay_ms (<= 0: due now), and drop its lease
 * entry. token NULL: a new job, written only if no job with that id exists (its body key);
 * any stale lease entry for the id goes, so no old token can touch it. token non-NULL: a
 * reschedule of a claimed job, written only while the lease hash still holds token for it
 * (the lease is then released). Only the delay comes from the caller: a due time computed
 * on a pod's clock would be early or late by that pod's skew.
 * job_id: SL_JOBKEY_ID_LEN lowercase hex; body (body_len bytes, binary; NULL only when
 * body_len is 0), job_id and token are borrowed. Not retried on a lost connection (its effect
 * is unknown). Returns an SL_JOBKEY_PUT_* result, or SL_EINVAL / SL_EREDIS with err filled
 * ("could not schedule job: ...").
 */
int sl_jobkey_put(sl_redis_t *r,
                  uint32_t nshards,
                  const char *job_id,
                  const void *body,
                  size_t body_len,
                  int64_t delay_ms,
                  const char *token,
                  sl_err_t *err);

#endif /* SL_JOBKEY_H */
