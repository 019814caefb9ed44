"""The monitoring files of ops/ against the code and the metrics contract:

* ops/prometheus/sluice-alerts.yml is exactly `sluicectl alert-rules` with the defaults of
  common/sl_thresholds.h, which `alerts`, `slow` and `alert-rules` print in their --help;
* the Grafana dashboard is well formed (title, uid, schemaVersion, panels with gridPos and
  targets, every query on the provisioned data source) and shows what an operator needs;
* every metric name in every PromQL expression of the dashboard and of the rules is one
  docs/METRICS.md lists (histograms through _bucket/_sum/_count);
* compose.yaml stays valid YAML and provisions Prometheus and Grafana from these files.

promtool checks and unit-tests the rules themselves (tests/ops/CMakeLists.txt)."""

import difflib
import json
import os
import re
import subprocess

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OPS = os.path.join(REPO, "ops")
RULES = os.path.join(OPS, "prometheus", "sluice-alerts.yml")
DASHBOARDS = os.path.join(OPS, "grafana", "dashboards")
DATASOURCES = os.path.join(OPS, "grafana", "provisioning", "datasources")


def ctl(*args):
    exe = os.path.join(os.environ["SL_BINARY_DIR"], "ctl", "sluicectl")
    # no SLUICE_* variable may change what alert-rules prints
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=30)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ==== the rule file and the thresholds ====

def test_rule_file_is_the_output_of_alert_rules():
    r = ctl("alert-rules")
    assert r.returncode == 0, r.stderr
    committed = read(RULES)
    if r.stdout != committed:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), r.stdout.splitlines(True),
                                            "ops/prometheus/sluice-alerts.yml",
                                            "sluicectl alert-rules"))
        pytest.fail("ops/prometheus/sluice-alerts.yml differs from `sluicectl alert-rules`; "
                    "regenerate it with build/ctl/sluicectl alert-rules > "
                    "ops/prometheus/sluice-alerts.yml\n" + diff)


def header_defaults():
    """The SL_THR_* macros of common/sl_thresholds.h: name -> value text."""
    text = read(os.path.join(REPO, "common", "sl_thresholds.h"))
    found = dict(re.findall(r"^#define (SL_THR_[A-Z_]+)\s+(\S+)", text, re.M))
    assert len(found) >= 10, found
    return found


def dur(secs):
    """ctl_ops_duration_format."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs % n == 0:
            return f"{secs // n}{unit}"
    return f"{secs}s"


def test_help_shows_the_header_defaults():
    d = header_defaults()
    factor = d["SL_THR_DEAD_RISE_FACTOR"].rstrip("0").rstrip(".")
    history = [("--dead-rise-factor", factor), ("--dead-rise-min", d["SL_THR_DEAD_RISE_MIN"]),
               ("--oldest-max", dur(int(d["SL_THR_OLDEST_MAX_S"]))),
               ("--slow-threshold-ms", d["SL_THR_SLOW_THRESHOLD_MS"]),
               ("--slow-min-samples", d["SL_THR_SLOW_MIN_SAMPLES"]),
               ("--slow-window", dur(int(d["SL_THR_SLOW_WINDOW_S"])))]
    metrics = [("--breaker-open-for", dur(int(d["SL_THR_BREAKER_OPEN_FOR_S"]))),
               ("--consumer-lag-max", d["SL_THR_CONSUMER_LAG_MAX"]),
               ("--consumer-lag-for", dur(int(d["SL_THR_CONSUMER_LAG_FOR_S"]))),
               ("--deliveries-topic", d["SL_THR_DELIVERIES_TOPIC"].strip('"'))]

    def defaults_in(help_text):
        """flag -> the default its help paragraph names."""
        out, flag = {}, None
        for line in help_text.splitlines():
            m = re.match(r"\s+(--[a-z-]+)", line)
            if m:
                flag = m.group(1)
            m = re.search(r"\(default\s+(\S+?)[,)]", line)
            if m and flag:
                out[flag] = m.group(1)
        return out

    r = ctl("alert-rules", "--help")
    assert r.returncode == 0
    assert defaults_in(r.stdout) == dict(history + metrics), r.stdout
    r = ctl("alerts", "--help")
    assert r.returncode == 0
    assert {k: v for k, v in defaults_in(r.stdout).items()} == dict(history), r.stdout
    # the committed file names the flags it was generated with
    line = " ".join(x.lstrip("# ").rstrip(" \\") for x in read(RULES).splitlines()[3:7])
    assert line == "sluicectl alert-rules " + " ".join(f"{k} {v}" for k, v in history + metrics)


def test_alert_rules_flags_change_the_rules():
    r = ctl("alert-rules", "--dead-rise-factor", "1.5", "--dead-rise-min", "12",
            "--oldest-max", "2h", "--slow-threshold-ms", "750", "--slow-min-samples", "40",
            "--slow-window", "6h", "--breaker-open-for", "90s", "--consumer-lag-max", "250",
            "--consumer-lag-for", "3m", "--deliveries-topic", "acme.deliveries")
    assert r.returncode == 0, r.stderr
    rules = {x["alert"]: x for g in yaml.safe_load(r.stdout)["groups"] for x in g["rules"]}
    assert ">= 12" in rules["SluiceDeadLettersRising"]["expr"]
    assert "> 1.5 * (" in rules["SluiceDeadLettersRising"]["expr"]
    assert rules["SluiceOldestUndelivered"]["expr"].endswith("> 7200")
    slow = rules["SluiceSlowEndpoint"]["expr"]
    assert "[6h]" in slow and "> 0.75" in slow and ">= 40" in slow and "[1d]" not in slow
    assert rules["SluiceBreakerOpen"]["for"] == "90s"
    lag = rules["SluiceConsumerLag"]
    assert 'topic="acme.deliveries"' in lag["expr"] and lag["expr"].endswith("> 250")
    assert lag["for"] == "3m"


@pytest.mark.parametrize("args", [
    ("--dead-rise-factor", "1e3"), ("--dead-rise-factor", "-1"), ("--dead-rise-min", "0"),
    ("--oldest-max", "30"), ("--slow-window", "367d"), ("--breaker-open-for", "0s"),
    ("--consumer-lag-max", "-5"), ("--deliveries-topic", 'a"b'), ("--deliveries-topic", ""),
    ("--json",), ("extra",),
])
def test_alert_rules_usage_errors(args):
    r = ctl("alert-rules", *args)
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.startswith("sluicectl alert-rules")


# ==== PromQL metric names against docs/METRICS.md ====

def documented_metrics():
    """name -> type, from the tables of docs/METRICS.md."""
    found = {}
    for line in read(os.path.join(REPO, "docs", "METRICS.md")).splitlines():
        m = re.match(r"\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(counter|gauge|histogram|summary)"
                     r"\s*\|", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


FUNCTIONS = set("""
abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min count_over_time
day_of_month day_of_week day_of_year days_in_month delta deriv exp floor histogram_count
histogram_fraction histogram_quantile histogram_sum holt_winters hour idelta increase irate
label_join label_replace last_over_time ln log10 log2 max_over_time min_over_time minute month
predict_linear present_over_time quantile_over_time rate resets round scalar sgn sort sort_desc
sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector year
sum min max avg group stddev stdvar count count_values bottomk topk quantile
""".split())
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "offset", "bool", "inf", "nan"}


def promql_names(expr):
    """(metric names, unknown functions) of one PromQL expression (Grafana variables allowed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)                                  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                                 # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", e)
    e = re.sub(r"\boffset\s+-?\w+", " ", e)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", " ", e)                          # Grafana variables
    e = re.sub(r"(?<![\w:.])\d+(\.\d+)?([eE][+-]?\d+)?", " ", e)     # numbers
    names, unknown_funcs = set(), set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tok = m.group(0)
        if tok in FUNCTIONS or tok.lower() in KEYWORDS:
            continue
        if e[m.end():].lstrip().startswith("("):
            unknown_funcs.add(tok)
        else:
            names.add(tok)
    return names, unknown_funcs


def check_names(names, documented):
    """The names documented_metrics() does not allow, each with the reason."""
    bad = {}
    for n in names:
        kind = documented.get(n)
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        if kind == "histogram":
            bad[n] = "a histogram: query its _bucket, _sum or _count series"
        elif kind is None and not (base != n and documented.get(base) == "histogram"):
            bad[n] = "not in docs/METRICS.md"
    return bad


def test_process_labels_are_the_processes_own():
    """Every process="..." the rules, the scrape configurations and the demo's targets name is
    a value the binaries export themselves (sluice_build_info's label, which honor_labels
    keeps): a rule matching another spelling would never see the series (SluiceProcessMissing
    firing for ever)."""
    exported = set()
    for d in ("consumer", "recorder", "api"):
        for f in os.listdir(os.path.join(REPO, d)):
            if f.endswith(".c"):
                exported |= set(re.findall(r'sl_metrics_set_process\("([^"]+)"\)',
                                           read(os.path.join(REPO, d, f))))
    assert exported == {"sluice-consumer", "sluice-recorder", "sluice-api"}, exported
    named = set()
    for f in (os.path.join(OPS, "prometheus", "sluice-alerts.yml"),
              os.path.join(OPS, "prometheus", "sluice-alerts.test.yml")):
        named |= set(re.findall(r'process="([^"]+)"', read(f)))
    for f in (os.path.join(OPS, "prometheus", "prometheus.yml"),
              os.path.join(OPS, "k8s", "prometheus-scrape.yml")):
        named |= set(re.findall(r"replacement: (\S+)", read(f)))
    named |= set(re.findall(r'"process": "([^"]+)"', read(os.path.join(REPO, "scripts",
                                                                          "demo.sh"))))
    assert named and named <= exported, named - exported


def test_the_name_extractor():
    names, funcs = promql_names(
        'histogram_quantile(0.95, sum by (endpoint, le) (rate(a_seconds_bucket{endpoint=~"$ep",'
        ' le!="1e3"}[$__rate_interval]))) > 2 and on (endpoint) b_total offset 1h or vector(1e3)'
        ' unless max_over_time(c:rec[5m:1m]) * 2.5e-3 + frob(d_total)')
    assert names == {"a_seconds_bucket", "b_total", "c:rec", "d_total"}
    assert funcs == {"frob"}
    doc = {"a_seconds": "histogram", "b_total": "counter", "c:rec": "gauge"}
    assert check_names({"a_seconds_bucket", "a_seconds_count", "b_total"}, doc) == {}
    assert set(check_names({"a_seconds", "b_total_bucket", "d_total"}, doc)) == \
        {"a_seconds", "b_total_bucket", "d_total"}


def dashboard_exprs(dash):
    """(where, PromQL) of every target and query variable of a dashboard."""
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f'panel "{p["title"]}" {t.get("refId")}', t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and q:
            m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
            out.append((f'variable "{v["name"]}"', m.group(1) if m else q))
    return out


def dashboards():
    files = sorted(f for f in os.listdir(DASHBOARDS) if f.endswith(".json"))
    assert files, "no dashboard in ops/grafana/dashboards"
    return [(f, json.loads(read(os.path.join(DASHBOARDS, f)))) for f in files]


def test_every_metric_name_is_documented():
    documented = documented_metrics()
    assert len(documented) >= 40 and documented.get("sluice_deliveries_total") == "counter", \
        "could not read the tables of docs/METRICS.md"
    exprs = [(f"{f} {where}", e) for f, d in dashboards() for where, e in dashboard_exprs(d)]
    rules = yaml.safe_load(read(RULES))
    exprs += [(f'sluice-alerts.yml {r["alert"]}', r["expr"])
              for g in rules["groups"] for r in g["rules"]]
    problems = []
    for where, e in exprs:
        names, funcs = promql_names(e)
        if not names:
            problems.append(f"{where}: no metric in {e!r}")
        for n, why in sorted(check_names(names, documented).items()):
            problems.append(f"{where}: {n}: {why}")
        for fn in sorted(funcs):
            problems.append(f"{where}: unknown PromQL function {fn}")
    assert not problems, "unknown metric names:\n  " + "\n  ".join(problems)


# ==== the dashboard ====

def provisioned_datasource_uids():
    uids = set()
    for f in os.listdir(DATASOURCES):
        if f.endswith((".yml", ".yaml")):
            doc = yaml.safe_load(read(os.path.join(DATASOURCES, f)))
            uids |= {d["uid"] for d in doc["datasources"]}
    return uids


def test_dashboard_is_well_formed():
    uids = provisioned_datasource_uids()
    assert uids == {"sluice-prometheus"}
    seen_uids = set()
    for f, d in dashboards():
        assert d["title"] and isinstance(d["title"], str), f
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"]) and d["uid"] not in seen_uids, f
        seen_uids.add(d["uid"])
        assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, f
        assert d["panels"], f
        ids, cells = set(), {}
        for p in d["panels"]:
            where = f'{f}: panel {p.get("id")} "{p.get("title")}"'
            assert isinstance(p.get("id"), int) and p["id"] not in ids, where
            ids.add(p["id"])
            assert p.get("type") and p.get("title"), where
            g = p.get("gridPos")
            assert g and all(isinstance(g.get(k), int) for k in "xywh"), where
            assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24 and g["h"] >= 1, where
            for x in range(g["x"], g["x"] + g["w"]):  # no two panels on one grid cell
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{where} overlaps {cells.get((x, y))}"
                    cells[(x, y)] = p["title"]
            if p["type"] == "row":
                assert not p.get("targets"), where
                continue
            assert p.get("datasource", {}).get("uid") in uids, where
            assert p.get("targets"), where
            for t in p["targets"]:
                assert t.get("expr", "").strip(), where
                assert t.get("datasource", {}).get("uid") in uids, where
                assert t.get("refId"), where
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") == "query":
                assert v.get("datasource", {}).get("uid") in uids, v.get("name")


def test_dashboard_shows_what_an_operator_needs():
    _, d = dashboards()[0]
    names = set()
    for _, e in dashboard_exprs(d):
        names |= promql_names(e)[0]
    wanted = {
        "sluice_deliveries_total", "sluice_attempts_total",
        "sluice_publish_to_delivered_seconds_bucket", "sluice_http_phase_seconds_bucket",
        "sluice_delivery_wait_seconds_bucket",
        "sluice_breaker_open_endpoints", "sluice_breaker_transitions_total",
        "sluice_retries_scheduled_total", "sluice_dead_letters_total",
        "sluice_duplicates_suppressed_total", "sluice_inflight_requests", "sluice_queued_jobs",
        "sluice_kafka_consumer_lag_records", "sluice_outcome_queue_messages",
        "sluice_redis_errors_total", "sluice_recorder_rows_total",
        "sluice_recorder_batch_duration_seconds_bucket", "sluice_recorder_lag_records",
        "sluice_oldest_undelivered_age_seconds", "sluice_api_requests_total",
        "sluice_api_request_duration_seconds_bucket", "sluice_endpoint_deliveries_total",
        "sluice_endpoint_request_duration_seconds_bucket", "sluice_endpoint_breaker_open"}
    assert not wanted - names, sorted(wanted - names)
    var = [v for v in d["templating"]["list"] if v["name"] == "endpoint"]
    assert var and var[0]["multi"] and var[0]["includeAll"]
    per_endpoint = [t["expr"] for p in d["panels"] for t in p.get("targets", [])
                    if "sluice_endpoint_" in t["expr"]]
    assert per_endpoint and all('endpoint=~"$endpoint"' in e for e in per_endpoint), per_endpoint


# ==== compose.yaml ====

def test_compose_provisions_prometheus_and_grafana():
    compose = yaml.safe_load(read(os.path.join(REPO, "compose.yaml")))
    svc = compose["services"]
    for name, image in (("prometheus", "prom/prometheus:"), ("grafana", "grafana/grafana:")):
        img = svc[name]["image"]
        assert img.startswith(image) and not img.endswith((":latest", ":")), img
        for vol in svc[name]["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert os.path.exists(os.path.join(REPO, src)), f"{name}: {src} does not exist"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./ops/prometheus/prometheus.yml"
    assert mounts["/etc/prometheus/sluice-alerts.yml"] == "./ops/prometheus/sluice-alerts.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in svc["prometheus"]["command"]
    gmounts = {v.split(":")[1]: v.split(":")[0] for v in svc["grafana"]["volumes"]}
    assert gmounts["/etc/grafana/provisioning/datasources"] == \
        "./ops/grafana/provisioning/datasources"
    assert gmounts["/etc/grafana/provisioning/dashboards"] == "./ops/grafana/provisioning/dashboards"
    provider = yaml.safe_load(read(os.path.join(OPS, "grafana", "provisioning", "dashboards",
                                                "sluice.yml")))["providers"][0]
    assert gmounts[provider["options"]["path"]] == "./ops/grafana/dashboards"
    ds = yaml.safe_load(read(os.path.join(DATASOURCES, "sluice.yml")))["datasources"][0]
    assert ds["url"] == "http://prometheus:9090"

    # prometheus.yml scrapes each sluice service where its metrics listener is
    prom = yaml.safe_load(read(os.path.join(OPS, "prometheus", "prometheus.yml")))
    assert prom["rule_files"] == ["sluice-alerts.yml"]
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    # the processes' own names, as sluice_build_info's process label (kept by honor_labels)
    for service, process in (("sluice-consumer", "sluice-consumer"),
                             ("sluice-recorder", "sluice-recorder"), ("sluice-api", "sluice-api")):
        listen = svc[service]["environment"]["SLUICE_METRICS_LISTEN"]
        sd = jobs[service]["dns_sd_configs"][0]
        assert sd["names"] == [service] and listen == f"0.0.0.0:{sd['port']}", (service, listen)
        relabel = jobs[service]["relabel_configs"]
        assert {"target_label": "process", "replacement": process} in relabel, service


def test_compose_applies_migrations_before_the_sluice_services():
    """PostgreSQL gets sql/ through scripts/migrate.sh (schema_migrations rows, later migrations
    on a later `up`), not docker-entrypoint-initdb.d; every service with a DSN waits for it."""
    svc = yaml.safe_load(read(os.path.join(REPO, "compose.yaml")))["services"]
    assert not any("docker-entrypoint-initdb.d" in v for v in svc["postgres"]["volumes"])
    mig = svc["postgres-migrate"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in mig["volumes"]}
    assert mig["image"] == svc["postgres"]["image"]  # its psql matches the server
    assert mig["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    script = mig["entrypoint"][-1]
    assert mig["entrypoint"][0] == "bash" and mounts[script] == "./scripts/migrate.sh"
    # migrate.sh finds sql/ beside its own directory unless SLUICE_SQL_DIR says otherwise
    assert "SLUICE_SQL_DIR" not in mig.get("environment", {})
    assert mounts[os.path.normpath(os.path.join(os.path.dirname(script), "..", "sql"))] == "./sql"
    with_db = [n for n, s in svc.items() if "SLUICE_PG_DSN" in s.get("environment", {})]
    assert sorted(with_db) == ["sluice-api", "sluice-consumer", "sluice-recorder"], with_db
    for name in with_db:
        assert svc[name]["environment"]["SLUICE_PG_DSN"] == mig["command"][0], name
        assert svc[name]["depends_on"]["postgres-migrate"] == \
            {"condition": "service_completed_successfully"}, name
