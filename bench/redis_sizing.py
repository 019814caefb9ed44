#!/usr/bin/env python3
"""Redis bytes per delivered marker and per scheduled retry, measured on keys that a real
sluice-consumer writes (docs/OPERATIONS.md, "Sizing", quotes the figures).

    cd /work/main && eval "$(bash scripts/stack.sh env)"
    SL_BINARY_DIR=$PWD/build/<dir> ~/.cache/sluice/venv/bin/python bench/redis_sizing.py [-n 10000]

It uses the running stack's Kafka and PostgreSQL and a private redis-server that it starts
(and stops) on a free port, with nothing else in it, so that the memory it reports is the
consumer's alone. Two phases, each with its own endpoint, one consumer:

  markers  n events to an endpoint that answers 204: n delivered markers (the dedup window's
           keys: string value, TTL).
  retries  n events to an endpoint that answers 500, with a retry delay of an hour and no
           breaker: n retry jobs waiting in the schedule (job body string + sorted-set member).

For each phase it prints the work Redis did per item (commands from INFO commandstats, the
busiest of them, bytes received and sent from INFO stats, and Redis's own CPU from INFO cpu;
the markers phase is the cost of a delivery that succeeds at once, the retries phase that of
an attempt that fails and is scheduled), the growth of INFO used_memory divided by n (everything the keys
cost: key, value, the keyspace and expires dictionaries, the sorted sets' members), MEMORY
USAGE (SAMPLES 0) of sampled keys, and for the schedule the sorted sets' MEMORY USAGE divided
by their members. Also the size of one breaker hash and one rate bucket (per endpoint). The
event body is --body-bytes of JSON (a job body holds the record, so a retry grows with it;
a marker does not). Not a test: it exits non-zero only when a phase could not run.
"""

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))

from sluice_e2e import World, redis_cmd, wait_until  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp):
    port = free_port()
    log = open(os.path.join(tmp, "redis.log"), "wb")
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
                          "--save", "", "--appendonly", "no"], stdout=log, stderr=log)
    url = f"redis://127.0.0.1:{port}"
    wait_until(lambda: _ping(url), 20, 0.1, "private redis-server")
    return p, url


def _ping(url):
    try:
        return redis_cmd(url, "PING") == "PONG"
    except OSError:
        return False


def info_field(url, section, field):
    text = redis_cmd(url, "INFO", section).decode()
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise RuntimeError(f"INFO {section} has no {field}")


def used_memory(url):
    """INFO used_memory once it settled: the median of five readings 0.2 s apart (reply
    buffers of the last commands come and go), with the garbage of the scripts' Lua heap
    collected (SCRIPT FLUSH starts a fresh Lua VM; the consumer reloads what it needs)."""
    redis_cmd(url, "SCRIPT", "FLUSH")
    redis_cmd(url, "MEMORY", "PURGE")
    xs = []
    for _ in range(5):
        time.sleep(0.2)
        xs.append(info_field(url, "memory", "used_memory"))
    return sorted(xs)[2]


def work(url):
    """Counters of the work Redis has done: calls per command, bytes in and out, CPU s."""
    calls = {}
    for line in redis_cmd(url, "INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line[len("cmdstat_"):].partition(":")
            calls[name] = int(rest.split("calls=", 1)[1].split(",", 1)[0])
    text = redis_cmd(url, "INFO", "all").decode()
    kv = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {"calls": calls, "in": int(kv["total_net_input_bytes"]),
            "out": int(kv["total_net_output_bytes"]),
            "cpu": float(kv["used_cpu_sys"]) + float(kv["used_cpu_user"])}


def work_delta(a, b):
    calls = {k: v - a["calls"].get(k, 0) for k, v in b["calls"].items()
             if v - a["calls"].get(k, 0) > 0}
    return {"calls": calls, "in": b["in"] - a["in"], "out": b["out"] - a["out"],
            "cpu": b["cpu"] - a["cpu"]}


def print_work(label, d, n):
    total = sum(d["calls"].values())
    top = sorted(d["calls"].items(), key=lambda kv: -kv[1])[:6]
    print(f"  commands / {label:<21}{total / n:8.2f}     "
          + ", ".join(f"{k} {v / n:.2f}" for k, v in top))
    print(f"  bytes in, out / {label:<16}{d['in'] / n:8.0f} B, {d['out'] / n:.0f} B")
    print(f"  Redis CPU / {label:<20}{d['cpu'] / n * 1e6:8.1f} us")


def hashtables(url, db):
    """(main, expires) hashtable overhead of database db, bytes (MEMORY STATS)."""
    st = redis_cmd(url, "MEMORY", "STATS")
    d = {st[i].decode(): st[i + 1] for i in range(0, len(st), 2)}
    per = d.get(f"db.{db}") or []
    kv = {per[i].decode(): per[i + 1] for i in range(0, len(per), 2)}
    return kv.get("overhead.hashtable.main", 0), kv.get("overhead.hashtable.expires", 0)


def scan(url, pattern, limit=None):
    out, cursor = [], b"0"
    while True:
        cursor, keys = redis_cmd(url, "SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        out += keys
        if cursor == b"0" or (limit and len(out) >= limit):
            return out[:limit] if limit else out


def mem(url, key):
    return redis_cmd(url, "MEMORY", "USAGE", key, "SAMPLES", "0")


def avg(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def body_of(n_bytes, i):
    pad = "x" * max(0, n_bytes - 40)
    return {"order": i, "pad": pad}


def phase(w, url, label, ep, n, body_bytes, done, timeout):
    """Produce n events to ep, run one consumer until done() >= n. Returns the growth of
    used_memory and of the database's (main, expires) hashtables, and the work Redis did
    while the consumer ran (work_delta; INFO calls of this function itself excluded)."""
    db = int(w.redis_url.rsplit("/", 1)[1])
    before, ht0 = used_memory(url), hashtables(url, db)
    events = [{"id": f"evt_{w.tag}_{label}_{i:07d}", "endpoint": ep, "type": "order.created",
               "body": body_of(body_bytes, i)} for i in range(n)]
    r = w.produce(events)
    assert r.returncode == 0, r.stderr
    w0 = work(url)
    c = w.consumer(label)
    wait_until(lambda: done() >= n, timeout, 2, f"{n} {label}")
    assert c.term() == 0, c.logs()[-2000:]
    d = work_delta(w0, work(url))
    for k in ("info", "scan", "zcard", "memory", "ping"):  # this script's own polling
        d["calls"].pop(k, None)
    after, ht1 = used_memory(url), hashtables(url, db)
    return after - before, ht1[0] - ht0[0], ht1[1] - ht0[1], d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10000, help="markers and retries to make (10000)")
    ap.add_argument("--body-bytes", type=int, default=256, help="JSON body of each event (256)")
    ap.add_argument("--sample", type=int, default=200, help="keys sampled for MEMORY USAGE")
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server not found (run scripts/setup.sh)")
    n = a.n
    print(f"command: SL_BINARY_DIR={os.environ.get('SL_BINARY_DIR', '?')} "
          f"{sys.executable} bench/redis_sizing.py -n {n} --body-bytes {a.body_bytes}")
    print(f"machine: {platform.node()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    tmp = tempfile.mkdtemp(prefix="sl-redis-sizing-")
    rp, url = start_redis(tmp)
    w = None
    try:
        version = redis_cmd(url, "INFO", "server").decode().split("redis_version:")[1].split()[0]
        print(f"redis-server {version} (private, port {url.rsplit(':', 1)[1]})")
        os.environ["SLUICE_REDIS_URL"] = url
        # no backlog spill (it would park deliveries in the schedule during the markers
        # phase); retries wait an hour; no breaker, so every failure is a scheduled retry
        w = World(tmp, partitions=4, retry_base_ms=3600000, retry_cap_ms=3600000,
                  breaker_threshold=100000, max_attempts=5, endpoint_backlog=1000000)
        db = w.redis_url
        rcv = w.receiver(extra=["--no-ledger-ok"])
        # a rate that never binds, over a period long enough that its bucket outlives the run
        ok = w.add_endpoint("ok" + w.tag, rcv.url("ok", "ok"), "--rate", "1000000", "--burst",
                            "1000000", "--rate-period-ms", "3600000")
        bad = w.add_endpoint("bad" + w.tag, rcv.url("status/500", "bad"))

        markers = lambda: len(scan(db, f"sluice:done:{{{ok}}}:*"))
        grew_m, main_m, exp_m, work_m = phase(w, url, "markers", ok, n, a.body_bytes, markers, 600)
        zsets = lambda: scan(db, "sluice:retry:*")
        left = sum(redis_cmd(db, "ZCARD", k) for k in zsets())
        # the markers, sluice:owner and its 64 witnesses
        assert left == 0 and redis_cmd(db, "DBSIZE") == n + 1 + 64, \
            f"the markers phase left {left} retry jobs, {redis_cmd(db, 'DBSIZE')} keys"
        mkeys = scan(db, f"sluice:done:{{{ok}}}:*", a.sample)
        m_usage = avg([mem(db, k) for k in mkeys])
        ttl = redis_cmd(db, "TTL", mkeys[0])

        scheduled = lambda: sum(redis_cmd(db, "ZCARD", k) for k in zsets())
        grew_r, main_r, _, work_r = phase(w, url, "retries", bad, n, a.body_bytes, scheduled, 600)
        leased = sum(redis_cmd(db, "HLEN", k) for k in scan(db, "sluice:lease:*"))
        zs = zsets()
        z_members = sum(redis_cmd(db, "ZCARD", k) for k in zs)
        z_bytes = sum(mem(db, k) for k in zs)
        jkeys = scan(db, "sluice:job:*", a.sample)
        j_usage = avg([mem(db, k) for k in jkeys])
        j_len = avg([redis_cmd(db, "STRLEN", k) for k in jkeys])
        brk = mem(db, f"sluice:breaker:{{{bad}}}")
        rate = mem(db, f"sluice:rate:{{{ok}}}")

        print()
        print(f"delivered markers ({n}, TTL {ttl} s):")
        print_work("delivery", work_m, n)
        print(f"  used_memory growth / marker     {grew_m / n:8.0f} B")
        print(f"  MEMORY USAGE of a marker key    {m_usage:8.0f} B  (mean of {len(mkeys)}; key, "
              f"value, its keyspace entry)")
        print(f"  keyspace table growth / marker  {main_m / n:8.0f} B  (entries counted above too)")
        print(f"  expires table growth / marker   {exp_m / n:8.0f} B")
        print(f"scheduled retries ({z_members} in {len(zs)} sorted sets, {leased} leased; "
              f"record {j_len:.0f} B with a {a.body_bytes}-byte body):")
        print_work("failed attempt", work_r, n)
        print(f"  used_memory growth / retry      {grew_r / n:8.0f} B")
        print(f"  MEMORY USAGE of a job body key  {j_usage:8.0f} B  (mean of {len(jkeys)})")
        print(f"  keyspace table growth / retry   {main_r / n:8.0f} B  (entries counted above too)")
        print(f"  sorted sets / member            {z_bytes / max(1, z_members):8.0f} B  "
              f"({z_bytes} B / {z_members})")
        print("per endpoint with state (expire when idle):")
        print(f"  breaker hash                    {brk or 0:8d} B")
        print(f"  rate bucket                     {rate or 0:8d} B")
        return 0
    finally:
        if w:
            w.close()
        rp.terminate()
        rp.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
