/*
 * sluice-consumer: delivers the records of sluice.deliveries to their endpoints.
 *
 *   parse args -> load config (exit 78 on any error, before connecting) -> master key ->
 *   endpoint table (sluice.endpoints read to its high watermark) -> the Redis database's
 *   owner checked (exit 78 when it is another deployment's) -> engine -> run until
 *   SIGTERM/SIGINT -> drain, reschedule, flush, commit -> exit 0.
 * A SIGTERM/SIGINT while the endpoint table is still loading (Kafka unreachable: up to 60 s)
 * ends that wait at once: nothing was taken yet, so the process logs start_cancelled and
 * exits 0 without creating the delivery loops.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/sl_cfg.h"
#include "common/sl_endpoints.h"
#include "common/sl_kafka.h"
#include "common/sl_limits.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_probe.h"
#include "common/sl_redis.h"
#include "common/sl_rstate.h"
#include "common/sl_secretbox.h"
#include "consumer/cons_engine.h"
#include "consumer/cons_metrics.h"

struct loop {
    cons_engine_t *engine;
    pthread_t thr;
    bool started;
    int rc; /* cons_engine_run's result */
};

/* The process's delivery loops (consumer_threads), for the signal handler: set before the
 * handler can see a non-zero count, never changed while it can. */
static struct loop *g_loops;
static volatile sig_atomic_t g_nloops;
/* A signal came, maybe before the loops existed (a lock-free atomic: set in the handler,
 * watched by the endpoint table's start-up waits). */
static atomic_bool g_stop;
_Static_assert(ATOMIC_BOOL_LOCK_FREE == 2, "g_stop is set from a signal handler");

/* Readiness (docs/METRICS.md), asked on the metrics listener's thread. */
struct readiness {
    const struct sl_config *cfg;
    atomic_bool endpoints_loaded;
    _Atomic(struct loop *) loops; /* set once every loop exists */
    atomic_int nloops;
    sl_redis_t *redis; /* the probe's own connection (listener thread only) */
};

static bool ready_cb(void *arg, struct sl_buf *checks)
{
    struct readiness *r = arg;
    bool ready = true;
    bool eps = atomic_load(&r->endpoints_loaded);
    sl_probe_check(checks, "endpoints", eps ? "loaded" : "loading");
    ready &= eps;
    struct loop *loops = atomic_load(&r->loops);
    int n = atomic_load(&r->nloops), joined = 0;
    for (int i = 0; loops && i < n; i++)
        joined += cons_engine_joined(loops[i].engine);
    bool group = loops && joined == n;
    sl_probe_check(checks, "kafka_group", group ? "joined" : "joining");
    ready &= group;
    sl_err_t err;
    if (!r->redis)
        r->redis = sl_redis_connect(r->cfg->redis_url, 1000, &err);
    redisReply *rep = r->redis ? sl_redis_cmdf(r->redis, &err, "PING") : NULL;
    bool redis = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep)
        freeReplyObject(rep);
    sl_probe_check(checks, "redis", redis ? "ok" : "unreachable");
    ready &= redis;
    return ready;
}

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&g_stop, true);
    for (int i = 0; i < g_nloops; i++)
        cons_engine_stop(g_loops[i].engine);
}

/* One delivery loop's thread. A loop that ends on a fatal error stops the others: the
 * process exits non-zero and its orchestrator restarts it whole. */
static void *loop_main(void *arg)
{
    struct loop *l = arg;
    l->rc = cons_engine_run(l->engine);
    if (l->rc != 0)
        on_signal(0);
    return NULL;
}

static void usage(FILE *f)
{
    (void)fprintf(
        f, "usage: sluice-consumer [--config FILE] [--check-config] [--print-config]\n"
           "                       [--help-config] [--version] [--help]\n"
           "\n"
           "Delivers webhook and postback records from Kafka (topic_deliveries) over HTTP,\n"
           "signed with Standard Webhooks, with retries, circuit breakers and duplicate\n"
           "protection kept in Redis. Run any number of them: they form one consumer group.\n"
           "Each runs consumer_threads delivery loops (default 1; one per core it may use),\n"
           "each a member of that group with its own share of the partitions.\n"
           "Configuration comes from SLUICE_* environment variables or a config file; see\n"
           "--help-config. SIGTERM or SIGINT drains in-flight requests and exits cleanly;\n"
           "during start-up (the endpoint table still loading, e.g. Kafka unreachable) it\n"
           "ends the wait and exits 0 at once.\n"
           "The Redis database (redis_url) holds one deployment's state: the first consumer\n"
           "binds it to its Kafka cluster and topic_endpoints (key sluice:owner), and a\n"
           "consumer of another deployment exits 78 at start-up; a running one exits 78\n"
           "within 5 s when the database is bound to another deployment, and reports a\n"
           "database that lost the key (emptied or replaced) as redis_state_lost.\n");
}

/* A stop request came before anything was taken: one line, then exit 0. */
static void log_start_cancelled(const char *phase, const char *what)
{
    SL_LOGKV(SL_LOG_INFO, "consumer", "start_cancelled",
             ((struct sl_log_kv[]){SL_KV_S("phase", phase)}),
             "stop requested while %s: exiting before any record was taken", what);
}

/* The master key that opens the endpoints' signing secrets. Returns 0, or -1 with the reason
 * on stderr. */
static int load_master_key(const struct sl_config *cfg, struct sl_masterkey *mk)
{
    sl_err_t err;
    if (!cfg->master_key[0]) {
        (void)fprintf(stderr,
                      "sluice-consumer: master_key (SLUICE_MASTER_KEY) is required to decrypt "
                      "endpoint signing secrets\n");
        return -1;
    }
    if (sl_masterkey_parse(mk, cfg->master_key, &err) != 0) {
        (void)fprintf(stderr, "sluice-consumer: invalid value for master_key: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* The endpoint table (from the compacted topic). Returns 0, 1 (logged) when it could not be
 * had, LOAD_CANCELLED when a stop signal came while it loaded. */
#define LOAD_CANCELLED 2
static int
load_endpoints(const struct sl_config *cfg, const struct sl_masterkey *mk, sl_endpoints_t **eps)
{
    sl_err_t err;
    sl_info("consumer", "endpoints_loading", "loading the endpoint table from %s",
            cfg->topic_endpoints);
    int erc = sl_endpoints_open_cancellable(cfg, mk, 60000, &g_stop, eps, &err);
    if (erc == -ECANCELED || (erc == 0 && atomic_load(&g_stop))) {
        log_start_cancelled("endpoints", "loading the endpoint table");
        return LOAD_CANCELLED;
    }
    if (erc != 0) {
        sl_error("consumer", "endpoints_unavailable", "%s", err.msg);
        return 1;
    }
    return 0;
}

/*
 * The binding's witnesses (sl_rstate.h) at start-up: all written when the database was bound
 * just now, else the missing ones, silently: a database bound by a consumer without them, or
 * a pod starting beside the one that bound it. A loss while consumers run is the watching
 * loop's to report. Returns 0, or a negative code with err filled (a master that answered
 * with an error counts: the start fails as with a Redis that does not answer).
 */
static int write_witnesses(sl_redis_t *r, const char *owner, bool bound_now, sl_err_t *err)
{
    int restored = 0, failed = 0;
    int rc = sl_rstate_witnesses(r, owner, bound_now, &restored, &failed, err);
    if (rc != 0)
        return rc;
    if (failed > 0)
        return sl_err_set(err, SL_EREDIS,
                          "could not write the redis database's binding witnesses: %d of %d "
                          "got an error reply (a cluster master down?)",
                          failed, SL_RSTATE_WITNESSES);
    if (restored > 0)
        sl_info("consumer", "redis_owner_witnesses_set",
                "wrote %d of the %d witnesses of the redis database's binding that were "
                "missing (a database bound by an older consumer, or by a pod starting now)",
                restored, SL_RSTATE_WITNESSES);
    return 0;
}

/*
 * A Redis database holds one deployment's state. Another deployment's consumers would claim
 * its retries and send them with their own endpoint table (an id both know goes to the wrong
 * URL, one they do not know is dead-lettered), and share its breakers, rate buckets and
 * delivered markers. A deployment is named by the endpoint table its consumers read: Kafka
 * cluster id and endpoints topic. The first consumer binds the database to it (sluice:owner,
 * sl_rstate_claim_owner); a consumer of another deployment refuses to start, and one
 * running stops when the binding changes (cons_engine_watch_owner). owner receives this
 * deployment's name (SL_RSTATE_OWNER_MAX + 1 bytes). Returns 0, SL_CFG_EXIT on a mismatch,
 * 1 when Kafka or Redis did not answer (both logged).
 */
static int check_redis_owner(const struct sl_config *cfg, sl_endpoints_t *eps, char *owner)
{
    sl_err_t err;
    char cluster[96], found[SL_RSTATE_OWNER_MAX + 1];
    if (sl_endpoints_cluster_id(eps, 10000, cluster, sizeof(cluster), &err) != 0) {
        sl_error("consumer", "start_failed", "%s", err.msg);
        return 1;
    }
    (void)snprintf(owner, SL_RSTATE_OWNER_MAX + 1, "%s/%s", cluster, cfg->topic_endpoints);
    sl_redis_t *r = sl_redis_connect(cfg->redis_url, (int)cfg->redis_timeout_ms, &err);
    int rc = r ? sl_rstate_claim_owner(r, owner, found, sizeof(found), &err) : SL_EREDIS;
    if (rc == 1 || (rc == 0 && strcmp(found, owner) == 0)) {
        int wrc = write_witnesses(r, owner, rc == 1, &err);
        if (wrc < 0)
            rc = wrc;
    }
    sl_redis_close(r);
    if (rc < 0) {
        sl_error("consumer", "start_failed", "%s", err.msg);
        return 1;
    }
    if (rc == 1)
        sl_info("consumer", "redis_owner_set",
                "the redis database now holds the state of this deployment (%s)", owner);
    if (rc == 1 || strcmp(found, owner) == 0)
        return 0;
    sl_error("consumer", "redis_owner_mismatch",
             "the database of redis_url holds the state of another deployment, whose endpoint "
             "table is %s (Kafka cluster id/endpoints topic), not this consumer's %s: two "
             "deployments on one database claim each other's retries and send them with the "
             "wrong endpoint table. Give this deployment a database of its own; if it has "
             "taken this one over (its Kafka cluster or endpoints topic was replaced), delete "
             "the key sluice:owner first (docs/OPERATIONS.md, \"One Redis database per "
             "deployment\")",
             found, owner);
    return SL_CFG_EXIT;
}

/* One engine per loop. Returns 0, or -1 (logged) when one could not be made. */
static int new_engines(struct loop *loops, int n, const struct sl_config *cfg, sl_endpoints_t *eps)
{
    sl_err_t err;
    for (int i = 0; i < n; i++) {
        loops[i].engine = cons_engine_new(cfg, eps, i, n, &err);
        if (!loops[i].engine) {
            sl_error("consumer", "start_failed", "%s", err.msg);
            return -1;
        }
    }
    return 0;
}

/* Loops 1..n-1 on threads of their own (signals blocked there: the handler runs on the main
 * thread, which runs loop 0). Returns 0, or 1 when one could not start. */
static int start_threads(struct loop *loops, int n)
{
    int rc = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 1; i < n; i++) {
        int pe = pthread_create(&loops[i].thr, NULL, loop_main, &loops[i]);
        if (pe != 0) {
            sl_error("consumer", "start_failed", "could not start delivery loop %d: %s", i,
                     strerror(pe));
            rc = 1;
            break;
        }
        loops[i].started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* Run loop 0 on this thread until it ends, then wait for the others. Returns 1 when rc was
 * or any loop failed, else 0. Exits at once when a loop's leaving the group outlived
 * shutdown_timeout_ms and still runs on its own thread with the loop's state: destroying
 * anything it uses would be unsafe (sl_bounded.h). */
static int run_loops(struct loop *loops, int n, int rc)
{
    loop_main(&loops[0]);
    for (int i = 1; i < n; i++) {
        if (loops[i].started)
            pthread_join(loops[i].thr, NULL);
    }
    for (int i = 0; i < n; i++) {
        if (loops[i].rc == SL_CFG_EXIT)
            rc = SL_CFG_EXIT; /* the database was bound to another deployment meanwhile */
        else if (loops[i].rc != 0 && rc != SL_CFG_EXIT)
            rc = 1;
        if (cons_engine_abandoned(loops[i].engine)) {
            (void)fflush(stderr);
            _exit(1);
        }
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct sl_config cfg;
    int early = sl_cfg_main_daemon(&cfg, "sluice-consumer", usage, on_signal, &argc, argv);
    if (early >= 0)
        return early;
    sl_err_t err;
    struct sl_masterkey mk;
    if (load_master_key(&cfg, &mk) != 0) {
        sl_cfg_fini(&cfg);
        return SL_CFG_EXIT;
    }
    /* librdkafka's decompression buffers in mappings of their own: with 10,000 requests in
     * flight, a peak RSS of 226-227 MB fell to 200-201 (sl_mem.h). Before any thread. */
    (void)sl_mem_pin_mmap_threshold(SL_MEM_MMAP_THRESHOLD_BYTES);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* the requests in flight, and as many idle keep-alive connections again */
    (void)sl_nofile_ensure(2 * (uint64_t)cfg.max_inflight + SL_NOFILE_RESERVE, "consumer",
                           "max_inflight", cfg.max_inflight);

    int rc = 1;
    sl_endpoints_t *eps = NULL;
    struct loop *loops = NULL;
    int n = (int)cfg.consumer_threads;
    cons_metrics_init(cfg.metrics_endpoint_top);
    struct readiness rd = {.cfg = &cfg};
    sl_probe_t *probe = NULL;
    if (cfg.metrics_listen[0]) {
        probe = sl_probe_start(cfg.metrics_listen, "metrics_listen", cfg.live_stall_ms, ready_cb,
                               &rd, &err);
        if (!probe) {
            sl_error("consumer", "start_failed", "%s", err.msg);
            goto out;
        }
    }
    int erc = load_endpoints(&cfg, &mk, &eps);
    if (erc != 0) {
        rc = erc == LOAD_CANCELLED ? 0 : 1;
        goto out;
    }
    atomic_store(&rd.endpoints_loaded, true);
    sl_info("consumer", "endpoints_loaded", "%zu endpoints loaded", sl_endpoints_count(eps));
    char owner[SL_RSTATE_OWNER_MAX + 1];
    erc = check_redis_owner(&cfg, eps, owner);
    if (erc != 0) {
        rc = erc;
        goto out;
    }
    loops = sl_xcalloc((size_t)n, sizeof(*loops));
    if (new_engines(loops, n, &cfg, eps) == 0) {
        cons_engine_watch_owner(loops[0].engine, owner);
        g_loops = loops;
        g_nloops = n;
        atomic_store(&rd.nloops, n);
        atomic_store(&rd.loops, loops);
        if (atomic_load(&g_stop)) /* asked to stop while starting: the loops drain and commit */
            on_signal(0);
        rc = start_threads(loops, n);
        if (rc != 0)
            on_signal(0); /* stop the loops already started; they drain and commit */
        rc = run_loops(loops, n, rc);
    }
    sl_probe_stop(probe); /* before the loops go: readiness reads them */
    probe = NULL;
    g_nloops = 0;
    g_loops = NULL;
    for (int i = 0; i < n; i++)
        cons_engine_destroy(loops[i].engine);
    free(loops);
out:
    sl_probe_stop(probe);
    sl_redis_close(rd.redis);
    sl_endpoints_close(eps);
    sl_masterkey_fini(&mk);
    sl_cfg_fini(&cfg);
    curl_global_cleanup();
    return rc;
}
