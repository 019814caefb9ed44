"""Chaos scenarios on the consumer pods: kill -9 mid-batch, SIGTERM under retry load, SIGSTOP
past the session timeout, and a group that grows and shrinks while it works.

Each test runs a workload of many events across many endpoints with two or more consumers,
injects one kind of fault, and ends with chaos_lib.verify (nothing missing, duplicates within
the stated bound, lag 0, Redis clean)."""

import collections
import signal
import time

from chaos_lib import PROFILE, verify, wait_until


def workload(w, rcv, per_ep, ok_eps=6, delay_ms=50):
    """ok endpoints that answer after delay_ms (so requests are in flight when a fault hits),
    one flaky endpoint (30% of attempts get 500: retries through Redis) and one that answers
    400 (dead letters)."""
    eps = w.endpoints(rcv, "ok", ok_eps, "ok", f"?delay_ms={delay_ms}")
    eps += w.endpoints(rcv, "fl", 1, "flaky/30", f"?delay_ms={delay_ms}")
    eps += w.endpoints(rcv, "bad", 1, "status/400")
    w.produce_for(eps, per_ep)
    return eps


def pod_inflight_cap(w, eps):
    """Requests one pod can have running: per-endpoint cap x endpoints, within the global
    cap. This is what a pod can lose track of at any instant."""
    per_ep = int(w.env["SLUICE_MAX_INFLIGHT_PER_ENDPOINT"])
    return min(int(w.env["SLUICE_MAX_INFLIGHT"]), per_ep * len(eps))


def test_consumer_kill9_mid_batch_repeated(make_world):
    """kill -9 of a consumer while requests are in flight, three times (nine in soak), each
    victim restarted at once. Duplicates may only come from requests in flight at a kill."""
    w = make_world(max_inflight_per_endpoint=2)
    rcv = w.receiver()
    eps = workload(w, rcv, per_ep=PROFILE.n(200))
    pods = {"a": w.consumer("a"), "b": w.consumer("b")}
    kills = 3 * PROFILE.repeats
    w.mark("fault_start")
    for i in range(kills):
        w.wait_progress(rcv, (i + 1) / (kills + 2), timeout=120)
        name = "ab"[i % 2]
        w.kill9(pods[name])
        pods[name] = w.consumer(name)
    w.mark("fault_end")
    assert w.accepted_count(rcv) < len(w.events), "the workload ended before the last kill"
    cap = pod_inflight_cap(w, eps)
    verify(w, rcv, dup_bound=kills * cap,
           dup_reason=f"{kills} kills x {cap} requests a pod can have in flight")


def test_consumer_sigterm_under_retry_load(make_world):
    """Rolling restart under heavy retry load: the old pod gets SIGTERM and, while it drains
    its in-flight requests (some take 3 s), its replacement joins and the group starts to
    rebalance. The old pod drains, reschedules what is left without spending attempts,
    commits (its final commit must not be lost to the rebalance: regression), and exits 0
    within its bound."""
    w = make_world(retry_base_ms=300, retry_cap_ms=1500, max_attempts=12,
                   breaker_threshold=1000, http_timeout_ms=5000, lease_ms=8000,
                   shutdown_drain_ms=4000)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "fl", 6, "flaky/60", "?delay_ms=30")
    eps += w.endpoints(rcv, "ok", 2, "ok", "?delay_ms=30")
    w.produce_for(eps, PROFILE.n(80))
    slow = w.endpoints(rcv, "sl", 2, "ok", "?delay_ms=3000")
    w.produce_for(slow, PROFILE.n(12))  # 3 s requests: in flight when SIGTERM comes
    eps += slow
    pods = [w.consumer("a"), w.consumer("b")]
    drain_ms = int(w.env["SLUICE_SHUTDOWN_DRAIN_MS"])
    stops = []
    failed = 0
    for i in range(PROFILE.repeats):
        # heavy retry load: plenty of new failed attempts and jobs waiting in Redis
        want_failed = failed + max(50, len(w.events) // 10)
        wait_until(lambda: sum(1 for line in rcv.ledger() if line["status"] == 500) >=
                   want_failed and w.redis_state()[2] >= 50,
                   PROFILE.t(60), 0.2, "heavy retry load")
        failed = sum(1 for line in rcv.ledger() if line["status"] == 500)
        if i == 0:
            w.mark("fault_start")
        victim = pods[i % 2]
        t = time.monotonic()
        victim.stop(signal.SIGTERM)  # drains its 3 s requests without serving the group ...
        time.sleep(0.3)
        pods[i % 2] = w.consumer(f"r{i}")  # ... when the replacement's join rebalances it
        rc = victim.term(timeout=PROFILE.t(60))
        took = time.monotonic() - t
        stops.append(round(took, 2))
        assert rc == 0, f"exit {rc} after SIGTERM:\n{victim.logs()[-3000:]}"
        assert took < drain_ms / 1000 + 12, f"shutdown took {took:.1f}s"
        # the final commit must have reached the broker: librdkafka's own commit of the
        # unassigned partitions can lose the race with the leave ("Unknown member")
        log = victim.logs()
        lost = [line for line in log.splitlines()
                if "COMMITFAIL" in line and "unassigned partitions" in line]
        committed = "offsets committed before shutdown" in log
        assert committed or not lost, \
            f"the final commit of a clean shutdown was lost: {lost[0][:400]}"
    w.mark("fault_end")
    w.notes["shutdown_s"] = stops
    outs = w.outcomes()
    shut = [o for o in outs if o["state"] == "deferred" and o["err"] == "shutdown"]
    w.notes["shutdown_deferred"] = len(shut)
    # invariant 10: the rescheduled work spent no attempt. Here the 3-s requests usually
    # finish within the 4-s drain, so there may be no deferral at all (CI: 0); the e2e test
    # test_sigterm_drains_and_reschedules_without_spending_attempts requires some and checks
    # them. This is a guard for the deferrals the restarts do produce.
    assert all(o["attempt"] == 0 for o in shut), "a shutdown deferral spent an attempt"
    cap = pod_inflight_cap(w, eps)
    figures = verify(w, rcv, dup_bound=PROFILE.repeats * cap,
                     dup_reason="requests still running after the drain bound are cancelled "
                                "and may have reached the endpoint")
    # flaky endpoints only fail transiently: a dead letter must have used every attempt
    outs = w.outcomes()
    max_attempts = int(w.env["SLUICE_MAX_ATTEMPTS"])
    early = [o for o in outs if o["state"] == "dead_letter" and o["http"] == 500 and
             o["attempt"] != max_attempts]
    assert not early, f"dead-lettered before max_attempts: {early[:3]}"
    assert figures["max_attempt"] <= max_attempts


def test_consumer_sigstop_past_session_timeout(make_world):
    """SIGSTOP a pod well past the session timeout: the group gives its partitions to the
    other pod, which re-delivers from the last commit. When the frozen pod wakes up, its
    partitions are gone; it must not push its stale in-memory work out again. Duplicates are
    bounded by the requests it had in flight when frozen, and no request may start after
    the wake-up for an event the endpoint had already accepted (stale sends)."""
    w = make_world(max_inflight_per_endpoint=2)
    rcv = w.receiver()
    eps = workload(w, rcv, per_ep=PROFILE.n(220), delay_ms=100)
    a = w.consumer("a")
    w.consumer("b")  # the second pod shares the partitions
    session_s = int(w.env["SLUICE_KAFKA_SESSION_TIMEOUT_MS"]) / 1000
    wakes = []
    for i in range(PROFILE.repeats):
        w.wait_progress(rcv, 0.15 + 0.2 * i, timeout=90)
        if i == 0:
            w.mark("fault_start")
        a.stop(signal.SIGSTOP)
        time.sleep(session_s + 4)  # the coordinator gives up on it after session_s
        wakes.append(int(time.time() * 1000))
        a.stop(signal.SIGCONT)
    w.mark("fault_end")
    assert w.accepted_count(rcv) < len(w.events), "the workload ended during the freeze"
    cap = pod_inflight_cap(w, eps)
    # Each request in flight at the freeze can be sent twice more: by the other pod, which
    # re-reads its uncommitted record, and by the woken pod's retry (F6: answered during the
    # freeze, it times out on waking), when neither sees the other's delivered marker yet.
    figures = verify(w, rcv, dup_bound=2 * PROFILE.repeats * cap,
                     dup_reason="requests the frozen pod had in flight, each re-read by the "
                     "other pod and retried by the woken one (F6)")
    # stale sends: first attempts (its queued Kafka work) the woken pod got a 2xx for, after
    # a wake-up, for events the endpoint had accepted before it. (Retries are not counted: a
    # request answered during the freeze times out on waking, and its retry is legitimate;
    # the other pod's requests are not counted either. The pod and attempt come from the
    # delivered outcome of that request.)
    delivered_by = collections.defaultdict(list)
    for o in w.outcomes():
        if o["state"] == "delivered" and o["attempt"] == 1:
            delivered_by[(o["id"], o["endpoint"])].append((o["ts_ms"], o["pod"]))
    stale = 0
    for t_cont in wakes:
        first = {}
        for line in sorted(rcv.ledger(), key=lambda x: x["ts_ms"]):
            if not 200 <= line["status"] < 300:
                continue
            k = (line["webhook_id"], line["endpoint"])
            if line["ts_ms"] < t_cont:
                first.setdefault(k, line["ts_ms"])
            elif k in first and line["ts_ms"] < t_cont + 5000:
                pods = [p for ts, p in delivered_by[k] if 0 <= ts - line["ts_ms"] < 5000]
                stale += pods[:1] == ["a"]
    figures["stale_sends_after_wake"] = stale
    print(f"stale sends after wake-up: {stale}")
    assert stale == 0, f"the woken pod sent {stale} events the endpoints already had"


def test_consumer_group_rebalance_add_remove(make_world):
    """Pods join and leave (SIGTERM) while the group works: every rebalance drains in-flight
    work of revoked partitions and commits, so no event is sent twice."""
    w = make_world(max_inflight_per_endpoint=2)
    rcv = w.receiver()
    eps = workload(w, rcv, per_ep=PROFILE.n(200))
    pods = collections.OrderedDict()
    pods["a"] = w.consumer("a")
    pods["b"] = w.consumer("b")
    steps = 0
    n = 0
    w.mark("fault_start")
    plan = []
    for r in range(PROFILE.repeats):
        plan += ["add", "remove", "add", "remove"]
    for i, action in enumerate(plan):
        w.wait_progress(rcv, 0.1 + 0.75 * i / len(plan), timeout=120)
        if action == "add":
            n += 1
            pods[f"n{n}"] = w.consumer(f"n{n}")
        else:
            name, p = next(iter(pods.items()))
            rc = p.term(timeout=PROFILE.t(60))
            assert rc == 0, f"{name} exited {rc}:\n{p.logs()[-3000:]}"
            del pods[name]
        steps += 1
    w.mark("fault_end")
    assert w.accepted_count(rcv) < len(w.events), "the workload ended before the last change"
    cap = pod_inflight_cap(w, eps)
    verify(w, rcv, dup_bound=cap,
           dup_reason="a request outliving the revoke drain bound (none expected)")


def test_claimed_retry_held_past_its_lease_is_not_sent_twice(make_world):
    """Regression (lease lapsed while a claimed retry job waited in memory): one endpoint
    takes one request at a time, so retry jobs a pod claims wait in its queue behind the
    endpoint's other deliveries for longer than the lease. The pod must keep its leases alive
    (or give the jobs up); otherwise the other pod claims the same jobs when the leases run
    out and both send them. The endpoint fails each event's first attempt only, so every
    event goes through exactly one retry job."""
    w = make_world(lease_ms=3000, http_timeout_ms=1500, retry_base_ms=200, retry_cap_ms=500)
    rcv = w.receiver()
    ep = w.endpoints(rcv, "one", 1, "ok", "?delay_ms=300&fail_n=1", "--max-inflight", "1")
    w.produce_for(ep, PROFILE.n(24))
    w.consumer("a")
    w.consumer("b")
    w.mark("fault_start")
    w.mark("fault_end")
    figures = verify(w, rcv, dup_bound=0,
                     dup_reason="no pod fault: a job held past its lease must not be sent twice",
                     settle_timeout=120)
    assert figures["delivered"] == len(w.events)


def test_dead_letters_are_not_resent_when_read_again(make_world):
    """Regression (dead letters sent again after a re-read): a slow request holds a
    partition's commit back while later records of the same partition are dead-lettered;
    the pod is then killed, and the next owner reads them all again. Delivered ones are
    skipped by their delivered marker; dead-lettered ones must be skipped too (dead-letter
    marker), not sent to the endpoint again nor dead-lettered twice."""
    w = make_world(partitions=1, http_timeout_ms=5000, lease_ms=8000)
    rcv = w.receiver()
    slow = w.endpoints(rcv, "slow", 1, "slow/3000")
    bad = w.endpoints(rcv, "bad", 1, "status/400")
    w.produce_for(slow, 4)
    w.produce_for(bad, PROFILE.n(40))
    a = w.consumer("a")
    n_bad = PROFILE.n(40)
    # every dead letter recorded on Kafka (its fate durable) while the slow requests still
    # hold the partition's commit back
    wait_until(lambda: sum(1 for o in w.outcomes() if o["state"] == "dead_letter") >= n_bad,
               PROFILE.t(30), 0.2, "every bad event dead-lettered once")
    time.sleep(0.3)
    assert not [o for o in w.outcomes() if o["endpoint"] == slow[0]], "slow ones finished"
    w.mark("fault_start")
    w.kill9(a)
    w.consumer("b")
    w.mark("fault_end")
    figures = verify(w, rcv, dup_bound=4, dup_reason="the slow requests in flight at the kill")
    sent_bad = sum(1 for line in rcv.ledger() if line["endpoint"] == bad[0])
    figures["bad_requests"] = sent_bad
    assert sent_bad == n_bad, f"{sent_bad - n_bad} dead-lettered events were sent again"
    dls = [o for o in w.outcomes() if o["endpoint"] == bad[0] and o["state"] == "dead_letter"]
    assert len(dls) == n_bad, f"{len(dls) - n_bad} dead letters recorded twice"


def test_record_read_again_while_its_retry_chain_runs_is_not_sent(make_world):
    """Regression (a re-read copy sent next to its retry chain): every event of an endpoint
    that always fails has its retry job in Redis when the pod is killed; a slow request
    earlier in the partition held its commit back, so the next pod reads them all again. The
    copies must leave the delivery to the chains: exactly max_attempts requests per event
    and one dead letter each, not an extra attempt 1 per copy (in the soak's broker restarts
    such a copy was even delivered after its chain's dead letter)."""
    w = make_world(partitions=1, http_timeout_ms=9000, lease_ms=12000, retry_base_ms=3000,
                   retry_cap_ms=3000, max_attempts=3, breaker_threshold=1000)
    rcv = w.receiver()
    slow = w.endpoints(rcv, "slow", 1, "slow/7000")
    down = w.endpoints(rcv, "down", 1, "status/500")
    w.produce_for(slow, 1)
    w.produce_for(down, PROFILE.n(20))
    want = {(e["id"], e["endpoint"]) for e in w.events if e["endpoint"] == down[0]}
    a = w.consumer("a")
    wait_until(lambda: want <= {(o["id"], o["endpoint"]) for o in w.outcomes()
                                if o["state"] == "retry_scheduled"},
               PROFILE.t(30), 0.2, "every failing event has its retry chain")
    w.mark("fault_start")
    w.kill9(a)  # the slow request still runs: nothing past it was committed
    w.consumer("b")
    w.mark("fault_end")
    figures = verify(w, rcv, dup_bound=1, dup_reason="the slow request in flight at the kill")
    per = collections.Counter(line["webhook_id"] for line in rcv.ledger()
                              if line["endpoint"] == down[0])
    extra = sum(n - 3 for n in per.values() if n > 3)
    figures["extra_attempts"] = extra
    # a retry the killed pod had in flight is sent again once its lease runs out: at most
    # the pod's in-flight cap for the endpoint; a copy per event (20 here) is the bug
    cap = int(w.env["SLUICE_MAX_INFLIGHT_PER_ENDPOINT"])
    assert extra <= cap, f"{extra} extra requests: copies sent next to their retry chains"
    dls = collections.Counter(o["id"] for o in w.outcomes()
                              if o["endpoint"] == down[0] and o["state"] == "dead_letter")
    assert set(dls.values()) == {1} and len(dls) == len(want), "dead letters recorded twice"
