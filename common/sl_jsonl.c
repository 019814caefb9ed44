/*
 * sl_jsonl: parse one sluice-produce JSON line into a delivery record (see sl_jsonl.h).
 *
 * Design: jansson parses the line (duplicate keys rejected; \u0000 allowed so a string body
 * can carry any bytes, then refused in every other field). The fields are gathered into a
 * BORROWED struct sl_delivery pointing into the jansson tree and a few temporaries, checked
 * by the same rule function the msgpack codec uses (with the JSON field names), and finally
 * deep-copied by sl_delivery_copy() into one owned allocation. Every input-driven size (line,
 * header and macro counts, base64 output) is capped before anything is allocated for it.
 * jansson's own error text quotes the input ("near '...'"), so syntax errors are reported
 * from the error code and byte position only.
 */
#include "common/sl_jsonl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/rand.h>

#include "common/sl_b64.h"
#include "common/sl_kafka.h" /* sl_now_ms */
#include "common/sl_mem.h"
#include "common/sl_record_int.h"
#include "common/sl_time.h"

/* The top-level fields a line may carry. */
static const char *const jsonl_fields[] = {
    "id",   "endpoint",    "type",    "created_at_ms", "content_type",
    "body", "body_base64", "headers", "macros",
};

/* Crockford base32, lower case: no i, l, o, u, so ids read back unambiguously. */
static const char b32_alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";

/* Random bytes for ids, drawn from OpenSSL's CSPRNG a block at a time per thread (one
 * RAND_bytes call per 240 ids instead of one per id: ids are public, so the pool needs no
 * wiping, only to be unpredictable, which it is). */
#define ID_POOL_BYTES 4080
static _Thread_local unsigned char id_pool[ID_POOL_BYTES];
static _Thread_local size_t id_pool_used = ID_POOL_BYTES;

int sl_jsonl_gen_event_id(char out[SL_JSONL_GEN_ID_LEN + 1], sl_err_t *err)
{
    unsigned char rnd[17]; /* 136 bits, 130 used */

    if (id_pool_used + sizeof(rnd) > ID_POOL_BYTES) {
        if (RAND_bytes(id_pool, (int)sizeof(id_pool)) != 1)
            return sl_err_set(err, SL_ECRYPTO, "could not generate an event id: no randomness");
        id_pool_used = 0;
    }
    memcpy(rnd, id_pool + id_pool_used, sizeof(rnd));
    id_pool_used += sizeof(rnd);
    memcpy(out, "evt_", 4);
    for (unsigned i = 0; i < 26; i++) {
        unsigned bit = i * 5, byte = bit / 8, shift = bit % 8;
        unsigned v = ((unsigned)rnd[byte] << 8 | rnd[byte + 1]) >> (11 - shift);
        out[4 + i] = b32_alphabet[v & 0x1f];
    }
    out[SL_JSONL_GEN_ID_LEN] = '\0';
    return 0;
}

const char *sl_json_error_words(enum json_error_code code)
{
    switch (code) {
    case json_error_out_of_memory:
        return "out of memory";
    case json_error_stack_overflow:
        return "nesting too deep";
    case json_error_invalid_utf8:
        return "invalid UTF-8";
    case json_error_premature_end_of_input:
        return "unexpected end of input";
    case json_error_end_of_input_expected:
        return "text after the JSON value";
    case json_error_null_character:
        return "\\u0000 in a string";
    case json_error_null_byte_in_key:
        return "\\u0000 in an object key";
    case json_error_duplicate_key:
        return "a key repeated in one object";
    case json_error_numeric_overflow:
        return "number out of range";
    default:
        return "syntax error";
    }
}

/* Print a field name back only when it is short, printable and cannot break the message. */
static bool name_printable(const char *s, size_t len)
{
    if (len == 0 || len > 64)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\')
            return false;
    }
    return true;
}

/* A string field: NULL if absent; refuses non-strings and embedded NUL. */
static int get_string(json_t *root, const char *field, const char **out, sl_err_t *err)
{
    json_t *v = json_object_get(root, field);

    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return sl_err_set(err, SL_EDECODE, "field \"%s\" must be a string", field);
    const char *s = json_string_value(v);
    if (strlen(s) != json_string_length(v))
        return sl_err_set(err, SL_EINVAL, "field \"%s\" contains NUL", field);
    *out = s;
    return 0;
}

/*
 * body_base64 -> bytes with the project's strict decoder (sl_b64: standard alphabet, padding
 * optional, canonical trailing bits). The buffer is capped at max bytes before allocating;
 * sl_b64_decode reports SL_ETOOBIG itself when the result would not fit.
 */
static int b64_body(json_t *v, size_t max, uint8_t **out, size_t *outlen, sl_err_t *err)
{
    size_t n = json_string_length(v);
    size_t cap = SL_B64_DECODED_MAX(n) < max ? SL_B64_DECODED_MAX(n) : max;
    uint8_t *buf = sl_xmalloc(cap + 1);

    int rc = sl_b64_decode(json_string_value(v), n, buf, cap, outlen);
    if (rc == SL_ETOOBIG) {
        free(buf);
        return sl_err_set(err, SL_ETOOBIG, "field \"body_base64\" decodes to more than %zu bytes",
                          max);
    }
    if (rc) {
        free(buf);
        return sl_err_set(err, SL_EINVAL, "field \"body_base64\" is not valid base64");
    }
    *out = buf;
    return 0;
}

/*
 * Number -> text for macros: integers exactly; reals as the shortest %g text that reads back
 * to the same double (so 12.34 stays "12.34", not "12.339999999999999").
 */
static char *number_text(const json_t *v)
{
    char tmp[40];

    if (json_is_integer(v)) {
        (void)snprintf(tmp, sizeof(tmp), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return sl_xstrdup(tmp);
    }
    double d = json_real_value(v);
    for (int prec = 1; prec <= 17; prec++) {
        (void)snprintf(tmp, sizeof(tmp), "%.*g", prec, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    return sl_xstrdup(tmp);
}

/* Collect a JSON object of strings into an sl_kv array (headers and macros). */
struct kv_spec {
    const char *field; /* JSON field name */
    const char *what;  /* "header" / "macro" */
    size_t max;        /* entry cap */
    bool numbers;      /* numbers accepted as values (macros) */
};

/* Whether a header or macro name may be quoted in an error: 1..64 of A-Z a-z 0-9 _ -. */
static bool plain_name(const char *key, size_t klen)
{
    if (klen == 0 || klen > 64)
        return false;
    for (size_t c = 0; c < klen; c++) {
        if (!isalnum((unsigned char)key[c]) && key[c] != '_' && key[c] != '-')
            return false;
    }
    return true;
}

/* Entry i's value has the wrong type; named when the name is a plain token (names are not
 * secret; values may be). */
static int
kv_type_error(const struct kv_spec *spec, size_t i, const char *key, size_t klen, sl_err_t *err)
{
    const char *want = spec->numbers ? "string or a number" : "string";
    if (plain_name(key, klen))
        return sl_err_set(err, SL_EDECODE, "field \"%s\": value of %s %zu (\"%s\") must be a %s",
                          spec->field, spec->what, i, key, want);
    return sl_err_set(err, SL_EDECODE, "field \"%s\": value of %s %zu must be a %s", spec->field,
                      spec->what, i, want);
}

/*
 * On return (success or not) *out and *owned hold what was allocated (the caller frees them
 * with free_kv), *n_out the entries filled so far.
 */
static int get_kv(json_t *root,
                  const struct kv_spec *spec,
                  struct sl_kv **out,
                  size_t *n_out,
                  char ***owned,
                  sl_err_t *err)
{
    json_t *obj = json_object_get(root, spec->field);
    const char *key;
    size_t klen;
    json_t *val;
    size_t i = 0;

    *out = NULL;
    *n_out = 0;
    *owned = NULL;
    if (!obj)
        return 0;
    if (!json_is_object(obj))
        return sl_err_set(err, SL_EDECODE, "field \"%s\" must be an object", spec->field);
    size_t n = json_object_size(obj);
    if (n > spec->max)
        return sl_err_set(err, SL_ETOOBIG, "field \"%s\" has %zu entries, limit %zu", spec->field,
                          n, spec->max);
    if (n == 0)
        return 0;
    struct sl_kv *kv = sl_xcalloc(n, sizeof(*kv));
    char **texts = spec->numbers ? sl_xcalloc(n, sizeof(*texts)) : NULL;
    *out = kv;
    *owned = texts;
    json_object_keylen_foreach(obj, key, klen, val)
    {
        if (strlen(key) != klen)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": name of %s %zu contains NUL",
                              spec->field, spec->what, i);
        kv[i].name = key;
        if (json_is_string(val)) {
            if (strlen(json_string_value(val)) != json_string_length(val))
                return sl_err_set(err, SL_EINVAL, "field \"%s\": value of %s %zu contains NUL",
                                  spec->field, spec->what, i);
            kv[i].value = json_string_value(val);
        } else if (texts && json_is_number(val)) {
            texts[i] = number_text(val);
            kv[i].value = texts[i];
        } else {
            return kv_type_error(spec, i, key, klen, err);
        }
        i++;
        *n_out = i;
    }
    return 0;
}

/* Free what get_kv allocated; texts[] has one slot per kv entry (n entries filled). */
static void free_kv(struct sl_kv *kv, char **texts, size_t n)
{
    if (texts) {
        for (size_t i = 0; i < n; i++)
            free(texts[i]);
        free(texts);
    }
    free(kv);
}

/*
 * Length cap, line-end stripping, JSON parse, object check and the unknown-field check.
 * On success *root is the parsed object (caller json_decref's it).
 */
static int load_line(const char *line, size_t len, size_t max_line, json_t **root, sl_err_t *err)
{
    json_error_t jerr;

    *root = NULL;
    if (!line)
        return sl_err_set(err, SL_EINVAL, "no line");
    if (len > max_line)
        return sl_err_set(err, SL_ETOOBIG, "line is %zu bytes, limit %zu", len, max_line);
    if (len && line[len - 1] == '\n')
        len--;
    if (len && line[len - 1] == '\r')
        len--;
    if (len == 0)
        return sl_err_set(err, SL_EDECODE, "line is empty");
    json_t *j =
        json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY, &jerr);
    if (!j)
        return sl_err_set(err, SL_EDECODE, "line is not valid JSON: %s at byte %d",
                          sl_json_error_words(json_error_code(&jerr)), jerr.position);
    if (!json_is_object(j)) {
        json_decref(j);
        return sl_err_set(err, SL_EDECODE, "line is not a JSON object");
    }
    *root = j;
    return 0;
}

static bool field_in(const char *const *list, size_t n, const char *key, size_t klen)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(list[i]) == klen && memcmp(list[i], key, klen) == 0)
            return true;
    }
    return false;
}

/* Every top-level field is one of jsonl_fields or the caller's extra fields. */
static int check_fields(json_t *j, const struct sl_jsonl_opts *opts, sl_err_t *err)
{
    const char *key;
    size_t klen;
    json_t *val;

    json_object_keylen_foreach(j, key, klen, val)
    {
        if (field_in(jsonl_fields, sizeof(jsonl_fields) / sizeof(jsonl_fields[0]), key, klen) ||
            (opts && field_in(opts->extra_fields, opts->n_extra, key, klen)))
            continue;
        return name_printable(key, klen)
                   ? sl_err_set(err, SL_EINVAL, "unknown field \"%s\"", key)
                   : sl_err_set(err, SL_EINVAL, "unknown field (name not printable)");
    }
    return 0;
}

static int
get_created(json_t *root, const struct sl_jsonl_opts *opts, uint64_t *ts_ms, sl_err_t *err)
{
    json_t *ts = json_object_get(root, "created_at_ms");

    if (!ts) {
        *ts_ms = opts && opts->now_ms ? opts->now_ms : (uint64_t)sl_now_ms();
        return 0;
    }
    if (!json_is_integer(ts) || json_integer_value(ts) < 0)
        return sl_err_set(err, SL_EINVAL, "field \"created_at_ms\" must be a non-negative integer");
    *ts_ms = (uint64_t)json_integer_value(ts);
    return 0;
}

/* Temporaries a parsed line may own until it is copied into the record. */
struct jsonl_tmp {
    char *body_dump;   /* json_dumps output for non-string bodies */
    uint8_t *body_bin; /* decoded body_base64 */
    struct sl_kv *hdr; /* headers, pointing into the jansson tree */
    char **hdr_texts;  /* always NULL (headers take strings only) */
    struct sl_kv *mac; /* macros */
    char **mac_texts;  /* per-macro text of numeric values, or NULL */
};

/* "body" (any JSON value) or "body_base64" (exactly one of them) into d->body. */
static int get_body(json_t *root,
                    const char *raw,
                    size_t raw_len,
                    const struct sl_decode_limits *lim,
                    struct sl_delivery *d,
                    struct sl__delivery_names *names,
                    struct jsonl_tmp *tmp,
                    sl_err_t *err)
{
    json_t *body = json_object_get(root, "body");
    json_t *b64 = json_object_get(root, "body_base64");

    if (body && b64)
        return sl_err_set(err, SL_EINVAL,
                          "fields \"body\" and \"body_base64\" are mutually exclusive");
    if (!body && !b64)
        return sl_err_set(err, SL_EMISSING, "field \"body\" missing");
    if (body && json_is_string(body)) {
        d->body = (const uint8_t *)json_string_value(body);
        d->body_len = json_string_length(body);
        return 0;
    }
    size_t off, vlen;
    if (body && raw && sl_json_member_span(raw, raw_len, "body", &off, &vlen) == 0) {
        /* byte for byte as the client sent it; the body cap applies below as always */
        d->body = (const uint8_t *)raw + off;
        d->body_len = vlen;
        return 0;
    }
    if (body) {
        /* The line is capped, so the compact re-serialisation is bounded too; the body cap is
         * applied by the shared validation afterwards. */
        tmp->body_dump = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!tmp->body_dump)
            return sl_err_set(err, SL_ENOMEM, "could not serialise field \"body\"");
        d->body = (const uint8_t *)tmp->body_dump;
        d->body_len = strlen(tmp->body_dump);
        return 0;
    }
    names->body = "body_base64";
    if (!json_is_string(b64))
        return sl_err_set(err, SL_EDECODE, "field \"body_base64\" must be a string");
    int rc = b64_body(b64, sl__lim_max_body(lim), &tmp->body_bin, &d->body_len, err);
    d->body = tmp->body_bin;
    return rc;
}

/* id (or a generated one into idbuf), endpoint, type, content_type. */
static int get_strings(json_t *root,
                       const struct sl_jsonl_opts *opts,
                       struct sl_delivery *d,
                       char idbuf[SL_JSONL_GEN_ID_LEN + 1],
                       sl_err_t *err)
{
    int rc = get_string(root, "id", &d->id, err);
    if (!rc && !d->id && opts && opts->id_if_absent) {
        d->id = opts->id_if_absent;
    } else if (!rc && !d->id) {
        rc = sl_jsonl_gen_event_id(idbuf, err);
        d->id = idbuf;
    }
    if (!rc)
        rc = get_string(root, "endpoint", &d->ep, err);
    if (!rc)
        rc = get_string(root, "type", &d->type, err);
    if (!rc)
        rc = get_string(root, "content_type", &d->ct, err);
    return rc;
}

int sl_jsonl_parse(const char *line,
                   size_t len,
                   const struct sl_jsonl_opts *opts,
                   struct sl_delivery *out,
                   sl_err_t *err)
{
    size_t max_line = opts && opts->max_line ? opts->max_line : SL_JSONL_MAX_LINE_DEFAULT;
    json_t *root = NULL;

    memset(out, 0, sizeof(*out));
    int rc = load_line(line, len, max_line, &root, err);
    if (!rc)
        rc = sl_jsonl_event(root, opts, out, err);
    json_decref(root);
    return rc;
}

int sl_jsonl_event(json_t *root,
                   const struct sl_jsonl_opts *opts,
                   struct sl_delivery *out,
                   sl_err_t *err)
{
    static const struct kv_spec hdr_spec = {"headers", "header", SL_HDR_MAX, false};
    static const struct kv_spec mac_spec = {"macros", "macro", SL_MACRO_MAX, true};
    const struct sl_decode_limits *lim = opts ? opts->lim : NULL;
    struct sl__delivery_names names = sl__delivery_msgpack_names;
    struct sl_delivery d = {0};
    struct jsonl_tmp tmp = {0};
    char idbuf[SL_JSONL_GEN_ID_LEN + 1];
    int rc = 0;

    memset(out, 0, sizeof(*out));
    names.ep = "endpoint";
    names.ct = "content_type";
    names.hdr = "headers";
    if (!json_is_object(root))
        return sl_err_set(err, SL_EDECODE, "event is not a JSON object");
    rc = check_fields(root, opts, err);
    if (!rc)
        rc = get_strings(root, opts, &d, idbuf, err);
    /* A fan-out event names no endpoint: validate with a stand-in, hand back NULL. */
    bool no_ep = !rc && !d.ep && opts && opts->endpoint_optional;
    if (no_ep)
        d.ep = "-";
    if (!rc)
        rc = get_created(root, opts, &d.ts_ms, err);
    if (!rc)
        rc = get_body(root, opts ? opts->raw : NULL, opts ? opts->raw_len : 0, lim, &d, &names,
                      &tmp, err);
    if (!rc)
        rc = get_kv(root, &hdr_spec, &tmp.hdr, &d.n_hdr, &tmp.hdr_texts, err);
    d.hdr = tmp.hdr;
    if (!rc)
        rc = get_kv(root, &mac_spec, &tmp.mac, &d.n_macros, &tmp.mac_texts, err);
    d.macros = tmp.mac;
    /* One rule set for both input formats, reported with this format's field names. */
    if (!rc)
        rc = sl__delivery_validate_named(&d, lim, &names, err);
    if (!rc) {
        sl_delivery_copy(out, &d);
        if (!out->ct)
            out->ct = SL_DELIVERY_CT_DEFAULT; /* same view as a decoded record */
        if (no_ep)
            out->ep = NULL;
    }
    free_kv(tmp.mac, tmp.mac_texts, d.n_macros);
    free_kv(tmp.hdr, tmp.hdr_texts, d.n_hdr);
    free(tmp.body_dump);
    free(tmp.body_bin);
    return rc;
}

/* ==== spans of values in accepted JSON text ==== */

/* i at the opening quote; returns the index after the closing one (n when unterminated). */
static size_t skip_string(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

/* i at a value's first byte; returns the index after it (n on malformed text). */
static size_t skip_value(const char *s, size_t n, size_t i)
{
    if (i >= n)
        return n;
    if (s[i] == '"')
        return skip_string(s, n, i);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        for (; i < n; i++) {
            if (s[i] == '"') {
                i = skip_string(s, n, i) - 1;
            } else if (s[i] == '{' || s[i] == '[') {
                depth++;
            } else if (s[i] == '}' || s[i] == ']') {
                if (--depth == 0)
                    return i + 1;
            }
        }
        return n;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\n' && s[i] != '\r')
        i++; /* number, true, false, null */
    return i;
}

int sl_json_member_span(const char *text, size_t len, const char *name, size_t *off, size_t *vlen)
{
    size_t nlen = strlen(name);
    size_t i = sl_json_ws_end(text, len, 0);
    if (i >= len || text[i] != '{')
        return SL_ENOTFOUND;
    i = sl_json_ws_end(text, len, i + 1);
    while (i < len && text[i] == '"') {
        size_t kend = skip_string(text, len, i);
        if (kend >= len)
            return SL_ENOTFOUND;
        if (memchr(text + i + 1, '\\', kend - i - 2))
            return SL_ENOTFOUND; /* an escaped name could spell name */
        bool hit = kend - i - 2 == nlen && memcmp(text + i + 1, name, nlen) == 0;
        i = sl_json_ws_end(text, len, kend);
        if (i >= len || text[i] != ':')
            return SL_ENOTFOUND;
        size_t v = sl_json_ws_end(text, len, i + 1);
        size_t vend = skip_value(text, len, v);
        if (vend >= len || vend == v)
            return SL_ENOTFOUND;
        if (hit) {
            *off = v;
            *vlen = vend - v;
            return 0;
        }
        i = sl_json_ws_end(text, len, vend);
        if (i < len && text[i] == ',')
            i = sl_json_ws_end(text, len, i + 1);
        else
            break;
    }
    return SL_ENOTFOUND;
}

int sl_json_array_spans(
    const char *text, size_t len, size_t max, size_t *offs, size_t *lens, size_t *n)
{
    size_t i = sl_json_ws_end(text, len, 0);
    *n = 0;
    if (i >= len || text[i] != '[')
        return SL_EDECODE;
    i = sl_json_ws_end(text, len, i + 1);
    if (i < len && text[i] == ']')
        return 0;
    while (i < len) {
        size_t vend = skip_value(text, len, i);
        if (vend >= len || vend == i)
            return SL_EDECODE;
        if (*n == max)
            return SL_ETOOBIG;
        offs[*n] = i;
        lens[*n] = vend - i;
        (*n)++;
        i = sl_json_ws_end(text, len, vend);
        if (i < len && text[i] == ',')
            i = sl_json_ws_end(text, len, i + 1);
        else
            break;
    }
    return i < len && text[i] == ']' ? 0 : SL_EDECODE;
}
