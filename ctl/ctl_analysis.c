/*
 * ctl_analysis: health, slow, dead-letters, alerts, latency (see ctl_analysis.h).
 *
 * The analysis itself lives in SQL (sql/0003_analysis.sql), so psql users, dashboards and this
 * tool agree; here are flags, the Kafka and Redis figures that PostgreSQL cannot know, and
 * presentation. Windows travel to SQL as seconds (make_interval), thresholds as numbers, and
 * timestamps come back as unix ms so every output is UTC.
 */
#include "ctl/ctl_analysis.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/sl_endpoints.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_record.h"
#include "common/sl_redis.h"
#include "common/sl_rstate.h"
#include "common/sl_time.h"
#include "ctl/ctl_ops.h"
#include "ctl/ctl_thresholds.h"

#define KAFKA_TIMEOUT_MS 10000 /* per broker request of the lag query */
#define BAR_WIDTH        40    /* characters of the longest histogram bar */
#define COUNT_MAX        SL_THR_COUNT_MAX

/* ==== Shared ==== */

/* Parse the common flag set of a command: options[] ends with {0}; the handler gets each
 * (val, optarg) and returns 0 or an exit code. Returns 0, CTL_EXIT_USAGE, or -1 for --help. */
typedef int (*opt_fn)(void *ctx, int val, const char *arg);

static int parse_flags(const char *cmd,
                       int argc,
                       char **argv,
                       const struct option *longopts,
                       opt_fn fn,
                       void *ctx,
                       int *first_pos)
{
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (ch == 'h')
            return -1;
        if (ch == '?' || ch == ':')
            return ctl_getopt_error(cmd, ch, longopts, argv);
        int rc = fn(ctx, ch, optarg);
        if (rc != 0)
            return rc;
    }
    *first_pos = optind;
    return 0;
}

static void fmt_ms_val(double ms, char *out, size_t n)
{
    if (ms >= 1000)
        (void)snprintf(out, n, "%.0f", ms);
    else
        (void)snprintf(out, n, "%.1f", ms);
}

static json_t *json_time(int64_t ms, bool present)
{
    if (!present)
        return json_null();
    char t[40];
    ctl_ops_fmt_ms(ms, t, sizeof(t));
    return json_string(t);
}

static void fmt_age(double secs, char *out, size_t n)
{
    int64_t s = (int64_t)secs;
    if (s >= 86400)
        (void)snprintf(out, n, "%" PRId64 "d%" PRId64 "h", s / 86400, s % 86400 / 3600);
    else if (s >= 3600)
        (void)snprintf(out, n, "%" PRId64 "h%" PRId64 "m", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        (void)snprintf(out, n, "%" PRId64 "m%" PRId64 "s", s / 60, s % 60);
    else
        (void)snprintf(out, n, "%" PRId64 "s", s);
}

/* Open PostgreSQL, run one query, close; the result (caller PQclear) or NULL with err. */
static PGresult *query(const struct sl_config *cfg,
                       const char *what,
                       const char *sql,
                       int nparams,
                       const char *const *params,
                       sl_err_t *err)
{
    PGconn *pg = ctl_ops_pg_open(cfg, err);
    if (!pg)
        return NULL;
    PGresult *res = sl_pg_exec(pg, what, sql, nparams, params, err);
    PQfinish(pg);
    return res;
}

/* What a command's one positional argument must be. */
struct id_kind {
    const char *name;                       /* "endpoint id" */
    bool (*valid)(const char *s, size_t n); /* sl_valid_endpoint_id, ... */
    const char *form;                       /* the form, for the usage error */
};
static const struct id_kind ID_ENDPOINT = {"endpoint id", sl_valid_endpoint_id,
                                           "1..64 characters [A-Za-z0-9_-]"};
static const struct id_kind ID_EVENT = {"event id", sl_valid_event_id,
                                        "1..128 visible ASCII characters without '.'"};

/* The command's single positional argument (argv[first]), checked: 0 with *out set, or the
 * usage exit (missing, invalid, or more arguments after it). */
static int one_id(
    const char *cmd, int argc, char **argv, int first, const struct id_kind *kind, const char **out)
{
    if (first >= argc)
        return ctl_usage_error(cmd, "missing the %s", kind->name);
    const char *v = argv[first];
    if (!kind->valid(v, strlen(v)))
        return ctl_usage_error(cmd, "invalid %s: expected %s", kind->name, kind->form);
    *out = v;
    return ctl_extra_args(cmd, argc, argv, first + 1);
}

/* ==== health ==== */

struct health_opts {
    int64_t window_s; /* s */
    bool json;        /* --json */
};

enum { O_WINDOW = 256, O_JSON, O_THRESHOLD, O_MIN_SAMPLES, O_ENDPOINT };

static int health_opt(void *ctx, int val, const char *arg)
{
    struct health_opts *o = ctx;
    if (val == O_WINDOW)
        return ctl_ops_parse_duration("health", "--window", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &o->window_s);
    o->json = true;
    return 0;
}

void ctl_health_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl health [--window DURATION] [--json]\n"
           "\n"
           "What is pending right now and how deliveries went over the window, each figure\n"
           "labelled with where it comes from:\n"
           "  kafka       records of topic_deliveries the consumer group has not committed yet\n"
           "              (committed offsets vs high watermarks): queued in Kafka\n"
           "  redis       jobs in the retry schedule (awaiting retry or deferred), of which\n"
           "              leased = in flight, and due but not yet claimed\n"
           "  postgresql  the history (sluice_health_summary): awaiting retry, deferred, oldest\n"
           "              undelivered, dead letters, delivered and failed attempts in the\n"
           "              window, average and P95 latency\n"
           "pending total = queued in Kafka + the retry schedule.\n"
           "  endpoint records  the latest record of every endpoint on topic_endpoints checked\n"
           "              as consumers check it (signed with a configured master key, MAC\n"
           "              intact, within the size limit): the ones consumers refuse are listed\n"
           "              with the reason (needs master_key; skipped without it); and those\n"
           "              whose update time is not the registry's (an older record replayed,\n"
           "              a change not published, a restored database) or that the registry\n"
           "              does not have (a tombstone not published): `sluicectl endpoints\n"
           "              sync` fixes them\n"
           "\n"
           "  --window DURATION   e.g. 90m, 1h (default), 7d\n"
           "  --json              machine-readable output\n"
           "\n"
           "Exit: 0 all sources answered and every endpoint record is taken and the\n"
           "registry's; 1 one or more failed, or a record is refused or differs (the rest is\n"
           "still printed, and the failure named);\n"
           "2 usage; 78 configuration.\n");
}

static const char SQL_HEALTH[] =
    "select window_s, awaiting_retry, deferred, dead_letters_unreplayed, dead_letters_window,"
    "       delivered_window, failed_attempts_window,"
    "       (extract(epoch from oldest_undelivered_at) * 1000)::bigint as oldest_ms,"
    "       oldest_undelivered_age_s, latency_samples, avg_latency_ms, p95_latency_ms,"
    "       (extract(epoch from as_of) * 1000)::bigint as as_of_ms"
    "  from sluice_health_summary(make_interval(secs => $1::float8))";

static void health_text(const struct sl_config *cfg,
                        const struct health_opts *o,
                        const struct ctl_ops_lag *lag,
                        const sl_err_t *kerr,
                        const struct sl_rstate_counts *sc,
                        const sl_err_t *rerr,
                        const PGresult *res,
                        const sl_err_t *perr,
                        int64_t now_ms)
{
    char win[24], t[40], src[256];
    ctl_ops_duration_format(o->window_s, win, sizeof(win));
    ctl_ops_fmt_ms(now_ms, t, sizeof(t));
    printf("sluice health  window %s  as of %s\n\nPending now\n", win, t);
    static const char *const head[] = {"figure", "count", "source"};
    struct ctl_table tb;
    ctl_table_init(&tb, 3, head, "lrl");
    if (!kerr) {
        ctl_table_add(&tb, "queued in Kafka (not yet consumed)");
        ctl_table_add(&tb, "%" PRId64, lag->total);
        (void)snprintf(src, sizeof(src), "kafka: lag of group %s on %s, %d partitions%s",
                       cfg->consumer_group, cfg->topic_deliveries, lag->n,
                       lag->uncommitted ? " (some never committed: counted from the oldest)" : "");
        ctl_table_add(&tb, "%s", src);
    } else {
        ctl_table_add(&tb, "queued in Kafka (not yet consumed)");
        ctl_table_add(&tb, "unavailable");
        ctl_table_add(&tb, "kafka: %s", kerr->msg);
    }
    if (!rerr) {
        ctl_table_add(&tb, "in the retry schedule (awaiting retry/deferred)");
        ctl_table_add(&tb, "%" PRId64, sc->scheduled);
        ctl_table_add(&tb, "redis: %lld retry zsets", (long long)cfg->retry_shards);
        ctl_table_add(&tb, "  of which in flight (leased)");
        ctl_table_add(&tb, "%" PRId64, sc->leased);
        ctl_table_add(&tb, "redis: lease hashes");
        ctl_table_add(&tb, "  of which due, not yet claimed");
        ctl_table_add(&tb, "%" PRId64, sc->due);
        ctl_table_add(&tb, "redis: score <= now");
    } else {
        ctl_table_add(&tb, "in the retry schedule (awaiting retry/deferred)");
        ctl_table_add(&tb, "unavailable");
        ctl_table_add(&tb, "redis: %s", rerr->msg);
    }
    ctl_table_add(&tb, "pending total");
    if (!kerr && !rerr)
        ctl_table_add(&tb, "%" PRId64, lag->total + sc->scheduled);
    else
        ctl_table_add(&tb, "unknown");
    ctl_table_add(&tb, "kafka + redis");
    ctl_table_print(&tb, stdout, 2);
    ctl_table_fini(&tb);

    printf("\nHistory (window %s)\n", win);
    if (!res) {
        printf("  history unavailable: %s\n", perr->msg);
        return;
    }
    ctl_table_init(&tb, 3, head, "lrl");
    ctl_table_add(&tb, "awaiting retry");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "awaiting_retry"));
    ctl_table_add(&tb, "postgresql: deliveries in retry_scheduled");
    ctl_table_add(&tb, "deferred");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "deferred"));
    ctl_table_add(&tb, "postgresql: deliveries in deferred");
    ctl_table_add(&tb, "oldest undelivered");
    if (sl_pg_null(res, 0, "oldest_ms")) {
        ctl_table_add(&tb, "none");
    } else {
        char age[32];
        ctl_ops_fmt_ms(sl_pg_i64(res, 0, "oldest_ms"), t, sizeof(t));
        fmt_age(sl_pg_f64(res, 0, "oldest_undelivered_age_s"), age, sizeof(age));
        ctl_table_add(&tb, "%s (%s ago)", t, age);
    }
    ctl_table_add(&tb, "postgresql: created_at of open deliveries");
    ctl_table_add(&tb, "dead letters, unreplayed");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "dead_letters_unreplayed"));
    ctl_table_add(&tb, "postgresql: dead_letters");
    ctl_table_add(&tb, "dead letters in window");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "dead_letters_window"));
    ctl_table_add(&tb, "postgresql: dead_letters");
    ctl_table_add(&tb, "delivered in window");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "delivered_window"));
    ctl_table_add(&tb, "postgresql: delivery_attempts");
    ctl_table_add(&tb, "failed attempts in window");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "failed_attempts_window"));
    ctl_table_add(&tb, "postgresql: delivery_attempts");
    ctl_table_add(&tb, "latency samples in window");
    ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, 0, "latency_samples"));
    ctl_table_add(&tb, "postgresql: endpoint_latency");
    char a[32] = "-", p[32] = "-";
    if (!sl_pg_null(res, 0, "avg_latency_ms"))
        fmt_ms_val(sl_pg_f64(res, 0, "avg_latency_ms"), a, sizeof(a));
    if (!sl_pg_null(res, 0, "p95_latency_ms"))
        fmt_ms_val(sl_pg_f64(res, 0, "p95_latency_ms"), p, sizeof(p));
    ctl_table_add(&tb, "latency avg / p95 (ms)");
    ctl_table_add(&tb, "%s / %s", a, p);
    ctl_table_add(&tb, "postgresql: endpoint_latency");
    ctl_table_print(&tb, stdout, 2);
    ctl_table_fini(&tb);
    int64_t open = sl_pg_i64(res, 0, "awaiting_retry") + sl_pg_i64(res, 0, "deferred");
    if (!rerr && sc->scheduled == 0 && open > 0)
        printf("\nnote: the history has %" PRId64 " open deliveries but the Redis schedule is "
               "empty; if Redis lost its data, run 'sluicectl retries rebuild'\n",
               open);
}

static json_t *health_json(const struct sl_config *cfg,
                           const struct health_opts *o,
                           const struct ctl_ops_lag *lag,
                           const sl_err_t *kerr,
                           const struct sl_rstate_counts *sc,
                           const sl_err_t *rerr,
                           const PGresult *res,
                           const sl_err_t *perr,
                           int64_t now_ms)
{
    json_t *j = json_object();
    json_object_set_new(j, "as_of", json_time(now_ms, true));
    json_object_set_new(j, "window_s", json_integer(o->window_s));
    json_t *pend = json_object();
    json_object_set_new(pend, "total",
                        !kerr && !rerr ? json_integer(lag->total + sc->scheduled) : json_null());
    json_object_set_new(pend, "queued_in_kafka", !kerr ? json_integer(lag->total) : json_null());
    json_object_set_new(pend, "retry_schedule", !rerr ? json_integer(sc->scheduled) : json_null());
    json_object_set_new(pend, "in_flight", !rerr ? json_integer(sc->leased) : json_null());
    json_object_set_new(j, "pending", pend);

    json_t *k = json_object();
    json_object_set_new(k, "available", json_boolean(!kerr));
    json_object_set_new(k, "group", json_string(cfg->consumer_group));
    json_object_set_new(k, "topic", json_string(cfg->topic_deliveries));
    if (kerr) {
        json_object_set_new(k, "error", json_string(kerr->msg));
    } else {
        json_object_set_new(k, "lag", json_integer(lag->total));
        json_object_set_new(k, "uncommitted_partitions", json_integer(lag->uncommitted));
        json_t *parts = json_array();
        for (int i = 0; i < lag->n; i++) {
            const struct ctl_ops_lag_part *p = &lag->part[i];
            json_array_append_new(
                parts,
                json_pack("{s:i, s:o, s:I, s:I, s:I}", "partition", (int)p->partition, "committed",
                          p->committed >= 0 ? json_integer(p->committed) : json_null(), "low",
                          (json_int_t)p->low, "high", (json_int_t)p->high, "lag",
                          (json_int_t)p->lag));
        }
        json_object_set_new(k, "partitions", parts);
    }
    json_object_set_new(j, "kafka", k);

    json_t *r = json_object();
    json_object_set_new(r, "available", json_boolean(!rerr));
    json_object_set_new(r, "shards", json_integer(cfg->retry_shards));
    if (rerr) {
        json_object_set_new(r, "error", json_string(rerr->msg));
    } else {
        json_object_set_new(r, "scheduled", json_integer(sc->scheduled));
        json_object_set_new(r, "leased", json_integer(sc->leased));
        json_object_set_new(r, "due", json_integer(sc->due));
    }
    json_object_set_new(j, "redis", r);

    json_t *p = json_object();
    json_object_set_new(p, "available", json_boolean(res != NULL));
    if (!res) {
        json_object_set_new(p, "error", json_string(perr->msg));
    } else {
        static const char *const ints[] = {"awaiting_retry",          "deferred",
                                           "dead_letters_unreplayed", "dead_letters_window",
                                           "delivered_window",        "failed_attempts_window",
                                           "latency_samples"};
        for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
            json_object_set_new(p, ints[i], json_integer(sl_pg_i64(res, 0, ints[i])));
        json_object_set_new(
            p, "oldest_undelivered_at",
            json_time(sl_pg_i64(res, 0, "oldest_ms"), !sl_pg_null(res, 0, "oldest_ms")));
        json_object_set_new(p, "oldest_undelivered_ms", sl_pg_json_int(res, 0, "oldest_ms"));
        json_object_set_new(p, "oldest_undelivered_age_s",
                            sl_pg_json_real(res, 0, "oldest_undelivered_age_s"));
        json_object_set_new(p, "avg_latency_ms", sl_pg_json_real(res, 0, "avg_latency_ms"));
        json_object_set_new(p, "p95_latency_ms", sl_pg_json_real(res, 0, "p95_latency_ms"));
    }
    json_object_set_new(j, "postgresql", p);
    return j;
}

/* ---- endpoint records: the checks consumers make, and the registry's version ---- */

/* The latest value of one key on the endpoints topic. */
struct latest {
    struct sl_buf b; /* the value (empty when over the limit) */
    size_t too_big;  /* the value's size when it is over SL_ENDPOINT_RECORD_MAX, else 0 */
};

struct rec_scan {
    sl_map_t *latest; /* id -> struct latest * or NULL (tombstone) */
};

static void free_latest(void *v)
{
    struct latest *l = v;
    if (l)
        sl_buf_fini(&l->b);
    free(l);
}

static int keep_latest(void *opaque, const char *key, size_t keylen, const void *val, size_t vallen)
{
    struct rec_scan *sc = opaque;
    char id[SL_ENDPOINT_ID_MAX + 1];
    if (keylen == 0 || keylen > SL_ENDPOINT_ID_MAX)
        return 0; /* not an endpoint key: consumers ignore it too */
    memcpy(id, key, keylen);
    id[keylen] = '\0';
    struct latest *l = NULL;
    if (val) {
        l = sl_xcalloc(1, sizeof(*l));
        sl_buf_init(&l->b, SL_ENDPOINT_RECORD_MAX);
        if (sl_buf_append(&l->b, val, vallen) != 0)
            l->too_big = vallen;
    }
    void *old = NULL;
    sl_map_put(sc->latest, id, l, &old);
    free_latest(old);
    return 0;
}

/* A change committed this recently may still be on its way to the topic (the writers publish
 * right after the commit): not reported as missing from it yet. */
#define PUBLISH_GRACE_MS 5000

/* The registry's update time of every endpoint (id -> int64_t * ms) and the database's now
 * (*now_ms, the same clock), or NULL when PostgreSQL cannot be read (the health summary
 * reports that). Read before the topic, so that a change made during the scan shows as the
 * topic being newer, which compare_record tells from drift by that clock. */
static sl_map_t *registry_times(const struct sl_config *cfg, int64_t *now_ms)
{
    sl_err_t err;
    PGresult *res = query(cfg, "read the endpoint registry",
                          "select id, floor(extract(epoch from updated_at) * 1000)::bigint, "
                          "floor(extract(epoch from now()) * 1000)::bigint from endpoints "
                          "union all select null, null, floor(extract(epoch from now()) * "
                          "1000)::bigint",
                          0, NULL, &err);
    if (!res)
        return NULL;
    int n = PQntuples(res);
    sl_map_t *m = sl_map_new((size_t)n + 16);
    for (int r = 0; r < n; r++) {
        *now_ms = strtoll(PQgetvalue(res, r, 2), NULL, 10);
        if (PQgetisnull(res, r, 0))
            continue;
        int64_t *ms = sl_xmalloc(sizeof(*ms));
        *ms = strtoll(PQgetvalue(res, r, 1), NULL, 10);
        sl_map_put(m, PQgetvalue(res, r, 0), ms, NULL);
    }
    PQclear(res);
    return m;
}

/* How the topic's latest record of an endpoint (updated topic_ms) stands against the
 * registry's row (reg_ms; NULL: no row), read at reg_now: "" when they agree or the difference
 * is a change in flight, else "older", "newer" or "not in the registry". */
static const char *compare_record(int64_t topic_ms, const int64_t *reg_ms, int64_t reg_now)
{
    if (topic_ms >= reg_now)
        return ""; /* written after the registry was read */
    if (!reg_ms)
        return "not in the registry";
    if (topic_ms < *reg_ms)
        return *reg_ms >= reg_now - PUBLISH_GRACE_MS ? "" : "older";
    return topic_ms > *reg_ms ? "newer" : "";
}

/* Why consumers refuse the latest record l of an endpoint ("" when they take it); *upd gets
 * its update time when it decodes. */
static void judge_record(
    const struct sl_masterkey *mk, const struct latest *l, uint64_t *upd, char *why, size_t n)
{
    why[0] = '\0';
    if (l->too_big) {
        (void)snprintf(why, n, "the record is %zu bytes, over the %zu bytes consumers accept",
                       l->too_big, SL_ENDPOINT_RECORD_MAX);
        return;
    }
    struct sl_endpoint_rec rec;
    sl_err_t err;
    int rc = sl_endpoint_rec_decode(l->b.data, l->b.len, NULL, &rec, &err);
    if (rc == 0) {
        *upd = rec.updated_ms;
        rc = sl_endpoint_rec_verify(mk, &rec, &err);
        sl_endpoint_rec_fini(&rec);
    }
    if (rc != 0)
        (void)snprintf(why, n, "%s", err.msg);
}

/*
 * Check the latest record of every endpoint on the topic as consumers do, and its update time
 * against the registry's. Returns a JSON object {"checked": n, "refused": [{"endpoint_id",
 * "reason"}...], "differ": [{"endpoint_id", "topic_updated_ms", "registry_updated_ms"}...]}
 * ("differ" null when PostgreSQL could not be read; {"checked": null, "skipped": why} without
 * a master key), or NULL with err when the topic could not be read.
 */
static json_t *
check_endpoint_records(const struct sl_config *cfg, size_t *refused, size_t *differ, sl_err_t *err)
{
    *refused = *differ = 0;
    if (!cfg->master_key[0])
        return json_pack("{s:n, s:s}", "checked", "skipped", "master_key is not set");
    struct sl_masterkey mk;
    if (sl_masterkey_parse(&mk, cfg->master_key, err) != 0)
        return NULL;
    struct rec_scan sc = {sl_map_new(64)};
    json_t *out = NULL;
    int64_t reg_now = 0;
    sl_map_t *reg = registry_times(cfg, &reg_now);
    if (sl_endpoints_scan(cfg, KAFKA_TIMEOUT_MS, keep_latest, &sc, err) == 0) {
        json_t *list = json_array();
        json_t *drift = reg ? json_array() : json_null();
        size_t it = 0, checked = 0;
        const char *id;
        void *val;
        while (sl_map_next(sc.latest, &it, &id, &val)) {
            if (!val)
                continue;
            checked++;
            uint64_t upd = 0;
            char why[SL_ERR_MSG_MAX + 64];
            judge_record(&mk, val, &upd, why, sizeof(why));
            const int64_t *reg_ms = reg ? sl_map_get(reg, id) : NULL;
            const char *how = reg ? compare_record((int64_t)upd, reg_ms, reg_now) : "";
            if (why[0]) {
                json_array_append_new(list,
                                      json_pack("{s:s, s:s}", "endpoint_id", id, "reason", why));
                (*refused)++;
            } else if (how[0]) {
                json_array_append_new(
                    drift, json_pack("{s:s, s:s, s:I, s:o}", "endpoint_id", id, "topic_record", how,
                                     "topic_updated_ms", (json_int_t)upd, "registry_updated_ms",
                                     reg_ms ? json_integer(*reg_ms) : json_null()));
                (*differ)++;
            }
        }
        out = json_pack("{s:I, s:o, s:o}", "checked", (json_int_t)checked, "refused", list,
                        "differ", drift);
    }
    sl_map_destroy(reg, free);
    sl_map_destroy(sc.latest, free_latest);
    sl_masterkey_fini(&mk);
    return out;
}

static void records_text(const json_t *j, const sl_err_t *err)
{
    printf("\nendpoint records (topic_endpoints, as consumers check them)\n");
    if (!j) {
        printf("  unavailable: %s\n", err->msg);
        return;
    }
    if (json_is_null(json_object_get(j, "checked"))) {
        printf("  not checked: %s\n", json_string_value(json_object_get(j, "skipped")));
        return;
    }
    const json_t *list = json_object_get(j, "refused");
    const json_t *drift = json_object_get(j, "differ");
    printf("  checked %" JSON_INTEGER_FORMAT ", refused %zu, differing from the registry %s\n",
           json_integer_value(json_object_get(j, "checked")), json_array_size(list),
           json_is_null(drift) ? "not checked (PostgreSQL unavailable)"
                               : (json_array_size(drift) ? "(below)" : "0"));
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v)
    {
        printf("  REFUSED %s: %s\n", json_string_value(json_object_get(v, "endpoint_id")),
               json_string_value(json_object_get(v, "reason")));
    }
    json_array_foreach(drift, i, v)
    {
        const char *how = json_string_value(json_object_get(v, "topic_record"));
        const char *id = json_string_value(json_object_get(v, "endpoint_id"));
        json_int_t t = json_integer_value(json_object_get(v, "topic_updated_ms"));
        json_int_t r = json_integer_value(json_object_get(v, "registry_updated_ms"));
        if (strcmp(how, "not in the registry") == 0)
            printf("  DIFFERS %s: on the topic (updated %" JSON_INTEGER_FORMAT
                   " ms) but not in the registry: consumers still deliver to it (deleted, its "
                   "tombstone not published?); `sluicectl endpoints sync` publishes the "
                   "tombstone\n",
                   id, t);
        else
            printf("  DIFFERS %s: the topic's record is %s than the registry's (updated "
                   "%" JSON_INTEGER_FORMAT " against %" JSON_INTEGER_FORMAT " ms)%s: `sluicectl "
                   "endpoints sync` republishes the registry's%s\n",
                   id, how, t, r, strcmp(how, "newer") == 0 ? ", a restored database?" : "",
                   strcmp(how, "newer") == 0 ? " with an update time past the topic's" : "");
    }
}

int ctl_health_main(struct ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"window", required_argument, NULL, O_WINDOW},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    struct health_opts o = {.window_s = 3600, .json = false};
    int first = 0;
    int rc = parse_flags("health", argc, argv, longopts, health_opt, &o, &first);
    if (rc < 0) {
        ctl_health_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0 || (rc = ctl_extra_args("health", argc, argv, first)) != 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    int64_t now = sl_now_ms();

    struct ctl_ops_lag lag;
    sl_err_t kerr, rerr, perr;
    sl_err_clear(&kerr);
    sl_err_clear(&rerr);
    sl_err_clear(&perr);
    int krc = ctl_ops_kafka_lag(cfg, cfg->consumer_group, cfg->topic_deliveries, KAFKA_TIMEOUT_MS,
                                &lag, &kerr);
    struct sl_rstate_counts sc = {0};
    int rrc = SL_EREDIS;
    sl_redis_t *r = sl_redis_connect(cfg->redis_url, (int)cfg->redis_timeout_ms, &rerr);
    if (r)
        rrc = sl_rstate_counts(r, (uint32_t)cfg->retry_shards, 1, &sc, &rerr);
    sl_redis_close(r);
    char secs[24];
    (void)snprintf(secs, sizeof(secs), "%" PRId64, o.window_s);
    const char *params[1] = {secs};
    PGresult *res = query(cfg, "read the health summary", SQL_HEALTH, 1, params, &perr);

    sl_err_t eerr;
    sl_err_clear(&eerr);
    size_t refused = 0, differ = 0;
    json_t *recs = check_endpoint_records(cfg, &refused, &differ, &eerr);

    if (o.json) {
        json_t *j = health_json(cfg, &o, &lag, krc ? &kerr : NULL, &sc, rrc ? &rerr : NULL, res,
                                &perr, now);
        /* shaped as the other sources: "available", and an "error" when it is not */
        json_t *er = recs ? json_copy(recs) : json_pack("{s:s}", "error", eerr.msg);
        json_object_set_new(er, "available", json_boolean(recs != NULL));
        json_object_set_new(j, "endpoint_records", er);
        ctl_ops_print_json(j);
    } else {
        health_text(cfg, &o, &lag, krc ? &kerr : NULL, &sc, rrc ? &rerr : NULL, res, &perr, now);
        records_text(recs, &eerr);
    }
    rc = CTL_EXIT_OK;
    if (!recs)
        rc = ctl_fail("health", "endpoint records: %s", eerr.msg);
    else if (refused)
        rc = ctl_fail("health", "%zu endpoint record%s refused by consumers (see above)", refused,
                      refused == 1 ? " is" : "s are");
    if (recs && differ)
        rc = ctl_fail("health",
                      "%zu endpoint record%s not the registry's version (see above): "
                      "sluicectl endpoints sync",
                      differ, differ == 1 ? " is" : "s are");
    json_decref(recs);
    if (krc)
        rc = ctl_fail("health", "kafka: %s", kerr.msg);
    if (rrc)
        rc = ctl_fail("health", "redis: %s", rerr.msg);
    if (!res)
        rc = ctl_fail("health", "history unavailable: %s", perr.msg);
    PQclear(res);
    ctl_ops_lag_fini(&lag);
    return rc;
}

/* ==== slow ==== */

struct slow_opts {
    int64_t threshold_ms; /* ms */
    int64_t min_samples;  /* samples */
    int64_t window_s;     /* s */
    bool json;            /* --json */
};

static int slow_opt(void *ctx, int val, const char *arg)
{
    struct slow_opts *o = ctx;
    switch (val) {
    case O_THRESHOLD:
        return ctl_parse_int("slow", "--threshold-ms", arg, 0, SL_THR_SLOW_MS_MAX, false,
                             &o->threshold_ms);
    case O_MIN_SAMPLES:
        return ctl_parse_int("slow", "--min-samples", arg, 1, COUNT_MAX, false, &o->min_samples);
    case O_WINDOW:
        return ctl_ops_parse_duration("slow", "--window", arg, 1, CTL_OPS_DUR_MAX_S, &o->window_s);
    default:
        o->json = true;
        return 0;
    }
}

void ctl_slow_help(FILE *f)
{
    char win[24];
    ctl_ops_duration_format(SL_THR_SLOW_WINDOW_S, win, sizeof(win));
    (void)fprintf(f,
                  "usage: sluicectl slow [--threshold-ms N] [--min-samples N] [--window DURATION]\n"
                  "                      [--json]\n"
                  "\n"
                  "Endpoints whose P95 response latency over the window is above the threshold,\n"
                  "among those with at least --min-samples samples (sluice_slow_endpoints):\n"
                  "samples, P50/P95/P99, average, maximum, and the last outcome's status. The\n"
                  "defaults are the slow_endpoint alert's (common/sl_thresholds.h).\n"
                  "\n"
                  "  --threshold-ms N    P95 limit, ms (default %d)\n"
                  "  --min-samples N     fewest samples for a verdict (default %d)\n"
                  "  --window DURATION   e.g. 90m, 24h, 7d (default %s)\n"
                  "  --json              machine-readable output\n"
                  "\n"
                  "Exit: 0 (whether or not any endpoint is slow), 1 database error, 2 usage.\n",
                  SL_THR_SLOW_THRESHOLD_MS, SL_THR_SLOW_MIN_SAMPLES, win);
}

static const char SQL_SLOW[] =
    "select endpoint_id, samples, p50_ms, p95_ms, p99_ms, avg_ms, max_ms, last_status, last_error,"
    "       (extract(epoch from last_sample_at) * 1000)::bigint as last_sample_ms"
    "  from sluice_slow_endpoints($1::float8, $2::bigint, make_interval(secs => $3::float8))";

static const char *const SLOW_MS_COLS[] = {"p50_ms", "p95_ms", "p99_ms", "avg_ms", "max_ms"};

static void slow_json(const struct slow_opts *o, const PGresult *res)
{
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *e = json_object();
        json_object_set_new(e, "endpoint_id", sl_pg_json_str(res, i, "endpoint_id"));
        json_object_set_new(e, "samples", json_integer(sl_pg_i64(res, i, "samples")));
        for (size_t k = 0; k < 5; k++)
            json_object_set_new(e, SLOW_MS_COLS[k], sl_pg_json_real(res, i, SLOW_MS_COLS[k]));
        json_object_set_new(e, "last_status", sl_pg_json_int(res, i, "last_status"));
        json_object_set_new(e, "last_error", sl_pg_json_str(res, i, "last_error"));
        json_object_set_new(
            e, "last_sample_at",
            json_time(sl_pg_i64(res, i, "last_sample_ms"), !sl_pg_null(res, i, "last_sample_ms")));
        json_array_append_new(arr, e);
    }
    ctl_ops_print_json(json_pack(
        "{s:I, s:I, s:I, s:o}", "threshold_ms", (json_int_t)o->threshold_ms, "min_samples",
        (json_int_t)o->min_samples, "window_s", (json_int_t)o->window_s, "endpoints", arr));
}

/* "200", "503 http_5xx", "no response timeout", or "-" (no outcome known). */
static void add_last_status(struct ctl_table *tb, const PGresult *res, int i)
{
    const char *le = sl_pg_str(res, i, "last_error");
    bool nostatus = sl_pg_null(res, i, "last_status");
    if (nostatus && !le)
        ctl_table_add(tb, "-");
    else if (nostatus)
        ctl_table_add(tb, "no response %s", le);
    else
        ctl_table_add(tb, "%" PRId64 "%s%s", sl_pg_i64(res, i, "last_status"), le ? " " : "",
                      le ? le : "");
}

static void slow_text(const struct slow_opts *o, const PGresult *res)
{
    int n = PQntuples(res);
    char win[24];
    ctl_ops_duration_format(o->window_s, win, sizeof(win));
    if (n == 0) {
        printf("no endpoint has a P95 above %" PRId64 " ms with at least %" PRId64
               " samples in the last %s\n",
               o->threshold_ms, o->min_samples, win);
        return;
    }
    printf("endpoints with a P95 above %" PRId64 " ms (at least %" PRId64 " samples, last %s)\n\n",
           o->threshold_ms, o->min_samples, win);
    static const char *const head[] = {"endpoint", "samples", "p50 ms", "p95 ms",
                                       "p99 ms",   "avg ms",  "max ms", "last status"};
    struct ctl_table tb;
    ctl_table_init(&tb, 8, head, "lrrrrrrl");
    for (int i = 0; i < n; i++) {
        char v[32];
        ctl_table_add(&tb, "%s", sl_pg_str(res, i, "endpoint_id"));
        ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, i, "samples"));
        for (size_t k = 0; k < 5; k++) {
            fmt_ms_val(sl_pg_f64(res, i, SLOW_MS_COLS[k]), v, sizeof(v));
            ctl_table_add(&tb, "%s", v);
        }
        add_last_status(&tb, res, i);
    }
    ctl_table_print(&tb, stdout, 0);
    ctl_table_fini(&tb);
}

int ctl_slow_main(struct ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"threshold-ms", required_argument, NULL, O_THRESHOLD},
        {"min-samples", required_argument, NULL, O_MIN_SAMPLES},
        {"window", required_argument, NULL, O_WINDOW},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    struct slow_opts o = {.threshold_ms = SL_THR_SLOW_THRESHOLD_MS,
                          .min_samples = SL_THR_SLOW_MIN_SAMPLES,
                          .window_s = SL_THR_SLOW_WINDOW_S};
    int first = 0;
    int rc = parse_flags("slow", argc, argv, longopts, slow_opt, &o, &first);
    if (rc < 0) {
        ctl_slow_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0 || (rc = ctl_extra_args("slow", argc, argv, first)) != 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    char p1[24], p2[24], p3[24];
    (void)snprintf(p1, sizeof(p1), "%" PRId64, o.threshold_ms);
    (void)snprintf(p2, sizeof(p2), "%" PRId64, o.min_samples);
    (void)snprintf(p3, sizeof(p3), "%" PRId64, o.window_s);
    const char *params[3] = {p1, p2, p3};
    sl_err_t err;
    sl_err_clear(&err);
    PGresult *res = query(cfg, "read slow endpoints", SQL_SLOW, 3, params, &err);
    if (!res)
        return ctl_fail("slow", "%s", err.msg);
    if (o.json)
        slow_json(&o, res);
    else
        slow_text(&o, res);
    PQclear(res);
    return CTL_EXIT_OK;
}

/* ==== dead-letters ==== */

struct dl_opts {
    int64_t window_s;     /* s */
    const char *endpoint; /* --endpoint (borrowed from argv); NULL = all */
    bool json;            /* --json */
};

static int dl_opt(void *ctx, int val, const char *arg)
{
    struct dl_opts *o = ctx;
    switch (val) {
    case O_WINDOW:
        return ctl_ops_parse_duration("dead-letters", "--window", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &o->window_s);
    case O_ENDPOINT:
        if (!sl_valid_endpoint_id(arg, strlen(arg)))
            return ctl_usage_error("dead-letters",
                                   "invalid value for --endpoint: expected 1..64 characters "
                                   "[A-Za-z0-9_-]");
        o->endpoint = arg;
        return 0;
    default:
        o->json = true;
        return 0;
    }
}

void ctl_dead_letters_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl dead-letters [--window DURATION] [--endpoint ID] [--json]\n"
           "\n"
           "Dead letters whose latest death is in the window, per endpoint\n"
           "(sluice_dead_letter_analysis): count, not yet replayed, commonest error class and\n"
           "status, first and last, average attempts; then the patterns found:\n"
           "  clustered outage       >= 80%% of the endpoint's dead letters, and at least 10,\n"
           "                         inside one 15-minute span\n"
           "  auth/permission spike  401/403 are more than half of them, and at least 5\n"
           "  rate-limit spike       429 is more than half of them, and at least 5\n"
           "  gradual accumulation   present in >= 6 distinct hours of the window\n"
           "\n"
           "  --window DURATION   e.g. 90m, 24h (default), 7d\n"
           "  --endpoint ID       one endpoint only\n"
           "  --json              machine-readable output\n"
           "\n"
           "Exit: 0, 1 database error, 2 usage.\n");
}

static const char SQL_DL[] =
    "select endpoint_id, dead_letters, unreplayed, without_payload, top_error, top_error_count,"
    "       top_status, top_status_count, avg_attempts, auth_count, rate_limit_count,"
    "       cluster_count, hours_present, array_to_json(patterns)::text as patterns_json,"
    "       (extract(epoch from first_dead_at) * 1000)::bigint as first_ms,"
    "       (extract(epoch from last_dead_at) * 1000)::bigint as last_ms,"
    "       (extract(epoch from first_failed_at) * 1000)::bigint as first_failed_ms,"
    "       (extract(epoch from cluster_start) * 1000)::bigint as cluster_ms"
    "  from sluice_dead_letter_analysis(make_interval(secs => $1::float8), $2)";

/* The patterns column (a JSON array of strings); a new reference, never NULL. */
static json_t *patterns_of(const PGresult *res, int row)
{
    const char *s = sl_pg_str(res, row, "patterns_json");
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    if (!json_is_array(j)) {
        json_decref(j);
        j = json_array();
    }
    return j;
}

static void dl_patterns_text(const PGresult *res, int n)
{
    bool any = false;
    for (int i = 0; i < n; i++) {
        json_t *pats = patterns_of(res, i);
        size_t k;
        json_t *p;
        json_array_foreach(pats, k, p)
        {
            if (!any)
                printf("\nPatterns\n");
            any = true;
            const char *name = json_string_value(p);
            const char *ep = sl_pg_str(res, i, "endpoint_id");
            int64_t total = sl_pg_i64(res, i, "dead_letters");
            char t[40];
            if (name && strcmp(name, "clustered outage") == 0) {
                ctl_ops_fmt_ms(sl_pg_i64(res, i, "cluster_ms"), t, sizeof(t));
                printf("  %s: clustered outage (%" PRId64 " of %" PRId64
                       " within 15 minutes from %s)\n",
                       ep, sl_pg_i64(res, i, "cluster_count"), total, t);
            } else if (name && strcmp(name, "auth/permission spike") == 0) {
                printf("  %s: auth/permission spike (%" PRId64 " of %" PRId64
                       " answered 401/403: check the endpoint's credentials)\n",
                       ep, sl_pg_i64(res, i, "auth_count"), total);
            } else if (name && strcmp(name, "rate-limit spike") == 0) {
                printf("  %s: rate-limit spike (%" PRId64 " of %" PRId64
                       " ended on 429: lower the endpoint's rate)\n",
                       ep, sl_pg_i64(res, i, "rate_limit_count"), total);
            } else if (name && strcmp(name, "gradual accumulation") == 0) {
                printf("  %s: gradual accumulation (dead letters in %" PRId64
                       " distinct hours of the window)\n",
                       ep, sl_pg_i64(res, i, "hours_present"));
            } else if (name) {
                printf("  %s: %s\n", ep, name);
            }
        }
        json_decref(pats);
    }
    if (!any)
        printf("\nPatterns: none\n");
}

int ctl_dead_letters_main(struct ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"window", required_argument, NULL, O_WINDOW},
                                             {"endpoint", required_argument, NULL, O_ENDPOINT},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    struct dl_opts o = {.window_s = 86400};
    int first = 0;
    int rc = parse_flags("dead-letters", argc, argv, longopts, dl_opt, &o, &first);
    if (rc < 0) {
        ctl_dead_letters_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0 || (rc = ctl_extra_args("dead-letters", argc, argv, first)) != 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    char p1[24];
    (void)snprintf(p1, sizeof(p1), "%" PRId64, o.window_s);
    const char *params[2] = {p1, o.endpoint};
    sl_err_t err;
    sl_err_clear(&err);
    PGresult *res = query(cfg, "analyse dead letters", SQL_DL, 2, params, &err);
    if (!res)
        return ctl_fail("dead-letters", "%s", err.msg);
    int n = PQntuples(res);
    char win[24];
    ctl_ops_duration_format(o.window_s, win, sizeof(win));
    if (o.json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) {
            json_t *e = json_object();
            json_object_set_new(e, "endpoint_id", sl_pg_json_str(res, i, "endpoint_id"));
            static const char *const ints[] = {"dead_letters", "unreplayed", "without_payload"};
            for (size_t k = 0; k < 3; k++)
                json_object_set_new(e, ints[k], json_integer(sl_pg_i64(res, i, ints[k])));
            json_object_set_new(e, "top_error", sl_pg_json_str(res, i, "top_error"));
            json_object_set_new(e, "top_error_count",
                                json_integer(sl_pg_i64(res, i, "top_error_count")));
            json_object_set_new(e, "top_status", sl_pg_json_int(res, i, "top_status"));
            json_object_set_new(e, "top_status_count",
                                json_integer(sl_pg_i64(res, i, "top_status_count")));
            json_object_set_new(e, "first_dead_at", json_time(sl_pg_i64(res, i, "first_ms"), true));
            json_object_set_new(e, "last_dead_at", json_time(sl_pg_i64(res, i, "last_ms"), true));
            json_object_set_new(e, "first_failed_at",
                                json_time(sl_pg_i64(res, i, "first_failed_ms"), true));
            json_object_set_new(e, "avg_attempts", sl_pg_json_real(res, i, "avg_attempts"));
            static const char *const ev[] = {"auth_count", "rate_limit_count", "cluster_count",
                                             "hours_present"};
            for (size_t k = 0; k < 4; k++)
                json_object_set_new(e, ev[k], json_integer(sl_pg_i64(res, i, ev[k])));
            json_object_set_new(e, "cluster_start",
                                json_time(sl_pg_i64(res, i, "cluster_ms"), true));
            json_object_set_new(e, "patterns", patterns_of(res, i));
            json_array_append_new(arr, e);
        }
        ctl_ops_print_json(json_pack("{s:I, s:s?, s:o}", "window_s", (json_int_t)o.window_s,
                                     "endpoint", o.endpoint, "endpoints", arr));
    } else if (n == 0) {
        printf("no dead letters in the last %s%s%s\n", win, o.endpoint ? " for endpoint " : "",
               o.endpoint ? o.endpoint : "");
    } else {
        printf("dead letters in the last %s, per endpoint\n\n", win);
        static const char *const head[] = {"endpoint",   "dead",  "unreplayed", "top error",
                                           "top status", "first", "last",       "avg attempts"};
        struct ctl_table tb;
        ctl_table_init(&tb, 8, head, "lrrllllr");
        for (int i = 0; i < n; i++) {
            char t1[40], t2[40];
            ctl_table_add(&tb, "%s", sl_pg_str(res, i, "endpoint_id"));
            ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, i, "dead_letters"));
            ctl_table_add(&tb, "%" PRId64, sl_pg_i64(res, i, "unreplayed"));
            const char *te = sl_pg_str(res, i, "top_error");
            ctl_table_add(&tb, "%s (%" PRId64 ")", te ? te : "none",
                          sl_pg_i64(res, i, "top_error_count"));
            if (sl_pg_null(res, i, "top_status"))
                ctl_table_add(&tb, "no response (%" PRId64 ")",
                              sl_pg_i64(res, i, "top_status_count"));
            else
                ctl_table_add(&tb, "%" PRId64 " (%" PRId64 ")", sl_pg_i64(res, i, "top_status"),
                              sl_pg_i64(res, i, "top_status_count"));
            ctl_ops_fmt_ms(sl_pg_i64(res, i, "first_ms"), t1, sizeof(t1));
            ctl_ops_fmt_ms(sl_pg_i64(res, i, "last_ms"), t2, sizeof(t2));
            ctl_table_add(&tb, "%s", t1);
            ctl_table_add(&tb, "%s", t2);
            ctl_table_add(&tb, "%.2f", sl_pg_f64(res, i, "avg_attempts"));
        }
        ctl_table_print(&tb, stdout, 0);
        ctl_table_fini(&tb);
        dl_patterns_text(res, n);
    }
    PQclear(res);
    return CTL_EXIT_OK;
}

/* ==== alerts ==== */

struct alert_opts {
    struct ctl_thresholds thr; /* the thresholds (defaults: common/sl_thresholds.h) */
    bool json;                 /* --json */
};

static int alert_opt(void *ctx, int val, const char *arg)
{
    struct alert_opts *o = ctx;
    if (val == O_JSON) {
        o->json = true;
        return 0;
    }
    return ctl_thresholds_opt("alerts", &o->thr, val, arg);
}

void ctl_alerts_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl alerts [--dead-rise-factor X] [--dead-rise-min N]\n"
           "                        [--oldest-max DURATION] [--slow-threshold-ms N]\n"
           "                        [--slow-min-samples N] [--slow-window DURATION] [--json]\n"
           "\n"
           "Prints the alerts that fire now on the history (sluice_alerts), for cron and\n"
           "monitoring:\n"
           "  dead_letters_rising   dead letters of the last hour >= --dead-rise-min and\n"
           "                        > --dead-rise-factor x the hourly average of the 24 h\n"
           "                        before\n"
           "  oldest_undelivered    an undelivered delivery older than --oldest-max\n"
           "  slow_endpoint         P95 over --slow-threshold-ms with at least\n"
           "                        --slow-min-samples samples in --slow-window; one per\n"
           "                        endpoint\n"
           "\n");
    ctl_thresholds_help(f, false);
    (void)fprintf(
        f, "  --json                      machine-readable output\n"
           "\n"
           "The defaults are those of the Prometheus rules too (sluicectl alert-rules).\n"
           "\n"
           "Exit: 0 no alert fires; 3 at least one fires; 1 the check itself failed (database\n"
           "unreachable: treat as an alert too); 2 usage; 78 configuration.\n");
}

static const char SQL_ALERTS[] =
    "select alert, endpoint_id, value, threshold, message"
    "  from sluice_alerts($1::float8, $2::bigint, make_interval(secs => $3::float8), $4::float8,"
    "                     $5::bigint, make_interval(secs => $6::float8))";

int ctl_alerts_main(struct ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {CTL_THR_LONGOPTS_HISTORY,
                                             {"json", no_argument, NULL, O_JSON},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    struct alert_opts o = {.json = false};
    ctl_thresholds_init(&o.thr);
    int first = 0;
    int rc = parse_flags("alerts", argc, argv, longopts, alert_opt, &o, &first);
    if (rc < 0) {
        ctl_alerts_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0 || (rc = ctl_extra_args("alerts", argc, argv, first)) != 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    char p[6][32];
    (void)snprintf(p[0], sizeof(p[0]), "%.17g", o.thr.dead_rise_factor);
    (void)snprintf(p[1], sizeof(p[1]), "%" PRId64, o.thr.dead_rise_min);
    (void)snprintf(p[2], sizeof(p[2]), "%" PRId64, o.thr.oldest_max_s);
    (void)snprintf(p[3], sizeof(p[3]), "%" PRId64, o.thr.slow_threshold_ms);
    (void)snprintf(p[4], sizeof(p[4]), "%" PRId64, o.thr.slow_min_samples);
    (void)snprintf(p[5], sizeof(p[5]), "%" PRId64, o.thr.slow_window_s);
    const char *params[6] = {p[0], p[1], p[2], p[3], p[4], p[5]};
    sl_err_t err;
    sl_err_clear(&err);
    PGresult *res = query(cfg, "evaluate alerts", SQL_ALERTS, 6, params, &err);
    if (!res)
        return ctl_fail("alerts", "%s", err.msg);
    int n = PQntuples(res);
    if (o.json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(arr, json_pack("{s:o, s:o, s:o, s:o, s:o}", "alert",
                                                 sl_pg_json_str(res, i, "alert"), "endpoint_id",
                                                 sl_pg_json_str(res, i, "endpoint_id"), "value",
                                                 sl_pg_json_real(res, i, "value"), "threshold",
                                                 sl_pg_json_real(res, i, "threshold"), "message",
                                                 sl_pg_json_str(res, i, "message")));
        ctl_ops_print_json(json_pack("{s:i, s:o}", "firing", n, "alerts", arr));
    } else if (n == 0) {
        printf("no alert fires\n");
    } else {
        for (int i = 0; i < n; i++) {
            const char *ep = sl_pg_str(res, i, "endpoint_id");
            printf("ALERT %s%s%s: %s\n", sl_pg_str(res, i, "alert"), ep ? " " : "", ep ? ep : "",
                   sl_pg_str(res, i, "message"));
        }
    }
    PQclear(res);
    return n > 0 ? CTL_OPS_EXIT_ALERTS : CTL_EXIT_OK;
}

/* ==== latency ==== */

struct lat_opts {
    int64_t window_s; /* s */
    bool json;        /* --json */
};

static int lat_opt(void *ctx, int val, const char *arg)
{
    struct lat_opts *o = ctx;
    if (val == O_WINDOW)
        return ctl_ops_parse_duration("latency", "--window", arg, 1, CTL_OPS_DUR_MAX_S,
                                      &o->window_s);
    o->json = true;
    return 0;
}

void ctl_latency_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl latency ENDPOINT [--window DURATION] [--json]\n"
           "\n"
           "Response latency of one endpoint over the window (sluice_latency): samples,\n"
           "P50/P95/P99, average, min, max, and a histogram with the buckets <10ms, <50ms,\n"
           "<100ms, <250ms, <500ms, <1s, <2s, <5s, <10s, >=10s. A sample is an attempt that\n"
           "got an HTTP response (any status).\n"
           "\n"
           "  --window DURATION   e.g. 90m, 24h (default), 7d (samples are kept for\n"
           "                      latency_window_h only)\n"
           "  --json              machine-readable output\n"
           "\n"
           "Exit: 0, 1 database error, 2 usage.\n");
}

static const char SQL_LAT[] = "select samples, p50_ms, p95_ms, p99_ms, avg_ms, min_ms, max_ms,"
                              "       array_to_json(bucket_labels)::text as labels,"
                              "       array_to_json(bucket_counts)::text as counts"
                              "  from sluice_latency($1, make_interval(secs => $2::float8))";

/* Bars scaled to the fullest bucket (any non-empty bucket gets at least one '#'). */
static void print_histogram(const json_t *labels, const json_t *counts)
{
    json_int_t top = 0;
    for (size_t i = 0; i < json_array_size(counts); i++)
        if (json_integer_value(json_array_get(counts, i)) > top)
            top = json_integer_value(json_array_get(counts, i));
    for (size_t i = 0; i < json_array_size(counts); i++) {
        json_int_t cnt = json_integer_value(json_array_get(counts, i));
        int bar = top > 0 ? (int)((cnt * BAR_WIDTH + top - 1) / top) : 0;
        char bars[BAR_WIDTH + 1];
        memset(bars, '#', (size_t)bar);
        bars[bar] = '\0';
        printf("  %-6s |%-*s| %lld\n", json_string_value(json_array_get(labels, i)), BAR_WIDTH,
               bars, (long long)cnt);
    }
}

int ctl_latency_main(struct ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"window", required_argument, NULL, O_WINDOW},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    struct lat_opts o = {.window_s = 86400};
    int first = 0;
    int rc = parse_flags("latency", argc, argv, longopts, lat_opt, &o, &first);
    if (rc < 0) {
        ctl_latency_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0)
        return rc;
    const char *ep = NULL;
    if ((rc = one_id("latency", argc, argv, first, &ID_ENDPOINT, &ep)) != 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    char p2[24];
    (void)snprintf(p2, sizeof(p2), "%" PRId64, o.window_s);
    const char *params[2] = {ep, p2};
    sl_err_t err;
    sl_err_clear(&err);
    PGresult *res = query(cfg, "read latency", SQL_LAT, 2, params, &err);
    if (!res)
        return ctl_fail("latency", "%s", err.msg);
    if (PQntuples(res) != 1) {
        PQclear(res);
        return ctl_fail("latency", "unexpected result of sluice_latency");
    }
    json_t *labels = json_loads(sl_pg_str(res, 0, "labels"), 0, NULL);
    json_t *counts = json_loads(sl_pg_str(res, 0, "counts"), 0, NULL);
    if (!json_is_array(labels) || !json_is_array(counts) ||
        json_array_size(labels) != json_array_size(counts)) {
        json_decref(labels);
        json_decref(counts);
        PQclear(res);
        return ctl_fail("latency", "unexpected histogram from sluice_latency");
    }
    int64_t samples = sl_pg_i64(res, 0, "samples");
    static const char *const ms[] = {"p50_ms", "p95_ms", "p99_ms", "avg_ms", "min_ms", "max_ms"};
    char win[24];
    ctl_ops_duration_format(o.window_s, win, sizeof(win));
    if (o.json) {
        json_t *j = json_object();
        json_object_set_new(j, "endpoint_id", json_string(ep));
        json_object_set_new(j, "window_s", json_integer(o.window_s));
        json_object_set_new(j, "samples", json_integer(samples));
        for (size_t k = 0; k < 6; k++)
            json_object_set_new(j, ms[k], sl_pg_json_real(res, 0, ms[k]));
        json_t *h = json_array();
        for (size_t i = 0; i < json_array_size(labels); i++)
            json_array_append_new(h, json_pack("{s:O, s:O}", "bucket", json_array_get(labels, i),
                                               "samples", json_array_get(counts, i)));
        json_object_set_new(j, "histogram", h);
        ctl_ops_print_json(j);
    } else {
        printf("latency of %s over the last %s: %" PRId64 " samples\n", ep, win, samples);
        if (samples > 0) {
            char v[6][32];
            for (size_t k = 0; k < 6; k++)
                fmt_ms_val(sl_pg_f64(res, 0, ms[k]), v[k], sizeof(v[k]));
            printf("  p50 %s ms  p95 %s ms  p99 %s ms  avg %s ms  min %s ms  max %s ms\n\n", v[0],
                   v[1], v[2], v[3], v[4], v[5]);
            print_histogram(labels, counts);
        }
    }
    json_decref(labels);
    json_decref(counts);
    PQclear(res);
    return CTL_EXIT_OK;
}

/* ==== event ==== */

void ctl_event_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl event EVENT_ID [--json]\n"
           "\n"
           "One event's deliveries from the history: per endpoint its state, attempts, last\n"
           "status and error, when it was delivered or is due again; then every attempt\n"
           "(time, state, status, error, latency, pod). What GET /v1/events/{id}/deliveries\n"
           "answers, without the API. The recorder writes the history a moment after the\n"
           "consumers: an event just published may not be there yet. Payloads are never\n"
           "shown.\n"
           "\n"
           "  --json   machine-readable output\n"
           "\n"
           "Exit: 0; 1 database error, or no delivery of that event in the history; 2 usage.\n");
}

/* RFC 3339 in UTC to the ms, as every other time sluicectl and sluice-api write */
#define EV_TS(col)                                                                                 \
    "to_char(" col " at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') as " col
static const char SQL_EV_DELIVERIES[] =
    "select endpoint_id, event_type, state::text as state, attempts, last_status, last_error,"
    "       last_msg, " EV_TS("delivered_at") ", " EV_TS(
        "next_attempt_at") " from deliveries"
                           " where event_id = $1 order by endpoint_id collate \"C\"";
static const char SQL_EV_ATTEMPTS[] =
    "select endpoint_id, attempt, state::text as state, http_status, err, msg, " EV_TS(
        "ts") ","
              "       round(latency_us / 1000.0, 1) as latency_ms, pod from delivery_attempts"
              " where event_id = $1 order by endpoint_id collate \"C\", ts, attempt";

static void event_json(const char *id, const PGresult *d, const PGresult *a)
{
    json_t *arr = json_array();
    int na = PQntuples(a), k = 0;
    for (int i = 0; i < PQntuples(d); i++) {
        const char *ep = sl_pg_str(d, i, "endpoint_id");
        json_t *log = json_array();
        for (; k < na && strcmp(sl_pg_str(a, k, "endpoint_id"), ep) <= 0; k++) {
            if (strcmp(sl_pg_str(a, k, "endpoint_id"), ep) != 0)
                continue; /* an attempt recorded before its delivery row: not listed */
            json_array_append_new(
                log,
                json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "attempt",
                          sl_pg_json_int(a, k, "attempt"), "state", sl_pg_json_str(a, k, "state"),
                          "http_status", sl_pg_json_int(a, k, "http_status"), "error",
                          sl_pg_json_str(a, k, "err"), "message", sl_pg_json_str(a, k, "msg"), "at",
                          sl_pg_json_str(a, k, "ts"), "latency_ms",
                          sl_pg_json_real(a, k, "latency_ms"), "pod", sl_pg_json_str(a, k, "pod")));
        }
        json_array_append_new(
            arr,
            json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "endpoint_id", ep,
                      "type", sl_pg_json_str(d, i, "event_type"), "state",
                      sl_pg_json_str(d, i, "state"), "attempts", sl_pg_json_int(d, i, "attempts"),
                      "last_status", sl_pg_json_int(d, i, "last_status"), "last_error",
                      sl_pg_json_str(d, i, "last_error"), "last_message",
                      sl_pg_json_str(d, i, "last_msg"), "delivered_at",
                      sl_pg_json_str(d, i, "delivered_at"), "next_attempt_at",
                      sl_pg_json_str(d, i, "next_attempt_at"), "attempts_log", log));
    }
    ctl_ops_print_json(json_pack("{s:s, s:o}", "event_id", id, "deliveries", arr));
}

/* A column's text, or "-" for NULL. */
static const char *or_dash(const PGresult *res, int row, const char *col)
{
    const char *s = sl_pg_str(res, row, col);
    return s ? s : "-";
}

static void event_text(const char *id, const PGresult *d, const PGresult *a)
{
    int nd = PQntuples(d);
    printf("event %s: %d deliver%s\n\n", id, nd, nd == 1 ? "y" : "ies");
    static const char *const dh[] = {
        "endpoint",    "type",       "state",           "attempts",
        "last status", "last error", "delivered (UTC)", "next attempt (UTC)"};
    struct ctl_table t;
    ctl_table_init(&t, 8, dh, "lllrllll");
    for (int i = 0; i < nd; i++) {
        ctl_table_add(&t, "%s", or_dash(d, i, "endpoint_id"));
        ctl_table_add(&t, "%s", or_dash(d, i, "event_type"));
        ctl_table_add(&t, "%s", or_dash(d, i, "state"));
        ctl_table_add(&t, "%s", or_dash(d, i, "attempts"));
        ctl_table_add(&t, "%s", or_dash(d, i, "last_status"));
        ctl_table_add(&t, "%s", or_dash(d, i, "last_error"));
        ctl_table_add(&t, "%s", or_dash(d, i, "delivered_at"));
        ctl_table_add(&t, "%s", or_dash(d, i, "next_attempt_at"));
    }
    ctl_table_print(&t, stdout, 2);
    ctl_table_fini(&t);
    static const char *const ah[] = {"endpoint", "#",          "at (UTC)", "state",  "status",
                                     "error",    "latency ms", "pod",      "message"};
    ctl_table_init(&t, 9, ah, "lrllrlrll");
    for (int i = 0; i < PQntuples(a); i++) {
        static const char *const cols[] = {"endpoint_id", "attempt",     "ts",
                                           "state",       "http_status", "err",
                                           "latency_ms",  "pod",         "msg"};
        for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
            ctl_table_add(&t, "%s", or_dash(a, i, cols[c]));
    }
    printf("\nattempts:\n");
    ctl_table_print(&t, stdout, 2);
    ctl_table_fini(&t);
}

static int event_opt(void *ctx, int val, const char *arg)
{
    (void)val;
    (void)arg;
    *(bool *)ctx = true; /* --json */
    return 0;
}

int ctl_event_main(struct ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, O_JSON}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    bool json = false;
    int first = 0;
    int rc = parse_flags("event", argc, argv, longopts, event_opt, &json, &first);
    if (rc < 0) {
        ctl_event_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0)
        return rc;
    const char *id = NULL;
    if ((rc = one_id("event", argc, argv, first, &ID_EVENT, &id)) != 0)
        return rc;
    const struct sl_config *cfg = ctl_config(c);
    const char *params[1] = {id};
    sl_err_t err;
    sl_err_clear(&err);
    PGconn *pg = ctl_ops_pg_open(cfg, &err);
    if (!pg)
        return ctl_fail("event", "%s", err.msg);
    /* one connection for both reads */
    PGresult *d = sl_pg_exec(pg, "read the event's deliveries", SQL_EV_DELIVERIES, 1, params, &err);
    PGresult *a =
        d ? sl_pg_exec(pg, "read the event's attempts", SQL_EV_ATTEMPTS, 1, params, &err) : NULL;
    PQfinish(pg);
    if (!a) {
        PQclear(d);
        return ctl_fail("event", "%s", err.msg);
    }
    int n = PQntuples(d);
    if (json)
        event_json(id, d, a);
    else if (n > 0)
        event_text(id, d, a);
    PQclear(d);
    PQclear(a);
    if (n == 0)
        return ctl_fail("event",
                        "no delivery of event %s in the history (not published, not "
                        "recorded yet, or past history_retention_d)",
                        id);
    return CTL_EXIT_OK;
}
