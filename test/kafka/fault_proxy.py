#!/usr/bin/python3
"""A Kafka-protocol TCP proxy that injects Produce faults, for the tests.

It sits between Kafka clients and ONE real Apache Kafka broker. Every byte is
forwarded unchanged except:

  * ApiVersions responses: Produce (api key 0) is capped at --max-produce-version
    (7 by default, the last non-flexible version; librdkafka 2.0.2 never asks
    for more), so that the proxy only has to understand non-flexible Produce
    requests and responses;
  * Produce requests a fault rule matches (see Rule below): answered by the
    proxy itself with an error, or their response held back, dropped, or the
    connection cut.

Topology: the broker advertises the proxy's address on the listener the
proxy connects to (test/kafka/cluster.py KafkaCluster(proxy_ports=[port])), so
Metadata answers already name the proxy and nothing else needs rewriting.
Each client connection gets its own upstream connection.

The Kafka protocol in short (https://kafka.apache.org/protocol): every
request and response is a frame, a 4-byte big-endian size then that many
bytes. A request starts with its header: api_key int16, api_version int16,
correlation_id int32, client_id nullable string (int16 length, -1 = null);
"flexible" versions (header v2) add tagged fields after it. A response
starts with the correlation_id (header v0), plus tagged fields for flexible
versions, except ApiVersions whose response header is always v0. A broker
answers the requests of one connection in the order it received them, and
clients rely on that: the proxy keeps every connection's responses in
request order, its own answers included. A Produce request with acks=0 has
no response.

As a module:

    proxy = FaultProxy(upstream="127.0.0.1:9092").start()
    proxy.add_rule(Rule("error", topic="t", partition=0, nth=1, error=6, hold_ms=3000))
    ... proxy.faults (what was applied), proxy.produce_log (every Produce seen) ...
    proxy.stop()

As a command:

    fault_proxy.py --upstream 127.0.0.1:9092 [--listen 9093] [--control /tmp/p.sock]
                   [--rule '{"action": "error", "topic": "t", "nth": 1, "error": 6}']

and at run time, one JSON command per line on the control socket, answered
with one JSON line:

    {"cmd": "add_rule", "rule": {"action": "drop", "topic": "t", "nth": 3}}
    {"cmd": "clear_rules"}
    {"cmd": "faults"}           what was applied so far
    {"cmd": "produce_log"}      every Produce request and what came of it

e.g. `echo '{"cmd": "faults"}' | socat - UNIX-CONNECT:/tmp/p.sock`.

Standard library only.
"""

import argparse
import collections
import json
import os
import socket
import struct
import sys
import threading
import time

API_PRODUCE = 0
API_VERSIONS = 18

ERROR_NAMES = {
    0: "NONE", 6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT", 19: "NOT_ENOUGH_REPLICAS",
    20: "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 45: "OUT_OF_ORDER_SEQUENCE_NUMBER",
    46: "DUPLICATE_SEQUENCE_NUMBER", 59: "UNKNOWN_PRODUCER_ID",
}


def error_name(code):
    return f"{ERROR_NAMES.get(code, 'ERROR')}({code})"


# ---------------------------------------------------------------- wire helpers

class Reader:
    """Reads Kafka's primitive types from bytes, big-endian, moving an offset."""

    def __init__(self, data, pos=0):
        self.data = data
        self.pos = pos

    def _unpack(self, fmt, size):
        if self.pos + size > len(self.data):
            raise ValueError("truncated")
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += size
        return v

    def int8(self):
        return self._unpack(">b", 1)

    def int16(self):
        return self._unpack(">h", 2)

    def int32(self):
        return self._unpack(">i", 4)

    def uint32(self):
        return self._unpack(">I", 4)

    def int64(self):
        return self._unpack(">q", 8)

    def raw(self, n):
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated")
        v = self.data[self.pos:self.pos + n]
        self.pos += n
        return bytes(v)

    def uvarint(self):
        """Unsigned varint (flexible versions' compact lengths and tags)."""
        shift = value = 0
        while True:
            b = self.raw(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def varint(self):
        """Zigzag varint (the records inside a RecordBatch)."""
        v = self.uvarint()
        return (v >> 1) ^ -(v & 1)

    def string(self):
        """STRING / NULLABLE_STRING: int16 length, -1 = null."""
        n = self.int16()
        return None if n < 0 else self.raw(n).decode(errors="replace")

    def bytes32(self):
        """BYTES / RECORDS: int32 length, -1 = null."""
        n = self.int32()
        return None if n < 0 else self.raw(n)

    def skip_tagged_fields(self):
        for _ in range(self.uvarint()):
            self.uvarint()              # tag
            self.raw(self.uvarint())    # size, then the field


def frame(payload):
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_frame(sock):
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    return recv_exact(sock, size)


# ---------------------------------------------------------------- Produce

def parse_records(data):
    """The record batches (magic 2) of a partition's `records`: a list of dicts with
    producer_id, producer_epoch, base_sequence, count, and the records' keys and
    event_id headers when uncompressed."""
    batches = []
    r = Reader(data)
    while r.pos + 61 <= len(data):
        start = r.pos
        base_offset = r.int64()
        batch_length = r.int32()
        end = start + 12 + batch_length
        r.int32()                        # partitionLeaderEpoch
        magic = r.int8()
        if magic != 2:
            batches.append({"magic": magic})
            break
        r.uint32()                       # crc
        attributes = r.int16()
        r.int32()                        # lastOffsetDelta
        r.int64()                        # baseTimestamp
        r.int64()                        # maxTimestamp
        b = {"base_offset": base_offset, "producer_id": r.int64(), "producer_epoch": r.int16(),
             "base_sequence": r.int32(), "count": r.int32(), "keys": [], "event_ids": []}
        if attributes & 0x07 == 0:       # uncompressed: read the records themselves
            try:
                for _ in range(b["count"]):
                    r.varint()           # length
                    r.int8()             # attributes
                    r.varint()           # timestampDelta
                    r.varint()           # offsetDelta
                    klen = r.varint()
                    key = r.raw(klen) if klen >= 0 else None
                    vlen = r.varint()
                    if vlen > 0:
                        r.raw(vlen)
                    event_id = None
                    for _ in range(r.varint()):
                        hk = r.raw(r.varint())
                        hlen = r.varint()
                        hv = r.raw(hlen) if hlen >= 0 else None
                        if hk == b"event_id" and hv is not None:
                            event_id = hv.decode(errors="replace")
                    b["keys"].append(key.decode(errors="replace") if key is not None else None)
                    b["event_ids"].append(event_id)
            except ValueError:
                pass
        batches.append(b)
        r.pos = end
    return batches


def parse_produce_request(body, version):
    """A Produce request's body (after the header), versions 3-8 (non-flexible):
    (transactional_id, acks, [(topic, partition, [batch...])])."""
    r = Reader(body)
    transactional_id = r.string()
    acks = r.int16()
    r.int32()                            # timeout_ms
    parts = []
    for _ in range(r.int32()):
        topic = r.string()
        for _ in range(r.int32()):
            partition = r.int32()
            records = r.bytes32()
            parts.append((topic, partition, parse_records(records) if records else []))
    return transactional_id, acks, parts


def parse_produce_response(body, version):
    """A Produce response's body (after the correlation id), versions 0-8:
    [(topic, partition, error_code, base_offset)]."""
    r = Reader(body)
    out = []
    for _ in range(r.int32()):
        topic = r.string()
        for _ in range(r.int32()):
            partition = r.int32()
            error = r.int16()
            base_offset = r.int64()
            if version >= 2:
                r.int64()                # log_append_time_ms
            if version >= 5:
                r.int64()                # log_start_offset
            if version >= 8:
                for _ in range(r.int32()):   # record_errors
                    r.int32()
                    r.string()
                r.string()               # error_message
            out.append((topic, partition, error, base_offset))
    return out


def produce_error_response(correlation_id, version, parts, error):
    """A Produce response of `version` (0-8) answering every partition of the
    request with `error`, as a broker would: base_offset -1, no timestamps."""
    topics = collections.OrderedDict()
    for topic, partition, _ in parts:
        topics.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">i", correlation_id))
    out += struct.pack(">i", len(topics))
    for topic, partitions in topics.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(partitions))
        for p in partitions:
            out += struct.pack(">ihq", p, error, -1)
            if version >= 2:
                out += struct.pack(">q", -1)          # log_append_time_ms
            if version >= 5:
                out += struct.pack(">q", -1)          # log_start_offset
            if version >= 8:
                out += struct.pack(">ih", 0, -1)      # no record_errors, null error_message
    if version >= 1:
        out += struct.pack(">i", 0)                   # throttle_time_ms
    return bytes(out)


# ---------------------------------------------------------------- ApiVersions

def cap_produce_version(payload, request_version, cap):
    """An ApiVersions response (header v0 always: just the correlation id) with
    Produce's max version lowered to `cap`, patched in place (same length).
    Versions 0-2: int32 array of (key, min, max) int16 triples; version 3+
    (flexible): compact array (uvarint length + 1), each entry followed by tagged
    fields. Returns (payload, (old max, new max)) or (payload, None)."""
    buf = bytearray(payload)
    r = Reader(buf, 4)
    if r.int16() != 0:                   # an error (e.g. UNSUPPORTED_VERSION): untouched
        return payload, None
    flexible = request_version >= 3
    n = r.uvarint() - 1 if flexible else r.int32()
    for _ in range(max(n, 0)):
        key = r.int16()
        r.int16()                        # min_version
        at = r.pos
        max_version = r.int16()
        if flexible:
            r.skip_tagged_fields()
        if key == API_PRODUCE and max_version > cap:
            struct.pack_into(">h", buf, at, cap)
            return bytes(buf), (max_version, cap)
    return payload, None


# ---------------------------------------------------------------- rules

class Rule:
    """A fault applied to Produce requests of one topic (and partition, or any).

    action:
      "error"  answer the request itself with error code `error`, never
               forwarding it (the broker writes nothing); with forward=True it
               is forwarded, the broker writes it, and its response is replaced
               by the error (as NOT_ENOUGH_REPLICAS_AFTER_APPEND or a timeout
               after the write would be). With hold_ms, the
               answer waits until the next Produce request of the same
               partition has been forwarded (so that it is in flight), at most
               hold_ms.
      "drop"   forward it, wait for the broker's response (the records are
               written), swallow the response and close the client connection.
      "cut"    forward it (forward=False: don't) and close the client and broker
               connections at once, before any response.
      "delay"  forward it and hold its response (and so every later response of
               the connection) for delay_ms.
    nth: the rule applies to the nth Produce request (1-based, counted over all
    connections) that carries the topic-partition, and `times` consecutive ones
    from there (nth=None: from the first matching request on).
    """

    def __init__(self, action, topic, partition=None, nth=1, times=1, error=6, hold_ms=0,
                 delay_ms=0, forward=None):
        if action not in ("error", "drop", "cut", "delay"):
            raise ValueError(f"unknown action {action}")
        self.action, self.topic, self.partition = action, topic, partition
        self.nth, self.times, self.error = nth, times, error
        self.hold_ms, self.delay_ms = hold_ms, delay_ms
        # forwarded to the broker? "error": not by default; "cut": by default
        self.forward = (action != "error") if forward is None else forward
        self.applied = 0

    @classmethod
    def from_dict(cls, d):
        return cls(**d)

    def matches(self, topic, partition, count):
        if topic != self.topic or (self.partition is not None and partition != self.partition):
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        return self.nth is None or count >= self.nth

    def __repr__(self):
        return (f"Rule({self.action} {self.topic}[{self.partition}] nth={self.nth} "
                f"times={self.times} error={self.error} hold_ms={self.hold_ms} "
                f"delay_ms={self.delay_ms})")


# ---------------------------------------------------------------- the proxy

class _Slot:
    """One request awaiting its response, in the connection's order."""

    def __init__(self, correlation_id, api_key, api_version):
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.response = None        # bytes to send to the client (without the size prefix)
        self.not_before = 0.0       # monotonic time before which it is held
        self.hold_until = None      # (topic, partition, count, deadline): see Rule "error"
        self.drop = False           # swallow the response and close the connection
        self.replace = None         # send this instead of the broker's response
        self.entry = None           # the produce_log entry (Produce requests)


class _Connection:
    """A client connection and its own connection to the broker, with three
    threads: client -> broker, broker -> proxy, proxy -> client (in order)."""

    def __init__(self, proxy, cid, client):
        self.proxy = proxy
        self.id = cid
        self.client = client
        self.upstream = None
        self.cond = threading.Condition()
        self.slots = collections.deque()        # every answered request, in order
        self.awaiting = collections.deque()     # the forwarded ones, in order
        self.closed = False
        self.send_lock = threading.Lock()

    def start(self):
        host, port = self.proxy.upstream.rsplit(":", 1)
        try:
            self.upstream = socket.create_connection((host, int(port)), timeout=10)
            self.upstream.settimeout(None)
        except OSError:
            self.close("broker unreachable")
            return
        for s in (self.client, self.upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for target in (self._client_reader, self._upstream_reader, self._writer):
            threading.Thread(target=target, daemon=True,
                             name=f"fault-proxy-{self.id}-{target.__name__}").start()

    def close(self, why=""):
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        self.proxy._log_event({"event": "connection closed", "conn": self.id, "why": why})
        for s in (self.client, self.upstream):
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.proxy._forget(self)

    # client -> broker
    def _client_reader(self):
        try:
            while not self.closed:
                req = recv_frame(self.client)
                self._request(req)
        except EOFError:
            self.close("client closed")
        except (OSError, ValueError) as e:
            self.close(f"client side: {e!r}")

    def _forward(self, req, slot):
        with self.cond:
            if slot is not None:
                self.slots.append(slot)
                self.awaiting.append(slot)
        with self.send_lock:
            self.upstream.sendall(frame(req))

    def _request(self, req):
        r = Reader(req)
        api_key, api_version, correlation_id = r.int16(), r.int16(), r.int32()
        slot = _Slot(correlation_id, api_key, api_version)
        if api_key != API_PRODUCE:
            self._forward(req, slot)
            return
        if api_version > 8:
            # Flexible: not ours to parse (the cap should have prevented it).
            self.proxy._log_event({"event": "unparsed Produce", "version": api_version,
                                   "conn": self.id})
            self._forward(req, slot)
            return
        r.string()                                   # client_id (request header v1)
        _, acks, parts = parse_produce_request(req[r.pos:], api_version)
        entry, rule = self.proxy._produce_seen(self.id, correlation_id, api_version, acks, parts)
        slot.entry = entry
        if acks == 0:
            slot = None                              # no response will come
        if rule is None:
            self._forward(req, slot)
            return
        action = rule.action
        if action == "error" and rule.forward:
            # The broker writes it; its response is replaced by the error.
            slot.replace = produce_error_response(correlation_id, api_version, parts, rule.error)
            entry["proxy_answer"] = error_name(rule.error) + " (after the broker's write)"
            self._forward(req, slot)
        elif action == "error":
            if slot is None:
                return                                   # acks=0: nothing to answer
            with self.cond:
                slot.response = produce_error_response(correlation_id, api_version, parts,
                                                       rule.error)
                if rule.hold_ms:
                    topic, partition, _ = parts[0]
                    slot.hold_until = (topic, partition, entry["forwarded_before"][0],
                                       time.monotonic() + rule.hold_ms / 1000.0)
                entry["proxy_answer"] = error_name(rule.error)
                self.slots.append(slot)
                self.cond.notify_all()
        elif action == "drop":
            slot.drop = True
            self._forward(req, slot)
        elif action == "delay":
            slot.not_before = time.monotonic() + rule.delay_ms / 1000.0
            self._forward(req, slot)
        elif action == "cut":
            if rule.forward:
                with self.send_lock:
                    self.upstream.sendall(frame(req))
                time.sleep(0.05)                     # let it reach the broker
            self.close("cut")

    # broker -> proxy
    def _upstream_reader(self):
        try:
            while not self.closed:
                resp = recv_frame(self.upstream)
                with self.cond:
                    if not self.awaiting:
                        raise ValueError("a response to no request")
                    slot = self.awaiting.popleft()
                cid = struct.unpack_from(">i", resp, 0)[0]
                if cid != slot.correlation_id:
                    raise ValueError(f"response {cid} for request {slot.correlation_id}")
                if slot.api_key == API_VERSIONS:
                    resp, capped = cap_produce_version(resp, slot.api_version,
                                                       self.proxy.max_produce_version)
                    if capped:
                        self.proxy._log_event({"event": "capped Produce version", "conn": self.id,
                                               "broker_max": capped[0], "max": capped[1]})
                elif slot.api_key == API_PRODUCE and slot.entry is not None:
                    try:
                        self.proxy._produce_answered(slot.entry, parse_produce_response(
                            resp[4:], slot.api_version), dropped=slot.drop)
                    except ValueError:
                        pass
                with self.cond:
                    slot.response = slot.replace if slot.replace is not None else resp
                    self.cond.notify_all()
        except EOFError:
            self.close("broker closed")
        except (OSError, ValueError) as e:
            self.close(f"broker side: {e!r}")

    # proxy -> client, in request order
    def _ready(self, slot, now):
        if slot.response is None or now < slot.not_before:
            return False
        if slot.hold_until:
            topic, partition, count, deadline = slot.hold_until
            if now < deadline and self.proxy._forwarded_count(topic, partition) <= count:
                return False
            slot.hold_until = None
            if slot.entry is not None:
                # Whether the hold did its job: a later request of the partition in flight.
                slot.entry["hold"] = "timed out" if now >= deadline else "next request forwarded"
        return True

    def _writer(self):
        try:
            while True:
                with self.cond:
                    while not self.closed and not (self.slots and
                                                   self._ready(self.slots[0], time.monotonic())):
                        self.cond.wait(0.005)
                    if self.closed:
                        return
                    slot = self.slots.popleft()
                if slot.drop:
                    self.proxy._log_event({"event": "connection closed after a dropped response",
                                           "conn": self.id})
                    self.close("dropped a response")
                    return
                self.client.sendall(frame(slot.response))
        except OSError as e:
            self.close(f"writing to the client: {e!r}")


class FaultProxy:
    """A Kafka proxy in front of one broker (see the module's docstring)."""

    def __init__(self, upstream=None, listen_port=0, max_produce_version=7, control=None,
                 verbose=False):
        self.upstream = upstream
        self.max_produce_version = max_produce_version
        self.verbose = verbose
        self.lock = threading.Lock()
        self.rules = []
        self.faults = []            # each fault applied, as a dict
        self.events = []            # other things worth knowing (version caps ...)
        self.produce_log = []       # every Produce request, with its outcome
        self.seen = collections.Counter()       # (topic, partition) -> Produce requests seen
        self.forwarded = collections.Counter()  # (topic, partition) -> forwarded to the broker
        self.conns = set()
        self.next_id = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.control_path = control
        self.control_sock = None
        self.stopping = False

    # life cycle
    def start(self):
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy-accept").start()
        if self.control_path:
            self._start_control()
        return self

    def stop(self):
        self.stopping = True
        try:
            self.sock.close()
        except OSError:
            pass
        if self.control_sock:
            self.control_sock.close()
            try:
                os.unlink(self.control_path)
            except OSError:
                pass
        for c in list(self.conns):
            c.close("proxy stopped")

    def _accept(self):
        while not self.stopping:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.next_id += 1
                conn = _Connection(self, self.next_id, client)
                self.conns.add(conn)
            conn.start()

    def _forget(self, conn):
        with self.lock:
            self.conns.discard(conn)

    def cut_all(self):
        """Closes every connection (clients reconnect)."""
        for c in list(self.conns):
            c.close("cut_all")

    # rules
    def add_rule(self, rule):
        if isinstance(rule, dict):
            rule = Rule.from_dict(rule)
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear_rules(self):
        with self.lock:
            self.rules = []

    # bookkeeping
    def _log_event(self, event):
        event["t"] = round(time.time(), 3)
        with self.lock:
            self.events.append(event)
        if self.verbose:
            print(f"[fault proxy] {event}", file=sys.stderr, flush=True)

    def _forwarded_count(self, topic, partition):
        with self.lock:
            return self.forwarded[(topic, partition)]

    def _produce_seen(self, conn, correlation_id, version, acks, parts):
        """Counts a Produce request, picks the rule for it (the first that matches any
        of its partitions); returns (log entry, rule or None)."""
        with self.lock:
            counts = []
            for topic, partition, _ in parts:
                self.seen[(topic, partition)] += 1
                counts.append(self.seen[(topic, partition)])
            rule = None
            for i, (topic, partition, _) in enumerate(parts):
                for candidate in self.rules:
                    if candidate.matches(topic, partition, counts[i]):
                        rule = candidate
                        break
                if rule:
                    break
            if rule is not None:
                rule.applied += 1
            forwarded = rule is None or rule.action in ("drop", "delay") or rule.forward
            if forwarded:
                for topic, partition, _ in parts:
                    self.forwarded[(topic, partition)] += 1
            entry = {
                "seq": len(self.produce_log) + 1, "t": round(time.time(), 3), "conn": conn,
                "correlation_id": correlation_id, "version": version, "acks": acks,
                "counts": counts, "forwarded": forwarded,
                # how many of each partition's requests the broker had got, this one included
                "forwarded_before": [self.forwarded[(t, p)] for t, p, _ in parts],
                "fault": rule.action if rule else None,
                "partitions": [{"topic": t, "partition": p, "batches": [
                    {k: v for k, v in b.items() if k != "base_offset"} for b in batches]}
                    for t, p, batches in parts],
                "response": None,
            }
            self.produce_log.append(entry)
            if rule is not None:
                fault = {"action": rule.action, "seq": entry["seq"], "conn": conn,
                         "correlation_id": correlation_id, "counts": counts,
                         "t": entry["t"]}
                if rule.action == "error":
                    fault["error"] = error_name(rule.error)
                fault["batches"] = [
                    {"topic": t, "partition": p, "producer_id": b.get("producer_id"),
                     "producer_epoch": b.get("producer_epoch"),
                     "base_sequence": b.get("base_sequence"), "count": b.get("count"),
                     "event_ids": b.get("event_ids", []), "keys": b.get("keys", [])}
                    for t, p, batches in parts for b in batches]
                self.faults.append(fault)
        if rule is not None and self.verbose:
            print(f"[fault proxy] {self.describe_fault(fault)}", file=sys.stderr, flush=True)
        return entry, rule

    def _produce_answered(self, entry, results, dropped=False):
        with self.lock:
            entry["response"] = [{"topic": t, "partition": p, "error": error_name(e),
                                  "base_offset": o} for t, p, e, o in results]
            if dropped:
                entry["response_dropped"] = True

    @staticmethod
    def describe_fault(f):
        batches = "; ".join(
            f"{b['topic']}[{b['partition']}] producer id {b['producer_id']} epoch "
            f"{b['producer_epoch']} base sequence {b['base_sequence']} records {b['count']}"
            for b in f["batches"])
        what = f["action"] + (f" {f['error']}" if "error" in f else "")
        return (f"{what} on Produce request #{f['seq']} (conn {f['conn']}, correlation id "
                f"{f['correlation_id']}, nth of its partition {f['counts']}): {batches}")

    @staticmethod
    def describe_produce(entry):
        parts = []
        for p in entry["partitions"]:
            for b in p["batches"]:
                parts.append(f"{p['topic']}[{p['partition']}] pid {b.get('producer_id')} "
                             f"seq {b.get('base_sequence')}+{b.get('count')}")
        resp = entry["response"]
        outcome = (", ".join(f"{r['error']} base_offset {r['base_offset']}" for r in resp)
                   if resp else ("proxy answered " + entry["proxy_answer"]
                                 if entry.get("proxy_answer") else "no response"))
        if resp and entry.get("proxy_answer"):
            outcome = f"broker: {outcome}; the client got {entry['proxy_answer']}"
        if entry.get("response_dropped"):
            outcome += " (response dropped by the proxy)"
        return (f"#{entry['seq']} conn {entry['conn']} corr {entry['correlation_id']} v"
                f"{entry['version']} {'; '.join(parts)} -> {outcome}"
                + (f" [fault: {entry['fault']}]" if entry["fault"] else ""))

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps({"faults": self.faults, "events": self.events,
                                          "produce_log": self.produce_log}))

    # control socket
    def _start_control(self):
        try:
            os.unlink(self.control_path)
        except OSError:
            pass
        self.control_sock = socket.socket(socket.AF_UNIX)
        self.control_sock.bind(self.control_path)
        self.control_sock.listen(4)
        threading.Thread(target=self._control_loop, daemon=True).start()

    def _control_loop(self):
        while not self.stopping:
            try:
                c, _ = self.control_sock.accept()
            except OSError:
                return
            with c, c.makefile("rw") as f:
                for line in f:
                    try:
                        f.write(json.dumps(self.command(json.loads(line))) + "\n")
                    except Exception as e:  # a bad command is answered, not fatal
                        f.write(json.dumps({"error": str(e)}) + "\n")
                    f.flush()

    def command(self, cmd):
        what = cmd.get("cmd")
        if what == "add_rule":
            return {"ok": repr(self.add_rule(cmd["rule"]))}
        if what == "clear_rules":
            self.clear_rules()
            return {"ok": True}
        if what == "cut_all":
            self.cut_all()
            return {"ok": True}
        if what in ("faults", "produce_log", "events"):
            return self.snapshot()[what]
        raise ValueError(f"unknown command {what!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="the broker, host:port")
    ap.add_argument("--listen", type=int, default=0, help="port on 127.0.0.1 (0: any)")
    ap.add_argument("--max-produce-version", type=int, default=7)
    ap.add_argument("--control", help="a unix socket for JSON commands")
    ap.add_argument("--rule", action="append", default=[], help="a Rule as JSON")
    args = ap.parse_args()
    proxy = FaultProxy(args.upstream, args.listen, args.max_produce_version, args.control,
                       verbose=True)
    for r in args.rule:
        proxy.add_rule(json.loads(r))
    proxy.start()
    print(f"listening={proxy.address}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
