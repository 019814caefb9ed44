/*
 * Unit tests for common/sl_metrics (registration, text exposition: HELP/TYPE once per family,
 * label escaping, cumulative histogram buckets with +Inf, _sum and _count, truncation
 * reported), common/sl_kstats (lag rows from a librdkafka statistics document) and the
 * liveness heartbeats of common/sl_probe.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_err.h"
#include "common/sl_kstats.h"
#include "common/sl_mem.h"
#include "common/sl_metrics.h"
#include "common/sl_probe.h"

static char *render(void)
{
    struct sl_buf b;
    sl_buf_init(&b, 1 << 20);
    assert_int_equal(sl_metrics_render(&b), 0);
    char *s = sl_xstrdup((const char *)b.data);
    sl_buf_fini(&b);
    return s;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static int reset(void **state)
{
    (void)state;
    sl_metrics_reset_for_tests();
    return 0;
}

static void test_counters_gauges_and_families(void **state)
{
    (void)state;
    sl_metrics_set_process("unit");
    sl_counter_t *a = sl_metric_counter("t_events_total", "Events.", "kind=\"a\"");
    sl_counter_t *b = sl_metric_counter("t_events_total", "Events.", "kind=\"b\"");
    assert_ptr_equal(a, sl_metric_counter("t_events_total", "Events.", "kind=\"a\""));
    assert_ptr_not_equal(a, b);
    sl_gauge_t *g = sl_metric_gauge("t_level", "Level.", NULL);
    sl_counter_add(a, 41);
    sl_counter_inc(a);
    sl_counter_inc(b);
    sl_gauge_set(g, 10);
    sl_gauge_add(g, -3);
    sl_counter_inc(NULL); /* never registered: a no-op */
    char *s = render();
    assert_int_equal(count(s, "# TYPE t_events_total counter\n"), 1);
    assert_int_equal(count(s, "# HELP t_events_total Events.\n"), 1);
    assert_non_null(strstr(s, "t_events_total{kind=\"a\"} 42\n"));
    assert_non_null(strstr(s, "t_events_total{kind=\"b\"} 1\n"));
    assert_non_null(strstr(s, "# TYPE t_level gauge\nt_level 7\n"));
    assert_non_null(
        strstr(s, "sluice_build_info{process=\"unit\",version=\"" SL_VERSION "\"} 1\n"));
    assert_non_null(strstr(s, "\nprocess_open_fds "));
    assert_non_null(strstr(s, "\nprocess_cpu_seconds_total "));
    free(s);
}

static void test_histogram_is_cumulative(void **state)
{
    (void)state;
    sl_histo_t *h = sl_metric_histo("t_seconds", "Durations.", "phase=\"x\"");
    sl_histo_observe_us(h, 500);       /* <= 0.001 */
    sl_histo_observe_us(h, 1000);      /* <= 0.001: bounds are inclusive */
    sl_histo_observe_us(h, 20000);     /* <= 0.025 */
    sl_histo_observe_us(h, 120000000); /* past 60 s: +Inf only */
    sl_histo_observe_us(h, -5);        /* counts as 0 */
    char *s = render();
    assert_non_null(strstr(s, "t_seconds_bucket{phase=\"x\",le=\"0.001\"} 3\n"));
    assert_non_null(strstr(s, "t_seconds_bucket{phase=\"x\",le=\"0.01\"} 3\n"));
    assert_non_null(strstr(s, "t_seconds_bucket{phase=\"x\",le=\"0.025\"} 4\n"));
    assert_non_null(strstr(s, "t_seconds_bucket{phase=\"x\",le=\"60\"} 4\n"));
    assert_non_null(strstr(s, "t_seconds_bucket{phase=\"x\",le=\"+Inf\"} 5\n"));
    assert_non_null(strstr(s, "t_seconds_count{phase=\"x\"} 5\n"));
    assert_non_null(strstr(s, "t_seconds_sum{phase=\"x\"} 120.0215\n"));
    assert_int_equal(count(s, "t_seconds_bucket{"), SL_HISTO_NB + 1);
    free(s);
}

static void write_escaped(struct sl_buf *out, void *arg)
{
    (void)arg;
    struct sl_buf lb;
    sl_buf_init(&lb, 256);
    sl_metrics_label(&lb, "endpoint", "a\"b\\c\nd");
    sl_metrics_label(&lb, "n", "1");
    sl_metrics_write_head(out, "t_dyn", "gauge", "Help with \\ and\nnewline.");
    sl_metrics_write_sample(out, "t_dyn", (const char *)lb.data, 2.5);
    sl_metrics_write_sample(out, "t_nan", NULL, NAN); /* unknown: the format's NaN */
    sl_metrics_write_sample(out, "t_inf", NULL, -INFINITY);
    sl_buf_fini(&lb);
}

static void test_collector_and_escaping(void **state)
{
    (void)state;
    sl_metrics_collector(write_escaped, NULL);
    char *s = render();
    assert_non_null(strstr(s, "# HELP t_dyn Help with \\\\ and\\nnewline.\n"));
    assert_non_null(strstr(s, "t_dyn{endpoint=\"a\\\"b\\\\c\\nd\",n=\"1\"} 2.5\n"));
    assert_non_null(strstr(s, "\nt_nan NaN\n"));
    assert_non_null(strstr(s, "\nt_inf -Inf\n"));
    free(s);
    sl_metrics_collector_remove(write_escaped, NULL);
    s = render();
    assert_null(strstr(s, "t_dyn"));
    free(s);
}

static void test_truncation_is_reported(void **state)
{
    (void)state;
    for (int i = 0; i < 50; i++) {
        char labels[32];
        snprintf(labels, sizeof(labels), "i=\"%d\"", i);
        sl_counter_inc(sl_metric_counter("t_many_total", "Many.", labels));
    }
    struct sl_buf b;
    sl_buf_init(&b, 512);
    assert_int_equal(sl_metrics_render(&b), SL_ETOOBIG);
    sl_buf_fini(&b);
}

static const char STATS[] = "{\"name\":\"c#consumer-1\",\"type\":\"consumer\",\"topics\":{"
                            "\"d\":{\"topic\":\"d\",\"partitions\":{"
                            "\"0\":{\"partition\":0,\"desired\":true,\"consumer_lag\":7},"
                            "\"1\":{\"partition\":1,\"desired\":false,\"consumer_lag\":100},"
                            "\"2\":{\"partition\":2,\"desired\":true,\"consumer_lag\":-1,"
                            "\"lo_offset\":0,\"hi_offset\":40},"
                            "\"-1\":{\"partition\":-1,\"desired\":false,\"consumer_lag\":-1}}},"
                            "\"e\":{\"topic\":\"e\",\"partitions\":{"
                            "\"3\":{\"partition\":3,\"desired\":true,\"consumer_lag\":5},"
                            "\"4\":{\"partition\":4,\"desired\":true,\"consumer_lag\":-1,"
                            "\"lo_offset\":12,\"hi_offset\":12}}}}}";

static void test_kstats_lag_rows(void **state)
{
    (void)state;
    size_t rows = 99;
    bool known = true;
    sl_kstats_forget("c#consumer-1");
    sl_kstats_forget("c#consumer-2");
    (void)sl_kstats_total_lag(&rows, &known);
    assert_int_equal(sl_kstats_update("c#consumer-1", "not json", 8), -1);
    assert_int_equal(sl_kstats_update("c#consumer-1", "{\"x\":1}", 7), -1);
    assert_int_equal(sl_kstats_update("c#consumer-1", STATS, strlen(STATS)), 0);
    /* assigned partitions with a known lag: d/0 (7), e/3 (5) and e/4 (empty: nothing to
     * consume, 0); d/2's is not known (records, nothing committed yet) */
    assert_int_equal(sl_kstats_total_lag(&rows, &known), 12);
    assert_int_equal(rows, 3);
    assert_true(known);
    assert_int_equal(sl_kstats_unknown(), 1);
    /* a second document of the same client replaces its rows; another client adds */
    assert_int_equal(sl_kstats_update("c#consumer-1", STATS, strlen(STATS)), 0);
    assert_int_equal(sl_kstats_update("c#consumer-2", STATS, strlen(STATS)), 0);
    assert_int_equal(sl_kstats_total_lag(&rows, NULL), 24);
    assert_int_equal(rows, 6);
    sl_kstats_forget("c#consumer-2");
    assert_int_equal(sl_kstats_total_lag(&rows, NULL), 12);
    sl_kstats_forget("c#consumer-1");
    assert_int_equal(sl_kstats_total_lag(&rows, NULL), 0);
    assert_int_equal(rows, 0);
    assert_int_equal(sl_kstats_unknown(), 0);
}

static void test_kstats_collector_renders_rows(void **state)
{
    (void)state;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    sl_err_t err;
    assert_int_equal(sl_kstats_enable(conf, 5000, &err), 0);
    rd_kafka_conf_destroy(conf);
    sl_kstats_forget("c#consumer-1");
    char *s = render(); /* an empty table: the family head, no sample */
    assert_non_null(strstr(s, "# TYPE sluice_kafka_consumer_lag_records gauge\n"));
    assert_null(strstr(s, "sluice_kafka_consumer_lag_records{"));
    free(s);
    assert_int_equal(sl_kstats_update("c#consumer-1", STATS, strlen(STATS)), 0);
    s = render();
    assert_non_null(strstr(s,
                           "sluice_kafka_consumer_lag_records{topic=\"d\",partition=\"0\"} 7\n"
                           "sluice_kafka_consumer_lag_records{topic=\"e\",partition=\"3\"} 5\n"));
    free(s);
    sl_kstats_forget("c#consumer-1");
}

static void test_heartbeats(void **state)
{
    (void)state;
    char name[32] = "";
    assert_true(sl_probe_live(1000000, 100, name, sizeof(name))); /* nothing registered */
    int a = sl_probe_beat_register("loop a");
    int b = sl_probe_beat_register("loop b");
    assert_true(a >= 0 && b >= 0 && a != b);
    sl_probe_beat(a, 5000);
    sl_probe_beat(b, 5000);
    assert_true(sl_probe_live(5100, 100, name, sizeof(name)));
    sl_probe_beat(a, 5150);
    assert_false(sl_probe_live(5200, 100, name, sizeof(name))); /* b is 200 ms old */
    assert_string_equal(name, "loop b");
    sl_probe_beat_release(b); /* a loop that ended is not judged */
    assert_true(sl_probe_live(5200, 100, name, sizeof(name)));
    sl_probe_beat_release(a);
}

static void test_listen_address(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    sl_err_t err;
    assert_int_equal(sl_listen_addr("127.0.0.1:9100", "metrics_listen", &ss, &err), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(sl_listen_addr("[::1]:9100", "metrics_listen", &ss, &err), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_not_equal(sl_listen_addr("nocolon", "metrics_listen", &ss, &err), 0);
    assert_non_null(strstr(err.msg, "metrics_listen"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_counters_gauges_and_families, reset),
        cmocka_unit_test_setup(test_histogram_is_cumulative, reset),
        cmocka_unit_test_setup(test_collector_and_escaping, reset),
        cmocka_unit_test_setup(test_truncation_is_reported, reset),
        cmocka_unit_test(test_kstats_lag_rows),
        cmocka_unit_test_setup(test_kstats_collector_renders_rows, reset),
        cmocka_unit_test(test_heartbeats),
        cmocka_unit_test(test_listen_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
