/*
 * sl_rclock: Redis's clock, the one clock of the state that pods share in Redis (retry due
 * times and leases, breakers, rate buckets). Pods' wall clocks differ by whatever NTP leaves
 * (or more, on a broken host); a lease, a cooldown or a bucket refill compared against one
 * pod's clock would let a pod that runs ahead take another's lease or a second breaker
 * probe. So every Lua script that compares or computes a time reads "now" from Redis's TIME
 * inside the script (SL_RCLOCK_LUA_NOW; Redis 7 replicates a script's effects, so TIME
 * before a write is allowed), and a caller that needs Redis's "now" outside a script reads
 * it with sl_rclock_now_ms. The rule per script is stated in common/sl_rstate.c.
 *
 * thread: any; one sl_redis_t per thread as always.
 */
#ifndef SL_RCLOCK_H
#define SL_RCLOCK_H

#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_redis.h"

/* Lua that defines the local `now`: Redis's clock in unix ms (an integral Lua number). */
#define SL_RCLOCK_LUA_NOW                                                                          \
    "local now_t = redis.call('TIME')\n"                                                           \
    "local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)\n"

/* Read Redis's clock (TIME) into *now_ms (unix ms). Read-only: retried once after a lost
 * connection. Returns 0, or SL_EREDIS with err filled. */
int sl_rclock_now_ms(sl_redis_t *r, int64_t *now_ms, sl_err_t *err);

#endif /* SL_RCLOCK_H */
