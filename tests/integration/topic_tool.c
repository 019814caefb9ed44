/*
 * sl-test-topic: create or delete one Kafka topic on the broker in SLUICE_KAFKA_BROKERS, for
 * scripts (bench/produce.sh) that need a private topic on a broker with auto-create off.
 *
 *   sl-test-topic create TOPIC [PARTITIONS]   (default 4 partitions, replication 1)
 *   sl-test-topic delete TOPIC
 *   sl-test-topic name PREFIX                 print a unique topic name
 *
 * Exit 0 on success, 1 with a reason on stderr, 2 on usage errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sl_test_kafka.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: sl-test-topic create TOPIC [PARTITIONS] | delete TOPIC | name PREFIX\n");
    return 2;
}

int main(int argc, char **argv)
{
    char errstr[512] = "";
    if (argc >= 3 && strcmp(argv[1], "name") == 0) {
        char name[256];
        sl_test_topic_name(name, sizeof(name), argv[2]);
        printf("%s\n", name);
        return 0;
    }
    const char *brokers = getenv("SLUICE_KAFKA_BROKERS");
    if (!brokers || !*brokers) {
        fprintf(stderr, "sl-test-topic: SLUICE_KAFKA_BROKERS is not set\n");
        return 1;
    }
    if (argc >= 3 && argc <= 4 && strcmp(argv[1], "create") == 0) {
        long parts = 4;
        if (argc == 4) {
            char *end = NULL;
            parts = strtol(argv[3], &end, 10);
            if (!end || *end || parts < 1 || parts > 1000)
                return usage();
        }
        if (sl_test_topic_create(brokers, argv[2], (int)parts, errstr, sizeof(errstr)) != 0) {
            fprintf(stderr, "sl-test-topic: could not create topic %s at %s: %s\n", argv[2],
                    brokers, errstr);
            return 1;
        }
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "delete") == 0) {
        if (sl_test_topic_delete(brokers, argv[2], errstr, sizeof(errstr)) != 0) {
            fprintf(stderr, "sl-test-topic: could not delete topic %s at %s: %s\n", argv[2],
                    brokers, errstr);
            return 1;
        }
        return 0;
    }
    return usage();
}
