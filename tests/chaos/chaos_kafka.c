/*
 * sl-chaos-kafka: the two Kafka questions the chaos suite asks that no Sluice tool answers.
 *
 *   sl-chaos-kafka lag GROUP TOPIC       committed offsets of GROUP against the high
 *                                        watermarks of TOPIC ("offsets committed, lag 0")
 *   sl-chaos-kafka delete TOPIC...       delete a finished scenario's topics, so the broker
 *                                        stays small (a broker killed with -9 recovers every
 *                                        log on restart)
 *
 * The broker comes from SLUICE_KAFKA_BROKERS.
 *
 * lag prints one JSON line per partition, {"partition":P,"committed":C,"low":L,"high":H,
 * "lag":N}, then {"total_lag":N}. A partition without a committed offset counts as committed
 * at its low watermark (an empty partition has no lag). The group is only queried, never
 * joined. Exit 0 when the total lag is 0, 3 when it is not.
 *
 * delete waits for the broker's answer; a topic that does not exist counts as deleted.
 * Exit 0 when every topic is gone.
 *
 * Both: exit 1 on an error (reason on stderr), 2 on usage errors.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#define CK_TIMEOUT_MS 10000 /* ms; per metadata / offsets / admin request */
#define CK_MAX_PARTS  4096  /* partitions looked at, at most */
#define CK_MAX_TOPICS 64    /* topics per delete call */

static int usage(void)
{
    fprintf(stderr, "usage: sl-chaos-kafka lag GROUP TOPIC | delete TOPIC...\n"
                    "       (broker from SLUICE_KAFKA_BROKERS)\n");
    return 2;
}

/* A client of the given type on the broker, with group.id when group is non-NULL. */
static rd_kafka_t *client_new(rd_kafka_type_t type, const char *brokers, const char *group)
{
    char errstr[512] = "";
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK ||
        (group &&
         (rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
          rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr)) !=
              RD_KAFKA_CONF_OK))) {
        fprintf(stderr, "sl-chaos-kafka: cannot configure the client: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "sl-chaos-kafka: could not create a kafka client: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

static int lag_main(const char *brokers, const char *group, const char *topic)
{
    rd_kafka_topic_partition_list_t *parts = NULL;
    const struct rd_kafka_metadata *md = NULL;
    int rc = 1;
    rd_kafka_t *rk = client_new(RD_KAFKA_CONSUMER, brokers, group);
    if (!rk)
        return 1;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t ke = rd_kafka_metadata(rk, 0, rkt, &md, CK_TIMEOUT_MS);
    rd_kafka_topic_destroy(rkt);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1 || md->topics[0].err) {
        fprintf(stderr, "sl-chaos-kafka: could not read metadata of the topic: %s\n",
                rd_kafka_err2str(ke              ? ke
                                 : md->topic_cnt ? md->topics[0].err
                                                 : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
        goto out;
    }
    int n = md->topics[0].partition_cnt;
    if (n > CK_MAX_PARTS)
        n = CK_MAX_PARTS;
    parts = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(parts, topic, md->topics[0].partitions[i].id);
    ke = rd_kafka_committed(rk, parts, CK_TIMEOUT_MS);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "sl-chaos-kafka: could not read the committed offsets: %s\n",
                rd_kafka_err2str(ke));
        goto out;
    }
    int64_t total = 0;
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *p = &parts->elems[i];
        int64_t lo = 0, hi = 0;
        if (p->err) {
            fprintf(stderr, "sl-chaos-kafka: partition %" PRId32 ": %s\n", p->partition,
                    rd_kafka_err2str(p->err));
            goto out;
        }
        ke = rd_kafka_query_watermark_offsets(rk, topic, p->partition, &lo, &hi, CK_TIMEOUT_MS);
        if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr,
                    "sl-chaos-kafka: could not read the watermarks of partition %" PRId32 ": %s\n",
                    p->partition, rd_kafka_err2str(ke));
            goto out;
        }
        int64_t committed = p->offset >= 0 ? p->offset : lo;
        int64_t lag = hi - committed;
        if (lag < 0)
            lag = 0;
        total += lag;
        printf("{\"partition\":%" PRId32 ",\"committed\":%" PRId64 ",\"low\":%" PRId64
               ",\"high\":%" PRId64 ",\"lag\":%" PRId64 "}\n",
               p->partition, p->offset, lo, hi, lag);
    }
    printf("{\"total_lag\":%" PRId64 "}\n", total);
    rc = total == 0 ? 0 : 3;
out:
    if (parts)
        rd_kafka_topic_partition_list_destroy(parts);
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_destroy(rk);
    return rc;
}

static int delete_main(const char *brokers, int n, char **topics)
{
    rd_kafka_DeleteTopic_t *del[CK_MAX_TOPICS];
    rd_kafka_queue_t *q = NULL;
    rd_kafka_event_t *ev = NULL;
    int rc = 1;
    if (n < 1 || n > CK_MAX_TOPICS)
        return usage();
    rd_kafka_t *rk = client_new(RD_KAFKA_PRODUCER, brokers, NULL);
    if (!rk)
        return 1;
    for (int i = 0; i < n; i++)
        del[i] = rd_kafka_DeleteTopic_new(topics[i]);
    q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *opt = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DELETETOPICS);
    char errstr[256];
    if (rd_kafka_AdminOptions_set_operation_timeout(opt, CK_TIMEOUT_MS, errstr, sizeof(errstr)) !=
        RD_KAFKA_RESP_ERR_NO_ERROR)
        fprintf(stderr, "sl-chaos-kafka: %s (using the default timeout)\n", errstr);
    rd_kafka_DeleteTopics(rk, del, (size_t)n, opt, q);
    rd_kafka_AdminOptions_destroy(opt);
    ev = rd_kafka_queue_poll(q, CK_TIMEOUT_MS + 5000);
    if (!ev) {
        fprintf(stderr, "sl-chaos-kafka: no answer to the delete within %d ms\n",
                CK_TIMEOUT_MS + 5000);
        goto out;
    }
    if (rd_kafka_event_error(ev)) {
        fprintf(stderr, "sl-chaos-kafka: could not delete topics: %s\n",
                rd_kafka_event_error_string(ev));
        goto out;
    }
    size_t cnt = 0;
    const rd_kafka_topic_result_t **res =
        rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev), &cnt);
    rc = 0;
    for (size_t i = 0; i < cnt; i++) {
        rd_kafka_resp_err_t e = rd_kafka_topic_result_error(res[i]);
        if (e != RD_KAFKA_RESP_ERR_NO_ERROR && e != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
            fprintf(stderr, "sl-chaos-kafka: could not delete %s: %s\n",
                    rd_kafka_topic_result_name(res[i]), rd_kafka_err2str(e));
            rc = 1;
        }
    }
out:
    if (ev)
        rd_kafka_event_destroy(ev);
    if (q)
        rd_kafka_queue_destroy(q);
    rd_kafka_DeleteTopic_destroy_array(del, (size_t)n);
    rd_kafka_destroy(rk);
    return rc;
}

int main(int argc, char **argv)
{
    const char *brokers = getenv("SLUICE_KAFKA_BROKERS");
    if (argc < 2)
        return usage();
    if (!brokers || !*brokers) {
        fprintf(stderr, "sl-chaos-kafka: SLUICE_KAFKA_BROKERS is not set\n");
        return 1;
    }
    if (strcmp(argv[1], "lag") == 0 && argc == 4)
        return lag_main(brokers, argv[2], argv[3]);
    if (strcmp(argv[1], "delete") == 0 && argc >= 3)
        return delete_main(brokers, argc - 2, argv + 2);
    return usage();
}
