/*
 * sl_sign: Standard Webhooks signatures (https://www.standardwebhooks.com/, spec v1.0.0).
 *
 * Signed content is "{msg_id}.{timestamp}.{body}"; the signature is HMAC-SHA256 with the raw
 * secret bytes as key, base64-encoded and sent as `webhook-signature: v1,<b64>`. During key
 * rotation there is one space-separated `v1,<b64>` entry per active secret, in the order the
 * secrets were given, and a receiver accepts the message when any entry matches any of its
 * secrets. Secrets are presented as "whsec_" + base64 of 24..64 random bytes.
 *
 * Design: a signer (sl_signer_t) is built once per endpoint configuration. It fetches the
 * EVP_MAC "HMAC" implementation once and keeps one keyed EVP_MAC_CTX template per secret;
 * each signature duplicates a template (EVP_MAC_CTX_dup) and feeds id, timestamp and body in
 * separate updates, so the body is never copied. The message id must not contain '.' (the
 * spec requires it so the id/timestamp/body boundaries cannot be shifted) nor anything that
 * is not printable ASCII, as it travels in a header.
 *
 * Secrets never reach error messages: messages name the field and the problem only.
 *
 * thread: sl_secret_* and sl_verify are reentrant. A signer is immutable after
 * sl_signer_new: sl_signer_sign / sl_sign_headers may run concurrently on one signer (the
 * templates are only read, by EVP_MAC_CTX_dup); sl_signer_destroy must not race with them.
 */
#ifndef SL_SIGN_H
#define SL_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"

#define SL_SECRET_PREFIX     "whsec_"
#define SL_SECRET_PREFIX_LEN 6
#define SL_SECRET_MIN_BYTES  24 /* spec: at least 192 bits */
#define SL_SECRET_MAX_BYTES  64 /* spec: at most 512 bits */
#define SL_SECRET_GEN_BYTES  32 /* what sl_secret_generate makes */
/* "whsec_" + base64 of 64 bytes (88 chars) + NUL. */
#define SL_SECRET_STR_MAX (SL_SECRET_PREFIX_LEN + 88 + 1)

#define SL_SIGNER_MAX_SECRETS 8  /* active secrets per endpoint (rotation overlap) */
#define SL_SIGN_MAC_LEN       32 /* HMAC-SHA256 output, bytes */
#define SL_SIGN_ENTRY_LEN     47 /* "v1," + 44 base64 chars */
/* Signature header value for the maximum number of secrets, plus separators and NUL. */
#define SL_SIGN_HEADER_MAX    (SL_SIGNER_MAX_SECRETS * (SL_SIGN_ENTRY_LEN + 1))
#define SL_SIGN_ID_MAX        255  /* bytes of a message id (webhook-id) */
#define SL_SIGN_TS_MAX        20   /* decimal digits of a non-negative int64, + NUL */
#define SL_VERIFY_HEADER_MAX  4096 /* longest webhook-signature value sl_verify will parse */
#define SL_VERIFY_MAX_ENTRIES 64   /* most entries in one webhook-signature value */
#define SL_VERIFY_TOLERANCE_S 300  /* default timestamp tolerance, as in every official library */

/* Raw secret key bytes. Caller-allocated; sl_secret_fini wipes it. */
struct sl_secret {
    uint8_t key[SL_SECRET_MAX_BYTES]; /* HMAC key; only the first len bytes are meaningful */
    size_t len;                       /* bytes, SL_SECRET_MIN_BYTES..SL_SECRET_MAX_BYTES */
};

/* Fill s with SL_SECRET_GEN_BYTES bytes from RAND_bytes. Returns 0 or SL_ECRYPTO. */
int sl_secret_generate(struct sl_secret *s, sl_err_t *err);

/*
 * Parse a "whsec_<base64>" string (str borrowed, NUL-terminated) into s. The prefix is
 * required (our own secrets always carry it); the base64 may omit its padding (the official
 * libraries accept that); the decoded key must be 24..64 bytes. Returns 0, SL_EMISSING
 * (NULL/empty), SL_EDECODE (no prefix, bad base64) or SL_ETOOBIG / SL_EINVAL (length); s is
 * wiped on failure. Messages never contain the secret.
 */
int sl_secret_parse(struct sl_secret *s, const char *str, sl_err_t *err);

/*
 * Format s as "whsec_<padded base64>" into out (outlen bytes, >= SL_SECRET_STR_MAX is always
 * enough). Returns 0, SL_EINVAL (bad s->len) or SL_ETOOBIG (out too small; out is then
 * wiped to ""). The caller wipes out when done with it.
 */
int sl_secret_format(const struct sl_secret *s, char *out, size_t outlen, sl_err_t *err);

/* Wipe s (NULL-safe). */
void sl_secret_fini(struct sl_secret *s);

/* Opaque signer: keyed HMAC templates for 1..SL_SIGNER_MAX_SECRETS secrets. */
typedef struct sl_signer sl_signer_t;

/*
 * Create a signer for n secrets (1..SL_SIGNER_MAX_SECRETS; secrets borrowed, copied into
 * OpenSSL contexts, so the caller may wipe them right after). *out (OUT) receives the
 * signer; the caller frees it with sl_signer_destroy. Returns 0, SL_EINVAL (n out of range
 * or a secret with a bad length) or SL_ECRYPTO (OpenSSL failure; *out is NULL).
 */
int sl_signer_new(const struct sl_secret *secrets, size_t n, sl_signer_t **out, sl_err_t *err);

/* Free the signer and its keyed contexts (NULL-safe). */
void sl_signer_destroy(sl_signer_t *sg);

/* Number of secrets (= signature entries produced). */
size_t sl_signer_count(const sl_signer_t *sg);

/*
 * Compute the webhook-signature header value "v1,<b64> v1,<b64>..." (one entry per secret,
 * in order) over "msg_id.timestamp_s.body" into out (outlen bytes; SL_SIGN_HEADER_MAX is
 * always enough). msg_id is borrowed, 1..SL_SIGN_ID_MAX printable ASCII bytes without '.';
 * timestamp_s >= 0 (unix seconds); body borrowed (NULL allowed when len == 0). Returns 0,
 * SL_EINVAL (bad id/timestamp), SL_ETOOBIG (out too small) or SL_ECRYPTO. On failure out is
 * "" (when outlen > 0).
 */
int sl_signer_sign(const sl_signer_t *sg,
                   const char *msg_id,
                   int64_t timestamp_s,
                   const uint8_t *body,
                   size_t len,
                   char *out,
                   size_t outlen,
                   sl_err_t *err);

/* The three complete header lines for one attempt, ready for curl_slist_append. */
struct sl_sign_headers {
    /* "webhook-id: <msg_id>" */
    char id[sizeof("webhook-id: ") + SL_SIGN_ID_MAX];
    /* "webhook-timestamp: <unix seconds>" */
    char timestamp[sizeof("webhook-timestamp: ") + SL_SIGN_TS_MAX];
    /* "webhook-signature: v1,<b64>[ v1,<b64>...]" */
    char signature[sizeof("webhook-signature: ") + SL_SIGN_HEADER_MAX];
};

/*
 * Sign as sl_signer_sign and write the three header lines into *out (caller-allocated,
 * bounded by construction). Returns what sl_signer_sign returns; on failure all three lines
 * are "".
 */
int sl_sign_headers(const sl_signer_t *sg,
                    const char *msg_id,
                    int64_t timestamp_s,
                    const uint8_t *body,
                    size_t len,
                    struct sl_sign_headers *out,
                    sl_err_t *err);

/*
 * Verify a received webhook (for C receivers and our test receiver). secrets: n candidate
 * secrets (1..SL_SIGNER_MAX_SECRETS, borrowed). msg_id, timestamp_str and sig_header are the
 * raw webhook-id, webhook-timestamp and webhook-signature header values (borrowed,
 * NUL-terminated); body/len the raw request body (NULL allowed when len == 0). now_s is the
 * receiver's clock (unix seconds); tolerance_s the allowed skew both ways (>= 0; pass
 * SL_VERIFY_TOLERANCE_S for the standard 5 minutes).
 *
 * sig_header is a space-separated list of "<version>,<base64>"; entries of versions other
 * than v1 are ignored; a v1 entry must be valid base64, and one that does not decode to 32
 * bytes simply cannot match. Comparison is constant-time (CRYPTO_memcmp, after the length
 * check), against every secret.
 *
 * Returns 0 when any v1 signature matches any secret. Errors: SL_EINVAL (bad arguments),
 * SL_EMISSING (a header value NULL or empty), SL_EDECODE (timestamp not a decimal integer,
 * message id with '.', malformed signature list, more than SL_VERIFY_MAX_ENTRIES entries,
 * a v1 entry that is not base64), SL_ETOOBIG (signature header longer than
 * SL_VERIFY_HEADER_MAX), SL_EDENIED (timestamp too old or too new), SL_ECRYPTO (no
 * signature matched, or OpenSSL failure). Messages never contain signatures or secrets.
 */
int sl_verify(const struct sl_secret *secrets,
              size_t n,
              const char *msg_id,
              const char *timestamp_str,
              const char *sig_header,
              const uint8_t *body,
              size_t len,
              int64_t now_s,
              int64_t tolerance_s,
              sl_err_t *err);

#endif /* SL_SIGN_H */
