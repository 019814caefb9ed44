/*
 * api_auth: who may call sluice-api. API keys (common/sl_apikey: random, stored only as a
 * SHA-256 hash in PostgreSQL) are cached in memory: a thread reloads every active key every
 * api_key_refresh_ms and swaps the new set in, so a revocation takes effect within that
 * interval on every instance, and a PostgreSQL outage keeps the last set in force (logged
 * once per outage) instead of locking everyone out. Until the first load succeeds,
 * authenticated routes answer 503.
 *
 * A request presents `Authorization: Bearer slk_...`. The check parses the token, finds the
 * key by id, compares hashes in constant time, then the scope. The per-key rate limit is a
 * token bucket in Redis (one Lua script, Redis's clock), shared by every instance.
 *
 * Nothing here logs a token, a hash or a secret: only key ids.
 *
 * thread: api_keys_check / api_auth_fini from any thread; start/stop on the main thread.
 */
#ifndef API_AUTH_H
#define API_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sl_apikey.h"
#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_redis.h"

typedef struct api_keys api_keys_t;
struct api_keyset; /* one loaded set of keys (refcounted) */

/* The caller of one request: key is valid while the reference to set is held. */
struct api_auth {
    struct api_keyset *set;      /* reference, or NULL (no key needed / not checked) */
    const struct sl_apikey *key; /* the caller's key inside set */
};

/* Start the cache and its reload thread (cfg borrowed for the process's life). */
api_keys_t *api_keys_start(const struct sl_config *cfg);
/* Stop the reload thread and free the cache (NULL-safe). Waits for the thread up to 1 s: one
 * stuck on an unresponsive PostgreSQL is left running with the cache (the process is
 * exiting), so a stop never hangs on it. */
void api_keys_stop(api_keys_t *k);
/* True once a set was loaded from PostgreSQL. */
bool api_keys_loaded(api_keys_t *k);

/*
 * What one client connection last authenticated with (libmicrohttpd's per-connection
 * context): a keep-alive client sends the same key on every request, so the check skips
 * parsing and hashing while the key set is unchanged. Zero-initialise; api_auth_memo_fini
 * on close (it wipes the token).
 */
struct api_auth_memo {
    char tok[SL_APIKEY_TOKEN_MAX]; /* the token as presented ("" = none) */
    struct api_keyset *set;        /* reference to the set it was found in, or NULL */
    const struct sl_apikey *key;   /* the key inside set */
};
void api_auth_memo_fini(struct api_auth_memo *m);

/*
 * Check an Authorization header value (borrowed; NULL = absent) for scope bits need:
 * returns 0 and fills out (api_auth_fini it), or the HTTP status to answer: 401 (missing,
 * malformed, unknown or revoked key), 403 (scope), 503 (keys not loaded yet); *why (OUT) a
 * static reason for the problem's detail. memo (NULL allowed): the connection's memo, used
 * and updated.
 */
int api_keys_check(api_keys_t *k,
                   const char *authz,
                   unsigned need,
                   struct api_auth_memo *memo,
                   struct api_auth *out,
                   const char **why);
void api_auth_fini(struct api_auth *a);

/*
 * Take one token from key's bucket (rate_per_s, burst) in Redis. Returns 0 when allowed (or
 * the key is unlimited), else the milliseconds until a token is there (> 0). When Redis
 * cannot be asked, returns 0 (fail open) and fills err so the caller can log it.
 */
int64_t api_keys_take(sl_redis_t *r, const struct sl_apikey *key, sl_err_t *err);

#endif /* API_AUTH_H */
