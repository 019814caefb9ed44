/*
 * sl_secretbox: AES-256-GCM boxes for endpoint secrets at rest (see sl_secretbox.h).
 *
 * Every failure path of open() wipes the output buffer, so a caller that ignores the return
 * code never sees unauthenticated plaintext (GCM decrypts before the tag is checked).
 */
#include "common/sl_secretbox.h"

#include <string.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "common/sl_b64.h"
#include "common/sl_mem.h"

#define HEX_LEN ((size_t)2 * SL_MASTERKEY_LEN)

static int hex_val(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 64 hex characters (checked printable) into key. Returns 0 or SL_EINVAL. */
static int parse_hex(uint8_t key[SL_MASTERKEY_LEN], const char *str, sl_err_t *err)
{
    for (size_t i = 0; i < SL_MASTERKEY_LEN; i++) {
        int hi = hex_val((unsigned char)str[2 * i]);
        int lo = hex_val((unsigned char)str[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return sl_err_set(err, SL_EINVAL,
                              "master key has 64 characters but is not hex (offset %zu)",
                              hi < 0 ? 2 * i : 2 * i + 1);
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int sl_masterkey_parse(struct sl_masterkey *mk, const char *str, sl_err_t *err)
{
    int rc = 0;
    memset(mk, 0, sizeof(*mk));
    if (!str || !*str) {
        rc = sl_err_set(err, SL_EMISSING, "master key is empty");
        goto out;
    }
    /* Reading stops one past the longest valid form: the length is all a message needs. */
    size_t n = strnlen(str, HEX_LEN + 1);
    for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char c = (unsigned char)str[i];
        if (c <= 0x20 || c >= 0x7f)
            rc = sl_err_set(err, SL_EINVAL,
                            "master key contains whitespace or a non-printable byte at offset %zu",
                            i);
    }
    if (rc < 0)
        goto out;
    size_t b64 = SL_B64_ENCODED_LEN(SL_MASTERKEY_LEN); /* 44 padded, 43 without */
    size_t len = 0;
    if (n == HEX_LEN) {
        rc = parse_hex(mk->key, str, err);
    } else if (n == b64 || n == b64 - 1) {
        if (sl_b64_decode(str, n, mk->key, sizeof(mk->key), &len) < 0 || len != SL_MASTERKEY_LEN)
            rc = sl_err_set(err, SL_EINVAL,
                            "master key has %zu characters but is not base64 of %d bytes", n,
                            SL_MASTERKEY_LEN);
    } else {
        rc = sl_err_set(err, SL_EINVAL,
                        "master key must be %d bytes as 64 hex characters or base64 (43 or 44 "
                        "characters), got %s%zu characters",
                        SL_MASTERKEY_LEN, n > HEX_LEN ? "more than " : "",
                        n > HEX_LEN ? HEX_LEN : n);
    }
out:
    if (rc < 0)
        sl_secret_wipe(mk, sizeof(*mk));
    return rc;
}

void sl_masterkey_fini(struct sl_masterkey *mk)
{
    if (mk)
        sl_secret_wipe(mk, sizeof(*mk));
}

/* Length of a usable endpoint id (1..SL_SECRETBOX_MAX_AD), or 0. */
static size_t ad_len(const char *endpoint_id)
{
    if (!endpoint_id)
        return 0;
    size_t n = strnlen(endpoint_id, SL_SECRETBOX_MAX_AD + 1);
    return n > SL_SECRETBOX_MAX_AD ? 0 : n;
}

int sl_secretbox_seal(const struct sl_masterkey *mk,
                      const char *endpoint_id,
                      const uint8_t *plain,
                      size_t len,
                      uint8_t *out,
                      size_t outcap,
                      size_t *outlen,
                      sl_err_t *err)
{
    int rc = 0;
    EVP_CIPHER_CTX *ctx = NULL;
    int l = 0;
    *outlen = 0;
    size_t adl = ad_len(endpoint_id);
    if (adl == 0) {
        rc = sl_err_set(err, SL_EINVAL, "endpoint id must be 1..%d bytes", SL_SECRETBOX_MAX_AD);
        goto out;
    }
    if (!plain && len) {
        rc = sl_err_set(err, SL_EINVAL, "secret for endpoint %s is NULL with length %zu",
                        endpoint_id, len);
        goto out;
    }
    if (len > SL_SECRETBOX_MAX_PLAIN) {
        rc = sl_err_set(err, SL_ETOOBIG, "secret for endpoint %s too large: %zu bytes, at most %d",
                        endpoint_id, len, SL_SECRETBOX_MAX_PLAIN);
        goto out;
    }
    if (outcap < len + SL_SECRETBOX_OVERHEAD) {
        rc = sl_err_set(err, SL_ETOOBIG, "secretbox buffer too small: %zu bytes, %zu needed",
                        outcap, len + SL_SECRETBOX_OVERHEAD);
        goto out;
    }
    uint8_t *nonce = out + 1;
    uint8_t *ct = nonce + SL_SECRETBOX_NONCE_LEN;
    uint8_t *tag = ct + len;
    out[0] = SL_SECRETBOX_VERSION;
    if (RAND_bytes(nonce, SL_SECRETBOX_NONCE_LEN) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO,
                        "could not encrypt secret for endpoint %s: random generator failed",
                        endpoint_id);
        goto out;
    }
    ctx = EVP_CIPHER_CTX_new();
    /* The GCM default IV length is 12 bytes, our nonce length: no EVP_CTRL_GCM_SET_IVLEN. */
    if (!ctx || EVP_EncryptInit_ex2(ctx, EVP_aes_256_gcm(), mk->key, nonce, NULL) != 1 ||
        EVP_EncryptUpdate(ctx, NULL, &l, (const unsigned char *)endpoint_id, (int)adl) != 1 ||
        (len && EVP_EncryptUpdate(ctx, ct, &l, plain, (int)len) != 1) ||
        EVP_EncryptFinal_ex(ctx, ct + len, &l) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, SL_SECRETBOX_TAG_LEN, tag) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not encrypt secret for endpoint %s: openssl error",
                        endpoint_id);
        goto out;
    }
    *outlen = len + SL_SECRETBOX_OVERHEAD;
out:
    EVP_CIPHER_CTX_free(ctx);
    if (rc < 0 && outcap)
        sl_secret_wipe(out,
                       outcap < len + SL_SECRETBOX_OVERHEAD ? outcap : len + SL_SECRETBOX_OVERHEAD);
    return rc;
}

int sl_secretbox_open(const struct sl_masterkey *mk,
                      const char *endpoint_id,
                      const uint8_t *box,
                      size_t boxlen,
                      uint8_t *out,
                      size_t outcap,
                      size_t *outlen,
                      sl_err_t *err)
{
    int rc = 0;
    EVP_CIPHER_CTX *ctx = NULL;
    int l = 0;
    *outlen = 0;
    size_t adl = ad_len(endpoint_id);
    if (adl == 0) {
        rc = sl_err_set(err, SL_EINVAL, "endpoint id must be 1..%d bytes", SL_SECRETBOX_MAX_AD);
        goto out;
    }
    if (!box || boxlen < SL_SECRETBOX_OVERHEAD) {
        rc = sl_err_set(err, SL_EDECODE,
                        "cannot decrypt secret for endpoint %s: box is %zu bytes, at least %d "
                        "expected",
                        endpoint_id, box ? boxlen : 0, SL_SECRETBOX_OVERHEAD);
        goto out;
    }
    if (box[0] != SL_SECRETBOX_VERSION) {
        rc = sl_err_set(err, SL_EVERSION,
                        "cannot decrypt secret for endpoint %s: unsupported box version %u",
                        endpoint_id, (unsigned)box[0]);
        goto out;
    }
    size_t len = boxlen - SL_SECRETBOX_OVERHEAD;
    if (len > SL_SECRETBOX_MAX_PLAIN) {
        rc = sl_err_set(err, SL_ETOOBIG,
                        "cannot decrypt secret for endpoint %s: box too large (%zu bytes)",
                        endpoint_id, boxlen);
        goto out;
    }
    if (outcap < len) {
        rc = sl_err_set(err, SL_ETOOBIG, "secret buffer too small: %zu bytes, %zu needed", outcap,
                        len);
        goto out;
    }
    const uint8_t *nonce = box + 1;
    const uint8_t *ct = nonce + SL_SECRETBOX_NONCE_LEN;
    /* EVP_CTRL_AEAD_SET_TAG takes a non-const pointer: copy the tag. */
    uint8_t tag[SL_SECRETBOX_TAG_LEN];
    memcpy(tag, ct + len, sizeof(tag));
    ctx = EVP_CIPHER_CTX_new();
    if (!ctx || EVP_DecryptInit_ex2(ctx, EVP_aes_256_gcm(), mk->key, nonce, NULL) != 1 ||
        EVP_DecryptUpdate(ctx, NULL, &l, (const unsigned char *)endpoint_id, (int)adl) != 1 ||
        (len && EVP_DecryptUpdate(ctx, out, &l, ct, (int)len) != 1) ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, SL_SECRETBOX_TAG_LEN, tag) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not decrypt secret for endpoint %s: openssl error",
                        endpoint_id);
        goto out;
    }
    /* The tag is checked here; before it passes, out holds unauthenticated bytes. */
    if (EVP_DecryptFinal_ex(ctx, out + len, &l) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO,
                        "could not decrypt secret for endpoint %s: authentication failed",
                        endpoint_id);
        goto out;
    }
    *outlen = len;
out:
    EVP_CIPHER_CTX_free(ctx);
    if (rc < 0 && out && outcap)
        sl_secret_wipe(out, outcap);
    return rc;
}
