/*
 * recv_sched: timer thread that resumes suspended MHD connections (contract in recv_sched.h).
 *
 * Data: a binary min-heap of struct recv_wait * ordered by due_ms, each entry knowing its own
 * slot (heap_idx) so peer-gone removal is O(log n). The heap array and the pollfd scratch
 * array grow by doubling and are never shrunk (bounded by MHD's connection limit).
 */
#include "recv_sched.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"

struct recv_sched {
    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t cv;       /* signalled on a new earliest due time and on stop */
    pthread_t thread;        /* the timer thread */
    bool thread_started;     /* thread must be joined */
    bool stopping;           /* refuse new suspensions; timer thread exits */
    struct recv_wait **heap; /* min-heap by due_ms; heap_len entries used */
    size_t heap_len;         /* entries */
    size_t heap_cap;         /* slots allocated */
    struct pollfd *pfd;      /* scratch for the peer-gone poll, pfd_cap slots */
    size_t pfd_cap;          /* slots allocated */
};

int64_t recv_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ==== heap (caller holds mu) ==== */

static void heap_set(recv_sched_t *s, size_t i, struct recv_wait *w)
{
    s->heap[i] = w;
    w->heap_idx = i;
}

static void sift_up(recv_sched_t *s, size_t i)
{
    struct recv_wait *w = s->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (s->heap[parent]->due_ms <= w->due_ms)
            break;
        heap_set(s, i, s->heap[parent]);
        i = parent;
    }
    heap_set(s, i, w);
}

static void sift_down(recv_sched_t *s, size_t i)
{
    struct recv_wait *w = s->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        int64_t best = w->due_ms;
        if (l < s->heap_len && s->heap[l]->due_ms < best) {
            m = l;
            best = s->heap[l]->due_ms;
        }
        if (r < s->heap_len && s->heap[r]->due_ms < best)
            m = r;
        if (m == i)
            break;
        heap_set(s, i, s->heap[m]);
        i = m;
    }
    heap_set(s, i, w);
}

static void heap_push(recv_sched_t *s, struct recv_wait *w)
{
    if (s->heap_len == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 256;
        s->heap = sl_xrealloc(s->heap, s->heap_cap * sizeof(*s->heap));
    }
    heap_set(s, s->heap_len++, w);
    sift_up(s, w->heap_idx);
}

static void heap_remove(recv_sched_t *s, struct recv_wait *w)
{
    size_t i = w->heap_idx;
    struct recv_wait *last = s->heap[--s->heap_len];
    w->heap_idx = SIZE_MAX;
    if (i == s->heap_len)
        return;
    heap_set(s, i, last);
    if (i > 0 && s->heap[(i - 1) / 2]->due_ms > last->due_ms)
        sift_up(s, i);
    else
        sift_down(s, i);
}

/* Remove w and hand the connection back to MHD (caller holds mu). */
static void wake(recv_sched_t *s, struct recv_wait *w, enum recv_wake why)
{
    heap_remove(s, w);
    w->wake = why;
    sl_httpd_resume(w->loop, w->conn);
}

/* ==== timer thread ==== */

/* Resume waiting requests whose client closed the socket (caller holds mu). */
static void watch_peers(recv_sched_t *s)
{
    if (s->heap_len == 0)
        return;
    if (s->pfd_cap < s->heap_len) {
        s->pfd_cap = s->heap_cap;
        s->pfd = sl_xrealloc(s->pfd, s->pfd_cap * sizeof(*s->pfd));
    }
    size_t n = s->heap_len;
    for (size_t i = 0; i < n; i++) {
        s->pfd[i].fd = s->heap[i]->fd; /* negative fds are ignored by poll */
        s->pfd[i].events = POLLRDHUP;
        s->pfd[i].revents = 0;
    }
    if (poll(s->pfd, (nfds_t)n, 0) <= 0)
        return;
    /* Collect first (waking reorders the heap), then wake. The pfd index still names the
     * request because nothing was removed in between. */
    struct recv_wait **gone = sl_xmalloc(n * sizeof(*gone));
    size_t ngone = 0;
    for (size_t i = 0; i < n; i++) {
        if (s->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
            gone[ngone++] = s->heap[i];
    }
    for (size_t i = 0; i < ngone; i++)
        wake(s, gone[i], RECV_WAKE_PEER_GONE);
    free(gone);
}

static void deadline_ts(int64_t mono_ms, struct timespec *ts)
{
    ts->tv_sec = (time_t)(mono_ms / 1000);
    ts->tv_nsec = (long)(mono_ms % 1000) * 1000000L;
}

static void *timer_main(void *arg)
{
    recv_sched_t *s = arg;
    int64_t next_watch = recv_mono_ms() + RECV_SCHED_WATCH_MS;

    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        int64_t now = recv_mono_ms();
        while (s->heap_len > 0 && s->heap[0]->due_ms <= now)
            wake(s, s->heap[0], RECV_WAKE_DUE);
        if (now >= next_watch) {
            watch_peers(s);
            next_watch = now + RECV_SCHED_WATCH_MS;
        }
        if (s->heap_len == 0) {
            /* Nothing waits: sleep until a suspension or stop; restart the watch period. */
            pthread_cond_wait(&s->cv, &s->mu);
            next_watch = recv_mono_ms() + RECV_SCHED_WATCH_MS;
            continue;
        }
        int64_t until = s->heap[0]->due_ms < next_watch ? s->heap[0]->due_ms : next_watch;
        struct timespec ts;
        deadline_ts(until, &ts);
        int rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (rc != 0 && rc != ETIMEDOUT)
            sl_error("sched", "timer_wait_failed", "could not wait on the timer: %s", strerror(rc));
    }
    while (s->heap_len > 0)
        wake(s, s->heap[s->heap_len - 1], RECV_WAKE_SHUTDOWN);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ==== public ==== */

int recv_sched_new(recv_sched_t **out, sl_err_t *err)
{
    recv_sched_t *s = sl_xcalloc(1, sizeof(*s));
    pthread_condattr_t ca;
    int rc;

    *out = NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    rc = pthread_create(&s->thread, NULL, timer_main, s);
    if (rc != 0) {
        sl_err_set(err, -rc, "could not start the timer thread: %s", strerror(rc));
        recv_sched_destroy(s);
        return -rc;
    }
    s->thread_started = true;
    *out = s;
    return 0;
}

int recv_sched_suspend(recv_sched_t *s, struct recv_wait *w, int64_t due_ms)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return SL_ESTATE;
    }
    w->due_ms = due_ms;
    w->wake = RECV_WAKE_NONE;
    w->loop = sl_httpd_loop_current(); /* called on the loop serving the connection */
    MHD_suspend_connection(w->conn);
    heap_push(s, w);
    if (w->heap_idx == 0)
        pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

size_t recv_sched_waiting(recv_sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->heap_len;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void recv_sched_stop(recv_sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) {
        pthread_join(s->thread, NULL);
        s->thread_started = false;
    }
}

void recv_sched_destroy(recv_sched_t *s)
{
    if (s == NULL)
        return;
    recv_sched_stop(s);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->heap);
    free(s->pfd);
    free(s);
}
