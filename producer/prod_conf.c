/*
 * prod_conf: the public library's configuration (see prod_conf.h): the option table, strict
 * per-option parsing, SLUICE_* environment loading, the Kafka security cross-checks, and the
 * sluice_config_* / sluice_strerror / sluice_producer_version entry points.
 *
 * Every value is stored into the struct sl_config field sl_cfg would fill, with the same
 * bounds and canonical spellings, so prod_lib_new and common/sl_kafka cannot tell the two
 * sources apart. A refused value leaves the option as it was.
 */
#include "producer/prod_conf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"

extern char **environ;

/* The public codes are the internal ones: errors pass through unchanged. */
#define SAME_CODE(x) ((int)SLUICE_##x == (int)SL_##x)
_Static_assert(SAME_CODE(OK) && SAME_CODE(EINVAL) && SAME_CODE(ETOOBIG) && SAME_CODE(EMISSING) &&
                   SAME_CODE(ECONFIG) && SAME_CODE(EKAFKA) && SAME_CODE(ETIMEDOUT) &&
                   SAME_CODE(ESTATE),
               "public error codes differ from sl_err's");
_Static_assert(SLUICE_ERR_MSG_MAX == SL_ERR_MSG_MAX, "public error message size differs");

#define O(field) offsetof(struct sl_config, field)

/* Names, variables, bounds and defaults are sl_cfg's (tests/unit/test_prod_conf.c). */
static const struct prod_conf_opt opts[] = {
    {"kafka_brokers", "SLUICE_KAFKA_BROKERS", PROD_CONF_STR, O(kafka_brokers), 0, 0,
     "127.0.0.1:19092", PROD_CONF_NONEMPTY},
    {"topic_deliveries", "SLUICE_TOPIC_DELIVERIES", PROD_CONF_STR, O(topic_deliveries), 0, 0,
     "sluice.deliveries", PROD_CONF_NONEMPTY},
    {"max_body_bytes", "SLUICE_MAX_BODY_BYTES", PROD_CONF_INT, O(max_body_bytes), 1, 16777216,
     "1048576", 0},
    {"instance_id", "SLUICE_INSTANCE_ID", PROD_CONF_STR, O(instance_id), 0, 0, "", 0},
    {"kafka_security_protocol", "SLUICE_KAFKA_SECURITY_PROTOCOL", PROD_CONF_STR,
     O(kafka_security_protocol), 0, 0, "PLAINTEXT", 0},
    {"kafka_sasl_mechanism", "SLUICE_KAFKA_SASL_MECHANISM", PROD_CONF_STR, O(kafka_sasl_mechanism),
     0, 0, "SCRAM-SHA-512", 0},
    {"kafka_sasl_username", "SLUICE_KAFKA_SASL_USERNAME", PROD_CONF_STR, O(kafka_sasl_username), 0,
     0, "", 0},
    {"kafka_sasl_password", "SLUICE_KAFKA_SASL_PASSWORD", PROD_CONF_STR, O(kafka_sasl_password), 0,
     0, "", PROD_CONF_SECRET},
    {"kafka_ssl_ca_file", "SLUICE_KAFKA_SSL_CA_FILE", PROD_CONF_STR, O(kafka_ssl_ca_file), 0, 0, "",
     0},
    {"kafka_ssl_cert_file", "SLUICE_KAFKA_SSL_CERT_FILE", PROD_CONF_STR, O(kafka_ssl_cert_file), 0,
     0, "", 0},
    {"kafka_ssl_key_file", "SLUICE_KAFKA_SSL_KEY_FILE", PROD_CONF_STR, O(kafka_ssl_key_file), 0, 0,
     "", 0},
    {"kafka_ssl_key_password", "SLUICE_KAFKA_SSL_KEY_PASSWORD", PROD_CONF_STR,
     O(kafka_ssl_key_password), 0, 0, "", PROD_CONF_SECRET},
    {"log_level", "SLUICE_LOG_LEVEL", PROD_CONF_STR, O(log_level), 0, 0, "info", 0},
    {"debug", "SLUICE_DEBUG", PROD_CONF_STR, O(debug), 0, 0, "", 0},
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static const char *const protocols[] = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"};
static const char *const mechanisms[] = {"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"};

const struct prod_conf_opt *prod_conf_table(size_t *n)
{
    *n = NOPTS;
    return opts;
}

static char **str_field(struct sl_config *cfg, const struct prod_conf_opt *o)
{
    return (char **)(void *)((char *)cfg + o->off);
}

static const char *str_value(const struct sl_config *cfg, const struct prod_conf_opt *o)
{
    return *(char *const *)(const void *)((const char *)cfg + o->off);
}

static int64_t *int_field(struct sl_config *cfg, const struct prod_conf_opt *o)
{
    return (int64_t *)(void *)((char *)cfg + o->off);
}

static const struct prod_conf_opt *find_name(const char *name)
{
    for (size_t i = 0; i < NOPTS; i++) {
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    }
    return NULL;
}

/* The entry of names[] that val equals ignoring case (sl_cfg's canonical spelling), or NULL. */
static const char *canonical(const char *val, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(val, names[i]) == 0)
            return names[i];
    }
    return NULL;
}

/* Why val is refused for the string option o (NULL = accepted); *canon (OUT) = the
 * spelling to store, val itself unless a canonical one exists. */
static const char *str_problem(const struct prod_conf_opt *o, const char *val, const char **canon)
{
    enum sl_log_level lv;
    unsigned mask;
    *canon = val;
    if ((o->flags & PROD_CONF_NONEMPTY) && val[0] == '\0')
        return "must not be empty";
    if (o->off == O(log_level))
        return sl_log_level_parse(val, &lv) == 0 ? NULL : "expected error, warn, info or debug";
    if (o->off == O(debug))
        return sl_log_debug_parse(val, &mask) == 0
                   ? NULL
                   : "expected a list of kafka, http, redis, db, cfg, all";
    if (o->off == O(kafka_security_protocol)) {
        *canon = canonical(val, protocols, sizeof(protocols) / sizeof(protocols[0]));
        return *canon ? NULL : "expected PLAINTEXT, SSL, SASL_SSL or SASL_PLAINTEXT";
    }
    if (o->off == O(kafka_sasl_mechanism)) {
        *canon = canonical(val, mechanisms, sizeof(mechanisms) / sizeof(mechanisms[0]));
        return *canon ? NULL : "expected SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN";
    }
    if (o->off == O(instance_id)) {
        /* it names this client in outcome records, whose contract refuses anything else */
        size_t n = strlen(val);
        bool bad = n > SL_POD_MAX;
        for (size_t i = 0; i < n && !bad; i++)
            bad = (unsigned char)val[i] < 0x21 || (unsigned char)val[i] > 0x7e;
        return bad ? "expected 1..64 visible ASCII characters (no spaces or control characters)"
                   : NULL;
    }
    return NULL;
}

/* Parse val into o's field; key names the option as the caller wrote it ("max_body_bytes",
 * "SLUICE_MAX_BODY_BYTES (env)"). */
static int set_value(struct sluice_config *c,
                     const struct prod_conf_opt *o,
                     const char *val,
                     const char *key,
                     sl_err_t *err)
{
    const char *shown = (o->flags & PROD_CONF_SECRET) ? "[redacted]" : val;
    if (o->type == PROD_CONF_INT) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno != 0 || end == val || *end != '\0' || v < o->min || v > o->max)
            return sl_err_set(err, SL_ECONFIG,
                              "invalid value for %s: \"%s\": expected an integer in %lld..%lld",
                              key, shown, (long long)o->min, (long long)o->max);
        *int_field(&c->cfg, o) = v;
        return 0;
    }
    const char *canon = val;
    const char *why = str_problem(o, val, &canon);
    if (why)
        return sl_err_set(err, SL_ECONFIG, "invalid value for %s: \"%s\": %s", key, shown, why);
    char **f = str_field(&c->cfg, o);
    char *old = *f;
    *f = sl_xstrdup(canon);
    if (old && (o->flags & PROD_CONF_SECRET))
        sl_secret_wipe(old, strlen(old));
    free(old);
    return 0;
}

void prod_conf_init(struct sluice_config *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < NOPTS; i++) {
        if (opts[i].type == PROD_CONF_INT)
            *int_field(&c->cfg, &opts[i]) = strtoll(opts[i].def, NULL, 10);
        else
            *str_field(&c->cfg, &opts[i]) = sl_xstrdup(opts[i].def);
    }
}

void prod_conf_fini(struct sluice_config *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < NOPTS; i++) {
        if (opts[i].type != PROD_CONF_STR)
            continue;
        char **f = str_field(&c->cfg, &opts[i]);
        if (*f && (opts[i].flags & PROD_CONF_SECRET))
            sl_secret_wipe(*f, strlen(*f));
        free(*f);
        *f = NULL;
    }
}

int prod_conf_set(struct sluice_config *c, const char *name, const char *value, sl_err_t *err)
{
    if (!name)
        return sl_err_set(err, SL_ECONFIG, "no option name");
    const struct prod_conf_opt *o = find_name(name);
    if (!o)
        return sl_err_set(err, SL_ECONFIG, "unknown option \"%.64s\"", name);
    if (!value)
        return sl_err_set(err, SL_ECONFIG, "no value for %s", o->name);
    return set_value(c, o, value, o->name, err);
}

int prod_conf_load_env(struct sluice_config *c, char *const *envp, sl_err_t *err)
{
    for (size_t i = 0; i < NOPTS; i++) {
        size_t nl = strlen(opts[i].env);
        const char *val = NULL;
        for (char *const *e = envp; e && *e; e++) {
            if (strncmp(*e, opts[i].env, nl) == 0 && (*e)[nl] == '=')
                val = *e + nl + 1;
        }
        if (!val)
            continue;
        char key[96];
        (void)snprintf(key, sizeof(key), "%s (env)", opts[i].env);
        int rc = set_value(c, &opts[i], val, key, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The combinations sl_cfg's check_kafka_security refuses, in the same words. */
int prod_conf_check(const struct sluice_config *c, sl_err_t *err)
{
    const struct sl_config *cfg = &c->cfg;
    const char *proto = cfg->kafka_security_protocol;
    bool sasl = strncmp(proto, "SASL_", 5) == 0;
    bool tls = strcmp(proto, "SSL") == 0 || strcmp(proto, "SASL_SSL") == 0;
    const struct {
        const char *name;
        const char *val;
    } sasl_opts[] = {{"kafka_sasl_username", cfg->kafka_sasl_username},
                     {"kafka_sasl_password", cfg->kafka_sasl_password}},
      tls_opts[] = {{"kafka_ssl_ca_file", cfg->kafka_ssl_ca_file},
                    {"kafka_ssl_cert_file", cfg->kafka_ssl_cert_file},
                    {"kafka_ssl_key_file", cfg->kafka_ssl_key_file},
                    {"kafka_ssl_key_password", cfg->kafka_ssl_key_password}};
    for (size_t i = 0; i < sizeof(sasl_opts) / sizeof(sasl_opts[0]); i++) {
        if (sasl && !sasl_opts[i].val[0])
            return sl_err_set(err, SL_ECONFIG, "kafka_security_protocol is %s but %s is empty",
                              proto, sasl_opts[i].name);
        if (!sasl && sasl_opts[i].val[0])
            return sl_err_set(err, SL_ECONFIG,
                              "%s is set but kafka_security_protocol is %s: SASL credentials "
                              "need SASL_SSL or SASL_PLAINTEXT",
                              sasl_opts[i].name, proto);
    }
    for (size_t i = 0; i < sizeof(tls_opts) / sizeof(tls_opts[0]); i++) {
        if (!tls && tls_opts[i].val[0])
            return sl_err_set(err, SL_ECONFIG,
                              "%s is set but kafka_security_protocol is %s: TLS settings need "
                              "SSL or SASL_SSL",
                              tls_opts[i].name, proto);
    }
    if (cfg->kafka_ssl_cert_file[0] && !cfg->kafka_ssl_key_file[0])
        return sl_err_set(err, SL_ECONFIG,
                          "kafka_ssl_cert_file is set but kafka_ssl_key_file is empty");
    if (cfg->kafka_ssl_key_file[0] && !cfg->kafka_ssl_cert_file[0])
        return sl_err_set(err, SL_ECONFIG,
                          "kafka_ssl_key_file is set but kafka_ssl_cert_file is empty");
    if (cfg->kafka_ssl_key_password[0] && !cfg->kafka_ssl_key_file[0])
        return sl_err_set(err, SL_ECONFIG,
                          "kafka_ssl_key_password is set but kafka_ssl_key_file is empty");
    return 0;
}

void prod_conf_apply_log(const struct sluice_config *c, const char *proc)
{
    /* The logger's settings are plain globals its macros read on every thread: set them
     * once, before any producer of this process logs, never under a running one. */
    static atomic_bool applied = false;
    if (!atomic_exchange(&applied, true)) {
        enum sl_log_level lv = SL_LOG_INFO;
        unsigned mask = 0;
        /* both were checked when set */
        (void)sl_log_level_parse(c->cfg.log_level, &lv);
        (void)sl_log_debug_parse(c->cfg.debug, &mask);
        sl_log_init(proc, lv, mask);
    }
    for (size_t i = 0; i < NOPTS; i++) {
        if (opts[i].flags & PROD_CONF_SECRET)
            sl_log_add_secret(str_value(&c->cfg, &opts[i]));
    }
}

int prod_err_out(sluice_err_t *dst, const sl_err_t *src)
{
    if (dst) {
        dst->code = src->code;
        memcpy(dst->msg, src->msg, sizeof(dst->msg));
    }
    return src->code;
}

/* ==== Public entry points ==== */

sluice_config_t *sluice_config_new(void)
{
    struct sluice_config *c = sl_xmalloc(sizeof(*c));
    prod_conf_init(c);
    return c;
}

int sluice_config_set(sluice_config_t *cfg, const char *name, const char *value, sluice_err_t *err)
{
    sl_err_t e = {0};
    if (prod_conf_set(cfg, name, value, &e) != 0)
        return prod_err_out(err, &e);
    return 0;
}

int sluice_config_load_env(sluice_config_t *cfg, sluice_err_t *err)
{
    sl_err_t e = {0};
    if (prod_conf_load_env(cfg, environ, &e) != 0)
        return prod_err_out(err, &e);
    return 0;
}

void sluice_config_destroy(sluice_config_t *cfg)
{
    prod_conf_fini(cfg);
    free(cfg);
}

const char *sluice_strerror(int code)
{
    return sl_strerror(code);
}

const char *sluice_producer_version(void)
{
    return SL_VERSION;
}
