"""Chaos suite library: a World on the chaos stack with a workload, fault helpers, and the
invariant check every scenario ends with.

Oracles (no component is trusted to grade itself):
  * the events we produced (ids and endpoints);
  * the receiver ledger: every request that reached an endpoint, with its status;
  * the outcome records on Kafka (`sluicectl dump outcomes`);
  * Kafka's committed offsets of the consumer group (sl-chaos-kafka lag);
  * Redis: lease hashes and retry sets of the world's database;
  * PostgreSQL history written by sluice-recorder (when the recorder is built).

Invariants checked by Verdict (chaos_lib.verify; the part that needs only the outcomes, the
ledger and the endpoints' scripts is chaos_lib.fate_verdict, unit-tested without a stack):
  missing == 0           every produced (event, endpoint) is delivered or dead-lettered
                         (a "duplicate" outcome counts as delivered only when the ledger shows
                         a 2xx for it)
  unaccepted == 0        every event with a "delivered" outcome got a 2xx from its endpoint
  conflicts == 0         no event is both delivered (2xx at the endpoint) and dead-lettered
  dead_unexplained == 0  a dead letter is a final fate only where its endpoint's script
                         explains it (dead_letter_reasons): a permanent answer (3xx, 4xx other
                         than 408/425/429) from an endpoint scripted to give one, or as many
                         transient failures at the endpoint as the retry budget; never on an
                         endpoint that always answers 2xx
  duplicates <= bound    extra 2xx per (event, endpoint) at the receivers, bound per scenario
  lag == 0               the consumer group committed everything of topic_deliveries
  leases == 0, jobs == 0 nothing leased or scheduled in Redis once everything is final
  history                recorder: deliveries table agrees with the above
"""

import collections
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))

from sluice_e2e import Proc, World, event, redis_cmd, wait_until  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

# ---------------------------------------------------------------------------- profiles


class Profile:
    """ci: the short profile (whole suite within ~6 minutes on 2 cores).
    soak: more events and repeated faults, run on demand (CHAOS_PROFILE=soak)."""

    def __init__(self, name):
        self.name = name
        soak = name == "soak"
        self.scale = int(os.environ.get("CHAOS_SCALE", "5" if soak else "1"))
        self.repeats = int(os.environ.get("CHAOS_REPEATS", "3" if soak else "1"))
        # time bounds scale with ctest's multiplier (sanitizer builds run slower)
        self.tmult = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1")) * (2 if soak else 1)

    def n(self, base):
        return base * self.scale

    def t(self, seconds):
        return seconds * self.tmult


PROFILE = Profile(os.environ.get("CHAOS_PROFILE", "ci"))
if PROFILE.name not in ("ci", "soak"):
    raise SystemExit(f"CHAOS_PROFILE must be ci or soak, not {PROFILE.name!r}")

# Consumer settings for every chaos world: tight timings so faults resolve in seconds.
# lease_ms > http_timeout_ms (invariant 6); session timeout 6 s is the broker's minimum.
DEFAULT_CFG = dict(
    retry_base_ms=200, retry_cap_ms=2000, max_attempts=8, lease_ms=5000,
    http_timeout_ms=2000, http_connect_timeout_ms=1000,
    breaker_threshold=10, breaker_cooldown_ms=1000, breaker_cooldown_max_ms=4000,
    shutdown_drain_ms=3000, retry_after_max_ms=5000,
    max_inflight=64, max_inflight_per_endpoint=4, dedup_window_s=3600,
    kafka_session_timeout_ms=6000, retry_shards=16,
)

RESULTS = []  # one dict per scenario, written to the results dir by conftest
# Log events no fault excuses: the consumer failed to encode its own records (an outcome or
# a retry job was lost; regression 8 in docs/CHAOS.md).
BAD_LOG_EVENTS = ("outcome_encode_failed", "job_encode_failed")
STARTED = datetime.datetime.now(datetime.timezone.utc)
_RESULTS_DIR = []


def results_dir():
    """CHAOS_RESULTS_DIR, else <SL_BINARY_DIR>/chaos-results/<profile>-<start time>."""
    if not _RESULTS_DIR:
        d = os.environ.get("CHAOS_RESULTS_DIR")
        if not d:
            stamp = STARTED.strftime("%Y%m%d-%H%M%S")
            base = os.environ.get("SL_BINARY_DIR") or HERE
            d = os.path.join(base, "chaos-results", f"{PROFILE.name}-{stamp}")
        os.makedirs(d, exist_ok=True)
        _RESULTS_DIR.append(d)
    return _RESULTS_DIR[0]


def world_dir(name):
    """Per-scenario directory under the results dir: process logs, ledgers and the outcome
    dump stay there for post-mortems (pytest's tmp dirs are rotated by other runs)."""
    d = os.path.join(results_dir(), "worlds", name)
    shutil.rmtree(d, ignore_errors=True)  # a rerun into the same results dir starts clean
    os.makedirs(d)
    return d


def now_ms():
    return int(time.time() * 1000)


def job_id(ep, event_id):
    return hashlib.sha1(f"{ep}\n{event_id}".encode()).hexdigest()


# ---------------------------------------------------------------------------- tools


_KAFKA_TOOL = []


def kafka_tool():
    """sl-chaos-kafka from the build (tests/chaos/CMakeLists.txt), else compiled once into
    the results dir (the suite also runs from a build without the chaos subdirectory)."""
    if _KAFKA_TOOL:
        return _KAFKA_TOOL[0]
    built = os.path.join(os.environ.get("SL_BINARY_DIR", ""), "tests", "chaos",
                         "sl-chaos-kafka")
    if not os.path.exists(built):
        built = os.path.join(results_dir(), "sl-chaos-kafka")
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "rdkafka"],
                               capture_output=True, text=True, check=True).stdout.split()
        subprocess.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", "-o", built,
                        os.path.join(HERE, "chaos_kafka.c"), *flags], check=True)
    _KAFKA_TOOL.append(built)
    return built


def kafka_lag(env, group, topic, workdir=None):
    """(total lag, per-partition rows) of group on topic."""
    r = subprocess.run([kafka_tool(), "lag", group, topic], env=env, capture_output=True,
                       text=True, timeout=60)
    if r.returncode not in (0, 3):
        raise AssertionError(f"sl-chaos-kafka lag failed ({r.returncode}): {r.stderr}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    total = rows[-1]["total_lag"]
    return total, rows[:-1]


def psql(dsn, sql):
    r = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                        dsn, "-c", sql], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PGCONNECT_TIMEOUT="5"))
    if r.returncode != 0:
        raise AssertionError(f"psql failed: {r.stderr.strip()}")
    return [line.split("\t") for line in r.stdout.splitlines() if line]


# ---------------------------------------------------------------------------- endpoint scripts

# What an attempt at a sluice-receiver endpoint can come to (the consumer's classification,
# README.md "Bounded, jittered retries"): a 2xx, a transient failure (no answer, a timeout,
# 408, 425, 429, 5xx: retried until the budget is spent) or a permanent one (3xx and the
# other 4xx: dead-lettered at once).
OK, TRANSIENT, PERMANENT = "ok", "transient", "permanent"


def status_fate(status):
    """The fate of one answer as the receiver's ledger records it (status 0: none sent)."""
    if 200 <= status < 300:
        return OK
    if status == 0 or status in (408, 425, 429) or status >= 500:
        return TRANSIENT
    return PERMANENT


def behaviour_fates(behaviour, query="", timeout_ms=15000):
    """The fates an attempt can have at receiver path <behaviour>[/<arg>] with its query
    (tests/receiver/README.md "Behaviours"), under a request timeout of timeout_ms. A
    behaviour not listed here raises: a new one must be classified before a verdict relies
    on it."""
    name, _, arg = behaviour.partition("/")
    q = {k: v[-1] for k, v in urllib.parse.parse_qs(query.lstrip("?")).items()}
    normal = status_fate(int(q["status"])) if "status" in q else OK
    if name in ("ok", "endless", "big"):
        fates = {normal}
    elif name == "status":
        fates = {status_fate(int(arg))}
    elif name == "slow":
        fates = {TRANSIENT if int(arg) >= timeout_ms else normal}
    elif name in ("flaky", "flaky_n"):
        n = int(arg)
        fates = {normal, TRANSIENT} if n > 0 else {normal}
        if name == "flaky" and n >= 100:
            fates = {TRANSIENT}
    elif name == "ratelimit":
        fates = {normal, TRANSIENT}
    elif name in ("retryafter", "reset", "hang"):
        fates = {TRANSIENT}
    elif name in ("unauth", "gone", "redirect"):
        fates = {PERMANENT}
    else:
        raise ValueError(f"receiver behaviour {behaviour!r} is not classified: add it to "
                         f"chaos_lib.behaviour_fates")
    if int(q.get("fail_pct", "0")) > 0 or int(q.get("fail_n", "0")) > 0:
        fates.add(status_fate(int(q.get("fail_status", "500"))))
    if "rate" in q:
        fates.add(TRANSIENT)
    if int(q.get("delay_ms", "0")) >= timeout_ms:
        fates = {TRANSIENT}  # every answer comes after the client gave up
    return fates


class EndpointScript:
    """What a chaos endpoint was scripted to do: its receiver behaviours over the scenario
    (the first from ChaosWorld.endpoints, later ones from set_url) and its retry budget."""

    def __init__(self, behaviour, query="", max_attempts=5, timeout_ms=15000):
        self.phases = [(behaviour, query)]
        self.max_attempts = max_attempts
        self.timeout_ms = timeout_ms

    def fates(self):
        out = set()
        for behaviour, query in self.phases:
            out |= behaviour_fates(behaviour, query, self.timeout_ms)
        return out

    def __repr__(self):
        return " then ".join(b + q for b, q in self.phases)


def dead_letter_reasons(dead, scripts, ledger):
    """The dead letters in `dead` ((event id, endpoint) pairs) that their endpoint's script
    does not explain, each with the reason: {pair: reason}. The evidence is the receiver's
    ledger, not the consumer's own outcome records:

      * an endpoint scripted to fail permanently: explained when the endpoint gave the event
        a permanent answer (3xx, 4xx other than 408/425/429);
      * an endpoint scripted to fail transiently (5xx, 429, resets, timeouts, flaky): explained
        only when the endpoint failed the event at least max_attempts times (the retry budget
        was spent: every attempt the consumer counts reached the endpoint);
      * an endpoint that always answers 2xx: never explained."""
    answers = collections.defaultdict(list)
    for line in ledger:
        answers[(line["webhook_id"], line["endpoint"])].append(line["status"])
    out = {}
    for k in sorted(dead):
        sc = scripts.get(k[1])
        if sc is None:
            out[k] = "its endpoint has no script in this world"
            continue
        fates = sc.fates()
        got = answers.get(k, [])
        permanent = [st for st in got if status_fate(st) == PERMANENT]
        transient = [st for st in got if status_fate(st) == TRANSIENT]
        if PERMANENT in fates and permanent:
            continue
        if TRANSIENT in fates and len(transient) >= sc.max_attempts:
            continue
        if fates == {OK}:
            why = "its endpoint always answers 2xx"
        elif TRANSIENT in fates:
            why = (f"the endpoint failed it {len(transient)} times, fewer than the "
                   f"{sc.max_attempts} attempts of its retry budget")
        else:
            why = "the endpoint never gave it a permanent answer"
        out[k] = f"{why} (script {sc!r}, answers {got})"
    return out


def flag_value(flags, name, default):
    """The value after `name` in a `sluicectl endpoints add` flag list, else default."""
    flags = list(flags)
    return flags[flags.index(name) + 1] if name in flags else default


# ---------------------------------------------------------------------------- the world


class ChaosWorld(World):
    """A World (isolated topics, groups, Redis db) with the chaos defaults, a timeline of
    marks, the produced events, and recorder processes. With redis_cluster (a
    chaos_stack.RedisCluster) the pods use that cluster instead of the stack's Redis: it has
    database 0 only, so it is flushed here and serves one world at a time, and the Redis
    oracles below read it through the cluster's own routing."""

    def __init__(self, tmpdir, name, partitions=4, redis_cluster=None, **cfg):
        merged = dict(DEFAULT_CFG)
        if redis_cluster is not None:
            merged["redis_url"] = redis_cluster.url()
        merged.update(cfg)
        super().__init__(tmpdir, partitions=partitions, **merged)
        self.cluster = redis_cluster
        if redis_cluster is not None:
            self.redis_url = redis_cluster.url()
            redis_cluster.on_masters("FLUSHALL")
        self.name = name
        self.events = []
        self.recorders = []
        self.killed = set()      # Procs we killed on purpose
        self.marks = {}          # label -> unix ms
        self.notes = {}          # extra figures for the report
        self.scripts = {}        # endpoint id -> EndpointScript (what the verdict expects)
        self.t_start = time.monotonic()

    # ---- timeline

    def mark(self, label):
        self.marks[label] = now_ms()
        return self.marks[label]

    # ---- workload

    def endpoints(self, rcv, prefix, count, behaviour="ok", query="", *flags):
        """count endpoints named <prefix><i>_<tag>, all with the same receiver behaviour;
        the endpoint id doubles as the receiver's endpoint name (ledger "endpoint")."""
        max_attempts = int(flag_value(flags, "--max-attempts", "0")) or \
            int(self.env.get("SLUICE_MAX_ATTEMPTS", "5"))
        timeout_ms = int(flag_value(flags, "--timeout-ms", "0")) or \
            int(self.env.get("SLUICE_HTTP_TIMEOUT_MS", "15000"))
        behaviour_fates(behaviour, query, timeout_ms)  # refuse an unclassified behaviour
        eps = []
        for i in range(count):
            ep = f"{prefix}{i}_{self.tag}"
            self.add_endpoint(ep, rcv.url(behaviour, ep) + query, *flags)
            self.scripts[ep] = EndpointScript(behaviour, query, max_attempts, timeout_ms)
            eps.append(ep)
        return eps

    def set_url(self, rcv, ep, behaviour, query=""):
        """Point ep at another receiver behaviour; the verdict judges its dead letters by
        every behaviour it had."""
        sc = self.scripts[ep]
        behaviour_fates(behaviour, query, sc.timeout_ms)
        r = self.ctl("endpoints", "update", ep, "--url", rcv.url(behaviour, ep) + query)
        assert r.returncode == 0, r.stderr
        sc.phases.append((behaviour, query))

    def produce_for(self, eps, per_ep):
        """per_ep events per endpoint, interleaved across endpoints."""
        evs = [event(ep, len(self.events) + i * len(eps) + k, self.tag)
               for i in range(per_ep) for k, ep in enumerate(eps)]
        r = self.produce(evs)
        assert r.returncode == 0, r.stderr
        self.events.extend(evs)
        return evs

    def want(self):
        return {(e["id"], e["endpoint"]) for e in self.events}

    # ---- processes

    def recorder(self, name="r0"):
        env = dict(self.env)
        env["SLUICE_INSTANCE_ID"] = name
        env.setdefault("SLUICE_RECORDER_FLUSH_MS", "200")
        log = os.path.join(self.dir, f"recorder-{name}.log")
        p = Proc([self.bin("recorder/sluice-recorder")], env, log)
        self.recorders.append(p)
        return p

    def kill9(self, proc):
        self.killed.add(proc)
        proc.kill9()

    def running_consumers(self):
        return [c for c in self.consumers if c.alive()]

    def close(self):
        for p in self.recorders:
            if p.alive():
                p.kill9()
        super().close()
        # Keep the broker small: a broker killed with -9 recovers every log when it starts.
        topics = [self.env[k] for k in ("SLUICE_TOPIC_DELIVERIES", "SLUICE_TOPIC_OUTCOMES",
                                        "SLUICE_TOPIC_QUARANTINE", "SLUICE_TOPIC_ENDPOINTS")]
        subprocess.run([kafka_tool(), "delete", *topics], env=self.env, capture_output=True,
                       timeout=60)

    # ---- oracles

    DUMP_HANGS = 0  # times `sluicectl dump` printed everything but did not exit (see dump)

    def dump(self, kind, idle_ms=1000):
        """`sluicectl dump` with a watchdog. The dump ends at the ends the partitions had
        when it started (regression 11 in docs/CHAOS.md: it used to run on while one
        partition kept growing); the watchdog stays as a guard and counts hangs
        (`dump_hangs`, expected 0). A dump killed by it has printed everything that existed
        when it started, so its complete lines are used; one that printed nothing is
        retried."""
        for _ in range(3):
            try:
                r = subprocess.run([self.bin("ctl/sluicectl"), "dump", kind, "--idle-ms",
                                    str(idle_ms)], env=self.env, capture_output=True,
                                   text=True, timeout=PROFILE.t(8))
                assert r.returncode == 0, r.stderr
                out = r.stdout
            except subprocess.TimeoutExpired as ex:
                ChaosWorld.DUMP_HANGS += 1
                out = ex.stdout.decode() if isinstance(ex.stdout, bytes) else (ex.stdout or "")
                # killed: keep the complete lines (the tail of a block may be cut off); the
                # final dumps run with no consumer left, when dumps end on their own
                lines = out.splitlines()
                if lines and not out.endswith("\n"):
                    lines.pop()
                out = "\n".join(lines)
                if not out.strip():
                    continue
            return [json.loads(line) for line in out.splitlines() if line.strip()]
        raise AssertionError(f"sluicectl dump {kind} hung three times without output")

    def accepted(self, rcv):
        """(webhook id, endpoint) -> number of 2xx answers at the receiver."""
        return accepted_pairs(rcv.ledger())

    def accepted_count(self, rcv):
        want = self.want()
        return sum(1 for k in self.accepted(rcv) if k in want)

    def wait_progress(self, rcv, frac, timeout=60):
        target = max(1, int(frac * len(self.events)))
        wait_until(lambda: self.accepted_count(rcv) >= target, PROFILE.t(timeout), 0.1,
                   f"{frac:.0%} of {len(self.events)} events accepted")

    def terminal(self, outcomes, accepted):
        """Keys of produced events whose fate is final."""
        states = collections.defaultdict(set)
        for o in outcomes:
            states[(o.get("id"), o.get("endpoint"))].add(o["state"])
        out = set()
        for k in self.want():
            s = states.get(k, ())
            if "delivered" in s or "dead_letter" in s or ("duplicate" in s and k in accepted):
                out.add(k)
        return out

    def wait_settled(self, rcv, timeout=90):
        """Until every produced event is delivered or dead-lettered (or the timeout)."""
        want = self.want()
        deadline = time.monotonic() + PROFILE.t(timeout)
        left = want
        while time.monotonic() < deadline:
            left = want - self.terminal(self.outcomes(), self.accepted(rcv))
            if not left:
                return 0
            time.sleep(1.0)
        return len(left)

    def redis(self, *args):
        """One command on the world's Redis (a cluster routes it by its key, args[1])."""
        if self.cluster is not None:
            return self.cluster.cmd(*args)
        return redis_cmd(self.redis_url, *args)

    def redis_state(self):
        """(leases, jobs for our events, all jobs) in the world's Redis database."""
        nshards = int(self.env.get("SLUICE_RETRY_SHARDS", "16"))
        ours = {job_id(e["endpoint"], e["id"]) for e in self.events}
        leases = jobs = ours_left = 0
        for s in range(nshards):
            leases += self.redis("HLEN", f"sluice:lease:{{{s}}}")
            members = self.redis("ZRANGE", f"sluice:retry:{{{s}}}", 0, -1) or []
            jobs += len(members)
            ours_left += sum(1 for m in members if m.decode() in ours)
        return leases, ours_left, jobs

    def job_ids(self):
        """Every retry job id in the world's Redis database (all shards)."""
        nshards = int(self.env.get("SLUICE_RETRY_SHARDS", "16"))
        out = set()
        for s in range(nshards):
            out.update(m.decode() for m in
                       self.redis("ZRANGE", f"sluice:retry:{{{s}}}", 0, -1) or [])
        return out

    def leftover_jobs(self, states, limit=5):
        """A few retry jobs still in Redis: (event, endpoint, due in ms, states seen)."""
        nshards = int(self.env.get("SLUICE_RETRY_SHARDS", "16"))
        by_job = {job_id(e["endpoint"], e["id"]): (e["id"], e["endpoint"]) for e in self.events}
        out = []
        now = now_ms()
        for s in range(nshards):
            members = self.redis("ZRANGE", f"sluice:retry:{{{s}}}", 0, -1,
                                 "WITHSCORES") or []
            for m, score in zip(members[::2], members[1::2]):
                k = by_job.get(m.decode(), ("?", "?"))
                out.append((k, int(float(score)) - now, sorted(states.get(k, ()))))
                if len(out) >= limit:
                    return out
        return out

    def stop_consumers(self, timeout=60):
        """SIGTERM every running consumer; each must exit 0."""
        bad = []
        for c in self.running_consumers():
            t = time.monotonic()
            rc = c.term(timeout=PROFILE.t(timeout))
            if rc != 0:
                bad.append(f"consumer exited {rc} after SIGTERM ({time.monotonic() - t:.1f}s):"
                           f"\n{c.logs()[-2000:]}")
        assert not bad, "\n".join(bad)

    def tails(self, n=1500):
        out = []
        for c in self.consumers:
            out.append(f"--- {c.log_path}\n{c.logs()[-n:]}")
        return "\n".join(out)


# ---------------------------------------------------------------------------- verdict


def accepted_pairs(ledger):
    """(webhook id, endpoint) -> number of 2xx answers in a receiver ledger."""
    acc = collections.Counter()
    for line in ledger:
        if 200 <= line["status"] < 300 and line["webhook_id"]:
            acc[(line["webhook_id"], line["endpoint"])] += 1
    return acc


def fate_verdict(want, outcomes, ledger, scripts, dup_bound, dup_reason,
                 allow_dead_accepted=False):
    """The fate part of the verdict, from the oracles alone (no running system): want, the
    produced (event id, endpoint) pairs; outcomes, the outcome records; ledger, the receiver
    ledger lines; scripts, endpoint id -> EndpointScript. Returns a dict of the sets
    (delivered, dead, marker_only, missing, unaccepted, dead_accepted), dead_unexplained
    ({pair: reason}, dead_letter_reasons), duplicates, attempts (pair -> highest attempt)
    and problems (one message per broken invariant; empty when every fate is right)."""
    acc = accepted_pairs(ledger)
    states = collections.defaultdict(set)
    attempts = collections.defaultdict(int)
    for o in outcomes:
        k = (o.get("id"), o.get("endpoint"))
        states[k].add(o["state"])
        attempts[k] = max(attempts[k], o["attempt"])
    delivered = {k for k in want if "delivered" in states.get(k, ())}
    dead = {k for k in want if "dead_letter" in states.get(k, ())}
    marker_only = {k for k in want if k not in delivered and "duplicate" in states.get(k, ())
                   and k in acc}
    missing = want - delivered - dead - marker_only
    unaccepted = delivered - set(acc)
    dead_accepted = dead & set(acc)
    dead_unexplained = dead_letter_reasons(dead, scripts, ledger)
    duplicates = sum(n - 1 for k, n in acc.items() if k in want)
    problems = []
    if missing:
        problems.append(f"{len(missing)} events missing (not delivered, not dead-lettered): "
                        f"{sorted(missing)[:5]}")
    if unaccepted:
        problems.append(f"{len(unaccepted)} events reported delivered without a 2xx at the "
                        f"endpoint: {sorted(unaccepted)[:5]}")
    if dead_accepted and not allow_dead_accepted:
        problems.append(f"{len(dead_accepted)} events dead-lettered although the endpoint "
                        f"accepted them: {sorted(dead_accepted)[:5]}")
    if dead_unexplained:
        sample = "; ".join(f"{k}: {why}" for k, why in list(dead_unexplained.items())[:3])
        problems.append(f"{len(dead_unexplained)} dead letters their endpoint's script does "
                        f"not explain: {sample}")
    if duplicates > dup_bound:
        problems.append(f"{duplicates} duplicate deliveries exceed the bound {dup_bound} "
                        f"({dup_reason})")
    if marker_only:
        # delivered (the endpoint has it, the marker says so) but no delivered outcome: the
        # copy read again must report the delivery again from its marker (regression 13)
        problems.append(f"{len(marker_only)} events delivered without a delivered outcome "
                        f"(only duplicates): {sorted(marker_only)[:5]}")
    return {"acc": acc, "states": states, "attempts": attempts, "delivered": delivered,
            "dead": dead, "marker_only": marker_only, "missing": missing,
            "unaccepted": unaccepted, "dead_accepted": dead_accepted,
            "dead_unexplained": dead_unexplained, "duplicates": duplicates,
            "problems": problems}


def ledger_gaps(rcv, since_ms, eps=None):
    """Largest gap (s) between consecutive 2xx answers after since_ms (for eps, if given)."""
    ts = sorted(line["ts_ms"] for line in rcv.ledger()
                if 200 <= line["status"] < 300 and line["ts_ms"] >= since_ms and
                (eps is None or line["endpoint"] in eps))
    if len(ts) < 2:
        return 0.0
    return max(b - a for a, b in zip(ts, ts[1:])) / 1000.0


def verify(w, rcv, dup_bound, dup_reason, settle_timeout=90, fault_end=None,
           allow_dead_accepted=False, unexpected_deaths=True):
    """Wait until everything is final, stop the consumers, check every invariant, record
    and print the figures. Returns the figures dict."""
    t_verify = time.monotonic()
    # Every consumer we did not kill on purpose must still be running (no crash).
    if unexpected_deaths:
        dead = [c for c in w.consumers if not c.alive() and c not in w.killed and
                c.p.returncode is not None and c.p.returncode != 0]
        assert not dead, "a consumer died by itself:\n" + "\n".join(
            f"--- exit {c.p.returncode}\n{c.logs()[-3000:]}" for c in dead)
    left = w.wait_settled(rcv, timeout=settle_timeout)
    # Retry jobs settle right after their outcome is acknowledged; offsets are committed
    # about a second after their fate is durable (auto-commit of stored offsets), or once
    # the group has re-formed after a coordinator outage. Both must happen while the pods
    # run; the end state is checked again after they stop.
    t_settled = time.monotonic()
    deadline = t_settled + PROFILE.t(60)
    group = w.env["SLUICE_CONSUMER_GROUP"]
    topic = w.env["SLUICE_TOPIC_DELIVERIES"]
    while time.monotonic() < deadline:
        leases, ours_left, jobs = w.redis_state()
        if leases == 0 and jobs == 0 and kafka_lag(w.env, group, topic, w.dir)[0] == 0:
            break
        time.sleep(0.5)
    commit_wait_s = round(time.monotonic() - t_settled, 1)
    w.stop_consumers()
    outcomes = w.outcomes()
    with open(os.path.join(w.dir, "outcomes.jsonl"), "w") as f:  # for post-mortems
        for o in outcomes:
            f.write(json.dumps(o) + "\n")
    want = w.want()
    fv = fate_verdict(want, outcomes, rcv.ledger(), w.scripts, dup_bound, dup_reason,
                      allow_dead_accepted)
    acc, states, attempts = fv["acc"], fv["states"], fv["attempts"]
    delivered, dead, marker_only = fv["delivered"], fv["dead"], fv["marker_only"]
    missing, unaccepted, dead_accepted = fv["missing"], fv["unaccepted"], fv["dead_accepted"]
    duplicates = fv["duplicates"]
    leases, ours_left, jobs = w.redis_state()
    lag, lag_rows = kafka_lag(w.env, w.env["SLUICE_CONSUMER_GROUP"],
                              w.env["SLUICE_TOPIC_DELIVERIES"], w.dir)
    bad_logs = [line[:300] for c in w.consumers for line in c.logs().splitlines()
                if any(f'"event":"{ev}"' in line for ev in BAD_LOG_EVENTS)]
    fault_end = fault_end or w.marks.get("fault_end")
    figures = {
        "scenario": w.name,
        "profile": PROFILE.name,
        "events": len(want),
        "delivered": len(delivered | marker_only),
        "dead_lettered": len(dead - set(acc)) if not allow_dead_accepted else len(dead),
        "missing": len(missing),
        "unaccepted": len(unaccepted),
        "conflicts": len(dead_accepted),
        "dead_unexplained": len(fv["dead_unexplained"]),
        "marker_only": len(marker_only),
        "duplicates": duplicates,
        "dup_bound": dup_bound,
        "dup_reason": dup_reason,
        "max_attempt": max(attempts.values()) if attempts else 0,
        "bad_log_lines": len(bad_logs),
        "outcome_records": len(outcomes),
        "kafka_lag": lag,
        "redis_leases": leases,
        "redis_jobs": jobs,
        "commit_wait_s": commit_wait_s,
        "consumers_started": len(w.consumers),
        "dump_hangs": ChaosWorld.DUMP_HANGS,
        "consumers_killed": len(w.killed),
    }
    if fault_end:
        after = sorted(line["ts_ms"] for line in rcv.ledger()
                       if 200 <= line["status"] < 300 and line["ts_ms"] >= fault_end)
        final_ts = [o["ts_ms"] for o in outcomes
                    if o["state"] in ("delivered", "dead_letter") and (o["id"], o["endpoint"])
                    in want]
        figures["recovery_s"] = round((after[0] - fault_end) / 1000.0, 2) if after else None
        # time from the end of the fault until the last event was final (0: all were final
        # before the fault ended)
        figures["settle_s"] = max(0.0, round((max(final_ts) - fault_end) / 1000.0, 2)) \
            if final_ts else None
    if "fault_start" in w.marks:
        figures["max_gap_s"] = round(ledger_gaps(rcv, w.marks["fault_start"]), 2)
    figures.update(w.notes)
    # history (recorder)
    if w.recorders:
        figures.update(verify_history(w, delivered, dead, marker_only, acc))
    figures["verify_s"] = round(time.monotonic() - t_verify, 1)
    figures["wall_s"] = round(time.monotonic() - w.t_start, 1)
    RESULTS.append(figures)
    print("\nCHAOS " + json.dumps(figures, sort_keys=True))
    problems = list(fv["problems"])
    if lag != 0:
        problems.append(f"consumer group lag {lag} after shutdown: {lag_rows}")
    if bad_logs:
        problems.append(f"{len(bad_logs)} log lines no fault excuses, e.g. {bad_logs[0]}")
    if leases or jobs:
        problems.append(f"redis not clean at the end: {leases} leases, {jobs} retry jobs "
                        f"({ours_left} for our events): {w.leftover_jobs(states)}")
    for k in ("history_missing", "history_disagree"):
        if figures.get(k):
            problems.append(f"{k}: {figures[k]} ({figures.get(k + '_sample')})")
    if left and not missing:
        problems.append(f"{left} events were not final within the settle timeout")
    problems.append(f"world: {w.dir}, redis {w.redis_url}, topics t{w.tag}.*")
    assert len(problems) == 1, "\n".join(problems) + "\n" + w.tails()
    return figures


def verify_history(w, delivered, dead, marker_only, acc):
    """The recorder's PostgreSQL history against the oracles: once the recorder has read
    every outcome (its group lag on topic_outcomes is 0), deliveries.state must be delivered
    for delivered events and dead_letter for the dead-lettered ones."""
    group = w.env["SLUICE_RECORDER_GROUP"]
    topic = w.env["SLUICE_TOPIC_OUTCOMES"]
    deadline = time.monotonic() + PROFILE.t(60)
    lag = None
    while time.monotonic() < deadline:
        lag, _ = kafka_lag(w.env, group, topic, w.dir)
        if lag == 0:
            break
        time.sleep(0.5)
    for r in w.recorders:
        if r.alive():
            rc = r.term(timeout=PROFILE.t(60))
            assert rc == 0, f"recorder exited {rc}:\n{r.logs()[-3000:]}"
    rows = psql(w.env["SLUICE_PG_DSN"],
                f"select event_id, endpoint_id, state from deliveries "
                f"where event_id like 'evt\\_{w.tag}\\_%'")
    hist = {(r[0], r[1]): r[2] for r in rows}
    dl = psql(w.env["SLUICE_PG_DSN"],
              f"select count(*) from dead_letters where event_id like 'evt\\_{w.tag}\\_%'")
    want = w.want()
    missing = sorted(k for k in want if k not in hist)
    disagree = []
    for k in want:
        h = hist.get(k)
        if h is None:
            continue
        if k in delivered and h != "delivered":
            disagree.append((k, h, "delivered"))
        elif k in dead and k not in delivered and h != "dead_letter":
            disagree.append((k, h, "dead_letter"))
        elif k in marker_only and h not in ("duplicate", "delivered"):
            disagree.append((k, h, "duplicate"))
        if h == "delivered" and k not in acc:
            disagree.append((k, h, "no 2xx in ledger"))
    return {
        "history_lag": lag,
        "history_rows": len(hist),
        "history_dead_letters": int(dl[0][0]) if dl else 0,
        "history_missing": len(missing),
        "history_missing_sample": missing[:3],
        "history_disagree": len(disagree),
        "history_disagree_sample": disagree[:3],
    }


__all__ = ["ChaosWorld", "PROFILE", "RESULTS", "verify", "verify_history", "now_ms", "job_id",
           "kafka_lag", "kafka_tool", "psql", "ledger_gaps", "results_dir",
           "world_dir", "redis_cmd", "wait_until", "event", "fate_verdict",
           "dead_letter_reasons", "behaviour_fates", "status_fate", "EndpointScript",
           "accepted_pairs", "OK", "TRANSIENT", "PERMANENT"]
