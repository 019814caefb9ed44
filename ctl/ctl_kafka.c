/*
 * ctl_kafka: topic creation through librdkafka's admin API, and topic dumps decoded by the
 * record codec (see ctl_kafka.h). Dumps never print delivery bodies, response bodies or
 * macro values unless --show-payloads is given (an explicit operator request on a terminal,
 * never a log line).
 */
#include "ctl/ctl_kafka.h"

#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_b64.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_time.h"

static volatile sig_atomic_t g_stop;

static void on_sigint(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int
parse_int(const char *cmd, const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min || v > max) {
        (void)fprintf(stderr, "sluicectl %s: %s expects an integer in %ld..%ld, got \"%s\"\n", cmd,
                      flag, min, max, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* ==== topics ensure ==== */

static int topics_main(const struct sl_config *cfg, int argc, char **argv)
{
    static const struct option longopts[] = {{"partitions", required_argument, NULL, 'p'},
                                             {"replication-factor", required_argument, NULL, 'r'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    long partitions = 4;
    long replication = -1; /* the brokers' default.replication.factor */
    optind = 1;
    if (argc < 2 || strcmp(argv[1], "ensure") != 0) {
        (void)fprintf(stderr,
                      "usage: sluicectl topics ensure [--partitions N] [--replication-factor R]\n");
        return 2;
    }
    int c;
    opterr = 0;
    while ((c = getopt_long(argc - 1, argv + 1, ":p:r:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (parse_int("topics", "--partitions", optarg, 1, 10000, &partitions) != 0)
                return 2;
            break;
        case 'r':
            if (parse_int("topics", "--replication-factor", optarg, 1, 32, &replication) != 0)
                return 2;
            break;
        case 'h':
            ctl_topics_help(stdout);
            return 0;
        default:
            return ctl_getopt_error("topics ensure", c, longopts, argv + 1);
        }
    }
    if (optind < argc - 1)
        return ctl_extra_args("topics ensure", argc - 1, argv + 1, optind);
    sl_err_t err;
    rd_kafka_t *rk = sl_kafka_producer_new(cfg, "sluicectl", SL_KAFKA_LATENCY, NULL, NULL, &err);
    if (!rk) {
        (void)fprintf(stderr, "sluicectl topics: %s\n", err.msg);
        return 1;
    }
    struct {
        const char *name;
        int parts;
        int compact;
    } want[] = {{cfg->topic_deliveries, (int)partitions, 0},
                {cfg->topic_outcomes, (int)partitions, 0},
                {cfg->topic_quarantine, 1, 0},
                {cfg->topic_endpoints, 1, 1}};
    rd_kafka_NewTopic_t *nts[4];
    char errstr[256];
    for (int i = 0; i < 4; i++) {
        nts[i] = rd_kafka_NewTopic_new(want[i].name, want[i].parts, (int)replication, errstr,
                                       sizeof(errstr));
        if (!nts[i]) {
            (void)fprintf(stderr, "sluicectl topics: cannot describe topic %s: %s\n", want[i].name,
                          errstr);
            return 1;
        }
        if (want[i].compact)
            rd_kafka_NewTopic_set_config(nts[i], "cleanup.policy", "compact");
        rd_kafka_NewTopic_set_config(nts[i], "max.message.bytes", SL_KAFKA_MAX_MESSAGE_BYTES);
    }
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_AdminOptions_set_request_timeout(opts, 30000, errstr, sizeof(errstr));
    rd_kafka_CreateTopics(rk, nts, 4, opts, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 60000);
    int rc = 0;
    if (!ev) {
        (void)fprintf(stderr,
                      "sluicectl topics: could not create topics: no answer from %s in 60 s\n",
                      cfg->kafka_brokers);
        rc = 1;
    } else if (rd_kafka_event_error(ev)) {
        (void)fprintf(stderr, "sluicectl topics: could not create topics: %s\n",
                      rd_kafka_event_error_string(ev));
        rc = 1;
    } else {
        size_t cnt = 0;
        const rd_kafka_topic_result_t **tr =
            rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
        for (size_t i = 0; i < cnt; i++) {
            rd_kafka_resp_err_t te = rd_kafka_topic_result_error(tr[i]);
            const char *name = rd_kafka_topic_result_name(tr[i]);
            if (te == RD_KAFKA_RESP_ERR_NO_ERROR) {
                printf("created %s\n", name);
            } else if (te == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
                printf("exists  %s\n", name);
            } else {
                (void)fprintf(stderr, "sluicectl topics: could not create topic %s: %s\n", name,
                              rd_kafka_topic_result_error_string(tr[i]));
                rc = 1;
            }
        }
    }
    if (ev)
        rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_NewTopic_destroy_array(nts, 4);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return rc;
}

/* ==== dump ==== */

/* Bytes as a JSON string when they are UTF-8, else as {"base64": "..."}: jansson refuses
 * other bytes, and a field must not silently disappear (binary bodies, header values and
 * macros with bytes >= 0x80, response prefixes). */
static json_t *bytes_json(const void *p, size_t n)
{
    json_t *s = json_stringn(p ? (const char *)p : "", n);
    if (s)
        return s;
    size_t cap = SL_B64_ENCODED_LEN(n) + 1;
    char *b = sl_xmalloc(cap);
    long w = sl_b64_encode((const uint8_t *)p, n, b, cap);
    json_t *o = json_pack("{s:s#}", "base64", b, (int)(w > 0 ? w : 0));
    free(b);
    return o;
}

static json_t *kvs_json(const struct sl_kv *kv, size_t n, bool values)
{
    json_t *o = json_object();
    for (size_t i = 0; i < n; i++)
        json_object_set_new(o, kv[i].name,
                            values ? bytes_json(kv[i].value, strlen(kv[i].value))
                                   : json_string("*"));
    return o;
}

static json_t *delivery_json(const struct sl_delivery *d, bool payloads)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:b}", "id", d->id, "endpoint",
                          d->ep, "type", d->type, "created_at_ms", (json_int_t)d->ts_ms,
                          "content_type", d->ct, "body_len", (json_int_t)d->body_len, "attempt",
                          (json_int_t)d->attempt, "replay", d->replay);
    if (payloads)
        json_object_set_new(o, "body", bytes_json(d->body, d->body_len));
    if (d->n_hdr)
        json_object_set_new(o, "headers", kvs_json(d->hdr, d->n_hdr, payloads));
    if (d->n_macros)
        json_object_set_new(o, "macros", kvs_json(d->macros, d->n_macros, payloads));
    return o;
}

static json_t *outcome_json(const struct sl_outcome *oc, bool payloads)
{
    json_t *o = json_pack(
        "{s:s?, s:s?, s:s?, s:I, s:s, s:I, s:s?, s:s?, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:s?, s:I, s:I}",
        "id", oc->id, "endpoint", oc->ep, "type", oc->type, "attempt", (json_int_t)oc->attempt,
        "state", sl_outcome_state_name(oc->state), "http", (json_int_t)oc->http, "err", oc->err,
        "msg", oc->msg, "ts_ms", (json_int_t)oc->ts_ms, "created_ms", (json_int_t)oc->created_ms,
        "lat_us", (json_int_t)oc->lat_us, "dns_us", (json_int_t)oc->dns_us, "conn_us",
        (json_int_t)oc->conn_us, "tls_us", (json_int_t)oc->tls_us, "ttfb_us",
        (json_int_t)oc->ttfb_us, "next_ms", (json_int_t)oc->next_ms, "pod", oc->pod, "resp_len",
        (json_int_t)oc->resp_len, "env_len", (json_int_t)oc->env_len);
    if (payloads && oc->resp)
        json_object_set_new(o, "resp", bytes_json(oc->resp, oc->resp_len));
    return o;
}

static json_t *endpoint_json(const struct sl_endpoint_rec *e)
{
    return json_pack("{s:s, s:s?, s:b, s:s, s:I, s:b, s:s?, s:I}", "id", e->id, "name", e->name,
                     "template", e->tpl, "method", sl_http_method_name(e->method), "secrets",
                     (json_int_t)e->n_secrets, "enabled", e->enabled, "reason", e->reason,
                     "updated_ms", (json_int_t)e->updated_ms);
}

static void dump_usage(FILE *f)
{
    (void)fprintf(f,
                  "usage: sluicectl dump outcomes|deliveries|quarantine|endpoints [--topic T]\n"
                  "                      [--max N] [--idle-ms N] [--follow] [--show-payloads]\n"
                  "\n"
                  "Prints the topic's records from the beginning as JSON lines and stops at the\n"
                  "end each partition had when the dump started (or after --idle-ms without a\n"
                  "new record; --follow keeps waiting and prints new records too). Bodies,\n"
                  "header and macro values are shown only with --show-payloads; bytes that are\n"
                  "not UTF-8 are shown as {\"base64\": \"...\"}.\n");
}

struct dump_opts {
    const char *kind;            /* outcomes|deliveries|quarantine|endpoints */
    const char *topic;           /* the kind's topic unless --topic */
    long max;                    /* records to print (-1 = all) */
    long idle_ms;                /* stop after this long without a record (not with --follow) */
    bool follow;                 /* keep waiting for new records */
    bool payloads;               /* show bodies, header and macro values */
    struct sl_decode_limits lim; /* max_body_bytes, as the writers of these records use */
};

/* Parse `dump KIND [options]`. Returns -1 to go on, else the exit code. */
static int dump_parse(const struct sl_config *cfg, int argc, char **argv, struct dump_opts *o)
{
    static const struct option longopts[] = {{"topic", required_argument, NULL, 't'},
                                             {"max", required_argument, NULL, 'm'},
                                             {"idle-ms", required_argument, NULL, 'i'},
                                             {"follow", no_argument, NULL, 'f'},
                                             {"show-payloads", no_argument, NULL, 'P'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    if (argc < 2 || argv[1][0] == '-') {
        bool help = argc >= 2 && strcmp(argv[1], "--help") == 0;
        dump_usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    static const struct {
        const char *kind;
        size_t topic_off;
    } kinds[] = {{"outcomes", offsetof(struct sl_config, topic_outcomes)},
                 {"deliveries", offsetof(struct sl_config, topic_deliveries)},
                 {"quarantine", offsetof(struct sl_config, topic_quarantine)},
                 {"endpoints", offsetof(struct sl_config, topic_endpoints)}};
    *o = (struct dump_opts){.kind = argv[1],
                            .max = -1,
                            .idle_ms = 3000,
                            .lim = {.max_body = (size_t)cfg->max_body_bytes}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (strcmp(o->kind, kinds[i].kind) == 0)
            o->topic = *(const char *const *)((const char *)cfg + kinds[i].topic_off);
    }
    if (!o->topic) {
        (void)fprintf(stderr, "sluicectl dump: unknown dump kind \"%s\"\n", o->kind);
        dump_usage(stderr);
        return 2;
    }
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc - 1, argv + 1, ":t:m:i:fPh", longopts, NULL)) != -1) {
        switch (c) {
        case 't':
            o->topic = optarg;
            break;
        case 'm':
            if (parse_int("dump", "--max", optarg, 1, 1000000000L, &o->max) != 0)
                return 2;
            break;
        case 'i':
            if (parse_int("dump", "--idle-ms", optarg, 1, 3600000L, &o->idle_ms) != 0)
                return 2;
            break;
        case 'f':
            o->follow = true;
            break;
        case 'P':
            o->payloads = true;
            break;
        case 'h':
            dump_usage(stdout);
            return 0;
        default:
            return ctl_getopt_error("dump", c, longopts, argv + 1);
        }
    }
    if (optind < argc - 1)
        return ctl_extra_args("dump", argc - 1, argv + 1, optind);
    return -1;
}

/* The consumer, assigned to every partition of the topic from the beginning, and where each
 * partition's dump ends. Without --follow the dump ends at each partition's end as it was at
 * the start (its high watermark then), so a partition that keeps growing cannot keep it going;
 * the partition EOF event ends a partition too (compaction can remove its last offsets). */
struct dump_state {
    rd_kafka_t *rk;
    int nparts;   /* partitions of the topic */
    int64_t *end; /* per partition: offset the dump stops at (INT64_MAX: EOF or idle) */
    bool *done;   /* per partition: finished */
    int ndone;    /* partitions finished */
};

static void dump_close(struct dump_state *st)
{
    free(st->end);
    free(st->done);
    if (st->rk) {
        rd_kafka_consumer_close(st->rk);
        rd_kafka_destroy(st->rk);
    }
}

static void dump_finish_partition(struct dump_state *st, int32_t p)
{
    if (!st->done[p]) {
        st->done[p] = true;
        st->ndone++;
    }
}

/* Returns 0, or 1 with the reason printed. */
static int dump_open(const struct sl_config *cfg, const struct dump_opts *o, struct dump_state *st)
{
    memset(st, 0, sizeof(*st));
    sl_err_t err = {0};
    rd_kafka_conf_t *conf = sl_kafka_conf_new(cfg, "sluicectl-dump", &err);
    if (!conf) {
        (void)fprintf(stderr, "sluicectl dump: %s\n", err.msg);
        return 1;
    }
    char errstr[256];
    rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr));
    rd_kafka_conf_set(conf, "group.id", "sluicectl-dump", errstr, sizeof(errstr));
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr));
    st->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!st->rk) {
        (void)fprintf(stderr, "sluicectl dump: could not create kafka consumer: %s\n", errstr);
        return 1;
    }
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(st->rk, o->topic, NULL);
    rd_kafka_resp_err_t ke = rd_kafka_metadata(st->rk, 0, rkt, &md, 10000);
    rd_kafka_topic_destroy(rkt);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1 || md->topics[0].err) {
        rd_kafka_resp_err_t why = ke              ? ke
                                  : md->topic_cnt ? md->topics[0].err
                                                  : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
        (void)fprintf(stderr, "sluicectl dump: could not read metadata of topic %s: %s\n", o->topic,
                      rd_kafka_err2str(why));
        if (md)
            rd_kafka_metadata_destroy(md);
        return 1;
    }
    st->nparts = md->topics[0].partition_cnt;
    size_t n = st->nparts > 0 ? (size_t)st->nparts : 1;
    st->end = sl_xcalloc(n, sizeof(*st->end));
    st->done = sl_xcalloc(n, sizeof(*st->done));
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(st->nparts);
    for (int i = 0; i < st->nparts; i++) {
        int32_t id = md->topics[0].partitions[i].id;
        rd_kafka_topic_partition_list_add(l, o->topic, id)->offset = RD_KAFKA_OFFSET_BEGINNING;
        if (id < 0 || id >= st->nparts)
            continue;
        int64_t lo = 0, hi = -1;
        st->end[id] = INT64_MAX; /* unknown: EOF or --idle-ms ends it */
        if (!o->follow && rd_kafka_query_watermark_offsets(st->rk, o->topic, id, &lo, &hi, 10000) ==
                              RD_KAFKA_RESP_ERR_NO_ERROR) {
            st->end[id] = hi;
            if (hi <= lo) /* empty */
                dump_finish_partition(st, id);
        }
    }
    rd_kafka_metadata_destroy(md);
    rd_kafka_assign(st->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    return 0;
}

/* A quarantined record: the delivery as far as it decodes, its reason and size. */
static json_t *quarantine_json(const rd_kafka_message_t *m, json_t *o)
{
    rd_kafka_headers_t *hdrs = NULL;
    const void *val = NULL;
    size_t vlen = 0;
    if (!o)
        o = json_object();
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        rd_kafka_header_get_last(hdrs, "sluice-reason", &val, &vlen) == RD_KAFKA_RESP_ERR_NO_ERROR)
        json_object_set_new(o, "reason", bytes_json(val, vlen));
    json_object_set_new(o, "bytes", json_integer((json_int_t)m->len));
    return o;
}

/* One record as a JSON object of its kind, or {"undecodable": ...}. */
static json_t *record_json(const struct dump_opts *o, const rd_kafka_message_t *m)
{
    sl_err_t err = {0};
    json_t *j = NULL;
    if (strcmp(o->kind, "outcomes") == 0) {
        struct sl_outcome oc;
        if (sl_outcome_decode(m->payload, m->len, &o->lim, &oc, &err) == 0)
            j = outcome_json(&oc, o->payloads);
        sl_outcome_fini(&oc);
    } else if (strcmp(o->kind, "endpoints") == 0) {
        struct sl_endpoint_rec er;
        if (!m->payload) {
            j = json_pack("{s:o, s:b}", "id", bytes_json(m->key, m->key_len), "deleted", 1);
            memset(&er, 0, sizeof(er));
        } else if (sl_endpoint_rec_decode(m->payload, m->len, NULL, &er, &err) == 0) {
            j = endpoint_json(&er);
        }
        sl_endpoint_rec_fini(&er);
    } else {
        struct sl_delivery d;
        if (sl_delivery_decode(m->payload, m->len, &o->lim, &d, &err) == 0)
            j = delivery_json(&d, o->payloads);
        sl_delivery_fini(&d);
        if (strcmp(o->kind, "quarantine") == 0)
            j = quarantine_json(m, j);
    }
    if (!j)
        j = json_pack("{s:s, s:s}", "undecodable", err.msg, "error", sl_err_name(err.code));
    return j;
}

/* Without --follow: true when m lies past its partition's end at the start (skip it); marks
 * the partition finished at its last record. */
static bool dump_past_end(struct dump_state *st, const rd_kafka_message_t *m)
{
    int64_t end = st->end[m->partition];
    if (m->offset + 1 >= end)
        dump_finish_partition(st, m->partition);
    return m->offset >= end; /* produced after the start */
}

static void dump_print(const rd_kafka_message_t *m, json_t *o, bool follow)
{
    json_object_set_new(o, "partition", json_integer(m->partition));
    json_object_set_new(o, "offset", json_integer((json_int_t)m->offset));
    char *s = json_dumps(o, JSON_COMPACT);
    puts(s ? s : "{\"undecodable\":\"could not render the record\"}");
    if (follow)
        (void)fflush(stdout); /* a live tail: each record as it comes, also into a pipe */
    free(s);
}

static int dump_main(const struct sl_config *cfg, int argc, char **argv)
{
    struct dump_opts o;
    int rc = dump_parse(cfg, argc, argv, &o);
    if (rc >= 0)
        return rc;
    struct dump_state st;
    if (dump_open(cfg, &o, &st) != 0) {
        dump_close(&st);
        return 1;
    }
    (void)signal(SIGINT, on_sigint);
    long printed = 0;
    int64_t last = sl_mono_ms();
    rc = 0;
    while (!g_stop && (o.max < 0 || printed < o.max) && (o.follow || st.ndone < st.nparts)) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(st.rk, 100);
        if (!m) {
            if (!o.follow && sl_mono_ms() - last > o.idle_ms)
                break;
            continue;
        }
        bool known = m->partition >= 0 && m->partition < st.nparts;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (known)
                dump_finish_partition(&st, m->partition);
            rd_kafka_message_destroy(m);
            continue;
        }
        last = sl_mono_ms();
        if (m->err) {
            (void)fprintf(stderr, "sluicectl dump: %s\n", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            rc = 1;
            break;
        }
        if (known && !o.follow && dump_past_end(&st, m)) {
            rd_kafka_message_destroy(m);
            continue;
        }
        json_t *j = record_json(&o, m);
        dump_print(m, j, o.follow);
        json_decref(j);
        printed++;
        rd_kafka_message_destroy(m);
    }
    (void)fflush(stdout);
    dump_close(&st);
    return rc;
}

void ctl_topics_help(FILE *f)
{
    (void)fprintf(f, "usage: sluicectl topics ensure [--partitions N] [--replication-factor R]\n\n"
                     "Creates topic_deliveries and topic_outcomes with N partitions (default 4),\n"
                     "topic_quarantine with 1 and the compacted topic_endpoints with 1, when\n"
                     "missing. Existing topics are left as they are.\n"
                     "Each topic gets R replicas; without --replication-factor the brokers'\n"
                     "default.replication.factor (and their min.insync.replicas) apply, so on a\n"
                     "cluster configured for production (3 and 2) the topics are too.\n");
}

void ctl_dump_help(FILE *f)
{
    dump_usage(f);
}

static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    }
    return false;
}

int ctl_topics_main(struct ctl *c, int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        ctl_topics_help(stdout);
        return CTL_EXIT_OK;
    }
    return topics_main(ctl_config(c), argc, argv);
}

int ctl_dump_main(struct ctl *c, int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        ctl_dump_help(stdout);
        return CTL_EXIT_OK;
    }
    return dump_main(ctl_config(c), argc, argv);
}
