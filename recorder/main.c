/*
 * sluice-recorder: writes every outcome record of sluice.outcomes into the PostgreSQL history
 * (delivery_attempts, deliveries, endpoint_latency, endpoint_health, dead_letters).
 *
 *   parse args -> load config (exit 78 on any error, before connecting) -> consumer + lazy
 *   PostgreSQL connection -> run until SIGTERM/SIGINT -> write the last batch, store, commit,
 *   leave the group -> exit 0.
 * A SIGTERM/SIGINT before the consumer ever joined its group (Kafka unreachable) has nothing
 * to write or commit: rec_loop_run logs start_cancelled and returns at once, exit 0.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/sl_cfg.h"
#include "common/sl_kstats.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_probe.h"
#include "common/sl_secretbox.h"
#include "recorder/rec_loop.h"

static rec_loop_t *g_loop;
static volatile sig_atomic_t g_stop; /* a signal came, maybe before g_loop existed */

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
    g_stop = 1;
    if (g_loop)
        rec_loop_stop(g_loop);
}

static void usage(FILE *f)
{
    (void)fprintf(
        f, "usage: sluice-recorder [--config FILE] [--check-config] [--print-config]\n"
           "                       [--help-config] [--version] [--help]\n"
           "\n"
           "Records every delivery outcome (topic_outcomes) in PostgreSQL: attempts history,\n"
           "latest state per delivery, latency samples, endpoint health and dead letters\n"
           "(schema: sql/0002_history.sql). Writes are batched (recorder_batch rows or\n"
           "recorder_flush_ms) and idempotent; Kafka offsets are committed only after the\n"
           "batch's transaction commits. A PostgreSQL outage pauses intake until it is back.\n"
           "Also maintains partitions, retention and endpoint latency percentiles.\n"
           "Any number may run in one consumer group (recorder_group): they split the\n"
           "partitions.\n"
           "Configuration comes from SLUICE_* environment variables or a config file; see\n"
           "--help-config. SIGTERM or SIGINT writes the last batch, commits and exits 0;\n"
           "before the group was joined (e.g. Kafka unreachable) it exits 0 at once.\n");
}

/* The master key: disabling an endpoint (410 Gone, disable_after_ms) publishes its record,
 * which is signed with it. Returns 0, or -1 with the reason on stderr. */
static int load_master_key(const struct sl_config *cfg, struct sl_masterkey *mk)
{
    sl_err_t err;
    if (!cfg->master_key[0]) {
        (void)fprintf(stderr,
                      "sluice-recorder: master_key (SLUICE_MASTER_KEY) is required to sign the "
                      "endpoint records of the endpoints it disables\n");
        return -1;
    }
    if (sl_masterkey_parse(mk, cfg->master_key, &err) != 0) {
        (void)fprintf(stderr, "sluice-recorder: invalid value for master_key: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Run the loop of g_loop to its end; returns the exit code. Exits at once (never returns)
 * when leaving the group outlived its bound and still runs on its own thread: destroying
 * anything it uses would be unsafe (sl_bounded.h). */
static int run_loop(void)
{
    sl_err_t err;
    sl_err_clear(&err);
    int run = rec_loop_run(g_loop, &err);
    if (rec_loop_abandoned(g_loop)) {
        /* 0 when the stop came before the group was ever joined (nothing was taken) */
        (void)fflush(stderr);
        _exit(run == 0 ? 0 : 1);
    }
    if (run != 0) {
        sl_error("recorder",
                 run == SL_EVERSION       ? "schema_mismatch"
                 : rec_loop_fatal(g_loop) ? "stopped_on_error"
                                          : "start_failed",
                 "%s", err.msg);
        return 1;
    }
    return 0;
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
    struct sl_masterkey mk;
    memset(&mk, 0, sizeof(mk));
    if (load_master_key(&cfg, &mk) != 0) {
        sl_cfg_fini(&cfg);
        return SL_CFG_EXIT;
    }
    /* librdkafka's LZ4 decompression buffers (4x each compressed batch) in mappings of their
     * own, as in the consumer: bench/recorder.sh's peak RSS fell from 148-152 MB to 127-133 at
     * the same rate (sl_mem.h). Before any thread. */
    (void)sl_mem_pin_mmap_threshold(SL_MEM_MMAP_THRESHOLD_BYTES);
    g_loop = rec_loop_new(&cfg, &mk, &err);
    if (g_loop && g_stop) /* the signal came before the handler could see the loop */
        rec_loop_stop(g_loop);
    if (g_loop && cfg.metrics_listen[0]) {
        probe = sl_probe_start(cfg.metrics_listen, "metrics_listen", cfg.live_stall_ms, ready_cb,
                               &rd, &err);
        if (!probe)
            sl_error("recorder", "start_failed", "%s", err.msg);
    }
    if (!g_loop)
        sl_error("recorder", "start_failed", "%s", err.msg);
    else if (probe || !cfg.metrics_listen[0])
        rc = run_loop();
    sl_probe_stop(probe);
    if (rd.pg)
        PQfinish(rd.pg);
    rec_loop_t *l = g_loop;
    g_loop = NULL;
    rec_loop_destroy(l);
    sl_masterkey_fini(&mk);
    sl_cfg_fini(&cfg);
    return rc;
}
