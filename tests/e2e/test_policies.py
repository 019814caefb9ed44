"""Endpoint policies (issue: endpoint policies): shared rate limits, 429 pauses, affiliate
postbacks, SSRF refusals, header injection, and a log scan for sensitive values.
"""

import glob
import json
import struct
import subprocess
import time

import pytest

from sluice_e2e import event, final_states, psql, redis_cmd, wait_until


def delivered(w):
    return {(o["id"], o["endpoint"]) for o in w.outcomes() if o["state"] == "delivered"}


def test_rate_limit_shared_by_two_consumers(make_world):
    rate, burst, n = 25, 5, 125
    w = make_world()
    rcv = w.receiver()
    # Records of one endpoint share a partition (key = endpoint id), so one pod takes them
    # from Kafka; a small backlog bound spills the rest to the Redis schedule, from which
    # both pods claim: the bucket must hold across pods.
    w.env["SLUICE_ENDPOINT_BACKLOG"] = "5"
    ep = w.add_endpoint("rl" + w.tag, rcv.url("ok", "rl"), "--rate", str(rate),
                        "--rate-period-ms", "1000", "--burst", str(burst))
    events = [event(ep, i, w.tag) for i in range(n)]
    assert w.produce(events).returncode == 0
    c1, c2 = w.consumer("a"), w.consumer("b")
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered(w), 60, 0.5, "rate-limited deliveries")
    assert c1.term() == 0 and c2.term() == 0
    ts = sorted(l["ts_ms"] for l in rcv.ledger() if l["endpoint"] == "rl")
    assert len(ts) >= n
    # never above the bucket over any one-second window: rate + burst, plus what a pod may
    # hold as a lease taken just before the window (leases are used within 200 ms: rate / 5)
    slack = max(1, rate // 5)
    j = 0
    worst = 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= 1000:
            j += 1
        worst = max(worst, i - j + 1)
    assert worst <= rate + burst + slack, f"{worst} requests within one second"
    # and close to the rate overall (loose: shared, noisy machine)
    span = (ts[-1] - ts[0]) / 1000
    achieved = (len(ts) - burst) / span
    assert 0.6 * rate <= achieved <= 1.1 * rate, f"{achieved:.1f}/s for a limit of {rate}/s"
    # both pods took part
    pods = {o["pod"] for o in w.outcomes() if o["state"] == "delivered"}
    assert pods == {"a", "b"}, pods


def test_a_pod_leases_only_the_rate_tokens_it_will_use(make_world):
    """Rate tokens a pod leases and does not use expire with its lease, lost to the other
    pods sharing the endpoint's bucket: a pod with one job to send takes one token, not a
    tenth of a second of the rate."""
    w = make_world()
    rcv = w.receiver()
    # 100/s as 3,000 per 30 s: the bucket's key then lives 60 s after the take (twice a
    # refill's whole periods) rather than 2 s, which the wait for the outcome and the
    # consumer's shutdown below can outlast on a loaded machine
    ep = w.add_endpoint("lease" + w.tag, rcv.url("ok", "lease"), "--rate", "3000",
                        "--rate-period-ms", "30000", "--burst", "100")
    e = event(ep, 0, w.tag)
    assert w.produce([e]).returncode == 0
    c = w.consumer()
    wait_until(lambda: (e["id"], ep) in delivered(w), 60, 0.3, "the one delivery")
    assert c.term() == 0
    # the bucket as the one lease left it (milli-tokens; a refill is only written by a take)
    mt = redis_cmd(w.redis_url, "HGET", "sluice:rate:{%s}" % ep, "mt")
    assert mt is not None, "no bucket for the endpoint"
    assert int(mt) == 99000, f"{100 - int(mt) / 1000:g} tokens taken for one delivery"


def test_429_retry_after_pauses_the_endpoint(make_world):
    w = make_world(retry_base_ms=100, retry_cap_ms=200)
    rcv = w.receiver()
    ep = w.add_endpoint("th" + w.tag,
                        rcv.url("ok", "th") + "?fail_n=1&fail_status=429&retry_after=2",
                        "--max-inflight", "1")
    events = [event(ep, i, w.tag) for i in range(4)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered(w), 60, 0.5, "deliveries after 429s")
    assert c.term() == 0
    hits = sorted((l["ts_ms"], l["status"]) for l in rcv.ledger() if l["endpoint"] == "th")
    first_429 = next(t for t, s in hits if s == 429)
    after = [t for t, s in hits if t > first_429]
    assert after and min(after) - first_429 >= 1900, \
        f"endpoint contacted {min(after) - first_429} ms after a 429 with Retry-After: 2"
    outs = w.outcomes()
    assert any(o["state"] == "retry_scheduled" and o["http"] == 429 for o in outs)
    # a throttle is not ill health: the breaker stayed closed
    assert not any(o["err"] == "breaker_open" for o in outs)


@pytest.mark.parametrize("status", [500, 503, 408])
def test_retry_after_on_any_retried_answer_pauses_the_endpoint(make_world, status):
    """Standard Webhooks: a retry-after "should be taken into consideration when scheduling
    the next attempt", whatever the transient status carried it; it pauses the endpoint and
    delays the event's own retry past the backoff (100-200 ms here)."""
    w = make_world(retry_base_ms=100, retry_cap_ms=200)
    rcv = w.receiver()
    ep = w.add_endpoint("ra" + w.tag,
                        rcv.url("ok", "ra") + f"?fail_n=1&fail_status={status}&retry_after=2",
                        "--max-inflight", "1")
    events = [event(ep, i, w.tag) for i in range(3)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered(w), 60, 0.5, f"deliveries after {status}s")
    assert c.term() == 0
    hits = sorted((l["ts_ms"], l["status"]) for l in rcv.ledger() if l["endpoint"] == "ra")
    first = next(t for t, s in hits if s == status)
    after = [t for t, s in hits if t > first]
    assert after and min(after) - first >= 1900, \
        f"endpoint contacted {min(after) - first} ms after a {status} with Retry-After: 2"
    retries = [o for o in w.outcomes() if o["state"] == "retry_scheduled" and o["http"] == status]
    assert retries and all(o["next_ms"] - o["ts_ms"] >= 2000 for o in retries), retries


def most_overlapping(ts, span_ms):
    """The largest number of arrivals (sorted ms) within span_ms of each other."""
    worst, j = 0, 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= span_ms:
            j += 1
        worst = max(worst, i - j + 1)
    return worst


@pytest.mark.parametrize("status", [502, 504])
def test_502_and_504_halve_the_concurrency_window(make_world, status):
    """429, 502 and 504 are Standard Webhooks' "throttle" answers: the endpoint's window of
    requests in flight halves once per round trip (8 -> 4 -> 2 -> 1 while nothing succeeds:
    each event's first two attempts answer that way) and grows back as deliveries succeed.
    Every request takes 400 ms, so requests arriving within 350 ms of each other overlap."""
    delay = 400
    w = make_world(retry_base_ms=100, retry_cap_ms=200)
    rcv = w.receiver()
    ep = w.add_endpoint("w" + w.tag, rcv.url("ok", "w") +
                        f"?fail_n=2&fail_status={status}&delay_ms={delay}", "--max-inflight", "8",
                        "--breaker-threshold", "1000")  # the window alone, not the breaker
    events = [event(ep, i, w.tag) for i in range(24)]
    assert w.produce(events).returncode == 0
    c = w.consumer()
    want = {(e["id"], ep) for e in events}
    wait_until(lambda: want <= delivered(w), 90, 0.5, f"deliveries after {status}s")
    assert c.term() == 0
    hits = sorted((l["ts_ms"], l["status"]) for l in rcv.ledger() if l["endpoint"] == "w")
    assert len(hits) >= 72, len(hits)  # each event: two failures, one success
    t0 = hits[0][0]
    # until the first success is answered the window only shrinks
    ok_answered = min(t for t, s in hits if s < 300) + delay
    first_round = [t for t, _ in hits if t < t0 + delay - 50]
    assert len(first_round) == 8, hits[:10]  # at the full cap: nothing throttled yet
    second = [t for t, _ in hits if t0 + delay - 50 <= t < t0 + 2 * delay - 50]
    # the 8 answers of the first round cut the window once (to 4), not 8 times (to 1)
    assert 2 <= most_overlapping(second, delay - 50) <= 4, (status, second)
    throttled = [t for t, _ in hits if t0 + delay - 50 <= t < ok_answered]
    assert most_overlapping(throttled, delay - 50) <= 4, (status, throttled)
    outs = w.outcomes()
    assert any(o["state"] == "retry_scheduled" and o["http"] == status for o in outs)


PLANTED_CLICK = "CLKPLANTED7731"
PLANTED_PAYOUT = "98765.43"


def test_postback_templates_fill_encode_and_report_missing(make_world):
    w = make_world(log_level="debug", debug="all", max_attempts=2, retry_base_ms=100)
    # signatures of GET postbacks cover the empty body actually sent
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    tpl = (rcv.base + "/ok/pb?click_id={click_id}&payout={payout}&st={status}"
           "&token=PLANTEDTOKEN99")
    ep = w.add_endpoint("pb" + w.tag, tpl, "--template", "--method", "GET")
    good = [event(ep, i, w.tag, macros={"click_id": f"{PLANTED_CLICK}-{i} &=?",
                                        "payout": PLANTED_PAYOUT, "status": "approved é"})
            for i in range(5)]
    missing = [event(ep, 99, w.tag, macros={"click_id": PLANTED_CLICK, "status": "x"})]
    r = w.produce(good + missing)
    assert r.returncode == 0, r.stderr
    c = w.consumer()

    def settled():
        fin = final_states(w.outcomes())
        return len(fin) == 6 and all(o["state"] in ("delivered", "dead_letter")
                                     for o in fin.values())

    wait_until(settled, 60, 0.5, "postbacks settled")
    assert c.term() == 0
    fin = final_states(w.outcomes())
    for e in good:
        assert fin[(e["id"], ep)]["state"] == "delivered"
    m = fin[(missing[0]["id"], ep)]
    assert m["state"] == "dead_letter" and m["err"] == "macro_missing"
    assert 'macro "payout" missing' in m["msg"]
    hits = [l for l in rcv.ledger() if l["path"] == "/ok/pb"]
    assert len(hits) == 5, "a postback with a missing macro was sent"
    assert all(l["method"] == "GET" and l["query_keys"] == 4 and l["sig_ok"] for l in hits)
    # log scan: no click id, payout, token or query string in any process's log lines
    logs = "".join(p.logs() for p in w.consumers) + r.stderr
    for path in glob.glob(w.dir + "/*.log"):
        logs += open(path, errors="replace").read()
    for needle in (PLANTED_CLICK, PLANTED_PAYOUT, "PLANTEDTOKEN99", "click_id=", "payout=",
                   "?click", w.secret):
        assert needle not in logs, f"{needle!r} reached a log line"
    assert len(logs) > 1000, "the log scan read nothing"


def test_ssrf_refuses_non_global_addresses(make_world):
    w = make_world(ssrf_allow_cidrs="", max_attempts=1)
    rcv = w.receiver()
    port = rcv.port
    targets = {
        "lo4": f"http://127.0.0.1:{port}/ok/x",
        "ten": "http://10.0.0.1/hook",
        "meta": "http://169.254.169.254/latest/meta-data/",
        "lo6": f"http://[::1]:{port}/ok/x",
        "mapped": f"http://[::ffff:127.0.0.1]:{port}/ok/x",
        "name": f"http://localhost:{port}/ok/x",
        "ec2v6": "http://[fd00:ec2::254]/latest/",
    }
    # registered by a sluicectl without the rules (with them the registry refuses these
    # hosts: test_api.py's test_an_endpoint_at_a_refused_address_is_refused_when_registered):
    # this is the consumers' own check, on each connection, which also holds for a name that
    # resolves to such an address (localhost here)
    unchecked = dict(w.env, SLUICE_SSRF_PROTECTION="false")
    for k, u in targets.items():
        r = w.ctl("endpoints", "add", "--id", k + w.tag, "--url", u, "--secret", w.secret,
                  env=unchecked)
        assert r.returncode == 0, r.stderr
    eps = {k: k + w.tag for k in targets}
    events = [event(ep, 0, w.tag) for ep in eps.values()]
    assert w.produce(events).returncode == 0
    c = w.consumer()

    def settled():
        fin = final_states(w.outcomes())
        return len(fin) == len(events) and all(o["state"] == "dead_letter"
                                               for o in fin.values())

    wait_until(settled, 60, 0.5, "refusals")
    assert c.term() == 0
    for o in final_states(w.outcomes()).values():
        assert o["err"] == "ssrf_refused", o
        assert o["http"] == 0
    assert rcv.ledger() == [], "a refused address was contacted"


def test_redirects_are_never_followed(make_world):
    w = make_world(max_attempts=1)
    rcv = w.receiver()
    ep = w.add_endpoint("rd" + w.tag, rcv.url("redirect", "rd"))
    assert w.produce([event(ep, 0, w.tag)]).returncode == 0
    c = w.consumer()
    wait_until(lambda: final_states(w.outcomes()), 60, 0.5, "redirect outcome")
    assert c.term() == 0
    o = list(final_states(w.outcomes()).values())[0]
    assert o["state"] == "dead_letter" and o["http"] == 302 and o["err"] == "http_3xx"
    assert len(rcv.ledger()) == 1


def mp_str(s):
    b = s.encode() if isinstance(s, str) else s
    if len(b) < 32:
        return bytes([0xa0 | len(b)]) + b
    return b"\xd9" + bytes([len(b)]) + b


def mp_map(d):
    out = bytes([0x80 | len(d)])
    for k, v in d.items():
        out += mp_str(k)
        if isinstance(v, int):
            out += b"\xcf" + struct.pack(">Q", v)
        elif isinstance(v, dict):
            out += mp_map(v)
        elif isinstance(v, bytes):
            out += b"\xc4" + bytes([len(v)]) + v
        else:
            out += mp_str(v)
    return out


def test_header_injection_refused_everywhere(make_world):
    w = make_world()
    rcv = w.receiver()
    # at registration
    r = w.ctl("endpoints", "add", "--id", "inj" + w.tag, "--url", rcv.url("ok", "inj"),
              "--header", "X-A: b\r\nX-Evil: 1")
    assert r.returncode != 0 and "CR" in r.stderr, r.stderr
    ep = w.add_endpoint("hi" + w.tag, rcv.url("ok", "hi"))
    # at publish
    bad = event(ep, 0, w.tag, headers={"X-Note": "a\r\nX-Evil: 1"})
    r = w.produce([bad, event(ep, 1, w.tag)])
    assert r.returncode == 1 and "line 1" in r.stderr and "published=1" in r.stdout
    # at delivery: a record crafted by another client, bypassing sluice-produce
    raw = mp_map({"v": 1, "id": f"evt_{w.tag}_raw", "ep": ep, "type": "t",
                  "ts": int(time.time() * 1000), "body": b"{}",
                  "hdr": {"X-Note": "a\r\nX-Evil: 1"}})
    p = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-P", "-t",
                        w.env["SLUICE_TOPIC_DELIVERIES"], "-k", ep, "-D", "|END-OF-RECORD|"],
                       input=raw, capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    c = w.consumer()
    wait_until(lambda: (f"evt_{w.tag}_{ep}_1", ep) in delivered(w), 60, 0.5, "good record")
    q = wait_until(lambda: w.dump("quarantine"), 30, 0.5, "quarantined record")
    assert c.term() == 0
    assert len(q) == 1 and "hdr" in q[0]["reason"]
    assert all(l["webhook_id"] != f"evt_{w.tag}_raw" for l in rcv.ledger())


class HeaderRecorder:
    """An HTTP/1.1 server on loopback that answers 204 and keeps each request's header lines
    [(name, value)], in order, repeats included."""

    def __init__(self):
        import http.server
        import threading
        rec = self.requests = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                rec.append(list(self.headers.items()))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_an_event_cannot_add_a_value_to_its_endpoints_headers_or_sluices_own(make_world):
    """Sluice's own headers (webhook-*, X-Sluice-*) are refused in an event at publish, and
    an event's header named as one its endpoint sets (a credential, typically) is left out:
    the receiver gets the endpoint's value once, never a second value from a publisher."""
    w = make_world()
    srv = HeaderRecorder()
    try:
        ep = w.add_endpoint("hd" + w.tag, f"http://127.0.0.1:{srv.port}/h",
                            "--header", "X-Tenant: from-endpoint")
        for i, name in enumerate(("X-Sluice-Attempt", "x-sluice-created-ms", "Webhook-Foo")):
            r = w.produce([event(ep, i, w.tag, headers={name: "99"})])
            assert r.returncode == 1 and "reserved" in r.stderr, (name, r.stderr)
        ok = event(ep, 9, w.tag, headers={"x-tenant": "from-event", "X-Note": "n"})
        assert w.produce([ok]).returncode == 0
        c = w.consumer()
        wait_until(lambda: srv.requests, 60, 0.2, "the delivery")
        assert c.term() == 0
        (hs,) = srv.requests
        values = lambda n: [v for k, v in hs if k.lower() == n]
        assert values("x-tenant") == ["from-endpoint"], hs
        assert values("x-note") == ["n"], hs
        assert values("x-sluice-attempt") == ["1"], hs
        assert values("webhook-id") == [ok["id"]], hs
    finally:
        srv.close()


def test_slow_endpoints_get_a_lower_breaker_threshold(make_world):
    import json as _json
    w = make_world(breaker_threshold=10, breaker_slow_threshold=2, breaker_slow_p95_ms=200,
                   max_attempts=50, retry_base_ms=100, retry_cap_ms=300)
    rcv = w.receiver()
    slow = w.add_endpoint("sl" + w.tag, rcv.url("slow/400", "sl"))
    fast = w.add_endpoint("fa" + w.tag, rcv.url("ok", "fa"))
    warm = [event(ep, i, w.tag) for ep in (slow, fast) for i in range(25)]
    assert w.produce(warm).returncode == 0
    c = w.consumer()
    want = {(e["id"], e["endpoint"]) for e in warm}
    wait_until(lambda: want <= delivered(w), 60, 0.5, "warm-up deliveries")
    # both endpoints start failing fast; the slow one's P95 (400 ms > 200 ms) lowers its
    # threshold from 10 to 2 consecutive failures
    for ep, name in ((slow, "sl"), (fast, "fa")):
        assert w.ctl("endpoints", "update", ep, "--url", rcv.url("status/500", name)).returncode == 0
    # the updates reach the consumer's endpoint table (it logs each change)
    wait_until(lambda: all(any('"endpoint_changed"' in l and f'"endpoint_id":"{ep}"' in l
                               for l in c.log_lines()) for ep in (slow, fast)),
               30, 0.2, "the consumer has the new URLs")
    failing = [event(ep, 100 + i, w.tag) for ep in (slow, fast) for i in range(30)]
    assert w.produce(failing).returncode == 0

    def opened():
        out = {}
        for line in c.log_lines():
            if '"breaker_opened"' in line:
                d = _json.loads(line)
                out.setdefault(d["msg"].rsplit(" ", 1)[-1], d["failures"])
        return out if slow in out and fast in out else None

    got = wait_until(opened, 60, 0.5, "both breakers open")
    assert c.term() == 0
    assert got[slow] == 2, got
    assert got[fast] == 10, got


def test_many_disable_requests_in_one_batch_are_all_applied(make_world):
    """70 endpoints answer 410 at once: the recorder reads their 70 disable requests in one
    batch and applies every one to the registry before it stores the batch's offsets (it kept
    at most 64 waiting and dropped the rest, silently)."""
    import os as _os
    from sluice_e2e import Proc
    w = make_world(max_attempts=3, retry_base_ms=100, recorder_flush_ms=3000)
    rcv = w.receiver()
    eps = [w.add_endpoint(f"g{i}_{w.tag}", rcv.url("gone", f"g{i}"), "--max-inflight", "1")
           for i in range(70)]
    assert w.produce([event(ep, 0, w.tag) for ep in eps]).returncode == 0
    c = w.consumer()
    wait_until(lambda: len({o["endpoint"] for o in w.outcomes() if o["state"] == "disabled"})
               == 70, 60, 0.5, "70 disable requests")
    rec = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))

    def enabled_left():
        r = w.ctl("endpoints", "list", "--json")
        assert r.returncode == 0, r.stderr
        rows = [e for e in json.loads(r.stdout) if e["id"] in eps]
        assert len(rows) == 70
        return [e["id"] for e in rows if e["enabled"]]
    wait_until(lambda: not enabled_left(), 60, 0.5, "all 70 disabled")
    assert c.term() == 0 and rec.term() == 0


def test_410_disables_the_endpoint_through_the_registry(make_world):
    import os as _os
    from sluice_e2e import Proc
    w = make_world(max_attempts=3, retry_base_ms=100, recorder_flush_ms=100)
    rcv = w.receiver()
    ep = w.add_endpoint("gone" + w.tag, rcv.url("gone", "gone"), "--max-inflight", "1")
    assert w.produce([event(ep, 0, w.tag)]).returncode == 0
    rec = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))
    c = w.consumer()

    def disabled():
        r = w.ctl("endpoints", "show", ep, "--json")
        return r.returncode == 0 and '"enabled": false' in r.stdout.replace('":false', '": false') \
            and r.stdout

    shown = wait_until(disabled, 60, 0.5, "endpoint disabled in the registry")
    assert "410" in shown, shown
    # every pod learns it from the endpoints topic: later deliveries are dead letters at once,
    # kept for replay, and never sent
    wait_until(lambda: any('"endpoint_changed"' in l and f'"endpoint_id":"{ep}"' in l
                           for l in c.log_lines()), 30, 0.2, "the consumer has the disable")
    later = [event(ep, i, w.tag) for i in range(1, 4)]
    assert w.produce(later).returncode == 0
    wait_until(lambda: all(final_states(w.outcomes()).get((e["id"], ep), {}).get("err") ==
                           "endpoint_disabled" for e in later), 60, 0.5, "disabled dead letters")
    assert len([l for l in rcv.ledger() if l["endpoint"] == "gone"]) == 1
    assert c.term() == 0 and rec.term() == 0
    # the operator turns it back on
    assert w.ctl("endpoints", "enable", ep).returncode == 0
    r = w.ctl("endpoints", "show", ep, "--json")
    assert '"enabled": true' in r.stdout.replace('":true', '": true'), r.stdout


def test_a_disable_request_whose_reason_must_be_cut_is_applied(make_world):
    """A disable request's message, prefixed and cut to the registry's 256-byte reason, is cut
    between characters: cut inside a two-byte character it made a reason the registry refused
    on every attempt, and the recorder held that batch (and the history) for good."""
    import os as _os
    from sluice_e2e import Proc
    w = make_world(recorder_flush_ms=100)
    rcv = w.receiver()
    ep = w.add_endpoint("cut" + w.tag, rcv.url("ok", "cut"))
    msg = "a" * 229 + "\u00e9" * 13  # 255 bytes; "disabled by sluice: " + 236 ends mid-character
    now = int(time.time() * 1000)
    rec = {"v": 1, "id": "ev-cut-" + w.tag, "ep": ep, "type": "order.paid", "attempt": 0,
           "state": "disabled", "http": 410, "err": "endpoint_gone", "msg": msg, "ts": now,
           "created": now, "pod": "test-pod"}
    w.put_outcome(ep, rec)
    rp = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))

    def shown():
        r = w.ctl("endpoints", "show", ep, "--json")
        assert r.returncode == 0, r.stderr
        e = json.loads(r.stdout)
        return not e["enabled"] and e
    e = wait_until(shown, 60, 0.5, "the endpoint disabled by the recorder")
    assert e["disabled_reason"] == ("disabled by sluice: " + msg).encode()[:255].decode(), e
    assert rp.term() == 0


def test_disable_requests_after_a_lost_registry_connection_are_kept(make_world):
    """The recorder's registry connection dies; the next batch carries two disable requests.
    The first fails on the dead connection and is kept for the retry; the second found no
    connection at all, which read as a request the registry refuses, and was dropped for
    good. Both endpoints end up disabled."""
    import os as _os
    from sluice_e2e import Proc
    w = make_world(recorder_flush_ms=3000)
    rcv = w.receiver()
    eps = [w.add_endpoint(f"lost{k}" + w.tag, rcv.url("ok", f"lost{k}")) for k in range(3)]
    dsn = w.env["SLUICE_PG_DSN"]

    def ask_disable(ep):
        now = int(time.time() * 1000)
        w.put_outcome(ep, {"v": 1, "id": "ev-lost-" + ep, "ep": ep, "type": "order.paid",
                           "attempt": 0, "state": "disabled", "http": 410,
                           "err": "endpoint_gone", "msg": "gone", "ts": now, "created": now,
                           "pod": "test-pod"})

    def disabled(ep):
        r = w.ctl("endpoints", "show", ep, "--json")
        assert r.returncode == 0, r.stderr
        return not json.loads(r.stdout)["enabled"]

    rp = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))
    ask_disable(eps[0])  # opens the registry connection
    wait_until(lambda: disabled(eps[0]), 60, 0.5, "the first endpoint disabled")
    # the recorder's registry connection: its process's connection without its lanes' name
    ports = set()
    for line in subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines():
        if f"pid={rp.p.pid}," in line:
            local, peer = line.split()[2:4]
            if peer.rsplit(":", 1)[1] == dsn.split("port=")[1].split()[0]:
                ports.add(local.rsplit(":", 1)[1])
    assert ports, "no PostgreSQL connection of the recorder found"
    killed = psql(dsn, "select count(*) from (select pg_terminate_backend(pid) from "
                       "pg_stat_activity where application_name <> 'sluice-recorder' and "
                       f"client_port in ({','.join(ports)})) t")
    assert killed == "1", killed
    ask_disable(eps[1])
    ask_disable(eps[2])  # within the 3-s flush: one batch
    wait_until(lambda: disabled(eps[1]) and disabled(eps[2]), 60, 0.5,
               "both endpoints disabled after the lost connection")
    assert rp.term() == 0
    assert not [l for l in rp.logs().splitlines() if "disable_refused" in l]


def test_an_outcome_from_a_clock_far_ahead_is_quarantined_not_recorded(make_world):
    """An outcome whose ts is a year ahead (a pod with a wrong clock) is quarantined with its
    reason; it was recorded, and the endpoint's health then kept it as the latest outcome
    until that date. A sound outcome of the same endpoint after it is recorded."""
    import os as _os
    from sluice_e2e import Proc
    w = make_world(recorder_flush_ms=100)
    ep = "future" + w.tag
    now = int(time.time() * 1000)

    for i, ts in enumerate((now + 365 * 86400 * 1000, now)):
        w.put_outcome(ep, {"v": 1, "id": f"ev-future-{w.tag}-{i}", "ep": ep,
                           "type": "order.paid", "attempt": 1, "state": "delivered",
                           "http": 200, "ts": ts, "created": now, "pod": "test-pod"})
    rp = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))
    q = wait_until(lambda: w.dump("quarantine"), 60, 0.5, "the outcome quarantined")
    assert len(q) == 1 and "ahead of postgresql's clock" in q[0]["reason"], q
    dsn = w.env["SLUICE_PG_DSN"]
    wait_until(lambda: psql(dsn, f"select count(*) from delivery_attempts where endpoint_id = "
                                 f"'{ep}'") == "1", 60, 0.5, "the sound outcome recorded")
    assert psql(dsn, f"select event_id from delivery_attempts where endpoint_id = '{ep}'") \
        == f"ev-future-{w.tag}-1"
    assert rp.term() == 0


def test_failures_while_the_breaker_stays_closed_do_not_disable(make_world):
    """Only failures for longer than disable_after_ms, but never the breaker open (threshold
    1000): no disable request, the endpoint stays enabled. A loop's own streak used to decide,
    so a loop that met an endpoint only through failing retries could disable a healthy one."""
    import os as _os
    from sluice_e2e import Proc
    w = make_world(max_attempts=50, retry_base_ms=100, retry_cap_ms=200, disable_after_ms=1500,
                   recorder_flush_ms=100, breaker_threshold=1000)
    rcv = w.receiver()
    ep = w.add_endpoint("fc" + w.tag, rcv.url("status/503", "fc"), "--max-inflight", "1")
    assert w.produce([event(ep, i, w.tag) for i in range(3)]).returncode == 0
    rec = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))
    c = w.consumer()

    def failing_long_enough():
        hits = sorted(l["ts_ms"] for l in rcv.ledger() if l["endpoint"] == "fc")
        return len(hits) > 5 and hits[-1] - hits[0] >= 3000
    wait_until(failing_long_enough, 60, 0.5, "3 s of failures")
    time.sleep(1)  # a disable request would be applied by now (recorder_flush_ms 100)
    assert not [o for o in w.outcomes() if o["state"] == "disabled"]
    r = w.ctl("endpoints", "show", ep, "--json")
    assert r.returncode == 0 and '"enabled": true' in r.stdout.replace('":true', '": true')
    assert c.term() == 0 and rec.term() == 0


def test_only_failures_for_disable_after_ms_disables_the_endpoint(make_world):
    """Its breaker opened (2 failures) and every probe since failed for disable_after_ms:
    the endpoint is disabled. The breaker is the endpoint's record across pods and loops; a
    loop's own run of failures (a loop that sees the endpoint only through failing retries)
    does not disable it."""
    import os as _os
    from sluice_e2e import Proc
    w = make_world(max_attempts=50, retry_base_ms=100, retry_cap_ms=200, disable_after_ms=1500,
                   recorder_flush_ms=100, breaker_threshold=2, breaker_cooldown_ms=200,
                   breaker_cooldown_max_ms=400)
    rcv = w.receiver()
    ep = w.add_endpoint("ff" + w.tag, rcv.url("status/503", "ff"), "--max-inflight", "1")
    assert w.produce([event(ep, i, w.tag) for i in range(3)]).returncode == 0
    rec = Proc([w.bin("recorder/sluice-recorder")], w.env, _os.path.join(w.dir, "recorder.log"))
    c = w.consumer()

    def disabled():
        r = w.ctl("endpoints", "show", ep, "--json")
        return r.returncode == 0 and '"enabled": false' in r.stdout.replace('":false', '": false') \
            and r.stdout

    shown = wait_until(disabled, 60, 0.5, "endpoint disabled after only failures")
    assert "nothing but failures" in shown, shown
    # the retries still in the schedule die when they come due, without an attempt: attempt
    # 0 on the outcome (the failed attempt before was reported already; counting it again
    # would double the endpoint's failures), the attempts spent kept on the dead letter
    ids = [event(ep, i, w.tag)["id"] for i in range(3)]

    def disabled_deaths():
        fin = final_states(w.outcomes())
        got = [fin.get((i, ep), {}) for i in ids]
        return got if all(o.get("err") == "endpoint_disabled" for o in got) else None

    deaths = wait_until(disabled_deaths, 60, 0.5, "the scheduled retries dead-lettered")
    assert all(o["attempt"] == 0 for o in deaths), deaths
    # (an event the open breaker kept deferring may have spent no attempt at all)
    spent = {i: max((o["attempt"] for o in w.outcomes() if o.get("id") == i and
                     o.get("endpoint") == ep and o["state"] == "retry_scheduled"), default=0)
             for i in ids}
    want = sum(spent.values()) / len(ids)

    def recorded():
        r = w.ctl("dead-letters", "--endpoint", ep, "--json")
        e = [x for x in json.loads(r.stdout)["endpoints"]] if r.returncode == 0 else []
        return e[0] if e and e[0]["dead_letters"] == 3 else None

    dl = wait_until(recorded, 60, 0.5, "three dead letters recorded")
    assert abs(dl["avg_attempts"] - want) < 1e-9, (dl, spent)
    assert c.term() == 0 and rec.term() == 0
    hits = sorted(l["ts_ms"] for l in rcv.ledger() if l["endpoint"] == "ff")
    assert hits[-1] - hits[0] >= 1500 - 200, "disabled before disable_after_ms of failures"
