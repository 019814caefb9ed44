/*
 * sl_breaker: read the consumers' breaker hashes (key: sl_rstate_key_breaker; fields in
 * sl_breaker.h). One HMGET per endpoint, all pipelined: a page of 500 endpoints costs one
 * round trip. Every appended command's reply is read, even after a failure, so the
 * connection's reply stream stays in step for the next caller.
 */
#include "common/sl_breaker.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl_rstate.h"

#define FIELDS 6 /* HMGET fields below */

const char *sl_breaker_state_name(enum sl_breaker_state s)
{
    switch (s) {
    case SL_BREAKER_CLOSED:
        return "closed";
    case SL_BREAKER_OPEN:
        return "open";
    case SL_BREAKER_HALF_OPEN:
        return "half_open";
    default:
        return "unknown";
    }
}

/* A decimal field of the reply, or 0 when absent or not a number. */
static int64_t field_i64(const redisReply *f)
{
    if (!f || f->type != REDIS_REPLY_STRING)
        return 0;
    char *end = NULL;
    long long v = strtoll(f->str, &end, 10);
    return end && *end == '\0' ? (int64_t)v : 0;
}

/* One HMGET reply -> view; -1 when the reply is not the expected array. */
static int parse(const redisReply *rep, struct sl_breaker_view *v)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != FIELDS)
        return -1;
    const redisReply *st = rep->element[0];
    memset(v, 0, sizeof(*v));
    bool absent = !st || st->type == REDIS_REPLY_NIL; /* no hash: never failed */
    if (!absent && st->type != REDIS_REPLY_STRING)
        return -1;
    if (absent || strcmp(st->str, "closed") == 0)
        v->state = SL_BREAKER_CLOSED;
    else if (strcmp(st->str, "open") == 0)
        v->state = SL_BREAKER_OPEN;
    else if (strcmp(st->str, "half_open") == 0)
        v->state = SL_BREAKER_HALF_OPEN;
    else
        v->state = SL_BREAKER_UNKNOWN;
    v->failures = field_i64(rep->element[1]);
    v->cooldown_ms = field_i64(rep->element[3]);
    /* the same reopen time as the breaker scripts' own view (sl_rstate.c BRK_PRELUDE) */
    if (v->state == SL_BREAKER_OPEN)
        v->reopen_at_ms = field_i64(rep->element[2]) + v->cooldown_ms;
    else if (v->state == SL_BREAKER_HALF_OPEN)
        v->reopen_at_ms = field_i64(rep->element[5]);
    return 0;
}

int sl_breaker_read(
    sl_redis_t *r, const char *const *ids, size_t n, struct sl_breaker_view *out, sl_err_t *err)
{
    size_t appended = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char key[SL_RSTATE_EPKEY_MAX];
        if (sl_rstate_key_breaker(key, sizeof(key), ids[i]) < 0) {
            rc = sl_err_set(err, SL_EINVAL, "cannot read breaker: endpoint id too long");
            goto out;
        }
        const char *argv[2 + FIELDS] = {
            "HMGET",        key,           "state",       "failures",
            "opened_at_ms", "cooldown_ms", "probe_owner", "probe_until_ms"};
        if (sl_redis_append(r, 2 + FIELDS, argv, NULL) != 0) {
            rc = sl_err_set(err, SL_EREDIS, "could not read breakers: redis unreachable");
            goto out;
        }
        appended++;
    }
out:
    /* read every reply that was asked for, even after a failure (keeps the stream in step) */
    for (size_t i = 0; i < appended; i++) {
        sl_err_t e;
        redisReply *rep = sl_redis_get_reply(r, rc == 0 ? err : &e);
        if (!rep) {
            if (rc == 0)
                rc = SL_EREDIS;
            break; /* the connection was dropped: nothing more to read */
        }
        if (rc == 0 && parse(rep, &out[i]) != 0)
            rc = sl_err_set(err, SL_EREDIS, "could not read breakers: unexpected reply");
        freeReplyObject(rep);
    }
    return rc;
}
