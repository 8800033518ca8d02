// The inbox's Kafka consumer: a librdkafka consumer group member that hands
// records to the inbox worker and commits offsets only when told to (after
// the Postgres commit that holds the rows).  Pure C++: no Postgres headers,
// no exceptions out of the API; callbacks only record what happened.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "outbox/kafka/producer.h"  // LogLevel, BrokerState

struct rd_kafka_s;
struct rd_kafka_queue_s;
struct rd_kafka_message_s;

namespace outbox::kafka {

struct ConsumerSettings {
    std::string brokers;
    std::string extra;  // outbox.kafka_config
    std::string group_id;
    std::string client_id;
    std::vector<std::string> topics;
};

// One consumed record, converted for outbox.inbox_message.
struct InRecord {
    std::string topic;
    int32_t partition = 0;
    int64_t offset = 0;
    std::string event_id;  // the event_id header when it is a UUID, else ""
    bool has_key = false;
    std::string key;           // valid UTF-8 (other bytes as \xNN)
    std::string payload_json;  // the value when it is JSON; else a JSON object, see below
    std::string headers_json;  // a JSON object of strings
};

// Converts a Kafka record's parts (pure; unit-tested):
//  - the value: kept when it is valid UTF-8 JSON; a missing value (a
//    tombstone) becomes JSON null; anything else {"raw_base64": "..."},
//    so that no record is ever dropped;
//  - key and header values: UTF-8 text, other bytes written as \xNN;
//  - the event_id header: taken when it is a UUID in text form.
std::string value_to_json(const void *data, std::size_t len, bool present);
std::string bytes_to_text(const void *data, std::size_t len);
bool is_uuid_text(const std::string &s);
std::string headers_to_json(const std::vector<std::pair<std::string, std::string>> &headers);

class Consumer {
public:
    // Subscribes to settings.topics in group settings.group_id, offsets
    // committed by commit() only, starting at the earliest offset when the
    // group has none.  Events (records, logs, errors) are signalled on
    // `wakeup_fd`.  nullptr and librdkafka's reason in `error` on failure.
    static std::unique_ptr<Consumer> create(const ConsumerSettings &settings, int wakeup_fd,
                                            std::string &error) noexcept;
    ~Consumer();
    Consumer(const Consumer &) = delete;
    Consumer &operator=(const Consumer &) = delete;

    // Takes up to `max` records that have arrived (never blocks) and
    // converts them; returns how many (see record()).  Errors and logs go to
    // the log lines.  The previous batch is forgotten.
    std::size_t poll_batch(std::size_t max) noexcept;
    std::size_t count() const noexcept { return records_.size(); }
    const InRecord &record(std::size_t i) const noexcept { return records_[i]; }

    // Commits, synchronously, the offsets after the records of the last
    // batch.  False with librdkafka's reason when the commit failed (the
    // records come again: the inbox drops them as duplicates).
    bool commit(std::string &error) noexcept;

    std::size_t log_count() const noexcept { return log_text_.size(); }
    LogLevel log_level(std::size_t i) const noexcept { return log_level_[i]; }
    const char *log_text(std::size_t i) const noexcept { return log_text_[i].c_str(); }
    void clear_log() noexcept;
    BrokerState broker_state() const noexcept { return state_; }
    const char *last_error() const noexcept { return last_error_.c_str(); }
    bool fatal() const noexcept { return fatal_; }

    // Leaves the group (bounded by librdkafka's own timeouts).
    void close() noexcept;

private:
    Consumer() = default;
    void add_log(LogLevel level, std::string text);
    void handle_error(int err, const std::string &reason);
    static void on_error(rd_kafka_s *rk, int err, const char *reason, void *opaque);
    static void on_log(const rd_kafka_s *rk, int level, const char *fac, const char *buf);

    rd_kafka_s *rk_ = nullptr;
    rd_kafka_queue_s *queue_ = nullptr;
    bool closed_ = false;
    std::vector<InRecord> records_;
    std::map<std::pair<std::string, int32_t>, int64_t> next_offsets_;  // of the last batch
    std::vector<LogLevel> log_level_;
    std::vector<std::string> log_text_;
    BrokerState state_ = BrokerState::Unknown;
    std::string last_error_;
    std::string last_logged_error_;
    bool fatal_ = false;
};

}  // namespace outbox::kafka
