"""Turns bench.py's results into the committed files: <stem>.json, <stem>.txt (the printed
table, the machine, the command), <stem>-throughput.png and <stem>-latency-cdf.png (gnuplot).
Also usable on its own to redraw a committed JSON:  python3 bench/report.py results.json
"""

import json
import os
import shutil
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


def verdict(ok):
    return "MET" if ok else "MISSED"


def table(r):
    ph = r["phases"]
    m = r["machine"]
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
    eps = ph.get("endpoints", {})
    if "rate_median_1s" in eps:
        rate = run_rate(eps)
        x = f", x{rate / one:.2f} of 100 endpoints" if one else ""
        add(f"10,000 endpoints: 1 consumer of 1 loop, {eps['deliveries']:,} deliveries",
            fmt(rate, " deliv/s") + x, rate)
    elif "endpoints" in ph:
        add("10,000 endpoints", "FAILED: " + ph["endpoints"].get("failed", "?"))
    rec = ph.get("recorder", {})
    if rec:
        if rec.get("available") and rec.get("outcomes_per_s"):
            add(f"recorder: bench/recorder.sh, {rec['records']:,} outcomes into PostgreSQL",
                fmt(rec["outcomes_per_s"], " outcomes/s"), rec["outcomes_per_s"])
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
        add(f"latency at {lat['rate']:,}/s{win} ({label}) P50/P95/P99",
            f"{e['p50']:.0f} / {e['p95']:.0f} / {e['p99']:.0f} ms"
            f" (publish->ack P99 {run['pace']['ack_ms']['p99']:.0f} ms)")
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
        raw = api["raw_healthz"].get("requests_per_s")
        add(f"sluice-api raw: wrk -t2 -c{api['connections']} GET /healthz (the same server)",
            fmt(raw, " req/s"), raw)
        for key, label in (("publish_one", "1 explicit endpoint"),
                           ("publish_fanout10", "fan-out to 10 endpoints")):
            run = api.get(key, {})
            acc = run.get("accepted_per_s")
            extra = f", {api.get('fanout10_records_per_s', 0):,.0f} records/s" \
                if key == "publish_fanout10" and acc else ""
            add(f"sluice-api: POST /v1/events, {api['body_bytes']} B, {label}, Kafka-acked 202s",
                fmt(acc, " events/s") + extra + f" (non-2xx {run.get('non_2xx')})", acc)
            if key == "publish_one" and acc:
                add(f"  ratio accepted/raw", f"{api.get('ratio_one')}", None)
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
    # widths
    w0 = max(len(x[0]) for x in rows) if rows else 10
    w1 = max(len(x[1]) for x in rows) if rows else 10
    out = [f"Sluice benchmark {r['date']} ({r['mode']} run, {r.get('duration_s', '?')} s)", ""]
    out.append(f"{'figure'.ljust(w0)}  {'value'.ljust(w1)}  ratio to raw HTTP")
    out.append(f"{'-' * w0}  {'-' * w1}  -----------------")
    for a, b, c in rows:
        out.append(f"{a.ljust(w0)}  {b.ljust(w1)}  {c}")
    out.append("")
    out += targets(r)
    out.append("")
    out.append(f"machine:  {m['nproc']} x {m['model_name']}, {m['mem_total_gib']} GiB, kernel "
               f"{m['kernel']}, load average at start {' '.join(str(x) for x in m['loadavg_start'])}"
               f", at end {' '.join(str(x) for x in r.get('loadavg_end', []))}")
    out.append(f"          {m['note']}; {m['broker']}; git {m['git']}; {m['build']}")
    out.append(f"          libraries {json.dumps(m['libraries'])}; {m['wrk']}")
    busy = e2e.get("machine_busy_fraction")
    if busy is not None:
        out.append(f"          machine CPU busy during the e2e drain: {busy * 100:.0f}% of both cores, "
                   f"{e2e.get('others_cores', 0):.2f} cores of it used by other people's processes")
    out.append(f"reproduce: {r['command']}")
    return "\n".join(out) + "\n"


def targets(r):
    ph = r["phases"]
    t = r["targets"]
    out = ["targets:"]
    e2e = ph.get("e2e", {})
    rate = e2e.get("rate_median_1s")
    if rate is not None:
        out.append(f"  >= {t['e2e_rate']:,} deliveries/s end to end: {verdict(rate >= t['e2e_rate'])}"
                   f" ({rate:,.0f}/s)")
    lat = ph.get("latency", {}).get("runs", {})
    for prof, run in lat.items():
        if "e2e_ms" in run:
            p99 = run["e2e_ms"]["p99"]
            linger = (run.get("pace") or {}).get("linger_ms")
            if prof.startswith("lib") and linger is not None and linger >= t["p99_ms"]:
                out.append(f"  P99 at half rate ({prof}, linger_ms {linger}): {p99:.0f} ms, not "
                           f"judged: the producer's linger alone takes up to {linger} ms")
                continue
            out.append(f"  P99 < {t['p99_ms']} ms at half rate ({prof}): "
                       f"{verdict(p99 < t['p99_ms'])} ({p99:.0f} ms at {ph['latency']['rate']:,}/s)")
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
              "set title 'Deliveries per second (outcome timestamps), " + r["date"] + "'",
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
            label = f"paced at {lat['rate']:,}/s, {prof_label(prof, run)}"
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
              + r["date"] + "'",
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
    stem = f"{day}-{r['machine']['host']}" + ("-quick" if quick else "")
    made = plots(r, outdir, stem, work)
    r["plots"] = [os.path.basename(p) for p in made if p.endswith(".png")]
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
