/*
 * api_fanout: the subscription index (see api_fanout.h).
 *
 * Build: the table's snapshot is sorted by endpoint id, so an endpoint's position in it is
 * both its handle in the lists and its rank in the answer. Each type filter entry files the
 * position in one list: exact names in `exact`, `p.*` entries in `prefix` under "p", and an
 * endpoint without filters in `any`. Match gathers positions from at most 2 + (dots in the
 * type) lists, each already in id order, merges them (an endpoint listed twice, say under
 * `order.*` and `order.created`, appears once), and applies the full rule to each.
 */
#include "api/api_fanout.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"

struct poslist {
    uint32_t *pos; /* positions in idx->eps */
    size_t n, cap;
};

struct api_fanout_idx {
    atomic_uint refs;               /* holders: the api_fanout_t and each lookup */
    uint64_t generation;            /* table generation this index was built from */
    const struct sl_endpoint **eps; /* snapshot references, sorted by id */
    size_t n_eps;                   /* entries in eps */
    sl_map_t *exact;                /* type -> struct poslist * */
    sl_map_t *prefix;               /* "p" of "p.*" -> struct poslist * */
    struct poslist any;             /* endpoints without a type filter */
};

struct api_fanout {
    sl_endpoints_t *table; /* borrowed */
    pthread_mutex_t mu;    /* guards cur */
    api_fanout_idx_t *cur; /* newest index (one reference held here) */
};

static void pl_push(struct poslist *l, uint32_t p)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->pos = sl_xrealloc(l->pos, l->cap * sizeof(*l->pos));
    }
    l->pos[l->n++] = p;
}

static void pl_free(void *v)
{
    struct poslist *l = v;
    if (l) {
        free(l->pos);
        free(l);
    }
}

static void file_under(sl_map_t *m, const char *key, uint32_t p)
{
    struct poslist *l = sl_map_get(m, key);
    if (!l) {
        l = sl_xcalloc(1, sizeof(*l));
        sl_map_put(m, key, l, NULL);
    }
    pl_push(l, p);
}

static int by_id(const void *a, const void *b)
{
    const struct sl_endpoint *x = *(const struct sl_endpoint *const *)a;
    const struct sl_endpoint *y = *(const struct sl_endpoint *const *)b;
    return strcmp(x->id, y->id);
}

static api_fanout_idx_t *build(sl_endpoints_t *t)
{
    const struct sl_endpoint **eps = NULL;
    size_t n = 0;
    /* generation first: a change racing the snapshot only makes the next call rebuild */
    uint64_t gen = sl_endpoints_generation(t);
    sl_endpoints_snapshot(t, &eps, &n);
    return api_fanout_index(eps, n, gen);
}

api_fanout_idx_t *api_fanout_index(const struct sl_endpoint **eps, size_t n, uint64_t generation)
{
    api_fanout_idx_t *x = sl_xcalloc(1, sizeof(*x));
    atomic_init(&x->refs, 1);
    x->generation = generation;
    x->eps = eps;
    x->n_eps = n;
    if (x->n_eps > 1)
        qsort(x->eps, x->n_eps, sizeof(const struct sl_endpoint *), by_id);
    x->exact = sl_map_new(x->n_eps);
    x->prefix = sl_map_new(16);
    char key[SL_EVENT_TYPE_MAX + 1];
    for (size_t i = 0; i < x->n_eps; i++) {
        const struct sl_endpoint *e = x->eps[i];
        if (e->n_types == 0)
            pl_push(&x->any, (uint32_t)i);
        for (size_t k = 0; k < e->n_types; k++) {
            const char *f = e->types[k];
            size_t len = strlen(f);
            if (len >= 2 && f[len - 1] == '*' && f[len - 2] == '.' &&
                len - 2 <= SL_EVENT_TYPE_MAX) {
                memcpy(key, f, len - 2);
                key[len - 2] = '\0';
                file_under(x->prefix, key, (uint32_t)i);
            } else {
                file_under(x->exact, f, (uint32_t)i);
            }
        }
    }
    return x;
}

api_fanout_t *api_fanout_new(sl_endpoints_t *t)
{
    api_fanout_t *f = sl_xcalloc(1, sizeof(*f));
    f->table = t;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

void api_fanout_idx_release(api_fanout_idx_t *x)
{
    if (!x || atomic_fetch_sub(&x->refs, 1) != 1)
        return;
    for (size_t i = 0; i < x->n_eps; i++)
        sl_endpoint_release(x->eps[i]);
    free(x->eps);
    sl_map_destroy(x->exact, pl_free);
    sl_map_destroy(x->prefix, pl_free);
    free(x->any.pos);
    free(x);
}

void api_fanout_destroy(api_fanout_t *f)
{
    if (!f)
        return;
    api_fanout_idx_release(f->cur);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

api_fanout_idx_t *api_fanout_current(api_fanout_t *f)
{
    uint64_t gen = sl_endpoints_generation(f->table);
    pthread_mutex_lock(&f->mu);
    if (!f->cur || f->cur->generation != gen) {
        api_fanout_idx_release(f->cur);
        f->cur = build(f->table);
    }
    api_fanout_idx_t *x = f->cur;
    atomic_fetch_add(&x->refs, 1);
    pthread_mutex_unlock(&f->mu);
    return x;
}

size_t api_fanout_count(const api_fanout_idx_t *x)
{
    return x->n_eps;
}

#define MAX_LISTS (2 + SL_EVENT_TYPE_MAX / 2) /* any, exact, one per '.' */

size_t api_fanout_match(const api_fanout_idx_t *x,
                        const char *type,
                        const char *const *channels,
                        size_t n_channels,
                        const struct sl_endpoint ***out,
                        size_t *examined)
{
    const struct poslist *lists[MAX_LISTS];
    size_t at[MAX_LISTS], nl = 0, total = 0;
    char key[SL_EVENT_TYPE_MAX + 1];
    size_t tlen = strlen(type);

    *out = NULL;
    lists[nl++] = &x->any;
    lists[nl++] = sl_map_get(x->exact, type);
    for (size_t i = 0; i < tlen && i <= SL_EVENT_TYPE_MAX && nl < MAX_LISTS; i++) {
        if (type[i] != '.')
            continue;
        memcpy(key, type, i);
        key[i] = '\0';
        lists[nl++] = sl_map_get(x->prefix, key);
    }
    for (size_t l = 0; l < nl; l++) {
        at[l] = 0;
        total += lists[l] ? lists[l]->n : 0;
    }
    if (examined)
        *examined = total;
    if (total == 0)
        return 0;
    /* every list is in position (= id) order: merge them, dropping repeats */
    const struct sl_endpoint **res = sl_xmalloc(total * sizeof(const struct sl_endpoint *));
    size_t n = 0;
    uint32_t last = UINT32_MAX;
    for (;;) {
        size_t best = nl;
        for (size_t l = 0; l < nl; l++) {
            if (lists[l] && at[l] < lists[l]->n &&
                (best == nl || lists[l]->pos[at[l]] < lists[best]->pos[at[best]]))
                best = l;
        }
        if (best == nl)
            break;
        uint32_t p = lists[best]->pos[at[best]++];
        if (p == last)
            continue;
        last = p;
        const struct sl_endpoint *e = x->eps[p];
        if (e->enabled && sl_endpoint_subscribed(e, type, tlen, channels, n_channels))
            res[n++] = e;
    }
    if (n == 0) {
        free(res);
        return 0;
    }
    *out = res;
    return n;
}
