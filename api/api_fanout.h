/*
 * api_fanout: which endpoints an event without an explicit endpoint goes to.
 *
 * An index over one snapshot of the in-memory endpoint table (common/sl_endpoints, fed by the
 * compacted endpoints topic; PostgreSQL is never on the publish path): endpoints by exact
 * event type, by wildcard prefix (`order.*` is filed under "order"), and the list of
 * endpoints with no type filter. A lookup of type "a.b.c" reads the exact list of "a.b.c",
 * the prefix lists of "a" and "a.b", and the unfiltered list, then keeps the enabled
 * endpoints whose channels match (sl_endpoint_subscribed is the rule; the index only narrows
 * the candidates), each once, in id order.
 *
 * The index is immutable and reference-counted: api_fanout_current() rebuilds it when the
 * table's generation moved since the last build, under a mutex, and hands out a reference;
 * lookups on a held reference need no lock.
 *
 * thread: any.
 */
#ifndef API_FANOUT_H
#define API_FANOUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_endpoints.h"

typedef struct api_fanout api_fanout_t;         /* the rebuilding holder */
typedef struct api_fanout_idx api_fanout_idx_t; /* one immutable index */

/* A holder for table t (borrowed; must outlive the holder). Free with api_fanout_destroy. */
api_fanout_t *api_fanout_new(sl_endpoints_t *t);
void api_fanout_destroy(api_fanout_t *f);

/* A reference to an index of the table as it is now (rebuilt when it changed). */
api_fanout_idx_t *api_fanout_current(api_fanout_t *f);
void api_fanout_idx_release(api_fanout_idx_t *x);

/*
 * The endpoints subscribed to an event of type (borrowed, NUL-terminated) carrying channels
 * [0..n_channels) (borrowed): *out (OUT) an array of borrowed pointers valid while the
 * reference x is held, which the caller frees with free(); returns how many (0: *out NULL).
 * Disabled endpoints are left out. *examined (OUT, NULL allowed): candidates looked at.
 */
size_t api_fanout_match(const api_fanout_idx_t *x,
                        const char *type,
                        const char *const *channels,
                        size_t n_channels,
                        const struct sl_endpoint ***out,
                        size_t *examined);

/*
 * An index over eps[0..n) (the array and one reference to each endpoint are taken over,
 * also when n is 0; eps may be NULL then). api_fanout_current builds its indexes with this;
 * tests and the benchmark build one from endpoints of their own.
 */
api_fanout_idx_t *api_fanout_index(const struct sl_endpoint **eps, size_t n, uint64_t generation);

/* Endpoints in the index (enabled or not). */
size_t api_fanout_count(const api_fanout_idx_t *x);

#endif /* API_FANOUT_H */
