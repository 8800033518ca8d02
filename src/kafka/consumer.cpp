#include "outbox/pure_tu.h"
#include "outbox/kafka/consumer.h"

#include "outbox/json/headers.h"
#include "outbox/json/record.h"

#include <librdkafka/rdkafka.h>

#include <cstring>
#include <new>

namespace outbox::kafka {

namespace {

void on_commit(rd_kafka_t *, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *,
               void *opaque) {
    static_cast<Consumer *>(opaque)->note_commit_result(err);
}

}  // namespace

std::unique_ptr<Consumer> Consumer::create(const ConsumerSettings &settings, int wakeup_fd,
                                           std::string &error) noexcept {
    try {
        std::unique_ptr<Consumer> c(new Consumer());
        c->secrets_ = settings.client.secrets;
        const std::vector<Property> own = {
            {"group.id", settings.group_id},
            // Offsets move only after the rows are committed in Postgres.
            {"enable.auto.commit", "false"},
            {"enable.auto.offset.store", "false"},
            // A new group reads what is there: an inbox must not skip.
            {"auto.offset.reset", "earliest"},
            // Records of a Kafka transaction that was aborted are never
            // stored (a producer's exactly-once delivery stays that);
            // outbox.kafka_config may ask for read_uncommitted.
            {"isolation.level", "read_committed"},
        };
        ConfPtr conf = new_client_conf(Role::Consumer, settings.client, own,
                                       {c.get(), &Consumer::on_error, &Consumer::on_log}, error);
        if (!conf) return nullptr;
        rd_kafka_conf_set_offset_commit_cb(conf.get(), &on_commit);

        char errstr[512];
        c->rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr, sizeof errstr);
        if (!c->rk_) {
            error = errstr;
            return nullptr;
        }
        conf.release();  // rd_kafka_new took it
        // Everything (records, logs, errors) through the consumer queue,
        // served on our thread by poll_batch().
        rd_kafka_poll_set_consumer(c->rk_);
        rd_kafka_set_log_queue(c->rk_, nullptr);
        c->queue_ = rd_kafka_queue_get_consumer(c->rk_);
        static const char kWake = 'c';
        rd_kafka_queue_io_event_enable(c->queue_, wakeup_fd, &kWake, 1);

        rd_kafka_topic_partition_list_t *topics =
            rd_kafka_topic_partition_list_new(static_cast<int>(settings.topics.size()));
        for (const std::string &t : settings.topics)
            rd_kafka_topic_partition_list_add(topics, t.c_str(), RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t err = rd_kafka_subscribe(c->rk_, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (err) {
            error = std::string("subscribe: ") + rd_kafka_err2str(err);
            return nullptr;
        }
        return c;
    } catch (const std::exception &e) {
        error = e.what();
        return nullptr;
    }
}

Consumer::~Consumer() {
    close();
    if (queue_) {
        rd_kafka_queue_io_event_enable(queue_, -1, nullptr, 0);
        rd_kafka_queue_destroy(queue_);
    }
    if (rk_) rd_kafka_destroy_flags(rk_, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
}

void Consumer::close() noexcept {
    if (rk_ && !closed_) {
        closed_ = true;
        rd_kafka_consumer_close(rk_);
    }
}

void Consumer::handle_error(int err, const std::string &reason) {
    auto code = static_cast<rd_kafka_resp_err_t>(err);
    last_error_ = reason;
    if (code == RD_KAFKA_RESP_ERR__FATAL) {
        fatal_ = true;
        log_.add(LogLevel::Warning, "the Kafka consumer hit a fatal error and is recreated: " + reason);
        return;
    }
    if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        if (state_ != BrokerState::Down)
            log_.add(LogLevel::Warning, "cannot reach Kafka, the inbox consumer waits: " + reason);
        state_ = BrokerState::Down;
        return;
    }
    if (reason != last_logged_error_) {
        log_.add(LogLevel::Debug, reason);
        last_logged_error_ = reason;
    }
}

void Consumer::on_error(rd_kafka_t *, int err, const char *reason, void *opaque) {
    try {
        static_cast<Consumer *>(opaque)->handle_error(
            err, reason ? reason : rd_kafka_err2str(static_cast<rd_kafka_resp_err_t>(err)));
    } catch (...) {
    }
}

void Consumer::on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    if (auto *self = static_cast<Consumer *>(rd_kafka_opaque(rk)))
        self->log_.add_librdkafka(level, fac, buf);
}


void Consumer::note_commit_result(int err) noexcept {
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET) return;
    try {
        std::string text = rd_kafka_err2str(static_cast<rd_kafka_resp_err_t>(err));
        last_error_ = "committing offsets failed: " + text;
        if (last_error_ != last_logged_error_) {
            log_.add(LogLevel::Warning,
                     last_error_ + " (the records will come again and be dropped as duplicates)");
            last_logged_error_ = last_error_;
        }
    } catch (...) {
    }
}

// Converts one record into records_; false when it could not (out of
// memory): the caller rewinds the partition so that it comes again.
bool Consumer::take(rd_kafka_message_t *m) {
    try {
        InRecord r;
        r.topic = rd_kafka_topic_name(m->rkt);
        r.partition = m->partition;
        r.offset = m->offset;
        rd_kafka_timestamp_type_t type;
        r.timestamp = rd_kafka_message_timestamp(m, &type);
        r.has_key = m->key != nullptr;
        if (m->key) r.key.assign(static_cast<const char *>(m->key), m->key_len);
        r.has_value = m->payload != nullptr;
        if (m->payload) {
            r.value.assign(static_cast<const char *>(m->payload), m->len);
            r.value_is_json = json::is_json_text(m->payload, m->len);
        }
        r.bytes = r.key.size() + r.value.size();
        rd_kafka_headers_t *hdrs = nullptr;
        if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            const char *name;
            const void *val;
            size_t size;
            for (size_t i = 0; !rd_kafka_header_get_all(hdrs, i, &name, &val, &size); i++) {
                r.headers.emplace_back(std::string(name),
                                       val ? std::string(static_cast<const char *>(val), size)
                                           : std::string());
                r.header_has_value.push_back(val != nullptr);
                r.bytes += r.headers.back().first.size() + r.headers.back().second.size();
            }
        }
        // The last event_id header is the record's id (as Kafka's
        // Headers.lastHeader() reads it) when it is a UUID; otherwise the
        // id is derived, and the note says why, without the header's bytes.
        for (std::size_t i = r.headers.size(); i-- > 0;) {
            if (r.headers[i].first != "event_id") continue;
            const std::string &v = r.headers[i].second;
            if (json::is_uuid_text(v))
                r.event_id = v;
            else if (v.empty())
                r.event_id_note = "an event_id header without a value";
            else if (!json::is_valid_utf8(v.data(), v.size()))
                r.event_id_note = "an event_id header that is not valid UTF-8";
            else if (v.size() > 36)
                r.event_id_note =
                    "an event_id header of " + std::to_string(v.size()) + " bytes (a UUID has 36)";
            else
                r.event_id_note = "an event_id header that is not a UUID";
            break;
        }
        records_.push_back(std::move(r));
        next_offsets_[{records_.back().topic, m->partition}] = m->offset + 1;
        first_offsets_.emplace(std::make_pair(records_.back().topic, m->partition), m->offset);
        batch_bytes_ += records_.back().bytes;
        return true;
    } catch (...) {
        return false;
    }
}

std::size_t Consumer::poll_batch(std::size_t max, std::size_t max_bytes) noexcept {
    try {
        records_.clear();
        records_.shrink_to_fit();  // a batch of large records leaves no capacity behind
        next_offsets_.clear();
        first_offsets_.clear();
        batch_bytes_ = 0;
    } catch (...) {
        return 0;
    }
    while (records_.size() < max && batch_bytes_ < max_bytes) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk_, 0);
        if (!m) break;
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                try {
                    handle_error(m->err, rd_kafka_message_errstr(m));  // consumer: the error text
                } catch (...) {
                }
            }
            rd_kafka_message_destroy(m);
            continue;
        }
        if (state_ != BrokerState::Up) {
            if (state_ == BrokerState::Down)
                log_.add(LogLevel::Info, "Kafka is reachable again: records arrive");
            state_ = BrokerState::Up;
        }
        if (!take(m)) {
            // This record is taken from librdkafka's queue but not kept:
            // rewind its partition to it, so that it comes again, and stop
            // the batch here (its offsets stop before it).
            rd_kafka_topic_partition_list_t *at = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(at, rd_kafka_topic_name(m->rkt), m->partition)
                ->offset = m->offset;
            rd_kafka_error_t *err = rd_kafka_seek_partitions(rk_, at, 1000);
            if (err) rd_kafka_error_destroy(err);
            rd_kafka_topic_partition_list_destroy(at);
            rd_kafka_message_destroy(m);
            log_.add(LogLevel::Warning, "reading a record failed (out of memory); it comes again");
            break;
        }
        rd_kafka_message_destroy(m);
    }
    return records_.size();
}

bool Consumer::rewind(std::string &error) noexcept {
    try {
        if (first_offsets_.empty()) return true;
        rd_kafka_topic_partition_list_t *at =
            rd_kafka_topic_partition_list_new(static_cast<int>(first_offsets_.size()));
        for (const auto &o : first_offsets_)
            rd_kafka_topic_partition_list_add(at, o.first.first.c_str(), o.first.second)->offset =
                o.second;
        rd_kafka_error_t *err = rd_kafka_seek_partitions(rk_, at, 5000);
        bool ok = true;
        if (err) {
            error = rd_kafka_error_string(err);
            rd_kafka_error_destroy(err);
            ok = false;
        }
        for (int i = 0; ok && i < at->cnt; i++)
            if (at->elems[i].err) {
                error = rd_kafka_err2str(at->elems[i].err);
                ok = false;
            }
        rd_kafka_topic_partition_list_destroy(at);
        return ok;
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

bool Consumer::commit(std::string &error) noexcept {
    try {
        if (next_offsets_.empty()) return true;
        rd_kafka_topic_partition_list_t *offsets =
            rd_kafka_topic_partition_list_new(static_cast<int>(next_offsets_.size()));
        for (const auto &o : next_offsets_)
            rd_kafka_topic_partition_list_add(offsets, o.first.first.c_str(), o.first.second)
                ->offset = o.second;
        rd_kafka_resp_err_t err = rd_kafka_commit(rk_, offsets, 1 /* async */);
        rd_kafka_topic_partition_list_destroy(offsets);
        if (err) {
            error = rd_kafka_err2str(err);
            last_error_ = error;
            return false;
        }
        return true;
    } catch (const std::exception &e) {
        error = e.what();
        return false;
    }
}

}  // namespace outbox::kafka
