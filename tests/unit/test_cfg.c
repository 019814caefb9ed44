/*
 * Config loader: defaults, precedence, strict parsing and bounds, unknown keys, every error
 * reported at once, secret redaction in --print-config, Kafka transport security and Redis
 * URL checks, and exit code 78 from a real process.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_cfg.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_redis.h"

static char *load_errs(struct sl_config *cfg, const char *file, char **envp, int *nerr)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *nerr = sl_cfg_load(cfg, file, envp, f);
    fclose(f);
    return buf;
}

/* What --print-config prints for cfg (caller frees). */
static char *printed(const struct sl_config *cfg)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    sl_cfg_print(cfg, f);
    fclose(f);
    return out;
}

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/sl_cfg_test_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_defaults(void **state)
{
    (void)state;
    struct sl_config cfg;
    char *env[] = {NULL};
    int nerr;
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 0);
    assert_string_equal(errs, "");
    assert_int_equal(cfg.http_timeout_ms, 15000);
    assert_int_equal(cfg.http_connect_timeout_ms, 5000);
    assert_int_equal(cfg.retry_base_ms, 30000);
    assert_int_equal(cfg.retry_cap_ms, 3600000);
    assert_int_equal(cfg.max_attempts, 5);
    assert_int_equal(cfg.breaker_threshold, 10);
    assert_int_equal(cfg.breaker_cooldown_ms, 300000);
    assert_int_equal(cfg.dedup_window_s, 86400);
    assert_true(cfg.ssrf_protection);
    assert_string_equal(cfg.topic_deliveries, "sluice.deliveries");
    assert_int_equal(sl_cfg_source(&cfg, "http_timeout_ms"), SL_CFG_SRC_DEFAULT);
    free(errs);
    sl_cfg_fini(&cfg);
}

static void test_precedence(void **state)
{
    (void)state;
    char *path = write_tmp("# comment\nhttp_timeout_ms = 20000\nmax_attempts = 7\n"
                           "topic_outcomes = \"x.outcomes\"\n");
    char *env[] = {"SLUICE_MAX_ATTEMPTS=9", "PATH=/bin", NULL};
    struct sl_config cfg;
    int nerr;
    char *errs = load_errs(&cfg, path, env, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.http_timeout_ms, 20000);
    assert_int_equal(cfg.max_attempts, 9);
    assert_string_equal(cfg.topic_outcomes, "x.outcomes");
    assert_int_equal(sl_cfg_source(&cfg, "http_timeout_ms"), SL_CFG_SRC_FILE);
    assert_int_equal(sl_cfg_source(&cfg, "max_attempts"), SL_CFG_SRC_ENV);
    free(errs);
    sl_cfg_fini(&cfg);
    unlink(path);
    free(path);
}

static void test_strict_and_all_errors(void **state)
{
    (void)state;
    char *path = write_tmp("http_timeout_ms = 15s\nno_such_option = 1\nmax_attempts=0\n"
                           "garbage line\nssrf_protection = yes\n");
    char *env[] = {"SLUICE_RETRY_BASE_MS=12abc", "SLUICE_HTTP_TIMOUT_MS=5",
                   "SLUICE_BREAKER_THRESHOLD=99999999999999999999", "SLUICE_STACK_DIR=/tmp/x",
                   NULL};
    struct sl_config cfg;
    int nerr;
    char *errs = load_errs(&cfg, path, env, &nerr);
    assert_int_equal(nerr, 8);
    assert_non_null(strstr(errs, "invalid value for http_timeout_ms ("));
    assert_non_null(strstr(errs, ":1): \"15s\": expected an integer in 100..600000"));
    assert_non_null(strstr(errs, ":2: unknown option \"no_such_option\""));
    assert_non_null(strstr(errs, "invalid value for max_attempts"));
    assert_non_null(strstr(errs, ":4: expected `name = value`"));
    assert_non_null(strstr(errs, "\"yes\": expected true or false"));
    assert_non_null(strstr(errs, "invalid value for SLUICE_RETRY_BASE_MS (env): \"12abc\""));
    assert_non_null(strstr(errs, "unknown environment variable SLUICE_HTTP_TIMOUT_MS"));
    assert_non_null(strstr(errs, "SLUICE_BREAKER_THRESHOLD (env)"));
    assert_null(strstr(errs, "SLUICE_STACK_DIR")); /* script variables are not options */
    free(errs);
    sl_cfg_fini(&cfg);
    unlink(path);
    free(path);
}

static void test_bounds_inclusive(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env1[] = {"SLUICE_MAX_ATTEMPTS=100", "SLUICE_HTTP_TIMEOUT_MS=100",
                    "SLUICE_HTTP_CONNECT_TIMEOUT_MS=10", NULL};
    char *errs = load_errs(&cfg, NULL, env1, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.max_attempts, 100);
    free(errs);
    sl_cfg_fini(&cfg);
    char *env2[] = {"SLUICE_MAX_ATTEMPTS=101", NULL};
    errs = load_errs(&cfg, NULL, env2, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "expected an integer in 1..100"));
    free(errs);
    sl_cfg_fini(&cfg);
    char *env3[] = {"SLUICE_MAX_ATTEMPTS=-1", NULL};
    errs = load_errs(&cfg, NULL, env3, &nerr);
    assert_int_equal(nerr, 1);
    free(errs);
    sl_cfg_fini(&cfg);
}

static void test_cross_field(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env[] = {"SLUICE_LEASE_MS=10000", "SLUICE_HTTP_TIMEOUT_MS=20000",
                   "SLUICE_RETRY_BASE_MS=5000", "SLUICE_RETRY_CAP_MS=1000", NULL};
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 2);
    assert_non_null(strstr(errs, "lease_ms (10000) must exceed http_timeout_ms (20000)"));
    assert_non_null(strstr(errs, "retry_base_ms (5000) must not exceed retry_cap_ms (1000)"));
    free(errs);
    sl_cfg_fini(&cfg);
}

/* ssrf_allow_cidrs is checked at load by every process (it also governs registration), named
 * as written: env or file line. */
static void test_ssrf_allow_cidrs(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env[] = {"SLUICE_SSRF_ALLOW_CIDRS=127.0.0.0/8, 10.0.0.0/33", NULL};
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "invalid value for SLUICE_SSRF_ALLOW_CIDRS (env): entry 2 "
                                 "(\"10.0.0.0/33\"): not a CIDR"));
    free(errs);
    sl_cfg_fini(&cfg);
    char *path = write_tmp("ssrf_allow_cidrs = nonsense\n");
    errs = load_errs(&cfg, path, NULL, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "invalid value for ssrf_allow_cidrs ("));
    assert_non_null(strstr(errs, "entry 1 (\"nonsense\")"));
    free(errs);
    sl_cfg_fini(&cfg);
    unlink(path);
    free(path);
    char *ok[] = {"SLUICE_SSRF_ALLOW_CIDRS=127.0.0.0/8,::1/128", NULL};
    errs = load_errs(&cfg, NULL, ok, &nerr);
    assert_int_equal(nerr, 0);
    free(errs);
    sl_cfg_fini(&cfg);
}

/* delivery_proxy: checked at load, never echoed (it may hold a password), masked in print. */
static void test_delivery_proxy(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env[] = {"SLUICE_DELIVERY_PROXY=ftp://u:pr0xypw@px.example:21", NULL};
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "invalid value for SLUICE_DELIVERY_PROXY (env): the scheme"));
    assert_null(strstr(errs, "pr0xypw"));
    free(errs);
    sl_cfg_fini(&cfg);
    char *ok[] = {"SLUICE_DELIVERY_PROXY=http://u:pr0xypw@px.example:3128", NULL};
    errs = load_errs(&cfg, NULL, ok, &nerr);
    assert_int_equal(nerr, 0);
    free(errs);
    char *out = printed(&cfg);
    assert_non_null(strstr(out, "http://[redacted]@px.example:3128"));
    assert_null(strstr(out, "pr0xypw"));
    free(out);
    sl_cfg_fini(&cfg);
    /* delivery_proxy_ca_file: only for an https:// proxy, and a file that can be read */
    char *plain[] = {"SLUICE_DELIVERY_PROXY=http://px.example:3128",
                     "SLUICE_DELIVERY_PROXY_CA_FILE=/etc/hostname", NULL};
    errs = load_errs(&cfg, NULL, plain, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "SLUICE_DELIVERY_PROXY_CA_FILE (env) is set, but "
                                 "SLUICE_DELIVERY_PROXY (env) is not an https:// proxy"));
    free(errs);
    sl_cfg_fini(&cfg);
    char *missing[] = {"SLUICE_DELIVERY_PROXY=https://px.example:3129",
                       "SLUICE_DELIVERY_PROXY_CA_FILE=/nonexistent/proxy-ca.pem", NULL};
    errs = load_errs(&cfg, NULL, missing, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "invalid value for SLUICE_DELIVERY_PROXY_CA_FILE (env): "
                                 "\"/nonexistent/proxy-ca.pem\": cannot read it"));
    free(errs);
    sl_cfg_fini(&cfg);
}

/* The recorder's tunables: defaults, file < env, inclusive bounds, and a rejection that names
 * the option and its range. */
static void test_recorder_tunables(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env0[] = {NULL};
    char *errs = load_errs(&cfg, NULL, env0, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.recorder_lanes, 2);
    assert_int_equal(cfg.recorder_batch_max_bytes, 64 * 1024 * 1024);
    assert_int_equal(cfg.recorder_health_refresh_ms, 30000);
    assert_int_equal(sl_cfg_source(&cfg, "recorder_lanes"), SL_CFG_SRC_DEFAULT);
    free(errs);
    sl_cfg_fini(&cfg);

    char *path = write_tmp("recorder_lanes = 3\nrecorder_batch_max_bytes = 2097152\n"
                           "recorder_health_refresh_ms = 5000\n");
    char *env1[] = {"SLUICE_RECORDER_LANES=4", "SLUICE_RECORDER_HEALTH_REFRESH_MS=1000", NULL};
    errs = load_errs(&cfg, path, env1, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.recorder_lanes, 4);
    assert_int_equal(cfg.recorder_batch_max_bytes, 2097152);
    assert_int_equal(cfg.recorder_health_refresh_ms, 1000);
    assert_int_equal(sl_cfg_source(&cfg, "recorder_lanes"), SL_CFG_SRC_ENV);
    assert_int_equal(sl_cfg_source(&cfg, "recorder_batch_max_bytes"), SL_CFG_SRC_FILE);
    free(errs);
    sl_cfg_fini(&cfg);
    unlink(path);
    free(path);

    char *env2[] = {"SLUICE_RECORDER_LANES=16", "SLUICE_RECORDER_BATCH_MAX_BYTES=1048576",
                    "SLUICE_RECORDER_HEALTH_REFRESH_MS=3600000", NULL};
    errs = load_errs(&cfg, NULL, env2, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.recorder_lanes, SL_CFG_RECORDER_LANES_MAX);
    free(errs);
    sl_cfg_fini(&cfg);

    char *env3[] = {"SLUICE_RECORDER_LANES=17", "SLUICE_RECORDER_BATCH_MAX_BYTES=1048575",
                    "SLUICE_RECORDER_HEALTH_REFRESH_MS=999", NULL};
    errs = load_errs(&cfg, NULL, env3, &nerr);
    assert_int_equal(nerr, 3);
    assert_non_null(strstr(errs,
                           "invalid value for SLUICE_RECORDER_LANES (env): \"17\": expected an "
                           "integer in 1..16"));
    assert_non_null(strstr(errs, "invalid value for SLUICE_RECORDER_BATCH_MAX_BYTES (env): "
                                 "\"1048575\": expected an integer in 1048576..1073741824"));
    assert_non_null(strstr(errs, "invalid value for SLUICE_RECORDER_HEALTH_REFRESH_MS (env): "
                                 "\"999\": expected an integer in 1000..3600000"));
    free(errs);
    sl_cfg_fini(&cfg);

    char *env4[] = {"SLUICE_RECORDER_LANES=0", NULL};
    errs = load_errs(&cfg, NULL, env4, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "SLUICE_RECORDER_LANES"));
    free(errs);
    sl_cfg_fini(&cfg);
}

static void test_max_queued_and_dedup_fail_open(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env0[] = {NULL};
    char *errs = load_errs(&cfg, NULL, env0, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.max_queued, 5000);
    assert_true(cfg.dedup_fail_open); /* default: deliver when the check cannot run */
    free(errs);
    sl_cfg_fini(&cfg);
    char *env1[] = {"SLUICE_MAX_QUEUED=100", "SLUICE_DEDUP_FAIL_OPEN=false", NULL};
    errs = load_errs(&cfg, NULL, env1, &nerr);
    assert_int_equal(nerr, 0);
    assert_int_equal(cfg.max_queued, 100);
    assert_false(cfg.dedup_fail_open);
    free(errs);
    sl_cfg_fini(&cfg);
    char *env2[] = {"SLUICE_MAX_QUEUED=99", NULL};
    errs = load_errs(&cfg, NULL, env2, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "invalid value for SLUICE_MAX_QUEUED (env): \"99\": expected "
                                 "an integer in 100..1000000"));
    free(errs);
    sl_cfg_fini(&cfg);
}

/* Load the config from env, make a group consumer with sl_kafka and check the fetch
 * properties librdkafka holds (rd_kafka_new does not connect: no broker is needed). */
static void assert_fetch(char **env, const char *wait_ms, const char *min_bytes)
{
    struct sl_config cfg;
    int nerr;
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 0);
    sl_err_t err = {0};
    rd_kafka_t *rk = sl_kafka_consumer_new(&cfg, "test", "g", NULL, &err);
    assert_non_null(rk);
    const char *names[2] = {"fetch.wait.max.ms", "fetch.min.bytes"};
    const char *want[2] = {wait_ms, min_bytes};
    for (int i = 0; i < 2; i++) {
        char v[64];
        size_t n = sizeof(v);
        assert_int_equal(rd_kafka_conf_get(rd_kafka_conf(rk), names[i], v, &n), RD_KAFKA_CONF_OK);
        assert_string_equal(v, want[i]);
    }
    rd_kafka_destroy(rk);
    free(errs);
    sl_cfg_fini(&cfg);
}

/* kafka_fetch_wait_ms / kafka_fetch_min_bytes reach the group consumers that sl_kafka makes
 * (sluice-consumer's and sluice-recorder's): defaults 10 ms / 64 KiB, overrides, bounds. */
static void test_kafka_fetch_settings(void **state)
{
    (void)state;
    char *env0[] = {"SLUICE_KAFKA_BROKERS=127.0.0.1:1", NULL};
    assert_fetch(env0, "10", "65536");
    char *env1[] = {"SLUICE_KAFKA_BROKERS=127.0.0.1:1", "SLUICE_KAFKA_FETCH_WAIT_MS=250",
                    "SLUICE_KAFKA_FETCH_MIN_BYTES=1", NULL};
    assert_fetch(env1, "250", "1");

    struct sl_config cfg;
    int nerr;
    char *env2[] = {"SLUICE_KAFKA_FETCH_WAIT_MS=0", "SLUICE_KAFKA_FETCH_MIN_BYTES=16777217", NULL};
    char *errs = load_errs(&cfg, NULL, env2, &nerr);
    assert_int_equal(nerr, 2);
    assert_non_null(strstr(errs, "invalid value for SLUICE_KAFKA_FETCH_WAIT_MS (env): \"0\": "
                                 "expected an integer in 1..10000"));
    assert_non_null(strstr(errs, "invalid value for SLUICE_KAFKA_FETCH_MIN_BYTES (env): "
                                 "\"16777217\": expected an integer in 1..16777216"));
    free(errs);
    sl_cfg_fini(&cfg);
}

static void test_print_redacts(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *env[] = {"SLUICE_MASTER_KEY=PLANTED-master-key-0123456789abcdef",
                   "SLUICE_PG_DSN=host=db port=5432 password=PLANTEDpgpw user=u",
                   "SLUICE_REDIS_URL=redis://:PLANTEDredispw@127.0.0.1:6379/0", NULL};
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 0);
    free(errs);
    char *out = printed(&cfg);
    assert_null(strstr(out, "PLANTED"));
    assert_non_null(strstr(out, "master_key = \"[redacted]\"  # env"));
    /* the conninfo as libpq reads it, in libpq's option order */
    assert_non_null(strstr(out, "user=u password=[redacted] host=db port=5432"));
    assert_non_null(strstr(out, "redis://[redacted]@127.0.0.1:6379/0"));
    free(out);
    sl_cfg_fini(&cfg);
    /* a cluster's seed list keeps its hosts, loses its password */
    char *cenv[] = {"SLUICE_REDIS_URL=redis-cluster://svc:PLANTED%40c@10.0.0.1:7000,10.0.0.2:7001",
                    NULL};
    errs = load_errs(&cfg, NULL, cenv, &nerr);
    assert_int_equal(nerr, 0);
    free(errs);
    out = printed(&cfg);
    assert_null(strstr(out, "PLANTED"));
    assert_non_null(strstr(out, "redis-cluster://[redacted]@10.0.0.1:7000,10.0.0.2:7001"));
    free(out);
    sl_cfg_fini(&cfg);
}

static void test_bad_secret_value_not_echoed(void **state)
{
    (void)state;
    /* master_key is a string, so it can't be "invalid" by type; use a secret in a file with a
     * bad neighbour to show the file path is named but secrets are not. */
    char *path = write_tmp("master_key = PLANTEDsecretvalue\nmax_attempts = abc\n");
    struct sl_config cfg;
    int nerr;
    char *env[] = {NULL};
    char *errs = load_errs(&cfg, path, env, &nerr);
    assert_int_equal(nerr, 1);
    assert_null(strstr(errs, "PLANTED"));
    assert_non_null(strstr(errs, path));
    free(errs);
    sl_cfg_fini(&cfg);
    unlink(path);
    free(path);
}

/* instance_id names the pod in every outcome: the outcome contract's rule (1..64 visible
 * ASCII characters) is checked at start-up, not at the first outcome. */
static void test_instance_id(void **state)
{
    (void)state;
    char long_id[80];
    memset(long_id, 'p', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    char env_long[128];
    snprintf(env_long, sizeof(env_long), "SLUICE_INSTANCE_ID=%.65s", long_id);
    char env_max[128];
    snprintf(env_max, sizeof(env_max), "SLUICE_INSTANCE_ID=%.64s", long_id);
    char *bad[] = {"SLUICE_INSTANCE_ID=pod 1", "SLUICE_INSTANCE_ID=pod\t1",
                   "SLUICE_INSTANCE_ID=p\xc3\xa9", env_long};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sl_config cfg;
        int nerr;
        char *env[] = {bad[i], NULL};
        char *errs = load_errs(&cfg, NULL, env, &nerr);
        assert_int_equal(nerr, 1);
        assert_non_null(strstr(errs, "invalid value for instance_id: expected 1..64 visible"));
        free(errs);
        sl_cfg_fini(&cfg);
    }
    char *good[] = {"SLUICE_INSTANCE_ID=pod-1_a.b", env_max, "SLUICE_INSTANCE_ID="};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct sl_config cfg;
        int nerr;
        char *env[] = {good[i], NULL};
        char *errs = load_errs(&cfg, NULL, env, &nerr);
        assert_int_equal(nerr, 0);
        free(errs);
        sl_cfg_fini(&cfg);
    }
}

/* api_listen is checked at load (host:port), so a typo fails with 78 before anything starts. */
static void test_api_listen(void **state)
{
    (void)state;
    char *bad[] = {"SLUICE_API_LISTEN=8088",       "SLUICE_API_LISTEN=:8088",
                   "SLUICE_API_LISTEN=host:",      "SLUICE_API_LISTEN=host:0",
                   "SLUICE_API_LISTEN=host:65536", "SLUICE_API_LISTEN=host:80x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sl_config cfg;
        int nerr;
        char *env[] = {bad[i], NULL};
        char *errs = load_errs(&cfg, NULL, env, &nerr);
        if (nerr != 1 || !strstr(errs, "invalid value for SLUICE_API_LISTEN (env)"))
            fail_msg("%s: %d errors: %s", bad[i], nerr, errs);
        free(errs);
        sl_cfg_fini(&cfg);
    }
    char *good[] = {"SLUICE_API_LISTEN=0.0.0.0:8088", "SLUICE_API_LISTEN=[::1]:1",
                    "SLUICE_API_LISTEN=api.internal:65535"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct sl_config cfg;
        int nerr;
        char *env[] = {good[i], NULL};
        char *errs = load_errs(&cfg, NULL, env, &nerr);
        assert_int_equal(nerr, 0);
        free(errs);
        sl_cfg_fini(&cfg);
    }
}

/* --print-config: the PostgreSQL password is hidden in every form libpq accepts (the text
 * search once redacted the value after "app_password" and showed the real one, and missed
 * URIs); a conninfo libpq cannot parse is not shown. */
static void test_print_redacts_dsn_forms(void **state)
{
    (void)state;
    const char *dsn[][2] = {
        {"dbname=app_password host=db password=PLANTEDpw", "password=[redacted]"},
        {"postgresql://sluice:PLANTEDpw@db:5432/sluice", "password=[redacted]"},
        {"host=db password = 'PLANTED pw' user=u", "password=[redacted]"},
        {"postgresql://db/sluice?password=PLANTEDpw&user=u", "password=[redacted]"},
        {"host=db password='PLANTED", "[not shown: libpq cannot parse it]"},
    };
    for (size_t i = 0; i < sizeof(dsn) / sizeof(dsn[0]); i++) {
        char env_dsn[256];
        snprintf(env_dsn, sizeof(env_dsn), "SLUICE_PG_DSN=%s", dsn[i][0]);
        char *env[] = {env_dsn, NULL};
        struct sl_config cfg;
        int nerr;
        char *errs = load_errs(&cfg, NULL, env, &nerr);
        assert_int_equal(nerr, 0);
        free(errs);
        char *out = printed(&cfg);
        if (strstr(out, "PLANTED"))
            fail_msg("DSN form %zu shows its password:\n%s", i, out);
        assert_non_null(strstr(out, dsn[i][1]));
        free(out);
        sl_cfg_fini(&cfg);
    }
    /* a DSN without a password is shown as given */
    char *env[] = {"SLUICE_PG_DSN=host=db dbname=app_password user=u", NULL};
    struct sl_config cfg;
    int nerr;
    free(load_errs(&cfg, NULL, env, &nerr));
    char *out = printed(&cfg);
    assert_non_null(strstr(out, "host=db dbname=app_password user=u"));
    free(out);
    sl_cfg_fini(&cfg);
}

/* The start-up path registers the PostgreSQL password with the log scrubber in every form:
 * a child process loads a URI DSN and logs the password; the line must not show it. */
static void test_dsn_password_scrubbed_from_logs(void **state)
{
    (void)state;
    const char *forms[] = {"postgresql://sluice:PLANTEDpw1@db/sluice",
                           "host=db password = 'PLANTEDpw1' user=u"};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            setenv("SLUICE_PG_DSN", forms[i], 1);
            struct sl_config cfg;
            char *argv[] = {"x", NULL};
            int argc = 1;
            sl_cfg_main_load(&cfg, "test", &argc, argv);
            sl_log_set_fd(fds[1]);
            sl_warn("test", "leak_probe", "connecting with PLANTEDpw1 as password");
            _exit(0);
        }
        close(fds[1]);
        char buf[4096];
        size_t got = 0;
        ssize_t r;
        while ((r = read(fds[0], buf + got, sizeof(buf) - 1 - got)) > 0)
            got += (size_t)r;
        buf[got] = '\0';
        close(fds[0]);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        assert_non_null(strstr(buf, "leak_probe"));
        if (strstr(buf, "PLANTEDpw1"))
            fail_msg("form %zu: password in a log line: %s", i, buf);
    }
}

/* Transport security is checked as a whole at load: protocol and mechanism names (any case,
 * written back canonical), SASL credentials exactly with SASL, TLS files only with TLS and
 * readable; each problem named with its source, secrets never echoed. */
static void test_kafka_security_checks(void **state)
{
    (void)state;
    struct sl_config cfg;
    int nerr;
    char *ok[] = {"SLUICE_KAFKA_SECURITY_PROTOCOL=sasl_plaintext",
                  "SLUICE_KAFKA_SASL_MECHANISM=scram-sha-256", "SLUICE_KAFKA_SASL_USERNAME=u",
                  "SLUICE_KAFKA_SASL_PASSWORD=PLANTEDsaslpw", NULL};
    char *errs = load_errs(&cfg, NULL, ok, &nerr);
    assert_int_equal(nerr, 0);
    assert_string_equal(cfg.kafka_security_protocol, "SASL_PLAINTEXT");
    assert_string_equal(cfg.kafka_sasl_mechanism, "SCRAM-SHA-256");
    free(errs);
    char *out = printed(&cfg);
    assert_null(strstr(out, "PLANTED"));
    assert_non_null(strstr(out, "kafka_sasl_password = \"[redacted]\"  # env"));
    free(out);
    sl_cfg_fini(&cfg);

    char *env[] = {
        "SLUICE_KAFKA_SECURITY_PROTOCOL=SASL_SSL",  "SLUICE_KAFKA_SASL_MECHANISM=GSSAPI",
        "SLUICE_KAFKA_SASL_PASSWORD=PLANTEDsaslpw", "SLUICE_KAFKA_SSL_CA_FILE=/nonexistent/ca.pem",
        "SLUICE_KAFKA_SSL_CERT_FILE=/tmp",          NULL};
    errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 5);
    assert_non_null(strstr(errs, "SLUICE_KAFKA_SASL_MECHANISM (env): \"GSSAPI\": expected"));
    assert_non_null(strstr(errs, "SASL_SSL but kafka_sasl_username (SLUICE_KAFKA_SASL_USERNAME) "
                                 "is empty"));
    assert_non_null(strstr(errs, "invalid value for SLUICE_KAFKA_SSL_CA_FILE (env): "
                                 "\"/nonexistent/ca.pem\": cannot read it: No such file"));
    assert_non_null(strstr(errs, "SLUICE_KAFKA_SSL_CERT_FILE (env): \"/tmp\": cannot read it: "
                                 "not a regular file"));
    assert_non_null(strstr(errs, "SLUICE_KAFKA_SSL_CERT_FILE (env) is set but kafka_ssl_key_file"));
    assert_null(strstr(errs, "PLANTED"));
    free(errs);
    sl_cfg_fini(&cfg);

    char *path = write_tmp("kafka_sasl_username = u\nkafka_ssl_ca_file = /etc/hostname\n");
    char *plain[] = {NULL};
    errs = load_errs(&cfg, path, plain, &nerr);
    assert_int_equal(nerr, 2);
    assert_non_null(strstr(errs, "kafka_sasl_username (config file) is set but "
                                 "kafka_security_protocol is PLAINTEXT"));
    assert_non_null(strstr(errs, "kafka_ssl_ca_file (config file) is set but "
                                 "kafka_security_protocol is PLAINTEXT"));
    free(errs);
    sl_cfg_fini(&cfg);
    unlink(path);
    free(path);

    char *bad[] = {"SLUICE_KAFKA_SECURITY_PROTOCOL=TLS", NULL};
    errs = load_errs(&cfg, NULL, bad, &nerr);
    assert_int_equal(nerr, 1);
    assert_non_null(strstr(errs, "SLUICE_KAFKA_SECURITY_PROTOCOL (env): \"TLS\": expected "
                                 "PLAINTEXT, SSL, SASL_SSL or SASL_PLAINTEXT"));
    free(errs);
    sl_cfg_fini(&cfg);
}

/* What sl_kafka_conf_new hands librdkafka: PLAINTEXT by default, and the protocol, mechanism
 * and credentials when set (rd_kafka_new does not connect: no broker is needed). */
static void assert_kafka_prop(char **env, const char *name, const char *want)
{
    struct sl_config cfg;
    int nerr;
    char *errs = load_errs(&cfg, NULL, env, &nerr);
    assert_int_equal(nerr, 0);
    sl_err_t err = {0};
    rd_kafka_t *rk = sl_kafka_consumer_new(&cfg, "test", "g", NULL, &err);
    assert_non_null(rk);
    char v[128];
    size_t n = sizeof(v);
    assert_int_equal(rd_kafka_conf_get(rd_kafka_conf(rk), name, v, &n), RD_KAFKA_CONF_OK);
    if (strcasecmp(v, want) != 0)
        fail_msg("%s = \"%s\", want \"%s\"", name, v, want);
    rd_kafka_destroy(rk);
    free(errs);
    sl_cfg_fini(&cfg);
}

static void test_kafka_security_applied(void **state)
{
    (void)state;
    char *def[] = {"SLUICE_KAFKA_BROKERS=127.0.0.1:1", NULL};
    assert_kafka_prop(def, "security.protocol", "plaintext");
    char *sasl[] = {
        "SLUICE_KAFKA_BROKERS=127.0.0.1:1",  "SLUICE_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT",
        "SLUICE_KAFKA_SASL_MECHANISM=PLAIN", "SLUICE_KAFKA_SASL_USERNAME=svc-a",
        "SLUICE_KAFKA_SASL_PASSWORD=pw-a",   NULL};
    assert_kafka_prop(sasl, "security.protocol", "sasl_plaintext");
    assert_kafka_prop(sasl, "sasl.mechanisms", "PLAIN");
    assert_kafka_prop(sasl, "sasl.username", "svc-a");
}

/* redis_url: user and password (percent-decoded) are checked at load; the password never
 * shows in --print-config, in either form. */
static void test_redis_url(void **state)
{
    (void)state;
    const char *bad[][2] = {{"redis://u@h:1", "the user name needs a password"},
                            {"redis://u:p%4@h:1", "bad percent-encoding in the password"},
                            {"redis://u%zz:p@h:1", "bad percent-encoding in the user name"},
                            {"redis://:@h:1", "empty password"},
                            {"redis://h:0", "bad port"},
                            {"redis://h:1/x", "bad database number"},
                            {"http://h:1", "expected redis://"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char e[128];
        snprintf(e, sizeof(e), "SLUICE_REDIS_URL=%s", bad[i][0]);
        char *env[] = {e, NULL};
        struct sl_config cfg;
        int nerr;
        char *errs = load_errs(&cfg, NULL, env, &nerr);
        /* named as given, with its source, as the other keys are */
        if (nerr != 1 || !strstr(errs, "invalid value for SLUICE_REDIS_URL (env): ") ||
            !strstr(errs, bad[i][1]))
            fail_msg("%s: %d errors: %s", bad[i][0], nerr, errs);
        free(errs);
        sl_cfg_fini(&cfg);
    }
    struct sl_redis_url u;
    sl_err_t err;
    assert_int_equal(sl_redis_url_parse("redis://svc%2Da:P%40ss%3Aw%2Frd@r.local:6380/3", &u, &err),
                     0);
    assert_string_equal(u.user, "svc-a");
    assert_string_equal(u.password, "P@ss:w/rd");
    assert_string_equal(u.host, "r.local");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 3);
    sl_redis_url_fini(&u);
    assert_int_equal(sl_redis_url_parse("redis://:raw@pw@h", &u, &err), 0); /* last '@' */
    assert_null(u.user);
    assert_string_equal(u.password, "raw@pw");
    assert_int_equal(u.port, 6379);
    sl_redis_url_fini(&u);

    char *env[] = {"SLUICE_REDIS_URL=redis://user:PLANTED%40pw@127.0.0.1:6379/0", NULL};
    struct sl_config cfg;
    int nerr;
    free(load_errs(&cfg, NULL, env, &nerr));
    assert_int_equal(nerr, 0);
    char *out = printed(&cfg);
    assert_null(strstr(out, "PLANTED"));
    assert_non_null(strstr(out, "redis://[redacted]@127.0.0.1:6379/0"));
    free(out);
    sl_cfg_fini(&cfg);
}

/* The real start-up path: a child process with bad config exits 78 before connecting. */
static void test_exit_code_78(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        setenv("SLUICE_MAX_ATTEMPTS", "zero", 1);
        struct sl_config cfg;
        char *argv[] = {"x", NULL};
        int argc = 1;
        sl_cfg_main_load(&cfg, "test", &argc, argv);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), SL_CFG_EXIT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_strict_and_all_errors),
        cmocka_unit_test(test_bounds_inclusive),
        cmocka_unit_test(test_cross_field),
        cmocka_unit_test(test_ssrf_allow_cidrs),
        cmocka_unit_test(test_delivery_proxy),
        cmocka_unit_test(test_recorder_tunables),
        cmocka_unit_test(test_max_queued_and_dedup_fail_open),
        cmocka_unit_test(test_kafka_fetch_settings),
        cmocka_unit_test(test_print_redacts),
        cmocka_unit_test(test_bad_secret_value_not_echoed),
        cmocka_unit_test(test_exit_code_78),
        cmocka_unit_test(test_instance_id),
        cmocka_unit_test(test_api_listen),
        cmocka_unit_test(test_print_redacts_dsn_forms),
        cmocka_unit_test(test_dsn_password_scrubbed_from_logs),
        cmocka_unit_test(test_kafka_security_checks),
        cmocka_unit_test(test_kafka_security_applied),
        cmocka_unit_test(test_redis_url),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
