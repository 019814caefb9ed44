/*
 * prod_gen: synthetic deliveries for benchmarks and demos (sluice-produce --generate).
 *
 * Builds records directly as struct sl_delivery, without JSON, so a benchmark measures the
 * producer rather than the parser. Record n (0-based) has id "evt_<run>_<n>", endpoint
 * "<prefix><n mod K>" (round robin), the given type, created-at = now, and a body of exactly
 * body_bytes bytes: a JSON object {"seq":n,"data":"<filler>"} whose filler is pseudo-random
 * [A-Za-z0-9_-] text (a random slice of a 1 MiB pool per record, so lz4 finds almost nothing
 * to compress: a pessimistic payload), or plain filler when body_bytes is too small for the
 * object.
 *
 * thread: one generator per thread; a generator is a plain value owned by the caller.
 */
#ifndef PROD_GEN_H
#define PROD_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "common/sl_err.h"
#include "common/sl_record.h"

#define PROD_GEN_MAX_ENDPOINTS 1000000 /* endpoints in the round robin */
#define PROD_GEN_RUN_MAX       32      /* bytes of the run id */

struct prod_gen {
    uint64_t count;                 /* records to generate */
    uint64_t n;                     /* records generated so far */
    uint32_t endpoints;             /* K, endpoints in the round robin */
    char run[PROD_GEN_RUN_MAX + 1]; /* run id in every event id */
    char *prefix;                   /* owned copy of the endpoint prefix */
    char *type;                     /* owned copy of the event type */
    uint8_t *body;                  /* body_len bytes (+ NUL), rewritten per record; owned */
    size_t body_len;                /* bytes per body */
    size_t seq_off;                 /* offset of the 20-digit seq field in body; 0 = plain filler */
    size_t fill_off;                /* offset of the filler in body */
    size_t fill_len;                /* filler bytes */
    uint8_t *pool;                  /* random filler the bodies are sliced from; owned */
    size_t pool_len;                /* bytes in pool (fill_len + 1 MiB) */
    uint64_t rng;                   /* xorshift64 state */
    char id[SL_EVENT_ID_MAX + 1];   /* current record's event id */
    size_t id_fixed;                /* bytes of "evt_<run>_" at the start of id */
    char ep[SL_ENDPOINT_ID_MAX + 1]; /* current record's endpoint id */
    size_t ep_fixed;                 /* bytes of the prefix at the start of ep */
    struct sl_delivery d;            /* current record (borrows the fields above) */
};

/*
 * Prepare a generator. run: the run id (borrowed; NULL = derived from the clock and pid),
 * 1..32 characters allowed in event ids; prefix/type borrowed (copied). Checks that every
 * generated id, endpoint and type will be valid and body_bytes <= max_body. Returns 0 or
 * SL_EINVAL / SL_ETOOBIG with err naming the option.
 */
int prod_gen_init(struct prod_gen *g,
                  uint64_t count,
                  uint32_t endpoints,
                  size_t body_bytes,
                  size_t max_body,
                  const char *prefix,
                  const char *type,
                  const char *run,
                  sl_err_t *err);

/* The next record (borrowed from g, valid until the next call), or NULL after count. */
const struct sl_delivery *prod_gen_next(struct prod_gen *g);

/* Free what g owns. NULL-safe, idempotent. */
void prod_gen_fini(struct prod_gen *g);

#endif /* PROD_GEN_H */
