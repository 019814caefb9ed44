/*
 * Unit tests for common/sl_digest: known SHA-1 and SHA-256 values (FIPS 180 "abc" and the
 * empty message), any split of a message into parts hashes like the whole (against OpenSSL's
 * one-shot EVP_Digest), empty and NULL parts, a context per thread that stays the same
 * within the thread and is not shared across threads, and threads hashing at once, each
 * getting the right digest. Contexts of exited threads are freed: the ASan stage's
 * LeakSanitizer would report them otherwise.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "common/sl_digest.h"
#include "common/sl_hex.h"

static void
hex_of(enum sl_digest_alg alg, const void *const *parts, const size_t *lens, size_t n, char *out)
{
    uint8_t md[SL_DIGEST_MAX];
    assert_int_equal(sl_digest_parts(alg, parts, lens, n, md), 0);
    sl_hex_encode(md, alg == SL_SHA1 ? 20 : 32, out);
}

static void test_known_values(void **state)
{
    (void)state;
    char hex[2 * SL_DIGEST_MAX + 1];
    const void *abc[] = {"abc"};
    const size_t abc_len[] = {3};
    hex_of(SL_SHA1, abc, abc_len, 1, hex);
    assert_string_equal(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
    hex_of(SL_SHA256, abc, abc_len, 1, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* no parts, and a NULL part of length 0: the empty message */
    hex_of(SL_SHA1, NULL, NULL, 0, hex);
    assert_string_equal(hex, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    const void *none[] = {NULL};
    const size_t zero[] = {0};
    hex_of(SL_SHA256, none, zero, 1, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* two algorithms in turn on the one thread context */
    hex_of(SL_SHA1, abc, abc_len, 1, hex);
    assert_string_equal(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
}

/* Every split of a 200-byte message into three parts (with empty ones) hashes like the whole. */
static void test_parts_equal_whole(void **state)
{
    (void)state;
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i * 131 + 7);
    static const enum sl_digest_alg algs[] = {SL_SHA1, SL_SHA256};
    for (size_t a = 0; a < 2; a++) {
        uint8_t want[EVP_MAX_MD_SIZE];
        unsigned wlen = 0;
        assert_int_equal(EVP_Digest(msg, sizeof(msg), want, &wlen,
                                    algs[a] == SL_SHA1 ? EVP_sha1() : EVP_sha256(), NULL),
                         1);
        for (size_t i = 0; i <= sizeof(msg); i += 13) {
            for (size_t j = i; j <= sizeof(msg); j += 29) {
                const void *parts[] = {msg, msg + i, msg + j};
                const size_t lens[] = {i, j - i, sizeof(msg) - j};
                uint8_t got[SL_DIGEST_MAX];
                assert_int_equal(sl_digest_parts(algs[a], parts, lens, 3, got), 0);
                assert_memory_equal(got, want, wlen);
            }
        }
    }
}

struct worker {
    EVP_MD_CTX *ctx; /* the thread's context, as sl_digest_ctx returned it */
    int same;        /* sl_digest_ctx returned the same one every time */
    int wrong;       /* digests that differed from the expected value */
    uint8_t seed;    /* what the thread hashes */
};

static void *worker_main(void *p)
{
    struct worker *w = p;
    uint8_t msg[100];
    memset(msg, w->seed, sizeof(msg));
    uint8_t want[32];
    unsigned wlen = 0;
    if (EVP_Digest(msg, sizeof(msg), want, &wlen, EVP_sha256(), NULL) != 1)
        w->wrong = -1;
    w->ctx = sl_digest_ctx();
    w->same = 1;
    for (int i = 0; i < 2000; i++) {
        const void *parts[] = {msg, msg + 40};
        const size_t lens[] = {40, 60};
        uint8_t got[32];
        if (sl_digest_parts(SL_SHA256, parts, lens, 2, got) != 0 || memcmp(got, want, 32) != 0)
            w->wrong++;
        if (sl_digest_ctx() != w->ctx)
            w->same = 0;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    enum { N = 4 };
    struct worker w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        w[i] = (struct worker){.seed = (uint8_t)(0x41 + i)};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    /* made by test_known_values before the workers started, so alive all along: a worker's
     * context can never have its address */
    EVP_MD_CTX *mine = sl_digest_ctx();
    assert_non_null(mine);
    assert_ptr_equal(sl_digest_ctx(), mine);
    for (int i = 0; i < N; i++) {
        assert_int_equal(w[i].wrong, 0);
        assert_true(w[i].same);
        assert_non_null(w[i].ctx);
        assert_ptr_not_equal(w[i].ctx, mine);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_parts_equal_whole),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
