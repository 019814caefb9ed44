"""sluice-api on the real stack (issue "The HTTP API"): fan-out by event type and channel,
idempotent publishes that survive a crash between Kafka's acknowledgement and the answer,
API key scopes, revocation and rate limits, and every bad-input answer.

Oracles: the scripted receiver's ledger (what each endpoint really received, signatures
verified), the outcome records on Kafka, and the API's own answers (problem+json).
"""

import collections
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time

from sluice_e2e import PrivateDb, ledger_ok, psql, wait_until

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))


def call(api, method, path, body=None, key=None, headers=None, raw=None):
    """One request on a fresh connection: (status, headers dict (lower-case), parsed JSON)."""
    host, port = api.base.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30 * MULT)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    text = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hdrs, (json.loads(text) if text else None)


def call_text(api, path, key):
    """GET path: (status, the answer's bytes as sent)."""
    host, port = api.base.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30 * MULT)
    c.request("GET", path, headers={"Authorization": f"Bearer {key}"})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def delivered_pairs(rcv):
    return collections.Counter((l["webhook_id"], l["endpoint"]) for l in ledger_ok(rcv))


def problem(status, hdrs, body, want_status, field=None):
    assert status == want_status, (status, body)
    assert hdrs.get("content-type") == "application/problem+json", hdrs
    assert body["status"] == want_status and body["type"].startswith("urn:sluice:problem:")
    if field is not None:
        assert body.get("field") == field, body


def test_fanout_reaches_exactly_the_subscribed_enabled_endpoints_once_signed(make_world):
    w = make_world()
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    t = w.tag

    def ep(name, *flags):
        return w.add_endpoint(f"{name}_{t}", rcv.url("ok", f"{name}_{t}"), *flags)

    exact = ep("exact", "--types", "order.created")
    wild = ep("wild", "--types", "order.*")
    every = ep("every")
    other = ep("other", "--types", "user.created,order.paid.x")
    off = ep("off", "--types", "order.created")
    tenant = ep("tenant", "--types", "order.*", "--channels", "tenant_a,tenant_b")
    r = w.ctl("endpoints", "disable", off, "--reason", "test")
    assert r.returncode == 0, r.stderr
    key = w.api_key("publish")
    api = w.api()
    c = w.consumer()

    # exact type, no channels: exact + wildcard + unfiltered; not other/disabled/channelled
    st, _, a = call(api, "POST", "/v1/events", {"type": "order.created", "body": {"n": 1}}, key)
    assert st == 202, a
    assert sorted(a["endpoints"]) == sorted([exact, wild, every]) and a["deliveries"] == 3
    # wildcard with a channel: wild + every + tenant (exact names another type)
    st, _, b = call(api, "POST", "/v1/events",
                    {"type": "order.paid", "channels": ["tenant_b"], "body": {"n": 2}}, key)
    assert st == 202, b
    assert sorted(b["endpoints"]) == sorted([wild, every, tenant])
    # `order.*` does not match "order" itself; nobody but the unfiltered endpoint gets it
    st, _, d = call(api, "POST", "/v1/events", {"type": "order", "body": "x"}, key)
    assert st == 202 and d["endpoints"] == [every], d
    # an explicit endpoint bypasses the filters (the postback case), as before
    st, _, e = call(api, "POST", "/v1/events",
                    {"type": "anything", "endpoint": other, "body": "y"}, key)
    assert st == 202 and e["endpoints"] == [other], e

    want = {(a["id"], x) for x in a["endpoints"]} | {(b["id"], x) for x in b["endpoints"]} | \
        {(d["id"], every), (e["id"], other)}
    wait_until(lambda: want <= set(delivered_pairs(rcv)), 60 * MULT, 0.5, "fan-out delivered")
    time.sleep(1.0)
    got = delivered_pairs(rcv)
    assert set(got) == want, set(got) ^ want
    assert max(got.values()) == 1, "an endpoint received an event twice"
    assert all(l["sig_ok"] is True for l in rcv.ledger()), "a signature did not verify"
    # the body goes out byte for byte as posted: json.dumps wrote {"n": 1} (8 bytes, with its
    # space), not a re-serialised {"n":1}
    assert {l["bytes"] for l in ledger_ok(rcv) if l["webhook_id"] == a["id"]} == {8}
    assert c.term() == 0
    assert api.proc.term() == 0, "sluice-api did not exit 0 on SIGTERM"


def test_disable_and_enable_over_the_api_move_an_endpoint_out_of_and_back_into_fanout(
        make_world):
    """POST /v1/endpoints/{id}/disable takes an endpoint out of every fan-out (the other
    subscribers still get the event, and no record names the disabled one), .../enable puts
    it back; both show in GET /v1/endpoints/{id}."""
    w = make_world()
    rcv = w.receiver()
    t = w.tag
    a = w.add_endpoint(f"a_{t}", rcv.url("ok", f"a_{t}"), "--types", f"sw{t}.*")
    b = w.add_endpoint(f"b_{t}", rcv.url("ok", f"b_{t}"), "--types", f"sw{t}.*")
    admin, key = w.api_key("admin"), w.api_key("publish")
    api = w.api()
    c = w.consumer()

    def fan():
        st, _, r = call(api, "POST", "/v1/events", {"type": f"sw{t}.x", "body": 1}, key)
        assert st == 202, r
        return r
    assert sorted(fan()["endpoints"]) == sorted([a, b])
    st, _, r = call(api, "POST", f"/v1/endpoints/{b}/disable", {"reason": "maintenance"}, admin)
    assert st == 200 and r["enabled"] is False, r
    wait_until(lambda: fan()["endpoints"] == [a], 30 * MULT, 0.3, "b out of the fan-out")
    off = fan()
    assert off["endpoints"] == [a] and off["deliveries"] == 1
    st, _, r = call(api, "GET", f"/v1/endpoints/{b}", None, admin)
    assert st == 200 and r["enabled"] is False and r["disabled_reason"] == "maintenance", r
    st, _, r = call(api, "POST", f"/v1/endpoints/{b}/enable", None, admin)
    assert st == 200 and r["enabled"] is True, r
    wait_until(lambda: sorted(fan()["endpoints"]) == sorted([a, b]), 30 * MULT, 0.3,
               "b back in the fan-out")
    on = fan()
    wait_until(lambda: (on["id"], b) in delivered_pairs(rcv) and (off["id"], a) in
               delivered_pairs(rcv), 60 * MULT, 0.5, "the events after the changes delivered")
    assert (off["id"], b) not in delivered_pairs(rcv), "a disabled endpoint got the event"
    assert c.term() == 0 and api.proc.term() == 0


def test_idempotent_retry_after_a_crash_between_publish_and_answer(make_world):
    w = make_world()
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    eps = [w.add_endpoint(f"sub{i}_{w.tag}", rcv.url("ok", f"sub{i}_{w.tag}"),
                          "--types", "invoice.*") for i in range(3)]
    key = w.api_key("publish")
    c = w.consumer()
    body = {"type": "invoice.paid", "body": {"invoice": 7}}
    hdr = {"Idempotency-Key": f"inv-7-{w.tag}"}

    # SL_FAULT (test builds only) kills sluice-api after Kafka acknowledged, before the answer
    crashing = w.api(api_publish_timeout_ms=1000, _fault="api_after_publish")
    try:
        got = call(crashing, "POST", "/v1/events", body, key, hdr)
    except (ConnectionError, http.client.HTTPException, OSError):
        got = None
    assert got is None, f"answered {got} although the server should have died"
    crashing.proc.p.wait(10)
    assert crashing.proc.p.returncode == -signal.SIGKILL

    # the records it published are delivered (the crash came after Kafka's acknowledgement)
    wait_until(lambda: len(set(delivered_pairs(rcv))) == 3, 60 * MULT, 0.5, "first copy")
    first = delivered_pairs(rcv)
    ev_id = next(iter(first))[0]

    api = w.api(api_publish_timeout_ms=1000)
    # the claim of the dead request holds for 2 x publish timeout + 5 s: 409 until then
    st, hdrs, p = call(api, "POST", "/v1/events", body, key, hdr)
    problem(st, hdrs, p, 409, "Idempotency-Key")
    assert int(hdrs["retry-after"]) >= 1

    def retried():
        s, h, b = call(api, "POST", "/v1/events", body, key, hdr)
        return (s, b) if s == 202 else None
    st, ans = wait_until(retried, 30 * MULT, 0.5, "the retry to be accepted")
    assert ans["id"] == ev_id, "the retry must carry the event id of the first attempt"
    assert sorted(ans["endpoints"]) == sorted(eps)
    # the consumers saw the republished copies and suppressed them as duplicates
    def dups():
        return {o["endpoint"] for o in w.outcomes()
                if o["id"] == ev_id and o["state"] == "duplicate"}
    wait_until(lambda: dups() == set(eps), 60 * MULT, 0.5, "duplicates reported")
    got = delivered_pairs(rcv)
    assert set(got) == {(ev_id, e) for e in eps} and max(got.values()) == 1, got
    # a third try answers from the stored answer, without publishing
    n_out = len(w.outcomes())
    st, hdrs, again = call(api, "POST", "/v1/events", body, key, hdr)
    assert st == 202 and hdrs.get("idempotent-replayed") == "true" and again == ans
    # the same key with another request is refused
    st, hdrs, p = call(api, "POST", "/v1/events", dict(body, body={"invoice": 8}), key, hdr)
    problem(st, hdrs, p, 422, "Idempotency-Key")
    time.sleep(2)
    assert len(w.outcomes()) == n_out, "a replayed answer published again"
    assert c.term() == 0


def test_key_scopes_channels_revocation_and_rate_limit(make_world):
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"e_{w.tag}", rcv.url("ok", f"e_{w.tag}"), "--channels", "aff_1")
    ep2 = w.add_endpoint(f"f_{w.tag}", rcv.url("ok", f"f_{w.tag}"), "--channels", "aff_2")
    # no channels, every type: every event's channels match it, but a channel-limited key
    # cannot see it (an explicit publish to it is 403), so that key's fan-out leaves it out
    anyone = w.add_endpoint(f"g_{w.tag}", rcv.url("ok", f"g_{w.tag}"))
    pub = w.api_key("publish")
    read = w.api_key("read")
    admin = w.api_key("admin")
    aff1 = w.api_key("publish", channels="aff_1")
    slow = w.api_key("publish", rate=2, burst=2)
    api = w.api(api_key_refresh_ms=200)  # ready: the keys made before are loaded
    ev = {"type": "conv.ok", "endpoint": ep, "body": {"x": 1}}

    problem(*call(api, "POST", "/v1/events", ev), 401, "Authorization")
    problem(*call(api, "POST", "/v1/events", ev, "slk_nope"), 401, "Authorization")
    for (method, path, body, key), scope in (
            (("POST", "/v1/events", ev, read), "publish scope (or admin)"),
            (("GET", "/v1/endpoints", None, pub), "read scope (or admin)"),
            (("POST", "/v1/endpoints", {"id": "x", "url": "http://x.invalid/"}, read),
             "admin scope")):
        answer = call(api, method, path, body, key)
        problem(*answer, 403)
        assert answer[2]["detail"] == f"this operation needs an API key with the {scope}", answer
    # the audit trail: refusals (at most one line a second) and every change name the key by
    # its id, never its secret
    refused = api.proc.events("auth_refused")
    assert refused and refused[0]["route"] == "events.publish" and refused[0]["status"] == 401
    aud = f"aud_{w.tag}"
    assert call(api, "POST", "/v1/endpoints", {"id": aud, "url": "http://x.invalid/"},
                admin)[0] == 201
    assert call(api, "POST", f"/v1/endpoints/{aud}/disable", None, admin)[0] == 200
    wait_until(lambda: len(api.proc.events("api_change")) >= 2, 10 * MULT, 0.1, "audit lines")
    assert [(e["route"], e["key_id"], e["endpoint_id"], e["status"])
            for e in api.proc.events("api_change")] == \
        [("endpoints.create", admin[4:20], aud, 201), ("endpoints.disable", admin[4:20], aud, 200)]
    logs = api.proc.logs()
    assert not any(k[21:] in logs for k in (admin, read, pub)), "a key's secret reached the log"
    assert call(api, "POST", "/v1/events", ev, admin)[0] == 202  # admin implies publish
    assert call(api, "GET", "/v1/dead-letters", None, read)[0] == 200
    # a key limited to channels publishes only where those channels lead
    assert call(api, "POST", "/v1/events", ev, aff1)[0] == 202
    problem(*call(api, "POST", "/v1/events", dict(ev, endpoint=ep2), aff1), 404, "/endpoint")
    problem(*call(api, "POST", "/v1/events", {"type": "t", "body": 1}, aff1), 403, "/channels")
    st, _, b = call(api, "POST", "/v1/events",
                    {"type": "t", "channels": ["aff_1"], "body": 1}, aff1)
    assert st == 202 and b["endpoints"] == [ep], b
    problem(*call(api, "POST", "/v1/events", dict(ev, endpoint=anyone), aff1), 404, "/endpoint")
    st, _, b = call(api, "POST", "/v1/events",
                    {"type": "t", "channels": ["aff_1"], "body": 1}, pub)
    assert st == 202 and sorted(b["endpoints"]) == sorted([ep, anyone]), b

    # rate 2/s, burst 2: the third request in a row is refused with Retry-After
    codes = [call(api, "POST", "/v1/events", ev, slow) for _ in range(3)]
    assert [c[0] for c in codes[:2]] == [202, 202], codes
    problem(*codes[2], 429)
    assert int(codes[2][1]["retry-after"]) >= 1
    time.sleep(1.2)
    assert call(api, "POST", "/v1/events", ev, slow)[0] == 202, "the bucket did not refill"

    # revocation takes effect within the refresh interval
    key_id = pub.split("_")[1]
    r = w.ctl("keys", "revoke", key_id)
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    wait_until(lambda: call(api, "POST", "/v1/events", ev, pub)[0] == 401, 10 * MULT, 0.1,
               "the revoked key to be refused")
    assert time.monotonic() - t0 < 5 * MULT
    for line in api.proc.log_lines():
        assert pub not in line and pub[len("slk_") + 17:] not in line, "a key reached the log"
    assert api.proc.term() == 0


def test_generated_ids_follow_the_request_not_only_its_idempotency_key(make_world):
    """Events without an id get one derived from the Idempotency-Key, so that a retry after a
    crash republishes the same ids. Once the key's stored answer is gone (expired, or deleted
    by a 503) a different request under the same key is a new event: a new id, or the
    consumers' delivered markers would drop it as the first one's duplicate."""
    from sluice_e2e import redis_cmd
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"e_{w.tag}", rcv.url("ok", f"e_{w.tag}"))
    key = w.api_key("publish")
    api = w.api()
    hdr = {"Idempotency-Key": f"reuse-{w.tag}"}
    first = {"type": "t", "endpoint": ep, "body": {"n": 1}}
    st, _, a = call(api, "POST", "/v1/events", first, key, headers=hdr)
    assert st == 202, a
    # the answer is kept under the key for api_idempotency_ttl_s (24 h by default)
    idem = redis_cmd(w.env["SLUICE_REDIS_URL"], "KEYS", "sluice:idem:*") or []
    assert idem, "no idempotency state in Redis"
    ttls = [int(redis_cmd(w.env["SLUICE_REDIS_URL"], "TTL", k)) for k in idem]
    assert all(86400 - 60 <= t <= 86400 for t in ttls), ttls

    def forget():  # what the TTL does
        url = w.env["SLUICE_REDIS_URL"]
        for k in redis_cmd(url, "KEYS", "sluice:idem:*") or []:
            redis_cmd(url, "DEL", k)
    forget()
    st, _, b = call(api, "POST", "/v1/events", dict(first, body={"n": 2}), key, headers=hdr)
    assert st == 202 and b["id"] != a["id"], (a, b)
    forget()
    st, _, c = call(api, "POST", "/v1/events", first, key, headers=hdr)
    assert st == 202 and c["id"] == a["id"], "the same request must get the same id again"


def test_a_refusal_that_may_change_is_not_kept_for_the_idempotency_key(make_world):
    """A publish refused because this instance does not know the endpoint yet (404), for a
    single event or inside a batch, is not kept under its Idempotency-Key: the retry the docs
    advise, once the endpoint is known, publishes (it was answered the kept 404 for 24 h). A
    refusal that rests on the request alone (400) is kept and replayed."""
    w = make_world()
    rcv = w.receiver()
    key = w.api_key("publish")
    api = w.api()
    later = f"later_{w.tag}"
    one = {"type": "t", "endpoint": later, "body": {"n": 1}}
    batch = {"events": [dict(one, body={"n": 2})]}
    h1 = {"Idempotency-Key": f"one-{w.tag}"}
    h2 = {"Idempotency-Key": f"batch-{w.tag}"}
    problem(*call(api, "POST", "/v1/events", one, key, headers=h1), 404, "/endpoint")
    st, _, b = call(api, "POST", "/v1/events/batch", batch, key, headers=h2)
    assert st == 200 and b["results"][0]["status"] == 404, b
    w.add_endpoint(later, rcv.url("ok", later))
    st, hdrs, a = wait_until(lambda: (lambda x: x[0] == 202 and x)(
        call(api, "POST", "/v1/events", one, key, headers=h1)), 30 * MULT, 0.3,
        "the retry to publish once the endpoint is known")
    assert hdrs.get("idempotent-replayed") is None, hdrs
    st, hdrs, b = call(api, "POST", "/v1/events/batch", batch, key, headers=h2)
    assert st == 200 and b["accepted"] == 1 and hdrs.get("idempotent-replayed") is None, b
    # now kept: replayed
    st, hdrs, again = call(api, "POST", "/v1/events", one, key, headers=h1)
    assert st == 202 and again == a and hdrs.get("idempotent-replayed") == "true"
    h3 = {"Idempotency-Key": f"bad-{w.tag}"}
    problem(*call(api, "POST", "/v1/events", {"type": "t", "body": 1, "x": 2}, key,
                  headers=h3), 400, "/x")
    st, hdrs, _ = call(api, "POST", "/v1/events", {"type": "t", "body": 1, "x": 2}, key,
                       headers=h3)
    assert st == 400 and hdrs.get("idempotent-replayed") == "true", hdrs
    assert api.proc.term() == 0


def test_an_event_whose_record_would_exceed_the_cap_is_413_and_publishes_nothing(make_world):
    """Each field within its own limit, all together over the record cap (max_body_bytes +
    64 KiB): refused as too large before anything is published, not answered 503 as if Kafka
    were down (a client would retry that forever)."""
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"e_{w.tag}", rcv.url("ok", f"e_{w.tag}"))
    key = w.api_key("publish")
    api = w.api()
    c = w.consumer()
    macros = {f"m{i:02d}": "y" * 2048 for i in range(64)}
    big = {"type": "t", "endpoint": ep, "body": {"d": "x" * 1000000}, "macros": macros}
    st, hdrs, p = call(api, "POST", "/v1/events", big, key)
    problem(st, hdrs, p, 413, "/")
    assert "retry-after" not in hdrs
    # in a batch: refused for that event, the others accepted
    st, _, b = call(api, "POST", "/v1/events/batch",
                    {"events": [big, {"type": "t", "endpoint": ep, "body": 1}]}, key)
    assert st == 200 and [x["status"] for x in b["results"]] == [413, 202], b
    assert b["results"][0]["problem"]["field"] == "/events/0", b
    small = b["results"][1]["id"]
    wait_until(lambda: (small, ep) in delivered_pairs(rcv), 60 * MULT, 0.3, "the small event")
    time.sleep(1.5)
    assert list(delivered_pairs(rcv)) == [(small, ep)], "only the small event went out"
    assert c.term() == 0


def test_bad_input_gets_a_problem_naming_the_field_and_publishes_nothing(make_world):
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"e_{w.tag}", rcv.url("ok", f"e_{w.tag}"))
    key = w.api_key("publish")
    admin = w.api_key("admin")
    api = w.api(api_max_request_bytes=4096, api_batch_max=3, api_idle_timeout_s=2,
                api_max_connections=4)
    P = "/v1/events"
    problem(*call(api, "POST", P, None, key, raw="{\"type\": "), 400, "/")
    problem(*call(api, "POST", P, None, key, raw="[1,2]"), 400, "/")
    # invalid inside the body (which the API sends on without parsing it into a tree):
    # still refused as invalid JSON
    for bad in ('{"type":"a","endpoint":"%s","body":{"k":1,"k":2}}',
                '{"type":"a","endpoint":"%s","body":{"k":"\xff"}}',
                '{"type":"a","endpoint":"%s","body":{"k":01}}',
                '{"type":"a","endpoint":"%s","body":{"k":[1,]}}'):
        problem(*call(api, "POST", P, None, key, raw=(bad % ep).encode("latin-1")), 400, "/")
    st, hdrs, b = call(api, "POST", P, None, key, raw='{"type":"a","type":"b","body":1}')
    problem(st, hdrs, b, 400, "/")
    assert "a key repeated in one object" in b["detail"], b
    problem(*call(api, "POST", P, None, key, raw="x" * 5000), 413, "/")
    # the same without a declared length (chunked): read, dropped past the cap, then 413
    host, port = api.base.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30 * MULT)
    c.request("POST", P, body=iter([b"x" * 3000, b"y" * 3000]), encode_chunked=True,
              headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                       "Transfer-Encoding": "chunked"})
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    problem(r.status, {k.lower(): v for k, v in r.getheaders()}, body, 413, "/")
    problem(*call(api, "POST", P, {"type": "a.b", "body": 1, "endpont": ep}, key), 400, "/endpont")
    problem(*call(api, "POST", P, {"type": "bad type", "body": 1}, key), 400, "/type")
    problem(*call(api, "POST", P, {"body": 1}, key), 400, "/type")
    problem(*call(api, "POST", P, {"type": "a", "id": "has.dot", "body": 1}, key), 400, "/id")
    problem(*call(api, "POST", P, {"type": "a", "body": 1, "body_base64": "eA=="}, key), 400,
            "/body")
    problem(*call(api, "POST", P, {"type": "a", "body": 1, "channels": ["no space"]}, key), 400,
            "/channels")
    for name in ("webhook-id", "Webhook-Other", "X-Sluice-Attempt"):  # Sluice sets these
        problem(*call(api, "POST", P, {"type": "a", "body": 1, "headers": {name: "x"}}, key),
                400, "/headers")
    problem(*call(api, "POST", P, {"type": "a", "endpoint": "nope_" + w.tag, "body": 1}, key), 404,
            "/endpoint")
    for ct in ("text/plain", "application/jsonx", "application/json-seq"):
        problem(*call(api, "POST", P, {"type": "a", "body": 1}, key,
                      headers={"Content-Type": ct}), 415, "Content-Type")
    # an id in the path or the query with an encoded NUL is not read as the id before it
    problem(*call(api, "DELETE", f"/v1/endpoints/{ep}%00zzz", None, admin), 404)
    problem(*call(api, "GET", f"/v1/endpoints/{ep}%00", None, admin), 404)
    assert call(api, "GET", f"/v1/endpoints/{ep}", None, admin)[0] == 200
    problem(*call(api, "POST", P, {"type": "a", "body": 1}, key,
                  headers={"Idempotency-Key": ""}), 400, "Idempotency-Key")
    problem(*call(api, "POST", P + "/batch", {"events": [{"type": "a", "body": 1}] * 4}, key), 413,
            "/events")
    problem(*call(api, "GET", "/v1/nothing", None, key), 404)
    st, hdrs, b = call(api, "DELETE", P, None, key)
    problem(st, hdrs, b, 405)
    assert hdrs["allow"] == "POST"
    # a batch answers per event: one accepted, one refused naming its field; the accepted
    # event's body goes out byte for byte as it stands in the text (spacing, an exponent,
    # an escaped character, a nested "body" member)
    body0 = '{ "a" : [1, 2.5e3, "\\u00e9"], "body": {"x": null} }'
    raw = ('{"events": [{"type": "ok", "endpoint": "%s", "body": %s},'
           ' {"type": "ok", "endpoint": "%s", "body": 1, "macros": 5}]}' % (ep, body0, ep))
    st, _, b = call(api, "POST", P + "/batch", None, key, raw=raw)
    assert st == 200 and b["accepted"] == 1 and b["refused"] == 1, b
    assert b["results"][0]["status"] == 202
    assert b["results"][1]["problem"]["field"] == "/events/1/macros", b
    # nothing refused reached Kafka: exactly the accepted event's record is there
    recs = w.dump("deliveries")
    assert [r["id"] for r in recs] == [b["results"][0]["id"]], recs
    r = w.ctl("dump", "deliveries", "--idle-ms", "1500", "--show-payloads")
    assert r.returncode == 0, r.stderr
    assert [json.loads(l)["body"] for l in r.stdout.splitlines() if l.strip()] == [body0]
    # \u0000 is a character like any other in an event's body; in its other strings it is
    # refused by name (never read as the end of the string)
    ids = []
    raw = '{"type":"nul","endpoint":"%s","body":%s}'
    for body in ('{"k":"a\\u0000b"}', '"a\\u0000b"'):
        st, _, b = call(api, "POST", P, None, key, raw=raw % (ep, body),
                        headers={"Content-Type": "application/json; charset=utf-8"})
        assert st == 202, (body, b)
        ids.append(b["id"])
    problem(*call(api, "POST", P, None, key, raw='{"type":"a\\u0000b","body":1}'), 400, "/type")
    r = w.ctl("dump", "deliveries", "--idle-ms", "1500", "--show-payloads")
    got = {d["id"]: d["body"] for d in map(json.loads, r.stdout.splitlines()) if d["id"] in ids}
    assert got[ids[0]] == '{"k":"a\\u0000b"}' and got[ids[1]] == "a\u0000b", got

    # a stalled client (headers never finished) is disconnected after api_idle_timeout_s
    s = socket.create_connection(("127.0.0.1", int(api.base.rsplit(":", 1)[1])))
    s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
    s.settimeout(10 * MULT)
    t0 = time.monotonic()
    assert s.recv(100) == b"", "a stalled connection was not closed"
    assert time.monotonic() - t0 < 8 * MULT
    s.close()
    # past api_max_connections a new connection is not served (it waits in the listen
    # backlog, or is closed) until a slot frees; the server stays up
    port = int(api.base.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    for h in held:  # each held connection is really accepted and served
        h.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        h.settimeout(5)
        assert h.recv(100).startswith(b"HTTP/1.1 200")
    extra = socket.create_connection(("127.0.0.1", port))
    extra.settimeout(1.5)
    served = b""
    try:
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        served = extra.recv(100)
    except (socket.timeout, ConnectionResetError):
        pass
    assert not served.startswith(b"HTTP/1.1 200"), "a connection over the limit was served"
    for h in held:
        h.close()
    extra.close()
    wait_until(lambda: call(api, "GET", "/healthz")[0] == 200, 10, 0.2, "healthz again")
    assert api.proc.term() == 0


def test_a_client_trickling_its_request_is_closed_after_api_request_timeout_s(make_world):
    """A slow client (slowloris) keeps its connection busy, so the idle timeout never fires:
    api_request_timeout_s bounds the time to send a whole request, headers or body. The
    server's own wait (a publish suspended until Kafka answers) does not count, and a
    keep-alive connection whose requests come whole is served on and on."""
    w = make_world()
    ep = w.add_endpoint(f"e_{w.tag}", "http://127.0.0.1:9/never")
    key = w.api_key("publish")
    from sluice_e2e import free_port
    mport = free_port()
    api = w.api(api_idle_timeout_s=30, api_request_timeout_s=1, api_publish_timeout_ms=2500,
                topic_deliveries=f"missing{w.tag}.deliveries", metrics_listen=f"127.0.0.1:{mport}")
    port = api.port

    def timeouts():
        c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        (line,) = [l for l in text.splitlines()
                   if l.startswith("sluice_api_request_timeouts_total ")]
        return float(line.split()[1])
    assert timeouts() == 0

    def trickle(first, each):
        """Send first, then `each` every 0.3 s until the server closes: seconds it took."""
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(first)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 20 * MULT:
                time.sleep(0.3)
                s.sendall(each)
                s.settimeout(0.01)
                try:
                    if s.recv(100) == b"":
                        break
                except socket.timeout:
                    pass
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            s.close()
        return time.monotonic() - t0

    # headers a line at a time, never finished
    took = trickle(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
    assert 0.8 <= took < 5 * MULT, f"a trickled header was cut after {took:.1f} s"
    # whole headers, then a body a byte at a time
    took = trickle(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 500\r\n\r\n",
                   b" ")
    assert 0.8 <= took < 5 * MULT, f"a trickled body was cut after {took:.1f} s"
    # a keep-alive connection sending whole requests is served past the timeout
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10 * MULT)
    for _ in range(4):
        c.request("GET", "/healthz")
        r = c.getresponse()
        assert r.status == 200
        r.read()
        time.sleep(0.3)
    c.close()
    # the server's wait is not the client's: a publish Kafka never acknowledges is answered
    # 503 after api_publish_timeout_ms (2.5 s), not cut at 1
    t0 = time.monotonic()
    problem(*call(api, "POST", "/v1/events", {"type": "t", "endpoint": ep, "body": 1}, key), 503)
    assert time.monotonic() - t0 >= 2.2
    cut = api.proc.events("request_timeout")
    assert cut and "did not send a whole request within 1 s" in cut[0]["msg"], cut
    assert timeouts() == 2, "the two trickling connections are counted, the others are not"
    assert api.proc.term() == 0


def test_ed25519_secrets_on_create_and_rotate(make_world):
    """"signature": "ed25519" on create and rotate-secret: a whsk_ key pair and its whpk_ public
    key (checked with the `cryptography` package), deliveries signed v1a that sluice-receiver
    verifies with that key; "hmac" stays the default; bad values are 400 naming the field."""
    import base64
    import re
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def check_pair(whsk, whpk):
        assert re.fullmatch(r"whsk_[A-Za-z0-9+/]{86}==", whsk), whsk[:8]
        assert re.fullmatch(r"whpk_[A-Za-z0-9+/]{43}=", whpk), whpk
        raw = base64.b64decode(whsk[5:])
        assert Ed25519PrivateKey.from_private_bytes(raw[:32]).public_key().public_bytes_raw() \
            == raw[32:] == base64.b64decode(whpk[5:])

    w = make_world()
    admin = w.api_key("admin")
    api = w.api()
    c = w.consumer()
    ep = f"ed_{w.tag}"
    problem(*call(api, "POST", "/v1/endpoints", {"id": ep, "url": "http://127.0.0.1:9/x",
                                                 "signature": "rsa"}, admin), 400, "/signature")
    for idv, want in (("bad id!", 'field "id" must be 1..64 characters'),
                      (None, 'field "id" is required: 1..64 characters')):
        answer = call(api, "POST", "/v1/endpoints",
                      {"url": "http://127.0.0.1:9/x", **({"id": idv} if idv else {})}, admin)
        problem(*answer, 400, "/id")
        assert answer[2]["detail"].startswith(want), answer
    problem(*call(api, "POST", "/v1/endpoints", {"id": ep, "url": "http://127.0.0.1:9/x",
                                                 "signature": 1}, admin), 400, "/signature")
    st, _, b = call(api, "POST", "/v1/endpoints", {"id": ep, "url": "http://127.0.0.1:9/x",
                                                   "signature": "ed25519"}, admin)
    assert st == 201 and b["published"], b
    check_pair(b["secret"], b["public_key"])
    # the public key is read back with the endpoint (GET) whenever a receiver needs it again
    st, _, g = call(api, "GET", f"/v1/endpoints/{ep}", None, admin)
    assert st == 200 and [(x["signature"], x.get("public_key")) for x in g["secrets"]] == \
        [("ed25519", b["public_key"])], g["secrets"]
    # a receiver holding the new key; the endpoint moved to it (the scheme is not a PATCH field)
    rcv = w.receiver(secrets_list=[b["secret"]], extra=["--reject-bad-sig"])
    problem(*call(api, "PATCH", f"/v1/endpoints/{ep}", {"signature": "hmac"}, admin), 400,
            "/signature")
    st, _, e = call(api, "PATCH", f"/v1/endpoints/{ep}", {"url": rcv.url("ok", ep)}, admin)
    assert st == 200 and e["changed"] and "public_key" not in e, e
    wait_until(lambda: c.events("endpoint_changed"), 30 * MULT, 0.2, "the consumer to see it")
    st, _, ev = call(api, "POST", "/v1/events", {"type": "t.x", "endpoint": ep, "body": 1}, admin)
    assert st == 202, ev
    wait_until(lambda: ledger_ok(rcv), 60 * MULT, 0.3, "the delivery")
    assert [(x["webhook_id"], x["sig_ok"]) for x in ledger_ok(rcv)] == [(ev["id"], True)]

    # rotate: to a second Ed25519 key (without "signature": the current scheme is kept),
    # then back to HMAC
    problem(*call(api, "POST", f"/v1/endpoints/{ep}/rotate-secret", {"signature": "dsa"}, admin),
            400, "/signature")
    st, _, r = call(api, "POST", f"/v1/endpoints/{ep}/rotate-secret", {"overlap_s": 60}, admin)
    assert st == 200 and r["seq"] == 2, r
    check_pair(r["secret"], r["public_key"])
    assert r["public_key"] != b["public_key"]
    st, _, r = call(api, "POST", f"/v1/endpoints/{ep}/rotate-secret",
                    {"signature": "hmac", "overlap_s": 0}, admin)
    assert st == 200 and r["secret"].startswith("whsec_") and "public_key" not in r, r
    st, _, r = call(api, "POST", f"/v1/endpoints/{ep}/rotate-secret", {"overlap_s": 0}, admin)
    assert st == 200 and r["secret"].startswith("whsec_") and "public_key" not in r, r
    st, _, g = call(api, "GET", f"/v1/endpoints/{ep}", None, admin)
    cur = [x for x in g["secrets"] if x["expires_at"] is None]  # the first key's overlap runs
    assert [x["signature"] for x in cur] == ["hmac"] and "public_key" not in cur[0], g["secrets"]
    assert c.term() == 0


def test_kafka_not_acknowledging_is_503_with_retry_after(make_world):
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"e_{w.tag}", rcv.url("ok", f"e_{w.tag}"))
    key = w.api_key("publish")
    # a deliveries topic that does not exist: Kafka never acknowledges the record
    api = w.api(api_publish_timeout_ms=1500, topic_deliveries=f"missing{w.tag}.deliveries")
    t0 = time.monotonic()
    st, hdrs, p = call(api, "POST", "/v1/events",
                       {"type": "t", "endpoint": ep, "body": 1, "id": f"evt_{w.tag}"}, key)
    problem(st, hdrs, p, 503)
    assert p["id"] == f"evt_{w.tag}" and int(hdrs["retry-after"]) >= 1
    assert time.monotonic() - t0 < 15 * MULT
    # the same key while its first request is still waiting for Kafka: 409, not a second
    # publish; once that one answered 503 (its state deleted), the retry is tried again
    import threading
    hdr = {"Idempotency-Key": f"live-{w.tag}"}
    ev = {"type": "t", "endpoint": ep, "body": 2, "id": f"evt2_{w.tag}"}
    got = {}
    t = threading.Thread(target=lambda: got.update(r=call(api, "POST", "/v1/events", ev, key,
                                                          headers=hdr)))
    t.start()
    time.sleep(0.4)
    assert t.is_alive(), "the first request was answered before the check"
    problem(*call(api, "POST", "/v1/events", ev, key, headers=hdr), 409)
    t.join(30 * MULT)
    problem(*got["r"], 503)
    t1 = time.monotonic()
    st, hdrs, p = call(api, "POST", "/v1/events", ev, key, headers=hdr)
    problem(st, hdrs, p, 503)
    # tried again (waited for Kafka), not the first answer replayed
    assert "idempotent-replayed" not in hdrs and time.monotonic() - t1 >= 1.2, hdrs
    assert api.proc.term() == 0


def test_a_full_kafka_queue_fails_the_rest_at_once_instead_of_waiting_per_record(make_world):
    """Kafka's local queue stayed full for the enqueue wait (SL_FAULT=api_queue_full, test
    builds only: every publish fails so): the batch's first record waited, the other events
    are answered 503 without being tried, and so is the next request within that wait; after
    it the next request tries again. Before, every record of a batch waited in turn on its
    HTTP loop (a batch of 100 events fanned out to 10 endpoints: 1,000 waits of a second)."""
    w = make_world()
    rcv = w.receiver()
    eps = [w.add_endpoint(f"q{i}_{w.tag}", rcv.url("ok", f"q{i}_{w.tag}"), "--types", "q.*")
           for i in range(2)]
    key = w.api_key("publish")
    api = w.api(api_batch_max=10, _fault="api_queue_full")
    batch = {"events": [{"type": "q.x", "body": i, "id": f"q{i}_{w.tag}"} for i in range(4)]}
    st, hdrs, ans = call(api, "POST", "/v1/events/batch", batch, key)
    answered = time.monotonic()
    assert st == 503 and ans["unacknowledged"] == 4, (st, ans)
    assert [e["status"] for e in ans["results"]] == [503] * 4, ans
    tried = [e for e in api.proc.events("publish_failed") if "SL_FAULT" in e["msg"]]
    shed = [e for e in api.proc.events("publish_failed") if "not tried" in e["msg"]]
    assert len(tried) == 1 and len(shed) == 3, (tried, shed)
    # within the wait after it (1 s from before the answer), the next request is not tried
    soon = time.monotonic() - answered < 0.8
    st, hdrs, p = call(api, "POST", "/v1/events", {"type": "q.x", "body": 9, "id": f"q9_{w.tag}"},
                       key)
    problem(st, hdrs, p, 503)
    last = api.proc.events("publish_failed")[-1]["msg"]
    assert ("not tried" in last) if soon else ("SL_FAULT" in last), last
    # after it, requests try again
    time.sleep(1.2)
    st, hdrs, p = call(api, "POST", "/v1/events", {"type": "q.x", "body": 8, "id": f"q8_{w.tag}"},
                       key)
    problem(st, hdrs, p, 503)
    assert int(hdrs["retry-after"]) >= 1
    assert "SL_FAULT" in api.proc.events("publish_failed")[-1]["msg"]
    assert len(eps) == 2 and api.proc.term() == 0


def test_delivery_log_dead_letters_replay_and_channel_limited_management(make_world):
    from sluice_e2e import Proc
    w = make_world()
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    ep = w.add_endpoint(f"pay_{w.tag}", rcv.url("unauth", f"pay_{w.tag}"), "--types", "pay.*")
    ok = w.add_endpoint(f"pbx_{w.tag}", rcv.url("ok", f"pbx_{w.tag}"), "--types", "pay.*")
    admin = w.api_key("admin")
    read = w.api_key("read")
    tenant_read = w.api_key("read", channels="zz")
    tenant_admin = w.api_key("admin", channels="zz")
    api = w.api()
    c = w.consumer()
    env = dict(w.env, SLUICE_INSTANCE_ID="rec", SLUICE_RECORDER_FLUSH_MS="100")
    rec = Proc([w.bin("recorder/sluice-recorder")], env, os.path.join(w.dir, "recorder.log"))
    w.consumers.append(rec)  # the World kills it on close when the test fails first
    ids = []
    for i in range(3):
        st, _, b = call(api, "POST", "/v1/events", {"type": "pay.failed", "body": {"i": i}}, admin)
        assert st == 202 and b["endpoints"] == [ep, ok], b
        ids.append(b["id"])

    # the receiver answers 401: permanent, so each is a dead letter at once, in the history
    def letters():
        st, _, b = call(api, "GET", f"/v1/dead-letters?endpoint={ep}&limit=2", None, admin)
        assert st == 200, b
        return b
    page = wait_until(lambda: (lambda b: b if len(b["data"]) == 2 else None)(letters()),
                      60 * MULT, 0.5, "dead letters recorded")
    assert page["next_cursor"], "two of three on the first page: a cursor to the rest"
    st, _, rest = call(api, "GET", f"/v1/dead-letters?endpoint={ep}&limit=2&cursor="
                    f"{page['next_cursor']}", None, admin)
    got = {d["event_id"] for d in page["data"] + rest["data"]}
    assert st == 200 and got == set(ids) and rest["next_cursor"] is None, rest
    assert all(d["error"] == "http_4xx" and d["last_status"] == 401 for d in page["data"])
    # a cursor pages its own list with its own filters only (any limit): under other filters
    # or on another list it is a 400, not a page of something else
    cur = page["next_cursor"]
    for path in (f"/v1/dead-letters?cursor={cur}", f"/v1/event-types?cursor={cur}",
                 f"/v1/dead-letters?endpoint={ok}&cursor={cur}", f"/v1/endpoints?cursor={cur}",
                 f"/v1/endpoint-stats?cursor={cur}"):
        problem(*call(api, "GET", path, None, admin), 400, "cursor")
    st, _, same = call(api, "GET", f"/v1/dead-letters?cursor={cur}&limit=5&endpoint={ep}",
                       None, admin)
    assert st == 200 and same["data"] == rest["data"], same
    # what the endpoint answered, for admin keys only (the endpoint owner's text)
    assert all(d["last_response"] == '{"status":401}\n' and d["last_response_base64"] is None
               for d in page["data"]), page
    st, _, rd = call(api, "GET", f"/v1/dead-letters?endpoint={ep}&limit=2", None, read)
    assert st == 200 and len(rd["data"]) == 2, rd
    assert all(d["last_response"] is None and d["last_response_base64"] is None
               for d in rd["data"]), rd
    # bytes that are not UTF-8 come as base64
    binep = f"bin_{w.tag}"
    psql(w.env["SLUICE_PG_DSN"],
         "insert into dead_letters (event_id, endpoint_id, attempts, first_failed_at, dead_at, "
         f"last_response) values ('evt_{w.tag}', '{binep}', 1, now(), now(), '\\xff00'::bytea)")
    try:
        st, _, bd = call(api, "GET", f"/v1/dead-letters?endpoint={binep}", None, admin)
        assert st == 200 and [(d["last_response"], d["last_response_base64"])
                              for d in bd["data"]] == [(None, "/wA=")], bd
    finally:
        psql(w.env["SLUICE_PG_DSN"], f"delete from dead_letters where endpoint_id = '{binep}'")
    # a forged cursor is a 400 naming it, not a server error
    problem(*call(api, "GET", "/v1/dead-letters?cursor=61626320612062", None, admin), 400,
            "cursor")
    # one event's deliveries and attempts, with the latency phases
    def both():
        st, _, d = call(api, "GET", f"/v1/events/{ids[0]}/deliveries", None, admin)
        return d if st == 200 and len(d["data"]) == 2 else None
    d = wait_until(both, 30 * MULT, 0.3, "both deliveries recorded")
    assert [x["endpoint"] for x in d["data"]] == [ep, ok] and d["next_cursor"] is None, d
    assert d["data"][1]["state"] == "delivered" and d["data"][1]["last_status"] == 204
    st, _, p1 = call(api, "GET", f"/v1/events/{ids[0]}/deliveries?limit=1", None, admin)
    st2, _, p2 = call(api, "GET", f"/v1/events/{ids[0]}/deliveries?limit=1&cursor="
                      f"{p1['next_cursor']}", None, admin)
    assert [x["endpoint"] for x in p1["data"]] == [ep] and p1["next_cursor"], p1
    assert p2["data"] == d["data"][1:] and p2["next_cursor"] is None, p2
    assert p1["data"][0]["attempts_log"] == d["data"][0]["attempts_log"]
    att = d["data"][0]["attempts_log"]
    assert d["data"][0]["state"] == "dead_letter" and att[-1]["http_status"] == 401, d
    assert att[-1]["latency_ms"] is not None and "first_byte_ms" in att[-1]["phases"]
    # figures rounded to 0.001 ms are written so, not as 17 significant digits
    st, text = call_text(api, f"/v1/events/{ids[0]}/deliveries", admin)
    assert st == 200 and b"_ms" in text and not re.search(rb"\d\.\d{7,}", text), text

    # a key limited to channels sees and changes only its tenant's endpoints
    st, _, lst = call(api, "GET", "/v1/endpoints?limit=500", None, tenant_read)
    assert st == 200 and ep not in [e["id"] for e in lst["data"]]
    # nor asks for another tenant's dead letters (not even whether there are any)
    problem(*call(api, "GET", f"/v1/dead-letters?endpoint={ep}&limit=1", None, tenant_read),
            404, "endpoint")
    # nor sees them in its pages, not even as empty pages with a cursor to page through:
    # its list holds only its endpoints' letters
    st, _, tp = call(api, "GET", "/v1/dead-letters?limit=1", None, tenant_read)
    assert st == 200 and tp["data"] == [] and tp["next_cursor"] is None, tp
    # a cursor is opaque: plain hex of the last row's position would name its endpoint and
    # event
    for cur in (page["next_cursor"], p1["next_cursor"]):
        text = bytes.fromhex(cur)
        assert ep.encode() not in text and not any(x.encode() in text for x in ids), text
    problem(*call(api, "GET", f"/v1/endpoints/{ep}", None, tenant_read), 404)
    problem(*call(api, "PATCH", f"/v1/endpoints/{ep}", {"name": "x"}, tenant_admin), 404)
    problem(*call(api, "DELETE", f"/v1/endpoints/{ep}", None, tenant_admin), 404)
    problem(*call(api, "POST", "/v1/endpoints",
                  {"id": f"t_{w.tag}", "url": rcv.url("ok", "t")}, tenant_admin), 403,
            "/channels")
    # nor replays them (another tenant's endpoint is not there for it), and must name one
    problem(*call(api, "POST", "/v1/dead-letters/replay", {"endpoint": ep}, tenant_admin), 404,
            "/endpoint")
    problem(*call(api, "POST", "/v1/dead-letters/replay", {"all": True}, tenant_admin), 403,
            "/endpoint")
    problem(*call(api, "GET", f"/v1/dead-letters/patterns?endpoint={ep}", None, tenant_read),
            404, "endpoint")

    # the endpoint is fixed; a dry run shows what a replay would send; the replay sends each
    # letter once; a second replay sends nothing
    st, _, e = call(api, "PATCH", f"/v1/endpoints/{ep}", {"url": rcv.url("ok", ep)}, admin)
    assert st == 200 and e["changed"] and e["published"], e
    wait_until(lambda: c.events("endpoint_changed"), 30 * MULT, 0.2, "the consumer to see it")
    st, _, dry = call(api, "POST", "/v1/dead-letters/replay", {"endpoint": ep, "dry_run": True},
                      admin)
    assert st == 200 and dry["would_replay"] == 3, dry
    assert {x["event_id"] for x in dry["candidates"]} == set(ids)
    problem(*call(api, "POST", "/v1/dead-letters/replay", {}, admin), 400)
    st, _, run = call(api, "POST", "/v1/dead-letters/replay", {"endpoint": ep}, admin)
    assert st == 200 and run["complete"] and run["replayed"] == 3, run
    assert {x["outcome"] for x in run["letters"]} == {"replayed"}
    # the journal says who replayed: the API key's id (never the key)
    actors = psql(w.env["SLUICE_PG_DSN"], "select string_agg(distinct actor, ',')"
                  f" from replay_log where run_id = '{run['run_id']}'")
    assert re.fullmatch(r"sluice-api key [a-z0-9]{16}", actors), actors
    assert actors.split()[-1] in admin, "the id of the admin key"
    wait_until(lambda: {(x, ep) for x in ids} <= set(delivered_pairs(rcv)), 60 * MULT, 0.5,
               "replayed letters delivered")
    st, _, again = call(api, "POST", "/v1/dead-letters/replay", {"endpoint": ep}, admin)
    assert st == 200 and again["replayed"] == 0, again
    time.sleep(1.5)
    got = delivered_pairs(rcv)
    assert all(got[(x, ep)] == 1 for x in ids), got
    assert c.term() == 0
    assert rec.term() == 0


def test_header_values_are_write_only_and_a_shared_endpoint_needs_all_channels(make_world):
    """Extra header values (often credentials) never come back in an answer and the
    placeholder shown instead is refused as a value; answers are not to be cached. A key
    without admin scope sees an endpoint URL's query values and fragment redacted. A key
    limited to channels rotates or deletes only endpoints whose channels are all its own
    (seeing one through a shared channel is not enough), and /v1/event-types shows it only the
    types of endpoints it sees."""
    w = make_world()
    rcv = w.receiver()
    admin = w.api_key("admin")
    reader = w.api_key("read")
    tenant = w.api_key("admin", channels="ta")
    api = w.api()

    def create(i, chans, types, headers=None):
        body = {"id": f"{i}_{w.tag}", "url": rcv.url("ok", i), "channels": chans, "types": types}
        if headers:
            body["headers"] = headers
        st, _, b = call(api, "POST", "/v1/endpoints", body, admin)
        assert st == 201, b
        return b["id"]
    shared = create("shared", ["ta", "tb"], ["ta.paid"], {"Authorization": "Basic c2VjcmV0"})
    own = create("own", ["ta"], ["ta.paid"])
    other = create("other", ["tc"], ["tc.secret_type"])
    create("all", ["ta"], [])  # no type filter: takes every type

    # a postback URL's query values and fragment are for admin keys only
    token = "s3cr3t" + w.tag
    pb_url = rcv.url("ok", "pb") + f"?click={{click_id}}&token={token}&flag#part"
    st, _, b = call(api, "POST", "/v1/endpoints", {"id": f"pb_{w.tag}", "url": pb_url,
                                                   "template": True, "types": ["pb.x"]}, admin)
    assert st == 201 and b["url"] == pb_url, b
    st, _, b = call(api, "GET", f"/v1/endpoints/pb_{w.tag}", None, admin)
    assert st == 200 and b["url"] == pb_url, b
    st, _, b = call(api, "GET", f"/v1/endpoints/pb_{w.tag}", None, reader)
    assert st == 200 and b["url"] == (rcv.url("ok", "pb") + "?click=[redacted]&token=[redacted]"
                                      "&[redacted]#[redacted]"), b
    mine, cursor = [], None
    for _ in range(100):  # the list redacts as the read does, on whichever page it is
        st, _, lst = call(api, "GET", "/v1/endpoints?limit=500" +
                          (f"&cursor={cursor}" if cursor else ""), None, reader)
        assert st == 200 and token not in json.dumps(lst), lst
        mine += [e for e in lst["data"] if e["id"] == f"pb_{w.tag}"]
        cursor = lst["next_cursor"]
        if mine or not cursor:
            break
    assert [e["url"] for e in mine] == [b["url"]], mine

    st, hdrs, b = call(api, "GET", f"/v1/endpoints/{shared}", None, reader)
    assert st == 200 and b["headers"] == {"Authorization": "[redacted]"}, b
    assert hdrs["cache-control"] == "no-store" and hdrs["x-content-type-options"] == "nosniff"
    st, _, lst = call(api, "GET", "/v1/endpoints?limit=500", None, reader)
    assert st == 200 and "c2VjcmV0" not in json.dumps(lst)
    problem(*call(api, "PATCH", f"/v1/endpoints/{shared}",
                  {"headers": {"Authorization": "[redacted]"}}, admin), 400, "/headers")

    problem(*call(api, "POST", f"/v1/endpoints/{shared}/rotate-secret", {"overlap_s": 0},
                  tenant), 403)
    problem(*call(api, "DELETE", f"/v1/endpoints/{shared}", None, tenant), 403)
    # nor can it take the shared endpoint over by narrowing its channels to its own, or turn
    # it off or on for the other tenant
    problem(*call(api, "PATCH", f"/v1/endpoints/{shared}",
                  {"channels": ["ta"], "url": rcv.url("ok", "taken")}, tenant), 403, "/channels")
    problem(*call(api, "POST", f"/v1/endpoints/{shared}/disable", {"reason": "r"}, tenant), 403)
    problem(*call(api, "POST", f"/v1/endpoints/{shared}/enable", None, tenant), 403)
    st, _, b = call(api, "GET", f"/v1/endpoints/{shared}", None, admin)
    assert st == 200 and b["channels"] == ["ta", "tb"] and b["enabled"], b
    problem(*call(api, "DELETE", f"/v1/endpoints/{other}", None, tenant), 404)
    st, _, b = call(api, "POST", f"/v1/endpoints/{own}/rotate-secret", {"overlap_s": 0}, tenant)
    assert st == 200 and b["secret"].startswith("whsec_"), b
    st, _, _ = call(api, "DELETE", f"/v1/endpoints/{own}", None, tenant)
    assert st == 204

    def types(key):
        st, _, b = call(api, "GET", "/v1/event-types?limit=500", None, key)
        assert st == 200, b
        return {t["type"] for t in b["data"]}
    wait_until(lambda: {"ta.paid", "tc.secret_type"} <= types(admin), 30 * MULT, 0.2,
               "sluice-api to see the endpoints")
    seen = types(tenant)
    assert "ta.paid" in seen and "tc.secret_type" not in seen, seen

    def subscribed():
        st, _, b = call(api, "GET", "/v1/event-types?limit=500", None, admin)
        return {t["type"]: t["subscribed_endpoints"] for t in b["data"]}
    # an endpoint without a type filter takes every type: counted for each ("own" is gone)
    wait_until(lambda: {k: v for k, v in subscribed().items() if k in ("ta.paid", "pb.x",
                        "tc.secret_type")} == {"ta.paid": 2, "pb.x": 2, "tc.secret_type": 2},
               30 * MULT, 0.2, "the subscriptions counted")
    # past 8 unexpired secrets a rotation is refused naming the overlap, the value to change
    rot = create("rot", ["ta"], [])
    for _ in range(7):
        st, _, b = call(api, "POST", f"/v1/endpoints/{rot}/rotate-secret", {"overlap_s": 3600},
                        admin)
        assert st == 200, b
    st, hdrs, b = call(api, "POST", f"/v1/endpoints/{rot}/rotate-secret", {"overlap_s": 3600},
                       admin)
    problem(st, hdrs, b, 400, "/overlap_s")
    assert "limit 8" in b["detail"] and "--overlap-s" not in b["detail"], b
    # the action bodies name an unknown member (rotate and disable named their own field;
    # enable ignored its body)
    st, hdrs, b = call(api, "POST", f"/v1/endpoints/{shared}/rotate-secret", {"foo": 1}, admin)
    problem(st, hdrs, b, 400, "/foo")
    assert b["detail"] == 'unknown field "foo"', b
    problem(*call(api, "POST", f"/v1/endpoints/{shared}/disable", {"reason": "r", "bar": 2},
                  admin), 400, "/bar")
    problem(*call(api, "POST", f"/v1/endpoints/{shared}/enable", {"x": 1}, admin), 400, "/x")
    # a rule across two policy fields names the one it refuses where the body has it
    problem(*call(api, "PATCH", f"/v1/endpoints/{shared}",
                  {"policy": {"timeout_ms": 1000, "conn_timeout_ms": 5000}}, admin), 400,
            "/policy/conn_timeout_ms")
    # dead letters: a key limited to channels pages through its endpoints' letters only, so
    # many newer letters of endpoints it does not see leave its first page full
    dsn = w.env["SLUICE_PG_DSN"]
    psql(dsn, "insert into dead_letters (event_id, endpoint_id, attempts, first_failed_at, "
              f"dead_at) values ('evt_own_{w.tag}', '{shared}', 1, now(), now() - interval '1 h')"
              + "".join(f", ('evt_o{i}_{w.tag}', '{other}', 1, now(), now())" for i in range(5)))
    try:
        st, _, dl = call(api, "GET", "/v1/dead-letters?limit=1", None, tenant)
        assert st == 200 and [d["event_id"] for d in dl["data"]] == [f"evt_own_{w.tag}"], dl
        st, _, dl = call(api, "GET", "/v1/dead-letters?limit=1", None, admin)
        assert st == 200 and dl["data"][0]["endpoint"] != shared and dl["next_cursor"], dl
    finally:
        psql(dsn, f"delete from dead_letters where event_id like 'evt_%_{w.tag}'")
    assert api.proc.term() == 0


def test_lists_and_history_hold_under_a_linguistic_collation(make_world):
    """On a database whose default collation is linguistic (ICU en-US sorts "acme", "Beta",
    "charlie", "Delta"; bytes sort "Beta", "Delta", "acme", "charlie"), the endpoint list and
    each of its pages keep every endpoint's secrets, `sluicectl endpoints sync` republishes
    every row, and an event's deliveries keep their attempts when an endpoint sorted before
    them has none left (its attempts aged out, its deliveries row kept)."""
    w = make_world()
    db = PrivateDb("sluice_icu_", icu_locale="en-US")
    w.env["SLUICE_PG_DSN"] = db.dsn
    try:
        rcv = w.receiver()
        admin = w.api_key("admin")
        api = w.api()
        ids = [f"{n}_{w.tag}" for n in ("acme", "Beta", "charlie", "Delta")]
        for i in ids:
            st, _, b = call(api, "POST", "/v1/endpoints", {"id": i, "url": rcv.url("ok", i)},
                            admin)
            assert st == 201, b
        st, _, lst = call(api, "GET", "/v1/endpoints?limit=500", None, admin)
        assert st == 200 and sorted(x["id"] for x in lst["data"]) == sorted(ids), lst
        assert all(x["secrets"] for x in lst["data"]), lst
        seen, cur = [], ""
        while True:
            st, _, page = call(api, "GET", f"/v1/endpoints?limit=1{cur}", None, admin)
            assert st == 200 and len(page["data"]) <= 1 and all(x["secrets"] for x in page["data"])
            seen += [x["id"] for x in page["data"]]
            if not page["next_cursor"]:
                break
            cur = f"&cursor={page['next_cursor']}"
        assert sorted(seen) == sorted(ids) and len(seen) == len(ids), seen
        r = w.ctl("endpoints", "sync")
        assert r.returncode == 0 and f"{len(ids)} endpoint" in r.stdout, r.stdout + r.stderr
        # dead-letter patterns, two letters each (all tied): pages of one go through the ids
        # in byte order, each once
        for i in ids:
            for k in range(2):
                db.q(f"insert into dead_letters (event_id, endpoint_id, error_class, attempts, "
                     f"first_failed_at, dead_at) values ('ev-dl-{k}', '{i}', 'http_4xx', 1, "
                     f"now(), now())")
        seen, cur = [], ""
        for _ in range(10):
            st, _, page = call(api, "GET", f"/v1/dead-letters/patterns?limit=1{cur}", None, admin)
            assert st == 200 and len(page["data"]) <= 1, page
            seen += [(x["endpoint"], x["dead_letters"]) for x in page["data"]]
            if not page["next_cursor"]:
                break
            cur = f"&cursor={page['next_cursor']}"
        assert seen == [(i, 2) for i in sorted(ids, key=lambda x: x.encode())], seen

        ev = f"ev-icu-{w.tag}"
        for i in ids:
            db.q(f"insert into deliveries (event_id, endpoint_id, event_type, state, attempts, "
                 f"first_seen, last_update, delivered_at) values ('{ev}', '{i}', 't.x', "
                 f"'delivered', 1, now(), now(), now())")
            if not i.startswith("acme"):
                db.q(f"insert into delivery_attempts (event_id, endpoint_id, attempt, state, "
                     f"http_status, ts, event_type) values ('{ev}', '{i}', 1, 'delivered', 200, "
                     f"now(), 't.x')")
        for limit in (500, 1):
            got, cur = {}, ""
            while True:
                st, _, page = call(api, "GET", f"/v1/events/{ev}/deliveries?limit={limit}{cur}",
                                   None, admin)
                assert st == 200, page
                got.update({d["endpoint"]: len(d["attempts_log"]) for d in page["data"]})
                if not page["next_cursor"]:
                    break
                cur = f"&cursor={page['next_cursor']}"
            assert got == {i: 0 if i.startswith("acme") else 1 for i in ids}, (limit, got)
        assert api.proc.term() == 0
    finally:
        db.drop()


def test_sigterm_answers_what_is_in_flight_and_exits_within_the_bound(make_world):
    import threading
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"e_{w.tag}", rcv.url("ok", f"e_{w.tag}"))
    key = w.api_key("publish")
    # Kafka never acknowledges (no such topic): the publish is still waiting at SIGTERM
    api = w.api(api_publish_timeout_ms=60000, api_shutdown_ms=2000,
                topic_deliveries=f"missing{w.tag}.deliveries")
    got = {}

    def publish():
        got["r"] = call(api, "POST", "/v1/events",
                        {"type": "t", "endpoint": ep, "body": 1, "id": f"evt_{w.tag}"}, key)
    t = threading.Thread(target=publish)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    api.proc.stop(signal.SIGTERM)
    # within moments the instance serves no new connection, while it still runs (the publish
    # holds it until api_shutdown_ms)
    def unserved():
        try:
            fresh = socket.create_connection(("127.0.0.1", api.port), timeout=2)
            fresh.settimeout(0.3)
            fresh.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            served = fresh.recv(100)
            fresh.close()
        except (socket.timeout, ConnectionError, OSError):
            served = b""
        return not served.startswith(b"HTTP/1.1") and api.proc.alive() and t.is_alive()
    wait_until(unserved, 5 * MULT, 0.05, "new connections unserved while the publish waits")
    t.join(30 * MULT)
    assert not t.is_alive(), "the request in flight was never answered"
    st, hdrs, p = got["r"]
    problem(st, hdrs, p, 503)  # answered, not dropped: the client retries elsewhere
    assert p["id"] == f"evt_{w.tag}"
    assert api.proc.p.wait(30 * MULT) == 0
    assert time.monotonic() - t0 < 10 * MULT, "shutdown took far longer than api_shutdown_ms"
    # a new connection is refused once it stops accepting
    try:
        call(api, "GET", "/healthz")
        raise AssertionError("a stopped server answered")
    except (ConnectionError, OSError):
        pass


def sigterm_under_publishers(w, api, key, ep, clients, before):
    """Clients publishing without pause to `api` until it stops; SIGTERM once `before` were
    accepted. Returns (answers by status, accepted ids, (sent, answered) wall times of the
    202s, the wall time of the instance's `stopping` line)."""
    import datetime
    import threading
    accepted, answered, lock = [], [], threading.Lock()
    answers = collections.Counter()

    def client(n):
        i = 0
        while True:
            i += 1
            sent = time.time()
            try:
                st, _, b = call(api, "POST", "/v1/events",
                                {"type": "t", "endpoint": ep, "body": i, "id": f"evt_{n}_{i}_{w.tag}"},
                                key)
            except (ConnectionError, OSError, http.client.HTTPException):
                return  # refused or closed: the instance is gone (the load balancer's retry)
            with lock:
                answers[st] += 1
                if st == 202:
                    accepted.append(b["id"])
                    answered.append((sent, time.time()))
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    wait_until(lambda: len(accepted) >= before, 30 * MULT, 0.05, "publishes before SIGTERM")
    t0 = time.monotonic()
    api.proc.stop(signal.SIGTERM)
    assert api.proc.p.wait(15 * MULT) == 0
    assert time.monotonic() - t0 < 8 * MULT
    for t in threads:
        t.join(30 * MULT)
    (stopping,) = api.proc.events("stopping")
    at = datetime.datetime.strptime(stopping["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    return answers, accepted, answered, at


def test_sigterm_under_load_answers_what_kafka_acknowledged_and_every_202_is_on_kafka(
        make_world):
    """SIGTERM while 16 clients publish without pause: every answer is a 202 or a 503 (new
    requests once stopping), every 202 names an event whose record is on the deliveries topic
    (the producer was flushed, nothing acknowledged was dropped), and the process exits 0
    within api_shutdown_ms and a margin. Then, with every acknowledgement held 150 ms
    (SL_FAULT=api_ack_slow, test builds only), the publishes still waiting when the instance
    logged `stopping` are answered 202 well after it: finished, not dropped."""
    w = make_world()
    ep = w.add_endpoint(f"e_{w.tag}", "http://127.0.0.1:9/never")
    key = w.api_key("publish")
    for fault in (None, "api_ack_slow"):
        api = w.api(api_shutdown_ms=3000, _fault=fault)
        answers, accepted, answered, at = sigterm_under_publishers(
            w, api, key, ep, 16 if fault is None else 4, 50 if fault is None else 8)
        assert set(answers) <= {202, 503}, (fault, answers)
        on_kafka = {r["id"] for r in w.dump("deliveries")}
        missing = set(accepted) - on_kafka
        assert not missing, f"{len(missing)} answered 202, not on Kafka: {sorted(missing)[:3]}"
        if fault:
            # sent before `stopping`, answered 202 at least 50 ms after it (an answer takes
            # 150 ms or more here, so the client did not merely read it late)
            held = [1 for sent, got in answered if sent < at and got > at + 0.05]
            assert held, f"no publish in flight at `stopping` was answered 202 ({answers})"


def test_sigterm_during_a_replay_waits_for_its_batch_and_answers_it(make_world):
    """A dead-letter replay runs on a thread of its own with its request suspended, and
    libmicrohttpd aborts the process when it is stopped with a request still suspended. Here
    the replay's batch (SL_FAULT=api_replay_slow, test builds only) is still running past
    api_shutdown_ms + 2 s, where shutdown stops the server: sluice-api must wait for the batch,
    answer the request (503, not complete: the replay ends before its next batch) and exit 0."""
    import threading
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"rp_{w.tag}", rcv.url("ok", f"rp_{w.tag}"))
    admin = w.api_key("admin")
    api = w.api(api_shutdown_ms=1000, _fault="api_replay_slow")
    got = {}

    def replay():
        try:
            got["r"] = call(api, "POST", "/v1/dead-letters/replay", {"endpoint": ep}, admin)
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            got["e"] = e
    t = threading.Thread(target=replay)
    t.start()
    time.sleep(0.5)
    api.proc.stop(signal.SIGTERM)
    t.join(60 * MULT)
    assert not t.is_alive(), "the replay's request was never answered"
    assert "r" in got, (f"no answer ({got.get('e')!r}), sluice-api exited {api.proc.p.poll()}: "
                        f"{api.proc.logs()[-600:]}")
    st, hdrs, body = got["r"]
    assert st == 503 and body["complete"] is False, body
    assert "stopped before its next batch" in body["error"], body
    assert hdrs.get("retry-after") == "5", hdrs
    rc = api.proc.p.wait(30 * MULT)
    assert rc == 0, f"sluice-api exited {rc}: {api.proc.logs()[-600:]}"


def read_answer(s):
    """One HTTP/1.1 answer from socket s: (status, body bytes)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        assert chunk, "the connection closed before an answer"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    length = next(int(l.split(":", 1)[1]) for l in lines if l.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = s.recv(4096)
        assert chunk, "the connection closed inside an answer"
        body += chunk
    return int(lines[0].split()[1]), body


def test_a_loop_holding_exactly_128_ready_connections_answers_them_at_once(make_world):
    """libmicrohttpd 0.9.75's own event loop, handed exactly 128 ready connections (one
    epoll_wait's worth), waits again with the full timeout before serving any of them: every
    request sat until some other event came. sluice-api runs the loop itself. The 128
    requests arrive while sluice-api is stopped (SIGSTOP), so on SIGCONT all are ready at
    once; each must be answered long before the idle timeout."""
    w = make_world()
    api = w.api(api_threads=1, api_idle_timeout_s=300)
    req = b"GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"
    conns = [socket.create_connection(("127.0.0.1", api.port), timeout=30 * MULT)
             for _ in range(128)]
    try:
        for s in conns:  # every connection accepted and served once: all in the loop's set
            s.sendall(req)
        for s in conns:
            assert read_answer(s)[0] == 200
        pid = api.proc.p.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            for s in conns:
                s.sendall(req)
            time.sleep(0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
        for i, s in enumerate(conns):
            try:
                st, body = read_answer(s)
            except socket.timeout:
                raise AssertionError(f"connection {i} of 128 unanswered after {30 * MULT} s: "
                                     "the loop waited with every request unread") from None
            assert st == 200 and json.loads(body) == {"status": "ok"}
    finally:
        for s in conns:
            s.close()
    assert api.proc.term() == 0


def test_an_endpoint_at_a_refused_address_is_refused_when_registered(make_world):
    """sluicectl and sluice-api refuse a URL whose host is a non-global literal or a loopback
    name, under their own ssrf_protection / ssrf_allow_cidrs (the World allows 127.0.0.0/8),
    naming the host and the range; nothing is written; names are left to the consumers."""
    w = make_world()
    refused = {
        "http://10.0.0.1/hook": "(private)",
        "http://167772161/hook": "host 10.0.0.1 ",         # curl reads a number as IPv4
        "http://169.254.169.254/latest/meta-data/": "(link-local)",
        "http://[fd00:ec2::254]/": "(unique-local)",
        "http://[::1]:9/x": "(loopback)",                  # only 127.0.0.0/8 is allowed
    }
    for i, (url, why) in enumerate(refused.items()):
        r = w.ctl("endpoints", "add", "--id", f"r{i}{w.tag}", "--url", url)
        assert r.returncode == 2, r.stderr  # a validation failure, nothing written
        assert 'field "url": host ' in r.stderr and why in r.stderr, r.stderr
        assert "ssrf_allow_cidrs" in r.stderr
    r = w.ctl("endpoints", "add", "--id", f"t{w.tag}", "--template",
              "--url", "http://192.168.1.1/pb?c={click_id}")
    assert r.returncode == 2 and "(private)" in r.stderr, r.stderr
    ok = w.add_endpoint(f"ok{w.tag}", "http://127.0.0.1:9/x")   # allowed range
    named = w.add_endpoint(f"nm{w.tag}", "http://sluice-test.invalid/x")  # a name: delivery's
    r = w.ctl("endpoints", "update", ok, "--url", "http://10.0.0.1/x")
    assert r.returncode == 2 and "(private)" in r.stderr, r.stderr
    r = w.ctl("endpoints", "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = {e["id"]: e for e in json.loads(r.stdout) if e["id"].endswith(w.tag)}
    assert set(rows) == {ok, named}, sorted(rows)   # the registry is shared by every World
    assert rows[ok]["url"] == "http://127.0.0.1:9/x"

    key = w.api_key("admin")
    api = w.api()
    for url, why in refused.items():
        st, hdrs, b = call(api, "POST", "/v1/endpoints", {"id": f"a{w.tag}", "url": url}, key)
        assert st == 400 and b["field"] == "/url" and why in b["detail"], (url, st, b)
        assert hdrs["content-type"] == "application/problem+json"
    st, _, b = call(api, "PATCH", f"/v1/endpoints/{ok}", {"url": "http://[::1]:9/y"}, key)
    assert st == 400 and b["field"] == "/url" and "host [::1] " in b["detail"], b
    st, _, b = call(api, "GET", f"/v1/endpoints/{ok}", None, key)
    assert st == 200 and b["url"] == "http://127.0.0.1:9/x", b
    # the operator's allowlist is sluice-api's too: without one, localhost is loopback
    st, _, b = call(w.api(ssrf_allow_cidrs=""), "POST", "/v1/endpoints",
                    {"id": f"a{w.tag}", "url": "http://localhost:9/"}, key)
    assert st == 400 and "host localhost is a non-global address (loopback)" in b["detail"], b
    api2 = w.api(ssrf_allow_cidrs="127.0.0.0/8,10.0.0.0/8")
    st, _, b = call(api2, "POST", "/v1/endpoints", {"id": f"a{w.tag}", "url": "http://10.0.0.1/"},
                    key)
    assert st == 201, b


def test_a_test_event_reaches_one_endpoint_signed_and_its_log_says_what_it_answered(make_world):
    """POST /v1/endpoints/{id}/test: one sluice.test event to that endpoint alone, signed
    (the receiver checks the secret), in the delivery log; the publish scope, the key's
    channels and the endpoint's existence are checked as for an explicit publish."""
    from sluice_e2e import Proc
    w = make_world()
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    ep = w.add_endpoint(f"tst_{w.tag}", rcv.url("ok", f"tst_{w.tag}"), "--types", "order.*",
                        "--channels", "aa")
    other = w.add_endpoint(f"oth_{w.tag}", rcv.url("ok", f"oth_{w.tag}"))
    pub = w.api_key("publish")
    read = w.api_key("read")
    tenant = w.api_key("publish", channels="zz")
    api = w.api()
    c = w.consumer()
    env = dict(w.env, SLUICE_INSTANCE_ID="rec", SLUICE_RECORDER_FLUSH_MS="100")
    rec = Proc([w.bin("recorder/sluice-recorder")], env, os.path.join(w.dir, "recorder.log"))
    w.consumers.append(rec)
    st, _, b = call(api, "POST", f"/v1/endpoints/{ep}/test", None, pub)
    assert st == 202 and b["type"] == "sluice.test" and b["endpoints"] == [ep], b
    # a type filter of the endpoint's does not apply: the test is addressed to it
    got = wait_until(lambda: [l for l in ledger_ok(rcv) if l["webhook_id"] == b["id"]],
                     30 * MULT, 0.2, "the test event at the receiver")
    assert [(l["endpoint"], l["sig_ok"]) for l in got] == [(ep, True)], got
    assert not [l for l in rcv.ledger() if l["endpoint"] == other]

    def logged():
        s, _, d = call(api, "GET", f"/v1/events/{b['id']}/deliveries", None, read)
        return d if s == 200 and d["data"] and d["data"][0]["state"] == "delivered" else None
    d = wait_until(logged, 30 * MULT, 0.3, "the test in the delivery log")
    assert [(x["endpoint"], x["type"], x["last_status"]) for x in d["data"]] == \
        [(ep, "sluice.test", 204)], d
    # {} is a body too; anything in it is refused, naming it
    st, _, b2 = call(api, "POST", f"/v1/endpoints/{ep}/test", {}, pub)
    assert st == 202 and b2["id"] != b["id"], b2
    problem(*call(api, "POST", f"/v1/endpoints/{ep}/test", {"type": "x"}, pub), 400, "/")
    problem(*call(api, "POST", f"/v1/endpoints/{ep}/test", None, read), 403)
    problem(*call(api, "POST", f"/v1/endpoints/nope_{w.tag}/test", None, pub), 404)
    problem(*call(api, "POST", f"/v1/endpoints/{ep}/test", None, tenant), 404)  # not its channel
    # a disabled endpoint: 409, nothing published (its test would only be a dead letter)
    r = w.ctl("endpoints", "disable", other, "--reason", "testing the test")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: call(api, "POST", f"/v1/endpoints/{other}/test", None, pub)[0] == 409,
               30 * MULT, 0.3, "the API to see the endpoint disabled")
    st, _, b3 = call(api, "POST", f"/v1/endpoints/{other}/test", None, pub)
    problem(st, {"content-type": "application/problem+json"}, b3, 409)
    assert b3["type"].endswith("endpoint-disabled") and "enable it first" in b3["detail"], b3
    assert c.term() == 0 and rec.term() == 0
    assert not [l for l in rcv.ledger() if l["endpoint"] == other]


def test_repeating_a_change_whose_publish_failed_publishes_the_endpoint(make_world):
    """A create whose publish failed (Kafka unreachable; here the test fault) is committed
    and answered "published": false, and the endpoint cannot take events yet. Repeating a
    change, which then finds nothing to change, publishes the endpoint's committed state
    again: "published": true, and events reach it."""
    w = make_world()
    rcv = w.receiver()
    admin = w.api_key("admin")
    api = w.api(_fault="reg_publish_first_fails")
    ep = f"late_{w.tag}"
    body = {"id": ep, "url": rcv.url("ok", ep)}
    st, hdrs, b = call(api, "POST", "/v1/endpoints", body, admin)
    assert st == 201 and b["published"] is False, b
    assert hdrs["location"] == f"/v1/endpoints/{ep}", hdrs
    ev = {"type": "t", "endpoint": ep, "body": 1}
    problem(*call(api, "POST", "/v1/events", ev, admin), 404, "/endpoint")
    st, _, b = call(api, "PATCH", f"/v1/endpoints/{ep}", {"url": body["url"]}, admin)
    assert st == 200 and b["changed"] is False and b["published"] is True, b
    wait_until(lambda: call(api, "POST", "/v1/events", ev, admin)[0] == 202, 30 * MULT, 0.3,
               "the endpoint taking events")
    st, _, b = call(api, "POST", f"/v1/endpoints/{ep}/enable", None, admin)
    assert st == 200 and b["published"] is True, b  # nothing to change either: published
    assert "endpoint_not_published" in api.proc.logs()  # the failed create only, once
    assert api.proc.logs().count("endpoint_not_published") == 1
    assert api.proc.term() == 0


def test_an_instance_with_the_least_privileged_roles_serves_the_delivery_log(make_world):
    """docs/OPERATIONS.md: an instance that publishes and serves the delivery log needs no
    more than sluice_api + sluice_analyst. Dead letters and their patterns are served to it
    (the analyst may not read payloads or response bodies, and the queries it runs must not
    name them); a grant it lacks is a 500 naming the role, not a 503 to retry forever."""
    w = make_world()
    dsn = w.env["SLUICE_PG_DSN"]
    role = f"e2e_api_{w.tag}".lower()
    psql(dsn, f"create role {role} login in role sluice_api, sluice_analyst")
    try:
        ep = w.add_endpoint("lp" + w.tag, "http://127.0.0.1:9/x")
        ev = f"evt_lp_{w.tag}"
        psql(dsn, "insert into dead_letters (event_id, endpoint_id, error_class, attempts, "
                  "first_failed_at, dead_at, payload, last_response) values "
                  f"('{ev}', '{ep}', 'http_5xx', 5, now(), now(), '\\x01', 'secret body')")
        read, admin = w.api_key("read"), w.api_key("admin")
        api = w.api(pg_dsn=dsn.replace("user=sluice", f"user={role}"))
        st, _, page = call(api, "GET", f"/v1/dead-letters?endpoint={ep}", None, read)
        assert st == 200 and [d["event_id"] for d in page["data"]] == [ev], page
        assert page["data"][0]["last_response"] is None, page  # bodies are for admin keys
        st, _, pat = call(api, "GET", f"/v1/dead-letters/patterns?endpoint={ep}", None, read)
        assert st == 200 and pat["data"][0]["dead_letters"] == 1, pat
        assert pat["data"][0]["without_payload"] == 0, pat
        # an admin key asks for the response bodies, which this role may not read
        st, hdrs, body = call(api, "GET", f"/v1/dead-letters?endpoint={ep}", None, admin)
        problem(st, hdrs, body, 500)
        assert "retry-after" not in hdrs and "role" in body["detail"], (hdrs, body)
        # the analysis runs with its owner's rights: for the analyst, not for any role
        pub_only = f"e2e_pub_{w.tag}".lower()
        psql(dsn, f"create role {pub_only} login in role sluice_api")
        try:
            r = subprocess.run(["psql", "-X", "-At", dsn.replace("user=sluice", f"user={pub_only}"),
                                "-c", "select count(*) from sluice_dead_letter_analysis()"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and "permission denied" in r.stderr, (r.returncode, r.stderr)
        finally:
            psql(dsn, f"drop role {pub_only}")
    finally:
        for a in w.apis:  # its connections hold the role
            if a.proc.alive():
                a.proc.kill9()
        w.apis.clear()
        psql(dsn, f"drop owned by {role}; drop role {role}")


def test_a_slow_history_read_holds_no_http_loop(make_world):
    """History reads run on api_read_threads, not on the HTTP loops: with one loop, a read
    whose query takes 3 s (SL_FAULT=history_slow) leaves publishes and probes on that loop
    answered at once, and is itself answered when its query ends."""
    import threading
    w = make_world()
    ep = w.add_endpoint("hs" + w.tag, "http://127.0.0.1:9/x")
    key = w.api_key("publish", "read")
    api = w.api(api_threads=1, _fault="history_slow")
    got = {}

    def slow_read():
        t = time.monotonic()
        got["read"] = call(api, "GET", f"/v1/dead-letters?endpoint={ep}", None, key)[0]
        got["read_s"] = time.monotonic() - t

    th = threading.Thread(target=slow_read)
    th.start()
    time.sleep(0.5)  # the read is waiting on its query
    t = time.monotonic()
    st, _, body = call(api, "POST", "/v1/events", {"type": "t", "endpoint": ep, "body": 1}, key)
    took = time.monotonic() - t
    assert st == 202, body
    assert took < 1.5 * MULT, f"a publish waited {took:.1f} s behind a history read"
    assert api.get("/healthz")[0] == 200
    th.join(30)
    assert got.get("read") == 200 and got["read_s"] >= 2.9, got


def test_a_read_after_postgresql_dropped_the_connections_is_answered(make_world):
    """PostgreSQL restarted (here: every backend of this sluice-api ended): the next read on
    each thread finds its connection dead only when it uses it, and repeats the read on a new
    one instead of answering 503."""
    w = make_world()
    dsn = w.env["SLUICE_PG_DSN"]
    app = f"e2e_api_{w.tag}"
    key = w.api_key("read")
    w.env["PGAPPNAME"] = app
    try:
        api = w.api(api_threads=1, api_read_threads=1)
    finally:
        del w.env["PGAPPNAME"]
    for path in ("/v1/endpoint-stats?limit=1", "/v1/dead-letters?limit=1"):
        assert call(api, "GET", path, None, key)[0] == 200
    ended = psql(dsn, "select count(pg_terminate_backend(pid)) from pg_stat_activity "
                      f"where application_name = '{app}'")
    assert int(ended) >= 1, ended
    for path in ("/v1/endpoint-stats?limit=1", "/v1/dead-letters?limit=1",
                 "/v1/event-types"):
        st, _, body = call(api, "GET", path, None, key)
        assert st == 200, (path, body)


def test_repeating_a_cli_change_whose_publish_failed_publishes_the_endpoint(make_world):
    """sluicectl as sluice-api: an update that finds nothing to change publishes the committed
    record again, so repeating a change whose publish failed repairs it (no sync needed)."""
    w = make_world()
    rcv = w.receiver()
    admin = w.api_key("admin")
    api = w.api()
    ep = f"clilate_{w.tag}"
    url = rcv.url("ok", ep)
    env = dict(w.env, SL_FAULT="reg_publish_first_fails")
    r = w.ctl("endpoints", "add", "--id", ep, "--url", url, env=env)
    assert r.returncode == 1 and "NOT published" in r.stderr, (r.returncode, r.stderr)
    ev = {"type": "t", "endpoint": ep, "body": 1}
    problem(*call(api, "POST", "/v1/events", ev, admin), 404, "/endpoint")
    r = w.ctl("endpoints", "update", ep, "--url", url, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["changed"] is False and out["published"] is True, out
    wait_until(lambda: call(api, "POST", "/v1/events", ev, admin)[0] == 202, 30 * MULT, 0.3,
               "the endpoint taking events")
    assert api.proc.term() == 0


def test_sigterm_answers_the_queued_history_reads_and_lets_the_running_one_finish(make_world):
    """One read thread busy with a 3-s query, two more reads queued behind it, then SIGTERM
    with api_shutdown_ms 500: the running read is answered 200, the queued ones 503
    shutting-down (with Retry-After), and the process exits 0 without hanging on them."""
    import threading
    w = make_world()
    key = w.api_key("read")
    api = w.api(api_threads=1, api_read_threads=1, api_shutdown_ms=500, _fault="history_slow")
    got = []
    lock = threading.Lock()

    def read():
        st, hdrs, body = call(api, "GET", "/v1/dead-letters?limit=1", None, key)
        with lock:
            got.append((st, hdrs.get("retry-after"), (body or {}).get("type", "")))

    ths = []
    for _ in range(3):
        ths.append(threading.Thread(target=read))
        ths[-1].start()
        time.sleep(0.3)  # the first is running, the others queue behind it
    api.proc.stop(signal.SIGTERM)
    for t in ths:
        t.join(30)
    assert api.proc.term(30) == 0
    sts = sorted(s for s, _, _ in got)
    assert sts == [200, 503, 503], got
    assert all(ra and t.endswith("shutting-down") for s, ra, t in got if s == 503), got
