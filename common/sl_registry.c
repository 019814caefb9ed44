/*
 * sl_registry: endpoint registry rows, records, publishing and the change operations (see
 * sl_registry.h).
 *
 * All SQL passes values as parameters (text format). Timestamps cross the boundary as unix
 * milliseconds computed by PostgreSQL (floor(extract(epoch ...) * 1000)), so the record's
 * "updated" is exactly what the row says. Sealed secrets travel as hex (encode/decode);
 * event_types / channels (text[]) as JSON arrays (array_to_json / jsonb_array_elements_text).
 *
 * The change operations share one skeleton (op_begin, op_commit_publish, op_end): lock the
 * endpoint, BEGIN, the operation's own statements, read back + encode, COMMIT, publish +
 * flush, unlock; a failure before COMMIT rolls back, one after it is SL_EKAFKA.
 */
#include "common/sl_registry.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/sl_endpoints.h"
#include "common/sl_fault.h"
#include "common/sl_hex.h"
#include "common/sl_kafka.h"
#include "common/sl_log.h"
#include "common/sl_pg.h"
#include "common/sl_ssrf.h"
#include "common/sl_url.h"

/* Advisory lock keys (see sql/0001_endpoints.sql): the registry (int8 key space) and one
 * endpoint (int4 pair: class 'SLEP', hashtext(id)). */
#define LOCK_REGISTRY "5997849461130"
#define LOCK_EP_CLASS "1397507408"

#define PUB_MESSAGE_TIMEOUT_MS "15000" /* a record not acknowledged by then is a failure */

/* The field is named alike in SQL, struct sl_endpoint_rec (raw) and struct sl_endpoint
 * (effective). */
#define NUM(flag, field, lo, hi, help, zero)                                                       \
    {                                                                                              \
        flag, #field, lo, hi, offsetof(struct sl_endpoint_rec, field),                             \
            offsetof(struct sl_endpoint, field), help, zero                                        \
    }

const struct sl_reg_ep_numdef sl_reg_ep_nums[SL_REG_N__COUNT] = {
    [SL_REG_N_TIMEOUT] =
        NUM("timeout-ms", timeout_ms, 100, 600000, "total request timeout (ms)", "global default"),
    [SL_REG_N_CONN_TIMEOUT] = NUM("connect-timeout-ms",
                                  conn_timeout_ms,
                                  10,
                                  600000,
                                  "connect timeout incl. TLS (ms)",
                                  "global default"),
    [SL_REG_N_RETRY_BASE] = NUM("retry-base-ms",
                                retry_base_ms,
                                1,
                                86400000,
                                "full-jitter backoff base (ms)",
                                "global default"),
    [SL_REG_N_RETRY_CAP] =
        NUM("retry-cap-ms", retry_cap_ms, 1, 604800000, "backoff cap (ms)", "global default"),
    [SL_REG_N_MAX_ATTEMPTS] = NUM(
        "max-attempts", max_attempts, 1, 100, "attempts before a dead letter", "global default"),
    [SL_REG_N_BRK_THRESHOLD] = NUM("breaker-threshold",
                                   brk_threshold,
                                   1,
                                   100000,
                                   "consecutive failures that open the breaker",
                                   "global default"),
    [SL_REG_N_BRK_COOLDOWN] = NUM("breaker-cooldown-ms",
                                  brk_cooldown_ms,
                                  10,
                                  86400000,
                                  "first breaker cooldown (ms)",
                                  "global default"),
    [SL_REG_N_RATE] = NUM("rate", rate, 1, 1000000, "requests per rate period", "unlimited"),
    [SL_REG_N_RATE_PERIOD] =
        NUM("rate-period-ms", rate_period_ms, 1, 86400000, "rate period (ms)", "1000 ms"),
    [SL_REG_N_BURST] = NUM("burst", burst, 1, 1000000, "token bucket size", "same as --rate"),
    [SL_REG_N_MAX_INFLIGHT] = NUM("max-inflight",
                                  max_inflight,
                                  1,
                                  10000,
                                  "concurrent requests per consumer pod",
                                  "global default"),
};

/* Column list of every endpoint query; the numeric columns follow enum sl_reg_ep_num. */
#define EP_COLS                                                                                    \
    "id, name, url, is_template, method, content_type, headers::text, timeout_ms, "                \
    "conn_timeout_ms, retry_base_ms, retry_cap_ms, max_attempts, brk_threshold, "                  \
    "brk_cooldown_ms, rate, rate_period_ms, burst, max_inflight, enabled, disabled_reason, "       \
    "floor(extract(epoch from created_at) * 1000)::bigint, "                                       \
    "floor(extract(epoch from updated_at) * 1000)::bigint, "                                       \
    "array_to_json(event_types)::text, array_to_json(channels)::text"
#define COL_NUM0     7
#define COL_ENABLED  18
#define COL_REASON   19
#define COL_CREATED  20
#define COL_UPDATED  21
#define COL_TYPES    22
#define COL_CHANNELS 23

#define SECRET_COLS                                                                                \
    "endpoint_id, seq, encode(secret_enc, 'hex'), "                                                \
    "floor(extract(epoch from created_at) * 1000)::bigint, "                                       \
    "coalesce(floor(extract(epoch from expires_at) * 1000)::bigint, 0), "                          \
    "(expires_at is not null and expires_at <= now())"
#define SECRET_ORDER "(expires_at is null) desc, seq desc"

/* ==== Rows ==== */

static void secrets_free(struct sl_reg_ep_secret *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sl_secret_wipe(s[i].enc, s[i].enc_len);
        free(s[i].enc);
    }
    free(s);
}

void sl_reg_ep_init(struct sl_reg_ep *ep, const char *id)
{
    memset(ep, 0, sizeof(*ep));
    ep->id = sl_xstrdup(id);
    ep->url = sl_xstrdup("");
    ep->name = sl_xstrdup("");
    ep->ct = sl_xstrdup("");
    ep->reason = sl_xstrdup("");
    ep->enabled = true;
    ep->method = SL_METHOD_POST;
}

void sl_reg_ep_fini(struct sl_reg_ep *ep)
{
    if (!ep)
        return;
    free(ep->id);
    free(ep->name);
    free(ep->url);
    free(ep->ct);
    free(ep->hdr);
    free(ep->types);
    free(ep->channels);
    free(ep->reason);
    secrets_free(ep->secrets, ep->n_secrets);
    memset(ep, 0, sizeof(*ep));
}

void sl_reg_ep_set_headers(struct sl_reg_ep *ep, const struct sl_kv *hdr, size_t n)
{
    struct sl_kv *out = NULL;
    if (n > 0) {
        size_t total = n * sizeof(*out);
        for (size_t i = 0; i < n; i++)
            total += strlen(hdr[i].name) + strlen(hdr[i].value) + 2;
        out = sl_xmalloc(total);
        char *p = (char *)(out + n);
        for (size_t i = 0; i < n; i++) {
            size_t a = strlen(hdr[i].name) + 1, b = strlen(hdr[i].value) + 1;
            memcpy(p, hdr[i].name, a);
            out[i].name = p;
            p += a;
            memcpy(p, hdr[i].value, b);
            out[i].value = p;
            p += b;
        }
    }
    free(ep->hdr);
    ep->hdr = out;
    ep->n_hdr = n;
}

void sl_reg_ep_set_types(struct sl_reg_ep *ep, const char *const *types, size_t n)
{
    char **v = sl_strv_dup(types, n);
    free(ep->types);
    ep->types = v;
    ep->n_types = n;
}

void sl_reg_ep_set_channels(struct sl_reg_ep *ep, const char *const *channels, size_t n)
{
    char **v = sl_strv_dup(channels, n);
    free(ep->channels);
    ep->channels = v;
    ep->n_channels = n;
}

/* ep's raw policy values as the uint32 fields of a record (nothing else set). */
static void rec_policy(const struct sl_reg_ep *ep, struct sl_endpoint_rec *rec)
{
    for (int i = 0; i < SL_REG_N__COUNT; i++) {
        uint32_t v = (uint32_t)ep->num[i];
        memcpy((char *)rec + sl_reg_ep_nums[i].rec_off, &v, sizeof(v));
    }
}

void sl_reg_ep_effective(const struct sl_reg_ep *ep,
                         const struct sl_endpoint_defaults *d,
                         int64_t eff[SL_REG_N__COUNT])
{
    struct sl_endpoint_rec rec;
    struct sl_endpoint e;
    memset(&rec, 0, sizeof(rec));
    memset(&e, 0, sizeof(e));
    rec_policy(ep, &rec);
    sl_endpoint_resolve_policy(&e, &rec, d);
    for (int i = 0; i < SL_REG_N__COUNT; i++)
        memcpy(&eff[i], (const char *)&e + sl_reg_ep_nums[i].eff_off, sizeof(eff[i]));
}

size_t sl_reg_ep_active_secrets(const struct sl_reg_ep *ep)
{
    size_t n = 0;
    for (size_t i = 0; i < ep->n_secrets; i++)
        n += !ep->secrets[i].expired;
    return n;
}

int sl_reg_ep_encode(const struct sl_reg_ep *ep,
                     const struct sl_masterkey *mk,
                     struct sl_buf *out,
                     sl_err_t *err)
{
    struct sl_endpoint_rec rec;
    struct sl_endpoint_secret secs[SL_SECRETS_MAX];
    size_t n = 0;
    memset(&rec, 0, sizeof(rec));
    for (size_t i = 0; i < ep->n_secrets; i++) {
        if (ep->secrets[i].expired)
            continue;
        if (n == SL_SECRETS_MAX)
            return sl_err_set(err, SL_ETOOBIG, "endpoint %s has more than %d unexpired secrets",
                              ep->id, SL_SECRETS_MAX);
        secs[n].enc = ep->secrets[i].enc;
        secs[n].enc_len = ep->secrets[i].enc_len;
        secs[n].exp_ms = (uint64_t)ep->secrets[i].exp_ms;
        n++;
    }
    rec.id = ep->id;
    rec.name = ep->name[0] ? ep->name : NULL;
    rec.url = ep->url;
    rec.tpl = ep->tpl;
    rec.method = ep->method;
    rec.ct = ep->ct[0] ? ep->ct : NULL;
    rec.hdr = ep->hdr;
    rec.n_hdr = ep->n_hdr;
    rec.secrets = secs;
    rec.n_secrets = n;
    rec_policy(ep, &rec);
    rec.enabled = ep->enabled;
    rec.reason = ep->reason[0] ? ep->reason : NULL;
    rec.updated_ms = (uint64_t)ep->updated_ms;
    rec.types = (const char *const *)ep->types;
    rec.n_types = ep->n_types;
    rec.channels = (const char *const *)ep->channels;
    rec.n_channels = ep->n_channels;
    return sl_endpoint_rec_sign(mk, &rec, out, err);
}

/* ==== Conversions ==== */

/* Decode lowercase hex (as PostgreSQL's encode(..., 'hex') writes it). NULL on bad input. */
static uint8_t *unhex(const char *s, size_t *len)
{
    size_t n = strlen(s);
    if (n % 2 != 0 || n == 0)
        return NULL;
    uint8_t *out = sl_xmalloc(n / 2);
    for (size_t i = 0; i < n / 2; i++) {
        int hi = sl_hex_digit_lower(s[2 * i]), lo = sl_hex_digit_lower(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(out);
            return NULL;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return out;
}

static char *tohex(const uint8_t *p, size_t n)
{
    char *s = sl_xmalloc(2 * n + 1);
    sl_hex_encode(p, n, s);
    return s;
}

static int64_t to_i64(const char *s)
{
    return strtoll(s, NULL, 10); /* from PostgreSQL integer output: always well formed */
}

static bool to_bool(const char *s)
{
    return s[0] == 't';
}

/* Parse the headers column: [{"name": ..., "value": ...}, ...]. */
static int headers_from_json(struct sl_reg_ep *ep, const char *text, sl_err_t *err)
{
    json_error_t jerr;
    json_t *arr = json_loads(text, 0, &jerr);
    struct sl_kv kv[SL_HDR_MAX];
    size_t n = 0;
    int rc = 0;
    if (!arr || !json_is_array(arr) || json_array_size(arr) > SL_HDR_MAX) {
        rc = sl_err_set(err, SL_EDECODE,
                        "headers of endpoint %s are not a JSON array of at "
                        "most %d entries",
                        ep->id, SL_HDR_MAX);
        goto out;
    }
    for (n = 0; n < json_array_size(arr); n++) {
        json_t *h = json_array_get(arr, n);
        const char *name = json_string_value(json_object_get(h, "name"));
        const char *value = json_string_value(json_object_get(h, "value"));
        if (!name || !value) {
            rc = sl_err_set(err, SL_EDECODE, "header %zu of endpoint %s lacks name or value", n,
                            ep->id);
            goto out;
        }
        kv[n].name = name;
        kv[n].value = value;
    }
    sl_reg_ep_set_headers(ep, kv, n);
out:
    json_decref(arr);
    return rc;
}

/* Parse a text[] column as array_to_json wrote it ("null" for an empty array is accepted). */
static int strs_from_json(struct sl_reg_ep *ep,
                          const char *text,
                          const char *column,
                          size_t max,
                          bool types,
                          sl_err_t *err)
{
    json_error_t jerr;
    json_t *arr = json_loads(text, JSON_DECODE_ANY, &jerr);
    const char *v[SL_EP_TYPES_MAX > SL_EP_CHANNELS_MAX ? SL_EP_TYPES_MAX : SL_EP_CHANNELS_MAX];
    size_t n = 0;
    int rc = 0;
    if (arr && json_is_null(arr))
        goto set;
    if (!arr || !json_is_array(arr) || json_array_size(arr) > max) {
        rc = sl_err_set(err, SL_EDECODE,
                        "column %s of endpoint %s is not an array of at most %zu entries", column,
                        ep->id, max);
        goto out;
    }
    for (n = 0; n < json_array_size(arr); n++) {
        v[n] = json_string_value(json_array_get(arr, n));
        if (!v[n]) {
            rc =
                sl_err_set(err, SL_EDECODE, "entry %zu of column %s of endpoint %s is not a string",
                           n, column, ep->id);
            goto out;
        }
    }
set:
    if (types)
        sl_reg_ep_set_types(ep, v, n);
    else
        sl_reg_ep_set_channels(ep, v, n);
out:
    json_decref(arr);
    return rc;
}

static char *strs_to_json(char *const *v, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_string(v[i]));
    char *s = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    if (!s)
        s = sl_xstrdup("[]");
    return s;
}

static char *headers_to_json(const struct sl_reg_ep *ep)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < ep->n_hdr; i++)
        json_array_append_new(
            arr, json_pack("{s:s, s:s}", "name", ep->hdr[i].name, "value", ep->hdr[i].value));
    char *s = json_dumps(arr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(arr);
    if (!s)
        s = sl_xstrdup("[]");
    return s;
}

static int row_to_ep(const PGresult *res, int r, struct sl_reg_ep *ep, sl_err_t *err)
{
    memset(ep, 0, sizeof(*ep));
    ep->id = sl_xstrdup(PQgetvalue(res, r, 0));
    ep->name = sl_xstrdup(PQgetvalue(res, r, 1));
    ep->url = sl_xstrdup(PQgetvalue(res, r, 2));
    ep->tpl = to_bool(PQgetvalue(res, r, 3));
    const char *m = PQgetvalue(res, r, 4);
    if (sl_http_method_parse(m, strlen(m), &ep->method) != 0)
        return sl_err_set(err, SL_EDECODE, "endpoint %s has an unknown method", ep->id);
    ep->ct = sl_xstrdup(PQgetvalue(res, r, 5));
    for (int i = 0; i < SL_REG_N__COUNT; i++)
        ep->num[i] = to_i64(PQgetvalue(res, r, COL_NUM0 + i));
    ep->enabled = to_bool(PQgetvalue(res, r, COL_ENABLED));
    ep->reason = sl_xstrdup(PQgetvalue(res, r, COL_REASON));
    ep->created_ms = to_i64(PQgetvalue(res, r, COL_CREATED));
    ep->updated_ms = to_i64(PQgetvalue(res, r, COL_UPDATED));
    int rc = headers_from_json(ep, PQgetvalue(res, r, 6), err);
    if (rc == 0)
        rc = strs_from_json(ep, PQgetvalue(res, r, COL_TYPES), "event_types", SL_EP_TYPES_MAX, true,
                            err);
    if (rc == 0)
        rc = strs_from_json(ep, PQgetvalue(res, r, COL_CHANNELS), "channels", SL_EP_CHANNELS_MAX,
                            false, err);
    return rc;
}

/* Append secret row r of res to ep. */
static int add_secret_row(struct sl_reg_ep *ep, const PGresult *res, int r, sl_err_t *err)
{
    struct sl_reg_ep_secret s;
    memset(&s, 0, sizeof(s));
    s.seq = (int)to_i64(PQgetvalue(res, r, 1));
    s.enc = unhex(PQgetvalue(res, r, 2), &s.enc_len);
    if (!s.enc)
        return sl_err_set(err, SL_EDECODE, "secret %d of endpoint %s is not readable", s.seq,
                          ep->id);
    s.created_ms = to_i64(PQgetvalue(res, r, 3));
    s.exp_ms = to_i64(PQgetvalue(res, r, 4));
    s.expired = to_bool(PQgetvalue(res, r, 5));
    ep->secrets = sl_xrealloc(ep->secrets, (ep->n_secrets + 1) * sizeof(*ep->secrets));
    ep->secrets[ep->n_secrets++] = s;
    return 0;
}

/* ==== PostgreSQL ==== */

PGconn *sl_reg_db_open(const struct sl_config *cfg, sl_err_t *err)
{
    PGconn *pg = sl_pg_connect(cfg->pg_dsn, err);
    if (!pg)
        return NULL;
    /* never hang behind a stuck sluicectl or a long-running statement */
    if (sl_pg_cmd(pg, "set lock_timeout", "select set_config('lock_timeout', '30s', false)", 0,
                  NULL, err) != 0 ||
        sl_pg_cmd(pg, "set statement_timeout",
                  "select set_config('statement_timeout', '60s', false)", 0, NULL, err) != 0) {
        PQfinish(pg);
        return NULL;
    }
    return pg;
}

int sl_reg_db_lock_endpoint(PGconn *pg, const char *id, sl_err_t *err)
{
    const char *p[1] = {id};
    if (sl_pg_cmd(pg, "lock the endpoint registry",
                  "select pg_advisory_lock_shared(" LOCK_REGISTRY ")", 0, NULL, err) != 0)
        return SL_EPG;
    return sl_pg_cmd(pg, "lock the endpoint",
                     "select pg_advisory_lock(" LOCK_EP_CLASS ", hashtext($1))", 1, p, err);
}

int sl_reg_db_lock_registry(PGconn *pg, sl_err_t *err)
{
    return sl_pg_cmd(pg, "lock the endpoint registry", "select pg_advisory_lock(" LOCK_REGISTRY ")",
                     0, NULL, err);
}

int sl_reg_db_begin(PGconn *pg, sl_err_t *err)
{
    return sl_pg_cmd(pg, "begin a transaction", "begin", 0, NULL, err);
}

int sl_reg_db_commit(PGconn *pg, sl_err_t *err)
{
    return sl_pg_cmd(pg, "commit", "commit", 0, NULL, err);
}

void sl_reg_db_rollback(PGconn *pg)
{
    if (pg && PQtransactionStatus(pg) != PQTRANS_IDLE)
        (void)sl_pg_cmd(pg, "roll back", "rollback", 0, NULL, NULL);
}

static int load_secrets(PGconn *pg, struct sl_reg_ep *ep, sl_err_t *err)
{
    const char *p[1] = {ep->id};
    PGresult *res = sl_pg_exec(pg, "read endpoint secrets",
                               "select " SECRET_COLS " from endpoint_secrets where endpoint_id = $1"
                               " order by " SECRET_ORDER,
                               1, p, err);
    if (!res)
        return SL_EPG;
    int rc = 0;
    for (int r = 0; r < PQntuples(res) && rc == 0; r++)
        rc = add_secret_row(ep, res, r, err);
    PQclear(res);
    return rc;
}

int sl_reg_db_load(
    PGconn *pg, const char *id, bool for_update, struct sl_reg_ep *out, sl_err_t *err)
{
    const char *p[1] = {id};
    int rc = 0;
    memset(out, 0, sizeof(*out));
    PGresult *res =
        sl_pg_exec(pg, "read endpoint",
                   for_update ? "select " EP_COLS " from endpoints where id = $1 for update"
                              : "select " EP_COLS " from endpoints where id = $1",
                   1, p, err);
    if (!res)
        return SL_EPG;
    if (PQntuples(res) != 1) {
        rc = sl_err_set(err, SL_ENOTFOUND, "endpoint %s not found", id);
        goto out;
    }
    rc = row_to_ep(res, 0, out, err);
    if (rc == 0)
        rc = load_secrets(pg, out, err);
out:
    PQclear(res);
    return rc;
}

/* Ids sorted by their bytes, as list_rows's merge compares them (strcmp), whatever the
 * database's collation (an en_US one puts "acme" before "Beta"). */
#define ID_BYTES "collate \"C\""

/* The ids of eps[0..n) as a text[] literal ("{\"a\",\"b\"}"; owned by the caller). */
static char *ids_array(const struct sl_reg_ep *eps, size_t n)
{
    struct sl_buf b;
    sl_buf_init(&b, SIZE_MAX);
    sl_buf_append(&b, "{", 1);
    for (size_t i = 0; i < n; i++) {
        if (i)
            sl_buf_append(&b, ",", 1);
        sl_buf_append(&b, "\"", 1);
        for (const char *c = eps[i].id; *c; c++) {
            if (*c == '"' || *c == '\\')
                sl_buf_append(&b, "\\", 1);
            sl_buf_append(&b, c, 1);
        }
        sl_buf_append(&b, "\"", 1);
    }
    sl_buf_append(&b, "}", 1); /* NUL-terminated */
    return (char *)b.data;
}

/*
 * Rows of endpoints (query q with nparams params p) and then their secrets, both ordered by id
 * (ID_BYTES), merged into *out / *n. The secrets query sq takes the same params, or, when
 * by_ids, one: the ids the first query returned (text[]), so that it reads the secrets of
 * exactly those rows, whatever was inserted meanwhile.
 */
static int list_rows(PGconn *pg,
                     const char *q,
                     const char *sq,
                     bool by_ids,
                     int nparams,
                     const char *const *p,
                     struct sl_reg_ep **out,
                     size_t *n,
                     sl_err_t *err)
{
    struct sl_reg_ep *eps = NULL;
    size_t cnt = 0;
    int rc = 0;
    PGresult *sres = NULL;
    *out = NULL;
    *n = 0;
    PGresult *res = sl_pg_exec(pg, "list endpoints", q, nparams, p, err);
    if (!res)
        return SL_EPG;
    cnt = (size_t)PQntuples(res);
    eps = sl_xcalloc(cnt ? cnt : 1, sizeof(*eps));
    for (size_t i = 0; i < cnt && rc == 0; i++)
        rc = row_to_ep(res, (int)i, &eps[i], err);
    if (rc != 0)
        goto out;
    if (cnt == 0)
        goto out;
    if (by_ids) {
        char *ids = ids_array(eps, cnt);
        const char *ip[1] = {ids};
        sres = sl_pg_exec(pg, "list endpoint secrets", sq, 1, ip, err);
        free(ids);
    } else {
        sres = sl_pg_exec(pg, "list endpoint secrets", sq, nparams, p, err);
    }
    if (!sres) {
        rc = SL_EPG;
        goto out;
    }
    /* both lists are sorted by endpoint id: merge */
    size_t e = 0;
    for (int r = 0; r < PQntuples(sres) && rc == 0; r++) {
        const char *eid = PQgetvalue(sres, r, 0);
        while (e < cnt && strcmp(eps[e].id, eid) < 0)
            e++;
        if (e < cnt && strcmp(eps[e].id, eid) == 0)
            rc = add_secret_row(&eps[e], sres, r, err);
    }
out:
    PQclear(res);
    PQclear(sres);
    if (rc != 0 || cnt == 0) {
        for (size_t i = 0; i < cnt; i++)
            sl_reg_ep_fini(&eps[i]);
        free(eps);
        return rc;
    }
    *out = eps;
    *n = cnt;
    return 0;
}

int sl_reg_db_list(PGconn *pg, struct sl_reg_ep **out, size_t *n, sl_err_t *err)
{
    return list_rows(pg, "select " EP_COLS " from endpoints order by id " ID_BYTES,
                     "select " SECRET_COLS " from endpoint_secrets order by endpoint_id " ID_BYTES
                     ", " SECRET_ORDER,
                     false, 0, NULL, out, n, err);
}

int sl_reg_db_page(PGconn *pg,
                   const char *after_id,
                   size_t limit,
                   struct sl_reg_ep **out,
                   size_t *n,
                   sl_err_t *err)
{
    char lim[24];
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > SL_REG_PAGE_MAX)
        return sl_err_set(err, SL_EINVAL, "page size must be 1..%d", SL_REG_PAGE_MAX);
    (void)snprintf(lim, sizeof(lim), "%zu", limit);
    const char *p[2] = {after_id, lim}; /* NULL = SQL null: from the start */
    /* the secrets of exactly the page's rows (by_ids), through endpoint_secrets_endpoint_id_bytes
     * (sql/0009): the page's query run again could end elsewhere after an insert */
    return list_rows(pg,
                     "select " EP_COLS " from endpoints where ($1::text is null or id " ID_BYTES
                     " > $1) order by id " ID_BYTES " limit $2::bigint",
                     "select " SECRET_COLS " from endpoint_secrets where endpoint_id " ID_BYTES
                     " = any($1::text[]) order by endpoint_id " ID_BYTES ", " SECRET_ORDER,
                     true, 2, p, out, n, err);
}

/* Text parameters $1..$22 for insert/update, in EP_COLS order minus the timestamps (types and
 * channels as JSON arrays: $21, $22). */
#define EP_NPARAMS 22
struct ep_params {
    const char *v[EP_NPARAMS];     /* parameter values */
    char num[SL_REG_N__COUNT][24]; /* storage for the numbers */
    char *headers;                 /* JSON text (owned) */
    char *types;                   /* JSON text (owned) */
    char *channels;                /* JSON text (owned) */
};

/* A JSON array parameter as text[], order kept. */
/* A change's updated_at: the database's clock, but always at least a millisecond past the
 * row's previous one, so the record's updated_ms grows with every change even if that clock
 * steps back; consumers refuse a record older than the one in force (sl_endpoints.h). */
#define SQL_UPDATED_NEXT "greatest(now(), updated_at + interval '1 millisecond')"

#define SQL_TEXT_ARRAY(n)                                                                          \
    "array(select x from jsonb_array_elements_text(" n "::jsonb) with ordinality as t(x, i) "      \
    "order by i)"

static void ep_params_free(struct ep_params *p)
{
    free(p->headers);
    free(p->types);
    free(p->channels);
}

static void ep_params_fill(struct ep_params *p, const struct sl_reg_ep *ep)
{
    p->headers = headers_to_json(ep);
    p->v[0] = ep->id;
    p->v[1] = ep->name;
    p->v[2] = ep->url;
    p->v[3] = ep->tpl ? "true" : "false";
    p->v[4] = sl_http_method_name(ep->method);
    p->v[5] = ep->ct;
    p->v[6] = p->headers;
    for (int i = 0; i < SL_REG_N__COUNT; i++) {
        (void)snprintf(p->num[i], sizeof(p->num[i]), "%" PRId64, ep->num[i]);
        p->v[COL_NUM0 + i] = p->num[i];
    }
    p->v[COL_ENABLED] = ep->enabled ? "true" : "false";
    p->v[COL_REASON] = ep->reason;
    p->types = strs_to_json(ep->types, ep->n_types);
    p->channels = strs_to_json(ep->channels, ep->n_channels);
    p->v[20] = p->types;
    p->v[21] = p->channels;
}

int sl_reg_db_insert(PGconn *pg, const struct sl_reg_ep *ep, sl_err_t *err)
{
    struct ep_params p;
    int rc = 0;
    ep_params_fill(&p, ep);
    PGresult *res = sl_pg_exec(
        pg, "insert endpoint",
        "insert into endpoints (id, name, url, is_template, method, content_type, headers, "
        "timeout_ms, conn_timeout_ms, retry_base_ms, retry_cap_ms, max_attempts, brk_threshold, "
        "brk_cooldown_ms, rate, rate_period_ms, burst, max_inflight, enabled, disabled_reason, "
        "event_types, channels, created_at, updated_at) values ($1, $2, $3, $4, $5, $6, "
        "$7::jsonb, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, "
        "" SQL_TEXT_ARRAY("$21") ", " SQL_TEXT_ARRAY(
            "$22") ", now(), now()) "
                   "on conflict (id) do nothing returning id",
        EP_NPARAMS, p.v, err);
    if (!res)
        rc = SL_EPG;
    else if (PQntuples(res) != 1)
        rc = sl_err_set(err, SL_ESTATE, "endpoint %s already exists", ep->id);
    PQclear(res);
    ep_params_free(&p);
    return rc;
}

int sl_reg_db_update(PGconn *pg, const struct sl_reg_ep *ep, sl_err_t *err)
{
    struct ep_params p;
    int rc = 0;
    ep_params_fill(&p, ep);
    PGresult *res = sl_pg_exec(
        pg, "update endpoint",
        "update endpoints set name = $2, url = $3, is_template = $4, method = $5, "
        "content_type = $6, headers = $7::jsonb, timeout_ms = $8, conn_timeout_ms = $9, "
        "retry_base_ms = $10, retry_cap_ms = $11, max_attempts = $12, brk_threshold = $13, "
        "brk_cooldown_ms = $14, rate = $15, rate_period_ms = $16, burst = $17, "
        "max_inflight = $18, enabled = $19, disabled_reason = $20, "
        "event_types = " SQL_TEXT_ARRAY("$21") ", channels = " SQL_TEXT_ARRAY(
            "$22") ", "
                   "updated_at = " SQL_UPDATED_NEXT " where id = $1 returning id",
        EP_NPARAMS, p.v, err);
    if (!res)
        rc = SL_EPG;
    else if (PQntuples(res) != 1)
        rc = sl_err_set(err, SL_ENOTFOUND, "endpoint %s not found", ep->id);
    PQclear(res);
    ep_params_free(&p);
    return rc;
}

int sl_reg_db_add_secret(
    PGconn *pg, const char *id, const uint8_t *enc, size_t enc_len, sl_err_t *err)
{
    char *hex = tohex(enc, enc_len);
    const char *p[2] = {id, hex};
    int rc = sl_pg_cmd(pg, "store the endpoint secret",
                       "insert into endpoint_secrets (endpoint_id, seq, secret_enc) "
                       "select $1, coalesce(max(seq), 0) + 1, decode($2, 'hex') "
                       "from endpoint_secrets where endpoint_id = $1",
                       2, p, err);
    free(hex);
    return rc;
}

int sl_reg_reseal(PGconn *pg,
                  const struct sl_masterkey *mk,
                  struct sl_reg_ep *eps,
                  size_t n,
                  size_t *resealed,
                  sl_err_t *err)
{
    const struct sl_masterkey_entry *cur = sl_masterkey_find(mk, NULL);
    *resealed = 0;
    if (!cur)
        return sl_err_set(err, SL_EINVAL, "no master key");
    uint8_t plain[SL_SECRET_ENC_MAX];
    uint8_t box[SL_SECRET_ENC_MAX];
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        for (size_t j = 0; j < eps[i].n_secrets && rc == 0; j++) {
            struct sl_reg_ep_secret *sec = &eps[i].secrets[j];
            char kid[SL_MASTERKEY_ID_MAX + 1];
            if (sl_secretbox_kid(sec->enc, sec->enc_len, kid) == 0 && strcmp(kid, cur->id) == 0)
                continue; /* sealed with the current key already */
            size_t plen = 0, blen = 0;
            rc = sl_secretbox_open(mk, eps[i].id, sec->enc, sec->enc_len, plain, sizeof(plain),
                                   &plen, err);
            if (rc == 0)
                rc = sl_secretbox_seal(mk, eps[i].id, plain, plen, box, sizeof(box), &blen, err);
            sl_secret_wipe(plain, sizeof(plain));
            if (rc != 0)
                break;
            char seq[16];
            (void)snprintf(seq, sizeof(seq), "%d", sec->seq);
            char *hex = tohex(box, blen);
            const char *p[3] = {eps[i].id, seq, hex};
            rc = sl_pg_cmd(pg, "store the re-sealed secret",
                           "update endpoint_secrets set secret_enc = decode($3, 'hex') "
                           "where endpoint_id = $1 and seq = $2::integer",
                           3, p, err);
            free(hex);
            if (rc != 0)
                break;
            sl_secret_wipe(sec->enc, sec->enc_len);
            free(sec->enc);
            sec->enc = sl_xmalloc(blen);
            memcpy(sec->enc, box, blen);
            sec->enc_len = blen;
            (*resealed)++;
        }
    }
    sl_secret_wipe(box, sizeof(box));
    return rc;
}

int sl_reg_db_rotate(PGconn *pg,
                     const char *id,
                     int64_t overlap_s,
                     const uint8_t *enc,
                     size_t enc_len,
                     sl_err_t *err)
{
    char overlap[24];
    (void)snprintf(overlap, sizeof(overlap), "%" PRId64, overlap_s);
    const char *p1[1] = {id};
    const char *p2[2] = {id, overlap};
    int rc = sl_pg_cmd(
        pg, "prune expired secrets",
        "delete from endpoint_secrets where endpoint_id = $1 and expires_at <= now()", 1, p1, err);
    if (rc == 0)
        rc = sl_pg_cmd(pg, "expire the current secret",
                       "update endpoint_secrets set expires_at = now() + $2::bigint * "
                       "interval '1 second' where endpoint_id = $1 and expires_at is null",
                       2, p2, err);
    if (rc == 0)
        rc = sl_reg_db_add_secret(pg, id, enc, enc_len, err);
    if (rc != 0)
        return rc;
    PGresult *res = sl_pg_exec(pg, "count secrets",
                               "select count(*) from endpoint_secrets where endpoint_id = $1 and "
                               "(expires_at is null or expires_at > now())",
                               1, p1, err);
    if (!res)
        return SL_EPG;
    int64_t active = to_i64(PQgetvalue(res, 0, 0));
    PQclear(res);
    if (active > SL_SECRETS_MAX)
        return sl_err_set(err, SL_ETOOBIG,
                          "endpoint %s would have %" PRId64 " unexpired secrets, limit %d: wait "
                          "for older ones to expire or rotate with a shorter overlap",
                          id, active, SL_SECRETS_MAX);
    return sl_pg_cmd(pg, "touch the endpoint",
                     "update endpoints set updated_at = " SQL_UPDATED_NEXT " where id = $1", 1, p1,
                     err);
}

int sl_reg_db_delete(PGconn *pg, const char *id, sl_err_t *err)
{
    const char *p[1] = {id};
    PGresult *res = sl_pg_exec(pg, "delete endpoint",
                               "delete from endpoints where id = $1 returning id", 1, p, err);
    if (!res)
        return SL_EPG;
    int rc = PQntuples(res) == 1 ? 0 : sl_err_set(err, SL_ENOTFOUND, "endpoint %s not found", id);
    PQclear(res);
    return rc;
}

/* ==== Kafka ==== */

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct sl_reg_pub *p = opaque;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR || (uintptr_t)m->_private != p->gen)
        return; /* delivered, or an earlier operation's record (its flush gave up on it) */
    if (p->failed++ == 0)
        (void)snprintf(p->first_err, sizeof(p->first_err), "%s", rd_kafka_err2str(m->err));
}

void sl_reg_pub_init(struct sl_reg_pub *p,
                     const struct sl_config *cfg,
                     const struct sl_masterkey *mk)
{
    memset(p, 0, sizeof(*p));
    p->cfg = cfg;
    p->mk = mk;
    p->topic = cfg ? cfg->topic_endpoints : NULL;
}

int sl_reg_pub_open(const struct sl_config *cfg, struct sl_reg_pub *p, sl_err_t *err)
{
    char errstr[512];
    int flush_timeout_ms = p->flush_timeout_ms;
    sl_reg_pub_init(p, cfg, p->mk);
    p->flush_timeout_ms = flush_timeout_ms;
    rd_kafka_conf_t *conf = sl_kafka_conf_new(cfg, "sluicectl", err);
    if (!conf)
        return SL_EKAFKA;
    if (sl_kafka_conf_set(conf, "enable.idempotence", "true", err) != 0 ||
        sl_kafka_conf_set(conf, "acks", "all", err) != 0 ||
        sl_kafka_conf_set(conf, "linger.ms", "0", err) != 0 ||
        sl_kafka_conf_set(conf, "message.timeout.ms", PUB_MESSAGE_TIMEOUT_MS, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return SL_EKAFKA;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_conf_set_opaque(conf, p);
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!p->rk) {
        rd_kafka_conf_destroy(conf);
        return sl_err_set(err, SL_EKAFKA, "could not create kafka producer: %s", errstr);
    }
    return 0;
}

int sl_reg_pub_send(
    struct sl_reg_pub *p, const char *id, const void *val, size_t len, sl_err_t *err)
{
    int rc = sl_kafka_produce(p->rk, p->topic, id, strlen(id), val, val ? len : 0, (void *)p->gen,
                              10000, err);
    if (rc == 0)
        p->sent++;
    return rc;
}

int sl_reg_pub_flush(struct sl_reg_pub *p, int timeout_ms, sl_err_t *err)
{
    rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, timeout_ms);
    if (e == RD_KAFKA_RESP_ERR__TIMED_OUT)
        return sl_err_set(err, SL_ETIMEDOUT,
                          "could not publish to topic %s: %d of %d records not acknowledged "
                          "within %d ms",
                          p->topic, rd_kafka_outq_len(p->rk), p->sent, timeout_ms);
    if (p->failed > 0)
        return sl_err_set(err, SL_EKAFKA, "could not publish %d of %d records to topic %s: %s",
                          p->failed, p->sent, p->topic, p->first_err);
    return 0;
}

void sl_reg_pub_close(struct sl_reg_pub *p)
{
    if (!p->rk)
        return;
    rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_flush(p->rk, 1000); /* serve the purge's delivery reports */
    rd_kafka_destroy(p->rk);
    p->rk = NULL;
}

int sl_reg_db_unlock_all(PGconn *pg, sl_err_t *err)
{
    return sl_pg_cmd(pg, "release registry locks", "select pg_advisory_unlock_all()", 0, NULL, err);
}

/* ==== Checks ==== */

/* Rename a codec message's record key to the registry's JSON/column name. */
static int codec_msg(int rc, sl_err_t *err)
{
    static const struct {
        const char *rec, *col;
    } names[] = {
        {"field \"ct\"", "field \"content_type\""},
        {"field \"hdr\"", "field \"headers\""},
        {"field \"reason\"", "field \"disabled_reason\""},
        {"field \"tpl\"", "field \"template\""},
    };
    if (!err)
        return rc;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t l = strlen(names[i].rec);
        if (strncmp(err->msg, names[i].rec, l) == 0) {
            char rest[SL_ERR_MSG_MAX];
            (void)snprintf(rest, sizeof(rest), "%s", err->msg + l);
            return sl_err_set(err, rc, "%s%s", names[i].col, rest);
        }
    }
    return rc;
}

/*
 * The address rules of the process's configuration (pub->cfg: ssrf_protection,
 * ssrf_allow_cidrs) for a new or changed URL whose host is an address or a loopback name
 * (sl_ssrf_check_host): such an endpoint's deliveries would all be refused, so its
 * registration is. Names resolving elsewhere are the consumers' check, at each connection.
 */
static int address_check(const struct sl_reg_pub *pub, const struct sl_reg_ep *ep, sl_err_t *err)
{
    if (!pub || !pub->cfg)
        return 0;
    struct sl_ssrf_policy policy;
    sl_err_t e2;
    if (sl_ssrf_parse(&policy, pub->cfg->ssrf_protection, pub->cfg->ssrf_allow_cidrs, &e2) != 0)
        return sl_err_set(err, SL_EINVAL, "ssrf_allow_cidrs: %s", e2.msg);
    char host[SL_URL_MAX + 1];
    if (sl_endpoint_url_host(ep->url, ep->tpl, host, sizeof(host)) != 0)
        return 0; /* sl_endpoint_url_check has answered for this URL */
    if (sl_ssrf_check_host(&policy, host, &e2) != 0)
        return sl_err_set(err, SL_EINVAL, "field \"url\": %s", e2.msg);
    return 0;
}

/*
 * sl_reg_ep_check, limited to what changed when before (borrowed) is given: the URL rules
 * only when url or tpl differ, policy ranges only for values that differ (rows written under
 * older rules stay editable); cross-field, types/channels and codec rules always.
 */
static int ep_check(const char *before_url,
                    bool before_tpl,
                    const int64_t *before_num,
                    const struct sl_reg_ep *ep,
                    sl_err_t *err)
{
    int rc;
    if (!ep->id || !sl_valid_endpoint_id(ep->id, strlen(ep->id)))
        return sl_err_set(err, SL_EINVAL, "field \"id\" must be 1..%d characters A-Z a-z 0-9 _ -",
                          SL_ENDPOINT_ID_MAX);
    if (!ep->url || !ep->url[0])
        return sl_err_set(err, SL_EMISSING, "field \"url\" missing");
    if (!before_url || strcmp(before_url, ep->url) != 0 || before_tpl != ep->tpl) {
        sl_err_t e2;
        rc = sl_endpoint_url_check(ep->url, ep->tpl, &e2);
        if (rc != 0)
            return sl_err_set(err, rc, "field \"url\": %s", e2.msg);
    }
    const int64_t *v = ep->num;
    for (int i = 0; i < SL_REG_N__COUNT; i++) {
        const struct sl_reg_ep_numdef *d = &sl_reg_ep_nums[i];
        if (before_num && before_num[i] == v[i])
            continue;
        if (v[i] != 0 && (v[i] < d->min || v[i] > d->max))
            return sl_err_set(err, SL_EINVAL,
                              "field \"%s\" must be 0 (%s) or %" PRId64 "..%" PRId64, d->column,
                              d->zero, d->min, d->max);
    }
    if (v[SL_REG_N_TIMEOUT] && v[SL_REG_N_CONN_TIMEOUT] &&
        v[SL_REG_N_CONN_TIMEOUT] > v[SL_REG_N_TIMEOUT])
        return sl_err_set(err, SL_EINVAL,
                          "field \"conn_timeout_ms\" (%" PRId64 ") must not exceed \"timeout_ms\" "
                          "(%" PRId64 ")",
                          v[SL_REG_N_CONN_TIMEOUT], v[SL_REG_N_TIMEOUT]);
    if (v[SL_REG_N_RETRY_BASE] && v[SL_REG_N_RETRY_CAP] &&
        v[SL_REG_N_RETRY_CAP] < v[SL_REG_N_RETRY_BASE])
        return sl_err_set(err, SL_EINVAL,
                          "field \"retry_cap_ms\" (%" PRId64 ") must not be less than "
                          "\"retry_base_ms\" (%" PRId64 ")",
                          v[SL_REG_N_RETRY_CAP], v[SL_REG_N_RETRY_BASE]);
    /* the codec's rules for the rest (types, channels, name, ct, hdr, reason), through a
     * record with a placeholder secret (secrets are not this check's business) */
    struct sl_endpoint_rec rec;
    struct sl_endpoint_secret sec = {(const uint8_t *)"x", 1, 0};
    memset(&rec, 0, sizeof(rec));
    rec.id = ep->id;
    rec.name = ep->name && ep->name[0] ? ep->name : NULL;
    rec.url = ep->url;
    rec.tpl = ep->tpl;
    rec.method = ep->method;
    rec.ct = ep->ct && ep->ct[0] ? ep->ct : NULL;
    rec.hdr = ep->hdr;
    rec.n_hdr = ep->n_hdr;
    rec.secrets = &sec;
    rec.n_secrets = 1;
    rec_policy(ep, &rec);
    rec.enabled = ep->enabled;
    rec.reason = ep->reason && ep->reason[0] ? ep->reason : NULL;
    rec.types = (const char *const *)ep->types;
    rec.n_types = ep->n_types;
    rec.channels = (const char *const *)ep->channels;
    rec.n_channels = ep->n_channels;
    rc = sl_endpoint_rec_validate(&rec, NULL, err);
    return rc ? codec_msg(rc, err) : 0;
}

int sl_reg_ep_check(const struct sl_reg_ep *ep, sl_err_t *err)
{
    if (!ep)
        return sl_err_set(err, SL_EINVAL, "no endpoint");
    return ep_check(NULL, false, NULL, ep, err);
}

/* ==== Change operations ==== */

/* State of one change operation, from op_begin to op_end. */
struct op {
    PGconn *pg;                /* borrowed */
    struct sl_reg_pub *pub;    /* borrowed */
    char *id;                  /* copy (the caller's may be freed on the way, as create does) */
    struct sl_reg_result *res; /* caller's, or a local one */
    struct sl_reg_result own;  /* res when the caller passed NULL */
    int locks;                 /* 0 none, 1 registry (shared), 2 + endpoint */
    bool in_tx;                /* BEGIN done, no COMMIT/ROLLBACK yet */
    struct sl_buf rec;         /* the committed state's record */
};

/* Lock the endpoint (registry shared, then the endpoint) and BEGIN. */
static int op_begin(struct op *op,
                    PGconn *pg,
                    struct sl_reg_pub *pub,
                    const char *id,
                    struct sl_reg_result *res,
                    sl_err_t *err)
{
    memset(op, 0, sizeof(*op));
    op->pg = pg;
    op->pub = pub;
    op->id = id ? sl_xstrdup(id) : NULL;
    op->res = res ? res : &op->own;
    memset(op->res, 0, sizeof(*op->res));
    sl_buf_init(&op->rec, SL_ENDPOINT_RECORD_MAX);
    if (!pg || !pub || !id)
        return sl_err_set(err, SL_EINVAL, "no database connection, publisher or endpoint id");
    const char *p[1] = {id};
    if (sl_pg_cmd(pg, "lock the endpoint registry",
                  "select pg_advisory_lock_shared(" LOCK_REGISTRY ")", 0, NULL, err) != 0)
        return SL_EPG;
    op->locks = 1;
    if (sl_pg_cmd(pg, "lock the endpoint",
                  "select pg_advisory_lock(" LOCK_EP_CLASS ", hashtext($1))", 1, p, err) != 0)
        return SL_EPG;
    op->locks = 2;
    if (sl_reg_db_begin(pg, err) != 0)
        return SL_EPG;
    op->in_tx = true;
    return 0;
}

/* Roll back if still in the transaction, release the locks taken, free; returns rc. */
static int op_end(struct op *op, int rc)
{
    if (op->in_tx)
        sl_reg_db_rollback(op->pg);
    op->in_tx = false;
    if (op->pg && PQstatus(op->pg) == CONNECTION_OK) {
        const char *p[1] = {op->id};
        if (op->locks == 2)
            (void)sl_pg_cmd(op->pg, "unlock the endpoint",
                            "select pg_advisory_unlock(" LOCK_EP_CLASS ", hashtext($1))", 1, p,
                            NULL);
        if (op->locks >= 1)
            (void)sl_pg_cmd(op->pg, "unlock the endpoint registry",
                            "select pg_advisory_unlock_shared(" LOCK_REGISTRY ")", 0, NULL, NULL);
    }
    op->locks = 0;
    sl_buf_fini(&op->rec);
    free(op->id);
    op->id = NULL;
    return rc;
}

/*
 * Publish val (NULL = tombstone) for the committed change and wait for the acknowledgement.
 * SL_EKAFKA saying the change is committed but not visible when that fails.
 *
 * Test builds only (-DSL_FAULT_INJECTION=ON): SL_FAULT=reg_publish_first_fails fails the
 * process's first publish as an unreachable Kafka would (tests/e2e/test_api.py).
 */
static atomic_int fault_publishes;

static int op_publish(struct op *op, const void *val, size_t len, sl_err_t *err)
{
    struct sl_reg_pub *pub = op->pub;
    sl_err_t e2 = {0, ""};
    int rc = 0;
    if (sl_fault_is("reg_publish_first_fails") && atomic_fetch_add(&fault_publishes, 1) == 0)
        return sl_err_set(err, SL_EKAFKA,
                          "the change to endpoint %s is committed in PostgreSQL but was NOT "
                          "published (SL_FAULT)",
                          op->id);
    if (!pub->rk) {
        if (!pub->cfg)
            rc = sl_err_set(&e2, SL_EINVAL, "the publisher has no configuration to open with");
        else
            rc = sl_reg_pub_open(pub->cfg, pub, &e2);
    }
    if (rc == 0) {
        /* counters per operation: an earlier failure must not be reported again, nor a
         * late report on an earlier operation's record counted (gen) */
        pub->gen++;
        pub->sent = 0;
        pub->failed = 0;
        pub->first_err[0] = '\0';
        rc = sl_reg_pub_send(pub, op->id, val, len, &e2);
    }
    if (rc == 0)
        rc = sl_reg_pub_flush(
            pub, pub->flush_timeout_ms > 0 ? pub->flush_timeout_ms : SL_REG_FLUSH_TIMEOUT_MS, &e2);
    if (rc == 0) {
        op->res->published = true;
        return 0;
    }
    return sl_err_set(err, SL_EKAFKA,
                      "the change to endpoint %s is committed in PostgreSQL but was NOT "
                      "published to topic %s, so consumers do not see it yet: %s",
                      op->id, pub->topic ? pub->topic : "(none)", e2.msg);
}

/* Read the row back into *ep (replacing it), encode it into op->rec, COMMIT, publish. */
static int op_finish(struct op *op, struct sl_reg_ep *ep, sl_err_t *err)
{
    sl_reg_ep_fini(ep);
    int rc = sl_reg_db_load(op->pg, op->id, false, ep, err);
    if (rc == 0)
        rc = sl_reg_ep_encode(ep, op->pub->mk, &op->rec, err);
    if (rc == 0)
        rc = sl_reg_db_commit(op->pg, err);
    op->in_tx = false; /* a failed COMMIT ends the transaction too (op_end rolls back nothing) */
    if (rc != 0) {
        sl_reg_db_rollback(op->pg);
        return rc;
    }
    op->res->committed = true;
    op->res->changed = true;
    return op_publish(op, op->rec.data, op->rec.len, err);
}

/* The sealed box of secret (NULL = a new one) for endpoint id; whsec gets its text. */
static int seal_secret(const struct sl_masterkey *mk,
                       const char *id,
                       const struct sl_secret *secret,
                       char whsec[SL_SECRET_STR_MAX],
                       uint8_t box[SL_SECRET_ENC_MAX],
                       size_t *blen,
                       sl_err_t *err)
{
    struct sl_secret gen;
    sl_err_t e2;
    int rc = 0;
    memset(&gen, 0, sizeof(gen));
    if (!mk)
        return sl_err_set(err, SL_EINVAL, "no master key to encrypt the signing secret");
    if (!secret) {
        rc = sl_secret_generate(&gen, err);
        if (rc != 0)
            goto out;
        secret = &gen;
    }
    rc = sl_secret_format(secret, whsec, SL_SECRET_STR_MAX, &e2);
    if (rc == 0)
        rc = sl_secretbox_seal(mk, id, (const uint8_t *)whsec, strlen(whsec), box,
                               SL_SECRET_ENC_MAX, blen, &e2);
    if (rc != 0) {
        sl_secret_wipe(whsec, SL_SECRET_STR_MAX);
        whsec[0] = '\0';
        rc = sl_err_set(err, rc, "cannot prepare the signing secret: %s", e2.msg);
        goto out;
    }
    sl_log_add_secret(whsec);
out:
    sl_secret_fini(&gen);
    return rc;
}

/* NULL optional strings of a caller-built row become "" (the columns are NOT NULL). */
static void ep_fill_empty(struct sl_reg_ep *ep)
{
    if (!ep->name)
        ep->name = sl_xstrdup("");
    if (!ep->ct)
        ep->ct = sl_xstrdup("");
    if (!ep->reason)
        ep->reason = sl_xstrdup("");
}

int sl_reg_create(PGconn *pg,
                  struct sl_reg_pub *pub,
                  const struct sl_masterkey *mk,
                  struct sl_reg_ep *ep,
                  const struct sl_secret *secret,
                  char whsec[SL_SECRET_STR_MAX],
                  struct sl_reg_result *res,
                  sl_err_t *err)
{
    struct op op;
    struct sl_reg_ep back;
    uint8_t box[SL_SECRET_ENC_MAX];
    size_t blen = 0;
    int rc;
    memset(&back, 0, sizeof(back));
    whsec[0] = '\0';
    if (!ep) {
        op_begin(&op, NULL, NULL, NULL, res, NULL);
        return op_end(&op, sl_err_set(err, SL_EINVAL, "no endpoint"));
    }
    ep_fill_empty(ep);
    rc = sl_reg_ep_check(ep, err);
    if (rc == 0)
        rc = address_check(pub, ep, err);
    if (rc != 0) {
        op_begin(&op, NULL, NULL, NULL, res, NULL);
        return op_end(&op, rc);
    }
    rc = seal_secret(mk, ep->id, secret, whsec, box, &blen, err);
    if (rc == 0)
        rc = op_begin(&op, pg, pub, ep->id, res, err);
    else
        op_begin(&op, NULL, NULL, NULL, res, NULL);
    if (rc == 0)
        rc = sl_reg_db_insert(pg, ep, err);
    if (rc == 0)
        rc = sl_reg_db_add_secret(pg, ep->id, box, blen, err);
    if (rc == 0)
        rc = op_finish(&op, &back, err);
    if (op.res->committed) {
        sl_reg_ep_fini(ep);
        *ep = back; /* moved */
        memset(&back, 0, sizeof(back));
    } else {
        sl_secret_wipe(whsec, SL_SECRET_STR_MAX);
        whsec[0] = '\0';
    }
    sl_secret_wipe(box, sizeof(box));
    sl_reg_ep_fini(&back);
    return op_end(&op, rc);
}

int sl_reg_update(PGconn *pg,
                  struct sl_reg_pub *pub,
                  const char *id,
                  sl_reg_modify_fn fn,
                  void *opaque,
                  struct sl_reg_ep *out,
                  struct sl_reg_result *res,
                  sl_err_t *err)
{
    struct op op;
    struct sl_buf before;
    char *before_url = NULL;
    bool before_tpl;
    int64_t before_num[SL_REG_N__COUNT];
    memset(out, 0, sizeof(*out));
    sl_buf_init(&before, SL_ENDPOINT_RECORD_MAX);
    int rc = op_begin(&op, pg, pub, id, res, err);
    if (rc == 0 && !fn)
        rc = sl_err_set(err, SL_EINVAL, "no modify function");
    if (rc == 0)
        rc = sl_reg_db_load(pg, id, true, out, err);
    if (rc == 0)
        rc = sl_reg_ep_encode(out, pub->mk, &before, err);
    if (rc != 0)
        goto done;
    before_url = sl_xstrdup(out->url);
    before_tpl = out->tpl;
    memcpy(before_num, out->num, sizeof(before_num));
    rc = fn(opaque, out, err);
    if (rc != 0) {
        if (rc > 0) /* refusals are negative SL_E* codes; never report success */
            rc = sl_err_set(err, SL_EINVAL, "the change to endpoint %s was refused", id);
        goto done;
    }
    ep_fill_empty(out);
    if (!out->id || strcmp(out->id, id) != 0) {
        rc = sl_err_set(err, SL_EINVAL, "the id of endpoint %s cannot change", id);
        goto done;
    }
    rc = ep_check(before_url, before_tpl, before_num, out, err);
    if (rc == 0 && (strcmp(before_url, out->url) != 0 || before_tpl != out->tpl))
        rc = address_check(pub, out, err);
    if (rc == 0)
        rc = sl_reg_ep_encode(out, pub->mk, &op.rec, err);
    if (rc != 0) {
        if (rc != SL_EPG)
            rc = codec_msg(rc, err);
        goto done;
    }
    if (op.rec.len == before.len && memcmp(op.rec.data, before.data, before.len) == 0) {
        /* nothing to do: no write, no publish, no new version for consumers */
        goto done;
    }
    sl_buf_reset(&op.rec);
    rc = sl_reg_db_update(pg, out, err);
    if (rc == 0)
        rc = op_finish(&op, out, err);
done:
    free(before_url);
    sl_buf_fini(&before);
    return op_end(&op, rc);
}

int sl_reg_rotate(PGconn *pg,
                  struct sl_reg_pub *pub,
                  const struct sl_masterkey *mk,
                  const char *id,
                  int64_t overlap_s,
                  const struct sl_secret *secret,
                  char whsec[SL_SECRET_STR_MAX],
                  struct sl_reg_ep *out,
                  struct sl_reg_result *res,
                  sl_err_t *err)
{
    struct op op;
    uint8_t box[SL_SECRET_ENC_MAX];
    size_t blen = 0;
    int rc;
    memset(out, 0, sizeof(*out));
    whsec[0] = '\0';
    if (overlap_s < 0 || overlap_s > SL_REG_OVERLAP_MAX_S) {
        op_begin(&op, NULL, NULL, NULL, res, NULL);
        return op_end(&op, sl_err_set(err, SL_EINVAL, "overlap must be 0..%lld seconds",
                                      (long long)SL_REG_OVERLAP_MAX_S));
    }
    if (!id || !sl_valid_endpoint_id(id, strlen(id))) {
        op_begin(&op, NULL, NULL, NULL, res, NULL);
        return op_end(&op, sl_err_set(err, SL_EINVAL,
                                      "invalid endpoint id: expected 1..%d characters "
                                      "[A-Za-z0-9_-]",
                                      SL_ENDPOINT_ID_MAX));
    }
    rc = seal_secret(mk, id, secret, whsec, box, &blen, err);
    if (rc == 0)
        rc = op_begin(&op, pg, pub, id, res, err);
    else
        op_begin(&op, NULL, NULL, NULL, res, NULL);
    if (rc == 0)
        rc = sl_reg_db_load(pg, id, true, out, err); /* SL_ENOTFOUND; locks the row */
    if (rc == 0)
        rc = sl_reg_db_rotate(pg, id, overlap_s, box, blen, err);
    if (rc == 0)
        rc = op_finish(&op, out, err);
    if (!op.res->committed) {
        sl_secret_wipe(whsec, SL_SECRET_STR_MAX);
        whsec[0] = '\0';
    }
    sl_secret_wipe(box, sizeof(box));
    return op_end(&op, rc);
}

int sl_reg_remove(
    PGconn *pg, struct sl_reg_pub *pub, const char *id, struct sl_reg_result *res, sl_err_t *err)
{
    struct op op;
    int rc = op_begin(&op, pg, pub, id, res, err);
    if (rc == 0)
        rc = sl_reg_db_delete(pg, id, err);
    if (rc == 0)
        rc = sl_reg_db_commit(pg, err);
    op.in_tx = false;
    if (rc != 0)
        sl_reg_db_rollback(pg);
    if (rc == 0) {
        op.res->committed = true;
        op.res->changed = true;
        rc = op_publish(&op, NULL, 0, err);
    }
    return op_end(&op, rc);
}

/* sl_reg_disable's modify function. */
struct disable_req {
    const char *reason;   /* borrowed */
    int64_t requested_ms; /* when the consumer asked */
};

static int disable_modify(void *opaque, struct sl_reg_ep *ep, sl_err_t *err)
{
    (void)err;
    const struct disable_req *d = opaque;
    if (!ep->enabled || ep->updated_ms > d->requested_ms) {
        /* already disabled, or an operator changed it after the consumer asked: their word
         * stands (unchanged row: sl_reg_update rolls back, publishes nothing) */
        return 0;
    }
    ep->enabled = false;
    free(ep->reason);
    ep->reason = sl_xstrdup(d->reason);
    return 0;
}

int sl_reg_republish(PGconn *pg, struct sl_reg_pub *pub, const char *id, sl_err_t *err)
{
    struct op op;
    struct sl_reg_ep ep;
    memset(&ep, 0, sizeof(ep));
    int rc = op_begin(&op, pg, pub, id, NULL, err);
    if (rc == 0)
        rc = sl_reg_db_load(pg, id, false, &ep, err);
    bool gone = rc == SL_ENOTFOUND;
    if (rc == 0)
        rc = sl_reg_ep_encode(&ep, pub->mk, &op.rec, err);
    if (gone)
        rc = 0;
    sl_reg_ep_fini(&ep);
    if (rc == 0) { /* nothing was written: the read-only transaction ends before publishing */
        rc = sl_reg_db_commit(pg, err);
        op.in_tx = false;
    }
    if (rc == 0)
        rc = gone ? op_publish(&op, NULL, 0, err) : op_publish(&op, op.rec.data, op.rec.len, err);
    return op_end(&op, rc);
}

int sl_reg_disable(PGconn *pg,
                   struct sl_reg_pub *pub,
                   const char *id,
                   const char *reason,
                   int64_t requested_ms,
                   bool *changed,
                   sl_err_t *err)
{
    struct disable_req d = {reason ? reason : "", requested_ms};
    struct sl_reg_result res;
    struct sl_reg_ep ep;
    int rc = sl_reg_update(pg, pub, id, disable_modify, &d, &ep, &res, err);
    sl_reg_ep_fini(&ep);
    if (changed)
        *changed = res.changed;
    return rc;
}
