/*
 * sl_log: JSON-lines logger (see sl_log.h). A line is assembled in a thread-local buffer,
 * scrubbed of registered secrets, then written with one write(2), so lines from different
 * threads never interleave. Lines longer than the buffer are truncated with "…" semantics
 * (the JSON stays valid: truncation happens inside the escaped message).
 */
#include "common/sl_log.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"

#define LINE_MAX_BYTES 4096
#define MSG_MAX_BYTES  1024
#define MAX_SECRETS    16
#define MIN_SECRET_LEN 4

int sl__log_level = SL_LOG_INFO;
unsigned sl__log_debug_mask = 0;

static char g_proc[64] = "sluice";
static int g_fd = 2;
static pthread_mutex_t g_secret_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_secrets[MAX_SECRETS];
static size_t g_nsecrets;
static _Thread_local const struct sl_log_ctx *t_ctx;
static _Thread_local const char *t_tag_key; /* sl_log_thread_tag */
static _Thread_local int64_t t_tag_val;
static _Thread_local int64_t t_suppressed; /* set by sl__log_every_pass for the next line */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void sl_log_init(const char *proc, enum sl_log_level level, unsigned debug_mask)
{
    if (proc)
        (void)snprintf(g_proc, sizeof(g_proc), "%s", proc);
    sl__log_level = (int)level;
    sl__log_debug_mask = debug_mask;
}

int sl_log_level_parse(const char *s, enum sl_log_level *out)
{
    for (int i = 0; i <= SL_LOG_DEBUG; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum sl_log_level)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

int sl_log_debug_parse(const char *s, unsigned *out)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"kafka", SL_DBG_KAFKA}, {"http", SL_DBG_HTTP}, {"redis", SL_DBG_REDIS},
                 {"db", SL_DBG_DB},       {"cfg", SL_DBG_CFG},   {"all", SL_DBG_ALL}};
    unsigned mask = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0) {
            size_t i;
            for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                if (strlen(names[i].name) == n && strncmp(p, names[i].name, n) == 0)
                    break;
            }
            if (i == sizeof(names) / sizeof(names[0]))
                return SL_EINVAL;
            mask |= names[i].bit;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    *out = mask;
    return 0;
}

void sl_log_set_fd(int fd)
{
    g_fd = fd;
}

void sl_log_add_secret(const char *value)
{
    if (!value || strlen(value) < MIN_SECRET_LEN)
        return;
    pthread_mutex_lock(&g_secret_mu);
    for (size_t i = 0; i < g_nsecrets; i++) {
        if (strcmp(g_secrets[i], value) == 0)
            goto out;
    }
    if (g_nsecrets < MAX_SECRETS)
        g_secrets[g_nsecrets++] = sl_xstrdup(value);
out:
    pthread_mutex_unlock(&g_secret_mu);
}

void sl_log_clear_secrets(void)
{
    pthread_mutex_lock(&g_secret_mu);
    for (size_t i = 0; i < g_nsecrets; i++) {
        sl_secret_wipe(g_secrets[i], strlen(g_secrets[i]));
        free(g_secrets[i]);
        g_secrets[i] = NULL;
    }
    g_nsecrets = 0;
    pthread_mutex_unlock(&g_secret_mu);
}

void sl_log_thread_tag(const char *key, int64_t value)
{
    t_tag_key = key;
    t_tag_val = value;
}

void sl_log_ctx_set(const struct sl_log_ctx *ctx)
{
    t_ctx = ctx;
}

void sl_log_ctx_clear(void)
{
    t_ctx = NULL;
}

size_t sl_json_escape(char *out, size_t outlen, const char *src, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (outlen == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        char esc[7];
        size_t elen = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            elen = 2;
        } else if (c == '\n') {
            esc[0] = '\\';
            esc[1] = 'n';
            elen = 2;
        } else if (c == '\r') {
            esc[0] = '\\';
            esc[1] = 'r';
            elen = 2;
        } else if (c == '\t') {
            esc[0] = '\\';
            esc[1] = 't';
            elen = 2;
        } else if (c < 0x20 || c == 0x7f) {
            esc[0] = '\\';
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        } else {
            esc[0] = (char)c;
            elen = 1;
        }
        if (o + elen >= outlen)
            break;
        memcpy(out + o, esc, elen);
        o += elen;
    }
    out[o] = '\0';
    return o;
}

struct line {
    char buf[LINE_MAX_BYTES];
    size_t len;
};

static void put_raw(struct line *l, const char *s, size_t n)
{
    /* keep 3 bytes for the closing "}\n" and NUL */
    if (l->len + n > sizeof(l->buf) - 3)
        n = sizeof(l->buf) - 3 - l->len;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void put_str(struct line *l, const char *key, const char *val, size_t vlen)
{
    char esc[MSG_MAX_BYTES * 2];
    put_raw(l, ",\"", 2);
    put_raw(l, key, strlen(key));
    put_raw(l, "\":\"", 3);
    size_t n = sl_json_escape(esc, sizeof(esc), val, vlen);
    put_raw(l, esc, n);
    put_raw(l, "\"", 1);
}

static void put_int(struct line *l, const char *key, int64_t v)
{
    char num[32];
    int n = snprintf(num, sizeof(num), "%lld", (long long)v);
    put_raw(l, ",\"", 2);
    put_raw(l, key, strlen(key));
    put_raw(l, "\":", 2);
    put_raw(l, num, (size_t)n);
}

/* Redact the base64 text after every occurrence of pfx in l (shrink-only). */
static void scrub_prefixed(struct line *l, const char *pfx, const char *red)
{
    size_t plen = strlen(pfx);
    size_t red_len = strlen(red);
    char *p = l->buf;
    for (;;) {
        char *hit = memmem(p, l->len - (size_t)(p - l->buf), pfx, plen);
        if (!hit)
            break;
        char *v = hit + plen;
        char *e = v;
        char *end = l->buf + l->len;
        while (e < end && (isalnum((unsigned char)*e) || *e == '+' || *e == '/' || *e == '='))
            e++;
        size_t vlen = (size_t)(e - v);
        if (vlen >= 3) {
            /* shrink-only replacement keeps the line within its buffer */
            const char *rep = vlen >= red_len ? red : "***";
            size_t rlen = strlen(rep);
            /* the line is length-counted: no NUL belongs here */
            memcpy(v, rep, rlen); /* NOLINT(bugprone-not-null-terminated-result) */
            memmove(v + rlen, e, (size_t)(end - e));
            l->len -= vlen - rlen;
            p = v + rlen;
        } else {
            p = e;
        }
    }
}

/* Replace every registered secret in buf[0..len) with [redacted] (in place, never longer);
 * returns the new length. */
static size_t scrub_registered(char *buf, size_t len)
{
    static const char red[] = "[redacted]";
    pthread_mutex_lock(&g_secret_mu);
    for (size_t i = 0; i < g_nsecrets; i++) {
        size_t slen = strlen(g_secrets[i]);
        char *p = buf;
        for (;;) {
            char *hit = memmem(p, len - (size_t)(p - buf), g_secrets[i], slen);
            if (!hit)
                break;
            size_t tail = len - (size_t)(hit - buf) - slen;
            size_t rlen = sizeof(red) - 1;
            if (rlen > slen)
                rlen = slen >= 3 ? 3 : slen; /* never grow the line: "[r]" style fallback */
            memcpy(hit, rlen == sizeof(red) - 1 ? red : "***", rlen);
            memmove(hit + rlen, hit + slen, tail);
            len -= slen - rlen;
            p = hit + rlen;
        }
    }
    pthread_mutex_unlock(&g_secret_mu);
    return len;
}

void sl_log_scrub(char *text)
{
    if (text)
        text[scrub_registered(text, strlen(text))] = '\0';
}

/* Replace every registered secret in the line with [redacted] (in place, may shorten). */
static void scrub(struct line *l)
{
    static const char red[] = "[redacted]";
    l->len = scrub_registered(l->buf, l->len);
    /* Any Standard Webhooks secret, registered or not (there may be thousands of endpoint
     * secrets): "whsec_" (HMAC) or "whsk_" (Ed25519 private key) followed by its base64 text
     * becomes "whsec_[redacted]" / "whsk_[redacted]". Public keys (whpk_) stay readable. */
    static const char *const pfxs[] = {"whsec_", "whsk_"};
    for (size_t k = 0; k < sizeof(pfxs) / sizeof(pfxs[0]); k++)
        scrub_prefixed(l, pfxs[k], red);
}

/* The fields after "msg": this thread's context, the caller's pairs, a throttled site's
 * "suppressed" count. */
static void put_fields(struct line *l, const struct sl_log_kv *kv, size_t nkv)
{
    const struct sl_log_ctx *c = t_ctx;
    if (c) {
        if (c->event_id)
            put_str(l, "event_id", c->event_id, strlen(c->event_id));
        if (c->endpoint_id)
            put_str(l, "endpoint_id", c->endpoint_id, strlen(c->endpoint_id));
        if (c->attempt > 0)
            put_int(l, "attempt", c->attempt);
        if (c->topic)
            put_str(l, "topic", c->topic, strlen(c->topic));
        if (c->partition >= 0)
            put_int(l, "partition", c->partition);
        if (c->offset >= 0)
            put_int(l, "offset", c->offset);
    }
    for (size_t i = 0; i < nkv; i++) {
        if (kv[i].s)
            put_str(l, kv[i].k, kv[i].s, strlen(kv[i].s));
        else
            put_int(l, kv[i].k, kv[i].i);
    }
    if (t_suppressed > 0) {
        put_int(l, "suppressed", t_suppressed);
        t_suppressed = 0;
    }
}

void sl__log_write(int level,
                   unsigned dbg_ctx,
                   const char *mod,
                   const char *event,
                   const struct sl_log_kv *kv,
                   size_t nkv,
                   const char *fmt,
                   ...)
{
    static _Thread_local struct line l;
    int saved_errno = errno;
    (void)dbg_ctx;
    l.len = 0;

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tbuf[40];
    size_t tn = strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
    int tx = snprintf(tbuf + tn, sizeof(tbuf) - tn, ".%03ldZ", ts.tv_nsec / 1000000);
    put_raw(&l, "{\"ts\":\"", 7);
    put_raw(&l, tbuf, tn + (size_t)(tx > 0 ? tx : 0));
    put_raw(&l, "\"", 1);
    const char *lv = level_names[level < 0 ? 0 : (level > SL_LOG_DEBUG ? SL_LOG_DEBUG : level)];
    put_str(&l, "level", lv, strlen(lv));
    put_str(&l, "proc", g_proc, strlen(g_proc));
    put_str(&l, "mod", mod, strlen(mod));
    put_str(&l, "event", event, strlen(event));
    if (t_tag_key)
        put_int(&l, t_tag_key, t_tag_val);

    char msg[MSG_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int mn = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (mn < 0)
        mn = 0;
    if ((size_t)mn >= sizeof(msg))
        mn = (int)sizeof(msg) - 1;
    put_str(&l, "msg", msg, (size_t)mn);

    put_fields(&l, kv, nkv);
    l.buf[l.len++] = '}';
    l.buf[l.len++] = '\n';
    scrub(&l);

    const char *p = l.buf;
    size_t left = l.len;
    while (left > 0) {
        ssize_t w = write(g_fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    errno = saved_errno;
}

bool sl__log_every_pass(struct sl_log_every *e, int64_t interval_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    int64_t next = atomic_load(&e->next_ms);
    /* one caller per interval wins the exchange; the others count themselves dropped */
    if (now < next || !atomic_compare_exchange_strong(&e->next_ms, &next, now + interval_ms)) {
        atomic_fetch_add(&e->dropped, 1);
        return false;
    }
    t_suppressed = atomic_exchange(&e->dropped, 0);
    return true;
}
