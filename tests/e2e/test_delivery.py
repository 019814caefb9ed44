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

from sluice_e2e import delivered_ids, event, final_states, ledger_ok, wait_until


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


def test_a_name_with_a_refused_address_beside_an_allowed_one_is_judged_by_the_allowed_one(
        make_world):
    """A name that resolves to a refused address (::1: only 127.0.0.0/8 is allowed here) and an
    allowed one (127.0.0.1), as a split DNS can give: the refused one is skipped and the
    allowed one's outcome decides. Nothing listening there is a `connect` failure, retried
    (it was a permanent `ssrf_refused` dead letter at the first attempt); a receiver there gets the
    delivery. A name with only refused addresses stays `ssrf_refused`, dead at once. The names are
    resolved by the consumer's test fault (SL_FAULT=resolve), not the system's resolver."""
    from sluice_e2e import free_port
    w = make_world(max_attempts=2, retry_base_ms=200, retry_cap_ms=400)
    rcv = w.receiver()
    rport = int(rcv.base.rsplit(":", 1)[1])
    closed = free_port()
    down = w.add_endpoint(f"dn_{w.tag}", f"http://dual.test:{closed}/x")
    up = w.add_endpoint(f"up_{w.tag}", rcv.url("ok", f"up_{w.tag}").replace("127.0.0.1",
                                                                              "dual.test"))
    v6 = w.add_endpoint(f"v6_{w.tag}", rcv.url("ok", f"v6_{w.tag}").replace("127.0.0.1",
                                                                              "v6only.test"))
    evs = [event(ep, 0, w.tag) for ep in (down, up, v6)]
    assert w.produce(evs).returncode == 0
    env_resolve = (f"dual.test:{closed}:[::1],127.0.0.1;dual.test:{rport}:[::1],127.0.0.1;"
                   f"v6only.test:{rport}:[::1]")
    w.env["SL_FAULT_RESOLVE"] = env_resolve
    try:
        c = w.consumer(_fault="resolve")
    finally:
        del w.env["SL_FAULT_RESOLVE"]

    def ended():
        fin = final_states(w.outcomes())
        got = {ep: fin.get((e["id"], ep), {}) for e, ep in zip(evs, (down, up, v6))}
        return got if all(o.get("state") in ("delivered", "dead_letter")
                          for o in got.values()) else None
    got = wait_until(ended, 60, 0.3, "every delivery ended")
    assert got[up]["state"] == "delivered", got[up]
    assert (got[down]["state"], got[down]["err"], got[down]["attempt"]) == \
        ("dead_letter", "connect", 2), got[down]
    assert (got[v6]["state"], got[v6]["err"], got[v6]["attempt"]) == \
        ("dead_letter", "ssrf_refused", 1), got[v6]
    outs = [o for o in w.outcomes() if o.get("endpoint") == down]
    assert [o["err"] for o in outs] == ["connect", "connect"], outs
    assert c.term() == 0
