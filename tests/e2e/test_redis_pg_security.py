"""Redis ACL users and PostgreSQL TLS (issue 19, item 3).

Redis: an ACL user made on the shared stack's Redis for the test (ACL SETUSER, deleted
afterwards) with a password that needs percent-encoding in the URL; a consumer delivers with
it (its connections show as that user), a wrong password stops it with an authentication
error that names Redis and never shows the password. A database holds one deployment's
state: a consumer of another deployment (another endpoint table) exits 78 naming both.

PostgreSQL: sslmode and sslrootcert travel in the DSN untouched by every process. The shared
stack's server has no TLS: disable and prefer connect, require is refused. A private server
(tests/e2e/tls_helpers.TlsPostgres) accepts only TLS: with sslmode=verify-full and the right
root certificate the endpoint registry, API keys, sluice-api, sluice-recorder and the
operations commands all work on it; a missing root certificate, a CA that did not sign the
server's certificate, or sslmode=disable each fail with a message naming PostgreSQL.
"""

import os
import re
import subprocess
import urllib.parse
import urllib.request

import pytest

from sluice_e2e import (Proc, cluster_masters, cluster_slots, event, free_port, key_slot,
                        parse_redis_url, redis_cmd, redis_node_cmd, wait_until)
from tls_helpers import CA, TlsPostgres

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))


# ==== Redis ====

def test_redis_acl_user_with_percent_encoded_password(make_world):
    w = make_world()
    user = f"sluice-e2e-{w.tag}"
    password = f"p@ss:w/rd%{w.tag}"  # '@', ':', '/' and '%' all need encoding in a URL
    host_db = w.redis_url.split("//", 1)[1]  # 127.0.0.1:16379/N
    redis_cmd(w.redis_url, "ACL", "SETUSER", user, "reset", "on", f">{password}", "~sluice:*",
              "+@all")
    try:
        url = (f"redis://{urllib.parse.quote(user, safe='')}:"
               f"{urllib.parse.quote(password, safe='')}@{host_db}")
        rcv = w.receiver()
        ep = w.add_endpoint(f"acl_{w.tag}", rcv.url("ok", f"acl_{w.tag}"))
        c = w.consumer(redis_url=url)
        evs = [event(ep, i, w.tag) for i in range(3)]
        assert w.produce(evs).returncode == 0
        wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in evs},
                   60 * MULT, 0.2, "delivered with the ACL user")
        clients = redis_cmd(w.redis_url, "CLIENT", "LIST").decode()
        assert f" user={user} " in clients, clients  # the consumer's connections are its
        assert c.term() == 0
        assert password not in c.logs() and urllib.parse.quote(password, safe="") not in c.logs()

        wrong = "Wr0ng-" + w.tag
        bad = w.consumer(name="badpw", redis_url=f"redis://{user}:{wrong}@{host_db}")
        assert bad.p.wait(60 * MULT) != 0
        log = bad.logs()
        assert (f"could not authenticate to redis at {host_db.split('/')[0]} as user {user}: "
                "WRONGPASS") in log, log[-3000:]
        assert wrong not in log
    finally:
        redis_cmd(w.redis_url, "ACL", "DELUSER", user)


def test_bad_redis_url_stops_start_up_with_78(make_world):
    w = make_world()
    path = w.bin("consumer/sluice-consumer")
    for url, want in [("redis://someone@127.0.0.1:16379", "the user name needs a password"),
                      ("redis://u:pw%zz@127.0.0.1:16379", "bad percent-encoding in the password"),
                      ("rediss://127.0.0.1:16379", "rediss:// and unix sockets are not supported"),
                      ("redis://127.0.0.1:99999", "bad port")]:
        r = subprocess.run([path, "--check-config"], env=dict(w.env, SLUICE_REDIS_URL=url),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 78, (url, r.stderr)
        assert "invalid value for SLUICE_REDIS_URL (env): " in r.stderr and want in r.stderr, \
            r.stderr
        assert "pw%zz" not in r.stderr


def test_a_redis_database_of_another_deployment_stops_start_up_with_78(make_world):
    """The first consumer binds the database to its Kafka cluster and endpoints topic
    (sluice:owner); a consumer reading another endpoint table exits 78 before it takes a
    record, naming both, and changes nothing; pods of the bound deployment keep starting;
    once the key is deleted (the documented take-over) the other deployment binds it."""
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"own_{w.tag}", rcv.url("ok", f"own_{w.tag}"))
    c = w.consumer()
    evs = [event(ep, i, w.tag) for i in range(2)]
    assert w.produce(evs).returncode == 0
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in evs},
               60 * MULT, 0.2, "delivered by the deployment that bound the database")
    owner = redis_cmd(w.redis_url, "GET", "sluice:owner").decode()
    cluster, topic = owner.split("/", 1)
    assert topic == f"t{w.tag}.endpoints", owner
    assert re.fullmatch(r"[A-Za-z0-9_-]{16,64}", cluster), owner
    assert len(c.events("redis_owner_set")) == 1

    other_topic = f"t{w.tag}.other.endpoints"
    other = {"topic_endpoints": other_topic, "consumer_group": f"g{w.tag}.other"}
    r = w.ctl("topics", "ensure", "--partitions", "1",
              env=dict(w.env, SLUICE_TOPIC_ENDPOINTS=other_topic))
    assert r.returncode == 0, r.stderr
    bad = w.consumer(name="other", **other)
    assert bad.p.wait(60 * MULT) == 78, bad.logs()[-3000:]
    (line,) = bad.events("redis_owner_mismatch")
    assert f"whose endpoint table is {owner} " in line["msg"], line
    assert f"not this consumer's {cluster}/{other_topic}:" in line["msg"], line
    assert "delete the key sluice:owner" in line["msg"], line
    assert redis_cmd(w.redis_url, "GET", "sluice:owner").decode() == owner

    # another pod of the bound deployment (a restart): starts and delivers
    assert c.term() == 0
    c2 = w.consumer(name="c2")
    more = [event(ep, i, w.tag) for i in range(2, 4)]
    assert w.produce(more).returncode == 0
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in more},
               60 * MULT, 0.2, "delivered by a later pod of the bound deployment")
    assert not c2.events("redis_owner_set") and not c2.events("redis_owner_mismatch")
    assert c2.term() == 0

    # the take-over: the key deleted, the other deployment binds the database
    redis_cmd(w.redis_url, "DEL", "sluice:owner")
    took = w.consumer(name="other2", **other)
    wait_until(lambda: took.events("redis_owner_set") or not took.alive(), 60 * MULT, 0.2,
               "the other deployment binds the database once the key is gone")
    assert took.alive(), took.logs()[-3000:]
    assert redis_cmd(w.redis_url, "GET", "sluice:owner").decode() == f"{cluster}/{other_topic}"
    assert took.term() == 0


# ==== PostgreSQL ====

def keys_list(w, dsn):
    """`sluicectl keys list --json` (common/sl_pg.c) with pg_dsn = dsn."""
    return w.ctl("keys", "list", "--json", env=dict(w.env, SLUICE_PG_DSN=dsn))


def test_stack_postgres_sslmode_disable_and_prefer_connect_require_is_refused(make_world):
    w = make_world()
    base = w.env["SLUICE_PG_DSN"]
    for mode in ("disable", "prefer"):
        r = keys_list(w, f"{base} sslmode={mode}")
        assert r.returncode == 0, (mode, r.stderr)
    # the stack's server has no TLS: a DSN that requires it must not be quietly downgraded
    r = keys_list(w, f"{base} sslmode=require")
    assert r.returncode != 0
    assert "could not connect to postgresql" in r.stderr
    assert "server does not support SSL, but SSL was required" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def tls_pg():
    pg = TlsPostgres()
    try:
        yield pg.start()
    finally:
        pg.stop()


def test_verify_full_everywhere_on_a_tls_only_postgres(make_world, tls_pg):
    """Every PostgreSQL path of every process over verify-full TLS: the server accepts
    nothing else (hostssl only), so each success below was a verified TLS connection."""
    dsn = tls_pg.dsn(sslmode="verify-full", sslrootcert=tls_pg.ca.cert)
    w = make_world(pg_dsn=dsn, recorder_flush_ms=100)
    rcv = w.receiver()
    ep = w.add_endpoint(f"pgtls_{w.tag}", rcv.url("ok", f"pgtls_{w.tag}"))  # sl_registry
    key = w.api_key("read")                                                 # ctl keys
    assert key.startswith("slk_")
    api = w.api()  # ready only once it has loaded the API keys from PostgreSQL
    assert api.get("/readyz")[0] == 200
    c = w.consumer()
    rec = Proc([w.bin("recorder/sluice-recorder")], w.env, os.path.join(w.dir, "recorder.log"))
    try:
        evs = [event(ep, i, w.tag) for i in range(3)]
        assert w.produce(evs).returncode == 0

        def recorded():
            out = tls_pg.psql(dsn, "-Atc", f"select count(*) from deliveries "
                                           f"where endpoint_id = '{ep}' and state = 'delivered'")
            return out.strip() == "3"
        wait_until(recorded, 60 * MULT, 0.5, "the recorder wrote 3 deliveries over TLS")
        # an operations command (ctl_ops_pg_open: its own connection parameters)
        r = w.ctl("dead-letters", "--json")
        assert r.returncode == 0, r.stderr
        assert "history_db_unavailable" not in rec.logs()
    finally:
        assert c.term() == 0
        assert rec.term() == 0


def test_tls_postgres_refusals_name_postgresql(make_world, tls_pg, tmp_path):
    w = make_world()
    other = CA(str(tmp_path / "other-ca"), name="other")
    cases = [
        # the DSN's sslmode is obeyed, not upgraded: this server takes TLS only
        (tls_pg.dsn(sslmode="disable"), ["no pg_hba.conf entry", "no encryption"]),
        (tls_pg.dsn(sslmode="verify-full", sslrootcert=str(tmp_path / "missing-root.pem")),
         ["root certificate file", "missing-root.pem", "does not exist"]),
        (tls_pg.dsn(sslmode="verify-full", sslrootcert=other.cert),
         ["certificate verify failed"]),
    ]
    for dsn, wants in cases:
        r = keys_list(w, dsn)
        assert r.returncode != 0, dsn
        assert "could not connect to postgresql" in r.stderr, r.stderr
        for want in wants:
            assert want in r.stderr, (dsn, want, r.stderr)



def test_a_running_consumer_rebinds_a_database_that_lost_its_binding_and_stops_for_another(
        make_world):
    """Looked at every 5 s while running: the key gone (the database emptied or replaced, so
    its retry schedule and markers may be lost) is reported, counted and bound again at once;
    the key naming another deployment (one took the database over meanwhile) stops the
    consumer with 78, as at start-up, after it has drained: nothing it had taken is lost."""
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"watch_{w.tag}", rcv.url("ok", f"watch_{w.tag}"))
    port = free_port()
    c = w.consumer(metrics_listen=f"127.0.0.1:{port}", consumer_threads=2)
    evs = [event(ep, i, w.tag) for i in range(2)]
    assert w.produce(evs).returncode == 0
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in evs},
               60 * MULT, 0.2, "delivered")
    owner = redis_cmd(w.redis_url, "GET", "sluice:owner").decode()
    assert not c.events("redis_state_lost")

    redis_cmd(w.redis_url, "DEL", "sluice:owner")
    wait_until(lambda: c.events("redis_state_lost"), 30 * MULT, 0.2, "the lost binding reported")
    (line,) = c.events("redis_state_lost")  # one loop looks; once per loss
    assert line["level"] == "error" and f"to this deployment ({owner})" in line["msg"], line
    assert redis_cmd(w.redis_url, "GET", "sluice:owner").decode() == owner
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert "\nsluice_redis_state_lost_total 1\n" in r.read().decode()
    more = [event(ep, i, w.tag) for i in range(2, 4)]
    assert w.produce(more).returncode == 0
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in more},
               60 * MULT, 0.2, "still delivering once bound again")

    other = owner.split("/", 1)[0] + f"/t{w.tag}.other.endpoints"
    redis_cmd(w.redis_url, "SET", "sluice:owner", other)
    assert c.p.wait(60 * MULT) == 78, c.logs()[-3000:]
    (line,) = c.events("redis_owner_mismatch")
    assert f"whose endpoint table is {other} " in line["msg"], line
    assert f"not this consumer's {owner}:" in line["msg"], line
    assert c.events("stopped"), "drained and left the group cleanly"
    assert redis_cmd(w.redis_url, "GET", "sluice:owner").decode() == other
    assert len(c.events("redis_state_lost")) == 1


def test_a_loss_beside_the_binding_is_seen(make_world):
    """The binding's 64 witnesses (sluice:owner:{w...}), one in each 256 hash slots, show a
    loss that leaves sluice:owner in place: on a Redis Cluster, a master other than the one
    holding the key comes back empty (here: FLUSHALL on that node); on one Redis, the same
    keys deleted. A running consumer writes the missing ones again and reports the loss
    once, by its count; the binding itself is untouched and deliveries go on. (Also run
    against a Redis Cluster by scripts/test.sh.)"""
    w = make_world()
    rcv = w.receiver()
    ep = w.add_endpoint(f"wit_{w.tag}", rcv.url("ok", f"wit_{w.tag}"))
    port = free_port()
    c = w.consumer(metrics_listen=f"127.0.0.1:{port}", consumer_threads=2)
    evs = [event(ep, i, w.tag) for i in range(2)]
    assert w.produce(evs).returncode == 0
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in evs},
               60 * MULT, 0.2, "delivered")
    owner = redis_cmd(w.redis_url, "GET", "sluice:owner")
    witnesses = sorted(k.decode() for k in redis_cmd(w.redis_url, "KEYS", "sluice:owner:*"))
    assert sorted(key_slot(k) // 256 for k in witnesses) == list(range(64)), witnesses
    assert all(redis_cmd(w.redis_url, "GET", k) == owner for k in witnesses)

    if parse_redis_url(w.redis_url)["cluster"]:
        def master(slot):
            return next(a for first, last, a in cluster_slots(w.redis_url, refresh=True)
                        if first <= slot <= last)
        keeper = master(key_slot("sluice:owner"))
        victim = next(m for m in cluster_masters(w.redis_url) if m != keeper)
        gone = [k for k in witnesses if master(key_slot(k)) == victim]
        redis_node_cmd(w.redis_url, *victim, "FLUSHALL")
    else:
        gone = witnesses[10:15]
        for k in gone:
            assert redis_cmd(w.redis_url, "DEL", k) == 1
    assert gone
    wait_until(lambda: c.events("redis_state_lost"), 30 * MULT, 0.2, "the loss reported")
    (line,) = c.events("redis_state_lost")
    assert line["level"] == "error", line
    assert f"{len(gone)} of the 64 witnesses of the binding" in line["msg"], line
    assert "while sluice:owner was in place" in line["msg"], line
    assert redis_cmd(w.redis_url, "GET", "sluice:owner") == owner
    assert all(redis_cmd(w.redis_url, "GET", k) == owner for k in witnesses), "written again"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert "\nsluice_redis_state_lost_total 1\n" in r.read().decode()
    more = [event(ep, i, w.tag) for i in range(2, 4)]
    assert w.produce(more).returncode == 0
    wait_until(lambda: {l["webhook_id"] for l in rcv.ledger()} >= {e["id"] for e in more},
               60 * MULT, 0.2, "still delivering")
    assert len(c.events("redis_state_lost")) == 1  # once per loss
    assert c.term() == 0
