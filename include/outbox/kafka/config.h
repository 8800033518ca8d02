// outbox.kafka_config: extra librdkafka properties, "name=value;name=value".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

struct rd_kafka_conf_s;

namespace outbox::kafka {

// Copies `message` into the caller's buffer of errlen bytes (always
// terminated, cut if longer) and returns false: `return report_error(...)`
// in the noexcept functions that give errors in a char buffer.
bool report_error(char *err, std::size_t errlen, const char *message) noexcept;
inline bool report_error(char *err, std::size_t errlen, const std::string &message) noexcept {
    return report_error(err, errlen, message.c_str());
}

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
// acks, transactional.id, log.queue), secrets (see is_secret_property), and
// every value against librdkafka's own validation.  Writes the first
// problem into errbuf and returns false.  The problem names the property,
// never repeats the text it was given (the value could be a password typed
// under a misspelt name).
bool check_properties(std::string_view text, char *errbuf, std::size_t errlen) noexcept;

// Whether a property holds a secret: a password, a private key, an OAuth
// client secret.  outbox.kafka_config refuses them (members of
// pg_read_all_settings, such as pg_monitor, can read every setting): they
// belong in outbox.kafka_config_file.
bool is_secret_property(const std::string &name) noexcept;

// Reads the file of outbox.kafka_config_file: one name=value per line
// (whitespace around both trimmed; blank lines and lines starting with '#'
// skipped; a value is taken as it is, ';' and '\\' included).  The file
// must be a regular file owned by the user the server runs as and readable
// by it alone (mode 0600 or 0400; 0640 when owned by root), as Postgres asks
// of ssl_key_file.  Every property is checked as in check_properties, minus
// the secret rule.  On failure false, with a sentence that names the file
// and the line, never a value.
bool load_properties_file(const std::string &path, std::vector<Property> &out,
                          std::string &error) noexcept;

// load_properties_file() for a worker: an empty path is no properties;
// the reason goes to a caller's buffer.  Never throws.
bool load_secrets_file(const char *path, std::vector<Property> &out, char *err,
                       std::size_t errlen) noexcept;

// Whether two lists hold the same properties in the same order.
bool same_properties(const std::vector<Property> &a, const std::vector<Property> &b) noexcept;

// Sets one librdkafka property; false with librdkafka's message in `error`.
bool set_property(::rd_kafka_conf_s *conf, const char *name, const std::string &value,
                  std::string &error) noexcept;

// outbox.kafka_config serves the relay's producer and the inbox's consumer;
// each skips the properties that only concern the other (librdkafka would
// warn about them on every start).
bool is_producer_only_property(const std::string &name) noexcept;
bool is_consumer_only_property(const std::string &name) noexcept;

}  // namespace outbox::kafka
