/*
 * ctl_retries: `sluicectl retries rebuild` (see ctl_retries.h).
 *
 * Pass 1 reads the open deliveries through a cursor (one REPEATABLE READ snapshot), checks in
 * Redis which already have a job (pipelined EXISTS), and schedules those whose record is in
 * pending_payloads. The rest wait in a map keyed "<endpoint>\n<event>" for pass 2, which reads
 * topic_deliveries partition by partition from the offset of (oldest open delivery - lookback)
 * up to the high watermark seen at the start, schedules the first record found for each
 * wanted key, and stops early when nothing is wanted any more. Records are skipped on their
 * Kafka key (the endpoint id) before being decoded.
 *
 * Known limits (reported, never guessed around): a record deleted by the topic's retention,
 * or produced before the lookback, is not recoverable; deliveries the recorder has not
 * written yet (it lags) are not in the history at all, and ones it has not marked finished
 * yet may be scheduled again (the consumer then sends them once more unless a delivered
 * marker survives): the command prints the recorder's lag first.
 */
#include "ctl/ctl_retries.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_kafka.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"
#include "common/sl_record.h"
#include "common/sl_redis.h"
#include "common/sl_rstate.h"
#include "common/sl_time.h"
#include "ctl/ctl_ops.h"

#define FETCH_ROWS        500 /* rows per cursor fetch (and per EXISTS pipeline) */
#define FETCH_SQL         "fetch 500 from open_deliveries" /* FETCH_ROWS rows */
#define KAFKA_TIMEOUT_MS  10000                            /* per metadata / offsets request */
#define LOOKBACK_DEFAULT  3600                             /* s */
#define SCAN_TIMEOUT_S    600                              /* s; whole topic scan */
#define UNRECOVERABLE_MAX 20                               /* listed in text output */

enum { O_DRY = 256, O_LOOKBACK, O_NO_KAFKA, O_SCAN_TIMEOUT, O_JSON };

struct opts {
    bool dry_run;           /* --dry-run */
    int64_t lookback_s;     /* --lookback, s */
    bool no_kafka;          /* --no-kafka */
    int64_t scan_timeout_s; /* --scan-timeout, s */
    bool json;              /* --json */
};

/* A delivery waiting for its record from the topic (sl_map value). */
struct want {
    char *event_id;    /* owned */
    char *endpoint_id; /* owned */
    int64_t attempts;  /* attempts spent (deliveries.attempts) */
    int64_t due_ms;    /* unix ms */
    bool found;        /* scheduled (or, dry run, would be) from the topic */
};

struct rebuild {
    const struct sl_config *cfg; /* borrowed */
    const struct opts *o;        /* borrowed */
    sl_redis_t *redis;           /* connection */
    int64_t now_ms;              /* start of the run, unix ms */
    int64_t open;                /* open deliveries in the history */
    int64_t open_retry;          /* of which retry_scheduled */
    int64_t open_deferred;       /* of which deferred */
    int64_t existed;             /* already had a job */
    int64_t from_pg;             /* scheduled from pending_payloads */
    int64_t bad_pg;              /* pending_payloads record unusable (tried the topic then) */
    int64_t from_kafka;          /* scheduled from the topic */
    int64_t raced;               /* a job appeared between the check and the put */
    int64_t oldest_ms;           /* oldest open delivery (created or first seen), unix ms */
    int64_t scan_from_ms;        /* topic read from this time, unix ms (0 = not read) */
    int64_t scanned;             /* topic records read */
    bool scan_complete;          /* every partition was read to its end mark */
    size_t nfound;               /* wanted deliveries whose record the topic gave */
    sl_map_t *wanted;            /* "<ep>\n<id>" -> struct want */
    sl_map_t *wanted_eps;        /* endpoint ids present in wanted (values unused) */
    struct sl_buf enc;           /* job body being encoded */
};

void ctl_retries_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl retries rebuild [--dry-run] [--lookback DURATION] [--no-kafka]\n"
           "                                 [--scan-timeout DURATION] [--json]\n"
           "\n"
           "Rebuilds the Redis retry schedule from the history after Redis lost its data: every\n"
           "delivery whose latest state is retry_scheduled or deferred becomes a retry job\n"
           "again (due at its next attempt, or now if that is past), unless its job exists.\n"
           "The delivery record comes from pending_payloads when the recorder keeps it, else\n"
           "from topic_deliveries, read from the oldest open delivery minus --lookback to the\n"
           "end. Deliveries whose record is in neither are listed as not recoverable.\n"
           "Safe to run twice or while consumers run: a job is only ever added, atomically,\n"
           "when absent.\n"
           "\n"
           "  --dry-run                 report what would be restored; write nothing\n"
           "  --lookback DURATION       read the topic from this long before the oldest open\n"
           "                            delivery (default 1h)\n"
           "  --no-kafka                do not read the topic (pending_payloads only)\n"
           "  --scan-timeout DURATION   give up reading the topic after this (default 10m)\n"
           "  --json                    machine-readable output\n"
           "\n"
           "Exit: 0 every open delivery is in the schedule (or would be, with --dry-run); 1 some\n"
           "are not recoverable, or a service failed; 2 usage; 78 configuration.\n");
}

static void want_free(void *v)
{
    struct want *w = v;
    if (!w)
        return;
    free(w->event_id);
    free(w->endpoint_id);
    free(w);
}

static char *want_key(const char *ep, const char *id)
{
    size_t a = strlen(ep), b = strlen(id);
    char *k = sl_xmalloc(a + b + 2);
    (void)snprintf(k, a + b + 2, "%s\n%s", ep, id);
    return k;
}

/*
 * Encode d (a decoded record of this (ep, id)) as a job body with attempts spent and put it
 * in the schedule unless present (dry run: nothing). *scheduled (OUT) = 1 when written (or
 * would be), 0 when a job already existed. Returns 0 or an error.
 */
static int put_job(struct rebuild *rb,
                   struct sl_delivery *d,
                   int64_t attempts,
                   int64_t due_ms,
                   int *scheduled,
                   sl_err_t *err)
{
    *scheduled = 0;
    struct sl_decode_limits lim = {.max_body = (size_t)rb->cfg->max_body_bytes, .max_record = 0};
    d->attempt = attempts < 0 ? 0 : attempts > UINT32_MAX ? UINT32_MAX : (uint32_t)attempts;
    sl_buf_reset(&rb->enc);
    int rc = sl_delivery_encode_lim(d, &lim, &rb->enc, err);
    if (rc != 0)
        return rc;
    if (rb->o->dry_run) {
        *scheduled = 1;
        return 0;
    }
    char job[41];
    sl_rstate_job_id(d->ep, d->id, job);
    /* the consumer's own schedule script, for a new job: written unless the job exists; due_ms
     * is on the clocks that wrote the history, so Redis gets the distance from now */
    rc = sl_rstate_put(rb->redis, (uint32_t)rb->cfg->retry_shards, job, rb->enc.data, rb->enc.len,
                       due_ms - sl_now_ms(), NULL, err);
    if (rc == SL_RSTATE_PUT_EXISTED)
        rb->raced++;
    else if (rc == SL_RSTATE_PUT_LOST) /* not for a new job; a reply we cannot explain */
        rc = sl_err_set(err, SL_EREDIS, "unexpected redis reply to schedule a job");
    *scheduled = rc == SL_RSTATE_PUT_OK;
    return rc < 0 ? rc : 0;
}

/* Do the retry jobs of rows [0, n) of res exist? present[] (n bytes), pipelined. */
static int
jobs_exist(struct rebuild *rb, const PGresult *res, int n, unsigned char *present, sl_err_t *err)
{
    char(*jobs)[SL_RSTATE_ID_LEN + 1] = sl_xcalloc((size_t)n + 1, sizeof(*jobs));
    const char **ids = sl_xcalloc((size_t)n + 1, sizeof(*ids));
    for (int i = 0; i < n; i++) {
        sl_rstate_job_id(sl_pg_str(res, i, "endpoint_id"), sl_pg_str(res, i, "event_id"), jobs[i]);
        ids[i] = jobs[i];
    }
    int rc = sl_rstate_jobs_exist(rb->redis, (uint32_t)rb->cfg->retry_shards, (size_t)n, ids,
                                  present, err);
    free(ids);
    free(jobs);
    return rc;
}

/* Pass 1 over one fetched chunk. */
static int pass1_rows(struct rebuild *rb, const PGresult *res, sl_err_t *err)
{
    int n = PQntuples(res);
    unsigned char *present = sl_xcalloc((size_t)n + 1, 1);
    int rc = jobs_exist(rb, res, n, present, err);
    for (int i = 0; rc == 0 && i < n; i++) {
        const char *id = sl_pg_str(res, i, "event_id");
        const char *ep = sl_pg_str(res, i, "endpoint_id");
        const char *state = sl_pg_str(res, i, "state");
        int64_t attempts = sl_pg_i64(res, i, "attempts");
        int64_t due = sl_pg_null(res, i, "next_ms") ? rb->now_ms : sl_pg_i64(res, i, "next_ms");
        if (due < rb->now_ms)
            due = rb->now_ms;
        int64_t since = sl_pg_i64(res, i, "since_ms");
        rb->open++;
        if (state && strcmp(state, "deferred") == 0)
            rb->open_deferred++;
        else
            rb->open_retry++;
        if (present[i]) {
            rb->existed++;
            continue;
        }
        bool done = false;
        if (!sl_pg_null(res, i, "payload")) {
            size_t len = 0;
            unsigned char *raw =
                PQunescapeBytea((const unsigned char *)sl_pg_str(res, i, "payload"), &len);
            struct sl_decode_limits lim = {.max_body = (size_t)rb->cfg->max_body_bytes,
                                           .max_record = 0};
            struct sl_delivery d;
            memset(&d, 0, sizeof(d));
            if (raw && sl_delivery_decode(raw, len, &lim, &d, NULL) == 0 && strcmp(d.id, id) == 0 &&
                strcmp(d.ep, ep) == 0) {
                int sched = 0;
                rc = put_job(rb, &d, attempts, due, &sched, err);
                rb->from_pg += sched;
                done = rc == 0;
            } else {
                rb->bad_pg++;
            }
            sl_delivery_fini(&d);
            PQfreemem(raw);
        }
        if (done || rc != 0)
            continue;
        char *key = want_key(ep, id);
        if (!sl_map_get(rb->wanted, key)) {
            struct want *w = sl_xcalloc(1, sizeof(*w));
            w->event_id = sl_xstrdup(id);
            w->endpoint_id = sl_xstrdup(ep);
            w->attempts = attempts;
            w->due_ms = due;
            sl_map_put(rb->wanted, key, w, NULL);
            sl_map_put(rb->wanted_eps, ep, rb, NULL);
            if (rb->oldest_ms == 0 || since < rb->oldest_ms)
                rb->oldest_ms = since;
        }
        free(key);
    }
    free(present);
    return rc;
}

/* attempts: spent in the current budget. deliveries.attempts is the greatest attempt ever
 * recorded, which for a delivery replayed after it died (`sluicectl replay`: a fresh budget)
 * still counts the dead chain's attempts; so after a death, only the attempts recorded
 * since it count. */
static const char SQL_CURSOR[] =
    "declare open_deliveries no scroll cursor for"
    " select d.event_id, d.endpoint_id, d.state::text as state,"
    "        case when d.last_dead_at is null then d.attempts"
    "             else coalesce((select max(a.attempt) from delivery_attempts a"
    "                             where a.event_id = d.event_id"
    "                               and a.endpoint_id = d.endpoint_id"
    "                               and a.ts > d.last_dead_at), 0) end as attempts,"
    "        (extract(epoch from d.next_attempt_at) * 1000)::bigint as next_ms,"
    "        (extract(epoch from least(d.created_at, d.first_seen)) * 1000)::bigint as since_ms,"
    "        p.payload"
    "   from deliveries d"
    "   left join pending_payloads p"
    "     on p.event_id = d.event_id and p.endpoint_id = d.endpoint_id"
    "  where d.state in ('retry_scheduled', 'deferred')";

static int pass1(struct rebuild *rb, PGconn *pg, sl_err_t *err)
{
    int rc = sl_pg_cmd(pg, "begin a snapshot", "begin isolation level repeatable read read only", 0,
                       NULL, err);
    if (rc != 0)
        return rc;
    rc = sl_pg_cmd(pg, "read open deliveries", SQL_CURSOR, 0, NULL, err);
    while (rc == 0) {
        PGresult *res = sl_pg_exec(pg, "read open deliveries", FETCH_SQL, 0, NULL, err);
        if (!res) {
            rc = SL_EPG;
            break;
        }
        int n = PQntuples(res);
        if (n > 0)
            rc = pass1_rows(rb, res, err);
        PQclear(res);
        if (n < FETCH_ROWS)
            break;
    }
    PGresult *end = PQexec(pg, rc == 0 ? "commit" : "rollback");
    PQclear(end);
    return rc;
}

/* ==== Pass 2: the deliveries topic ==== */

struct scan_part {
    int32_t partition; /* id */
    int64_t end;       /* high watermark at the start: read offsets < end */
    bool done;         /* reached end (or nothing to read) */
};

/* Handle one record of the topic. */
static int scan_record(struct rebuild *rb, const rd_kafka_message_t *m, sl_err_t *err)
{
    char ep[SL_ENDPOINT_ID_MAX + 1];
    if (!m->key || m->key_len == 0 || m->key_len > SL_ENDPOINT_ID_MAX || !m->payload)
        return 0;
    memcpy(ep, m->key, m->key_len);
    ep[m->key_len] = '\0';
    if (!sl_map_get(rb->wanted_eps, ep))
        return 0;
    struct sl_decode_limits lim = {.max_body = (size_t)rb->cfg->max_body_bytes, .max_record = 0};
    struct sl_delivery d;
    if (sl_delivery_decode(m->payload, m->len, &lim, &d, NULL) != 0) {
        sl_delivery_fini(&d);
        return 0; /* the consumer quarantined it; it cannot be an open delivery */
    }
    char *key = want_key(d.ep, d.id);
    struct want *w = sl_map_get(rb->wanted, key);
    free(key);
    int rc = 0;
    if (w && !w->found) {
        int sched = 0;
        rc = put_job(rb, &d, w->attempts, w->due_ms, &sched, err);
        if (rc == 0) {
            w->found = true;
            rb->nfound++;
            rb->from_kafka += sched;
        }
    }
    sl_delivery_fini(&d);
    return rc;
}

/*
 * Find where each partition's reading starts (the first offset at or after scan_from_ms) and
 * ends (the high watermark now), and assign the partitions that have something to read.
 * parts: OUT, malloc'd (caller frees), *nparts entries; *active: partitions to read.
 */
static int scan_start(struct rebuild *rb,
                      rd_kafka_t *rk,
                      struct scan_part **parts,
                      int *nparts,
                      int *active,
                      sl_err_t *err)
{
    const char *topic = rb->cfg->topic_deliveries;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_partition_list_t *list = NULL;
    int rc = 0;
    *parts = NULL;
    *nparts = 0;
    *active = 0;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t ke = rd_kafka_metadata(rk, 0, rkt, &md, KAFKA_TIMEOUT_MS);
    if (!ke && (!md || md->topic_cnt != 1))
        ke = RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    if (!ke)
        ke = md->topics[0].err;
    if (ke) {
        rc = sl_err_set(err, SL_EKAFKA, "could not read metadata of topic %s: %s", topic,
                        rd_kafka_err2str(ke));
        goto out;
    }
    int n = md->topics[0].partition_cnt;
    *parts = sl_xcalloc((size_t)n + 1, sizeof(**parts));
    *nparts = n;
    list = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) {
        (*parts)[i].partition = md->topics[0].partitions[i].id;
        rd_kafka_topic_partition_list_add(list, topic, (*parts)[i].partition)->offset =
            rb->scan_from_ms;
    }
    ke = rd_kafka_offsets_for_times(rk, list, KAFKA_TIMEOUT_MS);
    for (int i = 0; !ke && i < n; i++) {
        rd_kafka_topic_partition_t *e = &list->elems[i];
        int64_t lo = 0, hi = 0;
        ke = e->err ? e->err
                    : rd_kafka_query_watermark_offsets(rk, topic, e->partition, &lo, &hi,
                                                       KAFKA_TIMEOUT_MS);
        (*parts)[i].end = hi;
        /* offset -1 (end): no record at or after the time */
        if (e->offset < 0 || e->offset >= hi) {
            (*parts)[i].done = true;
            e->offset = RD_KAFKA_OFFSET_END;
        } else {
            (*active)++;
        }
    }
    if (!ke)
        ke = rd_kafka_assign(rk, list);
    if (ke)
        rc = sl_err_set(err, SL_EKAFKA, "could not find where to read %s: %s", topic,
                        rd_kafka_err2str(ke));
out:
    if (list)
        rd_kafka_topic_partition_list_destroy(list);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (rkt)
        rd_kafka_topic_destroy(rkt);
    return rc;
}

/* Read the assigned partitions to their end marks (or until nothing is wanted any more). */
static int scan_loop(struct rebuild *rb,
                     rd_kafka_t *rk,
                     struct scan_part *parts,
                     int nparts,
                     int active,
                     sl_err_t *err)
{
    int rc = 0;
    int64_t deadline = sl_mono_ms() + rb->o->scan_timeout_s * 1000;
    size_t nwanted = sl_map_count(rb->wanted);
    while (rc == 0 && active > 0 && rb->nfound < nwanted && sl_mono_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        struct scan_part *p = NULL;
        for (int i = 0; i < nparts; i++)
            if (parts[i].partition == m->partition)
                p = &parts[i];
        if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            rc = sl_err_set(err, SL_EKAFKA, "could not read %s: %s", rb->cfg->topic_deliveries,
                            rd_kafka_message_errstr(m));
        } else if (p && !p->done) {
            if (!m->err && m->offset < p->end) {
                rb->scanned++;
                rc = scan_record(rb, m, err);
            }
            if (m->err || m->offset + 1 >= p->end) {
                p->done = true;
                active--;
            }
        }
        rd_kafka_message_destroy(m);
    }
    rb->scan_complete = active == 0 || rb->nfound == nwanted;
    return rc;
}

static int pass2(struct rebuild *rb, sl_err_t *err)
{
    char errstr[512];
    struct scan_part *parts = NULL;
    int nparts = 0, active = 0;
    rd_kafka_conf_t *conf = sl_kafka_conf_new(rb->cfg, "sluicectl-rebuild", err);
    if (!conf)
        return SL_EKAFKA;
    if (sl_kafka_conf_set(conf, "group.id", "sluicectl-rebuild", err) != 0 ||
        sl_kafka_conf_set(conf, "enable.auto.commit", "false", err) != 0 ||
        sl_kafka_conf_set(conf, "enable.auto.offset.store", "false", err) != 0 ||
        sl_kafka_conf_set(conf, "enable.partition.eof", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "fetch.max.bytes", "52428800", err) != 0) {
        rd_kafka_conf_destroy(conf);
        return SL_EKAFKA;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return sl_err_set(err, SL_EKAFKA, "could not create kafka consumer: %s", errstr);
    }
    int rc = scan_start(rb, rk, &parts, &nparts, &active, err);
    if (rc == 0)
        rc = scan_loop(rb, rk, parts, nparts, active, err);
    free(parts);
    /* nothing was committed or stored: close only leaves the (unjoined) group */
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}

/* ==== Output ==== */

static void print_result(struct rebuild *rb, int64_t recorder_lag, const char *lag_err)
{
    const struct opts *o = rb->o;
    int64_t missing = 0;
    json_t *lost = json_array();
    size_t pos = 0;
    const char *k;
    void *v;
    while (sl_map_next(rb->wanted, &pos, &k, &v)) {
        struct want *w = v;
        if (w->found)
            continue;
        missing++;
        json_array_append_new(
            lost, json_pack("{s:s, s:s}", "event_id", w->event_id, "endpoint_id", w->endpoint_id));
    }
    char from[40] = "";
    if (rb->scan_from_ms > 0)
        ctl_ops_fmt_ms(rb->scan_from_ms, from, sizeof(from));
    if (o->json) {
        json_t *j = json_pack(
            "{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "dry_run", o->dry_run,
            "open_deliveries", (json_int_t)rb->open, "retry_scheduled", (json_int_t)rb->open_retry,
            "deferred", (json_int_t)rb->open_deferred, "already_scheduled",
            (json_int_t)rb->existed + (json_int_t)rb->raced, "restored_from_history",
            (json_int_t)rb->from_pg, "restored_from_kafka", (json_int_t)rb->from_kafka,
            "unusable_history_records", (json_int_t)rb->bad_pg, "not_recoverable",
            (json_int_t)missing, "kafka_records_scanned", (json_int_t)rb->scanned);
        json_object_set_new(j, "kafka_scan_from", from[0] ? json_string(from) : json_null());
        json_object_set_new(j, "kafka_scan_complete", json_boolean(rb->scan_complete));
        json_object_set_new(j, "recorder_lag",
                            recorder_lag >= 0 ? json_integer(recorder_lag) : json_null());
        json_object_set_new(j, "not_recoverable_deliveries", lost);
        ctl_ops_print_json(j);
        return;
    }
    if (lag_err)
        printf("warning: could not read the recorder's lag (%s): deliveries it has not recorded "
               "yet are not in this rebuild\n",
               lag_err);
    else if (recorder_lag > 0)
        printf("warning: the recorder is %" PRId64 " outcomes behind: deliveries it has not "
               "recorded are missing here, and some finished ones may be scheduled again\n",
               recorder_lag);
    printf("retries rebuild%s: %" PRId64 " open deliveries in the history (%" PRId64
           " retry_scheduled, %" PRId64 " deferred)\n\n",
           o->dry_run ? " (dry run: nothing written)" : "", rb->open, rb->open_retry,
           rb->open_deferred);
    static const char *const head[] = {"", "deliveries"};
    struct ctl_table tb;
    ctl_table_init(&tb, 2, head, "lr");
    ctl_table_add(&tb, "already in the Redis schedule");
    ctl_table_add(&tb, "%" PRId64, rb->existed + rb->raced);
    ctl_table_add(&tb, o->dry_run ? "would restore from the history (pending_payloads)"
                                  : "restored from the history (pending_payloads)");
    ctl_table_add(&tb, "%" PRId64, rb->from_pg);
    if (rb->scan_from_ms > 0)
        ctl_table_add(&tb, "%s from %s (read from %s, %" PRId64 " records%s)",
                      o->dry_run ? "would restore" : "restored", rb->cfg->topic_deliveries, from,
                      rb->scanned, rb->scan_complete ? "" : ", INCOMPLETE");
    else
        ctl_table_add(&tb, "%s from %s (not read)", o->dry_run ? "would restore" : "restored",
                      rb->cfg->topic_deliveries);
    ctl_table_add(&tb, "%" PRId64, rb->from_kafka);
    ctl_table_add(&tb, "not recoverable (record in neither)");
    ctl_table_add(&tb, "%" PRId64, missing);
    ctl_table_print(&tb, stdout, 2);
    ctl_table_fini(&tb);
    if (rb->bad_pg > 0)
        printf("\n%" PRId64 " records in pending_payloads did not decode; the topic was tried "
               "for them\n",
               rb->bad_pg);
    if (missing > 0) {
        printf("\nnot recoverable (event, endpoint):\n");
        size_t i;
        json_t *e;
        json_array_foreach(lost, i, e)
        {
            if (i == UNRECOVERABLE_MAX) {
                printf("  ... (%zu more; --json lists all)\n", json_array_size(lost) - i);
                break;
            }
            printf("  %s %s\n", json_string_value(json_object_get(e, "event_id")),
                   json_string_value(json_object_get(e, "endpoint_id")));
        }
    }
    json_decref(lost);
}

/* ==== Entry point ==== */

static int parse(int argc, char **argv, struct opts *o, bool *help)
{
    static const struct option longopts[] = {
        {"dry-run", no_argument, NULL, O_DRY},
        {"lookback", required_argument, NULL, O_LOOKBACK},
        {"no-kafka", no_argument, NULL, O_NO_KAFKA},
        {"scan-timeout", required_argument, NULL, O_SCAN_TIMEOUT},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    optind = 1;
    opterr = 0;
    int ch, rc = 0;
    while (rc == 0 && (ch = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            *help = true;
            return 0;
        case O_DRY:
            o->dry_run = true;
            break;
        case O_LOOKBACK:
            rc = ctl_ops_parse_duration("retries rebuild", "--lookback", optarg, 1,
                                        CTL_OPS_DUR_MAX_S, &o->lookback_s);
            break;
        case O_NO_KAFKA:
            o->no_kafka = true;
            break;
        case O_SCAN_TIMEOUT:
            rc = ctl_ops_parse_duration("retries rebuild", "--scan-timeout", optarg, 1, 86400,
                                        &o->scan_timeout_s);
            break;
        case O_JSON:
            o->json = true;
            break;
        default:
            return ctl_getopt_error("retries rebuild", ch, longopts, argv);
        }
    }
    if (rc == 0)
        rc = ctl_extra_args("retries rebuild", argc, argv, optind);
    return rc;
}

int ctl_retries_main(struct ctl *c, int argc, char **argv)
{
    if (argc < 2)
        return ctl_usage_error("retries", "missing subcommand (expected: rebuild)");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        ctl_retries_help(stdout);
        return CTL_EXIT_OK;
    }
    if (strcmp(argv[1], "rebuild") != 0) {
        size_t n = strcspn(argv[1], "=");
        return ctl_usage_error("retries", "unknown subcommand '%.*s' (expected: rebuild)", (int)n,
                               argv[1]);
    }
    struct opts o = {.lookback_s = LOOKBACK_DEFAULT, .scan_timeout_s = SCAN_TIMEOUT_S};
    bool help = false;
    int rc = parse(argc - 1, argv + 1, &o, &help);
    if (help) {
        ctl_retries_help(stdout);
        return CTL_EXIT_OK;
    }
    if (rc != 0)
        return rc;
    struct rebuild rb;
    memset(&rb, 0, sizeof(rb));
    rb.cfg = ctl_config(c);
    rb.o = &o;
    rb.now_ms = sl_now_ms();
    rb.wanted = sl_map_new(64);
    rb.wanted_eps = sl_map_new(16);
    sl_buf_init(&rb.enc, (size_t)rb.cfg->max_body_bytes + SL_RECORD_OVERHEAD);
    sl_err_t err;
    sl_err_clear(&err);
    PGconn *pg = NULL;

    /* The recorder's lag on the outcomes topic bounds what the history can know. */
    struct ctl_ops_lag lag;
    sl_err_t lerr;
    sl_err_clear(&lerr);
    int64_t recorder_lag = -1;
    if (ctl_ops_kafka_lag(rb.cfg, rb.cfg->recorder_group, rb.cfg->topic_outcomes, KAFKA_TIMEOUT_MS,
                          &lag, &lerr) == 0)
        recorder_lag = lag.total;
    ctl_ops_lag_fini(&lag);

    rb.redis = sl_redis_connect(rb.cfg->redis_url, (int)rb.cfg->redis_timeout_ms, &err);
    if (!rb.redis) {
        rc = ctl_fail("retries rebuild", "%s", err.msg);
        goto out;
    }
    pg = ctl_ops_pg_open(rb.cfg, &err);
    if (!pg) {
        rc = ctl_fail("retries rebuild", "%s", err.msg);
        goto out;
    }
    if (pass1(&rb, pg, &err) != 0) {
        rc = ctl_fail("retries rebuild", "%s", err.msg);
        goto out;
    }
    PQfinish(pg);
    pg = NULL;
    if (!o.no_kafka && sl_map_count(rb.wanted) > 0) {
        rb.scan_from_ms = rb.oldest_ms - o.lookback_s * 1000;
        if (rb.scan_from_ms < 1)
            rb.scan_from_ms = 1;
        if (pass2(&rb, &err) != 0) {
            print_result(&rb, recorder_lag, recorder_lag < 0 ? lerr.msg : NULL);
            rc = ctl_fail("retries rebuild", "%s", err.msg);
            goto out;
        }
    }
    print_result(&rb, recorder_lag, recorder_lag < 0 ? lerr.msg : NULL);
    rc = CTL_EXIT_OK;
    {
        size_t pos = 0, missing = 0;
        const char *k;
        void *v;
        while (sl_map_next(rb.wanted, &pos, &k, &v))
            missing += !((struct want *)v)->found;
        if (missing > 0)
            rc = ctl_fail("retries rebuild", "%zu open deliveries are not recoverable", missing);
    }
out:
    PQfinish(pg);
    sl_redis_close(rb.redis);
    sl_map_destroy(rb.wanted, want_free);
    sl_map_destroy(rb.wanted_eps, NULL);
    sl_buf_fini(&rb.enc);
    return rc;
}
