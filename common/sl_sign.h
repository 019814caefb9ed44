/*
 * sl_sign: Standard Webhooks signatures (https://www.standardwebhooks.com/, spec v1.0.0).
 *
 * Signed content is "{msg_id}.{timestamp}.{body}". Two schemes, chosen per secret:
 *   v1  HMAC-SHA256 with the raw secret bytes as key; secrets are "whsec_" + base64 of 24..64
 *       random bytes.
 *   v1a Ed25519 (RFC 8032, pure); secrets are "whsk_" + base64 of the 32-byte private seed
 *       followed by the 32-byte public key (Svix's format); receivers get only the public
 *       key, "whpk_" + base64 of its 32 bytes (sl_secret_public).
 * The signature is base64-encoded and sent as `webhook-signature: <version>,<b64>`. During key
 * rotation there is one space-separated entry per active secret, in the order the secrets
 * were given ("v1,..." or "v1a,..." by kind), and a receiver accepts the message when any
 * entry matches any of its secrets (or public keys).
 *
 * Design: a signer (sl_signer_t) is built once per endpoint configuration. For HMAC it
 * keeps per secret the SHA-256 states after the key's inner and outer pad blocks (RFC 2104);
 * each signature copies them in turn into the thread's hashing context (common/sl_digest.h)
 * and feeds id, timestamp and body in separate updates, so the body is never copied.
 * Verification uses OpenSSL's EVP_MAC HMAC instead, so the two check each other. For
 * Ed25519 it keeps one EVP_PKEY per secret; pure Ed25519 has no streaming interface, so when
 * the signer holds an Ed25519 secret each signature copies "id.ts." + body into one heap
 * buffer (HMAC-only signers never copy). The message id must not contain '.' (the spec
 * requires it so the id/timestamp/body boundaries cannot be shifted) nor anything that is not
 * printable ASCII, as it travels in a header.
 *
 * Secrets never reach error messages: messages name the field and the problem only.
 *
 * thread: sl_secret_* and sl_verify are reentrant. A signer is immutable after
 * sl_signer_new: sl_signer_sign / sl_sign_headers may run concurrently on one signer (the
 * pad states are only read, by EVP_MD_CTX_copy_ex into each thread's own context; the
 * EVP_PKEYs are only read, each signature has its own EVP_MD_CTX); sl_signer_destroy must
 * not race with them.
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
/* "whsec_" + base64 of 64 bytes (88 chars) + NUL; also holds any "whsk_" secret (93 + NUL). */
#define SL_SECRET_STR_MAX (SL_SECRET_PREFIX_LEN + 88 + 1)

#define SL_SECRET_ED25519_PREFIX     "whsk_"
#define SL_SECRET_ED25519_PREFIX_LEN 5
#define SL_ED25519_SEED_BYTES        32 /* private seed (RFC 8032 "private key") */
#define SL_ED25519_PUB_BYTES         32 /* public key */
#define SL_ED25519_KEY_BYTES         64 /* a whsk_ secret: seed || public key */
#define SL_PUBKEY_PREFIX             "whpk_"
#define SL_PUBKEY_PREFIX_LEN         5
/* "whpk_" + base64 of 32 bytes (44 chars) + NUL. */
#define SL_PUBKEY_STR_MAX (SL_PUBKEY_PREFIX_LEN + 44 + 1)

#define SL_SIGNER_MAX_SECRETS 8  /* active secrets per endpoint (rotation overlap) */
#define SL_SIGN_MAC_LEN       32 /* HMAC-SHA256 output, bytes */
#define SL_SIGN_ED25519_LEN   64 /* Ed25519 signature, bytes */
#define SL_SIGN_ENTRY_LEN     47 /* HMAC entry: "v1," + 44 base64 chars */
#define SL_SIGN_V1A_ENTRY_LEN 92 /* Ed25519 entry: "v1a," + 88 base64 chars */
/* Signature header value for the maximum number of secrets (all Ed25519, the longer entry),
 * plus separators and NUL. */
#define SL_SIGN_HEADER_MAX    ((size_t)SL_SIGNER_MAX_SECRETS * (SL_SIGN_V1A_ENTRY_LEN + 1))
#define SL_SIGN_ID_MAX        255  /* bytes of a message id (webhook-id) */
#define SL_SIGN_TS_MAX        20   /* decimal digits of a non-negative int64, + NUL */
#define SL_VERIFY_HEADER_MAX  4096 /* longest webhook-signature value sl_verify will parse */
#define SL_VERIFY_MAX_ENTRIES 64   /* most entries in one webhook-signature value */
#define SL_VERIFY_TOLERANCE_S 300  /* default timestamp tolerance, as in every official library */

/* What a secret signs with. HMAC is 0, so a zeroed struct sl_secret is an HMAC secret. */
enum sl_secret_kind {
    SL_SECRET_HMAC = 0,    /* "whsec_": HMAC-SHA256, signature entries "v1," */
    SL_SECRET_ED25519 = 1, /* "whsk_": Ed25519, signature entries "v1a," */
};

/* Raw secret key bytes. Caller-allocated; sl_secret_fini wipes it. */
struct sl_secret {
    uint8_t key[SL_SECRET_MAX_BYTES]; /* HMAC: the key; ED25519: seed (0..32) || public key
                                         (32..64). Only the first len bytes are meaningful */
    size_t len;                       /* bytes: HMAC SL_SECRET_MIN_BYTES..SL_SECRET_MAX_BYTES;
                                         ED25519 exactly SL_ED25519_KEY_BYTES */
    enum sl_secret_kind kind;         /* scheme; HMAC when zeroed */
};

/* Fill s with an HMAC secret of SL_SECRET_GEN_BYTES bytes from RAND_bytes. Returns 0 or
 * SL_ECRYPTO (s wiped). */
int sl_secret_generate(struct sl_secret *s, sl_err_t *err);

/* Fill s with a new Ed25519 key pair (seed || public key, from OpenSSL's keygen). Returns 0 or
 * SL_ECRYPTO (s wiped). */
int sl_secret_generate_ed25519(struct sl_secret *s, sl_err_t *err);

/*
 * Parse a "whsec_<base64>" (HMAC) or "whsk_<base64>" (Ed25519) string (str borrowed,
 * NUL-terminated) into s, setting s->kind. A prefix is required (our own secrets always carry
 * it); the base64 may omit its padding (the official libraries accept that). A whsec_ key
 * must be 24..64 bytes; a whsk_ key exactly 64 (seed || public key), and its public half must
 * be the public key of its seed. Returns 0, SL_EMISSING (NULL/empty), SL_EDECODE (no known
 * prefix, bad base64), SL_ETOOBIG / SL_EINVAL (length; a whsk_ public half that does not
 * match its seed) or SL_ECRYPTO (OpenSSL failure); s is wiped on failure. Messages never
 * contain the secret.
 */
int sl_secret_parse(struct sl_secret *s, const char *str, sl_err_t *err);

/*
 * Format s as "whsec_<padded base64>" (HMAC) or "whsk_<padded base64>" (Ed25519) into out
 * (outlen bytes, >= SL_SECRET_STR_MAX is always enough). Returns 0, SL_EINVAL (bad s->len or
 * kind) or SL_ETOOBIG (out too small; out is then wiped to ""). The caller wipes out when
 * done with it.
 */
int sl_secret_format(const struct sl_secret *s, char *out, size_t outlen, sl_err_t *err);

/*
 * Format the public key of an Ed25519 secret as "whpk_<padded base64>" into out (outlen
 * bytes, >= SL_PUBKEY_STR_MAX is always enough). Not secret: it is what receivers verify v1a
 * signatures with. Returns 0, SL_EINVAL (s is not an Ed25519 secret) or SL_ETOOBIG (out too
 * small; out is then ""); out is "" on any failure when outlen > 0.
 */
int sl_secret_public(const struct sl_secret *s, char *out, size_t outlen, sl_err_t *err);

/* Wipe s (NULL-safe). */
void sl_secret_fini(struct sl_secret *s);

/* Opaque signer: keyed HMAC templates / Ed25519 keys for 1..SL_SIGNER_MAX_SECRETS secrets. */
typedef struct sl_signer sl_signer_t;

/*
 * Create a signer for n secrets (1..SL_SIGNER_MAX_SECRETS; secrets borrowed, copied into
 * OpenSSL contexts, so the caller may wipe them right after). *out (OUT) receives the
 * signer; the caller frees it with sl_signer_destroy. Secrets of both kinds may be mixed.
 * Returns 0, SL_EINVAL (n out of range, a secret with a bad length or kind, or an Ed25519
 * secret whose public half is not its seed's) or SL_ECRYPTO (OpenSSL failure); *out is NULL
 * on failure.
 */
int sl_signer_new(const struct sl_secret *secrets, size_t n, sl_signer_t **out, sl_err_t *err);

/* Free the signer and its keyed contexts and keys (NULL-safe). */
void sl_signer_destroy(sl_signer_t *sg);

/* Number of secrets (= signature entries produced). */
size_t sl_signer_count(const sl_signer_t *sg);

/*
 * Compute the webhook-signature header value "v1,<b64> v1a,<b64>..." (one entry per secret,
 * in order: "v1," for HMAC, "v1a," for Ed25519) over "msg_id.timestamp_s.body" into out
 * (outlen bytes; SL_SIGN_HEADER_MAX is always enough; the exact need is the sum of the
 * entries' lengths, SL_SIGN_ENTRY_LEN or SL_SIGN_V1A_ENTRY_LEN, plus one byte each). msg_id is
 * borrowed, 1..SL_SIGN_ID_MAX printable ASCII bytes without '.'; timestamp_s >= 0 (unix seconds);
 * body borrowed (NULL allowed when len == 0). Returns 0, SL_EINVAL (bad id/timestamp), SL_ETOOBIG
 * (out too small) or SL_ECRYPTO. On failure out is
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
    /* "webhook-signature: v1,<b64>[ v1a,<b64>...]" */
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
 * than v1 and v1a are ignored. v1 entries are checked against the HMAC secrets, v1a entries
 * against the public keys of the Ed25519 secrets (the receiver needs only the public half,
 * but a struct sl_secret carries the whole whsk_ key). A v1 or v1a entry must be valid
 * base64; one that does not decode to 32 (v1) or 64 (v1a) bytes simply cannot match. Every
 * usable entry is checked against every secret of its kind, with no early exit; HMAC
 * comparison is constant-time (CRYPTO_memcmp, after the length check), Ed25519 uses
 * EVP_DigestVerify (public data only). Each v1a entry costs one Ed25519 verification per
 * Ed25519 secret: at most 44 entries fit SL_VERIFY_HEADER_MAX.
 *
 * Returns 0 when any v1 or v1a signature matches a secret of its kind. Errors: SL_EINVAL (bad
 * arguments, a secret with a bad length or kind), SL_EMISSING (a header value NULL or empty),
 * SL_EDECODE (timestamp not a decimal integer, message id with '.', malformed signature
 * list, more than SL_VERIFY_MAX_ENTRIES entries, a v1 or v1a entry that is not base64),
 * SL_ETOOBIG (signature header longer than
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
