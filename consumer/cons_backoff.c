/*
 * cons_backoff: full-jitter backoff and its RNG (see cons_backoff.h).
 */
#include "consumer/cons_backoff.h"

#include <stddef.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ==== RNG ==== */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void cons_xoshiro_seed(struct cons_xoshiro *x, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        x->s[i] = splitmix64(&seed);
    /* splitmix64 is a bijection of a counter: four consecutive outputs are never all zero. */
}

static uint64_t rotl(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

uint64_t cons_xoshiro_next(void *state)
{
    struct cons_xoshiro *x = state;
    uint64_t *s = x->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static _Thread_local struct cons_xoshiro tls_xoshiro;
static _Thread_local struct cons_rng tls_rng;

struct cons_rng *cons_rng_default(void)
{
    if (tls_rng.next)
        return &tls_rng;
    uint64_t seed[4] = {0, 0, 0, 0};
    ssize_t got = getrandom(seed, sizeof(seed), GRND_NONBLOCK);
    if (got == (ssize_t)sizeof(seed) && (seed[0] | seed[1] | seed[2] | seed[3]) != 0) {
        for (int i = 0; i < 4; i++)
            tls_xoshiro.s[i] = seed[i];
    } else {
        /* Early boot without entropy, or a seccomp filter: jitter still has to differ per
         * thread and per process, which is all it is for. */
        struct timespec ts = {0, 0};
        (void)clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t mix = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                       ((uint64_t)gettid() << 16) ^ (uint64_t)(uintptr_t)&tls_xoshiro;
        cons_xoshiro_seed(&tls_xoshiro, mix);
    }
    tls_rng.state = &tls_xoshiro;
    tls_rng.next = cons_xoshiro_next;
    return &tls_rng;
}

uint64_t cons_rng_uniform(struct cons_rng *rng, uint64_t bound)
{
    if (bound == UINT64_MAX)
        return rng->next(rng->state);
    uint64_t range = bound + 1;
    /* 2^64 mod range: drawing below it would favour small results. */
    uint64_t threshold = (0 - range) % range;
    for (;;) {
        uint64_t x = rng->next(rng->state);
        if (x >= threshold)
            return x % range;
    }
}

/* ==== Backoff ==== */

int64_t cons_backoff_ceiling_ms(const struct cons_retry_policy *p, uint32_t attempts_done)
{
    int64_t cap = p->cap_ms > 0 ? p->cap_ms : 0;
    int64_t base = p->base_ms > 0 ? p->base_ms : 0;
    if (base >= cap)
        return cap;
    /* base < cap <= INT64_MAX: base << a stays <= cap exactly when base <= cap >> a. */
    if (attempts_done >= 63 || base > (cap >> attempts_done))
        return cap;
    return base << attempts_done;
}

int64_t cons_backoff_delay_ms(const struct cons_retry_policy *p,
                              uint32_t attempts_done,
                              struct cons_rng *rng)
{
    if (!rng)
        rng = cons_rng_default();
    int64_t ceiling = cons_backoff_ceiling_ms(p, attempts_done);
    return (int64_t)cons_rng_uniform(rng, (uint64_t)ceiling);
}

int64_t cons_backoff_next(const struct cons_retry_policy *p,
                          uint32_t attempts_done,
                          int64_t now_ms,
                          int64_t retry_after_ms,
                          struct cons_rng *rng)
{
    int64_t delay = cons_backoff_delay_ms(p, attempts_done, rng);
    if (retry_after_ms > delay) {
        int64_t cap = p->cap_ms > 0 ? p->cap_ms : 0;
        delay = retry_after_ms < cap ? retry_after_ms : cap;
        /* jittered delay <= cap, so this never lowers the delay */
    }
    int64_t due = 0;
    if (__builtin_add_overflow(now_ms, delay, &due))
        return INT64_MAX;
    return due;
}

bool cons_backoff_exhausted(const struct cons_retry_policy *p, uint32_t attempts_done)
{
    uint32_t max = p->max_attempts ? p->max_attempts : 1;
    return attempts_done >= max;
}
