/*
 * recv_ledger: double-buffered JSON-lines writer (contract in recv_ledger.h).
 */
#include "recv_ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"

struct recv_ledger {
    int fd;                  /* ledger file, O_APPEND */
    pthread_mutex_t mu;      /* guards the fields below */
    pthread_cond_t cv_flush; /* wakes the flusher (soft limit reached, stop) */
    pthread_cond_t cv_space; /* wakes appenders waiting at the hard limit */
    pthread_t thread;        /* the flusher */
    bool thread_started;     /* must be joined */
    bool stopping;           /* flusher drains and exits */
    char *active;            /* lines waiting to be written */
    size_t active_len;       /* bytes used in active */
    size_t active_cap;       /* bytes allocated for active */
    uint64_t lines;          /* lines appended */
    uint64_t write_errors;   /* failed writes (lines lost) */
};

static void write_all(recv_ledger_t *lg, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(lg->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            pthread_mutex_lock(&lg->mu);
            lg->write_errors++;
            pthread_mutex_unlock(&lg->mu);
            sl_error("ledger", "ledger_write_failed", "could not write the ledger: %s",
                     strerror(e));
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void *flusher_main(void *arg)
{
    recv_ledger_t *lg = arg;
    char *spare = NULL;
    size_t spare_cap = 0;

    pthread_mutex_lock(&lg->mu);
    for (;;) {
        if (!lg->stopping && lg->active_len < RECV_LEDGER_SOFT_BYTES) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += (long)RECV_LEDGER_FLUSH_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&lg->cv_flush, &lg->mu, &ts);
        }
        bool stop = lg->stopping;
        if (lg->active_len > 0) {
            /* Swap: appenders continue into the (empty) spare while we write. */
            char *full = lg->active;
            size_t full_len = lg->active_len;
            size_t full_cap = lg->active_cap;
            lg->active = spare;
            lg->active_cap = spare_cap;
            lg->active_len = 0;
            pthread_cond_broadcast(&lg->cv_space);
            pthread_mutex_unlock(&lg->mu);
            write_all(lg, full, full_len);
            spare = full;
            spare_cap = full_cap;
            pthread_mutex_lock(&lg->mu);
            continue; /* re-check: more may have arrived, and stop drains everything */
        }
        if (stop)
            break;
    }
    pthread_mutex_unlock(&lg->mu);
    free(spare);
    return NULL;
}

int recv_ledger_open(const char *path, recv_ledger_t **out, sl_err_t *err)
{
    recv_ledger_t *lg = sl_xcalloc(1, sizeof(*lg));
    pthread_condattr_t ca;
    int rc = 0;

    *out = NULL;
    lg->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (lg->fd < 0) {
        rc = -errno;
        sl_err_set(err, rc, "could not open ledger file %s: %s", path, strerror(errno));
        free(lg);
        return rc;
    }
    pthread_mutex_init(&lg->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&lg->cv_flush, &ca);
    pthread_cond_init(&lg->cv_space, &ca);
    pthread_condattr_destroy(&ca);
    rc = pthread_create(&lg->thread, NULL, flusher_main, lg);
    if (rc != 0) {
        sl_err_set(err, -rc, "could not start the ledger flusher: %s", strerror(rc));
        recv_ledger_close(lg);
        return -rc;
    }
    lg->thread_started = true;
    *out = lg;
    return 0;
}

void recv_ledger_append(recv_ledger_t *lg, const char *line, size_t len)
{
    pthread_mutex_lock(&lg->mu);
    while (lg->active_len + len > RECV_LEDGER_HARD_BYTES && lg->thread_started && !lg->stopping) {
        pthread_cond_signal(&lg->cv_flush);
        pthread_cond_wait(&lg->cv_space, &lg->mu);
    }
    if (lg->active_len + len > lg->active_cap) {
        size_t cap = lg->active_cap ? lg->active_cap : 64 * 1024;
        while (cap < lg->active_len + len)
            cap *= 2;
        lg->active = sl_xrealloc(lg->active, cap);
        lg->active_cap = cap;
    }
    memcpy(lg->active + lg->active_len, line, len);
    lg->active_len += len;
    lg->lines++;
    if (lg->active_len >= RECV_LEDGER_SOFT_BYTES)
        pthread_cond_signal(&lg->cv_flush);
    pthread_mutex_unlock(&lg->mu);
}

uint64_t recv_ledger_lines(recv_ledger_t *lg)
{
    pthread_mutex_lock(&lg->mu);
    uint64_t n = lg->lines;
    pthread_mutex_unlock(&lg->mu);
    return n;
}

uint64_t recv_ledger_write_errors(recv_ledger_t *lg)
{
    pthread_mutex_lock(&lg->mu);
    uint64_t n = lg->write_errors;
    pthread_mutex_unlock(&lg->mu);
    return n;
}

void recv_ledger_close(recv_ledger_t *lg)
{
    if (lg == NULL)
        return;
    pthread_mutex_lock(&lg->mu);
    lg->stopping = true;
    pthread_cond_broadcast(&lg->cv_flush);
    pthread_cond_broadcast(&lg->cv_space);
    pthread_mutex_unlock(&lg->mu);
    if (lg->thread_started)
        pthread_join(lg->thread, NULL);
    else if (lg->active_len > 0)
        write_all(lg, lg->active, lg->active_len);
    if (close(lg->fd) != 0)
        sl_error("ledger", "ledger_close_failed", "could not close the ledger: %s",
                 strerror(errno));
    pthread_cond_destroy(&lg->cv_flush);
    pthread_cond_destroy(&lg->cv_space);
    pthread_mutex_destroy(&lg->mu);
    free(lg->active);
    free(lg);
}
