"""Shared state under clock skew (issue 19, item 1): two consumer pods whose wall clocks
(CLOCK_REALTIME, faked with libfaketime) run 10 s ahead and 10 s behind, against the real
stack. Leases, breaker cooldowns and probe leases, and the rate bucket are kept on Redis's
clock, so neither pod may take a job the other holds, probe a breaker before its cooldown
ends, or spend tokens the bucket does not have.

The pod that runs behind starts first and builds up the state (leases it holds, a breaker it
opened, a bucket it drained); the pod that runs ahead joins while that state is live, which is
when a comparison against a pod's own clock goes wrong. Which pod sent a request is read off
its signature timestamp (webhook-timestamp is the sending pod's wall clock) against the
receiver's arrival time, which also proves the fake clocks took effect.

The recorder judges how far ahead an outcome's time may be (recorder_future_max_s) by
PostgreSQL's clock, not its own: a recorder whose clock runs 30 s behind, allowed 10 s, records
the pods' outcomes and still quarantines one a minute ahead.

libfaketime hangs a process built with ASan, so this file is registered only in builds
without it (tests/e2e/CMakeLists.txt); scripts/test.sh's gcc stage runs it.
"""

import collections
import glob
import os
import time

import pytest

from sluice_e2e import Proc, event, psql, redis_cmd, wait_until

SKEW_S = 10


def skewed(offset_s):
    """Command prefix running the consumer with its clocks offset_s seconds off. `env` execs
    the consumer in place (the `faketime` wrapper forks, so SIGTERM would miss it). Preloaded
    first, the project's faketime_c11 shim routes librdkafka's C11 timed waits through
    pthread_cond_timedwait, which libfaketime translates (without it a pod 10 s ahead waited
    10 s extra on every librdkafka wait). libfaketime offsets CLOCK_MONOTONIC too (its
    default; its DONT_FAKE_MONOTONIC mode mistranslates waits on monotonic condition
    variables): a constant offset that only the process itself sees."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.fail("libfaketime is not installed (Debian package faketime; scripts/setup.sh "
                    "installs it)", pytrace=False)
    shim = os.path.join(os.environ["SL_BINARY_DIR"], "tests/e2e/libsl_faketime_c11.so")
    assert os.path.exists(shim), f"{shim} missing: build first (scripts/test.sh does)"
    return ["env", f"LD_PRELOAD={shim} {found[0]}", f"FAKETIME={offset_s:+d}s"]


def start_pods(w, first_ready, **cfg):
    """The pod behind starts first; once first_ready() holds, the pod ahead joins."""
    behind = w.consumer("behind", _wrap=skewed(-SKEW_S), **cfg)
    wait_until(first_ready, 60, 0.1, "state built by the pod behind")
    ahead = w.consumer("ahead", _wrap=skewed(SKEW_S), **cfg)
    return behind, ahead


def pod_of(line):
    """'ahead', 'behind' or None: the sender's clock offset from the receiver's, by its
    webhook-timestamp (whole seconds) against the arrival time."""
    if line.get("webhook_timestamp") is None:
        return None
    off = line["webhook_timestamp"] - line["ts_ms"] / 1000
    if abs(off - SKEW_S) < 3:
        return "ahead"
    if abs(off + SKEW_S) < 3:
        return "behind"
    return None


def hits(rcv, ep):
    return [l for l in rcv.ledger() if l["endpoint"] == ep]


def stop(*pods):
    for p in pods:
        assert p.term() == 0, p.logs()[-3000:]


def test_no_job_sent_twice_across_skewed_pods(make_world):
    """Retry jobs leased by the pod behind are not claimed again by the pod ahead: every
    delivery is sent exactly twice (its first attempt fails) and accepted once."""
    n = 100
    w = make_world(lease_ms=8000, http_timeout_ms=2000, http_connect_timeout_ms=1000,
                   retry_base_ms=100, retry_cap_ms=300, max_attempts=10,
                   breaker_threshold=100000)  # the failures are scripted, not ill health
    rcv = w.receiver()
    ep = "dup" + w.tag
    # every first attempt fails (so each delivery becomes a retry job in Redis); answers take
    # 100 ms and only 2 go at once per pod, so a pod holds claimed jobs for seconds
    w.add_endpoint(ep, rcv.url("ok", ep) + "?fail_n=1&delay_ms=100", "--max-inflight", "2")
    ok = lambda: [l for l in hits(rcv, ep) if 200 <= l["status"] < 300]
    first = [event(ep, i, w.tag) for i in range(n)]
    assert w.produce(first).returncode == 0
    # the pod behind holds the leases of most of the first batch's retries when the pod
    # ahead joins; the second batch's retries are claimed by both
    behind, ahead = start_pods(w, lambda: len(ok()) >= 10)
    wait_until(lambda: "partitions_assigned" in ahead.logs(), 60, 0.2, "the pod ahead in")
    second = [event(ep, i, w.tag) for i in range(n, 2 * n)]
    assert w.produce(second).returncode == 0
    ids = {e["id"] for e in first + second}
    wait_until(lambda: ids <= {l["webhook_id"] for l in ok()}, 120, 0.5,
               "every delivery accepted")
    time.sleep(3)  # a second copy of a lost lease would arrive by now
    stop(behind, ahead)

    lines = hits(rcv, ep)
    sent = collections.Counter(l["webhook_id"] for l in lines)
    accepted = collections.Counter(l["webhook_id"] for l in ok())
    twice = {i: c for i, c in accepted.items() if c > 1}
    assert not twice, f"{len(twice)} deliveries accepted more than once, e.g. {list(twice)[:5]}"
    extra = {i: c for i, c in sent.items() if c != 2}
    assert not extra, f"{len(extra)} deliveries not sent exactly twice: {list(extra.items())[:5]}"
    # both pods delivered, each on its own skewed clock (the fake clocks took effect)
    by_pod = collections.Counter(pod_of(l) for l in ok())
    assert by_pod["ahead"] > 0 and by_pod["behind"] > 0, by_pod
    assert by_pod[None] == 0, by_pod


def test_one_breaker_probe_per_cooldown_across_skewed_pods(make_world):
    """A breaker opened by the pod behind is probed once per cooldown, by either pod, never
    early: consecutive requests to a failing endpoint are a cooldown apart, the first probe
    included, although the pod ahead joins while the first cooldown runs."""
    cooldown = 6000  # ms; longer than a pod takes to start, so a joiner's probe would be early
    w = make_world(lease_ms=8000, http_timeout_ms=2000, http_connect_timeout_ms=1000,
                   retry_base_ms=100, retry_cap_ms=300, max_attempts=100,
                   breaker_cooldown_ms=cooldown, breaker_cooldown_max_ms=cooldown)
    rcv = w.receiver()
    ep = "brk" + w.tag
    # one request at a time per pod: the three failures that open the breaker come one after
    # another, and after them every request is a probe
    w.add_endpoint(ep, rcv.url("status/500", ep), "--breaker-threshold", "3",
                   "--breaker-cooldown-ms", str(cooldown), "--max-inflight", "1")
    assert w.produce([event(ep, i, w.tag) for i in range(40)]).returncode == 0
    key = f"sluice:breaker:{{{ep}}}"
    behind, ahead = start_pods(w, lambda: redis_cmd(w.redis_url, "HGET", key, "state") == b"open")
    time.sleep(4.5 * cooldown / 1000)
    stop(behind, ahead)

    arrivals = sorted((l["ts_ms"], pod_of(l)) for l in hits(rcv, ep))
    print("arrivals (ms after the first, pod):",
          [(t - arrivals[0][0], p) for t, p in arrivals])
    assert len(arrivals) >= 3 and all(p == "behind" for _, p in arrivals[:3]), arrivals[:4]
    # after the three that opened it, one probe per cooldown: never two closer than that
    # (each probe fails and re-opens the breaker for another cooldown)
    times = [t for t, _ in arrivals]
    gaps = [b - a for a, b in zip(times[2:], times[3:])]
    assert gaps, "no probe after the breaker opened"
    assert min(gaps) >= 0.9 * cooldown, f"a probe came early: gaps {gaps} ms"
    # ...and probing goes on while the endpoint stays down (a cooldown plus jitter apart)
    assert len(gaps) >= 3, f"only {len(gaps)} probes: gaps {gaps} ms"
    assert {p for _, p in arrivals} <= {"ahead", "behind"}, arrivals


def test_shared_rate_bucket_holds_across_skewed_pods(make_world):
    """Two pods on skewed clocks share one endpoint's bucket: arrivals in any one second stay
    within rate + burst, and the rate is reached."""
    rate, burst, n = 10, 5, 120
    w = make_world()
    rcv = w.receiver()
    # a small backlog bound spills the one partition's records to the Redis schedule, from
    # which both pods claim (as in test_policies.py)
    w.env["SLUICE_ENDPOINT_BACKLOG"] = "5"
    ep = w.add_endpoint("rl" + w.tag, rcv.url("ok", "rl" + w.tag), "--rate", str(rate),
                        "--rate-period-ms", "1000", "--burst", str(burst))
    events = [event(ep, i, w.tag) for i in range(n)]
    assert w.produce(events).returncode == 0
    behind, ahead = start_pods(w, lambda: len(hits(rcv, ep)) >= 2 * burst)
    ids = {e["id"] for e in events}
    wait_until(lambda: ids <= {l["webhook_id"] for l in hits(rcv, ep)}, 90, 0.5,
               "rate-limited deliveries")
    stop(behind, ahead)

    lines = hits(rcv, ep)
    ts = sorted(l["ts_ms"] for l in lines)
    # never above the bucket over any one-second window: rate + burst, plus what a pod may
    # hold as a lease taken just before the window (leases are used within 200 ms: rate / 5)
    slack = max(1, rate // 5)
    j = worst = 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= 1000:
            j += 1
        worst = max(worst, i - j + 1)
    assert worst <= rate + burst + slack, f"{worst} requests within one second"
    # the rate is reached, not just respected (a pod starved by the other's clock would halve
    # it while its share of the work waits)
    span = (ts[-1] - ts[0]) / 1000
    achieved = (len(ts) - burst) / span
    assert 0.6 * rate <= achieved <= 1.1 * rate, f"{achieved:.1f}/s for a limit of {rate}/s"
    by_pod = collections.Counter(pod_of(l) for l in lines)
    assert by_pod["ahead"] > 0 and by_pod["behind"] > 0, by_pod


def test_a_recorder_whose_clock_runs_behind_judges_outcomes_by_postgresql(make_world):
    """A recorder 30 s behind, allowed outcomes 10 s ahead: an outcome stamped now by a pod is
    30 s ahead of the recorder's clock but not of PostgreSQL's. It is recorded (it was
    quarantined, and with it every outcome of every pod); one a minute ahead is still
    quarantined; the recorder logs the offset it found."""
    w = make_world(recorder_flush_ms=100, recorder_future_max_s=10)
    ep = "rclk" + w.tag
    now = int(time.time() * 1000)
    for i, ts in enumerate((now, now + 60 * 1000)):
        w.put_outcome(ep, {"v": 1, "id": f"ev-rclk-{w.tag}-{i}", "ep": ep, "type": "order.paid",
                           "attempt": 1, "state": "delivered", "http": 200, "ts": ts,
                           "created": now, "pod": "test-pod"})
    rp = Proc(skewed(-30) + [w.bin("recorder/sluice-recorder")], w.env,
              os.path.join(w.dir, "recorder.log"))
    dsn = w.env["SLUICE_PG_DSN"]
    wait_until(lambda: psql(dsn, f"select count(*) from delivery_attempts where endpoint_id = "
                                 f"'{ep}'") == "1", 60, 0.5, "the outcome stamped now recorded")
    assert psql(dsn, f"select event_id from delivery_attempts where endpoint_id = '{ep}'") \
        == f"ev-rclk-{w.tag}-0"
    q = wait_until(lambda: w.dump("quarantine"), 60, 0.5, "the minute-ahead outcome quarantined")
    assert len(q) == 1 and "ahead of postgresql's clock (at most 10 s" in q[0]["reason"], q
    off = [l for l in rp.log_lines() if '"event":"clock_offset"' in l]
    assert off and "behind postgresql's" in off[0], rp.logs()[-3000:]
    assert rp.term() == 0
