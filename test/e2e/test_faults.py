"""The fault suite: delivery under the faults that happen in production.

Each scenario starts its own test broker and cluster, streams 20,000
committed CreateOrder messages (plus rolled-back ones) from 8 concurrent
clients, injects a fault mid-stream, lets it recover, consumes everything
with a real consumer while it is produced, and asserts:
lost = 0, per-key order violations = 0, duplicates within the stated bound
(0 without a crash; at most the batches in flight per crash).

At the end it prints one line per scenario:
    scenario written delivered lost duplicates order_violations parked
"""

import os
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (ORDERS_SCHEMA, PG_BIN, Collector, PgCluster, TestBroker,  # noqa: E402
                     Writers, as_postgres, committed_messages, verify, wait_until)

CLIENTS = 8
PER_CLIENT = 2778  # every 10th rolled back: 8 x 2501 = 20,008 committed
BATCH_SIZE = 1000
# What may be in flight at a fault: the relay stops claiming beyond four
# batches' worth of unacknowledged records (kMaxBatchesInFlight).
IN_FLIGHT_BOUND = 4 * BATCH_SIZE
RESULTS = []


class Scenario:
    """One broker, one cluster, writers and a consumer, torn down after."""

    def __init__(self, name, settings=None, brokers=("A",), special=None, start=True):
        self.name = name
        self.brokers = {b: TestBroker() for b in brokers}
        first = self.brokers[brokers[0]]
        conf = {"outbox.brokers": f"'{first.bootstrap}'",
                "outbox.batch_size": BATCH_SIZE,
                "outbox.batch_timeout": "'2s'",
                "outbox.max_attempts": 5,
                # Messages larger than Kafka takes must reach the relay here
                # (to be parked); outbox.write() refuses them by default.
                "outbox.max_message_bytes": "'64MB'"}
        conf.update(settings or {})
        self.pg = PgCluster(conf, name="outbox-fault")
        # Records of broker list A come before those of B (the switch order).
        self.collectors = {b: Collector(br.bootstrap, label=i)
                           for i, (b, br) in enumerate(self.brokers.items())}
        self.writers = None
        self.special = special
        if start:
            self.pg.start()
            self.pg.sql(ORDERS_SCHEMA)

    def write(self):
        self.writers = Writers(self.pg, clients=CLIENTS, per_client=PER_CLIENT,
                               special=self.special).start()
        return self.writers

    def at_progress(self, fraction):
        """Waits until the writers committed `fraction` of their messages."""
        target = int(CLIENTS * PER_CLIENT * 0.9 * fraction)
        wait_until(lambda: self.writers.progress() >= target, 300,
                   what=f"{fraction:.0%} of the writes")

    def parked(self):
        return {r[0] for r in self.pg.sql(
            "SELECT message_id::text FROM outbox.outbox_message WHERE parked_at IS NOT NULL")}

    def finish(self, test, max_duplicates=0, min_written=20000):
        """Waits for delivery, checks, records the result line."""
        self.writers.join()
        # First every row settles (published, or parked), then we know what
        # Kafka must have.
        wait_until(lambda: self.pg.scalar(
            "SELECT count(*) FROM outbox.outbox_message "
            "WHERE published_at IS NULL AND parked_at IS NULL") == 0, 300, interval=0.5,
            what=f"{self.name}: every row published or parked")
        committed = committed_messages(self.pg)
        parked = self.parked()
        expected = {k: v for k, v in committed.items() if k not in parked}

        def all_arrived():
            seen = set()
            for c in self.collectors.values():
                seen |= c.event_ids()
            return set(expected) <= seen

        wait_until(all_arrived, 120, interval=0.5, what=f"{self.name}: every message delivered")
        time.sleep(1)  # let a late duplicate show itself
        records = [r for c in self.collectors.values() for r in c.snapshot()]
        result = verify(records, expected)
        result["parked"] = len(parked)
        result["written"] = len(committed)
        result["per_cluster"] = {b: len(c.snapshot()) for b, c in self.collectors.items()}
        RESULTS.append((self.name, result))
        print(f"\n  {self.name}: {result}")
        test.assertGreaterEqual(len(committed), min_written)
        test.assertEqual(result["lost"], 0)
        test.assertEqual(result["order_violations"], 0)
        test.assertEqual(result["unknown"], 0, "a rolled-back or parked message reached Kafka")
        test.assertEqual(result["mismatched"], 0)
        test.assertLessEqual(result["duplicates"], max_duplicates)
        return result

    def close(self):
        for c in self.collectors.values():
            c.close()
        self.pg.destroy()
        for b in self.brokers.values():
            b.stop()


class FaultSuite(unittest.TestCase):

    @classmethod
    def tearDownClass(cls):
        print("\n\nscenario written delivered lost duplicates order_violations parked")
        for name, r in RESULTS:
            print(f"{name} {r['written']} {r['delivered']} {r['lost']} {r['duplicates']} "
                  f"{r['order_violations']} {r['parked']}")

    def run_scenario(self, s, fault, max_duplicates=0):
        try:
            s.write()
            fault(s)
            return s.finish(self, max_duplicates=max_duplicates)
        except Exception:
            print(s.pg.log()[-4000:])
            raise
        finally:
            s.close()

    def test_broker_down_10s(self):
        def fault(s):
            s.at_progress(0.3)
            s.brokers["A"].ctl("down")
            time.sleep(10)
            # Writes kept committing, nothing was marked without an ack, and
            # no relay transaction stayed open past batch_timeout.
            self.assertEqual(s.pg.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg outbox relay' "
                "AND xact_start < now() - interval '4 seconds'"), 0)
            s.brokers["A"].ctl("up")
        # Real Kafka drops an idempotent producer's retried requests by their
        # sequence numbers; librdkafka 2.0.2's mock cluster checks sequences
        # only for transactional producers (rd_kafka_mock_validate_records),
        # so a request in flight at the disconnect may be appended twice
        # here (rarely seen: the runs so far had none).
        self.run_scenario(Scenario("broker_down_10s"), fault, max_duplicates=IN_FLIGHT_BOUND)

    def test_produce_requests_fail_retriably(self):
        def fault(s):
            s.at_progress(0.3)
            # NOT_ENOUGH_REPLICAS: retriable; librdkafka retries in order.
            s.brokers["A"].ctl("produce-errors", "NOT_ENOUGH_REPLICAS", 150)
        # One request in flight, in this scenario only.  When request R1
        # fails and a later R2 succeeds, librdkafka concludes R1 was persisted
        # (rd_kafka_dr_implicit_ack): right on Kafka, which rejects R2 with
        # OUT_OF_ORDER_SEQUENCE unless R1 is in the log, but the mock cluster
        # of librdkafka 2.0.2 checks sequences only for transactional
        # producers, so with pipelining R1's records would be reported
        # delivered without being appended: a loss that only the mock has.
        settings = {"outbox.kafka_config": "'max.in.flight.requests.per.connection=1'"}
        self.run_scenario(Scenario("produce_errors_retriable", settings=settings), fault)

    def test_oversized_message_in_a_keys_stream_is_parked(self):
        # Client 0 writes one 1.2 MB message (over message.max.bytes) in the
        # middle of key c0-7's stream.  It is parked after max_attempts
        # refusals; the key's later messages still go, in order.
        s = Scenario("message_too_large", special={(0, 1382): "x" * 1_200_000})
        try:
            s.write()
            result = s.finish(self)
            self.assertEqual(result["parked"], 1)
            key, attempts, error, big_id = s.pg.sql(
                "SELECT key, attempts, last_error, id FROM outbox.parked_messages")[0]
            self.assertEqual((key, attempts), ("c0-7", 5))
            self.assertIn("too large", error)
            later = s.pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE key = 'c0-7' "
                                "AND id > %s AND published_at IS NOT NULL", (big_id,))
            self.assertGreater(later, 0, "the key's later messages were published")
            self.assertIn("parked message", s.pg.log())
        except Exception:
            print(s.pg.log()[-4000:])
            raise
        finally:
            s.close()

    def test_immediate_shutdown_and_restart(self):
        def fault(s):
            s.at_progress(0.4)
            s.pg.stop("immediate")
            time.sleep(1)
            s.pg.start()
        self.run_scenario(Scenario("immediate_shutdown"), fault, max_duplicates=IN_FLIGHT_BOUND)

    def test_kill_9_relay_worker(self):
        def fault(s):
            s.at_progress(0.4)
            pids = s.pg.relay_pids()
            self.assertEqual(len(pids), 1)
            os.kill(pids[0], signal.SIGKILL)
            # The postmaster restarts the server (crash recovery); the
            # writers reconnect, the relay comes back by itself.
            wait_until(lambda: self._relay_back(s, pids[0]), 120, what="the relay to come back")
        self.run_scenario(Scenario("kill_9_worker"), fault, max_duplicates=IN_FLIGHT_BOUND)

    @staticmethod
    def _relay_back(s, old_pid):
        try:
            pids = s.pg.relay_pids()
        except Exception:
            return False
        return pids and old_pid not in pids

    def test_three_workers(self):
        def fault(s):
            s.at_progress(0.2)
            self.assertEqual(len(s.pg.relay_pids()), 3)
        self.run_scenario(Scenario("workers_3", settings={"outbox.workers": 3}), fault)

    def test_sighup_changes_brokers(self):
        # Mid-run, outbox.brokers moves from cluster A to cluster B: nothing
        # is lost across the two; what was in flight may go to both.
        def fault(s):
            s.at_progress(0.4)
            s.pg.sql(f"ALTER SYSTEM SET outbox.brokers = '{s.brokers['B'].bootstrap}'")
            s.pg.reload()
            wait_until(lambda: "Kafka settings changed" in s.pg.log(), 30, what="the reconnect")
        result = self.run_scenario(Scenario("sighup_brokers", brokers=("A", "B")), fault,
                                   max_duplicates=IN_FLIGHT_BOUND)
        self.assertGreater(result["per_cluster"]["A"], 0, "published to A before the switch")
        self.assertGreater(result["per_cluster"]["B"], 0, "published to B after the switch")

    def test_graceful_stop_and_start(self):
        # pg_ctl stop -m fast: the relay finishes and records its batch, so
        # a clean restart sends nothing twice.
        def fault(s):
            s.at_progress(0.4)
            s.pg.stop("fast")
            self.assertIn("pg outbox relay 1 [postgres] stopped", s.pg.log())
            s.pg.start()
        self.run_scenario(Scenario("graceful_restart"), fault)

    def test_bad_input_to_every_sql_function(self):
        errors = []

        def bad_calls(s):
            conn = s.pg.connect()
            cases = [
                ("SELECT outbox.write(NULL, 'k', '{}')", "22004", "topic must not be NULL"),
                ("SELECT outbox.write('t', NULL, '{}')", "22004", "key must not be NULL"),
                ("SELECT outbox.write('t', 'k', NULL)", "22004", "payload must not be NULL"),
                ("SELECT outbox.write('', 'k', '{}')", "22023", "invalid topic"),
                ("SELECT outbox.write('bad topic', 'k', '{}')", "22023", "invalid topic"),
                ("SELECT outbox.write(repeat('t', 10000), 'k', '{}')", "22023", "invalid topic"),
                ("SELECT outbox.write('t', 'k', '{}', '[1]')", "22023", "JSON object of strings"),
                ("SELECT outbox.write('t', 'k', '{}', '{\"a\": 1}')", "22023", "Header \"a\""),
                ("SELECT outbox.write('t', 'k', 'not json')", "22P02", "json"),
                ("SELECT outbox.write('t', 'k', '{}', '{\"a\": ')", "22P02", "json"),
                ("SELECT outbox.write(1, 2, 3)", "42883", "does not exist"),
                ("SELECT outbox.mark_processed(NULL)", "22004", "event_id must not be NULL"),
                ("SELECT outbox.mark_processed('')", "22023", "event_id must not be empty"),
                ("SELECT outbox.mark_processed('e', 't', '-1 day')", "22023", "ttl"),
                ("SELECT outbox.mark_processed('e', 't', 'soon')", "22007", "interval"),
                ("SELECT outbox.retry(NULL)", "22004", "message_id must not be NULL"),
                ("SELECT outbox.retry('00000000-0000-7000-8000-000000000000')", "P0002",
                 "no message"),
                ("SELECT outbox.retry('nope')", "22P02", "uuid"),
            ]
            for _ in range(20):
                for sql, state, text in cases:
                    try:
                        with conn.cursor() as cur:
                            cur.execute(sql)
                        errors.append(f"accepted: {sql}")
                    except Exception as e:  # psycopg2.Error
                        code = getattr(e, "pgcode", None)
                        if code != state or text not in str(e):
                            errors.append(f"{sql}: {code} {e}")
                time.sleep(0.05)
            # Huge, but valid: accepted, and parked once Kafka refuses it.
            with conn.cursor() as cur:
                cur.execute("SELECT outbox.write('order.events', 'huge', "
                            "jsonb_build_object('blob', repeat('x', 16 * 1024 * 1024)))")
                cur.execute("SELECT outbox.write('order.events', 'huge-headers', '{}', "
                            "jsonb_build_object('h', repeat('y', 2 * 1024 * 1024)))")
            conn.close()

        def fault(s):
            s.at_progress(0.2)
            t = threading.Thread(target=bad_calls, args=(s,))
            t.start()
            t.join(300)

        s = Scenario("bad_input")
        try:
            s.write()
            fault(s)
            result = s.finish(self)
            self.assertEqual(errors, [])
            self.assertEqual(result["parked"], 2, "the huge payload and the huge header")
            reasons = s.pg.sql("SELECT key, attempts, last_error FROM outbox.parked_messages "
                               "ORDER BY key")
            self.assertEqual([r[0] for r in reasons], ["huge", "huge-headers"])
            for _, attempts, error in reasons:
                # 5 refusals; one more try if the two shared a produce request and the smaller
                # was sent again without the larger (counted, not parked at).
                self.assertGreaterEqual(attempts, 5)
                self.assertIn("too large", error)
        except Exception:
            print(s.pg.log()[-4000:])
            raise
        finally:
            s.close()

    def test_standby_waits_then_takes_over_after_promotion(self):
        # The primary has no broker: everything stays pending there.  The
        # standby streams it; its relay must not run until promotion, then
        # publish it all.
        broker = TestBroker()
        primary = PgCluster({"outbox.brokers": "''", "wal_level": "replica",
                             "max_wal_senders": 4}, name="outbox-primary")
        standby = None
        collector = Collector(broker.bootstrap)
        try:
            primary.start()
            primary.sql(ORDERS_SCHEMA)
            with open(os.path.join(primary.data, "pg_hba.conf"), "a") as f:
                f.write("local replication all trust\n")
            primary.reload()
            standby = PgCluster({}, name="outbox-standby")
            subprocess.run(as_postgres(["rm", "-rf", standby.data]), check=True)
            subprocess.run(as_postgres([os.path.join(PG_BIN, "pg_basebackup"), "-h", primary.dir,
                                        "-p", str(primary.port), "-U", "postgres", "-D",
                                        standby.data, "-R", "-X", "stream"]), check=True)
            standby.append_conf({"port": standby.port, "unix_socket_directories":
                                 f"'{standby.dir}'", "outbox.brokers": f"'{broker.bootstrap}'"})
            standby.start()
            writers = Writers(primary, clients=4, per_client=500).start()
            writers.join()
            lsn = primary.scalar("SELECT pg_current_wal_lsn()::text")
            wait_until(lambda: standby.scalar(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)), 60, what="replay")
            time.sleep(1)
            self.assertTrue(standby.scalar("SELECT pg_is_in_recovery()"))
            self.assertEqual(standby.relay_pids(), [], "no relay on a hot standby")
            self.assertEqual(collector.event_ids(), set(), "a standby publishes nothing")
            committed = committed_messages(primary)
            primary.stop("fast")
            standby.sql("SELECT pg_promote()")
            wait_until(lambda: set(committed) <= collector.event_ids(), 120,
                       what="the promoted standby to publish the backlog")
            result = verify(collector.snapshot(), committed)
            result["parked"] = 0
            RESULTS.append(("standby_promote", result))
            self.assertEqual(result["lost"], 0)
            self.assertEqual(result["order_violations"], 0)
            self.assertEqual(result["duplicates"], 0)
        finally:
            collector.close()
            if standby:
                standby.destroy()
            primary.destroy()
            broker.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
