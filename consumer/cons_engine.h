/*
 * cons_engine: the delivery loop of sluice-consumer.
 *
 * One thread drives everything through one epoll set: librdkafka's consumer and producer
 * queues wake it through a pipe, libcurl's sockets and timers are registered by cons_http,
 * and periodic work (claiming due retries, storing offsets, stats) runs between waits.
 *
 * A message's life (invariants 1-4, 9, 10 of docs/design.md):
 *   Kafka record -> tracked offset -> decode (bad: quarantine) -> endpoint lookup (unknown:
 *   quarantine, disabled: dead letter) -> delivered-marker check (duplicate outcome) ->
 *   breaker check (open: deferred to the Redis schedule, no attempt spent) -> per-endpoint
 *   queue (beyond the backlog bound: spilled to the Redis schedule) -> HTTP request ->
 *   classify -> delivered marker + outcome | retry written to Redis + outcome | dead letter
 *   outcome -> outcome acknowledged by Kafka -> offset finished.
 * Jobs claimed from the Redis schedule take the same path from the marker check on; their
 * completion removes or reschedules the job under the lease token of the claim.
 *
 * thread: all calls on the thread that runs cons_engine_run; cons_engine_stop is
 * async-signal-safe and may be called from any thread. Engines share nothing but the
 * endpoint table (thread-safe) and the logger: a process runs several, one per thread
 * (consumer_threads), as it would run several processes.
 */
#ifndef CONS_ENGINE_H
#define CONS_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_endpoints.h"
#include "common/sl_err.h"

typedef struct cons_engine cons_engine_t;

/* Counters since start (read by stats lines and tests). */
struct cons_stats {
    uint64_t received;    /* records taken from Kafka */
    uint64_t claimed;     /* jobs claimed from the Redis schedule */
    uint64_t sent;        /* requests started */
    uint64_t delivered;   /* 2xx */
    uint64_t retried;     /* retries scheduled */
    uint64_t dead;        /* dead letters */
    uint64_t duplicates;  /* skipped by the delivered marker */
    uint64_t deferred;    /* breaker-deferred, no attempt spent */
    uint64_t spilled;     /* moved to the schedule by the backlog bound */
    uint64_t quarantined; /* invalid records */
    uint64_t probes;      /* half-open probes sent */
    uint64_t raw_kept;    /* records kept as received: they do not encode back to the same
                             bytes (not canonical), so they cost their size again in memory */
};

/* Build the engine: connects to Kafka (consumer + outcome producer) and Redis. cfg and
 * endpoints are borrowed for the engine's life. thread (0..threads-1) is this engine's index
 * among the threads engines of the process (cfg->consumer_threads): each is its own
 * consumer-group member and breaker owner ("<pod>#<thread>" when threads > 1), and takes
 * its share of the per-process limits max_inflight and max_queued (divided by threads,
 * rounded up). Returns NULL with err filled. */
cons_engine_t *cons_engine_new(
    const struct sl_config *cfg, sl_endpoints_t *endpoints, int thread, int threads, sl_err_t *err);

/* Make this loop look at the Redis database's binding (sluice:owner) every OWNER_CHECK_MS
 * while it runs; owner is the deployment bound at start-up ("<Kafka cluster id>/<endpoints
 * topic>"). The key gone (the database emptied or replaced: the state written before may be
 * lost) is bound again and reported (event redis_state_lost, sluice_redis_state_lost_total);
 * the key naming another deployment (it took the database over) ends the run with
 * SL_CFG_EXIT. One loop per process is enough. Call before cons_engine_run. */
void cons_engine_watch_owner(cons_engine_t *e, const char *owner);

/* Run until cons_engine_stop; then drain, reschedule, flush, commit. Returns 0 on a clean
 * shutdown, SL_CFG_EXIT when the Redis database was bound to another deployment meanwhile
 * (cons_engine_watch_owner), or a negative SL_E* code on another fatal error. */
int cons_engine_run(cons_engine_t *e);

/* Ask the loop to shut down (signal handler). */
void cons_engine_stop(cons_engine_t *e);

void cons_engine_stats(const cons_engine_t *e, struct cons_stats *out);
/* Whether the loop gave up leaving the group at shutdown_timeout_ms: its consumer is still
 * in use by the abandoned close, so the engine must not be destroyed; exit the process. */
bool cons_engine_abandoned(const cons_engine_t *e);
/* Whether the loop has been assigned its partitions (any number) by the group: readiness.
 * Any thread. */
bool cons_engine_joined(const cons_engine_t *e);
void cons_engine_destroy(cons_engine_t *e);

#endif /* CONS_ENGINE_H */
