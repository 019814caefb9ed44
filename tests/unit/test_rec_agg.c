/*
 * recorder/rec_agg: endpoint_health inputs of a batch slice computed from the COPY tuples, by the
 * rules of the SQL they replace (newest success / failure / outcome, failures to count, endpoint
 * order, sub-slices, retention eligibility), and the outcome_state labels check.
 * (Equality with the SQL on real data: tests/integration/test_rec_paths.c.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_err.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "recorder/rec_agg.h"
#include "recorder/rec_batch.h"

#define T0          1800000000000ULL /* an outcome time, unix ms */
#define PG_EPOCH_MS 946684800000LL

static void add(struct rec_batch *b, const struct sl_outcome *o)
{
    struct sl_buf rec;
    sl_err_t err;
    sl_buf_init(&rec, 1 << 20);
    int erc = sl_outcome_encode(o, &rec, &err);
    if (erc != 0)
        print_error("encode: %s\n", err.msg);
    assert_int_equal(erc, 0);
    assert_int_equal(rec_batch_add(b, rec.data, rec.len, 0, (int64_t)b->n_records, 1, &err), 0);
    sl_buf_fini(&rec);
}

static struct sl_outcome
outcome(const char *id, const char *ep, enum sl_outcome_state st, uint32_t attempt, uint64_t ts)
{
    return (struct sl_outcome){
        .id = id,
        .ep = ep,
        .type = "order.paid",
        .attempt = attempt,
        .state = st,
        .http = st == SL_OUTCOME_DELIVERED ? 200 : 503,
        .err = st == SL_OUTCOME_DELIVERED ? NULL : "http_5xx",
        .ts_ms = ts,
        .created_ms = T0 - 1000,
        .lat_us = 1000,
        .next_ms = st == SL_OUTCOME_RETRY_SCHEDULED || st == SL_OUTCOME_DEFERRED ? ts + 30000 : 0};
}

static void add_o(struct rec_batch *b,
                  const char *id,
                  const char *ep,
                  enum sl_outcome_state st,
                  unsigned attempt,
                  uint64_t ts)
{
    struct sl_outcome o = outcome(id, ep, st, attempt, ts);
    add(b, &o);
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Field col of an hstage / fstage tuple (ncols columns). */
static const uint8_t *hfield(const uint8_t *p, int ncols, int col, int32_t *len)
{
    assert_int_equal(p[0] << 8 | p[1], ncols);
    p += 2;
    for (int i = 0; i < col; i++) {
        int32_t n = (int32_t)be32(p);
        p += 4 + (n > 0 ? n : 0);
    }
    *len = (int32_t)be32(p);
    return *len < 0 ? NULL : p + 4;
}

static int64_t hts(const uint8_t *p, int ncols, int col)
{
    int32_t len;
    const uint8_t *v = hfield(p, ncols, col, &len);
    if (!v)
        return -1;
    assert_int_equal(len, 8);
    int64_t us = (int64_t)((uint64_t)be32(v) << 32 | be32(v + 4));
    return us / 1000 + PG_EPOCH_MS;
}

static void assert_htext(const uint8_t *p, int ncols, int col, const char *want)
{
    int32_t len;
    const uint8_t *v = hfield(p, ncols, col, &len);
    assert_non_null(v);
    assert_int_equal(len, (int32_t)strlen(want));
    assert_memory_equal(v, want, strlen(want));
}

/* endpoint_health inputs: newest success / failure / outcome per endpoint, and the failed
 * attempts newer than the newest success (all of them when there is none). */
static void test_health_inputs(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 100, 1 << 20, 0);
    add_o(&b, "a", "ep9", SL_OUTCOME_RETRY_SCHEDULED, 1, T0 + 1);
    add_o(&b, "a", "ep9", SL_OUTCOME_RETRY_SCHEDULED, 2, T0 + 5);
    struct sl_outcome o = outcome("b", "ep9", SL_OUTCOME_DEFERRED, 0, T0 + 6);
    o.err = "breaker_open";
    add(&b, &o);
    add_o(&b, "c", "ep8", SL_OUTCOME_DELIVERED, 1, T0 + 3);
    add_o(&b, "d", "ep8", SL_OUTCOME_RETRY_SCHEDULED, 1, T0 + 2);
    add_o(&b, "e", "ep8", SL_OUTCOME_RETRY_SCHEDULED, 1, T0 + 4);
    struct rec_agg a = {0};
    bool eligible = false;
    assert_int_equal(rec_agg_build(&a, &b, 0, 0, b.lanes[0].n, (int64_t)T0 - 86400000, &eligible),
                     0);
    assert_true(eligible);
    assert_int_equal(a.endpoints, 2);
    const int H = REC_HSTAGE_NCOLS;
    const uint8_t *t = a.hout.data; /* ep8 first */
    assert_htext(t, H, 0, "ep8");
    assert_int_equal(hts(t, H, 1), T0 + 3); /* ok_ts */
    assert_int_equal(hts(t, H, 2), T0 + 4); /* fail_ts */
    assert_htext(t, H, 3, "retry_scheduled");
    assert_int_equal(hts(t, H, 4), T0 + 4);
    int32_t len;
    const uint8_t *f = hfield(t, H, 6, &len); /* next tuple after err */
    t = f + len;
    assert_htext(t, H, 0, "ep9");
    assert_int_equal(hts(t, H, 1), -1); /* no success */
    assert_int_equal(hts(t, H, 2), T0 + 5);
    assert_htext(t, H, 3, "deferred");
    assert_htext(t, H, 6, "breaker_open");
    /* failures to count: ep8's after its success, all of ep9's (the deferral spent none) */
    assert_int_equal(a.failures, 3);
    const int F = REC_FSTAGE_NCOLS;
    t = a.fout.data;
    assert_htext(t, F, 0, "ep8");
    assert_int_equal(hts(t, F, 1), T0 + 4);
    t += a.fout.len / 3; /* same-length tuples: ids of equal length */
    assert_htext(t, F, 0, "ep9");
    int64_t x = hts(t, F, 1);
    t += a.fout.len / 3;
    int64_t y = hts(t, F, 1);
    assert_true((x == (int64_t)T0 + 1 && y == (int64_t)T0 + 5) ||
                (x == (int64_t)T0 + 5 && y == (int64_t)T0 + 1));
    rec_agg_fini(&a);
    rec_batch_fini(&b);
}

/* The newest outcome may be any state (a duplicate after the delivery); a sub-slice (as the
 * bisection writes it) only sees its own rows. */
static void test_newest_outcome_and_sub_slice(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 100, 1 << 20, 0);
    add_o(&b, "a", "ep", SL_OUTCOME_RETRY_SCHEDULED, 1, T0 + 10);
    add_o(&b, "a", "ep", SL_OUTCOME_DELIVERED, 2, T0 + 20);
    struct sl_outcome o = outcome("a", "ep", SL_OUTCOME_DUPLICATE, 2, T0 + 30);
    o.http = 0;
    o.err = NULL;
    add(&b, &o);
    struct rec_agg a = {0};
    bool eligible = false;
    const int H = REC_HSTAGE_NCOLS;
    assert_int_equal(rec_agg_build(&a, &b, 0, 0, b.lanes[0].n, (int64_t)T0 - 86400000, &eligible),
                     0);
    assert_true(eligible);
    assert_int_equal(a.endpoints, 1);
    assert_htext(a.hout.data, H, 3, "duplicate");
    assert_int_equal(hts(a.hout.data, H, 4), T0 + 30);
    assert_int_equal(hts(a.hout.data, H, 1), T0 + 20);
    assert_int_equal(hts(a.hout.data, H, 2), T0 + 10);
    int32_t len;
    assert_null(hfield(a.hout.data, H, 5, &len)); /* no status */
    assert_int_equal(a.failures, 0);              /* the failure is older than the success */
    assert_int_equal(rec_agg_build(&a, &b, 0, 0, 1, (int64_t)T0 - 86400000, &eligible), 0);
    assert_true(eligible);
    assert_htext(a.hout.data, H, 3, "retry_scheduled");
    assert_int_equal(hts(a.hout.data, H, 1), -1);
    assert_int_equal(a.failures, 1);
    rec_agg_fini(&a);
    rec_batch_fini(&b);
}

/* A row near the retention limit makes the slice not eligible (the SQL path decides). */
static void test_retention_not_eligible(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 100, 1 << 20, 0);
    add_o(&b, "a", "ep", SL_OUTCOME_DELIVERED, 1, T0 + 5);
    add_o(&b, "b", "ep", SL_OUTCOME_DELIVERED, 1, T0 - 10);
    struct rec_agg a = {0};
    bool eligible = true;
    assert_int_equal(rec_agg_build(&a, &b, 0, 0, b.lanes[0].n, (int64_t)T0, &eligible), 0);
    assert_false(eligible);
    assert_int_equal(rec_agg_build(&a, &b, 0, 0, 1, (int64_t)T0, &eligible), 0);
    assert_true(eligible);
    rec_agg_fini(&a);
    rec_batch_fini(&b);
}

/* Exact ties of (ts, state, attempt) among an endpoint's rows go to the greater event id
 * (bytes), as the SQL's ORDER BY ... event_id collate "C" desc. */
static void test_newest_outcome_tie(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 100, 1 << 20, 0);
    struct sl_outcome o = outcome("b", "ep", SL_OUTCOME_RETRY_SCHEDULED, 1, T0);
    o.http = 500;
    add(&b, &o);
    o = outcome("a", "ep", SL_OUTCOME_RETRY_SCHEDULED, 1, T0);
    o.http = 502;
    add(&b, &o);
    o = outcome("B", "ep", SL_OUTCOME_RETRY_SCHEDULED, 1, T0);
    o.http = 504;
    add(&b, &o);
    struct rec_agg a = {0};
    bool eligible = false;
    assert_int_equal(rec_agg_build(&a, &b, 0, 0, b.lanes[0].n, (int64_t)T0 - 86400000, &eligible),
                     0);
    assert_true(eligible);
    int32_t len;
    const uint8_t *v = hfield(a.hout.data, REC_HSTAGE_NCOLS, 5, &len);
    assert_non_null(v);
    assert_int_equal(len, 2);
    assert_int_equal(v[0] << 8 | v[1], 500); /* "b" > "a" > "B" */
    rec_agg_fini(&a);
    rec_batch_fini(&b);
}

/* The labels the recorder writes are the ones it ranks; a database whose labels differ in
 * name, order or number is refused with the first difference named. */
static void test_states(void **state)
{
    (void)state;
    for (int i = 0; i < SL_OUTCOME_STATE_COUNT; i++) {
        const char *n = sl_outcome_state_name((enum sl_outcome_state)i);
        int found = 0;
        for (int j = 0; j < REC_AGG_NSTATES; j++)
            found += strcmp(n, rec_agg_states[j]) == 0;
        assert_int_equal(found, 1);
    }
    assert_int_equal(SL_OUTCOME_STATE_COUNT, REC_AGG_NSTATES);
    const char *pg[REC_AGG_NSTATES + 1];
    for (int i = 0; i < REC_AGG_NSTATES; i++)
        pg[i] = rec_agg_states[i];
    sl_err_t err;
    assert_int_equal(rec_agg_check_states(pg, REC_AGG_NSTATES, &err), 0);
    pg[2] = "quarantined";
    pg[3] = "disabled";
    assert_int_equal(rec_agg_check_states(pg, REC_AGG_NSTATES, &err), SL_EVERSION);
    assert_non_null(strstr(err.msg, "label 3 in sort order is \"quarantined\", expected "
                                    "\"disabled\""));
    pg[2] = "disabled";
    pg[3] = "quarantined";
    assert_int_equal(rec_agg_check_states(pg, REC_AGG_NSTATES - 1, &err), SL_EVERSION);
    assert_non_null(strstr(err.msg, "6 labels, expected 7 (\"delivered\" is missing)"));
    pg[REC_AGG_NSTATES] = "bounced";
    assert_int_equal(rec_agg_check_states(pg, REC_AGG_NSTATES + 1, &err), SL_EVERSION);
    assert_non_null(strstr(err.msg, "8 labels, expected 7 (\"bounced\" is unknown)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_newest_outcome_tie),           cmocka_unit_test(test_states),
        cmocka_unit_test(test_retention_not_eligible),       cmocka_unit_test(test_health_inputs),
        cmocka_unit_test(test_newest_outcome_and_sub_slice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
