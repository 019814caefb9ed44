/*
 * sl_jobkey: retry job ids and shards (see sl_jobkey.h).
 */
#include "common/sl_jobkey.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/sha.h>

void sl_jobkey_id(const char *endpoint_id, const char *event_id, char out[SL_JOBKEY_ID_LEN + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) == 1 &&
             EVP_DigestUpdate(ctx, endpoint_id, strlen(endpoint_id)) == 1 &&
             EVP_DigestUpdate(ctx, "\n", 1) == 1 &&
             EVP_DigestUpdate(ctx, event_id, strlen(event_id)) == 1 &&
             EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == SHA_DIGEST_LENGTH;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        /* without SHA-1 no job id is possible; a constant id would merge every retry chain */
        (void)fputs("sl_jobkey: cannot compute sha-1\n", stderr);
        abort();
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < SHA_DIGEST_LENGTH; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 0x0f];
    }
    out[SL_JOBKEY_ID_LEN] = '\0';
}

uint32_t sl_jobkey_shard(const char *job_id, uint32_t nshards)
{
    if (nshards == 0)
        nshards = 1;
    if (!job_id)
        return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = job_id[i];
        if (ch >= '0' && ch <= '9')
            v = v * 16 + (uint32_t)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v = v * 16 + (uint32_t)(ch - 'a' + 10);
        else
            return 0; /* also the NUL of a shorter id: nothing past it is read */
    }
    return v % nshards;
}
