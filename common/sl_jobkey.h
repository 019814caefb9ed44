/*
 * sl_jobkey: the Redis retry-schedule layout that the consumer (which writes it) and sluicectl
 * (which counts it and rebuilds it after a Redis loss) must agree on, in one place.
 *
 * - A retry job's id is the hex SHA-1 of "<endpoint id>\n<event id>": one job per delivery,
 *   so a record read twice cannot start two chains.
 * - Its shard is the id's first four hex digits modulo the shard count (a Redis Cluster hash
 *   tag, so a shard's keys live on one node).
 * - The keys, by shard s: the due-time sorted set SL_JOBKEY_RETRY, the lease hash
 *   SL_JOBKEY_LEASE, and one string per job body, SL_JOBKEY_JOB.
 *
 * thread: any (no state).
 */
#ifndef SL_JOBKEY_H
#define SL_JOBKEY_H

#include <inttypes.h>
#include <stdint.h>

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

#endif /* SL_JOBKEY_H */
