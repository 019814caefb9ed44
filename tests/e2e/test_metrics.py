"""Metrics, liveness and readiness of every long-running process (issue #17 items 1 and 2;
contract: docs/METRICS.md).

One world runs a consumer, a recorder and sluice-api, each with its metrics listener. After
a known set of deliveries (some to a healthy receiver, some to a closed port whose breaker
opens), the test scrapes each process and checks:
  - the exposition passes `promtool check metrics` (Debian's prometheus package);
  - every histogram is well formed (cumulative buckets, +Inf = _count) and counters agree
    with what happened (deliveries, dead letters, breaker state, recorder rows, API requests);
  - the families each process exports are exactly those docs/METRICS.md lists for it;
  - /healthz and /readyz answer with their checks; a bad metrics_listen fails at start-up.
"""
import json
import time
import os
import re
import shutil
import socket
import subprocess
import urllib.request

import pytest

from sluice_e2e import World, Proc, event, free_port, wait_until

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def parse(text):
    """Exposition -> (types {family: type}, samples [(name, {labels}, value)])."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, t = line.split(" ", 3)
            types[name] = t
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"unparsable sample line: {line!r}"
            labels = dict(LABEL.findall(m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return types, samples


def value(samples, name, **labels):
    vals = [v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items())]
    assert vals, f"no sample {name}{labels}"
    return sum(vals)


def has(samples, name, want, **labels):
    """Whether the summed samples of name{labels} equal want (False when there are none)."""
    vals = [v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items())]
    return bool(vals) and sum(vals) == want


def check_histograms(types, samples):
    """Cumulative buckets ending in +Inf equal to _count, for every histogram series."""
    for fam, t in types.items():
        if t != "histogram":
            continue
        series = {}
        for n, l, v in samples:
            if n == fam + "_bucket":
                key = tuple(sorted((k, x) for k, x in l.items() if k != "le"))
                series.setdefault(key, []).append((l["le"], v))
        for key, buckets in series.items():
            les = [float("inf") if le == "+Inf" else float(le) for le, _ in buckets]
            assert les == sorted(les) and les[-1] == float("inf"), f"{fam}{key}: bucket order {les}"
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), f"{fam}{key}: buckets not cumulative {counts}"
            count = [v for n, l, v in samples if n == fam + "_count"
                     and tuple(sorted(l.items())) == key]
            assert count == [counts[-1]], f"{fam}{key}: +Inf {counts[-1]} != _count {count}"


def promtool_check(text):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/setup.sh installs Debian's prometheus package"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, f"promtool check metrics:\n{r.stdout}\n{r.stderr}"


def documented_families():
    """docs/METRICS.md: {section: set of family names} from its tables."""
    out, section = {}, None
    with open(os.path.join(REPO, "docs", "METRICS.md")) as f:
        for line in f:
            if line.startswith("### "):
                section = line[4:].strip()
                out.setdefault(section, set())
            m = re.match(r"^\| `([a-z_:]+)` \|", line)
            if m and section:
                out[section].add(m.group(1))
    return out


def exported_families(types):
    return set(types)


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path, partitions=2, retry_base_ms=50, retry_cap_ms=200)
    yield w
    w.close()


def start_recorder(w, metrics):
    env = dict(w.env)
    env["SLUICE_METRICS_LISTEN"] = metrics
    env["SLUICE_RECORDER_FLUSH_MS"] = "100"
    return Proc([w.bin("recorder/sluice-recorder")], env, os.path.join(w.dir, "recorder.log"))


def test_probes_metrics_and_contract(world):
    w = world
    rcv = w.receiver()
    ok = w.add_endpoint(f"ok-{w.tag}", rcv.url("ok", f"ok-{w.tag}"))
    dead = w.add_endpoint(f"dead-{w.tag}", f"http://127.0.0.1:{closed_port()}/x",
                          "--breaker-threshold", "3", "--max-attempts", "2")
    cport, rport = free_port(), free_port()
    cons = w.consumer(metrics_listen=f"127.0.0.1:{cport}", metrics_endpoint_top=5,
                      breaker_cooldown_ms=60000)
    rec = start_recorder(w, f"127.0.0.1:{rport}")
    cbase, rbase = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{rport}"

    def ready(base):
        try:
            return http_get(base + "/readyz")[0] == 200
        except OSError:
            return False
    wait_until(lambda: ready(cbase), 60 * MULT, 0.2, "the consumer's /readyz")
    st, ctype, body = http_get(cbase + "/readyz")
    assert ctype.startswith("application/json")
    assert json.loads(body) == {"ready": True, "checks": {
        "endpoints": "loaded", "kafka_group": "joined", "redis": "ok"}}
    st, _, body = http_get(cbase + "/healthz")
    assert (st, json.loads(body)) == (200, {"live": True})
    assert http_get(cbase + "/nope")[0] == 404

    n_ok, n_dead = 20, 6
    evs = [event(ok, i, w.tag) for i in range(n_ok)] + [event(dead, i, w.tag) for i in range(n_dead)]
    assert w.produce(evs).returncode == 0

    def scrape(base):
        st, ctype, text = http_get(base + "/metrics")
        assert st == 200 and ctype.startswith("text/plain; version=0.0.4"), (st, ctype)
        return text

    def delivered_and_open():
        _, s = parse(scrape(cbase))
        return (has(s, "sluice_deliveries_total", n_ok, outcome="delivered")
                and has(s, "sluice_endpoint_breaker_open", 1, endpoint=dead)
                and any(n == "sluice_kafka_consumer_lag_records" for n, _, _ in s))
    wait_until(delivered_and_open, 90 * MULT, 0.5,
               "all deliveries to the healthy endpoint and the dead endpoint's breaker open")
    text = scrape(cbase)
    promtool_check(text)
    types, s = parse(text)
    check_histograms(types, s)
    assert value(s, "sluice_deliveries_total", outcome="delivered", status_class="2xx") == n_ok
    assert value(s, "sluice_endpoint_deliveries_total", endpoint=ok, outcome="delivered") == n_ok
    assert value(s, "sluice_records_received_total") == n_ok + n_dead
    # failures to a closed port have no HTTP status
    assert value(s, "sluice_deliveries_total", outcome="retry", status_class="none") >= 3
    assert value(s, "sluice_attempts_total") >= n_ok + 3
    assert value(s, "sluice_breaker_open_endpoints") == 1
    assert value(s, "sluice_breaker_transitions_total", to="open") >= 1
    assert value(s, "sluice_publish_to_delivered_seconds_count") == n_ok
    assert value(s, "sluice_http_phase_seconds_count", phase="total") == n_ok
    # every record taken from Kafka waited once before intake; a first request started for
    # each healthy one and for the dead endpoint's until its breaker opened (after 3)
    assert value(s, "sluice_delivery_wait_seconds_count", stage="kafka") == n_ok + n_dead
    queue_n = value(s, "sluice_delivery_wait_seconds_count", stage="queue")
    assert n_ok + 3 <= queue_n <= n_ok + n_dead, queue_n
    assert value(s, "sluice_delivery_wait_seconds_sum", stage="kafka") > 0
    assert value(s, "sluice_http_phase_seconds_count", phase="connect") >= 1
    assert value(s, "sluice_endpoint_request_duration_seconds_count", endpoint=ok) == n_ok
    assert value(s, "sluice_inflight_requests") >= 0
    # 26 deliveries never saturate the loop: the cap stays at max_inflight (the default 2000)
    assert value(s, "sluice_inflight_limit") == 2000
    lags = [l for n, l, _ in s if n == "sluice_kafka_consumer_lag_records"]
    assert {l["topic"] for l in lags} == {w.env["SLUICE_TOPIC_DELIVERIES"]}
    # a partition's lag is known once the group has an offset for it (not for an empty one)
    parts = [int(l["partition"]) for l in lags]
    assert parts and set(parts) <= {0, 1} and len(parts) == len(set(parts)), parts
    assert value(s, "sluice_build_info", process="sluice-consumer") == 1
    assert value(s, "process_resident_memory_bytes") > 0
    consumer_families = exported_families(types)

    # the recorder
    wait_until(lambda: ready(rbase), 60 * MULT, 0.5, "the recorder's /readyz")
    st, _, body = http_get(rbase + "/readyz")
    assert json.loads(body) == {"ready": True, "checks": {"postgresql": "ok", "lag": "ok"}}

    def recorded():
        _, s = parse(scrape(rbase))
        return sum(v for n, l, v in s if n == "sluice_recorder_rows_total"
                   and l.get("table") == "delivery_attempts") >= n_ok
    wait_until(recorded, 60 * MULT, 0.5, "the recorder's rows")
    text = scrape(rbase)
    promtool_check(text)
    rtypes, s = parse(text)
    check_histograms(rtypes, s)
    assert value(s, "sluice_recorder_records_total") >= n_ok
    assert value(s, "sluice_recorder_batches_total") == value(
        s, "sluice_recorder_batch_duration_seconds_count") > 0
    assert value(s, "sluice_recorder_db_errors_total") == 0
    assert value(s, "sluice_build_info", process="sluice-recorder") == 1
    wait_until(lambda: any(n == "sluice_oldest_undelivered_age_seconds"
                           for n, _, _ in parse(scrape(rbase))[1]), 30 * MULT, 0.5,
               "the oldest-undelivered gauge")
    rtypes, _ = parse(scrape(rbase))

    # sluice-api
    aport = free_port()
    key = w.api_key("publish", "read")  # before the start: loaded when it is ready
    api = w.api(metrics_listen=f"127.0.0.1:{aport}")
    abase = f"http://127.0.0.1:{aport}"
    assert api.get("/v1/endpoints")[0] == 401  # no key
    req = urllib.request.Request(api.base + "/v1/events", method="POST",
                                 data=json.dumps({"type": "order.created", "endpoint": ok,
                                                  "body": {"n": 1}}).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 202
    st, _, body = http_get(abase + "/readyz")
    assert st == 200 and json.loads(body)["ready"] is True
    text = scrape(abase)
    promtool_check(text)
    atypes, s = parse(text)
    check_histograms(atypes, s)
    assert value(s, "sluice_api_requests_total", route="endpoints.list", code="401") == 1
    assert value(s, "sluice_api_requests_total", route="events.publish", code="202") == 1
    assert value(s, "sluice_api_request_duration_seconds_count", route="events.publish") == 1
    assert value(s, "sluice_api_events_published_total") == 1
    assert value(s, "sluice_build_info", process="sluice-api") == 1

    # the contract: each process exports exactly the families docs/METRICS.md lists for it
    doc = documented_families()
    common = doc["Every process"]
    for name, fams in (("sluice-consumer", consumer_families), ("sluice-recorder", set(rtypes)),
                       ("sluice-api", set(atypes))):
        want = common | doc[name]
        assert fams == want, (f"{name}: exported but not in docs/METRICS.md: {sorted(fams - want)}; "
                              f"documented but not exported: {sorted(want - fams)}")

    # SIGTERM: the listener goes with the process, which exits 0
    assert cons.term() == 0
    assert rec.term() == 0


def test_bad_metrics_listen_fails_at_start(world):
    w = world
    env = dict(w.env)
    env["SLUICE_METRICS_LISTEN"] = "no-port-here"
    for binary in ("consumer/sluice-consumer", "recorder/sluice-recorder", "api/sluice-api"):
        r = subprocess.run([w.bin(binary)], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 78, (binary, r.returncode, r.stderr)
        assert 'invalid value for SLUICE_METRICS_LISTEN (env): "no-port-here": expected ' \
            'host:port' in r.stderr, r.stderr


def test_healthz_fails_while_a_delivery_loop_stalls(world):
    """A loop that stops turning fails /healthz (503 naming the loop) while /metrics still
    answers from the listener's own thread; once the loop turns again, /healthz is 200.
    The stall is the test build's fault point SL_FAULT=loop_stall (4 s at the first 2xx)."""
    w = world
    rcv = w.receiver()
    ep = w.add_endpoint(f"ok-{w.tag}", rcv.url("ok", f"ok-{w.tag}"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    c = w.consumer(metrics_listen=f"127.0.0.1:{port}", live_stall_ms=1000, _fault="loop_stall")

    def health():
        try:
            st, _, body = http_get(base + "/healthz", timeout=2)
            return st, json.loads(body)
        except OSError:
            return None, None
    wait_until(lambda: health()[0] == 200, 60 * MULT, 0.2, "the consumer's /healthz")
    assert w.produce([event(ep, 0, w.tag)]).returncode == 0
    st, body = wait_until(lambda: (lambda h: h if h[0] == 503 else None)(health()), 30 * MULT,
                          0.2, "/healthz failing during the stall")
    assert body == {"live": False, "stalled": "delivery loop 0"}, body
    assert http_get(base + "/metrics", timeout=2)[0] == 200  # the listener never waits on it
    wait_until(lambda: health() == (200, {"live": True}), 30 * MULT, 0.2,
               "/healthz recovering once the loop turns again")
    assert c.term() == 0


def test_an_open_breaker_leaves_the_gauge_when_its_cooldown_ends(world):
    """sluice_breaker_open_endpoints (SluiceBreakerOpen) counts breakers holding deliveries
    back: once the cooldown has ended and a probe's time has passed with nothing sent to the
    endpoint (no probe comes without traffic) the endpoint leaves it, at the loop's next 10-s
    tick, instead of alerting for ever."""
    w = world
    dead = w.add_endpoint(f"cd-{w.tag}", f"http://127.0.0.1:{closed_port()}/x",
                          "--breaker-threshold", "2", "--max-attempts", "1",
                          "--breaker-cooldown-ms", "4000", "--timeout-ms", "1000")
    rcv = w.receiver()
    ok = w.add_endpoint(f"busy-{w.tag}", rcv.url("ok", f"busy-{w.tag}"))
    port = free_port()
    # one per-endpoint slot: the open breaker takes it from the busier endpoint
    cons = w.consumer(metrics_listen=f"127.0.0.1:{port}", metrics_endpoint_top=1)
    base = f"http://127.0.0.1:{port}"
    assert w.produce([event(ok, i, w.tag) for i in range(20)]).returncode == 0
    assert w.produce([event(dead, i, w.tag) for i in range(3)]).returncode == 0

    def samples():
        try:
            return parse(http_get(base + "/metrics")[2])[1]
        except OSError:
            return None

    def gauge():
        s = samples()
        return value(s, "sluice_breaker_open_endpoints") if s else None
    wait_until(lambda: gauge() == 1, 60 * MULT, 0.2, "the breaker counted open")
    opened = time.monotonic()
    s = samples()
    assert has(s, "sluice_endpoint_breaker_open", 1, endpoint=dead)
    assert not any(lb.get("endpoint") == ok for n, lb, _ in s
                   if n == "sluice_endpoint_breaker_open"), "the busier endpoint kept the slot"
    wait_until(lambda: gauge() == 0, 90 * MULT, 0.5, "the breaker out of the gauge")
    # not before the cooldown (4 s) and the time a probe would take (the 1-s request
    # timeout, a margin, two 10-s sweeps) have passed
    assert time.monotonic() - opened >= 20
    assert cons.term() == 0
