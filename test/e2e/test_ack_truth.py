"""Is every row the relay marks published really in Kafka? Produce faults through a proxy.

One single-node Apache Kafka (test/kafka/cluster.py) behind test/kafka/fault_proxy.py, a
Kafka-protocol proxy that answers chosen Produce requests itself with an error, drops a
response after the broker wrote the records, cuts a connection or delays a response. The
broker advertises the proxy's port, so the relay (outbox.brokers = the proxy) makes every
connection through it; Java's consumer (KafkaTool dump) reads the topic back directly.

Each test starts its own Postgres cluster, so its relay has a producer id new to the
broker, and writes ROWS rows of KEYS keys to a topic of its own (one partition) in one
transaction. outbox.kafka_config = 'batch.num.messages=2' makes librdkafka put at most two
records in a Produce request, so several requests of the partition are in flight at once
(librdkafka 2.0.2 limits a partition's in flight to 5 *records* of an idempotent producer,
so batches of 5 or more leave one request in flight). Then what a user depends on:
  - every row marked published (published_at IS NOT NULL) is in the topic;
  - once every row is published, none is missing;
  - per key, the first copy of each row comes in id order; duplicates are counted (allowed).

librdkafka's "implicit acknowledgement" (rdkafka_request.c, rd_kafka_dr_implicit_ack):
when request R1 of a partition fails with a retriable error and a later R2 of the same
partition succeeds, it reports R1's records delivered, reasoning that the broker would
have refused R2's sequence otherwise. A broker with no state for the producer id on that
partition accepts any first sequence, so for a new producer id that reasoning fails.
test_first_request_not_leader / _not_enough_replicas show what that does to the relay.

LeaderChange does the same across a real leader change: three brokers, each behind a proxy of
its own, a topic of three replicas whose leader is stopped (a clean shutdown hands its
leadership over) before the relay's first request of the partition, while a refusal is held, or
after the producer id has written there.

Run (as root, from test/e2e): python3 -m unittest test_ack_truth -v
OUTBOX_PG_BIN picks the PostgreSQL (and so the extension build) under test.
"""

import json
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "kafka"))
from harness import PgCluster, check_places, tier_may_skip, wait_until  # noqa: E402
from cluster import KafkaCluster  # noqa: E402
from fault_proxy import FaultProxy, Rule  # noqa: E402

ROWS = 40
KEYS = 4
KAFKA = None
PROXY = None
RESULTS = []
STARTED = None


def setUpModule():
    global KAFKA, PROXY, STARTED
    STARTED = time.monotonic()
    PROXY = FaultProxy()
    KAFKA = KafkaCluster(nodes=1, proxy_ports=[PROXY.port])
    PROXY.upstream = KAFKA.proxied_upstream[1]
    PROXY.start()
    try:
        KAFKA.start()
    except BaseException:
        PROXY.stop()
        raise
    print(f"\n[ack truth] Kafka ready in {time.monotonic() - STARTED:.1f}s, proxy "
          f"{PROXY.address} -> {PROXY.upstream}", file=sys.stderr, flush=True)


def tearDownModule():
    if PROXY:
        PROXY.stop()
    if KAFKA:
        KAFKA.stop()
    print(f"\n[ack truth] {time.monotonic() - STARTED:.0f} s", file=sys.stderr)
    if RESULTS:
        print("\ntest rows published in_topic lost duplicates order_violations",
              file=sys.stderr)
        for r in RESULTS:
            print(" ".join(str(x) for x in r), file=sys.stderr)


class AckTruthChecks:
    """What every test here does: a Postgres cluster of its own, whose relay reaches Kafka only
    through the proxies; ROWS rows written; the topic read back and checked against them.
    A subclass says which cluster and proxies (kafka(), proxies())."""
    kafka_config = "batch.num.messages=2"
    replicas = 1

    def kafka(self):
        return KAFKA

    def proxies(self):
        return [PROXY]

    def produce_log(self):
        """The Produce requests every proxy saw, each tagged with its proxy's index."""
        log = []
        for i, proxy in enumerate(self.proxies()):
            for e in proxy.snapshot()["produce_log"]:
                e["proxy"] = i
                log.append(e)
        return log

    def setUp(self):
        self.topic = f"ack.{self._testMethodName}.{int(time.time() * 1000) % 100000}"
        self.kafka().create_topic(self.topic, partitions=1, replicas=self.replicas)
        for proxy in self.proxies():
            proxy.clear_rules()
        brokers = ",".join(proxy.address for proxy in self.proxies())
        self.pg = PgCluster({"outbox.brokers": f"'{brokers}'",
                             "outbox.kafka_config": f"'{self.kafka_config}'",
                             "outbox.batch_size": 1000,
                             "outbox.batch_timeout": "'2s'",
                             "outbox.max_attempts": 10}, name="outbox-acktruth")
        self.pg.start()
        self.pg.sql("CREATE EXTENSION IF NOT EXISTS outbox")

    def tearDown(self):
        for proxy in self.proxies():
            proxy.clear_rules()
        if self._failed():
            print(self.pg.log()[-4000:], file=sys.stderr)
        self.pg.destroy()

    def _failed(self):
        result = getattr(getattr(self, "_outcome", None), "result", None)
        return any(t is self for t, _ in getattr(result, "errors", []) + getattr(result, "failures", []))

    # ---- helpers

    def write_rows(self, n=ROWS, first=1):
        """n rows of KEYS keys, in one transaction (one statement), in id order per key."""
        self.pg.sql("SELECT outbox.write(%s, 'key-' || (g %% %s), jsonb_build_object('n', g)) "
                    "FROM generate_series(%s, %s) g", (self.topic, KEYS, first, first + n - 1))

    def settled(self, timeout=90):
        wait_until(lambda: self.pg.scalar(
            "SELECT count(*) FROM outbox.outbox_message WHERE topic = %s "
            "AND published_at IS NULL AND parked_at IS NULL", (self.topic,)) == 0,
            timeout, interval=0.2, what="every row published or parked")

    def rows(self):
        """message_id -> (id, key, payload text, published?, parked?, attempts, last_error)."""
        return {r[0]: r[1:] for r in self.pg.sql(
            "SELECT message_id::text, id, key, payload::text, published_at IS NOT NULL, "
            "parked_at IS NOT NULL, attempts, last_error FROM outbox.outbox_message "
            "WHERE topic = %s ORDER BY id", (self.topic,))}

    def check(self, allow_duplicates=True, first_copies_in_order=True):
        """Reads the topic back and checks it against the rows; prints what went wrong.

        Order is checked twice.  By each row's first copy: what a consumer that drops
        duplicates sees.  By each row's last copy: what a consumer that keeps the newest copy
        (a compacted topic, last write wins) ends with, and what re-sending a key's rows in id
        order guarantees.  When Kafka lost a request's records and kept the next request's (the
        implicit acknowledgement), the later records were written before anyone could know:
        their first copies precede the re-sent ones (first_copies_in_order=False), and only
        the last copies can be in order."""
        self.settled()
        rows = self.rows()
        records = sorted(self.kafka().dump(self.topic, contiguous=True),
                         key=lambda r: (r["partition"], r["offset"]))
        last_order_violations = 0
        highest_last = {}
        for r in reversed(records):
            row = rows.get(dict(r["headers"]).get("event_id", b"").decode(errors="replace"))
            if row is None or row[0] in highest_last.get(("seen", row[1]), ()):
                continue
            highest_last.setdefault(("seen", row[1]), set()).add(row[0])
            if highest_last.get(row[1], float("inf")) < row[0]:
                last_order_violations += 1
            highest_last[row[1]] = min(highest_last.get(row[1], float("inf")), row[0])
        first_at = {}
        duplicates = order_violations = unknown = mismatched = 0
        highest = {}
        for r in records:
            eid = dict(r["headers"]).get("event_id", b"").decode(errors="replace")
            row = rows.get(eid)
            if row is None:
                unknown += 1
                continue
            if eid in first_at:
                duplicates += 1
                continue
            first_at[eid] = (r["partition"], r["offset"])
            row_id, key, payload = row[0], row[1], row[2]
            if r["key"] != key.encode() or json.loads(r["value"]) != json.loads(payload):
                mismatched += 1
            if highest.get(key, 0) > row_id:
                order_violations += 1
            highest[key] = max(highest.get(key, 0), row_id)
        published = {eid for eid, row in rows.items() if row[3]}
        parked = {eid for eid, row in rows.items() if row[4]}
        lost = sorted(published - set(first_at), key=lambda e: rows[e][0])
        RESULTS.append((self._testMethodName, len(rows), len(published), len(first_at),
                        len(lost), duplicates, order_violations))
        print(f"\n[ack truth] {self._testMethodName}: rows {len(rows)}, published "
              f"{len(published)}, parked {len(parked)}, in the topic {len(first_at)}, lost "
              f"{len(lost)}, duplicates {duplicates}, order violations {order_violations} "
              f"(first copies) {last_order_violations} (last copies), "
              f"unknown {unknown}, mismatched {mismatched}", file=sys.stderr, flush=True)
        self.report(rows, lost, first_at)
        self.assertEqual(parked, set(), "rows parked")
        self.assertEqual(lost, [], f"{len(lost)} rows marked published are not in the topic")
        self.assertEqual(last_order_violations, 0, "the last copies of a key out of id order")
        if first_copies_in_order:
            self.assertEqual(order_violations, 0)
        self.assertEqual(mismatched, 0)
        # Every mark names the partition and offset that hold its record.
        places = check_places(self.pg, [dict(r, topic=self.topic) for r in records],
                              topic=self.topic)
        self.assertEqual(places["without_place"], 0, places)
        self.assertEqual(places["misplaced"], 0, places)
        if not allow_duplicates:
            self.assertEqual(duplicates, 0)
        return {"lost": len(lost), "duplicates": duplicates}

    def report(self, rows, lost, first_at):
        """The proxy's log of this topic; for each lost row, its id, key and which Produce
        request carried it."""
        several = len(self.proxies()) > 1
        mine = [e for e in self.produce_log()
                if any(p["topic"] == self.topic for p in e["partitions"])]
        for i, proxy in enumerate(self.proxies()):
            for f in proxy.snapshot()["faults"]:
                if any(b["topic"] == self.topic for b in f["batches"]):
                    print(f"[ack truth]   fault{f' (proxy {i})' if several else ''}: "
                          f"{FaultProxy.describe_fault(f)}", file=sys.stderr)
        if lost or os.environ.get("OUTBOX_ACK_TRUTH_VERBOSE"):
            for e in mine:
                via = f" (proxy {e['proxy']})" if several else ""
                print(f"[ack truth]   produce{via} {FaultProxy.describe_produce(e)}",
                      file=sys.stderr)
        for eid in lost:
            row_id, key = rows[eid][0], rows[eid][1]
            carried = []
            for e in mine:
                for p in e["partitions"]:
                    for b in p["batches"]:
                        if eid in b.get("event_ids", []):
                            resp = (", ".join(f"{x['error']} base_offset {x['base_offset']}"
                                              for x in e["response"]) if e["response"]
                                    else "proxy answered " + e.get("proxy_answer", "nothing"))
                            carried.append(f"request #{e['seq']} (pid {b['producer_id']} base "
                                           f"sequence {b['base_sequence']}, {b['count']} "
                                           f"records, fault {e['fault']}): {resp}")
            print(f"[ack truth]   LOST row id {row_id} key {key} message_id {eid}, attempts "
                  f"{rows[eid][5]}; sent in: {'; '.join(carried) or 'no request seen'}",
                  file=sys.stderr, flush=True)

    def answered(self):
        """How many of the topic's Produce requests the broker answered without error."""
        return sum(1 for e in self.produce_log()
                   if any(p["topic"] == self.topic for p in e["partitions"]) and e["response"]
                   and all(r["error"].startswith("NONE") for r in e["response"]))

    def refusals(self):
        """The topic's Produce requests a proxy refused itself."""
        return [e for e in self.produce_log()
                if e["partitions"][0]["topic"] == self.topic and e["fault"] == "error"]


class AckTruth(AckTruthChecks, unittest.TestCase):
    """One broker behind one proxy."""

    def refuse_first(self, error):
        """The partition's first Produce request refused with `error`, never forwarded; the
        refusal held until the next request of the partition is on its way to the broker."""
        PROXY.add_rule(Rule("error", topic=self.topic, partition=0, nth=1, error=error,
                            hold_ms=3000))
        self.write_rows()
        self.settled()
        refused = [e for e in PROXY.snapshot()["produce_log"]
                   if e["partitions"][0]["topic"] == self.topic and e["fault"] == "error"]
        self.assertEqual(len(refused), 1, "the proxy refused the first request")
        # The scenario itself: a later request was in flight when the refusal came back
        # (else librdkafka simply retries, and the test proves nothing).
        self.assertEqual(refused[0].get("hold"), "next request forwarded",
                         "no second request in flight within 3 s of the first")
        self.check(first_copies_in_order=False)
        # The refused request's rows were reported delivered without an offset: the relay
        # said so and sent them again.
        doubted = self.pg.scalar(
            "SELECT count(*) FROM outbox.outbox_message WHERE topic = %s AND attempts > 0 "
            "AND last_error LIKE '%%without an offset%%'", (self.topic,))
        self.assertGreater(doubted, 0, "no row was reported delivered without an offset")

    def test_first_request_not_leader(self):
        """NOT_LEADER_OR_FOLLOWER (6) on the relay's first request of a partition."""
        self.refuse_first(6)

    def test_first_request_not_enough_replicas(self):
        """NOT_ENOUGH_REPLICAS (19) on the relay's first request of a partition."""
        self.refuse_first(19)

    def refused_then(self, change):
        """The partition's first request refused with NOT_LEADER_OR_FOLLOWER and the refusal
        held 3 s; while it is held, change() takes the relay's producer away (its records in
        flight abandoned, its rows left pending) and a new producer id sends them again."""
        PROXY.add_rule(Rule("error", topic=self.topic, partition=0, nth=1, error=6,
                            hold_ms=3000))
        self.write_rows()
        wait_until(lambda: any(e["fault"] == "error" for e in PROXY.snapshot()["produce_log"]
                               if e["partitions"][0]["topic"] == self.topic), 30,
                   what="the first request refused")
        change()
        return self.check(first_copies_in_order=False)

    def test_first_request_refused_while_a_reload_replaces_the_producer(self):
        """outbox.kafka_config changed and reloaded while the refusal is held: the relay
        replaces its producer (a new producer id, new to the partition)."""
        def reload():
            self.pg.append_conf({"outbox.kafka_config":
                                 f"'{self.kafka_config};client.id=ack-truth-replaced'"})
            self.pg.reload()
        self.refused_then(reload)
        self.assertIn("Kafka settings changed, reconnecting", self.pg.log())

    def test_first_request_refused_while_the_server_restarts(self):
        """The server stopped (fast) and started again while the refusal is held."""
        self.refused_then(self.pg.restart)

    def test_first_request_refused_while_the_relay_is_terminated(self):
        """pg_terminate_backend() of the relay while the refusal is held: the postmaster
        starts it again, with a new producer."""
        self.refused_then(lambda: self.pg.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE backend_type = 'pg outbox relay'"))

    def test_later_request_not_leader(self):
        """The same refusal once the producer id has records on the partition: the broker
        then refuses the requests after the gap (OUT_OF_ORDER_SEQUENCE_NUMBER), librdkafka
        retries them in order, nothing is lost."""
        self.write_rows(ROWS // 2)
        self.settled()
        PROXY.add_rule(Rule("error", topic=self.topic, partition=0,
                            nth=len([e for e in PROXY.snapshot()["produce_log"]
                                     if e["partitions"][0]["topic"] == self.topic]) + 1,
                            error=6, hold_ms=3000))
        self.write_rows(ROWS, first=ROWS // 2 + 1)
        self.check()

    def test_response_dropped_after_write(self):
        """The broker wrote the first request's records; its response never reaches the
        relay and the connection closes: the retry is a duplicate the broker recognises
        (or a duplicate in the topic): no loss, order kept."""
        PROXY.add_rule(Rule("drop", topic=self.topic, partition=0, nth=1))
        self.write_rows()
        self.check()

    def test_response_dropped_later(self):
        """The same for the third request, with earlier records already acknowledged."""
        PROXY.add_rule(Rule("drop", topic=self.topic, partition=0, nth=3))
        self.write_rows()
        self.check()

    def test_connection_cut(self):
        """The connection is cut right after the first request reached the broker, and
        again before the fourth reaches it; a response is held 2 s: no loss, order kept."""
        PROXY.add_rule(Rule("cut", topic=self.topic, partition=0, nth=1))
        PROXY.add_rule(Rule("cut", topic=self.topic, partition=0, nth=4, forward=False))
        PROXY.add_rule(Rule("delay", topic=self.topic, partition=0, nth=6, delay_ms=2000))
        self.write_rows()
        self.check()


@tier_may_skip
class LeaderChange(AckTruthChecks, unittest.TestCase):
    """The partition's leader changes while the relay produces: three brokers, each behind a
    proxy of its own (the relay's outbox.brokers are the three proxies, and Metadata names
    them, so every connection goes through one), a topic of one partition and three replicas
    (min.insync.replicas=2). The leader is moved by a clean shutdown of its broker, which
    hands its leaderships over first, as a rolling restart does; it starts again before the next
    test. Its own cluster: started once for the class."""
    replicas = 3
    KAFKA3 = None
    PROXIES = []

    @classmethod
    def setUpClass(cls):
        t0 = time.monotonic()
        cls.PROXIES = [FaultProxy() for _ in range(3)]
        cls.KAFKA3 = KafkaCluster(nodes=3, proxy_ports=[p.port for p in cls.PROXIES])
        for i, proxy in zip(cls.KAFKA3.ids, cls.PROXIES):
            proxy.upstream = cls.KAFKA3.proxied_upstream[i]
            proxy.start()
        try:
            cls.KAFKA3.start()
        except BaseException:
            cls.tearDownClass()
            raise
        print(f"\n[ack truth] 3 nodes behind 3 proxies ready in {time.monotonic() - t0:.1f}s",
              file=sys.stderr, flush=True)

    @classmethod
    def tearDownClass(cls):
        for proxy in cls.PROXIES:
            proxy.stop()
        if cls.KAFKA3:
            cls.KAFKA3.stop()

    def kafka(self):
        return self.KAFKA3

    def proxies(self):
        return self.PROXIES

    def setUp(self):
        # The broker the test before stopped starts again here, not in its tearDown: after
        # the last test nobody waits for it.
        stopped = [i for i in self.KAFKA3.ids if i not in self.KAFKA3.running()]
        for i in stopped:
            self.KAFKA3.start_node(i)
        if stopped:
            self.KAFKA3.wait_ready()
        super().setUp()

    def leader(self):
        return self.KAFKA3.describe(self.topic)[0][0]

    def proxy_of(self, node):
        return self.PROXIES[self.KAFKA3.ids.index(node)]

    def move_leader(self, old):
        """Stops broker `old`, the partition's leader; returns the new leader."""
        self.KAFKA3.stop_node(old)
        wait_until(lambda: self.leader() not in (old, -1), 120, interval=1,
                   what="a new leader of the partition")
        new = self.leader()
        print(f"\n[ack truth] {self._testMethodName}: leader {old} stopped, {new} leads",
              file=sys.stderr, flush=True)
        return new

    def test_new_leader_refuses_the_first_request(self):
        """The leader moves before the relay's first request of the partition; the new leader
        answers it NOT_LEADER_OR_FOLLOWER (as a broker does in the moment it is named leader
        and not yet leading) and accepts the next one, from a producer id it has no state
        for: the race reported against librdkafka ("a new producer produces while the
        partition leader is being re-elected")."""
        new = self.move_leader(self.leader())
        self.proxy_of(new).add_rule(Rule("error", topic=self.topic, partition=0, nth=1, error=6,
                                          hold_ms=3000))
        self.write_rows()
        self.settled()
        refused = self.refusals()
        self.assertEqual(len(refused), 1, "the new leader's proxy refused the first request")
        self.assertEqual(refused[0]["proxy"], self.PROXIES.index(self.proxy_of(new)))
        self.assertEqual(refused[0].get("hold"), "next request forwarded",
                         "no second request in flight within 3 s of the first")
        self.check(first_copies_in_order=False)

    def test_leader_moves_while_a_refusal_is_held(self):
        """The first request refused by the leader's proxy (the refusal held until the next
        request is at the broker); then the leader shuts down: what is retried or sent again
        goes to the new leader, which knows the producer id from what it replicated."""
        old = self.leader()
        self.proxy_of(old).add_rule(Rule("error", topic=self.topic, partition=0, nth=1, error=6,
                                          hold_ms=3000))
        self.write_rows()
        wait_until(lambda: self.refusals(), 30, what="the first request refused")
        self.move_leader(old)
        self.check(first_copies_in_order=False)

    def test_new_leader_refuses_a_known_producer(self):
        """The producer id has written to the partition before the leader moves; the new
        leader (which replicated its state) gets a refused request, then the next: it refuses
        that one's sequence (OUT_OF_ORDER_SEQUENCE_NUMBER), librdkafka retries in order, and
        nothing is lost or reordered."""
        self.write_rows(ROWS // 2)
        self.settled()
        new = self.move_leader(self.leader())
        self.proxy_of(new).add_rule(Rule("error", topic=self.topic, partition=0, nth=1, error=6,
                                          hold_ms=3000))
        self.write_rows(ROWS, first=ROWS // 2 + 1)
        self.check()


class LibrdkafkaAlone(unittest.TestCase):
    """librdkafka's own delivery reports, without the relay: Python's confluent_kafka
    (the librdkafka the extension links) produces through the proxy with the relay's
    guarantees (idempotence, acks=all, linger.ms=0, batch.num.messages=2). Prints each
    report's error and offset beside where the record really is.

    Characterises, does not judge librdkafka: a report of NO_ERROR whose record is not
    in the topic must carry offset RD_KAFKA_OFFSET_INVALID (-1001; confluent_kafka shows
    None); and an implicitly acked record the broker did write (its request answered
    with an error after the write) carries -1001 too, so -1001 alone does not tell a
    lost record from a delivered one."""

    def produce(self, rule_kwargs, n=20):
        from confluent_kafka import Producer
        topic = f"ack.alone.{self._testMethodName}.{int(time.time() * 1000) % 100000}"
        KAFKA.create_topic(topic, partitions=1, replicas=1)
        PROXY.add_rule(Rule(topic=topic, partition=0, **rule_kwargs))
        reports = {}
        p = Producer({"bootstrap.servers": PROXY.address, "enable.idempotence": True,
                      "acks": "all", "linger.ms": 0, "batch.num.messages": 2, "log_level": 3})
        for i in range(n):
            p.produce(topic, key=f"k{i % 4}", value=f"v{i}", headers=[("event_id", f"e{i}")],
                      on_delivery=lambda err, m, i=i: reports.__setitem__(
                          f"e{i}", (err.name() if err else "NO_ERROR", m.offset())))
        self.assertEqual(p.flush(60), 0)
        where = {dict(r["headers"])["event_id"].decode(): r["offset"] for r in KAFKA.dump(topic)}
        for e in PROXY.snapshot()["produce_log"]:
            if e["partitions"][0]["topic"] == topic:
                print(f"[ack truth]   produce {PROXY.describe_produce(e)}", file=sys.stderr)
        for eid, (err, offset) in reports.items():
            if offset is None or where.get(eid) != offset:
                print(f"[ack truth]   {eid}: report {err} offset "
                      f"{'-1001 (invalid)' if offset is None else offset}, in the topic at "
                      f"{where.get(eid, 'nowhere')}", file=sys.stderr, flush=True)
        PROXY.clear_rules()
        return reports, where

    def test_refused_first_request(self):
        """R1 refused (never written), R2 accepted: R1's records reported NO_ERROR, -1001."""
        reports, where = self.produce({"action": "error", "nth": 1, "error": 6, "hold_ms": 3000})
        lost = sorted(e for e, (err, off) in reports.items() if err == "NO_ERROR" and e not in where)
        print(f"[ack truth]   librdkafka reported NO_ERROR for {len(lost)} records the broker "
              f"never got: {lost}", file=sys.stderr, flush=True)
        for eid in lost:
            self.assertIsNone(reports[eid][1], "a lost record reported with a real offset")
        for eid, (err, off) in reports.items():
            if off is not None:
                self.assertEqual(where.get(eid), off, "a reported offset that is not the record's")

    def test_error_after_write(self):
        """R1 written by the broker but answered NOT_ENOUGH_REPLICAS_AFTER_APPEND (20): R1's
        records are implicitly acked too, and there they are in the topic, offset -1001."""
        reports, where = self.produce({"action": "error", "nth": 1, "error": 20, "hold_ms": 3000,
                                       "forward": True})
        missing = sorted(e for e, (err, off) in reports.items() if err == "NO_ERROR" and e not in where)
        invalid = sorted(e for e, (err, off) in reports.items() if off is None)
        print(f"[ack truth]   offset -1001: {invalid}; reported NO_ERROR but missing: {missing}",
              file=sys.stderr, flush=True)
        self.assertEqual(missing, [])


if __name__ == "__main__":
    unittest.main()
