"""End-to-end test harness: real Kafka, Redis and PostgreSQL (from scripts/stack.sh, addresses
in SLUICE_* variables exported by scripts/test.sh), real Sluice binaries, and the scripted
sluice-receiver as the endpoints.

Each World gets its own topics, consumer groups, Redis database and endpoint ids, so tests
never see each other's records. On a Redis Cluster (SLUICE_REDIS_URL=redis-cluster://...,
database 0 only) a World has the whole cluster instead: worlds wait for each other, and each
flushes every master at its start. A missing service or binary fails the test with a reason;
nothing is skipped.
"""

import base64
import json
import os
import random
import secrets
import signal
import string
import subprocess
import time

import pytest

REQUIRED_ENV = ("SLUICE_KAFKA_BROKERS", "SLUICE_REDIS_URL", "SLUICE_PG_DSN", "SL_BINARY_DIR")


def need_env(name):
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"{name} is not set: run the suite through scripts/test.sh, which starts "
                    f"the stack and exports it", pytrace=False)
    return v


def wait_until(pred, timeout, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def rand_suffix(n=8):
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(n))


class RedisError(RuntimeError):
    """An error reply (-ERR ..., -MOVED ...): its text without the leading '-'."""


class _Resp:
    """One RESP2 connection (stdlib only)."""

    def __init__(self, host, port, timeout=5):
        import socket
        self.s = socket.create_connection((host, int(port)), timeout=timeout)
        self.f = self.s.makefile("rb")

    def call(self, *parts):
        out = f"*{len(parts)}\r\n".encode()
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
        self.s.sendall(out)
        return self._read()

    def _read(self):
        f = self.f
        raw = f.readline()
        if not raw.endswith(b"\r\n"):
            raise ConnectionError("the Redis connection closed in the middle of a reply")
        line = raw[:-2]
        t, body = line[:1], line[1:]
        if t == b"+":
            return body.decode()
        if t == b"-":
            raise RedisError(body.decode())
        if t == b":":
            return int(body)
        if t == b"$":
            n = int(body)
            if n < 0:
                return None
            data = f.read(n + 2)[:-2]
            return data
        if t == b"*":
            n = int(body)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError(f"bad reply {line!r}")

    def close(self):
        try:
            self.f.close()
        finally:
            self.s.close()


CLUSTER_SCHEME = "redis-cluster://"


def is_cluster_url(url):
    return url.startswith(CLUSTER_SCHEME)


def parse_redis_url(url):
    """redis://[user:password@]host:port[/db] or
    redis-cluster://[user:password@]host:port[,host:port...] (the formats sluice accepts):
    {"cluster": bool, "nodes": [(host, port)...], "user", "password", "db"}."""
    from urllib.parse import unquote
    cluster = is_cluster_url(url)
    scheme = CLUSTER_SCHEME if cluster else "redis://"
    if not url.startswith(scheme):
        raise ValueError(f"not a Redis URL: {url!r}")
    rest = url[len(scheme):]
    hosts, _, db = rest.partition("/")
    user = password = None
    if "@" in hosts:
        cred, _, hosts = hosts.rpartition("@")
        if ":" in cred:
            u, _, pw = cred.partition(":")
            user, password = unquote(u) or None, unquote(pw)
        else:
            password = unquote(cred)
    nodes = []
    for hp in hosts.split(","):
        host, _, port = hp.rpartition(":")
        nodes.append((host, int(port)))
    if cluster and db:
        raise ValueError(f"a Redis Cluster URL has no /db part: {url!r}")
    return {"cluster": cluster, "nodes": nodes, "user": user, "password": password,
            "db": db}


def _connect(u, host, port):
    c = _Resp(host, port)
    try:
        if u["password"] is not None:
            c.call(*(["AUTH", u["user"]] if u["user"] else ["AUTH"]), u["password"])
        if u["db"]:
            c.call("SELECT", u["db"])
    except BaseException:
        c.close()
        raise
    return c


def _node_call(u, host, port, *args, asking=False):
    c = _connect(u, host, port)
    try:
        if asking:
            c.call("ASKING")
        return c.call(*args)
    finally:
        c.close()


def crc16_xmodem(data):
    """CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key):
    """The cluster slot of key (str or bytes): CRC16 of the hash tag ({...}, the first '{' up
    to the first '}' after it, when not empty) or of the whole key, modulo 16384."""
    k = key if isinstance(key, bytes) else str(key).encode()
    s = k.find(b"{")
    if s >= 0:
        e = k.find(b"}", s + 1)
        if e > s + 1:
            k = k[s + 1:e]
    return crc16_xmodem(k) % 16384


# Commands without a key that redis_cmd runs on every master of a cluster, combining the
# replies (redis_all): what the tests ask of "the database".
CLUSTER_ALL_MASTERS = {"FLUSHALL", "FLUSHDB", "DBSIZE", "KEYS", "SCAN"}
# Commands whose first key is not argv[1]: the index of the key, or of numkeys (EVAL...).
_KEY_AT = {"MEMORY": 2, "OBJECT": 2, "XINFO": 2, "XGROUP": 2}
_NUMKEYS_AT = {"EVAL": 2, "EVALSHA": 2, "EVAL_RO": 2, "EVALSHA_RO": 2, "FCALL": 2,
               "FCALL_RO": 2}
# Commands without a key: on a cluster they concern one node, so redis_cmd refuses them there
# (use redis_all or redis_node_cmd).
_KEYLESS = {"PING", "INFO", "TIME", "ECHO", "CLUSTER", "CLIENT", "ACL", "CONFIG", "SCRIPT",
            "FUNCTION", "DEBUG", "COMMAND", "LATENCY", "SLOWLOG", "SAVE", "BGSAVE",
            "BGREWRITEAOF", "LASTSAVE", "WAIT", "RANDOMKEY", "SELECT", "SWAPDB", "ROLE",
            "REPLICAOF", "SLAVEOF", "FAILOVER", "SHUTDOWN", "MULTI", "EXEC", "PUBLISH", "HELLO",
            "AUTH", "READONLY", "READWRITE", "MONITOR", "MODULE", "LOLWUT"}

_slot_maps = {}  # cluster URL -> [(first slot, last slot, (host, port))]


def cluster_slots(url, refresh=False):
    """The slot map of the cluster behind a redis-cluster:// URL, from CLUSTER SLOTS asked of
    the first seed that answers: [(first, last, (host, port) of the master)], cached per URL
    until refresh (redis_cmd refreshes it on MOVED)."""
    if not refresh and url in _slot_maps:
        return _slot_maps[url]
    u = parse_redis_url(url)
    errors = []
    for host, port in u["nodes"]:
        try:
            reply = _node_call(u, host, port, "CLUSTER", "SLOTS")
        except (OSError, RuntimeError) as e:
            errors.append(f"{host}:{port}: {e}")
            continue
        m = []
        for r in reply:
            h = r[2][0].decode() if r[2][0] else host   # an empty host: the node asked
            m.append((int(r[0]), int(r[1]), (h, int(r[2][1]))))
        m.sort()
        _slot_maps[url] = m
        return m
    raise RuntimeError(f"no seed of {url} answered CLUSTER SLOTS: {'; '.join(errors)}")


def cluster_masters(url):
    """(host, port) of every master that owns slots, in slot order."""
    out = []
    for _, _, addr in cluster_slots(url, refresh=True):
        if addr not in out:
            out.append(addr)
    return out


def _master_of(url, slot):
    for first, last, addr in cluster_slots(url):
        if first <= slot <= last:
            return addr
    m = cluster_slots(url, refresh=True)
    for first, last, addr in m:
        if first <= slot <= last:
            return addr
    raise RuntimeError(f"slot {slot} is not served by any node of {url}: {m}")


def _cmd_name(arg):
    return (arg.decode() if isinstance(arg, bytes) else str(arg)).upper()


def _key_of(args):
    """The key that routes args on a cluster, or None when the command has none."""
    name = _cmd_name(args[0])
    if name in _NUMKEYS_AT:
        i = _NUMKEYS_AT[name]
        if len(args) > i + 1 and int(args[i]) > 0:
            return args[i + 1]
        return None
    i = _KEY_AT.get(name, 1)
    if name in _KEYLESS or name in CLUSTER_ALL_MASTERS or len(args) <= i:
        return None
    return args[i]


def redis_node_cmd(url, host, port, *args):
    """One command on one node (host:port) with the credentials of url."""
    return _node_call(parse_redis_url(url), host, port, *args)


def redis_all(url, *args):
    """Run a keyless command on every master (a redis:// URL: on its one server, its db) and
    combine the replies as one server would answer: integers summed (DBSIZE), lists
    concatenated (KEYS), equal status replies once ("OK" of FLUSHALL); SCAN runs a whole
    iteration on each node and answers [b"0", every key] (its cursor argument is ignored)."""
    u = parse_redis_url(url)
    nodes = cluster_masters(url) if u["cluster"] else u["nodes"][:1]
    name = _cmd_name(args[0])
    replies = []
    for host, port in nodes:
        if name == "SCAN":
            keys, cursor = [], "0"
            while True:
                cursor, batch = _node_call(u, host, port, "SCAN", cursor, *args[2:])
                keys += batch
                if cursor in (b"0", "0"):
                    break
            replies.append([b"0", keys])
        else:
            replies.append(_node_call(u, host, port, *args))
    if name == "SCAN":
        return [b"0", [k for r in replies for k in r[1]]]
    if all(isinstance(r, int) for r in replies):
        return sum(replies)
    if all(isinstance(r, list) for r in replies):
        return [x for r in replies for x in r]
    if len(set(map(repr, replies))) == 1:
        return replies[0]
    return replies


def redis_cmd(url, *args):
    """Tiny RESP client (stdlib only) for test set-up: FLUSHDB, ZCARD, HGETALL...

    url is a redis:// URL (its /db is SELECTed) or a redis-cluster:// URL: then a command
    goes to the master of its key's slot (CRC16 of the hash tag, following MOVED once and
    ASK), the keyless FLUSHALL, FLUSHDB, DBSIZE, KEYS and SCAN run on every master, combined
    (redis_all), and other keyless commands are refused (redis_node_cmd runs one on a node)."""
    u = parse_redis_url(url)
    if not u["cluster"]:
        host, port = u["nodes"][0]
        return _node_call(u, host, port, *args)
    name = _cmd_name(args[0])
    if name in CLUSTER_ALL_MASTERS:
        return redis_all(url, *args)
    key = _key_of(args)
    if key is None:
        raise ValueError(f"redis_cmd: {name} has no key to route it on the Redis Cluster "
                         f"{url}: use redis_all (every master) or redis_node_cmd (one node)")
    addr = _master_of(url, key_slot(key))
    try:
        return _node_call(u, *addr, *args)
    except RedisError as e:
        kind, _, rest = str(e).partition(" ")
        if kind not in ("MOVED", "ASK"):
            raise
        host, _, port = rest.split(" ")[1].rpartition(":")
        if kind == "MOVED":
            cluster_slots(url, refresh=True)
        return _node_call(u, host or addr[0], int(port), *args, asking=kind == "ASK")


class Proc:
    def __init__(self, args, env, log_path):
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.p = subprocess.Popen(args, env=env, stdout=self.log, stderr=self.log,
                                  stdin=subprocess.DEVNULL)

    def alive(self):
        return self.p.poll() is None

    def term(self, timeout=60):
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        finally:
            self.log.close()

    def kill9(self):
        if self.alive():
            self.p.kill()
        self.p.wait(30)
        self.log.close()

    def stop(self, sig):
        self.p.send_signal(sig)

    def logs(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def log_lines(self):
        """The complete log lines (a last one without its newline is still being written)."""
        text = self.logs()
        return text[:text.rfind("\n") + 1].splitlines()

    def events(self, name):
        """The parsed log lines whose "event" is name, in order (lines that are not JSON,
        such as a crash message, are skipped)."""
        out = []
        for line in self.log_lines():
            if f'"event":"{name}"' not in line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


class Receiver:
    def __init__(self, world, secrets_list=(), extra=()):
        self.ledger_path = os.path.join(world.dir, f"ledger-{rand_suffix(4)}.jsonl")
        args = [world.bin("tests/receiver/sluice-receiver"), "--port", "0",
                "--ledger", self.ledger_path]
        for s in secrets_list:
            args += ["--secret", s]
        args += list(extra)
        self.log = open(os.path.join(world.dir, "receiver.log"), "ab")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log,
                                  stdin=subprocess.DEVNULL)
        line = self.p.stdout.readline().decode().strip()
        assert line.startswith("port="), f"receiver did not report its port: {line!r}"
        self.port = int(line[5:])
        self.base = f"http://127.0.0.1:{self.port}"

    def url(self, behaviour, endpoint):
        return f"{self.base}/{behaviour}/{endpoint}"

    def ledger(self):
        """Every complete ledger line. The receiver appends while we read, so a last line
        without its newline is still being written: it is left for the next read (a
        malformed complete line still fails the parse)."""
        out = []
        try:
            with open(self.ledger_path) as f:
                for line in f:
                    if not line.endswith("\n"):
                        break
                    line = line.strip()
                    if line:
                        out.append(json.loads(line))
        except FileNotFoundError:
            pass
        return out

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(30)
        self.log.close()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    """A running sluice-api: .base ("http://127.0.0.1:<port>"), .port and .proc (a Proc)."""

    def __init__(self, proc, port):
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path, timeout=5):
        """GET path without a key: (status, parsed JSON or None); (0, None) when no answer."""
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            text = r.read()
            try:
                return r.status, json.loads(text) if text else None
            except ValueError:
                return r.status, None
        except OSError:
            return 0, None
        finally:
            c.close()

    def wait_ready(self, timeout):
        """True once GET /readyz answers 200 (listening, API keys loaded, producer healthy);
        False when the process exits or time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                return False
            if self.get("/readyz", timeout=2)[0] == 200:
                return True
            time.sleep(0.1)
        return False


class World:
    """One isolated set of topics, groups, Redis db and endpoints on the shared stack."""

    def __init__(self, tmpdir, partitions=4, **cfg):
        for name in REQUIRED_ENV:
            need_env(name)
        self.dir = str(tmpdir)
        self.bindir = os.environ["SL_BINARY_DIR"]
        self.tag = rand_suffix()
        self.secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        stack_redis = os.environ["SLUICE_REDIS_URL"]
        if is_cluster_url(stack_redis):
            # a cluster has database 0 only: one World at a time has it, flushed
            self._lock_redis_cluster(stack_redis)
            self.redis_url = stack_redis
        else:
            base_redis = stack_redis.split("/")[0:3]
            db = self._lock_redis_db(base_redis)
            self.redis_url = "/".join(base_redis) + f"/{db}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        self.env.update({
            "SLUICE_KAFKA_BROKERS": os.environ["SLUICE_KAFKA_BROKERS"],
            "SLUICE_PG_DSN": os.environ["SLUICE_PG_DSN"],
            "SLUICE_REDIS_URL": self.redis_url,
            "SLUICE_TOPIC_DELIVERIES": f"t{self.tag}.deliveries",
            "SLUICE_TOPIC_OUTCOMES": f"t{self.tag}.outcomes",
            "SLUICE_TOPIC_QUARANTINE": f"t{self.tag}.quarantine",
            "SLUICE_TOPIC_ENDPOINTS": f"t{self.tag}.endpoints",
            "SLUICE_CONSUMER_GROUP": f"g{self.tag}.consumers",
            "SLUICE_RECORDER_GROUP": f"g{self.tag}.recorder",
            "SLUICE_MASTER_KEY": secrets.token_hex(32),
            "SLUICE_SSRF_ALLOW_CIDRS": "127.0.0.0/8",
            "SLUICE_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "SLUICE_LOG_LEVEL": "info",
        })
        for k, v in cfg.items():
            self.env["SLUICE_" + k.upper()] = str(v)
        self.consumers = []
        self.receivers = []
        self.apis = []
        try:
            if is_cluster_url(self.redis_url):
                redis_all(self.redis_url, "FLUSHALL")   # every master (its replicas follow)
            else:
                redis_cmd(self.redis_url, "FLUSHDB")
            r = self.ctl("topics", "ensure", "--partitions", str(partitions))
            assert r.returncode == 0, r.stderr
        except BaseException:
            World.close(self)   # nobody else will (a subclass's close may need more)
            raise

    def _lock_redis_db(self, base):
        """A Redis database of our own: retry schedules of two worlds must never mix (tests
        run in parallel under ctest -j). Held with an exclusive lock file until close()."""
        import fcntl
        tag = "".join(c for c in "".join(base) if c.isalnum())
        for _ in range(600):
            for db in range(1, 16):
                f = open(f"/tmp/sluice-e2e-{tag}-db{db}.lock", "w")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    f.close()
                    continue
                self._db_lock = f
                return db
            time.sleep(0.1)
        pytest.fail("no free Redis database for the test world", pytrace=False)

    _cluster_lock_held = set()  # cluster lock files this process holds (one World each)

    def _lock_redis_cluster(self, url):
        """The whole Redis Cluster for this World: it has database 0 only, so worlds on a
        cluster run one after another (ctest -j runs e2e files in parallel), each waiting
        for the exclusive lock file of the cluster (named after its seeds) until close().
        A second World of the same process while one is open would wait for itself: that
        fails at once."""
        import fcntl
        seeds = ",".join(sorted(f"{h}:{p}" for h, p in parse_redis_url(url)["nodes"]))
        path = "/tmp/sluice-e2e-cluster-" + "".join(c if c.isalnum() else "_" for c in seeds) \
            + ".lock"
        if path in World._cluster_lock_held:
            pytest.fail(f"a second World on the Redis Cluster {url} while one is open: worlds "
                        f"on a cluster cannot run side by side (one database, flushed at the "
                        f"start of each)", pytrace=False)
        f = open(path, "w")
        deadline = time.monotonic() + 1800
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    f.close()
                    pytest.fail(f"the Redis Cluster {url} stayed in use by another World for "
                                f"30 min ({path})", pytrace=False)
                time.sleep(0.2)
        self._db_lock = f
        self._cluster_lock = path
        World._cluster_lock_held.add(path)

    def bin(self, rel):
        p = os.path.join(self.bindir, rel)
        assert os.path.exists(p), f"binary {p} missing: build first (scripts/test.sh does)"
        return p

    def run(self, rel, *args, input=None, timeout=120, env=None):
        return subprocess.run([self.bin(rel), *args], env=env or self.env, input=input,
                              capture_output=True, text=True, timeout=timeout)

    def ctl(self, *args, **kw):
        return self.run("ctl/sluicectl", *args, **kw)

    def receiver(self, **kw):
        r = Receiver(self, **kw)
        self.receivers.append(r)
        return r

    def add_endpoint(self, ep_id, url, *flags):
        r = self.ctl("endpoints", "add", "--id", ep_id, "--url", url, "--secret", self.secret,
                     *flags)
        assert r.returncode == 0, f"endpoints add {ep_id}: {r.stderr}"
        return ep_id

    def produce(self, events, *flags):
        lines = "".join(json.dumps(e) + "\n" for e in events)
        r = self.run("producer/sluice-produce", "--quiet", *flags, input=lines)
        return r

    def consumer(self, name=None, **cfg):
        """Start a sluice-consumer; cfg as for World, `_fault` sets SL_FAULT (test builds),
        `_fault_delay_ms` SL_FAULT_DELAY_MS (how long a fault that waits waits), and
        `_wrap` is a command prefix that must exec the consumer in place, so signals reach it
        (e.g. ["env", "LD_PRELOAD=...", "FAKETIME=+10s"]: test_clock_skew.py)."""
        env = dict(self.env)
        wrap = list(cfg.pop("_wrap", None) or [])
        fault = cfg.pop("_fault", None)
        if fault:
            env["SL_FAULT"] = fault
        delay = cfg.pop("_fault_delay_ms", None)  # for faults that wait
        if delay is not None:
            env["SL_FAULT_DELAY_MS"] = str(delay)
        env["SLUICE_INSTANCE_ID"] = name or f"c{len(self.consumers)}"
        for k, v in cfg.items():
            env["SLUICE_" + k.upper()] = str(v)
        log = os.path.join(self.dir, f"consumer-{env['SLUICE_INSTANCE_ID']}.log")
        c = Proc(wrap + [self.bin("consumer/sluice-consumer")], env, log)
        self.consumers.append(c)
        return c

    def api(self, **cfg):
        """Start build/.../api/sluice-api on a free loopback port and wait until GET /readyz
        answers 200 (the keys made before are loaded then). cfg: further settings as for World (api_batch_max=3 ->
        SLUICE_API_BATCH_MAX=3); the special `_fault` sets SL_FAULT (test builds only).
        Returns an Api (.base URL, .port, .proc); close() kills whatever is still running."""
        env = dict(self.env)
        fault = cfg.pop("_fault", None)
        if fault:
            env["SL_FAULT"] = fault
        for k, v in cfg.items():
            env["SLUICE_" + k.upper()] = str(v)
        n = len(self.apis)
        last = ""
        for _ in range(5):  # the free port may be taken between probe and bind: try another
            port = free_port()
            env["SLUICE_API_LISTEN"] = f"127.0.0.1:{port}"
            proc = Proc([self.bin("api/sluice-api")], env, os.path.join(self.dir, f"api-{n}.log"))
            a = Api(proc, port)
            if a.wait_ready(60):
                self.apis.append(a)
                return a
            last = proc.logs()
            if proc.alive():
                proc.kill9()
            if "could not listen" not in last:
                break
        raise AssertionError(f"sluice-api did not become ready (GET /readyz); its log:\n{last[-4000:]}")

    def api_key(self, *scopes, name=None, **kw):
        """Create an API key with `sluicectl keys create` and return its text ("slk_...").
        scopes: publish, read, admin; kw: channels (str or list), rate, burst."""
        args = ["keys", "create", "--name", name or f"e2e {self.tag} {rand_suffix(4)}",
                "--scopes", ",".join(scopes or ("admin",)), "--json"]
        for k, v in kw.items():
            if isinstance(v, (list, tuple)):
                v = ",".join(v)
            args += ["--" + k.replace("_", "-"), str(v)]
        r = self.ctl(*args)
        assert r.returncode == 0, f"keys create: {r.stderr}"
        return json.loads(r.stdout)["key"]

    def dump(self, kind, idle_ms=1500):
        r = self.ctl("dump", kind, "--idle-ms", str(idle_ms))
        assert r.returncode == 0, r.stderr
        return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]

    def outcomes(self):
        return self.dump("outcomes")

    def put_outcome(self, key, record):
        """Put one outcome record (a dict, encoded with mp) onto this world's outcomes topic
        as is, keyed by key (kcat): what a consumer pod would write, for the recorder."""
        path = os.path.join(self.dir, "outcome.bin")
        with open(path, "wb") as f:
            f.write(mp(record))
        r = subprocess.run(["kcat", "-b", self.env["SLUICE_KAFKA_BROKERS"], "-P", "-t",
                            self.env["SLUICE_TOPIC_OUTCOMES"], "-k", key, path],
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr

    def close(self):
        for a in self.apis:
            if a.proc.alive():
                a.proc.kill9()
        for c in self.consumers:
            if c.alive():
                c.kill9()
        for r in self.receivers:
            r.stop()
        lock = getattr(self, "_db_lock", None)
        if lock:
            lock.close()
            self._db_lock = None
        World._cluster_lock_held.discard(getattr(self, "_cluster_lock", None))
        self._cluster_lock = None


def mp(v):
    """msgpack of str, non-negative int or a dict of them, in the shortest forms as the
    consumer writes them (enough for an outcome record)."""
    import struct
    if isinstance(v, dict):
        return b"\xde" + struct.pack(">H", len(v)) + b"".join(mp(k) + mp(x) for k, x in v.items())
    if isinstance(v, int):
        return bytes([v]) if v < 128 else b"\xcf" + struct.pack(">Q", v)
    b = v.encode()
    return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])
            if len(b) < 256 else b"\xda" + struct.pack(">H", len(b))) + b


def event(ep, i, tag, body=None, **extra):
    e = {"id": f"evt_{tag}_{ep}_{i}", "endpoint": ep, "type": "order.created",
         "body": body if body is not None else {"n": i, "ep": ep}}
    e.update(extra)
    return e


def delivered_ids(outcomes):
    """The (event id, endpoint) pairs with a delivered outcome."""
    return {(o["id"], o["endpoint"]) for o in outcomes if o["state"] == "delivered"}


def ledger_ok(receiver):
    """The receiver's ledger lines answered 2xx."""
    return [l for l in receiver.ledger() if 200 <= l["status"] < 300]


def final_states(outcomes):
    """Latest outcome per (event id, endpoint) by outcome timestamp."""
    last = {}
    for o in outcomes:
        key = (o.get("id"), o.get("endpoint"))
        if key not in last or o["ts_ms"] >= last[key]["ts_ms"]:
            last[key] = o
    return last


# ==== a private PostgreSQL database ====

REPO_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SQL_DIR = os.path.join(REPO_DIR, "sql")
MIGRATE = os.path.join(REPO_DIR, "scripts", "migrate.sh")


def dsn_with_db(dsn, db):
    """dsn (key=value form) pointing at database db."""
    return " ".join([p for p in dsn.split() if not p.startswith("dbname=")] + [f"dbname={db}"])


def psql(dsn, sql, *args):
    """Run one SQL command with psql (-At); its output, stripped. Fails the test on error."""
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", dsn, *args,
                        "-c", sql], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PGCONNECT_TIMEOUT": "5",
                            "PGOPTIONS": "-c client_min_messages=warning"})
    assert r.returncode == 0, f"psql failed: {r.stderr}"
    return r.stdout.strip()


class PrivateDb:
    """A fresh database on the shared PostgreSQL with every migration of sql/ applied, for a
    test whose queries are global over the registry or the history (other tests' rows must
    not mix in). drop() removes it."""

    def __init__(self, prefix="sluice_test_", icu_locale=None):
        base = need_env("SLUICE_PG_DSN")
        self.name = prefix + rand_suffix()
        self.admin = dsn_with_db(base, "postgres")
        if icu_locale:  # a linguistic default collation, as most installations have
            psql(self.admin, f"create database {self.name} template template0 "
                 f"locale_provider icu icu_locale '{icu_locale}' locale 'C'")
        else:
            psql(self.admin, f"create database {self.name}")
        self.dsn = dsn_with_db(base, self.name)
        # as an operator applies them (scripts/stack.sh does the same)
        r = subprocess.run(["bash", MIGRATE, self.dsn], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "SLUICE_SQL_DIR": SQL_DIR})
        assert r.returncode == 0, f"scripts/migrate.sh failed: {r.stdout}{r.stderr}"

    def q(self, sql):
        return psql(self.dsn, sql)

    def drop(self):
        psql(self.admin, f"drop database if exists {self.name} with (force)")
