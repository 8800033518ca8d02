"""Every worker comes back: after pg_terminate_backend (a DBA's "kill long
backends" script), after kill -9, and does its job afterwards; a fast
shutdown never waits on a handler stuck in user code."""

import json
import os
import signal
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import INBOX_KAFKA, ClusterPerTest, PgCluster, TestBroker, wait_until  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

TOPIC = "payments.events"
KINDS = ("relay", "maintenance", "inbox consumer", "inbox handler")

SCHEMA = """
CREATE EXTENSION outbox;
CREATE TABLE handled (event_id uuid PRIMARY KEY, n int);
CREATE FUNCTION handle(msg outbox.inbox_message) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF msg.payload->>'sleep' IS NOT NULL THEN
        PERFORM pg_sleep((msg.payload->>'sleep')::float8);
    END IF;
    INSERT INTO handled VALUES (msg.event_id, (msg.payload->>'n')::int);
END $$;
SELECT outbox.inbox_subscribe('payments.events', 'handle(outbox.inbox_message)');
"""


class Workers(unittest.TestCase):

    def setUp(self):
        self.broker = TestBroker(topics=(f"{TOPIC}:2", "order.events:2"))
        self.pg = PgCluster({"outbox.brokers": f"'{self.broker.bootstrap}'",
                             "outbox.inbox": "on",
                             "outbox.inbox_topics": f"'{TOPIC}'",
                             "outbox.retention": "'2s'",
                             "outbox.kafka_config": "'session.timeout.ms=6000;heartbeat.interval.ms=500'"},
                            name="outbox-workers")
        self.pg.start()
        self.pg.sql(SCHEMA)
        self.producer = Producer({"bootstrap.servers": self.broker.bootstrap, "log_level": 2})
        self.n = 0

    def tearDown(self):
        self.pg.destroy()
        self.broker.stop()

    def pid(self, kind):
        try:
            rows = self.pg.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = %s",
                               (f"pg outbox {kind}",))
        except Exception:
            return None  # the server is restarting
        return rows[0][0] if rows else None

    def scalar(self, q, *args):
        try:
            return self.pg.scalar(q, args or None)
        except Exception:
            return None

    def produce(self, payload):
        self.producer.produce(TOPIC, key="k", value=json.dumps(payload).encode(),
                              headers=[("event_id", str(uuid.uuid4()))])
        self.producer.flush(30)

    def assert_every_worker_does_its_job(self):
        # relay: a message written now is published
        mid = self.pg.scalar("SELECT outbox.write('order.events', 'k', '{}')::text")
        wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM outbox.outbox_message "
                                       "WHERE message_id = %s", mid), 30, what="the relay publishing")
        # maintenance: that message is deleted once older than the retention
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                       "WHERE message_id = %s", mid) == 0, 30,
                   what="the maintenance worker deleting it")
        # consumer and handler: a record produced now is stored and handled
        self.n += 1
        before = self.scalar("SELECT count(*) FROM handled") or 0
        self.produce({"n": self.n})
        wait_until(lambda: (self.scalar("SELECT count(*) FROM handled") or 0) > before, 60,
                   what="the consumer storing and the handler handling a record")

    def test_each_worker_comes_back_after_pg_terminate_backend(self):
        self.assert_every_worker_does_its_job()
        for kind in KINDS:
            old = wait_until(lambda: self.pid(kind), 30, what=f"the {kind}")
            self.assertTrue(self.pg.scalar("SELECT pg_terminate_backend(%s)", (old,)))
            new = wait_until(lambda: (p := self.pid(kind)) and p != old and p, 20,
                             what=f"the {kind} back after pg_terminate_backend")
            self.assertNotEqual(new, old)
        self.assert_every_worker_does_its_job()
        self.assertIn("pg outbox relay 1 [postgres] stopped", self.pg.log())

    def test_each_worker_comes_back_after_kill_9(self):
        for kind in KINDS:
            old = wait_until(lambda: self.pid(kind), 30, what=f"the {kind}")
            os.kill(old, signal.SIGKILL)  # the postmaster restarts the server
            wait_until(lambda: (p := self.pid(kind)) and p != old, 60,
                       what=f"the {kind} back after kill -9")
            wait_until(lambda: all(self.pid(k) for k in KINDS), 60, what="every worker back")
            self.assert_every_worker_does_its_job()

    def test_fast_shutdown_does_not_wait_for_a_sleeping_handler(self):
        self.produce({"n": 1, "sleep": 600})
        wait_until(lambda: self.scalar("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE backend_type = 'pg outbox inbox handler' "
                                       "AND wait_event = 'PgSleep'"), 60,
                   what="the handler sleeping in user code")
        # pg_terminate_backend cancels it too, and it comes back.
        old = self.pid("inbox handler")
        self.pg.scalar("SELECT pg_terminate_backend(%s)", (old,))
        wait_until(lambda: (p := self.pid("inbox handler")) and p != old, 20,
                   what="the handler back after being terminated in pg_sleep")
        wait_until(lambda: self.scalar("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE backend_type = 'pg outbox inbox handler' "
                                       "AND wait_event = 'PgSleep'"), 60,
                   what="the handler sleeping again (the record was not handled)")
        t0 = time.monotonic()
        self.pg.stop("fast")
        took = time.monotonic() - t0
        self.assertLess(took, 30, f"pg_ctl stop -m fast took {took:.1f} s")
        print(f"\n  fast shutdown with a handler in pg_sleep(600): {took:.1f} s")
        self.pg.start()
        self.assertEqual(self.pg.scalar("SELECT count(*) FROM handled"), 0,
                         "the interrupted handler's record was not marked handled")
        self.assertEqual(self.pg.scalar("SELECT count(*) FROM outbox.inbox_message "
                                        "WHERE NOT processed"), 1)


class WorkersDuringAnOutage(ClusterPerTest, unittest.TestCase):
    """SIGTERM ends a relay promptly even while Kafka is down and its
    producer's queue is full."""
    cluster_name = "outbox-workers-outage"

    def test_sigterm_during_an_outage_is_not_held_up_by_a_full_queue(self):
        # librdkafka's queue holds 100 records; 2,000 are pending while Kafka
        # is down.  The relay never waits for room inside its transaction.
        self.start({"outbox.kafka_config": f"'{INBOX_KAFKA};queue.buffering.max.messages=100'",
                    "outbox.batch_size": 1000})
        self.pg.sql("CREATE EXTENSION outbox")
        self.broker.ctl("down")
        self.pg.sql("SELECT count(outbox.write('order.events', 'k' || i, '{}')) "
                    "FROM generate_series(1, 2000) i")
        time.sleep(3)
        # No relay transaction is older than batch_timeout (2 s) plus a turn.
        for _ in range(10):
            age = self.scalar("SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0) "
                              "FROM pg_stat_activity WHERE backend_type = 'pg outbox relay'")
            self.assertLess(float(age), 4.0, "a relay transaction waited for room in the queue")
            time.sleep(0.3)
        old = self.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg outbox relay'")
        self.pg.scalar("SELECT pg_terminate_backend(%s)", (old,))
        wait_until(lambda: (p := self.scalar("SELECT pid FROM pg_stat_activity "
                                             "WHERE backend_type = 'pg outbox relay'")) and p != old,
                   15, what="the relay stopping on SIGTERM during the outage, and coming back")
        self.broker.ctl("up")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                       "WHERE published_at IS NULL") == 0, 90, what="all published after")


class IdleWorkers(unittest.TestCase):
    """A worker with nothing to do sleeps: an installed extension whose
    outbox.brokers is not set yet costs the server nothing."""

    def test_the_maintenance_worker_sleeps_while_the_relay_has_no_mark(self):
        # With outbox.brokers empty the relay never claims, so it has no
        # low-water mark; the straggler scan has nothing to compare and must
        # wait for its next period, not come back a millisecond later.
        pg = PgCluster({"outbox.brokers": "''"}, name="outbox-idle")
        self.addCleanup(pg.destroy)
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        pg.sql("SELECT outbox.write('order.events', 'k', '{}')")
        pid = wait_until(lambda: pg.scalar("SELECT pid FROM pg_stat_activity "
                                           "WHERE backend_type = 'pg outbox maintenance'"),
                         30, what="the maintenance worker")
        time.sleep(2)

        def wakeups():
            with open(f"/proc/{pid}/status") as f:
                return int(next(line.split()[1] for line in f
                                if line.startswith("voluntary_ctxt_switches")))

        before = wakeups()
        time.sleep(5)
        woke = wakeups() - before
        # Its periods are outbox.poll_interval (1 s) and the retention
        # pass: a few wake-ups in 5 s, not thousands.
        self.assertLess(woke, 100, f"the idle maintenance worker woke {woke} times in 5 s")


if __name__ == "__main__":
    unittest.main(verbosity=2)
