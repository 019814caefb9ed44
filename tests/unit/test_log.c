/*
 * Logger: JSON shape, escaping of external data, context fields, level gating (arguments not
 * evaluated when disabled), a flooding call site's one line per interval, and the planted-secret
 * test: a secret registered by the config loader never reaches the output, even when code passes it
 * by mistake.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sl_cfg.h"
#include "common/sl_log.h"

static char *capture_begin(int *fd)
{
    char *path = strdup("/tmp/sl_log_test_XXXXXX");
    *fd = mkstemp(path);
    assert_true(*fd >= 0);
    sl_log_set_fd(*fd);
    return path;
}

static char *capture_end(int fd, char *path)
{
    sl_log_set_fd(2);
    off_t n = lseek(fd, 0, SEEK_END);
    char *buf = calloc(1, (size_t)n + 1);
    assert_int_equal(pread(fd, buf, (size_t)n, 0), n);
    close(fd);
    unlink(path);
    free(path);
    return buf;
}

static int evaluated;
static const char *side_effect(void)
{
    evaluated++;
    return "x";
}

static void test_json_shape_and_escape(void **state)
{
    (void)state;
    sl_log_init("sluice-test", SL_LOG_INFO, 0);
    int fd;
    char *path = capture_begin(&fd);
    struct sl_log_ctx ctx = {.event_id = "evt_1",
                             .endpoint_id = "ep_9",
                             .attempt = 2,
                             .topic = "t",
                             .partition = 3,
                             .offset = 42};
    sl_log_ctx_set(&ctx);
    SL_LOGKV(SL_LOG_WARN, "http", "delivery_failed",
             ((struct sl_log_kv[]){SL_KV_S("host", "a\"b\n"), SL_KV_I("status", 503)}),
             "could not deliver: %s", "quote\" back\\ ctl\x01");
    sl_log_ctx_clear();
    sl_info("cfg", "started", "no context");
    char *out = capture_end(fd, path);
    assert_non_null(strstr(out, "\"level\":\"warn\",\"proc\":\"sluice-test\",\"mod\":\"http\","
                                "\"event\":\"delivery_failed\""));
    assert_non_null(strstr(out, "\"msg\":\"could not deliver: quote\\\" back\\\\ ctl\\u0001\""));
    assert_non_null(strstr(out, "\"event_id\":\"evt_1\",\"endpoint_id\":\"ep_9\",\"attempt\":2,"
                                "\"topic\":\"t\",\"partition\":3,\"offset\":42"));
    assert_non_null(strstr(out, "\"host\":\"a\\\"b\\n\",\"status\":503}\n"));
    /* second line has no context */
    char *second = strstr(out, "}\n") + 2;
    assert_null(strstr(second, "event_id"));
    free(out);
}

static void every_site(int i)
{
    SL_LOGKV_EVERY(60000, SL_LOG_WARN, "x", "flood", ((struct sl_log_kv[]){SL_KV_I("i", i)}),
                   "line %d", i);
}

/* A site under SL_LOG*_EVERY writes one line per interval; the next one counts the dropped. */
static void test_a_flooding_site_writes_one_line_per_interval(void **state)
{
    (void)state;
    sl_log_init("sluice-test", SL_LOG_INFO, 0);
    int fd;
    char *path = capture_begin(&fd);
    for (int i = 0; i < 100; i++)
        every_site(i);
    char *out = capture_end(fd, path);
    assert_non_null(strstr(out, "\"msg\":\"line 0\",\"i\":0}\n"));
    assert_null(strstr(out, "line 1"));
    assert_null(strstr(out, "suppressed"));
    free(out);

    struct sl_log_every e = {0};
    assert_true(sl__log_every_pass(&e, 60000));
    for (int i = 0; i < 999; i++)
        assert_false(sl__log_every_pass(&e, 60000));
    assert_int_equal(atomic_load(&e.dropped), 999);
    atomic_store(&e.next_ms, 0); /* the interval has passed */
    assert_true(sl__log_every_pass(&e, 60000));
    assert_false(sl__log_every_pass(&e, 60000));
    path = capture_begin(&fd);
    sl_warn("x", "next", "the line after the pass");
    sl_warn("x", "later", "an ordinary line");
    out = capture_end(fd, path);
    assert_non_null(strstr(out, "\"msg\":\"the line after the pass\",\"suppressed\":999}\n"));
    assert_non_null(strstr(out, "\"msg\":\"an ordinary line\"}\n"));
    free(out);

    path = capture_begin(&fd);
    SL_LOG_EVERY(1, SL_LOG_WARN, "x", "after", "dropped before it");
    out = capture_end(fd, path);
    assert_non_null(strstr(out, "\"msg\":\"dropped before it\"}\n"));
    free(out);
}

static void test_level_gating(void **state)
{
    (void)state;
    sl_log_init("sluice-test", SL_LOG_WARN, 0);
    int fd;
    char *path = capture_begin(&fd);
    evaluated = 0;
    sl_info("x", "ignored", "%s", side_effect());
    sl_debug(SL_DBG_HTTP, "x", "ignored", "%s", side_effect());
    assert_int_equal(evaluated, 0);
    sl_warn("x", "shown", "%s", side_effect());
    assert_int_equal(evaluated, 1);
    sl_log_init("sluice-test", SL_LOG_DEBUG, SL_DBG_KAFKA);
    sl_debug(SL_DBG_HTTP, "x", "ignored_ctx", "%s", side_effect());
    sl_debug(SL_DBG_KAFKA, "x", "shown_ctx", "%s", side_effect());
    char *out = capture_end(fd, path);
    assert_null(strstr(out, "ignored"));
    assert_non_null(strstr(out, "\"event\":\"shown\""));
    assert_non_null(strstr(out, "\"event\":\"shown_ctx\""));
    assert_int_equal(evaluated, 2);
    free(out);
}

static void test_planted_secret_never_logged(void **state)
{
    (void)state;
    static const char planted[] = "whsec_PLANTEDc2VjcmV0LXZhbHVlLXRoYXQtbXVzdC1ub3QtbGVhaw";
    static const char pgpw[] = "PLANTED-pg-password";
    setenv("SLUICE_MASTER_KEY", planted, 1);
    char dsn[256];
    snprintf(dsn, sizeof(dsn), "host=127.0.0.1 password=%s dbname=x", pgpw);
    setenv("SLUICE_PG_DSN", dsn, 1);
    /* a proxy password with a percent escape: caught as written and as sent (decoded) */
    setenv("SLUICE_DELIVERY_PROXY", "http://u:PLANTED%40proxy@127.0.0.1:3128", 1);
    struct sl_config cfg;
    char *argv[] = {"test", NULL};
    int argc = 1;
    sl_cfg_main_load(&cfg, "sluice-test", &argc, argv);
    int fd;
    char *path = capture_begin(&fd);
    /* Code that (wrongly) passes secrets everywhere: message, kv, context. */
    struct sl_log_ctx ctx = {.event_id = planted, .partition = -1, .offset = -1};
    sl_log_ctx_set(&ctx);
    SL_LOGKV(SL_LOG_ERROR, "x", "leak_attempt", ((struct sl_log_kv[]){SL_KV_S("k", pgpw)}),
             "secret=%s dsn=%s twice=%s%s", planted, cfg.pg_dsn, planted, planted);
    sl_log_ctx_clear();
    char *out = capture_end(fd, path);
    assert_null(strstr(out, "PLANTED"));
    assert_non_null(strstr(out, "[redacted]"));
    free(out);
    /* the same secrets out of a text that is not a log line (libcurl's error texts) */
    char text[256];
    snprintf(text, sizeof(text), "failed: %s and %s, twice %s", pgpw, planted, pgpw);
    sl_log_scrub(text);
    assert_string_equal(text, "failed: [redacted] and [redacted], twice [redacted]");
    snprintf(text, sizeof(text), "proxy u:PLANTED%%40proxy, sent as PLANTED@proxy");
    sl_log_scrub(text);
    assert_string_equal(text, "proxy u:[redacted], sent as [redacted]");
    sl_log_scrub(NULL);
    /* an endpoint secret nobody registered is still caught by its whsec_ form */
    path = capture_begin(&fd);
    sl_warn("x", "leak_attempt", "endpoint secret whsec_UNREGISTEREDc2VjcmV0IHZhbHVl+/= end");
    out = capture_end(fd, path);
    assert_null(strstr(out, "UNREGISTERED"));
    assert_non_null(strstr(out, "whsec_[redacted] end"));
    free(out);
    /* so is an Ed25519 private key (whsk_); its public key (whpk_) is not secret */
    path = capture_begin(&fd);
    sl_warn("x", "leak_attempt", "key whsk_EDUNREGISTEREDc2VlZA+/= pub whpk_PUBLICc2VlZA= end");
    out = capture_end(fd, path);
    assert_null(strstr(out, "EDUNREGISTERED"));
    assert_non_null(strstr(out, "whsk_[redacted] pub whpk_PUBLICc2VlZA= end"));
    free(out);
    sl_log_clear_secrets();
    sl_cfg_fini(&cfg);
    unsetenv("SLUICE_MASTER_KEY");
    unsetenv("SLUICE_PG_DSN");
    unsetenv("SLUICE_DELIVERY_PROXY");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_shape_and_escape),
        cmocka_unit_test(test_level_gating),
        cmocka_unit_test(test_a_flooding_site_writes_one_line_per_interval),
        cmocka_unit_test(test_planted_secret_never_logged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
