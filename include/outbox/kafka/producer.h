// The relay's Kafka producer: one long-lived idempotent librdkafka producer
// per relay worker.  Pure C++: no Postgres headers, no exceptions out of the
// API.  librdkafka callbacks run only inside poll()/shutdown() on the
// caller's thread and only record what happened; the relay reads the
// records afterwards through plain accessors and does the Postgres work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "outbox/kafka/client.h"
#include "outbox/kafka/refusals.h"

struct rd_kafka_s;
struct rd_kafka_topic_s;
struct rd_kafka_queue_s;
struct rd_kafka_message_s;

namespace outbox::kafka {

struct Settings {
    ClientSettings client;
    std::size_t batch_size = 1000;
    // Non-empty: a transactional producer (outbox.delivery = exactly_once)
    // with this transactional.id; see the transaction calls below.
    std::string transactional_id;
};

// How a transaction ended (Producer::commit_transaction).
enum class TxnOutcome {
    Committed,  // Kafka committed every record of it
    Aborted,    // it was aborted: none of its records counts
    Unknown,    // Kafka did not say in time; the producer must be replaced
    Fenced,     // another producer took the transactional id
};

// One claimed outbox row, with pointers into the caller's memory.  Only
// read during produce(): librdkafka copies what it keeps.
struct Record {
    int64_t id;
    const char *topic;
    std::size_t topic_len;
    // What orders the row among its key's rows: "topic key" (a key's order
    // is per topic; the relay builds it from the row's topic and key
    // columns).  A (topic, key) has records of one batch at a time in
    // flight, and a refusal holds back its later records.  nullptr: a
    // record without a key, ordered by nothing.
    const char *order_key;
    std::size_t order_key_len;
    const char *key;  // the Kafka key's bytes; nullptr: no key
    std::size_t key_len;
    const char *value;  // the Kafka value's bytes; nullptr: none (a tombstone)
    std::size_t value_len;
    const char *headers;  // the headers as JSON object text (UTF-8)
    std::size_t headers_len;
    const char *event_id;  // message_id text, NUL-terminated
    int32_t partition;     // -1: the partitioner chooses (murmur2 of the key)
    // Set when the relay could not prepare the record (its payload could not
    // be rendered): it fails at once, for good, and is parked.
    const char *error;
};

class Producer {
public:
    // Creates the producer and routes librdkafka's main queue (delivery
    // reports, logs, errors) to `wakeup_fd`: a byte is written there when
    // something arrives, so the caller can sleep on it next to its latch.
    // Returns nullptr and librdkafka's reason in `error` when it fails.
    static std::unique_ptr<Producer> create(const Settings &settings, int wakeup_fd,
                                            std::string &error) noexcept;
    ~Producer();
    Producer(const Producer &) = delete;
    Producer &operator=(const Producer &) = delete;

    // Enqueues a batch, in order.  It waits only to ask the cluster whether
    // a topic it has not seen yet exists, at most `metadata_wait_ms` in all
    // for the batch (the relay gives it a share of outbox.batch_timeout, so
    // that a batch never holds its transaction longer); a topic the cluster
    // did not answer for in time goes to librdkafka as any other, and is not
    // asked about again for 30 s.  The caller must not
    // pass a record whose key is in flight (see in_flight_key()): a key has
    // records of one batch at a time in librdkafka.  A record librdkafka
    // refuses at once (too large, bad headers, unknown topic) is a failure
    // right away, and every later record of the same key in this batch is
    // held back: neither produced nor failed, it stays pending so that the
    // key's order is kept.  When librdkafka's queue is full, that record and
    // the rest of the batch are held back the same way.
    void produce(const Record *records, std::size_t n, int metadata_wait_ms = 5000) noexcept;

    // Serves delivery reports, logs and errors that have arrived.  Never blocks.
    void poll() noexcept;

    // Records produced whose delivery report has not arrived yet: of every
    // batch, and of the last produce() call only.
    std::size_t in_flight() const noexcept { return in_flight_; }
    std::size_t batch_in_flight() const noexcept;

    // The distinct keys of the records in flight, for the claim to skip:
    // snapshot_in_flight_keys() takes the list, in_flight_key() reads it.
    std::size_t snapshot_in_flight_keys() noexcept;
    // Valid until the next call of poll(), produce() or shutdown().
    std::string_view in_flight_key(std::size_t i) const noexcept { return key_snapshot_[i]; }

    // Outcomes since the last clear_resolved().  Acknowledgements come in
    // two lists: of the last produce() call's records (the caller still
    // holds their rows) and of earlier batches' (late).  Each one is where
    // Kafka wrote the record: its partition and offset.  A report of
    // success without an offset (or a broker) is no acknowledgement: it is
    // a failure that is not a refusal (the row goes again), and so is every
    // later record of its key in that batch (docs/delivery.md).
    std::size_t acked_count() const noexcept { return acked_.size() + acked_late_.size(); }
    std::size_t batch_acked_count() const noexcept { return acked_.size(); }
    const int64_t *batch_acked_ids() const noexcept { return acked_.ids.data(); }
    const int32_t *batch_acked_partitions() const noexcept { return acked_.partitions.data(); }
    const int64_t *batch_acked_offsets() const noexcept { return acked_.offsets.data(); }
    std::size_t late_acked_count() const noexcept { return acked_late_.size(); }
    const int64_t *late_acked_ids() const noexcept { return acked_late_.ids.data(); }
    const int32_t *late_acked_partitions() const noexcept { return acked_late_.partitions.data(); }
    const int64_t *late_acked_offsets() const noexcept { return acked_late_.offsets.data(); }
    std::size_t failed_count() const noexcept { return failed_ids_.size(); }
    const int64_t *failed_ids() const noexcept { return failed_ids_.data(); }
    const char *failed_error(std::size_t i) const noexcept { return failed_errors_[i].c_str(); }
    bool failed_permanent(std::size_t i) const noexcept { return failed_permanent_[i] != 0; }
    // Refused before it reached librdkafka (Record::error): park it now.
    bool failed_park_now(std::size_t i) const noexcept { return failed_park_now_[i] != 0; }
    std::size_t held_count() const noexcept { return held_; }
    void clear_resolved() noexcept;

    // Lines for the server log: connection state changes, delivery errors
    // (once per distinct error, not per message) and librdkafka's own log.
    const LogBuffer &log() const noexcept { return log_; }
    void clear_log() noexcept { log_.clear(); }

    BrokerState broker_state() const noexcept { return state_; }
    // The last error librdkafka reported (connection or delivery), or "".
    const char *last_error() const noexcept { return last_error_.c_str(); }
    // librdkafka raised a fatal error: this producer must be replaced.
    bool fatal() const noexcept { return fatal_; }

    // Waits up to timeout_ms for what is in flight, then abandons the rest:
    // abandoned records are neither acked nor failed (their rows stay
    // pending and will be sent again).
    void shutdown(int timeout_ms) noexcept;

    // ---- a transactional producer (Settings::transactional_id) ----
    // Registers the transactional id with its coordinator, which fences
    // every earlier producer of that id and ends its open transaction (a
    // commit it had asked for completes first).  False with the reason;
    // `fenced` when another producer took the id meanwhile.  Once it has
    // succeeded, later calls succeed at once (the registration holds).
    bool init_transactions(int timeout_ms, std::string &error, bool &fenced) noexcept;
    bool begin_transaction(std::string &error) noexcept;
    // The ids of the records produce() handed to librdkafka in this
    // transaction.
    const std::vector<int64_t> &transaction_ids() const noexcept { return txn_ids_; }
    // The sum of progress::row_digest() of those rows (their progress
    // record carries it).
    uint64_t transaction_digest() const noexcept { return txn_digest_; }
    // Adds the transaction's progress record (not a row of the outbox).
    bool produce_progress(const std::string &topic, const std::string &key,
                          const std::string &value, std::string &error) noexcept;
    // Waits up to timeout_ms for the delivery report of every record of
    // the open transaction, the progress record's included.  True when each
    // was acknowledged with an offset: the acknowledged list is then exactly
    // transaction_ids(), with their partitions and offsets.  False, with the
    // reason, when one was refused (it is in the failed list), came back
    // without an offset, or did not come back in time: the transaction must
    // be aborted.
    bool await_transaction(int timeout_ms, std::string &error) noexcept;
    // After await_transaction() failed: charges the records that caused it
    // (refused, or of a topic Kafka would not add), aborts, and says
    // Aborted even when librdkafka cannot abort (the producer is then
    // fatal(): replace it).  Kafka was never asked to commit.
    TxnOutcome abort_unacknowledged(int timeout_ms, std::string &error) noexcept;
    // Commits (await_transaction() first).  Committed: the acknowledged
    // list is exactly transaction_ids(), each with its offset.  Aborted:
    // nothing is acknowledged, records Kafka refused are in the failed
    // list.  Unknown and Fenced: nothing is acknowledged; replace the
    // producer.  `error` says why when not Committed.
    TxnOutcome commit_transaction(int timeout_ms, std::string &error) noexcept;
    // After a commit whose rows the caller marked already: the
    // acknowledged list emptied (refusals stay).
    void forget_batch_acked() noexcept { acked_.clear(); }
    // Aborts the open transaction (when the batch cannot be committed).
    TxnOutcome abort_transaction(int timeout_ms, std::string &error) noexcept;
    bool transactional() const noexcept { return transactional_; }
    bool fenced() const noexcept { return fenced_; }

    // Refusals in a transaction (docs/exactly-once.md, "What a refusal
    // costs").  Kafka may refuse a record at any step: its delivery report
    // (a record too large), adding its partition to the transaction (a
    // topic not authorised, an internal topic: librdkafka names the topic
    // only in its log, and 2.0.2 then fails the abort fatally), or the
    // commit.  A failed commit charges, as failures of the records that
    // caused it: the refused records; else the records of the topics Kafka
    // would not add; else, when the transaction held records of one topic
    // only, all of them.  What cannot be charged so is "unattributed" (see
    // last_txn_unattributed()).  `memory` (owned by the caller, may be
    // null) is told each refusal and refuses at produce() the records it
    // would refuse again, as failures with the remembered reason.
    void set_refusals(TopicRefusals *memory) noexcept { refusals_ = memory; }
    // The last failed transaction's failure was charged to no record:
    // these are its topics (the caller may try them one per transaction).
    bool last_txn_unattributed() const noexcept { return last_txn_unattributed_; }
    const std::vector<std::string> &last_txn_topics() const noexcept { return last_txn_topics_; }

    // The secrets (outbox.kafka_config_file) this producer was built with.
    const std::vector<Property> &secrets() const noexcept { return secrets_; }

private:
    Producer() = default;
    rd_kafka_topic_s *topic_handle(std::string_view name);
    void produce_one(const Record &r);
    void fail(int64_t id, std::string error, bool permanent, bool park_now = false);
    void set_state(BrokerState s, const std::string &reason);

    static void on_delivery(rd_kafka_s *rk, const rd_kafka_message_s *msg, void *opaque);
    static void on_error(rd_kafka_s *rk, int err, const char *reason, void *opaque);
    static void on_log(const rd_kafka_s *rk, int level, const char *fac, const char *buf);
    void delivered(const rd_kafka_message_s *msg);
    void errored(rd_kafka_s *rk, int err, const char *reason);
    void logged(int level, const char *fac, const char *buf);

    rd_kafka_s *rk_ = nullptr;
    rd_kafka_queue_s *main_queue_ = nullptr;
    std::vector<Property> secrets_;
    std::vector<std::pair<std::string, rd_kafka_topic_s *>> topics_;
    std::unordered_map<std::string, std::size_t> topic_index_;  // name -> index into topics_
    std::size_t last_topic_ = 0;

    // Records in flight, batch by batch.  A record's librdkafka opaque is
    // (batch generation << 32 | slot index); each batch keeps its keys in
    // one string (no allocation per record) until all its records are
    // reported.  Oldest batch first; usually just the current one.
    struct Slot {
        int64_t id;
        uint32_t key_offset;
        uint32_t key_length;
        bool keyed;  // has an order key (keyless records order nothing)
        bool pending;
    };
    struct Batch {
        uint32_t generation = 0;
        std::string keys;
        std::vector<Slot> slots;
        std::size_t pending = 0;
        // Keys of this batch with a record reported delivered without an
        // offset: their later records are not taken as delivered either.
        std::unordered_set<std::string> doubted;
    };
    std::deque<Batch> batches_;
    uint32_t generation_ = 0;
    std::size_t in_flight_ = 0;
    std::vector<std::string_view> key_snapshot_;
    Slot *find_slot(void *opaque, Batch **batch);
    std::unordered_set<std::string> held_keys_;  // this batch's keys behind a failure
    // The partition each key of this batch went to (-1: the partitioner's).
    // Kafka orders a key's records only within one partition: a later
    // record bound elsewhere waits for the next batch, so that a refusal
    // that comes back late (a partition the topic lacks) cannot be
    // overtaken.
    std::unordered_map<std::string, int32_t> key_partitions_;
    bool any_explicit_partition_ = false;  // in this batch: else no key can differ
    bool queue_full_ = false;                    // librdkafka refused this batch's rest

    struct AckList {
        std::vector<int64_t> ids;
        std::vector<int32_t> partitions;
        std::vector<int64_t> offsets;
        std::size_t size() const noexcept { return ids.size(); }
        bool empty() const noexcept { return ids.empty(); }
        void clear() noexcept {
            ids.clear();
            partitions.clear();
            offsets.clear();
        }
        void push(int64_t id, int32_t partition, int64_t offset) {
            ids.push_back(id);
            partitions.push_back(partition);
            offsets.push_back(offset);
        }
        void append(const AckList &o) {
            ids.insert(ids.end(), o.ids.begin(), o.ids.end());
            partitions.insert(partitions.end(), o.partitions.begin(), o.partitions.end());
            offsets.insert(offsets.end(), o.offsets.begin(), o.offsets.end());
        }
        bool remove(int64_t id) noexcept;
    };
    AckList acked_;       // of the current batch
    AckList acked_late_;  // of earlier batches
    void not_delivered(Batch *batch, const Slot *slot, int64_t id, const std::string &why);
    void outcome(const rd_kafka_message_s *msg, Batch *batch, const Slot *slot, int64_t id,
                 bool this_batch);
    std::vector<int64_t> failed_ids_;
    std::vector<std::string> failed_errors_;
    std::vector<char> failed_permanent_;
    std::vector<char> failed_park_now_;
    std::size_t held_ = 0;

    LogBuffer log_;

    BrokerState state_ = BrokerState::Unknown;
    std::string last_error_;
    std::string last_logged_delivery_error_;
    bool fatal_ = false;
    bool fenced_ = false;
    bool registered_ = false;  // init_transactions() succeeded
    bool transactional_ = false;
    std::vector<int64_t> txn_ids_;      // produced in the open transaction
    std::vector<uint32_t> txn_topic_;   // and their topics (indexes into topics_)
    // Topics whose partitions Kafka would not add to the open transaction,
    // with its reason (librdkafka's ADDPARTS log lines).
    std::unordered_map<std::string, std::string> txn_refused_topics_;
    std::size_t txn_dr_failures_ = 0;   // refusals in delivery reports of it
    bool awaited_timed_out_ = false;    // await_transaction() ran out of time
    bool last_txn_unattributed_ = false;
    std::vector<std::string> last_txn_topics_;
    TopicRefusals *refusals_ = nullptr;
    void remember_refusal(const rd_kafka_message_s *msg, const std::string &text);
    // Kafka refuses a record batch whole when it is larger than the topic
    // allows (MSG_SIZE_TOO_LARGE): every record of the request is reported
    // refused, though only the largest may be at fault.  Such reports wait
    // here until the poll that served them ends (a request's reports come in
    // one poll); then, per topic and partition, the largest is refused (and,
    // exactly once, remembered by its size) and the others fail for a
    // passing reason: they go again, without it, and are never parked for it.
    struct SizeRefused {
        int64_t id;
        std::string topic;
        int32_t partition;
        std::size_t bytes;
        std::string text;
    };
    std::vector<SizeRefused> size_refused_;
    void settle_size_refusals();
    void serve(int timeout_ms);  // rd_kafka_poll(), then settle_size_refusals()
    void serve_flush(int timeout_ms);  // rd_kafka_flush(), the same
    // A failed commit: charges what caused it (see set_refusals()).
    void charge_failed_transaction(int code, const std::string &error);
    uint64_t txn_digest_ = 0;           // and what they were
    // Topics the brokers said exist (topic_known_, by index into topics_:
    // for the producer's life) and those they said do not (in this batch);
    // when they could not say, no topic is asked about until then.  A
    // record for a topic that does not exist would wait in librdkafka up to
    // topic.metadata.propagation.max.ms (auto-create off), past a
    // transaction's timeout and holding the relay's in-flight room: it is
    // refused at once instead.
    std::vector<char> topic_known_;
    std::unordered_set<std::string> topics_absent_;
    std::unordered_set<std::string> topics_asked_;  // this batch, no clear answer
    std::chrono::steady_clock::time_point metadata_unsure_until_{};
    std::chrono::steady_clock::time_point metadata_deadline_{};  // this batch's asks end by then
    bool topic_exists(std::size_t index, rd_kafka_topic_s *rkt);
    std::string progress_error_;        // the progress record's delivery error
    bool progress_produced_ = false;    // this transaction has a progress record
    bool progress_acked_ = false;       // acknowledged with an offset
    void end_transaction_bookkeeping() noexcept;
    TxnOutcome abort_never_committed(int timeout_ms, std::string &error);
};

// Whether librdkafka error `err` means Kafka refuses the record for good
// (counts toward parking) rather than a passing condition.
bool is_permanent_error(int err) noexcept;

}  // namespace outbox::kafka
