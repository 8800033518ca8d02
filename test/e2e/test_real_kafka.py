"""The real-Kafka tier: pg outbox against Apache Kafka itself.

One three-node KRaft cluster of Apache Kafka (test/kafka/cluster.py: replication
factor 3, min.insync.replicas=2, auto-create off, StandardAuthorizer, a
PLAINTEXT and a SASL_SSL/SCRAM-SHA-512 listener) serves every scenario; each
scenario has its own Postgres cluster and its own topics. What arrived is read
back by Java's kafka-clients consumer (test/kafka/KafkaTool.java), which shares
no code with librdkafka, and checked byte for byte against the rows Postgres
committed. Faults are real: kill -9 of broker JVMs, clean stops, a lost quorum.

Needs Java 17 and Maven (scripts/install-deps.sh installs them); only
OUTBOX_REAL_KAFKA=0 skips it. At the end it prints one line per scenario:
    scenario written delivered lost duplicates order_violations parked
"""

import json
import re
import os
import shutil
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "kafka"))
from harness import ORDERS_SCHEMA, PgCluster, Writers, check_places, wait_until  # noqa: E402

# Never skipped for want of Kafka: without Java or Maven the tier fails, loudly.
ENABLED = os.environ.get("OUTBOX_REAL_KAFKA", "1") != "0"
if ENABLED:
    from cluster import KafkaCluster  # noqa: E402
    from confluent_kafka import libversion  # the librdkafka the extension links too

# librdkafka before 2.6.1 appends its nonce twice in SCRAM's client-final-message,
# which Kafka 4 refuses ("invalid credentials"; confluentinc/librdkafka#4895): with
# Debian 12's 2.0.2 the SASL_SSL scenario authenticates with PLAIN instead.
SASL_MECHANISM = ("SCRAM-SHA-512" if ENABLED and libversion()[1] >= 0x020601ff else "PLAIN")

CLIENTS = 4
PER_CLIENT = 5556       # every 10th rolled back: 4 x 5001 = 20,004 committed
KEYS_PER_CLIENT = 250   # 1,000 keys
BATCH_SIZE = 1000
IN_FLIGHT_BOUND = 4 * BATCH_SIZE
SECRET = "outbox-secret-1"
WRONG = "wrong-Secret-9"
RESULTS = []
KAFKA = None

# Characters outside ASCII in some payloads, so that "byte for byte" means something.
SPECIAL = {(c, n): "clé — ü 😀 " + str(n) for c in range(CLIENTS) for n in range(7, PER_CLIENT, 97)}


STARTED = None


def setUpModule():
    global KAFKA, STARTED
    STARTED = time.monotonic()
    if ENABLED:
        t0 = time.monotonic()
        KAFKA = KafkaCluster(nodes=3, sasl=True, scram_users={"outbox": SECRET}).start()
        print(f"\n[real kafka] 3 nodes ready in {time.monotonic() - t0:.1f}s: {KAFKA.bootstrap}",
              file=sys.stderr, flush=True)


def tearDownModule():
    if KAFKA:
        KAFKA.stop()
        print(f"\n[real kafka] the tier took {time.monotonic() - STARTED:.0f} s", file=sys.stderr)
    if RESULTS:
        print("\nscenario written delivered lost duplicates order_violations parked", file=sys.stderr)
        for r in RESULTS:
            print(" ".join(str(x) for x in r), file=sys.stderr)


def committed_rows(pg, topic):
    """message_id -> (id, key, payload text, headers text) of the committed rows of a topic."""
    rows = pg.sql("SELECT message_id::text, id, key, payload::text, headers::text "
                  "FROM outbox.outbox_message WHERE topic = %s", (topic,))
    return {r[0]: (r[1], r[2], r[3], json.loads(r[4])) for r in rows}


def event_of(record):
    return dict(record["headers"]).get("event_id", b"").decode(errors="replace")


def verify(records, committed):
    """Counts what a user depends on, from records as Kafka holds them (partition, offset).

    lost: committed rows never received. duplicates: records of a row after its first.
    order_violations: a key's row received first after a later row (higher id) of its key.
    last_order_violations: the same by each row's last copy (what a consumer that keeps the
    newest copy ends with; docs/delivery.md: when Kafka lost a request and kept the next, the
    relay sends the lost rows and their key's later rows again, so only the last copies of
    that key are sure to be in id order).
    unknown: records of no committed row (a rolled-back one). mismatched: key, value or
    headers not byte for byte the row's. wrong_partition: a key not on the partition
    Java's default partitioner picks for it.
    """
    seen = set()
    duplicates = unknown = mismatched = order_violations = wrong_partition = 0
    highest = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        headers = dict(r["headers"])
        eid = headers.get("event_id", b"").decode(errors="replace")
        row = committed.get(eid)
        if row is None:
            unknown += 1
            continue
        if eid in seen:
            duplicates += 1
            continue
        seen.add(eid)
        row_id, key, payload, row_headers = row
        expected = {k: v.encode() for k, v in row_headers.items()}
        expected.setdefault("event_id", eid.encode())
        if (r["key"] != key.encode() or r["value"] != payload.encode()
                or len(headers) != len(r["headers"]) or headers != expected):
            mismatched += 1
        if r["partition"] != r["java_partition"]:
            wrong_partition += 1
        if highest.get(key, 0) > row_id:
            order_violations += 1
        highest[key] = max(highest.get(key, 0), row_id)
    last_order_violations = 0
    lowest, done = {}, set()
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"]), reverse=True):
        eid = dict(r["headers"]).get("event_id", b"").decode(errors="replace")
        row = committed.get(eid)
        if row is None or eid in done:
            continue
        done.add(eid)
        row_id, key = row[0], row[1]
        if lowest.get(key, float("inf")) < row_id:
            last_order_violations += 1
        lowest[key] = min(lowest.get(key, float("inf")), row_id)
    return {"written": len(committed), "delivered": len(seen), "lost": len(set(committed) - seen),
            "duplicates": duplicates, "order_violations": order_violations,
            "last_order_violations": last_order_violations, "unknown": unknown,
            "mismatched": mismatched, "wrong_partition": wrong_partition}


@unittest.skipUnless(ENABLED, "OUTBOX_REAL_KAFKA=0")
class RealKafkaTest(unittest.TestCase):
    """Base: a Postgres cluster whose relay publishes to the real cluster."""

    settings = {}

    def setUp(self):
        conf = {"outbox.brokers": f"'{KAFKA.bootstrap}'",
                "outbox.batch_size": BATCH_SIZE,
                "outbox.batch_timeout": "'2s'",
                "outbox.max_attempts": 5,
                "outbox.max_message_bytes": "'64MB'"}
        conf.update(self.settings)
        self.pg = PgCluster(conf, name="outbox-realkafka")
        self.pg.start()
        self.pg.sql(ORDERS_SCHEMA)
        self.writers = None

    def tearDown(self):
        if self.writers:
            try:
                self.writers.join(600)
            except AssertionError:
                pass
        if self._outcome_failed():
            print(self.pg.log()[-6000:], file=sys.stderr)
        self.pg.destroy()

    def _outcome_failed(self):
        result = getattr(self, "_outcome", None)
        errors = getattr(getattr(result, "result", None), "errors", []) + \
            getattr(getattr(result, "result", None), "failures", [])
        return any(t is self for t, _ in errors)

    def write(self, topic):
        self.writers = Writers(self.pg, clients=CLIENTS, per_client=PER_CLIENT,
                               keys=KEYS_PER_CLIENT, topic=topic, special=SPECIAL).start()
        return self.writers

    def at_progress(self, fraction):
        target = int(CLIENTS * PER_CLIENT * 0.9 * fraction)
        wait_until(lambda: self.writers.progress() >= target, 600, interval=0.5,
                   what=f"{fraction:.0%} of the writes")

    def settled(self, timeout=600):
        """Every committed row published or parked, nothing in flight."""
        wait_until(lambda: self.pg.scalar(
            "SELECT count(*) FROM outbox.outbox_message "
            "WHERE published_at IS NULL AND parked_at IS NULL") == 0,
            timeout, interval=0.5, what="every committed row published")

    def parked(self):
        return self.pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE parked_at IS NOT NULL")

    def describe_lost(self, topic, records, committed):
        """What a user would need to know of a lost message: its row, where Kafka should have
        it, and whether a second read finds it (a read that stopped early, not a loss)."""
        seen = {dict(r["headers"]).get("event_id", b"").decode(errors="replace") for r in records}
        lost = sorted(set(committed) - seen)
        again = {dict(r["headers"]).get("event_id", b"").decode(errors="replace")
                 for r in KAFKA.dump(topic)}
        ends = {}
        for r in records:
            ends[r["partition"]] = max(ends.get(r["partition"], -1), r["offset"])
        for eid in lost[:20]:
            row = self.pg.sql("SELECT id, key, published_at, attempts, last_error, "
                              "published_partition, published_offset FROM "
                              "outbox.outbox_message WHERE message_id = %s", (eid,))
            there = [event_of(r) for r in records
                     if row and (r["partition"], r["offset"]) == (row[0][5], row[0][6])]
            print(f"\n[real kafka] LOST {eid}: row {row}, in a second read: {eid in again}, "
                  f"at the offset the relay recorded: {there or 'nothing'}, "
                  f"last offsets read {ends}", file=sys.stderr, flush=True)
        if lost:
            for node, lines in KAFKA.partition_history(topic).items():
                print(f"\n[real kafka] node {node}, {topic}: leaders, truncations, recovery:\n  "
                      + "\n  ".join(lines), file=sys.stderr, flush=True)

    def finish(self, name, topic, max_duplicates=0, min_written=20000):
        self.writers.join()
        self.settled()
        committed = committed_rows(self.pg, topic)
        records = KAFKA.dump(topic, contiguous=True)
        result = verify(records, committed)
        if result["lost"]:
            self.describe_lost(topic, records, committed)
        parked = self.parked()
        RESULTS.append((name, result["written"], result["delivered"], result["lost"],
                        result["duplicates"], result["order_violations"], parked))
        print(f"\n[real kafka] {name}: {result}, parked {parked}", file=sys.stderr, flush=True)
        self.assertGreaterEqual(result["written"], min_written)
        self.assertEqual(result["lost"], 0, result)
        self.assertEqual(result["last_order_violations"], 0, result)
        if "reported the record delivered without an offset" not in self.pg.log():
            # No implicit acknowledgement seen: nothing was sent again out of turn.
            self.assertEqual(result["order_violations"], 0, result)
        self.assertEqual(result["unknown"], 0, result)
        self.assertEqual(result["mismatched"], 0, result)
        self.assertEqual(result["wrong_partition"], 0, result)
        self.assertLessEqual(result["duplicates"], max_duplicates, result)
        self.assertEqual(parked, 0)
        # Every mark names the partition and offset that hold its record.
        places = check_places(self.pg, [dict(r, topic=topic) for r in records], topic=topic)
        self.assertEqual(places["without_place"], 0, places)
        self.assertEqual(places["misplaced"], 0, places)
        return result


class DeliveryTest(RealKafkaTest):
    def test_1_stream_bytes_order_partitions(self):
        """20,000 messages, 1,000 keys, 4 writers with rollbacks: each once, in order, byte for byte,
        each key on the partition Java's default partitioner picks."""
        topic = "rk.stream"
        KAFKA.create_topic(topic, partitions=6)
        self.write(topic)
        self.finish("1_stream", topic)


class FailoverTest(RealKafkaTest):
    def test_2_leader_then_controller_killed(self):
        """kill -9 of the leader of the busiest partition mid-drain, then of the active controller."""
        topic = "rk.failover"
        KAFKA.create_topic(topic, partitions=6)
        self.write(topic)
        self.at_progress(0.2)
        wait_until(lambda: self.pg.stats()["published_since_start"] > 0, 120, what="publishing")
        parts = KAFKA.describe(topic)
        busiest = max(parts, key=lambda p: parts[p][2])
        leader = parts[busiest][0]
        KAFKA.kill_node(leader)
        self.at_progress(0.45)
        KAFKA.start_node(leader)
        KAFKA.wait_isr(topic)
        controller = KAFKA.quorum_leader()
        KAFKA.kill_node(controller)
        self.at_progress(0.7)
        KAFKA.start_node(controller)
        KAFKA.wait_isr(topic)
        print(f"\n[real kafka] killed node {leader} (leader of partition {busiest}), "
              f"then node {controller} (active controller)", file=sys.stderr)
        self.finish("2_leader_and_controller_kill9", topic, max_duplicates=2 * IN_FLIGHT_BOUND)

    def test_3_all_down_then_rolling_restart(self):
        """All three brokers down for 30 s, then a rolling restart of all three: 0 lost."""
        topic = "rk.outage"
        KAFKA.create_topic(topic, partitions=6)
        self.write(topic)
        self.at_progress(0.2)
        for i in KAFKA.ids:
            KAFKA.kill_node(i)
        before = self.pg.stats()["pending"]
        time.sleep(30)
        stats = self.pg.stats()
        self.assertGreater(stats["pending"], 0)  # what was committed meanwhile waits
        self.assertEqual(stats["parked"], 0)
        for i in KAFKA.ids:
            KAFKA.start_node(i)
        KAFKA.wait_isr(topic)
        print(f"\n[real kafka] outage: pending {before} -> {stats['pending']}, "
              f"broker_state {stats['broker_state']}", file=sys.stderr)
        for i in KAFKA.ids:  # rolling restart: one clean stop at a time
            KAFKA.stop_node(i)
            KAFKA.start_node(i)
            KAFKA.wait_isr(topic)
        self.finish("3_all_down_30s_and_rolling_restart", topic, max_duplicates=2 * IN_FLIGHT_BOUND)

    def test_4_min_isr_not_met(self):
        """Two brokers down: min.insync.replicas cannot be met. Messages wait, none parked."""
        topic = "rk.minisr"
        KAFKA.create_topic(topic, partitions=6)
        self.write(topic)
        self.at_progress(0.2)
        down = KAFKA.ids[1:]
        for i in down:
            KAFKA.kill_node(i)
        published = self.pg.stats()["published_since_start"]
        time.sleep(25)
        stats = self.pg.stats()
        self.assertGreater(stats["pending"], 0)
        self.assertEqual(stats["parked"], 0)
        print(f"\n[real kafka] two down: published {published} -> {stats['published_since_start']}, "
              f"pending {stats['pending']}, last_error {stats['last_error']!r}", file=sys.stderr)
        for i in down:
            KAFKA.start_node(i)
        KAFKA.wait_isr(topic)
        self.finish("4_two_down_min_isr", topic, max_duplicates=IN_FLIGHT_BOUND)

    def test_4b_not_enough_replicas_with_the_quorum_up(self):
        """A topic with min.insync.replicas=3 and one broker down: the controller quorum holds,
        the leaders answer NOT_ENOUGH_REPLICAS; messages wait, none parked, all published after."""
        topic = "rk.isr3"
        KAFKA.create_topic(topic, partitions=6, min_insync_replicas=3)
        self.write(topic)
        self.at_progress(0.2)
        down = KAFKA.ids[0]
        KAFKA.kill_node(down)
        time.sleep(25)
        stats = self.pg.stats()
        self.assertGreater(stats["pending"], 0)
        self.assertEqual(stats["parked"], 0)
        print(f"\n[real kafka] ISR 2 < 3: pending {stats['pending']}, "
              f"last_error {stats['last_error']!r}", file=sys.stderr)
        KAFKA.start_node(down)
        KAFKA.wait_isr(topic)
        self.finish("4b_one_down_topic_min_isr_3", topic, max_duplicates=IN_FLIGHT_BOUND)


class RefusalTest(RealKafkaTest):
    settings = {"outbox.max_attempts": 2}

    def test_5_refused_records_are_parked_with_the_brokers_reason(self):
        """Unknown topic (auto-create off), a record over max.message.bytes: each parked with
        the broker's reason; every other message goes on."""
        good, small = "rk.refusal", "rk.small"
        KAFKA.create_topic(good, partitions=3)
        KAFKA.create_topic(small, partitions=1, max_message_bytes=2000)
        conn = self.pg.connect()
        cur = conn.cursor()
        write = "SELECT outbox.write(%s, %s, %s::jsonb)"
        cur.execute(write, ("rk.absent", "k", '{"n": 0}'))
        # The big record and one that fits, of another key, in one commit: one claim, one
        # partition, most likely one produce request, and Kafka refuses a record batch whole
        # (both reported MSG_SIZE_TOO_LARGE). Only the largest is charged; the one that fits
        # goes again without it (before, it was parked with it: issue 39).
        cur.execute("SELECT outbox.write(%s, 'k', %s::jsonb), outbox.write(%s, 'k2', %s::jsonb)",
                    (small, json.dumps({"big": "x" * 10000}), small, '{"fits": true}'))
        for n in range(300):
            cur.execute(write, (good, f"k{n % 7}", json.dumps({"n": n})))
        wait_until(lambda: self.parked() == 2, 300, interval=1, what="two messages parked")
        conn.close()
        self.settled()
        parked = dict(self.pg.sql("SELECT topic, last_error FROM outbox.parked_messages"))
        fits = self.pg.sql("SELECT attempts, last_error FROM outbox.outbox_message "
                           "WHERE topic = %s AND key = 'k2'", (small,))
        print(f"\n[real kafka] parked: {parked}; the record that fits (attempts, last error): "
              f"{fits}", file=sys.stderr)
        self.assertRegex(parked["rk.absent"], "(?i)unknown topic")
        self.assertRegex(parked[small], "(?i)too large")
        self.assertEqual(len(KAFKA.dump(small)), 1)
        result = verify(KAFKA.dump(good), committed_rows(self.pg, good))
        self.assertEqual((result["written"], result["delivered"], result["lost"]), (300, 300, 0))
        self.assertEqual(self.pg.stats()["parked"], 2)
        RESULTS.append(("5_unknown_topic_and_too_large", 302, 301, 0, result["duplicates"],
                        result["order_violations"], 2))


class UnknownTopicTest(RealKafkaTest):
    settings = {"outbox.max_attempts": 10}

    def test_5b_an_unknown_topic_stalls_no_other_role(self):
        """Issue 39: one statement writes 20,000 messages to a topic the cluster does not have
        (auto-create off) while another role writes every 0.5 s. librdkafka keeps records of a
        topic it has no metadata for up to topic.metadata.propagation.max.ms (30 s): the relay
        waited for them and stopped claiming once its in-flight limit was full of them (the
        other role's messages waited 30.6 s). Now they are refused at once and remembered;
        the other role's wait stays under 2 s (p99), nothing lost, in order."""
        victim = "rk.victim"
        KAFKA.create_topic(victim, partitions=3)
        conn = self.pg.connect()
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SELECT count(outbox.write('rk.nowhere', 'k' || g, jsonb_build_object('g', g)))"
                    " FROM generate_series(1, 20000) g")
        ids = []
        for i in range(30):
            cur.execute("SELECT outbox.write(%s, %s, %s::jsonb)::text", (victim, f"v{i % 3}", json.dumps({"i": i})))
            ids.append(cur.fetchone()[0])
            time.sleep(0.5)
        conn.close()
        wait_until(lambda: self.pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE topic = %s"
                                          " AND published_at IS NOT NULL", (victim,)) == len(ids),
                   120, interval=0.5, what="the other role's messages published")
        waits = sorted(r[0] for r in self.pg.sql(
            "SELECT extract(epoch FROM published_at - created_at)::float8 FROM outbox.outbox_message"
            " WHERE topic = %s", (victim,)))
        p50, p99 = waits[len(waits) // 2], waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        refused = self.pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE topic = 'rk.nowhere'"
                                 " AND attempts > 0")
        error = self.pg.scalar("SELECT max(last_error) FROM outbox.outbox_message WHERE topic = 'rk.nowhere'"
                               " AND attempts > 0")
        print(f"\n[real kafka] unknown topic beside another role: its wait p50 {p50 * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, max {waits[-1] * 1000:.0f} ms; rows of the unknown topic "
              f"refused {refused} of 20000: {error!r}", file=sys.stderr, flush=True)
        self.assertLessEqual(p99, 2.0)
        self.assertRegex(error or "", "(?i)unknown topic")
        result = verify(KAFKA.dump(victim), committed_rows(self.pg, victim))
        RESULTS.append(("5b_unknown_topic_beside_another_role", result["written"], result["delivered"],
                        result["lost"], result["duplicates"], result["order_violations"], 0))
        self.assertEqual((result["written"], result["delivered"], result["lost"],
                          result["order_violations"]), (30, 30, 0, 0), result)


class SaslTest(RealKafkaTest):
    """SASL_SSL (SCRAM-SHA-512, or PLAIN with librdkafka < 2.6.1), a CA made by openssl,
    the password in outbox.kafka_config_file."""

    def setUp(self):
        self.secrets = None
        self.settings = {
            "outbox.brokers": f"'{KAFKA.sasl_bootstrap}'",
            "outbox.max_attempts": 2,
            "outbox.kafka_config": "'security.protocol=SASL_SSL;"
                                   f"sasl.mechanism={SASL_MECHANISM};"
                                   f"sasl.username=outbox;ssl.ca.location={KAFKA.tls.ca}'",
        }
        super().setUp()
        self.secrets = os.path.join(self.pg.dir, "kafka.secrets")
        self.set_password(SECRET)
        self.pg.append_conf({"outbox.kafka_config_file": f"'{self.secrets}'"})
        self.pg.reload()

    def set_password(self, password):
        with open(self.secrets + ".new", "w") as f:
            f.write(f"# test\nsasl.password = {password}\n")
        os.chmod(self.secrets + ".new", 0o600)
        shutil.chown(self.secrets + ".new", "postgres", "postgres")
        os.replace(self.secrets + ".new", self.secrets)

    def write_n(self, topic, n, start=0):
        conn = self.pg.connect()
        with conn.cursor() as cur:
            for i in range(start, start + n):
                cur.execute("SELECT outbox.write(%s, %s, %s::jsonb)", (topic, f"k{i % 5}", json.dumps({"i": i})))
        conn.close()

    def relay_error(self):
        rows = self.pg.sql("SELECT last_error FROM outbox.worker_stats WHERE role = 'relay'")
        return " ".join(r[0] or "" for r in rows)

    def test_6_sasl_ssl_scram_acl_and_a_wrong_password(self):
        topic, denied = "rk.sasl", "rk.denied"
        KAFKA.create_topic(topic, partitions=3)
        KAFKA.create_topic(denied, partitions=1)
        KAFKA.deny_write(denied, "User:outbox")
        # It publishes over SASL_SSL; a topic its principal may not write is parked with the
        # broker's reason, the rest go on.
        self.write_n(topic, 200)
        conn = self.pg.connect()
        conn.cursor().execute("SELECT outbox.write(%s, 'k', '{}')", (denied,))
        conn.close()
        self.write_n(topic, 200, 200)
        wait_until(lambda: self.parked() == 1, 300, interval=1, what="the denied message parked")
        self.settled()
        reason = self.pg.scalar("SELECT last_error FROM outbox.parked_messages")
        print(f"\n[real kafka] denied: {reason!r}", file=sys.stderr)
        self.assertRegex(reason, "(?i)authoriz")
        self.assertEqual(len(KAFKA.dump(denied)), 0)
        # A wrong password: messages wait (none parked), a clear error, no secret anywhere.
        self.set_password(WRONG)
        self.pg.reload()
        self.write_n(topic, 200, 400)
        wait_until(lambda: "authentication" in self.relay_error().lower(), 180, interval=1,
                   what="an authentication error in outbox.worker_stats")
        error = self.relay_error()
        print(f"\n[real kafka] wrong password: {error!r}", file=sys.stderr)
        time.sleep(5)
        stats = self.pg.stats()
        self.assertGreater(stats["pending"], 0)
        self.assertEqual(stats["parked"], 1)
        log = self.pg.log()
        for secret in (SECRET, WRONG):
            self.assertNotIn(secret, log)
            self.assertNotIn(secret, error)
            self.assertNotIn(secret, json.dumps(self.pg.sql("SELECT * FROM outbox.worker_stats"),
                                                default=str))
        # Corrected file + reload: it resumes without a restart.
        pids = set(self.pg.relay_pids())
        self.set_password(SECRET)
        self.pg.reload()
        self.settled(300)
        self.assertEqual(set(self.pg.relay_pids()), pids)
        result = verify(KAFKA.dump(topic), committed_rows(self.pg, topic))
        print(f"\n[real kafka] sasl: {result}", file=sys.stderr)
        self.assertEqual((result["written"], result["lost"], result["order_violations"],
                          result["mismatched"]), (600, 0, 0, 0))
        RESULTS.append((f"6_sasl_ssl_{SASL_MECHANISM}_acl_wrong_password", 601, result["delivered"], 0,
                        result["duplicates"], result["order_violations"], 1))

    def test_8_bad_settings_then_corrected(self):
        """Broker addresses that resolve to nothing, a broker certificate our CA did not sign,
        a SASL mechanism the broker does not enable: each a clear error in worker_stats and
        the log, no secret, nothing parked or lost; corrected and reloaded, it publishes."""
        topic = "rk.badinput"
        KAFKA.create_topic(topic, partitions=3)
        good_config = self.settings["outbox.kafka_config"]
        other_ca = KAFKA.tls.self_signed("other-ca")
        cases = [
            ("unresolvable brokers", {"outbox.brokers": "'no-such-broker.invalid:9092'"},
             "(?i)resolve"),
            ("a CA that did not sign the broker", {"outbox.kafka_config": good_config.replace(
                KAFKA.tls.ca, other_ca)}, "(?i)certificate verify failed"),
            ("a SASL mechanism the broker does not enable", {"outbox.kafka_config": good_config.replace(
                f"sasl.mechanism={SASL_MECHANISM}", "sasl.mechanism=SCRAM-SHA-256")}, "(?i)mechanism"),
        ]
        written = 0
        for what, bad, pattern in cases:
            self.pg.append_conf(bad)
            self.pg.reload()
            self.write_n(topic, 100, written)
            written += 100
            wait_until(lambda: re.search(pattern, self.relay_error()), 180,
                       interval=1, what=f"the error of {what} in outbox.worker_stats")
            error = self.relay_error()
            print(f"\n[real kafka] {what}: {error!r}", file=sys.stderr)
            stats = self.pg.stats()
            self.assertGreater(stats["pending"], 0, what)
            self.assertEqual(stats["parked"], 0, what)
            self.assertNotIn(SECRET, error)
            self.assertNotIn(SECRET, self.pg.log())
            self.pg.append_conf({"outbox.brokers": f"'{KAFKA.sasl_bootstrap}'",
                                 "outbox.kafka_config": good_config})
            self.pg.reload()
            self.settled(300)
        result = verify(KAFKA.dump(topic), committed_rows(self.pg, topic))
        self.assertEqual((result["written"], result["delivered"], result["lost"],
                          result["order_violations"], result["mismatched"]), (300, 300, 0, 0, 0))
        self.assertEqual(self.parked(), 0)
        RESULTS.append(("8_bad_settings_corrected", 300, result["delivered"], 0,
                        result["duplicates"], result["order_violations"], 0))


INBOX_SCHEMA = """
CREATE EXTENSION IF NOT EXISTS outbox;
CREATE TABLE handled (event_id uuid PRIMARY KEY, key text NOT NULL, n int NOT NULL);
CREATE FUNCTION handle(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO handled VALUES (msg.event_id, msg.key, (msg.payload->>'n')::int);
$$;
SELECT outbox.inbox_subscribe('rk.inbox', 'handle(outbox.inbox_message)');
"""


@unittest.skipUnless(ENABLED, "OUTBOX_REAL_KAFKA=0")
class InboxGroupTest(unittest.TestCase):
    """Two Postgres servers in one outbox.inbox_group against Kafka's group coordinator."""

    def setUp(self):
        conf = {"outbox.brokers": f"'{KAFKA.bootstrap}'", "outbox.inbox": "on",
                "outbox.inbox_topics": "'rk.inbox'", "outbox.inbox_group": "'rk7'",
                "outbox.batch_size": 500}
        self.servers = []
        for name in ("a", "b"):
            pg = PgCluster(conf, name=f"outbox-realkafka-inbox-{name}")
            self.servers.append(pg)
            pg.start()
            pg.sql(INBOX_SCHEMA)

    def tearDown(self):
        failed = RealKafkaTest._outcome_failed(self)
        for pg in self.servers:
            if failed:
                try:
                    print(pg.sql("SELECT role, processed, broker_state, last_error "
                                 "FROM outbox.worker_stats"), file=sys.stderr)
                except Exception:
                    pass
                print(pg.log()[-4000:], file=sys.stderr)
            pg.destroy()

    def count(self, pg, q):
        try:
            return pg.scalar(q)
        except Exception:
            return None

    def test_7_inbox_group_rebalance_and_broker_restart(self):
        """Every record stored once and handled once across the group, through a member's
        stop and start (two rebalances) and a broker's restart; committed offsets kept."""
        topic = "rk.inbox"
        KAFKA.create_topic(topic, partitions=4)
        a, b = self.servers
        conn = a.connect()
        conn.autocommit = False

        def write(start, n):
            with conn.cursor() as cur:
                for i in range(start, start + n):
                    cur.execute("SELECT outbox.write(%s, %s, %s::jsonb)",
                                (topic, f"k{i % 50}", json.dumps({"n": i})))
                    if i % 100 == 99:
                        conn.commit()
            conn.commit()

        def both_store():
            return all((self.count(pg, "SELECT count(*) FROM outbox.inbox_message") or 0) > 0
                       for pg in self.servers)

        # Write until both members have stored records: the second may join the group only
        # after the first has consumed what was there.
        written = 0
        deadline = time.monotonic() + 300
        while written < 2000 or not both_store():
            self.assertLess(time.monotonic(), deadline, "both servers storing records")
            write(written, 200)
            written += 200
            time.sleep(0.5)
        b.stop()                 # a rebalance: a takes every partition
        write(written, 2000)
        written += 2000
        time.sleep(5)
        b.start()                # another: b gets its share back
        node = KAFKA.ids[-1]
        KAFKA.stop_node(node)    # a broker restart (it may host the group coordinator)
        write(written, 2000)
        written += 2000
        KAFKA.start_node(node)
        total = written
        KAFKA.wait_isr(topic)
        conn.close()
        published = {r[0] for r in a.sql("SELECT message_id::text FROM outbox.outbox_message "
                                          "WHERE published_at IS NOT NULL")}

        def stored():
            ids = []
            for pg in self.servers:
                ids += [r[0] for r in pg.sql("SELECT event_id::text FROM outbox.inbox_message")]
            return ids

        wait_until(lambda: len(a.sql("SELECT 1 FROM outbox.outbox_message WHERE published_at IS NULL")) == 0,
                   300, interval=1, what="every message published")
        published = {r[0] for r in a.sql("SELECT message_id::text FROM outbox.outbox_message")}
        wait_until(lambda: published <= set(stored()), 300, interval=1, what="every record stored")
        wait_until(lambda: all(pg.scalar("SELECT count(*) FROM outbox.inbox_message WHERE NOT processed") == 0
                               for pg in self.servers), 300, interval=1, what="every record handled")
        ids = stored()
        handled = []
        for pg in self.servers:
            handled += [r[0] for r in pg.sql("SELECT event_id::text FROM handled")]
        per_server = [pg.scalar("SELECT count(*) FROM outbox.inbox_message") for pg in self.servers]
        stored_twice = len(ids) - len(set(ids))
        handled_twice = len(handled) - len(set(handled))
        # Committed offsets kept: the group's position is at the end of every partition.
        ends = {p: end for p, (_, _, end) in KAFKA.describe(topic).items()}
        offsets = KAFKA.group_offsets("rk7-postgres")
        print(f"\n[real kafka] inbox: written {total}, stored {len(set(ids))} (a {per_server[0]}, "
              f"b {per_server[1]}), stored twice {stored_twice}, handled twice {handled_twice}, "
              f"offsets {offsets} ends {ends}", file=sys.stderr)
        RESULTS.append(("7_inbox_group_rebalance_broker_restart", total, len(set(ids) & published),
                        len(published - set(ids)), stored_twice, 0, 0))
        self.assertEqual(len(published), total)
        self.assertEqual(set(ids), published)
        self.assertEqual(sorted(handled), sorted(set(ids)))
        self.assertEqual(stored_twice, 0)
        self.assertEqual(handled_twice, 0)
        self.assertEqual(offsets, ends)


@unittest.skipUnless(ENABLED, "OUTBOX_REAL_KAFKA=0")
class InboxTransactionsTest(unittest.TestCase):
    """The inbox consumer reads read_committed: a producer's aborted Kafka transaction never
    reaches outbox.inbox_message, a committed one does, once."""

    def setUp(self):
        self.pg = PgCluster({"outbox.brokers": f"'{KAFKA.bootstrap}'", "outbox.inbox": "on",
                             "outbox.inbox_topics": "'rk.txn'", "outbox.inbox_group": "'rk9'"},
                            name="outbox-realkafka-txn")
        self.pg.start()
        self.pg.sql("CREATE EXTENSION outbox")

    def tearDown(self):
        if RealKafkaTest._outcome_failed(self):
            print(self.pg.log()[-4000:], file=sys.stderr)
        self.pg.destroy()

    def test_9_an_aborted_transaction_never_reaches_the_inbox(self):
        import uuid
        from confluent_kafka import Producer
        KAFKA.create_topic("rk.txn", partitions=2)
        producer = Producer({"bootstrap.servers": KAFKA.bootstrap,
                             "transactional.id": "outbox-test-rk9"})
        producer.init_transactions(60)

        def transaction(n, commit):
            ids = [str(uuid.uuid4()) for _ in range(n)]
            producer.begin_transaction()
            for i, event_id in enumerate(ids):
                producer.produce("rk.txn", key=f"k{i}", value=json.dumps({"i": i}),
                                 headers=[("event_id", event_id)])
            producer.flush(30)  # on the brokers, as a transaction's records are before it ends
            if commit:
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)
            return ids

        committed = transaction(10, True)
        aborted = transaction(5, False)
        committed += transaction(10, True)  # after the aborted one, on the same partitions

        def stored():
            return {r[0] for r in self.pg.sql("SELECT event_id::text FROM outbox.inbox_message")}
        wait_until(lambda: set(committed) <= stored(), 120, interval=0.5,
                   what="the committed records stored")
        time.sleep(2)  # room for an aborted record to show
        self.assertEqual(stored(), set(committed), "only the committed transactions' records")
        self.assertEqual(set(aborted) & stored(), set())
        RESULTS.append(("9_inbox_read_committed", len(committed), len(stored()), 0, 0, 0, 0))


if __name__ == "__main__":
    unittest.main()
