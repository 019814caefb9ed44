/*
 * test_sign: Standard Webhooks signing and verification (common/sl_sign).
 *
 * The reference vector comes from the official libraries' own tests
 * (standard-webhooks/standard-webhooks: libraries/python/tests/test_webhooks.py
 * test_sign_function and libraries/javascript/src/webhook.test.ts "sign function works").
 * Everything else is checked against an independent one-shot HMAC() of the concatenated
 * input, so the streaming signer cannot agree with itself by accident. Ed25519 (v1a) entries
 * are checked against a one-shot EVP_DigestSign straight from the seed, itself checked
 * against RFC 8032 section 7.1 TEST 1 and TEST 2 (whose key pairs also exercise the whsk_
 * parser's public-key check).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/sl_b64.h"
#include "common/sl_sign.h"

/* ==== The published vector ==== */
#define VEC_SECRET  "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define VEC_MSG_ID  "msg_p5jXN8AQM9LWM0D4loKWxJek"
#define VEC_TS      1614265330
#define VEC_TS_STR  "1614265330"
#define VEC_PAYLOAD "{\"test\": 2432232314}"
#define VEC_SIG     "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
/* Non-matching entries used by the official "multi sig payload is valid" tests. */
#define VEC_OTHER_V1 "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
#define VEC_OTHER_V2 "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="

static const uint8_t *vec_body(void)
{
    return (const uint8_t *)VEC_PAYLOAD;
}

static size_t vec_len(void)
{
    return strlen(VEC_PAYLOAD);
}

static void parse_ok(struct sl_secret *s, const char *str)
{
    sl_err_t err = {0};
    int rc = sl_secret_parse(s, str, &err);
    if (rc != 0)
        fail_msg("sl_secret_parse: %s", err.msg);
}

static void random_secret(struct sl_secret *s, size_t len)
{
    memset(s, 0, sizeof(*s));
    assert_int_equal(RAND_bytes(s->key, (int)len), 1);
    s->len = len;
}

static sl_signer_t *signer_of(const struct sl_secret *secrets, size_t n)
{
    sl_signer_t *sg = NULL;
    sl_err_t err = {0};
    if (sl_signer_new(secrets, n, &sg, &err) != 0)
        fail_msg("sl_signer_new: %s", err.msg);
    assert_non_null(sg);
    return sg;
}

/* Reference: one-shot HMAC over the concatenation, base64, "v1," prefix. */
static void reference_entry(const struct sl_secret *s,
                            const char *id,
                            int64_t ts,
                            const uint8_t *body,
                            size_t len,
                            char out[SL_SIGN_ENTRY_LEN + 1])
{
    char head[400];
    int h = snprintf(head, sizeof(head), "%s.%lld.", id, (long long)ts);
    assert_true(h > 0 && (size_t)h < sizeof(head));
    uint8_t *all = malloc((size_t)h + len + 1);
    assert_non_null(all);
    memcpy(all, head, (size_t)h);
    if (len)
        memcpy(all + h, body, len);
    unsigned char mac[32];
    unsigned int maclen = 0;
    assert_non_null(HMAC(EVP_sha256(), s->key, (int)s->len, all, (size_t)h + len, mac, &maclen));
    assert_int_equal(maclen, 32);
    memcpy(out, "v1,", 3);
    assert_int_equal(EVP_EncodeBlock((unsigned char *)out + 3, mac, 32), 44);
    free(all);
}

/* Reference: one-shot Ed25519 with OpenSSL straight from the seed, over raw msg/len. */
static void
reference_ed25519(const uint8_t seed[32], const uint8_t *msg, size_t len, uint8_t sig[64])
{
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
    assert_non_null(k);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    assert_non_null(md);
    size_t slen = 64;
    assert_int_equal(EVP_DigestSignInit(md, NULL, NULL, NULL, k), 1);
    assert_int_equal(EVP_DigestSign(md, sig, &slen, msg, len), 1);
    assert_int_equal(slen, 64);
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(k);
}

/* Reference "v1a,<b64>" entry: Ed25519 over the concatenation "id.ts." + body. */
static void reference_v1a_entry(const struct sl_secret *s,
                                const char *id,
                                int64_t ts,
                                const uint8_t *body,
                                size_t len,
                                char out[SL_SIGN_V1A_ENTRY_LEN + 1])
{
    assert_int_equal(s->kind, SL_SECRET_ED25519);
    char head[400];
    int h = snprintf(head, sizeof(head), "%s.%lld.", id, (long long)ts);
    assert_true(h > 0 && (size_t)h < sizeof(head));
    uint8_t *all = malloc((size_t)h + len + 1);
    assert_non_null(all);
    memcpy(all, head, (size_t)h);
    if (len)
        memcpy(all + h, body, len);
    uint8_t sig[64];
    reference_ed25519(s->key, all, (size_t)h + len, sig);
    memcpy(out, "v1a,", 4);
    assert_int_equal(EVP_EncodeBlock((unsigned char *)out + 4, sig, 64), 88);
    free(all);
}

static void unhex(const char *hex, uint8_t *out, size_t n)
{
    assert_int_equal(strlen(hex), 2 * n);
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* "<prefix><padded base64 of raw/n>" into out (>= 100 bytes). */
static void prefixed_b64(const char *prefix, const uint8_t *raw, size_t n, char *out)
{
    size_t p = strlen(prefix);
    memcpy(out, prefix, p);
    assert_true(EVP_EncodeBlock((unsigned char *)out + p, raw, (int)n) > 0);
}

static int verify_vec(const struct sl_secret *s,
                      size_t n,
                      const char *id,
                      const char *ts,
                      const char *hdr,
                      const char *body,
                      int64_t now,
                      sl_err_t *err)
{
    return sl_verify(s, n, id, ts, hdr, (const uint8_t *)body, strlen(body), now,
                     SL_VERIFY_TOLERANCE_S, err);
}

/* ==== Signing ==== */

static void test_vector_sign(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    assert_int_equal(s.len, 24);
    sl_signer_t *sg = signer_of(&s, 1);
    assert_int_equal(sl_signer_count(sg), 1);
    char out[SL_SIGN_HEADER_MAX];
    sl_err_t err = {0};
    assert_int_equal(
        sl_signer_sign(sg, VEC_MSG_ID, VEC_TS, vec_body(), vec_len(), out, sizeof(out), &err), 0);
    assert_string_equal(out, VEC_SIG);
    sl_signer_destroy(sg);
    sl_secret_fini(&s);
}

static void test_vector_headers(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    sl_signer_t *sg = signer_of(&s, 1);
    struct sl_sign_headers h;
    assert_int_equal(sl_sign_headers(sg, VEC_MSG_ID, VEC_TS, vec_body(), vec_len(), &h, NULL), 0);
    assert_string_equal(h.id, "webhook-id: " VEC_MSG_ID);
    assert_string_equal(h.timestamp, "webhook-timestamp: " VEC_TS_STR);
    assert_string_equal(h.signature, "webhook-signature: " VEC_SIG);

    /* Failure leaves all three lines empty. */
    assert_int_equal(sl_sign_headers(sg, "bad.id", VEC_TS, vec_body(), vec_len(), &h, NULL),
                     SL_EINVAL);
    assert_string_equal(h.id, "");
    assert_string_equal(h.timestamp, "");
    assert_string_equal(h.signature, "");
    sl_signer_destroy(sg);
    sl_secret_fini(&s);
}

/* The streaming signer equals one-shot HMAC() over the concatenation, for random inputs. */
static void test_matches_oneshot_hmac(void **state)
{
    (void)state;
    static const size_t lens[] = {0, 1, 2, 3, 63, 64, 65, 1000, 65536};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        struct sl_secret s;
        random_secret(&s, SL_SECRET_MIN_BYTES + (k * 5) % (SL_SECRET_MAX_BYTES - 23));
        uint8_t *body = malloc(lens[k] + 1);
        assert_non_null(body);
        assert_int_equal(RAND_bytes(body, (int)lens[k] + 1), 1);
        sl_signer_t *sg = signer_of(&s, 1);
        char got[SL_SIGN_HEADER_MAX], want[SL_SIGN_ENTRY_LEN + 1];
        int64_t ts = 1700000000 + (int64_t)k;
        assert_int_equal(sl_signer_sign(sg, "evt_01HZX", ts, lens[k] ? body : NULL, lens[k], got,
                                        sizeof(got), NULL),
                         0);
        reference_entry(&s, "evt_01HZX", ts, body, lens[k], want);
        assert_string_equal(got, want);
        sl_signer_destroy(sg);
        free(body);
    }
}

static void test_rotation(void **state)
{
    (void)state;
    struct sl_secret s[3];
    random_secret(&s[0], 32);
    random_secret(&s[1], 48);
    random_secret(&s[2], 32);
    const char *body = "{\"event\":\"postback\",\"n\":1}";
    int64_t ts = 1700000123;
    sl_signer_t *both = signer_of(s, 2);
    assert_int_equal(sl_signer_count(both), 2);
    char hdr[SL_SIGN_HEADER_MAX];
    assert_int_equal(sl_signer_sign(both, "msg_rot", ts, (const uint8_t *)body, strlen(body), hdr,
                                    sizeof(hdr), NULL),
                     0);
    /* Two entries, in secret order, separated by one space. */
    char e0[SL_SIGN_ENTRY_LEN + 1], e1[SL_SIGN_ENTRY_LEN + 1], want[2 * SL_SIGN_ENTRY_LEN + 2];
    reference_entry(&s[0], "msg_rot", ts, (const uint8_t *)body, strlen(body), e0);
    reference_entry(&s[1], "msg_rot", ts, (const uint8_t *)body, strlen(body), e1);
    snprintf(want, sizeof(want), "%s %s", e0, e1);
    assert_string_equal(hdr, want);

    /* A receiver that knows either secret (or both) accepts; one that knows neither refuses. */
    assert_int_equal(verify_vec(&s[0], 1, "msg_rot", "1700000123", hdr, body, ts, NULL), 0);
    assert_int_equal(verify_vec(&s[1], 1, "msg_rot", "1700000123", hdr, body, ts, NULL), 0);
    assert_int_equal(verify_vec(s, 2, "msg_rot", "1700000123", hdr, body, ts, NULL), 0);
    assert_int_equal(verify_vec(&s[2], 1, "msg_rot", "1700000123", hdr, body, ts, NULL),
                     SL_ECRYPTO);
    /* Receiver holding [new, old] against a header with only the old entry. */
    struct sl_secret recv[2] = {s[2], s[1]};
    assert_int_equal(verify_vec(recv, 2, "msg_rot", "1700000123", e1, body, ts, NULL), 0);

    sl_signer_destroy(both);
    for (int i = 0; i < 3; i++)
        sl_secret_fini(&s[i]);
}

static void test_signer_limits(void **state)
{
    (void)state;
    struct sl_secret s[SL_SIGNER_MAX_SECRETS + 1];
    for (int i = 0; i <= SL_SIGNER_MAX_SECRETS; i++)
        random_secret(&s[i], 32);
    sl_signer_t *sg = NULL;
    sl_err_t err = {0};
    assert_int_equal(sl_signer_new(s, 0, &sg, &err), SL_EINVAL);
    assert_null(sg);
    assert_int_equal(sl_signer_new(NULL, 1, &sg, &err), SL_EINVAL);
    assert_int_equal(sl_signer_new(s, SL_SIGNER_MAX_SECRETS + 1, &sg, &err), SL_EINVAL);
    assert_null(sg);
    struct sl_secret bad = s[0];
    bad.len = SL_SECRET_MIN_BYTES - 1;
    assert_int_equal(sl_signer_new(&bad, 1, &sg, &err), SL_EINVAL);
    bad.len = SL_SECRET_MAX_BYTES + 1;
    assert_int_equal(sl_signer_new(&bad, 1, &sg, &err), SL_EINVAL);

    /* The maximum of HMAC secrets: 8 entries in their places; the exact need (NUL included)
     * is enough. */
    sg = signer_of(s, SL_SIGNER_MAX_SECRETS);
    char hdr[SL_SIGN_HEADER_MAX];
    const size_t need = SL_SIGNER_MAX_SECRETS * (SL_SIGN_ENTRY_LEN + 1);
    assert_int_equal(sl_signer_sign(sg, "m", 1, NULL, 0, hdr, need, &err), 0);
    assert_int_equal(strlen(hdr), need - 1);
    for (int i = 0; i < SL_SIGNER_MAX_SECRETS; i++) {
        char one[SL_SIGN_ENTRY_LEN + 1];
        reference_entry(&s[i], "m", 1, NULL, 0, one);
        assert_memory_equal(hdr + i * (SL_SIGN_ENTRY_LEN + 1), one, SL_SIGN_ENTRY_LEN);
    }
    /* One byte short: refused, and the output is empty rather than a partial list. */
    assert_int_equal(sl_signer_sign(sg, "m", 1, NULL, 0, hdr, need - 1, &err), SL_ETOOBIG);
    assert_string_equal(hdr, "");
    sl_signer_destroy(sg);

    /* 8 Ed25519 secrets, the longest header: they fill SL_SIGN_HEADER_MAX exactly. */
    struct sl_secret ed[SL_SIGNER_MAX_SECRETS];
    for (int i = 0; i < SL_SIGNER_MAX_SECRETS; i++)
        assert_int_equal(sl_secret_generate_ed25519(&ed[i], NULL), 0);
    sg = signer_of(ed, SL_SIGNER_MAX_SECRETS);
    assert_int_equal(sl_signer_sign(sg, "m", 1, NULL, 0, hdr, sizeof(hdr), &err), 0);
    assert_int_equal(strlen(hdr), SL_SIGN_HEADER_MAX - 1);
    for (int i = 0; i < SL_SIGNER_MAX_SECRETS; i++) {
        char one[SL_SIGN_V1A_ENTRY_LEN + 1];
        reference_v1a_entry(&ed[i], "m", 1, NULL, 0, one);
        assert_memory_equal(hdr + i * (SL_SIGN_V1A_ENTRY_LEN + 1), one, SL_SIGN_V1A_ENTRY_LEN);
    }
    assert_int_equal(sl_signer_sign(sg, "m", 1, NULL, 0, hdr, sizeof(hdr) - 1, &err), SL_ETOOBIG);
    assert_string_equal(hdr, "");
    sl_signer_destroy(sg);
    for (int i = 0; i < SL_SIGNER_MAX_SECRETS; i++)
        sl_secret_fini(&ed[i]);
    sl_signer_destroy(NULL);
}

static void test_sign_rejects_bad_input(void **state)
{
    (void)state;
    struct sl_secret s;
    random_secret(&s, 32);
    sl_signer_t *sg = signer_of(&s, 1);
    char out[SL_SIGN_HEADER_MAX];
    sl_err_t err = {0};
    char id[SL_SIGN_ID_MAX + 2];
    memset(id, 'a', sizeof(id));
    id[SL_SIGN_ID_MAX] = '\0';
    assert_int_equal(sl_signer_sign(sg, id, 1, NULL, 0, out, sizeof(out), &err), 0);
    id[SL_SIGN_ID_MAX] = 'a';
    id[SL_SIGN_ID_MAX + 1] = '\0';
    assert_int_equal(sl_signer_sign(sg, id, 1, NULL, 0, out, sizeof(out), &err), SL_EINVAL);
    assert_string_equal(out, "");

    static const char *const bad_ids[] = {
        "", "a.b", "a b", "a\r\nx-injected: 1", "caf\xc3\xa9", "tab\there"};
    for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
        snprintf(out, sizeof(out), "junk");
        assert_int_equal(sl_signer_sign(sg, bad_ids[i], 1, NULL, 0, out, sizeof(out), &err),
                         SL_EINVAL);
        assert_string_equal(out, "");
        assert_true(strlen(err.msg) > 0);
    }
    assert_int_equal(sl_signer_sign(sg, NULL, 1, NULL, 0, out, sizeof(out), &err), SL_EINVAL);
    assert_int_equal(sl_signer_sign(sg, "m", -1, NULL, 0, out, sizeof(out), &err), SL_EINVAL);
    assert_int_equal(sl_signer_sign(sg, "m", 1, NULL, 5, out, sizeof(out), &err), SL_EINVAL);
    /* INT64_MAX is a valid (if silly) timestamp and fits the header buffer. */
    struct sl_sign_headers h;
    assert_int_equal(sl_sign_headers(sg, "m", INT64_MAX, NULL, 0, &h, &err), 0);
    assert_string_equal(h.timestamp, "webhook-timestamp: 9223372036854775807");
    sl_signer_destroy(sg);
    sl_secret_fini(&s);
}

/* Several threads share one signer (the contract in sl_sign.h). */
struct thread_arg {
    sl_signer_t *sg;  /* shared */
    const char *want; /* expected header */
    int failures;     /* OUT */
};

static void *sign_thread(void *p)
{
    struct thread_arg *a = p;
    for (int i = 0; i < 2000; i++) {
        char out[SL_SIGN_HEADER_MAX];
        if (sl_signer_sign(a->sg, VEC_MSG_ID, VEC_TS, vec_body(), vec_len(), out, sizeof(out),
                           NULL) != 0 ||
            strcmp(out, a->want) != 0)
            a->failures++;
    }
    return NULL;
}

static void test_signer_shared_by_threads(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    sl_signer_t *sg = signer_of(&s, 1);
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){.sg = sg, .want = VEC_SIG, .failures = 0};
        assert_int_equal(pthread_create(&th[i], NULL, sign_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    sl_signer_destroy(sg);
    sl_secret_fini(&s);
}

/* ==== Secrets ==== */

static void test_secret_parse(void **state)
{
    (void)state;
    struct sl_secret s;
    sl_err_t err = {0};
    /* Unpadded base64 is accepted, like the official libraries do. */
    parse_ok(&s, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    struct sl_secret t;
    /* 32 bytes: padded and unpadded forms decode alike. */
    parse_ok(&t, "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=");
    assert_int_equal(t.len, 32);
    for (int i = 0; i < 32; i++)
        assert_int_equal(t.key[i], i);
    parse_ok(&t, "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8");
    assert_int_equal(t.len, 32);
    assert_int_equal(t.key[31], 31);

    struct {
        const char *in;
        int rc;
        const char *secret_part; /* must not appear in the message */
    } bad[] = {
        {NULL, SL_EMISSING, NULL},
        {"", SL_EMISSING, NULL},
        {"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", SL_EDECODE, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
        {"WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", SL_EDECODE, "MfKQ9r8GKYqrTwjUPD8IL"},
        {"whsec_", SL_EINVAL, NULL},
        {"whsec_not base64!", SL_EDECODE, "not base64"},
        {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS_", SL_EDECODE, "MfKQ9r8GKYqrTwjUPD8IL"},
        {"whsec_MfKQ9r8GKYqrTwjUPD8I LPZIo2LaLaSw", SL_EDECODE, "MfKQ9r8GKYqrTwjUPD8I"},
        {"whsec_c2hvcnQ=", SL_EINVAL, "c2hvcnQ"}, /* "short": 5 bytes */
        /* 23 bytes, padded and unpadded: one below the minimum */
        {"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRY=", SL_EINVAL, "AAECAwQFBgcICQoLDA0ODxAR"},
        {"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRY", SL_EINVAL, "AAECAwQFBgcICQoLDA0ODxAR"},
        /* non-canonical: unused trailing bits set */
        {"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYZ=", SL_EDECODE, "AAECAwQFBgcICQoLDA0ODxAR"},
        /* 66 bytes: over the maximum */
        {"whsec_"
         "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
         "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
         SL_ETOOBIG, "AAAAAAAAAAAAAAAA"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_err_clear(&err);
        memset(&s, 0xa5, sizeof(s));
        int rc = sl_secret_parse(&s, bad[i].in, &err);
        if (rc != bad[i].rc)
            fail_msg("case %zu: rc %d (%s), want %d", i, rc, err.msg, bad[i].rc);
        assert_int_equal(err.code, bad[i].rc);
        assert_true(strlen(err.msg) > 0);
        if (bad[i].secret_part)
            assert_null(strstr(err.msg, bad[i].secret_part));
        /* wiped on failure */
        assert_int_equal(s.len, 0);
        for (size_t k = 0; k < sizeof(s.key); k++)
            assert_int_equal(s.key[k], 0);
    }
    /* 64 bytes: the maximum is accepted. */
    char max[SL_SECRET_STR_MAX];
    struct sl_secret big;
    random_secret(&big, SL_SECRET_MAX_BYTES);
    assert_int_equal(sl_secret_format(&big, max, sizeof(max), NULL), 0);
    assert_int_equal(strlen(max), SL_SECRET_STR_MAX - 1);
    parse_ok(&t, max);
    assert_int_equal(t.len, SL_SECRET_MAX_BYTES);
    assert_memory_equal(t.key, big.key, SL_SECRET_MAX_BYTES);
}

static void test_secret_generate_format(void **state)
{
    (void)state;
    struct sl_secret a, b, back;
    assert_int_equal(sl_secret_generate(&a, NULL), 0);
    assert_int_equal(sl_secret_generate(&b, NULL), 0);
    assert_int_equal(a.len, SL_SECRET_GEN_BYTES);
    assert_memory_not_equal(a.key, b.key, SL_SECRET_GEN_BYTES);
    char str[SL_SECRET_STR_MAX];
    assert_int_equal(sl_secret_format(&a, str, sizeof(str), NULL), 0);
    assert_int_equal(strncmp(str, "whsec_", 6), 0);
    assert_int_equal(strlen(str), 6 + 44);
    parse_ok(&back, str);
    assert_int_equal(back.len, a.len);
    assert_memory_equal(back.key, a.key, a.len);
    /* Too small a buffer: refused, output empty. */
    assert_int_equal(sl_secret_format(&a, str, 50, NULL), SL_ETOOBIG);
    assert_string_equal(str, "");
    struct sl_secret bad = a;
    bad.len = 3;
    assert_int_equal(sl_secret_format(&bad, str, sizeof(str), NULL), SL_EINVAL);

    sl_secret_fini(&a);
    assert_int_equal(a.len, 0);
    for (size_t k = 0; k < sizeof(a.key); k++)
        assert_int_equal(a.key[k], 0);
    sl_secret_fini(NULL);
}

/* ==== Verification ==== */

static void test_vector_verify_and_tolerance(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    sl_err_t err = {0};
    const int64_t t = VEC_TS;
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t, &err), 0);
    /* Edges of the 5-minute window, both ways. */
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t + 300, &err),
                     0);
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t - 300, &err),
                     0);
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t + 301, &err),
                     SL_EDENIED);
    assert_non_null(strstr(err.msg, "too old"));
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t - 301, &err),
                     SL_EDENIED);
    assert_non_null(strstr(err.msg, "too new"));
    /* Custom tolerance, including zero. */
    assert_int_equal(
        sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len(), t + 10, 10, &err),
        0);
    assert_int_equal(
        sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len(), t + 11, 10, &err),
        SL_EDENIED);
    assert_int_equal(
        sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len(), t, 0, &err), 0);
    assert_int_equal(
        sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len(), t, -1, &err),
        SL_EINVAL);
    /* Clocks at the ends of int64: no overflow, the right direction. */
    assert_int_equal(
        verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, INT64_MAX, &err),
        SL_EDENIED);
    assert_non_null(strstr(err.msg, "too old"));
    assert_int_equal(
        verify_vec(&s, 1, VEC_MSG_ID, "9223372036854775807", VEC_SIG, VEC_PAYLOAD, INT64_MIN, &err),
        SL_EDENIED);
    assert_non_null(strstr(err.msg, "too new"));
    /* Leading zeros: canonicalised, as the official libraries parse the number. */
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, "0" VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t, &err),
                     0);
    sl_secret_fini(&s);
}

/* The official libraries' multi-signature case: other versions ignored, any v1 may match. */
static void test_vector_multi_signature(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    const char *hdr = VEC_OTHER_V1 " " VEC_OTHER_V2 " " VEC_SIG " " VEC_OTHER_V1;
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, hdr, VEC_PAYLOAD, VEC_TS, NULL), 0);
    /* Without the valid entry: refused. */
    sl_err_t err = {0};
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_OTHER_V1 " " VEC_OTHER_V2,
                                VEC_PAYLOAD, VEC_TS, &err),
                     SL_ECRYPTO);
    /* A correct MAC under another version label does not count. */
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR,
                                "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", VEC_PAYLOAD,
                                VEC_TS, &err),
                     SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "no v1"));
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR,
                                "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= " VEC_SIG,
                                VEC_PAYLOAD, VEC_TS, &err),
                     0);
    sl_secret_fini(&s);
}

static void test_tamper(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    sl_err_t err = {0};
    const int64_t t = VEC_TS;
    /* body: one changed digit, one extra byte, one byte less, empty */
    assert_int_equal(
        verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, "{\"test\": 2432232315}", t, &err),
        SL_ECRYPTO);
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD " ", t, &err),
                     SL_ECRYPTO);
    assert_int_equal(
        sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len() - 1, t, 300, &err),
        SL_ECRYPTO);
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, "", t, &err), SL_ECRYPTO);
    /* id */
    assert_int_equal(verify_vec(&s, 1, "msg_p5jXN8AQM9LWM0D4loKWxJel", VEC_TS_STR, VEC_SIG,
                                VEC_PAYLOAD, t, &err),
                     SL_ECRYPTO);
    /* timestamp (within tolerance, so only the MAC can catch it) */
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, "1614265331", VEC_SIG, VEC_PAYLOAD, t, &err),
                     SL_ECRYPTO);
    /* signature: last significant bit of the official negative case */
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR,
                                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=", VEC_PAYLOAD, t,
                                &err),
                     SL_ECRYPTO);
    /* wrong secret */
    struct sl_secret other;
    random_secret(&other, 24);
    assert_int_equal(verify_vec(&other, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, VEC_PAYLOAD, t, &err),
                     SL_ECRYPTO);
    /* Every single-bit flip of the body is caught. */
    char body[sizeof(VEC_PAYLOAD)];
    for (size_t i = 0; i < vec_len(); i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(body, VEC_PAYLOAD, sizeof(body));
            body[i] = (char)(body[i] ^ (1 << bit));
            assert_int_equal(sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG,
                                       (const uint8_t *)body, vec_len(), t, 300, NULL),
                             SL_ECRYPTO);
        }
    }
    sl_secret_fini(&s);
}

static void test_verify_malformed(void **state)
{
    (void)state;
    struct sl_secret s;
    parse_ok(&s, VEC_SECRET);
    sl_err_t err = {0};
    const int64_t t = VEC_TS;
    struct {
        const char *id, *ts, *hdr;
        int rc;
    } cases[] = {
        /* missing headers */
        {NULL, VEC_TS_STR, VEC_SIG, SL_EMISSING},
        {"", VEC_TS_STR, VEC_SIG, SL_EMISSING},
        {VEC_MSG_ID, NULL, VEC_SIG, SL_EMISSING},
        {VEC_MSG_ID, "", VEC_SIG, SL_EMISSING},
        {VEC_MSG_ID, VEC_TS_STR, NULL, SL_EMISSING},
        {VEC_MSG_ID, VEC_TS_STR, "", SL_EMISSING},
        /* timestamp not an integer */
        {VEC_MSG_ID, "hello", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, "1614265330.0", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, "-1614265330", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, "+1614265330", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, " 1614265330", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, "1614265330 ", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, "9223372036854775808", VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, "99999999999999999999", VEC_SIG, SL_EDECODE},
        /* id that could shift the id/timestamp boundary */
        {"msg.1614265330", "1614265330", VEC_SIG, SL_EDECODE},
        /* malformed lists */
        {VEC_MSG_ID, VEC_TS_STR, "v1", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, "v1,", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, ",g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, VEC_SIG ",x", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, VEC_SIG " ", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, " " VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, VEC_OTHER_V1 "  " VEC_SIG, SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, VEC_SIG " garbage", SL_EDECODE},
        /* v1 entries that are not canonical base64 */
        {VEC_MSG_ID, VEC_TS_STR, "v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE=", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, "v1,g0hM9SsE+O", SL_EDECODE}, /* trailing bits set */
        {VEC_MSG_ID, VEC_TS_STR, "v1,g0hM9SsE+", SL_EDECODE},  /* impossible length */
        {VEC_MSG_ID, VEC_TS_STR, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=AAAA", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE==", SL_EDECODE},
        {VEC_MSG_ID, VEC_TS_STR, "v1,dawfeoifkpqwoekfpqoekf", SL_EDECODE}, /* official case */
        /* valid base64 of the wrong length: cannot match (the official partial case) */
        {VEC_MSG_ID, VEC_TS_STR, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ", SL_ECRYPTO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_err_clear(&err);
        int rc = sl_verify(&s, 1, cases[i].id, cases[i].ts, cases[i].hdr, vec_body(), vec_len(), t,
                           300, &err);
        if (rc != cases[i].rc)
            fail_msg("case %zu: rc %s (%s), want %s", i, sl_err_name(rc), err.msg,
                     sl_err_name(cases[i].rc));
        assert_true(strlen(err.msg) > 0);
        /* messages never carry signature material */
        assert_null(strstr(err.msg, "g0hM9SsE"));
    }
    /* Bad arguments. */
    assert_int_equal(
        sl_verify(NULL, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len(), t, 300, &err),
        SL_EINVAL);
    assert_int_equal(
        sl_verify(&s, 0, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, vec_body(), vec_len(), t, 300, &err),
        SL_EINVAL);
    assert_int_equal(sl_verify(&s, 1, VEC_MSG_ID, VEC_TS_STR, VEC_SIG, NULL, 3, t, 300, &err),
                     SL_EINVAL);

    /* Largest accepted header: SL_VERIFY_MAX_ENTRIES entries, SL_VERIFY_HEADER_MAX bytes,
     * the valid entry first. */
    char *big = malloc(SL_VERIFY_HEADER_MAX + 2);
    assert_non_null(big);
    size_t o = (size_t)snprintf(big, SL_VERIFY_HEADER_MAX + 2, "%s", VEC_SIG);
    for (int i = 1; i < SL_VERIFY_MAX_ENTRIES; i++) {
        o += (size_t)snprintf(big + o, SL_VERIFY_HEADER_MAX + 2 - o, " v9,");
        size_t fill = i + 1 < SL_VERIFY_MAX_ENTRIES ? 60 : SL_VERIFY_HEADER_MAX - o;
        memset(big + o, 'A', fill);
        o += fill;
    }
    big[o] = '\0';
    assert_int_equal(o, SL_VERIFY_HEADER_MAX);
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, big, VEC_PAYLOAD, t, &err), 0);
    /* Over the entry limit. */
    o = (size_t)snprintf(big, SL_VERIFY_HEADER_MAX + 2, "%s", VEC_SIG);
    for (int i = 0; i < SL_VERIFY_MAX_ENTRIES; i++)
        o += (size_t)snprintf(big + o, SL_VERIFY_HEADER_MAX + 2 - o, " v9,A");
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, big, VEC_PAYLOAD, t, &err),
                     SL_EDECODE);
    /* Over the byte limit. */
    memset(big, 'A', SL_VERIFY_HEADER_MAX + 1);
    memcpy(big, "v1,", 3);
    big[SL_VERIFY_HEADER_MAX + 1] = '\0';
    assert_int_equal(verify_vec(&s, 1, VEC_MSG_ID, VEC_TS_STR, big, VEC_PAYLOAD, t, &err),
                     SL_ETOOBIG);
    free(big);
    sl_secret_fini(&s);
}

/* Round trip through our own signer for assorted ids, bodies and secret sets. */
static void test_sign_verify_roundtrip(void **state)
{
    (void)state;
    for (int round = 0; round < 40; round++) {
        size_t n = 1 + (size_t)round % 3;
        struct sl_secret s[3];
        for (size_t i = 0; i < n; i++)
            random_secret(&s[i], SL_SECRET_MIN_BYTES + (size_t)(round * 7 + (int)i) % 41);
        uint8_t body[300];
        size_t len = (size_t)round * 7;
        assert_int_equal(RAND_bytes(body, (int)sizeof(body)), 1);
        char id[32];
        snprintf(id, sizeof(id), "evt_%d_x-y:z", round);
        int64_t ts = 1700000000 + round;
        char ts_str[24];
        snprintf(ts_str, sizeof(ts_str), "%lld", (long long)ts);
        sl_signer_t *sg = signer_of(s, n);
        char hdr[SL_SIGN_HEADER_MAX];
        assert_int_equal(sl_signer_sign(sg, id, ts, body, len, hdr, sizeof(hdr), NULL), 0);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(sl_verify(&s[i], 1, id, ts_str, hdr, body, len, ts + 1, 300, NULL), 0);
        body[len / 2] ^= 0x40;
        assert_int_equal(sl_verify(s, n, id, ts_str, hdr, body, len ? len : 1, ts, 300, NULL),
                         SL_ECRYPTO);
        sl_signer_destroy(sg);
    }
}

/* ==== Ed25519 (v1a) ==== */

/* RFC 8032 section 7.1, TEST 1 (empty message) and TEST 2 (one byte 0x72). */
#define RFC1_SEED "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
#define RFC1_PUB  "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
#define RFC1_SIG                                                                                   \
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9" \
    "b"                                                                                            \
    "46bd25bf5f0595bbe24655141438e7a100b"
#define RFC2_SEED "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"
#define RFC2_PUB  "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
#define RFC2_SIG                                                                                   \
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f1" \
    "1"                                                                                            \
    "d8c387b2eaeb4302aeeb00d291612bb0c00"

/* The whsk_ form of an RFC 8032 key pair, parsed. */
static void rfc_secret(struct sl_secret *s, const char *seed_hex, const char *pub_hex)
{
    uint8_t raw[64];
    char str[SL_SECRET_STR_MAX];
    unhex(seed_hex, raw, 32);
    unhex(pub_hex, raw + 32, 32);
    prefixed_b64("whsk_", raw, 64, str);
    parse_ok(s, str);
    assert_int_equal(s->kind, SL_SECRET_ED25519);
    assert_int_equal(s->len, 64);
    assert_memory_equal(s->key, raw, 64);
}

/* The reference Ed25519 used below is right (RFC 8032 vectors), and our parser derives the
 * RFC's public key from the RFC's seed (else parsing would refuse the pair). */
static void test_ed25519_rfc8032(void **state)
{
    (void)state;
    static const struct {
        const char *seed, *pub, *sig;
        const uint8_t *msg;
        size_t len;
    } v[] = {
        {RFC1_SEED, RFC1_PUB, RFC1_SIG, (const uint8_t *)"", 0},
        {RFC2_SEED, RFC2_PUB, RFC2_SIG, (const uint8_t *)"\x72", 1},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        struct sl_secret s;
        rfc_secret(&s, v[i].seed, v[i].pub);
        uint8_t want[64], got[64];
        unhex(v[i].sig, want, 64);
        reference_ed25519(s.key, v[i].msg, v[i].len, got);
        assert_memory_equal(got, want, 64);
        /* the public key for receivers is the RFC's */
        char pk[SL_PUBKEY_STR_MAX], pk_want[SL_PUBKEY_STR_MAX + 8];
        assert_int_equal(sl_secret_public(&s, pk, sizeof(pk), NULL), 0);
        prefixed_b64("whpk_", s.key + 32, 32, pk_want);
        assert_string_equal(pk, pk_want);
        sl_secret_fini(&s);
    }
}

static void test_ed25519_generate_format_public(void **state)
{
    (void)state;
    struct sl_secret a, b, back;
    assert_int_equal(sl_secret_generate_ed25519(&a, NULL), 0);
    assert_int_equal(sl_secret_generate_ed25519(&b, NULL), 0);
    assert_int_equal(a.kind, SL_SECRET_ED25519);
    assert_int_equal(a.len, SL_ED25519_KEY_BYTES);
    assert_memory_not_equal(a.key, b.key, 32);
    /* the public half is the seed's */
    uint8_t seed_pub[32];
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, a.key, 32);
    size_t plen = 32;
    assert_non_null(k);
    assert_int_equal(EVP_PKEY_get_raw_public_key(k, seed_pub, &plen), 1);
    EVP_PKEY_free(k);
    assert_memory_equal(seed_pub, a.key + 32, 32);

    /* whsk_ + 88 characters; parses back to the same key and kind */
    char str[SL_SECRET_STR_MAX];
    assert_int_equal(sl_secret_format(&a, str, sizeof(str), NULL), 0);
    assert_int_equal(strncmp(str, "whsk_", 5), 0);
    assert_int_equal(strlen(str), 5 + 88);
    parse_ok(&back, str);
    assert_int_equal(back.kind, SL_SECRET_ED25519);
    assert_int_equal(back.len, 64);
    assert_memory_equal(back.key, a.key, 64);
    /* and unpadded, as for whsec_ */
    char unpadded[SL_SECRET_STR_MAX];
    snprintf(unpadded, sizeof(unpadded), "%.*s", (int)(strlen(str) - 2), str);
    assert_int_equal(str[strlen(str) - 1], '=');
    parse_ok(&back, unpadded);
    assert_memory_equal(back.key, a.key, 64);
    assert_int_equal(sl_secret_format(&a, str, 5 + 88, NULL), SL_ETOOBIG);
    assert_string_equal(str, "");

    /* whpk_ + base64 of the public half */
    char pk[SL_PUBKEY_STR_MAX];
    assert_int_equal(sl_secret_public(&a, pk, sizeof(pk), NULL), 0);
    assert_int_equal(strncmp(pk, "whpk_", 5), 0);
    assert_int_equal(strlen(pk), SL_PUBKEY_STR_MAX - 1);
    uint8_t dec[33];
    size_t dlen = 0;
    assert_int_equal(sl_b64_decode(pk + 5, strlen(pk) - 5, dec, sizeof(dec), &dlen), 0);
    assert_int_equal(dlen, 32);
    assert_memory_equal(dec, a.key + 32, 32);
    /* a public key is not a secret */
    sl_err_t err = {0};
    assert_int_equal(sl_secret_parse(&back, pk, &err), SL_EDECODE);
    assert_int_equal(sl_secret_public(&a, pk, sizeof(pk) - 1, &err), SL_ETOOBIG);
    assert_string_equal(pk, "");
    /* an HMAC secret has no public key */
    struct sl_secret h;
    assert_int_equal(sl_secret_generate(&h, NULL), 0);
    assert_int_equal(h.kind, SL_SECRET_HMAC);
    snprintf(pk, sizeof(pk), "junk");
    assert_int_equal(sl_secret_public(&h, pk, sizeof(pk), &err), SL_EINVAL);
    assert_string_equal(pk, "");
    /* an Ed25519 secret of the wrong length cannot be formatted */
    struct sl_secret bad = a;
    bad.len = 32;
    assert_int_equal(sl_secret_format(&bad, str, sizeof(str), NULL), SL_EINVAL);
    assert_int_equal(sl_secret_public(&bad, pk, sizeof(pk), NULL), SL_EINVAL);
    bad.kind = (enum sl_secret_kind)7;
    bad.len = 32;
    assert_int_equal(sl_secret_format(&bad, str, sizeof(str), NULL), SL_EINVAL);
    sl_secret_fini(&a);
    sl_secret_fini(&b);
    sl_secret_fini(&back);
    sl_secret_fini(&h);
}

static void test_ed25519_parse_refuses(void **state)
{
    (void)state;
    struct sl_secret a, s;
    assert_int_equal(sl_secret_generate_ed25519(&a, NULL), 0);
    char seed_b64[64];
    prefixed_b64("", a.key, 32, seed_b64);
    sl_err_t err = {0};
    char str[SL_SECRET_STR_MAX + 8];

    /* a public half that is not the seed's: every byte of it, one bit each */
    for (size_t i = 32; i < 64; i++) {
        uint8_t raw[64];
        memcpy(raw, a.key, 64);
        raw[i] ^= (uint8_t)(1u << (i % 8));
        prefixed_b64("whsk_", raw, 64, str);
        memset(&s, 0xa5, sizeof(s));
        assert_int_equal(sl_secret_parse(&s, str, &err), SL_EINVAL);
        assert_non_null(strstr(err.msg, "public half does not match"));
        assert_null(strstr(err.msg, seed_b64));
        assert_int_equal(s.len, 0);
        for (size_t k = 0; k < sizeof(s.key); k++)
            assert_int_equal(s.key[k], 0);
    }
    /* another key's public half */
    struct sl_secret b;
    assert_int_equal(sl_secret_generate_ed25519(&b, NULL), 0);
    uint8_t mixed[64];
    memcpy(mixed, a.key, 32);
    memcpy(mixed + 32, b.key + 32, 32);
    prefixed_b64("whsk_", mixed, 64, str);
    assert_int_equal(sl_secret_parse(&s, str, &err), SL_EINVAL);
    /* the signer refuses such a key built by hand, too */
    struct sl_secret hand = a;
    memcpy(hand.key + 32, b.key + 32, 32);
    sl_signer_t *sg = NULL;
    assert_int_equal(sl_signer_new(&hand, 1, &sg, &err), SL_EINVAL);
    assert_null(sg);
    assert_non_null(strstr(err.msg, "public half does not match"));
    hand.len = 63;
    assert_int_equal(sl_signer_new(&hand, 1, &sg, &err), SL_EINVAL);

    /* lengths: the seed alone, 48 and 63 bytes; 65 and 66 are over every maximum */
    static const size_t lens[] = {32, 48, 63};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        prefixed_b64("whsk_", a.key, lens[i], str);
        assert_int_equal(sl_secret_parse(&s, str, &err), SL_EINVAL);
        assert_null(strstr(err.msg, seed_b64));
    }
    uint8_t big[66];
    memset(big, 0x11, sizeof(big));
    memcpy(big, a.key, 64);
    prefixed_b64("whsk_", big, 65, str);
    assert_int_equal(sl_secret_parse(&s, str, &err), SL_ETOOBIG);
    prefixed_b64("whsk_", big, 66, str);
    assert_int_equal(sl_secret_parse(&s, str, &err), SL_ETOOBIG);
    assert_int_equal(sl_secret_parse(&s, "whsk_", &err), SL_EINVAL);
    assert_int_equal(sl_secret_parse(&s, "whsk_not base64!", &err), SL_EDECODE);
    assert_int_equal(sl_secret_parse(&s, "WHSK_AAAA", &err), SL_EDECODE);
    sl_secret_fini(&a);
    sl_secret_fini(&b);
    sl_secret_fini(&hand);
}

static void test_ed25519_sign_verify(void **state)
{
    (void)state;
    struct sl_secret k;
    rfc_secret(&k, RFC1_SEED, RFC1_PUB);
    const char *body = "{\"type\":\"invoice.paid\",\"amount\":1250}";
    const size_t len = strlen(body);
    const int64_t ts = 1700000321;
    sl_signer_t *sg = signer_of(&k, 1);
    char hdr[SL_SIGN_HEADER_MAX], want[SL_SIGN_V1A_ENTRY_LEN + 1];
    assert_int_equal(
        sl_signer_sign(sg, "msg_ed", ts, (const uint8_t *)body, len, hdr, sizeof(hdr), NULL), 0);
    reference_v1a_entry(&k, "msg_ed", ts, (const uint8_t *)body, len, want);
    assert_string_equal(hdr, want);
    assert_int_equal(strlen(hdr), SL_SIGN_V1A_ENTRY_LEN);
    /* deterministic (RFC 8032): the same input signs alike */
    char again[SL_SIGN_HEADER_MAX];
    assert_int_equal(
        sl_signer_sign(sg, "msg_ed", ts, (const uint8_t *)body, len, again, sizeof(again), NULL),
        0);
    assert_string_equal(again, hdr);
    struct sl_sign_headers h;
    assert_int_equal(sl_sign_headers(sg, "msg_ed", ts, (const uint8_t *)body, len, &h, NULL), 0);
    assert_int_equal(strncmp(h.signature, "webhook-signature: v1a,", 23), 0);
    assert_string_equal(h.signature + 19, hdr);
    /* empty body (a GET postback) */
    char empty[SL_SIGN_HEADER_MAX], empty_want[SL_SIGN_V1A_ENTRY_LEN + 1];
    assert_int_equal(sl_signer_sign(sg, "msg_ed", ts, NULL, 0, empty, sizeof(empty), NULL), 0);
    reference_v1a_entry(&k, "msg_ed", ts, NULL, 0, empty_want);
    assert_string_equal(empty, empty_want);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", empty, "", ts, NULL), 0);

    sl_err_t err = {0};
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", hdr, body, ts, &err), 0);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "01700000321", hdr, body, ts, &err), 0);
    /* any flipped byte of body, id, timestamp or signature is refused */
    char buf[SL_SIGN_HEADER_MAX];
    for (size_t i = 0; i < len; i++) {
        snprintf(buf, sizeof(buf), "%s", body);
        buf[i] ^= 0x01;
        assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", hdr, buf, ts, NULL), SL_ECRYPTO);
    }
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", hdr, "", ts, NULL), SL_ECRYPTO);
    for (size_t i = 0; i < strlen("msg_ed"); i++) {
        snprintf(buf, sizeof(buf), "msg_ed");
        buf[i] ^= 0x01;
        assert_int_equal(verify_vec(&k, 1, buf, "1700000321", hdr, body, ts, NULL), SL_ECRYPTO);
    }
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000320", hdr, body, ts, NULL), SL_ECRYPTO);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000322", hdr, body, ts, NULL), SL_ECRYPTO);
    /* each of the 64 signature bytes, flipped in the decoded form and re-encoded */
    uint8_t sig[64];
    size_t slen = 0;
    assert_int_equal(sl_b64_decode(hdr + 4, 88, sig, sizeof(sig), &slen), 0);
    assert_int_equal(slen, 64);
    for (size_t i = 0; i < 64; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            uint8_t t[64];
            memcpy(t, sig, 64);
            t[i] ^= (uint8_t)(1u << bit);
            prefixed_b64("v1a,", t, 64, buf);
            assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", buf, body, ts, &err),
                             SL_ECRYPTO);
            assert_null(strstr(err.msg, hdr + 4));
        }
    }
    /* malformed v1a entries: not base64 is malformed, like v1; wrong length cannot match */
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", "v1a,not_base64!", body, ts, &err),
                     SL_EDECODE);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", "v1a,AAAA-_", body, ts, &err),
                     SL_EDECODE);
    snprintf(buf, sizeof(buf), "%s", hdr);
    buf[strlen(buf) - 3] = '\0'; /* 85 characters: impossible length */
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", buf, body, ts, &err), SL_EDECODE);
    prefixed_b64("v1a,", sig, 63, buf);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", buf, body, ts, &err), SL_ECRYPTO);
    /* the same signature under another label does not count */
    snprintf(buf, sizeof(buf), "v1,%s", hdr + 4);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", buf, body, ts, &err), SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "no v1a entry"));
    snprintf(buf, sizeof(buf), "v1b,%s", hdr + 4);
    assert_int_equal(verify_vec(&k, 1, "msg_ed", "1700000321", buf, body, ts, &err), SL_ECRYPTO);
    /* an HMAC receiver ignores v1a entries; another Ed25519 key refuses */
    struct sl_secret hm, other;
    random_secret(&hm, 32);
    assert_int_equal(verify_vec(&hm, 1, "msg_ed", "1700000321", hdr, body, ts, &err), SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "no v1 entry"));
    assert_int_equal(sl_secret_generate_ed25519(&other, NULL), 0);
    assert_int_equal(verify_vec(&other, 1, "msg_ed", "1700000321", hdr, body, ts, &err),
                     SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "none of 1 v1a signature"));
    /* the receiver's set may hold the key among others, in any place */
    struct sl_secret set[3] = {other, hm, k};
    assert_int_equal(verify_vec(set, 3, "msg_ed", "1700000321", hdr, body, ts, &err), 0);
    /* a hand-built Ed25519 secret of the wrong length is a bad argument */
    struct sl_secret bad = k;
    bad.len = 32;
    assert_int_equal(verify_vec(&bad, 1, "msg_ed", "1700000321", hdr, body, ts, &err), SL_EINVAL);
    sl_signer_destroy(sg);
    sl_secret_fini(&k);
    sl_secret_fini(&other);
}

/* A signer with a whsec_ and a whsk_ secret: "v1,... v1a,...", in the secrets' order. */
static void test_mixed_signer(void **state)
{
    (void)state;
    struct sl_secret s[2], t[2], other_h, other_e;
    random_secret(&s[0], 32);
    assert_int_equal(sl_secret_generate_ed25519(&s[1], NULL), 0);
    const char *body = "{\"order\":42}";
    const size_t len = strlen(body);
    const int64_t ts = 1700000999;
    sl_signer_t *sg = signer_of(s, 2);
    assert_int_equal(sl_signer_count(sg), 2);
    char hdr[SL_SIGN_HEADER_MAX], e0[SL_SIGN_ENTRY_LEN + 1], e1[SL_SIGN_V1A_ENTRY_LEN + 1];
    char want[SL_SIGN_HEADER_MAX];
    assert_int_equal(
        sl_signer_sign(sg, "msg_mix", ts, (const uint8_t *)body, len, hdr, sizeof(hdr), NULL), 0);
    reference_entry(&s[0], "msg_mix", ts, (const uint8_t *)body, len, e0);
    reference_v1a_entry(&s[1], "msg_mix", ts, (const uint8_t *)body, len, e1);
    snprintf(want, sizeof(want), "%s %s", e0, e1);
    assert_string_equal(hdr, want);
    /* exactly enough room, and one byte less */
    const size_t need = SL_SIGN_ENTRY_LEN + 1 + SL_SIGN_V1A_ENTRY_LEN + 1;
    assert_int_equal(strlen(hdr) + 1, need);
    assert_int_equal(sl_signer_sign(sg, "msg_mix", ts, (const uint8_t *)body, len, hdr, need, NULL),
                     0);
    assert_int_equal(
        sl_signer_sign(sg, "msg_mix", ts, (const uint8_t *)body, len, hdr, need - 1, NULL),
        SL_ETOOBIG);
    assert_int_equal(
        sl_signer_sign(sg, "msg_mix", ts, (const uint8_t *)body, len, hdr, sizeof(hdr), NULL), 0);

    /* sl_verify accepts with either secret, or both; refuses with neither */
    const char *tss = "1700000999";
    assert_int_equal(verify_vec(&s[0], 1, "msg_mix", tss, hdr, body, ts, NULL), 0);
    assert_int_equal(verify_vec(&s[1], 1, "msg_mix", tss, hdr, body, ts, NULL), 0);
    assert_int_equal(verify_vec(s, 2, "msg_mix", tss, hdr, body, ts, NULL), 0);
    random_secret(&other_h, 32);
    assert_int_equal(sl_secret_generate_ed25519(&other_e, NULL), 0);
    struct sl_secret neither[2] = {other_e, other_h};
    sl_err_t err = {0};
    assert_int_equal(verify_vec(neither, 2, "msg_mix", tss, hdr, body, ts, &err), SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "none of 2 v1 or v1a signature"));
    /* each entry is its own secret's */
    assert_int_equal(verify_vec(&s[0], 1, "msg_mix", tss, e1, body, ts, NULL), SL_ECRYPTO);
    assert_int_equal(verify_vec(&s[1], 1, "msg_mix", tss, e0, body, ts, NULL), SL_ECRYPTO);
    assert_int_equal(verify_vec(&s[1], 1, "msg_mix", tss, e1, body, ts, NULL), 0);
    /* a flipped body byte breaks both */
    char b2[32];
    snprintf(b2, sizeof(b2), "%s", body);
    b2[3] ^= 0x20;
    assert_int_equal(verify_vec(s, 2, "msg_mix", tss, hdr, b2, ts, NULL), SL_ECRYPTO);
    sl_signer_destroy(sg);

    /* the other order gives the other order */
    t[0] = s[1];
    t[1] = s[0];
    sg = signer_of(t, 2);
    assert_int_equal(
        sl_signer_sign(sg, "msg_mix", ts, (const uint8_t *)body, len, hdr, sizeof(hdr), NULL), 0);
    snprintf(want, sizeof(want), "%s %s", e1, e0);
    assert_string_equal(hdr, want);
    sl_signer_destroy(sg);
    for (int i = 0; i < 2; i++)
        sl_secret_fini(&s[i]);
    sl_secret_fini(&other_h);
    sl_secret_fini(&other_e);
}

/* Threads share a mixed signer (the EVP_PKEY is read-only shared, one EVP_MD_CTX per sign). */
static void test_mixed_signer_shared_by_threads(void **state)
{
    (void)state;
    struct sl_secret s[3];
    parse_ok(&s[0], VEC_SECRET);
    rfc_secret(&s[1], RFC1_SEED, RFC1_PUB);
    rfc_secret(&s[2], RFC2_SEED, RFC2_PUB);
    sl_signer_t *sg = signer_of(s, 3);
    char want[SL_SIGN_HEADER_MAX];
    assert_int_equal(
        sl_signer_sign(sg, VEC_MSG_ID, VEC_TS, vec_body(), vec_len(), want, sizeof(want), NULL), 0);
    assert_int_equal(strncmp(want, VEC_SIG " v1a,", strlen(VEC_SIG) + 5), 0);
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){.sg = sg, .want = want, .failures = 0};
        assert_int_equal(pthread_create(&th[i], NULL, sign_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    sl_signer_destroy(sg);
    for (int i = 0; i < 3; i++)
        sl_secret_fini(&s[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_sign),
        cmocka_unit_test(test_vector_headers),
        cmocka_unit_test(test_vector_verify_and_tolerance),
        cmocka_unit_test(test_vector_multi_signature),
        cmocka_unit_test(test_matches_oneshot_hmac),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_signer_limits),
        cmocka_unit_test(test_sign_rejects_bad_input),
        cmocka_unit_test(test_signer_shared_by_threads),
        cmocka_unit_test(test_secret_parse),
        cmocka_unit_test(test_secret_generate_format),
        cmocka_unit_test(test_tamper),
        cmocka_unit_test(test_verify_malformed),
        cmocka_unit_test(test_sign_verify_roundtrip),
        cmocka_unit_test(test_ed25519_rfc8032),
        cmocka_unit_test(test_ed25519_generate_format_public),
        cmocka_unit_test(test_ed25519_parse_refuses),
        cmocka_unit_test(test_ed25519_sign_verify),
        cmocka_unit_test(test_mixed_signer),
        cmocka_unit_test(test_mixed_signer_shared_by_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
