/*
 * sl_log: the one logger. JSON lines on stderr (or a chosen fd):
 *   {"ts":"2026-11-30T13:45:01.123Z","level":"warn","proc":"sluice-consumer","mod":"http",
 *    "event":"delivery_failed","msg":"...","endpoint_id":"ep_1","attempt":2}
 *
 * `event` is a stable snake_case code that dashboards count; `msg` is for people.
 * Redaction by construction:
 *   - messages are formatted from literal formats only (external data goes in as %s args and
 *     is JSON-escaped); callers pass ids, hosts (sl_url_redact) and sizes, never payloads,
 *     click ids, payouts, secrets, signatures or query strings;
 *   - every value registered with sl_log_add_secret() (config secrets, decrypted endpoint
 *     secrets, the master key) is replaced by "[redacted]" in the finished line, as a last
 *     line of defence;
 *   - the per-thread context (sl_log_ctx) carries only identifiers.
 * The level check is a macro that runs before the arguments are evaluated. Debug lines are
 * further gated by contexts (SLUICE_DEBUG=kafka,http,redis,db,cfg or "all").
 *
 * thread: any. Each line is one write(2); the context is thread-local. log callbacks of
 * libraries (librdkafka log_cb) may call sl__log_write directly: it never calls back into them.
 */
#ifndef SL_LOG_H
#define SL_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sl_log_level { SL_LOG_ERROR = 0, SL_LOG_WARN = 1, SL_LOG_INFO = 2, SL_LOG_DEBUG = 3 };

/* Debug contexts (bit mask). */
#define SL_DBG_KAFKA 0x01u
#define SL_DBG_HTTP  0x02u
#define SL_DBG_REDIS 0x04u
#define SL_DBG_DB    0x08u
#define SL_DBG_CFG   0x10u
#define SL_DBG_ALL   0xffu

/* A key/value pair appended to one line. Build with SL_KV_S / SL_KV_I. */
struct sl_log_kv {
    const char *k; /* JSON key, a literal */
    const char *s; /* string value (JSON-escaped), or NULL for an integer */
    int64_t i;     /* integer value when s == NULL */
};
#define SL_KV_S(key, val) ((struct sl_log_kv){.k = (key), .s = sl__kv_str(val), .i = 0})
static inline const char *sl__kv_str(const char *s)
{
    return s ? s : "";
}
#define SL_KV_I(key, val) ((struct sl_log_kv){.k = (key), .s = NULL, .i = (int64_t)(val)})

/* Per-message context, added to every line logged on this thread while set. */
struct sl_log_ctx {
    const char *event_id;    /* borrowed; NULL = absent */
    const char *endpoint_id; /* borrowed; NULL = absent */
    int attempt;             /* 1-based; 0 = absent */
    const char *topic;       /* borrowed; NULL = absent */
    int32_t partition;       /* -1 = absent */
    int64_t offset;          /* -1 = absent */
};

extern int sl__log_level;           /* current level; read by the macros */
extern unsigned sl__log_debug_mask; /* enabled debug contexts */

/* Set the process name, level and debug contexts. proc is copied. */
void sl_log_init(const char *proc, enum sl_log_level level, unsigned debug_mask);
/* Parse "error|warn|info|debug"; returns 0 or SL_EINVAL. */
int sl_log_level_parse(const char *s, enum sl_log_level *out);
/* Parse "kafka,http,all"; returns 0 or SL_EINVAL (names the bad token in err). */
int sl_log_debug_parse(const char *s, unsigned *out);
/* Write lines to fd instead of stderr (tests). */
void sl_log_set_fd(int fd);
/* Register a secret value that must never appear in output (copied; <= 16 secrets of >= 4
 * bytes each; shorter values are ignored as they would redact ordinary text). */
void sl_log_add_secret(const char *value);
/* Replace every registered secret in text (NUL-terminated; NULL allowed) with [redacted], in
 * place (it never grows): for text that leaves the process other than as a log line, such as
 * libcurl's error texts in outcome records. */
void sl_log_scrub(char *text);
/* Forget all registered secrets (wiping the copies). */
void sl_log_clear_secrets(void);
/* Tag every later line of this thread with key (a static string): value, e.g. the
 * consumer's delivery loop ("loop": 1); key NULL removes the tag. */
void sl_log_thread_tag(const char *key, int64_t value);
/* Set/clear this thread's context (ctx is borrowed until cleared). */
void sl_log_ctx_set(const struct sl_log_ctx *ctx);
void sl_log_ctx_clear(void);

void sl__log_write(int level,
                   unsigned dbg_ctx,
                   const char *mod,
                   const char *event,
                   const struct sl_log_kv *kv,
                   size_t nkv,
                   const char *fmt,
                   ...) __attribute__((format(printf, 7, 8)));

#define sl_log_enabled(lvl) ((int)(lvl) <= sl__log_level)

#define sl_log(lvl, mod, event, ...)                                                               \
    do {                                                                                           \
        if (sl_log_enabled(lvl))                                                                   \
            sl__log_write((lvl), 0, (mod), (event), NULL, 0, __VA_ARGS__);                         \
    } while (0)

/* kvs: a brace list of SL_KV_* items, e.g. SL_LOGKV(SL_LOG_INFO, "http", "x",
 * ((struct sl_log_kv[]){SL_KV_S("host", h), SL_KV_I("status", 503)}), "msg"). */
#define SL_LOGKV(lvl, mod, event, kvs, ...)                                                        \
    do {                                                                                           \
        if (sl_log_enabled(lvl))                                                                   \
            sl__log_write((lvl), 0, (mod), (event), (kvs), sizeof(kvs) / sizeof((kvs)[0]),         \
                          __VA_ARGS__);                                                            \
    } while (0)

#define sl_debug(ctxbit, mod, event, ...)                                                          \
    do {                                                                                           \
        if (sl__log_level >= SL_LOG_DEBUG && (sl__log_debug_mask & (ctxbit)))                      \
            sl__log_write(SL_LOG_DEBUG, (ctxbit), (mod), (event), NULL, 0, __VA_ARGS__);           \
    } while (0)

/*
 * A call site that may fire once per request or per record (a dependency down under load)
 * logs at most one line per interval: SL_LOG_EVERY / SL_LOGKV_EVERY keep a static budget per
 * call site, and a line after dropped ones carries "suppressed": how many were dropped. The
 * metrics count every occurrence; the log says that it happens and why.
 */
struct sl_log_every {
    _Atomic int64_t next_ms; /* monotonic ms before which the site drops its lines */
    _Atomic int64_t dropped; /* lines dropped since the last one written */
};
/* True when the site may write now; the line it then writes on this thread carries
 * "suppressed" when lines were dropped before it. */
bool sl__log_every_pass(struct sl_log_every *e, int64_t interval_ms);

#define SL_LOGKV_EVERY(interval_ms, lvl, mod, event, kvs, ...)                                     \
    do {                                                                                           \
        static struct sl_log_every sl__every_;                                                     \
        if (sl_log_enabled(lvl) && sl__log_every_pass(&sl__every_, (interval_ms)))                 \
            sl__log_write((lvl), 0, (mod), (event), (kvs), sizeof(kvs) / sizeof((kvs)[0]),         \
                          __VA_ARGS__);                                                            \
    } while (0)

#define SL_LOG_EVERY(interval_ms, lvl, mod, event, ...)                                            \
    do {                                                                                           \
        static struct sl_log_every sl__every_;                                                     \
        if (sl_log_enabled(lvl) && sl__log_every_pass(&sl__every_, (interval_ms)))                 \
            sl__log_write((lvl), 0, (mod), (event), NULL, 0, __VA_ARGS__);                         \
    } while (0)

#define sl_error(mod, event, ...) sl_log(SL_LOG_ERROR, mod, event, __VA_ARGS__)
#define sl_warn(mod, event, ...)  sl_log(SL_LOG_WARN, mod, event, __VA_ARGS__)
#define sl_info(mod, event, ...)  sl_log(SL_LOG_INFO, mod, event, __VA_ARGS__)

/* JSON-escape src (n bytes) into out (bounded, always NUL-terminated). Returns bytes written. */
size_t sl_json_escape(char *out, size_t outlen, const char *src, size_t n);

#endif /* SL_LOG_H */
