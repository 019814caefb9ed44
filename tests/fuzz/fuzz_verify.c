/*
 * fuzz_verify: sl_verify (common/sl_sign.h) on arbitrary webhook-id, webhook-timestamp and
 * webhook-signature values and body: what a receiver using Sluice's verifier is sent.
 *
 * Input: the id, the timestamp and the signature header, each ended by '\n', then the body
 * (the rest). Candidate secrets: one HMAC (whsec_) and one Ed25519 (whsk_) key, fixed.
 * Invariants: every result is 0 or a well-formed error; whatever the fuzzed signature says, a
 * header this signer makes for the fuzzed id and body at "now" verifies, and the fuzzed
 * header verifies only when it carries an entry equal to one the signer makes.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/sl_sign.h"
#include "fuzz_common.h"

#define NOW_S     1700000000 /* the receiver's clock */
#define FIELD_MAX 8192

/* 32 bytes of 0x01..0x20; the Ed25519 key is RFC 8032's TEST 1 seed and public key */
static const char HMAC_SECRET[] = "whsec_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";
static const char ED_SECRET[] =
    "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2DXWpgBgrEKt9VL/tPJZAc6DuFy89qmIyWvAhpo9wdRGg==";

/* The next field (up to '\n') of the input into out (NUL-terminated); false at the end. */
static bool field(const uint8_t **data, size_t *size, char *out)
{
    const uint8_t *nl = memchr(*data, '\n', *size);
    if (!nl)
        return false;
    size_t n = (size_t)(nl - *data);
    if (n >= FIELD_MAX)
        n = FIELD_MAX - 1;
    memcpy(out, *data, n);
    out[n] = '\0';
    *size -= (size_t)(nl - *data) + 1;
    *data = nl + 1;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct sl_secret secrets[2];
    static sl_signer_t *signer;
    static char id[FIELD_MAX], ts[FIELD_MAX], sig[FIELD_MAX];
    sl_err_t err = {0};
    if (!signer) {
        SL_FUZZ_CHECK(sl_secret_parse(&secrets[0], HMAC_SECRET, &err) == 0);
        SL_FUZZ_CHECK(sl_secret_parse(&secrets[1], ED_SECRET, &err) == 0);
        SL_FUZZ_CHECK(sl_signer_new(secrets, 2, &signer, &err) == 0);
    }
    if (!field(&data, &size, id) || !field(&data, &size, ts) || !field(&data, &size, sig))
        return 0;
    const uint8_t *body = size ? data : NULL;

    int rc = sl_verify(secrets, 2, id, ts, sig, body, size, NOW_S, SL_VERIFY_TOLERANCE_S, &err);
    if (rc != 0)
        SL_FUZZ_CHECK_ERR(rc, err);

    /* what the signer makes for this id and body verifies */
    static char good[SL_SIGN_HEADER_MAX];
    int src = sl_signer_sign(signer, id, NOW_S, body, size, good, sizeof(good), &err);
    if (src != 0) {
        SL_FUZZ_CHECK_ERR(src, err);
        return 0; /* an id the spec does not allow ('.', not printable, too long) */
    }
    char now[24];
    snprintf(now, sizeof(now), "%d", NOW_S);
    SL_FUZZ_CHECK(
        sl_verify(secrets, 2, id, now, good, body, size, NOW_S, SL_VERIFY_TOLERANCE_S, &err) == 0);
    /* the fuzzed header verified at the signer's timestamp only if it holds a genuine entry */
    if (rc == 0 && strcmp(ts, now) == 0) {
        bool genuine = false;
        for (char *e = good; e; e = strchr(e, ' ')) {
            if (*e == ' ')
                *e++ = '\0';
            char *end = strchr(e, ' ');
            char keep = end ? *end : '\0';
            if (end)
                *end = '\0';
            genuine |= strstr(sig, e) != NULL;
            if (end)
                *end = keep;
        }
        SL_FUZZ_CHECK(genuine);
    }
    return 0;
}
