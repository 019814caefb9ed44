"""The peers phase of bench/run.sh (`bench/run.sh --only peers`; opt-in, never in CI): the same
webhook workload through Sluice and through a peer, in the same run on the same machine.

Workload (identical for every system): 100 endpoints on the suite's receiver
(tests/receiver, /ok/<endpoint>), events of a 512-byte JSON body published through the
system's HTTP API by `sl-bench publish` (BENCH_PEERS_CONNS keep-alive connections, each with
one request in flight, events spread round-robin over the endpoints), published and
delivered at once. Counted at the receiver (2xx answers); the stack's CPU is the utime+stime
of its processes and of their children (PostgreSQL backends, Redis forks) from /proc.

Peers:
  Convoy  a built `convoy` binary in SLUICE_BENCH_CONVOY (bench/peers/build-convoy.sh builds
          one); run against its own PostgreSQL and Redis (scripts/stack.sh in a temp dir on
          BENCH_PORT_BASE+40..), configured as its documentation recommends for throughput
          (see bench/README.md, "peers"). Without SLUICE_BENCH_CONVOY the phase is skipped
          with one line.
  Svix    a built `svix-server` binary in SLUICE_BENCH_SVIX (bench/peers/build-svix.sh builds
          one); API and worker in one process, with its own PostgreSQL and Redis
          (BENCH_PORT_BASE+60..), configured as its config.default.toml and docker-compose.yml
          recommend; one application whose 100 endpoints each listen to a channel of their
          own, each message naming one channel.
  With neither variable set the phase is skipped with one line; a peer that fails is
  reported as failed and the others still run.
"""

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
CONVOY_ENV = "SLUICE_BENCH_CONVOY"
ENDPOINTS = 100
BODY_BYTES = 512
# the delivered body: {"seq":"<8 digits>","data":"x..."}, exactly BODY_BYTES bytes
DATA_JSON = '{"seq":"%SEQ%","data":"' + "x" * (BODY_BYTES - 28) + '"}'
EVENT_TYPE = "bench.peers"
CONVOY_STACK_OFFSET = 40  # Convoy's scripts/stack.sh port base: BENCH_PORT_BASE + this
CONVOY_OFFSET = 50  # Convoy's HTTP ports: server, worker, agent, ingest from base + this
SVIX_ENV = "SLUICE_BENCH_SVIX"
SVIX_STACK_OFFSET = 60  # Svix's scripts/stack.sh port base: BENCH_PORT_BASE + this
SVIX_OFFSET = 70        # svix-server's HTTP port: BENCH_PORT_BASE + this
SETTLE_CORES = 0.05  # settled: within this many cores of its idle use before the run, over 1 s
SETTLE_MAX_S = 30
IDLE_S = 3          # the stack's idle CPU use is sampled for this long before each run


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- /proc

def _stat(pid):
    """(ppid, utime+stime+cutime+cstime in s) of pid, or None when gone. cutime/cstime hold
    the CPU of the children it has reaped: PostgreSQL's exited backends, Redis's forks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), sum(int(x) for x in rest[11:15]) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def tree_cpu_s(pids):
    """CPU seconds of the given processes and all their live descendants (each counted once,
    reaped children included through cutime/cstime)."""
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st:
                kids.setdefault(st[0], []).append(int(name))
    seen, total, todo = set(), 0.0, [p for p in pids if p]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        st = _stat(p)
        if st:
            total += st[1]
        todo += kids.get(p, [])
    return total


def machine_busy_s():
    """Busy CPU seconds of the whole machine so far (all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / CLK_TCK


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


def http_json(method, url, body=None, token=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as ex:
        raise RuntimeError(f"{method} {url}: HTTP {ex.code}: {ex.read()[:500]!r}") from None


def wait_http(url, what, timeout=120, proc=None, logf=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode} (see {logf})")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if 200 <= r.status < 300:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready at {url} after {timeout} s (see {logf})")


# ---------------------------------------------------------------------------- the workload

def publish_cmd(bench, url, headers, template, ep_file, n, conns):
    cmd = [bench.a.tool, "publish", "--url", url, "--count", str(n), "--inflight", str(conns),
           "--body", template, "--endpoints-file", ep_file]
    for h in headers:
        cmd += ["--header", h]
    return cmd


def shown_cmd(cmd):
    """The publisher's command as recorded: the API key and the body's padding left out."""
    out = []
    for a in cmd[1:]:
        if a.startswith("Authorization: Bearer "):
            a = "Authorization: Bearer <key>"
        out.append(a.replace("x" * (BODY_BYTES - 28), f"x...({BODY_BYTES - 28} x)"))
    return " ".join(out)


def run_workload(bench, name, cmd, n, stack_pids, timeout):
    """Publish n events with `cmd` (sl-bench publish) while the system delivers them; returns
    the figures. stack_pids: {label: pid} of the system's processes (their trees are summed).

    Window: from the publisher's start to the moment the receiver has counted as many 2xx
    answers as events were accepted (polled every 0.1 s): deliveries/s = accepted / window.
    CPU: from the same start until the stack has settled after the last delivery (back
    within SETTLE_CORES of the idle use sampled for IDLE_S before the start, over a second;
    at most SETTLE_MAX_S), so the work a system finishes after its last HTTP answer (status
    writes, outcome records) is counted too, and its idle use after that is not."""
    recv_pid = bench.receiver.pid
    i0, ti0 = sum(tree_cpu_s([p]) for p in stack_pids.values()), time.time()
    time.sleep(IDLE_S)
    idle = (sum(tree_cpu_s([p]) for p in stack_pids.values()) - i0) / (time.time() - ti0)
    ok0 = bench.receiver_ok()
    cpu0 = {k: tree_cpu_s([p]) for k, p in stack_pids.items()}
    rcv0 = tree_cpu_s([recv_pid])
    busy0 = machine_busy_s()
    t0 = time.time()
    pub = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=bench.base_env)
    series = []
    pub_out = None
    t_pub = None
    target = n
    last_n, last_t = 0, t0
    while True:
        now = time.time()
        got = bench.receiver_ok() - ok0
        series.append((round(now - t0, 2), got))
        if pub_out is None and pub.poll() is not None:
            out, err = pub.communicate()
            t_pub = time.time()
            try:
                pub_out = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise RuntimeError(f"{name}: sl-bench publish exited {pub.returncode}: {err[-800:]}")
            target = pub_out["accepted"]
            log(f"peers/{name}: published {pub_out['accepted']:,} of {n:,} in "
                f"{pub_out['elapsed_s']:.1f} s ({pub_out['accepted_per_s']:,.0f}/s accepted, "
                f"{pub_out['throttled']} throttled and sent again, {pub_out['non2xx']} refused, "
                f"{pub_out['errors']} errors); {got:,} delivered so far")
        if pub_out is not None and got >= target:
            t_done = now
            break
        if got != last_n:
            last_n, last_t = got, now
        if now - last_t > 120:
            pub.kill()
            raise RuntimeError(f"{name}: no delivery for 120 s at {got:,} of {target:,}")
        if now - t0 > timeout:
            pub.kill()
            raise RuntimeError(f"{name}: only {got:,} of {target:,} delivered in {timeout} s")
        time.sleep(0.1)
    cpu_done = {k: tree_cpu_s([p]) for k, p in stack_pids.items()}
    # let the stack finish what follows the last answer, then take its CPU
    prev, t_prev = sum(cpu_done.values()), time.time()
    while time.time() - t_done < SETTLE_MAX_S:
        time.sleep(1.0)
        cur, t_cur = sum(tree_cpu_s([p]) for p in stack_pids.values()), time.time()
        if (cur - prev) / (t_cur - t_prev) < idle + SETTLE_CORES:
            break
        prev, t_prev = cur, t_cur
    settle_s = round(time.time() - t_done, 1)
    cpu1 = {k: tree_cpu_s([p]) for k, p in stack_pids.items()}
    rcv1 = tree_cpu_s([recv_pid])
    busy1 = machine_busy_s()
    t1 = time.time()
    extra = bench.receiver_ok() - ok0 - target   # answers beyond one per event: duplicates
    window = t_done - t0
    acc = pub_out["accepted"]
    res = {"events": n, "accepted": acc, "endpoints": ENDPOINTS, "body_bytes": BODY_BYTES,
           "publisher": {k: pub_out.get(k) for k in (
               "inflight", "attempts", "throttled", "non2xx", "errors", "by_class",
               "elapsed_s", "accepted_per_s", "request_ms")},
           "publisher_command": shown_cmd(cmd),
           "window_s": round(window, 2),
           "publish_s": round(t_pub - t0, 2),
           "drain_after_publish_s": round(max(0.0, t_done - t_pub), 2),
           "deliveries_per_s": round(acc / window, 1) if window > 0 else None,
           "extra_2xx": extra,
           "idle_cores_before": round(idle, 3),
           "settle_s": settle_s}
    # 1-s delivery rates over the window (first and last partial seconds left out)
    per_s, k = [], 1
    while k <= int(window):
        a = max((c for t, c in series if t <= k - 1), default=0)
        b = max((c for t, c in series if t <= k), default=0)
        per_s.append(b - a)
        k += 1
    res["per_s"] = per_s
    inner = [v for v in per_s[1:] if v > 0]
    res["rate_median_1s"] = float(statistics.median(inner)) if inner else None
    cpu = {k: round(cpu1[k] - cpu0[k], 3) for k in stack_pids}
    res["cpu_s"] = cpu
    res["cpu_s_at_last_delivery"] = {k: round(cpu_done[k] - cpu0[k], 3) for k in stack_pids}
    total = sum(cpu.values())
    res["stack_cpu_s"] = round(total, 3)
    res["cpu_ms_per_delivery"] = {k: round(v / acc * 1000, 4) for k, v in cpu.items()}
    res["stack_cpu_ms_per_delivery"] = round(total / acc * 1000, 4) if acc else None
    res["receiver_cpu_ms_per_delivery"] = round((rcv1 - rcv0) / acc * 1000, 4) if acc else None
    pub_cpu = (pub_out.get("cpu_user_s") or 0) + (pub_out.get("cpu_sys_s") or 0)
    res["publisher_cpu_ms_per_event"] = round(pub_cpu / acc * 1000, 4) if acc else None
    span = t1 - t0
    ours = total + (rcv1 - rcv0) + pub_cpu
    res["machine_busy_cores"] = round((busy1 - busy0) / span, 2)
    res["others_cores"] = round(max(0.0, (busy1 - busy0) - ours) / span, 2)
    if res["stack_cpu_ms_per_delivery"]:
        res["max_rate_2_cores"] = round(2000 / res["stack_cpu_ms_per_delivery"], 1)
    log(f"peers/{name}: {acc:,} delivered in {window:.1f} s = {res['deliveries_per_s']:,.1f}/s "
        f"(median of 1-s {res['rate_median_1s']}); stack CPU "
        f"{res['stack_cpu_ms_per_delivery']:.3f} ms per delivery "
        f"({', '.join(f'{k} {v:.3f}' for k, v in res['cpu_ms_per_delivery'].items())}); "
        f"{res['others_cores']} cores of other work")
    return res


# ---------------------------------------------------------------------------- Convoy

# PostgreSQL for Convoy as Convoy's "PostgreSQL & PGBouncer" page tunes a self-hosted server
# (memory, WAL and checkpoints, autovacuum, SSD planner costs); max_connections above the two
# processes' pools (100 each).
def convoy_pg_settings():
    with open("/proc/meminfo") as f:
        mem_mb = int(f.readline().split()[1]) // 1024
    return {
        "max_connections": "400",
        "shared_buffers": f"{min(mem_mb // 4, 8192)}MB",       # 25% of RAM
        "effective_cache_size": f"{mem_mb * 3 // 4}MB",       # 75% of RAM
        "work_mem": "32MB",
        "maintenance_work_mem": "1GB",
        "wal_buffers": "64MB",
        "min_wal_size": "2GB",
        "max_wal_size": "8GB",
        "checkpoint_completion_target": "0.9",
        "autovacuum_max_workers": "6",
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_analyze_scale_factor": "0.025",
        "autovacuum_vacuum_cost_limit": "2000",
        "random_page_cost": "1.1",
        "effective_io_concurrency": "200",
    }


class Peer:
    """A peer's own PostgreSQL and Redis (scripts/stack.sh in a temp dir on port_base +
    stack_offset) and its processes, each logging into the bench's work dir."""
    name = "peer"

    def __init__(self, bench, binary, port_base, stack_offset):
        self.bench = bench
        self.bin = binary
        self.dir = tempfile.mkdtemp(prefix=f"sluice-bench-{self.name}.",
                                    dir=os.environ.get("TMPDIR", "/tmp"))
        self.stack_dir = os.path.join(self.dir, "stack")
        self.stack_base = port_base + stack_offset
        self.redis_port = self.stack_base + 2
        self.pg_port = self.stack_base + 3
        self.procs = []
        self.settings = {}

    # the stack -----------------------------------------------------------------------
    def stack(self, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.update({"SLUICE_STACK_DIR": self.stack_dir, "SLUICE_PORT_BASE": str(self.stack_base)})
        r = subprocess.run([os.path.join(self.bench.a.repo, "scripts", "stack.sh"), *args],
                           env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"scripts/stack.sh {' '.join(args)} ({self.name}'s stack): "
                               f"{(r.stdout + r.stderr)[-1500:]}")

    def psql(self, db, sql):
        r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                            f"host=127.0.0.1 port={self.pg_port} dbname={db} user=sluice",
                            "-c", sql], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"psql ({sql[:60]}): {r.stderr[-500:]}")

    def start_stack(self, pg_settings, db):
        """Redis and PostgreSQL with pg_settings (ALTER SYSTEM, then a restart) and database
        db."""
        log(f"peers/{self.name}: PostgreSQL and Redis in {self.stack_dir} (ports "
            f"{self.pg_port}, {self.redis_port})")
        self.stack("start", "redis", "postgres")
        for k, v in pg_settings.items():
            self.psql("postgres", f"ALTER SYSTEM SET {k} = '{v}'")
        self.stack("stop", "postgres")   # max_connections, shared_buffers: a restart
        self.stack("start", "postgres")
        self.psql("postgres", f"CREATE DATABASE {db}")
        self.settings["postgres"] = pg_settings
        self.settings["redis"] = ("scripts/stack.sh's, as Sluice's: appendonly yes, "
                                  "appendfsync everysec")

    def pids(self):
        d = {}
        for p in self.procs:
            d[p.label] = p.pid
        d["postgres"] = read_pid(os.path.join(self.stack_dir, "pg", "data", "postmaster.pid"))
        d["redis"] = read_pid(os.path.join(self.stack_dir, "redis", "redis.pid"))
        return d

    def launch(self, label, *args, env=None):
        path = os.path.join(self.bench.work, f"{self.name}-{label}.log")
        logf = open(path, "ab")
        p = subprocess.Popen([self.bin, *args], stdout=logf, stderr=logf,
                             stdin=subprocess.DEVNULL, cwd=self.dir, env=env)
        p.logf, p.label, p.log_path = logf, label, path
        self.procs.append(p)
        return p

    def run_once(self, label, *args, env=None, timeout=300):
        """Runs the peer's binary to its end; returns its output (raises when it fails)."""
        p = self.launch(label, *args, env=env)
        rc = p.wait(timeout)
        self.procs.remove(p)
        p.logf.close()
        with open(p.log_path, errors="replace") as f:
            out = f.read()
        if rc != 0:
            raise RuntimeError(f"{self.name} {' '.join(args)} exited {rc} (see {p.log_path})")
        return out

    def reported_version(self, args, env=None):
        """What the binary says of its version when run with args (its last line) and, when
        bench/peers/build-<name>.sh built it, the revision it was built from."""
        out = {}
        try:
            r = subprocess.run([self.bin, *args], capture_output=True, text=True, timeout=30,
                               env=env)
            out["reports"] = (r.stdout + r.stderr).strip().splitlines()[-1][:200]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            out["reports"] = "?"
        try:
            with open(self.bin + ".build-info") as f:
                out["build_info"] = f.read().strip().splitlines()
        except OSError:
            pass
        return out

    def stop(self):
        for p in reversed(self.procs):
            self.bench.stop_proc(p, timeout=30)
        self.procs = []
        try:
            self.stack("stop")
        except RuntimeError as ex:
            log(f"peers/{self.name}: {ex}")
        if os.environ.get("BENCH_KEEP_TMP") == "1":
            log(f"peers/{self.name}: kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class Convoy(Peer):
    name = "convoy"
    route = "POST /api/v1/projects/{id}/events"
    template = '{"endpoint_id":"%EP%","event_type":"' + EVENT_TYPE + '","data":' + DATA_JSON + "}"

    def __init__(self, bench, binary, port_base):
        super().__init__(bench, binary, port_base, CONVOY_STACK_OFFSET)
        self.port = port_base + CONVOY_OFFSET
        self.base = f"http://127.0.0.1:{self.port}"
        self.cfg_path = os.path.join(self.dir, "convoy.json")
        # BENCH_PEERS_CONVOY_TUNING=none: no PostgreSQL tuning and Convoy's default pool (for
        # finding out what the documented tuning changes; not what the phase reports)
        self.tuning = os.environ.get("BENCH_PEERS_CONVOY_TUNING", "docs")
        if self.tuning not in ("docs", "none"):
            raise RuntimeError(f"BENCH_PEERS_CONVOY_TUNING={self.tuning}: docs or none")
        self.settings = {"tuning": self.tuning}

    def start_stack(self):
        pg = convoy_pg_settings()
        if self.tuning == "none":   # scripts/stack.sh's PostgreSQL with max_connections 400
            pg = {"max_connections": pg["max_connections"]}
        super().start_stack(pg, "convoy")

    # Convoy ------------------------------------------------------------------------
    def write_config(self):
        cfg = {
            "env": "oss",
            "host": f"127.0.0.1:{self.port}",
            "database": {"type": "postgres", "scheme": "postgres", "host": "127.0.0.1",
                         "port": self.pg_port, "username": "sluice", "password": "bench",
                         "database": "convoy", "options": "sslmode=disable&connect_timeout=30",
                         # the agent's 100 consumers each hold a connection while they work
                         # (Convoy warns when max_open_conn < consumer_pool_size); idle
                         # connections kept, not re-opened per burst
                         "max_open_conn": 100, "max_idle_conn": 100, "conn_max_lifetime": 3600},
            "redis": {"scheme": "redis", "host": "127.0.0.1", "port": self.redis_port},
            "queue_provider": "redis",
            "server": {"http": {"port": self.port, "worker_port": self.port + 1,
                                "agent_port": self.port + 2, "ingest_port": self.port + 3}},
            "auth": {"native": {"enabled": True},
                     "jwt": {"enabled": True, "secret": secrets.token_hex(24),
                             "refresh_secret": secrets.token_hex(24), "expiry": 3600,
                             "refresh_expiry": 86400},
                     "is_signup_enabled": False},
            "logger": {"level": "error"},
            "analytics": {"enabled": False},
            "metrics": {"enabled": False},
            "retention_policy": {"enabled": False},
            "consumer_pool_size": 100,
        }
        if self.tuning == "none":
            for k in ("max_open_conn", "max_idle_conn"):
                del cfg["database"][k]
        with open(self.cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)
        shown = json.loads(json.dumps(cfg))
        shown["auth"]["jwt"]["secret"] = shown["auth"]["jwt"]["refresh_secret"] = "<random>"
        self.settings["convoy_json"] = shown

    def start(self):
        self.write_config()
        log("peers/convoy: convoy migrate up")
        self.run_once("migrate", "migrate", "up", "--config", self.cfg_path)
        srv = self.launch("server", "server", "--config", self.cfg_path)
        wait_http(self.base + "/healthz", "convoy server", proc=srv, logf=srv.log_path)
        agent = self.launch("agent", "agent", "--config", self.cfg_path)
        wait_http(f"http://127.0.0.1:{self.port + 2}/healthz", "convoy agent", proc=agent,
                  logf=agent.log_path)
        self.settings["processes"] = ["convoy server --config convoy.json",
                                      "convoy agent --config convoy.json"]

    def setup(self, receiver_port):
        """Superuser login, an organisation, an outgoing project (plain-http endpoints
        allowed), ENDPOINTS endpoints on the receiver and one catch-all subscription each.
        Returns (publish URL, project API key, endpoint ids)."""
        log(f"peers/convoy: organisation, project, {ENDPOINTS} endpoints and subscriptions")
        d = http_json("POST", self.base + "/ui/auth/login",
                      {"username": "superuser@default.com", "password": "default"})
        token = d["data"]["token"]["access_token"]
        org = http_json("POST", self.base + "/ui/organisations", {"name": "sluice-bench"},
                        token)["data"]["uid"]
        proj = http_json("POST", f"{self.base}/ui/organisations/{org}/projects",
                         {"name": "peers", "type": "outgoing",
                          "config": {"ssl": {"enforce_secure_endpoints": False}}},
                         token)["data"]
        key, pid = proj["api_key"]["key"], proj["project"]["uid"]
        eps = []
        for i in range(ENDPOINTS):
            ep = http_json("POST", f"{self.base}/api/v1/projects/{pid}/endpoints",
                           {"name": f"cv{i}", "url": f"http://127.0.0.1:{receiver_port}/ok/cv{i}",
                            "secret": secrets.token_hex(16)}, key)["data"]["uid"]
            # the automatic catch-all subscription is never created in this revision
            # (every event would fail with "empty subscriptions"): one per endpoint
            http_json("POST", f"{self.base}/api/v1/projects/{pid}/subscriptions",
                      {"name": f"cv{i}", "endpoint_id": ep}, key)
            eps.append(ep)
        return f"{self.base}/api/v1/projects/{pid}/events", key, eps

    def version(self):
        """`convoy version` (it reads the configuration first)."""
        return self.reported_version(["version", "--config", self.cfg_path])


def measure(bench, name, route, url, hdr, template, ep_file, n, warm, conns, pids, timeout):
    """The warm-up (delivered, not measured), then the n measured events."""
    res = {}
    if warm:
        log(f"peers/{name}: warm-up, {warm:,} events")
        res["warmup"] = run_workload(bench, f"{name}-warmup",
                                     publish_cmd(bench, url, hdr, template, ep_file, warm,
                                                 conns), warm, pids, timeout)
    log(f"peers/{name}: {n:,} events through {route}")
    res.update(run_workload(bench, name, publish_cmd(bench, url, hdr, template, ep_file, n,
                                                     conns), n, pids, timeout))
    return res


def write_lines(bench, name, lines):
    path = os.path.join(bench.work, f"peers-{name}-endpoints.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def run_peer(bench, cls, binary, n, warm, conns):
    """A peer (Convoy, Svix) from its own stack up: set up, warmed up, measured, stopped."""
    peer = cls(bench, binary, bench.port - 10)
    res = {"binary": binary}
    try:
        peer.start_stack()
        peer.start()
        res["version"] = peer.version()
        url, token, lines = peer.setup(bench.port)
        res.update(measure(bench, peer.name, peer.route, url, [f"Authorization: Bearer {token}"],
                           peer.template, write_lines(bench, peer.name, lines), n, warm, conns,
                           peer.pids(), max(900, n // 20)))
        res["settings"] = peer.settings
    finally:
        peer.stop()
    return res


# ---------------------------------------------------------------------------- Svix

class Svix(Peer):
    """svix-server (API and worker in one process, as its docker-compose.yml runs it) with
    its own PostgreSQL and Redis."""
    name = "svix"
    route = "POST /api/v1/app/{app_id}/msg/"
    template = ('{"eventType":"' + EVENT_TYPE + '","channels":["%EP%"],"payload":' + DATA_JSON
                + "}")

    def __init__(self, bench, binary, port_base):
        super().__init__(bench, binary, port_base, SVIX_STACK_OFFSET)
        self.port = port_base + SVIX_OFFSET
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = None

    def start_stack(self):
        # scripts/stack.sh's PostgreSQL (as Sluice's) with room for the pool of 100 and the
        # migration's connections: Svix's documentation tunes no PostgreSQL setting
        super().start_stack({"max_connections": "400"}, "svix")

    def write_env(self):
        """Svix's configuration, in its environment variables (config.default.toml names
        them). Defaults kept: queue_type redis, cache_type memory (the default, recommended
        for one instance), db_pool_max_size and redis_pool_max_size 100, worker_max_tasks 500,
        the retry schedule. Set: the DSNs, the secrets, loopback endpoints allowed
        (whitelist_subnets, as Svix's own tests set it), logging at error (RUST_LOG, which
        Svix reads before its log_level)."""
        cfg = {
            "SVIX_LISTEN_ADDRESS": f"127.0.0.1:{self.port}",
            "SVIX_DB_DSN": f"postgresql://sluice@127.0.0.1:{self.pg_port}/svix",
            "SVIX_REDIS_DSN": f"redis://127.0.0.1:{self.redis_port}",
            "SVIX_QUEUE_TYPE": "redis",
            "SVIX_CACHE_TYPE": "memory",
            "SVIX_JWT_SECRET": secrets.token_hex(24),
            "SVIX_MAIN_SECRET": secrets.token_hex(24),
            "SVIX_WHITELIST_SUBNETS": "[127.0.0.1/32]",
            "SVIX_ENDPOINT_HTTPS_ONLY": "false",
            "SVIX_OPENTELEMETRY_ADDRESS": "",
            "RUST_LOG": "error",
        }
        cfg = {k: v for k, v in cfg.items() if v != ""}
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SVIX_", "SLUICE_", "RUST_LOG"))}
        self.env.update(cfg)
        shown = dict(cfg)
        shown["SVIX_JWT_SECRET"] = shown["SVIX_MAIN_SECRET"] = "<random>"
        self.settings["environment"] = shown

    def start(self):
        self.write_env()
        # Svix reads .env and config.toml from its working directory or the nearest parent
        # that has them: empty ones here, so that no stray file in $TMPDIR or above changes
        # the configuration recorded in settings
        for name in (".env", "config.toml"):
            with open(os.path.join(self.dir, name), "w"):
                pass
        log("peers/svix: svix-server migrate")
        self.run_once("migrate", "migrate", env=self.env)
        srv = self.launch("server", env=self.env)
        wait_http(self.base + "/api/v1/health/", "svix-server", proc=srv, logf=srv.log_path)
        self.settings["processes"] = ["svix-server (API and worker)"]

    def setup(self, receiver_port):
        """A token for the default organisation (`svix-server jwt generate`), one
        application, ENDPOINTS endpoints on the receiver, each listening to a channel of its
        own, so that a message with that channel goes to that endpoint alone. Returns (publish
        URL, token, channel names)."""
        out = self.run_once("jwt", "jwt", "generate", env=self.env, timeout=60)
        token = None
        for line in out.splitlines():
            if line.startswith("Token (Bearer): "):
                token = line.split(": ", 1)[1].strip()
        if not token:
            raise RuntimeError("svix-server jwt generate printed no token")
        log(f"peers/svix: application and {ENDPOINTS} endpoints")
        app = http_json("POST", self.base + "/api/v1/app/", {"name": "sluice-bench"},
                        token)["id"]
        chans = []
        for i in range(ENDPOINTS):
            ch = f"sv{i}"
            http_json("POST", f"{self.base}/api/v1/app/{app}/endpoint/",
                      {"url": f"http://127.0.0.1:{receiver_port}/ok/{ch}", "channels": [ch],
                       "description": ch}, token)
            chans.append(ch)
        return f"{self.base}/api/v1/app/{app}/msg/", token, chans

    def version(self):
        return self.reported_version(["--version"], env=self.env)


# ---------------------------------------------------------------------------- Sluice

def run_sluice(bench, n, warm, conns):
    """sluice-api (2 threads) + one sluice-consumer (the e2e phase's settings) + the
    recorder writing every outcome into PostgreSQL, on the suite's stack."""
    api_port = bench.port + 1
    topics_env = bench.env("peers")
    bench.topics(topics_env)
    bench.new_redis_db(topics_env)
    redis_url = topics_env["SLUICE_REDIS_URL"]
    api_env = bench.env("peers", api_threads=2, api_listen=f"127.0.0.1:{api_port}",
                        api_max_connections=4096, log_level="warn")
    cons_cfg = {"max_inflight": bench.inflight, "max_inflight_per_endpoint": bench.per_ep,
                "consumer_threads": bench.threads}
    cons_env = bench.env("peers", **cons_cfg)
    rec_env = bench.env("peers", log_level="warn")
    for e in (api_env, cons_env, rec_env):
        e["SLUICE_REDIS_URL"] = redis_url
    if "peers_key" not in bench.registered:
        bench.registered["peers_key"] = json.loads(
            bench.ctl(api_env, "keys", "create", "--name", f"bench peers {bench.run_id}",
                      "--scopes", "publish", "--json").stdout)["key"]
    key = bench.registered["peers_key"]
    ep_file = os.path.join(bench.work, "peers-sluice-endpoints.txt")
    with open(ep_file, "w") as f:
        f.write("\n".join(f"{bench.ep_prefix}{i}" for i in range(ENDPOINTS)) + "\n")
    template = '{"type":"' + EVENT_TYPE + '","endpoint":"%EP%","body":' + DATA_JSON + "}"
    url = f"http://127.0.0.1:{api_port}/v1/events"
    hdr = [f"Authorization: Bearer {key}"]
    res = {"consumer_config": {"SLUICE_" + k.upper(): v for k, v in cons_cfg.items()},
           "api_threads": 2}
    procs = []
    try:
        logf = open(os.path.join(bench.work, "peers-api.log"), "ab")
        api = subprocess.Popen([bench.bin("api/sluice-api")], env=api_env, stdout=logf,
                               stderr=logf, stdin=subprocess.DEVNULL)
        api.logf, api.name, api.log_path = logf, "sluice-api", logf.name
        procs.append(api)
        wait_http(f"http://127.0.0.1:{api_port}/readyz", "sluice-api", proc=api,
                  logf=logf.name)
        cons = bench.start_consumer(cons_env, "peers-c0")
        procs.append(cons)
        bench.wait_assigned([cons], 8)
        rlog = open(os.path.join(bench.work, "peers-recorder.log"), "ab")
        rec = subprocess.Popen([bench.bin("recorder/sluice-recorder")], env=rec_env,
                               stdout=rlog, stderr=rlog, stdin=subprocess.DEVNULL)
        rec.logf, rec.name, rec.log_path = rlog, "sluice-recorder", rlog.name
        procs.append(rec)
        time.sleep(2)
        if rec.poll() is not None:
            raise RuntimeError(f"sluice-recorder exited {rec.returncode} (see {rlog.name})")
        pids = {"api": api.pid, "consumer": cons.pid, "broker": bench.broker_pid,
                "redis": bench.redis_pid, "recorder": rec.pid,
                "postgres": read_pid(os.path.join(bench.stack_dir, "pg", "data",
                                                  "postmaster.pid"))}
        res.update(measure(bench, "sluice", "POST /v1/events", url, hdr, template, ep_file, n,
                           warm, conns, pids, max(900, n // 200)))
    finally:
        for p in reversed(procs):
            bench.stop_proc(p)
        bench.delete_topics(topics_env)
    delivery = ("api", "consumer", "broker", "redis")
    c = res.get("cpu_ms_per_delivery") or {}
    if all(k in c for k in delivery):
        res["delivery_path_cpu_ms_per_delivery"] = round(sum(c[k] for k in delivery), 4)
    return res


# ---------------------------------------------------------------------------- the phase

def phase(bench):
    quick = bench.quick
    conns = int(os.environ.get("BENCH_PEERS_CONNS", "64"))
    n_sl = int(os.environ.get("BENCH_PEERS_SLUICE_EVENTS", "50000" if quick else "200000"))
    peers = []   # (name, label, binary, class, events)
    for name, label, env, cls, default in (
            ("convoy", "Convoy", CONVOY_ENV, Convoy, "3000" if quick else "10000"),
            ("svix", "Svix", SVIX_ENV, Svix, "10000" if quick else "40000")):
        binary = os.environ.get(env, "")
        if not binary:
            log(f"peers: {label} not run ({env} is not set; bench/peers/build-{name}.sh "
                "builds it and prints the line to set)")
            continue
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise RuntimeError(f"{env}={binary}: not an executable file")
        n = int(os.environ.get(f"BENCH_PEERS_{name.upper()}_EVENTS", default))
        peers.append((name, label, binary, cls, n))
    res = {"connections": conns, "endpoints": ENDPOINTS, "body_bytes": BODY_BYTES}
    if not peers:
        msg = (f"peers: skipped: no peer given (neither {CONVOY_ENV} nor {SVIX_ENV} is set; "
               "bench/peers/build-convoy.sh and bench/peers/build-svix.sh build them and print "
               "the line to set)")
        log(msg)
        res["skipped"] = msg
        return res
    bench.receiver = bench.start_receiver("peers")
    try:
        for name, label, binary, cls, n in peers:
            try:
                # a tenth of the events as warm-up: Convoy's agent loads endpoints and
                # subscriptions every 10 s, Svix caches an application's endpoints for 30 s
                res[name] = run_peer(bench, cls, binary, n, max(100, n // 10), conns)
            except Exception as ex:  # noqa: BLE001 -- any failure of one peer is its own
                log(f"peers/{name}: FAILED: {ex!r}\n{traceback.format_exc()}")
                res[name] = {"failed": repr(ex)[-1500:], "binary": binary}
        res["sluice"] = run_sluice(bench, n_sl, max(1000, n_sl * 3 // 4), conns)
    finally:
        bench.stop_proc(bench.receiver)
        bench.receiver = None
    sl = res["sluice"]
    for name, label, _, _, _ in peers:
        pr = res[name]
        pre = "" if name == "convoy" else f"{name}_"   # Convoy's keep their older names
        if pr.get("deliveries_per_s") and sl.get("deliveries_per_s"):
            res[pre + "rate_ratio"] = round(sl["deliveries_per_s"] / pr["deliveries_per_s"], 1)
        if pr.get("stack_cpu_ms_per_delivery") and sl.get("stack_cpu_ms_per_delivery"):
            res[pre + "cpu_ratio"] = round(pr["stack_cpu_ms_per_delivery"]
                                           / sl["stack_cpu_ms_per_delivery"], 1)
        log(f"peers: {label} {pr.get('deliveries_per_s')}/s at "
            f"{pr.get('stack_cpu_ms_per_delivery')} ms CPU per delivery; Sluice "
            f"{sl.get('deliveries_per_s')}/s at {sl.get('stack_cpu_ms_per_delivery')} ms; "
            f"x{res.get(pre + 'rate_ratio')} the rate, 1/{res.get(pre + 'cpu_ratio')} the CPU")
    return res
