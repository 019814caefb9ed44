/*
 * sl_secretbox: the master keys, endpoint secrets encrypted at rest (PostgreSQL `endpoints`,
 * the compacted sluice.endpoints topic), and the MAC keys that authenticate endpoint records.
 *
 * Master keys (option master_key, env SLUICE_MASTER_KEY): one to SL_MASTERKEYS_MAX entries
 * separated by commas, each `id:key` or a bare `key` (its id is "default"); key = 32 bytes as
 * 64 hex characters or base64. The first entry is the current key: it seals new boxes and
 * signs records; the others only open and verify (a rotation's overlap). Ids are
 * [A-Za-z0-9_-]{1,16}, unique, and so are the keys.
 *
 * Box formats (AES-256-GCM, random 12-byte nonce, 16-byte tag):
 *   version 2: 0x02 | id length (1 byte) | key id | nonce | ciphertext | tag
 *              associated data = endpoint id | 0x00 | key id
 *   version 1: 0x01 | nonce | ciphertext | tag, associated data = endpoint id (sealed before
 *              keys had ids; opened with whichever configured key fits, never written)
 * The endpoint id in the associated data keeps a box copied onto another endpoint from
 * opening; the key id names the key that opens it. Nonces are random (RAND_bytes): one box per
 * secret change keeps a key far below the 2^32-message bound for random 96-bit GCM nonces.
 *
 * Record MAC keys: HKDF-SHA256 of each master key (info "sluice endpoint record mac v1"), so
 * the AES key is never used for anything but boxes. sl_masterkey_mac computes
 * HMAC-SHA256 with the key of a given id (see sl_endpoints.h for what a record's MAC covers).
 *
 * Error messages may name endpoint and key ids (identifiers), never plaintext or key bytes.
 *
 * thread: any; no shared state.
 */
#ifndef SL_SECRETBOX_H
#define SL_SECRETBOX_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"

#define SL_MASTERKEY_LEN       32        /* bytes (AES-256) */
#define SL_MASTERKEYS_MAX      4         /* keys one master_key value may hold */
#define SL_MASTERKEY_ID_MAX    16        /* bytes of a key id */
#define SL_MASTERKEY_ID_BARE   "default" /* the id of a key given without one */
#define SL_RECORD_MAC_LEN      32        /* bytes (HMAC-SHA256) */
#define SL_SECRETBOX_VERSION   2         /* the version seal() writes */
#define SL_SECRETBOX_NONCE_LEN 12        /* bytes */
#define SL_SECRETBOX_TAG_LEN   16        /* bytes */
/* bytes a box adds to its plaintext at most (a version 2 box with the longest key id) */
#define SL_SECRETBOX_OVERHEAD                                                                      \
    (2 + SL_MASTERKEY_ID_MAX + SL_SECRETBOX_NONCE_LEN + SL_SECRETBOX_TAG_LEN)
#define SL_SECRETBOX_MAX_PLAIN 65536 /* bytes of plaintext one box may hold */
#define SL_SECRETBOX_MAX_AD    1024  /* bytes of endpoint id */

/* One master key. */
struct sl_masterkey_entry {
    char id[SL_MASTERKEY_ID_MAX + 1]; /* key id, NUL-terminated */
    uint8_t key[SL_MASTERKEY_LEN];    /* AES-256-GCM key of the boxes */
    uint8_t mac[SL_MASTERKEY_LEN];    /* HMAC-SHA256 key of endpoint records (HKDF of key) */
};

/* The master keys. Caller-allocated; sl_masterkey_fini wipes it. */
struct sl_masterkey {
    struct sl_masterkey_entry k[SL_MASTERKEYS_MAX]; /* k[0] is current */
    size_t n;                                       /* entries in k, 1..SL_MASTERKEYS_MAX */
};

/*
 * Parse a master_key value (see above). str is borrowed, NUL-terminated; no whitespace is
 * accepted. Returns 0, SL_EMISSING (NULL/empty) or SL_EINVAL with a message that names the
 * entry (1-based) and gives the expected form and the length seen, never the value. mk is
 * wiped on failure.
 */
int sl_masterkey_parse(struct sl_masterkey *mk, const char *str, sl_err_t *err);

/* Wipe mk (NULL-safe). */
void sl_masterkey_fini(struct sl_masterkey *mk);

/* The key with this id, or NULL (kid NULL = the current key). */
const struct sl_masterkey_entry *sl_masterkey_find(const struct sl_masterkey *mk, const char *kid);

/*
 * HMAC-SHA256 of the n parts (parts[i], lens[i] bytes; borrowed) with the record MAC key of
 * key kid (NULL = current) into out. Returns 0, or SL_ECRYPTO "master key 'X' is not
 * configured" / an OpenSSL failure.
 */
int sl_masterkey_mac(const struct sl_masterkey *mk,
                     const char *kid,
                     const void *const *parts,
                     const size_t *lens,
                     size_t n,
                     uint8_t out[SL_RECORD_MAC_LEN],
                     sl_err_t *err);

/*
 * The id of the key that sealed box (boxlen bytes, borrowed) into out: "" for a version 1
 * box (no id). Returns 0, or SL_EDECODE for a box too short to say or whose id is not 1..
 * SL_MASTERKEY_ID_MAX characters of [A-Za-z0-9_-].
 */
int sl_secretbox_kid(const uint8_t *box, size_t boxlen, char out[SL_MASTERKEY_ID_MAX + 1]);

/*
 * Encrypt len bytes of plain (borrowed; NULL allowed when len == 0; at most
 * SL_SECRETBOX_MAX_PLAIN) for the endpoint endpoint_id (borrowed, NUL-terminated, 1..
 * SL_SECRETBOX_MAX_AD bytes) with the current key into a version 2 box in out (outcap bytes,
 * at least len + SL_SECRETBOX_OVERHEAD). *outlen (OUT) receives the box's length. Returns 0,
 * SL_EINVAL, SL_ETOOBIG or SL_ECRYPTO.
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
 * least the plaintext's length, which is below boxlen). *outlen (OUT) receives the plaintext
 * length. A version 2 box opens with the key its id names; a version 1 box with whichever key
 * fits. Returns 0; SL_EDECODE (shorter than its format); SL_EVERSION (unknown version byte);
 * SL_ETOOBIG (out too small, or box larger than the maximum); SL_EINVAL (bad arguments);
 * SL_ECRYPTO "... sealed with master key 'X', which is not configured", or "could not
 * decrypt secret for endpoint X: authentication failed" for a wrong key, wrong endpoint or
 * any modified byte. On any failure out is wiped (outcap bytes) and
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
