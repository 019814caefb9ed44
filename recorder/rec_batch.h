/*
 * rec_batch: one batch of outcome records on their way to PostgreSQL.
 *
 * Each Kafka record is decoded (sl_outcome_decode), checked against what PostgreSQL would
 * refuse (timestamps past year 9999, integers past int64), and encoded at once as one tuple of
 * PostgreSQL's binary COPY format for the recorder's staging table (column list in
 * REC_STAGE_COLUMNS). The batch keeps only those encoded bytes plus, per row, its Kafka
 * partition/offset; the decoded record is freed immediately, so the batch's memory is the
 * COPY stream itself, bounded by max_bytes (plus one record).
 *
 * Lanes: rows are kept in nlanes separate streams, lane = hash(endpoint id) % nlanes. Every
 * row of every history table has the endpoint id in its key, so lanes touch disjoint rows and
 * the writer applies them on parallel connections without lock waits between them. (The Kafka
 * partition would also keep endpoints apart, but a batch drained from a backlog often comes
 * from one partition; the endpoint hash balances.)
 *
 * Offsets: every record added, good or bad, advances its partition's "next offset to store"
 * (max offset + 1), so a skipped bad record is never re-read for ever. Rows are sent to
 * PostgreSQL as one contiguous slice [from, to) of a lane's stream (rec_batch_slice), which
 * lets the writer split a lane to isolate a row PostgreSQL rejects.
 *
 * thread: recorder main loop only.
 */
#ifndef REC_BATCH_H
#define REC_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"

/* The staging table's columns, in COPY order; rec_db creates the table from this. Ids
 * collate "C" as in the tables (sql/0010_history_ids_in_byte_order.sql): the apply
 * statements sort and join on them, and under a linguistic default collation each comparison
 * would go through strcoll. */
#define REC_STAGE_COLUMNS                                                                          \
    "event_id text collate \"C\", endpoint_id text collate \"C\", attempt int8, "                  \
    "state outcome_state, http_status int2, err text, msg text, ts timestamptz, "                  \
    "created_at timestamptz, latency_us int8, dns_us int8, conn_us int8, tls_us int8, "            \
    "ttfb_us int8, next_at timestamptz, pod text, event_type text, env bytea, resp bytea"
#define REC_STAGE_NCOLS 19

/* Latest outcome timestamp PostgreSQL (and common sense) accepts: 9999-12-31T23:59:59.999Z. */
#define REC_TS_MAX_MS 253402300799999LL
/* Largest timing field (lat_us, dns_us, conn_us, tls_us, ttfb_us) recorded: one day, in µs;
 * a larger one is a bad record, quarantined with its reason. */
#define REC_TIMING_MAX_US 86400000000LL

/* Binary COPY framing: 11-byte signature, int32 flags, int32 header extension length. */
#define REC_COPY_HEADER_LEN  19
#define REC_COPY_TRAILER_LEN 2
extern const uint8_t rec_copy_header[REC_COPY_HEADER_LEN];
extern const uint8_t rec_copy_trailer[REC_COPY_TRAILER_LEN];

struct rec_row {
    size_t off;        /* byte offset of the tuple in rec_batch.rows */
    size_t len;        /* bytes of the tuple */
    int32_t partition; /* Kafka partition of the record */
    int64_t offset;    /* Kafka offset of the record */
    bool dead;         /* state is dead_letter (the dead-letter upsert runs only when needed) */
    bool pending;      /* retry_scheduled/deferred carrying env (pending_payloads upsert) */
};

#define REC_MAX_LANES SL_CFG_RECORDER_LANES_MAX /* parallel write lanes, at most (16) */

/* One lane: the encoded rows of the endpoints with rec_batch_lane_of(ep) == lane index. */
struct rec_lane {
    struct sl_buf rows;  /* binary COPY tuples, back to back (no header/trailer) */
    struct rec_row *idx; /* one entry per tuple, in arrival order */
    size_t n;            /* tuples in the lane */
    size_t cap;          /* entries allocated in idx */
};

/* Next offset to store for one partition: the highest offset added + 1. */
struct rec_part {
    int32_t partition; /* Kafka partition */
    int64_t next;      /* offset to store (record offset + 1) */
};

struct rec_batch {
    struct rec_lane lanes[REC_MAX_LANES]; /* rows by lane; [0, nlanes) used */
    size_t nlanes;                        /* lanes in use, 1..REC_MAX_LANES */
    size_t n;                             /* tuples in the batch (all lanes) */
    size_t bytes;                         /* encoded bytes in the batch (all lanes) */
    struct rec_part *parts; /* partitions touched by this batch (good or bad records) */
    size_t nparts;          /* entries used in parts */
    size_t parts_cap;       /* entries allocated in parts */
    size_t n_bad;           /* records skipped as undecodable since the last reset */
    size_t n_records;       /* records added (good + bad) since the last reset */
    int64_t first_mono_ms;  /* monotonic ms when the first record was added; 0 = empty */
    size_t max_rows;        /* tuples that make the batch full */
    size_t max_bytes;       /* encoded bytes that make the batch full (one record may exceed) */
    struct sl_decode_limits lim; /* decode limits (max_body as the consumers use) */
    int64_t future_max_ms;       /* an outcome whose ts is further ahead of PostgreSQL's clock
                                    (recorder_future_max_s) is refused (SL_EINVAL, quarantined):
                                    a pod with a clock years ahead would otherwise freeze its
                                    endpoint's health (latest-outcome columns take the greatest
                                    ts) and keep its samples in every window; 0 = no check */
    int64_t clock_offset_ms;     /* PostgreSQL's clock minus this host's, ms (0 = this host's) */
};

/*
 * Initialise b (caller-allocated). nlanes: 1..REC_MAX_LANES (clamped). max_rows >= 1;
 * max_bytes: soft byte limit of the encoded tuples of all lanes (each lane's buffer has the
 * hard limit max_bytes plus the largest possible outcome record); max_body: the consumers'
 * body cap (0 = default), which bounds a dead letter's env.
 */
void rec_batch_init(
    struct rec_batch *b, size_t nlanes, size_t max_rows, size_t max_bytes, size_t max_body);
/* Free everything b owns. NULL-safe; b may be re-initialised. */
void rec_batch_fini(struct rec_batch *b);
/* Empty the batch (memory kept), including offsets and counters. */
void rec_batch_reset(struct rec_batch *b);

/* True when the batch holds max_rows tuples or max_bytes encoded bytes. */
bool rec_batch_full(const struct rec_batch *b);
/* True when no record (good or bad) was added since the last reset. */
bool rec_batch_empty(const struct rec_batch *b);

/*
 * Decode the record val (len bytes, borrowed) read from partition/offset and add it.
 * Returns:
 *   0            added as a tuple;
 *   SL_ESTATE    no room (the batch is full): nothing changed, flush and add again;
 *   other < 0    a bad record (undecodable, or a value PostgreSQL would refuse): it is not
 *                added, but its offset counts and n_bad grows; err names the field and rule
 *                (never a value).
 * now_mono_ms stamps first_mono_ms when the batch was empty.
 */
int rec_batch_add(struct rec_batch *b,
                  const void *val,
                  size_t len,
                  int32_t partition,
                  int64_t offset,
                  int64_t now_mono_ms,
                  sl_err_t *err);

/*
 * The encoded tuples of rows [from, to) of lane as one contiguous slice (borrowed from b, valid
 * until the next add/reset). from < to <= b->lanes[lane].n. *n_dead / *n_pending: OUT,
 * dead_letter rows / retry_scheduled-or-deferred rows with env in the slice.
 */
const uint8_t *rec_batch_slice(const struct rec_batch *b,
                               size_t lane,
                               size_t from,
                               size_t to,
                               size_t *len,
                               size_t *n_dead,
                               size_t *n_pending);

/*
 * Encode one decoded outcome as a binary COPY tuple appended to out (test and bench helper;
 * rec_batch_add uses it). env is kept for dead_letter, retry_scheduled and deferred (the
 * states the contract allows it on), resp for dead_letter only. raw/raw_len: the record's bytes,
 * used only to name a quarantined record that has no event id. Returns 0, SL_ETOOBIG (out's limit;
 * out restored) or SL_EINVAL (a value PostgreSQL would refuse; out restored) with err filled.
 */
int rec_batch_encode_row(
    struct sl_buf *out, const struct sl_outcome *o, const void *raw, size_t raw_len, sl_err_t *err);

/* The lane of endpoint id ep (NULL = unknown: lane 0) among nlanes lanes. */
size_t rec_batch_lane_of(const char *ep, size_t nlanes);

/* The synthetic event id of a quarantined record without one: "q_" + 16 hex digits of a
 * 64-bit FNV-1a hash of the record bytes. out must hold 19 bytes. */
void rec_batch_synth_id(char out[19], const void *raw, size_t raw_len);

#endif /* REC_BATCH_H */
