/*
 * test_kafka_log: the level at which librdkafka's log lines are logged (sl_kafka_log_level).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/sl_kafka.h"
#include "common/sl_log.h"

static void test_levels_follow_syslog(void **state)
{
    (void)state;
    assert_int_equal(sl_kafka_log_level(3, "FAIL", "x: Connect failed"), SL_LOG_ERROR);
    assert_int_equal(sl_kafka_log_level(4, "REQTMOUT", "timed out"), SL_LOG_WARN);
    assert_int_equal(sl_kafka_log_level(5, "CONFWARN", "x"), SL_LOG_INFO);
    assert_int_equal(sl_kafka_log_level(6, "INFO", "x"), SL_LOG_INFO);
    assert_int_equal(sl_kafka_log_level(7, "BROKER", "x"), SL_LOG_DEBUG);
}

static void test_a_new_brokers_coordinator_loading_is_debug(void **state)
{
    (void)state;
    /* librdkafka 2.0.2's text on a broker just started (it retries on its own) */
    const char *loading = "Failed to acquire idempotence PID from broker 127.0.0.1:19092/1: "
                          "Broker: Coordinator load in progress: retrying";
    assert_int_equal(sl_kafka_log_level(4, "GETPID", loading), SL_LOG_DEBUG);
    /* anything else about the producer id stays a warning */
    assert_int_equal(sl_kafka_log_level(4, "GETPID",
                                        "Failed to acquire idempotence PID from broker "
                                        "127.0.0.1:19092/1: Broker: Cluster authorization "
                                        "failed: retrying"),
                     SL_LOG_WARN);
    assert_int_equal(sl_kafka_log_level(4, "REQERR", loading), SL_LOG_WARN);
    assert_int_equal(sl_kafka_log_level(3, "GETPID", loading), SL_LOG_ERROR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_follow_syslog),
        cmocka_unit_test(test_a_new_brokers_coordinator_loading_is_debug),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
