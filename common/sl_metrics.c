/*
 * sl_metrics: registry and text exposition of the process's metrics (see sl_metrics.h).
 *
 * Families keep their registration order; each holds its series in registration order. The
 * values are atomics owned by the series, which are never freed while the process runs, so
 * the hot path holds plain pointers.
 */
#include "common/sl_metrics.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sl_err.h"

enum mtype { M_COUNTER, M_GAUGE, M_HISTO };

static const char *const TYPE_NAME[] = {"counter", "gauge", "histogram"};
static const int64_t BOUNDS_US[SL_HISTO_NB] = {SL_HISTO_BOUNDS_US};
_Static_assert(sizeof(BOUNDS_US) / sizeof(BOUNDS_US[0]) == SL_HISTO_NB, "SL_HISTO_NB");

struct series {
    char *labels; /* "" for none */
    union {
        sl_counter_t c;
        sl_gauge_t g;
        sl_histo_t h;
    } v;
    struct series *next;
};

struct family {
    char *name, *help;
    enum mtype type;
    struct series *head, *tail;
    struct family *next;
};

struct collector {
    sl_metrics_collect_fn fn;
    void *arg;
    struct collector *next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct family *g_fam_head, *g_fam_tail;
static struct collector *g_coll;
static char g_process[64] = "sluice";
static double g_start_s; /* process start, unix seconds (0 until known) */

void sl_histo_observe_us(sl_histo_t *h, int64_t us)
{
    if (!h)
        return;
    if (us < 0)
        us = 0;
    size_t i = 0;
    while (i < SL_HISTO_NB && us > BOUNDS_US[i])
        i++;
    atomic_fetch_add_explicit(&h->b[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)us, memory_order_relaxed);
}

static struct series *reg(const char *name, const char *help, const char *labels, enum mtype t)
{
    if (!labels)
        labels = "";
    pthread_mutex_lock(&g_mu);
    struct family *f = g_fam_head;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (f && (f->type != t || strcmp(f->help, help) != 0)) {
        (void)fprintf(stderr, "sl_metrics: %s registered twice with another type or help\n", name);
        abort();
    }
    if (!f) {
        f = sl_xcalloc(1, sizeof(*f));
        f->name = sl_xstrdup(name);
        f->help = sl_xstrdup(help);
        f->type = t;
        if (g_fam_tail)
            g_fam_tail->next = f;
        else
            g_fam_head = f;
        g_fam_tail = f;
    }
    struct series *s = f->head;
    while (s && strcmp(s->labels, labels) != 0)
        s = s->next;
    if (!s) {
        s = sl_xcalloc(1, sizeof(*s));
        s->labels = sl_xstrdup(labels);
        if (f->tail)
            f->tail->next = s;
        else
            f->head = s;
        f->tail = s;
    }
    pthread_mutex_unlock(&g_mu);
    return s;
}

sl_counter_t *sl_metric_counter(const char *name, const char *help, const char *labels)
{
    return &reg(name, help, labels, M_COUNTER)->v.c;
}

sl_gauge_t *sl_metric_gauge(const char *name, const char *help, const char *labels)
{
    return &reg(name, help, labels, M_GAUGE)->v.g;
}

sl_histo_t *sl_metric_histo(const char *name, const char *help, const char *labels)
{
    return &reg(name, help, labels, M_HISTO)->v.h;
}

void sl_metrics_collector(sl_metrics_collect_fn fn, void *arg)
{
    struct collector *c = sl_xcalloc(1, sizeof(*c));
    c->fn = fn;
    c->arg = arg;
    pthread_mutex_lock(&g_mu);
    struct collector **pp = &g_coll;
    while (*pp)
        pp = &(*pp)->next;
    *pp = c;
    pthread_mutex_unlock(&g_mu);
}

void sl_metrics_collector_remove(sl_metrics_collect_fn fn, void *arg)
{
    pthread_mutex_lock(&g_mu);
    for (struct collector **pp = &g_coll; *pp; pp = &(*pp)->next) {
        if ((*pp)->fn == fn && (*pp)->arg == arg) {
            struct collector *c = *pp;
            *pp = c->next;
            free(c);
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
}

void sl_metrics_set_process(const char *process)
{
    pthread_mutex_lock(&g_mu);
    (void)snprintf(g_process, sizeof(g_process), "%s", process);
    pthread_mutex_unlock(&g_mu);
}

/* ==== Exposition ==== */

/* Appends that remember a failure (the buffer's maximum reached) for sl_metrics_render. */
static _Thread_local bool t_trunc;

static void outn(struct sl_buf *out, const char *p, size_t n)
{
    if (sl_buf_append(out, p, n) != 0)
        t_trunc = true;
}

static void outs(struct sl_buf *out, const char *s)
{
    outn(out, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void outf(struct sl_buf *out, const char *fmt, ...)
{
    char small[1024];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) {
        t_trunc = true;
    } else if ((size_t)n < sizeof(small)) {
        outn(out, small, (size_t)n);
    } else {
        char *big = sl_xmalloc((size_t)n + 1);
        (void)vsnprintf(big, (size_t)n + 1, fmt, ap2);
        outn(out, big, (size_t)n);
        free(big);
    }
    va_end(ap2);
}

void sl_metrics_write_head(struct sl_buf *out, const char *name, const char *type, const char *help)
{
    outf(out, "# HELP %s ", name);
    for (const char *p = help; *p; p++) { /* help escapes \ and newline */
        if (*p == '\\')
            outs(out, "\\\\");
        else if (*p == '\n')
            outs(out, "\\n");
        else
            outn(out, p, 1);
    }
    outf(out, "\n# TYPE %s %s\n", name, type);
}

static void write_value(struct sl_buf *out, double v)
{
    if (isnan(v)) /* the exposition format's spelling (and no cast of NaN to an integer) */
        outf(out, "NaN\n");
    else if (isinf(v))
        outf(out, "%s\n", v > 0 ? "+Inf" : "-Inf");
    else if (v < 9e15 && v > -9e15 && v == (double)(int64_t)v)
        outf(out, "%" PRId64 "\n", (int64_t)v);
    else { /* the shortest of %.15g and %.17g that reads back as v */
        char t[40];
        (void)snprintf(t, sizeof(t), "%.15g", v);
        if (strtod(t, NULL) != v)
            (void)snprintf(t, sizeof(t), "%.17g", v);
        outf(out, "%s\n", t);
    }
}

void sl_metrics_write_sample(struct sl_buf *out, const char *name, const char *labels, double value)
{
    if (labels && labels[0])
        outf(out, "%s{%s} ", name, labels);
    else
        outf(out, "%s ", name);
    write_value(out, value);
}

static void write_u64(struct sl_buf *out, const char *name, const char *labels, uint64_t v)
{
    if (labels && labels[0])
        outf(out, "%s{%s} %" PRIu64 "\n", name, labels, v);
    else
        outf(out, "%s %" PRIu64 "\n", name, v);
}

void sl_metrics_write_histo(struct sl_buf *out,
                            const char *name,
                            const char *labels,
                            const sl_histo_t *h)
{
    uint64_t b[SL_HISTO_NB + 1];
    uint64_t count = 0;
    for (size_t i = 0; i <= SL_HISTO_NB; i++) {
        b[i] = atomic_load_explicit(&h->b[i], memory_order_relaxed);
        count += b[i];
    }
    uint64_t sum_us = atomic_load_explicit(&h->sum_us, memory_order_relaxed);
    const char *sep = labels && labels[0] ? "," : "";
    const char *lb = labels ? labels : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= SL_HISTO_NB; i++) {
        cum += b[i];
        if (i < SL_HISTO_NB) {
            char le[32];
            (void)snprintf(le, sizeof(le), "%.7g", (double)BOUNDS_US[i] / 1e6);
            outf(out, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, lb, sep, le, cum);
        } else {
            outf(out, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, lb, sep, cum);
        }
    }
    char sname[256];
    (void)snprintf(sname, sizeof(sname), "%s_sum", name);
    sl_metrics_write_sample(out, sname, labels, (double)sum_us / 1e6);
    (void)snprintf(sname, sizeof(sname), "%s_count", name);
    write_u64(out, sname, labels, count);
}

void sl_metrics_label(struct sl_buf *out, const char *key, const char *value)
{
    if (out->len && out->data[out->len - 1] != '{')
        outs(out, ",");
    outf(out, "%s=\"", key);
    for (const char *p = value; *p; p++) {
        if (*p == '\\')
            outs(out, "\\\\");
        else if (*p == '"')
            outs(out, "\\\"");
        else if (*p == '\n')
            outs(out, "\\n");
        else
            outn(out, p, 1);
    }
    outs(out, "\"");
}

/* process_* from /proc/self (Linux), as the Prometheus client libraries export them. */
static void write_process(struct sl_buf *out)
{
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        char line[2048];
        size_t n = fread(line, 1, sizeof(line) - 1, f);
        (void)fclose(f);
        line[n] = '\0';
        /* fields after the command name, which is in parentheses and may hold spaces */
        const char *p = strrchr(line, ')');
        unsigned long long utime = 0, stime = 0, start = 0;
        long long rss = 0;
        if (p &&
            sscanf(p + 2,
                   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
                   "%llu %*u %lld",
                   &utime, &stime, &start, &rss) == 4 &&
            tick > 0) {
            sl_metrics_write_head(out, "process_cpu_seconds_total", "counter",
                                  "Total user and system CPU time spent in seconds.");
            sl_metrics_write_sample(out, "process_cpu_seconds_total", NULL,
                                    (double)(utime + stime) / (double)tick);
            sl_metrics_write_head(out, "process_resident_memory_bytes", "gauge",
                                  "Resident memory size in bytes.");
            sl_metrics_write_sample(out, "process_resident_memory_bytes", NULL,
                                    (double)rss * (double)page);
            if (g_start_s == 0) {
                FILE *s = fopen("/proc/stat", "r");
                char l[256];
                unsigned long long btime = 0;
                while (s && fgets(l, sizeof(l), s)) {
                    if (sscanf(l, "btime %llu", &btime) == 1)
                        break;
                }
                if (s)
                    (void)fclose(s);
                if (btime)
                    g_start_s = (double)btime + (double)start / (double)tick;
            }
            if (g_start_s > 0) {
                sl_metrics_write_head(out, "process_start_time_seconds", "gauge",
                                      "Start time of the process since unix epoch in seconds.");
                sl_metrics_write_sample(out, "process_start_time_seconds", NULL, g_start_s);
            }
        }
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long nfd = -1; /* the directory's own descriptor */
        while (readdir(d))
            nfd++;
        closedir(d);
        nfd -= 2; /* . and .. */
        sl_metrics_write_head(out, "process_open_fds", "gauge", "Number of open file descriptors.");
        sl_metrics_write_sample(out, "process_open_fds", NULL, (double)(nfd < 0 ? 0 : nfd));
    }
}

int sl_metrics_render(struct sl_buf *out)
{
    pthread_mutex_lock(&g_mu);
    t_trunc = false;
    sl_metrics_write_head(out, "sluice_build_info", "gauge",
                          "Always 1; the labels name the process and its version.");
    outf(out, "sluice_build_info{process=\"%s\",version=\"%s\"} 1\n", g_process, SL_VERSION);
    for (const struct family *f = g_fam_head; f; f = f->next) {
        sl_metrics_write_head(out, f->name, TYPE_NAME[f->type], f->help);
        for (const struct series *s = f->head; s; s = s->next) {
            switch (f->type) {
            case M_COUNTER:
                write_u64(out, f->name, s->labels,
                          atomic_load_explicit(&s->v.c.v, memory_order_relaxed));
                break;
            case M_GAUGE:
                sl_metrics_write_sample(
                    out, f->name, s->labels,
                    (double)atomic_load_explicit(&s->v.g.v, memory_order_relaxed));
                break;
            case M_HISTO:
                sl_metrics_write_histo(out, f->name, s->labels, &s->v.h);
                break;
            }
        }
    }
    for (const struct collector *c = g_coll; c; c = c->next)
        c->fn(out, c->arg);
    write_process(out);
    pthread_mutex_unlock(&g_mu);
    return t_trunc ? SL_ETOOBIG : 0;
}

void sl_metrics_reset_for_tests(void)
{
    pthread_mutex_lock(&g_mu);
    while (g_fam_head) {
        struct family *f = g_fam_head;
        g_fam_head = f->next;
        while (f->head) {
            struct series *s = f->head;
            f->head = s->next;
            free(s->labels);
            free(s);
        }
        free(f->name);
        free(f->help);
        free(f);
    }
    g_fam_tail = NULL;
    while (g_coll) {
        struct collector *c = g_coll;
        g_coll = c->next;
        free(c);
    }
    (void)snprintf(g_process, sizeof(g_process), "sluice");
    pthread_mutex_unlock(&g_mu);
}
