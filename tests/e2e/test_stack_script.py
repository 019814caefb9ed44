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
