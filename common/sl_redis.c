/*
 * sl_redis: blocking hiredis wrapper (see sl_redis.h): URL parsing, one connection with its
 * reconnect backoff, commands, scripts and pipelines. In cluster mode every call hands over
 * to the router in sl_rcluster.c.
 */
#include "common/sl_redis.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/sha.h>

#include "common/sl_hex.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_redis_int.h"

/* After a failed connection, calls fail at once (no new connection) for a wait: an
 * unreachable or frozen Redis costs a caller one timeout per wait instead of one per call, so
 * a loop that makes many calls keeps turning (and notices a SIGTERM). The wait doubles from
 * CONNECT_BACKOFF_MIN_MS up to CONNECT_BACKOFF_MAX_MS only while attempts are slow (at least
 * CONNECT_SLOW_MS: a timeout); a refused connection (Redis down or restarting) costs nothing,
 * so its wait stays at the minimum and a restarted Redis is found again within it (held
 * markers written a second after it answers). A reply resets it: a connection alone does
 * not, as the kernel of a stopped server still accepts one. */
#define CONNECT_BACKOFF_MIN_MS 250
#define CONNECT_BACKOFF_MAX_MS 2000
#define CONNECT_SLOW_MS        100

int64_t sl_redis_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Parse "host[:port]" in [p, end) into a. */
static int parse_addr(const char *p, const char *end, struct sl_redis_addr *a, sl_err_t *err)
{
    const char *colon = memchr(p, ':', (size_t)(end - p));
    size_t hl = (size_t)((colon ? colon : end) - p);
    if (hl == 0 || hl >= sizeof(a->host))
        return sl_err_set(err, SL_ECONFIG, "bad host");
    memcpy(a->host, p, hl);
    a->host[hl] = '\0';
    a->port = 6379;
    if (colon) {
        char *e;
        long port = strtol(colon + 1, &e, 10);
        if (e != end || colon + 1 == end || port < 1 || port > 65535)
            return sl_err_set(err, SL_ECONFIG, "bad port");
        a->port = (int)port;
    }
    return 0;
}

/* The userinfo before the last '@' of p, into u; *rest = the text after it. */
static int parse_userinfo(const char *p, struct sl_redis_url *u, const char **rest, sl_err_t *err)
{
    /* the userinfo ends at the last '@': a password may hold one unencoded */
    const char *at = strrchr(p, '@');
    *rest = p;
    if (!at)
        return 0;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (!colon)
        return sl_err_set(err, SL_ECONFIG,
                          "the user name needs a password (redis://user:password@host)");
    if (colon > p && !(u->user = sl_pct_decode(p, (size_t)(colon - p))))
        return sl_err_set(err, SL_ECONFIG, "bad percent-encoding in the user name");
    if (!(u->password = sl_pct_decode(colon + 1, (size_t)(at - colon - 1))))
        return sl_err_set(err, SL_ECONFIG, "bad percent-encoding in the password");
    if (u->password[0] == '\0')
        return sl_err_set(err, SL_ECONFIG, "empty password before '@'");
    *rest = at + 1;
    return 0;
}

int sl_redis_url_parse(const char *url, struct sl_redis_url *u, sl_err_t *err)
{
    memset(u, 0, sizeof(*u));
    const char *p;
    if (strncmp(url, "redis://", 8) == 0) {
        p = url + 8;
    } else if (strncmp(url, "redis-cluster://", 16) == 0) {
        p = url + 16;
        u->cluster = 1;
    } else {
        return sl_err_set(err, SL_ECONFIG,
                          "expected redis://[[user]:password@]host:port[/db] or "
                          "redis-cluster://[[user]:password@]host:port[,host:port...] "
                          "(rediss:// and unix sockets are not supported)");
    }
    int rc = parse_userinfo(p, u, &p, err);
    if (rc != 0)
        return rc;
    const char *slash = strchr(p, '/');
    const char *hostend = slash ? slash : p + strlen(p);
    while (p <= hostend) {
        const char *comma = memchr(p, ',', (size_t)(hostend - p));
        const char *end = comma ? comma : hostend;
        if (u->nseeds == SL_REDIS_SEEDS_MAX)
            return sl_err_set(err, SL_ECONFIG, "more than %d seed nodes", SL_REDIS_SEEDS_MAX);
        if ((rc = parse_addr(p, end, &u->seeds[u->nseeds], err)) != 0)
            return rc;
        u->nseeds++;
        if (!comma)
            break;
        if (!u->cluster)
            return sl_err_set(err, SL_ECONFIG,
                              "a list of hosts needs redis-cluster:// (redis:// takes one)");
        p = comma + 1;
    }
    memcpy(u->host, u->seeds[0].host, sizeof(u->host));
    u->port = u->seeds[0].port;
    if (slash && slash[1]) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1000)
            return sl_err_set(err, SL_ECONFIG, "bad database number");
        if (u->cluster && db != 0)
            return sl_err_set(err, SL_ECONFIG, "a Redis Cluster has database 0 only");
        u->db = (int)db;
    }
    return 0;
}

void sl_redis_url_fini(struct sl_redis_url *u)
{
    if (u->user) {
        sl_secret_wipe(u->user, strlen(u->user));
        free(u->user);
    }
    if (u->password) {
        sl_secret_wipe(u->password, strlen(u->password));
        free(u->password);
    }
    u->user = u->password = NULL;
}

/* The text of an error reply, or why there is none; never holds the password (Redis answers
 * WRONGPASS, NOAUTH or NOPERM with a fixed text). */
static const char *reply_error(const redisReply *rep, const redisContext *c)
{
    if (!rep)
        return c->errstr[0] ? c->errstr : "no reply";
    return rep->type == REDIS_REPLY_ERROR && rep->str ? rep->str : "unexpected reply";
}

static int conn_connect_now(sl_redis_t *r, struct sl_rconn *conn, sl_err_t *err);

/* Connect unless a recent connection failed (see CONNECT_BACKOFF_MIN_MS). */
int sl_rconn_connect(sl_redis_t *r, struct sl_rconn *conn, sl_err_t *err)
{
    int64_t now = sl_redis_mono_ms();
    if (conn->retry_at && now < conn->retry_at)
        return sl_err_set(err, SL_EREDIS,
                          "redis at %s:%d unavailable (the last connection failed; next try in "
                          "%lld ms)",
                          conn->host, conn->port, (long long)(conn->retry_at - now));
    int rc = conn_connect_now(r, conn, err);
    if (rc != 0) {
        bool slow = sl_redis_mono_ms() - now >= CONNECT_SLOW_MS;
        conn->backoff_ms = conn->backoff_ms && slow ? conn->backoff_ms * 2 : CONNECT_BACKOFF_MIN_MS;
        if (conn->backoff_ms > CONNECT_BACKOFF_MAX_MS)
            conn->backoff_ms = CONNECT_BACKOFF_MAX_MS;
        conn->retry_at = sl_redis_mono_ms() + conn->backoff_ms;
    } else {
        /* the back-off stays until a reply: a stopped server's kernel still accepts */
        conn->retry_at = 0;
    }
    return rc;
}

void sl_rconn_drop(struct sl_rconn *conn)
{
    if (conn->c) {
        redisFree(conn->c);
        conn->c = NULL;
    }
}

/* AUTH with the URL's credentials. 0 or SL_EREDIS with err filled. */
static int
conn_auth(const struct sl_redis_url *u, redisContext *c, const struct sl_rconn *conn, sl_err_t *err)
{
    /* AUTH user password is Redis 6's ACL form; AUTH password is the default user */
    redisReply *rep = u->user ? redisCommand(c, "AUTH %s %s", u->user, u->password)
                              : redisCommand(c, "AUTH %s", u->password);
    if (rep && rep->type != REDIS_REPLY_ERROR) {
        freeReplyObject(rep);
        return 0;
    }
    if (u->user)
        sl_err_set(err, SL_EREDIS, "could not authenticate to redis at %s:%d as user %s: %s",
                   conn->host, conn->port, u->user, reply_error(rep, c));
    else
        sl_err_set(err, SL_EREDIS, "could not authenticate to redis at %s:%d: %s", conn->host,
                   conn->port, reply_error(rep, c));
    if (rep)
        freeReplyObject(rep);
    return SL_EREDIS;
}

static int conn_connect_now(sl_redis_t *r, struct sl_rconn *conn, sl_err_t *err)
{
    const struct sl_redis_url *u = &r->url;
    struct timeval tv = {.tv_sec = r->timeout_ms / 1000,
                         .tv_usec = (suseconds_t)(r->timeout_ms % 1000) * 1000};
    sl_rconn_drop(conn);
    redisContext *c = redisConnectWithTimeout(conn->host, conn->port, tv);
    if (!c || c->err) {
        sl_err_set(err, SL_EREDIS, "could not connect to redis at %s:%d: %s", conn->host,
                   conn->port, c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return SL_EREDIS;
    }
    redisSetTimeout(c, tv);
    redisEnableKeepAlive(c);
    if (u->password && conn_auth(u, c, conn, err) != 0) {
        redisFree(c);
        return SL_EREDIS;
    }
    if (u->db && !u->cluster) {
        redisReply *rep = redisCommand(c, "SELECT %d", u->db);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            sl_err_set(err, SL_EREDIS, "could not select redis database %d: %s", u->db,
                       reply_error(rep, c));
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            return SL_EREDIS;
        }
        freeReplyObject(rep);
    }
    conn->c = c;
    return 0;
}

sl_redis_t *sl_redis_connect(const char *url, int timeout_ms, sl_err_t *err)
{
    sl_redis_t *r = sl_xcalloc(1, sizeof(*r));
    r->timeout_ms = timeout_ms;
    if (sl_redis_url_parse(url, &r->url, err) != 0) {
        if (err) {
            char why[SL_ERR_MSG_MAX];
            (void)snprintf(why, sizeof(why), "%s", err->msg);
            sl_err_set(err, SL_ECONFIG, "invalid redis url: %s", why);
        }
        sl_redis_close(r);
        return NULL;
    }
    memcpy(r->one.host, r->url.host, sizeof(r->one.host));
    r->one.port = r->url.port;
    int rc = r->url.cluster ? sl_rcluster_open(r, err) : sl_rconn_connect(r, &r->one, err);
    if (rc != 0) {
        sl_redis_close(r);
        return NULL;
    }
    return r;
}

void sl_redis_close(sl_redis_t *r)
{
    if (!r)
        return;
    sl_rconn_drop(&r->one);
    sl_rcluster_close(r);
    sl_redis_url_fini(&r->url);
    free(r);
}

redisContext *sl_redis_ctx(sl_redis_t *r)
{
    return r->one.c;
}

int sl_redis_key_slot(const char *key, size_t len)
{
    return sl_rcluster_key_slot(key, len);
}

/* Cluster mode: format argv and hand it to the router. */
static redisReply *cluster_cmd(sl_redis_t *r,
                               int idempotent,
                               int argc,
                               const char **argv,
                               const size_t *argvlen,
                               sl_err_t *err)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    if (len < 0) {
        sl_err_set(err, SL_ENOMEM, "could not format redis %s", argv[0]);
        return NULL;
    }
    redisReply *rep = sl_rcluster_exec(r, cmd, (size_t)len, idempotent, err);
    redisFreeCommand(cmd);
    return rep;
}

/*
 * A command on conn failed (no reply): drop the connection. When it timed out (the server
 * accepts connections but does not answer: stopped, stalled on its disk), back off as after a
 * slow connect, so that the calls meanwhile fail at once rather than each waiting the whole
 * timeout (a loop making one call per job would stall for jobs x timeout). Returns whether it
 * timed out: the caller then does not try again at once.
 */
static bool cmd_failed(struct sl_rconn *conn, int saved_errno)
{
    bool timed_out =
        conn->c->err == REDIS_ERR_IO &&
        (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT);
    sl_rconn_drop(conn);
    if (timed_out) {
        conn->backoff_ms = conn->backoff_ms ? conn->backoff_ms * 2 : CONNECT_BACKOFF_MIN_MS;
        if (conn->backoff_ms > CONNECT_BACKOFF_MAX_MS)
            conn->backoff_ms = CONNECT_BACKOFF_MAX_MS;
        conn->retry_at = sl_redis_mono_ms() + conn->backoff_ms;
    }
    return timed_out;
}

static bool starts_with(const char *s, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && memcmp(s, prefix, n) == 0;
}

static bool contains(const char *s, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(s + i, needle, n) == 0)
            return true;
    return false;
}

bool sl_redis_err_demoted(const char *s, size_t len)
{
    if (!s)
        return false;
    if (starts_with(s, len, "READONLY") || starts_with(s, len, "MASTERDOWN"))
        return true;
    /* Redis < 7 wraps the error of a write inside a script as
     * "ERR Error running script (call to f_...): @user_script:1: ...: -READONLY ..." */
    return starts_with(s, len, "ERR Error running script") &&
           (contains(s, len, "-READONLY ") || contains(s, len, "-MASTERDOWN "));
}

/* A reply came: the back-off is over. One saying the server no longer takes writes (READONLY:
 * a primary demoted to a replica behind the same name, as managed services fail over;
 * MASTERDOWN), also from inside a script: drop the connection, so the next call connects
 * again and reaches the new primary. The reply goes to the caller. */
static void answered(struct sl_rconn *conn, const redisReply *rep)
{
    conn->backoff_ms = 0; /* it answers: the next failure starts the back-off afresh */
    if (rep->type == REDIS_REPLY_ERROR && sl_redis_err_demoted(rep->str, rep->len))
        sl_rconn_drop(conn);
}

redisReply *sl_redis_cmd(sl_redis_t *r,
                         int idempotent,
                         int argc,
                         const char **argv,
                         const size_t *argvlen,
                         sl_err_t *err)
{
    if (r->cl)
        return cluster_cmd(r, idempotent, argc, argv, argvlen, err);
    struct sl_rconn *conn = &r->one;
    for (int tries = 0; tries < 2; tries++) {
        if (!conn->c && sl_rconn_connect(r, conn, err) != 0)
            return NULL;
        redisReply *rep = redisCommandArgv(conn->c, argc, argv, argvlen);
        if (rep) {
            answered(conn, rep);
            return rep;
        }
        int saved_errno = errno;
        sl_err_set(err, SL_EREDIS, "could not run redis %s: %s", argv[0], conn->c->errstr);
        if (cmd_failed(conn, saved_errno) || !idempotent)
            return NULL;
    }
    return NULL;
}

redisReply *sl_redis_cmdf(sl_redis_t *r, sl_err_t *err, const char *fmt, ...)
{
    if (r->cl) {
        char *cmd = NULL;
        va_list ap;
        va_start(ap, fmt);
        int len = redisvFormatCommand(&cmd, fmt, ap);
        va_end(ap);
        if (len < 0) {
            sl_err_set(err, SL_ENOMEM, "could not format a redis command");
            return NULL;
        }
        redisReply *rep = sl_rcluster_exec(r, cmd, (size_t)len, 1, err);
        redisFreeCommand(cmd);
        return rep;
    }
    struct sl_rconn *conn = &r->one;
    for (int tries = 0; tries < 2; tries++) {
        if (!conn->c && sl_rconn_connect(r, conn, err) != 0)
            return NULL;
        va_list ap;
        va_start(ap, fmt);
        redisReply *rep = redisvCommand(conn->c, fmt, ap);
        va_end(ap);
        if (rep) {
            answered(conn, rep);
            return rep;
        }
        int saved_errno = errno;
        sl_err_set(err, SL_EREDIS, "could not run redis command: %s", conn->c->errstr);
        if (cmd_failed(conn, saved_errno))
            return NULL;
    }
    return NULL;
}

/* Scripts are static and shared by every thread of a process (the consumer's delivery
 * loops): the digest is computed once, under a lock. */
static pthread_mutex_t g_sha_mu = PTHREAD_MUTEX_INITIALIZER;

static void script_sha(struct sl_redis_script *s)
{
    pthread_mutex_lock(&g_sha_mu);
    if (!s->sha[0]) {
        unsigned char md[SHA_DIGEST_LENGTH];
        char hex[sizeof(s->sha)];
        SHA1((const unsigned char *)s->lua, strlen(s->lua), md);
        sl_hex_encode(md, SHA_DIGEST_LENGTH, hex);
        memcpy(s->sha, hex, sizeof(hex));
    }
    pthread_mutex_unlock(&g_sha_mu);
}

redisReply *sl_redis_eval(sl_redis_t *r,
                          struct sl_redis_script *s,
                          int nkeys,
                          int argc,
                          const char **argv,
                          const size_t *argvlen,
                          sl_err_t *err)
{
    script_sha(s);
    enum { MAXARGS = 64 };
    const char *av_small[MAXARGS];
    size_t al_small[MAXARGS];
    const char **av = av_small;
    size_t *al = al_small;
    if (argc < 0 || argc > 1000000) {
        sl_err_set(err, SL_EINVAL, "too many arguments for redis script %s", s->name);
        return NULL;
    }
    if (argc + 3 > MAXARGS) { /* claim_bodies: a key and an argument per job */
        av = sl_xmalloc(((size_t)argc + 3) * sizeof(*av));
        al = sl_xmalloc(((size_t)argc + 3) * sizeof(*al));
    }
    char nk[16];
    (void)snprintf(nk, sizeof(nk), "%d", nkeys);
    av[0] = "EVALSHA";
    al[0] = 7;
    av[1] = s->sha;
    al[1] = 40;
    av[2] = nk;
    al[2] = strlen(nk);
    for (int i = 0; i < argc; i++) {
        av[3 + i] = argv[i];
        al[3 + i] = argvlen ? argvlen[i] : strlen(argv[i]);
    }
    /* Scripts are written to be safe to re-run only where noted; a lost connection mid-call
     * is reported, not retried, so the caller decides. */
    redisReply *rep = sl_redis_cmd(r, 0, argc + 3, av, al, err);
    if (rep && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(rep);
        av[0] = "EVAL";
        al[0] = 4;
        av[1] = s->lua;
        al[1] = strlen(s->lua);
        rep = sl_redis_cmd(r, 0, argc + 3, av, al, err);
    }
    if (av != av_small) {
        free(av);
        free(al);
    }
    return rep;
}

int sl_redis_append(sl_redis_t *r, int argc, const char **argv, const size_t *argvlen)
{
    if (r->cl) {
        char *cmd = NULL;
        int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
        if (len < 0)
            return SL_ENOMEM;
        return sl_rcluster_append(r, cmd, (size_t)len); /* takes cmd */
    }
    if (!r->one.c && sl_rconn_connect(r, &r->one, NULL) != 0)
        return SL_EREDIS;
    return redisAppendCommandArgv(r->one.c, argc, argv, argvlen) == REDIS_OK ? 0 : SL_EREDIS;
}

redisReply *sl_redis_get_reply(sl_redis_t *r, sl_err_t *err)
{
    if (r->cl)
        return sl_rcluster_get_reply(r, err);
    void *rep = NULL;
    if (!r->one.c) {
        sl_err_set(err, SL_EREDIS, "redis connection lost");
        return NULL;
    }
    if (redisGetReply(r->one.c, &rep) != REDIS_OK) {
        int saved_errno = errno;
        sl_err_set(err, SL_EREDIS, "could not read redis reply: %s", r->one.c->errstr);
        (void)cmd_failed(&r->one, saved_errno);
        return NULL;
    }
    /* a pipeline's later replies are still to be read: a READONLY one is left to the
     * caller's next whole command, which drops the connection */
    r->one.backoff_ms = 0;
    return rep;
}
