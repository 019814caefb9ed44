/*
 * Unit tests for the delivery job's state table (consumer/cons_job.c): every state that keeps
 * the job on a list has exactly one way out (to JOB_LOOSE, through that list's exit
 * function), JOB_ACKING only acknowledges more or is freed, JOB_FREED is final; a transition
 * moves the job between its state lists; an illegal one aborts in debug builds.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "consumer/cons_engine_int.h"

static void test_list_states_have_one_exit(void **state)
{
    (void)state;
    const enum job_state listed[] = {JOB_EP_WAIT, JOB_QUEUED,     JOB_SENDING,
                                     JOB_MARKING, JOB_DEDUP_WAIT, JOB_REDIS_HELD};
    for (size_t i = 0; i < sizeof(listed) / sizeof(listed[0]); i++) {
        for (int to = 0; to < JOB_STATE_COUNT; to++)
            assert_int_equal(cons_job_transition_ok(listed[i], (enum job_state)to),
                             to == JOB_LOOSE);
    }
}

static void test_loose_acking_freed(void **state)
{
    (void)state;
    for (int to = 0; to < JOB_STATE_COUNT; to++) {
        /* a loose job may go anywhere but where it is */
        assert_int_equal(cons_job_transition_ok(JOB_LOOSE, (enum job_state)to), to != JOB_LOOSE);
        assert_int_equal(cons_job_transition_ok(JOB_ACKING, (enum job_state)to),
                         to == JOB_ACKING || to == JOB_FREED);
        assert_false(cons_job_transition_ok(JOB_FREED, (enum job_state)to));
    }
    /* out of range never passes */
    assert_false(cons_job_transition_ok(JOB_STATE_COUNT, JOB_LOOSE));
}

static void test_names_distinct(void **state)
{
    (void)state;
    for (int a = 0; a < JOB_STATE_COUNT; a++) {
        assert_non_null(cons_job_state_name((enum job_state)a));
        for (int b = a + 1; b < JOB_STATE_COUNT; b++)
            assert_string_not_equal(cons_job_state_name((enum job_state)a),
                                    cons_job_state_name((enum job_state)b));
    }
}

/* An engine with its state lists, one endpoint queue and one loose job on that endpoint. */
struct fixture {
    struct cons_engine e; /* only its lists are used */
    struct cons_ep ce;    /* only its queue is used */
    struct job j;         /* JOB_LOOSE */
};

static void fixture_init(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
    cons_list_init(&f->e.ihold);
    cons_list_init(&f->e.epwait);
    cons_list_init(&f->e.inflight);
    cons_list_init(&f->e.marks);
    cons_list_init(&f->e.held);
    cons_list_init(&f->ce.queue);
    f->j.ce = &f->ce;
    f->j.state = JOB_LOOSE;
}

static void test_state_moves_lists(void **state)
{
    (void)state;
    static struct fixture f;
    fixture_init(&f);
    cons_job_set_state(&f.e, &f.j, JOB_QUEUED);
    assert_int_equal(f.ce.queue.n, 1);
    cons_job_set_state(&f.e, &f.j, JOB_LOOSE);
    assert_int_equal(f.ce.queue.n, 0);
    cons_job_set_state(&f.e, &f.j, JOB_DEDUP_WAIT);
    assert_int_equal(f.e.ihold.n, 1);
    assert_ptr_equal(cons_job_of(cons_list_first(&f.e.ihold)), &f.j);
    cons_job_set_state(&f.e, &f.j, JOB_LOOSE);
    cons_job_set_state(&f.e, &f.j, JOB_EP_WAIT);
    assert_int_equal(f.e.epwait.n, 1);
    assert_int_equal(f.e.ihold.n, 0);
    cons_job_set_state(&f.e, &f.j, JOB_LOOSE);
    assert_int_equal(f.e.epwait.n, 0);
    cons_job_set_state(&f.e, &f.j, JOB_SENDING);
    assert_int_equal(f.e.inflight.n, 1);
    assert_int_equal(f.e.ihold.n, 0);
    cons_job_set_state(&f.e, &f.j, JOB_LOOSE);
    cons_job_set_state(&f.e, &f.j, JOB_ACKING);
    cons_job_set_state(&f.e, &f.j, JOB_ACKING);
    assert_false(cons_link_linked(&f.j.link));
    assert_int_equal(f.j.state, JOB_ACKING);
}

#ifndef NDEBUG
static void queued_to_sending(void)
{
    static struct fixture f;
    fixture_init(&f);
    cons_job_set_state(&f.e, &f.j, JOB_QUEUED);
    cons_job_set_state(&f.e, &f.j, JOB_SENDING); /* must leave the queue through q_take first */
}

static void test_illegal_transition_aborts(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        (void)freopen("/dev/null", "w", stderr); /* the expected log line and assertion */
        queued_to_sending();
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_states_have_one_exit),
        cmocka_unit_test(test_loose_acking_freed),
        cmocka_unit_test(test_names_distinct),
        cmocka_unit_test(test_state_moves_lists),
#ifndef NDEBUG
        cmocka_unit_test(test_illegal_transition_aborts),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
