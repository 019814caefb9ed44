/*
 * sl_httpd: libmicrohttpd daemons on loop threads of our own (see sl_httpd.h for why).
 *
 * Owns the listening socket the daemons share, one daemon and one thread per loop, each
 * loop's wake-up eventfd and liveness beat, and the commands that move every loop forward
 * together: RUN -> QUIESCE (each loop quiesces its own daemon, on its own thread) -> STOP.
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
#include <unistd.h>

#include "common/sl_kafka.h" /* sl_mono_ms */
#include "common/sl_mem.h"
#include "common/sl_probe.h"

/* What the loops are asked to do; only ever moves forward. */
enum loop_cmd { LOOP_RUN, LOOP_QUIESCE, LOOP_STOP };

struct sl_httpd_loop {
    struct sl_httpd *h;
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
    struct MHD_OptionItem opts[8];
    size_t n = 0;
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, limit, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s, NULL};
    if (o->conn_memory)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                            (intptr_t)o->conn_memory, NULL};
    if (o->on_completed)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)o->on_completed,
                                            o->completed_cls};
    if (o->on_connection)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION,
                                            (intptr_t)o->on_connection, o->connection_cls};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    /* the logger goes first so libmicrohttpd never falls back to its own stderr logging */
    l->d = o->log ? MHD_start_daemon(flags, 0, NULL, NULL, o->on_request, o->request_cls,
                                     MHD_OPTION_EXTERNAL_LOGGER, o->log, o->log_cls,
                                     MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->lsock,
                                     MHD_OPTION_ARRAY, opts, MHD_OPTION_END)
                  : MHD_start_daemon(flags, 0, NULL, NULL, o->on_request, o->request_cls,
                                     MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->lsock,
                                     MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
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
    }
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
