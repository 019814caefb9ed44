/*
 * sl_jsonl: one line of sluice-produce input (JSON) -> struct sl_delivery.
 *
 * Line format (one JSON object per line; unknown fields are rejected so typos fail loudly):
 *   "id"            string, optional: event id; absent = "evt_" + 26 random base32 characters
 *   "endpoint"      string, required: endpoint id (becomes "ep" and the Kafka key)
 *   "type"          string, required: event type
 *   "created_at_ms" integer >= 0, optional: unix ms; absent = now
 *   "content_type"  string, optional: default application/json
 *   "body"          any JSON value: a string's bytes are sent verbatim (UTF-8); any other value
 *                   is re-serialised compactly by jansson (numbers may change spelling)
 *   "body_base64"   string: the exact body bytes, strict standard base64 (sl_b64: padding
 *                   optional, no whitespace);
 *                   exactly one of "body" / "body_base64" is required
 *   "headers"       object {name: string}: extra request headers
 *   "macros"        object {name: string | number}: postback macro values; numbers become
 *                   their shortest round-trip decimal text (send strings to keep exact text)
 * Every rule of the delivery record (schemas/README.md) applies; messages use the JSON field
 * names above and never echo values.
 *
 * thread: any (uses OpenSSL RAND_bytes, which is thread-safe in OpenSSL 3).
 */
#ifndef SL_JSONL_H
#define SL_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/sl_err.h"
#include "common/sl_record.h"

#define SL_JSONL_MAX_LINE_DEFAULT ((size_t)4 * 1024 * 1024) /* bytes */
#define SL_JSONL_GEN_ID_LEN       30                        /* strlen("evt_") + 26 */

struct sl_jsonl_opts {
    size_t max_line;                    /* bytes, including any trailing newline;
                                           0 = SL_JSONL_MAX_LINE_DEFAULT */
    const struct sl_decode_limits *lim; /* borrowed; NULL = defaults (body <= 1 MiB) */
    uint64_t now_ms;                    /* "created_at_ms" when absent, unix ms;
                                           0 = read CLOCK_REALTIME */
    /* For sl_jsonl_event (the HTTP API's event objects); zero = sluice-produce's rules: */
    bool endpoint_optional;          /* "endpoint" may be absent: out->ep is then NULL */
    const char *const *extra_fields; /* further top-level fields allowed (the caller reads
                                        them itself), borrowed; NULL = none */
    size_t n_extra;                  /* entries in extra_fields */
    const char *id_if_absent;        /* event id used when "id" is absent (borrowed);
                                        NULL = a random one (sl_jsonl_gen_event_id) */
    const char *raw;                 /* the JSON text the object was parsed from (borrowed),
                                        or NULL: then a non-string "body" is re-serialised
                                        compactly; with it, the body is sent byte for byte
                                        as it stands in the text */
    size_t raw_len;                  /* bytes at raw */
};

/*
 * Parse len bytes at line (borrowed; need not be NUL-terminated; one trailing "\n" or "\r\n"
 * is ignored). opts: NULL = defaults. out: OUT, overwritten; on success it owns its memory
 * (sl_delivery_fini), on failure it is left empty. Returns 0 or SL_ETOOBIG (line or a field
 * over its limit), SL_EDECODE (not JSON, not an object, wrong JSON type), SL_EMISSING,
 * SL_EINVAL (unknown field, a value breaking a rule), SL_ECRYPTO (no randomness for an id).
 */
int sl_jsonl_parse(const char *line,
                   size_t len,
                   const struct sl_jsonl_opts *opts,
                   struct sl_delivery *out,
                   sl_err_t *err);

/*
 * As sl_jsonl_parse, from an already parsed JSON value obj (borrowed; not an object is
 * SL_EDECODE), with opts' event options above. Used by sluice-api for each event of a request.
 */
int sl_jsonl_event(json_t *obj,
                   const struct sl_jsonl_opts *opts,
                   struct sl_delivery *out,
                   sl_err_t *err);

/*
 * Spans in JSON text that jansson has already accepted (the functions do not validate; on
 * text that is not valid JSON they may report not found, never read past len):
 *   sl_json_member_span: the value of member name (borrowed, NUL-terminated) of the object
 *     that text[0..len) is (surrounding whitespace allowed): *off and *vlen (OUT) its bytes.
 *     Returns 0 when found, SL_ENOTFOUND when absent or when a member name holds an escape
 *     (it could spell name: the caller falls back to the parsed tree).
 *   sl_json_array_spans: the elements of the array that text[0..len) is: up to max spans
 *     into offs/lens (OUT), *n (OUT) how many. Returns 0, SL_ETOOBIG (more than max),
 *     SL_EDECODE (not an array).
 */
int sl_json_member_span(const char *text, size_t len, const char *name, size_t *off, size_t *vlen);
int sl_json_array_spans(
    const char *text, size_t len, size_t max, size_t *offs, size_t *lens, size_t *n);

/* The index of the first byte at or after i of s[0..n) that is not JSON whitespace (n when
 * none): the one whitespace rule of the span finders and the publish scanner. */
static inline size_t sl_json_ws_end(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* The request shapes sl_json_elide_bodies knows. */
enum sl_json_shape {
    SL_JSON_EVENT, /* one event object: its "body" */
    SL_JSON_BATCH, /* {"events": [event, ...]}: each event's "body" */
};

/*
 * The publish path's shortcut past jansson (common/sl_jsonfast.c says what "plain" means):
 * check text[0..len) in one pass and, when it is a plain JSON object, write into out (room
 * for len bytes, not NUL-terminated) the same text with every event's object or array
 * "body" replaced by {} or [], and its length into *out_len. Parsing out with jansson
 * (JSON_REJECT_DUPLICATES) then gives the tree of text with those bodies emptied; take the
 * bodies' bytes from text (sl_json_member_span). Returns 0, or SL_ENOTFOUND when the text
 * is not plain (invalid JSON included): parse text itself, which gives jansson's answer.
 */
int sl_json_elide_bodies(
    const char *text, size_t len, enum sl_json_shape shape, char *out, size_t *out_len);

/*
 * Write a fresh event id "evt_" + 26 base32 characters (130 random bits) and a NUL into out.
 * Returns 0 or SL_ECRYPTO.
 */
int sl_jsonl_gen_event_id(char out[SL_JSONL_GEN_ID_LEN + 1], sl_err_t *err);

/* A fixed description of a jansson error code, for messages to whoever sent the text
 * (jansson's own text would quote the input): "invalid UTF-8", "unexpected end of input",
 * "a key repeated in one object"... Static; "syntax error" for any other code. */
const char *sl_json_error_words(enum json_error_code code);

#endif /* SL_JSONL_H */
