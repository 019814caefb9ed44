/*
 * sluice_producer: the C API applications use to publish deliveries to Sluice
 * (libsluice_producer; pkg-config sluice_producer, CMake find_package(SluiceProducer)).
 *
 * This header is the whole public API. It includes only standard headers, every handle is
 * opaque, and the library exports only the sluice_* functions declared here. Error codes
 * are negative SLUICE_E* values; where the reason matters the last parameter is a
 * caller-owned sluice_err_t (NULL allowed) that gets the code and a message naming the
 * field or option at fault, never a payload or a secret.
 *
 * A publish validates the delivery against the record contract (schemas/README.md) and
 * encodes it before anything reaches Kafka, so a bad record is an error returned to the
 * caller and never a record a consumer has to quarantine. Good records go to the
 * topic_deliveries option's topic with key = endpoint id, through an idempotent producer
 * (acks=all, enable.idempotence=true, lz4, linger.ms from opts.linger_ms, 5 ms by default).
 *
 * Completion: every successful publish gets exactly one done(opaque, status, reason) call,
 * made from a Kafka delivery report: status 0 when Kafka acknowledged the record (written to
 * all in-sync replicas), a negative SLUICE_E* code and a reason when it failed permanently,
 * was not acknowledged within message_timeout_ms, or the producer was destroyed first. A
 * failure report does not prove the record is absent from the log (a purged in-flight
 * request may still have been written), but a success report always means acknowledged:
 * never guess towards success. Async rule: a publish that returns an error never calls done.
 *
 * Delivery reports are served only inside sluice_producer_poll/flush/destroy, and by
 * sluice_producer_publish while it waits for room in a full local queue; an application
 * must therefore call sluice_producer_poll regularly (or flush).
 *
 * Logging: the library writes JSON lines to stderr (Kafka's own log lines included) at the
 * log_level option's level, with the role as "proc" (both from the first producer created in
 * the process); a failure nobody receives a done call for is logged.
 *
 * thread: publish may be called concurrently from any number of threads. poll and flush may
 * be called from any thread; done runs on the thread that serves the report (one of the
 * above), so done must be thread-safe when several threads publish or poll. destroy must not
 * race with any other call on the same producer. A sluice_config_t is used by one thread at a
 * time.
 */
#ifndef SLUICE_PRODUCER_H
#define SLUICE_PRODUCER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported functions (the library is built with -fvisibility=hidden). */
#if defined(__GNUC__)
#define SLUICE_PRODUCER_API __attribute__((visibility("default")))
#else
#define SLUICE_PRODUCER_API
#endif

/* ==== Errors ==== */

/* Codes the library returns (0 = success). Other negative values are -errno. */
enum sluice_err_code {
    SLUICE_OK = 0,
    SLUICE_EINVAL = -5001,    /* invalid argument or record field */
    SLUICE_ETOOBIG = -5003,   /* a size or count limit exceeded */
    SLUICE_EMISSING = -5006,  /* a required record field is missing */
    SLUICE_ECONFIG = -5007,   /* invalid configuration option */
    SLUICE_EKAFKA = -5008,    /* Kafka refused, or the producer hit a fatal error */
    SLUICE_ETIMEDOUT = -5014, /* not acknowledged (or no queue room) in time */
    SLUICE_ESTATE = -5015,    /* the producer is being destroyed */
};

#define SLUICE_ERR_MSG_MAX 256 /* bytes of sluice_err_t.msg, NUL included */

/* An error's code and reason; a plain value owned by the caller. */
typedef struct sluice_err {
    int code;                     /* SLUICE_OK or a negative SLUICE_E* / -errno */
    char msg[SLUICE_ERR_MSG_MAX]; /* human detail, NUL-terminated; names the field or
                                     option, never a value that may be secret */
} sluice_err_t;

/* Short description of code ("invalid argument"); never NULL, static storage. */
SLUICE_PRODUCER_API const char *sluice_strerror(int code);

/* The library's version, "MAJOR.MINOR.PATCH" (static storage). */
SLUICE_PRODUCER_API const char *sluice_producer_version(void);

/* ==== Configuration ==== */

/*
 * The options a producer needs, under the names and SLUICE_* environment variables every
 * Sluice process uses (docs/CONFIG.md): kafka_brokers, topic_deliveries, max_body_bytes,
 * instance_id, kafka_security_protocol, kafka_sasl_mechanism, kafka_sasl_username,
 * kafka_sasl_password, kafka_ssl_ca_file, kafka_ssl_cert_file, kafka_ssl_key_file,
 * kafka_ssl_key_password, log_level and debug. Defaults as in docs/CONFIG.md.
 */
typedef struct sluice_config sluice_config_t;

/* A configuration with every option at its default. Free with sluice_config_destroy(). */
SLUICE_PRODUCER_API sluice_config_t *sluice_config_new(void);

/*
 * Set one option by name (as in a Sluice config file: "kafka_brokers", "max_body_bytes")
 * from its text form (name and value borrowed, copied). Returns 0, or SLUICE_ECONFIG for an
 * unknown option or a value it refuses, naming the option (a secret's value is never
 * echoed); the option keeps its previous value then.
 */
SLUICE_PRODUCER_API int
sluice_config_set(sluice_config_t *cfg, const char *name, const char *value, sluice_err_t *err);

/*
 * Set every option whose SLUICE_* environment variable is set (SLUICE_KAFKA_BROKERS, ...),
 * ignoring variables of other options. Returns 0, or SLUICE_ECONFIG naming the first
 * variable whose value is refused (the ones before it are applied).
 */
SLUICE_PRODUCER_API int sluice_config_load_env(sluice_config_t *cfg, sluice_err_t *err);

/* Free cfg (secrets wiped). NULL-safe. */
SLUICE_PRODUCER_API void sluice_config_destroy(sluice_config_t *cfg);

/* ==== Records ==== */

#define SLUICE_EVENT_ID_MAX    128 /* bytes */
#define SLUICE_ENDPOINT_ID_MAX 64  /* bytes */
#define SLUICE_EVENT_TYPE_MAX  128 /* bytes */
#define SLUICE_HDR_MAX         32  /* extra headers per delivery */
#define SLUICE_MACRO_MAX       64  /* macros per delivery */

/* One header or macro: both strings NUL-terminated, borrowed. */
struct sluice_kv {
    const char *name;  /* header name (HTTP token) or macro name ([A-Za-z0-9_]) */
    const char *value; /* header value or macro value */
};

/*
 * One delivery (schemas/README.md, "delivery"). Everything is borrowed for the duration of
 * the publish call only. Field names are the record's, as error messages name them.
 */
struct sluice_delivery {
    const char *id;                 /* event id, 1..128 bytes 0x21..0x7e except '.' */
    const char *ep;                 /* endpoint id, 1..64 bytes [A-Za-z0-9_-]; the Kafka key */
    const char *type;               /* event type, 1..128 bytes 0x21..0x7e */
    uint64_t ts_ms;                 /* created-at, unix ms */
    const char *ct;                 /* content type; NULL = application/json */
    const void *body;               /* exact bytes to send; NULL only when body_len is 0 */
    size_t body_len;                /* bytes; <= max_body_bytes, may be 0 */
    const struct sluice_kv *hdr;    /* extra request headers, in order (NULL if none) */
    size_t n_hdr;                   /* entries in hdr, <= SLUICE_HDR_MAX */
    const struct sluice_kv *macros; /* postback macro values, in order (NULL if none) */
    size_t n_macros;                /* entries in macros, <= SLUICE_MACRO_MAX */
};

/* ==== The producer ==== */

typedef struct sluice_producer sluice_producer_t;

/*
 * Completion callback. status: 0 = acknowledged by Kafka; SLUICE_ETIMEDOUT = not
 * acknowledged in time (message timeout, or destroyed before the acknowledgement);
 * SLUICE_EKAFKA = Kafka refused the record permanently or the producer hit a fatal error.
 * reason: NULL when status is 0, else a human message (borrowed, valid only during the call;
 * never contains the payload).
 */
typedef void (*sluice_done_fn)(void *opaque, int status, const char *reason);

/* Tuning knobs; zero fields take the defaults. */
struct sluice_producer_opts {
    int64_t message_timeout_ms; /* ms Kafka may take to acknowledge one record, retries
                                   included (message.timeout.ms); 0 = 120000 */
    int64_t enqueue_timeout_ms; /* ms publish waits for room in a full local queue before
                                   failing with SLUICE_ETIMEDOUT; 0 = message_timeout_ms */
    int64_t close_timeout_ms;   /* ms destroy waits for outstanding acknowledgements before
                                   purging them; 0 = 10000; < 0 = do not wait */
    const char *role;           /* client.id role and the log lines' "proc" (borrowed);
                                   NULL = "sluice-producer" */
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
 * Create a producer for cfg (borrowed, read during the call only; NULL = every option at its
 * default). Nothing is sent yet: the connection is made in the background. Returns NULL with
 * err filled: SLUICE_ECONFIG when the options do not fit together (SASL credentials without
 * SASL, a client certificate without its key, ...), SLUICE_EINVAL for bad opts, SLUICE_EKAFKA
 * when librdkafka refuses the configuration. The log_level and debug options apply to the
 * library's logging as a whole: the first producer created in the process sets them. The
 * caller destroys the result with sluice_producer_destroy().
 */
SLUICE_PRODUCER_API sluice_producer_t *sluice_producer_new(const sluice_config_t *cfg,
                                                           sluice_err_t *err);
/* As sluice_producer_new; opts NULL = all defaults (borrowed, read during the call only). */
SLUICE_PRODUCER_API sluice_producer_t *sluice_producer_new_opts(
    const sluice_config_t *cfg, const struct sluice_producer_opts *opts, sluice_err_t *err);

/*
 * Validate d (borrowed; not referenced after return) under the max_body_bytes option, encode
 * it and hand it to Kafka. done may be NULL (fire and forget; failures are still logged);
 * opaque is passed through untouched. Returns 0 (done will be called exactly once), or
 * without calling done: SLUICE_EINVAL / SLUICE_ETOOBIG / SLUICE_EMISSING naming the field
 * (SLUICE_ETOOBIG also when the record exceeds librdkafka's message.max.bytes),
 * SLUICE_ETIMEDOUT when the local queue stayed full for enqueue_timeout_ms, SLUICE_EKAFKA when
 * librdkafka refused it or the producer is in a fatal state (recreate it), SLUICE_ESTATE once
 * destroy has begun.
 */
SLUICE_PRODUCER_API int sluice_producer_publish(sluice_producer_t *p,
                                                const struct sluice_delivery *d,
                                                sluice_done_fn done,
                                                void *opaque,
                                                sluice_err_t *err);

/*
 * Serve delivery reports (done callbacks) and errors, waiting up to timeout_ms (0 = do not
 * wait, -1 = forever) for the first one. Returns the number of events served (>= 0).
 */
SLUICE_PRODUCER_API int sluice_producer_poll(sluice_producer_t *p, int timeout_ms);

/*
 * Send everything queued now (linger ignored) and serve reports until every published record
 * has had its done call or timeout_ms passed. Returns 0, or SLUICE_ETIMEDOUT with the number
 * of records still waiting in err.
 */
SLUICE_PRODUCER_API int
sluice_producer_flush(sluice_producer_t *p, int timeout_ms, sluice_err_t *err);

/* Records published whose done has not been called yet. */
SLUICE_PRODUCER_API size_t sluice_producer_outstanding(sluice_producer_t *p);

/*
 * 0, or SLUICE_EKAFKA with the reason when the idempotent producer hit a fatal error (for
 * example a fenced or out-of-sequence producer id): every later publish fails and the
 * records in flight fail with SLUICE_EKAFKA; destroy and recreate the producer.
 */
SLUICE_PRODUCER_API int sluice_producer_fatal(sluice_producer_t *p, sluice_err_t *err);

/*
 * The last error librdkafka reported for the connection (broker down, DNS, auth ...), so a
 * caller can explain a timeout: returns 0 when none was seen, else SLUICE_EKAFKA with the
 * error in err. *brokers_down (OUT, NULL allowed) is set to true when that error means no
 * broker could be reached.
 */
SLUICE_PRODUCER_API int
sluice_producer_last_error(sluice_producer_t *p, bool *brokers_down, sluice_err_t *err);

/*
 * Flush for at most close_timeout_ms, purge what is left (queued and in-flight), serve the
 * resulting reports, destroy the Kafka handle and free p. Every record without a report
 * by then gets done(SLUICE_ETIMEDOUT, ...), never a success. NULL-safe.
 */
SLUICE_PRODUCER_API void sluice_producer_destroy(sluice_producer_t *p);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_PRODUCER_H */
