"""End-to-end test harness: real Kafka, Redis and PostgreSQL (from scripts/stack.sh, addresses
in SLUICE_* variables exported by scripts/test.sh), real Sluice binaries, and the scripted
sluice-receiver as the endpoints.

Each World gets its own topics, consumer groups, Redis database and endpoint ids, so tests
never see each other's records. A missing service or binary fails the test with a reason;
nothing is skipped.
"""

import base64
import json
import os
import random
import re
import secrets
import signal
import string
import subprocess
import tempfile
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


def redis_cmd(url, *args):
    """Tiny RESP client (stdlib only) for test set-up: FLUSHDB, ZCARD, HGETALL..."""
    import socket
    rest = url[len("redis://"):]
    hostport, _, db = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    f = s.makefile("rb")

    def send(parts):
        out = f"*{len(parts)}\r\n".encode()
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
        s.sendall(out)
        return read()

    def read():
        line = f.readline().rstrip(b"\r\n")
        t, body = line[:1], line[1:]
        if t == b"+":
            return body.decode()
        if t == b"-":
            raise RuntimeError(body.decode())
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
            return None if n < 0 else [read() for _ in range(n)]
        raise RuntimeError(f"bad reply {line!r}")

    try:
        if db:
            send(["SELECT", db])
        return send(list(args))
    finally:
        s.close()


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
        base_redis = os.environ["SLUICE_REDIS_URL"].split("/")[0:3]
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
        redis_cmd(self.redis_url, "FLUSHDB")
        r = self.ctl("topics", "ensure", "--partitions", str(partitions))
        assert r.returncode == 0, r.stderr
        self.consumers = []
        self.receivers = []
        self.apis = []

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
        """Start a sluice-consumer; cfg as for World, `_fault` sets SL_FAULT (test builds), and
        `_wrap` is a command prefix that must exec the consumer in place, so signals reach it
        (e.g. ["env", "LD_PRELOAD=...", "FAKETIME=+10s"]: test_clock_skew.py)."""
        env = dict(self.env)
        wrap = list(cfg.pop("_wrap", None) or [])
        fault = cfg.pop("_fault", None)
        if fault:
            env["SL_FAULT"] = fault
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


def event(ep, i, tag, body=None, **extra):
    e = {"id": f"evt_{tag}_{ep}_{i}", "endpoint": ep, "type": "order.created",
         "body": body if body is not None else {"n": i, "ep": ep}}
    e.update(extra)
    return e


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

    def __init__(self, prefix="sluice_test_"):
        base = need_env("SLUICE_PG_DSN")
        self.name = prefix + rand_suffix()
        self.admin = dsn_with_db(base, "postgres")
        psql(self.admin, f"create database {self.name}")
        self.dsn = dsn_with_db(base, self.name)
        for f in sorted(os.listdir(SQL_DIR)):
            if re.match(r"^\d{4}_.*\.sql$", f):
                r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", self.dsn,
                                    "-f", os.path.join(SQL_DIR, f)],
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ,
                                        "PGOPTIONS": "-c client_min_messages=warning"})
                assert r.returncode == 0, f"migration {f} failed: {r.stderr}"

    def q(self, sql):
        return psql(self.dsn, sql)

    def drop(self):
        psql(self.admin, f"drop database if exists {self.name} with (force)")
