/*
 * sl_kstats: per-partition consumer lag from librdkafka statistics (see sl_kstats.h).
 *
 * The statistics document (librdkafka STATISTICS.md): topics.<name>.partitions.<id> with
 * "desired" (assigned to this client), "consumer_lag" (-1 until known); partition -1 is
 * librdkafka's internal unassigned partition.
 */
#include "common/sl_kstats.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/sl_mem.h"
#include "common/sl_metrics.h"

struct row {
    char *client, *topic;
    int32_t partition;
    int64_t lag; /* -1: assigned, lag not known (no committed offset yet, broker unreachable) */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct row *g_rows;
static size_t g_nrows, g_cap;
static bool g_collecting;
static bool g_known; /* a statistics document was parsed */

static void forget_locked(const char *client)
{
    size_t k = 0;
    for (size_t i = 0; i < g_nrows; i++) {
        if (strcmp(g_rows[i].client, client) == 0) {
            free(g_rows[i].client);
            free(g_rows[i].topic);
        } else {
            g_rows[k++] = g_rows[i];
        }
    }
    g_nrows = k;
}

void sl_kstats_forget(const char *client)
{
    pthread_mutex_lock(&g_mu);
    forget_locked(client);
    pthread_mutex_unlock(&g_mu);
}

/* A partition's lag from its statistics: consumer_lag, or 0 when that is not known but the
 * partition holds nothing (its low and high offsets equal: never written, or emptied by
 * retention: no offset to commit, so librdkafka never knows a lag), else -1 (not known). */
static int64_t row_lag(json_t *p, json_t *lag)
{
    if (json_is_integer(lag) && json_integer_value(lag) >= 0)
        return (int64_t)json_integer_value(lag);
    json_t *lo = json_object_get(p, "lo_offset"), *hi = json_object_get(p, "hi_offset");
    if (json_is_integer(lo) && json_is_integer(hi) && json_integer_value(hi) >= 0 &&
        json_integer_value(lo) == json_integer_value(hi))
        return 0;
    return -1;
}

int sl_kstats_update(const char *client, const char *json, size_t len)
{
    json_t *root = json_loadb(json, len, 0, NULL);
    json_t *topics = root ? json_object_get(root, "topics") : NULL;
    if (!json_is_object(topics)) {
        json_decref(root);
        return -1;
    }
    pthread_mutex_lock(&g_mu);
    forget_locked(client);
    g_known = true;
    const char *tname;
    json_t *t;
    json_object_foreach(topics, tname, t)
    {
        json_t *parts = json_object_get(t, "partitions");
        const char *pname;
        json_t *p;
        json_object_foreach(parts, pname, p)
        {
            json_t *lag = json_object_get(p, "consumer_lag");
            json_t *desired = json_object_get(p, "desired");
            char *end = NULL;
            long id = strtol(pname, &end, 10);
            if (!end || *end || id < 0 || id > INT32_MAX || !json_is_true(desired))
                continue;
            if (g_nrows == g_cap) {
                g_cap = g_cap ? g_cap * 2 : 16;
                g_rows = sl_xrealloc(g_rows, g_cap * sizeof(*g_rows));
            }
            g_rows[g_nrows++] = (struct row){.client = sl_xstrdup(client),
                                             .topic = sl_xstrdup(tname),
                                             .partition = (int32_t)id,
                                             .lag = row_lag(p, lag)};
        }
    }
    pthread_mutex_unlock(&g_mu);
    json_decref(root);
    return 0;
}

int64_t sl_kstats_total_lag(size_t *rows, bool *known)
{
    pthread_mutex_lock(&g_mu);
    if (known)
        *known = g_known;
    int64_t sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < g_nrows; i++) {
        if (g_rows[i].lag >= 0) {
            sum += g_rows[i].lag;
            n++;
        }
    }
    if (rows)
        *rows = n;
    pthread_mutex_unlock(&g_mu);
    return sum;
}

size_t sl_kstats_unknown(void)
{
    pthread_mutex_lock(&g_mu);
    size_t n = 0;
    for (size_t i = 0; i < g_nrows; i++)
        n += g_rows[i].lag < 0;
    pthread_mutex_unlock(&g_mu);
    return n;
}

static int cmp_row(const void *a, const void *b)
{
    const struct row *x = a, *y = b;
    int c = strcmp(x->topic, y->topic);
    if (c)
        return c;
    return (x->partition > y->partition) - (x->partition < y->partition);
}

static void collect(struct sl_buf *out, void *arg)
{
    (void)arg;
    sl_metrics_write_head(out, "sluice_kafka_consumer_lag_records", "gauge",
                          "Consumer-group lag of each partition assigned to this process "
                          "(librdkafka statistics).");
    pthread_mutex_lock(&g_mu);
    if (g_nrows > 1) /* qsort must not get NULL, which an empty table is */
        qsort(g_rows, g_nrows, sizeof(*g_rows), cmp_row);
    struct sl_buf lb;
    sl_buf_init(&lb, 4096);
    for (size_t i = 0; i < g_nrows; i++) {
        /* a partition is assigned to one client of the group; two rows of the same
         * partition (a rebalance between two statistics) make one series, the larger lag */
        int64_t lag = g_rows[i].lag;
        while (i + 1 < g_nrows && cmp_row(&g_rows[i], &g_rows[i + 1]) == 0)
            lag = g_rows[++i].lag > lag ? g_rows[i].lag : lag;
        if (lag < 0)
            continue; /* not known: no sample rather than a made-up one */
        char part[16];
        (void)snprintf(part, sizeof(part), "%d", (int)g_rows[i].partition);
        sl_buf_reset(&lb);
        sl_metrics_label(&lb, "topic", g_rows[i].topic);
        sl_metrics_label(&lb, "partition", part);
        sl_metrics_write_sample(out, "sluice_kafka_consumer_lag_records", (const char *)lb.data,
                                (double)lag);
    }
    sl_buf_fini(&lb);
    pthread_mutex_unlock(&g_mu);
}

static int stats_cb(rd_kafka_t *rk, char *json, size_t len, void *opaque)
{
    (void)opaque;
    sl_kstats_update(rd_kafka_name(rk), json, len);
    return 0; /* librdkafka frees json */
}

int sl_kstats_enable(rd_kafka_conf_t *conf, int interval_ms, sl_err_t *err)
{
    char v[24];
    (void)snprintf(v, sizeof(v), "%d", interval_ms);
    char errstr[256];
    if (rd_kafka_conf_set(conf, "statistics.interval.ms", v, errstr, sizeof(errstr)) !=
        RD_KAFKA_CONF_OK)
        return sl_err_set(err, SL_ECONFIG, "statistics.interval.ms: %s", errstr);
    rd_kafka_conf_set_stats_cb(conf, stats_cb);
    pthread_mutex_lock(&g_mu);
    bool first = !g_collecting;
    g_collecting = true;
    pthread_mutex_unlock(&g_mu);
    if (first)
        sl_metrics_collector(collect, NULL);
    return 0;
}
