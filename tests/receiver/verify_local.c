/*
 * verify_local: Standard Webhooks verification for the test receiver (contract in
 * verify_local.h). Kept deliberately small and obviously correct: it is the oracle the
 * consumer's signer is tested against until common/sl_sign's sl_verify replaces it.
 */
#include "verify_local.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_mem.h"

#define SECRET_PREFIX     "whsec_"
#define SECRET_PREFIX_LEN 6
#define MAC_LEN           32 /* HMAC-SHA256 output, bytes */
#define B64_MAC_LEN       44 /* its padded base64, chars */

/*
 * Strict base64 decode of n characters (padding optional) into out. EVP_DecodeBlock wants a
 * multiple of 4 and counts padding as output bytes, so pad a copy first and subtract after.
 * Returns the decoded length, or -1 for invalid input or when it would exceed outcap.
 */
static long b64_decode(const char *in, size_t n, uint8_t *out, size_t outcap)
{
    char tmp[RECV_VERIFY_HEADER_MAX + 4];
    uint8_t dec[(RECV_VERIFY_HEADER_MAX + 4) / 4 * 3];
    size_t pad = 0;
    long ret = -1;

    if (n == 0 || n > RECV_VERIFY_HEADER_MAX)
        return -1;
    memcpy(tmp, in, n);
    while (n % 4 != 0)
        tmp[n++] = '=';
    for (size_t i = n; i > 0 && tmp[i - 1] == '='; i--)
        pad++;
    if (pad > 2)
        goto out;
    /* EVP_DecodeBlock skips surrounding whitespace; refuse it to stay strict. */
    for (size_t i = 0; i < n; i++) {
        if (tmp[i] == ' ' || tmp[i] == '\t' || tmp[i] == '\r' || tmp[i] == '\n')
            goto out;
    }
    int d = EVP_DecodeBlock(dec, (const unsigned char *)tmp, (int)n);
    if (d < 0 || (size_t)d < pad)
        goto out;
    size_t dlen = (size_t)d - pad;
    if (dlen > outcap)
        goto out;
    memcpy(out, dec, dlen);
    ret = (long)dlen;
out:
    sl_secret_wipe(dec, sizeof(dec));
    sl_secret_wipe(tmp, sizeof(tmp));
    return ret;
}

int recv_secret_parse(struct recv_secret *s, const char *str, sl_err_t *err)
{
    long n;

    memset(s, 0, sizeof(*s));
    if (str == NULL || strncmp(str, SECRET_PREFIX, SECRET_PREFIX_LEN) != 0)
        return sl_err_set(err, SL_EMISSING, "secret lacks the whsec_ prefix");
    str += SECRET_PREFIX_LEN;
    size_t slen = strlen(str);
    if (slen > (RECV_SECRET_MAX_BYTES + 2) / 3 * 4)
        return sl_err_set(err, SL_ETOOBIG, "secret longer than %d bytes", RECV_SECRET_MAX_BYTES);
    n = b64_decode(str, slen, s->key, sizeof(s->key));
    if (n <= 0) {
        recv_secret_fini(s);
        return sl_err_set(err, SL_EDECODE, "secret is not valid base64");
    }
    s->len = (size_t)n;
    return 0;
}

void recv_secret_fini(struct recv_secret *s)
{
    if (s)
        sl_secret_wipe(s, sizeof(*s));
}

/* n characters of the standard base64 alphabet, '=' only as trailing padding. */
static bool is_b64(const char *s, size_t n)
{
    size_t i = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '/'))
            break;
    }
    size_t pad = n - i;
    for (; i < n; i++) {
        if (s[i] != '=')
            return false;
    }
    return pad <= 2;
}

/* Decimal integer, optional leading '-', nothing else. */
static int parse_ts(const char *s, int64_t *out)
{
    char *end = NULL;
    const char *p = s[0] == '-' ? s + 1 : s;
    if (*p < '0' || *p > '9')
        return SL_EDECODE;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return SL_EDECODE;
    *out = (int64_t)v;
    return 0;
}

int recv_verify(const struct recv_secret *secrets,
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
    uint8_t *content = NULL;
    uint8_t macs[RECV_VERIFY_MAX_SECRETS][MAC_LEN];
    char encoded[RECV_VERIFY_MAX_SECRETS][B64_MAC_LEN + 1];
    int rc = SL_ECRYPTO;
    int64_t ts = 0;

    if (secrets == NULL || n == 0 || n > RECV_VERIFY_MAX_SECRETS || (body == NULL && len > 0))
        return sl_err_set(err, SL_EINVAL, "verify needs 1..%d secrets and a body",
                          RECV_VERIFY_MAX_SECRETS);
    if (msg_id == NULL || *msg_id == '\0')
        return sl_err_set(err, SL_EMISSING, "webhook-id header missing");
    if (timestamp_str == NULL || *timestamp_str == '\0')
        return sl_err_set(err, SL_EMISSING, "webhook-timestamp header missing");
    if (sig_header == NULL || *sig_header == '\0')
        return sl_err_set(err, SL_EMISSING, "webhook-signature header missing");
    if (parse_ts(timestamp_str, &ts) != 0)
        return sl_err_set(err, SL_EDECODE, "webhook-timestamp is not a decimal integer");
    size_t hlen = strlen(sig_header);
    if (hlen > RECV_VERIFY_HEADER_MAX)
        return sl_err_set(err, SL_ETOOBIG, "webhook-signature longer than %d bytes",
                          RECV_VERIFY_HEADER_MAX);
    if (tolerance_s >= 0 && (ts < now_s - tolerance_s || ts > now_s + tolerance_s))
        return sl_err_set(err, SL_EDENIED, "webhook-timestamp outside the %lld s tolerance",
                          (long long)tolerance_s);

    /* Signed content: "<id>.<ts>.<body>" (sizes bounded by the header and body caps). */
    size_t idlen = strlen(msg_id), tslen = strlen(timestamp_str);
    size_t clen = idlen + 1 + tslen + 1 + len;
    content = sl_xmalloc(clen ? clen : 1);
    memcpy(content, msg_id, idlen);
    content[idlen] = '.';
    memcpy(content + idlen + 1, timestamp_str, tslen);
    content[idlen + 1 + tslen] = '.';
    if (len > 0)
        memcpy(content + idlen + tslen + 2, body, len);
    for (size_t k = 0; k < n; k++) {
        unsigned int mlen = 0;
        if (HMAC(EVP_sha256(), secrets[k].key, (int)secrets[k].len, content, clen, macs[k],
                 &mlen) == NULL ||
            mlen != MAC_LEN) {
            rc = sl_err_set(err, SL_ECRYPTO, "hmac-sha256 failed");
            goto out;
        }
        EVP_EncodeBlock((unsigned char *)encoded[k], macs[k], MAC_LEN);
    }

    /* Walk "v1,<b64> v1,<b64> ..."; unknown versions are skipped, not errors. */
    const char *p = sig_header;
    int entries = 0;
    int matched = 0;
    while (*p) {
        while (*p == ' ')
            p++;
        if (*p == '\0')
            break;
        const char *e = p;
        while (*e && *e != ' ')
            e++;
        if (++entries > RECV_VERIFY_MAX_ENTRIES) {
            rc = sl_err_set(err, SL_ETOOBIG, "webhook-signature has more than %d entries",
                            RECV_VERIFY_MAX_ENTRIES);
            goto out;
        }
        const char *comma = memchr(p, ',', (size_t)(e - p));
        if (comma == NULL) {
            rc = sl_err_set(err, SL_EDECODE, "webhook-signature entry lacks a version");
            goto out;
        }
        if (comma - p == 2 && p[0] == 'v' && p[1] == '1') {
            /* Compare base64 text, not decoded bytes: only the canonical encoding of the
             * right MAC matches (decoders ignore the unused low bits of the last char). */
            const char *b64 = comma + 1;
            size_t blen = (size_t)(e - b64);
            if (blen != B64_MAC_LEN || !is_b64(b64, blen)) {
                rc = sl_err_set(err, SL_EDECODE,
                                "webhook-signature v1 entry is not a "
                                "base64 32-byte mac");
                goto out;
            }
            for (size_t k = 0; k < n; k++)
                matched |= CRYPTO_memcmp(b64, encoded[k], B64_MAC_LEN) == 0;
        }
        p = e;
    }
    if (matched) {
        rc = 0;
        sl_err_clear(err);
    } else {
        rc = sl_err_set(err, SL_ECRYPTO, "no signature matched");
    }
out:
    sl_secret_wipe(macs, sizeof(macs));
    sl_secret_wipe(encoded, sizeof(encoded));
    free(content);
    return rc;
}
