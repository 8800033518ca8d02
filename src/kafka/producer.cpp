#include "outbox/pure_tu.h"
#include "outbox/kafka/producer.h"

#include "outbox/common/progress.h"
#include "outbox/json/headers.h"
#include "outbox/kafka/config.h"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace outbox::kafka {

namespace {

static_assert(sizeof(void *) >= sizeof(uint64_t), "opaques carry (generation, slot)");

// The progress record's opaque: generation 0, which no batch has.
void *const kProgressOpaque = reinterpret_cast<void *>(uintptr_t{1});

void *slot_opaque(uint32_t generation, std::size_t index) {
    return reinterpret_cast<void *>((static_cast<uintptr_t>(generation) << 32) | index);
}

}  // namespace

bool is_permanent_error(int err) noexcept {
    switch (static_cast<rd_kafka_resp_err_t>(err)) {
        case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_INVALID_RECORD:
        case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
        case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
        case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
        case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
        case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
        case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
        case RD_KAFKA_RESP_ERR__INVALID_ARG:
        case RD_KAFKA_RESP_ERR__BAD_MSG:
            return true;
        default:
            return false;
    }
}

std::unique_ptr<Producer> Producer::create(const Settings &settings, int wakeup_fd,
                                           std::string &error) noexcept {
    try {
        std::unique_ptr<Producer> p(new Producer());
        p->secrets_ = settings.client.secrets;
        // Room for every batch the relay lets be in flight (it stops claiming
        // beyond kMaxBatchesInFlight of them), so QUEUE_FULL means an outage.
        std::size_t queue_messages = std::max<std::size_t>(100000, 5 * settings.batch_size);
        // Defaults that carry the delivery guarantees; outbox.kafka_config
        // may tune the rest (and check_properties() refuses changing these).
        std::vector<Property> own = {
            {"enable.idempotence", "true"},
            {"acks", "all"},
            {"partitioner", "murmur2_random"},
            // Send at once: a relay batch is produced in one go, so records
            // gather in requests while earlier ones are in flight anyway
            // (commit-to-consumer p50 2 ms instead of 5 ms at 1,000 msg/s).
            {"linger.ms", "0"},
            // Never give up on a record for a passing condition: an outage of
            // any length only delays it, and a timed-out record could be
            // overtaken by the next one of its key.  Refusals still fail.
            {"message.timeout.ms", "0"},
            {"queue.buffering.max.messages", std::to_string(queue_messages)},
        };
        if (!settings.transactional_id.empty()) {
            // A transaction ends within transaction.timeout.ms (librdkafka
            // derives message.timeout.ms from it): no unbounded records.
            own.erase(std::remove_if(own.begin(), own.end(),
                                     [](const Property &q) { return q.name == "message.timeout.ms"; }),
                      own.end());
            own.push_back({"transactional.id", settings.transactional_id});
            p->transactional_ = true;
        }
        ConfPtr conf = new_client_conf(Role::Producer, settings.client, own,
                                       {p.get(), &Producer::on_error, &Producer::on_log}, error);
        if (!conf) return nullptr;
        rd_kafka_conf_set_dr_msg_cb(conf.get(), &Producer::on_delivery);

        char errstr[512];
        p->rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr);
        if (!p->rk_) {
            error = errstr;
            return nullptr;  // conf is still ours: ConfPtr destroys it
        }
        conf.release();  // rd_kafka_new took it

        // Logs go to the main queue too, so that every callback runs inside
        // poll() on our thread.
        rd_kafka_set_log_queue(p->rk_, nullptr);
        p->main_queue_ = rd_kafka_queue_get_main(p->rk_);
        static const char kWake = 'k';
        rd_kafka_queue_io_event_enable(p->main_queue_, wakeup_fd, &kWake, 1);
        return p;
    } catch (const std::exception &e) {
        error = e.what();
        return nullptr;
    }
}

Producer::~Producer() {
    if (main_queue_) {
        rd_kafka_queue_io_event_enable(main_queue_, -1, nullptr, 0);
        rd_kafka_queue_destroy(main_queue_);
    }
    for (auto &t : topics_) rd_kafka_topic_destroy(t.second);
    if (rk_) {
        // Whatever is still queued is abandoned, never reported as acked.
        rd_kafka_purge(rk_, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_destroy(rk_);
    }
}

rd_kafka_topic_s *Producer::topic_handle(std::string_view name) {
    if (last_topic_ < topics_.size() && topics_[last_topic_].first == name)
        return topics_[last_topic_].second;
    // A few topics (the usual case): compared in place, no allocation on
    // the relay's hot path; many (one per role, or an attacker's): the map.
    if (topics_.size() <= 16) {
        for (std::size_t i = 0; i < topics_.size(); ++i)
            if (topics_[i].first == name) {
                last_topic_ = i;
                return topics_[i].second;
            }
    }
    std::string owned(name);
    auto at = topics_.size() > 16 ? topic_index_.find(owned) : topic_index_.end();
    if (at != topic_index_.end()) {
        last_topic_ = at->second;
        return topics_[at->second].second;
    }
    // Room first: the three stay the same length whatever throws.
    topics_.reserve(topics_.size() + 1);
    topic_known_.reserve(topics_.size() + 1);
    topic_index_.reserve(topics_.size() + 1);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk_, owned.c_str(), nullptr);
    if (!rkt) return nullptr;
    topic_index_.emplace(owned, topics_.size());
    topics_.emplace_back(std::move(owned), rkt);
    topic_known_.push_back(0);
    last_topic_ = topics_.size() - 1;
    return rkt;
}

void Producer::fail(int64_t id, std::string error, bool permanent, bool park_now) {
    last_error_ = error;
    failed_ids_.push_back(id);
    failed_errors_.push_back(std::move(error));
    failed_permanent_.push_back(permanent ? 1 : 0);
    failed_park_now_.push_back(park_now ? 1 : 0);
}

void Producer::set_state(BrokerState s, const std::string &reason) {
    if (s == state_) return;
    BrokerState before = state_;
    state_ = s;
    if (s == BrokerState::Down)
        log_.add(LogLevel::Warning, "cannot reach Kafka, messages stay pending: " + reason);
    else if (s == BrokerState::Up && before == BrokerState::Down)
        log_.add(LogLevel::Info, "Kafka is reachable again: " + reason);
}

std::size_t Producer::batch_in_flight() const noexcept {
    return !batches_.empty() && batches_.back().generation == generation_ ? batches_.back().pending
                                                                           : 0;
}

Producer::Slot *Producer::find_slot(void *opaque, Batch **batch) {
    auto packed = reinterpret_cast<uintptr_t>(opaque);
    auto generation = static_cast<uint32_t>(packed >> 32);
    auto index = static_cast<std::size_t>(packed & 0xffffffffu);
    for (Batch &b : batches_) {
        if (b.generation != generation) continue;
        if (index >= b.slots.size() || !b.slots[index].pending) return nullptr;
        *batch = &b;
        return &b.slots[index];
    }
    return nullptr;  // abandoned by shutdown()
}

std::size_t Producer::snapshot_in_flight_keys() noexcept {
    try {
        key_snapshot_.clear();
        if (in_flight_ == 0) return 0;
        std::unordered_set<std::string_view> seen;
        for (const Batch &b : batches_)
            for (const Slot &s : b.slots)
                if (s.pending && s.keyed) {
                    std::string_view k(b.keys.data() + s.key_offset, s.key_length);
                    if (seen.insert(k).second) key_snapshot_.push_back(k);
                }
        return key_snapshot_.size();
    } catch (...) {
        key_snapshot_.clear();
        return 0;
    }
}

// The record's headers: the row's object, plus event_id = message_id unless
// set; nullptr with the reason when the row's headers cannot be read.
namespace {
rd_kafka_headers_t *kafka_headers(const Record &r, std::string &error) {
    std::string_view hjson(r.headers, r.headers_len);
    std::vector<json::Header> decoded;
    if (hjson != "{}" && !json::decode_headers(hjson, decoded, error)) return nullptr;
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(decoded.size() + 1);
    for (const json::Header &h : decoded)
        rd_kafka_header_add(hdrs, h.name.data(), static_cast<ssize_t>(h.name.size()),
                            h.value.data(), static_cast<ssize_t>(h.value.size()));
    if (!json::has_header(decoded, "event_id"))
        rd_kafka_header_add(hdrs, "event_id", 8, r.event_id, -1);
    return hdrs;
}

// librdkafka's reason for refusing a record at once, with its sizes (never
// its bytes).
std::string refusal_text(rd_kafka_resp_err_t err, const Record &r) {
    std::string text = std::string(rd_kafka_err2str(err)) + " (" +
                       std::to_string(r.value ? r.value_len : 0) + " byte value";
    if (r.headers_len > 2) text += ", " + std::to_string(r.headers_len) + " bytes of headers";
    return text + ")";
}
}  // namespace

void Producer::produce_one(const Record &r) {
    std::string_view order_key(r.order_key ? r.order_key : "", r.order_key ? r.order_key_len : 0);
    auto hold = [&] {
        if (r.order_key) held_keys_.emplace(order_key);
    };
    if (queue_full_ ||
        (r.order_key && !held_keys_.empty() && held_keys_.count(std::string(order_key)))) {
        ++held_;
        return;
    }
    if (r.order_key && any_explicit_partition_) {
        auto [at, first] = key_partitions_.emplace(order_key, r.partition);
        if (!first && at->second != r.partition) {
            ++held_;
            hold();
            return;
        }
    }
    if (r.error) {
        fail(r.id, r.error, true, true);
        hold();
        return;
    }

    std::string error;
    rd_kafka_headers_t *hdrs = kafka_headers(r, error);
    if (!hdrs) {
        fail(r.id, error, true);
        hold();
        return;
    }

    rd_kafka_topic_t *rkt = topic_handle(std::string_view(r.topic, r.topic_len));
    if (!rkt) {
        rd_kafka_headers_destroy(hdrs);
        fail(r.id, rd_kafka_err2str(rd_kafka_last_error()), true);
        hold();
        return;
    }
    auto topic_index = static_cast<uint32_t>(last_topic_);
    // Refused lately: not produced (nor, exactly once, put into a
    // transaction) before its retry time, charged with Kafka's remembered
    // reason.  Another role's refused records never take the relay's
    // in-flight room or the batch's wait.
    if (refusals_ && !refusals_->empty()) {
        std::string remembered;
        if (refusals_->refused(std::string_view(r.topic, r.topic_len), r.key != nullptr,
                               (r.value ? r.value_len : 0) + (r.key ? r.key_len : 0) +
                                   (r.headers_len > 2 ? r.headers_len : 0),
                               remembered)) {
            rd_kafka_headers_destroy(hdrs);
            fail(r.id, std::move(remembered), true);
            hold();
            return;
        }
    }
    // A topic the cluster does not have (auto-create off): librdkafka would
    // keep its records up to topic.metadata.propagation.max.ms (30 s),
    // holding the relay's in-flight room and the batch's wait for everyone.
    // Refused at once instead, and remembered, so that the cluster is asked
    // again only when the memory runs out (1 s, doubling up to 60 s).
    if (!topic_known_[topic_index] && !topic_exists(topic_index, rkt)) {
        rd_kafka_headers_destroy(hdrs);
        std::string reason = refusal_text(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, r);
        if (refusals_)
            refusals_->note(std::string_view(r.topic, r.topic_len), TopicRefusals::Scope::Topic, 0,
                            std::string(rd_kafka_err2str(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)));
        fail(r.id, std::move(reason), true);
        hold();
        return;
    }

    // Register the slot first: the delivery report may be served by the
    // rd_kafka_poll() below, before producev's caller sees the result.
    Batch &batch = batches_.back();
    std::size_t index = batch.slots.size();
    batch.slots.push_back(Slot{r.id, static_cast<uint32_t>(batch.keys.size()),
                               static_cast<uint32_t>(order_key.size()), r.order_key != nullptr,
                               true});
    batch.keys.append(order_key.data(), order_key.size());
    ++batch.pending;
    ++in_flight_;
    {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            rk_, RD_KAFKA_V_RKT(rkt),
            RD_KAFKA_V_PARTITION(r.partition >= 0 ? r.partition : RD_KAFKA_PARTITION_UA),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_VALUE(const_cast<char *>(r.value), r.value ? r.value_len : 0),
            RD_KAFKA_V_KEY(r.key, r.key ? r.key_len : 0), RD_KAFKA_V_HEADERS(hdrs),
            RD_KAFKA_V_OPAQUE(slot_opaque(generation_, index)), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {  // librdkafka owns hdrs now
            if (transactional_) {
                txn_ids_.push_back(r.id);
                txn_topic_.push_back(topic_index);
                txn_digest_ += progress::row_digest(r.id, r.event_id ? r.event_id : "");
            }
            return;
        }
        rd_kafka_headers_destroy(hdrs);
        batches_.back().slots[index].pending = false;
        --batches_.back().pending;
        --in_flight_;
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            // librdkafka's queue is full (Kafka is slow or away): never wait
            // for room inside the relay's transaction.  This record and the
            // rest of the batch stay pending for a later claim.
            queue_full_ = true;
            ++held_;
            return;
        }
        fail(r.id, refusal_text(err, r), is_permanent_error(err));
        hold();
        return;
    }
}

bool Producer::topic_exists(std::size_t index, rd_kafka_topic_s *rkt) {
    const std::string &key = topics_[index].first;
    if (topics_absent_.count(key)) return false;
    if (topics_asked_.count(key)) return true;  // asked this batch, no clear answer
    // When the brokers cannot say (an outage, or they did not answer in
    // time), the record goes, librdkafka keeps it until they can, and the
    // cluster is not asked about this topic again for a while: an outage
    // never costs a metadata wait per batch.
    auto now = std::chrono::steady_clock::now();
    if (state_ == BrokerState::Down || now < metadata_unsure_until_) return true;
    // The batch's wait is bounded (produce()): a broker that went away an
    // instant ago, before librdkafka says all are down, costs that bound at
    // most, never a transaction held past outbox.batch_timeout.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(metadata_deadline_ - now).count();
    if (left <= 0) {  // asked again next batch
        topics_asked_.insert(key);
        return true;
    }
    const rd_kafka_metadata_t *md = nullptr;
    if (rd_kafka_metadata(rk_, 0, rkt, &md, static_cast<int>(left)) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        // One wait per 30 s at most, whatever the number of new topics.
        metadata_unsure_until_ = now + std::chrono::seconds(30);
        return true;
    }
    bool absent = md->topic_cnt == 1 && (md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
                                         md->topics[0].err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC);
    bool exists = md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
                  md->topics[0].partition_cnt > 0;
    rd_kafka_metadata_destroy(md);
    if (exists) topic_known_[index] = 1;
    if (absent) topics_absent_.insert(key);
    // Neither (not authorised to describe it, no leader yet): the record
    // goes and Kafka answers for it; asked again next batch, not per record.
    if (!exists && !absent) topics_asked_.insert(key);
    return !absent;
}

void Producer::produce(const Record *records, std::size_t n, int metadata_wait_ms) noexcept {
    try {
        metadata_deadline_ =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, metadata_wait_ms));
        topics_absent_.clear();  // asked again each batch: a topic may be made meanwhile
        topics_asked_.clear();
        // Acks not yet taken belong to the batch before: they are late now.
        acked_late_.append(acked_);
        acked_.clear();
        while (!batches_.empty() && batches_.front().pending == 0) batches_.pop_front();
        batches_.emplace_back();
        batches_.back().generation = ++generation_;
        batches_.back().slots.reserve(n);
        held_keys_.clear();
        key_partitions_.clear();
        // Without an explicit partition every key has one partition: no
        // map to keep on the relay's hot path.
        any_explicit_partition_ = false;
        for (std::size_t i = 0; i < n && !any_explicit_partition_; ++i)
            any_explicit_partition_ = records[i].partition >= 0;
        queue_full_ = false;
        for (std::size_t i = 0; i < n; ++i) produce_one(records[i]);
    } catch (const std::exception &e) {
        // Out of memory, in practice.  What was produced is in flight and
        // will be reported; the rest stays pending.
        log_.add(LogLevel::Warning, std::string("producing a batch failed: ") + e.what());
    }
}

void Producer::poll() noexcept {
    try {
        serve(0);
    } catch (...) {
        // Callbacks only append to vectors; nothing to undo.
    }
}

void Producer::clear_resolved() noexcept {
    acked_.clear();
    acked_late_.clear();
    failed_ids_.clear();
    failed_errors_.clear();
    failed_permanent_.clear();
    failed_park_now_.clear();
    held_ = 0;
}

void Producer::shutdown(int timeout_ms) noexcept {
    try {
        if (in_flight_ > 0) serve_flush(timeout_ms);
        serve(0);
        if (in_flight_ > 0) {
            rd_kafka_purge(rk_, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
            serve(0);  // purged records report __PURGE_*: ignored below
        }
        batches_.clear();  // whatever was not reported is abandoned
        key_snapshot_.clear();
        in_flight_ = 0;
    } catch (...) {
    }
}

// The callbacks run inside rd_kafka_poll(), a C frame: nothing may be
// thrown through it, so each one catches everything (bad_alloc, in practice).
void Producer::on_delivery(rd_kafka_t *, const rd_kafka_message_t *msg, void *opaque) {
    try {
        static_cast<Producer *>(opaque)->delivered(msg);
    } catch (...) {
    }
}

namespace {
// A success report is an acknowledgement only with the offset Kafka gave
// the record and the broker that gave it: librdkafka reports records of a
// failed request as delivered, with neither, when a later request of their
// partition succeeds (its "implicit acknowledgement"), and a broker that
// holds no state for a new producer id never wrote them.
bool has_offset(const rd_kafka_message_t *msg) {
    return msg->offset >= 0 && msg->partition >= 0 && rd_kafka_message_broker_id(msg) >= 0;
}
constexpr const char kNoOffset[] =
    "Kafka's client reported the record delivered without an offset (an implicit "
    "acknowledgement): not counted as delivered, sent again";
std::size_t record_bytes(const rd_kafka_message_t *msg);  // below

constexpr const char kAfterNoOffset[] =
    "an earlier record of its key was reported delivered without an offset: sent again after it";
}  // namespace

bool Producer::AckList::remove(int64_t id) noexcept {
    for (std::size_t i = ids.size(); i-- > 0;)
        if (ids[i] == id) {
            ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i));
            partitions.erase(partitions.begin() + static_cast<std::ptrdiff_t>(i));
            offsets.erase(offsets.begin() + static_cast<std::ptrdiff_t>(i));
            return true;
        }
    return false;
}

// A success report that proves nothing: the row stays pending (a failure
// that is not a refusal: it counts an attempt, never parks).  Records of
// its key already taken as delivered later in the batch are taken back
// while they are still unmarked, so that the key's order holds when they
// all go again (their copies in Kafka are duplicates, never a gap).
void Producer::not_delivered(Batch *batch, const Slot *slot, int64_t id, const std::string &why) {
    last_error_ = why;
    if (why != last_logged_delivery_error_) {
        log_.add(LogLevel::Warning, "delivery not confirmed: " + why);
        last_logged_delivery_error_ = why;
    }
    fail(id, why, false);
    if (transactional_) ++txn_dr_failures_;
    if (!slot->keyed) return;
    std::string_view key(batch->keys.data() + slot->key_offset, slot->key_length);
    for (const Slot *s = slot + 1; s < batch->slots.data() + batch->slots.size(); ++s) {
        if (s->pending || !s->keyed ||
            std::string_view(batch->keys.data() + s->key_offset, s->key_length) != key)
            continue;
        if (acked_.remove(s->id) || acked_late_.remove(s->id)) fail(s->id, kAfterNoOffset, false);
    }
}

void Producer::delivered(const rd_kafka_message_t *msg) {
    if (msg->_private == kProgressOpaque) {
        if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR && !has_offset(msg))
            progress_error_ = "the progress record: " + std::string(kNoOffset);
        else if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
            progress_acked_ = true;
        else if (msg->err != RD_KAFKA_RESP_ERR__PURGE_QUEUE &&
                 msg->err != RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
            progress_error_ = std::string("the progress record: ") + rd_kafka_err2str(msg->err);
        return;
    }
    Batch *batch = nullptr;
    Slot *slot = find_slot(msg->_private, &batch);
    if (!slot) return;
    int64_t id = slot->id;
    bool this_batch = batch->generation == generation_;
    slot->pending = false;
    --batch->pending;
    --in_flight_;
    outcome(msg, batch, slot, id, this_batch);
    // A reported batch that is not the current one is forgotten; the
    // current one stays until the next produce() (it may be looked at).
    if (batch->pending == 0 && !this_batch) {
        for (auto it = batches_.begin(); it != batches_.end(); ++it)
            if (&*it == batch) {
                batches_.erase(it);
                break;
            }
    }
}

void Producer::outcome(const rd_kafka_message_t *msg, Batch *batch, const Slot *slot, int64_t id,
                       bool this_batch) {
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        std::string_view key(batch->keys.data() + slot->key_offset, slot->key_length);
        if (!has_offset(msg)) {
            // librdkafka's implicit acknowledgement (docs/delivery.md): not
            // in Kafka as far as anyone can show.  It goes again, and so do
            // its key's later records, so that they follow it.
            if (slot->keyed) batch->doubted.emplace(key);
            not_delivered(batch, slot, id, kNoOffset);
            return;
        }
        if (slot->keyed && !batch->doubted.empty() && batch->doubted.count(std::string(key))) {
            not_delivered(batch, slot, id, kAfterNoOffset);
            return;
        }
        (this_batch ? acked_ : acked_late_).push(id, msg->partition, msg->offset);
        set_state(BrokerState::Up, "a delivery was acknowledged");
        last_logged_delivery_error_.clear();
        return;
    }
    if (msg->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || msg->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
        return;  // abandoned by shutdown(): the row stays pending, no attempt counted

    // Not rd_kafka_message_errstr(): for a producer that returns the payload.
    std::string text = rd_kafka_err2str(msg->err);
    text += " (";
    text += rd_kafka_err2name(msg->err);
    text += ")";
    last_error_ = text;
    if (text != last_logged_delivery_error_) {
        log_.add(LogLevel::Warning, "delivery failed: " + text);
        last_logged_delivery_error_ = text;
    }
    if (msg->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
        msg->err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE) {
        if (transactional_) ++txn_dr_failures_;
        size_refused_.push_back(SizeRefused{id, msg->rkt ? rd_kafka_topic_name(msg->rkt) : "",
                                            msg->partition, record_bytes(msg), std::move(text)});
        return;  // settle_size_refusals(), once the poll ends
    }
    remember_refusal(msg, text);
    fail(id, std::move(text), is_permanent_error(msg->err));
}

void Producer::serve(int timeout_ms) {
    rd_kafka_poll(rk_, timeout_ms);
    settle_size_refusals();
}

void Producer::serve_flush(int timeout_ms) {
    rd_kafka_flush(rk_, timeout_ms);
    settle_size_refusals();
}

void Producer::settle_size_refusals() {
    if (size_refused_.empty()) return;
    std::vector<char> done(size_refused_.size(), 0);
    for (std::size_t i = 0; i < size_refused_.size(); ++i) {
        if (done[i]) continue;
        const SizeRefused &first = size_refused_[i];
        std::size_t largest = i, mates = 0;
        for (std::size_t j = i; j < size_refused_.size(); ++j) {
            const SizeRefused &r = size_refused_[j];
            if (done[j] || r.partition != first.partition || r.topic != first.topic) continue;
            ++mates;
            if (r.bytes > size_refused_[largest].bytes) largest = j;
        }
        for (std::size_t j = i; j < size_refused_.size(); ++j) {
            SizeRefused &r = size_refused_[j];
            if (done[j] || r.partition != first.partition || r.topic != first.topic) continue;
            done[j] = 1;
            if (j == largest) {
                if (transactional_ && refusals_ && !r.topic.empty())
                    refusals_->note(r.topic, TopicRefusals::Scope::Size, r.bytes, r.text);
                fail(r.id, std::move(r.text), true);
            } else {
                fail(r.id, r.text + "; refused with a larger record of its request (" +
                               std::to_string(mates) + " together): sent again without it",
                     false);
            }
        }
    }
    size_refused_.clear();
}

void Producer::on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    try {
        static_cast<Producer *>(opaque)->errored(rk, err, reason);
    } catch (...) {
    }
}

void Producer::errored(rd_kafka_t *rk, int err, const char *reason) {
    auto code = static_cast<rd_kafka_resp_err_t>(err);
    std::string text = reason ? reason : rd_kafka_err2str(code);
    last_error_ = text;
    if (code == RD_KAFKA_RESP_ERR__FATAL) {
        char fatal[512];
        rd_kafka_resp_err_t why = rd_kafka_fatal_error(rk, fatal, sizeof fatal);
        fatal_ = true;
        if (why == RD_KAFKA_RESP_ERR__FENCED || why == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
            why == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH) {
            fenced_ = true;
            last_error_ = fatal;
            return;  // the relay says it itself
        }
        last_error_ = fatal;
        log_.add(LogLevel::Warning,
                      std::string("the Kafka producer hit a fatal error and is recreated: ") + fatal);
        return;
    }
    if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        set_state(BrokerState::Down, text);
        return;
    }
    // Single-broker transport errors and the like: librdkafka retries them
    // itself; keep them for the curious without flooding the log.
    log_.add(LogLevel::Debug, text);
}

void Producer::on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    try {
        if (auto *self = static_cast<Producer *>(rd_kafka_opaque(rk))) self->logged(level, fac, buf);
    } catch (...) {
    }
}

void Producer::logged(int level, const char *fac, const char *buf) {
    log_.add_librdkafka(level, fac, buf);
    // librdkafka names the topic Kafka would not add to a transaction only
    // here (2.0.2: 'Failed to add partition "t" [0] to transaction: Broker:
    // Topic authorization failed'); the partitions of the same request that
    // were "not attempted" are not refused.
    static const char kPrefix[] = "Failed to add partition \"";
    if (!transactional_ || !fac || !buf || strcmp(fac, "ADDPARTS") != 0) return;
    const char *at = strstr(buf, kPrefix);
    if (!at) return;
    at += sizeof kPrefix - 1;
    const char *end = strchr(at, '"');
    const char *why = end ? strstr(end, "to transaction: ") : nullptr;
    if (!why) return;
    why += strlen("to transaction: ");
    if (strstr(why, "not attempted")) return;
    txn_refused_topics_.emplace(std::string(at, static_cast<std::size_t>(end - at)), why);
}

namespace {
// A record's size for the refusal memory: key, value and the row's own
// headers (not the event_id the relay adds), measured as produce_one()
// measures a row (its headers as JSON text, at least their bytes), so that
// a record as large as a refused one is refused from memory too.
std::size_t record_bytes(const rd_kafka_message_t *msg) {
    std::size_t n = msg->len + msg->key_len;
    rd_kafka_headers_t *hdrs = nullptr;
    if (rd_kafka_message_headers(msg, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR || !hdrs) return n;
    const char *name = nullptr;
    const void *value = nullptr;
    std::size_t size = 0;
    for (std::size_t i = 0;
         rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i)
        if (strcmp(name, "event_id") != 0) n += strlen(name) + size;
    return n;
}
}  // namespace

// A record Kafka refused in a transaction: what of its topic it will
// refuse again (TopicRefusals::Scope), when the refusal says so of more
// than this record: the whole topic (not authorised, unknown), records at
// least as large, records without a key.  Any other refusal (a keyed
// record Kafka found invalid, say: a broker's schema validation) is this
// record's alone: remembering it would charge other roles' records of a
// shared topic.  At-least-once: a refused record costs only itself, and
// only a topic found absent is remembered (topic_exists()).
void Producer::remember_refusal(const rd_kafka_message_t *msg, const std::string &text) {
    if (transactional_) ++txn_dr_failures_;
    if (!transactional_ || !refusals_ || !is_permanent_error(msg->err) || !msg->rkt) return;
    TopicRefusals::Scope scope;
    switch (msg->err) {
        case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
            scope = TopicRefusals::Scope::Size;
            break;
        case RD_KAFKA_RESP_ERR_INVALID_RECORD:
            if (msg->key) return;
            scope = TopicRefusals::Scope::Keyless;
            break;
        case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
        case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
            scope = TopicRefusals::Scope::Topic;
            break;
        default:
            return;
    }
    refusals_->note(rd_kafka_topic_name(msg->rkt), scope, record_bytes(msg), text);
}

void Producer::charge_failed_transaction(int code, const std::string &error) {
    last_txn_unattributed_ = false;
    last_txn_topics_.clear();
    // Refused records reported it (they are failures already), or the
    // progress record did (the relay's own topic: no row's fault).
    if (txn_dr_failures_ > 0 || !progress_error_.empty() || txn_ids_.empty()) return;
    std::vector<uint32_t> distinct;
    for (uint32_t t : txn_topic_)
        if (std::find(distinct.begin(), distinct.end(), t) == distinct.end()) distinct.push_back(t);
    if (!txn_refused_topics_.empty()) {
        for (std::size_t i = 0; i < txn_ids_.size() && i < txn_topic_.size(); ++i) {
            auto it = txn_refused_topics_.find(topics_[txn_topic_[i]].first);
            if (it == txn_refused_topics_.end()) continue;
            fail(txn_ids_[i], it->second + " (adding the topic's partition to the transaction)",
                 true);
        }
        if (refusals_)
            for (const auto &[topic, reason] : txn_refused_topics_)
                refusals_->note(topic, TopicRefusals::Scope::Topic, 0, reason);
        // Only those: a refused topic that no record of the transaction
        // has is the progress topic, the relay's own (a missing ACL).
        return;
    }
    // The relay's own rights (its transactional id, the cluster): no row's.
    if (code == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED ||
        code == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED)
        return;
    // A commit that timed out is an outcome not known (an outage, most
    // likely), not a refusal: recovery settles it.
    if (code == RD_KAFKA_RESP_ERR__TIMED_OUT || code == RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE) return;
    if (distinct.size() == 1) {
        // One topic: the failure is its records'.  Counted for good (they
        // wait, then are parked) when Kafka's code is a refusal; else only
        // counted.
        bool permanent = is_permanent_error(code);
        std::string text = error + " (a transaction of this topic's records only)";
        for (int64_t id : txn_ids_) fail(id, text, permanent);
        if (permanent && refusals_)
            refusals_->note(topics_[distinct[0]].first, TopicRefusals::Scope::Topic, 0, error);
        return;
    }
    last_txn_unattributed_ = true;
    for (uint32_t t : distinct) last_txn_topics_.push_back(topics_[t].first);
}

// ---- transactions ----

namespace {

// librdkafka's error as text, freed.
std::string take_error(rd_kafka_error_t *e) {
    std::string text = rd_kafka_error_string(e);
    rd_kafka_error_destroy(e);
    return text;
}

bool is_fenced(rd_kafka_error_t *e) {
    rd_kafka_resp_err_t c = rd_kafka_error_code(e);
    return c == RD_KAFKA_RESP_ERR__FENCED || c == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
           c == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH;
}

}  // namespace

bool Producer::init_transactions(int timeout_ms, std::string &error, bool &fenced) noexcept {
    try {
        fenced = false;
        // Registered already (a recovery that failed later and is tried
        // again): librdkafka refuses a second InitProducerId, and the first
        // still holds: a producer that took the id since fences our commit.
        if (registered_) return true;
        rd_kafka_error_t *e = rd_kafka_init_transactions(rk_, timeout_ms);
        serve(0);
        if (!e) {
            registered_ = true;
            return true;
        }
        fenced = is_fenced(e) || fenced_;
        if (rd_kafka_error_code(e) == RD_KAFKA_RESP_ERR_INVALID_TRANSACTION_TIMEOUT) {
            error = "transaction.timeout.ms (outbox.kafka_config) is longer than the brokers' "
                    "transaction.max.timeout.ms allows: " + take_error(e);
            return false;
        }
        if (rd_kafka_error_is_fatal(e)) fatal_ = true;
        error = take_error(e);
        last_error_ = error;
        return false;
    } catch (...) {
        error = "out of memory";
        return false;
    }
}

bool Producer::begin_transaction(std::string &error) noexcept {
    try {
        txn_ids_.clear();
        txn_topic_.clear();
        txn_refused_topics_.clear();
        txn_dr_failures_ = 0;
        last_txn_unattributed_ = false;
        last_txn_topics_.clear();
        txn_digest_ = 0;
        progress_error_.clear();
        progress_acked_ = progress_produced_ = false;
        rd_kafka_error_t *e = rd_kafka_begin_transaction(rk_);
        if (!e) return true;
        if (rd_kafka_error_is_fatal(e)) fatal_ = true;
        if (is_fenced(e)) fenced_ = true;
        error = take_error(e);
        return false;
    } catch (...) {
        error = "out of memory";
        return false;
    }
}

bool Producer::produce_progress(const std::string &topic, const std::string &key,
                                const std::string &value, std::string &error) noexcept {
    try {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            rk_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_KEY(key.data(), key.size()),
            RD_KAFKA_V_VALUE(const_cast<char *>(value.data()), value.size()),
            RD_KAFKA_V_OPAQUE(kProgressOpaque), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            progress_produced_ = true;
            return true;
        }
        error = std::string("the progress record (outbox.progress_topic ") + topic +
                "): " + rd_kafka_err2str(err);
        return false;
    } catch (...) {
        error = "out of memory";
        return false;
    }
}

// A transaction leaves nothing in flight: what librdkafka still reports
// for it (purged records) is ignored from here on.
void Producer::end_transaction_bookkeeping() noexcept {
    batches_.clear();
    key_snapshot_.clear();
    in_flight_ = 0;
    acked_late_.clear();
    txn_ids_.clear();
    txn_topic_.clear();
    txn_digest_ = 0;
}

bool Producer::await_transaction(int timeout_ms, std::string &error) noexcept {
    try {
        // In steps, so that a topic Kafka would not add to the transaction
        // (named only in librdkafka's log, its records then never sent)
        // ends the wait at once instead of at the timeout.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        auto waiting = [&] {
            return in_flight_ > 0 ||
                   (progress_produced_ && !progress_acked_ && progress_error_.empty());
        };
        while (waiting() && txn_refused_topics_.empty()) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
            if (left <= 0) break;
            serve_flush(static_cast<int>(std::min<long long>(left, 50)));
        }
        serve(0);
        awaited_timed_out_ = false;
        if (!progress_error_.empty()) {
            error = progress_error_;
            return false;
        }
        if (!txn_refused_topics_.empty()) {
            const auto &[topic, why] = *txn_refused_topics_.begin();
            error = "Kafka would not add topic \"" + topic + "\" to the transaction: " + why;
            return false;
        }
        bool progress_waits = progress_produced_ && !progress_acked_;
        if (acked_.size() == txn_ids_.size() && !progress_waits) return true;
        if (in_flight_ > 0 || progress_waits) {
            awaited_timed_out_ = true;
            error = "Kafka did not acknowledge the transaction's records within outbox.batch_timeout";
            return false;
        }
        // Refused, or acknowledged without an offset: in the failed list.
        error = failed_errors_.empty() ? std::string("a record was not acknowledged")
                                       : "a record was not delivered: " + failed_errors_.back();
        return false;
    } catch (...) {
        error = "out of memory";
        return false;
    }
}

// Aborts a transaction Kafka was never asked to commit: Aborted whatever
// the abort says.  librdkafka 2.0.2 fails that abort fatally
// (INVALID_TXN_STATE) when Kafka added none of its partitions (a topic
// refused at AddPartitionsToTxn): the producer is then replaced, and its
// successor's registration ends what is open.  Not noexcept: callers catch.
TxnOutcome Producer::abort_never_committed(int timeout_ms, std::string &error) {
    std::string abort_error;
    TxnOutcome o = abort_transaction(timeout_ms, abort_error);
    if (o != TxnOutcome::Aborted) error += "; aborting it: " + abort_error;
    if (o != TxnOutcome::Unknown) return o;
    fatal_ = true;
    return TxnOutcome::Aborted;
}

TxnOutcome Producer::abort_unacknowledged(int timeout_ms, std::string &error) noexcept {
    try {
        // Kafka was never asked to commit: charge what caused it, then the
        // transaction is aborted whatever the abort says.
        last_error_ = error;
        charge_failed_transaction(awaited_timed_out_ ? RD_KAFKA_RESP_ERR__TIMED_OUT
                                                     : RD_KAFKA_RESP_ERR__INCONSISTENT,
                                  error);
        return abort_never_committed(timeout_ms, error);
    } catch (...) {
        error = "out of memory";
        end_transaction_bookkeeping();
        return TxnOutcome::Unknown;
    }
}

TxnOutcome Producer::commit_transaction(int timeout_ms, std::string &error) noexcept {
    try {
        // Every record acknowledged with its offset, or no commit: a
        // transaction may not commit over a record Kafka did not write.
        if (!txn_ids_.empty() && !await_transaction(timeout_ms, error))
            return abort_unacknowledged(timeout_ms, error);
        rd_kafka_error_t *e = rd_kafka_commit_transaction(rk_, timeout_ms);
        serve(0);
        if (!e) {
            // Every record of it is in Kafka: the acknowledged list holds
            // exactly its records, each with its offset.
            end_transaction_bookkeeping();
            set_state(BrokerState::Up, "a transaction was committed");
            return TxnOutcome::Committed;
        }
        bool abortable = rd_kafka_error_txn_requires_abort(e);
        bool fenced = is_fenced(e) || fenced_;
        bool fatal = rd_kafka_error_is_fatal(e);
        int code = rd_kafka_error_code(e);
        error = take_error(e);
        if (!progress_error_.empty()) error = progress_error_ + "; " + error;
        last_error_ = error;
        acked_.clear();
        if (fenced) {
            fenced_ = fatal_ = true;
            end_transaction_bookkeeping();
            return TxnOutcome::Fenced;
        }
        charge_failed_transaction(code, error);
        if (fatal || !abortable) {
            // A retriable error (timed out) leaves the outcome open: only a
            // new producer's init_transactions() settles it.
            if (fatal) fatal_ = true;
            end_transaction_bookkeeping();
            return TxnOutcome::Unknown;
        }
        // The commit failed before Kafka was asked to commit (an abortable
        // error): the transaction is not committed, whatever the abort says.
        return abort_never_committed(timeout_ms, error);
    } catch (...) {
        error = "out of memory";
        end_transaction_bookkeeping();
        return TxnOutcome::Unknown;
    }
}

TxnOutcome Producer::abort_transaction(int timeout_ms, std::string &error) noexcept {
    try {
        rd_kafka_error_t *e = rd_kafka_abort_transaction(rk_, timeout_ms);
        serve(0);
        acked_.clear();
        end_transaction_bookkeeping();
        if (!e) return TxnOutcome::Aborted;
        bool fenced = is_fenced(e) || fenced_;
        if (rd_kafka_error_is_fatal(e)) fatal_ = true;
        error = take_error(e);
        if (fenced) {
            fenced_ = fatal_ = true;
            return TxnOutcome::Fenced;
        }
        return TxnOutcome::Unknown;
    } catch (...) {
        error = "out of memory";
        return TxnOutcome::Unknown;
    }
}

}  // namespace outbox::kafka
