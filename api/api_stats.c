/*
 * api_stats: the operator's figures behind the web console (scope read), from the recorder's
 * history (sql/0002, sql/0003) and the consumers' breakers in Redis (common/sl_breaker):
 *   GET /v1/endpoint-stats              per endpoint over a window (default 1 h): enabled,
 *                                       breaker, delivered/s, attempts, failures,
 *                                       P50/P95/P99, the `slow` flag, the last error
 *   GET /v1/endpoints/{id}/latency      one endpoint's latency in time buckets over a window
 *                                       (default 24 h): count and P50/P95/P99 per bucket
 *   GET /v1/dead-letters/patterns       sluice_dead_letter_analysis per endpoint: counts,
 *                                       commonest error and status, the named patterns,
 *                                       most dead letters first, paginated on (count, id)
 * The statistics' endpoints are the instance's in-memory table (what the consumers deliver
 * to), in id order, paginated like every list; a key limited to channels sees only endpoints
 * carrying one of them (api_key_sees). The figures follow the conventions of sql/0003_analysis.sql:
 * "in the window" is ts >= now() - window, latencies are endpoint_latency samples (attempts
 * that got a response), percentiles are percentile_cont in ms, and `slow` is the rule of
 * `sluicectl slow` (P95 over the threshold with at least min-samples samples).
 * Never returned: payloads, response bodies, URLs, consumer messages.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/sl_breaker.h"
#include "common/sl_log.h"
#include "common/sl_pg.h"
#include "common/sl_record.h"
#include "common/sl_thresholds.h"

#define WINDOW_MIN_S 60LL       /* shortest window, s */
#define WINDOW_MAX_S 31622400LL /* longest window, s: 366 days (sluice__check_window) */
#define BUCKET_MIN_S 10LL       /* smallest latency bucket, s */
#define BUCKET_MAX_S 86400LL    /* largest latency bucket, s */
#define BUCKETS_MAX  1440LL     /* most buckets in one answer */
#define BUCKETS_AIM  288LL      /* default bucket: window / this, rounded up to whole minutes */
/* the slow rule's defaults and ranges are sluicectl slow's: common/sl_thresholds.h */
#define SLOW_MS_MAX   SL_THR_SLOW_MS_MAX
#define SLOW_MIN_MAX  SL_THR_COUNT_MAX
#define SLOW_MS_DEF   SL_THR_SLOW_THRESHOLD_MS
#define SLOW_MIN_DEF  SL_THR_SLOW_MIN_SAMPLES
#define STATS_WIN_DEF 3600  /* default window of the endpoint statistics, s */
#define TREND_WIN_DEF 86400 /* default window of the latency trend, s */
#define DL_WIN_DEF    86400 /* default window of the dead-letter patterns, s */

/* clang-format off */
/* $1 the page's endpoint ids (text[]), $2 the window in s */
static const char SQL_STATS[] =
    "with w as (select now() - make_interval(secs => $2::float8) as lo), "
    "att as (select a.endpoint_id, "
    "    count(*) filter (where a.state = 'delivered') as delivered, "
    "    count(*) filter (where a.attempt > 0) as attempts, "
    "    count(*) filter (where a.attempt > 0 and a.state <> 'delivered') as failures "
    "  from delivery_attempts a, w "
    "  where a.ts >= w.lo and a.endpoint_id = any($1::text[]) "
    "    and a.state in ('delivered', 'retry_scheduled', 'dead_letter') "
    "  group by a.endpoint_id), "
    "lat as (select l.endpoint_id, count(*) as n, "
    "    percentile_cont(array[0.5, 0.95, 0.99]) within group (order by l.latency_us) as p "
    "  from endpoint_latency l, w "
    "  where l.ts >= w.lo and l.endpoint_id = any($1::text[]) group by l.endpoint_id), "
    "err as (select distinct on (a.endpoint_id) a.endpoint_id, a.err, a.http_status, a.ts "
    "  from delivery_attempts a, w "
    "  where a.ts >= w.lo and a.endpoint_id = any($1::text[]) "
    "    and a.state in ('retry_scheduled', 'dead_letter') and a.err is not null "
    "  order by a.endpoint_id, a.ts desc, a.attempt desc) "
    "select i.id as endpoint_id, coalesce(att.delivered, 0) as delivered, "
    "  coalesce(att.attempts, 0) as attempts, coalesce(att.failures, 0) as failures, "
    "  coalesce(lat.n, 0) as samples, lat.p[1] / 1000 as p50_ms, lat.p[2] / 1000 as p95_ms, "
    "  lat.p[3] / 1000 as p99_ms, err.err as last_error, err.http_status as last_status, "
    "  (extract(epoch from err.ts) * 1000)::bigint as last_error_ms "
    "from unnest($1::text[]) with ordinality as i(id, n) "
    "left join att on att.endpoint_id = i.id left join lat on lat.endpoint_id = i.id "
    "left join err on err.endpoint_id = i.id order by i.n";
/* $1 endpoint, $2 window s, $3 bucket s. One row even without samples (lo_ms, now_ms). */
#define BIN(x) "date_bin(make_interval(secs => $3::float8), " x ", " \
               "timestamptz '1970-01-01 00:00:00+00')"
static const char SQL_TREND[] =
    "with w as (select now() as now, " BIN("now() - make_interval(secs => $2::float8)") " as lo) "
    "select (extract(epoch from w.lo) * 1000)::bigint as lo_ms, "
    "  (extract(epoch from w.now) * 1000)::bigint as now_ms, b.t_ms, b.n, "
    "  b.p[1] / 1000 as p50_ms, b.p[2] / 1000 as p95_ms, b.p[3] / 1000 as p99_ms "
    "from w left join lateral ("
    "  select (extract(epoch from " BIN("l.ts") ") * 1000)::bigint as t_ms, count(*) as n, "
    "    percentile_cont(array[0.5, 0.95, 0.99]) within group (order by l.latency_us) as p "
    "  from endpoint_latency l where l.endpoint_id = $1 and l.ts >= w.lo group by 1) b on true "
    "order by b.t_ms";
/* $1 window s, $2 endpoint or NULL; the page after the cursor ($3 dead letters, $4 endpoint;
 * NULL = the first page), most dead letters first, then by id in byte order as every list, $5
 * rows at most; $6 the endpoints a key limited to channels sees (NULL = every endpoint) */
static const char SQL_PATTERNS[] =
    "select endpoint_id, dead_letters, unreplayed, without_payload, top_error, top_error_count, "
    "  top_status, top_status_count, avg_attempts, auth_count, rate_limit_count, "
    "  cluster_count, hours_present, array_to_json(patterns)::text as patterns_json, "
    "  (extract(epoch from first_dead_at) * 1000)::bigint as first_ms, "
    "  (extract(epoch from last_dead_at) * 1000)::bigint as last_ms, "
    "  (extract(epoch from first_failed_at) * 1000)::bigint as first_failed_ms, "
    "  (extract(epoch from cluster_start) * 1000)::bigint as cluster_ms "
    "from sluice_dead_letter_analysis(make_interval(secs => $1::float8), $2) "
    "where ($3::bigint is null or dead_letters < $3::bigint "
    "       or (dead_letters = $3::bigint and endpoint_id collate \"C\" > $4::text)) "
    "  and ($6::text[] is null or endpoint_id = any($6::text[])) "
    "order by dead_letters desc, endpoint_id collate \"C\" limit $5::int";
/* clang-format on */

/* ==== Shared ==== */

/*
 * ?name=: a decimal integer in lo..hi, def when absent, into *out. Returns 0, or -1 after
 * answering 400 naming the parameter.
 */
static int
query_int(struct api_req *r, const char *name, int64_t lo, int64_t hi, int64_t def, int64_t *out)
{
    const char *s = api_query(r, name);
    *out = def;
    if (!s)
        return 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    bool digits = s[0] >= '0' && s[0] <= '9' && strlen(s) <= 19;
    if (!digits || *end != '\0' || v < lo || v > hi) {
        api_problem(r, 400, "invalid-parameter", name,
                    "%s must be an integer %" PRId64 "..%" PRId64, name, lo, hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* A latency in ms with at most three decimals (the API's convention), or JSON null. */
static json_t *ms_json(const PGresult *res, int row, const char *col)
{
    if (sl_pg_null(res, row, col))
        return json_null();
    return json_real(round(sl_pg_f64(res, row, col) * 1000.0) / 1000.0);
}

static json_t *time_json(const PGresult *res, int row, const char *col)
{
    return sl_pg_null(res, row, col) ? json_null() : api_time_json(sl_pg_i64(res, row, col));
}

/* ==== GET /v1/endpoint-stats ==== */

struct stats_opts {
    int64_t window_s;                 /* s */
    int64_t slow_ms;                  /* P95 threshold, ms */
    int64_t slow_min;                 /* fewest samples for the slow rule */
    long limit;                       /* page size */
    char cur[SL_ENDPOINT_ID_MAX + 2]; /* the last id of the previous page */
    bool have_cur;                    /* cur given */
};

static int by_id(const void *a, const void *b)
{
    const struct sl_endpoint *x = *(const struct sl_endpoint *const *)a;
    const struct sl_endpoint *y = *(const struct sl_endpoint *const *)b;
    return strcmp(x->id, y->id);
}

static json_t *breaker_json(const struct sl_breaker_view *v)
{
    if (!v) /* Redis could not be read */
        return json_pack("{s:s, s:n, s:n}", "state", "unknown", "failures", "reopen_at");
    return json_pack("{s:s, s:I, s:o}", "state", sl_breaker_state_name(v->state), "failures",
                     (json_int_t)v->failures, "reopen_at", api_time_json(v->reopen_at_ms));
}

/* One endpoint's entry from its row of SQL_STATS; brk NULL = breaker unknown. */
static json_t *stats_item(const struct sl_endpoint *e,
                          const PGresult *res,
                          int row,
                          const struct sl_breaker_view *brk,
                          const struct stats_opts *o)
{
    int64_t delivered = sl_pg_i64(res, row, "delivered");
    int64_t samples = sl_pg_i64(res, row, "samples");
    bool slow = samples >= o->slow_min && !sl_pg_null(res, row, "p95_ms") &&
                sl_pg_f64(res, row, "p95_ms") > (double)o->slow_ms;
    json_t *last = json_null();
    if (!sl_pg_null(res, row, "last_error"))
        last = json_pack("{s:o, s:o, s:o}", "error", sl_pg_json_str(res, row, "last_error"),
                         "status", sl_pg_json_int(res, row, "last_status"), "at",
                         time_json(res, row, "last_error_ms"));
    json_t *lat = json_pack("{s:I, s:o, s:o, s:o}", "samples", (json_int_t)samples, "p50_ms",
                            ms_json(res, row, "p50_ms"), "p95_ms", ms_json(res, row, "p95_ms"),
                            "p99_ms", ms_json(res, row, "p99_ms"));
    double per_s = round((double)delivered / (double)o->window_s * 1e6) / 1e6;
    return json_pack(
        "{s:s, s:s, s:b, s:o, s:o, s:I, s:f, s:I, s:I, s:o, s:b, s:o}", "id", e->id, "name",
        e->name ? e->name : "", "enabled", e->enabled, "disabled_reason",
        !e->enabled && e->reason && e->reason[0] ? json_string(e->reason) : json_null(), "breaker",
        breaker_json(brk), "delivered", (json_int_t)delivered, "delivered_per_s", per_s, "attempts",
        (json_int_t)sl_pg_i64(res, row, "attempts"), "failures",
        (json_int_t)sl_pg_i64(res, row, "failures"), "latency", lat, "slow", slow, "last_error",
        last);
}

static int stats_opts_parse(struct api_req *r, struct stats_opts *o)
{
    if (api_query_page(r, &o->limit, o->cur, sizeof(o->cur), &o->have_cur) != 0)
        return -1;
    if (o->have_cur && !sl_valid_endpoint_id(o->cur, strlen(o->cur))) {
        api_problem(r, 400, "invalid-parameter", "cursor", "cursor is not one this API returned");
        return -1;
    }
    if (query_int(r, "window_s", WINDOW_MIN_S, WINDOW_MAX_S, STATS_WIN_DEF, &o->window_s) != 0 ||
        query_int(r, "slow_threshold_ms", 0, SLOW_MS_MAX, SLOW_MS_DEF, &o->slow_ms) != 0 ||
        query_int(r, "slow_min_samples", 1, SLOW_MIN_MAX, SLOW_MIN_DEF, &o->slow_min) != 0)
        return -1;
    return 0;
}

/* The page: the next `limit` endpoints this key sees, after the cursor, by id, into page and
 * ids (room for limit + 1: one more than fits says there is a next page). Returns the count. */
static size_t stats_page(struct api_req *r,
                         const struct stats_opts *o,
                         const struct sl_endpoint **eps,
                         size_t neps,
                         const struct sl_endpoint **page,
                         const char **ids)
{
    size_t np = 0;
    for (size_t i = 0; i < neps && np <= (size_t)o->limit; i++) {
        if (o->have_cur && strcmp(eps[i]->id, o->cur) <= 0)
            continue;
        if (!api_key_sees(r, eps[i]->id))
            continue;
        page[np] = eps[i];
        ids[np] = eps[i]->id;
        np++;
    }
    return np;
}

/* The breakers of the page's endpoints, or NULL when Redis cannot tell (shown as unknown,
 * not a failed answer). */
static struct sl_breaker_view *stats_breakers(struct api_req *r, const char **ids, size_t np)
{
    sl_err_t err;
    sl_redis_t *rd = api_redis(r->api, &err);
    struct sl_breaker_view *brk = sl_xcalloc(np ? np : 1, sizeof(*brk));
    if (!rd || sl_breaker_read(rd, ids, np, brk, &err) != 0) {
        sl_warn("stats", "breakers_unavailable", "could not read breakers: %s", err.msg);
        free(brk);
        return NULL;
    }
    return brk;
}

/* Answer the page from SQL_STATS' rows (one per id, in the order of the array: checked). */
static void stats_answer(struct api_req *r,
                         const struct stats_opts *o,
                         PGresult *res,
                         const struct sl_endpoint **page,
                         size_t np,
                         bool more,
                         const struct sl_breaker_view *brk)
{
    json_t *data = json_array();
    for (size_t i = 0; i < np && (int)i < PQntuples(res); i++) {
        const char *id = sl_pg_str(res, (int)i, "endpoint_id");
        if (id && strcmp(id, page[i]->id) == 0)
            json_array_append_new(data, stats_item(page[i], res, (int)i, brk ? &brk[i] : NULL, o));
    }
    json_t *next = more ? api_cursor_json(r, page[np - 1]->id) : json_null();
    api_reply(r, 200,
              json_pack("{s:I, s:I, s:I, s:o, s:o}", "window_s", (json_int_t)o->window_s,
                        "slow_threshold_ms", (json_int_t)o->slow_ms, "slow_min_samples",
                        (json_int_t)o->slow_min, "data", data, "next_cursor", next));
}

enum api_hret api_endpoint_stats(struct api_req *r)
{
    struct stats_opts o;
    memset(&o, 0, sizeof(o));
    if (stats_opts_parse(r, &o) != 0)
        return API_DONE;
    const struct sl_endpoint **eps = NULL;
    size_t neps = 0;
    sl_endpoints_snapshot(r->api->eps, &eps, &neps);
    if (neps > 1)
        qsort(eps, neps, sizeof(const struct sl_endpoint *), by_id);
    const struct sl_endpoint **page =
        sl_xcalloc((size_t)o.limit + 1, sizeof(const struct sl_endpoint *));
    const char **ids = sl_xcalloc((size_t)o.limit + 1, sizeof(*ids));
    size_t np = stats_page(r, &o, eps, neps, page, ids);
    bool more = np > (size_t)o.limit;
    if (more)
        np--;
    char win[24];
    (void)snprintf(win, sizeof(win), "%" PRId64, o.window_s);
    char *arr = sl_pg_text_array(ids, np);
    const char *params[] = {arr, win};
    PGresult *res = api_history_query(r, SQL_STATS, 2, params);
    free(arr);
    if (res) {
        struct sl_breaker_view *brk = stats_breakers(r, ids, np);
        stats_answer(r, &o, res, page, np, more, brk);
        free(brk);
    }
    PQclear(res);
    free(ids);
    free(page);
    for (size_t i = 0; i < neps; i++)
        sl_endpoint_release(eps[i]);
    free(eps);
    return API_DONE;
}

/* ==== GET /v1/endpoints/{id}/latency ==== */

/* The endpoint exists and this key sees it; else answers 404 (as GET /v1/endpoints/{id}). */
static bool endpoint_visible(struct api_req *r, const char *id)
{
    const struct sl_endpoint *e =
        sl_valid_endpoint_id(id, strlen(id)) ? sl_endpoints_get(r->api->eps, id) : NULL;
    bool ok = e != NULL && api_key_sees(r, id);
    sl_endpoint_release(e);
    if (!ok)
        api_problem(r, 404, "unknown-endpoint", "id", "no endpoint has that id");
    return ok;
}

enum api_hret api_endpoint_latency(struct api_req *r)
{
    const char *id = r->params[0];
    if (!endpoint_visible(r, id))
        return API_DONE;
    int64_t window_s, bucket_s;
    if (query_int(r, "window_s", WINDOW_MIN_S, WINDOW_MAX_S, TREND_WIN_DEF, &window_s) != 0)
        return API_DONE;
    /* default: about BUCKETS_AIM buckets, whole minutes */
    int64_t def = (window_s + BUCKETS_AIM - 1) / BUCKETS_AIM;
    def = def <= 60 ? 60 : (def + 59) / 60 * 60;
    if (def > BUCKET_MAX_S)
        def = BUCKET_MAX_S;
    if (query_int(r, "bucket_s", BUCKET_MIN_S, BUCKET_MAX_S, def, &bucket_s) != 0)
        return API_DONE;
    if (window_s / bucket_s > BUCKETS_MAX)
        return api_problem(r, 400, "invalid-parameter", "bucket_s",
                           "bucket_s too small for window_s: at most %lld buckets",
                           (long long)BUCKETS_MAX);
    char win[24], bkt[24];
    (void)snprintf(win, sizeof(win), "%" PRId64, window_s);
    (void)snprintf(bkt, sizeof(bkt), "%" PRId64, bucket_s);
    const char *params[] = {id, win, bkt};
    PGresult *res = api_history_query(r, SQL_TREND, 3, params);
    if (!res)
        return API_DONE;
    int n = PQntuples(res);
    int64_t lo = n > 0 ? sl_pg_i64(res, 0, "lo_ms") : 0,
            now = n > 0 ? sl_pg_i64(res, 0, "now_ms") : 0;
    int64_t step = bucket_s * 1000;
    int64_t nb = now >= lo ? (now - lo) / step + 1 : 0;
    json_t *buckets = json_array();
    int64_t total = 0;
    int row = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t t = lo + b * step;
        while (row < n && !sl_pg_null(res, row, "t_ms") && sl_pg_i64(res, row, "t_ms") < t)
            row++; /* (cannot happen: rows start at lo) */
        bool hit = row < n && !sl_pg_null(res, row, "t_ms") && sl_pg_i64(res, row, "t_ms") == t;
        int64_t cnt = hit ? sl_pg_i64(res, row, "n") : 0;
        total += cnt;
        json_array_append_new(buckets,
                              json_pack("{s:o, s:I, s:o, s:o, s:o}", "t", api_time_json(t), "count",
                                        (json_int_t)cnt, "p50_ms",
                                        hit ? ms_json(res, row, "p50_ms") : json_null(), "p95_ms",
                                        hit ? ms_json(res, row, "p95_ms") : json_null(), "p99_ms",
                                        hit ? ms_json(res, row, "p99_ms") : json_null()));
        if (hit)
            row++;
    }
    PQclear(res);
    return api_reply(r, 200,
                     json_pack("{s:s, s:I, s:I, s:I, s:o}", "endpoint", id, "window_s",
                               (json_int_t)window_s, "bucket_s", (json_int_t)bucket_s, "samples",
                               (json_int_t)total, "buckets", buckets));
}

/* ==== GET /v1/dead-letters/patterns ==== */

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

/* One endpoint's entry from row i of SQL_PATTERNS. */
static json_t *patterns_item(const PGresult *res, int i)
{
    json_t *e = json_object();
    json_object_set_new(e, "endpoint", sl_pg_json_str(res, i, "endpoint_id"));
    static const char *const counts[] = {"dead_letters", "unreplayed", "without_payload"};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        json_object_set_new(e, counts[k], json_integer(sl_pg_i64(res, i, counts[k])));
    json_object_set_new(e, "top_error", sl_pg_json_str(res, i, "top_error"));
    json_object_set_new(e, "top_error_count", json_integer(sl_pg_i64(res, i, "top_error_count")));
    json_object_set_new(e, "top_status", sl_pg_json_int(res, i, "top_status"));
    json_object_set_new(e, "top_status_count", json_integer(sl_pg_i64(res, i, "top_status_count")));
    json_object_set_new(e, "first_dead_at", time_json(res, i, "first_ms"));
    json_object_set_new(e, "last_dead_at", time_json(res, i, "last_ms"));
    json_object_set_new(e, "first_failed_at", time_json(res, i, "first_failed_ms"));
    json_object_set_new(e, "avg_attempts",
                        json_real(round(sl_pg_f64(res, i, "avg_attempts") * 100.0) / 100.0));
    static const char *const ev[] = {"auth_count", "rate_limit_count", "cluster_count",
                                     "hours_present"};
    for (size_t k = 0; k < sizeof(ev) / sizeof(ev[0]); k++)
        json_object_set_new(e, ev[k], json_integer(sl_pg_i64(res, i, ev[k])));
    json_object_set_new(e, "cluster_start", time_json(res, i, "cluster_ms"));
    json_object_set_new(e, "patterns", patterns_of(res, i));
    return e;
}

/*
 * The cursor's position "<dead letters>:<endpoint id>" (the last entry of the previous page)
 * into n and id; -1 after answering 400.
 */
static int
patterns_cursor(struct api_req *r, const char *pos, char *n, size_t ncap, char *id, size_t idcap)
{
    const char *colon = strchr(pos, ':');
    size_t dl = colon ? (size_t)(colon - pos) : 0;
    bool ok = colon && dl >= 1 && dl < ncap && dl <= 19;
    for (size_t i = 0; ok && i < dl; i++)
        ok = pos[i] >= '0' && pos[i] <= '9';
    ok = ok && strlen(colon + 1) < idcap && sl_valid_endpoint_id(colon + 1, strlen(colon + 1));
    if (!ok) {
        api_problem(r, 400, "invalid-parameter", "cursor", "cursor is not one this API returned");
        return -1;
    }
    memcpy(n, pos, dl);
    n[dl] = '\0';
    (void)snprintf(id, idcap, "%s", colon + 1);
    return 0;
}

char *api_visible_ids(struct api_req *r)
{
    const struct sl_apikey *k = r->auth.key;
    if (!k || k->n_channels == 0)
        return NULL;
    const struct sl_endpoint **eps = NULL;
    size_t neps = 0, nv = 0;
    sl_endpoints_snapshot(r->api->eps, &eps, &neps);
    const char **ids = sl_xcalloc(neps ? neps : 1, sizeof(*ids));
    for (size_t i = 0; i < neps; i++) {
        if (sl_apikey_sees_channels(k, eps[i]->channels, eps[i]->n_channels))
            ids[nv++] = eps[i]->id;
    }
    char *arr = sl_pg_text_array(ids, nv);
    free(ids);
    for (size_t i = 0; i < neps; i++)
        sl_endpoint_release(eps[i]);
    free(eps);
    return arr;
}

enum api_hret api_dead_letter_patterns(struct api_req *r)
{
    long limit;
    char cur[SL_ENDPOINT_ID_MAX + 24];
    bool have_cur;
    if (api_query_page(r, &limit, cur, sizeof(cur), &have_cur) != 0)
        return API_DONE;
    int64_t window_s;
    if (query_int(r, "window_s", WINDOW_MIN_S, WINDOW_MAX_S, DL_WIN_DEF, &window_s) != 0)
        return API_DONE;
    const char *ep = api_query(r, "endpoint");
    if (ep && !sl_valid_endpoint_id(ep, strlen(ep)))
        return api_problem(r, 400, "invalid-parameter", "endpoint",
                           "endpoint must be 1..64 characters of A-Z a-z 0-9 _ -");
    /* an endpoint the key may not see is not there for it, as in GET /v1/dead-letters */
    if (ep && !api_key_sees(r, ep))
        return api_problem(r, 404, "unknown-endpoint", "endpoint", "no endpoint has that id");
    char cur_n[24] = "", cur_id[SL_ENDPOINT_ID_MAX + 1] = "";
    if (have_cur && patterns_cursor(r, cur, cur_n, sizeof(cur_n), cur_id, sizeof(cur_id)) != 0)
        return API_DONE;
    char win[24], lim[24];
    (void)snprintf(win, sizeof(win), "%" PRId64, window_s);
    (void)snprintf(lim, sizeof(lim), "%ld", limit + 1); /* one more says there is a next page */
    char *vis = api_visible_ids(r);
    const char *params[] = {win, ep, have_cur ? cur_n : NULL, have_cur ? cur_id : NULL, lim, vis};
    PGresult *res = api_history_query(r, SQL_PATTERNS, 6, params);
    free(vis);
    if (!res)
        return API_DONE;
    int n = PQntuples(res);
    bool more = n > limit;
    if (more)
        n = (int)limit;
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, patterns_item(res, i));
    json_t *next = json_null();
    if (more && n > 0) {
        char pos[SL_ENDPOINT_ID_MAX + 24];
        (void)snprintf(pos, sizeof(pos), "%" PRId64 ":%s", sl_pg_i64(res, n - 1, "dead_letters"),
                       sl_pg_str(res, n - 1, "endpoint_id"));
        json_decref(next);
        next = api_cursor_json(r, pos);
    }
    PQclear(res);
    return api_reply(r, 200,
                     json_pack("{s:I, s:o, s:o, s:o}", "window_s", (json_int_t)window_s, "endpoint",
                               ep ? json_string(ep) : json_null(), "data", data, "next_cursor",
                               next));
}
