#include "outbox/pure_tu.h"
#include "outbox/kafka/consumer.h"

#include "outbox/kafka/config.h"

#include <librdkafka/rdkafka.h>
#include <nlohmann/json.hpp>

#include <cstring>

namespace outbox::kafka {

namespace {

bool set(rd_kafka_conf_t *conf, const char *name, const std::string &value, std::string &error) {
    return set_property(conf, name, value, error);
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
std::size_t utf8_sequence(const unsigned char *s, std::size_t len, std::size_t i) {
    unsigned char c = s[i];
    std::size_t n;
    uint32_t cp;
    if (c < 0x80) return c == 0 ? 0 : 1;  // NUL cannot live in a Postgres text
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (i + n > len) return 0;
    for (std::size_t k = 1; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

bool valid_utf8(const void *data, std::size_t len) {
    const auto *s = static_cast<const unsigned char *>(data);
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_sequence(s, len, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string base64(const void *data, std::size_t len) {
    static const char table[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto *s = static_cast<const unsigned char *>(data);
    std::string out;
    out.reserve((len + 2) / 3 * 4);
    for (std::size_t i = 0; i < len; i += 3) {
        uint32_t v = static_cast<uint32_t>(s[i]) << 16;
        if (i + 1 < len) v |= static_cast<uint32_t>(s[i + 1]) << 8;
        if (i + 2 < len) v |= s[i + 2];
        out += table[(v >> 18) & 63];
        out += table[(v >> 12) & 63];
        out += i + 1 < len ? table[(v >> 6) & 63] : '=';
        out += i + 2 < len ? table[v & 63] : '=';
    }
    return out;
}

}  // namespace

std::string bytes_to_text(const void *data, std::size_t len) {
    const auto *s = static_cast<const unsigned char *>(data);
    std::string out;
    out.reserve(len);
    for (std::size_t i = 0; i < len;) {
        std::size_t n = utf8_sequence(s, len, i);
        if (n == 0) {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[s[i] >> 4];
            out += hex[s[i] & 15];
            i++;
        } else {
            out.append(reinterpret_cast<const char *>(s + i), n);
            i += n;
        }
    }
    return out;
}

std::string value_to_json(const void *data, std::size_t len, bool present) {
    if (!present) return "null";
    if (valid_utf8(data, len) &&
        nlohmann::json::accept(static_cast<const char *>(data), static_cast<const char *>(data) + len))
        return std::string(static_cast<const char *>(data), len);
    return nlohmann::json{{"raw_base64", base64(data, len)}}.dump();
}

bool is_uuid_text(const std::string &s) {
    if (s.size() != 36) return false;
    for (std::size_t i = 0; i < 36; i++) {
        char c = s[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (c != '-') return false;
        } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
            return false;
        }
    }
    return true;
}

std::string headers_to_json(const std::vector<std::pair<std::string, std::string>> &headers) {
    nlohmann::ordered_json obj = nlohmann::ordered_json::object();
    for (const auto &h : headers) obj[h.first] = h.second;  // a repeated name: the last wins
    return obj.dump();
}

std::unique_ptr<Consumer> Consumer::create(const ConsumerSettings &settings, int wakeup_fd,
                                           std::string &error) noexcept {
    try {
        std::unique_ptr<Consumer> c(new Consumer());
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        std::unique_ptr<rd_kafka_conf_t, void (*)(rd_kafka_conf_t *)> conf_guard(
            conf, rd_kafka_conf_destroy);
        if (!set(conf, "bootstrap.servers", settings.brokers, error) ||
            !set(conf, "group.id", settings.group_id, error) ||
            !set(conf, "client.id", settings.client_id, error) ||
            // Offsets move only after the rows are committed in Postgres.
            !set(conf, "enable.auto.commit", "false", error) ||
            !set(conf, "enable.auto.offset.store", "false", error) ||
            // A new group reads what is there: an inbox must not skip.
            !set(conf, "auto.offset.reset", "earliest", error) ||
            !set(conf, "socket.nagle.disable", "true", error) ||
            !set(conf, "reconnect.backoff.max.ms", "1000", error) ||
            !set(conf, "log.queue", "true", error))
            return nullptr;
        std::vector<Property> extra;
        if (!parse_properties(settings.extra, extra, error)) {
            error = "outbox.kafka_config: " + error;
            return nullptr;
        }
        for (const Property &p : extra) {
            // Producer-only properties in the shared outbox.kafka_config
            // would make librdkafka warn on every start: skip those.
            if (is_producer_only_property(p.name)) continue;
            if (!set(conf, p.name.c_str(), p.value, error)) return nullptr;
        }
        rd_kafka_conf_set_opaque(conf, c.get());
        rd_kafka_conf_set_error_cb(conf, &Consumer::on_error);
        rd_kafka_conf_set_log_cb(conf, &Consumer::on_log);

        char errstr[512];
        c->rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
        if (!c->rk_) {
            error = errstr;
            return nullptr;
        }
        conf_guard.release();
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

void Consumer::add_log(LogLevel level, std::string text) {
    log_level_.push_back(level);
    log_text_.push_back(std::move(text));
}

void Consumer::clear_log() noexcept {
    log_level_.clear();
    log_text_.clear();
}

void Consumer::handle_error(int err, const std::string &reason) {
    auto code = static_cast<rd_kafka_resp_err_t>(err);
    last_error_ = reason;
    if (code == RD_KAFKA_RESP_ERR__FATAL) {
        fatal_ = true;
        add_log(LogLevel::Warning, "the Kafka consumer hit a fatal error and is recreated: " + reason);
        return;
    }
    if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        if (state_ != BrokerState::Down)
            add_log(LogLevel::Warning, "cannot reach Kafka, the inbox consumer waits: " + reason);
        state_ = BrokerState::Down;
        return;
    }
    if (reason != last_logged_error_) {
        add_log(LogLevel::Debug, reason);
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
    try {
        auto *self = static_cast<Consumer *>(rd_kafka_opaque(rk));
        if (!self) return;
        bool duplicate = std::strcmp(fac, "FAIL") == 0 || std::strcmp(fac, "ERROR") == 0;
        LogLevel l = LogLevel::Debug;
        if (!duplicate)
            l = level <= 4 ? LogLevel::Warning : level <= 6 ? LogLevel::Info : LogLevel::Debug;
        self->add_log(l, std::string("librdkafka ") + fac + ": " + buf);
    } catch (...) {
    }
}

std::size_t Consumer::poll_batch(std::size_t max) noexcept {
    try {
        records_.clear();
        next_offsets_.clear();
        while (records_.size() < max) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk_, 0);
            if (!m) break;
            std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t *)> guard(
                m, rd_kafka_message_destroy);
            if (m->err) {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                    handle_error(m->err, rd_kafka_message_errstr(m));  // consumer: the error text
                continue;
            }
            if (state_ != BrokerState::Up) {
                if (state_ == BrokerState::Down)
                    add_log(LogLevel::Info, "Kafka is reachable again: records arrive");
                state_ = BrokerState::Up;
            }
            InRecord r;
            r.topic = rd_kafka_topic_name(m->rkt);
            r.partition = m->partition;
            r.offset = m->offset;
            r.has_key = m->key != nullptr;
            if (m->key) r.key = bytes_to_text(m->key, m->key_len);
            r.payload_json = value_to_json(m->payload, m->len, m->payload != nullptr);
            std::vector<std::pair<std::string, std::string>> headers;
            rd_kafka_headers_t *hdrs = nullptr;
            if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
                const char *name;
                const void *val;
                size_t size;
                for (size_t i = 0; !rd_kafka_header_get_all(hdrs, i, &name, &val, &size); i++)
                    headers.emplace_back(bytes_to_text(name, std::strlen(name)),
                                         val ? bytes_to_text(val, size) : std::string());
            }
            for (const auto &h : headers)
                if (h.first == "event_id" && is_uuid_text(h.second)) r.event_id = h.second;
            r.headers_json = headers_to_json(headers);
            next_offsets_[{r.topic, r.partition}] = r.offset + 1;
            records_.push_back(std::move(r));
        }
        return records_.size();
    } catch (const std::exception &e) {
        // What was taken stays taken; its offsets are not committed, so
        // Kafka delivers it again.
        add_log(LogLevel::Warning, std::string("reading records failed: ") + e.what());
        return records_.size();
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
        rd_kafka_resp_err_t err = rd_kafka_commit(rk_, offsets, 0 /* synchronous */);
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
