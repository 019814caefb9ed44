/*
 * sl_digest: fetched-once digests and one hashing context per thread (see sl_digest.h).
 *
 * The context lives in a thread-local pointer, and a pthread key whose destructor frees it
 * when its thread exits; the main thread's stays until the process ends, reachable from its
 * thread-local storage.
 */
#include "common/sl_digest.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static EVP_MD *mds[2];        /* by enum sl_digest_alg; NULL = OpenSSL could not fetch it */
static pthread_key_t ctx_key; /* its destructor frees a thread's context */
static bool ctx_key_ok;       /* ctx_key was created */
static _Thread_local EVP_MD_CTX *tl_ctx; /* this thread's context; NULL = not made yet */

static void ctx_free(void *p)
{
    EVP_MD_CTX_free(p);
    tl_ctx = NULL;
}

static void init_once(void)
{
    mds[SL_SHA1] = EVP_MD_fetch(NULL, "SHA1", NULL);
    mds[SL_SHA256] = EVP_MD_fetch(NULL, "SHA256", NULL);
    ctx_key_ok = pthread_key_create(&ctx_key, ctx_free) == 0;
}

const EVP_MD *sl_digest_md(enum sl_digest_alg alg)
{
    (void)pthread_once(&once, init_once);
    return alg == SL_SHA1 || alg == SL_SHA256 ? mds[alg] : NULL;
}

EVP_MD_CTX *sl_digest_ctx(void)
{
    if (tl_ctx)
        return tl_ctx;
    (void)pthread_once(&once, init_once);
    if (!ctx_key_ok)
        return NULL;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c && pthread_setspecific(ctx_key, c) != 0) {
        EVP_MD_CTX_free(c);
        c = NULL;
    }
    tl_ctx = c;
    return c;
}

int sl_digest_parts(
    enum sl_digest_alg alg, const void *const *parts, const size_t *lens, size_t n, uint8_t *out)
{
    const EVP_MD *md = sl_digest_md(alg);
    EVP_MD_CTX *c = sl_digest_ctx();
    size_t want = alg == SL_SHA1 ? 20 : 32;
    unsigned len = 0;
    bool ok = md && c && EVP_DigestInit_ex(c, md, NULL) == 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = lens[i] == 0 || EVP_DigestUpdate(c, parts[i], lens[i]) == 1;
    ok = ok && EVP_DigestFinal_ex(c, out, &len) == 1 && len == want;
    if (!ok)
        memset(out, 0, want);
    return ok ? 0 : -1;
}
