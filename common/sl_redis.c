/*
 * sl_redis: blocking hiredis wrapper (see sl_redis.h).
 */
#include "common/sl_redis.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/sha.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"

struct sl_redis {
    redisContext *c; /* NULL while disconnected */
    char host[256];  /* server host */
    int port;        /* server port */
    int db;          /* SELECT db */
    char *password;  /* AUTH password or NULL; wiped on close */
    int timeout_ms;  /* connect and command timeout */
};

static int parse_url(sl_redis_t *r, const char *url, sl_err_t *err)
{
    if (strncmp(url, "redis://", 8) != 0)
        return sl_err_set(err, SL_ECONFIG, "invalid redis url: expected redis://host:port[/db]");
    const char *p = url + 8;
    const char *at = strchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon)
            r->password = sl_xstrndup(colon + 1, (size_t)(at - colon - 1));
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    const char *hostend = slash ? slash : p + strlen(p);
    const char *colon = memchr(p, ':', (size_t)(hostend - p));
    size_t hl = (size_t)((colon ? colon : hostend) - p);
    if (hl == 0 || hl >= sizeof(r->host))
        return sl_err_set(err, SL_ECONFIG, "invalid redis url: bad host");
    memcpy(r->host, p, hl);
    r->host[hl] = '\0';
    r->port = 6379;
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != hostend || port < 1 || port > 65535)
            return sl_err_set(err, SL_ECONFIG, "invalid redis url: bad port");
        r->port = (int)port;
    }
    if (slash && slash[1]) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1000)
            return sl_err_set(err, SL_ECONFIG, "invalid redis url: bad database number");
        r->db = (int)db;
    }
    return 0;
}

static int do_connect(sl_redis_t *r, sl_err_t *err)
{
    struct timeval tv = {.tv_sec = r->timeout_ms / 1000, .tv_usec = (r->timeout_ms % 1000) * 1000};
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!c || c->err) {
        sl_err_set(err, SL_EREDIS, "could not connect to redis at %s:%d: %s", r->host, r->port,
                   c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return SL_EREDIS;
    }
    redisSetTimeout(c, tv);
    redisEnableKeepAlive(c);
    if (r->password) {
        redisReply *rep = redisCommand(c, "AUTH %s", r->password);
        int bad = !rep || rep->type == REDIS_REPLY_ERROR;
        if (rep)
            freeReplyObject(rep);
        if (bad) {
            redisFree(c);
            return sl_err_set(err, SL_EREDIS, "could not authenticate to redis at %s:%d", r->host,
                              r->port);
        }
    }
    if (r->db) {
        redisReply *rep = redisCommand(c, "SELECT %d", r->db);
        int bad = !rep || rep->type == REDIS_REPLY_ERROR;
        if (rep)
            freeReplyObject(rep);
        if (bad) {
            redisFree(c);
            return sl_err_set(err, SL_EREDIS, "could not select redis database %d", r->db);
        }
    }
    r->c = c;
    return 0;
}

sl_redis_t *sl_redis_connect(const char *url, int timeout_ms, sl_err_t *err)
{
    sl_redis_t *r = sl_xcalloc(1, sizeof(*r));
    r->timeout_ms = timeout_ms;
    if (parse_url(r, url, err) != 0 || do_connect(r, err) != 0) {
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
    if (r->password) {
        sl_secret_wipe(r->password, strlen(r->password));
        free(r->password);
    }
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
            snprintf(hex + 2 * i, 3, "%02x", md[i]);
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
    snprintf(nk, sizeof(nk), "%d", nkeys);
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
