/*
 * sl_kafka: common librdkafka configuration (see sl_kafka.h).
 */
#include "common/sl_kafka.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/sl_log.h"
#include "common/sl_time.h"

/* ==== Authentication and TLS failures, by name ==== */

/* A refused SASL login: the options to check, and librdkafka's text (it never holds the
 * password). scram: the mechanism is SCRAM, which librdkafka before 2.6.1 answers with a
 * nonce Kafka 4 brokers refuse (confluentinc/librdkafka#4895). */
static void log_auth_failed(const char *reason, bool scram)
{
    sl_error("kafka", "kafka_auth_failed",
             "kafka authentication failed: check kafka_sasl_username, kafka_sasl_password and "
             "kafka_sasl_mechanism%s: %s",
             scram && rd_kafka_version() < 0x020601ff
                 ? " (librdkafka before 2.6.1 answers SCRAM in a way Kafka 4 brokers refuse even "
                   "with the right password: see docs/OPERATIONS.md, Security)"
                 : "",
             reason);
}

/* A failed TLS handshake: an unverifiable broker certificate, a refused client one. */
static void log_tls_failed(const char *reason)
{
    sl_error("kafka", "kafka_tls_failed",
             "kafka TLS failed: check kafka_ssl_ca_file (the CA that signed the broker's "
             "certificate), the broker's host name in its certificate, and kafka_ssl_cert_file / "
             "kafka_ssl_key_file if the broker requires a client certificate: %s",
             reason);
}

/*
 * librdkafka reports a broker connection failure twice: as a FAIL log line, at once from the
 * broker thread, and as an error event served only when the application polls (a process
 * blocked in start-up sees the event late, if ever). Both are logged by name; the log line's
 * kind comes from librdkafka 2.0.2's fixed texts (rdkafka_sasl.c, rdkafka_transport.c and
 * OpenSSL's "SSL routines" reasons).
 */
enum fail_kind { FAIL_OTHER, FAIL_AUTH, FAIL_TLS };

static enum fail_kind fail_kind(const char *fac, const char *buf)
{
    if (strcmp(fac, "FAIL") != 0)
        return FAIL_OTHER;
    if (strstr(buf, "SASL authentication error") || strstr(buf, "SASL authentication failed") ||
        strstr(buf, "SASL handshake failed"))
        return FAIL_AUTH;
    if (strstr(buf, "SSL handshake failed") || strstr(buf, "SSL routines") ||
        strstr(buf, "SSL alert"))
        return FAIL_TLS;
    return FAIL_OTHER;
}

/* librdkafka syslog levels -> ours. Runs on librdkafka threads; must not call librdkafka
 * (rd_kafka_version, which returns a constant, aside). */
int sl_kafka_log_level(int level, const char *fac, const char *buf)
{
    int lv = level <= 3   ? SL_LOG_ERROR
             : level <= 4 ? SL_LOG_WARN
             : level <= 6 ? SL_LOG_INFO
                          : SL_LOG_DEBUG;
    /* A broker just started is still loading its transaction coordinator when an idempotent
     * producer asks for its producer id; librdkafka 2.0.2 retries by itself
     * (rdkafka_idempotence.c) and says so at warning level. Not the operator's business:
     * a producer that never gets its id fails its sends, which are logged. */
    if (lv == SL_LOG_WARN && strcmp(fac, "GETPID") == 0 &&
        strstr(buf, "Coordinator load in progress") && strstr(buf, ": retrying"))
        return SL_LOG_DEBUG;
    return lv;
}

static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    int lv = sl_kafka_log_level(level, fac, buf);
    if (lv == SL_LOG_DEBUG) {
        sl_debug(SL_DBG_KAFKA, "kafka", "rdkafka_log", "%s: %s", fac, buf);
        return;
    }
    switch (fail_kind(fac, buf)) {
    case FAIL_AUTH:
        log_auth_failed(buf, strstr(buf, "SCRAM") != NULL);
        return;
    case FAIL_TLS:
        log_tls_failed(buf);
        return;
    case FAIL_OTHER:
        break;
    }
    if (sl_log_enabled(lv))
        sl__log_write(lv, 0, "kafka", "rdkafka_log", NULL, 0, "%s: %s", fac, buf);
}

void sl_kafka_log_error(rd_kafka_t *rk, int err, const char *reason)
{
    rd_kafka_resp_err_t e = (rd_kafka_resp_err_t)err;
    char mech[32] = "";
    size_t n = sizeof(mech);
    /* Transport errors repeat while a broker is down; librdkafka already rate-limits them. */
    switch (e) {
    case RD_KAFKA_RESP_ERR__FATAL:
        sl_error("kafka", "kafka_fatal", "fatal kafka error: %s", reason);
        break;
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
        if (rk &&
            rd_kafka_conf_get(rd_kafka_conf(rk), "sasl.mechanisms", mech, &n) != RD_KAFKA_CONF_OK)
            mech[0] = '\0';
        log_auth_failed(reason, strncmp(mech, "SCRAM", 5) == 0);
        break;
    case RD_KAFKA_RESP_ERR__SSL:
        log_tls_failed(reason);
        break;
    default:
        sl_warn("kafka", "kafka_error", "%s: %s", rd_kafka_err2name(e), reason);
        break;
    }
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    (void)opaque;
    sl_kafka_log_error(rk, err, reason);
}

int sl_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, sl_err_t *err)
{
    char errstr[256];
    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
        return sl_err_set(err, SL_EKAFKA, "cannot set kafka property %s: %s", name, errstr);
    return 0;
}

/*
 * Transport security, for every client of every process: security.protocol, then the SASL
 * mechanism and credentials (SASL_*) and the CA, client certificate and key (SSL, SASL_SSL).
 * sl_cfg's finalize has checked the combination and the files, so a failure here is
 * librdkafka refusing a value (e.g. built without SSL). Broker certificates are always
 * verified, host name included; an empty CA file means OpenSSL's default trust store.
 */
static int conf_security(rd_kafka_conf_t *conf, const struct sl_config *cfg, sl_err_t *err)
{
    const char *proto = cfg->kafka_security_protocol;
    bool sasl = strncmp(proto, "SASL_", 5) == 0;
    bool tls = strcmp(proto, "SSL") == 0 || strcmp(proto, "SASL_SSL") == 0;
    if (sl_kafka_conf_set(conf, "security.protocol", proto, err) != 0)
        return SL_EKAFKA;
    if (sasl && (sl_kafka_conf_set(conf, "sasl.mechanisms", cfg->kafka_sasl_mechanism, err) != 0 ||
                 sl_kafka_conf_set(conf, "sasl.username", cfg->kafka_sasl_username, err) != 0 ||
                 sl_kafka_conf_set(conf, "sasl.password", cfg->kafka_sasl_password, err) != 0))
        return SL_EKAFKA;
    if (!tls)
        return 0;
    /* librdkafka 2.0's defaults, set anyway: verification is not a packaging choice */
    if (sl_kafka_conf_set(conf, "enable.ssl.certificate.verification", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "ssl.endpoint.identification.algorithm", "https", err) != 0)
        return SL_EKAFKA;
    const struct {
        const char *prop;
        const char *val;
    } files[] = {{"ssl.ca.location", cfg->kafka_ssl_ca_file},
                 {"ssl.certificate.location", cfg->kafka_ssl_cert_file},
                 {"ssl.key.location", cfg->kafka_ssl_key_file},
                 {"ssl.key.password", cfg->kafka_ssl_key_password}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        if (files[i].val[0] && sl_kafka_conf_set(conf, files[i].prop, files[i].val, err) != 0)
            return SL_EKAFKA;
    }
    return 0;
}

rd_kafka_conf_t *sl_kafka_conf_new(const struct sl_config *cfg, const char *role, sl_err_t *err)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char client_id[128];
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    if (cfg->instance_id[0])
        (void)snprintf(client_id, sizeof(client_id), "%s-%s", role, cfg->instance_id);
    else
        (void)snprintf(client_id, sizeof(client_id), "%s-%s-%d", role, host, (int)getpid());
    if (sl_kafka_conf_set(conf, "bootstrap.servers", cfg->kafka_brokers, err) != 0 ||
        sl_kafka_conf_set(conf, "client.id", client_id, err) != 0 ||
        sl_kafka_conf_set(conf, "socket.nagle.disable", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "log.connection.close", "false", err) != 0 ||
        /* the contract allows a 1 MiB body + 64 KiB of record; dead-letter outcomes carry the
         * whole delivery record; topics are created with the same max.message.bytes */
        sl_kafka_conf_set(conf, "message.max.bytes", SL_KAFKA_MAX_MESSAGE_BYTES, err) != 0 ||
        conf_security(conf, cfg, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_log_cb(conf, log_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    return conf;
}

rd_kafka_t *
sl_kafka_producer_new(const struct sl_config *cfg,
                      const char *role,
                      enum sl_kafka_profile profile,
                      rd_kafka_conf_t *conf,
                      void (*dr_msg_cb)(rd_kafka_t *, const rd_kafka_message_t *, void *),
                      sl_err_t *err)
{
    int64_t linger =
        profile == SL_KAFKA_THROUGHPUT ? SL_KAFKA_THROUGHPUT_LINGER_MS : SL_KAFKA_LATENCY_LINGER_MS;
    return sl_kafka_producer_new_linger(cfg, role, linger, conf, dr_msg_cb, err);
}

rd_kafka_t *
sl_kafka_producer_new_linger(const struct sl_config *cfg,
                             const char *role,
                             int64_t linger_ms,
                             rd_kafka_conf_t *conf,
                             void (*dr_msg_cb)(rd_kafka_t *, const rd_kafka_message_t *, void *),
                             sl_err_t *err)
{
    char errstr[512];
    if (!conf) {
        conf = sl_kafka_conf_new(cfg, role, err);
        if (!conf)
            return NULL;
    }
    char linger[32];
    (void)snprintf(linger, sizeof(linger), "%lld", (long long)linger_ms);
    if (sl_kafka_conf_set(conf, "enable.idempotence", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "acks", "all", err) != 0 ||
        sl_kafka_conf_set(conf, "linger.ms", linger, err) != 0 ||
        sl_kafka_conf_set(conf, "batch.num.messages", "10000", err) != 0 ||
        sl_kafka_conf_set(conf, "queue.buffering.max.messages", "500000", err) != 0 ||
        sl_kafka_conf_set(conf, "compression.type", "lz4", err) != 0 ||
        /* Java's partitioner: an endpoint's records land on the same partition whichever
         * language's client produced them (librdkafka's default differs) */
        sl_kafka_conf_set(conf, "partitioner", "murmur2_random", err) != 0 ||
        /* a record that cannot be delivered in 2 minutes is reported as failed, never as
         * delivered: callers keep the offset uncommitted and retry */
        sl_kafka_conf_set(conf, "message.timeout.ms", "120000", err) != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    if (dr_msg_cb)
        rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        sl_err_set(err, SL_EKAFKA, "could not create kafka producer: %s", errstr);
        return NULL;
    }
    return rk;
}

/* A consumer from conf (consumed in every case), its main queue forwarded to the consumer
 * queue. NULL with err. */
static rd_kafka_t *consumer_from(rd_kafka_conf_t *conf, sl_err_t *err)
{
    char errstr[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        sl_err_set(err, SL_EKAFKA, "could not create kafka consumer: %s", errstr);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

rd_kafka_t *sl_kafka_consumer_new(const struct sl_config *cfg,
                                  const char *role,
                                  const char *group_id,
                                  rd_kafka_conf_t *conf,
                                  sl_err_t *err)
{
    char session[32];
    if (!conf) {
        conf = sl_kafka_conf_new(cfg, role, err);
        if (!conf)
            return NULL;
    }
    (void)snprintf(session, sizeof(session), "%lld", (long long)cfg->kafka_session_timeout_ms);
    /* Fetches wait for fetch_min bytes or fetch_wait ms: with librdkafka's fetch.min.bytes=1
     * a fetch returns as soon as any record arrives, so at a few thousand records/s from a
     * low-linger producer the broker answers one fetch per produced batch and spends a core
     * on it; its CPU then shows up as delivery-latency tails on a small machine
     * (bench/README.md, "Kafka settings"). */
    char fetch_wait[32];
    char fetch_min[32];
    (void)snprintf(fetch_wait, sizeof(fetch_wait), "%lld", (long long)cfg->kafka_fetch_wait_ms);
    (void)snprintf(fetch_min, sizeof(fetch_min), "%lld", (long long)cfg->kafka_fetch_min_bytes);
    if (sl_kafka_conf_set(conf, "group.id", group_id, err) != 0 ||
        sl_kafka_conf_set(conf, "enable.auto.commit", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "enable.auto.offset.store", "false", err) != 0 ||
        sl_kafka_conf_set(conf, "auto.commit.interval.ms", "1000", err) != 0 ||
        sl_kafka_conf_set(conf, "auto.offset.reset", "earliest", err) != 0 ||
        sl_kafka_conf_set(conf, "partition.assignment.strategy", "roundrobin", err) != 0 ||
        sl_kafka_conf_set(conf, "session.timeout.ms", session, err) != 0 ||
        sl_kafka_conf_set(conf, "heartbeat.interval.ms", "1000", err) != 0 ||
        sl_kafka_conf_set(conf, "fetch.wait.max.ms", fetch_wait, err) != 0 ||
        sl_kafka_conf_set(conf, "fetch.min.bytes", fetch_min, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return consumer_from(conf, err);
}

rd_kafka_t *sl_kafka_reader_new(const struct sl_config *cfg,
                                const char *role,
                                const char *group_id,
                                const char *const *extra,
                                sl_err_t *err)
{
    rd_kafka_conf_t *conf = sl_kafka_conf_new(cfg, role, err);
    if (!conf)
        return NULL;
    int rc = sl_kafka_conf_set(conf, "group.id", group_id, err);
    if (rc == 0)
        rc = sl_kafka_conf_set(conf, "enable.auto.commit", "false", err);
    if (rc == 0)
        rc = sl_kafka_conf_set(conf, "enable.auto.offset.store", "false", err);
    for (size_t i = 0; rc == 0 && extra && extra[i]; i += 2)
        rc = extra[i + 1]
                 ? sl_kafka_conf_set(conf, extra[i], extra[i + 1], err)
                 : sl_err_set(err, SL_EINVAL, "kafka property %s without a value", extra[i]);
    if (rc != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return consumer_from(conf, err);
}

int sl_kafka_produce(rd_kafka_t *rk,
                     const char *topic,
                     const void *key,
                     size_t keylen,
                     const void *val,
                     size_t vallen,
                     void *msg_opaque,
                     int max_wait_ms,
                     sl_err_t *err)
{
    return sl_kafka_produce_hdrs(rk, topic, key, keylen, val, vallen, NULL, msg_opaque, max_wait_ms,
                                 err);
}

int sl_kafka_produce_hdrs(rd_kafka_t *rk,
                          const char *topic,
                          const void *key,
                          size_t keylen,
                          const void *val,
                          size_t vallen,
                          const rd_kafka_headers_t *hdrs,
                          void *msg_opaque,
                          int max_wait_ms,
                          sl_err_t *err)
{
    int64_t deadline = sl_mono_ms() + max_wait_ms;
    /* librdkafka's macros take non-const pointers; F_COPY means they are only read */
    void *k = (void *)(uintptr_t)key;
    void *v = (void *)(uintptr_t)val;
    for (;;) {
        /* producev takes the headers only when it succeeds; NULL is no headers (2.0.2
         * rd_kafka_producev: app_hdrs ? app_hdrs : none) */
        rd_kafka_headers_t *h = hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
        rd_kafka_resp_err_t e =
            rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(k, keylen),
                              RD_KAFKA_V_VALUE(v, vallen), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_OPAQUE(msg_opaque), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
            return 0;
        if (h)
            rd_kafka_headers_destroy(h);
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return sl_err_set(err, SL_EKAFKA, "could not produce to %s: %s", topic,
                              rd_kafka_err2str(e));
        if (sl_mono_ms() >= deadline)
            return sl_err_set(err, SL_ETIMEDOUT,
                              "could not produce to %s: local queue full for %d ms", topic,
                              max_wait_ms);
        rd_kafka_poll(rk, 10);
    }
}

int sl_kafka_flush(rd_kafka_t *rk, int timeout_ms, sl_err_t *err)
{
    rd_kafka_resp_err_t e = rd_kafka_flush(rk, timeout_ms);
    if (e == RD_KAFKA_RESP_ERR__TIMED_OUT)
        return sl_err_set(err, SL_ETIMEDOUT, "could not flush kafka producer: %d records left",
                          rd_kafka_outq_len(rk));
    return 0;
}
