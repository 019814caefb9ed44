"""The chaos suite's own stack: real Kafka, Redis and PostgreSQL from scripts/stack.sh, in a
private directory on private ports, so scenarios may kill and restart the services without
touching anybody else's stack. A second kind, KafkaCluster, is a three-node Kafka cluster
(stack.sh with SLUICE_STACK_KAFKA_NODES=3) for the scenarios that kill one broker of many; a
third, RedisCluster, is a Redis Cluster of six redis-server (three masters, three replicas)
for the scenario that kills a master.

Faults on the services go through the stack's pid files (kafka/kafka.pid, redis/redis.pid,
pg/data/postmaster.pid); `scripts/stack.sh start` then starts only what is down and waits
until it is ready again.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
# the one Redis client of the tests (RESP2, cluster routing, MOVED/ASK): tests/e2e/sluice_e2e.py
from sluice_e2e import RedisError, _Resp, cluster_slots, redis_all, redis_cmd  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STACK_SH = os.path.join(REPO, "scripts", "stack.sh")


def port_in_use(port):
    """Any TCP socket on this local port, listening or not (ss), so a client connection that
    happens to use the port as its ephemeral source port counts too."""
    r = subprocess.run(["ss", "-Htan", f"sport = :{port}"], capture_output=True, text=True)
    return bool(r.stdout.strip())


def pick_port_base(first, tries=20, step=10, span=4):
    """The first base from `first` (stepping by `step`) whose `span` stack ports are unused
    (4 for a stack; 9 when Kafka has three nodes: base+5..base+8 are nodes 2 and 3)."""
    for k in range(tries):
        base = first + k * step
        if not any(port_in_use(base + i) for i in range(span)):
            return base
    raise RuntimeError(f"no free port base among {first}..{first + tries * step} "
                       f"(set CHAOS_PORT_BASE)")


def read_pid(path):
    try:
        with open(path) as f:
            line = f.readline().strip()
        return int(line) if line.isdigit() else None
    except FileNotFoundError:
        return None


def pid_alive(pid):
    """Running (a zombie that nobody reaped yet counts as gone)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


class Stack:
    """One private stack. start() picks free ports; env() gives the client addresses."""

    services = ()   # stack.sh's default: kafka redis postgres
    kafka_nodes = 1
    span = 4

    def __init__(self, stack_dir=None, port_base=None, keep=False):
        self.own_dir = stack_dir is None
        self.dir = stack_dir or tempfile.mkdtemp(prefix="sluice-chaos-stack-", dir="/tmp")
        # Below Linux's ephemeral range (32768-60999 here): a stack port inside it can be
        # taken as a client's source port while its service restarts, and a client that
        # reconnects to a dead local port may even connect to itself (seen with Redis).
        self.first_base = int(port_base or 28000)
        self.base = None
        self.keep = keep
        self.addr = {}

    def _env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        if "SLUICE_CACHE_DIR" in os.environ:
            env["SLUICE_CACHE_DIR"] = os.environ["SLUICE_CACHE_DIR"]
        env["SLUICE_STACK_DIR"] = self.dir
        env["SLUICE_PORT_BASE"] = str(self.base)
        env["SLUICE_STACK_KAFKA_NODES"] = str(self.kafka_nodes)
        return env

    def sh(self, cmd, timeout=300, check=True):
        args = [cmd, *self.services] if cmd in ("start", "stop") else [cmd]
        r = subprocess.run(["bash", STACK_SH, *args], env=self._env(), capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"stack.sh {cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                               f"{r.stderr[-3000:]}")
        return r

    def start(self):
        """First start: retry on another port base when a port was taken meanwhile."""
        recorded = self._recorded_base()
        if recorded:
            # an existing stack dir (CHAOS_STACK_DIR): keep its ports
            self.base = recorded
            self.sh("start")
            self._read_env()
            return self
        base = self.first_base
        last = None
        for _ in range(3):
            self.base = pick_port_base(base, span=self.span)
            r = self.sh("start", check=False)
            if r.returncode == 0:
                self._read_env()
                return self
            last = r
            self.sh("reset", check=False)
            os.makedirs(self.dir, exist_ok=True)
            base = self.base + 10
        raise RuntimeError(f"could not start the chaos stack:\n{last.stdout[-3000:]}\n"
                           f"{last.stderr[-3000:]}")

    def _recorded_base(self):
        try:
            with open(os.path.join(self.dir, "ports.env")) as f:
                ports = dict(line.strip().split("=", 1) for line in f if "=" in line)
            return int(ports["kafka"])
        except (FileNotFoundError, KeyError, ValueError):
            return None

    def restart_down(self, timeout=240):
        """Start whatever is down (stack.sh start) and wait until ready. A port briefly held
        by another process's connection is retried for up to a minute."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.sh("start", timeout=timeout, check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline or "already in use" not in (r.stdout + r.stderr):
                raise RuntimeError(f"stack.sh start failed:\n{r.stdout[-3000:]}\n"
                                   f"{r.stderr[-3000:]}")
            time.sleep(2)

    def _read_env(self):
        out = self.sh("env").stdout
        for line in out.splitlines():
            line = line.strip()
            if not line.startswith("export "):
                continue
            k, _, v = line[len("export "):].partition("=")
            self.addr[k] = v.strip("'")

    def env(self):
        return dict(self.addr)

    # ---- pids and faults

    def kafka_pid(self):
        return read_pid(os.path.join(self.dir, "kafka", "kafka.pid"))

    def redis_pid(self):
        return read_pid(os.path.join(self.dir, "redis", "redis.pid"))

    def pg_pid(self):
        return read_pid(os.path.join(self.dir, "pg", "data", "postmaster.pid"))

    def _kill_wait(self, pid, sig, what, timeout=60, pid_file=None):
        assert pid_alive(pid), f"{what} is not running (pid {pid})"
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while pid_alive(pid):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} (pid {pid}) still alive {timeout}s after {sig}")
            time.sleep(0.05)
        # The services are daemons whose parent is init; until init reaps the dead one, its
        # zombie still answers kill -0 and stack.sh would take it for running. Wait for the
        # reaping, and if it does not come, drop the stale pid file.
        gone = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < gone:
            time.sleep(0.05)
        if os.path.exists(f"/proc/{pid}") and pid_file and read_pid(pid_file) == pid:
            os.unlink(pid_file)

    def kill_kafka(self, sig=signal.SIGKILL):
        self._kill_wait(self.kafka_pid(), sig, "kafka broker",
                        pid_file=os.path.join(self.dir, "kafka", "kafka.pid"))

    def bounce_kafka(self, down_s=3.0, sig=signal.SIGKILL, timeout=180):
        """Kill the broker, wait down_s, start it again with the very same command line
        (read from /proc before the kill), wait until it serves metadata. Faster than
        `stack.sh start` (no topic-creation tool JVM); the pid file is updated so the
        stack's stop still finds it. Returns the seconds the broker was unreachable."""
        pid = self.kafka_pid()
        assert pid_alive(pid), f"kafka broker is not running (pid {pid})"
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        cwd = os.readlink(f"/proc/{pid}/cwd")
        t0 = time.monotonic()
        self._kill_wait(pid, sig, "kafka broker")
        time.sleep(down_s)
        kdir = os.path.join(self.dir, "kafka")
        log = os.path.join(kdir, "broker.out")
        if os.path.exists(log):
            os.replace(log, log + ".prev")
        # detached like stack.sh does (setsid, parent exits), so the broker is not our child
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        out = subprocess.run(["bash", "-c", f"setsid {quoted} >'{log}' 2>&1 </dev/null & "
                              f"echo $!"], cwd=cwd, capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items()
                                  if not k.startswith("SLUICE_")}, timeout=30)
        new_pid = int(out.stdout.strip())
        with open(os.path.join(kdir, "kafka.pid"), "w") as f:
            f.write(f"{new_pid}\n")
        broker = self.addr["SLUICE_KAFKA_BROKERS"]
        deadline = time.monotonic() + timeout
        while True:
            assert pid_alive(new_pid), f"the restarted broker exited; see {log}"
            started = False
            try:
                with open(log, errors="replace") as f:
                    started = "Kafka Server started" in f.read()
            except FileNotFoundError:
                pass
            if started:
                r = subprocess.run(["kcat", "-b", broker, "-L", "-m", "5"], capture_output=True,
                                   text=True, timeout=30)
                if r.returncode == 0 and "broker 1 at" in r.stdout:
                    return time.monotonic() - t0
            assert time.monotonic() < deadline, f"broker not back after {timeout}s; see {log}"
            time.sleep(0.25)

    def kill_redis(self, sig=signal.SIGKILL):
        self._kill_wait(self.redis_pid(), sig, "redis",
                        pid_file=os.path.join(self.dir, "redis", "redis.pid"))

    def start_redis(self, timeout=60):
        """Start Redis again from the config stack.sh wrote (AOF on), without the rest of
        `stack.sh start` (which also checks Kafka and migrates PostgreSQL): about 0.2 s, so a
        fault can be kept shorter than the pods' timeouts. Waits for PONG."""
        conf = os.path.join(self.dir, "redis", "redis.conf")
        port = self.addr["SLUICE_REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run(["redis-server", conf], capture_output=True, text=True,
                               timeout=30)
            if r.returncode == 0:
                break
            assert time.monotonic() < deadline, f"redis-server did not start: {r.stderr}"
            time.sleep(1)  # e.g. its port still held by a closing connection
        while True:
            r = subprocess.run(["redis-cli", "-p", port, "PING"], capture_output=True,
                               text=True, timeout=10)
            if r.stdout.strip() == "PONG":
                return
            assert time.monotonic() < deadline, "redis did not answer PING after its restart"
            time.sleep(0.05)

    def stop_pg_immediate(self):
        """SIGQUIT to the postmaster: PostgreSQL's immediate shutdown (crash-like: no
        checkpoint, recovery on the next start)."""
        self._kill_wait(self.pg_pid(), signal.SIGQUIT, "postgres")

    def stop(self):
        """Stop the services and delete the dir (keep=True: leave both for a post-mortem)."""
        if self.keep:
            return
        try:
            self.sh("stop", timeout=180, check=False)
        finally:
            if self.own_dir and not self.keep:
                shutil.rmtree(self.dir, ignore_errors=True)


class KafkaCluster(Stack):
    """Three Kafka nodes (combined broker+controller, replication factor 3,
    min.insync.replicas 2) and nothing else: the scenarios use Redis and PostgreSQL of the
    session stack. Node i's pid file is kafka/kafka.pid (i = 1) or kafka/node<i>/kafka.pid."""

    services = ("kafka",)
    kafka_nodes = 3
    span = 9

    def node_pid(self, i):
        sub = "" if i == 1 else f"node{i}"
        return read_pid(os.path.join(self.dir, "kafka", sub, "kafka.pid"))

    def metadata(self, topic):
        """kcat's metadata of topic (JSON): brokers, and per partition leader/replicas/isrs."""
        r = subprocess.run(["kcat", "-b", self.addr["SLUICE_KAFKA_BROKERS"], "-L", "-J",
                            "-t", topic, "-m", "5"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"kcat metadata of {topic} failed: {r.stderr}")
        import json
        return json.loads(r.stdout)

    def leaders(self, topic):
        """partition -> leader node id (-1: none)."""
        md = self.metadata(topic)
        t = [t for t in md["topics"] if t["topic"] == topic][0]
        return {p["partition"]: p["leader"] for p in t["partitions"]}

    def in_sync(self, topic):
        """partition -> number of in-sync replicas."""
        md = self.metadata(topic)
        t = [t for t in md["topics"] if t["topic"] == topic][0]
        return {p["partition"]: len(p["isrs"]) for p in t["partitions"]}

    def kill_node(self, i, sig=signal.SIGKILL):
        sub = "" if i == 1 else f"node{i}"
        self._kill_wait(self.node_pid(i), sig, f"kafka node {i}",
                        pid_file=os.path.join(self.dir, "kafka", sub, "kafka.pid"))


# ---------------------------------------------------------------------------- Redis Cluster


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def redis_at(port, *args, timeout=5.0):
    """One command to one node on 127.0.0.1 (an admin command: CLUSTER, INFO, PING...); an
    error reply raises RedisError, a node that does not answer OSError."""
    c = _Resp("127.0.0.1", port, timeout=timeout)
    try:
        return c.call(*args)
    finally:
        c.close()


def _info(text):
    """INFO / CLUSTER INFO text -> dict of its key:value lines."""
    if isinstance(text, bytes):
        text = text.decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class RedisCluster(Stack):
    """A Redis Cluster of six redis-server on 127.0.0.1: three masters with one replica each
    (`redis-cli --cluster create --cluster-replicas 1`), cluster-node-timeout 2000 ms, the
    stack's persistence (appendonly yes, appendfsync everysec, no RDB snapshots), and nothing
    else: the scenarios use Kafka and PostgreSQL of the session stack. Client ports
    base..base+5; cluster bus ports base+6..base+11, set with cluster-port (the default, port
    + 10000, would fall into the ephemeral range: F4 in docs/CHAOS.md). Node i (0..5) keeps
    redis.conf, nodes.conf, its AOF, redis.log and redis.pid in <dir>/node<i>.

    Faults go by pid (kill_node). restart_node starts a node again from its config: it rejoins
    with its nodes.conf, and a master that was failed over comes back as a replica of the
    replica that took its place. Nodes are named by index; `cmd` routes a command by its key
    (the first argument) and follows MOVED and ASK, for inspecting a world's Redis state."""

    SLOTS = 16384
    NODES = 6
    NODE_TIMEOUT_MS = 2000
    span = 12

    def __init__(self, stack_dir=None, port_base=None, keep=False):
        super().__init__(stack_dir=stack_dir, port_base=port_base, keep=keep)
        os.makedirs(self.dir, exist_ok=True)

    # ---- layout

    def port(self, i):
        return self.base + i

    def index(self, port):
        return port - self.base

    def node_dir(self, i):
        return os.path.join(self.dir, f"node{i}")

    def node_pid(self, i):
        return read_pid(os.path.join(self.node_dir(i), "redis.pid"))

    def url(self):
        """The Sluice URL: every node as a seed (database 0 is the only one)."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{self.port(i)}"
                                             for i in range(self.NODES))

    def env(self):
        return {"SLUICE_REDIS_URL": self.url()}

    def alive(self, i):
        return pid_alive(self.node_pid(i))

    # ---- start and stop

    def start(self, timeout=90):
        """Six fresh nodes, the cluster created, every slot served with a replica behind
        every master. Retried on another port base when a port was taken meanwhile."""
        self.stop_nodes()  # a cluster left running in this dir (CHAOS_KEEP=1)
        base = self.first_base
        last = None
        for _ in range(3):
            self.base = pick_port_base(base, step=20, span=self.span)
            try:
                self._create(timeout)
                self.addr = self.env()
                return self
            except (AssertionError, RuntimeError, OSError) as ex:
                last = ex
                self.stop_nodes()
                base = self.base + 20
        raise RuntimeError(f"could not start the redis cluster: {last}")

    def _write_conf(self, i):
        d = self.node_dir(i)
        with open(os.path.join(d, "redis.conf"), "w") as f:
            f.write(f"""# Written by tests/chaos/chaos_stack.py (RedisCluster).
bind 127.0.0.1
port {self.port(i)}
cluster-port {self.port(i) + self.NODES}
protected-mode yes
daemonize yes
pidfile {d}/redis.pid
logfile {d}/redis.log
dir {d}
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout {self.NODE_TIMEOUT_MS}
appendonly yes
appendfsync everysec
appenddirname appendonlydir
save ""
# a replica's full sync starts at once (the default waits 5 s for more replicas to share it)
repl-diskless-sync-delay 0
always-show-logo no
""")

    def _launch(self, i, timeout=30):
        """redis-server with node i's config (it daemonizes); wait for PONG (its AOF loaded)."""
        conf = os.path.join(self.node_dir(i), "redis.conf")
        r = subprocess.run(["redis-server", conf], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"redis-server node {i} failed: {r.stdout}{r.stderr}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if redis_at(self.port(i), "PING", timeout=1) == "PONG":
                    return
            except (OSError, RedisError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis node {i} (port {self.port(i)}) did not answer PING "
                                   f"within {timeout}s:\n{self.log_tail(i)}")
            time.sleep(0.05)

    def log_tail(self, i, n=2000):
        try:
            with open(os.path.join(self.node_dir(i), "redis.log"), errors="replace") as f:
                return f.read()[-n:]
        except FileNotFoundError:
            return "(no log)"

    def _create(self, timeout):
        for i in range(self.NODES):
            shutil.rmtree(self.node_dir(i), ignore_errors=True)
            os.makedirs(self.node_dir(i))
            self._write_conf(i)
        for i in range(self.NODES):
            self._launch(i)
        # the first three nodes become the masters, the others their replicas
        r = subprocess.run(["redis-cli", "--cluster", "create",
                            *(f"127.0.0.1:{self.port(i)}" for i in range(self.NODES)),
                            "--cluster-replicas", "1", "--cluster-yes"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0 or f"All {self.SLOTS} slots covered" not in r.stdout:
            raise RuntimeError(f"redis-cli --cluster create failed ({r.returncode}):\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
        self.wait_healthy(timeout)

    def stop_nodes(self, timeout=20):
        """SIGTERM to every running node (a clean shutdown: the AOF is flushed), repeated
        every second (a node refuses one while it writes its first AOF after a full sync,
        "Writing initial AOF, can't exit"), SIGKILL to one still there after timeout s."""
        pids = [p for p in (self.node_pid(i) for i in range(self.NODES))
                if pid_alive(p) and _comm(p) == "redis-server"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [p for p in pids if pid_alive(p)]
            if not left:
                return
            for p in left:
                try:
                    os.kill(p, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            again = time.monotonic() + 1
            while time.monotonic() < again and any(pid_alive(p) for p in left):
                time.sleep(0.05)
        for p in pids:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)

    def stop(self):
        """Stop every node and delete the dir (keep=True: leave both for a post-mortem)."""
        if self.keep:
            return
        try:
            self.stop_nodes()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- what the cluster says

    def cluster_info(self, i):
        return _info(redis_at(self.port(i), "CLUSTER", "INFO"))

    def info(self, i, section="replication"):
        return _info(redis_at(self.port(i), "INFO", section))

    def nodes_view(self, i):
        """CLUSTER NODES as node i sees it: one dict per node (index, id, flags, master:
        the index of its master or None, slots: [(first, last), ...], link)."""
        text = redis_at(self.port(i), "CLUSTER", "NODES").decode()
        rows, ids = [], {}
        for line in text.splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            port = int(f[1].split("@")[0].rsplit(":", 1)[1])
            slots = []
            for s in f[8:]:
                if s.startswith("["):
                    continue  # a slot being migrated or imported
                a, _, b = s.partition("-")
                slots.append((int(a), int(b or a)))
            ids[f[0]] = self.index(port)
            rows.append({"index": self.index(port), "id": f[0], "flags": set(f[2].split(",")),
                         "master": f[3], "slots": sorted(slots), "link": f[7]})
        for r in rows:
            r["master"] = ids.get(r["master"]) if r["master"] != "-" else None
        return sorted(rows, key=lambda r: r["index"])

    @staticmethod
    def _shape(view):
        """What every node must agree on: each node's role, master and slots."""
        return [(r["index"], "master" in r["flags"], r["master"], tuple(r["slots"]))
                for r in view]

    def masters(self, i=None):
        """master index -> its slot ranges, for the masters that serve slots (as node i, or
        the first live node, sees it)."""
        i = self._live() if i is None else i
        return {r["index"]: r["slots"] for r in self.nodes_view(i)
                if "master" in r["flags"] and "fail" not in r["flags"] and r["slots"]}

    def replicas_of(self, m, i=None):
        i = self._live() if i is None else i
        return [r["index"] for r in self.nodes_view(i)
                if r["master"] == m and "fail" not in r["flags"]]

    def owner(self, slot, i=None):
        """Index of the master serving slot."""
        for m, ranges in self.masters(i).items():
            if any(a <= slot <= b for a, b in ranges):
                return m
        return None

    def _live(self):
        for i in range(self.NODES):
            if self.alive(i):
                return i
        raise AssertionError("no redis cluster node is running")

    def health(self, down=()):
        """Problems with the cluster as the running nodes (except `down`) see it, [] when
        none: cluster_state ok with every slot served, one view of roles and slots on every
        node, three masters serving all 16384 slots, and each master with one replica whose
        replication link is up."""
        nodes = [i for i in range(self.NODES) if i not in down]
        problems, shapes = [], {}
        for i in nodes:
            try:
                ci = self.cluster_info(i)
                view = self.nodes_view(i)
            except (OSError, RedisError) as ex:
                problems.append(f"node {i}: {ex}")
                continue
            if ci.get("cluster_state") != "ok" or ci.get("cluster_slots_ok") != str(self.SLOTS):
                problems.append(f"node {i}: cluster_state {ci.get('cluster_state')}, "
                                f"{ci.get('cluster_slots_ok')} slots ok")
            shapes[i] = self._shape(view)
        if len(set(map(tuple, shapes.values()))) > 1:
            problems.append(f"the nodes disagree about roles or slots: {shapes}")
        if problems or not shapes:
            return problems or ["no node answered"]
        view = self.nodes_view(nodes[0])
        masters = [r for r in view if "master" in r["flags"] and r["slots"]]
        covered = sum(b - a + 1 for r in masters for a, b in r["slots"])
        if len(masters) != 3 or covered != self.SLOTS:
            problems.append(f"{len(masters)} masters serve {covered} slots")
        for m in masters:
            if "fail" in m["flags"] or "fail?" in m["flags"]:
                problems.append(f"master {m['index']} is flagged {m['flags']}")
            reps = [r for r in view if r["master"] == m["index"] and not
                    ({"fail", "fail?"} & r["flags"])]
            if not reps:
                problems.append(f"master {m['index']} has no replica")
            for r in reps:
                if r["index"] in down:
                    continue
                link = self.info(r["index"]).get("master_link_status")
                if link != "up":
                    problems.append(f"replica {r['index']} of {m['index']}: link {link}")
        return problems

    def wait_healthy(self, timeout=60, down=()):
        deadline = time.monotonic() + timeout
        while True:
            try:
                problems = self.health(down)
            except (OSError, RedisError) as ex:
                problems = [str(ex)]
            if not problems:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"redis cluster not healthy after {timeout}s: "
                                     f"{problems}")
            time.sleep(0.1)

    # ---- faults

    def kill_node(self, i, sig=signal.SIGKILL):
        self._kill_wait(self.node_pid(i), sig, f"redis node {i} (port {self.port(i)})",
                        pid_file=os.path.join(self.node_dir(i), "redis.pid"))

    def wait_failover(self, dead, slots, timeout=60):
        """After master `dead` was killed: until every other node reports cluster_state ok
        and serves `slots` (its ranges) from another master. Returns that master's index."""
        others = [i for i in range(self.NODES) if i != dead]
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                owners = set()
                ok = True
                for i in others:
                    if self.cluster_info(i).get("cluster_state") != "ok":
                        ok = False
                        break
                    owners.add(self.owner(slots[0][0], i))
                if ok and len(owners) == 1 and None not in owners and dead not in owners:
                    new = owners.pop()
                    if all(self.owner(a, new) == new and self.owner(b, new) == new
                           for a, b in slots):
                        return new
                last = owners
            except (OSError, RedisError) as ex:
                last = ex
            if time.monotonic() > deadline:
                raise AssertionError(f"no failover of redis node {dead} within {timeout}s "
                                     f"(last: {last})")
            time.sleep(0.05)

    def restart_node(self, i, timeout=60):
        """Start node i again from its config and wait until the cluster is whole again (it
        rejoins; a failed-over master as a replica, its link up)."""
        self._launch(i, timeout=timeout)
        self.wait_healthy(timeout)

    # ---- reading a world's state

    def cmd(self, *args, timeout=30.0):
        """One command routed by its key (redis_cmd of sluice_e2e: the master of the key's
        slot, MOVED and ASK followed); while a failover is under way (CLUSTERDOWN,
        TRYAGAIN, a dead node) it retries with a fresh slot map for up to timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return redis_cmd(self.url(), *args)
            except (OSError, RedisError) as ex:
                kind = str(ex).split(" ", 1)[0]
                retry = isinstance(ex, OSError) or kind in ("CLUSTERDOWN", "TRYAGAIN")
                if not retry or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
            cluster_slots(self.url(), refresh=True)

    def on_masters(self, *args):
        """A keyless command (FLUSHALL, DBSIZE, ...) on every master: {index: reply}."""
        return {m: redis_at(self.port(m), *args) for m in self.masters()}

    def scan_keys(self, pattern):
        """Every key matching pattern, from every master."""
        return redis_all(self.url(), "SCAN", "0", "MATCH", pattern, "COUNT", 1000)[1]
