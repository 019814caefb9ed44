"""Chaos scenario on a three-node Kafka cluster (replication factor 3, min.insync.replicas 2,
as production runs it): kill -9 of the broker that leads the most partitions of the
deliveries topic, mid-run, and its restart later. The other two nodes take over the
leadership; the producers (acks=all, idempotent), the consumer group and the recorder follow
the new leaders; nothing is lost, duplicates stay within the bound, and the group's lag and
the partitions' in-sync replicas recover.

The cluster is the module's own (chaos_stack.KafkaCluster, on ports of its own); Redis and
PostgreSQL come from the session stack."""

import collections
import time

import pytest

from chaos_lib import PROFILE, verify, wait_until
from chaos_stack import KafkaCluster


@pytest.fixture(scope="module")
def kafka_cluster(chaos_stack):
    import os
    first = int(os.environ.get("CHAOS_PORT_BASE", "28000")) + 200
    cl = KafkaCluster(port_base=first, keep=os.environ.get("CHAOS_KEEP") == "1")
    t = time.monotonic()
    cl.start()
    print(f"\n[chaos] kafka cluster in {cl.dir} on {cl.addr['SLUICE_KAFKA_BROKERS']} "
          f"({time.monotonic() - t:.1f}s)")
    yield cl
    cl.stop()


def test_kafka_partition_leader_killed_and_restarted(make_world, kafka_cluster):
    """Mid-run kill -9 of the node leading most of the deliveries partitions (it may also
    be the active controller or the group coordinator). While it is down, more events are
    produced: they must reach the new leaders. After its restart it rejoins the in-sync
    replicas. 0 lost; duplicates only from requests in flight when the group re-formed."""
    brokers = kafka_cluster.addr["SLUICE_KAFKA_BROKERS"]
    w = make_world(kafka_brokers=brokers, max_inflight_per_endpoint=2)
    topic = w.env["SLUICE_TOPIC_DELIVERIES"]
    # the world's topics got the brokers' defaults: three replicas each (a broker other than
    # the one that created the topic may answer before the new partitions reach it)
    wait_until(lambda: set(kafka_cluster.in_sync(topic).values()) == {3},
               timeout=PROFILE.t(30), interval=0.2,
               what="three in-sync replicas for every partition of the new topic")
    rcv = w.receiver()
    eps = w.endpoints(rcv, "ok", 6, "ok", "?delay_ms=30")
    eps += w.endpoints(rcv, "fl", 1, "flaky/30", "?delay_ms=30")
    eps += w.endpoints(rcv, "bad", 1, "status/400")
    w.produce_for(eps, PROFILE.n(120))
    w.recorder()
    w.consumer("a")
    w.consumer("b")
    w.wait_progress(rcv, 0.3, timeout=120)

    led = collections.Counter(kafka_cluster.leaders(topic).values())
    victim = led.most_common(1)[0][0]
    w.notes["killed_node"] = victim
    w.notes["partitions_led_by_it"] = led[victim]
    w.mark("fault_start")
    t_kill = time.monotonic()   # before kill_node, which also waits for the reaping
    kafka_cluster.kill_node(victim)
    # The controller fences the dead node after broker.session.timeout.ms (9 s by default)
    # and moves its partitions to the in-sync followers.
    wait_until(lambda: victim not in kafka_cluster.leaders(topic).values()
               and -1 not in kafka_cluster.leaders(topic).values(),
               timeout=PROFILE.t(60), interval=0.5,
               what="leadership of the dead node's partitions moved")
    w.notes["failover_s"] = round(time.monotonic() - t_kill, 1)
    # produced while the node is down: acks=all with two of three replicas in sync
    w.produce_for(eps[:-1], PROFILE.n(30))
    time.sleep(PROFILE.t(3))
    kafka_cluster.restart_down()
    w.mark("fault_end")
    w.notes["node_down_s"] = round(time.monotonic() - t_kill, 1)
    wait_until(lambda: set(kafka_cluster.in_sync(topic).values()) == {3},
               timeout=PROFILE.t(60), interval=0.5,
               what="the restarted node back in every ISR")
    w.produce_for(eps[:-1], PROFILE.n(10))
    per_ep = int(w.env["SLUICE_MAX_INFLIGHT_PER_ENDPOINT"])
    cap = min(int(w.env["SLUICE_MAX_INFLIGHT"]), per_ep * len(eps))
    verify(w, rcv, dup_bound=2 * cap,
           dup_reason="requests in flight when the group re-formed after its coordinator "
                      "moved (two pods)",
           settle_timeout=120)
