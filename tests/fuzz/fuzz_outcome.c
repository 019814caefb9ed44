/*
 * fuzz_outcome: sl_outcome_decode on arbitrary bytes (the sluice.outcomes record value).
 *
 * Same invariants as fuzz_delivery: errors are well-formed and leave the output empty; what
 * decodes re-encodes under the same limits, decodes again and encodes identically; the state
 * name round-trips through sl_outcome_state_parse. Runs under the default limits and a 512-byte
 * body cap (which shrinks the "env" cap to 512 + 64 KiB).
 */
#include <string.h>

#include "common/sl_record.h"
#include "fuzz_common.h"

static void check_round_trip(const struct sl_outcome *o, const struct sl_decode_limits *lim)
{
    struct sl_buf b1, b2;
    struct sl_outcome o2;
    enum sl_outcome_state st;
    sl_err_t err;

    const char *name = sl_outcome_state_name(o->state);
    SL_FUZZ_CHECK(name != NULL);
    SL_FUZZ_CHECK(sl_outcome_state_parse(name, strlen(name), &st) == 0 && st == o->state);
    sl_buf_init(&b1, SIZE_MAX / 2);
    sl_buf_init(&b2, SIZE_MAX / 2);
    SL_FUZZ_CHECK(sl_outcome_encode_lim(o, lim, &b1, &err) == 0);
    SL_FUZZ_CHECK(sl_outcome_decode(b1.data, b1.len, lim, &o2, &err) == 0);
    SL_FUZZ_CHECK(o2.state == o->state && o2.attempt == o->attempt && o2.next_ms == o->next_ms);
    SL_FUZZ_CHECK(sl_outcome_encode_lim(&o2, lim, &b2, &err) == 0);
    SL_FUZZ_CHECK(b1.len == b2.len && memcmp(b1.data, b2.data, b1.len) == 0);
    sl_outcome_fini(&o2);
    sl_buf_fini(&b1);
    sl_buf_fini(&b2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct sl_decode_limits small = {.max_body = 512, .max_record = 0};
    const struct sl_decode_limits *lims[2] = {NULL, &small};

    for (int i = 0; i < 2; i++) {
        struct sl_outcome o, zero;
        sl_err_t err = {0};
        memset(&zero, 0, sizeof(zero));
        int rc = sl_outcome_decode(data, size, lims[i], &o, &err);
        if (rc == 0) {
            SL_FUZZ_CHECK(sl_record_prescan(data, size, SL_RECORD_MAX_DEPTH, NULL) == 0);
            SL_FUZZ_CHECK(o.own != NULL);
            SL_FUZZ_CHECK(o.state == SL_OUTCOME_QUARANTINED || (o.id && o.ep && o.type));
            check_round_trip(&o, lims[i]);
        } else {
            SL_FUZZ_CHECK_ERR(rc, err);
            SL_FUZZ_CHECK(memcmp(&o, &zero, sizeof(o)) == 0);
        }
        sl_outcome_fini(&o);
    }
    return 0;
}
