"""The README's main command, scripts/demo.sh, run non-interactively for a short bounded time:
it must deliver, retry, dead-letter and report as scripted, with every signature verified.
"""

import collections
import json
import os
import subprocess

from sluice_e2e import need_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    r = subprocess.run(["bash", os.path.join(REPO, "scripts/demo.sh")], env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
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
