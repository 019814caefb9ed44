/*
 * A private Redis Cluster for integration tests: six redis-server processes in cluster mode
 * on free loopback ports (three masters, three replicas, cluster-node-timeout 2 s), created
 * with redis-cli --cluster create, in temp dirs. Exits the test with a reason on failure,
 * after killing the nodes it started (a node left running would hold the test runner's
 * output pipe until its timeout) and keeping their logs.
 */
#ifndef SL_TEST_RCLUSTER_H
#define SL_TEST_RCLUSTER_H

#include <sys/stat.h>

#include "sl_testenv.h"

#define SL_TEST_RC_NODES 6

struct sl_test_rcluster {
    pid_t pid[SL_TEST_RC_NODES];
    int port[SL_TEST_RC_NODES];
    int bus[SL_TEST_RC_NODES]; /* cluster bus port, given explicitly: port+10000 may pass 65535 */
    char dir[128];
    char url[512]; /* redis-cluster://127.0.0.1:p0,127.0.0.1:p1,127.0.0.1:p2 */
};

static inline redisContext *sl_test_rc_conn(int port)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    return c;
}

/* Does node port answer CLUSTER INFO with cluster_state:ok? */
static inline int sl_test_rc_node_ok(int port)
{
    redisContext *c = sl_test_rc_conn(port);
    if (!c)
        return 0;
    redisReply *r = redisCommand(c, "CLUSTER INFO");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") &&
             strstr(r->str, "cluster_slots_ok:16384");
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

static inline pid_t sl_test_rc_spawn(struct sl_test_rcluster *t, int i)
{
    char port[16], bus[16], dir[160];
    snprintf(port, sizeof(port), "%d", t->port[i]);
    snprintf(bus, sizeof(bus), "%d", t->bus[i]);
    snprintf(dir, sizeof(dir), "%s/n%d", t->dir, i);
    (void)mkdir(dir, 0700);
    char log[200];
    snprintf(log, sizeof(log), "%s/redis.log", dir);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", dir,
               "--appendonly", "yes", "--save", "", "--cluster-enabled", "yes",
               "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
               "--cluster-port", bus, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static inline void sl_test_rc_fail(struct sl_test_rcluster *t, const char *msg, int port)
{
    fprintf(stderr, "%s (port %d; logs kept in %s)\n", msg, port, t->dir);
    for (int i = 0; i < SL_TEST_RC_NODES; i++) {
        if (t->pid[i] > 0) {
            kill(t->pid[i], SIGKILL);
            waitpid(t->pid[i], NULL, 0);
        }
    }
    exit(1);
}

/* Node i answering on its port: 1, or 0 when it exited (a port it was given was taken
 * between sl_test_free_port and its bind, e.g. by a client socket of another test: the
 * ports are in the ephemeral range) or did not answer within 5 s. */
static inline int sl_test_rc_up(struct sl_test_rcluster *t, int i)
{
    for (int k = 0; k < 100; k++) {
        redisContext *c = sl_test_rc_conn(t->port[i]);
        if (c) {
            redisFree(c);
            return 1;
        }
        if (waitpid(t->pid[i], NULL, WNOHANG) == t->pid[i]) {
            t->pid[i] = 0;
            return 0;
        }
        usleep(50000);
    }
    return 0;
}

static inline void sl_test_rcluster_start(struct sl_test_rcluster *t)
{
    memset(t->pid, 0, sizeof(t->pid));
    snprintf(t->dir, sizeof(t->dir), "/tmp/sl_rcluster_XXXXXX");
    if (!mkdtemp(t->dir)) {
        fprintf(stderr, "cannot create temp dir: %s\n", strerror(errno));
        exit(1);
    }
    for (int i = 0; i < SL_TEST_RC_NODES; i++) {
        t->port[i] = sl_test_free_port();
        t->bus[i] = sl_test_free_port();
        t->pid[i] = sl_test_rc_spawn(t, i);
    }
    for (int i = 0; i < SL_TEST_RC_NODES; i++) {
        int up = sl_test_rc_up(t, i);
        for (int attempt = 1; attempt < 5 && !up; attempt++) {
            if (t->pid[i] > 0) { /* alive but silent: replaced like one that exited */
                kill(t->pid[i], SIGKILL);
                waitpid(t->pid[i], NULL, 0);
            }
            t->port[i] = sl_test_free_port();
            t->bus[i] = sl_test_free_port();
            t->pid[i] = sl_test_rc_spawn(t, i);
            up = sl_test_rc_up(t, i);
        }
        if (!up)
            sl_test_rc_fail(t, "redis-server did not start (run scripts/setup.sh)", t->port[i]);
    }
    char create[1024];
    int off = snprintf(create, sizeof(create), "redis-cli --cluster create");
    for (int i = 0; i < SL_TEST_RC_NODES; i++)
        off += snprintf(create + off, sizeof(create) - (size_t)off, " 127.0.0.1:%d", t->port[i]);
    snprintf(create + off, sizeof(create) - (size_t)off,
             " --cluster-replicas 1 --cluster-yes >%s/create.log 2>&1", t->dir);
    if (system(create) != 0)
        sl_test_rc_fail(t, "redis-cli --cluster create failed (create.log)", t->port[0]);
    for (int k = 0; k < 200; k++) {
        int ok = 1;
        for (int i = 0; i < SL_TEST_RC_NODES && ok; i++)
            ok = sl_test_rc_node_ok(t->port[i]);
        if (ok) {
            snprintf(t->url, sizeof(t->url),
                     "redis-cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", t->port[0],
                     t->port[1], t->port[2]);
            return;
        }
        usleep(100000);
    }
    sl_test_rc_fail(t, "the test cluster did not reach cluster_state:ok in 20 s", t->port[0]);
}

static inline void sl_test_rcluster_stop(struct sl_test_rcluster *t)
{
    for (int i = 0; i < SL_TEST_RC_NODES; i++) {
        if (t->pid[i] > 0) {
            kill(t->pid[i], SIGKILL);
            waitpid(t->pid[i], NULL, 0);
            t->pid[i] = 0;
        }
    }
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", t->dir);
}

#endif /* SL_TEST_RCLUSTER_H */
