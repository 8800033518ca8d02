// What the relay's producer and the inbox's consumer share: the librdkafka
// configuration both build the same way, the lines both hand to the server
// log, and how both describe the connection.  Pure C++: no Postgres
// headers, nothing thrown out of the API.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "outbox/kafka/config.h"

struct rd_kafka_conf_s;
struct rd_kafka_s;

namespace outbox::kafka {

enum class LogLevel { Debug, Info, Warning };

// Connection state as far as a client can tell.
enum class BrokerState { Unknown, Up, Down };

// Lines for the server log, kept until the worker writes them out (the
// worker does: librdkafka's callbacks never call Postgres).
class LogBuffer {
public:
    // Never throws: a line that cannot be kept (out of memory) is dropped.
    void add(LogLevel level, const std::string &text) noexcept;
    // A line of librdkafka's own log (syslog levels).  Connection failures
    // also reach the error callback, which reports state changes once: its
    // copies of those ("FAIL", "ERROR") stay at debug level.
    void add_librdkafka(int level, const char *facility, const char *text) noexcept;
    std::size_t count() const noexcept { return text_.size(); }
    LogLevel level(std::size_t i) const noexcept { return level_[i]; }
    const char *text(std::size_t i) const noexcept { return text_[i].c_str(); }
    void clear() noexcept;

private:
    std::vector<LogLevel> level_;
    std::vector<std::string> text_;
};

enum class Role { Producer, Consumer };

struct ClientSettings {
    std::string brokers;    // bootstrap.servers (outbox.brokers)
    std::string client_id;  // client.id
    std::string extra;      // outbox.kafka_config, checked by its GUC hook
    // The properties of outbox.kafka_config_file (secrets): applied last;
    // an error about one never repeats its value.
    std::vector<Property> secrets;
};

struct ConfDeleter {
    void operator()(rd_kafka_conf_s *conf) const noexcept;
};
using ConfPtr = std::unique_ptr<rd_kafka_conf_s, ConfDeleter>;

// The callbacks every client has: the client itself as opaque, its error
// and log callbacks.
struct ClientCallbacks {
    void *opaque;
    void (*on_error)(rd_kafka_s *rk, int err, const char *reason, void *opaque);
    void (*on_log)(const rd_kafka_s *rk, int level, const char *fac, const char *buf);
};

// A librdkafka configuration: what both clients set alike (bootstrap
// servers, client.id, no Nagle, reconnect within a second, every log line
// through the client's queue, `callbacks`), then `own` (the role's defaults
// that carry its guarantees), then the user's properties that concern this
// role (outbox.kafka_config, then the secrets file).  Empty with the reason
// in `error` when a property is refused.
ConfPtr new_client_conf(Role role, const ClientSettings &settings,
                        const std::vector<Property> &own, const ClientCallbacks &callbacks,
                        std::string &error) noexcept;

}  // namespace outbox::kafka
