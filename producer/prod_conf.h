/*
 * prod_conf: sluice_config_t, the configuration of the public library (sluice_producer.h).
 *
 * The options a producer reads, under sl_cfg's names, environment variables, bounds and
 * defaults (tests/unit/test_prod_conf.c holds the two tables together), stored straight into
 * a struct sl_config: the library's core (prod_lib_new, common/sl_kafka) reads the same
 * struct whether it came from sl_cfg (Sluice's processes) or from here (applications).
 * sl_cfg itself is not part of the library: it validates the options of every process and
 * needs libpq, hiredis and OpenSSL to do so.
 *
 * Per-option checks run when a value is set (strict integers, known log levels and debug
 * contexts, the canonical spelling of protocol and mechanism); the cross-field checks of the
 * Kafka security options run in prod_conf_check, from sluice_producer_new. PEM files are not
 * parsed here: librdkafka refuses unreadable ones when the producer is created.
 *
 * thread: a configuration belongs to one thread at a time.
 */
#ifndef PROD_CONF_H
#define PROD_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "producer/sluice_producer.h"

struct sluice_config {
    struct sl_config cfg; /* the options of prod_conf_table() (owned strings); every other
                             field zero */
};

enum prod_conf_type { PROD_CONF_STR, PROD_CONF_INT };

#define PROD_CONF_SECRET   0x1u /* the value is never echoed */
#define PROD_CONF_NONEMPTY 0x2u /* "" is refused */

/* One option: name, env, bounds and default as in sl_cfg's table. */
struct prod_conf_opt {
    const char *name;         /* key, as in config files */
    const char *env;          /* environment variable */
    enum prod_conf_type type; /* value type */
    size_t off;               /* offsetof(struct sl_config, field) */
    int64_t min;              /* smallest integer accepted (PROD_CONF_INT) */
    int64_t max;              /* largest integer accepted (PROD_CONF_INT) */
    const char *def;          /* default, as text */
    unsigned flags;           /* PROD_CONF_* */
};

/* The option table (static storage); *n (OUT) = its entries. */
const struct prod_conf_opt *prod_conf_table(size_t *n);

/* Every option at its default (c: OUT, overwritten). Release with prod_conf_fini. */
void prod_conf_init(struct sluice_config *c);
/* Free what c owns, secrets wiped. NULL-safe. */
void prod_conf_fini(struct sluice_config *c);

/* Set option name from its text (both borrowed). 0 or SL_ECONFIG naming the option. */
int prod_conf_set(struct sluice_config *c, const char *name, const char *value, sl_err_t *err);
/* Apply the variables of envp (NULL-terminated "NAME=value") that name an option. */
int prod_conf_load_env(struct sluice_config *c, char *const *envp, sl_err_t *err);
/* The cross-field checks (Kafka security options). 0 or SL_ECONFIG. */
int prod_conf_check(const struct sluice_config *c, sl_err_t *err);
/* Register c's secrets with the logger; the first call in the process also sets its level,
 * debug contexts and proc (borrowed) from c. */
void prod_conf_apply_log(const struct sluice_config *c, const char *proc);

/* Copy an internal error into a public one (dst NULL-safe); returns src->code. */
int prod_err_out(sluice_err_t *dst, const sl_err_t *src);

#endif /* PROD_CONF_H */
