"""Bounded exit: SIGTERM ends sluice-consumer and sluice-recorder within shutdown_timeout_ms
whatever service is down (Kafka, Redis, the endpoints' receiver, PostgreSQL), and nothing is
lost: what they could not finish is rescheduled or left uncommitted, and the pods started once
the service is back deliver it. One scenario per missing service.

The bound here is shutdown_timeout_ms = 8 s (shutdown_drain_ms 3 s, the chaos default); a
process must be gone within the bound plus EXIT_SLACK_S (process start-up of the clients'
threads, the test's own polling). A process that gave up leaving the group at the bound
exits 1: that is the designed way out, so its exit code is not judged, its exit time is."""

import os
import signal
import time

import pytest

from chaos_lib import PROFILE, verify

BOUND_MS = 8000
EXIT_SLACK_S = 2.0


def timed_term(procs, bound_s):
    """SIGTERM every process at once; the seconds each took to exit (all must, within
    bound_s + slack)."""
    t0 = time.monotonic()
    for p in procs:
        p.p.send_signal(signal.SIGTERM)
    took = []
    for p in procs:
        left = bound_s + EXIT_SLACK_S + 30 - (time.monotonic() - t0)
        try:
            p.p.wait(max(0.1, left))
        except Exception:  # noqa: BLE001 - report it below with the log
            p.kill9()
            raise AssertionError(f"did not exit at all after SIGTERM:\n{p.logs()[-3000:]}")
        took.append(round(time.monotonic() - t0, 2))
    for p, s in zip(procs, took):
        assert s <= bound_s + EXIT_SLACK_S, (
            f"exit took {s} s (bound {bound_s} s):\n{p.logs()[-3000:]}")
    return took


def world(make_world, **cfg):
    w = make_world(shutdown_timeout_ms=BOUND_MS, **cfg)
    return w


def start_pods(w, names):
    return [w.consumer(n) for n in names]


def retire(w, procs):
    """Processes stopped on purpose by the scenario (their exit code is not a crash)."""
    for p in procs:
        w.killed.add(p)


def test_exit_bound_with_kafka_gone(make_world, stack):
    w = world(make_world)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "ok", 4, "ok", "?delay_ms=100")
    w.produce_for(eps, PROFILE.n(150))
    pods = start_pods(w, ["a", "b"])
    rec = w.recorder()
    w.wait_progress(rcv, 0.2)
    w.mark("fault_start")
    stack.kill_kafka()
    time.sleep(1.0)
    took = timed_term(pods + [rec], BOUND_MS / 1000)
    retire(w, pods + [rec])
    w.notes["exit_s"] = took
    stack.restart_down()
    w.mark("fault_end")
    start_pods(w, ["c", "d"])
    w.recorder("r1")
    verify(w, rcv, dup_bound=2 * 16, dup_reason="requests in flight or delivered but not "
           "committed when the pods left without Kafka (2 pods x 4 endpoints x 4 in flight)",
           settle_timeout=PROFILE.t(180))


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_exit_bound_with_redis_gone(make_world, stack, how):
    # Endpoints slower than the pods' windows, so deliveries wait in memory: at SIGTERM the
    # drain reschedules them into Redis, which is gone (killed: refused at once; frozen with
    # SIGSTOP: every call waits redis_timeout_ms), so they stay uncommitted (the first failed
    # call ends the shutdown's Redis work) and the next pods read them again. No retry job
    # lives in Redis here: a job Redis holds when it is killed may lose its completion in the
    # AOF's last second and be sent again, which is Redis loss, not the exit.
    w = world(make_world)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "ok", 5, "ok", "?delay_ms=200")
    w.produce_for(eps, PROFILE.n(100))
    pods = start_pods(w, ["a", "b"])
    w.wait_progress(rcv, 0.2)
    w.mark("fault_start")
    redis_pid = stack.redis_pid()
    if how == "killed":
        stack.kill_redis()
    else:
        os.kill(redis_pid, signal.SIGSTOP)
    time.sleep(0.5)
    try:
        took = timed_term(pods, BOUND_MS / 1000)
    finally:
        if how == "frozen":
            os.kill(redis_pid, signal.SIGCONT)
    retire(w, pods)
    w.notes["exit_s"] = took
    if how == "killed":
        stack.start_redis()
    w.mark("fault_end")
    start_pods(w, ["c", "d"])
    verify(w, rcv, dup_bound=2 * 20, dup_reason="requests in flight when the pods stopped, or "
           "answered in the drain without a marker (2 pods x 5 endpoints x 4 in flight)",
           settle_timeout=PROFILE.t(180))


def test_exit_bound_with_the_receiver_hung(make_world, stack):
    # requests hang: the receiver is frozen (SIGSTOP) and the request timeout (20 s) is far
    # beyond the bound, so the drain must cut them and reschedule them
    w = world(make_world, http_timeout_ms=20000, lease_ms=30000)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "ok", 4, "ok", "?delay_ms=50")
    w.produce_for(eps, PROFILE.n(100))
    pods = start_pods(w, ["a", "b"])
    w.wait_progress(rcv, 0.2)
    w.mark("fault_start")
    rcv.p.send_signal(signal.SIGSTOP)
    time.sleep(1.0)
    try:
        took = timed_term(pods, BOUND_MS / 1000)
    finally:
        rcv.p.send_signal(signal.SIGCONT)
    retire(w, pods)
    w.notes["exit_s"] = took
    w.mark("fault_end")
    start_pods(w, ["c", "d"])
    verify(w, rcv, dup_bound=2 * 16, dup_reason="requests the frozen receiver had taken "
           "when the drain cut them (2 pods x 4 endpoints x 4 in flight)",
           settle_timeout=PROFILE.t(120))


def test_exit_bound_with_postgres_gone(make_world, stack):
    w = world(make_world)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "ok", 4, "ok", "?delay_ms=20")
    w.produce_for(eps, PROFILE.n(150))
    start_pods(w, ["a"])
    rec = w.recorder()
    w.wait_progress(rcv, 0.2)
    w.mark("fault_start")
    stack.stop_pg_immediate()
    time.sleep(1.0)
    took = timed_term([rec], BOUND_MS / 1000)
    retire(w, [rec])
    w.notes["exit_s"] = took
    stack.restart_down()
    w.mark("fault_end")
    w.recorder("r1")
    verify(w, rcv, dup_bound=0, dup_reason="the consumer kept running: nothing is sent twice",
           settle_timeout=PROFILE.t(120))
