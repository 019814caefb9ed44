/*
 * sluice-recorder: writes every outcome record of sluice.outcomes into the PostgreSQL history
 * (delivery_attempts, deliveries, endpoint_latency, endpoint_health, dead_letters).
 *
 *   parse args -> load config (exit 78 on any error, before connecting) -> consumer + lazy
 *   PostgreSQL connection -> run until SIGTERM/SIGINT -> write the last batch, store, commit,
 *   leave the group -> exit 0.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/sl_cfg.h"
#include "common/sl_kstats.h"
#include "common/sl_log.h"
#include "common/sl_pg.h"
#include "common/sl_probe.h"
#include "recorder/rec_loop.h"

static rec_loop_t *g_loop;

/* Readiness (docs/METRICS.md): PostgreSQL answers and the lag is under recorder_ready_lag.
 * Asked on the metrics listener's thread, with a connection of its own. */
struct readiness {
    const struct sl_config *cfg;
    PGconn *pg;
};

static bool ready_cb(void *arg, struct sl_buf *checks)
{
    struct readiness *r = arg;
    sl_err_t err;
    if (!r->pg)
        r->pg = sl_pg_connect(r->cfg->pg_dsn, &err);
    PGresult *res = r->pg ? sl_pg_exec(r->pg, "check postgresql", "select 1", 0, NULL, &err) : NULL;
    bool pg = res != NULL;
    PQclear(res);
    if (!pg && r->pg) {
        PQfinish(r->pg); /* connect again at the next probe */
        r->pg = NULL;
    }
    sl_probe_check(checks, "postgresql", pg ? "ok" : "unreachable");
    bool known = false;
    int64_t lag = sl_kstats_total_lag(NULL, &known);
    bool lag_ok = known && lag < r->cfg->recorder_ready_lag;
    sl_probe_check(checks, "lag", !known ? "unknown" : lag_ok ? "ok" : "too_high");
    return pg && lag_ok;
}

static void on_signal(int sig)
{
    (void)sig;
    if (g_loop)
        rec_loop_stop(g_loop);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice-recorder [--config FILE] [--check-config] [--print-config]\n"
               "                       [--help-config] [--version] [--help]\n"
               "\n"
               "Records every delivery outcome (topic_outcomes) in PostgreSQL: attempts history,\n"
               "latest state per delivery, latency samples, endpoint health and dead letters\n"
               "(schema: sql/0002_history.sql). Writes are batched (recorder_batch rows or\n"
               "recorder_flush_ms) and idempotent; Kafka offsets are committed only after the\n"
               "batch's transaction commits. A PostgreSQL outage pauses intake until it is back.\n"
               "Also maintains partitions, retention and endpoint latency percentiles.\n"
               "Run one per consumer group (recorder_group); more share the partitions.\n"
               "Configuration comes from SLUICE_* environment variables or a config file; see\n"
               "--help-config. SIGTERM or SIGINT writes the last batch, commits and exits 0.\n");
}

int main(int argc, char **argv)
{
    struct sl_config cfg;
    int early = sl_cfg_main_daemon(&cfg, "sluice-recorder", usage, on_signal, &argc, argv);
    if (early >= 0)
        return early;

    int rc = 1;
    sl_err_t err;
    sl_err_clear(&err);
    struct readiness rd = {.cfg = &cfg};
    sl_probe_t *probe = NULL;
    g_loop = rec_loop_new(&cfg, &err);
    if (g_loop && cfg.metrics_listen[0]) {
        probe = sl_probe_start(cfg.metrics_listen, "metrics_listen", cfg.live_stall_ms, ready_cb,
                               &rd, &err);
        if (!probe) {
            sl_error("recorder", "start_failed", "%s", err.msg);
            goto out;
        }
    }
    if (!g_loop) {
        sl_error("recorder", "start_failed", "%s", err.msg);
        goto out;
    }
    int run = rec_loop_run(g_loop, &err);
    if (run != 0 && rec_loop_abandoned(g_loop)) {
        /* leaving the group outlived shutdown_timeout_ms and is still running on its own
         * thread: exit now, destroying nothing it uses (see sl_bounded.h) */
        fflush(stderr);
        _exit(1);
    }
    if (run != 0) {
        sl_error("recorder", "start_failed", "%s", err.msg);
        goto out;
    }
    rc = 0;
out : {
    sl_probe_stop(probe);
    if (rd.pg)
        PQfinish(rd.pg);
    rec_loop_t *l = g_loop;
    g_loop = NULL;
    rec_loop_destroy(l);
}
    sl_cfg_fini(&cfg);
    return rc;
}
