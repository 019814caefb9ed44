/*
 * sl_endpoints: the in-memory endpoint table every consumer keeps, materialised from the
 * compacted topic sluice.endpoints (cfg->topic_endpoints; key = endpoint id, value = an
 * sl_endpoint_rec, NULL value = deleted).
 *
 * Start-up: sl_endpoints_open() assigns every partition of the topic at the beginning with
 * a plain consumer (assign() only: it never joins a group and never commits; librdkafka
 * 2.0.2 wants a group.id for assign(), so a fixed one is set and never used), notes each
 * partition's high watermark, and consumes until every partition has reached the watermark
 * it had at open time (or reports end of partition), bounded by a timeout and, with
 * sl_endpoints_open_cancellable(), by a cancel flag (a stop request during start-up). A
 * background thread then follows live changes until sl_endpoints_close().
 *
 * Each endpoint is an immutable, reference-counted snapshot with everything resolved:
 * secrets decrypted with the master key (AES-256-GCM, AD = endpoint id), tuning values
 * replaced by the global defaults where the record says 0. A change never modifies a
 * snapshot: it builds a new one (with a higher version) and swaps it in, so a reader holding
 * a reference keeps a consistent view for as long as it likes.
 *
 * Bad records: a record that does not decode, whose id differs from its key, or whose
 * secrets do not decrypt is logged (endpoint id, partition, offset and the reason only,
 * never values) and ignored; the previous version of that endpoint stays in force. A record
 * that fails authentication (sl_endpoint_rec_verify: unsigned, altered, forged, or signed by
 * a key not configured) is refused the same way, logged as an error
 * (endpoint_record_unsigned / endpoint_record_forged) and listed by sl_endpoints_refused. So
 * is an authentic record older than the endpoint's record in force (its updated_ms lower:
 * replayed onto the topic to bring back an old URL, secret or enabled flag;
 * endpoint_record_stale). A record byte-identical to the current one (as `sluicectl
 * endpoints sync` republishes) is not a change: no version or generation bump, no callback;
 * it takes the endpoint off the refused list, as any accepted record does.
 *
 * Decrypted secrets are registered with the logger (sl_log_add_secret, as whsec_ or whsk_
 * strings) so they are redacted from every log line, and wiped when the last reference goes.
 *
 * thread: sl_endpoints_get / _release / _ref / _generation / _count / _stats / _snapshot
 * may be called from any thread at any time between open and close. The change callback
 * runs on the updater thread. open and close on one thread; close must not race with any
 * other call on the table (references taken before close stay valid after it).
 */
#ifndef SL_ENDPOINTS_H
#define SL_ENDPOINTS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_record.h"
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"

#define SL_EP_RATE_PERIOD_DEFAULT_MS 1000 /* rate period when the record says 0 (no cfg key) */

typedef struct sl_endpoints sl_endpoints_t;

/* One endpoint, resolved and decrypted. Immutable; refcounted; never build one by hand
 * (use sl_endpoint_build). All strings and arrays belong to the snapshot. */
struct sl_endpoint {
    char *id;                   /* endpoint id (= record key), 1..64 bytes [A-Za-z0-9_-] */
    char *name;                 /* display name; "" when none */
    char *url;                  /* URL, or the postback template when tpl */
    bool tpl;                   /* url is a template with {macro} placeholders (checked: macro
                                   names valid, braces balanced) */
    enum sl_http_method method; /* request method */
    char *ct;                   /* content type override; NULL = use the delivery's */
    struct sl_kv *hdr;          /* static request headers, record order (NULL when none) */
    size_t n_hdr;               /* entries in hdr */
    struct sl_secret secrets[SL_SECRETS_MAX]; /* decrypted signing secrets, current first */
    uint64_t secret_exp_ms[SL_SECRETS_MAX];   /* unix ms after which secrets[i] must no longer
                                                 sign; 0 = current (no expiry). Secrets
                                                 already expired when the snapshot was built
                                                 are left out; later expiries are the
                                                 reader's to check against its clock */
    size_t n_secrets; /* entries in secrets / secret_exp_ms, 1..SL_SECRETS_MAX */
    /* EFFECTIVE values: a 0 in the record is replaced by the global default from cfg */
    int64_t timeout_ms;      /* total request timeout, ms */
    int64_t conn_timeout_ms; /* connect timeout, ms (never above timeout_ms) */
    int64_t retry_base_ms;   /* full-jitter backoff base, ms */
    int64_t retry_cap_ms;    /* backoff cap, ms (never below retry_base_ms) */
    int64_t max_attempts;    /* attempts before dead letter */
    int64_t brk_threshold;   /* consecutive failures that open the breaker */
    int64_t brk_cooldown_ms; /* first breaker cooldown, ms */
    int64_t rate;            /* tokens per rate_period_ms; 0 = unlimited (no default) */
    int64_t rate_period_ms;  /* rate period, ms (default SL_EP_RATE_PERIOD_DEFAULT_MS) */
    int64_t burst;           /* token bucket size (default = rate) */
    int64_t max_inflight;    /* concurrent requests per pod (default max_inflight_per_endpoint) */
    bool enabled;            /* false: deliveries are reported as disabled */
    char *reason;            /* why disabled; "" when none */
    uint64_t updated_ms;     /* last change in the registry, unix ms */
    char **types;            /* event-type filter: exact types and "prefix.*" wildcards (one block
                                with the strings; NULL when none = every type) */
    size_t n_types;          /* entries in types */
    char **channels;         /* channel labels (one block with the strings; NULL when none = no
                                channel restriction) */
    size_t n_channels;       /* entries in channels */
    uint64_t version;        /* increases on every change of this endpoint in this process;
                                >= 1; 0 only for snapshots from sl_endpoint_build */
    /* private */
    atomic_uint_fast32_t sl__refs; /* reference count; use sl_endpoint_ref / _release */
};

/* Global defaults that replace zeros in records. */
struct sl_endpoint_defaults {
    int64_t timeout_ms;      /* cfg http_timeout_ms */
    int64_t conn_timeout_ms; /* cfg http_connect_timeout_ms */
    int64_t retry_base_ms;   /* cfg retry_base_ms */
    int64_t retry_cap_ms;    /* cfg retry_cap_ms */
    int64_t max_attempts;    /* cfg max_attempts */
    int64_t brk_threshold;   /* cfg breaker_threshold */
    int64_t brk_cooldown_ms; /* cfg breaker_cooldown_ms */
    int64_t rate_period_ms;  /* SL_EP_RATE_PERIOD_DEFAULT_MS */
    int64_t max_inflight;    /* cfg max_inflight_per_endpoint */
};

/* Fill d from cfg (borrowed). */
void sl_endpoint_defaults_from_cfg(const struct sl_config *cfg, struct sl_endpoint_defaults *d);

/*
 * Change callback: id (borrowed for the call) changed to e (borrowed for the call; take
 * sl_endpoint_ref to keep it), or was deleted (e == NULL). Runs on the updater thread after
 * the table already returns the new state; it must not call sl_endpoints_close.
 */
typedef void (*sl_endpoints_change_fn)(void *opaque, const char *id, const struct sl_endpoint *e);

/*
 * Load the table from cfg->topic_endpoints (cfg->kafka_brokers; cfg borrowed for the call:
 * topic name and defaults are copied) and start following it. mk (borrowed; copied, wiped on
 * close) decrypts the secrets. initial_timeout_ms bounds the whole start-up (metadata,
 * watermarks and the read up to them).
 * *out (OUT) receives the table on success (free with sl_endpoints_close), NULL on failure.
 * Errors: SL_EINVAL (bad arguments), SL_EKAFKA (client creation, assignment),
 * SL_ENOTFOUND (the topic does not exist), SL_ETIMEDOUT (metadata or the initial read did
 * not finish in time: the message says how far it got), SL_ECRYPTO (records were found but
 * not a single one decrypted: almost certainly the wrong master key).
 */
int sl_endpoints_open(const struct sl_config *cfg,
                      const struct sl_masterkey *mk,
                      int initial_timeout_ms,
                      sl_endpoints_t **out,
                      sl_err_t *err);

/*
 * sl_endpoints_open, also ended by a stop request: cancel (borrowed, optional: NULL = as
 * sl_endpoints_open) is looked at throughout the start-up's waits. While no broker is
 * reachable it is seen within about 300 ms; while a broker is up but answers slowly, within
 * 2 s at most (the blocking calls' timeouts grow to let it answer). Once it is true the open
 * stops waiting, releases what it made and returns -ECANCELED (the message says how far it
 * got), *out NULL. Set it from a signal handler (a lock-free atomic) or another thread.
 */
int sl_endpoints_open_cancellable(const struct sl_config *cfg,
                                  const struct sl_masterkey *mk,
                                  int initial_timeout_ms,
                                  const atomic_bool *cancel,
                                  sl_endpoints_t **out,
                                  sl_err_t *err);

/* A new reference to endpoint id (borrowed), or NULL when unknown or deleted. */
const struct sl_endpoint *sl_endpoints_get(sl_endpoints_t *t, const char *id);

/* Drop a reference (NULL-safe); the last one wipes the secrets and frees the snapshot. */
void sl_endpoint_release(const struct sl_endpoint *e);

/* Take another reference to e (not NULL); returns e. */
const struct sl_endpoint *sl_endpoint_ref(const struct sl_endpoint *e);

/* Bumps on any change of any endpoint (add, change, delete); one atomic load. */
uint64_t sl_endpoints_generation(sl_endpoints_t *t);

/* Number of endpoints currently in the table. */
size_t sl_endpoints_count(sl_endpoints_t *t);

/*
 * Set (or clear, fn NULL) the change callback; opaque is passed through. Takes effect for
 * the next change applied by the updater thread.
 */
void sl_endpoints_on_change(sl_endpoints_t *t, sl_endpoints_change_fn fn, void *opaque);

/*
 * Catch-up: sl_endpoints_sync_request returns a ticket; sl_endpoints_synced(ticket) becomes
 * true once the table has applied every record the topic held at some moment after the
 * request (the updater reads the partitions' ends from the broker, then reads up to them).
 * A consumer asks for this before it calls an endpoint unknown: a record naming an endpoint
 * created just before may reach it before its table has the endpoint. Never true while the
 * broker cannot be asked (the caller bounds its wait). Any thread.
 */
uint64_t sl_endpoints_sync_request(sl_endpoints_t *t);
bool sl_endpoints_synced(sl_endpoints_t *t, uint64_t ticket);

/* Counters since open. */
struct sl_endpoints_stats {
    uint64_t records;   /* records read from the topic, tombstones included */
    uint64_t applied;   /* records that changed the table (new, changed or deleted) */
    uint64_t unchanged; /* records identical to the current version (no-op) */
    uint64_t invalid;   /* records rejected (decode, id/key mismatch, decryption) */
    uint64_t refused;   /* records refused: unsigned, forged, unknown key, older than in force */
};

/* Copy the counters into *out (OUT). */
void sl_endpoints_stats(sl_endpoints_t *t, struct sl_endpoints_stats *out);

/*
 * Call fn (when not NULL) for each endpoint whose latest record was refused (authentication,
 * or older than the record in force), with its id and the reason (both borrowed for the call; fn
 * must not call into the table). Returns how many there are. An id leaves the list when a record of
 * it is accepted or it is deleted.
 */
size_t sl_endpoints_refused(sl_endpoints_t *t,
                            void (*fn)(void *opaque, const char *id, const char *why),
                            void *opaque);

/*
 * Endpoint record authentication. Every record on the endpoints topic carries "kid" (the id of
 * the master key that signed it) and "mac": HMAC-SHA256, keyed with that master key's record
 * MAC key (sl_secretbox.h), of "sluice endpoint record v1" NUL followed by the record's
 * canonical encoding (sl_endpoint_rec_encode of it with kid set and mac unset). The encoding
 * holds every field the decoder reads (id, URL, method, headers, sealed secrets, policies,
 * enabled/reason, types, channels, updated), so any change to any of them breaks the MAC;
 * fields a decoder does not read are never used. It authenticates origin and integrity, not
 * freshness: someone who can write the topic can replay an earlier authentic record of the
 * same endpoint.
 *
 * sign: encode rec (borrowed; its kid/mac are replaced) signed with the current key into out.
 * Returns 0 or the encoder's / SL_EINVAL (no key) / SL_ECRYPTO errors.
 * verify: 0; SL_EMISSING (no kid/mac: unsigned); SL_ECRYPTO (key not configured, or the MAC
 * does not match). Messages name the endpoint and key ids only.
 */
int sl_endpoint_rec_sign(const struct sl_masterkey *mk,
                         const struct sl_endpoint_rec *rec,
                         struct sl_buf *out,
                         sl_err_t *err);
int sl_endpoint_rec_verify(const struct sl_masterkey *mk,
                           const struct sl_endpoint_rec *rec,
                           sl_err_t *err);

/*
 * New references to every endpoint, in no particular order: *out (OUT) receives an array the
 * caller frees with free() after releasing each element; *n (OUT) its length (0 and NULL
 * when empty).
 */
void sl_endpoints_snapshot(sl_endpoints_t *t, const struct sl_endpoint ***out, size_t *n);

/*
 * The id of the Kafka cluster the table is read from (the brokers' metadata) into buf (cap
 * bytes). Returns 0, or SL_EKAFKA with err filled when no broker told it within timeout_ms,
 * SL_ETOOBIG when it does not fit.
 */
int sl_endpoints_cluster_id(
    sl_endpoints_t *t, int timeout_ms, char *buf, size_t cap, sl_err_t *err);

/* Stop the updater thread, close the Kafka client, drop the table's references (NULL-safe). */
void sl_endpoints_close(sl_endpoints_t *t);

/*
 * Whether e (borrowed) wants an event of type type[0..type_len) (borrowed, need not be
 * NUL-terminated) carrying channels[0..n_channels) (borrowed NUL-terminated strings; may be
 * NULL when n_channels is 0). True iff
 *   (e has no types, OR type equals one of them, OR one of them is "p.*" and type starts
 *    with "p." and is longer than "p.")
 *   AND (e has no channels, OR one of the given channels equals one of e's).
 * So "order.*" matches "order.created" and "order.item.added", not "order" nor "orders.x";
 * an endpoint with channels receives only events carrying one of them, one without channels
 * receives every event. Pure; does not look at e->enabled (the caller does). thread: any.
 */
bool sl_endpoint_subscribed(const struct sl_endpoint *e,
                            const char *type,
                            size_t type_len,
                            const char *const *channels,
                            size_t n_channels);

/* ==== Building blocks (sluicectl, tests) ==== */

/*
 * Build a snapshot (version 0, one reference: release with sl_endpoint_release) from rec
 * (borrowed; assumed decoded/validated) by decrypting its secrets with mk and resolving
 * zeros with d (borrowed). Secrets with 0 < exp_ms <= now_ms are left out. Returns 0,
 * SL_ECRYPTO / SL_EVERSION / SL_EDECODE / SL_EINVAL (a secret does not open, is not a whsec_
 * or whsk_ secret, or is a whsk_ key whose public half is not its seed's; the message names
 * the endpoint and the secret's index), SL_EINVAL (template syntax; no unexpired secret).
 * *out is NULL on failure. Does not register secrets with the logger.
 */
int sl_endpoint_build(const struct sl_endpoint_rec *rec,
                      const struct sl_masterkey *mk,
                      const struct sl_endpoint_defaults *d,
                      uint64_t now_ms,
                      struct sl_endpoint **out,
                      sl_err_t *err);

/*
 * Set the eleven EFFECTIVE tuning fields of e (timeout_ms .. max_inflight) from the raw
 * values of rec (borrowed; only its tuning fields are read) and d (borrowed): 0 takes the
 * default, except rate (0 = unlimited) and burst (0 = rate); conn_timeout_ms is clamped to
 * timeout_ms and retry_cap_ms raised to retry_base_ms. sl_endpoint_build uses this; so does
 * `sluicectl endpoints show` to print what consumers will apply.
 */
void sl_endpoint_resolve_policy(struct sl_endpoint *e,
                                const struct sl_endpoint_rec *rec,
                                const struct sl_endpoint_defaults *d);

/*
 * Check the syntax of a postback URL template (borrowed, NUL-terminated): every '{' closes
 * with '}' before another '{', no stray '}', every macro name 1..SL_MACRO_NAME_MAX bytes of
 * [A-Za-z0-9_]. Returns 0 or SL_EINVAL with the byte offset of the problem (never the text).
 */
int sl_endpoint_template_syntax(const char *tpl, sl_err_t *err);

/*
 * Full registration check of an endpoint URL: for a plain URL, sl_url_validate and no '{'
 * or '}' (a hint to use a template); for a template, the syntax above, then the template
 * with every {macro} replaced by "x" must pass sl_url_validate, and macros must not occur in
 * the scheme, host or port (the host must not depend on delivery data). Returns 0 or
 * SL_EINVAL / SL_EMISSING / SL_ETOOBIG naming the rule.
 */
int sl_endpoint_url_check(const char *url, bool tpl, sl_err_t *err);

/*
 * The host of an endpoint URL (template or not: a template's macros cannot be in its host)
 * into out (outlen bytes), as sl_url_host writes it. Returns 0, or SL_EDECODE / SL_ETOOBIG
 * (out = "") for a URL that sl_endpoint_url_check would refuse.
 */
int sl_endpoint_url_host(const char *url, bool tpl, char *out, size_t outlen);

/*
 * Read cfg->topic_endpoints from the beginning up to the high watermarks it has when called
 * (as sl_endpoints_open does, without decrypting or keeping anything): fn is called for
 * every record in partition order (key/val borrowed for the call; val NULL for a
 * tombstone). A non-zero return from fn stops the scan and is returned. Returns 0,
 * SL_EKAFKA, SL_ENOTFOUND (no such topic) or SL_ETIMEDOUT (timeout_ms exceeded).
 * Used by `sluicectl endpoints sync` to find keys the registry no longer has.
 */
typedef int (*sl_endpoints_scan_fn)(
    void *opaque, const char *key, size_t keylen, const void *val, size_t vallen);
int sl_endpoints_scan(const struct sl_config *cfg,
                      int timeout_ms,
                      sl_endpoints_scan_fn fn,
                      void *opaque,
                      sl_err_t *err);

#endif /* SL_ENDPOINTS_H */
