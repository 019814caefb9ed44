/*
 * api_history: the delivery log, read from the recorder's PostgreSQL tables (sql/0002):
 *   GET /v1/events/{id}/deliveries   one event's deliveries and every attempt of each, by
 *                                    endpoint, cursor-paginated (a fan-out may reach 10,000)
 *   GET /v1/dead-letters             dead letters, newest first, cursor-paginated
 *   GET /v1/event-types              event types in use (subscribed or seen in 24 h)
 * The history is written asynchronously by sluice-recorder, so an event just accepted may
 * not be listed for a moment. Times are RFC 3339 UTC strings, latencies milliseconds.
 * A key limited to channels sees only endpoints that carry one of its channels.
 * Payloads are never returned (replay reads them; docs/OPERATIONS-analysis.md). A dead
 * letter's response body (the first 4 KiB the endpoint answered) goes to admin keys only:
 * it is the endpoint owner's text, as the analyst role of sql/0002 cannot read it either.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/sl_b64.h"
#include "common/sl_fault.h"
#include "common/sl_log.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_time.h"

/* Endpoint ids in the order of their bytes, as the merge of deliveries and attempts compares
 * them (strcmp), whatever the database's collation. */
#define ID_BYTES "collate \"C\""
#define TS(col)  "to_char(" col " at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* clang-format off */
static const char SQL_DELIVERIES[] =
    "select endpoint_id, event_type, state::text, attempts, " TS("created_at") ", "
    TS("first_seen") ", " TS("last_update") ", " TS("delivered_at") ", " TS("next_attempt_at") ", "
    "last_status, last_error, last_msg "
    "from deliveries where event_id = $1 and ($2::text is null or endpoint_id " ID_BYTES " > $2) "
    "order by endpoint_id " ID_BYTES " limit $3::int";
static const char SQL_ATTEMPTS[] =
    "select endpoint_id, attempt, state::text, http_status, err, msg, " TS("ts") ", "
    "latency_us, dns_us, conn_us, tls_us, ttfb_us, " TS("next_at") ", pod "
    "from delivery_attempts where event_id = $1 "
    "and ($2::text is null or endpoint_id " ID_BYTES " > $2) and endpoint_id " ID_BYTES " <= $3 "
    "order by endpoint_id " ID_BYTES ", ts, attempt";
/* $1 endpoint or NULL, $2..$4 the cursor (dead_at µs, event id, endpoint id) or NULLs,
 * $5 include resolved, $6 limit + 1, $7 the endpoints a key limited to channels sees (NULL
 * for any other key: every endpoint), so that its pages are not emptied by others' letters. The response body (last_response) goes to admin keys
 * only, and only their statement names it: PostgreSQL checks a column's privilege wherever a
 * statement mentions it, and sluice_analyst, which serves the others, may not read it. */
#define DEAD_LETTERS_SQL(resp)                                                                     \
    "select event_id, endpoint_id, event_type, error_class, last_status, last_msg, attempts, "    \
    TS("created_at") ", " TS("first_failed_at") ", " TS("dead_at") ", " TS("replayed_at") ", "     \
    "replay_count, " TS("resolved_at") ", (extract(epoch from dead_at) * 1000000)::bigint, "        \
    resp " "                                                                                       \
    "from dead_letters where ($1::text is null or endpoint_id = $1) "                              \
    "and ($5::bool or resolved_at is null) "                                                       \
    "and ($7::text[] is null or endpoint_id = any($7::text[])) "                                   \
    "and ($2::bigint is null or (dead_at, event_id, endpoint_id) < "                               \
    "(to_timestamp($2::bigint / 1000000.0), $3, $4)) "                                             \
    "order by dead_at desc, event_id desc, endpoint_id desc limit $6::int"
static const char SQL_DEAD_LETTERS[] = DEAD_LETTERS_SQL("null::bytea");
static const char SQL_DEAD_LETTERS_ADMIN[] = DEAD_LETTERS_SQL("last_response");
static const char SQL_TYPES_SEEN[] =
    "select event_type, count(*) from delivery_attempts "
    "where ts > now() - interval '24 hours' and state = 'delivered' "
    "and event_type is not null group by event_type";
/* the same over the endpoints a key limited to channels sees ($1, a text array) */
static const char SQL_TYPES_SEEN_IN[] =
    "select event_type, count(*) from delivery_attempts "
    "where ts > now() - interval '24 hours' and state = 'delivered' "
    "and event_type is not null and endpoint_id = any($1::text[]) group by event_type";
/* clang-format on */

/* NULL for SQL NULL, else a JSON string / integer / number. */
static json_t *col_str(const PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? json_null() : json_string(PQgetvalue(res, row, col));
}

static json_t *col_int(const PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? json_null()
                                      : json_integer(strtoll(PQgetvalue(res, row, col), NULL, 10));
}

static json_t *col_ms(const PGresult *res, int row, int col)
{
    /* µs -> ms with three decimals */
    return PQgetisnull(res, row, col)
               ? json_null()
               : json_real((double)strtoll(PQgetvalue(res, row, col), NULL, 10) / 1000.0);
}

static PGresult *unreachable(struct api_req *r)
{
    r->retry_after_s = 2;
    api_problem(r, 503, "history-unavailable", NULL,
                "the delivery history (PostgreSQL) is unreachable");
    return NULL;
}

PGresult *api_history_query(struct api_req *r, const char *sql, int n, const char *const *params)
{
    sl_err_t err;
    PGconn *pg = api_pg(r->api, &err);
    if (!pg)
        return unreachable(r);
    if (sl_fault_is("history_slow")) /* a slow query (3 s): it must hold no HTTP loop */
        sl_sleep_ms(sl_fault_delay_ms(3000));
    PGresult *res = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK && PQstatus(pg) != CONNECTION_OK) {
        /* the connection had died since its last use (PostgreSQL restarted, the backend was
         * ended): a read is safe to repeat, once, on a new one */
        PQclear(res);
        res = NULL;
        api_pg_reset();
        pg = api_pg(r->api, &err);
        if (pg)
            res = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
    }
    if (!pg)
        return unreachable(r);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        char why[512];
        sl_warn("history", "query_failed", "history query failed: %s",
                sl_pg_reason(res, pg, why, sizeof(why)));
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (state && strcmp(state, "42501") == 0) {
            /* not passing: this instance's role lacks a grant, and a client retrying after
             * a 503 would wait forever */
            PQclear(res);
            api_problem(r, 500, "internal", NULL,
                        "this sluice-api's database role may not read what this asks for "
                        "(the delivery log needs sluice_analyst; response bodies, for admin "
                        "keys, the registry owner's role: docs/OPERATIONS.md)");
            return NULL;
        }
        PQclear(res);
        api_pg_reset();
        r->retry_after_s = 2;
        api_problem(r, 503, "history-unavailable", NULL, "the delivery history query failed");
        return NULL;
    }
    return res;
}

enum api_hret api_event_deliveries(struct api_req *r)
{
    const char *id = r->params[0];
    if (!sl_valid_event_id(id, strlen(id)))
        return api_problem(r, 400, "invalid-parameter", "id",
                           "event id must be 1..128 visible ASCII characters other than '.'");
    long limit;
    char cur[SL_ENDPOINT_ID_MAX + 2];
    bool have;
    if (api_query_page(r, &limit, cur, sizeof(cur), &have) != 0)
        return API_DONE;
    char lim[24];
    (void)snprintf(lim, sizeof(lim), "%ld", limit + 1);
    const char *p[] = {id, have ? cur : NULL, lim};
    PGresult *d = api_history_query(r, SQL_DELIVERIES, 3, p);
    if (!d)
        return API_DONE;
    int nd = PQntuples(d) > limit ? (int)limit : PQntuples(d);
    /* the attempts of this page's endpoints only: (cursor, last endpoint of the page] */
    const char *pa[] = {id, have ? cur : NULL, nd > 0 ? PQgetvalue(d, nd - 1, 0) : ""};
    PGresult *at = api_history_query(r, SQL_ATTEMPTS, 3, pa);
    if (!at) {
        PQclear(d);
        return API_DONE;
    }
    json_t *next =
        PQntuples(d) > limit ? api_cursor_json(r, PQgetvalue(d, nd - 1, 0)) : json_null();
    json_t *data = json_array();
    int na = PQntuples(at), k = 0;
    for (int i = 0; i < nd; i++) {
        const char *ep = PQgetvalue(d, i, 0);
        json_t *hist = json_array();
        while (k < na && strcmp(PQgetvalue(at, k, 0), ep) < 0)
            k++;
        for (; k < na && strcmp(PQgetvalue(at, k, 0), ep) == 0; k++) {
            json_t *ph = json_pack("{s:o, s:o, s:o, s:o}", "dns_ms", col_ms(at, k, 8), "connect_ms",
                                   col_ms(at, k, 9), "tls_ms", col_ms(at, k, 10), "first_byte_ms",
                                   col_ms(at, k, 11));
            json_array_append_new(
                hist, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "attempt",
                                col_int(at, k, 1), "state", col_str(at, k, 2), "http_status",
                                col_int(at, k, 3), "error", col_str(at, k, 4), "message",
                                col_str(at, k, 5), "at", col_str(at, k, 6), "latency_ms",
                                col_ms(at, k, 7), "phases", ph, "next_attempt_at",
                                col_str(at, k, 12), "pod", col_str(at, k, 13)));
        }
        if (!api_key_sees(r, ep)) {
            json_decref(hist);
            continue;
        }
        json_array_append_new(
            data, json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
                            "endpoint", ep, "type", col_str(d, i, 1), "state", col_str(d, i, 2),
                            "attempts", col_int(d, i, 3), "created_at", col_str(d, i, 4),
                            "first_seen", col_str(d, i, 5), "last_update", col_str(d, i, 6),
                            "delivered_at", col_str(d, i, 7), "next_attempt_at", col_str(d, i, 8),
                            "last_status", col_int(d, i, 9), "last_error", col_str(d, i, 10),
                            "last_message", col_str(d, i, 11), "attempts_log", hist));
    }
    PQclear(d);
    PQclear(at);
    return api_reply(
        r, 200, json_pack("{s:s, s:o, s:o}", "event_id", id, "data", data, "next_cursor", next));
}

/* A bytea column (text format) as last_response (its bytes when they are UTF-8) or
 * last_response_base64 (otherwise); the other, and both for NULL, JSON null. */
static void response_json(const PGresult *res, int row, int col, json_t **text, json_t **b64)
{
    *text = json_null();
    *b64 = json_null();
    if (PQgetisnull(res, row, col))
        return;
    size_t n = 0;
    unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, row, col), &n);
    if (!raw)
        return;
    json_t *t = json_stringn((const char *)raw, n); /* NULL unless valid UTF-8 */
    if (t) {
        json_decref(*text);
        *text = t;
    } else {
        size_t cap = SL_B64_ENCODED_LEN(n) + 1;
        char *enc = sl_xmalloc(cap);
        long len = sl_b64_encode(raw, n, enc, cap);
        if (len >= 0) {
            json_decref(*b64);
            *b64 = json_stringn(enc, (size_t)len);
        }
        free(enc);
    }
    PQfreemem(raw);
}

/* For a key limited to channels, keep (in place) the endpoints sharing one of its channels and
 * release the others; returns how many are kept. */
static size_t keep_visible(struct api_req *r, const struct sl_endpoint **eps, size_t n)
{
    const struct sl_apikey *key = r->auth.key;
    if (!key || key->n_channels == 0)
        return n;
    size_t kept = 0;
    for (size_t e = 0; e < n; e++) {
        if (sl_apikey_sees_channels(key, eps[e]->channels, eps[e]->n_channels))
            eps[kept++] = eps[e];
        else
            sl_endpoint_release(eps[e]);
    }
    return kept;
}

enum api_hret api_dead_letters_list(struct api_req *r)
{
    long limit;
    char cur[400];
    bool have;
    if (api_query_page(r, &limit, cur, sizeof(cur), &have) != 0)
        return API_DONE;
    const char *ep = api_query(r, "endpoint");
    if (ep && !sl_valid_endpoint_id(ep, strlen(ep)))
        return api_problem(r, 400, "invalid-parameter", "endpoint",
                           "endpoint must be 1..64 characters of A-Z a-z 0-9 _ -");
    /* an endpoint the key may not see is not there for it (not even whether it has letters) */
    if (ep && !api_key_sees(r, ep))
        return api_problem(r, 404, "unknown-endpoint", "endpoint", "no endpoint has that id");
    const char *inc = api_query(r, "include_resolved");
    if (inc && strcmp(inc, "true") != 0 && strcmp(inc, "false") != 0)
        return api_problem(r, 400, "invalid-parameter", "include_resolved",
                           "include_resolved must be true or false");
    /* cursor: "<dead_at µs since epoch> <event id> <endpoint id>" (ids have no spaces) */
    char cts[32] = "", cev[SL_EVENT_ID_MAX + 1] = "", cep[SL_ENDPOINT_ID_MAX + 1] = "";
    char *tend = NULL;
    if (have && (sscanf(cur, "%31s %128s %64s", cts, cev, cep) != 3 ||
                 (strtoll(cts, &tend, 10), *tend != '\0') || cts[0] == '-' || strlen(cts) > 18 ||
                 !sl_valid_event_id(cev, strlen(cev)) || !sl_valid_endpoint_id(cep, strlen(cep))))
        return api_problem(r, 400, "invalid-parameter", "cursor",
                           "cursor is not one this API returned");
    char lim[24];
    (void)snprintf(lim, sizeof(lim), "%ld", limit + 1);
    char *seen = ep ? NULL : api_visible_ids(r);
    const char *p[] = {ep,
                       have ? cts : NULL,
                       have ? cev : NULL,
                       have ? cep : NULL,
                       inc && strcmp(inc, "true") == 0 ? "t" : "f",
                       lim,
                       seen};
    PGresult *res = api_history_query(
        r,
        sl_apikey_allows(r->auth.key, SL_SCOPE_ADMIN) ? SQL_DEAD_LETTERS_ADMIN : SQL_DEAD_LETTERS,
        7, p);
    free(seen);
    if (!res)
        return API_DONE;
    json_t *data = json_array();
    int n = PQntuples(res);
    json_t *next = json_null();
    for (int i = 0; i < n && i < limit; i++) {
        if (i == limit - 1 && n > limit) {
            char pos[400];
            (void)snprintf(pos, sizeof(pos), "%s %s %s", PQgetvalue(res, i, 13),
                           PQgetvalue(res, i, 0), PQgetvalue(res, i, 1));
            json_decref(next);
            next = api_cursor_json(r, pos);
        }
        if (!api_key_sees(r, PQgetvalue(res, i, 1)))
            continue;
        json_t *text = NULL, *b64 = NULL;
        response_json(res, i, 14, &text, &b64);
        json_array_append_new(
            data, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, "
                            "s:o, s:o}",
                            "last_response", text, "last_response_base64", b64, "event_id",
                            col_str(res, i, 0), "endpoint", col_str(res, i, 1), "type",
                            col_str(res, i, 2), "error", col_str(res, i, 3), "last_status",
                            col_int(res, i, 4), "last_message", col_str(res, i, 5), "attempts",
                            col_int(res, i, 6), "created_at", col_str(res, i, 7), "first_failed_at",
                            col_str(res, i, 8), "dead_at", col_str(res, i, 9), "replayed_at",
                            col_str(res, i, 10), "replay_count", col_int(res, i, 11), "resolved_at",
                            col_str(res, i, 12)));
    }
    PQclear(res);
    return api_reply(r, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Event types delivered in 24 h with their counts: all of them, or for a key limited to
 * channels only those of the endpoints it sees (eps). NULL after answering 503. */
static PGresult *types_seen(struct api_req *r, const struct sl_endpoint **eps, size_t n)
{
    if (!r->auth.key || r->auth.key->n_channels == 0)
        return api_history_query(r, SQL_TYPES_SEEN, 0, NULL);
    const char **ids = sl_xcalloc(n ? n : 1, sizeof(*ids));
    for (size_t e = 0; e < n; e++)
        ids[e] = eps[e]->id;
    char *arr = sl_pg_text_array(ids, n);
    const char *params[] = {arr};
    PGresult *res = api_history_query(r, SQL_TYPES_SEEN_IN, 1, params);
    free(arr);
    free(ids);
    return res;
}

enum api_hret api_event_types(struct api_req *r)
{
    long limit;
    char cur[SL_EVENT_TYPE_MAX + 2];
    bool have;
    if (api_query_page(r, &limit, cur, sizeof(cur), &have) != 0)
        return API_DONE;
    const struct sl_endpoint **eps = NULL;
    size_t neps = 0;
    sl_endpoints_snapshot(r->api->eps, &eps, &neps);
    neps = keep_visible(r, eps, neps);
    PGresult *res = types_seen(r, eps, neps);
    if (!res) {
        for (size_t e = 0; e < neps; e++)
            sl_endpoint_release(eps[e]);
        free(eps);
        return API_DONE;
    }
    /* the names: types seen in 24 h plus exact names in endpoints' filters */
    sl_map_t *seen = sl_map_new(64);
    for (int i = 0; i < PQntuples(res); i++)
        sl_map_put(seen, PQgetvalue(res, i, 0), (void *)(intptr_t)(i + 1), NULL);
    for (size_t e = 0; e < neps; e++) {
        for (size_t t = 0; t < eps[e]->n_types; t++) {
            const char *f = eps[e]->types[t];
            if (!strchr(f, '*') && !sl_map_get(seen, f))
                sl_map_put(seen, f, (void *)(intptr_t)-1, NULL);
        }
    }
    size_t nt = sl_map_count(seen), k = 0, pos = 0;
    const char **names = sl_xcalloc(nt ? nt : 1, sizeof(*names));
    const char *key;
    void *val;
    while (sl_map_next(seen, &pos, &key, &val))
        names[k++] = key;
    qsort(names, nt, sizeof(*names), cmp_str);
    json_t *data = json_array();
    json_t *next = json_null();
    long out = 0;
    for (size_t i = 0; i < nt; i++) {
        if (have && strcmp(names[i], cur) <= 0)
            continue;
        if (out == limit) {
            json_decref(next);
            next = api_cursor_json(r, names[i - 1]);
            break;
        }
        intptr_t row = (intptr_t)sl_map_get(seen, names[i]);
        size_t subs = 0;
        for (size_t e = 0; e < neps; e++) {
            /* the endpoint's own channels satisfy its channel rule: count the type filters
             * (none takes every type) */
            if (eps[e]->enabled &&
                sl_endpoint_subscribed(eps[e], names[i], strlen(names[i]),
                                       (const char *const *)eps[e]->channels, eps[e]->n_channels))
                subs++;
        }
        json_array_append_new(data,
                              json_pack("{s:s, s:I, s:o}", "type", names[i], "subscribed_endpoints",
                                        (json_int_t)subs, "delivered_24h",
                                        row > 0 ? col_int(res, (int)row - 1, 1) : json_integer(0)));
        out++;
    }
    free(names);
    for (size_t e = 0; e < neps; e++)
        sl_endpoint_release(eps[e]);
    free(eps);
    sl_map_destroy(seen, NULL);
    PQclear(res);
    return api_reply(r, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}
