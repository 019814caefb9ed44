"""Circuit breakers and delivery leases across consumer pods against the real stack.

One probe at a time per endpoint across pods, whatever the probe's duration against the
lease; a copy of a record read while its delivery is live is not sent beside it; an endpoint
timeout beyond the lease still gets its retries. The receiver's ledger (arrival times) and
the outcome records on Kafka are the oracles.
"""

import collections
import time

from sluice_e2e import delivered_ids, event, ledger_ok, wait_until


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
