/*
 * sl_registry: the endpoint registry (shared by sluicectl and the recorder, which applies
 * disable requests from consumers): rows of the PostgreSQL tables
 * `endpoints` + `endpoint_secrets` (sql/0001_endpoints.sql), their conversion to the topic
 * record (common/sl_record.h), and the Kafka publisher that makes each change visible to
 * consumers.
 *
 * Ordering: every change runs as
 *     lock (advisory) -> BEGIN -> modify -> read back -> encode -> COMMIT -> publish -> flush
 * holding a session advisory lock on the endpoint (and a shared one on the registry) from
 * before BEGIN until the flush returned, so two sluicectl runs changing one endpoint publish
 * in commit order; `endpoints sync` holds the registry lock exclusively. The record is built
 * from what the transaction reads back, so the topic carries exactly the committed state
 * (updated_ms included), and sync re-publishes byte-identical records for unchanged rows.
 *
 * Secrets: the DB and the topic hold the same sealed boxes; sluicectl never decrypts except
 * for `show --show-secrets`.
 *
 * thread: single-threaded (one PGconn, one producer).
 */
#ifndef SL_REGISTRY_H
#define SL_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_mem.h"
#include "common/sl_record.h"

/* The numeric policy fields, in one table so parsing, SQL, records and output agree. */
enum sl_reg_ep_num {
    SL_REG_N_TIMEOUT,
    SL_REG_N_CONN_TIMEOUT,
    SL_REG_N_RETRY_BASE,
    SL_REG_N_RETRY_CAP,
    SL_REG_N_MAX_ATTEMPTS,
    SL_REG_N_BRK_THRESHOLD,
    SL_REG_N_BRK_COOLDOWN,
    SL_REG_N_RATE,
    SL_REG_N_RATE_PERIOD,
    SL_REG_N_BURST,
    SL_REG_N_MAX_INFLIGHT,
    SL_REG_N__COUNT
};

struct sl_reg_ep_numdef {
    const char *flag;   /* command-line flag without "--" ("timeout-ms") */
    const char *column; /* SQL column and JSON key ("timeout_ms") */
    int64_t min, max;   /* accepted non-zero range; 0 always means "global default" */
    size_t rec_off;     /* offsetof the uint32_t field in struct sl_endpoint_rec */
    size_t eff_off;     /* offsetof the int64_t effective field in struct sl_endpoint */
    const char *help;   /* one line */
    const char *zero;   /* what 0 means, for help ("global default", "unlimited") */
};

extern const struct sl_reg_ep_numdef sl_reg_ep_nums[SL_REG_N__COUNT];

struct sl_reg_ep_secret {
    int seq;            /* 1, 2, ... per endpoint */
    uint8_t *enc;       /* sealed box (owned) */
    size_t enc_len;     /* bytes */
    int64_t created_ms; /* unix ms */
    int64_t exp_ms;     /* unix ms; 0 = current */
    bool expired;       /* exp_ms reached by the database clock when read */
};

/* One registry row plus its secrets (current first, then newest first). Strings owned. */
struct sl_reg_ep {
    char *id;                         /* endpoint id */
    char *name;                       /* "" = none */
    char *url;                        /* URL or template */
    bool tpl;                         /* url is a postback template */
    enum sl_http_method method;       /* request method */
    char *ct;                         /* content type; "" = the delivery's */
    struct sl_kv *hdr;                /* headers (one owned block: array + strings), NULL if none */
    size_t n_hdr;                     /* entries in hdr */
    int64_t num[SL_REG_N__COUNT];     /* policy values as stored; 0 = global default */
    bool enabled;                     /* deliveries allowed */
    char *reason;                     /* why disabled; "" = none */
    int64_t created_ms;               /* unix ms */
    int64_t updated_ms;               /* unix ms; the record's "updated" */
    struct sl_reg_ep_secret *secrets; /* n_secrets entries (owned) */
    size_t n_secrets;                 /* including expired ones not yet pruned */
};

/* Free what ep owns and zero it (NULL-safe). */
void sl_reg_ep_fini(struct sl_reg_ep *ep);

/* Replace ep's headers with a copy of hdr[0..n) (borrowed). */
void sl_reg_ep_set_headers(struct sl_reg_ep *ep, const struct sl_kv *hdr, size_t n);

/*
 * The effective values consumers will apply (sl_endpoint_resolve_policy with d), indexed
 * like sl_reg_ep_nums, into eff (OUT).
 */
struct sl_endpoint_defaults;
void sl_reg_ep_effective(const struct sl_reg_ep *ep,
                         const struct sl_endpoint_defaults *d,
                         int64_t eff[SL_REG_N__COUNT]);

/* Number of unexpired secrets. */
size_t sl_reg_ep_active_secrets(const struct sl_reg_ep *ep);

/*
 * Encode ep's topic record (unexpired secrets only) and APPEND it to out. Validates with the
 * codec's rules: SL_EINVAL / SL_ETOOBIG / SL_EMISSING with a message naming the field.
 */
int sl_reg_ep_encode(const struct sl_reg_ep *ep, struct sl_buf *out, sl_err_t *err);

/* ==== PostgreSQL ==== */

/* Connect (cfg->pg_dsn) with lock/statement timeouts set. NULL and err on failure. */
PGconn *sl_reg_db_open(const struct sl_config *cfg, sl_err_t *err);

/* Session advisory locks: one endpoint (plus the registry, shared), or the whole registry. */
int sl_reg_db_lock_endpoint(PGconn *pg, const char *id, sl_err_t *err);
int sl_reg_db_lock_registry(PGconn *pg, sl_err_t *err);

int sl_reg_db_begin(PGconn *pg, sl_err_t *err);
int sl_reg_db_commit(PGconn *pg, sl_err_t *err);
void sl_reg_db_rollback(PGconn *pg); /* best effort, for error paths */

/*
 * Read endpoint id (borrowed) into *out (OUT, overwritten; sl_reg_ep_fini it also on failure).
 * for_update locks the row until the transaction ends. SL_ENOTFOUND when there is no such
 * endpoint, SL_EPG on database errors.
 */
int sl_reg_db_load(
    PGconn *pg, const char *id, bool for_update, struct sl_reg_ep *out, sl_err_t *err);

/*
 * Every endpoint, ordered by id, with secrets: *out (OUT) an array of *n entries the caller
 * frees with sl_reg_ep_fini on each and free(). Returns 0 or SL_EPG.
 */
int sl_reg_db_list(PGconn *pg, struct sl_reg_ep **out, size_t *n, sl_err_t *err);

/* Insert a new endpoint row from ep (secrets not included). SL_ESTATE if the id exists. */
int sl_reg_db_insert(PGconn *pg, const struct sl_reg_ep *ep, sl_err_t *err);

/* Write every mutable column of ep to its row and set updated_at = now(). */
int sl_reg_db_update(PGconn *pg, const struct sl_reg_ep *ep, sl_err_t *err);

/*
 * Rotation inside the caller's transaction: prune expired secrets, make the current one
 * expire after overlap_s seconds (0 = now), add the sealed box enc (borrowed) as the new
 * current secret, touch updated_at. SL_ETOOBIG (nothing changed: the caller rolls back) when
 * more than SL_SECRETS_MAX secrets would be unexpired.
 */
int sl_reg_db_rotate(PGconn *pg,
                     const char *id,
                     int64_t overlap_s,
                     const uint8_t *enc,
                     size_t enc_len,
                     sl_err_t *err);

/* Add the first secret of a new endpoint. */
int sl_reg_db_add_secret(
    PGconn *pg, const char *id, const uint8_t *enc, size_t enc_len, sl_err_t *err);

/* Delete endpoint id and its secrets. SL_ENOTFOUND if absent. */
int sl_reg_db_delete(PGconn *pg, const char *id, sl_err_t *err);

/* ==== Kafka ==== */

struct sl_reg_pub {
    rd_kafka_t *rk;      /* idempotent producer, acks=all */
    const char *topic;   /* cfg->topic_endpoints (borrowed from cfg) */
    int sent;            /* records produced */
    int failed;          /* delivery reports with an error */
    char first_err[256]; /* first delivery error ("" = none) */
};

/* Create the producer. Returns 0 or SL_EKAFKA. */
int sl_reg_pub_open(const struct sl_config *cfg, struct sl_reg_pub *p, sl_err_t *err);

/* Produce key id (borrowed) with value val/len (NULL = tombstone; copied). */
int sl_reg_pub_send(
    struct sl_reg_pub *p, const char *id, const void *val, size_t len, sl_err_t *err);

/* Wait until everything sent is acknowledged (timeout_ms); SL_ETIMEDOUT / SL_EKAFKA naming
 * the first failure. */
int sl_reg_pub_flush(struct sl_reg_pub *p, int timeout_ms, sl_err_t *err);

/* Destroy the producer (NULL-safe on a zeroed struct); unsent records are purged. */
void sl_reg_pub_close(struct sl_reg_pub *p);

/* Release the session advisory locks taken by sl_reg_db_lock_endpoint / _registry (a
 * long-lived session such as the recorder's must; sluicectl just exits). */
int sl_reg_db_unlock_all(PGconn *pg, sl_err_t *err);

/*
 * Disable endpoint id (borrowed) with reason (borrowed, <= SL_REASON_MAX bytes) on behalf of a
 * consumer's request (a 410, or only failures for disable_after_ms): the whole change sequence
 * of this module (lock, BEGIN, load FOR UPDATE, set, UPDATE, read back, encode, COMMIT,
 * publish, flush, unlock). Idempotent: an endpoint already disabled, or one changed since
 * requested_ms (an operator re-enabled it after the request was made), is left alone and
 * *changed (OUT, optional) is false. SL_ENOTFOUND for an unknown endpoint (deleted since).
 */
int sl_reg_disable(PGconn *pg,
                   struct sl_reg_pub *pub,
                   const char *id,
                   const char *reason,
                   int64_t requested_ms,
                   bool *changed,
                   sl_err_t *err);

#endif /* SL_REGISTRY_H */
