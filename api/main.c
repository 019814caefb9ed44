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
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_probe.h"

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

int main(int argc, char **argv)
{
    struct sl_config cfg;
    int early = sl_cfg_main_daemon(&cfg, "sluice-api", usage, on_signal, &argc, argv);
    if (early >= 0)
        return early;
    sigemptyset(&g_stopsigs);
    sigaddset(&g_stopsigs, SIGTERM);
    sigaddset(&g_stopsigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &g_stopsigs, NULL); /* before any thread exists */
    sl_err_t err;
    struct api a;
    memset(&a, 0, sizeof(a));
    a.cfg = &cfg;
    if (!cfg.master_key[0]) {
        (void)fprintf(stderr, "sluice-api: master_key (SLUICE_MASTER_KEY) is required to seal the "
                              "signing secrets of endpoints it creates\n");
        sl_cfg_fini(&cfg);
        return SL_CFG_EXIT;
    }
    if (sl_masterkey_parse(&a.mk, cfg.master_key, &err) != 0) {
        (void)fprintf(stderr, "sluice-api: invalid value for master_key: %s\n", err.msg);
        sl_cfg_fini(&cfg);
        return SL_CFG_EXIT;
    }
    int rc = 1;
    bool cancelled = false;
    struct poller pl;
    memset(&pl, 0, sizeof(pl));
    pl.beat = -1;
    api_server_t *srv = NULL;
    sl_probe_t *probe = NULL;
    pthread_t sigthr;
    bool sig_started = pthread_create(&sigthr, NULL, signal_main, NULL) == 0;
    if (!sig_started) {
        sl_error("api", "start_failed", "could not start the signal thread");
        goto out;
    }
    sl_info("api", "endpoints_loading", "loading the endpoint table from %s", cfg.topic_endpoints);
    int erc = sl_endpoints_open_cancellable(&cfg, &a.mk, 60000, &g_stop, &a.eps, &err);
    if (erc == -ECANCELED || (erc == 0 && atomic_load(&g_stop))) {
        SL_LOGKV(SL_LOG_INFO, "api", "start_cancelled",
                 ((struct sl_log_kv[]){SL_KV_S("phase", "endpoints")}),
                 "stop requested while loading the endpoint table: exiting before serving");
        cancelled = true;
        rc = 0;
        goto out;
    }
    if (erc != 0) {
        sl_error("api", "endpoints_unavailable", "%s", err.msg);
        goto out;
    }
    a.fanout = api_fanout_new(a.eps);
    struct sluice_producer_opts po = {0};
    po.message_timeout_ms = cfg.api_publish_timeout_ms;
    po.enqueue_timeout_ms = 1000;
    po.close_timeout_ms = 1000; /* requests in flight already had api_shutdown_ms */
    po.role = "sluice-api";
    a.prod = prod_lib_new(&cfg, &po, &err);
    if (!a.prod) {
        sl_error("api", "producer_failed", "%s", err.msg);
        goto out;
    }
    pl.prod = a.prod;
    pl.beat = sl_probe_beat_register("producer reports");
    if (pthread_create(&pl.thr, NULL, poll_main, &pl) != 0) {
        sl_error("api", "start_failed", "could not start the producer's report thread");
        goto out;
    }
    pl.started = true;
    a.keys = api_keys_start(&cfg);
    api_metrics_init(&a);
    if (cfg.metrics_listen[0]) {
        probe = sl_probe_start(cfg.metrics_listen, "metrics_listen", cfg.live_stall_ms, ready_cb,
                               &a, &err);
        if (!probe) {
            sl_error("api", "listen_failed", "%s", err.msg);
            goto out;
        }
    }
    srv = api_server_start(&a, &err);
    if (!srv) {
        sl_error("api", "listen_failed", "%s", err.msg);
        goto out;
    }
    SL_LOGKV(SL_LOG_INFO, "api", "listening",
             ((struct sl_log_kv[]){SL_KV_S("listen", cfg.api_listen),
                                   SL_KV_I("threads", cfg.api_threads),
                                   SL_KV_I("endpoints", (int64_t)sl_endpoints_count(a.eps))}),
             "sluice-api listening on %s", cfg.api_listen);
    pthread_join(sigthr, NULL); /* until SIGTERM or SIGINT */
    sig_started = false;
    sl_info("api", "stopping", "stopping: no new connections, requests in flight may finish");
    atomic_store(&a.stopping, true);
    rc = 0;
out:
    if (sig_started) { /* no signal yet (a failed start): end the signal thread */
        if (!atomic_load(&g_stop))
            /* wakes the thread's sigwait(); the process does not end by it */
            (void)pthread_kill(sigthr, SIGTERM); /* NOLINT(bugprone-bad-signal-to-kill-thread) */
        pthread_join(sigthr, NULL);
    }
    long left = api_server_quiesce(srv, cfg.api_shutdown_ms);
    if (left > 0)
        sl_warn("api", "shutdown_timeout",
                "%ld requests still in flight after api_shutdown_ms: their unacknowledged "
                "records are purged and answered 503",
                left);
    if (pl.started) {
        atomic_store(&pl.stop, true);
        pthread_join(pl.thr, NULL);
    }
    sl_probe_beat_release(pl.beat);
    /* flushes within close_timeout_ms, then reports what is left as failed: that resumes
     * every request still waiting, so none is suspended when the server stops */
    sluice_producer_destroy(a.prod);
    a.prod = NULL;
    (void)api_server_quiesce(srv, 2000);
    api_server_stop(srv);
    sl_probe_stop(probe);
    api_keys_stop(a.keys);
    api_fanout_destroy(a.fanout);
    sl_endpoints_close(a.eps);
    sl_masterkey_fini(&a.mk);
    sl_cfg_fini(&cfg);
    if (rc == 0 && !cancelled)
        sl_info("api", "stopped", "stopped cleanly");
    return rc;
}
