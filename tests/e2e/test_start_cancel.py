"""A stop request while a long-running process is still starting ends it at once: SIGTERM (or
SIGINT) during sluice-consumer's and sluice-api's endpoint-table load (up to 60 s with Kafka
unreachable), during sluice-recorder's wait for PostgreSQL (it reads PostgreSQL's clock before
it takes any record) and during its wait to join its group must end the process within
EXIT_BOUND_S, with exit code 0 and one `start_cancelled` line naming the phase (nothing was
taken yet, nothing to drain).

Every service address is a closed loopback port, so the processes really wait, except the
stack's PostgreSQL for the recorder's group phase: never needs the shared stack's services to
be down."""

import json
import os
import secrets
import signal
import socket
import subprocess
import time

import pytest

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))
EXIT_BOUND_S = 3.0 * MULT   # from the signal to the exit
WAITING_S = 2.0 * MULT      # for the process to log that it is waiting, at most


def closed_port():
    """A loopback TCP port nothing listens on (bound once by us, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path, rel, name, **over):
    tag = secrets.token_hex(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update({
        "SLUICE_KAFKA_BROKERS": f"127.0.0.1:{closed_port()}",
        "SLUICE_REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0",
        "SLUICE_PG_DSN": f"host=127.0.0.1 port={closed_port()} dbname=sluice user=sluice "
                         f"connect_timeout=2",
        "SLUICE_API_LISTEN": f"127.0.0.1:{closed_port()}",
        "SLUICE_MASTER_KEY": secrets.token_hex(32),
        "SLUICE_TOPIC_ENDPOINTS": f"t{tag}.endpoints",
        "SLUICE_TOPIC_DELIVERIES": f"t{tag}.deliveries",
        "SLUICE_TOPIC_OUTCOMES": f"t{tag}.outcomes",
        "SLUICE_CONSUMER_GROUP": f"g{tag}.consumers",
        "SLUICE_RECORDER_GROUP": f"g{tag}.recorder",
        "SLUICE_LOG_LEVEL": "info",
    })
    env.update(over)
    path = os.path.join(os.environ["SL_BINARY_DIR"], rel)
    assert os.path.exists(path), f"binary {path} missing: build first"
    log_path = tmp_path / f"{name}.log"
    log = open(log_path, "ab")
    p = subprocess.Popen([path], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    return p, log_path


def events(log_path, name):
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if f'"event":"{name}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def stop_while_starting(tmp_path, rel, waiting_event, phase, sig=signal.SIGTERM, **over):
    name = os.path.basename(rel)
    p, log_path = start(tmp_path, rel, name, **over)
    try:
        deadline = time.monotonic() + WAITING_S
        while not events(log_path, waiting_event) and time.monotonic() < deadline:
            assert p.poll() is None, (f"{name} exited {p.returncode} before waiting:\n"
                                      f"{log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        time.sleep(0.5)  # well inside the wait (a metadata round or two against the closed port)
        assert p.poll() is None, f"{name} exited on its own:\n{log_path.read_text()[-3000:]}"
        t0 = time.monotonic()
        p.send_signal(sig)
        try:
            rc = p.wait(EXIT_BOUND_S + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running {EXIT_BOUND_S + 30:.0f} s after {sig.name}:\n"
                        f"{log_path.read_text()[-3000:]}")
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
    text = log_path.read_text(errors="replace")
    assert took <= EXIT_BOUND_S, f"{name} took {took:.2f} s to exit after {sig.name}:\n{text[-3000:]}"
    assert rc == 0, f"{name} exited {rc} after {sig.name}:\n{text[-3000:]}"
    cancelled = events(log_path, "start_cancelled")
    assert len(cancelled) == 1, f"{name}: want one start_cancelled line:\n{text[-3000:]}"
    assert cancelled[0]["level"] == "info" and cancelled[0]["phase"] == phase, cancelled[0]
    for bad in ("endpoints_unavailable", "start_failed", "shutdown_timeout"):
        assert not events(log_path, bad), f"{name} logged {bad}:\n{text[-3000:]}"
    assert events(log_path, waiting_event), f"{name} never logged {waiting_event}:\n{text[-3000:]}"
    return took


def test_consumer_sigterm_while_loading_endpoints(tmp_path):
    stop_while_starting(tmp_path, "consumer/sluice-consumer", "endpoints_loading", "endpoints")


def test_recorder_sigterm_while_waiting_for_postgresql(tmp_path):
    stop_while_starting(tmp_path, "recorder/sluice-recorder", "history_db_unavailable",
                        "postgresql")


def test_recorder_sigterm_while_joining_its_group(tmp_path):
    dsn = os.environ.get("SLUICE_PG_DSN")
    assert dsn, "SLUICE_PG_DSN is not set: run the suite through scripts/test.sh"
    stop_while_starting(tmp_path, "recorder/sluice-recorder", "recorder_started", "kafka_group",
                        SLUICE_PG_DSN=dsn)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_api_stop_while_loading_endpoints(tmp_path, sig):
    stop_while_starting(tmp_path, "api/sluice-api", "endpoints_loading", "endpoints", sig)
