#!/usr/bin/env python3
"""Per-thread CPU time and run-queue wait of one process, every second (bench/README.md,
"Latency at half rate on the Intel host").

Waits for a process whose command line contains --cmd and, with --env KEY=VALUE, whose
environment holds that pair (the bench names each consumer with SLUICE_INSTANCE_ID), then
reads /proc/<pid>/task/*/schedstat once a second until it exits and writes one JSON line per
second to --out: {"t": s, "<thread name>": [run ms, run-queue wait ms, timeslices]} summed over
the threads of each name (the consumer's delivery loops are named after the process;
librdkafka's threads rdk:*). Run ms is time on a CPU, wait ms time runnable but waiting for
one: a thread whose wait is as long as its run is queueing for a core.

  python3 bench/schedstat.py --cmd sluice-consumer --env SLUICE_INSTANCE_ID=latency-c0 \\
      --out /tmp/sched.jsonl &
  BENCH_PORT_BASE=24000 bench/run.sh --only latency --latency-rate 24000
"""
import argparse
import glob
import json
import os
import time


def find(cmd, env):
    for p in glob.glob("/proc/[0-9]*"):
        try:
            with open(p + "/cmdline", "rb") as f:
                c = f.read()
            with open(p + "/environ", "rb") as f:
                e = f.read().split(b"\0")
        except OSError:
            continue
        if cmd.encode() in c and (env is None or env.encode() in e):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cmd", required=True, help="text the process's command line contains")
    ap.add_argument("--env", help="KEY=VALUE its environment holds")
    ap.add_argument("--out", required=True, help="JSON lines, one per second")
    ap.add_argument("--wait-s", type=float, default=600, help="give up after this long")
    a = ap.parse_args()
    deadline = time.time() + a.wait_s
    proc = None
    while proc is None:
        if time.time() > deadline:
            raise SystemExit(f"schedstat.py: no process matching {a.cmd!r} {a.env or ''}")
        proc = find(a.cmd, a.env)
        time.sleep(0.2)
    prev, t0 = {}, time.time()
    with open(a.out, "w") as out:
        while os.path.exists(proc):
            row = {"t": round(time.time() - t0, 2)}
            for task in glob.glob(proc + "/task/*"):
                try:
                    with open(task + "/comm") as f:
                        name = f.read().strip()
                    with open(task + "/schedstat") as f:
                        run, wait, slices = map(int, f.read().split())
                except (OSError, ValueError):
                    continue
                tid = task.rsplit("/", 1)[1]
                if tid in prev:
                    r0, w0, s0 = prev[tid]
                    acc = row.setdefault(name, [0.0, 0.0, 0])
                    acc[0] = round(acc[0] + (run - r0) / 1e6, 3)
                    acc[1] = round(acc[1] + (wait - w0) / 1e6, 3)
                    acc[2] += slices - s0
                prev[tid] = (run, wait, slices)
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(1.0)


if __name__ == "__main__":
    main()
