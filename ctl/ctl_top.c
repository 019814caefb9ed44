/*
 * ctl_top: live view over topic_outcomes (see ctl_top.h).
 *
 * Per endpoint it keeps counters for the current window and a ring of the last latencies;
 * percentiles are computed by sorting a copy of the ring (at most RING samples per endpoint,
 * a few hundred endpoints on screen: cheap at one frame per second).
 */
#include "ctl/ctl_top.h"

#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_breaker.h"
#include "common/sl_kafka.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_redis.h"
#include "common/sl_time.h"

#define RING     512 /* latency samples kept per endpoint */
#define MAX_ROWS 25  /* endpoints shown */

struct ep_stat {
    char id[SL_ENDPOINT_ID_MAX + 1];                         /* endpoint id */
    uint64_t delivered, retried, dead, dup, deferred, other; /* this window */
    uint64_t total_delivered, total_dead;                    /* since start */
    uint32_t lat_us[RING];               /* latency samples (µs) of answered attempts */
    size_t nlat, lat_pos;                /* samples held / next slot */
    uint32_t last_http;                  /* last HTTP status seen */
    char last_err[SL_ERR_CLASS_MAX + 1]; /* last error class */
};

static volatile sig_atomic_t g_stop;

static void on_sig(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void percentiles(const struct ep_stat *s, double *p50, double *p95, double *p99)
{
    *p50 = *p95 = *p99 = 0;
    if (s->nlat == 0)
        return;
    uint32_t tmp[RING];
    memcpy(tmp, s->lat_us, s->nlat * sizeof(uint32_t));
    qsort(tmp, s->nlat, sizeof(uint32_t), cmp_u32);
    size_t i50 = (s->nlat - 1) * 50 / 100, i95 = (s->nlat - 1) * 95 / 100,
           i99 = (s->nlat - 1) * 99 / 100; /* nearest-rank indexes */
    *p50 = tmp[i50] / 1000.0;
    *p95 = tmp[i95] / 1000.0;
    *p99 = tmp[i99] / 1000.0;
}

static void take(sl_map_t *m, const struct sl_outcome *o)
{
    if (!o->ep)
        return;
    struct ep_stat *s = sl_map_get(m, o->ep);
    if (!s) {
        s = sl_xcalloc(1, sizeof(*s));
        (void)snprintf(s->id, sizeof(s->id), "%s", o->ep);
        sl_map_put(m, o->ep, s, NULL);
    }
    switch (o->state) {
    case SL_OUTCOME_DELIVERED:
        s->delivered++;
        s->total_delivered++;
        break;
    case SL_OUTCOME_RETRY_SCHEDULED:
        s->retried++;
        break;
    case SL_OUTCOME_DEAD_LETTER:
        s->dead++;
        s->total_dead++;
        break;
    case SL_OUTCOME_DUPLICATE:
        s->dup++;
        break;
    case SL_OUTCOME_DEFERRED:
        s->deferred++;
        break;
    default:
        s->other++;
        break;
    }
    /* the last attempt's answer: its status and error together (a timeout has no status:
     * shown alone, not beside an earlier attempt's) */
    if (o->http || o->err) {
        s->last_http = o->http;
        (void)snprintf(s->last_err, sizeof(s->last_err), "%s", o->err ? o->err : "");
    }
    if (o->http && o->lat_us) {
        s->lat_us[s->lat_pos] = o->lat_us > UINT32_MAX ? UINT32_MAX : (uint32_t)o->lat_us;
        s->lat_pos = (s->lat_pos + 1) % RING;
        if (s->nlat < RING)
            s->nlat++;
    }
}

static int by_activity(const void *a, const void *b)
{
    const struct ep_stat *x = *(const struct ep_stat *const *)a;
    const struct ep_stat *y = *(const struct ep_stat *const *)b;
    uint64_t ax = x->delivered + x->retried + x->dead + x->deferred;
    uint64_t ay = y->delivered + y->retried + y->dead + y->deferred;
    if (ax != ay)
        return ax > ay ? -1 : 1;
    return strcmp(x->id, y->id);
}

static const char *breaker_state(sl_redis_t *r, const char *ep)
{
    struct sl_breaker_view v;
    sl_err_t err;
    if (!r || sl_breaker_read(r, &ep, 1, &v, &err) != 0)
        return "?";
    return sl_breaker_state_name(v.state);
}

static void frame(sl_map_t *m, sl_redis_t *r, double secs, bool tty, uint64_t frame_no)
{
    size_t n = sl_map_count(m);
    struct ep_stat **rows = sl_xcalloc(n ? n : 1, sizeof(struct ep_stat *));
    size_t pos = 0, i = 0;
    const char *key;
    void *val;
    uint64_t d = 0, rt = 0, dl = 0, dup = 0, df = 0;
    while (sl_map_next(m, &pos, &key, &val)) {
        rows[i] = val;
        d += rows[i]->delivered;
        rt += rows[i]->retried;
        dl += rows[i]->dead;
        dup += rows[i]->dup;
        df += rows[i]->deferred;
        i++;
    }
    qsort(rows, n, sizeof(struct ep_stat *), by_activity);
    if (tty)
        printf("\033[H\033[2J");
    printf("sluice top  frame %llu  window %.1fs  delivered/s %.0f  retries %llu  dead %llu  "
           "dup %llu  deferred %llu\n",
           (unsigned long long)frame_no, secs, (double)d / secs, (unsigned long long)rt,
           (unsigned long long)dl, (unsigned long long)dup, (unsigned long long)df);
    printf("%-24s %9s %7s %6s %8s %8s %8s %8s %-9s %s\n", "endpoint", "deliv/s", "retry", "dead",
           "p50 ms", "p95 ms", "p99 ms", "total", "breaker", "last");
    for (i = 0; i < n && i < MAX_ROWS; i++) {
        struct ep_stat *s = rows[i];
        double p50, p95, p99;
        percentiles(s, &p50, &p95, &p99);
        char last[48];
        if (s->last_err[0] && s->last_http)
            (void)snprintf(last, sizeof(last), "%s %u", s->last_err, s->last_http);
        else if (s->last_err[0])
            (void)snprintf(last, sizeof(last), "%s", s->last_err);
        else if (s->last_http)
            (void)snprintf(last, sizeof(last), "%u", s->last_http);
        else
            (void)snprintf(last, sizeof(last), "-");
        char q[3][16]; /* no latency sample yet: "-", not 0.0 */
        const double pv[3] = {p50, p95, p99};
        for (int k = 0; k < 3; k++) {
            if (s->nlat)
                (void)snprintf(q[k], sizeof(q[k]), "%.1f", pv[k]);
            else
                (void)snprintf(q[k], sizeof(q[k]), "-");
        }
        printf("%-24.24s %9.1f %7llu %6llu %8s %8s %8s %8llu %-9s %s\n", s->id,
               (double)s->delivered / secs, (unsigned long long)s->retried,
               (unsigned long long)s->dead, q[0], q[1], q[2],
               (unsigned long long)s->total_delivered, breaker_state(r, s->id), last);
    }
    if (n > MAX_ROWS)
        printf("(%zu more endpoints)\n", n - MAX_ROWS);
    (void)fflush(stdout);
    for (i = 0; i < n; i++)
        rows[i]->delivered = rows[i]->retried = rows[i]->dead = rows[i]->dup = rows[i]->deferred =
            rows[i]->other = 0;
    free(rows);
}

void ctl_top_help(FILE *f)
{
    (void)fprintf(f,
                  "usage: sluicectl top [--interval-ms N] [--duration-s N] [--from-beginning]\n"
                  "\n"
                  "Live view of deliveries from topic_outcomes: delivered per second, retries,\n"
                  "dead letters, P50/P95/P99 latency and breaker state per endpoint. Redraws in\n"
                  "place on a terminal, prints one frame per interval otherwise. Stops after\n"
                  "--duration-s (default: at Ctrl-C).\n");
}

struct top_opts {
    long interval;               /* ms between frames */
    long duration;               /* s to run (0 = until a signal) */
    bool beginning;              /* read the outcomes topic from its start */
    struct sl_decode_limits lim; /* max_body_bytes: a dead letter carries its record */
};

/* Returns -1 to go on, else the exit code. */
static int top_parse(int argc, char **argv, struct top_opts *o)
{
    static const struct option longopts[] = {{"interval-ms", required_argument, NULL, 'i'},
                                             {"duration-s", required_argument, NULL, 'd'},
                                             {"from-beginning", no_argument, NULL, 'b'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    *o = (struct top_opts){.interval = 1000};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "i:d:bh", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (ch) {
        case 'i':
            o->interval = strtol(optarg, &end, 10);
            if (!*optarg || *end || o->interval < 100 || o->interval > 600000) {
                (void)fprintf(stderr, "sluicectl top: --interval-ms expects 100..600000\n");
                return CTL_EXIT_USAGE;
            }
            break;
        case 'd':
            o->duration = strtol(optarg, &end, 10);
            if (!*optarg || *end || o->duration < 1 || o->duration > 86400L * 365) {
                (void)fprintf(stderr, "sluicectl top: --duration-s expects a positive integer\n");
                return CTL_EXIT_USAGE;
            }
            break;
        case 'b':
            o->beginning = true;
            break;
        case 'h':
            ctl_top_help(stdout);
            return CTL_EXIT_OK;
        default:
            ctl_top_help(stderr);
            return CTL_EXIT_USAGE;
        }
    }
    return -1;
}

/* A consumer outside any group's commits, assigned to every partition of the outcomes topic
 * at its end (or start). NULL with the reason on stderr. */
static rd_kafka_t *top_consumer(const struct sl_config *cfg, bool beginning)
{
    sl_err_t err;
    rd_kafka_conf_t *conf = sl_kafka_conf_new(cfg, "sluicectl-top", &err);
    if (!conf) {
        (void)fprintf(stderr, "sluicectl top: %s\n", err.msg);
        return NULL;
    }
    sl_kafka_conf_set(conf, "group.id", "sluicectl-top", NULL);
    sl_kafka_conf_set(conf, "enable.auto.commit", "false", NULL);
    char errstr[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        (void)fprintf(stderr, "sluicectl top: could not create kafka consumer: %s\n", errstr);
        return NULL;
    }
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, cfg->topic_outcomes, NULL);
    rd_kafka_resp_err_t ke = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
    rd_kafka_topic_destroy(rkt);
    if (ke || md->topic_cnt != 1 || md->topics[0].err) {
        (void)fprintf(stderr, "sluicectl top: could not read metadata of %s\n",
                      cfg->topic_outcomes);
        if (md)
            rd_kafka_metadata_destroy(md);
        rd_kafka_destroy(rk);
        return NULL;
    }
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt);
    for (int i = 0; i < md->topics[0].partition_cnt; i++)
        rd_kafka_topic_partition_list_add(l, cfg->topic_outcomes, md->topics[0].partitions[i].id)
            ->offset = beginning ? RD_KAFKA_OFFSET_BEGINNING : RD_KAFKA_OFFSET_END;
    rd_kafka_metadata_destroy(md);
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    return rk;
}

/* Read outcomes into m and draw a frame every interval until a signal or the duration. */
static void top_loop(rd_kafka_t *rk, sl_redis_t *r, sl_map_t *m, const struct top_opts *o)
{
    bool tty = isatty(1);
    int64_t start = sl_mono_ms(), last = start;
    uint64_t frames = 0;
    while (!g_stop) {
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(rk, 50);
        if (msg) {
            struct sl_outcome oc;
            if (!msg->err && msg->payload) {
                if (sl_outcome_decode(msg->payload, msg->len, &o->lim, &oc, NULL) == 0)
                    take(m, &oc);
                sl_outcome_fini(&oc);
            }
            rd_kafka_message_destroy(msg);
        }
        int64_t now = sl_mono_ms();
        if (now - last >= o->interval) {
            frame(m, r, (double)(now - last) / 1000.0, tty, ++frames);
            last = now;
        }
        if (o->duration && now - start >= o->duration * 1000)
            break;
    }
}

int ctl_top_main(struct ctl *c, int argc, char **argv)
{
    struct top_opts o;
    int rc = top_parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    o.lim = (struct sl_decode_limits){.max_body = (size_t)cfg->max_body_bytes};
    rd_kafka_t *rk = top_consumer(cfg, o.beginning);
    if (!rk)
        return CTL_EXIT_FAIL;
    sl_err_t err;
    sl_redis_t *r = sl_redis_connect(cfg->redis_url, (int)cfg->redis_timeout_ms, &err);
    if (!r)
        (void)fprintf(stderr, "sluicectl top: breaker states unavailable: %s\n", err.msg);
    (void)signal(SIGINT, on_sig);
    (void)signal(SIGTERM, on_sig);
    sl_map_t *m = sl_map_new(64);
    top_loop(rk, r, m, &o);
    size_t pos = 0;
    const char *key;
    void *val;
    while (sl_map_next(m, &pos, &key, &val))
        free(val);
    sl_map_destroy(m, NULL);
    sl_redis_close(r);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return CTL_EXIT_OK;
}

void ctl_config_doc_help(FILE *f)
{
    (void)fprintf(f,
                  "usage: sluicectl config-doc\n\n"
                  "Prints the configuration reference (Markdown) generated from the option table;\n"
                  "docs/CONFIG.md is this output.\n");
}

int ctl_config_doc_main(struct ctl *c, int argc, char **argv)
{
    (void)c;
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        ctl_config_doc_help(stdout);
        return CTL_EXIT_OK;
    }
    if (argc > 1)
        return ctl_extra_args("config-doc", argc, argv, 1);
    sl_cfg_print_markdown(stdout);
    return CTL_EXIT_OK;
}
