/*
 * sl-test-outcomes: publish synthetic outcome records (the consumer's output) for recorder
 * benchmarks and manual testing.
 *
 *   sl-test-outcomes --generate-outcomes N --topic T [--endpoints E] [--prefix P] [--seed S]
 *                    [--env-bytes B]
 *
 * Reads SLUICE_KAFKA_BROKERS (and the other SLUICE_* options through the config loader).
 * Publishes exactly N records, keyed by endpoint id, through the idempotent throughput
 * producer, as the lifecycles of events <P>-<n> on endpoints <P>-ep<k> (k < E):
 *   70 %  delivered on attempt 1                              (1 record)
 *   18 %  retry_scheduled (503 or timeout), then delivered     (2 records)
 *    4 %  retry_scheduled x4, then dead_letter with env         (5 records)
 *    4 %  delivered, then duplicate                             (2 records)
 *    4 %  deferred (breaker_open), then delivered               (2 records)
 * The last event is cut short when N is reached. Timestamps are within the last few minutes.
 * Prints one summary line with the exact row counts the recorder must produce:
 *   records=N events=… dead_letters=… samples=… elapsed_s=… records_per_s=…
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_cfg.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_time.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
    /* xorshift64*: deterministic per seed */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

struct gen {
    rd_kafka_t *rk;    /* producer */
    const char *topic; /* target topic */
    struct sl_buf out; /* encode scratch */
    uint64_t left;     /* records still to publish */
    uint64_t records;  /* records published */
    uint64_t samples;  /* expected endpoint_latency rows */
    uint64_t dead;     /* expected dead_letters rows */
    uint8_t env[600];  /* a valid delivery record for dead letters */
    size_t env_len;    /* bytes used in env */
    int failed;        /* produce errors */
};

static volatile int g_dr_errors;

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err)
        g_dr_errors++;
}

static int emit(struct gen *g, const struct sl_outcome *o)
{
    if (g->left == 0)
        return 1;
    sl_err_t err;
    sl_buf_reset(&g->out);
    if (sl_outcome_encode(o, &g->out, &err) != 0) {
        fprintf(stderr, "sl-test-outcomes: encode failed: %s\n", err.msg);
        g->failed++;
        return 1;
    }
    if (sl_kafka_produce(g->rk, g->topic, o->ep, strlen(o->ep), g->out.data, g->out.len, NULL,
                         60000, &err) != 0) {
        fprintf(stderr, "sl-test-outcomes: %s\n", err.msg);
        g->failed++;
        return 1;
    }
    g->left--;
    g->records++;
    if (o->http != 0 && o->lat_us != 0 &&
        (o->state == SL_OUTCOME_DELIVERED || o->state == SL_OUTCOME_RETRY_SCHEDULED ||
         o->state == SL_OUTCOME_DEAD_LETTER))
        g->samples++;
    if (o->state == SL_OUTCOME_DEAD_LETTER)
        g->dead++;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: sl-test-outcomes --generate-outcomes N --topic T [--endpoints E] "
                    "[--prefix P] [--seed S]\n");
}

int main(int argc, char **argv)
{
    uint64_t n = 0;
    uint64_t endpoints = 100;
    const char *topic = NULL;
    const char *prefix = "gen";
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--generate-outcomes") == 0 && v) {
            n = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(argv[i], "--topic") == 0 && v) {
            topic = v;
            i++;
        } else if (strcmp(argv[i], "--endpoints") == 0 && v) {
            endpoints = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(argv[i], "--prefix") == 0 && v) {
            prefix = v;
            i++;
        } else if (strcmp(argv[i], "--seed") == 0 && v) {
            rng_state = strtoull(v, NULL, 10) | 1;
            i++;
        } else {
            usage();
            return 2;
        }
    }
    if (n == 0 || !topic || endpoints == 0) {
        usage();
        return 2;
    }
    int cargc = 1;
    char *cargv[] = {argv[0], NULL};
    struct sl_config cfg;
    sl_cfg_main_load(&cfg, "sl-test-outcomes", &cargc, cargv);
    sl_err_t err;
    struct gen g;
    memset(&g, 0, sizeof(g));
    g.topic = topic;
    g.left = n;
    sl_buf_init(&g.out, 1 << 20);
    g.rk = sl_kafka_producer_new(&cfg, "outcome-gen", SL_KAFKA_THROUGHPUT, NULL, dr_cb, &err);
    if (!g.rk) {
        fprintf(stderr, "sl-test-outcomes: %s\n", err.msg);
        return 1;
    }
    /* A valid delivery record as the dead letters' env (replay payload). */
    {
        static const char body[] = "{\"order\":42,\"amount\":\"19.99\",\"currency\":\"EUR\"}";
        struct sl_delivery d = {.id = "gen-env",
                                .ep = "gen-ep",
                                .type = "order.paid",
                                .ts_ms = 1,
                                .body = (const uint8_t *)body,
                                .body_len = sizeof(body) - 1};
        struct sl_buf eb;
        sl_buf_init(&eb, sizeof(g.env));
        if (sl_delivery_encode(&d, &eb, &err) != 0) {
            fprintf(stderr, "sl-test-outcomes: %s\n", err.msg);
            return 1;
        }
        memcpy(g.env, eb.data, eb.len);
        g.env_len = eb.len;
        sl_buf_fini(&eb);
    }
    int64_t t0 = sl_mono_ms();
    uint64_t base = (uint64_t)sl_now_ms() - 300000; /* within the last 5 minutes */
    uint64_t events = 0;
    char id[96];
    char ep[96];
    for (uint64_t e = 0; g.left > 0 && !g.failed; e++) {
        snprintf(id, sizeof(id), "%s-%llu", prefix, (unsigned long long)e);
        snprintf(ep, sizeof(ep), "%s-ep%llu", prefix, (unsigned long long)(e % endpoints));
        uint64_t ts = base + e / 4; /* ~4 events per ms */
        struct sl_outcome o = {
            .id = id, .ep = ep, .type = "order.paid", .created_ms = ts - 5, .pod = "gen-pod"};
        unsigned r = (unsigned)(rng() % 100);
        unsigned lat = 2000 + (unsigned)(rng() % 400000);
        events++;
        if (r < 70) {
            o.attempt = 1, o.state = SL_OUTCOME_DELIVERED, o.http = 200, o.ts_ms = ts;
            o.lat_us = lat, o.ttfb_us = lat / 2, o.conn_us = 300;
            emit(&g, &o);
        } else if (r < 88) {
            bool timeout = rng() & 1;
            o.attempt = 1, o.state = SL_OUTCOME_RETRY_SCHEDULED, o.ts_ms = ts;
            o.http = timeout ? 0 : 503, o.err = timeout ? "timeout" : "http_5xx";
            o.lat_us = timeout ? 15000000 : lat, o.next_ms = ts + 30000;
            emit(&g, &o);
            struct sl_outcome d = {.id = id,
                                   .ep = ep,
                                   .type = "order.paid",
                                   .created_ms = ts - 5,
                                   .pod = "gen-pod",
                                   .attempt = 2,
                                   .state = SL_OUTCOME_DELIVERED,
                                   .http = 200,
                                   .ts_ms = ts + 30000,
                                   .lat_us = lat};
            emit(&g, &d);
        } else if (r < 92) {
            for (uint32_t a = 1; a <= 4; a++) {
                struct sl_outcome f = {.id = id,
                                       .ep = ep,
                                       .type = "order.paid",
                                       .created_ms = ts - 5,
                                       .pod = "gen-pod",
                                       .attempt = a,
                                       .state = SL_OUTCOME_RETRY_SCHEDULED,
                                       .http = 500,
                                       .err = "http_5xx",
                                       .ts_ms = ts + a * 1000,
                                       .next_ms = ts + a * 1000 + 500,
                                       .lat_us = lat};
                emit(&g, &f);
            }
            struct sl_outcome dl = {.id = id,
                                    .ep = ep,
                                    .type = "order.paid",
                                    .created_ms = ts - 5,
                                    .pod = "gen-pod",
                                    .attempt = 5,
                                    .state = SL_OUTCOME_DEAD_LETTER,
                                    .http = 500,
                                    .err = "http_5xx",
                                    .msg = "attempts exhausted",
                                    .ts_ms = ts + 5000,
                                    .lat_us = lat,
                                    .env = g.env,
                                    .env_len = g.env_len};
            emit(&g, &dl);
        } else if (r < 96) {
            o.attempt = 1, o.state = SL_OUTCOME_DELIVERED, o.http = 200, o.ts_ms = ts;
            o.lat_us = lat;
            emit(&g, &o);
            struct sl_outcome du = {.id = id,
                                    .ep = ep,
                                    .type = "order.paid",
                                    .created_ms = ts - 5,
                                    .pod = "gen-pod",
                                    .attempt = 0,
                                    .state = SL_OUTCOME_DUPLICATE,
                                    .ts_ms = ts + 100};
            emit(&g, &du);
        } else {
            o.attempt = 0, o.state = SL_OUTCOME_DEFERRED, o.err = "breaker_open", o.ts_ms = ts;
            o.next_ms = ts + 300000;
            emit(&g, &o);
            struct sl_outcome d = {.id = id,
                                   .ep = ep,
                                   .type = "order.paid",
                                   .created_ms = ts - 5,
                                   .pod = "gen-pod",
                                   .attempt = 1,
                                   .state = SL_OUTCOME_DELIVERED,
                                   .http = 200,
                                   .ts_ms = ts + 300000,
                                   .lat_us = lat};
            emit(&g, &d);
        }
    }
    int rc = sl_kafka_flush(g.rk, 120000, &err);
    double el = (double)(sl_mono_ms() - t0) / 1000.0;
    if (rc != 0 || g.failed || g_dr_errors) {
        fprintf(stderr,
                "sl-test-outcomes: publishing failed (%d produce errors, %d delivery "
                "errors)%s%s\n",
                g.failed, g_dr_errors, rc ? ": " : "", rc ? err.msg : "");
        return 1;
    }
    printf("records=%llu events=%llu dead_letters=%llu samples=%llu elapsed_s=%.2f "
           "records_per_s=%.0f\n",
           (unsigned long long)g.records, (unsigned long long)events, (unsigned long long)g.dead,
           (unsigned long long)g.samples, el, el > 0 ? (double)g.records / el : 0.0);
    rd_kafka_destroy(g.rk);
    sl_buf_fini(&g.out);
    sl_cfg_fini(&cfg);
    return 0;
}
