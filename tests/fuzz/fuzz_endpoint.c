/*
 * fuzz_endpoint: sl_endpoint_rec_decode on arbitrary bytes (the sluice.endpoints record value;
 * tombstones never reach the decoder, an empty value is just another input here).
 *
 * Invariants as in fuzz_delivery: well-formed errors and an empty output on failure; what
 * decodes has 1..8 secrets, re-encodes, decodes again and encodes identically.
 */
#include <string.h>

#include "common/sl_record.h"
#include "fuzz_common.h"

static void check_round_trip(const struct sl_endpoint_rec *e)
{
    struct sl_buf b1, b2;
    struct sl_endpoint_rec e2;
    sl_err_t err;

    sl_buf_init(&b1, SIZE_MAX / 2);
    sl_buf_init(&b2, SIZE_MAX / 2);
    SL_FUZZ_CHECK(sl_endpoint_rec_encode(e, &b1, &err) == 0);
    SL_FUZZ_CHECK(sl_endpoint_rec_decode(b1.data, b1.len, NULL, &e2, &err) == 0);
    SL_FUZZ_CHECK(e2.n_secrets == e->n_secrets && e2.method == e->method);
    SL_FUZZ_CHECK(sl_endpoint_rec_encode(&e2, &b2, &err) == 0);
    SL_FUZZ_CHECK(b1.len == b2.len && memcmp(b1.data, b2.data, b1.len) == 0);
    sl_endpoint_rec_fini(&e2);
    sl_buf_fini(&b1);
    sl_buf_fini(&b2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sl_endpoint_rec e, zero;
    sl_err_t err = {0};

    memset(&zero, 0, sizeof(zero));
    int rc = sl_endpoint_rec_decode(data, size, NULL, &e, &err);
    if (rc == 0) {
        SL_FUZZ_CHECK(sl_record_prescan(data, size, SL_RECORD_MAX_DEPTH, NULL) == 0);
        SL_FUZZ_CHECK(e.own && e.id && e.url && e.secrets);
        SL_FUZZ_CHECK(e.n_secrets >= 1 && e.n_secrets <= SL_SECRETS_MAX);
        SL_FUZZ_CHECK(sl_http_method_name(e.method) != NULL);
        check_round_trip(&e);
    } else {
        SL_FUZZ_CHECK_ERR(rc, err);
        SL_FUZZ_CHECK(memcmp(&e, &zero, sizeof(e)) == 0);
    }
    sl_endpoint_rec_fini(&e);
    return 0;
}
