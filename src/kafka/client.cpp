#include "outbox/pure_tu.h"
#include "outbox/kafka/client.h"

#include <librdkafka/rdkafka.h>

#include <cstring>
#include <memory>

namespace outbox::kafka {

void LogBuffer::add(LogLevel level, const std::string &text) noexcept {
    try {
        text_.push_back(text);
        try {
            level_.push_back(level);
        } catch (...) {
            text_.pop_back();
        }
    } catch (...) {
    }
}

void LogBuffer::add_librdkafka(int level, const char *facility, const char *text) noexcept {
    try {
        bool duplicate = std::strcmp(facility, "FAIL") == 0 || std::strcmp(facility, "ERROR") == 0;
        LogLevel l = LogLevel::Debug;
        if (!duplicate)
            l = level <= 4 ? LogLevel::Warning : level <= 6 ? LogLevel::Info : LogLevel::Debug;
        add(l, std::string("librdkafka ") + facility + ": " + text);
    } catch (...) {
    }
}

void LogBuffer::clear() noexcept {
    level_.clear();
    text_.clear();
}

void ConfDeleter::operator()(rd_kafka_conf_s *conf) const noexcept {
    if (conf) rd_kafka_conf_destroy(conf);
}

ConfPtr new_client_conf(Role role, const ClientSettings &settings,
                        const std::vector<Property> &own, const ClientCallbacks &callbacks,
                        std::string &error) noexcept {
    try {
        ConfPtr conf(rd_kafka_conf_new());
        const std::vector<Property> common = {
            {"bootstrap.servers", settings.brokers},
            {"client.id", settings.client_id},
            // No Nagle (as the Java client): a pipelined request must not
            // wait for the broker's delayed ACK.
            {"socket.nagle.disable", "true"},
            // Back within a second once Kafka returns (default: up to 10 s).
            {"reconnect.backoff.max.ms", "1000"},
            // Logs go to the client's queue, served on the worker's thread.
            {"log.queue", "true"},
        };
        for (const auto *list : {&common, &own})
            for (const Property &p : *list)
                if (!set_property(conf.get(), p.name.c_str(), p.value, error)) return {};

        std::vector<Property> extra;
        if (!parse_properties(settings.extra, extra, error)) {
            error = "outbox.kafka_config: " + error;
            return {};
        }
        // One outbox.kafka_config serves both clients: each skips what only
        // concerns the other (librdkafka would warn about it on every start).
        auto foreign = [role](const std::string &name) {
            return role == Role::Producer ? is_consumer_only_property(name)
                                          : is_producer_only_property(name);
        };
        for (const Property &p : extra) {
            if (foreign(p.name)) continue;
            if (!set_property(conf.get(), p.name.c_str(), p.value, error)) {
                error = "outbox.kafka_config: " + error;
                return {};
            }
        }
        for (const Property &p : settings.secrets) {
            if (foreign(p.name)) continue;
            std::string ignored;
            if (!set_property(conf.get(), p.name.c_str(), p.value, ignored)) {
                // librdkafka's message may quote the value: never repeat it.
                error = "outbox.kafka_config_file: librdkafka refuses the value of \"" + p.name +
                        "\" (value not shown)";
                return {};
            }
        }
        rd_kafka_conf_set_opaque(conf.get(), callbacks.opaque);
        rd_kafka_conf_set_error_cb(conf.get(), callbacks.on_error);
        rd_kafka_conf_set_log_cb(conf.get(), callbacks.on_log);
        return conf;
    } catch (const std::exception &e) {
        error = e.what();
        return {};
    }
}

}  // namespace outbox::kafka
