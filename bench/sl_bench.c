/*
 * sl-bench: helper tool for bench/run.sh (not part of the product; built by bench/run.sh
 * against the libraries of a Release build, see bench/README.md).
 *
 *   sl-bench pace --rate R --count N [--endpoints K] [--prefix P] [--body-bytes B]
 *                 [--run-id ID] [--profile lib|latency] [--linger-ms L]
 *       Publishes N synthetic deliveries (producer/prod_gen.h, the generator behind
 *       sluice-produce --generate) at R records/s to topic_deliveries, then waits for every
 *       acknowledgement. --profile lib (default) publishes through the application library
 *       producer/sluice_producer.h (SL_KAFKA_THROUGHPUT with the library's default linger,
 *       or its linger_ms option when --linger-ms is given); --profile latency uses
 *       common/sl_kafka's SL_KAFKA_LATENCY profile (linger.ms=2) with the same record codec.
 *       Prints one JSON object: published, failed, elapsed_s, rate, lag (how far the pacer
 *       fell behind its schedule) and publish->ack latency percentiles in ms.
 *
 *   sl-bench outcomes [--expect N] [--timeout-s S] [--idle-ms MS] [--id-prefix P]
 *                     [--t0-ms T] [--series FILE] [--cdf FILE]
 *       Reads topic_outcomes from the beginning (all partitions) until every partition is at
 *       its end and, with --expect, N delivered outcomes were seen (or --timeout-s passed).
 *       Only outcomes whose event id starts with P count. Prints one JSON object: outcomes
 *       by state, delivered count, first/last outcome time, publish->delivered latency
 *       (outcome ts_ms - created_ms) percentiles, HTTP request latency (lat_us)
 *       percentiles, and per-pod delivered counts. --series writes delivered outcomes per
 *       second (by outcome ts_ms, seconds since --t0-ms): "sec total pod1 pod2 ...";
 *       --cdf writes the publish->delivered latency CDF: "latency_ms fraction".
 *
 *   sl-bench endpoints-sql --count N --prefix P --url-base URL
 *       Prints SQL (COPY) that registers endpoints P0..P(N-1) with url URL<id> and one fresh
 *       signing secret each, sealed with SLUICE_MASTER_KEY exactly as sluicectl does; pipe
 *       it to psql, then run `sluicectl endpoints sync` to publish them. Registering 10,000
 *       endpoints one `sluicectl endpoints add` at a time takes about 20 minutes here.
 *
 *   sl-bench http --url URL [--inflight N] [--seconds S] [--body-bytes B] [--endpoints K]
 *                 [--caches C] [--cacert PEM]
 *       The libcurl ceiling: libcurl 7.88 as the consumer drives it (one multi handle with
 *       curl_multi_socket_action on epoll, pooled easy handles keeping their options and
 *       spread over C connection caches (64, the consumer's CONN_CACHES; 1 = the multi's
 *       own), HTTP/1.1, TCP_NODELAY, 1 KiB receive buffer) POSTing a B-byte body (512)
 *       with the consumer's header set (static values: no signing, no Kafka, no Redis) to
 *       URL<i> for i in 0..K-1 (K = 100; URL typically http://127.0.0.1:PORT/ok/), N
 *       requests in flight (1000), for S seconds (10). Prints one JSON object: requests,
 *       non-2xx, errors, elapsed_s, rate, caches, and this process's CPU seconds (user,
 *       system) per 10,000 requests. The rate a consumer that did nothing but its HTTP could
 *       reach with libcurl on this machine. --cacert PEM: HTTPS URLs are verified against
 *       that file alone (as endpoint_ca_file does in the consumer).
 *
 *   sl-bench fanout [--endpoints N] [--match M] [--lookups K]
 *       The fan-out lookup of sluice-api (api/api_fanout.c) on its own: builds N endpoint
 *       snapshots (10,000) as the endpoint table does (sl_endpoint_build, a sealed secret each),
 *       M (1,000) of them subscribed to the looked-up type (half by its exact name
 *       "bench.match.created", half by the wildcard "bench.match.*"), the rest each to an
 *       exact type of its own; indexes them and looks "bench.match.created" up K times
 *       (100,000). Prints one JSON object: build_ms, matched, examined, lookup_us_mean.
 *
 *   sl-bench publish --url URL --count N --body TEMPLATE --endpoints-file F [--inflight C]
 *                    [--header 'K: V']...
 *       Publishes N events through an HTTP API (the peers phase: sluice-api's POST /v1/events
 *       and Convoy's POST /api/v1/projects/{id}/events), C requests in flight over C
 *       keep-alive connections (32), libcurl multi on epoll. Event i's body is TEMPLATE with
 *       %EP% replaced by line i % K of F (K endpoint ids) and %SEQ% by i as 8 digits. An
 *       answer 429 or 503 (a throttled request) is sent again 100 ms later; every other
 *       answer is final. Prints one JSON object: accepted (2xx), throttled, non2xx, errors,
 *       answers by class, start_ms/end_ms (wall clock), elapsed_s, accepted_per_s, this
 *       process's CPU seconds, and the request time of the accepted ones (ms percentiles).
 *       Exits 0 when all N were accepted.
 *
 * Configuration comes from SLUICE_* variables through the common loader (brokers, topics,
 * master key), as for every Sluice process (sl-bench http reads none).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include "api/api_fanout.h"
#include "common/sl_cfg.h"
#include "common/sl_endpoints.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"
#include "common/sl_time.h"
#include "producer/prod_gen.h"
#include "producer/prod_lib.h"

#define PROG "sl-bench"

extern char **environ;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int64_t num_arg(const char *name, const char *s, int64_t lo, int64_t hi)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v < lo || v > hi)
        die("bad value for %s", name);
    return (int64_t)v;
}

static void load_cfg(struct sl_config *cfg)
{
    if (sl_cfg_load(cfg, NULL, environ, stderr) != 0)
        exit(78);
    sl_log_init(PROG, SL_LOG_WARN, 0);
}

/* ==== Histograms: fixed-width buckets with an overflow bucket ==== */

struct hist {
    uint64_t *b;    /* counts per bucket */
    size_t n;       /* buckets, the last one counts overflow */
    double width;   /* bucket width in the unit reported (ms) */
    uint64_t count; /* samples */
    double sum;     /* sum of samples, for the mean */
    double max;     /* largest sample */
};

static void hist_init(struct hist *h, size_t n, double width)
{
    memset(h, 0, sizeof(*h));
    h->b = sl_xcalloc(n, sizeof(*h->b));
    h->n = n;
    h->width = width;
}

static void hist_add(struct hist *h, double v)
{
    if (v < 0)
        v = 0;
    size_t i = (size_t)(v / h->width);
    if (i >= h->n)
        i = h->n - 1;
    h->b[i]++;
    h->count++;
    h->sum += v;
    if (v > h->max)
        h->max = v;
}

/* Value at quantile q (upper edge of the bucket holding it). */
static double hist_q(const struct hist *h, double q)
{
    if (h->count == 0)
        return 0;
    uint64_t want = (uint64_t)((double)h->count * q);
    if (want >= h->count)
        want = h->count - 1;
    uint64_t acc = 0;
    for (size_t i = 0; i < h->n; i++) {
        acc += h->b[i];
        if (acc > want)
            return i + 1 == h->n ? h->max : (double)(i + 1) * h->width;
    }
    return h->max;
}

static void hist_json(FILE *f, const char *name, const struct hist *h)
{
    fprintf(f,
            "\"%s\":{\"count\":%" PRIu64 ",\"mean\":%.3f,\"p50\":%.3f,\"p90\":%.3f,"
            "\"p95\":%.3f,\"p99\":%.3f,\"p999\":%.3f,\"max\":%.3f}",
            name, h->count, h->count ? h->sum / (double)h->count : 0.0, hist_q(h, 0.50),
            hist_q(h, 0.90), hist_q(h, 0.95), hist_q(h, 0.99), hist_q(h, 0.999), h->max);
}

static void hist_fini(struct hist *h)
{
    free(h->b);
    h->b = NULL;
}

/* ==== pace ==== */

struct pacer {
    struct hist ack; /* publish -> acknowledged, ms */
    uint64_t acked;  /* acknowledged records */
    uint64_t failed; /* failed records */
};

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void pace_done(struct pacer *pc, int64_t t_pub_us, int failed)
{
    if (failed) {
        pc->failed++;
        return;
    }
    pc->acked++;
    hist_add(&pc->ack, (double)(mono_us() - t_pub_us) / 1000.0);
}

static struct pacer *g_pacer; /* the callbacks below have no room for two pointers */

static void lib_done(void *opaque, int status, const char *reason)
{
    (void)reason;
    pace_done(g_pacer, (int64_t)(intptr_t)opaque, status != 0);
}

static void rk_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    pace_done(g_pacer, (int64_t)(intptr_t)m->_private, m->err != RD_KAFKA_RESP_ERR_NO_ERROR);
}

static int cmd_pace(int argc, char **argv)
{
    static const struct option lo[] = {{"rate", required_argument, NULL, 'r'},
                                       {"count", required_argument, NULL, 'n'},
                                       {"endpoints", required_argument, NULL, 'k'},
                                       {"prefix", required_argument, NULL, 'p'},
                                       {"body-bytes", required_argument, NULL, 'b'},
                                       {"run-id", required_argument, NULL, 'i'},
                                       {"profile", required_argument, NULL, 'P'},
                                       {"linger-ms", required_argument, NULL, 'L'},
                                       {NULL, 0, NULL, 0}};
    int64_t rate = 0, count = 0, endpoints = 100, body = 512, linger = 0;
    const char *prefix = "ep_", *run = NULL, *profile = "lib";
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'r':
            rate = num_arg("--rate", optarg, 1, 10000000);
            break;
        case 'n':
            count = num_arg("--count", optarg, 1, 1000000000);
            break;
        case 'k':
            endpoints = num_arg("--endpoints", optarg, 1, PROD_GEN_MAX_ENDPOINTS);
            break;
        case 'p':
            prefix = optarg;
            break;
        case 'b':
            body = num_arg("--body-bytes", optarg, 0, 16777216);
            break;
        case 'i':
            run = optarg;
            break;
        case 'P':
            profile = optarg;
            break;
        case 'L':
            linger = num_arg("--linger-ms", optarg, 1, SLUICE_PRODUCER_LINGER_MAX_MS);
            break;
        default:
            return 2;
        }
    }
    if (!rate || !count)
        die("%s", "pace needs --rate and --count");
    bool lib = strcmp(profile, "lib") == 0;
    if (!lib && strcmp(profile, "latency") != 0)
        die("unknown --profile %s (lib or latency)", profile);
    if (linger && !lib)
        die("%s", "--linger-ms applies to --profile lib only");
    struct sl_config cfg;
    load_cfg(&cfg);
    sl_err_t err;
    struct prod_gen g;
    if (prod_gen_init(&g, (uint64_t)count, (uint32_t)endpoints, (size_t)body,
                      (size_t)cfg.max_body_bytes, prefix, "bench.paced", run, &err) != 0)
        die("%s", err.msg);
    struct pacer pc;
    memset(&pc, 0, sizeof(pc));
    hist_init(&pc.ack, 600000, 0.1); /* 0.1 ms buckets up to 60 s */
    g_pacer = &pc;
    sluice_producer_t *p = NULL;
    rd_kafka_t *rk = NULL;
    struct sl_buf enc;
    sl_buf_init(&enc, (size_t)cfg.max_body_bytes * 2 + SL_RECORD_OVERHEAD);
    if (lib) {
        struct sluice_producer_opts po = {.linger_ms = linger};
        p = prod_lib_new(&cfg, &po, &err);
        if (!p)
            die("%s", err.msg);
    } else {
        rk = sl_kafka_producer_new(&cfg, "sl-bench-pace", SL_KAFKA_LATENCY, NULL, rk_dr, &err);
        if (!rk)
            die("%s", err.msg);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    uint64_t sent = 0, send_fail = 0;
    int64_t max_lag_us = 0;
    int64_t t0 = mono_us();
    const struct sl_delivery *d;
    while (!g_stop && (d = prod_gen_next(&g)) != NULL) {
        int64_t due = t0 + (int64_t)((double)sent * 1e6 / (double)rate);
        for (;;) {
            int64_t now = mono_us();
            if (now >= due) {
                if (now - due > max_lag_us)
                    max_lag_us = now - due;
                break;
            }
            if (lib)
                sluice_producer_poll(p, 0);
            else
                rd_kafka_poll(rk, 0);
            /* sleep, never spin: at 11,000/s a record is due every 91 us, and a pacer that
             * spun until then took a whole core of the 2-core machine from the stack it
             * measures (bench/README.md, "Why the bench runs as it does"). A sleep that
             * overshoots (timer slack) leaves the next records due at once: the schedule,
             * not the sleeps, sets the rate, and max_lag_ms reports how far behind it ran. */
            int64_t left = due - mono_us();
            if (left > 0) {
                struct timespec ts = {0, (long)(left > 1000 ? 1000 : left) * 1000};
                nanosleep(&ts, NULL);
            }
        }
        /* created-at is the moment of publishing: prod_gen stamps it in prod_gen_next, so
         * re-stamp it here, after the wait */
        struct sl_delivery rec = *d;
        rec.ts_ms = (uint64_t)sl_now_ms();
        void *opaque = (void *)(intptr_t)mono_us();
        int rc;
        if (lib) {
            rc = prod_lib_publish(p, &rec, lib_done, opaque, &err);
        } else {
            sl_buf_reset(&enc);
            rc = sl_delivery_encode(&rec, &enc, &err);
            if (rc == 0)
                rc = sl_kafka_produce(rk, cfg.topic_deliveries, rec.ep, strlen(rec.ep), enc.data,
                                      enc.len, opaque, 10000, &err);
        }
        if (rc != 0) {
            send_fail++;
            fprintf(stderr, PROG ": publish failed: %s\n", err.msg);
            if (send_fail > 10)
                break;
        } else {
            sent++;
        }
        if ((sent & 63) == 0) {
            if (lib)
                sluice_producer_poll(p, 0);
            else
                rd_kafka_poll(rk, 0);
        }
    }
    int64_t t_sent = mono_us();
    if (lib) {
        sluice_producer_flush(p, 60000, NULL);
        sluice_producer_destroy(p);
    } else {
        rd_kafka_flush(rk, 60000);
        rd_kafka_destroy(rk);
    }
    double el = (double)(t_sent - t0) / 1e6;
    printf("{\"profile\":\"%s\",\"linger_ms\":%" PRId64 ",\"target_rate\":%" PRId64
           ",\"sent\":%" PRIu64 ",\"published\":%" PRIu64 ",\"failed\":%" PRIu64
           ",\"elapsed_s\":%.3f,\"rate\":%.1f,\"max_lag_ms\":%.3f,",
           profile,
           lib ? (linger ? linger : SLUICE_PRODUCER_LINGER_DEFAULT_MS)
               : (int64_t)SL_KAFKA_LATENCY_LINGER_MS,
           rate, sent, pc.acked, pc.failed + send_fail, el, el > 0 ? (double)sent / el : 0.0,
           (double)max_lag_us / 1000.0);
    hist_json(stdout, "ack_ms", &pc.ack);
    printf("}\n");
    hist_fini(&pc.ack);
    sl_buf_fini(&enc);
    prod_gen_fini(&g);
    sl_cfg_fini(&cfg);
    return pc.acked == (uint64_t)count ? 0 : 1;
}

/* ==== outcomes ==== */

#define MAX_PODS 16
#define MAX_SECS 7200 /* per-second series length, s */

struct pod {
    char name[SL_POD_MAX + 1];  /* instance id */
    uint64_t delivered;         /* delivered outcomes */
    uint64_t first_ms, last_ms; /* first/last delivered outcome, unix ms */
    uint32_t *per_s;            /* delivered per second since t0 */
};

static struct pod *pod_of(struct pod *pods, int *npods, const char *name)
{
    for (int i = 0; i < *npods; i++) {
        if (strcmp(pods[i].name, name) == 0)
            return &pods[i];
    }
    if (*npods == MAX_PODS)
        return &pods[MAX_PODS - 1]; /* lumped together; never happens in bench/run.sh */
    struct pod *p = &pods[(*npods)++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->per_s = sl_xcalloc(MAX_SECS, sizeof(*p->per_s));
    return p;
}

static int cmd_outcomes(int argc, char **argv)
{
    static const struct option lo[] = {
        {"expect", required_argument, NULL, 'e'},  {"timeout-s", required_argument, NULL, 't'},
        {"idle-ms", required_argument, NULL, 'i'}, {"id-prefix", required_argument, NULL, 'p'},
        {"t0-ms", required_argument, NULL, '0'},   {"series", required_argument, NULL, 's'},
        {"cdf", required_argument, NULL, 'c'},     {NULL, 0, NULL, 0}};
    int64_t expect = 0, timeout_s = 600, idle_ms = 3000, t0_ms = 0;
    const char *prefix = "", *series = NULL, *cdf = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'e':
            expect = num_arg("--expect", optarg, 0, 1000000000);
            break;
        case 't':
            timeout_s = num_arg("--timeout-s", optarg, 1, 86400);
            break;
        case 'i':
            idle_ms = num_arg("--idle-ms", optarg, 1, 3600000);
            break;
        case 'p':
            prefix = optarg;
            break;
        case '0':
            t0_ms = num_arg("--t0-ms", optarg, 0, INT64_MAX);
            break;
        case 's':
            series = optarg;
            break;
        case 'c':
            cdf = optarg;
            break;
        default:
            return 2;
        }
    }
    struct sl_config cfg;
    load_cfg(&cfg);
    sl_err_t err;
    rd_kafka_conf_t *conf = sl_kafka_conf_new(&cfg, "sl-bench-outcomes", &err);
    if (!conf)
        die("%s", err.msg);
    char errstr[256], group[64];
    snprintf(group, sizeof(group), "sl-bench-%d-%" PRId64, (int)getpid(), sl_now_ms());
    if (rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "fetch.max.bytes", "52428800", errstr, sizeof(errstr)))
        die("%s", errstr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk)
        die("%s", errstr);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, cfg.topic_outcomes, NULL);
    rd_kafka_resp_err_t ke = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
    rd_kafka_topic_destroy(rkt);
    if (ke || md->topic_cnt != 1 || md->topics[0].err)
        die("cannot read metadata of %s", cfg.topic_outcomes);
    int nparts = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(l, cfg.topic_outcomes, md->topics[0].partitions[i].id)
            ->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_metadata_destroy(md);
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    struct hist e2e, http;
    hist_init(&e2e, 3600000, 1.0); /* 1 ms buckets up to 1 h */
    hist_init(&http, 600000, 0.1); /* 0.1 ms buckets up to 60 s */
    uint64_t states[SL_OUTCOME_STATE_COUNT] = {0};
    uint64_t total = 0, undecodable = 0, delivered = 0, first_ms = UINT64_MAX, last_ms = 0;
    uint64_t before_t0 = 0, late = 0;
    struct pod pods[MAX_PODS];
    int npods = 0;
    size_t plen = strlen(prefix);
    int eofs = 0;
    bool *at_eof = sl_xcalloc((size_t)nparts, sizeof(*at_eof));
    int64_t start = sl_mono_ms(), last_rx = start;
    while (!g_stop) {
        int64_t now = sl_mono_ms();
        if (now - start > timeout_s * 1000)
            break;
        bool enough = expect == 0 || delivered >= (uint64_t)expect;
        if (enough && eofs >= nparts)
            break;
        if (expect == 0 && now - last_rx > idle_ms)
            break;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (m->partition >= 0 && m->partition < nparts && !at_eof[m->partition]) {
                at_eof[m->partition] = true;
                eofs++;
            }
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err) {
            fprintf(stderr, PROG ": %s\n", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        last_rx = sl_mono_ms();
        if (m->partition >= 0 && m->partition < nparts && at_eof[m->partition]) {
            at_eof[m->partition] = false;
            eofs--;
        }
        struct sl_outcome o;
        if (sl_outcome_decode(m->payload, m->len, NULL, &o, &err) != 0) {
            undecodable++;
            rd_kafka_message_destroy(m);
            continue;
        }
        rd_kafka_message_destroy(m);
        if (o.id && strncmp(o.id, prefix, plen) == 0) {
            total++;
            if ((unsigned)o.state < SL_OUTCOME_STATE_COUNT)
                states[o.state]++;
            if (o.state == SL_OUTCOME_DELIVERED) {
                delivered++;
                if (o.ts_ms < first_ms)
                    first_ms = o.ts_ms;
                if (o.ts_ms > last_ms)
                    last_ms = o.ts_ms;
                hist_add(&e2e, (double)((int64_t)o.ts_ms - (int64_t)o.created_ms));
                hist_add(&http, (double)o.lat_us / 1000.0);
                struct pod *p = pod_of(pods, &npods, o.pod ? o.pod : "?");
                p->delivered++;
                if (!p->first_ms || o.ts_ms < p->first_ms)
                    p->first_ms = o.ts_ms;
                if (o.ts_ms > p->last_ms)
                    p->last_ms = o.ts_ms;
                int64_t sec = ((int64_t)o.ts_ms - t0_ms) / 1000;
                if (sec < 0) {
                    before_t0++;
                    sec = 0;
                }
                if (sec >= MAX_SECS) {
                    late++;
                    sec = MAX_SECS - 1;
                }
                p->per_s[sec]++;
            }
        }
        sl_outcome_fini(&o);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);

    printf("{\"outcomes\":%" PRIu64 ",\"undecodable\":%" PRIu64 ",\"states\":{", total,
           undecodable);
    for (int s = 0; s < SL_OUTCOME_STATE_COUNT; s++)
        printf("%s\"%s\":%" PRIu64, s ? "," : "", sl_outcome_state_name((enum sl_outcome_state)s),
               states[s]);
    printf("},\"delivered\":%" PRIu64 ",\"expected\":%" PRId64 ",\"complete\":%s,", delivered,
           expect, expect == 0 || delivered >= (uint64_t)expect ? "true" : "false");
    printf("\"first_ms\":%" PRIu64 ",\"last_ms\":%" PRIu64 ",\"before_t0\":%" PRIu64
           ",\"late\":%" PRIu64 ",",
           delivered ? first_ms : 0, last_ms, before_t0, late);
    hist_json(stdout, "e2e_ms", &e2e);
    printf(",");
    hist_json(stdout, "http_ms", &http);
    printf(",\"pods\":{");
    int64_t max_sec = 0;
    for (int i = 0; i < npods; i++) {
        printf("%s\"%s\":{\"delivered\":%" PRIu64 ",\"first_ms\":%" PRIu64 ",\"last_ms\":%" PRIu64
               "}",
               i ? "," : "", pods[i].name, pods[i].delivered, pods[i].first_ms, pods[i].last_ms);
        for (int64_t s = MAX_SECS - 1; s > max_sec; s--) {
            if (pods[i].per_s[s]) {
                max_sec = s;
                break;
            }
        }
    }
    printf("}}\n");
    if (series) {
        FILE *f = fopen(series, "w");
        if (!f)
            die("cannot write %s", series);
        fprintf(f, "# sec total");
        for (int i = 0; i < npods; i++)
            fprintf(f, " %s", pods[i].name);
        fprintf(f, "\n");
        for (int64_t s = 0; s <= max_sec && npods; s++) {
            uint64_t sum = 0;
            for (int i = 0; i < npods; i++)
                sum += pods[i].per_s[s];
            fprintf(f, "%" PRId64 " %" PRIu64, s, sum);
            for (int i = 0; i < npods; i++)
                fprintf(f, " %u", pods[i].per_s[s]);
            fprintf(f, "\n");
        }
        fclose(f);
    }
    if (cdf) {
        FILE *f = fopen(cdf, "w");
        if (!f)
            die("cannot write %s", cdf);
        fprintf(f, "# latency_ms fraction (publish -> delivered)\n");
        uint64_t acc = 0;
        for (size_t i = 0; i < e2e.n && e2e.count; i++) {
            if (!e2e.b[i])
                continue;
            acc += e2e.b[i];
            fprintf(f, "%zu %.6f\n", i, (double)acc / (double)e2e.count);
        }
        fclose(f);
    }
    for (int i = 0; i < npods; i++)
        free(pods[i].per_s);
    free(at_eof);
    hist_fini(&e2e);
    hist_fini(&http);
    sl_cfg_fini(&cfg);
    return expect == 0 || delivered >= (uint64_t)expect ? 0 : 1;
}

/* ==== endpoints-sql ==== */

static int cmd_endpoints_sql(int argc, char **argv)
{
    static const struct option lo[] = {{"count", required_argument, NULL, 'n'},
                                       {"prefix", required_argument, NULL, 'p'},
                                       {"url-base", required_argument, NULL, 'u'},
                                       {NULL, 0, NULL, 0}};
    int64_t count = 0;
    const char *prefix = NULL, *url = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'n':
            count = num_arg("--count", optarg, 1, 1000000);
            break;
        case 'p':
            prefix = optarg;
            break;
        case 'u':
            url = optarg;
            break;
        default:
            return 2;
        }
    }
    if (!count || !prefix || !url)
        die("%s", "endpoints-sql needs --count, --prefix and --url-base");
    struct sl_config cfg;
    load_cfg(&cfg);
    sl_err_t err;
    struct sl_masterkey mk;
    if (sl_masterkey_parse(&mk, cfg.master_key, &err) != 0)
        die("master_key: %s", err.msg);
    /* subscribed to "bench.many" only: an event fanned out to another type (the api phase's
     * bench.fan.*) must not reach these (an empty list would be every type) */
    printf("begin;\ncopy endpoints (id, url, event_types) from stdin;\n");
    for (int64_t i = 0; i < count; i++)
        printf("%s%" PRId64 "\t%s%s%" PRId64 "\t{bench.many}\n", prefix, i, url, prefix, i);
    printf("\\.\ncopy endpoint_secrets (endpoint_id, seq, secret_enc) from stdin;\n");
    for (int64_t i = 0; i < count; i++) {
        char id[SL_ENDPOINT_ID_MAX + 1], whsec[SL_SECRET_STR_MAX];
        uint8_t box[SL_SECRET_ENC_MAX];
        size_t blen = 0;
        struct sl_secret s;
        snprintf(id, sizeof(id), "%s%" PRId64, prefix, i);
        if (sl_secret_generate(&s, &err) != 0 ||
            sl_secret_format(&s, whsec, sizeof(whsec), &err) != 0 ||
            sl_secretbox_seal(&mk, id, (const uint8_t *)whsec, strlen(whsec), box, sizeof(box),
                              &blen, &err) != 0)
            die("cannot seal a secret: %s", err.msg);
        sl_secret_wipe(whsec, sizeof(whsec));
        sl_secret_fini(&s);
        printf("%s\t1\t\\\\x", id);
        for (size_t k = 0; k < blen; k++)
            printf("%02x", box[k]);
        printf("\n");
    }
    printf("\\.\ncommit;\n");
    sl_masterkey_fini(&mk);
    sl_cfg_fini(&cfg);
    return 0;
}

/* ==== http: the libcurl ceiling ==== */

struct hx {
    CURL *easy;
    struct hx *next; /* free list */
};

#define HB_CACHES_MAX 1024

struct hbench {
    CURLM *multi;
    CURLSH *shares[HB_CACHES_MAX]; /* connection caches; none: the multi's own */
    size_t n_shares, n_handles;
    int ep;                 /* epoll fd */
    int64_t timeout_ms;     /* libcurl's timer: -1 none */
    struct hx *free;        /* idle handles */
    struct curl_slist *hdr; /* the consumer's header set, static values */
    char **urls;            /* one per endpoint */
    size_t n_urls, next_url;
    char *body;
    size_t body_len;
    const char *cacert; /* CURLOPT_CAINFO (the consumer's endpoint_ca_file); NULL: system's */
    uint64_t done, non2xx, errors;
};

static int hb_sock(CURL *e, curl_socket_t s, int what, void *userp, void *sockp)
{
    (void)e;
    (void)sockp;
    struct hbench *b = userp;
    struct epoll_event ev = {0};
    ev.data.fd = s;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(b->ep, EPOLL_CTL_DEL, s, NULL);
        return 0;
    }
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    if (epoll_ctl(b->ep, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
        epoll_ctl(b->ep, EPOLL_CTL_ADD, s, &ev);
    return 0;
}

static int hb_timer(CURLM *m, long timeout_ms, void *userp)
{
    (void)m;
    ((struct hbench *)userp)->timeout_ms = timeout_ms;
    return 0;
}

static size_t hb_discard(char *p, size_t size, size_t n, void *userp)
{
    (void)p;
    (void)userp;
    return size * n;
}

static void hb_start(struct hbench *b)
{
    struct hx *x = b->free;
    if (x) {
        b->free = x->next;
    } else {
        x = sl_xcalloc(1, sizeof(*x));
        x->easy = curl_easy_init();
        if (!x->easy)
            die("curl_easy_init failed");
        CURL *e = x->easy;
        if (b->n_shares)
            curl_easy_setopt(e, CURLOPT_SHARE, b->shares[b->n_handles++ % b->n_shares]);
        curl_easy_setopt(e, CURLOPT_PRIVATE, x);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(e, CURLOPT_PROXY, "");
        curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(e, CURLOPT_USERAGENT, "Sluice/bench");
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, hb_discard);
        curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 1024L);
        curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 16384L);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, b->hdr);
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, b->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b->body_len);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
        if (b->cacert) {
            curl_easy_setopt(e, CURLOPT_CAINFO, b->cacert);
            curl_easy_setopt(e, CURLOPT_CAPATH, (char *)NULL);
        }
    }
    curl_easy_setopt(x->easy, CURLOPT_URL, b->urls[b->next_url]);
    b->next_url = (b->next_url + 1) % b->n_urls;
    if (curl_multi_add_handle(b->multi, x->easy) != CURLM_OK)
        die("curl_multi_add_handle failed");
}

static void hb_reap(struct hbench *b, bool more)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(b->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURL *e = m->easy_handle;
        struct hx *x = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        if (m->data.result != CURLE_OK)
            b->errors++;
        else if (status < 200 || status > 299)
            b->non2xx++;
        b->done++;
        curl_multi_remove_handle(b->multi, e);
        x->next = b->free;
        b->free = x;
        if (more)
            hb_start(b);
    }
}

static double cpu_s(const struct timeval *tv)
{
    return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

static int cmd_http(int argc, char **argv)
{
    const char *url = NULL, *cacert = NULL;
    int64_t inflight = 1000, seconds = 10, body_bytes = 512, endpoints = 100, caches = 64;
    static const struct option lo[] = {
        {"url", required_argument, NULL, 'u'},       {"inflight", required_argument, NULL, 'n'},
        {"seconds", required_argument, NULL, 's'},   {"body-bytes", required_argument, NULL, 'b'},
        {"endpoints", required_argument, NULL, 'k'}, {"caches", required_argument, NULL, 'c'},
        {"cacert", required_argument, NULL, 'a'},    {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'u':
            url = optarg;
            break;
        case 'n':
            inflight = num_arg("--inflight", optarg, 1, 100000);
            break;
        case 's':
            seconds = num_arg("--seconds", optarg, 1, 3600);
            break;
        case 'b':
            body_bytes = num_arg("--body-bytes", optarg, 0, 1 << 20);
            break;
        case 'k':
            endpoints = num_arg("--endpoints", optarg, 1, 1000000);
            break;
        case 'c':
            caches = num_arg("--caches", optarg, 1, HB_CACHES_MAX);
            break;
        case 'a':
            cacert = optarg;
            break;
        default:
            die("usage: " PROG " http --url URL [--inflight N] [--seconds S] "
                "[--body-bytes B] [--endpoints K] [--caches C] [--cacert PEM]");
        }
    }
    if (!url)
        die("http: --url is required");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        die("curl_global_init failed");
    struct hbench b = {.timeout_ms = -1, .cacert = cacert};
    b.multi = curl_multi_init();
    b.ep = epoll_create1(EPOLL_CLOEXEC);
    if (!b.multi || b.ep < 0)
        die("could not create the multi handle or the epoll set");
    curl_multi_setopt(b.multi, CURLMOPT_SOCKETFUNCTION, hb_sock);
    curl_multi_setopt(b.multi, CURLMOPT_SOCKETDATA, &b);
    curl_multi_setopt(b.multi, CURLMOPT_TIMERFUNCTION, hb_timer);
    curl_multi_setopt(b.multi, CURLMOPT_TIMERDATA, &b);
    curl_multi_setopt(b.multi, CURLMOPT_PIPELINING, (long)CURLPIPE_NOTHING);
    curl_multi_setopt(b.multi, CURLMOPT_MAXCONNECTS, (long)inflight * 2);
    /* as the consumer (consumer/cons_http.c, CONN_CACHES): handles spread over share objects
     * with a connection cache each, so libcurl's per-request cache walks cover 1/C of the
     * connections; --caches 1 leaves every connection in the multi's one cache */
    for (int64_t i = 0; caches > 1 && i < caches; i++) {
        b.shares[i] = curl_share_init();
        if (!b.shares[i] ||
            curl_share_setopt(b.shares[i], CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK)
            die("could not create libcurl connection-cache share %lld", (long long)i);
        b.n_shares++;
    }
    /* the header lines the consumer sends (values of the usual length) */
    static const char *const hdrs[] = {
        "Content-Type: application/json",
        "webhook-id: evt_bench_0000000000000000",
        "webhook-timestamp: 1764547200",
        "webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        "X-Sluice-Attempt: 1",
        "X-Sluice-Created-Ms: 1764547200000",
        "Expect:",
    };
    for (size_t i = 0; i < sizeof(hdrs) / sizeof(hdrs[0]); i++)
        b.hdr = curl_slist_append(b.hdr, hdrs[i]);
    b.body_len = (size_t)body_bytes;
    b.body = sl_xmalloc(b.body_len + 1);
    memset(b.body, 'x', b.body_len);
    b.body[b.body_len] = '\0';
    b.n_urls = (size_t)endpoints;
    b.urls = sl_xcalloc(b.n_urls, sizeof(*b.urls));
    for (size_t i = 0; i < b.n_urls; i++) {
        size_t n = strlen(url) + 24;
        b.urls[i] = sl_xmalloc(n);
        snprintf(b.urls[i], n, "%s%zu", url, i);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    int64_t t0 = mono_us(), end = t0 + seconds * 1000000;
    for (int64_t i = 0; i < inflight; i++)
        hb_start(&b);
    int running = 0;
    curl_multi_socket_action(b.multi, CURL_SOCKET_TIMEOUT, 0, &running);
    struct epoll_event evs[256];
    while (!g_stop) {
        bool more = mono_us() < end;
        if (!more && running == 0)
            break;
        int wait = b.timeout_ms < 0 || b.timeout_ms > 100 ? 100 : (int)b.timeout_ms;
        int n = epoll_wait(b.ep, evs, 256, wait);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            int ev = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                     (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                     (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            curl_multi_socket_action(b.multi, evs[i].data.fd, ev, &running);
        }
        if (n <= 0)
            curl_multi_socket_action(b.multi, CURL_SOCKET_TIMEOUT, 0, &running);
        hb_reap(&b, more);
    }
    int64_t t1 = mono_us();
    getrusage(RUSAGE_SELF, &ru1);
    double el = (double)(t1 - t0) / 1e6;
    double per = b.done ? 10000.0 / (double)b.done : 0;
    printf("{\"requests\":%" PRIu64 ",\"non2xx\":%" PRIu64 ",\"errors\":%" PRIu64
           ",\"elapsed_s\":%.3f,\"rate\":%.1f,\"inflight\":%" PRId64 ",\"endpoints\":%zu,"
           "\"caches\":%zu,\"cpu_user_s_per_10k\":%.3f,\"cpu_sys_s_per_10k\":%.3f}\n",
           b.done, b.non2xx, b.errors, el, el > 0 ? (double)b.done / el : 0.0, inflight, b.n_urls,
           b.n_shares ? b.n_shares : (size_t)1, (cpu_s(&ru1.ru_utime) - cpu_s(&ru0.ru_utime)) * per,
           (cpu_s(&ru1.ru_stime) - cpu_s(&ru0.ru_stime)) * per);
    while (b.free) {
        struct hx *x = b.free;
        b.free = x->next;
        curl_easy_cleanup(x->easy);
        free(x);
    }
    curl_multi_cleanup(b.multi);
    for (size_t i = 0; i < b.n_shares; i++)
        curl_share_cleanup(b.shares[i]);
    curl_slist_free_all(b.hdr);
    for (size_t i = 0; i < b.n_urls; i++)
        free(b.urls[i]);
    free(b.urls);
    free(b.body);
    close(b.ep);
    curl_global_cleanup();
    return b.errors || b.non2xx ? 1 : 0;
}

/* ==== publish: N events through an HTTP API, keep-alive, every answer counted ==== */

struct px {
    CURL *easy;
    struct px *next; /* free list */
    char *body;      /* this request's body, rendered from the template */
    size_t body_cap;
    int64_t seq;    /* event number, 0..count-1 */
    int64_t t0_us;  /* when the request was started */
    int64_t due_us; /* retry list: not before this time */
};

struct pbench {
    struct hbench h; /* first: hb_sock and hb_timer take it (multi, epoll set, timer) */
    const char *url;
    struct curl_slist *hdr;
    const char *tmpl; /* body template: %EP% -> endpoint id, %SEQ% -> 8-digit seq */
    char **eps;       /* endpoint ids, event seq goes to eps[seq % n_eps] */
    size_t n_eps;
    int64_t count, next_seq;
    struct px *free;
    struct px **retry; /* throttled requests waiting to be sent again */
    size_t n_retry, cap_retry;
    uint64_t attempts, accepted, throttled, non2xx, errors;
    uint64_t by_status[6]; /* final answers by class: 0 = none (error), 1xx..5xx */
    struct hist lat;       /* request time of the accepted ones, ms */
};

static void pb_render(struct px *x, const struct pbench *p)
{
    const char *ep = p->eps[(size_t)x->seq % p->n_eps];
    char seq[24];
    snprintf(seq, sizeof(seq), "%08" PRId64, x->seq);
    size_t need = strlen(p->tmpl) + 1;
    for (const char *s = p->tmpl; (s = strchr(s, '%')) != NULL; s++) {
        if (strncmp(s, "%EP%", 4) == 0)
            need += strlen(ep);
        else if (strncmp(s, "%SEQ%", 5) == 0)
            need += strlen(seq);
    }
    if (need > x->body_cap) {
        x->body = sl_xrealloc(x->body, need);
        x->body_cap = need;
    }
    size_t o = 0;
    for (const char *s = p->tmpl; *s;) {
        const char *put = NULL;
        size_t skip = 1;
        if (strncmp(s, "%EP%", 4) == 0) {
            put = ep;
            skip = 4;
        } else if (strncmp(s, "%SEQ%", 5) == 0) {
            put = seq;
            skip = 5;
        }
        if (put) {
            size_t n = strlen(put);
            memcpy(x->body + o, put, n);
            o += n;
        } else {
            x->body[o++] = *s;
        }
        s += skip;
    }
    x->body[o] = '\0';
}

static void pb_send(struct pbench *p, struct px *x)
{
    pb_render(x, p);
    curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(x->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(x->body));
    x->t0_us = mono_us();
    p->attempts++;
    if (curl_multi_add_handle(p->h.multi, x->easy) != CURLM_OK)
        die("curl_multi_add_handle failed");
}

static struct px *pb_handle(struct pbench *p)
{
    struct px *x = p->free;
    if (x) {
        p->free = x->next;
        return x;
    }
    x = sl_xcalloc(1, sizeof(*x));
    x->easy = curl_easy_init();
    if (!x->easy)
        die("curl_easy_init failed");
    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_URL, p->url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "sl-bench publish");
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, hb_discard);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, p->hdr);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    return x;
}

/* Start what may start: due retries first, then new events while any are left. */
static void pb_fill(struct pbench *p, int64_t inflight, int64_t *running)
{
    int64_t now = mono_us();
    for (size_t i = 0; i < p->n_retry && *running < inflight;) {
        if (p->retry[i]->due_us <= now) {
            struct px *x = p->retry[i];
            p->retry[i] = p->retry[--p->n_retry];
            pb_send(p, x);
            (*running)++;
        } else {
            i++;
        }
    }
    while (*running < inflight && p->next_seq < p->count) {
        struct px *x = pb_handle(p);
        x->seq = p->next_seq++;
        pb_send(p, x);
        (*running)++;
    }
}

static void pb_reap(struct pbench *p, int64_t *running)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(p->h.multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURL *e = m->easy_handle;
        struct px *x = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(p->h.multi, e);
        (*running)--;
        if (m->data.result == CURLE_OK && (status == 429 || status == 503)) {
            /* throttled (Convoy's ingest limit answers 429): the same event again in 100 ms */
            p->throttled++;
            x->due_us = mono_us() + 100000;
            if (p->n_retry == p->cap_retry) {
                p->cap_retry = p->cap_retry ? p->cap_retry * 2 : 64;
                p->retry = sl_xrealloc(p->retry, p->cap_retry * sizeof(*p->retry));
            }
            p->retry[p->n_retry++] = x;
            continue;
        }
        if (m->data.result != CURLE_OK) {
            p->errors++;
            p->by_status[0]++;
        } else {
            p->by_status[status >= 100 && status < 600 ? status / 100 : 0]++;
            if (status >= 200 && status <= 299) {
                p->accepted++;
                hist_add(&p->lat, (double)(mono_us() - x->t0_us) / 1000.0);
            } else {
                p->non2xx++;
            }
        }
        x->next = p->free;
        p->free = x;
    }
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cmd_publish(int argc, char **argv)
{
    static const struct option lo[] = {{"url", required_argument, NULL, 'u'},
                                       {"count", required_argument, NULL, 'n'},
                                       {"inflight", required_argument, NULL, 'c'},
                                       {"header", required_argument, NULL, 'H'},
                                       {"body", required_argument, NULL, 'b'},
                                       {"endpoints-file", required_argument, NULL, 'f'},
                                       {NULL, 0, NULL, 0}};
    struct pbench p = {.h = {.timeout_ms = -1}};
    int64_t inflight = 32;
    const char *epfile = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'u':
            p.url = optarg;
            break;
        case 'n':
            p.count = num_arg("--count", optarg, 1, 100000000);
            break;
        case 'c':
            inflight = num_arg("--inflight", optarg, 1, 10000);
            break;
        case 'H':
            p.hdr = curl_slist_append(p.hdr, optarg);
            break;
        case 'b':
            p.tmpl = optarg;
            break;
        case 'f':
            epfile = optarg;
            break;
        default:
            die("usage: " PROG " publish --url URL --count N --body TEMPLATE --endpoints-file F "
                "[--inflight C] [--header 'K: V']...");
        }
    }
    if (!p.url || !p.count || !p.tmpl || !epfile)
        die("publish: --url, --count, --body and --endpoints-file are required");
    FILE *f = fopen(epfile, "r");
    if (!f)
        die("publish: %s: %s", epfile, strerror(errno));
    char line[512];
    size_t cap = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        if (p.n_eps == cap) {
            cap = cap ? cap * 2 : 128;
            p.eps = sl_xrealloc(p.eps, cap * sizeof(*p.eps));
        }
        p.eps[p.n_eps++] = sl_xstrdup(line);
    }
    fclose(f);
    if (!p.n_eps)
        die("publish: no endpoint ids in %s", epfile);
    p.hdr = curl_slist_append(p.hdr, "Content-Type: application/json");
    p.hdr = curl_slist_append(p.hdr, "Expect:");
    hist_init(&p.lat, 60000, 0.1); /* 0.1 ms buckets up to 6 s */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        die("curl_global_init failed");
    p.h.multi = curl_multi_init();
    p.h.ep = epoll_create1(EPOLL_CLOEXEC);
    if (!p.h.multi || p.h.ep < 0)
        die("could not create the multi handle or the epoll set");
    curl_multi_setopt(p.h.multi, CURLMOPT_SOCKETFUNCTION, hb_sock);
    curl_multi_setopt(p.h.multi, CURLMOPT_SOCKETDATA, &p.h);
    curl_multi_setopt(p.h.multi, CURLMOPT_TIMERFUNCTION, hb_timer);
    curl_multi_setopt(p.h.multi, CURLMOPT_TIMERDATA, &p.h);
    curl_multi_setopt(p.h.multi, CURLMOPT_PIPELINING, (long)CURLPIPE_NOTHING);
    curl_multi_setopt(p.h.multi, CURLMOPT_MAXCONNECTS, (long)inflight);
    curl_multi_setopt(p.h.multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)inflight);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    int64_t t0 = mono_us(), w0 = wall_ms(), running = 0;
    int still = 0;
    pb_fill(&p, inflight, &running);
    curl_multi_socket_action(p.h.multi, CURL_SOCKET_TIMEOUT, 0, &still);
    struct epoll_event evs[256];
    while (!g_stop && (running > 0 || p.n_retry > 0 || p.next_seq < p.count)) {
        int wait = p.h.timeout_ms < 0 || p.h.timeout_ms > 20 ? 20 : (int)p.h.timeout_ms;
        int n = epoll_wait(p.h.ep, evs, 256, wait);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            int ev = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                     (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                     (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            curl_multi_socket_action(p.h.multi, evs[i].data.fd, ev, &still);
        }
        if (n <= 0)
            curl_multi_socket_action(p.h.multi, CURL_SOCKET_TIMEOUT, 0, &still);
        pb_reap(&p, &running);
        int64_t before = running;
        pb_fill(&p, inflight, &running);
        if (running != before)
            curl_multi_socket_action(p.h.multi, CURL_SOCKET_TIMEOUT, 0, &still);
    }
    int64_t t1 = mono_us(), w1 = wall_ms();
    getrusage(RUSAGE_SELF, &ru1);
    double el = (double)(t1 - t0) / 1e6;
    printf("{\"count\":%" PRId64 ",\"attempts\":%" PRIu64 ",\"accepted\":%" PRIu64
           ",\"throttled\":%" PRIu64 ",\"non2xx\":%" PRIu64 ",\"errors\":%" PRIu64
           ",\"by_class\":{\"none\":%" PRIu64 ",\"1xx\":%" PRIu64 ",\"2xx\":%" PRIu64
           ",\"3xx\":%" PRIu64 ",\"4xx\":%" PRIu64 ",\"5xx\":%" PRIu64 "},\"inflight\":%" PRId64
           ",\"endpoints\":%zu,\"start_ms\":%" PRId64 ",\"end_ms\":%" PRId64
           ",\"elapsed_s\":%.3f,\"accepted_per_s\":%.1f,\"cpu_user_s\":%.3f,\"cpu_sys_s\":%.3f,",
           p.count, p.attempts, p.accepted, p.throttled, p.non2xx, p.errors, p.by_status[0],
           p.by_status[1], p.by_status[2], p.by_status[3], p.by_status[4], p.by_status[5], inflight,
           p.n_eps, w0, w1, el, el > 0 ? (double)p.accepted / el : 0.0,
           cpu_s(&ru1.ru_utime) - cpu_s(&ru0.ru_utime),
           cpu_s(&ru1.ru_stime) - cpu_s(&ru0.ru_stime));
    hist_json(stdout, "request_ms", &p.lat);
    printf("}\n");
    while (p.free) {
        struct px *x = p.free;
        p.free = x->next;
        curl_easy_cleanup(x->easy);
        free(x->body);
        free(x);
    }
    for (size_t i = 0; i < p.n_retry; i++) {
        curl_easy_cleanup(p.retry[i]->easy);
        free(p.retry[i]->body);
        free(p.retry[i]);
    }
    free(p.retry);
    curl_multi_cleanup(p.h.multi);
    curl_slist_free_all(p.hdr);
    for (size_t i = 0; i < p.n_eps; i++)
        free(p.eps[i]);
    free(p.eps);
    hist_fini(&p.lat);
    close(p.h.ep);
    curl_global_cleanup();
    return p.accepted == (uint64_t)p.count ? 0 : 1;
}

/* ==== fanout: the subscription lookup of sluice-api ==== */

static int cmd_fanout(int argc, char **argv)
{
    int64_t n = 10000, m = 1000, k = 100000;
    static const struct option lo[] = {{"endpoints", required_argument, NULL, 'n'},
                                       {"match", required_argument, NULL, 'm'},
                                       {"lookups", required_argument, NULL, 'k'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'n':
            n = num_arg("--endpoints", optarg, 1, 1000000);
            break;
        case 'm':
            m = num_arg("--match", optarg, 0, 1000000);
            break;
        case 'k':
            k = num_arg("--lookups", optarg, 1, 100000000);
            break;
        default:
            die("usage: " PROG " fanout [--endpoints N] [--match M] [--lookups K]");
        }
    }
    if (m > n)
        die("fanout: --match must not exceed --endpoints");
    struct sl_masterkey mk;
    if (sl_masterkey_parse(&mk, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                           NULL) != 0)
        die("fanout: master key");
    struct sl_endpoint_defaults d = {15000, 5000, 30000, 3600000, 5, 10, 300000, 1000, 64};
    const struct sl_endpoint **eps = sl_xcalloc((size_t)n, sizeof(*eps));
    int64_t t0 = mono_us();
    for (int64_t i = 0; i < n; i++) {
        char id[32], own[64], whsec[SL_SECRET_STR_MAX];
        uint8_t box[SL_SECRET_ENC_MAX];
        size_t blen = 0;
        struct sl_secret sec;
        (void)snprintf(id, sizeof(id), "ep%07" PRId64, i);
        (void)snprintf(own, sizeof(own), "other.%" PRId64 ".created", i);
        if (sl_secret_generate(&sec, NULL) != 0 ||
            sl_secret_format(&sec, whsec, sizeof(whsec), NULL) != 0 ||
            sl_secretbox_seal(&mk, id, (const uint8_t *)whsec, strlen(whsec), box, sizeof(box),
                              &blen, NULL) != 0)
            die("fanout: could not seal a secret");
        sl_secret_fini(&sec);
        const char *types[1] = {i < m ? (i % 2 ? "bench.match.*" : "bench.match.created") : own};
        struct sl_endpoint_secret es = {box, blen, 0};
        struct sl_endpoint_rec rec;
        memset(&rec, 0, sizeof(rec));
        rec.id = id;
        rec.url = "https://hooks.example/x";
        rec.secrets = &es;
        rec.n_secrets = 1;
        rec.enabled = true;
        rec.types = types;
        rec.n_types = 1;
        struct sl_endpoint *e = NULL;
        if (sl_endpoint_build(&rec, &mk, &d, 1, &e, NULL) != 0)
            die("fanout: could not build endpoint %s", id);
        eps[i] = e;
    }
    int64_t t1 = mono_us();
    api_fanout_idx_t *x = api_fanout_index(eps, (size_t)n, 1);
    int64_t t2 = mono_us();
    size_t matched = 0, examined = 0;
    for (int64_t i = 0; i < k; i++) {
        const struct sl_endpoint **out = NULL;
        matched = api_fanout_match(x, "bench.match.created", NULL, 0, &out, &examined);
        free(out);
    }
    int64_t t3 = mono_us();
    printf("{\"endpoints\":%" PRId64 ",\"match\":%" PRId64 ",\"lookups\":%" PRId64
           ",\"snapshots_ms\":%.1f,\"build_ms\":%.1f,\"matched\":%zu,\"examined\":%zu,"
           "\"lookup_us_mean\":%.2f}\n",
           n, m, k, (double)(t1 - t0) / 1000.0, (double)(t2 - t1) / 1000.0, matched, examined,
           (double)(t3 - t2) / (double)k);
    api_fanout_idx_release(x);
    sl_masterkey_fini(&mk);
    return matched == (size_t)m ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: " PROG
                " pace|outcomes|endpoints-sql|http|fanout|publish [options] (see the source "
                "header or bench/README.md)\n");
        return 2;
    }
    const char *cmd = argv[1];
    argv[1] = argv[0];
    if (strcmp(cmd, "pace") == 0)
        return cmd_pace(argc - 1, argv + 1);
    if (strcmp(cmd, "outcomes") == 0)
        return cmd_outcomes(argc - 1, argv + 1);
    if (strcmp(cmd, "endpoints-sql") == 0)
        return cmd_endpoints_sql(argc - 1, argv + 1);
    if (strcmp(cmd, "http") == 0)
        return cmd_http(argc - 1, argv + 1);
    if (strcmp(cmd, "fanout") == 0)
        return cmd_fanout(argc - 1, argv + 1);
    if (strcmp(cmd, "publish") == 0)
        return cmd_publish(argc - 1, argv + 1);
    fprintf(stderr, PROG ": unknown command %s\n", cmd);
    return 2;
}
