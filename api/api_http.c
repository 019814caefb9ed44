/*
 * api_http: sluice-api's HTTP server on libmicrohttpd (see api.h for a request's life).
 *
 * api_threads HTTP loop threads ("api-http"), each running a libmicrohttpd daemon on one
 * shared listening socket (common/sl_httpd: our loops, not libmicrohttpd's internal threads,
 * whose loop stalls with exactly 128 connections ready). Each loop beats the liveness probe.
 *
 * A connection past api_max_connections waits (not accepted) until one closes; one idle or
 * stalled for api_idle_timeout_s is closed, and so is one that has not sent a whole request
 * within api_request_timeout_s of opening or of its previous answer (a client trickling
 * bytes): slow clients cannot hold the connection slots. A handler must never wait
 * for Kafka on a loop thread: publishes suspend the connection (MHD_suspend_connection) and
 * the producer's report thread resumes it.
 *
 * Routing is a table of method + pattern; a known path with another method answers 405 with
 * Allow. Every error answer is application/problem+json (RFC 9457).
 *
 * Shutdown: each loop quiesces its daemon (stops accepting), then in-flight requests get up
 * to api_shutdown_ms to complete (api->active counts them); then the loops end and the
 * daemons stop.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "api/api.h"
#include "common/sl_digest.h"
#include "common/sl_hex.h"
#include "common/sl_httpd.h"
#include "common/sl_log.h"
#include "common/sl_probe.h"
#include "common/sl_secretbox.h"
#include "common/sl_time.h"

/* Per-connection memory of libmicrohttpd (request line, headers, read and write buffers;
 * bodies stream to the handler). It zeroes the whole pool between requests, so its default
 * of 32 KiB costs a 32 KiB memset per request; 16 KiB holds any sane header set (a request
 * whose headers do not fit is answered 431 by libmicrohttpd). */
#define API_CONN_MEMORY ((size_t)16 * 1024)

/* Publish requests up to this size have their envelope (sl_json_elide_bodies) built on the
 * loop thread's stack instead of the heap: a single event with its body is a few KiB at most. */
#define API_ENVELOPE_STACK (8 * 1024)

struct api_server {
    struct api *api;
    sl_httpd_t *h;
};

/* ==== per-thread connections ==== */

static pthread_key_t redis_key, pg_key;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void redis_dtor(void *p)
{
    sl_redis_close(p);
}

static void pg_dtor(void *p)
{
    PQfinish(p);
}

static void make_keys(void)
{
    (void)pthread_key_create(&redis_key, redis_dtor);
    (void)pthread_key_create(&pg_key, pg_dtor);
}

sl_redis_t *api_redis(struct api *a, sl_err_t *err)
{
    pthread_once(&keys_once, make_keys);
    sl_redis_t *r = pthread_getspecific(redis_key);
    if (r)
        return r;
    r = sl_redis_connect(a->cfg->redis_url, (int)a->cfg->redis_timeout_ms, err);
    if (r)
        (void)pthread_setspecific(redis_key, r);
    return r;
}

PGconn *api_pg(struct api *a, sl_err_t *err)
{
    pthread_once(&keys_once, make_keys);
    PGconn *pg = pthread_getspecific(pg_key);
    if (pg && PQstatus(pg) == CONNECTION_OK)
        return pg;
    if (pg) {
        PQfinish(pg);
        (void)pthread_setspecific(pg_key, NULL);
    }
    pg = sl_reg_db_open(a->cfg, err);
    if (pg)
        (void)pthread_setspecific(pg_key, pg);
    return pg;
}

void api_pg_reset(void)
{
    pthread_once(&keys_once, make_keys);
    PGconn *pg = pthread_getspecific(pg_key);
    if (pg) {
        PQfinish(pg);
        (void)pthread_setspecific(pg_key, NULL);
    }
}

/* ==== replies ==== */

enum api_hret api_reply(struct api_req *r, int status, json_t *j)
{
    json_decref(r->json);
    free(r->text);
    r->text = NULL;
    r->status = status;
    r->json = j;
    r->problem = false;
    if (!j && status != 204) {
        /* every answer but 204 has a body: a NULL here is a json_pack that failed (a bug) */
        sl_error("http", "answer_not_built", "the answer of route %s could not be built",
                 r->route ? r->route->name : "-");
        r->status = 500;
        r->json = api_problem_json(500, "internal", NULL, "the answer could not be built");
        r->problem = true;
    }
    return API_DONE;
}

enum api_hret api_reply_text(struct api_req *r, int status, char *text)
{
    json_decref(r->json);
    free(r->text);
    r->json = NULL;
    r->text = text;
    r->status = status;
    r->problem = false;
    return API_DONE;
}

static const char *status_title(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    default:
        return "Error";
    }
}

static json_t *
problem_v(int status, const char *slug, const char *field, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

static json_t *
problem_v(int status, const char *slug, const char *field, const char *fmt, va_list ap)
{
    char detail[512], type[96];
    (void)vsnprintf(detail, sizeof(detail), fmt, ap);
    (void)snprintf(type, sizeof(type), "urn:sluice:problem:%s", slug);
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "title", json_string(status_title(status)));
    json_object_set_new(j, "status", json_integer(status));
    /* detail may hold bytes that are not UTF-8 (a field name from the input is never printed
     * unless printable ASCII, but be safe): fall back to a fixed text */
    json_t *d = json_string(detail);
    json_object_set_new(j, "detail", d ? d : json_string("(detail not printable)"));
    if (field) {
        json_t *f = json_string(field);
        if (f)
            json_object_set_new(j, "field", f);
    }
    return j;
}

json_t *api_problem_json(int status, const char *slug, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_t *j = problem_v(status, slug, field, fmt, ap);
    va_end(ap);
    return j;
}

enum api_hret api_problem(
    struct api_req *r, int status, const char *slug, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_t *j = problem_v(status, slug, field, fmt, ap);
    va_end(ap);
    api_reply(r, status, j);
    r->problem = true;
    return API_DONE;
}

json_t *api_problem_from_err(const sl_err_t *err, const char *prefix)
{
    /* the codec's and sl_jsonl's messages name the field first as: field "x" (or fields "x") */
    char field[160] = "";
    const char *q = strchr(err->msg, '"');
    const char *e = q ? strchr(q + 1, '"') : NULL;
    if (q && e && e - q - 1 < 64 && (q - err->msg < 16))
        (void)snprintf(field, sizeof(field), "%s/%.*s", prefix, (int)(e - q - 1), q + 1);
    else
        (void)snprintf(field, sizeof(field), "%s", prefix[0] ? prefix : "/");
    int status = 400;
    const char *slug = "invalid-field";
    if (err->code == SL_EMISSING)
        slug = "missing-field";
    else if (err->code == SL_ETOOBIG)
        slug = "too-large";
    return api_problem_json(status, slug, field, "%s", err->msg);
}

const char *api_header(struct api_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *api_query(struct api_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* Whether a Content-Type names application/json: the media type (any case), then nothing or
 * parameters ("; charset=utf-8"). */
static bool is_json_type(const char *ct)
{
    static const char want[] = "application/json";
    size_t n = sizeof(want) - 1;
    if (strncasecmp(ct, want, n) != 0)
        return false;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

static json_t *body_json(struct api_req *r, const enum sl_json_shape *shape, bool *elided)
{
    json_error_t jerr;
    const char *ct = api_header(r, "Content-Type");
    if (ct && !is_json_type(ct)) {
        api_problem(r, 415, "unsupported-media-type", "Content-Type",
                    "the request body must be application/json");
        return NULL;
    }
    if (r->body.len == 0) {
        api_problem(r, 400, "invalid-json", "/",
                    "the request body is empty: a JSON object is "
                    "expected");
        return NULL;
    }
    if (shape) {
        /* the events' bodies are sent as they stand in the text: do not build their trees.
         * The envelope is never longer than the request; an ordinary one fits on the stack. */
        char stack_env[API_ENVELOPE_STACK];
        char *env = r->body.len <= sizeof(stack_env) ? stack_env : sl_xmalloc(r->body.len);
        size_t env_len;
        json_t *j = NULL;
        if (sl_json_elide_bodies((const char *)r->body.data, r->body.len, *shape, env, &env_len) ==
            0)
            j = json_loadb(env, env_len, JSON_REJECT_DUPLICATES, &jerr);
        if (env != stack_env)
            free(env);
        if (j && json_is_object(j)) {
            if (elided)
                *elided = true;
            return j;
        }
        json_decref(j); /* not expected: the full parse below decides */
    }
    /* an event's string body may hold \u0000 (its bytes are sent as they are), as in
     * sluice-produce's lines; the events' other strings refuse it by name (sl_jsonl). The
     * other requests' strings are read as C strings: \u0000 is invalid JSON there. */
    size_t flags = JSON_REJECT_DUPLICATES | (shape ? JSON_ALLOW_NUL : 0);
    json_t *j = json_loadb((const char *)r->body.data, r->body.len, flags, &jerr);
    if (!j) {
        /* jansson's text quotes the input: report the position, and the kind when it is
         * one a client can act on */
        api_problem(r, 400, "invalid-json", "/",
                    "the request body is not valid JSON (%s at byte %d, line %d)",
                    sl_json_error_words(json_error_code(&jerr)), jerr.position, jerr.line);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        api_problem(r, 400, "invalid-json", "/", "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

json_t *api_body_json(struct api_req *r)
{
    return body_json(r, NULL, NULL);
}

json_t *api_body_json_events(struct api_req *r, enum sl_json_shape shape, bool *elided)
{
    if (elided)
        *elided = false;
    return body_json(r, &shape, elided);
}

/* ?limit=: 1..API_LIMIT_MAX (default API_LIMIT_DEFAULT); -1 after answering 400. */
static long query_limit(struct api_req *r)
{
    const char *s = api_query(r, "limit");
    if (!s)
        return API_LIMIT_DEFAULT;
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1 || v > API_LIMIT_MAX) {
        api_problem(r, 400, "invalid-parameter", "limit", "limit must be an integer 1..%d",
                    API_LIMIT_MAX);
        return -1;
    }
    return v;
}

/*
 * Cursors are the hex of a position text sealed with the master key (sl_secretbox): opaque,
 * so a key limited to channels learns nothing from a cursor made after a row it may not see
 * (its id, an event's dead_at), and a forged one is refused. The associated data binds a
 * cursor to its list and filters (cursor_ad): the request's path and its query parameters
 * other than cursor and limit, so one list's cursor, or one made under other filters, is a
 * 400 rather than a page of something else. Every sluice-api behind one load balancer has
 * the same master key, so any of them opens a cursor another made; one sealed with a key
 * since removed from master_key is a 400.
 */
#define CURSOR_AD      "sluice-api cursor "
#define CURSOR_POS_MAX 512 /* bytes of a position text */
#define CURSOR_BOX_MAX (CURSOR_POS_MAX + SL_SECRETBOX_OVERHEAD)
#define CURSOR_ARGS    32 /* query parameters bound (a list takes a few) */
#define CURSOR_AD_MAX  (sizeof(CURSOR_AD) + 2 * (size_t)SL_DIGEST_MAX) /* with the hash's hex */

struct query_args {
    const char *kv[CURSOR_ARGS][2];
    size_t n;
    bool over; /* more than CURSOR_ARGS */
};

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    struct query_args *a = cls;
    if (strcmp(k, "cursor") == 0 || strcmp(k, "limit") == 0)
        return MHD_YES;
    if (a->n == CURSOR_ARGS) {
        a->over = true;
        return MHD_NO;
    }
    a->kv[a->n][0] = k;
    a->kv[a->n][1] = v ? v : "";
    a->n++;
    return MHD_YES;
}

static int cmp_arg(const void *x, const void *y)
{
    const char *const *a = x, *const *b = y;
    int c = strcmp(a[0], b[0]);
    return c ? c : strcmp(a[1], b[1]);
}

/* CURSOR_AD + hex SHA-256 of the path and the sorted filters ("\n" + name "=" value each):
 * what a cursor is for. Returns false when it cannot be made. */
static bool cursor_ad(struct api_req *r, char out[CURSOR_AD_MAX])
{
    struct query_args a = {.n = 0};
    (void)MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, collect_arg, &a);
    if (a.over)
        return false;
    qsort(a.kv, a.n, sizeof(a.kv[0]), cmp_arg);
    const void *parts[1 + 4 * CURSOR_ARGS];
    size_t lens[1 + 4 * CURSOR_ARGS], np = 0;
    parts[np] = r->url;
    lens[np++] = strlen(r->url);
    for (size_t i = 0; i < a.n; i++) {
        parts[np] = "\n";
        lens[np++] = 1;
        parts[np] = a.kv[i][0];
        lens[np++] = strlen(a.kv[i][0]) + 1; /* with its NUL: name and value kept apart */
        parts[np] = a.kv[i][1];
        lens[np++] = strlen(a.kv[i][1]);
    }
    uint8_t md[SL_DIGEST_MAX];
    if (sl_digest_parts(SL_SHA256, parts, lens, np, md) != 0)
        return false;
    memcpy(out, CURSOR_AD, sizeof(CURSOR_AD) - 1);
    sl_hex_encode(md, 32, out + sizeof(CURSOR_AD) - 1);
    return true;
}

/* Decode ?cursor= into buf (NUL-terminated) or answer 400. */
static int query_cursor(struct api_req *r, char *buf, size_t cap, bool *have)
{
    const char *c = api_query(r, "cursor");
    *have = false;
    if (!c)
        return 0;
    size_t n = strlen(c);
    uint8_t box[CURSOR_BOX_MAX];
    bool ok = n % 2 == 0 && n > 0 && n / 2 <= sizeof(box);
    for (size_t i = 0; ok && i < n / 2; i++) {
        int hi = sl_hex_digit_lower((unsigned char)c[2 * i]);
        int lo = sl_hex_digit_lower((unsigned char)c[2 * i + 1]);
        ok = hi >= 0 && lo >= 0;
        box[i] = (uint8_t)(hi * 16 + lo);
    }
    size_t len = 0;
    sl_err_t err;
    char ad[CURSOR_AD_MAX];
    if (ok)
        ok = cap > 0 && cursor_ad(r, ad) &&
             sl_secretbox_open(&r->api->mk, ad, box, n / 2, (uint8_t *)buf, cap - 1, &len, &err) ==
                 0;
    for (size_t i = 0; ok && i < len; i++)
        ok = buf[i] >= 0x20 && buf[i] < 0x7f;
    if (!ok) {
        api_problem(r, 400, "invalid-parameter", "cursor",
                    "cursor is not one this API returned for this list with these filters");
        return -1;
    }
    buf[len] = '\0';
    *have = true;
    return 0;
}

int api_query_page(struct api_req *r, long *limit, char *cur, size_t cap, bool *have)
{
    *have = false;
    *limit = query_limit(r);
    if (*limit < 0)
        return -1;
    return query_cursor(r, cur, cap, have);
}

json_t *api_time_json(int64_t ms)
{
    if (ms <= 0)
        return json_null();
    char buf[40];
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    (void)snprintf(buf + n, sizeof(buf) - n, ".%03dZ", (int)(ms % 1000));
    return json_string(buf);
}

json_t *api_cursor_json(struct api_req *r, const char *pos)
{
    uint8_t box[CURSOR_BOX_MAX];
    char out[2 * CURSOR_BOX_MAX + 1];
    size_t n = strlen(pos), boxlen = 0;
    sl_err_t err;
    char ad[CURSOR_AD_MAX];
    if (n > CURSOR_POS_MAX || !cursor_ad(r, ad) ||
        sl_secretbox_seal(&r->api->mk, ad, (const uint8_t *)pos, n, box, sizeof(box), &boxlen,
                          &err) != 0) {
        sl_error("http", "cursor_failed",
                 "could not make a page cursor: the page says no next one");
        return json_null();
    }
    sl_hex_encode(box, boxlen, out);
    return json_string(out);
}

/* May the caller's key see endpoint id? (keys limited to channels) */
bool api_key_sees(struct api_req *r, const char *id)
{
    const struct sl_apikey *k = r->auth.key;
    if (!k || k->n_channels == 0)
        return true;
    const struct sl_endpoint *e = sl_endpoints_get(r->api->eps, id);
    bool ok = e && sl_apikey_sees_channels(k, e->channels, e->n_channels);
    sl_endpoint_release(e);
    return ok;
}

bool api_key_may_assign(struct api_req *r, char *const *channels, size_t n)
{
    const struct sl_apikey *k = r->auth.key;
    if (!k || k->n_channels == 0)
        return true;
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!sl_apikey_channel_allowed(k, channels[i]))
            return false;
    }
    return true;
}

void api_req_resume(struct api_req *r)
{
    /* r may be answered and freed by its loop as soon as the resume lands: read first */
    struct MHD_Connection *conn = r->conn;
    sl_httpd_loop_t *l = r->loop;
    atomic_store(&r->resumed, true);
    sl_httpd_resume(l, conn);
}

/* ==== routes ==== */

static enum api_hret healthz(struct api_req *r)
{
    return api_reply(r, 200, json_pack("{s:s}", "status", "ok"));
}

static enum api_hret readyz(struct api_req *r)
{
    struct api *a = r->api;
    bool stopping = atomic_load(&a->stopping);
    bool keys = api_keys_loaded(a->keys);
    bool fatal = sluice_producer_fatal(a->prod, NULL) != 0;
    bool ok = !stopping && keys && !fatal;
    json_t *j = json_pack("{s:s, s:b, s:b, s:b, s:I}", "status", ok ? "ready" : "not_ready",
                          "stopping", stopping, "api_keys_loaded", keys, "producer_ok", !fatal,
                          "endpoints", (json_int_t)sl_endpoints_count(a->eps));
    return api_reply(r, ok ? 200 : 503, j);
}

static const struct api_route routes[] = {
    {"GET", "/healthz", 0, healthz, "healthz", false},
    {"GET", "/readyz", 0, readyz, "readyz", false},
    {"POST", "/v1/events", SL_SCOPE_PUBLISH, api_events_publish, "events.publish", false},
    {"POST", "/v1/events/batch", SL_SCOPE_PUBLISH, api_events_publish_batch, "events.batch", false},
    {"GET", "/v1/events/{}/deliveries", SL_SCOPE_READ, api_event_deliveries, "events.deliveries",
     true},
    {"GET", "/v1/event-types", SL_SCOPE_READ, api_event_types, "event_types.list", true},
    {"GET", "/v1/endpoints", SL_SCOPE_READ, api_endpoints_list, "endpoints.list", false},
    {"POST", "/v1/endpoints", SL_SCOPE_ADMIN, api_endpoints_create, "endpoints.create", false},
    {"GET", "/v1/endpoints/{}", SL_SCOPE_READ, api_endpoints_get, "endpoints.get", false},
    {"PATCH", "/v1/endpoints/{}", SL_SCOPE_ADMIN, api_endpoints_patch, "endpoints.update", false},
    {"DELETE", "/v1/endpoints/{}", SL_SCOPE_ADMIN, api_endpoints_delete, "endpoints.delete", false},
    {"POST", "/v1/endpoints/{}/enable", SL_SCOPE_ADMIN, api_endpoints_enable, "endpoints.enable",
     false},
    {"POST", "/v1/endpoints/{}/disable", SL_SCOPE_ADMIN, api_endpoints_disable, "endpoints.disable",
     false},
    {"POST", "/v1/endpoints/{}/test", SL_SCOPE_PUBLISH, api_endpoints_test, "endpoints.test",
     false},
    {"POST", "/v1/endpoints/{}/rotate-secret", SL_SCOPE_ADMIN, api_endpoints_rotate,
     "endpoints.rotate_secret", false},
    {"GET", "/v1/dead-letters", SL_SCOPE_READ, api_dead_letters_list, "dead_letters.list", true},
    {"POST", "/v1/dead-letters/replay", SL_SCOPE_ADMIN, api_dead_letters_replay,
     "dead_letters.replay", false},
    {"GET", "/v1/dead-letters/patterns", SL_SCOPE_READ, api_dead_letter_patterns,
     "dead_letters.patterns", true},
    {"GET", "/v1/endpoint-stats", SL_SCOPE_READ, api_endpoint_stats, "endpoints.stats", true},
    {"GET", "/v1/endpoints/{}/latency", SL_SCOPE_READ, api_endpoint_latency, "endpoints.latency",
     true},
    {"GET", "/console", 0, api_console_get, "console", false},
    {"GET", "/console/{*}", 0, api_console_get, "console", false},
};
#define NROUTES (sizeof(routes) / sizeof(routes[0]))

/* Match path against pattern; parameter segments are copied into params (owned). */
static bool match(const char *pattern, const char *path, char *params[API_MAX_PARAMS])
{
    int np = 0;
    const char *p = pattern, *u = path;
    while (*p && *u) {
        if (strcmp(p, "{*}") == 0) { /* the rest of the path, slashes included */
            if (np >= API_MAX_PARAMS)
                goto no;
            params[np++] = sl_xstrdup(u);
            return true;
        }
        if (p[0] == '{' && p[1] == '}') {
            const char *end = strchr(u, '/');
            size_t len = end ? (size_t)(end - u) : strlen(u);
            if (len == 0 || np >= API_MAX_PARAMS)
                goto no;
            params[np++] = sl_xstrndup(u, len);
            u += len;
            p += 2;
            continue;
        }
        if (*p != *u)
            goto no;
        p++;
        u++;
    }
    if (*p == '\0' && *u == '\0')
        return true;
    if (*u == '\0' && strcmp(p, "{*}") == 0 && np < API_MAX_PARAMS) {
        params[np++] = sl_xstrdup(""); /* an empty rest: "/console/" */
        return true;
    }
no:
    for (int i = 0; i < np; i++) {
        free(params[i]);
        params[i] = NULL;
    }
    return false;
}

/* Find the route; 0 ok, 404 unknown path, 405 known path with another method. */
static int route(struct api_req *r)
{
    bool path_known = false;
    r->allow[0] = '\0';
    for (size_t i = 0; i < NROUTES; i++) {
        char *params[API_MAX_PARAMS] = {NULL};
        if (!match(routes[i].pattern, r->url, params))
            continue;
        if (strcmp(routes[i].method, r->method) == 0) {
            memcpy(r->params, params, sizeof(params));
            r->route = &routes[i];
            return 0;
        }
        for (int k = 0; k < API_MAX_PARAMS; k++)
            free(params[k]);
        path_known = true;
        size_t n = strlen(r->allow);
        (void)snprintf(r->allow + n, sizeof(r->allow) - n, "%s%s", n ? ", " : "", routes[i].method);
    }
    return path_known ? 405 : 404;
}

/* A 5xx answer's warning: one line a second at most (a dependency down fails them all). */
static void log_server_error(const struct api_req *r)
{
    SL_LOGKV_EVERY(1000, SL_LOG_WARN, "http", "request_failed",
                   ((struct sl_log_kv[]){SL_KV_S("route", r->route ? r->route->name : "-"),
                                         SL_KV_I("status", r->status)}),
                   "request answered with a server error");
}

/*
 * The audit trail. Every answer to a change (an admin route other than GET) names the route,
 * the key that asked, the endpoint it was about (from the path, or the id a create answered
 * with) and the status; a key refused (401, 403) is logged at most once a second per
 * process (the metrics count every one). Only ids reach these lines: never a secret, a
 * body, a query or a header value. A refused token's id is its "slk_<id>_" part when that
 * is well-formed (an unknown or revoked key still in use shows who), else "-".
 */
static void audit(struct api_req *r)
{
    if (!r->route || !r->route->scope)
        return;
    char id[SL_APIKEY_ID_LEN + 1] = "-";
    if (r->auth.key) {
        (void)snprintf(id, sizeof(id), "%s", r->auth.key->id);
    } else {
        const char *h = api_header(r, "Authorization");
        if (h && strncasecmp(h, "Bearer slk_", 11) == 0 && strlen(h) > 11 + SL_APIKEY_ID_LEN &&
            h[11 + SL_APIKEY_ID_LEN] == '_' && sl_apikey_id_valid(h + 11, SL_APIKEY_ID_LEN))
            (void)snprintf(id, sizeof(id), "%.*s", SL_APIKEY_ID_LEN, h + 11);
    }
    if (r->status == 401 || r->status == 403) {
        SL_LOGKV_EVERY(1000, SL_LOG_WARN, "auth", "auth_refused",
                       ((struct sl_log_kv[]){SL_KV_S("route", r->route->name),
                                             SL_KV_S("key_id", id), SL_KV_I("status", r->status)}),
                       "request refused: %s",
                       r->status == 401 ? "no valid API key"
                                        : "the key lacks the scope or the channels it needs");
        return;
    }
    if (r->route->scope != SL_SCOPE_ADMIN || strcmp(r->route->method, "GET") == 0)
        return;
    const char *ep = r->params[0];
    if (!ep && r->status == 201 && json_is_object(r->json))
        ep = json_string_value(json_object_get(r->json, "id"));
    if (!ep || !sl_valid_endpoint_id(ep, strlen(ep)))
        ep = "-";
    SL_LOGKV(SL_LOG_INFO, "api", "api_change",
             ((struct sl_log_kv[]){SL_KV_S("route", r->route->name), SL_KV_S("key_id", id),
                                   SL_KV_S("endpoint_id", ep), SL_KV_I("status", r->status)}),
             "%s by key %s answered %d", r->route->name, id, r->status);
}

/* ==== the access handler ==== */

static void req_free(struct api_req *r)
{
    if (!r)
        return;
    free(r->url);
    sl_buf_fini(&r->body);
    for (int i = 0; i < API_MAX_PARAMS; i++)
        free(r->params[i]);
    api_auth_fini(&r->auth);
    json_decref(r->json);
    free(r->text);
    free(r);
}

static enum MHD_Result send_answer(struct api_req *r)
{
    char *text = r->text;
    r->text = NULL; /* the response owns it now */
    if (!text && r->json)
        /* 15 significant digits: a figure rounded to 0.001 prints as 3.341, not as the
         * 17-digit 3.3410000000000002 of jansson's default */
        text = json_dumps(r->json, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (r->raw) { /* a static answer: its bytes and type win */
        free(text);
        text = NULL;
    }
    size_t len = text ? strlen(text) : 0;
    struct MHD_Response *resp =
        r->raw ? MHD_create_response_from_buffer(r->raw_len, (void *)(uintptr_t)r->raw,
                                                 MHD_RESPMEM_PERSISTENT) /* never written */
        : text ? MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE)
               : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    if (r->raw && r->raw_type) {
        MHD_add_response_header(resp, "Content-Type", r->raw_type);
    } else {
        if (text)
            MHD_add_response_header(resp, "Content-Type",
                                    r->problem ? "application/problem+json" : "application/json");
        /* answers can hold secrets (a new signing secret) or tenant data: never cached, never
         * sniffed into another type (console files set their own) */
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    }
    for (const char *const *h = r->headers; h && h[0] && h[1]; h += 2)
        MHD_add_response_header(resp, h[0], h[1]);
    if (r->retry_after_s > 0) {
        char ra[24];
        (void)snprintf(ra, sizeof(ra), "%lld", (long long)r->retry_after_s);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (r->allow[0] && r->status == 405)
        MHD_add_response_header(resp, "Allow", r->allow);
    if (r->location[0] && r->status == 201)
        MHD_add_response_header(resp, "Location", r->location);
    if (r->idem_replayed)
        MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    if (r->status == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    api_metrics_answer(r->route ? r->route->name : NULL, r->status, sl_mono_us() - r->t0_us);
    audit(r);
    if (r->status >= 500)
        log_server_error(r);
    return ret;
}

/* The key's rate limit: true after answering 429. Redis is asked only for a key with a rate
 * (with Redis gone, every other request would wait for a connection attempt on this loop);
 * when it cannot answer, the request is allowed. */
static bool rate_limited(struct api_req *r)
{
    const struct sl_apikey *key = r->auth.key;
    if (key->rate_per_s <= 0)
        return false;
    sl_err_t err = {0};
    int64_t wait = api_keys_take(api_redis(r->api, &err), key, &err);
    if (err.code != 0)
        SL_LOG_EVERY(1000, SL_LOG_WARN, "auth", "rate_limit_unavailable",
                     "could not check the rate limit of key %s, request allowed: %s", key->id,
                     err.msg);
    if (wait <= 0)
        return false;
    r->retry_after_s = (wait + 999) / 1000;
    (void)api_problem(r, 429, "rate-limited", NULL,
                      "API key %s is over its rate of %lld requests/s; retry after %lld ms",
                      key->id, (long long)key->rate_per_s, (long long)wait);
    return true;
}

/* Authenticate, rate-limit and run the route's handler. */
static enum api_hret dispatch(struct api_req *r)
{
    struct api *a = r->api;
    int st = route(r);
    if (st == 404)
        return api_problem(r, 404, "not-found", NULL, "no such resource");
    if (st == 405)
        return api_problem(r, 405, "method-not-allowed", NULL, "method %s is not allowed here",
                           r->method);
    if (r->too_big)
        return api_problem(r, 413, "too-large", "/",
                           "the request body is larger than %lld bytes (api_max_request_bytes)",
                           (long long)a->cfg->api_max_request_bytes);
    if (r->route->scope) {
        if (atomic_load(&a->stopping)) {
            r->retry_after_s = 1;
            return api_problem(r, 503, "shutting-down", NULL,
                               "this instance is shutting down; retry (another instance will "
                               "answer)");
        }
        const char *why = "";
        struct api_auth_memo *memo = sl_httpd_conn_ctx(r->conn);
        st = api_keys_check(a->keys, api_header(r, "Authorization"), r->route->scope, memo,
                            &r->auth, &why);
        if (st != 0) {
            if (st == 503)
                r->retry_after_s = 1;
            return api_problem(r, st,
                               st == 401   ? "unauthorized"
                               : st == 403 ? "forbidden"
                                           : "unavailable",
                               st == 403 ? NULL : "Authorization", "%s", why);
        }
        if (rate_limited(r))
            return API_DONE;
    }
    if (r->route->reads && r->api->reads)
        return api_reads_submit(r->api->reads, r);
    return r->route->fn(r);
}

static enum MHD_Result on_request(void *cls,
                                  struct MHD_Connection *conn,
                                  const char *url,
                                  const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_data_size,
                                  void **con_cls)
{
    struct api *a = cls;
    struct api_req *r = *con_cls;
    (void)version;
    if (!r) {
        r = sl_xcalloc(1, sizeof(*r));
        r->api = a;
        r->conn = conn;
        r->loop = sl_httpd_loop_current();
        r->method = method;
        r->t0_us = sl_mono_us();
        const char *q = strchr(url, '?');
        r->url = q ? sl_xstrndup(url, (size_t)(q - url)) : sl_xstrdup(url);
        sl_buf_init(&r->body, (size_t)a->cfg->api_max_request_bytes);
        atomic_fetch_add(&a->active, 1);
        *con_cls = r;
        /* a declared length past the cap is refused before reading any of it */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)a->cfg->api_max_request_bytes) {
            r->too_big = true;
            dispatch(r);
            return send_answer(r);
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!r->too_big && sl_buf_append(&r->body, upload_data, *upload_data_size) != 0)
            r->too_big = true; /* keep reading and dropping; answer 413 at the end */
        *upload_data_size = 0;
        return MHD_YES;
    }
    enum api_hret h;
    if (!r->started) {
        r->started = true;
        h = dispatch(r);
    } else if (r->finish && atomic_load(&r->resumed)) {
        h = r->finish(r);
    } else {
        return MHD_YES; /* still suspended (spurious call) */
    }
    if (h == API_SUSPENDED)
        return MHD_YES;
    if (r->status == 0)
        api_problem(r, 500, "internal", NULL, "no answer was produced");
    return send_answer(r);
}

static void on_completed(void *cls,
                         struct MHD_Connection *conn,
                         void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct api *a = cls;
    struct api_req *r = *con_cls;
    (void)conn;
    (void)toe;
    if (!r)
        return;
    /* Not expected: libmicrohttpd never completes a suspended connection (it aborts when
     * stopped with one, which is why main.c ends every publish and replay first). Should a
     * suspended request's completion come anyway, its report may still come too, so r is left
     * to it (never freed twice, never used after free). */
    if (r->finish && !atomic_load(&r->resumed)) {
        sl_warn("http", "request_abandoned",
                "a publish was abandoned before Kafka answered (connection closed)");
        atomic_fetch_sub(&a->active, 1);
        *con_cls = NULL;
        return;
    }
    req_free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&a->active, 1);
}

/* A connection opens and closes: its authentication memo (api_auth.h) lives as long. */
static void on_connection(void *cls,
                          struct MHD_Connection *conn,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    (void)conn;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = sl_xcalloc(1, sizeof(struct api_auth_memo));
    } else if (*socket_context) {
        api_auth_memo_fini(*socket_context);
        free(*socket_context);
        *socket_context = NULL;
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    (void)cls;
    (void)vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    sl_debug(SL_DBG_HTTP, "http", "mhd", "%s", msg);
}

api_server_t *api_server_start(struct api *a, sl_err_t *err)
{
    struct sockaddr_storage ss;
    if (sl_listen_addr(a->cfg->api_listen, "api_listen", &ss, err) != 0)
        return NULL;
    char what[300];
    (void)snprintf(what, sizeof(what), "%s (api_listen)", a->cfg->api_listen);
    struct sl_httpd_opts o = {0};
    o.addr = &ss;
    o.what = what;
    o.threads = (unsigned)a->cfg->api_threads;
    o.max_conns = (unsigned)a->cfg->api_max_connections;
    o.idle_timeout_s = (unsigned)a->cfg->api_idle_timeout_s;
    o.request_timeout_s = (unsigned)a->cfg->api_request_timeout_s;
    o.conn_memory = API_CONN_MEMORY;
    o.thread_name = "api-http";
    o.beat = true;
    o.on_request = on_request;
    o.request_cls = a;
    o.on_completed = on_completed;
    o.completed_cls = a;
    o.on_connection = on_connection;
    o.log = mhd_log;
    struct api_server *s = sl_xcalloc(1, sizeof(*s));
    s->api = a;
    s->h = sl_httpd_start(&o, err);
    if (!s->h) {
        free(s);
        return NULL;
    }
    atomic_store(&a->httpd, s->h);
    return s;
}

long api_server_quiesce(api_server_t *s, int64_t bound_ms)
{
    if (!s)
        return 0;
    struct api *a = s->api;
    sl_httpd_quiesce(s->h);
    int64_t t0 = sl_mono_ms();
    for (;;) {
        long active = atomic_load(&a->active);
        if (active <= 0 || sl_mono_ms() - t0 >= bound_ms)
            return active;
        sl_sleep_ms(20);
    }
}

void api_server_stop(api_server_t *s)
{
    if (!s)
        return;
    atomic_store(&s->api->httpd, NULL);
    sl_httpd_stop(s->h);
    free(s);
}
