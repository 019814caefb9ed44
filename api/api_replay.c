/*
 * api_replay: POST /v1/dead-letters/replay, the dead-letter replay of `sluicectl replay` over
 * HTTP, on the same engine (common/sl_replay: each letter re-published once, marked, journalled,
 * concurrent runs never sending a letter twice).
 *
 * A dry run ("dry_run": true) is a read: it runs on the loop thread and answers what a run would
 * select. A real run can wait on Kafka for minutes, so it runs on a thread of its own with its
 * two PostgreSQL connections (the engine needs a second one for its journal); the connection
 * is suspended meanwhile and resumed with the result. A key limited to channels may replay
 * only an endpoint it can see, named in the selection.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "api/api.h"
#include "common/sl_fault.h"
#include "common/sl_log.h"
#include "common/sl_replay.h"

#define SHOWN_MAX 100 /* letters listed in an answer */

struct job {
    struct api_req *r;
    struct sl_replay_sel sel;
    const char **ids; /* sel.event_ids (borrowed from body) */
    json_t *body;     /* the request, owning the strings sel points into */
    json_t *letters;  /* per-letter results, up to SHOWN_MAX */
    struct sl_replay_result res;
    int rc;
    sl_err_t err;
    char actor[64]; /* "sluice-api key <id>", copied on the loop thread (replay_log.actor) */
};

static void job_free(struct job *j)
{
    if (!j)
        return;
    free(j->ids);
    json_decref(j->body);
    json_decref(j->letters);
    free(j);
}

/* The selection from the body; 0, or -1 after answering 400/403. */
/* "event_ids": an array of at most SL_REPLAY_IDS_MAX valid event ids. */
static bool sel_event_ids(struct job *j, json_t *v)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    bool ok = json_is_array(v) && n <= SL_REPLAY_IDS_MAX;
    if (!ok || n == 0)
        return ok;
    j->ids = sl_xcalloc(n, sizeof(*j->ids));
    for (size_t i = 0; i < n && ok; i++) {
        json_t *e = json_array_get(v, i);
        ok = json_is_string(e) && sl_valid_event_id(json_string_value(e), json_string_length(e));
        j->ids[i] = ok ? json_string_value(e) : NULL;
    }
    j->sel.event_ids = j->ids;
    j->sel.n_event_ids = n;
    return ok;
}

static bool in_range(const json_t *v, json_int_t max)
{
    return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= max;
}

/* "endpoint" (an endpoint id) or "error" (an error class). */
static bool sel_string(struct job *j, const char *k, const json_t *v)
{
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    if (k[1] == 'n') {
        if (!sl_valid_endpoint_id(s, json_string_length(v)))
            return false;
        j->sel.endpoint = s;
    } else {
        if (!sl_replay_error_class_valid(s))
            return false;
        j->sel.error_class = s;
    }
    return true;
}

/* One known field of the selection into j->sel (or *dry). False: wrong type, form or range. */
static bool sel_field(struct job *j, const char *k, json_t *v, bool *dry)
{
    if (strcmp(k, "endpoint") == 0 || strcmp(k, "error") == 0) {
        return sel_string(j, k, v);
    } else if (strcmp(k, "since_ms") == 0 || strcmp(k, "until_ms") == 0) {
        if (!in_range(v, SL_REPLAY_TIME_MAX_MS))
            return false;
        bool since = k[0] == 's';
        *(since ? &j->sel.has_since : &j->sel.has_until) = true;
        *(since ? &j->sel.since_ms : &j->sel.until_ms) = json_integer_value(v);
    } else if (strcmp(k, "limit") == 0) {
        if (!in_range(v, SL_REPLAY_LIMIT_MAX))
            return false;
        j->sel.limit = json_integer_value(v);
    } else if (strcmp(k, "all") == 0 || strcmp(k, "dry_run") == 0) {
        if (!json_is_boolean(v))
            return false;
        *(k[0] == 'a' ? &j->sel.all : dry) = json_is_true(v);
    } else { /* event_ids */
        return sel_event_ids(j, v);
    }
    return true;
}

/* A key limited to channels replays only an endpoint of its channels, named in the
 * selection. True when r's key may replay j's selection. */
static bool sel_channels_allowed(const struct api_req *r, const struct job *j)
{
    const struct sl_apikey *key = r->auth.key;
    if (!key || key->n_channels == 0)
        return true;
    const struct sl_endpoint *e =
        j->sel.endpoint ? sl_endpoints_get(r->api->eps, j->sel.endpoint) : NULL;
    bool ok = e && sl_apikey_sees_channels(key, e->channels, e->n_channels);
    sl_endpoint_release(e);
    return ok;
}

static int parse_sel(struct api_req *r, struct job *j, bool *dry)
{
    static const char *const fields[] = {"endpoint",  "error", "since_ms", "until_ms",
                                         "event_ids", "limit", "all",      "dry_run"};
    const char *k;
    json_t *v;
    *dry = false;
    json_object_foreach(j->body, k, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            known = known || strcmp(fields[i], k) == 0;
        char field[80];
        (void)snprintf(field, sizeof(field), "/%.70s", k);
        if (!known) {
            api_problem(r, 400, "invalid-field", field, "unknown field \"%.60s\"", k);
            return -1;
        }
        if (!sel_field(j, k, v, dry)) {
            api_problem(r, 400, "invalid-field", field,
                        "field has the wrong type, form or range (see the API's contract)");
            return -1;
        }
    }
    if (j->sel.has_since && j->sel.has_until && j->sel.since_ms >= j->sel.until_ms) {
        api_problem(r, 400, "invalid-field", "/until_ms", "until_ms must be after since_ms");
        return -1;
    }
    sl_err_t err;
    if (sl_replay_sel_check(&j->sel, &err) != 0) { /* what is left: an empty selection */
        api_problem(r, 400, "missing-field", "/", "%s", err.msg);
        return -1;
    }
    if (!sel_channels_allowed(r, j)) {
        /* naming one it may not see (or none there is): not there for it, as on the other
         * routes; naming none: it must */
        if (j->sel.endpoint)
            api_problem(r, 404, "unknown-endpoint", "/endpoint", "no endpoint has that id");
        else
            api_problem(r, 403, "forbidden", "/endpoint",
                        "a key limited to channels replays only an endpoint of its channels, "
                        "named in \"endpoint\"");
        return -1;
    }
    return 0;
}

static void on_candidate(void *opaque, const struct sl_replay_candidate *c)
{
    json_t *a = opaque;
    if (json_array_size(a) >= SHOWN_MAX)
        return;
    json_array_append_new(
        a, json_pack("{s:s, s:s, s:o, s:o, s:o, s:I, s:I, s:I}", "event_id", c->event_id,
                     "endpoint", c->endpoint_id, "dead_at", api_time_json(c->dead_ms), "error",
                     c->error_class ? json_string(c->error_class) : json_null(), "last_status",
                     c->has_last_status ? json_integer(c->last_status) : json_null(), "attempts",
                     (json_int_t)c->attempts, "replay_count", (json_int_t)c->replay_count, "bytes",
                     (json_int_t)c->bytes));
}

static void on_letter(void *opaque, const struct sl_replay_letter *l)
{
    struct job *j = opaque;
    if (json_array_size(j->letters) >= SHOWN_MAX)
        return;
    static const char *const names[] = {"replayed", "failed", "invalid"};
    json_t *x =
        json_pack("{s:s, s:s, s:s, s:b}", "event_id", l->event_id, "endpoint", l->endpoint_id,
                  "outcome", names[l->outcome], "unconfirmed", l->unconfirmed);
    if (l->error && l->error[0])
        json_object_set_new(x, "error", json_string(l->error));
    json_array_append_new(j->letters, x);
}

static void on_warning(void *opaque, const char *msg)
{
    (void)opaque;
    sl_warn("replay", "replay_warning", "%s", msg);
}

static void sleep_ms(long ms)
{
    struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&d, &d) != 0) {
    }
}

/*
 * Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=api_replay_slow makes the replay act as
 * if its first batch were still running at SIGTERM and for api_shutdown_ms + 3 s after it, so
 * that shutdown must wait for it (tests/e2e/test_api.py).
 */
static void fault_slow_batch(struct api *a)
{
    if (!sl_fault_is("api_replay_slow"))
        return;
    for (int i = 0; i < 1200 && !atomic_load(&a->stopping); i++)
        sleep_ms(50);
    sleep_ms((long)a->cfg->api_shutdown_ms + 3000);
}

static void *run_main(void *arg)
{
    struct job *j = arg;
    struct api_req *r = j->r;
    struct api *a = r->api; /* outlives r, which the resume below hands back to the loop */
    fault_slow_batch(a);
    PGconn *pg = sl_reg_db_open(r->api->cfg, &j->err);
    PGconn *jpg = pg ? sl_reg_db_open(r->api->cfg, &j->err) : NULL;
    if (!pg || !jpg) {
        j->rc = SL_EPG;
    } else {
        struct sl_replay_opts o = {0};
        o.kafka_role = "sluice-api-replay";
        o.actor = j->actor;
        o.opaque = j;
        o.on_letter = on_letter;
        o.on_warning = on_warning;
        o.stop = &a->stopping;
        j->rc = sl_replay_run(pg, jpg, r->api->cfg, &j->sel, &o, &j->res, &j->err);
    }
    if (jpg)
        PQfinish(jpg);
    if (pg)
        PQfinish(pg);
    api_req_resume(r);
    atomic_fetch_sub(&a->replays, 1); /* after the resume: stop() may then stop the server */
    return NULL;
}

void api_replays_wait(struct api *a)
{
    for (long waited = 0; atomic_load(&a->replays) > 0; waited += 50) {
        if (waited % 10000 == 0)
            sl_info("replay", "shutdown_waits_for_replay",
                    "%d dead-letter replays still finishing their batch: waiting",
                    atomic_load(&a->replays));
        sleep_ms(50);
    }
}

/* Whether a run's error is PostgreSQL's or Kafka's (their text, hosts and ports, is logged and
 * not answered) rather than the replay's own. */
static bool outage(int rc)
{
    return rc == SL_EPG || rc == SL_EKAFKA;
}

static enum api_hret finish(struct api_req *r)
{
    struct job *j = r->job;
    const struct sl_replay_result *x = &j->res;
    r->job = NULL;
    r->finish = NULL;
    if (j->rc != 0 && !x->started) {
        if (j->rc == SL_EINVAL) {
            json_t *p = api_problem_from_err(&j->err, "");
            api_reply(r, 400, p);
            r->problem = true;
        } else {
            /* the cause (libpq's or librdkafka's text: hosts, ports) is for the log only */
            sl_warn("replay", "replay_not_started", "a replay could not start: %s", j->err.msg);
            r->retry_after_s = 5;
            if (outage(j->rc))
                api_problem(r, 503, "replay-unavailable", NULL,
                            "the replay could not start: PostgreSQL or Kafka is unavailable");
            else
                api_problem(r, 503, "replay-unavailable", NULL, "the replay could not start: %s",
                            j->err.msg);
        }
        job_free(j);
        return API_DONE;
    }
    json_t *ans =
        json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:O}", "run_id",
                  x->run_id, "complete", j->rc == 0, "replayed", (json_int_t)x->replayed, "failed",
                  (json_int_t)x->failed, "invalid", (json_int_t)x->invalid, "recovered",
                  (json_int_t)x->recovered, "unconfirmed", (json_int_t)x->unconfirmed, "unmarked",
                  (json_int_t)x->unmarked, "unmarked_lost", (json_int_t)x->unmarked_lost,
                  "without_payload", (json_int_t)x->without_payload, "unregistered",
                  (json_int_t)x->unregistered, "letters", j->letters);
    if (j->rc != 0) /* our own words; libpq's or librdkafka's (hosts, ports) only logged */
        json_object_set_new(ans, "error",
                            json_string(outage(j->rc)
                                            ? "the replay stopped early: PostgreSQL or Kafka "
                                              "became unavailable; run it again to replay the rest"
                                            : j->err.msg));
    api_reply(r, j->rc == 0 ? 200 : 503, ans);
    if (j->rc != 0) {
        r->retry_after_s = 5;
        sl_warn("replay", "replay_stopped", "a replay stopped early: %s", j->err.msg);
    }
    job_free(j);
    return API_DONE;
}

enum api_hret api_dead_letters_replay(struct api_req *r)
{
    json_t *body = api_body_json(r);
    if (!body)
        return API_DONE;
    struct job *j = sl_xcalloc(1, sizeof(*j));
    j->r = r;
    j->body = body;
    j->letters = json_array();
    (void)snprintf(j->actor, sizeof(j->actor), "sluice-api key %s",
                   r->auth.key ? r->auth.key->id : "(none)");
    bool dry = false;
    if (parse_sel(r, j, &dry) != 0) {
        job_free(j);
        return API_DONE;
    }
    if (dry) {
        sl_err_t err;
        PGconn *pg = api_pg(r->api, &err);
        struct sl_replay_dry_result out;
        json_t *cands = json_array();
        int rc = pg ? sl_replay_dry_run(pg, &j->sel, SHOWN_MAX, on_candidate, cands, &out, &err)
                    : SL_EPG;
        if (rc == 0) {
            api_reply(r, 200,
                      json_pack("{s:b, s:I, s:I, s:I, s:o}", "dry_run", 1, "would_replay",
                                (json_int_t)out.would_replay, "without_payload",
                                (json_int_t)out.without_payload, "unregistered",
                                (json_int_t)out.unregistered, "candidates", cands));
        } else {
            json_decref(cands);
            if (pg)
                api_pg_reset();
            sl_warn("replay", "dry_run_failed", "a replay's dry run failed: %s", err.msg);
            r->retry_after_s = 2;
            api_problem(r, 503, "history-unavailable", NULL,
                        "the dry run could not read the dead letters");
        }
        job_free(j);
        return API_DONE;
    }
    r->job = j;
    r->finish = finish;
    atomic_fetch_add(&r->api->replays, 1);
    MHD_suspend_connection(r->conn);
    pthread_attr_t at;
    pthread_t t;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int pe = pthread_create(&t, &at, run_main, j);
    pthread_attr_destroy(&at);
    if (pe != 0) {
        j->rc = SL_EIO;
        sl_err_set(&j->err, SL_EIO, "could not start the replay thread");
        struct api *a = r->api;
        api_req_resume(r);
        atomic_fetch_sub(&a->replays, 1);
    }
    return API_SUSPENDED;
}
