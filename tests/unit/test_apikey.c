/*
 * test_apikey: API keys (common/sl_apikey): generate/parse round trip against an independent
 * SHA-256 of the base64url-decoded secret, every way a presented key can be malformed (and
 * that no message echoes it), scope lists, the admin rule, revoked keys, channel lists.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "common/sl_apikey.h"

/* ==== helpers ==== */

static void gen(char *tok, char *id, uint8_t *hash)
{
    sl_err_t err = {0};
    int rc = sl_apikey_generate(tok, id, hash, &err);
    if (rc != 0)
        fail_msg("sl_apikey_generate: %s", err.msg);
}

/* Independent base64url decoder of the 43-character secret part. */
static int b64url_val(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

static void decode_secret(const char *s, uint8_t out[32])
{
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (size_t i = 0; i < 43; i++) {
        int v = b64url_val(s[i]);
        assert_true(v >= 0);
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            assert_true(n < 32);
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    assert_int_equal(n, 32);
    assert_int_equal(acc & ((1u << bits) - 1), 0); /* canonical: zero trailing bits */
}

/* Parse must fail with SL_EINVAL, zeroed outputs, and a message without the input. */
static void parse_bad(const char *tok, size_t len)
{
    char id[SL_APIKEY_ID_LEN + 1];
    uint8_t hash[32];
    uint8_t zero[32] = {0};
    sl_err_t err = {0};
    memset(id, 'x', sizeof(id));
    memset(hash, 0xaa, sizeof(hash));
    int rc = sl_apikey_parse(tok, len, id, hash, &err);
    if (rc != SL_EINVAL)
        fail_msg("parse accepted a bad key (len %zu): rc %d", len, rc);
    assert_string_equal(id, "");
    assert_memory_equal(hash, zero, 32);
    assert_non_null(strstr(err.msg, "invalid api key"));
    if (tok && len >= 12) {
        /* no 8-byte run of the input appears in the message */
        for (size_t i = 0; i + 8 <= len; i++)
            assert_null(memmem(err.msg, strlen(err.msg), tok + i, 8));
    }
}

/* ==== generate / parse ==== */

static void test_roundtrip(void **state)
{
    (void)state;
    for (int round = 0; round < 200; round++) {
        char tok[SL_APIKEY_TOKEN_MAX], id[SL_APIKEY_ID_LEN + 1], id2[SL_APIKEY_ID_LEN + 1];
        uint8_t hash[32], hash2[32], secret[32], want[32];
        gen(tok, id, hash);
        assert_int_equal(strlen(tok), SL_APIKEY_TOKEN_LEN);
        assert_int_equal(SL_APIKEY_TOKEN_LEN, 64);
        assert_memory_equal(tok, "slk_", 4);
        assert_memory_equal(tok + 4, id, SL_APIKEY_ID_LEN);
        assert_int_equal(tok[20], '_');
        assert_true(sl_apikey_id_valid(id, strlen(id)));
        /* the stored hash is SHA-256 of the decoded secret bytes */
        decode_secret(tok + 21, secret);
        SHA256(secret, 32, want);
        assert_memory_equal(hash, want, 32);
        sl_err_t err = {0};
        assert_int_equal(sl_apikey_parse(tok, strlen(tok), id2, hash2, &err), 0);
        assert_string_equal(id, id2);
        assert_true(sl_apikey_hash_equal(hash, hash2));
        /* a key in a larger buffer, not NUL-terminated at len */
        char longer[80];
        memcpy(longer, tok, 64);
        memcpy(longer + 64, "trailing", 9);
        assert_int_equal(sl_apikey_parse(longer, 64, id2, hash2, &err), 0);
        assert_true(sl_apikey_hash_equal(hash, hash2));
    }
}

static void test_generate_unique(void **state)
{
    (void)state;
    enum { N = 64 };
    char toks[N][SL_APIKEY_TOKEN_MAX], ids[N][SL_APIKEY_ID_LEN + 1];
    uint8_t hashes[N][32];
    for (int i = 0; i < N; i++)
        gen(toks[i], ids[i], hashes[i]);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(ids[i], ids[j]);
            assert_false(sl_apikey_hash_equal(hashes[i], hashes[j]));
        }
    }
}

static void test_hash_equal(void **state)
{
    (void)state;
    uint8_t a[32], b[32];
    memset(a, 7, 32);
    memcpy(b, a, 32);
    assert_true(sl_apikey_hash_equal(a, b));
    b[31] ^= 1;
    assert_false(sl_apikey_hash_equal(a, b));
    b[31] ^= 1;
    b[0] ^= 0x80;
    assert_false(sl_apikey_hash_equal(a, b));
}

static void test_malformed(void **state)
{
    (void)state;
    char tok[SL_APIKEY_TOKEN_MAX], id[SL_APIKEY_ID_LEN + 1];
    uint8_t hash[32];
    gen(tok, id, hash);
    char t[200];

    parse_bad(NULL, 0);
    parse_bad("", 0);
    parse_bad(tok, 63); /* short */
    parse_bad(tok, 20);
    parse_bad("slk_", 4);
    snprintf(t, sizeof(t), "%s=", tok); /* long: padding */
    parse_bad(t, strlen(t));
    snprintf(t, sizeof(t), "%sA", tok); /* long */
    parse_bad(t, strlen(t));
    memset(t, 'a', sizeof(t));
    parse_bad(t, sizeof(t)); /* far too long */

    /* wrong prefix */
    static const char *prefixes[] = {"SLK_", "slk-", "sk__", "whsec"};
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        memcpy(t, tok, 65);
        memcpy(t, prefixes[i], 4);
        parse_bad(t, 64);
    }
    /* bad characters in the id: upper case, '-', NUL, high byte; the separator */
    static const char idbad[] = {'A', '-', '_', '\0', (char)0xc3, ' '};
    for (size_t i = 0; i < sizeof(idbad); i++) {
        memcpy(t, tok, 65);
        t[4 + (i % 16)] = idbad[i];
        parse_bad(t, 64);
    }
    memcpy(t, tok, 65);
    t[20] = '-';
    parse_bad(t, 64);
    /* bad characters in the secret: standard base64, '=', NUL, space, high byte */
    static const char secbad[] = {'+', '/', '=', '\0', ' ', (char)0xff, '.'};
    for (size_t i = 0; i < sizeof(secbad); i++) {
        memcpy(t, tok, 65);
        t[21 + (i * 5) % 43] = secbad[i];
        parse_bad(t, 64);
    }
    /* non-canonical: the last character's two unused low bits set */
    memcpy(t, tok, 65);
    int v = b64url_val(t[63]);
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    t[63] = alpha[(v & ~3) | 1];
    parse_bad(t, 64);
    t[63] = alpha[v & ~3]; /* the canonical one parses */
    sl_err_t err;
    char id2[SL_APIKEY_ID_LEN + 1];
    assert_int_equal(sl_apikey_parse(t, 64, id2, hash, &err), 0);
}

/* ==== scopes ==== */

static void test_scopes(void **state)
{
    (void)state;
    unsigned s = 99;
    sl_err_t err;
    char buf[SL_APIKEY_SCOPES_STR_MAX];
    assert_int_equal(sl_apikey_scopes_parse("publish,read", &s, &err), 0);
    assert_int_equal(s, SL_SCOPE_PUBLISH | SL_SCOPE_READ);
    assert_int_equal(sl_apikey_scopes_parse("admin", &s, &err), 0);
    assert_int_equal(s, SL_SCOPE_ADMIN);
    assert_int_equal(sl_apikey_scopes_parse("read,read", &s, &err), 0);
    assert_int_equal(s, SL_SCOPE_READ);
    assert_int_equal(sl_apikey_scopes_parse("admin,read,publish", &s, &err), 0);
    assert_int_equal(s, SL_SCOPE_ALL);
    static const char *bad[] = {"",      "publish,",     ",read",  "read,,admin", "Read",
                                "write", "publish read", "adminx", "admi"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s = 99;
        assert_int_equal(sl_apikey_scopes_parse(bad[i], &s, &err), SL_EINVAL);
        assert_int_equal(s, 0);
    }
    assert_int_equal(sl_apikey_scopes_parse(NULL, &s, &err), SL_EINVAL);
    assert_int_equal(sl_apikey_scopes_parse("write", &s, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "\"write\""));

    sl_apikey_scopes_format(SL_SCOPE_ALL, buf, sizeof(buf));
    assert_string_equal(buf, "publish,read,admin");
    sl_apikey_scopes_format(SL_SCOPE_ADMIN | SL_SCOPE_PUBLISH, buf, sizeof(buf));
    assert_string_equal(buf, "publish,admin");
    sl_apikey_scopes_format(SL_SCOPE_READ, buf, sizeof(buf));
    assert_string_equal(buf, "read");
    sl_apikey_scopes_format(0, buf, sizeof(buf));
    assert_string_equal(buf, "");
    char small[5];
    sl_apikey_scopes_format(SL_SCOPE_ALL, small, sizeof(small));
    assert_int_equal(strlen(small), 4); /* truncated, terminated */
    /* format and parse agree on every set */
    for (unsigned bits = 1; bits <= SL_SCOPE_ALL; bits++) {
        sl_apikey_scopes_format(bits, buf, sizeof(buf));
        assert_int_equal(sl_apikey_scopes_parse(buf, &s, &err), 0);
        assert_int_equal(s, bits);
    }
}

static void test_allows(void **state)
{
    (void)state;
    struct sl_apikey k;
    memset(&k, 0, sizeof(k));
    k.scopes = SL_SCOPE_PUBLISH;
    assert_true(sl_apikey_allows(&k, SL_SCOPE_PUBLISH));
    assert_false(sl_apikey_allows(&k, SL_SCOPE_READ));
    assert_false(sl_apikey_allows(&k, SL_SCOPE_ADMIN));
    assert_false(sl_apikey_allows(&k, SL_SCOPE_PUBLISH | SL_SCOPE_READ));
    assert_true(sl_apikey_allows(&k, 0));
    k.scopes = SL_SCOPE_PUBLISH | SL_SCOPE_READ;
    assert_true(sl_apikey_allows(&k, SL_SCOPE_PUBLISH | SL_SCOPE_READ));
    assert_false(sl_apikey_allows(&k, SL_SCOPE_ADMIN));
    k.scopes = SL_SCOPE_ADMIN; /* admin implies all */
    assert_true(sl_apikey_allows(&k, SL_SCOPE_PUBLISH));
    assert_true(sl_apikey_allows(&k, SL_SCOPE_READ));
    assert_true(sl_apikey_allows(&k, SL_SCOPE_ALL));
    k.revoked_ms = 1700000000000; /* a revoked key allows nothing */
    assert_false(sl_apikey_allows(&k, SL_SCOPE_READ));
    assert_false(sl_apikey_allows(&k, 0));
    assert_false(sl_apikey_allows(NULL, 0));
}

/* ==== channels ==== */

static void test_channels(void **state)
{
    (void)state;
    sl_err_t err;
    char **v = NULL;
    size_t n = 99;
    struct sl_apikey k;
    memset(&k, 0, sizeof(k));
    k.scopes = SL_SCOPE_PUBLISH;
    /* no list: every channel */
    assert_true(sl_apikey_channel_allowed(&k, "anything"));
    assert_true(sl_apikey_channel_allowed(&k, NULL));
    assert_int_equal(sl_apikey_channels_parse("", &v, &n, &err), 0);
    assert_null(v);
    assert_int_equal(n, 0);

    assert_int_equal(sl_apikey_channels_parse("orders,billing.eu:v2,a-b_c", &v, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(v[1], "billing.eu:v2");
    k.channels = v;
    k.n_channels = n;
    assert_true(sl_apikey_channel_allowed(&k, "orders"));
    assert_true(sl_apikey_channel_allowed(&k, "a-b_c"));
    assert_false(sl_apikey_channel_allowed(&k, "order"));
    assert_false(sl_apikey_channel_allowed(&k, "orders2"));
    assert_false(sl_apikey_channel_allowed(&k, "Orders"));
    assert_false(sl_apikey_channel_allowed(&k, ""));
    assert_false(sl_apikey_channel_allowed(&k, NULL));
    memcpy(k.id, "abcdefghij012345", 16);
    assert_int_equal(sl_apikey_validate(&k, &err), 0);
    sl_apikey_fini(&k);
    assert_null(k.channels);

    char c64[65], c65[66];
    memset(c64, 'c', 64);
    c64[64] = '\0';
    memset(c65, 'c', 65);
    c65[65] = '\0';
    assert_true(sl_apikey_channel_valid(c64, 64));
    assert_false(sl_apikey_channel_valid(c65, 65));
    assert_false(sl_apikey_channel_valid("", 0));
    assert_false(sl_apikey_channel_valid("a b", 3));
    assert_false(sl_apikey_channel_valid("a/b", 3));
    assert_false(sl_apikey_channel_valid("\xc3\xa9", 2));
    assert_int_equal(sl_apikey_channels_parse(c64, &v, &n, &err), 0);
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);

    /* refused lists allocate nothing (ASan builds check) */
    char many[17 * 4 + 1] = "";
    for (int i = 0; i < 17; i++) {
        char one[8];
        snprintf(one, sizeof(one), "%sc%02d", i ? "," : "", i);
        strncat(many, one, sizeof(many) - strlen(many) - 1);
    }
    static const char *bad[] = {",", "a,", ",a", "a,,b", "a b", "a;b", "a,a", "é"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = (char **)1;
        n = 5;
        if (sl_apikey_channels_parse(bad[i], &v, &n, &err) != SL_EINVAL)
            fail_msg("channel list #%zu accepted", i);
        assert_null(v);
        assert_int_equal(n, 0);
    }
    assert_int_equal(sl_apikey_channels_parse(c65, &v, &n, &err), SL_EINVAL);
    assert_int_equal(sl_apikey_channels_parse(many, &v, &n, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "at most 16"));
    many[strlen(many) - 4] = '\0'; /* 16 channels */
    assert_int_equal(sl_apikey_channels_parse(many, &v, &n, &err), 0);
    assert_int_equal(n, 16);
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static void test_validate(void **state)
{
    (void)state;
    sl_err_t err;
    struct sl_apikey k;
    memset(&k, 0, sizeof(k));
    memcpy(k.id, "abcdefghij012345", 16);
    k.scopes = SL_SCOPE_READ;
    assert_int_equal(sl_apikey_validate(&k, &err), 0); /* NULL name = "" */
    k.scopes = 0;
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.scopes = 8;
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.scopes = SL_SCOPE_READ;
    k.rate_per_s = -1;
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.rate_per_s = (int64_t)SL_APIKEY_RATE_MAX + 1;
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.rate_per_s = 10;
    k.burst = -5;
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.burst = 20;
    assert_int_equal(sl_apikey_validate(&k, &err), 0);
    k.id[3] = 'A';
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.id[3] = 'd';
    char name[200];
    memset(name, 'n', sizeof(name));
    name[128] = '\0';
    k.name = name;
    assert_int_equal(sl_apikey_validate(&k, &err), 0);
    name[128] = 'n';
    name[129] = '\0';
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    snprintf(name, sizeof(name), "bad\nname");
    assert_int_equal(sl_apikey_validate(&k, &err), SL_EINVAL);
    k.name = NULL;
    assert_false(sl_apikey_id_valid("abcdefghij01234", 15));
    assert_false(sl_apikey_id_valid("abcdefghij0123456", 17));
    assert_false(sl_apikey_id_valid(NULL, 16));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),  cmocka_unit_test(test_generate_unique),
        cmocka_unit_test(test_hash_equal), cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_scopes),     cmocka_unit_test(test_allows),
        cmocka_unit_test(test_channels),   cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
