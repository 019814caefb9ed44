"""scripts/stack.sh's process checks: a daemon that was killed but not yet reaped by its
parent (a zombie; pid 1 on these machines reaps late) is not taken for a running service, or
`stack.sh start` right after a kill would skip the restart (chaos finding F5). Uses a fake
stack dir and a copy of sleep(1) named redis-server; no real service is touched."""

import os
import shutil
import subprocess
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def status(stack_dir):
    env = dict(os.environ, SLUICE_STACK_DIR=str(stack_dir), SLUICE_PORT_BASE="29950")
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "stack.sh"), "status"], env=env,
                       capture_output=True, text=True, timeout=60)
    return {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}


def test_a_zombie_daemon_is_not_running(tmp_path):
    fake = tmp_path / "redis-server"
    shutil.copy("/bin/sleep", fake)
    (tmp_path / "stack" / "redis").mkdir(parents=True)
    p = subprocess.Popen([str(fake), "60"])
    try:
        (tmp_path / "stack" / "redis" / "redis.pid").write_text(str(p.pid))
        live = status(tmp_path / "stack")["redis"]
        assert f"pid {p.pid}" in live and "stopped" not in live, live
        p.kill()  # not waited for: a zombie until p.wait()
        for _ in range(100):
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rsplit(") ", 1)[1].startswith("Z"):
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("the killed process did not become a zombie")
        dead = status(tmp_path / "stack")["redis"]
        assert "stopped" in dead and f"pid {p.pid}" not in dead, dead
    finally:
        p.kill()
        p.wait()


def stack_sh(stack_dir, *args, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    e.update(SLUICE_STACK_DIR=str(stack_dir), SLUICE_PORT_BASE="29950")
    e.update(env)
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "stack.sh"), *args], env=e,
                          capture_output=True, text=True, timeout=60)


def test_kafka_cluster_addresses_and_status_lines(tmp_path):
    """A three-node stack lists every node in the clients' bootstrap list and in status, on
    base+5 and base+7 (base+1..4 belong to the controller, Redis, PostgreSQL, Prometheus)."""
    d = tmp_path / "stack"
    d.mkdir()
    (d / "ports.env").write_text("kafka_nodes=3\n")
    env = stack_sh(d, "env").stdout
    assert "export SLUICE_KAFKA_BROKERS=127.0.0.1:29950,127.0.0.1:29955,127.0.0.1:29957\n" \
        in env, env
    st = stack_sh(d, "status").stdout
    assert "kafka-2   stopped  port 29955" in st and "kafka-3   stopped  port 29957" in st, st
    one = stack_sh(tmp_path / "other", "env").stdout
    assert "export SLUICE_KAFKA_BROKERS=127.0.0.1:29950\n" in one, one


def test_kafka_node_count_cannot_change_under_existing_data(tmp_path):
    """Data formatted for one node is refused for three (the quorum's voters are part of
    every node's identity), with the way out in the message; and only 1 or 3 is accepted."""
    d = tmp_path / "stack"
    (d / "kafka" / "data").mkdir(parents=True)
    (d / "kafka" / "data" / "meta.properties").write_text("node.id=1\n")
    r = stack_sh(d, "start", "--kafka-nodes=3", "kafka")
    assert r.returncode == 1, r
    assert "is for 1 node(s), not 3" in r.stderr and "reset" in r.stderr, r.stderr
    r = stack_sh(d, "start", "kafka", SLUICE_STACK_KAFKA_NODES="2")
    assert r.returncode == 1 and "expected 1 or 3" in r.stderr, r.stderr


def cluster_base():
    """A port base whose Redis Cluster ports (base+2, base+9..+13, each also +10000 for the
    cluster bus) are all free right now. The bases keep the bus ports below Linux's ephemeral
    range (32768-60999 here): inside it, a busy suite's client sockets (and their TIME_WAIT
    entries) hold ports at random, enough to take some bus port of every base. Bound as Redis
    binds them (SO_REUSEADDR)."""
    import socket
    for base in range(22400, 22741, 20):
        ports = [base + 2] + [base + i for i in range(9, 14)]
        try:
            for p in ports + [p + 10000 for p in ports]:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise AssertionError("no free port base for a Redis Cluster in 22400..22740")


def test_redis_cluster_start_status_env_restart_stop(tmp_path):
    """`start --redis-cluster redis` on a private port base: six redis-server processes in
    cluster mode, 3 masters + 3 replicas (one per master) covering all 16384 slots,
    cluster_state:ok everywhere; `env` gives the masters as the seeds of a redis-cluster://
    URL; a restart reuses the cluster (no second create; data kept by the AOF); the data
    dir refuses one Redis; `stop` ends all six. Nothing shared is touched."""
    from sluice_e2e import cluster_slots, redis_cmd
    d = tmp_path / "stack"
    base = cluster_base()
    node_ports = [base + 2] + [base + i for i in range(9, 14)]

    def pids():
        out = []
        for i in range(1, 7):
            f = d / "redis" / f"node{i}" / "redis.pid"
            if f.exists():
                out.append(int(f.read_text()))
        return out

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(") ", 1)[1][0] not in "ZX"
        except FileNotFoundError:
            return False

    try:
        r = stack_sh(d, "start", "--redis-cluster", "redis", SLUICE_PORT_BASE=str(base))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "redis: creating the cluster" in r.stdout and "cluster ready" in r.stdout, r.stdout
        assert "redis_cluster=1" in (d / "ports.env").read_text().splitlines()

        st = stack_sh(d, "status", SLUICE_PORT_BASE=str(base)).stdout
        lines = [x for x in st.splitlines() if x.startswith("redis-")]
        assert len(lines) == 6, st
        for i, (line, port) in enumerate(zip(lines, node_ports), 1):
            assert line.startswith(f"redis-{i}   running  port {port} "), st
            assert "cluster_state:ok" in line, st
        assert sum(" master," in x for x in lines) == 3, st
        assert sum(" replica of 127.0.0.1:" in x for x in lines) == 3, st

        env = stack_sh(d, "env", SLUICE_PORT_BASE=str(base)).stdout
        url = f"redis-cluster://127.0.0.1:{base + 2},127.0.0.1:{base + 9},127.0.0.1:{base + 10}"
        assert f"export SLUICE_REDIS_URL={url}\n" in env, env

        # all slots covered by nodes 1-3, the masters, each with one of nodes 4-6 as replica
        from sluice_e2e import redis_node_cmd
        slots = redis_node_cmd(url, "127.0.0.1", base + 9, "CLUSTER", "SLOTS")
        ranges = sorted((int(x[0]), int(x[1])) for x in slots)
        assert ranges[0][0] == 0 and ranges[-1][1] == 16383, ranges
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:])), ranges
        assert {int(x[2][1]) for x in slots} == set(node_ports[:3]), slots
        assert len(cluster_slots(url, refresh=True)) == len(slots)
        table = redis_node_cmd(url, "127.0.0.1", base + 9, "CLUSTER", "NODES").decode()
        nodes = {f[0]: f for f in (x.split() for x in table.splitlines())}
        port = {i: int(f[1].split("@")[0].rsplit(":", 1)[1]) for i, f in nodes.items()}
        masters = {i for i, f in nodes.items() if "master" in f[2].split(",")}
        replicas = {i: f[3] for i, f in nodes.items() if "slave" in f[2].split(",")}
        assert sorted(port[i] for i in masters) == node_ports[:3], table
        assert sorted(port[i] for i in replicas) == node_ports[3:], table
        assert sorted(replicas.values()) == sorted(masters), table   # one replica each
        assert not [f for f in nodes.values() if "fail" in f[2]], table

        # restart: the same cluster from nodes.conf and the AOF, not created again
        assert redis_cmd(url, "SET", "{kept}k", "v") == "OK"
        time.sleep(1.2)   # appendfsync everysec
        before = pids()
        r = stack_sh(d, "stop", SLUICE_PORT_BASE=str(base))
        assert r.returncode == 0 and r.stdout.count(": stopping pid") == 6, r.stdout
        assert not [p for p in before if running(p)], "a node outlived stop"
        r = stack_sh(d, "start", "redis", SLUICE_PORT_BASE=str(base))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "creating the cluster" not in r.stdout and "cluster ready" in r.stdout, r.stdout
        assert redis_cmd(url, "GET", "{kept}k") == b"v"

        # this data dir is a cluster's: one Redis is refused, with the way out
        r = stack_sh(d, "start", "redis", SLUICE_PORT_BASE=str(base),
                     SLUICE_STACK_REDIS_CLUSTER="0")
        assert r.returncode == 1 and "is for a Redis Cluster, not one Redis" in r.stderr \
            and "reset" in r.stderr, r.stderr

        before = pids()
        r = stack_sh(d, "stop", "redis", SLUICE_PORT_BASE=str(base))
        assert r.returncode == 0, r.stderr
        assert not [p for p in before if running(p)], "a node outlived stop"
    finally:
        stack_sh(d, "stop", "redis", SLUICE_PORT_BASE=str(base))
        for p in pids():
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
