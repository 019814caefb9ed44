/*
 * sl_apikey: API keys of the HTTP API server sluice-api, and their table api_keys
 * (sql/0007_api_keys.sql), written by `sluicectl keys ...`.
 *
 * A key is the text "slk_" + id + "_" + secret (64 characters):
 *   id      16 characters [a-z0-9], random; names the key (not secret: logs and `keys list`
 *           show it);
 *   secret  43 characters of unpadded base64url (RFC 4648 section 5) encoding 32 bytes from
 *           RAND_bytes; the unused low bits of the last character are zero, so every key has
 *           exactly one accepted spelling.
 * Only SHA-256 of the 32 secret bytes is stored; the key is shown once at creation. A server
 * authenticates a presented key with sl_apikey_parse (id + hash of what was presented), looks
 * the id up and compares hashes with sl_apikey_hash_equal (constant time).
 *
 * Secrets never reach messages: sl_apikey_parse's messages name the problem, never the input;
 * callers log key ids only.
 *
 * thread: any; pure functions except sl_apikey_generate (RAND_bytes, thread-safe) and the
 * sl_apikey_db_* functions (one PGconn per thread, as libpq requires). A struct sl_apikey is
 * a plain value owned by whoever holds it.
 */
#ifndef SL_APIKEY_H
#define SL_APIKEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "common/sl_err.h"

#define SL_APIKEY_ID_LEN       16 /* [a-z0-9] */
#define SL_APIKEY_TOKEN_MAX    96 /* buffer for a key text, NUL included */
#define SL_APIKEY_PREFIX       "slk_"
#define SL_APIKEY_PREFIX_LEN   4
#define SL_APIKEY_SECRET_BYTES 32 /* random bytes of the secret part (256 bits) */
#define SL_APIKEY_SECRET_CHARS 43 /* their unpadded base64url */
#define SL_APIKEY_HASH_LEN     32 /* SHA-256 */
/* Length of every key text: "slk_" + id + "_" + secret = 64. */
#define SL_APIKEY_TOKEN_LEN    (SL_APIKEY_PREFIX_LEN + SL_APIKEY_ID_LEN + 1 + SL_APIKEY_SECRET_CHARS)
#define SL_APIKEY_NAME_MAX     128        /* bytes of a key's display name */
#define SL_APIKEY_CHANNEL_MAX  64         /* bytes of a channel name, [A-Za-z0-9_.:-] */
#define SL_APIKEY_CHANNELS_MAX 16         /* channels per key */
#define SL_APIKEY_RATE_MAX     2147483647 /* rate_per_s and burst (PostgreSQL integer) */
/* "publish,read,admin" + NUL: enough for sl_apikey_scopes_format. */
#define SL_APIKEY_SCOPES_STR_MAX 20

/* Scopes (bits). Admin implies read and publish: sl_apikey_allows. */
enum { SL_SCOPE_PUBLISH = 1, SL_SCOPE_READ = 2, SL_SCOPE_ADMIN = 4 };
#define SL_SCOPE_ALL (SL_SCOPE_PUBLISH | SL_SCOPE_READ | SL_SCOPE_ADMIN)

/* One key as stored (no secret). Zero-initialise, fill, free with sl_apikey_fini. */
struct sl_apikey {
    char id[SL_APIKEY_ID_LEN + 1];    /* [a-z0-9]{16} */
    char *name;                       /* owned; display name, <= SL_APIKEY_NAME_MAX bytes, may
                                         be NULL for "" on insert */
    uint8_t hash[SL_APIKEY_HASH_LEN]; /* SHA-256 of the 32 secret bytes */
    unsigned scopes;                  /* SL_SCOPE_* bits, at least one */
    char **channels;                  /* owned (each string and the array); NULL/empty = every
                                         channel */
    size_t n_channels;                /* entries in channels, <= SL_APIKEY_CHANNELS_MAX */
    int64_t rate_per_s;               /* requests per second; 0 = unlimited */
    int64_t burst;                    /* token bucket size; 0 = rate_per_s */
    int64_t created_ms;               /* unix ms (from the database; ignored on insert) */
    int64_t revoked_ms;               /* unix ms; 0 = active (ignored on insert) */
};

/* Free what k owns and zero it (NULL-safe; k may be zero-initialised). */
void sl_apikey_fini(struct sl_apikey *k);

/*
 * Make a new key: token (OUT) receives the key text "slk_<id>_<secret>" (NUL-terminated,
 * SL_APIKEY_TOKEN_LEN characters), id (OUT) its id, hash (OUT) the SHA-256 of the 32 random
 * secret bytes. Randomness from RAND_bytes. The caller shows token once and wipes it
 * (sl_secret_wipe). Returns 0 or SL_ECRYPTO (token, id and hash are then zeroed).
 */
int sl_apikey_generate(char token[SL_APIKEY_TOKEN_MAX],
                       char id[SL_APIKEY_ID_LEN + 1],
                       uint8_t hash[32],
                       sl_err_t *err);

/*
 * Parse a presented key (tok borrowed, len bytes, untrusted, need not be NUL-terminated): on
 * success id (OUT) holds its id and hash (OUT) the SHA-256 of its secret bytes. Strict: exactly
 * SL_APIKEY_TOKEN_LEN bytes, the "slk_" prefix, id [a-z0-9]{16}, '_', canonical unpadded
 * base64url of 32 bytes. Returns 0 or SL_EINVAL with a message that never contains the token
 * (id and hash are then zeroed). The decoded secret is wiped before returning.
 */
int sl_apikey_parse(
    const char *tok, size_t len, char id[SL_APIKEY_ID_LEN + 1], uint8_t hash[32], sl_err_t *err);

/* Compare two hashes in constant time (CRYPTO_memcmp). */
bool sl_apikey_hash_equal(const uint8_t a[32], const uint8_t b[32]);

/* True when s (len bytes, borrowed) is a key id: [a-z0-9]{16}. */
bool sl_apikey_id_valid(const char *s, size_t len);

/*
 * Parse a comma-separated scope list ("publish,read"; list borrowed, NUL-terminated) into
 * *out (OUT: SL_SCOPE_* bits). Each item is publish, read or admin; repeats are harmless;
 * empty lists and empty items are refused. Returns 0 or SL_EINVAL (message names the bad
 * item, cut to 32 bytes).
 */
int sl_apikey_scopes_parse(const char *list, unsigned *out, sl_err_t *err);

/*
 * Format scopes as "publish,read,admin" (those present, in that order; "" for none) into buf
 * (cap bytes, NUL-terminated when cap > 0; SL_APIKEY_SCOPES_STR_MAX is always enough, a
 * smaller buffer gets a truncated text).
 */
void sl_apikey_scopes_format(unsigned scopes, char *buf, size_t cap);

/*
 * True when k may do what needs the scopes in need (SL_SCOPE_* bits): k holds all of them,
 * or holds SL_SCOPE_ADMIN (which implies every scope). A revoked key (revoked_ms != 0)
 * allows nothing; need 0 asks only "is the key active".
 */
bool sl_apikey_allows(const struct sl_apikey *k, unsigned need);

/*
 * True when k may use channel ch (borrowed, NUL-terminated): k has no channel list, or ch is
 * exactly one of its channels. A NULL ch is allowed only by keys without a list.
 */
bool sl_apikey_channel_allowed(const struct sl_apikey *k, const char *ch);

/*
 * True when k sees an endpoint with these channels (borrowed): k has no channel list, or one
 * of channels is k's. An endpoint without channels is seen only by keys without a list.
 */
bool sl_apikey_sees_channels(const struct sl_apikey *k, char *const *channels, size_t n);

/* True when s (len bytes, borrowed) is a channel name: 1..64 bytes of [A-Za-z0-9_.:-]. */
bool sl_apikey_channel_valid(const char *s, size_t len);

/*
 * Parse a comma-separated channel list ("orders,billing.eu"; list borrowed) into *out (OUT:
 * array of owned strings, caller frees each and the array, or hands them to a struct
 * sl_apikey) and *n (OUT). "" gives an empty list (every channel). Each item must be a valid
 * channel name, at most SL_APIKEY_CHANNELS_MAX items, no repeats. Returns 0 or SL_EINVAL
 * (nothing allocated; the message names the problem).
 */
int sl_apikey_channels_parse(const char *list, char ***out, size_t *n, sl_err_t *err);

/*
 * Check k against the table's rules (id, name, scopes, channels, rate_per_s and burst in
 * 0..SL_APIKEY_RATE_MAX). Returns 0 or SL_EINVAL naming the field.
 */
int sl_apikey_validate(const struct sl_apikey *k, sl_err_t *err);

/* ==== PostgreSQL (pg borrowed; statements run in the caller's transaction, if any) ==== */

/*
 * Insert k (validated first: SL_EINVAL) as a new active key; created_at/updated_at are the
 * database's now(), k->created_ms and k->revoked_ms are ignored. Returns 0, SL_EINVAL,
 * SL_ESTATE (a key with that id exists) or SL_EPG.
 */
int sl_apikey_db_insert(PGconn *pg, const struct sl_apikey *k, sl_err_t *err);

/*
 * Every key (revoked ones too when include_revoked), ordered by created_at, id, hashes
 * included. *out (OUT) receives an array the caller frees with sl_apikey_fini on each element
 * and free() on the array (NULL when *n is 0); *n (OUT) the count. A row that breaks the
 * rules (a malformed hash, a channel listed twice: written by hand) is left out and counted
 * in *skipped (OUT), the reason of the last one in *err: that key does not authenticate, and
 * every other key still loads (one bad row must not freeze the API's key set, revocations
 * included). Returns 0 or SL_EPG.
 */
int sl_apikey_db_list(PGconn *pg,
                      bool include_revoked,
                      struct sl_apikey **out,
                      size_t *n,
                      size_t *skipped,
                      sl_err_t *err);

/*
 * Revoke key id (borrowed): sets revoked_at and updated_at to now() when it is active.
 * *changed (OUT) is true when this call revoked it, false when it was revoked already
 * (idempotent). Returns 0, SL_EINVAL (id is not a key id), SL_ENOTFOUND (no such key) or
 * SL_EPG.
 */
int sl_apikey_db_revoke(PGconn *pg, const char *id, bool *changed, sl_err_t *err);

#endif /* SL_APIKEY_H */
