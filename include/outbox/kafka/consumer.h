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

#include "outbox/kafka/client.h"

struct rd_kafka_s;
struct rd_kafka_queue_s;
struct rd_kafka_message_s;

namespace outbox::kafka {

struct ConsumerSettings {
    ClientSettings client;
    std::string group_id;
    std::vector<std::string> topics;
};

// One consumed record, as Kafka has it.  The inbox keeps these bytes as they
// are and derives text and JSON from them (the Postgres side converts into
// the database's encoding).
struct InRecord {
    std::string topic;
    int32_t partition = 0;
    int64_t offset = 0;
    int64_t timestamp = -1;  // ms since the epoch; -1: none
    std::string event_id;    // the event_id header when it is a UUID, else ""
    bool has_key = false;
    std::string key;  // the key's bytes
    bool has_value = false;
    std::string value;           // the value's bytes (none: a tombstone)
    bool value_is_json = false;  // valid UTF-8 JSON
    std::vector<std::pair<std::string, std::string>> headers;  // raw names and values, in order
    std::vector<bool> header_has_value;  // per header: false when Kafka carried no value
    // Why the (last) event_id header could not be the record's id, in our
    // own words (never its bytes); "" when it could, or when there is none.
    std::string event_id_note;
    std::size_t bytes = 0;  // key, value and headers: what the record holds
};

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
    // converts them, stopping once they hold `max_bytes` (key, value and
    // headers; the first always comes, so a batch holds at most `max_bytes`
    // and one record more); returns how many (see record()).  Errors and
    // logs go to the log lines.  The previous batch is forgotten.
    std::size_t poll_batch(std::size_t max, std::size_t max_bytes = SIZE_MAX) noexcept;
    std::size_t count() const noexcept { return records_.size(); }
    const InRecord &record(std::size_t i) const noexcept { return records_[i]; }

    // Commits the offsets after the records of the last batch, without
    // waiting (the rows are committed in Postgres already: a commit that
    // fails only makes the records come again, and the inbox drops them as
    // duplicates).  Its result arrives through poll_batch(): a failure goes
    // to the log lines and last_error().  False when it could not even be
    // sent, with librdkafka's reason.
    bool commit(std::string &error) noexcept;

    const LogBuffer &log() const noexcept { return log_; }
    void clear_log() noexcept { log_.clear(); }
    BrokerState broker_state() const noexcept { return state_; }
    const char *last_error() const noexcept { return last_error_.c_str(); }
    bool fatal() const noexcept { return fatal_; }

    // The result of an offset commit (called from librdkafka's callback,
    // inside poll_batch()).
    void note_commit_result(int err) noexcept;

    // Makes the records of the last batch come again: each of its
    // partitions is sought back to the batch's first record there (the
    // batch was not stored).  False with librdkafka's reason when a seek
    // failed.
    bool rewind(std::string &error) noexcept;

    // Leaves the group (bounded by librdkafka's own timeouts).
    void close() noexcept;

    // The secrets (outbox.kafka_config_file) this consumer was built with.
    const std::vector<Property> &secrets() const noexcept { return secrets_; }

private:
    Consumer() = default;
    void handle_error(int err, const std::string &reason);
    static void on_error(rd_kafka_s *rk, int err, const char *reason, void *opaque);
    static void on_log(const rd_kafka_s *rk, int level, const char *fac, const char *buf);
    bool take(rd_kafka_message_s *m);

    rd_kafka_s *rk_ = nullptr;
    rd_kafka_queue_s *queue_ = nullptr;
    bool closed_ = false;
    std::vector<InRecord> records_;
    std::map<std::pair<std::string, int32_t>, int64_t> next_offsets_;   // of the last batch
    std::map<std::pair<std::string, int32_t>, int64_t> first_offsets_;  // of the last batch
    std::size_t batch_bytes_ = 0;                                       // of the last batch
    LogBuffer log_;
    BrokerState state_ = BrokerState::Unknown;
    std::string last_error_;
    std::vector<Property> secrets_;
    std::string last_logged_error_;
    bool fatal_ = false;
};

}  // namespace outbox::kafka
