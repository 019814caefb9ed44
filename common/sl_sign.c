/*
 * sl_sign: Standard Webhooks signing and verification (see sl_sign.h for the contract).
 *
 * The MAC input is "id.ts." (built on the stack: both are short and validated) followed by
 * the body, fed to HMAC-SHA256 in two updates so the body is never copied. Pure Ed25519
 * (v1a) hashes its message twice internally and so takes it in one piece (EVP_DigestSign
 * with no digest): "id.ts." + body is joined into one heap buffer, once per signature and
 * only by signers (and verifications) that involve an Ed25519 key. Verification
 * canonicalises the received timestamp (parsed as an integer and re-printed), exactly as the
 * official libraries do, so "0123" and "123" verify alike.
 *
 * An Ed25519 secret carries its public key next to the seed (Svix's whsk_ layout); every
 * place that takes one from outside (parse, signer) checks that the public half is the
 * seed's, so a receiver given that public key verifies what the signer produces.
 */
#include "common/sl_sign.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "common/sl_b64.h"
#include "common/sl_digest.h"
#include "common/sl_fmt.h"
#include "common/sl_mem.h"

/*
 * A keyed HMAC-SHA256 (RFC 2104): the SHA-256 states after the key's inner and outer pad
 * blocks. A signature copies each into the thread's context (sl_digest_ctx) and goes on from
 * there: two state copies per signature, where EVP_MAC_CTX_dup of a keyed HMAC context made
 * about fourteen allocations (bench/README.md, "Consumer CPU"). Only read after hmac_key_init,
 * so threads may share it.
 */
struct hmac_key {
    EVP_MD_CTX *inner; /* SHA-256 after (key ^ ipad), owned */
    EVP_MD_CTX *outer; /* SHA-256 after (key ^ opad), owned */
};

/* For each i < n exactly one of hmac[i] (HMAC secret) and pkey[i] (Ed25519 secret) is set. */
struct sl_signer {
    size_t n;     /* secrets, 1..SL_SIGNER_MAX_SECRETS */
    bool ed25519; /* some secret is Ed25519: signing joins the message */
    struct hmac_key hmac[SL_SIGNER_MAX_SECRETS]; /* keyed HMAC-SHA256 of HMAC secrets */
    EVP_PKEY *pkey[SL_SIGNER_MAX_SECRETS];       /* Ed25519 private keys, owned; only read after
                                                    sl_signer_new, so threads may share them */
};

/* "id." + "ts." : the part of the MAC input that precedes the body. */
#define PREFIX_MAX (SL_SIGN_ID_MAX + 1 + SL_SIGN_TS_MAX + 1)

/* ==== Secrets ==== */

int sl_secret_generate(struct sl_secret *s, sl_err_t *err)
{
    memset(s, 0, sizeof(*s)); /* kind = SL_SECRET_HMAC */
    if (RAND_bytes(s->key, SL_SECRET_GEN_BYTES) != 1) {
        sl_secret_wipe(s, sizeof(*s)); /* whatever it wrote before failing */
        return sl_err_set(err, SL_ECRYPTO, "could not generate secret: random generator failed");
    }
    s->len = SL_SECRET_GEN_BYTES;
    return 0;
}

/*
 * The Ed25519 key of a 32-byte seed: its public key into pub (SL_ED25519_PUB_BYTES) and, when
 * pkey is not NULL, the private key object into *pkey (caller frees). Returns 0 or
 * SL_ECRYPTO (nothing to free).
 */
static int ed25519_from_seed(const uint8_t *seed, uint8_t *pub, EVP_PKEY **pkey)
{
    size_t plen = SL_ED25519_PUB_BYTES;
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, SL_ED25519_SEED_BYTES);
    if (!k)
        return SL_ECRYPTO;
    if (EVP_PKEY_get_raw_public_key(k, pub, &plen) != 1 || plen != SL_ED25519_PUB_BYTES) {
        EVP_PKEY_free(k);
        return SL_ECRYPTO;
    }
    if (pkey)
        *pkey = k;
    else
        EVP_PKEY_free(k);
    return 0;
}

/*
 * Check that the public half of an Ed25519 secret (seed || public key) is its seed's. *pkey
 * as in ed25519_from_seed, set on 0 and on SL_EINVAL when pkey is not NULL. Returns 0,
 * SL_EINVAL (mismatch) or SL_ECRYPTO; err is not set: the callers word the message.
 */
static int ed25519_check(const struct sl_secret *s, EVP_PKEY **pkey)
{
    uint8_t pub[SL_ED25519_PUB_BYTES];
    if (ed25519_from_seed(s->key, pub, pkey) != 0)
        return SL_ECRYPTO;
    /* public data, but CRYPTO_memcmp costs nothing here */
    return CRYPTO_memcmp(pub, s->key + SL_ED25519_SEED_BYTES, sizeof(pub)) == 0 ? 0 : SL_EINVAL;
}

int sl_secret_generate_ed25519(struct sl_secret *s, sl_err_t *err)
{
    int rc = 0;
    size_t slen = SL_ED25519_SEED_BYTES, plen = SL_ED25519_PUB_BYTES;
    EVP_PKEY *k = NULL;
    memset(s, 0, sizeof(*s));
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
    if (!ctx || EVP_PKEY_keygen_init(ctx) != 1 || EVP_PKEY_keygen(ctx, &k) != 1 ||
        EVP_PKEY_get_raw_private_key(k, s->key, &slen) != 1 || slen != SL_ED25519_SEED_BYTES ||
        EVP_PKEY_get_raw_public_key(k, s->key + SL_ED25519_SEED_BYTES, &plen) != 1 ||
        plen != SL_ED25519_PUB_BYTES) {
        sl_secret_wipe(s, sizeof(*s));
        rc = sl_err_set(err, SL_ECRYPTO, "could not generate an ed25519 key: openssl failed");
        goto out;
    }
    s->len = SL_ED25519_KEY_BYTES;
    s->kind = SL_SECRET_ED25519;
out:
    EVP_PKEY_free(k); /* OpenSSL clears the private key it frees */
    EVP_PKEY_CTX_free(ctx);
    return rc;
}

int sl_secret_parse(struct sl_secret *s, const char *str, sl_err_t *err)
{
    int rc = 0;
    const char *pfx = NULL;
    memset(s, 0, sizeof(*s));
    if (!str || !*str) {
        rc = sl_err_set(err, SL_EMISSING, "secret is empty");
        goto out;
    }
    if (strncmp(str, SL_SECRET_PREFIX, SL_SECRET_PREFIX_LEN) == 0) {
        pfx = SL_SECRET_PREFIX;
        s->kind = SL_SECRET_HMAC;
    } else if (strncmp(str, SL_SECRET_ED25519_PREFIX, SL_SECRET_ED25519_PREFIX_LEN) == 0) {
        pfx = SL_SECRET_ED25519_PREFIX;
        s->kind = SL_SECRET_ED25519;
    } else {
        rc = sl_err_set(err, SL_EDECODE, "secret must start with \"%s\" or \"%s\"",
                        SL_SECRET_PREFIX, SL_SECRET_ED25519_PREFIX);
        goto out;
    }
    const char *b64 = str + strlen(pfx);
    /* Cap before decoding: 88 characters encode the 64-byte maximum. */
    size_t n = strnlen(b64, SL_B64_ENCODED_LEN(SL_SECRET_MAX_BYTES) + 1);
    if (n > SL_B64_ENCODED_LEN(SL_SECRET_MAX_BYTES)) {
        rc = sl_err_set(err, SL_ETOOBIG, "secret too long: at most %d bytes of key are allowed",
                        SL_SECRET_MAX_BYTES);
        goto out;
    }
    size_t len = 0;
    rc = sl_b64_decode(b64, n, s->key, sizeof(s->key), &len);
    if (rc == SL_ETOOBIG) {
        rc = sl_err_set(err, SL_ETOOBIG, "secret too long: at most %d bytes of key are allowed",
                        SL_SECRET_MAX_BYTES);
        goto out;
    }
    if (rc < 0) {
        rc = sl_err_set(err, SL_EDECODE, "secret is not valid base64 after \"%s\"", pfx);
        goto out;
    }
    if (s->kind == SL_SECRET_ED25519) {
        if (len != SL_ED25519_KEY_BYTES) {
            rc = sl_err_set(err, SL_EINVAL,
                            "ed25519 secret has %zu bytes of key, expected %d (seed and public "
                            "key)",
                            len, SL_ED25519_KEY_BYTES);
            goto out;
        }
        rc = ed25519_check(s, NULL);
        if (rc == SL_EINVAL)
            rc = sl_err_set(err, SL_EINVAL,
                            "ed25519 secret: public half does not match the public key of its "
                            "seed");
        else if (rc < 0)
            rc = sl_err_set(err, SL_ECRYPTO, "could not load the ed25519 secret: openssl failed");
        if (rc < 0)
            goto out;
    } else if (len < SL_SECRET_MIN_BYTES) {
        rc = sl_err_set(err, SL_EINVAL, "secret too short: %zu bytes of key, at least %d required",
                        len, SL_SECRET_MIN_BYTES);
        goto out;
    }
    s->len = len;
out:
    if (rc < 0)
        sl_secret_wipe(s, sizeof(*s));
    return rc;
}

/*
 * Is s a secret of a known kind with a length that kind allows? 0 or SL_EINVAL; messages
 * call it "secret" (i < 0) or "secret <i>".
 */
static int check_secret(const struct sl_secret *s, long i, sl_err_t *err)
{
    char what[32] = "secret";
    if (i >= 0)
        (void)snprintf(what, sizeof(what), "secret %ld", i);
    if (s->kind == SL_SECRET_ED25519) {
        if (s->len != SL_ED25519_KEY_BYTES)
            return sl_err_set(err, SL_EINVAL, "%s (ed25519) has %zu bytes of key, expected %d",
                              what, s->len, SL_ED25519_KEY_BYTES);
        return 0;
    }
    if (s->kind != SL_SECRET_HMAC)
        return sl_err_set(err, SL_EINVAL, "%s has an unknown kind %d", what, (int)s->kind);
    if (s->len < SL_SECRET_MIN_BYTES || s->len > SL_SECRET_MAX_BYTES)
        return sl_err_set(err, SL_EINVAL, "%s has %zu bytes of key, expected %d..%d", what, s->len,
                          SL_SECRET_MIN_BYTES, SL_SECRET_MAX_BYTES);
    return 0;
}

int sl_secret_format(const struct sl_secret *s, char *out, size_t outlen, sl_err_t *err)
{
    int rc = check_secret(s, -1, err);
    if (rc < 0)
        return rc;
    const char *pfx = s->kind == SL_SECRET_ED25519 ? SL_SECRET_ED25519_PREFIX : SL_SECRET_PREFIX;
    size_t plen = strlen(pfx);
    if (outlen < plen + SL_B64_ENCODED_LEN(s->len) + 1) {
        if (outlen)
            out[0] = '\0';
        return sl_err_set(err, SL_ETOOBIG, "secret buffer too small: %zu bytes", outlen);
    }
    memcpy(out, pfx, plen);
    long r = sl_b64_encode(s->key, s->len, out + plen, outlen - plen);
    if (r < 0) { /* cannot happen: the size was checked above */
        sl_secret_wipe(out, outlen);
        return sl_err_set(err, SL_ETOOBIG, "secret buffer too small: %zu bytes", outlen);
    }
    return 0;
}

int sl_secret_public(const struct sl_secret *s, char *out, size_t outlen, sl_err_t *err)
{
    if (outlen)
        out[0] = '\0';
    if (s->kind != SL_SECRET_ED25519 || s->len != SL_ED25519_KEY_BYTES)
        return sl_err_set(err, SL_EINVAL, "only an ed25519 (%s) secret has a public key",
                          SL_SECRET_ED25519_PREFIX);
    if (outlen < SL_PUBKEY_STR_MAX)
        return sl_err_set(err, SL_ETOOBIG, "public key buffer too small: %zu bytes", outlen);
    memcpy(out, SL_PUBKEY_PREFIX, SL_PUBKEY_PREFIX_LEN);
    if (sl_b64_encode(s->key + SL_ED25519_SEED_BYTES, SL_ED25519_PUB_BYTES,
                      out + SL_PUBKEY_PREFIX_LEN, outlen - SL_PUBKEY_PREFIX_LEN) < 0) {
        out[0] = '\0'; /* cannot happen: the size was checked above */
        return sl_err_set(err, SL_ETOOBIG, "public key buffer too small: %zu bytes", outlen);
    }
    return 0;
}

void sl_secret_fini(struct sl_secret *s)
{
    if (s)
        sl_secret_wipe(s, sizeof(*s));
}

/* ==== HMAC helpers ==== */

/* A new HMAC-SHA256 context keyed with key/len. Returns NULL on OpenSSL failure. */
static EVP_MAC_CTX *keyed_ctx(EVP_MAC *mac, const uint8_t *key, size_t len)
{
    static char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    if (!ctx)
        return NULL;
    if (EVP_MAC_init(ctx, key, len, params) != 1) {
        EVP_MAC_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

#define HMAC_BLOCK 64 /* SHA-256's block, the length of HMAC's pads */

static void hmac_key_fini(struct hmac_key *k)
{
    EVP_MD_CTX_free(k->inner);
    EVP_MD_CTX_free(k->outer);
    k->inner = k->outer = NULL;
}

/* k = SHA-256 after one block of (key ^ pad); NULL on OpenSSL failure. */
static EVP_MD_CTX *padded_state(const uint8_t block[HMAC_BLOCK], uint8_t pad)
{
    uint8_t p[HMAC_BLOCK];
    for (size_t i = 0; i < HMAC_BLOCK; i++)
        p[i] = block[i] ^ pad;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    const EVP_MD *md = sl_digest_md(SL_SHA256);
    bool ok =
        c && md && EVP_DigestInit_ex(c, md, NULL) == 1 && EVP_DigestUpdate(c, p, sizeof(p)) == 1;
    OPENSSL_cleanse(p, sizeof(p));
    if (!ok) {
        EVP_MD_CTX_free(c);
        return NULL;
    }
    return c;
}

/* Key k with key/len. RFC 2104 hashes a key longer than the block first; no secret is
 * (static assertion below), so the key is the block's start. Returns 0 or SL_ECRYPTO (k left
 * empty). */
_Static_assert(SL_SECRET_MAX_BYTES <= HMAC_BLOCK, "an HMAC secret fits in one SHA-256 block");
static int hmac_key_init(struct hmac_key *k, const uint8_t *key, size_t len)
{
    uint8_t block[HMAC_BLOCK] = {0};
    if (len > HMAC_BLOCK)
        return SL_ECRYPTO;
    if (len)
        memcpy(block, key, len);
    k->inner = padded_state(block, 0x36);
    k->outer = padded_state(block, 0x5c);
    OPENSSL_cleanse(block, sizeof(block));
    if (!k->inner || !k->outer) {
        hmac_key_fini(k);
        return SL_ECRYPTO;
    }
    return 0;
}

/* HMAC of prefix + body under k, in the thread's context. Returns 0 or SL_ECRYPTO. */
static int hmac_with(const struct hmac_key *k,
                     const char *prefix,
                     size_t plen,
                     const uint8_t *body,
                     size_t len,
                     uint8_t mac[SL_SIGN_MAC_LEN])
{
    uint8_t ih[SL_SIGN_MAC_LEN];
    unsigned il = 0, ol = 0;
    EVP_MD_CTX *c = sl_digest_ctx();
    bool ok = c && EVP_MD_CTX_copy_ex(c, k->inner) == 1 && EVP_DigestUpdate(c, prefix, plen) == 1 &&
              (len == 0 || EVP_DigestUpdate(c, body, len) == 1) &&
              EVP_DigestFinal_ex(c, ih, &il) == 1 && il == sizeof(ih) &&
              EVP_MD_CTX_copy_ex(c, k->outer) == 1 && EVP_DigestUpdate(c, ih, il) == 1 &&
              EVP_DigestFinal_ex(c, mac, &ol) == 1 && ol == SL_SIGN_MAC_LEN;
    OPENSSL_cleanse(ih, sizeof(ih));
    return ok ? 0 : SL_ECRYPTO;
}

/* MAC of prefix + body in ctx, a freshly keyed EVP_MAC context (OpenSSL's own HMAC, which
 * verification uses: signing and verifying share no HMAC code, so each checks the other in
 * the tests). Returns 0 or SL_ECRYPTO. */
static int mac_in(EVP_MAC_CTX *ctx,
                  const char *prefix,
                  size_t plen,
                  const uint8_t *body,
                  size_t len,
                  uint8_t mac[SL_SIGN_MAC_LEN])
{
    size_t outl = 0;
    bool ok = EVP_MAC_update(ctx, (const unsigned char *)prefix, plen) == 1 &&
              (len == 0 || EVP_MAC_update(ctx, body, len) == 1) &&
              EVP_MAC_final(ctx, mac, &outl, SL_SIGN_MAC_LEN) == 1 && outl == SL_SIGN_MAC_LEN;
    return ok ? 0 : SL_ECRYPTO;
}

/* ==== Ed25519 helpers ==== */

/*
 * prefix || body in one new buffer of *mlen (OUT) bytes; the caller frees it. Pure Ed25519
 * needs the whole message at once. plen + len cannot overflow: the body is in memory and the
 * prefix is at most PREFIX_MAX bytes.
 */
static uint8_t *
join_message(const char *prefix, size_t plen, const uint8_t *body, size_t len, size_t *mlen)
{
    uint8_t *msg = sl_xmalloc(plen + len);
    memcpy(msg, prefix, plen);
    if (len)
        memcpy(msg + plen, body, len);
    *mlen = plen + len;
    return msg;
}

/*
 * Ed25519 signature of msg/mlen with pkey. Only reads pkey (each call has its own
 * EVP_MD_CTX), which is why one signer can sign on several threads at once. Returns 0 or
 * SL_ECRYPTO.
 */
static int ed25519_sign(EVP_PKEY *pkey, const uint8_t *msg, size_t mlen, uint8_t *sig)
{
    int rc = SL_ECRYPTO;
    size_t slen = SL_SIGN_ED25519_LEN;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md)
        goto out;
    /* NULL digest: pure Ed25519 (RFC 8032), which hashes the message itself */
    if (EVP_DigestSignInit(md, NULL, NULL, NULL, pkey) != 1)
        goto out;
    if (EVP_DigestSign(md, sig, &slen, msg, mlen) != 1 || slen != SL_SIGN_ED25519_LEN)
        goto out;
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    return rc;
}

/* Does sig (SL_SIGN_ED25519_LEN bytes) verify msg/mlen under public key pub? */
static bool ed25519_verify(EVP_PKEY *pub, const uint8_t *sig, const uint8_t *msg, size_t mlen)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool ok = md && EVP_DigestVerifyInit(md, NULL, NULL, NULL, pub) == 1 &&
              EVP_DigestVerify(md, sig, SL_SIGN_ED25519_LEN, msg, mlen) == 1;
    EVP_MD_CTX_free(md);
    return ok;
}

/* ==== Signer ==== */

/* A message id is 1..SL_SIGN_ID_MAX printable ASCII characters without '.'. */
static int check_msg_id(const char *msg_id, int code, sl_err_t *err)
{
    size_t n = strnlen(msg_id, SL_SIGN_ID_MAX + 1);
    if (n == 0)
        return sl_err_set(err, code, "message id is empty");
    if (n > SL_SIGN_ID_MAX)
        return sl_err_set(err, code, "message id too long: at most %d bytes", SL_SIGN_ID_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)msg_id[i];
        if (c == '.')
            return sl_err_set(err, code, "message id must not contain '.' (offset %zu)", i);
        if (c < 0x21 || c > 0x7e)
            return sl_err_set(err, code,
                              "message id must be printable ascii without spaces (offset %zu)", i);
    }
    return 0;
}

/* Write "id.ts." into buf (PREFIX_MAX bytes); returns its length. Inputs already checked. */
static size_t build_prefix(char *buf, const char *msg_id, int64_t ts)
{
    struct sl_fmt f;
    sl_fmt_init(&f, buf, PREFIX_MAX);
    sl_fmt_str(&f, msg_id);
    sl_fmt_mem(&f, ".", 1);
    sl_fmt_i64(&f, ts);
    sl_fmt_mem(&f, ".", 1);
    int n = sl_fmt_end(&f);
    return n > 0 ? (size_t)n : 0;
}

/* Append "<ver>,<base64 of raw/n>" at out + *o (space checked by the caller). */
static int
append_entry(char *out, size_t outlen, size_t *o, const char *ver, const uint8_t *raw, size_t n)
{
    size_t vl = strlen(ver);
    memcpy(out + *o, ver, vl); /* NOLINT(bugprone-not-null-terminated-result): length-counted */
    out[*o + vl] = ',';
    *o += vl + 1;
    long b = sl_b64_encode(raw, n, out + *o, outlen - *o);
    if (b < 0)
        return SL_ETOOBIG;
    *o += (size_t)b;
    return 0;
}

int sl_signer_new(const struct sl_secret *secrets, size_t n, sl_signer_t **out, sl_err_t *err)
{
    int rc = 0;
    sl_signer_t *sg = NULL;
    *out = NULL;
    if (!secrets || n == 0 || n > SL_SIGNER_MAX_SECRETS) {
        rc = sl_err_set(err, SL_EINVAL, "signer needs 1..%d secrets, got %zu",
                        SL_SIGNER_MAX_SECRETS, secrets ? n : 0);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        rc = check_secret(&secrets[i], (long)i, err);
        if (rc < 0)
            goto out;
    }
    sg = sl_xcalloc(1, sizeof(*sg));
    for (size_t i = 0; i < n; i++) {
        if (secrets[i].kind == SL_SECRET_ED25519) {
            rc = ed25519_check(&secrets[i], &sg->pkey[i]);
            if (rc == SL_EINVAL) {
                rc = sl_err_set(err, SL_EINVAL,
                                "secret %zu (ed25519): public half does not match the public "
                                "key of its seed",
                                i);
                goto out;
            }
            if (rc < 0) {
                rc = sl_err_set(err, SL_ECRYPTO, "could not load the ed25519 key of secret %zu", i);
                goto out;
            }
            sg->ed25519 = true;
        } else if (hmac_key_init(&sg->hmac[i], secrets[i].key, secrets[i].len) < 0) {
            rc = sl_err_set(err, SL_ECRYPTO, "could not key hmac-sha256 context for secret %zu", i);
            goto out;
        }
        sg->n = i + 1;
    }
    *out = sg;
    sg = NULL;
out:
    sl_signer_destroy(sg);
    return rc;
}

void sl_signer_destroy(sl_signer_t *sg)
{
    if (!sg)
        return;
    for (size_t i = 0; i < SL_SIGNER_MAX_SECRETS; i++) {
        hmac_key_fini(&sg->hmac[i]);
        EVP_PKEY_free(sg->pkey[i]);
    }
    free(sg);
}

size_t sl_signer_count(const sl_signer_t *sg)
{
    return sg->n;
}

int sl_signer_sign(const sl_signer_t *sg,
                   const char *msg_id,
                   int64_t timestamp_s,
                   const uint8_t *body,
                   size_t len,
                   char *out,
                   size_t outlen,
                   sl_err_t *err)
{
    int rc = 0;
    char prefix[PREFIX_MAX];
    uint8_t *msg = NULL; /* "id.ts." + body, only for Ed25519 */
    size_t mlen = 0;
    if (outlen)
        out[0] = '\0';
    if (!msg_id) {
        rc = sl_err_set(err, SL_EINVAL, "message id is missing");
        goto out;
    }
    rc = check_msg_id(msg_id, SL_EINVAL, err);
    if (rc < 0)
        goto out;
    if (timestamp_s < 0) {
        rc = sl_err_set(err, SL_EINVAL, "timestamp must not be negative");
        goto out;
    }
    if (!body && len) {
        rc = sl_err_set(err, SL_EINVAL, "body is NULL with length %zu", len);
        goto out;
    }
    size_t need = 0; /* entries, separators, NUL */
    for (size_t i = 0; i < sg->n; i++)
        need += (sg->pkey[i] ? SL_SIGN_V1A_ENTRY_LEN : SL_SIGN_ENTRY_LEN) + 1;
    if (outlen < need) {
        rc = sl_err_set(err, SL_ETOOBIG, "signature buffer too small: %zu bytes, %zu needed",
                        outlen, need);
        goto out;
    }
    size_t plen = build_prefix(prefix, msg_id, timestamp_s);
    if (sg->ed25519)
        msg = join_message(prefix, plen, body, len, &mlen);
    size_t o = 0;
    for (size_t i = 0; i < sg->n; i++) {
        if (i)
            out[o++] = ' ';
        if (sg->pkey[i]) {
            uint8_t sig[SL_SIGN_ED25519_LEN];
            if (ed25519_sign(sg->pkey[i], msg, mlen, sig) < 0) {
                rc = sl_err_set(err, SL_ECRYPTO,
                                "could not compute ed25519 signature for secret %zu", i);
                goto out;
            }
            rc = append_entry(out, outlen, &o, "v1a", sig, sizeof(sig));
        } else {
            uint8_t mac[SL_SIGN_MAC_LEN];
            if (hmac_with(&sg->hmac[i], prefix, plen, body, len, mac) < 0) {
                rc = sl_err_set(err, SL_ECRYPTO, "could not compute hmac-sha256 for secret %zu", i);
                goto out;
            }
            rc = append_entry(out, outlen, &o, "v1", mac, sizeof(mac));
        }
        if (rc < 0) { /* cannot happen: need was checked */
            rc = sl_err_set(err, SL_ETOOBIG, "signature buffer too small: %zu bytes", outlen);
            goto out;
        }
    }
out:
    free(msg);
    if (rc < 0 && outlen)
        out[0] = '\0';
    return rc;
}

int sl_sign_headers(const sl_signer_t *sg,
                    const char *msg_id,
                    int64_t timestamp_s,
                    const uint8_t *body,
                    size_t len,
                    struct sl_sign_headers *out,
                    sl_err_t *err)
{
    static const char sig_name[] = "webhook-signature: ";
    const size_t sig_name_len = sizeof(sig_name) - 1;
    out->id[0] = out->timestamp[0] = out->signature[0] = '\0';

    memcpy(out->signature, sig_name, sig_name_len);
    int rc = sl_signer_sign(sg, msg_id, timestamp_s, body, len, out->signature + sig_name_len,
                            sizeof(out->signature) - sig_name_len, err);
    if (rc < 0) {
        out->signature[0] = '\0';
        return rc;
    }
    /* msg_id and timestamp were validated by sl_signer_sign, so both lines fit. */
    struct sl_fmt f;
    sl_fmt_init(&f, out->id, sizeof(out->id));
    sl_fmt_str(&f, "webhook-id: ");
    sl_fmt_str(&f, msg_id);
    (void)sl_fmt_end(&f);
    sl_fmt_init(&f, out->timestamp, sizeof(out->timestamp));
    sl_fmt_str(&f, "webhook-timestamp: ");
    sl_fmt_i64(&f, timestamp_s);
    (void)sl_fmt_end(&f);
    return 0;
}

/* ==== Verification ==== */

/* Parse a non-negative decimal int64 made of digits only. Returns 0 or SL_EDECODE. */
static int parse_timestamp(const char *s, int64_t *out)
{
    uint64_t v = 0; /* 19 digits stay below 10^19 < 2^64: no wrap-around */
    size_t i = 0;
    for (; s[i]; i++) {
        if (s[i] < '0' || s[i] > '9' || i >= 19)
            return SL_EDECODE;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (i == 0 || v > (uint64_t)INT64_MAX)
        return SL_EDECODE;
    *out = (int64_t)v;
    return 0;
}

/* Signature schemes of a webhook-signature entry. */
enum sig_ver {
    VER_OTHER, /* a version we do not check (future versions): ignored */
    VER_V1,    /* "v1": HMAC-SHA256 */
    VER_V1A,   /* "v1a": Ed25519 */
};

/* One parsed entry of the webhook-signature list. */
struct sig_entry {
    enum sig_ver ver;                 /* exactly "v1", exactly "v1a", or another version */
    bool usable;                      /* v1/v1a and decodes to its scheme's length */
    uint8_t sig[SL_SIGN_ED25519_LEN]; /* decoded signature when usable (v1: first 32 bytes) */
};

/*
 * Parse one entry of n bytes at p. The list is checked strictly (as the official libraries
 * do): each entry is "<version>,<sig>" with both parts non-empty and exactly one comma, and
 * a v1 or v1a signature is canonical base64. Returns 0 or SL_EDECODE.
 */
static int parse_entry(const char *p, size_t n, struct sig_entry *e)
{
    const char *comma = memchr(p, ',', n);
    if (!comma || comma == p || comma == p + n - 1)
        return SL_EDECODE;
    const char *sig = comma + 1;
    size_t sig_len = (size_t)(p + n - sig);
    if (memchr(sig, ',', sig_len))
        return SL_EDECODE;
    size_t vlen = (size_t)(comma - p);
    e->ver = vlen == 2 && memcmp(p, "v1", 2) == 0    ? VER_V1
             : vlen == 3 && memcmp(p, "v1a", 3) == 0 ? VER_V1A
                                                     : VER_OTHER;
    e->usable = false;
    if (e->ver == VER_OTHER)
        return 0; /* future versions are not ours to check */
    uint8_t got[SL_B64_DECODED_MAX(SL_VERIFY_HEADER_MAX)];
    size_t glen = 0;
    if (sl_b64_decode(sig, sig_len, got, sizeof(got), &glen) < 0)
        return SL_EDECODE;
    /* Another length cannot match: CRYPTO_memcmp only compares equal lengths, and an
     * Ed25519 signature is exactly 64 bytes. */
    size_t want = e->ver == VER_V1 ? SL_SIGN_MAC_LEN : SL_SIGN_ED25519_LEN;
    e->usable = glen == want;
    if (e->usable)
        memcpy(e->sig, got, want);
    return 0;
}

/* Split the space-separated list (single spaces, no empty entries) into entries[]. */
static int parse_sig_list(const char *hdr, struct sig_entry *entries, size_t *nent, sl_err_t *err)
{
    size_t hlen = strnlen(hdr, SL_VERIFY_HEADER_MAX + 1);
    if (hlen > SL_VERIFY_HEADER_MAX)
        return sl_err_set(err, SL_ETOOBIG, "webhook-signature header too long: more than %d bytes",
                          SL_VERIFY_HEADER_MAX);
    const char *p = hdr;
    const char *end = hdr + hlen;
    size_t k = 0;
    for (;;) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        const char *stop = sp ? sp : end;
        if (k >= SL_VERIFY_MAX_ENTRIES)
            return sl_err_set(err, SL_EDECODE,
                              "webhook-signature is malformed: more than %d entries",
                              SL_VERIFY_MAX_ENTRIES);
        if (parse_entry(p, (size_t)(stop - p), &entries[k]) < 0)
            return sl_err_set(err, SL_EDECODE,
                              "webhook-signature is malformed: entry %zu is not "
                              "\"<version>,<base64>\"",
                              k + 1);
        k++;
        if (!sp)
            break;
        p = sp + 1;
    }
    *nent = k;
    return 0;
}

/* Check the arguments and header presence of sl_verify. */
static int check_verify_args(const struct sl_secret *secrets,
                             size_t n,
                             const char *msg_id,
                             const char *timestamp_str,
                             const char *sig_header,
                             const uint8_t *body,
                             size_t len,
                             int64_t tolerance_s,
                             sl_err_t *err)
{
    if (!secrets || n == 0 || n > SL_SIGNER_MAX_SECRETS)
        return sl_err_set(err, SL_EINVAL, "verification needs 1..%d secrets, got %zu",
                          SL_SIGNER_MAX_SECRETS, secrets ? n : 0);
    for (size_t i = 0; i < n; i++) {
        int rc = check_secret(&secrets[i], (long)i, err);
        if (rc < 0)
            return rc;
    }
    if (tolerance_s < 0)
        return sl_err_set(err, SL_EINVAL, "tolerance must not be negative");
    if (!body && len)
        return sl_err_set(err, SL_EINVAL, "body is NULL with length %zu", len);
    if (!msg_id || !*msg_id)
        return sl_err_set(err, SL_EMISSING, "webhook-id header is missing");
    if (!timestamp_str || !*timestamp_str)
        return sl_err_set(err, SL_EMISSING, "webhook-timestamp header is missing");
    if (!sig_header || !*sig_header)
        return sl_err_set(err, SL_EMISSING, "webhook-signature header is missing");
    return check_msg_id(msg_id, SL_EDECODE, err);
}

/* Replay protection: ts within tolerance_s of now_s both ways, without overflow. */
static int check_tolerance(int64_t ts, int64_t now_s, int64_t tolerance_s, sl_err_t *err)
{
    int64_t skew = 0;
    /* On overflow the distance exceeds any int64 tolerance; only the direction matters. */
    bool far = __builtin_sub_overflow(now_s, ts, &skew);
    if (far ? now_s > ts : skew > tolerance_s)
        return sl_err_set(err, SL_EDENIED,
                          "webhook-timestamp too old: more than %" PRId64 " s before now",
                          tolerance_s);
    if (far ? now_s < ts : skew < -tolerance_s)
        return sl_err_set(err, SL_EDENIED,
                          "webhook-timestamp too new: more than %" PRId64 " s after now",
                          tolerance_s);
    return 0;
}

/*
 * expected[i] = HMAC-SHA256(secrets[i], prefix || body) for the HMAC secrets (the rows of
 * Ed25519 secrets are left alone). Returns 0 or SL_ECRYPTO.
 */
static int expected_macs(const struct sl_secret *secrets,
                         size_t n,
                         const char *prefix,
                         size_t plen,
                         const uint8_t *body,
                         size_t len,
                         uint8_t expected[][SL_SIGN_MAC_LEN],
                         sl_err_t *err)
{
    int rc = 0;
    EVP_MAC_CTX *ctx = NULL;
    EVP_MAC *mac = NULL;
    for (size_t i = 0; i < n; i++) {
        if (secrets[i].kind != SL_SECRET_HMAC)
            continue;
        if (!mac)
            mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        if (!mac) {
            rc =
                sl_err_set(err, SL_ECRYPTO, "could not fetch the hmac implementation from openssl");
            goto out;
        }
        ctx = keyed_ctx(mac, secrets[i].key, secrets[i].len);
        if (!ctx || mac_in(ctx, prefix, plen, body, len, expected[i]) < 0) {
            rc = sl_err_set(err, SL_ECRYPTO, "could not compute hmac-sha256 for secret %zu", i);
            goto out;
        }
        EVP_MAC_CTX_free(ctx);
        ctx = NULL;
    }
out:
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return rc;
}

/*
 * *matched |= some usable v1a entry verifies under the public key of some Ed25519 secret.
 * Every such entry is tried against every such key (no early exit, like the HMAC side; all
 * of it is public data). Returns 0 or SL_ECRYPTO.
 */
static int match_v1a(const struct sl_secret *secrets,
                     size_t n,
                     const struct sig_entry *entries,
                     size_t nent,
                     const char *prefix,
                     size_t plen,
                     const uint8_t *body,
                     size_t len,
                     bool *matched,
                     sl_err_t *err)
{
    int rc = 0;
    bool any = false;
    for (size_t e = 0; e < nent; e++)
        any |= entries[e].ver == VER_V1A && entries[e].usable;
    if (!any)
        return 0;
    uint8_t *msg = NULL;
    size_t mlen = 0;
    for (size_t i = 0; i < n; i++) {
        if (secrets[i].kind != SL_SECRET_ED25519)
            continue;
        if (!msg)
            msg = join_message(prefix, plen, body, len, &mlen);
        EVP_PKEY *pub = EVP_PKEY_new_raw_public_key(
            EVP_PKEY_ED25519, NULL, secrets[i].key + SL_ED25519_SEED_BYTES, SL_ED25519_PUB_BYTES);
        if (!pub) {
            rc = sl_err_set(err, SL_ECRYPTO, "could not load the ed25519 public key of secret %zu",
                            i);
            break;
        }
        for (size_t e = 0; e < nent; e++) {
            if (entries[e].ver == VER_V1A && entries[e].usable)
                *matched |= ed25519_verify(pub, entries[e].sig, msg, mlen);
        }
        EVP_PKEY_free(pub);
    }
    free(msg);
    return rc;
}

/* "v1", "v1a" or "v1 or v1a": the entries the given secrets can check. */
static const char *schemes_of(const struct sl_secret *secrets, size_t n, bool *hmac, bool *ed)
{
    *hmac = *ed = false;
    for (size_t i = 0; i < n; i++) {
        *hmac |= secrets[i].kind == SL_SECRET_HMAC;
        *ed |= secrets[i].kind == SL_SECRET_ED25519;
    }
    return *hmac && *ed ? "v1 or v1a" : *ed ? "v1a" : "v1";
}

int sl_verify(const struct sl_secret *secrets,
              size_t n,
              const char *msg_id,
              const char *timestamp_str,
              const char *sig_header,
              const uint8_t *body,
              size_t len,
              int64_t now_s,
              int64_t tolerance_s,
              sl_err_t *err)
{
    uint8_t expected[SL_SIGNER_MAX_SECRETS][SL_SIGN_MAC_LEN];
    struct sig_entry entries[SL_VERIFY_MAX_ENTRIES];
    char prefix[PREFIX_MAX];
    size_t nent = 0;
    int64_t ts = 0;

    int rc = check_verify_args(secrets, n, msg_id, timestamp_str, sig_header, body, len,
                               tolerance_s, err);
    if (rc < 0)
        return rc;
    if (parse_timestamp(timestamp_str, &ts) < 0)
        return sl_err_set(err, SL_EDECODE,
                          "webhook-timestamp is not a non-negative integer number of seconds");
    rc = check_tolerance(ts, now_s, tolerance_s, err);
    if (rc < 0)
        return rc;
    /* The whole list is parsed before anything is compared. */
    rc = parse_sig_list(sig_header, entries, &nent, err);
    if (rc < 0)
        return rc;
    /* The signed input uses the canonical timestamp, as the official libraries do. */
    size_t plen = build_prefix(prefix, msg_id, ts);
    rc = expected_macs(secrets, n, prefix, plen, body, len, expected, err);
    if (rc < 0)
        goto out;

    /* Every usable v1 entry against every HMAC secret, with no early exit on a match. */
    bool matched = false;
    bool hmac = false, ed = false;
    const char *schemes = schemes_of(secrets, n, &hmac, &ed);
    size_t checkable = 0; /* entries of a scheme some secret can check */
    for (size_t e = 0; e < nent; e++) {
        checkable += (entries[e].ver == VER_V1 && hmac) || (entries[e].ver == VER_V1A && ed);
        if (entries[e].ver != VER_V1 || !entries[e].usable)
            continue;
        for (size_t i = 0; i < n; i++) {
            if (secrets[i].kind == SL_SECRET_HMAC)
                matched |= CRYPTO_memcmp(entries[e].sig, expected[i], SL_SIGN_MAC_LEN) == 0;
        }
    }
    /* Every usable v1a entry against every Ed25519 public key. */
    rc = match_v1a(secrets, n, entries, nent, prefix, plen, body, len, &matched, err);
    if (rc < 0)
        goto out;
    if (!matched && checkable)
        rc = sl_err_set(err, SL_ECRYPTO,
                        "no matching signature: none of %zu %s signature(s) matches any of %zu "
                        "secret(s)",
                        checkable, schemes, n);
    else if (!matched)
        rc = sl_err_set(err, SL_ECRYPTO, "no matching signature: webhook-signature has no %s entry",
                        schemes);
out:
    sl_secret_wipe(expected, sizeof(expected));
    return rc;
}
