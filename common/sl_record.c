/*
 * sl_record: strict msgpack codec for the delivery, outcome and endpoint records (see
 * sl_record.h and schemas/README.md).
 *
 * Decode pipeline, identical for the three records, each step bounded by the one before:
 *   1. size cap (lim->max_record) on the raw bytes;
 *   2. sl_record_prescan(): a non-allocating walk proving the bytes are one complete msgpack
 *      object whose containers all fit in the input and nest at most 8 deep, so msgpack-c's
 *      up-front container allocation is bounded by ~48 bytes per input byte;
 *   3. msgpack_unpack_next() into a zone; anything but SUCCESS consuming every byte is an error;
 *   4. locate(): top-level map -> one slot per known key (unknown keys ignored, duplicate or
 *      non-string keys rejected), then the version, then wire types, then required fields;
 *   5. scalars are range-checked into the output, strings checked for NUL;
 *   6. every string/bin/array is copied into ONE allocation sized by a measuring pass of the
 *      same fill function (struct blk), so the record outlives the input;
 *   7. the record-level rules (charsets, lengths, reserved headers, cross-field rules) run on
 *      the decoded struct through the same *_validate() the encoders use.
 * Encoders validate first, then emit keys in a fixed order, optional fields only when they
 * differ from their defaults; the emit function runs twice (count the top-level keys, then
 * write) so the map header is exact.
 */
#include "common/sl_record.h"

#include <stdalign.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <msgpack.h>

#include "common/sl_record_int.h"

/* ==== Limits ==== */

static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

size_t sl__lim_max_body(const struct sl_decode_limits *lim)
{
    return lim && lim->max_body ? lim->max_body : SL_MAX_BODY_DEFAULT;
}

size_t sl__lim_delivery_record(const struct sl_decode_limits *lim)
{
    if (lim && lim->max_record)
        return lim->max_record;
    return sat_add(sl__lim_max_body(lim), SL_RECORD_OVERHEAD);
}

/* The outcome "env" holds a whole delivery record, so its cap is the delivery record cap. */
static size_t lim_env(const struct sl_decode_limits *lim)
{
    return sat_add(sl__lim_max_body(lim), SL_RECORD_OVERHEAD);
}

static size_t lim_outcome_record(const struct sl_decode_limits *lim)
{
    if (lim && lim->max_record)
        return lim->max_record;
    return sat_add(lim_env(lim), SL_OUTCOME_OVERHEAD);
}

static size_t lim_endpoint_record(const struct sl_decode_limits *lim)
{
    return lim && lim->max_record ? lim->max_record : SL_ENDPOINT_RECORD_MAX;
}

/* ==== Character classes and building-block validators ==== */

typedef bool (*byte_class_fn)(unsigned char c);

static bool is_alnum(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

static bool cls_event_id(unsigned char c)
{
    return c >= 0x21 && c <= 0x7e && c != '.';
}

static bool cls_endpoint_id(unsigned char c)
{
    return is_alnum(c) || c == '_' || c == '-';
}

static bool cls_visible(unsigned char c)
{
    return c >= 0x21 && c <= 0x7e;
}

static bool cls_content_type(unsigned char c)
{
    return c >= 0x20 && c <= 0x7e;
}

static bool cls_macro_name(unsigned char c)
{
    return is_alnum(c) || c == '_';
}

static bool cls_err_class(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* RFC 9110 tchar: ALPHA / DIGIT / "!#$%&'*+-.^_`|~" */
static bool cls_token(unsigned char c)
{
    return is_alnum(c) || (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool all_in_class(const char *s, size_t len, byte_class_fn cls)
{
    for (size_t i = 0; i < len; i++) {
        if (!cls((unsigned char)s[i]))
            return false;
    }
    return true;
}

bool sl_valid_event_id(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_EVENT_ID_MAX && all_in_class(s, len, cls_event_id);
}

bool sl_valid_endpoint_id(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_ENDPOINT_ID_MAX && all_in_class(s, len, cls_endpoint_id);
}

bool sl_valid_event_type(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_EVENT_TYPE_MAX && all_in_class(s, len, cls_visible);
}

bool sl_valid_content_type(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_CT_MAX && all_in_class(s, len, cls_content_type);
}

bool sl_valid_header_name(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_HDR_NAME_MAX && all_in_class(s, len, cls_token);
}

bool sl_valid_macro_name(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_MACRO_NAME_MAX && all_in_class(s, len, cls_macro_name);
}

static bool cls_channel(unsigned char c)
{
    return is_alnum(c) || c == '_' || c == '.' || c == ':' || c == '-';
}

bool sl_valid_type_filter(const char *s, size_t len)
{
    if (!s || len == 0 || len > SL_EVENT_TYPE_MAX)
        return false;
    /* "prefix.*": the prefix (without its dot) is 1..126 bytes */
    bool wild = len >= 3 && s[len - 2] == '.' && s[len - 1] == '*';
    size_t body = wild ? len - 1 : len; /* "prefix." for a wildcard */
    return all_in_class(s, body, cls_visible) && memchr(s, '*', body) == NULL;
}

bool sl_valid_channel(const char *s, size_t len)
{
    return s && len >= 1 && len <= SL_CHANNEL_MAX && all_in_class(s, len, cls_channel);
}

/* NULL when the header value bytes are acceptable, else the broken rule (for messages). */
static const char *header_value_problem(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\r' || c == '\n')
            return "contains CR or LF";
        if (c == 0)
            return "contains NUL";
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return "contains a control character";
    }
    return NULL;
}

bool sl_valid_header_value(const char *s, size_t len)
{
    return (s || len == 0) && len <= SL_HDR_VALUE_MAX && header_value_problem(s, len) == NULL;
}

/* Headers Sluice computes itself; a record may not override them, nor add a second value
 * of one (the Standard Webhooks headers webhook-*, Sluice's own X-Sluice-*). */
static const char *const reserved_headers[] = {
    "content-type", "content-length", "host", "user-agent", "transfer-encoding", "connection",
};
static const char *const reserved_prefixes[] = {"webhook-", "x-sluice-"};

bool sl_header_is_reserved(const char *name, size_t len)
{
    if (!name)
        return false;
    for (size_t i = 0; i < sizeof(reserved_prefixes) / sizeof(reserved_prefixes[0]); i++) {
        size_t pl = strlen(reserved_prefixes[i]);
        if (len >= pl && strncasecmp(reserved_prefixes[i], name, pl) == 0)
            return true;
    }
    for (size_t i = 0; i < sizeof(reserved_headers) / sizeof(reserved_headers[0]); i++) {
        if (strlen(reserved_headers[i]) == len && strncasecmp(reserved_headers[i], name, len) == 0)
            return true;
    }
    return false;
}

/* Valid UTF-8 (no overlongs, surrogates or > U+10FFFF) without C0 controls or DEL. */
static bool utf8_text_ok(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                return false;
            i++;
            continue;
        }
        size_t need;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (len - i - 1 < need)
            return false;
        for (size_t k = 1; k <= need; k++) {
            unsigned b = s[i + k];
            if ((b & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (b & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += need + 1;
    }
    return true;
}

/* ==== Record-level rule checks (shared by validate, decode and sl_jsonl) ==== */

/*
 * A string field that must be present: 1..max bytes, every byte in cls. rule completes
 * "field "x" ..." when a byte is outside the class.
 */
static int check_word(const char *s,
                      const char *field,
                      size_t max,
                      byte_class_fn cls,
                      const char *rule,
                      sl_err_t *err)
{
    if (!s)
        return sl_err_set(err, SL_EMISSING, "field \"%s\" missing", field);
    size_t len = strlen(s);
    if (len == 0)
        return sl_err_set(err, SL_EINVAL, "field \"%s\" is empty", field);
    if (len > max)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" is longer than %zu bytes", field, max);
    if (!all_in_class(s, len, cls))
        return sl_err_set(err, SL_EINVAL, "field \"%s\" %s", field, rule);
    return 0;
}

/* Optional free text: NULL = absent; else <= max bytes of UTF-8 without control characters. */
static int check_text(const char *s, const char *field, size_t max, sl_err_t *err)
{
    if (!s)
        return 0;
    size_t len = strlen(s);
    if (len > max)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" is longer than %zu bytes", field, max);
    if (!utf8_text_ok(s, len))
        return sl_err_set(err, SL_EINVAL,
                          "field \"%s\" must be valid UTF-8 without control characters", field);
    return 0;
}

static const char RULE_EVENT_ID[] = "must contain only printable ASCII (0x21..0x7e) other than '.'";
static const char RULE_ENDPOINT_ID[] = "must contain only A-Z a-z 0-9 _ -";
static const char RULE_VISIBLE[] = "must contain only printable ASCII (0x21..0x7e)";
static const char RULE_CT[] = "must contain only printable ASCII and spaces";

static int check_headers(const struct sl_kv *h, size_t n, const char *field, sl_err_t *err)
{
    if (n == 0)
        return 0;
    if (!h)
        return sl_err_set(err, SL_EINVAL, "field \"%s\" has entries but no array", field);
    if (n > SL_HDR_MAX)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" has %zu entries, limit %d", field, n,
                          SL_HDR_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!h[i].name || !h[i].value)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": header %zu is incomplete", field, i);
        size_t nl = strlen(h[i].name), vl = strlen(h[i].value);
        if (nl == 0)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": name of header %zu is empty", field,
                              i);
        if (nl > SL_HDR_NAME_MAX)
            return sl_err_set(err, SL_ETOOBIG,
                              "field \"%s\": name of header %zu is longer than %d bytes", field, i,
                              SL_HDR_NAME_MAX);
        if (!all_in_class(h[i].name, nl, cls_token))
            return sl_err_set(err, SL_EINVAL,
                              "field \"%s\": name of header %zu is not an HTTP token", field, i);
        if (sl_header_is_reserved(h[i].name, nl))
            return sl_err_set(err, SL_EINVAL,
                              "field \"%s\": name of header %zu is reserved (set by sluice)", field,
                              i);
        for (size_t j = 0; j < i; j++) {
            if (strcasecmp(h[i].name, h[j].name) == 0)
                return sl_err_set(err, SL_EINVAL,
                                  "field \"%s\": name of header %zu repeats header %zu", field, i,
                                  j);
        }
        if (vl > SL_HDR_VALUE_MAX)
            return sl_err_set(err, SL_ETOOBIG,
                              "field \"%s\": value of header %zu is longer than %d bytes", field, i,
                              SL_HDR_VALUE_MAX);
        const char *why = header_value_problem(h[i].value, vl);
        if (why)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": value of header %zu %s", field, i,
                              why);
    }
    return 0;
}

static int check_macros(const struct sl_kv *m, size_t n, const char *field, sl_err_t *err)
{
    if (n == 0)
        return 0;
    if (!m)
        return sl_err_set(err, SL_EINVAL, "field \"%s\" has entries but no array", field);
    if (n > SL_MACRO_MAX)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" has %zu entries, limit %d", field, n,
                          SL_MACRO_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!m[i].name || !m[i].value)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": macro %zu is incomplete", field, i);
        size_t nl = strlen(m[i].name);
        if (nl == 0)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": name of macro %zu is empty", field, i);
        if (nl > SL_MACRO_NAME_MAX)
            return sl_err_set(err, SL_ETOOBIG,
                              "field \"%s\": name of macro %zu is longer than %d bytes", field, i,
                              SL_MACRO_NAME_MAX);
        if (!all_in_class(m[i].name, nl, cls_macro_name))
            return sl_err_set(err, SL_EINVAL,
                              "field \"%s\": name of macro %zu must contain only A-Z a-z 0-9 _",
                              field, i);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(m[i].name, m[j].name) == 0)
                return sl_err_set(err, SL_EINVAL,
                                  "field \"%s\": name of macro %zu repeats macro %zu", field, i, j);
        }
        if (strlen(m[i].value) > SL_MACRO_VALUE_MAX)
            return sl_err_set(err, SL_ETOOBIG,
                              "field \"%s\": value of macro %zu is longer than %d bytes", field, i,
                              SL_MACRO_VALUE_MAX);
    }
    return 0;
}

/*
 * An array of distinct strings (endpoint "types", "channels"): at most max entries, each one
 * accepted by valid(), none repeated. what completes "entry N is not ...".
 */
static int check_str_list(const char *const *v,
                          size_t n,
                          const char *field,
                          size_t max,
                          size_t max_len,
                          bool (*valid)(const char *, size_t),
                          const char *what,
                          sl_err_t *err)
{
    if (n == 0)
        return 0;
    if (!v)
        return sl_err_set(err, SL_EINVAL, "field \"%s\" has entries but no array", field);
    if (n > max)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" has %zu entries, limit %zu", field, n,
                          max);
    for (size_t i = 0; i < n; i++) {
        if (!v[i])
            return sl_err_set(err, SL_EINVAL, "field \"%s\": entry %zu is missing", field, i);
        size_t len = strlen(v[i]);
        if (len == 0)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": entry %zu is empty", field, i);
        if (len > max_len)
            return sl_err_set(err, SL_ETOOBIG, "field \"%s\": entry %zu is longer than %zu bytes",
                              field, i, max_len);
        if (!valid(v[i], len))
            return sl_err_set(err, SL_EINVAL, "field \"%s\": entry %zu is not %s", field, i, what);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(v[i], v[j]) == 0)
                return sl_err_set(err, SL_EINVAL, "field \"%s\": entry %zu repeats entry %zu",
                                  field, i, j);
        }
    }
    return 0;
}

static const char RULE_TYPE_FILTER[] =
    "an event type (printable ASCII without '*') or a \"prefix.*\" wildcard";
static const char RULE_CHANNEL[] = "1..64 characters A-Z a-z 0-9 _ . : -";

/* ==== Prescan ==== */

/* msgpack-c's own fixed stack depth; deeper limits make no sense. */
#define PRESCAN_DEPTH_CAP 32

static uint64_t be_read(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* What a msgpack type byte says about the bytes that follow it. */
struct mp_head {
    size_t lenbytes; /* big-endian length/count bytes right after the type byte */
    uint64_t fixed;  /* payload bytes not given by a length field (fixstr length, int width) */
    bool has_len;    /* payload = length field + fixed (str, bin, ext) */
    unsigned mult;   /* containers: elements per counted entry (1 array, 2 map); 0 = scalar */
    uint64_t count;  /* entries of fixmap/fixarray (others read it from lenbytes) */
};

/* Decode type byte b into h; false for the reserved byte 0xc1. */
static bool mp_head_of(uint8_t b, struct mp_head *h)
{
    memset(h, 0, sizeof(*h));
    if (b <= 0x7f || b >= 0xe0) /* positive / negative fixint */
        return true;
    if (b <= 0x8f) {
        h->mult = 2, h->count = b & 0x0f;
    } else if (b <= 0x9f) {
        h->mult = 1, h->count = b & 0x0f;
    } else if (b <= 0xbf) {
        h->fixed = b & 0x1f;
    } else if (b == 0xc1) {
        return false;
    } else if (b <= 0xc3) { /* nil, false, true */
    } else if (b <= 0xc6) { /* bin 8/16/32 */
        h->lenbytes = (size_t)1 << (b - 0xc4), h->has_len = true;
    } else if (b <= 0xc9) { /* ext 8/16/32: length, type byte, data */
        h->lenbytes = (size_t)1 << (b - 0xc7), h->has_len = true, h->fixed = 1;
    } else if (b <= 0xcb) { /* float 32/64 */
        h->fixed = b == 0xca ? 4 : 8;
    } else if (b <= 0xcf) { /* uint 8..64 */
        h->fixed = (uint64_t)1 << (b - 0xcc);
    } else if (b <= 0xd3) { /* int 8..64 */
        h->fixed = (uint64_t)1 << (b - 0xd0);
    } else if (b <= 0xd8) { /* fixext 1..16 plus the type byte */
        h->fixed = ((uint64_t)1 << (b - 0xd4)) + 1;
    } else if (b <= 0xdb) { /* str 8/16/32 */
        h->lenbytes = (size_t)1 << (b - 0xd9), h->has_len = true;
    } else if (b <= 0xdd) { /* array 16/32 */
        h->lenbytes = (size_t)2 << (b - 0xdc), h->mult = 1;
    } else { /* map 16/32 */
        h->lenbytes = (size_t)2 << (b - 0xde), h->mult = 2;
    }
    return true;
}

int sl_record_prescan(const void *buf, size_t len, unsigned max_depth, sl_err_t *err)
{
    const uint8_t *p = buf;
    uint64_t rem[PRESCAN_DEPTH_CAP + 1]; /* elements still expected at each open level */
    unsigned depth = 0;
    size_t pos = 0;
    struct mp_head h;

    if (!p || len == 0)
        return sl_err_set(err, SL_EDECODE, "record is empty");
    if (max_depth > PRESCAN_DEPTH_CAP)
        max_depth = PRESCAN_DEPTH_CAP;
    rem[0] = 1; /* level 0 is the slot for the single top-level object */
    for (;;) {
        while (rem[depth] == 0) {
            if (depth == 0)
                goto done;
            depth--;
        }
        rem[depth]--;
        if (pos >= len)
            return sl_err_set(err, SL_EDECODE, "record is truncated at offset %zu", pos);
        size_t at = pos;
        if (!mp_head_of(p[pos++], &h))
            return sl_err_set(err, SL_EDECODE, "record has reserved byte 0xc1 at offset %zu", at);
        if (h.lenbytes > len - pos)
            return sl_err_set(err, SL_EDECODE, "record is truncated at offset %zu", pos);
        if (h.lenbytes) {
            h.count = be_read(p + pos, h.lenbytes);
            pos += h.lenbytes;
        }
        if (h.mult == 0) {
            uint64_t skip = h.fixed + (h.has_len ? h.count : 0);
            if (skip > len - pos)
                return sl_err_set(err, SL_EDECODE, "record is truncated at offset %zu", pos);
            pos += (size_t)skip;
            continue;
        }
        /* A container: every element needs at least one byte, so a count larger than what is
         * left is a lie, caught before msgpack-c reserves memory for it. */
        uint64_t elems = h.count * h.mult; /* count < 2^32: no overflow */
        if (depth + 1 > max_depth)
            return sl_err_set(err, SL_EDECODE, "record nests containers deeper than %u levels",
                              max_depth);
        if (elems > len - pos)
            return sl_err_set(err, SL_EDECODE,
                              "container at offset %zu declares %llu elements but only %zu "
                              "bytes remain",
                              at, (unsigned long long)elems, len - pos);
        rem[++depth] = elems;
    }
done:
    if (pos != len)
        return sl_err_set(err, SL_EDECODE, "record has %zu trailing bytes after the first object",
                          len - pos);
    return 0;
}

/* ==== msgpack decoding helpers ==== */

enum ftype { FT_UINT, FT_BOOL, FT_STR, FT_BIN, FT_BINSTR, FT_MAP, FT_ARRAY };
enum freq { OPT = 0, REQ, REQ_UNLESS_QUARANTINED };

struct fdesc {
    const char *key; /* msgpack map key */
    enum ftype type; /* accepted wire type(s) */
    enum freq req;   /* presence rule */
};

static const char *ftype_words(enum ftype t)
{
    switch (t) {
    case FT_UINT:
        return "an unsigned integer";
    case FT_BOOL:
        return "a boolean";
    case FT_STR:
        return "a string";
    case FT_BIN:
        return "binary";
    case FT_BINSTR:
        return "binary or a string";
    case FT_MAP:
        return "a map";
    case FT_ARRAY:
        return "an array";
    }
    return "?";
}

static bool ftype_ok(enum ftype t, const msgpack_object *o)
{
    switch (t) {
    case FT_UINT:
        return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    case FT_BOOL:
        return o->type == MSGPACK_OBJECT_BOOLEAN;
    case FT_STR:
        return o->type == MSGPACK_OBJECT_STR;
    case FT_BIN:
        return o->type == MSGPACK_OBJECT_BIN;
    case FT_BINSTR:
        return o->type == MSGPACK_OBJECT_BIN || o->type == MSGPACK_OBJECT_STR;
    case FT_MAP:
        return o->type == MSGPACK_OBJECT_MAP;
    case FT_ARRAY:
        return o->type == MSGPACK_OBJECT_ARRAY;
    }
    return false;
}

static bool obj_str_eq(const msgpack_object *a, const msgpack_object *b)
{
    return a->via.str.size == b->via.str.size &&
           memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0;
}

/*
 * Map every key of map to its slot in tab (slot[i] = value object or NULL). pfx prefixes the
 * messages ("" for a record, "field \"secrets\": entry 2 " for nested maps).
 */
static int locate(const msgpack_object *map,
                  const char *pfx,
                  const struct fdesc *tab,
                  size_t ntab,
                  const msgpack_object **slot,
                  sl_err_t *err)
{
    uint32_t n = map->via.map.size;
    const msgpack_object_kv *kv = map->via.map.ptr;

    for (size_t f = 0; f < ntab; f++)
        slot[f] = NULL;
    if (n > SL_RECORD_MAX_FIELDS)
        return sl_err_set(err, SL_ETOOBIG, "%smap has %u entries, limit %d", pfx, n,
                          SL_RECORD_MAX_FIELDS);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = &kv[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return sl_err_set(err, SL_EDECODE, "%smap key %u is not a string", pfx, i);
        size_t f;
        for (f = 0; f < ntab; f++) {
            if (strlen(tab[f].key) == k->via.str.size &&
                memcmp(tab[f].key, k->via.str.ptr, k->via.str.size) == 0)
                break;
        }
        /* n <= 64, so the quadratic duplicate check is at most 2016 comparisons. */
        for (uint32_t j = 0; j < i; j++) {
            if (kv[j].key.type == MSGPACK_OBJECT_STR && obj_str_eq(k, &kv[j].key)) {
                if (f < ntab)
                    return sl_err_set(err, SL_EDECODE, "%sfield \"%s\" appears twice", pfx,
                                      tab[f].key);
                return sl_err_set(err, SL_EDECODE, "%smap key %u repeats key %u", pfx, i, j);
            }
        }
        if (f < ntab)
            slot[f] = &kv[i].val;
    }
    return 0;
}

static int typecheck(const msgpack_object **slot,
                     const struct fdesc *tab,
                     size_t ntab,
                     const char *pfx,
                     sl_err_t *err)
{
    for (size_t f = 0; f < ntab; f++) {
        if (slot[f] && !ftype_ok(tab[f].type, slot[f]))
            return sl_err_set(err, SL_EDECODE, "%sfield \"%s\" must be %s", pfx, tab[f].key,
                              ftype_words(tab[f].type));
    }
    return 0;
}

static int check_required(const msgpack_object **slot,
                          const struct fdesc *tab,
                          size_t ntab,
                          bool quarantined,
                          const char *pfx,
                          sl_err_t *err)
{
    for (size_t f = 0; f < ntab; f++) {
        bool need = tab[f].req == REQ || (tab[f].req == REQ_UNLESS_QUARANTINED && !quarantined);
        if (need && !slot[f])
            return sl_err_set(err, SL_EMISSING, "%sfield \"%s\" missing", pfx, tab[f].key);
    }
    return 0;
}

/* Field 0 of every table is "v"; checked before types so a v2 record gets a version error. */
static int check_version(const msgpack_object *v, const char *rec, sl_err_t *err)
{
    if (!v)
        return sl_err_set(err, SL_EMISSING, "field \"v\" missing");
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return sl_err_set(err, SL_EDECODE, "field \"v\" must be an unsigned integer");
    if (v->via.u64 != SL_RECORD_VERSION)
        return sl_err_set(err, SL_EVERSION, "unsupported %s version %llu", rec,
                          (unsigned long long)v->via.u64);
    return 0;
}

/*
 * Steps 1-3 of the pipeline: cap, prescan, unpack; u holds the root map on success (the caller
 * destroys u either way).
 */
static int unpack_root(const void *buf,
                       size_t len,
                       size_t max_record,
                       const char *rec,
                       msgpack_unpacked *u,
                       sl_err_t *err)
{
    if (!buf || len == 0)
        return sl_err_set(err, SL_EDECODE, "%s record is empty", rec);
    if (len > max_record)
        return sl_err_set(err, SL_ETOOBIG, "%s record is %zu bytes, limit %zu", rec, len,
                          max_record);
    int rc = sl_record_prescan(buf, len, SL_RECORD_MAX_DEPTH, err);
    if (rc)
        return rc;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(u, buf, len, &off);
    switch (ur) {
    case MSGPACK_UNPACK_SUCCESS:
    case MSGPACK_UNPACK_EXTRA_BYTES:
        break;
    case MSGPACK_UNPACK_CONTINUE:
        return sl_err_set(err, SL_EDECODE, "%s record is truncated", rec);
    case MSGPACK_UNPACK_NOMEM_ERROR:
        return sl_err_set(err, SL_ENOMEM, "could not decode %s record: out of memory", rec);
    default:
        return sl_err_set(err, SL_EDECODE, "%s record is not valid msgpack", rec);
    }
    if (off != len)
        return sl_err_set(err, SL_EDECODE, "%s record has %zu trailing bytes", rec, len - off);
    if (u->data.type != MSGPACK_OBJECT_MAP)
        return sl_err_set(err, SL_EDECODE, "%s record is not a map", rec);
    return 0;
}

static int get_u32(const msgpack_object *o, const char *key, uint32_t *out, sl_err_t *err)
{
    if (!o)
        return 0;
    if (o->via.u64 > UINT32_MAX)
        return sl_err_set(err, SL_EINVAL, "field \"%s\" is out of range (max %u)", key,
                          (unsigned)UINT32_MAX);
    *out = (uint32_t)o->via.u64;
    return 0;
}

static uint64_t get_u64(const msgpack_object *o)
{
    return o ? o->via.u64 : 0;
}

static bool get_bool(const msgpack_object *o, bool dflt)
{
    return o ? o->via.boolean : dflt;
}

static int check_no_nul(const msgpack_object *o, const char *key, sl_err_t *err)
{
    if (o && o->via.str.size && memchr(o->via.str.ptr, 0, o->via.str.size))
        return sl_err_set(err, SL_EINVAL, "field \"%s\" contains NUL", key);
    return 0;
}

/*
 * A map of str -> str (hdr, macros): count cap before anything else, then wire types and NUL
 * (the decoded strings are NUL-terminated, so a NUL inside would silently truncate them).
 */
static int
check_kv_map(const msgpack_object *o, const char *key, const char *what, size_t max, sl_err_t *err)
{
    if (!o)
        return 0;
    if (o->via.map.size > max)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" has %u entries, limit %zu", key,
                          o->via.map.size, max);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            return sl_err_set(err, SL_EDECODE, "field \"%s\": name of %s %u must be a string", key,
                              what, i);
        if (v->type != MSGPACK_OBJECT_STR)
            return sl_err_set(err, SL_EDECODE, "field \"%s\": value of %s %u must be a string", key,
                              what, i);
        if (k->via.str.size && memchr(k->via.str.ptr, 0, k->via.str.size))
            return sl_err_set(err, SL_EINVAL, "field \"%s\": name of %s %u contains NUL", key, what,
                              i);
        if (v->via.str.size && memchr(v->via.str.ptr, 0, v->via.str.size))
            return sl_err_set(err, SL_EINVAL, "field \"%s\": value of %s %u contains NUL", key,
                              what, i);
    }
    return 0;
}

/* ==== One-allocation builder ==== */

/*
 * Fill functions run twice: with base == NULL they only add up the bytes they would take
 * (returned pointers are NULL and must not be written through), then again into one block of
 * exactly that size.
 */
struct blk {
    uint8_t *base; /* NULL while measuring */
    size_t used;   /* bytes taken so far */
};

static void *blk_take(struct blk *b, size_t n, size_t align)
{
    size_t off = (b->used + align - 1) & ~(align - 1);
    b->used = off + n;
    return b->base ? b->base + off : NULL;
}

/* Copy n bytes and a terminating NUL; returns the copy (NULL while measuring). */
static char *blk_bytes(struct blk *b, const void *src, size_t n)
{
    char *d = blk_take(b, n + 1, 1);
    if (d) {
        if (n)
            memcpy(d, src, n);
        d[n] = '\0';
    }
    return d;
}

static const char *blk_obj_str(struct blk *b, const msgpack_object *o)
{
    if (!o)
        return NULL;
    return blk_bytes(b, o->via.str.ptr, o->via.str.size);
}

/* bin or str payload */
static const uint8_t *blk_obj_bytes(struct blk *b, const msgpack_object *o, size_t *len)
{
    const char *p = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.ptr : o->via.str.ptr;
    uint32_t n = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.size : o->via.str.size;
    *len = n;
    return (const uint8_t *)blk_bytes(b, p, n);
}

static const struct sl_kv *blk_obj_kv(struct blk *b, const msgpack_object *o, size_t *n)
{
    *n = 0;
    if (!o || o->via.map.size == 0)
        return NULL;
    struct sl_kv *kv = blk_take(b, o->via.map.size * sizeof(*kv), alignof(struct sl_kv));
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const char *name = blk_obj_str(b, &o->via.map.ptr[i].key);
        const char *value = blk_obj_str(b, &o->via.map.ptr[i].val);
        if (kv) {
            kv[i].name = name;
            kv[i].value = value;
        }
    }
    *n = o->via.map.size;
    return kv;
}

static const char *blk_cstr(struct blk *b, const char *s)
{
    return s ? blk_bytes(b, s, strlen(s)) : NULL;
}

/* ==== Encoding helpers ==== */

/*
 * A msgpack-c packer writing into an sl_buf, with a sticky error: after the first failed
 * append every call is a no-op, and the emit function checks e->rc once at the end.
 * In counting mode nothing is written and e_field() only counts top-level keys.
 */
struct enc {
    msgpack_packer pk; /* writes through enc_write */
    struct sl_buf *b;  /* destination (borrowed) */
    int rc;            /* first append error, or 0 */
    bool counting;     /* pass 1: count top-level fields only */
    uint32_t nfields;  /* top-level fields counted in pass 1 */
};

static int enc_write(void *data, const char *p, size_t n)
{
    struct enc *e = data;
    if (e->rc)
        return -1;
    int rc = sl_buf_append(e->b, p, n);
    if (rc) {
        e->rc = rc;
        return -1;
    }
    return 0;
}

static bool e_on(const struct enc *e)
{
    return !e->counting && !e->rc;
}

static void e_str(struct enc *e, const char *s, size_t n)
{
    if (!e_on(e))
        return;
    (void)msgpack_pack_str(&e->pk, n);
    (void)msgpack_pack_str_body(&e->pk, s, n);
}

static void e_cstr(struct enc *e, const char *s)
{
    e_str(e, s, strlen(s));
}

static void e_field(struct enc *e, const char *key)
{
    if (e->counting)
        e->nfields++;
    else
        e_cstr(e, key);
}

static void e_uint(struct enc *e, uint64_t v)
{
    if (e_on(e))
        (void)msgpack_pack_uint64(&e->pk, v);
}

static void e_bool(struct enc *e, bool v)
{
    if (!e_on(e))
        return;
    if (v)
        (void)msgpack_pack_true(&e->pk);
    else
        (void)msgpack_pack_false(&e->pk);
}

static void e_bin(struct enc *e, const uint8_t *p, size_t n)
{
    if (!e_on(e))
        return;
    (void)msgpack_pack_bin(&e->pk, n);
    (void)msgpack_pack_bin_body(&e->pk, p, n);
}

static void e_map(struct enc *e, size_t n)
{
    if (e_on(e))
        (void)msgpack_pack_map(&e->pk, n);
}

static void e_array(struct enc *e, size_t n)
{
    if (e_on(e))
        (void)msgpack_pack_array(&e->pk, n);
}

static void e_kv(struct enc *e, const struct sl_kv *kv, size_t n)
{
    e_map(e, n);
    for (size_t i = 0; i < n; i++) {
        e_cstr(e, kv[i].name);
        e_cstr(e, kv[i].value);
    }
}

typedef void (*emit_fn)(struct enc *e, const void *rec);

/*
 * Append the encoding of rec to out: count pass, map header, write pass; the result must fit
 * max_record. On failure out is truncated back to its previous length.
 */
static int encode_with(emit_fn emit,
                       const void *rec,
                       const char *name,
                       size_t max_record,
                       struct sl_buf *out,
                       sl_err_t *err)
{
    size_t start = out->len;
    struct enc e = {.b = out, .counting = true};

    msgpack_packer_init(&e.pk, &e, enc_write);
    emit(&e, rec);
    e.counting = false;
    e_map(&e, e.nfields);
    emit(&e, rec);
    if (e.rc) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
        return sl_err_set(err, e.rc,
                          "encoded %s record exceeds the output buffer limit (%zu bytes)", name,
                          out->max);
    }
    if (out->len - start > max_record) {
        size_t n = out->len - start;
        out->len = start;
        out->data[start] = '\0';
        return sl_err_set(err, SL_ETOOBIG, "encoded %s record is %zu bytes, limit %zu", name, n,
                          max_record);
    }
    return 0;
}

/* ==== delivery ==== */

enum { D_V, D_ID, D_EP, D_TYPE, D_TS, D_CT, D_BODY, D_HDR, D_MACROS, D_ATTEMPT, D_REPLAY, D__N };

static const struct fdesc delivery_fields[D__N] = {
    [D_V] = {"v", FT_UINT, REQ},           [D_ID] = {"id", FT_STR, REQ},
    [D_EP] = {"ep", FT_STR, REQ},          [D_TYPE] = {"type", FT_STR, REQ},
    [D_TS] = {"ts", FT_UINT, REQ},         [D_CT] = {"ct", FT_STR, OPT},
    [D_BODY] = {"body", FT_BINSTR, REQ},   [D_HDR] = {"hdr", FT_MAP, OPT},
    [D_MACROS] = {"macros", FT_MAP, OPT},  [D_ATTEMPT] = {"attempt", FT_UINT, OPT},
    [D_REPLAY] = {"replay", FT_BOOL, OPT},
};

const struct sl__delivery_names sl__delivery_msgpack_names = {
    .id = "id",
    .ep = "ep",
    .type = "type",
    .ct = "ct",
    .body = "body",
    .hdr = "hdr",
    .macros = "macros",
};

int sl__delivery_validate_named(const struct sl_delivery *d,
                                const struct sl_decode_limits *lim,
                                const struct sl__delivery_names *nm,
                                sl_err_t *err)
{
    int rc;
    size_t max_body = sl__lim_max_body(lim);

    if (!d)
        return sl_err_set(err, SL_EINVAL, "no delivery record");
    rc = check_word(d->id, nm->id, SL_EVENT_ID_MAX, cls_event_id, RULE_EVENT_ID, err);
    if (rc)
        return rc;
    rc = check_word(d->ep, nm->ep, SL_ENDPOINT_ID_MAX, cls_endpoint_id, RULE_ENDPOINT_ID, err);
    if (rc)
        return rc;
    rc = check_word(d->type, nm->type, SL_EVENT_TYPE_MAX, cls_visible, RULE_VISIBLE, err);
    if (rc)
        return rc;
    if (d->ct) {
        rc = check_word(d->ct, nm->ct, SL_CT_MAX, cls_content_type, RULE_CT, err);
        if (rc)
            return rc;
    }
    if (!d->body && d->body_len)
        return sl_err_set(err, SL_EINVAL, "field \"%s\" has a length but no bytes", nm->body);
    if (d->body_len > max_body)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" is %zu bytes, limit %zu", nm->body,
                          d->body_len, max_body);
    rc = check_headers(d->hdr, d->n_hdr, nm->hdr, err);
    if (rc)
        return rc;
    return check_macros(d->macros, d->n_macros, nm->macros, err);
}

int sl_delivery_validate(const struct sl_delivery *d,
                         const struct sl_decode_limits *lim,
                         sl_err_t *err)
{
    return sl__delivery_validate_named(d, lim, &sl__delivery_msgpack_names, err);
}

static void delivery_fill_obj(struct blk *b, const msgpack_object **s, struct sl_delivery *d)
{
    d->id = blk_obj_str(b, s[D_ID]);
    d->ep = blk_obj_str(b, s[D_EP]);
    d->type = blk_obj_str(b, s[D_TYPE]);
    d->ct = s[D_CT] ? blk_obj_str(b, s[D_CT]) : SL_DELIVERY_CT_DEFAULT;
    d->body = blk_obj_bytes(b, s[D_BODY], &d->body_len);
    d->hdr = blk_obj_kv(b, s[D_HDR], &d->n_hdr);
    d->macros = blk_obj_kv(b, s[D_MACROS], &d->n_macros);
}

int sl_delivery_decode(const void *buf,
                       size_t len,
                       const struct sl_decode_limits *lim,
                       struct sl_delivery *out,
                       sl_err_t *err)
{
    const msgpack_object *s[D__N];
    struct blk b = {0};
    msgpack_unpacked u;
    size_t body_len;
    int rc;

    memset(out, 0, sizeof(*out));
    msgpack_unpacked_init(&u);
    rc = unpack_root(buf, len, sl__lim_delivery_record(lim), "delivery", &u, err);
    if (rc)
        goto out;
    rc = locate(&u.data, "", delivery_fields, D__N, s, err);
    if (rc)
        goto out;
    rc = check_version(s[D_V], "delivery", err);
    if (rc)
        goto out;
    rc = typecheck(s, delivery_fields, D__N, "", err);
    if (rc)
        goto out;
    rc = check_required(s, delivery_fields, D__N, false, "", err);
    if (rc)
        goto out;
    for (int f = D_ID; f <= D_CT; f++) {
        if (delivery_fields[f].type == FT_STR) {
            rc = check_no_nul(s[f], delivery_fields[f].key, err);
            if (rc)
                goto out;
        }
    }
    rc = check_kv_map(s[D_HDR], "hdr", "header", SL_HDR_MAX, err);
    if (rc)
        goto out;
    rc = check_kv_map(s[D_MACROS], "macros", "macro", SL_MACRO_MAX, err);
    if (rc)
        goto out;
    rc = get_u32(s[D_ATTEMPT], "attempt", &out->attempt, err);
    if (rc)
        goto out;
    out->ts_ms = get_u64(s[D_TS]);
    out->replay = get_bool(s[D_REPLAY], false);
    /* Cheap caps before copying: a body over the limit is not worth a copy. */
    body_len =
        s[D_BODY]->type == MSGPACK_OBJECT_BIN ? s[D_BODY]->via.bin.size : s[D_BODY]->via.str.size;
    if (body_len > sl__lim_max_body(lim)) {
        rc = sl_err_set(err, SL_ETOOBIG, "field \"body\" is %zu bytes, limit %zu", body_len,
                        sl__lim_max_body(lim));
        goto out;
    }

    delivery_fill_obj(&b, s, out);
    b.base = sl_xmalloc(b.used);
    b.used = 0;
    out->own = b.base;
    delivery_fill_obj(&b, s, out);
    rc = sl_delivery_validate(out, lim, err);
out:
    msgpack_unpacked_destroy(&u);
    if (rc)
        sl_delivery_fini(out);
    return rc;
}

static const struct sl_kv *blk_kv_copy(struct blk *b, const struct sl_kv *src, size_t n)
{
    if (!src || n == 0)
        return NULL;
    struct sl_kv *kv = blk_take(b, n * sizeof(*kv), alignof(struct sl_kv));
    for (size_t i = 0; i < n; i++) {
        const char *name = blk_cstr(b, src[i].name);
        const char *value = blk_cstr(b, src[i].value);
        if (kv) {
            kv[i].name = name;
            kv[i].value = value;
        }
    }
    return kv;
}

static void delivery_fill_copy(struct blk *b, const struct sl_delivery *src, struct sl_delivery *d)
{
    d->id = blk_cstr(b, src->id);
    d->ep = blk_cstr(b, src->ep);
    d->type = blk_cstr(b, src->type);
    d->ct = blk_cstr(b, src->ct);
    d->body = (const uint8_t *)blk_bytes(b, src->body, src->body ? src->body_len : 0);
    d->body_len = src->body ? src->body_len : 0;
    d->hdr = blk_kv_copy(b, src->hdr, src->n_hdr);
    d->n_hdr = src->hdr ? src->n_hdr : 0;
    d->macros = blk_kv_copy(b, src->macros, src->n_macros);
    d->n_macros = src->macros ? src->n_macros : 0;
}

void sl_delivery_copy(struct sl_delivery *dst, const struct sl_delivery *src)
{
    struct blk b = {0};
    struct sl_delivery d = {0};

    d.ts_ms = src->ts_ms;
    d.attempt = src->attempt;
    d.replay = src->replay;
    delivery_fill_copy(&b, src, &d);
    b.base = sl_xmalloc(b.used);
    b.used = 0;
    d.own = b.base;
    delivery_fill_copy(&b, src, &d);
    *dst = d;
}

static void delivery_emit(struct enc *e, const void *rec)
{
    const struct sl_delivery *d = rec;

    e_field(e, "v");
    e_uint(e, SL_RECORD_VERSION);
    e_field(e, "id");
    e_cstr(e, d->id);
    e_field(e, "ep");
    e_cstr(e, d->ep);
    e_field(e, "type");
    e_cstr(e, d->type);
    e_field(e, "ts");
    e_uint(e, d->ts_ms);
    if (d->ct && strcmp(d->ct, SL_DELIVERY_CT_DEFAULT) != 0) {
        e_field(e, "ct");
        e_cstr(e, d->ct);
    }
    e_field(e, "body");
    e_bin(e, d->body, d->body_len);
    if (d->n_hdr) {
        e_field(e, "hdr");
        e_kv(e, d->hdr, d->n_hdr);
    }
    if (d->n_macros) {
        e_field(e, "macros");
        e_kv(e, d->macros, d->n_macros);
    }
    if (d->attempt) {
        e_field(e, "attempt");
        e_uint(e, d->attempt);
    }
    if (d->replay) {
        e_field(e, "replay");
        e_bool(e, true);
    }
}

int sl_delivery_encode_lim(const struct sl_delivery *d,
                           const struct sl_decode_limits *lim,
                           struct sl_buf *out,
                           sl_err_t *err)
{
    int rc = sl_delivery_validate(d, lim, err);
    if (rc)
        return rc;
    return encode_with(delivery_emit, d, "delivery", sl__lim_delivery_record(lim), out, err);
}

int sl_delivery_encode(const struct sl_delivery *d, struct sl_buf *out, sl_err_t *err)
{
    return sl_delivery_encode_lim(d, NULL, out, err);
}

void sl_delivery_fini(struct sl_delivery *d)
{
    if (!d)
        return;
    free(d->own);
    memset(d, 0, sizeof(*d));
}

/* ==== outcome ==== */

static const char *const outcome_state_names[SL_OUTCOME_STATE_COUNT] = {
    [SL_OUTCOME_DELIVERED] = "delivered",     [SL_OUTCOME_RETRY_SCHEDULED] = "retry_scheduled",
    [SL_OUTCOME_DEAD_LETTER] = "dead_letter", [SL_OUTCOME_DUPLICATE] = "duplicate",
    [SL_OUTCOME_DEFERRED] = "deferred",       [SL_OUTCOME_QUARANTINED] = "quarantined",
    [SL_OUTCOME_DISABLED] = "disabled",
};

const char *sl_outcome_state_name(enum sl_outcome_state state)
{
    if ((unsigned)state >= SL_OUTCOME_STATE_COUNT)
        return NULL;
    return outcome_state_names[state];
}

int sl_outcome_state_parse(const char *s, size_t len, enum sl_outcome_state *out)
{
    for (unsigned i = 0; s && i < SL_OUTCOME_STATE_COUNT; i++) {
        if (strlen(outcome_state_names[i]) == len && memcmp(outcome_state_names[i], s, len) == 0) {
            *out = (enum sl_outcome_state)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

enum {
    O_V,
    O_ID,
    O_EP,
    O_TYPE,
    O_ATTEMPT,
    O_STATE,
    O_HTTP,
    O_ERR,
    O_MSG,
    O_TS,
    O_CREATED,
    O_LAT,
    O_DNS,
    O_CONN,
    O_TLS,
    O_TTFB,
    O_NEXT,
    O_RESP,
    O_ENV,
    O_POD,
    O__N
};

static const struct fdesc outcome_fields[O__N] = {
    [O_V] = {"v", FT_UINT, REQ},
    [O_ID] = {"id", FT_STR, REQ_UNLESS_QUARANTINED},
    [O_EP] = {"ep", FT_STR, REQ_UNLESS_QUARANTINED},
    [O_TYPE] = {"type", FT_STR, REQ_UNLESS_QUARANTINED},
    [O_ATTEMPT] = {"attempt", FT_UINT, REQ},
    [O_STATE] = {"state", FT_STR, REQ},
    [O_HTTP] = {"http", FT_UINT, REQ},
    [O_ERR] = {"err", FT_STR, OPT},
    [O_MSG] = {"msg", FT_STR, OPT},
    [O_TS] = {"ts", FT_UINT, REQ},
    [O_CREATED] = {"created", FT_UINT, REQ_UNLESS_QUARANTINED},
    [O_LAT] = {"lat_us", FT_UINT, OPT},
    [O_DNS] = {"dns_us", FT_UINT, OPT},
    [O_CONN] = {"conn_us", FT_UINT, OPT},
    [O_TLS] = {"tls_us", FT_UINT, OPT},
    [O_TTFB] = {"ttfb_us", FT_UINT, OPT},
    [O_NEXT] = {"next", FT_UINT, OPT},
    [O_RESP] = {"resp", FT_BIN, OPT},
    [O_ENV] = {"env", FT_BIN, OPT},
    [O_POD] = {"pod", FT_STR, OPT},
};

static bool state_has_next(enum sl_outcome_state st)
{
    return st == SL_OUTCOME_RETRY_SCHEDULED || st == SL_OUTCOME_DEFERRED;
}

/* id, ep, type: required, except that a quarantined outcome may lack them. */
static int outcome_check_ids(const struct sl_outcome *o, sl_err_t *err)
{
    bool q = o->state == SL_OUTCOME_QUARANTINED;
    int rc = 0;

    if (o->id || !q)
        rc = check_word(o->id, "id", SL_EVENT_ID_MAX, cls_event_id, RULE_EVENT_ID, err);
    if (!rc && (o->ep || !q))
        rc = check_word(o->ep, "ep", SL_ENDPOINT_ID_MAX, cls_endpoint_id, RULE_ENDPOINT_ID, err);
    if (!rc && (o->type || !q))
        rc = check_word(o->type, "type", SL_EVENT_TYPE_MAX, cls_visible, RULE_VISIBLE, err);
    return rc;
}

/* The rules that tie fields to the state: "next" and "env". */
static int outcome_check_state_rules(const struct sl_outcome *o,
                                     const char *st,
                                     const struct sl_decode_limits *lim,
                                     sl_err_t *err)
{
    if (state_has_next(o->state) && o->next_ms == 0)
        return sl_err_set(err, SL_EMISSING, "field \"next\" missing (required when state is %s)",
                          st);
    if (!state_has_next(o->state) && o->next_ms != 0)
        return sl_err_set(err, SL_EINVAL, "field \"next\" must be absent when state is %s", st);
    if (!o->env && o->env_len)
        return sl_err_set(err, SL_EINVAL, "field \"env\" has a length but no bytes");
    /* the record travels with dead letters (replay) and with the outcome that moves a
     * delivery into the Redis schedule (retries rebuild after a Redis loss) */
    if (o->env && o->state != SL_OUTCOME_DEAD_LETTER && o->state != SL_OUTCOME_RETRY_SCHEDULED &&
        o->state != SL_OUTCOME_DEFERRED)
        return sl_err_set(err, SL_EINVAL,
                          "field \"env\" is only allowed when state is dead_letter, "
                          "retry_scheduled or deferred");
    if (o->env_len > lim_env(lim))
        return sl_err_set(err, SL_ETOOBIG, "field \"env\" is %zu bytes, limit %zu", o->env_len,
                          lim_env(lim));
    return 0;
}

int sl_outcome_validate(const struct sl_outcome *o,
                        const struct sl_decode_limits *lim,
                        sl_err_t *err)
{
    int rc;

    if (!o)
        return sl_err_set(err, SL_EINVAL, "no outcome record");
    const char *st = sl_outcome_state_name(o->state);
    if (!st)
        return sl_err_set(err, SL_EINVAL, "field \"state\" is not a known state");
    rc = outcome_check_ids(o, err);
    if (rc)
        return rc;
    if (o->http != 0 && (o->http < 100 || o->http > 999))
        return sl_err_set(err, SL_EINVAL, "field \"http\" must be 0 or 100..999");
    if (o->err) {
        rc = check_word(o->err, "err", SL_ERR_CLASS_MAX, cls_err_class,
                        "must contain only a-z 0-9 _", err);
        if (rc)
            return rc;
    }
    rc = check_text(o->msg, "msg", SL_OUTCOME_MSG_MAX, err);
    if (rc)
        return rc;
    rc = outcome_check_state_rules(o, st, lim, err);
    if (rc)
        return rc;
    if (!o->resp && o->resp_len)
        return sl_err_set(err, SL_EINVAL, "field \"resp\" has a length but no bytes");
    if (o->resp_len > SL_RESP_MAX)
        return sl_err_set(err, SL_ETOOBIG, "field \"resp\" is %zu bytes, limit %d", o->resp_len,
                          SL_RESP_MAX);
    if (o->pod)
        return check_word(o->pod, "pod", SL_POD_MAX, cls_visible, RULE_VISIBLE, err);
    return 0;
}

static void outcome_fill_obj(struct blk *b, const msgpack_object **s, struct sl_outcome *o)
{
    o->id = blk_obj_str(b, s[O_ID]);
    o->ep = blk_obj_str(b, s[O_EP]);
    o->type = blk_obj_str(b, s[O_TYPE]);
    o->err = blk_obj_str(b, s[O_ERR]);
    o->msg = blk_obj_str(b, s[O_MSG]);
    o->pod = blk_obj_str(b, s[O_POD]);
    o->resp = s[O_RESP] ? blk_obj_bytes(b, s[O_RESP], &o->resp_len) : NULL;
    o->env = s[O_ENV] ? blk_obj_bytes(b, s[O_ENV], &o->env_len) : NULL;
}

int sl_outcome_decode(const void *buf,
                      size_t len,
                      const struct sl_decode_limits *lim,
                      struct sl_outcome *out,
                      sl_err_t *err)
{
    const msgpack_object *s[O__N];
    struct blk b = {0};
    msgpack_unpacked u;
    int rc;

    memset(out, 0, sizeof(*out));
    msgpack_unpacked_init(&u);
    rc = unpack_root(buf, len, lim_outcome_record(lim), "outcome", &u, err);
    if (rc)
        goto out;
    rc = locate(&u.data, "", outcome_fields, O__N, s, err);
    if (rc)
        goto out;
    rc = check_version(s[O_V], "outcome", err);
    if (rc)
        goto out;
    rc = typecheck(s, outcome_fields, O__N, "", err);
    if (rc)
        goto out;
    if (!s[O_STATE]) {
        rc = sl_err_set(err, SL_EMISSING, "field \"state\" missing");
        goto out;
    }
    if (sl_outcome_state_parse(s[O_STATE]->via.str.ptr, s[O_STATE]->via.str.size, &out->state)) {
        rc = sl_err_set(err, SL_EINVAL, "field \"state\" is not a known state");
        goto out;
    }
    rc = check_required(s, outcome_fields, O__N, out->state == SL_OUTCOME_QUARANTINED, "", err);
    if (rc)
        goto out;
    for (int f = 0; f < O__N; f++) {
        if (outcome_fields[f].type == FT_STR) {
            rc = check_no_nul(s[f], outcome_fields[f].key, err);
            if (rc)
                goto out;
        }
    }
    rc = get_u32(s[O_ATTEMPT], "attempt", &out->attempt, err);
    if (rc)
        goto out;
    rc = get_u32(s[O_HTTP], "http", &out->http, err);
    if (rc)
        goto out;
    out->ts_ms = get_u64(s[O_TS]);
    out->created_ms = get_u64(s[O_CREATED]);
    out->lat_us = get_u64(s[O_LAT]);
    out->dns_us = get_u64(s[O_DNS]);
    out->conn_us = get_u64(s[O_CONN]);
    out->tls_us = get_u64(s[O_TLS]);
    out->ttfb_us = get_u64(s[O_TTFB]);
    out->next_ms = get_u64(s[O_NEXT]);

    outcome_fill_obj(&b, s, out);
    b.base = sl_xmalloc(b.used);
    b.used = 0;
    out->own = b.base;
    outcome_fill_obj(&b, s, out);
    rc = sl_outcome_validate(out, lim, err);
out:
    msgpack_unpacked_destroy(&u);
    if (rc)
        sl_outcome_fini(out);
    return rc;
}

static void e_opt_uint(struct enc *e, const char *key, uint64_t v)
{
    if (v) {
        e_field(e, key);
        e_uint(e, v);
    }
}

static void e_opt_str(struct enc *e, const char *key, const char *s)
{
    if (s) {
        e_field(e, key);
        e_cstr(e, s);
    }
}

static void outcome_emit(struct enc *e, const void *rec)
{
    const struct sl_outcome *o = rec;
    bool q = o->state == SL_OUTCOME_QUARANTINED;

    e_field(e, "v");
    e_uint(e, SL_RECORD_VERSION);
    e_opt_str(e, "id", o->id);
    e_opt_str(e, "ep", o->ep);
    e_opt_str(e, "type", o->type);
    e_field(e, "attempt");
    e_uint(e, o->attempt);
    e_field(e, "state");
    e_cstr(e, sl_outcome_state_name(o->state));
    e_field(e, "http");
    e_uint(e, o->http);
    e_opt_str(e, "err", o->err);
    e_opt_str(e, "msg", o->msg);
    e_field(e, "ts");
    e_uint(e, o->ts_ms);
    if (!q || o->created_ms) {
        e_field(e, "created");
        e_uint(e, o->created_ms);
    }
    e_opt_uint(e, "lat_us", o->lat_us);
    e_opt_uint(e, "dns_us", o->dns_us);
    e_opt_uint(e, "conn_us", o->conn_us);
    e_opt_uint(e, "tls_us", o->tls_us);
    e_opt_uint(e, "ttfb_us", o->ttfb_us);
    e_opt_uint(e, "next", o->next_ms);
    if (o->resp) {
        e_field(e, "resp");
        e_bin(e, o->resp, o->resp_len);
    }
    if (o->env) {
        e_field(e, "env");
        e_bin(e, o->env, o->env_len);
    }
    e_opt_str(e, "pod", o->pod);
}

int sl_outcome_encode_lim(const struct sl_outcome *o,
                          const struct sl_decode_limits *lim,
                          struct sl_buf *out,
                          sl_err_t *err)
{
    int rc = sl_outcome_validate(o, lim, err);
    if (rc)
        return rc;
    return encode_with(outcome_emit, o, "outcome", lim_outcome_record(lim), out, err);
}

int sl_outcome_encode(const struct sl_outcome *o, struct sl_buf *out, sl_err_t *err)
{
    return sl_outcome_encode_lim(o, NULL, out, err);
}

void sl_outcome_fini(struct sl_outcome *o)
{
    if (!o)
        return;
    free(o->own);
    memset(o, 0, sizeof(*o));
}

/* ==== endpoint ==== */

static const char *const method_names[SL_METHOD_COUNT] = {
    [SL_METHOD_POST] = "POST",
    [SL_METHOD_PUT] = "PUT",
    [SL_METHOD_PATCH] = "PATCH",
    [SL_METHOD_GET] = "GET",
};

const char *sl_http_method_name(enum sl_http_method m)
{
    if ((unsigned)m >= SL_METHOD_COUNT)
        return NULL;
    return method_names[m];
}

int sl_http_method_parse(const char *s, size_t len, enum sl_http_method *out)
{
    for (unsigned i = 0; s && i < SL_METHOD_COUNT; i++) {
        if (strlen(method_names[i]) == len && memcmp(method_names[i], s, len) == 0) {
            *out = (enum sl_http_method)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

enum {
    E_V,
    E_ID,
    E_NAME,
    E_URL,
    E_TPL,
    E_METHOD,
    E_CT,
    E_HDR,
    E_SECRETS,
    E_TIMEOUT,
    E_CONN_TIMEOUT,
    E_RETRY_BASE,
    E_RETRY_CAP,
    E_MAX_ATTEMPTS,
    E_BRK_THRESHOLD,
    E_BRK_COOLDOWN,
    E_RATE,
    E_RATE_PERIOD,
    E_BURST,
    E_MAX_INFLIGHT,
    E_ENABLED,
    E_REASON,
    E_UPDATED,
    E_TYPES,
    E_CHANNELS,
    E_KID,
    E_MAC,
    E__N
};

static const struct fdesc endpoint_fields[E__N] = {
    [E_V] = {"v", FT_UINT, REQ},
    [E_ID] = {"id", FT_STR, REQ},
    [E_NAME] = {"name", FT_STR, OPT},
    [E_URL] = {"url", FT_STR, REQ},
    [E_TPL] = {"tpl", FT_BOOL, OPT},
    [E_METHOD] = {"method", FT_STR, OPT},
    [E_CT] = {"ct", FT_STR, OPT},
    [E_HDR] = {"hdr", FT_MAP, OPT},
    [E_SECRETS] = {"secrets", FT_ARRAY, REQ},
    [E_TIMEOUT] = {"timeout_ms", FT_UINT, OPT},
    [E_CONN_TIMEOUT] = {"conn_timeout_ms", FT_UINT, OPT},
    [E_RETRY_BASE] = {"retry_base_ms", FT_UINT, OPT},
    [E_RETRY_CAP] = {"retry_cap_ms", FT_UINT, OPT},
    [E_MAX_ATTEMPTS] = {"max_attempts", FT_UINT, OPT},
    [E_BRK_THRESHOLD] = {"brk_threshold", FT_UINT, OPT},
    [E_BRK_COOLDOWN] = {"brk_cooldown_ms", FT_UINT, OPT},
    [E_RATE] = {"rate", FT_UINT, OPT},
    [E_RATE_PERIOD] = {"rate_period_ms", FT_UINT, OPT},
    [E_BURST] = {"burst", FT_UINT, OPT},
    [E_MAX_INFLIGHT] = {"max_inflight", FT_UINT, OPT},
    [E_ENABLED] = {"enabled", FT_BOOL, OPT},
    [E_REASON] = {"reason", FT_STR, OPT},
    [E_UPDATED] = {"updated", FT_UINT, REQ},
    [E_TYPES] = {"types", FT_ARRAY, OPT},
    [E_CHANNELS] = {"channels", FT_ARRAY, OPT},
    [E_KID] = {"kid", FT_STR, OPT},
    [E_MAC] = {"mac", FT_BIN, OPT},
};

enum { S_ENC, S_EXP, S__N };

static const struct fdesc secret_fields[S__N] = {
    [S_ENC] = {"enc", FT_BIN, REQ},
    [S_EXP] = {"exp", FT_UINT, OPT},
};

/* Where each uint32 tuning field lives in the struct, for table entries E_TIMEOUT..E_MAX_INFLIGHT.
 */
static const size_t endpoint_u32_off[E_MAX_INFLIGHT - E_TIMEOUT + 1] = {
    offsetof(struct sl_endpoint_rec, timeout_ms),
    offsetof(struct sl_endpoint_rec, conn_timeout_ms),
    offsetof(struct sl_endpoint_rec, retry_base_ms),
    offsetof(struct sl_endpoint_rec, retry_cap_ms),
    offsetof(struct sl_endpoint_rec, max_attempts),
    offsetof(struct sl_endpoint_rec, brk_threshold),
    offsetof(struct sl_endpoint_rec, brk_cooldown_ms),
    offsetof(struct sl_endpoint_rec, rate),
    offsetof(struct sl_endpoint_rec, rate_period_ms),
    offsetof(struct sl_endpoint_rec, burst),
    offsetof(struct sl_endpoint_rec, max_inflight),
};

static uint32_t endpoint_u32_get(const struct sl_endpoint_rec *e, int f)
{
    uint32_t v;
    memcpy(&v, (const char *)e + endpoint_u32_off[f - E_TIMEOUT], sizeof(v));
    return v;
}

static void endpoint_u32_set(struct sl_endpoint_rec *e, int f, uint32_t v)
{
    memcpy((char *)e + endpoint_u32_off[f - E_TIMEOUT], &v, sizeof(v));
}

int sl_endpoint_rec_validate(const struct sl_endpoint_rec *e,
                             const struct sl_decode_limits *lim,
                             sl_err_t *err)
{
    int rc;

    (void)lim; /* no endpoint rule depends on the limits beyond the record cap */
    if (!e)
        return sl_err_set(err, SL_EINVAL, "no endpoint record");
    rc = check_word(e->id, "id", SL_ENDPOINT_ID_MAX, cls_endpoint_id, RULE_ENDPOINT_ID, err);
    if (rc)
        return rc;
    rc = check_text(e->name, "name", SL_EP_NAME_MAX, err);
    if (rc)
        return rc;
    rc = check_word(e->url, "url", SL_URL_MAX, cls_visible, RULE_VISIBLE, err);
    if (rc)
        return rc;
    if (!sl_http_method_name(e->method))
        return sl_err_set(err, SL_EINVAL, "field \"method\" must be POST, PUT, PATCH or GET");
    if (e->ct) {
        rc = check_word(e->ct, "ct", SL_CT_MAX, cls_content_type, RULE_CT, err);
        if (rc)
            return rc;
    }
    rc = check_headers(e->hdr, e->n_hdr, "hdr", err);
    if (rc)
        return rc;
    if (e->n_secrets == 0 || !e->secrets)
        return sl_err_set(err, SL_EMISSING, "field \"secrets\" missing");
    if (e->n_secrets > SL_SECRETS_MAX)
        return sl_err_set(err, SL_ETOOBIG, "field \"secrets\" has %zu entries, limit %d",
                          e->n_secrets, SL_SECRETS_MAX);
    for (size_t i = 0; i < e->n_secrets; i++) {
        if (!e->secrets[i].enc || e->secrets[i].enc_len == 0)
            return sl_err_set(err, SL_EINVAL, "field \"secrets\": entry %zu field \"enc\" is empty",
                              i);
        if (e->secrets[i].enc_len > SL_SECRET_ENC_MAX)
            return sl_err_set(err, SL_ETOOBIG,
                              "field \"secrets\": entry %zu field \"enc\" is longer than %d bytes",
                              i, SL_SECRET_ENC_MAX);
    }
    if (e->retry_base_ms && e->retry_cap_ms && e->retry_cap_ms < e->retry_base_ms)
        return sl_err_set(err, SL_EINVAL,
                          "field \"retry_cap_ms\" must not be less than \"retry_base_ms\"");
    rc = check_str_list(e->types, e->n_types, "types", SL_EP_TYPES_MAX, SL_EVENT_TYPE_MAX,
                        sl_valid_type_filter, RULE_TYPE_FILTER, err);
    if (rc)
        return rc;
    rc = check_str_list(e->channels, e->n_channels, "channels", SL_EP_CHANNELS_MAX, SL_CHANNEL_MAX,
                        sl_valid_channel, RULE_CHANNEL, err);
    if (rc)
        return rc;
    if (e->mac && !e->kid)
        return sl_err_set(err, SL_EINVAL, "field \"mac\" needs field \"kid\"");
    if (e->kid) {
        rc = check_word(e->kid, "kid", SL_ENDPOINT_KID_MAX, cls_endpoint_id, RULE_ENDPOINT_ID, err);
        if (rc)
            return rc;
        if (e->mac && e->mac_len != SL_ENDPOINT_MAC_LEN)
            return sl_err_set(err, SL_EINVAL, "field \"mac\" must be %d bytes, got %zu",
                              SL_ENDPOINT_MAC_LEN, e->mac_len);
    }
    return check_text(e->reason, "reason", SL_REASON_MAX, err);
}

/*
 * An array of str (endpoint "types", "channels") before it is copied: count cap first, then
 * wire types and NUL (the copies are NUL-terminated). The record rules run in validate.
 */
static int check_str_array(const msgpack_object *o, const char *key, size_t max, sl_err_t *err)
{
    if (!o)
        return 0;
    if (o->via.array.size > max)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" has %u entries, limit %zu", key,
                          o->via.array.size, max);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *v = &o->via.array.ptr[i];
        if (v->type != MSGPACK_OBJECT_STR)
            return sl_err_set(err, SL_EDECODE, "field \"%s\": entry %u must be a string", key, i);
        if (v->via.str.size && memchr(v->via.str.ptr, 0, v->via.str.size))
            return sl_err_set(err, SL_EINVAL, "field \"%s\": entry %u contains NUL", key, i);
    }
    return 0;
}

/* Copy an array of str (checked by check_str_array) as an array of C strings. */
static const char *const *blk_obj_strs(struct blk *b, const msgpack_object *o, size_t *n)
{
    *n = 0;
    if (!o || o->via.array.size == 0)
        return NULL;
    const char **v = blk_take(b, o->via.array.size * sizeof(*v), alignof(const char *));
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const char *s = blk_obj_str(b, &o->via.array.ptr[i]);
        if (v)
            v[i] = s;
    }
    *n = o->via.array.size;
    return v;
}

/* Type-check and locate the fields of each "secrets" entry into sec[i][S_*]. */
static int secrets_locate(const msgpack_object *arr,
                          const msgpack_object *sec[SL_SECRETS_MAX][S__N],
                          sl_err_t *err)
{
    char pfx[64];
    uint32_t n = arr->via.array.size;

    if (n == 0)
        return sl_err_set(err, SL_EINVAL, "field \"secrets\" is empty");
    if (n > SL_SECRETS_MAX)
        return sl_err_set(err, SL_ETOOBIG, "field \"secrets\" has %u entries, limit %d", n,
                          SL_SECRETS_MAX);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *ent = &arr->via.array.ptr[i];
        (void)snprintf(pfx, sizeof(pfx), "field \"secrets\": entry %u ", i);
        if (ent->type != MSGPACK_OBJECT_MAP)
            return sl_err_set(err, SL_EDECODE, "%smust be a map", pfx);
        int rc = locate(ent, pfx, secret_fields, S__N, sec[i], err);
        if (!rc)
            rc = typecheck(sec[i], secret_fields, S__N, pfx, err);
        if (!rc)
            rc = check_required(sec[i], secret_fields, S__N, false, pfx, err);
        if (rc)
            return rc;
    }
    return 0;
}

static void endpoint_fill_obj(struct blk *b,
                              const msgpack_object **s,
                              const msgpack_object *sec[SL_SECRETS_MAX][S__N],
                              struct sl_endpoint_rec *e)
{
    e->id = blk_obj_str(b, s[E_ID]);
    e->name = blk_obj_str(b, s[E_NAME]);
    e->url = blk_obj_str(b, s[E_URL]);
    e->ct = blk_obj_str(b, s[E_CT]);
    e->reason = blk_obj_str(b, s[E_REASON]);
    e->hdr = blk_obj_kv(b, s[E_HDR], &e->n_hdr);
    e->types = blk_obj_strs(b, s[E_TYPES], &e->n_types);
    e->channels = blk_obj_strs(b, s[E_CHANNELS], &e->n_channels);
    e->kid = blk_obj_str(b, s[E_KID]);
    e->mac_len = 0;
    e->mac = s[E_MAC] ? blk_obj_bytes(b, s[E_MAC], &e->mac_len) : NULL;
    size_t n = s[E_SECRETS]->via.array.size;
    struct sl_endpoint_secret *out =
        blk_take(b, n * sizeof(*out), alignof(struct sl_endpoint_secret));
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *enc = blk_obj_bytes(b, sec[i][S_ENC], &len);
        if (out) {
            out[i].enc = enc;
            out[i].enc_len = len;
            out[i].exp_ms = get_u64(sec[i][S_EXP]);
        }
    }
    e->secrets = out;
    e->n_secrets = n;
}

int sl_endpoint_rec_decode(const void *buf,
                           size_t len,
                           const struct sl_decode_limits *lim,
                           struct sl_endpoint_rec *out,
                           sl_err_t *err)
{
    const msgpack_object *s[E__N];
    const msgpack_object *sec[SL_SECRETS_MAX][S__N];
    struct blk b = {0};
    msgpack_unpacked u;
    int rc;

    memset(out, 0, sizeof(*out));
    msgpack_unpacked_init(&u);
    rc = unpack_root(buf, len, lim_endpoint_record(lim), "endpoint", &u, err);
    if (rc)
        goto out;
    rc = locate(&u.data, "", endpoint_fields, E__N, s, err);
    if (rc)
        goto out;
    rc = check_version(s[E_V], "endpoint", err);
    if (rc)
        goto out;
    rc = typecheck(s, endpoint_fields, E__N, "", err);
    if (rc)
        goto out;
    rc = check_required(s, endpoint_fields, E__N, false, "", err);
    if (rc)
        goto out;
    for (int f = 0; f < E__N; f++) {
        if (endpoint_fields[f].type == FT_STR) {
            rc = check_no_nul(s[f], endpoint_fields[f].key, err);
            if (rc)
                goto out;
        }
    }
    rc = check_kv_map(s[E_HDR], "hdr", "header", SL_HDR_MAX, err);
    if (rc)
        goto out;
    rc = check_str_array(s[E_TYPES], "types", SL_EP_TYPES_MAX, err);
    if (rc)
        goto out;
    rc = check_str_array(s[E_CHANNELS], "channels", SL_EP_CHANNELS_MAX, err);
    if (rc)
        goto out;
    rc = secrets_locate(s[E_SECRETS], sec, err);
    if (rc)
        goto out;
    if (s[E_METHOD] &&
        sl_http_method_parse(s[E_METHOD]->via.str.ptr, s[E_METHOD]->via.str.size, &out->method)) {
        rc = sl_err_set(err, SL_EINVAL, "field \"method\" must be POST, PUT, PATCH or GET");
        goto out;
    }
    for (int f = E_TIMEOUT; f <= E_MAX_INFLIGHT; f++) {
        uint32_t v = 0;
        rc = get_u32(s[f], endpoint_fields[f].key, &v, err);
        if (rc)
            goto out;
        endpoint_u32_set(out, f, v);
    }
    out->tpl = get_bool(s[E_TPL], false);
    out->enabled = get_bool(s[E_ENABLED], true);
    out->updated_ms = get_u64(s[E_UPDATED]);

    endpoint_fill_obj(&b, s, sec, out);
    b.base = sl_xmalloc(b.used);
    b.used = 0;
    out->own = b.base;
    endpoint_fill_obj(&b, s, sec, out);
    rc = sl_endpoint_rec_validate(out, lim, err);
out:
    msgpack_unpacked_destroy(&u);
    if (rc)
        sl_endpoint_rec_fini(out);
    return rc;
}

static void endpoint_emit(struct enc *e, const void *rec)
{
    const struct sl_endpoint_rec *ep = rec;

    e_field(e, "v");
    e_uint(e, SL_RECORD_VERSION);
    e_field(e, "id");
    e_cstr(e, ep->id);
    e_opt_str(e, "name", ep->name);
    e_field(e, "url");
    e_cstr(e, ep->url);
    if (ep->tpl) {
        e_field(e, "tpl");
        e_bool(e, true);
    }
    if (ep->method != SL_METHOD_POST) {
        e_field(e, "method");
        e_cstr(e, sl_http_method_name(ep->method));
    }
    e_opt_str(e, "ct", ep->ct);
    if (ep->n_hdr) {
        e_field(e, "hdr");
        e_kv(e, ep->hdr, ep->n_hdr);
    }
    /* written only when non-empty, so records without them encode as before */
    if (ep->n_types) {
        e_field(e, "types");
        e_array(e, ep->n_types);
        for (size_t i = 0; i < ep->n_types; i++)
            e_cstr(e, ep->types[i]);
    }
    if (ep->n_channels) {
        e_field(e, "channels");
        e_array(e, ep->n_channels);
        for (size_t i = 0; i < ep->n_channels; i++)
            e_cstr(e, ep->channels[i]);
    }
    e_field(e, "secrets");
    e_array(e, ep->n_secrets);
    for (size_t i = 0; i < ep->n_secrets; i++) {
        const struct sl_endpoint_secret *sec = &ep->secrets[i];
        e_map(e, sec->exp_ms ? 2 : 1);
        e_cstr(e, "enc");
        e_bin(e, sec->enc, sec->enc_len);
        if (sec->exp_ms) {
            e_cstr(e, "exp");
            e_uint(e, sec->exp_ms);
        }
    }
    for (int f = E_TIMEOUT; f <= E_MAX_INFLIGHT; f++)
        e_opt_uint(e, endpoint_fields[f].key, endpoint_u32_get(ep, f));
    if (!ep->enabled) {
        e_field(e, "enabled");
        e_bool(e, false);
    }
    e_opt_str(e, "reason", ep->reason);
    e_field(e, "updated");
    e_uint(e, ep->updated_ms);
    e_opt_str(e, "kid", ep->kid);
    if (ep->mac) {
        e_field(e, "mac");
        e_bin(e, ep->mac, ep->mac_len);
    }
}

int sl_endpoint_rec_encode_lim(const struct sl_endpoint_rec *e,
                               const struct sl_decode_limits *lim,
                               struct sl_buf *out,
                               sl_err_t *err)
{
    int rc = sl_endpoint_rec_validate(e, lim, err);
    if (rc)
        return rc;
    return encode_with(endpoint_emit, e, "endpoint", lim_endpoint_record(lim), out, err);
}

int sl_endpoint_rec_encode(const struct sl_endpoint_rec *e, struct sl_buf *out, sl_err_t *err)
{
    return sl_endpoint_rec_encode_lim(e, NULL, out, err);
}

void sl_endpoint_rec_fini(struct sl_endpoint_rec *e)
{
    if (!e)
        return;
    if (e->own) {
        /* The ciphertexts live inside own; wipe them before the block goes back to malloc
         * (addressed through own, which is writable, rather than the const field). */
        uint8_t *base = e->own;
        for (size_t i = 0; i < e->n_secrets && e->secrets; i++)
            sl_secret_wipe(base + (e->secrets[i].enc - base), e->secrets[i].enc_len);
        free(e->own);
    }
    memset(e, 0, sizeof(*e));
}
