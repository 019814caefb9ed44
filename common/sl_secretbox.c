/*
 * sl_secretbox: master keys, AES-256-GCM boxes for endpoint secrets at rest and the record MAC
 * (see sl_secretbox.h).
 *
 * Every failure path of open() wipes the output buffer, so a caller that ignores the return
 * code never sees unauthenticated plaintext (GCM decrypts before the tag is checked).
 */
#include "common/sl_secretbox.h"

#include <stdbool.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "common/sl_b64.h"
#include "common/sl_hex.h"
#include "common/sl_mem.h"

#define HEX_LEN ((size_t)2 * SL_MASTERKEY_LEN)

/* 64 hex characters (checked printable) into key. Returns 0 or SL_EINVAL. */
static int parse_hex(uint8_t key[SL_MASTERKEY_LEN], const char *str, sl_err_t *err)
{
    for (size_t i = 0; i < SL_MASTERKEY_LEN; i++) {
        int hi = sl_hex_digit((unsigned char)str[2 * i]);
        int lo = sl_hex_digit((unsigned char)str[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return sl_err_set(err, SL_EINVAL,
                              "master key has 64 characters but is not hex (offset %zu)",
                              hi < 0 ? 2 * i : 2 * i + 1);
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static bool id_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* The record MAC key of ent: HKDF-SHA256(key, info). Returns 0 or SL_ECRYPTO. */
static int derive_mac_key(struct sl_masterkey_entry *ent, sl_err_t *err)
{
    static const char info[] = "sluice endpoint record mac v1";
    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t outlen = sizeof(ent->mac);
    int ok =
        pc && EVP_PKEY_derive_init(pc) == 1 && EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) == 1 &&
        EVP_PKEY_CTX_set1_hkdf_key(pc, ent->key, (int)sizeof(ent->key)) == 1 &&
        EVP_PKEY_CTX_add1_hkdf_info(pc, (const unsigned char *)info, (int)(sizeof(info) - 1)) ==
            1 &&
        EVP_PKEY_derive(pc, ent->mac, &outlen) == 1 && outlen == sizeof(ent->mac);
    EVP_PKEY_CTX_free(pc);
    return ok ? 0
              : sl_err_set(err, SL_ECRYPTO,
                           "could not derive the record MAC key of master "
                           "key '%s': openssl error",
                           ent->id);
}

/* One entry "id:key" or "key" (len bytes at str, printable, no comma) into ent. */
static int
parse_entry(struct sl_masterkey_entry *ent, size_t no, const char *str, size_t len, sl_err_t *err)
{
    const char *colon = memchr(str, ':', len);
    const char *key = str;
    size_t klen = len;
    if (colon) {
        size_t idlen = (size_t)(colon - str);
        if (idlen == 0 || idlen > SL_MASTERKEY_ID_MAX)
            return sl_err_set(err, SL_EINVAL, "master key %zu: key id must be 1..%d characters", no,
                              SL_MASTERKEY_ID_MAX);
        for (size_t i = 0; i < idlen; i++) {
            if (!id_char((unsigned char)str[i]))
                return sl_err_set(err, SL_EINVAL,
                                  "master key %zu: key id may hold only [A-Za-z0-9_-] (offset %zu)",
                                  no, i);
        }
        memcpy(ent->id, str, idlen);
        ent->id[idlen] = '\0';
        key = colon + 1;
        klen = len - idlen - 1;
    } else {
        memcpy(ent->id, SL_MASTERKEY_ID_BARE, sizeof(SL_MASTERKEY_ID_BARE));
    }
    size_t b64 = SL_B64_ENCODED_LEN(SL_MASTERKEY_LEN); /* 44 padded, 43 without */
    size_t got = 0;
    if (klen == HEX_LEN) {
        sl_err_t e2;
        if (parse_hex(ent->key, key, &e2) != 0)
            return sl_err_set(err, SL_EINVAL, "master key %zu (id '%s'): %s", no, ent->id, e2.msg);
    } else if (klen == b64 || klen == b64 - 1) {
        if (sl_b64_decode(key, klen, ent->key, sizeof(ent->key), &got) < 0 ||
            got != SL_MASTERKEY_LEN)
            return sl_err_set(err, SL_EINVAL,
                              "master key %zu (id '%s') has %zu characters but is not base64 of "
                              "%d bytes",
                              no, ent->id, klen, SL_MASTERKEY_LEN);
    } else {
        return sl_err_set(err, SL_EINVAL,
                          "master key %zu (id '%s') must be %d bytes as 64 hex characters or "
                          "base64 (43 or 44 characters), got %zu characters",
                          no, ent->id, SL_MASTERKEY_LEN, klen);
    }
    return derive_mac_key(ent, err);
}

int sl_masterkey_parse(struct sl_masterkey *mk, const char *str, sl_err_t *err)
{
    int rc = 0;
    memset(mk, 0, sizeof(*mk));
    if (!str || !*str) {
        rc = sl_err_set(err, SL_EMISSING, "master key is empty");
        goto out;
    }
    /* Reading stops one past the longest valid value: the length is all a message needs. */
    size_t max = SL_MASTERKEYS_MAX * (SL_MASTERKEY_ID_MAX + 1 + HEX_LEN + 1);
    size_t n = strnlen(str, max + 1);
    if (n > max) {
        rc = sl_err_set(err, SL_EINVAL, "master key value is longer than %zu characters", max);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)str[i];
        if (c <= 0x20 || c >= 0x7f) {
            rc = sl_err_set(err, SL_EINVAL,
                            "master key contains whitespace or a non-printable byte at offset %zu",
                            i);
            goto out;
        }
    }
    for (size_t at = 0;;) {
        const char *comma = memchr(str + at, ',', n - at);
        size_t len = comma ? (size_t)(comma - (str + at)) : n - at;
        if (mk->n == SL_MASTERKEYS_MAX) {
            rc =
                sl_err_set(err, SL_EINVAL, "master key holds more than %d keys", SL_MASTERKEYS_MAX);
            goto out;
        }
        if (len == 0) {
            rc = sl_err_set(err, SL_EINVAL, "master key %zu is empty", mk->n + 1);
            goto out;
        }
        rc = parse_entry(&mk->k[mk->n], mk->n + 1, str + at, len, err);
        if (rc < 0)
            goto out;
        for (size_t j = 0; j < mk->n; j++) {
            if (strcmp(mk->k[j].id, mk->k[mk->n].id) == 0) {
                rc = sl_err_set(err, SL_EINVAL, "master keys %zu and %zu have the same id '%s'",
                                j + 1, mk->n + 1, mk->k[j].id);
                goto out;
            }
            if (CRYPTO_memcmp(mk->k[j].key, mk->k[mk->n].key, SL_MASTERKEY_LEN) == 0) {
                rc = sl_err_set(err, SL_EINVAL, "master keys %zu and %zu are the same key", j + 1,
                                mk->n + 1);
                goto out;
            }
        }
        mk->n++;
        if (!comma)
            break;
        at += len + 1;
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

const struct sl_masterkey_entry *sl_masterkey_find(const struct sl_masterkey *mk, const char *kid)
{
    if (!mk || mk->n == 0)
        return NULL;
    if (!kid)
        return &mk->k[0];
    for (size_t i = 0; i < mk->n; i++) {
        if (strcmp(mk->k[i].id, kid) == 0)
            return &mk->k[i];
    }
    return NULL;
}

int sl_masterkey_mac(const struct sl_masterkey *mk,
                     const char *kid,
                     const void *const *parts,
                     const size_t *lens,
                     size_t n,
                     uint8_t out[SL_RECORD_MAC_LEN],
                     sl_err_t *err)
{
    const struct sl_masterkey_entry *ent = sl_masterkey_find(mk, kid);
    if (!ent)
        return sl_err_set(err, SL_ECRYPTO, "master key '%s' is not configured",
                          kid ? kid : "(current)");
    int rc = 0;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    size_t outl = 0;
    if (!ctx || EVP_MAC_init(ctx, ent->mac, sizeof(ent->mac), params) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not compute a record MAC: openssl error");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (lens[i] && EVP_MAC_update(ctx, parts[i], lens[i]) != 1) {
            rc = sl_err_set(err, SL_ECRYPTO, "could not compute a record MAC: openssl error");
            goto out;
        }
    }
    if (EVP_MAC_final(ctx, out, &outl, SL_RECORD_MAC_LEN) != 1 || outl != SL_RECORD_MAC_LEN)
        rc = sl_err_set(err, SL_ECRYPTO, "could not compute a record MAC: openssl error");
out:
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return rc;
}

int sl_secretbox_kid(const uint8_t *box, size_t boxlen, char out[SL_MASTERKEY_ID_MAX + 1])
{
    out[0] = '\0';
    if (!box || boxlen < 1)
        return SL_EDECODE;
    if (box[0] != 2)
        return 0;
    if (boxlen < 2 || box[1] == 0 || box[1] > SL_MASTERKEY_ID_MAX || boxlen < 2u + box[1])
        return SL_EDECODE;
    /* Every byte of the id, as parse_entry allows them: a NUL inside would make the id read
     * shorter than its length byte says, and the rest of the box would be read from the wrong
     * place. */
    for (size_t i = 0; i < box[1]; i++) {
        if (!id_char(box[2 + i]))
            return SL_EDECODE;
    }
    memcpy(out, box + 2, box[1]);
    out[box[1]] = '\0';
    return 0;
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
    const struct sl_masterkey_entry *ent = sl_masterkey_find(mk, NULL);
    size_t idl = ent ? strlen(ent->id) : 0;
    size_t total = 2 + idl + SL_SECRETBOX_NONCE_LEN + len + SL_SECRETBOX_TAG_LEN;
    size_t adl = ad_len(endpoint_id);
    if (!ent) {
        rc = sl_err_set(err, SL_EINVAL, "no master key");
        goto out;
    }
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
    if (outcap < total) {
        rc = sl_err_set(err, SL_ETOOBIG, "secretbox buffer too small: %zu bytes, %zu needed",
                        outcap, total);
        goto out;
    }
    out[0] = SL_SECRETBOX_VERSION;
    out[1] = (uint8_t)idl;
    memcpy(out + 2, ent->id, idl);
    uint8_t *nonce = out + 2 + idl;
    uint8_t *ct = nonce + SL_SECRETBOX_NONCE_LEN;
    uint8_t *tag = ct + len;
    if (RAND_bytes(nonce, SL_SECRETBOX_NONCE_LEN) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO,
                        "could not encrypt secret for endpoint %s: random generator failed",
                        endpoint_id);
        goto out;
    }
    static const unsigned char zero = 0;
    ctx = EVP_CIPHER_CTX_new();
    /* The GCM default IV length is 12 bytes, our nonce length: no EVP_CTRL_GCM_SET_IVLEN. */
    if (!ctx || EVP_EncryptInit_ex2(ctx, EVP_aes_256_gcm(), ent->key, nonce, NULL) != 1 ||
        EVP_EncryptUpdate(ctx, NULL, &l, (const unsigned char *)endpoint_id, (int)adl) != 1 ||
        EVP_EncryptUpdate(ctx, NULL, &l, &zero, 1) != 1 ||
        EVP_EncryptUpdate(ctx, NULL, &l, (const unsigned char *)ent->id, (int)idl) != 1 ||
        (len && EVP_EncryptUpdate(ctx, ct, &l, plain, (int)len) != 1) ||
        EVP_EncryptFinal_ex(ctx, ct + len, &l) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, SL_SECRETBOX_TAG_LEN, tag) != 1) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not encrypt secret for endpoint %s: openssl error",
                        endpoint_id);
        goto out;
    }
    *outlen = total;
out:
    EVP_CIPHER_CTX_free(ctx);
    if (rc < 0 && outcap)
        sl_secret_wipe(out, outcap < total ? outcap : total);
    return rc;
}

/*
 * AES-256-GCM open of len bytes at ct with key, nonce, tag and the associated data
 * endpoint_id [| 0x00 | kid when kid]. Returns 1 (opened), 0 (authentication failed) or -1
 * (OpenSSL failure). out may hold unauthenticated bytes unless 1 is returned.
 */
static int gcm_open(const uint8_t key[SL_MASTERKEY_LEN],
                    const char *endpoint_id,
                    size_t adl,
                    const char *kid,
                    const uint8_t *nonce,
                    const uint8_t *ct,
                    size_t len,
                    const uint8_t *tag_in,
                    uint8_t *out)
{
    static const unsigned char zero = 0;
    int l = 0;
    int r = -1;
    /* EVP_CTRL_AEAD_SET_TAG takes a non-const pointer: copy the tag. */
    uint8_t tag[SL_SECRETBOX_TAG_LEN];
    memcpy(tag, tag_in, sizeof(tag));
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx || EVP_DecryptInit_ex2(ctx, EVP_aes_256_gcm(), key, nonce, NULL) != 1 ||
        EVP_DecryptUpdate(ctx, NULL, &l, (const unsigned char *)endpoint_id, (int)adl) != 1 ||
        (kid &&
         (EVP_DecryptUpdate(ctx, NULL, &l, &zero, 1) != 1 ||
          EVP_DecryptUpdate(ctx, NULL, &l, (const unsigned char *)kid, (int)strlen(kid)) != 1)) ||
        (len && EVP_DecryptUpdate(ctx, out, &l, ct, (int)len) != 1) ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, SL_SECRETBOX_TAG_LEN, tag) != 1)
        goto out;
    /* The tag is checked here; before it passes, out holds unauthenticated bytes. */
    r = EVP_DecryptFinal_ex(ctx, out + len, &l) == 1 ? 1 : 0;
out:
    EVP_CIPHER_CTX_free(ctx);
    return r;
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
    *outlen = 0;
    size_t adl = ad_len(endpoint_id);
    char kid[SL_MASTERKEY_ID_MAX + 1] = "";
    size_t head = 1;
    if (adl == 0 || !mk || mk->n == 0) {
        rc = sl_err_set(err, SL_EINVAL, "no master key, or an endpoint id not of 1..%d bytes",
                        SL_SECRETBOX_MAX_AD);
        goto out;
    }
    if (!box || boxlen < 1) {
        rc = sl_err_set(err, SL_EDECODE, "cannot decrypt secret for endpoint %s: empty box",
                        endpoint_id);
        goto out;
    }
    if (box[0] == 2) {
        if (sl_secretbox_kid(box, boxlen, kid) != 0) {
            rc = sl_err_set(err, SL_EDECODE,
                            "cannot decrypt secret for endpoint %s: box has no valid key id",
                            endpoint_id);
            goto out;
        }
        head = 2 + strlen(kid);
    } else if (box[0] != 1) {
        rc = sl_err_set(err, SL_EVERSION,
                        "cannot decrypt secret for endpoint %s: unsupported box version %u",
                        endpoint_id, (unsigned)box[0]);
        goto out;
    }
    if (boxlen < head + SL_SECRETBOX_NONCE_LEN + SL_SECRETBOX_TAG_LEN) {
        rc = sl_err_set(err, SL_EDECODE,
                        "cannot decrypt secret for endpoint %s: box is %zu bytes, at least %zu "
                        "expected",
                        endpoint_id, boxlen, head + SL_SECRETBOX_NONCE_LEN + SL_SECRETBOX_TAG_LEN);
        goto out;
    }
    size_t len = boxlen - head - SL_SECRETBOX_NONCE_LEN - SL_SECRETBOX_TAG_LEN;
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
    const uint8_t *nonce = box + head;
    const uint8_t *ct = nonce + SL_SECRETBOX_NONCE_LEN;
    int r = 0;
    if (kid[0]) {
        const struct sl_masterkey_entry *ent = sl_masterkey_find(mk, kid);
        if (!ent) {
            rc = sl_err_set(err, SL_ECRYPTO,
                            "cannot decrypt secret for endpoint %s: sealed with master key '%s', "
                            "which is not configured",
                            endpoint_id, kid);
            goto out;
        }
        r = gcm_open(ent->key, endpoint_id, adl, kid, nonce, ct, len, ct + len, out);
    } else {
        /* version 1: no key id; whichever configured key authenticates it */
        for (size_t i = 0; i < mk->n && r == 0; i++)
            r = gcm_open(mk->k[i].key, endpoint_id, adl, NULL, nonce, ct, len, ct + len, out);
    }
    if (r < 0)
        rc = sl_err_set(err, SL_ECRYPTO, "could not decrypt secret for endpoint %s: openssl error",
                        endpoint_id);
    else if (r == 0)
        rc = sl_err_set(err, SL_ECRYPTO,
                        "could not decrypt secret for endpoint %s: authentication failed",
                        endpoint_id);
    else
        *outlen = len;
out:
    if (rc < 0 && out && outcap)
        sl_secret_wipe(out, outcap);
    return rc;
}
