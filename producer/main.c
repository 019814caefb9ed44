/*
 * sluice-produce: publish deliveries to Kafka from JSON lines (stdin or --file) or from a
 * synthetic generator (--generate), wait for every delivery report, print one summary line.
 *
 * Flow: parse options (usage errors exit 2 before anything else), load config (exit 78 on a
 * bad one), open the input, create the producer with message.timeout.ms = --timeout-ms, then
 * read -> validate -> publish, polling for reports as it goes. At the end it waits for the
 * remaining reports (bounded by the message timeout plus a margin); destroying the producer
 * fails whatever is still unreported, so a record is counted as published only when Kafka
 * acknowledged it. Invalid lines are reported by number with the reason (field names, never
 * values) and skipped, or stop the input with --strict.
 *
 * Exit: 0 every record published; 1 some rejected or failed (or the input stopped early);
 * 2 usage; 78 bad config.
 *
 * thread: single-threaded; delivery reports (and so on_done) run on this thread.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_jsonl.h"
#include "common/sl_log.h"
#include "common/sl_record.h"
#include "common/sl_time.h"
#include "producer/prod_gen.h"
#include "producer/prod_lib.h"
#include "producer/prod_lines.h"

#define PROG               "sluice-produce"
#define EXIT_USAGE         2
#define TIMEOUT_DEFAULT_MS 30000 /* ms; --timeout-ms default */
#define POLL_EVERY         256   /* records published between two non-blocking polls */
#define PROGRESS_MS        1000  /* ms between progress lines */
#define DRAIN_SLACK_MS     5000  /* ms waited beyond the message timeout for the reports */
#define CLOSE_TIMEOUT_MS   1000  /* ms destroy still flushes after the drain */
#define FAIL_REASON_MAX    512   /* bytes of the first failure reason kept */

enum {
    OPT_ENDPOINTS = 256,
    OPT_BODY_BYTES,
    OPT_PREFIX,
    OPT_TYPE,
    OPT_RUN_ID,
};

struct opts {
    const char *file;   /* input path; NULL or "-" = stdin */
    int64_t timeout_ms; /* ms; message timeout and the bound on waiting for reports */
    bool strict;        /* stop at the first invalid line */
    bool quiet;         /* no progress lines */
    bool generate;      /* --generate given */
    uint64_t gen_count; /* records to generate */
    int64_t endpoints;  /* generator: K endpoints; 0 = not given */
    int64_t body_bytes; /* generator: bytes per body; -1 = not given */
    const char *prefix; /* generator: endpoint prefix; NULL = not given */
    const char *type;   /* generator: event type; NULL = not given */
    const char *run_id; /* generator: run id in event ids; NULL = derived */
};

struct stats {
    uint64_t lines;                   /* input lines read (generator: records generated) */
    uint64_t sent;                    /* accepted by publish (a report will follow) */
    uint64_t published;               /* acknowledged by Kafka */
    uint64_t rejected;                /* invalid input, never sent */
    uint64_t failed;                  /* sent or attempted but not acknowledged */
    uint64_t failed_timeout;          /* of failed: SL_ETIMEDOUT */
    char first_fail[FAIL_REASON_MAX]; /* reason of the first failure ("" = none) */
    int64_t t0_ms;                    /* mono ms at start */
    int64_t progress_ms;              /* mono ms of the last progress line */
};

static volatile sig_atomic_t g_stop; /* SIGINT/SIGTERM: stop reading, still drain */

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f)
{
    (void)fprintf(
        f,
        "usage: " PROG " [options] [--file FILE]\n"
        "       " PROG " --generate N [--endpoints K] [--body-bytes B] [options]\n"
        "\n"
        "Publish deliveries to Kafka (topic_deliveries, key = endpoint id) and wait until\n"
        "Kafka acknowledged each one. Input: one JSON object per line (fields id, endpoint,\n"
        "type, created_at_ms, content_type, body | body_base64, headers, macros; see\n"
        "producer/README.md). Summary on stdout:\n"
        "  published=N rejected=N failed=N elapsed_s=S records_per_s=R\n"
        "\n"
        "input:\n"
        "  -f, --file FILE        read JSON lines from FILE ('-' = stdin, the default)\n"
        "      --strict           stop at the first invalid line (nothing after it is sent)\n"
        "generator (no JSON parsing; for benchmarks and demos):\n"
        "      --generate N       publish N synthetic deliveries (ids evt_<run>_<n>)\n"
        "      --endpoints K      endpoints <prefix>0..K-1, round robin (default 1)\n"
        "      --body-bytes B     body size in bytes (default 512)\n"
        "      --endpoint-prefix P  endpoint id prefix (default ep_)\n"
        "      --type T           event type (default sluice.generated)\n"
        "      --run-id R         run id used in event ids (default: from clock and pid)\n"
        "general:\n"
        "  -t, --timeout-ms MS    how long Kafka may take to acknowledge a record, retries\n"
        "                         included; the wait for reports is bounded by it\n"
        "                         (default %d, range %d..%d)\n"
        "  -q, --quiet            no progress line on stderr\n"
        "      --config FILE      config file (also SLUICE_CONFIG_FILE; SLUICE_* env wins)\n"
        "      --help-config, --print-config, --check-config\n"
        "  -h, --help             this text\n"
        "  -V, --version          print the version\n"
        "\n"
        "exit status: 0 all published, 1 some rejected or failed, 2 usage, 78 bad config\n",
        TIMEOUT_DEFAULT_MS, SLUICE_PRODUCER_MESSAGE_TIMEOUT_MIN_MS,
        SLUICE_PRODUCER_MESSAGE_TIMEOUT_MAX_MS);
}

/* After a usage message: point at --help and exit 2. */
static void usage_exit(void) __attribute__((noreturn));
static void usage_exit(void)
{
    (void)fprintf(stderr, " (see --help)\n");
    exit(EXIT_USAGE);
}

/* Strict integer option: the whole string, in [min, max]; exits 2 otherwise. */
static int64_t parse_int(const char *name, const char *s, int64_t min, int64_t max)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
        (void)fprintf(stderr,
                      PROG ": invalid value for %s: \"%s\": expected an integer in %" PRId64
                           "..%" PRId64 " (see --help)\n",
                      name, s, min, max);
        exit(EXIT_USAGE);
    }
    return v;
}

/*
 * Parse our options on a copy of argv (getopt permutes it) without the config options, which
 * sl_cfg_main_load handles and recognises only spelled out: were they in getopt's table, an
 * abbreviation (--check, --conf FILE) would be accepted here and then ignored there, and the
 * run would publish instead of checking, or with another configuration.
 */
static void parse_opts(int argc, char **argv, struct opts *o)
{
    static const struct option longopts[] = {
        {"file", required_argument, NULL, 'f'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"strict", no_argument, NULL, 's'},
        {"quiet", no_argument, NULL, 'q'},
        {"generate", required_argument, NULL, 'g'},
        {"endpoints", required_argument, NULL, OPT_ENDPOINTS},
        {"body-bytes", required_argument, NULL, OPT_BODY_BYTES},
        {"endpoint-prefix", required_argument, NULL, OPT_PREFIX},
        {"type", required_argument, NULL, OPT_TYPE},
        {"run-id", required_argument, NULL, OPT_RUN_ID},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    char **args = calloc((size_t)argc + 1, sizeof(*args));
    if (!args) {
        (void)fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i > 0 && strcmp(a, "--config") == 0) {
            i++; /* and its value */
            continue;
        }
        if (i > 0 && (strncmp(a, "--config=", 9) == 0 || strcmp(a, "--help-config") == 0 ||
                      strcmp(a, "--print-config") == 0 || strcmp(a, "--check-config") == 0))
            continue;
        args[n++] = argv[i];
    }
    argc = n;
    *o = (struct opts){.timeout_ms = TIMEOUT_DEFAULT_MS, .body_bytes = -1};
    bool file_given = false;
    int c;
    while ((c = getopt_long(argc, args, "f:t:qhV", longopts, NULL)) != -1) {
        switch (c) {
        case 'f':
            o->file = optarg;
            file_given = true;
            break;
        case 't':
            o->timeout_ms =
                parse_int("--timeout-ms", optarg, SLUICE_PRODUCER_MESSAGE_TIMEOUT_MIN_MS,
                          SLUICE_PRODUCER_MESSAGE_TIMEOUT_MAX_MS);
            break;
        case 's':
            o->strict = true;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'g':
            o->generate = true;
            o->gen_count = (uint64_t)parse_int("--generate", optarg, 0, INT64_MAX);
            break;
        case OPT_ENDPOINTS:
            o->endpoints = parse_int("--endpoints", optarg, 1, PROD_GEN_MAX_ENDPOINTS);
            break;
        case OPT_BODY_BYTES:
            o->body_bytes = parse_int("--body-bytes", optarg, 0, INT32_MAX);
            break;
        case OPT_PREFIX:
            o->prefix = optarg;
            break;
        case OPT_TYPE:
            o->type = optarg;
            break;
        case OPT_RUN_ID:
            o->run_id = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case 'V':
            printf(PROG " %s\n", SL_VERSION);
            exit(0);
        default: /* getopt printed the problem */
            (void)fprintf(stderr, "see " PROG " --help\n");
            exit(EXIT_USAGE);
        }
    }
    if (optind < argc) {
        (void)fprintf(stderr, PROG ": unexpected argument \"%s\"", args[optind]);
        usage_exit();
    }
    free(args);
    if (o->generate && (file_given || o->strict)) {
        (void)fprintf(stderr, PROG ": %s cannot be combined with --generate",
                      file_given ? "--file" : "--strict");
        usage_exit();
    }
    if (!o->generate && (o->endpoints || o->body_bytes >= 0 || o->prefix || o->type || o->run_id)) {
        (void)fprintf(stderr, PROG ": --endpoints, --body-bytes, --endpoint-prefix, --type and "
                                   "--run-id need --generate");
        usage_exit();
    }
}

/* ==== Reports and progress ==== */

static void on_done(void *opaque, int status, const char *reason)
{
    struct stats *st = opaque;
    if (status == 0) {
        st->published++;
        return;
    }
    st->failed++;
    if (status == SL_ETIMEDOUT)
        st->failed_timeout++;
    if (!st->first_fail[0])
        (void)snprintf(st->first_fail, sizeof(st->first_fail), "%s",
                       reason ? reason : sl_strerror(status));
}

static void progress(struct stats *st, sluice_producer_t *p, bool quiet)
{
    int64_t now = sl_mono_ms();
    if (quiet || now - st->progress_ms < PROGRESS_MS)
        return;
    st->progress_ms = now;
    double secs = (double)(now - st->t0_ms) / 1000.0;
    (void)fprintf(stderr,
                  PROG ": %" PRIu64 " sent, %" PRIu64 " acknowledged, %" PRIu64
                       " rejected, %" PRIu64 " failed, %zu pending, %.0f records/s\n",
                  st->sent, st->published, st->rejected, st->failed, sluice_producer_outstanding(p),
                  secs > 0 ? (double)st->published / secs : 0.0);
}

/* Codec errors mean a bad record (rejected); anything else is the producer failing. */
static bool is_record_error(int rc)
{
    return rc == SL_EINVAL || rc == SL_ETOOBIG || rc == SL_EMISSING || rc == SL_EDECODE ||
           rc == SL_EVERSION;
}

/*
 * Publish one record; returns false when the input must stop (strict rejection, or the
 * producer itself failing: fatal error, queue full for the whole timeout).
 */
static bool publish_one(sluice_producer_t *p,
                        const struct sl_delivery *d,
                        uint64_t lineno,
                        const struct opts *o,
                        struct stats *st)
{
    /* input lines are "line N", generated records "record N" */
    const char *what = o->generate ? "record" : "line";
    sl_err_t err = {0};
    if (st->failed_timeout > 0) {
        /* Kafka already let records time out: the rest would only wait and fail too. */
        (void)fprintf(stderr,
                      PROG ": stopped before %s %" PRIu64 ": kafka did not acknowledge "
                           "records within %" PRId64 " ms\n",
                      what, lineno, o->timeout_ms);
        return false;
    }
    int rc = prod_lib_publish(p, d, on_done, st, &err);
    if (rc == 0) {
        st->sent++;
        if (st->sent % POLL_EVERY == 0) {
            (void)sluice_producer_poll(p, 0);
            progress(st, p, o->quiet);
        }
        return true;
    }
    if (is_record_error(rc)) {
        st->rejected++;
        (void)fprintf(stderr, "%s %" PRIu64 ": %s\n", what, lineno, err.msg);
        return !o->strict;
    }
    st->failed++;
    if (!st->first_fail[0])
        (void)snprintf(st->first_fail, sizeof(st->first_fail), "%s", err.msg);
    (void)fprintf(stderr, PROG ": stopped at %s %" PRIu64 ": %s\n", what, lineno, err.msg);
    return false;
}

/* True when the line holds nothing but JSON whitespace (skipped, not an error). */
static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* Returns true when the whole input was read (false: stopped early). */
static bool run_lines(sluice_producer_t *p,
                      struct prod_lines *lr,
                      const struct sl_config *cfg,
                      const struct opts *o,
                      struct stats *st)
{
    struct sl_decode_limits lim = {.max_body = (size_t)cfg->max_body_bytes};
    struct sl_jsonl_opts jopts = {.max_line = lr->max_line + 2, .lim = &lim};
    for (;;) {
        const char *line = NULL;
        size_t len = 0;
        sl_err_t err = {0};
        if (g_stop) {
            (void)fprintf(stderr, PROG ": interrupted after line %" PRIu64 "\n", lr->lineno);
            return false;
        }
        int rc = prod_lines_next(lr, &line, &len, &err);
        if (rc == 0)
            return true;
        if (rc == SL_ETOOBIG) {
            st->lines++;
            st->rejected++;
            (void)fprintf(stderr, "line %" PRIu64 ": line longer than %zu bytes\n", lr->lineno,
                          lr->max_line);
            if (o->strict)
                return false;
            continue;
        }
        if (rc == SL_ESTATE && g_stop) {
            (void)fprintf(stderr, PROG ": interrupted after line %" PRIu64 "\n", lr->lineno);
            return false;
        }
        if (rc < 0) {
            (void)fprintf(stderr, PROG ": %s\n", err.msg);
            return false;
        }
        st->lines++;
        if (blank(line, len))
            continue;
        struct sl_delivery d;
        rc = sl_jsonl_parse(line, len, &jopts, &d, &err);
        if (rc != 0) {
            st->rejected++;
            (void)fprintf(stderr, "line %" PRIu64 ": %s\n", lr->lineno, err.msg);
            if (o->strict)
                return false;
            continue;
        }
        bool go_on = publish_one(p, &d, lr->lineno, o, st);
        sl_delivery_fini(&d);
        if (!go_on)
            return false;
    }
}

static bool
run_generate(sluice_producer_t *p, struct prod_gen *g, const struct opts *o, struct stats *st)
{
    const struct sl_delivery *d;
    while ((d = prod_gen_next(g)) != NULL) {
        if (g_stop) {
            (void)fprintf(stderr, PROG ": interrupted after %" PRIu64 " records\n", st->lines);
            return false;
        }
        st->lines++;
        if (!publish_one(p, d, st->lines, o, st))
            return false;
    }
    return true;
}

/* Wait for the outstanding reports, bounded by the message timeout plus a margin. */
static void drain(sluice_producer_t *p, const struct opts *o, struct stats *st)
{
    int64_t deadline = sl_mono_ms() + o->timeout_ms + DRAIN_SLACK_MS;
    while (sluice_producer_outstanding(p) > 0 && sl_mono_ms() < deadline) {
        (void)sluice_producer_flush(p, 200, NULL);
        progress(st, p, o->quiet);
    }
}

/* The one line that explains why records failed. */
static void explain_failures(const struct stats *st,
                             const struct opts *o,
                             const struct sl_config *cfg,
                             bool brokers_down,
                             const char *last)
{
    char secs[32];
    (void)snprintf(secs, sizeof(secs), "%g", (double)o->timeout_ms / 1000.0);
    if (st->failed_timeout == st->failed && brokers_down)
        (void)fprintf(stderr,
                      PROG ": could not publish %" PRIu64 " records: broker unreachable at %s "
                           "after %s s (last kafka error: %s)\n",
                      st->failed, cfg->kafka_brokers, secs, last);
    else if (st->failed_timeout == st->failed)
        (void)fprintf(stderr,
                      PROG ": could not publish %" PRIu64 " records: not acknowledged by kafka "
                           "at %s within %s s%s%s%s\n",
                      st->failed, cfg->kafka_brokers, secs, last[0] ? " (last kafka error: " : "",
                      last, last[0] ? ")" : "");
    else
        (void)fprintf(stderr, PROG ": could not publish %" PRIu64 " records: %s\n", st->failed,
                      st->first_fail);
}

int main(int argc, char **argv)
{
    struct opts o;
    struct sl_config cfg;
    struct prod_lines lr = {.fd = -1};
    struct prod_gen gen = {0};
    struct stats st = {0};
    sluice_producer_t *p = NULL;
    sl_err_t err = {0};
    int rc = 1;

    parse_opts(argc, argv, &o);
    sl_cfg_main_load(&cfg, PROG, &argc, argv); /* exits 78 on bad config */

    if (o.generate) {
        int64_t body = o.body_bytes >= 0 ? o.body_bytes : 512;
        if (prod_gen_init(&gen, o.gen_count, (uint32_t)(o.endpoints ? o.endpoints : 1),
                          (size_t)body, (size_t)cfg.max_body_bytes, o.prefix ? o.prefix : "ep_",
                          o.type ? o.type : "sluice.generated", o.run_id, &err) != 0) {
            (void)fprintf(stderr, PROG ": %s (see --help)\n", err.msg);
            rc = EXIT_USAGE;
            goto out;
        }
    } else {
        /* A body can grow 6x as JSON (\u00XX escapes); the rest of a line is small. */
        size_t max_line = (size_t)cfg.max_body_bytes * 6 + (size_t)64 * 1024;
        if (max_line < (size_t)SL_JSONL_MAX_LINE_DEFAULT)
            max_line = (size_t)SL_JSONL_MAX_LINE_DEFAULT;
        if (prod_lines_open(&lr, o.file, max_line, &err) != 0) {
            (void)fprintf(stderr, PROG ": %s\n", err.msg);
            goto out;
        }
        lr.stop = &g_stop; /* SIGINT/SIGTERM while waiting for input: stop, still drain */
    }

    struct sluice_producer_opts popts = {
        .message_timeout_ms = o.timeout_ms,
        .enqueue_timeout_ms = o.timeout_ms,
        .close_timeout_ms = CLOSE_TIMEOUT_MS,
        .role = PROG,
    };
    p = prod_lib_new(&cfg, &popts, &err);
    if (!p) {
        (void)fprintf(stderr, PROG ": %s\n", err.msg);
        goto out;
    }

    struct sigaction sa = {.sa_handler = on_signal};
    (void)sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second signal kills */
    (void)sigaction(SIGINT, &sa, NULL);
    (void)sigaction(SIGTERM, &sa, NULL);

    st.t0_ms = st.progress_ms = sl_mono_ms();
    bool complete = o.generate ? run_generate(p, &gen, &o, &st) : run_lines(p, &lr, &cfg, &o, &st);
    drain(p, &o, &st);

    bool down = false;
    sluice_err_t last = {0};
    (void)sluice_producer_last_error(p, &down, &last);
    sluice_producer_destroy(p); /* fails (never acknowledges) whatever is left */
    p = NULL;

    double secs = (double)(sl_mono_ms() - st.t0_ms) / 1000.0;
    printf("published=%" PRIu64 " rejected=%" PRIu64 " failed=%" PRIu64
           " elapsed_s=%.3f records_per_s=%.0f\n",
           st.published, st.rejected, st.failed, secs,
           secs > 0 ? (double)st.published / secs : 0.0);
    if (fflush(stdout) != 0)
        (void)fprintf(stderr, PROG ": could not write the summary: %s\n", strerror(errno));
    if (st.failed > 0)
        explain_failures(&st, &o, &cfg, down, last.msg);
    rc = complete && st.rejected == 0 && st.failed == 0 ? 0 : 1;

out:
    sluice_producer_destroy(p);
    prod_lines_close(&lr);
    prod_gen_fini(&gen);
    sl_cfg_fini(&cfg);
    return rc;
}
