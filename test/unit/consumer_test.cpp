// The inbox consumer against librdkafka's in-process mock cluster: records
// come whole, and offsets move only on commit().
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

using outbox::kafka::Consumer;

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
    s.client.brokers = c.bootstraps();
    s.group_id = "inbox-test";
    s.client.client_id = "inbox-test";
    s.topics = {"payments"};
    // The mock coordinator lets a new member in only when the old one's
    // session expires: keep it short (the default is 45 s).
    s.client.extra = "session.timeout.ms=6000;heartbeat.interval.ms=500";
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
            const outbox::kafka::InRecord &r = con.record(i);
            EXPECT_TRUE(r.has_value);
            EXPECT_TRUE(r.value_is_json);
            auto j = nlohmann::json::parse(r.value);
            got.insert(j.at("n").get<int64_t>());
            EXPECT_EQ(r.event_id, "01a23748-1bfd-7e6a-91ca-ce8739afb9df");
            EXPECT_TRUE(r.has_key);
            EXPECT_GT(r.timestamp, 1600000000000) << "the record's time, in ms";
            EXPECT_EQ(r.headers.size(), 1u);
            if (r.headers.empty()) continue;
            EXPECT_EQ(r.headers[0].first, "event_id");
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
