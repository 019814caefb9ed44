"""Kafka transport security against a real broker (issue 19, item 3).

A private Kafka broker (tests/e2e/tls_helpers.py: KRaft, the jars scripts/stack.sh runs, its
own loopback ports and data dir under this module's tmp dir) serves SASL_SSL (PLAIN and
SCRAM users, the SCRAM ones created at format time) and SSL with required client
certificates, with a certificate signed by a CA that openssl makes for the test. Every Sluice
process is pointed at it with the kafka_security_protocol options only: topics, endpoint
registry, sluice-produce, sluice-consumer, sluice-recorder, sluice-api and sluicectl dumps all
work over TLS; a wrong password, a missing CA, a missing client certificate are each reported
by name without the secret; bad combinations stop start-up with exit code 78.

Redis and PostgreSQL are the shared stack's.
"""

import ctypes
import http.client
import json
import os
import socket
import ssl
import subprocess

import pytest

from sluice_e2e import Proc, event, wait_until
from tls_helpers import (KAFKA_SCRAM_VERSION, PLAIN_USER, SCRAM_256_USER, SCRAM_512_USER,
                         TlsBroker)

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = TlsBroker(str(tmp_path_factory.mktemp("kafka-tls")))
    try:
        b.start(timeout=90 * MULT)
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def broker3(tmp_path_factory):
    """The same private broker on Kafka 3.9 (scripts/setup.sh fetches its jars), whose SCRAM
    implementation accepts the final message librdkafka 2.0.2 sends."""
    b = TlsBroker(str(tmp_path_factory.mktemp("kafka3-tls")), version=KAFKA_SCRAM_VERSION)
    try:
        b.start(timeout=90 * MULT)
        yield b
    finally:
        b.stop()


def sasl(broker, **over):
    """World settings for the broker's SASL_SSL listener as the PLAIN user."""
    cfg = {"kafka_brokers": broker.sasl_bootstrap, "kafka_security_protocol": "SASL_SSL",
           "kafka_sasl_mechanism": "PLAIN", "kafka_sasl_username": PLAIN_USER,
           "kafka_sasl_password": broker.plain_password, "kafka_ssl_ca_file": broker.ca.cert}
    cfg.update(over)
    return cfg


def kafka_lines(proc, *events):
    return [e for name in events for e in proc.events(name)]


def kafka_lines_in(text, *names):
    return [l for l in text.splitlines() if any(f'"event":"{n}"' in l for n in names)]


def librdkafka_version():
    return ctypes.CDLL("librdkafka.so.1").rd_kafka_version()


def test_listener_is_tls_with_the_test_ca(broker):
    """The port the processes use really is TLS, and the broker's certificate verifies with
    the test CA and the 127.0.0.1 host name (what librdkafka checks too)."""
    ctx = ssl.create_default_context(cafile=broker.ca.cert)
    with socket.create_connection(("127.0.0.1", broker.sasl_port), timeout=10) as s:
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            assert t.version() in ("TLSv1.2", "TLSv1.3")
            assert t.getpeercert()["subject"] == ((("commonName", "localhost"),),)
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", broker.sasl_port), timeout=10) as s:
            ssl.create_default_context().wrap_socket(s, server_hostname="127.0.0.1")


def test_whole_pipeline_over_sasl_ssl(make_world, broker):
    """topics ensure, the endpoint registry, sluice-produce, sluice-api, sluice-consumer,
    sluice-recorder and sluicectl dump, all through SASL_SSL: the events reach the receiver
    and the history, and no log holds the password."""
    w = make_world(**sasl(broker), recorder_flush_ms=100)  # topics ensure over SASL_SSL
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    ep = w.add_endpoint(f"tls_{w.tag}", rcv.url("ok", f"tls_{w.tag}"))  # published over TLS
    c = w.consumer()
    rec = Proc([w.bin("recorder/sluice-recorder")], w.env, os.path.join(w.dir, "recorder.log"))
    try:
        evs = [event(ep, i, w.tag) for i in range(10)]
        r = w.produce(evs)
        assert r.returncode == 0, r.stderr
        # one more through sluice-api: its producer and endpoints reader speak SASL_SSL too
        key = w.api_key("publish")
        api = w.api()
        conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30 * MULT)
        conn.request("POST", "/v1/events",
                     json.dumps({"type": "order.created", "endpoint": ep, "body": {"api": 1}}),
                     {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        conn.close()
        assert resp.status == 202, answer  # 2xx only once Kafka acknowledged over SASL_SSL
        want = {e["id"] for e in evs} | {answer["id"]}

        def got():
            return {l["webhook_id"] for l in rcv.ledger() if 200 <= l["status"] < 300} >= want
        wait_until(got, 60 * MULT, 0.2, "all 11 events delivered over SASL_SSL")

        def recorded():
            q = subprocess.run(
                ["psql", "-X", "-Atq", w.env["SLUICE_PG_DSN"], "-c",
                 f"select count(*) from deliveries where endpoint_id = '{ep}' "
                 f"and state = 'delivered'"], capture_output=True, text=True, timeout=30)
            return q.returncode == 0 and q.stdout.strip() == "11"
        wait_until(recorded, 60 * MULT, 0.5, "the recorder wrote the 11 deliveries")
        outs = w.outcomes()  # sluicectl dump: a consumer over SASL_SSL
        assert {o["id"] for o in outs if o.get("state") == "delivered"} >= want
    finally:
        assert c.term() == 0
        assert rec.term() == 0
    for log in (c.logs(), rec.logs(), api.proc.logs()):
        assert broker.plain_password not in log
        assert not kafka_lines_in(log, "kafka_auth_failed", "kafka_tls_failed")


def test_mutual_tls_with_an_encrypted_client_key(make_world, broker):
    """SSL with a client certificate the broker requires (key encrypted, its passphrase in
    kafka_ssl_key_password): records go in with sluice-produce and come back out with
    sluicectl dump. Without the certificate the broker refuses the connection."""
    cert, key = broker.ca.issue("client", "sluice-client", key_password="key-pass-6f1d")
    w = make_world(kafka_brokers=broker.ssl_bootstrap, kafka_security_protocol="SSL",
                   kafka_ssl_ca_file=broker.ca.cert, kafka_ssl_cert_file=cert,
                   kafka_ssl_key_file=key, kafka_ssl_key_password="key-pass-6f1d")
    evs = [event(f"mtls_{w.tag}", i, w.tag) for i in range(3)]
    r = w.produce(evs)
    assert r.returncode == 0, r.stderr
    got = {d["id"] for d in w.dump("deliveries")}
    assert got == {e["id"] for e in evs}
    # the same without a client certificate: the broker's TLS alert, by name
    c = w.consumer(kafka_ssl_cert_file="", kafka_ssl_key_file="", kafka_ssl_key_password="")
    lines = wait_until(lambda: kafka_lines(c, "kafka_tls_failed"), 30 * MULT, 0.2,
                       "kafka_tls_failed in the consumer's log")
    assert "bad certificate" in lines[0]["msg"] and "kafka_ssl_cert_file" in lines[0]["msg"]


def test_wrong_password_is_an_authentication_error_without_the_password(make_world, broker):
    w = make_world(**sasl(broker))
    c = w.consumer(kafka_sasl_password="Wr0ng-pass-for-e2e")
    lines = wait_until(lambda: kafka_lines(c, "kafka_auth_failed"), 30 * MULT, 0.2,
                       "kafka_auth_failed in the consumer's log")
    msg = lines[0]["msg"]
    assert lines[0]["level"] == "error"
    assert "kafka_sasl_password" in msg and "Authentication failed" in msg, msg
    assert "Wr0ng-pass-for-e2e" not in c.logs()
    assert broker.plain_password not in c.logs()


def test_scram_sha_512_and_256(make_world, broker):
    """SCRAM users created at format time, on Kafka 4. librdkafka before 2.6.1 (Debian 12
    ships 2.0.2) answers the SCRAM exchange with a nonce Kafka 4 brokers refuse even when the
    password is right (confluentinc/librdkafka#4895): then the consumer must say so in its
    authentication error. From 2.6.1 on, both mechanisms must work. (Against Kafka 3 they
    work with 2.0.2: test_scram_logins_work_against_kafka_3.)"""
    w = make_world(**sasl(broker))
    users = [("SCRAM-SHA-512", SCRAM_512_USER, broker.password),
             ("SCRAM-SHA-256", SCRAM_256_USER, broker.password256)]
    for mech, user, pw in users:
        over = dict(kafka_sasl_mechanism=mech, kafka_sasl_username=user, kafka_sasl_password=pw)
        if librdkafka_version() >= 0x020601FF:
            r = w.ctl("topics", "ensure", env=dict(w.env, **{
                "SLUICE_" + k.upper(): v for k, v in over.items()}))
            assert r.returncode == 0 and "exists" in r.stdout, (mech, r.stdout, r.stderr)
            continue
        c = w.consumer(name=f"scram{mech[-3:]}", **over)
        lines = wait_until(lambda: kafka_lines(c, "kafka_auth_failed"), 30 * MULT, 0.2,
                           f"{mech}: kafka_auth_failed in the consumer's log")
        msg = lines[0]["msg"]
        assert mech in msg and "librdkafka before 2.6.1" in msg, msg
        assert pw not in c.logs()
        c.kill9()


def test_scram_logins_work_against_kafka_3(make_world, broker3):
    """SCRAM-SHA-512 and SCRAM-SHA-256 logins over SASL_SSL succeed (against Kafka 3.9, which
    accepts what librdkafka 2.0.2 sends): topics, the endpoint registry, sluice-produce and
    sluice-consumer go through SCRAM-SHA-512 and deliver; sluicectl dump works with
    SCRAM-SHA-256; no log holds a password."""
    w = make_world(**sasl(broker3, kafka_sasl_mechanism="SCRAM-SHA-512",
                          kafka_sasl_username=SCRAM_512_USER,
                          kafka_sasl_password=broker3.password))
    rcv = w.receiver(secrets_list=[w.secret], extra=["--reject-bad-sig"])
    ep = w.add_endpoint(f"scram_{w.tag}", rcv.url("ok", f"scram_{w.tag}"))
    c = w.consumer()
    evs = [event(ep, i, w.tag) for i in range(10)]
    r = w.produce(evs)
    assert r.returncode == 0, r.stderr
    want = {e["id"] for e in evs}
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger() if 200 <= l["status"] < 300}
               >= want, 60 * MULT, 0.2, "the events delivered through SCRAM-SHA-512")
    env256 = dict(w.env, SLUICE_KAFKA_SASL_MECHANISM="SCRAM-SHA-256",
                  SLUICE_KAFKA_SASL_USERNAME=SCRAM_256_USER,
                  SLUICE_KAFKA_SASL_PASSWORD=broker3.password256)
    d = w.ctl("dump", "deliveries", "--idle-ms", "1500", env=env256)
    assert d.returncode == 0, d.stderr
    assert {json.loads(l)["id"] for l in d.stdout.splitlines() if l.strip()} >= want
    assert c.term() == 0
    assert broker3.password not in c.logs() and not kafka_lines(c, "kafka_auth_failed")
    assert broker3.password256 not in d.stderr


def test_missing_ca_is_a_named_tls_verification_failure(make_world, broker):
    """Without kafka_ssl_ca_file the system trust store cannot verify the test CA's broker
    certificate: kafka_tls_failed names the option and the verification failure."""
    w = make_world(**sasl(broker))
    c = w.consumer(kafka_ssl_ca_file="")
    lines = wait_until(lambda: kafka_lines(c, "kafka_tls_failed"), 30 * MULT, 0.2,
                       "kafka_tls_failed in the consumer's log")
    msg = lines[0]["msg"]
    assert "kafka_ssl_ca_file" in msg and "certificate verify failed" in msg, msg
    assert broker.plain_password not in c.logs()


PROCS = [("consumer/sluice-consumer", []), ("recorder/sluice-recorder", []),
         ("api/sluice-api", []), ("producer/sluice-produce", []),
         ("ctl/sluicectl", ["topics", "ensure"])]


@pytest.mark.parametrize("rel,args", PROCS, ids=[p[0].split("/")[1] for p in PROCS])
def test_bad_security_settings_stop_every_process_with_78(broker, tmp_path, rel, args):
    """Checked at start-up, before anything connects: each problem is named, the secrets
    never echoed."""
    path = os.path.join(os.environ["SL_BINARY_DIR"], rel)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base.update({"SLUICE_MASTER_KEY": "0" * 64, "SLUICE_KAFKA_BROKERS": broker.sasl_bootstrap})
    cases = [
        ({"SLUICE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "SLUICE_KAFKA_SASL_PASSWORD": "s3cret-1",
          "SLUICE_KAFKA_SSL_CA_FILE": str(tmp_path / "no-such-ca.pem")},
         ["kafka_sasl_username (SLUICE_KAFKA_SASL_USERNAME) is empty",
          'SLUICE_KAFKA_SSL_CA_FILE (env): "' + str(tmp_path / "no-such-ca.pem") +
          '": cannot read it: No such file or directory'], "s3cret-1"),
        ({"SLUICE_KAFKA_SECURITY_PROTOCOL": "SSL", "SLUICE_KAFKA_SSL_CA_FILE": str(tmp_path),
          "SLUICE_KAFKA_SASL_USERNAME": "u", "SLUICE_KAFKA_SASL_PASSWORD": "s3cret-2"},
         ["SLUICE_KAFKA_SSL_CA_FILE (env)", "not a regular file",
          "SLUICE_KAFKA_SASL_USERNAME (env) is set but kafka_security_protocol is SSL",
          "SLUICE_KAFKA_SASL_PASSWORD (env) is set"], "s3cret-2"),
        ({"SLUICE_KAFKA_SECURITY_PROTOCOL": "TLS"},
         ['SLUICE_KAFKA_SECURITY_PROTOCOL (env): "TLS": expected PLAINTEXT, SSL'], None),
    ]
    for env, want, secret in cases:
        r = subprocess.run([path, *args], env=dict(base, **env), capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 78, (env, r.returncode, r.stderr)
        for w in want:
            assert w in r.stderr, (w, r.stderr)
        if secret:
            assert secret not in r.stdout + r.stderr


def test_tls_files_are_loaded_and_matched_at_start_up(broker):
    """The CA, certificate and key files are loaded at start-up as librdkafka will load
    them: a file without a certificate, an encrypted key without (or with a wrong)
    passphrase, and a certificate that is not the key's each stop the process with 78."""
    cert, key = broker.ca.issue("client2", "sluice-client2", key_password="pass-2e9a")
    path = os.path.join(os.environ["SL_BINARY_DIR"], "consumer/sluice-consumer")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base.update({"SLUICE_MASTER_KEY": "0" * 64, "SLUICE_KAFKA_BROKERS": broker.ssl_bootstrap,
                 "SLUICE_KAFKA_SECURITY_PROTOCOL": "SSL",
                 "SLUICE_KAFKA_SSL_CA_FILE": broker.ca.cert, "SLUICE_KAFKA_SSL_CERT_FILE": cert,
                 "SLUICE_KAFKA_SSL_KEY_FILE": key, "SLUICE_KAFKA_SSL_KEY_PASSWORD": "pass-2e9a"})
    broker_cert = os.path.join(broker.ca.dir, "broker.pem")
    cases = [
        ({}, None),
        ({"SLUICE_KAFKA_SSL_CA_FILE": broker.ca.key},
         f'SLUICE_KAFKA_SSL_CA_FILE (env): "{broker.ca.key}": no PEM certificate in it'),
        ({"SLUICE_KAFKA_SSL_KEY_PASSWORD": ""},
         "the key is encrypted and kafka_ssl_key_password (SLUICE_KAFKA_SSL_KEY_PASSWORD) is "
         "empty"),
        ({"SLUICE_KAFKA_SSL_KEY_PASSWORD": "not-the-pass-77"},
         "SLUICE_KAFKA_SSL_KEY_PASSWORD (env) does not decrypt SLUICE_KAFKA_SSL_KEY_FILE (env)"),
        ({"SLUICE_KAFKA_SSL_CERT_FILE": broker_cert},
         "SLUICE_KAFKA_SSL_CERT_FILE (env) and SLUICE_KAFKA_SSL_KEY_FILE (env) do not belong "
         "together"),
    ]
    for env, want in cases:
        r = subprocess.run([path, "--check-config"], env=dict(base, **env), capture_output=True,
                           text=True, timeout=30)
        if want is None:
            assert r.returncode == 0 and "configuration ok" in r.stdout, r.stderr
            continue
        assert r.returncode == 78, (env, r.stderr)
        assert want in r.stderr, (want, r.stderr)
        assert "pass-2e9a" not in r.stderr and "not-the-pass-77" not in r.stderr
