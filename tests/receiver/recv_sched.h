/*
 * recv_sched: delays without blocking an HTTP loop thread (common/sl_httpd).
 *
 * A request that must wait (slow/<ms>, ?delay_ms=, the ~1 MB/s pacing of endless, hang) is
 * suspended with MHD_suspend_connection() and put in a min-heap keyed by its due time; one
 * timer thread resumes it when due (sl_httpd_resume, which wakes its loop), and MHD then calls the
 * handler (or content reader) again. So 10 000 sleeping requests cost 10 000 heap slots, not 10 000
 * threads, and a 10 s delay on one endpoint never slows another.
 *
 * While a connection is suspended MHD does not notice the client going away, so every
 * RECV_SCHED_WATCH_MS the timer thread also polls the sockets of all waiting requests for
 * POLLRDHUP/POLLHUP/POLLERR and resumes those with RECV_WAKE_PEER_GONE (the handler then
 * closes them). A client that half-closes its sending side while waiting is treated as gone.
 *
 * MHD forbids MHD_stop_daemon() while connections are suspended: recv_sched_stop() resumes
 * everything with RECV_WAKE_SHUTDOWN and refuses later suspensions (SL_ESTATE), so the
 * handler must answer or close instead of waiting once stopping.
 *
 * Locking: one mutex guards the heap. Suspension happens under it (suspend first, then
 * insert, so the timer can never resume a connection that is not yet suspended), and so does
 * resumption. Lock order: sched mutex, then MHD's internal mutexes; MHD never calls back into
 * us while holding those.
 *
 * thread: recv_sched_suspend from MHD handler / content-reader callbacks only (MHD's rule for
 * MHD_suspend_connection); recv_sched_new/stop/destroy from the main thread.
 */
#ifndef SL_RECV_SCHED_H
#define SL_RECV_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "common/sl_err.h"
#include "common/sl_httpd.h"

#define RECV_SCHED_WATCH_MS 250       /* period of the peer-gone poll over waiting sockets, ms */
#define RECV_DUE_NEVER      INT64_MAX /* due time of a request that waits until shutdown */

/* Why a suspended request was resumed (written by the timer thread before resuming). */
enum recv_wake {
    RECV_WAKE_NONE = 0,      /* not resumed yet / never suspended */
    RECV_WAKE_DUE = 1,       /* its due time passed */
    RECV_WAKE_PEER_GONE = 2, /* the client closed its side of the socket */
    RECV_WAKE_SHUTDOWN = 3,  /* the receiver is stopping */
};

/* One waiting request; embedded in the caller's per-request state, which must outlive the
 * wait (it does: MHD cannot complete a suspended request). */
struct recv_wait {
    struct MHD_Connection *conn; /* borrowed; set by the caller before suspending */
    sl_httpd_loop_t *loop;       /* the loop it is suspended on (recv_sched_suspend sets it) */
    int fd;                      /* the connection's socket, polled for peer close; -1 = none */
    int64_t due_ms;              /* monotonic ms; RECV_DUE_NEVER = until peer gone/shutdown */
    size_t heap_idx;             /* slot in the heap; SIZE_MAX when not queued */
    enum recv_wake wake;         /* OUT: why it was last resumed */
};

typedef struct recv_sched recv_sched_t;

/* Start the timer thread. *out (OUT) is freed with recv_sched_destroy. Returns 0 or -errno. */
int recv_sched_new(recv_sched_t **out, sl_err_t *err);

/*
 * Suspend w->conn until due_ms (monotonic ms) or peer close or shutdown. Sets w->wake to
 * RECV_WAKE_NONE. Returns 0, or SL_ESTATE (connection NOT suspended) once stopping.
 * Call only from an MHD access handler or content reader of w->conn.
 */
int recv_sched_suspend(recv_sched_t *s, struct recv_wait *w, int64_t due_ms);

/* Number of requests currently waiting (for /_stats). */
size_t recv_sched_waiting(recv_sched_t *s);

/* Resume every waiting request with RECV_WAKE_SHUTDOWN, refuse new ones, join the timer
 * thread. Idempotent. Call before MHD_stop_daemon. */
void recv_sched_stop(recv_sched_t *s);

/* Stop (if not yet) and free (NULL-safe). */
void recv_sched_destroy(recv_sched_t *s);

/* Monotonic clock in ms (CLOCK_MONOTONIC), the time base of due_ms. */
int64_t recv_mono_ms(void);

#endif /* SL_RECV_SCHED_H */
