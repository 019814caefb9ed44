/*
 * cons_http: libcurl multi_socket + epoll engine (see cons_http.h).
 *
 * Ownership: each running transfer has a struct xfer (pooled with its easy handle). The
 * request's pointers are borrowed from the caller until its done callback returns. Sockets
 * are registered in epoll from curl's socket callback; curl's timer callback sets a deadline
 * that cons_http_run honours.
 */
#include "consumer/cons_http.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "common/sl_fault.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_time.h"
#include "common/sl_url.h"
#include "consumer/cons_list.h"

/*
 * Connection caches. libcurl 7.88 scans a host's whole connection list to find an idle one
 * for each request (ConnectionExists), and curl_multi_remove_handle walks the whole cache
 * after each one (close_connect_only): per-request CPU grows with the connections open to
 * one host. With thousands in flight to one host that tripled the consumer's CPU per
 * delivery (bench/README.md, "Consumer CPU"). So the easy handles are spread over
 * CONN_CACHES share objects that each hold their own connection cache (CURL_LOCK_DATA_CONNECT):
 * a scan covers about 1/CONN_CACHES of the connections. A connection is reused only by the
 * handles of its cache; all of them are on this one thread, so the shares need no lock
 * callbacks.
 *
 * Which cache a request uses follows its origin (scheme, host and port: what libcurl reuses
 * a connection for), so that the next request to a quiet origin finds its idle connection:
 * while fewer than CONNS_PER_CACHE requests run to an origin, the next one uses the origin's
 * home cache (picked by a hash of the origin); the requests beyond those take the idle
 * handle freed last, of whichever cache. Were every request to take that handle, a quiet
 * endpoint among busy ones would open a new connection whenever the handle's cache held none
 * of its own (4 connections for 12 deliveries in tests/e2e/test_connection_reuse.py, against
 * 1 this way; over HTTPS each a full handshake, about 1 ms of the consumer's CPU here), while
 * its idle connections waited in other caches until the server closed them. The handle freed
 * last is the one whose connection was just used: a busy origin's requests keep to the
 * connections used last, which costs both sides less than going round them all (that cost
 * 5-6% more of the consumer's CPU and 10-13% more of the receiver's per delivery in an e2e
 * drain: bench/results/2026-12-05-intel-consumer-origin-caches-ab.txt).
 *
 * Each share also holds the TLS sessions of its handles (CURL_LOCK_DATA_SSL_SESSION; libcurl
 * 7.88 keeps 8 per share, one per origin, the oldest replaced): a new connection to an origin
 * resumes the session its cache's last one left, whichever of the cache's handles opens it
 * (unshared, each handle keeps its own 5, and one that has not been to the origin makes a
 * full handshake). A resumed handshake skips the certificate's transfer, decoding and
 * verification: 986 against 1,312 µs of the consumer's CPU per delivery with a new
 * connection each (medians of three repetitions of the bench's tls phase, bench/README.md).
 */
#define CONN_CACHES     64
#define CONNS_PER_CACHE 32

/*
 * Requests running per origin, counted in ORIGIN_SLOTS slots picked by the origin's hash;
 * origins that land in one slot are counted together (they then spread a little sooner).
 */
#define ORIGIN_SLOTS 4096

struct origin {
    uint32_t running; /* requests running to the origins of this slot */
};

/*
 * Receive buffer of each pooled handle (CURLOPT_BUFFERSIZE; libcurl's default is 16 KiB).
 * Webhook answers are small (a 204 with its headers is about 150 bytes) and we keep at most
 * response_keep_bytes of them; libcurl's minimum, 1 KiB, is 15 KiB per handle less than
 * the default (bench/README.md, "Consumer memory"); a large answer only takes more reads.
 */
#define RECV_BUFFER_BYTES 1024L

/*
 * Upload buffer (CURLOPT_UPLOAD_BUFFERSIZE; default 64 KiB). Over TLS libcurl 7.88 copies
 * the request into it before sending (Curl_buffer_send), at most CURL_MAX_WRITE_SIZE
 * (16 KiB) at a time, so its minimum, 16 KiB, is all it uses; it stays allocated on the
 * pooled handle.
 */
#define UPLOAD_BUFFER_BYTES 16384L

/* restart_died starts a transfer again only with at least this much of its timeout left */
#define RESTART_MIN_MS 100

struct xfer {
    CURL *easy;                   /* pooled easy handle */
    cons_http_t *h;               /* owner */
    cons_http_done_cb done;       /* caller's callback */
    void *opaque;                 /* caller's data */
    uint8_t *resp;                /* kept prefix buffer (keep_bytes), allocated at the
                                     first body byte (a 204 needs none); NULL until then */
    size_t resp_len;              /* bytes kept */
    uint64_t resp_total;          /* bytes received */
    enum cons_refusal refusal;    /* set by our callbacks */
    const char *refusal_why;      /* static SSRF reason */
    bool addr_allowed;            /* an address of the target passed the SSRF policy: a refused
                                     one beside it does not decide the outcome */
    bool target_refused;          /* through the proxy: the target host is a refused address */
    const char *target_why;       /* its static reason */
    char errbuf[CURL_ERROR_SIZE]; /* libcurl's error text */
    struct cons_link all;         /* in cons_http.idle while idle */
    struct cons_link same;        /* in cons_http.idle_in[cache] while idle */
    uint16_t cache;               /* index of its connection cache (h->shares) */
    uint16_t origin;              /* slot of the running request's origin (h->origins) */
    long timeout_ms;              /* the running request's CURLOPT_TIMEOUT_MS */
    bool restarted;               /* started again once after curl gave up (restart_died) */
    int64_t prior_us;             /* time spent before that restart, µs */
};

struct cons_http {
    CURLM *multi;                          /* the multi handle */
    int epfd;                              /* epoll set */
    int64_t timer_deadline_ms;             /* curl timer (monotonic ms); -1 = none */
    int running;                           /* transfers running */
    struct cons_list idle;                 /* idle transfers, the one freed last first */
    struct cons_list idle_in[CONN_CACHES]; /* the same by connection cache */
    unsigned n_xfers;                      /* transfers created (a busy origin's new ones go
                                            * round the caches) */
    struct cons_http_opts opts;            /* copied; pointers borrowed */
    int extra_fds[4];                      /* watched fds */
    int n_extra;                           /* entries in extra_fds */
    CURLSH *shares[CONN_CACHES]; /* connection caches (see CONN_CACHES); NULL = the multi's */
    struct origin origins[ORIGIN_SLOTS]; /* requests running per origin (see ORIGIN_SLOTS) */
    int64_t idle_us;                     /* time spent waiting in epoll_wait, not yet taken */
    int64_t answered;                    /* transfers finished, not yet taken */
    bool proxied;                        /* opts.proxy set: every request goes through it */
    struct curl_slist *fault_resolve;    /* test builds: SL_FAULT=resolve's names (below) */
    enum cons_proxy_kind proxy_kind;     /* http://, https:// (TLS before CONNECT), socks5h:// */
};

static int sock_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)easy;
    cons_http_t *h = userp;
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.data.fd = s;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(h->epfd, EPOLL_CTL_DEL, s, NULL);
        return 0;
    }
    ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
    if (socketp) {
        if (epoll_ctl(h->epfd, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
            epoll_ctl(h->epfd, EPOLL_CTL_ADD, s, &ev);
    } else {
        if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, s, &ev) != 0 && errno == EEXIST)
            epoll_ctl(h->epfd, EPOLL_CTL_MOD, s, &ev);
        curl_multi_assign(h->multi, s, (void *)1);
    }
    return 0;
}

static int timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    cons_http_t *h = userp;
    h->timer_deadline_ms = timeout_ms < 0 ? -1 : sl_mono_ms() + timeout_ms;
    return 0;
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *userp)
{
    struct xfer *x = userp;
    size_t n = size * nmemb;
    x->resp_total += n;
    if (x->resp_total > x->h->opts.max_bytes) {
        x->refusal = CONS_REFUSAL_BODY_CAP;
        return 0; /* CURLE_WRITE_ERROR: stops endless and oversized bodies */
    }
    size_t room = x->h->opts.keep_bytes - x->resp_len;
    size_t take = n < room ? n : room;
    if (take) {
        if (!x->resp)
            x->resp = sl_xmalloc(x->h->opts.keep_bytes);
        memcpy(x->resp + x->resp_len, ptr, take);
        x->resp_len += take;
    }
    return n;
}

/*
 * Every new connection. Direct: the address about to be connected must pass the SSRF policy.
 * Through the proxy every connection is to it, and it resolves the target's name: the
 * target's host must pass as the registry judges it (an IP literal or a loopback name;
 * judged when the request started, target_refused). A tunnel carries one origin, so a
 * refused target's request always opens a connection of its own and is refused here.
 */
static curl_socket_t opensocket_cb(void *clientp, curlsocktype purpose, struct curl_sockaddr *addr)
{
    struct xfer *x = clientp;
    (void)purpose;
    const char *why = NULL;
    bool refused = false;
    if (x->h->proxied) {
        refused = x->target_refused;
        why = x->target_why;
    } else if (x->h->opts.ssrf) {
        refused = !sl_ssrf_allowed(x->h->opts.ssrf, &addr->addr, addr->addrlen, &why);
    }
    if (refused) {
        x->refusal = CONS_REFUSAL_SSRF;
        x->refusal_why = why;
        return CURL_SOCKET_BAD;
    }
    x->addr_allowed = true;
    return socket(addr->family, addr->socktype, addr->protocol);
}

cons_http_t *cons_http_new(const struct cons_http_opts *opts, sl_err_t *err)
{
    cons_http_t *h = sl_xcalloc(1, sizeof(*h));
    h->opts = *opts;
    h->proxied = opts->proxy && opts->proxy[0];
    h->proxy_kind = !h->proxied                                    ? CONS_PROXY_HTTP
                    : strncasecmp(opts->proxy, "https://", 8) == 0 ? CONS_PROXY_HTTPS
                    : strncasecmp(opts->proxy, "socks", 5) == 0    ? CONS_PROXY_SOCKS
                                                                   : CONS_PROXY_HTTP;
    h->timer_deadline_ms = -1;
    cons_list_init(&h->idle);
    for (int i = 0; i < CONN_CACHES; i++)
        cons_list_init(&h->idle_in[i]);
    h->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (h->epfd < 0) {
        sl_err_set(err, -errno, "could not create epoll set: %s", strerror(errno));
        free(h);
        return NULL;
    }
    h->multi = curl_multi_init();
    curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, sock_cb);
    curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
    curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
    curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
    /* HTTP/1.1 to many hosts: no multiplexing; the idle connection cache holds plenty. */
    curl_multi_setopt(h->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_NOTHING);
    curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, 20000L);
    for (int i = 0; i < CONN_CACHES; i++) {
        h->shares[i] = curl_share_init();
        if (h->shares[i] && (curl_share_setopt(h->shares[i], CURLSHOPT_SHARE,
                                               CURL_LOCK_DATA_CONNECT) != CURLSHE_OK ||
                             curl_share_setopt(h->shares[i], CURLSHOPT_SHARE,
                                               CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK)) {
            curl_share_cleanup(h->shares[i]);
            h->shares[i] = NULL; /* its handles use the multi's cache */
        }
    }
    /* Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=resolve resolves the names of
     * SL_FAULT_RESOLVE (entries "host:port:addr[,addr...]", CURLOPT_RESOLVE's form, apart by
     * ';') as it says, so a test can give a name several addresses (tests/e2e/
     * test_delivery.py) without touching the system's resolver. */
    const char *fr = sl_fault_is("resolve") ? getenv("SL_FAULT_RESOLVE") : NULL;
    for (const char *p = fr; p && *p;) {
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char entry[256];
        if (n > 0 && n < sizeof(entry)) {
            memcpy(entry, p, n);
            entry[n] = '\0';
            h->fault_resolve = curl_slist_append(h->fault_resolve, entry);
        }
        p = end ? end + 1 : p + n;
    }
    return h;
}

static void xfer_free(struct xfer *x)
{
    if (!x)
        return;
    curl_easy_cleanup(x->easy);
    free(x->resp);
    free(x);
}

void cons_http_destroy(cons_http_t *h)
{
    if (!h)
        return;
    /* Running transfers are abandoned without callbacks (shutdown has drained them). */
    struct cons_link *k;
    while ((k = cons_list_pop_head(&h->idle)) != NULL)
        xfer_free(CONS_CONTAINER(k, struct xfer, all));
    curl_multi_cleanup(h->multi);
    /* after the easy handles: a share still referenced by one refuses to go (leaked at exit) */
    for (int i = 0; i < CONN_CACHES; i++)
        curl_share_cleanup(h->shares[i]);
    close(h->epfd);
    curl_slist_free_all(h->fault_resolve);
    free(h);
}

/*
 * The options every request shares, set once when the pooled handle is created. A pooled
 * handle is never curl_easy_reset: the reset frees every option string (copied again by
 * about 20 setopts per delivery) and puts the buffer size back to 16 KiB, which
 * CURLOPT_BUFFERSIZE then changed again. cons_http_start sets the per-request options, every
 * one of them on every request, so nothing of one request carries into the next.
 */
static void xfer_init_opts(cons_http_t *h, struct xfer *x)
{
    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (h->proxied) { /* a tunnel per origin: the proxy relays bytes, sees host and port only */
        curl_easy_setopt(e, CURLOPT_PROXY, h->opts.proxy);
        curl_easy_setopt(e, CURLOPT_NOPROXY, "");
        curl_easy_setopt(e, CURLOPT_HTTPPROXYTUNNEL, 1L);
        if (h->opts.proxy_ca_file && h->opts.proxy_ca_file[0]) { /* delivery_proxy_ca_file */
            curl_easy_setopt(e, CURLOPT_PROXY_CAINFO, h->opts.proxy_ca_file);
            curl_easy_setopt(e, CURLOPT_PROXY_CAPATH, (char *)NULL);
        }
    } else {
        curl_easy_setopt(e, CURLOPT_PROXY, ""); /* and never one from the environment */
    }
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_USERAGENT, h->opts.user_agent);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, opensocket_cb);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, x);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, RECV_BUFFER_BYTES);
    curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER_BYTES);
    if (h->opts.ca_file && h->opts.ca_file[0]) { /* endpoint_ca_file: in place of the system's */
        curl_easy_setopt(e, CURLOPT_CAINFO, h->opts.ca_file);
        curl_easy_setopt(e, CURLOPT_CAPATH, (char *)NULL);
    }
    if (h->fault_resolve)
        curl_easy_setopt(e, CURLOPT_RESOLVE, h->fault_resolve);
}

/*
 * An idle transfer for a request to connection cache `cache` (-1: any): the one of that
 * cache freed last; else the one freed last of any cache, moved to `cache` (an idle handle
 * holds no connection, so CURLOPT_SHARE may change: the handles stay as many as the most
 * requests ever in flight); else a new one.
 */
static struct xfer *xfer_get(cons_http_t *h, int cache)
{
    struct cons_link *k = cache >= 0 ? cons_list_first(&h->idle_in[cache]) : NULL;
    struct xfer *x = k ? CONS_CONTAINER(k, struct xfer, same) : NULL;
    if (!x && (k = cons_list_first(&h->idle)) != NULL)
        x = CONS_CONTAINER(k, struct xfer, all);
    if (x) {
        cons_list_unlink(&h->idle, &x->all);
        cons_list_unlink(&h->idle_in[x->cache], &x->same);
        if (cache >= 0 && x->cache != cache) {
            x->cache = (uint16_t)cache;
            curl_easy_setopt(x->easy, CURLOPT_SHARE, h->shares[cache]); /* NULL: the multi's */
        }
    } else {
        x = sl_xcalloc(1, sizeof(*x));
        x->easy = curl_easy_init();
        x->h = h;
        x->cache = (uint16_t)(cache >= 0 ? (unsigned)cache : h->n_xfers % CONN_CACHES);
        h->n_xfers++;
        if (h->shares[x->cache])
            curl_easy_setopt(x->easy, CURLOPT_SHARE, h->shares[x->cache]);
        xfer_init_opts(h, x);
    }
    x->resp_len = 0;
    x->resp_total = 0;
    x->refusal = CONS_REFUSAL_NONE;
    x->refusal_why = NULL;
    x->addr_allowed = false;
    x->errbuf[0] = '\0';
    return x;
}

/* Idle again once its request is over (its origin counts it no more). */
static void xfer_put(cons_http_t *h, struct xfer *x)
{
    h->origins[x->origin].running--;
    cons_list_push_head(&h->idle, &x->all);
    cons_list_push_head(&h->idle_in[x->cache], &x->same);
}

/*
 * FNV-1a over the URL's origin: the scheme and the authority, up to the path, query or
 * fragment. The URL has been checked when its endpoint was loaded.
 */
static uint64_t origin_hash(const char *url)
{
    const char *p = strstr(url, "://");
    const char *end = p ? p + 3 : url;
    end += strcspn(end, "/?#");
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (const char *c = url; c < end; c++)
        hash = (hash ^ (uint8_t)(*c | 0x20)) * 0x100000001b3ULL; /* host names: any case */
    return hash;
}

/* The connection cache of the next request to url's origin (-1: the handle freed last
 * decides), counted as running there. */
static int pick_cache(cons_http_t *h, const char *url, uint16_t *slot)
{
    uint64_t hash = origin_hash(url);
    *slot = (uint16_t)(hash % ORIGIN_SLOTS);
    struct origin *o = &h->origins[*slot];
    int cache = o->running < CONNS_PER_CACHE ? (int)((hash >> 32) % CONN_CACHES) : -1;
    o->running++;
    return cache;
}

int cons_http_start(cons_http_t *h,
                    const struct cons_http_req *req,
                    void **handle_out,
                    sl_err_t *err)
{
    uint16_t slot = 0;
    int cache = pick_cache(h, req->url, &slot);
    struct xfer *x = xfer_get(h, cache);
    x->origin = slot;
    CURL *e = x->easy;
    x->done = req->done;
    x->opaque = req->opaque;
    x->timeout_ms = req->timeout_ms;
    x->restarted = false;
    x->prior_us = 0;
    /* per request (the rest: xfer_init_opts); each of these is set on every request */
    x->target_refused = false;
    x->target_why = NULL;
    if (h->proxied && h->opts.ssrf && h->opts.ssrf->enabled) {
        char host[SL_URL_MAX + 1];
        if (sl_url_host(req->url, host, sizeof(host)) != 0) {
            x->target_refused = true; /* fail closed: curl would not get far with it either */
            x->target_why = "unparsable-host";
        } else {
            x->target_refused = !sl_ssrf_host_allowed(h->opts.ssrf, host, &x->target_why);
        }
    }
    curl_easy_setopt(e, CURLOPT_URL, req->url);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, req->timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, req->headers);
    if (strcmp(req->method, "GET") == 0) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L); /* also drops a previous request's body */
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, (char *)NULL);
    } else {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body_len ? (const char *)req->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST,
                         strcmp(req->method, "POST") != 0 ? req->method : (const char *)NULL);
    }
    CURLMcode mc = curl_multi_add_handle(h->multi, e);
    if (mc != CURLM_OK) {
        xfer_put(h, x);
        return sl_err_set(err, SL_EHTTP, "could not start request: %s", curl_multi_strerror(mc));
    }
    h->running++;
    if (handle_out)
        *handle_out = x;
    return 0;
}

void cons_http_cancel(cons_http_t *h, void *handle)
{
    struct xfer *x = handle;
    if (!x)
        return;
    curl_multi_remove_handle(h->multi, x->easy);
    h->running--;
    xfer_put(h, x);
}

int cons_http_watch_fd(cons_http_t *h, int fd)
{
    if (h->n_extra == (int)(sizeof(h->extra_fds) / sizeof(h->extra_fds[0])))
        return SL_EINVAL;
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return -errno;
    h->extra_fds[h->n_extra++] = fd;
    return 0;
}

static int64_t info_us(CURL *e, CURLINFO what)
{
    curl_off_t v = 0;
    if (curl_easy_getinfo(e, what, &v) != CURLE_OK)
        return 0;
    return (int64_t)v;
}

/*
 * libcurl 7.88 sends a request again on a new connection when the reused connection it was
 * sent on died before any answer, and counts those retries per easy handle
 * (state.retrycount), resetting the count only when it gives up after five. On a pooled
 * handle, never reset, the count grows over its transfers, so now and then a transfer fails
 * at once where curl would have retried: "Connection died, tried 5 times before giving up"
 * (CURLE_SEND_ERROR) after a clean close, or the receive error itself after a reset (curl
 * keeps the first error): every sixth such death on a handle (tests/e2e/
 * test_connection_reuse.py; fixed in curl 8.17.0). Such a transfer (one of those
 * errors, no connection of its own, nothing received) is started again once, on the same
 * handle (the count is back to zero), within what is left of its timeout: what curl does for
 * the others. Without this it would fail as `send` or `recv`, charged to an endpoint that
 * did nothing wrong. Its time so far is added to the reported total (prior_us).
 */
static bool restart_died(cons_http_t *h, CURL *e, struct xfer *x, CURLcode code)
{
    if ((code != CURLE_SEND_ERROR && code != CURLE_RECV_ERROR) || x->restarted ||
        x->refusal != CONS_REFUSAL_NONE || x->resp_total != 0)
        return false;
    long conns = 0, header_bytes = 0;
    (void)curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &conns);
    (void)curl_easy_getinfo(e, CURLINFO_HEADER_SIZE, &header_bytes);
    if (conns != 0 || header_bytes != 0)
        return false; /* a connection of its own failed, or an answer had begun */
    int64_t spent_us = info_us(e, CURLINFO_TOTAL_TIME_T);
    int64_t left = (int64_t)x->timeout_ms - spent_us / 1000;
    if (left < RESTART_MIN_MS)
        return false;
    char why[CURL_ERROR_SIZE];
    memcpy(why, x->errbuf, sizeof(why));
    curl_multi_remove_handle(h->multi, e);
    x->restarted = true;
    x->errbuf[0] = '\0';
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)left);
    if (curl_multi_add_handle(h->multi, e) != CURLM_OK) {
        memcpy(x->errbuf, why, sizeof(why)); /* reported as it was */
        return false;
    }
    h->answered--; /* still running */
    x->prior_us = spent_us;
    return true;
}

static void finish(cons_http_t *h, CURL *e, CURLcode code)
{
    struct xfer *x = NULL;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)(void *)&x);
    if (restart_died(h, e, x, code))
        return;
    struct cons_http_result r;
    memset(&r, 0, sizeof(r));
    r.curl_code = (int)code;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
    curl_off_t ra = 0;
    if (curl_easy_getinfo(e, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK)
        r.retry_after_s = (long)ra;
    r.refusal = x->refusal;
    r.refusal_why = x->refusal_why;
    if (r.refusal == CONS_REFUSAL_SSRF && x->addr_allowed) {
        /* a name with refused and allowed addresses (a private AAAA beside a public A, say):
         * libcurl went on to an allowed one, whose outcome (an answer, a refused connection,
         * a timeout) is the endpoint's; only a name with no allowed address is refused */
        r.refusal = CONS_REFUSAL_NONE;
        r.refusal_why = NULL;
    }
    if (h->proxied && code != CURLE_OK && r.refusal == CONS_REFUSAL_NONE) {
        struct cons_proxy_answer a = {.curl_code = (int)code, .kind = h->proxy_kind};
        long proxy_error = 0;
        (void)curl_easy_getinfo(e, CURLINFO_HTTP_CONNECTCODE, &a.connect_code);
        (void)curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &a.new_connections);
        /* libcurl 7.88 (OpenSSL) says so when its connect timeout ends a TLS handshake; with
         * no answer to CONNECT yet, that handshake is the proxy's */
        a.tls_timed_out = strstr(x->errbuf, "SSL connection timeout") != NULL;
        if (code == CURLE_PROXY) /* set by the SOCKS code with it, stale otherwise */
            (void)curl_easy_getinfo(e, CURLINFO_PROXY_ERROR, &proxy_error);
        a.proxy_error = (int)proxy_error;
        r.refusal = cons_proxy_refusal(&a);
        if (r.refusal != CONS_REFUSAL_NONE)
            r.status = 0; /* the proxy's answer, not the endpoint's */
    }
    if (h->proxied) /* libcurl's texts may quote the proxy URL: its password is registered */
        sl_log_scrub(x->errbuf);
    int64_t dns = info_us(e, CURLINFO_NAMELOOKUP_TIME_T);
    int64_t conn = info_us(e, CURLINFO_CONNECT_TIME_T);
    int64_t app = info_us(e, CURLINFO_APPCONNECT_TIME_T);
    r.total_us = x->prior_us + info_us(e, CURLINFO_TOTAL_TIME_T);
    r.ttfb_us = info_us(e, CURLINFO_STARTTRANSFER_TIME_T);
    r.dns_us = dns;
    r.connect_us = conn > dns ? conn - dns : 0;
    r.tls_us = app > conn ? app - conn : 0;
    r.resp = x->resp;
    r.resp_len = x->resp_len;
    r.resp_total = x->resp_total;
    r.errbuf = x->errbuf;
    curl_multi_remove_handle(h->multi, e);
    h->running--;
    cons_http_done_cb done = x->done;
    void *opaque = x->opaque;
    done(opaque, &r);
    xfer_put(h, x);
}

static void drain_done(cons_http_t *h)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(h->multi, &left)) != NULL) {
        if (m->msg == CURLMSG_DONE) {
            h->answered++;
            finish(h, m->easy_handle, m->data.result);
        }
    }
}

int cons_http_run(cons_http_t *h, int max_wait_ms, int *extra_ready)
{
    struct epoll_event evs[256];
    int still = 0;
    int wait = max_wait_ms;
    if (h->timer_deadline_ms >= 0) {
        int64_t left = h->timer_deadline_ms - sl_mono_ms();
        if (left < 0)
            left = 0;
        if (left < wait)
            wait = (int)left;
    }
    if (extra_ready)
        *extra_ready = 0;
    if (wait < 0)
        wait = 0; /* never an endless wait */
    /* a wait that may block: its time is the loop's idle time */
    int64_t t0 = wait > 0 ? sl_mono_us() : 0;
    int n = epoll_wait(h->epfd, evs, (int)(sizeof(evs) / sizeof(evs[0])), wait);
    if (wait > 0)
        h->idle_us += sl_mono_us() - t0;
    for (int i = 0; i < n; i++) {
        int fd = evs[i].data.fd;
        bool extra = false;
        for (int j = 0; j < h->n_extra; j++) {
            if (h->extra_fds[j] == fd)
                extra = true;
        }
        if (extra) {
            if (extra_ready)
                *extra_ready = 1;
            continue;
        }
        int flags = 0;
        if (evs[i].events & EPOLLIN)
            flags |= CURL_CSELECT_IN;
        if (evs[i].events & EPOLLOUT)
            flags |= CURL_CSELECT_OUT;
        if (evs[i].events & (EPOLLERR | EPOLLHUP))
            flags |= CURL_CSELECT_ERR;
        curl_multi_socket_action(h->multi, fd, flags, &still);
    }
    if (h->timer_deadline_ms >= 0 && sl_mono_ms() >= h->timer_deadline_ms) {
        h->timer_deadline_ms = -1;
        curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &still);
    }
    drain_done(h);
    return h->running;
}

int64_t cons_http_take_idle_us(cons_http_t *h)
{
    int64_t v = h->idle_us;
    h->idle_us = 0;
    return v;
}

int64_t cons_http_take_answered(cons_http_t *h)
{
    int64_t v = h->answered;
    h->answered = 0;
    return v;
}

int cons_http_running(const cons_http_t *h)
{
    return h->running;
}
