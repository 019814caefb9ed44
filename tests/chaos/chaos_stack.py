"""The chaos suite's own stack: real Kafka, Redis and PostgreSQL from scripts/stack.sh, in a
private directory on private ports, so scenarios may kill and restart the services without
touching anybody else's stack. A second kind, KafkaCluster, is a three-node Kafka cluster
(stack.sh with SLUICE_STACK_KAFKA_NODES=3) for the scenarios that kill one broker of many.

Faults on the services go through the stack's pid files (kafka/kafka.pid, redis/redis.pid,
pg/data/postmaster.pid); `scripts/stack.sh start` then starts only what is down and waits
until it is ready again.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time

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
