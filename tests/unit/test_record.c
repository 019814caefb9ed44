/*
 * test_record: the msgpack record codec (common/sl_record) against schemas/fixtures.
 *
 * - JSON fixtures (schemas/fixtures/RECORD/{valid,invalid}/NAME.json) are packed to msgpack by
 *   a small packer here (conventions in schemas/fixtures/README.md) and decoded. Valid ones
 *   must decode to exactly the fixture's values (defaults where absent) and survive
 *   encode -> decode -> encode byte-identically; invalid ones must fail with the fixture's
 *   "_expect_code" and "_expect_error", and the message must not echo any value.
 * - Raw fixtures (*.msgpack, written by schemas/fixtures/gen_raw.py) are checked against
 *   raw_expect.json; for valid ones the C encoder's re-encoding must equal the bytes of the
 *   independent Python packer.
 * - Direct tests of the encoder rules, the pre-scan, the validators and the ownership rules.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <msgpack.h>
#include <openssl/evp.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"

#define FIXTURES SL_SOURCE_DIR "/schemas/fixtures"

/* ==== Fixture conventions: JSON value -> msgpack / bytes ==== */

/* Bytes of a fixture "bytes" value: a string, {"$bin"}, {"$bin64"} or {"$rep","n"}. Caller frees.
 */
static uint8_t *fx_bytes(json_t *v, size_t *len, int *is_bin)
{
    uint8_t *out = NULL;
    *is_bin = 0;
    if (json_is_string(v)) {
        *len = json_string_length(v);
        out = sl_xmalloc(*len + 1);
        memcpy(out, json_string_value(v), *len);
        return out;
    }
    assert_true(json_is_object(v));
    json_t *x;
    if ((x = json_object_get(v, "$bin")) != NULL) {
        *is_bin = 1;
        *len = json_string_length(x);
        out = sl_xmalloc(*len + 1);
        memcpy(out, json_string_value(x), *len);
        return out;
    }
    if ((x = json_object_get(v, "$bin64")) != NULL) {
        size_t n = json_string_length(x);
        out = sl_xmalloc(n + 3);
        int r = EVP_DecodeBlock(out, (const unsigned char *)json_string_value(x), (int)n);
        assert_true(r >= 0);
        size_t pad = 0;
        if (n >= 1 && json_string_value(x)[n - 1] == '=')
            pad++;
        if (n >= 2 && json_string_value(x)[n - 2] == '=')
            pad++;
        *len = (size_t)r - pad;
        *is_bin = 1;
        return out;
    }
    if ((x = json_object_get(v, "$rep")) != NULL) {
        size_t unit = json_string_length(x);
        size_t n = (size_t)json_integer_value(json_object_get(v, "n"));
        *len = unit * n;
        out = sl_xmalloc(*len + 1);
        for (size_t i = 0; i < n; i++)
            memcpy(out + i * unit, json_string_value(x), unit);
        *is_bin = json_is_true(json_object_get(v, "bin"));
        return out;
    }
    fail_msg("not a bytes value");
    return NULL;
}

static int is_bytes_object(json_t *v)
{
    return json_is_object(v) && (json_object_get(v, "$bin") || json_object_get(v, "$bin64") ||
                                 json_object_get(v, "$rep"));
}

static void fx_pack(msgpack_packer *pk, json_t *v, int top)
{
    if (is_bytes_object(v) || json_is_string(v)) {
        size_t len;
        int bin;
        uint8_t *b = fx_bytes(v, &len, &bin);
        if (bin) {
            msgpack_pack_bin(pk, len);
            msgpack_pack_bin_body(pk, b, len);
        } else {
            msgpack_pack_str(pk, len);
            msgpack_pack_str_body(pk, b, len);
        }
        free(b);
    } else if (json_is_object(v)) {
        const char *k;
        size_t klen;
        json_t *x;
        size_t n = 0;
        json_object_keylen_foreach(v, k, klen, x)
        {
            (void)x;
            n += !(top && k[0] == '_');
        }
        msgpack_pack_map(pk, n);
        json_object_keylen_foreach(v, k, klen, x)
        {
            if (top && k[0] == '_')
                continue;
            msgpack_pack_str(pk, klen);
            msgpack_pack_str_body(pk, k, klen);
            fx_pack(pk, x, 0);
        }
    } else if (json_is_array(v)) {
        msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++)
            fx_pack(pk, json_array_get(v, i), 0);
    } else if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i >= 0)
            msgpack_pack_uint64(pk, (uint64_t)i);
        else
            msgpack_pack_int64(pk, i);
    } else if (json_is_real(v)) {
        msgpack_pack_double(pk, json_real_value(v));
    } else if (json_is_true(v)) {
        msgpack_pack_true(pk);
    } else if (json_is_false(v)) {
        msgpack_pack_false(pk);
    } else {
        msgpack_pack_nil(pk);
    }
}

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    if (!j)
        fail_msg("%s: %s", path, jerr.text);
    return j;
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    uint8_t *b = sl_xmalloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Sorted file names in dir ending with suffix; returns the count, *names malloc'd. */
static size_t list_dir(const char *dir, const char *suffix, char ***names)
{
    DIR *d = opendir(dir);
    size_t n = 0, cap = 0;
    *names = NULL;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name), sl = strlen(suffix);
        if (l <= sl || strcmp(de->d_name + l - sl, suffix) != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            *names = sl_xrealloc(*names, cap * sizeof(char *));
        }
        (*names)[n++] = sl_xstrdup(de->d_name);
    }
    closedir(d);
    for (size_t i = 1; i < n; i++) { /* insertion sort: a few hundred names */
        for (size_t j = i; j > 0 && strcmp((*names)[j - 1], (*names)[j]) > 0; j--) {
            char *t = (*names)[j];
            (*names)[j] = (*names)[j - 1];
            (*names)[j - 1] = t;
        }
    }
    return n;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* ==== Generic record operations (so one loop serves the three records) ==== */

enum rec_kind { REC_DELIVERY, REC_OUTCOME, REC_ENDPOINT };

union rec {
    struct sl_delivery d;
    struct sl_outcome o;
    struct sl_endpoint_rec e;
};

static int rec_decode(enum rec_kind k,
                      const void *b,
                      size_t n,
                      const struct sl_decode_limits *lim,
                      union rec *r,
                      sl_err_t *err)
{
    switch (k) {
    case REC_DELIVERY:
        return sl_delivery_decode(b, n, lim, &r->d, err);
    case REC_OUTCOME:
        return sl_outcome_decode(b, n, lim, &r->o, err);
    default:
        return sl_endpoint_rec_decode(b, n, lim, &r->e, err);
    }
}

static int rec_encode(enum rec_kind k,
                      const union rec *r,
                      const struct sl_decode_limits *lim,
                      struct sl_buf *out,
                      sl_err_t *err)
{
    switch (k) {
    case REC_DELIVERY:
        return sl_delivery_encode_lim(&r->d, lim, out, err);
    case REC_OUTCOME:
        return sl_outcome_encode_lim(&r->o, lim, out, err);
    default:
        return sl_endpoint_rec_encode_lim(&r->e, lim, out, err);
    }
}

static size_t rec_size(enum rec_kind k)
{
    return k == REC_DELIVERY  ? sizeof(struct sl_delivery)
           : k == REC_OUTCOME ? sizeof(struct sl_outcome)
                              : sizeof(struct sl_endpoint_rec);
}

static void rec_fini(enum rec_kind k, union rec *r)
{
    switch (k) {
    case REC_DELIVERY:
        sl_delivery_fini(&r->d);
        break;
    case REC_OUTCOME:
        sl_outcome_fini(&r->o);
        break;
    default:
        sl_endpoint_rec_fini(&r->e);
        break;
    }
}

/* ==== Field expectations: decoded value == fixture value (or the default) ==== */

static const char *cur_file; /* for failure messages */

static void want_str(json_t *fx, const char *key, const char *got, const char *dflt)
{
    json_t *v = json_object_get(fx, key);
    if (!v) {
        if (dflt == NULL && got != NULL)
            fail_msg("%s: absent \"%s\" decoded as non-NULL", cur_file, key);
        if (dflt && (!got || strcmp(got, dflt) != 0))
            fail_msg("%s: absent \"%s\" did not decode to its default", cur_file, key);
        return;
    }
    size_t len;
    int bin;
    uint8_t *b = fx_bytes(v, &len, &bin);
    if (!got || strlen(got) != len || memcmp(got, b, len) != 0)
        fail_msg("%s: field \"%s\" decoded wrongly", cur_file, key);
    free(b);
}

static void want_bytes(json_t *fx, const char *key, const uint8_t *got, size_t got_len)
{
    json_t *v = json_object_get(fx, key);
    if (!v) {
        if (got)
            fail_msg("%s: absent \"%s\" decoded as present", cur_file, key);
        return;
    }
    size_t len;
    int bin;
    uint8_t *b = fx_bytes(v, &len, &bin);
    if (!got || got_len != len || memcmp(got, b, len) != 0)
        fail_msg("%s: field \"%s\" decoded wrongly (%zu vs %zu bytes)", cur_file, key, got_len,
                 len);
    /* Decoded byte fields carry a NUL after the end for convenience. */
    assert_int_equal(got[got_len], 0);
    free(b);
}

static void want_uint(json_t *fx, const char *key, uint64_t got, uint64_t dflt)
{
    json_t *v = json_object_get(fx, key);
    uint64_t want = v ? (uint64_t)json_integer_value(v) : dflt;
    if (got != want)
        fail_msg("%s: field \"%s\" = %llu, want %llu", cur_file, key, (unsigned long long)got,
                 (unsigned long long)want);
}

static void want_bool(json_t *fx, const char *key, bool got, bool dflt)
{
    json_t *v = json_object_get(fx, key);
    bool want = v ? json_is_true(v) : dflt;
    if (got != want)
        fail_msg("%s: field \"%s\" decoded wrongly", cur_file, key);
}

static void want_kv(json_t *fx, const char *key, const struct sl_kv *kv, size_t n)
{
    json_t *v = json_object_get(fx, key);
    size_t want_n = v ? json_object_size(v) : 0;
    if (n != want_n)
        fail_msg("%s: field \"%s\" has %zu entries, want %zu", cur_file, key, n, want_n);
    if (want_n == 0) {
        assert_null(kv);
        return;
    }
    const char *k;
    size_t klen;
    json_t *x;
    size_t i = 0;
    json_object_keylen_foreach(v, k, klen, x)
    {
        size_t len;
        int bin;
        uint8_t *b = fx_bytes(x, &len, &bin);
        if (strlen(kv[i].name) != klen || memcmp(kv[i].name, k, klen) != 0 ||
            strlen(kv[i].value) != len || memcmp(kv[i].value, b, len) != 0)
            fail_msg("%s: field \"%s\" entry %zu decoded wrongly", cur_file, key, i);
        free(b);
        i++;
    }
}

/* An array of strings: absent and [] both decode to NULL/0. */
static void want_strs(json_t *fx, const char *key, const char *const *v, size_t n)
{
    json_t *a = json_object_get(fx, key);
    size_t want_n = a ? json_array_size(a) : 0;
    if (n != want_n)
        fail_msg("%s: field \"%s\" has %zu entries, want %zu", cur_file, key, n, want_n);
    if (want_n == 0) {
        assert_null(v);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const char *want = json_string_value(json_array_get(a, i));
        if (!want || strcmp(v[i], want) != 0)
            fail_msg("%s: field \"%s\" entry %zu decoded wrongly", cur_file, key, i);
    }
}

static void check_delivery_fields(json_t *fx, const struct sl_delivery *d)
{
    want_str(fx, "id", d->id, NULL);
    want_str(fx, "ep", d->ep, NULL);
    want_str(fx, "type", d->type, NULL);
    want_uint(fx, "ts", d->ts_ms, 0);
    want_str(fx, "ct", d->ct, SL_DELIVERY_CT_DEFAULT);
    want_bytes(fx, "body", d->body, d->body_len);
    want_kv(fx, "hdr", d->hdr, d->n_hdr);
    want_kv(fx, "macros", d->macros, d->n_macros);
    want_uint(fx, "attempt", d->attempt, 0);
    want_bool(fx, "replay", d->replay, false);
}

static void check_outcome_fields(json_t *fx, const struct sl_outcome *o)
{
    want_str(fx, "id", o->id, NULL);
    want_str(fx, "ep", o->ep, NULL);
    want_str(fx, "type", o->type, NULL);
    want_uint(fx, "attempt", o->attempt, 0);
    assert_string_equal(sl_outcome_state_name(o->state),
                        json_string_value(json_object_get(fx, "state")));
    want_uint(fx, "http", o->http, 0);
    want_str(fx, "err", o->err, NULL);
    want_str(fx, "msg", o->msg, NULL);
    want_uint(fx, "ts", o->ts_ms, 0);
    want_uint(fx, "created", o->created_ms, 0);
    want_uint(fx, "lat_us", o->lat_us, 0);
    want_uint(fx, "dns_us", o->dns_us, 0);
    want_uint(fx, "conn_us", o->conn_us, 0);
    want_uint(fx, "tls_us", o->tls_us, 0);
    want_uint(fx, "ttfb_us", o->ttfb_us, 0);
    want_uint(fx, "next", o->next_ms, 0);
    want_bytes(fx, "resp", o->resp, o->resp_len);
    want_bytes(fx, "env", o->env, o->env_len);
    want_str(fx, "pod", o->pod, NULL);
}

static void check_endpoint_fields(json_t *fx, const struct sl_endpoint_rec *e)
{
    want_str(fx, "id", e->id, NULL);
    want_str(fx, "name", e->name, NULL);
    want_str(fx, "url", e->url, NULL);
    want_bool(fx, "tpl", e->tpl, false);
    json_t *m = json_object_get(fx, "method");
    assert_string_equal(sl_http_method_name(e->method), m ? json_string_value(m) : "POST");
    want_str(fx, "ct", e->ct, NULL);
    want_kv(fx, "hdr", e->hdr, e->n_hdr);
    json_t *secs = json_object_get(fx, "secrets");
    assert_int_equal(e->n_secrets, json_array_size(secs));
    for (size_t i = 0; i < e->n_secrets; i++) {
        json_t *s = json_array_get(secs, i);
        want_bytes(s, "enc", e->secrets[i].enc, e->secrets[i].enc_len);
        want_uint(s, "exp", e->secrets[i].exp_ms, 0);
    }
    want_uint(fx, "timeout_ms", e->timeout_ms, 0);
    want_uint(fx, "conn_timeout_ms", e->conn_timeout_ms, 0);
    want_uint(fx, "retry_base_ms", e->retry_base_ms, 0);
    want_uint(fx, "retry_cap_ms", e->retry_cap_ms, 0);
    want_uint(fx, "max_attempts", e->max_attempts, 0);
    want_uint(fx, "brk_threshold", e->brk_threshold, 0);
    want_uint(fx, "brk_cooldown_ms", e->brk_cooldown_ms, 0);
    want_uint(fx, "rate", e->rate, 0);
    want_uint(fx, "rate_period_ms", e->rate_period_ms, 0);
    want_uint(fx, "burst", e->burst, 0);
    want_uint(fx, "max_inflight", e->max_inflight, 0);
    want_bool(fx, "enabled", e->enabled, true);
    want_str(fx, "reason", e->reason, NULL);
    want_uint(fx, "updated", e->updated_ms, 0);
    want_strs(fx, "types", e->types, e->n_types);
    want_strs(fx, "channels", e->channels, e->n_channels);
}

/* Every string value of >= 6 bytes in the fixture (enum values excepted), for the no-echo check. */
static void collect_values(json_t *v, const char *key, const char **out, size_t *n, size_t max)
{
    if (json_is_string(v)) {
        if (json_string_length(v) >= 6 && strcmp(key, "state") != 0 && strcmp(key, "method") != 0 &&
            *n < max)
            out[(*n)++] = json_string_value(v);
    } else if (json_is_object(v) && !is_bytes_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        {
            if (k[0] != '_')
                collect_values(x, k, out, n, max);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            collect_values(json_array_get(v, i), key, out, n, max);
    }
}

static void assert_no_echo(json_t *fx, const sl_err_t *err)
{
    const char *vals[256];
    size_t n = 0;
    collect_values(fx, "", vals, &n, 256);
    for (size_t i = 0; i < n; i++) {
        if (strstr(err->msg, vals[i]))
            fail_msg("%s: error message echoes a value: %s", cur_file, err->msg);
    }
}

static bool structs_equal(enum rec_kind k, const union rec *a, const union rec *b);

/* encode -> decode -> encode: both encodings identical, decoded record equal to the first. */
static void round_trip(enum rec_kind k, const union rec *r, const struct sl_decode_limits *lim)
{
    struct sl_buf b1, b2;
    sl_err_t err = {0};
    union rec r2;

    sl_buf_init(&b1, SIZE_MAX / 2);
    sl_buf_init(&b2, SIZE_MAX / 2);
    if (rec_encode(k, r, lim, &b1, &err) != 0)
        fail_msg("%s: re-encoding failed: %s", cur_file, err.msg);
    if (rec_decode(k, b1.data, b1.len, lim, &r2, &err) != 0)
        fail_msg("%s: decoding the re-encoding failed: %s", cur_file, err.msg);
    assert_true(structs_equal(k, r, &r2));
    assert_int_equal(rec_encode(k, &r2, lim, &b2, &err), 0);
    assert_int_equal(b1.len, b2.len);
    assert_memory_equal(b1.data, b2.data, b1.len);
    rec_fini(k, &r2);
    sl_buf_fini(&b1);
    sl_buf_fini(&b2);
}

static const char *const rec_dir[] = {"delivery", "outcome", "endpoint"};

static void run_json_fixtures(enum rec_kind k, size_t min_valid, size_t min_invalid)
{
    char dir[512], path[1024];
    size_t counts[2] = {0, 0};

    for (int valid = 1; valid >= 0; valid--) {
        char **names;
        snprintf(dir, sizeof(dir), FIXTURES "/%s/%s", rec_dir[k], valid ? "valid" : "invalid");
        size_t n = list_dir(dir, ".json", &names);
        for (size_t i = 0; i < n; i++) {
            snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
            cur_file = path;
            json_t *fx = load_json(path);
            msgpack_sbuffer sb;
            msgpack_packer pk;
            msgpack_sbuffer_init(&sb);
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            fx_pack(&pk, fx, 1);

            struct sl_decode_limits lim = {0, 0};
            json_t *jl = json_object_get(fx, "_limits");
            if (jl) {
                lim.max_body = (size_t)json_integer_value(json_object_get(jl, "max_body"));
                lim.max_record = (size_t)json_integer_value(json_object_get(jl, "max_record"));
            }
            union rec r;
            sl_err_t err = {0};
            memset(&r, 0xa5, sizeof(r)); /* decode must overwrite, not read, its output */
            int rc = rec_decode(k, sb.data, sb.size, jl ? &lim : NULL, &r, &err);
            if (valid) {
                if (rc != 0)
                    fail_msg("%s: valid fixture rejected: %s %s", path, sl_err_name(rc), err.msg);
                if (k == REC_DELIVERY)
                    check_delivery_fields(fx, &r.d);
                else if (k == REC_OUTCOME)
                    check_outcome_fields(fx, &r.o);
                else
                    check_endpoint_fields(fx, &r.e);
                round_trip(k, &r, jl ? &lim : NULL);
            } else {
                const char *want_code = json_string_value(json_object_get(fx, "_expect_code"));
                const char *want_msg = json_string_value(json_object_get(fx, "_expect_error"));
                if (!want_code || !want_msg)
                    fail_msg("%s: invalid fixture lacks _expect_code/_expect_error", path);
                if (rc == 0)
                    fail_msg("%s: invalid fixture accepted", path);
                if (strcmp(sl_err_name(rc), want_code) != 0 || err.code != rc)
                    fail_msg("%s: got %s (%s), want %s", path, sl_err_name(rc), err.msg, want_code);
                if (!strstr(err.msg, want_msg))
                    fail_msg("%s: message \"%s\" lacks \"%s\"", path, err.msg, want_msg);
                assert_no_echo(fx, &err);
                /* A failed decode leaves the output empty. */
                union rec zero;
                memset(&zero, 0, sizeof(zero));
                assert_memory_equal(&r, &zero, rec_size(k));
            }
            rec_fini(k, &r);
            rec_fini(k, &r); /* idempotent */
            msgpack_sbuffer_destroy(&sb);
            json_decref(fx);
            counts[valid]++;
        }
        free_names(names, n);
    }
    print_message("%s: %zu valid and %zu invalid JSON fixtures checked\n", rec_dir[k], counts[1],
                  counts[0]);
    assert_true(counts[1] >= min_valid);
    assert_true(counts[0] >= min_invalid);
}

static void test_fixtures_delivery(void **state)
{
    (void)state;
    run_json_fixtures(REC_DELIVERY, 20, 75);
}

static void test_fixtures_outcome(void **state)
{
    (void)state;
    run_json_fixtures(REC_OUTCOME, 10, 30);
}

static void test_fixtures_endpoint(void **state)
{
    (void)state;
    run_json_fixtures(REC_ENDPOINT, 8, 25);
}

/* ==== Raw fixtures ==== */

static void hex_decode(const char *hex, uint8_t **out, size_t *len)
{
    size_t n = strlen(hex) / 2;
    *out = sl_xmalloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        (*out)[i] = (uint8_t)v;
    }
    *len = n;
}

static void test_raw_fixtures(void **state)
{
    (void)state;
    json_t *man = load_json(FIXTURES "/raw_expect.json");
    const char *rel;
    json_t *ex;
    size_t nvalid = 0, ninvalid = 0;
    char path[1024];

    json_object_foreach(man, rel, ex)
    {
        snprintf(path, sizeof(path), FIXTURES "/%s", rel);
        cur_file = path;
        enum rec_kind k = strncmp(rel, "delivery/", 9) == 0  ? REC_DELIVERY
                          : strncmp(rel, "outcome/", 8) == 0 ? REC_OUTCOME
                                                             : REC_ENDPOINT;
        size_t len;
        uint8_t *buf = read_file(path, &len);
        union rec r;
        sl_err_t err = {0};
        int rc = rec_decode(k, buf, len, NULL, &r, &err);
        json_t *canon = json_object_get(ex, "canonical");
        if (canon) {
            if (rc != 0)
                fail_msg("%s: valid raw fixture rejected: %s", path, err.msg);
            uint8_t *want;
            size_t want_len;
            hex_decode(json_string_value(canon), &want, &want_len);
            struct sl_buf b;
            sl_buf_init(&b, 1 << 24);
            assert_int_equal(rec_encode(k, &r, NULL, &b, &err), 0);
            if (b.len != want_len || memcmp(b.data, want, want_len) != 0)
                fail_msg("%s: re-encoding differs from the canonical bytes", path);
            sl_buf_fini(&b);
            free(want);
            nvalid++;
        } else {
            const char *want_code = json_string_value(json_object_get(ex, "code"));
            const char *want_msg = json_string_value(json_object_get(ex, "error"));
            if (rc == 0)
                fail_msg("%s: invalid raw fixture accepted", path);
            if (strcmp(sl_err_name(rc), want_code) != 0)
                fail_msg("%s: got %s (%s), want %s", path, sl_err_name(rc), err.msg, want_code);
            if (!strstr(err.msg, want_msg))
                fail_msg("%s: message \"%s\" lacks \"%s\"", path, err.msg, want_msg);
            ninvalid++;
        }
        rec_fini(k, &r);
        free(buf);
    }
    /* Every .msgpack file on disk is in the manifest (no silently unchecked fixture). */
    for (int k = 0; k < 3; k++) {
        for (int valid = 0; valid < 2; valid++) {
            char dir[512], **names;
            snprintf(dir, sizeof(dir), FIXTURES "/%s/%s", rec_dir[k], valid ? "valid" : "invalid");
            size_t n = list_dir(dir, ".msgpack", &names);
            for (size_t i = 0; i < n; i++) {
                snprintf(path, sizeof(path), "%s/%s/%s", rec_dir[k], valid ? "valid" : "invalid",
                         names[i]);
                if (!json_object_get(man, path))
                    fail_msg("%s is not listed in raw_expect.json", path);
            }
            free_names(names, n);
        }
    }
    print_message("raw: %zu valid and %zu invalid .msgpack fixtures checked\n", nvalid, ninvalid);
    assert_true(nvalid >= 10);
    assert_true(ninvalid >= 60);
    json_decref(man);
}

/* ==== Struct equality ==== */

static bool str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

/* Present-vs-absent matters for optional byte fields (NULL = absent). */
static bool bytes_eq(const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
    if (!a || !b)
        return a == b;
    return al == bl && memcmp(a, b, al) == 0;
}

static bool kv_eq(const struct sl_kv *a, size_t an, const struct sl_kv *b, size_t bn)
{
    if (an != bn)
        return false;
    for (size_t i = 0; i < an; i++) {
        if (!str_eq(a[i].name, b[i].name) || !str_eq(a[i].value, b[i].value))
            return false;
    }
    return true;
}

static bool strs_eq(const char *const *a, size_t an, const char *const *b, size_t bn)
{
    if (an != bn)
        return false;
    for (size_t i = 0; i < an; i++) {
        if (!str_eq(a[i], b[i]))
            return false;
    }
    return true;
}

static bool structs_equal(enum rec_kind k, const union rec *ra, const union rec *rb)
{
    if (k == REC_DELIVERY) {
        const struct sl_delivery *a = &ra->d, *b = &rb->d;
        /* ct NULL means the default on the encode side. */
        const char *act = a->ct ? a->ct : SL_DELIVERY_CT_DEFAULT;
        const char *bct = b->ct ? b->ct : SL_DELIVERY_CT_DEFAULT;
        return str_eq(a->id, b->id) && str_eq(a->ep, b->ep) && str_eq(a->type, b->type) &&
               a->ts_ms == b->ts_ms && str_eq(act, bct) && a->body_len == b->body_len &&
               (a->body_len == 0 || memcmp(a->body, b->body, a->body_len) == 0) &&
               kv_eq(a->hdr, a->n_hdr, b->hdr, b->n_hdr) &&
               kv_eq(a->macros, a->n_macros, b->macros, b->n_macros) && a->attempt == b->attempt &&
               a->replay == b->replay;
    }
    if (k == REC_OUTCOME) {
        const struct sl_outcome *a = &ra->o, *b = &rb->o;
        return str_eq(a->id, b->id) && str_eq(a->ep, b->ep) && str_eq(a->type, b->type) &&
               a->attempt == b->attempt && a->state == b->state && a->http == b->http &&
               str_eq(a->err, b->err) && str_eq(a->msg, b->msg) && a->ts_ms == b->ts_ms &&
               a->created_ms == b->created_ms && a->lat_us == b->lat_us && a->dns_us == b->dns_us &&
               a->conn_us == b->conn_us && a->tls_us == b->tls_us && a->ttfb_us == b->ttfb_us &&
               a->next_ms == b->next_ms && bytes_eq(a->resp, a->resp_len, b->resp, b->resp_len) &&
               bytes_eq(a->env, a->env_len, b->env, b->env_len) && str_eq(a->pod, b->pod);
    }
    const struct sl_endpoint_rec *a = &ra->e, *b = &rb->e;
    if (a->n_secrets != b->n_secrets)
        return false;
    for (size_t i = 0; i < a->n_secrets; i++) {
        if (!bytes_eq(a->secrets[i].enc, a->secrets[i].enc_len, b->secrets[i].enc,
                      b->secrets[i].enc_len) ||
            a->secrets[i].exp_ms != b->secrets[i].exp_ms)
            return false;
    }
    return str_eq(a->id, b->id) && str_eq(a->name, b->name) && str_eq(a->url, b->url) &&
           a->tpl == b->tpl && a->method == b->method && str_eq(a->ct, b->ct) &&
           kv_eq(a->hdr, a->n_hdr, b->hdr, b->n_hdr) && a->timeout_ms == b->timeout_ms &&
           a->conn_timeout_ms == b->conn_timeout_ms && a->retry_base_ms == b->retry_base_ms &&
           a->retry_cap_ms == b->retry_cap_ms && a->max_attempts == b->max_attempts &&
           a->brk_threshold == b->brk_threshold && a->brk_cooldown_ms == b->brk_cooldown_ms &&
           a->rate == b->rate && a->rate_period_ms == b->rate_period_ms && a->burst == b->burst &&
           a->max_inflight == b->max_inflight && a->enabled == b->enabled &&
           str_eq(a->reason, b->reason) && a->updated_ms == b->updated_ms &&
           strs_eq(a->types, a->n_types, b->types, b->n_types) &&
           strs_eq(a->channels, a->n_channels, b->channels, b->n_channels);
}

/* ==== Encoder ==== */

static const struct sl_kv good_hdr[] = {{"X-Shop", "42"}, {"Authorization", "Bearer t"}};
static const struct sl_kv good_mac[] = {{"click_id", "abc"}, {"payout", "1.5"}};
static const uint8_t body_bytes[] = {'{', '}', 0, 0xff, '\n'};

static struct sl_delivery good_delivery(void)
{
    struct sl_delivery d = {
        .id = "evt_1",
        .ep = "ep_1",
        .type = "order.paid",
        .ts_ms = 1700000000000ULL,
        .body = body_bytes,
        .body_len = sizeof(body_bytes),
        .hdr = good_hdr,
        .n_hdr = 2,
        .macros = good_mac,
        .n_macros = 2,
        .attempt = 2,
        .replay = true,
    };
    return d;
}

/* Encoding d must fail with code and a message containing sub, leaving out untouched. */
static void want_encode_error(const struct sl_delivery *d, int code, const char *sub)
{
    struct sl_buf b;
    sl_err_t err = {0};
    sl_buf_init(&b, 1 << 20);
    assert_int_equal(sl_buf_append(&b, "prefix", 6), 0);
    int rc = sl_delivery_encode(d, &b, &err);
    if (rc != code || !strstr(err.msg, sub))
        fail_msg("encode: got %s \"%s\", want %s \"%s\"", sl_err_name(rc), err.msg,
                 sl_err_name(code), sub);
    assert_int_equal(b.len, 6);
    assert_memory_equal(b.data, "prefix", 7);
    sl_buf_fini(&b);
}

static void test_delivery_encode_round_trip(void **state)
{
    (void)state;
    struct sl_delivery d = good_delivery(), back;
    struct sl_buf b, b2;
    sl_err_t err = {0};

    sl_buf_init(&b, 1 << 20);
    sl_buf_init(&b2, 1 << 20);
    assert_int_equal(sl_buf_append(&b, "xy", 2), 0); /* encode appends */
    assert_int_equal(sl_delivery_encode(&d, &b, &err), 0);
    assert_memory_equal(b.data, "xy", 2);
    assert_int_equal(sl_delivery_decode(b.data + 2, b.len - 2, NULL, &back, &err), 0);
    union rec ra = {.d = d}, rb = {.d = back};
    assert_true(structs_equal(REC_DELIVERY, &ra, &rb));
    assert_memory_equal(back.body, body_bytes, sizeof(body_bytes));
    assert_string_equal(back.ct, SL_DELIVERY_CT_DEFAULT);
    /* Deterministic: the same record encodes to the same bytes, from either struct. */
    assert_int_equal(sl_delivery_encode(&back, &b2, &err), 0);
    assert_int_equal(b2.len, b.len - 2);
    assert_memory_equal(b2.data, b.data + 2, b2.len);
    sl_delivery_fini(&back);
    sl_delivery_fini(&back);
    sl_delivery_fini(NULL);

    /* Defaults are omitted: the minimal record is exactly v,id,ep,type,ts,body. */
    struct sl_delivery m = {
        .id = "e", .ep = "p", .type = "t", .ts_ms = 1, .ct = "application/json"};
    static const uint8_t want[] = {0x86, 0xa1, 'v',  0x01, 0xa2, 'i', 'd', 0xa1, 'e',  0xa2, 'e',
                                   'p',  0xa1, 'p',  0xa4, 't',  'y', 'p', 'e',  0xa1, 't',  0xa2,
                                   't',  's',  0x01, 0xa4, 'b',  'o', 'd', 'y',  0xc4, 0x00};
    sl_buf_reset(&b);
    assert_int_equal(sl_delivery_encode(&m, &b, &err), 0);
    assert_int_equal(b.len, sizeof(want));
    assert_memory_equal(b.data, want, sizeof(want));
    sl_buf_fini(&b);
    sl_buf_fini(&b2);
}

static void test_delivery_encode_rules(void **state)
{
    (void)state;
    struct sl_delivery d;
    struct sl_kv h[SL_HDR_MAX + 1];
    char long_id[SL_EVENT_ID_MAX + 2];

    d = good_delivery(), d.id = NULL;
    want_encode_error(&d, SL_EMISSING, "field \"id\" missing");
    d = good_delivery(), d.id = "evt.1";
    want_encode_error(&d, SL_EINVAL, "field \"id\" must contain only");
    memset(long_id, 'a', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    d = good_delivery(), d.id = long_id;
    want_encode_error(&d, SL_ETOOBIG, "field \"id\" is longer than 128 bytes");
    d = good_delivery(), d.ep = "a b";
    want_encode_error(&d, SL_EINVAL, "field \"ep\"");
    d = good_delivery(), d.type = "";
    want_encode_error(&d, SL_EINVAL, "field \"type\" is empty");
    d = good_delivery(), d.ct = "text/plain\r\nX: y";
    want_encode_error(&d, SL_EINVAL, "field \"ct\"");
    d = good_delivery(), d.body = NULL;
    want_encode_error(&d, SL_EINVAL, "field \"body\" has a length but no bytes");
    h[0] = (struct sl_kv){"X-A", "ok"};
    h[1] = (struct sl_kv){"X-B", "bad\r\nInjected: 1"};
    d = good_delivery(), d.hdr = h, d.n_hdr = 2;
    want_encode_error(&d, SL_EINVAL, "field \"hdr\": value of header 1 contains CR or LF");
    h[1] = (struct sl_kv){"webhook-signature", "v1,forged"};
    want_encode_error(&d, SL_EINVAL, "field \"hdr\": name of header 1 is reserved");
    h[1] = (struct sl_kv){"x-a", "dup"};
    want_encode_error(&d, SL_EINVAL, "name of header 1 repeats header 0");
    for (size_t i = 0; i < SL_HDR_MAX + 1; i++)
        h[i] = (struct sl_kv){"X-Same", "v"};
    d = good_delivery(), d.hdr = h, d.n_hdr = SL_HDR_MAX + 1;
    want_encode_error(&d, SL_ETOOBIG, "field \"hdr\" has 33 entries, limit 32");
    h[0] = (struct sl_kv){"click-id", "v"};
    d = good_delivery(), d.macros = h, d.n_macros = 1;
    want_encode_error(&d, SL_EINVAL, "field \"macros\": name of macro 0");

    /* Body limit comes from the limits; the default is 1 MiB. */
    uint8_t *big = sl_xcalloc(SL_MAX_BODY_DEFAULT + 1, 1);
    d = good_delivery(), d.body = big, d.body_len = SL_MAX_BODY_DEFAULT + 1;
    want_encode_error(&d, SL_ETOOBIG, "field \"body\" is 1048577 bytes, limit 1048576");
    struct sl_decode_limits lim = {.max_body = 2 * SL_MAX_BODY_DEFAULT};
    struct sl_buf b;
    sl_err_t err;
    sl_buf_init(&b, 4 * SL_MAX_BODY_DEFAULT);
    assert_int_equal(sl_delivery_encode_lim(&d, &lim, &b, &err), 0);
    struct sl_delivery back;
    assert_int_equal(sl_delivery_decode(b.data, b.len, NULL, &back, &err), SL_ETOOBIG);
    assert_int_equal(sl_delivery_decode(b.data, b.len, &lim, &back, &err), 0);
    assert_int_equal(back.body_len, SL_MAX_BODY_DEFAULT + 1);
    sl_delivery_fini(&back);
    /* max_record applies to the encoder too. */
    struct sl_decode_limits small = {.max_record = 40};
    sl_buf_reset(&b);
    d = good_delivery();
    assert_int_equal(sl_delivery_encode_lim(&d, &small, &b, &err), SL_ETOOBIG);
    assert_non_null(strstr(err.msg, "limit 40"));
    assert_int_equal(b.len, 0);
    sl_buf_fini(&b);
    free(big);

    /* The output buffer's own maximum: failure restores its length. */
    sl_buf_init(&b, 20);
    assert_int_equal(sl_buf_append(&b, "abc", 3), 0);
    d = good_delivery();
    assert_int_equal(sl_delivery_encode(&d, &b, &err), SL_ETOOBIG);
    assert_int_equal(b.len, 3);
    assert_string_equal((char *)b.data, "abc");
    sl_buf_fini(&b);
}

static void test_delivery_copy_and_lifetime(void **state)
{
    (void)state;
    struct sl_delivery d = good_delivery(), copy, dec;
    struct sl_buf b;
    sl_err_t err;

    sl_delivery_copy(&copy, &d);
    assert_non_null(copy.own);
    assert_ptr_not_equal(copy.id, d.id);
    union rec ra = {.d = d}, rb = {.d = copy};
    assert_true(structs_equal(REC_DELIVERY, &ra, &rb));

    /* The decoded record outlives (and does not alias) its input buffer. */
    sl_buf_init(&b, 1 << 20);
    assert_int_equal(sl_delivery_encode(&copy, &b, &err), 0);
    uint8_t *in = sl_xmalloc(b.len);
    memcpy(in, b.data, b.len);
    assert_int_equal(sl_delivery_decode(in, b.len, NULL, &dec, &err), 0);
    memset(in, 0xa5, b.len);
    free(in);
    rb.d = dec;
    assert_true(structs_equal(REC_DELIVERY, &ra, &rb));
    sl_delivery_fini(&dec);
    sl_delivery_fini(&copy);
    assert_null(copy.own);
    assert_null(copy.id);
    sl_buf_fini(&b);

    /* Copy of an empty-body, header-less record. */
    struct sl_delivery m = {.id = "e", .ep = "p", .type = "t"};
    sl_delivery_copy(&copy, &m);
    assert_non_null(copy.body);
    assert_int_equal(copy.body_len, 0);
    assert_null(copy.hdr);
    assert_null(copy.ct);
    sl_delivery_fini(&copy);
}

static struct sl_outcome good_outcome(void)
{
    struct sl_outcome o = {
        .id = "evt_1",
        .ep = "ep_1",
        .type = "order.paid",
        .attempt = 1,
        .state = SL_OUTCOME_DELIVERED,
        .http = 204,
        .ts_ms = 2,
        .created_ms = 1,
        .lat_us = 10,
    };
    return o;
}

static void want_outcome_error(const struct sl_outcome *o, int code, const char *sub)
{
    struct sl_buf b;
    sl_err_t err = {0};
    sl_buf_init(&b, 1 << 20);
    int rc = sl_outcome_encode(o, &b, &err);
    if (rc != code || !strstr(err.msg, sub))
        fail_msg("encode: got %s \"%s\", want %s \"%s\"", sl_err_name(rc), err.msg,
                 sl_err_name(code), sub);
    assert_int_equal(b.len, 0);
    sl_buf_fini(&b);
}

static void test_outcome_encode(void **state)
{
    (void)state;
    struct sl_outcome o = good_outcome(), back;
    struct sl_buf b;
    sl_err_t err;
    static const uint8_t env[] = {0x80};

    sl_buf_init(&b, 1 << 20);
    for (int st = 0; st < SL_OUTCOME_STATE_COUNT; st++) {
        o = good_outcome();
        o.state = (enum sl_outcome_state)st;
        if (st == SL_OUTCOME_RETRY_SCHEDULED || st == SL_OUTCOME_DEFERRED)
            o.next_ms = 99;
        if (st == SL_OUTCOME_DEAD_LETTER)
            o.env = env, o.env_len = sizeof(env);
        if (st == SL_OUTCOME_QUARANTINED)
            o.id = o.ep = o.type = NULL, o.created_ms = 0;
        sl_buf_reset(&b);
        if (sl_outcome_encode(&o, &b, &err) != 0)
            fail_msg("state %d: %s", st, err.msg);
        assert_int_equal(sl_outcome_decode(b.data, b.len, NULL, &back, &err), 0);
        union rec ra = {.o = o}, rb = {.o = back};
        assert_true(structs_equal(REC_OUTCOME, &ra, &rb));
        sl_outcome_fini(&back);
    }
    sl_buf_fini(&b);

    o = good_outcome(), o.state = (enum sl_outcome_state)SL_OUTCOME_STATE_COUNT;
    want_outcome_error(&o, SL_EINVAL, "field \"state\" is not a known state");
    o = good_outcome(), o.state = SL_OUTCOME_RETRY_SCHEDULED;
    want_outcome_error(&o, SL_EMISSING, "field \"next\" missing");
    o = good_outcome(), o.next_ms = 5;
    want_outcome_error(&o, SL_EINVAL, "field \"next\" must be absent when state is delivered");
    o = good_outcome(), o.env = env, o.env_len = 1;
    want_outcome_error(&o, SL_EINVAL,
                       "field \"env\" is only allowed when state is dead_letter, "
                       "retry_scheduled or deferred");
    o = good_outcome(), o.state = SL_OUTCOME_RETRY_SCHEDULED, o.next_ms = 7, o.env = env,
    o.env_len = 1;
    {
        struct sl_buf eb;
        sl_buf_init(&eb, 1 << 20);
        assert_int_equal(sl_outcome_encode(&o, &eb, NULL), 0);
        sl_buf_fini(&eb);
    }
    o = good_outcome(), o.http = 42;
    want_outcome_error(&o, SL_EINVAL, "field \"http\"");
    o = good_outcome(), o.msg = "bad\nline";
    want_outcome_error(&o, SL_EINVAL, "field \"msg\"");
    o = good_outcome(), o.err = "Timeout";
    want_outcome_error(&o, SL_EINVAL, "field \"err\"");
    o = good_outcome(), o.id = NULL;
    want_outcome_error(&o, SL_EMISSING, "field \"id\" missing");
    o = good_outcome(), o.resp_len = 3;
    want_outcome_error(&o, SL_EINVAL, "field \"resp\" has a length but no bytes");

    /* env holds a whole delivery record: its cap follows max_body. */
    struct sl_decode_limits lim = {.max_body = 10};
    uint8_t *big = sl_xcalloc(10 + SL_RECORD_OVERHEAD + 1, 1);
    o = good_outcome(), o.state = SL_OUTCOME_DEAD_LETTER, o.env = big,
    o.env_len = 10 + SL_RECORD_OVERHEAD + 1;
    sl_buf_init(&b, 1 << 20);
    assert_int_equal(sl_outcome_encode_lim(&o, &lim, &b, &err), SL_ETOOBIG);
    o.env_len--;
    assert_int_equal(sl_outcome_encode_lim(&o, &lim, &b, &err), 0);
    assert_int_equal(sl_outcome_decode(b.data, b.len, &lim, &back, &err), 0);
    assert_int_equal(back.env_len, 10 + SL_RECORD_OVERHEAD);
    sl_outcome_fini(&back);
    sl_buf_fini(&b);
    free(big);
}

static void test_outcome_state_names(void **state)
{
    (void)state;
    enum sl_outcome_state st;
    for (int i = 0; i < SL_OUTCOME_STATE_COUNT; i++) {
        const char *n = sl_outcome_state_name((enum sl_outcome_state)i);
        assert_non_null(n);
        assert_int_equal(sl_outcome_state_parse(n, strlen(n), &st), 0);
        assert_int_equal(st, i);
    }
    assert_string_equal(sl_outcome_state_name(SL_OUTCOME_RETRY_SCHEDULED), "retry_scheduled");
    assert_null(sl_outcome_state_name((enum sl_outcome_state)SL_OUTCOME_STATE_COUNT));
    assert_null(sl_outcome_state_name((enum sl_outcome_state) - 1));
    assert_int_equal(sl_outcome_state_parse("deliveredX", 9, &st), 0); /* length-bounded */
    assert_int_equal(st, SL_OUTCOME_DELIVERED);
    assert_int_equal(sl_outcome_state_parse("deliver", 7, &st), SL_EINVAL);
    assert_int_equal(sl_outcome_state_parse("", 0, &st), SL_EINVAL);
    assert_int_equal(sl_outcome_state_parse(NULL, 0, &st), SL_EINVAL);

    enum sl_http_method m;
    assert_int_equal(sl_http_method_parse("PATCH", 5, &m), 0);
    assert_int_equal(m, SL_METHOD_PATCH);
    assert_string_equal(sl_http_method_name(SL_METHOD_GET), "GET");
    assert_int_equal(sl_http_method_parse("get", 3, &m), SL_EINVAL);
    assert_int_equal(sl_http_method_parse("DELETE", 6, &m), SL_EINVAL);
    assert_null(sl_http_method_name((enum sl_http_method)SL_METHOD_COUNT));
}

static void test_endpoint_encode(void **state)
{
    (void)state;
    static const uint8_t k1[] = {1, 2, 3}, k2[] = {4};
    struct sl_endpoint_secret secs[2] = {{k1, 3, 0}, {k2, 1, 1700000000000ULL}};
    struct sl_endpoint_rec e =
                               {
                                   .id = "ep_1",
                                   .url = "https://x.example/{click}",
                                   .tpl = true,
                                   .method = SL_METHOD_GET,
                                   .secrets = secs,
                                   .n_secrets = 2,
                                   .retry_base_ms = 100,
                                   .retry_cap_ms = 1000,
                                   .rate = 5,
                                   .enabled = false,
                                   .reason = "gone",
                                   .updated_ms = 7,
                               },
                           back;
    struct sl_buf b;
    sl_err_t err;

    sl_buf_init(&b, 1 << 16);
    assert_int_equal(sl_endpoint_rec_encode(&e, &b, &err), 0);
    assert_int_equal(sl_endpoint_rec_decode(b.data, b.len, NULL, &back, &err), 0);
    union rec ra = {.e = e}, rb = {.e = back};
    assert_true(structs_equal(REC_ENDPOINT, &ra, &rb));
    sl_endpoint_rec_fini(&back);
    sl_endpoint_rec_fini(&back);

    struct sl_endpoint_rec bad = e;
    bad.n_secrets = 0;
    assert_int_equal(sl_endpoint_rec_encode(&bad, &b, &err), SL_EMISSING);
    bad = e, bad.retry_cap_ms = 50;
    assert_int_equal(sl_endpoint_rec_encode(&bad, &b, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "retry_cap_ms"));
    bad = e, bad.method = (enum sl_http_method)9;
    assert_int_equal(sl_endpoint_rec_encode(&bad, &b, &err), SL_EINVAL);
    bad = e, bad.url = "https://a b";
    assert_int_equal(sl_endpoint_rec_encode(&bad, &b, &err), SL_EINVAL);
    struct sl_endpoint_secret empty = {k1, 0, 0};
    bad = e, bad.secrets = &empty, bad.n_secrets = 1;
    assert_int_equal(sl_endpoint_rec_encode(&bad, &b, &err), SL_EINVAL);
    sl_buf_fini(&b);
}

/* types / channels: accepted, rejected with the right code, absent = byte-identical encoding. */
static void test_endpoint_types_channels(void **state)
{
    (void)state;
    static const uint8_t k1[] = {1, 2, 3};
    struct sl_endpoint_secret sec = {k1, 3, 0};
    const char *types[] = {"order.*", "invoice.paid", "a.b.*"};
    const char *chans[] = {"tenant:42", "aff-7"};
    struct sl_endpoint_rec e = {.id = "ep_1",
                                .url = "https://x.example/",
                                .secrets = &sec,
                                .n_secrets = 1,
                                .enabled = true,
                                .updated_ms = 7},
                           back, bad;
    struct sl_buf plain, with, again;
    sl_err_t err;

    sl_buf_init(&plain, 1 << 16);
    sl_buf_init(&with, 1 << 16);
    sl_buf_init(&again, 1 << 16);
    assert_int_equal(sl_endpoint_rec_encode(&e, &plain, &err), 0);
    /* empty arrays (even with a non-NULL pointer) are not written: the bytes stay the same */
    bad = e, bad.types = types, bad.n_types = 0, bad.channels = chans, bad.n_channels = 0;
    assert_int_equal(sl_endpoint_rec_encode(&bad, &again, &err), 0);
    assert_int_equal(again.len, plain.len);
    assert_memory_equal(again.data, plain.data, plain.len);
    assert_null(memmem(plain.data, plain.len, "types", 5));
    assert_null(memmem(plain.data, plain.len, "channels", 8));

    e.types = types, e.n_types = 3, e.channels = chans, e.n_channels = 2;
    assert_int_equal(sl_endpoint_rec_encode(&e, &with, &err), 0);
    assert_int_equal(sl_endpoint_rec_decode(with.data, with.len, NULL, &back, &err), 0);
    assert_int_equal(back.n_types, 3);
    assert_string_equal(back.types[0], "order.*");
    assert_string_equal(back.types[2], "a.b.*");
    assert_int_equal(back.n_channels, 2);
    assert_string_equal(back.channels[1], "aff-7");
    union rec ra = {.e = e}, rb = {.e = back};
    assert_true(structs_equal(REC_ENDPOINT, &ra, &rb));
    sl_buf_reset(&again);
    assert_int_equal(sl_endpoint_rec_encode(&back, &again, &err), 0);
    assert_int_equal(again.len, with.len);
    assert_memory_equal(again.data, with.data, with.len);
    sl_endpoint_rec_fini(&back);

    const char *dup[] = {"a.b", "a.*", "a.b"};
    bad = e, bad.types = dup, bad.n_types = 3;
    assert_int_equal(sl_endpoint_rec_encode(&bad, &again, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "field \"types\": entry 2 repeats entry 0"));
    const char *star[] = {"order*"};
    bad = e, bad.types = star, bad.n_types = 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "field \"types\": entry 0 is not"));
    const char *empty[] = {""};
    bad = e, bad.types = empty, bad.n_types = 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_EINVAL);
    bad = e, bad.types = NULL, bad.n_types = 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_EINVAL);
    const char *many[SL_EP_TYPES_MAX + 1];
    char names[SL_EP_TYPES_MAX + 1][8];
    for (int i = 0; i <= SL_EP_TYPES_MAX; i++) {
        snprintf(names[i], sizeof(names[i]), "t%d", i);
        many[i] = names[i];
    }
    bad = e, bad.types = many, bad.n_types = SL_EP_TYPES_MAX;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), 0);
    bad.n_types = SL_EP_TYPES_MAX + 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_ETOOBIG);
    bad = e, bad.channels = many, bad.n_channels = SL_EP_CHANNELS_MAX;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), 0);
    bad.n_channels = SL_EP_CHANNELS_MAX + 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_ETOOBIG);
    const char *slash[] = {"tenant/42"};
    bad = e, bad.channels = slash, bad.n_channels = 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "field \"channels\": entry 0"));
    assert_null(strstr(err.msg, "tenant/42"));
    char longc[SL_CHANNEL_MAX + 2];
    memset(longc, 'c', sizeof(longc) - 1);
    longc[SL_CHANNEL_MAX + 1] = '\0';
    const char *lc[] = {longc};
    bad = e, bad.channels = lc, bad.n_channels = 1;
    assert_int_equal(sl_endpoint_rec_validate(&bad, NULL, &err), SL_ETOOBIG);
    sl_buf_fini(&plain);
    sl_buf_fini(&with);
    sl_buf_fini(&again);
}

/* ==== Pre-scan ==== */

static int prescan(const char *bytes, size_t len, unsigned depth)
{
    sl_err_t err;
    return sl_record_prescan(bytes, len, depth, &err);
}

static void test_prescan(void **state)
{
    (void)state;
    sl_err_t err;
    /* Scalars of every fixed width. */
    assert_int_equal(prescan("\x00", 1, 8), 0);
    assert_int_equal(prescan("\xcf\x01\x02\x03\x04\x05\x06\x07\x08", 9, 8), 0);
    assert_int_equal(prescan("\xcf\x01\x02\x03\x04\x05\x06\x07", 8, 8), SL_EDECODE);
    assert_int_equal(prescan("\xd8\x01"
                             "0123456789abcdef",
                             18, 8),
                     0);
    assert_int_equal(prescan("\xd8\x01"
                             "0123456789abcde",
                             17, 8),
                     SL_EDECODE);
    assert_int_equal(prescan("\xc7\x02\x01"
                             "ab",
                             5, 8),
                     0);
    assert_int_equal(prescan("\xc7\x02\x01"
                             "a",
                             4, 8),
                     SL_EDECODE);
    assert_int_equal(prescan("\xca\x00\x00\x00\x00", 5, 8), 0);
    assert_int_equal(prescan("\xda\x00\x03"
                             "abc",
                             6, 8),
                     0);
    assert_int_equal(prescan("\xc1", 1, 8), SL_EDECODE);
    assert_int_equal(prescan("", 0, 8), SL_EDECODE);
    assert_int_equal(sl_record_prescan(NULL, 5, 8, &err), SL_EDECODE);
    /* Containers: count vs remaining bytes (each element needs at least one byte). */
    assert_int_equal(prescan("\x93\x01\x02\x03", 4, 8), 0);
    assert_int_equal(prescan("\x93\x01\x02", 3, 8), SL_EDECODE);
    assert_int_equal(prescan("\x82\x01\x02\x03", 4, 8), SL_EDECODE);
    assert_int_equal(sl_record_prescan("\xdd\x00\x00\x00\x02\x01\x02", 7, 8, &err), 0);
    assert_int_equal(sl_record_prescan("\xdd\x00\x00\x00\x03\x01\x02", 7, 8, &err), SL_EDECODE);
    assert_non_null(strstr(err.msg, "declares 3 elements but only 2 bytes remain"));
    assert_int_equal(sl_record_prescan("\xdf\xff\xff\xff\xff", 5, 8, &err), SL_EDECODE);
    assert_non_null(strstr(err.msg, "declares 8589934590 elements"));
    /* Depth: the limit counts containers, empty ones included. */
    assert_int_equal(prescan("\x91\x91\x90", 3, 3), 0);
    assert_int_equal(prescan("\x91\x91\x91\x90", 4, 3), SL_EDECODE);
    assert_int_equal(prescan("\x91\x91\x91\x90", 4, 4), 0);
    char deep[100];
    memset(deep, 0x91, sizeof(deep));
    deep[99] = (char)0xc0;
    assert_int_equal(prescan(deep, sizeof(deep), 1000), SL_EDECODE); /* capped at 32 */
    assert_int_equal(prescan(deep + 99 - 32, 33, 1000), 0);
    /* Exactly one object. */
    assert_int_equal(sl_record_prescan("\x01\x02", 2, 8, &err), SL_EDECODE);
    assert_non_null(strstr(err.msg, "1 trailing bytes"));
    assert_int_equal(prescan("\x90", 1, 8), 0);
    assert_int_equal(prescan("\x80", 1, 8), 0);
}

/* Each decoder rejects a huge declared count in the pre-scan (its message), i.e. before
 * msgpack-c could reserve count * 24 bytes for it. */
static void test_huge_counts_all_records(void **state)
{
    (void)state;
    static const uint8_t huge[] = {0x81, 0xa1, 'x', 0xdd, 0x0f, 0xff, 0xff, 0xff, 0x00};
    union rec r;
    sl_err_t err;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(rec_decode((enum rec_kind)k, huge, sizeof(huge), NULL, &r, &err),
                         SL_EDECODE);
        assert_non_null(strstr(err.msg, "declares 268435455 elements"));
        rec_fini((enum rec_kind)k, &r);
    }
}

/* ==== Validators ==== */

static void test_validators(void **state)
{
    (void)state;
    char buf[300];

    assert_true(sl_valid_event_id("evt_1", 5));
    assert_true(sl_valid_event_id("evt.1", 3)); /* length-bounded: "evt" */
    assert_false(sl_valid_event_id("evt.1", 5));
    assert_false(sl_valid_event_id("", 0));
    assert_false(sl_valid_event_id(NULL, 3));
    assert_true(sl_valid_event_id("!~\"\\", 4));
    assert_false(sl_valid_event_id("a b", 3));
    memset(buf, 'a', sizeof(buf));
    assert_true(sl_valid_event_id(buf, 128));
    assert_false(sl_valid_event_id(buf, 129));

    assert_true(sl_valid_endpoint_id("Ab-9_", 5));
    assert_false(sl_valid_endpoint_id("a.b", 3));
    assert_false(sl_valid_endpoint_id("a/b", 3));
    assert_true(sl_valid_endpoint_id(buf, 64));
    assert_false(sl_valid_endpoint_id(buf, 65));
    assert_false(sl_valid_endpoint_id("a\0b", 3));

    assert_true(sl_valid_event_type("order.paid", 10));
    assert_false(sl_valid_event_type("order paid", 10));
    assert_true(sl_valid_content_type("text/plain; charset=utf-8", 25));
    assert_false(sl_valid_content_type("a\tb", 3));
    assert_false(sl_valid_content_type("", 0));

    assert_true(sl_valid_header_name("X-Custom_1!#$%&'*+.^`|~", 23));
    assert_false(sl_valid_header_name("X Custom", 8));
    assert_false(sl_valid_header_name("X:", 2));
    assert_false(sl_valid_header_name("X\r\n", 3));
    assert_false(sl_valid_header_name("", 0));
    assert_false(sl_valid_header_name("X\"", 2));
    assert_false(sl_valid_header_name("\xc3\xa9", 2));
    assert_true(sl_valid_header_name(buf, 64));
    assert_false(sl_valid_header_name(buf, 65));

    assert_true(sl_valid_header_value("", 0));
    assert_true(sl_valid_header_value(NULL, 0));
    assert_true(sl_valid_header_value("a\tb \xff", 5));
    assert_false(sl_valid_header_value("a\rb", 3));
    assert_false(sl_valid_header_value("a\nb", 3));
    assert_false(sl_valid_header_value("a\0b", 3));
    assert_false(sl_valid_header_value("a\x1b", 2));
    assert_false(sl_valid_header_value("a\x7f", 2));
    char big[SL_HDR_VALUE_MAX + 1];
    memset(big, 'v', sizeof(big));
    assert_true(sl_valid_header_value(big, SL_HDR_VALUE_MAX));
    assert_false(sl_valid_header_value(big, SL_HDR_VALUE_MAX + 1));

    assert_true(sl_header_is_reserved("Webhook-Signature", 17));
    assert_true(sl_header_is_reserved("HOST", 4));
    assert_true(sl_header_is_reserved("Content-Length", 14));
    assert_false(sl_header_is_reserved("Hostname", 8));
    assert_false(sl_header_is_reserved("hos", 3));
    assert_false(sl_header_is_reserved("X-Webhook-Id", 12));
    assert_true(sl_header_is_reserved("webhook-foo", 11)); /* the Standard Webhooks names */
    assert_true(sl_header_is_reserved("X-Sluice-Attempt", 16));
    assert_true(sl_header_is_reserved("x-sluice-anything", 17));
    assert_false(sl_header_is_reserved("X-Sluice", 8));
    assert_false(sl_header_is_reserved("webhook", 7));
    assert_false(sl_header_is_reserved(NULL, 0));

    assert_true(sl_valid_macro_name("click_ID9", 9));
    assert_false(sl_valid_macro_name("click-id", 8));
    assert_false(sl_valid_macro_name("", 0));
    assert_true(sl_valid_macro_name(buf, 64));
    assert_false(sl_valid_macro_name(buf, 65));

    assert_true(sl_valid_type_filter("order.created", 13));
    assert_true(sl_valid_type_filter("order.*", 7));
    assert_true(sl_valid_type_filter("a.*", 3));
    assert_true(sl_valid_type_filter("a..*", 4));
    assert_false(sl_valid_type_filter(".*", 2));
    assert_false(sl_valid_type_filter("*", 1));
    assert_false(sl_valid_type_filter("order*", 6));
    assert_false(sl_valid_type_filter("*.*", 3));
    assert_false(sl_valid_type_filter("or*der.*", 8));
    assert_false(sl_valid_type_filter("order.*x", 8));
    assert_false(sl_valid_type_filter("order paid", 10));
    assert_false(sl_valid_type_filter("", 0));
    assert_false(sl_valid_type_filter(NULL, 3));
    assert_true(sl_valid_type_filter(buf, 128));
    assert_false(sl_valid_type_filter(buf, 129));
    char wild[130];
    memset(wild, 'w', sizeof(wild));
    memcpy(wild + 126, ".*", 2); /* 126-byte prefix: 128 bytes in all */
    assert_true(sl_valid_type_filter(wild, 128));
    memset(wild, 'w', sizeof(wild));
    memcpy(wild + 127, ".*", 2);
    assert_false(sl_valid_type_filter(wild, 129));

    assert_true(sl_valid_channel("tenant:42", 9));
    assert_true(sl_valid_channel("A-z_0.9:-", 9));
    assert_false(sl_valid_channel("tenant/42", 9));
    assert_false(sl_valid_channel("a b", 3));
    assert_false(sl_valid_channel("", 0));
    assert_false(sl_valid_channel(NULL, 1));
    assert_true(sl_valid_channel(buf, 64));
    assert_false(sl_valid_channel(buf, 65));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_delivery),
        cmocka_unit_test(test_fixtures_outcome),
        cmocka_unit_test(test_fixtures_endpoint),
        cmocka_unit_test(test_raw_fixtures),
        cmocka_unit_test(test_delivery_encode_round_trip),
        cmocka_unit_test(test_delivery_encode_rules),
        cmocka_unit_test(test_delivery_copy_and_lifetime),
        cmocka_unit_test(test_outcome_encode),
        cmocka_unit_test(test_outcome_state_names),
        cmocka_unit_test(test_endpoint_encode),
        cmocka_unit_test(test_endpoint_types_channels),
        cmocka_unit_test(test_prescan),
        cmocka_unit_test(test_huge_counts_all_records),
        cmocka_unit_test(test_validators),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
