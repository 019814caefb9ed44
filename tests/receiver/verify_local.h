/*
 * verify_local: Standard Webhooks signature verification for the test receiver only.
 *
 * A stop-gap until the receiver switches to common/sl_sign.h. recv_verify() deliberately has
 * the same parameters, return codes and meaning as sl_verify(), so the swap is a rename plus
 * struct recv_secret -> struct sl_secret (one difference: tolerance_s < 0 disables the
 * timestamp check here; with sl_verify pass INT64_MAX instead).
 *
 * Scheme: webhook-signature is a space-separated list of "<version>,<base64>"; a v1 entry is
 * base64(HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")); the key is the base64
 * part of a "whsec_..." secret. Built on OpenSSL's one-shot HMAC() (not deprecated in 3.0),
 * EVP_EncodeBlock and constant-time CRYPTO_memcmp of the base64 text (so only the canonical
 * encoding matches); EVP_DecodeBlock only for the secret.
 *
 * thread: any; all functions are reentrant.
 */
#ifndef SL_RECV_VERIFY_LOCAL_H
#define SL_RECV_VERIFY_LOCAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"

#define RECV_SECRET_MAX_BYTES   64   /* longest HMAC key accepted from a whsec_ secret */
#define RECV_VERIFY_HEADER_MAX  4096 /* longest webhook-signature value parsed */
#define RECV_VERIFY_MAX_ENTRIES 16   /* most signatures in one webhook-signature header */
#define RECV_VERIFY_MAX_SECRETS 8    /* most candidate secrets per call */

/* Raw secret key bytes. Caller-allocated; recv_secret_fini wipes it. */
struct recv_secret {
    uint8_t key[RECV_SECRET_MAX_BYTES]; /* HMAC key; first len bytes meaningful */
    size_t len;                         /* bytes, 1..RECV_SECRET_MAX_BYTES */
};

/*
 * Parse "whsec_<base64>" (str borrowed, NUL-terminated; padding optional) into s.
 * Returns 0, SL_EMISSING (no whsec_ prefix), SL_EDECODE (not base64) or SL_ETOOBIG (key
 * longer than RECV_SECRET_MAX_BYTES). Messages never contain the secret.
 */
int recv_secret_parse(struct recv_secret *s, const char *str, sl_err_t *err);

/* Wipe s (NULL-safe). */
void recv_secret_fini(struct recv_secret *s);

/*
 * Verify one received webhook. secrets: n (1..RECV_VERIFY_MAX_SECRETS) candidate secrets
 * (borrowed). msg_id,
 * timestamp_str, sig_header: raw header values (borrowed, NUL-terminated; NULL = absent).
 * body/len: the raw request body (NULL allowed when len == 0). now_s: unix seconds;
 * tolerance_s: allowed clock skew both ways in seconds, < 0 disables the check.
 *
 * Returns 0 when any v1 signature matches any secret. Errors: SL_EINVAL (bad arguments),
 * SL_EMISSING (a header absent or empty), SL_EDECODE (timestamp not a decimal integer, bad
 * signature list or base64), SL_ETOOBIG (header longer than RECV_VERIFY_HEADER_MAX or more
 * than RECV_VERIFY_MAX_ENTRIES entries), SL_EDENIED (timestamp outside the tolerance),
 * SL_ECRYPTO (no signature matched, or OpenSSL failed).
 */
int recv_verify(const struct recv_secret *secrets,
                size_t n,
                const char *msg_id,
                const char *timestamp_str,
                const char *sig_header,
                const uint8_t *body,
                size_t len,
                int64_t now_s,
                int64_t tolerance_s,
                sl_err_t *err);

#endif /* SL_RECV_VERIFY_LOCAL_H */
