"""Chaos scenarios on the services: Kafka broker restart (under the consumers, and under
sluice-api with retrying clients), a frozen broker under sluice-api, Redis restart (AOF keeps
the schedule), Redis loss followed by `sluicectl retries rebuild`, a PostgreSQL outage under
the recorder, and delivered markers across a Redis outage. The stack is the suite's own
(conftest), so killing its services is safe. The scenarios that need sluice-recorder or
`sluicectl retries rebuild` fail in a build without them."""

import collections
import json
import os
import signal
import time

import pytest

from chaos_lib import PROFILE, accepted_pairs, kafka_lag, psql, redis_cmd, verify, wait_until


def workload(w, rcv, per_ep, ok_eps=5, flaky_eps=2, delay_ms=20):
    eps = w.endpoints(rcv, "ok", ok_eps, "ok", f"?delay_ms={delay_ms}")
    eps += w.endpoints(rcv, "fl", flaky_eps, "flaky/50", f"?delay_ms={delay_ms}")
    eps += w.endpoints(rcv, "bad", 1, "status/400")
    w.produce_for(eps, per_ep)
    return eps


def cap_of(w, eps):
    return min(int(w.env["SLUICE_MAX_INFLIGHT"]),
               int(w.env["SLUICE_MAX_INFLIGHT_PER_ENDPOINT"]) * len(eps))


def test_kafka_broker_restart(make_world, stack):
    """kill -9 of the only broker mid-run, restart after a pause. Consumers keep delivering
    what they hold, outcomes wait in the producer queue, offsets wait for them; after the
    restart the group re-forms and everything settles. Nothing lost; duplicates only from
    work the group re-reads after the coordinator expired the members."""
    w = make_world(max_inflight_per_endpoint=2)
    rcv = w.receiver()
    eps = workload(w, rcv, per_ep=PROFILE.n(150), delay_ms=50)
    w.recorder()
    w.consumer("a")
    w.consumer("b")
    downtime = []
    for i in range(PROFILE.repeats):
        w.wait_progress(rcv, 0.2 + 0.2 * i, timeout=120)
        if i == 0:
            w.mark("fault_start")
        downtime.append(round(stack.bounce_kafka(down_s=3.0), 1))
    w.mark("fault_end")
    w.notes["broker_down_s"] = downtime
    # The pods held their records in memory and kept delivering during the outage; new
    # events produced now can only arrive once the group has re-formed: recovery_s is the
    # time until the first of them is delivered.
    w.produce_for(eps[:-1], PROFILE.n(30))
    cap = cap_of(w, eps)
    verify(w, rcv, dup_bound=2 * PROFILE.repeats * cap,
           dup_reason="requests in flight when the group re-formed (two pods)",
           settle_timeout=120)


def test_redis_restart_aof_keeps_schedule(make_world, stack):
    """kill -9 of Redis while retry jobs wait in it, restart from the AOF. First with both
    pods frozen (SIGSTOP, well inside the session timeout), so the schedule can be compared
    exactly: every job id must still be there after the restart. Then with the pods running
    into the outage: they reconnect, markers fail open meanwhile, nothing is lost."""
    # request timeout well above the freeze (about 1 s): a request answered while its pod was
    # frozen must not time out on waking up (that would be a retry of an accepted delivery)
    w = make_world(retry_base_ms=500, retry_cap_ms=2000, max_attempts=12,
                   breaker_threshold=1000, http_timeout_ms=6000, lease_ms=9000)
    rcv = w.receiver()
    eps = workload(w, rcv, per_ep=PROFILE.n(100), flaky_eps=3)
    pods = [w.consumer("a"), w.consumer("b")]
    wait_until(lambda: w.redis_state()[2] >= 20, PROFILE.t(60), 0.1, "retry jobs in Redis")
    w.mark("fault_start")
    # 1. frozen pods: the exact AOF check
    for p in pods:
        p.stop(signal.SIGSTOP)
    time.sleep(0.2)
    before = w.job_ids()
    stack.kill_redis(signal.SIGKILL)
    time.sleep(0.5)
    stack.start_redis()  # quick: the freeze stays well below the request timeout
    after = w.job_ids()
    for p in pods:
        p.stop(signal.SIGCONT)
    w.notes["jobs_before_kill"] = len(before)
    w.notes["jobs_lost_by_restart"] = len(before - after)
    assert before <= after, f"{len(before - after)} of {len(before)} jobs lost by the restart"
    # 2. running pods meet the outage (with retry jobs waiting, as long as there are any)
    for i in range(PROFILE.repeats):
        deadline = time.monotonic() + PROFILE.t(20)
        while w.redis_state()[2] < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        stack.kill_redis(signal.SIGKILL)
        time.sleep(2)
        stack.start_redis()
    w.mark("fault_end")
    cap = cap_of(w, eps)
    verify(w, rcv, dup_bound=2 * PROFILE.repeats * cap,
           dup_reason="deliveries whose marker write failed while Redis was down and whose "
                      "job came back after its lease",
           settle_timeout=120)


def test_redis_flushall_then_retries_rebuild(make_world, stack):
    """Redis loses everything (FLUSHALL) while every delivery waits for a retry. The
    recorder's history knows what was scheduled: `sluicectl retries rebuild` puts it back,
    and everything is delivered once the endpoints recover. Retries are spread over 8 s
    (full jitter) and attempts are plenty, so at the loss every delivery is in Redis."""
    w = make_world(retry_base_ms=8000, retry_cap_ms=8000, max_attempts=50,
                   breaker_threshold=1000)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "down", 4, "status/503")
    w.produce_for(eps, PROFILE.n(40))
    w.recorder()
    ca, cb = w.consumer("a"), w.consumer("b")
    # every delivery failed once and waits in Redis; the history has recorded that
    want = w.want()

    def all_scheduled():
        return want <= {(o["id"], o["endpoint"]) for o in w.outcomes()
                        if o["state"] == "retry_scheduled"}

    wait_until(all_scheduled, PROFILE.t(60), 0.5, "every delivery scheduled for a retry")
    # (retries keep coming, so the recorder's lag is rarely 0 at any instant: ask the
    # history itself)
    sql = (f"select count(*) from deliveries where event_id like 'evt\\_{w.tag}\\_%' "
           f"and state in ('retry_scheduled', 'deferred')")
    wait_until(lambda: int(psql(w.env["SLUICE_PG_DSN"], sql)[0][0]) == len(want),
               PROFILE.t(60), 0.5, "the history knows every scheduled retry")
    w.mark("fault_start")
    jobs = w.redis_state()[2]
    redis_cmd(w.redis_url, "FLUSHALL")
    w.notes["jobs_lost"] = jobs
    # the loss does not go unseen: a consumer finds the database's binding gone within its
    # 5-s look, says so and binds it again (the one that looks first; the other then finds
    # the key in place)
    wait_until(lambda: ca.events("redis_state_lost") or cb.events("redis_state_lost"),
               PROFILE.t(30), 0.5, "a consumer to report the lost state")
    assert redis_cmd(w.redis_url, "GET", "sluice:owner"), "bound again"
    for ep in eps:
        w.set_url(rcv, ep, "ok")
    r = w.ctl("retries", "rebuild", "--json")
    assert r.returncode in (0, 1), f"sluicectl retries rebuild failed: {r.stderr}"
    res = json.loads(r.stdout)
    ours_lost = [d for d in res["not_recoverable_deliveries"]
                 if (d["event_id"], d["endpoint_id"]) in want]
    w.notes["rebuild"] = {k: res[k] for k in ("open_deliveries", "restored_from_history",
                                              "restored_from_kafka", "already_scheduled",
                                              "not_recoverable")}
    assert not ours_lost, f"rebuild could not restore {len(ours_lost)}: {ours_lost[:3]}"
    # (deliveries of other scenarios' worlds share the history database; only ours count)
    w.mark("fault_end")
    verify(w, rcv, dup_bound=0, dup_reason="nothing was delivered before the loss",
           settle_timeout=60)


def test_postgres_outage_under_recorder(make_world, stack):
    """PostgreSQL goes down (immediate shutdown) under the recorder: deliveries never pause
    (consumers do not need the database), the recorder holds its batch and resumes; the
    history then agrees with the receivers' ledger."""
    w = make_world(max_inflight_per_endpoint=2)
    rcv = w.receiver()
    eps = workload(w, rcv, per_ep=PROFILE.n(150), delay_ms=50)
    w.recorder()
    w.consumer("a")
    w.consumer("b")
    w.wait_progress(rcv, 0.15, timeout=90)
    w.mark("fault_start")
    stack.stop_pg_immediate()
    t_down = time.time()
    at_down = w.accepted_count(rcv)
    outage = max(8.0, 4.0 * PROFILE.repeats)
    time.sleep(outage)
    during = w.accepted_count(rcv) - at_down
    stack.restart_down()
    w.mark("fault_end")
    t_up = time.monotonic()
    rec_lag = None
    while time.monotonic() - t_up < PROFILE.t(60):
        rec_lag = kafka_lag(w.env, w.env["SLUICE_RECORDER_GROUP"],
                            w.env["SLUICE_TOPIC_OUTCOMES"])[0]
        if rec_lag == 0:
            break
        time.sleep(0.25)
    w.notes["history_catchup_s"] = round(time.monotonic() - t_up, 1) if rec_lag == 0 else None
    w.notes["pg_down_s"] = round(time.time() - t_down, 1)
    w.notes["delivered_during_outage"] = during
    assert during > 0, "deliveries paused while PostgreSQL was down"
    cap = cap_of(w, eps)
    verify(w, rcv, dup_bound=0 * cap, dup_reason="no consumer fault: none expected",
           settle_timeout=120)


def test_markers_written_during_a_redis_outage_are_kept(make_world, stack):
    """Regression (delivered markers lost in a Redis outage): deliveries go on while Redis is
    down (marker writes fail open), a slow request holds the partition's commit back, Redis
    comes back, then the pod is killed and the next one reads everything again. The markers
    of what was delivered during the outage must have been written once Redis answered, so
    the re-read sends none of it again. The same for dead letters: a 400 endpoint's letters
    dead-lettered during the outage get their dead markers once Redis answers (they were
    lost), so the re-read does not send them again either."""
    w = make_world(partitions=1, http_timeout_ms=9000, lease_ms=12000,
                   max_inflight_per_endpoint=2)
    rcv = w.receiver()
    slow = w.endpoints(rcv, "slow", 1, "slow/7000")
    ok = w.endpoints(rcv, "ok", 1, "ok", "?delay_ms=50")
    bad = w.endpoints(rcv, "bad", 1, "status/400", "?delay_ms=50")
    w.produce_for(slow, 1)
    w.produce_for(ok, PROFILE.n(200))
    w.produce_for(bad, PROFILE.n(200))
    a = w.consumer("a")
    w.wait_progress(rcv, 0.1, timeout=60)
    w.mark("fault_start")
    stack.kill_redis(signal.SIGKILL)
    at_kill = w.accepted_count(rcv)
    time.sleep(2)
    during = w.accepted_count(rcv) - at_kill
    stack.start_redis()
    time.sleep(2)  # the held markers are written about a second after Redis answers
    w.kill9(a)     # the slow request is still running: nothing past it was committed
    w.consumer("b")
    w.mark("fault_end")
    w.notes["delivered_while_redis_down"] = during
    assert during > 0, "nothing was delivered while Redis was down"
    # A delivered marker waits up to MARKS_DELAY_MS (5 ms) for its batch while the next
    # requests are already sent: the kill can find 2 ok requests in flight and the 2 before
    # them answered with their markers not yet written, besides the slow one.
    verify(w, rcv, dup_bound=5, dup_reason="the requests in flight at the kill (2 ok + 1 "
           "slow) and the 2 answered whose markers still waited for their batch",
           settle_timeout=60)
    sent = collections.Counter(line["webhook_id"] for line in rcv.ledger()
                               if line["endpoint"] == bad[0])
    twice = sum(n - 1 for n in sent.values())
    w.notes["dead_letters_sent_again"] = twice
    assert len(sent) == PROFILE.n(200)
    # A dead marker is written once the dead letter's outcome is acknowledged by Kafka (the
    # outcome producer lingers up to 50 ms, then acks=all), so besides the 2 bad requests in
    # flight at the kill, those answered in the last 50-70 ms may still wait for theirs: at
    # 2 requests of 50 ms at a time, up to 3. The regression this guards against re-sent
    # every letter dead-lettered during the outage (tens).
    assert twice <= 5, (f"{twice} dead letters sent again (2 may be in flight at the kill, 3 "
                        "more answered with their outcomes not yet acknowledged)")


def test_redis_outage_with_dedup_closed_resends_nothing(make_world, stack):
    """dedup_fail_open=false (finding F2): a pod that reads work again while Redis is down
    holds it instead of sending it unchecked. A slow request holds the partition's commit
    back; Redis goes down, the pod is killed, and the idle second pod takes the partition
    during the outage and re-reads everything delivered so far. It must send nothing while
    Redis is down and, once Redis answers, skip every record its marker says was delivered;
    and while it holds them it keeps serving the group (a third pod leaves: the rebalance
    completes at once, not after max.poll.interval.ms). (With the default, fail open, it
    sends the whole re-read again: a duplicate per delivered event.)"""
    w = make_world(partitions=1, http_timeout_ms=9000, lease_ms=12000,
                   max_inflight_per_endpoint=2, dedup_fail_open="false")
    rcv = w.receiver()
    slow = w.endpoints(rcv, "slow", 1, "slow/7000")
    ok = w.endpoints(rcv, "ok", 1, "ok", "?delay_ms=50")
    w.produce_for(slow, 1)
    w.produce_for(ok, PROFILE.n(200))
    # one partition: one of them works
    pods = {"a": w.consumer("a"), "b": w.consumer("b"), "c": w.consumer("c")}
    w.wait_progress(rcv, 0.25, timeout=60)

    def owns(pod):  # the pod's last assignment gave it the partition
        lines = [line for line in pod.logs().splitlines() if "partitions_assigned" in line]
        return bool(lines) and "assigned 1 partition" in lines[-1]

    wait_until(lambda: sum(owns(p) for p in pods.values()) == 1, PROFILE.t(30), 0.2,
               "one pod owns the partition")
    busy = next(p for p in pods.values() if owns(p))
    idle = [p for p in pods.values() if p is not busy]
    before = [p.logs().count("assigned 1 partition") for p in idle]
    w.mark("fault_start")
    # frozen first: what it delivers while Redis is down would lose its markers with it (they
    # wait in memory for Redis) and be sent again, a different fault than this one
    busy.stop(signal.SIGSTOP)
    # SIGTERM: Redis writes its AOF out before it goes, so the outage alone is tested (a
    # kill -9 also loses up to a second of marker writes: appendfsync everysec, a separate,
    # documented trade-off)
    stack.kill_redis(signal.SIGTERM)
    down_at = time.time() * 1000
    w.kill9(busy)  # the slow request is still running: nothing past it was committed
    delivered_before = w.accepted_count(rcv)
    def taker():
        return next((p for p, b in zip(idle, before)
                     if p.logs().count("assigned 1 partition") > b), None)

    holder = wait_until(taker, PROFILE.t(30), 0.2,
                        "an idle pod takes the partition while Redis is down")
    time.sleep(3)  # it has re-read the partition by now, with Redis still down
    # the holding pod keeps serving the group: when the third pod leaves, the rebalance
    # completes within seconds (a pod that stopped polling while it held records kept every
    # rebalance waiting for max.poll.interval.ms, 5 minutes)
    other = next(p for p in idle if p is not holder)
    n_assigned = holder.logs().count("partitions_assigned")
    assert other.term(timeout=PROFILE.t(30)) == 0, other.logs()[-2000:]
    wait_until(lambda: holder.logs().count("partitions_assigned") > n_assigned, PROFILE.t(30),
               0.2, "the holding pod serves a rebalance while Redis is down")
    up_at = time.time() * 1000
    sent_while_down = sum(1 for line in rcv.ledger()
                          if line["endpoint"] == ok[0] and down_at + 500 <= line["ts_ms"] < up_at)
    stack.start_redis()
    w.mark("fault_end")
    w.notes["delivered_before_outage"] = delivered_before
    w.notes["sent_while_redis_down"] = sent_while_down
    assert delivered_before > 10, "too little was delivered before the outage to tell"
    assert sent_while_down == 0, f"{sent_while_down} requests sent without a duplicate check"
    # A delivered marker waits up to MARKS_DELAY_MS (5 ms) for its batch while the next
    # requests are already sent: a freeze can find 2 ok requests in flight and the 2 before
    # them answered with their markers not yet written, besides the slow one.
    verify(w, rcv, dup_bound=5, dup_reason="the requests in flight at the freeze (2 ok + 1 "
           "slow) and the 2 answered whose markers still waited for their batch",
           settle_timeout=60)


def api_publish(api, body, key, idem):
    """One publish to sluice-api on a fresh connection: (status, headers, answer); status None
    when the connection failed before an answer."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    try:
        c.request("POST", "/v1/events", body=json.dumps(body),
                  headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                           "Idempotency-Key": idem})
        r = c.getresponse()
        text = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(text or b"null")
    except (OSError, http.client.HTTPException):
        return None, {}, None
    finally:
        c.close()


@pytest.mark.parametrize("how", ["restarted", "frozen"])
def test_api_publishes_through_a_broker_outage(make_world, stack, how):
    """sluice-api while its only broker is out, four clients publishing fan-out events (3
    subscribed endpoints), each retrying the same request under its Idempotency-Key until it
    is accepted, as docs/API.md tells clients to. The outage: the broker killed and restarted
    (connections refused), or frozen with SIGSTOP for 6 s (connections open, nothing answers:
    what a network partition looks like to a client). During the outage publishes answer 503
    with Retry-After (Kafka did not acknowledge them within api_publish_timeout_ms);
    afterwards every event is accepted, and each endpoint receives each accepted event exactly
    once: a record Kafka took whose acknowledgement was lost or late is published again by
    the retry, and the consumers' delivered markers suppress the copy."""
    import threading
    w = make_world()
    rcv = w.receiver()
    eps = w.endpoints(rcv, "apif", 3, "ok", "", "--types", f"ch{w.tag}.*")
    key = w.api_key("publish")
    api = w.api(api_publish_timeout_ms=2000)
    w.consumer("a")
    lock = threading.Lock()
    accepted, statuses, outage = {}, collections.Counter(), {"on": False, "503": 0}
    failures = []
    per_client = PROFILE.n(30)

    def client(n):
        try:
            for i in range(per_client):
                body = {"type": f"ch{w.tag}.paid", "body": {"client": n, "i": i}}
                idem = f"c{n}-{i}-{w.tag}"
                t0 = time.monotonic()
                while True:
                    t_req = time.monotonic()
                    st, hdrs, ans = api_publish(api, body, key, idem)
                    took = time.monotonic() - t_req
                    with lock:
                        statuses[st] += 1
                        if st == 503 and outage["on"]:
                            outage["503"] += 1
                        if st == 503:
                            outage["slowest_503"] = max(outage.get("slowest_503", 0), took)
                    if st == 202:
                        assert sorted(ans["endpoints"]) == sorted(eps), ans
                        with lock:
                            accepted[idem] = ans["id"]
                        break
                    assert st in (503, 409, None), (st, ans)
                    if st == 503:
                        assert int(hdrs["retry-after"]) >= 1, hdrs
                    assert time.monotonic() - t0 < 180, f"{idem} never accepted"
                    time.sleep(0.5)
                time.sleep(0.02)
        except AssertionError as e:  # reported by the main thread
            with lock:
                failures.append(f"client {n}: {e}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(accepted) >= 10, 60, 0.2, "publishes before the fault")
    w.mark("fault_start")
    with lock:
        outage["on"] = True
    if how == "restarted":
        w.notes["broker_down_s"] = round(stack.bounce_kafka(down_s=3.0), 1)
    else:
        pid = stack.kafka_pid()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(6.0)
        finally:
            os.kill(pid, signal.SIGCONT)
        w.notes["broker_down_s"] = round(time.monotonic() - t0, 1)
    with lock:
        outage["on"] = False
    w.mark("fault_end")
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "a client never finished"
    assert not failures, failures
    print(f"sluice-api answers by status: {dict(statuses)}; 503 during the outage: "
          f"{outage['503']}; broker down {w.notes['broker_down_s']} s")
    assert len(accepted) == 4 * per_client
    assert outage["503"] > 0, f"no 503 while the broker was out: {dict(statuses)}"
    # api_publish_timeout_ms (2 s) holds: librdkafka scans a broker's message timeouts only
    # when its thread wakes, which reconnect.backoff.max.ms (the library sets 1 s, not 10)
    # bounds while the broker refuses connections
    assert outage["slowest_503"] <= PROFILE.t(4.0), \
        f"a 503 took {outage['slowest_503']:.1f} s for a 2-s publish timeout"
    want = {(eid, ep) for eid in accepted.values() for ep in eps}
    wait_until(lambda: want <= set(accepted_pairs(rcv.ledger())), 120, 1.0,
               "every accepted event delivered to each endpoint")
    # every record read and settled (copies included) before the duplicate check
    wait_until(lambda: kafka_lag(w.env, w.env["SLUICE_CONSUMER_GROUP"],
                                 w.env["SLUICE_TOPIC_DELIVERIES"], w.dir)[0] == 0,
               60, 0.5, "the consumer group's lag at 0")
    time.sleep(0.5)
    acc = accepted_pairs(rcv.ledger())
    assert set(acc) == want, set(acc) ^ want
    twice = {k: v for k, v in acc.items() if v > 1}
    assert not twice, f"{len(twice)} (event, endpoint) pairs delivered more than once"
