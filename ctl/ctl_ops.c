/*
 * ctl_ops: helpers of sluicectl's operations commands (see ctl_ops.h).
 */
#include "ctl/ctl_ops.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "ctl/ctl.h"

/* ==== Durations and times ==== */

int ctl_ops_duration_parse(const char *s, int64_t *out_s)
{
    if (!s || s[0] < '1' || s[0] > '9')
        return SL_EINVAL;
    int64_t v = 0;
    size_t i = 0;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > CTL_OPS_DUR_MAX_S)
            return SL_EINVAL; /* keeps v * 10 far from overflow */
        v = v * 10 + (s[i] - '0');
    }
    int64_t unit;
    switch (s[i]) {
    case 's':
        unit = 1;
        break;
    case 'm':
        unit = 60;
        break;
    case 'h':
        unit = 3600;
        break;
    case 'd':
        unit = 86400;
        break;
    default:
        return SL_EINVAL;
    }
    if (s[i + 1] != '\0' || v > CTL_OPS_DUR_MAX_S / unit)
        return SL_EINVAL;
    *out_s = v * unit;
    return 0;
}

int ctl_ops_parse_duration(
    const char *cmd, const char *flag, const char *s, int64_t min_s, int64_t max_s, int64_t *out_s)
{
    int64_t v = 0;
    if (ctl_ops_duration_parse(s, &v) != 0 || v < min_s || v > max_s) {
        char lo[24], hi[24];
        ctl_ops_duration_format(min_s, lo, sizeof(lo));
        ctl_ops_duration_format(max_s, hi, sizeof(hi));
        return ctl_usage_error(cmd,
                               "invalid value for %s: expected a duration such as 90m, 24h or "
                               "7d (an integer and one unit s, m, h, d) between %s and %s",
                               flag, lo, hi);
    }
    *out_s = v;
    return 0;
}

void ctl_ops_duration_format(int64_t secs, char *out, size_t outlen)
{
    if (secs > 0 && secs % 86400 == 0)
        (void)snprintf(out, outlen, "%" PRId64 "d", secs / 86400);
    else if (secs > 0 && secs % 3600 == 0)
        (void)snprintf(out, outlen, "%" PRId64 "h", secs / 3600);
    else if (secs > 0 && secs % 60 == 0)
        (void)snprintf(out, outlen, "%" PRId64 "m", secs / 60);
    else
        (void)snprintf(out, outlen, "%" PRId64 "s", secs);
}

/* n decimal digits at s into *out; false unless all n are digits. */
static bool digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

static int days_in_month(int y, int m)
{
    static const int dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : dm[m - 1];
}

/* RFC 3339 date-time; 0 or SL_EINVAL. */
static int rfc3339_parse(const char *s, int64_t *out_ms)
{
    int y, mo, d, h, mi, sec;
    if (strlen(s) < 20 || !digits(s, 4, &y) || s[4] != '-' || !digits(s + 5, 2, &mo) ||
        s[7] != '-' || !digits(s + 8, 2, &d) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        !digits(s + 11, 2, &h) || s[13] != ':' || !digits(s + 14, 2, &mi) || s[16] != ':' ||
        !digits(s + 17, 2, &sec))
        return SL_EINVAL;
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 ||
        sec > 59)
        return SL_EINVAL;
    const char *p = s + 19;
    int ms = 0;
    if (*p == '.') {
        p++;
        int nd = 0;
        while (p[nd] >= '0' && p[nd] <= '9')
            nd++;
        if (nd < 1 || nd > 9)
            return SL_EINVAL;
        for (int i = 0; i < 3; i++)
            ms = ms * 10 + (i < nd ? p[i] - '0' : 0);
        p += nd;
    }
    int off_s = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om;
        if (!digits(p + 1, 2, &oh) || p[3] != ':' || !digits(p + 4, 2, &om) || oh > 23 || om > 59)
            return SL_EINVAL;
        off_s = (oh * 3600 + om * 60) * (*p == '-' ? -1 : 1);
        p += 6;
    } else {
        return SL_EINVAL;
    }
    if (*p != '\0')
        return SL_EINVAL;
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return SL_EINVAL;
    *out_ms = ((int64_t)t - off_s) * 1000 + ms;
    return 0;
}

int ctl_ops_time_parse(const char *s, int64_t now_ms, int64_t *out_ms)
{
    if (!s)
        return SL_EINVAL;
    int64_t v;
    if (rfc3339_parse(s, &v) == 0) {
        *out_ms = v;
        return 0;
    }
    if (ctl_ops_duration_parse(s, &v) == 0) {
        *out_ms = now_ms - v * 1000;
        return 0;
    }
    return SL_EINVAL;
}

void ctl_ops_fmt_ms(int64_t ms, char *out, size_t outlen)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    char base[24];
    if (ms < 0 || !gmtime_r(&s, &tm) || strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        (void)snprintf(out, outlen, "%" PRId64, ms);
    else
        (void)snprintf(out, outlen, "%s.%03dZ", base, (int)(ms % 1000));
}

/* ==== PostgreSQL ==== */

static void notice_cb(void *arg, const char *msg)
{
    (void)arg;
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        n--;
    sl_debug(SL_DBG_DB, "db", "pg_notice", "%.*s", (int)n, msg);
}

PGconn *ctl_ops_pg_open(const struct sl_config *cfg, sl_err_t *err)
{
    PGconn *pg = sl_pg_open(cfg->pg_dsn, "sluicectl"); /* Sluice's defaults, keepalives too */
    if (!pg || PQstatus(pg) != CONNECTION_OK) {
        const char *m = pg ? PQerrorMessage(pg) : "out of memory";
        size_t n = strlen(m);
        while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == ' '))
            n--;
        sl_err_set(err, SL_EPG, "could not connect to postgresql: %.*s", (int)n, m);
        PQfinish(pg);
        return NULL;
    }
    PQsetNoticeProcessor(pg, notice_cb, NULL);
    PGresult *res = PQexec(pg, "set timezone = 'UTC'; set datestyle = 'ISO'; "
                               "set statement_timeout = '60s'; set lock_timeout = '30s'");
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        char why[512];
        sl_err_set(err, SL_EPG, "could not prepare the postgresql session: %s",
                   sl_pg_reason(res, pg, why, sizeof(why)));
        PQclear(res);
        PQfinish(pg);
        return NULL;
    }
    PQclear(res);
    return pg;
}

/* ==== Kafka lag ==== */

/* One partition's lag from its committed offset e and its watermarks; adds to out's totals. */
static int lag_part(rd_kafka_t *rk,
                    const char *topic,
                    const rd_kafka_topic_partition_t *e,
                    struct ctl_ops_lag *out,
                    struct ctl_ops_lag_part *p,
                    int timeout_ms,
                    sl_err_t *err)
{
    p->partition = e->partition;
    if (e->err)
        return sl_err_set(err, SL_EKAFKA, "could not read the committed offset of %s [%d]: %s",
                          topic, (int)e->partition, rd_kafka_err2str(e->err));
    p->committed = e->offset >= 0 ? e->offset : -1;
    int64_t lo = 0, hi = 0;
    rd_kafka_resp_err_t ke =
        rd_kafka_query_watermark_offsets(rk, topic, e->partition, &lo, &hi, timeout_ms);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR)
        return sl_err_set(err, SL_EKAFKA, "could not read the watermarks of %s [%d]: %s", topic,
                          (int)e->partition, rd_kafka_err2str(ke));
    p->low = lo;
    p->high = hi;
    if (p->committed >= 0) {
        p->lag = hi > p->committed ? hi - p->committed : 0;
    } else {
        p->lag = hi - lo;
        if (p->lag > 0)
            out->uncommitted++;
    }
    out->total += p->lag;
    return 0;
}

int ctl_ops_kafka_lag(const struct sl_config *cfg,
                      const char *group,
                      const char *topic,
                      int timeout_ms,
                      struct ctl_ops_lag *out,
                      sl_err_t *err)
{
    char errstr[512];
    int rc = 0;
    rd_kafka_t *rk = NULL;
    rd_kafka_topic_t *rkt = NULL;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_partition_list_t *list = NULL;
    memset(out, 0, sizeof(*out));
    rd_kafka_conf_t *conf = sl_kafka_conf_new(cfg, "sluicectl", err);
    if (!conf)
        return SL_EKAFKA;
    if (sl_kafka_conf_set(conf, "group.id", group, err) != 0 ||
        sl_kafka_conf_set(conf, "enable.auto.commit", "false", err) != 0) {
        rd_kafka_conf_destroy(conf);
        return SL_EKAFKA;
    }
    rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return sl_err_set(err, SL_EKAFKA, "could not create kafka consumer: %s", errstr);
    }
    rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t ke =
        rkt ? rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms) : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR || !md || md->topic_cnt != 1) {
        rc = sl_err_set(err, SL_EKAFKA, "could not read metadata of topic %s: %s", topic,
                        rd_kafka_err2str(ke));
        goto out;
    }
    if (md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
        md->topics[0].partition_cnt == 0) {
        rc = sl_err_set(err, SL_ENOTFOUND, "topic %s does not exist", topic);
        goto out;
    }
    if (md->topics[0].err) {
        rc = sl_err_set(err, SL_EKAFKA, "could not read metadata of topic %s: %s", topic,
                        rd_kafka_err2str(md->topics[0].err));
        goto out;
    }
    int n = md->topics[0].partition_cnt;
    list = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(list, topic, md->topics[0].partitions[i].id);
    ke = rd_kafka_committed(rk, list, timeout_ms);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
        rc = sl_err_set(err, SL_EKAFKA, "could not read committed offsets of group %s: %s", group,
                        rd_kafka_err2str(ke));
        goto out;
    }
    out->part = sl_xcalloc((size_t)n, sizeof(*out->part));
    out->n = n;
    for (int i = 0; i < n && rc == 0; i++)
        rc = lag_part(rk, topic, &list->elems[i], out, &out->part[i], timeout_ms, err);
out:
    if (rc != 0)
        ctl_ops_lag_fini(out);
    if (list)
        rd_kafka_topic_partition_list_destroy(list);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (rkt)
        rd_kafka_topic_destroy(rkt);
    /* never subscribed: close only leaves the (unjoined) group */
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}

void ctl_ops_lag_fini(struct ctl_ops_lag *l)
{
    free(l->part);
    memset(l, 0, sizeof(*l));
}

/* ==== Text tables ==== */

void ctl_table_init(struct ctl_table *t, size_t ncols, const char *const *head, const char *align)
{
    memset(t, 0, sizeof(*t));
    t->ncols = ncols;
    t->head = head;
    t->align = align;
}

void ctl_table_add(struct ctl_table *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *cell = NULL;
    int n = vasprintf(&cell, fmt, ap);
    va_end(ap);
    if (n < 0) {
        (void)fputs("sluicectl: out of memory\n", stderr);
        abort();
    }
    if (t->ncells == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->cells = sl_xrealloc(t->cells, t->cap * sizeof(*t->cells));
    }
    t->cells[t->ncells++] = cell;
}

void ctl_table_print(const struct ctl_table *t, FILE *f, int indent)
{
    if (t->ncols == 0)
        return;
    size_t *w = sl_xcalloc(t->ncols, sizeof(*w));
    for (size_t c = 0; c < t->ncols; c++)
        w[c] = strlen(t->head[c]);
    for (size_t i = 0; i < t->ncells; i++) {
        size_t l = strlen(t->cells[i]);
        if (l > w[i % t->ncols])
            w[i % t->ncols] = l;
    }
    for (size_t i = 0; i < t->ncells + t->ncols; i++) {
        size_t c = i % t->ncols;
        const char *s = i < t->ncols ? t->head[c] : t->cells[i - t->ncols];
        if (c == 0)
            (void)fprintf(f, "%*s", indent, "");
        bool last = c + 1 == t->ncols || i + 1 == t->ncells + t->ncols;
        if (t->align[c] == 'r')
            (void)fprintf(f, "%*s", (int)w[c], s);
        else if (last)
            (void)fputs(s, f);
        else
            (void)fprintf(f, "%-*s", (int)w[c], s);
        (void)fputs(last ? "\n" : "  ", f);
    }
    free(w);
}

void ctl_table_fini(struct ctl_table *t)
{
    for (size_t i = 0; i < t->ncells; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof(*t));
}

void ctl_ops_print_json(json_t *j)
{
    /* 15 significant digits: 0.4, not jansson's default 0.40000000000000002 */
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (s) {
        puts(s);
        free(s);
    }
    json_decref(j);
}
