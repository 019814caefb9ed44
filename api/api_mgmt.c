/*
 * api_mgmt: endpoint management over HTTP, for back ends that manage their customers'
 * endpoints. Every change runs the registry's change operations (common/sl_registry:
 * sl_reg_create / _update / _rotate / _remove), the same code as `sluicectl endpoints`: lock,
 * transaction, read back, publish to the compacted endpoints topic, flush. Reads come from
 * the registry table (the source of truth), not from the in-memory table.
 *
 * A change committed in PostgreSQL whose publish to Kafka failed is still answered with the
 * committed endpoint and "published": false (consumers do not see it until `sluicectl
 * endpoints sync`); every change answer carries "published".
 *
 * Each loop thread keeps its own registry publisher (a Kafka producer, opened lazily).
 * Signing secrets are shown once, in the answer to create and rotate-secret, and never logged.
 * Both take "signature": "hmac" (a whsec_ secret, the default) or "ed25519" (a whsk_ key pair,
 * made here; the answer adds its public key, "public_key": "whpk_...", for receivers).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/sl_log.h"
#include "common/sl_sign.h"

#define OVERLAP_DEFAULT_S 86400

static pthread_key_t pub_key;
static pthread_once_t pub_once = PTHREAD_ONCE_INIT;

static void pub_dtor(void *p)
{
    sl_reg_pub_close(p);
    free(p);
}

static void make_key(void)
{
    (void)pthread_key_create(&pub_key, pub_dtor);
}

static struct sl_reg_pub *thread_pub(struct api *a)
{
    pthread_once(&pub_once, make_key);
    struct sl_reg_pub *p = pthread_getspecific(pub_key);
    if (!p) {
        p = sl_xcalloc(1, sizeof(*p));
        sl_reg_pub_init(p, a->cfg, &a->mk);
        (void)pthread_setspecific(pub_key, p);
    }
    return p;
}

/* ==== endpoint -> JSON ==== */

static json_t *strv_json(char *const *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

/*
 * The scheme of a sealed secret of endpoint id and, for Ed25519, its public key into pk
 * (SL_PUBKEY_STR_MAX bytes, "" otherwise). Returns 1 (Ed25519), 0 (HMAC) or -1 (it does not
 * open: another master key).
 */
static int secret_scheme(
    const char *id, const uint8_t *enc, size_t enc_len, const struct sl_masterkey *mk, char *pk)
{
    uint8_t plain[SL_SECRET_ENC_MAX + 1];
    size_t plen = 0;
    struct sl_secret s;
    sl_err_t err;
    int kind = -1;
    memset(&s, 0, sizeof(s));
    pk[0] = '\0';
    if (sl_secretbox_open(mk, id, enc, enc_len, plain, sizeof(plain) - 1, &plen, &err) == 0) {
        plain[plen] = '\0';
        if (sl_secret_parse(&s, (const char *)plain, &err) == 0) {
            kind = s.kind == SL_SECRET_ED25519;
            if (kind == 1 && sl_secret_public(&s, pk, SL_PUBKEY_STR_MAX, &err) != 0)
                pk[0] = '\0';
        }
    }
    sl_secret_fini(&s);
    sl_secret_wipe(plain, sizeof(plain));
    return kind;
}

/* What an answer shows for every extra header's value: they often hold credentials
 * (Authorization, API keys), so they are write-only here, as `sluicectl endpoints show`
 * hides them without --show-secrets. A write of this text is refused (a read-modify-write
 * would otherwise store it). */
#define HDR_REDACTED "[redacted]"

/*
 * The endpoint URL as a key without admin scope sees it: each query value and the fragment
 * read HDR_REDACTED (postback URLs carry click ids, payouts and partners' tokens there, and
 * such a key may be a support tool's); scheme, host, path and the query's names stay
 * (userinfo is refused at registration). Works on templates too (no parse). Owned by the
 * caller.
 */
static char *url_for_readers(const char *url)
{
    struct sl_buf b;
    sl_buf_init(&b, SIZE_MAX);
    const char *p = url;
    size_t keep = strcspn(p, "?#");
    sl_buf_append(&b, p, keep);
    p += keep;
    if (*p == '?') {
        sl_buf_append(&b, "?", 1);
        p++;
        while (*p && *p != '#') {
            size_t plen = strcspn(p, "&#");
            const char *eq = memchr(p, '=', plen);
            if (eq)
                sl_buf_append(&b, p, (size_t)(eq - p) + 1);
            sl_buf_append_str(&b, HDR_REDACTED);
            p += plen;
            if (*p == '&') {
                sl_buf_append(&b, "&", 1);
                p++;
            }
        }
    }
    if (*p == '#')
        sl_buf_append_str(&b, "#" HDR_REDACTED);
    return (char *)b.data; /* allocated and NUL-terminated by the first append, even of 0 bytes */
}

/* ep as an answer's JSON; full: the URL as stored (admin keys), else url_for_readers. */
static json_t *ep_json(const struct sl_reg_ep *ep, const struct sl_masterkey *mk, bool full)
{
    json_t *hdr = json_object();
    for (size_t i = 0; i < ep->n_hdr; i++)
        json_object_set_new(hdr, ep->hdr[i].name, json_string(HDR_REDACTED));
    json_t *pol = json_object();
    for (int i = 0; i < SL_REG_N__COUNT; i++)
        json_object_set_new(pol, sl_reg_ep_nums[i].column, json_integer(ep->num[i]));
    json_t *sec = json_array();
    for (size_t i = 0; i < ep->n_secrets; i++) {
        if (ep->secrets[i].expired)
            continue;
        char pk[SL_PUBKEY_STR_MAX];
        int kind = secret_scheme(ep->id, ep->secrets[i].enc, ep->secrets[i].enc_len, mk, pk);
        json_t *one = json_pack("{s:i, s:o, s:o, s:o}", "seq", ep->secrets[i].seq, "created_at",
                                api_time_json(ep->secrets[i].created_ms), "expires_at",
                                api_time_json(ep->secrets[i].exp_ms), "signature",
                                kind < 0   ? json_null()
                                : kind > 0 ? json_string("ed25519")
                                           : json_string("hmac"));
        if (pk[0])
            json_object_set_new(one, "public_key", json_string(pk));
        json_array_append_new(sec, one);
    }
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(ep->id));
    json_object_set_new(j, "name", json_string(ep->name ? ep->name : ""));
    if (full) {
        json_object_set_new(j, "url", json_string(ep->url));
    } else {
        char *u = url_for_readers(ep->url);
        json_object_set_new(j, "url", json_string(u));
        free(u);
    }
    json_object_set_new(j, "template", json_boolean(ep->tpl));
    json_object_set_new(j, "method", json_string(sl_http_method_name(ep->method)));
    json_object_set_new(j, "content_type", ep->ct && ep->ct[0] ? json_string(ep->ct) : json_null());
    json_object_set_new(j, "headers", hdr);
    json_object_set_new(j, "types", strv_json(ep->types, ep->n_types));
    json_object_set_new(j, "channels", strv_json(ep->channels, ep->n_channels));
    json_object_set_new(j, "enabled", json_boolean(ep->enabled));
    json_object_set_new(j, "disabled_reason",
                        ep->reason && ep->reason[0] ? json_string(ep->reason) : json_null());
    json_object_set_new(j, "policy", pol);
    json_object_set_new(j, "secrets", sec);
    json_object_set_new(j, "created_at", api_time_json(ep->created_ms));
    json_object_set_new(j, "updated_at", api_time_json(ep->updated_ms));
    return j;
}

/* ==== JSON -> endpoint fields ==== */

/*
 * The "signature" member of a create / rotate body (v borrowed; NULL = absent = HMAC) into
 * *kind. Returns 0, or -1 after answering 400.
 */
static int get_signature(struct api_req *r, json_t *v, enum sl_secret_kind *kind)
{
    *kind = SL_SECRET_HMAC;
    if (!v)
        return 0;
    const char *sv = json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)
                         ? json_string_value(v)
                         : "";
    if (strcmp(sv, "hmac") == 0)
        return 0;
    if (strcmp(sv, "ed25519") == 0) {
        *kind = SL_SECRET_ED25519;
        return 0;
    }
    api_problem(r, 400, "invalid-field", "/signature",
                "field \"signature\" must be \"hmac\" or \"ed25519\"");
    return -1;
}

/*
 * A new signing secret of kind into s (wiped by the caller) and, for Ed25519, its public key
 * into pk ("" for HMAC). Returns 0 or SL_ECRYPTO (err set).
 */
static int make_secret(enum sl_secret_kind kind, struct sl_secret *s, char *pk, sl_err_t *err)
{
    pk[0] = '\0';
    if (kind != SL_SECRET_ED25519)
        return sl_secret_generate(s, err);
    int rc = sl_secret_generate_ed25519(s, err);
    if (rc == 0)
        rc = sl_secret_public(s, pk, SL_PUBKEY_STR_MAX, err);
    return rc;
}

/* A string array field into a NULL-free vector (borrowed from j); 0 or a problem set. */
static int
get_strv(struct api_req *r, json_t *v, const char *name, size_t max, const char **out, size_t *n)
{
    char field[64];
    (void)snprintf(field, sizeof(field), "/%s", name);
    *n = 0;
    if (!json_is_array(v) || json_array_size(v) > max) {
        api_problem(r, 400, "invalid-field", field,
                    "field \"%s\" must be an array of at most %zu strings", name, max);
        return -1;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s) || strlen(json_string_value(s)) != json_string_length(s)) {
            api_problem(r, 400, "invalid-field", field, "field \"%s\": entry %zu must be a string",
                        name, i);
            return -1;
        }
        out[(*n)++] = json_string_value(s);
    }
    return 0;
}

static void set_str(char **dst, const char *v)
{
    free(*dst);
    *dst = sl_xstrdup(v);
}

/* One field of an endpoint body. A handler returns 0 (applied), -1 (answered with a problem)
 * or FIELD_BAD_TYPE (the caller answers "wrong JSON type" naming the field). */
#define FIELD_BAD_TYPE 1
typedef int (*field_fn)(
    struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field);

static bool is_plain_string(const json_t *v)
{
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

static int
field_id(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)r, (void)k, (void)ep, (void)field;
    return json_is_string(v) ? 0 : FIELD_BAD_TYPE; /* read by the caller */
}

static int field_signature(
    struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)k, (void)ep, (void)field;
    enum sl_secret_kind kind;
    /* read by the caller (a scheme changes only by rotation) */
    return get_signature(r, v, &kind) != 0 ? -1 : 0;
}

static int
field_string(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)r, (void)field;
    if (json_is_null(v) && strcmp(k, "content_type") == 0) {
        set_str(&ep->ct, "");
        return 0;
    }
    if (!is_plain_string(v))
        return FIELD_BAD_TYPE;
    set_str(k[0] == 'u' ? &ep->url : k[0] == 'n' ? &ep->name : &ep->ct, json_string_value(v));
    return 0;
}

static int
field_template(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)r, (void)k, (void)field;
    if (!json_is_boolean(v))
        return FIELD_BAD_TYPE;
    ep->tpl = json_is_true(v);
    return 0;
}

static int
field_method(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)k;
    enum sl_http_method m;
    if (!json_is_string(v) ||
        sl_http_method_parse(json_string_value(v), json_string_length(v), &m) != 0) {
        api_problem(r, 400, "invalid-field", field,
                    "field \"method\" must be POST, PUT, PATCH or GET");
        return -1;
    }
    ep->method = m;
    return 0;
}

static int
field_headers(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)k;
    if (!json_is_object(v) || json_object_size(v) > SL_HDR_MAX) {
        api_problem(r, 400, "invalid-field", field,
                    "field \"headers\" must be an object of at most %d strings", SL_HDR_MAX);
        return -1;
    }
    struct sl_kv kv[SL_HDR_MAX];
    size_t n = 0;
    const char *hk;
    json_t *hv;
    json_object_foreach(v, hk, hv)
    {
        if (!is_plain_string(hv)) {
            api_problem(r, 400, "invalid-field", field,
                        "field \"headers\": every value must be a string");
            return -1;
        }
        if (strcmp(json_string_value(hv), HDR_REDACTED) == 0) {
            api_problem(r, 400, "invalid-field", field,
                        "field \"headers\": header %s has the placeholder answers show instead "
                        "of a value (" HDR_REDACTED "); send the real value",
                        hk);
            return -1;
        }
        kv[n].name = hk;
        kv[n++].value = json_string_value(hv);
    }
    sl_reg_ep_set_headers(ep, kv, n);
    return 0;
}

static int
field_names(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)field;
    const char *sv[SL_EP_TYPES_MAX > SL_EP_CHANNELS_MAX ? SL_EP_TYPES_MAX : SL_EP_CHANNELS_MAX];
    size_t n = 0;
    bool types = k[0] == 't';
    if (get_strv(r, v, k, types ? SL_EP_TYPES_MAX : SL_EP_CHANNELS_MAX, sv, &n) != 0)
        return -1;
    if (types)
        sl_reg_ep_set_types(ep, sv, n);
    else
        sl_reg_ep_set_channels(ep, sv, n);
    return 0;
}

static int
field_policy(struct api_req *r, const char *k, json_t *v, struct sl_reg_ep *ep, const char *field)
{
    (void)k;
    if (!json_is_object(v)) {
        api_problem(r, 400, "invalid-field", field, "field \"policy\" must be an object");
        return -1;
    }
    const char *pk;
    json_t *pv;
    char sub[80];
    json_object_foreach(v, pk, pv)
    {
        int i = 0;
        while (i < SL_REG_N__COUNT && strcmp(sl_reg_ep_nums[i].column, pk) != 0)
            i++;
        (void)snprintf(sub, sizeof(sub), "/policy/%.60s", pk);
        if (i == SL_REG_N__COUNT) {
            api_problem(r, 400, "invalid-field", sub, "unknown policy field");
            return -1;
        }
        json_int_t x = json_is_integer(pv) ? json_integer_value(pv) : -1;
        if (x < 0 || (x != 0 && (x < sl_reg_ep_nums[i].min || x > sl_reg_ep_nums[i].max))) {
            api_problem(r, 400, "invalid-field", sub,
                        "policy field \"%s\" must be 0 (global default) or an integer "
                        "%" PRId64 "..%" PRId64,
                        pk, sl_reg_ep_nums[i].min, sl_reg_ep_nums[i].max);
            return -1;
        }
        ep->num[i] = x;
    }
    return 0;
}

static const struct {
    const char *name;
    field_fn fn;
    bool create_only; /* accepted only where allow_id (creation) */
} ep_fields[] = {
    {"id", field_id, true},
    {"signature", field_signature, true},
    {"url", field_string, false},
    {"name", field_string, false},
    {"content_type", field_string, false},
    {"template", field_template, false},
    {"method", field_method, false},
    {"headers", field_headers, false},
    {"types", field_names, false},
    {"channels", field_names, false},
    {"policy", field_policy, false},
};

/*
 * Apply the fields of body j to ep, each by its ep_fields handler. allow_id: "id" and
 * "signature" accepted (create; both read by the caller). Returns 0, or -1 with the problem
 * answered. Rule checks beyond JSON types are sl_reg_ep_check's (in the change operation),
 * reported by problem_for().
 */
static int apply_fields(struct api_req *r, json_t *j, struct sl_reg_ep *ep, bool allow_id)
{
    const char *k;
    json_t *v;
    char field[80];
    json_object_foreach(j, k, v)
    {
        (void)snprintf(field, sizeof(field), "/%.70s", k);
        size_t i = 0;
        while (i < sizeof(ep_fields) / sizeof(ep_fields[0]) &&
               (strcmp(ep_fields[i].name, k) != 0 || (ep_fields[i].create_only && !allow_id)))
            i++;
        if (i == sizeof(ep_fields) / sizeof(ep_fields[0])) {
            api_problem(r, 400, "invalid-field", field, "unknown field \"%.60s\"", k);
            return -1;
        }
        int rc = ep_fields[i].fn(r, k, v, ep, field);
        if (rc == FIELD_BAD_TYPE)
            api_problem(r, 400, "invalid-field", field, "field has the wrong JSON type");
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* May the caller's key see this registry row? (a key limited to channels: one in common) */
/* Whether the caller sees endpoint URLs whole (admin scope), not as url_for_readers. */
static bool full_url(const struct api_req *r)
{
    return sl_apikey_allows(r->auth.key, SL_SCOPE_ADMIN);
}

static bool sees_row(struct api_req *r, const struct sl_reg_ep *ep)
{
    return sl_apikey_sees_channels(r->auth.key, ep->channels, ep->n_channels);
}

/* Whether the registry's message names a policy field first (field "timeout_ms" ...): those
 * live under /policy in the API's bodies. */
static bool names_policy(const char *msg)
{
    for (int i = 0; i < SL_REG_N__COUNT; i++) {
        char pat[80];
        int n = snprintf(pat, sizeof(pat), "field \"%s\"", sl_reg_ep_nums[i].column);
        if (n > 0 && strncmp(msg, pat, (size_t)n) == 0)
            return true;
    }
    return false;
}

/* Answer for a failed change operation. */
static enum api_hret problem_for(struct api_req *r, int rc, const sl_err_t *err, const char *id)
{
    switch (rc) {
    case SL_ENOTFOUND:
        return api_problem(r, 404, "unknown-endpoint", NULL, "endpoint %s does not exist", id);
    case SL_ESTATE:
        return api_problem(r, 409, "endpoint-exists", "/id", "endpoint %s already exists", id);
    case SL_EINVAL:
    case SL_ETOOBIG:
    case SL_EMISSING: {
        json_t *p = api_problem_from_err(err, names_policy(err->msg) ? "/policy" : "");
        api_reply(r, 400, p);
        r->problem = true;
        return API_DONE;
    }
    default:
        if (rc == SL_EPG)
            api_pg_reset(); /* the statement may have broken this thread's connection */
        sl_warn("mgmt", "registry_failed", "endpoint change failed: %s", err->msg);
        r->retry_after_s = 2;
        /* the reason (PostgreSQL's or Kafka's own text) is logged above, not answered */
        return api_problem(r, 503, "registry-unavailable", NULL,
                           "the endpoint registry could not be %s; retry later",
                           strcmp(r->method, "GET") == 0 ? "read" : "changed");
    }
}

static bool id_ok(struct api_req *r, const char *id)
{
    if (sl_valid_endpoint_id(id, strlen(id)))
        return true;
    api_problem(r, 404, "unknown-endpoint", NULL, "no endpoint has that id");
    return false;
}

/* The registry connection, or NULL after answering 503. */
static PGconn *reg_pg(struct api_req *r)
{
    sl_err_t err;
    PGconn *pg = api_pg(r->api, &err);
    if (!pg) {
        r->retry_after_s = 2;
        api_problem(r, 503, "registry-unavailable", NULL,
                    "the endpoint registry (PostgreSQL) is unreachable");
    }
    return pg;
}

/*
 * For rotate and delete: endpoint id exists and the caller may change it. A key limited to
 * channels may only when every channel of the endpoint is its own, as for PATCH (seeing it
 * through one shared channel is not enough: rotating another tenant's secret would hand the
 * caller its signing secret). With kind not NULL, *kind is the current secret's scheme,
 * which a rotation without "signature" keeps. false after answering 404, 403 or 503.
 */
static bool may_change(struct api_req *r, PGconn *pg, const char *id, enum sl_secret_kind *kind)
{
    struct sl_reg_ep ep;
    memset(&ep, 0, sizeof(ep));
    sl_err_t err;
    int rc = sl_reg_db_load(pg, id, false, &ep, &err);
    if (rc == 0 && !sees_row(r, &ep))
        rc = SL_ENOTFOUND;
    bool ok = rc == 0;
    if (!ok) {
        problem_for(r, rc, &err, id);
    } else if (!api_key_may_assign(r, ep.channels, ep.n_channels)) {
        api_problem(r, 403, "forbidden", NULL,
                    "a key limited to channels changes only endpoints whose channels are all "
                    "its own");
        ok = false;
    } else if (kind && ep.n_secrets > 0) {
        char pk[SL_PUBKEY_STR_MAX];
        int scheme = secret_scheme(id, ep.secrets[0].enc, ep.secrets[0].enc_len, &r->api->mk, pk);
        if (scheme < 0) { /* never guess: an Ed25519 endpoint's receivers hold a public key */
            r->retry_after_s = 2;
            api_problem(r, 503, "registry-unavailable", NULL,
                        "the current secret of endpoint %s cannot be opened with this "
                        "instance's master key, so its scheme is unknown; give \"signature\" "
                        "to choose the new secret's",
                        id);
            ok = false;
        } else {
            *kind = scheme == 1 ? SL_SECRET_ED25519 : SL_SECRET_HMAC;
        }
    }
    sl_reg_ep_fini(&ep);
    return ok;
}

/* A committed change: status with the endpoint (plus extra members from x, stolen). */
static enum api_hret changed(struct api_req *r,
                             int status,
                             const struct sl_reg_ep *ep,
                             const struct sl_reg_result *res,
                             json_t *x)
{
    json_t *j = ep ? ep_json(ep, &r->api->mk, true) : json_object(); /* admin's answer */
    json_object_set_new(j, "published", json_boolean(res->published));
    if (x) {
        json_object_update(j, x);
        json_decref(x);
    }
    if (!res->published)
        sl_warn("mgmt", "endpoint_not_published",
                "endpoint change committed but not published; run 'sluicectl endpoints sync'");
    return api_reply(r, status, j);
}

/* ==== handlers ==== */

enum api_hret api_endpoints_list(struct api_req *r)
{
    long limit;
    char cur[SL_ENDPOINT_ID_MAX + 2];
    bool have;
    if (api_query_page(r, &limit, cur, sizeof(cur), &have) != 0)
        return API_DONE;
    PGconn *pg = reg_pg(r);
    if (!pg)
        return API_DONE;
    struct sl_reg_ep *eps = NULL;
    size_t n = 0;
    sl_err_t err;
    int rc = sl_reg_db_page(pg, have ? cur : NULL, (size_t)limit + 1, &eps, &n, &err);
    if (rc != 0)
        return problem_for(r, rc, &err, "");
    json_t *data = json_array();
    json_t *next = json_null();
    for (size_t i = 0; i < n && i < (size_t)limit; i++) {
        if (i + 1 == (size_t)limit && n > (size_t)limit) {
            json_decref(next);
            next = api_cursor_json(r, eps[i].id);
        }
        if (sees_row(r, &eps[i]))
            json_array_append_new(data, ep_json(&eps[i], &r->api->mk, full_url(r)));
    }
    for (size_t i = 0; i < n; i++)
        sl_reg_ep_fini(&eps[i]);
    free(eps);
    return api_reply(r, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

enum api_hret api_endpoints_get(struct api_req *r)
{
    const char *id = r->params[0];
    if (!id_ok(r, id))
        return API_DONE;
    PGconn *pg = reg_pg(r);
    if (!pg)
        return API_DONE;
    struct sl_reg_ep ep;
    memset(&ep, 0, sizeof(ep));
    sl_err_t err;
    int rc = sl_reg_db_load(pg, id, false, &ep, &err);
    if (rc == 0 && !sees_row(r, &ep))
        rc = SL_ENOTFOUND; /* another tenant's endpoint does not exist for this key */
    if (rc == 0)
        api_reply(r, 200, ep_json(&ep, &r->api->mk, full_url(r)));
    else
        problem_for(r, rc, &err, id);
    sl_reg_ep_fini(&ep);
    return API_DONE;
}

enum api_hret api_endpoints_create(struct api_req *r)
{
    json_t *j = api_body_json(r);
    if (!j)
        return API_DONE;
    json_t *idv = json_object_get(j, "id");
    json_t *urlv = json_object_get(j, "url");
    if (!json_is_string(idv) ||
        !sl_valid_endpoint_id(json_string_value(idv), json_string_length(idv))) {
        json_decref(j);
        return api_problem(r, 400, idv ? "invalid-field" : "missing-field", "/id",
                           idv ? "field \"id\" must be 1..64 characters of A-Z a-z 0-9 _ -"
                               : "field \"id\" is required: 1..64 characters of A-Z a-z 0-9 _ -");
    }
    if (!urlv) {
        json_decref(j);
        return api_problem(r, 400, "missing-field", "/url", "field \"url\" is required");
    }
    struct sl_reg_ep ep;
    sl_reg_ep_init(&ep, json_string_value(idv));
    char whsec[SL_SECRET_STR_MAX] = "";
    char pk[SL_PUBKEY_STR_MAX] = "";
    struct sl_secret secret;
    enum sl_secret_kind kind = SL_SECRET_HMAC;
    memset(&secret, 0, sizeof(secret));
    if (apply_fields(r, j, &ep, true) == 0 && !api_key_may_assign(r, ep.channels, ep.n_channels))
        api_problem(r, 403, "forbidden", "/channels",
                    "a key limited to channels creates only endpoints of its channels");
    else if (!r->status && get_signature(r, json_object_get(j, "signature"), &kind) == 0) {
        PGconn *pg = reg_pg(r);
        if (pg) {
            struct sl_reg_result res = {0};
            sl_err_t err;
            int rc = make_secret(kind, &secret, pk, &err);
            if (rc == 0)
                rc = sl_reg_create(pg, thread_pub(r->api), &r->api->mk, &ep, &secret, whsec, &res,
                                   &err);
            if (rc == 0 || (rc == SL_EKAFKA && res.committed)) {
                /* the id is [A-Za-z0-9_-]{1,64}: a path segment as it stands */
                (void)snprintf(r->location, sizeof(r->location), "/v1/endpoints/%s", ep.id);
                changed(r, 201, &ep, &res,
                        pk[0] ? json_pack("{s:s, s:s}", "secret", whsec, "public_key", pk)
                              : json_pack("{s:s}", "secret", whsec));
            } else {
                problem_for(r, rc, &err, ep.id);
            }
        }
    }
    sl_secret_wipe(whsec, sizeof(whsec));
    sl_secret_fini(&secret);
    sl_reg_ep_fini(&ep);
    json_decref(j);
    return API_DONE;
}

/* The modify callbacks of PATCH, enable and disable. */
struct patch {
    struct api_req *r;
    json_t *body; /* PATCH fields, or NULL */
    int enable;   /* 1 enable, 0 disable, -1 leave */
    const char *reason;
    bool answered; /* apply_fields answered a problem */
};

static int modify(void *opaque, struct sl_reg_ep *ep, sl_err_t *err)
{
    struct patch *p = opaque;
    if (!sees_row(p->r, ep))
        return sl_err_set(err, SL_ENOTFOUND, "no such endpoint");
    /* the row as it is must be the key's to change (an endpoint shared with another tenant's
     * channel is not, whatever the body would make of its channels), and so must the result */
    if (!api_key_may_assign(p->r, ep->channels, ep->n_channels)) {
        api_problem(p->r, 403, "forbidden", "/channels",
                    "a key limited to channels changes only endpoints whose channels are all its "
                    "own");
        p->answered = true;
        return sl_err_set(err, SL_EDENIED, "refused");
    }
    if (p->body && apply_fields(p->r, p->body, ep, false) != 0) {
        p->answered = true;
        return sl_err_set(err, SL_EINVAL, "refused");
    }
    if (!api_key_may_assign(p->r, ep->channels, ep->n_channels)) {
        api_problem(p->r, 403, "forbidden", "/channels",
                    "a key limited to channels keeps endpoints within its channels");
        p->answered = true;
        return sl_err_set(err, SL_EDENIED, "refused");
    }
    if (p->enable == 1) {
        ep->enabled = true;
        set_str(&ep->reason, "");
    } else if (p->enable == 0) {
        ep->enabled = false;
        set_str(&ep->reason, p->reason ? p->reason : "disabled through the API");
    }
    return 0;
}

static enum api_hret run_update(struct api_req *r, struct patch *p)
{
    const char *id = r->params[0];
    if (!id_ok(r, id))
        return API_DONE;
    PGconn *pg = reg_pg(r);
    if (!pg)
        return API_DONE;
    struct sl_reg_ep out;
    memset(&out, 0, sizeof(out));
    struct sl_reg_result res = {0};
    sl_err_t err;
    p->r = r;
    int rc = sl_reg_update(pg, thread_pub(r->api), id, modify, p, &out, &res, &err);
    if (rc == 0 && !p->answered && !res.changed) {
        /* nothing to change: the endpoint's committed state is published again, so that
         * repeating a change whose publish failed ("published": false) repairs it */
        sl_err_t perr;
        res.published = sl_reg_republish(pg, thread_pub(r->api), id, &perr) == 0;
        if (!res.published)
            sl_warn("mgmt", "endpoint_republish_failed", "%s", perr.msg);
    }
    if (p->answered)
        ; /* the problem is set */
    else if (rc == 0 || (rc == SL_EKAFKA && res.committed))
        changed(r, 200, &out, &res, json_pack("{s:b}", "changed", res.changed));
    else {
        problem_for(r, rc, &err, id);
    }
    sl_reg_ep_fini(&out);
    return API_DONE;
}

enum api_hret api_endpoints_patch(struct api_req *r)
{
    json_t *j = api_body_json(r);
    if (!j)
        return API_DONE;
    if (json_object_size(j) == 0) {
        json_decref(j);
        return api_problem(r, 400, "missing-field", "/", "nothing to change: the body is empty");
    }
    struct patch p = {.body = j, .enable = -1};
    run_update(r, &p);
    json_decref(j);
    return API_DONE;
}

/*
 * A small action body: the first member of j not among allowed (NULL-terminated) is answered
 * 400 naming it ("/<member>"); returns true when there is none.
 */
static bool only_members(struct api_req *r, json_t *j, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(k, *a) == 0;
        if (!ok) {
            char field[SL_ERR_MSG_MAX / 2];
            (void)snprintf(field, sizeof(field), "/%s", k);
            api_problem(r, 400, "invalid-field", field, "unknown field \"%.60s\"", k);
            return false;
        }
    }
    return true;
}

enum api_hret api_endpoints_enable(struct api_req *r)
{
    struct patch p = {.enable = 1};
    if (r->body.len > 0) { /* no body, or {} */
        json_t *j = api_body_json(r);
        if (!j)
            return API_DONE;
        static const char *const none[] = {NULL};
        bool ok = only_members(r, j, none);
        json_decref(j);
        if (!ok)
            return API_DONE;
    }
    return run_update(r, &p);
}

enum api_hret api_endpoints_disable(struct api_req *r)
{
    struct patch p = {.enable = 0};
    json_t *j = NULL;
    if (r->body.len > 0) {
        j = api_body_json(r);
        if (!j)
            return API_DONE;
        static const char *const allowed[] = {"reason", NULL};
        if (!only_members(r, j, allowed)) {
            json_decref(j);
            return API_DONE;
        }
        json_t *reason = json_object_get(j, "reason");
        if (reason && (!json_is_string(reason) || json_string_length(reason) > SL_REASON_MAX)) {
            json_decref(j);
            return api_problem(r, 400, "invalid-field", "/reason",
                               "the body may hold only \"reason\", a string of at most %d bytes",
                               SL_REASON_MAX);
        }
        p.reason = reason ? json_string_value(reason) : NULL;
    }
    run_update(r, &p);
    json_decref(j);
    return API_DONE;
}

/* The rotate body (optional): "overlap_s" (0..SL_REG_OVERLAP_MAX_S) and "signature". Returns
 * 0, or -1 with the problem answered. *sig_given: a scheme was named. */
static int
rotate_body(struct api_req *r, int64_t *overlap, enum sl_secret_kind *kind, bool *sig_given)
{
    if (r->body.len == 0)
        return 0;
    json_t *j = api_body_json(r);
    if (!j)
        return -1;
    static const char *const allowed[] = {"overlap_s", "signature", NULL};
    if (!only_members(r, j, allowed)) {
        json_decref(j);
        return -1;
    }
    json_t *o = json_object_get(j, "overlap_s");
    json_t *sig = json_object_get(j, "signature");
    *sig_given = sig != NULL;
    int rc = 0;
    if (o && (!json_is_integer(o) || json_integer_value(o) < 0 ||
              json_integer_value(o) > SL_REG_OVERLAP_MAX_S)) {
        api_problem(r, 400, "invalid-field", "/overlap_s",
                    "the body may hold only \"overlap_s\", an integer 0..%lld, and "
                    "\"signature\"",
                    (long long)SL_REG_OVERLAP_MAX_S);
        rc = -1;
    } else if (get_signature(r, sig, kind) != 0) {
        rc = -1;
    } else if (o) {
        *overlap = json_integer_value(o);
    }
    json_decref(j);
    return rc;
}

/* 200 for a rotation: the new secret (and public key), its seq, when the previous one
 * expires (the newest expiring secret), and whether the record reached the topic. */
static void rotate_answer(struct api_req *r,
                          const struct sl_reg_ep *out,
                          const char *whsec,
                          const char *pk,
                          bool published)
{
    int prev_seq = 0;
    int64_t prev_exp = 0;
    for (size_t i = 0; i < out->n_secrets; i++) {
        if (out->secrets[i].exp_ms != 0 && out->secrets[i].seq > prev_seq) {
            prev_seq = out->secrets[i].seq;
            prev_exp = out->secrets[i].exp_ms;
        }
    }
    json_t *x = json_pack("{s:s, s:s, s:i, s:o, s:b}", "id", out->id, "secret", whsec, "seq",
                          out->n_secrets ? out->secrets[0].seq : 0, "previous_expires_at",
                          api_time_json(prev_exp), "published", published);
    if (pk[0])
        json_object_set_new(x, "public_key", json_string(pk));
    api_reply(r, 200, x);
}

enum api_hret api_endpoints_rotate(struct api_req *r)
{
    const char *id = r->params[0];
    if (!id_ok(r, id))
        return API_DONE;
    int64_t overlap = OVERLAP_DEFAULT_S;
    enum sl_secret_kind kind = SL_SECRET_HMAC;
    bool sig_given = false;
    if (rotate_body(r, &overlap, &kind, &sig_given) != 0)
        return API_DONE;
    PGconn *pg = reg_pg(r);
    if (!pg || !may_change(r, pg, id, sig_given ? NULL : &kind))
        return API_DONE;
    struct sl_reg_ep out;
    memset(&out, 0, sizeof(out));
    struct sl_reg_result res = {0};
    char whsec[SL_SECRET_STR_MAX] = "";
    char pk[SL_PUBKEY_STR_MAX] = "";
    struct sl_secret secret;
    sl_err_t err;
    int rc = make_secret(kind, &secret, pk, &err);
    if (rc == 0)
        rc = sl_reg_rotate(pg, thread_pub(r->api), &r->api->mk, id, overlap, &secret, whsec, &out,
                           &res, &err);
    if (rc == 0 || (rc == SL_EKAFKA && res.committed))
        rotate_answer(r, &out, whsec, pk, res.published);
    else if (rc == SL_ETOOBIG) { /* too many unexpired secrets: the overlap is what to change */
        api_reply(r, 400, api_problem_json(400, "too-large", "/overlap_s", "%s", err.msg));
        r->problem = true;
    } else
        problem_for(r, rc, &err, id);
    sl_secret_wipe(whsec, sizeof(whsec));
    sl_secret_fini(&secret);
    sl_reg_ep_fini(&out);
    return API_DONE;
}

enum api_hret api_endpoints_delete(struct api_req *r)
{
    const char *id = r->params[0];
    if (!id_ok(r, id))
        return API_DONE;
    PGconn *pg = reg_pg(r);
    if (!pg || !may_change(r, pg, id, NULL))
        return API_DONE;
    struct sl_reg_result res = {0};
    sl_err_t err;
    int rc = sl_reg_remove(pg, thread_pub(r->api), id, &res, &err);
    if (rc == 0)
        return api_reply(r, 204, NULL);
    if (rc == SL_EKAFKA && res.committed)
        return changed(r, 200, NULL, &res, json_pack("{s:s, s:b}", "id", id, "deleted", 1));
    return problem_for(r, rc, &err, id);
}
