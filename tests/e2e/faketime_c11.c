/*
 * faketime_c11: a test-only LD_PRELOAD shim that lets libfaketime fake the clock of a
 * librdkafka process (tests/e2e/test_clock_skew.py).
 *
 * librdkafka 2.0.2 on glibc >= 2.34 waits with C11 cnd_timedwait, whose deadline is on
 * CLOCK_REALTIME. libfaketime 0.9.10 fakes clock_gettime and translates the deadline of
 * pthread_cond_timedwait back to the real clock, but does not intercept cnd_timedwait, so a
 * process faked 10 s ahead waited 10 s longer than asked on every timed wait (a metadata
 * request took 10 s) and one faked behind never waited at all. glibc's cnd_t and mtx_t are
 * its pthread_cond_t and pthread_mutex_t (cnd_timedwait is a cast and a call), so the shim
 * makes the same call through the dynamic linker, where libfaketime (preloaded after this
 * library) interposes it. cnd_init goes through pthread_cond_init for the same reason.
 */
#include <errno.h>
#include <pthread.h>
#include <threads.h>

_Static_assert(sizeof(cnd_t) == sizeof(pthread_cond_t), "cnd_t is a pthread_cond_t");
_Static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t), "mtx_t is a pthread_mutex_t");

int cnd_init(cnd_t *cond)
{
    int rc = pthread_cond_init((pthread_cond_t *)cond, NULL);
    return rc == 0 ? thrd_success : rc == ENOMEM ? thrd_nomem : thrd_error;
}

void cnd_destroy(cnd_t *cond)
{
    (void)pthread_cond_destroy((pthread_cond_t *)cond);
}

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mtx, const struct timespec *restrict ts)
{
    int rc = pthread_cond_timedwait((pthread_cond_t *)cond, (pthread_mutex_t *)mtx, ts);
    return rc == 0 ? thrd_success : rc == ETIMEDOUT ? thrd_timedout : thrd_error;
}
