/*
 * sl_replay: the dead-letter replay engine, shared by `sluicectl replay` (ctl/ctl_replay.c,
 * which only parses flags and prints) and sluice-api. No printing, no exit, no globals.
 *
 * A replay re-publishes each selected dead letter's stored delivery record
 * (dead_letters.payload) to topic_deliveries with attempt = 0 and replay = true (the consumer
 * treats it as a fresh delivery with a new attempt budget) and marks the letter replayed
 * (replayed_at = now(), replay_count + 1). Selected are letters matching the selection that
 * are neither replayed since their latest death nor resolved, have a stored record and whose
 * endpoint is still registered (sql/0011), oldest death first. Each letter is sent once, also by
 * runs that overlap: per batch,
 *
 *   pg         (transaction)  select the letters FOR UPDATE SKIP LOCKED
 *   pg                        mark those another run had acknowledged ('acked' in the
 *                             journal) but not marked: they are not sent
 *   journal_pg (autocommit)   journal the others in replay_log as 'sending' <- before any send
 *   Kafka                     publish, wait for every acknowledgement (idempotent, acks=all)
 *   journal_pg (autocommit)   journal the acknowledged 'acked', the others 'failed'
 *   pg                        mark the acknowledged replayed; COMMIT
 *
 * Two connections because the journal rows must be durable while pg still holds the letters
 * locked (concurrent runs skip them) and before the marking commits. Every run first calls
 * sluice_replay_recover(), which marks letters an interrupted run got acknowledged but could
 * not mark, instead of sending them again; the second step above does the same for a run
 * interrupted while this one was running. The exact guarantee (the one window in which a
 * record can be sent twice) is docs/OPERATIONS-analysis.md, "replay"; the SQL objects are in
 * sql/0003_analysis.sql. Both connections need the sluice_replay role's rights.
 *
 * Messages name counts, endpoints, event ids and error classes, never payloads.
 *
 * thread: any thread, one call at a time per pair of connections. A run creates, polls (on
 * the calling thread only: delivery reports never run elsewhere) and destroys its own Kafka
 * producer, so concurrent runs on different threads share nothing but sl_log.
 */
#ifndef SL_REPLAY_H
#define SL_REPLAY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"

#define SL_REPLAY_IDS_MAX       10000    /* event ids in one selection */
#define SL_REPLAY_LIMIT_MAX     10000000 /* letters in one run (sel.limit) */
#define SL_REPLAY_BATCH_DEFAULT 500      /* letters per transaction */
#define SL_REPLAY_BATCH_MAX     10000
/* ms, per batch: the producer's 120 s message timeout plus 10 s of grace; records still
 * without a report then count as failed */
#define SL_REPLAY_ACK_WAIT_MS 130000
#define SL_REPLAY_RUN_ID_LEN  32                /* hex characters (128 random bits) */
#define SL_REPLAY_TIME_MAX_MS 253402300799999LL /* since/until bound: 9999-12-31T23:59:59.999Z */

/* Which dead letters. Every pointer is borrowed for the duration of the call. */
struct sl_replay_sel {
    const char *endpoint;         /* endpoint id (sl_valid_endpoint_id); NULL = any */
    const char *error_class;      /* sl_replay_error_class_valid; NULL = any */
    bool has_since;               /* since_ms applies */
    int64_t since_ms;             /* died at or after, unix ms */
    bool has_until;               /* until_ms applies */
    int64_t until_ms;             /* died before, unix ms (exclusive; > since_ms) */
    const char *const *event_ids; /* n_event_ids event ids (sl_valid_event_id); any endpoint
                                     unless endpoint is set */
    size_t n_event_ids;           /* 0..SL_REPLAY_IDS_MAX; 0 = any */
    int64_t limit;                /* at most this many letters, 0..SL_REPLAY_LIMIT_MAX; 0 = all */
    bool all;                     /* required when none of the above is given: an empty
                                     selection never means "everything" by accident */
};

/* What became of one letter of a run (reported once its batch committed). */
enum sl_replay_outcome {
    SL_REPLAY_REPLAYED, /* published, acknowledged and marked replayed */
    SL_REPLAY_FAILED,   /* could not be produced, Kafka reported a failure, or no report
                           within SL_REPLAY_ACK_WAIT_MS: journalled 'failed', stays selectable */
    SL_REPLAY_INVALID,  /* stored record does not decode or belongs to another event: never
                           sent, journalled 'failed', stays selectable */
};

/* One letter of a run, for sl_replay_opts.on_letter. Strings borrowed for the callback. */
struct sl_replay_letter {
    const char *event_id;           /* event id */
    const char *endpoint_id;        /* endpoint id */
    enum sl_replay_outcome outcome; /* see above */
    bool unconfirmed;               /* an interrupted earlier run left it 'sending': this run
                                       sent it again (the earlier copy may be in Kafka too) */
    const char *error;              /* why failed or invalid; "" when replayed */
};

/* One letter a dry run would replay, for sl_replay_dry_run's callback. Strings borrowed. */
struct sl_replay_candidate {
    const char *event_id;    /* event id */
    const char *endpoint_id; /* endpoint id */
    int64_t dead_ms;         /* its latest death, unix ms */
    const char *error_class; /* of the last attempt; NULL when none was recorded */
    bool has_last_status;    /* last_status is known */
    int64_t last_status;     /* HTTP status of the last attempt */
    int64_t attempts;        /* attempts spent before it died */
    int64_t replay_count;    /* earlier replays */
    int64_t bytes;           /* size of the stored record */
};

/* How to run. Every pointer is borrowed for the duration of the call. */
struct sl_replay_opts {
    int64_t batch_size;     /* letters per transaction (their rows stay locked while the batch
                               is published): 0 = SL_REPLAY_BATCH_DEFAULT, else
                               1..SL_REPLAY_BATCH_MAX */
    const char *kafka_role; /* client.id role of the run's producer (sl_kafka_conf_new):
                               "sluicectl-replay", "sluice-api-replay"; NULL = "sluice-replay" */
    const char *actor;      /* who runs it, journalled with each letter (replay_log.actor,
                               sql/0012; at most 256 bytes): "sluicectl <user>@<host>",
                               "sluice-api key <id>"; NULL = "" */
    void *opaque;           /* passed to the callbacks */
    /* Each letter's outcome, in selection order, once its batch committed (letters of a
     * batch whose commit failed are not reported: they are counted in unmarked /
     * unmarked_lost). Runs on the calling thread; must not use the run's connections.
     * NULL = not reported (the counts in sl_replay_result remain). */
    void (*on_letter)(void *opaque, const struct sl_replay_letter *l);
    /* A problem that does not stop the run (the acknowledgements of a batch could not be
     * journalled: its marking still makes the replay exact, only its crash safety is
     * weaker). msg borrowed for the call. NULL = logged as warn event replay_warning. */
    void (*on_warning)(void *opaque, const char *msg);
    /* When set (by another thread), the run ends before its next batch, the one in progress
     * finished: SL_ESTATE "stopped before its next batch". NULL = runs to the end. */
    const atomic_bool *stop;
};

/* The summary of a run. Filled as far as the run got, also when it returns an error. */
struct sl_replay_result {
    char run_id[SL_REPLAY_RUN_ID_LEN + 1]; /* hex; replay_log.run_id of this run */
    bool started;            /* the run got past its checks: the counts below are meaningful
                                (false: it failed before touching anything) */
    int64_t recovered;       /* acknowledged by an interrupted run (before this one or while
                                it ran), marked without sending again */
    int64_t replayed;        /* acknowledged and marked */
    int64_t failed;          /* SL_REPLAY_FAILED letters */
    int64_t invalid;         /* SL_REPLAY_INVALID letters */
    int64_t unconfirmed;     /* of replayed: re-sent after an interrupted run's unconfirmed
                                publish */
    int64_t unmarked;        /* acknowledged and journalled 'acked', but the marking failed:
                                the next run marks them without sending */
    int64_t unmarked_lost;   /* acknowledged, neither journalled nor marked: the next run
                                sends them again */
    int64_t without_payload; /* letters matching the selection without a stored record: they
                                cannot be replayed */
    int64_t unregistered;    /* letters matching the selection whose endpoint is no longer in
                                the registry (deleted): not sent, left as they are (the
                                consumers would set them aside as for an unknown endpoint) */
};

/* The summary of a dry run. */
struct sl_replay_dry_result {
    int64_t would_replay;    /* letters a run would select now (also those another running
                                replay holds locked) */
    int64_t without_payload; /* as in sl_replay_result */
    int64_t unregistered;    /* as in sl_replay_result */
};

/* An error class as outcomes carry it: 1..SL_ERR_CLASS_MAX characters [a-z0-9_]. s borrowed. */
bool sl_replay_error_class_valid(const char *s);

/*
 * Check a selection without touching anything: every field within the rules above. Returns 0
 * or SL_EINVAL with err naming the field (for an API answering 400 before calling the run).
 */
int sl_replay_sel_check(const struct sl_replay_sel *sel, sl_err_t *err);

/*
 * Replay the dead letters sel selects, in batches, as described at the top of this file.
 *
 * pg and journal_pg: two distinct, idle connections (outside any transaction) to the Sluice
 * database, both borrowed; a lock_timeout and statement_timeout on them are recommended
 * (sl_reg_db_open sets both). On return neither is inside a transaction (a failed batch is
 * rolled back, best effort). cfg borrowed (topic_deliveries, max_body_bytes, Kafka settings).
 * out (OUT): zeroed, then filled as the run goes (see sl_replay_result).
 *
 * Returns 0 when the run went through every batch: letters that failed or were invalid are
 * only counted (out->failed, out->invalid) and reported to on_letter. Otherwise the run
 * stopped early with err filled, the batch in progress rolled back, and what was done before
 * it still counted in out: SL_EINVAL (sel or opts malformed; out->started false), SL_ECRYPTO
 * (no random bytes for the run id; out->started false), SL_EPG (a statement failed, including
 * the count of letters without payload before the start: then out->started is false),
 * SL_EKAFKA (the producer could not be created).
 */
int sl_replay_run(PGconn *pg,
                  PGconn *journal_pg,
                  const struct sl_config *cfg,
                  const struct sl_replay_sel *sel,
                  const struct sl_replay_opts *opts,
                  struct sl_replay_result *out,
                  sl_err_t *err);

/*
 * What sl_replay_run would select now (limit applied), oldest death first: on_candidate
 * (NULL allowed) is called for each letter, or for the first shown_max only when shown_max >
 * 0 (the rest are counted in the database, not fetched), on the calling thread, with opaque.
 * Sends, journals and changes nothing; takes no row locks. pg borrowed, idle. out (OUT)
 * zeroed, then filled. Returns 0, SL_EINVAL (sel malformed) or SL_EPG, with err.
 */
int sl_replay_dry_run(PGconn *pg,
                      const struct sl_replay_sel *sel,
                      int64_t shown_max,
                      void (*on_candidate)(void *opaque, const struct sl_replay_candidate *c),
                      void *opaque,
                      struct sl_replay_dry_result *out,
                      sl_err_t *err);

#endif /* SL_REPLAY_H */
