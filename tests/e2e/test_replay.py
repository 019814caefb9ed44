"""`sluicectl replay` on the replay engine (common/sl_replay.h): the exact text and JSON the
command prints, and the letters it must not send, on the real stack.

The scripted run: two endpoints answering 400 with max_attempts 1, so each of their six events
dies at once and the recorder keeps its delivery record. Then three letters are spoiled in the
database: one record that does not decode, one that belongs to another event, and one letter
without a record. test_analysis.py covers the rest (selection by error class and time, two
concurrent runs sending each letter once, recovery from the journal).

Isolation: the World's own topics, groups and Redis db, and a private PostgreSQL database with
every migration applied (test_analysis.PrivateDb), with its own recorder.
"""

import re

import pytest

from sluice_e2e import World, event, wait_until
from test_analysis import MULT, PrivateDb, Recorder, ctl_json

N = 3  # events per endpoint


def table(head, align, rows):
    """ctl_table_print's lines, indent 2: columns as wide as their widest cell, two spaces
    apart, right-aligned ('r') or left-aligned ('l', the last one not padded)."""
    w = [max(len(str(x[c])) for x in [head, *rows]) for c in range(len(head))]
    out = []
    for x in [head, *rows]:
        cells = []
        for c, v in enumerate(x):
            v = str(v)
            last = c + 1 == len(head)
            cells.append(v.rjust(w[c]) if align[c] == "r" else (v if last else v.ljust(w[c])))
        out.append("  " + "  ".join(cells))
    return out


def split_table(lines, start, n_rows):
    """The header line and the rows (sorted: the per-endpoint order is a hash map's)."""
    return lines[start], sorted(lines[start + 1:start + 1 + n_rows])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("replay"), partitions=2, max_attempts=1)
    db = PrivateDb()
    w.env["SLUICE_PG_DSN"] = db.dsn
    rec = Recorder(w)
    try:
        rcv = w.receiver()
        t = w.tag
        a = w.add_endpoint("ra" + t, rcv.url("status/400", "a"))
        b = w.add_endpoint("rb" + t, rcv.url("status/400", "b"))
        events = [event(ep, i, t) for ep in (a, b) for i in range(N)]
        assert w.produce(events).returncode == 0
        c = w.consumer()
        wait_until(lambda: db.q("select count(*) from dead_letters") == str(2 * N),
                   90 * MULT, 0.5, "every event to become a dead letter")
        assert c.term() == 0
        ids = {(e["endpoint"], int(e["id"].rsplit("_", 1)[1])): e["id"] for e in events}
        # spoil three letters of b: garbage, another event's record, no record
        db.q(f"update dead_letters set payload = '\\x00c1ff'::bytea"
             f" where event_id = '{ids[(b, 0)]}'")
        db.q(f"update dead_letters set payload = (select payload from dead_letters"
             f"        where event_id = '{ids[(a, 0)]}')"
             f" where event_id = '{ids[(b, 1)]}'")
        db.q(f"update dead_letters set payload = null where event_id = '{ids[(b, 2)]}'")

        class Run:
            pass
        r = Run()
        r.w, r.db, r.a, r.b, r.ids = w, db, a, b, ids
        r.topic = w.env["SLUICE_TOPIC_DELIVERIES"]
        yield r
    finally:
        rec.stop()
        w.close()
        db.drop()


def test_dry_run_text_and_json(run):
    r = run
    res = r.w.ctl("replay", "--all", "--dry-run")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lines = res.stdout.split("\n")
    assert lines[:3] == [
        f"dry run: 5 dead letters would be re-published to {r.topic}",
        "  1 matching dead letter without a stored record cannot be replayed",
        ""]
    want = table(["endpoint", "would replay"], "lr", [[r.a, N], [r.b, N - 1]])
    assert split_table(lines, 3, 2) == (want[0], sorted(want[1:]))
    assert lines[6:] == [""]
    # one endpoint, JSON: every field of every letter, oldest death first
    out = ctl_json(r.w, "replay", "--endpoint", r.a, "--dry-run")
    assert list(out) == ["dry_run", "topic", "would_replay", "without_payload", "unregistered",
                         "letters"]
    assert out["dry_run"] is True and out["topic"] == r.topic
    assert out["would_replay"] == N and out["without_payload"] == 0
    assert sorted(x["event_id"] for x in out["letters"]) == sorted(r.ids[(r.a, i)]
                                                                  for i in range(N))
    for x in out["letters"]:
        assert list(x) == ["event_id", "endpoint_id", "dead_at", "error_class", "last_status",
                           "attempts", "replay_count", "bytes"]
        assert x["endpoint_id"] == r.a and x["error_class"] == "http_4xx"
        assert x["last_status"] == 400 and x["attempts"] == 1 and x["replay_count"] == 0
        assert x["bytes"] > 0 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",
                                               x["dead_at"])
    assert [x["dead_at"] for x in out["letters"]] == sorted(x["dead_at"] for x in out["letters"])
    # --limit, and a selection that matches nothing
    assert ctl_json(r.w, "replay", "--all", "--limit", "2", "--dry-run")["would_replay"] == 2
    res = r.w.ctl("replay", "--error", "timeout", "--dry-run")
    assert (res.returncode, res.stdout) == (0, f"dry run: 0 dead letters would be re-published"
                                               f" to {r.topic}\n")
    assert r.db.q("select count(*) from replay_log") == "0"
    assert r.db.q("select count(*) from dead_letters where replayed_at is not null") == "0"


def test_run_sends_the_good_letters_once_and_lists_the_bad(run):
    r = run
    assert not any(d["replay"] for d in r.w.dump("deliveries")), "nothing replayed yet"
    res = r.w.ctl("replay", "--all", "--batch-size", "2")
    assert res.returncode == 1, res.stderr
    assert res.stderr == "sluicectl replay: 2 dead letters were not replayed\n"
    lines = res.stdout.split("\n")
    m = re.fullmatch(rf"replay run ([0-9a-f]{{32}}): {N} dead letters re-published to "
                     rf"{re.escape(r.topic)} and marked replayed", lines[0])
    assert m, lines[0]
    run_id = m.group(1)
    assert lines[1:3] == ["  1 matching dead letter without a stored record cannot be replayed",
                          ""]
    want = table(["endpoint", "replayed", "failed"], "lrr", [[r.a, N, 0], [r.b, 0, 2]])
    assert split_table(lines, 3, 2) == (want[0], sorted(want[1:]))
    b0, b1 = r.ids[(r.b, 0)], r.ids[(r.b, 1)]
    assert lines[6:8] == ["", "2 not replayed (still selectable by the next run):"]
    fails = sorted(lines[8:10])
    assert fails[0].startswith(f"  {r.b} {b0}: stored record does not decode: "), fails
    assert fails[1] == f"  {r.b} {b1}: stored record belongs to another event"
    assert lines[10:] == [""]
    # exactly a's letters went to the topic, once each, as fresh replays
    good = sorted(r.ids[(r.a, i)] for i in range(N))
    # the dump reads partition by partition: the new records are the ones marked replay
    sent = [d for d in r.w.dump("deliveries") if d["replay"]]
    assert sorted(d["id"] for d in sent) == good
    assert all(d["replay"] and d["attempt"] == 0 and d["endpoint"] == r.a for d in sent)
    assert r.db.q("select string_agg(event_id, ',' order by event_id) from dead_letters"
                  " where replayed_at is not null and replay_count = 1") == ",".join(good)
    # the journal: acked for the sent, failed with the reason for the spoiled
    log = r.db.q(f"select string_agg(event_id || ' ' || state || ' ' || coalesce(error, '-'),"
                 f" ',' order by event_id) from replay_log where run_id = '{run_id}'")
    log = sorted(log.split(","))
    assert log[:N] == [f"{e} acked -" for e in good]
    # and who replayed: the operating-system user and host of the sluicectl run
    actors = r.db.q(f"select string_agg(distinct actor, ',') from replay_log"
                    f" where run_id = '{run_id}'")
    assert re.fullmatch(r"sluicectl [^@,]+@[^,]+", actors), actors
    assert log[N].startswith(f"{b0} failed stored record does not decode: ")
    assert log[N + 1] == f"{b1} failed stored record belongs to another event"


def test_second_run_sends_nothing_and_still_lists_the_bad(run):
    r = run
    before = len(r.w.dump("deliveries"))
    out = ctl_json(r.w, "replay", "--all", rc=1)
    assert list(out) == ["run_id", "dry_run", "topic", "recovered", "replayed", "failed",
                         "invalid", "unconfirmed_resent", "acknowledged_unmarked",
                         "without_payload", "unregistered", "endpoints", "failures"]
    assert re.fullmatch(r"[0-9a-f]{32}", out["run_id"])
    assert (out["dry_run"], out["topic"]) == (False, r.topic)
    assert [out[k] for k in ("recovered", "replayed", "failed", "invalid", "unconfirmed_resent",
                             "acknowledged_unmarked", "without_payload")] == [0, 0, 0, 2, 0, 0, 1]
    assert out["endpoints"] == [{"endpoint_id": r.b, "replayed": 0, "failed": 2}]
    b0, b1 = r.ids[(r.b, 0)], r.ids[(r.b, 1)]
    fails = sorted((f["endpoint_id"], f["event_id"], f["error"]) for f in out["failures"])
    assert [f[:2] for f in fails] == [(r.b, b0), (r.b, b1)]
    assert fails[0][2].startswith("stored record does not decode: ")
    assert fails[1][2] == "stored record belongs to another event"
    assert len(r.w.dump("deliveries")) == before, "nothing was sent"
    # a's letters are replayed: a selection of only them finds nothing, and exits 0
    res = r.w.ctl("replay", "--endpoint", r.a)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert re.fullmatch(rf"replay run [0-9a-f]{{32}}: 0 dead letters re-published to "
                        rf"{re.escape(r.topic)} and marked replayed\n", res.stdout)


def test_letters_of_a_deleted_endpoint_are_counted_and_left(run):
    """Last in the module: endpoint b is deleted. Its two letters with a stored record are
    not sent (the consumers would set them aside as for an unknown endpoint) nor marked:
    counted as unregistered, in the dry run and in the run."""
    r = run
    assert r.w.ctl("endpoints", "delete", r.b).returncode == 0
    res = r.w.ctl("replay", "--endpoint", r.b, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == [
        f"dry run: 0 dead letters would be re-published to {r.topic}",
        "  1 matching dead letter without a stored record cannot be replayed",
        "  2 matching dead letters of endpoints no longer registered (deleted) left as they "
        "are: register the endpoint again to replay them"]
    before = len(r.w.dump("deliveries"))
    out = ctl_json(r.w, "replay", "--endpoint", r.b)
    assert [out[k] for k in ("replayed", "failed", "invalid", "without_payload",
                             "unregistered")] == [0, 0, 0, 1, 2], out
    assert len(r.w.dump("deliveries")) == before, "nothing was sent"
    assert r.db.q(f"select count(*) from dead_letters where endpoint_id = '{r.b}'"
                  f" and replayed_at is null") == "3"

