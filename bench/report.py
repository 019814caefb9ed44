"""Turns bench.py's results into the committed files: <stem>.json, <stem>.txt (the printed
table, the machine, the command), <stem>-throughput.png and <stem>-latency-cdf.png (gnuplot).
Also usable on its own to redraw a committed JSON:  python3 bench/report.py results.json

With --repeat N (results["repetitions"]: one {"phases": ...} per repetition; "phases" is
repetition 1) the table is the median and min..max of each headline figure over the
repetitions, the targets are judged on the medians, and each repetition's own table follows.
results["summary"] (written for every run, N = 1 included) holds those figures by key.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys


def fmt(v, unit="", digits=0):
    if v is None:
        return "n/a"
    if isinstance(v, (int, float)):
        s = f"{v:,.{digits}f}"
        return f"{s}{unit}"
    return str(v)


def ratio(v, base):
    if not v or not base:
        return ""
    return f"{v / base:.2f}"


def mb(kb):
    return None if kb is None else kb / 1024


TLS_KINDS = (("http", "plain HTTP, kept-alive connections"),
             ("https", "HTTPS, kept-alive connections"),
             ("http_new_conn", "plain HTTP, a new connection per delivery"),
             ("https_new_conn", "HTTPS, a new connection and full handshake per delivery"),
             ("https_resumed", "HTTPS, a new connection per delivery, session resumed"))


def us(cpu_s_per_10k):
    """CPU seconds per 10,000 deliveries as µs per delivery."""
    return None if cpu_s_per_10k is None else cpu_s_per_10k * 100


def run_rate(run):
    """Deliveries/s of a drain: the after-production window when there is one (scaling and
    10,000-endpoint runs), else the median of the per-second counts."""
    w = (run.get("window") or {}).get("aggregate_rate")
    return w if w else run.get("rate_median_1s")


def prof_label(prof, run):
    """How a latency run published: the producer library (with its linger) or the latency
    profile of common/sl_kafka. Older result files have no linger_ms in pace."""
    linger = (run.get("pace") or {}).get("linger_ms")
    if prof.startswith("lib"):
        return f"producer library, linger_ms={linger if linger is not None else 50}"
    return f"SL_KAFKA_LATENCY producer, linger.ms={linger if linger is not None else 2}"


def run_rate_of(lat, run):
    """The paced rate of one latency run (older result files: every run at the phase's rate)."""
    return run.get("rate") or lat.get("rate", 0)


def share_of(lat, run):
    """'half' or 'a quarter' of the drain's rate, as the run was paced."""
    return "a quarter" if run_rate_of(lat, run) < lat.get("rate", 0) else "half"


def verdict(ok):
    return "MET" if ok else "MISSED"


def table(r):
    if r.get("repetitions"):
        return summary_table(r)
    ph = r["phases"]
    rows = phase_rows(r, ph)
    out = [f"Sluice benchmark {r['date']} ({r['mode']} run of {', '.join(r.get('phases') or {})}; "
           f"{r.get('duration_s', '?')} s)", ""]
    out += rows_text(rows)
    out.append("")
    out += targets(r)
    out.append("")
    out += footer(r)
    return "\n".join(out) + "\n"


def rows_text(rows, head=("figure", "value", "ratio to raw HTTP")):
    w0 = max(len(x[0]) for x in rows) if rows else 10
    w1 = max(len(x[1]) for x in rows) if rows else 10
    out = [f"{head[0].ljust(w0)}  {head[1].ljust(w1)}  {head[2]}",
           f"{'-' * w0}  {'-' * w1}  {'-' * len(head[2])}"]
    for a, b, c in rows:
        out.append(f"{a.ljust(w0)}  {b.ljust(w1)}  {c}")
    return out


def footer(r, others=None):
    """The machine, how busy it was, the command. others: (median, min, max) cores of other
    people's work during the e2e drains of a repeated run."""
    m = r["machine"]
    e2e = r["phases"].get("e2e", {})
    out = [f"machine:  {m['nproc']} x {m['model_name']}, {m['mem_total_gib']} GiB, kernel "
           f"{m['kernel']}, load average at start {' '.join(str(x) for x in m['loadavg_start'])}"
           f", at end {' '.join(str(x) for x in r.get('loadavg_end', []))}",
           f"          {m['note']}; {m['broker']}; git {m['git']}; {m['build']}",
           f"          libraries {json.dumps(m['libraries'])}; {m['wrk']}"]
    busy = e2e.get("machine_busy_fraction")
    if others is not None:
        out.append(f"          other people's processes during the e2e drains: median "
                   f"{others[0]:.2f} cores ({others[1]:.2f}..{others[2]:.2f})")
    elif busy is not None:
        out.append(f"          machine CPU busy during the e2e drain: {busy * 100:.0f}% of both cores, "
                   f"{e2e.get('others_cores', 0):.2f} cores of it used by other people's processes")
    out.append(f"reproduce: {r['command']}")
    return out


def phase_rows(r, ph):
    """The table's rows for one run's (or one repetition's) phases."""
    rows = []   # (figure, value, ratio to raw HTTP)
    wrk = ph.get("wrk", {})
    base = wrk.get("requests_per_s")

    def add(name, value, rate=None):
        rows.append((name, value, ratio(rate, base) if rate is not None else ""))

    if "requests_per_s" in wrk:
        add(f"raw HTTP: wrk -t{wrk['threads']} -c{wrk['connections']} POST /ok, receiver "
            f"{wrk['receiver_threads']} threads", fmt(base, " req/s"), base)
        if wrk.get("wrk_cpu_s_per_10k") is not None:
            add("  CPU s per 10,000 requests in that run",
                f"wrk client {wrk['wrk_cpu_s_per_10k']:.2f}, receiver "
                f"{fmt(wrk.get('receiver_cpu_s_per_10k'), '', 2)}")
    elif "wrk" in ph:
        add("raw HTTP (wrk)", "FAILED: " + ph["wrk"].get("failed", "?"))
    for n, cr in sorted((wrk.get("libcurl") or {}).items(), key=lambda kv: int(kv[0])):
        if cr.get("rate"):
            cpu = (cr.get("cpu_user_s_per_10k") or 0) + (cr.get("cpu_sys_s_per_10k") or 0)
            add(f"libcurl ceiling: sl-bench http, {int(n):,} in flight (libcurl only: no Kafka, "
                f"Redis or signing)", fmt(cr["rate"], " req/s"), cr["rate"])
            add("  CPU s per 10,000 requests in that run",
                f"libcurl client {cpu:.2f}, receiver "
                f"{fmt(cr.get('receiver_cpu_s_per_10k'), '', 2)}")
        else:
            add(f"libcurl ceiling, {int(n):,} in flight", "FAILED: " + str(cr.get("failed", "?")))
    pr = ph.get("produce", {})
    if "records_per_s" in pr:
        add(f"producer: bench/produce.sh, {pr['records']:,} x {pr['body_bytes']} B",
            fmt(pr["records_per_s"], " rec/s"), pr["records_per_s"])
    elif "produce" in ph:
        add("producer", "FAILED: " + ph["produce"].get("failed", "?"))
    e2e = ph.get("e2e", {})
    if "rate_median_1s" in e2e:
        loops = e2e.get("consumer_config", {}).get("SLUICE_CONSUMER_THREADS", 1)
        add(f"end to end: 1 consumer ({loops} loop{'s' if int(loops) != 1 else ''}) drains "
            f"{e2e['deliveries']:,} (100 endpoints), median of 1-s",
            fmt(e2e["rate_median_1s"], " deliv/s"), e2e["rate_median_1s"])
        add("end to end: same run, mean first..last outcome", fmt(e2e["rate_mean"], " deliv/s"),
            e2e["rate_mean"])
    elif "e2e" in ph:
        add("end to end", "FAILED: " + ph["e2e"].get("failed", "?"))
    sc = ph.get("scaling", {})
    one = None
    for c, run in sorted(sc.get("runs", {}).items(), key=lambda kv: int(kv[0])):
        if "failed" in run:
            add(f"scaling: {c} consumer(s)", "FAILED: " + run["failed"])
            continue
        rate = run_rate(run)
        if c == "1":
            one = rate
        per = ""
        if c != "1" and run.get("window", {}).get("pods"):
            per = " (" + " + ".join(fmt(p["rate"]) for p in run["window"]["pods"].values()) + ")"
        x = f", x{rate / one:.2f} of 1" if one and c != "1" else ""
        add(f"scaling: {c} consumer(s) of {sc.get('loops_per_process', 1)} loop, 8 partitions, "
            f"{sc['deliveries']:,} deliveries",
            fmt(rate, " deliv/s") + per + x, rate)
        # box or design: how busy the machine was, and what a delivery cost the consumers
        # (their CPU over the deliveries: growing with the processes means contention)
        busy = run.get("machine_busy_fraction")
        cons = (run.get("cpu_s_per_10k") or {}).get("consumers_total")
        if busy is not None or cons is not None:
            bits = []
            if busy is not None:
                bits.append(f"machine {busy * 100:.0f}% busy"
                            + (f" ({run['others_cores']:.2f} cores other people's)"
                               if run.get("others_cores") is not None else ""))
            if cons is not None:
                bits.append(f"consumers' CPU {cons * 100:.0f} us per delivery")
            add("  CPU in that run", ", ".join(bits))
    rc = ph.get("rcluster", {})
    if rc.get("available") is False:
        add("Redis Cluster", "not run: " + rc.get("reason", "?"))
    elif "failed" in rc:
        add("Redis Cluster", "FAILED: " + rc["failed"])
    for c, run in sorted(rc.get("runs", {}).items(), key=lambda kv: int(kv[0])):
        if "failed" in run:
            add(f"Redis Cluster: {c} consumer(s)", "FAILED: " + run["failed"])
            continue
        rate = run_rate(run)
        single = (sc.get("runs") or {}).get(c) or {}
        srate = run_rate(single) if "failed" not in single else None
        x = f", x{rate / srate:.2f} of one Redis" if srate else ""
        add(f"Redis Cluster (3+3 nodes): {c} consumer(s) of 1 loop, "
            f"{rc['deliveries']:,} deliveries", fmt(rate, " deliv/s") + x, rate)
        cpu, scpu = run.get("cpu_s_per_10k") or {}, single.get("cpu_s_per_10k") or {}
        bits = []
        if cpu.get("redis_total") is not None:
            bits.append(f"Redis {cpu['redis_total'] * 100:.0f} us per delivery (6 nodes)"
                        + (f" vs {scpu['redis_total'] * 100:.0f} (one Redis)"
                           if scpu.get("redis_total") is not None else ""))
        if cpu.get("consumers_total") is not None:
            bits.append(f"consumers {cpu['consumers_total'] * 100:.0f} us"
                        + (f" vs {scpu['consumers_total'] * 100:.0f}"
                           if scpu.get("consumers_total") is not None else ""))
        if run.get("machine_busy_fraction") is not None:
            bits.append(f"machine {run['machine_busy_fraction'] * 100:.0f}% busy")
        if bits:
            add("  CPU in that run", ", ".join(bits))
    eps = ph.get("endpoints", {})
    if "rate_median_1s" in eps:
        rate = run_rate(eps)
        x = f", x{rate / one:.2f} of 100 endpoints" if one else ""
        add(f"10,000 endpoints: 1 consumer of 1 loop, {eps['deliveries']:,} deliveries",
            fmt(rate, " deliv/s") + x, rate)
    elif "endpoints" in ph:
        add("10,000 endpoints", "FAILED: " + ph["endpoints"].get("failed", "?"))
    tls = ph.get("tls", {})
    plain = run_rate((tls.get("runs") or {}).get("http") or {})
    for kind, label in TLS_KINDS:
        run = (tls.get("runs") or {}).get(kind) or {}
        if run.get("rate_median_1s"):
            rate = run_rate(run)
            cpu = run.get("cpu_s_per_10k") or {}
            x = f", x{rate / plain:.2f} of plain HTTP" if plain and kind != "http" else ""
            add(f"tls: {label}, 1 consumer ({run.get('consumer_config', {}).get('SLUICE_CONSUMER_THREADS', 1)} "
                f"loops), {run['deliveries']:,}", fmt(rate, " deliv/s") + x, rate)
            add("  CPU per delivery; connections opened", f"consumer "
                f"{fmt(us(cpu.get('consumers_total')))} µs, receiver {fmt(us(cpu.get('receiver')))} "
                f"µs; {fmt(run.get('receiver_connections'))} connections"
                + (f", {fmt(run['receiver_tls_resumed'])} requests over resumed sessions"
                   if run.get("receiver_tls_resumed") else ""))
    if tls.get("failed"):
        add("tls", "FAILED: " + tls["failed"])
    rec = ph.get("recorder", {})
    if rec:
        if rec.get("available") and rec.get("outcomes_per_s"):
            add(f"recorder: bench/recorder.sh, {rec['records']:,} outcomes into PostgreSQL",
                fmt(rec["outcomes_per_s"], " outcomes/s"), rec["outcomes_per_s"])
            first = (rec.get("first_run_on_new_server") or {}).get("outcomes_per_s")
            if first:
                add("  first run on the new server (creates its WAL files; not judged)",
                    fmt(first, " outcomes/s"), first)
        elif rec.get("available") and rec.get("exit"):
            add("recorder", f"FAILED: bench/recorder.sh exited {rec['exit']}")
        else:
            add("recorder", "not available: " + rec.get("reason", rec.get("failed", "?")))
    lat = ph.get("latency", {})
    for prof, run in lat.get("runs", {}).items():
        if "e2e_ms" not in run:
            continue
        e = run["e2e_ms"]
        label = prof_label(prof, run)
        win = f", {lat['max_inflight']:,} in flight" if lat.get("max_inflight") else ""
        add(f"latency at {run_rate_of(lat, run):,}/s{win} ({label}) P50/P95/P99",
            f"{e['p50']:.0f} / {e['p95']:.0f} / {e['p99']:.0f} ms"
            f" (publish->ack P99 {run['pace']['ack_ms']['p99']:.0f} ms)")
        st = run.get("stages_ms")
        if st and all("p99" in st.get(k, {}) for k in ("kafka", "queue", "http")):
            add("  where it waited P50 / P99 (the consumer's histograms)",
                ", ".join(f"{k} {st[k]['p50']:.1f} / {st[k]['p99']:.1f}"
                          for k in ("kafka", "queue", "http")) + " ms")
    if len(lat.get("loop_shares", [])) > 1:
        add("latency phase: deliveries per delivery loop (its partitions' endpoints)",
            " / ".join(f"{v * 100:.0f}%" for v in lat["loop_shares"]))
    if "latency" in ph and "failed" in ph["latency"]:
        add("latency", "FAILED: " + ph["latency"]["failed"])
    if "e2e_ms" in e2e:
        e = e2e["e2e_ms"]
        add("drain latency (queueing behind the backlog) P50/P99",
            f"{e['p50'] / 1000:.1f} / {e['p99'] / 1000:.1f} s")
        h = e2e["http_ms"]
        add("HTTP request time in the consumer during the drain P50/P99",
            f"{h['p50']:.1f} / {h['p99']:.1f} ms")
    if "cpu_s_per_10k" in e2e:
        c = e2e["cpu_s_per_10k"]
        cons = c.get("consumers_total")
        parts = [("consumer", cons), ("receiver", c.get("receiver")), ("broker", c.get("broker")),
                 ("redis", c.get("redis"))]
        total = sum(v for _, v in parts if v)
        add("CPU s per 10,000 deliveries (e2e run)",
            ", ".join(f"{k} {fmt(v, '', 2)}" for k, v in parts) + f"; sum {total:.2f}")
        if total:
            add("  => whole-stack CPU per delivery; max rate if 2 cores were ours",
                f"{total * 100:.0f} us; {2 / (total / 10000):,.0f} deliv/s")
        rss = e2e["peak_rss_kb"]
        cname = [k for k in rss if k.startswith("e2e-c")]
        add(f"peak RSS (e2e run, consumer in flight up to {e2e.get('consumer_peak_inflight')})",
            f"consumer {fmt(mb(rss.get(cname[0]) if cname else None), ' MB')}, receiver "
            f"{fmt(mb(rss.get('receiver')), ' MB')}, broker JVM "
            f"{fmt(mb(rss.get('broker_sampled')), ' MB')}")
    rp = ph.get("rss", {})
    if "consumer_hwm_kb" in rp:
        add(f"consumer peak RSS holding {rp['consumer_config']['SLUICE_MAX_INFLIGHT']:,} in flight "
            f"(endpoints answer after {rp['delay_ms'] / 1000:.0f} s)",
            f"{mb(rp['consumer_hwm_kb']):.0f} MB (reached {rp['consumer_peak_inflight']:,} in "
            f"flight, {rp['consumer_peak_in_memory']:,} jobs in memory)")
    elif "rss" in ph:
        add("consumer peak RSS holding 10,000 in flight", "FAILED: " + ph["rss"].get("failed", "?"))
    api = ph.get("api", {})
    if "raw_healthz" in api:
        raw = api.get("raw_healthz_mean_per_s") or api["raw_healthz"].get("requests_per_s")
        after = (api.get("raw_healthz_after") or {}).get("requests_per_s")
        both = (f" (mean of {fmt(api['raw_healthz'].get('requests_per_s'), '')} before the "
                f"publishes and {fmt(after, '')} after)") if after else ""
        add(f"sluice-api raw: wrk -t2 -c{api['connections']} GET /healthz (the same server)",
            fmt(raw, " req/s") + both, raw)
        warm = api.get("warmup") or {}
        if warm:
            slices = ", ".join("-" if v is None else f"{v}" for v in warm["broker_cpu_us_per_publish"])
            add(f"sluice-api warm-up: broker CPU us per publish by {warm['slice_s']}-s slice",
                f"{slices} ({warm['seconds']} s, {'settled' if warm['settled'] else 'NOT settled'})")
        for key, label in (("publish_one", "1 explicit endpoint"),
                           ("publish_fanout10", "fan-out to 10 endpoints")):
            run = api.get(key, {})
            acc = run.get("accepted_per_s")
            extra = f", {api.get('fanout10_records_per_s', 0):,.0f} records/s" \
                if key == "publish_fanout10" and acc else ""
            add(f"sluice-api: POST /v1/events, {api['body_bytes']} B, {label}, Kafka-acked 202s",
                fmt(acc, " events/s") + extra + f" (non-2xx {run.get('non_2xx')})", acc)
            if key == "publish_one" and acc:
                add("  ratio accepted/raw", f"{api.get('ratio_one')}", None)
        lat = api.get("latency_at_half") or {}
        if lat:
            q = lat.get("latency", {})
            add(f"sluice-api request latency at ~{lat.get('target_rate', 0):,.0f}/s (half) P50/P90/P99",
                f"{q.get('50')} / {q.get('90')} / {q.get('99')} ({lat.get('requests_per_s')} req/s "
                f"reached)")
        lk = api.get("fanout_lookup") or {}
        if lk:
            add(f"fan-out lookup: {lk['endpoints']:,} endpoints, {lk['matched']:,} match",
                f"{lk['lookup_us_mean']:.1f} us per event (index build {lk['build_ms']:.0f} ms)")
    elif "api" in ph:
        add("sluice-api", "FAILED: " + ph["api"].get("failed", "?"))
    sc = ph.get("scrape", {})
    if "ratio" in sc:
        add(f"e2e rate, /metrics scraped every 1 s vs not ({sc['order']}, "
            f"{sc['deliveries']:,} each)",
            f"{sc['rate_scrape']:,.0f} vs {sc['rate_none']:,.0f}/s: ratio {sc['ratio']} "
            f"(target >= {r['targets'].get('scrape_ratio')}); consumer CPU "
            f"{sc['cpu_s_per_10k_scrape']} vs {sc['cpu_s_per_10k_none']} s per 10k "
            f"(ratio {sc.get('cpu_ratio')}); "
            f"{sc['scrapes']} scrapes, median {sc.get('scrape_ms_median')} ms, "
            f"{sc.get('scrape_bytes_median')} B")
    elif "scrape" in ph:
        add("scrape cost", "FAILED: " + ph["scrape"].get("failed", "?"))
    peers_rows(ph.get("peers"), add)
    return rows


def peers_rows(pe, add):
    """The peers phase's rows (through add): Convoy, Svix and Sluice under the same HTTP
    workload (bench/peers.py)."""
    if pe is None:
        return
    if "failed" in pe:
        add("peers", "FAILED: " + pe["failed"])
    if pe.get("skipped"):
        add("peers", pe["skipped"].replace("peers: ", ""))
    apis = {"convoy": "its POST /api/v1/projects/{id}/events",
            "svix": "its POST /api/v1/app/{app_id}/msg/", "sluice": "sluice-api"}
    for name, label, procs in (
            ("convoy", "Convoy", ("server", "agent", "postgres", "redis")),
            ("svix", "Svix", ("server", "postgres", "redis")),
            ("sluice", "Sluice", ("api", "consumer", "broker", "redis", "recorder",
                                  "postgres"))):
        run = pe.get(name)
        if not run or run.get("run") is False:   # not run (Svix in files from before its runner)
            continue
        if "failed" in run:
            add(f"peers: {label}", "FAILED: " + run["failed"])
            continue
        api = apis[name]
        ver = ""
        v = run.get("version") or {}
        if v.get("build_info"):
            ver = " " + v["build_info"][0].split()[-1][:9]
        if v.get("reports"):
            ver += f" ({v['reports'].replace('Convoy version ', '')})"
        add(f"peers: {label}{ver}, {run['accepted']:,} events via {api}, "
            f"{pe['connections']} conns",
            f"{run['deliveries_per_s']:,.1f} deliv/s (median of 1-s {fmt(run.get('rate_median_1s'))}"
            f"; published at {run['publisher']['accepted_per_s']:,.0f}/s)",
            run["deliveries_per_s"])
        c = run.get("cpu_ms_per_delivery") or {}
        add(f"  {label} whole-stack CPU per delivery",
            f"{run['stack_cpu_ms_per_delivery']:.3f} ms ("
            + ", ".join(f"{k} {c[k]:.3f}" for k in procs if k in c) + ")"
            + (f"; delivery path without recorder and PostgreSQL "
               f"{run['delivery_path_cpu_ms_per_delivery']:.3f} ms"
               if run.get("delivery_path_cpu_ms_per_delivery") else ""))
        add(f"  {label} run", f"{run['window_s']:.1f} s, of which publishing {run['publish_s']:.1f} s;"
            f" receiver {fmt(run.get('receiver_cpu_ms_per_delivery'), '', 3)} ms, publisher "
            f"{fmt(run.get('publisher_cpu_ms_per_event'), '', 3)} ms CPU per event; "
            f"{run.get('others_cores', 0):.2f} cores of other people's work; "
            f"{run['publisher']['throttled']} throttled, {run.get('extra_2xx', 0)} extra 2xx")
    for pre, label in (("", "Convoy"), ("svix_", "Svix")):
        if pe.get(pre + "rate_ratio"):
            add(f"peers: Sluice / {label}", f"x{pe[pre + 'rate_ratio']} the deliveries/s at "
                f"1/{pe.get(pre + 'cpu_ratio')} of the CPU per delivery")
    sv = pe.get("svix")
    if sv and sv.get("run") is False:   # files from before the Svix runner
        add("peers: Svix", sv.get("reason", "not run").replace("Svix not run", "not run"))


def targets(r):
    ph = r["phases"]
    t = r["targets"]
    out = ["targets:"]
    e2e = ph.get("e2e", {})
    rate = e2e.get("rate_median_1s")
    if rate is not None:
        out.append(f"  >= {t['e2e_rate']:,} deliveries/s end to end: {verdict(rate >= t['e2e_rate'])}"
                   f" ({rate:,.0f}/s)")
    raw = ph.get("wrk", {}).get("requests_per_s")
    out += cpu_targets(t, (e2e.get("cpu_s_per_10k") or {}), rate / raw if rate and raw else None)
    lat = ph.get("latency", {}).get("runs", {})
    for prof, run in lat.items():
        if "e2e_ms" in run:
            p99 = run["e2e_ms"]["p99"]
            linger = (run.get("pace") or {}).get("linger_ms")
            at = share_of(ph["latency"], run)
            if prof.startswith("lib") and linger is not None and linger >= t["p99_ms"]:
                out.append(f"  P99 at {at} rate ({prof}, linger_ms {linger}): {p99:.0f} ms, not "
                           f"judged: the producer's linger alone takes up to {linger} ms")
                continue
            out.append(f"  P99 < {t['p99_ms']} ms at {at} rate ({prof}): "
                       f"{verdict(p99 < t['p99_ms'])} ({p99:.0f} ms at "
                       f"{run_rate_of(ph['latency'], run):,}/s)")
    rp = ph.get("rss", {})
    rss = e2e.get("peak_rss_kb", {})
    cname = [k for k in rss if k.startswith("e2e-c")]
    if "consumer_hwm_kb" in rp:
        v = rp["consumer_hwm_kb"] / 1024
        infl = rp["consumer_peak_inflight"]
        want = rp["consumer_config"]["SLUICE_MAX_INFLIGHT"]
        ok = v < t["rss_mb"] and infl >= want
        out.append(f"  consumer RSS < {t['rss_mb']} MB with {want:,} in flight (rss phase, reached "
                   f"{infl:,}): {verdict(ok)} ({v:.0f} MB)")
    elif cname and rss.get(cname[0]):
        v = rss[cname[0]] / 1024
        out.append(f"  consumer RSS < {t['rss_mb']} MB with {r['settings']['consumer_max_inflight']:,}"
                   f" max in flight (reached {e2e.get('consumer_peak_inflight'):,}): "
                   f"{verdict(v < t['rss_mb'])} ({v:.0f} MB)")
    api = ph.get("api", {})
    if api.get("ratio_one") is not None:
        out.append(f"  sluice-api accepted events/s >= {t.get('api_ratio', 0.5)} of its raw rate: "
                   f"{verdict(api['ratio_one'] >= t.get('api_ratio', 0.5))} ({api['ratio_one']})")
    if api.get("p99_ms_at_half") is not None:
        out.append(f"  sluice-api P99 < {t.get('api_p99_ms', 20)} ms at half the accepted rate: "
                   f"{verdict(api['p99_ms_at_half'] < t.get('api_p99_ms', 20))} "
                   f"({api['p99_ms_at_half']:.1f} ms)")
    sc = ph.get("scaling", {}).get("runs", {})
    if "1" in sc and "2" in sc and "rate_median_1s" in sc["1"] and "rate_median_1s" in sc["2"]:
        one, two = run_rate(sc["1"]), run_rate(sc["2"])
        busy = sc["2"].get("machine_busy_fraction")
        others = sc["2"].get("others_cores")
        out.append(f"  near-linear 1 -> 2 consumers: x{two / one:.2f}"
                   + (f" (machine CPU {busy * 100:.0f}% busy during the 2-consumer run, "
                      f"{others:.2f} cores of it other people's work)" if busy is not None else ""))
    out += extra_targets(r, {
        "produce.records_per_s": ph.get("produce", {}).get("records_per_s"),
        "recorder.outcomes_per_s": ph.get("recorder", {}).get("outcomes_per_s"),
        "scrape.ratio": ph.get("scrape", {}).get("ratio")}, None)
    return out


def extra_targets(r, v, rng):
    """The targets of the produce, recorder and scrape phases; v: key -> figure (a run's, or
    the medians), rng: key -> (min, max) over the repetitions, or None."""
    t = r["targets"]
    out = []

    def span(k, fmt_):
        return f", {fmt_(rng[k][0])}..{fmt_(rng[k][1])}" if rng and k in rng else ""
    x = v.get("produce.records_per_s")
    if x is not None and t.get("produce_rate"):
        out.append(f"  producer >= {t['produce_rate']:,} records/s: "
                   f"{verdict(x >= t['produce_rate'])} ({x:,.0f}/s"
                   f"{span('produce.records_per_s', lambda y: f'{y:,.0f}')})")
    x = v.get("recorder.outcomes_per_s")
    if x is not None and t.get("recorder_rate"):
        out.append(f"  recorder >= {t['recorder_rate']:,} outcomes/s: "
                   f"{verdict(x >= t['recorder_rate'])} ({x:,.0f}/s"
                   f"{span('recorder.outcomes_per_s', lambda y: f'{y:,.0f}')})")
    x = v.get("scrape.ratio")
    if x is not None and t.get("scrape_ratio"):
        out.append(f"  e2e rate scraped / not scraped >= {t['scrape_ratio']}: "
                   f"{verdict(x >= t['scrape_ratio'])} ({x:.3f}"
                   f"{span('scrape.ratio', lambda y: f'{y:.3f}')})")
    return out


# ---------------------------------------------------------------------------- repetitions
#
# The headline figures of one repetition, by key: every throughput as a ratio to the raw rate
# wrk measured in the same repetition (the absolute rates the targets are stated in are kept
# too, not printed in the table), latency percentiles in ms, CPU in s per 10,000 deliveries
# or requests, memory in MB. A key is (phase.figure); the same keys name results["summary"].

def figures(ph):
    """[(key, label, unit, digits, value, shown in the table, label in the JSON)] of one
    repetition's phases; an indented label belongs to the row above (ctx names it)."""
    out = []

    def add(key, label, unit, digits, v, show=True, ctx=""):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            full = f"{ctx}: {label.strip()}" if ctx else label.strip()
            out.append((key, label, unit, digits, float(v), show, full))

    wrk = ph.get("wrk") or {}
    base = wrk.get("requests_per_s")

    def rat(v):
        return v / base if v and base else None
    if base:
        add("wrk.requests_per_s", f"raw HTTP: wrk -t{wrk.get('threads')} -c{wrk.get('connections')} "
            "POST /ok (each repetition's 1.00)", "req/s", 0, base)
        add("wrk.wrk_cpu_s_per_10k", "  CPU s per 10,000 requests: wrk client", "s", 2,
            wrk.get("wrk_cpu_s_per_10k"), ctx="raw HTTP (wrk)")
        add("wrk.receiver_cpu_s_per_10k", "  CPU s per 10,000 requests: receiver", "s", 2,
            wrk.get("receiver_cpu_s_per_10k"), ctx="raw HTTP (wrk)")
    for n, cr in sorted((wrk.get("libcurl") or {}).items(), key=lambda kv: int(kv[0])):
        add(f"wrk.libcurl{n}.ratio", f"libcurl ceiling, {int(n):,} in flight / raw HTTP", "ratio",
            2, rat(cr.get("rate")))
        if cr.get("rate"):
            add(f"wrk.libcurl{n}.client_cpu_s_per_10k",
                "  CPU s per 10,000 requests: libcurl client", "s", 2,
                (cr.get("cpu_user_s_per_10k") or 0) + (cr.get("cpu_sys_s_per_10k") or 0),
                ctx=f"libcurl ceiling, {int(n):,} in flight")
    pr = ph.get("produce") or {}
    if pr.get("records_per_s"):
        add("produce.ratio", f"producer: bench/produce.sh, {pr.get('records', 0):,} records / raw HTTP",
            "ratio", 2, rat(pr["records_per_s"]))
        add("produce.records_per_s", "producer records/s", "rec/s", 0, pr["records_per_s"], False)
        add("produce.producer_cpu_s_per_10k", "  CPU s per 10,000 records: producer", "s", 3,
            pr.get("producer_cpu_s_per_10k"), ctx="producer")
        add("produce.broker_cpu_s_per_10k", "  CPU s per 10,000 records: broker", "s", 3,
            pr.get("broker_cpu_s_per_10k"), ctx="producer")
    e2e = ph.get("e2e") or {}
    if e2e.get("rate_median_1s"):
        loops = e2e.get("consumer_config", {}).get("SLUICE_CONSUMER_THREADS", 1)
        what = (f"end to end: 1 consumer ({loops} loop{'s' if int(loops) != 1 else ''}) drains "
                f"{e2e.get('deliveries', 0):,}")
        add("e2e.ratio", what + ", median of 1-s / raw HTTP", "ratio", 2, rat(e2e["rate_median_1s"]))
        add("e2e.rate_mean_ratio", "  same drain, mean first..last outcome / raw HTTP", "ratio", 2,
            rat(e2e.get("rate_mean")), ctx="end to end")
        add("e2e.rate_median_1s", "end to end deliveries/s", "deliv/s", 0, e2e["rate_median_1s"],
            False)
        c = e2e.get("cpu_s_per_10k") or {}
        parts = [("consumer", c.get("consumers_total")), ("receiver", c.get("receiver")),
                 ("broker", c.get("broker")), ("redis", c.get("redis"))]
        for k, v in parts:
            add(f"e2e.cpu_s_per_10k.{k}", f"  CPU s per 10,000 deliveries (e2e): {k}", "s", 2, v)
        if all(v is not None for _, v in parts):
            add("e2e.cpu_s_per_10k.sum", "  CPU s per 10,000 deliveries (e2e): whole stack", "s",
                2, sum(v for _, v in parts))
        rss = e2e.get("peak_rss_kb") or {}
        cname = [k for k in rss if k.startswith("e2e-c")]
        if cname and rss.get(cname[0]):
            add("e2e.consumer_peak_rss_mb", "  consumer peak RSS in the e2e drain", "MB", 0,
                rss[cname[0]] / 1024)
        add("e2e.consumer_peak_inflight", "  consumer peak in flight in the e2e drain", "", 0,
            e2e.get("consumer_peak_inflight"), False)
        add("e2e.others_cores", "  other people's processes during the e2e drain", "cores", 2,
            e2e.get("others_cores"))
    rp = ph.get("rss") or {}
    if rp.get("consumer_hwm_kb"):
        want = (rp.get("consumer_config") or {}).get("SLUICE_MAX_INFLIGHT", 10000)
        add("rss.consumer_hwm_mb", f"consumer peak RSS holding {want:,} in flight (rss)", "MB", 0,
            rp["consumer_hwm_kb"] / 1024)
        add("rss.consumer_peak_inflight", "  peak in flight it reached", "", 0,
            rp.get("consumer_peak_inflight"), ctx="rss phase")
    lat = ph.get("latency") or {}
    for prof, run in (lat.get("runs") or {}).items():
        e = run.get("e2e_ms")
        if not e:
            continue
        label = f"latency at {run_rate_of(lat, run):,}/s ({prof_label(prof, run)})"
        for q in ("p50", "p95", "p99"):
            add(f"latency.{prof}.{q}", f"{label}: P50" if q == "p50" else f"  {q.upper()}",
                "ms", 0, e.get(q), ctx="" if q == "p50" else label)
        add(f"latency.{prof}.ack_p99", "  publish->ack P99", "ms", 0,
            ((run.get("pace") or {}).get("ack_ms") or {}).get("p99"), ctx=label)
    sc = ph.get("scaling") or {}
    one = None
    for c, run in sorted((sc.get("runs") or {}).items(), key=lambda kv: int(kv[0])):
        rate = run_rate(run) if "failed" not in run else None
        if not rate:
            continue
        if c == "1":
            one = rate
        add(f"scaling.{c}.ratio", f"scaling: {c} consumer(s) of 1 loop / raw HTTP", "ratio", 2,
            rat(rate))
        if c != "1" and one:
            add(f"scaling.{c}.x_of_1", "  x of 1 consumer", "", 2, rate / one,
                ctx=f"scaling: {c} consumers")
        add(f"scaling.{c}.machine_busy", f"  machine CPU busy during the {c}-consumer run", "",
            3, run.get("machine_busy_fraction"))
        cons = (run.get("cpu_s_per_10k") or {}).get("consumers_total")
        add(f"scaling.{c}.consumer_us", f"  consumers' CPU per delivery, {c} consumer(s)", "us",
            0, cons * 100 if cons is not None else None)
        if c == "2":
            add("scaling.2.others_cores", "other people's processes during the 2-consumer run",
                "cores", 2, run.get("others_cores"), False)
    rc = ph.get("rcluster") or {}
    for c, run in sorted((rc.get("runs") or {}).items(), key=lambda kv: int(kv[0])):
        rate = run_rate(run) if "failed" not in run else None
        if not rate:
            continue
        single = (sc.get("runs") or {}).get(c) or {}
        srate = run_rate(single) if "failed" not in single else None
        add(f"rcluster.{c}.ratio", f"Redis Cluster: {c} consumer(s) of 1 loop / raw HTTP",
            "ratio", 2, rat(rate))
        if srate:
            add(f"rcluster.{c}.x_of_single", "  x of one Redis (scaling phase, same consumers)",
                "", 2, rate / srate, ctx=f"Redis Cluster: {c} consumers")
        red = (run.get("cpu_s_per_10k") or {}).get("redis_total")
        add(f"rcluster.{c}.redis_us", "  Redis CPU per delivery, 6 nodes", "us", 0,
            red * 100 if red is not None else None, ctx=f"Redis Cluster: {c} consumers")
        sred = (single.get("cpu_s_per_10k") or {}).get("redis_total")
        add(f"rcluster.{c}.single_redis_us", "  Redis CPU per delivery, one Redis (scaling)",
            "us", 0, sred * 100 if sred is not None else None,
            ctx=f"Redis Cluster: {c} consumers")
    eps = ph.get("endpoints") or {}
    if eps.get("rate_median_1s"):
        rate = run_rate(eps)
        add("endpoints.ratio", "10,000 endpoints: 1 consumer of 1 loop / raw HTTP", "ratio", 2,
            rat(rate))
        if one:
            add("endpoints.x_of_100", "  x of 100 endpoints (1-consumer scaling run)", "", 2,
                rate / one, ctx="10,000 endpoints")
    tls = (ph.get("tls") or {}).get("runs") or {}
    plain = run_rate(tls.get("http") or {})
    for kind, label in TLS_KINDS:
        run = tls.get(kind) or {}
        if not run.get("rate_median_1s"):
            continue
        rate = run_rate(run)
        cpu = run.get("cpu_s_per_10k") or {}
        add(f"tls.{kind}.ratio", f"tls: {label} / raw HTTP", "ratio", 2, rat(rate))
        if kind != "http" and plain:
            add(f"tls.{kind}.x_of_http", "  x of plain HTTP, kept-alive (same phase)", "", 2,
                rate / plain, ctx=f"tls: {label}")
        add(f"tls.{kind}.consumer_us", "  consumer CPU per delivery", "us", 0,
            us(cpu.get("consumers_total")), ctx=f"tls: {label}")
        add(f"tls.{kind}.receiver_us", "  receiver CPU per delivery", "us", 0,
            us(cpu.get("receiver")), ctx=f"tls: {label}")
    rec = ph.get("recorder") or {}
    if rec.get("outcomes_per_s"):
        add("recorder.ratio", f"recorder: bench/recorder.sh, {rec.get('records', 0):,} outcomes "
            "/ raw HTTP", "ratio", 2, rat(rec["outcomes_per_s"]))
        add("recorder.outcomes_per_s", "recorder outcomes/s", "outcomes/s", 0,
            rec["outcomes_per_s"], False)
        first = (rec.get("first_run_on_new_server") or {}).get("outcomes_per_s")
        if first:
            add("recorder.first_run_ratio", "  first run on the new server (WAL files created; "
                "not judged) / raw HTTP", "ratio", 2, rat(first))
    api = ph.get("api") or {}
    raw = api.get("raw_healthz_mean_per_s") or (api.get("raw_healthz") or {}).get("requests_per_s")
    if raw:
        add("api.raw_ratio", "sluice-api raw: GET /healthz / raw HTTP (wrk POST /ok)", "ratio", 2,
            rat(raw))
        add("api.ratio_one", "sluice-api: POST /v1/events, 1 endpoint / its /healthz rate",
            "ratio", 3, api.get("ratio_one"))
        add("api.ratio_fanout10", "sluice-api: fan-out to 10 / its /healthz rate", "ratio", 3,
            api.get("ratio_fanout10"))
        add("api.p50_ms_at_half", "sluice-api request latency at half rate P50", "ms", 1,
            api.get("p50_ms_at_half"))
        add("api.p99_ms_at_half", "  P99", "ms", 1, api.get("p99_ms_at_half"),
            ctx="sluice-api request latency at half rate")
    scr = ph.get("scrape") or {}
    if scr.get("ratio") is not None:
        add("scrape.ratio", "e2e rate, /metrics scraped every 1 s / not scraped", "ratio", 3,
            scr["ratio"])
        add("scrape.rate_none_ratio", "  e2e rate not scraped (mean of 2 drains) / raw HTTP",
            "ratio", 2, rat(scr.get("rate_none")))
        add("scrape.rate_scrape_ratio", "  e2e rate scraped (mean of 2 drains) / raw HTTP",
            "ratio", 2, rat(scr.get("rate_scrape")))
        add("scrape.cpu_ratio", "  consumer CPU per delivery, scraped / not", "ratio", 3,
            scr.get("cpu_ratio"))
        add("scrape.cpu_s_per_10k_none", "  consumer CPU s per 10,000 deliveries, not scraped",
            "s", 2, scr.get("cpu_s_per_10k_none"))
        add("scrape.cpu_s_per_10k_scrape", "  consumer CPU s per 10,000 deliveries, scraped",
            "s", 2, scr.get("cpu_s_per_10k_scrape"))
    pe = ph.get("peers") or {}
    for name, label in (("convoy", "Convoy"), ("svix", "Svix"), ("sluice", "Sluice")):
        run = pe.get(name) or {}
        if run.get("deliveries_per_s"):
            add(f"peers.{name}.deliveries_per_s", f"peers: {label} deliveries/s (same run)",
                "deliv/s", 1, run["deliveries_per_s"])
            add(f"peers.{name}.cpu_ms_per_delivery", "  whole-stack CPU per delivery",
                "ms", 3, run.get("stack_cpu_ms_per_delivery"), ctx=f"peers: {label}")
    add("peers.rate_ratio", "peers: Sluice / Convoy deliveries/s", "ratio", 1,
        pe.get("rate_ratio"))
    add("peers.cpu_ratio", "peers: Convoy / Sluice CPU per delivery", "ratio", 1,
        pe.get("cpu_ratio"))
    add("peers.svix_rate_ratio", "peers: Sluice / Svix deliveries/s", "ratio", 1,
        pe.get("svix_rate_ratio"))
    add("peers.svix_cpu_ratio", "peers: Svix / Sluice CPU per delivery", "ratio", 1,
        pe.get("svix_cpu_ratio"))
    return out


def summarize(r):
    """results["summary"]: per headline figure, every repetition's value (None where the
    repetition has none), the median (of those present; with an even count, the mean of the
    middle two), min and max."""
    reps = [x["phases"] for x in r.get("repetitions") or []] or [r["phases"]]
    per = [{k: (unit, dg, v, show, full) for k, _lbl, unit, dg, v, show, full in figures(ph)}
           for ph in reps]
    keys = []
    for f in per:
        keys += [k for k in f if k not in keys]
    out = {}
    for k in keys:
        unit, dg, _v, show, full = next(f[k] for f in per if k in f)
        vals = [f[k][2] if k in f else None for f in per]
        got = [v for v in vals if v is not None]
        nd = dg + 2   # stored with two more digits than printed
        out[k] = {"label": full, "unit": unit, "digits": dg, "table": show,
                  "values": [None if v is None else round(v, nd) for v in vals],
                  "median": round(statistics.median(got), nd), "min": round(min(got), nd),
                  "max": round(max(got), nd)}
    return out


def summary_table(r):
    n = len(r["repetitions"])
    S = r.get("summary") or summarize(r)
    labels = {}   # the table's (indented) labels, from the first repetition that has the key
    for rep in r["repetitions"]:
        for k, lbl, *_ in figures(rep["phases"]):
            labels.setdefault(k, lbl)
    rows = []
    for k, e in S.items():
        if not e["table"]:
            continue
        f = (lambda v, d=e["digits"]: f"{v:,.{d}f}")
        unit = "" if e["unit"] in ("ratio", "") else " " + e["unit"]
        got = sum(v is not None for v in e["values"])
        rows.append((labels.get(k, e["label"]), f(e["median"]) + unit,
                     f"{f(e['min'])}..{f(e['max'])}" + (f" ({got} of {n})" if got < n else "")))
    out = [f"Sluice benchmark {r['date']} ({r['mode']} run of {', '.join(r.get('phases') or {})}; "
           f"{n} repetitions, {r.get('duration_s', '?')} s)", "",
           f"Medians over {n} repetitions (with an even count, the mean of the middle two).",
           "Throughput: a ratio to the raw HTTP rate wrk measured at the start of the same",
           "repetition (sluice-api's ratios: to its own GET /healthz rate, as its target);",
           "latency: ms; CPU: s per 10,000 deliveries or requests.", ""]
    out += rows_text(rows, ("figure", "median", "min..max"))
    out.append("")
    out += targets_median(r, S)
    out.append("")
    for rep in r["repetitions"]:
        out.append(f"repetition {rep['repetition']} of {n} (started {rep.get('started', '?')}, "
                   f"{rep.get('duration_s', '?')} s, load average at start "
                   f"{' '.join(str(x) for x in rep.get('loadavg_start', []))}):")
        out += ["  " + line for line in rows_text(phase_rows(r, rep["phases"]))]
        out.append("")
    oc = S.get("e2e.others_cores")
    out += footer(r, (oc["median"], oc["min"], oc["max"]) if oc else None)
    return "\n".join(out) + "\n"


def cpu_targets(t, cpu, e2e_ratio, rng=None):
    """Issue #20's per-delivery CPU and e2e ratio targets; cpu: the e2e drain's CPU s per
    10,000 deliveries by process (consumers_total, receiver, broker, redis); rng: key ->
    (min, max) for a repeated run."""
    out = []
    if "consumer_us" not in t:  # result files from before these targets
        return out

    def span(k, scale, d):
        if not rng or k not in rng:
            return ""
        return f", {rng[k][0] * scale:.{d}f}..{rng[k][1] * scale:.{d}f}"
    cons = cpu.get("consumers_total")
    if cons is not None:
        out.append(f"  consumer CPU per delivery <= {t['consumer_us']} us (e2e drain): "
                   f"{verdict(cons * 100 <= t['consumer_us'])} ({cons * 100:.0f} us"
                   f"{span('e2e.cpu_s_per_10k.consumer', 100, 0)})")
    parts = [cpu.get(k) for k in ("consumers_total", "receiver", "broker", "redis")]
    if cpu.get("sum") is not None or all(v is not None for v in parts):
        # a repeated run: the median of the repetitions' sums, as its table prints it (the
        # sum of the per-process medians may differ)
        tot = (cpu["sum"] if cpu.get("sum") is not None else sum(parts)) * 100
        out.append(f"  whole stack CPU per delivery <= {t['stack_us']} us (e2e drain): "
                   f"{verdict(tot <= t['stack_us'])} ({tot:.0f} us"
                   f"{span('e2e.cpu_s_per_10k.sum', 100, 0)})")
    if e2e_ratio is not None:
        out.append(f"  end to end >= {t['e2e_ratio']} of raw HTTP: "
                   f"{verdict(e2e_ratio >= t['e2e_ratio'])} ({e2e_ratio:.2f}"
                   f"{span('e2e.ratio', 1, 2)})")
    return out


def targets_median(r, S):
    """The targets of targets(), judged on the medians of a repeated run."""
    t = r["targets"]
    n = len(r["repetitions"])
    med = {k: e["median"] for k, e in S.items()}
    rng = {k: (e["min"], e["max"]) for k, e in S.items()}

    def sp(k, d=0):
        return f"{rng[k][0]:,.{d}f}..{rng[k][1]:,.{d}f}"

    def first(phase):  # the first repetition's phase that ran (for its settings)
        for rep in r["repetitions"]:
            if rep["phases"].get(phase) and "failed" not in rep["phases"][phase]:
                return rep["phases"][phase]
        return {}
    out = [f"targets (judged on the medians of the {n} repetitions; min..max after them):"]
    k = "e2e.rate_median_1s"
    if k in med:
        ratio_ = f"; ratio to raw HTTP {med['e2e.ratio']:.2f}" if "e2e.ratio" in med else ""
        out.append(f"  >= {t['e2e_rate']:,} deliveries/s end to end: "
                   f"{verdict(med[k] >= t['e2e_rate'])} ({med[k]:,.0f}/s, {sp(k)}{ratio_})")
    cpu = {"consumers_total": med.get("e2e.cpu_s_per_10k.consumer"),
           "receiver": med.get("e2e.cpu_s_per_10k.receiver"),
           "broker": med.get("e2e.cpu_s_per_10k.broker"),
           "redis": med.get("e2e.cpu_s_per_10k.redis"),
           "sum": med.get("e2e.cpu_s_per_10k.sum")}
    out += cpu_targets(t, cpu, med.get("e2e.ratio"), rng)
    lat = first("latency")
    for prof, run in (lat.get("runs") or {}).items():
        k = f"latency.{prof}.p99"
        if k not in med:
            continue
        p99 = med[k]
        linger = (run.get("pace") or {}).get("linger_ms")
        at = share_of(lat, run)
        if prof.startswith("lib") and linger is not None and linger >= t["p99_ms"]:
            out.append(f"  P99 at {at} rate ({prof}, linger_ms {linger}): {p99:.0f} ms ({sp(k)}), "
                       f"not judged: the producer's linger alone takes up to {linger} ms")
            continue
        out.append(f"  P99 < {t['p99_ms']} ms at {at} rate ({prof}): {verdict(p99 < t['p99_ms'])} "
                   f"({p99:.0f} ms, {sp(k)}, at {run_rate_of(lat, run):,}/s in every repetition)")
    k = "rss.consumer_hwm_mb"
    if k in med:
        want = (first("rss").get("consumer_config") or {}).get("SLUICE_MAX_INFLIGHT", 10000)
        infl = med.get("rss.consumer_peak_inflight", 0)
        ok = med[k] < t["rss_mb"] and infl >= want
        out.append(f"  consumer RSS < {t['rss_mb']} MB with {want:,} in flight (rss phase, reached "
                   f"{infl:,.0f}, {sp('rss.consumer_peak_inflight')}): {verdict(ok)} "
                   f"({med[k]:.0f} MB, {sp(k)})")
    elif "e2e.consumer_peak_rss_mb" in med:
        k = "e2e.consumer_peak_rss_mb"
        out.append(f"  consumer RSS < {t['rss_mb']} MB with {r['settings']['consumer_max_inflight']:,}"
                   f" max in flight (e2e drain): {verdict(med[k] < t['rss_mb'])} "
                   f"({med[k]:.0f} MB, {sp(k)})")
    k = "api.ratio_one"
    if k in med:
        out.append(f"  sluice-api accepted events/s >= {t.get('api_ratio', 0.5)} of its raw rate: "
                   f"{verdict(med[k] >= t.get('api_ratio', 0.5))} ({med[k]:.3f}, {sp(k, 3)})")
    k = "api.p99_ms_at_half"
    if k in med:
        out.append(f"  sluice-api P99 < {t.get('api_p99_ms', 20)} ms at half the accepted rate: "
                   f"{verdict(med[k] < t.get('api_p99_ms', 20))} ({med[k]:.1f} ms, {sp(k, 1)})")
    k = "scaling.2.x_of_1"
    if k in med:
        busy = med.get("scaling.2.machine_busy")
        others = med.get("scaling.2.others_cores")
        out.append(f"  near-linear 1 -> 2 consumers: x{med[k]:.2f} ({sp(k, 2)}"
                   + (f"; machine CPU {busy * 100:.0f}% busy during the 2-consumer runs, "
                      f"{others:.2f} cores of it other people's work" if busy is not None and
                      others is not None else "") + ")")
    out += extra_targets(r, med, rng)
    return out


# ---------------------------------------------------------------------------- plots

def terminal():
    try:
        t = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
        text = t.stdout + t.stderr
    except OSError:
        return None
    if "pngcairo" in text:
        return "pngcairo size 1000,600 font ',10'"
    if " png " in text or "\npng" in text or "png " in text:
        return "png size 1000,600"
    return None


def thin_cdf(src, dst, points=1500):
    rows = []
    with open(src) as f:
        for line in f:
            if not line.startswith("#"):
                a, b = line.split()
                rows.append((max(float(a), 0.5), float(b)))
    if len(rows) > points:
        step = len(rows) / points
        rows = [rows[int(i * step)] for i in range(points)] + [rows[-1]]
    with open(dst, "w") as f:
        for a, b in rows:
            f.write(f"{a} {b}\n")
    return len(rows)


def plots(r, outdir, stem, work):
    term = terminal()
    if not term or not shutil.which("gnuplot"):
        return ["gnuplot with a png terminal not available: no plots"]
    made = []
    ph = r["phases"]
    # a repeated run's plots are its first repetition's
    rep1 = f" (repetition 1 of {len(r['repetitions'])})" if r.get("repetitions") else ""
    # throughput over time
    series = []
    for label, run in [("e2e, 1 consumer, 100 endpoints", ph.get("e2e", {}))] + [
            (f"scaling, {c} consumer(s)", run) for c, run in
            sorted(ph.get("scaling", {}).get("runs", {}).items())] + [
            ("10,000 endpoints, 1 consumer", ph.get("endpoints", {}))]:
        rows = (run.get("series") or {}).get("rows")
        if not rows:
            continue
        nz = [i for i, row in enumerate(rows) if row[1] > 0]
        if not nz:
            continue
        path = os.path.join(work, f"plot-tp-{len(series)}.dat")
        with open(path, "w") as f:
            for row in rows[nz[0]:nz[-1] + 1]:
                f.write(f"{row[0] - rows[nz[0]][0]} {row[1]}\n")
        series.append((label, path))
    if series:
        png = os.path.join(outdir, f"{stem}-throughput.png")
        base = ph.get("wrk", {}).get("requests_per_s")
        gp = [f"set terminal {term}", "set termoption noenhanced", f"set output '{png}'",
              "set title 'Deliveries per second (outcome timestamps), " + r["date"] + rep1 + "'",
              "set xlabel 'seconds since the first delivery'", "set ylabel 'delivered / s'",
              "set grid", "set key outside bottom center horizontal", "set yrange [0:*]"]
        plot = [f"'{p}' using 1:2 with lines lw 2 title '{t}'" for t, p in series]
        if base:
            plot.append(f"{base} with lines dt 2 lc rgb 'gray' title 'raw HTTP (wrk)'")
        gp.append("plot " + ", ".join(plot))
        run_gp(gp, work, "throughput")
        made.append(png)
    # latency CDF
    cdfs = []
    lat = ph.get("latency", {})
    for prof, run in lat.get("runs", {}).items():
        src = run.get("cdf_file") or os.path.join(work, f"cdf-latency-{prof}.tsv")
        if os.path.exists(src):
            dst = os.path.join(work, f"plot-cdf-{prof}.dat")
            thin_cdf(src, dst)
            label = f"paced at {run_rate_of(lat, run):,}/s, {prof_label(prof, run)}"
            cdfs.append((label, dst))
    e2e = ph.get("e2e", {})
    src = e2e.get("cdf_file") or os.path.join(work, "cdf-e2e.tsv")
    if e2e and os.path.exists(src):
        dst = os.path.join(work, "plot-cdf-e2e.dat")
        thin_cdf(src, dst)
        cdfs.append(("draining a 1M backlog (queueing)", dst))
    if cdfs:
        png = os.path.join(outdir, f"{stem}-latency-cdf.png")
        gp = [f"set terminal {term}", "set termoption noenhanced", f"set output '{png}'",
              "set title 'Publish-to-delivered latency CDF (outcome ts_ms - created_ms), "
              + r["date"] + rep1 + "'",
              "set xlabel 'latency (ms, log scale)'", "set ylabel 'fraction delivered'",
              "set logscale x", "set grid", "set key bottom right", "set yrange [0:1]",
              f"set arrow from {r['targets']['p99_ms']},0 to {r['targets']['p99_ms']},1 nohead dt 2 lc rgb 'red'",
              "set label 'P99 target' at %d,0.05 tc rgb 'red'" % r["targets"]["p99_ms"]]
        gp.append("plot " + ", ".join(f"'{p}' using 1:2 with lines lw 2 title '{t}'"
                                      for t, p in cdfs))
        run_gp(gp, work, "cdf")
        made.append(png)
    return made


def run_gp(lines, work, tag):
    path = os.path.join(work, f"plot-{tag}.gp")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(["gnuplot", path], check=False, capture_output=True)


# ---------------------------------------------------------------------------- files

def strip(r):
    """A copy for the committed JSON: per-second series kept, bulky per-process CPU samples
    thinned, local file paths dropped."""
    def clean(o):
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()
                    if not k.endswith("_file")}
        if isinstance(o, list):
            return [clean(v) for v in o]
        return o
    return clean(r)


def write(r, outdir, work, quick=False):
    os.makedirs(outdir, exist_ok=True)
    day = r["date"][:10]
    base = f"{day}-{r['machine']['host']}" + ("-quick" if quick else "")
    stem, n = base, 1
    while os.path.exists(os.path.join(outdir, f"{stem}.json")):  # a run earlier that day
        n += 1
        stem = f"{base}-{n}"
    made = plots(r, outdir, stem, work)
    r["plots"] = [os.path.basename(p) for p in made if p.endswith(".png")]
    r["summary"] = summarize(r)
    txt = table(r)
    with open(os.path.join(outdir, f"{stem}.json"), "w") as f:
        json.dump(strip(r), f, indent=1)
        f.write("\n")
    with open(os.path.join(outdir, f"{stem}.txt"), "w") as f:
        f.write(txt)
        if r["plots"]:
            f.write("plots:    " + ", ".join(r["plots"]) + "\n")
    print(txt, end="")
    print(f"results:  {os.path.join(outdir, stem)}.json, .txt" +
          ("".join(f", {p}" for p in r["plots"])))


if __name__ == "__main__":
    # RESULTS.json: print the table again; with WORK_DIR (a run's kept work dir,
    # BENCH_KEEP_TMP=1), redraw its plots next to the JSON as well.
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python3 bench/report.py RESULTS.json [WORK_DIR]")
    with open(sys.argv[1]) as f:
        res = json.load(f)
    print(table(res), end="")
    if len(sys.argv) == 3:
        out = os.path.dirname(os.path.abspath(sys.argv[1]))
        stem = os.path.basename(sys.argv[1])[:-len(".json")]
        for p in plots(res, out, stem, sys.argv[2]):
            print(p)
