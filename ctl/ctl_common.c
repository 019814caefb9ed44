/*
 * ctl_common: helpers shared by every sluicectl command group (see ctl.h).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl/ctl.h"

const struct sl_config *ctl_config(struct ctl *c)
{
    if (c->loaded)
        return &c->cfg;
    int argc = c->cfg_argc;
    char *argv[CTL_CFG_ARGS_MAX + 2];
    memcpy(argv, c->cfg_argv, sizeof(argv));
    argv[argc] = NULL;
    /* exits CTL_EXIT_CONFIG on a bad config, 0 after --print-config and friends */
    sl_cfg_main_load(&c->cfg, CTL_PROG, &argc, argv);
    c->loaded = true;
    return &c->cfg;
}

__attribute__((format(printf, 2, 0))) static void
vreport(const char *cmd, const char *fmt, va_list ap)
{
    (void)fprintf(stderr, "%s%s%s: ", CTL_PROG, cmd ? " " : "", cmd ? cmd : "");
    (void)vfprintf(stderr, fmt, ap);
    (void)fputc('\n', stderr);
}

int ctl_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
    (void)fprintf(stderr, "Try '%s%s%s --help'.\n", CTL_PROG, cmd ? " " : "", cmd ? cmd : "");
    return CTL_EXIT_USAGE;
}

int ctl_pick_sub(const char *group,
                 int argc,
                 char **argv,
                 const char *(*name_of)(int s),
                 int n,
                 void (*help)(FILE *f),
                 int *sub)
{
    if (argc < 2) {
        help(stderr);
        return CTL_EXIT_USAGE;
    }
    const char *word = argv[1];
    if (strcmp(word, "-h") == 0 || strcmp(word, "--help") == 0 || strcmp(word, "help") == 0) {
        help(stdout);
        return CTL_EXIT_OK;
    }
    for (int s = 0; s < n; s++) {
        if (strcmp(word, name_of(s)) == 0) {
            *sub = s;
            return -1;
        }
    }
    size_t len = strcspn(word, "=");
    return ctl_usage_error(group, "unknown subcommand '%.*s'", (int)len, word);
}

int ctl_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
    return CTL_EXIT_FAIL;
}

int ctl_getopt_error(const char *cmd, int ret, const struct option *opts, char **argv)
{
    if (ret == ':') {
        /* missing value: optopt holds the option's val */
        for (const struct option *o = opts; o->name; o++) {
            if (o->val == optopt && o->has_arg != no_argument)
                return ctl_usage_error(cmd, "option '--%s' requires a value", o->name);
        }
        return ctl_usage_error(cmd, "an option requires a value");
    }
    /* The offending word: for a long option, the last one getopt consumed (optopt is 0, or
     * the val of a switch given a value); for a short one, optopt (inside a cluster such as
     * -zP getopt has not moved past the word yet, so the last word consumed is an earlier
     * one). Only an option's name is shown, never an "=value" part: it may be a secret
     * given to the wrong option. */
    const char *word = optind > 0 ? argv[optind - 1] : "?";
    size_t n = strcspn(word, "=");
    const struct option *sw = NULL; /* the switch named by word, when it is one */
    for (const struct option *o = opts; o->name && strncmp(word, "--", 2) == 0; o++) {
        if (o->has_arg == no_argument && strlen(o->name) == n - 2 &&
            strncmp(o->name, word + 2, n - 2) == 0)
            sw = o;
    }
    bool is_long = strncmp(word, "--", 2) == 0 && (optopt == 0 || (sw && sw->val == optopt));
    if (!is_long && optopt > ' ' && optopt < 127)
        return ctl_usage_error(cmd, "unknown option '-%c'", optopt);
    if (word[n] == '=') {
        if (sw)
            return ctl_usage_error(cmd, "option '--%s' does not take a value", sw->name);
        return ctl_usage_error(cmd, "option '%.*s' is unknown or does not take a value", (int)n,
                               word);
    }
    return ctl_usage_error(cmd, "unknown or ambiguous option '%.*s'", (int)n, word);
}

int ctl_extra_args(const char *cmd, int argc, char **argv, int first)
{
    if (first < argc) {
        size_t n = strcspn(argv[first], "=");
        return ctl_usage_error(cmd, "unexpected argument '%.*s'", (int)n, argv[first]);
    }
    return 0;
}

int ctl_parse_int(const char *cmd,
                  const char *flag,
                  const char *s,
                  int64_t min,
                  int64_t max,
                  bool zero_ok,
                  int64_t *out)
{
    char *end = NULL;
    errno = 0;
    bool digits = s && ((s[0] >= '0' && s[0] <= '9') || (min < 0 && s[0] == '-'));
    long long v = digits ? strtoll(s, &end, 10) : 0;
    if (!digits || errno != 0 || end == s || *end != '\0' ||
        !((v >= min && v <= max) || (zero_ok && v == 0))) {
        if (zero_ok)
            return ctl_usage_error(cmd,
                                   "invalid value for %s: expected 0 (the global default) "
                                   "or an integer in %lld..%lld",
                                   flag, (long long)min, (long long)max);
        return ctl_usage_error(cmd, "invalid value for %s: expected an integer in %lld..%lld", flag,
                               (long long)min, (long long)max);
    }
    *out = v;
    return 0;
}

void ctl_fmt_time(int64_t ms, char *out, size_t outlen)
{
    if (ms <= 0) {
        (void)snprintf(out, outlen, "-");
        return;
    }
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&s, &tm) || strftime(out, outlen, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        (void)snprintf(out, outlen, "%lld", (long long)ms);
}
