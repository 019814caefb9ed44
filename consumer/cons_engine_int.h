/*
 * cons_engine_int: the structures the delivery engine's files share (private to consumer/ and
 * to the unit test of the job state table), and the functions one file of the engine calls
 * in another (documented where they are defined).
 *
 *   struct job      one delivery attempt in memory; owns the record bytes and the decoded
 *                   record; lives from intake until its fate is durable; its state (enum
 *                   job_state) names the one list it is on.
 *   struct cons_ep  this loop's runtime view of one endpoint: snapshot, signer, queue of jobs
 *                   waiting for a slot, in-flight count, and a local copy of the shared
 *                   breaker state so a healthy endpoint costs no Redis round trip per delivery.
 *   ready list      endpoints with queued jobs and a free slot, served round-robin so one
 *                   busy endpoint cannot starve the others (no head-of-line blocking).
 *   e->timers       the loop's deadlines (enum loop_timer), so it sleeps until the nearest.
 *
 * thread: everything here belongs to one engine's loop thread.
 */
#ifndef CONS_ENGINE_INT_H
#define CONS_ENGINE_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"
#include "common/sl_redis.h"
#include "common/sl_rstate.h"
#include "common/sl_sign.h"
#include "common/sl_ssrf.h"
#include "consumer/cons_adapt.h"
#include "consumer/cons_classify.h"
#include "consumer/cons_engine.h"
#include "consumer/cons_http.h"
#include "consumer/cons_list.h"
#include "consumer/cons_metrics.h"
#include "consumer/cons_offsets.h"
#include "consumer/cons_store.h"
#include "consumer/cons_timer.h"

#define INTAKE_BATCH       500   /* Kafka records taken per loop turn */
#define INTAKE_STUCK_MS    1000  /* intake full this long without taking a record: pause */
#define CLAIM_BATCH        200   /* retry jobs claimed per shard per turn */
#define CLAIM_INTERVAL_MS  100   /* how often due retries are claimed */
#define STORE_INTERVAL_MS  100   /* how often finished offsets are stored */
#define MARKS_BATCH        256   /* delivered markers written in one Redis round trip... */
#define MARKS_DELAY_MS     5     /* ...or once the oldest has waited this long */
#define STATS_INTERVAL_MS  10000 /* stats log line */
#define OWNER_CHECK_MS     5000  /* sluice:owner looked at again (cons_engine_watch_owner) */
#define KSTATS_INTERVAL_MS 5000  /* librdkafka statistics (lag metrics), when metrics are on */
/* SIGTERM (shutdown_timeout_ms): the drain of requests in flight ends at least
 * SHUTDOWN_RESERVE_MS before the bound, the flush of outcomes and Redis writes at least
 * SHUTDOWN_CLOSE_MS before it (commit and leaving the group), which end SHUTDOWN_DESTROY_MS
 * before it (destroying the clients) */
#define SHUTDOWN_RESERVE_MS  4000
#define SHUTDOWN_CLOSE_MS    3000
#define SHUTDOWN_DESTROY_MS  500
#define COMMIT_WAIT_MS       2000  /* a synchronous commit waits this long for its answer */
#define BRK_REFRESH_MS       1000  /* refresh of a local breaker view with recent failures */
#define BRK_STALE_MS         30000 /* refresh of any closed local breaker view this old, ms */
#define REDIS_HOLD_RETRY_MS  1000  /* retry of Redis writes that failed */
#define EPWAIT_CHECK_MS      10    /* records naming an unknown endpoint: table caught up yet? */
#define EPWAIT_MAX_MS        5000  /* ...and how long they may wait for it (then: quarantine) */
#define EPWAIT_RESCHEDULE_MS 30000 /* a claimed retry whose wait ran out: back in the schedule */
#define HOL_AGE_MS                                                                                 \
    2000                       /* a queue head waiting this long while its endpoint is             \
                                * held back or silent: not keeping up (cons_intake.c) */
#define EVICT_EVERY_MS    250  /* intake full: how often such queues are moved out */
#define RESPILL_MIN_MS    500  /* a claimed job whose endpoint queue is still full waits */
#define RESPILL_SPREAD_MS 1000 /* this long plus up to this much more in the schedule */
#define URL_MAX           8192 /* expanded postback URL cap, bytes */
#define LAT_RING          128  /* latency samples per endpoint for the slow check */
#define LAT_WINDOW_S      900  /* samples older than this are ignored, s */
#define LAT_MIN_SAMPLES   20   /* fewer samples never count an endpoint as slow */
#define LEASE_MARGIN_MS                                                                            \
    1000                    /* a claimed job is sent only with this much lease to spare            \
                               beyond its request timeout, ms */
#define STALL_MIN_MS 1000   /* shortest loop stall that is treated as a freeze, ms */
#define PMARKS_MAX   200000 /* delivered markers held for a retry while Redis is down */
#define STALL_HOLD_MS                                                                              \
    1500                     /* after a freeze, no new send for this long: librdkafka              \
                                reports a lost assignment meanwhile, ms */
#define RATE_LEASE_MS    200 /* leased rate tokens are used within this, ms */
#define RECORDS_RETRY_MS 50  /* records Kafka refused are handed to it again after this, ms */
#define LOOP_WAIT_MAX_MS                                                                           \
    250 /* the loop's longest sleep, ms: a safety bound on the timer set, far below                \
           STALL_MIN_MS so an idle loop never looks frozen to cons_stall_hold */

/* The loop's deadlines (slots of e->timers): who arms each, and who re-arms or disarms it
 * when it runs (a slot left expired would keep the loop awake). */
enum loop_timer {
    T_CLAIM,        /* cons_intake_redis: next claim of due retries (every CLAIM_INTERVAL_MS) */
    T_STORE,        /* store_offsets: next store of finished offsets */
    T_STATS,        /* stats_line: next stats line */
    T_RENEW,        /* cons_renew_leases: next lease renewal pass (armed while jobs are leased) */
    T_PMARKS,       /* cons_retry_pmarks: next write of markers that failed (while any wait) */
    T_IHOLD,        /* cons_retry_ihold: next duplicate check of held records (while any wait) */
    T_EPWAIT,       /* cons_retry_epwait: has the endpoint table caught up (while any wait) */
    T_MARKS,        /* cons_flush_marks: the delivered-marker batch is due */
    T_HELD,         /* cons_retry_held: the earliest held Redis write is due again */
    T_UNBLOCK,      /* unblock: the earliest endpoint pause ends */
    T_STALL_HOLD,   /* cons_stall_hold: the hold on new sends after a freeze ends */
    T_INTAKE_STUCK, /* cons_intake_kafka: intake full this long without room: pause */
    T_RECORDS,      /* cons_retry_records: records Kafka has not taken are offered again */
    T_OWNER,        /* owner_check: next look at sluice:owner (armed on the watching loop) */
    T_COUNT
};

enum job_src { SRC_KAFKA, SRC_REDIS };

/* What to do once every outcome of a job is acknowledged. */
enum job_after {
    AFTER_FINISH,   /* Kafka: finish the offset; Redis: nothing more */
    AFTER_COMPLETE, /* Redis: remove the job (delivered / dead letter / duplicate) */
};

/*
 * A job's state. Exactly one function moves a job out of each state; cons_job_set_state
 * (cons_job.c) is the only writer of j->state: it checks the change against the table
 * job_next_ok and keeps the job on the list its state names.
 *
 *   state           where the job is                            leaves by
 *   JOB_LOOSE       held by the function running (just taken,   the holder hands it on:
 *                   between lists); never outlives the call     enqueue, ihold_push,
 *                                                               epwait_push, start_send,
 *                                                               cons_mark_push, hold,
 *                                                               send_record, cons_job_free
 *   JOB_EP_WAIT     e->epwait: a record naming an endpoint      cons_epwait_take
 *                   the table does not have, until the table
 *                   has caught up with the endpoints topic
 *   JOB_DEDUP_WAIT  e->ihold: its duplicate check failed        cons_ihold_take
 *   JOB_QUEUED      its endpoint's queue, waiting for a slot    cons_q_take
 *   JOB_SENDING     e->inflight: its request runs               cons_send_end
 *   JOB_MARKING     e->marks: delivered, marker write batched   cons_flush_marks
 *   JOB_REDIS_HELD  e->held: its schedule write failed          cons_held_take
 *   JOB_ACKING      its outcome records wait for Kafka's        job_settle (cons_dr_cb, at the
 *                   acknowledgement (acks_pending > 0)          last acknowledgement)
 *   JOB_FREED       gone (cons_job_free); no way out
 *
 * The lease of a claimed retry job is not a state: the job keeps it (lease_link) from its
 * claim until it is rescheduled or freed, whatever state it is in.
 */
enum job_state {
    JOB_LOOSE,
    JOB_EP_WAIT,
    JOB_DEDUP_WAIT,
    JOB_QUEUED,
    JOB_SENDING,
    JOB_MARKING,
    JOB_REDIS_HELD,
    JOB_ACKING,
    JOB_FREED,
    JOB_STATE_COUNT
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
                                         as canonical (see cons_drop_canonical_raw, cons_job_env) */
    size_t raw_len;                   /* bytes */
    struct sl_delivery d;             /* decoded record (owned) */
    struct cons_ep *ce;               /* endpoint runtime (NULL until resolved) */
    int acks_pending;                 /* outcome records not yet acknowledged */
    enum job_after after;             /* action once acknowledged */
    bool probe;                       /* this send is the breaker's half-open probe */
    bool live_id;                     /* SRC_KAFKA: registered in e->live_ids until freed */
    bool is_spill;                    /* spilled: scheduled without spending an attempt
                                         (counted in spills_live until freed) */
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
    uint64_t ep_ticket;               /* JOB_EP_WAIT: the endpoint table's catch-up ticket */
    int64_t ep_wait_until;            /* JOB_EP_WAIT: quarantined unknown after this (mono ms) */
    int64_t queued_mono;              /* JOB_QUEUED: when it joined its endpoint's queue */
    int64_t taken_us;                 /* SRC_KAFKA, not a replay: when intake took its record
                                         (mono µs); 0 once its first request started */
    bool ep_waited;                   /* its endpoint was looked up again after JOB_EP_WAIT */
    bool ep_synced;                   /* ...once the table had caught up (else: timed out) */
    enum job_state state;             /* see the state table; changed by cons_job_set_state only */
    struct cons_link link;            /* on the list of its state (job_state_list), if any */
    int64_t lease_until_mono;         /* SRC_REDIS claimed: our lease ends then (this pod's
                                         monotonic ms: a wall-clock step moves no deadline) */
    bool lease_lost;                  /* SRC_REDIS claimed: another claim owns the job now */
    bool dead;                        /* dead-lettered: mark it once the outcome is acked */
    struct cons_link lease_link;      /* on the engine's leased list while we keep its lease */
};

struct cons_ep {
    struct cons_engine *eng;         /* owner */
    char id[SL_ENDPOINT_ID_MAX + 1]; /* endpoint id */
    const struct sl_endpoint *ep;    /* current snapshot (reference) or NULL */
    uint64_t ep_version;             /* snapshot version the signer was built for */
    uint64_t ep_gen;                 /* endpoint table generation at the last refresh */
    sl_signer_t *signer;             /* signer over the active secrets */
    int64_t signer_until_ms;         /* rebuild when a secret expires (unix ms; 0 = never) */
    struct cons_list queue;          /* jobs waiting for a slot (JOB_QUEUED), FIFO */
    int inflight;                    /* requests running */
    struct cons_link ready_link;     /* on the engine's ready list */
    enum cons_brk_state brk;         /* local view of the shared breaker */
    int64_t brk_failures;            /* consecutive failures per the last Redis answer */
    int64_t brk_reopen_mono;         /* open: cooldown end (this pod's monotonic ms), 0 none */
    bool brk_counted;                /* counted in sluice_breaker_open_endpoints (brk_count) */
    int64_t brk_refreshed_mono;      /* when the view was last refreshed (mono ms) */
    int64_t last_failure_mono;       /* last failure seen here (mono ms) */
    int64_t last_answer_mono;        /* last request of it that ended here, or the start of the
                                        first one after none was out (mono ms) */
    bool probe_inflight;             /* our probe is running */
    uint64_t probe_seq;              /* our latest probe: its owner id is "<pod>/<seq>" */
    int64_t tokens;                  /* rate tokens leased from the shared bucket */
    int64_t tokens_until_mono;       /* leased tokens expire then (mono ms) */
    int64_t lease_granted;           /* tokens the last lease brought (sizes the next one) */
    int64_t blocked_until_mono;      /* rate limit or Retry-After pause (mono ms); 0 = none */
    struct cons_link blocked_link;   /* on the engine's blocked list */
    double cwnd;                     /* AIMD concurrency window after throttles (<= cap) */
    int64_t cwnd_cut_mono;           /* when the window was last halved (mono ms) */
    uint32_t lat_ms[LAT_RING];       /* recent answered-attempt latencies, ms */
    uint32_t lat_at_s[LAT_RING];     /* when each was taken (mono s) */
    uint32_t nlat, lat_pos;          /* samples held / next slot */
    int64_t brk_open_for_ms;         /* how long the shared breaker had been open (opened
                                        from closed, failed probes since) at the last view */
    bool disabled_local;             /* we asked the registry to disable it; until the
                                        registry answers, treat it as disabled here */
    uint64_t disabled_version;       /* snapshot version when we asked */
    struct cons_ep_metrics *m;       /* per-endpoint series, or NULL (metrics_endpoint_top) */
};

/* A record for Kafka (an outcome, a quarantined record) that the producer would not take
 * (local queue full, broker trouble) or that Kafka did not acknowledge: kept, in order, and
 * produced again from the loop (cons_retry_records) until Kafka takes it. Its job stays in memory
 * meanwhile (acks_pending counts it), so the job's offset stays open or its lease kept: never
 * dropped, never produced from inside a callback, never waited for. */
struct held_rec {
    struct job *j;            /* the job the record belongs to (borrowed) */
    char *topic;              /* owned */
    void *key, *val;          /* owned (key may be NULL) */
    size_t key_len, val_len;  /* bytes */
    rd_kafka_headers_t *hdrs; /* owned, or NULL */
    int64_t since_mono;       /* when it was first held (mono ms) */
    struct cons_link link;    /* on the engine's hrecs list */
};

/* A delivered or dead-letter marker whose write failed: written again once Redis answers. */
struct pmark {
    char *ep;                   /* endpoint id (owned) */
    char *id;                   /* event id (owned) */
    struct cons_done_info info; /* what the marker remembers of the delivery (delivered) */
    bool dead;                  /* a dead-letter marker (info unused) */
};

struct cons_engine {
    const struct sl_config *cfg; /* borrowed */
    sl_endpoints_t *endpoints;   /* borrowed */
    rd_kafka_t *consumer;        /* group consumer on topic_deliveries */
    rd_kafka_t *producer;        /* outcomes and quarantine */
    rd_kafka_queue_t *cq;        /* consumer queue (io events) */
    rd_kafka_queue_t *pq;        /* producer main queue (io events) */
    sl_redis_t *redis;           /* shared state */
    cons_http_t *http;           /* transfers */
    cons_offsets_t *offsets;     /* contiguous offsets */
    struct sl_ssrf_policy ssrf;  /* address policy */
    sl_map_t *eps;               /* endpoint id -> struct cons_ep */
    struct cons_list ready;      /* endpoints ready to send (ready_link), FIFO */
    struct cons_list blocked;    /* endpoints paused by a rate limit or Retry-After */
    struct cons_list held;       /* JOB_REDIS_HELD: Redis write failed, retried */
    struct cons_list inflight;   /* JOB_SENDING: a request running */
    struct cons_list marks;      /* JOB_MARKING: delivered, marker write pending */
    struct cons_list epwait;     /* JOB_EP_WAIT: unknown endpoint, table catching up */
    sl_map_t *live_ids;          /* job id -> the Kafka job of that delivery live in this
                                    loop: a copy read meanwhile is not sent beside it */
    sl_map_t *epwait_ids;        /* endpoint id -> jobs of it in epwait (intptr_t): its
                                    later records wait behind them, in order */
    struct cons_list ihold;      /* JOB_DEDUP_WAIT: duplicate check failed
                                    (dedup_fail_open=false), waiting for Redis */
    struct cons_list leased;     /* claimed retry jobs in memory whose leases we
                                    keep (lease_link; any state) */
    struct pmark *pmarks;        /* delivered markers whose write failed (owned) */
    struct cons_list hrecs;      /* records Kafka has not taken yet, FIFO (owned) */
    int64_t hrec_logged_mono;    /* last records_held log line (mono ms) */
    size_t npmarks, cap_pmarks;  /* entries in pmarks / allocated */
    struct cons_timers timers;   /* the loop's deadlines (enum loop_timer) */
    int64_t last_dispatch_mono;  /* previous dispatch call, for stall detection (mono ms) */
    int64_t hold_until_mono;     /* after a stall: no new send before this (mono ms) */
    bool await_revoke;           /* a stall outlived the session: hold until the group's
                                    revocation is served (or hold_until_mono passes) */
    int64_t last_revoke_mono;    /* last revocation served (mono ms; 0 = none) */
    int64_t marks_since_mono;    /* when the oldest entry of marks was added (mono ms) */
    int wake[2];                 /* pipe librdkafka writes to */
    char pod[SL_POD_MAX + 1];    /* instance id (the process's: every loop of it) */
    char owner[SL_POD_MAX + 13]; /* this loop's breaker owner id: pod, or pod#i when the
                                    process runs several loops ("#" and an int) */
    int thread;                  /* this loop's index (0..threads-1) */
    int threads;                 /* loops in this process (consumer_threads) */
    int64_t max_inflight;        /* this loop's share of max_inflight */
    struct cons_adapt adapt;     /* the cap dispatch works under now (cons_adapt.h) */
    uint64_t live;               /* jobs in memory */
    uint64_t spills_live;        /* of those, spilled to the schedule and not freed yet (its
                                    write or its outcome's acknowledgement outstanding) */
    int inflight_max;            /* most requests in flight since the last stats line */
    uint64_t live_max;           /* most jobs in memory since the last stats line */
    uint64_t live_cap;           /* intake takes no record at this many jobs in memory */
    uint64_t live_resume;        /* a pause of intake ends below this many */
    bool paused;                 /* partitions paused by us */
    int64_t full_since_mono;     /* intake full and taking nothing since (mono ms; 0 = not) */
    int64_t evict_next_mono;     /* next pass of spill_stuck_queues while full (mono ms) */
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
    int64_t redis_warned_mono;   /* rate limit for Redis warnings */
    int fatal;                   /* fatal error code */
    char
        db_owner[SL_RSTATE_OWNER_MAX + 1]; /* deployment sluice:owner must name, "" = not watched */
    struct cons_stats st;                  /* counters */
    unsigned proxy_down_run;     /* proxy_unreachable answers in a row (defer_for_proxy) */
    struct cons_stats st_last;   /* counters at the last stats line */
    struct sl_buf enc;           /* scratch for encoding */
    struct sl_buf canon;         /* scratch: a decoded record encoded again */
    struct sl_decode_limits lim; /* record limits (max_body_bytes) for decode and encode */
};

/* The only way to change a job's state (cons_job.c); by names the caller in logs. */
#define cons_job_set_state(e, j, to) cons_job_set_state_((e), (j), (to), __func__)
void cons_job_set_state_(cons_engine_t *e, struct job *j, enum job_state to, const char *by);
/* Whether the state table allows from -> to (pure; unit-tested). */
bool cons_job_transition_ok(enum job_state from, enum job_state to);
/* The state's name for logs ("queued", ...). */
const char *cons_job_state_name(enum job_state s);

/* ==== cons_job.c: job states and memory ==== */

struct job *cons_job_of(struct cons_link *k);
void cons_set_ctx(struct sl_log_ctx *ctx, const struct job *j);
struct job *cons_job_new(cons_engine_t *e, enum job_src src, const void *raw, size_t len);
void cons_leased_link(cons_engine_t *e, struct job *j);
void cons_leased_unlink(cons_engine_t *e, struct job *j);
void cons_job_free(cons_engine_t *e, struct job *j);
void cons_drop_canonical_raw(cons_engine_t *e, struct job *j);
const uint8_t *cons_job_env(cons_engine_t *e, struct job *j, size_t *len);

/* ==== cons_intake.c: intake and dedup ==== */

void cons_ihold_take(cons_engine_t *e, struct job *j);
void cons_retry_ihold(cons_engine_t *e);
void cons_epwait_take(cons_engine_t *e, struct job *j);
void cons_retry_epwait(cons_engine_t *e);
void cons_intake_kafka(cons_engine_t *e);
void cons_intake_redis(cons_engine_t *e);

/* ==== cons_endpoint.c: endpoint runtime ==== */

struct cons_ep *cons_ep_get(cons_engine_t *e, const char *id);
const struct sl_endpoint *cons_ep_refresh(cons_engine_t *e, struct cons_ep *ce);
void cons_ready_push(cons_engine_t *e, struct cons_ep *ce);
struct cons_ep *cons_ready_pop(cons_engine_t *e);
struct cons_retry_policy cons_policy_of(const cons_engine_t *e, const struct sl_endpoint *ep);
void cons_block_until(cons_engine_t *e, struct cons_ep *ce, int64_t until_mono);
void cons_unblock(cons_engine_t *e);
int64_t cons_inflight_cap(const cons_engine_t *e, const struct cons_ep *ce);
bool cons_rate_allows(cons_engine_t *e, struct cons_ep *ce);
int64_t cons_request_lease_ms(const cons_engine_t *e, const struct cons_ep *ce);
void cons_q_take(cons_engine_t *e, struct job *j);
struct job *cons_q_head(const struct cons_ep *ce);
struct job *cons_q_pop(cons_engine_t *e, struct cons_ep *ce, bool probe);
bool cons_breaker_allows(cons_engine_t *e, struct cons_ep *ce, bool *probe);
/* Every endpoint of the loop whose open breaker's cooldown, and a probe's time after it, has
 * ended since it was counted leaves sluice_breaker_open_endpoints (stats_line's tick). */
void cons_brk_sweep(cons_engine_t *e, int64_t now_mono);
int64_t cons_ep_observe(cons_engine_t *e,
                        struct cons_ep *ce,
                        struct job *j,
                        bool was_probe,
                        const struct cons_http_result *r,
                        enum cons_verdict v);

/* ==== cons_send.c: dispatch and results ==== */

void cons_send_end(cons_engine_t *e, struct job *j);
void cons_dispatch(cons_engine_t *e);

/* ==== cons_settle.c: outcomes, held writes, markers ==== */

void cons_outcome_init(cons_engine_t *e,
                       struct job *j,
                       struct sl_outcome *o,
                       enum sl_outcome_state state,
                       uint32_t attempt);
void cons_fault_stall(void);
void cons_held_free(cons_engine_t *e, struct held_rec *h);
struct held_rec *cons_hrec_first(const cons_engine_t *e);
void cons_retry_records(cons_engine_t *e);
int cons_produce_outcome(cons_engine_t *e, struct job *j, const struct sl_outcome *o);
void cons_job_done_quiet(cons_engine_t *e, struct job *j);
void cons_schedule_job(
    cons_engine_t *e, struct job *j, int64_t due_ms, uint32_t attempt, const struct sl_outcome *o);
void cons_held_take(cons_engine_t *e, struct job *j);
void cons_retry_held(cons_engine_t *e);
void cons_quarantine(cons_engine_t *e, struct job *j, const char *reason);
void cons_dead_letter(cons_engine_t *e,
                      struct job *j,
                      uint32_t attempt,
                      uint32_t http,
                      const char *err_class,
                      const char *msg,
                      const struct cons_http_result *r);
void cons_defer_job(cons_engine_t *e, struct job *j, int64_t due_ms, const char *why);
void cons_mark_push(cons_engine_t *e, struct job *j);
void cons_retry_pmarks(cons_engine_t *e);
void cons_flush_marks(cons_engine_t *e);
int cons_marks_due_in(const cons_engine_t *e);
void cons_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque);

/* ==== cons_lease.c: leases and the stall guard ==== */

void cons_renew_leases(cons_engine_t *e);
bool cons_lease_allows_send(cons_engine_t *e, struct job *j);
bool cons_stall_hold(cons_engine_t *e);

/* ==== cons_engine.c: shared helpers of the loop ==== */

void cons_warn_redis(cons_engine_t *e, const sl_err_t *err);
bool cons_redis_given_up(const cons_engine_t *e);

#endif /* CONS_ENGINE_INT_H */
