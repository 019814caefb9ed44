/*
 * Helpers for integration tests: start a private redis-server on a free loopback port in a
 * temp dir (for tests that need only Redis), and read the shared stack's addresses from the
 * environment (scripts/test.sh exports them). A missing service fails the test with a reason.
 */
#ifndef SL_TESTENV_H
#define SL_TESTENV_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

struct sl_test_redis {
    pid_t pid;     /* redis-server process */
    int port;      /* its port */
    char dir[128]; /* temp dir */
    char url[160]; /* redis://127.0.0.1:port */
};

static inline int sl_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
        fprintf(stderr, "cannot find a free port: %s\n", strerror(errno));
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Start redis-server (appendonly as in production); exits the test on failure. */
static inline void sl_test_redis_start(struct sl_test_redis *t)
{
    snprintf(t->dir, sizeof(t->dir), "/tmp/sl_redis_XXXXXX");
    if (!mkdtemp(t->dir)) {
        fprintf(stderr, "cannot create temp dir: %s\n", strerror(errno));
        exit(1);
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        t->port = sl_test_free_port();
        char port[16];
        snprintf(port, sizeof(port), "%d", t->port);
        t->pid = fork();
        if (t->pid == 0) {
            int devnull = open("/dev/null", O_WRONLY);
            dup2(devnull, 1);
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir",
                   t->dir, "--appendonly", "yes", "--save", "", (char *)NULL);
            fprintf(stderr, "cannot exec redis-server (run scripts/setup.sh): %s\n",
                    strerror(errno));
            _exit(127);
        }
        for (int i = 0; i < 100; i++) {
            struct timeval tv = {1, 0};
            redisContext *c = redisConnectWithTimeout("127.0.0.1", t->port, tv);
            if (c && !c->err) {
                redisReply *r = redisCommand(c, "PING");
                int ok = r && r->type == REDIS_REPLY_STATUS;
                if (r)
                    freeReplyObject(r);
                redisFree(c);
                if (ok) {
                    snprintf(t->url, sizeof(t->url), "redis://127.0.0.1:%d", t->port);
                    return;
                }
            } else if (c) {
                redisFree(c);
            }
            int st;
            if (waitpid(t->pid, &st, WNOHANG) == t->pid)
                break;
            usleep(50000);
        }
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
    }
    fprintf(stderr, "redis-server did not become ready (is it installed? run scripts/setup.sh)\n");
    exit(1);
}

static inline void sl_test_redis_stop(struct sl_test_redis *t)
{
    if (t->pid > 0) {
        kill(t->pid, SIGTERM);
        waitpid(t->pid, NULL, 0);
        t->pid = 0;
    }
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", t->dir);
}

/* Required environment variable from scripts/test.sh; exits the test with a reason if unset. */
static inline const char *sl_test_env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        fprintf(stderr,
                "%s is not set: run integration tests through scripts/test.sh, which "
                "starts the stack\n",
                name);
        exit(1);
    }
    return v;
}

#endif /* SL_TESTENV_H */
