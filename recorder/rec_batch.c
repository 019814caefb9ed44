/*
 * rec_batch: decode outcome records and encode them as binary COPY tuples (see rec_batch.h).
 *
 * Binary COPY tuple: int16 field count, then per field an int32 byte length (-1 = NULL) and
 * the value in the type's binary send format, all big-endian. The types used here:
 *   text / enum   the raw bytes (server encoding UTF-8; the decoder has validated them)
 *   int2 / int8   two's complement, big-endian
 *   timestamptz   int64 µs since 2000-01-01 00:00:00 UTC
 *   bytea         the raw bytes
 * A record's "no value" (0 for http, timings, next, created) becomes NULL, matching the
 * schema's convention (sql/0002_history.sql).
 */
#include "recorder/rec_batch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_kafka.h" /* sl_now_ms */
#include "common/sl_time.h"

const uint8_t rec_copy_header[REC_COPY_HEADER_LEN] = {
    'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0, /* signature */
    0,   0,   0,   0,                                        /* flags: no OIDs */
    0,   0,   0,   0,                                        /* header extension length */
};
const uint8_t rec_copy_trailer[REC_COPY_TRAILER_LEN] = {0xff, 0xff};

/* Unix ms of the PostgreSQL epoch, 2000-01-01T00:00:00Z. */
#define PG_EPOCH_UNIX_MS 946684800000LL

/* ==== Tuple encoding ==== */

/* A tuple under construction: appends into out; the first failure sticks. */
struct enc {
    struct sl_buf *out; /* borrowed */
    int rc;             /* 0 or the first sl_buf error */
};

static void put(struct enc *e, const void *p, size_t n)
{
    if (e->rc == 0)
        e->rc = sl_buf_append(e->out, p, n);
}

static void put_be(struct enc *e, uint64_t v, unsigned bytes)
{
    uint8_t b[8];
    for (unsigned i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    put(e, b, bytes);
}

static void field_null(struct enc *e)
{
    put_be(e, 0xffffffffu, 4);
}

static void field_bytes(struct enc *e, const void *p, size_t n)
{
    put_be(e, (uint32_t)n, 4);
    put(e, p, n);
}

/* Text field; NULL pointer -> SQL NULL. */
static void field_text(struct enc *e, const char *s)
{
    if (!s)
        field_null(e);
    else
        field_bytes(e, s, strlen(s));
}

static void field_int8(struct enc *e, int64_t v)
{
    put_be(e, 8, 4);
    put_be(e, (uint64_t)v, 8);
}

/* int8 where 0 means "no value" -> NULL. */
static void field_int8_or_null(struct enc *e, uint64_t v)
{
    if (v == 0)
        field_null(e);
    else
        field_int8(e, (int64_t)v);
}

/* timestamptz from unix ms (range-checked by the caller); 0 -> NULL when zero_is_null. */
static void field_ts(struct enc *e, uint64_t ms, bool zero_is_null)
{
    if (ms == 0 && zero_is_null) {
        field_null(e);
        return;
    }
    int64_t us = ((int64_t)ms - PG_EPOCH_UNIX_MS) * 1000;
    put_be(e, 8, 4);
    put_be(e, (uint64_t)us, 8);
}

void rec_batch_synth_id(char out[19], const void *raw, size_t raw_len)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *p = raw;
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 offset basis */
    for (size_t i = 0; i < raw_len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    out[0] = 'q';
    out[1] = '_';
    for (int i = 0; i < 16; i++)
        out[2 + i] = hex[(h >> (60 - 4 * i)) & 0xf];
    out[18] = '\0';
}

/* Values the decoder accepts but PostgreSQL would refuse (or that would overflow int8). */
static int check_ranges(const struct sl_outcome *o, sl_err_t *err)
{
    if (o->ts_ms > (uint64_t)REC_TS_MAX_MS)
        return sl_err_set(err, SL_EINVAL, "field \"ts\": after year 9999");
    if (o->created_ms > (uint64_t)REC_TS_MAX_MS)
        return sl_err_set(err, SL_EINVAL, "field \"created\": after year 9999");
    if (o->next_ms > (uint64_t)REC_TS_MAX_MS)
        return sl_err_set(err, SL_EINVAL, "field \"next\": after year 9999");
    /* A request's phases are bounded by its timeout (10 minutes at most): a timing past a
     * day is a broken producer's, and a value near 2^63 would overflow the int8 that the
     * percentiles over latency_us are rounded back to, failing every endpoint's refresh. */
    const struct {
        const char *name;
        uint64_t v;
    } t[] = {{"lat_us", o->lat_us},
             {"dns_us", o->dns_us},
             {"conn_us", o->conn_us},
             {"tls_us", o->tls_us},
             {"ttfb_us", o->ttfb_us}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (t[i].v > (uint64_t)REC_TIMING_MAX_US)
            return sl_err_set(err, SL_EINVAL, "field \"%s\": more than a day (%" PRIu64 " µs)",
                              t[i].name, t[i].v);
    return 0;
}

int rec_batch_encode_row(
    struct sl_buf *out, const struct sl_outcome *o, const void *raw, size_t raw_len, sl_err_t *err)
{
    int rc = check_ranges(o, err);
    if (rc != 0)
        return rc;
    const char *state = sl_outcome_state_name(o->state);
    if (!state)
        return sl_err_set(err, SL_EINVAL, "field \"state\": not a known state");
    char synth[19];
    const char *id = o->id;
    if (!id) { /* only a quarantined record may lack it: name it by its bytes */
        rec_batch_synth_id(synth, raw, raw_len);
        id = synth;
    }
    size_t start = out->len;
    struct enc e = {.out = out, .rc = 0};
    put_be(&e, REC_STAGE_NCOLS, 2);
    field_text(&e, id);                  /* event_id */
    field_text(&e, o->ep ? o->ep : "");  /* endpoint_id ('' = unknown) */
    field_int8(&e, (int64_t)o->attempt); /* attempt */
    field_text(&e, state);               /* state (enum: label) */
    if (o->http == 0) {                  /* http_status */
        field_null(&e);
    } else {
        put_be(&e, 2, 4);
        put_be(&e, (uint16_t)o->http, 2);
    }
    field_text(&e, o->err);             /* err */
    field_text(&e, o->msg);             /* msg */
    field_ts(&e, o->ts_ms, false);      /* ts */
    field_ts(&e, o->created_ms, true);  /* created_at */
    field_int8_or_null(&e, o->lat_us);  /* latency_us */
    field_int8_or_null(&e, o->dns_us);  /* dns_us */
    field_int8_or_null(&e, o->conn_us); /* conn_us */
    field_int8_or_null(&e, o->tls_us);  /* tls_us */
    field_int8_or_null(&e, o->ttfb_us); /* ttfb_us */
    field_ts(&e, o->next_ms, true);     /* next_at */
    field_text(&e, o->pod);             /* pod */
    field_text(&e, o->type);            /* event_type */
    bool dead = o->state == SL_OUTCOME_DEAD_LETTER;
    bool keeps_env =
        dead || o->state == SL_OUTCOME_RETRY_SCHEDULED || o->state == SL_OUTCOME_DEFERRED;
    if (keeps_env && o->env) /* env: replay / schedule rebuild */
        field_bytes(&e, o->env, o->env_len);
    else
        field_null(&e);
    if (dead && o->resp) /* resp (dead letters only) */
        field_bytes(&e, o->resp, o->resp_len);
    else
        field_null(&e);
    if (e.rc != 0) {
        out->len = start;
        return sl_err_set(err, e.rc, "batch buffer limit of %zu bytes reached", out->max);
    }
    return 0;
}

/* ==== Batch ==== */

size_t rec_batch_lane_of(const char *ep, size_t nlanes)
{
    if (!ep || nlanes <= 1)
        return 0;
    uint32_t h = 2166136261u; /* FNV-1a 32 */
    for (const unsigned char *p = (const unsigned char *)ep; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h % nlanes;
}

void rec_batch_init(
    struct rec_batch *b, size_t nlanes, size_t max_rows, size_t max_bytes, size_t max_body)
{
    memset(b, 0, sizeof(*b));
    b->nlanes = nlanes < 1 ? 1 : nlanes > REC_MAX_LANES ? REC_MAX_LANES : nlanes;
    b->max_rows = max_rows ? max_rows : 1;
    b->max_bytes = max_bytes;
    b->lim.max_body = max_body;
    b->lim.max_record = 0;
    size_t body = max_body ? max_body : SL_MAX_BODY_DEFAULT;
    /* Hard limit: the soft limit plus one largest outcome (env + overheads), plus framing. */
    size_t one = body + SL_RECORD_OVERHEAD + SL_OUTCOME_OVERHEAD + 4096;
    for (size_t i = 0; i < b->nlanes; i++)
        sl_buf_init(&b->lanes[i].rows, max_bytes + one);
}

void rec_batch_fini(struct rec_batch *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->nlanes; i++) {
        sl_buf_fini(&b->lanes[i].rows);
        free(b->lanes[i].idx);
    }
    free(b->parts);
    memset(b, 0, sizeof(*b));
}

void rec_batch_reset(struct rec_batch *b)
{
    for (size_t i = 0; i < b->nlanes; i++) {
        sl_buf_reset(&b->lanes[i].rows);
        b->lanes[i].n = 0;
    }
    b->n = 0;
    b->bytes = 0;
    b->nparts = 0;
    b->n_bad = 0;
    b->n_records = 0;
    b->first_mono_ms = 0;
}

bool rec_batch_full(const struct rec_batch *b)
{
    return b->n >= b->max_rows || b->bytes >= b->max_bytes;
}

bool rec_batch_empty(const struct rec_batch *b)
{
    return b->n_records == 0;
}

/* Record that offset was consumed from partition (offsets only grow within a partition). */
static void note_offset(struct rec_batch *b, int32_t partition, int64_t offset)
{
    for (size_t i = 0; i < b->nparts; i++) {
        if (b->parts[i].partition == partition) {
            if (offset + 1 > b->parts[i].next)
                b->parts[i].next = offset + 1;
            return;
        }
    }
    if (b->nparts == b->parts_cap) {
        b->parts_cap = b->parts_cap ? b->parts_cap * 2 : 8;
        b->parts = sl_xrealloc(b->parts, b->parts_cap * sizeof(*b->parts));
    }
    b->parts[b->nparts].partition = partition;
    b->parts[b->nparts].next = offset + 1;
    b->nparts++;
}

int rec_batch_add(struct rec_batch *b,
                  const void *val,
                  size_t len,
                  int32_t partition,
                  int64_t offset,
                  int64_t now_mono_ms,
                  sl_err_t *err)
{
    if (rec_batch_full(b))
        return SL_ESTATE;
    struct sl_outcome o;
    int drc = sl_outcome_decode(val ? val : "", len, &b->lim, &o, err);
    struct rec_lane *ln = &b->lanes[drc == 0 ? rec_batch_lane_of(o.ep, b->nlanes) : 0];
    if (ln->n == ln->cap) {
        ln->cap = ln->cap ? ln->cap * 2 : 1024;
        ln->idx = sl_xrealloc(ln->idx, ln->cap * sizeof(*ln->idx));
    }
    int erc = 0;
    size_t start = ln->rows.len;
    int64_t ahead = drc == 0 && b->future_max_ms > 0 && o.ts_ms <= (uint64_t)INT64_MAX
                        ? (int64_t)o.ts_ms - (sl_now_ms() + b->clock_offset_ms)
                        : 0;
    if (ahead > b->future_max_ms) /* never when there is no check: ahead is 0 then */
        erc = sl_err_set(err, SL_EINVAL,
                         "field \"ts\": %lld s ahead of postgresql's clock (at most %lld s; "
                         "the producing pod's clock is wrong)",
                         (long long)(ahead / 1000), (long long)(b->future_max_ms / 1000));
    else if (drc == 0)
        erc = rec_batch_encode_row(&ln->rows, &o, val, len, err);
    bool dead = drc == 0 && o.state == SL_OUTCOME_DEAD_LETTER;
    bool pending = drc == 0 && o.env &&
                   (o.state == SL_OUTCOME_RETRY_SCHEDULED || o.state == SL_OUTCOME_DEFERRED);
    sl_outcome_fini(&o);
    /* The buffer's hard limit leaves room for one largest record past the soft limit, so
     * this is only a safety net: flush first rather than drop a good record. */
    if (erc == SL_ETOOBIG && b->n > 0)
        return SL_ESTATE;
    int rc = drc != 0 ? drc : erc;
    if (b->n_records == 0)
        b->first_mono_ms = now_mono_ms ? now_mono_ms : 1;
    b->n_records++;
    note_offset(b, partition, offset);
    if (rc != 0) {
        b->n_bad++;
        return rc;
    }
    ln->idx[ln->n] = (struct rec_row){.off = start,
                                      .len = ln->rows.len - start,
                                      .partition = partition,
                                      .offset = offset,
                                      .dead = dead,
                                      .pending = pending};
    ln->n++;
    b->n++;
    b->bytes += ln->rows.len - start;
    return 0;
}

const uint8_t *rec_batch_slice(const struct rec_batch *b,
                               size_t lane,
                               size_t from,
                               size_t to,
                               size_t *len,
                               size_t *n_dead,
                               size_t *n_pending)
{
    const struct rec_lane *ln = &b->lanes[lane];
    size_t dead = 0;
    size_t pending = 0;
    for (size_t i = from; i < to; i++) {
        dead += ln->idx[i].dead;
        pending += ln->idx[i].pending;
    }
    *n_dead = dead;
    *n_pending = pending;
    const struct rec_row *last = &ln->idx[to - 1];
    *len = last->off + last->len - ln->idx[from].off;
    return ln->rows.data + ln->idx[from].off;
}
