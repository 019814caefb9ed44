/*
 * cons_engine: the delivery loop (see cons_engine.h for the life of a message).
 *
 * Data structures:
 *   struct job      one delivery attempt in memory; owns the record bytes and the decoded
 *                   record; lives from intake until its fate is durable.
 *   struct cons_ep  this pod's runtime view of one endpoint: the endpoint snapshot, its
 *                   signer, a FIFO of jobs waiting for a slot, in-flight count, and a local
 *                   copy of the shared breaker state so a healthy endpoint costs no Redis
 *                   round trip per delivery.
 *   ready list      endpoints with queued jobs and a free slot, served round-robin so one
 *                   busy endpoint cannot starve the others (no head-of-line blocking).
 *
 * Durability rules (invariant 1): a Kafka job's offset is finished only after (a) its outcome
 * record was acknowledged by Kafka and (b) whatever state it left in Redis (delivered marker,
 * retry job) was written. A Redis job is removed or rescheduled under its lease token only
 * after its outcome is acknowledged; if we crash first, the lease expires and the job comes
 * back, and the delivered marker turns a repeat into a duplicate outcome instead of a send.
 *
 * Failure of Redis: marker checks fail open (deliver; at-least-once), retry writes are held in
 * memory and retried (their offsets stay unfinished, so nothing is lost), and intake stops
 * once the in-memory bound is reached.
 */
#include "consumer/cons_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_bounded.h"
#include "common/sl_kafka.h"
#include "common/sl_kstats.h"
#include "common/sl_log.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_probe.h"
#include "common/sl_record.h"
#include "common/sl_redis.h"
#include "common/sl_sign.h"
#include "common/sl_url.h"
#include "consumer/cons_backoff.h"
#include "consumer/cons_classify.h"
#include "consumer/cons_http.h"
#include "consumer/cons_metrics.h"
#include "consumer/cons_offsets.h"
#include "consumer/cons_postback.h"
#include "consumer/cons_ssrf.h"
#include "consumer/cons_store.h"

#define INTAKE_BATCH       500   /* Kafka records taken per loop turn */
#define INTAKE_STUCK_MS    1000  /* intake full this long without taking a record: pause */
#define CLAIM_BATCH        200   /* retry jobs claimed per shard per turn */
#define CLAIM_INTERVAL_MS  100   /* how often due retries are claimed */
#define STORE_INTERVAL_MS  100   /* how often finished offsets are stored */
#define MARKS_BATCH        256   /* delivered markers written in one Redis round trip... */
#define MARKS_DELAY_MS     5     /* ...or once the oldest has waited this long */
#define STATS_INTERVAL_MS  10000 /* stats log line */
#define KSTATS_INTERVAL_MS 5000  /* librdkafka statistics (lag metrics), when metrics are on */
/* SIGTERM (shutdown_timeout_ms): the drain of requests in flight ends at least
 * SHUTDOWN_RESERVE_MS before the bound, the flush of outcomes and Redis writes at least
 * SHUTDOWN_CLOSE_MS before it (commit and leaving the group), which end SHUTDOWN_DESTROY_MS
 * before it (destroying the clients) */
#define SHUTDOWN_RESERVE_MS 4000
#define SHUTDOWN_CLOSE_MS   3000
#define SHUTDOWN_DESTROY_MS 500
#define COMMIT_WAIT_MS      2000  /* a synchronous commit waits this long for its answer */
#define BRK_REFRESH_MS      1000  /* refresh of a local breaker view with recent failures */
#define BRK_STALE_MS        30000 /* refresh of any closed local breaker view this old, ms */
#define REDIS_HOLD_RETRY_MS 1000  /* retry of Redis writes that failed */
#define RESPILL_MIN_MS      500   /* a claimed job whose endpoint queue is still full waits */
#define RESPILL_SPREAD_MS   1000  /* this long plus up to this much more in the schedule */
#define URL_MAX             8192  /* expanded postback URL cap, bytes */
#define LAT_RING            128   /* latency samples per endpoint for the slow check */
#define LAT_WINDOW_S        900   /* samples older than this are ignored, s */
#define LAT_MIN_SAMPLES     20    /* fewer samples never count an endpoint as slow */
#define LEASE_MARGIN_MS                                                                            \
    1000                    /* a claimed job is sent only with this much lease to spare            \
                               beyond its request timeout, ms */
#define STALL_MIN_MS 1000   /* shortest loop stall that is treated as a freeze, ms */
#define PMARKS_MAX   200000 /* delivered markers held for a retry while Redis is down */
#define STALL_HOLD_MS                                                                              \
    1500                  /* after a freeze, no new send for this long: librdkafka                 \
                             reports a lost assignment meanwhile, ms */
#define RATE_LEASE_MS 200 /* leased rate tokens are used within this, ms */

enum job_src { SRC_KAFKA, SRC_REDIS };

/* What to do once every outcome of a job is acknowledged. */
enum job_after {
    AFTER_FINISH,   /* Kafka: finish the offset; Redis: nothing more */
    AFTER_COMPLETE, /* Redis: remove the job (delivered / dead letter / duplicate) */
};

struct cons_ep;

struct job {
    enum job_src src;                 /* where it came from */
    struct cons_offset_ref off;       /* SRC_KAFKA: offset handle */
    int32_t partition;                /* SRC_KAFKA: partition */
    int64_t offset;                   /* SRC_KAFKA: offset */
    char job_id[41];                  /* Redis job id (both sources once known) */
    char token[33];                   /* SRC_REDIS: lease token of our claim */
    char key[SL_ENDPOINT_ID_MAX + 1]; /* SRC_KAFKA: record key (must equal the endpoint id) */
    bool key_bad;                     /* SRC_KAFKA: key absent, too long or not text */
    uint8_t *raw;                     /* record bytes as received (owned); NULL once dropped
                                         as canonical (see drop_canonical_raw, job_env) */
    size_t raw_len;                   /* bytes */
    struct sl_delivery d;             /* decoded record (owned) */
    struct cons_ep *ce;               /* endpoint runtime (NULL until resolved) */
    int acks_pending;                 /* outcome records not yet acknowledged */
    enum job_after after;             /* action once acknowledged */
    bool probe;                       /* this send is the breaker's half-open probe */
    bool is_spill;                    /* scheduled without spending an attempt */
    struct curl_slist *hdrs;          /* request headers while in flight (owned; one block
                                         from hdr_block: release with free()) */
    char *url;                        /* expanded postback URL (owned) or NULL */
    void *http;                       /* cons_http handle while in flight */
    int64_t redis_hold_due;           /* next retry of a held Redis write (mono ms) */
    struct sl_outcome pending_out;    /* outcome to produce after a held write succeeds */
    char *held_msg;                   /* pending_out.msg while held (owned) or NULL */
    uint8_t *held_resp;               /* pending_out.resp while held (owned) or NULL */
    int64_t sched_due_ms;             /* held schedule: due time */
    uint32_t sched_attempt;           /* held schedule: attempts spent */
    struct job *next;                 /* queue link */
    struct job *iprev, *inext;        /* in-flight list links */
    int64_t lease_until_ms;           /* SRC_REDIS claimed: our lease ends then (unix ms) */
    bool lease_lost;                  /* SRC_REDIS claimed: another claim owns the job now */
    bool on_leased;                   /* linked in the engine's leased list */
    bool dead;                        /* dead-lettered: mark it once the outcome is acked */
    struct job *lprev, *lnext;        /* leased list links */
};

struct cons_ep {
    struct cons_engine *eng;         /* owner */
    char id[SL_ENDPOINT_ID_MAX + 1]; /* endpoint id */
    const struct sl_endpoint *ep;    /* current snapshot (reference) or NULL */
    uint64_t ep_version;             /* snapshot version the signer was built for */
    sl_signer_t *signer;             /* signer over the active secrets */
    int64_t signer_until_ms;         /* rebuild when a secret expires (unix ms; 0 = never) */
    struct job *q_head, *q_tail;     /* jobs waiting for a slot */
    size_t qlen;                     /* entries in the queue */
    int inflight;                    /* requests running */
    bool on_ready;                   /* linked in the ready list */
    struct cons_ep *ready_next;      /* ready list link */
    enum cons_brk_state brk;         /* local view of the shared breaker */
    int64_t brk_failures;            /* consecutive failures per the last Redis answer */
    int64_t brk_reopen_at;           /* open: cooldown end (unix ms, this pod's clock) */
    int64_t brk_refreshed_mono;      /* when the view was last refreshed (mono ms) */
    int64_t last_failure_mono;       /* last failure seen here (mono ms) */
    bool probe_inflight;             /* our probe is running */
    uint64_t probe_seq;              /* our latest probe: its owner id is "<pod>/<seq>" */
    int64_t tokens;                  /* rate tokens leased from the shared bucket */
    int64_t tokens_until_mono;       /* leased tokens expire then (mono ms) */
    int64_t blocked_until_mono;      /* rate limit or Retry-After pause (mono ms); 0 = none */
    bool on_blocked;                 /* linked in the blocked list */
    struct cons_ep *blocked_next;    /* blocked list link */
    double cwnd;                     /* AIMD concurrency window after 429s (<= cap) */
    uint32_t lat_ms[LAT_RING];       /* recent answered-attempt latencies, ms */
    uint32_t lat_at_s[LAT_RING];     /* when each was taken (mono s) */
    uint32_t nlat, lat_pos;          /* samples held / next slot */
    int64_t failing_since_ms;        /* first failure with no success since (unix ms; 0) */
    bool disabled_local;             /* we asked the registry to disable it; until the
                                        registry answers, treat it as disabled here */
    uint64_t disabled_version;       /* snapshot version when we asked */
    struct cons_ep_metrics *m;       /* per-endpoint series, or NULL (metrics_endpoint_top) */
};

/* A record for Kafka (an outcome, a quarantined record) that the producer would not take
 * (local queue full, broker trouble) or that Kafka did not acknowledge: kept, in order, and
 * produced again from the loop (retry_records) until Kafka takes it. Its job stays in memory
 * meanwhile (acks_pending counts it), so the job's offset stays open or its lease kept: never
 * dropped, never produced from inside a callback, never waited for. */
struct held_rec {
    struct job *j;            /* the job the record belongs to (borrowed) */
    char *topic;              /* owned */
    void *key, *val;          /* owned (key may be NULL) */
    size_t key_len, val_len;  /* bytes */
    rd_kafka_headers_t *hdrs; /* owned, or NULL */
    int64_t since_mono;       /* when it was first held (mono ms) */
    struct held_rec *next;    /* FIFO link */
};

/* A delivered or dead-letter marker whose write failed: written again once Redis answers. */
struct pmark {
    char *ep;                   /* endpoint id (owned) */
    char *id;                   /* event id (owned) */
    struct cons_done_info info; /* what the marker remembers of the delivery (delivered) */
    bool dead;                  /* a dead-letter marker (info unused) */
};

struct cons_engine {
    const struct sl_config *cfg;             /* borrowed */
    sl_endpoints_t *endpoints;               /* borrowed */
    rd_kafka_t *consumer;                    /* group consumer on topic_deliveries */
    rd_kafka_t *producer;                    /* outcomes and quarantine */
    rd_kafka_queue_t *cq;                    /* consumer queue (io events) */
    rd_kafka_queue_t *pq;                    /* producer main queue (io events) */
    sl_redis_t *redis;                       /* shared state */
    cons_http_t *http;                       /* transfers */
    cons_offsets_t *offsets;                 /* contiguous offsets */
    struct cons_ssrf_policy ssrf;            /* address policy */
    sl_map_t *eps;                           /* endpoint id -> struct cons_ep */
    struct cons_ep *ready_head, *ready_tail; /* endpoints ready to send */
    struct cons_ep *blocked;                 /* endpoints paused by a rate limit or Retry-After */
    struct job *held;                        /* jobs whose Redis write failed, retried later */
    struct job *inflight;                    /* jobs with a request running */
    struct job *marks;                       /* delivered jobs waiting for their marker write */
    struct job *leased;                      /* claimed retry jobs in memory whose leases we keep */
    struct pmark *pmarks;                    /* delivered markers whose write failed (owned) */
    struct held_rec *hrec_head, *hrec_tail;  /* records Kafka has not taken yet, FIFO (owned) */
    size_t nhrec;                            /* entries in the held-record list */
    int64_t hrec_logged_mono;                /* last records_held log line (mono ms) */
    size_t npmarks, cap_pmarks;              /* entries in pmarks / allocated */
    int64_t next_pmark_mono;                 /* next retry of pmarks (mono ms) */
    int64_t next_renew_mono;                 /* next lease renewal pass (mono ms) */
    int64_t last_dispatch_mono;  /* previous dispatch call, for stall detection (mono ms) */
    int64_t hold_until_mono;     /* after a stall: no new send before this (mono ms) */
    bool await_revoke;           /* a stall outlived the session: hold until the group's
                                    revocation is served (or hold_until_mono passes) */
    int64_t last_revoke_mono;    /* last revocation served (mono ms; 0 = none) */
    size_t nmarks;               /* entries in marks */
    int64_t marks_since_mono;    /* when the oldest entry of marks was added (mono ms) */
    int wake[2];                 /* pipe librdkafka writes to */
    char pod[SL_POD_MAX + 1];    /* instance id (the process's: every loop of it) */
    char owner[SL_POD_MAX + 13]; /* this loop's breaker owner id: pod, or pod#i when the
                                    process runs several loops ("#" and an int) */
    int thread;                  /* this loop's index (0..threads-1) */
    int threads;                 /* loops in this process (consumer_threads) */
    int64_t max_inflight;        /* this loop's share of max_inflight */
    uint64_t live;               /* jobs in memory */
    int inflight_max;            /* most requests in flight since the last stats line */
    uint64_t live_max;           /* most jobs in memory since the last stats line */
    uint64_t live_cap;           /* intake takes no record at this many jobs in memory */
    uint64_t live_resume;        /* a pause of intake ends below this many */
    struct job *ihold;           /* dedup_fail_open=false: records whose duplicate check
                                    failed, waiting for Redis (owned, linked by next) */
    size_t nihold;               /* jobs in ihold */
    int64_t ihold_retry_mono;    /* next check of ihold (mono ms) */
    bool paused;                 /* partitions paused by us */
    int64_t full_since_mono;     /* intake full and taking nothing since (mono ms; 0 = not) */
    bool kafka_more;             /* the consumer queue may hold more records */
    rd_kafka_queue_t *commit_q;  /* answers of our own offset commits */
    int commits_pending;         /* commits sent whose answer has not been served */
    const char *commit_why;      /* what the last commit was for (log lines) */
    atomic_int stop;             /* shutdown requested (any thread, signal handlers) */
    _Atomic int64_t stop_mono;   /* when it was requested (mono ms; the exit bound starts) */
    atomic_bool joined;          /* a partition assignment was served (readiness) */
    int64_t shutdown_deadline;   /* SIGTERM: the whole exit ends by then (mono ms; 0 = running) */
    bool redis_failed_stopping;  /* a Redis write failed during shutdown: hold, do not retry */
    bool abandoned;              /* leaving the group outlived the bound: do not destroy */
    int beat;                    /* liveness heartbeat slot (sl_probe), -1 = none */
    bool stopping;               /* shutdown in progress */
    uint32_t next_shard;         /* round-robin claim cursor */
    int64_t next_claim_mono;     /* next claim turn */
    int64_t next_store_mono;     /* next offsets store */
    int64_t next_stats_mono;     /* next stats line */
    int64_t redis_warned_mono;   /* rate limit for Redis warnings */
    int fatal;                   /* fatal error code */
    struct cons_stats st;        /* counters */
    struct cons_stats st_last;   /* counters at the last stats line */
    struct sl_buf enc;           /* scratch for encoding */
    struct sl_buf canon;         /* scratch: a decoded record encoded again */
    struct sl_decode_limits lim; /* record limits (max_body_bytes) for decode and encode */
};

static void job_free(cons_engine_t *e, struct job *j);
static void pmarks_add(cons_engine_t *e,
                       size_t n,
                       const char **eps,
                       const char **ids,
                       const struct cons_done_info *info);
static void leased_unlink(cons_engine_t *e, struct job *j);
static void dispatch(cons_engine_t *e);

/* ==== Helpers ==== */

static void warn_redis(cons_engine_t *e, const sl_err_t *err)
{
    sl_counter_inc(cons_m.redis_errors);
    if (e->stopping)
        e->redis_failed_stopping = true; /* see redis_given_up */
    int64_t now = sl_mono_ms();
    if (now - e->redis_warned_mono < 5000)
        return;
    e->redis_warned_mono = now;
    sl_warn("redis", "redis_unavailable", "%s", err->msg);
}

/* During a shutdown, once a Redis call failed, the rest of the shutdown makes none: each
 * could wait redis_timeout_ms and the exit is bounded (shutdown_timeout_ms). What would have
 * been written stays undone the safe way: a marker is not written (the outcome is), a Kafka
 * record's offset is not stored, a claimed job's lease runs out. */
static bool redis_given_up(const cons_engine_t *e)
{
    return e->stopping && e->redis_failed_stopping;
}

static void set_ctx(struct sl_log_ctx *ctx, const struct job *j)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->event_id = j->d.id;
    ctx->endpoint_id = j->d.ep;
    ctx->attempt = (int)j->d.attempt + 1;
    ctx->partition = j->src == SRC_KAFKA ? j->partition : -1;
    ctx->offset = j->src == SRC_KAFKA ? j->offset : -1;
    sl_log_ctx_set(ctx);
}

static struct cons_ep *ep_get(cons_engine_t *e, const char *id)
{
    struct cons_ep *ce = sl_map_get(e->eps, id);
    if (ce)
        return ce;
    ce = sl_xcalloc(1, sizeof(*ce));
    ce->eng = e;
    snprintf(ce->id, sizeof(ce->id), "%s", id);
    ce->brk = CONS_BRK_CLOSED;
    ce->m = cons_metrics_endpoint(id);
    sl_map_put(e->eps, id, ce, NULL);
    return ce;
}

/* Refresh the endpoint snapshot and signer of ce; returns the snapshot or NULL (unknown). */
static const struct sl_endpoint *ep_refresh(cons_engine_t *e, struct cons_ep *ce)
{
    const struct sl_endpoint *cur = sl_endpoints_get(e->endpoints, ce->id);
    if (!cur) {
        sl_endpoint_release(ce->ep);
        ce->ep = NULL;
        return NULL;
    }
    int64_t now = sl_now_ms();
    bool rebuild = !ce->ep || cur->version != ce->ep_version || !ce->signer ||
                   (ce->signer_until_ms && now >= ce->signer_until_ms);
    sl_endpoint_release(ce->ep);
    ce->ep = cur;
    if (!rebuild)
        return cur;
    struct sl_secret active[SL_SECRETS_MAX];
    size_t n = 0;
    int64_t until = 0;
    for (size_t i = 0; i < cur->n_secrets; i++) {
        int64_t exp = (int64_t)cur->secret_exp_ms[i];
        if (exp != 0 && exp <= now)
            continue;
        active[n++] = cur->secrets[i];
        if (exp != 0 && (until == 0 || exp < until))
            until = exp;
    }
    sl_signer_destroy(ce->signer);
    ce->signer = NULL;
    if (n > 0) {
        sl_err_t err;
        if (sl_signer_new(active, n, &ce->signer, &err) != 0)
            sl_error("sign", "signer_failed", "cannot build signer for endpoint %s: %s", ce->id,
                     err.msg);
    }
    sl_secret_wipe(active, sizeof(active));
    ce->signer_until_ms = until;
    ce->ep_version = cur->version;
    return cur;
}

static void ready_push(cons_engine_t *e, struct cons_ep *ce)
{
    if (ce->on_ready)
        return;
    ce->on_ready = true;
    ce->ready_next = NULL;
    if (e->ready_tail)
        e->ready_tail->ready_next = ce;
    else
        e->ready_head = ce;
    e->ready_tail = ce;
}

static struct cons_ep *ready_pop(cons_engine_t *e)
{
    struct cons_ep *ce = e->ready_head;
    if (!ce)
        return NULL;
    e->ready_head = ce->ready_next;
    if (!e->ready_head)
        e->ready_tail = NULL;
    ce->on_ready = false;
    ce->ready_next = NULL;
    return ce;
}

static struct cons_retry_policy policy_of(const cons_engine_t *e, const struct sl_endpoint *ep)
{
    struct cons_retry_policy p;
    p.base_ms = ep ? ep->retry_base_ms : e->cfg->retry_base_ms;
    p.cap_ms = ep ? ep->retry_cap_ms : e->cfg->retry_cap_ms;
    p.max_attempts = (uint32_t)(ep ? ep->max_attempts : e->cfg->max_attempts);
    return p;
}

/* ==== Latency, pauses and throttling ==== */

static void lat_record(struct cons_ep *ce, int64_t total_us)
{
    uint32_t ms = total_us / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(total_us / 1000);
    ce->lat_ms[ce->lat_pos] = ms;
    ce->lat_at_s[ce->lat_pos] = (uint32_t)(sl_mono_ms() / 1000);
    ce->lat_pos = (ce->lat_pos + 1) % LAT_RING;
    if (ce->nlat < LAT_RING)
        ce->nlat++;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* P95 latency (ms) of this pod's recent attempts to ce; -1 with too few samples. */
static int64_t lat_p95(const struct cons_ep *ce)
{
    uint32_t tmp[LAT_RING];
    uint32_t now_s = (uint32_t)(sl_mono_ms() / 1000);
    size_t n = 0;
    for (uint32_t i = 0; i < ce->nlat; i++) {
        if (now_s - ce->lat_at_s[i] <= LAT_WINDOW_S)
            tmp[n++] = ce->lat_ms[i];
    }
    if (n < LAT_MIN_SAMPLES)
        return -1;
    qsort(tmp, n, sizeof(tmp[0]), cmp_u32);
    return tmp[(n - 1) * 95 / 100];
}

/* Breaker threshold for ce: lowered while its P95 is slow, because slow failures tie up
 * capacity for the whole timeout. */
static int64_t brk_threshold(const cons_engine_t *e, const struct cons_ep *ce)
{
    int64_t th = ce->ep ? ce->ep->brk_threshold : e->cfg->breaker_threshold;
    int64_t p95 = lat_p95(ce);
    if (p95 > e->cfg->breaker_slow_p95_ms && e->cfg->breaker_slow_threshold < th)
        th = e->cfg->breaker_slow_threshold;
    return th;
}

static void block_until(cons_engine_t *e, struct cons_ep *ce, int64_t until_mono)
{
    if (until_mono > ce->blocked_until_mono)
        ce->blocked_until_mono = until_mono;
    if (ce->on_blocked)
        return;
    ce->on_blocked = true;
    ce->blocked_next = e->blocked;
    e->blocked = ce;
}

/* Return endpoints whose pause is over to the ready list. */
static void unblock(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    struct cons_ep **pp = &e->blocked;
    while (*pp) {
        struct cons_ep *ce = *pp;
        if (now >= ce->blocked_until_mono) {
            *pp = ce->blocked_next;
            ce->on_blocked = false;
            ce->blocked_next = NULL;
            ce->blocked_until_mono = 0;
            if (ce->q_head)
                ready_push(e, ce);
        } else {
            pp = &ce->blocked_next;
        }
    }
}

/* This loop's share of a per-process limit v: v / threads rounded up, at least 1. */
static int64_t share(const cons_engine_t *e, int64_t v)
{
    int64_t s = (v + e->threads - 1) / e->threads;
    return s < 1 ? 1 : s;
}

/* The endpoint's configured cap on requests in flight. Like endpoint_backlog it holds per
 * loop, as it holds per pod: an endpoint's records share a key, so its partition and the
 * loop reading it (claimed retries come to any loop of any pod). */
static int64_t ep_cap(const cons_engine_t *e, const struct cons_ep *ce)
{
    return ce->ep ? ce->ep->max_inflight : e->cfg->max_inflight_per_endpoint;
}

/* Effective in-flight cap: the endpoint's cap, shrunk by the AIMD window after 429s. */
static int64_t inflight_cap(const cons_engine_t *e, const struct cons_ep *ce)
{
    int64_t cap = ep_cap(e, ce);
    if (ce->cwnd > 0 && (int64_t)ce->cwnd < cap)
        cap = (int64_t)ce->cwnd < 1 ? 1 : (int64_t)ce->cwnd;
    return cap;
}

/* One token from the endpoint's shared bucket (leased in small batches). Returns true when
 * ce may send now; otherwise ce is paused until the bucket refills. */
static bool rate_allows(cons_engine_t *e, struct cons_ep *ce)
{
    const struct sl_endpoint *ep = ce->ep;
    if (!ep || ep->rate <= 0)
        return true;
    int64_t now = sl_mono_ms();
    if (ce->tokens > 0 && now < ce->tokens_until_mono) {
        ce->tokens--;
        return true;
    }
    /* a lease of ~1/10 s of the rate, at least 1, at most the burst */
    int64_t want = ep->rate * 100 / (ep->rate_period_ms > 0 ? ep->rate_period_ms : 1000);
    if (want < 1)
        want = 1;
    if (want > ep->burst)
        want = ep->burst > 0 ? ep->burst : 1;
    int64_t granted = 0, wait = 0;
    sl_err_t err;
    if (cons_store_rate_take(e->redis, ce->id, ep->rate, ep->rate_period_ms,
                             ep->burst > 0 ? ep->burst : ep->rate, want, &granted, &wait,
                             &err) != 0) {
        warn_redis(e, &err);
        block_until(e, ce, now + 1000); /* without the bucket, do not risk exceeding it */
        return false;
    }
    if (granted <= 0) {
        sl_counter_inc(cons_m.rate_limited);
        block_until(e, ce, now + (wait > 0 ? wait : 10));
        return false;
    }
    ce->tokens = granted - 1;
    ce->tokens_until_mono = now + RATE_LEASE_MS;
    return true;
}

/* ==== Outcomes ==== */

static void outcome_init(cons_engine_t *e,
                         struct job *j,
                         struct sl_outcome *o,
                         enum sl_outcome_state state,
                         uint32_t attempt)
{
    memset(o, 0, sizeof(*o));
    o->id = j->d.id;
    o->ep = j->d.ep;
    o->type = j->d.type;
    o->attempt = attempt;
    o->state = state;
    o->ts_ms = (uint64_t)sl_now_ms();
    o->created_ms = j->d.ts_ms;
    o->pod = e->pod;
}

/* Produce an outcome for j; the job waits for its acknowledgement. Returns 0 or SL_E*. */
/* ==== Test-only fault points (-DSL_FAULT_INJECTION=ON; SL_FAULT=name) ====
 *   loop_stall       the loop blocks 4 s at its first delivered answer: the stall /healthz
 *                    must report (tests/e2e/test_metrics.py);
 *   records_refused  the producer "refuses" the first 20 records handed to it: they are held
 *                    and produced again (tests/e2e/test_delivery.py);
 *   records_unacked  the first 20 acknowledgements count as failures: the records are held and
 *                    produced again, so Kafka has those twice (at-least-once outcomes).
 * Without the build option each is a constant false. */
static bool fault_active(const char *name, int times)
{
#ifdef SL_FAULT_INJECTION
    static atomic_int used[3];
    static const char *const names[3] = {"loop_stall", "records_refused", "records_unacked"};
    const char *f = getenv("SL_FAULT");
    if (!f || strcmp(f, name) != 0)
        return false;
    for (int i = 0; i < 3; i++) {
        if (strcmp(names[i], name) == 0)
            return atomic_fetch_add(&used[i], 1) < times;
    }
#else
    (void)name;
    (void)times;
#endif
    return false;
}

static void fault_stall(void)
{
    if (fault_active("loop_stall", 1))
        (void)usleep(4000 * 1000);
}

static bool fault_produce_refused(void)
{
    return fault_active("records_refused", 20);
}

/* One attempt to hand a record to the producer (copied; headers copied). Never waits. */
static rd_kafka_resp_err_t produce_once(cons_engine_t *e,
                                        const char *topic,
                                        const void *key,
                                        size_t key_len,
                                        const void *val,
                                        size_t val_len,
                                        const rd_kafka_headers_t *hdrs,
                                        struct job *j)
{
    /* producev takes the headers only when it succeeds */
    rd_kafka_headers_t *h = hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
    rd_kafka_resp_err_t ke = rd_kafka_producev(
        e->producer, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY((void *)(uintptr_t)key, key_len),
        RD_KAFKA_V_VALUE((void *)(uintptr_t)val, val_len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_OPAQUE(j), RD_KAFKA_V_END);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR && h)
        rd_kafka_headers_destroy(h);
    return ke;
}

/* Keep a record Kafka has not taken (copies; hdrs is taken over) at the end of the list. */
static void hold_record(cons_engine_t *e,
                        struct job *j,
                        const char *topic,
                        const void *key,
                        size_t key_len,
                        const void *val,
                        size_t val_len,
                        rd_kafka_headers_t *hdrs,
                        const char *why)
{
    struct held_rec *h = sl_xcalloc(1, sizeof(*h));
    h->j = j;
    h->topic = sl_xstrdup(topic);
    if (key && key_len) {
        h->key = sl_xmalloc(key_len);
        memcpy(h->key, key, key_len);
        h->key_len = key_len;
    }
    h->val = sl_xmalloc(val_len ? val_len : 1);
    if (val_len)
        memcpy(h->val, val, val_len);
    h->val_len = val_len;
    h->hdrs = hdrs;
    h->since_mono = sl_mono_ms();
    if (e->hrec_tail)
        e->hrec_tail->next = h;
    else
        e->hrec_head = h;
    e->hrec_tail = h;
    e->nhrec++;
    sl_gauge_add(cons_m.records_held, 1);
    int64_t now = h->since_mono;
    if (now - e->hrec_logged_mono >= 5000) {
        e->hrec_logged_mono = now;
        SL_LOGKV(
            SL_LOG_WARN, "kafka", "records_held",
            ((struct sl_log_kv[]){SL_KV_S("topic", topic), SL_KV_I("held", (int64_t)e->nhrec)}),
            "Kafka did not take a record (%s): held and produced again; its delivery's "
            "offset stays open meanwhile",
            why);
    }
}

static void held_free(cons_engine_t *e, struct held_rec *h)
{
    free(h->topic);
    free(h->key);
    free(h->val);
    if (h->hdrs)
        rd_kafka_headers_destroy(h->hdrs);
    free(h);
    e->nhrec--;
    sl_gauge_add(cons_m.records_held, -1);
}

/* Produce what is held, oldest first, until the producer refuses one (it keeps its place). */
static void retry_records(cons_engine_t *e)
{
    while (e->hrec_head) {
        struct held_rec *h = e->hrec_head;
        rd_kafka_resp_err_t ke =
            produce_once(e, h->topic, h->key, h->key_len, h->val, h->val_len, h->hdrs, h->j);
        if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
            int64_t now = sl_mono_ms();
            if (now - e->hrec_logged_mono >= 10000) {
                e->hrec_logged_mono = now;
                SL_LOGKV(SL_LOG_WARN, "kafka", "records_held",
                         ((struct sl_log_kv[]){SL_KV_I("held", (int64_t)e->nhrec),
                                               SL_KV_I("oldest_ms", now - h->since_mono)}),
                         "records still held for Kafka: %s", rd_kafka_err2str(ke));
            }
            return;
        }
        e->hrec_head = h->next;
        if (!e->hrec_head)
            e->hrec_tail = NULL;
        held_free(e, h);
    }
}

/* Hand a record of job j to Kafka: now when nothing is held before it and the producer takes
 * it, else held (in order). j waits for its acknowledgement either way (acks_pending). */
static void send_record(cons_engine_t *e,
                        struct job *j,
                        const char *topic,
                        const void *key,
                        size_t key_len,
                        const void *val,
                        size_t val_len,
                        rd_kafka_headers_t *hdrs)
{
    j->acks_pending++;
    rd_kafka_resp_err_t ke = RD_KAFKA_RESP_ERR__STATE;
    if (!e->hrec_head && !fault_produce_refused()) {
        ke = produce_once(e, topic, key, key_len, val, val_len, hdrs, j);
        if (ke == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (hdrs)
                rd_kafka_headers_destroy(hdrs);
            return;
        }
    }
    hold_record(e, j, topic, key, key_len, val, val_len, hdrs,
                e->hrec_head && ke == RD_KAFKA_RESP_ERR__STATE ? "behind earlier held records"
                                                               : rd_kafka_err2str(ke));
}

/* Encode and send an outcome of j (see send_record). Returns 0, or the encoder's error when o
 * cannot be encoded even without its optional parts (nothing sent then). */
static int produce_outcome(cons_engine_t *e, struct job *j, const struct sl_outcome *o)
{
    sl_err_t err;
    sl_buf_reset(&e->enc);
    if (sl_outcome_encode_lim(o, &e->lim, &e->enc, &err) != 0) {
        /* the response excerpt and the record copy are optional: without them it fits */
        struct sl_outcome lean = *o;
        lean.resp = NULL;
        lean.resp_len = 0;
        lean.env = NULL;
        lean.env_len = 0;
        sl_error("kafka", "outcome_encode_failed",
                 "cannot encode outcome: %s; sending it without its response and record", err.msg);
        sl_buf_reset(&e->enc);
        if (sl_outcome_encode_lim(&lean, &e->lim, &e->enc, &err) != 0) {
            sl_error("kafka", "outcome_encode_failed", "cannot encode outcome: %s", err.msg);
            return err.code;
        }
    }
    send_record(e, j, e->cfg->topic_outcomes, j->d.ep, strlen(j->d.ep), e->enc.data, e->enc.len,
                NULL);
    return 0;
}

/* The job is done with its in-memory life once acks arrive; called when acks_pending hits 0. */
static void job_settle(cons_engine_t *e, struct job *j)
{
    if (j->dead) {
        /* Only now that the dead letter is recorded: a record read again (a commit lost to a
         * rebalance or an outage) is then not sent again. Without the marker it would be,
         * and a transient failure could even end up delivered after its dead letter. */
        sl_err_t err;
        bool written = false;
        if (!redis_given_up(e)) {
            written =
                cons_store_dead_mark(e->redis, j->d.ep, j->d.id, e->cfg->dedup_window_s, &err) == 0;
            if (!written)
                warn_redis(e, &err); /* written again once Redis answers (retry_pmarks) */
        }
        if (!written) {
            const char *ep = j->d.ep, *id = j->d.id;
            pmarks_add(e, 1, &ep, &id, NULL);
        }
    }
    if (j->src == SRC_KAFKA) {
        cons_offsets_finish(e->offsets, &j->off);
    } else if (j->after == AFTER_COMPLETE && !redis_given_up(e)) {
        sl_err_t err;
        uint32_t nshards = (uint32_t)e->cfg->retry_shards;
        int rc = cons_store_complete(e->redis, nshards, j->job_id, j->token, &err);
        if (rc == SL_ESTATE)
            sl_warn("redis", "lease_lost", "retry job lease was lost before completion");
        else if (rc != 0)
            warn_redis(e, &err); /* the lease expires; the marker (now or from retry_pmarks)
                                    prevents a resend when the job is claimed again */
    }
    job_free(e, j);
}

/* Finish a job that needs no outcome record (e.g. a Redis job re-deferred). */
static void job_done_quiet(cons_engine_t *e, struct job *j)
{
    if (j->acks_pending == 0)
        job_settle(e, j);
}

/* ==== Redis writes with hold-and-retry ==== */

/*
 * Put j in the retry schedule at due_ms with attempt attempts spent. On success, produce the
 * outcome o (may be NULL) and settle. On Redis failure the job is held and retried; for a
 * Kafka job its offset stays unfinished meanwhile.
 */
static void schedule_job(
    cons_engine_t *e, struct job *j, int64_t due_ms, uint32_t attempt, const struct sl_outcome *o);
static void dead_letter(cons_engine_t *e,
                        struct job *j,
                        uint32_t attempt,
                        uint32_t http,
                        const char *err_class,
                        const char *msg,
                        const struct cons_http_result *r);

static void
hold(cons_engine_t *e, struct job *j, int64_t due_ms, uint32_t attempt, const struct sl_outcome *o)
{
    j->sched_due_ms = due_ms;
    j->sched_attempt = attempt;
    /* o's msg and resp borrow the caller's stack and the transfer's buffer, both gone by the
     * time the write is retried: the held outcome owns copies (o may be the previous hold's
     * own outcome, so copy before freeing) */
    char *msg = o && o->msg ? sl_xstrdup(o->msg) : NULL;
    uint8_t *resp = NULL;
    if (o && o->resp && o->resp_len) {
        resp = sl_xmalloc(o->resp_len);
        memcpy(resp, o->resp, o->resp_len);
    }
    free(j->held_msg);
    free(j->held_resp);
    j->held_msg = msg;
    j->held_resp = resp;
    if (o)
        j->pending_out = *o;
    else
        memset(&j->pending_out, 0, sizeof(j->pending_out));
    j->pending_out.msg = msg;
    j->pending_out.resp = resp;
    j->pending_out.resp_len = resp ? o->resp_len : 0;
    j->redis_hold_due = sl_mono_ms() + REDIS_HOLD_RETRY_MS;
    j->next = e->held;
    e->held = j;
}

static void schedule_job(
    cons_engine_t *e, struct job *j, int64_t due_ms, uint32_t attempt, const struct sl_outcome *o)
{
    sl_err_t err;
    uint32_t nshards = (uint32_t)e->cfg->retry_shards;
    struct sl_delivery copy = j->d;
    copy.own = NULL;
    copy.attempt = attempt;
    sl_buf_reset(&e->enc);
    if (sl_delivery_encode_lim(&copy, &e->lim, &e->enc, &err) != 0) {
        /* it cannot wait in the schedule: give it up, with the reason, rather than lose it */
        sl_error("redis", "job_encode_failed", "cannot encode retry job: %s", err.msg);
        dead_letter(e, j, 0, 0, "job_encode_failed", err.msg, NULL);
        return;
    }
    int existed = 0;
    int rc;
    if (redis_given_up(e)) /* no Redis wait within the exit's bound */
        rc = sl_err_set(&err, SL_EREDIS, "redis failed during shutdown: not retried");
    else
        rc = cons_store_schedule(e->redis, nshards, j->job_id, e->enc.data, e->enc.len,
                                 due_ms - sl_now_ms(), /* a delay: Redis adds its own now */
                                 j->src == SRC_REDIS ? j->token : NULL, &existed, &err);
    if (rc == SL_ESTATE) {
        /* Our lease expired and another pod owns the job now: it is not ours to move. */
        sl_warn("redis", "lease_lost", "retry job lease was lost; leaving it to its new owner");
        job_free(e, j);
        return;
    }
    if (rc != 0) {
        warn_redis(e, &err);
        if (j->src == SRC_KAFKA) {
            hold(e, j, due_ms, attempt, o);
        } else {
            job_free(e, j); /* the lease expires and the job comes back */
        }
        return;
    }
    leased_unlink(e, j); /* a reschedule released our lease: nothing left to renew */
    j->after = AFTER_FINISH;
    if (o && o->state != SL_OUTCOME_DELIVERED) {
        struct sl_outcome oo = *o;
        if (produce_outcome(e, j, &oo) == 0)
            return; /* settles on the acknowledgement */
    }
    job_done_quiet(e, j);
}

static void retry_held(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    struct job *list = e->held;
    e->held = NULL;
    while (list) {
        struct job *j = list;
        list = j->next;
        j->next = NULL;
        if (now < j->redis_hold_due) {
            j->next = e->held;
            e->held = j;
            continue;
        }
        struct sl_outcome o = j->pending_out;
        schedule_job(e, j, j->sched_due_ms, j->sched_attempt, o.id ? &o : NULL);
    }
}

/* ==== Jobs ==== */

static struct job *job_new(cons_engine_t *e, enum job_src src, const void *raw, size_t len)
{
    struct job *j = sl_xcalloc(1, sizeof(*j));
    j->src = src;
    j->raw = sl_xmalloc(len ? len : 1);
    memcpy(j->raw, raw, len);
    j->raw_len = len;
    e->live++;
    sl_gauge_add(cons_m.queued, 1);
    if (e->live > e->live_max)
        e->live_max = e->live;
    return j;
}

/* The leased list: claimed retry jobs in memory, whose leases renew_leases keeps alive until
 * their lease is released (reschedule) or the job is freed (invariant 6). */
static void leased_link(cons_engine_t *e, struct job *j)
{
    j->lprev = NULL;
    j->lnext = e->leased;
    if (e->leased)
        e->leased->lprev = j;
    e->leased = j;
    j->on_leased = true;
}

static void leased_unlink(cons_engine_t *e, struct job *j)
{
    if (!j->on_leased)
        return;
    if (j->lprev)
        j->lprev->lnext = j->lnext;
    else
        e->leased = j->lnext;
    if (j->lnext)
        j->lnext->lprev = j->lprev;
    j->lprev = j->lnext = NULL;
    j->on_leased = false;
}

static void job_free(cons_engine_t *e, struct job *j)
{
    if (!j)
        return;
    leased_unlink(e, j);
    free(j->hdrs); /* one block: see hdr_block */
    free(j->url);
    free(j->held_msg);
    free(j->held_resp);
    sl_delivery_fini(&j->d);
    free(j->raw);
    free(j);
    e->live--;
    sl_gauge_add(cons_m.queued, -1);
}

/*
 * The record bytes of a job are needed after intake only when its outcome carries them
 * (retry scheduled, deferred, dead letter: `retries rebuild` and replay read them there).
 * Most jobs are delivered, so keeping about 0.6 KiB of bytes beside the decoded copy of every
 * job in memory is wasted (12 MB of the consumer's RSS at 10,000 in flight: bench/README.md,
 * "Consumer memory").
 * When the decoded copy encodes back to exactly the bytes received (sluice-produce and the
 * producer library write the canonical encoding), the bytes are dropped; job_env makes them
 * again, byte for byte, if an outcome needs them. A record that encodes back differently (an
 * unknown key kept for a newer reader, another encoder's key order) keeps its bytes.
 */
static int encode_canon(cons_engine_t *e, const struct job *j, sl_err_t *err)
{
    sl_buf_reset(&e->canon);
    return sl_delivery_encode_lim(&j->d, &e->lim, &e->canon, err);
}

static void drop_canonical_raw(cons_engine_t *e, struct job *j)
{
    if (!j->raw || !j->raw_len)
        return;
    if (encode_canon(e, j, NULL) != 0)
        return;
    if (e->canon.len != j->raw_len || memcmp(e->canon.data, j->raw, j->raw_len) != 0) {
        e->st.raw_kept++;
        return;
    }
    free(j->raw);
    j->raw = NULL;
}

/* The record bytes of j, made again from the decoded copy when drop_canonical_raw dropped
 * them; owned by the job from then on (a held outcome may point at them). NULL on the
 * (unexpected) failure to encode, with an error line: the outcome goes without them. */
static const uint8_t *job_env(cons_engine_t *e, struct job *j, size_t *len)
{
    if (!j->raw && j->raw_len) {
        sl_err_t err;
        if (encode_canon(e, j, &err) != 0 || e->canon.len != j->raw_len) {
            sl_error("consumer", "record_reencode_failed",
                     "could not make a record's bytes again for its outcome: %s",
                     e->canon.len != j->raw_len ? "length differs" : err.msg);
            *len = 0;
            return NULL;
        }
        j->raw = sl_xmalloc(j->raw_len);
        memcpy(j->raw, e->canon.data, j->raw_len);
    }
    *len = j->raw ? j->raw_len : 0;
    return j->raw;
}

/* Quarantine an undecodable record with the reason (Kafka jobs only). */
static void quarantine(cons_engine_t *e, struct job *j, const char *reason)
{
    char part[16], off[24];
    snprintf(part, sizeof(part), "%d", (int)j->partition);
    snprintf(off, sizeof(off), "%lld", (long long)j->offset);
    e->st.quarantined++;
    sl_counter_inc(cons_m.quarantined);
    sl_warn("kafka", "record_quarantined", "record quarantined: %s", reason);
    rd_kafka_headers_t *h = rd_kafka_headers_new(4);
    rd_kafka_header_add(h, "sluice-reason", -1, reason, (ssize_t)strlen(reason));
    rd_kafka_header_add(h, "sluice-source-topic", -1, e->cfg->topic_deliveries, -1);
    rd_kafka_header_add(h, "sluice-source-partition", -1, part, -1);
    rd_kafka_header_add(h, "sluice-source-offset", -1, off, -1);
    send_record(e, j, e->cfg->topic_quarantine, NULL, 0, j->raw, j->raw_len, h);
}

/* Dead-letter j with error class and message. attempt: the attempt that failed, or 0 when j
 * dies without one (endpoint gone or disabled; j->d.attempt were spent before). */
static void dead_letter(cons_engine_t *e,
                        struct job *j,
                        uint32_t attempt,
                        uint32_t http,
                        const char *err_class,
                        const char *msg,
                        const struct cons_http_result *r)
{
    struct sl_outcome o;
    outcome_init(e, j, &o, SL_OUTCOME_DEAD_LETTER, attempt);
    o.http = http;
    o.err = err_class;
    o.msg = msg;
    o.env = job_env(e, j, &o.env_len);
    if (r) {
        o.lat_us = (uint64_t)r->total_us;
        o.dns_us = (uint64_t)r->dns_us;
        o.conn_us = (uint64_t)r->connect_us;
        o.tls_us = (uint64_t)r->tls_us;
        o.ttfb_us = (uint64_t)r->ttfb_us;
        o.resp = r->resp_len ? r->resp : NULL;
        o.resp_len = r->resp_len;
    }
    e->st.dead++;
    sl_counter_inc(cons_m.dead);
    uint32_t spent = attempt ? attempt : j->d.attempt;
    struct sl_log_ctx ctx;
    set_ctx(&ctx, j);
    SL_LOGKV(SL_LOG_WARN, "deliver", "dead_letter",
             ((struct sl_log_kv[]){SL_KV_S("err", err_class), SL_KV_I("status", http)}),
             "delivery dead-lettered after %u attempt%s", spent, spent == 1 ? "" : "s");
    sl_log_ctx_clear();
    j->after = AFTER_COMPLETE;
    j->dead = true;
    if (produce_outcome(e, j, &o) != 0)
        job_free(e, j); /* offset stays unfinished (Kafka) or lease expires (Redis) */
}

/* Defer j without spending an attempt (breaker open, backlog spill, shutdown). */
static void defer_job(cons_engine_t *e, struct job *j, int64_t due_ms, const char *why)
{
    struct sl_outcome o;
    outcome_init(e, j, &o, SL_OUTCOME_DEFERRED, 0);
    o.next_ms = (uint64_t)due_ms;
    o.err = why;
    if (j->src == SRC_KAFKA) {
        /* the delivery moves from Kafka into Redis: its record travels with the outcome so
         * `sluicectl retries rebuild` can restore the schedule after a Redis loss */
        o.env = job_env(e, j, &o.env_len);
    }
    schedule_job(e, j, due_ms, j->d.attempt, &o);
}

/* Ask the registry to disable ce (410, or nothing but failures for disable_after_ms): an
 * outcome with state "disabled" that the recorder applies to the registry, which republishes
 * the endpoint so every pod stops. This pod stops at once. */
static void request_disable(cons_engine_t *e, struct job *j, const char *why, const char *msg)
{
    struct cons_ep *ce = j->ce;
    if (ce->disabled_local)
        return;
    ce->disabled_local = true;
    ce->disabled_version = ce->ep ? ce->ep->version : 0;
    SL_LOGKV(SL_LOG_WARN, "deliver", "endpoint_disable_requested",
             ((struct sl_log_kv[]){SL_KV_S("reason", why)}),
             "asking the registry to disable endpoint %s: %s", ce->id, msg);
    struct job *n = job_new(e, SRC_REDIS, "", 0); /* carries only the outcome */
    sl_delivery_copy(&n->d, &j->d);
    n->after = AFTER_FINISH;
    n->token[0] = '\0';
    struct sl_outcome o;
    outcome_init(e, n, &o, SL_OUTCOME_DISABLED, 0);
    o.err = why;
    o.msg = msg;
    if (produce_outcome(e, n, &o) != 0)
        job_free(e, n);
}

/* ==== Intake: decode, resolve, dedup, enqueue ==== */

/* Decode and resolve one job. Returns true when it should go on to the marker check. */
static bool intake_resolve(cons_engine_t *e, struct job *j)
{
    sl_err_t err;
    if (sl_delivery_decode(j->raw, j->raw_len, &e->lim, &j->d, &err) != 0) {
        if (j->src == SRC_KAFKA) {
            quarantine(e, j, err.msg);
        } else {
            sl_error("redis", "bad_retry_job", "undecodable retry job removed: %s", err.msg);
            j->after = AFTER_COMPLETE;
            job_done_quiet(e, j);
        }
        return false;
    }
    if (j->src == SRC_KAFKA) {
        /* The contract keys records by endpoint id so one endpoint's records share a
         * partition (ordering, one pod's backlog); a record keyed otherwise is invalid. */
        if (j->key_bad || strcmp(j->key, j->d.ep) != 0) {
            quarantine(e, j, "record key does not match the endpoint id (field \"ep\")");
            return false;
        }
        cons_store_job_id(j->d.ep, j->d.id, j->job_id);
    }
    bool fresh = sl_map_get(e->eps, j->d.ep) == NULL;
    struct cons_ep *ce = ep_get(e, j->d.ep);
    j->ce = ce;
    const struct sl_endpoint *ep = ep_refresh(e, ce);
    if (!ep) {
        if (fresh) {
            /* no state for an id the registry does not know: records naming many unknown
             * endpoints would otherwise grow the table for ever (nothing else points at a
             * state made just now; the job leaves with its quarantine or dead letter) */
            sl_map_del(e->eps, ce->id, NULL);
            free(ce);
            j->ce = NULL;
        }
        if (j->src == SRC_KAFKA) {
            char reason[128];
            snprintf(reason, sizeof(reason), "unknown endpoint %s", j->d.ep);
            quarantine(e, j, reason);
        } else {
            /* attempt 0: no attempt is spent (the contract's rule; the recorder would
             * otherwise count the last failed attempt, already reported, a second time) */
            dead_letter(e, j, 0, 0, "unknown_endpoint", "endpoint no longer exists", NULL);
        }
        return false;
    }
    if (ce->disabled_local && ep->enabled && ep->version != ce->disabled_version)
        ce->disabled_local = false; /* the registry changed it since: its word stands */
    if (!ep->enabled || ce->disabled_local) {
        dead_letter(e, j, 0, 0, "endpoint_disabled", /* attempt 0: as above */
                    ep->reason && ep->reason[0] ? ep->reason : "endpoint disabled", NULL);
        return false;
    }
    drop_canonical_raw(e, j);
    return true;
}

static void enqueue(cons_engine_t *e, struct job *j)
{
    struct cons_ep *ce = j->ce;
    if ((int64_t)ce->qlen >= e->cfg->endpoint_backlog && !e->stopping) {
        e->st.spilled++;
        sl_counter_inc(cons_m.spills);
        j->is_spill = true;
        if (j->src == SRC_REDIS) {
            /* Claimed from the schedule while the queue is still full: back in, a little
             * later and quietly (it is in the schedule already, its first spill reported
             * it). Due at once it came back every claim turn, each time with an outcome. */
            int64_t due = sl_now_ms() + RESPILL_MIN_MS +
                          (int64_t)cons_rng_uniform(cons_rng_default(), RESPILL_SPREAD_MS);
            schedule_job(e, j, due, j->d.attempt, NULL);
            return;
        }
        /* Beyond the bound the partition keeps flowing: park the job in Redis, due now. */
        defer_job(e, j, sl_now_ms(), "backlog_spill");
        return;
    }
    j->next = NULL;
    if (ce->q_tail)
        ce->q_tail->next = j;
    else
        ce->q_head = j;
    ce->q_tail = j;
    ce->qlen++;
    ready_push(e, ce);
}

/* Hold n records for their duplicate check (newest first on the list; retry_ihold takes them
 * oldest first). */
static void ihold_push(cons_engine_t *e, struct job **jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        jobs[i]->next = e->ihold;
        e->ihold = jobs[i];
        e->nihold++;
    }
}

/* Marker check for a batch, then duplicates out, the rest queued. */
static void intake_batch(cons_engine_t *e, struct job **jobs, size_t n)
{
    if (n == 0)
        return;
    const char **eps = sl_xcalloc(n, sizeof(*eps));
    const char **ids = sl_xcalloc(n, sizeof(*ids));
    const char **jids = sl_xcalloc(n, sizeof(*jids));
    unsigned char *dup = sl_xcalloc(n, 1);
    struct cons_done_info *info = sl_xcalloc(n, sizeof(*info));
    for (size_t i = 0; i < n; i++) {
        eps[i] = jobs[i]->d.ep;
        ids[i] = jobs[i]->d.id;
        /* a record from Kafka may be a copy read again while its retry chain runs */
        jids[i] = jobs[i]->src == SRC_KAFKA ? jobs[i]->job_id : NULL;
    }
    sl_err_t err;
    if (cons_store_intake_check(e->redis, (uint32_t)e->cfg->retry_shards, n, eps, ids, jids, dup,
                                info, &err) != 0) {
        warn_redis(e, &err);
        if (!e->cfg->dedup_fail_open) {
            /* hold them (intake pauses meanwhile) and check again when Redis answers */
            ihold_push(e, jobs, n);
            e->ihold_retry_mono = sl_mono_ms() + REDIS_HOLD_RETRY_MS;
            n = 0;
        } else {
            memset(dup, 0, n); /* fail open: at-least-once */
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct job *j = jobs[i];
        if (dup[i] == CONS_DONE_CHAIN && !j->d.replay) {
            /* Its retry job exists (leased, scheduled or deferred): that chain owns the
             * delivery and reports it; this copy, read again after a rebalance or a lost
             * commit, must not send it in parallel (or after the chain's dead letter). */
            e->st.duplicates++;
            sl_counter_inc(cons_m.duplicates);
            job_done_quiet(e, j);
            continue;
        }
        if (dup[i] == CONS_DONE_DEAD && !j->d.replay) {
            /* Dead-lettered already (the record was read again): nothing to send and nothing
             * new to report; a replay is the way to send it again. */
            e->st.duplicates++;
            sl_counter_inc(cons_m.duplicates);
            j->after = AFTER_COMPLETE;
            job_done_quiet(e, j);
            continue;
        }
        if (dup[i] == CONS_DONE_DELIVERED) {
            e->st.duplicates++;
            sl_counter_inc(cons_m.duplicates);
            j->after = AFTER_COMPLETE;
            struct sl_outcome o;
            if (info[i].attempt > 0) {
                /* The delivery's own outcome again, as the marker remembers it: the same
                 * (attempt, state, ts) is the same history row, so the recorder keeps one;
                 * when the first one was lost (the pod that delivered was killed before its
                 * acknowledgement), this one fills the gap. */
                outcome_init(e, j, &o, SL_OUTCOME_DELIVERED, info[i].attempt);
                o.ts_ms = (uint64_t)info[i].ts_ms;
                o.http = info[i].status;
                o.lat_us = info[i].lat_us;
                o.msg = "reported again from the delivered marker";
                if (produce_outcome(e, j, &o) != 0) {
                    job_free(e, j);
                    continue;
                }
            }
            outcome_init(e, j, &o, SL_OUTCOME_DUPLICATE, 0);
            if (produce_outcome(e, j, &o) != 0 && j->acks_pending == 0)
                job_free(e, j);
            continue;
        }
        enqueue(e, j);
    }
    free(eps);
    free(ids);
    free(jids);
    free(dup);
    free(info);
}

/* dedup_fail_open=false: check the held records again, about once a second. */
static void retry_ihold(cons_engine_t *e)
{
    if (!e->ihold || sl_mono_ms() < e->ihold_retry_mono)
        return;
    size_t n = e->nihold;
    struct job **jobs = sl_xcalloc(n, sizeof(*jobs));
    size_t k = n;
    for (struct job *j = e->ihold; j && k > 0; j = j->next)
        jobs[--k] = j; /* oldest first */
    for (size_t i = 0; i < n; i++)
        jobs[i]->next = NULL;
    e->ihold = NULL;
    e->nihold = 0;
    intake_batch(e, jobs, n); /* holds them again if Redis still does not answer */
    if (!e->ihold)
        sl_info("redis", "intake_resumed", "%zu held records checked after redis came back", n);
    free(jobs);
}

/* Pause or resume every assigned partition (the caller logs why). */
static void set_intake_paused(cons_engine_t *e, bool pause)
{
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(e->consumer, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a) {
        if (pause)
            rd_kafka_pause_partitions(e->consumer, a);
        else
            rd_kafka_resume_partitions(e->consumer, a);
        rd_kafka_topic_partition_list_destroy(a);
    }
    e->paused = pause;
    e->full_since_mono = 0;
}

/*
 * Intake is full (live_cap jobs in memory). The records librdkafka fetched stay in its queue,
 * untouched, and the loop takes them as answers make room: a pause would purge them
 * (librdkafka 2.0.2 drops a paused partition's fetched records and fetches them again on
 * resume), and a loop that paused at every burst fetched and decompressed everything twice;
 * at 11,000/s that held two loops at 6,000-7,500/s together until the publisher stopped
 * (bench/README.md, "Intake at its cap"). A rebalance does not wait behind those records
 * (librdkafka pauses the partitions itself before it hands one over), but it is only served by a
 * poll: a loop that could take no record for INTAKE_STUCK_MS (every request waits on slow
 * endpoints) pauses, and polls for events alone until it has room again. Returns whether the
 * partitions are paused now.
 */
static bool intake_full(cons_engine_t *e)
{
    int64_t now = sl_mono_ms();
    if (e->full_since_mono == 0) {
        e->full_since_mono = now;
        return false;
    }
    if (now - e->full_since_mono < INTAKE_STUCK_MS)
        return false;
    /* counted before the pause, which adds an op per partition to the queue */
    int64_t fetched = (int64_t)rd_kafka_queue_length(e->cq);
    set_intake_paused(e, true);
    SL_LOGKV(
        SL_LOG_INFO, "kafka", "intake_paused",
        ((struct sl_log_kv[]){SL_KV_I("in_memory", (int64_t)e->live), SL_KV_I("fetched", fetched)}),
        "intake paused: %llu jobs in memory, and none could be taken for %d ms; the %lld "
        "records fetched are dropped and fetched again on resume",
        (unsigned long long)e->live, INTAKE_STUCK_MS, (long long)fetched);
    return true;
}

static void intake_kafka(cons_engine_t *e)
{
    e->kafka_more = false;
    if (e->stopping)
        return;
    /* Records wait for their duplicate check (Redis down, dedup_fail_open false), or intake
     * is full and stuck (intake_full): pause the partitions but keep polling, so rebalances
     * are still served (a pod that stopped polling would hold up the whole group until
     * max.poll.interval.ms). */
    if (e->ihold) {
        if (!e->paused) {
            set_intake_paused(e, true);
            sl_info("kafka", "intake_paused",
                    "intake paused: %zu records wait for their duplicate check", e->nihold);
        }
    } else if (e->live >= e->live_cap) {
        if (!e->paused && !intake_full(e))
            return; /* full: take nothing now; an answer makes room */
    } else {
        e->full_since_mono = 0; /* it has room: not stuck */
        if (e->paused && e->live < e->live_resume) {
            set_intake_paused(e, false);
            SL_LOGKV(SL_LOG_INFO, "kafka", "intake_resumed",
                     ((struct sl_log_kv[]){SL_KV_S("reason", "room")}), "intake resumed");
        }
    }
    /* Paused, the poll only serves events (rebalances); otherwise take what fits. */
    int room = INTAKE_BATCH;
    if (!e->paused && e->live_cap - e->live < (uint64_t)room)
        room = (int)(e->live_cap - e->live);
    struct job *batch[INTAKE_BATCH];
    size_t n = 0;
    for (int i = 0; i < room; i++) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(e->consumer, 0);
        if (!m)
            break;
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                sl_warn("kafka", "consume_error", "%s", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        struct job *j = job_new(e, SRC_KAFKA, m->payload ? m->payload : "", m->len);
        j->partition = m->partition;
        j->offset = m->offset;
        if (!m->key || m->key_len == 0 || m->key_len > SL_ENDPOINT_ID_MAX ||
            memchr(m->key, '\0', m->key_len)) {
            j->key_bad = true;
        } else {
            memcpy(j->key, m->key, m->key_len);
            j->key[m->key_len] = '\0';
        }
        bool tracked = cons_offsets_track(e->offsets, m->partition, m->offset, &j->off);
        rd_kafka_message_destroy(m);
        if (!tracked) {
            job_free(e, j); /* not ours (any more): the owner gets it */
            continue;
        }
        e->st.received++;
        sl_counter_inc(cons_m.received);
        if (i == INTAKE_BATCH - 1)
            e->kafka_more = true;
        if (intake_resolve(e, j))
            batch[n++] = j;
    }
    /* A revoke served inside a poll above (the rebalance callback) dropped the queued jobs of
     * the partitions it took away, but not these, which are on no queue yet: drop them here,
     * or this pod would send records the new owner sends too. */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (cons_offsets_current(e->offsets, &batch[i]->off))
            batch[kept++] = batch[i];
        else
            job_free(e, batch[i]);
    }
    if (e->ihold) { /* fetched before the pause: they wait behind the held ones */
        ihold_push(e, batch, kept);
        return;
    }
    intake_batch(e, batch, kept);
}

static void intake_redis(cons_engine_t *e)
{
    int64_t now_mono = sl_mono_ms();
    if (now_mono < e->next_claim_mono || e->stopping || e->ihold)
        return;
    e->next_claim_mono = now_mono + CLAIM_INTERVAL_MS;
    uint32_t nshards = (uint32_t)e->cfg->retry_shards;
    for (uint32_t k = 0; k < nshards; k++) {
        if (e->live >= e->live_cap)
            return;
        int64_t room = (int64_t)(e->live_cap - e->live);
        int max = room < CLAIM_BATCH ? (int)room : CLAIM_BATCH;
        uint32_t shard = e->next_shard++ % nshards;
        struct cons_claimed *c = NULL;
        sl_err_t err;
        int64_t claim_ms = sl_now_ms();
        int got = cons_store_claim(e->redis, shard, e->cfg->lease_ms, max, &c, &err);
        if (got < 0) {
            warn_redis(e, &err);
            return;
        }
        if (got > 0)
            sl_debug(SL_DBG_REDIS, "redis", "retries_claimed", "claimed %d due jobs from shard %u",
                     got, shard);
        struct job **batch = sl_xcalloc((size_t)(got ? got : 1), sizeof(*batch));
        size_t n = 0;
        for (int i = 0; i < got; i++) {
            struct job *j = job_new(e, SRC_REDIS, c[i].body, c[i].body_len);
            memcpy(j->job_id, c[i].job_id, sizeof(j->job_id));
            memcpy(j->token, c[i].token, sizeof(j->token));
            j->lease_until_ms = claim_ms + e->cfg->lease_ms;
            leased_link(e, j);
            e->st.claimed++;
            sl_counter_inc(cons_m.claimed);
            if (intake_resolve(e, j))
                batch[n++] = j;
        }
        cons_store_claimed_free(c, got);
        intake_batch(e, batch, n);
        free(batch);
    }
}

/* ==== Leases of claimed jobs (invariant 6) ==== */

struct renew_item {
    uint32_t shard; /* retry shard of the job */
    struct job *j;  /* the job (borrowed) */
};

static int cmp_renew_item(const void *a, const void *b)
{
    uint32_t x = ((const struct renew_item *)a)->shard, y = ((const struct renew_item *)b)->shard;
    return x < y ? -1 : x > y;
}

/* Renew the leases of items[0..n) (all in one shard) until until_ms; jobs whose lease was
 * taken by another claim are marked lease_lost. Returns 0 or the store's error code. */
static int renew_batch(
    cons_engine_t *e, const struct renew_item *items, size_t n, int64_t until_ms, size_t *lost)
{
    const char *ids[CONS_STORE_RENEW_MAX], *toks[CONS_STORE_RENEW_MAX];
    unsigned char kept[CONS_STORE_RENEW_MAX];
    for (size_t i = 0; i < n; i++) {
        ids[i] = items[i].j->job_id;
        toks[i] = items[i].j->token;
    }
    sl_err_t err;
    /* Redis renews for the time left until until_ms from now on: never past until_ms */
    int64_t left = until_ms - sl_now_ms();
    int rc =
        cons_store_renew(e->redis, items[0].shard, left > 1 ? left : 1, n, ids, toks, kept, &err);
    if (rc != 0) {
        warn_redis(e, &err);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (kept[i]) {
            items[i].j->lease_until_ms = until_ms;
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
static void renew_leases(cons_engine_t *e)
{
    int64_t now_mono = sl_mono_ms();
    if (!e->leased || now_mono < e->next_renew_mono)
        return;
    int64_t lease = e->cfg->lease_ms;
    e->next_renew_mono = now_mono + (lease / 4 > 100 ? lease / 4 : 100);
    int64_t now = sl_now_ms();
    uint32_t nshards = (uint32_t)e->cfg->retry_shards;
    size_t n = 0, cap = 0;
    struct renew_item *items = NULL;
    for (struct job *j = e->leased; j; j = j->lnext) {
        if (j->lease_lost || j->lease_until_ms - now > lease / 2)
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

/* May the claimed job j be sent now? Only while the lease is ours with room for the whole
 * request; a lease short of that is renewed first. */
/* How long a lease (a retry job's, or the breaker probe's) must last to cover one request to
 * ce: its timeout, which may exceed lease_ms (it is per endpoint; lease_ms is only checked
 * against the global one), plus the margin. */
static int64_t request_lease_ms(const cons_engine_t *e, const struct cons_ep *ce)
{
    return (ce && ce->ep ? ce->ep->timeout_ms : e->cfg->http_timeout_ms) + LEASE_MARGIN_MS;
}

static bool lease_allows_send(cons_engine_t *e, struct job *j)
{
    if (j->src != SRC_REDIS || !j->on_leased)
        return true;
    if (j->lease_lost)
        return false;
    int64_t now = sl_now_ms();
    int64_t need = request_lease_ms(e, j->ce);
    if (j->lease_until_ms - now >= need)
        return true;
    struct renew_item it = {cons_store_shard(j->job_id, (uint32_t)e->cfg->retry_shards), j};
    size_t lost = 0;
    /* lease for what the request needs, or a long timeout is never sent */
    int64_t until = now + (need > e->cfg->lease_ms ? need : e->cfg->lease_ms);
    if (renew_batch(e, &it, 1, until, &lost) != 0)
        return false;
    return !j->lease_lost && j->lease_until_ms - now >= need;
}

/*
 * A loop that did not run for a long time (the process was stopped, the machine froze) may
 * hold work that is no longer its own: the group may have given its partitions to another
 * pod, and leases may have run out. librdkafka notices the lost assignment right after the
 * process resumes; until the revocation has been served (and every lease re-validated), no
 * new request starts. Returns true while sends are held.
 */
static bool stall_hold(cons_engine_t *e)
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
        e->next_renew_mono = 0;
        sl_warn("consumer", "loop_stalled",
                "the delivery loop did not run for %lld ms: holding new requests for up to "
                "%lld ms until the group assignment and retry leases are confirmed",
                (long long)gap, (long long)hold);
    }
    if (e->await_revoke && now >= e->hold_until_mono)
        e->await_revoke = false;
    return now < e->hold_until_mono;
}

/* ==== Sending ==== */

static void inflight_link(cons_engine_t *e, struct job *j)
{
    j->iprev = NULL;
    j->inext = e->inflight;
    if (e->inflight)
        e->inflight->iprev = j;
    e->inflight = j;
    sl_gauge_add(cons_m.inflight, 1);
    sl_gauge_add(cons_m.queued, -1);
}

static void inflight_unlink(cons_engine_t *e, struct job *j)
{
    if (j->iprev)
        j->iprev->inext = j->inext;
    else if (e->inflight == j)
        e->inflight = j->inext;
    if (j->inext)
        j->inext->iprev = j->iprev;
    j->iprev = j->inext = NULL;
    sl_gauge_add(cons_m.inflight, -1);
    sl_gauge_add(cons_m.queued, 1);
}

static void on_http_done(void *opaque, const struct cons_http_result *r);

/* One request header line: "name: value", or name alone when value is NULL. */
struct hdr_line {
    const char *name;  /* header name, or the whole line */
    const char *value; /* value, or NULL */
};

/* Sluice's own lines (Content-Type, 3 signature lines, 2 X-Sluice-*, Expect) plus the
 * endpoint's and the record's extra headers. */
#define HDR_LINES_MAX (7 + 2 * SL_HDR_MAX)

/*
 * The request's header list in ONE allocation: n curl_slist nodes followed by their text.
 * CURLOPT_HTTPHEADER only reads the list, so the owner releases it with free(), never
 * curl_slist_free_all. curl_slist_append costs two allocations per line; at 7 lines per
 * delivery that was about 5% of the consumer's CPU (bench/README.md, "Consumer CPU").
 */
static struct curl_slist *hdr_block(const struct hdr_line *l, size_t n)
{
    size_t text = 0;
    for (size_t i = 0; i < n; i++)
        text += strlen(l[i].name) + (l[i].value ? 2 + strlen(l[i].value) : 0) + 1;
    struct curl_slist *nodes = sl_xmalloc(n * sizeof(*nodes) + text);
    char *p = (char *)(nodes + n);
    for (size_t i = 0; i < n; i++) {
        nodes[i].data = p;
        nodes[i].next = i + 1 < n ? &nodes[i + 1] : NULL;
        size_t len = strlen(l[i].name);
        memcpy(p, l[i].name, len);
        p += len;
        if (l[i].value) {
            *p++ = ':';
            *p++ = ' ';
            len = strlen(l[i].value);
            memcpy(p, l[i].value, len);
            p += len;
        }
        *p++ = '\0';
    }
    return nodes;
}

/* Build and start the request for j. Returns 0; 1 when j failed on its own (dead-lettered:
 * its template, the endpoint's secret); -1 on a local failure (j deferred a second). */
static int start_send(cons_engine_t *e, struct job *j)
{
    struct cons_ep *ce = j->ce;
    const struct sl_endpoint *ep = ce->ep;
    sl_err_t err;
    const char *url = ep->url;
    if (ep->tpl) {
        if (cons_postback_expand(ep->url, j->d.macros, j->d.n_macros, URL_MAX, &j->url, &err) !=
            0) {
            dead_letter(e, j, j->d.attempt + 1, 0,
                        err.code == SL_EMISSING ? "macro_missing" : "template_error", err.msg,
                        NULL);
            return 1;
        }
        url = j->url;
    }
    struct sl_sign_headers sh;
    if (!ce->signer) {
        dead_letter(e, j, j->d.attempt + 1, 0, "no_signing_secret",
                    "endpoint has no active signing secret", NULL);
        return 1;
    }
    /* the signature covers the bytes actually sent: a GET postback sends no body */
    bool get = ep->method == SL_METHOD_GET;
    if (sl_sign_headers(ce->signer, j->d.id, sl_now_ms() / 1000, get ? NULL : j->d.body,
                        get ? 0 : j->d.body_len, &sh, &err) != 0) {
        dead_letter(e, j, j->d.attempt + 1, 0, "sign_failed", err.msg, NULL);
        return 1;
    }
    struct hdr_line lines[HDR_LINES_MAX];
    size_t nl = 0;
    if (!get)
        lines[nl++] = (struct hdr_line){"Content-Type", ep->ct ? ep->ct : j->d.ct};
    lines[nl++] = (struct hdr_line){sh.id, NULL};
    lines[nl++] = (struct hdr_line){sh.timestamp, NULL};
    lines[nl++] = (struct hdr_line){sh.signature, NULL};
    char attempt_num[16], created_num[24];
    snprintf(attempt_num, sizeof(attempt_num), "%u", j->d.attempt + 1);
    lines[nl++] = (struct hdr_line){"X-Sluice-Attempt", attempt_num};
    snprintf(created_num, sizeof(created_num), "%llu", (unsigned long long)j->d.ts_ms);
    lines[nl++] = (struct hdr_line){"X-Sluice-Created-Ms", created_num};
    for (size_t i = 0; i < ep->n_hdr && i < SL_HDR_MAX; i++)
        lines[nl++] = (struct hdr_line){ep->hdr[i].name, ep->hdr[i].value};
    for (size_t i = 0; i < j->d.n_hdr && i < SL_HDR_MAX; i++)
        lines[nl++] = (struct hdr_line){j->d.hdr[i].name, j->d.hdr[i].value};
    lines[nl++] = (struct hdr_line){"Expect:", NULL};
    struct curl_slist *h = hdr_block(lines, nl);
    sl_secret_wipe(&sh, sizeof(sh));
    j->hdrs = h;
    struct cons_http_req req = {
        .method = sl_http_method_name(ep->method),
        .url = url,
        .headers = h,
        .body = get ? NULL : j->d.body,
        .body_len = get ? 0 : j->d.body_len,
        .timeout_ms = (long)ep->timeout_ms,
        .connect_timeout_ms = (long)ep->conn_timeout_ms,
        .done = on_http_done,
        .opaque = j,
    };
    if (cons_http_start(e->http, &req, &j->http, &err) != 0) {
        /* Local failure (out of handles): retry later without spending an attempt. */
        sl_warn("http", "send_failed", "%s", err.msg);
        defer_job(e, j, sl_now_ms() + 1000, "local_error");
        return -1;
    }
    ce->inflight++;
    inflight_link(e, j);
    e->st.sent++;
    sl_counter_inc(cons_m.attempts);
    if (j->ce->m)
        atomic_fetch_add_explicit(&j->ce->m->attempts, 1, memory_order_relaxed);
    int running = cons_http_running(e->http);
    if (running > e->inflight_max)
        e->inflight_max = running;
    if (j->probe) {
        ce->probe_inflight = true;
        e->st.probes++;
    }
    return 0;
}

static void brk_apply(struct cons_ep *ce, const struct cons_brk_view *v)
{
    if (v->state != ce->brk) {
        sl_counter_inc(v->state == CONS_BRK_OPEN        ? cons_m.brk_to_open
                       : v->state == CONS_BRK_HALF_OPEN ? cons_m.brk_to_half_open
                                                        : cons_m.brk_to_closed);
        if ((v->state == CONS_BRK_OPEN) != (ce->brk == CONS_BRK_OPEN))
            cons_metrics_breaker_open(ce->id, ce->m, v->state == CONS_BRK_OPEN);
    }
    ce->brk = v->state;
    ce->brk_failures = v->failures;
    /* Redis's times as a distance from Redis's now, onto this pod's clock */
    ce->brk_reopen_at = v->reopen_at_ms ? sl_now_ms() + (v->reopen_at_ms - v->now_ms) : 0;
    ce->brk_refreshed_mono = sl_mono_ms();
}

/* Defer everything queued on ce until t (breaker open). */
static void defer_queue(cons_engine_t *e, struct cons_ep *ce, int64_t until_ms)
{
    struct job *j = ce->q_head;
    ce->q_head = ce->q_tail = NULL;
    ce->qlen = 0;
    /* Spread over a whole cooldown (1 s .. 60 s): when the endpoint comes back, its backlog
     * arrives over that time instead of all at the moment the probe succeeds. */
    int64_t spread = ce->ep && ce->ep->brk_cooldown_ms > 0 ? ce->ep->brk_cooldown_ms : 1000;
    if (spread < 1000)
        spread = 1000;
    if (spread > 60000)
        spread = 60000;
    while (j) {
        struct job *n = j->next;
        j->next = NULL;
        e->st.deferred++;
        sl_counter_inc(cons_m.brk_deferrals);
        /* jitter so the endpoint is not hit by one burst when it comes back */
        int64_t due = until_ms + (int64_t)cons_rng_uniform(cons_rng_default(), (uint64_t)spread);
        defer_job(e, j, due, "breaker_open");
        j = n;
    }
}

/* The breaker owner id of this pod's probe number seq ("<pod>/<seq>"), or of its other
 * requests (seq 0: "<pod>"). Naming the probe, not just the pod, keeps a late failure of one
 * of the pod's earlier requests from counting as the probe's (it would re-open the breaker
 * and double the cooldown while the probe still runs). */
static void probe_owner(const cons_engine_t *e, uint64_t seq, char out[CONS_STORE_OWNER_MAX + 1])
{
    if (seq)
        snprintf(out, CONS_STORE_OWNER_MAX + 1, "%s/%llu", e->owner, (unsigned long long)seq);
    else
        snprintf(out, CONS_STORE_OWNER_MAX + 1, "%s", e->owner);
}

/* May ce send now? Consults the shared breaker only when the local view is not closed. */
static bool breaker_allows(cons_engine_t *e, struct cons_ep *ce, bool *probe)
{
    *probe = false;
    int64_t now_mono = sl_mono_ms();
    if (ce->brk == CONS_BRK_CLOSED) {
        /* A closed view may be stale: another pod may have opened the breaker. Read the
         * shared state before this pod's first request to the endpoint (it may claim
         * deferred jobs of a breaker that another pod opened), about once a second while
         * failures were seen here recently, and every BRK_STALE_MS anyway. */
        int64_t age = now_mono - ce->brk_refreshed_mono;
        bool recent = ce->last_failure_mono && now_mono - ce->last_failure_mono < 60000;
        if (ce->brk_refreshed_mono == 0 || (recent && age > BRK_REFRESH_MS) || age > BRK_STALE_MS) {
            struct cons_brk_view v;
            sl_err_t err;
            if (cons_store_brk_get(e->redis, ce->id, &v, &err) == 0)
                brk_apply(ce, &v);
        }
        if (ce->brk == CONS_BRK_CLOSED)
            return true;
    }
    if (ce->probe_inflight)
        return false;
    int64_t now = sl_now_ms();
    if (ce->brk == CONS_BRK_OPEN && now < ce->brk_reopen_at)
        return false;
    struct cons_brk_view v;
    sl_err_t err;
    /* the probe's lease outlasts its request: while it runs, no other pod probes */
    int64_t probe_lease = request_lease_ms(e, ce);
    if (probe_lease < e->cfg->lease_ms)
        probe_lease = e->cfg->lease_ms;
    char owner[CONS_STORE_OWNER_MAX + 1];
    probe_owner(e, ce->probe_seq + 1, owner);
    if (cons_store_brk_acquire(e->redis, ce->id, probe_lease, owner, &v, &err) != 0) {
        warn_redis(e, &err);
        return false;
    }
    brk_apply(ce, &v);
    if (v.state == CONS_BRK_CLOSED)
        return true;
    if (v.probe) {
        ce->probe_seq++;
        *probe = true;
        return true;
    }
    return false;
}

/* Take the head of ce's queue (non-empty) to send, as a probe or not. */
static struct job *q_pop(struct cons_ep *ce, bool probe)
{
    struct job *j = ce->q_head;
    ce->q_head = j->next;
    if (!ce->q_head)
        ce->q_tail = NULL;
    ce->qlen--;
    j->next = NULL;
    j->probe = probe;
    return j;
}

/* Claimed jobs at the head of ce's queue whose lease another claim took (or that we cannot
 * keep) are not ours to send: drop them (the lease's expiry or the new owner brings them
 * back). True when a job is left to send. */
static bool q_drop_unleased(cons_engine_t *e, struct cons_ep *ce)
{
    while (ce->q_head && !lease_allows_send(e, ce->q_head))
        job_free(e, q_pop(ce, false));
    return ce->q_head != NULL;
}

static void dispatch(cons_engine_t *e)
{
    /* Each popped endpoint either sends one job (and goes to the back of the list if it has
     * more) or leaves the list until an event brings it back (a request finishing frees a
     * slot or ends a probe; a breaker deferral empties its queue). Round-robin, so one busy
     * endpoint cannot hold back the others. */
    int64_t max_inflight = e->max_inflight;
    if (stall_hold(e))
        return;
    while (cons_http_running(e->http) < max_inflight) {
        struct cons_ep *ce = ready_pop(e);
        if (!ce)
            break;
        if (!ce->q_head)
            continue;
        if (ce->blocked_until_mono && sl_mono_ms() < ce->blocked_until_mono) {
            block_until(e, ce, ce->blocked_until_mono); /* back when the pause ends */
            continue;
        }
        if (ce->inflight >= inflight_cap(e, ce))
            continue;
        if (!q_drop_unleased(e, ce))
            continue;
        bool probe = false;
        if (!breaker_allows(e, ce, &probe)) {
            if (ce->probe_inflight)
                continue;
            int64_t now = sl_now_ms();
            int64_t until = ce->brk == CONS_BRK_OPEN && ce->brk_reopen_at > now ? ce->brk_reopen_at
                                                                                : now + 1000;
            sl_debug(SL_DBG_HTTP, "deliver", "breaker_defer",
                     "breaker %d for endpoint %s: deferring %zu queued until %lld", (int)ce->brk,
                     ce->id, ce->qlen, (long long)until);
            defer_queue(e, ce, until);
            continue;
        }
        if (!probe && !rate_allows(e, ce))
            continue; /* paused until the bucket refills */
        int rc = start_send(e, q_pop(ce, probe));
        /* A probe job that failed on its own before it was sent (its template, say): this pod
         * holds the shared probe lease, so the next job is the probe. */
        while (rc == 1 && probe && q_drop_unleased(e, ce))
            rc = start_send(e, q_pop(ce, true));
        /* after a sent probe the endpoint waits for its answer (on_http_done brings it
         * back); otherwise, or when no probe went out, the rest of its queue goes on */
        if (ce->q_head && (!probe || rc != 0))
            ready_push(e, ce);
    }
}

/* ==== Results ==== */

static void on_http_done(void *opaque, const struct cons_http_result *r)
{
    struct job *j = opaque;
    struct cons_ep *ce = j->ce;
    cons_engine_t *e = ce->eng;
    inflight_unlink(e, j);
    ce->inflight--;
    j->http = NULL;
    free(j->hdrs);
    j->hdrs = NULL;
    uint32_t attempt = j->d.attempt + 1;
    const char *cls = NULL;
    /* a 2xx whose body we cut off or that failed later is delivered: cons_classify.h */
    enum cons_verdict v = cons_classify(r->curl_code, r->status, r->refusal, &cls);
    bool was_probe = j->probe;
    if (was_probe)
        ce->probe_inflight = false;
    struct sl_log_ctx ctx;
    set_ctx(&ctx, j);
    sl_err_t err;
    int64_t now = sl_now_ms();

    /* Breaker bookkeeping. Only transient failures count against an endpoint; a probe that
     * got any answer other than a transient failure proves the endpoint is back. */
    if (r->status > 0 || r->curl_code == CURLE_OPERATION_TIMEDOUT) {
        lat_record(ce, r->total_us);
        if (ce->m)
            sl_histo_observe_us(&ce->m->duration, r->total_us);
    }
    if (r->status > 0) {
        if (r->connect_us > 0)
            sl_histo_observe_us(cons_m.phase_connect, r->connect_us);
        if (r->tls_us > 0)
            sl_histo_observe_us(cons_m.phase_tls, r->tls_us);
        sl_histo_observe_us(cons_m.phase_first_byte, r->ttfb_us);
        sl_histo_observe_us(cons_m.phase_total, r->total_us);
    }
    int64_t ra_ms = cons_retry_after_ms(r->status, r->retry_after_s, 0, e->cfg->retry_after_max_ms);
    if (r->status == 429 || (r->status == 503 && ra_ms > 0)) {
        /* The endpoint asks us to slow down: pause it (all its queued deliveries, not just
         * this one) for Retry-After or 1 s, and halve its concurrency window; successes grow
         * the window back by about one request per round trip. */
        sl_counter_inc(cons_m.throttled);
        block_until(e, ce, sl_mono_ms() + (ra_ms > 0 ? ra_ms : 1000));
        double cap = (double)ep_cap(e, ce);
        double w = ce->cwnd > 0 ? ce->cwnd : cap;
        ce->cwnd = w / 2 < 1 ? 1 : w / 2;
        SL_LOGKV(SL_LOG_INFO, "deliver", "endpoint_throttled",
                 ((struct sl_log_kv[]){SL_KV_I("status", r->status), SL_KV_I("pause_ms", ra_ms),
                                       SL_KV_I("window", (int64_t)ce->cwnd)}),
                 "endpoint %s asked to slow down", ce->id);
    } else if (v == CONS_DELIVERED && ce->cwnd > 0) {
        double cap = (double)ep_cap(e, ce);
        ce->cwnd += 1.0 / ce->cwnd;
        if (ce->cwnd >= cap)
            ce->cwnd = 0; /* fully recovered: no window */
    }
    /* 429 is a throttle signal, not ill health: it does not count against the breaker */
    bool failure = v == CONS_RETRY && r->status != 429;
    if (failure)
        ce->last_failure_mono = sl_mono_ms();
    if ((failure || ce->brk_failures > 0 || was_probe || ce->brk != CONS_BRK_CLOSED) &&
        !redis_given_up(e)) {
        struct cons_brk_view bv;
        const struct sl_endpoint *ep = ce->ep;
        int64_t threshold = brk_threshold(e, ce);
        int64_t cooldown = ep ? ep->brk_cooldown_ms : e->cfg->breaker_cooldown_ms;
        char owner[CONS_STORE_OWNER_MAX + 1];
        probe_owner(e, was_probe ? ce->probe_seq : 0, owner);
        if (cons_store_brk_record(e->redis, ce->id, failure ? 0 : 1, threshold, cooldown,
                                  e->cfg->breaker_cooldown_max_ms, owner, &bv, &err) == 0) {
            enum cons_brk_state before = ce->brk;
            brk_apply(ce, &bv);
            if (before != CONS_BRK_OPEN && bv.state == CONS_BRK_OPEN)
                SL_LOGKV(SL_LOG_WARN, "breaker", "breaker_opened",
                         ((struct sl_log_kv[]){SL_KV_I("cooldown_ms", bv.cooldown_ms),
                                               SL_KV_I("failures", bv.failures)}),
                         "breaker opened for endpoint %s", ce->id);
            else if (before != CONS_BRK_CLOSED && bv.state == CONS_BRK_CLOSED)
                sl_info("breaker", "breaker_closed", "breaker closed for endpoint %s", ce->id);
        } else {
            warn_redis(e, &err);
        }
    }

    if (v == CONS_DELIVERED) {
        ce->failing_since_ms = 0;
    } else if (r->status != 429) {
        if (ce->failing_since_ms == 0)
            ce->failing_since_ms = now;
        if (v == CONS_PERMANENT_DISABLE)
            request_disable(e, j, "endpoint_gone", "endpoint answered 410 Gone");
        else if (e->cfg->disable_after_ms > 0 &&
                 now - ce->failing_since_ms >= e->cfg->disable_after_ms)
            request_disable(e, j, "failing_too_long", "nothing but failures for too long");
    }
    struct sl_outcome o;
    switch (v) {
    case CONS_DELIVERED:
        fault_stall();
        e->st.delivered++;
        cons_metrics_outcome(ce->m, CONS_M_DELIVERED, r->status);
        if (j->d.ts_ms > 0 && (uint64_t)now >= j->d.ts_ms)
            sl_histo_observe_us(cons_m.publish_to_delivered, (now - (int64_t)j->d.ts_ms) * 1000);
        outcome_init(e, j, &o, SL_OUTCOME_DELIVERED, attempt);
        o.http = (uint32_t)r->status;
        o.lat_us = (uint64_t)r->total_us;
        o.dns_us = (uint64_t)r->dns_us;
        o.conn_us = (uint64_t)r->connect_us;
        o.tls_us = (uint64_t)r->tls_us;
        o.ttfb_us = (uint64_t)r->ttfb_us;
        j->pending_out = o;
        j->after = AFTER_COMPLETE;
        /* marker first (batched), outcome after it: see flush_marks */
        if (!e->marks)
            e->marks_since_mono = sl_mono_ms();
        j->next = e->marks;
        e->marks = j;
        e->nmarks++;
        break;
    case CONS_RETRY: {
        struct cons_retry_policy p = policy_of(e, ce->ep);
        char msg[SL_OUTCOME_MSG_MAX];
        if (r->refusal == CONS_REFUSAL_SSRF)
            snprintf(msg, sizeof(msg), "refused address (%s)", r->refusal_why);
        else
            snprintf(msg, sizeof(msg), "%s", r->errbuf && r->errbuf[0] ? r->errbuf : cls);
        if (cons_backoff_exhausted(&p, attempt)) {
            cons_metrics_outcome(ce->m, CONS_M_DEAD, r->status);
            dead_letter(e, j, attempt, (uint32_t)r->status, cls, msg, r);
            break;
        }
        int64_t ra = ra_ms;
        /* Retry-After is bounded by retry_after_max_ms, not by the backoff cap: an endpoint
         * that asks for 10 minutes gets 10 minutes even when the cap is shorter. */
        /* attempt - 1 retries so far: the first retry's ceiling is the base */
        int64_t due = cons_backoff_next(&p, attempt - 1, now, 0, NULL);
        if (ra > 0 && now + ra > due)
            due = now + ra;
        e->st.retried++;
        sl_counter_inc(cons_m.retries);
        cons_metrics_outcome(ce->m, CONS_M_RETRY, r->status);
        outcome_init(e, j, &o, SL_OUTCOME_RETRY_SCHEDULED, attempt);
        o.ts_ms = (uint64_t)now; /* the clock reading "next" was computed from */
        if (j->src == SRC_KAFKA) {
            o.env = job_env(e, j, &o.env_len); /* moving into Redis: see defer_job */
        }
        o.http = (uint32_t)r->status;
        o.err = cls;
        o.msg = msg;
        o.next_ms = (uint64_t)due;
        o.lat_us = (uint64_t)r->total_us;
        o.resp = r->resp_len ? r->resp : NULL;
        o.resp_len = r->resp_len;
        sl_debug(SL_DBG_HTTP, "deliver", "retry_scheduled", "retry in %lld ms (%s)",
                 (long long)(due - now), cls);
        schedule_job(e, j, due, attempt, &o);
        break;
    }
    case CONS_PERMANENT:
    case CONS_PERMANENT_DISABLE: {
        char msg[SL_OUTCOME_MSG_MAX];
        if (r->refusal == CONS_REFUSAL_SSRF)
            snprintf(msg, sizeof(msg), "refused to connect: %s address", r->refusal_why);
        else if (v == CONS_PERMANENT_DISABLE)
            snprintf(msg, sizeof(msg), "endpoint answered 410 gone");
        else
            snprintf(msg, sizeof(msg), "%s", r->errbuf && r->errbuf[0] ? r->errbuf : cls);
        cons_metrics_outcome(ce->m, CONS_M_DEAD, r->status);
        dead_letter(e, j, attempt, (uint32_t)r->status, cls, msg, r);
        break;
    }
    }
    sl_log_ctx_clear();
    if (ce->q_head)
        ready_push(e, ce);
}

/* Keep n markers whose write failed for retry_pmarks (strings are copied). info: n entries,
 * or NULL for dead-letter markers. */
static void pmarks_add(cons_engine_t *e,
                       size_t n,
                       const char **eps,
                       const char **ids,
                       const struct cons_done_info *info)
{
    size_t room = PMARKS_MAX - e->npmarks;
    if (n > room) {
        sl_warn("redis", "markers_dropped", "%zu markers dropped: %d are already waiting for redis",
                n - room, PMARKS_MAX);
        n = room;
    }
    if (e->npmarks + n > e->cap_pmarks) {
        e->cap_pmarks = (e->npmarks + n) * 2;
        e->pmarks = sl_xrealloc(e->pmarks, e->cap_pmarks * sizeof(*e->pmarks));
    }
    for (size_t i = 0; i < n; i++) {
        e->pmarks[e->npmarks].ep = sl_xstrdup(eps[i]);
        e->pmarks[e->npmarks].id = sl_xstrdup(ids[i]);
        e->pmarks[e->npmarks].info = info ? info[i] : (struct cons_done_info){0};
        e->pmarks[e->npmarks].dead = info == NULL;
        e->npmarks++;
    }
    e->next_pmark_mono = sl_mono_ms() + REDIS_HOLD_RETRY_MS;
}

/*
 * Write the delivered markers that failed while Redis was unavailable, about once a second
 * until it answers. Without them, a record read again after the outage (a rebalance), or a
 * claimed retry job that comes back when its lease runs out, would be sent again.
 */
static void retry_pmarks(cons_engine_t *e)
{
    if (!e->npmarks || sl_mono_ms() < e->next_pmark_mono || redis_given_up(e))
        return;
    size_t n = e->npmarks;
    const char **eps = sl_xcalloc(n, sizeof(*eps));
    const char **ids = sl_xcalloc(n, sizeof(*ids));
    struct cons_done_info *info = sl_xcalloc(n, sizeof(*info));
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        if (e->pmarks[i].dead)
            continue;
        eps[nd] = e->pmarks[i].ep;
        ids[nd] = e->pmarks[i].id;
        info[nd] = e->pmarks[i].info;
        nd++;
    }
    sl_err_t err;
    int rc =
        nd ? cons_store_done_mark(e->redis, nd, eps, ids, info, e->cfg->dedup_window_s, &err) : 0;
    free(eps);
    free(ids);
    free(info);
    if (rc != 0) {
        warn_redis(e, &err);
        e->next_pmark_mono = sl_mono_ms() + REDIS_HOLD_RETRY_MS;
        return;
    }
    /* delivered markers are written; dead-letter markers one by one (SET NX each) */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        struct pmark *m = &e->pmarks[i];
        if (m->dead && rc == 0)
            rc = cons_store_dead_mark(e->redis, m->ep, m->id, e->cfg->dedup_window_s, &err);
        if (m->dead && rc != 0) {
            e->pmarks[kept++] = *m;
            continue;
        }
        free(m->ep);
        free(m->id);
    }
    e->npmarks = kept;
    if (rc != 0) {
        warn_redis(e, &err);
        e->next_pmark_mono = sl_mono_ms() + REDIS_HOLD_RETRY_MS;
        return;
    }
    sl_info("redis", "markers_written", "%zu markers written after redis came back", n);
}

/* Write delivered markers for the batch, then produce their outcomes. */
static void flush_marks(cons_engine_t *e)
{
    if (!e->marks)
        return;
    size_t n = e->nmarks;
    const char **eps = sl_xcalloc(n, sizeof(*eps));
    const char **ids = sl_xcalloc(n, sizeof(*ids));
    struct cons_done_info *info = sl_xcalloc(n, sizeof(*info));
    size_t i = 0;
    for (struct job *j = e->marks; j; j = j->next) {
        eps[i] = j->d.ep;
        ids[i] = j->d.id;
        /* the marker remembers the delivery, so a copy read again can report it once more
         * if this outcome is lost (killed before its acknowledgement) */
        info[i].attempt = j->pending_out.attempt;
        info[i].ts_ms = (int64_t)j->pending_out.ts_ms;
        info[i].status = j->pending_out.http;
        info[i].lat_us = j->pending_out.lat_us;
        i++;
    }
    sl_err_t err;
    bool written = false;
    if (!redis_given_up(e)) {
        written =
            cons_store_done_mark(e->redis, n, eps, ids, info, e->cfg->dedup_window_s, &err) == 0;
        if (!written)
            warn_redis(e, &err); /* delivered all the same; the markers are written later */
    }
    if (!written)
        pmarks_add(e, n, eps, ids, info);
    free(eps);
    free(ids);
    free(info);
    struct job *list = e->marks;
    e->marks = NULL;
    e->nmarks = 0;
    while (list) {
        struct job *j = list;
        list = j->next;
        j->next = NULL;
        struct sl_outcome o = j->pending_out;
        if (produce_outcome(e, j, &o) != 0)
            job_free(e, j);
    }
}

/* Milliseconds until the delivered markers are due to be written (0: now; -1: none held). */
static int marks_due_in(const cons_engine_t *e)
{
    if (!e->marks)
        return -1;
    if (e->nmarks >= MARKS_BATCH || e->stop)
        return 0;
    int64_t left = e->marks_since_mono + MARKS_DELAY_MS - sl_mono_ms();
    return left > 0 ? (int)left : 0;
}

/* ==== Kafka callbacks ==== */

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    cons_engine_t *e = opaque;
    struct job *j = m->_private;
    if (!j)
        return;
    if (m->err || fault_active("records_unacked", 20)) {
        /* Not acknowledged: held, headers too (a quarantined record's reason and source
         * travel in them), and produced again by the loop (never from this callback); the
         * job (and its offset) waits, still counting this record in acks_pending. */
        rd_kafka_headers_t *hdrs = NULL;
        if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
            hdrs = NULL;
        hold_record(e, j, rd_kafka_topic_name(m->rkt), m->key, m->key_len, m->payload, m->len,
                    hdrs ? rd_kafka_headers_copy(hdrs) : NULL,
                    m->err ? rd_kafka_err2str(m->err) : "acknowledgement refused (test fault)");
        return;
    }
    if (--j->acks_pending == 0)
        job_settle(e, j);
}

static void drop_partition_jobs(cons_engine_t *e)
{
    /* Queued Kafka jobs of partitions we no longer own: drop (the new owner gets them; no
     * state was written for them). */
    size_t it = 0;
    const char *key;
    void *val;
    while (sl_map_next(e->eps, &it, &key, &val)) {
        struct cons_ep *ce = val;
        struct job *keep_h = NULL, *keep_t = NULL;
        size_t kept = 0;
        for (struct job *j = ce->q_head; j;) {
            struct job *n = j->next;
            j->next = NULL;
            if (j->src == SRC_KAFKA && !cons_offsets_current(e->offsets, &j->off)) {
                job_free(e, j);
            } else {
                if (keep_t)
                    keep_t->next = j;
                else
                    keep_h = j;
                keep_t = j;
                kept++;
            }
            j = n;
        }
        ce->q_head = keep_h;
        ce->q_tail = keep_t;
        ce->qlen = kept;
    }
    struct job **pp = &e->ihold;
    while (*pp) {
        struct job *j = *pp;
        if (j->src == SRC_KAFKA && !cons_offsets_current(e->offsets, &j->off)) {
            *pp = j->next;
            e->nihold--;
            job_free(e, j);
        } else {
            pp = &j->next;
        }
    }
}

static void store_offsets(cons_engine_t *e, bool force);

/*
 * Commit the stored offsets now and wait up to bound_ms for the answer. librdkafka commits
 * them by itself when partitions are unassigned, but that commit can lose a race with the
 * group leave or a rebalance in progress ("Unknown member") and is then dropped: the next
 * owner re-reads work whose fate is durable (dead letters sent again, retry chains doubled).
 * Without a group coordinator librdkafka defers a commit until one answers or
 * session.timeout.ms passes, so a plain synchronous commit could hold the loop that long: the
 * answer comes on commit_q instead, and one still unanswered at the bound is served later
 * (commit_serve); the auto-commit path stays as the fallback.
 */
static void commit_answer(rd_kafka_t *rk,
                          rd_kafka_resp_err_t ke,
                          rd_kafka_topic_partition_list_t *offsets,
                          void *opaque)
{
    (void)rk;
    (void)offsets;
    cons_engine_t *e = opaque;
    e->commits_pending--;
    const char *why = e->commit_why ? e->commit_why : "a rebalance";
    if (ke == RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_info("kafka", "offsets_committed", "offsets committed before %s", why);
    else if (ke != RD_KAFKA_RESP_ERR__NO_OFFSET)
        sl_warn("kafka", "commit_failed", "could not commit offsets before %s: %s", why,
                rd_kafka_err2str(ke));
}

static void commit_serve(cons_engine_t *e, int timeout_ms)
{
    if (e->commits_pending > 0)
        rd_kafka_queue_poll_callback(e->commit_q, timeout_ms);
}

static void commit_stored(cons_engine_t *e, const char *why, int64_t bound_ms)
{
    commit_serve(e, 0); /* an older answer first: its line names its own reason */
    e->commit_why = why;
    rd_kafka_resp_err_t ke =
        rd_kafka_commit_queue(e->consumer, NULL, e->commit_q, commit_answer, e);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (ke != RD_KAFKA_RESP_ERR__NO_OFFSET)
            sl_warn("kafka", "commit_failed", "could not commit offsets before %s: %s", why,
                    rd_kafka_err2str(ke));
        return;
    }
    e->commits_pending++;
    if (bound_ms < 0)
        bound_ms = 0;
    int64_t deadline = sl_mono_ms() + bound_ms;
    for (int64_t left = bound_ms; e->commits_pending > 0 && left > 0;
         left = deadline - sl_mono_ms())
        commit_serve(e, left < 100 ? (int)left : 100);
    if (e->commits_pending > 0)
        sl_warn("kafka", "commit_unanswered",
                "the offset commit before %s had no answer within %lld ms (no group "
                "coordinator?): going on without it",
                why, (long long)bound_ms);
}

/* Run the loop without intake until nothing of the given partitions is in flight. */
static void drain_for(cons_engine_t *e, int64_t bound_ms)
{
    int64_t deadline = sl_mono_ms() + bound_ms;
    while (sl_mono_ms() < deadline && (cons_http_running(e->http) > 0 || e->marks ||
                                       rd_kafka_outq_len(e->producer) > 0 || e->hrec_head)) {
        cons_http_run(e->http, 10, NULL);
        flush_marks(e);
        rd_kafka_poll(e->producer, 0);
        if (e->hrec_head)
            retry_records(e);
    }
}

static void rebalance_cb(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
    cons_engine_t *e = opaque;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        for (int i = 0; i < parts->cnt; i++) {
            if (!cons_offsets_assign(e->offsets, parts->elems[i].partition))
                sl_error("kafka", "partition_not_tracked",
                         "partition %d is beyond the %d partitions a consumer tracks: its "
                         "records are not consumed by this pod",
                         (int)parts->elems[i].partition, CONS_OFFSETS_MAX_PARTITIONS);
        }
        rd_kafka_assign(rk, parts);
        /* An application pause belongs to the partition object: re-apply ours, and only ever
         * resume partitions we paused (resuming a non-paused one is buggy before 2.4). */
        if (e->paused)
            rd_kafka_pause_partitions(rk, parts);
        sl_info("kafka", "partitions_assigned", "assigned %d partition%s", parts->cnt,
                parts->cnt == 1 ? "" : "s");
        atomic_store(&e->joined, true); /* ready: a member of the group, even with none */
        return;
    }
    /* Revoke: let in-flight work finish (bounded) so its offsets can still be stored. */
    if (!rd_kafka_assignment_lost(rk)) {
        int64_t bound = e->cfg->shutdown_drain_ms < 5000 ? e->cfg->shutdown_drain_ms : 5000;
        int64_t wait = COMMIT_WAIT_MS;
        if (e->shutdown_deadline) {
            /* leaving the group at SIGTERM: what is left of the exit bound */
            int64_t left = e->shutdown_deadline - SHUTDOWN_DESTROY_MS - sl_mono_ms();
            if (bound > left / 2)
                bound = left / 2;
            if (wait > left - bound)
                wait = left - bound;
        }
        drain_for(e, bound);
        store_offsets(e, true);
        commit_stored(e, "giving up partitions", wait);
    }
    for (int i = 0; i < parts->cnt; i++)
        cons_offsets_revoke(e->offsets, parts->elems[i].partition);
    drop_partition_jobs(e);
    e->last_revoke_mono = sl_mono_ms();
    if (e->await_revoke) {
        /* the stale Kafka work is gone: after the usual short hold, claimed jobs (their
         * leases re-validated first) may go */
        e->await_revoke = false;
        int64_t until = sl_mono_ms() + STALL_HOLD_MS;
        if (until < e->hold_until_mono)
            e->hold_until_mono = until;
    }
    /* A pause survives unassign/assign in 2.0.2: resume what we paused before giving the
     * partitions up, or a later assignment of them would stay paused forever. */
    if (e->paused) {
        rd_kafka_resume_partitions(rk, parts);
        SL_LOGKV(SL_LOG_INFO, "kafka", "intake_resumed",
                 ((struct sl_log_kv[]){SL_KV_S("reason", "revoked")}),
                 "intake pause ended: its partitions were revoked");
    }
    rd_kafka_assign(rk, NULL);
    e->paused = false;
    sl_info("kafka", "partitions_revoked", "revoked %d partition%s", parts->cnt,
            parts->cnt == 1 ? "" : "s");
}

static void store_offsets(cons_engine_t *e, bool force)
{
    int64_t now = sl_mono_ms();
    if (!force && now < e->next_store_mono)
        return;
    e->next_store_mono = now + STORE_INTERVAL_MS;
    int span = cons_offsets_span(e->offsets);
    int32_t *parts = sl_xmalloc((size_t)(span > 0 ? span : 1) * sizeof(*parts));
    int n = cons_offsets_partitions(e->offsets, parts, span);
    rd_kafka_topic_partition_list_t *l = NULL;
    for (int i = 0; i < n; i++) {
        int64_t off = cons_offsets_committable(e->offsets, parts[i], NULL);
        if (off < 0)
            continue;
        if (!l)
            l = rd_kafka_topic_partition_list_new(n);
        rd_kafka_topic_partition_list_add(l, e->cfg->topic_deliveries, parts[i])->offset = off;
    }
    free(parts);
    if (!l)
        return;
    rd_kafka_resp_err_t ke = rd_kafka_offsets_store(e->consumer, l);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_debug(SL_DBG_KAFKA, "kafka", "offsets_store_failed", "%s", rd_kafka_err2str(ke));
    rd_kafka_topic_partition_list_destroy(l);
}

static void stats_line(cons_engine_t *e, bool force)
{
    int64_t now = sl_mono_ms();
    if (!force && now < e->next_stats_mono)
        return;
    double secs = (double)(STATS_INTERVAL_MS) / 1000.0;
    e->next_stats_mono = now + STATS_INTERVAL_MS;
    struct cons_stats *s = &e->st, *l = &e->st_last;
    SL_LOGKV(
        SL_LOG_INFO, "stats", "stats",
        ((struct sl_log_kv[]){
            SL_KV_I("received", s->received), SL_KV_I("claimed", s->claimed),
            SL_KV_I("sent", s->sent), SL_KV_I("delivered", s->delivered),
            SL_KV_I("retried", s->retried), SL_KV_I("dead", s->dead),
            SL_KV_I("duplicates", s->duplicates), SL_KV_I("deferred", s->deferred),
            SL_KV_I("spilled", s->spilled), SL_KV_I("quarantined", s->quarantined),
            SL_KV_I("probes", s->probes), SL_KV_I("raw_kept", s->raw_kept),
            SL_KV_I("inflight", cons_http_running(e->http)),
            SL_KV_I("inflight_max", e->inflight_max), SL_KV_I("in_memory", e->live),
            SL_KV_I("in_memory_max", e->live_max),
            SL_KV_I("endpoint_states", (int64_t)sl_map_count(e->eps)),
            SL_KV_I("delivered_per_s", (int64_t)((double)(s->delivered - l->delivered) / secs))}),
        "consumer stats");
    *l = *s;
    e->inflight_max = cons_http_running(e->http);
    e->live_max = e->live;
}

/* ==== Life cycle ==== */

cons_engine_t *cons_engine_new(
    const struct sl_config *cfg, sl_endpoints_t *endpoints, int thread, int threads, sl_err_t *err)
{
    if (threads < 1 || thread < 0 || thread >= threads) {
        sl_err_set(err, SL_EINVAL, "loop %d of %d: no such loop", thread, threads);
        return NULL;
    }
    cons_engine_t *e = sl_xcalloc(1, sizeof(*e));
    e->cfg = cfg;
    e->endpoints = endpoints;
    e->thread = thread;
    e->threads = threads;
    e->max_inflight = share(e, cfg->max_inflight);
    e->wake[0] = e->wake[1] = -1;
    e->beat = -1;
    e->eps = sl_map_new(64);
    e->offsets = cons_offsets_new();
    int64_t queued = share(e, cfg->max_queued);
    e->live_cap = (uint64_t)e->max_inflight + (uint64_t)queued;
    /* resume above max_inflight, so the requests in flight never run dry meanwhile */
    e->live_resume = (uint64_t)e->max_inflight + (uint64_t)queued / 2;
    sl_buf_init(&e->enc, (size_t)cfg->max_body_bytes * 2 + SL_RECORD_OVERHEAD * 2);
    sl_buf_init(&e->canon, (size_t)cfg->max_body_bytes + SL_RECORD_OVERHEAD);
    e->lim = (struct sl_decode_limits){.max_body = (size_t)cfg->max_body_bytes, .max_record = 0};
    if (cfg->instance_id[0]) {
        snprintf(e->pod, sizeof(e->pod), "%s", cfg->instance_id);
    } else {
        char host[40] = "host";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        for (char *p = host; *p; p++) {
            if (*p < 0x21 || *p > 0x7e)
                *p = '_';
        }
        snprintf(e->pod, sizeof(e->pod), "%s-%d", host, (int)getpid());
    }
    /* Each loop of a process is its own breaker owner: one loop's late failure must not
     * count as another loop's probe. */
    if (threads > 1)
        snprintf(e->owner, sizeof(e->owner), "%s#%d", e->pod, thread);
    else
        snprintf(e->owner, sizeof(e->owner), "%s", e->pod);
    if (cons_ssrf_parse(&e->ssrf, cfg->ssrf_protection, cfg->ssrf_allow_cidrs, err) != 0)
        goto fail;
    struct cons_http_opts ho = {.ssrf = &e->ssrf,
                                .keep_bytes = (size_t)cfg->response_keep_bytes,
                                .max_bytes = (uint64_t)cfg->response_max_bytes,
                                .user_agent = "Sluice/" SL_VERSION};
    e->http = cons_http_new(&ho, err);
    if (!e->http)
        goto fail;
    e->redis = sl_redis_connect(cfg->redis_url, (int)cfg->redis_timeout_ms, err);
    if (!e->redis)
        goto fail;
    if (pipe2(e->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        sl_err_set(err, -errno, "could not create wake-up pipe: %s", strerror(errno));
        goto fail;
    }
    rd_kafka_conf_t *pconf = sl_kafka_conf_new(cfg, "sluice-consumer-out", err);
    if (!pconf)
        goto fail;
    rd_kafka_conf_set_opaque(pconf, e);
    /* Outcomes are batched for throughput (linger.ms=50): the delivery has happened already
     * (its outcome carries ts_ms from the HTTP answer), only the offset commit waits. With
     * the latency profile's 2 ms linger, batches of a few records each cost the broker half
     * as much CPU again per delivery (24 against 16 us), and librdkafka builds an lz4 context
     * per batch (bench/README.md, "Consumer CPU"). */
    e->producer =
        sl_kafka_producer_new(cfg, "sluice-consumer-out", SL_KAFKA_THROUGHPUT, pconf, dr_cb, err);
    if (!e->producer)
        goto fail;
    cons_metrics_producer_add(e->producer);
    rd_kafka_conf_t *cconf = sl_kafka_conf_new(cfg, "sluice-consumer", err);
    if (!cconf)
        goto fail;
    /* librdkafka pre-fetches up to 64 MB by default, on top of the live_cap jobs held here
     * (bench/README.md, "Consumer memory"). Once the queue is full, librdkafka 2.0.2 backs
     * the partition's fetching off (fetch.queue.backoff.ms only came in 2.2.0;
     * fetch.error.backoff.ms does not change it), so the queue size also bounds the loop's
     * intake: 2048 KiB halved a loop's rate, 4096 did not (bench/README.md, "Kafka
     * settings"). consumer_prefetch_kb, per loop. */
    char qkb[24];
    snprintf(qkb, sizeof(qkb), "%lld", (long long)cfg->consumer_prefetch_kb);
    if (sl_kafka_conf_set(cconf, "queued.max.messages.kbytes", qkb, err) != 0) {
        rd_kafka_conf_destroy(cconf);
        goto fail;
    }
    rd_kafka_conf_set_opaque(cconf, e);
    rd_kafka_conf_set_rebalance_cb(cconf, rebalance_cb);
    if (cfg->metrics_listen[0] && sl_kstats_enable(cconf, KSTATS_INTERVAL_MS, err) != 0) {
        rd_kafka_conf_destroy(cconf);
        goto fail;
    }
    e->consumer = sl_kafka_consumer_new(cfg, "sluice-consumer", cfg->consumer_group, cconf, err);
    if (!e->consumer)
        goto fail;
    e->cq = rd_kafka_queue_get_consumer(e->consumer);
    e->pq = rd_kafka_queue_get_main(e->producer);
    e->commit_q = rd_kafka_queue_new(e->consumer);
    rd_kafka_queue_io_event_enable(e->cq, e->wake[1], "c", 1);
    rd_kafka_queue_io_event_enable(e->pq, e->wake[1], "p", 1);
    cons_http_watch_fd(e->http, e->wake[0]);
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, cfg->topic_deliveries, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t ke = rd_kafka_subscribe(e->consumer, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR) {
        sl_err_set(err, SL_EKAFKA, "could not subscribe to %s: %s", cfg->topic_deliveries,
                   rd_kafka_err2str(ke));
        goto fail;
    }
    return e;
fail:
    cons_engine_destroy(e);
    return NULL;
}

void cons_engine_stop(cons_engine_t *e)
{
    int64_t none = 0; /* the first request starts the exit bound (async-signal-safe) */
    atomic_compare_exchange_strong(&e->stop_mono, &none, sl_mono_ms());
    atomic_store(&e->stop, 1);
    if (e->wake[1] >= 0) {
        ssize_t w = write(e->wake[1], "s", 1); /* wake the loop now; a full pipe wakes it too */
        (void)w;
    }
}

bool cons_engine_abandoned(const cons_engine_t *e)
{
    return e->abandoned;
}

bool cons_engine_joined(const cons_engine_t *e)
{
    return atomic_load(&e->joined);
}

void cons_engine_stats(const cons_engine_t *e, struct cons_stats *out)
{
    *out = e->st;
}

static void drain_wake(cons_engine_t *e)
{
    char buf[256];
    while (read(e->wake[0], buf, sizeof(buf)) > 0) {
    }
}

/* Shutdown (invariant 10): stop intake, let in-flight requests finish within the bound,
 * reschedule what is left without spending attempts, flush outcomes, store offsets. */
static void shutdown_drain(cons_engine_t *e)
{
    e->stopping = true;
    sl_info("consumer", "shutdown_started", "draining %d in-flight requests (up to %lld ms)",
            cons_http_running(e->http), (long long)e->cfg->shutdown_drain_ms);
    /* the drain's share of shutdown_timeout_ms leaves SHUTDOWN_RESERVE_MS for the rest */
    int64_t deadline = sl_mono_ms() + e->cfg->shutdown_drain_ms;
    if (deadline > e->shutdown_deadline - SHUTDOWN_RESERVE_MS)
        deadline = e->shutdown_deadline - SHUTDOWN_RESERVE_MS;
    while (cons_http_running(e->http) > 0 && sl_mono_ms() < deadline) {
        cons_http_run(e->http, 20, NULL);
        flush_marks(e);
        rd_kafka_poll(e->producer, 0);
    }
    /* Queued jobs: to the schedule, due now, no attempt spent. In-flight ones that did not
     * finish are cancelled and rescheduled the same way. */
    size_t it = 0;
    const char *key;
    void *val;
    while (sl_map_next(e->eps, &it, &key, &val)) {
        struct cons_ep *ce = val;
        struct job *j = ce->q_head;
        ce->q_head = ce->q_tail = NULL;
        ce->qlen = 0;
        while (j) {
            struct job *n = j->next;
            j->next = NULL;
            defer_job(e, j, sl_now_ms(), "shutdown");
            j = n;
        }
    }
    /* Requests still running after the bound are cancelled and rescheduled, due now,
     * without spending an attempt (they may have reached the endpoint: at-least-once). */
    while (e->inflight) {
        struct job *j = e->inflight;
        inflight_unlink(e, j);
        cons_http_cancel(e->http, j->http);
        j->http = NULL;
        j->ce->inflight--;
        if (j->probe)
            j->ce->probe_inflight = false;
        free(j->hdrs);
        j->hdrs = NULL;
        defer_job(e, j, sl_now_ms(), "shutdown");
    }
    flush_marks(e);
    /* Flush what is owed to Kafka and Redis, leaving SHUTDOWN_CLOSE_MS for the commit and
     * leaving the group. Once Redis failed during the shutdown its writes are not retried
     * (held jobs are then freed: a Kafka record's offset is not stored, a claimed job's
     * lease runs out; both come back to the next owner). */
    int64_t flush_deadline = sl_mono_ms() + 10000;
    if (flush_deadline > e->shutdown_deadline - SHUTDOWN_CLOSE_MS)
        flush_deadline = e->shutdown_deadline - SHUTDOWN_CLOSE_MS;
    while ((rd_kafka_outq_len(e->producer) > 0 || e->hrec_head ||
            ((e->held || e->npmarks) && !e->redis_failed_stopping)) &&
           sl_mono_ms() < flush_deadline) {
        rd_kafka_poll(e->producer, 50);
        retry_records(e);
        retry_held(e);
        retry_pmarks(e);
    }
    if (e->hrec_head)
        sl_error("kafka", "records_not_produced",
                 "%zu records still not taken by Kafka at shutdown: their deliveries' offsets "
                 "are not committed, the next owner reads them again",
                 e->nhrec);
    store_offsets(e, true);
}

/* Commit and leave the group: may block (an unreachable coordinator), so it runs under
 * sl_run_bounded; the rebalance callback's revocation runs in it too. */
static void close_consumer(void *arg)
{
    cons_engine_t *e = arg;
    int64_t wait = (e->shutdown_deadline - SHUTDOWN_DESTROY_MS - sl_mono_ms()) / 2;
    commit_stored(e, "shutdown", wait < COMMIT_WAIT_MS ? wait : COMMIT_WAIT_MS);
    rd_kafka_resp_err_t ke = rd_kafka_consumer_close(e->consumer);
    if (ke != RD_KAFKA_RESP_ERR_NO_ERROR)
        sl_warn("kafka", "close_failed", "consumer close: %s", rd_kafka_err2str(ke));
}

int cons_engine_run(cons_engine_t *e)
{
    sl_log_thread_tag("loop", e->thread); /* this thread's lines name their loop */
    sl_info("consumer", "started", "consuming %s as %s (group %s)", e->cfg->topic_deliveries,
            e->owner, e->cfg->consumer_group);
    e->next_stats_mono = sl_mono_ms() + STATS_INTERVAL_MS;
    char beat_name[32];
    snprintf(beat_name, sizeof(beat_name), "delivery loop %d", e->thread);
    e->beat = sl_probe_beat_register(beat_name);
    while (!e->stop) {
        sl_probe_beat(e->beat, sl_mono_ms());
        if (e->blocked)
            unblock(e);
        intake_kafka(e);
        retry_pmarks(e); /* markers owed first: a job claimed back below is checked by them */
        intake_redis(e);
        renew_leases(e);
        dispatch(e);
        int due = marks_due_in(e);
        int wait = e->kafka_more ? 0 : due >= 0 ? due : 50;
        int extra = 0;
        cons_http_run(e->http, wait, &extra);
        if (extra)
            drain_wake(e);
        if (marks_due_in(e) == 0)
            flush_marks(e);
        rd_kafka_poll(e->producer, 0);
        commit_serve(e, 0);
        if (e->hrec_head)
            retry_records(e);
        if (e->held)
            retry_held(e);
        retry_pmarks(e);
        retry_ihold(e);
        dispatch(e);
        store_offsets(e, false);
        stats_line(e, false);
        if (rd_kafka_fatal_error(e->producer, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            sl_error("kafka", "producer_fatal", "outcome producer hit a fatal error; exiting");
            e->fatal = SL_EKAFKA;
            break;
        }
    }
    sl_probe_beat_release(e->beat); /* shutting down: the drain is bounded on its own */
    e->beat = -1;
    /* the bound counts from the request, not from the moment this loop saw it */
    int64_t asked = atomic_load(&e->stop_mono), now = sl_mono_ms();
    /* a time read in a signal handler can come from another clock than the loop's (an
     * LD_PRELOAD clock shim, libfaketime in the tests, serves a handler that interrupted it
     * unfaked): one that does not fit is replaced by now */
    if (asked <= 0 || asked > now || now - asked > e->cfg->shutdown_timeout_ms)
        asked = now;
    e->shutdown_deadline = asked + e->cfg->shutdown_timeout_ms;
    shutdown_drain(e);
    stats_line(e, true);
    /* what is left of the bound, less a moment for destroying the producer */
    int64_t left = e->shutdown_deadline - sl_mono_ms() - SHUTDOWN_DESTROY_MS;
    if (sl_run_bounded(close_consumer, e, left) == SL_ETIMEDOUT) {
        e->abandoned = true;
        sl_error("consumer", "shutdown_timeout",
                 "leaving the group did not finish within shutdown_timeout_ms (%lld ms): exiting "
                 "without it (offsets not committed are read again by the next owner)",
                 (long long)e->cfg->shutdown_timeout_ms);
        return e->fatal ? e->fatal : SL_ETIMEDOUT;
    }
    sl_info("consumer", "stopped", "consumer stopped cleanly");
    return e->fatal;
}

void cons_engine_destroy(cons_engine_t *e)
{
    if (!e)
        return;
    if (e->cq)
        rd_kafka_queue_destroy(e->cq);
    if (e->pq)
        rd_kafka_queue_destroy(e->pq);
    if (e->commit_q)
        rd_kafka_queue_destroy(e->commit_q);
    if (e->consumer) {
        sl_kstats_forget(rd_kafka_name(e->consumer));
        rd_kafka_destroy(e->consumer);
    }
    if (e->producer) {
        cons_metrics_producer_remove(e->producer);
        int64_t left = e->shutdown_deadline ? e->shutdown_deadline - sl_mono_ms() : 5000;
        rd_kafka_flush(e->producer, (int)(left < 0 ? 0 : left > 5000 ? 5000 : left));
        rd_kafka_destroy(e->producer);
    }
    cons_http_destroy(e->http);
    sl_redis_close(e->redis);
    if (e->eps) {
        size_t it = 0;
        const char *key;
        void *val;
        while (sl_map_next(e->eps, &it, &key, &val)) {
            struct cons_ep *ce = val;
            for (struct job *j = ce->q_head; j;) {
                struct job *n = j->next;
                job_free(e, j);
                j = n;
            }
            sl_signer_destroy(ce->signer);
            sl_endpoint_release(ce->ep);
            free(ce);
        }
        sl_map_destroy(e->eps, NULL);
    }
    for (struct job *j = e->held; j;) {
        /* Redis never answered within the shutdown flush: a Kafka record's offset was not
         * stored (read again), a claimed job's lease runs out (claimed again) */
        struct job *n = j->next;
        job_free(e, j);
        j = n;
    }
    for (struct job *j = e->ihold; j;) {
        /* never checked, never sent: a Kafka record's offset was not stored (read again) */
        struct job *n = j->next;
        job_free(e, j);
        j = n;
    }
    for (size_t i = 0; i < e->npmarks; i++) {
        free(e->pmarks[i].ep);
        free(e->pmarks[i].id);
    }
    free(e->pmarks);
    while (e->hrec_head) { /* their jobs are freed above or below: nothing to settle */
        struct held_rec *h = e->hrec_head;
        e->hrec_head = h->next;
        held_free(e, h);
    }
    cons_offsets_destroy(e->offsets);
    sl_buf_fini(&e->enc);
    sl_buf_fini(&e->canon);
    if (e->wake[0] >= 0)
        close(e->wake[0]);
    if (e->wake[1] >= 0)
        close(e->wake[1]);
    free(e);
}
