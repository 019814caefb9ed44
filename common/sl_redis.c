/*
 * sl_redis: blocking hiredis wrapper (see sl_redis.h).
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

#include "common/sl_log.h"
#include "common/sl_mem.h"

struct sl_redis {
    struct sl_redis_url url; /* host, port, db, ACL user and password (wiped on close) */
    redisContext *c;         /* NULL while disconnected */
    int timeout_ms;          /* connect and command timeout */
    int64_t retry_at;        /* after a failed connection: none tried before (mono ms) */
    int64_t backoff_ms;      /* wait after the next failed connection, ms */
};

/* After a failed connection, calls fail at once (no new connection) for a wait: an
 * unreachable or frozen Redis costs a caller one timeout per wait instead of one per call, so
 * a loop that makes many calls keeps turning (and notices a SIGTERM). The wait doubles from
 * CONNECT_BACKOFF_MIN_MS up to CONNECT_BACKOFF_MAX_MS only while attempts are slow (at least
 * CONNECT_SLOW_MS: a timeout); a refused connection (Redis down or restarting) costs nothing,
 * so its wait stays at the minimum and a restarted Redis is found again within it (held
 * markers written a second after it answers). A connection that works resets it. */
#define CONNECT_BACKOFF_MIN_MS 250
#define CONNECT_BACKOFF_MAX_MS 2000
#define CONNECT_SLOW_MS        100

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decode [s, s+n) into a new string; NULL on a bad %XX or an encoded NUL. */
static char *pct_decode(const char *s, size_t n)
{
    char *out = sl_xmalloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[o++] = s[i];
            continue;
        }
        int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
        int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi | lo) == 0) {
            sl_secret_wipe(out, n + 1);
            free(out);
            return NULL;
        }
        out[o++] = (char)(hi * 16 + lo);
        i += 2;
    }
    out[o] = '\0';
    return out;
}

int sl_redis_url_parse(const char *url, struct sl_redis_url *u, sl_err_t *err)
{
    memset(u, 0, sizeof(*u));
    if (strncmp(url, "redis://", 8) != 0)
        return sl_err_set(err, SL_ECONFIG,
                          "expected redis://[[user]:password@]host:port[/db] (rediss:// and unix "
                          "sockets are not supported)");
    const char *p = url + 8;
    /* the userinfo ends at the last '@': a password may hold one unencoded */
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return sl_err_set(err, SL_ECONFIG,
                              "the user name needs a password (redis://user:password@host)");
        if (colon > p && !(u->user = pct_decode(p, (size_t)(colon - p))))
            return sl_err_set(err, SL_ECONFIG, "bad percent-encoding in the user name");
        if (!(u->password = pct_decode(colon + 1, (size_t)(at - colon - 1))))
            return sl_err_set(err, SL_ECONFIG, "bad percent-encoding in the password");
        if (u->password[0] == '\0')
            return sl_err_set(err, SL_ECONFIG, "empty password before '@'");
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    const char *hostend = slash ? slash : p + strlen(p);
    const char *colon = memchr(p, ':', (size_t)(hostend - p));
    size_t hl = (size_t)((colon ? colon : hostend) - p);
    if (hl == 0 || hl >= sizeof(u->host))
        return sl_err_set(err, SL_ECONFIG, "bad host");
    memcpy(u->host, p, hl);
    u->host[hl] = '\0';
    u->port = 6379;
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != hostend || colon + 1 == hostend || port < 1 || port > 65535)
            return sl_err_set(err, SL_ECONFIG, "bad port");
        u->port = (int)port;
    }
    if (slash && slash[1]) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1000)
            return sl_err_set(err, SL_ECONFIG, "bad database number");
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

static int do_connect_now(sl_redis_t *r, sl_err_t *err);

/* Connect unless a recent connection failed (see CONNECT_BACKOFF_MIN_MS). */
static int do_connect(sl_redis_t *r, sl_err_t *err)
{
    int64_t now = mono_ms();
    if (r->retry_at && now < r->retry_at)
        return sl_err_set(err, SL_EREDIS,
                          "redis at %s:%d unavailable (the last connection failed; next try in "
                          "%lld ms)",
                          r->url.host, r->url.port, (long long)(r->retry_at - now));
    int rc = do_connect_now(r, err);
    if (rc != 0) {
        bool slow = mono_ms() - now >= CONNECT_SLOW_MS;
        r->backoff_ms = r->backoff_ms && slow ? r->backoff_ms * 2 : CONNECT_BACKOFF_MIN_MS;
        if (r->backoff_ms > CONNECT_BACKOFF_MAX_MS)
            r->backoff_ms = CONNECT_BACKOFF_MAX_MS;
        r->retry_at = mono_ms() + r->backoff_ms;
    } else {
        r->retry_at = 0;
        r->backoff_ms = 0;
    }
    return rc;
}

static int do_connect_now(sl_redis_t *r, sl_err_t *err)
{
    const struct sl_redis_url *u = &r->url;
    struct timeval tv = {.tv_sec = r->timeout_ms / 1000,
                         .tv_usec = (suseconds_t)(r->timeout_ms % 1000) * 1000};
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
    redisContext *c = redisConnectWithTimeout(u->host, u->port, tv);
    if (!c || c->err) {
        sl_err_set(err, SL_EREDIS, "could not connect to redis at %s:%d: %s", u->host, u->port,
                   c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return SL_EREDIS;
    }
    redisSetTimeout(c, tv);
    redisEnableKeepAlive(c);
    if (u->password) {
        /* AUTH user password is Redis 6's ACL form; AUTH password is the default user */
        redisReply *rep = u->user ? redisCommand(c, "AUTH %s %s", u->user, u->password)
                                  : redisCommand(c, "AUTH %s", u->password);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            if (u->user)
                sl_err_set(err, SL_EREDIS,
                           "could not authenticate to redis at %s:%d as user %s: %s", u->host,
                           u->port, u->user, reply_error(rep, c));
            else
                sl_err_set(err, SL_EREDIS, "could not authenticate to redis at %s:%d: %s", u->host,
                           u->port, reply_error(rep, c));
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            return SL_EREDIS;
        }
        freeReplyObject(rep);
    }
    if (u->db) {
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
    r->c = c;
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
    if (do_connect(r, err) != 0) {
        sl_redis_close(r);
        return NULL;
    }
    return r;
}

void sl_redis_close(sl_redis_t *r)
{
    if (!r)
        return;
    if (r->c)
        redisFree(r->c);
    sl_redis_url_fini(&r->url);
    free(r);
}

redisContext *sl_redis_ctx(sl_redis_t *r)
{
    return r->c;
}

redisReply *sl_redis_cmd(sl_redis_t *r,
                         int idempotent,
                         int argc,
                         const char **argv,
                         const size_t *argvlen,
                         sl_err_t *err)
{
    for (int tries = 0; tries < 2; tries++) {
        if (!r->c && do_connect(r, err) != 0)
            return NULL;
        redisReply *rep = redisCommandArgv(r->c, argc, argv, argvlen);
        if (rep)
            return rep;
        sl_err_set(err, SL_EREDIS, "could not run redis %s: %s", argv[0], r->c->errstr);
        redisFree(r->c);
        r->c = NULL;
        if (!idempotent)
            return NULL;
    }
    return NULL;
}

redisReply *sl_redis_cmdf(sl_redis_t *r, sl_err_t *err, const char *fmt, ...)
{
    for (int tries = 0; tries < 2; tries++) {
        if (!r->c && do_connect(r, err) != 0)
            return NULL;
        va_list ap;
        va_start(ap, fmt);
        redisReply *rep = redisvCommand(r->c, fmt, ap);
        va_end(ap);
        if (rep)
            return rep;
        sl_err_set(err, SL_EREDIS, "could not run redis command: %s", r->c->errstr);
        redisFree(r->c);
        r->c = NULL;
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
        for (int i = 0; i < SHA_DIGEST_LENGTH; i++)
            (void)snprintf(hex + (size_t)2 * (size_t)i, 3, "%02x", md[i]);
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
    if (argc + 3 > MAXARGS) {
        sl_err_set(err, SL_EINVAL, "too many arguments for redis script %s", s->name);
        return NULL;
    }
    const char *av[MAXARGS];
    size_t al[MAXARGS];
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
    return rep;
}

int sl_redis_append(sl_redis_t *r, int argc, const char **argv, const size_t *argvlen)
{
    if (!r->c && do_connect(r, NULL) != 0)
        return SL_EREDIS;
    return redisAppendCommandArgv(r->c, argc, argv, argvlen) == REDIS_OK ? 0 : SL_EREDIS;
}

redisReply *sl_redis_get_reply(sl_redis_t *r, sl_err_t *err)
{
    void *rep = NULL;
    if (!r->c) {
        sl_err_set(err, SL_EREDIS, "redis connection lost");
        return NULL;
    }
    if (redisGetReply(r->c, &rep) != REDIS_OK) {
        sl_err_set(err, SL_EREDIS, "could not read redis reply: %s", r->c->errstr);
        redisFree(r->c);
        r->c = NULL;
        return NULL;
    }
    return rep;
}
