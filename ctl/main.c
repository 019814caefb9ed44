/*
 * sluicectl: the operator's tool. main() only separates the configuration flags from the
 * rest and dispatches to a command group (ctl.h explains how to add one).
 *
 *   sluicectl [--config FILE] [--print-config | --check-config | --help-config]
 *             <group> <subcommand> [flags]
 *
 * Configuration flags are accepted anywhere on the line and applied when a command first
 * needs the configuration, so `sluicectl endpoints list --print-config` prints the config
 * that command would use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_cfg.h"
#include "ctl/ctl.h"
#include "ctl/ctl_alert_rules.h"
#include "ctl/ctl_analysis.h"
#include "ctl/ctl_kafka.h"
#include "ctl/ctl_replay.h"
#include "ctl/ctl_retries.h"
#include "ctl/ctl_top.h"

/* The command groups. Add a row per ctl_<group>.c (declared in ctl.h). */
static const struct ctl_command commands[] = {
    {"endpoints", "manage the endpoint registry (add, show, list, update, rotate-secret, ...)",
     ctl_endpoints_main, ctl_endpoints_help},
    {"topics", "create the Sluice topics when missing (ensure)", ctl_topics_main, ctl_topics_help},
    {"dump", "print a topic's records as JSON lines (outcomes, deliveries, quarantine, ...)",
     ctl_dump_main, ctl_dump_help},
    {"top", "live view: delivered/s, retries, dead letters, latency and breakers per endpoint",
     ctl_top_main, ctl_top_help},
    {"config-doc", "print the configuration reference (docs/CONFIG.md)", ctl_config_doc_main,
     ctl_config_doc_help},
    {"health", "pending work (Kafka lag, Redis schedule) and the history's summary",
     ctl_health_main, ctl_health_help},
    {"slow", "endpoints whose P95 latency is over a threshold", ctl_slow_main, ctl_slow_help},
    {"dead-letters", "dead letters per endpoint, with their patterns", ctl_dead_letters_main,
     ctl_dead_letters_help},
    {"alerts", "firing alerts; exit 3 when any fires (cron, monitoring)", ctl_alerts_main,
     ctl_alerts_help},
    {"alert-rules", "print the Prometheus alert rules with the thresholds of alerts",
     ctl_alert_rules_main, ctl_alert_rules_help},
    {"latency", "percentiles and histogram of one endpoint's latency", ctl_latency_main,
     ctl_latency_help},
    {"event", "one event's deliveries and every attempt, from the history", ctl_event_main,
     ctl_event_help},
    {"replay", "re-publish dead letters (each once) and mark them replayed", ctl_replay_main,
     ctl_replay_help},
    {"retries", "rebuild the Redis retry schedule from the history (rebuild)", ctl_retries_main,
     ctl_retries_help},
    {"keys", "API keys of sluice-api (create, list, revoke)", ctl_keys_main, ctl_keys_help},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f, bool full)
{
    (void)fprintf(f,
                  "usage: %s [config flags] <command> <subcommand> [flags]\n"
                  "\n"
                  "Commands:\n",
                  CTL_PROG);
    for (size_t i = 0; i < N_COMMANDS; i++)
        (void)fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    (void)fprintf(f,
                  "\n"
                  "Config flags (anywhere on the line):\n"
                  "  --config FILE    read settings from FILE (else SLUICE_CONFIG_FILE); SLUICE_*\n"
                  "                   environment variables override the file\n"
                  "  --print-config   print the effective configuration (secrets redacted), exit\n"
                  "  --check-config   validate the configuration, exit\n"
                  "  --help-config    list every configuration key, exit\n"
                  "\n"
                  "Other flags:\n"
                  "  -h, --help       this help (with every command's subcommands)\n"
                  "  --version        print the version\n"
                  "\n"
                  "Exit codes: 0 ok, 1 operation failed, 2 usage error, 3 alerts firing (alerts),\n"
                  "78 bad configuration.\n");
    if (!full)
        return;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        (void)fputc('\n', f);
        commands[i].help(f);
    }
}

/* Move the config flags out of argv into c->cfg_argv; returns the new argc. */
static int take_config_flags(struct ctl *c, int argc, char **argv, int *cfg_flags)
{
    int out = 1;
    c->cfg_argv[0] = (char *)CTL_PROG;
    c->cfg_argc = 1;
    *cfg_flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool takes_next = strcmp(a, "--config") == 0 && i + 1 < argc;
        bool flag = takes_next || strncmp(a, "--config=", 9) == 0 ||
                    strcmp(a, "--print-config") == 0 || strcmp(a, "--check-config") == 0 ||
                    strcmp(a, "--help-config") == 0;
        if (strcmp(a, "--") == 0) {
            /* everything after belongs to the command */
            while (i < argc)
                argv[out++] = argv[i++];
            break;
        }
        if (!flag || c->cfg_argc + (takes_next ? 2 : 1) > CTL_CFG_ARGS_MAX) {
            argv[out++] = argv[i];
            continue;
        }
        c->cfg_argv[c->cfg_argc++] = argv[i];
        if (takes_next)
            c->cfg_argv[c->cfg_argc++] = argv[++i];
        (*cfg_flags)++;
    }
    argv[out] = NULL;
    c->cfg_argv[c->cfg_argc] = NULL;
    return out;
}

int main(int argc, char **argv)
{
    struct ctl c;
    int rc = CTL_EXIT_USAGE;
    int cfg_flags = 0;
    memset(&c, 0, sizeof(c));
    argc = take_config_flags(&c, argc, argv, &cfg_flags);
    if (argc < 2) {
        if (cfg_flags > 0) {
            /* e.g. `sluicectl --check-config`: handled (and exited) by the loader */
            (void)ctl_config(&c);
        }
        usage(stderr, false);
        goto out;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout, true);
        rc = CTL_EXIT_OK;
        goto out;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("%s %s\n", CTL_PROG, SL_VERSION);
        rc = CTL_EXIT_OK;
        goto out;
    }
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(cmd, commands[i].name) == 0) {
            rc = commands[i].main(&c, argc - 1, argv + 1);
            goto out;
        }
    }
    size_t n = strcspn(cmd, "=");
    if (cmd[0] == '-')
        rc = ctl_usage_error(NULL, "unknown option '%.*s'", (int)n, cmd);
    else
        rc = ctl_usage_error(NULL, "unknown command '%.*s'", (int)n, cmd);
out:
    if (c.loaded)
        sl_cfg_fini(&c.cfg);
    return rc;
}
