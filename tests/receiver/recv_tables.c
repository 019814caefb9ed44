/*
 * recv_tables: attempt counters, token buckets, accepted-id set (contract in recv_tables.h).
 *
 * attempts: open addressing (linear probing) of 64-bit keys, load <= 1/2, 0 = empty slot.
 * buckets and accepted ids: chained hashing with power-of-two bucket arrays.
 */
#include "recv_tables.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_err.h"
#include "common/sl_log.h"

struct rate_bucket {
    struct rate_bucket *next; /* chain */
    uint64_t per_second;      /* refill rate, tokens/s (also the capacity, at least 1) */
    double tokens;            /* tokens available now */
    int64_t last_ms;          /* monotonic ms of the last refill */
    char name[];              /* endpoint name, NUL-terminated */
};

struct accepted {
    struct accepted *next; /* chain */
    uint64_t key;          /* recv_key(endpoint, id) */
    size_t ep_len;         /* bytes of the endpoint name at data[0] (NUL follows) */
    char data[];           /* "<endpoint>\0<id>\0" */
};

#define RATE_NBUCKETS 1024 /* fixed chain heads for rate buckets (names are few) */

struct recv_tables {
    pthread_mutex_t att_mu; /* guards att_* */
    uint64_t *att_keys;     /* slots; 0 = empty */
    uint32_t *att_counts;   /* attempts seen per slot */
    size_t att_cap;         /* slots (power of two) */
    size_t att_len;         /* used slots */

    pthread_mutex_t rate_mu;                 /* guards rate_* */
    struct rate_bucket *rate[RATE_NBUCKETS]; /* chains by name hash */
    size_t rate_len;                         /* buckets allocated */
    struct rate_bucket *rate_overflow;       /* shared by names beyond RECV_BUCKETS_MAX */

    pthread_mutex_t acc_mu; /* guards acc_* */
    struct accepted **acc;  /* chain heads, acc_cap of them (power of two) */
    size_t acc_cap;         /* chain heads */
    size_t acc_len;         /* entries remembered */
    size_t acc_max;         /* cap on entries */
    uint64_t acc_dropped;   /* entries not remembered */
};

/* ==== hashing ==== */

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* splitmix64 finalizer: spreads FNV's weak low bits. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t recv_key(const char *endpoint, const char *id)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, endpoint);
    h ^= 0xff; /* separator: ("ab","c") != ("a","bc") */
    h *= 0x100000001b3ULL;
    h = mix64(fnv1a(h, id));
    return h ? h : 1;
}

/* ==== life cycle ==== */

recv_tables_t *recv_tables_new(size_t max_ids)
{
    recv_tables_t *t = sl_xcalloc(1, sizeof(*t));
    pthread_mutex_init(&t->att_mu, NULL);
    pthread_mutex_init(&t->rate_mu, NULL);
    pthread_mutex_init(&t->acc_mu, NULL);
    t->att_cap = 1024;
    t->att_keys = sl_xcalloc(t->att_cap, sizeof(*t->att_keys));
    t->att_counts = sl_xcalloc(t->att_cap, sizeof(*t->att_counts));
    t->acc_cap = 1024;
    t->acc = sl_xcalloc(t->acc_cap, sizeof(*t->acc));
    t->acc_max = max_ids;
    return t;
}

void recv_tables_destroy(recv_tables_t *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < RATE_NBUCKETS; i++) {
        struct rate_bucket *b = t->rate[i];
        while (b) {
            struct rate_bucket *next = b->next;
            free(b);
            b = next;
        }
    }
    free(t->rate_overflow);
    for (size_t i = 0; i < t->acc_cap; i++) {
        struct accepted *a = t->acc[i];
        while (a) {
            struct accepted *next = a->next;
            free(a);
            a = next;
        }
    }
    free(t->acc);
    free(t->att_keys);
    free(t->att_counts);
    pthread_mutex_destroy(&t->att_mu);
    pthread_mutex_destroy(&t->rate_mu);
    pthread_mutex_destroy(&t->acc_mu);
    free(t);
}

/* ==== attempts ==== */

/* Slot of key (existing or the empty one where it belongs). Caller holds att_mu. */
static size_t att_slot(const uint64_t *keys, size_t cap, uint64_t key)
{
    size_t i = (size_t)key & (cap - 1);
    while (keys[i] != 0 && keys[i] != key)
        i = (i + 1) & (cap - 1);
    return i;
}

static void att_grow(recv_tables_t *t)
{
    size_t ncap = t->att_cap * 2;
    uint64_t *nkeys = sl_xcalloc(ncap, sizeof(*nkeys));
    uint32_t *ncounts = sl_xcalloc(ncap, sizeof(*ncounts));
    for (size_t i = 0; i < t->att_cap; i++) {
        if (t->att_keys[i] == 0)
            continue;
        size_t j = att_slot(nkeys, ncap, t->att_keys[i]);
        nkeys[j] = t->att_keys[i];
        ncounts[j] = t->att_counts[i];
    }
    free(t->att_keys);
    free(t->att_counts);
    t->att_keys = nkeys;
    t->att_counts = ncounts;
    t->att_cap = ncap;
}

uint32_t recv_attempt_next(recv_tables_t *t, uint64_t key)
{
    pthread_mutex_lock(&t->att_mu);
    if (t->att_len >= RECV_ATTEMPTS_MAX) {
        memset(t->att_keys, 0, t->att_cap * sizeof(*t->att_keys));
        memset(t->att_counts, 0, t->att_cap * sizeof(*t->att_counts));
        t->att_len = 0;
        sl_warn("tables", "attempts_cleared", "attempt counters cleared at the %u-key cap",
                RECV_ATTEMPTS_MAX);
    }
    if ((t->att_len + 1) * 2 > t->att_cap)
        att_grow(t);
    size_t i = att_slot(t->att_keys, t->att_cap, key);
    if (t->att_keys[i] == 0) {
        t->att_keys[i] = key;
        t->att_len++;
    }
    if (t->att_counts[i] < UINT32_MAX)
        t->att_counts[i]++;
    uint32_t n = t->att_counts[i];
    pthread_mutex_unlock(&t->att_mu);
    return n;
}

/* ==== token buckets ==== */

static struct rate_bucket *bucket_new(const char *name)
{
    size_t n = strlen(name);
    struct rate_bucket *b = sl_xcalloc(1, sizeof(*b) + n + 1);
    memcpy(b->name, name, n + 1);
    return b;
}

bool recv_rate_take(recv_tables_t *t, const char *endpoint, uint64_t per_second, int64_t now_ms)
{
    const char *name = endpoint ? endpoint : "";
    size_t h = (size_t)recv_key(name, "") & (RATE_NBUCKETS - 1);
    struct rate_bucket *b;
    bool ok;

    pthread_mutex_lock(&t->rate_mu);
    for (b = t->rate[h]; b; b = b->next) {
        if (strcmp(b->name, name) == 0)
            break;
    }
    if (b == NULL) {
        if (t->rate_len < RECV_BUCKETS_MAX) {
            b = bucket_new(name);
            b->next = t->rate[h];
            t->rate[h] = b;
            t->rate_len++;
        } else {
            if (t->rate_overflow == NULL)
                t->rate_overflow = bucket_new("");
            b = t->rate_overflow;
        }
    }
    double cap = per_second > 0 ? (double)per_second : 1.0;
    if (b->per_second != per_second) {
        b->per_second = per_second;
        b->tokens = cap;
        b->last_ms = now_ms;
    }
    if (now_ms > b->last_ms) {
        b->tokens += (double)(now_ms - b->last_ms) * (double)per_second / 1000.0;
        if (b->tokens > cap)
            b->tokens = cap;
        b->last_ms = now_ms;
    }
    ok = b->tokens >= 1.0;
    if (ok)
        b->tokens -= 1.0;
    pthread_mutex_unlock(&t->rate_mu);
    return ok;
}

/* ==== accepted ids ==== */

static void acc_grow(recv_tables_t *t)
{
    size_t ncap = t->acc_cap * 2;
    struct accepted **nacc = sl_xcalloc(ncap, sizeof(*nacc));
    for (size_t i = 0; i < t->acc_cap; i++) {
        struct accepted *a = t->acc[i];
        while (a) {
            struct accepted *next = a->next;
            size_t j = (size_t)a->key & (ncap - 1);
            a->next = nacc[j];
            nacc[j] = a;
            a = next;
        }
    }
    free(t->acc);
    t->acc = nacc;
    t->acc_cap = ncap;
}

bool recv_accept_note(recv_tables_t *t, const char *endpoint, const char *id)
{
    const char *ep = endpoint ? endpoint : "";
    size_t ep_len = strlen(ep), id_len = strlen(id);
    uint64_t key = recv_key(ep, id);
    bool dup = false;

    pthread_mutex_lock(&t->acc_mu);
    for (struct accepted *a = t->acc[(size_t)key & (t->acc_cap - 1)]; a; a = a->next) {
        if (a->key == key && a->ep_len == ep_len && memcmp(a->data, ep, ep_len) == 0 &&
            strcmp(a->data + ep_len + 1, id) == 0) {
            dup = true;
            goto out;
        }
    }
    if (id_len > RECV_ID_MAX_LEN || t->acc_len >= t->acc_max) {
        t->acc_dropped++;
        goto out;
    }
    if (t->acc_len >= t->acc_cap)
        acc_grow(t);
    struct accepted *a = sl_xmalloc(sizeof(*a) + ep_len + id_len + 2);
    a->key = key;
    a->ep_len = ep_len;
    memcpy(a->data, ep, ep_len + 1);
    memcpy(a->data + ep_len + 1, id, id_len + 1);
    size_t j = (size_t)key & (t->acc_cap - 1);
    a->next = t->acc[j];
    t->acc[j] = a;
    t->acc_len++;
out:
    pthread_mutex_unlock(&t->acc_mu);
    return dup;
}

int recv_accept_list(recv_tables_t *t, const char *endpoint, struct sl_buf *out)
{
    const char *ep = endpoint ? endpoint : "";
    size_t ep_len = strlen(ep);
    int rc = 0;

    pthread_mutex_lock(&t->acc_mu);
    for (size_t i = 0; i < t->acc_cap && rc == 0; i++) {
        for (struct accepted *a = t->acc[i]; a && rc == 0; a = a->next) {
            if (a->ep_len != ep_len || memcmp(a->data, ep, ep_len) != 0)
                continue;
            const char *id = a->data + ep_len + 1;
            rc = sl_buf_append(out, id, strlen(id));
            if (rc == 0)
                rc = sl_buf_append(out, "\n", 1);
        }
    }
    pthread_mutex_unlock(&t->acc_mu);
    return rc;
}

uint64_t recv_accept_count(recv_tables_t *t)
{
    pthread_mutex_lock(&t->acc_mu);
    uint64_t n = t->acc_len;
    pthread_mutex_unlock(&t->acc_mu);
    return n;
}

uint64_t recv_accept_dropped(recv_tables_t *t)
{
    pthread_mutex_lock(&t->acc_mu);
    uint64_t n = t->acc_dropped;
    pthread_mutex_unlock(&t->acc_mu);
    return n;
}
