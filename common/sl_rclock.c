/*
 * sl_rclock: Redis's clock for callers outside a script (see sl_rclock.h).
 */
#include "common/sl_rclock.h"

#include <stdlib.h>

/* One TIME field (a decimal string) as a number, or -1. */
static long long time_field(const redisReply *e)
{
    if (!e || e->type != REDIS_REPLY_STRING || e->len == 0 || e->len > 20)
        return -1;
    char *end = NULL;
    long long v = strtoll(e->str, &end, 10);
    return end == e->str + e->len && v >= 0 ? v : -1;
}

int sl_rclock_now_ms(sl_redis_t *r, int64_t *now_ms, sl_err_t *err)
{
    const char *argv[] = {"TIME"};
    redisReply *rep = sl_redis_cmd(r, 1, 1, argv, NULL, err);
    if (!rep)
        return SL_EREDIS;
    int rc = 0;
    long long s = -1, us = -1;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
        s = time_field(rep->element[0]);
        us = time_field(rep->element[1]);
    }
    if (s < 0 || us < 0 || us >= 1000000 || s > INT64_MAX / 1000 - 1)
        rc = sl_err_set(err, SL_EREDIS, "could not read the redis clock: unexpected reply to TIME");
    else
        *now_ms = (int64_t)s * 1000 + (int64_t)us / 1000;
    freeReplyObject(rep);
    return rc;
}
