/*
 * ctl_endpoints: `sluicectl endpoints ...`, the operator's interface to the endpoint registry.
 *
 *   add, update, disable, enable, rotate-secret, delete: validate every flag (exit 2, nothing
 *       touched), then run the registry's change operation (sl_reg_create / _update / _rotate
 *       / _remove in common/sl_registry.h, the same code sluice-api runs): one transaction in
 *       PostgreSQL, the committed state published to the endpoints topic and flushed with
 *       acks=all before success is reported. A publish failure leaves the committed change in
 *       place and says so: `endpoints sync` repairs the topic. This file only parses, maps
 *       flags onto the row and prints.
 *   show, list: read PostgreSQL (the source of truth), never the topic.
 *   sync: republish every endpoint and tombstone topic keys the registry no longer has.
 *
 * Secrets are printed only on creation, on rotation and with `show --show-secrets`; header
 * values (often credentials) only with --show-secrets. A secret is HMAC (whsec_, the default)
 * or Ed25519 (whsk_, `--signature ed25519`); the public key of an Ed25519 one (whpk_, not
 * secret: receivers verify with it) is printed with the new secret and by `show`, which needs
 * master_key for it because the key pair is sealed in the registry like any secret. `list` redacts
 * URLs (no query string); `show` prints them whole (the operator asked for this endpoint). Every
 * secret sluicectl handles in clear is registered with the logger first, so no log line can carry
 * it.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "common/sl_endpoints.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_record.h"
#include "common/sl_registry.h"
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"
#include "common/sl_url.h"
#include "ctl/ctl.h"

#define FLUSH_TIMEOUT_MS  SL_REG_FLUSH_TIMEOUT_MS /* sync; > the producer's 15 s message timeout */
#define SCAN_TIMEOUT_MS   30000                   /* sync: reading the topic to its end */
#define OVERLAP_DEFAULT_S 86400
#define OVERLAP_MAX_S     SL_REG_OVERLAP_MAX_S

/* ==== Subcommands and their flags ==== */

enum sub {
    S_ADD,
    S_SHOW,
    S_LIST,
    S_UPDATE,
    S_DISABLE,
    S_ENABLE,
    S_ROTATE,
    S_DELETE,
    S_SYNC,
    S_RESEAL,
    S__N
};
#define M(s)  (1u << (s))
#define M_ALL ((1u << S__N) - 1)

static const struct {
    const char *name;     /* subcommand word */
    const char *synopsis; /* after "sluicectl endpoints <name> " */
    const char *summary;  /* one line */
    int npos;             /* positional arguments (the endpoint id) */
} subs[S__N] = {
    [S_ADD] = {"add", "--id ID --url URL [flags]",
               "register an endpoint; prints it with its signing secret (shown only this once) "
               "and, for --signature ed25519, its public key",
               0},
    [S_SHOW] = {"show", "ID [--show-secrets] [--json]",
                "print one endpoint from the registry, URL in full, with the public keys of its "
                "Ed25519 secrets (these need master_key)",
                1},
    [S_LIST] = {"list", "[--json]", "list every endpoint (URLs without their query string)", 0},
    [S_UPDATE] = {"update", "ID [flags]",
                  "change the given settings of an endpoint (others stay as they are)", 1},
    [S_DISABLE] = {"disable", "ID --reason TEXT [--json]",
                   "stop deliveries to an endpoint (reported as disabled)", 1},
    [S_ENABLE] = {"enable", "ID [--json]", "resume deliveries to a disabled endpoint", 1},
    [S_ROTATE] = {"rotate-secret",
                  "ID [--overlap-s N] [--signature hmac|ed25519] [--secret whsec_...|whsk_...] "
                  "[--json]",
                  "make a new signing secret current; the previous one keeps signing for the "
                  "overlap; prints the new secret (and an Ed25519 one's public key)",
                  1},
    [S_DELETE] = {"delete", "ID [--json]", "remove an endpoint (tombstone on the topic)", 1},
    [S_SYNC] = {"sync", "[--json]",
                "republish every endpoint and delete topic entries the registry lacks "
                "(repairs a failed publish)",
                0},
    [S_RESEAL] = {"reseal", "[--json]",
                  "master-key rotation: re-seal every secret and re-sign and republish every "
                  "record with the first key of master_key",
                  0},
};

enum {
    O_HELP = 'h',
    O_ID = 256,
    O_URL,
    O_NAME,
    O_TEMPLATE,
    O_NO_TEMPLATE,
    O_METHOD,
    O_CT,
    O_HEADER,
    O_CLEAR_HEADERS,
    O_TYPES,
    O_CHANNELS,
    O_SECRET,
    O_SIGNATURE,
    O_OVERLAP,
    O_REASON,
    O_SHOW_SECRETS,
    O_JSON,
    O_NUM0, /* + enum sl_reg_ep_num */
};

struct optdef {
    const char *name; /* long option */
    int has_arg;      /* getopt has_arg */
    int val;          /* O_* */
    unsigned subs;    /* M(S_*) of the subcommands taking it */
    const char *arg;  /* value placeholder for help, NULL for switches */
    const char *help; /* one line */
};

#define M_SET (M(S_ADD) | M(S_UPDATE))

static const struct optdef optdefs[] = {
    {"id", required_argument, O_ID, M(S_ADD), "ID",
     "endpoint id: 1..64 characters [A-Za-z0-9_-] (required)"},
    {"url", required_argument, O_URL, M_SET, "URL",
     "http(s) URL, or a postback template with --template (required for add)"},
    {"name", required_argument, O_NAME, M_SET, "NAME", "display name (UTF-8, <= 128 bytes)"},
    {"template", no_argument, O_TEMPLATE, M_SET, NULL,
     "URL is a postback template: {macro} placeholders (path/query only) filled per delivery"},
    {"no-template", no_argument, O_NO_TEMPLATE, M(S_UPDATE), NULL, "URL is a plain URL again"},
    {"method", required_argument, O_METHOD, M_SET, "METHOD", "POST (default), PUT, PATCH or GET"},
    {"content-type", required_argument, O_CT, M_SET, "CT",
     "content type of every request ('' = each delivery's own)"},
    {"header", required_argument, O_HEADER, M_SET, "'NAME: VALUE'",
     "extra request header, repeatable, at most 32 (update: replaces all)"},
    {"clear-headers", no_argument, O_CLEAR_HEADERS, M(S_UPDATE), NULL, "remove every extra header"},
    {"types", required_argument, O_TYPES, M_SET, "LIST",
     "event types to receive when fanned out, comma-separated: exact names and prefix.* "
     "wildcards, at most 64 ('' = every type, the default)"},
    {"channels", required_argument, O_CHANNELS, M_SET, "LIST",
     "channel labels, comma-separated, 1..64 characters [A-Za-z0-9_.:-] each, at most 16; "
     "the endpoint then receives only events carrying one of them ('' = no restriction)"},
    {"secret", required_argument, O_SECRET, M(S_ADD) | M(S_ROTATE), "whsec_...|whsk_...",
     "signing secret to use: whsec_ (HMAC-SHA256) or whsk_ (Ed25519 seed and public key) "
     "(default: a new random one, see --signature)"},
    {"signature", required_argument, O_SIGNATURE, M(S_ADD) | M(S_ROTATE), "hmac|ed25519",
     "signature scheme: hmac (Standard Webhooks v1, a shared whsec_ secret; the default) or "
     "ed25519 (v1a: a whsk_ key pair; receivers verify with its whpk_ public key); "
     "rotate-secret keeps the current secret's scheme unless given"},
    {"overlap-s", required_argument, O_OVERLAP, M(S_ROTATE), "N",
     "seconds the previous secret keeps signing (default 86400; 0 = stop now)"},
    {"reason", required_argument, O_REASON, M(S_DISABLE), "TEXT",
     "why deliveries stop (<= 256 bytes; required)"},
    {"show-secrets", no_argument, O_SHOW_SECRETS, M(S_SHOW), NULL,
     "also print the decrypted signing secrets and header values"},
    {"json", no_argument, O_JSON, M_ALL, NULL, "print JSON instead of text"},
    {"help", no_argument, O_HELP, M_ALL, NULL, "this help"},
};

#define N_OPTDEFS (sizeof(optdefs) / sizeof(optdefs[0]))

/* Everything the command line said. Strings borrowed from argv except the header copies. */
struct opts {
    const char *id, *url, *name, *method_s, *ct, *secret_s, *reason;
    int tpl;                                  /* -1 not given, 0 --no-template, 1 --template */
    struct sl_kv hdr[SL_HDR_MAX];             /* parsed --header values (point into hdr_buf) */
    char *hdr_buf[SL_HDR_MAX];                /* owned copies split at ':' */
    size_t n_hdr;                             /* entries in hdr */
    bool clear_headers;                       /* --clear-headers */
    const char *types[SL_EP_TYPES_MAX];       /* parsed --types (point into types_buf) */
    size_t n_types;                           /* entries in types */
    char *types_buf;                          /* owned copy split at ',' */
    bool types_set;                           /* --types given ('' = clear) */
    const char *channels[SL_EP_CHANNELS_MAX]; /* parsed --channels (point into channels_buf) */
    size_t n_channels;                        /* entries in channels */
    char *channels_buf;                       /* owned copy split at ',' */
    bool channels_set;                        /* --channels given ('' = clear) */
    int64_t num[SL_REG_N__COUNT];             /* numeric flags */
    bool num_set[SL_REG_N__COUNT];            /* which were given */
    int64_t overlap_s;                        /* --overlap-s */
    bool json, show_secrets;                  /* output switches */
    enum sl_http_method method;               /* parsed --method */
    struct sl_secret secret;                  /* parsed --secret (wiped at exit) */
    bool have_secret;                         /* --secret given */
    const char *signature_s;                  /* --signature as given, or NULL */
    enum sl_secret_kind signature;            /* parsed --signature (HMAC when not given) */
};

static void opts_fini(struct opts *o)
{
    for (size_t i = 0; i < o->n_hdr; i++)
        free(o->hdr_buf[i]);
    free(o->types_buf);
    free(o->channels_buf);
    sl_secret_fini(&o->secret);
}

static const char *cmd_name(enum sub s)
{
    static char buf[S__N][48];
    (void)snprintf(buf[s], sizeof(buf[s]), "endpoints %s", subs[s].name);
    return buf[s];
}

static void print_flag_help(FILE *f, const char *name, const char *arg, const char *help)
{
    char left[64];
    (void)snprintf(left, sizeof(left), "--%s%s%s", name, arg ? " " : "", arg ? arg : "");
    (void)fprintf(f, "    %-28s %s\n", left, help);
}

static void sub_help(FILE *f, enum sub s)
{
    (void)fprintf(f, "  %s endpoints %s %s\n      %s\n", CTL_PROG, subs[s].name, subs[s].synopsis,
                  subs[s].summary);
    for (size_t i = 0; i < N_OPTDEFS; i++) {
        const struct optdef *d = &optdefs[i];
        if (!(d->subs & M(s)) || d->val == O_HELP)
            continue;
        print_flag_help(f, d->name, d->arg, d->help);
        if (d->val == O_HEADER) {
            /* the numeric policy flags follow the header flags */
            for (int n = 0; n < SL_REG_N__COUNT; n++) {
                char help[160];
                (void)snprintf(help, sizeof(help), "%s: 0 = %s, else %" PRId64 "..%" PRId64,
                               sl_reg_ep_nums[n].help, sl_reg_ep_nums[n].zero,
                               sl_reg_ep_nums[n].min, sl_reg_ep_nums[n].max);
                print_flag_help(f, sl_reg_ep_nums[n].flag, "N", help);
            }
        }
    }
}

void ctl_endpoints_help(FILE *f)
{
    (void)fprintf(
        f,
        "%s endpoints <subcommand>: the endpoint registry (PostgreSQL), published to the\n"
        "compacted endpoints topic that every consumer follows.\n\n",
        CTL_PROG);
    for (int s = 0; s < S__N; s++) {
        sub_help(f, (enum sub)s);
        (void)fputc('\n', f);
    }
    (void)fprintf(
        f, "  Postback templates: {name} placeholders ([A-Za-z0-9_], balanced braces) in the\n"
           "  path or query, e.g. https://t.example/pb?click={click_id}&sum={payout}.\n"
           "  Exit codes: 0 ok, 1 failed, 2 usage error, 78 bad configuration.\n");
}

/* ==== Parsing ==== */

#define HELP_SHOWN (-1)

static int parse_header(enum sub s, struct opts *o, const char *arg)
{
    const char *cmd = cmd_name(s);
    if (o->n_hdr == SL_HDR_MAX)
        return ctl_usage_error(cmd, "too many --header flags: at most %d", SL_HDR_MAX);
    const char *colon = strchr(arg, ':');
    if (!colon)
        return ctl_usage_error(cmd, "--header must look like 'Name: value'");
    size_t nl = (size_t)(colon - arg);
    bool name_ok = sl_valid_header_name(arg, nl);
    if (strpbrk(arg, "\r\n")) {
        if (name_ok)
            return ctl_usage_error(cmd,
                                   "--header '%.*s' contains CR or LF: refused (header "
                                   "injection)",
                                   (int)nl, arg);
        return ctl_usage_error(cmd, "--header contains CR or LF: refused (header injection)");
    }
    if (!name_ok)
        return ctl_usage_error(cmd,
                               "--header name is not a valid HTTP field name (1..%d "
                               "characters of RFC 9110 token characters, no spaces)",
                               SL_HDR_NAME_MAX);
    if (sl_header_is_reserved(arg, nl)) {
        if (nl == 12 && strncasecmp(arg, "content-type", 12) == 0)
            return ctl_usage_error(cmd, "--header 'Content-Type' is reserved: use "
                                        "--content-type");
        return ctl_usage_error(cmd, "--header '%.*s' is reserved: sluice sets it itself", (int)nl,
                               arg);
    }
    char *buf = sl_xstrdup(arg);
    buf[nl] = '\0';
    char *val = buf + nl + 1;
    while (*val == ' ' || *val == '\t')
        val++;
    size_t vl = strlen(val);
    while (vl > 0 && (val[vl - 1] == ' ' || val[vl - 1] == '\t'))
        val[--vl] = '\0';
    if (!sl_valid_header_value(val, vl)) {
        free(buf);
        if (vl > SL_HDR_VALUE_MAX)
            return ctl_usage_error(cmd, "--header '%.*s' value is longer than %d bytes", (int)nl,
                                   arg, SL_HDR_VALUE_MAX);
        return ctl_usage_error(cmd, "--header '%.*s' value contains a control character", (int)nl,
                               arg);
    }
    for (size_t i = 0; i < o->n_hdr; i++) {
        if (strcasecmp(o->hdr[i].name, buf) == 0) {
            free(buf);
            return ctl_usage_error(cmd, "--header '%.*s' given twice", (int)nl, arg);
        }
    }
    o->hdr_buf[o->n_hdr] = buf;
    o->hdr[o->n_hdr].name = buf;
    o->hdr[o->n_hdr].value = val;
    o->n_hdr++;
    return 0;
}

/*
 * Split a comma-separated --types / --channels value (spaces around entries ignored; '' =
 * an empty list) into v (pointers into *buf, an owned copy), checking each entry with valid
 * and refusing repeats. Entries are counted from 1 in messages; their text is not secret.
 */
static int parse_list(enum sub s,
                      const char *flag,
                      const char *arg,
                      size_t max,
                      size_t max_len,
                      bool (*valid)(const char *, size_t),
                      const char *rule,
                      char **buf,
                      const char **v,
                      size_t *n)
{
    const char *cmd = cmd_name(s);
    free(*buf); /* the flag given again: the last one counts */
    *buf = sl_xstrdup(arg);
    *n = 0;
    char *p = *buf;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0')
        return 0;
    for (size_t idx = 1;; idx++) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        size_t len = strlen(p);
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            p[--len] = '\0';
        if (*n == max)
            return ctl_usage_error(cmd, "invalid value for %s: more than %zu entries", flag, max);
        if (len == 0)
            return ctl_usage_error(cmd, "invalid value for %s: entry %zu is empty", flag, idx);
        if (len > max_len)
            return ctl_usage_error(cmd, "invalid value for %s: entry %zu is longer than %zu bytes",
                                   flag, idx, max_len);
        if (!valid(p, len))
            return ctl_usage_error(cmd, "invalid value for %s: entry %zu ('%s') %s", flag, idx, p,
                                   rule);
        for (size_t j = 0; j < *n; j++) {
            if (strcmp(v[j], p) == 0)
                return ctl_usage_error(cmd,
                                       "invalid value for %s: entry %zu ('%s') repeats entry %zu",
                                       flag, idx, p, j + 1);
        }
        v[(*n)++] = p;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

static bool any_setting(const struct opts *o)
{
    bool any = o->url || o->name || o->method_s || o->ct || o->tpl >= 0 || o->n_hdr > 0 ||
               o->clear_headers || o->types_set || o->channels_set;
    for (int i = 0; i < SL_REG_N__COUNT; i++)
        any = any || o->num_set[i];
    return any;
}

/*
 * Check one free-text field with the record codec's own rules (UTF-8, length, control
 * characters), through a minimal record that is valid apart from the field under test.
 */
static int codec_text_check(enum sub s, const char *flag, const char *name, const char *reason)
{
    struct sl_endpoint_rec rec;
    struct sl_endpoint_secret sec = {(const uint8_t *)"x", 1, 0};
    sl_err_t err;
    memset(&rec, 0, sizeof(rec));
    rec.id = "x";
    rec.url = "https://x.invalid/";
    rec.secrets = &sec;
    rec.n_secrets = 1;
    rec.enabled = true;
    rec.name = name;
    rec.reason = reason;
    if (sl_endpoint_rec_validate(&rec, NULL, &err) != 0)
        return ctl_usage_error(cmd_name(s), "invalid value for %s: %s", flag, err.msg);
    return 0;
}

/* Validate what can be validated without the registry. */
/* --method, case-insensitive, into o->method. */
static int check_method(const char *cmd, struct opts *o)
{
    char up[8];
    size_t n = strlen(o->method_s);
    for (size_t i = 0; i < n && i < sizeof(up); i++)
        up[i] = (char)(o->method_s[i] >= 'a' && o->method_s[i] <= 'z' ? o->method_s[i] - 32
                                                                      : o->method_s[i]);
    if (n >= sizeof(up) || sl_http_method_parse(up, n, &o->method) != 0)
        return ctl_usage_error(cmd, "invalid value for --method: expected POST, PUT, PATCH "
                                    "or GET");
    return 0;
}

/* --name and --reason: texts the record's codec can carry. */
static int check_texts(enum sub s, const char *cmd, const struct opts *o)
{
    int rc = 0;
    if (o->name && o->name[0])
        rc = codec_text_check(s, "--name", o->name, NULL);
    if (rc == 0 && o->reason) {
        if (!o->reason[0])
            return ctl_usage_error(cmd, "--reason must not be empty");
        rc = codec_text_check(s, "--reason", NULL, o->reason);
    }
    return rc;
}

/* --signature and --secret: the scheme named, the secret parsed, and the two agreeing. */
static int check_signing(const char *cmd, struct opts *o)
{
    sl_err_t err;
    if (o->signature_s) {
        if (strcmp(o->signature_s, "hmac") == 0)
            o->signature = SL_SECRET_HMAC;
        else if (strcmp(o->signature_s, "ed25519") == 0)
            o->signature = SL_SECRET_ED25519;
        else
            return ctl_usage_error(cmd, "invalid value for --signature: expected hmac or ed25519");
    }
    if (!o->secret_s)
        return 0;
    if (sl_secret_parse(&o->secret, o->secret_s, &err) != 0)
        return ctl_usage_error(cmd, "invalid value for --secret: %s", err.msg);
    o->have_secret = true;
    if (o->signature_s && o->secret.kind != o->signature)
        return ctl_usage_error(cmd, "--signature %s does not fit --secret (a %s secret)",
                               o->signature_s,
                               o->secret.kind == SL_SECRET_ED25519 ? "whsk_" : "whsec_");
    return 0;
}

/* What each subcommand requires or excludes. */
static int check_required(enum sub s, const char *cmd, const struct opts *o)
{
    if (s == S_ADD) {
        if (!o->id)
            return ctl_usage_error(cmd, "--id is required");
        if (!o->url)
            return ctl_usage_error(cmd, "--url is required");
        if (!o->num_set[SL_REG_N_RATE] &&
            (o->num_set[SL_REG_N_BURST] || o->num_set[SL_REG_N_RATE_PERIOD]))
            return ctl_usage_error(cmd, "--burst and --rate-period-ms need --rate");
    }
    if (s == S_UPDATE && !any_setting(o))
        return ctl_usage_error(cmd, "nothing to update: give at least one setting flag");
    if (s == S_UPDATE && o->clear_headers && o->n_hdr > 0)
        return ctl_usage_error(cmd, "--clear-headers and --header exclude each other");
    if (s == S_DISABLE && !o->reason)
        return ctl_usage_error(cmd, "--reason is required");
    return 0;
}

static int check_values(enum sub s, struct opts *o)
{
    const char *cmd = cmd_name(s);
    sl_err_t err;
    int rc;
    if (o->id && !sl_valid_endpoint_id(o->id, strlen(o->id)))
        return ctl_usage_error(cmd,
                               "invalid endpoint id: expected 1..%d characters "
                               "[A-Za-z0-9_-]",
                               SL_ENDPOINT_ID_MAX);
    if (o->method_s && (rc = check_method(cmd, o)) != 0)
        return rc;
    if (o->ct && o->ct[0] && !sl_valid_content_type(o->ct, strlen(o->ct)))
        return ctl_usage_error(cmd,
                               "invalid value for --content-type: expected 1..%d printable "
                               "ASCII characters",
                               SL_CT_MAX);
    if ((rc = check_texts(s, cmd, o)) != 0)
        return rc;
    /* for update without --template/--no-template the final mode is known only after reading
     * the row; check_merged() repeats the check then */
    if (o->url && (s == S_ADD || o->tpl >= 0) &&
        sl_endpoint_url_check(o->url, o->tpl == 1, &err) != 0)
        return ctl_usage_error(cmd, "invalid value for --url: %s", err.msg);
    if ((rc = check_signing(cmd, o)) != 0)
        return rc;
    return check_required(s, cmd, o);
}

static int parse(enum sub s, int argc, char **argv, struct opts *o)
{
    const char *cmd = cmd_name(s);
    struct option lopts[N_OPTDEFS + SL_REG_N__COUNT + 1];
    size_t n = 0;
    memset(o, 0, sizeof(*o));
    o->tpl = -1;
    o->overlap_s = OVERLAP_DEFAULT_S;
    for (size_t i = 0; i < N_OPTDEFS; i++) {
        if (!(optdefs[i].subs & M(s)))
            continue;
        lopts[n++] = (struct option){optdefs[i].name, optdefs[i].has_arg, NULL, optdefs[i].val};
        if (optdefs[i].val == O_HEADER) {
            for (int k = 0; k < SL_REG_N__COUNT; k++)
                lopts[n++] =
                    (struct option){sl_reg_ep_nums[k].flag, required_argument, NULL, O_NUM0 + k};
        }
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
        case O_ID:
            o->id = optarg;
            break;
        case O_URL:
            o->url = optarg;
            break;
        case O_NAME:
            o->name = optarg;
            break;
        case O_TEMPLATE:
            o->tpl = 1;
            break;
        case O_NO_TEMPLATE:
            o->tpl = 0;
            break;
        case O_METHOD:
            o->method_s = optarg;
            break;
        case O_CT:
            o->ct = optarg;
            break;
        case O_HEADER:
            rc = parse_header(s, o, optarg);
            if (rc)
                return rc;
            break;
        case O_CLEAR_HEADERS:
            o->clear_headers = true;
            break;
        case O_TYPES:
            rc = parse_list(s, "--types", optarg, SL_EP_TYPES_MAX, SL_EVENT_TYPE_MAX,
                            sl_valid_type_filter,
                            "is neither an event type (printable ASCII, no spaces, no '*') nor a "
                            "prefix.* wildcard",
                            &o->types_buf, o->types, &o->n_types);
            if (rc)
                return rc;
            o->types_set = true;
            break;
        case O_CHANNELS:
            rc = parse_list(s, "--channels", optarg, SL_EP_CHANNELS_MAX, SL_CHANNEL_MAX,
                            sl_valid_channel, "must be 1..64 characters [A-Za-z0-9_.:-]",
                            &o->channels_buf, o->channels, &o->n_channels);
            if (rc)
                return rc;
            o->channels_set = true;
            break;
        case O_SECRET:
            o->secret_s = optarg;
            break;
        case O_SIGNATURE:
            o->signature_s = optarg;
            break;
        case O_OVERLAP:
            rc = ctl_parse_int(cmd, "--overlap-s", optarg, 0, OVERLAP_MAX_S, false, &o->overlap_s);
            if (rc)
                return rc;
            break;
        case O_REASON:
            o->reason = optarg;
            break;
        case O_SHOW_SECRETS:
            o->show_secrets = true;
            break;
        case O_JSON:
            o->json = true;
            break;
        case '?':
        case ':':
            return ctl_getopt_error(cmd, c, lopts, argv);
        default:
            if (c >= O_NUM0 && c < O_NUM0 + SL_REG_N__COUNT) {
                const struct sl_reg_ep_numdef *d = &sl_reg_ep_nums[c - O_NUM0];
                char flag[40];
                (void)snprintf(flag, sizeof(flag), "--%s", d->flag);
                rc = ctl_parse_int(cmd, flag, optarg, d->min, d->max, true, &o->num[c - O_NUM0]);
                if (rc)
                    return rc;
                o->num_set[c - O_NUM0] = true;
                break;
            }
            return ctl_usage_error(cmd, "unexpected option");
        }
    }
    int npos = argc - optind;
    if (npos < subs[s].npos)
        return ctl_usage_error(cmd, "missing endpoint id");
    if (npos > subs[s].npos)
        return ctl_usage_error(cmd, "unexpected argument #%d (this subcommand takes %s)",
                               subs[s].npos + 1,
                               subs[s].npos ? "one endpoint id" : "no positional arguments");
    if (subs[s].npos == 1)
        o->id = argv[optind];
    return check_values(s, o);
}

/* ==== Output ==== */

static const char *secret_state(const struct sl_reg_ep_secret *s)
{
    return s->expired ? "expired" : s->exp_ms == 0 ? "current" : "expiring";
}

/* Decrypted secret i of ep into out (SL_SECRET_ENC_MAX + 1 bytes); "" when it fails. */
static void open_secret_text(const struct sl_reg_ep *ep,
                             size_t i,
                             const struct sl_masterkey *mk,
                             char *out,
                             size_t outlen,
                             sl_err_t *err)
{
    size_t n = 0;
    out[0] = '\0';
    if (sl_secretbox_open(mk, ep->id, ep->secrets[i].enc, ep->secrets[i].enc_len, (uint8_t *)out,
                          outlen - 1, &n, err) != 0) {
        out[0] = '\0';
        return;
    }
    out[n] = '\0';
    sl_log_add_secret(out);
}

/*
 * The scheme of secret i of ep and, for Ed25519, its public key into pk (SL_PUBKEY_STR_MAX
 * bytes; "" otherwise). Returns 1 (Ed25519), 0 (HMAC) or -1 (the secret does not open or
 * parse; err says why).
 */
static int secret_public(
    const struct sl_reg_ep *ep, size_t i, const struct sl_masterkey *mk, char *pk, sl_err_t *err)
{
    char plain[SL_SECRET_ENC_MAX + 1];
    struct sl_secret s;
    int kind = -1;
    memset(&s, 0, sizeof(s));
    pk[0] = '\0';
    open_secret_text(ep, i, mk, plain, sizeof(plain), err);
    if (plain[0] && sl_secret_parse(&s, plain, err) == 0) {
        kind = s.kind == SL_SECRET_ED25519;
        if (kind == 1 && sl_secret_public(&s, pk, SL_PUBKEY_STR_MAX, err) != 0)
            kind = -1;
    }
    sl_secret_fini(&s);
    sl_secret_wipe(plain, sizeof(plain));
    return kind;
}

struct show_opts {
    bool show_secrets;             /* header values and secrets in clear */
    const struct sl_masterkey *mk; /* opens secrets for show_secrets and for the public keys
                                      of Ed25519 secrets; NULL = not available */
    const char *no_mk;             /* with mk NULL: why public keys cannot be shown (printed),
                                      or NULL to say nothing about them */
    const char *new_secret;        /* the secret just created (add), or NULL */
    const char *new_public;        /* its public key when it is Ed25519, or NULL */
    const struct sl_endpoint_defaults *defs; /* for effective values */
};

static json_t *strs_json(char *const *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

/* v joined with sep into a new string (caller frees); dflt when empty. */
static char *strs_join(char *const *v, size_t n, const char *sep, const char *dflt)
{
    if (n == 0)
        return sl_xstrdup(dflt);
    size_t total = 1;
    for (size_t i = 0; i < n; i++)
        total += strlen(v[i]) + strlen(sep);
    char *out = sl_xmalloc(total), *p = out;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(v[i]), sl = i + 1 < n ? strlen(sep) : 0;
        memcpy(p, v[i], l);
        memcpy(p + l, sep, sl);
        p += l + sl;
    }
    *p = '\0';
    return out;
}

/* One secret of `endpoints show --json`: state, times, scheme and public key (with the master
 * key), the plaintext with --show-secrets. */
static json_t *secret_json(const struct sl_reg_ep *ep, const struct show_opts *so, size_t i)
{
    const struct sl_reg_ep_secret *s = &ep->secrets[i];
    char t[32];
    json_t *j = json_object();
    json_object_set_new(j, "seq", json_integer(s->seq));
    json_object_set_new(j, "state", json_string(secret_state(s)));
    ctl_fmt_time(s->created_ms, t, sizeof(t));
    json_object_set_new(j, "created", json_string(t));
    json_object_set_new(j, "expires_ms", s->exp_ms ? json_integer(s->exp_ms) : json_null());
    if (so->mk) {
        char pk[SL_PUBKEY_STR_MAX];
        sl_err_t err;
        int kind = secret_public(ep, i, so->mk, pk, &err);
        json_object_set_new(j, "signature",
                            kind < 0 ? json_null() : json_string(kind ? "ed25519" : "hmac"));
        json_object_set_new(j, "public_key", kind == 1 ? json_string(pk) : json_null());
        if (kind < 0 && !so->show_secrets)
            json_object_set_new(j, "error", json_string(err.msg));
    } else if (so->no_mk) {
        json_object_set_new(j, "signature", json_null()); /* unknown without master_key */
        json_object_set_new(j, "public_key", json_null());
    }
    if (s->expired) /* its scheme and public key as the others'; its text no longer */
        return j;
    if (so->show_secrets) {
        char plain[SL_SECRET_ENC_MAX + 1];
        sl_err_t err;
        open_secret_text(ep, i, so->mk, plain, sizeof(plain), &err);
        json_object_set_new(j, "secret", plain[0] ? json_string(plain) : json_null());
        if (!plain[0])
            json_object_set_new(j, "error", json_string(err.msg));
        sl_secret_wipe(plain, sizeof(plain));
    }
    return j;
}

static json_t *headers_json(const struct sl_reg_ep *ep, bool values)
{
    json_t *hs = json_array();
    for (size_t i = 0; i < ep->n_hdr; i++) {
        json_t *h = json_object();
        json_object_set_new(h, "name", json_string(ep->hdr[i].name));
        if (values)
            json_object_set_new(h, "value", json_string(ep->hdr[i].value));
        json_array_append_new(hs, h);
    }
    return hs;
}

static json_t *ep_json(const struct sl_reg_ep *ep, const struct show_opts *so)
{
    char t[32];
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(ep->id));
    json_object_set_new(o, "name", json_string(ep->name));
    json_object_set_new(o, "url", json_string(ep->url));
    json_object_set_new(o, "template", json_boolean(ep->tpl));
    json_object_set_new(o, "method", json_string(sl_http_method_name(ep->method)));
    json_object_set_new(o, "content_type", ep->ct[0] ? json_string(ep->ct) : json_null());
    json_object_set_new(o, "headers", headers_json(ep, so->show_secrets));
    json_object_set_new(o, "types", strs_json(ep->types, ep->n_types));
    json_object_set_new(o, "channels", strs_json(ep->channels, ep->n_channels));
    json_object_set_new(o, "enabled", json_boolean(ep->enabled));
    json_object_set_new(o, "disabled_reason", json_string(ep->reason));
    json_t *eff = json_object();
    int64_t ev[SL_REG_N__COUNT];
    sl_reg_ep_effective(ep, so->defs, ev);
    for (int i = 0; i < SL_REG_N__COUNT; i++) {
        json_object_set_new(o, sl_reg_ep_nums[i].column, json_integer(ep->num[i]));
        json_object_set_new(eff, sl_reg_ep_nums[i].column, json_integer(ev[i]));
    }
    json_object_set_new(o, "effective", eff);
    json_t *ss = json_array();
    for (size_t i = 0; i < ep->n_secrets; i++)
        json_array_append_new(ss, secret_json(ep, so, i));
    json_object_set_new(o, "secrets", ss);
    if (so->new_secret)
        json_object_set_new(o, "secret", json_string(so->new_secret));
    if (so->new_public)
        json_object_set_new(o, "public_key", json_string(so->new_public));
    ctl_fmt_time(ep->created_ms, t, sizeof(t));
    json_object_set_new(o, "created", json_string(t));
    ctl_fmt_time(ep->updated_ms, t, sizeof(t));
    json_object_set_new(o, "updated", json_string(t));
    json_object_set_new(o, "updated_ms", json_integer(ep->updated_ms));
    return o;
}

/* Print j (consumed) to stdout, then a newline. */
static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(j);
}

#define ROW(label, ...)                                                                            \
    do {                                                                                           \
        printf("%-22s", label);                                                                    \
        printf(__VA_ARGS__);                                                                       \
        putchar('\n');                                                                             \
    } while (0)

/* `endpoints show` in text: what the endpoint is and where it sends. */
static void print_ep_target(const struct sl_reg_ep *ep, const struct show_opts *so)
{
    ROW("id", "%s", ep->id);
    ROW("name", "%s", ep->name[0] ? ep->name : "-");
    ROW("url", "%s", ep->url);
    ROW("template", "%s", ep->tpl ? "yes" : "no");
    ROW("method", "%s", sl_http_method_name(ep->method));
    ROW("content-type", "%s", ep->ct[0] ? ep->ct : "(each delivery's own)");
    if (ep->n_hdr == 0)
        ROW("headers", "-");
    for (size_t i = 0; i < ep->n_hdr; i++)
        ROW(i == 0 ? "headers" : "", "%s: %s", ep->hdr[i].name,
            so->show_secrets ? ep->hdr[i].value : "[hidden: --show-secrets]");
    char *types = strs_join(ep->types, ep->n_types, ", ", "- (every type)");
    char *chans = strs_join(ep->channels, ep->n_channels, ", ", "- (no channel restriction)");
    ROW("types", "%s", types);
    ROW("channels", "%s", chans);
    free(types);
    free(chans);
    ROW("enabled", "%s", ep->enabled ? "yes" : "no");
    if (!ep->enabled)
        ROW("disabled reason", "%s", ep->reason);
}

/* One policy number: its own value, or the default it falls back to and why. */
static void
print_ep_policy_row(const struct sl_reg_ep *ep, const struct show_opts *so, int i, int64_t eff)
{
    const char *flag = sl_reg_ep_nums[i].flag;
    if ((i == SL_REG_N_RATE || i == SL_REG_N_BURST) && eff == 0)
        ROW(flag, "0 (unlimited)");
    else if (ep->num[i] == 0 && i == SL_REG_N_BURST)
        ROW(flag, "%" PRId64 " (same as rate)", eff);
    else if (ep->num[i] == 0 && i == SL_REG_N_CONN_TIMEOUT && eff < so->defs->conn_timeout_ms)
        ROW(flag, "%" PRId64 " (default, limited to timeout-ms)", eff);
    else if (ep->num[i] == 0 && i == SL_REG_N_RETRY_CAP && eff > so->defs->retry_cap_ms)
        ROW(flag, "%" PRId64 " (default, raised to retry-base-ms)", eff);
    else if (ep->num[i] == 0)
        ROW(flag, "%" PRId64 " (default)", eff);
    else if (eff != ep->num[i])
        ROW(flag, "%" PRId64 " (effective %" PRId64 ")", ep->num[i], eff);
    else
        ROW(flag, "%" PRId64, ep->num[i]);
}

/* One secret: state, creation, the plaintext with --show-secrets, an Ed25519 public key. */
static void print_ep_secret(const struct sl_reg_ep *ep, const struct show_opts *so, size_t i)
{
    const struct sl_reg_ep_secret *s = &ep->secrets[i];
    char t1[32], t2[32], state[64];
    ctl_fmt_time(s->created_ms, t1, sizeof(t1));
    ctl_fmt_time(s->exp_ms, t2, sizeof(t2));
    if (s->exp_ms == 0)
        (void)snprintf(state, sizeof(state), "current");
    else
        (void)snprintf(state, sizeof(state), "%s %s", s->expired ? "expired" : "expires", t2);
    bool show = so->show_secrets && !s->expired;
    char plain[SL_SECRET_ENC_MAX + 1] = "";
    sl_err_t err = {0, ""};
    if (show)
        open_secret_text(ep, i, so->mk, plain, sizeof(plain), &err);
    ROW(i == 0 ? "secrets" : "", "#%d %-32s created %s%s%s", s->seq, state, t1, show ? "  " : "",
        show ? (plain[0] ? plain : err.msg) : "");
    sl_secret_wipe(plain, sizeof(plain));
    if (!so->mk || s->expired)
        return;
    char pk[SL_PUBKEY_STR_MAX];
    int kind = secret_public(ep, i, so->mk, pk, &err);
    if (kind == 1)
        ROW("", "  public key: %s", pk);
    else if (kind < 0 && !so->show_secrets) /* --show-secrets printed err already */
        ROW("", "  public key: (cannot open the secret: %s)", err.msg);
}

/* After create or rotate: the new secret (and public key), shown this once. */
static void print_ep_new_secret(const struct sl_reg_ep *ep, const struct show_opts *so)
{
    if (so->new_secret && so->new_public) {
        ROW("signing secret", "%s", so->new_secret);
        ROW("public key", "%s", so->new_public);
        printf(
            "\nThe signing secret is an Ed25519 private key, shown only this once; Sluice keeps\n"
            "it sealed, so nobody needs to store it. Give the receiver the public key: it\n"
            "verifies the v1a signatures (`%s endpoints show %s` prints it again).\n"
            "(`%s endpoints rotate-secret %s` replaces the key pair.)\n",
            CTL_PROG, ep->id, CTL_PROG, ep->id);
    } else if (so->new_secret) {
        ROW("signing secret", "%s", so->new_secret);
        printf("\nThe signing secret is shown only this once: give it to the receiver now.\n"
               "(`%s endpoints rotate-secret %s` replaces it.)\n",
               CTL_PROG, ep->id);
    }
}

static void print_ep_text(const struct sl_reg_ep *ep, const struct show_opts *so)
{
    char t1[32], t2[32];
    print_ep_target(ep, so);
    int64_t ev[SL_REG_N__COUNT];
    sl_reg_ep_effective(ep, so->defs, ev);
    for (int i = 0; i < SL_REG_N__COUNT; i++)
        print_ep_policy_row(ep, so, i, ev[i]);
    for (size_t i = 0; i < ep->n_secrets; i++)
        print_ep_secret(ep, so, i);
    if (!so->mk && so->no_mk)
        ROW("public key", "%s", so->no_mk);
    ctl_fmt_time(ep->created_ms, t1, sizeof(t1));
    ctl_fmt_time(ep->updated_ms, t2, sizeof(t2));
    ROW("created", "%s", t1);
    ROW("updated", "%s", t2);
    print_ep_new_secret(ep, so);
}

/* ==== Shared steps ==== */

struct run {
    enum sub s;                       /* subcommand */
    const char *cmd;                  /* "endpoints add" */
    const struct sl_config *cfg;      /* loaded configuration */
    struct sl_endpoint_defaults defs; /* for effective values */
    PGconn *pg;                       /* registry connection */
    struct sl_reg_pub pub;            /* producer (rk NULL until the first publish opens it) */
    struct sl_masterkey mk;           /* when needed */
    bool have_mk;                     /* mk parsed */
};

static void run_fini(struct run *r)
{
    sl_reg_db_rollback(r->pg);
    if (r->pg)
        PQfinish(r->pg); /* also releases the advisory locks */
    sl_reg_pub_close(&r->pub);
    sl_masterkey_fini(&r->mk);
}

/* Parse the master key from the configuration; exits CTL_EXIT_CONFIG when unusable. */
static int need_master_key(struct run *r, const char *why)
{
    sl_err_t err;
    if (sl_masterkey_parse(&r->mk, r->cfg->master_key, &err) != 0) {
        (void)fprintf(stderr, "%s %s: master_key (SLUICE_MASTER_KEY) is needed %s: %s\n", CTL_PROG,
                      r->cmd, why, err.msg);
        return CTL_EXIT_CONFIG;
    }
    r->have_mk = true;
    return 0;
}

static int open_db(struct run *r)
{
    sl_err_t err;
    r->pg = sl_reg_db_open(r->cfg, &err);
    if (!r->pg)
        return ctl_fail(r->cmd, "%s", err.msg);
    return 0;
}

/*
 * Report a change operation that did not fully succeed; returns the exit code. Committed but
 * not published (the registry's message says so): add how to repair. Otherwise nothing
 * changed: prefix ("nothing changed: " or "") and the reason.
 */
static int
op_fail(struct run *r, const struct sl_reg_result *res, const char *prefix, const sl_err_t *err)
{
    if (res->committed)
        return ctl_fail(r->cmd, "%s; run '%s endpoints sync' once Kafka is reachable", err->msg,
                        CTL_PROG);
    int rc = ctl_fail(r->cmd, "%s%s", prefix, err->msg);
    /* a value the registry refused (a field's rule, an address the SSRF rules refuse): a
     * validation failure, as those found before the registry is opened (ctl/README.md) */
    if (err->code == SL_EINVAL || err->code == SL_ETOOBIG || err->code == SL_EMISSING)
        rc = CTL_EXIT_USAGE;
    return rc;
}

/* ==== Subcommands ==== */

static void ep_from_opts(struct sl_reg_ep *ep, const struct opts *o)
{
    if (o->url) {
        free(ep->url);
        ep->url = sl_xstrdup(o->url);
    }
    if (o->name) {
        free(ep->name);
        ep->name = sl_xstrdup(o->name);
    }
    if (o->tpl >= 0)
        ep->tpl = o->tpl == 1;
    if (o->method_s)
        ep->method = o->method;
    if (o->ct) {
        free(ep->ct);
        ep->ct = sl_xstrdup(o->ct);
    }
    if (o->n_hdr > 0 || o->clear_headers)
        sl_reg_ep_set_headers(ep, o->hdr, o->n_hdr);
    if (o->types_set)
        sl_reg_ep_set_types(ep, o->types, o->n_types);
    if (o->channels_set)
        sl_reg_ep_set_channels(ep, o->channels, o->n_channels);
    for (int i = 0; i < SL_REG_N__COUNT; i++) {
        if (o->num_set[i])
            ep->num[i] = o->num[i];
    }
}

/* Cross-field rules on the final settings; usage error naming the flags. (sl_reg_ep_check
 * applies the same rules naming the fields; this wording is the command line's.) */
static int check_merged(struct run *r, const struct sl_reg_ep *ep, const struct opts *o)
{
    sl_err_t err;
    if ((o->url || o->tpl >= 0) && sl_endpoint_url_check(ep->url, ep->tpl, &err) != 0) {
        if (o->url)
            return ctl_usage_error(r->cmd, "invalid value for --url: %s", err.msg);
        return ctl_usage_error(r->cmd, "the endpoint's URL does not fit --%s: %s",
                               ep->tpl ? "template" : "no-template", err.msg);
    }
    const int64_t *v = ep->num;
    if (v[SL_REG_N_TIMEOUT] && v[SL_REG_N_CONN_TIMEOUT] &&
        v[SL_REG_N_CONN_TIMEOUT] > v[SL_REG_N_TIMEOUT])
        return ctl_usage_error(r->cmd,
                               "--connect-timeout-ms (%" PRId64 ") must not exceed "
                               "--timeout-ms (%" PRId64 ")",
                               v[SL_REG_N_CONN_TIMEOUT], v[SL_REG_N_TIMEOUT]);
    if (v[SL_REG_N_RETRY_BASE] && v[SL_REG_N_RETRY_CAP] &&
        v[SL_REG_N_RETRY_CAP] < v[SL_REG_N_RETRY_BASE])
        return ctl_usage_error(r->cmd,
                               "--retry-cap-ms (%" PRId64 ") must not be less than "
                               "--retry-base-ms (%" PRId64 ")",
                               v[SL_REG_N_RETRY_CAP], v[SL_REG_N_RETRY_BASE]);
    return 0;
}

/*
 * The secret add / rotate-secret seal: --secret as given, else a new one of the --signature
 * scheme into *gen. pk (SL_PUBKEY_STR_MAX bytes) receives its public key when it is Ed25519
 * ("" otherwise). Returns 0 or the exit code after printing why.
 */
static int new_secret(struct run *r, const struct opts *o, struct sl_secret *gen, char *pk)
{
    sl_err_t err;
    int rc = 0;
    pk[0] = '\0';
    if (!o->have_secret)
        rc = o->signature == SL_SECRET_ED25519 ? sl_secret_generate_ed25519(gen, &err)
                                               : sl_secret_generate(gen, &err);
    const struct sl_secret *s = o->have_secret ? &o->secret : gen;
    if (rc == 0 && s->kind == SL_SECRET_ED25519)
        rc = sl_secret_public(s, pk, SL_PUBKEY_STR_MAX, &err);
    if (rc != 0)
        return ctl_fail(r->cmd, "%s", err.msg);
    return 0;
}

static int cmd_add(struct run *r, struct opts *o)
{
    int rc;
    sl_err_t err;
    struct sl_reg_ep ep;
    struct sl_reg_result res;
    struct sl_secret secret;
    char whsec[SL_SECRET_STR_MAX] = "";
    char pk[SL_PUBKEY_STR_MAX] = "";
    memset(&secret, 0, sizeof(secret));
    sl_reg_ep_init(&ep, o->id);
    ep_from_opts(&ep, o);
    rc = check_merged(r, &ep, o);
    if (rc)
        goto out;
    rc = need_master_key(r, "to encrypt the signing secret");
    if (rc)
        goto out;
    rc = new_secret(r, o, &secret, pk);
    if (rc)
        goto out;
    rc = open_db(r);
    if (rc)
        goto out;
    if (sl_reg_create(r->pg, &r->pub, &r->mk, &ep, o->have_secret ? &o->secret : &secret, whsec,
                      &res, &err) != 0) {
        rc = op_fail(r, &res, "nothing changed: ", &err);
        if (!res.committed)
            goto out;
    }
    /* Print even when publishing failed: the endpoint exists and its secret is shown once. */
    struct show_opts so = {false, &r->mk, NULL, whsec, pk[0] ? pk : NULL, &r->defs};
    if (o->json) {
        json_t *j = ep_json(&ep, &so);
        json_object_set_new(j, "published", json_boolean(res.published));
        print_json(j);
    } else {
        print_ep_text(&ep, &so);
    }
out:
    sl_secret_wipe(whsec, sizeof(whsec));
    sl_secret_fini(&secret);
    sl_reg_ep_fini(&ep);
    return rc;
}

/* update, disable, enable: the flags applied to the row sl_reg_update read FOR UPDATE. */
struct upd {
    struct run *r;        /* borrowed */
    const struct opts *o; /* borrowed */
    bool called;          /* upd_modify ran: later failures are the write's */
    int usage;            /* exit code of the usage error upd_modify printed, or 0 */
};

static int upd_modify(void *opaque, struct sl_reg_ep *ep, sl_err_t *err)
{
    struct upd *u = opaque;
    struct run *r = u->r;
    u->called = true;
    ep_from_opts(ep, u->o);
    if (r->s == S_DISABLE) {
        ep->enabled = false;
        free(ep->reason);
        ep->reason = sl_xstrdup(u->o->reason);
    } else if (r->s == S_ENABLE) {
        ep->enabled = true;
        free(ep->reason);
        ep->reason = sl_xstrdup("");
    }
    u->usage = check_merged(r, ep, u->o);
    if (u->usage == 0) {
        /* the codec's verdict in this command's words (sl_reg_update would refuse too) */
        struct sl_buf b;
        sl_err_t e2;
        sl_buf_init(&b, SL_ENDPOINT_RECORD_MAX);
        if (sl_reg_ep_encode(ep, &r->mk, &b, &e2) != 0)
            u->usage = ctl_usage_error(r->cmd, "invalid endpoint: %s", e2.msg);
        sl_buf_fini(&b);
    }
    if (u->usage)
        return sl_err_set(err, SL_EINVAL, "refused by %s %s", CTL_PROG, r->cmd);
    return 0;
}

/* An update that changed nothing: the committed state is published again (byte-identical
 * for consumers that have it, so no new version), which repairs a change whose publish
 * failed, as sluice-api does. Returns the exit status. */
static int
unchanged(struct run *r, const struct opts *o, struct sl_reg_ep *ep, struct show_opts *so)
{
    sl_err_t perr;
    bool published = sl_reg_republish(r->pg, &r->pub, ep->id, &perr) == 0;
    if (o->json) {
        json_t *j = ep_json(ep, so);
        json_object_set_new(j, "changed", json_false());
        json_object_set_new(j, "published", json_boolean(published));
        print_json(j);
    } else {
        printf("endpoint %s unchanged%s\n", ep->id, published ? "" : " (not published)");
    }
    if (published)
        return CTL_EXIT_OK;
    return ctl_fail(r->cmd,
                    "endpoint %s is unchanged but publishing its record again failed: %s; run "
                    "'sluicectl endpoints sync'",
                    ep->id, perr.msg);
}

static int cmd_update(struct run *r, struct opts *o)
{
    int rc;
    sl_err_t err;
    struct sl_reg_ep ep;
    struct sl_reg_result res;
    struct upd u = {r, o, false, 0};
    memset(&ep, 0, sizeof(ep));
    rc = need_master_key(r, "to sign the endpoint record");
    if (rc)
        return rc;
    rc = open_db(r);
    if (rc)
        goto out;
    if (sl_reg_update(r->pg, &r->pub, o->id, upd_modify, &u, &ep, &res, &err) != 0) {
        if (u.usage)
            rc = u.usage; /* already printed */
        else if (!u.called)
            rc = ctl_fail(r->cmd, "%s", err.msg); /* locking or reading the row */
        else
            rc = op_fail(r, &res, "nothing changed: ", &err);
        if (!res.committed)
            goto out;
    }
    struct show_opts so = {false, &r->mk, NULL, NULL, NULL, &r->defs};
    if (!res.changed) {
        rc = unchanged(r, o, &ep, &so);
        goto out;
    }
    if (o->json) {
        json_t *j = ep_json(&ep, &so);
        json_object_set_new(j, "changed", json_true());
        json_object_set_new(j, "published", json_boolean(res.published));
        print_json(j);
    } else if (rc == CTL_EXIT_OK) {
        printf("endpoint %s %s\n\n", ep.id,
               r->s == S_DISABLE  ? "disabled"
               : r->s == S_ENABLE ? "enabled"
                                  : "updated");
        print_ep_text(&ep, &so);
    }
out:
    sl_reg_ep_fini(&ep);
    return rc;
}

/*
 * No --signature: the new secret keeps the current one's scheme (an Ed25519 endpoint's
 * receivers hold only its public key), which is never guessed: when the master key in use
 * cannot open the current secret, this fails (CTL_EXIT_FAIL, message printed).
 */
static int keep_scheme(struct run *r, struct opts *o)
{
    struct sl_reg_ep cur;
    char cur_pk[SL_PUBKEY_STR_MAX];
    sl_err_t err;
    memset(&cur, 0, sizeof(cur));
    sl_err_clear(&err);
    int scheme = 0; /* unknown endpoint or no secret: HMAC (the rotation reports the rest) */
    if (sl_reg_db_load(r->pg, o->id, false, &cur, &err) == 0 && cur.n_secrets > 0)
        scheme = secret_public(&cur, 0, &r->mk, cur_pk, &err);
    sl_reg_ep_fini(&cur);
    if (scheme < 0) {
        (void)fprintf(stderr,
                      "%s endpoints rotate-secret: cannot tell the scheme of %s's current secret "
                      "(%s); nothing changed: give --signature hmac|ed25519\n",
                      CTL_PROG, o->id, err.msg[0] ? err.msg : "it cannot be opened");
        return CTL_EXIT_FAIL;
    }
    if (scheme == 1)
        o->signature = SL_SECRET_ED25519;
    return 0;
}

static int cmd_rotate(struct run *r, struct opts *o)
{
    int rc;
    sl_err_t err;
    struct sl_reg_ep ep;
    struct sl_reg_result res;
    struct sl_secret secret;
    char whsec[SL_SECRET_STR_MAX] = "";
    char pk[SL_PUBKEY_STR_MAX] = "";
    memset(&ep, 0, sizeof(ep));
    memset(&secret, 0, sizeof(secret));
    rc = need_master_key(r, "to encrypt the new signing secret");
    if (rc)
        goto out;
    rc = open_db(r);
    if (rc)
        goto out;
    if (!o->signature_s && !o->have_secret) {
        rc = keep_scheme(r, o);
        if (rc)
            goto out;
    }
    rc = new_secret(r, o, &secret, pk);
    if (rc)
        goto out;
    if (sl_reg_rotate(r->pg, &r->pub, &r->mk, o->id, o->overlap_s,
                      o->have_secret ? &o->secret : &secret, whsec, &ep, &res, &err) != 0) {
        rc = op_fail(r, &res, "nothing changed: ", &err);
        if (!res.committed)
            goto out;
    }
    /* the previous current secret is the newest one that now has an expiry */
    int64_t prev_exp = 0;
    int prev_seq = 0;
    for (size_t i = 0; i < ep.n_secrets; i++) {
        if (ep.secrets[i].exp_ms != 0 && ep.secrets[i].seq > prev_seq) {
            prev_seq = ep.secrets[i].seq;
            prev_exp = ep.secrets[i].exp_ms;
        }
    }
    char t[32];
    ctl_fmt_time(prev_exp, t, sizeof(t));
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "id", json_string(ep.id));
        json_object_set_new(j, "secret", json_string(whsec));
        if (pk[0])
            json_object_set_new(j, "public_key", json_string(pk));
        json_object_set_new(j, "seq", json_integer(ep.n_secrets ? ep.secrets[0].seq : 0));
        json_object_set_new(j, "previous_seq", json_integer(prev_seq));
        json_object_set_new(j, "previous_expires_ms", json_integer(prev_exp));
        json_object_set_new(j, "active_secrets",
                            json_integer((json_int_t)sl_reg_ep_active_secrets(&ep)));
        json_object_set_new(j, "published", json_boolean(res.published));
        print_json(j);
    } else {
        printf("endpoint %s: new signing secret #%d is current\n", ep.id,
               ep.n_secrets ? ep.secrets[0].seq : 0);
        printf("%-22s%s\n", "signing secret", whsec);
        if (pk[0])
            printf("%-22s%s\n", "public key", pk);
        if (prev_seq)
            printf("%-22s#%d keeps signing until %s\n", "previous secret", prev_seq, t);
        if (pk[0])
            printf("\nThe new secret is an Ed25519 private key, shown only this once; Sluice keeps "
                   "it\nsealed. Give the receiver the public key (`%s endpoints show %s` prints "
                   "it\nagain).\n",
                   CTL_PROG, ep.id);
        else
            printf("\nThe new secret is shown only this once: give it to the receiver now.\n");
    }
out:
    sl_secret_wipe(whsec, sizeof(whsec));
    sl_secret_fini(&secret);
    sl_reg_ep_fini(&ep);
    return rc;
}

static int cmd_delete(struct run *r, struct opts *o)
{
    sl_err_t err;
    struct sl_reg_result res;
    int rc = open_db(r);
    if (rc)
        return rc;
    if (sl_reg_remove(r->pg, &r->pub, o->id, &res, &err) != 0) {
        rc = op_fail(r, &res, "", &err);
        if (!res.committed)
            return rc;
    }
    if (o->json) {
        json_t *j =
            json_pack("{s:s, s:b, s:b}", "id", o->id, "deleted", 1, "published", res.published);
        print_json(j);
    } else if (rc == CTL_EXIT_OK) {
        printf("endpoint %s deleted\n", o->id);
    }
    return rc;
}

static int cmd_show(struct run *r, struct opts *o)
{
    sl_err_t err;
    struct sl_reg_ep ep;
    memset(&ep, 0, sizeof(ep));
    int rc = 0;
    const char *no_mk = NULL;
    if (o->show_secrets) {
        rc = need_master_key(r, "to decrypt secrets (--show-secrets)");
        if (rc)
            return rc;
    } else if (!r->cfg->master_key[0]) {
        no_mk = "(needs master_key)"; /* the key pair is sealed with it */
    } else if (sl_masterkey_parse(&r->mk, r->cfg->master_key, &err) == 0) {
        r->have_mk = true;
    } else {
        no_mk = "(needs a valid master_key)"; /* --show-secrets would say why */
    }
    rc = open_db(r);
    if (rc)
        return rc;
    if (sl_reg_db_load(r->pg, o->id, false, &ep, &err) != 0) {
        rc = ctl_fail(r->cmd, "%s", err.msg);
        goto out;
    }
    struct show_opts so = {o->show_secrets, r->have_mk ? &r->mk : NULL, no_mk, NULL, NULL,
                           &r->defs};
    if (o->json)
        print_json(ep_json(&ep, &so));
    else
        print_ep_text(&ep, &so);
out:
    sl_reg_ep_fini(&ep);
    return rc;
}

/* `endpoints list --json`: one object per endpoint, URLs redacted (red). */
static void list_json(const struct sl_reg_ep *eps, size_t n, char **red)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        char t[32];
        ctl_fmt_time(eps[i].updated_ms, t, sizeof(t));
        json_t *row = json_pack("{s:s, s:s, s:s, s:b, s:s, s:o, s:o, s:b, s:s, s:I, s:s}", "id",
                                eps[i].id, "name", eps[i].name, "url", red[i], "template",
                                eps[i].tpl, "method", sl_http_method_name(eps[i].method), "types",
                                strs_json(eps[i].types, eps[i].n_types), "channels",
                                strs_json(eps[i].channels, eps[i].n_channels), "enabled",
                                eps[i].enabled, "disabled_reason", eps[i].reason, "active_secrets",
                                (json_int_t)sl_reg_ep_active_secrets(&eps[i]), "updated", t);
        json_array_append_new(arr, row);
    }
    print_json(arr);
}

/* `endpoints list`: a table sized to the ids and names (names cut at 32), URLs redacted. */
static void list_text(const struct sl_reg_ep *eps, size_t n, char **red)
{
    int wid = 2, wname = 4;
    for (size_t i = 0; i < n; i++) {
        int a = (int)strlen(eps[i].id), b = (int)strlen(eps[i].name);
        wid = a > wid ? a : wid;
        wname = b > wname ? b : wname;
    }
    if (wname > 32)
        wname = 32;
    printf("%-*s  %-*s  %-6s  %-8s  %-7s  %-20s  %-5s  %-8s  %s\n", wid, "ID", wname, "NAME",
           "METHOD", "ENABLED", "SECRETS", "UPDATED", "TYPES", "CHANNELS", "URL");
    for (size_t i = 0; i < n; i++) {
        char t[32], nt[8], nc[8];
        ctl_fmt_time(eps[i].updated_ms, t, sizeof(t));
        /* counts here (lists can be long); `show` prints them */
        (void)snprintf(nt, sizeof(nt), "%zu", eps[i].n_types);
        (void)snprintf(nc, sizeof(nc), "%zu", eps[i].n_channels);
        printf("%-*s  %-*.*s  %-6s  %-8s  %-7zu  %-20s  %-5s  %-8s  %s%s\n", wid, eps[i].id, wname,
               wname, eps[i].name[0] ? eps[i].name : "-", sl_http_method_name(eps[i].method),
               eps[i].enabled ? "yes" : "no", sl_reg_ep_active_secrets(&eps[i]), t,
               eps[i].n_types ? nt : "all", eps[i].n_channels ? nc : "-", red[i],
               eps[i].tpl ? " (template)" : "");
    }
    printf("%zu endpoint%s\n", n, n == 1 ? "" : "s");
}

static int cmd_list(struct run *r, struct opts *o)
{
    sl_err_t err;
    struct sl_reg_ep *eps = NULL;
    size_t n = 0;
    int rc = open_db(r);
    if (rc)
        return rc;
    if (sl_reg_db_list(r->pg, &eps, &n, &err) != 0)
        return ctl_fail(r->cmd, "%s", err.msg);
    char **red = sl_xcalloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        char buf[SL_URL_MAX + 1];
        (void)sl_url_redact(eps[i].url, buf, sizeof(buf)); /* placeholder or prefix on error */
        red[i] = sl_xstrdup(buf);
    }
    if (o->json)
        list_json(eps, n, red);
    else
        list_text(eps, n, red);
    for (size_t i = 0; i < n; i++) {
        free(red[i]);
        sl_reg_ep_fini(&eps[i]);
    }
    free(red);
    free(eps);
    return CTL_EXIT_OK;
}

/* sync: the live keys of the topic, from a scan to its end. */
static int
collect_live_key(void *opaque, const char *key, size_t keylen, const void *val, size_t vallen)
{
    sl_map_t *live = opaque;
    char id[SL_ENDPOINT_ID_MAX + 1];
    if (!sl_valid_endpoint_id(key, keylen))
        return 0; /* consumers ignore such records; nothing we could address by id */
    memcpy(id, key, keylen);
    id[keylen] = '\0';
    void *old = NULL;
    if (val) {
        /* its update time, which consumers compare (0 when it does not decode) */
        int64_t *ms = sl_xcalloc(1, sizeof(*ms));
        struct sl_endpoint_rec rec;
        sl_err_t err;
        if (sl_endpoint_rec_decode(val, vallen, NULL, &rec, &err) == 0) {
            *ms = (int64_t)rec.updated_ms;
            sl_endpoint_rec_fini(&rec);
        }
        sl_map_put(live, id, ms, &old);
    } else {
        sl_map_del(live, id, &old);
    }
    free(old);
    return 0;
}

/* Consumers refuse a record older than the one in force: where the topic holds a record of an
 * endpoint newer than its registry row (a restored database), move the row's update time past
 * it first, so the record republished from it is taken. The registry lock is held. Counts the
 * rows moved into *advanced. */
static int
advance_past_topic(struct run *r, struct sl_reg_ep *eps, size_t n, sl_map_t *live, size_t *advanced)
{
    for (size_t i = 0; i < n; i++) {
        const int64_t *topic_ms = sl_map_get(live, eps[i].id);
        if (!topic_ms || *topic_ms <= eps[i].updated_ms)
            continue;
        char ms[24];
        (void)snprintf(ms, sizeof(ms), "%" PRId64, *topic_ms);
        const char *p[2] = {eps[i].id, ms};
        sl_err_t err;
        PGresult *res = sl_pg_exec(
            r->pg, "move an endpoint's update time past the topic's",
            "update endpoints set updated_at = greatest(now(), to_timestamp(($2::bigint + 1) / "
            "1000.0)) where id = $1 returning floor(extract(epoch from updated_at) * 1000)::bigint",
            2, p, &err);
        if (!res || PQntuples(res) != 1) {
            PQclear(res);
            return ctl_fail(r->cmd, "nothing published: endpoint %s: %s", eps[i].id,
                            res ? "row gone" : err.msg);
        }
        eps[i].updated_ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        (*advanced)++;
    }
    return 0;
}

/* sync, and reseal (reseal: the secrets are re-sealed in the same locked transaction). */
/* Publish every endpoint's signed record, then a tombstone for each id the topic has that
 * the registry does not (live: the topic's ids). Counts the tombstones. Returns 0 or the
 * failure's exit code (reported). */
static int sync_publish(
    struct run *r, const struct sl_reg_ep *eps, size_t n, sl_map_t *live, size_t *tombstones)
{
    sl_err_t err;
    struct sl_buf rec;
    int rc = 0;
    sl_buf_init(&rec, SL_ENDPOINT_RECORD_MAX);
    for (size_t i = 0; i < n && rc == 0; i++) {
        sl_buf_reset(&rec);
        void *topic_ms = NULL;
        sl_map_del(live, eps[i].id, &topic_ms);
        free(topic_ms);
        if (sl_reg_ep_encode(&eps[i], &r->mk, &rec, &err) != 0 ||
            sl_reg_pub_send(&r->pub, eps[i].id, rec.data, rec.len, &err) != 0)
            rc = ctl_fail(r->cmd, "endpoint %s: %s", eps[i].id, err.msg);
    }
    sl_buf_fini(&rec);
    size_t pos = 0;
    const char *key;
    while (rc == 0 && sl_map_next(live, &pos, &key, NULL)) {
        if (sl_reg_pub_send(&r->pub, key, NULL, 0, &err) != 0)
            rc = ctl_fail(r->cmd, "tombstone for %s: %s", key, err.msg);
        else
            (*tombstones)++;
    }
    if (rc == 0 && sl_reg_pub_flush(&r->pub, FLUSH_TIMEOUT_MS, &err) != 0)
        rc = ctl_fail(r->cmd, "%s", err.msg);
    return rc;
}

static void sync_report(const struct run *r,
                        const struct opts *o,
                        bool reseal,
                        size_t n,
                        size_t tombstones,
                        size_t resealed)
{
    if (o->json) {
        json_t *j =
            json_pack("{s:s, s:I, s:I, s:s}", "topic", r->cfg->topic_endpoints, "published",
                      (json_int_t)n, "tombstones", (json_int_t)tombstones, "key_id", r->mk.k[0].id);
        if (reseal)
            json_object_set_new(j, "resealed_secrets", json_integer((json_int_t)resealed));
        print_json(j);
        return;
    }
    if (reseal)
        printf("re-sealed %zu secret%s with master key '%s'\n", resealed, resealed == 1 ? "" : "s",
               r->mk.k[0].id);
    printf("published %zu endpoint%s signed with master key '%s' and %zu tombstone%s to "
           "%s\n",
           n, n == 1 ? "" : "s", r->mk.k[0].id, tombstones, tombstones == 1 ? "" : "s",
           r->cfg->topic_endpoints);
}

static int cmd_sync(struct run *r, struct opts *o, bool reseal)
{
    sl_err_t err;
    struct sl_reg_ep *eps = NULL;
    size_t n = 0, tombstones = 0;
    sl_map_t *live = sl_map_new(0);
    size_t resealed = 0;
    int rc = need_master_key(r, "to sign the endpoint records");
    if (rc == 0)
        rc = open_db(r);
    if (rc)
        goto out;
    /* exclusive: no endpoint change can commit or publish while the topic is rebuilt */
    if (sl_reg_db_lock_registry(r->pg, &err) != 0 || sl_reg_db_list(r->pg, &eps, &n, &err) != 0) {
        rc = ctl_fail(r->cmd, "%s", err.msg);
        goto out;
    }
    /* reseal: new boxes in PostgreSQL first, in one transaction: a failed publish below leaves
     * the registry consistent, and running reseal (or sync) again republishes */
    if (reseal && (sl_reg_db_begin(r->pg, &err) != 0 ||
                   sl_reg_reseal(r->pg, &r->mk, eps, n, &resealed, &err) != 0 ||
                   sl_reg_db_commit(r->pg, &err) != 0)) {
        sl_reg_db_rollback(r->pg);
        rc = ctl_fail(r->cmd, "nothing changed: %s", err.msg);
        goto out;
    }
    if (sl_endpoints_scan(r->cfg, SCAN_TIMEOUT_MS, collect_live_key, live, &err) != 0 ||
        sl_reg_pub_open(r->cfg, &r->pub, &err) != 0) {
        rc = ctl_fail(r->cmd, "nothing published: %s", err.msg);
        goto out;
    }
    size_t advanced = 0;
    rc = advance_past_topic(r, eps, n, live, &advanced);
    if (rc == 0)
        rc = sync_publish(r, eps, n, live, &tombstones);
    if (rc == 0 && advanced > 0 && !o->json)
        printf("%zu endpoint%s had a newer record on the topic than in the registry (a restored "
               "database?): %s update time was moved past it\n",
               advanced, advanced == 1 ? "" : "s", advanced == 1 ? "its" : "their");
    if (rc == 0)
        sync_report(r, o, reseal, n, tombstones, resealed);
out:
    for (size_t i = 0; i < n; i++)
        sl_reg_ep_fini(&eps[i]);
    free(eps);
    sl_map_destroy(live, free);
    return rc;
}

/* ==== Entry point ==== */

static const char *sub_name(int s)
{
    return subs[s].name;
}

int ctl_endpoints_main(struct ctl *c, int argc, char **argv)
{
    int s;
    int rc = ctl_pick_sub("endpoints", argc, argv, sub_name, S__N, ctl_endpoints_help, &s);
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
    sl_reg_pub_init(&r.pub, r.cfg, &r.mk); /* mk: parsed by the commands that publish */
    sl_endpoint_defaults_from_cfg(r.cfg, &r.defs);
    switch (r.s) {
    case S_ADD:
        rc = cmd_add(&r, &o);
        break;
    case S_SHOW:
        rc = cmd_show(&r, &o);
        break;
    case S_LIST:
        rc = cmd_list(&r, &o);
        break;
    case S_UPDATE:
    case S_DISABLE:
    case S_ENABLE:
        rc = cmd_update(&r, &o);
        break;
    case S_ROTATE:
        rc = cmd_rotate(&r, &o);
        break;
    case S_DELETE:
        rc = cmd_delete(&r, &o);
        break;
    case S_SYNC:
    case S_RESEAL:
        rc = cmd_sync(&r, &o, r.s == S_RESEAL);
        break;
    default:
        rc = CTL_EXIT_USAGE;
        break;
    }
    run_fini(&r);
    opts_fini(&o);
    return rc;
}
