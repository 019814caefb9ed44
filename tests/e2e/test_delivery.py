"""Delivery invariants of sluice-consumer against the real stack (issue: the consumer).

Every test drives real processes: sluice-produce publishes, one or two sluice-consumer
processes deliver to the scripted sluice-receiver, and the receiver's ledger plus the outcome
records on Kafka are the oracles.
"""

import collections
import os
import signal
import subprocess
import time

import pytest

from sluice_e2e import CLUSTER_SCHEME, event, final_states, is_cluster_url, redis_all, wait_until


def delivered_ids(outcomes):
    return {(o["id"], o["endpoint"]) for o in outcomes if o["state"] == "delivered"}


def ledger_ok(receiver):
    return [l for l in receiver.ledger() if 200 <= l["status"] < 300]


def test_healthy_every_event_exactly_once_and_signed(make_world):
    w = make_world()
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    eps = [w.add_endpoint(f"ok{i}_{w.tag}", rcv.url("ok", f"ok{i}_{w.tag}")) for i in range(3)]
    events = [event(ep, i, w.tag) for ep in eps for i in range(100)]
    r = w.produce(events)
    assert r.returncode == 0, r.stderr
    c = w.consumer()
    want = {(e["id"], e["endpoint"]) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 90, 1.0, "all delivered")
    assert c.term() == 0, c.logs()[-3000:]
    oks = ledger_ok(rcv)
    per = collections.Counter((l["webhook_id"], l["endpoint"]) for l in oks)
    assert set(per) == want
    assert max(per.values()) == 1, "an event reached its endpoint twice"
    assert all(l["sig_ok"] is True for l in rcv.ledger()), "a signature did not verify"
    outs = w.outcomes()
    assert all(o["attempt"] == 1 for o in outs if o["state"] == "delivered")
    assert {o["state"] for o in outs} == {"delivered"}
    assert all(o["lat_us"] > 0 and o["pod"] == "c0" for o in outs)


def test_retries_classes_and_retry_after(make_world):
    w = make_world(retry_base_ms=200, retry_cap_ms=800, max_attempts=3,
                   retry_after_max_ms=10000, http_timeout_ms=1000,
                   http_connect_timeout_ms=500, lease_ms=5000)
    rcv = w.receiver()
    w.add_endpoint("flaky" + w.tag, rcv.url("flaky_n/2", "flaky"))
    w.add_endpoint("bad" + w.tag, rcv.url("status/400", "bad"))
    w.add_endpoint("down" + w.tag, rcv.url("status/503", "down"))
    w.add_endpoint("slow" + w.tag, rcv.url("slow/3000", "slow"))
    w.add_endpoint("ra" + w.tag, rcv.url("retryafter/2", "ra"), "--max-attempts", "2")
    eps = ["flaky", "bad", "down", "slow", "ra"]
    events = [event(ep + w.tag, i, w.tag) for ep in eps for i in range(3)]
    assert w.produce(events).returncode == 0
    c = w.consumer()

    def settled():
        fin = final_states(w.outcomes())
        return len(fin) == len(events) and all(
            o["state"] in ("delivered", "dead_letter") for o in fin.values())

    wait_until(settled, 120, 1.0, "every event delivered or dead-lettered")
    assert c.term() == 0
    outs = w.outcomes()
    by_ep = collections.defaultdict(list)
    for o in outs:
        by_ep[o["endpoint"]].append(o)
    fin = final_states(outs)
    # 500 twice then 200: two retries, delivered on attempt 3
    for i in range(3):
        o = fin[(f"evt_{w.tag}_flaky{w.tag}_{i}", "flaky" + w.tag)]
        assert o["state"] == "delivered" and o["attempt"] == 3
    # 400: permanent, dead-lettered at once, payload kept for replay
    for o in by_ep["bad" + w.tag]:
        assert o["state"] == "dead_letter" and o["attempt"] == 1 and o["http"] == 400
        assert o["env_len"] > 0
    # 503 every time: exactly max_attempts attempts, then dead letter
    down = [o for o in by_ep["down" + w.tag]]
    for i in range(3):
        mine = sorted((o for o in down if o["id"] == f"evt_{w.tag}_down{w.tag}_{i}"),
                      key=lambda o: o["attempt"])
        assert [o["state"] for o in mine] == ["retry_scheduled", "retry_scheduled",
                                              "dead_letter"]
        for o in mine[:-1]:
            assert 0 <= o["next_ms"] - o["ts_ms"] <= 800 + 100  # full jitter within cap
    # slow past the 1 s timeout: retried as "timeout"
    slow = by_ep["slow" + w.tag]
    assert any(o["err"] == "timeout" and o["state"] == "retry_scheduled" for o in slow)
    # 429 with Retry-After: 2 honoured (above the 800 ms cap), then dead after 2 attempts
    ra = [o for o in by_ep["ra" + w.tag] if o["state"] == "retry_scheduled"]
    assert ra and all(o["next_ms"] - o["ts_ms"] >= 1990 for o in ra)
    hits = collections.defaultdict(list)
    for l in rcv.ledger():
        if l["endpoint"] == "ra":
            hits[l["webhook_id"]].append(l["ts_ms"])
    for ts in hits.values():
        ts.sort()
        assert len(ts) == 2 and ts[1] - ts[0] >= 1900


def test_breaker_one_probe_across_two_consumers(make_world):
    w = make_world(max_attempts=50, retry_base_ms=100, retry_cap_ms=300,
                   breaker_cooldown_ms=1000, breaker_cooldown_max_ms=4000)
    rcv = w.receiver()
    ep = "brk" + w.tag
    w.add_endpoint(ep, rcv.url("status/500", ep), "--breaker-threshold", "3",
                   "--breaker-cooldown-ms", "1000")
    events = [event(ep, i, w.tag) for i in range(30)]
    assert w.produce(events).returncode == 0
    # c1 runs two delivery loops: three breaker owners in all, still one probe at a time
    c1, c2 = w.consumer("c1", consumer_threads=2), w.consumer("c2")
    # let the breaker open and go through a few failed probes (1 s, 2 s, 4 s, 4 s cooldowns)
    time.sleep(14)
    hits = sorted(l["ts_ms"] for l in rcv.ledger() if l["endpoint"] == ep)
    assert len(hits) >= 3
    # after the threshold is reached, requests come one at a time: single probes, spaced by
    # the (doubling) cooldown, never two pods probing together
    opened_at = hits[2]
    probes = [t for t in hits if t > opened_at + 500]
    assert 2 <= len(probes) <= 5, f"probes after opening: {len(probes)}"
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert all(g >= 900 for g in gaps), f"two probes too close together: {gaps}"
    assert gaps[-1] >= 1.6 * 1000, f"cooldown did not double: {gaps}"
    # deferral spends no attempt: outcomes while open are "deferred" with attempt 0
    outs = w.outcomes()
    assert any(o["state"] == "deferred" and o["err"] == "breaker_open" for o in outs)
    spent = collections.Counter(o["id"] for o in outs if o["state"] == "retry_scheduled")
    assert max(spent.values()) <= 6
    # the endpoint recovers: the next probe succeeds, the breaker closes, everything flows
    r = w.ctl("endpoints", "update", ep, "--url", rcv.url("ok", ep))
    assert r.returncode == 0, r.stderr
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 1.0, "delivery after recovery")
    assert c1.term() == 0 and c2.term() == 0


def test_loops_of_one_process_share_partitions_and_limits(make_world):
    # consumer_threads=2: two delivery loops in one process, each a group member of its own.
    # max_inflight stays a per-process bound (2 per loop); the receiver answers after 300 ms,
    # so no 270 ms window may see more than 4 arrivals.
    w = make_world(partitions=4, max_inflight=4)
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    eps = [w.add_endpoint(f"l{i}{w.tag}", rcv.url("slow/300", f"l{i}{w.tag}"))
           for i in range(16)]
    events = [event(ep, i, w.tag) for ep in eps for i in range(5)]
    assert w.produce(events).returncode == 0
    c = w.consumer(consumer_threads=2)
    want = {(e["id"], e["endpoint"]) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 90, 1.0, "all delivered")
    assert c.term() == 0, c.logs()[-3000:]
    oks = ledger_ok(rcv)
    per = collections.Counter((l["webhook_id"], l["endpoint"]) for l in oks)
    assert set(per) == want and max(per.values()) == 1
    assert all(l["sig_ok"] is True for l in rcv.ledger())
    outs = w.outcomes()
    # the second loop joining the group may move partitions the first had started on: a
    # record read again is not sent again but reported as a duplicate, and its delivered
    # outcome again from the marker (the same attempt and ts: the same history row), as
    # between two pods. So: one delivery, one history row, per event.
    assert {o["state"] for o in outs} <= {"delivered", "duplicate"}
    rows = collections.defaultdict(set)
    for o in outs:
        if o["state"] == "delivered":
            rows[(o["id"], o["endpoint"])].add((o["attempt"], o["ts_ms"]))
    assert set(rows) == want
    assert all(len(r) == 1 for r in rows.values()), "an event delivered twice"
    assert all(o["pod"] == "c0" for o in outs), "outcomes name the process, not the loop"
    # both loops took partitions (4 in all) and delivered; the last stats lines add up
    assigned = {}
    for ev in c.events("partitions_assigned"):
        assigned[ev["loop"]] = int(ev["msg"].split()[1])
    assert set(assigned) == {0, 1} and sum(assigned.values()) == 4, assigned
    delivered = {ev["loop"]: ev["delivered"] for ev in c.events("stats")}
    assert set(delivered) == {0, 1} and sum(delivered.values()) == len(events), delivered
    assert all(n > 0 for n in delivered.values()), delivered
    arrivals = sorted(l["ts_ms"] for l in rcv.ledger())
    busiest = max(sum(1 for t in arrivals[i:] if t < a + 270) for i, a in enumerate(arrivals))
    assert busiest <= 4, f"{busiest} requests in flight at once, max_inflight is 4"
    # both loops committed their offsets on SIGTERM: a new consumer reads nothing again
    c2 = w.consumer("c1")
    wait_until(lambda: c2.events("partitions_assigned"), 60, 0.3,
               "the second consumer's assignment")
    time.sleep(3)
    assert len(rcv.ledger()) == len(events)
    assert c2.term() == 0
    assert len(w.outcomes()) == len(outs), "records were read again after the clean stop"


def test_full_intake_keeps_fetched_records_when_it_keeps_pace(make_world):
    # max_inflight 20 + max_queued 100: intake is full at 120 jobs in memory, and all 1,000
    # records are fetched at once. Endpoints that answer at once free room continuously:
    # the loop must take records only as room frees (never more than 120 in memory) and
    # must not pause its partitions, which in librdkafka 2.0.2 throws the fetched records
    # away to fetch them again (a loop that paused at every burst lost a third of its rate).
    w = make_world(partitions=1, max_inflight=20, max_queued=100,
                   max_inflight_per_endpoint=20)
    rcv = w.receiver()
    eps = [w.add_endpoint(f"b{i}{w.tag}", rcv.url("ok", f"b{i}")) for i in range(10)]
    events = [event(ep, i, w.tag) for ep in eps for i in range(100)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], e["endpoint"]) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 90, 0.5, "all delivered")
    assert c.term() == 0, c.logs()[-3000:]
    per = collections.Counter(l["webhook_id"] for l in ledger_ok(rcv))
    assert len(per) == len(events) and max(per.values()) == 1
    peak = max(ev["in_memory_max"] for ev in c.events("stats"))
    assert 100 <= peak <= 120, f"{peak} jobs in memory: intake must fill to 120 and stop there"
    assert c.events("intake_paused") == [], "paused while it kept pace: " + str(
        c.events("intake_paused"))


def test_stuck_intake_pauses_then_resumes_and_serves_a_rebalance(make_world):
    # Endpoints that answer after 3 s: the loop fills (20 in flight, 100 queued) and can take
    # no record for seconds. It must pause its partitions after about a second (before any
    # answer), with the 80 records it fetched beyond its cap counted, keep polling, and
    # resume once it is below 70 jobs: the queues of the endpoints whose requests have been out
    # for 2 s unanswered move to the Redis schedule (heads kept; endpoints waiting for one of
    # the 20 request slots are not stuck and stay), then answers make the rest of the room. A
    # second consumer joining then gets its share, and every event is delivered once across
    # the two.
    w = make_world(partitions=2, max_inflight=20, max_queued=100,
                   max_inflight_per_endpoint=20, shutdown_drain_ms=5000)
    rcv = w.receiver()
    eps = [w.add_endpoint(f"s{i}{w.tag}", rcv.url("slow/3000", f"s{i}")) for i in range(10)]
    events = [event(ep, i, w.tag) for ep in eps for i in range(20)]
    assert w.produce(events).returncode == 0
    t0 = time.monotonic()
    c = w.consumer()
    paused = wait_until(lambda: c.events("intake_paused"), 30, 0.1, "the stuck loop's pause")
    took = time.monotonic() - t0
    assert paused[0]["in_memory"] == 120, paused[0]
    assert paused[0]["fetched"] >= 60, paused[0]  # the 80 beyond the cap, once fetched
    assert not ledger_ok(rcv), f"paused after {took:.1f}s, once answers had made room"
    resumed = wait_until(lambda: c.events("intake_resumed"), 30, 0.2, "the resume")
    assert resumed[0]["reason"] == "room", resumed[0]
    spilled = c.events("stuck_queues_spilled")
    assert spilled and 1 <= spilled[0]["jobs"] <= 51, spilled  # 120 in memory, resume below 70
    c2 = w.consumer("c1")
    wait_until(lambda: c2.events("partitions_assigned"), 30, 0.2, "the new member's share")
    want = {(e["id"], e["endpoint"]) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 120, 1.0, "all delivered")
    assert c.term() == 0 and c2.term() == 0
    per = collections.Counter(l["webhook_id"] for l in ledger_ok(rcv))
    assert len(per) == len(events) and max(per.values()) == 1, "an event was sent twice"


def test_a_copy_read_while_its_delivery_is_live_is_not_sent_beside_it(make_world):
    """The same event published twice in a row (a client retrying a publish whose answer it
    lost) to an endpoint that answers after a second: the second copy is read while the first
    is still being sent, before any delivered marker exists. It must not be sent beside it:
    one request per event, the copy counted as a duplicate (both were sent). A later copy, once
    the first is delivered, is stopped by the marker as before."""
    w = make_world(partitions=1)
    rcv = w.receiver()
    ep = w.add_endpoint("tw" + w.tag, rcv.url("slow/1000", "tw"))
    evs = [event(ep, i, w.tag) for i in range(5)]
    assert w.produce(evs + evs).returncode == 0  # every event twice, back to back
    c = w.consumer()
    want = {(e["id"], ep) for e in evs}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.5, "all delivered")
    assert w.produce(evs[:1]).returncode == 0  # a third copy of the first, after the fact
    wait_until(lambda: any(o["state"] == "duplicate" for o in w.outcomes()), 30, 0.5,
               "the late copy reported as a duplicate")
    time.sleep(1.5)  # a second request, were one made, would have been answered by now
    assert c.term() == 0, c.logs()[-3000:]
    hits = collections.Counter(l["webhook_id"] for l in ledger_ok(rcv))
    assert len(hits) == 5 and max(hits.values()) == 1, hits
    stats = c.events("stats")  # the last is written at the exit
    assert stats and stats[-1]["duplicates"] == 6, stats[-1:]


def test_kill9_mid_run_loses_nothing(make_world):
    w = make_world(max_inflight=100)
    rcv = w.receiver()
    # 100 in flight x 50 ms answers: at most ~2,000/s, so 4,000 events take 2 s or more and
    # the kill lands mid-run
    eps = [w.add_endpoint(f"k{i}{w.tag}", rcv.url("ok", f"k{i}") + "?delay_ms=50")
           for i in range(4)]
    events = [event(ep, i, w.tag) for ep in eps for i in range(1000)]
    assert w.produce(events).returncode == 0
    c = w.consumer("first")
    wait_until(lambda: len(ledger_ok(rcv)) > 400, 60, 0.2, "first deliveries")
    c.kill9()
    before = len(ledger_ok(rcv))
    assert before < len(events), "the consumer finished before it could be killed"
    c2 = w.consumer("second")
    want = {(e["id"], e["endpoint"]) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()) | {
        (l["webhook_id"], l["endpoint"] + w.tag) for l in ledger_ok(rcv)}, 120, 1.0,
        "every event delivered after the restart")
    assert c2.term() == 0
    per = collections.Counter(l["webhook_id"] for l in ledger_ok(rcv))
    assert {e["id"] for e in events} <= set(per), "an event was lost"
    dups = sum(n - 1 for n in per.values())
    # only requests in flight at the kill may repeat, and those answered whose delivered
    # markers still waited for their batch (MARKS_DELAY_MS, or a slower loop turn: under ASan
    # or a loaded CPU up to a whole window of answers): twice max_inflight
    assert dups <= 2 * 100, f"{dups} duplicates exceed the in-flight bound"


def test_slow_endpoint_does_not_block_fast_ones(make_world):
    w = make_world(partitions=1, http_timeout_ms=15000, max_inflight_per_endpoint=4)
    rcv = w.receiver()
    slow = w.add_endpoint("slow" + w.tag, rcv.url("slow/10000", "slow"))
    fast = [w.add_endpoint(f"f{i}{w.tag}", rcv.url("ok", f"f{i}")) for i in range(50)]
    events = [event(slow, i, w.tag) for i in range(20)]
    for i in range(5):
        events += [event(ep, i, w.tag) for ep in fast]
    assert w.produce(events).returncode == 0  # slow first, all in one partition
    t0 = time.time()
    c = w.consumer()
    want = {(e["id"], e["endpoint"]) for e in events if e["endpoint"] != slow}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.3, "fast deliveries")
    elapsed = time.time() - t0
    assert elapsed < 9, f"fast endpoints waited {elapsed:.1f}s behind the slow one"
    # and the slow endpoint was being served all along, not skipped: its first requests
    # (4 in flight from the start) are answered after their 10 s
    slow_done = wait_until(lambda: [o for o in w.outcomes() if o["endpoint"] == slow and
                                    o["state"] == "delivered"], 40, 0.5, "slow deliveries")
    assert all(o["lat_us"] >= 9_500_000 for o in slow_done), [o["lat_us"] for o in slow_done]
    assert c.term() == 0


def test_deliveries_queued_when_their_endpoint_is_deleted_or_disabled_end_unsent(make_world):
    """Deliveries queued behind a request in flight when their endpoint is deleted, or
    disabled: they end as dead letters (`unknown_endpoint` / `endpoint_disabled`, no attempt
    spent) when their turn comes, unsent. Before, they went out with the endpoint as it was
    when they were queued, and once a later record had found the deleted endpoint gone, the
    consumer dereferenced the endpoint it no longer had (a crash)."""
    w = make_world(partitions=1, http_timeout_ms=15000)
    rcv = w.receiver()
    gone = w.add_endpoint("gone" + w.tag, rcv.url("slow/5000", "gone"), "--max-inflight", "1")
    off = w.add_endpoint("off" + w.tag, rcv.url("slow/5000", "off"), "--max-inflight", "1")
    queued = {ep: [event(ep, i, w.tag) for i in range(4)] for ep in (gone, off)}
    c = w.consumer()
    wait_until(lambda: c.events("partitions_assigned"), 60, 0.2, "the consumer to join")
    assert w.produce(queued[gone] + queued[off]).returncode == 0
    # the first request of each is in flight for 5 s, three wait behind it (max-inflight 1)
    time.sleep(1)
    assert w.ctl("endpoints", "delete", gone).returncode == 0
    assert w.ctl("endpoints", "disable", off, "--reason", "paused by test").returncode == 0
    wait_until(lambda: c.events("endpoint_deleted") and c.events("endpoint_changed"), 30, 0.2,
               "the consumer to see the delete and the disable")
    late = event(gone, 9, w.tag)
    assert w.produce([late]).returncode == 0  # its intake finds no endpoint: quarantined

    def ended():
        fin = final_states(w.outcomes())
        got = {ep: [fin.get((e["id"], ep)) for e in evs[1:]] for ep, evs in queued.items()}
        return got if all(all(v) for v in got.values()) else None
    got = wait_until(ended, 60, 0.5, "the queued deliveries to end")
    assert all(o["state"] == "dead_letter" and o["err"] == "unknown_endpoint" and
               o["attempt"] == 0 for o in got[gone]), got[gone]
    assert all(o["state"] == "dead_letter" and o["err"] == "endpoint_disabled" and
               o["attempt"] == 0 for o in got[off]), got[off]
    firsts = {queued[gone][0]["id"], queued[off][0]["id"]}
    assert not [l for l in rcv.ledger() if l["webhook_id"] not in firsts], \
        "a queued delivery was sent after its endpoint was deleted or disabled"
    assert c.alive(), "the consumer died"
    assert c.term() == 0


def test_a_record_for_an_endpoint_created_just_before_is_delivered(make_world):
    """An endpoint is created and records for it are published right after: they can reach
    a consumer before its endpoint table has the endpoint (here the table applies every
    change 1.5 s late: fault point endpoints_slow_apply). The consumer looks again once its
    table has read the endpoints topic to its end and delivers them; a record naming an
    endpoint that does not exist is still quarantined, once the table has caught up. Before,
    all of them were quarantined as unknown."""
    w = make_world(partitions=1)
    rcv = w.receiver()
    c = w.consumer(_fault="endpoints_slow_apply")
    wait_until(lambda: c.events("partitions_assigned"), 60, 0.2, "the consumer to join")
    ep = w.add_endpoint("new" + w.tag, rcv.url("ok", "new"))
    evs = [event(ep, i, w.tag) for i in range(3)]
    nosuch = event(f"nosuch_{w.tag}", 0, w.tag)
    assert w.produce(evs + [nosuch]).returncode == 0
    want = {(e["id"], ep) for e in evs}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.5, "the records delivered")
    assert sorted(l["webhook_id"] for l in ledger_ok(rcv)) == sorted(e["id"] for e in evs)
    q = wait_until(lambda: w.dump("quarantine"), 30, 0.5, "the unknown one quarantined")
    assert [x["id"] for x in q] == [nosuch["id"]], q
    assert "unknown endpoint" in q[0]["reason"], q
    assert c.term() == 0


def test_a_claimed_retry_for_an_endpoint_its_pod_learns_late_is_delivered(make_world):
    """Pod A makes the first attempt for a just-created endpoint (503, Retry-After 1 s) and
    stops; pod B, whose table applies the endpoint 3 s late (endpoints_slow_apply), claims
    the retry before its table has the endpoint. B waits for its table, as for a record from
    Kafka, and delivers it; before, B dead-lettered it at once as an unknown endpoint (no
    attempt, a replay needed)."""
    w = make_world(partitions=1, max_attempts=5, retry_base_ms=100)  # due after Retry-After
    rcv = w.receiver()
    # B claims retries only: its group reads a deliveries topic nothing is published to
    benv = dict(w.env, SLUICE_TOPIC_DELIVERIES=w.env["SLUICE_TOPIC_DELIVERIES"] + ".idle",
                SLUICE_CONSUMER_GROUP=w.env["SLUICE_CONSUMER_GROUP"] + ".idle")
    r = w.ctl("topics", "ensure", "--partitions", "1", env=benv)
    assert r.returncode == 0, r.stderr
    saved = w.env
    w.env = benv
    try:
        b = w.consumer("b", _fault="endpoints_slow_apply", _fault_delay_ms=3000)
    finally:
        w.env = saved
    a = w.consumer("a")
    for c in (a, b):
        wait_until(lambda: c.events("partitions_assigned"), 60, 0.2, "the consumers to join")
    ep = w.add_endpoint("late" + w.tag,
                        rcv.url("ok", "late") + "?fail_n=1&fail_status=503&retry_after=1")
    ev = event(ep, 0, w.tag)
    assert w.produce([ev]).returncode == 0
    wait_until(lambda: [l for l in rcv.ledger() if l["endpoint"] == "late"], 30, 0.05,
               "the first attempt")
    assert a.term() == 0
    wait_until(lambda: (ev["id"], ep) in delivered_ids(w.outcomes()), 60, 0.5,
               "the retry delivered by B")
    assert [l["status"] for l in rcv.ledger() if l["endpoint"] == "late"] == [503, 204]
    assert not any(o["state"] == "dead_letter" for o in w.outcomes() if o.get("id") == ev["id"])
    assert b.term() == 0


def test_poison_records_are_quarantined(make_world):
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint("p" + w.tag, rcv.url("ok", "p"))
    garbage = b"\xc1\xff not msgpack at all\n"
    r = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-P", "-t",
                        w.env["SLUICE_TOPIC_DELIVERIES"], "-k", ep],
                       input=garbage, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    good = [event(ep, i, w.tag) for i in range(10)]
    unknown = [event(f"nosuch{i}_{w.tag}", 0, w.tag) for i in range(20)]
    assert w.produce(unknown + good).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in good}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.5, "good records delivered")
    q = wait_until(lambda: len(w.dump("quarantine")) >= 21 and w.dump("quarantine"), 30, 0.5,
                   "quarantined records")
    reasons = sorted(x["reason"] for x in q)
    assert sum("unknown endpoint" in x for x in reasons) == 20, reasons
    assert any("endpoint" not in x for x in reasons), reasons
    assert c.alive()
    assert c.term() == 0
    # the unknown endpoints left no state behind: only the known one has an entry
    stats = c.events("stats")
    assert stats and stats[-1]["endpoint_states"] == 1, stats[-1:]


def test_sigterm_drains_and_reschedules_without_spending_attempts(make_world):
    w = make_world(max_inflight=10, shutdown_drain_ms=1000, http_timeout_ms=10000)
    rcv = w.receiver()
    ep = w.add_endpoint("s" + w.tag, rcv.url("slow/3000", "s"))
    events = [event(ep, i, w.tag) for i in range(40)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    wait_until(lambda: any(l["endpoint"] == "s" for l in rcv.ledger()) or
               len(rcv.ledger()) > 0 or time.sleep(0.5), 30, 0.2, "first request")
    time.sleep(1)
    t = time.time()
    rc = c.term(timeout=60)
    assert rc == 0, c.logs()[-3000:]
    assert time.time() - t < 20
    c2 = w.consumer("after", max_inflight=50)
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 120, 1.0, "all delivered")
    assert c2.term() == 0
    outs = w.outcomes()
    assert any(o["state"] == "deferred" and o["err"] == "shutdown" for o in outs)
    assert all(o["attempt"] <= 2 for o in outs if o["state"] == "delivered")


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_shutdown_drain_waits_without_spinning(make_world):
    """While SIGTERM's drain waits for a slow request, the answer of another one (its outcome
    acknowledged by Kafka, which wakes the loop through librdkafka's pipe) must not leave the
    loop spinning: the drain read that pipe only in the main loop, so every later wait
    returned at once and the drain took a whole core until the slow request ended."""
    w = make_world(shutdown_drain_ms=8000, http_timeout_ms=15000)
    rcv = w.receiver()
    quick = w.add_endpoint("q" + w.tag, rcv.url("slow/1500", "q"))
    slow = w.add_endpoint("s" + w.tag, rcv.url("slow/7000", "s"))
    c = w.consumer()
    wait_until(lambda: c.events("partitions_assigned"), 60, 0.2, "the consumer to join")
    assert w.produce([event(quick, 0, w.tag), event(slow, 0, w.tag)]).returncode == 0
    time.sleep(0.5)  # both in flight: the quick one answers 1 s into the drain
    cpu0, t0 = cpu_seconds(c.p.pid), time.monotonic()
    c.stop(signal.SIGTERM)
    time.sleep(5)  # the drain, waiting for the slow one (answered at about 7 s)
    used, spent = cpu_seconds(c.p.pid) - cpu0, time.monotonic() - t0
    assert c.alive(), "the drain should still be waiting for the slow request"
    assert used < 0.5 * spent, f"the drain used {used:.2f} CPU s in {spent:.2f} s"
    assert c.p.wait(30) == 0
    c.term()  # closes its log
    fin = final_states(w.outcomes())
    assert fin[(event(quick, 0, w.tag)["id"], quick)]["state"] == "delivered"
    assert fin[(event(slow, 0, w.tag)["id"], slow)]["state"] == "delivered"


def kafka_values(w, topic):
    """Every record value of topic, as bytes (kcat frames each with its length, %R)."""
    r = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-C", "-t", topic, "-e",
                        "-q", "-f", "%R%s"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out, b = [], r.stdout
    while b:
        n = int.from_bytes(b[:4], "big", signed=True)
        assert n >= 0, "a record without a value"
        out.append(b[4:4 + n])
        b = b[4 + n:]
    return out


def test_outcomes_carry_the_record_bytes_exactly(make_world):
    """A job's record bytes are dropped after intake when its decoded copy encodes back to
    them (canonical records, the usual case: less memory per job) and kept when it does not
    (an unknown key a newer producer wrote). Either way the dead-letter outcome carries the
    bytes as received, byte for byte: replay and `retries rebuild` read them there."""
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint("dl" + w.tag, rcv.url("status/400", "dl"))
    evs = [event(ep, i, w.tag) for i in range(2)]
    assert w.produce(evs).returncode == 0
    def both_records():
        v = kafka_values(w, w.env["SLUICE_TOPIC_DELIVERIES"])
        return v if len(v) == 2 else None

    canonical = wait_until(both_records, 30, 0.5, "the two records on the deliveries topic")
    # A third record: the second one under another id, with a key this consumer does not
    # know appended to its top-level map (fixmap: one more entry in the first byte).
    old_id, new_id = evs[1]["id"].encode(), evs[1]["id"][:-1].encode() + b"9"
    base = canonical[1] if old_id in canonical[1] else canonical[0]
    assert old_id in base and 0x80 <= base[0] < 0x8F, base[:1]
    extra = bytes([base[0] + 1]) + base[1:].replace(old_id, new_id) + b"\xa9zz_future\xa4kept"
    path = os.path.join(w.dir, "extra.msgpack")  # a file is one message (no delimiter)
    with open(path, "wb") as f:
        f.write(extra)
    r = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-P", "-t",
                        w.env["SLUICE_TOPIC_DELIVERIES"], "-k", ep, path],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    c = w.consumer()

    def dead():
        return {o["id"] for o in w.outcomes() if o["state"] == "dead_letter"}

    wait_until(lambda: len(dead()) == 3, 60, 0.5, "three dead letters")
    assert c.term() == 0
    outs = kafka_values(w, w.env["SLUICE_TOPIC_OUTCOMES"])
    for raw in canonical + [extra]:
        assert any(raw in o for o in outs), "an outcome lost or changed a record's bytes"
    stats = c.events("stats")
    assert stats and stats[-1]["raw_kept"] == 1, stats[-1:]
    # three requests went out, none of them while a stats line was written
    assert 1 <= max(x["inflight_max"] for x in stats) <= 3, stats
    assert max(x["in_memory_max"] for x in stats) >= 1, stats


def test_2xx_whose_body_times_out_is_delivered_once(make_world):
    """A 200 status line, then a body that trickles past the request timeout: the endpoint
    accepted the event, so it is delivered on attempt 1 and never sent again."""
    w = make_world(http_timeout_ms=1500, http_connect_timeout_ms=500, retry_base_ms=200,
                   retry_cap_ms=400, max_attempts=3)
    rcv = w.receiver(extra=["--endless-bps", "64"])  # 16 KiB at once, then 64 B/s: no cap hit
    ep = w.add_endpoint("trickle" + w.tag, rcv.url("endless", "trickle"))
    events = [event(ep, i, w.tag) for i in range(5)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.5, "all delivered")
    time.sleep(1.5)  # a retry, if one were scheduled, would be due by now
    assert c.term() == 0, c.logs()[-3000:]
    outs = [o for o in w.outcomes() if o["endpoint"] == ep]
    assert {o["state"] for o in outs} == {"delivered"}, outs
    assert all(o["attempt"] == 1 and o["http"] == 200 for o in outs)
    # the transfer ran into the timeout (no body cap): latency is the timeout
    assert all(o["lat_us"] >= 1400 * 1000 for o in outs), [o["lat_us"] for o in outs]
    hits = collections.Counter(l["webhook_id"] for l in rcv.ledger() if l["endpoint"] == "trickle")
    assert len(hits) == 5 and max(hits.values()) == 1, hits


def test_backlog_spill_is_reported_once(make_world):
    """A slow endpoint with a small in-memory backlog: what does not fit is parked in the Redis
    schedule (one deferred outcome with err backlog_spill). A parked job claimed back while the
    queue is still full goes back quietly (the fault this guards against: claimed back every
    100 ms, each time with another deferred outcome in the history)."""
    w = make_world(endpoint_backlog=3)
    rcv = w.receiver()
    ep = w.add_endpoint("sp" + w.tag, rcv.url("slow/250", "sp"), "--max-inflight", "2")
    events = [event(ep, i, w.tag) for i in range(30)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 90, 0.5, "all delivered")
    assert c.term() == 0, c.logs()[-3000:]
    outs = [o for o in w.outcomes() if o["endpoint"] == ep]
    spills = collections.Counter(o["id"] for o in outs if o["state"] == "deferred")
    assert spills, "nothing was spilled: the test no longer exercises the backlog bound"
    assert all(o["err"] == "backlog_spill" for o in outs if o["state"] == "deferred")
    assert max(spills.values()) == 1, spills.most_common(3)
    hits = collections.Counter(l["webhook_id"] for l in ledger_ok(rcv) if l["endpoint"] == "sp")
    assert len(hits) == 30 and max(hits.values()) == 1, hits


def test_endpoints_that_cannot_send_do_not_hold_the_loop_memory(make_world):
    """Four endpoints rate-limited to one request a minute get records enough to fill the
    loop's memory (max_inflight 10 + max_queued 100), each queue below endpoint_backlog; the
    records of a healthy endpoint come after them. Once intake is full, the queues that are not
    keeping up move to the Redis schedule (each keeps its head) and intake goes on: the healthy
    endpoint is served. Before, intake stayed stopped until the rate-limited queues drained
    (an hour here), for every endpoint of the loop (invariant 3)."""
    w = make_world(partitions=1, max_inflight=10, max_queued=100)
    rcv = w.receiver()
    slow = [w.add_endpoint(f"rl{i}_{w.tag}", rcv.url("ok", f"rl{i}"), "--rate", "1",
                           "--rate-period-ms", "60000") for i in range(4)]
    ok = w.add_endpoint("fine" + w.tag, rcv.url("ok", "fine"))
    stuck = [event(ep, i, w.tag) for i in range(40) for ep in slow]
    fine = [event(ok, i, w.tag) for i in range(10)]
    assert w.produce(stuck + fine).returncode == 0
    c = w.consumer()
    want = {(e["id"], ok) for e in fine}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.5,
               "the healthy endpoint's records delivered")
    assert c.events("stuck_queues_spilled"), "the test no longer fills the loop's memory"
    # the rate-limited ones were moved, not lost: one request each so far, the rest parked
    outs = [o for o in w.outcomes() if o["endpoint"] in slow]
    parked = {o["id"] for o in outs if o["state"] == "deferred" and o["err"] == "backlog_spill"}
    assert len(parked) >= 40, len(parked)
    assert len([l for l in rcv.ledger() if l["endpoint"].startswith("rl")]) == 4
    assert c.term() == 0, c.logs()[-3000:]


def test_a_queue_stuck_after_the_pause_is_spilled_while_paused(make_world):
    """Intake pauses at its cap (20 in flight, 100 queued) while four endpoints answer after
    1.5 s; their answers then bring the loop to about 104 jobs, between its resume mark (70)
    and its cap. An endpoint that answers after 4 s, one request at a time, holds 59 of them
    queued and is not keeping up from 2 s after its first request: its queue must be moved to
    the schedule then and intake resume, rather than the loop staying paused for seconds
    until the answering endpoints have drained their queues (a spill pass ran only at the
    cap)."""
    w = make_world(partitions=1, max_inflight=20, max_queued=100)
    rcv = w.receiver()
    fast = [w.add_endpoint(f"pf{i}_{w.tag}", rcv.url("slow/1500", f"pf{i}"), "--max-inflight",
                           "4") for i in range(4)]
    slow = w.add_endpoint(f"ps_{w.tag}", rcv.url("slow/4000", "ps"), "--max-inflight", "1")
    evs = []
    for i in range(30):
        evs += [event(ep, i, w.tag) for ep in fast]
        evs += [event(slow, i * 4 + k, w.tag) for k in range(4)]
    assert w.produce(evs).returncode == 0
    c = w.consumer()
    paused = wait_until(lambda: c.events("intake_paused"), 30, 0.1, "the pause at the cap")
    assert paused[0]["in_memory"] == 120, paused[0]
    resumed = wait_until(lambda: c.events("intake_resumed"), 30, 0.1, "the resume")
    spilled = c.events("stuck_queues_spilled")
    assert spilled and spilled[0]["ts"] <= resumed[0]["ts"], (spilled, resumed)
    assert spilled[0]["jobs"] <= 51, spilled  # to just below the resume mark, no further
    want = {(e["id"], e["endpoint"]) for e in evs if e["endpoint"] in fast}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 60, 0.5, "the answering endpoints")
    assert c.term() == 0, c.logs()[-3000:]
    outs = [o for o in w.outcomes() if o["endpoint"] == slow and o["state"] == "deferred"]
    assert {o["err"] for o in outs} >= {"backlog_spill"}, outs


def test_jobs_spilled_while_redis_refuses_writes_are_not_spilled_again(make_world):
    """Intake full behind rate-limited endpoints while Redis refuses the consumer's writes (an
    ACL user whose write commands are taken away): one spill pass moves 51 queued jobs, which
    brings the loop below resume once they are gone, but their schedule writes fail and they
    wait in memory. Later passes count them as on their way out and move no more (before, each
    250 ms pass moved another 51, down to the queues' heads). Once Redis takes writes again each
    moved job is parked once and none is sent."""
    w = make_world(partitions=1, max_inflight=10, max_queued=100)
    user, password = f"spill-{w.tag}", f"pw-{w.tag}"
    redis_all(w.redis_url, "ACL", "SETUSER", user, "reset", "on", f">{password}", "~*", "&*",
              "+@all")
    try:
        scheme = CLUSTER_SCHEME if is_cluster_url(w.redis_url) else "redis://"
        url = f"{scheme}{user}:{password}@{w.redis_url[len(scheme):]}"
        rcv = w.receiver()
        slow = [w.add_endpoint(f"rw{i}_{w.tag}", rcv.url("ok", f"rw{i}"), "--rate", "1",
                               "--rate-period-ms", "60000") for i in range(4)]
        assert w.produce([event(ep, i, w.tag) for i in range(40) for ep in slow]).returncode == 0
        c = w.consumer(redis_url=url)
        wait_until(lambda: len(rcv.ledger()) == 4, 30, 0.1, "one request per endpoint")
        redis_all(w.redis_url, "ACL", "SETUSER", user, "-@write")
        first = wait_until(lambda: c.events("stuck_queues_spilled"), 30, 0.1, "a spill pass")
        time.sleep(2.0)  # eight more passes' time
        passes = c.events("stuck_queues_spilled")
        # 110 jobs in memory (10 in flight + 100 queued), resume below 10 + 100 / 2
        assert [p["jobs"] for p in passes] == [51], passes
        assert first[0]["jobs"] == 51
        redis_all(w.redis_url, "ACL", "SETUSER", user, "+@all")
        parked = lambda: {o["id"] for o in w.outcomes()
                          if o["state"] == "deferred" and o["err"] == "backlog_spill"}
        # the 51 moved, and once they are gone intake resumes: the records still in Kafka for
        # the rate-limited endpoints are parked as they come
        wait_until(lambda: len(parked()) >= 51, 30, 0.2, "the moved jobs parked")
        assert c.term() == 0, c.logs()[-3000:]
        outs = [o for o in w.outcomes() if o["state"] == "deferred"]
        per = collections.Counter(o["id"] + o["endpoint"] for o in outs
                                  if o["err"] == "backlog_spill")
        assert len(per) >= 51 and max(per.values()) == 1, per.most_common(3)
        assert len(rcv.ledger()) == 4
    finally:
        redis_all(w.redis_url, "ACL", "DELUSER", user)


def test_endpoint_timeout_beyond_the_lease_still_gets_its_retries(make_world):
    """An endpoint's own timeout may exceed lease_ms (start-up checks lease_ms only against the
    global timeout): its claimed retry jobs are leased for what the request needs and sent
    (the fault this guards against: found short of lease before every send and dropped, for
    ever)."""
    w = make_world(lease_ms=3000, http_timeout_ms=1000, http_connect_timeout_ms=500,
                   retry_base_ms=100, retry_cap_ms=300, max_attempts=4)
    rcv = w.receiver()
    ep = w.add_endpoint("lt" + w.tag, rcv.url("flaky_n/1", "lt"), "--timeout-ms", "5000")
    events = [event(ep, i, w.tag) for i in range(5)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 30, 0.5, "the retries delivered")
    assert c.term() == 0, c.logs()[-3000:]
    dl = [o for o in w.outcomes() if o["endpoint"] == ep and o["state"] == "delivered"]
    assert sorted(o["attempt"] for o in dl) == [2] * 5, dl


def test_probe_outlasting_the_lease_is_the_only_probe(make_world):
    """A breaker probe to an endpoint whose timeout exceeds lease_ms holds the probe lease for
    as long as it runs: the other pod takes no second probe meanwhile. The probe lease was
    lease_ms (3 s here), so a 6-s probe was joined by another pod's probe after 3 s."""
    w = make_world(lease_ms=3000, http_timeout_ms=2000, http_connect_timeout_ms=500,
                   max_attempts=50, retry_base_ms=100, retry_cap_ms=300,
                   breaker_cooldown_ms=1000, breaker_cooldown_max_ms=1000)
    rcv = w.receiver()
    ep = "pl" + w.tag
    w.add_endpoint(ep, rcv.url("status/503", ep) + "?delay_ms=6000", "--timeout-ms", "8000",
                   "--breaker-threshold", "2", "--breaker-cooldown-ms", "1000", "--max-inflight", "64")
    # both pods in the group first: a pod joining later would re-read the records of 6-s
    # requests still in flight (a second first wave)
    c1, c2 = w.consumer("c1"), w.consumer("c2")
    # (the second pod's first assignment is one of a generation both pods are in)
    wait_until(lambda: all("partitions_assigned" in c.logs() for c in (c1, c2)), 30, 0.2,
               "both pods in the group")
    time.sleep(1)
    events = [event(ep, i, w.tag) for i in range(30)]  # retry jobs for both pods to claim
    assert w.produce(events).returncode == 0
    time.sleep(26)
    assert c1.term() == 0 and c2.term() == 0
    # (ledger times are arrival times)
    hits = sorted(l["ts_ms"] for l in rcv.ledger() if l["endpoint"] == ep)
    print("arrivals after the first, ms:", [h - hits[0] for h in hits])
    # the first attempts (one wave, all in flight at once, answered together after 6 s) open
    # the breaker when they are answered
    assert len(hits) >= 30, hits
    first_wave = [t for t in hits if t < hits[0] + 1000]
    assert len(first_wave) == 30, hits
    opened = hits[0] + 6000
    # A retry of the first failure, claimed by a pod whose view of the breaker was still
    # closed (the other pod's failures came in the same few ms), may be sent before the
    # breaker opened: an ordinary attempt, not a probe, and only in those few ms.
    stragglers = [t for t in hits[30:] if t < opened + 1000]
    assert all(t < opened + 300 for t in stragglers), f"requests during the cooldown: {hits}"
    # every request after the cooldown is a probe taking 6 s: arrivals closer than that overlap
    probes = [t for t in hits if t >= opened + 1000]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 2, f"{len(probes)} probes"
    assert all(g >= 5500 for g in gaps), f"two probes ran at once: gaps {gaps}"


@pytest.mark.parametrize("fault", ["records_refused", "records_unacked"])
def test_records_kafka_did_not_take_are_held_and_produced_again(make_world, fault):
    # Test builds' fault points: the producer "refuses" the first 20 records handed to it
    # (outcomes and quarantined records), or their acknowledgements come back as failures.
    # Nothing may be dropped and no offset left open: every delivery reaches its endpoint
    # once, every outcome and quarantined record reaches Kafka (at least once: a refused
    # acknowledgement of a record Kafka did write means it is there twice), the records were
    # held and produced again by the loop (records_held), and after a clean stop the offsets
    # are committed (a new consumer reads nothing again).
    w = make_world(partitions=2)
    rcv = w.receiver()
    ep = w.add_endpoint("h" + w.tag, rcv.url("ok", "h"))
    events = [event(ep, i, w.tag) for i in range(40)]
    unknown = [event(f"nosuch{i}_{w.tag}", 0, w.tag) for i in range(5)]
    assert w.produce(unknown + events).returncode == 0
    c = w.consumer(_fault=fault)
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered_ids(w.outcomes()), 90, 0.5, "all outcomes in Kafka")
    q = wait_until(lambda: (lambda d: d if len({x["id"] for x in d}) == 5 else None)(
        w.dump("quarantine")), 30, 0.5, "the quarantined records in Kafka")
    assert all("unknown endpoint" in x.get("reason", "") for x in q), q  # headers kept
    held = c.events("records_held")
    assert held, "the fault point did not make the loop hold a record"
    assert c.term() == 0, c.logs()[-3000:]
    per = collections.Counter(l["webhook_id"] for l in ledger_ok(rcv))
    assert len(per) == len(events) and max(per.values()) == 1, per
    outs = [o for o in w.outcomes() if o["state"] == "delivered"]
    n_out = len(outs)
    if fault == "records_refused":
        assert n_out == len(events), "a refused record was produced twice"
    else:
        assert n_out > len(events), "the unacknowledged records were not produced again"
    c2 = w.consumer("c1")
    wait_until(lambda: c2.events("partitions_assigned"), 60, 0.3, "the second consumer's share")
    time.sleep(3)
    assert len(ledger_ok(rcv)) == len(events), "records were read again after the clean stop"
    assert c2.term() == 0
    assert len([o for o in w.outcomes() if o["state"] == "delivered"]) == n_out
