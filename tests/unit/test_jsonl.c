/*
 * test_jsonl: sluice-produce's JSON line format (common/sl_jsonl) -> struct sl_delivery.
 *
 * Valid lines are checked field by field (body bytes exactly, headers and macros in order,
 * generated ids, defaults) and then pushed through the msgpack codec and back. Invalid lines
 * are table-driven: each has its error code and message substring, and every line carries the
 * token PLANTED somewhere in a value so the test can assert that no message echoes a value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_err.h"
#include "common/sl_jsonl.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_time.h"

#define NOW 1700000000123ULL

static int parse(const char *line, struct sl_delivery *d, sl_err_t *err)
{
    struct sl_jsonl_opts opts = {.now_ms = NOW};
    return sl_jsonl_parse(line, strlen(line), &opts, d, err);
}

static void parse_ok(const char *line, struct sl_delivery *d)
{
    sl_err_t err = {0};
    int rc = parse(line, d, &err);
    if (rc != 0)
        fail_msg("rejected %s: %s %s", line, sl_err_name(rc), err.msg);
}

static void assert_body(const struct sl_delivery *d, const void *want, size_t len)
{
    if (d->body_len != len || memcmp(d->body, want, len) != 0)
        fail_msg("body is %zu bytes \"%.*s\", want %zu bytes", d->body_len, (int)d->body_len,
                 (const char *)d->body, len);
}

/* Decoded == re-encoded-and-decoded: the line produced a record the codec accepts as is. */
static void assert_codec_round_trip(const struct sl_delivery *d)
{
    struct sl_buf b;
    struct sl_delivery back;
    sl_err_t err;
    sl_buf_init(&b, 1 << 22);
    assert_int_equal(sl_delivery_encode(d, &b, &err), 0);
    assert_int_equal(sl_delivery_decode(b.data, b.len, NULL, &back, &err), 0);
    assert_string_equal(back.id, d->id);
    assert_string_equal(back.ep, d->ep);
    assert_string_equal(back.type, d->type);
    assert_string_equal(back.ct, d->ct);
    assert_int_equal(back.ts_ms, d->ts_ms);
    assert_int_equal(back.body_len, d->body_len);
    assert_memory_equal(back.body, d->body, d->body_len);
    assert_int_equal(back.n_hdr, d->n_hdr);
    for (size_t i = 0; i < d->n_hdr; i++) {
        assert_string_equal(back.hdr[i].name, d->hdr[i].name);
        assert_string_equal(back.hdr[i].value, d->hdr[i].value);
    }
    assert_int_equal(back.n_macros, d->n_macros);
    for (size_t i = 0; i < d->n_macros; i++) {
        assert_string_equal(back.macros[i].name, d->macros[i].name);
        assert_string_equal(back.macros[i].value, d->macros[i].value);
    }
    sl_delivery_fini(&back);
    sl_buf_fini(&b);
}

static void test_full_line(void **state)
{
    (void)state;
    struct sl_delivery d;
    parse_ok("{\"id\":\"evt_42\",\"endpoint\":\"shop-1\",\"type\":\"order.paid\","
             "\"created_at_ms\":1699999999999,\"content_type\":\"application/vnd.x+json\","
             "\"body\":{\"order\": 42, \"items\": [ true, null, \"\\u00e9\" ], \"p\": 1.5},"
             "\"headers\":{\"X-Shop\":\"42\",\"X-Trace\":\"a\\tb \\u00e9\"},"
             "\"macros\":{\"click_id\":\"abc\",\"payout\":12.34,\"qty\":42,\"neg\":-0.5,"
             "\"big\":1e21,\"i64\":-9223372036854775808}}\n",
             &d);
    assert_string_equal(d.id, "evt_42");
    assert_string_equal(d.ep, "shop-1");
    assert_string_equal(d.type, "order.paid");
    assert_int_equal(d.ts_ms, 1699999999999ULL);
    assert_string_equal(d.ct, "application/vnd.x+json");
    /* Non-string bodies are re-serialised compactly, keys in input order, UTF-8 kept. */
    static const char want_body[] = "{\"order\":42,\"items\":[true,null,\"\xc3\xa9\"],\"p\":1.5}";
    assert_body(&d, want_body, sizeof(want_body) - 1);
    assert_int_equal(d.n_hdr, 2);
    assert_string_equal(d.hdr[0].name, "X-Shop");
    assert_string_equal(d.hdr[1].value, "a\tb \xc3\xa9");
    assert_int_equal(d.n_macros, 6);
    assert_string_equal(d.macros[0].value, "abc");
    assert_string_equal(d.macros[1].name, "payout");
    assert_string_equal(d.macros[1].value, "12.34"); /* not 12.339999999999999 */
    assert_string_equal(d.macros[2].value, "42");
    assert_string_equal(d.macros[3].value, "-0.5");
    assert_string_equal(d.macros[4].value, "1e+21");
    assert_string_equal(d.macros[5].value, "-9223372036854775808");
    assert_int_equal(d.attempt, 0);
    assert_false(d.replay);
    assert_non_null(d.own);
    assert_codec_round_trip(&d);
    sl_delivery_fini(&d);
    sl_delivery_fini(&d);
    assert_null(d.own);
}

static void test_defaults_and_generated_id(void **state)
{
    (void)state;
    struct sl_delivery a, b;
    parse_ok("{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"x\"}", &a);
    parse_ok("{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"x\"}", &b);
    assert_int_equal(strlen(a.id), SL_JSONL_GEN_ID_LEN);
    assert_memory_equal(a.id, "evt_", 4);
    for (size_t i = 4; i < SL_JSONL_GEN_ID_LEN; i++)
        assert_non_null(strchr("0123456789abcdefghjkmnpqrstvwxyz", a.id[i]));
    assert_true(sl_valid_event_id(a.id, strlen(a.id)));
    assert_string_not_equal(a.id, b.id);
    assert_int_equal(a.ts_ms, NOW);
    assert_string_equal(a.ct, SL_DELIVERY_CT_DEFAULT);
    assert_null(a.hdr);
    assert_null(a.macros);
    sl_delivery_fini(&a);
    sl_delivery_fini(&b);

    /* now_ms = 0 reads the real clock. */
    struct sl_jsonl_opts opts = {0};
    static const char line[] = "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":null}";
    uint64_t before = (uint64_t)sl_now_ms(); /* the parser's clock: time() may lag it */
    assert_int_equal(sl_jsonl_parse(line, sizeof(line) - 1, &opts, &a, NULL), 0);
    uint64_t after = (uint64_t)sl_now_ms();
    assert_true(a.ts_ms >= before && a.ts_ms <= after);
    assert_body(&a, "null", 4);
    sl_delivery_fini(&a);
    assert_int_equal(sl_jsonl_parse(line, sizeof(line) - 1, NULL, &a, NULL), 0);
    sl_delivery_fini(&a);

    char id[SL_JSONL_GEN_ID_LEN + 1];
    assert_int_equal(sl_jsonl_gen_event_id(id, NULL), 0);
    assert_int_equal(strlen(id), SL_JSONL_GEN_ID_LEN);
    /* ids come from a per-thread pool refilled every 30: across several refills every id
     * is well-formed and distinct */
    enum { N = 200 };
    static char ids[N][SL_JSONL_GEN_ID_LEN + 1];
    for (int i = 0; i < N; i++) {
        assert_int_equal(sl_jsonl_gen_event_id(ids[i], NULL), 0);
        assert_int_equal(strncmp(ids[i], "evt_", 4), 0);
        assert_int_equal(strspn(ids[i] + 4, "0123456789abcdefghjkmnpqrstvwxyz"), 26);
        for (int k = 0; k < i; k++)
            assert_string_not_equal(ids[i], ids[k]);
    }
}

static void test_string_bodies_verbatim(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        const char *body;
        size_t len;
    } cases[] = {
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\"}", "", 0},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"line1\\nline2\\t\\\"q\\\" \\\\ \\/\"}",
         "line1\nline2\t\"q\" \\ /", 19},
        /* \u escapes -> UTF-8, including a surrogate pair */
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\\u00e9\\u20ac\\ud83d\\ude00\"}",
         "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9},
        /* raw UTF-8 passes through untouched */
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}",
         "caf\xc3\xa9 \xf0\x9f\x98\x80", 10},
        /* NUL inside a string body is a body byte like any other */
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"a\\u0000b\"}", "a\0b", 3},
        /* a string that looks like JSON is still sent as its characters */
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"{\\\"a\\\": 1}\"}", "{\"a\": 1}", 8},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":{}}", "{}", 2},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":[]}", "[]", 2},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":true}", "true", 4},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":-12}", "-12", 3},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":[\"\\u0000\"]}", "[\"\\u0000\"]", 10},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"AAEC/w==\"}", "\x00\x01\x02\xff", 4},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"AAEC/w\"}", "\x00\x01\x02\xff", 4},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"\"}", "", 0},
        {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"aGk=\"}", "hi", 2},
        /* surrounding whitespace and CRLF line ends */
        {"  {\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"x\"}  \r\n", "x", 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sl_delivery d;
        parse_ok(cases[i].line, &d);
        assert_body(&d, cases[i].body, cases[i].len);
        assert_non_null(d.body);
        assert_codec_round_trip(&d);
        sl_delivery_fini(&d);
    }
}

static void test_not_nul_terminated(void **state)
{
    (void)state;
    static const char text[] = "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"x\"}";
    size_t n = sizeof(text) - 1;
    char *buf = sl_xmalloc(n);
    memcpy(buf, text, n); /* no NUL after the line: ASan catches any over-read */
    struct sl_delivery d;
    assert_int_equal(sl_jsonl_parse(buf, n, NULL, &d, NULL), 0);
    free(buf); /* the record owns copies */
    assert_string_equal(d.ep, "e");
    assert_body(&d, "x", 1);
    sl_delivery_fini(&d);
}

static void test_limits(void **state)
{
    (void)state;
    struct sl_decode_limits lim = {.max_body = 4};
    struct sl_jsonl_opts opts = {.lim = &lim, .now_ms = NOW};
    struct sl_delivery d;
    sl_err_t err;
    const char *l;

    l = "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"1234\"}";
    assert_int_equal(sl_jsonl_parse(l, strlen(l), &opts, &d, &err), 0);
    sl_delivery_fini(&d);
    l = "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"12345\"}";
    assert_int_equal(sl_jsonl_parse(l, strlen(l), &opts, &d, &err), SL_ETOOBIG);
    assert_string_equal(err.msg, "field \"body\" is 5 bytes, limit 4");
    l = "{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"AAECAw==\"}";
    assert_int_equal(sl_jsonl_parse(l, strlen(l), &opts, &d, &err), 0);
    assert_int_equal(d.body_len, 4);
    sl_delivery_fini(&d);
    l = "{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"AAECAwQ=\"}";
    assert_int_equal(sl_jsonl_parse(l, strlen(l), &opts, &d, &err), SL_ETOOBIG);
    assert_non_null(strstr(err.msg, "field \"body_base64\" decodes to more than 4 bytes"));

    /* Line cap, counted before any parsing (newline included). */
    opts.lim = NULL;
    l = "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"x\"}\n";
    opts.max_line = strlen(l);
    assert_int_equal(sl_jsonl_parse(l, strlen(l), &opts, &d, &err), 0);
    sl_delivery_fini(&d);
    opts.max_line = strlen(l) - 1;
    assert_int_equal(sl_jsonl_parse(l, strlen(l), &opts, &d, &err), SL_ETOOBIG);
    assert_non_null(strstr(err.msg, "line is 39 bytes, limit 38"));

    /* Exactly 32 headers and 64 macros are fine; one more is not. */
    char big[8192];
    for (int nh = 32; nh <= 33; nh++) {
        int off = snprintf(big, sizeof(big),
                           "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\","
                           "\"headers\":{");
        for (int i = 0; i < nh; i++)
            off +=
                snprintf(big + off, sizeof(big) - (size_t)off, "%s\"X-%d\":\"v\"", i ? "," : "", i);
        snprintf(big + off, sizeof(big) - (size_t)off, "}}");
        int rc = sl_jsonl_parse(big, strlen(big), NULL, &d, &err);
        assert_int_equal(rc, nh == 32 ? 0 : SL_ETOOBIG);
        if (rc == 0) {
            assert_int_equal(d.n_hdr, 32);
            assert_string_equal(d.hdr[31].name, "X-31");
        } else {
            assert_string_equal(err.msg, "field \"headers\" has 33 entries, limit 32");
        }
        sl_delivery_fini(&d);
    }
    for (int nm = 64; nm <= 65; nm++) {
        int off = snprintf(big, sizeof(big),
                           "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\","
                           "\"macros\":{");
        for (int i = 0; i < nm; i++)
            off +=
                snprintf(big + off, sizeof(big) - (size_t)off, "%s\"m%d\":%d", i ? "," : "", i, i);
        snprintf(big + off, sizeof(big) - (size_t)off, "}}");
        int rc = sl_jsonl_parse(big, strlen(big), NULL, &d, &err);
        assert_int_equal(rc, nm == 64 ? 0 : SL_ETOOBIG);
        if (rc == 0)
            assert_string_equal(d.macros[63].value, "63");
        sl_delivery_fini(&d);
    }
}

struct bad_case {
    const char *line;
    int code;
    const char *msg; /* substring */
};

/* Every line contains PLANTED in a value; no message may contain it. */
static const struct bad_case bad_cases[] = {
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED", SL_EDECODE,
     "line is not valid JSON: unexpected end of input"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":PLANTED}", SL_EDECODE,
     "line is not valid JSON: syntax error at byte"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\"} trailing", SL_EDECODE,
     "text after the JSON value"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\"}{}", SL_EDECODE,
     "text after the JSON value"},
    {"[\"PLANTED\"]", SL_EDECODE, "line is not a JSON object"},
    {"\"PLANTED\"", SL_EDECODE, "line is not a JSON object"},
    {"{\"endpoint\":\"e\",\"endpoint\":\"PLANTED\",\"type\":\"t\",\"body\":1}", SL_EDECODE,
     "a key repeated in one object"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\xff PLANTED\"}", SL_EDECODE, "invalid UTF-8"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\\ud800 PLANTED\"}", SL_EDECODE,
     "line is not valid JSON"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"endpiont\":\"x\"}", SL_EINVAL,
     "unknown field \"endpiont\""},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"attempt\":3}", SL_EINVAL,
     "unknown field \"attempt\""},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"\\u0001\\\"\":1}", SL_EINVAL,
     "unknown field (name not printable)"},
    {"{\"type\":\"t\",\"body\":\"PLANTED\"}", SL_EMISSING, "field \"endpoint\" missing"},
    {"{\"endpoint\":\"e\",\"body\":\"PLANTED\"}", SL_EMISSING, "field \"type\" missing"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"content_type\":\"PLANTED/x\"}", SL_EMISSING,
     "field \"body\" missing"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"body_base64\":\"\"}", SL_EINVAL,
     "fields \"body\" and \"body_base64\" are mutually exclusive"},
    {"{\"endpoint\":17,\"type\":\"t\",\"body\":\"PLANTED\"}", SL_EDECODE,
     "field \"endpoint\" must be a string"},
    {"{\"endpoint\":\"PLANTED.x\",\"type\":\"t\",\"body\":\"\"}", SL_EINVAL,
     "field \"endpoint\" must contain only A-Z a-z 0-9 _ -"},
    {"{\"endpoint\":\"\",\"type\":\"t\",\"body\":\"PLANTED\"}", SL_EINVAL,
     "field \"endpoint\" is empty"},
    {"{\"id\":\"PLANTED.1\",\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\"}", SL_EINVAL,
     "field \"id\" must contain only printable ASCII"},
    {"{\"id\":\"PLANTED\\u0000\",\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\"}", SL_EINVAL,
     "field \"id\" contains NUL"},
    {"{\"id\":null,\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\"}", SL_EDECODE,
     "field \"id\" must be a string"},
    {"{\"endpoint\":\"e\",\"type\":\"PLANTED \\u00e9\",\"body\":\"\"}", SL_EINVAL,
     "field \"type\" must contain only printable ASCII"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"created_at_ms\":-1}", SL_EINVAL,
     "field \"created_at_ms\" must be a non-negative integer"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"created_at_ms\":1.5}", SL_EINVAL,
     "field \"created_at_ms\" must be a non-negative integer"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"created_at_ms\":\"1\"}", SL_EINVAL,
     "field \"created_at_ms\" must be a non-negative integer"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"content_type\":\"text/PLANTED\\r\\nX: "
     "y\"}",
     SL_EINVAL, "field \"content_type\" must contain only printable ASCII and spaces"},
    {"{\"endpoint\":\"e\",\"type\":\"PLANTED\",\"body\":\"\",\"content_type\":\"\"}", SL_EINVAL,
     "field \"content_type\" is empty"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"headers\":[\"X-A\"]}", SL_EDECODE,
     "field \"headers\" must be an object"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"X-A\":\"1\",\"X-B\":\"v\\r\\n"
     "PLANTED: x\"}}",
     SL_EINVAL, "field \"headers\": value of header 1 contains CR or LF"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"X-B\":\"PLANTED\\n\"}}",
     SL_EINVAL, "field \"headers\": value of header 0 contains CR or LF"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"X-B\":\"PLANTED\\u0000\"}}",
     SL_EINVAL, "field \"headers\": value of header 0 contains NUL"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"X-B\":\"PLANTED\\u0007\"}}",
     SL_EINVAL, "field \"headers\": value of header 0 contains a control character"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"Webhook-Signature\":"
     "\"v1,PLANTED\"}}",
     SL_EINVAL, "field \"headers\": name of header 0 is reserved"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"X Bad\":\"PLANTED\"}}",
     SL_EINVAL, "field \"headers\": name of header 0 is not an HTTP token"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"X-A\":\"PLANTED\","
     "\"x-a\":\"2\"}}",
     SL_EINVAL, "field \"headers\": name of header 1 repeats header 0"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"headers\":{\"X-A\":5}}", SL_EDECODE,
     "field \"headers\": value of header 0 (\"X-A\") must be a string"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"headers\":{\"\\u0000X\":\"PLANTED\"}}",
     SL_EDECODE, "line is not valid JSON"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"macros\":{\"ok\":true}}",
     SL_EDECODE, "field \"macros\": value of macro 0 (\"ok\") must be a string or a number"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"macros\":{\"a\":\"1\",\"b\":null}}",
     SL_EDECODE, "field \"macros\": value of macro 1 (\"b\") must be a string or a number"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"macros\":{\"click-id\":\"PLANTED\"}}",
     SL_EINVAL, "field \"macros\": name of macro 0 must contain only A-Z a-z 0-9 _"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"\",\"macros\":{\"c\":\"PLANTED\\u0000\"}}",
     SL_EINVAL, "field \"macros\": value of macro 0 contains NUL"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body\":\"PLANTED\",\"macros\":\"x\"}", SL_EDECODE,
     "field \"macros\" must be an object"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"PLANTED!\"}", SL_EINVAL,
     "field \"body_base64\" is not valid base64"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":\"QUJD RA==PLANTED\"}", SL_EINVAL,
     "field \"body_base64\" is not valid base64"},
    {"{\"endpoint\":\"e\",\"type\":\"t\",\"body_base64\":42,\"content_type\":\"PLANTED\"}",
     SL_EDECODE, "field \"body_base64\" must be a string"},
};

static void test_invalid_lines(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad_case *c = &bad_cases[i];
        struct sl_delivery d;
        sl_err_t err = {0};
        assert_non_null(strstr(c->line, "PLANTED"));
        memset(&d, 0xa5, sizeof(d));
        int rc = parse(c->line, &d, &err);
        if (rc != c->code || err.code != rc || !strstr(err.msg, c->msg))
            fail_msg("case %zu: got %s \"%s\", want %s \"%s\"", i, sl_err_name(rc), err.msg,
                     sl_err_name(c->code), c->msg);
        if (strstr(err.msg, "PLANTED"))
            fail_msg("case %zu: message echoes a value: %s", i, err.msg);
        /* failure leaves the output empty */
        struct sl_delivery zero;
        memset(&zero, 0, sizeof(zero));
        assert_memory_equal(&d, &zero, sizeof(d));
        sl_delivery_fini(&d);
    }
    print_message("%zu invalid lines checked\n", sizeof(bad_cases) / sizeof(bad_cases[0]));
}

static void test_degenerate_input(void **state)
{
    (void)state;
    struct sl_delivery d;
    sl_err_t err;
    assert_int_equal(sl_jsonl_parse("", 0, NULL, &d, &err), SL_EDECODE);
    assert_string_equal(err.msg, "line is empty");
    assert_int_equal(sl_jsonl_parse("\n", 1, NULL, &d, &err), SL_EDECODE);
    assert_int_equal(sl_jsonl_parse("\r\n", 2, NULL, &d, &err), SL_EDECODE);
    assert_int_equal(sl_jsonl_parse(NULL, 3, NULL, &d, &err), SL_EINVAL);
    assert_int_equal(sl_jsonl_parse("{}", 2, NULL, &d, NULL), SL_EMISSING);
    /* Two records on one line (a lost newline upstream) are one error, not one record. */
    assert_int_equal(sl_jsonl_parse("{}\n{}\n", 6, NULL, &d, &err), SL_EDECODE);
    assert_non_null(strstr(err.msg, "text after the JSON value"));

    /* Nesting beyond jansson's depth limit is a clean error, not a crash. */
    size_t n = 5000;
    char *deep = sl_xmalloc(n * 2 + 64);
    size_t off = (size_t)snprintf(deep, 64, "{\"endpoint\":\"e\",\"type\":\"t\",\"body\":");
    memset(deep + off, '[', n);
    memset(deep + off + n, ']', n);
    deep[off + 2 * n] = '}';
    assert_int_equal(sl_jsonl_parse(deep, off + 2 * n + 1, NULL, &d, &err), SL_EDECODE);
    assert_non_null(strstr(err.msg, "nesting too deep"));
    free(deep);
}

/* sl_json_elide_bodies: the envelope of plain text, and SL_ENOTFOUND for each kind of text it
 * leaves to jansson (tests/fuzz/fuzz_jsonfast.c checks it against jansson on any bytes). */
static void check_elide(const char *text, enum sl_json_shape shape, const char *want)
{
    size_t len = strlen(text), out_len = 0;
    char *out = sl_xmalloc(len + 1);
    int rc = sl_json_elide_bodies(text, len, shape, out, &out_len);
    if (!want) {
        if (rc != SL_ENOTFOUND)
            fail_msg("plain, want not: %s", text);
    } else {
        if (rc != 0)
            fail_msg("not plain, want plain: %s", text);
        out[out_len] = '\0';
        if (strcmp(out, want) != 0)
            fail_msg("%s -> %s, want %s", text, out, want);
    }
    free(out);
}

static void test_elide_bodies(void **state)
{
    (void)state;
    const enum sl_json_shape E = SL_JSON_EVENT, B = SL_JSON_BATCH;
    /* plain: object and array bodies emptied, everything else as it stands */
    check_elide(
        " {\"type\":\"a.b\", \"body\" : {\"x\":[1,2,{\"body\":3}],\"y\":\"\\u00e9\\n\"} }\n", E,
        " {\"type\":\"a.b\", \"body\" : {} }\n");
    check_elide("{\"body\":[true,false,null,-0.5,0,123456789012345678]}", E, "{\"body\":[]}");
    check_elide("{\"body\":\"a string body\",\"macros\":{\"body\":{}}}", E,
                "{\"body\":\"a string body\",\"macros\":{\"body\":{}}}");
    check_elide("{\"headers\":{\"body\":{\"k\":1}},\"body\":{}}", E,
                "{\"headers\":{\"body\":{\"k\":1}},\"body\":{}}");
    check_elide("{\"body\":{\"caf\xc3\xa9\":\"\xe2\x82\xac \xf0\x9f\x98\x80\"}}", E,
                "{\"body\":{}}");
    check_elide(
        "{\"events\":[{\"type\":\"t\",\"body\":{\"a\":1}},{\"body\":[1]},{\"body\":\"s\"},7]}", B,
        "{\"events\":[{\"type\":\"t\",\"body\":{}},{\"body\":[]},{\"body\":\"s\"},7]}");
    /* a batch's top-level "body" is not an event's */
    check_elide("{\"body\":{\"a\":1}}", B, "{\"body\":{\"a\":1}}");
    /* not plain: invalid JSON */
    check_elide("", E, NULL);
    check_elide("[]", E, NULL);
    check_elide("{\"body\":{}} x", E, NULL);
    check_elide("{\"body\":{\"a\":1,}}", E, NULL);
    check_elide("{\"body\":{\"a\":01}}", E, NULL);
    check_elide("{\"body\":{\"a\":1.}}", E, NULL);
    check_elide("{\"body\":{\"a\":tru}}", E, NULL);
    check_elide("{\"body\":\"\x01\"}", E, NULL);
    check_elide("{\"body\":\"\\x\"}", E, NULL);
    check_elide("{\"body\":\"\xc0\xaf\"}", E, NULL);     /* overlong */
    check_elide("{\"body\":\"\xed\xa0\x80\"}", E, NULL); /* a surrogate in UTF-8 */
    check_elide("{\"body\":\"\xf4\x90\x80\x80\"}", E, NULL);
    check_elide("{\"body\":{\"a\":1}", E, NULL);
    /* not plain: left to jansson's rules */
    check_elide("{\"body\":{\"a\":1,\"a\":2}}", E, NULL); /* duplicate */
    check_elide("{\"type\":\"t\",\"type\":\"u\",\"body\":{}}", E, NULL);
    check_elide("{\"b\\u006fdy\":{}}", E, NULL); /* escaped name */
    check_elide("{\"body\":\"\\u0000\"}", E, NULL);
    check_elide("{\"body\":\"\\ud83d\\ude00\"}", E, NULL);
    check_elide("{\"body\":{\"a\":1e3}}", E, NULL);
    check_elide("{\"body\":{\"a\":1234567890123456789}}", E, NULL);
    char deep[200] = "{\"body\":";
    size_t off = strlen(deep);
    memset(deep + off, '[', 70);
    memset(deep + off + 70, ']', 70);
    deep[off + 140] = '}';
    deep[off + 141] = '\0';
    check_elide(deep, E, NULL);
    struct sl_buf many;
    sl_buf_init(&many, 4096);
    (void)sl_buf_append_str(&many, "{\"body\":{");
    for (int i = 0; i < 33; i++)
        (void)sl_buf_printf(&many, "%s\"k%d\":%d", i ? "," : "", i, i);
    (void)sl_buf_append_str(&many, "}}");
    check_elide((const char *)many.data, E, NULL);
    sl_buf_fini(&many);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_line),
        cmocka_unit_test(test_defaults_and_generated_id),
        cmocka_unit_test(test_string_bodies_verbatim),
        cmocka_unit_test(test_not_nul_terminated),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_invalid_lines),
        cmocka_unit_test(test_degenerate_input),
        cmocka_unit_test(test_elide_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
