/*
 * ctl_keys: `sluicectl keys ...`, the API keys of sluice-api (common/sl_apikey.h, table
 * api_keys of sql/0007_api_keys.sql).
 *
 *   create  make a key from RAND_bytes, store its id, scopes, channels, rate limit and the
 *           SHA-256 of its secret, and print the key text: the only time it exists anywhere
 *           outside the caller's hands.
 *   list    the keys (active ones, or --all), never a secret or a hash.
 *   revoke  mark a key revoked (idempotent); sluice-api drops it at its next key reload
 *           (api_key_refresh_ms).
 *
 * The key text is registered with the logger before anything else runs, so no log line
 * (libpq notices included) can carry it, and wiped once printed.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/sl_apikey.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "ctl/ctl.h"

/* ==== Subcommands and their flags ==== */

enum sub { S_CREATE, S_LIST, S_REVOKE, S__N };
#define M(s)  (1u << (s))
#define M_ALL ((1u << S__N) - 1)

static const struct {
    const char *name;     /* subcommand word */
    const char *synopsis; /* after "sluicectl keys <name> " */
    const char *summary;  /* one line */
    int npos;             /* positional arguments (the key id) */
} subs[S__N] = {
    [S_CREATE] = {"create", "--name NAME --scopes LIST [flags]",
                  "make an API key for sluice-api and print it (shown only this once)", 0},
    [S_LIST] = {"list", "[--all] [--json]",
                "list the API keys (active ones; --all adds revoked ones); never a secret", 0},
    [S_REVOKE] = {"revoke", "ID [--json]",
                  "revoke an API key; sluice-api refuses it within api_key_refresh_ms", 1},
};

enum {
    O_HELP = 'h',
    O_NAME = 256,
    O_SCOPES,
    O_CHANNELS,
    O_RATE,
    O_BURST,
    O_ALL,
    O_JSON,
};

struct optdef {
    const char *name; /* long option */
    int has_arg;      /* getopt has_arg */
    int val;          /* O_* */
    unsigned subs;    /* M(S_*) of the subcommands taking it */
    const char *arg;  /* value placeholder for help, NULL for switches */
    const char *help; /* one line */
};

static const struct optdef optdefs[] = {
    {"name", required_argument, O_NAME, M(S_CREATE), "NAME",
     "who or what the key is for (<= 128 bytes; required)"},
    {"scopes", required_argument, O_SCOPES, M(S_CREATE), "LIST",
     "publish, read, admin, comma-separated (admin implies all; required)"},
    {"channels", required_argument, O_CHANNELS, M(S_CREATE), "LIST",
     "channels the key may use, comma-separated, <= 16 (default: all)"},
    {"rate", required_argument, O_RATE, M(S_CREATE), "N",
     "requests/s; above it sluice-api answers 429 (0 = unlimited)"},
    {"burst", required_argument, O_BURST, M(S_CREATE), "N",
     "requests at once above the rate (needs --rate; 0 = the rate)"},
    {"all", no_argument, O_ALL, M(S_LIST), NULL, "include revoked keys"},
    {"json", no_argument, O_JSON, M_ALL, NULL, "print JSON instead of text"},
    {"help", no_argument, O_HELP, M_ALL, NULL, "this help"},
};

#define N_OPTDEFS (sizeof(optdefs) / sizeof(optdefs[0]))

/* Everything the command line said. Strings borrowed from argv; channels owned. */
struct opts {
    const char *id, *name, *scopes_s, *channels_s; /* flags and the positional id */
    unsigned scopes;                               /* parsed --scopes */
    char **channels;                               /* parsed --channels (owned) */
    size_t n_channels;                             /* entries in channels */
    int64_t rate, burst;                           /* --rate, --burst */
    bool rate_set, burst_set;                      /* given */
    bool all, json;                                /* switches */
};

static void opts_fini(struct opts *o)
{
    for (size_t i = 0; i < o->n_channels; i++)
        free(o->channels[i]);
    free(o->channels);
    o->channels = NULL;
    o->n_channels = 0;
}

static const char *cmd_name(enum sub s)
{
    static char buf[S__N][32];
    (void)snprintf(buf[s], sizeof(buf[s]), "keys %s", subs[s].name);
    return buf[s];
}

static void sub_help(FILE *f, enum sub s)
{
    (void)fprintf(f, "  %s keys %s %s\n      %s\n", CTL_PROG, subs[s].name, subs[s].synopsis,
                  subs[s].summary);
    for (size_t i = 0; i < N_OPTDEFS; i++) {
        const struct optdef *d = &optdefs[i];
        char left[64];
        if (!(d->subs & M(s)) || d->val == O_HELP)
            continue;
        (void)snprintf(left, sizeof(left), "--%s%s%s", d->name, d->arg ? " " : "",
                       d->arg ? d->arg : "");
        (void)fprintf(f, "    %-28s %s\n", left, d->help);
    }
}

void ctl_keys_help(FILE *f)
{
    (void)fprintf(
        f,
        "%s keys <subcommand>: API keys of the HTTP API server sluice-api (PostgreSQL table\n"
        "api_keys). Only a SHA-256 of each key's 256-bit random secret is stored.\n\n",
        CTL_PROG);
    for (int s = 0; s < S__N; s++) {
        sub_help(f, (enum sub)s);
        (void)fputc('\n', f);
    }
    (void)fprintf(
        f, "  Keys look like slk_<16-character id>_<43-character secret>. Channel names are\n"
           "  1..64 characters [A-Za-z0-9_.:-].\n"
           "  Exit codes: 0 ok, 1 failed, 2 usage error, 78 bad configuration.\n");
}

/* ==== Parsing ==== */

#define HELP_SHOWN (-1)

/* Validate what the flags say, before the configuration is loaded. */
static int check_values(enum sub s, struct opts *o)
{
    const char *cmd = cmd_name(s);
    sl_err_t err;
    if (s == S_REVOKE) {
        if (!sl_apikey_id_valid(o->id, strlen(o->id)))
            return ctl_usage_error(cmd, "invalid api key id: expected %d characters [a-z0-9]",
                                   SL_APIKEY_ID_LEN);
        return 0;
    }
    if (s != S_CREATE)
        return 0;
    if (!o->name)
        return ctl_usage_error(cmd, "--name is required");
    if (!o->scopes_s)
        return ctl_usage_error(cmd, "--scopes is required");
    if (sl_apikey_scopes_parse(o->scopes_s, &o->scopes, &err) != 0)
        return ctl_usage_error(cmd, "invalid value for --scopes: %s", err.msg);
    if (o->channels_s &&
        sl_apikey_channels_parse(o->channels_s, &o->channels, &o->n_channels, &err) != 0)
        return ctl_usage_error(cmd, "invalid value for --channels: %s", err.msg);
    if (o->burst_set && o->burst > 0 && (!o->rate_set || o->rate == 0))
        return ctl_usage_error(cmd, "--burst needs --rate (a key without a rate is unlimited)");
    /* the remaining rules (name length and characters) as the library applies them */
    struct sl_apikey k;
    memset(&k, 0, sizeof(k));
    memcpy(k.id, "0000000000000000", SL_APIKEY_ID_LEN);
    k.name = sl_xstrdup(o->name);
    k.scopes = o->scopes;
    int rc = sl_apikey_validate(&k, &err);
    sl_apikey_fini(&k);
    if (rc != 0)
        return ctl_usage_error(cmd, "invalid value for --name: %s", err.msg);
    return 0;
}

static int parse(enum sub s, int argc, char **argv, struct opts *o)
{
    const char *cmd = cmd_name(s);
    struct option lopts[N_OPTDEFS + 1];
    size_t n = 0;
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < N_OPTDEFS; i++) {
        if (optdefs[i].subs & M(s))
            lopts[n++] = (struct option){optdefs[i].name, optdefs[i].has_arg, NULL, optdefs[i].val};
    }
    lopts[n] = (struct option){NULL, 0, NULL, 0};
    optind = 0; /* full re-initialisation of GNU getopt */
    opterr = 0;
    int c, rc;
    while ((c = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
        switch (c) {
        case O_HELP:
            printf("usage:\n");
            sub_help(stdout, s);
            return HELP_SHOWN;
        case O_NAME:
            o->name = optarg;
            break;
        case O_SCOPES:
            o->scopes_s = optarg;
            break;
        case O_CHANNELS:
            o->channels_s = optarg;
            break;
        case O_RATE:
            rc = ctl_parse_int(cmd, "--rate", optarg, 0, SL_APIKEY_RATE_MAX, false, &o->rate);
            if (rc)
                return rc;
            o->rate_set = true;
            break;
        case O_BURST:
            rc = ctl_parse_int(cmd, "--burst", optarg, 0, SL_APIKEY_RATE_MAX, false, &o->burst);
            if (rc)
                return rc;
            o->burst_set = true;
            break;
        case O_ALL:
            o->all = true;
            break;
        case O_JSON:
            o->json = true;
            break;
        case '?':
        case ':':
            return ctl_getopt_error(cmd, c, lopts, argv);
        default:
            return ctl_usage_error(cmd, "unexpected option");
        }
    }
    int npos = argc - optind;
    if (npos < subs[s].npos)
        return ctl_usage_error(cmd, "missing api key id");
    if (npos > subs[s].npos)
        return ctl_usage_error(cmd, "unexpected argument #%d (this subcommand takes %s)",
                               subs[s].npos + 1,
                               subs[s].npos ? "one api key id" : "no positional arguments");
    if (subs[s].npos == 1)
        o->id = argv[optind];
    return check_values(s, o);
}

/* ==== Output ==== */

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(j);
}

static json_t *channels_json(char *const *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

static json_t *scopes_json(unsigned scopes)
{
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{SL_SCOPE_PUBLISH, "publish"}, {SL_SCOPE_READ, "read"}, {SL_SCOPE_ADMIN, "admin"}};
    json_t *a = json_array();
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (scopes & names[i].bit)
            json_array_append_new(a, json_string(names[i].name));
    }
    return a;
}

/* "a,b" or "(every channel)" into buf. */
static void channels_text(char *const *v, size_t n, char *buf, size_t cap)
{
    size_t len = 0;
    (void)snprintf(buf, cap, "%s", n ? "" : "(every channel)");
    for (size_t i = 0; i < n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? "," : "", v[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

/* "unlimited", "100/s" or "100/s, burst 200" into buf. */
static void rate_text(int64_t rate, int64_t burst, char *buf, size_t cap)
{
    if (rate == 0)
        (void)snprintf(buf, cap, "unlimited");
    else if (burst == 0)
        (void)snprintf(buf, cap, "%" PRId64 "/s", rate);
    else
        (void)snprintf(buf, cap, "%" PRId64 "/s, burst %" PRId64, rate, burst);
}

/* ==== Subcommands ==== */

struct run {
    enum sub s;                  /* the subcommand */
    const char *cmd;             /* "keys <sub>" for messages */
    const struct sl_config *cfg; /* borrowed from struct ctl */
    PGconn *pg;                  /* open_db; closed by ctl_keys_main */
};

static int open_db(struct run *r)
{
    sl_err_t err;
    r->pg = sl_pg_connect(r->cfg->pg_dsn, &err);
    if (!r->pg)
        return ctl_fail(r->cmd, "%s", err.msg);
    /* never hang behind a stuck lock or a long-running statement */
    if (sl_pg_cmd(r->pg, "set lock_timeout", "select set_config('lock_timeout', '30s', false)", 0,
                  NULL, &err) != 0 ||
        sl_pg_cmd(r->pg, "set statement_timeout",
                  "select set_config('statement_timeout', '60s', false)", 0, NULL, &err) != 0)
        return ctl_fail(r->cmd, "%s", err.msg);
    return 0;
}

static int cmd_create(struct run *r, struct opts *o)
{
    sl_err_t err;
    char token[SL_APIKEY_TOKEN_MAX];
    struct sl_apikey k;
    int rc;
    memset(&k, 0, sizeof(k));
    if (sl_apikey_generate(token, k.id, k.hash, &err) != 0)
        return ctl_fail(r->cmd, "%s", err.msg);
    sl_log_add_secret(token);
    k.name = sl_xstrdup(o->name);
    k.scopes = o->scopes;
    k.channels = o->channels; /* handed to k */
    k.n_channels = o->n_channels;
    o->channels = NULL;
    o->n_channels = 0;
    k.rate_per_s = o->rate;
    k.burst = o->burst;
    rc = open_db(r);
    if (rc)
        goto out;
    if (sl_apikey_db_insert(r->pg, &k, &err) != 0) {
        rc = ctl_fail(r->cmd, "no key created: %s", err.msg);
        goto out;
    }
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "id", json_string(k.id));
        json_object_set_new(j, "name", json_string(k.name));
        json_object_set_new(j, "key", json_string(token));
        json_object_set_new(j, "scopes", scopes_json(k.scopes));
        json_object_set_new(j, "channels", channels_json(k.channels, k.n_channels));
        json_object_set_new(j, "rate_per_s", json_integer(k.rate_per_s));
        json_object_set_new(j, "burst", json_integer(k.burst));
        print_json(j);
    } else {
        char sc[SL_APIKEY_SCOPES_STR_MAX], ch[SL_APIKEY_CHANNELS_MAX * (SL_APIKEY_CHANNEL_MAX + 1)];
        char rt[64];
        sl_apikey_scopes_format(k.scopes, sc, sizeof(sc));
        channels_text(k.channels, k.n_channels, ch, sizeof(ch));
        rate_text(k.rate_per_s, k.burst, rt, sizeof(rt));
        printf("%-9s%s\n", "api key", token);
        printf("%-9s%s\n", "id", k.id);
        printf("%-9s%s\n", "name", k.name[0] ? k.name : "-");
        printf("%-9s%s\n", "scopes", sc);
        printf("%-9s%s\n", "channels", ch);
        printf("%-9s%s\n", "rate", rt);
        printf("\nThe key is shown only this once: give it to its user now. Sluice keeps only a\n"
               "SHA-256 of its secret; a lost key cannot be recovered (create another, revoke\n"
               "this one with '%s keys revoke %s').\n",
               CTL_PROG, k.id);
    }
    rc = CTL_EXIT_OK;
out:
    sl_secret_wipe(token, sizeof(token));
    sl_apikey_fini(&k);
    return rc;
}

static int cmd_list(struct run *r, struct opts *o)
{
    sl_err_t err;
    struct sl_apikey *keys = NULL;
    size_t n = 0;
    int rc = open_db(r);
    if (rc)
        return rc;
    size_t skipped = 0;
    if (sl_apikey_db_list(r->pg, o->all, &keys, &n, &skipped, &err) != 0)
        return ctl_fail(r->cmd, "%s", err.msg);
    if (skipped > 0) /* listed on stderr: they exist but do not authenticate */
        (void)fprintf(stderr,
                      "sluicectl %s: %zu key rows left out, they break the rules and do not "
                      "authenticate (the last: %s)\n",
                      r->cmd, skipped, err.msg);
    if (o->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
            const struct sl_apikey *k = &keys[i];
            char created[32], revoked[32];
            ctl_fmt_time(k->created_ms, created, sizeof(created));
            ctl_fmt_time(k->revoked_ms, revoked, sizeof(revoked));
            json_t *j = json_object();
            json_object_set_new(j, "id", json_string(k->id));
            json_object_set_new(j, "name", json_string(k->name));
            json_object_set_new(j, "scopes", scopes_json(k->scopes));
            json_object_set_new(j, "channels", channels_json(k->channels, k->n_channels));
            json_object_set_new(j, "rate_per_s", json_integer(k->rate_per_s));
            json_object_set_new(j, "burst", json_integer(k->burst));
            json_object_set_new(j, "created", json_string(created));
            json_object_set_new(j, "revoked", k->revoked_ms ? json_string(revoked) : json_null());
            json_object_set_new(j, "active", json_boolean(k->revoked_ms == 0));
            json_array_append_new(arr, j);
        }
        print_json(arr);
    } else {
        int wname = 4;
        for (size_t i = 0; i < n; i++) {
            int b = (int)strlen(keys[i].name);
            wname = b > wname ? b : wname;
        }
        if (wname > 32)
            wname = 32;
        printf("%-16s  %-*s  %-18s  %-20s  %-20s  %-20s  %s\n", "ID", wname, "NAME", "SCOPES",
               "RATE", "CREATED", "REVOKED", "CHANNELS");
        for (size_t i = 0; i < n; i++) {
            const struct sl_apikey *k = &keys[i];
            char created[32], revoked[32], sc[SL_APIKEY_SCOPES_STR_MAX], rt[64];
            char ch[SL_APIKEY_CHANNELS_MAX * (SL_APIKEY_CHANNEL_MAX + 1)];
            ctl_fmt_time(k->created_ms, created, sizeof(created));
            ctl_fmt_time(k->revoked_ms, revoked, sizeof(revoked));
            sl_apikey_scopes_format(k->scopes, sc, sizeof(sc));
            rate_text(k->rate_per_s, k->burst, rt, sizeof(rt));
            channels_text(k->channels, k->n_channels, ch, sizeof(ch));
            printf("%-16s  %-*.*s  %-18s  %-20s  %-20s  %-20s  %s\n", k->id, wname, wname,
                   k->name[0] ? k->name : "-", sc, rt, created, revoked, ch);
        }
        printf("%zu key%s%s\n", n, n == 1 ? "" : "s", o->all ? "" : " (active; --all for revoked)");
    }
    for (size_t i = 0; i < n; i++)
        sl_apikey_fini(&keys[i]);
    free(keys);
    return CTL_EXIT_OK;
}

static int cmd_revoke(struct run *r, struct opts *o)
{
    sl_err_t err;
    bool changed = false;
    int rc = open_db(r);
    if (rc)
        return rc;
    if (sl_apikey_db_revoke(r->pg, o->id, &changed, &err) != 0)
        return ctl_fail(r->cmd, "%s", err.msg);
    if (o->json)
        print_json(json_pack("{s:s, s:b, s:b}", "id", o->id, "revoked", 1, "changed", changed));
    else if (changed)
        printf("api key %s revoked: sluice-api refuses it from its next key reload "
               "(api_key_refresh_ms)\n",
               o->id);
    else
        printf("api key %s was already revoked\n", o->id);
    return CTL_EXIT_OK;
}

/* ==== Entry point ==== */

static const char *sub_name(int s)
{
    return subs[s].name;
}

int ctl_keys_main(struct ctl *c, int argc, char **argv)
{
    int s;
    int rc = ctl_pick_sub("keys", argc, argv, sub_name, S__N, ctl_keys_help, &s);
    if (rc >= 0)
        return rc;
    struct opts o;
    struct run r;
    memset(&r, 0, sizeof(r));
    rc = parse((enum sub)s, argc - 1, argv + 1, &o);
    if (rc != 0) {
        opts_fini(&o);
        return rc == HELP_SHOWN ? CTL_EXIT_OK : rc;
    }
    r.s = (enum sub)s;
    r.cmd = cmd_name(r.s);
    r.cfg = ctl_config(c);
    switch (r.s) {
    case S_CREATE:
        rc = cmd_create(&r, &o);
        break;
    case S_LIST:
        rc = cmd_list(&r, &o);
        break;
    case S_REVOKE:
        rc = cmd_revoke(&r, &o);
        break;
    default:
        rc = CTL_EXIT_USAGE;
        break;
    }
    if (r.pg)
        PQfinish(r.pg);
    opts_fini(&o);
    return rc;
}
