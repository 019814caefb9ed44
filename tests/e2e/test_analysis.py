"""The analysis and operations commands (issue "The recorder and the analysis", part 2) on the
real stack: sluicectl health, slow, dead-letters, alerts, latency, replay and retries rebuild.

One scripted run feeds every test in this module (they run in file order and share it; the
replay and rebuild tests come last because they change the state): endpoints that are healthy
(ok), slow (slow/1200), flapping (flaky/50), answering 401 (unauth), dead (status/500) and
asking to be left alone for 10 minutes (retryafter/600, so its deliveries stay open). The
oracle is the receiver's ledger and the outcomes topic, never the history the commands read.

Isolation: besides the World's own topics, groups and Redis db, the run gets a private
PostgreSQL database on the shared server (the history queries are global, so a shared
database would mix in other tests' rows), with every migration of sql/ applied, and its own
sluice-recorder (the World does not start one; this file's Recorder helper does). That
database sorts text linguistically (ICU en-US, as most installations' default collation
does; the shared stack's is C), so the recorder and every command here run on one.
"""

import json
import os
import re
import subprocess
import time

import pytest

from sluice_e2e import PrivateDb, Proc, World, event, final_states, redis_cmd, wait_until

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))

SLOW_MS = 1200  # slow/<ms> behaviour of the slow endpoint
SLOW_LO = SLOW_MS - 10  # the receiver's timer may wake a few ms early
MAX_ATTEMPTS = 4

COUNTS = {"ok": 30, "slow": 12, "flap": 20, "auth": 12, "dead": 6, "hold": 5}
EXTRA_OK = 7  # produced while no consumer runs: the Kafka lag health must show


# ==== helpers ====


class Recorder:
    """build/recorder/sluice-recorder with the world's environment (see recorder/README.md)."""

    def __init__(self, w):
        env = dict(w.env)
        env["SLUICE_INSTANCE_ID"] = "rec"
        env["SLUICE_RECORDER_FLUSH_MS"] = "100"
        self.p = Proc([w.bin("recorder/sluice-recorder")], env,
                      os.path.join(w.dir, "recorder.log"))

    def stop(self):
        if self.p.alive():
            assert self.p.term() == 0, "recorder did not exit 0 on SIGTERM"


def ctl_json(w, *args, rc=0, env=None):
    r = w.ctl(*args, "--json", env=env)
    assert r.returncode == rc, f"sluicectl {' '.join(args)}: rc {r.returncode}: {r.stderr}"
    return json.loads(r.stdout)


def wait_recorded(w, db, timeout=90):
    """Until the history holds exactly one attempt row per outcome record."""
    def caught_up():
        n = len(w.outcomes())
        m = int(db.q("select count(*) from delivery_attempts"))
        return n == m and (n, m)
    return wait_until(caught_up, timeout * MULT, 1.0, "the recorder to catch up")


# ==== the scripted run ====

class Run:
    pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analysis")
    w = World(tmp, partitions=4, retry_base_ms=200, retry_cap_ms=800,
              max_attempts=MAX_ATTEMPTS, breaker_threshold=100000)
    db = PrivateDb("sluice_ana_", icu_locale="en-US")
    w.env["SLUICE_PG_DSN"] = db.dsn
    rec = Recorder(w)
    try:
        rcv = w.receiver()
        t = w.tag
        eps = {
            "ok": w.add_endpoint("ok" + t, rcv.url("ok", "ok")),
            "slow": w.add_endpoint("slow" + t, rcv.url(f"slow/{SLOW_MS}", "slow")),
            "flap": w.add_endpoint("flap" + t, rcv.url("flaky/50", "flap")),
            "auth": w.add_endpoint("auth" + t, rcv.url("unauth", "auth")),
            "dead": w.add_endpoint("dead" + t, rcv.url("status/500", "dead")),
            "hold": w.add_endpoint("hold" + t, rcv.url("retryafter/600", "hold")),
        }
        names = {v: k for k, v in eps.items()}
        events = []
        for kind, n in COUNTS.items():
            events += [event(eps[kind], i, t) for i in range(n)]
        assert w.produce(events).returncode == 0
        c = w.consumer()

        def settled():
            fin = final_states(w.outcomes())
            for e in events:
                kind = names[e["endpoint"]]
                o = fin.get((e["id"], e["endpoint"]))
                if kind == "hold":
                    continue
                if not o or o["state"] not in ("delivered", "dead_letter"):
                    return False
            return any(l["endpoint"] == "hold" for l in rcv.ledger())
        wait_until(settled, 120 * MULT, 1.0, "every scripted delivery to settle")
        assert c.term() == 0
        wait_recorded(w, db)
        # queued in Kafka while no consumer runs
        extra = [event(eps["ok"], 1000 + i, t) for i in range(EXTRA_OK)]
        assert w.produce(extra).returncode == 0

        r = Run()
        r.w, r.db, r.rcv, r.rec, r.eps, r.names, r.events = w, db, rcv, rec, eps, names, events
        r.ledger = rcv.ledger()
        r.outcomes = w.outcomes()
        r.final = final_states(r.outcomes)
        yield r
    finally:
        rec.stop()
        w.close()
        db.drop()


def ledger_by(r, kind):
    return [l for l in r.ledger if l["endpoint"] == kind]


def dead_by_ledger(r, kind):
    """Event ids of an endpoint that never got a 2xx (all scripted ones have settled)."""
    lines = ledger_by(r, kind)
    ok = {l["webhook_id"] for l in lines if 200 <= l["status"] < 300}
    return {l["webhook_id"] for l in lines} - ok


def open_final(r):
    return {k: o for k, o in r.final.items()
            if r.names.get(k[1]) == "hold" and o["state"] in ("retry_scheduled", "deferred")}


# ==== the database ====

HISTORY = ("delivery_attempts", "deliveries", "endpoint_latency", "endpoint_health",
           "dead_letters", "replay_log", "pending_payloads")


def test_history_ids_compare_as_bytes_under_a_linguistic_collation(run):
    """sql/0010: the history's ids are collated "C" in every table and partition, so the
    keys compare bytes (memcmp rather than ICU or strcoll, which halved the recorder's rate)
    and an ORDER BY over them is byte order, while the database's own default stays
    linguistic."""
    assert run.db.q("select daticulocale from pg_database "
                    "where datname = current_database()") == "en-US"
    assert run.db.q("select string_agg(x, ',' order by x) "
                    "from (values ('acme'), ('Beta')) v(x)") == "acme,Beta"  # linguistic
    rows = run.db.q(
        "select c.relname, a.attname, co.collname from pg_attribute a "
        "join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace "
        "join pg_collation co on co.oid = a.attcollation "
        "where n.nspname = 'public' and c.relkind in ('r', 'p') and not a.attisdropped "
        "and a.attname in ('event_id', 'endpoint_id', 'run_id')").splitlines()
    cols = {tuple(r.split("|")) for r in rows}
    tables = {t for t, _, _ in cols}
    for t in HISTORY:
        assert t in tables, (t, sorted(tables))
    partitions = {t for t in tables if t.startswith(("delivery_attempts_p", "endpoint_latency_p"))}
    assert partitions, "the recorder made its partitions"
    wrong = sorted((t, a, c) for t, a, c in cols
                   if c != "C" and (t in HISTORY or t in partitions or t.endswith("_default")))
    assert not wrong, wrong
    # a column's collation carries into what is built from it
    assert run.db.q("select string_agg(x, ',' order by x) from (select endpoint_id as x "
                    "from endpoint_health where false union all select 'acme' "
                    "union all select 'Beta') s") == "Beta,acme"
    # the recorder's rows are all there (the oracle: the outcomes topic)
    assert int(run.db.q("select count(*) from delivery_attempts")) == len(run.outcomes)


# ==== health ====

def test_health_matches_ledger_kafka_and_redis(run):
    r = run
    h = ctl_json(r.w, "health", "--window", "1h")
    opens = open_final(r)
    assert len(opens) == COUNTS["hold"], "every held delivery is open"
    # Kafka: only the records produced after the consumer stopped
    assert h["kafka"]["available"] and h["kafka"]["lag"] == EXTRA_OK
    assert h["endpoint_records"]["available"] is True, h["endpoint_records"]
    assert h["pending"]["queued_in_kafka"] == EXTRA_OK
    # Redis: the open deliveries are the schedule; nothing is leased once the consumer stopped
    assert h["redis"]["scheduled"] == COUNTS["hold"]
    assert h["redis"]["leased"] == 0 and h["pending"]["in_flight"] == 0
    assert h["pending"]["total"] == EXTRA_OK + COUNTS["hold"]
    # PostgreSQL
    p = h["postgresql"]
    assert p["available"]
    assert p["awaiting_retry"] == sum(o["state"] == "retry_scheduled" for o in opens.values())
    assert p["deferred"] == sum(o["state"] == "deferred" for o in opens.values())
    dead = sum(len(dead_by_ledger(r, k)) for k in ("ok", "slow", "flap", "auth", "dead"))
    assert dead == sum(o["state"] == "dead_letter" for o in r.final.values())
    assert p["dead_letters_unreplayed"] == dead and p["dead_letters_window"] == dead
    ok_lines = [l for l in r.ledger if 200 <= l["status"] < 300]
    bad_lines = [l for l in r.ledger if l["status"] > 0 and not 200 <= l["status"] < 300]
    assert p["delivered_window"] == len(ok_lines)
    assert p["failed_attempts_window"] == len(bad_lines)
    assert p["latency_samples"] == len([l for l in r.ledger if l["status"] > 0])
    assert p["oldest_undelivered_ms"] == min(o["created_ms"] for o in opens.values())
    # P95: slow answers are more than 5% of the samples, so the P95 is one of them
    n_slow = len(ledger_by(r, "slow"))
    assert n_slow / p["latency_samples"] > 0.05 + 1 / p["latency_samples"]
    assert SLOW_LO <= p["p95_latency_ms"] < SLOW_MS + 2000
    assert p["avg_latency_ms"] >= SLOW_LO * n_slow / p["latency_samples"]
    # text output names every source
    t = r.w.ctl("health")
    assert t.returncode == 0, t.stderr
    for word in ("kafka: lag of group", "redis:", "postgresql: deliveries", "pending total"):
        assert word in t.stdout


def test_health_without_postgresql_still_reports_kafka_and_redis(run):
    r = run
    env = dict(r.w.env)
    env["SLUICE_PG_DSN"] = "host=127.0.0.1 port=1 dbname=nope user=nope connect_timeout=2"
    h = ctl_json(r.w, "health", rc=1, env=env)
    assert h["postgresql"]["available"] is False and h["postgresql"]["error"]
    assert h["kafka"]["lag"] == EXTRA_OK and h["redis"]["scheduled"] == COUNTS["hold"]
    t = r.w.ctl("health", env=env)
    assert t.returncode == 1
    assert "history unavailable" in t.stdout and "history unavailable" in t.stderr
    assert "queued in Kafka" in t.stdout


# ==== slow, latency ====

def test_slow_endpoints(run):
    r = run
    n = len(ledger_by(r, "slow"))
    assert n == COUNTS["slow"]
    s = ctl_json(r.w, "slow", "--threshold-ms", "1000", "--min-samples", str(n), "--window", "1h")
    assert [e["endpoint_id"] for e in s["endpoints"]] == [r.eps["slow"]]
    e = s["endpoints"][0]
    assert e["samples"] == n and e["last_status"] == 200
    for k in ("p50_ms", "p95_ms", "p99_ms"):
        assert SLOW_LO <= e[k] < SLOW_MS + 2000, (k, e[k])
    # one sample short of the minimum: no verdict
    s = ctl_json(r.w, "slow", "--threshold-ms", "1000", "--min-samples", str(n + 1))
    assert s["endpoints"] == []
    s = ctl_json(r.w, "slow", "--threshold-ms", str(SLOW_MS + 2000), "--min-samples", "1")
    assert s["endpoints"] == []


def test_latency_histogram(run):
    r = run
    lat = ctl_json(r.w, "latency", r.eps["slow"], "--window", "1h")
    assert lat["samples"] == COUNTS["slow"]
    hist = {b["bucket"]: b["samples"] for b in lat["histogram"]}
    assert list(hist) == ["<10ms", "<50ms", "<100ms", "<250ms", "<500ms", "<1s", "<2s", "<5s",
                          "<10s", ">=10s"]
    assert sum(hist.values()) == lat["samples"]
    # every slow answer took SLOW_MS plus a little: all in the [1 s, 2 s) bucket
    assert hist["<2s"] == COUNTS["slow"]
    assert 1000 <= lat["p50_ms"] < 2000 and 1000 <= lat["p99_ms"] < 2000
    assert lat["min_ms"] >= SLOW_LO
    ok = ctl_json(r.w, "latency", r.eps["ok"])
    assert ok["samples"] == len(ledger_by(r, "ok")) == COUNTS["ok"]
    assert sum(b["samples"] for b in ok["histogram"]) == ok["samples"]
    assert ok["p50_ms"] < 1000
    t = r.w.ctl("latency", r.eps["slow"])
    assert t.returncode == 0 and "<2s" in t.stdout and "#" in t.stdout
    none = ctl_json(r.w, "latency", "nosuch" + r.w.tag)
    assert none["samples"] == 0 and none["p50_ms"] is None


# ==== one event ====

def test_event_shows_each_delivery_with_every_attempt(run):
    """sluicectl event ID: the history of one event, each attempt the consumer reported."""
    r = run
    for kind, state, status in (("dead", "dead_letter", 500), ("ok", "delivered", 204)):
        e = next(e for e in r.events if r.names[e["endpoint"]] == kind)
        sent = sorted(o["attempt"] for o in r.outcomes
                      if o["id"] == e["id"] and o["endpoint"] == e["endpoint"])
        j = ctl_json(r.w, "event", e["id"])
        assert j["event_id"] == e["id"] and len(j["deliveries"]) == 1, j
        (d,) = j["deliveries"]
        assert (d["endpoint_id"], d["state"], d["last_status"]) == (e["endpoint"], state, status)
        assert d["attempts"] == len(sent) == (MAX_ATTEMPTS if kind == "dead" else 1), d
        assert [a["attempt"] for a in d["attempts_log"]] == sent, d
        assert all(a["http_status"] == status and a["latency_ms"] is not None
                   for a in d["attempts_log"]), d
        assert (d["delivered_at"] is not None) == (kind == "ok"), d
        rfc3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
        assert all(rfc3339.fullmatch(a["at"]) for a in d["attempts_log"]), d
        assert kind != "ok" or rfc3339.fullmatch(d["delivered_at"]), d
        t = r.w.ctl("event", e["id"])
        assert t.returncode == 0, t.stderr
        assert t.stdout.startswith(f"event {e['id']}: 1 delivery\n"), t.stdout
        assert state in t.stdout and "attempts:" in t.stdout, t.stdout
        assert t.stdout.count(f"  {e['endpoint']} ") == 1 + len(sent), t.stdout
    none = r.w.ctl("event", "nosuch" + r.w.tag)
    assert none.returncode == 1 and "no delivery of event nosuch" in none.stderr, none.stderr


# ==== dead letters, alerts ====

def test_dead_letter_analysis(run):
    r = run
    d = ctl_json(r.w, "dead-letters", "--window", "1h")
    by = {e["endpoint_id"]: e for e in d["endpoints"]}
    for kind in ("ok", "slow", "flap", "auth", "dead", "hold"):
        want = len(dead_by_ledger(r, kind)) if kind != "hold" else 0
        got = by.get(r.eps[kind], {}).get("dead_letters", 0)
        assert got == want, (kind, got, want)
    dl = [o for o in r.final.values() if o["state"] == "dead_letter"]
    a = by[r.eps["auth"]]
    assert a["dead_letters"] == COUNTS["auth"] and a["unreplayed"] == COUNTS["auth"]
    assert a["top_status"] == 401 and a["top_status_count"] == COUNTS["auth"]
    assert a["top_error"] == next(o["err"] for o in dl if o["endpoint"] == r.eps["auth"])
    assert a["avg_attempts"] == 1 and a["without_payload"] == 0
    assert set(a["patterns"]) == {"clustered outage", "auth/permission spike"}
    x = by[r.eps["dead"]]
    assert x["dead_letters"] == COUNTS["dead"] and x["top_status"] == 500
    assert x["avg_attempts"] == MAX_ATTEMPTS
    assert x["patterns"] == []  # 6 < 10: no cluster verdict; 500 is neither auth nor 429
    one = ctl_json(r.w, "dead-letters", "--endpoint", r.eps["auth"])
    assert [e["endpoint_id"] for e in one["endpoints"]] == [r.eps["auth"]]
    t = r.w.ctl("dead-letters")
    assert t.returncode == 0
    assert f"{r.eps['auth']}: clustered outage" in t.stdout
    assert f"{r.eps['auth']}: auth/permission spike" in t.stdout


def test_alerts_exit_codes(run):
    r = run
    dead = sum(o["state"] == "dead_letter" for o in r.final.values())
    a = ctl_json(r.w, "alerts", rc=3)
    rising = [x for x in a["alerts"] if x["alert"] == "dead_letters_rising"]
    assert len(rising) == 1 and rising[0]["value"] == dead
    assert {x["alert"] for x in a["alerts"]} == {"dead_letters_rising"}
    quiet = ["--dead-rise-min", "100000", "--oldest-max", "1h"]
    assert ctl_json(r.w, "alerts", *quiet)["firing"] == 0
    assert r.w.ctl("alerts", *quiet).returncode == 0
    old = ctl_json(r.w, "alerts", "--dead-rise-min", "100000", "--oldest-max", "1s", rc=3)
    assert [x["alert"] for x in old["alerts"]] == ["oldest_undelivered"]
    slow = ctl_json(r.w, "alerts", *quiet, "--slow-threshold-ms", "1000",
                    "--slow-min-samples", str(COUNTS["slow"]), rc=3)
    assert [(x["alert"], x["endpoint_id"]) for x in slow["alerts"]] == \
        [("slow_endpoint", r.eps["slow"])]


# ==== usage ====

@pytest.mark.parametrize("args", [
    ("health", "--window", "5x"), ("health", "--window", "0s"), ("health", "--window", "1h30m"),
    ("health", "extra"), ("slow", "--threshold-ms", "-1"), ("slow", "--min-samples", "0"),
    ("dead-letters", "--endpoint", "bad id"), ("alerts", "--dead-rise-factor", "1e3"),
    ("alerts", "--oldest-max", "367d"), ("latency",), ("latency", "a.b"), ("event",),
    ("event", "a.b"), ("event", "x", "y"),
    ("replay",), ("replay", "--ids", "a.b"), ("replay", "--since", "yesterday", "--all"),
    ("replay", "--since", "1h", "--until", "2h"), ("replay", "--error", "HTTP"),
    ("retries",), ("retries", "frob"), ("retries", "rebuild", "--lookback", "7"),
])
def test_usage_errors_touch_nothing(tmp_path, args):
    """Exit 2 before the configuration is even loaded (a broken one would give 78)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["SLUICE_REDIS_TIMEOUT_MS"] = "not-a-number"
    ctl = os.path.join(os.environ["SL_BINARY_DIR"], "ctl/sluicectl")
    r = subprocess.run([ctl, *args], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert r.stderr.startswith("sluicectl")


# ==== replay (changes the state: after the read-only tests) ====

def test_replay_selects_by_error_class_and_time(run):
    """--error, --since and --until select exactly the letters they name (dry runs: nothing
    is sent or marked, so the replay test below still finds every letter)."""
    r = run
    w, dead, auth = r.w, r.eps["dead"], r.eps["auth"]
    dead_ids, auth_ids = dead_by_ledger(r, "dead"), dead_by_ledger(r, "auth")

    def ids(*args):
        out = ctl_json(w, "replay", *args, "--dry-run")
        assert out["would_replay"] == len(out["letters"])
        return {x["event_id"] for x in out["letters"]}

    dead_cls = r.db.q(f"select string_agg(distinct error_class, ',') from dead_letters"
                      f" where endpoint_id = '{dead}'")
    auth_cls = r.db.q(f"select string_agg(distinct error_class, ',') from dead_letters"
                      f" where endpoint_id = '{auth}'")
    assert dead_cls == "http_5xx" and auth_cls == "http_4xx", (dead_cls, auth_cls)
    assert ids("--endpoint", dead, "--error", "http_5xx") == dead_ids
    assert ids("--endpoint", dead, "--error", "http_4xx") == set()
    by_4xx = ids("--error", "http_4xx")
    assert auth_ids <= by_4xx and not (dead_ids & by_4xx)
    # split the dead endpoint's letters at the death time of one in the middle
    times = r.db.q(f"select string_agg(to_char(dead_at at time zone 'UTC',"
                   f" 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') || ' ' || event_id, ';'"
                   f" order by dead_at) from dead_letters where endpoint_id = '{dead}'").split(";")
    deaths = [tuple(x.split(" ")) for x in times]
    assert len(deaths) == len(dead_ids) >= 4
    # letters can die in the same millisecond: split at a distinct time in the middle (with
    # one time for all, --since takes every letter and --until none)
    distinct = sorted({ts for ts, _ in deaths})
    t = distinct[len(distinct) // 2]
    later = {e for ts, e in deaths if ts >= t}
    assert later and (later != dead_ids or len(distinct) == 1)
    assert ids("--endpoint", dead, "--since", t) == later
    assert ids("--endpoint", dead, "--until", t) == dead_ids - later
    assert ids("--endpoint", dead, "--since", "1d") == dead_ids
    assert ids("--endpoint", dead, "--until", "1d") == set()
    assert r.db.q("select count(*) from dead_letters where replayed_at is not null") == "0"


def test_replay_sends_each_dead_letter_once(run):
    r = run
    w, auth = r.w, r.eps["auth"]
    dead_ids = dead_by_ledger(r, "auth")
    assert len(dead_ids) == COUNTS["auth"]
    dry = ctl_json(w, "replay", "--endpoint", auth, "--dry-run")
    assert dry["would_replay"] == COUNTS["auth"]
    assert {x["event_id"] for x in dry["letters"]} == dead_ids
    assert r.db.q(f"select count(*) from dead_letters where endpoint_id = '{auth}'"
                  f" and replayed_at is not null") == "0"
    # fix the endpoint first, then replay twice at once and once more
    rr = w.ctl("endpoints", "update", auth, "--url", r.rcv.url("ok", "auth"))
    assert rr.returncode == 0, rr.stderr
    c = w.consumer("after-fix")
    procs = [subprocess.Popen([w.bin("ctl/sluicectl"), "replay", "--endpoint", auth,
                               "--batch-size", "5", "--json"], env=w.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert sum(o["replayed"] for o in outs) == COUNTS["auth"]
    again = ctl_json(w, "replay", "--endpoint", auth)
    assert again["replayed"] == 0 and again["failed"] == 0

    def delivered_again():
        got = {l["webhook_id"] for l in r.rcv.ledger()
               if l["endpoint"] == "auth" and 200 <= l["status"] < 300}
        return got == dead_ids and got
    wait_until(delivered_again, 60 * MULT, 0.5, "the replayed letters to be delivered")
    time.sleep(3 * MULT)  # a duplicate would have had time to arrive
    lines = [l for l in r.rcv.ledger() if l["endpoint"] == "auth"]
    ok = [l["webhook_id"] for l in lines if 200 <= l["status"] < 300]
    assert sorted(ok) == sorted(dead_ids), "exactly one extra delivery per dead letter"
    assert len(lines) == 2 * COUNTS["auth"]
    # the topic holds exactly one replay record per letter, attempt reset
    recs = [d for d in w.dump("deliveries") if d["endpoint"] == auth and d["replay"]]
    assert sorted(d["id"] for d in recs) == sorted(dead_ids)
    assert all(d["attempt"] == 0 for d in recs)
    assert r.db.q(f"select count(*) from dead_letters where endpoint_id = '{auth}'"
                  f" and replayed_at is not null and replay_count = 1") == str(COUNTS["auth"])
    assert r.db.q("select count(*) from replay_log where state = 'acked'") == \
        str(COUNTS["auth"])
    # the still-broken endpoint's letters were not touched
    assert len([l for l in r.rcv.ledger() if l["endpoint"] == "dead"]) == \
        len(ledger_by(r, "dead"))
    assert c.term() == 0


def test_replay_recovers_an_interrupted_run(run):
    """A run acknowledged by Kafka that died before its marking committed: the journal says
    'acked', so the next run marks the letter instead of sending it again. A run that died
    before the acknowledgement was journalled ('sending'): the letter is sent again, and said
    so."""
    r = run
    w, dead = r.w, r.eps["dead"]
    ev, ev2 = sorted(dead_by_ledger(r, "dead"))[:2]
    for e, state in ((ev, "acked"), (ev2, "sending")):
        r.db.q(f"insert into replay_log (run_id, event_id, endpoint_id, dead_at, state, acked_at)"
               f" select 'crashed', event_id, endpoint_id, dead_at, '{state}',"
               f"        case when '{state}' = 'acked' then now() end"
               f"   from dead_letters where event_id = '{e}' and endpoint_id = '{dead}'")
    before = len(w.dump("deliveries"))
    out = ctl_json(w, "replay", "--endpoint", dead, "--ids", ev)
    assert out["recovered"] == 1 and out["replayed"] == 0
    assert len(w.dump("deliveries")) == before, "nothing was sent"
    assert r.db.q(f"select replay_count from dead_letters where event_id = '{ev}'") == "1"
    out = ctl_json(w, "replay", "--endpoint", dead, "--ids", f"{ev},{ev2}")
    assert out["recovered"] == 0 and out["replayed"] == 1 and out["unconfirmed_resent"] == 1
    sent = [d for d in w.dump("deliveries") if d["replay"] and d["endpoint"] == dead]
    assert [d["id"] for d in sent] == [ev2]


# ==== retries rebuild (last: flushes the world's Redis db) ====

def zsnapshot(url, shards=16):
    jobs = {}
    for s in range(shards):
        z = redis_cmd(url, "ZRANGE", f"sluice:retry:{{{s}}}", "0", "-1", "WITHSCORES") or []
        for i in range(0, len(z), 2):
            jid = z[i].decode()
            body = redis_cmd(url, "GET", f"sluice:job:{{{s}}}:{jid}")
            jobs[jid] = (s, int(float(z[i + 1])), body)
    return jobs


def test_retries_rebuild_after_redis_loss(run):
    r = run
    w = r.w
    wait_recorded(w, r.db)
    before = zsnapshot(w.redis_url)
    opens = open_final_now(r)
    assert len(before) == len(opens) == COUNTS["hold"]
    redis_cmd(w.redis_url, "FLUSHDB")
    h = ctl_json(w, "health")
    assert h["redis"]["scheduled"] == 0
    assert "retries rebuild" in w.ctl("health").stdout
    # one record kept by the recorder (pending_payloads), the others must come from Kafka
    kept_jid, (kept_shard, _, kept_body) = sorted(before.items())[0]
    kept = next(k for k in opens if job_id(k[1], k[0]) == kept_jid)
    # the recorder now keeps every held delivery's record (env on retry/deferred outcomes):
    # keep exactly one, so both sources are exercised
    r.db.q(f"delete from pending_payloads where endpoint_id = '{kept[1]}'")
    r.db.q(f"insert into pending_payloads (event_id, endpoint_id, payload, attempt, ts)"
           f" values ('{kept[0]}', '{kept[1]}', '\\x{kept_body.hex()}', 1, now())")
    dry = ctl_json(w, "retries", "rebuild", "--dry-run")
    assert dry["open_deliveries"] == COUNTS["hold"] and dry["not_recoverable"] == 0
    assert dry["restored_from_history"] == 1
    assert dry["restored_from_kafka"] == COUNTS["hold"] - 1
    assert redis_cmd(w.redis_url, "DBSIZE") == 0, "a dry run writes nothing"
    t0 = int(time.time() * 1000)
    out = ctl_json(w, "retries", "rebuild")
    t1 = int(time.time() * 1000)
    assert out["restored_from_history"] == 1
    assert out["restored_from_kafka"] == COUNTS["hold"] - 1
    assert out["already_scheduled"] == 0 and out["not_recoverable"] == 0
    after = zsnapshot(w.redis_url)
    assert set(after) == set(before)
    for jid, (shard, score, body) in before.items():
        s2, score2, body2 = after[jid]
        assert s2 == shard and body2 == body, "the same job body as the consumer's own"
        # a due time travels as a distance from the writer's clock to Redis's (TIME + next -
        # now), so the rebuilt one agrees within what the calls took; a past one is now
        assert abs(score2 - score) <= 1000 or (score <= t1 and t0 - 1000 <= score2 <= t1 + 1000), \
            (score, score2)
    # idempotent
    again = ctl_json(w, "retries", "rebuild")
    assert again["already_scheduled"] == COUNTS["hold"]
    assert again["restored_from_history"] == again["restored_from_kafka"] == 0
    # replayed after a death: the dead chain's attempts are not spent again. Make every open
    # delivery look replayed (died before its first attempt here, with 4 more attempts on
    # record as deliveries.attempts); the rebuilt jobs must carry the attempts since the death
    r.db.q(f"update deliveries d set attempts = d.attempts + 4,"
           f" last_dead_at = (select min(a.ts) from delivery_attempts a"
           f"  where a.event_id = d.event_id and a.endpoint_id = d.endpoint_id)"
           f"  - interval '1 second'"
           f" where d.endpoint_id = '{r.eps['hold']}'"
           f"   and d.state in ('retry_scheduled', 'deferred')")
    redis_cmd(w.redis_url, "FLUSHDB")
    out = ctl_json(w, "retries", "rebuild")
    assert out["restored_from_history"] + out["restored_from_kafka"] == COUNTS["hold"], out
    replayed = zsnapshot(w.redis_url)
    assert set(replayed) == set(before)
    for jid, (shard, score, body) in before.items():
        assert replayed[jid][2] == body, "attempts of the dead chain counted as spent"
    # an open delivery whose record exists nowhere is reported, exit 1
    r.db.q(f"insert into deliveries (event_id, endpoint_id, state, attempts, first_seen,"
           f" last_update, created_at, next_attempt_at) values ('ghost{w.tag}',"
           f" '{r.eps['hold']}', 'retry_scheduled', 1, now(), now(), now(), now())")
    lost = ctl_json(w, "retries", "rebuild", rc=1)
    assert lost["not_recoverable"] == 1
    assert lost["not_recoverable_deliveries"] == [
        {"event_id": f"ghost{w.tag}", "endpoint_id": r.eps["hold"]}]


def open_final_now(r):
    fin = final_states(r.w.outcomes())
    return {k: o for k, o in fin.items()
            if r.names.get(k[1]) == "hold" and o["state"] in ("retry_scheduled", "deferred")}


def job_id(endpoint, event_id):
    import hashlib
    return hashlib.sha1(f"{endpoint}\n{event_id}".encode()).hexdigest()
