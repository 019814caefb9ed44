/*
 * ctl_replay: `sluicectl replay` (see ctl_replay.h): flags, validation and output around the
 * replay engine common/sl_replay.h, which does the selection, the journal, the publishing and
 * the marking (the same code sluice-api runs). This file owns the two connections (opened
 * with the operations session settings of ctl_ops_pg_open) and turns the engine's per-letter
 * reports into the per-endpoint table and the failure list.
 *
 * Messages name counts, endpoints, event ids and error classes, never payloads.
 */
#include "ctl/ctl_replay.h"

#include <getopt.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_replay.h"
#include "common/sl_time.h"
#include "ctl/ctl_ops.h"

#define FAILURES_SHOWN 20 /* failures listed in text output */

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

/* Ctrl-C or SIGTERM: the run ends before its next batch (sl_replay_opts.stop); the handler
 * then steps aside, so a second signal ends the process at once. */
static atomic_bool g_stop;

static void on_stop_signal(int sig)
{
    static const char msg[] = "sluicectl replay: stopping after the batch being sent "
                              "(again to quit at once)\n";
    atomic_store(&g_stop, true);
    (void)signal(sig, SIG_DFL);
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
}

void ctl_replay_help(FILE *f)
{
    (void)fprintf(
        f, "usage: sluicectl replay [--endpoint ID] [--since T] [--until T] [--error CLASS]\n"
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
           "  --dry-run           show what would be replayed (how many per endpoint; with\n"
           "                      --json each letter); send and change nothing\n"
           "  --json              machine-readable output\n"
           "\n"
           "Letters without a stored record (the consumer kept none) cannot be replayed and\n"
           "are counted separately. Ctrl-C (or SIGTERM) ends the run after the batch being\n"
           "sent, so that nothing is sent twice; a second one quits at once. Exit: 0 every\n"
           "selected letter was published, acknowledged and marked; 1 some failed or the run\n"
           "was stopped (the rest are done; the others stay selectable); 2 usage; 78\n"
           "configuration.\n");
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
        if (o->n_ids == SL_REPLAY_IDS_MAX)
            return ctl_usage_error("replay", "too many --ids: at most %d", SL_REPLAY_IDS_MAX);
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
            if (!sl_replay_error_class_valid(optarg))
                return ctl_usage_error("replay", "invalid value for --error: expected an error "
                                                 "class of 1..32 characters [a-z0-9_]");
            o->error_class = optarg;
            break;
        case O_IDS:
            rc = add_ids(o, optarg);
            break;
        case O_LIMIT:
            rc = ctl_parse_int("replay", "--limit", optarg, 1, SL_REPLAY_LIMIT_MAX, false,
                               &o->limit);
            break;
        case O_BATCH:
            rc = ctl_parse_int("replay", "--batch-size", optarg, 1, SL_REPLAY_BATCH_MAX, false,
                               &o->batch);
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
    if (optind < argc)
        return ctl_extra_args("replay", argc, argv, optind);
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

/* ==== Output ==== */

/* Per-endpoint counts for the summary (sl_map value). */
struct ep_count {
    int64_t replayed; /* acknowledged and marked (dry run: would be replayed) */
    int64_t failed;   /* invalid or publish failed */
};

/* What the output collects from the engine's reports. */
struct report {
    const struct opts *o; /* borrowed */
    sl_map_t *per_ep;     /* endpoint id -> struct ep_count (owned values) */
    json_t *failures;     /* run: [{event_id, endpoint_id, error}] */
    json_t *letters;      /* dry run --json: the letters (NULL otherwise) */
};

static struct ep_count *ep_count(struct report *p, const char *ep)
{
    struct ep_count *c = sl_map_get(p->per_ep, ep);
    if (!c) {
        c = sl_xcalloc(1, sizeof(*c));
        sl_map_put(p->per_ep, ep, c, NULL);
    }
    return c;
}

/* sl_replay_opts.on_letter */
static void on_letter(void *opaque, const struct sl_replay_letter *l)
{
    struct report *p = opaque;
    if (l->outcome == SL_REPLAY_REPLAYED) {
        ep_count(p, l->endpoint_id)->replayed++;
        return;
    }
    json_array_append_new(p->failures, json_pack("{s:s, s:s, s:s}", "event_id", l->event_id,
                                                 "endpoint_id", l->endpoint_id, "error", l->error));
    ep_count(p, l->endpoint_id)->failed++;
}

/* sl_replay_opts.on_warning */
static void on_warning(void *opaque, const char *msg)
{
    (void)opaque;
    (void)fprintf(stderr, "sluicectl replay: warning: %s\n", msg);
}

/* The letters left because their endpoint was deleted, in words. */
static void print_unregistered(int64_t n)
{
    if (n > 0)
        printf("  %" PRId64 " matching dead letter%s of endpoints no longer registered (deleted) "
               "left as they are: register the endpoint again to replay them\n",
               n, n == 1 ? "" : "s");
}

static void print_run(const struct sl_config *cfg,
                      struct report *p,
                      const struct sl_replay_result *r,
                      int rc,
                      const sl_err_t *err)
{
    const struct opts *o = p->o;
    size_t pos = 0;
    const char *key;
    void *val;
    if (o->json) {
        json_t *eps = json_array();
        while (sl_map_next(p->per_ep, &pos, &key, &val)) {
            struct ep_count *c = val;
            json_array_append_new(eps, json_pack("{s:s, s:I, s:I}", "endpoint_id", key, "replayed",
                                                 (json_int_t)c->replayed, "failed",
                                                 (json_int_t)c->failed));
        }
        json_t *j =
            json_pack("{s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:O}", "run_id",
                      r->run_id, "dry_run", 0, "topic", cfg->topic_deliveries, "recovered",
                      (json_int_t)r->recovered, "replayed", (json_int_t)r->replayed, "failed",
                      (json_int_t)r->failed, "invalid", (json_int_t)r->invalid,
                      "unconfirmed_resent", (json_int_t)r->unconfirmed, "acknowledged_unmarked",
                      (json_int_t)r->unmarked + (json_int_t)r->unmarked_lost, "without_payload",
                      (json_int_t)r->without_payload, "unregistered", (json_int_t)r->unregistered,
                      "endpoints", eps, "failures", p->failures);
        if (rc != 0)
            json_object_set_new(j, "error", json_string(err->msg));
        ctl_ops_print_json(j);
        return;
    }
    printf("replay run %s: %" PRId64 " dead letter%s re-published to %s and marked replayed\n",
           r->run_id, r->replayed, r->replayed == 1 ? "" : "s", cfg->topic_deliveries);
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
    print_unregistered(r->unregistered);
    if (sl_map_count(p->per_ep) > 0) {
        static const char *const head[] = {"endpoint", "replayed", "failed"};
        struct ctl_table tb;
        ctl_table_init(&tb, 3, head, "lrr");
        while (sl_map_next(p->per_ep, &pos, &key, &val)) {
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
        json_array_foreach(p->failures, i, f)
        {
            if (i == FAILURES_SHOWN) {
                printf("  ... (%zu more; --json lists all)\n", json_array_size(p->failures) - i);
                break;
            }
            printf("  %s %s: %s\n", json_string_value(json_object_get(f, "endpoint_id")),
                   json_string_value(json_object_get(f, "event_id")),
                   json_string_value(json_object_get(f, "error")));
        }
    }
}

/* "sluicectl <user>@<host>": who ran the replay, for its journal (replay_log.actor). */
static void replay_actor(char *out, size_t cap)
{
    char host[128] = "";
    const char *user = NULL;
    struct passwd *pw = getpwuid(geteuid());
    if (pw && pw->pw_name && pw->pw_name[0])
        user = pw->pw_name;
    if (!user)
        user = getenv("USER");
    if (gethostname(host, sizeof(host) - 1) != 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    if (user && user[0])
        (void)snprintf(out, cap, "sluicectl %.64s@%.128s", user, host[0] ? host : "?");
    else
        (void)snprintf(out, cap, "sluicectl uid %u@%.128s", (unsigned)geteuid(),
                       host[0] ? host : "?");
}

/* sl_replay_dry_run's callback: --json collects the letters, text counts per endpoint. */
static void on_candidate(void *opaque, const struct sl_replay_candidate *c)
{
    struct report *p = opaque;
    if (!p->o->json) {
        ep_count(p, c->endpoint_id)->replayed++;
        return;
    }
    char t[40];
    ctl_ops_fmt_ms(c->dead_ms, t, sizeof(t));
    json_t *e =
        json_pack("{s:s, s:s, s:s, s:s?, s:o, s:I, s:I, s:I}", "event_id", c->event_id,
                  "endpoint_id", c->endpoint_id, "dead_at", t, "error_class", c->error_class,
                  "last_status", c->has_last_status ? json_integer(c->last_status) : json_null(),
                  "attempts", (json_int_t)c->attempts, "replay_count", (json_int_t)c->replay_count,
                  "bytes", (json_int_t)c->bytes);
    json_array_append_new(p->letters, e);
}

static void
print_dry(const struct sl_config *cfg, struct report *p, const struct sl_replay_dry_result *d)
{
    int n = (int)d->would_replay;
    if (p->o->json) {
        ctl_ops_print_json(json_pack("{s:b, s:s, s:i, s:I, s:I, s:O}", "dry_run", 1, "topic",
                                     cfg->topic_deliveries, "would_replay", n, "without_payload",
                                     (json_int_t)d->without_payload, "unregistered",
                                     (json_int_t)d->unregistered, "letters", p->letters));
        return;
    }
    printf("dry run: %d dead letter%s would be re-published to %s\n", n, n == 1 ? "" : "s",
           cfg->topic_deliveries);
    if (d->without_payload > 0)
        printf("  %" PRId64 " matching dead letter%s without a stored record cannot be "
               "replayed\n",
               d->without_payload, d->without_payload == 1 ? "" : "s");
    print_unregistered(d->unregistered);
    if (n > 0) {
        static const char *const head[] = {"endpoint", "would replay"};
        struct ctl_table tb;
        ctl_table_init(&tb, 2, head, "lr");
        size_t pos = 0;
        const char *key;
        void *val;
        while (sl_map_next(p->per_ep, &pos, &key, &val)) {
            ctl_table_add(&tb, "%s", key);
            ctl_table_add(&tb, "%" PRId64, ((struct ep_count *)val)->replayed);
        }
        putchar('\n');
        ctl_table_print(&tb, stdout, 2);
        ctl_table_fini(&tb);
    }
}

/* ==== Entry point ==== */

/* The exit code of a finished (or cut short) run, after its summary was printed. */
static int run_exit(const struct sl_replay_result *r, int err_rc, const sl_err_t *err)
{
    int rc = CTL_EXIT_OK;
    if (err_rc != 0)
        rc = ctl_fail("replay", "%s", err->msg);
    if (r->unmarked > 0)
        rc = ctl_fail("replay",
                      "%" PRId64 " acknowledged records could not be marked replayed; the "
                      "journal has them, and the next replay run marks them without sending",
                      r->unmarked);
    if (r->unmarked_lost > 0)
        rc = ctl_fail("replay",
                      "%" PRId64 " acknowledged records could be neither journalled nor marked "
                      "replayed: the next replay run sends them again",
                      r->unmarked_lost);
    if (r->failed + r->invalid > 0)
        rc = ctl_fail("replay", "%" PRId64 " dead letters were not replayed",
                      r->failed + r->invalid);
    return rc;
}

int ctl_replay_main(struct ctl *c, int argc, char **argv)
{
    struct opts o = {.batch = SL_REPLAY_BATCH_DEFAULT};
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
    const struct sl_config *cfg = ctl_config(c);
    struct sl_replay_sel sel = {.endpoint = o.endpoint,
                                .error_class = o.error_class,
                                .has_since = o.has_since,
                                .since_ms = o.since_ms,
                                .has_until = o.has_until,
                                .until_ms = o.until_ms,
                                .event_ids = (const char *const *)o.ids,
                                .n_event_ids = o.n_ids,
                                .limit = o.limit,
                                .all = o.all};
    struct report p = {.o = &o, .per_ep = sl_map_new(16), .failures = json_array()};
    PGconn *a = NULL, *b = NULL;
    sl_err_t err;
    sl_err_clear(&err);
    a = ctl_ops_pg_open(cfg, &err);
    if (!a) {
        rc = ctl_fail("replay", "%s", err.msg);
        goto out;
    }
    if (o.dry_run) {
        struct sl_replay_dry_result d;
        if (o.json)
            p.letters = json_array();
        if (sl_replay_dry_run(a, &sel, 0, on_candidate, &p, &d, &err) != 0) {
            rc = ctl_fail("replay", "%s", err.msg);
            goto out;
        }
        print_dry(cfg, &p, &d);
        rc = CTL_EXIT_OK;
        goto out;
    }
    b = ctl_ops_pg_open(cfg, &err);
    if (!b) {
        rc = ctl_fail("replay", "%s", err.msg);
        goto out;
    }
    char actor[256];
    replay_actor(actor, sizeof(actor));
    struct sl_replay_opts ropts = {.batch_size = o.batch,
                                   .kafka_role = "sluicectl-replay",
                                   .actor = actor,
                                   .opaque = &p,
                                   .on_letter = on_letter,
                                   .on_warning = on_warning,
                                   .stop = &g_stop};
    (void)signal(SIGINT, on_stop_signal);
    (void)signal(SIGTERM, on_stop_signal);
    struct sl_replay_result r;
    int err_rc = sl_replay_run(a, b, cfg, &sel, &ropts, &r, &err);
    if (!r.started) {
        rc = ctl_fail("replay", "%s", err.msg);
        goto out;
    }
    print_run(cfg, &p, &r, err_rc, &err);
    rc = run_exit(&r, err_rc, &err);
out:
    sl_map_destroy(p.per_ep, free);
    json_decref(p.failures);
    json_decref(p.letters);
    PQfinish(a);
    PQfinish(b);
    opts_fini(&o);
    return rc;
}
