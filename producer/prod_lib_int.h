/*
 * prod_lib internals for tests only (not part of the sluice_producer API): the Kafka handle,
 * so a test can inject a fatal error with rd_kafka_test_fatal_error().
 */
#ifndef PROD_LIB_INT_H
#define PROD_LIB_INT_H

#include <librdkafka/rdkafka.h>

#include "producer/sluice_producer.h"

/* The producer's librdkafka handle (borrowed; owned by p). */
rd_kafka_t *prod_lib_kafka(sluice_producer_t *p);

#endif /* PROD_LIB_INT_H */
