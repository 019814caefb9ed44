/*
 * sl_kafka: common librdkafka configuration (see sl_kafka.h).
 */
#include "common/sl_kafka.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sl_log.h"

int64_t sl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t sl_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t sl_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* librdkafka syslog levels -> ours. Runs on librdkafka threads; must not call librdkafka. */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    int lv = level <= 3   ? SL_LOG_ERROR
             : level <= 4 ? SL_LOG_WARN
             : level <= 6 ? SL_LOG_INFO
                          : SL_LOG_DEBUG;
    if (lv == SL_LOG_DEBUG) {
        sl_debug(SL_DBG_KAFKA, "kafka", "rdkafka_log", "%s: %s", fac, buf);
        return;
    }
    if (sl_log_enabled(lv))
        sl__log_write(lv, 0, "kafka", "rdkafka_log", NULL, 0, "%s: %s", fac, buf);
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    (void)rk;
    (void)opaque;
    rd_kafka_resp_err_t e = (rd_kafka_resp_err_t)err;
    /* Transport errors repeat while a broker is down; librdkafka already rate-limits them. */
    if (e == RD_KAFKA_RESP_ERR__FATAL)
        sl_error("kafka", "kafka_fatal", "fatal kafka error: %s", reason);
    else
        sl_warn("kafka", "kafka_error", "%s: %s", rd_kafka_err2name(e), reason);
}

int sl_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, sl_err_t *err)
{
    char errstr[256];
    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
        return sl_err_set(err, SL_EKAFKA, "cannot set kafka property %s: %s", name, errstr);
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
        snprintf(client_id, sizeof(client_id), "%s-%s", role, cfg->instance_id);
    else
        snprintf(client_id, sizeof(client_id), "%s-%s-%d", role, host, (int)getpid());
    if (sl_kafka_conf_set(conf, "bootstrap.servers", cfg->kafka_brokers, err) != 0 ||
        sl_kafka_conf_set(conf, "client.id", client_id, err) != 0 ||
        sl_kafka_conf_set(conf, "socket.nagle.disable", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "log.connection.close", "false", err) != 0 ||
        /* the contract allows a 1 MiB body + 64 KiB of record; dead-letter outcomes carry the
         * whole delivery record; topics are created with the same max.message.bytes */
        sl_kafka_conf_set(conf, "message.max.bytes", SL_KAFKA_MAX_MESSAGE_BYTES, err) != 0) {
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
    snprintf(linger, sizeof(linger), "%lld", (long long)linger_ms);
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

rd_kafka_t *sl_kafka_consumer_new(const struct sl_config *cfg,
                                  const char *role,
                                  const char *group_id,
                                  rd_kafka_conf_t *conf,
                                  sl_err_t *err)
{
    char errstr[512];
    char session[32];
    if (!conf) {
        conf = sl_kafka_conf_new(cfg, role, err);
        if (!conf)
            return NULL;
    }
    snprintf(session, sizeof(session), "%lld", (long long)cfg->kafka_session_timeout_ms);
    /* Fetches wait for fetch_min bytes or fetch_wait ms: with librdkafka's fetch.min.bytes=1
     * a fetch returns as soon as any record arrives, so at a few thousand records/s from a
     * low-linger producer the broker answers one fetch per produced batch and spends a core
     * on it; its CPU then shows up as delivery-latency tails on a small machine
     * (bench/README.md, "Latency"). */
    char fetch_wait[32];
    char fetch_min[32];
    snprintf(fetch_wait, sizeof(fetch_wait), "%lld", (long long)cfg->kafka_fetch_wait_ms);
    snprintf(fetch_min, sizeof(fetch_min), "%lld", (long long)cfg->kafka_fetch_min_bytes);
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
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        sl_err_set(err, SL_EKAFKA, "could not create kafka consumer: %s", errstr);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
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
