/*
 * cons_lease: the leases of claimed retry jobs (invariant 6) and the stall guard.
 *
 * A claimed job in memory keeps its lease alive (cons_renew_leases, batched per shard) and is
 * sent only with enough lease left for the whole request (cons_lease_allows_send). A loop that
 * did not run for a long time holds new sends until the group's revocation is served and the
 * leases are re-validated (cons_stall_hold). No job state changes here.
 *
 * thread: the engine's loop thread only.
 */
#include <stdlib.h>

#include "common/sl_time.h"
#include "consumer/cons_engine_int.h"

struct renew_item {
    uint32_t shard; /* retry shard of the job */
    struct job *j;  /* the job (borrowed) */
};

static int cmp_renew_item(const void *a, const void *b)
{
    uint32_t x = ((const struct renew_item *)a)->shard, y = ((const struct renew_item *)b)->shard;
    return x < y ? -1 : x > y;
}

/* Renew the leases of items[0..n) (all in one shard) until until_mono (monotonic ms); jobs
 * whose lease was taken by another claim are marked lease_lost. Returns 0 or the store's
 * error code. */
static int renew_batch(
    cons_engine_t *e, const struct renew_item *items, size_t n, int64_t until_mono, size_t *lost)
{
    const char *ids[CONS_STORE_RENEW_MAX], *toks[CONS_STORE_RENEW_MAX];
    unsigned char kept[CONS_STORE_RENEW_MAX];
    for (size_t i = 0; i < n; i++) {
        ids[i] = items[i].j->job_id;
        toks[i] = items[i].j->token;
    }
    sl_err_t err;
    /* Redis renews for the time left until until_mono from now on: never past it */
    int64_t left = until_mono - sl_mono_ms();
    int rc =
        cons_store_renew(e->redis, items[0].shard, left > 1 ? left : 1, n, ids, toks, kept, &err);
    if (rc != 0) {
        cons_warn_redis(e, &err);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (kept[i]) {
            items[i].j->lease_until_mono = until_mono;
        } else {
            items[i].j->lease_lost = true;
            (*lost)++;
        }
    }
    return 0;
}

/*
 * Keep the leases of claimed jobs alive while they are in memory: queued behind a paused or
 * busy endpoint, or waiting for their outcome's acknowledgement while Kafka is down. A lease
 * that runs out lets another pod claim the job and send it a second time. Every lease past
 * half its length is renewed, one script call per shard and batch; normally no job lives
 * that long and this costs nothing.
 */
void cons_renew_leases(cons_engine_t *e)
{
    int64_t now_mono = sl_mono_ms();
    if (cons_list_empty(&e->leased)) {
        cons_timer_disarm(&e->timers, T_RENEW); /* cons_leased_link arms it again */
        return;
    }
    if (!cons_timer_expired(&e->timers, T_RENEW, now_mono))
        return;
    int64_t lease = e->cfg->lease_ms;
    cons_timer_arm(&e->timers, T_RENEW, now_mono + (lease / 4 > 100 ? lease / 4 : 100));
    int64_t now = now_mono;
    uint32_t nshards = (uint32_t)e->cfg->retry_shards;
    size_t n = 0, cap = 0;
    struct renew_item *items = NULL;
    struct cons_link *lk, *lnx;
    CONS_LIST_FOREACH_SAFE(&e->leased, lk, lnx)
    {
        struct job *j = CONS_CONTAINER(lk, struct job, lease_link);
        if (j->lease_lost || j->lease_until_mono - now > lease / 2)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            items = sl_xrealloc(items, cap * sizeof(*items));
        }
        items[n].shard = cons_store_shard(j->job_id, nshards);
        items[n].j = j;
        n++;
    }
    if (n > 1)
        qsort(items, n, sizeof(*items), cmp_renew_item);
    size_t lost = 0;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        while (i + k < n && k < CONS_STORE_RENEW_MAX && items[i + k].shard == items[i].shard)
            k++;
        if (renew_batch(e, items + i, k, now + lease, &lost) != 0)
            break; /* Redis unavailable: the next pass tries again */
        i += k;
    }
    free(items);
    if (lost > 0)
        sl_warn("redis", "leases_lost",
                "%zu claimed retry jobs were claimed again elsewhere while held here; they will "
                "not be sent from here",
                lost);
}

bool cons_lease_allows_send(cons_engine_t *e, struct job *j)
{
    if (j->src != SRC_REDIS || !cons_link_linked(&j->lease_link))
        return true;
    if (j->lease_lost)
        return false;
    int64_t now = sl_mono_ms();
    int64_t need = cons_request_lease_ms(e, j->ce);
    if (j->lease_until_mono - now >= need)
        return true;
    struct renew_item it = {cons_store_shard(j->job_id, (uint32_t)e->cfg->retry_shards), j};
    size_t lost = 0;
    /* lease for what the request needs, or a long timeout is never sent */
    int64_t until = now + (need > e->cfg->lease_ms ? need : e->cfg->lease_ms);
    if (renew_batch(e, &it, 1, until, &lost) != 0)
        return false;
    return !j->lease_lost && j->lease_until_mono - now >= need;
}

/*
 * A loop that did not run for a long time (the process was stopped, the machine froze) may
 * hold work that is no longer its own: the group may have given its partitions to another
 * pod, and leases may have run out. librdkafka notices the lost assignment right after the
 * process resumes; until the revocation has been served (and every lease re-validated), no
 * new request starts. Returns true while sends are held.
 */
bool cons_stall_hold(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    int64_t gap = e->last_dispatch_mono ? now - e->last_dispatch_mono : 0;
    e->last_dispatch_mono = now;
    int64_t limit = e->cfg->kafka_session_timeout_ms / 2;
    if (e->cfg->lease_ms / 4 < limit)
        limit = e->cfg->lease_ms / 4;
    if (limit < STALL_MIN_MS)
        limit = STALL_MIN_MS;
    if (gap > limit) {
        /* Past the session timeout the coordinator has certainly given our partitions away,
         * but librdkafka only finds out at its next heartbeat (up to heartbeat.interval.ms
         * later, longer than STALL_HOLD_MS): wait for that revocation, bounded by a session
         * timeout in case the group somehow kept us. */
        e->await_revoke = gap > e->cfg->kafka_session_timeout_ms &&
                          e->last_revoke_mono < now - gap; /* not served since the stall */
        int64_t hold = e->await_revoke ? e->cfg->kafka_session_timeout_ms : STALL_HOLD_MS;
        e->hold_until_mono = now + hold;
        cons_timer_arm(&e->timers, T_STALL_HOLD, e->hold_until_mono);
        cons_timer_arm(&e->timers, T_RENEW, 0); /* re-validate every lease now */
        sl_warn("consumer", "loop_stalled",
                "the delivery loop did not run for %lld ms: holding new requests for up to "
                "%lld ms until the group assignment and retry leases are confirmed",
                (long long)gap, (long long)hold);
    }
    if (e->await_revoke && now >= e->hold_until_mono)
        e->await_revoke = false;
    if (now >= e->hold_until_mono)
        cons_timer_disarm(&e->timers, T_STALL_HOLD);
    return now < e->hold_until_mono;
}
