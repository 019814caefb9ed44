/*
 * sluice_producer: the C API applications use to publish deliveries to Sluice.
 *
 * A publish validates the delivery against the record contract (schemas/README.md) and
 * encodes it before anything reaches Kafka, so a bad record is an error returned to the
 * caller and never a record a consumer has to quarantine. Good records go to
 * cfg->topic_deliveries with key = endpoint id, through an idempotent producer (acks=all,
 * enable.idempotence=true, the SL_KAFKA_THROUGHPUT batching profile of common/sl_kafka, with
 * linger.ms from opts.linger_ms, 5 ms by default).
 *
 * Completion: every successful publish gets exactly one done(opaque, status, reason) call,
 * made from a Kafka delivery report: status 0 when Kafka acknowledged the record (written to
 * all in-sync replicas), a negative SL_E* code and a reason when it failed permanently, was
 * not acknowledged within message_timeout_ms, or the producer was destroyed first. A failure
 * report does not prove the record is absent from the log (a purged in-flight request may
 * still have been written), but a success report always means acknowledged: never guess
 * towards success. Async rule: a publish that returns an error never calls done.
 *
 * Delivery reports are served only inside sluice_producer_poll/flush/destroy, and by
 * sluice_producer_publish while it waits for room in a full local queue; an application
 * must therefore call sluice_producer_poll regularly (or flush).
 *
 * thread: publish may be called concurrently from any number of threads. poll and flush may
 * be called from any thread; done runs on the thread that serves the report (one of the
 * above), so done must be thread-safe when several threads publish or poll. destroy must not
 * race with any other call on the same producer.
 */
#ifndef SLUICE_PRODUCER_H
#define SLUICE_PRODUCER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_record.h"

typedef struct sluice_producer sluice_producer_t;

/*
 * Completion callback. status: 0 = acknowledged by Kafka; SL_ETIMEDOUT = not acknowledged in
 * time (message timeout, or destroyed before the acknowledgement); SL_EKAFKA = Kafka refused
 * the record permanently or the producer hit a fatal error. reason: NULL when status is 0,
 * else a human message (borrowed, valid only during the call; never contains the payload).
 */
typedef void (*sluice_done_fn)(void *opaque, int status, const char *reason);

/* Tuning knobs; zero fields take the defaults. */
struct sluice_producer_opts {
    int64_t message_timeout_ms; /* ms Kafka may take to acknowledge one record, retries
                                   included (message.timeout.ms); 0 = 120000 */
    int64_t enqueue_timeout_ms; /* ms publish waits for room in a full local queue before
                                   failing with SL_ETIMEDOUT; 0 = message_timeout_ms */
    int64_t close_timeout_ms;   /* ms destroy waits for outstanding acknowledgements before
                                   purging them; 0 = 10000; < 0 = do not wait */
    const char *role;           /* client.id role (borrowed); NULL = "sluice-producer" */
    int64_t linger_ms;          /* ms a record may wait for others to share its batch
                                   (linger.ms); 0 = 5 (librdkafka's default and Kafka
                                   4.0's); 1..900: every record waits up to this long
                                   before it is even sent, and longer lingers mean fewer,
                                   larger produce requests (50 halved the broker's
                                   produce-side CPU at 2,880 records/s) */
};

#define SLUICE_PRODUCER_MESSAGE_TIMEOUT_DEFAULT_MS 120000   /* ms */
#define SLUICE_PRODUCER_CLOSE_TIMEOUT_DEFAULT_MS   10000    /* ms */
#define SLUICE_PRODUCER_MESSAGE_TIMEOUT_MIN_MS     1000     /* ms; > the largest linger_ms */
#define SLUICE_PRODUCER_LINGER_DEFAULT_MS          5        /* ms */
#define SLUICE_PRODUCER_LINGER_MAX_MS              900      /* ms */
#define SLUICE_PRODUCER_MESSAGE_TIMEOUT_MAX_MS     86400000 /* ms; one day */

/*
 * Create a producer for cfg (borrowed; read during the call only). Nothing is sent yet: the
 * connection is made in the background. Returns NULL with err filled (SL_EINVAL for bad
 * opts, SL_EKAFKA when librdkafka refuses the configuration). The caller destroys the result
 * with sluice_producer_destroy().
 */
sluice_producer_t *sluice_producer_new(const struct sl_config *cfg, sl_err_t *err);
/* As sluice_producer_new; opts NULL = all defaults (borrowed, read during the call only). */
sluice_producer_t *sluice_producer_new_opts(const struct sl_config *cfg,
                                            const struct sluice_producer_opts *opts,
                                            sl_err_t *err);

/*
 * Validate d (borrowed; not referenced after return) under cfg->max_body_bytes, encode it and
 * hand it to Kafka. done may be NULL (fire and forget; failures are still logged); opaque is
 * passed through untouched. Returns 0 (done will be called exactly once), or without calling
 * done: the codec's SL_EINVAL / SL_ETOOBIG / SL_EMISSING naming the field (SL_ETOOBIG also
 * when the record exceeds librdkafka's message.max.bytes), SL_ETIMEDOUT when
 * the local queue stayed full for enqueue_timeout_ms, SL_EKAFKA when librdkafka refused it
 * or the producer is in a fatal state (recreate it), SL_ESTATE once destroy has begun.
 */
int sluice_producer_publish(sluice_producer_t *p,
                            const struct sl_delivery *d,
                            sluice_done_fn done,
                            void *opaque,
                            sl_err_t *err);

/*
 * Serve delivery reports (done callbacks) and errors, waiting up to timeout_ms (0 = do not
 * wait, -1 = forever) for the first one. Returns the number of events served (>= 0).
 */
int sluice_producer_poll(sluice_producer_t *p, int timeout_ms);

/*
 * Send everything queued now (linger ignored) and serve reports until every published record
 * has had its done call or timeout_ms passed. Returns 0, or SL_ETIMEDOUT with the number of
 * records still waiting in err.
 */
int sluice_producer_flush(sluice_producer_t *p, int timeout_ms, sl_err_t *err);

/* Records published whose done has not been called yet. */
size_t sluice_producer_outstanding(sluice_producer_t *p);

/*
 * 0, or SL_EKAFKA with the reason when the idempotent producer hit a fatal error (for
 * example a fenced or out-of-sequence producer id): every later publish fails and the
 * records in flight fail with SL_EKAFKA; destroy and recreate the producer.
 */
int sluice_producer_fatal(sluice_producer_t *p, sl_err_t *err);

/*
 * The last error librdkafka reported for the connection (broker down, DNS, auth ...), so a
 * caller can explain a timeout: returns 0 when none was seen, else SL_EKAFKA with the error
 * in err. *brokers_down (OUT, NULL allowed) is set to true when that error means no broker
 * could be reached.
 */
int sluice_producer_last_error(sluice_producer_t *p, bool *brokers_down, sl_err_t *err);

/*
 * Flush for at most close_timeout_ms, purge what is left (queued and in-flight), serve the
 * resulting reports, destroy the Kafka handle and free p. Every record without a report
 * by then gets done(SL_ETIMEDOUT, ...), never a success. NULL-safe.
 */
void sluice_producer_destroy(sluice_producer_t *p);

#endif /* SLUICE_PRODUCER_H */
