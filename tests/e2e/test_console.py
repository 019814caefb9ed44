"""The web console of sluice-api (/console) and the JSON routes behind it (issue #17, items 6
and 7), on the real stack.

One scripted run feeds every test of this module (they run in file order and share it; the
replay tests come last because they change the state). Like the demo, a receiver plays the
endpoints: healthy (ok), slow (slow/2300: over the 2000 ms threshold of `sluicectl slow`),
flaky (flaky_n/2: two 500s, then delivered), unauthorised (401: a dead letter at once, ten of
them: an "auth/permission spike" and a "clustered outage"), and dead (nothing listens; one
attempt, breaker threshold 1, so its breaker is open). A consumer, a recorder and sluice-api
run on the World's topics, its own Redis database and a private PostgreSQL database.

Oracles: the receiver's ledger (what each endpoint really got), the outcome records on Kafka
(what the consumer reported), the breaker hashes in Redis; never the history the routes read.
Browser tests drive Debian's headless Chromium with Playwright and save a screenshot of every
page under $SL_BINARY_DIR/test-artifacts/console/. Every wait is for a condition.
"""

import http.client
import json
import os
import re

import pytest

from sluice_e2e import (PrivateDb, Proc, World, final_states, free_port, redis_cmd,
                        wait_until)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONSOLE_DIR = os.path.join(REPO, "api", "console")
MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))

SLOW_MS = 2300  # slow/<ms> of the slow endpoint: over the default threshold of 2000 ms
COUNTS = {"ok": 20, "slow": 22, "flaky": 1, "auth": 10, "dead": 1}
PAGES = {"endpoints": "/console/", "latency": "/console/latency.html",
         "dead-letters": "/console/dead-letters.html", "events": "/console/events.html"}


# ==== helpers ====


def call(api, method, path, key=None, body=None, headers=None):
    """One request: (status, headers (lower-case names), body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30 * MULT)
    h = dict(headers or {})
    if key:
        h["Authorization"] = f"Bearer {key}"
    if body is not None:
        h["Content-Type"] = "application/json"
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
    r = c.getresponse()
    data = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hdrs, data


def get_json(api, path, key):
    st, h, data = call(api, "GET", path, key)
    assert st == 200, (path, st, data[:500])
    assert h["content-type"] == "application/json", h
    return json.loads(data)


def problem(api, path, key, want_status, field):
    st, h, data = call(api, "GET", path, key)
    assert st == want_status, (path, st, data[:500])
    assert h["content-type"] == "application/problem+json", (path, h)
    p = json.loads(data)
    assert p["status"] == want_status and p["type"].startswith("urn:sluice:problem:"), p
    assert p.get("field") == field, (path, p)
    return p


def all_stats(api, key, query=""):
    """Every page of /v1/endpoint-stats: (entries by id, the first page)."""
    out, first, cursor = {}, None, None
    while True:
        page = get_json(api, "/v1/endpoint-stats?limit=2" + query +
                        (f"&cursor={cursor}" if cursor else ""), key)
        first = first or page
        for e in page["data"]:
            assert e["id"] not in out, "an endpoint on two pages"
            out[e["id"]] = e
        cursor = page["next_cursor"]
        if not cursor:
            return out, first


def ledger_ok_ids(run, kind):
    return [l["webhook_id"] for l in run.rcv.ledger()
            if l["endpoint"] == run.eps[kind] and 200 <= l["status"] < 300]


# ==== the scripted run ====

class Run:
    pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    w = World(tmp, partitions=2, breaker_threshold=100000)
    db = PrivateDb("sluice_console_")
    w.env["SLUICE_PG_DSN"] = db.dsn
    try:
        rcv = w.receiver()
        t = w.tag
        dead_port = free_port()  # nothing listens there
        eps = {
            "ok": w.add_endpoint(f"ok_{t}", rcv.url("ok", f"ok_{t}"), "--name", "the shop",
                                 "--channels", "tenant_a"),
            "slow": w.add_endpoint(f"slow_{t}", rcv.url(f"slow/{SLOW_MS}", f"slow_{t}")),
            "flaky": w.add_endpoint(f"flaky_{t}", rcv.url("flaky_n/2", f"flaky_{t}"),
                                    "--retry-base-ms", "100", "--retry-cap-ms", "200"),
            "auth": w.add_endpoint(f"auth_{t}", rcv.url("unauth", f"auth_{t}")),
            "dead": w.add_endpoint(f"dead_{t}", f"http://127.0.0.1:{dead_port}/hook",
                                   "--max-attempts", "1", "--breaker-threshold", "1",
                                   "--breaker-cooldown-ms", "3600000", "--channels", "tenant_b"),
        }
        names = {v: k for k, v in eps.items()}
        rec = Proc([w.bin("recorder/sluice-recorder")],
                   dict(w.env, SLUICE_INSTANCE_ID="rec", SLUICE_RECORDER_FLUSH_MS="100"),
                   os.path.join(w.dir, "recorder.log"))
        w.consumers.append(rec)  # the World kills it on close
        c = w.consumer()
        admin = w.api_key("admin")
        read = w.api_key("read")
        tenant = w.api_key("read", channels="tenant_a")
        tenant_b = w.api_key("read", channels="tenant_b")
        publish = w.api_key("publish")
        api = w.api()
        ids = {k: [] for k in COUNTS}
        for kind, n in COUNTS.items():
            for i in range(n):
                ev_id = f"evt_{t}_{kind}_{i}"
                st, _, b = call(api, "POST", "/v1/events", admin,
                                {"id": ev_id, "type": f"console.{kind}", "endpoint": eps[kind],
                                 "body": {"n": i}})
                assert st == 202, b
                ids[kind].append(ev_id)

        want = {"delivered": COUNTS["ok"] + COUNTS["slow"] + COUNTS["flaky"],
                "dead_letter": COUNTS["auth"] + COUNTS["dead"]}

        def settled():
            fin = final_states(w.outcomes())
            states = {}
            for (ev, ep), o in fin.items():
                states[o["state"]] = states.get(o["state"], 0) + 1
            return all(states.get(k, 0) == v for k, v in want.items()) and fin

        fin = wait_until(settled, 120 * MULT, 1.0, "every scripted delivery to settle")

        def recorded():
            n = len(w.outcomes())
            m = int(db.q("select count(*) from delivery_attempts"))
            return n == m and (n, m)
        wait_until(recorded, 90 * MULT, 0.5, "the recorder to catch up")

        r = Run()
        r.w, r.db, r.rcv, r.api, r.c, r.rec = w, db, rcv, api, c, rec
        r.eps, r.names, r.ids, r.final = eps, names, ids, fin
        r.admin, r.read, r.tenant, r.publish = admin, read, tenant, publish
        r.tenant_b = tenant_b
        r.outcomes = w.outcomes()
        r.ledger = rcv.ledger()
        r.art = os.path.join(os.environ["SL_BINARY_DIR"], "test-artifacts", "console")
        os.makedirs(r.art, exist_ok=True)
        yield r
        assert api.proc.alive(), "sluice-api died:\n" + api.proc.logs()[-4000:]
        for line in api.proc.log_lines():
            for k in (admin, read, tenant):
                assert k[len("slk_") + 17:] not in line, "a key's secret reached the log"
        assert api.proc.term() == 0
        assert c.term() == 0
        assert rec.term() == 0
    finally:
        w.close()
        db.drop()


# ==== the static console ====

def test_console_files_are_served_with_csp_types_and_etags(run):
    api = run.api
    files = []
    for root, _, names in os.walk(CONSOLE_DIR):
        for n in names:
            files.append(os.path.relpath(os.path.join(root, n), CONSOLE_DIR))
    assert "index.html" in files and "vendor/uplot/uPlot.iife.min.js" in files
    assert "vendor/uplot/LICENSE" in files and "vendor/uplot/uPlot.min.css" in files
    types = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
             ".css": "text/css; charset=utf-8", "": "text/plain; charset=utf-8"}
    for rel in files:
        # no key: the files hold no data
        st, h, data = call(api, "GET", "/console/" + rel)
        assert st == 200, (rel, st)
        with open(os.path.join(CONSOLE_DIR, rel), "rb") as f:
            assert data == f.read(), f"{rel} is not served byte for byte"
        assert h["content-type"] == types[os.path.splitext(rel)[1]], (rel, h)
        csp = h["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, csp
        assert "unsafe" not in csp and "frame-ancestors 'none'" in csp, csp
        assert h["x-content-type-options"] == "nosniff"
        assert h["cache-control"] == "no-cache"
        # a revalidation with the ETag is a 304 without a body
        st2, h2, data2 = call(api, "GET", "/console/" + rel,
                              headers={"If-None-Match": h["etag"]})
        assert st2 == 304 and data2 == b"" and h2["etag"] == h["etag"], (rel, st2)
        st3, _, _ = call(api, "GET", "/console/" + rel, headers={"If-None-Match": '"nope"'})
        assert st3 == 200
        if rel.endswith(".html"):
            text = data.decode()
            # no inline script, no inline style, no event handler attribute (the CSP forbids
            # them; this keeps the pages honest), and nothing fetched from elsewhere
            assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), rel
            assert not re.search(r"\son[a-z]+\s*=", text) and " style=" not in text, rel
            assert not re.search(r"(src|href)=\"(https?:)?//", text), rel
            assert 'lang="en"' in text and "<main" in text and 'role="status"' in text, rel
    # "/console" and "/console/" are the endpoints page
    st, h, index = call(api, "GET", "/console")
    assert st == 200 and b"<h1>Endpoints</h1>" in index
    assert call(api, "GET", "/console/")[2] == index
    # unknown files and other methods: problems, with the same headers
    st, h, data = call(api, "GET", "/console/nothing.js")
    assert st == 404 and h["content-type"] == "application/problem+json"
    assert "default-src 'none'" in h["content-security-policy"]
    assert call(api, "GET", "/console/../v1/endpoints")[0] == 404
    st, h, _ = call(api, "POST", "/console/", body={})
    assert st == 405 and h["allow"] == "GET"


# ==== the JSON routes ====

def test_endpoint_stats_match_what_was_delivered(run):
    stats, first = all_stats(run.api, run.read)
    assert first["window_s"] == 3600 and first["slow_threshold_ms"] == 2000
    assert first["slow_min_samples"] == 20
    assert list(stats) == sorted(run.eps.values()), "every endpoint once, in id order"
    ledger = run.rcv.ledger()

    def lines(kind):
        return [l for l in ledger if l["endpoint"] == run.eps[kind]]

    def outs(kind):
        return [o for o in run.outcomes if o.get("endpoint") == run.eps[kind]]

    for kind, e in ((run.names[i], s) for i, s in stats.items()):
        got = [l for l in lines(kind) if 200 <= l["status"] < 300]
        assert e["delivered"] == len(got), (kind, e)
        assert e["delivered_per_s"] == round(len(got) / 3600, 6), (kind, e)
        spent = [o for o in outs(kind) if o["attempt"] > 0
                 and o["state"] in ("delivered", "retry_scheduled", "dead_letter")]
        assert e["attempts"] == len(spent), (kind, e)
        assert e["failures"] == len([o for o in spent if o["state"] != "delivered"]), (kind, e)
        # a latency sample per answer the endpoint gave (any status)
        answered = [l for l in lines(kind) if l["status"] != 0]
        assert e["latency"]["samples"] == len(answered), (kind, e)
        assert e["enabled"] is True and e["disabled_reason"] is None
        failed = [o for o in spent if o["state"] != "delivered"]
        if failed:
            newest = max(failed, key=lambda o: (o["ts_ms"], o["attempt"]))
            assert e["last_error"]["error"] == newest["err"], (kind, e, newest)
            assert e["last_error"]["status"] == (newest.get("http") or None), (kind, e, newest)
            assert e["last_error"]["at"].endswith("Z")
        else:
            assert e["last_error"] is None, (kind, e)
        # never a body, URL, payload or consumer message
        text = json.dumps(e)
        assert "http://" not in text and "hook" not in text and '"n":' not in text

    ok, slow, auth = stats[run.eps["ok"]], stats[run.eps["slow"]], stats[run.eps["auth"]]
    assert ok["name"] == "the shop" and ok["failures"] == 0 and ok["slow"] is False
    assert ok["breaker"] == {"state": "closed", "failures": 0, "reopen_at": None}
    # the slow endpoint: every sample took at least SLOW_MS, and 22 >= 20 samples
    assert slow["latency"]["samples"] == COUNTS["slow"]
    assert slow["latency"]["p50_ms"] >= SLOW_MS - 10 and slow["latency"]["p95_ms"] > 2000
    assert slow["latency"]["p50_ms"] <= slow["latency"]["p95_ms"] <= slow["latency"]["p99_ms"]
    assert slow["slow"] is True
    assert [n for n, s in stats.items() if s["slow"]] == [run.eps["slow"]]
    assert auth["last_error"]["error"] == "http_4xx" and auth["last_error"]["status"] == 401
    assert auth["failures"] == COUNTS["auth"] and auth["delivered"] == 0
    flaky = stats[run.eps["flaky"]]
    assert (flaky["attempts"], flaky["failures"], flaky["delivered"]) == (3, 2, 1), flaky
    assert flaky["last_error"]["status"] == 500
    # the dead endpoint: no answer at all, and its breaker as the consumers left it in Redis
    dead = stats[run.eps["dead"]]
    assert dead["last_error"]["status"] is None and dead["latency"]["samples"] == 0
    h = redis_cmd(run.w.redis_url, "HGETALL", "sluice:breaker:{%s}" % run.eps["dead"])
    h = dict(zip(h[::2], h[1::2]))
    assert h[b"state"] == b"open", h
    assert dead["breaker"]["state"] == "open"
    assert dead["breaker"]["failures"] == int(h[b"failures"]) >= 1
    reopen = int(h[b"opened_at_ms"]) + int(h[b"cooldown_ms"])
    import datetime
    want = datetime.datetime.fromtimestamp(reopen / 1000, datetime.timezone.utc)
    assert dead["breaker"]["reopen_at"] == want.strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{reopen % 1000:03d}Z"

    # the slow rule follows its parameters, as `sluicectl slow` does
    s2, _ = all_stats(run.api, run.read, f"&slow_min_samples={COUNTS['slow'] + 1}")
    assert not any(e["slow"] for e in s2.values())
    s3, f3 = all_stats(run.api, run.read, "&slow_threshold_ms=100&window_s=86400")
    assert f3["window_s"] == 86400 and f3["slow_threshold_ms"] == 100
    assert s3[run.eps["slow"]]["slow"] and not s3[run.eps["ok"]]["slow"]  # 20 samples, fast
    assert s3[run.eps["ok"]]["delivered_per_s"] == round(COUNTS["ok"] / 86400, 6)


def test_latency_trend_buckets_hold_every_sample(run):
    slow = run.eps["slow"]
    j = get_json(run.api, f"/v1/endpoints/{slow}/latency", run.read)
    assert j["endpoint"] == slow and j["window_s"] == 86400 and j["bucket_s"] == 300
    b = j["buckets"]
    assert 288 <= len(b) <= 289, len(b)
    import datetime

    def ms(t):
        return int(datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ")
                   .replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)
    starts = [ms(x["t"]) for x in b]
    assert all(s % 300000 == 0 for s in starts), "buckets aligned to bucket_s"
    assert all(b2 - b1 == 300000 for b1, b2 in zip(starts, starts[1:])), "consecutive"
    assert sum(x["count"] for x in b) == j["samples"] == COUNTS["slow"]
    full = [x for x in b if x["count"] > 0]
    assert full and all(x["p50_ms"] >= SLOW_MS - 10 for x in full), full
    assert all(x["p50_ms"] is None and x["p99_ms"] is None for x in b if x["count"] == 0)
    # the samples' own times (the consumer's outcome timestamps) fall in those buckets
    answered = [o for o in run.outcomes if o.get("endpoint") == slow and o.get("http")]
    per = {}
    for o in answered:
        k = o["ts_ms"] // 300000 * 300000
        per[k] = per.get(k, 0) + 1
    assert {s: x["count"] for s, x in zip(starts, b) if x["count"]} == per
    # a window of one hour in 1-minute buckets
    j = get_json(run.api, f"/v1/endpoints/{slow}/latency?window_s=3600", run.read)
    assert j["bucket_s"] == 60 and 60 <= len(j["buckets"]) <= 61
    assert j["samples"] == COUNTS["slow"]
    j = get_json(run.api, f"/v1/endpoints/{slow}/latency?window_s=3600&bucket_s=600", run.read)
    assert j["bucket_s"] == 600 and j["samples"] == COUNTS["slow"]
    # an endpoint without answers has empty buckets, not an error
    j = get_json(run.api, f"/v1/endpoints/{run.eps['dead']}/latency", run.read)
    assert j["samples"] == 0 and all(x["count"] == 0 for x in j["buckets"])


def test_dead_letter_patterns_name_the_auth_spike_and_the_cluster(run):
    j = get_json(run.api, "/v1/dead-letters/patterns", run.read)
    assert j["window_s"] == 86400 and j["endpoint"] is None
    by = {x["endpoint"]: x for x in j["data"]}
    assert set(by) == {run.eps["auth"], run.eps["dead"]}, by.keys()
    auth = by[run.eps["auth"]]
    assert auth["dead_letters"] == auth["unreplayed"] == COUNTS["auth"]
    assert (auth["top_error"], auth["top_status"]) == ("http_4xx", 401)
    assert auth["top_status_count"] == auth["auth_count"] == COUNTS["auth"]
    assert auth["patterns"] == ["clustered outage", "auth/permission spike"], auth
    assert auth["without_payload"] == 0 and auth["avg_attempts"] == 1.0
    dead = by[run.eps["dead"]]
    assert dead["dead_letters"] == 1 and dead["top_status"] is None and dead["patterns"] == []
    # the ledger agrees: every auth letter was answered 401, none delivered
    ledger = [l for l in run.rcv.ledger() if l["endpoint"] == run.eps["auth"]]
    assert sorted(l["webhook_id"] for l in ledger) == sorted(run.ids["auth"])
    assert {l["status"] for l in ledger} == {401}
    one = get_json(run.api, f"/v1/dead-letters/patterns?endpoint={run.eps['dead']}&window_s=3600",
                   run.read)
    assert [x["endpoint"] for x in one["data"]] == [run.eps["dead"]]
    assert one["endpoint"] == run.eps["dead"] and one["window_s"] == 3600
    assert j["next_cursor"] is None and one["next_cursor"] is None
    # pages of one: most dead letters first, the cursor carries on after it, the last is null
    p1 = get_json(run.api, "/v1/dead-letters/patterns?limit=1", run.read)
    assert [x["endpoint"] for x in p1["data"]] == [run.eps["auth"]] and p1["next_cursor"]
    p2 = get_json(run.api, f"/v1/dead-letters/patterns?limit=1&cursor={p1['next_cursor']}",
                  run.read)
    assert [x["endpoint"] for x in p2["data"]] == [run.eps["dead"]]
    assert p2["next_cursor"] is None
    assert p2["data"][0] == by[run.eps["dead"]]


def test_bad_parameters_are_problems_naming_the_parameter(run):
    api, k, slow = run.api, run.read, run.eps["slow"]
    for q, field in (("window_s=0", "window_s"), ("window_s=abc", "window_s"),
                     ("window_s=59", "window_s"), ("window_s=31622401", "window_s"),
                     ("window_s=-5", "window_s"), ("window_s=1e3", "window_s"),
                     ("slow_threshold_ms=-1", "slow_threshold_ms"),
                     ("slow_min_samples=0", "slow_min_samples"), ("limit=0", "limit"),
                     ("limit=501", "limit"), ("cursor=zz", "cursor"),
                     ("cursor=2e2e2f", "cursor")):
        problem(api, f"/v1/endpoint-stats?{q}", k, 400, field)
    for q, field in (("window_s=x", "window_s"), ("bucket_s=5", "bucket_s"),
                     ("bucket_s=86401", "bucket_s"), ("window_s=86400&bucket_s=10", "bucket_s")):
        problem(api, f"/v1/endpoints/{slow}/latency?{q}", k, 400, field)
    problem(api, "/v1/endpoints/nope_nope/latency", k, 404, "id")
    problem(api, "/v1/endpoints/bad%20id/latency", k, 404, "id")
    problem(api, "/v1/dead-letters/patterns?endpoint=bad%20id", k, 400, "endpoint")
    problem(api, "/v1/dead-letters/patterns?window_s=0", k, 400, "window_s")
    problem(api, "/v1/dead-letters/patterns?cursor=2e2e2f", k, 400, "cursor")
    problem(api, "/v1/dead-letters/patterns?limit=0", k, 400, "limit")
    # the key: none is 401, a publish-only key 403
    problem(api, "/v1/endpoint-stats", None, 401, "Authorization")
    st, _, _ = call(api, "GET", "/v1/endpoint-stats", run.publish)
    assert st == 403


def test_answers_on_real_data_conform_to_the_contract(run):
    """The new routes' answers on this run's data (slow, dead, open breaker: every nullable
    member both ways) checked against api/openapi.yaml with Schemathesis' own checks."""
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance,
                                                   response_headers_conformance,
                                                   response_schema_conformance,
                                                   status_code_conformance)
    schema = schemathesis.openapi.from_path(os.path.join(REPO, "api", "openapi.yaml"))
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    calls = [("/v1/endpoint-stats", {}, {"limit": "500"}, 200),
             ("/v1/endpoint-stats", {}, {"limit": "1", "window_s": "86400"}, 200),
             ("/v1/endpoints/{id}/latency", {"id": run.eps["slow"]}, {}, 200),
             ("/v1/endpoints/{id}/latency", {"id": run.eps["dead"]},
              {"window_s": "3600", "bucket_s": "10"}, 200),
             ("/v1/dead-letters/patterns", {}, {}, 200),
             ("/v1/dead-letters/patterns", {}, {"limit": "1"}, 200),
             ("/v1/endpoint-stats", {}, {"window_s": "7"}, 400),
             ("/v1/endpoints/{id}/latency", {"id": "nope"}, {}, 404)]
    for path, params, query, want in calls:
        case = schema[path]["GET"].Case(path_parameters=params, query=query)
        resp = case.call(base_url=run.api.base, headers={"Authorization": f"Bearer {run.read}"})
        assert resp.status_code == want, (path, query, resp.status_code, resp.text[:300])
        case.validate_response(resp, checks=checks)


def test_a_key_limited_to_channels_sees_only_its_endpoints(run):
    api, k = run.api, run.tenant
    stats, _ = all_stats(api, k)
    assert list(stats) == [run.eps["ok"]], stats.keys()
    assert get_json(api, f"/v1/endpoints/{run.eps['ok']}/latency", k)["samples"] == COUNTS["ok"]
    problem(api, f"/v1/endpoints/{run.eps['slow']}/latency", k, 404, "id")
    assert get_json(api, "/v1/dead-letters/patterns", k)["data"] == []
    # a tenant whose endpoint has dead letters sees that endpoint's entry, and only it
    j = get_json(api, "/v1/dead-letters/patterns?limit=1", run.tenant_b)
    assert [x["endpoint"] for x in j["data"]] == [run.eps["dead"]] and j["next_cursor"] is None, j


# ==== the browser ====

@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    exe = "/usr/bin/chromium"
    if not os.path.exists(exe):
        pytest.fail(f"{exe} missing: run scripts/setup.sh (Debian's chromium)", pytrace=False)
    from playwright.sync_api import expect
    expect.set_options(timeout=30000 * MULT)
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = p.chromium.launch(executable_path=exe, args=args)
        try:
            yield b
        finally:
            b.close()


class Console:
    """One browser context (its own sessionStorage) on the run's sluice-api; records console
    errors and CSP violations, and the URLs of every request."""

    def __init__(self, run, browser, key):
        self.run = run
        self.ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(30000 * MULT)
        self.errors = []
        self.urls = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("response", lambda r: r.status >= 400 and
                     self.errors.append(f"{r.status} {r.url}"))
        self.allowed = []  # answers a test expects: (status, URL suffix)
        self.key = key

    def open(self, name, fragment=""):
        from playwright.sync_api import expect
        p = self.page
        p.goto(self.run.api.base + PAGES[name] + fragment)
        if p.get_by_role("textbox", name="API key").is_visible():
            p.get_by_role("textbox", name="API key").fill(self.key)
            p.get_by_role("button", name="Use key").click()
        expect(p.get_by_role("button", name="Forget key")).to_be_visible()
        return p

    def status(self):
        return self.page.get_by_role("status")

    def shot(self, name):
        self.page.screenshot(path=os.path.join(self.run.art, f"{name}.png"), full_page=True)

    def allow(self, status, suffix):
        """The test expects an answer of this status from a URL ending in suffix."""
        self.allowed.append((status, suffix))

    def close(self):
        self.ctx.close()
        assert not [e for e in self.errors if "Content Security Policy" in e or
                    "Refused" in e], self.errors
        errors = list(self.errors)
        for st, suffix in self.allowed:  # the response and the browser's own report of it
            errors = [e for e in errors if not (e == f"{st} {self.run.api.base}{suffix}" or
                                                f"with a status of {st} (" in e)]
        assert not errors, self.errors
        # the key never travels in a URL
        secret = self.key[len("slk_") + 17:]
        assert not [u for u in self.urls if secret in u or "slk_" in u], self.urls


@pytest.fixture
def console(run, browser):
    made = []

    def make(key):
        c = Console(run, browser, key)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def test_endpoints_page_shows_every_endpoint_and_marks_the_slow_one(run, console):
    from playwright.sync_api import expect
    c = console(run.read)
    p = c.open("endpoints")
    expect(c.status()).to_contain_text(f"Loaded {len(run.eps)} endpoints (1 slow)")
    rows = p.locator("#endpoints tbody tr")
    expect(rows).to_have_count(len(run.eps))
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.endpoint)") == sorted(run.eps.values())
    slow = p.locator(f'#endpoints tr[data-endpoint="{run.eps["slow"]}"]')
    expect(slow).to_have_attribute("data-slow", "true")
    expect(slow.locator("td").nth(9)).to_have_text("slow")
    for kind in ("ok", "flaky", "auth", "dead"):
        expect(p.locator(f'#endpoints tr[data-endpoint="{run.eps[kind]}"]')) \
            .to_have_attribute("data-slow", "false")
    dead = p.locator(f'#endpoints tr[data-endpoint="{run.eps["dead"]}"]')
    expect(dead.locator("td[data-breaker]")).to_have_attribute("data-breaker", "open")
    auth = p.locator(f'#endpoints tr[data-endpoint="{run.eps["auth"]}"]')
    expect(auth.locator("td").nth(10)).to_contain_text("http_4xx 401 at ")
    ok = p.locator(f'#endpoints tr[data-endpoint="{run.eps["ok"]}"]')
    expect(ok.locator("td").nth(3)).to_have_text(str(COUNTS["ok"]))  # delivered
    # accessible structure: landmarks, labelled controls, header cells with scope
    expect(p.get_by_role("main")).to_have_count(1)
    expect(p.get_by_role("navigation", name="Console pages")).to_be_visible()
    expect(p.get_by_role("link", name="Endpoints")).to_have_attribute("aria-current", "page")
    expect(p.get_by_role("combobox", name="Window")).to_be_visible()
    assert p.locator("#endpoints th:not([scope])").count() == 0
    # keyboard: choose another window and refresh without a mouse
    p.get_by_role("combobox", name="Window").focus()
    p.keyboard.press("End")
    p.get_by_role("button", name="Refresh").focus()
    p.keyboard.press("Enter")
    expect(c.status()).to_contain_text("over the last 24 hours")
    expect(p.locator("#window-label")).to_have_text("last 24 hours")
    c.shot("endpoints")
    # the key is in this tab's sessionStorage only, never in localStorage or a cookie
    assert p.evaluate("() => Object.keys(localStorage).length") == 0
    assert c.ctx.cookies() == []
    assert p.evaluate("() => sessionStorage.getItem('sluice.console.apiKey')") == run.read


def test_a_wrong_key_is_refused_shown_and_forgotten(run, console):
    from playwright.sync_api import expect
    c = console("slk_" + "0" * 16 + "_" + "A" * 43)
    c.allow(401, "/v1/endpoint-stats?limit=500&window_s=3600")
    p = c.page
    p.goto(run.api.base + "/console/")
    expect(c.status()).to_contain_text("Enter an API key")
    expect(p.get_by_role("textbox", name="API key")).to_be_focused()
    p.get_by_role("textbox", name="API key").fill(c.key)
    p.keyboard.press("Enter")
    expect(c.status()).to_contain_text("HTTP 401 Unauthorized")
    expect(p.get_by_role("textbox", name="API key")).to_be_visible()
    expect(p.get_by_role("textbox", name="API key")).to_have_value("")
    assert p.evaluate("() => sessionStorage.length") == 0
    expect(p.locator("#endpoints tbody tr")).to_have_count(0)


def test_latency_page_charts_the_slow_endpoint(run, console):
    from playwright.sync_api import expect
    c = console(run.read)
    p = c.open("latency", "#endpoint=" + run.eps["slow"])
    expect(c.status()).to_contain_text(f"Latency of {run.eps['slow']}: {COUNTS['slow']} samples")
    fig = p.locator("#chart-figure")
    expect(fig).to_have_attribute("data-samples", str(COUNTS["slow"]))
    points = int(fig.get_attribute("data-points"))
    j = get_json(run.api, f"/v1/endpoints/{run.eps['slow']}/latency", run.read)
    assert points == len([b for b in j["buckets"] if b["count"] > 0]) >= 1
    # uPlot drew on its canvas (a non-blank plot), with the three series in its legend
    expect(p.locator("#chart canvas")).to_have_count(1)
    drawn = p.locator("#chart canvas").evaluate(
        "cv => { const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;"
        " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++; return n; }")
    assert drawn > 100, "the chart canvas is blank"
    for s in ("P50 ms", "P95 ms", "P99 ms"):
        expect(p.locator(".u-legend")).to_contain_text(s)
    # the same figures as a table, for screen readers
    p.get_by_text("The chart's data as a table").click()
    rows = p.locator("#trend tbody tr")
    expect(rows).to_have_count(points)
    assert sum(int(x) for x in rows.locator("td:nth-child(2)").all_inner_texts()) == COUNTS["slow"]
    expect(p.get_by_role("combobox", name="Endpoint")).to_have_value(run.eps["slow"])
    c.shot("latency")
    # another endpoint through the form
    p.get_by_role("combobox", name="Endpoint").select_option(run.eps["ok"])
    p.get_by_role("button", name="Show").click()
    expect(c.status()).to_contain_text(f"Latency of {run.eps['ok']}: {COUNTS['ok']} samples")
    assert p.evaluate("() => location.hash") == "#endpoint=" + run.eps["ok"]


def test_event_search_shows_every_attempt(run, console):
    from playwright.sync_api import expect
    ev = run.ids["flaky"][0]
    ledger = [l for l in run.rcv.ledger() if l["webhook_id"] == ev]
    answers = [l["status"] for l in sorted(ledger, key=lambda l: l["ts_ms"])]
    assert answers[:2] == [500, 500] and 200 <= answers[2] < 300 and len(answers) == 3, answers
    c = console(run.read)
    p = c.open("events")
    p.get_by_role("textbox", name="Event id").fill(ev)
    p.get_by_role("textbox", name="Event id").press("Enter")
    expect(c.status()).to_contain_text(f"Event {ev}: 1 delivery, 3 outcomes")
    sec = p.locator(f'section.delivery[data-endpoint="{run.eps["flaky"]}"]')
    expect(sec.get_by_role("heading")).to_have_text(f"{run.eps['flaky']}: delivered")
    rows = sec.locator("tbody tr")
    expect(rows).to_have_count(3)
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.state)") == \
        ["retry_scheduled", "retry_scheduled", "delivered"]
    assert rows.locator("td:nth-child(3)").all_inner_texts() == [str(a) for a in answers]
    outs = sorted((o for o in run.outcomes if o.get("id") == ev), key=lambda o: o["ts_ms"])
    assert [o["state"] for o in outs] == ["retry_scheduled", "retry_scheduled", "delivered"]
    c.shot("events")
    # a dead letter's event, by the page's fragment (as the dead-letters page links it)
    p.goto(run.api.base + "/console/events.html#id=" + run.ids["auth"][0])
    expect(c.status()).to_contain_text(f"Event {run.ids['auth'][0]}: 1 delivery, 1 outcome")
    expect(p.locator("section.delivery tbody tr")).to_have_attribute("data-state", "dead_letter")
    p.get_by_role("textbox", name="Event id").fill("evt_nobody_" + run.w.tag)
    p.get_by_role("button", name="Search").click()
    expect(c.status()).to_contain_text("0 deliveries")
    expect(p.locator("#results")).to_contain_text("No deliveries recorded")
    # a refused search clears what the one before showed
    p.get_by_role("textbox", name="Event id").fill(ev)
    p.get_by_role("button", name="Search").click()
    expect(c.status()).to_contain_text(f"Event {ev}: 1 delivery")
    c.allow(400, "/v1/events/bad.id/deliveries?limit=500")
    p.get_by_role("textbox", name="Event id").fill("bad.id")
    p.get_by_role("button", name="Search").click()
    expect(c.status()).to_contain_text("400")
    expect(p.locator("section.delivery")).to_have_count(0)


def test_a_broken_or_unknown_link_is_said_not_acted_on(run, console):
    """A link whose #hash is not valid percent-encoding still opens the page with the stored
    key; a latency link naming an endpoint that does not exist says so rather than charting
    another endpoint as if it were the one asked for."""
    from playwright.sync_api import expect
    c = console(run.read)
    p = c.open("latency", "#endpoint=" + run.eps["slow"])
    expect(c.status()).to_contain_text(f"Latency of {run.eps['slow']}")
    p.goto(run.api.base + "/console/dead-letters.html#endpoint=%E0%A4%A")
    expect(p.get_by_role("button", name="Forget key")).to_be_visible()  # the key was used
    expect(c.status()).not_to_contain_text("Enter an API key")
    p.goto(run.api.base + "/console/latency.html#endpoint=nobody_" + run.w.tag)
    expect(c.status()).to_contain_text("No endpoint nobody_" + run.w.tag)
    expect(p.locator("#chart canvas")).to_have_count(0)


def test_dead_letters_page_with_a_read_only_key_has_no_working_replay(run, console):
    from playwright.sync_api import expect
    c = console(run.read)
    p = c.open("dead-letters")
    expect(c.status()).to_contain_text("Loaded dead letters of 2 endpoints")
    auth = p.locator(f'#patterns tr[data-endpoint="{run.eps["auth"]}"]')
    expect(auth.locator("td[data-patterns]")).to_have_attribute(
        "data-patterns", "clustered outage|auth/permission spike")
    expect(auth.locator("td").nth(1)).to_have_text(str(COUNTS["auth"]))  # unreplayed
    expect(p.locator("#letters tbody tr")).to_have_count(COUNTS["auth"] + COUNTS["dead"])
    # what the endpoint answered is for admin keys: a read key sees none
    expect(p.locator("#letters tbody td.resp")).to_have_text(
        ["–"] * (COUNTS["auth"] + COUNTS["dead"]))
    c.shot("dead-letters")
    before = len(run.rcv.ledger())
    c.allow(403, "/v1/dead-letters/replay")
    auth.get_by_role("button", name=f"Replay the unreplayed dead letters of {run.eps['auth']}") \
        .click()
    expect(c.status()).to_contain_text("HTTP 403 Forbidden")
    expect(p.locator("#confirm")).not_to_be_visible()
    c.shot("dead-letters-read-only")
    # nothing was replayed: the letters are still unreplayed (the admin test below sends
    # each exactly once, which it could not if these had been sent)
    j = get_json(run.api, f"/v1/dead-letters/patterns?endpoint={run.eps['auth']}", run.admin)
    assert j["data"][0]["unreplayed"] == COUNTS["auth"]
    assert len(run.rcv.ledger()) == before


def test_replay_from_the_console_delivers_each_dead_letter_once(run, console):
    from playwright.sync_api import expect
    auth_ep = run.eps["auth"]
    # the cause is fixed: the endpoint answers 2xx now
    r = run.w.ctl("endpoints", "update", auth_ep, "--url", run.rcv.url("ok", auth_ep))
    assert r.returncode == 0, r.stderr
    wait_until(lambda: any(e.get("endpoint_id") == auth_ep
                           for e in run.c.events("endpoint_changed")),
               30 * MULT, 0.2, "the consumer to see the new URL")
    c = console(run.admin)
    p = c.open("dead-letters", "#endpoint=" + auth_ep)
    expect(c.status()).to_contain_text("Loaded dead letters of 1 endpoint ")
    # an admin key sees what the endpoint answered: the receiver's 401 body, as text
    expect(p.locator("#letters tbody td.resp code")).to_have_text(
        ['{"status":401}'] * COUNTS["auth"])
    button = p.get_by_role("button", name=f"Replay the unreplayed dead letters of {auth_ep}")
    # cancelling sends nothing
    button.click()
    dialog = p.get_by_role("dialog", name="Replay dead letters?")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Send {COUNTS['auth']} dead letters of endpoint {auth_ep}")
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    c.shot("dead-letters-confirm")
    p.keyboard.press("Escape")
    expect(dialog).not_to_be_visible()
    expect(c.status()).to_contain_text("Replay cancelled; nothing was sent")
    expect(button).to_be_focused()
    # confirm, by keyboard
    p.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    p.keyboard.press("Tab")
    expect(dialog.get_by_role("button", name=f"Replay {COUNTS['auth']}")).to_be_focused()
    p.keyboard.press("Enter")
    expect(c.status()).to_contain_text(
        f"Replayed {COUNTS['auth']} dead letters of endpoint {auth_ep} (failed 0")
    want = sorted(run.ids["auth"])
    wait_until(lambda: sorted(ledger_ok_ids(run, "auth")) == want, 60 * MULT, 0.3,
               "every replayed letter delivered")
    c.shot("dead-letters-replayed")
    # pressing it again sends nothing: the dry run finds no unreplayed letter
    button = p.get_by_role("button", name=f"Replay the unreplayed dead letters of {auth_ep}")
    button.click()
    expect(c.status()).to_contain_text("Nothing to replay")
    expect(dialog).not_to_be_visible()
    # a sentinel published after it arrives after anything the second press could have sent
    # (the same endpoint, the same partition): then count
    sentinel = f"evt_{run.w.tag}_sentinel"
    st, _, b = call(run.api, "POST", "/v1/events", run.admin,
                    {"id": sentinel, "type": "console.auth", "endpoint": auth_ep, "body": 1})
    assert st == 202, b
    wait_until(lambda: sentinel in ledger_ok_ids(run, "auth"), 60 * MULT, 0.3, "the sentinel")
    got = ledger_ok_ids(run, "auth")
    assert sorted(got) == sorted(want + [sentinel]), "a dead letter was delivered twice"


def test_the_test_button_sends_a_test_event_and_shows_what_the_endpoint_answered(run, console):
    """Last in this file: it adds a delivery to the ok and the slow endpoints' history."""
    from playwright.sync_api import expect
    ok_ep = run.eps["ok"]
    # a read-only key: the button's POST is refused, and the page says so
    c = console(run.read)
    c.allow(403, f"/v1/endpoints/{ok_ep}/test")
    p = c.open("endpoints")
    expect(c.status()).to_contain_text("Loaded")
    p.get_by_role("button", name=f"Send a test event to {ok_ep}").click()
    expect(c.status()).to_contain_text("HTTP 403")
    # a key that may publish and read (admin): sent, then the endpoint's answer from the history
    c2 = console(run.admin)
    p2 = c2.open("endpoints")
    expect(c2.status()).to_contain_text("Loaded")
    before = len([l for l in run.rcv.ledger() if l["endpoint"] == ok_ep])
    # the row's "delivered" count over the window (the 5th cell) before the test
    delivered = p2.locator(f'#endpoints tr[data-endpoint="{ok_ep}"] > :nth-child(5)')
    shown_before = int(delivered.inner_text())
    button = p2.get_by_role("button", name=f"Send a test event to {ok_ep}")
    button.click()
    expect(c2.status()).to_contain_text(f"to {ok_ep}: delivered, HTTP 204 in ")
    got = [l for l in run.rcv.ledger() if l["endpoint"] == ok_ep]
    assert len(got) == before + 1 and 200 <= got[-1]["status"] < 300, got[-1:]
    # the table is reloaded after the answer, quietly: the row counts the test, the status
    # still says what the endpoint answered, and focus is back on the row's (new) button
    expect(delivered).to_have_text(str(shown_before + 1))
    expect(c2.status()).to_contain_text(f"to {ok_ep}: delivered, HTTP 204 in ")
    expect(button).to_be_enabled()
    expect(button).to_be_focused()
    c2.shot("endpoint-tested")
    # a test still running (the slow endpoint answers after 2.3 s) keeps its button disabled
    # when the table is reloaded meanwhile, and one test's end does not enable another's
    slow_ep = run.eps["slow"]
    slow_button = p2.get_by_role("button", name=f"Send a test event to {slow_ep}")
    slow_button.click()
    expect(c2.status()).to_contain_text(f"to {slow_ep}")
    p2.get_by_role("button", name="Refresh").click()
    expect(c2.status()).to_contain_text("Loaded")
    expect(slow_button).to_be_disabled()
    expect(button).to_be_enabled()
    expect(c2.status()).to_contain_text(f"to {slow_ep}: delivered, HTTP ", timeout=30000)
    expect(slow_button).to_be_enabled()
