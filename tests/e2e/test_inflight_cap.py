"""The delivery loop's adaptive in-flight cap (adaptive_inflight; consumer/cons_adapt.h).

A loop saturated by a backlog to endpoints that answer at once lowers the cap it sends under
(sluice_inflight_limit falls below max_inflight, never below the floor, and the requests in
flight follow it) and still delivers everything once; with adaptive_inflight=false the cap
stays at max_inflight. A loop whose cap fell, then waiting on slow endpoints, regains its
whole window: the cap and the requests in flight reach max_inflight again.
"""
import os
import re
import time
import urllib.request

from sluice_e2e import event, free_port, wait_until

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$')
FLOOR = 128  # CONS_ADAPT_FLOOR


def scrape(port):
    """{family: summed value} of the consumer's /metrics, or {} while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            if m.group(1) == "sluice_deliveries_total" and 'outcome="delivered"' not in line:
                continue
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def drain(w, n_eps, per_ep, behaviour, max_inflight, **cfg):
    """Produce per_ep events to each of n_eps endpoints of one receiver, then start one consumer
    (one loop) and watch its metrics until all are delivered: the samples taken."""
    rcv = w.receiver(extra=["--no-ledger-ok"])
    eps = [w.add_endpoint(f"cap{i}_{w.tag}", rcv.url(behaviour, f"cap{i}_{w.tag}"))
           for i in range(n_eps)]
    total = n_eps * per_ep
    assert w.produce([event(ep, i, w.tag) for i in range(per_ep) for ep in eps]).returncode == 0
    port = free_port()
    c = w.consumer(metrics_listen=f"127.0.0.1:{port}", max_inflight=max_inflight,
                   max_inflight_per_endpoint=max_inflight, **cfg)
    samples = []

    def done():
        s = scrape(port)
        if s:
            samples.append(s)
        return s.get("sluice_deliveries_total", 0) >= total
    wait_until(done, 240 * MULT, 0.05, f"{total} deliveries")
    time.sleep(0.3)
    last = scrape(port)
    assert c.term() == 0, c.logs()[-3000:]
    assert last["sluice_deliveries_total"] == total, "a delivery was counted twice"
    return samples


def test_a_saturated_loop_lowers_its_cap_and_delivers_everything(make_world):
    w = make_world(partitions=2)
    samples = drain(w, 20, 1500, "ok", 2000)
    # (0 before the loop exists: the metrics listener starts first)
    limits = [s["sluice_inflight_limit"] for s in samples if s.get("sluice_inflight_limit")]
    print("limits seen:", sorted(set(limits)))
    assert min(limits) < 2000, f"the cap never fell below max_inflight: {sorted(set(limits))}"
    assert min(limits) >= FLOOR, f"the cap fell below its floor: {min(limits)}"
    # once it fell, what runs follows it (a scrape can land between a fall and the answers
    # that bring the requests under it: a window's worth of slack)
    low = [s for s in samples if 0 < s.get("sluice_inflight_limit", 0) <= 1000]
    assert low and max(s.get("sluice_inflight_requests", 0) for s in low) <= 1500


def test_without_adaptive_inflight_the_cap_stays(make_world):
    w = make_world(partitions=2)
    samples = drain(w, 20, 1000, "ok", 2000, adaptive_inflight="false")
    limits = {s["sluice_inflight_limit"] for s in samples if s.get("sluice_inflight_limit")}
    assert limits == {2000}, limits


def test_a_loop_waiting_on_slow_endpoints_regains_its_window(make_world):
    """A backlog to fast endpoints lowers the cap; a backlog to slow endpoints (10 answering
    after 2 to 6 s, 1,000 in flight at most: about 250/s with the whole window, 32/s at the
    floor), produced the moment the cap is seen lowered, must get the whole window back once
    the fast one is gone and the loop mostly waits. Mostly waits in every build: a consumer
    built with ASan spends about 1 ms of CPU per delivery, so 10 endpoints answering after
    400 ms (2,500/s, in waves of a whole window) keep its loop saturated, and a saturated
    loop rightly trims its cap; the differing delays spread the answers as real endpoints'
    do."""
    w = make_world(partitions=2)
    rcv = w.receiver(extra=["--no-ledger-ok"])
    fast = [w.add_endpoint(f"fast{i}_{w.tag}", rcv.url("ok", f"fast{i}_{w.tag}"))
            for i in range(20)]
    slow = [w.add_endpoint(f"slow{i}_{w.tag}",
                           rcv.url(f"slow/{2000 + 444 * i}", f"slow{i}_{w.tag}"))
            for i in range(10)]
    n_fast, n_slow = 20 * 2000, 10 * 400
    assert w.produce([event(ep, i, w.tag) for i in range(2000) for ep in fast]).returncode == 0
    port = free_port()
    c = w.consumer(metrics_listen=f"127.0.0.1:{port}", max_inflight=1000,
                   max_inflight_per_endpoint=1000)
    seen = []

    def cap_low():
        s = scrape(port)
        if s:
            seen.append(s)
        return 0 < s.get("sluice_inflight_limit", 0) < 1000
    wait_until(cap_low, 240 * MULT, 0.02, "the cap lowered by the fast backlog")
    low = seen[-1]["sluice_inflight_limit"]
    assert w.produce([event(ep, i, w.tag) for i in range(400) for ep in slow]).returncode == 0
    later = []

    def all_done():
        s = scrape(port)
        if s:
            later.append(s)
        return s.get("sluice_deliveries_total", 0) >= n_fast + n_slow
    wait_until(all_done, 240 * MULT, 0.05, "both backlogs delivered")
    assert c.term() == 0, c.logs()[-3000:]
    # from the first sample at which the cap was back at max_inflight on
    back = next((i for i, x in enumerate(later) if x.get("sluice_inflight_limit") == 1000), None)
    print(f"cap {low} when the slow backlog was produced; back at 1000 at sample", back,
          "of", len(later))
    assert back is not None, "the cap never came back to max_inflight"
    running = max(x.get("sluice_inflight_requests", 0) for x in later[back:])
    assert running >= 900, f"the window never filled again: at most {running} in flight"
    # and keeps it while it waits: at max_inflight for most of the rest of the drain (a turn
    # that answers a whole wave of 1,000 at once may look saturated and trim it for a while)
    limits = sorted(x["sluice_inflight_limit"] for x in later[back:])
    print("cap after it came back: median", limits[len(limits) // 2], "lowest", limits[0],
          "at max_inflight", sum(x == 1000 for x in limits), "of", len(limits))
    assert limits[len(limits) // 2] == 1000, limits
    assert later[-1]["sluice_deliveries_total"] == n_fast + n_slow
