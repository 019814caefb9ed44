/*
 * sl_sign_vector: signing cases for the Standard Webhooks interop test.
 *
 *   sl_sign_vector --out DIR [--count N]
 *
 * Writes DIR/body-<i>.bin (random UTF-8 bodies, 0..4096 bytes, some JSON-like, some with
 * multi-byte characters; the official Python library decodes bodies as UTF-8) and prints
 * on stdout one JSON document:
 *   {"vector": {secret, msg_id, timestamp, body_file, signature},   <- the published vector
 *    "cases": [{"secrets": ["whsec_..."], "headers": ["webhook-id: ...", ...],
 *               "msg_id", "timestamp", "body_file"}]}
 * Each case has 1..3 random secrets of 24, 32 or 64 bytes and is signed with the current
 * time through sl_sign_headers, exactly as the consumer does. verify_standardwebhooks.py
 * checks every case with the official `standardwebhooks` package. Test-only: the secrets
 * printed are random throwaways.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <openssl/rand.h>

#include "common/sl_sign.h"

#define MAX_BODY 4096

static uint32_t rnd(uint32_t bound)
{
    uint32_t v = 0;
    if (RAND_bytes((unsigned char *)&v, sizeof(v)) != 1) {
        (void)fputs("sl_sign_vector: random generator failed\n", stderr);
        abort();
    }
    return bound ? v % bound : v;
}

/* Append one random UTF-8 character (1..4 bytes) if it fits in cap; returns bytes written. */
static size_t put_char(uint8_t *b, size_t cap)
{
    static const char *const multi[] = {"\xc3\xa9",        "\xc3\x9f",     "\xe2\x82\xac",
                                        "\xe6\x97\xa5",    "\xe6\x9c\xac", "\xf0\x9f\x98\x80",
                                        "\xf0\x9f\x8e\x89"};
    static const char ascii[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                " {}[]:,.\"\\/-_+=!?#$%&'()*;<>@^`|~\n\t";
    if (rnd(8) == 0) {
        const char *m = multi[rnd(sizeof(multi) / sizeof(multi[0]))];
        size_t n = strlen(m);
        if (n > cap)
            return 0;
        memcpy(b, m, n);
        return n;
    }
    if (cap < 1)
        return 0;
    b[0] = (uint8_t)ascii[rnd(sizeof(ascii) - 1)];
    return 1;
}

static size_t make_body(size_t i, uint8_t *b)
{
    if (i == 0)
        return 0; /* empty body */
    if (i == 1) {
        static const char payload[] = "{\"test\": 2432232314}";
        memcpy(b, payload, sizeof(payload) - 1);
        return sizeof(payload) - 1;
    }
    size_t want = i % 5 == 0 ? MAX_BODY : rnd(MAX_BODY + 1);
    size_t n = 0;
    if (i % 2 == 0 && want >= 16) { /* JSON-shaped */
        n += (size_t)snprintf((char *)b, want, "{\"i\":%zu,\"s\":\"", i);
        while (n < want - 2) {
            size_t w = put_char(b + n, want - 2 - n);
            if (w == 0)
                break;
            /* keep it JSON-ish: no raw quotes or backslashes inside the string */
            if (b[n] == '"' || b[n] == '\\')
                b[n] = '_';
            n += w;
        }
        b[n++] = '"';
        b[n++] = '}';
        return n;
    }
    while (n < want) {
        size_t w = put_char(b + n, want - n);
        if (w == 0)
            break;
        n += w;
    }
    return n;
}

static int write_file(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return -1;
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int rc = (n && fwrite(b, 1, n, f) != n) ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

static void random_id(char *out, size_t len)
{
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(out, "msg_", 4);
    for (size_t k = 4; k < len; k++)
        out[k] = alnum[rnd(sizeof(alnum) - 1)];
    out[len] = '\0';
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long count = 100;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--out") == 0 && a + 1 < argc) {
            dir = argv[++a];
        } else if (strcmp(argv[a], "--count") == 0 && a + 1 < argc) {
            char *end = NULL;
            errno = 0;
            count = strtol(argv[++a], &end, 10);
            if (errno || !end || *end || count < 1 || count > 100000) {
                fprintf(stderr, "sl_sign_vector: --count must be 1..100000\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: sl_sign_vector --out DIR [--count N]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: sl_sign_vector --out DIR [--count N]\n");
        return 2;
    }

    int rc = 1;
    json_t *root = json_object();
    json_t *cases = json_array();
    uint8_t *body = malloc(MAX_BODY + 8);
    sl_signer_t *sg = NULL;
    sl_err_t err = {0};
    if (!root || !cases || !body)
        goto out;

    /* The published vector, signed by our signer; Python compares with the official sign(). */
    {
        static const char vsecret[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        static const char vid[] = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        struct sl_secret s;
        if (sl_secret_parse(&s, vsecret, &err) != 0 || sl_signer_new(&s, 1, &sg, &err) != 0)
            goto fail;
        size_t n = make_body(1, body);
        char sig[SL_SIGN_HEADER_MAX];
        if (sl_signer_sign(sg, vid, 1614265330, body, n, sig, sizeof(sig), &err) != 0 ||
            write_file(dir, "vector.bin", body, n) != 0)
            goto fail;
        sl_signer_destroy(sg);
        sg = NULL;
        sl_secret_fini(&s);
        json_object_set_new(root, "vector",
                            json_pack("{s:s, s:s, s:I, s:s, s:s}", "secret", vsecret, "msg_id", vid,
                                      "timestamp", (json_int_t)1614265330, "body_file",
                                      "vector.bin", "signature", sig));
    }

    for (long i = 0; i < count; i++) {
        static const size_t lens[] = {SL_SECRET_MIN_BYTES, SL_SECRET_GEN_BYTES,
                                      SL_SECRET_MAX_BYTES};
        struct sl_secret s[3];
        size_t nsec = 1 + (size_t)i % 3;
        json_t *jsecrets = json_array();
        for (size_t k = 0; k < nsec; k++) {
            if (k == 0 && i % 2 == 0) {
                if (sl_secret_generate(&s[k], &err) != 0)
                    goto fail;
            } else {
                memset(&s[k], 0, sizeof(s[k]));
                s[k].len = lens[rnd(3)];
                if (RAND_bytes(s[k].key, (int)s[k].len) != 1)
                    goto fail;
            }
            char str[SL_SECRET_STR_MAX];
            if (sl_secret_format(&s[k], str, sizeof(str), &err) != 0)
                goto fail;
            json_array_append_new(jsecrets, json_string(str));
        }
        if (sl_signer_new(s, nsec, &sg, &err) != 0)
            goto fail;
        size_t n = make_body((size_t)i, body);
        char id[32];
        random_id(id, 4 + 1 + rnd(26));
        int64_t ts = (int64_t)time(NULL);
        struct sl_sign_headers h;
        if (sl_sign_headers(sg, id, ts, body, n, &h, &err) != 0)
            goto fail;
        char name[64];
        snprintf(name, sizeof(name), "body-%ld.bin", i);
        if (write_file(dir, name, body, n) != 0) {
            fprintf(stderr, "sl_sign_vector: cannot write %s/%s\n", dir, name);
            goto out;
        }
        json_array_append_new(cases,
                              json_pack("{s:o, s:[s,s,s], s:s, s:I, s:s}", "secrets", jsecrets,
                                        "headers", h.id, h.timestamp, h.signature, "msg_id", id,
                                        "timestamp", (json_int_t)ts, "body_file", name));
        sl_signer_destroy(sg);
        sg = NULL;
        for (size_t k = 0; k < nsec; k++)
            sl_secret_fini(&s[k]);
    }
    json_object_set(root, "cases", cases);
    if (json_dumpf(root, stdout, JSON_INDENT(1)) != 0 || fflush(stdout) != 0)
        goto out;
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "sl_sign_vector: %s\n", err.msg[0] ? err.msg : "failed");
out:
    sl_signer_destroy(sg);
    json_decref(cases);
    json_decref(root);
    free(body);
    return rc;
}
