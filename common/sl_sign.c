/*
 * sl_sign: Standard Webhooks signing and verification (see sl_sign.h for the contract).
 *
 * The MAC input is "id.ts." (built on the stack: both are short and validated) followed by
 * the body, fed to HMAC-SHA256 in two updates so the body is never copied. Verification
 * canonicalises the received timestamp (parsed as an integer and re-printed), exactly as the
 * official libraries do, so "0123" and "123" verify alike.
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
#include "common/sl_mem.h"

struct sl_signer {
    EVP_MAC *mac;                             /* fetched "HMAC", owned */
    size_t n;                                 /* secrets, 1..SL_SIGNER_MAX_SECRETS */
    EVP_MAC_CTX *tmpl[SL_SIGNER_MAX_SECRETS]; /* keyed HMAC-SHA256 templates, owned */
};

/* "id." + "ts." : the part of the MAC input that precedes the body. */
#define PREFIX_MAX (SL_SIGN_ID_MAX + 1 + SL_SIGN_TS_MAX + 1)

/* ==== Secrets ==== */

int sl_secret_generate(struct sl_secret *s, sl_err_t *err)
{
    memset(s, 0, sizeof(*s));
    if (RAND_bytes(s->key, SL_SECRET_GEN_BYTES) != 1)
        return sl_err_set(err, SL_ECRYPTO, "could not generate secret: random generator failed");
    s->len = SL_SECRET_GEN_BYTES;
    return 0;
}

int sl_secret_parse(struct sl_secret *s, const char *str, sl_err_t *err)
{
    int rc = 0;
    memset(s, 0, sizeof(*s));
    if (!str || !*str) {
        rc = sl_err_set(err, SL_EMISSING, "secret is empty");
        goto out;
    }
    if (strncmp(str, SL_SECRET_PREFIX, SL_SECRET_PREFIX_LEN) != 0) {
        rc = sl_err_set(err, SL_EDECODE, "secret must start with \"%s\"", SL_SECRET_PREFIX);
        goto out;
    }
    const char *b64 = str + SL_SECRET_PREFIX_LEN;
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
        rc = sl_err_set(err, SL_EDECODE, "secret is not valid base64 after \"%s\"",
                        SL_SECRET_PREFIX);
        goto out;
    }
    if (len < SL_SECRET_MIN_BYTES) {
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

int sl_secret_format(const struct sl_secret *s, char *out, size_t outlen, sl_err_t *err)
{
    if (s->len < SL_SECRET_MIN_BYTES || s->len > SL_SECRET_MAX_BYTES)
        return sl_err_set(err, SL_EINVAL, "secret has %zu bytes of key, expected %d..%d", s->len,
                          SL_SECRET_MIN_BYTES, SL_SECRET_MAX_BYTES);
    if (outlen < SL_SECRET_PREFIX_LEN + SL_B64_ENCODED_LEN(s->len) + 1) {
        if (outlen)
            out[0] = '\0';
        return sl_err_set(err, SL_ETOOBIG, "secret buffer too small: %zu bytes", outlen);
    }
    memcpy(out, SL_SECRET_PREFIX, SL_SECRET_PREFIX_LEN);
    long r =
        sl_b64_encode(s->key, s->len, out + SL_SECRET_PREFIX_LEN, outlen - SL_SECRET_PREFIX_LEN);
    if (r < 0) { /* cannot happen: the size was checked above */
        sl_secret_wipe(out, outlen);
        return sl_err_set(err, SL_ETOOBIG, "secret buffer too small: %zu bytes", outlen);
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

/* MAC of prefix + body with a copy of the keyed template tmpl. Returns 0 or SL_ECRYPTO. */
static int mac_with(EVP_MAC_CTX *tmpl,
                    const char *prefix,
                    size_t plen,
                    const uint8_t *body,
                    size_t len,
                    uint8_t mac[SL_SIGN_MAC_LEN])
{
    int rc = SL_ECRYPTO;
    size_t outl = 0;
    /* Only reads tmpl, which is why one signer can sign on several threads at once. */
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(tmpl);
    if (!ctx)
        goto out;
    if (EVP_MAC_update(ctx, (const unsigned char *)prefix, plen) != 1)
        goto out;
    if (len && EVP_MAC_update(ctx, body, len) != 1)
        goto out;
    if (EVP_MAC_final(ctx, mac, &outl, SL_SIGN_MAC_LEN) != 1 || outl != SL_SIGN_MAC_LEN)
        goto out;
    rc = 0;
out:
    EVP_MAC_CTX_free(ctx);
    return rc;
}

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
    int n = snprintf(buf, PREFIX_MAX, "%s.%" PRId64 ".", msg_id, ts);
    return n > 0 ? (size_t)n : 0;
}

/* ==== Signer ==== */

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
        if (secrets[i].len < SL_SECRET_MIN_BYTES || secrets[i].len > SL_SECRET_MAX_BYTES) {
            rc = sl_err_set(err, SL_EINVAL, "secret %zu has %zu bytes of key, expected %d..%d", i,
                            secrets[i].len, SL_SECRET_MIN_BYTES, SL_SECRET_MAX_BYTES);
            goto out;
        }
    }
    sg = sl_xcalloc(1, sizeof(*sg));
    sg->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!sg->mac) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not fetch the hmac implementation from openssl");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        sg->tmpl[i] = keyed_ctx(sg->mac, secrets[i].key, secrets[i].len);
        if (!sg->tmpl[i]) {
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
    for (size_t i = 0; i < SL_SIGNER_MAX_SECRETS; i++)
        EVP_MAC_CTX_free(sg->tmpl[i]);
    EVP_MAC_free(sg->mac);
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
    size_t need = sg->n * (SL_SIGN_ENTRY_LEN + 1); /* entries, separators, NUL */
    if (outlen < need) {
        rc = sl_err_set(err, SL_ETOOBIG, "signature buffer too small: %zu bytes, %zu needed",
                        outlen, need);
        goto out;
    }
    size_t plen = build_prefix(prefix, msg_id, timestamp_s);
    size_t o = 0;
    for (size_t i = 0; i < sg->n; i++) {
        uint8_t mac[SL_SIGN_MAC_LEN];
        rc = mac_with(sg->tmpl[i], prefix, plen, body, len, mac);
        if (rc < 0) {
            rc = sl_err_set(err, SL_ECRYPTO, "could not compute hmac-sha256 for secret %zu", i);
            goto out;
        }
        if (i)
            out[o++] = ' ';
        memcpy(out + o, "v1,", 3);
        o += 3;
        long b = sl_b64_encode(mac, sizeof(mac), out + o, outlen - o);
        if (b < 0) { /* cannot happen: need was checked */
            rc = sl_err_set(err, SL_ETOOBIG, "signature buffer too small: %zu bytes", outlen);
            goto out;
        }
        o += (size_t)b;
    }
out:
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
    (void)snprintf(out->id, sizeof(out->id), "webhook-id: %s", msg_id);
    (void)snprintf(out->timestamp, sizeof(out->timestamp), "webhook-timestamp: %" PRId64,
                   timestamp_s);
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

/* One parsed entry of the webhook-signature list. */
struct sig_entry {
    bool v1;                      /* version is exactly "v1" */
    bool usable;                  /* v1 and decodes to SL_SIGN_MAC_LEN bytes */
    uint8_t mac[SL_SIGN_MAC_LEN]; /* decoded signature when usable */
};

/*
 * Parse one entry of n bytes at p. The list is checked strictly (as the official libraries
 * do): each entry is "<version>,<sig>" with both parts non-empty and exactly one comma, and
 * a v1 signature is canonical base64. Returns 0 or SL_EDECODE.
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
    e->v1 = comma - p == 2 && memcmp(p, "v1", 2) == 0;
    e->usable = false;
    if (!e->v1)
        return 0; /* other schemes (v1a, future versions) are not ours to check */
    uint8_t got[SL_B64_DECODED_MAX(SL_VERIFY_HEADER_MAX)];
    size_t glen = 0;
    if (sl_b64_decode(sig, sig_len, got, sizeof(got), &glen) < 0)
        return SL_EDECODE;
    /* Another length cannot match: CRYPTO_memcmp only compares equal lengths. */
    e->usable = glen == SL_SIGN_MAC_LEN;
    if (e->usable)
        memcpy(e->mac, got, SL_SIGN_MAC_LEN);
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
        if (secrets[i].len < SL_SECRET_MIN_BYTES || secrets[i].len > SL_SECRET_MAX_BYTES)
            return sl_err_set(err, SL_EINVAL, "secret %zu has %zu bytes of key, expected %d..%d", i,
                              secrets[i].len, SL_SECRET_MIN_BYTES, SL_SECRET_MAX_BYTES);
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

/* expected[i] = HMAC-SHA256(secrets[i], prefix || body). Returns 0 or SL_ECRYPTO. */
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
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!mac) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not fetch the hmac implementation from openssl");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ctx = keyed_ctx(mac, secrets[i].key, secrets[i].len);
        if (!ctx || mac_with(ctx, prefix, plen, body, len, expected[i]) < 0) {
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
    /* The MAC input uses the canonical timestamp, as the official libraries do. */
    size_t plen = build_prefix(prefix, msg_id, ts);
    rc = expected_macs(secrets, n, prefix, plen, body, len, expected, err);
    if (rc < 0)
        goto out;

    /* Every usable entry against every secret, with no early exit on a match. */
    bool matched = false;
    size_t v1 = 0;
    for (size_t e = 0; e < nent; e++) {
        v1 += entries[e].v1;
        if (!entries[e].usable)
            continue;
        for (size_t i = 0; i < n; i++)
            matched |= CRYPTO_memcmp(entries[e].mac, expected[i], SL_SIGN_MAC_LEN) == 0;
    }
    if (!matched && v1)
        rc = sl_err_set(err, SL_ECRYPTO,
                        "no matching signature: none of %zu v1 signature(s) matches any of %zu "
                        "secret(s)",
                        v1, n);
    else if (!matched)
        rc =
            sl_err_set(err, SL_ECRYPTO, "no matching signature: webhook-signature has no v1 entry");
out:
    sl_secret_wipe(expected, sizeof(expected));
    return rc;
}
