/*
 * fuzz_jsonl: sl_jsonl_parse on arbitrary bytes (a sluice-produce input line).
 *
 * Invariants: errors are well-formed and leave the output empty; a parsed line is a valid
 * delivery record (sl_delivery_validate under the same limits), encodes, and decodes back to
 * the same body bytes and header/macro counts. The first input byte selects the options (body
 * cap 64 bytes or default; line cap 256 bytes or default) so both limit paths stay reachable.
 */
#include <string.h>

#include "common/sl_jsonl.h"
#include "common/sl_record.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct sl_decode_limits small = {.max_body = 64, .max_record = 0};
    struct sl_jsonl_opts opts = {.now_ms = 1700000000000ULL};
    struct sl_delivery d, back, zero;
    sl_err_t err = {0};

    if (size < 1)
        return 0;
    opts.lim = (data[0] & 1) ? &small : NULL;
    opts.max_line = (data[0] & 2) ? 256 : 0;
    data++, size--;

    memset(&zero, 0, sizeof(zero));
    int rc = sl_jsonl_parse((const char *)data, size, &opts, &d, &err);
    if (rc != 0) {
        SL_FUZZ_CHECK_ERR(rc, err);
        SL_FUZZ_CHECK(memcmp(&d, &zero, sizeof(d)) == 0);
        return 0;
    }
    SL_FUZZ_CHECK(sl_delivery_validate(&d, opts.lim, &err) == 0);
    struct sl_buf b;
    sl_buf_init(&b, SIZE_MAX / 2);
    SL_FUZZ_CHECK(sl_delivery_encode_lim(&d, opts.lim, &b, &err) == 0);
    SL_FUZZ_CHECK(sl_delivery_decode(b.data, b.len, opts.lim, &back, &err) == 0);
    SL_FUZZ_CHECK(back.body_len == d.body_len && memcmp(back.body, d.body, d.body_len) == 0);
    SL_FUZZ_CHECK(back.n_hdr == d.n_hdr && back.n_macros == d.n_macros);
    SL_FUZZ_CHECK(strcmp(back.id, d.id) == 0 && strcmp(back.ep, d.ep) == 0);
    sl_delivery_fini(&back);
    sl_buf_fini(&b);
    sl_delivery_fini(&d);
    return 0;
}
