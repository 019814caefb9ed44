/*
 * prod_gen: synthetic deliveries (see prod_gen.h). The body template is laid out once; per
 * record only the sequence digits and the filler are rewritten in place.
 */
#include "producer/prod_gen.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sl_mem.h"

#define SEQ_DIGITS 20                    /* digits of UINT64_MAX */
#define POOL_BYTES ((size_t)1024 * 1024) /* filler pool beyond one body, bytes */

static const char FILL_CHARS[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"; /* 64 */

static uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Decimal digits of v at out (no NUL); returns the count. */
static size_t u64_dec(char *out, uint64_t v)
{
    char tmp[SEQ_DIGITS];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

int prod_gen_init(struct prod_gen *g,
                  uint64_t count,
                  uint32_t endpoints,
                  size_t body_bytes,
                  size_t max_body,
                  const char *prefix,
                  const char *type,
                  const char *run,
                  sl_err_t *err)
{
    static const char head[] = "{\"seq\":";
    static const char mid[] = ",\"data\":\"";
    static const char tail[] = "\"}";
    char maxep[SL_ENDPOINT_ID_MAX + 32];

    memset(g, 0, sizeof(*g));
    if (endpoints < 1 || endpoints > PROD_GEN_MAX_ENDPOINTS)
        return sl_err_set(err, SL_EINVAL, "--endpoints must be in 1..%d", PROD_GEN_MAX_ENDPOINTS);
    if (body_bytes > max_body)
        return sl_err_set(err, SL_ETOOBIG, "--body-bytes exceeds max_body_bytes (%zu)", max_body);
    /* The longest endpoint id decides whether every one is valid. */
    int n = snprintf(maxep, sizeof(maxep), "%s%" PRIu32, prefix, endpoints - 1);
    if (n < 0 || (size_t)n >= sizeof(maxep) || !sl_valid_endpoint_id(maxep, (size_t)n))
        return sl_err_set(err, SL_EINVAL,
                          "--endpoint-prefix must be [A-Za-z0-9_-] and leave room for the "
                          "endpoint number within %d bytes",
                          SL_ENDPOINT_ID_MAX);
    if (!sl_valid_event_type(type, strlen(type)))
        return sl_err_set(err, SL_EINVAL, "--type must be 1..%d bytes of 0x21..0x7e",
                          SL_EVENT_TYPE_MAX);
    if (run) {
        size_t rl = strlen(run);
        if (rl < 1 || rl > PROD_GEN_RUN_MAX || !sl_valid_event_id(run, rl))
            return sl_err_set(err, SL_EINVAL, "run id must be 1..%d event id characters",
                              PROD_GEN_RUN_MAX);
        memcpy(g->run, run, rl + 1);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        (void)snprintf(g->run, sizeof(g->run), "%" PRIx64 "%04x",
                       (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000,
                       (unsigned)getpid() & 0xffffu);
    }
    /* "evt_" + run + "_" + 20 digits always fits SL_EVENT_ID_MAX (4+32+1+20 < 128). */

    g->count = count;
    g->endpoints = endpoints;
    g->prefix = sl_xstrdup(prefix);
    g->type = sl_xstrdup(type);
    g->body_len = body_bytes;
    g->body = sl_xmalloc(body_bytes + 1);
    g->rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)count;
    g->id_fixed = (size_t)snprintf(g->id, sizeof(g->id), "evt_%s_", g->run);
    g->ep_fixed = strlen(g->prefix);
    memcpy(g->ep, g->prefix, g->ep_fixed);
    size_t fixed = sizeof(head) - 1 + SEQ_DIGITS + sizeof(mid) - 1 + sizeof(tail) - 1;
    if (body_bytes >= fixed) {
        uint8_t *b = g->body;
        memcpy(b, head, sizeof(head) - 1);
        g->seq_off = sizeof(head) - 1;
        memcpy(b + g->seq_off + SEQ_DIGITS, mid, sizeof(mid) - 1);
        g->fill_off = g->seq_off + SEQ_DIGITS + sizeof(mid) - 1;
        g->fill_len = body_bytes - fixed;
        memcpy(b + g->fill_off + g->fill_len, tail, sizeof(tail) - 1);
    } else {
        g->seq_off = 0;
        g->fill_off = 0;
        g->fill_len = body_bytes;
    }
    g->body[body_bytes] = '\0';
    if (g->fill_len) {
        g->pool_len = g->fill_len + POOL_BYTES;
        g->pool = sl_xmalloc(g->pool_len);
        for (size_t i = 0; i < g->pool_len;) {
            uint64_t r = xorshift64(&g->rng);
            for (int k = 0; k < 10 && i < g->pool_len; k++, i++) { /* 10 x 6 bits per draw */
                g->pool[i] = (uint8_t)FILL_CHARS[r & 63];
                r >>= 6;
            }
        }
    }
    return 0;
}

const struct sl_delivery *prod_gen_next(struct prod_gen *g)
{
    if (g->n >= g->count)
        return NULL;
    uint64_t n = g->n++;
    /* ids: "evt_<run>_" and "<prefix>" are fixed; only the numbers are written per record */
    g->id[g->id_fixed + u64_dec(g->id + g->id_fixed, n)] = '\0';
    g->ep[g->ep_fixed + u64_dec(g->ep + g->ep_fixed, n % g->endpoints)] = '\0';
    if (g->seq_off) {
        /* fixed width so the body length never changes: JSON forbids leading zeros in
         * numbers, so the padding is spaces (insignificant whitespace) */
        char digits[SEQ_DIGITS];
        size_t nd = u64_dec(digits, n);
        memset(g->body + g->seq_off, ' ', SEQ_DIGITS - nd);
        memcpy(g->body + g->seq_off + SEQ_DIGITS - nd, digits, nd);
    }
    if (g->fill_len) {
        /* a slice of the pool at a random offset: cheap, and as incompressible per batch
         * as fresh random text, because the pool is much larger than lz4's 64 KiB window */
        size_t off = (size_t)(xorshift64(&g->rng) % (g->pool_len - g->fill_len + 1));
        memcpy(g->body + g->fill_off, g->pool + off, g->fill_len);
    }
    memset(&g->d, 0, sizeof(g->d));
    g->d.id = g->id;
    g->d.ep = g->ep;
    g->d.type = g->type;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g->d.ts_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    g->d.body = g->body_len ? g->body : NULL;
    g->d.body_len = g->body_len;
    return &g->d;
}

void prod_gen_fini(struct prod_gen *g)
{
    if (!g)
        return;
    free(g->prefix);
    free(g->type);
    free(g->body);
    free(g->pool);
    g->prefix = g->type = NULL;
    g->body = g->pool = NULL;
}
