// The inbox consumer: record conversion (pure) and the consumer against
// librdkafka's in-process mock cluster (offsets move only on commit()).
#include "outbox/kafka/consumer.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>

using outbox::kafka::bytes_to_text;
using outbox::kafka::Consumer;
using outbox::kafka::headers_to_json;
using outbox::kafka::is_uuid_text;
using outbox::kafka::value_to_json;

TEST(InboxConversion, JsonValuesAreKept) {
    std::string v = R"({"amount": 10, "who": "ü"})";
    EXPECT_EQ(value_to_json(v.data(), v.size(), true), v);
    std::string arr = "[1,2]";
    EXPECT_EQ(value_to_json(arr.data(), arr.size(), true), arr);
}

TEST(InboxConversion, TombstoneIsNull) { EXPECT_EQ(value_to_json(nullptr, 0, false), "null"); }

TEST(InboxConversion, AnythingElseIsKeptAsBase64) {
    std::string text = "not json";
    auto j = nlohmann::json::parse(value_to_json(text.data(), text.size(), true));
    EXPECT_EQ(j.at("raw_base64"), "bm90IGpzb24=");
    const unsigned char bin[] = {0xff, 0x00, 0x01};
    j = nlohmann::json::parse(value_to_json(bin, sizeof bin, true));
    EXPECT_EQ(j.at("raw_base64"), "/wAB");
    std::string empty;
    j = nlohmann::json::parse(value_to_json(empty.data(), 0, true));
    EXPECT_EQ(j.at("raw_base64"), "");
}

TEST(InboxConversion, BytesBecomeTextWithEscapes) {
    EXPECT_EQ(bytes_to_text("order-1", 7), "order-1");
    EXPECT_EQ(bytes_to_text("\xc3\xbc", 2), "\xc3\xbc");
    EXPECT_EQ(bytes_to_text("a\xff" "b", 3), "a\\xffb");
    EXPECT_EQ(bytes_to_text(std::string("a\0b", 3).data(), 3), "a\\x00b");
    EXPECT_EQ(bytes_to_text("\xed\xa0\x80", 3), "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
}

TEST(InboxConversion, UuidText) {
    EXPECT_TRUE(is_uuid_text("01a23748-1bfd-7e6a-91ca-ce8739afb9df"));
    EXPECT_TRUE(is_uuid_text("01A23748-1BFD-7E6A-91CA-CE8739AFB9DF"));
    EXPECT_FALSE(is_uuid_text("01a237481bfd7e6a91cace8739afb9df"));
    EXPECT_FALSE(is_uuid_text("not-a-uuid"));
    EXPECT_FALSE(is_uuid_text("01a23748-1bfd-7e6a-91ca-ce8739afb9dg"));
}

TEST(InboxConversion, HeadersBecomeAnObjectOfStrings) {
    auto j = nlohmann::json::parse(headers_to_json({{"event_id", "x"}, {"t", "a\"b"}, {"t", "last"}}));
    EXPECT_EQ(j.size(), 2u);
    EXPECT_EQ(j.at("event_id"), "x");
    EXPECT_EQ(j.at("t"), "last");
    EXPECT_EQ(headers_to_json({}), "{}");
}

namespace {

struct Cluster {
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mc;
    Cluster() {
        char err[256];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
        mc = rd_kafka_mock_cluster_new(rk, 1);
        rd_kafka_mock_topic_create(mc, "payments", 2, 1);
    }
    ~Cluster() {
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
    }
    std::string bootstraps() { return rd_kafka_mock_cluster_bootstraps(mc); }
    void produce(int n, int start) {
        char err[256];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps().c_str(), err, sizeof err);
        rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
        for (int i = start; i < start + n; i++) {
            std::string key = "k" + std::to_string(i % 5), value = "{\"n\": " + std::to_string(i) + "}";
            rd_kafka_producev(p, RD_KAFKA_V_TOPIC("payments"), RD_KAFKA_V_KEY(key.data(), key.size()),
                              RD_KAFKA_V_VALUE(value.data(), value.size()),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_HEADER("event_id", "01a23748-1bfd-7e6a-91ca-ce8739afb9df", -1),
                              RD_KAFKA_V_END);
        }
        rd_kafka_flush(p, 10000);
        rd_kafka_destroy(p);
    }
};

std::unique_ptr<Consumer> consumer(Cluster &c, int fd) {
    outbox::kafka::ConsumerSettings s;
    s.brokers = c.bootstraps();
    s.group_id = "inbox-test";
    s.client_id = "inbox-test";
    s.topics = {"payments"};
    // The mock coordinator lets a new member in only when the old one's
    // session expires: keep it short (the default is 45 s).
    s.extra = "session.timeout.ms=6000;heartbeat.interval.ms=500";
    std::string error;
    auto con = Consumer::create(s, fd, error);
    EXPECT_TRUE(con) << error;
    return con;
}

// Reads until `n` records are taken (committing or not), or 20 s.
std::set<int64_t> take(Consumer &con, std::size_t n, bool commit) {
    std::set<int64_t> got;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (got.size() < n && std::chrono::steady_clock::now() < until) {
        std::size_t k = con.poll_batch(100);
        for (std::size_t i = 0; i < k; i++) {
            auto j = nlohmann::json::parse(con.record(i).payload_json);
            got.insert(j.at("n").get<int64_t>());
            EXPECT_EQ(con.record(i).event_id, "01a23748-1bfd-7e6a-91ca-ce8739afb9df");
            EXPECT_TRUE(con.record(i).has_key);
        }
        if (k && commit) {
            std::string error;
            EXPECT_TRUE(con.commit(error)) << error;
        }
        if (!k) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return got;
}

}  // namespace

TEST(InboxConsumer, OffsetsMoveOnlyOnCommit) {
    Cluster cluster;
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    cluster.produce(50, 0);
    {
        auto con = consumer(cluster, fds[1]);
        EXPECT_EQ(take(*con, 50, /*commit=*/false).size(), 50u);
        con->close();
    }
    // Nothing committed: a new member of the group reads all 50 again.
    {
        auto con = consumer(cluster, fds[1]);
        EXPECT_EQ(take(*con, 50, /*commit=*/true).size(), 50u);
        con->close();
    }
    // Committed: the next member reads only what is new.
    cluster.produce(10, 50);
    {
        auto con = consumer(cluster, fds[1]);
        auto got = take(*con, 10, true);
        EXPECT_EQ(got.size(), 10u);
        EXPECT_EQ(*got.begin(), 50);
        con->close();
    }
    close(fds[0]);
    close(fds[1]);
}
