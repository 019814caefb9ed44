/*
 * sluice-api: the HTTP surface of Sluice. Publishes events (with fan-out to subscribed
 * endpoints and Idempotency-Key) through the producer library, manages endpoints with the
 * registry code sluicectl uses, and reads the delivery log from the recorder's tables.
 * Stateless: run any number behind a load balancer.
 *
 *   parse args -> load config (exit 78 on any error, before connecting) -> master key ->
 *   endpoint table (sluice.endpoints read to its high watermark) -> producer and its report
 *   thread -> API key cache -> listen -> run until SIGTERM/SIGINT -> stop accepting, let
 *   requests in flight finish (api_shutdown_ms), flush the producer -> exit 0.
 * A SIGTERM/SIGINT while the endpoint table is still loading (Kafka unreachable: up to 60 s)
 * ends that wait at once: nothing was published yet, so the process logs start_cancelled and
 * exits 0.
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

#include "api/api.h"
#include "common/sl_limits.h"
#include "common/sl_log.h"
#include "common/sl_probe.h"
#include "common/sl_time.h"

/* SIGTERM and SIGINT are blocked in every thread and taken by sigwait on a thread of their
 * own (signal_main), which sets g_stop, seen by the start-up waits, and ends; the main
 * thread, once serving, waits for it with pthread_join. */
static sigset_t g_stopsigs;
static atomic_bool g_stop;

static void on_signal(int sig)
{
    (void)sig;
}

static void *signal_main(void *arg)
{
    (void)arg;
    int sig = 0;
    (void)sigwait(&g_stopsigs, &sig);
    atomic_store(&g_stop, true);
    return NULL;
}

static void usage(FILE *f)
{
    (void)fprintf(f,
                  "usage: sluice-api [--config FILE] [--check-config] [--print-config]\n"
                  "                  [--help-config] [--version] [--help]\n"
                  "\n"
                  "Sluice's HTTP API (api/openapi.yaml): publish events over HTTP with\n"
                  "Idempotency-Key and fan-out to the endpoints subscribed to their type and\n"
                  "channels; manage endpoints; read the delivery log and dead letters.\n"
                  "Callers authenticate with API keys (sluicectl keys create). Listens on\n"
                  "api_listen; every publish is acknowledged by Kafka before it is answered.\n"
                  "Stateless: run any number behind a load balancer.\n"
                  "Configuration comes from SLUICE_* environment variables or a config file; see\n"
                  "--help-config. SIGTERM or SIGINT stops accepting, lets requests in flight\n"
                  "finish (api_shutdown_ms), flushes the producer and exits 0; during start-up\n"
                  "(the endpoint table still loading, e.g. Kafka unreachable) it ends the wait\n"
                  "and exits 0 at once.\n");
}

struct poller {
    sluice_producer_t *prod;
    int beat; /* liveness heartbeat slot (sl_probe) */
    atomic_bool stop;
    pthread_t thr;
    bool started;
};

static bool ready_cb(void *arg, struct sl_buf *checks)
{
    return api_ready(arg, checks);
}

/* Serves the producer's delivery reports: they resume the suspended requests. */
static void *poll_main(void *arg)
{
    struct poller *pl = arg;
    while (!atomic_load(&pl->stop)) {
        sl_probe_beat(pl->beat, sl_mono_ms());
        (void)sluice_producer_poll(pl->prod, 100);
    }
    return NULL;
}

/* What main starts, in order, and stops in reverse. */
struct run {
    struct sl_config cfg;
    struct api a;
    struct poller pl;
    api_server_t *srv;
    sl_probe_t *probe;
    pthread_t sigthr;
    bool sig_started; /* the signal thread runs and has not been joined */
};

/* The producer (the publish path) and the thread that serves its delivery reports. */
static int start_producer(struct run *r, sl_err_t *err)
{
    struct sluice_producer_opts po = {0};
    po.message_timeout_ms = r->cfg.api_publish_timeout_ms;
    po.enqueue_timeout_ms = API_ENQUEUE_WAIT_MS;
    po.close_timeout_ms = 1000; /* requests in flight already had api_shutdown_ms */
    po.role = "sluice-api";
    /* each request waits for its acknowledgement: the library's 5 ms would be latency */
    po.linger_ms = r->cfg.api_linger_ms;
    r->a.prod = prod_lib_new(&r->cfg, &po, err);
    if (!r->a.prod) {
        sl_error("api", "producer_failed", "%s", err->msg);
        return -1;
    }
    r->pl.prod = r->a.prod;
    r->pl.beat = sl_probe_beat_register("producer reports");
    if (pthread_create(&r->pl.thr, NULL, poll_main, &r->pl) != 0) {
        sl_error("api", "start_failed", "could not start the producer's report thread");
        return -1;
    }
    r->pl.started = true;
    return 0;
}

/* The probe listener (when metrics_listen is set) and the API server. */
static int start_listeners(struct run *r, sl_err_t *err)
{
    if (r->cfg.metrics_listen[0]) {
        r->probe = sl_probe_start(r->cfg.metrics_listen, "metrics_listen", r->cfg.live_stall_ms,
                                  ready_cb, &r->a, err);
        if (!r->probe) {
            sl_error("api", "listen_failed", "%s", err->msg);
            return -1;
        }
    }
    (void)sl_nofile_ensure((uint64_t)r->cfg.api_max_connections + SL_NOFILE_RESERVE, "api",
                           "api_max_connections", r->cfg.api_max_connections);
    r->srv = api_server_start(&r->a, err);
    if (!r->srv) {
        sl_error("api", "listen_failed", "%s", err->msg);
        return -1;
    }
    return 0;
}

/* Once the endpoint table is loaded: the fan-out index, the producer, the key cache, the read
 * threads, metrics and the listeners. 0, or 1 (logged). */
static int start_serving(struct run *r)
{
    sl_err_t err;
    r->a.fanout = api_fanout_new(r->a.eps);
    if (start_producer(r, &err) != 0)
        return 1;
    r->a.keys = api_keys_start(&r->cfg);
    r->a.reads = api_reads_start((size_t)r->cfg.api_read_threads, &err);
    if (!r->a.reads) {
        sl_error("api", "start_failed", "%s", err.msg);
        return 1;
    }
    api_metrics_init(&r->a);
    return start_listeners(r, &err) != 0 ? 1 : 0;
}

/* Start everything. Returns 0 serving, 1 failed (logged), START_CANCELLED when a stop signal
 * came while the endpoint table loaded. */
#define START_CANCELLED 2
static int start(struct run *r)
{
    sl_err_t err;
    r->sig_started = pthread_create(&r->sigthr, NULL, signal_main, NULL) == 0;
    if (!r->sig_started) {
        sl_error("api", "start_failed", "could not start the signal thread");
        return 1;
    }
    sl_info("api", "endpoints_loading", "loading the endpoint table from %s",
            r->cfg.topic_endpoints);
    int erc = sl_endpoints_open_cancellable(&r->cfg, &r->a.mk, 60000, &g_stop, &r->a.eps, &err);
    if (erc == -ECANCELED || (erc == 0 && atomic_load(&g_stop))) {
        SL_LOGKV(SL_LOG_INFO, "api", "start_cancelled",
                 ((struct sl_log_kv[]){SL_KV_S("phase", "endpoints")}),
                 "stop requested while loading the endpoint table: exiting before serving");
        return START_CANCELLED;
    }
    if (erc != 0) {
        sl_error("api", "endpoints_unavailable", "%s", err.msg);
        return 1;
    }
    if (start_serving(r) != 0)
        return 1;
    SL_LOGKV(SL_LOG_INFO, "api", "listening",
             ((struct sl_log_kv[]){SL_KV_S("listen", r->cfg.api_listen),
                                   SL_KV_I("threads", r->cfg.api_threads),
                                   SL_KV_I("endpoints", (int64_t)sl_endpoints_count(r->a.eps))}),
             "sluice-api listening on %s", r->cfg.api_listen);
    return 0;
}

/* Stop what start started (any part of it): the signal thread, requests in flight within
 * api_shutdown_ms, the producer's report thread, the producer (its flush), the listeners. */
static void stop(struct run *r)
{
    if (r->sig_started) { /* no signal yet (a failed start): end the signal thread */
        if (!atomic_load(&g_stop))
            /* wakes the thread's sigwait(); the process does not end by it */
            (void)pthread_kill(r->sigthr, SIGTERM); /* NOLINT(bugprone-bad-signal-to-kill-thread) */
        pthread_join(r->sigthr, NULL);
    }
    long left = api_server_quiesce(r->srv, r->cfg.api_shutdown_ms);
    if (left > 0)
        sl_warn("api", "shutdown_timeout",
                "%ld requests still in flight after api_shutdown_ms: their unacknowledged "
                "records are purged and answered 503",
                left);
    if (r->pl.started) {
        atomic_store(&r->pl.stop, true);
        pthread_join(r->pl.thr, NULL);
    }
    sl_probe_beat_release(r->pl.beat);
    /* flushes within close_timeout_ms, then reports what is left as failed: that resumes
     * every request still waiting, so none is suspended when the server stops */
    sluice_producer_destroy(r->a.prod);
    r->a.prod = NULL;
    /* a replay ends after its batch in progress (a->stopping): libmicrohttpd cannot stop with
     * its request still suspended */
    api_replays_wait(&r->a);
    /* history reads still queued are answered 503, running ones finish (each within its
     * statement timeout), before the loops stop; the queue outlives the loops, which may
     * still hand it a read (answered 503) until they stop */
    api_reads_stop(r->a.reads);
    (void)api_server_quiesce(r->srv, 2000);
    api_server_stop(r->srv);
    api_reads_free(r->a.reads);
    r->a.reads = NULL;
    sl_probe_stop(r->probe);
    api_keys_stop(r->a.keys);
    api_fanout_destroy(r->a.fanout);
    sl_endpoints_close(r->a.eps);
}

int main(int argc, char **argv)
{
    static struct run r; /* zeroed */
    int early = sl_cfg_main_daemon(&r.cfg, "sluice-api", usage, on_signal, &argc, argv);
    if (early >= 0)
        return early;
    sigemptyset(&g_stopsigs);
    sigaddset(&g_stopsigs, SIGTERM);
    sigaddset(&g_stopsigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &g_stopsigs, NULL); /* before any thread exists */
    sl_err_t err;
    r.a.cfg = &r.cfg;
    r.pl.beat = -1;
    if (!r.cfg.master_key[0]) {
        (void)fprintf(stderr, "sluice-api: master_key (SLUICE_MASTER_KEY) is required to seal the "
                              "signing secrets of endpoints it creates\n");
        sl_cfg_fini(&r.cfg);
        return SL_CFG_EXIT;
    }
    if (sl_masterkey_parse(&r.a.mk, r.cfg.master_key, &err) != 0) {
        (void)fprintf(stderr, "sluice-api: invalid value for master_key: %s\n", err.msg);
        sl_cfg_fini(&r.cfg);
        return SL_CFG_EXIT;
    }
    int rc = start(&r);
    if (rc == 0) {
        pthread_join(r.sigthr, NULL); /* until SIGTERM or SIGINT */
        r.sig_started = false;
        sl_info("api", "stopping", "stopping: no new connections, requests in flight may finish");
        atomic_store(&r.a.stopping, true);
    }
    stop(&r);
    sl_masterkey_fini(&r.a.mk);
    sl_cfg_fini(&r.cfg);
    if (rc == 0)
        sl_info("api", "stopped", "stopped cleanly");
    return rc == START_CANCELLED ? 0 : rc;
}
