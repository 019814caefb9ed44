/*
 * recv_tables: the receiver's shared memory of past requests.
 *
 *   - attempts: how many times a (endpoint, webhook id) key reached a flaky behaviour, so
 *     flaky/<pct> and flaky_n/<N> can decide deterministically per attempt and retries
 *     eventually succeed;
 *   - token buckets per endpoint name for ratelimit/<per_second>;
 *   - the distinct (endpoint, webhook id) pairs answered 2xx, served by /_ledger/ids and used
 *     for the ledger's "dup" flag.
 *
 * Each table has its own mutex (held for a hash lookup, never across I/O) and a hard size
 * cap, so a benchmark with unique ids cannot exhaust memory: the attempts table is cleared
 * when full (counts restart; logged), the accepted set stops growing and counts what it drops.
 *
 * thread: any after recv_tables_new; new/destroy on the main thread.
 */
#ifndef SL_RECV_TABLES_H
#define SL_RECV_TABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_mem.h"

#define RECV_ATTEMPTS_MAX (1u << 22) /* attempt counters kept before the table is cleared */
#define RECV_BUCKETS_MAX  4096       /* distinct rate-limited endpoint names */
#define RECV_ID_MAX_LEN   1024 /* longer webhook ids are not remembered (counted as dropped) */

typedef struct recv_tables recv_tables_t;

/* max_ids: cap on remembered accepted (endpoint, id) pairs; 0 = remember none. */
recv_tables_t *recv_tables_new(size_t max_ids);
void recv_tables_destroy(recv_tables_t *t); /* NULL-safe */

/* 64-bit key of an (endpoint, id) pair (both borrowed, NUL-terminated, NULL = ""). */
uint64_t recv_key(const char *endpoint, const char *id);

/* Count one more attempt for key; returns the 1-based attempt number. */
uint32_t recv_attempt_next(recv_tables_t *t, uint64_t key);

/*
 * Take one token from endpoint's bucket (endpoint borrowed; "" allowed). Buckets hold up to
 * max(1, per_second) tokens and refill at per_second tokens/s; a changed rate resets the
 * bucket. now_ms: monotonic ms. Returns true when allowed.
 */
bool recv_rate_take(recv_tables_t *t, const char *endpoint, uint64_t per_second, int64_t now_ms);

/*
 * Remember that (endpoint, id) got a 2xx (both borrowed). Returns true when it had already
 * been remembered (a duplicate delivery). ids longer than RECV_ID_MAX_LEN or beyond max_ids
 * are not remembered and count as dropped.
 */
bool recv_accept_note(recv_tables_t *t, const char *endpoint, const char *id);

/* Append the remembered ids of endpoint, one per line, to out (bounded buffer, owned by
 * caller). Returns 0 or SL_ETOOBIG when out's maximum was reached (output truncated). */
int recv_accept_list(recv_tables_t *t, const char *endpoint, struct sl_buf *out);

/* Counters for /_stats. */
uint64_t recv_accept_count(recv_tables_t *t);   /* pairs remembered */
uint64_t recv_accept_dropped(recv_tables_t *t); /* pairs not remembered (caps) */

#endif /* SL_RECV_TABLES_H */
