/*
 * sl_httpd: libmicrohttpd daemons on loop threads of our own (see sl_httpd.h for why).
 *
 * Owns the listening socket the daemons share, one daemon and one thread per loop, each
 * loop's wake-up eventfd and liveness beat, and the commands that move every loop forward
 * together: RUN -> QUIESCE (each loop quiesces its own daemon, on its own thread) -> STOP.
 * Also each loop's list of its connections, for the request deadline (sl_httpd.h): the
 * callbacks given are wrapped so that a connection's clock restarts when it opens and when a
 * request completes, and stops once its request is whole.
 */
#include "common/sl_httpd.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sl_hex.h"
#include "common/sl_kafka.h" /* sl_mono_ms */
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_probe.h"
#include "common/sl_time.h"

/* What the loops are asked to do; only ever moves forward. */
enum loop_cmd { LOOP_RUN, LOOP_QUIESCE, LOOP_STOP };

/* One open connection (its libmicrohttpd socket context), on its loop's list. */
struct conn {
    struct conn *prev, *next;
    struct MHD_Connection *c;
    int64_t since_ms; /* the request deadline counts from here */
    bool receiving;   /* the client owes a whole request (false once it came) */
    bool in_request;  /* the handler has seen this request */
    bool cut;         /* its socket was shut for the deadline */
    void *user;       /* on_connection's socket context */
};

struct sl_httpd_loop {
    struct sl_httpd *h;
    struct conn conns; /* list head (sentinel): the loop's connections */
    int64_t swept_ms;  /* last deadline sweep */
    struct MHD_Daemon *d;
    pthread_t thr;
    bool started;
    int wake;             /* eventfd: a new command, or a resumed connection */
    atomic_bool wake_set; /* wake written and not yet consumed: resumes need not write */
    atomic_bool quiesced; /* this loop's daemon no longer accepts */
    int beat;             /* liveness slot, -1 when none */
};

struct sl_httpd {
    int lsock;      /* the listening socket every daemon accepts from; ours, closed last */
    unsigned port;  /* bound port */
    atomic_int cmd; /* enum loop_cmd */
    size_t n;
    struct sl_httpd_loop *loops;
    struct sl_httpd_opts o;     /* the callbacks the wrappers call */
    int64_t request_timeout_ms; /* 0 = no deadline */
    _Atomic uint64_t timed_out; /* connections cut for the deadline */
};

static _Thread_local struct sl_httpd_loop *tl_loop;

sl_httpd_loop_t *sl_httpd_loop_current(void)
{
    return tl_loop;
}

unsigned sl_httpd_port(const sl_httpd_t *h)
{
    return h->port;
}

/* Wake l's thread; writes the eventfd only when no earlier wake is still pending. */
static void loop_wake(struct sl_httpd_loop *l)
{
    if (!atomic_exchange(&l->wake_set, true)) {
        uint64_t one = 1;
        (void)!write(l->wake, &one, sizeof(one));
    }
}

void sl_httpd_resume(sl_httpd_loop_t *l, struct MHD_Connection *conn)
{
    MHD_resume_connection(conn);
    loop_wake(l);
}

/* ==== the connections and the request deadline ==== */

static struct conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void *sl_httpd_conn_ctx(struct MHD_Connection *c)
{
    struct conn *n = conn_of(c);
    return n ? n->user : NULL;
}

uint64_t sl_httpd_timed_out(const sl_httpd_t *h)
{
    return atomic_load(&h->timed_out);
}

static void on_conn(void *cls,
                    struct MHD_Connection *c,
                    void **socket_context,
                    enum MHD_ConnectionNotificationCode toe)
{
    struct sl_httpd *h = cls;
    struct conn *n = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) { /* on the loop that accepted it */
        struct sl_httpd_loop *l = tl_loop;
        n = sl_xcalloc(1, sizeof(*n));
        n->c = c;
        n->since_ms = sl_mono_ms();
        n->receiving = true;
        if (l) {
            n->next = l->conns.next;
            n->prev = &l->conns;
            l->conns.next->prev = n;
            l->conns.next = n;
        }
        *socket_context = n;
        if (h->o.on_connection)
            h->o.on_connection(h->o.connection_cls, c, &n->user, toe);
        return;
    }
    if (!n)
        return;
    if (h->o.on_connection)
        h->o.on_connection(h->o.connection_cls, c, &n->user, toe);
    if (n->next) { /* (closed by MHD_stop_daemon after the loops ended: the lists are idle) */
        n->prev->next = n->next;
        n->next->prev = n->prev;
    }
    free(n);
    *socket_context = NULL;
}

static enum MHD_Result on_req(void *cls,
                              struct MHD_Connection *c,
                              const char *url,
                              const char *method,
                              const char *version,
                              const char *upload_data,
                              size_t *upload_data_size,
                              void **con_cls)
{
    struct sl_httpd *h = cls;
    struct conn *n = conn_of(c);
    if (n) {
        if (n->in_request && *upload_data_size == 0)
            n->receiving = false; /* headers and body are in: the rest is the server's time */
        n->in_request = true;
    }
    return h->o.on_request(h->o.request_cls, c, url, method, version, upload_data, upload_data_size,
                           con_cls);
}

static void
on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct sl_httpd *h = cls;
    struct conn *n = conn_of(c);
    if (n) { /* the next request's clock starts now */
        n->in_request = false;
        n->receiving = true;
        n->since_ms = sl_mono_ms();
    }
    if (h->o.on_completed)
        h->o.on_completed(h->o.completed_cls, c, con_cls, toe);
}

/* Shut the socket of every connection of l past the request deadline (at most once a
 * second); libmicrohttpd sees the socket end and closes the connection. */
static void sweep(struct sl_httpd_loop *l, int64_t now)
{
    struct sl_httpd *h = l->h;
    if (h->request_timeout_ms <= 0 || now - l->swept_ms < 1000)
        return;
    l->swept_ms = now;
    unsigned cut = 0;
    for (struct conn *n = l->conns.next; n != &l->conns; n = n->next) {
        if (!n->receiving || n->cut || now - n->since_ms < h->request_timeout_ms)
            continue;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(n->c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci && shutdown(ci->connect_fd, SHUT_RDWR) == 0) {
            n->cut = true;
            cut++;
        }
    }
    if (cut > 0) {
        atomic_fetch_add(&h->timed_out, cut);
        SL_LOG_EVERY(10000, SL_LOG_WARN, "http", "request_timeout",
                     "closed %u connection(s) that did not send a whole request within %lld s "
                     "(slow or stalled clients)",
                     cut, (long long)(h->request_timeout_ms / 1000));
    }
}

/* One loop thread: wait for the daemon's epoll set (or a command), then run the daemon. */
static void *loop_main(void *arg)
{
    struct sl_httpd_loop *l = arg;
    tl_loop = l;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_EPOLL_FD);
    int efd = di ? di->epoll_fd : -1;
    for (;;) {
        int cmd = atomic_load(&l->h->cmd);
        if (cmd >= LOOP_QUIESCE && !atomic_load(&l->quiesced)) {
            (void)MHD_quiesce_daemon(l->d); /* the socket stays ours: stop closes it */
            atomic_store(&l->quiesced, true);
        }
        if (cmd == LOOP_STOP)
            break;
        sl_probe_beat(l->beat, sl_mono_ms());
        MHD_UNSIGNED_LONG_LONG to = 1000;
        int ms = 1000; /* at least once a second: the liveness beat */
        if (MHD_get_timeout(l->d, &to) == MHD_YES && to < 1000)
            ms = (int)to;
        struct pollfd p[2] = {{efd, POLLIN, 0}, {l->wake, POLLIN, 0}};
        if (poll(p, 2, ms) > 0 && (p[1].revents & POLLIN)) {
            uint64_t v;
            (void)!read(l->wake, &v, sizeof(v));
            /* before MHD_run: a resume after this point writes again (see loop_wake) */
            atomic_store(&l->wake_set, false);
        }
        (void)MHD_run(l->d);
        sweep(l, sl_mono_ms());
    }
    return NULL;
}

static void loops_command(struct sl_httpd *h, enum loop_cmd cmd)
{
    atomic_store(&h->cmd, (int)cmd);
    for (size_t i = 0; i < h->n; i++) {
        uint64_t one = 1;
        if (h->loops[i].wake >= 0) /* always written: a pending wake may be consumed already */
            (void)!write(h->loops[i].wake, &one, sizeof(one));
    }
}

/* The listening socket the daemons share (non-blocking: a connection another loop took
 * leaves accept() with EAGAIN, not blocked). */
static int listen_socket(const struct sl_httpd_opts *o, unsigned *port, sl_err_t *err)
{
    const struct sockaddr_storage *ss = o->addr;
    socklen_t len = ss->ss_family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                                              : (socklen_t)sizeof(struct sockaddr_in);
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int on = 1;
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        (ss->ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on)) != 0) ||
        bind(fd, (const struct sockaddr *)ss, len) != 0 ||
        listen(fd, o->backlog > 0 ? o->backlog : SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&bound, &blen) != 0) {
        sl_err_set(err, SL_EIO, "could not listen on %s: %s", o->what, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    return fd;
}

/*
 * The path and the query's names and values, percent-decoded in place as libmicrohttpd's own
 * unescaper does, except "%00", which stays as it is: decoded, its NUL would end the C string
 * the handlers read, so "/v1/endpoints/a%00b" would name endpoint "a". Kept, the '%' makes
 * such an id invalid wherever it is checked. Returns the new length.
 */
static size_t unescape_keep_nul(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    char *w = s;
    for (const char *p = s; *p; p++) {
        int hi, lo;
        if (p[0] == '%' && (hi = sl_hex_digit(p[1])) >= 0 && (lo = sl_hex_digit(p[2])) >= 0 &&
            (hi | lo) != 0) {
            *w++ = (char)(hi * 16 + lo);
            p += 2;
        } else {
            *w++ = *p;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* Start loop i's daemon and thread. */
static int loop_start(struct sl_httpd *h, const struct sl_httpd_opts *o, size_t i, sl_err_t *err)
{
    struct sl_httpd_loop *l = &h->loops[i];
    /* no MHD_USE_INTERNAL_POLLING_THREAD: loop_main runs the daemon */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (o->addr->ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* every loop gets a share of the connections, as libmicrohttpd's pool divides them */
    unsigned limit = (unsigned)(o->max_conns / h->n + (i < o->max_conns % h->n ? 1 : 0));
    struct MHD_OptionItem opts[11];
    size_t n = 0;
    if (o->tls_cert_pem) {
        flags |= MHD_USE_TLS;
        opts[n++] =
            (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)(uintptr_t)o->tls_key_pem};
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0,
                                            (void *)(uintptr_t)o->tls_cert_pem};
    }
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, limit, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s, NULL};
    if (o->conn_memory)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                            (intptr_t)o->conn_memory, NULL};
    /* ours, calling the caller's (see "the connections and the request deadline") */
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_done, h};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_conn, h};
    opts[n++] =
        (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape_keep_nul, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    /* the logger goes first so libmicrohttpd never falls back to its own stderr logging */
    l->d = o->log ? MHD_start_daemon(flags, 0, NULL, NULL, on_req, h, MHD_OPTION_EXTERNAL_LOGGER,
                                     o->log, o->log_cls, MHD_OPTION_LISTEN_SOCKET,
                                     (MHD_socket)h->lsock, MHD_OPTION_ARRAY, opts, MHD_OPTION_END)
                  : MHD_start_daemon(flags, 0, NULL, NULL, on_req, h, MHD_OPTION_LISTEN_SOCKET,
                                     (MHD_socket)h->lsock, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    l->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!l->d || l->wake < 0)
        return sl_err_set(err, SL_EIO, "could not start HTTP loop %zu of %zu on %s", i + 1, h->n,
                          o->what);
    if (o->beat)
        l->beat = sl_probe_beat_register(o->thread_name ? o->thread_name : "http loop");
    if (pthread_create(&l->thr, NULL, loop_main, l) != 0)
        return sl_err_set(err, SL_EIO, "could not start HTTP loop thread %zu of %zu", i + 1, h->n);
    l->started = true;
#ifdef __GLIBC__
    if (o->thread_name)
        (void)pthread_setname_np(l->thr, o->thread_name);
#endif
    return 0;
}

sl_httpd_t *sl_httpd_start(const struct sl_httpd_opts *o, sl_err_t *err)
{
    if (o->tls_cert_pem &&
        (!o->tls_key_pem || MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)) {
        sl_err_set(err, SL_EINVAL,
                   "%s: HTTPS needs a key with the certificate and a libmicrohttpd "
                   "built with TLS",
                   o->what);
        return NULL;
    }
    struct sl_httpd *h = sl_xcalloc(1, sizeof(*h));
    h->lsock = listen_socket(o, &h->port, err);
    if (h->lsock < 0) {
        free(h);
        return NULL;
    }
    unsigned threads = o->threads > 0 ? o->threads : 1;
    unsigned max = o->max_conns > 0 ? o->max_conns : 1;
    h->n = threads < max ? threads : max;
    h->loops = sl_xcalloc(h->n, sizeof(*h->loops));
    for (size_t i = 0; i < h->n; i++) {
        h->loops[i].h = h;
        h->loops[i].wake = -1;
        h->loops[i].beat = -1;
        h->loops[i].conns.next = h->loops[i].conns.prev = &h->loops[i].conns;
    }
    h->o = *o;
    h->request_timeout_ms = (int64_t)o->request_timeout_s * 1000;
    struct sl_httpd_opts oo = *o;
    oo.max_conns = max;
    for (size_t i = 0; i < h->n; i++) {
        if (loop_start(h, &oo, i, err) != 0) {
            sl_httpd_stop(h);
            return NULL;
        }
    }
    return h;
}

void sl_httpd_quiesce(sl_httpd_t *h)
{
    if (h && atomic_load(&h->cmd) < LOOP_QUIESCE)
        loops_command(h, LOOP_QUIESCE);
}

void sl_httpd_stop(sl_httpd_t *h)
{
    if (!h)
        return;
    loops_command(h, LOOP_STOP);
    for (size_t i = 0; i < h->n; i++) {
        struct sl_httpd_loop *l = &h->loops[i];
        if (l->started)
            pthread_join(l->thr, NULL);
        sl_probe_beat_release(l->beat);
        if (l->d) {
            if (!atomic_load(&l->quiesced))
                (void)MHD_quiesce_daemon(l->d); /* else MHD_stop_daemon closes the shared socket */
            MHD_stop_daemon(l->d);
        }
        if (l->wake >= 0)
            close(l->wake);
    }
    free(h->loops);
    close(h->lsock);
    free(h);
}
