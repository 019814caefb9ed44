"""Authenticated endpoint records and master-key rotation, end to end (#19 item 2).

Every record on the endpoints topic is signed (HMAC-SHA256 with a key derived from the master
key, common/sl_endpoints.h). A record altered or forged by someone who can write the topic is
refused by the consumer (logged, listed by `sluicectl health`), and deliveries keep going to
the endpoint's genuine URL. A rotation (a new key put first in master_key, `sluicectl
endpoints reseal`, the old key retired) under load loses nothing and signs every request with
the endpoint's secret, which the receiver verifies."""

import json
import os
import secrets
import subprocess
import threading
import time

from sluice_e2e import PrivateDb, wait_until


def event(ep, i, tag):
    return {"endpoint": ep, "id": f"ra-{tag}-{i}", "type": "order.paid",
            "body": {"n": i}}


def endpoint_values(w, ep):
    """Every value the endpoints topic holds for key ep, oldest first (kcat writes each key,
    a newline, then the value framed with its length: %R)."""
    r = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-C", "-t",
                        w.env["SLUICE_TOPIC_ENDPOINTS"], "-e", "-q", "-f", "%k\n%R%s"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out, b = [], r.stdout
    while b:
        key, b = b.split(b"\n", 1)
        vn = int.from_bytes(b[:4], "big", signed=True)
        if key.decode() == ep and vn >= 0:
            out.append(b[4:4 + vn])
        b = b[4 + max(vn, 0):]
    return out


def publish_raw(w, ep, value):
    """Produce value as one record with key ep (from a file: kcat sends a file given as an
    argument whole, where stdin would be split at newline bytes)."""
    path = os.path.join(w.dir, f"record-{ep}.bin")
    with open(path, "wb") as f:
        f.write(value)
    r = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-P", "-t",
                        w.env["SLUICE_TOPIC_ENDPOINTS"], "-k", ep, path],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr


def accepted(rcv, name):
    return [l for l in rcv.ledger() if l.get("endpoint") == name and 200 <= l["status"] < 300]


def test_altered_record_is_refused_and_never_delivered_to(make_world):
    w = make_world()
    rcv = w.receiver(secrets_list=[w.secret])
    ep = w.add_endpoint("au" + w.tag, rcv.url("ok", "real"))
    c = w.consumer()
    first = [event(ep, i, w.tag) for i in range(20)]
    assert w.produce(first).returncode == 0
    wait_until(lambda: len(accepted(rcv, "real")) >= 20, 60, 0.2, "first batch delivered")

    # someone with write access to the topic re-points the endpoint, keeping the sealed
    # secret and the MAC: the URL bytes are replaced in place (same length)
    genuine = endpoint_values(w, ep)[-1]
    assert b"/ok/real" in genuine
    publish_raw(w, ep, genuine.replace(b"/ok/real", b"/ok/evil"))
    wait_until(lambda: c.events("endpoint_record_forged"), 30, 0.2, "the record refused")
    ev = c.events("endpoint_record_forged")[-1]
    assert ev["endpoint_id"] == ep
    assert "MAC does not match" in ev["msg"]

    second = [event(ep, i, w.tag) for i in range(20, 40)]
    assert w.produce(second).returncode == 0
    wait_until(lambda: len(accepted(rcv, "real")) >= 40, 60, 0.2, "second batch delivered")
    assert accepted(rcv, "evil") == [] and [l for l in rcv.ledger() if l.get("endpoint") == "evil"] == []
    # the receiver verified every signature with the endpoint's secret
    assert all(l["sig_ok"] is True for l in rcv.ledger()), rcv.ledger()[:3]

    # sluicectl health lists it, and fails
    r = w.ctl("health", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    recs = json.loads(r.stdout)["endpoint_records"]
    assert [x["endpoint_id"] for x in recs["refused"]] == [ep], recs
    assert "refused by consumers" in r.stderr
    # a change through sluicectl publishes a genuine record again: nothing refused
    assert w.ctl("endpoints", "update", ep, "--name", "fixed").returncode == 0
    r = w.ctl("health", "--json")
    assert json.loads(r.stdout)["endpoint_records"]["refused"] == [], r.stdout
    assert json.loads(r.stdout)["endpoint_records"]["differ"] == [], r.stdout

    # the endpoint's first genuine record replayed: authentic, but older than the one in
    # force, so the consumer refuses it; health says the topic's record is not the registry's
    publish_raw(w, ep, endpoint_values(w, ep)[0])
    wait_until(lambda: c.events("endpoint_record_stale"), 30, 0.2, "the replayed record refused")
    assert c.events("endpoint_record_stale")[-1]["endpoint_id"] == ep
    # (a registry change younger than 5 s may still be on its way to the topic: not reported)
    r = wait_until(lambda: (lambda r: r if r.returncode == 1 else None)(w.ctl("health", "--json")),
                   30, 1, "health to report the replayed record")
    recs = json.loads(r.stdout)["endpoint_records"]
    assert recs["refused"] == [] and [x["endpoint_id"] for x in recs["differ"]] == [ep], recs
    assert recs["differ"][0]["topic_record"] == "older", recs
    assert recs["differ"][0]["topic_updated_ms"] < recs["differ"][0]["registry_updated_ms"]
    assert "not the registry's version" in r.stderr and "endpoints sync" in r.stderr
    # a record over the size limit is listed with the reason (it was counted as a tombstone)
    publish_raw(w, ep, b"\x80" * (70 * 1024))
    wait_until(lambda: c.events("endpoint_record_invalid"), 30, 0.2, "the big record ignored")
    recs = json.loads(w.ctl("health", "--json").stdout)["endpoint_records"]
    assert [x["endpoint_id"] for x in recs["refused"]] == [ep], recs
    assert "71680 bytes, over the 65536 bytes consumers accept" in recs["refused"][0]["reason"]
    third = [event(ep, i, w.tag) for i in range(40, 60)]
    assert w.produce(third).returncode == 0
    wait_until(lambda: len(accepted(rcv, "real")) >= 60, 60, 0.2, "third batch delivered")
    assert accepted(rcv, "evil") == []
    assert w.ctl("endpoints", "update", ep, "--name", "fixed again").returncode == 0
    recs = json.loads(w.ctl("health", "--json").stdout)["endpoint_records"]
    assert recs["refused"] == [] and recs["differ"] == [], recs
    assert c.term() == 0


def test_a_registry_older_than_the_topic_is_reported_and_repaired_by_sync(make_world):
    """A database restored from a backup taken before an endpoint's last change: its row is
    older than the endpoint's record on the topic. Consumers refuse a record older than the
    one in force, so republishing the row as it is would change nothing: `sluicectl health`
    reports the topic's record as newer (exit 1), and `endpoints sync` moves the row's update
    time past the topic's before republishing it, so consumers take the registry's version."""
    w = make_world()
    db = PrivateDb("sluice_restored_")  # sync publishes every row of the registry
    w.env["SLUICE_PG_DSN"] = db.dsn
    try:
        rcv = w.receiver(secrets_list=[w.secret])
        ep = w.add_endpoint("rs" + w.tag, rcv.url("ok", "real"))
        c = w.consumer()
        wait_until(lambda: c.events("partitions_assigned"), 60, 0.2, "the consumer to join")
        db.q(f"update endpoints set updated_at = updated_at - interval '1 hour', "
             f"name = 'restored' where id = '{ep}'")
        r = w.ctl("health", "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        differ = json.loads(r.stdout)["endpoint_records"]["differ"]
        assert [(x["endpoint_id"], x["topic_record"]) for x in differ] == [(ep, "newer")], differ
        r = w.ctl("endpoints", "sync")
        assert r.returncode == 0, r.stderr
        assert "1 endpoint had a newer record on the topic than in the registry" in r.stdout
        wait_until(lambda: [x for x in c.events("endpoint_changed") if x["endpoint_id"] == ep],
                   30, 0.2, "the consumer to take the registry's version")
        assert not c.events("endpoint_record_stale")
        r = w.ctl("health", "--json")
        assert json.loads(r.stdout)["endpoint_records"]["differ"] == [], r.stdout
        evs = [event(ep, i, w.tag) for i in range(5)]
        assert w.produce(evs).returncode == 0
        wait_until(lambda: len(accepted(rcv, "real")) >= 5, 60, 0.2, "delivered after the sync")
        assert c.term() == 0
    finally:
        db.drop()


def test_master_key_rotation_under_load(make_world):
    old = "k1:" + secrets.token_hex(32)
    new = "k2:" + secrets.token_hex(32)
    w = make_world(master_key=old)
    # reseal opens every secret of the registry: a registry of this test only
    db = PrivateDb("sluice_reseal_")
    w.env["SLUICE_PG_DSN"] = db.dsn
    try:
        rotate_under_load(w, old, new)
    finally:
        db.drop()


def rotate_under_load(w, old, new):
    rcv = w.receiver(secrets_list=[w.secret])
    eps = [w.add_endpoint(f"rot{i}" + w.tag, rcv.url("ok", f"r{i}") + "?delay_ms=5")
           for i in range(3)]
    # 1. consumers accept both keys (a rolling restart in production)
    c = w.consumer("a", master_key=f"{old},{new}")
    n_per_batch = 60
    produced = []
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            batch = [event(eps[j % len(eps)], i + j, w.tag) for j in range(n_per_batch)]
            assert w.produce(batch).returncode == 0
            produced.extend(batch)
            i += n_per_batch
            time.sleep(0.2)

    t = threading.Thread(target=load)
    t.start()
    try:
        wait_until(lambda: len(rcv.ledger()) >= 100, 60, 0.2, "deliveries under way")
        # 2. writers get the new key first; reseal re-seals every secret and re-signs every
        #    record with it, while deliveries go on
        env = dict(w.env, SLUICE_MASTER_KEY=f"{new},{old}")
        r = w.ctl("endpoints", "reseal", "--json", env=env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["key_id"] == "k2" and out["resealed_secrets"] == len(eps), out
        assert out["published"] == len(eps)
        wait_until(lambda: len(c.events("endpoint_changed")) >= len(eps), 30, 0.2,
                   "the consumer took the re-signed records")
        time.sleep(1)
    finally:
        stop.set()
        t.join()
    ids = {e["id"] for e in produced}
    wait_until(lambda: ids <= {l["webhook_id"] for l in rcv.ledger()}, 120, 0.5,
               "everything produced delivered")
    assert c.events("endpoint_record_forged") == [] and c.events("endpoint_record_unsigned") == []
    assert c.term() == 0
    # 3. the old key retired: a consumer with only the new key loads every endpoint and
    #    delivers with the same secrets
    c2 = w.consumer("b", master_key=new)
    more = [event(eps[j % len(eps)], 100000 + j, w.tag) for j in range(30)]
    assert w.produce(more).returncode == 0
    wait_until(lambda: {e["id"] for e in more} <= {l["webhook_id"] for l in rcv.ledger()}, 60,
               0.5, "delivered by the consumer with only the new key")
    # it read the records signed with the retired key too (older offsets of the topic, until
    # compaction removes them): superseded, so not reported
    assert c2.events("endpoint_record_forged") == [], c2.events("endpoint_record_forged")
    r = w.ctl("health", "--json", env=dict(w.env, SLUICE_MASTER_KEY=new))
    recs = json.loads(r.stdout)["endpoint_records"]
    assert recs["refused"] == [] and recs["checked"] >= len(eps), recs
    # every request of the whole run carried a signature the receiver verified
    bad = [l for l in rcv.ledger() if l["sig_ok"] is not True]
    assert bad == [], bad[:3]
    assert c2.term() == 0
    # a consumer with only the retired key refuses the re-signed records: it loads nothing
    c3 = w.consumer("c", master_key=old)
    wait_until(lambda: not c3.alive() or c3.events("endpoint_record_forged"), 60, 0.2,
               "the old key alone refused")
    if c3.alive():
        c3.term()
