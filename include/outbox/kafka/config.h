// outbox.kafka_config: extra librdkafka properties, "name=value;name=value".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

struct rd_kafka_conf_s;

namespace outbox::kafka {

struct Property {
    std::string name;
    std::string value;
};

// Parses `text` into properties, in order.  Separators are ';' (an empty
// segment is skipped) and the first '=' of a segment; whitespace around
// names and values is trimmed.  A backslash takes the next character
// literally, so a password may hold "\;" or "\\".  On bad input returns
// false and says what and where in `error`.
bool parse_properties(std::string_view text, std::vector<Property> &out,
                      std::string &error) noexcept;

// Parses and checks `text` as the GUC check hook needs: syntax, properties
// the relay owns or needs fixed (bootstrap.servers, enable.idempotence,
// acks, transactional.id, log.queue), and every value against librdkafka's
// own validation.  Writes the first problem into errbuf and returns false.
bool check_properties(std::string_view text, char *errbuf, std::size_t errlen) noexcept;

// Sets one librdkafka property; false with librdkafka's message in `error`.
bool set_property(::rd_kafka_conf_s *conf, const char *name, const std::string &value,
                  std::string &error) noexcept;

// outbox.kafka_config serves the relay's producer and the inbox's consumer;
// each skips the properties that only concern the other (librdkafka would
// warn about them on every start).
bool is_producer_only_property(const std::string &name) noexcept;
bool is_consumer_only_property(const std::string &name) noexcept;

}  // namespace outbox::kafka
