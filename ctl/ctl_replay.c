/*
 * ctl_replay: `sluicectl replay` (see ctl_replay.h).
 *
 * One run, per batch of at most --batch-size letters:
 *
 *   A (transaction)   select the letters FOR UPDATE SKIP LOCKED
 *   B (autocommit)    journal them as 'sending'                 <- before anything is sent
 *   Kafka             publish, wait for every acknowledgement (idempotent, acks=all)
 *   B (autocommit)    journal the acknowledged as 'acked', the others as 'failed'
 *   A                 mark the acknowledged replayed; COMMIT
 *
 * Two connections because the journal rows must be durable while A still holds the letters
 * locked (so concurrent runs skip them) and before A's marking commits. Before the first batch
 * the run calls sluice_replay_recover(), which marks letters an interrupted run got
 * acknowledged but could not mark, instead of sending them again. A letter whose publish was
 * never acknowledged (or failed) stays unmarked and is picked up by the next run; within one
 * run it is not retried (the selection skips letters this run has journalled).
 *
 * Messages name counts, endpoints, event ids and error classes, never payloads.
 */
#include "ctl/ctl_replay.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <openssl/rand.h>

#include "common/sl_kafka.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_record.h"
#include "ctl/ctl_ops.h"

#define IDS_MAX         10000    /* event ids given with --ids */
#define LIMIT_MAX       10000000 /* --limit */
#define BATCH_DEFAULT   500      /* letters per transaction */
#define BATCH_MAX       10000
#define ENQUEUE_WAIT_MS 10000 /* a full local producer queue, per record */
#define ACK_GRACE_MS    10000 /* beyond the producer's 120 s message timeout */
#define ACK_WAIT_MS     (120000 + ACK_GRACE_MS)
#define FAILURES_SHOWN  20 /* failures listed in text output */

/* ==== Options ==== */

struct opts {
    const char *endpoint; /* --endpoint (borrowed); NULL = any */
    int64_t since_ms;     /* --since, unix ms (has_since) */
    int64_t until_ms;     /* --until, unix ms, exclusive (has_until) */
    bool has_since, has_until;
    const char *error_class; /* --error (borrowed); NULL = any */
    char **ids;              /* --ids, split (owned strings) */
    size_t n_ids;            /* entries in ids */
    int64_t limit;           /* --limit; 0 = all */
    int64_t batch;           /* --batch-size */
    bool all;                /* --all */
    bool dry_run;            /* --dry-run */
    bool json;               /* --json */
};

enum { O_ENDPOINT = 256, O_SINCE, O_UNTIL, O_ERROR, O_IDS, O_LIMIT, O_ALL, O_BATCH, O_DRY, O_JSON };

static const struct option longopts[] = {{"endpoint", required_argument, NULL, O_ENDPOINT},
                                         {"since", required_argument, NULL, O_SINCE},
                                         {"until", required_argument, NULL, O_UNTIL},
                                         {"error", required_argument, NULL, O_ERROR},
                                         {"ids", required_argument, NULL, O_IDS},
                                         {"limit", required_argument, NULL, O_LIMIT},
                                         {"all", no_argument, NULL, O_ALL},
                                         {"batch-size", required_argument, NULL, O_BATCH},
                                         {"dry-run", no_argument, NULL, O_DRY},
                                         {"json", no_argument, NULL, O_JSON},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};

void ctl_replay_help(FILE *f)
{
    fprintf(f,
            "usage: sluicectl replay [--endpoint ID] [--since T] [--until T] [--error CLASS]\n"
            "                        [--ids ID,ID...] [--limit N] [--all] [--batch-size N]\n"
            "                        [--dry-run] [--json]\n"
            "\n"
            "Re-publishes dead letters to topic_deliveries (their stored delivery record, with\n"
            "attempt 0 and replay=true: a fresh delivery with a new attempt budget) and marks\n"
            "them replayed. Only letters not replayed since their latest death and not\n"
            "resolved are selected, oldest death first, so running it twice sends nothing the\n"
            "second time; concurrent runs share the work (FOR UPDATE SKIP LOCKED). Fix the\n"
            "endpoint first (sluicectl endpoints update): a replay to a broken endpoint just\n"
            "dies again.\n"
            "\n"
            "Selection (at least one, or --all):\n"
            "  --endpoint ID       dead letters of one endpoint\n"
            "  --since T           died at or after T: RFC 3339 (2026-11-30T13:00:00Z) or a\n"
            "                      duration ago (90m, 2h, 7d)\n"
            "  --until T           died before T (same forms)\n"
            "  --error CLASS       error class ([a-z0-9_]: http_4xx, timeout, http_5xx, ...)\n"
            "  --ids ID,ID...      event ids (repeatable; an id containing a comma cannot be\n"
            "                      given here)\n"
            "  --limit N           at most N letters\n"
            "  --all               every dead letter not yet replayed\n"
            "Other flags:\n"
            "  --batch-size N      letters per transaction (default 500): each batch's rows stay\n"
            "                      locked while it is published\n"
            "  --dry-run           list what would be replayed; send and change nothing\n"
            "  --json              machine-readable output\n"
            "\n"
            "Letters without a stored record (the consumer kept none) cannot be replayed and\n"
            "are counted separately. Exit: 0 every selected letter was published, acknowledged\n"
            "and marked; 1 some failed (the rest are done; failed ones stay selectable); 2\n"
            "usage; 78 configuration.\n");
}

static bool valid_error_class(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > SL_ERR_CLASS_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

static void opts_fini(struct opts *o)
{
    for (size_t i = 0; i < o->n_ids; i++)
        free(o->ids[i]);
    free(o->ids);
    o->ids = NULL;
    o->n_ids = 0;
}

/* Split one --ids value into o->ids; 0 or CTL_EXIT_USAGE. */
static int add_ids(struct opts *o, const char *arg)
{
    const char *p = arg;
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || !sl_valid_event_id(p, n))
            return ctl_usage_error("replay",
                                   "invalid value for --ids: expected comma-separated event ids "
                                   "(1..128 visible characters except '.', none empty)");
        if (o->n_ids == IDS_MAX)
            return ctl_usage_error("replay", "too many --ids: at most %d", IDS_MAX);
        o->ids = sl_xrealloc(o->ids, (o->n_ids + 1) * sizeof(*o->ids));
        o->ids[o->n_ids++] = sl_xstrndup(p, n);
        if (p[n] == '\0')
            return 0;
        p += n + 1;
    }
}

static int parse_opts(int argc, char **argv, struct opts *o, bool *help)
{
    int64_t now = sl_now_ms();
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        int rc = 0;
        switch (ch) {
        case 'h':
            *help = true;
            return 0;
        case O_ENDPOINT:
            if (!sl_valid_endpoint_id(optarg, strlen(optarg)))
                return ctl_usage_error("replay", "invalid value for --endpoint: expected 1..64 "
                                                 "characters [A-Za-z0-9_-]");
            o->endpoint = optarg;
            break;
        case O_SINCE:
        case O_UNTIL:
            if (ctl_ops_time_parse(optarg, now, ch == O_SINCE ? &o->since_ms : &o->until_ms) != 0)
                return ctl_usage_error("replay",
                                       "invalid value for %s: expected an RFC 3339 time "
                                       "(2026-11-30T13:00:00Z) or a duration ago (90m, 2h, 7d)",
                                       ch == O_SINCE ? "--since" : "--until");
            if (ch == O_SINCE)
                o->has_since = true;
            else
                o->has_until = true;
            break;
        case O_ERROR:
            if (!valid_error_class(optarg))
                return ctl_usage_error("replay", "invalid value for --error: expected an error "
                                                 "class of 1..32 characters [a-z0-9_]");
            o->error_class = optarg;
            break;
        case O_IDS:
            rc = add_ids(o, optarg);
            break;
        case O_LIMIT:
            rc = ctl_parse_int("replay", "--limit", optarg, 1, LIMIT_MAX, false, &o->limit);
            break;
        case O_BATCH:
            rc = ctl_parse_int("replay", "--batch-size", optarg, 1, BATCH_MAX, false, &o->batch);
            break;
        case O_ALL:
            o->all = true;
            break;
        case O_DRY:
            o->dry_run = true;
            break;
        case O_JSON:
            o->json = true;
            break;
        default:
            return ctl_getopt_error("replay", ch, longopts, argv);
        }
        if (rc != 0)
            return rc;
    }
    if (optind < argc) {
        size_t n = strcspn(argv[optind], "=");
        return ctl_usage_error("replay", "unexpected argument '%.*s'", (int)n, argv[optind]);
    }
    if (o->has_since && o->has_until && o->since_ms >= o->until_ms)
        return ctl_usage_error("replay", "--since must be before --until");
    bool selector = o->endpoint || o->has_since || o->has_until || o->error_class || o->n_ids > 0 ||
                    o->limit > 0;
    if (!selector && !o->all)
        return ctl_usage_error("replay",
                               "choose what to replay: --endpoint, --since/--until, --error, "
                               "--ids or --limit, or --all for every dead letter not yet "
                               "replayed");
    return 0;
}

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

/* A run's batch: $6 run id (its own journal rows are skipped), $7 batch size. */
static const char SQL_SELECT[] =
    "select d.event_id, d.endpoint_id, d.dead_at::text as dead_at, d.payload,"
    "       exists (select 1 from replay_log l where l.event_id = d.event_id"
    "                  and l.endpoint_id = d.endpoint_id and l.dead_at = d.dead_at"
    "                  and l.state = 'sending') as unconfirmed"
    "  from dead_letters d"
    " where" FILTER_SQL " and d.payload is not null"
    "   and not exists (select 1 from replay_log l where l.run_id = $6"
    "                      and l.event_id = d.event_id and l.endpoint_id = d.endpoint_id)"
    " order by d.dead_at, d.endpoint_id, d.event_id"
    " limit $7::bigint"
    " for update of d skip locked";

/* --dry-run: what a run would select now (letters locked by a running replay included). */
static const char SQL_DRY[] =
    "select d.event_id, d.endpoint_id, (extract(epoch from d.dead_at) * 1000)::bigint as dead_ms,"
    "       d.error_class, d.last_status, d.attempts, d.replay_count, length(d.payload) as bytes"
    "  from dead_letters d"
    " where" FILTER_SQL " and d.payload is not null"
    " order by d.dead_at, d.endpoint_id, d.event_id"
    " limit $6::bigint";

/* Letters matching the selection that cannot be replayed (no stored record). */
static const char SQL_NOPAYLOAD[] =
    "select count(*) as n from dead_letters d where" FILTER_SQL " and d.payload is null";

static const char SQL_JOURNAL_INSERT[] =
    "insert into replay_log (run_id, event_id, endpoint_id, dead_at, state, error)"
    " select $1, u.e, u.p, u.t::timestamptz, u.s, nullif(u.x, '')"
    "   from unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])"
    "        as u(e, p, t, s, x)";

static const char SQL_JOURNAL_UPDATE[] =
    "update replay_log l"
    "   set state = u.s, acked_at = case when u.s = 'acked' then now() end,"
    "       error = nullif(u.x, '')"
    "  from unnest($2::text[], $3::text[], $4::text[], $5::text[]) as u(e, p, s, x)"
    " where l.run_id = $1 and l.event_id = u.e and l.endpoint_id = u.p";

static const char SQL_MARK[] =
    "update dead_letters d set replayed_at = now(), replay_count = d.replay_count + 1"
    "  from unnest($1::text[], $2::text[]) as u(e, p)"
    " where d.event_id = u.e and d.endpoint_id = u.p";

/* ==== One letter of a batch ==== */

enum row_state {
    R_NEW = 0, /* selected */
    R_INVALID, /* stored record does not decode or belongs to another key: not sent */
    R_SENT,    /* handed to the producer, no report yet */
    R_ACKED,   /* Kafka acknowledged it */
    R_FAILED,  /* could not be produced, or Kafka reported a failure, or no report in time */
};

struct row {
    char *event_id;                  /* owned */
    char *endpoint_id;               /* owned */
    char *dead_at;                   /* dead_letters.dead_at as text (exact round trip); owned */
    uint8_t *rec;                    /* re-encoded delivery record (malloc'd), NULL if invalid */
    size_t rec_len;                  /* bytes */
    bool unconfirmed;                /* an interrupted earlier run left it 'sending' */
    enum row_state state;            /* where it is */
    char error[SL_ERR_MSG_MAX + 64]; /* why invalid or failed */
};

/* Per-endpoint counts for the summary (sl_map value). */
struct ep_count {
    int64_t replayed; /* acknowledged and marked */
    int64_t failed;   /* invalid or publish failed */
};

/* Everything a run accumulates. */
struct run {
    const struct sl_config *cfg; /* borrowed */
    const struct opts *o;        /* borrowed */
    char run_id[33];             /* 128 random bits, hex */
    PGconn *a;                   /* selection + marking transaction */
    PGconn *b;                   /* journal, autocommit */
    rd_kafka_t *rk;              /* producer */
    struct row *cur;             /* the batch being published (borrowed from batch()) */
    int cur_n;                   /* rows in cur */
    uint64_t serial;             /* batch number, tags each message */
    int outstanding;             /* records of the batch sent without a report yet */
    int64_t recovered;           /* marked by sluice_replay_recover() */
    int64_t replayed;            /* acknowledged and marked */
    int64_t failed;              /* publish failed or unacknowledged */
    int64_t invalid;             /* stored record unusable */
    int64_t unconfirmed;         /* re-sent after an interrupted run's unconfirmed publish */
    int64_t unmarked;            /* acknowledged, journalled, but the marking failed */
    int64_t unmarked_lost;       /* acknowledged, neither journalled nor marked */
    int64_t without_payload;     /* matching letters without a stored record */
    sl_map_t *per_ep;            /* endpoint id -> struct ep_count */
    json_t *failures;            /* [{event_id, endpoint_id, error}] */
};

static struct ep_count *ep_count(struct run *r, const char *ep)
{
    struct ep_count *c = sl_map_get(r->per_ep, ep);
    if (!c) {
        c = sl_xcalloc(1, sizeof(*c));
        sl_map_put(r->per_ep, ep, c, NULL);
    }
    return c;
}

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

/* Delivery report: runs inside rd_kafka_poll/flush on this thread; opaque is the run. */
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
        snprintf(w->error, sizeof(w->error), "kafka: %s", rd_kafka_err2str(m->err));
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
        snprintf(w->error, sizeof(w->error), "stored record does not decode: %s", err.msg);
        sl_delivery_fini(&d);
        return;
    }
    if (strcmp(d.id, w->event_id) != 0 || strcmp(d.ep, w->endpoint_id) != 0) {
        w->state = R_INVALID;
        snprintf(w->error, sizeof(w->error), "stored record belongs to another event");
        sl_delivery_fini(&d);
        return;
    }
    d.attempt = 0;
    d.replay = true;
    struct sl_buf b;
    sl_buf_init(&b, (size_t)r->cfg->max_body_bytes + SL_RECORD_OVERHEAD);
    if (sl_delivery_encode_lim(&d, &lim, &b, &err) != 0) {
        w->state = R_INVALID;
        snprintf(w->error, sizeof(w->error), "stored record cannot be re-encoded: %s", err.msg);
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
                snprintf(rows[i].error, sizeof(rows[i].error), "not acknowledged within %d ms",
                         ACK_WAIT_MS);
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
    char *ae = ctl_ops_pg_text_array(e, k), *ap = ctl_ops_pg_text_array(p, k);
    char *at = ctl_ops_pg_text_array(t, k), *as = ctl_ops_pg_text_array(s, k);
    char *ax = ctl_ops_pg_text_array(x, k);
    int rc;
    if (insert) {
        const char *params[6] = {r->run_id, ae, ap, at, as, ax};
        rc = sl_pg_cmd(r->b, "journal the replay", SQL_JOURNAL_INSERT, 6, params, err);
    } else {
        const char *params[5] = {r->run_id, ae, ap, as, ax};
        rc = sl_pg_cmd(r->b, "journal the acknowledgements", SQL_JOURNAL_UPDATE, 5, params, err);
    }
    free(ae);
    free(ap);
    free(at);
    free(as);
    free(ax);
    free(e);
    free(p);
    free(t);
    free(s);
    free(x);
    return rc;
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
        char *ae = ctl_ops_pg_text_array(e, k), *ap = ctl_ops_pg_text_array(p, k);
        const char *params[2] = {ae, ap};
        rc = sl_pg_cmd(r->a, "mark dead letters replayed", SQL_MARK, 2, params, err);
        free(ae);
        free(ap);
    }
    free(e);
    free(p);
    return rc;
}

static void note_failure(struct run *r, const struct row *w)
{
    json_array_append_new(r->failures, json_pack("{s:s, s:s, s:s}", "event_id", w->event_id,
                                                 "endpoint_id", w->endpoint_id, "error", w->error));
    ep_count(r, w->endpoint_id)->failed++;
}

/* The filter parameters ($1..$5) of o; ids_lit is an owned array literal or NULL. */
static void filter_params(
    const struct opts *o, char since[24], char until[24], char **ids_lit, const char *params[5])
{
    snprintf(since, 24, "%" PRId64, o->since_ms);
    snprintf(until, 24, "%" PRId64, o->until_ms);
    *ids_lit = o->n_ids ? ctl_ops_pg_text_array((const char *const *)o->ids, o->n_ids) : NULL;
    params[0] = o->endpoint;
    params[1] = o->has_since ? since : NULL;
    params[2] = o->has_until ? until : NULL;
    params[3] = o->error_class;
    params[4] = *ids_lit;
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
            snprintf(w->error, sizeof(w->error), "%s", perr.msg);
        }
        free(w->rec); /* copied by the producer */
        w->rec = NULL;
    }
    int64_t deadline = sl_mono_ms() + ACK_WAIT_MS;
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

/*
 * One batch: select, journal, publish, journal acks, mark, commit. *done (OUT) = true when
 * nothing was left to select. Returns 0, or an error that ends the run (err filled).
 */
static int batch(struct run *r, int64_t want, bool *done, sl_err_t *err)
{
    const struct opts *o = r->o;
    char since[24], until[24], lim[24];
    char *ids_lit = NULL;
    const char *params[7];
    filter_params(o, since, until, &ids_lit, params);
    snprintf(lim, sizeof(lim), "%" PRId64, want);
    params[5] = r->run_id;
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
        w->event_id = sl_xstrdup(ctl_ops_pg_str(res, i, "event_id"));
        w->endpoint_id = sl_xstrdup(ctl_ops_pg_str(res, i, "endpoint_id"));
        w->dead_at = sl_xstrdup(ctl_ops_pg_str(res, i, "dead_at"));
        const char *u = ctl_ops_pg_str(res, i, "unconfirmed");
        w->unconfirmed = u && u[0] == 't';
        size_t len = 0;
        unsigned char *payload =
            PQunescapeBytea((const unsigned char *)ctl_ops_pg_str(res, i, "payload"), &len);
        if (!payload) {
            w->state = R_INVALID;
            snprintf(w->error, sizeof(w->error), "stored record could not be read");
        } else {
            prepare(r, w, payload, len);
            PQfreemem(payload);
        }
    }
    PQclear(res);
    res = NULL;
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
        fprintf(stderr, "sluicectl replay: warning: %s\n", jerr.msg);
    }
    int marked = 0;
    rc = mark(r, rows, n, &marked, err);
    if (rc == 0)
        rc = sl_pg_cmd(r->a, "commit the replay marks", "commit", 0, NULL, err);
    if (rc != 0) {
        if (journalled)
            r->unmarked += marked;
        else
            r->unmarked_lost += marked;
        goto rollback;
    }
    for (int i = 0; i < n; i++) {
        struct row *w = &rows[i];
        if (w->state == R_ACKED) {
            r->replayed++;
            r->unconfirmed += w->unconfirmed;
            ep_count(r, w->endpoint_id)->replayed++;
        } else {
            if (w->state == R_INVALID)
                r->invalid++;
            else
                r->failed++;
            note_failure(r, w);
        }
    }
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

/* ==== Output ==== */

static void print_run(struct run *r, int rc, const sl_err_t *err)
{
    const struct opts *o = r->o;
    size_t pos = 0;
    const char *key;
    void *val;
    if (o->json) {
        json_t *eps = json_array();
        while (sl_map_next(r->per_ep, &pos, &key, &val)) {
            struct ep_count *c = val;
            json_array_append_new(eps, json_pack("{s:s, s:I, s:I}", "endpoint_id", key, "replayed",
                                                 (json_int_t)c->replayed, "failed",
                                                 (json_int_t)c->failed));
        }
        json_t *j =
            json_pack("{s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:O}", "run_id",
                      r->run_id, "dry_run", 0, "topic", r->cfg->topic_deliveries, "recovered",
                      (json_int_t)r->recovered, "replayed", (json_int_t)r->replayed, "failed",
                      (json_int_t)r->failed, "invalid", (json_int_t)r->invalid,
                      "unconfirmed_resent", (json_int_t)r->unconfirmed, "acknowledged_unmarked",
                      (json_int_t)r->unmarked + (json_int_t)r->unmarked_lost, "without_payload",
                      (json_int_t)r->without_payload, "endpoints", eps, "failures", r->failures);
        if (rc != 0)
            json_object_set_new(j, "error", json_string(err->msg));
        ctl_ops_print_json(j);
        return;
    }
    printf("replay run %s: %" PRId64 " dead letter%s re-published to %s and marked replayed\n",
           r->run_id, r->replayed, r->replayed == 1 ? "" : "s", r->cfg->topic_deliveries);
    if (r->recovered > 0)
        printf("  %" PRId64 " acknowledged by an interrupted earlier run: marked without sending "
               "again\n",
               r->recovered);
    if (r->unconfirmed > 0)
        printf("  %" PRId64 " of them had an unconfirmed publish from an interrupted run (sent "
               "again; the earlier copy may also be in Kafka)\n",
               r->unconfirmed);
    if (r->without_payload > 0)
        printf("  %" PRId64 " matching dead letter%s without a stored record cannot be "
               "replayed\n",
               r->without_payload, r->without_payload == 1 ? "" : "s");
    if (sl_map_count(r->per_ep) > 0) {
        static const char *const head[] = {"endpoint", "replayed", "failed"};
        struct ctl_table tb;
        ctl_table_init(&tb, 3, head, "lrr");
        while (sl_map_next(r->per_ep, &pos, &key, &val)) {
            struct ep_count *c = val;
            ctl_table_add(&tb, "%s", key);
            ctl_table_add(&tb, "%" PRId64, c->replayed);
            ctl_table_add(&tb, "%" PRId64, c->failed);
        }
        putchar('\n');
        ctl_table_print(&tb, stdout, 2);
        ctl_table_fini(&tb);
    }
    if (r->failed + r->invalid > 0) {
        printf("\n%" PRId64 " not replayed (still selectable by the next run):\n",
               r->failed + r->invalid);
        size_t i;
        json_t *f;
        json_array_foreach(r->failures, i, f)
        {
            if (i == FAILURES_SHOWN) {
                printf("  ... (%zu more; --json lists all)\n", json_array_size(r->failures) - i);
                break;
            }
            printf("  %s %s: %s\n", json_string_value(json_object_get(f, "endpoint_id")),
                   json_string_value(json_object_get(f, "event_id")),
                   json_string_value(json_object_get(f, "error")));
        }
    }
}

static int dry_run(struct run *r)
{
    const struct opts *o = r->o;
    char since[24], until[24], lim[24];
    char *ids_lit = NULL;
    const char *params[6];
    filter_params(o, since, until, &ids_lit, params);
    snprintf(lim, sizeof(lim), "%" PRId64, o->limit > 0 ? o->limit : (int64_t)INT64_MAX);
    params[5] = lim;
    sl_err_t err;
    sl_err_clear(&err);
    PGresult *res = sl_pg_exec(r->a, "select dead letters", SQL_DRY, 6, params, &err);
    free(ids_lit);
    if (!res)
        return ctl_fail("replay", "%s", err.msg);
    int n = PQntuples(res);
    if (o->json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) {
            char t[40];
            ctl_ops_fmt_ms(ctl_ops_pg_i64(res, i, "dead_ms"), t, sizeof(t));
            json_t *e =
                json_pack("{s:s, s:s, s:s, s:s?, s:o, s:I, s:I, s:I}", "event_id",
                          ctl_ops_pg_str(res, i, "event_id"), "endpoint_id",
                          ctl_ops_pg_str(res, i, "endpoint_id"), "dead_at", t, "error_class",
                          ctl_ops_pg_str(res, i, "error_class"), "last_status",
                          ctl_ops_pg_null(res, i, "last_status")
                              ? json_null()
                              : json_integer(ctl_ops_pg_i64(res, i, "last_status")),
                          "attempts", (json_int_t)ctl_ops_pg_i64(res, i, "attempts"),
                          "replay_count", (json_int_t)ctl_ops_pg_i64(res, i, "replay_count"),
                          "bytes", (json_int_t)ctl_ops_pg_i64(res, i, "bytes"));
            json_array_append_new(arr, e);
        }
        ctl_ops_print_json(json_pack("{s:b, s:s, s:i, s:I, s:o}", "dry_run", 1, "topic",
                                     r->cfg->topic_deliveries, "would_replay", n, "without_payload",
                                     (json_int_t)r->without_payload, "letters", arr));
    } else {
        printf("dry run: %d dead letter%s would be re-published to %s\n", n, n == 1 ? "" : "s",
               r->cfg->topic_deliveries);
        if (r->without_payload > 0)
            printf("  %" PRId64 " matching dead letter%s without a stored record cannot be "
                   "replayed\n",
                   r->without_payload, r->without_payload == 1 ? "" : "s");
        for (int i = 0; i < n; i++)
            ep_count(r, ctl_ops_pg_str(res, i, "endpoint_id"))->replayed++;
        if (n > 0) {
            static const char *const head[] = {"endpoint", "would replay"};
            struct ctl_table tb;
            ctl_table_init(&tb, 2, head, "lr");
            size_t pos = 0;
            const char *key;
            void *val;
            while (sl_map_next(r->per_ep, &pos, &key, &val)) {
                ctl_table_add(&tb, "%s", key);
                ctl_table_add(&tb, "%" PRId64, ((struct ep_count *)val)->replayed);
            }
            putchar('\n');
            ctl_table_print(&tb, stdout, 2);
            ctl_table_fini(&tb);
        }
    }
    PQclear(res);
    return CTL_EXIT_OK;
}

/* ==== Entry point ==== */

static int count_without_payload(struct run *r, sl_err_t *err)
{
    char since[24], until[24];
    char *ids_lit = NULL;
    const char *params[5];
    filter_params(r->o, since, until, &ids_lit, params);
    PGresult *res =
        sl_pg_exec(r->a, "count dead letters without a record", SQL_NOPAYLOAD, 5, params, err);
    free(ids_lit);
    if (!res)
        return SL_EPG;
    r->without_payload = ctl_ops_pg_i64(res, 0, "n");
    PQclear(res);
    return 0;
}

static int run_replay(struct run *r, sl_err_t *err)
{
    PGresult *res = sl_pg_exec(r->b, "recover an interrupted replay",
                               "select sluice_replay_recover() as n", 0, NULL, err);
    if (!res)
        return SL_EPG;
    r->recovered = ctl_ops_pg_i64(res, 0, "n");
    PQclear(res);
    rd_kafka_conf_t *conf = sl_kafka_conf_new(r->cfg, "sluicectl-replay", err);
    if (!conf)
        return SL_EKAFKA;
    rd_kafka_conf_set_opaque(conf, r); /* dr_cb finds the batch through it */
    r->rk = sl_kafka_producer_new(r->cfg, "sluicectl-replay", SL_KAFKA_LATENCY, conf, dr_cb, err);
    if (!r->rk)
        return SL_EKAFKA;
    int64_t left = r->o->limit > 0 ? r->o->limit : INT64_MAX;
    while (left > 0) {
        bool done = false;
        int64_t want = left < r->o->batch ? left : r->o->batch;
        int64_t before = r->replayed + r->failed + r->invalid;
        int rc = batch(r, want, &done, err);
        if (rc != 0)
            return rc;
        if (done)
            break;
        left -= r->replayed + r->failed + r->invalid - before;
    }
    return 0;
}

int ctl_replay_main(struct ctl *c, int argc, char **argv)
{
    struct opts o = {.batch = BATCH_DEFAULT};
    bool help = false;
    int rc = parse_opts(argc, argv, &o, &help);
    if (help) {
        ctl_replay_help(stdout);
        opts_fini(&o);
        return CTL_EXIT_OK;
    }
    if (rc != 0) {
        opts_fini(&o);
        return rc;
    }
    struct run r;
    memset(&r, 0, sizeof(r));
    r.cfg = ctl_config(c);
    r.o = &o;
    r.per_ep = sl_map_new(16);
    r.failures = json_array();
    sl_err_t err;
    sl_err_clear(&err);
    unsigned char rnd[16];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        rc = ctl_fail("replay", "cannot generate a run id: no random bytes");
        goto out;
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(r.run_id + 2 * i, 3, "%02x", rnd[i]);
    r.a = ctl_ops_pg_open(r.cfg, &err);
    if (!r.a) {
        rc = ctl_fail("replay", "%s", err.msg);
        goto out;
    }
    if (count_without_payload(&r, &err) != 0) {
        rc = ctl_fail("replay", "%s", err.msg);
        goto out;
    }
    if (o.dry_run) {
        rc = dry_run(&r);
        goto out;
    }
    r.b = ctl_ops_pg_open(r.cfg, &err);
    if (!r.b) {
        rc = ctl_fail("replay", "%s", err.msg);
        goto out;
    }
    int err_rc = run_replay(&r, &err);
    print_run(&r, err_rc, &err);
    rc = CTL_EXIT_OK;
    if (err_rc != 0)
        rc = ctl_fail("replay", "%s", err.msg);
    if (r.unmarked > 0)
        rc = ctl_fail("replay",
                      "%" PRId64 " acknowledged records could not be marked replayed; the "
                      "journal has them, and the next replay run marks them without sending",
                      r.unmarked);
    if (r.unmarked_lost > 0)
        rc = ctl_fail("replay",
                      "%" PRId64 " acknowledged records could be neither journalled nor marked "
                      "replayed: the next replay run sends them again",
                      r.unmarked_lost);
    if (r.failed + r.invalid > 0)
        rc = ctl_fail("replay", "%" PRId64 " dead letters were not replayed", r.failed + r.invalid);
out:
    if (r.rk) {
        rd_kafka_purge(r.rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(r.rk, 1000);
        rd_kafka_destroy(r.rk);
    }
    if (r.per_ep)
        sl_map_destroy(r.per_ep, free);
    json_decref(r.failures);
    PQfinish(r.a);
    PQfinish(r.b);
    opts_fini(&o);
    return rc;
}
