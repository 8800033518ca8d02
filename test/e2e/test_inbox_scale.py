"""The inbox at scale: set-based handlers (with a record-by-record fallback
when a batch fails), several handler workers sharing the keys, exactly
once through a kill -9 in the middle of a batch, per-topic stats."""

import json
import os
import signal
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PgCluster, TestBroker, wait_until  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

TOPIC = "payments.events"

SCHEMA = """
CREATE EXTENSION outbox;
CREATE TABLE handled (n bigserial PRIMARY KEY, event_id uuid UNIQUE, account text, seq int,
                      worker int DEFAULT pg_backend_pid());
-- Set-based: one INSERT for the whole batch; a batch holding a bad record
-- raises, naming it.
CREATE FUNCTION handle_batch(msgs outbox.inbox_message[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bad int;
BEGIN
    SELECT (m.payload->>'seq')::int INTO bad FROM unnest(msgs) m
     WHERE (m.payload->>'fail')::boolean LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'record % refused', bad;
    END IF;
    IF (msgs[1].payload->>'sleep') IS NOT NULL THEN
        PERFORM pg_sleep((msgs[1].payload->>'sleep')::float8);
    END IF;
    INSERT INTO handled (event_id, account, seq)
    SELECT m.event_id, m.key, (m.payload->>'seq')::int FROM unnest(msgs) m ORDER BY m.seq;
END $$;
SELECT outbox.inbox_subscribe('payments.events', 'handle_batch(outbox.inbox_message[])');
"""


class InboxScale(unittest.TestCase):

    def start(self, settings=None):
        self.broker = TestBroker(topics=(f"{TOPIC}:4",))
        conf = {"outbox.brokers": f"'{self.broker.bootstrap}'", "outbox.inbox": "on",
                "outbox.inbox_topics": f"'{TOPIC}'", "outbox.max_attempts": 2,
                "outbox.kafka_config": "'session.timeout.ms=6000;heartbeat.interval.ms=500'"}
        conf.update(settings or {})
        self.pg = PgCluster(conf, name="outbox-inbox-scale")
        self.pg.start()
        self.addCleanup(self.broker.stop)
        self.addCleanup(self.pg.destroy)
        self.pg.sql(SCHEMA)
        self.producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5,
                                  "log_level": 2})

    def produce(self, records):
        for key, payload in records:
            self.producer.produce(TOPIC, key=key, value=json.dumps(payload).encode(),
                                  headers=[("event_id", str(uuid.uuid4()))])
            self.producer.poll(0)
        self.producer.flush(30)

    def scalar(self, q, *args):
        try:
            return self.pg.scalar(q, args or None)
        except Exception:
            return None  # the server is restarting

    def handler_pids(self):
        try:
            return [r[0] for r in self.pg.sql("SELECT pid FROM pg_stat_activity "
                                              "WHERE backend_type = 'pg outbox inbox handler'")]
        except Exception:
            return []

    def test_a_failing_batch_falls_back_to_one_record_at_a_time(self):
        self.start()
        bad = {17, 42}
        self.produce([(f"acct-{i % 5}", {"seq": i, "fail": i in bad}) for i in range(60)])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_parked") == 2, 90,
                   what="the two bad records parked")
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == 58, 60,
                   what="every other record handled")
        rows = self.pg.sql("SELECT (payload->>'seq')::int, last_error FROM outbox.inbox_parked "
                           "ORDER BY 1")
        self.assertEqual([r[0] for r in rows], sorted(bad))
        for seq, error in rows:
            self.assertIn(f"record {seq} refused", error, "parked with its own error")
        self.assertEqual(self.scalar("SELECT count(DISTINCT event_id) FROM handled"), 58)
        # A key's records were handled in order, also around its bad record.
        self.assertEqual(self.scalar("""SELECT count(*) FROM (
            SELECT seq < lag(seq) OVER (PARTITION BY account ORDER BY n) AS back FROM handled) s
            WHERE back"""), 0)
        stats = self.pg.sql("SELECT topic, waiting, parked FROM outbox.inbox_stats")
        self.assertEqual(stats, [(TOPIC, 0, 2)])

    def test_several_handler_workers_share_the_keys_and_keep_their_order(self):
        self.start({"outbox.inbox_workers": 3, "max_worker_processes": 16})
        wait_until(lambda: len(self.handler_pids()) == 3, 30, what="three handler workers")
        n = 3000
        self.produce([(f"acct-{i % 30}", {"seq": i}) for i in range(n)])
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == n, 120,
                   what="every record handled")
        self.assertEqual(self.scalar("""SELECT count(*) FROM (
            SELECT seq < lag(seq) OVER (PARTITION BY account ORDER BY n) AS back FROM handled) s
            WHERE back"""), 0, "a key's records out of order")
        self.assertEqual(self.scalar("SELECT max(c) FROM (SELECT count(DISTINCT worker) c "
                                     "FROM handled GROUP BY account) s"), 1,
                         "a key is handled by one worker")
        self.assertEqual(self.scalar("SELECT count(DISTINCT worker) FROM handled"), 3,
                         "the keys are spread over the workers")
        shares = self.pg.sql("SELECT worker, processed FROM outbox.worker_stats "
                             "WHERE role = 'inbox handler' ORDER BY worker")
        self.assertEqual([s[0] for s in shares], [1, 2, 3])

    def test_exactly_once_through_kill_9_in_the_middle_of_a_batch(self):
        self.start()
        n = 2000
        # Each batch call sleeps 0.3 s: the kill lands inside one.
        self.produce([(f"acct-{i % 50}", {"seq": i, "sleep": 0.3}) for i in range(n)])
        wait_until(lambda: (self.scalar("SELECT count(*) FROM handled") or 0) > 100, 120,
                   what="handling under way")
        wait_until(lambda: self.scalar("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE backend_type = 'pg outbox inbox handler' "
                                       "AND wait_event = 'PgSleep'"), 30,
                   what="a handler inside a batch")
        os.kill(self.handler_pids()[0], signal.SIGKILL)
        wait_until(lambda: self.handler_pids(), 120, what="the server back after the crash")
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == n, 300, interval=0.5,
                   what="every record handled")
        self.assertEqual(self.scalar("SELECT count(DISTINCT event_id) FROM handled"), n,
                         "each record handled once")
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message WHERE NOT processed"),
                         0)
        self.assertEqual(self.scalar("""SELECT count(*) FROM (
            SELECT seq < lag(seq) OVER (PARTITION BY account ORDER BY n) AS back FROM handled) s
            WHERE back"""), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
