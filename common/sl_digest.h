/*
 * sl_digest: SHA-1 and SHA-256 for the hashes made per delivery or per request (job ids,
 * webhook signatures, API keys, idempotency keys), through OpenSSL's EVP interface without
 * the two costs of its convenient form:
 *
 *   - EVP_sha256() and friends hand OpenSSL 3 a legacy descriptor, so every
 *     EVP_DigestInit_ex looks the implementation up again in the provider store (a lock, a
 *     name lookup, allocations); here each algorithm is fetched once per process;
 *   - EVP_MD_CTX_new / EVP_Digest allocate a context per hash; here each thread reuses one.
 *
 * OpenSSL 3.0 still allocates the algorithm's state once per EVP_DigestInit_ex or
 * EVP_MD_CTX_copy_ex; that one allocation is all that is left of a hash.
 *
 * thread: any. sl_digest_ctx returns the calling thread's own context, freed when the thread
 * exits; a caller uses it between two calls of its own and holds it across nothing else (no
 * other sl_digest function, no callback).
 */
#ifndef SL_DIGEST_H
#define SL_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

enum sl_digest_alg {
    SL_SHA1,   /* 20 bytes: job ids (sl_rstate_job_id) */
    SL_SHA256, /* 32 bytes: HMAC signatures, API key hashes, idempotency fingerprints */
};

#define SL_DIGEST_MAX 32 /* bytes of the longest digest here */

/* The fetched implementation of alg (process-wide, never freed), or NULL when OpenSSL
 * cannot provide it. */
const EVP_MD *sl_digest_md(enum sl_digest_alg alg);

/* The calling thread's reusable context (created at its first call), or NULL when OpenSSL
 * cannot allocate one. */
EVP_MD_CTX *sl_digest_ctx(void);

/*
 * out = alg(parts[0] || ... || parts[n-1]), lens[i] bytes each (a part may be NULL when its
 * length is 0). out holds the digest's length (20 or 32 bytes). Returns 0, or -1 when
 * OpenSSL fails (out is then zeroed).
 */
int sl_digest_parts(
    enum sl_digest_alg alg, const void *const *parts, const size_t *lens, size_t n, uint8_t *out);

#endif /* SL_DIGEST_H */
