"""The README's main command, scripts/demo.sh, run non-interactively for a short bounded time:
it must deliver, retry, dead-letter and report as scripted, with every signature verified;
then, while it holds its processes up, Prometheus (started by the demo with the stack) must
hold the series the demo produces (issue #17, item 3), and Ctrl-C must stop it cleanly.
"""

import collections
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request

from sluice_e2e import need_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prom_query(base, q):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as r:
        d = json.load(r)
    assert d["status"] == "success", d
    return [(x["metric"], float(x["value"][1])) for x in d["data"]["result"]]


def check_prometheus(base):
    """The series the demo must produce, as Prometheus scraped them (every second)."""
    def wait_for(q, pred, what, timeout=90):
        end, last = time.time() + timeout, None
        while time.time() < end:
            last = prom_query(base, q)
            if pred(last):
                return last
            time.sleep(1)
        raise AssertionError(f"Prometheus: {what}: {q} -> {last}")
    # every demo process is scraped and up
    wait_for('count(up{job="sluice"} == 1)', lambda r: r and r[0][1] == 4,
             "the demo's four processes up")
    # deliveries to demo-healthy rising (the hold keeps events flowing)
    wait_for('sum(increase(sluice_endpoint_deliveries_total{endpoint="demo-healthy",'
             'outcome="delivered"}[15s]))', lambda r: r and r[0][1] > 0,
             "deliveries to demo-healthy rising")
    # the breaker of demo-dead seen open (it half-opens for a probe between cooldowns)
    wait_for('max(max_over_time(sluice_endpoint_breaker_open{endpoint="demo-dead"}[2m]))',
             lambda r: r and r[0][1] == 1, "demo-dead's breaker open")
    # a non-empty latency histogram, with demo-slow's P95 above its 2.5 s answer time
    wait_for('sum(sluice_http_phase_seconds_count{phase="total"})', lambda r: r and r[0][1] > 0,
             "HTTP latency observations")
    wait_for('histogram_quantile(0.95, sum by (le) (sluice_endpoint_request_duration_seconds_bucket'
             '{endpoint="demo-slow"}))', lambda r: r and r[0][1] >= 2.5, "demo-slow's P95 >= 2.5 s")
    # the recorder and the API export too
    wait_for('sum(sluice_recorder_rows_total)', lambda r: r and r[0][1] > 0, "recorder rows")
    wait_for('sum(sluice_api_events_published_total)', lambda r: r and r[0][1] > 0,
             "events published through the API")


def check_console(url, key):
    """The demo's web console in Debian's headless Chromium: the endpoints page lists the demo's
    endpoints with demo-slow marked slow and demo-dead's breaker open or half-open, and the
    latency page charts demo-slow. Screenshots under $SL_BINARY_DIR/test-artifacts/demo/."""
    from playwright.sync_api import expect, sync_playwright
    art = os.path.join(os.environ["SL_BINARY_DIR"], "test-artifacts", "demo")
    os.makedirs(art, exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium",
                               args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            p = b.new_page(viewport={"width": 1400, "height": 900})
            p.set_default_timeout(60000)
            expect.set_options(timeout=60000)
            p.goto(url)
            p.get_by_role("textbox", name="API key").fill(key)
            p.get_by_role("button", name="Use key").click()
            rows = p.locator("#endpoints tbody tr")
            expect(p.locator('#endpoints tr[data-endpoint="demo-healthy"]')).to_have_count(1)
            ids = rows.evaluate_all("rs => rs.map(r => r.dataset.endpoint)")
            for ep in ("demo-healthy", "demo-slow", "demo-flaky", "demo-dead", "demo-crm"):
                assert ep in ids, ids
            expect(p.locator('#endpoints tr[data-endpoint="demo-slow"]')) \
                .to_have_attribute("data-slow", "true")
            expect(p.locator('#endpoints tr[data-endpoint="demo-healthy"]')) \
                .to_have_attribute("data-slow", "false")
            expect(p.locator('#endpoints tr[data-endpoint="demo-dead"] td[data-breaker]')) \
                .to_have_attribute("data-breaker", re.compile("open|half_open"))
            p.screenshot(path=os.path.join(art, "endpoints.png"), full_page=True)
            p.goto(url + "latency.html#endpoint=demo-slow")
            fig = p.locator("#chart-figure")
            expect(fig).to_have_attribute("data-points", re.compile("^[1-9][0-9]*$"))
            p.screenshot(path=os.path.join(art, "latency.png"), full_page=True)
        finally:
            b.close()


def test_demo_runs_end_to_end():
    for name in ("SLUICE_KAFKA_BROKERS", "SL_BINARY_DIR"):
        need_env(name)
    stack_dir = os.environ.get("SLUICE_STACK_DIR", os.path.join(REPO, ".stack"))
    env = dict(os.environ)
    env.update({"SLUICE_DEMO_BIN_DIR": os.environ["SL_BINARY_DIR"],
                "SLUICE_DEMO_DURATION_S": "25", "SLUICE_DEMO_RATE": "30",
                "SLUICE_DEMO_NO_TOP": "1"})
    ledger = os.path.join(stack_dir, "demo", "ledger.jsonl")
    if os.path.exists(ledger):
        os.unlink(ledger)
    p = subprocess.Popen(["bash", os.path.join(REPO, "scripts/demo.sh")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    lines_out = []
    try:
        deadline = time.time() + 600
        for line in p.stdout:  # until the demo says it holds (or ends, or time runs out)
            lines_out.append(line)
            if "up until Ctrl-C" in line or time.time() > deadline:
                break
        for line in p.stdout:  # the URL block, up to its last line
            lines_out.append(line)
            if line.startswith("Ctrl-C stops"):
                break
        out = "".join(lines_out)
        assert "up until Ctrl-C" in out, out[-4000:]
        urls = dict(re.findall(r"^(web console|Prometheus):\s+(\S+)", out, re.M))
        assert urls.get("web console", "").endswith("/console/"), out[-2000:]
        check_prometheus(urls["Prometheus"])
        check_console(urls["web console"], open(os.path.join(stack_dir, "demo", "api.key")).read().strip())
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        rest, _ = p.communicate(timeout=120)
    out += rest
    assert p.returncode in (0, 130), out[-4000:]
    assert "stopping the demo processes" in rest, rest[-2000:]
    for section in ("sluicectl health", "sluicectl slow", "sluicectl dead-letters"):
        assert section in out, f"missing section {section!r}"
    assert "published=" in out and "failed=0" in out, out[-3000:]

    lines = [json.loads(l) for l in open(ledger)]
    by = collections.Counter((l["endpoint"], l["status"]) for l in lines)
    # every request carried a valid signature (the receiver rejects bad ones with 401, so
    # the only 401s allowed are the scripted demo-unauth ones)
    assert all(l["sig_ok"] for l in lines), [l for l in lines if not l["sig_ok"]][:3]
    assert by[("demo-healthy", 204)] > 50
    assert by[("demo-flaky", 500)] > 0 and by[("demo-flaky", 200)] > 0
    assert by[("demo-unauth", 401)] > 0
    assert by[("demo-slow", 200)] > 0
    assert by[("demo-postback", 204)] > 0
    assert all(l["method"] == "GET" for l in lines if l["endpoint"] == "demo-postback")

    # the HTTP API part: every invoice event published with curl was accepted (202), and each
    # fanned out to exactly its three subscribers (registered through the API), once each
    api_codes = [l for l in out.splitlines() if l.startswith("API publishes:")]
    assert api_codes and "HTTP 202" in api_codes[0], out[-3000:]
    assert all(w.split()[-1] == "202" for w in api_codes[0].split("  ") if "HTTP" in w), api_codes
    subs = ("demo-crm", "demo-billing", "demo-ledger")
    inv = collections.Counter((l["webhook_id"], l["endpoint"]) for l in lines
                              if l["endpoint"] in subs and l["status"] == 204)
    per_ep = collections.Counter(ep for (_, ep) in inv)
    assert per_ep[subs[0]] > 10 and len(set(per_ep[s] for s in subs)) == 1, per_ep
    assert max(inv.values()) == 1, "an invoice event reached a subscriber twice"
    assert not any(l["endpoint"] not in subs and l["webhook_id"].startswith("inv_")
                   for l in lines), "an invoice event reached an endpoint not subscribed"
    assert "demo-crm       delivered" in out, out[-2000:]

    # the outcomes tell the scripted story: deliveries, retries, dead letters, a breaker
    env_ctl = dict(os.environ)
    env_ctl["SLUICE_MASTER_KEY"] = open(os.path.join(stack_dir, "demo", "master.key")).read().strip()
    d = subprocess.run([os.path.join(os.environ["SL_BINARY_DIR"], "ctl/sluicectl"), "dump",
                        "outcomes", "--idle-ms", "3000"], env=env_ctl, capture_output=True,
                       text=True, timeout=120)
    assert d.returncode == 0, d.stderr
    outs = [json.loads(l) for l in d.stdout.splitlines()]
    st = collections.Counter((o["endpoint"], o["state"]) for o in outs)
    assert st[("demo-healthy", "delivered")] > 50
    assert st[("demo-flaky", "retry_scheduled")] > 0
    assert st[("demo-unauth", "dead_letter")] > 0
    assert st[("demo-dead", "retry_scheduled")] > 0
    assert st[("demo-dead", "deferred")] > 0, "the dead endpoint's breaker never opened"
    assert all(o["http"] == 401 for o in outs
               if o["endpoint"] == "demo-unauth" and o["state"] == "dead_letter")
