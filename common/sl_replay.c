/*
 * sl_replay: the dead-letter replay engine (see sl_replay.h for the protocol and the
 * guarantee).
 *
 * A run is one struct run on the caller's stack: the two connections, the producer, the
 * batch being published and the counts. Delivery reports reach the batch through the
 * producer's opaque (the run) and each message's opaque (batch serial + row index), so a
 * report that arrives after its batch was given up on cannot touch a row that is gone; they
 * are served only inside rd_kafka_poll on the calling thread. A letter whose publish was never
 * acknowledged (or failed) stays unmarked and is picked up by the next run; within one run it
 * is not retried (the selection skips letters this run has journalled).
 *
 * dead_at travels from pg to journal_pg as ISO 8601 text with microseconds in UTC, so the
 * journal row names the exact death whatever the sessions' DateStyle and TimeZone.
 *
 * Messages name counts, endpoints, event ids and error classes, never payloads.
 */
#include "common/sl_replay.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <openssl/rand.h>

#include "common/sl_hex.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_record.h"
#include "common/sl_time.h"

#define ENQUEUE_WAIT_MS 10000 /* a full local producer queue, per record */

/* ==== Selection ==== */

/* The filter parameters shared by every selection statement: $1 endpoint, $2 since ms,
 * $3 until ms, $4 error class, $5 event ids (text[] literal); NULL = no filter. */
#define FILTER_SQL                                                                                 \
    " d.replayed_at is null and d.resolved_at is null"                                             \
    " and ($1::text is null or d.endpoint_id = $1)"                                                \
    " and ($2::bigint is null or d.dead_at >= timestamptz 'epoch' + $2::bigint"                    \
    "      * interval '1 millisecond')"                                                            \
    " and ($3::bigint is null or d.dead_at < timestamptz 'epoch' + $3::bigint"                     \
    "      * interval '1 millisecond')"                                                            \
    " and ($4::text is null or d.error_class = $4)"                                                \
    " and ($5::text[] is null or d.event_id = any($5::text[]))"

/* The letter's endpoint is in the registry: a letter of an endpoint deleted since is not
 * sent (the consumers would quarantine it as unknown), only counted (SQL_UNREGISTERED). */
#define REGISTERED_SQL " and exists (select 1 from endpoints e where e.id = d.endpoint_id)"

/* A run's batch: $6 run id (its own journal rows are skipped), $7 batch size. */
static const char SQL_SELECT[] =
    "select d.event_id, d.endpoint_id,"
    "       to_char(d.dead_at at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') as dead_at,"
    "       d.payload,"
    "       exists (select 1 from replay_log l where l.event_id = d.event_id"
    "                  and l.endpoint_id = d.endpoint_id and l.dead_at = d.dead_at"
    "                  and l.state = 'sending') as unconfirmed"
    "  from dead_letters d"
    " where" FILTER_SQL " and d.payload is not null" REGISTERED_SQL
    "   and not exists (select 1 from replay_log l where l.run_id = $6"
    "                      and l.event_id = d.event_id and l.endpoint_id = d.endpoint_id)"
    " order by d.dead_at, d.endpoint_id, d.event_id"
    " limit $7::bigint"
    " for update of d skip locked";

/* The dry run: what a run would select now (letters locked by a running replay included). */
static const char SQL_DRY[] =
    "select d.event_id, d.endpoint_id, (extract(epoch from d.dead_at) * 1000)::bigint as dead_ms,"
    "       d.error_class, d.last_status, d.attempts, d.replay_count, length(d.payload) as bytes"
    "  from dead_letters d"
    " where" FILTER_SQL " and d.payload is not null" REGISTERED_SQL
    " order by d.dead_at, d.endpoint_id, d.event_id"
    " limit $6::bigint";

/* How many the dry run would select ($6: the limit), when only the first few are fetched. */
static const char SQL_DRY_COUNT[] =
    "select count(*) as n from (select 1 from dead_letters d"
    " where" FILTER_SQL " and d.payload is not null" REGISTERED_SQL " limit $6::bigint) x";

/* Letters matching the selection that cannot be replayed (no stored record). */
static const char SQL_NOPAYLOAD[] =
    "select count(*) as n from dead_letters d where" FILTER_SQL " and d.payload is null";

/* Letters matching the selection, with a stored record, of endpoints no longer registered. */
static const char SQL_UNREGISTERED[] =
    "select count(*) as n from dead_letters d where" FILTER_SQL " and d.payload is not null"
    " and not exists (select 1 from endpoints e where e.id = d.endpoint_id)";

static const char SQL_JOURNAL_INSERT[] =
    "insert into replay_log (run_id, event_id, endpoint_id, dead_at, state, error, actor)"
    " select $1, u.e, u.p, u.t::timestamptz, u.s, nullif(u.x, ''), $7"
    "   from unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])"
    "        as u(e, p, t, s, x)";

static const char SQL_JOURNAL_UPDATE[] =
    "update replay_log l"
    "   set state = u.s, acked_at = case when u.s = 'acked' then now() end,"
    "       error = nullif(u.x, '')"
    "  from unnest($2::text[], $3::text[], $4::text[], $5::text[]) as u(e, p, s, x)"
    " where l.run_id = $1 and l.event_id = u.e and l.endpoint_id = u.p";

/* Rows of a batch (locked by it) whose current death another run had acknowledged by Kafka
 * and journalled 'acked' but did not mark (it stopped before its commit, after this run's
 * start-up recovery): marked as sluice_replay_recover() marks them, never sent again. A
 * statement of its own after the locking select: its snapshot sees a journal row the other
 * run committed before releasing the lock. $1 event ids, $2 endpoints, $3 deaths. */
static const char SQL_RECOVER_LOCKED[] =
    "update dead_letters d set replayed_at = c.acked_at, replay_count = d.replay_count + 1"
    "  from (select u.e, u.p, max(l.acked_at) as acked_at"
    "          from unnest($1::text[], $2::text[], $3::text[]) as u(e, p, t)"
    "          join replay_log l on l.event_id = u.e and l.endpoint_id = u.p"
    "                           and l.dead_at = u.t::timestamptz and l.state = 'acked'"
    "         group by u.e, u.p) c"
    " where d.event_id = c.e and d.endpoint_id = c.p"
    " returning d.event_id, d.endpoint_id";

static const char SQL_MARK[] =
    "update dead_letters d set replayed_at = now(), replay_count = d.replay_count + 1"
    "  from unnest($1::text[], $2::text[]) as u(e, p)"
    " where d.event_id = u.e and d.endpoint_id = u.p";

/* ==== Checks ==== */

bool sl_replay_error_class_valid(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > SL_ERR_CLASS_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

int sl_replay_sel_check(const struct sl_replay_sel *sel, sl_err_t *err)
{
    if (sel->endpoint && !sl_valid_endpoint_id(sel->endpoint, strlen(sel->endpoint)))
        return sl_err_set(err, SL_EINVAL,
                          "invalid endpoint id: expected 1..64 characters [A-Za-z0-9_-]");
    if (sel->error_class && !sl_replay_error_class_valid(sel->error_class))
        return sl_err_set(err, SL_EINVAL,
                          "invalid error class: expected 1..32 characters [a-z0-9_]");
    if (sel->n_event_ids > SL_REPLAY_IDS_MAX)
        return sl_err_set(err, SL_EINVAL, "too many event ids: at most %d", SL_REPLAY_IDS_MAX);
    if (sel->n_event_ids > 0 && !sel->event_ids)
        return sl_err_set(err, SL_EINVAL, "event ids missing");
    for (size_t i = 0; i < sel->n_event_ids; i++)
        if (!sel->event_ids[i] || !sl_valid_event_id(sel->event_ids[i], strlen(sel->event_ids[i])))
            return sl_err_set(err, SL_EINVAL,
                              "invalid event id at position %zu: expected 1..128 visible "
                              "characters except '.'",
                              i + 1);
    if (sel->limit < 0 || sel->limit > SL_REPLAY_LIMIT_MAX)
        return sl_err_set(err, SL_EINVAL, "invalid limit: expected 0..%d", SL_REPLAY_LIMIT_MAX);
    if ((sel->has_since && (sel->since_ms < 0 || sel->since_ms > SL_REPLAY_TIME_MAX_MS)) ||
        (sel->has_until && (sel->until_ms < 0 || sel->until_ms > SL_REPLAY_TIME_MAX_MS)))
        return sl_err_set(err, SL_EINVAL,
                          "since and until must lie between 1970 and the end of year 9999");
    if (sel->has_since && sel->has_until && sel->since_ms >= sel->until_ms)
        return sl_err_set(err, SL_EINVAL, "since must be before until");
    bool selector = sel->endpoint || sel->has_since || sel->has_until || sel->error_class ||
                    sel->n_event_ids > 0 || sel->limit > 0;
    if (!selector && !sel->all)
        return sl_err_set(err, SL_EINVAL,
                          "no selection: choose an endpoint, a time window, an error class, "
                          "event ids or a limit, or all dead letters not yet replayed");
    return 0;
}

/* The filter parameters ($1..$5) of sel; ids_lit is an owned array literal or NULL. */
static void filter_params(const struct sl_replay_sel *sel,
                          char since[24],
                          char until[24],
                          char **ids_lit,
                          const char *params[5])
{
    (void)snprintf(since, 24, "%" PRId64, sel->since_ms);
    (void)snprintf(until, 24, "%" PRId64, sel->until_ms);
    *ids_lit = sel->n_event_ids ? sl_pg_text_array(sel->event_ids, sel->n_event_ids) : NULL;
    params[0] = sel->endpoint;
    params[1] = sel->has_since ? since : NULL;
    params[2] = sel->has_until ? until : NULL;
    params[3] = sel->error_class;
    params[4] = *ids_lit;
}

/* The letters matching sel that no run sends: without a stored record (*without), of an
 * endpoint no longer registered (*unregistered). */
static int count_unsendable(PGconn *pg,
                            const struct sl_replay_sel *sel,
                            int64_t *without,
                            int64_t *unregistered,
                            sl_err_t *err)
{
    char since[24], until[24];
    char *ids_lit = NULL;
    const char *params[5];
    filter_params(sel, since, until, &ids_lit, params);
    PGresult *res =
        sl_pg_exec(pg, "count dead letters without a record", SQL_NOPAYLOAD, 5, params, err);
    PGresult *res2 = res ? sl_pg_exec(pg, "count dead letters of endpoints no longer registered",
                                      SQL_UNREGISTERED, 5, params, err)
                         : NULL;
    free(ids_lit);
    int rc = res && res2 ? 0 : SL_EPG;
    if (rc == 0) {
        *without = sl_pg_i64(res, 0, "n");
        *unregistered = sl_pg_i64(res2, 0, "n");
    }
    PQclear(res);
    PQclear(res2);
    return rc;
}

/* ==== One letter of a batch ==== */

enum row_state {
    R_NEW = 0,   /* selected */
    R_INVALID,   /* stored record does not decode or belongs to another key: not sent */
    R_SENT,      /* handed to the producer, no report yet */
    R_ACKED,     /* Kafka acknowledged it */
    R_FAILED,    /* could not be produced, or Kafka reported a failure, or no report in time */
    R_RECOVERED, /* acknowledged for another run that stopped before marking it: marked, not
                    sent, not journalled by this run */
};

struct row {
    char *event_id;                  /* owned */
    char *endpoint_id;               /* owned */
    char *dead_at;                   /* dead_letters.dead_at, ISO 8601 UTC to the µs; owned */
    uint8_t *rec;                    /* re-encoded delivery record (malloc'd), NULL if invalid */
    size_t rec_len;                  /* bytes */
    bool unconfirmed;                /* an interrupted earlier run left it 'sending' */
    enum row_state state;            /* where it is */
    char error[SL_ERR_MSG_MAX + 64]; /* why invalid or failed */
};

/* Everything a run holds. */
struct run {
    const struct sl_config *cfg;     /* borrowed */
    const struct sl_replay_sel *sel; /* borrowed */
    const struct sl_replay_opts *o;  /* borrowed */
    struct sl_replay_result *out;    /* borrowed: the counts */
    PGconn *a;                       /* selection + marking transaction (borrowed) */
    PGconn *b;                       /* journal, autocommit (borrowed) */
    rd_kafka_t *rk;                  /* producer (owned) */
    struct row *cur;                 /* the batch being published (borrowed from batch()) */
    int cur_n;                       /* rows in cur */
    uint64_t serial;                 /* batch number, tags each message */
    int outstanding;                 /* records of the batch sent without a report yet */
    int64_t batch_size;              /* letters per transaction */
};

static void row_fini(struct row *w)
{
    free(w->event_id);
    free(w->endpoint_id);
    free(w->dead_at);
    free(w->rec);
    memset(w, 0, sizeof(*w));
}

/* A message's opaque: the batch serial and the row index, so a report that arrives after
 * its batch was given up on (purged, counted failed) cannot touch a row that is gone. */
static void *msg_tag(uint64_t serial, int index)
{
    return (void *)(uintptr_t)((serial << 32) | (uint64_t)(index + 1));
}

/* Delivery report: runs inside rd_kafka_poll on the run's thread; opaque is the run. */
static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct run *r = opaque;
    uint64_t tag = (uint64_t)(uintptr_t)m->_private;
    int index = (int)(tag & 0xffffffffu) - 1;
    if (!r || (tag >> 32) != r->serial || index < 0 || index >= r->cur_n ||
        r->cur[index].state != R_SENT)
        return;
    struct row *w = &r->cur[index];
    r->outstanding--;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        w->state = R_ACKED;
    } else {
        w->state = R_FAILED;
        (void)snprintf(w->error, sizeof(w->error), "kafka: %s", rd_kafka_err2str(m->err));
    }
}

/* Decode the stored record, check it belongs to the letter, re-encode as a replay. */
static void prepare(struct run *r, struct row *w, const unsigned char *payload, size_t len)
{
    struct sl_decode_limits lim = {.max_body = (size_t)r->cfg->max_body_bytes, .max_record = 0};
    struct sl_delivery d;
    sl_err_t err;
    sl_err_clear(&err);
    if (sl_delivery_decode(payload, len, &lim, &d, &err) != 0) {
        w->state = R_INVALID;
        (void)snprintf(w->error, sizeof(w->error), "stored record does not decode: %s", err.msg);
        sl_delivery_fini(&d);
        return;
    }
    if (strcmp(d.id, w->event_id) != 0 || strcmp(d.ep, w->endpoint_id) != 0) {
        w->state = R_INVALID;
        (void)snprintf(w->error, sizeof(w->error), "stored record belongs to another event");
        sl_delivery_fini(&d);
        return;
    }
    d.attempt = 0;
    d.replay = true;
    struct sl_buf b;
    sl_buf_init(&b, (size_t)r->cfg->max_body_bytes + SL_RECORD_OVERHEAD);
    if (sl_delivery_encode_lim(&d, &lim, &b, &err) != 0) {
        w->state = R_INVALID;
        (void)snprintf(w->error, sizeof(w->error), "stored record cannot be re-encoded: %s",
                       err.msg);
        sl_buf_fini(&b);
    } else {
        w->rec = b.data; /* taken over from the buffer */
        w->rec_len = b.len;
    }
    sl_delivery_fini(&d);
}

/* Journal rows of a batch with their current state (journal insert or update). */
static int journal(struct run *r, struct row *rows, int n, bool insert, sl_err_t *err)
{
    const char **e = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **p = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **t = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **s = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **x = sl_xcalloc((size_t)n + 1, sizeof(char *));
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].state == R_RECOVERED)
            continue;
        e[k] = rows[i].event_id;
        p[k] = rows[i].endpoint_id;
        t[k] = rows[i].dead_at;
        switch (rows[i].state) {
        case R_ACKED:
            s[k] = "acked";
            break;
        case R_SENT:
            s[k] = insert ? "sending" : "failed";
            if (!insert && rows[i].error[0] == '\0')
                (void)snprintf(rows[i].error, sizeof(rows[i].error),
                               "not acknowledged within %d ms", SL_REPLAY_ACK_WAIT_MS);
            break;
        case R_NEW:
            s[k] = "sending";
            break;
        default:
            s[k] = "failed";
            break;
        }
        x[k] = rows[i].error;
        k++;
    }
    int rc = 0;
    if (k == 0)
        goto out;
    char *ae = sl_pg_text_array(e, k), *ap = sl_pg_text_array(p, k);
    char *at = sl_pg_text_array(t, k), *as = sl_pg_text_array(s, k);
    char *ax = sl_pg_text_array(x, k);
    if (insert) {
        const char *params[7] = {
            r->out->run_id, ae, ap, at, as, ax, r->o->actor ? r->o->actor : ""};
        rc = sl_pg_cmd(r->b, "journal the replay", SQL_JOURNAL_INSERT, 7, params, err);
    } else {
        const char *params[5] = {r->out->run_id, ae, ap, as, ax};
        rc = sl_pg_cmd(r->b, "journal the acknowledgements", SQL_JOURNAL_UPDATE, 5, params, err);
    }
    free(ae);
    free(ap);
    free(at);
    free(as);
    free(ax);
out:
    free(e);
    free(p);
    free(t);
    free(s);
    free(x);
    return rc;
}

/* The batch's rows another run had acknowledged (SQL_RECOVER_LOCKED): marked inside A's
 * transaction and set R_RECOVERED. 0 or SL_EPG. */
static int recover_locked(struct run *r, struct row *rows, int n, sl_err_t *err)
{
    const char **e = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **p = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **t = sl_xcalloc((size_t)n + 1, sizeof(char *));
    for (int i = 0; i < n; i++) {
        e[i] = rows[i].event_id;
        p[i] = rows[i].endpoint_id;
        t[i] = rows[i].dead_at;
    }
    char *ae = sl_pg_text_array(e, (size_t)n), *ap = sl_pg_text_array(p, (size_t)n);
    char *at = sl_pg_text_array(t, (size_t)n);
    const char *params[3] = {ae, ap, at};
    PGresult *res = sl_pg_exec(r->a, "mark letters another run had acknowledged",
                               SQL_RECOVER_LOCKED, 3, params, err);
    free(ae);
    free(ap);
    free(at);
    free(e);
    free(p);
    free(t);
    if (!res)
        return SL_EPG;
    for (int k = 0; k < PQntuples(res); k++) {
        const char *ev = sl_pg_str(res, k, "event_id");
        const char *ep = sl_pg_str(res, k, "endpoint_id");
        for (int i = 0; i < n; i++) {
            if (strcmp(rows[i].event_id, ev) == 0 && strcmp(rows[i].endpoint_id, ep) == 0) {
                free(rows[i].rec);
                rows[i].rec = NULL;
                rows[i].state = R_RECOVERED;
            }
        }
    }
    PQclear(res);
    return 0;
}

/* Mark the acknowledged rows replayed inside A's transaction; 0 or SL_EPG. */
static int mark(struct run *r, struct row *rows, int n, int *marked, sl_err_t *err)
{
    const char **e = sl_xcalloc((size_t)n + 1, sizeof(char *));
    const char **p = sl_xcalloc((size_t)n + 1, sizeof(char *));
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].state != R_ACKED)
            continue;
        e[k] = rows[i].event_id;
        p[k] = rows[i].endpoint_id;
        k++;
    }
    *marked = (int)k;
    int rc = 0;
    if (k > 0) {
        char *ae = sl_pg_text_array(e, k), *ap = sl_pg_text_array(p, k);
        const char *params[2] = {ae, ap};
        rc = sl_pg_cmd(r->a, "mark dead letters replayed", SQL_MARK, 2, params, err);
        free(ae);
        free(ap);
    }
    free(e);
    free(p);
    return rc;
}

/*
 * Hand every prepared row to the producer and wait (bounded) for the reports; rows end up
 * R_ACKED, R_FAILED, or still R_SENT when no report came in time (then purged).
 */
static void publish(struct run *r, struct row *rows, int n)
{
    r->cur = rows;
    r->cur_n = n;
    r->serial++;
    r->outstanding = 0;
    for (int i = 0; i < n; i++) {
        struct row *w = &rows[i];
        if (w->state != R_NEW)
            continue;
        sl_err_t perr;
        sl_err_clear(&perr);
        /* set before producing: a report may be served while sl_kafka_produce polls */
        w->state = R_SENT;
        r->outstanding++;
        if (sl_kafka_produce(r->rk, r->cfg->topic_deliveries, w->endpoint_id,
                             strlen(w->endpoint_id), w->rec, w->rec_len, msg_tag(r->serial, i),
                             ENQUEUE_WAIT_MS, &perr) != 0) {
            w->state = R_FAILED;
            r->outstanding--;
            (void)snprintf(w->error, sizeof(w->error), "%s", perr.msg);
        }
        free(w->rec); /* copied by the producer */
        w->rec = NULL;
    }
    int64_t deadline = sl_mono_ms() + SL_REPLAY_ACK_WAIT_MS;
    while (r->outstanding > 0 && sl_mono_ms() < deadline)
        rd_kafka_poll(r->rk, 100);
    if (r->outstanding > 0) {
        /* No report in time: purge (their reports come back as failures) and stop waiting;
         * rows still without a report are journalled as failed (state R_SENT). */
        rd_kafka_purge(r->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(r->rk, 1000);
    }
    r->cur = NULL;
    r->cur_n = 0;
}

static void warn(struct run *r, const char *msg)
{
    if (r->o->on_warning)
        r->o->on_warning(r->o->opaque, msg);
    else
        sl_warn("replay", "replay_warning", "%s", msg);
}

/* Count a committed row and report it to on_letter. */
static void settle(struct run *r, const struct row *w)
{
    struct sl_replay_letter l = {.event_id = w->event_id,
                                 .endpoint_id = w->endpoint_id,
                                 .unconfirmed = false,
                                 .error = w->error};
    if (w->state == R_RECOVERED) {
        r->out->recovered++; /* as at the start of a run: counted, not reported */
        return;
    }
    if (w->state == R_ACKED) {
        r->out->replayed++;
        r->out->unconfirmed += w->unconfirmed;
        l.outcome = SL_REPLAY_REPLAYED;
        l.unconfirmed = w->unconfirmed;
        l.error = "";
    } else if (w->state == R_INVALID) {
        r->out->invalid++;
        l.outcome = SL_REPLAY_INVALID;
    } else {
        r->out->failed++;
        l.outcome = SL_REPLAY_FAILED;
    }
    if (r->o->on_letter)
        r->o->on_letter(r->o->opaque, &l);
}

/*
 * One batch: select, journal, publish, journal acks, mark, commit. *done (OUT) = true when
 * nothing was left to select. Returns 0, or an error that ends the run (err filled).
 */
static int batch(struct run *r, int64_t want, bool *done, sl_err_t *err)
{
    char since[24], until[24], lim[24];
    char *ids_lit = NULL;
    const char *params[7];
    filter_params(r->sel, since, until, &ids_lit, params);
    (void)snprintf(lim, sizeof(lim), "%" PRId64, want);
    params[5] = r->out->run_id;
    params[6] = lim;
    struct row *rows = NULL;
    int n = 0, rc;
    PGresult *res = NULL;
    *done = false;
    rc = sl_pg_cmd(r->a, "begin a transaction", "begin", 0, NULL, err);
    if (rc != 0)
        goto out;
    res = sl_pg_exec(r->a, "select dead letters", SQL_SELECT, 7, params, err);
    if (!res) {
        rc = SL_EPG;
        goto rollback;
    }
    n = PQntuples(res);
    if (n == 0) {
        *done = true;
        rc = sl_pg_cmd(r->a, "end the transaction", "commit", 0, NULL, err);
        goto out;
    }
    rows = sl_xcalloc((size_t)n, sizeof(*rows));
    for (int i = 0; i < n; i++) {
        struct row *w = &rows[i];
        w->event_id = sl_xstrdup(sl_pg_str(res, i, "event_id"));
        w->endpoint_id = sl_xstrdup(sl_pg_str(res, i, "endpoint_id"));
        w->dead_at = sl_xstrdup(sl_pg_str(res, i, "dead_at"));
        const char *u = sl_pg_str(res, i, "unconfirmed");
        w->unconfirmed = u && u[0] == 't';
        size_t len = 0;
        unsigned char *payload =
            PQunescapeBytea((const unsigned char *)sl_pg_str(res, i, "payload"), &len);
        if (!payload) {
            w->state = R_INVALID;
            (void)snprintf(w->error, sizeof(w->error), "stored record could not be read");
        } else {
            prepare(r, w, payload, len);
            PQfreemem(payload);
        }
    }
    PQclear(res);
    res = NULL;
    rc = recover_locked(r, rows, n, err);
    if (rc != 0)
        goto rollback;
    /* The intent is durable before anything is sent. */
    rc = journal(r, rows, n, true, err);
    if (rc != 0)
        goto rollback;
    publish(r, rows, n);
    sl_err_t jerr;
    sl_err_clear(&jerr);
    bool journalled = journal(r, rows, n, false, &jerr) == 0;
    if (!journalled) {
        /* Marking in A still makes the replay exact; only crash safety of this batch is
         * weaker (a crash before A's commit would re-send it). */
        warn(r, jerr.msg);
    }
    int marked = 0;
    rc = mark(r, rows, n, &marked, err);
    if (rc == 0)
        rc = sl_pg_cmd(r->a, "commit the replay marks", "commit", 0, NULL, err);
    if (rc != 0) {
        if (journalled)
            r->out->unmarked += marked;
        else
            r->out->unmarked_lost += marked;
        for (int i = 0; i < n; i++) { /* not sent: the next run selects them again */
            r->out->invalid += rows[i].state == R_INVALID;
            r->out->failed += rows[i].state == R_FAILED || rows[i].state == R_SENT;
        }
        goto rollback;
    }
    for (int i = 0; i < n; i++)
        settle(r, &rows[i]);
    goto out;
rollback:
    if (PQstatus(r->a) == CONNECTION_OK) {
        PGresult *rb = PQexec(r->a, "rollback");
        PQclear(rb);
    }
out:
    PQclear(res);
    for (int i = 0; i < n && rows; i++)
        row_fini(&rows[i]);
    free(rows);
    free(ids_lit);
    return rc;
}

/* ==== Runs ==== */

/* Recover, open the producer, run the batches. */
static int run_batches(struct run *r, sl_err_t *err)
{
    PGresult *res = sl_pg_exec(r->b, "recover an interrupted replay",
                               "select sluice_replay_recover() as n", 0, NULL, err);
    if (!res)
        return SL_EPG;
    r->out->recovered = sl_pg_i64(res, 0, "n");
    PQclear(res);
    const char *role = r->o->kafka_role ? r->o->kafka_role : "sluice-replay";
    rd_kafka_conf_t *conf = sl_kafka_conf_new(r->cfg, role, err);
    if (!conf)
        return SL_EKAFKA;
    rd_kafka_conf_set_opaque(conf, r); /* dr_cb finds the batch through it */
    r->rk = sl_kafka_producer_new(r->cfg, role, SL_KAFKA_LATENCY, conf, dr_cb, err);
    if (!r->rk)
        return SL_EKAFKA;
    struct sl_replay_result *o = r->out;
    int64_t left = r->sel->limit > 0 ? r->sel->limit : INT64_MAX;
    while (left > 0) {
        if (r->o->stop && atomic_load(r->o->stop))
            return sl_err_set(err, SL_ESTATE,
                              "stopped before its next batch: the process is shutting down (a "
                              "new run continues with the letters left)");
        bool done = false;
        int64_t want = left < r->batch_size ? left : r->batch_size;
        int64_t before = o->replayed + o->failed + o->invalid;
        int rc = batch(r, want, &done, err);
        if (rc != 0)
            return rc;
        if (done)
            break;
        left -= o->replayed + o->failed + o->invalid - before;
    }
    return 0;
}

int sl_replay_run(PGconn *pg,
                  PGconn *journal_pg,
                  const struct sl_config *cfg,
                  const struct sl_replay_sel *sel,
                  const struct sl_replay_opts *opts,
                  struct sl_replay_result *out,
                  sl_err_t *err)
{
    memset(out, 0, sizeof(*out));
    int rc = sl_replay_sel_check(sel, err);
    if (rc != 0)
        return rc;
    if (opts->batch_size < 0 || opts->batch_size > SL_REPLAY_BATCH_MAX)
        return sl_err_set(err, SL_EINVAL, "invalid batch size: expected 1..%d",
                          SL_REPLAY_BATCH_MAX);
    if (!pg || !journal_pg || pg == journal_pg)
        return sl_err_set(err, SL_EINVAL, "a replay needs two distinct postgresql connections");
    unsigned char rnd[SL_REPLAY_RUN_ID_LEN / 2];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1)
        return sl_err_set(err, SL_ECRYPTO, "cannot generate a run id: no random bytes");
    sl_hex_encode(rnd, sizeof(rnd), out->run_id);
    rc = count_unsendable(pg, sel, &out->without_payload, &out->unregistered, err);
    if (rc != 0)
        return rc;
    out->started = true;
    struct run r = {.cfg = cfg,
                    .sel = sel,
                    .o = opts,
                    .out = out,
                    .a = pg,
                    .b = journal_pg,
                    .batch_size =
                        opts->batch_size > 0 ? opts->batch_size : SL_REPLAY_BATCH_DEFAULT};
    rc = run_batches(&r, err);
    if (r.rk) {
        rd_kafka_purge(r.rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(r.rk, 1000);
        rd_kafka_destroy(r.rk);
    }
    return rc;
}

int sl_replay_dry_run(PGconn *pg,
                      const struct sl_replay_sel *sel,
                      int64_t shown_max,
                      void (*on_candidate)(void *opaque, const struct sl_replay_candidate *c),
                      void *opaque,
                      struct sl_replay_dry_result *out,
                      sl_err_t *err)
{
    memset(out, 0, sizeof(*out));
    int rc = sl_replay_sel_check(sel, err);
    if (rc != 0)
        return rc;
    rc = count_unsendable(pg, sel, &out->without_payload, &out->unregistered, err);
    if (rc != 0)
        return rc;
    char since[24], until[24], lim[24];
    char *ids_lit = NULL;
    const char *params[6];
    filter_params(sel, since, until, &ids_lit, params);
    int64_t limit = sel->limit > 0 ? sel->limit : INT64_MAX;
    (void)snprintf(lim, sizeof(lim), "%" PRId64, limit);
    params[5] = lim;
    PGresult *res = NULL;
    if (shown_max > 0 && shown_max < limit) {
        res = sl_pg_exec(pg, "count dead letters", SQL_DRY_COUNT, 6, params, err);
        if (!res) {
            free(ids_lit);
            return SL_EPG;
        }
        out->would_replay = sl_pg_i64(res, 0, "n");
        PQclear(res);
        (void)snprintf(lim, sizeof(lim), "%" PRId64, shown_max);
    }
    res = sl_pg_exec(pg, "select dead letters", SQL_DRY, 6, params, err);
    free(ids_lit);
    if (!res)
        return SL_EPG;
    int n = PQntuples(res);
    if (out->would_replay < n)
        out->would_replay = n;
    for (int i = 0; on_candidate && i < n; i++) {
        struct sl_replay_candidate c = {
            .event_id = sl_pg_str(res, i, "event_id"),
            .endpoint_id = sl_pg_str(res, i, "endpoint_id"),
            .dead_ms = sl_pg_i64(res, i, "dead_ms"),
            .error_class = sl_pg_str(res, i, "error_class"),
            .has_last_status = !sl_pg_null(res, i, "last_status"),
            .last_status = sl_pg_i64(res, i, "last_status"),
            .attempts = sl_pg_i64(res, i, "attempts"),
            .replay_count = sl_pg_i64(res, i, "replay_count"),
            .bytes = sl_pg_i64(res, i, "bytes"),
        };
        on_candidate(opaque, &c);
    }
    PQclear(res);
    return 0;
}
