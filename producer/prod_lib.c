/*
 * prod_lib: the sluice_producer library (see sluice_producer.h for the contract; prod_lib.h
 * for the entry points over internal types that Sluice's own programs use).
 *
 * Every accepted publish takes one struct prod_rec (the done callback and its opaque; recycled
 * through a bounded free list) and links it into the producer's outstanding list before the
 * record is handed to librdkafka; the delivery report unlinks it, calls done once and
 * recycles it. The list is what makes "exactly once, never a false success" hold at destroy:
 * whatever librdkafka has not reported after flush + purge + a bounded poll is still on the
 * list and is failed by hand, after the Kafka handle is gone (so no late report can race).
 *
 * Records are encoded into a per-thread scratch buffer and handed over with
 * RD_KAFKA_MSG_F_COPY (librdkafka copies the value into its own message allocation). Records
 * go through one rd_kafka_topic_t whose topic conf is a duplicate of the producer's default
 * with message.timeout.ms replaced: sl_kafka fixes the producer-wide value, and this is the
 * documented per-topic override.
 *
 * Locking: mu protects the outstanding list and counters and the last-error copy; it is
 * never held while calling librdkafka or a done callback.
 *
 * The public functions that take public types (sluice_config_t, struct sluice_delivery,
 * sluice_err_t) convert them and call the same core as prod_lib_new / prod_lib_publish;
 * the codes are the same values, so errors and done statuses pass through unchanged.
 */
#include "producer/prod_lib.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_time.h"
#include "producer/prod_conf.h"
#include "producer/prod_lib_int.h"
#include "producer/sluice_producer.h"

#define PURGE_SERVE_MS     5000  /* ms; bound on serving the purged records' reports */
#define QUEUE_FULL_POLL_MS 10    /* ms; poll slice while the local queue is full */
#define FAIL_LOG_PERIOD_MS 1000  /* ms; at most one failure line per period when done == NULL */
#define REC_FREE_MAX       65536 /* prod_rec kept for reuse (about 2 MiB at most) */
#define SCRATCH_KEEP       ((size_t)256 * 1024) /* bytes; per-thread encode buffer kept between calls */
#define ROLE_DEFAULT       "sluice-producer" /* client.id role and log proc without opts.role */

/* The public record limits are the contract's. */
_Static_assert(SLUICE_EVENT_ID_MAX == SL_EVENT_ID_MAX &&
                   SLUICE_ENDPOINT_ID_MAX == SL_ENDPOINT_ID_MAX &&
                   SLUICE_EVENT_TYPE_MAX == SL_EVENT_TYPE_MAX && SLUICE_HDR_MAX == SL_HDR_MAX &&
                   SLUICE_MACRO_MAX == SL_MACRO_MAX,
               "public record limits differ from sl_record's");

/* One published record awaiting its delivery report. */
struct prod_rec {
    sluice_done_fn done;   /* caller's callback; NULL = fire and forget */
    void *opaque;          /* caller's pointer, passed back untouched */
    struct prod_rec *prev; /* outstanding list links (list head is sluice_producer.recs) */
    struct prod_rec *next;
};

struct sluice_producer {
    rd_kafka_t *rk;              /* the idempotent producer */
    rd_kafka_topic_t *rkt;       /* cfg->topic_deliveries with our message.timeout.ms */
    char *topic;                 /* owned copy of the topic name (messages) */
    char *brokers;               /* owned copy of the bootstrap list (messages) */
    struct sl_decode_limits lim; /* encoder limits (max_body from cfg) */
    int64_t message_timeout_ms;  /* ms; message.timeout.ms of the topic */
    int64_t enqueue_timeout_ms;  /* ms; publish's wait on a full local queue */
    int64_t close_timeout_ms;    /* ms; destroy's flush bound (< 0 = none) */
    pthread_mutex_t mu;          /* guards everything below */
    struct prod_rec recs;        /* sentinel of the outstanding list */
    size_t outstanding;          /* records on the list */
    struct prod_rec *free_recs;  /* reusable prod_rec, linked by next */
    size_t n_free;               /* entries on free_recs, <= REC_FREE_MAX */
    bool closing;                /* destroy has begun: publish refuses */
    int last_err;                /* last rd_kafka_resp_err_t from error_cb; 0 = none */
    bool last_down;              /* last_err means no broker could be reached */
    char last_reason[256];       /* its text (broker addresses, never payloads) */
    int64_t fail_log_ms;         /* mono ms of the last unreported-failure log line */
    uint64_t fail_suppressed;    /* failure lines suppressed since then */
    atomic_bool ignore_reports;  /* set before rd_kafka_destroy: reports are dropped */
    atomic_bool fatal_logged;    /* the fatal error has been logged once */
};

/* ==== Delivery reports and errors (served on the polling thread) ==== */

static void rec_unlink(sluice_producer_t *p, struct prod_rec *rec)
{
    rec->prev->next = rec->next;
    rec->next->prev = rec->prev;
    rec->prev = rec->next = NULL;
    p->outstanding--;
}

/* Keep rec for reuse or free it. Caller holds mu. */
static void rec_put(sluice_producer_t *p, struct prod_rec *rec)
{
    if (p->n_free >= REC_FREE_MAX) {
        free(rec);
        return;
    }
    rec->next = p->free_recs;
    p->free_recs = rec;
    p->n_free++;
}

/* Append "; last kafka error: ..." when the connection has reported one. */
static void append_last_error(sluice_producer_t *p, char *buf, size_t cap)
{
    size_t len = strlen(buf);
    pthread_mutex_lock(&p->mu);
    if (p->last_err != 0 && len < cap)
        (void)snprintf(buf + len, cap - len, "; last kafka error: %s", p->last_reason);
    pthread_mutex_unlock(&p->mu);
}

/* Map a report's error to our status and a reason (written to buf). */
static int report_status(sluice_producer_t *p, rd_kafka_resp_err_t e, char *buf, size_t cap)
{
    char fatal[256];
    switch (e) {
    case RD_KAFKA_RESP_ERR_NO_ERROR:
        buf[0] = '\0';
        return 0;
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
        (void)snprintf(buf, cap,
                       "not acknowledged by kafka at %s within %" PRId64 " ms (message timeout)",
                       p->brokers, p->message_timeout_ms);
        append_last_error(p, buf, cap);
        return SL_ETIMEDOUT;
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
        (void)snprintf(buf, cap, "producer closed before kafka at %s acknowledged the record",
                       p->brokers);
        append_last_error(p, buf, cap);
        return SL_ETIMEDOUT;
    case RD_KAFKA_RESP_ERR__FATAL:
        rd_kafka_fatal_error(p->rk, fatal, sizeof(fatal));
        (void)snprintf(buf, cap, "kafka producer fatal error: %s; recreate the producer", fatal);
        return SL_EKAFKA;
    default:
        (void)snprintf(buf, cap, "kafka refused the record for topic %s: %s", p->topic,
                       rd_kafka_err2str(e));
        return SL_EKAFKA;
    }
}

/* A failure nobody listens for is still visible: one log line per period, with a count. */
static void
log_unreported_failure(sluice_producer_t *p, const rd_kafka_message_t *rkm, const char *reason)
{
    int64_t now = sl_mono_ms();
    uint64_t suppressed;
    pthread_mutex_lock(&p->mu);
    if (p->fail_log_ms != 0 && now - p->fail_log_ms < FAIL_LOG_PERIOD_MS) {
        p->fail_suppressed++;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    p->fail_log_ms = now;
    suppressed = p->fail_suppressed;
    p->fail_suppressed = 0;
    pthread_mutex_unlock(&p->mu);
    char ep[SL_ENDPOINT_ID_MAX + 1] = "";
    if (rkm->key && rkm->key_len <= SL_ENDPOINT_ID_MAX) {
        memcpy(ep, rkm->key, rkm->key_len);
        ep[rkm->key_len] = '\0';
    }
    SL_LOGKV(SL_LOG_WARN, "producer", "publish_failed",
             ((struct sl_log_kv[]){SL_KV_S("endpoint_id", ep), SL_KV_S("topic", p->topic),
                                   SL_KV_I("suppressed", suppressed)}),
             "could not publish a delivery: %s", reason);
}

static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque)
{
    (void)rk;
    sluice_producer_t *p = opaque;
    struct prod_rec *rec = rkm->_private;
    /* During rd_kafka_destroy the records left are failed by destroy itself. */
    if (atomic_load(&p->ignore_reports) || !rec)
        return;
    sluice_done_fn done = rec->done;
    void *done_opaque = rec->opaque;
    pthread_mutex_lock(&p->mu);
    rec_unlink(p, rec);
    rec_put(p, rec);
    pthread_mutex_unlock(&p->mu);
    char reason[512];
    int status = report_status(p, rkm->err, reason, sizeof(reason));
    if (done)
        done(done_opaque, status, status == 0 ? NULL : reason);
    else if (status != 0)
        log_unreported_failure(p, rkm, reason);
}

/* Replaces sl_kafka's error_cb (same log lines) to remember the last error for reasons. */
static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    sluice_producer_t *p = opaque;
    rd_kafka_resp_err_t e = (rd_kafka_resp_err_t)err;
    sl_kafka_log_error(rk, err, reason);
    pthread_mutex_lock(&p->mu);
    p->last_err = err;
    p->last_down = e == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || e == RD_KAFKA_RESP_ERR__TRANSPORT ||
                   e == RD_KAFKA_RESP_ERR__RESOLVE;
    (void)snprintf(p->last_reason, sizeof(p->last_reason), "%s", reason);
    pthread_mutex_unlock(&p->mu);
}

/* Log a fatal error once, loudly: the producer is useless from now on. */
static void check_fatal(sluice_producer_t *p)
{
    char reason[256];
    rd_kafka_resp_err_t e = rd_kafka_fatal_error(p->rk, reason, sizeof(reason));
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR || atomic_exchange(&p->fatal_logged, true))
        return;
    sl_error("producer", "producer_fatal",
             "kafka producer hit a fatal error, every further publish fails until it is "
             "recreated: %s: %s",
             rd_kafka_err2name(e), reason);
}

/* ==== Life cycle ==== */

static int check_opts(const struct sluice_producer_opts *o, sl_err_t *err)
{
    if (o->message_timeout_ms != 0 &&
        (o->message_timeout_ms < SLUICE_PRODUCER_MESSAGE_TIMEOUT_MIN_MS ||
         o->message_timeout_ms > SLUICE_PRODUCER_MESSAGE_TIMEOUT_MAX_MS))
        return sl_err_set(err, SL_EINVAL, "message_timeout_ms must be in %d..%d",
                          SLUICE_PRODUCER_MESSAGE_TIMEOUT_MIN_MS,
                          SLUICE_PRODUCER_MESSAGE_TIMEOUT_MAX_MS);
    if (o->linger_ms < 0 || o->linger_ms > SLUICE_PRODUCER_LINGER_MAX_MS)
        return sl_err_set(err, SL_EINVAL, "linger_ms must be in 0..%d",
                          SLUICE_PRODUCER_LINGER_MAX_MS);
    if (o->enqueue_timeout_ms < 0 || o->enqueue_timeout_ms > INT32_MAX)
        return sl_err_set(err, SL_EINVAL, "enqueue_timeout_ms must be in 0..%d", INT32_MAX);
    if (o->close_timeout_ms > INT32_MAX)
        return sl_err_set(err, SL_EINVAL, "close_timeout_ms must be at most %d", INT32_MAX);
    return 0;
}

sluice_producer_t *
prod_lib_new(const struct sl_config *cfg, const struct sluice_producer_opts *opts, sl_err_t *err)
{
    static const struct sluice_producer_opts defaults = {0};
    const struct sluice_producer_opts *o = opts ? opts : &defaults;
    sluice_producer_t *p = NULL;
    rd_kafka_conf_t *conf = NULL;
    rd_kafka_topic_conf_t *tconf = NULL;
    char val[32];
    char errstr[256];

    if (check_opts(o, err) != 0)
        return NULL;
    if (!cfg->topic_deliveries || !cfg->topic_deliveries[0]) {
        sl_err_set(err, SL_EINVAL, "topic_deliveries is empty");
        return NULL;
    }
    const char *role = o->role ? o->role : ROLE_DEFAULT;

    p = sl_xcalloc(1, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    p->recs.prev = p->recs.next = &p->recs;
    atomic_init(&p->ignore_reports, false);
    atomic_init(&p->fatal_logged, false);
    p->topic = sl_xstrdup(cfg->topic_deliveries);
    p->brokers = sl_xstrdup(cfg->kafka_brokers);
    p->lim.max_body = cfg->max_body_bytes > 0 ? (size_t)cfg->max_body_bytes : 0;
    p->message_timeout_ms =
        o->message_timeout_ms ? o->message_timeout_ms : SLUICE_PRODUCER_MESSAGE_TIMEOUT_DEFAULT_MS;
    p->enqueue_timeout_ms = o->enqueue_timeout_ms ? o->enqueue_timeout_ms : p->message_timeout_ms;
    p->close_timeout_ms =
        o->close_timeout_ms ? o->close_timeout_ms : SLUICE_PRODUCER_CLOSE_TIMEOUT_DEFAULT_MS;

    conf = sl_kafka_conf_new(cfg, role, err);
    if (!conf)
        goto fail;
    rd_kafka_conf_set_error_cb(conf, error_cb);
    rd_kafka_conf_set_opaque(conf, p);
    /* librdkafka times out the records of a broker only when the broker's thread wakes, and
     * while the broker refuses connections that thread sleeps up to reconnect.backoff.max.ms
     * (10 s by default): a 2-s message timeout took 6-10 s. 1 s keeps message_timeout_ms
     * within a second (one connection attempt a second to a broker that is down). */
    if (sl_kafka_conf_set(conf, "reconnect.backoff.max.ms", "1000", err) != 0)
        goto fail;
    /* consumes conf in every case */
    p->rk = sl_kafka_producer_new_linger(
        cfg, role, o->linger_ms ? o->linger_ms : SLUICE_PRODUCER_LINGER_DEFAULT_MS, conf, dr_msg_cb,
        err);
    conf = NULL;
    if (!p->rk)
        goto fail;

    tconf = rd_kafka_default_topic_conf_dup(p->rk);
    (void)snprintf(val, sizeof(val), "%" PRId64, p->message_timeout_ms);
    if (rd_kafka_topic_conf_set(tconf, "message.timeout.ms", val, errstr, sizeof(errstr)) !=
        RD_KAFKA_CONF_OK) {
        sl_err_set(err, SL_EKAFKA, "cannot set kafka property message.timeout.ms: %s", errstr);
        goto fail;
    }
    p->rkt = rd_kafka_topic_new(p->rk, p->topic, tconf);
    if (!p->rkt) {
        sl_err_set(err, SL_EKAFKA, "cannot use kafka topic %s: %s", p->topic,
                   rd_kafka_err2str(rd_kafka_last_error()));
        goto fail;
    }
    tconf = NULL; /* owned by the topic now */
    return p;

fail:
    if (tconf)
        rd_kafka_topic_conf_destroy(tconf);
    if (p->rk)
        rd_kafka_destroy(p->rk);
    pthread_mutex_destroy(&p->mu);
    free(p->topic);
    free(p->brokers);
    free(p);
    return NULL;
}

void sluice_producer_destroy(sluice_producer_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closing = true;
    pthread_mutex_unlock(&p->mu);

    if (p->close_timeout_ms >= 0)
        rd_kafka_flush(p->rk, (int)p->close_timeout_ms);
    /* What is still unacknowledged fails now: librdkafka reports purged records with
     * __PURGE_QUEUE / __PURGE_INFLIGHT, which map to SL_ETIMEDOUT, never to success. */
    if (sluice_producer_outstanding(p) > 0) {
        rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        int64_t deadline = sl_mono_ms() + PURGE_SERVE_MS;
        while (sluice_producer_outstanding(p) > 0 && sl_mono_ms() < deadline)
            rd_kafka_poll(p->rk, 50);
    }
    check_fatal(p);
    atomic_store(&p->ignore_reports, true);
    rd_kafka_topic_destroy(p->rkt);
    rd_kafka_destroy(p->rk);

    /* Belt and braces: anything librdkafka never reported is failed here, once. */
    size_t left = 0;
    struct prod_rec *rec = p->recs.next;
    while (rec != &p->recs) {
        struct prod_rec *next = rec->next;
        if (rec->done)
            rec->done(rec->opaque, SL_ETIMEDOUT,
                      "producer destroyed before kafka acknowledged the record");
        free(rec);
        left++;
        rec = next;
    }
    if (left > 0)
        sl_warn("producer", "producer_unreported",
                "%zu records had no delivery report at close and were failed", left);
    while (p->free_recs) {
        rec = p->free_recs;
        p->free_recs = rec->next;
        free(rec);
    }
    pthread_mutex_destroy(&p->mu);
    free(p->topic);
    free(p->brokers);
    free(p);
}

/* ==== Publishing ==== */

/*
 * Per-thread encode buffer: records are encoded here and copied by librdkafka into the same
 * allocation as its own message header (RD_KAFKA_MSG_F_COPY), so a publish costs one malloc
 * instead of a growing buffer per record. Freed at thread exit (key destructor), or after a
 * record larger than SCRATCH_KEEP so one big body does not pin memory.
 */
static _Thread_local struct sl_buf tl_scratch;
static _Thread_local bool tl_scratch_busy; /* publish re-entered from a done callback */
static pthread_key_t scratch_key;
static bool scratch_key_ok; /* key created: buffers are freed at thread exit */
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg)
{
    sl_buf_fini(arg);
}

static void scratch_key_init(void)
{
    /* without the key a thread's buffer lives until process exit: a bounded leak */
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}

static struct sl_buf *scratch_get(size_t max)
{
    if (!tl_scratch.data) {
        (void)pthread_once(&scratch_once, scratch_key_init);
        if (scratch_key_ok)
            (void)pthread_setspecific(scratch_key, &tl_scratch);
    }
    tl_scratch.max = max;
    sl_buf_reset(&tl_scratch);
    return &tl_scratch;
}

/* Take a prod_rec for (done, opaque) and link it; SL_ESTATE once destroy has begun. */
static int rec_link(
    sluice_producer_t *p, sluice_done_fn done, void *opaque, struct prod_rec **out, sl_err_t *err)
{
    struct prod_rec *rec;
    pthread_mutex_lock(&p->mu);
    if (p->closing) {
        pthread_mutex_unlock(&p->mu);
        return sl_err_set(err, SL_ESTATE, "cannot publish: the producer is being destroyed");
    }
    if (p->free_recs) {
        rec = p->free_recs;
        p->free_recs = rec->next;
        p->n_free--;
    } else {
        rec = sl_xmalloc(sizeof(*rec));
    }
    rec->done = done;
    rec->opaque = opaque;
    rec->prev = p->recs.prev;
    rec->next = &p->recs;
    p->recs.prev->next = rec;
    p->recs.prev = rec;
    p->outstanding++;
    pthread_mutex_unlock(&p->mu);
    *out = rec;
    return 0;
}

/* Map a producev error (not QUEUE_FULL) to our code and message. */
static int produce_error(sluice_producer_t *p, rd_kafka_resp_err_t e, size_t len, sl_err_t *err)
{
    char reason[256];
    if (e == RD_KAFKA_RESP_ERR__FATAL) {
        check_fatal(p);
        rd_kafka_resp_err_t fe = rd_kafka_fatal_error(p->rk, reason, sizeof(reason));
        return sl_err_set(err, SL_EKAFKA,
                          "cannot publish: kafka producer hit a fatal error (%s: %s); "
                          "recreate the producer",
                          rd_kafka_err2name(fe), reason);
    }
    if (e == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        /* valid for the contract but over librdkafka's message.max.bytes: this record's
         * problem, not the producer's */
        return sl_err_set(err, SL_ETOOBIG,
                          "record of %zu bytes exceeds the kafka producer's message.max.bytes",
                          len);
    }
    return sl_err_set(err, SL_EKAFKA, "could not publish to kafka topic %s: %s", p->topic,
                      rd_kafka_err2str(e));
}

/*
 * Hand the encoded value to librdkafka (it copies it), waiting up to enqueue_timeout_ms while
 * the local queue is full. On success rec belongs to the outstanding list until its report.
 */
static int produce(sluice_producer_t *p,
                   struct prod_rec *rec,
                   const char *key,
                   const struct sl_buf *val,
                   sl_err_t *err)
{
    int64_t deadline = -1; /* set on the first QUEUE_FULL */
    /* librdkafka's macros take a non-const key; with F_COPY it is only read */
    void *k = (void *)(uintptr_t)key;
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            p->rk, RD_KAFKA_V_RKT(p->rkt), RD_KAFKA_V_PARTITION(RD_KAFKA_PARTITION_UA),
            RD_KAFKA_V_KEY(k, strlen(key)), RD_KAFKA_V_VALUE(val->data, val->len),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(rec), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
            return 0;
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return produce_error(p, e, val->len, err);
        int64_t now = sl_mono_ms();
        if (deadline < 0)
            deadline = now + p->enqueue_timeout_ms;
        if (now >= deadline)
            return sl_err_set(err, SL_ETIMEDOUT,
                              "could not publish to kafka topic %s: local queue full for %" PRId64
                              " ms (kafka at %s not keeping up or unreachable)",
                              p->topic, p->enqueue_timeout_ms, p->brokers);
        /* Serving reports is what frees queue space (done may run here, even re-enter
         * publish: that one encodes into its own heap buffer). */
        (void)rd_kafka_poll(p->rk, QUEUE_FULL_POLL_MS);
    }
}

int prod_lib_publish(sluice_producer_t *p,
                     const struct sl_delivery *d,
                     sluice_done_fn done,
                     void *opaque,
                     sl_err_t *err)
{
    struct sl_buf heap;
    struct sl_buf *val;
    struct prod_rec *rec = NULL;
    size_t max = (p->lim.max_body ? p->lim.max_body : (size_t)SL_MAX_BODY_DEFAULT) +
                 (size_t)SL_RECORD_OVERHEAD;
    bool scratch = !tl_scratch_busy;
    int rc;

    sl_buf_init(&heap, max);
    if (scratch) {
        tl_scratch_busy = true;
        val = scratch_get(max);
    } else {
        val = &heap;
    }
    rc = sl_delivery_encode_lim(d, &p->lim, val, err);
    if (rc != 0)
        goto out;
    /* Linked before librdkafka sees it: another thread may serve its report at once. */
    rc = rec_link(p, done, opaque, &rec, err);
    if (rc != 0)
        goto out;
    rc = produce(p, rec, d->ep, val, err);
    if (rc != 0) {
        pthread_mutex_lock(&p->mu);
        rec_unlink(p, rec);
        rec_put(p, rec);
        pthread_mutex_unlock(&p->mu);
    }
out:
    if (scratch) {
        if (tl_scratch.cap > SCRATCH_KEEP)
            sl_buf_fini(&tl_scratch);
        tl_scratch_busy = false;
    }
    sl_buf_fini(&heap);
    return rc;
}

/* ==== Serving ==== */

int sluice_producer_poll(sluice_producer_t *p, int timeout_ms)
{
    int n = rd_kafka_poll(p->rk, timeout_ms);
    check_fatal(p);
    return n;
}

int sluice_producer_flush(sluice_producer_t *p, int timeout_ms, sluice_err_t *err)
{
    rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, timeout_ms);
    check_fatal(p);
    size_t left = sluice_producer_outstanding(p);
    if (e == RD_KAFKA_RESP_ERR__TIMED_OUT || left > 0) {
        sl_err_t ie = {0};
        sl_err_set(&ie, SL_ETIMEDOUT,
                   "could not flush: %zu records not acknowledged by kafka at %s after %d ms", left,
                   p->brokers, timeout_ms);
        return prod_err_out(err, &ie);
    }
    return 0;
}

size_t sluice_producer_outstanding(sluice_producer_t *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->outstanding;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int sluice_producer_fatal(sluice_producer_t *p, sluice_err_t *err)
{
    char reason[256];
    rd_kafka_resp_err_t e = rd_kafka_fatal_error(p->rk, reason, sizeof(reason));
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
        return 0;
    sl_err_t ie = {0};
    sl_err_set(&ie, SL_EKAFKA, "kafka producer fatal error: %s: %s; recreate the producer",
               rd_kafka_err2name(e), reason);
    return prod_err_out(err, &ie);
}

int sluice_producer_last_error(sluice_producer_t *p, bool *brokers_down, sluice_err_t *err)
{
    sl_err_t ie = {0};
    pthread_mutex_lock(&p->mu);
    if (brokers_down)
        *brokers_down = p->last_err != 0 && p->last_down;
    if (p->last_err != 0)
        sl_err_set(&ie, SL_EKAFKA, "%s", p->last_reason);
    pthread_mutex_unlock(&p->mu);
    return ie.code != 0 ? prod_err_out(err, &ie) : 0;
}

rd_kafka_t *prod_lib_kafka(sluice_producer_t *p)
{
    return p->rk;
}

/* ==== Public types ==== */

sluice_producer_t *sluice_producer_new(const sluice_config_t *cfg, sluice_err_t *err)
{
    return sluice_producer_new_opts(cfg, NULL, err);
}

sluice_producer_t *sluice_producer_new_opts(const sluice_config_t *cfg,
                                            const struct sluice_producer_opts *opts,
                                            sluice_err_t *err)
{
    struct sluice_config defaults;
    const struct sluice_config *c = cfg;
    sluice_producer_t *p = NULL;
    sl_err_t ie = {0};
    if (!c) {
        prod_conf_init(&defaults);
        c = &defaults;
    }
    if (prod_conf_check(c, &ie) == 0) {
        prod_conf_apply_log(c, opts && opts->role ? opts->role : ROLE_DEFAULT);
        p = prod_lib_new(&c->cfg, opts, &ie);
    }
    if (!p)
        prod_err_out(err, &ie);
    if (c == &defaults)
        prod_conf_fini(&defaults);
    return p;
}

/* Copy a public header or macro array into dst (cap entries, the contract's maximum). A
 * longer array is refused by its count before any entry is read, so only cap are copied. */
static const struct sl_kv *
kv_in(struct sl_kv *dst, size_t cap, const struct sluice_kv *src, size_t n)
{
    if (!src)
        return NULL;
    for (size_t i = 0; i < n && i < cap; i++) {
        dst[i].name = src[i].name;
        dst[i].value = src[i].value;
    }
    return dst;
}

int sluice_producer_publish(sluice_producer_t *p,
                            const struct sluice_delivery *d,
                            sluice_done_fn done,
                            void *opaque,
                            sluice_err_t *err)
{
    struct sl_kv hdr[SL_HDR_MAX];
    struct sl_kv macros[SL_MACRO_MAX];
    sl_err_t ie = {0};
    if (!d) {
        sl_err_set(&ie, SL_EINVAL, "no delivery record");
        return prod_err_out(err, &ie);
    }
    struct sl_delivery r = {
        .id = d->id,
        .ep = d->ep,
        .type = d->type,
        .ts_ms = d->ts_ms,
        .ct = d->ct,
        .body = d->body,
        .body_len = d->body_len,
        .hdr = kv_in(hdr, SL_HDR_MAX, d->hdr, d->n_hdr),
        .n_hdr = d->n_hdr,
        .macros = kv_in(macros, SL_MACRO_MAX, d->macros, d->n_macros),
        .n_macros = d->n_macros,
    };
    int rc = prod_lib_publish(p, &r, done, opaque, &ie);
    return rc != 0 ? prod_err_out(err, &ie) : 0;
}
