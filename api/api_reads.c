/*
 * api_reads: the delivery log's reads run on threads of their own, not on the HTTP loops.
 *
 * A history read (an event's deliveries, event types seen, dead letters and their patterns,
 * endpoint statistics and latency) waits for PostgreSQL, up to its statement timeout. On a
 * loop thread that wait would hold every other connection of the loop, publishes included:
 * one heavy query by a read key could stall half the API's publishes. So a route marked
 * `reads` is handed here: its connection is suspended, one of api_read_threads threads runs
 * the route's handler (with its own PostgreSQL connection, api_pg being per thread), stores
 * the answer in the request and resumes the connection, whose loop then sends it.
 *
 * Requests wait in one FIFO. One that waited API_READ_WAIT_MAX_MS for a thread (the threads
 * busy with slow queries) is answered 503 with Retry-After rather than run late. Shutdown:
 * api_server_quiesce counts them as requests in flight; api_reads_stop then answers 503 to
 * those still queued, lets the running ones finish and ends the threads; a read submitted
 * after that is answered 503 at once. The queue itself is freed (api_reads_free) only once
 * the HTTP loops have stopped, as they may still submit until then.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include <microhttpd.h>

#include "api/api.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_time.h"

#define API_READ_WAIT_MAX_MS 30000 /* longest a read waits for a thread before a 503 */

struct api_reads {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct api_req *head, *tail; /* waiting requests (api_req.next_read) */
    bool stop;
    size_t nthreads;
    pthread_t *threads;
};

/* On the loop, once resumed: the answer is in r already. */
static enum api_hret answered(struct api_req *r)
{
    r->finish = NULL;
    return API_DONE;
}

/* Serve r (a worker thread): run its handler, or answer 503 when it waited too long or the
 * server is stopping; then resume its connection, whose loop sends the answer. */
static void run_one(struct api_req *r, bool stopping)
{
    if (stopping) {
        r->retry_after_s = 1;
        api_problem(r, 503, "shutting-down", NULL,
                    "this instance is stopping; another one will answer");
    } else if (sl_mono_ms() - r->read_queued_ms > API_READ_WAIT_MAX_MS) {
        r->retry_after_s = 2;
        api_problem(r, 503, "history-unavailable", NULL,
                    "the delivery log's readers are all busy with slow queries");
    } else if (r->route->fn(r) == API_SUSPENDED) { /* a reads route never suspends: a bug */
        api_problem(r, 500, "internal", NULL, "the read could not be served");
    }
    api_req_resume(r);
}

static void *read_main(void *arg)
{
    struct api_reads *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        struct api_req *r = q->head;
        if (!r)
            break; /* stopping with nothing left */
        q->head = r->next_read;
        if (!q->head)
            q->tail = NULL;
        bool stopping = q->stop;
        pthread_mutex_unlock(&q->mu);
        run_one(r, stopping);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

api_reads_t *api_reads_start(size_t nthreads, sl_err_t *err)
{
    api_reads_t *q = sl_xcalloc(1, sizeof(*q));
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->threads = sl_xcalloc(nthreads, sizeof(*q->threads));
    for (; q->nthreads < nthreads; q->nthreads++) {
        if (pthread_create(&q->threads[q->nthreads], NULL, read_main, q) != 0) {
            sl_err_set(err, SL_EIO, "could not start the history read threads");
            api_reads_free(q);
            return NULL;
        }
        (void)pthread_setname_np(q->threads[q->nthreads], "api-read");
    }
    return q;
}

enum api_hret api_reads_submit(api_reads_t *q, struct api_req *r)
{
    pthread_mutex_lock(&q->mu);
    if (q->stop) { /* the threads are gone or going: answered here, never suspended */
        pthread_mutex_unlock(&q->mu);
        r->retry_after_s = 1;
        return api_problem(r, 503, "shutting-down", NULL,
                           "this instance is stopping; another one will answer");
    }
    r->finish = answered;
    r->next_read = NULL;
    r->read_queued_ms = sl_mono_ms();
    /* under the lock: no worker can take r (and resume it) before it is suspended */
    MHD_suspend_connection(r->conn);
    if (q->tail)
        q->tail->next_read = r;
    else
        q->head = r;
    q->tail = r;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return API_SUSPENDED;
}

void api_reads_stop(api_reads_t *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (size_t i = 0; i < q->nthreads; i++)
        pthread_join(q->threads[i], NULL);
    q->nthreads = 0; /* a second call joins nothing */
}

void api_reads_free(api_reads_t *q)
{
    if (!q)
        return;
    api_reads_stop(q);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->threads);
    free(q);
}
