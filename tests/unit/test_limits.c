/*
 * Unit tests for common/sl_limits: the soft open-file limit is raised to what is needed, up to
 * the hard limit and never lowered; the answer is the limit in force. Each case runs in a child
 * process that first lowers its own limits (always allowed), so the test's limits stay as
 * they were and every case runs whatever this machine's limits are.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sl_limits.h"

/* In a child: soft and hard lowered to the given values (hard capped at the current hard
 * limit), then sl_nofile_ensure(need); the child exits 0 when it answered want_answer and the
 * soft limit is then want_soft. want_* 0 = the lowered hard limit. */
static void check_in_child(rlim_t soft, rlim_t hard, uint64_t need, rlim_t want_soft)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(2);
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < hard)
            hard = rl.rlim_max;
        if (soft > hard)
            soft = hard;
        if (want_soft == 0 || want_soft > hard)
            want_soft = hard;
        struct rlimit set = {soft, hard};
        if (setrlimit(RLIMIT_NOFILE, &set) != 0)
            _exit(3);
        uint64_t got = sl_nofile_ensure(need, "test", "max_inflight", 7);
        if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(4);
        _exit(got == (uint64_t)want_soft && rl.rlim_cur == want_soft && rl.rlim_max == hard ? 0
                                                                                            : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_raises_the_soft_limit_to_the_need(void **state)
{
    (void)state;
    check_in_child(300, 2000, 600, 600);
}

static void test_never_lowers_a_higher_limit(void **state)
{
    (void)state;
    check_in_child(1500, 2000, 600, 1500);
}

static void test_stops_at_the_hard_limit(void **state)
{
    (void)state;
    /* asks for more than the hard limit: raised as far as it goes (and nofile_limited said) */
    check_in_child(300, 1000, 5000, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raises_the_soft_limit_to_the_need),
        cmocka_unit_test(test_never_lowers_a_higher_limit),
        cmocka_unit_test(test_stops_at_the_hard_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
