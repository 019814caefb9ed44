/*
 * fuzz_delivery: sl_delivery_decode on arbitrary bytes (the sluice.deliveries record value).
 *
 * Invariants beyond "no crash, no leak, no sanitizer report":
 *   - a failure fills err with the returned code and leaves the output empty;
 *   - whatever decodes also passes the pre-scan, re-encodes under the same limits, decodes
 *     again, and the second encoding is byte-identical to the first (the encoder accepts
 *     everything the decoder accepts, and encoding is deterministic);
 *   - sl_delivery_copy produces a record that encodes to the same bytes.
 * Each input runs under the default limits and under a 512-byte body cap, so the limit paths
 * are reachable within -max_len.
 */
#include <string.h>

#include "common/sl_record.h"
#include "fuzz_common.h"

static void check_round_trip(const struct sl_delivery *d, const struct sl_decode_limits *lim)
{
    struct sl_buf b1, b2, b3;
    struct sl_delivery d2, copy;
    sl_err_t err;

    sl_buf_init(&b1, SIZE_MAX / 2);
    sl_buf_init(&b2, SIZE_MAX / 2);
    sl_buf_init(&b3, SIZE_MAX / 2);
    SL_FUZZ_CHECK(sl_delivery_encode_lim(d, lim, &b1, &err) == 0);
    SL_FUZZ_CHECK(sl_delivery_decode(b1.data, b1.len, lim, &d2, &err) == 0);
    SL_FUZZ_CHECK(sl_delivery_encode_lim(&d2, lim, &b2, &err) == 0);
    SL_FUZZ_CHECK(b1.len == b2.len && memcmp(b1.data, b2.data, b1.len) == 0);
    sl_delivery_copy(&copy, d);
    SL_FUZZ_CHECK(sl_delivery_encode_lim(&copy, lim, &b3, &err) == 0);
    SL_FUZZ_CHECK(b1.len == b3.len && memcmp(b1.data, b3.data, b1.len) == 0);
    sl_delivery_fini(&copy);
    sl_delivery_fini(&d2);
    sl_buf_fini(&b1);
    sl_buf_fini(&b2);
    sl_buf_fini(&b3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct sl_decode_limits small = {.max_body = 512, .max_record = 0};
    const struct sl_decode_limits *lims[2] = {NULL, &small};

    for (int i = 0; i < 2; i++) {
        struct sl_delivery d, zero;
        sl_err_t err = {0};
        memset(&zero, 0, sizeof(zero));
        int rc = sl_delivery_decode(data, size, lims[i], &d, &err);
        if (rc == 0) {
            SL_FUZZ_CHECK(sl_record_prescan(data, size, SL_RECORD_MAX_DEPTH, NULL) == 0);
            SL_FUZZ_CHECK(d.own && d.id && d.ep && d.type && d.ct && d.body);
            check_round_trip(&d, lims[i]);
        } else {
            SL_FUZZ_CHECK_ERR(rc, err);
            SL_FUZZ_CHECK(memcmp(&d, &zero, sizeof(d)) == 0);
        }
        sl_delivery_fini(&d);
    }
    return 0;
}
