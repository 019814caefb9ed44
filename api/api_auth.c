/*
 * api_auth: the API key cache and the per-key rate limit (see api_auth.h).
 *
 * A set is an immutable array of keys plus a map from id to key, reference-counted so a
 * request keeps its key while a newer set is swapped in. The reload thread builds a set
 * from sl_apikey_db_list(active only) and swaps it under a mutex; it sleeps on a condition
 * variable so stop is immediate.
 */
#include "api/api_auth.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <openssl/crypto.h>

#include "common/sl_log.h"
#include "common/sl_map.h"
#include "common/sl_mem.h"
#include "common/sl_registry.h"
#include "common/sl_rstate.h"

#define API_KEYS_STOP_MS 1000 /* api_keys_stop's wait for the reload thread, ms */

struct api_keyset {
    atomic_uint refs;       /* the cache's + each request's */
    struct sl_apikey *keys; /* n entries */
    size_t n;
    sl_map_t *by_id; /* id -> struct sl_apikey * (into keys) */
};

struct api_keys {
    const struct sl_config *cfg;
    pthread_mutex_t mu;     /* guards cur, stop */
    pthread_cond_t cv;      /* wakes the reload thread on stop */
    struct api_keyset *cur; /* NULL until the first load */
    bool stop;
    pthread_t thr;
    bool started;
    size_t skipped; /* rows the last reload left out (reload thread only) */
};

static void set_release(struct api_keyset *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    for (size_t i = 0; i < s->n; i++)
        sl_apikey_fini(&s->keys[i]);
    free(s->keys);
    sl_map_destroy(s->by_id, NULL);
    free(s);
}

static struct api_keyset *set_new(struct sl_apikey *keys, size_t n)
{
    struct api_keyset *s = sl_xcalloc(1, sizeof(*s));
    atomic_init(&s->refs, 1);
    s->keys = keys;
    s->n = n;
    s->by_id = sl_map_new(n);
    for (size_t i = 0; i < n; i++)
        sl_map_put(s->by_id, keys[i].id, &keys[i], NULL);
    return s;
}

/* One reload; returns 0 or the error (the previous set stays). */
static int reload(struct api_keys *k, PGconn **pg, sl_err_t *err)
{
    if (*pg && PQstatus(*pg) != CONNECTION_OK) {
        PQfinish(*pg);
        *pg = NULL;
    }
    if (!*pg) {
        *pg = sl_reg_db_open(k->cfg, err);
        if (!*pg)
            return SL_EPG;
    }
    struct sl_apikey *keys = NULL;
    size_t n = 0, skipped = 0;
    int rc = sl_apikey_db_list(*pg, false, &keys, &n, &skipped, err);
    if (rc != 0) {
        PQfinish(*pg);
        *pg = NULL;
        return rc;
    }
    if (skipped > 0 && skipped != k->skipped) /* said once per change, not every refresh */
        SL_LOGKV(SL_LOG_WARN, "auth", "api_keys_skipped",
                 ((struct sl_log_kv[]){SL_KV_I("keys", (int64_t)skipped)}),
                 "%zu API keys not loaded: their rows break the rules, so they do not "
                 "authenticate (every other key does): %s",
                 skipped, err->msg);
    else if (skipped == 0 && k->skipped > 0)
        sl_info("auth", "api_keys_skipped_none", "every API key row loads again");
    k->skipped = skipped;
    struct api_keyset *s = set_new(keys, n);
    pthread_mutex_lock(&k->mu);
    struct api_keyset *old = k->cur;
    bool first = old == NULL;
    k->cur = s;
    pthread_mutex_unlock(&k->mu);
    set_release(old);
    if (first)
        sl_info("auth", "api_keys_loaded", "%zu active API keys loaded", n);
    return 0;
}

static void *reload_main(void *arg)
{
    struct api_keys *k = arg;
    PGconn *pg = NULL;
    bool failing = false;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        pthread_mutex_unlock(&k->mu);
        sl_err_t err;
        int rc = reload(k, &pg, &err);
        if (rc != 0 && !failing)
            sl_warn("auth", "api_keys_reload_failed",
                    "could not reload API keys, the last loaded set stays in force: %s", err.msg);
        else if (rc == 0 && failing)
            sl_info("auth", "api_keys_reload_recovered", "API keys reloaded again");
        failing = rc != 0;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ms = failing && k->cur == NULL ? 500 : k->cfg->api_key_refresh_ms;
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&k->mu);
        while (!k->stop && pthread_cond_timedwait(&k->cv, &k->mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&k->mu);
    if (pg)
        PQfinish(pg);
    return NULL;
}

api_keys_t *api_keys_start(const struct sl_config *cfg)
{
    struct api_keys *k = sl_xcalloc(1, sizeof(*k));
    k->cfg = cfg;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (pthread_create(&k->thr, NULL, reload_main, k) == 0)
        k->started = true;
    else
        sl_error("auth", "api_keys_thread", "could not start the API key reload thread");
    return k;
}

void api_keys_stop(api_keys_t *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (k->started) {
        /* A reload stuck on a PostgreSQL that accepts connections but never answers (libpq
         * waits for as long as the DSN's connect_timeout, by default for ever) must not hold
         * up the exit: past API_KEYS_STOP_MS the thread is left running and k with it. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += API_KEYS_STOP_MS / 1000;
        ts.tv_nsec += (API_KEYS_STOP_MS % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_timedjoin_np(k->thr, NULL, &ts) != 0) {
            sl_warn("auth", "api_keys_stop_abandoned",
                    "the API key reload thread is still waiting for postgresql after %d ms: "
                    "exiting without it",
                    API_KEYS_STOP_MS);
            return;
        }
    }
    set_release(k->cur);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

bool api_keys_loaded(api_keys_t *k)
{
    pthread_mutex_lock(&k->mu);
    bool ok = k->cur != NULL;
    pthread_mutex_unlock(&k->mu);
    return ok;
}

void api_auth_fini(struct api_auth *a)
{
    set_release(a->set);
    a->set = NULL;
    a->key = NULL;
}

void api_auth_memo_fini(struct api_auth_memo *m)
{
    if (!m)
        return;
    set_release(m->set);
    sl_secret_wipe(m->tok, sizeof(m->tok));
    m->set = NULL;
    m->key = NULL;
}

/* The current set with a reference taken, or NULL before the first load. */
static struct api_keyset *current(api_keys_t *k)
{
    pthread_mutex_lock(&k->mu);
    struct api_keyset *s = k->cur;
    if (s)
        atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&k->mu);
    return s;
}

/* Find the key of token tok in s: the key, or NULL (unknown, revoked, malformed). */
static const struct sl_apikey *lookup(struct api_keyset *s, const char *tok, const char **why)
{
    char id[SL_APIKEY_ID_LEN + 1];
    uint8_t hash[32];
    sl_err_t err;
    if (sl_apikey_parse(tok, strlen(tok), id, hash, &err) != 0) {
        *why = "the API key is malformed";
        return NULL;
    }
    const struct sl_apikey *key = sl_map_get(s->by_id, id);
    if (!key || !sl_apikey_hash_equal(key->hash, hash)) {
        *why = "the API key is unknown or revoked";
        return NULL;
    }
    return key;
}

int api_keys_check(api_keys_t *k,
                   const char *authz,
                   unsigned need,
                   struct api_auth_memo *memo,
                   struct api_auth *out,
                   const char **why)
{
    static const char bearer[] = "Bearer ";

    out->set = NULL;
    out->key = NULL;
    if (!authz) {
        *why = "no API key: send Authorization: Bearer <key>";
        return 401;
    }
    if (strncasecmp(authz, bearer, sizeof(bearer) - 1) != 0) {
        *why = "the Authorization header must be Bearer <key>";
        return 401;
    }
    const char *tok = authz + sizeof(bearer) - 1;
    struct api_keyset *s = current(k);
    if (!s) {
        *why = "API keys are not loaded yet (PostgreSQL unreachable since start-up)";
        return 503;
    }
    const struct sl_apikey *key = NULL;
    size_t tok_len = strlen(tok);
    if (memo && memo->set == s && strlen(memo->tok) == tok_len &&
        CRYPTO_memcmp(memo->tok, tok, tok_len) == 0) {
        key = memo->key; /* same key, same set: already checked on this connection */
    } else {
        key = lookup(s, tok, why);
        if (key && memo && tok_len < sizeof(memo->tok)) {
            api_auth_memo_fini(memo);
            atomic_fetch_add(&s->refs, 1);
            memo->set = s;
            memo->key = key;
            memcpy(memo->tok, tok, tok_len + 1);
        }
    }
    if (!key) {
        set_release(s);
        return 401;
    }
    out->set = s;
    out->key = key;
    if (need && !sl_apikey_allows(key, need)) {
        *why = need == SL_SCOPE_ADMIN     ? "this operation needs an API key with the admin scope"
               : need == SL_SCOPE_READ    ? "this operation needs an API key with the read scope "
                                            "(or admin)"
               : need == SL_SCOPE_PUBLISH ? "this operation needs an API key with the publish "
                                            "scope (or admin)"
                                          : "the API key lacks the scope this operation needs";
        return 403;
    }
    return 0;
}

int64_t api_keys_take(sl_redis_t *r, const struct sl_apikey *key, sl_err_t *err)
{
    if (key->rate_per_s <= 0)
        return 0;
    if (!r)
        return 0;
    /* the bucket's key and script are common/sl_rstate's */
    int64_t wait = sl_rstate_apirate_take(r, key->id, key->rate_per_s,
                                          key->burst > 0 ? key->burst : key->rate_per_s, err);
    if (wait < 0)
        wait = 0; /* Redis unavailable: err says why, and the request is allowed */
    return wait;
}
