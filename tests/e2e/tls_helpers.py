"""Transport-security fixtures for the e2e tests: a throwaway certificate authority made with
openssl, and a private Kafka broker (KRaft, the jars scripts/stack.sh runs) whose client
listeners speak SASL_SSL (SCRAM) and SSL with client certificates.

The broker lives entirely under the caller's directory (config, data, log), on free loopback
ports, with a small heap; stop() kills it. The shared stack is never touched.
"""

import os
import secrets
import signal
import socket
import subprocess
import time

KAFKA_VERSION = "4.3.1"  # scripts/stack.sh KAFKA_VERSION
KAFKA_SCRAM_VERSION = "3.9.1"  # scripts/setup.sh KAFKA_SCRAM_VERSION: the SCRAM login test's


def kafka_libs(version=KAFKA_VERSION):
    cache = os.environ.get("SLUICE_CACHE_DIR") or os.path.join(
        os.environ.get("HOME", "/root"), ".cache", "sluice")
    libs = os.path.join(cache, f"kafka-{version}", "libs")
    jar = os.path.join(libs, f"kafka_2.13-{version}.jar")
    assert os.path.exists(jar), f"Kafka jars missing ({jar}): run scripts/setup.sh"
    return libs


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"openssl {' '.join(args)} failed: {r.stderr}"
    return r


class CA:
    """A certificate authority in dir: ca.pem (certificate) and ca.key. issue() signs leaf
    certificates for 127.0.0.1/localhost (server and client use)."""

    def __init__(self, dir, name="ca"):
        self.dir = dir
        self.name = name
        os.makedirs(dir, exist_ok=True)
        self.cert = os.path.join(dir, f"{name}.pem")
        self.key = os.path.join(dir, f"{name}.key")
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", self.key, "-out", self.cert, "-days", "2",
                "-subj", f"/CN=Sluice test {name}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=dir)

    def issue(self, name, cn, key_password=None):
        """(cert path, key path) of a new leaf certificate signed by this CA; the key is PKCS#8
        PEM, encrypted with key_password when given."""
        key = os.path.join(self.dir, f"{name}.key")
        csr = os.path.join(self.dir, f"{name}.csr")
        cert = os.path.join(self.dir, f"{name}.pem")
        ext = os.path.join(self.dir, f"{name}.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n"
                    "keyUsage=critical,digitalSignature,keyEncipherment\n")
        keyargs = ["-nodes"] if key_password is None else ["-passout", f"pass:{key_password}"]
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", *keyargs,
                "-keyout", key, "-out", csr, "-subj", f"/CN={cn}", cwd=self.dir)
        openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
                "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", cert, cwd=self.dir)
        return cert, key


def cluster_id():
    """A random KRaft cluster id (16 bytes, base64url without padding, as random-uuid), never
    starting with "-" (as Kafka's own never does): StorageTool's option parser would take such
    an id for an option, and the format fails (one id in 64)."""
    import base64
    import uuid
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


PLAIN_USER = "sluiceplain"
SCRAM_512_USER = "sluice-scram512"
SCRAM_256_USER = "sluice-scram256"


class TlsBroker:
    """A private single-node Kafka broker (combined broker+controller, KRaft):

    - SASL_SSL on .sasl_port (also the inter-broker listener) with three users: PLAIN_USER /
      .plain_password (PLAIN, from the listener's JAAS configuration), SCRAM_512_USER /
      .password (SCRAM-SHA-512) and SCRAM_256_USER / .password256 (SCRAM-SHA-256), the SCRAM
      credentials created at format time (StorageTool format --add-scram);
    - SSL on .ssl_port, client certificate required (signed by the same CA);
    - the controller listener (PLAINTEXT) on its own loopback port, which clients never use.

    The broker's certificate is for 127.0.0.1 and localhost, signed by .ca (ca.cert).
    """

    def __init__(self, dir, heap="-Xms192m -Xmx192m", version=KAFKA_VERSION):
        self.dir = dir
        os.makedirs(dir, exist_ok=True)
        self.version = version
        self.libs = kafka_libs(version)
        self.ca = CA(os.path.join(dir, "pki"))
        self.plain_password = "plain-" + secrets.token_hex(12)
        self.password = "scram-" + secrets.token_hex(12)
        self.password256 = "scram256-" + secrets.token_hex(12)
        self.broker_password = "broker-" + secrets.token_hex(12)
        self.keystore_password = secrets.token_hex(12)
        cert, key = self.ca.issue("broker", "localhost")
        self.keystore = os.path.join(self.ca.dir, "broker.p12")
        openssl("pkcs12", "-export", "-in", cert, "-inkey", key, "-name", "broker",
                "-out", self.keystore, "-passout", f"pass:{self.keystore_password}",
                cwd=self.ca.dir)
        self.sasl_port, self.ssl_port, self.controller_port = free_ports(3)
        self.conf = os.path.join(dir, "server.properties")
        self.data = os.path.join(dir, "data")
        self.log_path = os.path.join(dir, "broker.out")
        self.heap = heap.split()
        self.proc = None
        self._write_config()

    @property
    def sasl_bootstrap(self):
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def ssl_bootstrap(self):
        return f"127.0.0.1:{self.ssl_port}"

    def _write_config(self):
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required"
        plain = (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                 f'username="broker" password="{self.broker_password}" '
                 f'user_broker="{self.broker_password}" '
                 f'user_{PLAIN_USER}="{self.plain_password}";')
        with open(self.conf, "w") as f:
            f.write(f"""# Written by tests/e2e/tls_helpers.py: private test broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{self.controller_port}
listeners=SASL_SSL://127.0.0.1:{self.sasl_port},SSL://127.0.0.1:{self.ssl_port},CONTROLLER://127.0.0.1:{self.controller_port}
advertised.listeners=SASL_SSL://127.0.0.1:{self.sasl_port},SSL://127.0.0.1:{self.ssl_port}
inter.broker.listener.name=SASL_SSL
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512,SCRAM-SHA-256
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas} username="broker" password="{self.broker_password}";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={jaas};
listener.name.sasl_ssl.plain.sasl.jaas.config={plain}
ssl.keystore.type=PKCS12
ssl.keystore.location={self.keystore}
ssl.keystore.password={self.keystore_password}
ssl.truststore.type=PEM
ssl.truststore.location={self.ca.cert}
listener.name.ssl.ssl.client.auth=required
log.dirs={self.data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=8388608
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
""")
        if not self.version.startswith("4."):
            # Kafka 3.x logs through log4j 1 (reload4j)
            self.log4j = os.path.join(self.dir, "log4j.properties")
            self.log4j_prop = f"-Dlog4j.configuration=file:{self.log4j}"
            with open(self.log4j, "w") as f:
                f.write("log4j.rootLogger=INFO, stdout\n"
                        "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
                        "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
                        "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
                        "log4j.logger.kafka.request.logger=WARN\n")
            return
        self.log4j = os.path.join(self.dir, "log4j2.properties")
        self.log4j_prop = f"-Dlog4j2.configurationFile={self.log4j}"
        with open(self.log4j, "w") as f:
            f.write("status = warn\nname = sluice-e2e-tls-broker\n"
                    "appender.out.type = Console\nappender.out.name = STDOUT\n"
                    "appender.out.layout.type = PatternLayout\n"
                    "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
                    "rootLogger.level = INFO\nrootLogger.appenderRef.out.ref = STDOUT\n"
                    "logger.request.name = kafka.request.logger\nlogger.request.level = WARN\n")

    def _java(self, *args, heap=("-Xmx256m",)):
        return ["java", *heap, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true", self.log4j_prop,
                "-cp", os.path.join(self.libs, "*"), *args]

    def start(self, timeout=60):
        """Format the data dir with the SCRAM users, launch the broker and wait for its
        'Kafka Server started' line. Raises (with the log's tail) when it does not come up."""
        fmt = os.path.join(self.dir, "format.log")
        with open(fmt, "w") as log:
            r = subprocess.run(self._java(
                "kafka.tools.StorageTool", "format", "-t", cluster_id(),
                "-c", self.conf,
                "--add-scram", f"SCRAM-SHA-512=[name={SCRAM_512_USER},password={self.password}]",
                "--add-scram", f"SCRAM-SHA-256=[name={SCRAM_256_USER},password={self.password256}]",
                "--add-scram", f"SCRAM-SHA-512=[name=broker,password={self.broker_password}]"),
                stdout=log, stderr=subprocess.STDOUT, timeout=120)
        assert r.returncode == 0, f"StorageTool format failed: {open(fmt).read()[-3000:]}"
        self._out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self._java("kafka.Kafka", self.conf, heap=self.heap),
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"test broker exited ({self.proc.returncode}):\n"
                                     f"{self.log_tail()}")
            if "Kafka Server started" in self.log():
                return self
            time.sleep(0.25)
        raise AssertionError(f"test broker not started after {timeout}s:\n{self.log_tail()}")

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n=60):
        return "\n".join(self.log().splitlines()[-n:])

    def stop(self):
        """Kill the broker (SIGKILL: its data dir is thrown away) and reap it."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        if self.proc:
            self._out.close()
            self.proc = None


PG_BIN = os.environ.get("SLUICE_PG_BIN", "/usr/lib/postgresql/15/bin")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TlsPostgres:
    """A private PostgreSQL 15 on a free loopback port that accepts only TLS connections
    (pg_hba.conf: hostssl, trust), with a server certificate for 127.0.0.1/localhost signed by
    its own test CA (.ca), the database `sluice` and every migration in sql/ applied.

    As root the server runs as the OS user scripts/stack.sh uses (SLUICE_PG_OS_USER, default
    sluice; PostgreSQL refuses root), so its directory is made under /tmp where that user can
    reach it; stop() removes it.
    """

    def __init__(self):
        import pwd
        import tempfile
        assert os.path.exists(os.path.join(PG_BIN, "postgres")), \
            f"{PG_BIN}/postgres missing: run scripts/setup.sh"
        self.os_user = None
        if os.geteuid() == 0:
            self.os_user = os.environ.get("SLUICE_PG_OS_USER", "sluice")
            try:
                pw = pwd.getpwnam(self.os_user)
            except KeyError:
                raise AssertionError(f"OS user {self.os_user} missing: scripts/stack.sh start "
                                     f"creates it (PostgreSQL refuses to run as root)")
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
        self.dir = tempfile.mkdtemp(prefix="sluice-e2e-pgtls-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.ca = CA(os.path.join(self.dir, "pki"))
        self.cert, self.key = self.ca.issue("server", "localhost")
        os.chmod(self.key, 0o600)
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "postgres.log")
        self.port = free_ports(1)[0]
        if self.os_user:
            for root, dirs, files in os.walk(self.dir):
                for n in dirs + files:
                    os.chown(os.path.join(root, n), self.uid, self.gid)
            os.chown(self.dir, self.uid, self.gid)
        self.started = False

    def _as_pg(self, *args):
        cmd = list(args)
        if self.os_user:
            cmd = ["runuser", "-u", self.os_user, "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 0, f"{' '.join(args)} failed: {r.stdout}{r.stderr}"
        return r

    def dsn(self, **params):
        """A libpq conninfo for database sluice on this server; params are added as key=value
        (e.g. sslmode="verify-full", sslrootcert=path)."""
        base = f"host=127.0.0.1 port={self.port} dbname=sluice user=sluice connect_timeout=10"
        return " ".join([base] + [f"{k}={v}" for k, v in params.items()])

    def start(self):
        self._as_pg(os.path.join(PG_BIN, "initdb"), "-D", self.data, "-U", "sluice", "-A", "trust",
                    "-E", "UTF8", "--no-locale", "--no-sync")
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
            f.write("# tests/e2e/tls_helpers.py: TLS only over TCP\n"
                    "local    all  all                trust\n"
                    "hostssl  all  all  127.0.0.1/32  trust\n")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                    f"unix_socket_directories = ''\nssl = on\n"
                    f"ssl_cert_file = '{self.cert}'\nssl_key_file = '{self.key}'\n"
                    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                    "shared_buffers = 32MB\nmax_connections = 60\n")
        self._as_pg(os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-l", self.log_path,
                    "-w", "-t", "60", "-s", "start")
        self.started = True
        ok = self.dsn(sslmode="verify-full", sslrootcert=self.ca.cert)
        self.psql(ok.replace("dbname=sluice", "dbname=postgres"), "-c", "create database sluice")
        for f in sorted(os.listdir(os.path.join(REPO, "sql"))):
            if f.endswith(".sql") and f[:4].isdigit():
                self.psql(ok, "-1", "-f", os.path.join(REPO, "sql", f))
        return self

    def psql(self, dsn, *args):
        r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", dsn, *args],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PGOPTIONS="-c client_min_messages=warning"))
        assert r.returncode == 0, f"psql {' '.join(args)}: {r.stderr}"
        return r.stdout

    def stop(self):
        import shutil
        if self.started:
            runas = ["runuser", "-u", self.os_user, "--"] if self.os_user else []
            subprocess.run(runas + [os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-m",
                                    "immediate", "-w", "-t", "30", "-s", "stop"],
                           capture_output=True, timeout=60, cwd="/")
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)
