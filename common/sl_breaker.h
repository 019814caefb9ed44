/*
 * sl_breaker: the read side of the per-endpoint circuit breakers that the consumers keep in
 * Redis (the scripts that write them are common/sl_rstate's, run only by consumer/cons_store.c,
 * which owns the state machine's policy).
 *
 * Storage contract (one hash per endpoint, hash-tagged so a cluster keeps it on one slot):
 *   key     sl_rstate_key_breaker (common/sl_rstate.h, the whole Redis layout)
 *   fields  state          closed | open | half_open (absent hash = closed, no failures)
 *           failures       consecutive failures counted
 *           opened_at_ms   unix ms the breaker last opened
 *           cooldown_ms    current cooldown (doubles on a failed probe)
 *           probe_owner    the pod holding the half-open probe
 *           probe_until_ms unix ms the probe's lease ends
 * Readers (sluice-api's endpoint statistics, sluicectl) use this module instead of restating
 * the key and the field names.
 *
 * thread: any; one sl_redis_t per thread as always.
 */
#ifndef SL_BREAKER_H
#define SL_BREAKER_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_redis.h"

enum sl_breaker_state {
    SL_BREAKER_CLOSED = 0,
    SL_BREAKER_OPEN = 1,
    SL_BREAKER_HALF_OPEN = 2,
    SL_BREAKER_UNKNOWN = 3 /* the hash holds a state this reader does not know */
};

struct sl_breaker_view {
    enum sl_breaker_state state; /* as stored */
    int64_t failures;            /* consecutive failures; 0 when none */
    int64_t reopen_at_ms;        /* open: unix ms the cooldown ends (a probe may go then);
                                    half_open: unix ms the probe's lease ends; closed: 0 */
    int64_t cooldown_ms;         /* current cooldown, ms; 0 when never opened */
};

/* "closed", "open", "half_open" or "unknown" (static). */
const char *sl_breaker_state_name(enum sl_breaker_state s);

/*
 * Read the breakers of n endpoints (ids borrowed) in one pipelined round trip; out[i]
 * (caller's array of n) is endpoint ids[i]'s view. Returns 0, or SL_EREDIS / SL_EINVAL with
 * err filled (out is then unspecified). Read-only: safe to retry.
 */
int sl_breaker_read(
    sl_redis_t *r, const char *const *ids, size_t n, struct sl_breaker_view *out, sl_err_t *err);

#endif /* SL_BREAKER_H */
