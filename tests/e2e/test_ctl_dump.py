"""`sluicectl dump` and `sluicectl top` against the real broker. dump ends at the end each
partition had when it started, even while one partition keeps growing (the chaos suite found
it running forever when a breaker's deferrals kept one outcome partition busy), and prints
nothing produced after its start; --follow keeps printing new records. top shows each
endpoint's deliveries, dead letters and breaker from the outcomes topic and Redis."""

import collections
import json
import queue
import subprocess
import threading
import time

from sluice_e2e import event, free_port


def test_dump_stops_at_the_start_ends_while_a_partition_grows(make_world):
    w = make_world(partitions=4)
    first = [event("quiet", i, w.tag) for i in range(20)] + \
        [event("busy", i, w.tag) for i in range(30)]
    r = w.produce(first)
    assert r.returncode == 0, r.stderr
    before = w.dump("deliveries")
    assert len(before) == 50

    stop = threading.Event()
    produced = [0]

    def grow():  # one endpoint, so one partition, keeps growing all along
        n = 1000
        while not stop.is_set():
            r = w.produce([event("busy", n + k, w.tag) for k in range(20)])
            assert r.returncode == 0, r.stderr
            produced[0] += 20
            n += 20

    t = threading.Thread(target=grow, daemon=True)
    t.start()
    try:
        while produced[0] < 40:  # the partition is growing now
            time.sleep(0.05)
        p_before = produced[0]
        t0 = time.monotonic()
        # --idle-ms far longer than the test: only reaching the start ends can stop it
        r = w.ctl("dump", "deliveries", "--idle-ms", "600000", timeout=60)
        took = time.monotonic() - t0
        p_after = produced[0]
    finally:
        stop.set()
        t.join(30)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    ids = [rec["id"] for rec in recs]
    assert len(ids) == len(set(ids)), "a record printed twice"
    # everything that existed when the dump started is there, nothing beyond what existed
    # when it ended (the records produced meanwhile are the start-end cut's margin)
    assert {rec["id"] for rec in before} <= set(ids)
    grown = [rec for rec in recs if rec["endpoint"] == "busy" and
             int(rec["id"].rsplit("_", 1)[1]) >= 1000]
    # (plus one batch of 20: its records may be in Kafka before the dump starts while its
    # sluice-produce has not returned, so not counted, when the dump ends)
    assert p_before <= len(grown) <= p_after + 20
    print(f"dump took {took:.1f} s while the partition grew by {p_after - p_before} records; "
          f"printed {len(recs)}")


def test_dump_follow_prints_new_records(make_world):
    w = make_world(partitions=2)
    assert w.produce([event("f", i, w.tag) for i in range(5)]).returncode == 0
    p = subprocess.Popen([w.bin("ctl/sluicectl"), "dump", "deliveries", "--follow"],
                         env=w.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in p.stdout], daemon=True).start()
    try:
        got = [json.loads(lines.get(timeout=30))["id"] for _ in range(5)]
        assert sorted(got) == sorted(f"evt_{w.tag}_f_{i}" for i in range(5))
        assert w.produce([event("f", 100, w.tag)]).returncode == 0
        # the new record arrives, line by line through the pipe; the dump did not end
        assert json.loads(lines.get(timeout=30))["id"] == f"evt_{w.tag}_f_100"
        assert p.poll() is None
    finally:
        p.terminate()
        p.wait(10)


def test_dump_shows_bytes_that_are_not_utf8(make_world):
    """--show-payloads: a binary body is shown as base64, not dropped; an endpoints tombstone
    whose key is not UTF-8 is printed too (it once read an uninitialised error instead)."""
    w = make_world(partitions=1)
    ev = event("bin", 0, w.tag)
    ev.pop("body", None)
    ev["body_base64"] = "//4A"  # ff fe 00
    text = event("txt", 1, w.tag)
    assert w.produce([ev, text]).returncode == 0
    r = w.ctl("dump", "deliveries", "--idle-ms", "1500", "--show-payloads")
    assert r.returncode == 0, r.stderr
    recs = {x["id"]: x for x in (json.loads(l) for l in r.stdout.splitlines() if l.strip())}
    assert recs[ev["id"]]["body"] == {"base64": "//4A"}, recs[ev["id"]]
    assert isinstance(recs[text["id"]]["body"], str)
    # a tombstone keyed \xff on the endpoints topic
    k = subprocess.run(["kcat", "-b", w.env["SLUICE_KAFKA_BROKERS"], "-P", "-Z", "-K", "|",
                        "-t", w.env["SLUICE_TOPIC_ENDPOINTS"]],
                       input=b"\xff|\n", capture_output=True, timeout=30)
    assert k.returncode == 0, k.stderr
    r = w.ctl("dump", "endpoints", "--idle-ms", "1500")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    assert {"base64": "/w=="} in [x.get("id") for x in recs if x.get("deleted")], recs


def test_dump_decodes_records_up_to_the_configured_body_limit(make_world):
    """With max_body_bytes above the 1 MiB default, a record with a 1.5 MB body is shown, not
    reported undecodable: dump decodes with the configured limit, as the writers used."""
    w = make_world(partitions=1, max_body_bytes=4194304)
    ev = event("big", 0, w.tag)
    ev["body"] = "x" * 1500000
    assert w.produce([ev]).returncode == 0
    r = w.ctl("dump", "deliveries", "--idle-ms", "1500")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    assert [x.get("id") for x in recs] == [ev["id"]], [str(x)[:200] for x in recs]
    assert "undecodable" not in recs[0]


def test_top_shows_each_endpoints_deliveries_dead_letters_and_breaker(make_world):
    """`sluicectl top --from-beginning` reads the outcomes topic: one row per endpoint with
    its delivered total and dead letters, the frame's totals, and each endpoint's breaker
    from Redis; it stops after --duration-s."""
    w = make_world(max_attempts=1)
    rcv = w.receiver()
    ok = w.add_endpoint("topok" + w.tag, rcv.url("ok", "topok"))
    bad = w.add_endpoint("topbad" + w.tag, rcv.url("status/400", "topbad"))
    # nothing listens there: attempts with no answer (no status, no latency sample)
    down = w.add_endpoint("topdn" + w.tag, f"http://127.0.0.1:{free_port()}/x")
    r = w.produce([event(ok, i, w.tag) for i in range(30)] +
                  [event(bad, i, w.tag) for i in range(5)] + [event(down, 0, w.tag)])
    assert r.returncode == 0, r.stderr
    c = w.consumer()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = [o["state"] for o in w.outcomes()]
        if states.count("delivered") >= 30 and states.count("dead_letter") >= 6:
            break
        time.sleep(0.5)
    assert c.term() == 0, c.logs()[-3000:]
    t0 = time.monotonic()
    r = w.ctl("top", "--from-beginning", "--duration-s", "3", "--interval-ms", "1000",
              timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert 2.5 <= took < 30, took
    frames = r.stdout.split("sluice top  frame ")[1:]
    assert len(frames) >= 2, r.stdout
    dead = collections.Counter()  # per frame; summed over the frames
    last = {}
    for f in frames:
        for line in f.splitlines()[2:]:
            cols = line.split()
            if cols and cols[0] in (ok[:24], bad[:24], down[:24]):
                dead[cols[0]] += int(cols[3])
                last[cols[0]] = cols
    assert int(last[ok[:24]][7]) == 30 and last[ok[:24]][9:] == ["204"], last  # total, last
    assert last[bad[:24]][7] == "0" and last[bad[:24]][9:] == ["http_4xx", "400"], last
    # the last attempt's error alone when it had no answer; no samples: no percentiles
    assert last[down[:24]][4:7] == ["-", "-", "-"] and last[down[:24]][9:] == ["connect"], last
    assert dead == {ok[:24]: 0, bad[:24]: 5, down[:24]: 1}, dead
    assert sum(int(f.split("dead ", 1)[1].split()[0]) for f in frames) == 6, r.stdout
    assert last[ok[:24]][8] == "closed" and last[bad[:24]][8] == "closed", last  # from Redis
    r = w.ctl("top", "--interval-ms", "5")
    assert r.returncode == 2 and "--interval-ms expects 100..600000" in r.stderr, r
