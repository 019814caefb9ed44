/*
 * Unit tests for the public library's configuration (producer/prod_conf): its option table
 * must stay sl_cfg's (same names, environment variables, defaults and integer bounds, and
 * the same verdict on the Kafka security combinations), values are parsed strictly and
 * refused with the option named, and the public entry points (sluice_config_*,
 * sluice_producer_new's configuration and opts errors, sluice_strerror,
 * sluice_producer_version) convert errors faithfully. No network: every producer created
 * here is refused before librdkafka is asked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "producer/prod_conf.h"
#include "producer/sluice_producer.h"

static FILE *g_null; /* sl_cfg_load's error output, discarded */

static int setup(void **state)
{
    (void)state;
    g_null = fopen("/dev/null", "w");
    return g_null ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fclose(g_null);
}

/* Errors sl_cfg_load reports for the environment envp (a NULL-terminated list). */
static int sl_cfg_errors(char *const *envp)
{
    struct sl_config cfg;
    int n = sl_cfg_load(&cfg, NULL, envp, g_null);
    sl_cfg_fini(&cfg);
    return n;
}

/* prod_conf's verdict on envp: 0 = loaded and checked, else the failing code. */
static int prod_conf_verdict(char *const *envp)
{
    struct sluice_config c;
    sl_err_t err = {0};
    prod_conf_init(&c);
    int rc = prod_conf_load_env(&c, envp, &err);
    if (rc == 0)
        rc = prod_conf_check(&c, &err);
    prod_conf_fini(&c);
    return rc;
}

static const char *str_at(const struct sl_config *cfg, size_t off)
{
    return *(char *const *)(const void *)((const char *)cfg + off);
}

static int64_t int_at(const struct sl_config *cfg, size_t off)
{
    return *(const int64_t *)(const void *)((const char *)cfg + off);
}

/* Every option: an sl_cfg option of the same name, same default in the same field. */
static void test_defaults_match_sl_cfg(void **state)
{
    (void)state;
    char *envp[] = {NULL};
    struct sl_config full;
    assert_int_equal(sl_cfg_load(&full, NULL, envp, g_null), 0);
    struct sluice_config c;
    prod_conf_init(&c);
    size_t n;
    const struct prod_conf_opt *t = prod_conf_table(&n);
    assert_true(n >= 14);
    for (size_t i = 0; i < n; i++) {
        if (sl_cfg_source(&full, t[i].name) < 0)
            fail_msg("%s is not an sl_cfg option", t[i].name);
        if (t[i].type == PROD_CONF_STR)
            assert_string_equal(str_at(&c.cfg, t[i].off), str_at(&full, t[i].off));
        else
            assert_int_equal(int_at(&c.cfg, t[i].off), int_at(&full, t[i].off));
    }
    prod_conf_fini(&c);
    sl_cfg_fini(&full);
}

/* The same environment variable (sl_cfg refuses unknown SLUICE_* names) and, for integers,
 * the same bounds: min and max accepted, one beyond refused, by both. */
static void test_env_names_and_bounds_match_sl_cfg(void **state)
{
    (void)state;
    size_t n;
    const struct prod_conf_opt *t = prod_conf_table(&n);
    for (size_t i = 0; i < n; i++) {
        char var[256];
        char *envp[] = {var, NULL};
        snprintf(var, sizeof(var), "%s=%s", t[i].env, t[i].def);
        if (sl_cfg_errors(envp) != 0)
            fail_msg("sl_cfg refuses %s", var);
        assert_int_equal(prod_conf_verdict(envp), 0);
        if (t[i].type != PROD_CONF_INT)
            continue;
        const int64_t ok[] = {t[i].min, t[i].max};
        const int64_t bad[] = {t[i].min - 1, t[i].max + 1};
        for (size_t k = 0; k < 2; k++) {
            snprintf(var, sizeof(var), "%s=%lld", t[i].env, (long long)ok[k]);
            assert_int_equal(sl_cfg_errors(envp), 0);
            assert_int_equal(prod_conf_verdict(envp), 0);
            snprintf(var, sizeof(var), "%s=%lld", t[i].env, (long long)bad[k]);
            assert_int_equal(sl_cfg_errors(envp), 1);
            assert_int_equal(prod_conf_verdict(envp), SL_ECONFIG);
        }
    }
}

/* Kafka security combinations: refused by prod_conf exactly when sl_cfg refuses them. */
static void test_security_checks_agree_with_sl_cfg(void **state)
{
    (void)state;
    static const struct {
        const char *vars[5]; /* NULL-terminated */
        int want;            /* prod_conf's code */
    } cases[] = {
        {{NULL}, 0},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=sasl_ssl", "SLUICE_KAFKA_SASL_USERNAME=u",
          "SLUICE_KAFKA_SASL_PASSWORD=secret-pw", NULL},
         0},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT", "SLUICE_KAFKA_SASL_MECHANISM=plain",
          "SLUICE_KAFKA_SASL_USERNAME=u", "SLUICE_KAFKA_SASL_PASSWORD=secret-pw", NULL},
         0},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=SSL", NULL}, 0},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=SASL_SSL", "SLUICE_KAFKA_SASL_USERNAME=u", NULL},
         SL_ECONFIG},
        {{"SLUICE_KAFKA_SASL_USERNAME=u", NULL}, SL_ECONFIG},
        {{"SLUICE_KAFKA_SASL_PASSWORD=secret-pw", NULL}, SL_ECONFIG},
        {{"SLUICE_KAFKA_SSL_CA_FILE=/etc/hostname", NULL}, SL_ECONFIG},
        {{"SLUICE_KAFKA_SSL_KEY_PASSWORD=secret-pw", NULL}, SL_ECONFIG},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=SSL", "SLUICE_KAFKA_SSL_CERT_FILE=/nonexistent/c.pem",
          NULL},
         SL_ECONFIG},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=SSL", "SLUICE_KAFKA_SSL_KEY_FILE=/nonexistent/k.pem",
          NULL},
         SL_ECONFIG},
        {{"SLUICE_KAFKA_SECURITY_PROTOCOL=TLS", NULL}, SL_ECONFIG},
        {{"SLUICE_KAFKA_SASL_MECHANISM=GSSAPI", NULL}, SL_ECONFIG},
        {{"SLUICE_INSTANCE_ID=pod 1", NULL}, SL_ECONFIG},
        {{"SLUICE_LOG_LEVEL=verbose", NULL}, SL_ECONFIG},
        {{"SLUICE_DEBUG=kafka,nope", NULL}, SL_ECONFIG},
        {{"SLUICE_TOPIC_DELIVERIES=", NULL}, SL_ECONFIG},
        {{"SLUICE_KAFKA_BROKERS=", NULL}, SL_ECONFIG},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *envp[5];
        for (size_t k = 0; k < 5; k++)
            envp[k] = (char *)(uintptr_t)cases[i].vars[k];
        int sl = sl_cfg_errors(envp);
        int pc = prod_conf_verdict(envp);
        if (pc != cases[i].want || (sl == 0) != (pc == 0))
            fail_msg("case %zu (%s): prod_conf %d, sl_cfg %d errors", i,
                     cases[i].vars[0] ? cases[i].vars[0] : "defaults", pc, sl);
    }
}

/* Values are parsed strictly, refused ones leave the option as it was, and the message
 * names the option (or the variable) and the rule. */
static void test_set_strict(void **state)
{
    (void)state;
    struct sluice_config c;
    sl_err_t err = {0};
    prod_conf_init(&c);
    assert_int_equal(prod_conf_set(&c, "max_body_bytes", "12x", &err), SL_ECONFIG);
    assert_string_equal(err.msg, "invalid value for max_body_bytes: \"12x\": expected an integer "
                                 "in 1..16777216");
    assert_int_equal(c.cfg.max_body_bytes, 1048576);
    assert_int_equal(prod_conf_set(&c, "max_body_bytes", "2048", &err), 0);
    assert_int_equal(c.cfg.max_body_bytes, 2048);
    assert_int_equal(prod_conf_set(&c, "redis_url", "redis://x:1", &err), SL_ECONFIG);
    assert_string_equal(err.msg, "unknown option \"redis_url\"");
    assert_int_equal(prod_conf_set(&c, NULL, "x", &err), SL_ECONFIG);
    assert_int_equal(prod_conf_set(&c, "kafka_brokers", NULL, &err), SL_ECONFIG);
    assert_int_equal(prod_conf_set(&c, "topic_deliveries", "", &err), SL_ECONFIG);
    assert_string_equal(err.msg, "invalid value for topic_deliveries: \"\": must not be empty");
    assert_string_equal(c.cfg.topic_deliveries, "sluice.deliveries");
    /* canonical spellings, as sl_cfg writes them back */
    assert_int_equal(prod_conf_set(&c, "kafka_security_protocol", "sasl_ssl", &err), 0);
    assert_string_equal(c.cfg.kafka_security_protocol, "SASL_SSL");
    assert_int_equal(prod_conf_set(&c, "kafka_sasl_mechanism", "scram-sha-256", &err), 0);
    assert_string_equal(c.cfg.kafka_sasl_mechanism, "SCRAM-SHA-256");
    char id[80];
    memset(id, 'a', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    assert_int_equal(prod_conf_set(&c, "instance_id", id, &err), SL_ECONFIG);
    id[64] = '\0';
    assert_int_equal(prod_conf_set(&c, "instance_id", id, &err), 0);
    assert_int_equal(prod_conf_set(&c, "kafka_sasl_password", "hunter2-secret", &err), 0);
    prod_conf_fini(&c);
    prod_conf_fini(&c); /* idempotent */
}

/* Only the library's own variables are read; a refused one is named as a variable. */
static void test_load_env(void **state)
{
    (void)state;
    struct sluice_config c;
    sl_err_t err = {0};
    char *envp[] = {"SLUICE_REDIS_URL=not-ours", "SLUICE_TOPIC_DELIVERIES=t.env",
                    "SLUICE_NOT_AN_OPTION=1",    "PATH=/bin",
                    "SLUICE_KAFKA_BROKERS=h:1",  NULL};
    prod_conf_init(&c);
    assert_int_equal(prod_conf_load_env(&c, envp, &err), 0);
    assert_string_equal(c.cfg.topic_deliveries, "t.env");
    assert_string_equal(c.cfg.kafka_brokers, "h:1");
    char *bad[] = {"SLUICE_MAX_BODY_BYTES=0", NULL};
    assert_int_equal(prod_conf_load_env(&c, bad, &err), SL_ECONFIG);
    assert_string_equal(err.msg, "invalid value for SLUICE_MAX_BODY_BYTES (env): \"0\": expected "
                                 "an integer in 1..16777216");
    assert_int_equal(prod_conf_load_env(&c, NULL, &err), 0);
    prod_conf_fini(&c);
}

/* The public entry points: sluice_err_t carries the internal code and message; a producer
 * whose options do not fit together is refused before Kafka is involved. */
static void test_public_api(void **state)
{
    (void)state;
    sluice_err_t err = {0};
    sluice_config_t *cfg = sluice_config_new();
    assert_non_null(cfg);
    assert_int_equal(sluice_config_set(cfg, "max_body_bytes", "-1", &err), SLUICE_ECONFIG);
    assert_int_equal(err.code, SLUICE_ECONFIG);
    assert_non_null(strstr(err.msg, "max_body_bytes"));
    assert_int_equal(sluice_config_set(cfg, "kafka_sasl_password", "p4ssw0rd-x", NULL), 0);
    sluice_producer_t *p = sluice_producer_new(cfg, &err);
    assert_null(p);
    assert_int_equal(err.code, SLUICE_ECONFIG);
    assert_string_equal(err.msg, "kafka_sasl_password is set but kafka_security_protocol is "
                                 "PLAINTEXT: SASL credentials need SASL_SSL or SASL_PLAINTEXT");
    assert_null(strstr(err.msg, "p4ssw0rd"));
    assert_null(sluice_producer_new(cfg, NULL)); /* err is optional */
    sluice_config_destroy(cfg);
    sluice_config_destroy(NULL);

    struct sluice_producer_opts o = {.message_timeout_ms = 5};
    memset(&err, 0, sizeof(err));
    assert_null(sluice_producer_new_opts(NULL, &o, &err));
    assert_int_equal(err.code, SLUICE_EINVAL);
    assert_string_equal(err.msg, "message_timeout_ms must be in 1000..86400000");

    assert_string_equal(sluice_strerror(SLUICE_ECONFIG), "invalid configuration");
    assert_string_equal(sluice_strerror(SLUICE_ETIMEDOUT), sl_strerror(SL_ETIMEDOUT));
    assert_string_equal(sluice_producer_version(), SL_VERSION);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_match_sl_cfg),
        cmocka_unit_test(test_env_names_and_bounds_match_sl_cfg),
        cmocka_unit_test(test_security_checks_agree_with_sl_cfg),
        cmocka_unit_test(test_set_strict),
        cmocka_unit_test(test_load_env),
        cmocka_unit_test(test_public_api),
    };
    return cmocka_run_group_tests_name("prod_conf", tests, setup, teardown);
}
