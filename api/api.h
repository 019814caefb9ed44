/*
 * api.h: what the modules of sluice-api share: the process state (struct api), one HTTP
 * request (struct api_req), the route table's handler type and the reply helpers.
 *
 * Request life: libmicrohttpd calls api_http's access handler on one of the HTTP loop threads
 * (each connection stays on one thread); the body is gathered up to api_max_request_bytes;
 * then the route's handler runs on that thread. A handler either sets the answer
 * (api_reply / api_problem) and returns API_DONE, or returns API_SUSPENDED after it handed
 * work to Kafka: the connection is suspended, and api_req_resume() (called from the producer's
 * delivery-report thread when the last record is acknowledged) wakes it, after which the
 * handler's `finish` function builds the answer on the loop thread again.
 *
 * Per-thread connections: each loop thread lazily opens its own Redis connection
 * (api_redis) and PostgreSQL connection (api_pg), reconnecting after failures.
 *
 * thread: struct api is read-only after start-up except the atomics; an api_req belongs to
 * its loop thread except the fields marked for the report thread.
 */
#ifndef API_H
#define API_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "api/api_auth.h"
#include "api/api_fanout.h"
#include "common/sl_cfg.h"
#include "common/sl_endpoints.h"
#include "common/sl_err.h"
#include "common/sl_jsonl.h"
#include "common/sl_mem.h"
#include "common/sl_redis.h"
#include "common/sl_registry.h"
#include "common/sl_secretbox.h"
#include "producer/prod_lib.h"

struct MHD_Connection;
struct sl_httpd;
typedef struct api_reads api_reads_t; /* api_reads.c: the history read threads */

struct api {
    const struct sl_config *cfg;      /* loaded configuration (borrowed from main) */
    sl_endpoints_t *eps;              /* endpoint table (fan-out, explicit endpoint checks) */
    api_fanout_t *fanout;             /* subscription index over eps */
    sluice_producer_t *prod;          /* the producer library: every publish goes through it */
    api_keys_t *keys;                 /* API key cache */
    struct sl_masterkey mk;           /* seals new endpoint secrets */
    atomic_long active;               /* requests begun and not yet completed */
    atomic_bool stopping;             /* SIGTERM seen: readiness fails, new requests get 503 */
    atomic_int replays;               /* dead-letter replays running on their threads (their
                                         requests suspended): shutdown waits for them */
    api_reads_t *reads;               /* history reads' threads (routes marked reads) */
    atomic_llong qfull_until_ms;      /* Kafka's local queue stayed full: until this monotonic ms
                                         publishes fail at once (api_events.c) */
    _Atomic(struct sl_httpd *) httpd; /* the HTTP loops once started (metrics read them) */
};

/* ms a publish waits for room in the producer's full local queue (its enqueue_timeout_ms);
 * after such a wait ran out, publishes fail at once for as long again (api_events.c). */
#define API_ENQUEUE_WAIT_MS 1000

/* api_metrics.c: metrics (docs/METRICS.md) and readiness. */
void api_metrics_init(struct api *a);
/* An answered request: route name (NULL = no route matched), status, duration in us. */
void api_metrics_answer(const char *route, int status, int64_t us);
/* n events acknowledged by Kafka. */
void api_metrics_published(size_t n);
/* Ready: not stopping, API keys loaded, producer without a fatal error. checks (may be NULL)
 * gets the named checks (sl_probe_check). Any thread. */
bool api_ready(struct api *a, struct sl_buf *checks);

/* What a handler returns. */
enum api_hret { API_DONE = 0, API_SUSPENDED = 1 };

#define API_MAX_PARAMS 2

struct api_pub; /* api_events.c: a publish waiting for Kafka */

struct sl_httpd_loop;

struct api_req {
    struct api *api;               /* process state */
    struct MHD_Connection *conn;   /* libmicrohttpd connection */
    struct sl_httpd_loop *loop;    /* the HTTP loop serving it (common/sl_httpd) */
    char *url;                     /* path without the query (owned) */
    const char *method;            /* "GET", ... (libmicrohttpd's, valid for the request) */
    struct sl_buf body;            /* request body, capped at api_max_request_bytes */
    bool too_big;                  /* the body went past the cap (answered 413) */
    bool started;                  /* the handler ran once */
    int64_t t0_us;                 /* first byte seen (mono us; metrics) */
    const struct api_route *route; /* matched route */
    char *params[API_MAX_PARAMS];  /* path parameters, URL-decoded (owned) */
    struct api_auth auth;          /* the caller's key (a reference; api_auth_fini) */
    /* the answer */
    int status;            /* HTTP status; 0 = not set */
    json_t *json;          /* body (owned), or NULL for no body */
    char *text;            /* or the body as JSON text already (owned; wins over json) */
    bool problem;          /* json is application/problem+json */
    int64_t retry_after_s; /* Retry-After header when > 0 */
    bool idem_replayed;    /* Idempotent-Replayed: true */
    char allow[64];        /* Allow header for 405 ("" = none) */
    char location[96];     /* Location header of a 201: the created resource ("" = none) */
    /* a static answer (api_console.c) instead of JSON: raw wins over json and text */
    const char *raw;            /* body bytes (static, not owned; "" with raw_len 0 for none) */
    size_t raw_len;             /* bytes of raw */
    const char *raw_type;       /* Content-Type of raw; NULL = none (a 304) */
    const char *const *headers; /* extra answer headers (any answer, problems included):
                                   name, value, ..., NULL (static) */
    /* suspended requests: a publish waiting for Kafka, a replay running on its own thread */
    struct api_pub *pub;                        /* the publish in flight, or NULL */
    void *job;                                  /* the replay in flight (api_replay.c), or NULL */
    enum api_hret (*finish)(struct api_req *r); /* set while suspended: builds the answer on
                                                   the loop after api_req_resume */
    atomic_bool resumed;       /* set by the waking thread before it resumes the connection */
    struct api_req *next_read; /* api_reads.c's queue */
    int64_t read_queued_ms;    /* when it was queued there (mono ms) */
};

typedef enum api_hret (*api_handler_fn)(struct api_req *r);

struct api_route {
    const char *method;  /* "GET", "POST", "PATCH", "DELETE" */
    const char *pattern; /* "/v1/endpoints/{}/enable": "{}" is a parameter segment; a final
                            "{*}" is the rest of the path, slashes included */
    unsigned scope;      /* SL_SCOPE_* needed; 0 = no key needed */
    api_handler_fn fn;   /* handler */
    const char *name;    /* route name for logs ("endpoints.get") */
    bool reads;          /* reads the history (PostgreSQL): run on api_reads' threads */
};

/* ==== replies (api_http.c) ==== */

/* Set the answer: status and body (takes ownership of j; NULL = no body). */
enum api_hret api_reply(struct api_req *r, int status, json_t *j);
/* The same with the body as JSON text (takes ownership of text, from malloc). */
enum api_hret api_reply_text(struct api_req *r, int status, char *text);

/*
 * Set an RFC 9457 application/problem+json answer: type "urn:sluice:problem:<slug>",
 * title, status, detail (printf; never put secrets, payloads or query strings in it) and,
 * when field is not NULL, the "field" member naming the offending input (a JSON pointer into
 * the body such as "/events/3/type", a header name, or a query parameter).
 */
enum api_hret api_problem(
    struct api_req *r, int status, const char *slug, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The problem object itself (for per-event results of a batch); same arguments. */
json_t *api_problem_json(int status, const char *slug, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * Map an error from the record codec or sl_jsonl (whose messages name the field as
 * `field "x"`) to a problem: 413 for SL_ETOOBIG of the whole body, 400 otherwise, field =
 * prefix + "/" + x.
 */
json_t *api_problem_from_err(const sl_err_t *err, const char *prefix);

/* A request header's value (borrowed, valid during the request) or NULL. */
const char *api_header(struct api_req *r, const char *name);
/* A query argument's value (borrowed) or NULL. */
const char *api_query(struct api_req *r, const char *name);

/* Parse the body as one JSON value (object required): NULL after answering 400. */
json_t *api_body_json(struct api_req *r);
/* The same for a publish request of that shape, with each event's object or array "body"
 * parsed as {} or [] when the text is plain JSON (sl_json_elide_bodies; *elided, unless NULL,
 * says so): the caller takes the bodies' bytes from the request text. Same answers as
 * api_body_json. */
json_t *api_body_json_events(struct api_req *r, enum sl_json_shape shape, bool *elided);

#define API_LIMIT_DEFAULT 50  /* list entries per page when ?limit= is absent */
#define API_LIMIT_MAX     500 /* largest ?limit= */

/*
 * A list's page: ?limit= (1..API_LIMIT_MAX, default API_LIMIT_DEFAULT) into *limit (OUT) and
 * ?cursor= decoded into cur (cap bytes, NUL-terminated; *have OUT says whether one was
 * given). Returns 0, or -1 after answering 400 naming the parameter (a cursor that is not
 * one api_cursor_json made, with this master key).
 */
int api_query_page(struct api_req *r, long *limit, char *cur, size_t cap, bool *have);
/* The opaque cursor of a position text (at most 512 bytes): sealed with the master key, as
 * hex. JSON null (logged) if it cannot be made. */
json_t *api_cursor_json(struct api_req *r, const char *pos);
/* Unix ms as an RFC 3339 UTC string ("2026-12-02T02:28:03.314Z"); ms <= 0 = JSON null. */
json_t *api_time_json(int64_t ms);

/*
 * May the caller's key see endpoint id (borrowed)? Always for a key without channels; a key
 * limited to channels sees the endpoints (of the in-memory table) that carry one of them.
 */
bool api_key_sees(struct api_req *r, const char *id);
/*
 * May the caller's key give an endpoint these channels (borrowed)? Always without a channel
 * limit; with one, the list must be non-empty and every channel the key's.
 */
bool api_key_may_assign(struct api_req *r, char *const *channels, size_t n);

/* Wake a suspended request (any thread). */
void api_req_resume(struct api_req *r);

/* This loop thread's Redis / PostgreSQL connection; NULL and err when unreachable. */
sl_redis_t *api_redis(struct api *a, sl_err_t *err);
PGconn *api_pg(struct api *a, sl_err_t *err);
/* Drop this thread's PostgreSQL connection after an error that may have broken it. */
void api_pg_reset(void);

/* ==== server (api_http.c) ==== */

typedef struct api_server api_server_t;

/* Listen on cfg->api_listen and serve. NULL and err on failure. */
api_server_t *api_server_start(struct api *a, sl_err_t *err);
/*
 * Stop accepting new connections (idempotent) and wait up to bound_ms for the requests in
 * flight to complete. Returns how many are still active (0 = all done).
 */
long api_server_quiesce(api_server_t *s, int64_t bound_ms);
/* Close every connection and free the server (NULL-safe). No request may be suspended. */
void api_server_stop(api_server_t *s);

/* ==== handlers ==== */

/* api_events.c */
enum api_hret api_events_publish(struct api_req *r);
enum api_hret api_events_publish_batch(struct api_req *r);
enum api_hret api_endpoints_test(struct api_req *r); /* POST /v1/endpoints/{id}/test */
/* api_mgmt.c */
enum api_hret api_endpoints_list(struct api_req *r);
enum api_hret api_endpoints_create(struct api_req *r);
enum api_hret api_endpoints_get(struct api_req *r);
enum api_hret api_endpoints_patch(struct api_req *r);
enum api_hret api_endpoints_delete(struct api_req *r);
enum api_hret api_endpoints_enable(struct api_req *r);
enum api_hret api_endpoints_disable(struct api_req *r);
enum api_hret api_endpoints_rotate(struct api_req *r);
/* api_history.c */
enum api_hret api_event_deliveries(struct api_req *r);
enum api_hret api_event_types(struct api_req *r);
enum api_hret api_dead_letters_list(struct api_req *r);
/* api_replay.c */
enum api_hret api_dead_letters_replay(struct api_req *r);
/* Until no replay runs (each ends before its next batch once a->stopping is set): the server
 * cannot stop with their requests suspended. Logs every 10 s while it waits. */
/* api_reads.c: the history read threads (see there). api_reads_start: nthreads threads, or
 * NULL with err. api_reads_submit (loop thread): suspend r and queue it (API_SUSPENDED), or
 * answer 503 once stopping (API_DONE). api_reads_stop: answer 503 to what is queued, let
 * what runs finish, end the threads; later submits get 503. api_reads_free: stop if needed,
 * then free, once no loop runs. NULL is fine for both. */
api_reads_t *api_reads_start(size_t nthreads, sl_err_t *err);
enum api_hret api_reads_submit(api_reads_t *q, struct api_req *r);
void api_reads_stop(api_reads_t *q);
void api_reads_free(api_reads_t *q);

void api_replays_wait(struct api *a);
/* api_stats.c */
/* Run a read of the delivery history on this thread's PostgreSQL connection (api_history.c),
 * once more on a new connection when the old one had died since its last use. Returns the
 * result (the caller PQclears it), or NULL after answering: 503 history-unavailable (with
 * Retry-After; the connection is dropped), or 500 when this instance's role lacks a grant. */
PGresult *api_history_query(struct api_req *r, const char *sql, int n, const char *const *params);

/* For a key limited to channels, the ids of the endpoints it sees as a PostgreSQL text[]
 * literal (malloc'd), to filter a history query by; NULL for any other key (api_stats.c). */
char *api_visible_ids(struct api_req *r);
enum api_hret api_endpoint_stats(struct api_req *r);
enum api_hret api_endpoint_latency(struct api_req *r);
enum api_hret api_dead_letter_patterns(struct api_req *r);
/* api_console.c */
enum api_hret api_console_get(struct api_req *r);

#endif /* API_H */
