#!/usr/bin/env python3
"""Side-by-side consumer comparison: the same pre-produced deliveries drained in turn by two
(or more) sluice-consumer binaries, alternating, on one running stack. Python 3 standard
library only; reuses bench/bench.py's helpers.

Each drain gets its own consumer group, Redis database and outcome topic, and a fresh
receiver, so every binary delivers the same N records from the start of one topic. Reported
per drain: consumer CPU s per 10,000 deliveries (utime+stime from /proc/<pid>/stat, start to
the last 2xx), peak RSS (VmHWM), the receiver's CPU, deliveries/s (wall) and the peak in
flight, and the connections the receiver accepted. CPU and RSS are the figures to compare; the rate moves with the machine's load.

  eval "$(scripts/stack.sh env)"      # a running stack (scripts/stack.sh start)
  python3 bench/consumer_ab.py --build build-x --receiver-port 26210 \\
      --stack-dir .stack/x --bin base=/tmp/base/consumer/sluice-consumer \\
      --bin new=build-x/consumer/sluice-consumer --records 100000 --rounds 2 [--inflight 10000]
      [--delay-ms 2000] [--partitions 8]

--delay-ms makes every endpoint answer after that long, so the consumer holds its whole
in-flight window (rate = in flight / delay) and RSS and CPU are compared at the same load.

--build must hold sluice-produce, sluicectl, sluice-receiver and sl-test-topic. Extra
consumer settings: --set KEY=VALUE (SLUICE_KEY=VALUE for every drain). A --bin may be a
wrapper script; CPU and RSS are read from the process it starts, so a wrapper should exec
the consumer. Each drain runs in its own process group, killed when the drain ends.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--stack-dir", required=True)
    ap.add_argument("--receiver-port", type=int, required=True)
    ap.add_argument("--bin", action="append", required=True, help="name=path, repeatable")
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--partitions", type=int, default=0,
                    help="partitions of the deliveries topic (default: bench.py's, 8)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=10000)
    ap.add_argument("--receiver-threads", type=int, default=2)
    ap.add_argument("--delay-ms", type=int, default=0,
                    help="the receiver answers after this long (holds max in flight steady)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE consumer setting")
    ap.add_argument("--json", help="write every drain's figures here")
    ap.add_argument("--keep-outcomes", action="store_true",
                    help="keep each drain's outcome topic (its name is logged) for a closer look, "
                         "e.g. the per-phase timings: sluicectl dump outcomes --topic T")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    work = tempfile.mkdtemp(prefix="sluice-ab-")
    ns = argparse.Namespace(build=os.path.abspath(a.build), tool="", stack_dir=a.stack_dir,
                            work=work, results=work, receiver_port=a.receiver_port,
                            inflight=a.inflight, receiver_threads=a.receiver_threads,
                            wrk_threads=2, latency_rate=0, command="", quick=True, only="e2e",
                            consumer_threads=1,  # each --bin sets its own
                            consumer_set=[])  # --set applies per drain below
    b = bench.Bench(ns)
    if a.delay_ms:
        renv = b.env("setup")
        b.topics(renv, 1)
        for i in range(bench.ENDPOINTS):
            ep = f"{b.ep_prefix}{i}"
            b.ctl(renv, "endpoints", "add", "--id", ep, "--url",
                  f"http://127.0.0.1:{b.port}/ok/{ep}?delay_ms={a.delay_ms}")
    else:
        b.register_endpoints()
    env = b.env("ab")
    b.topics(env, a.partitions or bench.PARTITIONS)
    run_id = f"ab{b.run_id}"
    bench.log(f"producing {a.records} deliveries")
    b.produce(env, a.records, b.ep_prefix, bench.ENDPOINTS, run_id)
    extra = dict(kv.split("=", 1) for kv in a.set)
    rows = []
    for rnd in range(a.rounds):
        for name, path in bins:
            e = dict(env)
            tag = f"{name}{rnd}"
            e["SLUICE_CONSUMER_GROUP"] = f"{env['SLUICE_CONSUMER_GROUP']}.{tag}"
            e["SLUICE_TOPIC_OUTCOMES"] = f"{env['SLUICE_TOPIC_OUTCOMES']}.{tag}"
            e["SLUICE_MAX_INFLIGHT"] = str(a.inflight)
            e["SLUICE_MAX_INFLIGHT_PER_ENDPOINT"] = str(b.per_ep)
            e["SLUICE_INSTANCE_ID"] = tag
            for k, v in extra.items():
                e["SLUICE_" + k.upper()] = v
            b.new_redis_db(e)
            b.topics(e)  # the drain's outcome topic (auto-creation stalls the producer)
            recv = b.start_receiver(tag)
            logf = open(os.path.join(work, f"consumer-{tag}.log"), "ab")
            # its own process group: what a wrapper starts beside or under the consumer
            # (heaptrack runs the binary as its child) is stopped with it below
            p = subprocess.Popen([path], env=e, stdout=logf, stderr=logf,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            p.logf, p.log_path, p.name = logf, logf.name, tag
            rcpu0 = bench.proc_cpu_s(recv.pid)
            t0 = time.time()
            try:
                waited = b.wait_delivered(a.records, [p], timeout=max(600, a.records // 500))
                cpu = bench.proc_cpu_s(p.pid)
                rcpu = bench.proc_cpu_s(recv.pid)
                hwm = bench.proc_status_kb(p.pid, "VmHWM")
                conns = b.receiver_stats().get("connections")
            finally:
                b.stop_proc(p)
                try:  # anything of the drain's process group still running: a consumer left
                    os.killpg(p.pid, signal.SIGKILL)  # behind would claim the next drains' jobs
                except ProcessLookupError:
                    pass
                b.stop_proc(recv)
            infl, mem = b.consumer_peaks(p)
            r = {"bin": name, "round": rnd, "wall_s": round(waited, 2),
                 "rate": round(a.records / max(0.001, waited), 1),
                 "cpu_s_per_10k": round(cpu / a.records * 10000, 3),
                 "receiver_cpu_s_per_10k": round((rcpu - rcpu0) / a.records * 10000, 3),
                 "hwm_mb": round(hwm / 1024, 1), "peak_inflight": infl, "peak_in_memory": mem,
                 "connections": conns, "exit": p.returncode, "loadavg": os.getloadavg()[0]}
            rows.append(r)
            bench.log(json.dumps(r))
            if a.keep_outcomes:
                bench.log(f"outcome topic kept: {e['SLUICE_TOPIC_OUTCOMES']}")
            else:
                subprocess.run([b.bin("tests/integration/sl-test-topic"), "delete",
                                e["SLUICE_TOPIC_OUTCOMES"]], env=e, capture_output=True)
            _ = t0
    b.delete_topics(env)
    print(f"{'bin':<10} {'round':>5} {'cpu s/10k':>10} {'hwm MB':>8} {'deliv/s':>9} "
          f"{'recv s/10k':>10} {'inflight':>8} {'conns':>7} {'load':>5}")
    for r in rows:
        print(f"{r['bin']:<10} {r['round']:>5} {r['cpu_s_per_10k']:>10.3f} {r['hwm_mb']:>8.1f} "
              f"{r['rate']:>9.0f} {r['receiver_cpu_s_per_10k']:>10.3f} {r['peak_inflight']:>8} "
              f"{r['connections'] or 0:>7} {r['loadavg']:>5.1f}")
    for name, _ in bins:
        mine = [r for r in rows if r["bin"] == name]
        print(f"{name}: mean cpu s/10k {sum(r['cpu_s_per_10k'] for r in mine) / len(mine):.3f}, "
              f"max hwm {max(r['hwm_mb'] for r in mine):.1f} MB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
