// The relay's producer against librdkafka's in-process mock cluster: what
// reaches Kafka, what is reported acked or failed, and what is held back.
#include "outbox/kafka/producer.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

using outbox::kafka::BrokerState;
using outbox::kafka::Producer;
using outbox::kafka::Record;

namespace {

// A mock cluster living for one test.
struct MockCluster {
    rd_kafka_t *rk = nullptr;
    rd_kafka_mock_cluster_t *mc = nullptr;
    explicit MockCluster(int brokers = 1) {
        char err[256];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
        mc = rd_kafka_mock_cluster_new(rk, brokers);
        rd_kafka_mock_topic_create(mc, "orders", 4, 1);
    }
    ~MockCluster() {
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
    }
    std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(mc); }
};

struct Pipe {
    int fd[2];
    Pipe() { EXPECT_EQ(pipe(fd), 0); }
    ~Pipe() {
        close(fd[0]);
        close(fd[1]);
    }
    bool readable(int timeout_ms) {
        pollfd p{fd[0], POLLIN, 0};
        return ::poll(&p, 1, timeout_ms) > 0;
    }
};

// Owns the strings a Record points to.  The order key is "topic key", as
// the relay builds it (a key's order is per topic).
struct Row {
    int64_t id;
    std::string topic, key, value, headers, event_id;
    mutable std::string order;
    Record record() const {
        Record r{};
        r.id = id;
        r.topic = topic.data();
        r.topic_len = topic.size();
        order = topic + " " + key;
        r.order_key = order.data();
        r.order_key_len = order.size();
        r.key = key.data();
        r.key_len = key.size();
        r.value = value.data();
        r.value_len = value.size();
        r.headers = headers.data();
        r.headers_len = headers.size();
        r.event_id = event_id.c_str();
        r.partition = -1;
        return r;
    }
};

std::vector<Record> records_of(const std::vector<Row> &rows) {
    std::vector<Record> out;
    for (const Row &r : rows) out.push_back(r.record());
    return out;
}

std::string uuid_for(int64_t id) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "00000000-0000-7000-8000-%012lld", static_cast<long long>(id));
    return buf;
}

Row row(int64_t id, std::string key, std::string headers = "{}", std::string topic = "orders") {
    return Row{id, std::move(topic), std::move(key),
               "{\"n\": " + std::to_string(id) + "}", std::move(headers), uuid_for(id), {}};
}

std::unique_ptr<Producer> make_producer(const MockCluster &c, int fd, std::string extra = "") {
    outbox::kafka::Settings s;
    s.client.brokers = c.bootstraps();
    s.client.client_id = "producer-test";
    s.client.extra = std::move(extra);
    std::string error;
    auto p = Producer::create(s, fd, error);
    EXPECT_TRUE(p) << error;
    return p;
}

// Polls until nothing is in flight or the time is up.
void wait_all(Producer &p, int seconds = 15) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (p.in_flight() > 0 && std::chrono::steady_clock::now() < until) {
        p.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    p.poll();
}

std::set<int64_t> acked(const Producer &p) {
    std::set<int64_t> ids(p.batch_acked_ids(), p.batch_acked_ids() + p.batch_acked_count());
    ids.insert(p.late_acked_ids(), p.late_acked_ids() + p.late_acked_count());
    return ids;
}

struct Consumed {
    std::string key, value;
    int32_t partition;
    int64_t offset;
    std::map<std::string, std::string> headers;
};

// Reads every record of `topic` from the beginning with a real consumer.
std::vector<Consumed> consume_all(const MockCluster &c, const std::string &topic, size_t expect) {
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", c.bootstraps().c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "producer-test", err, sizeof err);
    rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof err);
    rd_kafka_t *consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    rd_kafka_poll_set_consumer(consumer);
    rd_kafka_topic_partition_list_t *subs = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(subs, topic.c_str(), RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(consumer, subs);
    rd_kafka_topic_partition_list_destroy(subs);

    std::vector<Consumed> out;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (out.size() < expect && std::chrono::steady_clock::now() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 200);
        if (!m) continue;
        if (!m->err) {
            Consumed c;
            c.key.assign(static_cast<const char *>(m->key), m->key_len);
            c.value.assign(static_cast<const char *>(m->payload), m->len);
            c.partition = m->partition;
            c.offset = m->offset;
            rd_kafka_headers_t *hdrs = nullptr;
            if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
                const char *name;
                const void *val;
                size_t size;
                for (size_t i = 0; !rd_kafka_header_get_all(hdrs, i, &name, &val, &size); i++)
                    c.headers[name] = std::string(static_cast<const char *>(val), size);
            }
            out.push_back(std::move(c));
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(consumer);
    rd_kafka_destroy(consumer);
    return out;
}

}  // namespace

TEST(Producer, DeliversABatchAndReportsEveryAck) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows;
    for (int i = 1; i <= 200; i++) rows.push_back(row(i, "key-" + std::to_string(i % 7)));
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    EXPECT_EQ(p->in_flight(), 200u);
    wait_all(*p);
    EXPECT_EQ(p->in_flight(), 0u);
    EXPECT_EQ(p->acked_count(), 200u);
    EXPECT_EQ(p->failed_count(), 0u);
    std::set<int64_t> ids = acked(*p);
    EXPECT_EQ(ids.size(), 200u);
    EXPECT_EQ(*ids.begin(), 1);
    EXPECT_EQ(*ids.rbegin(), 200);
    EXPECT_EQ(p->broker_state(), BrokerState::Up);
}

// A mark is an offset: every acknowledgement carries the partition and
// offset Kafka gave the record, and that place holds exactly that record.
TEST(Producer, EveryAckCarriesThePlaceOfItsRecord) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows;
    for (int i = 1; i <= 60; i++) rows.push_back(row(i, "key-" + std::to_string(i % 5)));
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    ASSERT_EQ(p->batch_acked_count() + p->late_acked_count(), 60u);
    std::map<std::pair<int32_t, int64_t>, int64_t> id_at;  // (partition, offset) -> id
    auto take = [&](const int64_t *ids, const int32_t *parts, const int64_t *offs, size_t n) {
        for (size_t i = 0; i < n; i++) {
            EXPECT_GE(parts[i], 0) << "id " << ids[i];
            EXPECT_GE(offs[i], 0) << "id " << ids[i];
            EXPECT_TRUE(id_at.emplace(std::make_pair(parts[i], offs[i]), ids[i]).second)
                << "two acks name one place";
        }
    };
    take(p->batch_acked_ids(), p->batch_acked_partitions(), p->batch_acked_offsets(),
         p->batch_acked_count());
    take(p->late_acked_ids(), p->late_acked_partitions(), p->late_acked_offsets(),
         p->late_acked_count());
    auto got = consume_all(cluster, "orders", 60);
    ASSERT_EQ(got.size(), 60u);
    for (const Consumed &c : got) {
        auto at = id_at.find({c.partition, c.offset});
        ASSERT_NE(at, id_at.end()) << "no ack names partition " << c.partition << " offset "
                                   << c.offset;
        // row(i, ...)'s value names its id (see row()).
        EXPECT_NE(c.value.find("\"n\": " + std::to_string(at->second) + "}"), std::string::npos)
            << "partition " << c.partition << " offset " << c.offset << " holds " << c.value
            << ", not row " << at->second;
    }
}

TEST(Producer, WakesTheCallerThroughTheFd) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    Row r = row(1, "k");
    Record rec = r.record();
    p->produce(&rec, 1);
    EXPECT_TRUE(pipe.readable(10000)) << "no wake-up byte for a delivery report";
    wait_all(*p);
    EXPECT_EQ(p->acked_count(), 1u);
}

TEST(Producer, RecordsCarryKeyValueHeadersAndEventId) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {
        row(1, "order-1", R"({"event_type": "OrderCreated"})"),
        row(2, "order-2", R"({"event_id": "caller-chose-this", "x": "y"})"),
        row(3, "order-1"),
    };
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    ASSERT_EQ(p->acked_count(), 3u);

    auto got = consume_all(cluster, "orders", 3);
    ASSERT_EQ(got.size(), 3u);
    std::map<std::string, Consumed> by_value;
    for (auto &c : got) by_value[c.value] = c;
    const Consumed &a = by_value.at("{\"n\": 1}");
    EXPECT_EQ(a.key, "order-1");
    EXPECT_EQ(a.headers.at("event_type"), "OrderCreated");
    EXPECT_EQ(a.headers.at("event_id"), uuid_for(1));
    const Consumed &b = by_value.at("{\"n\": 2}");
    EXPECT_EQ(b.headers.at("event_id"), "caller-chose-this");  // the caller's own id wins
    EXPECT_EQ(b.headers.at("x"), "y");
    const Consumed &c = by_value.at("{\"n\": 3}");
    EXPECT_EQ(c.headers.size(), 1u);
    EXPECT_EQ(c.headers.at("event_id"), uuid_for(3));
    EXPECT_EQ(a.partition, c.partition) << "same key, same partition";
}

TEST(Producer, BadHeadersFailForGoodAndHoldTheKeysLaterRecords) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {row(1, "a"), row(2, "b", R"({"n": 1})"), row(3, "b"), row(4, "a"),
                             row(5, "b")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{1, 4}));
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_EQ(p->failed_ids()[0], 2);
    EXPECT_TRUE(p->failed_permanent(0));
    EXPECT_NE(std::string(p->failed_error(0)).find("\"n\""), std::string::npos);
    EXPECT_EQ(p->held_count(), 2u);  // 3 and 5: key "b" after the failure
}

// A key's order is per topic: a failure holds back its key's later records
// on its topic, never the same key's records on another topic (another
// role's, in practice).
TEST(Producer, AFailureHoldsItsKeyOnItsTopicOnly) {
    MockCluster cluster;
    rd_kafka_mock_topic_create(cluster.mc, "payments", 2, 1);
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {row(1, "b", R"({"n": 1})"), row(2, "b", "{}", "payments"), row(3, "b"),
                             row(4, "b", "{}", "payments")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{2, 4}));
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_EQ(p->failed_ids()[0], 1);
    EXPECT_EQ(p->held_count(), 1u);  // 3: "b" on orders, after the failure
}

// A topic the cluster does not have (auto-create off): its records fail at
// once, for good, without taking in-flight room (librdkafka would keep them
// up to topic.metadata.propagation.max.ms, 30 s, and the relay's batch
// would wait for them), and the refusal is remembered: the next batch's
// records of that topic fail from memory, without asking the cluster.
TEST(Producer, AnUnknownTopicFailsAtOnceAndIsRemembered) {
    MockCluster cluster;
    rd_kafka_mock_topic_set_error(cluster.mc, "absent", RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    outbox::kafka::TopicRefusals memory;
    p->set_refusals(&memory);
    std::vector<Row> rows = {row(1, "a", "{}", "absent"), row(2, "a"), row(3, "b", "{}", "absent"),
                             row(4, "b")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    EXPECT_EQ(p->in_flight(), 2u) << "only the existing topic's records are in flight";
    ASSERT_EQ(p->failed_count(), 2u);
    EXPECT_EQ(p->failed_ids()[0], 1);
    EXPECT_EQ(p->failed_ids()[1], 3);
    EXPECT_TRUE(p->failed_permanent(0));
    EXPECT_NE(std::string(p->failed_error(0)).find("Unknown topic"), std::string::npos)
        << p->failed_error(0);
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{2, 4}));
    p->clear_resolved();

    std::vector<Row> again = {row(5, "c", "{}", "absent"), row(6, "c")};
    auto recs2 = records_of(again);
    p->produce(recs2.data(), recs2.size());
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_EQ(p->failed_ids()[0], 5);
    EXPECT_NE(std::string(p->failed_error(0)).find("not sent again"), std::string::npos)
        << p->failed_error(0);
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{6}));
}

// The question "does this topic exist?" spends of the batch's time
// (produce()'s metadata_wait_ms, a share of outbox.batch_timeout): with none
// left, the record goes to librdkafka unasked, as any other, instead of
// waiting inside the relay's transaction; the next batch asks.
TEST(Producer, AskingAboutATopicNeverOutlastsTheBatchsTime) {
    MockCluster cluster;
    rd_kafka_mock_topic_set_error(cluster.mc, "absent", RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {row(1, "a", "{}", "absent"), row(2, "a")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size(), 0);
    EXPECT_EQ(p->failed_count(), 0u) << "not asked, so not refused at once";
    EXPECT_EQ(p->in_flight(), 2u);
    p->clear_resolved();

    std::vector<Row> again = {row(3, "b", "{}", "absent")};
    auto recs2 = records_of(again);
    p->produce(recs2.data(), recs2.size());
    ASSERT_EQ(p->failed_count(), 1u) << "asked with time to answer";
    EXPECT_EQ(p->failed_ids()[0], 3);
    EXPECT_TRUE(p->failed_permanent(0));
}

// Kafka refuses a record batch whole when it is over the topic's
// max.message.bytes: every record of the request is reported
// MSG_SIZE_TOO_LARGE.  Only the largest is refused; its batch-mates (other
// keys, other roles' messages on a shared topic) fail for a passing reason,
// are never parked for it, and go again without it.
TEST(Producer, ATooLargeRecordsBatchMatesAreNotChargedWithIt) {
    MockCluster cluster;
    rd_kafka_mock_topic_create(cluster.mc, "one", 1, 1);
    rd_kafka_mock_push_request_errors(cluster.mc, 0 /* Produce */, 1,
                                      RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    Pipe pipe;
    // One request for the three (a linger longer than producing them takes).
    auto p = make_producer(cluster, pipe.fd[1], "linger.ms=300");
    Row big = row(2, "big", "{}", "one");
    big.value = "{\"pad\": \"" + std::string(5000, 'x') + "\"}";
    std::vector<Row> rows = {row(1, "a", "{}", "one"), big, row(3, "b", "{}", "one")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    ASSERT_EQ(p->failed_count(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
        std::string error = p->failed_error(i);
        EXPECT_NE(error.find("MSG_SIZE_TOO_LARGE"), std::string::npos) << error;
        if (p->failed_ids()[i] == 2) {
            EXPECT_TRUE(p->failed_permanent(i)) << "the largest is refused";
        } else {
            EXPECT_FALSE(p->failed_permanent(i)) << "a batch-mate is not: " << error;
            EXPECT_NE(error.find("sent again without it"), std::string::npos) << error;
        }
    }
    p->clear_resolved();
    std::vector<Row> mates = {row(1, "a", "{}", "one"), row(3, "b", "{}", "one")};
    auto recs2 = records_of(mates);
    p->produce(recs2.data(), recs2.size());
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{1, 3}));
}

// At-least-once: a record Kafka refuses costs only itself.  Nothing of it
// is remembered for its topic (a shared topic's other records, other
// roles', would be charged with it); only a topic found absent is.
TEST(Producer, AtLeastOnceRemembersNoRecordsRefusal) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    outbox::kafka::TopicRefusals memory;
    p->set_refusals(&memory);
    Row warm = row(1, "warm");
    Record wrec = warm.record();
    p->produce(&wrec, 1);
    wait_all(*p);
    p->clear_resolved();
    rd_kafka_mock_push_request_errors(cluster.mc, 0 /* Produce */, 1, RD_KAFKA_RESP_ERR_INVALID_RECORD);
    Row bad = row(2, "a");
    Record brec = bad.record();
    p->produce(&brec, 1);
    wait_all(*p);
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_TRUE(p->failed_permanent(0));
    p->clear_resolved();
    std::vector<Row> next = {row(3, "b"), row(4, "c")};
    auto recs = records_of(next);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    EXPECT_EQ(p->failed_count(), 0u) << p->failed_error(0);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{3, 4}));
    EXPECT_TRUE(memory.empty());
}

TEST(Producer, OversizedRecordFailsAtOnceAndHoldsItsKey) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1], "message.max.bytes=2000");
    Row big = row(1, "k");
    big.value = "\"" + std::string(5000, 'x') + "\"";
    std::vector<Row> rows = {big, row(2, "k"), row(3, "other")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{3}));
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_EQ(p->failed_ids()[0], 1);
    EXPECT_TRUE(p->failed_permanent(0));
    EXPECT_NE(std::string(p->failed_error(0)).find("5002 byte value"), std::string::npos)
        << p->failed_error(0);
    EXPECT_EQ(p->held_count(), 1u);
}

TEST(Producer, BrokerDownKeepsRecordsInFlightUntilItReturns) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1],
                           "reconnect.backoff.ms=50;reconnect.backoff.max.ms=200");
    // Connect first, so that the outage hits an established producer.
    Row warm = row(1, "k");
    Record wrec = warm.record();
    p->produce(&wrec, 1);
    wait_all(*p);
    ASSERT_EQ(p->acked_count(), 1u);
    p->clear_resolved();

    rd_kafka_mock_broker_set_down(cluster.mc, -1);
    std::vector<Row> rows;
    for (int i = 2; i <= 50; i++) rows.push_back(row(i, "k"));
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < until) {
        p->poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(p->acked_count(), 0u) << "nothing may be acked while the broker is down";
    EXPECT_EQ(p->failed_count(), 0u) << "an outage is no failure: librdkafka keeps retrying";
    EXPECT_EQ(p->in_flight(), 49u);
    EXPECT_EQ(p->broker_state(), BrokerState::Down);

    rd_kafka_mock_broker_set_up(cluster.mc, -1);
    wait_all(*p, 30);
    EXPECT_EQ(p->acked_count(), 49u);
    EXPECT_EQ(p->broker_state(), BrokerState::Up);
    bool said_down = false, said_up = false;
    for (size_t i = 0; i < p->log().count(); i++) {
        std::string t = p->log().text(i);
        said_down |= t.find("cannot reach Kafka") != std::string::npos;
        said_up |= t.find("reachable again") != std::string::npos;
    }
    EXPECT_TRUE(said_down);
    EXPECT_TRUE(said_up);
}

// librdkafka's queue is full (Kafka away, a big batch): produce() never
// waits for room; the rest of the batch is held back, neither produced nor
// failed, so its rows stay pending for a later claim.
TEST(Producer, AFullQueueHoldsTheRestOfTheBatchWithoutWaiting) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1], "queue.buffering.max.messages=10");
    rd_kafka_mock_broker_set_down(cluster.mc, -1);
    std::vector<Row> rows;
    for (int i = 1; i <= 100; i++) rows.push_back(row(i, "k" + std::to_string(i)));
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    EXPECT_EQ(p->in_flight(), 10u);
    EXPECT_EQ(p->held_count(), 90u);
    EXPECT_EQ(p->failed_count(), 0u) << "a full queue is no refusal";
    rd_kafka_mock_broker_set_up(cluster.mc, -1);
    wait_all(*p, 30);
    EXPECT_EQ(p->acked_count(), 10u);
}

// A row the relay could not prepare (Record::error) fails at once, for good,
// to be parked; the later records of its key are held back.
TEST(Producer, AnUnpreparedRecordFailsToBeParkedAndHoldsItsKey) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {row(1, "a"), row(2, "a"), row(3, "b")};
    auto recs = records_of(rows);
    recs[0].error = "the payload cannot be rendered";
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_TRUE(p->failed_permanent(0));
    EXPECT_TRUE(p->failed_park_now(0));
    EXPECT_EQ(p->held_count(), 1u);
    EXPECT_EQ(acked(*p), std::set<int64_t>{3});
}

// write_bytes(): no key, a null value (a tombstone), an explicit partition.
TEST(Producer, KeylessTombstonesAndExplicitPartitions) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {row(1, ""), row(2, "gone"), row(3, "p")};
    auto recs = records_of(rows);
    recs[0].key = nullptr;
    recs[0].order_key = nullptr;
    recs[1].value = nullptr;
    recs[2].partition = 1;
    p->produce(recs.data(), recs.size());
    EXPECT_EQ(p->snapshot_in_flight_keys(), 2u) << "a record without a key orders nothing";
    wait_all(*p);
    ASSERT_EQ(acked(*p), (std::set<int64_t>{1, 2, 3}));
}

// A partition the topic lacks is refused only once librdkafka knows the
// topic's partitions, after the batch is produced: a later record of the key
// on another partition would be acknowledged first.  It waits instead.
TEST(Producer, AKeysRecordBoundForAnotherPartitionWaitsForTheNextBatch) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    std::vector<Row> rows = {row(1, "k"), row(2, "k"), row(3, "other"), row(4, "k"),
                             row(5, "same"), row(6, "same")};
    auto recs = records_of(rows);
    recs[0].partition = 99;  // the mock's topics have 4
    recs[4].partition = 1;
    recs[5].partition = 1;
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{3, 5, 6}));
    ASSERT_EQ(p->failed_count(), 1u);
    EXPECT_EQ(p->failed_ids()[0], 1);
    EXPECT_EQ(p->held_count(), 2u);  // 2 and 4: key "k" after a record on another partition
}

TEST(Producer, BatchesOverlapAndInFlightKeysAreListed) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1],
                           "reconnect.backoff.ms=50;reconnect.backoff.max.ms=200");
    Row warm = row(1, "warm");
    Record wrec = warm.record();
    p->produce(&wrec, 1);
    wait_all(*p);
    p->clear_resolved();

    rd_kafka_mock_broker_set_down(cluster.mc, -1);
    std::vector<Row> first = {row(10, "a"), row(11, "b"), row(12, "a")};
    auto r1 = records_of(first);
    p->produce(r1.data(), r1.size());
    EXPECT_EQ(p->in_flight(), 3u);
    EXPECT_EQ(p->batch_in_flight(), 3u);
    std::vector<Row> second = {row(20, "c")};
    auto r2 = records_of(second);
    p->produce(r2.data(), r2.size());
    EXPECT_EQ(p->in_flight(), 4u);
    EXPECT_EQ(p->batch_in_flight(), 1u) << "only the last batch counts as the batch";
    std::set<std::string> keys;
    for (size_t i = 0, n = p->snapshot_in_flight_keys(); i < n; i++) keys.insert(std::string(p->in_flight_key(i)));
    EXPECT_EQ(keys, (std::set<std::string>{"orders a", "orders b", "orders c"}));

    rd_kafka_mock_broker_set_up(cluster.mc, -1);
    wait_all(*p, 30);
    EXPECT_EQ(acked(*p), (std::set<int64_t>{10, 11, 12, 20}));
    // The caller holds the rows of the last batch only: the others are late.
    EXPECT_EQ(std::set<int64_t>(p->batch_acked_ids(), p->batch_acked_ids() + p->batch_acked_count()),
              (std::set<int64_t>{20}));
    EXPECT_EQ(p->late_acked_count(), 3u);
    EXPECT_EQ(p->batch_in_flight(), 0u);
    EXPECT_EQ(p->snapshot_in_flight_keys(), 0u);
}

TEST(Producer, DeliveryErrorsAreLoggedOncePerDistinctError) {
    MockCluster cluster;
    Pipe pipe;
    // Warm up, then make every Produce request fail with a retriable error
    // until the records time out.  The warm-up must go through: one that
    // timed out itself would already have logged the error this test
    // expects logged once.  300 ms was too short for a first connection on
    // a loaded CI machine (librdkafka 2.14 in the sid tree failed five
    // warm-ups in a row), hence 1.5 s: the failing phase then lasts 1.5 s.
    Row warm = row(1, "k");
    Record wrec = warm.record();
    std::unique_ptr<Producer> p;
    for (int attempt = 0; attempt < 5; attempt++) {
        p = make_producer(cluster, pipe.fd[1], "message.timeout.ms=1500;retry.backoff.ms=10");
        p->produce(&wrec, 1);
        wait_all(*p);
        if (p->acked_count() == 1) break;
    }
    ASSERT_EQ(p->acked_count(), 1u) << "the warm-up record was never acknowledged";
    p->clear_resolved();
    p->clear_log();
    std::vector<rd_kafka_resp_err_t> errs(500, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);
    rd_kafka_mock_push_request_errors_array(cluster.mc, 0, errs.size(), errs.data());
    std::vector<Row> rows;
    for (int i = 2; i <= 30; i++) rows.push_back(row(i, "k" + std::to_string(i % 3)));
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    wait_all(*p);
    rd_kafka_mock_clear_request_errors(cluster.mc, 0);
    EXPECT_EQ(p->acked_count(), 0u);
    EXPECT_EQ(p->failed_count(), 29u);
    for (size_t i = 0; i < p->failed_count(); i++) EXPECT_FALSE(p->failed_permanent(i));
    size_t warnings = 0;
    for (size_t i = 0; i < p->log().count(); i++)
        if (std::string(p->log().text(i)).find("delivery failed") != std::string::npos) warnings++;
    EXPECT_EQ(warnings, 1u) << "29 failures with the same error must log once";
    std::string last = p->last_error();
    EXPECT_NE(last.find("timed out"), std::string::npos) << last;
    // The payload never leaks into error texts (they reach logs and the table).
    for (size_t i = 0; i < p->failed_count(); i++)
        EXPECT_EQ(std::string(p->failed_error(i)).find("\"n\""), std::string::npos)
            << p->failed_error(i);
}

TEST(Producer, ShutdownAbandonsWhatIsInFlightWithoutReportingIt) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1]);
    rd_kafka_mock_broker_set_down(cluster.mc, -1);
    std::vector<Row> rows = {row(1, "k"), row(2, "k")};
    auto recs = records_of(rows);
    p->produce(recs.data(), recs.size());
    p->shutdown(200);
    EXPECT_EQ(p->acked_count(), 0u);
    EXPECT_EQ(p->failed_count(), 0u);
}

TEST(Producer, CreateReportsLibrdkafkasError) {
    outbox::kafka::Settings s;
    s.client.brokers = "localhost:1";
    s.client.extra = "no.such.thing=1";
    std::string error;
    auto p = Producer::create(s, -1, error);
    EXPECT_FALSE(p);
    EXPECT_NE(error.find("no.such.thing"), std::string::npos) << error;
}

TEST(ErrorClass, PermanentVersusPassing) {
    using outbox::kafka::is_permanent_error;
    EXPECT_TRUE(is_permanent_error(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
    EXPECT_TRUE(is_permanent_error(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED));
    EXPECT_TRUE(is_permanent_error(RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
    EXPECT_FALSE(is_permanent_error(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT));
    EXPECT_FALSE(is_permanent_error(RD_KAFKA_RESP_ERR__TRANSPORT));
    EXPECT_FALSE(is_permanent_error(RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION));
}

// The relay's pattern under injected retriable errors: batches produced
// while earlier ones are still in flight (their keys skipped), reports
// taken as they come.  Every record reported acked must be in Kafka.
//
// One request in flight: when a request fails and a later one succeeds,
// librdkafka infers the failed one was persisted (true on Kafka, which
// enforces idempotent sequence numbers) and reports its records delivered
// (rd_kafka_dr_implicit_ack).  The mock cluster of librdkafka 2.0.2 checks
// sequences only for transactional producers, so with pipelining it would
// "lose" those records - an artifact of the mock, not of Kafka.
TEST(Producer, EveryAckedRecordIsInKafkaUnderRetriableErrors) {
    MockCluster cluster;
    Pipe pipe;
    auto p = make_producer(cluster, pipe.fd[1],
                           "retry.backoff.ms=5;max.in.flight.requests.per.connection=1");
    const int n = 6000;
    std::vector<Row> rows;
    for (int i = 1; i <= n; i++) rows.push_back(row(i, "key-" + std::to_string(i % 97)));
    std::set<int64_t> pending;
    for (int i = 1; i <= n; i++) pending.insert(i);
    std::set<int64_t> acked_ids;
    bool injected = false;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((!pending.empty() || p->in_flight() > 0) && std::chrono::steady_clock::now() < until) {
        std::set<std::string> busy;
        for (size_t i = 0, k = p->snapshot_in_flight_keys(); i < k; i++)
            busy.insert(std::string(p->in_flight_key(i)));
        std::vector<Record> batch;
        std::set<std::string> in_batch_busy;
        for (int64_t id : pending) {
            const Row &r = rows[static_cast<size_t>(id - 1)];
            if (busy.count(r.key)) continue;
            // Records of one key already claimed in this batch are fine.
            batch.push_back(r.record());
            if (batch.size() == 500) break;
        }
        // Rows of in-flight records are not claimable again.
        for (const Record &r : batch) pending.erase(r.id);
        if (!batch.empty()) p->produce(batch.data(), batch.size());
        if (!injected && acked_ids.size() > 1000) {
            std::vector<rd_kafka_resp_err_t> errs(150, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);
            rd_kafka_mock_push_request_errors_array(cluster.mc, 0, errs.size(), errs.data());
            injected = true;
        }
        auto batch_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
        while (p->batch_in_flight() > 0 && std::chrono::steady_clock::now() < batch_until) {
            p->poll();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        p->poll();
        auto a = acked(*p);
        acked_ids.insert(a.begin(), a.end());
        for (size_t i = 0; i < p->failed_count(); i++) pending.insert(p->failed_ids()[i]);
        p->clear_resolved();
    }
    ASSERT_TRUE(injected);
    EXPECT_EQ(acked_ids.size(), static_cast<size_t>(n));
    auto got = consume_all(cluster, "orders", static_cast<size_t>(n));
    std::set<std::string> values;
    for (auto &c : got) values.insert(c.value);
    std::vector<int64_t> acked_missing;
    for (int64_t id : acked_ids)
        if (!values.count(rows[static_cast<size_t>(id - 1)].value)) acked_missing.push_back(id);
    EXPECT_TRUE(acked_missing.empty()) << acked_missing.size() << " acked records not in Kafka, first "
                                       << (acked_missing.empty() ? 0 : acked_missing[0]);
}

// ---- transactional mode (outbox.delivery = exactly_once) ----

namespace {

std::unique_ptr<Producer> make_txn_producer(const MockCluster &c, int fd, const std::string &tid) {
    outbox::kafka::Settings s;
    s.client.brokers = c.bootstraps();
    s.client.client_id = "producer-test";
    s.transactional_id = tid;
    std::string error;
    auto p = Producer::create(s, fd, error);
    EXPECT_TRUE(p) << error;
    if (p) {
        bool fenced = false;
        EXPECT_TRUE(p->init_transactions(30000, error, fenced)) << error;
    }
    return p;
}

}  // namespace

TEST(ProducerTransactions, ACommitAcknowledgesExactlyTheTransactionsRecords) {
    MockCluster c(3);
    rd_kafka_mock_topic_create(c.mc, "progress", 1, 3);
    Pipe pipe;
    auto p = make_txn_producer(c, pipe.fd[1], "pg_outbox-1-db-1of1");
    ASSERT_TRUE(p);
    std::vector<Row> rows = {row(1, "a"), row(2, "b"), row(3, "a")};
    auto recs = records_of(rows);
    std::string error;
    ASSERT_TRUE(p->begin_transaction(error)) << error;
    p->produce(recs.data(), recs.size());
    EXPECT_EQ(p->transaction_ids(), (std::vector<int64_t>{1, 2, 3}));
    ASSERT_TRUE(p->produce_progress("progress", "pg_outbox-1-db-1of1", "seq=1", error)) << error;
    ASSERT_EQ(p->commit_transaction(30000, error), outbox::kafka::TxnOutcome::Committed) << error;
    EXPECT_EQ(acked(*p), (std::set<int64_t>{1, 2, 3}));
    EXPECT_EQ(p->in_flight(), 0u);
    EXPECT_EQ(consume_all(c, "orders", 3).size(), 3u);
}

TEST(ProducerTransactions, AnAbortAcknowledgesNothing) {
    MockCluster c(1);
    Pipe pipe;
    auto p = make_txn_producer(c, pipe.fd[1], "pg_outbox-1-db-1of1");
    ASSERT_TRUE(p);
    std::vector<Row> rows = {row(1, "a"), row(2, "b")};
    auto recs = records_of(rows);
    std::string error;
    ASSERT_TRUE(p->begin_transaction(error)) << error;
    p->produce(recs.data(), recs.size());
    wait_all(*p);  // acknowledged by the broker, inside the transaction
    EXPECT_EQ(p->abort_transaction(30000, error), outbox::kafka::TxnOutcome::Aborted) << error;
    EXPECT_EQ(p->acked_count(), 0u);
    EXPECT_EQ(p->in_flight(), 0u);
}

// A topic that does not exist and fencing are tested against Apache Kafka
// (test/e2e/test_exactly_once.py): Debian 12's mock creates every topic it is
// asked about and gives a second producer of an id the same epoch.

// Recovery registers its ids, then reads the progress topic; when that read
// (or the other id's registration) fails it tries again later with the same
// producers.  librdkafka refuses a second InitProducerId on a producer that
// is registered ("Operation not valid in state Ready"): the relay would then
// fail every later recovery and publish nothing until restarted.  A second
// registration of a registered producer succeeds and it still commits.
TEST(ProducerTransactions, RegisteringTwiceIsNoError) {
    MockCluster c(1);
    Pipe pipe;
    auto p = make_txn_producer(c, pipe.fd[1], "pg_outbox-1-db-1of1");
    ASSERT_TRUE(p);
    std::string error;
    bool fenced = true;
    EXPECT_TRUE(p->init_transactions(30000, error, fenced)) << error;
    EXPECT_FALSE(fenced);
    std::vector<Row> rows = {row(1, "a")};
    auto recs = records_of(rows);
    ASSERT_TRUE(p->begin_transaction(error)) << error;
    p->produce(recs.data(), recs.size());
    ASSERT_EQ(p->commit_transaction(30000, error), outbox::kafka::TxnOutcome::Committed) << error;
    EXPECT_EQ(acked(*p), (std::set<int64_t>{1}));
}
