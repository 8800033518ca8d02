// The test suite's hands on a real Kafka cluster, through Apache Kafka's own
// Java client (kafka-clients), so that what pg outbox sends through
// librdkafka is read back by a client that shares none of its code.
//
//   ready   <bootstrap> <brokers> <seconds>   until the cluster describes that many brokers
//   create-topic <bootstrap> <topic> <partitions> <replicas> [name=value ...]
//   add-scram <bootstrap> <user> <password>     a SCRAM-SHA-512 credential
//   deny-write <bootstrap> <topic> <principal>   a DENY WRITE ACL (StandardAuthorizer)
//   allow-describe <bootstrap> <topic> <principal>  an ALLOW DESCRIBE ACL (the topic's metadata)
//   quorum-leader <bootstrap>                    the active controller's node id
//   describe <bootstrap> <topic>                 per partition: id, leader, ISR size, end offset
//   group-offsets <bootstrap> <group>           partition TAB committed offset, per partition
//   dump <bootstrap> <topic>                     every record, from the beginning to the end
//                                                offsets as of the call, one line each
//
// dump prints: partition TAB offset TAB key TAB value TAB java-partition TAB headers,
// with key and value in base64 ("-" for null), java-partition the partition
// Java's default partitioner picks for the key (murmur2, as the producer does),
// and headers as name:value pairs in base64 joined by ",".
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.resource.*;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.utils.Utils;

public class KafkaTool {
    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        extra(p);
        return Admin.create(p);
    }

    // KAFKA_TOOL_CONFIG: more client properties, name=value, separated by '|' (TLS, SASL).
    static void extra(Properties p) {
        String extra = System.getenv("KAFKA_TOOL_CONFIG");
        if (extra == null || extra.isEmpty()) return;
        for (String kv : extra.split("\\|")) {
            String[] x = kv.split("=", 2);
            p.put(x[0], x[1]);
        }
    }

    static String b64(byte[] b) {
        return b == null ? "-" : Base64.getEncoder().encodeToString(b);
    }

    public static void main(String[] a) throws Exception {
        switch (a[0]) {
            case "ready": ready(a[1], Integer.parseInt(a[2]), Integer.parseInt(a[3])); break;
            case "create-topic": createTopic(a); break;
            case "deny-write": acl(a[1], a[2], a[3], AclOperation.WRITE, AclPermissionType.DENY); break;
            case "allow-describe": acl(a[1], a[2], a[3], AclOperation.DESCRIBE, AclPermissionType.ALLOW); break;
            case "add-scram":
                try (Admin ad = admin(a[1])) {
                    ad.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(a[2],
                            new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), a[3]))).all().get();
                }
                break;
            case "quorum-leader":
                try (Admin ad = admin(a[1])) {
                    System.out.println(ad.describeMetadataQuorum().quorumInfo().get().leaderId());
                }
                break;
            case "txn-coordinator":
                try (Admin ad = admin(a[1])) {
                    System.out.println(ad.describeTransactions(List.of(a[2])).description(a[2]).get()
                                         .coordinatorId());
                }
                break;
            case "dump": dump(a[1], a[2], a.length > 3 ? a[3] : "read_uncommitted",
                              a.length > 4 && a[4].equals("contiguous")); break;
            case "describe": describe(a[1], a[2]); break;
            case "group-offsets":
                try (Admin ad = admin(a[1])) {
                    var m = ad.listConsumerGroupOffsets(a[2]).partitionsToOffsetAndMetadata().get();
                    for (var e : m.entrySet())
                        System.out.println(e.getKey().partition() + "\t" + e.getValue().offset());
                }
                break;
            default: throw new IllegalArgumentException("unknown command " + a[0]);
        }
    }

    // Ready means served: the cluster answers a DescribeCluster with every broker.
    static void ready(String bootstrap, int brokers, int seconds) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        String last = "";
        try (Admin ad = admin(bootstrap)) {
            while (System.nanoTime() < deadline) {
                try {
                    int n = ad.describeCluster().nodes().get(5, TimeUnit.SECONDS).size();
                    if (n >= brokers) {
                        System.out.println(n);
                        return;
                    }
                    last = n + " brokers";
                } catch (Exception e) {
                    last = e.toString();
                }
                Thread.sleep(200);
            }
        }
        System.err.println("not ready: " + last);
        System.exit(1);
    }

    static void createTopic(String[] a) throws Exception {
        Map<String, String> configs = new HashMap<>();
        for (int i = 5; i < a.length; i++) {
            String[] kv = a[i].split("=", 2);
            configs.put(kv[0], kv[1]);
        }
        NewTopic t = new NewTopic(a[2], Integer.parseInt(a[3]), Short.parseShort(a[4])).configs(configs);
        try (Admin ad = admin(a[1])) {
            ad.createTopics(List.of(t)).all().get();
            // Wait until the metadata has the topic's leaders (a broker may not know the
            // topic yet right after the controller created it: UNKNOWN_TOPIC_OR_PARTITION).
            for (int i = 0; i < 300; i++) {
                try {
                    TopicDescription d = ad.describeTopics(List.of(a[2])).allTopicNames().get().get(a[2]);
                    if (d.partitions().stream().allMatch(p -> p.leader() != null && p.leader().id() >= 0)) return;
                } catch (java.util.concurrent.ExecutionException e) {
                    if (!(e.getCause() instanceof org.apache.kafka.common.errors.UnknownTopicOrPartitionException)) throw e;
                }
                Thread.sleep(100);
            }
            throw new RuntimeException("topic " + a[2] + ": no leaders after 30 s");
        }
    }

    static void acl(String bootstrap, String topic, String principal, AclOperation op,
                    AclPermissionType type) throws Exception {
        AclBinding b = new AclBinding(new ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL),
                new AccessControlEntry(principal, "*", op, type));
        try (Admin ad = admin(bootstrap)) {
            ad.createAcls(List.of(b)).all().get();
        }
    }

    static void describe(String bootstrap, String topic) throws Exception {
        try (Admin ad = admin(bootstrap)) {
            TopicDescription d = ad.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            for (TopicPartitionInfo p : d.partitions()) latest.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest());
            var offsets = ad.listOffsets(latest).all().get();
            for (TopicPartitionInfo p : d.partitions())
                System.out.println(p.partition() + "\t" + (p.leader() == null ? -1 : p.leader().id()) + "\t"
                        + p.isr().size() + "\t" + offsets.get(new TopicPartition(topic, p.partition())).offset());
        }
    }

    // contiguous: every partition's offsets run without a gap from its log start (a topic
    // written without transactions and never compacted): a read can never skip silently.
    static void dump(String bootstrap, String topic, String isolation, boolean contiguous) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        // Never jump anywhere on its own: an offset out of range is an error, not a reset.
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        extra(p);
        try (KafkaConsumer<byte[], byte[]> c =
                 new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo pi : c.partitionsFor(topic, Duration.ofSeconds(30)))
                tps.add(new TopicPartition(topic, pi.partition()));
            int partitions = tps.size();
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> next = new HashMap<>(c.beginningOffsets(tps, Duration.ofSeconds(30)));
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            StringBuilder out = new StringBuilder(1 << 20);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(300);
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps)
                    if (c.position(tp, Duration.ofSeconds(30)) < end.get(tp)) done = false;
                if (done) {
                    // The end offsets again: a leader elected a moment ago may have answered
                    // with a high watermark that had not caught up yet.  Done when they hold.
                    Map<TopicPartition, Long> again = c.endOffsets(tps, Duration.ofSeconds(30));
                    if (again.equals(end)) break;
                    end = again;
                    continue;
                }
                if (System.nanoTime() > deadline) throw new RuntimeException("dump: end offsets not reached");
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    TopicPartition at = new TopicPartition(r.topic(), r.partition());
                    if (contiguous && r.offset() != next.get(at))
                        throw new RuntimeException("dump: partition " + r.partition() + " of " + topic
                                                   + " goes from offset " + (next.get(at) - 1) + " to "
                                                   + r.offset() + ": a gap");
                    next.put(at, r.offset() + 1);
                    int jp = r.key() == null ? -1 : Utils.toPositive(Utils.murmur2(r.key())) % partitions;
                    StringJoiner hs = new StringJoiner(",");
                    for (Header h : r.headers())
                        hs.add(b64(h.key().getBytes(java.nio.charset.StandardCharsets.UTF_8)) + ":" + b64(h.value()));
                    out.append(r.partition()).append('\t').append(r.offset()).append('\t')
                       .append(b64(r.key())).append('\t').append(b64(r.value())).append('\t')
                       .append(jp).append('\t').append(hs).append('\n');
                    if (out.length() > (1 << 20)) {
                        System.out.print(out);
                        out.setLength(0);
                    }
                }
            }
            System.out.print(out);
            System.out.flush();
        }
    }
}
