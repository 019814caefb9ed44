/*
 * sl_redis internals shared by the standalone connection (sl_redis.c) and the Redis Cluster
 * router (sl_rcluster.c). Not for callers: they see sl_redis.h only.
 *
 * thread: one sl_redis_t per thread, as sl_redis.h says.
 */
#ifndef SL_REDIS_INT_H
#define SL_REDIS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "common/sl_err.h"
#include "common/sl_redis.h"

#define SL_RCLUSTER_SLOTS     16384 /* Redis Cluster hash slots */
#define SL_RCLUSTER_NODES_MAX 64    /* nodes one router tracks (masters and the seeds) */

/* One server connection with its reconnect backoff (sl_redis.c, "After a failed
 * connection"). In a cluster, also the node's pipeline queue: the indexes (into the
 * router's pending commands) of the commands sent to it whose replies are not read yet,
 * in the order they were sent. */
struct sl_rconn {
    char host[256];
    int port;
    redisContext *c;    /* NULL while disconnected */
    int64_t retry_at;   /* after a failed connection: none tried before (mono ms) */
    int64_t backoff_ms; /* wait after the next failed connection, ms */
    size_t *q;          /* cluster pipeline: pending command indexes, FIFO */
    size_t qhead, qlen, qcap;
    int unflushed; /* cluster pipeline: commands appended but not written yet */
};

/* A command of a cluster pipeline (sl_redis_append), kept formatted until its reply is
 * read: a MOVED or ASK reply sends it again to the node named. */
enum sl_rpend_state { PEND_WAITING, PEND_DONE, PEND_FAILED };
struct sl_rpend {
    char *cmd; /* RESP-formatted (redisFormatCommandArgv; redisFreeCommand) */
    size_t len;
    int slot;      /* key slot, or -1 (a keyless command) */
    int node;      /* index in the router's nodes: where it was last sent */
    int internal;  /* an ASKING sent before a redirected command: its reply is dropped */
    int redirects; /* MOVED/ASK followed so far */
    enum sl_rpend_state state;
    redisReply *rep;          /* PEND_DONE: the reply, until handed to the caller */
    char why[SL_ERR_MSG_MAX]; /* PEND_FAILED: what went wrong */
};

struct sl_rcluster {
    struct sl_rconn *nodes[SL_RCLUSTER_NODES_MAX]; /* known nodes; seeds first */
    int nnodes;
    int16_t slot_node[SL_RCLUSTER_SLOTS]; /* node index serving each slot as master; -1 */
    int stale;                            /* the slot map needs a refresh */
    int64_t refreshed_at;                 /* mono ms of the last refresh attempt */
    struct sl_rpend *pend;                /* the pipeline's commands in append order */
    size_t npend, cappend;
    size_t head;    /* next caller command whose reply sl_redis_get_reply returns */
    size_t ncaller; /* caller commands appended (internal ASKINGs not counted) */
    size_t nreturned;
};

struct sl_redis {
    struct sl_redis_url url; /* seeds, db, ACL user and password (wiped on close) */
    int timeout_ms;          /* connect and command timeout */
    struct sl_rconn one;     /* standalone: the connection */
    struct sl_rcluster *cl;  /* cluster mode (url.cluster): the router; else NULL */
};

int64_t sl_redis_mono_ms(void);
/* Whether an error reply (s, len bytes) says the server no longer takes writes: READONLY or
 * MASTERDOWN, as Redis 7 answers them also from a script, or wrapped in "ERR Error running
 * script" as Redis < 7 answers a script's write. False for NULL. */
bool sl_redis_err_demoted(const char *s, size_t len);
/* Connect conn (its host and port) with r's credentials (and database when standalone),
 * unless a recent attempt failed; see sl_redis.c. 0 or SL_EREDIS with err filled. */
int sl_rconn_connect(sl_redis_t *r, struct sl_rconn *conn, sl_err_t *err);
void sl_rconn_drop(struct sl_rconn *conn);

/* sl_rcluster.c: the cluster versions of sl_redis.h's calls. */
int sl_rcluster_open(sl_redis_t *r, sl_err_t *err);
void sl_rcluster_close(sl_redis_t *r);
redisReply *sl_rcluster_exec(sl_redis_t *r, char *cmd, size_t len, int idempotent, sl_err_t *err);
int sl_rcluster_append(sl_redis_t *r, char *cmd, size_t len);
redisReply *sl_rcluster_get_reply(sl_redis_t *r, sl_err_t *err);

/* The key hash slot of a RESP-formatted command (cmd, len): CRC16 of its key (or the key's
 * {hash tag}) modulo 16384; -1 for a command without a key. */
int sl_rcluster_cmd_slot(const char *cmd, size_t len);
/* The slot of a key (its hash tag when it has one). */
int sl_rcluster_key_slot(const char *key, size_t len);

#endif /* SL_REDIS_INT_H */
