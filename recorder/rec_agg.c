/*
 * rec_agg: per-endpoint health inputs of a batch slice from its COPY tuples (see rec_agg.h).
 *
 * Each stage tuple (REC_STAGE_COLUMNS) is walked once: int16 field count, then per field an
 * int32 length (-1 = NULL) and the bytes. Fields the output repeats (endpoint id, state, status,
 * error, ts) are copied as they are, length prefix included; only attempt and ts are decoded
 * (big-endian int8, timestamptz = int8 µs since 2000-01-01).
 */
#include "recorder/rec_agg.h"

#include <stdlib.h>
#include <string.h>

#include "common/sl_err.h"

/* Stage columns used here (indexes into REC_STAGE_COLUMNS). */
enum {
    C_EVENT = 0,
    C_ENDPOINT = 1,
    C_ATTEMPT = 2,
    C_STATE = 3,
    C_HTTP = 4,
    C_ERR = 5,
    C_TS = 7,
};

/* The rank of a state is its index: PostgreSQL's sort order of the value (rec_agg.h). */
const char *const rec_agg_states[REC_AGG_NSTATES] = {"deferred",    "retry_scheduled", "disabled",
                                                     "quarantined", "dead_letter",     "duplicate",
                                                     "delivered"};
/* every state the recorder writes has a rank (test_rec_agg checks the names) */
_Static_assert(SL_OUTCOME_STATE_COUNT == REC_AGG_NSTATES, "one rank per outcome state");
#define RANK_RETRY     1
#define RANK_DEAD      4
#define RANK_DELIVERED 6

/* Unix ms of the PostgreSQL epoch, 2000-01-01T00:00:00Z. */
#define PG_EPOCH_UNIX_MS 946684800000LL

struct rec_agg_row {
    const uint8_t *field[REC_STAGE_NCOLS]; /* each field's length prefix in the tuple */
    const uint8_t *ev;                     /* event id bytes */
    size_t ev_len;                         /* bytes of ev */
    const uint8_t *ep;                     /* endpoint id bytes */
    size_t ep_len;                         /* bytes of ep */
    int64_t attempt;                       /* attempt number */
    int64_t ts;                            /* outcome time, µs since 2000-01-01 */
    int rank;                              /* state's position in the enum */
};

static int32_t get_be32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}

static int64_t get_be64(const uint8_t *p)
{
    return (int64_t)((uint64_t)(uint32_t)get_be32(p) << 32 | (uint32_t)get_be32(p + 4));
}

/* Bytes of a field including its length prefix. */
static size_t field_size(const uint8_t *f)
{
    int32_t n = get_be32(f);
    return 4 + (n > 0 ? (size_t)n : 0);
}

/* Parse one stage tuple of len bytes at p into r. 0 or SL_EDECODE. */
static int parse_row(const uint8_t *p, size_t len, struct rec_agg_row *r)
{
    if (len < 2 || ((size_t)p[0] << 8 | p[1]) != REC_STAGE_NCOLS)
        return SL_EDECODE;
    size_t off = 2;
    for (int i = 0; i < REC_STAGE_NCOLS; i++) {
        if (off + 4 > len)
            return SL_EDECODE;
        int32_t n = get_be32(p + off);
        if (n < -1 || (n > 0 && (size_t)n > len - off - 4))
            return SL_EDECODE;
        r->field[i] = p + off;
        off += 4 + (n > 0 ? (size_t)n : 0);
    }
    const uint8_t *f = r->field[C_EVENT];
    if (get_be32(f) < 0 || get_be32(r->field[C_ENDPOINT]) < 0 || get_be32(r->field[C_STATE]) < 0 ||
        get_be32(r->field[C_ATTEMPT]) != 8 || get_be32(r->field[C_TS]) != 8)
        return SL_EDECODE;
    r->ev = f + 4;
    r->ev_len = (size_t)get_be32(f);
    r->ep = r->field[C_ENDPOINT] + 4;
    r->ep_len = (size_t)get_be32(r->field[C_ENDPOINT]);
    r->attempt = get_be64(r->field[C_ATTEMPT] + 4);
    r->ts = get_be64(r->field[C_TS] + 4);
    size_t sl = (size_t)get_be32(r->field[C_STATE]);
    r->rank = -1;
    for (int i = 0; i < REC_AGG_NSTATES; i++) {
        if (strlen(rec_agg_states[i]) == sl &&
            memcmp(rec_agg_states[i], r->field[C_STATE] + 4, sl) == 0)
            r->rank = i;
    }
    return r->rank < 0 ? SL_EDECODE : 0;
}

/* PostgreSQL text order under the C collation: bytes, then the shorter first. */
static int text_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c != 0)
        return c;
    return an < bn ? -1 : an > bn ? 1 : 0;
}

static int ep_cmp(const void *x, const void *y)
{
    const struct rec_agg_row *a = x;
    const struct rec_agg_row *b = y;
    return text_cmp(a->ep, a->ep_len, b->ep, b->ep_len);
}

/* Newer by (ts, state, attempt, event id): the hl CTE's order, total over distinct rows of
 * one endpoint (they are the rest of the delivery_attempts key). */
static bool newer(const struct rec_agg_row *a, const struct rec_agg_row *b)
{
    if (a->ts != b->ts)
        return a->ts > b->ts;
    if (a->rank != b->rank)
        return a->rank > b->rank;
    if (a->attempt != b->attempt)
        return a->attempt > b->attempt;
    return text_cmp(a->ev, a->ev_len, b->ev, b->ev_len) > 0;
}

static bool failed_attempt(const struct rec_agg_row *r)
{
    return (r->rank == RANK_RETRY || r->rank == RANK_DEAD) && r->attempt > 0;
}

/* Append a field's length prefix and bytes as they are. */
static int put_field(struct sl_buf *out, const uint8_t *f)
{
    return sl_buf_append(out, f, field_size(f));
}

static int put_int8(struct sl_buf *out, int64_t v)
{
    uint8_t b[12] = {0, 0, 0, 8};
    for (int i = 0; i < 8; i++)
        b[4 + i] = (uint8_t)((uint64_t)v >> (56 - 8 * i));
    return sl_buf_append(out, b, sizeof(b));
}

/* int8 / timestamptz, or NULL when !present. */
static int put_int8_or_null(struct sl_buf *out, bool present, int64_t v)
{
    static const uint8_t null_field[4] = {0xff, 0xff, 0xff, 0xff};
    return present ? put_int8(out, v) : sl_buf_append(out, null_field, 4);
}

/* Encode the health inputs of the rows g[0..n) (one endpoint): one hstage tuple, and one
 * fstage tuple per failed attempt newer than the endpoint's newest success. */
static int put_endpoint(struct rec_agg *a, const struct rec_agg_row *g, size_t n)
{
    const struct rec_agg_row *last = &g[0];
    int64_t ok_ts = 0, fail_ts = 0;
    bool has_ok = false, has_fail = false;
    for (size_t i = 0; i < n; i++) {
        const struct rec_agg_row *r = &g[i];
        if (newer(r, last))
            last = r;
        if (r->rank == RANK_DELIVERED && (!has_ok || r->ts > ok_ts)) {
            ok_ts = r->ts;
            has_ok = true;
        }
        if (failed_attempt(r) && (!has_fail || r->ts > fail_ts)) {
            fail_ts = r->ts;
            has_fail = true;
        }
    }
    const uint8_t hcols[2] = {0, REC_HSTAGE_NCOLS};
    int rc = sl_buf_append(&a->hout, hcols, 2);
    if (rc == 0)
        rc = put_field(&a->hout, last->field[C_ENDPOINT]);
    if (rc == 0)
        rc = put_int8_or_null(&a->hout, has_ok, ok_ts);
    if (rc == 0)
        rc = put_int8_or_null(&a->hout, has_fail, fail_ts);
    if (rc == 0)
        rc = put_field(&a->hout, last->field[C_STATE]);
    if (rc == 0)
        rc = put_field(&a->hout, last->field[C_TS]);
    if (rc == 0)
        rc = put_field(&a->hout, last->field[C_HTTP]);
    if (rc == 0)
        rc = put_field(&a->hout, last->field[C_ERR]);
    a->endpoints++;
    const uint8_t fcols[2] = {0, REC_FSTAGE_NCOLS};
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const struct rec_agg_row *r = &g[i];
        if (!failed_attempt(r) || (has_ok && r->ts <= ok_ts))
            continue;
        rc = sl_buf_append(&a->fout, fcols, 2);
        if (rc == 0)
            rc = put_field(&a->fout, r->field[C_ENDPOINT]);
        if (rc == 0)
            rc = put_int8(&a->fout, r->ts);
        a->failures++;
    }
    return rc;
}

int rec_agg_check_states(const char *const *pg, size_t n, sl_err_t *err)
{
    for (size_t i = 0; i < n && i < REC_AGG_NSTATES; i++) {
        if (strcmp(pg[i], rec_agg_states[i]) != 0)
            return sl_err_set(err, SL_EVERSION,
                              "cannot record outcomes: outcome_state in postgresql does not match "
                              "sluice-recorder: label %zu in sort order is \"%s\", expected \"%s\"",
                              i + 1, pg[i], rec_agg_states[i]);
    }
    if (n < REC_AGG_NSTATES)
        return sl_err_set(err, SL_EVERSION,
                          "cannot record outcomes: outcome_state in postgresql does not match "
                          "sluice-recorder: %zu labels, expected %d (\"%s\" is missing)",
                          n, REC_AGG_NSTATES, rec_agg_states[n]);
    if (n > REC_AGG_NSTATES)
        return sl_err_set(err, SL_EVERSION,
                          "cannot record outcomes: outcome_state in postgresql does not match "
                          "sluice-recorder: %zu labels, expected %d (\"%s\" is unknown)",
                          n, REC_AGG_NSTATES, pg[REC_AGG_NSTATES]);
    return 0;
}

/* Reset out for a new build with the hard limit max. */
static void reset_out(struct sl_buf *out, size_t max)
{
    if (!out->data && out->max == 0)
        sl_buf_init(out, max);
    sl_buf_reset(out);
    out->max = max;
}

void rec_agg_fini(struct rec_agg *a)
{
    if (!a)
        return;
    free(a->rows);
    sl_buf_fini(&a->hout);
    sl_buf_fini(&a->fout);
    memset(a, 0, sizeof(*a));
}

int rec_agg_build(struct rec_agg *a,
                  const struct rec_batch *b,
                  size_t lane,
                  size_t from,
                  size_t to,
                  int64_t min_ts_unix_ms,
                  bool *eligible)
{
    const struct rec_lane *ln = &b->lanes[lane];
    size_t n = to - from;
    *eligible = false;
    a->endpoints = 0;
    a->failures = 0;
    if (n > a->cap) {
        free(a->rows);
        a->rows = sl_xmalloc(n * sizeof(*a->rows));
        a->cap = n;
    }
    const uint8_t *data = ln->rows.data;
    int64_t min_ts = (min_ts_unix_ms - PG_EPOCH_UNIX_MS) * 1000;
    size_t m = 0;
    for (size_t i = from; i < to; i++) {
        struct rec_agg_row *r = &a->rows[m];
        if (parse_row(data + ln->idx[i].off, ln->idx[i].len, r) != 0)
            return SL_EDECODE;
        if (r->ep_len == 0) /* quarantined without an endpoint: attempts only */
            continue;
        if (r->ts < min_ts)
            return 0; /* the SQL's retention filter might drop it: not eligible */
        m++;
    }
    /* One endpoint's tuple is at most 36 bytes longer than one of its rows (two timestamps in
     * place of the timings), a failure's is shorter than its row, and no row is shorter than 60
     * bytes: twice the slice bounds both. */
    size_t bound = 2 * (ln->idx[to - 1].off + ln->idx[to - 1].len - ln->idx[from].off) + 4096;
    reset_out(&a->hout, bound);
    reset_out(&a->fout, bound);
    qsort(a->rows, m, sizeof(*a->rows), ep_cmp);
    for (size_t i = 0; i < m;) {
        size_t j = i + 1;
        while (j < m && ep_cmp(&a->rows[i], &a->rows[j]) == 0)
            j++;
        if (put_endpoint(a, &a->rows[i], j - i) != 0)
            return SL_EDECODE;
        i = j;
    }
    *eligible = true;
    return 0;
}
