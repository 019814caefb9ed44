/*
 * sl_kafka: librdkafka set-up shared by every process, so each one talks to Kafka the same
 * way: bootstrap servers and transport security (TLS, SASL) from config, librdkafka's own
 * log lines routed through sl_log (with the level mapped), Nagle off (2.0.2 defaults it on),
 * an error callback that logs state changes (authentication and TLS failures by name), and
 * the producer/consumer property sets that the delivery guarantees rest on.
 *
 * thread: creation on any thread; the callbacks installed here run on librdkafka threads and
 * only log.
 */
#ifndef SL_KAFKA_H
#define SL_KAFKA_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"

/* Largest Kafka record Sluice produces or accepts: the client's message.max.bytes and the
 * topics' max.message.bytes (a 16 MiB body cap is the config maximum; 1 MiB the default). */
#define SL_KAFKA_MAX_MESSAGE_BYTES "20971520"

enum sl_kafka_profile {
    SL_KAFKA_THROUGHPUT, /* producer: linger 50 ms, large batches, lz4 */
    SL_KAFKA_LATENCY,    /* producer: linger 2 ms (outcomes/quarantine on the delivery path) */
};

/*
 * New conf with the common properties: bootstrap.servers, client.id (role + instance),
 * security.protocol with its SASL and TLS settings (kafka_security_protocol and companions),
 * log_cb -> sl_log, error_cb, socket.nagle.disable. Every Kafka client of every process is
 * made from it. Returns NULL and fills err on a bad property. Caller owns the conf until it
 * is handed to rd_kafka_new.
 */
rd_kafka_conf_t *sl_kafka_conf_new(const struct sl_config *cfg, const char *role, sl_err_t *err);

/*
 * Log an error librdkafka reported (its error_cb): a failed SASL authentication as
 * kafka_auth_failed and a failed TLS handshake as kafka_tls_failed (error level, naming the
 * Sluice options to check), a fatal error as kafka_fatal, anything else as kafka_error
 * (warn). rk may be NULL. For callers that install their own error_cb.
 */
void sl_kafka_log_error(rd_kafka_t *rk, int err, const char *reason);

/* The level (SL_LOG_*) at which a librdkafka log line (syslog level, facility, text) is
 * logged: librdkafka's, except transient notices it retries by itself (a new broker's
 * coordinator still loading), which are debug. */
int sl_kafka_log_level(int level, const char *fac, const char *buf);

/* Set one property; returns 0 or SL_EKAFKA with the property named in err. */
int sl_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, sl_err_t *err);

/* linger.ms of each profile, ms. */
#define SL_KAFKA_THROUGHPUT_LINGER_MS 50
#define SL_KAFKA_LATENCY_LINGER_MS    2

/*
 * An idempotent producer (acks=all, enable.idempotence=true) tuned by profile. conf may be
 * NULL (a fresh common conf is made); it is consumed in every case. dr_msg_cb may be NULL.
 */
rd_kafka_t *
sl_kafka_producer_new(const struct sl_config *cfg,
                      const char *role,
                      enum sl_kafka_profile profile,
                      rd_kafka_conf_t *conf,
                      void (*dr_msg_cb)(rd_kafka_t *, const rd_kafka_message_t *, void *),
                      sl_err_t *err);

/* As sl_kafka_producer_new with linger_ms (>= 0) as linger.ms, how long a record may wait for
 * others to share its batch (the profiles differ only in it). */
rd_kafka_t *
sl_kafka_producer_new_linger(const struct sl_config *cfg,
                             const char *role,
                             int64_t linger_ms,
                             rd_kafka_conf_t *conf,
                             void (*dr_msg_cb)(rd_kafka_t *, const rd_kafka_message_t *, void *),
                             sl_err_t *err);

/*
 * A group consumer with manual offset storing (enable.auto.offset.store=false, auto commit
 * of stored offsets), the eager roundrobin assignor (cooperative-sticky has hangs and loops
 * in 2.0.2, see docs), auto.offset.reset=earliest. conf consumed in every case.
 */
rd_kafka_t *sl_kafka_consumer_new(const struct sl_config *cfg,
                                  const char *role,
                                  const char *group_id,
                                  rd_kafka_conf_t *conf,
                                  sl_err_t *err);

/*
 * A consumer that reads partitions it assigns itself and never joins its group: group.id
 * (offsets are looked up under it, never committed), auto commit and offset store off, then
 * the name/value pairs of extra (NULL-terminated, may be NULL). NULL with err.
 */
rd_kafka_t *sl_kafka_reader_new(const struct sl_config *cfg,
                                const char *role,
                                const char *group_id,
                                const char *const *extra,
                                sl_err_t *err);

/* Produce with bounded retry on a full local queue (polls while waiting). Copies key and
 * value. Returns 0 or SL_EKAFKA / SL_ETIMEDOUT. */
int sl_kafka_produce(rd_kafka_t *rk,
                     const char *topic,
                     const void *key,
                     size_t keylen,
                     const void *val,
                     size_t vallen,
                     void *msg_opaque,
                     int max_wait_ms,
                     sl_err_t *err);
/* The same with a copy of hdrs (NULL = no headers) on the record. */
int sl_kafka_produce_hdrs(rd_kafka_t *rk,
                          const char *topic,
                          const void *key,
                          size_t keylen,
                          const void *val,
                          size_t vallen,
                          const rd_kafka_headers_t *hdrs,
                          void *msg_opaque,
                          int max_wait_ms,
                          sl_err_t *err);

/* Flush with a bound; returns 0, or SL_ETIMEDOUT with the number left in err. */
int sl_kafka_flush(rd_kafka_t *rk, int timeout_ms, sl_err_t *err);

#endif /* SL_KAFKA_H */
