/*
 * sl_httpd: libmicrohttpd daemons run on loop threads of our own (sluice-api, sluice-receiver).
 *
 * `threads` loops, each running one daemon (epoll) on a listening socket they all share, as
 * libmicrohttpd's thread pool does. Not libmicrohttpd's internal threads: their loop (0.9.75,
 * and upstream still) calls epoll_wait again with the full timeout whenever one call returned
 * exactly its 128-event maximum, so a thread holding 128 ready connections served none of
 * them until some other event came (up to the idle timeout). A loop here waits itself (poll
 * on the daemon's epoll set, bounded by MHD_get_timeout and by one second) and then runs
 * MHD_run, whose epoll_waits never block.
 *
 * A daemon run this way has no wake-up of its own (libmicrohttpd drops MHD_USE_ITC without
 * an internal thread), so a connection suspended on a loop must be resumed with
 * sl_httpd_resume, which wakes its loop: note sl_httpd_loop_current() when suspending.
 *
 * Slow clients: libmicrohttpd's connection timeout closes a connection only once nothing
 * moves on it for idle_timeout_s, so a client trickling a byte now and then would hold its
 * slot for ever. With request_timeout_s, each connection must deliver a whole request
 * (headers and body) within that many seconds of opening or of its previous answer; a loop
 * looks once a second and shuts the socket of one that did not (libmicrohttpd then closes
 * it). A request held by the server (suspended while it waits for Kafka) is not the client's
 * time and never counts.
 *
 * HTTPS: given a certificate and key (PEM text), every loop serves TLS through libmicrohttpd's
 * GnuTLS; the caller keeps both strings until sl_httpd_stop.
 *
 * Threads: sl_httpd_start/quiesce/stop from one controlling thread; sl_httpd_resume from
 * any; the callbacks run on the loops.
 */
#ifndef SL_HTTPD_H
#define SL_HTTPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/sl_err.h"

typedef struct sl_httpd sl_httpd_t;
typedef struct sl_httpd_loop sl_httpd_loop_t;

struct sl_httpd_opts {
    const struct sockaddr_storage *addr; /* where to listen (port 0: an ephemeral one) */
    const char *what;                    /* names the address in errors ("api_listen") */
    unsigned threads;                    /* loops, at least 1 (at most max_conns) */
    unsigned max_conns;                  /* open connections, shared out over the loops */
    unsigned idle_timeout_s;             /* an idle or stalled connection is closed; 0 never */
    unsigned request_timeout_s;          /* a whole request within this of the connection's
                                          * opening or previous answer, else closed; 0 never */
    size_t conn_memory;                  /* per-connection pool; 0: libmicrohttpd's default */
    int backlog;                         /* listen(2) backlog; 0: SOMAXCONN */
    const char *tls_cert_pem;            /* HTTPS: certificate chain (PEM text); NULL plain HTTP */
    const char *tls_key_pem;             /* HTTPS: its private key (PEM text, unencrypted) */
    const char *thread_name;             /* loops' thread name (at most 15 characters) */
    bool beat;                           /* each loop beats the liveness probe (sl_probe) */
    MHD_AccessHandlerCallback on_request;
    void *request_cls;
    MHD_RequestCompletedCallback on_completed; /* optional */
    void *completed_cls;
    MHD_NotifyConnectionCallback on_connection; /* optional; its socket_context is the one
                                                 * sl_httpd_conn_ctx returns */
    void *connection_cls;
    MHD_LogCallback log; /* optional: libmicrohttpd's messages */
    void *log_cls;
};

/* Listen and start the loops. NULL and err on failure. */
sl_httpd_t *sl_httpd_start(const struct sl_httpd_opts *o, sl_err_t *err);
/* The port listened on (the ephemeral one for port 0). */
unsigned sl_httpd_port(const sl_httpd_t *h);
/* The loop of the calling thread; NULL outside the loops. */
sl_httpd_loop_t *sl_httpd_loop_current(void);
/* The context on_connection set for conn (NULL when none; on conn's loop). */
void *sl_httpd_conn_ctx(struct MHD_Connection *conn);
/* Connections closed for not sending a whole request within request_timeout_s, so far. */
uint64_t sl_httpd_timed_out(const sl_httpd_t *h);
/* Resume conn, suspended on loop l, and wake l (any thread). */
void sl_httpd_resume(sl_httpd_loop_t *l, struct MHD_Connection *conn);
/* Stop accepting new connections (idempotent; each loop quiesces on its next turn). */
void sl_httpd_quiesce(sl_httpd_t *h);
/* End the loops, close every connection, free h (NULL-safe). No connection may still be
 * suspended (libmicrohttpd's rule); one resumed after its loop's last turn is closed too. */
void sl_httpd_stop(sl_httpd_t *h);

#endif /* SL_HTTPD_H */
