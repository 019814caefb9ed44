/*
 * recorder/rec_batch: outcome records -> binary COPY tuples, lanes, offsets.
 * (The tuples' acceptance by PostgreSQL is covered by tests/integration/test_recorder.c.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "recorder/rec_batch.h"

static void encode(struct sl_buf *b, const struct sl_outcome *o)
{
    sl_err_t err;
    sl_buf_init(b, 1 << 20);
    assert_int_equal(sl_outcome_encode(o, b, &err), 0);
}

static struct sl_outcome delivered(const char *id, const char *ep, uint64_t ts)
{
    return (struct sl_outcome){.id = id,
                               .ep = ep,
                               .type = "t",
                               .attempt = 1,
                               .state = SL_OUTCOME_DELIVERED,
                               .http = 200,
                               .ts_ms = ts,
                               .created_ms = ts - 1,
                               .lat_us = 1234};
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

/* The tuple layout: field count, then (length, bytes) per column; NULL = length -1. */
static void test_tuple_layout(void **state)
{
    (void)state;
    struct sl_buf out;
    sl_buf_init(&out, 1 << 16);
    struct sl_outcome o = delivered("evt-1", "ep-1", 946684800000ULL + 1500); /* PG epoch + 1.5 s */
    sl_err_t err;
    assert_int_equal(rec_batch_encode_row(&out, &o, "x", 1, &err), 0);
    const uint8_t *p = out.data;
    assert_int_equal(p[0] << 8 | p[1], REC_STAGE_NCOLS);
    p += 2;
    assert_int_equal(be32(p), 5); /* event_id */
    assert_memory_equal(p + 4, "evt-1", 5);
    p += 4 + 5;
    assert_int_equal(be32(p), 4); /* endpoint_id */
    p += 4 + 4;
    assert_int_equal(be32(p), 8); /* attempt int8 */
    assert_int_equal(be64(p + 4), 1);
    p += 12;
    assert_int_equal(be32(p), 9); /* state label */
    assert_memory_equal(p + 4, "delivered", 9);
    p += 4 + 9;
    assert_int_equal(be32(p), 2); /* http int2 */
    assert_int_equal(p[4] << 8 | p[5], 200);
    p += 6;
    assert_int_equal(be32(p), 0xffffffffu); /* err NULL */
    p += 4;
    assert_int_equal(be32(p), 0xffffffffu); /* msg NULL */
    p += 4;
    assert_int_equal(be32(p), 8); /* ts: µs since 2000-01-01 */
    assert_int_equal(be64(p + 4), 1500000);
    sl_buf_fini(&out);
}

/* Values PostgreSQL would refuse are bad records, named by field. */
static void test_range_checks(void **state)
{
    (void)state;
    struct sl_buf out;
    sl_buf_init(&out, 1 << 16);
    sl_err_t err;
    struct sl_outcome o = delivered("e", "ep", (uint64_t)REC_TS_MAX_MS + 1);
    assert_int_equal(rec_batch_encode_row(&out, &o, "x", 1, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "\"ts\""));
    assert_int_equal(out.len, 0);
    /* every timing field: a day is kept, past it (up to 2^64-1) is refused by name, so that
     * no percentile over latency_us can overflow int8 when rounded back */
    const char *names[] = {"lat_us", "dns_us", "conn_us", "tls_us", "ttfb_us"};
    const uint64_t bad[] = {(uint64_t)REC_TIMING_MAX_US + 1, (uint64_t)INT64_MAX,
                            (uint64_t)INT64_MAX + 1, UINT64_MAX};
    for (size_t f = 0; f < 5; f++) {
        for (size_t b = 0; b < 4; b++) {
            o = delivered("e", "ep", 1000);
            uint64_t *fld[] = {&o.lat_us, &o.dns_us, &o.conn_us, &o.tls_us, &o.ttfb_us};
            *fld[f] = bad[b];
            assert_int_equal(rec_batch_encode_row(&out, &o, "x", 1, &err), SL_EINVAL);
            assert_non_null(strstr(err.msg, names[f]));
            assert_int_equal(out.len, 0);
            *fld[f] = (uint64_t)REC_TIMING_MAX_US;
            assert_int_equal(rec_batch_encode_row(&out, &o, "x", 1, &err), 0);
            out.len = 0;
        }
    }
    o = delivered("e", "ep", 1000);
    o.lat_us = 5;
    assert_int_equal(rec_batch_encode_row(&out, &o, "x", 1, &err), 0);
    assert_true(out.len > 0);
    sl_buf_fini(&out);
}

static void test_synth_id(void **state)
{
    (void)state;
    char a[19], b[19], c[19];
    rec_batch_synth_id(a, "record-1", 8);
    rec_batch_synth_id(b, "record-1", 8);
    rec_batch_synth_id(c, "record-2", 8);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_int_equal(strlen(a), 18);
    assert_memory_equal(a, "q_", 2);
    assert_true(sl_valid_event_id(a, strlen(a)));
}

/* Good and bad records advance their partition's offset; only good ones become rows. */
static void test_offsets_and_bad_records(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 2, 100, 1 << 20, 0);
    assert_true(rec_batch_empty(&b));
    struct sl_buf r;
    struct sl_outcome o = delivered("e1", "ep-a", 5000);
    encode(&r, &o);
    sl_err_t err;
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 3, 41, 7, &err), 0);
    assert_int_equal(rec_batch_add(&b, "\xc1", 1, 3, 42, 8, &err), SL_EDECODE);
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 0, 9, 9, &err), 0);
    assert_int_equal(rec_batch_add(&b, NULL, 0, 1, 5, 9, &err) < 0, 1); /* empty value */
    assert_false(rec_batch_empty(&b));
    assert_int_equal(b.n, 2);
    assert_int_equal(b.n_bad, 2);
    assert_int_equal(b.n_records, 4);
    assert_int_equal(b.first_mono_ms, 7);
    assert_int_equal(b.nparts, 3);
    for (size_t i = 0; i < b.nparts; i++) {
        if (b.parts[i].partition == 3)
            assert_int_equal(b.parts[i].next, 43);
        else if (b.parts[i].partition == 0)
            assert_int_equal(b.parts[i].next, 10);
        else
            assert_int_equal(b.parts[i].next, 6);
    }
    /* both good rows are for ep-a: same lane, one contiguous slice */
    size_t lane = rec_batch_lane_of("ep-a", 2);
    assert_int_equal(b.lanes[lane].n, 2);
    assert_int_equal(b.lanes[1 - lane].n, 0);
    size_t len = 0, dead = 0, pend = 0;
    const uint8_t *s = rec_batch_slice(&b, lane, 0, 2, &len, &dead, &pend);
    assert_int_equal(pend, 0);
    assert_ptr_equal(s, b.lanes[lane].rows.data);
    assert_int_equal(len, b.lanes[lane].rows.len);
    assert_int_equal(dead, 0);
    rec_batch_reset(&b);
    assert_true(rec_batch_empty(&b));
    assert_int_equal(b.nparts, 0);
    sl_buf_fini(&r);
    rec_batch_fini(&b);
}

/* A full batch refuses more (nothing changes) until reset. */
static void test_full(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 2, 1 << 20, 0);
    struct sl_buf r;
    struct sl_outcome o = delivered("e1", "ep", 5000);
    encode(&r, &o);
    sl_err_t err;
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 0, 1, 1, &err), 0);
    assert_false(rec_batch_full(&b));
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 0, 2, 1, &err), 0);
    assert_true(rec_batch_full(&b));
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 0, 3, 1, &err), SL_ESTATE);
    assert_int_equal(b.n_records, 2);
    assert_int_equal(b.parts[0].next, 3);
    sl_buf_fini(&r);
    rec_batch_fini(&b);
}

/* Dead letters keep env and resp; other states never carry them. */
static void test_dead_letter_columns(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 10, 1 << 20, 0);
    struct sl_outcome o = {.id = "e",
                           .ep = "ep",
                           .type = "t",
                           .attempt = 3,
                           .state = SL_OUTCOME_DEAD_LETTER,
                           .http = 410,
                           .ts_ms = 5000,
                           .created_ms = 4000,
                           .env = (const uint8_t *)"ENVBYTES",
                           .env_len = 8,
                           .resp = (const uint8_t *)"RESP",
                           .resp_len = 4};
    struct sl_buf r;
    encode(&r, &o);
    sl_err_t err;
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 0, 0, 1, &err), 0);
    size_t len = 0, dead = 0, pend = 0;
    const uint8_t *s = rec_batch_slice(&b, 0, 0, 1, &len, &dead, &pend);
    assert_int_equal(pend, 0);
    assert_int_equal(dead, 1);
    /* the last two columns: env (8 bytes) then resp (4 bytes) */
    assert_memory_equal(s + len - 4, "RESP", 4);
    assert_int_equal(be32(s + len - 8), 4);
    assert_memory_equal(s + len - 16, "ENVBYTES", 8);
    assert_int_equal(be32(s + len - 20), 8);
    sl_buf_fini(&r);
    rec_batch_fini(&b);
}

/* Retries and deferrals keep their delivery record (pending_payloads); others never do. */
static void test_pending_env(void **state)
{
    (void)state;
    struct rec_batch b;
    rec_batch_init(&b, 1, 10, 1 << 20, 0);
    struct sl_outcome o = {.id = "e",
                           .ep = "ep",
                           .type = "t",
                           .attempt = 1,
                           .state = SL_OUTCOME_RETRY_SCHEDULED,
                           .http = 503,
                           .ts_ms = 5000,
                           .created_ms = 4000,
                           .next_ms = 6000,
                           .env = (const uint8_t *)"ENVBYTES",
                           .env_len = 8};
    struct sl_buf r;
    encode(&r, &o);
    sl_err_t err;
    assert_int_equal(rec_batch_add(&b, r.data, r.len, 0, 0, 1, &err), 0);
    struct sl_outcome d = delivered("e2", "ep", 7000);
    struct sl_buf r2;
    encode(&r2, &d);
    assert_int_equal(rec_batch_add(&b, r2.data, r2.len, 0, 1, 1, &err), 0);
    size_t len = 0, dead = 0, pend = 0;
    const uint8_t *s = rec_batch_slice(&b, 0, 0, 2, &len, &dead, &pend);
    assert_int_equal(dead, 0);
    assert_int_equal(pend, 1);
    /* first tuple: env then a NULL resp at its end */
    size_t first = b.lanes[0].idx[0].len;
    assert_int_equal(be32(s + first - 4), 0xffffffffu);
    assert_memory_equal(s + first - 12, "ENVBYTES", 8);
    sl_buf_fini(&r);
    sl_buf_fini(&r2);
    rec_batch_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tuple_layout), cmocka_unit_test(test_range_checks),
        cmocka_unit_test(test_synth_id),     cmocka_unit_test(test_offsets_and_bad_records),
        cmocka_unit_test(test_full),         cmocka_unit_test(test_dead_letter_columns),
        cmocka_unit_test(test_pending_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
