/*
 * lsan_openssl_leak: the program tests/unit/lsan_openssl.sh runs under LeakSanitizer (ASan
 * builds only). It signs with a real signer (common/sl_sign.c: OpenSSL's one-time
 * initialisation, the SHA-256 fetch, a keyed HMAC and its per-signature copies into the
 * thread's hashing context of common/sl_digest.c), then keys one more HMAC-SHA256 exactly as
 * sl_signer_new keys its secrets (hmac_key_init, reached by including sl_sign.c: it is static
 * there).
 *
 *   lsan_openssl_leak leak    drops that key's two contexts: LeakSanitizer must report them
 *   lsan_openssl_leak clean   frees them: nothing may be reported (OpenSSL's own one-time
 *                             allocations are not leaks of ours, and the thread's hashing
 *                             context stays reachable from its thread-local storage)
 *
 * Exit status: 0, or 1 when OpenSSL fails, 2 for bad usage (LeakSanitizer's own exit code is
 * set by the driver).
 */
#include <stdio.h>
#include <string.h>

#include "common/sl_sign.c"

/* The only references to the leaked contexts live here until they are cleared. */
static struct hmac_key held;

/* Keys an HMAC like sl_signer_new and keeps it only in `held`. noinline: its frame (and any
 * copy of the pointers in it) is gone before the stack is scrubbed. */
__attribute__((noinline)) static int make_key(const struct sl_secret *s)
{
    return hmac_key_init(&held, s->key, s->len);
}

/* Overwrite the dead stack below main so no stale copy of the pointer keeps it reachable. */
__attribute__((noinline)) static void scrub_stack(void)
{
    volatile unsigned char buf[16384];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = 0;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "leak") != 0 && strcmp(argv[1], "clean") != 0)) {
        fprintf(stderr, "usage: lsan_openssl_leak leak|clean\n");
        return 2;
    }
    int leak = strcmp(argv[1], "leak") == 0;
    int rc = 1;
    sl_err_t err;
    struct sl_secret s;
    sl_signer_t *sg = NULL;
    char sig[SL_SIGN_ENTRY_LEN + 1];
    static const uint8_t body[] = "{\"order\":42}";
    if (sl_secret_generate(&s, &err) != 0 || sl_signer_new(&s, 1, &sg, &err) != 0 ||
        sl_signer_sign(sg, "msg_lsan", 1700000000, body, sizeof(body) - 1, sig, sizeof(sig),
                       &err) != 0) {
        fprintf(stderr, "lsan_openssl_leak: %s\n", err.msg);
        goto out;
    }
    if (make_key(&s) != 0) {
        fprintf(stderr, "lsan_openssl_leak: could not key an hmac-sha256 context\n");
        goto out;
    }
    if (!leak)
        hmac_key_fini(&held);
    *(struct hmac_key *volatile)&held = (struct hmac_key){0};
    scrub_stack();
    rc = 0;
out:
    sl_signer_destroy(sg);
    sl_secret_fini(&s);
    return rc;
}
