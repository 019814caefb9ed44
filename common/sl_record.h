/*
 * sl_record: the three msgpack records Sluice puts on Kafka, and their strict codec.
 *
 *   delivery  topic sluice.deliveries  key = endpoint id   (apps, sluice-produce, retry/replay)
 *   outcome   topic sluice.outcomes    key = endpoint id   (consumer; one per attempt/state change)
 *   endpoint  topic sluice.endpoints   key = endpoint id   (sluicectl; compacted, NULL = deleted)
 *
 * The contract (field names, types, limits) is schemas/README.md; this module is its only
 * implementation and enforces it in both directions: decoders reject anything the contract
 * does not allow, encoders refuse to emit it.
 *
 * Decoding is bounded before msgpack-c sees a byte: the size cap comes first, then
 * sl_record_prescan() walks the raw structure (every container count must fit the bytes that
 * remain, nesting <= SL_RECORD_MAX_DEPTH, exactly one object, no trailing bytes), because
 * msgpack-c 4.0.0 reserves count * 24/48 bytes per container before reading its elements.
 *
 * Ownership: a decoded record owns ONE allocation (the `own` field) holding every string,
 * array and byte field, so it outlives the input buffer; *_fini() frees it. A record built by
 * a caller for encoding borrows everything (own = NULL) and *_fini() only clears it.
 *
 * Error codes: SL_ETOOBIG (a size or count limit), SL_EDECODE (not msgpack, truncated,
 * trailing bytes, too deep, not a map, duplicate or non-string key, wrong field type),
 * SL_EVERSION (unknown "v"), SL_EMISSING (required field absent), SL_EINVAL (a value breaks a
 * rule: charset, enum, reserved header, cross-field rule). Messages name the field and the
 * rule, never the value.
 *
 * thread: any; functions are reentrant, records are plain values owned by the caller.
 */
#ifndef SL_RECORD_H
#define SL_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"

/* ==== Limits (schemas/README.md is the normative list) ==== */

#define SL_RECORD_VERSION      1                     /* the only "v" this build reads or writes */
#define SL_RECORD_MAX_DEPTH    8                     /* containers nested deeper are rejected */
#define SL_RECORD_MAX_FIELDS   64                    /* entries in a record's top-level map */
#define SL_MAX_BODY_DEFAULT    ((size_t)1024 * 1024) /* bytes; default delivery body cap */
#define SL_RECORD_OVERHEAD     ((size_t)64 * 1024)   /* bytes; delivery record = body cap + this */
#define SL_OUTCOME_OVERHEAD    ((size_t)16 * 1024)   /* bytes; outcome record = env cap + this */
#define SL_ENDPOINT_RECORD_MAX ((size_t)64 * 1024)   /* bytes; default endpoint record cap */
#define SL_EVENT_ID_MAX        128                   /* bytes */
#define SL_ENDPOINT_ID_MAX     64                    /* bytes */
#define SL_EVENT_TYPE_MAX      128                   /* bytes */
#define SL_CT_MAX              128                   /* bytes; content type */
#define SL_HDR_MAX             32                    /* extra headers per record */
#define SL_HDR_NAME_MAX        64                    /* bytes */
#define SL_HDR_VALUE_MAX       1024                  /* bytes */
#define SL_MACRO_MAX           64                    /* macros per delivery */
#define SL_MACRO_NAME_MAX      64                    /* bytes */
#define SL_MACRO_VALUE_MAX     2048                  /* bytes */
#define SL_ERR_CLASS_MAX       32                    /* bytes; outcome "err" */
#define SL_OUTCOME_MSG_MAX     256                   /* bytes; outcome "msg" */
#define SL_RESP_MAX            4096                  /* bytes; outcome "resp" */
#define SL_POD_MAX             64                    /* bytes; outcome "pod" */
#define SL_EP_NAME_MAX         128                   /* bytes; endpoint "name" */
#define SL_URL_MAX             2048                  /* bytes; endpoint "url" */
#define SL_SECRETS_MAX         8                     /* secrets per endpoint */
#define SL_SECRET_ENC_MAX      256                   /* bytes; encrypted secret */
#define SL_REASON_MAX          256                   /* bytes; endpoint "reason" */
#define SL_EP_TYPES_MAX        64                    /* entries in endpoint "types" */
#define SL_EP_CHANNELS_MAX     16                    /* entries in endpoint "channels" */
#define SL_ENDPOINT_KID_MAX    16                    /* bytes; endpoint "kid" */
#define SL_ENDPOINT_MAC_LEN    32                    /* bytes; endpoint "mac" */
#define SL_CHANNEL_MAX         64                    /* bytes; one channel label */
#define SL_DELIVERY_CT_DEFAULT "application/json"

/*
 * Decode limits. Zero fields take the defaults; pass NULL for all defaults.
 * Encoders apply the same limits, so a producer configured like its consumers cannot emit a
 * record they reject.
 */
struct sl_decode_limits {
    size_t max_body;   /* bytes; delivery "body" cap, and outcome "env" = max_body + 64 KiB;
                          0 = SL_MAX_BODY_DEFAULT */
    size_t max_record; /* bytes; whole encoded record, checked before anything else;
                          0 = delivery: max_body + 64 KiB, outcome: max_body + 80 KiB,
                          endpoint: SL_ENDPOINT_RECORD_MAX */
};

/* One header or macro: both strings NUL-terminated (the contract forbids NUL in them). */
struct sl_kv {
    const char *name;  /* header name (token chars) or macro name ([A-Za-z0-9_]) */
    const char *value; /* header value or macro value */
};

/* ==== delivery (sluice.deliveries) ==== */

struct sl_delivery {
    const char *id;             /* event id, 1..128 bytes 0x21..0x7e except '.' */
    const char *ep;             /* endpoint id, 1..64 bytes [A-Za-z0-9_-]; = the record key */
    const char *type;           /* event type, 1..128 bytes 0x21..0x7e */
    uint64_t ts_ms;             /* created-at, unix ms */
    const char *ct;             /* content type; decode: never NULL (absent = the default);
                                   encode: NULL = default (not written) */
    const uint8_t *body;        /* exact bytes to send; decode: never NULL and followed by a
                                   NUL that body_len does not count; encode: NULL iff empty */
    size_t body_len;            /* bytes; <= max_body, may be 0 */
    const struct sl_kv *hdr;    /* extra request headers, in record order (NULL if none) */
    size_t n_hdr;               /* entries in hdr, <= SL_HDR_MAX */
    const struct sl_kv *macros; /* postback macro values, in record order (NULL if none) */
    size_t n_macros;            /* entries in macros, <= SL_MACRO_MAX */
    uint32_t attempt;           /* attempts already spent (retry jobs); 0 = fresh */
    bool replay;                /* true when re-published by replay */
    void *own;                  /* the single allocation behind every pointer above, or NULL
                                   when the pointers are borrowed; freed by sl_delivery_fini */
};

/*
 * Decode one delivery record from buf (borrowed; not referenced after return).
 * lim: NULL = defaults. out: OUT, overwritten (never read); on success it owns its memory and
 * the caller calls sl_delivery_fini(out); on failure it is left empty (fini is still safe).
 * Returns 0 or a negative SL_E* code with err (NULL allowed) naming the field and rule.
 */
int sl_delivery_decode(const void *buf,
                       size_t len,
                       const struct sl_decode_limits *lim,
                       struct sl_delivery *out,
                       sl_err_t *err);

/*
 * Check d against every rule of the contract under lim (NULL = defaults), without encoding.
 * d is borrowed. Returns 0 or a negative SL_E* code (see the file comment).
 */
int sl_delivery_validate(const struct sl_delivery *d,
                         const struct sl_decode_limits *lim,
                         sl_err_t *err);

/*
 * Validate d (default limits), then APPEND its msgpack encoding to out (caller-owned; out->max
 * also bounds the result). Keys are written in the contract's order and optional fields only
 * when they differ from their defaults, so equal records encode to identical bytes.
 * On failure out is restored to its previous length.
 */
int sl_delivery_encode(const struct sl_delivery *d, struct sl_buf *out, sl_err_t *err);
/* As sl_delivery_encode, validating under lim (NULL = defaults). */
int sl_delivery_encode_lim(const struct sl_delivery *d,
                           const struct sl_decode_limits *lim,
                           struct sl_buf *out,
                           sl_err_t *err);

/*
 * Deep-copy src (borrowed; not validated) into dst (OUT, overwritten) as one owned allocation;
 * the caller calls sl_delivery_fini(dst). Aborts on OOM like sl_xmalloc.
 */
void sl_delivery_copy(struct sl_delivery *dst, const struct sl_delivery *src);

/* Free what d owns and zero it. NULL-safe and idempotent. */
void sl_delivery_fini(struct sl_delivery *d);

/* ==== outcome (sluice.outcomes) ==== */

enum sl_outcome_state {
    SL_OUTCOME_DELIVERED = 0,   /* 2xx */
    SL_OUTCOME_RETRY_SCHEDULED, /* transient failure; "next" holds the due time */
    SL_OUTCOME_DEAD_LETTER,     /* permanent failure or attempts exhausted; "env" may hold the
                                   original record */
    SL_OUTCOME_DUPLICATE,       /* skipped: already delivered within the dedup window */
    SL_OUTCOME_DEFERRED,        /* rescheduled without spending an attempt (breaker, rate) */
    SL_OUTCOME_QUARANTINED,     /* the delivery record was invalid */
    SL_OUTCOME_DISABLED,        /* endpoint disabled or unknown */
};
#define SL_OUTCOME_STATE_COUNT 7

/* "delivered", "retry_scheduled", ...; NULL for a value outside the enum. */
const char *sl_outcome_state_name(enum sl_outcome_state state);
/* Parse len bytes at s (borrowed, need not be NUL-terminated); 0 or SL_EINVAL. */
int sl_outcome_state_parse(const char *s, size_t len, enum sl_outcome_state *out);

struct sl_outcome {
    const char *id;              /* event id; NULL only when state is quarantined */
    const char *ep;              /* endpoint id; NULL only when state is quarantined */
    const char *type;            /* event type; NULL only when state is quarantined */
    uint32_t attempt;            /* 1-based attempt number; 0 for duplicate/deferred */
    enum sl_outcome_state state; /* what happened */
    uint32_t http;               /* HTTP status 100..999; 0 = no response */
    const char *err;             /* error class [a-z0-9_] 1..32 bytes ("timeout"); NULL = none */
    const char *msg;             /* short human message, UTF-8, <= 256 bytes; NULL = none */
    uint64_t ts_ms;              /* time of the outcome, unix ms */
    uint64_t created_ms;         /* event created-at, unix ms (0 only when quarantined) */
    uint64_t lat_us;             /* total latency, µs; 0 = not measured */
    uint64_t dns_us;             /* DNS phase, µs; 0 = none */
    uint64_t conn_us;            /* TCP connect phase, µs; 0 = none */
    uint64_t tls_us;             /* TLS handshake phase, µs; 0 = none */
    uint64_t ttfb_us;            /* time to first byte, µs; 0 = none */
    uint64_t next_ms;            /* next attempt, unix ms; > 0 iff retry_scheduled/deferred */
    const uint8_t *resp;         /* first bytes of the response body; NULL = absent */
    size_t resp_len;             /* bytes, <= SL_RESP_MAX */
    const uint8_t *env; /* original delivery record bytes (dead_letter only); NULL = absent */
    size_t env_len;     /* bytes, <= max_body + 64 KiB */
    const char *pod;    /* consumer instance id, 1..64 bytes 0x21..0x7e; NULL = none */
    void *own;          /* single owned allocation, or NULL when borrowed */
};

/* Same contracts as the delivery functions above. */
int sl_outcome_decode(const void *buf,
                      size_t len,
                      const struct sl_decode_limits *lim,
                      struct sl_outcome *out,
                      sl_err_t *err);
int sl_outcome_validate(const struct sl_outcome *o,
                        const struct sl_decode_limits *lim,
                        sl_err_t *err);
int sl_outcome_encode(const struct sl_outcome *o, struct sl_buf *out, sl_err_t *err);
int sl_outcome_encode_lim(const struct sl_outcome *o,
                          const struct sl_decode_limits *lim,
                          struct sl_buf *out,
                          sl_err_t *err);
void sl_outcome_fini(struct sl_outcome *o);

/* ==== endpoint (sluice.endpoints) ==== */

enum sl_http_method {
    SL_METHOD_POST = 0, /* default */
    SL_METHOD_PUT,
    SL_METHOD_PATCH,
    SL_METHOD_GET,
};
#define SL_METHOD_COUNT 4

/* "POST", ...; NULL for a value outside the enum. */
const char *sl_http_method_name(enum sl_http_method m);
/* Parse len bytes at s (exact, upper case); 0 or SL_EINVAL. */
int sl_http_method_parse(const char *s, size_t len, enum sl_http_method *out);

struct sl_endpoint_secret {
    const uint8_t *enc; /* AES-256-GCM ciphertext of the whsec_/whsk_ secret; opaque here */
    size_t enc_len;     /* bytes, 1..SL_SECRET_ENC_MAX */
    uint64_t exp_ms;    /* unix ms after which the secret is no longer used; 0 = current */
};

struct sl_endpoint_rec {
    const char *id;             /* endpoint id (= record key) */
    const char *name;           /* display name, UTF-8 <= 128 bytes; NULL = none */
    const char *url;            /* URL, or postback template when tpl; 1..2048 bytes 0x21..0x7e */
    bool tpl;                   /* url is a postback template with {macro} placeholders */
    enum sl_http_method method; /* request method; absent = POST */
    const char *ct;             /* content type override; NULL = use the delivery's */
    const struct sl_kv *hdr;    /* static request headers (NULL if none) */
    size_t n_hdr;               /* entries in hdr, <= SL_HDR_MAX */
    const struct sl_endpoint_secret *secrets; /* 1..SL_SECRETS_MAX signing secrets */
    size_t n_secrets;                         /* entries in secrets */
    uint32_t timeout_ms;                      /* total request timeout, ms; 0 = global default */
    uint32_t conn_timeout_ms;                 /* connect timeout, ms; 0 = global default */
    uint32_t retry_base_ms;                   /* backoff base, ms; 0 = global default */
    uint32_t retry_cap_ms;       /* backoff cap, ms (>= base when both set); 0 = global default */
    uint32_t max_attempts;       /* attempts before dead letter; 0 = global default */
    uint32_t brk_threshold;      /* consecutive failures that open the breaker; 0 = default */
    uint32_t brk_cooldown_ms;    /* breaker cooldown, ms; 0 = global default */
    uint32_t rate;               /* tokens per rate_period_ms; 0 = unlimited */
    uint32_t rate_period_ms;     /* rate period, ms; 0 = global default */
    uint32_t burst;              /* token bucket size; 0 = global default */
    uint32_t max_inflight;       /* concurrent requests per pod; 0 = global default */
    bool enabled;                /* false = deliveries are reported as disabled; absent = true */
    const char *reason;          /* why disabled, UTF-8 <= 256 bytes; NULL = none */
    uint64_t updated_ms;         /* last change, unix ms */
    const char *const *types;    /* event-type filter: exact types or "prefix.*" wildcards, no
                                    duplicates (NULL if none); empty = every type */
    size_t n_types;              /* entries in types, <= SL_EP_TYPES_MAX */
    const char *const *channels; /* channel labels, no duplicates (NULL if none); empty = no
                                    channel restriction */
    size_t n_channels;           /* entries in channels, <= SL_EP_CHANNELS_MAX */
    const char *kid;             /* id of the master key whose MAC key signed the record,
                                    [A-Za-z0-9_-] <= 16 bytes; NULL = unsigned */
    const uint8_t *mac;          /* HMAC-SHA256 over the record (sl_endpoint_rec_sign); NULL =
                                    unsigned; set only with kid */
    size_t mac_len;              /* bytes at mac: 0 or SL_ENDPOINT_MAC_LEN */
    void *own;                   /* single owned allocation, or NULL when borrowed */
};

/*
 * Same contracts as the delivery functions above. A tombstone (NULL Kafka value) is the
 * caller's business: these functions never see one, and a zero-length buf is rejected.
 * sl_endpoint_rec_fini wipes the secret ciphertexts before freeing.
 */
int sl_endpoint_rec_decode(const void *buf,
                           size_t len,
                           const struct sl_decode_limits *lim,
                           struct sl_endpoint_rec *out,
                           sl_err_t *err);
int sl_endpoint_rec_validate(const struct sl_endpoint_rec *e,
                             const struct sl_decode_limits *lim,
                             sl_err_t *err);
int sl_endpoint_rec_encode(const struct sl_endpoint_rec *e, struct sl_buf *out, sl_err_t *err);
int sl_endpoint_rec_encode_lim(const struct sl_endpoint_rec *e,
                               const struct sl_decode_limits *lim,
                               struct sl_buf *out,
                               sl_err_t *err);
void sl_endpoint_rec_fini(struct sl_endpoint_rec *e);

/* ==== Building blocks (exported for reuse: Kafka keys, sluice-produce, sluicectl) ==== */

/*
 * Walk len bytes of msgpack at buf (borrowed) without allocating: exactly one complete object,
 * no trailing bytes, no reserved byte 0xc1, every container's element count <= the bytes left
 * after its header, nesting <= max_depth. Returns 0 or SL_EDECODE. Run it before handing
 * untrusted bytes to msgpack-c.
 */
int sl_record_prescan(const void *buf, size_t len, unsigned max_depth, sl_err_t *err);

/* Each takes len bytes at s (borrowed, need not be NUL-terminated) and returns true if valid. */
bool sl_valid_event_id(const char *s, size_t len);     /* 1..128, 0x21..0x7e except '.' */
bool sl_valid_endpoint_id(const char *s, size_t len);  /* 1..64, [A-Za-z0-9_-] */
bool sl_valid_event_type(const char *s, size_t len);   /* 1..128, 0x21..0x7e */
bool sl_valid_content_type(const char *s, size_t len); /* 1..128, 0x20..0x7e */
bool sl_valid_header_name(const char *s, size_t len);  /* 1..64 RFC 9110 token chars */
/* <= 1024 bytes; no NUL, CR, LF or other control byte except HTAB; 0x80..0xff allowed */
bool sl_valid_header_value(const char *s, size_t len);
/* True for the names Sluice sets itself (webhook-id, content-type, host, ...), any case. */
bool sl_header_is_reserved(const char *name, size_t len);
bool sl_valid_macro_name(const char *s, size_t len); /* 1..64, [A-Za-z0-9_] */
/* One endpoint "types" entry: an exact event type without '*' (sl_valid_event_type rules), or a
 * wildcard "prefix.*" whose prefix is 1..126 bytes 0x21..0x7e without '*'. */
bool sl_valid_type_filter(const char *s, size_t len);
bool sl_valid_channel(const char *s, size_t len); /* 1..64, [A-Za-z0-9_.:-] */

#endif /* SL_RECORD_H */
