/*
 * sl_map: a small string-keyed hash map (keys copied, values are opaque void *).
 *
 * Design: open addressing with linear probing over a power-of-two table of slots; each slot
 * caches its key's full 64-bit hash, so a probe compares hashes before keys and growth
 * never rehashes a string. The table doubles when more than 3/4 full. Deletion is by
 * backward shift (the entries after the hole that would be reachable from it move back),
 * so there are no tombstones and probe sequences never degrade with churn.
 *
 * Keys come from outside (endpoint ids are chosen by whoever registers endpoints), so the
 * hash is SipHash-1-3 keyed with a per-map random 128-bit seed (getrandom): nobody who does
 * not know the seed can craft keys that collide, which is what makes linear probing safe
 * here. sl_map_new_seeded() exists for tests that need a reproducible layout.
 *
 * Ownership: the map owns its copies of the keys; values are the caller's (the map never
 * frees them, except through the free_val callback of sl_map_destroy / sl_map_clear).
 *
 * thread: none inside; a map is a plain data structure. Concurrent readers are fine when
 * no writer runs; otherwise the caller locks (sl_endpoints uses a rwlock).
 */
#ifndef SL_MAP_H
#define SL_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_MAP_SEED_LEN 16 /* bytes of SipHash key */

typedef struct sl_map sl_map_t;

/*
 * New empty map sized for about hint entries without growing (0 = small default), with a
 * random seed. Never returns NULL (aborts on OOM like sl_xmalloc). Free with sl_map_destroy.
 */
sl_map_t *sl_map_new(size_t hint);

/* As sl_map_new with a caller-chosen seed (borrowed, SL_MAP_SEED_LEN bytes); for tests. */
sl_map_t *sl_map_new_seeded(size_t hint, const uint8_t seed[SL_MAP_SEED_LEN]);

/*
 * Free the map and its key copies (NULL-safe). free_val (NULL allowed) is called once for
 * every value still stored.
 */
void sl_map_destroy(sl_map_t *m, void (*free_val)(void *val));

/* Remove every entry (calling free_val, NULL allowed, on each value); capacity is kept. */
void sl_map_clear(sl_map_t *m, void (*free_val)(void *val));

/* Number of entries. */
size_t sl_map_count(const sl_map_t *m);

/* The value stored under key (borrowed, NUL-terminated), or NULL when absent. */
void *sl_map_get(const sl_map_t *m, const char *key);

/*
 * Look key up. Returns true when present and then stores its value in *val (OUT; NULL
 * allowed): use this form when NULL is a meaningful value.
 */
bool sl_map_find(const sl_map_t *m, const char *key, void **val);

/*
 * Store val under key (borrowed; the map copies it). When key was already present its value
 * is replaced and the previous one is returned in *old (OUT; NULL allowed; set to NULL when
 * the key is new). Returns true when an existing value was replaced, false on insertion.
 * May grow the table; iterators are invalidated.
 */
bool sl_map_put(sl_map_t *m, const char *key, void *val, void **old);

/*
 * Remove key (borrowed). Returns true when it was present, and then its value in *old (OUT;
 * NULL allowed). Entries move (backward shift); iterators are invalidated.
 */
bool sl_map_del(sl_map_t *m, const char *key, void **old);

/*
 * Iterate: start with *pos = 0 and call until it returns false. Each true return gives one
 * entry: *key (OUT, borrowed, valid until that entry is removed or the map changes) and *val
 * (OUT; either may be NULL). Order is unspecified. The map must not change while iterating.
 */
bool sl_map_next(const sl_map_t *m, size_t *pos, const char **key, void **val);

/*
 * SipHash with c compression and d finalisation rounds (SipHash-c-d) of len bytes at data
 * (borrowed; NULL allowed when len == 0) under the 16-byte key k. sl_map uses c=1, d=3;
 * c=2, d=4 gives the reference SipHash-2-4, whose published vectors the unit test checks.
 */
uint64_t sl_siphash(const uint8_t k[SL_MAP_SEED_LEN], const void *data, size_t len, int c, int d);

#endif /* SL_MAP_H */
