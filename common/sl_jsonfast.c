/*
 * sl_jsonfast: the publish path's shortcut past jansson for event bodies.
 *
 * A publish request is mostly its "body": a client's JSON document that Sluice sends on byte
 * for byte and never reads. jansson builds a tree of every value it parses (a heap object per
 * value and per string, each string read byte by byte), so parsing the whole request cost
 * sluice-api about a quarter of its CPU per publish. sl_json_elide_bodies checks the request
 * text in one pass without allocating and, when the text is "plain" JSON, writes a copy in
 * which every event's object or array "body" is replaced by {} or []: jansson then parses a
 * ~100-byte envelope, and the body's bytes are taken from the original text
 * (sl_json_member_span), as they were before.
 *
 * Plain means: valid JSON that jansson (2.14, JSON_REJECT_DUPLICATES, no JSON_ALLOW_NUL,
 * no JSON_DECODE_ANY) parses to the same tree with no error, and whose objects the
 * duplicate check can compare as raw bytes. Anything else answers SL_ENOTFOUND and the
 * caller parses the original text with jansson, which keeps its error messages and every
 * rule the shortcut does not re-implement. Not plain, on purpose:
 *   - a member name holding a backslash (escaped names could be equal without equal bytes);
 *   - an object with more than ELIDE_MAX_MEMBERS members (the duplicate check is pairwise);
 *   - nesting deeper than ELIDE_MAX_DEPTH;
 *   - \u0000 (jansson refuses it) and \u escapes of UTF-16 surrogates (pairing rules);
 *   - a number with an exponent or more than ELIDE_MAX_INT_DIGITS integer digits (jansson
 *     refuses integers beyond int64 and reals beyond double's range);
 *   - invalid JSON of any kind.
 * tests/fuzz/fuzz_jsonfast.c checks the claim: whenever this answers 0, jansson accepts the
 * text and the envelope, and the two trees are equal once the elided bodies are emptied.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/sl_err.h"
#include "common/sl_hex.h"
#include "common/sl_jsonl.h"

#define ELIDE_MAX_DEPTH      64
#define ELIDE_MAX_MEMBERS    32
#define ELIDE_MAX_INT_DIGITS 18 /* < 9.2e18: always an int64 */

/* Where a value sits, for the values to elide. */
enum role {
    ROLE_OTHER,  /* anywhere else */
    ROLE_EVENT,  /* an event object: its object/array "body" is elided */
    ROLE_EVENTS, /* a batch's "events" array: its elements are events */
    ROLE_BATCH,  /* a batch's top-level object: its "events" member is ROLE_EVENTS */
};

struct scan {
    const unsigned char *s;
    size_t n;
    size_t i;
    char *out;     /* envelope being written */
    size_t olen;   /* bytes written */
    size_t copied; /* text[0..copied) is in out already */
};

static void skip_ws(struct scan *c)
{
    c->i = sl_json_ws_end((const char *)c->s, c->n, c->i);
}

/* One UTF-8 sequence starting at c->i (a byte >= 0x80), strictly (no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static bool utf8_seq(struct scan *c)
{
    const unsigned char *s = c->s;
    size_t i = c->i;
    unsigned char b = s[i];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        return false;
    }
    if (c->n - i <= need)
        return false;
    if (s[i + 1] < lo || s[i + 1] > hi)
        return false;
    for (size_t k = 2; k <= need; k++) {
        if ((s[i + k] & 0xC0) != 0x80)
            return false;
    }
    c->i = i + need + 1;
    return true;
}

/* A backslash escape at c->i; \u0000 and \u escapes of surrogates are left to jansson. */
static bool escape(struct scan *c)
{
    if (c->n - c->i < 2)
        return false;
    unsigned char e = c->s[c->i + 1];
    if (e != 'u') {
        if (e == 0 || !strchr("\"\\/bfnrt", e))
            return false;
        c->i += 2;
        return true;
    }
    if (c->n - c->i < 6)
        return false;
    unsigned v = 0;
    for (size_t k = 2; k < 6; k++) {
        int h = sl_hex_digit(c->s[c->i + k]);
        if (h < 0)
            return false;
        v = v << 4 | (unsigned)h;
    }
    if (v == 0 || (v >= 0xD800 && v <= 0xDFFF))
        return false;
    c->i += 6;
    return true;
}

/* A string at c->i (the opening quote). *escaped: it held a backslash. */
static bool str(struct scan *c, bool *escaped)
{
    *escaped = false;
    c->i++;
    while (c->i < c->n) {
        unsigned char b = c->s[c->i];
        if (b == '"') {
            c->i++;
            return true;
        }
        bool ok;
        if (b < 0x20) {
            ok = false;
        } else if (b >= 0x80) {
            ok = utf8_seq(c);
        } else if (b == '\\') {
            *escaped = true;
            ok = escape(c);
        } else {
            c->i++;
            ok = true;
        }
        if (!ok)
            return false;
    }
    return false;
}

static bool digits(struct scan *c, size_t *count)
{
    size_t start = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
        c->i++;
    *count = c->i - start;
    return *count > 0;
}

static bool number(struct scan *c)
{
    size_t nd;
    if (c->s[c->i] == '-')
        c->i++;
    if (c->i >= c->n)
        return false;
    if (c->s[c->i] == '0') {
        c->i++;
    } else if (!digits(c, &nd) || nd > ELIDE_MAX_INT_DIGITS) {
        return false;
    }
    if (c->i < c->n && c->s[c->i] == '.') {
        c->i++;
        if (!digits(c, &nd))
            return false;
    }
    /* an exponent (or a digit after a leading 0) is left to jansson */
    return c->i >= c->n ||
           !(c->s[c->i] == 'e' || c->s[c->i] == 'E' || (c->s[c->i] >= '0' && c->s[c->i] <= '9'));
}

static bool literal(struct scan *c, const char *w, size_t len)
{
    if (c->n - c->i < len || memcmp(c->s + c->i, w, len) != 0)
        return false;
    c->i += len;
    return true;
}

/* Replace text[from..to) (an object or array) by its empty form in the envelope. */
static void elide(struct scan *c, size_t from, size_t to)
{
    size_t n = from - c->copied;
    memcpy(c->out + c->olen, c->s + c->copied, n);
    c->olen += n;
    c->out[c->olen++] = (char)c->s[from];
    c->out[c->olen++] = c->s[from] == '{' ? '}' : ']';
    c->copied = to;
}

static bool value(struct scan *c, enum role role, int depth);

/* After a member or an element: 1 past the closing bracket, 0 past a comma, -1 otherwise. */
static int next_item(struct scan *c, unsigned char close)
{
    skip_ws(c);
    if (c->i >= c->n)
        return -1;
    if (c->s[c->i] == close) {
        c->i++;
        return 1;
    }
    if (c->s[c->i] != ',')
        return -1;
    c->i++;
    skip_ws(c);
    return 0;
}

/* The names of one object's members so far (offsets into the text). */
struct names {
    size_t off[ELIDE_MAX_MEMBERS];
    size_t len[ELIDE_MAX_MEMBERS];
    size_t n;
};

/* A member's name at c->i, unescaped and new in its object, and the colon after it; c->i
 * then at the value. *k0 and *klen (OUT): the name's bytes. */
static bool member_name(struct scan *c, struct names *seen, size_t *k0, size_t *klen)
{
    bool escaped;
    if (c->i >= c->n || c->s[c->i] != '"' || seen->n == ELIDE_MAX_MEMBERS)
        return false;
    *k0 = c->i + 1;
    if (!str(c, &escaped) || escaped)
        return false;
    *klen = c->i - 1 - *k0;
    for (size_t m = 0; m < seen->n; m++) {
        if (seen->len[m] == *klen && memcmp(c->s + seen->off[m], c->s + *k0, *klen) == 0)
            return false; /* a duplicate: jansson says so */
    }
    seen->off[seen->n] = *k0;
    seen->len[seen->n++] = *klen;
    skip_ws(c);
    if (c->i >= c->n || c->s[c->i] != ':')
        return false;
    c->i++;
    skip_ws(c);
    return c->i < c->n;
}

static bool object(struct scan *c, enum role role, int depth)
{
    struct names seen;
    seen.n = 0;
    c->i++;
    skip_ws(c);
    if (c->i < c->n && c->s[c->i] == '}') {
        c->i++;
        return true;
    }
    for (;;) {
        size_t k0, klen;
        if (!member_name(c, &seen, &k0, &klen))
            return false;
        enum role sub = ROLE_OTHER;
        if (role == ROLE_BATCH && klen == 6 && memcmp(c->s + k0, "events", 6) == 0)
            sub = ROLE_EVENTS;
        bool body = role == ROLE_EVENT && klen == 4 && memcmp(c->s + k0, "body", 4) == 0 &&
                    (c->s[c->i] == '{' || c->s[c->i] == '[');
        size_t v0 = c->i;
        if (!value(c, sub, depth + 1))
            return false;
        if (body)
            elide(c, v0, c->i);
        int next = next_item(c, '}');
        if (next != 0)
            return next > 0;
    }
}

static bool array(struct scan *c, enum role role, int depth)
{
    enum role sub = role == ROLE_EVENTS ? ROLE_EVENT : ROLE_OTHER;
    c->i++;
    skip_ws(c);
    if (c->i < c->n && c->s[c->i] == ']') {
        c->i++;
        return true;
    }
    for (;;) {
        if (!value(c, sub, depth + 1))
            return false;
        int next = next_item(c, ']');
        if (next != 0)
            return next > 0;
    }
}

static bool value(struct scan *c, enum role role, int depth)
{
    bool escaped;
    if (c->i >= c->n || depth > ELIDE_MAX_DEPTH)
        return false;
    switch (c->s[c->i]) {
    case '{':
        return object(c, role, depth);
    case '[':
        return array(c, role, depth);
    case '"':
        return str(c, &escaped);
    case 't':
        return literal(c, "true", 4);
    case 'f':
        return literal(c, "false", 5);
    case 'n':
        return literal(c, "null", 4);
    default:
        if (c->s[c->i] == '-' || (c->s[c->i] >= '0' && c->s[c->i] <= '9'))
            return number(c);
        return false;
    }
}

int sl_json_elide_bodies(
    const char *text, size_t len, enum sl_json_shape shape, char *out, size_t *out_len)
{
    struct scan c = {(const unsigned char *)text, len, 0, out, 0, 0};
    skip_ws(&c);
    if (c.i >= c.n || c.s[c.i] != '{')
        return SL_ENOTFOUND; /* jansson's error, or its "must be an object" */
    if (!object(&c, shape == SL_JSON_BATCH ? ROLE_BATCH : ROLE_EVENT, 1))
        return SL_ENOTFOUND;
    skip_ws(&c);
    if (c.i != c.n)
        return SL_ENOTFOUND;
    memcpy(c.out + c.olen, c.s + c.copied, c.n - c.copied);
    c.olen += c.n - c.copied;
    *out_len = c.olen;
    return 0;
}
