#!/usr/bin/python3
"""A real Apache Kafka cluster on loopback, for the tests, the demo and the benchmark.

Apache Kafka (the version test/kafka/pom.xml names) comes from Maven Central
through Maven's local cache; nothing is downloaded by hand or committed. Each
node is one `kafka.Kafka` JVM (Java 17) in KRaft mode, a combined broker and
controller, with a small heap. One node: for quick tests and the demo. Three:
replication factor 3, min.insync.replicas=2, auto-create off, the offsets and
transaction-state topics replicated 3 with min ISR 2.

As a command:

    test/kafka/cluster.py [--nodes 3] [--auto-create] [--sasl] [--stop-on-eof]

starts the cluster, waits until it really serves (a DescribeCluster through
Java's admin client lists every broker), prints `bootstrap=<servers>` and
waits; on SIGTERM, SIGINT (or, with --stop-on-eof, the end of standard
input) it stops every node and removes every file it made.

As a module: KafkaCluster(nodes=3).start() ... .stop().
"""

import argparse
import atexit
import base64
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
POM = os.path.join(HERE, "pom.xml")
TOOL_SRC = os.path.join(HERE, "KafkaTool.java")
HEAP = os.environ.get("OUTBOX_KAFKA_HEAP", "-Xmx512m")

_classpath = None
_tool_dir = None
_lock = threading.Lock()


def classpath():
    """Kafka's classpath from Maven's local cache (resolved from Maven Central when cold)."""
    global _classpath
    with _lock:
        if _classpath is None:
            out = tempfile.NamedTemporaryFile(prefix="outbox-kafka-cp-", delete=False)
            out.close()
            try:
                subprocess.run(["mvn", "-q", "-B", "-f", POM, "dependency:build-classpath",
                                f"-Dmdep.outputFile={out.name}"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                with open(out.name) as f:
                    _classpath = f.read().strip()
            finally:
                os.unlink(out.name)
        return _classpath


def tool_dir():
    """KafkaTool.java compiled once per process."""
    global _tool_dir
    cp = classpath()
    with _lock:
        if _tool_dir is None:
            d = tempfile.mkdtemp(prefix="outbox-kafka-tool-")
            subprocess.run(["javac", "-nowarn", "-d", d, "-cp", cp, TOOL_SRC], check=True,
                           stdout=subprocess.DEVNULL)
            _tool_dir = d
            atexit.register(shutil.rmtree, d, True)
        return _tool_dir


def java_tool(*args, timeout=330, check=True):
    """Runs test/kafka/KafkaTool.java (Java's own Kafka client); returns its stdout."""
    cmd = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=error",
           "-cp", tool_dir() + os.pathsep + classpath(), "KafkaTool"] + [str(a) for a in args]
    out = subprocess.run(cmd, capture_output=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"KafkaTool {args[:3]}: {out.stderr.decode(errors='replace')[-2000:]}")
    return out.stdout.decode()


def _die_with_parent():
    """In the child: SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG follows
    the thread, not the process), however it ends: start nodes from a thread that lives as
    long as they should."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_id():
    """A KRaft cluster id: 16 random bytes in URL-safe base64, as kafka-storage random-uuid,
    never starting with '-' (as Kafka's Uuid.randomUuid): `format -t -x...` would read it as an
    option and print its usage, one cluster start in 64."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class Tls:
    """A CA and a broker certificate for 127.0.0.1, made with openssl."""

    def __init__(self, directory):
        self.dir = directory
        self.ca_key = os.path.join(directory, "ca.key")
        self.ca = os.path.join(directory, "ca.pem")
        self.broker_key = os.path.join(directory, "broker.key")
        self.broker_cert = os.path.join(directory, "broker.pem")
        self.keystore = os.path.join(directory, "broker-keystore.pem")

        def ssl(*args):
            subprocess.run(["openssl"] + list(args), check=True, capture_output=True)

        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=outbox test CA",
            "-keyout", self.ca_key, "-out", self.ca)
        csr = os.path.join(directory, "broker.csr")
        ext = os.path.join(directory, "broker.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", self.broker_key, "-out", csr)
        ssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
            "-days", "2", "-extfile", ext, "-out", self.broker_cert)
        with open(self.keystore, "w") as out:
            for part in (self.broker_key, self.broker_cert):
                with open(part) as f:
                    out.write(f.read())

    def self_signed(self, name):
        """A certificate no CA of ours signed (for the bad-certificate cases)."""
        key = os.path.join(self.dir, name + ".key")
        cert = os.path.join(self.dir, name + ".pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=someone else", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        return cert


class KafkaCluster:
    """Apache Kafka in KRaft mode on 127.0.0.1: `nodes` combined broker/controllers."""

    def __init__(self, nodes=3, auto_create=None, sasl=False, scram_users=None, authorizer=None,
                 proxy_ports=None, plain_users=None):
        """proxy_ports: one port per node, on 127.0.0.1, where a proxy in front of the
        node listens (test/kafka/fault_proxy.py). Each node then also has a PROXIED
        listener on a port of its own (self.proxied_upstream[i], what the proxy connects
        to) that advertises the proxy's port: a client that connects through the proxy
        is told, by Metadata and FindCoordinator, to come back through it. The
        PLAINTEXT listener (self.bootstrap, the brokers' own and the tools') is
        unchanged."""
        self.n = nodes
        # A SASL_PLAINTEXT listener with PLAIN for these users (no TLS to make): a principal
        # that ACLs apply to, where PLAINTEXT's ANONYMOUS is a super user.
        self.plain_users = plain_users or {}
        self.auto_create = (nodes == 1) if auto_create is None else auto_create
        self.sasl = sasl
        self.authorizer = (sasl or bool(self.plain_users)) if authorizer is None else authorizer
        self.scram_users = scram_users or {"outbox": "outbox-secret-1"}
        self.dir = tempfile.mkdtemp(prefix="outbox-kafka-")
        os.chmod(self.dir, 0o755)
        self.ids = list(range(1, nodes + 1))
        # Distinct ports: free_port() may hand out a port it handed out just before.
        taken = set(proxy_ports or ())

        def port():
            while True:
                p = free_port()
                if p not in taken:
                    taken.add(p)
                    return p

        self.port = {i: port() for i in self.ids}
        self.controller_port = {i: port() for i in self.ids}
        self.sasl_port = {i: port() for i in self.ids} if sasl else {}
        if proxy_ports is not None and len(proxy_ports) != nodes:
            raise ValueError("proxy_ports: one port per node")
        self.proxy_port = dict(zip(self.ids, proxy_ports)) if proxy_ports else {}
        self.proxied_port = {i: port() for i in self.proxy_port}
        self.proxied_upstream = {i: f"127.0.0.1:{p}" for i, p in self.proxied_port.items()}
        self.plain_port = {i: port() for i in self.ids} if self.plain_users else {}
        self.procs = {}
        self.tls = Tls(self.dir) if sasl else None
        self.bootstrap = ",".join(f"127.0.0.1:{self.port[i]}" for i in self.ids)
        self.sasl_bootstrap = ",".join(f"127.0.0.1:{self.sasl_port[i]}" for i in self.ids) if sasl else ""
        self.plain_bootstrap = ",".join(f"127.0.0.1:{self.plain_port[i]}" for i in self.ids
                                        ) if self.plain_users else ""

    def node_dir(self, i):
        return os.path.join(self.dir, f"node-{i}")

    def log_path(self, i):
        return os.path.join(self.node_dir(i), "server.log")

    def _properties(self, i):
        rf = min(3, self.n)
        min_isr = min(2, self.n)
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port[i]}"]
        advertised = list(listeners)
        if self.sasl:
            listeners.append(f"SASL_SSL://127.0.0.1:{self.sasl_port[i]}")
            advertised.append(f"SASL_SSL://127.0.0.1:{self.sasl_port[i]}")
        if i in self.proxy_port:
            listeners.append(f"PROXIED://127.0.0.1:{self.proxied_port[i]}")
            advertised.append(f"PROXIED://127.0.0.1:{self.proxy_port[i]}")
        if self.plain_users:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{self.plain_port[i]}")
            advertised.append(f"SASL_PLAINTEXT://127.0.0.1:{self.plain_port[i]}")
        listeners.append(f"CONTROLLER://127.0.0.1:{self.controller_port[i]}")
        props = {
            "process.roles": "broker,controller",
            "node.id": i,
            "controller.quorum.voters": ",".join(f"{j}@127.0.0.1:{self.controller_port[j]}"
                                                 for j in self.ids),
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,"
                                              "SASL_PLAINTEXT:SASL_PLAINTEXT"
                                              + (",PROXIED:PLAINTEXT" if self.proxy_port else ""),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": os.path.join(self.node_dir(i), "data"),
            "num.partitions": 4,
            "default.replication.factor": rf,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            "auto.create.topics.enable": str(self.auto_create).lower(),
            "unclean.leader.election.enable": "false",
            "group.initial.rebalance.delay.ms": 0,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "log.cleaner.threads": 1,
            # A killed node rejoins quickly; an unreachable broker is fenced within seconds.
            "broker.session.timeout.ms": 6000,
            "broker.heartbeat.interval.ms": 1000,
            "controller.quorum.election.timeout.ms": 1000,
            "controller.quorum.fetch.timeout.ms": 2000,
            "replica.lag.time.max.ms": 10000,
        }
        if self.sasl:
            props.update({
                # SCRAM-SHA-512, and PLAIN for librdkafka before 2.6.1, whose SCRAM
                # client-final-message Kafka 4 refuses (confluentinc/librdkafka#4895).
                "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl_ssl.plain.sasl.jaas.config":
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    + " ".join(f'user_{u}="{p}"' for u, p in self.scram_users.items()) + ";",
                "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
                "listener.name.sasl_ssl.ssl.keystore.location": self.tls.keystore,
            })
        if self.plain_users:
            props.update({
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    + " ".join(f'user_{u}="{p}"' for u, p in self.plain_users.items()) + ";",
            })
            if not self.sasl:
                props["sasl.enabled.mechanisms"] = "PLAIN"
        if self.authorizer:
            props.update({
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # Brokers and the test's admin client talk PLAINTEXT as ANONYMOUS;
                # ACLs are for the relay's SCRAM principal.
                "super.users": "User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "true",
            })
        return props

    def _write_properties(self, i):
        os.makedirs(self.node_dir(i), exist_ok=True)
        path = os.path.join(self.node_dir(i), "server.properties")
        with open(path, "w") as f:
            for k, v in self._properties(i).items():
                f.write(f"{k}={v}\n")
        return path

    def _java(self, i):
        return ["java", HEAP, "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
                # Leader changes, truncations and log recovery, for a test that
                # finds a message missing (partition_history()).
                "-Dorg.slf4j.simpleLogger.log.kafka.cluster.Partition=info",
                "-Dorg.slf4j.simpleLogger.log.kafka.server.ReplicaFetcherThread=info",
                "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.storage.internals.log=info",
                "-Dorg.slf4j.simpleLogger.log.kafka.log=info",
                "-cp", classpath()]

    def format(self):
        cid = cluster_id()
        procs = []
        for i in self.ids:
            props = self._write_properties(i)
            cmd = self._java(i) + ["kafka.tools.StorageTool", "format", "-t", cid, "-c", props]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for p in procs:
            out = p.communicate(timeout=300)[0]
            if p.returncode != 0:
                raise RuntimeError(f"kafka-storage format: {out.decode(errors='replace')[-2000:]}")

    def start_node(self, i):
        props = os.path.join(self.node_dir(i), "server.properties")
        log = open(self.log_path(i), "a")
        self.procs[i] = subprocess.Popen(self._java(i) + ["kafka.Kafka", props], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        log.close()

    def kill_node(self, i):
        """kill -9."""
        p = self.procs.get(i)
        if p and p.poll() is None:
            p.kill()
            p.wait()

    def stop_node(self, i, timeout=120):
        """A clean shutdown (SIGTERM), as a rolling restart does."""
        p = self.procs.get(i)
        if p and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def running(self):
        return [i for i in self.ids if self.procs.get(i) and self.procs[i].poll() is None]

    def wait_ready(self, brokers=None, timeout=240):
        """Until a DescribeCluster answers with `brokers` brokers (all by default)."""
        up = [f"127.0.0.1:{self.port[i]}" for i in self.running()]
        java_tool("ready", ",".join(up), brokers or self.n, timeout, timeout=timeout + 60)

    def start(self, timeout=240):
        try:
            self.format()
            for i in self.ids:
                self.start_node(i)
            self.wait_ready(timeout=timeout)
            if self.sasl:
                for user, password in self.scram_users.items():
                    java_tool("add-scram", self.bootstrap, user, password)
        except BaseException:
            self.stop()
            raise
        return self

    def create_topic(self, topic, partitions=4, replicas=None, **configs):
        java_tool("create-topic", self.bootstrap, topic, partitions, replicas or min(3, self.n),
                  *[f"{k.replace('_', '.')}={v}" for k, v in configs.items()])

    def deny_write(self, topic, principal):
        java_tool("deny-write", self.bootstrap, topic, principal)

    def allow_describe(self, topic, principal):
        java_tool("allow-describe", self.bootstrap, topic, principal)

    def quorum_leader(self):
        up = ",".join(f"127.0.0.1:{self.port[i]}" for i in self.running())
        return int(java_tool("quorum-leader", up).strip())

    def txn_coordinator(self, transactional_id):
        """The node that coordinates a transactional id's transactions."""
        up = ",".join(f"127.0.0.1:{self.port[i]}" for i in self.running())
        return int(java_tool("txn-coordinator", up, transactional_id).strip())

    def describe(self, topic):
        """partition -> (leader, ISR size, end offset), from Java's admin client."""
        up = ",".join(f"127.0.0.1:{self.port[i]}" for i in self.running())
        out = {}
        for line in java_tool("describe", up, topic).splitlines():
            p, leader, isr, end = (int(x) for x in line.split("\t"))
            out[p] = (leader, isr, end)
        return out

    def wait_isr(self, topic, timeout=240):
        """Until every partition of the topic has all replicas in sync again."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                d = self.describe(topic)
                if all(isr >= min(3, self.n) and leader >= 0 for leader, isr, _ in d.values()):
                    return
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: replicas not back in sync after {timeout}s")
            time.sleep(1)

    def group_offsets(self, group):
        """partition -> the group's committed offset."""
        up = ",".join(f"127.0.0.1:{self.port[i]}" for i in self.running())
        return {int(p): int(o) for p, o in
                (line.split("\t") for line in java_tool("group-offsets", up, group).splitlines())}

    def dump(self, topic, isolation="read_uncommitted", contiguous=False):
        """Every record of the topic, read by Java's consumer: a list of dicts of bytes.
        isolation="read_committed": only records of committed transactions (and none after
        a transaction still open). contiguous=True: fails unless each partition's offsets run
        without a gap from its log start (a topic no transaction wrote, never compacted)."""
        records = []
        args = ("dump", self.bootstrap, topic, isolation) + (("contiguous",) if contiguous else ())
        for line in java_tool(*args).splitlines():
            p, o, k, v, jp, hs = (line.split("\t") + [""])[:6]
            dec = (lambda s: None if s == "-" else base64.b64decode(s))
            headers = []
            for h in hs.split(",") if hs else []:
                hk, hv = h.split(":")
                headers.append((dec(hk).decode(), dec(hv)))
            records.append({"partition": int(p), "offset": int(o), "key": dec(k), "value": dec(v),
                            "java_partition": int(jp), "headers": headers})
        return records

    def partition_history(self, topic, limit=40):
        """Each node's log lines about `topic`'s leaders, truncations and recovery, the last
        `limit` of each: what tells a record Kafka dropped from one it never had."""
        words = ("truncat", "leader epoch", "recover", "invalid", "isr", "diverg")
        out = {}
        for i in self.ids:
            try:
                with open(self.log_path(i), errors="replace") as f:
                    lines = [ln.rstrip() for ln in f if topic in ln and
                             any(w in ln.lower() for w in words)]
            except OSError as e:
                lines = [f"(no log: {e})"]
            out[i] = lines[-limit:]
        return out

    def stop(self):
        for i in list(self.procs):
            self.kill_node(i)
        shutil.rmtree(self.dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    ap.add_argument("--auto-create", action="store_true", default=None,
                    help="let producers create topics (the default with one node)")
    ap.add_argument("--sasl", action="store_true",
                    help="also a SASL_SSL (SCRAM-SHA-512) listener, with a CA made by openssl")
    ap.add_argument("--stop-on-eof", action="store_true", help="stop when standard input ends")
    args = ap.parse_args()
    t0 = time.monotonic()
    cluster = KafkaCluster(nodes=args.nodes, auto_create=args.auto_create, sasl=args.sasl)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        cluster.start()
        print(f"bootstrap={cluster.bootstrap}", flush=True)
        if args.sasl:
            print(f"sasl_bootstrap={cluster.sasl_bootstrap}", flush=True)
            print(f"ca={cluster.tls.ca}", flush=True)
        print(f"ready in {time.monotonic() - t0:.1f}s; logs in {cluster.dir}", file=sys.stderr, flush=True)
        if args.stop_on_eof:
            threading.Thread(target=lambda: (sys.stdin.read(), stopping.set()), daemon=True).start()
        while not stopping.is_set() and len(cluster.running()) == cluster.n:
            stopping.wait(1)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
