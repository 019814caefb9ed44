/*
 * sl_rcluster: the Redis Cluster router behind sl_redis.h's calls when the URL is
 * redis-cluster:// (hiredis 0.14 has no cluster support, and no cluster client is packaged
 * for Debian 12: docs/DEPENDENCIES.md). It owns:
 *   - the slot map: which known node serves each of the 16,384 hash slots as master, read
 *     with CLUSTER SLOTS from any reachable node (connected ones first, then the seeds);
 *   - one sl_rconn per node (connect, AUTH, reconnect backoff as in sl_redis.c);
 *   - routing: a command goes to the master of its key's slot (sl_rcluster_cmd_slot);
 *   - redirections: MOVED updates the slot and marks the map stale (the next call reads it
 *     again) and resends; ASK resends once behind ASKING; TRYAGAIN waits and resends (single
 *     commands); CLUSTERDOWN and a lost node mark the map stale, so a replica promoted after
 *     a master failed is found by the next call;
 *   - pipelines over several nodes: each node keeps a FIFO of the commands sent to it; a
 *     reply read from a node belongs to the head of its FIFO; a redirected command is sent
 *     again to its new node and joins that node's FIFO; the caller gets the replies in the
 *     order it appended the commands.
 * Map refreshes are rate-limited to one per REFRESH_MIN_MS, so a node that is down (before
 * its replica is promoted) costs a caller one failed connection per backoff, not a storm of
 * CLUSTER SLOTS.
 *
 * thread: one sl_redis_t per thread (sl_redis.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/sl_mem.h"
#include "common/sl_redis_int.h"

#define REFRESH_MIN_MS 100 /* between two slot map reads */
#define REDIRECTS_MAX  5   /* MOVED/ASK/TRYAGAIN hops of one command */
#define TRYAGAIN_MS    25  /* wait before resending after TRYAGAIN */

static const char ASKING_CMD[] = "*1\r\n$6\r\nASKING\r\n";

/* ==== Slots ==== */

/* CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with. */
static unsigned crc16(const char *buf, size_t len)
{
    unsigned crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)buf[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? ((crc << 1) ^ 0x1021) : (crc << 1);
        crc &= 0xffff;
    }
    return crc;
}

int sl_rcluster_key_slot(const char *key, size_t len)
{
    /* the hash tag: what is between the first '{' and the next '}', when not empty */
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open + 1 - key);
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1) {
            key = open + 1;
            len = (size_t)(close - key);
        }
    }
    return (int)(crc16(key, len) & (SL_RCLUSTER_SLOTS - 1));
}

/* One RESP bulk string "$<n>\r\n<n bytes>\r\n" at *p (advanced past it). 0 or -1. */
static int resp_bulk(const char **p, const char *end, const char **arg, size_t *alen)
{
    const char *s = *p;
    if (s >= end || *s != '$')
        return -1;
    size_t n = 0;
    for (s++; s < end && *s >= '0' && *s <= '9'; s++)
        n = n * 10 + (size_t)(*s - '0');
    if (end - s < 2 || s[0] != '\r' || s[1] != '\n' || (size_t)(end - s - 2) < n + 2)
        return -1;
    *arg = s + 2;
    *alen = n;
    *p = s + 2 + n + 2;
    return 0;
}

static int name_is(const char *a, size_t alen, const char *name)
{
    return strlen(name) == alen && strncasecmp(a, name, alen) == 0;
}

/* Commands without a key that Sluice sends, or that an operator's tool might: any node. */
static int keyless(const char *a, size_t alen)
{
    static const char *const names[] = {"PING",   "TIME",   "INFO",     "SCRIPT",    "CLUSTER",
                                        "DBSIZE", "ECHO",   "FLUSHDB",  "FLUSHALL",  "SCAN",
                                        "KEYS",   "CONFIG", "CLIENT",   "COMMAND",   "WAIT",
                                        "AUTH",   "SELECT", "READONLY", "RANDOMKEY", "ASKING"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (name_is(a, alen, names[i]))
            return 1;
    }
    return 0;
}

int sl_rcluster_cmd_slot(const char *cmd, size_t len)
{
    const char *p = cmd, *end = cmd + len;
    if (p >= end || *p != '*')
        return -1;
    size_t argc = 0;
    for (p++; p < end && *p >= '0' && *p <= '9'; p++)
        argc = argc * 10 + (size_t)(*p - '0');
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
        return -1;
    p += 2;
    const char *arg[4] = {NULL, NULL, NULL, NULL};
    size_t alen[4] = {0, 0, 0, 0};
    size_t n = argc < 4 ? argc : 4;
    for (size_t i = 0; i < n; i++) {
        if (resp_bulk(&p, end, &arg[i], &alen[i]) != 0)
            return -1;
    }
    if (n == 0)
        return -1;
    if (name_is(arg[0], alen[0], "EVAL") || name_is(arg[0], alen[0], "EVALSHA") ||
        name_is(arg[0], alen[0], "EVAL_RO") || name_is(arg[0], alen[0], "EVALSHA_RO") ||
        name_is(arg[0], alen[0], "FCALL") || name_is(arg[0], alen[0], "FCALL_RO")) {
        /* EVAL script numkeys key...: the first key, when there is one */
        if (n < 4 || alen[2] == 0 || (alen[2] == 1 && arg[2][0] == '0'))
            return -1;
        return sl_rcluster_key_slot(arg[3], alen[3]);
    }
    if (keyless(arg[0], alen[0]) || n < 2)
        return -1;
    return sl_rcluster_key_slot(arg[1], alen[1]);
}

/* ==== Nodes ==== */

static int node_find(const struct sl_rcluster *cl, const char *host, size_t hlen, int port)
{
    for (int i = 0; i < cl->nnodes; i++) {
        const struct sl_rconn *n = cl->nodes[i];
        if (n->port == port && strlen(n->host) == hlen && memcmp(n->host, host, hlen) == 0)
            return i;
    }
    return -1;
}

/* The index of node host:port, added when new; -1 when the table is full or host too long. */
static int node_get(struct sl_rcluster *cl, const char *host, size_t hlen, int port)
{
    int i = node_find(cl, host, hlen, port);
    if (i >= 0)
        return i;
    if (cl->nnodes == SL_RCLUSTER_NODES_MAX || hlen == 0 || hlen >= sizeof(cl->nodes[0]->host))
        return -1;
    struct sl_rconn *n = sl_xcalloc(1, sizeof(*n));
    memcpy(n->host, host, hlen);
    n->host[hlen] = '\0';
    n->port = port;
    cl->nodes[cl->nnodes] = n;
    return cl->nnodes++;
}

/* ==== Slot map ==== */

/* Fill map from a CLUSTER SLOTS reply read from node asked. Returns the slots covered. */
static int parse_slots(struct sl_rcluster *cl, const redisReply *rep, int asked, int16_t *map)
{
    int covered = 0;
    if (rep->type != REDIS_REPLY_ARRAY)
        return 0;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
            continue;
        long long from = e->element[0]->integer, to = e->element[1]->integer;
        const redisReply *h = e->element[2]->element[0], *pt = e->element[2]->element[1];
        if (from < 0 || to >= SL_RCLUSTER_SLOTS || from > to || h->type != REDIS_REPLY_STRING ||
            pt->type != REDIS_REPLY_INTEGER || pt->integer < 1 || pt->integer > 65535)
            continue;
        int idx;
        if (h->len == 0 || (h->len == 1 && h->str[0] == '?')) /* "the node you asked" */
            idx = asked;
        else
            idx = node_get(cl, h->str, h->len, (int)pt->integer);
        if (idx < 0)
            continue;
        for (long long s = from; s <= to; s++)
            map[s] = (int16_t)idx;
        covered += (int)(to - from + 1);
    }
    return covered;
}

/* Read the slot map from node i. 0, 1 (the node answered but is no cluster node), or -1. */
static int refresh_from(sl_redis_t *r, int i, int16_t *map, sl_err_t *err)
{
    struct sl_rcluster *cl = r->cl;
    struct sl_rconn *n = cl->nodes[i];
    if (!n->c && sl_rconn_connect(r, n, err) != 0)
        return -1;
    redisReply *rep = redisCommand(n->c, "CLUSTER SLOTS");
    if (!rep) {
        sl_err_set(err, SL_EREDIS, "could not read the slot map from redis at %s:%d: %s", n->host,
                   n->port, n->c->errstr);
        sl_rconn_drop(n);
        return -1;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        sl_err_set(err, SL_EREDIS,
                   "redis at %s:%d is not a cluster node (%s): a single Redis takes redis://",
                   n->host, n->port, rep->str);
        freeReplyObject(rep);
        return 1;
    }
    for (int s = 0; s < SL_RCLUSTER_SLOTS; s++)
        map[s] = -1;
    int covered = parse_slots(cl, rep, i, map);
    freeReplyObject(rep);
    if (covered == 0) {
        sl_err_set(err, SL_EREDIS, "redis at %s:%d serves no slot map (cluster not set up?)",
                   n->host, n->port);
        return -1;
    }
    return 0;
}

/* Read the slot map from the first node that answers: connected nodes first, then every
 * known node (the seeds are nodes 0..). Returns 0 or SL_EREDIS. */
static int refresh(sl_redis_t *r, sl_err_t *err)
{
    struct sl_rcluster *cl = r->cl;
    cl->refreshed_at = sl_redis_mono_ms();
    int16_t *map = sl_xmalloc(sizeof(cl->slot_node));
    sl_err_t e = {0};
    int rc = -1;
    for (int pass = 0; pass < 2 && rc < 0; pass++) {
        for (int i = 0; i < cl->nnodes && rc < 0; i++) {
            if ((pass == 0) != (cl->nodes[i]->c != NULL))
                continue;
            rc = refresh_from(r, i, map, &e);
        }
    }
    if (rc == 0) {
        memcpy(cl->slot_node, map, sizeof(cl->slot_node));
        cl->stale = 0;
    } else if (rc < 0) {
        char why[SL_ERR_MSG_MAX];
        (void)snprintf(why, sizeof(why), "%s", e.msg[0] ? e.msg : "no node answered");
        sl_err_set(err, SL_EREDIS, "could not read the redis cluster's slot map: %s", why);
    } else {
        sl_err_set(err, e.code, "%s", e.msg);
    }
    free(map);
    return rc == 0 ? 0 : SL_EREDIS;
}

/* Refresh a stale map, at most once per REFRESH_MIN_MS (force: now). */
static void maybe_refresh(sl_redis_t *r, int force)
{
    struct sl_rcluster *cl = r->cl;
    if (!cl->stale && !force)
        return;
    if (!force && sl_redis_mono_ms() - cl->refreshed_at < REFRESH_MIN_MS)
        return;
    (void)refresh(r, NULL);
}

/* The node for slot (-1: any node: a connected master first). -1 when none is known. */
static int pick(const struct sl_rcluster *cl, int slot)
{
    if (slot >= 0)
        return cl->slot_node[slot];
    for (int s = 0; s < SL_RCLUSTER_SLOTS; s += 1024) {
        int i = cl->slot_node[s];
        if (i >= 0 && cl->nodes[i]->c)
            return i;
    }
    return cl->slot_node[0] >= 0 ? cl->slot_node[0] : 0;
}

/* A redirection "MOVED|ASK <slot> <host>:<port>": the node's index (added when new), its
 * slot in *slot and 1 for ASK in *ask; -1 when rep is no redirection. */
static int redirect_target(struct sl_rcluster *cl, const redisReply *rep, int *slot, int *ask)
{
    if (rep->type != REDIS_REPLY_ERROR || !rep->str)
        return -1;
    const char *s = rep->str;
    if (strncmp(s, "MOVED ", 6) == 0) {
        *ask = 0;
        s += 6;
    } else if (strncmp(s, "ASK ", 4) == 0) {
        *ask = 1;
        s += 4;
    } else {
        return -1;
    }
    char *end;
    long sl = strtol(s, &end, 10);
    if (end == s || *end != ' ' || sl < 0 || sl >= SL_RCLUSTER_SLOTS)
        return -1;
    const char *hp = end + 1;
    const char *colon = strrchr(hp, ':');
    if (!colon)
        return -1;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 1 || port > 65535)
        return -1;
    *slot = (int)sl;
    return node_get(cl, hp, (size_t)(colon - hp), (int)port);
}

static int is_error(const redisReply *rep, const char *prefix)
{
    return rep->type == REDIS_REPLY_ERROR && rep->str &&
           strncmp(rep->str, prefix, strlen(prefix)) == 0;
}

/* ==== Open, close ==== */

int sl_rcluster_open(sl_redis_t *r, sl_err_t *err)
{
    struct sl_rcluster *cl = sl_xcalloc(1, sizeof(*cl));
    r->cl = cl;
    for (int s = 0; s < SL_RCLUSTER_SLOTS; s++)
        cl->slot_node[s] = -1;
    for (size_t i = 0; i < r->url.nseeds; i++) {
        const struct sl_redis_addr *a = &r->url.seeds[i];
        (void)node_get(cl, a->host, strlen(a->host), a->port);
    }
    return refresh(r, err);
}

static void pipe_reset(struct sl_rcluster *cl)
{
    for (size_t i = 0; i < cl->npend; i++) {
        struct sl_rpend *e = &cl->pend[i];
        if (!e->internal)
            redisFreeCommand(e->cmd);
        if (e->rep)
            freeReplyObject(e->rep);
    }
    cl->npend = cl->head = cl->ncaller = cl->nreturned = 0;
    for (int i = 0; i < cl->nnodes; i++) {
        struct sl_rconn *n = cl->nodes[i];
        if (n->qhead != n->qlen) /* replies never read: the connection is out of step */
            sl_rconn_drop(n);
        n->qhead = n->qlen = 0;
        n->unflushed = 0;
    }
}

void sl_rcluster_close(sl_redis_t *r)
{
    struct sl_rcluster *cl = r->cl;
    if (!cl)
        return;
    pipe_reset(cl);
    for (int i = 0; i < cl->nnodes; i++) {
        sl_rconn_drop(cl->nodes[i]);
        free(cl->nodes[i]->q);
        free(cl->nodes[i]);
    }
    free(cl->pend);
    free(cl);
    r->cl = NULL;
}

/* ==== Single commands ==== */

/* Send cmd to node i (behind ASKING when asking) and read its reply; NULL with err filled
 * when the connection failed (then dropped). */
static redisReply *
send_one(sl_redis_t *r, int i, const char *cmd, size_t len, int asking, sl_err_t *err)
{
    struct sl_rconn *n = r->cl->nodes[i];
    void *rep = NULL;
    if (asking)
        (void)redisAppendFormattedCommand(n->c, ASKING_CMD, sizeof(ASKING_CMD) - 1);
    (void)redisAppendFormattedCommand(n->c, cmd, len);
    if (asking) {
        if (redisGetReply(n->c, &rep) != REDIS_OK)
            goto lost;
        freeReplyObject(rep);
        rep = NULL;
    }
    if (redisGetReply(n->c, &rep) == REDIS_OK) {
        n->backoff_ms = 0; /* it answers (sl_redis.c: a reply ends the back-off) */
        return rep;
    }
lost:
    sl_err_set(err, SL_EREDIS, "could not run a redis command on %s:%d: %s", n->host, n->port,
               n->c->errstr);
    sl_rconn_drop(n);
    return NULL;
}

redisReply *sl_rcluster_exec(sl_redis_t *r, char *cmd, size_t len, int idempotent, sl_err_t *err)
{
    struct sl_rcluster *cl = r->cl;
    if (cl->npend)
        pipe_reset(cl); /* a pipeline left unread: drop it, never mix its replies in */
    int slot = sl_rcluster_cmd_slot(cmd, len);
    int ask_node = -1, retried = 0;
    for (int hop = 0; hop <= REDIRECTS_MAX; hop++) {
        maybe_refresh(r, 0);
        int i = ask_node >= 0 ? ask_node : pick(cl, slot);
        if (i < 0) {
            cl->stale = 1;
            sl_err_set(err, SL_EREDIS, "no redis cluster master serves slot %d", slot);
            return NULL;
        }
        struct sl_rconn *n = cl->nodes[i];
        if (!n->c && sl_rconn_connect(r, n, err) != 0) {
            /* nothing was sent: read the map again once, then give up */
            cl->stale = 1;
            if (retried++)
                return NULL;
            maybe_refresh(r, 1);
            ask_node = -1;
            continue;
        }
        redisReply *rep = send_one(r, i, cmd, len, ask_node >= 0, err);
        ask_node = -1;
        if (!rep) {
            cl->stale = 1;
            if (!idempotent || retried++) /* a script's effect is unknown: not resent */
                return NULL;
            continue;
        }
        int tslot = -1, ask = 0;
        int t = redirect_target(cl, rep, &tslot, &ask);
        if (t >= 0) {
            freeReplyObject(rep);
            if (ask) {
                ask_node = t;
            } else {
                cl->slot_node[tslot] = (int16_t)t;
                cl->stale = 1; /* a slot moved: others may have too */
            }
            continue;
        }
        if (is_error(rep, "TRYAGAIN")) {
            freeReplyObject(rep);
            struct timespec ts = {0, TRYAGAIN_MS * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (is_error(rep, "CLUSTERDOWN"))
            cl->stale = 1;
        return rep;
    }
    sl_err_set(err, SL_EREDIS, "redis command for slot %d redirected more than %d times", slot,
               REDIRECTS_MAX);
    return NULL;
}

/* ==== Pipelines ==== */

static size_t pend_new(struct sl_rcluster *cl)
{
    if (cl->npend == cl->cappend) {
        cl->cappend = cl->cappend ? cl->cappend * 2 : 64;
        cl->pend = sl_xrealloc(cl->pend, cl->cappend * sizeof(*cl->pend));
    }
    struct sl_rpend *e = &cl->pend[cl->npend];
    memset(e, 0, sizeof(*e));
    e->node = -1;
    e->slot = -1;
    return cl->npend++;
}

static void q_push(struct sl_rconn *n, size_t idx)
{
    if (n->qlen == n->qcap) {
        n->qcap = n->qcap ? n->qcap * 2 : 64;
        n->q = sl_xrealloc(n->q, n->qcap * sizeof(*n->q));
    }
    n->q[n->qlen++] = idx;
}

static void pend_fail(struct sl_rcluster *cl, size_t idx, const char *why)
{
    struct sl_rpend *e = &cl->pend[idx];
    e->state = PEND_FAILED;
    size_t l = strnlen(why, sizeof(e->why) - 1);
    memcpy(e->why, why, l);
    e->why[l] = '\0';
}

/* Node i's connection is lost: every command waiting on it fails. */
static void node_fail(struct sl_rcluster *cl, int i, const char *why)
{
    struct sl_rconn *n = cl->nodes[i];
    for (size_t k = n->qhead; k < n->qlen; k++) {
        if (cl->pend[n->q[k]].state == PEND_WAITING)
            pend_fail(cl, n->q[k], why);
    }
    n->qhead = n->qlen = 0;
    n->unflushed = 0;
    sl_rconn_drop(n);
    cl->stale = 1;
}

/* Queue command idx on node i (behind an ASKING when asking). */
static void pend_send(sl_redis_t *r, size_t idx, int i, int asking)
{
    struct sl_rcluster *cl = r->cl;
    struct sl_rconn *n = cl->nodes[i];
    sl_err_t e = {0};
    if (!n->c && sl_rconn_connect(r, n, &e) != 0) {
        cl->stale = 1;
        pend_fail(cl, idx, e.msg);
        return;
    }
    if (asking) {
        size_t a = pend_new(cl);
        cl->pend[a].internal = 1;
        cl->pend[a].cmd = (char *)(uintptr_t)ASKING_CMD;
        cl->pend[a].len = sizeof(ASKING_CMD) - 1;
        cl->pend[a].node = i;
        (void)redisAppendFormattedCommand(n->c, ASKING_CMD, sizeof(ASKING_CMD) - 1);
        q_push(n, a);
    }
    struct sl_rpend *p = &cl->pend[idx];
    (void)redisAppendFormattedCommand(n->c, p->cmd, p->len);
    p->node = i;
    q_push(n, idx);
    n->unflushed = 1;
}

int sl_rcluster_append(sl_redis_t *r, char *cmd, size_t len)
{
    struct sl_rcluster *cl = r->cl;
    if (cl->npend == 0)
        maybe_refresh(r, 0);
    size_t idx = pend_new(cl);
    struct sl_rpend *p = &cl->pend[idx];
    p->cmd = cmd;
    p->len = len;
    p->slot = sl_rcluster_cmd_slot(cmd, len);
    cl->ncaller++;
    int i = pick(cl, p->slot);
    if (i < 0) {
        cl->stale = 1;
        pend_fail(cl, idx, "no redis cluster master serves the command's slot");
        return 0;
    }
    pend_send(r, idx, i, 0);
    return 0;
}

/* Write what every node has queued, so the nodes work in parallel. */
static void flush_all(struct sl_rcluster *cl)
{
    for (int i = 0; i < cl->nnodes; i++) {
        struct sl_rconn *n = cl->nodes[i];
        if (!n->unflushed || !n->c)
            continue;
        n->unflushed = 0;
        int done = 0;
        while (!done) {
            if (redisBufferWrite(n->c, &done) != REDIS_OK) {
                sl_err_t e = {0};
                sl_err_set(&e, SL_EREDIS, "could not send to redis at %s:%d: %s", n->host, n->port,
                           n->c->errstr);
                node_fail(cl, i, e.msg);
                break;
            }
        }
    }
}

/* A reply read for command idx: drop an ASKING's, follow a redirection, or keep it. */
static void pend_reply(sl_redis_t *r, size_t idx, redisReply *rep)
{
    struct sl_rcluster *cl = r->cl;
    struct sl_rpend *p = &cl->pend[idx];
    if (p->internal) {
        freeReplyObject(rep);
        return;
    }
    int tslot = -1, ask = 0;
    int t = p->redirects < REDIRECTS_MAX ? redirect_target(cl, rep, &tslot, &ask) : -1;
    if (t >= 0) {
        freeReplyObject(rep);
        p->redirects++;
        if (!ask) {
            cl->slot_node[tslot] = (int16_t)t;
            cl->stale = 1;
        }
        pend_send(r, idx, t, ask);
        return;
    }
    if (is_error(rep, "CLUSTERDOWN"))
        cl->stale = 1;
    p->rep = rep;
    p->state = PEND_DONE;
}

redisReply *sl_rcluster_get_reply(sl_redis_t *r, sl_err_t *err)
{
    struct sl_rcluster *cl = r->cl;
    while (cl->head < cl->npend && cl->pend[cl->head].internal)
        cl->head++;
    if (cl->head >= cl->npend) {
        sl_err_set(err, SL_EREDIS, "no redis command is waiting for its reply");
        return NULL;
    }
    size_t h = cl->head;
    flush_all(cl);
    while (cl->pend[h].state == PEND_WAITING) {
        int i = cl->pend[h].node;
        struct sl_rconn *n = cl->nodes[i];
        void *rep = NULL;
        if (!n->c || n->qhead >= n->qlen) {
            node_fail(cl, i, "redis connection lost");
            continue;
        }
        if (redisGetReply(n->c, &rep) != REDIS_OK) {
            sl_err_t e = {0};
            sl_err_set(&e, SL_EREDIS, "could not read a redis reply from %s:%d: %s", n->host,
                       n->port, n->c->errstr);
            node_fail(cl, i, e.msg);
            continue;
        }
        n->backoff_ms = 0;
        pend_reply(r, n->q[n->qhead++], rep);
        flush_all(cl); /* a redirection queued the command on another node */
    }
    struct sl_rpend *p = &cl->pend[h];
    redisReply *out = NULL;
    if (p->state == PEND_DONE) {
        out = p->rep;
        p->rep = NULL;
    } else {
        sl_err_set(err, SL_EREDIS, "%s", p->why);
    }
    cl->head = h + 1;
    if (++cl->nreturned == cl->ncaller)
        pipe_reset(cl);
    return out;
}
