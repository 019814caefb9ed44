/*
 * cons_backoff: when to try a failed delivery again (design invariant 4).
 *
 * Full jitter: delay = uniform(0, min(cap, base * 2^attempt)) ms, integers, both ends
 * included, where attempt = attempts already spent (0-based). The ceiling is computed
 * without overflow for any attempt (it saturates at cap long before 2^attempt would wrap).
 * A Retry-After given here (already clamped by cons_retry_after_ms) wins when it is longer
 * than the jittered delay, still bounded by cap. The consumer's retries pass none: there an
 * endpoint's Retry-After is bounded by retry_after_max_ms alone, not by the backoff cap
 * (conclude_retry in cons_send.c). The due time saturates at INT64_MAX.
 *
 * Randomness is injectable (struct cons_rng) so tests are deterministic; the default is a
 * per-thread xoshiro256** seeded from getrandom(2) on first use. It is not a CSPRNG and
 * needs not be: jitter only spreads load.
 *
 * thread: any. The default RNG is thread-local; a caller-supplied rng is used only by the
 * calling thread.
 */
#ifndef CONS_BACKOFF_H
#define CONS_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>

/* Retry policy of one endpoint (global defaults overridden per endpoint). */
struct cons_retry_policy {
    int64_t base_ms;       /* first ceiling, ms (> 0; default 30000) */
    int64_t cap_ms;        /* largest delay, ms (>= 0; default 3600000) */
    uint32_t max_attempts; /* attempts in total, first one included (default 5; 0 acts as 1) */
};

/* Source of 64 uniformly distributed random bits per call. */
struct cons_rng {
    uint64_t (*next)(void *state); /* required */
    void *state;                   /* passed to next; owned by whoever built the rng */
};

/* xoshiro256** state (https://prng.di.unimi.it/). */
struct cons_xoshiro {
    uint64_t s[4]; /* never all zero */
};

/* Seed x from one 64-bit value through splitmix64 (so any seed, even 0, is fine). */
void cons_xoshiro_seed(struct cons_xoshiro *x, uint64_t seed);
/* Next 64 bits; state is a struct cons_xoshiro *. Suitable as cons_rng.next. */
uint64_t cons_xoshiro_next(void *state);

/*
 * This thread's default rng (xoshiro256** seeded from getrandom on first use; if getrandom
 * fails, from the clock, thread id and an address). Borrowed: valid for the thread's life.
 */
struct cons_rng *cons_rng_default(void);

/* Uniform integer in [0, bound] (both included), without modulo bias. */
uint64_t cons_rng_uniform(struct cons_rng *rng, uint64_t bound);

/* min(cap, base * 2^attempts_done) in ms, never negative, never overflowing. */
int64_t cons_backoff_ceiling_ms(const struct cons_retry_policy *p, uint32_t attempts_done);

/* A full-jitter delay in ms: uniform in [0, ceiling]. rng NULL = this thread's default. */
int64_t cons_backoff_delay_ms(const struct cons_retry_policy *p,
                              uint32_t attempts_done,
                              struct cons_rng *rng);

/*
 * Absolute due time (unix ms) of the next attempt: now_ms + max(jittered delay,
 * min(retry_after_ms, cap)) with retry_after_ms <= 0 meaning none; saturates at INT64_MAX.
 * rng NULL = this thread's default.
 */
int64_t cons_backoff_next(const struct cons_retry_policy *p,
                          uint32_t attempts_done,
                          int64_t now_ms,
                          int64_t retry_after_ms,
                          struct cons_rng *rng);

/* True when attempts_done >= max_attempts: the delivery becomes a dead letter. */
bool cons_backoff_exhausted(const struct cons_retry_policy *p, uint32_t attempts_done);

#endif /* CONS_BACKOFF_H */
