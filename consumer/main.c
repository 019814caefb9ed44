/*
 * sluice-consumer: delivers the records of sluice.deliveries to their endpoints.
 *
 *   parse args -> load config (exit 78 on any error, before connecting) -> master key ->
 *   endpoint table (sluice.endpoints read to its high watermark) -> engine -> run until
 *   SIGTERM/SIGINT -> drain, reschedule, flush, commit -> exit 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/sl_cfg.h"
#include "common/sl_endpoints.h"
#include "common/sl_log.h"
#include "common/sl_secretbox.h"
#include "consumer/cons_engine.h"

static cons_engine_t *g_engine;

static void on_signal(int sig)
{
    (void)sig;
    if (g_engine)
        cons_engine_stop(g_engine);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice-consumer [--config FILE] [--check-config] [--print-config]\n"
               "                       [--help-config] [--version] [--help]\n"
               "\n"
               "Delivers webhook and postback records from Kafka (topic_deliveries) over HTTP,\n"
               "signed with Standard Webhooks, with retries, circuit breakers and duplicate\n"
               "protection kept in Redis. Run any number of them: they form one consumer group.\n"
               "Configuration comes from SLUICE_* environment variables or a config file; see\n"
               "--help-config. SIGTERM or SIGINT drains in-flight requests and exits cleanly.\n");
}

int main(int argc, char **argv)
{
    struct sl_config cfg;
    int early = sl_cfg_main_daemon(&cfg, "sluice-consumer", usage, on_signal, &argc, argv);
    if (early >= 0)
        return early;
    sl_err_t err;
    struct sl_masterkey mk;
    if (!cfg.master_key[0]) {
        fprintf(stderr, "sluice-consumer: master_key (SLUICE_MASTER_KEY) is required to decrypt "
                        "endpoint signing secrets\n");
        return SL_CFG_EXIT;
    }
    if (sl_masterkey_parse(&mk, cfg.master_key, &err) != 0) {
        fprintf(stderr, "sluice-consumer: invalid value for master_key: %s\n", err.msg);
        return SL_CFG_EXIT;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);

    int rc = 1;
    sl_endpoints_t *eps = NULL;
    if (sl_endpoints_open(&cfg, &mk, 60000, &eps, &err) != 0) {
        sl_error("consumer", "endpoints_unavailable", "%s", err.msg);
        goto out;
    }
    sl_info("consumer", "endpoints_loaded", "%zu endpoints loaded", sl_endpoints_count(eps));
    g_engine = cons_engine_new(&cfg, eps, &err);
    if (!g_engine) {
        sl_error("consumer", "start_failed", "%s", err.msg);
        goto out;
    }
    rc = cons_engine_run(g_engine) == 0 ? 0 : 1;
out:
    cons_engine_destroy(g_engine);
    g_engine = NULL;
    sl_endpoints_close(eps);
    sl_masterkey_fini(&mk);
    sl_cfg_fini(&cfg);
    curl_global_cleanup();
    return rc;
}
