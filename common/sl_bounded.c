/*
 * sl_bounded: a blocking call on its own thread, waited for up to a bound (see sl_bounded.h).
 * The call and its waiter share a small reference-counted state, so whichever finishes last
 * frees it: an abandoned call never writes to the waiter's stack.
 */
#include "common/sl_bounded.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"

struct bounded {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*fn)(void *arg);
    void *arg;
    bool done; /* fn returned */
    int refs;  /* the waiter and the thread */
};

static void unref(struct bounded *b)
{
    pthread_mutex_lock(&b->mu);
    int left = --b->refs;
    pthread_mutex_unlock(&b->mu);
    if (left == 0) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
    }
}

static void *run(void *p)
{
    struct bounded *b = p;
    b->fn(b->arg);
    pthread_mutex_lock(&b->mu);
    b->done = true;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    unref(b);
    return NULL;
}

int sl_run_bounded(void (*fn)(void *arg), void *arg, int64_t timeout_ms)
{
    struct bounded *b = sl_xcalloc(1, sizeof(*b));
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    b->fn = fn;
    b->arg = arg;
    b->refs = 2;
    pthread_t th;
    if (pthread_create(&th, NULL, run, b) != 0) {
        b->refs = 1;
        unref(b);
        fn(arg);
        return SL_ESTATE;
    }
    pthread_detach(th);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ms = timeout_ms > 0 ? timeout_ms : 0;
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&b->mu);
    while (!b->done) {
        if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT)
            break;
    }
    bool done = b->done;
    pthread_mutex_unlock(&b->mu);
    unref(b);
    return done ? 0 : SL_ETIMEDOUT;
}
