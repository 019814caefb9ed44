/*
 * Unit tests of api/api_fanout: the subscription index must give exactly what
 * sl_endpoint_subscribed says over every endpoint (a brute-force oracle), each endpoint once,
 * enabled ones only, in id order, for exact types, `prefix.*` wildcards at any depth,
 * unfiltered endpoints and channels.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api_fanout.h"
#include "common/sl_endpoints.h"
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"

static struct sl_masterkey mk;

/* A snapshot of endpoint id with the given filters (sl_endpoint_build, as the table does). */
static const struct sl_endpoint *mk_ep(const char *id,
                                       const char *const *types,
                                       size_t nt,
                                       const char *const *ch,
                                       size_t nc,
                                       bool enabled)
{
    struct sl_secret s;
    char whsec[SL_SECRET_STR_MAX];
    uint8_t box[SL_SECRET_ENC_MAX];
    size_t blen = 0;
    assert_int_equal(sl_secret_generate(&s, NULL), 0);
    assert_int_equal(sl_secret_format(&s, whsec, sizeof(whsec), NULL), 0);
    assert_int_equal(sl_secretbox_seal(&mk, id, (const uint8_t *)whsec, strlen(whsec), box,
                                       sizeof(box), &blen, NULL),
                     0);
    struct sl_endpoint_secret sec = {box, blen, 0};
    struct sl_endpoint_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.id = id;
    rec.url = "https://hooks.example/x";
    rec.secrets = &sec;
    rec.n_secrets = 1;
    rec.enabled = enabled;
    rec.types = types;
    rec.n_types = nt;
    rec.channels = ch;
    rec.n_channels = nc;
    struct sl_endpoint_defaults d = {15000, 5000, 30000, 3600000, 5, 10, 300000, 1000, 64};
    struct sl_endpoint *e = NULL;
    assert_int_equal(sl_endpoint_build(&rec, &mk, &d, 1, &e, NULL), 0);
    sl_secret_fini(&s);
    return e;
}

#define N_EPS 9
static const struct sl_endpoint *all[N_EPS];

static api_fanout_idx_t *make_index(void)
{
    static const char *const t_exact[] = {"order.created"};
    static const char *const t_wild[] = {"order.*"};
    static const char *const t_both[] = {"order.*", "order.created", "user.*"};
    static const char *const t_deep[] = {"order.item.*"};
    static const char *const t_other[] = {"user.created", "orders.x"};
    static const char *const ch_a[] = {"tenant_a"};
    static const char *const ch_ab[] = {"tenant_a", "tenant_b"};
    /* created out of id order: the index sorts */
    all[0] = mk_ep("e_wild", t_wild, 1, NULL, 0, true);
    all[1] = mk_ep("a_exact", t_exact, 1, NULL, 0, true);
    all[2] = mk_ep("b_every", NULL, 0, NULL, 0, true);
    all[3] = mk_ep("c_both", t_both, 3, NULL, 0, true);
    all[4] = mk_ep("d_deep", t_deep, 1, NULL, 0, true);
    all[5] = mk_ep("f_other", t_other, 2, NULL, 0, true);
    all[6] = mk_ep("g_off", t_exact, 1, NULL, 0, false);
    all[7] = mk_ep("h_tenant_a", t_wild, 1, ch_a, 1, true);
    all[8] = mk_ep("i_every_ab", NULL, 0, ch_ab, 2, true);
    const struct sl_endpoint **eps = malloc(N_EPS * sizeof(*eps));
    for (size_t i = 0; i < N_EPS; i++)
        eps[i] = sl_endpoint_ref(all[i]);
    return api_fanout_index(eps, N_EPS, 1);
}

/* The ids the index gives, joined with spaces. */
static void
got(api_fanout_idx_t *x, const char *type, const char *const *ch, size_t nc, char *out, size_t cap)
{
    const struct sl_endpoint **m = NULL;
    size_t n = api_fanout_match(x, type, ch, nc, &m, NULL);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%s", l ? " " : "", m[i]->id);
    }
    free(m);
}

/* The same by brute force over every endpoint, in id order. */
static void oracle(const char *type, const char *const *ch, size_t nc, char *out, size_t cap)
{
    static const char *const ids[] = {"a_exact", "b_every", "c_both",     "d_deep",    "e_wild",
                                      "f_other", "g_off",   "h_tenant_a", "i_every_ab"};
    out[0] = '\0';
    for (size_t k = 0; k < N_EPS; k++) {
        for (size_t i = 0; i < N_EPS; i++) {
            const struct sl_endpoint *e = all[i];
            if (strcmp(e->id, ids[k]) != 0)
                continue;
            if (e->enabled && sl_endpoint_subscribed(e, type, strlen(type), ch, nc)) {
                size_t l = strlen(out);
                snprintf(out + l, cap - l, "%s%s", l ? " " : "", e->id);
            }
        }
    }
}

static void test_matches_the_rule(void **state)
{
    (void)state;
    api_fanout_idx_t *x = make_index();
    assert_int_equal(api_fanout_count(x), N_EPS);
    static const char *const types[] = {"order.created",
                                        "order.paid",
                                        "order",
                                        "order.item.added",
                                        "order.item",
                                        "orders.x",
                                        "user.created",
                                        "user.deleted",
                                        "x",
                                        "order."};
    static const char *const a[] = {"tenant_a"}, *const b[] = {"tenant_b"}, *const z[] = {"z"};
    const char *const *chs[] = {NULL, a, b, z};
    char g[512], o[512];
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        for (size_t c = 0; c < 4; c++) {
            got(x, types[t], chs[c], chs[c] ? 1 : 0, g, sizeof(g));
            oracle(types[t], chs[c], chs[c] ? 1 : 0, o, sizeof(o));
            if (strcmp(g, o) != 0)
                fail_msg("type %s channel set %zu: index [%s], rule [%s]", types[t], c, g, o);
        }
    }
    /* the expected answers spelled out for the main cases */
    got(x, "order.created", NULL, 0, g, sizeof(g));
    assert_string_equal(g, "a_exact b_every c_both e_wild");
    got(x, "order.item.added", a, 1, g, sizeof(g));
    assert_string_equal(g, "b_every c_both d_deep e_wild h_tenant_a i_every_ab");
    got(x, "order", NULL, 0, g, sizeof(g));
    assert_string_equal(g, "b_every");
    api_fanout_idx_release(x);
    for (size_t i = 0; i < N_EPS; i++)
        sl_endpoint_release(all[i]);
}

int main(void)
{
    assert_int_equal(
        sl_masterkey_parse(&mk, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                           NULL),
        0);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matches_the_rule)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sl_masterkey_fini(&mk);
    return rc;
}
