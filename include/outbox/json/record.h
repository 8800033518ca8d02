// Converting the parts of a consumed Kafka record into what the inbox
// stores: text that is valid UTF-8, a value as JSON.  Pure C++; the
// functions may throw std::bad_alloc (callers catch it).
#pragma once

#include <cstddef>
#include <string>

namespace outbox::json {

// Whether the bytes are valid UTF-8 without NUL (which no Postgres text can
// hold).
bool is_valid_utf8(const void *data, std::size_t len);

// The bytes as UTF-8 text: valid sequences kept, any other byte written as
// \xNN, so that nothing is lost and the text is always valid.
std::string bytes_to_text(const void *data, std::size_t len);

// A record value as JSON text: kept as it is when it is valid UTF-8 JSON; a
// missing value (a tombstone) becomes null; anything else becomes
// {"raw_base64": "..."}, so that no record is ever dropped.
std::string value_to_json(const void *data, std::size_t len, bool present);

// Whether the bytes are valid UTF-8 JSON text (of any JSON value).
bool is_json_text(const void *data, std::size_t len);

// Standard base64 (RFC 4648, with padding): base64_length(len) characters
// written to `out` (no terminating NUL).
std::size_t base64_length(std::size_t len) noexcept;
void base64_encode(const void *data, std::size_t len, char *out) noexcept;
std::string base64(const void *data, std::size_t len);

// Whether `s` is a UUID in its 8-4-4-4-12 text form (either case).
bool is_uuid_text(const std::string &s);

}  // namespace outbox::json
