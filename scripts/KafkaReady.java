// Sluice local stack: Kafka readiness probe + idempotent topic creation, using only
// kafka-clients (part of the broker jars fetched by scripts/setup.sh). Adapted from
// /work/shared/reference/kafka/KafkaReady.java; extended with per-topic configs,
// partition growth for existing topics and a wait for partition leaders.
//
//   java -cp '<classes>:<libs>/*' KafkaReady <bootstrap> <timeout-seconds> [--replicas=N] [spec ...]
//   spec = name[:partitions[:key=value[,key=value...]]]
//   e.g.   sluice.deliveries:4  sluice.endpoints:1:cleanup.policy=compact
//
// Exit 0 once DescribeCluster returns >= N nodes (default 1), every requested topic exists
// with at least the requested partitions and configs, and every partition has a leader and
// N in-sync replicas. New topics get replication factor N. Exit 1 on timeout or error
// (message on stderr). Existing topics are never deleted or shrunk; a topic with more
// partitions than requested is left alone (a warning is printed), and so is one with fewer
// replicas (a warning too: reassigning replicas is an operator's decision).
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.TopicExistsException;

public class KafkaReady {
    private static final class Spec {
        final String name;
        final int partitions;
        final Map<String, String> configs = new LinkedHashMap<>();

        Spec(String arg) {
            String[] t = arg.split(":", 3);
            name = t[0];
            partitions = t.length > 1 && !t[1].isEmpty() ? Integer.parseInt(t[1]) : 1;
            if (t.length > 2 && !t[2].isEmpty()) {
                for (String kv : t[2].split(",")) {
                    int eq = kv.indexOf('=');
                    if (eq <= 0) {
                        throw new IllegalArgumentException("bad topic config '" + kv + "' in '" + arg + "'");
                    }
                    configs.put(kv.substring(0, eq), kv.substring(eq + 1));
                }
            }
        }
    }

    static long deadline;
    static int replicas = 1;

    static long remainingMs() {
        return Math.max(1000L, deadline - System.currentTimeMillis());
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: KafkaReady <bootstrap> <timeout-seconds> [name[:partitions[:k=v,...]] ...]");
            System.exit(2);
        }
        String bootstrap = args[0];
        deadline = System.currentTimeMillis() + Long.parseLong(args[1]) * 1000L;
        List<Spec> specs = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            if (args[i].startsWith("--replicas=")) {
                replicas = Integer.parseInt(args[i].substring("--replicas=".length()));
                if (replicas < 1 || replicas > 32) {
                    throw new IllegalArgumentException("--replicas must be 1..32, not " + replicas);
                }
            } else {
                specs.add(new Spec(args[i]));
            }
        }

        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "sluice-stack-ready");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "10000");

        try (Admin admin = Admin.create(p)) {
            waitForCluster(admin, bootstrap);
            if (!specs.isEmpty()) {
                ensureTopics(admin, specs);
                waitForLeaders(admin, specs);
            }
            System.out.println("kafka ready at " + bootstrap);
        } catch (Exception e) {
            Throwable c = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            System.err.println("KafkaReady: " + c);
            System.exit(1);
        }
    }

    static void waitForCluster(Admin admin, String bootstrap) throws Exception {
        Exception last = null;
        while (System.currentTimeMillis() < deadline) {
            try {
                int nodes = admin.describeCluster().nodes().get(10, TimeUnit.SECONDS).size();
                if (nodes >= replicas) {
                    return;
                }
                last = new IllegalStateException(nodes + " of " + replicas + " brokers registered");
            } catch (Exception e) {
                last = e;
            }
            Thread.sleep(500);
        }
        throw new IllegalStateException("kafka not ready at " + bootstrap + (last != null ? ": " + last : ""));
    }

    static void ensureTopics(Admin admin, List<Spec> specs) throws Exception {
        List<NewTopic> create = new ArrayList<>();
        for (Spec s : specs) {
            NewTopic nt = new NewTopic(s.name, s.partitions, (short) replicas);
            if (!s.configs.isEmpty()) {
                nt.configs(s.configs);
            }
            create.add(nt);
        }
        Map<String, Spec> existing = new LinkedHashMap<>();
        Map<String, Spec> byName = new HashMap<>();
        for (Spec s : specs) {
            byName.put(s.name, s);
        }
        for (Map.Entry<String, KafkaFuture<Void>> e : admin.createTopics(create).values().entrySet()) {
            try {
                e.getValue().get(remainingMs(), TimeUnit.MILLISECONDS);
                Spec s = byName.get(e.getKey());
                System.out.println("created topic " + s.name + " partitions=" + s.partitions
                        + (s.configs.isEmpty() ? "" : " configs=" + s.configs));
            } catch (ExecutionException ex) {
                if (ex.getCause() instanceof TopicExistsException) {
                    existing.put(e.getKey(), byName.get(e.getKey()));
                } else {
                    throw ex;
                }
            }
        }
        if (existing.isEmpty()) {
            return;
        }
        Map<String, TopicDescription> desc = admin.describeTopics(existing.keySet()).allTopicNames()
                .get(remainingMs(), TimeUnit.MILLISECONDS);
        Map<String, NewPartitions> grow = new HashMap<>();
        for (Spec s : existing.values()) {
            int have = desc.get(s.name).partitions().size();
            int rf = desc.get(s.name).partitions().get(0).replicas().size();
            if (rf < replicas) {
                System.out.println("topic exists " + s.name + " replication factor " + rf
                        + " (WARNING: fewer than the cluster's " + replicas + "; left as is)");
            }
            if (have < s.partitions) {
                grow.put(s.name, NewPartitions.increaseTo(s.partitions));
                System.out.println("topic exists " + s.name + ": growing partitions " + have + " -> " + s.partitions);
            } else if (have > s.partitions) {
                System.out.println("topic exists " + s.name + " partitions=" + have
                        + " (WARNING: more than the requested " + s.partitions + "; left as is)");
            } else {
                System.out.println("topic exists " + s.name + " partitions=" + have);
            }
        }
        if (!grow.isEmpty()) {
            admin.createPartitions(grow).all().get(remainingMs(), TimeUnit.MILLISECONDS);
        }
        // Make the requested configs true on existing topics too (no-op when they already are).
        List<ConfigResource> res = new ArrayList<>();
        for (Spec s : existing.values()) {
            if (!s.configs.isEmpty()) {
                res.add(new ConfigResource(ConfigResource.Type.TOPIC, s.name));
            }
        }
        if (res.isEmpty()) {
            return;
        }
        Map<ConfigResource, Config> cur = admin.describeConfigs(res).all().get(remainingMs(), TimeUnit.MILLISECONDS);
        Map<ConfigResource, Collection<AlterConfigOp>> ops = new HashMap<>();
        for (ConfigResource r : res) {
            Spec s = existing.get(r.name());
            List<AlterConfigOp> list = new ArrayList<>();
            for (Map.Entry<String, String> kv : s.configs.entrySet()) {
                ConfigEntry ce = cur.get(r).get(kv.getKey());
                if (ce == null || !kv.getValue().equals(ce.value())) {
                    list.add(new AlterConfigOp(new ConfigEntry(kv.getKey(), kv.getValue()), AlterConfigOp.OpType.SET));
                    System.out.println("topic " + s.name + ": setting " + kv.getKey() + "=" + kv.getValue()
                            + " (was " + (ce == null ? "unset" : ce.value()) + ")");
                }
            }
            if (!list.isEmpty()) {
                ops.put(r, list);
            }
        }
        if (!ops.isEmpty()) {
            admin.incrementalAlterConfigs(ops).all().get(remainingMs(), TimeUnit.MILLISECONDS);
        }
    }

    // CreateTopics returns once the controller committed the records; the broker's metadata
    // image can lag a moment. Wait until every partition has a leader so that clients started
    // right after this program do not see UNKNOWN_TOPIC_OR_PARTITION / LEADER_NOT_AVAILABLE.
    static void waitForLeaders(Admin admin, List<Spec> specs) throws Exception {
        List<String> names = new ArrayList<>();
        for (Spec s : specs) {
            names.add(s.name);
        }
        String problem = "";
        while (System.currentTimeMillis() < deadline) {
            problem = "";
            try {
                Map<String, TopicDescription> d = admin.describeTopics(names).allTopicNames()
                        .get(10, TimeUnit.SECONDS);
                for (Spec s : specs) {
                    TopicDescription td = d.get(s.name);
                    if (td.partitions().size() < s.partitions) {
                        problem = s.name + " has " + td.partitions().size() + " partitions";
                        break;
                    }
                    for (TopicPartitionInfo tp : td.partitions()) {
                        if (tp.leader() == null || tp.leader().isEmpty()) {
                            problem = s.name + "-" + tp.partition() + " has no leader";
                            break;
                        }
                        int want = Math.min(replicas, tp.replicas().size());
                        if (tp.isr().size() < want) {
                            problem = s.name + "-" + tp.partition() + " has " + tp.isr().size()
                                    + " of " + want + " replicas in sync";
                            break;
                        }
                    }
                    if (!problem.isEmpty()) {
                        break;
                    }
                }
            } catch (Exception e) {
                problem = e.toString();
            }
            if (problem.isEmpty()) {
                return;
            }
            Thread.sleep(200);
        }
        throw new IllegalStateException("topics not ready: " + problem);
    }
}
