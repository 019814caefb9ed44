#!/usr/bin/env python3
"""The phases of bench/run.sh (run through it: it builds, starts the private stack and passes
the paths). Python 3 standard library only.

Phases, side by side in one run on this machine:
  wrk        raw HTTP rate of sluice-receiver /ok (POST, 512-byte body, Sluice's headers)
             with the connection count the consumer uses; then the libcurl ceiling against
             the same receiver (sl-bench http: libcurl alone, driven as the consumer drives
             it, with its 64 connection caches, at 100 and 1,000 in flight and at the e2e
             consumer's window, --inflight)
  produce    bench/produce.sh (sluice-produce --generate, 512-byte bodies)
  e2e        pre-produce N deliveries over 100 endpoints, one consumer drains them
  latency    a consumer fed at half the e2e rate by sl-bench pace (the producer library, and
             the latency profile of common/sl_kafka for comparison)
  recorder   bench/recorder.sh (sl-test-outcomes publishes outcome records, sluice-recorder
             writes them into PostgreSQL)
  scaling    1, 2 and 4 consumers against 8 partitions
  rcluster   the scaling phase again with Redis as a cluster (3 masters + 3 replicas on this
             machine, started by run.sh), beside the scaling phase's one Redis: what the
             slot routing costs per delivery, and that throughput holds on a cluster
  endpoints  10,000 distinct endpoints, one consumer (compared with the 1-consumer scaling run)
  tls        the same drain over plain HTTP, over HTTPS on kept-alive connections, and with a
             new connection for every delivery (the receiver answers Connection: close) over
             HTTP, over HTTPS (a full TLS handshake each) and over HTTPS with session tickets
             (resumed handshakes): what TLS costs per delivery
  api        sluice-api publishing over HTTP (wrk), against wrk's rate on its /healthz
  scrape     the e2e drain with /metrics scraped every second vs no metrics listener, runs
             interleaved none/scrape/scrape/none; the ratio of the scraped to the plain rate
  peers      opt-in (--only peers), not in CI: the same HTTP workload through the peers
             given (Convoy: a built binary in SLUICE_BENCH_CONVOY; Svix: SLUICE_BENCH_SVIX)
             and through sluice-api + consumer, deliveries/s and whole-stack CPU per delivery
             side by side (bench/peers.py)

Every process's CPU comes from /proc/<pid>/stat (utime+stime) and its peak RSS from VmHWM
(VmRSS samples for the long-lived broker). Nothing here asserts a timing: figures are
reported next to their targets.

--repeat N runs the selected phases N times in turn (repetition 1's phases, then
repetition 2's, ...), wrk first in each, so that every repetition's ratios divide by the raw
rate measured minutes earlier in the same repetition; bench/report.py reports the median and
min..max of each headline figure over the repetitions and judges the targets on the medians.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
PHASES = ["wrk", "produce", "e2e", "rss", "latency", "recorder", "scaling", "rcluster",
          "endpoints", "tls", "api", "scrape", "peers"]
OPT_IN = ("peers",)   # run only when named in --only
API_CONNS = int(os.environ.get("BENCH_API_CONNS", "256"))  # api phase: wrk connections
                      # (keep-alive); each publish holds its connection until Kafka
                      # acknowledges, so the concurrency is the batch
API_FANOUT = 10       # api phase: endpoints subscribed to the fan-out type
RSS_DELAY_MS = 4000   # rss phase: every endpoint answers after this long
RSS_INFLIGHT = 10000  # rss phase: the window the memory target is stated for
BODY_BYTES = 512
PARTITIONS = 8
ENDPOINTS = 100
MANY_ENDPOINTS = 10000

LATENCY_WARMUP_S = 20  # seconds published at the rate before the latency phase measures
# api phase warm-up: slices of publishing until the broker's CPU per publish settles (see
# api_warm); a fresh broker JVM took 50-60 s of publish load to drop from 8.8 to 2.5 us
API_WARM_SLICE_S = 5
API_WARM_MAX_S = 120
API_WARM_SETTLED = 0.2  # the last API_WARM_PLATEAU slices within 20% of each other and
API_WARM_PLATEAU = 3  # of the lowest slice so far
TARGETS = {
    "e2e_rate": 20000,        # deliveries/s, whole stack on this machine
    "p99_ms": 50,             # publish -> delivered at half that rate
    "rss_mb": 200,            # consumer peak RSS with 10,000 in flight
    "api_ratio": 0.5,         # accepted events/s over HTTP / wrk's rate on GET /healthz
    "api_p99_ms": 20,         # request latency at half the accepted rate
    "scrape_ratio": 0.97,     # e2e rate scraped every second / not scraped
    "produce_rate": 100000,   # records/s, bench/produce.sh (its BENCH_TARGET)
    "recorder_rate": 100000,  # outcomes/s into PostgreSQL (issue #20), bench/recorder.sh (its BENCH_TARGET)
    "consumer_us": 45,        # consumer CPU per delivery in the e2e drain, µs (issue #20)
    "stack_us": 100,          # whole stack's CPU per delivery in the e2e drain, µs (issue #20)
    "e2e_ratio": 0.45,        # e2e rate / wrk's raw rate in the same repetition (issue #20)
}
SCRAPE_PORT_OFFSET = 20  # scrape phase: the consumer's metrics_listen port is the receiver's + this
LATENCY_PORT_OFFSET = 21  # latency phase: the consumer's metrics_listen port (receiver's + this)
# The consumer's histograms that split a delivery's time (docs/METRICS.md): the wait before a
# loop took the record, the wait in the consumer before the request started, the request.
WAIT_STAGES = (("kafka", "sluice_delivery_wait_seconds", 'stage="kafka"'),
               ("queue", "sluice_delivery_wait_seconds", 'stage="queue"'),
               ("http", "sluice_http_phase_seconds", 'phase="total"'),
               ("total", "sluice_publish_to_delivered_seconds", None))


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- /proc helpers

def proc_cpu_s(pid):
    """utime+stime of every thread of pid, seconds (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def scrape_stages(url):
    """{stage: {upper bound in s: cumulative count}} of the WAIT_STAGES histograms."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for stage, fam, label in WAIT_STAGES:
        b = {}
        for m in re.finditer(r"^" + fam + r"_bucket\{([^}]*)\} (\d+)$", text, re.M):
            if label and label not in m.group(1):
                continue
            le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
            b[float("inf") if le == "+Inf" else float(le)] = int(m.group(2))
        out[stage] = b
    return out


def stage_quantiles(before, after, qs=(0.5, 0.99)):
    """Per stage: the count and the quantiles (ms) of what was observed between two scrapes,
    interpolated within a bucket as Prometheus's histogram_quantile does (the buckets are
    1, 2.5, 5, 10, 25, 50, 100 ms...: a quantile is known to its bucket, not closer)."""
    res = {}
    for stage, after_b in after.items():
        les = sorted(after_b)
        cum = [after_b[le] - before.get(stage, {}).get(le, 0) for le in les]
        total = cum[-1] if cum else 0
        r = {"count": total}
        for q in qs:
            if not total:
                continue
            rank = q * total
            i = next(k for k, c in enumerate(cum) if c >= rank)
            lo, hi = (les[i - 1] if i else 0.0), les[i]
            if hi == float("inf"):
                v = lo
            else:
                below = cum[i - 1] if i else 0
                v = lo + (hi - lo) * (rank - below) / max(1, cum[i] - below)
            r[f"p{round(q * 100)}"] = round(v * 1000, 1)
        res[stage] = r
    return res


def proc_stat_totals():
    """(busy, total) jiffies of the whole machine, for the share of CPU others used."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


class Monitor(threading.Thread):
    """Samples CPU and RSS of labelled pids every `interval` seconds."""

    def __init__(self, pids, interval=1.0):
        super().__init__(daemon=True)
        self.pids = dict(pids)
        self.interval = interval
        self.samples = []            # (t, {label: (cpu_s, rss_kb)}, machine busy fraction)
        self.peak_rss = {k: 0 for k in self.pids}
        self._halt = threading.Event()

    def add(self, label, pid):
        self.pids[label] = pid
        self.peak_rss.setdefault(label, 0)

    def run(self):
        last = proc_stat_totals()
        while not self._halt.is_set():
            row = {}
            for label, pid in list(self.pids.items()):
                rss = proc_status_kb(pid, "VmRSS")
                row[label] = (proc_cpu_s(pid), rss)
                if rss and rss > self.peak_rss.get(label, 0):
                    self.peak_rss[label] = rss
            cur = proc_stat_totals()
            busy = (cur[0] - last[0]) / max(1, cur[1] - last[1])
            last = cur
            self.samples.append((time.time(), row, busy))
            self._halt.wait(self.interval)

    def stop(self):
        self._halt.set()
        self.join(5)


# ---------------------------------------------------------------------------- the bench

class Bench:
    def __init__(self, a):
        self.a = a
        self.consumer_set = {}
        for kv in a.consumer_set:
            k, sep, v = kv.partition("=")
            if not sep or not re.fullmatch(r"[a-z][a-z0-9_]*", k):
                raise SystemExit(f"bench.py: --consumer-set wants KEY=VALUE with a key of "
                                 f"docs/CONFIG.md, not {kv!r}")
            self.consumer_set[k] = v
        self.quick = a.quick
        self.run_id = datetime.datetime.now().strftime("%H%M%S") + f"{os.getpid() % 1000:03d}"
        # topic, group and event-id tag of the current repetition (run_id, then run_id + rK);
        # endpoints are registered once per run and keep run_id
        self.rep_id = self.run_id
        self.registered = {}      # what later repetitions reuse: rss endpoints, many, api
        self.latency_max_rate = None  # the rate whose half every repetition's latency paces
        self.recorder_warmed = False  # the recorder phase's first run on the new server done
        self.results = {"phases": {}}
        self.receiver = None      # the peers phase's receiver (bench/peers.py)
        self.tls = None           # (certificate, key, resume) the receiver serves HTTPS with
        self.work = a.work
        self.port = a.receiver_port
        self.stack_dir = a.stack_dir
        self.broker_pid = read_pid(os.path.join(a.stack_dir, "kafka", "kafka.pid"))
        self.redis_pid = read_pid(os.path.join(a.stack_dir, "redis", "redis.pid"))
        self.master_key = os.urandom(32).hex()
        self.redis_db = 0
        self.n_main = 100_000 if self.quick else 1_000_000
        self.n_scale = 50_000 if self.quick else 300_000
        self.n_produce = 200_000 if self.quick else 1_000_000
        self.wrk_s = 5 if self.quick else 10
        self.pace_s = 10 if self.quick else 20
        self.inflight = a.inflight
        self.threads = a.consumer_threads
        self.latency_inflight = getattr(a, "latency_inflight", 1000)
        self.per_ep = max(1, min(10000, -(-self.inflight // ENDPOINTS)))
        self.ep_prefix = f"b{self.run_id}_"
        self.many_prefix = f"m{self.run_id}_"
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        for k in ("SLUICE_KAFKA_BROKERS", "SLUICE_REDIS_URL", "SLUICE_PG_DSN"):
            self.base_env[k] = os.environ[k]
        self.base_env.update({
            "SLUICE_MASTER_KEY": self.master_key,
            "SLUICE_TOPIC_ENDPOINTS": f"bench.{self.run_id}.endpoints",
            "SLUICE_SSRF_ALLOW_CIDRS": "127.0.0.0/8",
            "SLUICE_LOG_LEVEL": "info",
        })

    # -------------------------------------------------------------------- small helpers
    def bin(self, rel):
        return os.path.join(self.a.build, rel)

    def env(self, name, **cfg):
        """Environment of one phase: its own topics, group and Redis database."""
        e = dict(self.base_env)
        t = f"bench.{self.rep_id}.{name}"
        e.update({
            "SLUICE_TOPIC_DELIVERIES": f"{t}.deliveries",
            "SLUICE_TOPIC_OUTCOMES": f"{t}.outcomes",
            "SLUICE_TOPIC_QUARANTINE": f"{t}.quarantine",
            "SLUICE_CONSUMER_GROUP": f"{t}.consumers",
            "SLUICE_RECORDER_GROUP": f"{t}.recorder",
        })
        for k, v in cfg.items():
            e["SLUICE_" + k.upper()] = str(v)
        return e

    def redis_base(self):
        return re.sub(r"/\d+$", "", os.environ["SLUICE_REDIS_URL"].rstrip("/"))

    def new_redis_db(self, e):
        """A fresh Redis database (1..15) per phase: no retry jobs or markers from another.

        The previous phase's database is emptied and the AOF rewritten before the phase
        starts, so every phase starts with a small Redis, and automatic AOF rewrites are
        off while the bench runs (redis_rewrites): a rewrite forks a child that takes a
        whole core for seconds (8 s with 3 million markers), and on this 2-core machine
        that is a hiccup of the whole co-located stack, not of Sluice (bench/README.md,
        "Why the bench runs as it does")."""
        base = self.redis_base()
        if self.redis_db:
            self.redis(f"{base}/{self.redis_db}", "FLUSHDB")
        self.redis_db = self.redis_db % 15 + 1
        e["SLUICE_REDIS_URL"] = f"{base}/{self.redis_db}"
        self.redis(e["SLUICE_REDIS_URL"], "FLUSHDB")
        self.redis_compact()

    def redis_compact(self):
        """BGREWRITEAOF and wait for it (bounded): the AOF holds only what is live now."""
        base = self.redis_base()
        self.redis(base, "BGREWRITEAOF")
        deadline = time.time() + 300
        while time.time() < deadline:
            info = self.redis(base, "INFO", "persistence").decode(errors="replace")
            if ("aof_rewrite_in_progress:0" in info and
                    "aof_rewrite_scheduled:0" in info):
                return
            time.sleep(0.2)
        log("redis: the AOF rewrite did not finish within 300 s; going on")

    def redis_rewrites(self, pct):
        """Set auto-aof-rewrite-percentage (0 = automatic AOF rewrites off); returns the
        value it had, to restore."""
        base = self.redis_base()
        old = self.redis(base, "CONFIG", "GET", "auto-aof-rewrite-percentage")
        # *2 $27 auto-aof-rewrite-percentage $N value
        parts = old.decode(errors="replace").split("\r\n")
        prev = parts[4] if len(parts) > 4 and parts[4].isdigit() else "100"
        r = self.redis(base, "CONFIG", "SET", "auto-aof-rewrite-percentage", pct)
        if not r.startswith(b"+OK"):
            raise RuntimeError(f"redis CONFIG SET auto-aof-rewrite-percentage: {r[:200]!r}")
        return prev

    @staticmethod
    def redis(url, *args):
        rest = url[len("redis://"):]
        hostport, _, db = rest.partition("/")
        host, _, port = hostport.rpartition(":")
        s = socket.create_connection((host, int(port)), timeout=30)
        try:
            def cmd(parts):
                out = f"*{len(parts)}\r\n".encode()
                for p in parts:
                    b = str(p).encode()
                    out += b"$%d\r\n%s\r\n" % (len(b), b)
                s.sendall(out)
                return s.recv(65536)
            if db:
                cmd(["SELECT", db])
            return cmd(list(args))
        finally:
            s.close()

    def run(self, args, env, timeout=600, check=True):
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
        return r

    def ctl(self, env, *args, **kw):
        return self.run([self.bin("ctl/sluicectl"), *args], env, **kw)

    def topics(self, env, partitions=PARTITIONS):
        self.ctl(env, "topics", "ensure", "--partitions", str(partitions))

    def delete_topics(self, env):
        if os.environ.get("BENCH_KEEP_TOPICS") == "1":  # for a closer look at the outcomes
            log(f"keeping {env['SLUICE_TOPIC_OUTCOMES']} (BENCH_KEEP_TOPICS=1)")
            return
        tool = self.bin("tests/integration/sl-test-topic")
        for k in ("SLUICE_TOPIC_DELIVERIES", "SLUICE_TOPIC_OUTCOMES", "SLUICE_TOPIC_QUARANTINE"):
            subprocess.run([tool, "delete", env[k]], env=env, capture_output=True)

    def produce(self, env, n, prefix, endpoints, run_id):
        t0 = time.time()
        r = self.run([self.bin("producer/sluice-produce"), "--generate", str(n), "--endpoints",
                      str(endpoints), "--endpoint-prefix", prefix, "--body-bytes",
                      str(BODY_BYTES), "--run-id", run_id, "--quiet", "--timeout-ms", "120000"],
                     env, timeout=900)
        m = dict(re.findall(r"(\w+)=([\d.]+)", r.stdout))
        if int(m.get("published", 0)) != n:
            raise RuntimeError(f"sluice-produce published {m.get('published')} of {n}")
        return {"records": n, "records_per_s": float(m["records_per_s"]),
                "elapsed_s": round(time.time() - t0, 2)}

    # -------------------------------------------------------------------- receiver
    def start_receiver(self, tag):
        logf = open(os.path.join(self.work, f"receiver-{tag}.log"), "ab")
        tls = ["--tls-cert", self.tls[0], "--tls-key", self.tls[1]] if self.tls else []
        tls += ["--tls-resume"] if self.tls and self.tls[2] else []
        p = subprocess.Popen([self.bin("tests/receiver/sluice-receiver"), "--port", str(self.port),
                              "--no-ledger-ok", "--threads", str(self.a.receiver_threads),
                              "--max-ids", "0", "--log-level", "warn", *tls],
                             stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL)
        line = p.stdout.readline().decode().strip()
        if not line.startswith("port="):
            raise RuntimeError(f"receiver did not start (see {logf.name}): {line!r}")
        p.logf = logf
        return p

    def stop_proc(self, p, timeout=60):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if getattr(p, "logf", None):
            p.logf.close()

    def receiver_stats(self):
        if self.tls:
            import ssl
            ctx = ssl.create_default_context(cafile=self.tls[0])
            url, kw = f"https://127.0.0.1:{self.port}/_stats", {"context": ctx}
        else:
            url, kw = f"http://127.0.0.1:{self.port}/_stats", {}
        with urllib.request.urlopen(url, timeout=10, **kw) as r:
            return json.loads(r.read())

    def receiver_ok(self):
        return int(self.receiver_stats().get("by_status", {}).get("204", 0))

    # -------------------------------------------------------------------- consumers
    def start_consumer(self, env, name):
        e = dict(env)
        e["SLUICE_INSTANCE_ID"] = name
        for k, v in self.consumer_set.items():  # --consumer-set: over what the phase chose
            e["SLUICE_" + k.upper()] = v
        path = os.path.join(self.work, f"consumer-{name}.log")
        logf = open(path, "ab")
        p = subprocess.Popen([self.bin("consumer/sluice-consumer")], env=e, stdout=logf,
                             stderr=logf, stdin=subprocess.DEVNULL)
        p.logf = logf
        p.log_path = path
        p.name = name
        return p

    @staticmethod
    def consumer_log(p):
        out = []
        try:
            with open(p.log_path) as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return out

    def assigned(self, p):
        """Partitions currently assigned to p, from its log (None before the first); a
        process with several delivery loops (consumer_threads) sums its loops'."""
        per_loop = {}
        for ev in self.consumer_log(p):
            if ev.get("event") == "partitions_assigned":
                per_loop[ev.get("loop", 0)] = int(re.search(r"(\d+)", ev.get("msg", "0")).group(1))
            elif ev.get("event") == "partitions_revoked":
                per_loop[ev.get("loop", 0)] = 0
        return sum(per_loop.values()) if per_loop else None

    def wait_assigned(self, procs, total, timeout=90):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"consumer {p.name} exited {p.returncode} (see {p.log_path})")
            got = [self.assigned(p) for p in procs]
            if all(g is not None for g in got) and sum(got) == total and all(g > 0 for g in got):
                return
            time.sleep(0.3)
        raise RuntimeError(f"consumers not assigned {total} partitions in {timeout}s")

    def loop_shares(self, p):
        """Each delivery loop's share of the deliveries of process p (from its last stats
        lines, which count from the start; largest first). A loop delivers for the endpoints
        whose records hash to its partitions, so with 100 endpoints the split moves with their
        names from run to run (bench/README.md, "latency")."""
        last = {}
        for ev in self.consumer_log(p):
            if ev.get("event") == "stats":
                last[ev.get("loop", 0)] = int(ev.get("delivered", 0))
        total = sum(last.values())
        return sorted((round(v / total, 3) for v in last.values()), reverse=True) if total else []

    def consumer_peaks(self, p):
        """Largest in-flight and in-memory counts from the stats lines; with several
        delivery loops, the sum of each loop's largest (an upper bound of the process's)."""
        infl, mem = {}, {}
        for ev in self.consumer_log(p):
            if ev.get("event") == "stats":
                # *_max: the peak since the previous line (the line itself is one sample)
                k = ev.get("loop", 0)
                infl[k] = max(infl.get(k, 0), int(ev.get("inflight", 0)),
                              int(ev.get("inflight_max", 0)))
                mem[k] = max(mem.get(k, 0), int(ev.get("in_memory", 0)),
                             int(ev.get("in_memory_max", 0)))
        return sum(infl.values()), sum(mem.values())

    def wait_delivered(self, target, procs, timeout, series=None):
        """Poll the receiver until target 2xx answers; returns seconds waited."""
        t0 = time.time()
        last, last_t = 0, t0
        while True:
            n = self.receiver_ok()
            now = time.time()
            if series is not None:
                series.append((round(now - t0, 2), n))
            if n >= target:
                return now - t0
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"consumer {p.name} exited {p.returncode} (see {p.log_path})")
            if n != last:
                last, last_t = n, now
            if now - last_t > 60:
                raise RuntimeError(f"no delivery for 60 s at {n} of {target}")
            if now - t0 > timeout:
                raise RuntimeError(f"only {n} of {target} delivered in {timeout}s")
            time.sleep(0.5)

    def outcomes(self, env, expect, prefix, t0_ms, tag, timeout=300):
        series = os.path.join(self.work, f"series-{tag}.tsv")
        cdf = os.path.join(self.work, f"cdf-{tag}.tsv")
        r = self.run([self.a.tool, "outcomes", "--expect", str(expect), "--id-prefix", prefix,
                      "--t0-ms", str(t0_ms), "--timeout-s", str(timeout), "--series", series,
                      "--cdf", cdf], env, timeout=timeout + 60, check=False)
        if not r.stdout.strip():
            raise RuntimeError(f"sl-bench outcomes failed: {r.stderr[-2000:]}")
        o = json.loads(r.stdout)
        o["series_file"], o["cdf_file"] = series, cdf
        return o

    @staticmethod
    def read_series(path):
        rows, names = [], []
        with open(path) as f:
            for line in f:
                if line.startswith("#"):
                    names = line[1:].split()[2:]
                    continue
                rows.append([int(x) for x in line.split()])
        return names, rows

    @staticmethod
    def steady_rate(rows, col=1):
        """Median of the per-second counts between the first and last full second."""
        vals = [r[col] for r in rows]
        nz = [i for i, v in enumerate(vals) if v > 0]
        if len(nz) < 3:
            return float(sum(vals))
        inner = vals[nz[0] + 1:nz[-1]]
        return float(statistics.median(inner)) if inner else float(sum(vals))

    # -------------------------------------------------------------------- one drain
    def drain(self, name, n, prefix, endpoints, consumers, produce_first, cfg=None,
              rcluster=False):
        """Deliver n records over `endpoints` endpoints with `consumers` consumer processes.

        produce_first: pre-produce everything, then start the consumers (one consumer);
        otherwise start the consumers, wait until they share the partitions, then produce
        (several consumers: no rebalance inside the measured window).
        rcluster: the consumers use the Redis Cluster run.sh started (emptied first), and its
        six nodes are measured in place of the one Redis.
        """
        cfg = dict(cfg or {})
        cfg.setdefault("max_inflight", self.inflight)
        cfg.setdefault("max_inflight_per_endpoint", self.per_ep)
        cfg.setdefault("consumer_threads", self.threads)
        env = self.env(name, **cfg)
        if rcluster:
            env["SLUICE_REDIS_URL"] = self.a.redis_cluster_url
            self.rc_reset()
            redis_pids = {f"redis-n{i + 1}": pid for i, (_, pid) in enumerate(self.rc_nodes())}
        else:
            self.new_redis_db(env)
            redis_pids = {"redis": self.redis_pid}
        self.topics(env)
        run_id = f"{name}{self.rep_id}"
        res = {"deliveries": n, "endpoints": endpoints, "consumers": consumers,
               "partitions": PARTITIONS, "body_bytes": BODY_BYTES,
               "consumer_config": {"SLUICE_" + k.upper(): v for k, v in cfg.items()}}
        if produce_first:
            log(f"{name}: producing {n} deliveries over {endpoints} endpoints")
            res["produce"] = self.produce(env, n, prefix, endpoints, run_id)
        recv = self.start_receiver(name)
        mon = Monitor({"receiver": recv.pid, "broker": self.broker_pid, **redis_pids})
        mon.start()
        cpu0 = {k: proc_cpu_s(v) for k, v in mon.pids.items()}
        m0 = proc_stat_totals()
        procs = []
        prod_end_ms = None
        try:
            t0_ms = int(time.time() * 1000)
            for i in range(consumers):
                p = self.start_consumer(env, f"{name}-c{i}")
                procs.append(p)
                mon.add(p.name, p.pid)
                cpu0[p.name] = 0.0
            if not produce_first:
                self.wait_assigned(procs, PARTITIONS)
                log(f"{name}: {consumers} consumer(s) assigned; producing {n} deliveries")
                res["produce"] = self.produce(env, n, prefix, endpoints, run_id)
                prod_end_ms = int(time.time() * 1000)
            else:
                log(f"{name}: {consumers} consumer(s) draining")
            waited = self.wait_delivered(n, procs, timeout=max(600, n // 500))
            cpu1 = {k: proc_cpu_s(v) for k, v in mon.pids.items()}
            # connections the receiver accepted (its stats polls' included), requests over a
            # resumed TLS session
            rst = self.receiver_stats()
            res["receiver_connections"] = rst.get("connections")
            res["receiver_tls_resumed"] = rst.get("tls_resumed")
            m1 = proc_stat_totals()
            hwm = {p.name: proc_status_kb(p.pid, "VmHWM") for p in procs}
            hwm["receiver"] = proc_status_kb(recv.pid, "VmHWM")
            hwm["broker"] = proc_status_kb(self.broker_pid, "VmHWM")
        finally:
            for p in procs:
                self.stop_proc(p)
            mon.stop()
            self.stop_proc(recv)
        res["wall_s"] = round(waited, 2)
        res["machine_busy_fraction"] = round((m1[0] - m0[0]) / max(1, m1[1] - m0[1]), 3)
        # CPU the rest of the machine (other engineers' work) used meanwhile, in cores
        ours = sum(cpu1[k] - cpu0[k] for k in cpu0
                   if cpu0[k] is not None and cpu1.get(k) is not None)
        res["others_cores"] = round(max(0.0, (m1[0] - m0[0]) / CLK_TCK - ours) / max(0.1, waited), 2)
        o = self.outcomes(env, n, f"evt_{run_id}_", t0_ms, name)
        names, rows = self.read_series(o["series_file"])
        span_s = max(0.001, (o["last_ms"] - o["first_ms"]) / 1000)
        res["delivered"] = o["delivered"]
        res["states"] = o["states"]
        res["rate_mean"] = round(o["delivered"] / span_s, 1)
        res["rate_median_1s"] = self.steady_rate(rows)
        res["e2e_ms"] = o["e2e_ms"]
        res["http_ms"] = o["http_ms"]
        res["series"] = {"columns": ["sec", "total"] + names, "rows": rows}
        res["cdf_file"] = o["cdf_file"]
        # CPU per 10,000 deliveries, each process over the drain
        cpu = {}
        for k in cpu0:
            if cpu0[k] is not None and cpu1.get(k) is not None:
                cpu[k] = round((cpu1[k] - cpu0[k]) / max(1, o["delivered"]) * 10000, 3)
        res["cpu_s_per_10k"] = cpu
        res["cpu_s_per_10k"]["consumers_total"] = round(
            sum(v for k, v in cpu.items() if k.startswith(name + "-c")), 3)
        res["cpu_s_per_10k"]["redis_total"] = round(
            sum(v for k, v in cpu.items() if k == "redis" or k.startswith("redis-n")), 3)
        res["peak_rss_kb"] = {k: v for k, v in hwm.items()}
        res["peak_rss_kb"]["broker_sampled"] = mon.peak_rss.get("broker")
        res["peak_rss_kb"]["redis_sampled"] = mon.peak_rss.get("redis")
        peaks = [self.consumer_peaks(p) for p in procs]
        res["consumer_peak_inflight"] = max(x[0] for x in peaks)
        res["consumer_peak_in_memory"] = max(x[1] for x in peaks)
        res["cpu_series"] = self.cpu_series(mon)
        if prod_end_ms is not None:
            # the seconds after production ended in which every consumer was delivering
            res["window"] = self.window_rates(names, rows, o["pods"],
                                              -(-(prod_end_ms - t0_ms) // 1000) + 1)
        self.delete_topics(env)
        return res

    @staticmethod
    def cpu_series(mon):
        """Per-second CPU use (cores) of each monitored process."""
        out = []
        prev = None
        for t, row, busy in mon.samples:
            if prev:
                dt = t - prev[0]
                cores = {}
                for k, (c, _rss) in row.items():
                    pc = prev[1].get(k, (None, None))[0]
                    if c is not None and pc is not None and dt > 0:
                        cores[k] = round((c - pc) / dt, 3)
                out.append({"t": round(t - mon.samples[0][0], 1), "cores": cores,
                            "machine_busy": round(busy, 3)})
            prev = (t, row)
        return out

    @staticmethod
    def window_rates(names, rows, pods, start_sec):
        """Aggregate and per-pod rates over the full seconds from start_sec on in which every
        pod delivered (production has ended: the producer no longer competes for CPU)."""
        if not rows:
            return {}
        cols = {nm: i + 2 for i, nm in enumerate(names)}
        active = [r for r in rows if r[0] >= start_sec and all(r[c] > 0 for c in cols.values())]
        if len(active) > 1:
            active = active[:-1]   # the last second is partial
        out = {"window_s": len(active), "start_sec": start_sec}
        if not active:
            return out
        out["aggregate_rate"] = round(sum(r[1] for r in active) / len(active), 1)
        out["pods"] = {nm: {"rate": round(sum(r[c] for r in active) / len(active), 1),
                            "delivered": pods.get(nm, {}).get("delivered")}
                       for nm, c in cols.items()}
        return out

    # -------------------------------------------------------------------- phases
    def phase_wrk(self):
        conns = min(self.inflight, 10000)
        lua = os.path.join(self.work, "post.lua")
        body = '{"seq":1,"data":"' + "x" * (BODY_BYTES - 20) + '"}'
        with open(lua, "w") as f:
            f.write('wrk.method = "POST"\n')
            f.write(f"wrk.body = {json.dumps(body)}\n")
            for k, v in [("Content-Type", "application/json"),
                         ("webhook-id", "evt_bench_0"), ("webhook-timestamp", "1700000000"),
                         ("webhook-signature", "v1," + "A" * 44),
                         ("X-Sluice-Attempt", "1"), ("X-Sluice-Created-Ms", "1700000000000"),
                         ("User-Agent", "Sluice/0.1.0")]:
                f.write(f'wrk.headers["{k}"] = "{v}"\n')
        recv = self.start_receiver("wrk")
        res = {"connections": conns, "threads": self.a.wrk_threads, "duration_s": self.wrk_s,
               "receiver_threads": self.a.receiver_threads, "body_bytes": BODY_BYTES,
               "method": "POST /ok (Sluice's headers)"}
        curl_runs = {}
        try:
            cpu0 = proc_cpu_s(recv.pid)
            cmd = ["/usr/bin/time", "-f", "WRKCPU %U %S", "wrk", f"-t{self.a.wrk_threads}", f"-c{conns}", f"-d{self.wrk_s}s",
                   "--timeout", "10s", "--latency", "-s", lua, f"http://127.0.0.1:{self.port}/ok/wrk"]
            res["command"] = " ".join(cmd[3:])
            t = time.time()
            r = self.run(cmd, self.base_env, timeout=self.wrk_s + 120)
            el = time.time() - t
            cpu1 = proc_cpu_s(recv.pid)
            res["receiver_hwm_kb"] = proc_status_kb(recv.pid, "VmHWM")
            # the libcurl ceiling: what a client that did nothing but libcurl gets from the
            # same receiver (the consumer's HTTP library, without Kafka, Redis or signing)
            # at the e2e consumer's window too: libcurl's CPU per request grows with the
            # connections open to one host, so that is the floor to set the consumer beside
            for n in sorted({100, 1000, self.inflight}):
                c0 = proc_cpu_s(recv.pid)
                cc = [self.a.tool, "http", "--url", f"http://127.0.0.1:{self.port}/ok/curl",
                      "--inflight", str(n), "--seconds", str(self.wrk_s), "--body-bytes",
                      str(BODY_BYTES), "--endpoints", "100"]
                rc = self.run(cc, self.base_env, timeout=self.wrk_s + 120)
                c1 = proc_cpu_s(recv.pid)
                try:
                    cr = json.loads(rc.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    cr = {"failed": f"sl-bench http exited {rc.returncode}: {rc.stderr[-300:]}"}
                cr["command"] = " ".join(cc[1:])
                if cr.get("requests") and c0 is not None and c1 is not None:
                    cr["receiver_cpu_s_per_10k"] = round((c1 - c0) / cr["requests"] * 10000, 3)
                curl_runs[str(n)] = cr
        finally:
            self.stop_proc(recv)
        res["libcurl"] = curl_runs
        m = re.search(r"Requests/sec:\s+([\d.]+)", r.stdout)
        res["requests_per_s"] = float(m.group(1)) if m else None
        tot = re.search(r"(\d+) requests in", r.stdout)
        if tot and cpu0 is not None and cpu1 is not None:
            res["receiver_cpu_s_per_10k"] = round((cpu1 - cpu0) / int(tot.group(1)) * 10000, 3)
        lat = dict(re.findall(r"^\s+(50|90|99)%\s+([\d.]+\w+)", r.stdout, re.M))
        res["latency"] = lat
        errs = re.search(r"Socket errors: (.*)", r.stdout)
        res["socket_errors"] = errs.group(1) if errs else None
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
        res["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
        res["wall_s"] = round(el, 1)
        w = re.search(r"WRKCPU ([\d.]+) ([\d.]+)", r.stderr)
        if w and tot:
            res["wrk_cpu_s_per_10k"] = round((float(w.group(1)) + float(w.group(2)))
                                             / int(tot.group(1)) * 10000, 3)
        return res

    def phase_produce(self):
        script = os.path.join(self.a.repo, "bench", "produce.sh")
        e = dict(self.base_env)
        e.update({"SLUICE_BUILD_DIR": self.a.build, "BENCH_RECORDS": str(self.n_produce),
                  "BENCH_BODY_BYTES": str(BODY_BYTES), "BENCH_ENDPOINTS": "1000",
                  "BENCH_PARTITIONS": str(PARTITIONS),
                  "BENCH_TARGET": str(TARGETS["produce_rate"])})
        e.pop("SLUICE_MASTER_KEY", None)
        e.pop("SLUICE_SSRF_ALLOW_CIDRS", None)
        r = self.run(["bash", script], e, timeout=900)
        out = r.stdout
        res = {"script": "bench/produce.sh", "records": self.n_produce, "body_bytes": BODY_BYTES,
               "partitions": PARTITIONS, "output": out.strip().splitlines()}
        m = re.search(r"records/s:\s+([\d.]+)", out)
        res["records_per_s"] = float(m.group(1)) if m else None
        m = re.search(r"peak RSS:\s+(\d+) KiB", out)
        res["producer_peak_rss_kb"] = int(m.group(1)) if m else None
        m = re.search(r"producer CPU: user ([\d.]+) s \+ sys ([\d.]+) s", out)
        if m:
            res["producer_cpu_s_per_10k"] = round(
                (float(m.group(1)) + float(m.group(2))) / self.n_produce * 10000, 3)
        m = re.search(r"broker CPU:\s+([\d.]+) s", out)
        if m:
            res["broker_cpu_s_per_10k"] = round(float(m.group(1)) / self.n_produce * 10000, 3)
        return res

    def add_endpoints(self, prefix, url_of, types):
        """ENDPOINTS endpoints <prefix>0.. with `sluicectl endpoints add`, url_of(id) each, and
        a type filter of their own: an endpoint without one is subscribed to every type, and
        would join the api phase's fan-out (sluice-produce names the endpoint)."""
        setup = self.env("setup")
        self.topics(setup, 1)  # the shared endpoints topic (and a few unused ones)
        for i in range(ENDPOINTS):
            ep = f"{prefix}{i}"
            self.ctl(setup, "endpoints", "add", "--id", ep, "--url", url_of(ep), "--types", types)

    def register_endpoints(self):
        log(f"registering {ENDPOINTS} endpoints with sluicectl endpoints add")
        t = time.time()
        self.add_endpoints(self.ep_prefix, lambda ep: f"http://127.0.0.1:{self.port}/ok/{ep}",
                           "bench.e2e")
        self.results["setup"] = {"endpoints_add_s": round(time.time() - t, 1)}

    def register_many(self):
        env = self.env("setup")
        log(f"registering {MANY_ENDPOINTS} endpoints (COPY into the registry + sluicectl endpoints sync)")
        t = time.time()
        sql = self.run([self.a.tool, "endpoints-sql", "--count", str(MANY_ENDPOINTS), "--prefix",
                        self.many_prefix, "--url-base", f"http://127.0.0.1:{self.port}/ok/"], env)
        p = subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", os.environ["SLUICE_PG_DSN"]],
                           input=sql.stdout, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"psql: {p.stderr[-1000:]}")
        self.ctl(env, "endpoints", "sync", timeout=600)
        return round(time.time() - t, 1)

    def phase_e2e(self):
        res = self.drain("e2e", self.n_main, self.ep_prefix, ENDPOINTS, 1, produce_first=True)
        return res

    def phase_rss(self):
        """The memory target as the issue states it: one consumer holding 10,000 requests in
        flight. Every endpoint answers after RSS_DELAY_MS, so the window stays full (rate =
        in flight / delay). Each endpoint may hold twice its even share (200), so the
        default max_queued (5,000) keeps the window full although records spread over the
        endpoints, and the endpoints over the loops, unevenly."""
        prefix = f"r{self.run_id}_"
        if "rss" not in self.registered:  # once per run: later repetitions reuse them
            self.add_endpoints(
                prefix, lambda ep: f"http://127.0.0.1:{self.port}/ok/{ep}?delay_ms={RSS_DELAY_MS}",
                "bench.rss")
            self.registered["rss"] = True
        n = 60_000 if self.quick else 120_000
        cfg = {"max_inflight": RSS_INFLIGHT,
               # twice the even share: with several loops an endpoint's records all go to
               # one loop, whose endpoints may be fewer than half (49 x 100 < 5,000)
               "max_inflight_per_endpoint": max(1, 2 * RSS_INFLIGHT // ENDPOINTS),
               "consumer_threads": self.threads}
        env = self.env("rss", **cfg)
        self.new_redis_db(env)
        self.topics(env)
        log(f"rss: producing {n} deliveries; endpoints answer after {RSS_DELAY_MS} ms")
        self.produce(env, n, prefix, ENDPOINTS, f"rss{self.rep_id}")
        recv = self.start_receiver("rss")
        cons = self.start_consumer(env, "rss-c0")
        try:
            waited = self.wait_delivered(n, [cons], timeout=max(600, n // 100))
            hwm = proc_status_kb(cons.pid, "VmHWM")
            cpu = proc_cpu_s(cons.pid)
        finally:
            self.stop_proc(cons)
            self.stop_proc(recv)
        infl, mem = self.consumer_peaks(cons)
        self.delete_topics(env)
        return {"deliveries": n, "delay_ms": RSS_DELAY_MS, "endpoints": ENDPOINTS,
                "consumer_config": {"SLUICE_" + k.upper(): v for k, v in cfg.items()},
                "consumer_hwm_kb": hwm, "consumer_peak_inflight": infl,
                "consumer_peak_in_memory": mem, "seconds": round(waited, 1),
                "consumer_cpu_s_per_10k": round(cpu / n * 10000, 3) if cpu else None}

    def pace(self, env, rate, count, run_id, extra):
        """sl-bench pace: count deliveries over the bench's endpoints at rate/s; its JSON."""
        r = self.run([self.a.tool, "pace", "--rate", str(rate), "--count", str(count),
                      "--endpoints", str(ENDPOINTS), "--prefix", self.ep_prefix,
                      "--body-bytes", str(BODY_BYTES), "--run-id", run_id] + extra,
                     env, timeout=count // max(1, rate) * 4 + 120)
        return json.loads(r.stdout)

    def phase_latency(self, max_rate):
        rate = max(100, int(max_rate / 2))
        # A moderate window, as docs/OPERATIONS.md advises for endpoints that answer
        # quickly: with 10,000 a hiccup upstream lets thousands of requests start at once,
        # each on a new connection, and the tail grows to seconds (bench/README.md,
        # "Latency window").
        win = self.latency_inflight
        murl = f"http://127.0.0.1:{self.a.receiver_port + LATENCY_PORT_OFFSET}/metrics"
        env = self.env("latency", max_inflight=win,
                       max_inflight_per_endpoint=max(1, -(-win // ENDPOINTS)),
                       consumer_threads=self.threads,
                       metrics_listen=f"127.0.0.1:{self.a.receiver_port + LATENCY_PORT_OFFSET}")
        self.new_redis_db(env)
        self.topics(env)
        recv = self.start_receiver("latency")
        cons = self.start_consumer(env, "latency-c0")
        mon = Monitor({"consumer": cons.pid, "receiver": recv.pid, "broker": self.broker_pid,
                       "redis": self.redis_pid})
        mon.start()
        res = {"rate": rate, "seconds": self.pace_s, "endpoints": ENDPOINTS,
               "half_of": max_rate, "max_inflight": win, "runs": {}}
        try:
            self.wait_assigned([cons], PARTITIONS)
            time.sleep(1)
            base = self.receiver_ok()
            # Warm-up, not measured: LATENCY_WARMUP_S at the rate, so the first measured run
            # does not pay for opening the consumer's connections, nor for a fresh broker
            # JVM's JIT compiling (0.8-1.0 cores for its first ~18 s of load with
            # `--only latency` on a fresh stack): a pod in service has its connections open
            # and a warm broker.
            warm = rate * LATENCY_WARMUP_S
            log(f"latency: warm-up, {warm} deliveries at {rate}/s (not measured)")
            self.pace(env, rate, warm, f"latwarm{self.rep_id}", [])
            base += warm
            self.wait_delivered(base, [cons], timeout=300)
            t0_ms = int(time.time() * 1000)
            # at half the drain's rate: the library as shipped (linger_ms 5), common/sl_kafka's
            # latency profile (linger 2 ms), and the library at linger_ms 50 (fewer produce
            # requests; the linger alone takes up to 50 ms, so it is shown, not judged); then
            # the library as shipped at a quarter of the drain's rate
            quarter = max(50, rate // 2)
            for prof, r, extra in (("lib", rate, ["--profile", "lib"]),
                                   ("latency", rate, ["--profile", "latency"]),
                                   ("lib50", rate, ["--profile", "lib", "--linger-ms", "50"]),
                                   ("lib_quarter", quarter, ["--profile", "lib"])):
                run_id = f"lat{prof.replace('_', '')}{self.rep_id}"
                n = r * self.pace_s
                log(f"latency: pacing {n} deliveries at {r}/s ({' '.join(extra)})")
                before = scrape_stages(murl)
                pace = self.pace(env, r, n, run_id, extra)
                base += n
                self.wait_delivered(base, [cons], timeout=300)
                time.sleep(0.5)  # the last answers' histograms follow the receiver's count
                res["runs"][prof] = {"pace": pace, "run_id": run_id, "rate": r, "count": n,
                                     "stages_ms": stage_quantiles(before, scrape_stages(murl))}
            cpu = proc_cpu_s(cons.pid)
            res["consumer_hwm_kb"] = proc_status_kb(cons.pid, "VmHWM")
        finally:
            self.stop_proc(cons)
            mon.stop()
            self.stop_proc(recv)
        res["consumer_cpu_s"] = cpu
        res["loop_shares"] = self.loop_shares(cons)
        res["cpu_series"] = self.cpu_series(mon)
        for prof, rr in res["runs"].items():
            o = self.outcomes(env, rr["count"], f"evt_{rr['run_id']}_", t0_ms, f"latency-{prof}")
            rr["delivered"] = o["delivered"]
            rr["e2e_ms"] = o["e2e_ms"]
            rr["http_ms"] = o["http_ms"]
            rr["cdf_file"] = o["cdf_file"]
            names, rows = self.read_series(o["series_file"])
            rr["rate_median_1s"] = self.steady_rate(rows)
        self.delete_topics(env)
        return res

    def phase_recorder(self):
        script = os.path.join(self.a.repo, "bench", "recorder.sh")
        if not os.path.exists(script):
            return {"available": False,
                    "reason": "bench/recorder.sh not found in this tree: recorder outcomes/s "
                              "not measured"}
        e = dict(self.base_env)
        records = 200_000 if self.quick else 1_000_000
        e.update({"SLUICE_BUILD_DIR": self.a.build, "BENCH_RECORDS": str(records),
                  "BENCH_TARGET": str(TARGETS["recorder_rate"])})
        e.pop("SLUICE_SSRF_ALLOW_CIDRS", None)

        def run():
            r = subprocess.run(["bash", script], env=e, capture_output=True, text=True,
                               timeout=900)
            m = re.search(r"^outcomes/s:\s+([\d.]+)", r.stdout, re.M)
            return r, {"exit": r.returncode, "outcomes_per_s": float(m.group(1)) if m else None,
                       "output": (r.stdout + r.stderr).strip().splitlines()[-40:]}
        warm = None
        if not self.recorder_warmed:
            # The bench's PostgreSQL is new: its first run creates every WAL file it writes,
            # where a server that has been writing for a while recycles them (each run of
            # recorder.sh starts after a checkpoint). One run first, reported but not judged.
            log("recorder: a first run on the new server (creates its WAL files; not judged)")
            warm = run()[1]
            self.recorder_warmed = True
        r, res = run()
        res.update({"available": True, "script": "bench/recorder.sh", "records": records})
        if warm:
            res["first_run_on_new_server"] = warm
        if res["outcomes_per_s"] is None and r.returncode == 0:
            res["reason"] = "bench/recorder.sh printed no 'outcomes/s:' line"
        if r.returncode != 0:
            res["reason"] = f"bench/recorder.sh exited {r.returncode}"
        return res

    def phase_scaling(self):
        # processes are the unit here: one delivery loop each (the e2e phase runs one
        # process with --consumer-threads loops)
        res = {"deliveries": self.n_scale, "partitions": PARTITIONS, "loops_per_process": 1,
               "runs": {}}
        for c in (1, 2, 4):
            log(f"scaling: {c} consumer(s)")
            res["runs"][str(c)] = self.drain(f"scale{c}", self.n_scale, self.ep_prefix, ENDPOINTS,
                                             c, produce_first=False, cfg={"consumer_threads": 1})
        return res

    def rc_nodes(self):
        """(port, pid) of each node of the Redis Cluster run.sh started (scripts/stack.sh's
        layout: <dir>/redis/node<i>/redis.conf and redis.pid)."""
        out = []
        confs = glob.glob(os.path.join(self.a.redis_cluster_dir, "redis", "node*", "redis.conf"))
        for conf in sorted(confs, key=lambda c: int(re.sub(r"\D", "", os.path.basename(
                os.path.dirname(c))))):
            with open(conf) as f:
                port = int(re.search(r"^port (\d+)", f.read(), re.M).group(1))
            out.append((port, read_pid(os.path.join(os.path.dirname(conf), "redis.pid"))))
        if not out:
            raise RuntimeError(f"no Redis Cluster node in {self.a.redis_cluster_dir}")
        return out

    def rc_reset(self):
        """Every master emptied (FLUSHALL; replicas follow), automatic AOF rewrites off and
        the AOF rewritten on every node: the cluster's counterpart of new_redis_db."""
        nodes = [f"redis://127.0.0.1:{port}" for port, _ in self.rc_nodes()]
        for url in nodes:
            if b"master" in self.redis(url, "ROLE")[:40]:
                self.redis(url, "FLUSHALL")
        for url in nodes:
            self.redis(url, "CONFIG", "SET", "auto-aof-rewrite-percentage", "0")
            self.redis(url, "BGREWRITEAOF")
        deadline = time.time() + 300
        for url in nodes:
            while time.time() < deadline:
                info = self.redis(url, "INFO", "persistence").decode(errors="replace")
                if "aof_rewrite_in_progress:0" in info and "aof_rewrite_scheduled:0" in info:
                    break
                time.sleep(0.2)

    def phase_rcluster(self):
        """The scaling phase's drains (1, 2, 4 processes of one loop) with Redis as a
        cluster: compared run by run with the scaling phase of the same repetition."""
        if not getattr(self.a, "redis_cluster_url", ""):
            return {"available": False,
                    "reason": "no Redis Cluster given (bench/run.sh starts one when the phase "
                              "is selected)"}
        res = {"deliveries": self.n_scale, "partitions": PARTITIONS, "loops_per_process": 1,
               "redis": "cluster: 3 masters + 3 replicas on this machine "
                        f"({self.a.redis_cluster_url})", "runs": {}}
        for c in (1, 2, 4):
            log(f"rcluster: {c} consumer(s) on the Redis Cluster")
            res["runs"][str(c)] = self.drain(f"rcl{c}", self.n_scale, self.ep_prefix, ENDPOINTS,
                                             c, produce_first=False,
                                             cfg={"consumer_threads": 1}, rcluster=True)
        return res

    def phase_endpoints(self):
        if "many" not in self.registered:  # once per run: later repetitions reuse them
            self.registered["many"] = self.register_many()
        secs = self.registered["many"]
        # one loop, as the 1-consumer scaling run it is compared with
        r = self.drain("eps10k", self.n_scale, self.many_prefix, MANY_ENDPOINTS, 1,
                       produce_first=False, cfg={"consumer_threads": 1})
        r["register_s"] = secs
        return r

    # -------------------------------------------------------------------- tls
    def phase_tls(self):
        """What HTTPS costs: one consumer drains the same records over plain HTTP, over HTTPS
        on kept-alive connections, and with a new connection for every delivery (the
        receiver answers Connection: close, ?close=1), over HTTP, over HTTPS where each
        delivery pays a full handshake, and over HTTPS with the receiver issuing session
        tickets (--tls-resume), so that the consumer may resume its session. The
        receiver's certificate is a P-256 one made here; the consumer trusts it through
        endpoint_ca_file. Same receiver, same 100 endpoints' worth of records per run."""
        cert = os.path.join(self.work, "tls-receiver.pem")
        key = os.path.join(self.work, "tls-receiver.key")
        if not os.path.exists(cert):
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out",
                            cert, "-days", "30", "-subj", "/CN=127.0.0.1", "-addext",
                            "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        kinds = (("http", "http", ""), ("https", "https", ""),
                 ("http_new_conn", "http", "?close=1"), ("https_new_conn", "https", "?close=1"),
                 ("https_resumed", "https", "?close=1"))
        if "tls" not in self.registered:  # once per run: later repetitions reuse them
            for i, (kind, scheme, query) in enumerate(kinds):
                self.add_endpoints(
                    f"t{i}{self.run_id}_",
                    lambda ep, sc=scheme, q=query: f"{sc}://127.0.0.1:{self.port}/ok/{ep}{q}",
                    "bench.tls")
            self.registered["tls"] = True
        n_kept = 50_000 if self.quick else 300_000
        n_new = 10_000 if self.quick else 60_000
        res = {"certificate": "ECDSA P-256, self-signed, trusted through endpoint_ca_file",
               "runs": {}}
        for i, (kind, scheme, query) in enumerate(kinds):
            n = n_new if query else n_kept
            log(f"tls: {kind}, {n} deliveries")
            self.tls = (cert, key, kind == "https_resumed") if scheme == "https" else None
            try:
                res["runs"][kind] = self.drain(f"tls{i}", n, f"t{i}{self.run_id}_", ENDPOINTS, 1,
                                               produce_first=True,
                                               cfg={"endpoint_ca_file": cert})
            finally:
                self.tls = None
        return res

    # -------------------------------------------------------------------- scrape
    def phase_scrape(self):
        """Does scraping cost the delivery loop anything? The same drain with the consumer's
        /metrics fetched every second, and with no metrics listener at all; ABBA order so a
        drift of the machine over the phase weighs on both sides alike."""
        port = self.a.receiver_port + SCRAPE_PORT_OFFSET
        runs = {"none": [], "scrape": []}
        scrapes = []
        for i, kind in enumerate(("none", "scrape", "scrape", "none")):
            cfg = {"consumer_threads": self.threads}
            stop = threading.Event()
            th = None
            if kind == "scrape":
                cfg["metrics_listen"] = f"127.0.0.1:{port}"
                cfg["metrics_endpoint_top"] = 20

                def scrape_loop():
                    while not stop.wait(1.0):
                        t = time.time()
                        try:
                            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                        timeout=5) as r:
                                size = len(r.read())
                            scrapes.append(((time.time() - t) * 1000, size))
                        except OSError:
                            pass  # the consumer is not up yet, or gone
                th = threading.Thread(target=scrape_loop, daemon=True)
                th.start()
            log(f"scrape: run {i + 1}/4 ({kind})")
            try:
                r = self.drain(f"scrape{i}{kind}", self.n_scale, self.ep_prefix, ENDPOINTS, 1,
                               produce_first=True, cfg=cfg)
            finally:
                stop.set()
                if th:
                    th.join()
            runs[kind].append({"rate_mean": r["rate_mean"],
                               "rate_median_1s": r["rate_median_1s"],
                               "consumer_cpu_s_per_10k": r["cpu_s_per_10k"]["consumers_total"],
                               "others_cores": r.get("others_cores")})
        mean = lambda k, f: statistics.mean(x[f] for x in runs[k])
        res = {"deliveries": self.n_scale, "order": "none, scrape, scrape, none", "runs": runs,
               "rate_none": round(mean("none", "rate_mean"), 1),
               "rate_scrape": round(mean("scrape", "rate_mean"), 1),
               "cpu_s_per_10k_none": round(mean("none", "consumer_cpu_s_per_10k"), 3),
               "cpu_s_per_10k_scrape": round(mean("scrape", "consumer_cpu_s_per_10k"), 3),
               "scrapes": len(scrapes)}
        res["ratio"] = round(res["rate_scrape"] / max(1e-9, res["rate_none"]), 3)
        # the consumer's CPU per delivery, scraped over plain: the cost itself, which the
        # machine's other load moves much less than it moves the rates
        res["cpu_ratio"] = round(res["cpu_s_per_10k_scrape"] / max(1e-9, res["cpu_s_per_10k_none"]),
                                 3)
        if scrapes:
            res["scrape_ms_median"] = round(statistics.median(s[0] for s in scrapes), 2)
            res["scrape_bytes_median"] = int(statistics.median(s[1] for s in scrapes))
        return res

    # -------------------------------------------------------------------- api
    def wrk_lua(self, name, method, path, body=None, headers=(), delay_ms=None):
        lua = os.path.join(self.work, f"{name}.lua")
        with open(lua, "w") as f:
            f.write(f'wrk.method = "{method}"\n')
            if body is not None:
                f.write(f"wrk.body = {json.dumps(body)}\n")
            for k, v in headers:
                f.write(f'wrk.headers["{k}"] = "{v}"\n')
            if delay_ms is not None:
                # a paced client: each connection waits between requests, uniformly 0..2x the
                # mean, so the connections drift apart instead of firing in step (with a fixed
                # delay all of them send in the same millisecond: bursts, not a rate)
                f.write(f"function delay() return math.random(0, {2 * delay_ms}) end\n")
        return lua

    def wrk(self, lua, url, conns, secs, pids=()):
        cpu0 = {p: proc_cpu_s(p) for p in pids}
        m0 = proc_stat_totals()
        cmd = ["wrk", "-t2", f"-c{conns}", f"-d{secs}s", "--timeout", "10s", "--latency", "-s",
               lua, url]
        r = self.run(cmd, self.base_env, timeout=secs + 120)
        m1 = proc_stat_totals()
        # the whole machine's busy share: near 1 the route is CPU-bound, well below it the
        # rate is the connections' count over the request time (Little's law)
        out = {"command": " ".join(cmd),
               "machine_busy_fraction": round((m1[0] - m0[0]) / max(1, m1[1] - m0[1]), 3)}
        m = re.search(r"Requests/sec:\s+([\d.]+)", r.stdout)
        tot = re.search(r"(\d+) requests in ([\d.]+)(\w+)", r.stdout)
        out["requests_per_s"] = float(m.group(1)) if m else None
        out["requests"] = int(tot.group(1)) if tot else 0
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
        out["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
        errs = re.search(r"Socket errors: (.*)", r.stdout)
        out["socket_errors"] = errs.group(1) if errs else None
        out["latency"] = dict(re.findall(r"^\s+(50|75|90|99)%\s+([\d.]+\w+)", r.stdout, re.M))
        if out["requests"]:
            out["accepted_per_s"] = round((out["requests"] - out["non_2xx"]) /
                                          (out["requests"] / out["requests_per_s"]), 1)
            for p in pids:
                c1 = proc_cpu_s(p)
                if cpu0.get(p) is not None and c1 is not None:
                    out[f"cpu_us_per_request_pid{p}"] = round((c1 - cpu0[p]) / out["requests"] * 1e6, 1)
        return out

    @staticmethod
    def ms(text):
        m = re.match(r"([\d.]+)(us|ms|s)$", text or "")
        if not m:
            return None
        v = float(m.group(1))
        return {"us": v / 1000, "ms": v, "s": v * 1000}[m.group(2)]

    def api_warm(self, lua, url):
        """Publish in slices of API_WARM_SLICE_S until the broker's CPU per publish settles
        (the last three slices within API_WARM_SETTLED of each other and of the lowest slice
        so far, after at least LATENCY_WARMUP_S; 5 s with --quick), at most API_WARM_MAX_S. A
        fresh broker JIT-compiles its produce path under load for a minute or more, costing
        up to 3x its settled CPU per publish meanwhile: measured then, the phase would weigh
        the broker's warm-up, not the API. Two slices were not enough: a broker still falling
        (8.3, 5.5, 5.0 µs) passed, and settled near 3 later."""
        least = 5 if self.quick else LATENCY_WARMUP_S
        most = max(least, 30 if self.quick else API_WARM_MAX_S)
        pids = [self.broker_pid] if self.broker_pid else []
        slices, total, settled = [], 0, False
        while total < most:
            w = self.wrk(lua, url, API_CONNS, API_WARM_SLICE_S, pids)
            total += API_WARM_SLICE_S
            slices.append(w.get(f"cpu_us_per_request_pid{self.broker_pid}") if pids else None)
            last = [v for v in slices[-API_WARM_PLATEAU:] if v]
            if not pids:
                settled = total >= least
            elif len(last) == API_WARM_PLATEAU:
                # equal slices of a still-cold broker are not settled: they must also be near
                # the lowest slice so far
                low = min(v for v in slices if v)
                settled = (max(last) - min(last) <= API_WARM_SETTLED * max(last) and
                           max(last) <= (1 + API_WARM_SETTLED) * low)
            if settled and total >= least:
                break
        log(f"api: warm-up {total} s, broker us per publish by {API_WARM_SLICE_S}-s slice: "
            f"{slices}{'' if settled else ' (not settled: measured anyway)'}")
        return {"seconds": total, "slice_s": API_WARM_SLICE_S, "settled": settled,
                "broker_cpu_us_per_publish": slices}

    def phase_api(self):
        """sluice-api: events accepted per second over HTTP keep-alive (512-byte bodies), each
        acknowledged by Kafka before its 202, for one explicit endpoint per event and for a
        fan-out of 1 event to 10 endpoints, beside wrk's rate on the same server's cheapest
        route (GET /healthz) in the same run; request latency at half the accepted rate; the
        fan-out lookup with 10,000 endpoints of which 1,000 match (sl-bench fanout)."""
        env = self.env("api", api_threads=2, api_listen=f"127.0.0.1:{self.port + 1}",
                       api_max_connections=4096, log_level="warn")
        self.topics(env)
        self.new_redis_db(env)
        one = f"a{self.run_id}_one"
        if "api" not in self.registered:
            # once per run: a second set subscribed to bench.fan.* would double the fan-out
            self.ctl(env, "endpoints", "add", "--id", one, "--url",
                     f"http://127.0.0.1:{self.port}/ok/{one}", "--types", "bench.one")
            for i in range(API_FANOUT):
                ep = f"a{self.run_id}_fan{i}"
                self.ctl(env, "endpoints", "add", "--id", ep, "--url",
                         f"http://127.0.0.1:{self.port}/ok/{ep}", "--types", "bench.fan.*")
            self.registered["api"] = json.loads(
                self.ctl(env, "keys", "create", "--name", f"bench {self.run_id}", "--scopes",
                         "publish", "--json").stdout)["key"]
        key = self.registered["api"]
        logf = open(os.path.join(self.work, "api.log"), "ab")
        api = subprocess.Popen([self.bin("api/sluice-api")], env=env, stdout=logf, stderr=logf,
                               stdin=subprocess.DEVNULL)
        api.logf = logf
        base = f"http://127.0.0.1:{self.port + 1}"
        res = {"connections": API_CONNS, "threads": 2, "body_bytes": BODY_BYTES,
               "duration_s": self.wrk_s}
        try:
            for _ in range(300):
                try:
                    with urllib.request.urlopen(base + "/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.2)
            else:
                raise RuntimeError("sluice-api did not become ready (see api.log)")
            hdrs = [("Content-Type", "application/json"), ("Authorization", f"Bearer {key}")]
            pad = "x" * (BODY_BYTES - 20)
            one_ev = {"type": "bench.one", "endpoint": one, "body": {"seq": 1, "data": pad}}
            fan_ev = {"type": "bench.fan.created", "body": {"seq": 1, "data": pad}}
            # the fan-out must reach exactly the API_FANOUT subscribed endpoints: ask once
            req = urllib.request.Request(base + "/v1/events", data=json.dumps(fan_ev).encode(),
                                         headers=dict(hdrs), method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                fan_n = json.loads(r.read())["deliveries"]
            if fan_n != API_FANOUT:
                raise RuntimeError(f"the fan-out event reached {fan_n} endpoints, not "
                                   f"{API_FANOUT}: an endpoint without a type filter is "
                                   "subscribed to every type")
            raw = self.wrk(self.wrk_lua("api-raw", "GET", "/healthz"), base + "/healthz",
                           API_CONNS, self.wrk_s, [api.pid])
            warm = self.api_warm(self.wrk_lua("api-warm", "POST", "/v1/events",
                                              json.dumps(one_ev), hdrs), base + "/v1/events")
            pub = self.wrk(self.wrk_lua("api-one", "POST", "/v1/events", json.dumps(one_ev), hdrs),
                           base + "/v1/events", API_CONNS, self.wrk_s,
                           [api.pid] + ([self.broker_pid] if self.broker_pid else []))
            fan = self.wrk(self.wrk_lua("api-fan", "POST", "/v1/events", json.dumps(fan_ev), hdrs),
                           base + "/v1/events", API_CONNS, self.wrk_s, [api.pid])
            # the raw rate again after the publishes: the ratios divide by the mean of the two,
            # so a drift of the machine's other load during the phase weighs on both sides
            raw2 = self.wrk(self.wrk_lua("api-raw", "GET", "/healthz"), base + "/healthz",
                            API_CONNS, self.wrk_s, [api.pid])
            half = (pub.get("accepted_per_s") or 0) / 2
            lat = None
            if half >= 1:
                # paced: each connection sends one request per conns/half seconds on average
                # (its own request's time, ~the P50 of the full-rate run, counts in the cycle)
                p50 = self.ms(pub["latency"].get("50")) or 0
                delay = max(1, int(API_CONNS * 1000 / half - p50))
                lat = self.wrk(self.wrk_lua("api-half", "POST", "/v1/events", json.dumps(one_ev),
                                            hdrs, delay_ms=delay),
                               base + "/v1/events", API_CONNS, self.wrk_s)
                lat["target_rate"] = round(half, 1)
                lat["delay_ms_per_connection"] = delay
            fo = self.run([self.a.tool, "fanout", "--endpoints", "10000", "--match", "1000",
                           "--lookups", "20000"], env)
            lookup = json.loads(fo.stdout.strip().splitlines()[-1])
        finally:
            self.stop_proc(api)
        raws = [r.get("requests_per_s") for r in (raw, raw2) if r.get("requests_per_s")]
        raw_mean = round(sum(raws) / len(raws), 1) if raws else None
        res.update({"fanout_endpoints": fan_n, "warmup": warm,
                    "raw_healthz": raw, "raw_healthz_after": raw2, "raw_healthz_mean_per_s":
                    raw_mean, "publish_one": pub, "publish_fanout10": fan,
                    "latency_at_half": lat, "fanout_lookup": lookup})
        if raw_mean and pub.get("accepted_per_s"):
            res["ratio_one"] = round(pub["accepted_per_s"] / raw_mean, 3)
        if raw_mean and fan.get("accepted_per_s"):
            res["ratio_fanout10"] = round(fan["accepted_per_s"] / raw_mean, 3)
            res["fanout10_records_per_s"] = round(fan["accepted_per_s"] * API_FANOUT, 1)
        if lat:
            res["p99_ms_at_half"] = self.ms(lat["latency"].get("99"))
            res["p50_ms_at_half"] = self.ms(lat["latency"].get("50"))
        log(f"api: raw {raw.get('requests_per_s')}/s before, {raw2.get('requests_per_s')}/s "
            f"after, one {pub.get('accepted_per_s')}/s "
            f"(ratio {res.get('ratio_one')}), fan-out x10 {fan.get('accepted_per_s')} events/s, "
            f"P99 at half {res.get('p99_ms_at_half')} ms, lookup {lookup.get('lookup_us_mean')} us")
        return res

    # -------------------------------------------------------------------- main
    def machine(self):
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
        model = "?"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        git = subprocess.run(["git", "-C", self.a.repo, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", self.a.repo, "status", "--porcelain", "--",
                                "consumer", "common", "producer", "tests/receiver", "bench"],
                               capture_output=True, text=True).stdout.strip()
        versions = {}
        for pkg in ("rdkafka", "libcurl", "hiredis", "libmicrohttpd", "jansson"):
            versions[pkg] = subprocess.run(["pkg-config", "--modversion", pkg],
                                           capture_output=True, text=True).stdout.strip()
        cc_v = subprocess.run(["cc", "--version"], capture_output=True,
                              text=True).stdout.split("\n")[0]
        try:
            wrk_v = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0]
        except OSError:
            wrk_v = "?"
        return {"host": socket.gethostname(), "nproc": os.cpu_count(), "model_name": model,
                "mem_total_gib": round(mem_kb / 1048576, 1), "kernel": platform.release(),
                "loadavg_start": loadavg(), "git": git + ("+local changes" if dirty else ""),
                "build": "Release (cmake -DCMAKE_BUILD_TYPE=Release), " + cc_v,
                "libraries": versions, "wrk": wrk_v,
                "broker": "Kafka 4.3.1 KRaft single node, -Xmx512m (scripts/stack.sh)",
                "note": "2 vCPUs shared with other engineers' builds, tests and stacks"}

    def main(self):
        a = self.a
        phases = [p for p in PHASES if p not in OPT_IN] if not a.only else a.only.split(",")
        for p in phases:
            if p not in PHASES:
                raise SystemExit(f"unknown phase {p}; known: {','.join(PHASES)}")
        repeat = a.repeat
        if repeat < 1:
            raise SystemExit("--repeat must be 1 or more")
        if repeat > 1 and "wrk" not in phases:
            # every repetition's throughput is a ratio to the raw rate of that repetition
            phases = ["wrk"] + phases
            log("--repeat: the wrk phase added to every repetition (the ratios divide by it)")
        started = datetime.datetime.now()
        self.results.update({
            "date": started.isoformat(timespec="seconds"),
            "mode": "quick" if self.quick else "full",
            "repeat": repeat,
            "command": a.command,
            "machine": self.machine(),
            "targets": TARGETS,
            "settings": {"consumer_max_inflight": self.inflight,
                         "consumer_threads": self.threads,
                         "consumer_max_inflight_per_endpoint": self.per_ep,
                         "receiver_threads": a.receiver_threads, "wrk_threads": a.wrk_threads,
                         "partitions": PARTITIONS, "body_bytes": BODY_BYTES,
                         "endpoints": ENDPOINTS, "many_endpoints": MANY_ENDPOINTS,
                         "consumer_set": self.consumer_set},
        })
        log(f"machine: {self.results['machine']['nproc']} x {self.results['machine']['model_name']}, "
            f"load average {self.results['machine']['loadavg_start']}")
        need_eps = any(p in phases
                       for p in ("e2e", "latency", "scaling", "rcluster", "scrape")) or (
            "peers" in phases and (os.environ.get("SLUICE_BENCH_CONVOY")
                                   or os.environ.get("SLUICE_BENCH_SVIX")))
        if need_eps:
            self.register_endpoints()
        ph = self.results["phases"]
        failures = []
        rewrite_pct = self.redis_rewrites("0")  # see new_redis_db
        self.results["settings"]["redis_auto_aof_rewrite"] = "off during the phases; each " \
            "phase starts after FLUSHDB of the previous phase's database and BGREWRITEAOF"
        self.results["settings"]["latency_warmup_s"] = LATENCY_WARMUP_S
        reps = []
        try:
            for k in range(repeat):
                # topics, groups and event ids of each repetition are its own
                self.rep_id = self.run_id if k == 0 else f"{self.run_id}r{k + 1}"
                rp = ph if k == 0 else {}
                t0 = datetime.datetime.now()
                reps.append({"repetition": k + 1, "started": t0.isoformat(timespec="seconds"),
                             "loadavg_start": loadavg(), "phases": rp})
                if repeat > 1:
                    log(f"=== repetition {k + 1} of {repeat}")
                self.run_phases(phases, rp, failures)
                reps[-1]["duration_s"] = round((datetime.datetime.now() - t0).total_seconds(), 1)
                reps[-1]["loadavg_end"] = loadavg()
        finally:
            try:  # a Redis gone by now must not cost the run's results
                self.redis_rewrites(rewrite_pct)
                if self.redis_db:
                    self.redis(f"{self.redis_base()}/{self.redis_db}", "FLUSHDB")
            except OSError as ex:
                log(f"redis: could not restore auto-aof-rewrite-percentage {rewrite_pct}: {ex}")
        if repeat > 1:
            # "phases" stays repetition 1 (the plots and the readers of a single run use it)
            self.results["repetitions"] = reps
        self.results["loadavg_end"] = loadavg()
        self.results["duration_s"] = round((datetime.datetime.now() - started).total_seconds(), 1)
        import report  # bench/report.py: table, plots, files
        report.write(self.results, a.results, self.work, quick=self.quick)
        return 1 if failures else 0

    def run_phases(self, phases, ph, failures):
        a = self.a
        for p in phases:
            log(f"=== phase {p}")
            t = time.time()
            try:
                if p == "wrk":
                    ph[p] = self.phase_wrk()
                elif p == "produce":
                    ph[p] = self.phase_produce()
                elif p == "e2e":
                    ph[p] = self.phase_e2e()
                elif p == "rss":
                    ph[p] = self.phase_rss()
                elif p == "latency":
                    # half the first repetition's e2e rate in every repetition: the
                    # percentiles of all repetitions are taken at the same rate
                    if self.latency_max_rate is None:
                        self.latency_max_rate = ((ph.get("e2e") or {}).get("rate_median_1s")
                                                 or a.latency_rate)
                    ph[p] = self.phase_latency(self.latency_max_rate)
                elif p == "recorder":
                    ph[p] = self.phase_recorder()
                elif p == "scaling":
                    ph[p] = self.phase_scaling()
                elif p == "rcluster":
                    ph[p] = self.phase_rcluster()
                elif p == "endpoints":
                    ph[p] = self.phase_endpoints()
                elif p == "api":
                    ph[p] = self.phase_api()
                elif p == "scrape":
                    ph[p] = self.phase_scrape()
                elif p == "tls":
                    ph[p] = self.phase_tls()
                elif p == "peers":
                    import peers  # bench/peers.py
                    ph[p] = peers.phase(self)
            except Exception as ex:  # a failed phase is reported; the others still run
                import traceback
                traceback.print_exc()
                log(f"phase {p} FAILED: {ex}")
                ph[p] = {"failed": str(ex)}
                failures.append(p)
            ph.setdefault(p, {})["phase_s"] = round(time.time() - t, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--stack-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--receiver-port", type=int, required=True)
    ap.add_argument("--inflight", type=int, default=10000)
    ap.add_argument("--latency-inflight", type=int, default=1000,
                    help="SLUICE_MAX_INFLIGHT of the latency phase's consumer")
    ap.add_argument("--consumer-threads", type=int, default=2,
                    help="SLUICE_CONSUMER_THREADS of every consumer process")
    ap.add_argument("--receiver-threads", type=int, default=2)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--consumer-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration key (docs/CONFIG.md) for every consumer the phases "
                         "start, over the phase's own choice; repeatable")
    ap.add_argument("--latency-rate", type=int, default=5000,
                    help="max rate assumed by --only latency without e2e (half is paced)")
    ap.add_argument("--command", default="bench/run.sh")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--redis-cluster-url", default="",
                    help="rcluster phase: redis-cluster:// URL of the cluster run.sh started")
    ap.add_argument("--redis-cluster-dir", default="",
                    help="rcluster phase: that cluster's stack dir (node pids and ports)")
    ap.add_argument("--only", default="")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the phases N times (wrk first in each); report the median and "
                         "min..max of each headline figure")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(Bench(a).main())


if __name__ == "__main__":
    main()
