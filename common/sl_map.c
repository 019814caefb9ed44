/*
 * sl_map: seeded open-addressing hash map (see sl_map.h).
 *
 * Invariants: cap is a power of two >= MIN_CAP; count <= cap * 3 / 4; an empty slot has
 * key == NULL; every entry sits at or after its home slot (hash & mask) with no empty slot
 * in between (linear probing), which backward-shift deletion preserves.
 */
#include "common/sl_map.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/sl_mem.h"

#define MIN_CAP 8

struct slot {
    char *key;     /* owned copy; NULL = empty slot */
    size_t klen;   /* bytes of key, without the NUL */
    uint64_t hash; /* sl_siphash-1-3 of key under the map's seed */
    void *val;     /* caller's value */
};

struct sl_map {
    struct slot *slots;            /* cap entries */
    size_t cap;                    /* slots, a power of two */
    size_t count;                  /* occupied slots */
    uint8_t seed[SL_MAP_SEED_LEN]; /* SipHash key */
};

/* ==== SipHash (Aumasson & Bernstein), parameterised rounds ==== */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static inline void sipround(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = ROTL(v[1], 13);
    v[1] ^= v[0];
    v[0] = ROTL(v[0], 32);
    v[2] += v[3];
    v[3] = ROTL(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = ROTL(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = ROTL(v[1], 17);
    v[1] ^= v[2];
    v[2] = ROTL(v[2], 32);
}

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

uint64_t sl_siphash(const uint8_t k[SL_MAP_SEED_LEN], const void *data, size_t len, int c, int d)
{
    const uint8_t *in = data;
    uint64_t k0 = load_le64(k), k1 = load_le64(k + 8);
    uint64_t v[4] = {k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL,
                     k0 ^ 0x6c7967656e657261ULL, k1 ^ 0x7465646279746573ULL};
    size_t full = len & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(in + i);
        v[3] ^= m;
        for (int r = 0; r < c; r++)
            sipround(v);
        v[0] ^= m;
    }
    /* Last block: the remaining 0..7 bytes, with len mod 256 in the top byte. */
    uint64_t b = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[full + i] << (8 * i);
    v[3] ^= b;
    for (int r = 0; r < c; r++)
        sipround(v);
    v[0] ^= b;
    v[2] ^= 0xff;
    for (int r = 0; r < d; r++)
        sipround(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* ==== map ==== */

static uint64_t hash_key(const sl_map_t *m, const char *key, size_t klen)
{
    return sl_siphash(m->seed, key, klen, 1, 3);
}

static size_t cap_for(size_t hint)
{
    size_t cap = MIN_CAP;
    /* smallest power of two keeping hint entries at <= 3/4 load */
    while (cap / 4 * 3 < hint)
        cap *= 2;
    return cap;
}

sl_map_t *sl_map_new_seeded(size_t hint, const uint8_t seed[SL_MAP_SEED_LEN])
{
    sl_map_t *m = sl_xcalloc(1, sizeof(*m));
    m->cap = cap_for(hint);
    m->slots = sl_xcalloc(m->cap, sizeof(*m->slots));
    memcpy(m->seed, seed, SL_MAP_SEED_LEN);
    return m;
}

sl_map_t *sl_map_new(size_t hint)
{
    uint8_t seed[SL_MAP_SEED_LEN];
    size_t got = 0;
    while (got < sizeof(seed)) {
        ssize_t n = getrandom(seed + got, sizeof(seed) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            /* Linux >= 3.17 always has getrandom; without entropy the map would be
             * floodable, so refuse to run rather than degrade silently. */
            (void)fprintf(stderr,
                          "{\"level\":\"error\",\"event\":\"no_entropy\",\"msg\":\"getrandom "
                          "failed for the hash map seed\"}\n");
            abort();
        }
        got += (size_t)n;
    }
    sl_map_t *m = sl_map_new_seeded(hint, seed);
    sl_secret_wipe(seed, sizeof(seed));
    return m;
}

void sl_map_clear(sl_map_t *m, void (*free_val)(void *val))
{
    if (!m)
        return;
    for (size_t i = 0; i < m->cap; i++) {
        struct slot *s = &m->slots[i];
        if (!s->key)
            continue;
        if (free_val)
            free_val(s->val);
        free(s->key);
        memset(s, 0, sizeof(*s));
    }
    m->count = 0;
}

void sl_map_destroy(sl_map_t *m, void (*free_val)(void *val))
{
    if (!m)
        return;
    sl_map_clear(m, free_val);
    free(m->slots);
    sl_secret_wipe(m->seed, sizeof(m->seed));
    free(m);
}

size_t sl_map_count(const sl_map_t *m)
{
    return m->count;
}

/* Index of key's slot, or of the empty slot where it would go. The table is never full. */
static size_t probe(const sl_map_t *m, const char *key, size_t klen, uint64_t h)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)h & mask;
    for (;;) {
        const struct slot *s = &m->slots[i];
        if (!s->key)
            return i;
        if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0)
            return i;
        i = (i + 1) & mask;
    }
}

bool sl_map_find(const sl_map_t *m, const char *key, void **val)
{
    size_t klen = strlen(key);
    size_t i = probe(m, key, klen, hash_key(m, key, klen));
    if (!m->slots[i].key)
        return false;
    if (val)
        *val = m->slots[i].val;
    return true;
}

void *sl_map_get(const sl_map_t *m, const char *key)
{
    void *v = NULL;
    return sl_map_find(m, key, &v) ? v : NULL;
}

static void grow(sl_map_t *m)
{
    size_t ncap = m->cap * 2;
    struct slot *ns = sl_xcalloc(ncap, sizeof(*ns));
    size_t mask = ncap - 1;
    for (size_t i = 0; i < m->cap; i++) {
        struct slot *s = &m->slots[i];
        if (!s->key)
            continue;
        size_t j = (size_t)s->hash & mask;
        while (ns[j].key)
            j = (j + 1) & mask;
        ns[j] = *s;
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
}

bool sl_map_put(sl_map_t *m, const char *key, void *val, void **old)
{
    size_t klen = strlen(key);
    uint64_t h = hash_key(m, key, klen);
    size_t i = probe(m, key, klen, h);
    if (old)
        *old = NULL;
    if (m->slots[i].key) {
        if (old)
            *old = m->slots[i].val;
        m->slots[i].val = val;
        return true;
    }
    if ((m->count + 1) > m->cap / 4 * 3) {
        grow(m);
        i = probe(m, key, klen, h);
    }
    struct slot *s = &m->slots[i];
    s->key = sl_xstrndup(key, klen);
    s->klen = klen;
    s->hash = h;
    s->val = val;
    m->count++;
    return false;
}

bool sl_map_del(sl_map_t *m, const char *key, void **old)
{
    size_t klen = strlen(key);
    size_t mask = m->cap - 1;
    size_t i = probe(m, key, klen, hash_key(m, key, klen));
    if (!m->slots[i].key)
        return false;
    if (old)
        *old = m->slots[i].val;
    free(m->slots[i].key);
    /*
     * Backward shift: walk the cluster after the hole; an entry whose home slot is not
     * cyclically within (hole, j] would become unreachable behind the hole, so it moves
     * into the hole and its old slot becomes the new hole.
     */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct slot *s = &m->slots[j];
        if (!s->key)
            break;
        size_t home = (size_t)s->hash & mask;
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays)
            continue;
        m->slots[i] = *s;
        i = j;
    }
    memset(&m->slots[i], 0, sizeof(m->slots[i]));
    m->count--;
    return true;
}

bool sl_map_next(const sl_map_t *m, size_t *pos, const char **key, void **val)
{
    for (size_t i = *pos; i < m->cap; i++) {
        const struct slot *s = &m->slots[i];
        if (!s->key)
            continue;
        if (key)
            *key = s->key;
        if (val)
            *val = s->val;
        *pos = i + 1;
        return true;
    }
    *pos = m->cap;
    return false;
}
