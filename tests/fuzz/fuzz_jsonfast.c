/*
 * fuzz_jsonfast: sl_json_elide_bodies (common/sl_jsonfast.c) against jansson, on arbitrary
 * bytes as a publish request's body. The first input byte selects the shape: even one
 * event, odd a batch ({"events": [...]}).
 *
 * Invariant (differential): whenever the shortcut answers 0, jansson (JSON_REJECT_DUPLICATES)
 * accepts both the text and the envelope, the envelope's tree equals the text's tree with
 * every elided body emptied ({} or []), and every elided body found in the text by
 * sl_json_member_span parses to the value jansson gave it. So the shortcut never accepts
 * what jansson refuses, never changes a value the API reads, and the bytes sent as a body
 * are the body. When it answers SL_ENOTFOUND the API parses the text with jansson alone.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/sl_err.h"
#include "common/sl_jsonl.h"
#include "fuzz_common.h"

/* Empty the event's object/array body in the tree; check the text's bytes for it. */
static void event(json_t *ev, const char *text, size_t len)
{
    json_t *body = json_is_object(ev) ? json_object_get(ev, "body") : NULL;
    if (!body || !(json_is_object(body) || json_is_array(body)))
        return;
    size_t off, vlen;
    SL_FUZZ_CHECK(text != NULL);
    SL_FUZZ_CHECK(sl_json_member_span(text, len, "body", &off, &vlen) == 0);
    json_t *again = json_loadb(text + off, vlen, JSON_REJECT_DUPLICATES, NULL);
    SL_FUZZ_CHECK(again != NULL && json_equal(again, body));
    json_decref(again);
    json_object_set_new(ev, "body", json_is_object(body) ? json_object() : json_array());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum sl_json_shape shape = (data[0] & 1) ? SL_JSON_BATCH : SL_JSON_EVENT;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    char *env = malloc(len ? len : 1);
    size_t env_len = 0;
    int rc = sl_json_elide_bodies(text, len, shape, env, &env_len);
    if (rc != 0) {
        SL_FUZZ_CHECK(rc == SL_ENOTFOUND);
        free(env);
        return 0;
    }
    SL_FUZZ_CHECK(env_len <= len);
    json_t *full = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *short_tree = json_loadb(env, env_len, JSON_REJECT_DUPLICATES, NULL);
    SL_FUZZ_CHECK(full != NULL && json_is_object(full));
    SL_FUZZ_CHECK(short_tree != NULL);
    if (shape == SL_JSON_EVENT) {
        event(full, text, len);
    } else {
        json_t *evs = json_object_get(full, "events");
        size_t aoff, alen, n = 0;
        size_t cnt = json_is_array(evs) ? json_array_size(evs) : 0;
        size_t *offs = calloc(cnt + 1, sizeof(*offs)), *lens = calloc(cnt + 1, sizeof(*lens));
        bool spans = cnt > 0 && sl_json_member_span(text, len, "events", &aoff, &alen) == 0 &&
                     sl_json_array_spans(text + aoff, alen, cnt, offs, lens, &n) == 0 && n == cnt;
        /* what api_events_publish_batch relies on: plain text always splits */
        SL_FUZZ_CHECK(cnt == 0 || spans);
        for (size_t i = 0; i < cnt; i++)
            event(json_array_get(evs, i), text + aoff + offs[i], lens[i]);
        free(offs);
        free(lens);
    }
    SL_FUZZ_CHECK(json_equal(full, short_tree));
    json_decref(full);
    json_decref(short_tree);
    free(env);
    return 0;
}
