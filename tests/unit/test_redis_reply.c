/*
 * Unit tests for sl_redis_err_demoted (common/sl_redis.c): which error replies make a
 * connection be dropped and made again, so that a client reaches the new primary after a
 * managed service's failover. The replies are Redis's own texts: a write to a replica
 * (READONLY), a replica whose primary is down (MASTERDOWN), the same from a script as Redis 7
 * passes them on and as Redis 6 wraps them ("ERR Error running script ... -READONLY"), and
 * errors that must not drop the connection. A real server's READONLY is driven in
 * tests/integration/test_rstate_redis.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl_redis_int.h"

static bool demoted(const char *s)
{
    return sl_redis_err_demoted(s, strlen(s));
}

static void test_plain_replies(void **state)
{
    (void)state;
    assert_true(demoted("READONLY You can't write against a read only replica."));
    assert_true(demoted("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is "
                        "set to 'no'."));
    assert_false(demoted("ERR unknown command 'FOO'"));
    assert_false(demoted("NOPERM this user has no permissions to run the 'set' command"));
    assert_false(demoted("OOM command not allowed when used memory > 'maxmemory'."));
    assert_false(demoted(""));
    assert_false(sl_redis_err_demoted(NULL, 0));
}

static void test_script_replies(void **state)
{
    (void)state;
    /* Redis 7 passes the error code of a script's call on */
    assert_true(demoted("READONLY You can't write against a read only replica. script: "
                        "1f0d9b3c, on @user_script:3."));
    /* Redis 6 wraps it */
    assert_true(demoted("ERR Error running script (call to f_1f0d9b3c4e): @user_script:3: "
                        "@user_script: 3: -READONLY You can't write against a read only "
                        "replica. "));
    assert_true(demoted("ERR Error running script (call to f_1f0d9b3c4e): @user_script:3: "
                        "@user_script: 3: -MASTERDOWN Link with MASTER is down and "
                        "replica-serve-stale-data is set to 'no'. "));
    /* a script's own error that merely mentions the word does not */
    assert_false(demoted("ERR Error running script (call to f_1f0d9b3c4e): @user_script:9: "
                         "user_script:9: lease READONLY mismatch"));
    assert_false(demoted("ERR Error running script (call to f_1f0d9b3c4e): @user_script:3: "
                         "@user_script: 3: -OOM command not allowed when used memory > "
                         "'maxmemory'. "));
}

static void test_length_bounds_the_text(void **state)
{
    (void)state;
    const char *s = "READONLY You can't write against a read only replica.";
    assert_false(sl_redis_err_demoted(s, 7)); /* "READONL" */
    const char *w = "ERR Error running script (call to f_1): @user_script: 1: -READONLY x";
    size_t cut = (size_t)(strstr(w, "-READONLY") - w) + 5;
    assert_false(sl_redis_err_demoted(w, cut)); /* the match would need bytes past len */
    assert_true(sl_redis_err_demoted(w, strlen(w)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_replies),
        cmocka_unit_test(test_script_replies),
        cmocka_unit_test(test_length_bounds_the_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
