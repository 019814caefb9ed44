/*
 * ctl: what every sluicectl command group shares.
 *
 * sluicectl is a dispatch table of command groups (ctl/main.c); each group lives in its own
 * ctl_<group>.c and exports one entry point `int ctl_<group>_main(struct ctl *c, int argc,
 * char **argv)` (argv[0] = the group name) returning the process exit code. To add a group:
 * write ctl_<group>.c, declare its entry point below, add a row to the table in main.c.
 *
 * Conventions for groups:
 *   - flags with getopt_long per subcommand (ctl_getopt_error reports problems uniformly);
 *   - validate every argument before loading the configuration or touching any service;
 *   - load the configuration only when needed, with ctl_config() (so `--help` and usage
 *     errors work with a broken config);
 *   - exit codes: CTL_EXIT_OK, CTL_EXIT_FAIL (the operation failed), CTL_EXIT_USAGE (bad
 *     flags or values; the message names the flag), CTL_EXIT_CONFIG (bad configuration);
 *   - errors go to stderr as "sluicectl <cmd>: <message>", results to stdout; `--json`
 *     prints machine-readable results.
 *
 * thread: single-threaded tool.
 */
#ifndef SL_CTL_H
#define SL_CTL_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sl_cfg.h"

#define CTL_EXIT_OK     0
#define CTL_EXIT_FAIL   1
#define CTL_EXIT_USAGE  2
#define CTL_EXIT_CONFIG SL_CFG_EXIT /* 78 */

#define CTL_PROG         "sluicectl"
#define CTL_CFG_ARGS_MAX 16 /* config flags kept from the command line */

/* Process-wide state of one sluicectl run. */
struct ctl {
    int cfg_argc;                         /* entries used in cfg_argv */
    char *cfg_argv[CTL_CFG_ARGS_MAX + 2]; /* "sluicectl" + config flags + NULL (borrowed
                                             from the real argv) */
    bool loaded;                          /* cfg is loaded (sl_cfg_fini at exit) */
    struct sl_config cfg;                 /* the configuration, once loaded */
};

/* One command group. */
struct ctl_command {
    const char *name;                                  /* "endpoints" */
    const char *summary;                               /* one line for `sluicectl --help` */
    int (*main)(struct ctl *c, int argc, char **argv); /* argv[0] = name; returns exit code */
    void (*help)(FILE *f); /* full help of the group (used by `sluicectl --help` too) */
};

/*
 * The configuration (defaults < --config FILE / SLUICE_CONFIG_FILE < SLUICE_* environment),
 * loaded on first call with sl_cfg_main_load: on bad config it prints every problem and exits
 * CTL_EXIT_CONFIG; --print-config / --check-config / --help-config print and exit 0 there.
 * The result is owned by c.
 */
const struct sl_config *ctl_config(struct ctl *c);

/* Print "sluicectl <cmd>: <msg>" and a pointer to --help on stderr; returns CTL_EXIT_USAGE. */
int ctl_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Pick the subcommand of group (argv[0]) named by argv[1] among n, whose names name_of(0..n-1)
 * gives. Returns -1 with *sub set when one is named; otherwise the exit code to return: help
 * printed (help(stdout) for -h/--help/help, help(stderr) when argv[1] is missing) or a usage
 * error for an unknown word (quoted up to any '=', which may start a value).
 */
int ctl_pick_sub(const char *group,
                 int argc,
                 char **argv,
                 const char *(*name_of)(int s),
                 int n,
                 void (*help)(FILE *f),
                 int *sub);

/* Print "sluicectl <cmd>: <msg>" on stderr; returns CTL_EXIT_FAIL. */
int ctl_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Report a getopt_long problem for command cmd: ret is what getopt_long returned ('?' or
 * ':'; the option string must start with ':' and opterr be 0), opts the option table,
 * argv/optind as getopt left them. Never echoes an option's value. Returns CTL_EXIT_USAGE.
 */
int ctl_getopt_error(const char *cmd, int ret, const struct option *opts, char **argv);

/* CTL_EXIT_USAGE naming argv[first] when positional arguments are left (first < argc), else
 * 0. Shows the word up to any '='. */
int ctl_extra_args(const char *cmd, int argc, char **argv, int first);

/*
 * Parse a decimal integer given to flag (e.g. "--timeout-ms") strictly: no sign unless
 * min < 0, no trailing bytes, within [min, max]. zero_ok additionally allows 0 below min
 * ("0 = default"). On error prints a usage error naming the flag and returns CTL_EXIT_USAGE;
 * 0 on success with *out (OUT) set.
 */
int ctl_parse_int(const char *cmd,
                  const char *flag,
                  const char *s,
                  int64_t min,
                  int64_t max,
                  bool zero_ok,
                  int64_t *out);

/* Format unix ms as "2026-11-30T13:45:01Z" (UTC) into out (>= 24 bytes); "-" for 0. */
void ctl_fmt_time(int64_t ms, char *out, size_t outlen);

/* ==== Command groups (one per ctl_<group>.c) ==== */

int ctl_endpoints_main(struct ctl *c, int argc, char **argv);
void ctl_endpoints_help(FILE *f);

int ctl_keys_main(struct ctl *c, int argc, char **argv);
void ctl_keys_help(FILE *f);

#endif /* SL_CTL_H */
