"""Kafka intake and the memory bounds of sluice-consumer against the real stack.

Loops of one process sharing partitions and limits; a full intake that keeps pace; an intake
stuck on a slow endpoint pauses, resumes and serves a rebalance; backlog spills to Redis
(reported once, not repeated while Redis refuses writes); endpoints that cannot send do not
hold a loop's memory.
"""

import collections
import time

from sluice_e2e import (CLUSTER_SCHEME, delivered_ids, event, is_cluster_url, ledger_ok, redis_all,
                        wait_until)


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
