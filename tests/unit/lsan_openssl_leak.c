/*
 * lsan_openssl_leak: the program tests/unit/lsan_openssl.sh runs under LeakSanitizer (ASan
 * builds only). It signs with a real signer (common/sl_sign.c: OpenSSL's one-time
 * initialisation, the HMAC fetch, a keyed template and its per-signature copy), then keys one
 * more HMAC-SHA256 context exactly as sl_signer_new keys its templates (keyed_ctx, reached by
 * including sl_sign.c: it is static there).
 *
 *   lsan_openssl_leak leak    drops that context: LeakSanitizer must report it
 *   lsan_openssl_leak clean   frees it: nothing may be reported (OpenSSL's own one-time
 *                             allocations are not leaks of ours)
 *
 * Exit status: 0, or 1 when OpenSSL fails, 2 for bad usage (LeakSanitizer's own exit code is
 * set by the driver).
 */
#include <stdio.h>
#include <string.h>

#include "common/sl_sign.c"

/* The only reference to the leaked context lives here until it is cleared. */
static EVP_MAC_CTX *volatile held;

/* Keys a context like sl_signer_new and keeps it only in `held`. noinline: its frame (and any
 * copy of the pointer in it) is gone before the stack is scrubbed. */
__attribute__((noinline)) static int make_ctx(EVP_MAC *mac, const struct sl_secret *s)
{
    held = keyed_ctx(mac, s->key, s->len);
    return held ? 0 : -1;
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
    if (make_ctx(sg->mac, &s) != 0) {
        fprintf(stderr, "lsan_openssl_leak: could not key an hmac-sha256 context\n");
        goto out;
    }
    if (!leak)
        EVP_MAC_CTX_free(held);
    held = NULL;
    scrub_stack();
    rc = 0;
out:
    sl_signer_destroy(sg);
    sl_secret_fini(&s);
    return rc;
}
