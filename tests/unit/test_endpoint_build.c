/*
 * Unit tests for the Kafka-free parts of common/sl_endpoints: postback template syntax, the
 * registration URL check, snapshot building (decryption, expiry filtering, order, failure
 * modes), the resolution of zeros to effective values and the subscription match
 * (sl_endpoint_subscribed). (test_endpoints is the integration test of the whole table.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_endpoints.h"
#include "common/sl_secretbox.h"
#include "common/sl_sign.h"

static void test_template_syntax(void **state)
{
    (void)state;
    static const char *ok[] = {
        "https://t.example/pb?click={click_id}&sum={payout}", "https://t.example/{a}/{B_9}?x=1",
        "https://t.example/no-macros",
        ("https://t.example/"
         "{aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}"), /* 64 */
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        assert_int_equal(sl_endpoint_template_syntax(ok[i], NULL), 0);
    static const struct {
        const char *tpl;
        const char *msg;
    } bad[] = {
        {"https://t.example/?c=x}", "unmatched '}' at offset 22"},
        {"https://t.example/?c={click", "unclosed '{' at offset 21"},
        {"https://t.example/?c={a{b}}", "inside the macro opened at offset 21"},
        {"https://t.example/?c={}", "empty macro name at offset 21"},
        {"https://t.example/?c={cl-ick}", "[A-Za-z0-9_]"},
        {"https://t.example/?c={cl ick}", "[A-Za-z0-9_]"},
        {"https://t.example/{aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}",
         "longer than 64"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_err_t err;
        assert_int_equal(sl_endpoint_template_syntax(bad[i].tpl, &err), SL_EINVAL);
        if (!strstr(err.msg, bad[i].msg))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].msg);
    }
}

static void test_url_check(void **state)
{
    (void)state;
    sl_err_t err;
    assert_int_equal(sl_endpoint_url_check("https://hooks.example/x?token=1", false, &err), 0);
    assert_int_equal(sl_endpoint_url_check("https://t.example/pb?c={click_id}", true, &err), 0);
    assert_int_equal(sl_endpoint_url_check("https://t.example/{p}/x", true, &err), 0);
    /* braces in a plain URL: a forgotten --template */
    assert_int_equal(sl_endpoint_url_check("https://t.example/pb?c={click_id}", false, &err),
                     SL_EINVAL);
    assert_non_null(strstr(err.msg, "template"));
    /* the host must not come from delivery data */
    assert_int_equal(sl_endpoint_url_check("https://{h}.example/pb", true, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "host"));
    assert_int_equal(sl_endpoint_url_check("https://t.example{h}/pb", true, &err), SL_EINVAL);
    /* the filled-in template must be a valid URL */
    assert_int_not_equal(sl_endpoint_url_check("ftp://t.example/{a}", true, &err), 0);
    assert_int_not_equal(sl_endpoint_url_check("https://t.example:{port}/", true, &err), 0);
    assert_int_not_equal(sl_endpoint_url_check("{scheme}://t.example/", true, &err), 0);
    assert_int_not_equal(sl_endpoint_url_check("ftp://t.example/", false, &err), 0);
    assert_int_equal(sl_endpoint_url_check("", false, &err), SL_EMISSING);
    char longurl[2100];
    memset(longurl, 'a', sizeof(longurl) - 1);
    memcpy(longurl, "https://t.example/", 18);
    longurl[sizeof(longurl) - 1] = '\0';
    assert_int_equal(sl_endpoint_url_check(longurl, false, &err), SL_ETOOBIG);
}

/* A record with secrets sealed under mk for id; helpers keep the boxes alive. */
struct fixture {
    struct sl_masterkey mk;
    char whsec[3][SL_SECRET_STR_MAX];
    uint8_t box[3][SL_SECRET_ENC_MAX];
    struct sl_endpoint_secret sec[3];
    struct sl_endpoint_rec rec;
    struct sl_endpoint_defaults d;
};

static void
seal(struct fixture *f, int i, const char *for_id, const struct sl_masterkey *mk, const char *plain)
{
    size_t blen = 0;
    assert_int_equal(sl_secretbox_seal(mk, for_id, (const uint8_t *)plain, strlen(plain), f->box[i],
                                       sizeof(f->box[i]), &blen, NULL),
                     0);
    f->sec[i].enc = f->box[i];
    f->sec[i].enc_len = blen;
}

static void fixture_init(struct fixture *f, uint64_t now)
{
    memset(f, 0, sizeof(*f));
    assert_int_equal(
        sl_masterkey_parse(
            &f->mk, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", NULL),
        0);
    for (int i = 0; i < 3; i++) {
        struct sl_secret s;
        assert_int_equal(sl_secret_generate(&s, NULL), 0);
        assert_int_equal(sl_secret_format(&s, f->whsec[i], sizeof(f->whsec[i]), NULL), 0);
        seal(f, i, "ep_1", &f->mk, f->whsec[i]);
    }
    f->sec[0].exp_ms = 0;           /* current */
    f->sec[1].exp_ms = now + 60000; /* still in its overlap */
    f->sec[2].exp_ms = now - 1;     /* expired */
    f->rec.id = "ep_1";
    f->rec.url = "https://hooks.example/x";
    f->rec.secrets = f->sec;
    f->rec.n_secrets = 3;
    f->rec.enabled = true;
    f->rec.updated_ms = 1234;
    f->d = (struct sl_endpoint_defaults){.timeout_ms = 15000,
                                         .conn_timeout_ms = 5000,
                                         .retry_base_ms = 30000,
                                         .retry_cap_ms = 3600000,
                                         .max_attempts = 5,
                                         .brk_threshold = 10,
                                         .brk_cooldown_ms = 300000,
                                         .rate_period_ms = 1000,
                                         .max_inflight = 64};
}

static void test_build(void **state)
{
    (void)state;
    uint64_t now = 1800000000000ULL;
    struct fixture f;
    fixture_init(&f, now);
    static const struct sl_kv hdr[2] = {{"X-Source", "sluice"}, {"X-Team", "payments"}};
    f.rec.hdr = hdr;
    f.rec.n_hdr = 2;
    f.rec.name = "Shop";
    f.rec.timeout_ms = 2000;
    struct sl_endpoint *e = NULL;
    sl_err_t err;
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), 0);
    assert_string_equal(e->id, "ep_1");
    assert_string_equal(e->name, "Shop");
    assert_string_equal(e->url, "https://hooks.example/x");
    assert_null(e->ct);
    assert_string_equal(e->reason, "");
    assert_int_equal(e->n_hdr, 2);
    assert_string_equal(e->hdr[1].name, "X-Team");
    assert_string_equal(e->hdr[1].value, "payments");
    assert_int_equal(e->updated_ms, 1234);
    assert_int_equal(e->version, 0);
    assert_int_equal(e->n_types, 0);
    assert_null(e->types);
    assert_int_equal(e->n_channels, 0);
    assert_null(e->channels);
    /* the expired secret is left out; order kept: current first */
    assert_int_equal(e->n_secrets, 2);
    char s[SL_SECRET_STR_MAX];
    assert_int_equal(sl_secret_format(&e->secrets[0], s, sizeof(s), NULL), 0);
    assert_string_equal(s, f.whsec[0]);
    assert_int_equal(e->secret_exp_ms[0], 0);
    assert_int_equal(sl_secret_format(&e->secrets[1], s, sizeof(s), NULL), 0);
    assert_string_equal(s, f.whsec[1]);
    assert_int_equal(e->secret_exp_ms[1], now + 60000);
    /* effective values */
    assert_int_equal(e->timeout_ms, 2000);
    assert_int_equal(e->conn_timeout_ms, 2000); /* default 5000 clamped to the total */
    assert_int_equal(e->retry_base_ms, 30000);
    assert_int_equal(e->max_inflight, 64);
    assert_int_equal(e->rate, 0);
    /* references: the second release frees (ASan checks there is no double free) */
    assert_ptr_equal(sl_endpoint_ref(e), e);
    sl_endpoint_release(e);
    assert_string_equal(e->id, "ep_1");
    sl_endpoint_release(e);
    sl_endpoint_release(NULL);
}

static void test_build_failures(void **state)
{
    (void)state;
    uint64_t now = 1800000000000ULL;
    struct fixture f;
    struct sl_endpoint *e = (struct sl_endpoint *)1;
    sl_err_t err;

    /* wrong master key */
    fixture_init(&f, now);
    struct sl_masterkey other;
    assert_int_equal(
        sl_masterkey_parse(
            &other, "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", NULL),
        0);
    assert_int_equal(sl_endpoint_build(&f.rec, &other, &f.d, now, &e, &err), SL_ECRYPTO);
    assert_null(e);
    assert_null(strstr(err.msg, f.whsec[0]));

    /* a box sealed for another endpoint (copied row) */
    fixture_init(&f, now);
    seal(&f, 1, "ep_2", &f.mk, f.whsec[1]);
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), SL_ECRYPTO);
    assert_non_null(strstr(err.msg, "secret 1"));

    /* a box that does not hold a whsec_ secret */
    fixture_init(&f, now);
    seal(&f, 0, "ep_1", &f.mk, "not a secret");
    assert_int_not_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), 0);
    assert_null(e);

    /* every secret expired */
    fixture_init(&f, now);
    f.sec[0].exp_ms = now - 5;
    f.sec[1].exp_ms = now;
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), SL_EINVAL);
    assert_non_null(strstr(err.msg, "no unexpired secret"));

    /* a template with broken syntax */
    fixture_init(&f, now);
    f.rec.tpl = true;
    f.rec.url = "https://t.example/?c={click";
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), SL_EINVAL);
    assert_null(e);
}

static void test_resolve_policy(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 0);
    struct sl_endpoint e;
    memset(&e, 0, sizeof(e));
    /* all zero: the defaults, rate unlimited, burst 0 */
    sl_endpoint_resolve_policy(&e, &f.rec, &f.d);
    assert_int_equal(e.timeout_ms, 15000);
    assert_int_equal(e.conn_timeout_ms, 5000);
    assert_int_equal(e.retry_cap_ms, 3600000);
    assert_int_equal(e.max_attempts, 5);
    assert_int_equal(e.brk_threshold, 10);
    assert_int_equal(e.brk_cooldown_ms, 300000);
    assert_int_equal(e.rate, 0);
    assert_int_equal(e.rate_period_ms, 1000);
    assert_int_equal(e.burst, 0);
    /* set values win; burst follows rate; a base above the default cap raises the cap */
    f.rec.rate = 50;
    f.rec.retry_base_ms = 7200000;
    f.rec.max_attempts = 9;
    f.rec.conn_timeout_ms = 700;
    sl_endpoint_resolve_policy(&e, &f.rec, &f.d);
    assert_int_equal(e.rate, 50);
    assert_int_equal(e.burst, 50);
    assert_int_equal(e.retry_base_ms, 7200000);
    assert_int_equal(e.retry_cap_ms, 7200000);
    assert_int_equal(e.max_attempts, 9);
    assert_int_equal(e.conn_timeout_ms, 700);
    f.rec.burst = 5;
    f.rec.rate_period_ms = 60000;
    sl_endpoint_resolve_policy(&e, &f.rec, &f.d);
    assert_int_equal(e.burst, 5);
    assert_int_equal(e.rate_period_ms, 60000);
}

/* Does e (types/channels set by hand) want type t with the given channels? */
static bool sub(struct sl_endpoint *e, const char *t, const char *const *ch, size_t n)
{
    return sl_endpoint_subscribed(e, t, strlen(t), ch, n);
}

static void test_subscribed(void **state)
{
    (void)state;
    struct sl_endpoint e;
    memset(&e, 0, sizeof(e));
    const char *none[1] = {NULL};
    /* no filter, no channels: everything, with or without channels on the event */
    assert_true(sub(&e, "order.created", none, 0));
    const char *ev_ch[] = {"tenant:1", "aff-9"};
    assert_true(sub(&e, "x", ev_ch, 2));

    char *types[] = {"order.*", "invoice.paid"};
    e.types = types;
    e.n_types = 2;
    assert_true(sub(&e, "order.created", none, 0));
    assert_true(sub(&e, "order.item.added", none, 0));
    assert_false(sub(&e, "order", none, 0));
    assert_false(sub(&e, "order.", none, 0)); /* must be longer than "order." */
    assert_false(sub(&e, "orders.x", none, 0));
    assert_false(sub(&e, "xorder.created", none, 0));
    assert_true(sub(&e, "invoice.paid", none, 0));
    assert_false(sub(&e, "invoice.paid.late", none, 0)); /* exact means exact */
    assert_false(sub(&e, "invoice.pai", none, 0));
    assert_false(sub(&e, "invoice", none, 0));
    /* type_len bounds the type: "order.createdXYZ" cut to "order.created" */
    assert_true(sl_endpoint_subscribed(&e, "invoice.paidXYZ", 12, none, 0));
    assert_false(sl_endpoint_subscribed(&e, "order.x", 6, none, 0)); /* "order." */

    /* channels: the event must carry one of the endpoint's */
    char *chans[] = {"tenant:1", "tenant:2"};
    e.channels = chans;
    e.n_channels = 2;
    assert_false(sub(&e, "order.created", none, 0)); /* event without channels */
    assert_true(sub(&e, "order.created", ev_ch, 2));
    const char *other[] = {"tenant:3", "aff-9"};
    assert_false(sub(&e, "order.created", other, 2));
    const char *second[] = {"tenant:3", "tenant:2"};
    assert_true(sub(&e, "order.created", second, 2));
    assert_false(sub(&e, "refund.created", second, 2)); /* both conditions */
    const char *prefix_only[] = {"tenant:"};
    assert_false(sub(&e, "order.created", prefix_only, 1));

    /* channels without types: every type, channel still required */
    e.types = NULL;
    e.n_types = 0;
    assert_true(sub(&e, "anything", ev_ch, 2));
    assert_false(sub(&e, "anything", other, 2));
    e.enabled = false; /* not looked at */
    assert_true(sub(&e, "anything", ev_ch, 2));
}

static void test_build_types_channels(void **state)
{
    (void)state;
    uint64_t now = 1800000000000ULL;
    struct fixture f;
    fixture_init(&f, now);
    const char *types[] = {"order.*", "invoice.paid"};
    const char *chans[] = {"tenant:1"};
    f.rec.types = types;
    f.rec.n_types = 2;
    f.rec.channels = chans;
    f.rec.n_channels = 1;
    struct sl_endpoint *e = NULL;
    sl_err_t err;
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), 0);
    assert_int_equal(e->n_types, 2);
    assert_string_equal(e->types[0], "order.*");
    assert_string_equal(e->types[1], "invoice.paid");
    assert_ptr_not_equal(e->types[0], types[0]); /* copied */
    assert_int_equal(e->n_channels, 1);
    assert_string_equal(e->channels[0], "tenant:1");
    const char *ev[] = {"tenant:1"};
    assert_true(sl_endpoint_subscribed(e, "order.paid", 10, ev, 1));
    assert_false(sl_endpoint_subscribed(e, "order.paid", 10, NULL, 0));
    sl_endpoint_release(e);
}

/* A whsk_ (Ed25519) secret opens as one, next to whsec_ ones; a forged public half does not. */
static void test_build_ed25519(void **state)
{
    (void)state;
    uint64_t now = 1800000000000ULL;
    struct fixture f;
    fixture_init(&f, now);
    struct sl_secret ed, other;
    assert_int_equal(sl_secret_generate_ed25519(&ed, NULL), 0);
    assert_int_equal(sl_secret_format(&ed, f.whsec[1], sizeof(f.whsec[1]), NULL), 0);
    seal(&f, 1, "ep_1", &f.mk, f.whsec[1]);
    struct sl_endpoint *e = NULL;
    sl_err_t err;
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), 0);
    assert_int_equal(e->n_secrets, 2);
    assert_int_equal(e->secrets[0].kind, SL_SECRET_HMAC);
    assert_int_equal(e->secrets[1].kind, SL_SECRET_ED25519);
    assert_int_equal(e->secrets[1].len, SL_ED25519_KEY_BYTES);
    assert_memory_equal(e->secrets[1].key, ed.key, SL_ED25519_KEY_BYTES);
    char s[SL_SECRET_STR_MAX];
    assert_int_equal(sl_secret_format(&e->secrets[1], s, sizeof(s), NULL), 0);
    assert_string_equal(s, f.whsec[1]);
    sl_endpoint_release(e);

    /* seed of one key, public half of another: refused, the secret not in the message */
    assert_int_equal(sl_secret_generate_ed25519(&other, NULL), 0);
    memcpy(ed.key + 32, other.key + 32, 32);
    assert_int_equal(sl_secret_format(&ed, f.whsec[0], sizeof(f.whsec[0]), NULL), 0);
    seal(&f, 0, "ep_1", &f.mk, f.whsec[0]);
    e = (struct sl_endpoint *)1;
    assert_int_equal(sl_endpoint_build(&f.rec, &f.mk, &f.d, now, &e, &err), SL_EINVAL);
    assert_null(e);
    assert_non_null(strstr(err.msg, "secret 0"));
    assert_non_null(strstr(err.msg, "public half does not match"));
    assert_null(strstr(err.msg, f.whsec[0] + 5));
    sl_secret_fini(&ed);
    sl_secret_fini(&other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_syntax), cmocka_unit_test(test_url_check),
        cmocka_unit_test(test_build),           cmocka_unit_test(test_build_failures),
        cmocka_unit_test(test_build_ed25519),   cmocka_unit_test(test_resolve_policy),
        cmocka_unit_test(test_subscribed),      cmocka_unit_test(test_build_types_channels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
