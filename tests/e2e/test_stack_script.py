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
    e.update(SLUICE_STACK_DIR=str(stack_dir), SLUICE_PORT_BASE="29950", **env)
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
