/*
 * sl_redis: a blocking hiredis 0.14 connection with the things every caller needs: URL
 * parsing (redis://[[user]:password@]host:port[/db]), connect and command timeouts, AUTH
 * (ACL user and password, or the password alone) and SELECT,
 * transparent reconnect after a dropped connection, and Lua scripts run by EVALSHA with a
 * fallback to EVAL when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
 * hiredis 0.14 has no RESP3 and no TLS: never send HELLO 3.
 *
 * Redis Cluster (redis-cluster://[[user]:password@]host:port[,host:port...]): the same calls
 * route each command to the master serving its key's hash slot (common/sl_rcluster.c): the
 * slot map comes from CLUSTER SLOTS on any reachable node (seeds first), MOVED updates it and
 * resends, ASK resends once behind ASKING, TRYAGAIN waits and resends, and a lost node or a
 * CLUSTERDOWN makes the next command refresh the map (so a promoted replica is found after
 * a failover). A command's key is its first argument, or EVAL/EVALSHA's first key; keyless
 * commands (PING, TIME, ...) go to any reachable node. Every key of one command (and of one
 * script) must share a hash slot: sl_rstate's keys carry {hash tags} for that. Pipelines
 * spread over the nodes and return replies in the order the commands were appended.
 *
 * thread: one sl_redis_t per thread.
 */
#ifndef SL_REDIS_H
#define SL_REDIS_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#include "common/sl_err.h"

typedef struct sl_redis sl_redis_t;

#define SL_REDIS_SEEDS_MAX 16 /* seed nodes in a redis-cluster:// URL */

struct sl_redis_addr {
    char host[256]; /* server host */
    int port;       /* server port; 6379 when the URL has none */
};

/* A parsed URL: redis://[[user]:password@]host[:port][/db], or
 * redis-cluster://[[user]:password@]host[:port][,host[:port]...][/0]. */
struct sl_redis_url {
    char host[256]; /* server host (cluster: the first seed's) */
    int port;       /* server port; 6379 when the URL has none */
    int db;         /* database to SELECT, 0..1000; 0 when the URL has none (cluster: 0) */
    char *user;     /* ACL user (percent-decoded), or NULL: AUTH with the password alone */
    char *password; /* percent-decoded, or NULL: no AUTH */
    int cluster;    /* 1 for redis-cluster:// */
    size_t nseeds;  /* cluster: seed nodes (1..SL_REDIS_SEEDS_MAX); standalone: 1 */
    struct sl_redis_addr seeds[SL_REDIS_SEEDS_MAX];
};

/*
 * Parse url into u (always initialised: call sl_redis_url_fini). User and password may be
 * percent-encoded (%40 for '@'); the userinfo ends at the last '@'. A user without a
 * password is refused; a cluster URL takes database 0 only. Returns 0 or SL_ECONFIG with
 * err naming what is wrong (never echoing the URL, which may hold a password).
 */
int sl_redis_url_parse(const char *url, struct sl_redis_url *u, sl_err_t *err);
/* Wipe and free the user and password of u. */
void sl_redis_url_fini(struct sl_redis_url *u);

/* A Lua script: text plus its SHA1 (filled lazily). Define one static per script. */
struct sl_redis_script {
    const char *name; /* for error messages */
    const char *lua;  /* script text */
    char sha[41];     /* hex SHA1; "" until first use */
};

/* Connect (cluster: to a seed, and read the slot map); returns NULL and fills err (the password is
 * never in messages). After a failed (re)connection, calls fail at once without connecting for a
 * growing wait (250 ms doubling to 2 s; reset by a connection that works), so a frozen Redis costs
 * one timeout per wait. */
sl_redis_t *sl_redis_connect(const char *url, int timeout_ms, sl_err_t *err);
void sl_redis_close(sl_redis_t *r);

/*
 * Run a command (argv form, binary safe). Returns a reply the caller frees with
 * freeReplyObject, or NULL with err filled (connection errors trigger one reconnect and one
 * retry only for idempotent=1 commands). An error reply is returned as a reply of type
 * REDIS_REPLY_ERROR, not as NULL.
 */
redisReply *sl_redis_cmd(sl_redis_t *r,
                         int idempotent,
                         int argc,
                         const char **argv,
                         const size_t *argvlen,
                         sl_err_t *err);
/* printf-style convenience for fixed commands; external values must go through %s/%b. */
redisReply *sl_redis_cmdf(sl_redis_t *r, sl_err_t *err, const char *fmt, ...);

/* EVALSHA script with nkeys keys followed by args (EVAL on NOSCRIPT). Same reply rules. */
redisReply *sl_redis_eval(sl_redis_t *r,
                          struct sl_redis_script *s,
                          int nkeys,
                          int argc,
                          const char **argv,
                          const size_t *argvlen,
                          sl_err_t *err);

/* Pipelining: append commands, then read every reply in order (a cluster pipeline spreads
 * over nodes: read all before the next command). */
int sl_redis_append(sl_redis_t *r, int argc, const char **argv, const size_t *argvlen);
redisReply *sl_redis_get_reply(sl_redis_t *r, sl_err_t *err);

/* The Redis Cluster hash slot of key (0..16383): CRC16 of its hash tag ({...}, when not
 * empty) or of the whole key. A key's slot is the same whatever the URL's kind. */
int sl_redis_key_slot(const char *key, size_t len);

/* The underlying context (borrowed), e.g. for redisAppendCommand; NULL while disconnected
 * and always in cluster mode (use sl_redis_append there). */
redisContext *sl_redis_ctx(sl_redis_t *r);

#endif /* SL_REDIS_H */
