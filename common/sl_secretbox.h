/*
 * sl_secretbox: endpoint secrets encrypted at rest (PostgreSQL `endpoints`, the compacted
 * sluice.endpoints topic) with one 256-bit master key (env SLUICE_MASTER_KEY).
 *
 * Box format, version 1 (AES-256-GCM):
 *   1 byte version (0x01) | 12-byte random nonce | ciphertext (= plaintext length) | 16-byte tag
 * The associated data is the endpoint id, so a box copied onto another endpoint's row does
 * not open. The version byte selects the format; any value but 1 is refused before
 * decryption. Nonces are random (RAND_bytes): one box per secret change keeps a master key
 * far below the 2^32-message bound for random 96-bit GCM nonces.
 *
 * Error messages may name the endpoint id (an identifier), never plaintext or key bytes.
 *
 * thread: any; no shared state.
 */
#ifndef SL_SECRETBOX_H
#define SL_SECRETBOX_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"

#define SL_MASTERKEY_LEN       32 /* bytes (AES-256) */
#define SL_SECRETBOX_VERSION   1
#define SL_SECRETBOX_NONCE_LEN 12 /* bytes */
#define SL_SECRETBOX_TAG_LEN   16 /* bytes */
#define SL_SECRETBOX_OVERHEAD  (1 + SL_SECRETBOX_NONCE_LEN + SL_SECRETBOX_TAG_LEN)
#define SL_SECRETBOX_MAX_PLAIN 65536 /* bytes of plaintext one box may hold */
#define SL_SECRETBOX_MAX_AD    1024  /* bytes of endpoint id */

/* The master key. Caller-allocated; sl_masterkey_fini wipes it. */
struct sl_masterkey {
    uint8_t key[SL_MASTERKEY_LEN]; /* AES-256 key bytes */
};

/*
 * Parse a master key given as 64 hex characters (either case) or as base64 of 32 bytes
 * (44 characters with padding or 43 without). str is borrowed, NUL-terminated; no
 * whitespace is accepted. Returns 0, SL_EMISSING (NULL/empty) or SL_EINVAL with a message
 * that gives the expected form and the length seen, never the value. mk is wiped on failure.
 */
int sl_masterkey_parse(struct sl_masterkey *mk, const char *str, sl_err_t *err);

/* Wipe mk (NULL-safe). */
void sl_masterkey_fini(struct sl_masterkey *mk);

/*
 * Encrypt len bytes of plain (borrowed; NULL allowed when len == 0; at most
 * SL_SECRETBOX_MAX_PLAIN) for the endpoint endpoint_id (borrowed, NUL-terminated, 1..
 * SL_SECRETBOX_MAX_AD bytes) into out (outcap bytes, at least len + SL_SECRETBOX_OVERHEAD).
 * *outlen (OUT) receives len + SL_SECRETBOX_OVERHEAD. Returns 0, SL_EINVAL, SL_ETOOBIG or
 * SL_ECRYPTO.
 */
int sl_secretbox_seal(const struct sl_masterkey *mk,
                      const char *endpoint_id,
                      const uint8_t *plain,
                      size_t len,
                      uint8_t *out,
                      size_t outcap,
                      size_t *outlen,
                      sl_err_t *err);

/*
 * Decrypt the box (borrowed, boxlen bytes) sealed for endpoint_id into out (outcap bytes, at
 * least boxlen - SL_SECRETBOX_OVERHEAD). *outlen (OUT) receives the plaintext length.
 * Returns 0; SL_EDECODE (shorter than the overhead); SL_EVERSION (unknown version byte);
 * SL_ETOOBIG (out too small, or box larger than the maximum); SL_EINVAL (bad arguments);
 * SL_ECRYPTO "could not decrypt secret for endpoint X: authentication failed" for a wrong
 * key, wrong endpoint or any modified byte. On any failure out is wiped (outcap bytes) and
 * *outlen is 0. The caller wipes out (sl_secret_wipe) when done with the plaintext.
 */
int sl_secretbox_open(const struct sl_masterkey *mk,
                      const char *endpoint_id,
                      const uint8_t *box,
                      size_t boxlen,
                      uint8_t *out,
                      size_t outcap,
                      size_t *outlen,
                      sl_err_t *err);

#endif /* SL_SECRETBOX_H */
