/*
 * sl_apikey: API keys (see sl_apikey.h).
 *
 * The secret part is base64url without padding; rather than a second codec we map it onto
 * sl_b64's strict standard alphabet ('-' -> '+', '_' -> '/', one '=' appended), so canonical
 * encoding (zero trailing bits) is enforced by the same code as everywhere else.
 *
 * Arrays travel to PostgreSQL as text array literals with every element double-quoted (a bare
 * NULL would otherwise be the null element); the characters allowed in scopes and channels
 * need no escaping. They come back joined with ',' (array_to_string), which no element may
 * contain.
 */
#include "common/sl_apikey.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "common/sl_b64.h"
#include "common/sl_digest.h"
#include "common/sl_hex.h"
#include "common/sl_mem.h"
#include "common/sl_pg.h"

static const char id_alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";

static const struct {
    unsigned bit;
    const char *name;
} scope_names[] = {
    {SL_SCOPE_PUBLISH, "publish"},
    {SL_SCOPE_READ, "read"},
    {SL_SCOPE_ADMIN, "admin"},
};
#define N_SCOPES (sizeof(scope_names) / sizeof(scope_names[0]))

/* ==== Keys ==== */

void sl_apikey_fini(struct sl_apikey *k)
{
    if (!k)
        return;
    free(k->name);
    for (size_t i = 0; i < k->n_channels; i++)
        free(k->channels[i]);
    free(k->channels);
    memset(k, 0, sizeof(*k));
}

static int sha256(const uint8_t *in, size_t n, uint8_t out[32])
{
    const void *parts[] = {in};
    return sl_digest_parts(SL_SHA256, parts, &n, 1, out) == 0 ? 0 : SL_ECRYPTO;
}

/* A random id: RAND_bytes with rejection sampling, so every character is uniform over 36. */
static int random_id(char id[SL_APIKEY_ID_LEN + 1])
{
    size_t have = 0;
    while (have < SL_APIKEY_ID_LEN) {
        uint8_t b[32];
        if (RAND_bytes(b, (int)sizeof(b)) != 1)
            return SL_ECRYPTO;
        for (size_t i = 0; i < sizeof(b) && have < SL_APIKEY_ID_LEN; i++) {
            if (b[i] < 252) /* 252 = 7 * 36 */
                id[have++] = id_alphabet[b[i] % 36];
        }
    }
    id[SL_APIKEY_ID_LEN] = '\0';
    return 0;
}

int sl_apikey_generate(char token[SL_APIKEY_TOKEN_MAX],
                       char id[SL_APIKEY_ID_LEN + 1],
                       uint8_t hash[32],
                       sl_err_t *err)
{
    uint8_t secret[SL_APIKEY_SECRET_BYTES];
    char b64[SL_B64_ENCODED_LEN(SL_APIKEY_SECRET_BYTES) + 1];
    int rc = 0;
    if (random_id(id) != 0 || RAND_bytes(secret, (int)sizeof(secret)) != 1 ||
        sha256(secret, sizeof(secret), hash) != 0 ||
        sl_b64_encode(secret, sizeof(secret), b64, sizeof(b64)) != SL_APIKEY_SECRET_CHARS + 1) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not generate an api key: no random bytes");
        memset(token, 0, SL_APIKEY_TOKEN_MAX);
        memset(id, 0, SL_APIKEY_ID_LEN + 1);
        memset(hash, 0, 32);
        goto out;
    }
    for (size_t i = 0; i < SL_APIKEY_SECRET_CHARS; i++) {
        if (b64[i] == '+')
            b64[i] = '-';
        else if (b64[i] == '/')
            b64[i] = '_';
    }
    b64[SL_APIKEY_SECRET_CHARS] = '\0'; /* drop the '=' */
    (void)snprintf(token, SL_APIKEY_TOKEN_MAX, "%s%s_%s", SL_APIKEY_PREFIX, id, b64);
out:
    sl_secret_wipe(secret, sizeof(secret));
    sl_secret_wipe(b64, sizeof(b64));
    return rc;
}

bool sl_apikey_id_valid(const char *s, size_t len)
{
    if (!s || len != SL_APIKEY_ID_LEN)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
            return false;
    }
    return true;
}

int sl_apikey_parse(
    const char *tok, size_t len, char id[SL_APIKEY_ID_LEN + 1], uint8_t hash[32], sl_err_t *err)
{
    char b64[SL_APIKEY_SECRET_CHARS + 2];
    uint8_t secret[SL_APIKEY_SECRET_BYTES + 3];
    size_t slen = 0;
    int rc = SL_EINVAL;
    const char *why = NULL;
    memset(id, 0, SL_APIKEY_ID_LEN + 1);
    memset(hash, 0, 32);
    /* the message never carries the input, only what is wrong with it */
    if (!tok || len == 0) {
        why = "empty";
    } else if (len != SL_APIKEY_TOKEN_LEN) {
        why = "wrong length";
    } else if (memcmp(tok, SL_APIKEY_PREFIX, SL_APIKEY_PREFIX_LEN) != 0) {
        why = "no slk_ prefix";
    } else if (!sl_apikey_id_valid(tok + SL_APIKEY_PREFIX_LEN, SL_APIKEY_ID_LEN) ||
               tok[SL_APIKEY_PREFIX_LEN + SL_APIKEY_ID_LEN] != '_') {
        why = "malformed key id";
    }
    if (why)
        goto out;
    const char *s = tok + SL_APIKEY_PREFIX_LEN + SL_APIKEY_ID_LEN + 1;
    for (size_t i = 0; i < SL_APIKEY_SECRET_CHARS; i++) {
        char c = s[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
            b64[i] = c;
        else if (c == '-')
            b64[i] = '+';
        else if (c == '_')
            b64[i] = '/';
        else {
            why = "malformed secret part";
            goto out;
        }
    }
    b64[SL_APIKEY_SECRET_CHARS] = '=';
    b64[SL_APIKEY_SECRET_CHARS + 1] = '\0';
    if (sl_b64_decode(b64, SL_APIKEY_SECRET_CHARS + 1, secret, sizeof(secret), &slen) != 0 ||
        slen != SL_APIKEY_SECRET_BYTES) {
        why = "malformed secret part";
        goto out;
    }
    if (sha256(secret, SL_APIKEY_SECRET_BYTES, hash) != 0) {
        rc = sl_err_set(err, SL_ECRYPTO, "could not hash the api key");
        memset(hash, 0, 32);
        goto out_wipe;
    }
    memcpy(id, tok + SL_APIKEY_PREFIX_LEN, SL_APIKEY_ID_LEN);
    id[SL_APIKEY_ID_LEN] = '\0';
    rc = 0;
    goto out_wipe;
out:
    rc = sl_err_set(err, SL_EINVAL, "invalid api key: %s", why);
out_wipe:
    sl_secret_wipe(b64, sizeof(b64));
    sl_secret_wipe(secret, sizeof(secret));
    return rc;
}

bool sl_apikey_hash_equal(const uint8_t a[32], const uint8_t b[32])
{
    return CRYPTO_memcmp(a, b, 32) == 0;
}

/* ==== Scopes and channels ==== */

int sl_apikey_scopes_parse(const char *list, unsigned *out, sl_err_t *err)
{
    unsigned bits = 0;
    *out = 0;
    if (!list || !*list)
        return sl_err_set(err, SL_EINVAL, "scope list is empty: expected publish, read or admin");
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (size_t i = 0; i < N_SCOPES; i++) {
            if (n == strlen(scope_names[i].name) && memcmp(p, scope_names[i].name, n) == 0) {
                bits |= scope_names[i].bit;
                found = true;
            }
        }
        if (n == 0)
            return sl_err_set(err, SL_EINVAL, "scope list has an empty item");
        if (!found)
            return sl_err_set(err, SL_EINVAL,
                              "unknown scope \"%.*s\": expected publish, read or admin",
                              (int)(n > 32 ? 32 : n), p);
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
    *out = bits;
    return 0;
}

void sl_apikey_scopes_format(unsigned scopes, char *buf, size_t cap)
{
    size_t len = 0;
    if (cap == 0)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < N_SCOPES; i++) {
        if (!(scopes & scope_names[i].bit))
            continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? "," : "", scope_names[i].name);
        if (w < 0 || (size_t)w >= cap - len)
            return; /* truncated, NUL-terminated by snprintf */
        len += (size_t)w;
    }
}

bool sl_apikey_allows(const struct sl_apikey *k, unsigned need)
{
    if (!k || k->revoked_ms != 0)
        return false;
    if (k->scopes & SL_SCOPE_ADMIN)
        return true;
    return (k->scopes & need) == need;
}

bool sl_apikey_sees_channels(const struct sl_apikey *k, char *const *channels, size_t n)
{
    if (!k || k->n_channels == 0)
        return true;
    for (size_t i = 0; i < n; i++) {
        if (sl_apikey_channel_allowed(k, channels[i]))
            return true;
    }
    return false;
}

bool sl_apikey_channel_allowed(const struct sl_apikey *k, const char *ch)
{
    if (!k)
        return false;
    if (k->n_channels == 0)
        return true;
    if (!ch)
        return false;
    for (size_t i = 0; i < k->n_channels; i++) {
        if (k->channels[i] && strcmp(k->channels[i], ch) == 0)
            return true;
    }
    return false;
}

bool sl_apikey_channel_valid(const char *s, size_t len)
{
    if (!s || len == 0 || len > SL_APIKEY_CHANNEL_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return false;
    }
    return true;
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Check n channels (each NUL-terminated): valid names, no repeats, not too many. */
static int check_channels(char *const *v, size_t n, sl_err_t *err)
{
    if (n > SL_APIKEY_CHANNELS_MAX)
        return sl_err_set(err, SL_EINVAL, "too many channels: at most %d", SL_APIKEY_CHANNELS_MAX);
    if (n > 0 && !v)
        return sl_err_set(err, SL_EINVAL, "channel list is missing");
    for (size_t i = 0; i < n; i++) {
        if (!v[i] || !sl_apikey_channel_valid(v[i], strlen(v[i])))
            return sl_err_set(err, SL_EINVAL,
                              "invalid channel name #%zu: expected 1..%d characters "
                              "[A-Za-z0-9_.:-]",
                              i + 1, SL_APIKEY_CHANNEL_MAX);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(v[i], v[j]) == 0)
                return sl_err_set(err, SL_EINVAL, "channel \"%s\" is listed twice", v[i]);
        }
    }
    return 0;
}

int sl_apikey_channels_parse(const char *list, char ***out, size_t *n, sl_err_t *err)
{
    char **v = NULL;
    size_t cnt = 0;
    *out = NULL;
    *n = 0;
    if (!list || !*list)
        return 0;
    const char *p = list;
    v = sl_xcalloc(SL_APIKEY_CHANNELS_MAX + 1, sizeof(*v));
    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || !sl_apikey_channel_valid(p, len)) {
            free_list(v, cnt);
            return sl_err_set(err, SL_EINVAL,
                              "invalid channel name #%zu: expected 1..%d characters "
                              "[A-Za-z0-9_.:-]",
                              cnt + 1, SL_APIKEY_CHANNEL_MAX);
        }
        if (cnt == SL_APIKEY_CHANNELS_MAX) {
            free_list(v, cnt);
            return sl_err_set(err, SL_EINVAL, "too many channels: at most %d",
                              SL_APIKEY_CHANNELS_MAX);
        }
        v[cnt++] = sl_xstrndup(p, len);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    int rc = check_channels(v, cnt, err);
    if (rc != 0) {
        free_list(v, cnt);
        return rc;
    }
    *out = v;
    *n = cnt;
    return 0;
}

int sl_apikey_validate(const struct sl_apikey *k, sl_err_t *err)
{
    if (!sl_apikey_id_valid(k->id, strnlen(k->id, sizeof(k->id))))
        return sl_err_set(err, SL_EINVAL, "invalid api key id: expected %d characters [a-z0-9]",
                          SL_APIKEY_ID_LEN);
    if (k->name) {
        size_t n = strlen(k->name);
        if (n > SL_APIKEY_NAME_MAX)
            return sl_err_set(err, SL_EINVAL, "api key name is longer than %d bytes",
                              SL_APIKEY_NAME_MAX);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)k->name[i];
            if (c < 0x20 || c == 0x7f)
                return sl_err_set(err, SL_EINVAL, "api key name contains a control character");
        }
    }
    if (k->scopes == 0 || (k->scopes & ~(unsigned)SL_SCOPE_ALL) != 0)
        return sl_err_set(err, SL_EINVAL,
                          "invalid api key scopes: expected at least one of publish, read, admin");
    if (k->rate_per_s < 0 || k->rate_per_s > SL_APIKEY_RATE_MAX)
        return sl_err_set(err, SL_EINVAL, "invalid api key rate: expected 0..%d",
                          SL_APIKEY_RATE_MAX);
    if (k->burst < 0 || k->burst > SL_APIKEY_RATE_MAX)
        return sl_err_set(err, SL_EINVAL, "invalid api key burst: expected 0..%d",
                          SL_APIKEY_RATE_MAX);
    return check_channels(k->channels, k->n_channels, err);
}

/* ==== PostgreSQL ==== */

/* '{"a","b"}' into b (validated elements: no quoting needed inside the quotes). */
static int array_literal(struct sl_buf *b, char *const *v, size_t n)
{
    int rc = sl_buf_append_str(b, "{");
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = sl_buf_printf(b, "%s\"%s\"", i ? "," : "", v[i]);
    if (rc == 0)
        rc = sl_buf_append_str(b, "}"); /* sl_buf keeps it NUL-terminated */
    return rc;
}

int sl_apikey_db_insert(PGconn *pg, const struct sl_apikey *k, sl_err_t *err)
{
    char hash_hex[2 + 2 * SL_APIKEY_HASH_LEN + 1];
    char scopes[SL_APIKEY_SCOPES_STR_MAX + 2];
    char sc[SL_APIKEY_SCOPES_STR_MAX];
    char rate[24], burst[24];
    struct sl_buf chans;
    int rc = sl_apikey_validate(k, err);
    if (rc != 0)
        return rc;
    sl_buf_init(&chans, (size_t)SL_APIKEY_CHANNELS_MAX * (SL_APIKEY_CHANNEL_MAX + 3) + 8);
    hash_hex[0] = '\\';
    hash_hex[1] = 'x';
    sl_hex_encode(k->hash, SL_APIKEY_HASH_LEN, hash_hex + 2);
    sl_apikey_scopes_format(k->scopes, sc, sizeof(sc));
    (void)snprintf(scopes, sizeof(scopes), "{%s}", sc); /* names need no quoting */
    (void)snprintf(rate, sizeof(rate), "%" PRId64, k->rate_per_s);
    (void)snprintf(burst, sizeof(burst), "%" PRId64, k->burst);
    if (array_literal(&chans, k->channels, k->n_channels) != 0) {
        sl_buf_fini(&chans);
        return sl_err_set(err, SL_ETOOBIG, "api key channel list is too long");
    }
    const char *params[] = {
        k->id, k->name ? k->name : "", hash_hex, scopes, (const char *)chans.data, rate, burst};
    PGresult *res = PQexecParams(pg,
                                 "insert into api_keys (id, name, hash, scopes, channels, "
                                 "rate_per_s, burst) values ($1, $2, $3::bytea, $4::text[], "
                                 "$5::text[], $6::integer, $7::integer)",
                                 7, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_COMMAND_OK) {
        rc = 0;
    } else {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (state && strcmp(state, "23505") == 0) {
            rc = sl_err_set(err, SL_ESTATE, "api key %s already exists", k->id);
        } else {
            char why[512];
            rc = sl_err_set(err, SL_EPG, "could not insert api key %s: %s", k->id,
                            sl_pg_reason(res, pg, why, sizeof(why)));
        }
    }
    PQclear(res);
    sl_secret_wipe(hash_hex, sizeof(hash_hex));
    sl_buf_fini(&chans);
    return rc;
}

/* Fill k from row i of a list result; SL_EDECODE when a column breaks the rules. */
static int row_to_key(PGresult *res, int i, struct sl_apikey *k, sl_err_t *err)
{
    const char *id = PQgetvalue(res, i, 0);
    const char *hex = PQgetvalue(res, i, 2);
    size_t idlen = strlen(id);
    if (!sl_apikey_id_valid(id, idlen))
        return sl_err_set(err, SL_EDECODE, "api_keys row %d has a malformed id", i + 1);
    memcpy(k->id, id, SL_APIKEY_ID_LEN + 1);
    k->name = sl_xstrdup(PQgetvalue(res, i, 1));
    if (strlen(hex) != (size_t)2 * SL_APIKEY_HASH_LEN)
        return sl_err_set(err, SL_EDECODE, "api key %s: stored hash is not 32 bytes", k->id);
    for (size_t j = 0; j < SL_APIKEY_HASH_LEN; j++) {
        int hi = sl_hex_digit_lower(hex[2 * j]), lo = sl_hex_digit_lower(hex[2 * j + 1]);
        if (hi < 0 || lo < 0)
            return sl_err_set(err, SL_EDECODE, "api key %s: stored hash is not hex", k->id);
        k->hash[j] = (uint8_t)(hi << 4 | lo);
    }
    sl_err_t e2;
    if (sl_apikey_scopes_parse(PQgetvalue(res, i, 3), &k->scopes, &e2) != 0)
        return sl_err_set(err, SL_EDECODE, "api key %s: stored scopes: %s", k->id, e2.msg);
    if (sl_apikey_channels_parse(PQgetvalue(res, i, 4), &k->channels, &k->n_channels, &e2) != 0)
        return sl_err_set(err, SL_EDECODE, "api key %s: stored channels: %s", k->id, e2.msg);
    k->rate_per_s = strtoll(PQgetvalue(res, i, 5), NULL, 10);
    k->burst = strtoll(PQgetvalue(res, i, 6), NULL, 10);
    k->created_ms = strtoll(PQgetvalue(res, i, 7), NULL, 10);
    k->revoked_ms = strtoll(PQgetvalue(res, i, 8), NULL, 10);
    return 0;
}

int sl_apikey_db_list(PGconn *pg,
                      bool include_revoked,
                      struct sl_apikey **out,
                      size_t *n,
                      size_t *skipped,
                      sl_err_t *err)
{
    const char *params[] = {include_revoked ? "t" : "f"};
    *out = NULL;
    *n = 0;
    *skipped = 0;
    PGresult *res =
        sl_pg_exec(pg, "list api keys",
                   "select id, name, encode(hash, 'hex'), array_to_string(scopes, ','), "
                   "array_to_string(channels, ','), rate_per_s, burst, "
                   "floor(extract(epoch from created_at) * 1000)::bigint, "
                   "coalesce(floor(extract(epoch from revoked_at) * 1000)::bigint, 0) "
                   "from api_keys where $1::boolean or revoked_at is null order by created_at, id",
                   1, params, err);
    if (!res)
        return SL_EPG;
    int rows = PQntuples(res);
    struct sl_apikey *v = rows > 0 ? sl_xcalloc((size_t)rows, sizeof(*v)) : NULL;
    size_t kept = 0;
    for (int i = 0; i < rows; i++) {
        if (row_to_key(res, i, &v[kept], err) == 0) {
            kept++;
        } else {
            sl_apikey_fini(&v[kept]);
            (*skipped)++;
        }
    }
    PQclear(res);
    if (kept == 0) {
        free(v);
        v = NULL;
    }
    *out = v;
    *n = kept;
    return 0;
}

int sl_apikey_db_revoke(PGconn *pg, const char *id, bool *changed, sl_err_t *err)
{
    *changed = false;
    if (!id || !sl_apikey_id_valid(id, strlen(id)))
        return sl_err_set(err, SL_EINVAL, "invalid api key id: expected %d characters [a-z0-9]",
                          SL_APIKEY_ID_LEN);
    const char *params[] = {id};
    /* the exists() sees the statement's snapshot, which has the row whether or not the
     * update changed it */
    PGresult *res = sl_pg_exec(pg, "revoke api key",
                               "with u as (update api_keys set revoked_at = now(), "
                               "updated_at = now() where id = $1 and revoked_at is null "
                               "returning 1) "
                               "select (select count(*) from u), "
                               "exists (select 1 from api_keys where id = $1)",
                               1, params, err);
    if (!res)
        return SL_EPG;
    int rc = 0;
    if (PQntuples(res) != 1) {
        rc = sl_err_set(err, SL_EPG, "could not revoke api key %s: unexpected result", id);
    } else if (strcmp(PQgetvalue(res, 0, 1), "t") != 0) {
        rc = sl_err_set(err, SL_ENOTFOUND, "api key %s does not exist", id);
    } else {
        *changed = strcmp(PQgetvalue(res, 0, 0), "0") != 0;
    }
    PQclear(res);
    return rc;
}
