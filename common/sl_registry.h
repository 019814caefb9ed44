/*
 * sl_registry: the endpoint registry (shared by sluicectl, the HTTP API server sluice-api and
 * the recorder, which applies disable requests from consumers): rows of the PostgreSQL tables
 * `endpoints` + `endpoint_secrets` (sql/0001_endpoints.sql, 0006_endpoint_subscriptions.sql),
 * their conversion to the topic record (common/sl_record.h), the Kafka publisher that makes
 * each change visible to consumers, and the change operations themselves (sl_reg_create /
 * _update / _rotate / _remove / _disable), so every writer runs the same sequence.
 *
 * Ordering: every change runs as
 *     lock (advisory) -> BEGIN -> modify -> read back -> encode -> COMMIT -> publish -> flush
 * holding a session advisory lock on the endpoint (and a shared one on the registry) from
 * before BEGIN until the flush returned, so two writers changing one endpoint publish in
 * commit order; `endpoints sync` holds the registry lock exclusively. The record is built
 * from what the transaction reads back, so the topic carries exactly the committed state
 * (updated_ms included), and sync re-publishes byte-identical records for unchanged rows.
 * The change operations release their two locks before returning (long-lived sessions).
 *
 * Secrets: the DB and the topic hold the same sealed boxes; sluicectl never decrypts except
 * for `show --show-secrets`.
 *
 * thread: single-threaded (one PGconn, one producer); a server uses one of each per thread.
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
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"

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
    char **types;      /* event-type filter (column event_types): exact types and "prefix.*"
                          wildcards, one owned block (array + strings); NULL = every type */
    size_t n_types;    /* entries in types, <= SL_EP_TYPES_MAX */
    char **channels;   /* channel labels, one owned block; NULL = no channel restriction */
    size_t n_channels; /* entries in channels, <= SL_EP_CHANNELS_MAX */
};

/* A new endpoint's row before any option is applied: id (borrowed; copied), empty name, URL,
 * content type and reason, POST, enabled, every policy value 0 (the global default). */
void sl_reg_ep_init(struct sl_reg_ep *ep, const char *id);

/* Free what ep owns and zero it (NULL-safe). */
void sl_reg_ep_fini(struct sl_reg_ep *ep);

/* Replace ep's headers with a copy of hdr[0..n) (borrowed). */
void sl_reg_ep_set_headers(struct sl_reg_ep *ep, const struct sl_kv *hdr, size_t n);

/* Replace ep's types / channels with a copy of v[0..n) (borrowed; not validated here:
 * sl_reg_ep_check does). n == 0 clears. */
void sl_reg_ep_set_types(struct sl_reg_ep *ep, const char *const *v, size_t n);
void sl_reg_ep_set_channels(struct sl_reg_ep *ep, const char *const *v, size_t n);

/*
 * The effective values consumers will apply (sl_endpoint_resolve_policy with d), indexed
 * like sl_reg_ep_nums, into eff (OUT).
 */
struct sl_endpoint_defaults;
void sl_reg_ep_effective(const struct sl_reg_ep *ep,
                         const struct sl_endpoint_defaults *d,
                         int64_t eff[SL_REG_N__COUNT]);

/*
 * Check a merged row before it is written: id, url (sl_endpoint_url_check, template or not),
 * each policy value 0 or within sl_reg_ep_nums' range, conn_timeout_ms <= timeout_ms and
 * retry_cap_ms >= retry_base_ms when both are set, types / channels (sl_valid_type_filter,
 * sl_valid_channel, counts, no duplicates), then the record codec's rules on the rest (name,
 * content type, headers, disabled reason). Returns 0 or SL_EINVAL / SL_ETOOBIG / SL_EMISSING
 * with a message naming the field by its JSON/column name ("url", "conn_timeout_ms",
 * "types", "content_type", "headers", "disabled_reason", ...), e.g.
 * `field "types": entry 2 repeats entry 0`. ep borrowed. Secrets are not looked at.
 */
int sl_reg_ep_check(const struct sl_reg_ep *ep, sl_err_t *err);

/* Number of unexpired secrets. */
size_t sl_reg_ep_active_secrets(const struct sl_reg_ep *ep);

/*
 * Encode ep's topic record (unexpired secrets only), signed with mk's current key
 * (sl_endpoint_rec_sign), and APPEND it to out. Validates with the codec's rules: SL_EINVAL /
 * SL_ETOOBIG / SL_EMISSING with a message naming the field.
 */
int sl_reg_ep_encode(const struct sl_reg_ep *ep,
                     const struct sl_masterkey *mk,
                     struct sl_buf *out,
                     sl_err_t *err);

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

#define SL_REG_PAGE_MAX 1000 /* largest limit sl_reg_db_page accepts */

/*
 * One page of endpoints, with secrets, ordered by id: at most limit (1..SL_REG_PAGE_MAX) rows
 * whose id is greater than after_id (borrowed; NULL = from the start). *out (OUT) an array of
 * *n entries as for sl_reg_db_list (NULL and 0 when the page is empty: the end). The next
 * page starts after the last id returned. Returns 0, SL_EINVAL (limit) or SL_EPG.
 */
int sl_reg_db_page(PGconn *pg,
                   const char *after_id,
                   size_t limit,
                   struct sl_reg_ep **out,
                   size_t *n,
                   sl_err_t *err);

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

/*
 * Master-key rotation: re-seal every secret of eps[0..n) (loaded with their secrets, expired
 * ones included) not sealed with mk's current key: open it with whichever configured key
 * sealed it, seal it with the current one, store the new box (UPDATE endpoint_secrets) and
 * put it in eps in place of the old box. Run inside a transaction holding the registry lock;
 * *resealed (OUT) counts the boxes replaced. Returns 0, SL_ECRYPTO (a box no configured key
 * opens: its message names the endpoint and key id) or SL_EPG.
 */
int sl_reg_reseal(PGconn *pg,
                  const struct sl_masterkey *mk,
                  struct sl_reg_ep *eps,
                  size_t n,
                  size_t *resealed,
                  sl_err_t *err);

/* Delete endpoint id and its secrets. SL_ENOTFOUND if absent. */
int sl_reg_db_delete(PGconn *pg, const char *id, sl_err_t *err);

/* ==== Kafka ==== */

#define SL_REG_FLUSH_TIMEOUT_MS                                                                    \
    20000 /* change operations' flush bound: > the producer's 15 s                                 \
             message timeout */

struct sl_reg_pub {
    rd_kafka_t *rk;                /* idempotent producer, acks=all; NULL until opened */
    const char *topic;             /* cfg->topic_endpoints (borrowed from cfg) */
    const struct sl_config *cfg;   /* borrowed; lets the change operations open rk lazily */
    const struct sl_masterkey *mk; /* borrowed; its current key signs every record */
    int flush_timeout_ms;          /* change operations' flush bound, ms; 0 = the default */
    int sent;                      /* records produced (since the last change operation) */
    int failed;                    /* delivery reports with an error (likewise) */
    uintptr_t gen;                 /* change operations so far: each one's records carry it, so
                                    * a late report on an earlier one's is not counted */
    char first_err[256];           /* first delivery error ("" = none) */
};

/* Prepare p for lazy opening: zero it and remember cfg and mk (borrowed; must outlive p). */
void sl_reg_pub_init(struct sl_reg_pub *p,
                     const struct sl_config *cfg,
                     const struct sl_masterkey *mk);

/* Create the producer (p's flush_timeout_ms and mk are kept, the rest reset; cfg borrowed,
 * must outlive p). Returns 0 or SL_EKAFKA. */
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

/* ==== Change operations ==== */

/*
 * Each runs the whole sequence at the top of this file on pg (a connection from
 * sl_reg_db_open, outside any transaction) and pub (opened with sl_reg_pub_open, or prepared
 * with sl_reg_pub_init: rk NULL -> opened after the commit, just before publishing), and
 * releases its advisory locks before returning. Outcome:
 *   0           committed AND published (res->committed, res->published true), or, for
 *               sl_reg_update only, no effective change: the record bytes would be identical,
 *               so it rolled back and published nothing (res->changed false);
 *   SL_EKAFKA   with res->committed true and res->published false: the change is committed in
 *               PostgreSQL but the publish or its flush failed, so consumers do not see it
 *               yet (the message says so; `sluicectl endpoints sync` repairs the topic). The
 *               OUT values are set as on success;
 *   other       nothing changed (rolled back; res all false): SL_ENOTFOUND unknown id,
 *               SL_ESTATE existing id (create), SL_EINVAL / SL_ETOOBIG / SL_EMISSING a bad
 *               field (sl_reg_ep_check), SL_EPG database, SL_ECRYPTO / SL_EINVAL sealing.
 * res (OUT, NULL allowed) is always written. Messages never contain secrets or URLs.
 */

/* Outcome flags of a change operation */
struct sl_reg_result {
    bool changed;   /* the operation changed the registry row (committed) */
    bool committed; /* the transaction committed */
    bool published; /* the committed state was published and acknowledged (acks=all) */
};

/*
 * Register a new endpoint. ep (IN/OUT): IN id + fields (types/channels, policy, enabled,
 * reason...; created/updated and secrets are ignored; NULL name/ct/reason count as "");
 * OUT on 0 or SL_EKAFKA the row as committed (read back, with its secret); untouched
 * otherwise. secret (borrowed; NULL = generate a new 32-byte HMAC one; an Ed25519 key pair
 * is sealed alike) is sealed with mk (borrowed; AD = id) and becomes secret #1. whsec (OUT)
 * receives the whsec_ / whsk_ text, to be shown once, on 0 and SL_EKAFKA ("" otherwise); it
 * is registered with the logger (sl_log_add_secret) and the caller wipes it (sl_secret_wipe)
 * after use. SL_ESTATE when the id exists.
 */
int sl_reg_create(PGconn *pg,
                  struct sl_reg_pub *pub,
                  const struct sl_masterkey *mk,
                  struct sl_reg_ep *ep,
                  const struct sl_secret *secret,
                  char whsec[SL_SECRET_STR_MAX],
                  struct sl_reg_result *res,
                  sl_err_t *err);

/*
 * Applies the change to the row read FOR UPDATE (ep: owned by the caller of fn; fn may
 * replace its strings with sl_xstrdup'ed ones, free()ing the old, and use the sl_reg_ep_set_*
 * helpers). Non-zero (a negative SL_E* code, err set) = refuse: nothing changes and
 * sl_reg_update returns that code. id, created_ms, updated_ms and secrets are not written.
 */
typedef int (*sl_reg_modify_fn)(void *opaque, struct sl_reg_ep *ep, sl_err_t *err);

/*
 * Read-modify-write of endpoint id (borrowed) with fn (opaque passed through): load FOR
 * UPDATE, fn, sl_reg_ep_check on what changed (the URL only when url or template changed,
 * policy ranges only for changed values, the cross-field and codec rules always; a changed
 * id is SL_EINVAL), UPDATE, read back, publish. out (OUT, overwritten; sl_reg_ep_fini it
 * also on failure): the row after the change (on no-op: the row as it is). SL_ENOTFOUND for
 * an unknown id, fn's code when it refuses.
 */
int sl_reg_update(PGconn *pg,
                  struct sl_reg_pub *pub,
                  const char *id,
                  sl_reg_modify_fn fn,
                  void *opaque,
                  struct sl_reg_ep *out,
                  struct sl_reg_result *res,
                  sl_err_t *err);

#define SL_REG_OVERLAP_MAX_S (30LL * 86400) /* longest rotation overlap, seconds */

/*
 * Rotate the signing secret of endpoint id (borrowed): prune expired secrets, let the
 * current one keep signing for overlap_s seconds (0..SL_REG_OVERLAP_MAX_S; 0 = stop now), add
 * secret (borrowed; NULL = generate) sealed with mk as the new current one. whsec and out as
 * in sl_reg_create / sl_reg_update (out: the row after, secrets current first). SL_ENOTFOUND,
 * SL_ETOOBIG when more than SL_SECRETS_MAX secrets would be unexpired, SL_EINVAL overlap.
 */
int sl_reg_rotate(PGconn *pg,
                  struct sl_reg_pub *pub,
                  const struct sl_masterkey *mk,
                  const char *id,
                  int64_t overlap_s,
                  const struct sl_secret *secret,
                  char whsec[SL_SECRET_STR_MAX],
                  struct sl_reg_ep *out,
                  struct sl_reg_result *res,
                  sl_err_t *err);

/* Delete endpoint id (borrowed) and its secrets; publishes a tombstone. SL_ENOTFOUND. */
int sl_reg_remove(
    PGconn *pg, struct sl_reg_pub *pub, const char *id, struct sl_reg_result *res, sl_err_t *err);

/*
 * Publish endpoint id's (borrowed) committed state again, under its lock: its record, or a
 * tombstone when the registry no longer has it. The repair for a change that returned
 * SL_EKAFKA (committed, not published): doing that change again with sl_reg_update finds
 * nothing to change and publishes nothing (sluice-api calls this then). Returns 0 once Kafka
 * acknowledged, SL_EPG, or SL_EKAFKA.
 */
int sl_reg_republish(PGconn *pg, struct sl_reg_pub *pub, const char *id, sl_err_t *err);

/*
 * Disable endpoint id (borrowed) with reason (borrowed, <= SL_REASON_MAX bytes) on behalf of a
 * consumer's request (a 410, or only failures for disable_after_ms): sl_reg_update with a
 * modify function that disables. Idempotent: an endpoint already disabled, or one changed
 * since requested_ms (an operator re-enabled it after the request was made), is left alone
 * and *changed (OUT, optional) is false. SL_ENOTFOUND for an unknown endpoint (deleted since);
 * SL_EKAFKA committed but not published (*changed true).
 */
int sl_reg_disable(PGconn *pg,
                   struct sl_reg_pub *pub,
                   const char *id,
                   const char *reason,
                   int64_t requested_ms,
                   bool *changed,
                   sl_err_t *err);

#endif /* SL_REGISTRY_H */
