/*
 * sl_bounded: run a blocking call with a time bound, for shutdown paths that must end on
 * time whatever service is down (issue: SIGTERM within shutdown_timeout_ms).
 *
 * librdkafka 2.0.2 has no timeout on rd_kafka_consumer_close (it leaves the group, retrying
 * an unreachable coordinator for as long as it takes) nor on a synchronous commit. The call
 * runs on a thread of its own; the caller waits for it up to the bound. When the bound
 * passes first, the call is abandoned: its thread is left running (detached) and everything
 * it touches must stay untouched until the process exits, which the caller then does at once
 * (_exit) rather than destroying what the call still uses.
 *
 * thread: any; fn runs on a new thread.
 */
#ifndef SL_BOUNDED_H
#define SL_BOUNDED_H

#include <stdint.h>

/* Run fn(arg) and wait for it up to timeout_ms (0 or less: only if it returns at once).
 * Returns 0 when fn returned, SL_ETIMEDOUT when it was abandoned, or SL_ESTATE when no
 * thread could be started (fn was then run here, unbounded). */
int sl_run_bounded(void (*fn)(void *arg), void *arg, int64_t timeout_ms);

#endif /* SL_BOUNDED_H */
