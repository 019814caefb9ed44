"""scripts/stack.sh's optional Prometheus service, alone in a private stack dir on a free
port (Kafka, Redis and PostgreSQL are not started): it gets ready, `status` and `env` report
it, a target listed in $STACK_DIR/prometheus/targets/*.json is scraped (a tiny HTTP server on
loopback serving a static exposition; the series shows up in /api/v1/query with the target's
process label), the alert rules of ops/prometheus/sluice-alerts.yml are loaded, and `stop`
ends it within its bound. No shared service is touched."""

import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STACK = os.path.join(REPO, "scripts", "stack.sh")
RULES = ("SluiceDeadLettersRising", "SluiceOldestUndelivered", "SluiceSlowEndpoint",
         "SluiceBreakerOpen", "SluiceConsumerLag", "SluiceRecordsSetAside",
         "SluiceRedisStateLost", "SluiceProcessMissing", "SluiceProxyRefusing",
         "SluiceProxyUnreachable", "SluiceHistoryNotWritten")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack(env, *args, timeout=120):
    return subprocess.run(["bash", STACK, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


class Exposition(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def private(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_STACK_DIR=str(tmp_path / "stack"),
               SLUICE_STACK_PROMETHEUS_PORT=str(free_port()))
    yield env
    # whatever the test did: no Prometheus left behind
    pid_file = tmp_path / "stack" / "prometheus" / "prometheus.pid"
    stack(env, "stop", "prometheus", timeout=60)
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def test_prometheus_scrapes_file_targets(private, tmp_path):
    env, port = private, private["SLUICE_STACK_PROMETHEUS_PORT"]
    url = f"http://127.0.0.1:{port}"
    r = stack(env, "start", "prometheus")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"prometheus: ready on {url}" in r.stdout, r.stdout
    with urllib.request.urlopen(url + "/-/ready", timeout=5) as resp:
        assert resp.status == 200

    st = stack(env, "status")
    line = [x for x in st.stdout.splitlines() if x.startswith("prometheus")]
    assert line and "running" in line[0] and f"port {port}" in line[0], st.stdout
    ports = (tmp_path / "stack" / "ports.env").read_text().splitlines()
    assert f"prometheus={port}" in ports
    targets = tmp_path / "stack" / "prometheus" / "targets"
    exports = dict(x[len("export "):].split("=", 1) for x in stack(env, "env").stdout.splitlines())
    assert exports["SLUICE_STACK_PROMETHEUS_URL"] == url
    assert exports["SLUICE_STACK_PROMETHEUS_TARGETS"].strip("'") == str(targets)

    # the rule file is loaded
    groups = get_json(url + "/api/v1/rules")["data"]["groups"]
    assert sorted(r["name"] for g in groups for r in g["rules"]) == sorted(RULES)
    assert groups[0]["file"] == os.path.join(REPO, "ops", "prometheus", "sluice-alerts.yml")

    # a target file names a tiny exposition server; its series appear with the labels
    Exposition.body = (b'# TYPE sluice_build_info gauge\n'
                       b'sluice_build_info{process="sluice-consumer",version="test"} 1\n'
                       b'# TYPE sluice_attempts_total counter\n'
                       b'sluice_attempts_total 4242\n')
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exposition)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        target = f"127.0.0.1:{srv.server_address[1]}"
        tmp = targets / ".probe.json.tmp"
        tmp.write_text(json.dumps([{"targets": [target], "labels": {"process": "sluice-consumer"}}]))
        os.rename(tmp, targets / "probe.json")
        q = url + "/api/v1/query?query=sluice_attempts_total"
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            result = get_json(q)["data"]["result"]
            if result:
                break
            time.sleep(0.5)
        assert result, "the target's series did not appear within 60 s"
        assert result[0]["metric"] == {"__name__": "sluice_attempts_total", "instance": target,
                                       "job": "sluice", "process": "sluice-consumer"}
        assert result[0]["value"][1] == "4242"
        # the exposition's own process label is kept as it is (honor_labels), not renamed
        info = get_json(url + "/api/v1/query?query=sluice_build_info")["data"]["result"]
        assert [x["metric"].get("process") for x in info] == ["sluice-consumer"]
        assert "exported_process" not in info[0]["metric"]
        active = get_json(url + "/api/v1/targets")["data"]["activeTargets"]
        assert [(t["labels"]["instance"], t["scrapeInterval"]) for t in active] == [(target, "1s")]
    finally:
        srv.shutdown()
        srv.server_close()

    # a second start reloads the configuration of the running Prometheus
    pid = int((tmp_path / "stack" / "prometheus" / "prometheus.pid").read_text())
    r = stack(env, "start", "prometheus")
    assert r.returncode == 0 and "reloaded" in r.stdout, r.stdout + r.stderr
    assert int((tmp_path / "stack" / "prometheus" / "prometheus.pid").read_text()) == pid

    t0 = time.monotonic()
    r = stack(env, "stop", "prometheus")
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - t0 < 40
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][0] in "ZX"
    st = stack(env, "status")
    assert any(x.startswith("prometheus") and " off " in x for x in st.stdout.splitlines()), \
        st.stdout
    assert "PROMETHEUS" not in stack(env, "env").stdout


def test_prometheus_port_in_use_is_named(private):
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(private["SLUICE_STACK_PROMETHEUS_PORT"])))
        s.listen()
        r = stack(private, "start", "prometheus")
    assert r.returncode == 1
    assert f"port {private['SLUICE_STACK_PROMETHEUS_PORT']} on 127.0.0.1 is already in use" \
        in r.stderr, r.stderr


def test_usage_errors():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    for args in (("start", "grafana"), ("stop", "--prometheus")):
        r = stack(env, *args)
        assert r.returncode == 2 and "usage:" in r.stderr, (args, r.stderr)
