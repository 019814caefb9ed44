/*
 * test_secretbox: master key parsing (one key and key rings), AES-256-GCM boxes and the record
 * MAC (common/sl_secretbox).
 *
 * The box layout (2 | id length | key id | nonce | ciphertext | tag, AD = endpoint id | 0 |
 * key id) is checked by decrypting with plain EVP calls in the test, independently of
 * sl_secretbox_open; a version 1 box (no key id, AD = endpoint id) is built the same way and
 * must still open.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "common/sl_secretbox.h"

/* 00 01 02 ... 1f */
#define KEY_HEX  "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define KEY_B64  "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
#define PLAIN    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define EP       "ep_01HZXK3V9"
#define KEY2_HEX "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
/* bytes a box made with a bare key ("default", 7 bytes) adds to its plaintext */
#define OVER (2 + 7 + SL_SECRETBOX_NONCE_LEN + SL_SECRETBOX_TAG_LEN)

static void key_ok(struct sl_masterkey *mk, const char *s)
{
    sl_err_t err = {0};
    if (sl_masterkey_parse(mk, s, &err) != 0)
        fail_msg("sl_masterkey_parse: %s", err.msg);
}

static void seal_ok(const struct sl_masterkey *mk,
                    const char *ep,
                    const char *plain,
                    uint8_t *box,
                    size_t cap,
                    size_t *boxlen)
{
    sl_err_t err = {0};
    if (sl_secretbox_seal(mk, ep, (const uint8_t *)plain, strlen(plain), box, cap, boxlen, &err) !=
        0)
        fail_msg("sl_secretbox_seal: %s", err.msg);
}

static void all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            fail_msg("byte %zu not wiped", i);
}

static void test_masterkey_parse_forms(void **state)
{
    (void)state;
    struct sl_masterkey a, b, c, d;
    key_ok(&a, KEY_HEX);
    assert_int_equal(a.n, 1);
    assert_string_equal(a.k[0].id, SL_MASTERKEY_ID_BARE);
    for (int i = 0; i < SL_MASTERKEY_LEN; i++)
        assert_int_equal(a.k[0].key[i], i);
    key_ok(&b, "000102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F");
    key_ok(&c, KEY_B64);
    key_ok(&d, "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"); /* unpadded */
    assert_memory_equal(a.k[0].key, b.k[0].key, SL_MASTERKEY_LEN);
    assert_memory_equal(a.k[0].key, c.k[0].key, SL_MASTERKEY_LEN);
    assert_memory_equal(a.k[0].key, d.k[0].key, SL_MASTERKEY_LEN);
    /* the record MAC key is derived, not the AES key itself */
    assert_memory_not_equal(a.k[0].key, a.k[0].mac, SL_MASTERKEY_LEN);
    assert_memory_equal(a.k[0].mac, c.k[0].mac, SL_MASTERKEY_LEN);
    sl_masterkey_fini(&a);
    all_zero((const uint8_t *)&a, sizeof(a));
    sl_masterkey_fini(NULL);
}

static void test_masterkey_parse_errors(void **state)
{
    (void)state;
    struct {
        const char *in;
        int rc;
    } bad[] = {
        {NULL, SL_EMISSING},
        {"", SL_EMISSING},
        /* 63 and 65 hex characters */
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1", SL_EINVAL},
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f0", SL_EINVAL},
        /* 64 characters, one not hex */
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1g", SL_EINVAL},
        /* whitespace: trailing newline (as from a file), leading space, inner tab */
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n", SL_EINVAL},
        {" AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", SL_EINVAL},
        {"AAECAwQFBgcICQoLDA0O\txAREhMUFRYXGBkaGxwdHh8=", SL_EINVAL},
        /* base64 of 31 and 33 bytes */
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg==", SL_EINVAL},
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g", SL_EINVAL},
        /* 44 characters, not base64 (url-safe alphabet) */
        {"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd_h8=", SL_EINVAL},
        {"short", SL_EINVAL},
        /* rings: empty entry, bad or long id, duplicate id or key, too many keys */
        {"k1:" KEY_HEX ",", SL_EINVAL},
        {"," KEY_HEX, SL_EINVAL},
        {":" KEY_HEX, SL_EINVAL},
        {"k.1:" KEY_HEX, SL_EINVAL},
        {"k1234567890123456:" KEY_HEX, SL_EINVAL},
        {"k1:" KEY_HEX ",k1:" KEY2_HEX, SL_EINVAL},
        {"k1:" KEY_HEX ",k2:" KEY_B64, SL_EINVAL},
        {KEY_HEX "," KEY2_HEX, SL_EINVAL},
        {"a:" KEY_HEX ",b:" KEY2_HEX ",c:" KEY_B64 ",d:" KEY_HEX ",e:" KEY2_HEX, SL_EINVAL},
        {"k1:" KEY_HEX ",k2:short", SL_EINVAL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sl_masterkey mk;
        sl_err_t err = {0};
        memset(&mk, 0x5a, sizeof(mk));
        int rc = sl_masterkey_parse(&mk, bad[i].in, &err);
        if (rc != bad[i].rc)
            fail_msg("case %zu: rc %s (%s)", i, sl_err_name(rc), err.msg);
        assert_true(strlen(err.msg) > 0);
        all_zero((const uint8_t *)&mk, sizeof(mk));
        /* the message never repeats key material */
        assert_null(strstr(err.msg, "0102030405"));
        assert_null(strstr(err.msg, "AAECAwQF"));
    }
    /* A very long value is reported without being read to its end or echoed. */
    char *huge = malloc(100001);
    assert_non_null(huge);
    memset(huge, 'a', 100000);
    huge[100000] = '\0';
    sl_err_t err = {0};
    struct sl_masterkey mk;
    assert_int_equal(sl_masterkey_parse(&mk, huge, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "longer than"));
    free(huge);
}

static void test_roundtrip_and_layout(void **state)
{
    (void)state;
    struct sl_masterkey mk;
    key_ok(&mk, KEY_HEX);
    uint8_t box[256], box2[256], out[256];
    size_t boxlen = 0, boxlen2 = 0, outlen = 0;
    seal_ok(&mk, EP, PLAIN, box, sizeof(box), &boxlen);
    assert_int_equal(boxlen, strlen(PLAIN) + OVER);
    assert_int_equal(box[0], SL_SECRETBOX_VERSION);
    assert_int_equal(box[1], 7);
    assert_memory_equal(box + 2, "default", 7);
    char kid[SL_MASTERKEY_ID_MAX + 1];
    assert_int_equal(sl_secretbox_kid(box, boxlen, kid), 0);
    assert_string_equal(kid, "default");
    /* The plaintext does not appear in the box. */
    assert_null(memmem(box, boxlen, "MfKQ9r8G", 8));

    sl_err_t err = {0};
    assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen, out, sizeof(out), &outlen, &err), 0);
    assert_int_equal(outlen, strlen(PLAIN));
    assert_memory_equal(out, PLAIN, outlen);

    /* Random nonces: sealing the same secret twice gives different boxes, both open. */
    seal_ok(&mk, EP, PLAIN, box2, sizeof(box2), &boxlen2);
    assert_int_equal(boxlen, boxlen2);
    assert_memory_not_equal(box + 9, box2 + 9, SL_SECRETBOX_NONCE_LEN);
    assert_int_equal(sl_secretbox_open(&mk, EP, box2, boxlen2, out, sizeof(out), &outlen, &err), 0);
    assert_memory_equal(out, PLAIN, outlen);

    /* Independent decryption with raw EVP: 2 | 7 | "default" | nonce | ct | tag,
     * AD = endpoint id | 0 | "default". */
    size_t ctlen = boxlen - OVER;
    const uint8_t *nonce = box + 9;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    assert_non_null(ctx);
    int l = 0;
    uint8_t plain[256];
    uint8_t tag[SL_SECRETBOX_TAG_LEN];
    memcpy(tag, nonce + SL_SECRETBOX_NONCE_LEN + ctlen, sizeof(tag));
    assert_int_equal(EVP_DecryptInit_ex2(ctx, EVP_aes_256_gcm(), mk.k[0].key, nonce, NULL), 1);
    static const char ad[] = EP "\0default";
    assert_int_equal(
        EVP_DecryptUpdate(ctx, NULL, &l, (const unsigned char *)ad, (int)sizeof(ad) - 1), 1);
    assert_int_equal(EVP_DecryptUpdate(ctx, plain, &l, nonce + SL_SECRETBOX_NONCE_LEN, (int)ctlen),
                     1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, sizeof(tag), tag), 1);
    assert_int_equal(EVP_DecryptFinal_ex(ctx, plain + l, &l), 1);
    EVP_CIPHER_CTX_free(ctx);
    assert_memory_equal(plain, PLAIN, ctlen);

    /* Empty plaintext is a valid box too. */
    assert_int_equal(sl_secretbox_seal(&mk, EP, NULL, 0, box, sizeof(box), &boxlen, &err), 0);
    assert_int_equal(boxlen, OVER);
    assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen, out, 0, &outlen, &err), 0);
    assert_int_equal(outlen, 0);
    sl_masterkey_fini(&mk);
}

static void test_wrong_key_and_endpoint(void **state)
{
    (void)state;
    struct sl_masterkey mk, other;
    key_ok(&mk, KEY_HEX);
    key_ok(&other, "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff");
    uint8_t box[256], out[256];
    size_t boxlen = 0, outlen = 99;
    seal_ok(&mk, EP, PLAIN, box, sizeof(box), &boxlen);
    sl_err_t err = {0};

    memset(out, 0x77, sizeof(out));
    assert_int_equal(sl_secretbox_open(&other, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_ECRYPTO);
    assert_string_equal(err.msg,
                        "could not decrypt secret for endpoint " EP ": authentication failed");
    assert_int_equal(outlen, 0);
    all_zero(out, sizeof(out)); /* no unauthenticated plaintext left behind */

    /* Moved to another endpoint (AD): refused, and the message names that endpoint. */
    memset(out, 0x77, sizeof(out));
    assert_int_equal(
        sl_secretbox_open(&mk, "ep_01HZXK3VA", box, boxlen, out, sizeof(out), &outlen, &err),
        SL_ECRYPTO);
    assert_string_equal(
        err.msg, "could not decrypt secret for endpoint ep_01HZXK3VA: authentication failed");
    all_zero(out, sizeof(out));
    /* A prefix of the id is a different AD too. */
    assert_int_equal(
        sl_secretbox_open(&mk, "ep_01HZXK3V", box, boxlen, out, sizeof(out), &outlen, &err),
        SL_ECRYPTO);
}

/* Whether box's key id (length byte 1, then that many bytes) is 1..16 id characters. */
static bool id_bytes(const uint8_t *box)
{
    if (box[1] == 0 || box[1] > SL_MASTERKEY_ID_MAX)
        return false;
    for (size_t i = 0; i < box[1]; i++) {
        uint8_t c = box[2 + i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

/*
 * A length byte that reaches past the id into a nonce starting with a NUL: read as a C string
 * that id is still "default", and an opener that trusted strlen over the length byte would
 * find the nonce where it was and open the box. The id must be refused as a whole.
 */
static void test_id_length_over_a_nul(void **state)
{
    (void)state;
    struct sl_masterkey mk;
    key_ok(&mk, KEY_B64); /* id "default": 7 bytes, nonce at 9 */
    uint8_t box[256], out[256];
    size_t boxlen = 0, outlen = 0;
    int tries = 0;
    do { /* a nonce whose first byte is 0: one seal in 256 on average */
        seal_ok(&mk, EP, PLAIN, box, sizeof(box), &boxlen);
    } while (box[2 + 7] != 0 && ++tries < 100000);
    assert_int_equal(box[2 + 7], 0);
    assert_int_equal(box[1], 7);
    box[1] = 15;
    char kid[SL_MASTERKEY_ID_MAX + 1] = "x";
    assert_int_equal(sl_secretbox_kid(box, boxlen, kid), SL_EDECODE);
    sl_err_t err = {0};
    assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_EDECODE);
    assert_string_equal(err.msg,
                        "cannot decrypt secret for endpoint " EP ": box has no valid key id");
    assert_int_equal(outlen, 0);
    sl_masterkey_fini(&mk);
}

static void test_tampered_every_byte(void **state)
{
    (void)state;
    struct sl_masterkey mk;
    key_ok(&mk, KEY_B64);
    uint8_t box[256], bad[256], out[256];
    size_t boxlen = 0, outlen = 0;
    seal_ok(&mk, EP, PLAIN, box, sizeof(box), &boxlen);
    for (size_t i = 0; i < boxlen; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(bad, box, boxlen);
            bad[i] ^= (uint8_t)(1u << bit);
            sl_err_t err = {0};
            int rc = sl_secretbox_open(&mk, EP, bad, boxlen, out, sizeof(out), &outlen, &err);
            /* byte 0 is the version: any change here is an unknown version; byte 1 the key
             * id's length and the id's bytes after it: a length past SL_MASTERKEY_ID_MAX, or
             * a byte that is not an id character (a changed one, or a nonce byte a longer
             * length reaches), is no key id at all; otherwise an id that is not configured */
            int want = i == 0                              ? SL_EVERSION
                       : i < 2u + box[1] && !id_bytes(bad) ? SL_EDECODE
                                                           : SL_ECRYPTO;
            if (rc != want)
                fail_msg("byte %zu bit %d: rc %s (%s)", i, bit, sl_err_name(rc), err.msg);
            assert_int_equal(outlen, 0);
            /* the secret never appears in a message */
            assert_null(strstr(err.msg, "MfKQ9r8G"));
        }
    }
}

static void test_truncated_and_version(void **state)
{
    (void)state;
    struct sl_masterkey mk;
    key_ok(&mk, KEY_HEX);
    uint8_t box[256], out[256];
    size_t boxlen = 0, outlen = 0;
    seal_ok(&mk, EP, PLAIN, box, sizeof(box), &boxlen);
    sl_err_t err = {0};
    /* Shorter than its format: not a box at all. */
    for (size_t n = 0; n < OVER; n++)
        assert_int_equal(sl_secretbox_open(&mk, EP, box, n, out, sizeof(out), &outlen, &err),
                         SL_EDECODE);
    assert_int_equal(sl_secretbox_open(&mk, EP, NULL, 0, out, sizeof(out), &outlen, &err),
                     SL_EDECODE);
    /* Any cut that still has room for the overhead misplaces the tag. */
    for (size_t n = OVER; n < boxlen; n++)
        assert_int_equal(sl_secretbox_open(&mk, EP, box, n, out, sizeof(out), &outlen, &err),
                         SL_ECRYPTO);
    /* Extra trailing byte: the tag is read from the wrong place. */
    box[boxlen] = 0;
    assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen + 1, out, sizeof(out), &outlen, &err),
                     SL_ECRYPTO);
    /* Versions other than 1 and 2 are refused before any decryption. */
    static const uint8_t versions[] = {0, 3, 0x81, 0xff};
    for (size_t i = 0; i < sizeof(versions); i++) {
        box[0] = versions[i];
        assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                         SL_EVERSION);
        assert_non_null(strstr(err.msg, "unsupported box version"));
        assert_non_null(strstr(err.msg, EP));
    }
}

static void test_limits_and_arguments(void **state)
{
    (void)state;
    struct sl_masterkey mk;
    key_ok(&mk, KEY_HEX);
    uint8_t box[256], out[256];
    size_t boxlen = 0, outlen = 0;
    sl_err_t err = {0};
    const uint8_t *p = (const uint8_t *)PLAIN;
    size_t n = strlen(PLAIN);
    /* Output buffers one byte short. */
    assert_int_equal(sl_secretbox_seal(&mk, EP, p, n, box, n + OVER - 1, &boxlen, &err),
                     SL_ETOOBIG);
    assert_int_equal(boxlen, 0);
    assert_int_equal(sl_secretbox_seal(&mk, EP, p, n, box, sizeof(box), &boxlen, &err), 0);
    assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen, out, n - 1, &outlen, &err),
                     SL_ETOOBIG);
    assert_int_equal(sl_secretbox_open(&mk, EP, box, boxlen, out, n, &outlen, &err), 0);
    /* Endpoint id: required, bounded. */
    assert_int_equal(sl_secretbox_seal(&mk, "", p, n, box, sizeof(box), &boxlen, &err), SL_EINVAL);
    assert_int_equal(sl_secretbox_seal(&mk, NULL, p, n, box, sizeof(box), &boxlen, &err),
                     SL_EINVAL);
    assert_int_equal(sl_secretbox_open(&mk, "", box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_EINVAL);
    char longid[SL_SECRETBOX_MAX_AD + 2];
    memset(longid, 'e', sizeof(longid));
    longid[SL_SECRETBOX_MAX_AD] = '\0';
    assert_int_equal(sl_secretbox_seal(&mk, longid, p, n, box, sizeof(box), &boxlen, &err), 0);
    assert_int_equal(sl_secretbox_open(&mk, longid, box, boxlen, out, sizeof(out), &outlen, &err),
                     0);
    longid[SL_SECRETBOX_MAX_AD] = 'e';
    longid[SL_SECRETBOX_MAX_AD + 1] = '\0';
    assert_int_equal(sl_secretbox_seal(&mk, longid, p, n, box, sizeof(box), &boxlen, &err),
                     SL_EINVAL);
    /* Plaintext size cap, and NULL with a length. */
    size_t big = SL_SECRETBOX_MAX_PLAIN + 1;
    uint8_t *in = calloc(1, big);
    uint8_t *bigbox = malloc(big + SL_SECRETBOX_OVERHEAD);
    uint8_t *bigout = malloc(big);
    assert_non_null(in);
    assert_non_null(bigbox);
    assert_non_null(bigout);
    assert_int_equal(
        sl_secretbox_seal(&mk, EP, in, big, bigbox, big + SL_SECRETBOX_OVERHEAD, &boxlen, &err),
        SL_ETOOBIG);
    assert_int_equal(
        sl_secretbox_seal(&mk, EP, in, big - 1, bigbox, big + SL_SECRETBOX_OVERHEAD, &boxlen, &err),
        0);
    assert_int_equal(sl_secretbox_open(&mk, EP, bigbox, boxlen, bigout, big, &outlen, &err), 0);
    assert_int_equal(outlen, big - 1);
    assert_memory_equal(bigout, in, big - 1);
    assert_int_equal(sl_secretbox_seal(&mk, EP, NULL, 4, box, sizeof(box), &boxlen, &err),
                     SL_EINVAL);
    free(in);
    free(bigbox);
    free(bigout);
}

/* A version 1 box (sealed before keys had ids) made with raw EVP: 1 | nonce | ct | tag. */
static size_t
seal_v1(const uint8_t key[SL_MASTERKEY_LEN], const char *ep, const char *plain, uint8_t *box)
{
    size_t n = strlen(plain);
    int l = 0;
    box[0] = 1;
    assert_int_equal(RAND_bytes(box + 1, SL_SECRETBOX_NONCE_LEN), 1);
    uint8_t *ct = box + 1 + SL_SECRETBOX_NONCE_LEN;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    assert_non_null(ctx);
    assert_int_equal(EVP_EncryptInit_ex2(ctx, EVP_aes_256_gcm(), key, box + 1, NULL), 1);
    assert_int_equal(EVP_EncryptUpdate(ctx, NULL, &l, (const unsigned char *)ep, (int)strlen(ep)),
                     1);
    assert_int_equal(EVP_EncryptUpdate(ctx, ct, &l, (const unsigned char *)plain, (int)n), 1);
    assert_int_equal(EVP_EncryptFinal_ex(ctx, ct + n, &l), 1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, SL_SECRETBOX_TAG_LEN, ct + n),
                     1);
    EVP_CIPHER_CTX_free(ctx);
    return 1 + SL_SECRETBOX_NONCE_LEN + n + SL_SECRETBOX_TAG_LEN;
}

static void test_key_ring_rotation(void **state)
{
    (void)state;
    struct sl_masterkey old, both, next;
    key_ok(&old, "k1:" KEY_HEX);
    key_ok(&both, "k2:" KEY2_HEX ",k1:" KEY_HEX);
    key_ok(&next, "k2:" KEY2_HEX);
    assert_int_equal(both.n, 2);
    assert_string_equal(both.k[0].id, "k2");
    assert_ptr_equal(sl_masterkey_find(&both, NULL), &both.k[0]);
    assert_ptr_equal(sl_masterkey_find(&both, "k1"), &both.k[1]);
    assert_null(sl_masterkey_find(&both, "k3"));
    /* the same key under the same id derives the same keys in any ring */
    assert_memory_equal(old.k[0].mac, both.k[1].mac, SL_MASTERKEY_LEN);

    uint8_t box[256], out[256];
    size_t boxlen = 0, outlen = 0;
    sl_err_t err = {0};
    char kid[SL_MASTERKEY_ID_MAX + 1];
    /* sealed with the old key: the overlap ring opens it, the new key alone names it */
    seal_ok(&old, EP, PLAIN, box, sizeof(box), &boxlen);
    assert_int_equal(sl_secretbox_kid(box, boxlen, kid), 0);
    assert_string_equal(kid, "k1");
    assert_int_equal(sl_secretbox_open(&both, EP, box, boxlen, out, sizeof(out), &outlen, &err), 0);
    assert_memory_equal(out, PLAIN, outlen);
    assert_int_equal(sl_secretbox_open(&next, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "sealed with master key 'k1', which is not configured"));
    /* the ring seals with its first key */
    seal_ok(&both, EP, PLAIN, box, sizeof(box), &boxlen);
    assert_int_equal(sl_secretbox_kid(box, boxlen, kid), 0);
    assert_string_equal(kid, "k2");
    assert_int_equal(sl_secretbox_open(&next, EP, box, boxlen, out, sizeof(out), &outlen, &err), 0);
    assert_int_equal(sl_secretbox_open(&old, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_ECRYPTO);
    /* a box whose id names a configured key but was sealed with another does not open */
    struct sl_masterkey liar;
    key_ok(&liar, "k2:" KEY_HEX);
    seal_ok(&liar, EP, PLAIN, box, sizeof(box), &boxlen);
    assert_int_equal(sl_secretbox_open(&both, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "authentication failed"));

    /* version 1 boxes: opened by whichever key of the ring fits */
    boxlen = seal_v1(old.k[0].key, EP, PLAIN, box);
    assert_int_equal(sl_secretbox_kid(box, boxlen, kid), 0);
    assert_string_equal(kid, "");
    assert_int_equal(sl_secretbox_open(&both, EP, box, boxlen, out, sizeof(out), &outlen, &err), 0);
    assert_memory_equal(out, PLAIN, outlen);
    assert_int_equal(sl_secretbox_open(&next, EP, box, boxlen, out, sizeof(out), &outlen, &err),
                     SL_ECRYPTO);
    assert_int_equal(
        sl_secretbox_open(&both, "ep_other", box, boxlen, out, sizeof(out), &outlen, &err),
        SL_ECRYPTO);
    sl_masterkey_fini(&old);
    sl_masterkey_fini(&both);
    sl_masterkey_fini(&next);
    sl_masterkey_fini(&liar);
}

static void test_record_mac(void **state)
{
    (void)state;
    struct sl_masterkey both, other;
    key_ok(&both, "k2:" KEY2_HEX ",k1:" KEY_HEX);
    key_ok(&other, "k1:" KEY2_HEX);
    uint8_t a[SL_RECORD_MAC_LEN], b[SL_RECORD_MAC_LEN], c[SL_RECORD_MAC_LEN];
    sl_err_t err = {0};
    const void *parts[] = {"sluice", "record"};
    size_t lens[] = {6, 6};
    const void *whole[] = {"sluicerecord"};
    size_t wlen[] = {12};
    assert_int_equal(sl_masterkey_mac(&both, NULL, parts, lens, 2, a, &err), 0);
    assert_int_equal(sl_masterkey_mac(&both, "k2", whole, wlen, 1, b, &err), 0);
    assert_memory_equal(a, b, sizeof(a)); /* the parts are one message; NULL = current */
    assert_int_equal(sl_masterkey_mac(&both, "k1", parts, lens, 2, c, &err), 0);
    assert_memory_not_equal(a, c, sizeof(a));
    /* the same id with another key gives another MAC */
    assert_int_equal(sl_masterkey_mac(&other, "k1", parts, lens, 2, b, &err), 0);
    assert_memory_not_equal(b, c, sizeof(b));
    lens[1] = 5;
    assert_int_equal(sl_masterkey_mac(&both, NULL, parts, lens, 2, b, &err), 0);
    assert_memory_not_equal(a, b, sizeof(a));
    assert_int_equal(sl_masterkey_mac(&both, "k9", parts, lens, 2, b, &err), SL_ECRYPTO);
    assert_string_equal(err.msg, "master key 'k9' is not configured");
    sl_masterkey_fini(&both);
    sl_masterkey_fini(&other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masterkey_parse_forms), cmocka_unit_test(test_masterkey_parse_errors),
        cmocka_unit_test(test_roundtrip_and_layout),  cmocka_unit_test(test_wrong_key_and_endpoint),
        cmocka_unit_test(test_tampered_every_byte),   cmocka_unit_test(test_id_length_over_a_nul),
        cmocka_unit_test(test_truncated_and_version), cmocka_unit_test(test_limits_and_arguments),
        cmocka_unit_test(test_key_ring_rotation),     cmocka_unit_test(test_record_mac),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
