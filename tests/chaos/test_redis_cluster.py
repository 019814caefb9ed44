"""Chaos scenario on a Redis Cluster (three masters with one replica each, as production
runs it): kill -9 of the master that holds the most retry shards, mid-run, while a steady
stream of events flows and retries, breakers and delivered markers live in the cluster; its
replica is promoted by the cluster, and the killed node is restarted later (it rejoins as a
replica). The pods' Redis client follows the cluster to the promoted replica; nothing is
lost, duplicates stay within the bound, the retry schedule drains and the group's lag returns
to 0.

The cluster is the module's own (chaos_stack.RedisCluster, on ports of its own); Kafka and
PostgreSQL come from the session stack."""

import collections
import os
import threading
import time

import pytest

from chaos_lib import PROFILE, verify, wait_until
from chaos_stack import RedisCluster
from sluice_e2e import key_slot


@pytest.fixture(scope="module")
def redis_cluster(chaos_stack):
    first = int(os.environ.get("CHAOS_PORT_BASE", "28000")) + 400
    cl = RedisCluster(stack_dir=os.path.join(chaos_stack.dir, "redis-cluster"),
                      port_base=first, keep=os.environ.get("CHAOS_KEEP") == "1")
    t = time.monotonic()
    cl.start()
    print(f"\n[chaos] redis cluster in {cl.dir} on {cl.url()} ({time.monotonic() - t:.1f}s)")
    yield cl
    cl.stop()


class Stream:
    """A steady stream: `chunk` events per endpoint every `period` seconds, `chunks` times,
    produced by a thread (the only producer while it runs). produced_between(t0, t1) counts
    the events produced in a window of unix ms."""

    def __init__(self, w, eps, chunks, chunk=5, period=0.5):
        self.w, self.eps, self.chunks, self.chunk, self.period = w, eps, chunks, chunk, period
        self.done = 0
        self.log = []  # (unix ms, events)
        self.error = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            nxt = time.monotonic()
            while self.done < self.chunks and not self.stopping.is_set():
                n = len(self.w.produce_for(self.eps, self.chunk))
                self.log.append((int(time.time() * 1000), n))
                self.done += 1
                nxt += self.period
                time.sleep(max(0.0, nxt - time.monotonic()))
        except BaseException as ex:  # re-raised by join
            self.error = ex

    def start(self):
        self.thread.start()
        return self

    def running(self):
        return self.thread.is_alive()

    def join(self, timeout):
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stopping.set()
            self.thread.join(30)
            raise AssertionError(f"the stream did not finish within {timeout}s")
        if self.error:
            raise self.error

    def produced_between(self, t0, t1):
        return sum(n for ts, n in self.log if t0 <= ts <= t1)


def retry_shard_owners(cl, nshards):
    """master index -> the retry shards (sluice:retry:{s}) whose slot it serves."""
    out = collections.defaultdict(list)
    for s in range(nshards):
        out[cl.owner(key_slot(f"sluice:retry:{{{s}}}"))].append(s)
    return out


def test_redis_cluster_master_killed_and_restarted(make_world, redis_cluster):
    """Mid-run kill -9 of the master serving the most retry shards. Until its replica is
    promoted (the surviving masters flag it failed after cluster-node-timeout, 2 s, and the
    replica wins the election) the cluster answers CLUSTERDOWN for every slot (the default
    cluster-require-full-coverage); the stream goes on. After the failover the pods find the
    promoted replica; later the killed node is restarted and rejoins as its replica. 0 lost;
    duplicates only from Redis writes the dead master had acknowledged but not yet replicated
    and from deliveries in flight around the kill."""
    cl = redis_cluster
    assert cl.health() == [], cl.health()
    w = make_world(redis_cluster=cl, max_inflight_per_endpoint=2)
    rcv = w.receiver()
    eps = w.endpoints(rcv, "ok", 6, "ok", "?delay_ms=30")
    eps += w.endpoints(rcv, "fl", 2, "flaky/30", "?delay_ms=30")   # retries in the schedule
    eps += w.endpoints(rcv, "bad", 1, "status/400")                 # dead letters, "d" markers
    # down until the killed node is back: its breaker opens and its deliveries wait in the
    # schedule (deferrals) across the failover
    down = w.endpoints(rcv, "down", 1, "status/503")
    w.produce_for(down, PROFILE.n(40))
    stream = Stream(w, eps, chunks=PROFILE.n(30)).start()   # 15 s (ci) of 10 events/s/endpoint
    w.recorder()
    pods = [w.consumer("a"), w.consumer("b")]
    nshards = int(w.env["SLUICE_RETRY_SHARDS"])
    breaker = f"sluice:breaker:{{{down[0]}}}"
    wait_until(lambda: w.redis("HGET", breaker, "state") == b"open", PROFILE.t(30), 0.1,
               "the down endpoint's breaker open")

    figures = collections.defaultdict(list)
    for i in range(PROFILE.repeats):
        frac = 0.3 + 0.2 * i
        wait_until(lambda: stream.done >= frac * stream.chunks, PROFILE.t(120), 0.1,
                   f"{frac:.0%} of the stream produced")
        # the victim: the master serving the most retry shards; among equals, the one with
        # the most of this world's endpoint keys (breakers, rate buckets, markers)
        shards = retry_shard_owners(cl, nshards)
        ep_slots = collections.Counter(cl.owner(key_slot(f"{{{ep}}}")) for ep in eps + down)
        victim = max(shards, key=lambda m: (len(shards[m]), ep_slots[m]))
        slots = cl.masters()[victim]
        replica = cl.replicas_of(victim)
        assert len(replica) == 1, (victim, replica, cl.nodes_view(victim))
        # retry jobs in the victim's shards at the kill (the flaky and down endpoints')
        wait_until(lambda: sum(w.redis("ZCARD", f"sluice:retry:{{{s}}}")
                               for s in shards[victim]) >= 5,
                   PROFILE.t(30), 0.1, "retry jobs on the master to kill")
        jobs = sum(w.redis("ZCARD", f"sluice:retry:{{{s}}}") for s in shards[victim])
        assert stream.running(), "the stream ended before the fault"
        if i == 0:
            w.mark("fault_start")
        t_kill_ms = int(time.time() * 1000)
        t_kill = time.monotonic()   # before kill_node, which also waits for the reaping
        cl.kill_node(victim)
        promoted = cl.wait_failover(victim, slots, timeout=PROFILE.t(60))
        failover_s = round(time.monotonic() - t_kill, 1)
        assert promoted == replica[0], f"slots of {victim} went to {promoted}, not {replica}"
        time.sleep(PROFILE.t(2))   # the stream goes on with one master fewer
        cl.restart_node(victim, timeout=PROFILE.t(60))
        assert cl.info(victim)["role"] == "slave" and cl.replicas_of(promoted) == [victim], \
            cl.nodes_view(promoted)
        figures["killed_port"].append(cl.port(victim))
        figures["retry_shards_on_it"].append(len(shards[victim]))
        figures["endpoints_on_it"].append(ep_slots[victim])
        figures["jobs_on_it_at_kill"].append(jobs)
        figures["failover_s"].append(failover_s)
        figures["node_down_s"].append(round(time.monotonic() - t_kill, 1))
        figures["produced_during_fault"].append(
            stream.produced_between(t_kill_ms, int(time.time() * 1000)))
    w.mark("fault_end")
    assert all(figures["produced_during_fault"]), "no event produced while a node was down"
    w.notes.update({k: v[0] if len(v) == 1 else v for k, v in figures.items()})
    w.set_url(rcv, down[0], "ok")
    stream.join(PROFILE.t(120))
    per_ep = int(w.env["SLUICE_MAX_INFLIGHT_PER_ENDPOINT"])
    cap = min(int(w.env["SLUICE_MAX_INFLIGHT"]), per_ep * len(eps + down))
    res = verify(w, rcv, dup_bound=2 * PROFILE.repeats * cap,
                 dup_reason="deliveries in flight or just answered at the kill (two pods) "
                            "whose delivered marker, lease or job completion the dead master "
                            "had acknowledged but not yet replicated (asynchronous "
                            "replication), or had not taken yet, so their copy was sent again",
                 settle_timeout=120)
    # the schedule drained everywhere: no job body left behind either, and the cluster whole
    bodies = cl.scan_keys("sluice:job:*")
    res["redis_job_bodies"] = len(bodies)
    assert not bodies, f"{len(bodies)} job bodies left in the cluster: {bodies[:3]}"
    assert cl.health() == [], cl.health()
    # a failover to a replica that had the data loses nothing: the binding's witnesses
    # (sluice:owner:{w...}) were all there, so no consumer reported a loss
    assert not [e for p in pods for e in p.events("redis_state_lost")]
