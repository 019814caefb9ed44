/*
 * fuzz_api: the decoders sluice-api runs on request bytes before anything else.
 *
 * The first input byte selects the target:
 *   even: sl_apikey_parse on the rest (the token of an Authorization header). A parsed
 *         token has the documented shape: 64 bytes, "slk_" + a valid id + "_" + 43 characters,
 *         and the id it returns is the one in the text.
 *   odd:  the rest as a request body's event object: jansson, then sl_jsonl_event with the
 *         API's options (endpoint optional, "channels" allowed, an id derived when absent).
 *         Errors are well-formed and leave the output empty; a parsed event is a valid
 *         delivery once it names an endpoint, and encodes; a JSON body taken verbatim from
 *         the text parses to the same value as the tree's.
 */
#include <string.h>

#include <jansson.h>

#include "common/sl_apikey.h"
#include "common/sl_jsonl.h"
#include "common/sl_record.h"
#include "fuzz_common.h"

static void key(const uint8_t *data, size_t size)
{
    char id[SL_APIKEY_ID_LEN + 1];
    uint8_t hash[32];
    sl_err_t err = {0};
    int rc = sl_apikey_parse((const char *)data, size, id, hash, &err);
    if (rc != 0) {
        SL_FUZZ_CHECK_ERR(rc, err);
        return;
    }
    SL_FUZZ_CHECK(size == SL_APIKEY_TOKEN_LEN);
    SL_FUZZ_CHECK(memcmp(data, "slk_", 4) == 0);
    SL_FUZZ_CHECK(sl_apikey_id_valid(id, strlen(id)));
    SL_FUZZ_CHECK(memcmp(data + 4, id, SL_APIKEY_ID_LEN) == 0);
}

static void event(const uint8_t *data, size_t size)
{
    static const char *const extra[] = {"channels"};
    static const struct sl_decode_limits lim = {.max_body = 256, .max_record = 0};
    struct sl_jsonl_opts o = {.now_ms = 1700000000000ULL};
    struct sl_delivery d, zero;
    sl_err_t err = {0};
    json_error_t jerr;

    o.lim = &lim;
    o.endpoint_optional = true;
    o.extra_fields = extra;
    o.n_extra = 1;
    o.id_if_absent = "evt_0123456789abcdef0123456789";
    o.raw = (const char *)data; /* the body goes out as its own bytes of the text */
    o.raw_len = size;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!j)
        return;
    memset(&zero, 0, sizeof(zero));
    int rc = sl_jsonl_event(j, &o, &d, &err);
    json_t *body = json_object_get(j, "body");
    if (rc == 0 && body && !json_is_string(body)) {
        /* the verbatim bytes are exactly the body's JSON */
        json_t *back = json_loadb((const char *)d.body, d.body_len, JSON_DECODE_ANY, &jerr);
        SL_FUZZ_CHECK(back && json_equal(back, body));
        json_decref(back);
    }
    json_decref(j);
    if (rc != 0) {
        SL_FUZZ_CHECK_ERR(rc, err);
        SL_FUZZ_CHECK(memcmp(&d, &zero, sizeof(d)) == 0);
        return;
    }
    struct sl_delivery named = d;
    if (!named.ep)
        named.ep = "fanout_target";
    SL_FUZZ_CHECK(sl_delivery_validate(&named, &lim, &err) == 0);
    struct sl_buf b;
    sl_buf_init(&b, SIZE_MAX / 2);
    SL_FUZZ_CHECK(sl_delivery_encode_lim(&named, &lim, &b, &err) == 0);
    sl_buf_fini(&b);
    sl_delivery_fini(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        event(data + 1, size - 1);
    else
        key(data + 1, size - 1);
    return 0;
}
