/*
 * Kafka helpers for integration tests and benchmarks: create / delete a topic on the real
 * broker with librdkafka's Admin API (the stack runs with auto.create.topics.enable=false, so
 * every test creates its own uniquely named topics), and make such unique names.
 *
 * Header-only (static functions) so any test_*.c can include it without CMake changes.
 * thread: any; each call makes and destroys its own short-lived admin client.
 */
#ifndef SL_TEST_KAFKA_H
#define SL_TEST_KAFKA_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#define SL_TEST_KAFKA_ADMIN_TIMEOUT_MS 30000 /* ms; per admin operation */

/* "<prefix>.<unix ms hex>.<pid>.<random>" into out (always NUL-terminated). */
static inline void sl_test_topic_name(char *out, size_t cap, const char *prefix)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned r = (unsigned)ts.tv_nsec ^ ((unsigned)getpid() << 16);
    snprintf(out, cap, "%s.%llx.%d.%04x", prefix,
             (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000,
             (int)getpid(), r & 0xffffu);
}

static inline rd_kafka_t *sl_test__admin_client(const char *brokers, char *errstr, size_t cap)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr, cap) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, cap);
    if (!rk)
        rd_kafka_conf_destroy(conf);
    return rk;
}

/*
 * Wait for the admin result on q and check the single topic result. Returns 0 or -1 with
 * errstr filled. ok_err: a per-topic error that counts as success (e.g. already exists).
 */
static inline int sl_test__admin_wait(
    rd_kafka_queue_t *q, int create, rd_kafka_resp_err_t ok_err, char *errstr, size_t cap)
{
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, SL_TEST_KAFKA_ADMIN_TIMEOUT_MS + 5000);
    if (!ev) {
        snprintf(errstr, cap, "no admin result within %d ms", SL_TEST_KAFKA_ADMIN_TIMEOUT_MS);
        return -1;
    }
    int rc = 0;
    if (rd_kafka_event_error(ev)) {
        snprintf(errstr, cap, "%s", rd_kafka_event_error_string(ev));
        rc = -1;
    } else {
        size_t n = 0;
        const rd_kafka_topic_result_t **res =
            create
                ? rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n)
                : rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev), &n);
        if (n != 1) {
            snprintf(errstr, cap, "expected 1 topic result, got %zu", n);
            rc = -1;
        } else if (rd_kafka_topic_result_error(res[0]) != RD_KAFKA_RESP_ERR_NO_ERROR &&
                   rd_kafka_topic_result_error(res[0]) != ok_err) {
            const char *s = rd_kafka_topic_result_error_string(res[0]);
            snprintf(errstr, cap, "%s: %s", rd_kafka_err2name(rd_kafka_topic_result_error(res[0])),
                     s ? s : "");
            rc = -1;
        }
    }
    rd_kafka_event_destroy(ev);
    return rc;
}

/*
 * Create topic with partitions partitions (replication factor 1) and wait until the broker
 * reports it created. An existing topic is an error (test topics are unique). Returns 0 or
 * -1 with errstr filled.
 */
static inline int sl_test_topic_create(
    const char *brokers, const char *topic, int partitions, char *errstr, size_t cap)
{
    rd_kafka_t *rk = sl_test__admin_client(brokers, errstr, cap);
    if (!rk)
        return -1;
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, partitions, 1, errstr, cap);
    int rc = -1;
    if (nt) {
        rd_kafka_AdminOptions_t *ao = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
        char e2[128];
        (void)rd_kafka_AdminOptions_set_operation_timeout(ao, SL_TEST_KAFKA_ADMIN_TIMEOUT_MS, e2,
                                                          sizeof(e2));
        rd_kafka_CreateTopics(rk, &nt, 1, ao, q);
        rc = sl_test__admin_wait(q, 1, RD_KAFKA_RESP_ERR_NO_ERROR, errstr, cap);
        rd_kafka_AdminOptions_destroy(ao);
        rd_kafka_NewTopic_destroy(nt);
    }
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return rc;
}

/* Delete topic (an unknown topic counts as deleted). Returns 0 or -1 with errstr filled. */
static inline int
sl_test_topic_delete(const char *brokers, const char *topic, char *errstr, size_t cap)
{
    rd_kafka_t *rk = sl_test__admin_client(brokers, errstr, cap);
    if (!rk)
        return -1;
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_DeleteTopic_t *dt = rd_kafka_DeleteTopic_new(topic);
    rd_kafka_AdminOptions_t *ao = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DELETETOPICS);
    char e2[128];
    (void)rd_kafka_AdminOptions_set_operation_timeout(ao, SL_TEST_KAFKA_ADMIN_TIMEOUT_MS, e2,
                                                      sizeof(e2));
    rd_kafka_DeleteTopics(rk, &dt, 1, ao, q);
    int rc = sl_test__admin_wait(q, 0, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, errstr, cap);
    rd_kafka_AdminOptions_destroy(ao);
    rd_kafka_DeleteTopic_destroy(dt);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return rc;
}

#endif /* SL_TEST_KAFKA_H */
